// ncclProfiler_v6: the version NCCL 2.29 on looks for first. Its copy-engine events are not asked for.
#include "profiler_core.hpp"

using namespace oomflight::nccl;

extern "C" {
OOMFLIGHT_NCCL_EXPORT ProfilerV6 ncclProfiler_v6 = {kPluginName, init_v5_layout, start_event_of<EventDescrV6>,
                                                    stop_event, record_event_state, finalize};
}
