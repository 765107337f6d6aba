// The HTML report: a PostMortem rendered as one self-contained page (html_report.hpp, docs/html-report.md).
// The charts are SVG written here, so the page shows everything without its script; the script only adds the
// readout under the mouse. Nothing the archive holds reaches the page unescaped: markup goes through html(),
// the embedded data through json().
#include "oomflight/export/html_report.hpp"
#include "oomflight/export/origin_words.hpp"
#include "oomflight/export/outside_words.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <iterator>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "oomflight/analysis/collectives.hpp"
#include "oomflight/analysis/memory_levels.hpp"
#include "oomflight/base/printable.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/export/rank_context.hpp"
#include "oomflight/export/user_frames.hpp"
#include "oomflight/export/growth_lines.hpp"
#include "oomflight/export/what_if_line.hpp"

namespace oomflight {
namespace {

// The most points a rank's curve keeps (each the peak of its interval): more than a screen has pixels across.
constexpr std::size_t kMaxPoints = 2000;
// For large jobs fewer points per rank, so that the page stays a few MB: 64 ranks keep 500 each.
constexpr std::size_t kPointBudget = 32000;
constexpr std::size_t kMinPoints = 250;
// The per-batch table's columns: the last batches any rank kept.
constexpr std::size_t kBatchColumns = 12;
// Out-of-memory events drawn on the charts (a job that catches the error and retries can have thousands).
constexpr std::size_t kMaxOomMarks = 12;

template <typename... T>
void put(std::string& out, fmt::format_string<T...> format, T&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<T>(args)...);
}

// ---- Escaping --------------------------------------------------------------------------------------------------

// For text and attribute values: the characters markup gives a meaning to, after printable() (printable.hpp) has
// shown every control character but the line feed, every bidirectional override and every byte that is not UTF-8 as
// a visible escape, as the text report does (HTML forbids the C0 controls in text, and an override would reorder
// what the page shows after it).
std::string html(std::string_view text) {
  const std::string s = printable(text, LineFeeds::keep);
  std::string out;
  out.reserve(s.size() + 16);
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// A JSON string for a <script> block. Every `<`, `>` and `&` becomes a \u escape, not only the `</` of
// `</script>`: `<!--` followed by `<script` puts the HTML parser into a state where `</script>` no longer ends the
// block, and an escaped `<` cannot start either. U+2028 and U+2029 are escaped for older JavaScript engines.
// The text is made printable first, as for html(): the readout shows it as the page does.
std::string json(std::string_view text) {
  const std::string s = printable(text, LineFeeds::keep);
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f || c == '<' || c == '>' || c == '&') {
      put(out, "\\u{:04x}", static_cast<unsigned>(c));
    } else if (c == 0xE2 && i + 2 < s.size() && s[i + 1] == '\x80' && (s[i + 2] == '\xA8' || s[i + 2] == '\xA9')) {
      out += s[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  return out;
}

std::string signed_bytes(std::uint64_t to, std::uint64_t from) {
  return to >= from ? "+" + format_bytes(to - from) : "-" + format_bytes(from - to);
}


std::string percent(std::uint64_t part, std::uint64_t whole) {
  return whole ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole)) : "?";
}

// ---- Time --------------------------------------------------------------------------------------------------------

// As post_mortem.cpp: wrapping arithmetic, since a damaged archive's anchors can be anything.
std::int64_t to_utc(const RankRow& row, std::int64_t t_ns) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(t_ns) -
                                   static_cast<std::uint64_t>(row.anchor_monotonic_ns) +
                                   static_cast<std::uint64_t>(row.anchor_realtime_ns));
}

