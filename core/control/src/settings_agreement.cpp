// The start-up agreement (settings_agreement.hpp).
#include "settings_agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <stdexcept>

namespace oomflight {
namespace {

constexpr std::size_t kAgreed = std::size(kAgreedSettings);
constexpr std::int64_t kUnset = std::numeric_limits<std::int64_t>::min();

// [0]: whether this rank's settings parsed; then one value per agreed variable (kUnset: not set).
using Values = std::array<std::int64_t, 1 + kAgreed>;

Values values_of(const Config* config) {
  Values v{};  // all 0: "could not start"
  if (config == nullptr) return v;
  const auto opt = [](const std::optional<std::int64_t>& o) { return o ? *o : kUnset; };
  v[0] = 1;
  v[1] = config->enabled ? 1 : 0;
  v[2] = opt(config->skip_batches);
  v[3] = opt(config->interval_batches);
  v[4] = opt(config->snapshot_every_batches);
  return v;
}

std::string value_text(std::size_t setting, std::int64_t value) {
  if (value == kUnset) return "unset";
  if (setting == 0) return value != 0 ? "1" : "0";
  return setting == 1 ? fmt::format("{}", value) : fmt::format("{}ba", value);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    throw std::runtime_error(fmt::format("the start-up agreement on settings failed in {} (MPI error {})", what, rc));
  }
}

}  // namespace

std::vector<std::string> agreed_setting_values(const Config& config) {
  const Values v = values_of(&config);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < kAgreed; ++i) out.push_back(value_text(i, v[1 + i]));
  return out;
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

void agree_on_settings(const Config* config, MPI_Comm comm) {
  const Values mine = values_of(config);
  // One reduction gives the minimum and the maximum of every value: the maximum as the minimum of the negations
  // (values are small, or kUnset, whose negation is taken as the largest value instead of overflowing).
  std::array<std::int64_t, 2 * std::size(mine)> both{};
  for (std::size_t i = 0; i < mine.size(); ++i) {
    both[i] = mine[i];
    both[mine.size() + i] = mine[i] == kUnset ? std::numeric_limits<std::int64_t>::max() : -mine[i];
  }
  check(MPI_Allreduce(MPI_IN_PLACE, both.data(), static_cast<int>(both.size()), MPI_INT64_T, MPI_MIN, comm),
        "MPI_Allreduce");
  bool agree = true;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const std::int64_t max = both[mine.size() + i] == std::numeric_limits<std::int64_t>::max()
                                 ? kUnset
                                 : -both[mine.size() + i];
    agree = agree && both[i] == max;
  }
  if (agree && mine[0] == 1) return;

  // The ranks disagree (every rank knows it from the same reduction, so every rank gathers): name them.
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<std::int64_t> all(static_cast<std::size_t>(size) * mine.size());
  check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                      static_cast<int>(mine.size()), MPI_INT64_T, comm),
        "MPI_Allgather");
  const auto at = [&](int rank, std::size_t i) { return all[static_cast<std::size_t>(rank) * mine.size() + i]; };
  std::vector<std::string> parts;
  std::vector<int> unparsed;
  for (int r = 0; r < size; ++r) {
    if (at(r, 0) != 1) unparsed.push_back(r);
  }
  for (std::size_t s = 0; s < kAgreed; ++s) {
    // Values in the order of the lowest rank that holds each, so that the message reads the same everywhere.
    std::vector<std::pair<std::int64_t, std::vector<int>>> groups;
    for (int r = 0; r < size; ++r) {
      if (at(r, 0) != 1) continue;
      const std::int64_t v = at(r, 1 + s);
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
      if (it == groups.end()) {
        groups.push_back({v, {r}});
      } else {
        it->second.push_back(r);
      }
    }
    if (groups.size() < 2) continue;
    std::string part = fmt::format("{} differs between ranks:", kAgreedSettings[s]);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      part += fmt::format("{} {} on {} {}", g == 0 ? "" : ";", value_text(s, groups[g].first),
                          groups[g].second.size() == 1 ? "rank" : "ranks", rank_ranges(groups[g].second));
    }
    parts.push_back(std::move(part));
  }
  if (!unparsed.empty()) {
    parts.push_back(fmt::format("{} {} could not start (settings that did not parse, or a history that could not "
                                "be allocated: that rank's own error says which)",
                                unparsed.size() == 1 ? "rank" : "ranks", rank_ranges(unparsed)));
  }
  const bool differ = parts.size() > (unparsed.empty() ? 0u : 1u);
  std::string message;
  for (const auto& p : parts) message += (message.empty() ? "" : "; and ") + p;
  throw ConfigError(fmt::format("{}.{} oomflight did not start on any rank", message,
                                differ ? " These settings must be the same on every rank of the job;" : ""));
}

}  // namespace oomflight
