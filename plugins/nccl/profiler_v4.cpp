// ncclProfiler_v4: the version NCCL 2.27 looks for first (2.28 on use v5 or v6). Its init takes the
// communicator's hash after its name.
#include "profiler_core.hpp"

using namespace oomflight::nccl;

namespace {
Result init_v4(void** context, int* mask, const char* comm_name, std::uint64_t comm_hash, int /*nNodes*/, int nranks,
               int rank, DebugLogger log) noexcept {
  return init(context, comm_hash, mask, comm_name, nranks, rank, log);
}
}  // namespace

extern "C" {
OOMFLIGHT_NCCL_EXPORT ProfilerV4 ncclProfiler_v4 = {kPluginName, init_v4, start_event_of<EventDescrV4>, stop_event,
                                                    record_event_state, finalize};
}