// "2026-11-23T16:05:40.158Z"; "?" for a time gmtime cannot express.
std::string utc_text(std::int64_t utc_ns) {
  const std::int64_t seconds = utc_ns / 1'000'000'000 - (utc_ns % 1'000'000'000 < 0 ? 1 : 0);
  const auto millis = static_cast<int>((utc_ns - seconds * 1'000'000'000) / 1'000'000);
  const auto t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return "?";
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
}

// ---- Series ------------------------------------------------------------------------------------------------------

struct Point {
  std::int64_t utc = 0;
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
};

// A rank's allocated and reserved bytes after each of its events, oldest first, ending with the freeze. The
// events only say how memory changed, so the curve is shifted to end at the figures the rank published at the
// trigger: what was allocated before its recorded history began is the baseline the shift adds.
std::vector<Point> replay(const Archive& a, const RankRow& row) {
  std::vector<Point> points;
  const std::vector<MemoryLevel> levels = memory_levels(a, row);
  points.reserve(levels.size() + 1);
  for (const MemoryLevel& l : levels) {
    std::int64_t utc = to_utc(row, l.t_ns);
    // The ring's writers interleave by a few ns: keep the curve going forward in time.
    if (!points.empty() && utc < points.back().utc) utc = points.back().utc;
    points.push_back({utc, l.allocated, l.reserved});
  }
  if (row.freeze_t_ns != 0) {
    const std::int64_t utc = to_utc(row, row.freeze_t_ns);
    if (points.empty()) {
      points.push_back({utc, 0, 0});
    } else if (utc >= points.back().utc) {
      points.push_back({utc, points.back().allocated, points.back().reserved});
    }
  }
  if (points.empty()) return points;
  const std::uint64_t shift_allocated = row.allocated_bytes - static_cast<std::uint64_t>(points.back().allocated);
  const std::uint64_t shift_reserved = row.reserved_bytes - static_cast<std::uint64_t>(points.back().reserved);
  const auto shifted = [](std::int64_t v, std::uint64_t shift) {
    return std::max<std::int64_t>(0, static_cast<std::int64_t>(static_cast<std::uint64_t>(v) + shift));
  };
  for (Point& p : points) {
    p.allocated = shifted(p.allocated, shift_allocated);
    p.reserved = shifted(p.reserved, shift_reserved);
  }
  return points;
}

// The time axis every rank shares: `n` points from t0 to t0 + span.
struct Grid {
  std::int64_t t0 = 0;
  double span_ns = 1;
  std::size_t n = 2;

  std::size_t index(std::int64_t utc) const {
    const double f = static_cast<double>(static_cast<std::uint64_t>(utc) - static_cast<std::uint64_t>(t0)) / span_ns;
    const double i = std::round(f * static_cast<double>(n - 1));
    return i <= 0 || !std::isfinite(i) ? 0 : std::min(n - 1, static_cast<std::size_t>(i));
  }
  double seconds(std::size_t i) const { return span_ns * 1e-9 * static_cast<double>(i) / static_cast<double>(n - 1); }
};

// A rank's curve on the grid: each point is the peak the rank reached in its interval (so a spike shorter than an
// interval survives), -1 outside the rank's recorded history.
struct Curve {
  std::vector<std::int64_t> allocated, reserved;
};

Curve sample(const std::vector<Point>& points, const Grid& g) {
  Curve c{std::vector<std::int64_t>(g.n, -1), std::vector<std::int64_t>(g.n, -1)};
  if (points.empty()) return c;
  std::size_t at = g.index(points[0].utc);
  c.allocated[at] = points[0].allocated;
  c.reserved[at] = points[0].reserved;
  for (std::size_t k = 1; k < points.size(); ++k) {
    const std::size_t i = std::max(at, g.index(points[k].utc));
    // The intervals it crosses hold the level before this point.
    while (at < i) {
      ++at;
      c.allocated[at] = points[k - 1].allocated;
      c.reserved[at] = points[k - 1].reserved;
    }
    c.allocated[at] = std::max(c.allocated[at], points[k].allocated);
    c.reserved[at] = std::max(c.reserved[at], points[k].reserved);
  }
  return c;
}

// ---- Charts ------------------------------------------------------------------------------------------------------

// One rank as drawn.
struct RankView {
  const RankSummary* s = nullptr;
  std::string colour;
  std::string label;  // "rank 2 (out of memory)"
  Curve curve;
};

struct OomMark {
  int rank = 0;
  std::int64_t utc = 0;
  std::uint64_t requested = 0;
  std::string colour;
};

// The chart's frame in SVG user units (the SVG scales to the page's width).
constexpr double kWidth = 1100, kHeight = 330, kLeft = 86, kRight = 14, kTop = 16, kBottom = 46;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;

// 1, 2 or 5 times a power of ten, at least `raw`.
double nice_step(double raw) {
  if (!(raw > 0) || !std::isfinite(raw)) return 1;
  const double e = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

std::string chart(std::string_view id, std::string_view what, bool reserved, const Grid& g,
                  const std::vector<RankView>& ranks, const std::vector<OomMark>& ooms) {
  const auto values = [reserved](const RankView& r) -> const std::vector<std::int64_t>& {
    return reserved ? r.curve.reserved : r.curve.allocated;
  };
  double top = 0;
  for (const auto& r : ranks) {
    for (const auto v : values(r)) top = std::max(top, static_cast<double>(v));
    top = std::max(top, static_cast<double>(r.s->limit_bytes));
  }
  top = top > 0 ? top * 1.06 : 1024;
  const auto x = [&](std::size_t i) { return kLeft + kPlotW * static_cast<double>(i) / static_cast<double>(g.n - 1); };
  const auto y = [&](double v) { return kTop + kPlotH * (1 - v / top); };

  std::string out;
  put(out,
      "<div class=\"chart-box\"><svg class=\"chart\" id=\"{}\" data-series=\"{}\" data-left=\"{}\" data-width=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{} bytes of every rank over time\">\n",
      id, reserved ? "reserved" : "allocated", kLeft, kPlotW, kWidth, kHeight, what);
  // Bytes axis: ticks in the largest binary unit the top reaches.
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t unit = 0;
  double scale = 1;
  while (unit + 1 < std::size(kUnits) && top / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  const double step = nice_step(top / scale / 6) * scale;
  for (int k = 0; k <= 20 && k * step <= top; ++k) {
    const double v = k * step;
    put(out, "<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", kLeft, kLeft + kPlotW, y(v),
        y(v));
    put(out, "<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g} {}</text>\n", kLeft - 6, y(v) + 4,
        v / scale, kUnits[unit]);
  }
  // Time axis: seconds since the earliest point of any rank.
  const double span_s = g.span_ns * 1e-9;
  const double tstep = nice_step(span_s / 8);
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(tstep) + 1e-9)), 0, 9);
  for (int k = 0; k <= 20 && k * tstep <= span_s * (1 + 1e-9); ++k) {
    const double xv = kLeft + kPlotW * (k * tstep / span_s);
    put(out, "<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\"/>", xv, xv, kTop, kTop + kPlotH);
    put(out, "<text class=\"tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.{}f}</text>\n", xv,
        kTop + kPlotH + 16, k * tstep, decimals);
  }
  put(out, "<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">seconds since {} (UTC), the earliest "
           "recorded event of any rank</text>\n",
      kLeft + kPlotW / 2, kHeight - 6, html(utc_text(g.t0)));
  put(out, "<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", kLeft, kTop, kPlotW, kPlotH);

  // Each rank's limit, labelled with the ranks that have it (a smaller device, or a process's own cap, is one way
  // to fail first): the device's capacity, or the cap when the process has one (the allocator fails there).
  std::vector<std::pair<std::pair<std::uint64_t, bool>, std::vector<const RankView*>>> capacities;
  for (const auto& r : ranks) {
    const std::pair<std::uint64_t, bool> limit{r.s->limit_bytes, r.s->limit_is_cap};
    if (limit.first == 0) continue;
    auto it = std::find_if(capacities.begin(), capacities.end(), [&](const auto& c) { return c.first == limit; });
    if (it == capacities.end()) {
      capacities.emplace_back(limit, std::vector<const RankView*>{});
      it = capacities.end() - 1;
    }
    it->second.push_back(&r);
  }
  for (const auto& [limit, holders] : capacities) {
    const std::uint64_t cap = limit.first;
    const bool all_origins =
        std::all_of(holders.begin(), holders.end(), [](const RankView* r) { return r->s->row.is_origin != 0; });
    std::string who;
    for (const RankView* r : holders) who += fmt::format("{}{}", who.empty() ? "" : ", ", r->s->row.rank);
    const std::string colour = all_origins ? holders.front()->colour : "#555";
    put(out,
        "<line class=\"capacity\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>"
        "<text class=\"label\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"{}\">{} {} ({} {})</text>\n",
        kLeft, kLeft + kPlotW, y(static_cast<double>(cap)), y(static_cast<double>(cap)), colour, kLeft + kPlotW - 4,
        y(static_cast<double>(cap)) - 4, colour, limit.second ? "cap" : "capacity", format_bytes(cap),
        holders.size() == 1 ? "rank" : "ranks", who);
  }

  // The curves, origins last so that they lie on top; a gap where a rank has no history.
  std::vector<const RankView*> order;
  for (const auto& r : ranks) order.push_back(&r);
  std::stable_partition(order.begin(), order.end(), [](const RankView* r) { return r->s->row.is_origin == 0; });
  for (const RankView* r : order) {
    const auto& v = values(*r);
    put(out, "<g class=\"series{}\" data-rank=\"{}\" stroke=\"{}\"><title>{}</title>",
        r->s->row.is_origin ? " origin" : "", r->s->row.rank, r->colour, html(r->label));
    for (std::size_t i = 0; i < g.n;) {
      if (v[i] < 0) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < g.n && v[end] >= 0) ++end;
      out += "<polyline points=\"";
      if (end - i == 1) {  // one point: a short dash, so that it shows
        put(out, "{:.1f},{:.1f} {:.1f},{:.1f}", x(i) - 2, y(static_cast<double>(v[i])), x(i) + 2,
            y(static_cast<double>(v[i])));
      }
      for (std::size_t k = i; k < end && end - i > 1; ++k) {
        put(out, "{}{:.1f},{:.1f}", k == i ? "" : " ", x(k), y(static_cast<double>(v[k])));
      }
      out += "\"/>";
      i = end;
    }
    out += "</g>\n";
  }

  // Out-of-memory events: a line across the chart, a dot on the rank's curve, and what it asked for (at the
  // bottom, which is free at such a moment: the curves are high then, and the capacities' labels are at the top).
  for (std::size_t k = 0; k < ooms.size(); ++k) {
    const OomMark& m = ooms[k];
    const auto it =
        std::find_if(ranks.begin(), ranks.end(), [&](const RankView& r) { return r.s->row.rank == m.rank; });
    if (it == ranks.end()) continue;
    const std::size_t i = g.index(m.utc);
    const double xv = x(i);
    const std::int64_t at = values(*it)[i];
    const bool right = xv > kLeft + 0.65 * kPlotW;
    put(out, "<g class=\"oom\"><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\"/>", xv, xv, kTop,
        kTop + kPlotH, m.colour);
    if (at >= 0) {
      put(out, "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\"/>", xv, y(static_cast<double>(at)), m.colour);
    }
    put(out, "<text class=\"label\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\" fill=\"{}\">rank {} out of memory at "
             "{:.{}f} s: {} requested</text></g>\n",
        right ? xv - 6 : xv + 6, kTop + kPlotH - 8 - 15 * static_cast<double>(k % 6), right ? "end" : "start", m.colour,
        m.rank, g.seconds(i), decimals + 3, format_bytes(m.requested));
  }
  put(out, "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"{}\" y2=\"{}\" visibility=\"hidden\"/>", kTop, kTop + kPlotH);
  put(out, "</svg><div class=\"tip\" id=\"{}-tip\" hidden></div></div>\n", id);
  return out;
}

