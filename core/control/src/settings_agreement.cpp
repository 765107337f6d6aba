// The start-up agreement (settings_agreement.hpp).
#include "settings_agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
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

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    throw std::runtime_error(fmt::format("the start-up agreement on settings failed in {} (MPI error {})", what, rc));
  }
}

}  // namespace

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
  // Each rank's values as the store transport sends them (agreed_settings.hpp): one text of the mismatch for both.
  std::vector<std::vector<std::string>> values(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::int64_t* v = all.data() + static_cast<std::size_t>(r) * mine.size();
    if (v[0] != 1) continue;  // could not start: no values
    Config c;
    c.enabled = v[1] != 0;
    const auto opt = [](std::int64_t x) { return x == kUnset ? std::optional<std::int64_t>() : x; };
    c.skip_batches = opt(v[2]);
    c.interval_batches = opt(v[3]);
    c.snapshot_every_batches = opt(v[4]);
    values[static_cast<std::size_t>(r)] = agreed_setting_values(c);
  }
  throw ConfigError(fmt::format("{}; oomflight did not start on any rank", settings_mismatch(values)));
}

}  // namespace oomflight
