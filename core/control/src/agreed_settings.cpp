// The settings every rank must share, and the words of a mismatch (agreed_settings.hpp).
#include "agreed_settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace oomflight {

std::vector<std::string> agreed_setting_values(const Config& config) {
  const auto batches = [](const std::optional<std::int64_t>& v) { return v ? fmt::format("{}ba", *v) : "unset"; };
  return {config.enabled ? "1" : "0",
          config.skip_batches ? fmt::format("{}", *config.skip_batches) : "unset",
          batches(config.interval_batches), batches(config.snapshot_every_batches)};
}

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string settings_mismatch(const std::vector<std::vector<std::string>>& values) {
  const int size = static_cast<int>(values.size());
  std::vector<std::string> parts;
  std::vector<int> unstarted;
  for (int r = 0; r < size; ++r) {
    if (values[static_cast<std::size_t>(r)].size() != std::size(kAgreedSettings)) unstarted.push_back(r);
  }
  for (std::size_t s = 0; s < std::size(kAgreedSettings); ++s) {
    // Values in the order of the lowest rank that holds each, so that the message reads the same everywhere.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < size; ++r) {
      const auto& mine = values[static_cast<std::size_t>(r)];
      if (mine.size() != std::size(kAgreedSettings)) continue;
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == mine[s]; });
      if (it == groups.end()) {
        groups.push_back({mine[s], {r}});
      } else {
        it->second.push_back(r);
      }
    }
    if (groups.size() < 2) continue;
    std::string part = fmt::format("{} differs between ranks:", kAgreedSettings[s]);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      part += fmt::format("{} {} on {} {}", g == 0 ? "" : ";", groups[g].first,
                          groups[g].second.size() == 1 ? "rank" : "ranks", rank_ranges(groups[g].second));
    }
    parts.push_back(std::move(part));
  }
  const bool differ = !parts.empty();
  if (!unstarted.empty()) {
    parts.push_back(fmt::format("{} {} could not start (settings that did not parse, or a history that could not "
                                "be allocated: that rank's own error says which)",
                                unstarted.size() == 1 ? "rank" : "ranks", rank_ranges(unstarted)));
  }
  std::string message;
  for (const auto& p : parts) message += (message.empty() ? "" : "; and ") + p;
  if (differ) message += ". These settings must be the same on every rank of the job";
  return message;
}

}  // namespace oomflight