// ---- Sections ----------------------------------------------------------------------------------------------------

// Collectives on the memory charts' time axis: one lane per rank, a bar per operation from its start to its end,
// or to the rank's freeze for one still in flight (drawn hollow in the origin red: the rank waits in it), and the
// report's sentences above. Empty for an archive without collectives.
std::string collectives_section(const Archive& a, const Grid& g, const std::vector<RankView>& views) {
  const CollectiveAnalysis c = analyze_collectives(a);
  if (c.empty()) return {};
  std::string out = "<section id=\"collectives\"><h2>Collectives at the freeze</h2>\n";
  for (const CommunicatorVerdict& v : c.communicators) {
    const auto lines = describe_verdict(a, c, v);
    if (lines.empty()) {
      put(out, "<p>All {} ranks of {} finished {} #{}; none was inside an operation on it.</p>\n", v.members.size(),
          html(communicator_label(v)), html(collective_op_name(v.op)), v.seq);
    }
    for (std::size_t i = 0; i < lines.size(); ++i) {
      put(out, "<p class=\"verdict{}\">{}</p>\n", i == 0 ? " first" : "", html(lines[i]));
    }
  }
  constexpr double kLane = 22;
  const double height = kTop + kLane * static_cast<double>(views.size()) + 30;
  const auto x = [&](std::int64_t utc) {
    const double f = static_cast<double>(static_cast<std::int64_t>(static_cast<std::uint64_t>(utc) -
                                                                   static_cast<std::uint64_t>(g.t0))) / g.span_ns;
    return kLeft + kPlotW * std::clamp(std::isfinite(f) ? f : 0.0, 0.0, 1.0);
  };
  put(out, "<div class=\"chart-box\"><svg class=\"lanes\" id=\"chart-collectives\" viewBox=\"0 0 {} {:.0f}\" "
           "role=\"img\" aria-label=\"collectives of every rank over time\">\n",
      kWidth, height);
  std::size_t bars = 0;
  for (std::size_t lane = 0; lane < views.size(); ++lane) {
    const RankView& view = views[lane];
    const double y = kTop + kLane * static_cast<double>(lane);
    put(out, "<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">rank {}</text>", kLeft - 6, y + 15,
        view.s->row.rank);
    put(out, "<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>\n", kLeft, kLeft + kPlotW,
        y + kLane, y + kLane);
    const RankCollectiveState* state = c.rank_state(view.s->row.rank);
    if (state == nullptr) continue;
    const RankRow& row = view.s->row;
    for (const RankOperation& op : state->operations) {
      if (op.start_t_ns == 0 && op.end_t_ns == 0) continue;  // untracked, its start overwritten: no time known
      const std::int64_t start = op.start_t_ns != 0 ? op.start_t_ns : op.end_t_ns;
      const std::int64_t end = op.finished() ? op.end_t_ns : std::max(row.freeze_t_ns, start);
      const double x0 = x(to_utc(row, start));
      const double w = std::max(1.5, x(to_utc(row, end)) - x0);
      const CommunicatorVerdict* verdict = c.communicator(op.comm_id);  // O(log): per operation
      const std::string comm = verdict != nullptr ? communicator_label(*verdict) : std::string();
      const std::string title =
          fmt::format("rank {}: {} on {}, batch {}, {}", row.rank, describe_operation(op), comm, op.batch,
                      op.finished()  ? fmt::format("{} ({} end)", format_seconds(seconds_between(start, end)),
                                                   op.device_completion ? "device" : "host")
                      : op.untracked ? std::string("untracked: whether it finished is not known")
                                     : fmt::format("in flight at the freeze, for {}",
                                                   format_seconds(seconds_between(start, end))));
      const char* stroke = op.finished() ? view.colour.c_str() : op.untracked ? "#999999" : "#d62728";
      put(out,
          "<rect class=\"{}\" data-rank=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" "
          "stroke=\"{}\" fill=\"{}\"><title>{}</title></rect>\n",
          op.finished() ? "op" : op.untracked ? "op untracked" : "op in-flight", row.rank, x0, y + 4, w, kLane - 8,
          stroke, op.finished() ? view.colour : "none", html(title));
      ++bars;
    }
  }
  put(out, "<text class=\"axis\" x=\"{}\" y=\"{:.0f}\" text-anchor=\"middle\">the memory charts' time axis; a "
           "hollow red bar: in flight at the rank's freeze; a hollow grey one: untracked</text>\n",
      kLeft + kPlotW / 2, height - 8);
  out += "</svg></div>\n";
  put(out, "<p class=\"note\">{} operations drawn (each rank's start to its end: the device's where the source saw "
           "it, else the host call's return).</p>\n</section>\n",
      bars);
  return out;
}

// The metadata a rank's job set (the newest value of each key) and where it ran, as the text report shows them.
std::string context_html(const Archive& a, int rank) {
  const RankContext context = rank_context(a, rank);
  const auto& metadata = context.metadata;
  const std::string& host = context.host;
  const std::string& command = context.command;
  std::string out;
  if (!metadata.empty()) {
    out += "<p class=\"note\">metadata: ";
    for (std::size_t i = 0; i < metadata.size(); ++i) {
      put(out, "{}<code>{}={}</code>", i ? ", " : "", html(metadata[i].first), html(metadata[i].second));
    }
    out += "</p>\n";
  }
  if (!command.empty()) {
    put(out, "<p class=\"note\">ran on {}: <code>{}</code></p>\n", html(host), html(command.substr(0, 400)));
  }
  return out;
}

