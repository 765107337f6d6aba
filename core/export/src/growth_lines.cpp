#include "oomflight/export/growth_lines.hpp"

#include <fmt/format.h>

#include "oomflight/base/trend.hpp"
#include "oomflight/base/units.hpp"

namespace oomflight {

std::string peak_trend_text(const RankSummary& s) {
  if (!s.peak_reserved_trend) return {};
  return peak_trend_words(*s.peak_reserved_trend, s.limit_bytes, s.limit_is_cap);
}

std::string growing_site_text(const GrowingSite& g) {
  return fmt::format("+{} a batch {}, {} to {}", format_bytes(trend_bytes(g.trend.slope)),
                     trend_span_words(g.trend, "live bytes"), format_bytes(g.first_bytes), format_bytes(g.last_bytes));
}

}  // namespace oomflight
