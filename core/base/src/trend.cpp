#include "oomflight/base/trend.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

constexpr double kHorizonBatches = 100'000;

}  // namespace

std::optional<Trend> fit_trend(std::span<const std::int64_t> batches, std::span<const double> values,
                               std::uint64_t limit) {
  const std::size_t n = std::min(batches.size(), values.size());
  if (n < 3) return std::nullopt;
  // Centred on the means: the sums stay small enough for doubles whatever the batch numbers.
  // Batch numbers as offsets from the first, in doubles: a damaged file's extreme numbers cannot overflow.
  const auto x = [&](std::size_t i) { return static_cast<double>(batches[i]) - static_cast<double>(batches[0]); };
  double mean_x = 0, mean_y = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mean_x += x(i);
    mean_y += values[i];
  }
  mean_x /= static_cast<double>(n);
  mean_y /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double dx = x(i) - mean_x;
    sxx += dx * dx;
    sxy += dx * (values[i] - mean_y);
  }
  Trend t;
  t.first_batch = batches[0];
  t.last_batch = batches[n - 1];
  t.points = n;
  t.slope = sxx > 0 ? sxy / sxx : 0;
  double squares = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double fitted = mean_y + t.slope * (x(i) - mean_x);
    squares += (values[i] - fitted) * (values[i] - fitted);
  }
  t.residual = std::sqrt(squares / static_cast<double>(n));
  const double span = static_cast<double>(t.last_batch) - static_cast<double>(t.first_batch);
  // Rising: up from one batch to the next at least two times in three, and a rise over the span that the scatter
  // does not explain. Without the first, a healthy job's warm-up (a smaller first batch, then a plateau once the
  // optimizer's state exists) fits a line that rises, and the forecast would name a batch the job never fails at.
  std::size_t rises = 0;
  for (std::size_t i = 1; i < n; ++i) rises += values[i] > values[i - 1] ? 1 : 0;
  t.rising = std::isfinite(t.slope) && t.slope > 0 && t.slope * span > 2 * t.residual && 3 * rises >= 2 * (n - 1);
  if (t.rising && limit != 0) {
    // Where the line stands at the last batch, and how many batches more it takes to reach the limit.
    const double at_last = mean_y + t.slope * (span - mean_x);
    const double more = (static_cast<double>(limit) - at_last) / t.slope;
    const std::int64_t ahead =
        std::isfinite(more) ? static_cast<std::int64_t>(std::ceil(std::clamp(more, 0.0, kHorizonBatches))) : 0;
    if (std::isfinite(more) && more <= kHorizonBatches && t.last_batch <= INT64_MAX - ahead) {
      t.reaches_limit_at = t.last_batch + ahead;
    }
  }
  return t;
}

std::uint64_t trend_bytes(double v) {
  // 2^64 itself is not a uint64 (a hostile file's sizes can sum to it): the top is the largest double below it.
  constexpr double kTop = 18446744073709549568.0;
  return !(v > 0) ? 0 : v >= kTop ? static_cast<std::uint64_t>(kTop) : static_cast<std::uint64_t>(v);
}

std::string trend_span_words(const Trend& t, std::string_view what) {
  return fmt::format("over batches {}-{} (the {} stray {} from the line, root mean square)", t.first_batch,
                     t.last_batch, what, format_bytes(trend_bytes(t.residual)));
}

std::string peak_trend_words(const Trend& t, std::uint64_t limit, bool cap) {
  if (!t.rising) return "no rising trend in peak reserved " + trend_span_words(t, "peaks");
  const char* what = cap ? "cap" : "capacity";
  std::string when;
  if (limit == 0) {
    when = "its limit is unknown";
  } else if (t.reaches_limit_at && *t.reaches_limit_at <= t.last_batch) {
    when = fmt::format("the line is at its {} {} by batch {} already", format_bytes(limit), what, t.last_batch);
  } else if (t.reaches_limit_at) {
    when = fmt::format("at this rate it reaches its {} {} at batch ~{}", format_bytes(limit), what, *t.reaches_limit_at);
  } else {
    when = fmt::format("at this rate it does not reach its {} {} within 100,000 batches", format_bytes(limit), what);
  }
  return fmt::format("peak reserved grows {} a batch {}; {}", format_bytes(trend_bytes(t.slope)),
                     trend_span_words(t, "peaks"), when);
}

}  // namespace oomflight
