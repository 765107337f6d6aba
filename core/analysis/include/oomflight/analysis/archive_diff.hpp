// Two archives (or two snapshot windows) compared by call site (issue 42, item 3: `oomflight diff A B`): the live
// bytes of each call site at each archive's freeze, summed over the ranks both hold, the change, and the ranks
// where a call site's change stands out from its peers'. A call site is known across archives by its frames' text
// (each archive interns its own stack ids and strings: call_site_key).
//
// Thread-safety: a pure function of the archives it reads. Cost: one pass over each matched rank's history.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

/// One call site's change from archive A to archive B. Bytes.
struct SiteChange {
  std::string key;                    ///< call_site_key: the frames' text
  std::int32_t stack_a = kNoStack;    ///< its stack in A (kNoStack: not live there)
  std::int32_t stack_b = kNoStack;    ///< ... in B
  std::uint64_t bytes_a = 0;          ///< live at A's freeze, over the matched ranks
  std::uint64_t bytes_b = 0;          ///< ... at B's
  int widest_rank = -1;               ///< the matched rank whose change here is largest (in size; the lowest on a tie)
  std::int64_t widest_change = 0;     ///< ... that change (B - A)
  std::int64_t median_change = 0;     ///< the median matched rank's change here (the lower middle of an even count)
};

/// What diff_archives() found.
struct ArchiveDiff {
  std::vector<int> ranks;     ///< the ranks both archives hold (or the one asked for), ascending
  std::vector<int> only_a;    ///< ranks only A holds
  std::vector<int> only_b;    ///< ranks only B holds
  std::uint64_t live_a = 0;   ///< live in the matched ranks' histories at A's freeze
  std::uint64_t live_b = 0;
  std::size_t changed = 0;    ///< call sites whose live bytes changed (all of them, not only the `top` listed)
  std::vector<SiteChange> sites;  ///< the largest changes (in size) first, at most `top`; unchanged sites left out
};

/// A call site's identity across ranks and archives: its frames' text. The empty string for kNoStack.
OOMFLIGHT_API std::string call_site_key(const Archive& archive, std::int32_t stack_id);

/// Compares the live bytes by call site of `a` and `b` over the ranks both hold (`rank`: only that one, which must be
/// in both; otherwise `ranks` is empty). Blocks allocated before an archive's history began are not in it.
OOMFLIGHT_API ArchiveDiff diff_archives(const Archive& a, const Archive& b, std::optional<int> rank, std::size_t top);

}  // namespace oomflight