std::string frame_html(const Archive& a, const FrameRow& f, std::size_t width) {
  const auto function = a.string(f.function);
  const std::string shown =
      function.size() > width ? std::string(function.substr(0, width)) + "..." : std::string(function);
  return fmt::format("<code title=\"{}\">{}</code> <span class=\"loc\">({}:{})</span>", html(function), html(shown),
                     html(a.string(f.file)), f.line);
}

std::string header_section(const Archive& a, const PostMortem& pm, const std::vector<RankView>& views) {
  const auto& h = a.header;
  std::string out;
  put(out, "<header><h1>oomflight post-mortem: {}</h1>\n<dl class=\"header\">\n", html(h.run_name));
  put(out, "<dt>run</dt><dd>{}</dd>\n<dt>kind</dt><dd>{}</dd>\n<dt>created at</dt><dd>{}</dd>\n", html(h.run_name),
      html(h.kind), html(h.created_at_utc));
  put(out, "<dt>written by</dt><dd>{} (schema {})</dd>\n<dt>archive</dt><dd><code>{}</code></dd>\n", html(h.producer),
      h.schema_version, html(a.path));
  std::string origins;
  if (pm.origins.empty()) {
    origins = h.kind == "snapshot" ? "none (a scheduled snapshot)" : "none recorded";
  } else {
    for (std::size_t i = 0; i < pm.origins.size(); ++i) {
      const auto it =
          std::find_if(views.begin(), views.end(), [&](const RankView& v) { return v.s->row.rank == pm.origins[i]; });
      const std::string colour = it != views.end() ? it->colour : "#d62728";
      put(origins, "{}<span class=\"mark\" style=\"color:{}\">rank {} ({})</span>", i ? ", " : "", colour,
          pm.origins[i], origin_mark(a.header.kind));
    }
    if (pm.origins.size() > 1) origins += fmt::format(", rank {} failed first", pm.first_origin);
  }
  put(out, "<dt>{}</dt><dd>{}</dd>\n", pm.origins.size() > 1 ? "origins" : "origin", origins);
  put(out, "<dt>reason</dt><dd><pre>{}</pre></dd>\n", html(h.reason.empty() ? "(none)" : h.reason));
  std::string present;
  for (std::size_t i = 0; i < h.ranks_present.size(); ++i) put(present, "{}{}", i ? ", " : "", h.ranks_present[i]);
  put(out, "<dt>world size</dt><dd>{}</dd>\n<dt>ranks present</dt><dd>{} ({} of {})</dd>\n", h.world_size, present,
      h.ranks_present.size(), h.world_size);
  if (h.window_first_batch >= 0) {
    put(out, "<dt>window</dt><dd>batches {} to {} (their events, after the allocator state at the start of batch "
             "{})</dd>\n",
        h.window_first_batch, h.window_last_batch, h.window_first_batch);
  }
  if (h.snapshot_windows_skipped.value_or(0) > 0) {
    put(out, "<dt>skipped</dt><dd>{} earlier snapshot {} (writes were slower than the windows; at most 2 wait per "
             "rank)</dd>\n",
        *h.snapshot_windows_skipped, *h.snapshot_windows_skipped == 1 ? "window" : "windows");
  }
  out += "</dl>\n";
  // Each origin's failure in a few lines, as the text report opens with it.
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin) continue;
    out += "<div class=\"origin-card\">";
    if (h.kind == "oom") {
      put(out, "<p><strong>rank {} at batch {}</strong>: requested {}, {}</p>\n", s.row.rank, s.row.batch,
          format_bytes(s.row.oom_requested_bytes), html(device_figures_text(s)));
    } else {
      put(out, "<p><strong>rank {} at batch {}</strong>: {}; {}</p>\n", s.row.rank, s.row.batch,
          html(origin_deed(h.kind)), html(device_figures_text(s, false)));
    }
    const std::string reason = fixed_string(s.row.reason);
    if (!reason.empty()) put(out, "<pre>{}</pre>\n", html(reason));
    if (h.kind == "oom" && s.cache) {
      put(out, "<p class=\"cache\">{}</p>\n", html(cache_at_failure_text(*s.cache, s.row.oom_requested_bytes)));
    }
    if (h.kind == "oom") {
      if (const std::string what_if = expandable_what_if_text(a, s); !what_if.empty()) {
        put(out, "<p class=\"what-if\">{}</p>\n", html(what_if));
      }
    }
    out += context_html(a, s.row.rank);
    out += "</div>\n";
  }
  out += "</header>\n";
  return out;
}

std::string memory_section(const Archive& a, const Grid& g, const std::vector<RankView>& views,
                           const std::vector<OomMark>& ooms, std::size_t oom_events, bool any_point) {
  std::string out = "<section id=\"memory\"><h2>Memory over time</h2>\n";
  if (!any_point) {
    return out + "<p class=\"note\">No rank recorded an event or the time of its freeze: there is no curve to "
                 "draw.</p>\n</section>\n";
  }
  out += "<ul class=\"legend\">";
  for (const auto& v : views) {
    put(out, "<li{}><span class=\"swatch\" style=\"background:{}\"></span>{}</li>",
        v.s->row.is_origin ? " class=\"origin\"" : "", v.colour, html(v.label));
  }
  out += "</ul>\n<h3>Allocated</h3>\n";
  out += chart("chart-allocated", "allocated", false, g, views, ooms);
  out += "<h3>Reserved</h3>\n";
  out += chart("chart-reserved", "reserved", true, g, views, ooms);
  out += "<p class=\"note\">Each rank's curve is replayed from its recorded events (allocations and frees for "
         "allocated, segments for reserved) and shifted to end at the figures the rank published at the trigger, so "
         "memory allocated before its recorded history begins is the curve's baseline. Ranks are put on one time axis "
         "by their clock anchors. Each point is the peak of its interval";
  put(out, " ({} points over {:.6f} s).", g.n, g.span_ns * 1e-9);
  if (oom_events > ooms.size()) put(out, " {} of {} out-of-memory events are marked.", ooms.size(), oom_events);
  bool overwritten = false;
  for (const auto& r : a.ranks) overwritten = overwritten || r.overwritten != 0;
  if (overwritten) out += " Some ranks' oldest events were overwritten: their curves start later.";
  out += "</p>\n</section>\n";
  return out;
}

