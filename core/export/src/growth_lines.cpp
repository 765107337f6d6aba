#include "oomflight/export/growth_lines.hpp"

#include <fmt/format.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

std::string span_text(const Trend& t, std::string_view what) {
  return fmt::format("over batches {}-{} (the {} stray {} from the line, root mean square)", t.first_batch,
                     t.last_batch, what, format_bytes(static_cast<std::uint64_t>(t.residual)));
}

}  // namespace

std::string peak_trend_text(const RankSummary& s) {
  if (!s.peak_reserved_trend) return {};
  const Trend& t = *s.peak_reserved_trend;
  if (!t.rising) return "no rising trend in peak reserved " + span_text(t, "peaks");
  const char* limit = s.limit_is_cap ? "cap" : "capacity";
  std::string when;
  if (s.limit_bytes == 0) {
    when = "its limit is unknown";
  } else if (t.reaches_limit_at && *t.reaches_limit_at <= t.last_batch) {
    when = fmt::format("the line is at its {} {} by batch {} already", format_bytes(s.limit_bytes), limit,
                       t.last_batch);
  } else if (t.reaches_limit_at) {
    when = fmt::format("at this rate it reaches its {} {} at batch ~{}", format_bytes(s.limit_bytes), limit,
                       *t.reaches_limit_at);
  } else {
    when = fmt::format("at this rate it does not reach its {} {} within 100,000 batches", format_bytes(s.limit_bytes),
                       limit);
  }
  return fmt::format("peak reserved grows {} a batch {}; {}", format_bytes(static_cast<std::uint64_t>(t.slope)),
                     span_text(t, "peaks"), when);
}

std::string growing_site_text(const GrowingSite& g) {
  return fmt::format("+{} a batch {}, {} to {}", format_bytes(static_cast<std::uint64_t>(g.trend.slope)),
                     span_text(g.trend, "live bytes"), format_bytes(g.first_bytes), format_bytes(g.last_bytes));
}

}  // namespace oomflight
