// The words for a rank's trend of peak reserved and for a call site that grows (issue 42, items 2 and 3,
// growth.hpp): the text report and the HTML page say them alike.
#pragma once

#include <string>

#include "oomflight/analysis/post_mortem.hpp"

namespace oomflight {

/// "peak reserved grows 204.80 MiB a batch over batches 0-4 (the peaks stray 72.41 MiB from the line, root mean
/// square); at this rate it reaches its 8.00 GiB capacity at batch ~6", or "no rising trend in peak reserved over
/// ...". Empty when the rank has fewer than 3 ended batches. Plain text (numbers and fixed words).
std::string peak_trend_text(const RankSummary& rank);

/// "+256.00 MiB a batch over batches 0-4 (the live bytes stray 0 B from the line, root mean square), 256.00 MiB to
/// 1.25 GiB". Plain text.
std::string growing_site_text(const GrowingSite& site);

}  // namespace oomflight