std::string ranks_section(const Archive& a, const PostMortem& pm) {
  std::string out =
      "<section id=\"ranks\"><h2>Per rank at the trigger</h2>\n<table><tr><th>rank</th><th class=\"l\">host</th>"
      "<th>batch</th><th>allocated</th><th>reserved</th><th title=\"outside the caching allocator: the driver's count "
      "of the process (NVML) less its reserved\">outside</th><th>peak alloc</th><th>peak resv</th><th>limit</th>"
      "<th>headroom</th><th>events</th><th>overwritten</th><th class=\"l\"></th></tr>\n";
  for (const auto& s : pm.ranks) {
    const auto& r = s.row;
    put(out,
        "<tr{}><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l mark\">{}</td></tr>\n",
        r.is_origin ? " class=\"origin\"" : "", r.rank, html(fixed_string(r.host)), r.batch,
        format_bytes(r.allocated_bytes), format_bytes(r.reserved_bytes), outside_cell(r),
        format_bytes(r.peak_allocated_bytes),
        format_bytes(r.peak_reserved_bytes),
        s.limit_bytes ? format_bytes(s.limit_bytes) + (s.limit_is_cap ? " cap" : "") : "?",
        s.limit_bytes ? format_bytes(s.headroom_bytes) : "?", r.event_count, r.overwritten,
        r.is_origin ? origin_mark(a.header.kind) : "");
  }
  out += "</table>\n";
  for (const std::string& said : {outside_standout_line(pm), outside_unknown_line(pm)}) {
    if (!said.empty()) put(out, "<p class=\"note\">{}</p>\n", html(said));
  }
  out += "</section>\n";
  return out;
}

// Each rank's own per-batch peak over the last batches any rank kept, with the growth over the ended ones (the
// text report's table, wider).
std::string batches_section(const Archive& a, const PostMortem& pm) {
  std::vector<std::int64_t> batches;
  for (const auto& b : a.batches) batches.push_back(b.batch);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  if (batches.empty()) {
    return "<section id=\"batches\"><h2>Per-batch peaks</h2>\n<p class=\"note\">The archive has no per-batch rows "
           "(written before oomflight 0.3.0).</p>\n</section>\n";
  }
  const std::size_t total = batches.size();
  if (batches.size() > kBatchColumns) {
    batches.erase(batches.begin(), batches.end() - static_cast<std::ptrdiff_t>(kBatchColumns));
  }
  std::string out;
  put(out, "<section id=\"batches\"><h2>Per-batch peaks</h2>\n<p class=\"note\">Each batch's own peak allocated "
           "bytes, the last {} of {} batches; * still running at the dump. Growth and share of capacity over the "
           "ended ones.</p>\n<table><tr><th>rank</th>",
      batches.size(), total);
  for (const auto b : batches) put(out, "<th>batch {}</th>", b);
  out += "<th>growth</th><th>of capacity</th><th class=\"l\"></th></tr>\n";
  for (const auto& s : pm.ranks) {
    const auto rows = a.batches_of(s.row.rank);
    if (rows.empty()) continue;
    put(out, "<tr{}><td>{}</td>", s.row.is_origin ? " class=\"origin\"" : "", s.row.rank);
    const BatchRow* first = nullptr;
    const BatchRow* last = nullptr;
    for (const auto b : batches) {
      const auto it = std::find_if(rows.begin(), rows.end(), [&](const BatchRow& r) { return r.batch == b; });
      if (it == rows.end()) {
        out += "<td>-</td>";
        continue;
      }
      // A batch still running has only a partial peak, unless it is the only one or the origin's failing batch.
      if (it->end_t_ns != 0 || s.row.is_origin || last == nullptr) {
        if (first == nullptr) first = &*it;
        last = &*it;
      }
      // Shaded by the share of the device it reached, from half full on.
      const double share = it->device_capacity_bytes ? static_cast<double>(it->peak_allocated_bytes) /
                                                           static_cast<double>(it->device_capacity_bytes)
                                                     : 0.0;
      const double alpha = std::clamp((share - 0.5) * 0.8, 0.0, 0.4);
      put(out, "<td{}>{}{}</td>",
          alpha > 0 ? fmt::format(" style=\"background:rgba(214,39,40,{:.2f})\"", alpha) : std::string(),
          format_bytes(it->peak_allocated_bytes), it->end_t_ns == 0 ? "*" : "");
    }
    if (first != nullptr) {
      put(out, "<td>{}</td><td>{}</td>", signed_bytes(last->peak_allocated_bytes, first->peak_allocated_bytes),
          percent(last->peak_allocated_bytes, last->device_capacity_bytes));
    } else {
      out += "<td></td><td></td>";
    }
    put(out, "<td class=\"l mark\">{}</td></tr>\n", s.row.is_origin ? origin_mark(a.header.kind) : "");
  }
  out += "</table>\n</section>\n";
  return out;
}

// Each rank's trend of peak reserved and the call sites that grow (issue 42, items 2 and 3), in the text report's
// words (growth_lines.hpp). Empty when there is neither.
std::string growth_section(const Archive& a, const PostMortem& pm, std::size_t frames) {
  std::string trends, sites;
  for (const auto& s : pm.ranks) {
    if (const std::string t = peak_trend_text(s); !t.empty()) {
      put(trends, "<tr{}><td>{}</td><td class=\"l\">{}</td></tr>\n", s.row.is_origin ? " class=\"origin\"" : "",
          s.row.rank, html(t));
    }
    for (const GrowingSite& g : s.growing) {
      put(sites, "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">", s.row.rank,
          html(growing_site_text(g)));
      const auto shown = frames_to_show(a, g.stack_id, frames);
      if (shown.empty()) {
        put(sites, "<span class=\"note\">{}</span>",
            g.stack_id == kNoStack || a.stack(g.stack_id).empty() ? "no stack recorded"
                                                                  : "only the allocator's own frames recorded");
      } else {
        sites += "<ol class=\"frames\">";
        for (const FrameRow* f : shown) put(sites, "<li>{}</li>", frame_html(a, *f, 160));
        sites += "</ol>";
      }
      sites += "</td></tr>\n";
    }
  }
  if (trends.empty() && sites.empty()) return {};
  std::string out = "<section id=\"growth\"><h2>Trends</h2>\n";
  if (!trends.empty()) {
    out += "<p class=\"note\">Each rank's per-batch peak reserved, a least-squares line over its last ended batches "
           "(at most 64), and where that line meets its limit.</p>\n<table><tr><th>rank</th><th class=\"l\">peak "
           "reserved</th></tr>\n" + trends + "</table>\n";
  }
  if (sites.empty()) {
    out += "<p>No call site's live bytes grew batch after batch.</p>\n";
  } else {
    out += "<h3>Call sites whose live bytes grew batch after batch</h3>\n<p class=\"note\">Never fell, and rose in at "
           "least two of three batches.</p>\n<table><tr><th>rank</th><th class=\"l\">growth</th><th class=\"l\">"
           "where (innermost first)</th></tr>\n" + sites + "</table>\n";
  }
  return out + "</section>\n";
}

