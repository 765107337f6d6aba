// The memory each rank held outside the caching allocator (RankRow::outside_allocator_bytes: the driver's count of
// the process, NVML, less its reserved; issue 42, item 4), in the words the text report and the HTML page share: a
// cell of the per-rank table, the line that names a rank whose share stands out from its peers' (NCCL's buffers on
// a pipeline's last stage), and the line that says it is unknown everywhere.
#pragma once

#include <string>

#include "oomflight/analysis/post_mortem.hpp"

namespace oomflight {

/// "1.02 GiB", or "?" when the rank's figure is unknown (-1: no NVML, or it did not list the process). Never throws
/// but std::bad_alloc.
std::string outside_cell(const RankRow& row);

/// "rank 3 holds 8.76 GiB outside the caching allocator, the median rank 1.02 GiB (+7.74 GiB): NCCL's buffers, the
/// CUDA context and the libraries' workspaces are not in its snapshot" when, of two ranks or more with a known figure,
/// the largest is at least 256 MiB above the lower median and half again as much; else empty. Pure.
std::string outside_standout_line(const PostMortem& pm);

/// "memory outside the caching allocator: unknown on every rank (no NVML where they ran, or it did not list their
/// processes; archives before oomflight 0.3 do not record it)" when no rank's figure is known; else empty. Pure.
std::string outside_unknown_line(const PostMortem& pm);

}  // namespace oomflight
