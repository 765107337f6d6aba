// The words both transports say of a dump (dump_words.hpp).
#include "dump_words.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "agreed_settings.hpp"
#include "oomflight/base/units.hpp"

namespace oomflight {

std::string gone_ranks_text(const std::vector<int>& gone, const std::vector<int>& vanished, bool before_dump) {
  // A rank that said it left, left; one whose process was seen to end said nothing, and may have died during the
  // dump: each is named for what is known of it.
  std::vector<int> left;
  for (int r : gone) {
    if (std::find(vanished.begin(), vanished.end(), r) == vanished.end()) left.push_back(r);
  }
  std::string text;
  if (!left.empty()) {
    text = fmt::format("{} {} left the job{} (ended {} oomflight session without the others)",
                       left.size() == 1 ? "rank" : "ranks", rank_ranges(left), before_dump ? " before this dump" : "",
                       left.size() == 1 ? "its" : "their");
  }
  if (!vanished.empty()) {
    text += fmt::format("{}{} {} ended without a word (its process is gone: killed, os._exit or a crash)",
                        text.empty() ? "" : "; ", vanished.size() == 1 ? "rank" : "ranks", rank_ranges(vanished));
  }
  return text;
}

std::string late_origins_text(const std::vector<int>& late) {
  return fmt::format("{} {} ran out of memory during this dump: staying for {} dump, which names this rank too",
                     late.size() == 1 ? "rank" : "ranks", rank_ranges(late), late.size() == 1 ? "its" : "their");
}

std::string done_before_deadline_text(long long done, long long expected) {
  return fmt::format("{} of {} ranks with a file of this dump said they were done with it before the deadline "
                     "(OOMFLIGHT_DUMP_TIMEOUT)",
                     done, expected);
}

std::string gave_up_on_the_dump_text(std::chrono::milliseconds dump_timeout) {
  return fmt::format("the dump did not finish within {} (3 x OOMFLIGHT_DUMP_TIMEOUT); giving up waiting",
                     format_seconds(3.0 * static_cast<double>(dump_timeout.count()) / 1000.0));
}

}  // namespace oomflight
