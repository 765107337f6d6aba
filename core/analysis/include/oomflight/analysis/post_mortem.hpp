// The post-mortem: what an archive says about an out-of-memory failure across ranks. Analysis only, no
// rendering: the exporters (oomflight/export/...) turn a PostMortem into text, HTML or other tools' formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "oomflight/analysis/cache_figures.hpp"
#include "oomflight/analysis/growth.hpp"
#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// A block that was live at the trigger, as the recorded history shows it (its alloc is in the ring and no
/// free_completed follows it).
struct LiveAllocation {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;     ///< bytes
  std::int64_t batch = -1;    ///< batch when it was allocated
  std::int64_t t_ns = 0;      ///< monotonic ns of the alloc
  std::int32_t stack_id = kNoStack;
};

/// The live blocks of one stack (identical stacks merged): "10 blocks x 100 MiB at optimizers.py:82".
struct CallSite {
  std::int32_t stack_id = kNoStack;  ///< kNoStack: blocks recorded without a stack
  std::size_t blocks = 0;
  std::uint64_t bytes = 0;           ///< sum of the blocks' sizes
  std::uint64_t largest = 0;         ///< the largest block
  std::uint64_t smallest = 0;        ///< the smallest block (== largest when all are the same size)
  /// Blocks allocated before the first batch (batch -1): the state the job had before it trained, such as the
  /// model's weights, or, in a replay, the blocks that predate the trace.
  std::size_t before_first_batch = 0;
};

/// One call site of an origin against the same call site on its peers (the other ranks present): a call site is
/// the same across ranks when its frames (function, file, line) are, whatever each rank's stack ids.
struct CallSiteDiff {
  std::int32_t stack_id = kNoStack;     ///< the origin's stack id
  std::uint64_t origin_bytes = 0;       ///< live on the origin
  std::uint64_t peers_median_bytes = 0; ///< live at the same call site on the median peer (0 where absent)
};

/// One rank in the post-mortem.
struct RankSummary {
  RankRow row;
  /// What the rank's reserved memory is measured against: the process's own cap (RankRow::memory_cap_bytes) when it
  /// has one below the device's capacity, else the capacity; 0 when neither is known. The allocator fails at the
  /// cap, not at the device's end (issue 30).
  std::uint64_t limit_bytes = 0;
  bool limit_is_cap = false;             ///< limit_bytes is the process's cap
  /// limit - reserved at the trigger, less the memory outside the caching allocator where known and the limit is the
  /// device's (a cap bounds the allocator alone); 0 when the limit is unknown
  std::uint64_t headroom_bytes = 0;
  std::uint64_t live_bytes_in_history = 0;  ///< sum of all LiveAllocation sizes (<= allocated_bytes)
  std::size_t live_count = 0;
  /// The largest live allocations, largest first (origins only; without origins, PostMortem::largest_rank).
  std::vector<LiveAllocation> largest;
  std::vector<CallSite> call_sites;      ///< live bytes by stack, most bytes first, at most `top` (as `largest`)
  /// Origins only: the call sites where the origin holds more than its median peer, largest excess first, at
  /// most `top`; empty without peers.
  std::vector<CallSiteDiff> against_peers;
  std::uint64_t peers_median_live_bytes = 0;  ///< origins only: live bytes in the history of the median peer
  std::int64_t oom_utc_ns = 0;           ///< UTC ns of the last oom event, 0 when none
  /// Origins only: what the caching allocator held at the freeze, by pool (cache_figures.hpp); nullopt when the
  /// archive holds no allocator state for the rank.
  std::optional<CacheFigures> cache;
  std::uint64_t action_counts[kActionCount] = {};
  /// The trend of its per-batch peak reserved bytes over its last 64 ended batches, against limit_bytes (growth.hpp);
  /// nullopt with fewer than 3.
  std::optional<Trend> peak_reserved_trend;
  /// The call sites whose live bytes grew batch after batch in its history, fastest first, at most `top`.
  std::vector<GrowingSite> growing;
};

/// The whole post-mortem.
struct PostMortem {
  std::vector<int> origins;      ///< origin ranks, as the archive names them
  int first_origin = -1;         ///< the origin whose oom event came first on the common time axis
  /// The rank with the most allocated bytes at the trigger (the lowest such rank); -1 without ranks. Without an
  /// origin, its largest allocations and call sites are kept as an origin's are.
  int largest_rank = -1;
  std::vector<RankSummary> ranks;  ///< by rank
};

/// How an origin's live bytes in the recorded history stand against its median peer's.
enum class AgainstPeers {
  outlier,        ///< more than 1.1 x the median peer's, or some while the median peer holds none
  within_a_tenth, ///< above the median peer's by at most a tenth
  at_most_peers,  ///< at most the median peer's (not 0 B against 0 B: that is nothing_live)
  nothing_live,   ///< neither it nor its median peer holds live bytes in the recorded history
};

/// The judgement the report and the page state for an origin (RankSummary::live_bytes_in_history against
/// peers_median_live_bytes). Before issue 30, 0 B against 0 B was called "an outlier". Pure.
OOMFLIGHT_API AgainstPeers judge_against_peers(const RankSummary& origin);

/// The words for it: ": an outlier", ": not an outlier; its median peer held as much or more", ... Pure.
OOMFLIGHT_API const char* against_peers_words(AgainstPeers judgement);

/// A rank's device figures for a sentence: "device free 1.23 GiB of 79.19 GiB", then, when the process has its own
/// cap, "; this process may use 4.00 GiB of it (its per-process cap, torch's memory fraction)", and, when figures
/// came from the error's message (RankRow::numbers_from_message), which ones, e.g. " (the request, the device's
/// figures as the error's message states them: no allocator hook saw the failure)". Plain text. `at_failure`: the
/// figures are an OOM origin's, whose free 0 is the allocator's own figure (the device was full); elsewhere a free of
/// 0 is one never published (the PyTorch extension publishes the driver's free figure only at a failure), and the
/// text gives the capacity alone: "device capacity 8.00 GiB (its free memory was not published)".
OOMFLIGHT_API std::string device_figures_text(const RankSummary& summary, bool at_failure = true);

/// Live bytes of one rank's history at the freeze by stack id (kNoStack included): blocks allocated in the
/// history and not freed (free_completed), at their recorded size. Pure; thread-safe.
OOMFLIGHT_API std::unordered_map<std::int32_t, std::uint64_t> live_bytes_by_stack(const Archive& archive,
                                                                                 const RankRow& rank);

/// Analyses an archive. `top` largest live allocations are kept for each origin. Pure; thread-safe.
OOMFLIGHT_API PostMortem analyze(const Archive& archive, std::size_t top = 10);

}  // namespace oomflight
