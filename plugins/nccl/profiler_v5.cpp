// ncclProfiler_v5: the version NCCL 2.28 looks for first (2.29 on look for v6 before it).
#include "profiler_core.hpp"

using namespace oomflight::nccl;

extern "C" {
OOMFLIGHT_NCCL_EXPORT ProfilerV5 ncclProfiler_v5 = {kPluginName, init_v5_layout, start_event_of<EventDescrV5>,
                                                    stop_event, record_event_state, finalize};
}
