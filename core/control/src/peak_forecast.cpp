#include "peak_forecast.hpp"

#include <vector>

#include "oomflight/base/trend.hpp"

namespace oomflight {

std::optional<std::string> PeakForecast::ended(std::int64_t batch, std::uint64_t peak_reserved, std::uint64_t limit,
                                               bool cap) {
  if (!points_.empty() && batch <= points_.back().first) points_.clear();  // the job numbered its batches anew
  points_.emplace_back(batch, static_cast<double>(peak_reserved));
  if (points_.size() > kWindow) points_.pop_front();
  if (limit == 0 || (last_warned_ && batch - *last_warned_ < static_cast<std::int64_t>(kWindow) &&
                     batch > *last_warned_)) {
    return std::nullopt;
  }
  std::vector<std::int64_t> x;
  std::vector<double> y;
  for (const auto& [b, v] : points_) {
    x.push_back(b);
    y.push_back(v);
  }
  const std::optional<Trend> t = fit_trend(x, y, limit);
  if (!t || !t->rising || !t->reaches_limit_at || *t->reaches_limit_at - t->last_batch > kHorizon) return std::nullopt;
  last_warned_ = batch;
  return peak_trend_words(*t, limit, cap);
}

}  // namespace oomflight
