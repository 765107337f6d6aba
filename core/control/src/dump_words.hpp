// The words both transports say of a dump (internal to the control wing): a rule is written once, and so is what it
// says (issue 40: the MPI path and the store path named the same ranks in different words).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace oomflight {

/// Why ranks are not in a dump, or not in the job any more: `gone` (ascending) ended their session without the
/// others, `vanished` (ascending, a subset of `gone`) ended without a word (their process was seen to end by a rank
/// on their node; it may have died during the dump). The ranks of `gone` that did not vanish "left the job" (`before_dump`:
/// "... before this dump"); those that vanished "ended without a word". Never throws but std::bad_alloc.
std::string gone_ranks_text(const std::vector<int>& gone, const std::vector<int>& vanished, bool before_dump);

/// An origin that stays for the joint dump: "rank 3 ran out of memory during this dump: staying for its dump, which
/// names this rank too" (`late`: ascending, not empty). Never throws but std::bad_alloc.
std::string late_origins_text(const std::vector<int>& late);

/// An origin that stopped waiting for the other ranks to finish their files of its dump: "2 of 3 ranks with a file of
/// this dump said they were done with it before the deadline (OOMFLIGHT_DUMP_TIMEOUT)". Never throws but
/// std::bad_alloc.
std::string done_before_deadline_text(long long done, long long expected);

/// Why a request that waited for the dump under way returns without it: "the dump did not finish within 90 s (3 x
/// OOMFLIGHT_DUMP_TIMEOUT); giving up waiting". `dump_timeout`: OOMFLIGHT_DUMP_TIMEOUT.
std::string gave_up_on_the_dump_text(std::chrono::milliseconds dump_timeout);

}  // namespace oomflight