std::string call_sites_section(const Archive& a, const RankSummary& s, std::size_t frames) {
  std::string out;
  put(out, "<section class=\"call-sites\"><h2>Live memory on rank {} by call site</h2>\n<p>{} live blocks, {} in "
           "the recorded history; {} allocated in all.",
      s.row.rank, s.live_count, format_bytes(s.live_bytes_in_history), format_bytes(s.row.allocated_bytes));
  if (s.row.allocated_bytes > s.live_bytes_in_history) {
    put(out, " {} were allocated before the recorded history begins.",
        format_bytes(s.row.allocated_bytes - s.live_bytes_in_history));
  }
  out += "</p>\n";
  if (s.call_sites.empty()) return out + "<p class=\"note\">No live block in the recorded history.</p>\n</section>\n";
  out += "<table><tr><th>#</th><th class=\"l\">blocks</th><th>bytes</th><th class=\"l\">share of allocated</th>"
         "<th class=\"l\">where (innermost first)</th></tr>\n";
  for (std::size_t i = 0; i < s.call_sites.size(); ++i) {
    const CallSite& c = s.call_sites[i];
    const std::string what =
        c.blocks == 1 ? fmt::format("1 block of {}", format_bytes(c.bytes))
        : c.smallest == c.largest
            ? fmt::format("{} blocks x {}", c.blocks, format_bytes(c.largest))
            : fmt::format("{} blocks, {} to {}", c.blocks, format_bytes(c.smallest), format_bytes(c.largest));
    // As the text report says it: the state the job had before it trained (weights, a replay's older blocks).
    const std::string before =
        c.before_first_batch == 0 ? std::string()
        : c.before_first_batch == c.blocks
            ? std::string("<br><span class=\"note\">allocated before the first batch</span>")
            : fmt::format("<br><span class=\"note\">{} of them allocated before the first batch</span>",
                          c.before_first_batch);
    const double share =
        s.row.allocated_bytes ? std::min(1.0, static_cast<double>(c.bytes) / static_cast<double>(s.row.allocated_bytes))
                              : 0.0;
    put(out,
        "<tr><td>{}</td><td class=\"l nw\">{}</td><td>{}</td><td class=\"l nw\"><div class=\"bar small\"><div "
        "class=\"alloc\" style=\"width:{:.1f}%\"></div></div> {:.1f}%</td><td class=\"l\">",
        i + 1, what + before, format_bytes(c.bytes), 100 * share, 100 * share);
    const auto shown = frames_to_show(a, c.stack_id, frames);
    if (c.stack_id == kNoStack || a.stack(c.stack_id).empty()) {
      out += "<span class=\"note\">no stack recorded</span>";
    } else if (shown.empty()) {
      out += "<span class=\"note\">only the allocator's own frames recorded</span>";
    } else {
      out += "<ol class=\"frames\">";
      for (const FrameRow* f : shown) put(out, "<li>{}</li>", frame_html(a, *f, 160));
      out += "</ol>";
    }
    out += "</td></tr>\n";
  }
  out += "</table>\n</section>\n";
  return out;
}

std::string peers_section(const Archive& a, const PostMortem& pm, const RankSummary& s) {
  std::size_t peer_count = 0;
  for (const auto& p : pm.ranks) peer_count += p.row.is_origin ? 0 : 1;
  if (peer_count == 0) return {};
  const AgainstPeers judgement = judge_against_peers(s);
  std::string out;
  put(out, "<section class=\"peers\"><h2>Rank {} against its {} peers</h2>\n<p>{} live in the recorded history, the "
           "median peer {} ({}): {}.</p>\n",
      s.row.rank, peer_count, format_bytes(s.live_bytes_in_history), format_bytes(s.peers_median_live_bytes),
      signed_bytes(s.live_bytes_in_history, s.peers_median_live_bytes),
      judgement == AgainstPeers::outlier ? std::string("<strong class=\"mark\">an outlier</strong>")
                                         : html(against_peers_words(judgement)));
  if (!s.against_peers.empty()) {
    put(out, "<table><tr><th>more than the median peer</th><th class=\"l\">at</th><th>rank {}</th>"
             "<th>median peer</th></tr>\n",
        s.row.rank);
    for (const CallSiteDiff& d : s.against_peers) {
      const auto shown = frames_to_show(a, d.stack_id, 1);
      put(out, "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>\n",
          signed_bytes(d.origin_bytes, d.peers_median_bytes),
          shown.empty() ? std::string("<span class=\"note\">no stack recorded</span>") : frame_html(a, *shown[0], 100),
          format_bytes(d.origin_bytes), format_bytes(d.peers_median_bytes));
    }
    out += "</table>\n";
  }
  // A smaller device, not more memory, is the other way to fail first.
  std::vector<std::uint64_t> capacities;
  for (const auto& p : pm.ranks) {
    if (!p.row.is_origin && p.row.device_capacity_bytes) capacities.push_back(p.row.device_capacity_bytes);
  }
  std::sort(capacities.begin(), capacities.end());
  if (!capacities.empty() && s.row.device_capacity_bytes &&
      s.row.device_capacity_bytes != capacities[capacities.size() / 2]) {
    put(out, "<p>Its device holds <strong>{}</strong>, the median peer's {}.</p>\n",
        format_bytes(s.row.device_capacity_bytes), format_bytes(capacities[capacities.size() / 2]));
  }
  out += "</section>\n";
  return out;
}

std::string headroom_section(const Archive& a, const PostMortem& pm) {
  std::string out =
      "<section id=\"headroom\"><h2>Headroom against the limit</h2>\n<table><tr><th>rank</th>"
      "<th class=\"l\">allocated, reserved and peak reserved of the device</th><th>reserved</th><th>limit</th>"
      "<th>share</th><th>headroom</th><th>peak reserved</th><th class=\"l\"></th></tr>\n";
  for (const auto& s : pm.ranks) {
    const auto& r = s.row;
    put(out, "<tr{}><td>{}</td><td class=\"l\">", r.is_origin ? " class=\"origin\"" : "", r.rank);
    if (r.device_capacity_bytes == 0) {
      out += "<span class=\"note\">capacity unknown</span>";
    } else {
      const auto width = [&](std::uint64_t v) {
        return std::min(100.0, 100.0 * static_cast<double>(v) / static_cast<double>(r.device_capacity_bytes));
      };
      put(out,
          "<div class=\"bar\"><div class=\"resv\" style=\"width:{:.1f}%\"></div><div class=\"alloc\" "
          "style=\"width:{:.1f}%\"></div><div class=\"peak\" style=\"left:{:.1f}%\"></div></div>",
          width(r.reserved_bytes), width(r.allocated_bytes), width(r.peak_reserved_bytes));
    }
    put(out, "</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l mark\">{}</td></tr>\n",
        format_bytes(r.reserved_bytes),
        s.limit_bytes ? format_bytes(s.limit_bytes) + (s.limit_is_cap ? " cap" : "") : "?",
        percent(r.reserved_bytes, s.limit_bytes), s.limit_bytes ? format_bytes(s.headroom_bytes) : "?",
        format_bytes(r.peak_reserved_bytes),
        r.is_origin ? (a.header.kind == "oom" ? fmt::format("out of memory: {} requested",
                                                            format_bytes(r.oom_requested_bytes))
                                              : std::string(origin_mark(a.header.kind)))
                    : std::string());
  }
  out += "</table>\n<p class=\"note\">Bars: allocated (dark) and reserved (light) at the trigger, peak reserved "
         "(the tick), against the device's capacity. The limit is the process's own cap (torch's per-process memory "
         "fraction, marked cap) when it has one, else the device's capacity; headroom is measured against it.</p>\n"
         "</section>\n";
  return out;
}

// The data behind the charts, and the archive's strings the page shows, for the script and for other tools.
std::string data_json(const Archive& a, const PostMortem& pm, const Grid& g, const std::vector<RankView>& views,
                      const std::vector<OomMark>& ooms, std::size_t frames) {
  const auto& h = a.header;
  const auto ints = [](const auto& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) put(out, "{}{}", i ? "," : "", v[i]);
    return out + "]";
  };
  const auto series = [](const std::vector<std::int64_t>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      if (v[i] < 0) {
        out += "null";
      } else {
        put(out, "{}", v[i]);
      }
    }
    return out + "]";
  };
  std::string out = "{";
  put(out, "\"run_name\":{},\"kind\":{},\"created_at_utc\":{},\"producer\":{},\"reason\":{},\"path\":{},",
      json(h.run_name), json(h.kind), json(h.created_at_utc), json(h.producer), json(h.reason), json(a.path));
  put(out, "\"origins\":{},\"first_origin\":{},\"world_size\":{},\"ranks_present\":{},", ints(pm.origins),
      pm.first_origin, h.world_size, ints(h.ranks_present));
  put(out, "\"time\":{{\"t0_utc\":{},\"span_s\":{},\"points\":{}}},", json(utc_text(g.t0)), g.span_ns * 1e-9, g.n);
  out += "\"ranks\":[";
  for (std::size_t i = 0; i < views.size(); ++i) {
    const RankView& v = views[i];
    const auto& r = v.s->row;
    put(out,
        "{}{{\"rank\":{},\"label\":{},\"host\":{},\"origin\":{},\"capacity_bytes\":{},\"allocated_bytes\":{},"
        "\"reserved_bytes\":{},\"headroom_bytes\":{},\"reason\":{},\"allocated\":{},\"reserved\":{}}}",
        i ? "," : "", r.rank, json(v.label), json(fixed_string(r.host)), r.is_origin ? "true" : "false",
        r.device_capacity_bytes, r.allocated_bytes, r.reserved_bytes, v.s->headroom_bytes, json(fixed_string(r.reason)),
        series(v.curve.allocated), series(v.curve.reserved));
  }
  out += "],\"oom\":[";
  for (std::size_t i = 0; i < ooms.size(); ++i) {
    put(out, "{}{{\"rank\":{},\"t_s\":{},\"requested_bytes\":{}}}", i ? "," : "", ooms[i].rank,
        g.seconds(g.index(ooms[i].utc)), ooms[i].requested);
  }
  out += "],\"call_sites\":[";
  bool first = true;
  for (const auto& s : pm.ranks) {
    for (const CallSite& c : s.call_sites) {
      put(out, "{}{{\"rank\":{},\"blocks\":{},\"bytes\":{},\"frames\":[", first ? "" : ",", s.row.rank, c.blocks,
          c.bytes);
      first = false;
      const auto shown = frames_to_show(a, c.stack_id, frames);
      for (std::size_t k = 0; k < shown.size(); ++k) {
        put(out, "{}{{\"function\":{},\"file\":{},\"line\":{}}}", k ? "," : "", json(a.string(shown[k]->function)),
            json(a.string(shown[k]->file)), shown[k]->line);
      }
      out += "]}";
    }
  }
  out += "]}";
  return out;
}

// Styles: system fonts only (the page loads nothing).
constexpr std::string_view kStyle = R"(
:root { color-scheme: light; }
body { font-family: system-ui, "DejaVu Sans", sans-serif; font-size: 14px; line-height: 1.45; color: #1d1d1f;
       background: #fff; max-width: 1180px; margin: 20px auto; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 8px; }
h2 { font-size: 17px; margin: 30px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
h3 { font-size: 14px; margin: 14px 0 2px; color: #444; }
dl.header { display: grid; grid-template-columns: max-content 1fr; gap: 2px 18px; margin: 8px 0 12px; }
dl.header dt { color: #666; } dl.header dd { margin: 0; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; background: #f5f5f5; padding: 6px 10px; border-radius: 4px;
      margin: 2px 0; font-size: 12.5px; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; overflow-wrap: anywhere; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 4px 0; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; vertical-align: top;
         white-space: nowrap; }
th { background: #fafafa; font-weight: 600; }
th.l, td.l { text-align: left; }
td.l { white-space: normal; }
td.nw { white-space: nowrap; }
.loc { color: #666; font-size: 12px; }
tr.origin td { background: #fdecea; }
tr.origin td:first-child { box-shadow: inset 4px 0 #d62728; font-weight: 600; }
.mark { color: #d62728; font-weight: 600; }
.note { color: #555; font-size: 13px; }
.origin-card { border-left: 4px solid #d62728; padding: 2px 12px; margin: 8px 0; background: #fffafa; }
.origin-card p { margin: 4px 0; }
ul.legend { list-style: none; padding: 0; margin: 6px 0; display: flex; flex-wrap: wrap; gap: 4px 20px; }
ul.legend li.origin { color: #d62728; font-weight: 600; }
.swatch { display: inline-block; width: 24px; height: 4px; border-radius: 2px; vertical-align: middle;
          margin-right: 6px; }
.chart-box { position: relative; }
svg.chart { display: block; width: 100%; height: auto; font-family: system-ui, "DejaVu Sans", sans-serif; }
svg.chart .grid { stroke: #ececec; stroke-width: 1; }
svg.chart .frame { fill: none; stroke: #bbb; }
svg.chart .tick { font-size: 12px; fill: #555; }
svg.chart .axis { font-size: 12px; fill: #333; }
svg.chart .label { font-size: 12px; paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg.chart .capacity { stroke-width: 1.2; stroke-dasharray: 6 4; }
svg.chart g.series { fill: none; stroke-width: 1.6; stroke-linejoin: round; opacity: 0.85; }
svg.chart g.series.origin { stroke-width: 2.6; opacity: 1; }
svg.chart g.oom line { stroke-width: 1.5; stroke-dasharray: 3 3; }
svg.chart .cursor { stroke: #333; stroke-width: 1; }
svg.lanes { display: block; width: 100%; height: auto; font-family: system-ui, "DejaVu Sans", sans-serif; }
svg.lanes .grid { stroke: #ececec; stroke-width: 1; }
svg.lanes .tick, svg.lanes .axis { font-size: 12px; fill: #555; }
svg.lanes rect.op { fill-opacity: 0.55; stroke-width: 1; }
svg.lanes rect.in-flight { stroke-width: 2; stroke-dasharray: 4 2; }
p.verdict.first { font-weight: 600; }
.tip { position: absolute; top: 8px; pointer-events: none; background: rgba(255,255,255,0.95); border: 1px solid #bbb;
       border-radius: 4px; padding: 4px 8px; font-size: 12px; white-space: pre;
       box-shadow: 0 1px 4px rgba(0,0,0,0.15); }
.bar { position: relative; display: inline-block; vertical-align: middle; width: 280px; height: 14px; background: #eee;
       border-radius: 3px; overflow: visible; }
.bar.small { width: 120px; height: 10px; }
.bar .resv, .bar .alloc { position: absolute; top: 0; bottom: 0; left: 0; border-radius: 3px; }
.bar .resv { background: #9ecae1; } .bar .alloc { background: #3182bd; }
.bar .peak { position: absolute; top: -3px; bottom: -3px; width: 2px; margin-left: -1px; background: #222; }
tr.origin .bar .resv { background: #f4a6a6; } tr.origin .bar .alloc { background: #d62728; }
ol.frames { list-style: none; margin: 0; padding: 0; }
#errors { color: #b00000; background: #fff0f0; }
footer { margin: 30px 0 10px; color: #777; font-size: 12px; }
)";

// Before anything else runs: an error of the page's own script shows on the page (and the browser test reads it).
constexpr std::string_view kErrorScript = R"(
window.onerror = function (message, source, line, column) {
  var box = document.getElementById('errors');
  if (box) { box.hidden = false; box.textContent += message + ' (line ' + line + ':' + column + ')\n'; }
};
)";

// The readout under the mouse: the time and each rank's bytes at the point nearest to it. Text only
// (textContent), so no string of the data is ever parsed as markup.
constexpr std::string_view kScript = R"(
(function () {
  var data = JSON.parse(document.getElementById('oomflight-data').textContent);
  var n = data.time.points;
  function bytes(b) {
    if (b < 1024) return b + ' B';
    var units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'], i = -1;
    do { b /= 1024; ++i; } while (b >= 1024 && i + 1 < units.length);
    return b.toFixed(2) + ' ' + units[i];
  }
  Array.prototype.forEach.call(document.querySelectorAll('svg.chart'), function (svg) {
    var series = svg.getAttribute('data-series');
    var left = Number(svg.getAttribute('data-left')), width = Number(svg.getAttribute('data-width'));
    var cursor = svg.querySelector('.cursor'), tip = document.getElementById(svg.id + '-tip');
    function hide() { cursor.setAttribute('visibility', 'hidden'); tip.hidden = true; }
    svg.addEventListener('mousemove', function (event) {
      var box = svg.getBoundingClientRect(), scale = svg.viewBox.baseVal.width / box.width;
      var i = Math.round(((event.clientX - box.left) * scale - left) / width * (n - 1));
      if (!(i >= 0 && i < n)) { hide(); return; }
      var x = left + width * i / Math.max(1, n - 1);
      cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
      var lines = [(data.time.span_s * i / Math.max(1, n - 1)).toFixed(6) + ' s, ' + series];
      data.ranks.forEach(function (rank) {
        var v = rank[series][i];
        if (v !== null && v !== undefined) lines.push(rank.label + ': ' + bytes(v));
      });
      tip.textContent = lines.join('\n');
      tip.hidden = false;
      var px = x / scale;
      tip.style.left = (px > box.width * 0.6 ? px - tip.offsetWidth - 12 : px + 12) + 'px';
    });
    svg.addEventListener('mouseleave', hide);
  });
  document.body.dataset.rendered = '1';
})();
)";

}  // namespace

std::string render_html_report(const Archive& a, const PostMortem& pm, std::size_t frames) {
  // Colours: origins in reds, their peers in cool colours, so the failing rank stands out in every chart.
  static constexpr const char* kOriginColours[] = {"#d62728", "#ff7f0e", "#8c1c13"};
  static constexpr const char* kPeerColours[] = {"#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#8c564b",
                                                 "#e377c2", "#7f7f7f", "#bcbd22", "#393b79", "#637939"};
  std::vector<std::vector<Point>> replays;
  std::vector<RankView> views;
  std::size_t origin_n = 0, peer_n = 0, longest = 0;
  for (const auto& s : pm.ranks) {
    RankView v;
    v.s = &s;
    v.colour = s.row.is_origin ? kOriginColours[origin_n++ % std::size(kOriginColours)]
                               : kPeerColours[peer_n++ % std::size(kPeerColours)];
    v.label = fmt::format("rank {}{}", s.row.rank, s.row.is_origin ? fmt::format(" ({})", origin_mark(a.header.kind)) : "");
    views.push_back(std::move(v));
    replays.push_back(replay(a, s.row));
    longest = std::max(longest, replays.back().size());
  }

  // One time axis for all: from the earliest point of any rank to the latest.
  Grid g;
  bool any = false;
  std::int64_t t1 = 0;
  for (const auto& points : replays) {
    if (points.empty()) continue;
    g.t0 = any ? std::min(g.t0, points.front().utc) : points.front().utc;
    t1 = any ? std::max(t1, points.back().utc) : points.back().utc;
    any = true;
  }
  g.span_ns = std::max(1.0, static_cast<double>(static_cast<std::uint64_t>(t1) - static_cast<std::uint64_t>(g.t0)));
  const std::size_t budget =
      std::min(kMaxPoints, std::max(kMinPoints, kPointBudget / std::max<std::size_t>(1, views.size())));
  g.n = std::clamp<std::size_t>(longest, 2, budget);
  for (std::size_t i = 0; i < views.size(); ++i) views[i].curve = sample(replays[i], g);

  std::vector<OomMark> ooms;
  std::size_t oom_events = 0;
  for (const auto& v : views) {
    for (const Event& e : a.events_of(v.s->row)) {
      if (e.action != Action::oom) continue;
      ++oom_events;
      if (ooms.size() < kMaxOomMarks) ooms.push_back({v.s->row.rank, to_utc(v.s->row, e.t_ns), e.size, v.colour});
    }
  }

  const auto& h = a.header;
  std::string out;
  out.reserve(256 * 1024);
  out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // The page loads nothing: the policy makes sure of it, whatever a string in it might try.
  out += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
         "script-src 'unsafe-inline'; img-src data:\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<link rel=\"icon\" href=\"data:,\">\n";
  put(out, "<title>oomflight: {} ({})</title>\n", html(h.run_name), html(h.kind));
  put(out, "<style>{}</style>\n<script>{}</script>\n</head>\n<body>\n", kStyle, kErrorScript);
  out += "<pre id=\"errors\" hidden></pre>\n";
  out += header_section(a, pm, views);
  out += memory_section(a, g, views, ooms, oom_events, any);
  out += collectives_section(a, g, views);
  out += ranks_section(a, pm);
  out += batches_section(a, pm);
  out += growth_section(a, pm, frames);
  for (const auto& s : pm.ranks) {
    if (s.row.is_origin) out += call_sites_section(a, s, frames);
  }
  for (const auto& s : pm.ranks) {
    if (s.row.is_origin && pm.ranks.size() > 1) out += peers_section(a, pm, s);
  }
  out += headroom_section(a, pm);
  put(out, "<footer>Written by {} from <code>{}</code>. This page is self-contained: it loads nothing.</footer>\n",
      html(h.producer), html(a.path));
  put(out, "<script type=\"application/json\" id=\"oomflight-data\">{}</script>\n",
      data_json(a, pm, g, views, ooms, frames));
  put(out, "<script>{}</script>\n</body>\n</html>\n", kScript);
  return out;
}

}  // namespace oomflight
