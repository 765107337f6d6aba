// Post-mortem analysis and its text rendering.
#include "oomflight/report.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unordered_map>

#include "oomflight/units.hpp"

namespace oomflight {
namespace {

std::int64_t to_utc(const RankRow& row, std::int64_t t_ns) {
  return t_ns - row.anchor_monotonic_ns + row.anchor_realtime_ns;
}

RankSummary summarize(const Archive& a, const RankRow& row, bool origin, std::size_t top) {
  RankSummary s;
  s.row = row;
  if (row.device_capacity_bytes > row.reserved_bytes) s.headroom_bytes = row.device_capacity_bytes - row.reserved_bytes;
  std::unordered_map<std::uint64_t, LiveAllocation> live;
  for (const Event& e : a.events_of(row)) {
    const auto action = static_cast<std::size_t>(e.action);
    if (action < static_cast<std::size_t>(kActionCount)) ++s.action_counts[action];
    if (e.action == Action::alloc) {
      live[e.addr] = LiveAllocation{e.addr, e.size, e.batch, e.t_ns, e.stack_id};
    } else if (e.action == Action::free_completed) {
      live.erase(e.addr);
    } else if (e.action == Action::oom) {
      s.oom_utc_ns = to_utc(row, e.t_ns);
    }
  }
  for (const auto& [addr, l] : live) s.live_bytes_in_history += l.size;
  s.live_count = live.size();
  if (origin) {
    s.largest.reserve(live.size());
    for (const auto& [addr, l] : live) s.largest.push_back(l);
    std::sort(s.largest.begin(), s.largest.end(), [](const LiveAllocation& x, const LiveAllocation& y) {
      return x.size != y.size ? x.size > y.size : x.addr < y.addr;
    });
    if (s.largest.size() > top) s.largest.resize(top);
  }
  return s;
}

// The frames worth showing: Python frames first (the user's code), else any frame with a known file.
std::vector<const FrameRecord*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n) {
  const auto all = a.stack(stack_id);
  std::vector<const FrameRecord*> out;
  for (const auto* f : all) {
    const auto file = a.string(f->file);
    if (file.size() > 3 && file.substr(file.size() - 3) == ".py" && out.size() < n) out.push_back(f);
  }
  if (!out.empty()) return out;
  for (const auto* f : all) {
    if (out.size() >= n) break;
    if (a.string(f->file) != "??") out.push_back(f);
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

PostMortem analyze(const Archive& archive, std::size_t top) {
  PostMortem pm;
  pm.origins.assign(archive.header.origin_ranks.begin(), archive.header.origin_ranks.end());
  std::vector<RankRow> rows = archive.ranks;
  std::sort(rows.begin(), rows.end(), [](const RankRow& x, const RankRow& y) { return x.rank < y.rank; });
  std::int64_t first = 0;
  for (const auto& row : rows) {
    const bool origin = std::find(pm.origins.begin(), pm.origins.end(), row.rank) != pm.origins.end();
    pm.ranks.push_back(summarize(archive, row, origin, top));
    const auto& s = pm.ranks.back();
    if (origin && s.oom_utc_ns != 0 && (pm.first_origin < 0 || s.oom_utc_ns < first)) {
      pm.first_origin = row.rank;
      first = s.oom_utc_ns;
    }
  }
  if (pm.first_origin < 0 && !pm.origins.empty()) pm.first_origin = pm.origins.front();
  return pm;
}

std::string render_report(const Archive& a, const PostMortem& pm, std::size_t frames) {
  const auto& h = a.header;
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(fmt::format("oomflight report: {}", a.path));
  line(fmt::format("run {}, kind {}, written {} by {} (schema {})", h.run_name, h.kind, h.created_at_utc, h.producer,
                   h.schema_version));
  line(fmt::format("world size {}, ranks present {} ({} of {})", h.world_size, fmt::join(h.ranks_present, ","),
                   h.ranks_present.size(), h.world_size));
  line("");
  if (pm.origins.empty()) {
    line("origin: none recorded");
  } else {
    line(fmt::format("origin: {}{}", ranks_text(pm.origins),
                     pm.origins.size() > 1 ? fmt::format(" (rank {} failed first)", pm.first_origin) : ""));
  }
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin) continue;
    line(fmt::format("  rank {} at batch {}: requested {}, device free {} of {}", s.row.rank, s.row.batch,
                     format_bytes(s.row.oom_requested_bytes), format_bytes(s.row.device_free_bytes),
                     s.row.device_capacity_bytes ? format_bytes(s.row.device_capacity_bytes) : "unknown"));
    const std::string reason = fixed_string(s.row.reason);
    if (!reason.empty()) line(fmt::format("    {}", reason));
  }
  line("");
  line("per rank at the trigger:");
  line(fmt::format("  {:>4} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>11}", "rank", "batch", "allocated",
                   "reserved", "peak alloc", "peak resv", "capacity", "headroom", "events", "overwritten"));
  for (const auto& s : pm.ranks) {
    const auto& r = s.row;
    line(fmt::format("  {:>4} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>11}{}", r.rank, r.batch,
                     format_bytes(r.allocated_bytes), format_bytes(r.reserved_bytes),
                     format_bytes(r.peak_allocated_bytes), format_bytes(r.peak_reserved_bytes),
                     r.device_capacity_bytes ? format_bytes(r.device_capacity_bytes) : "?",
                     r.device_capacity_bytes ? format_bytes(s.headroom_bytes) : "?", r.event_count, r.overwritten,
                     r.is_origin ? "  <- out of memory" : ""));
  }
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin) continue;
    line("");
    line(fmt::format("largest live allocations on rank {} (of {} live blocks, {} in the recorded history; {} "
                     "allocated in all):",
                     s.row.rank, s.live_count, format_bytes(s.live_bytes_in_history),
                     format_bytes(s.row.allocated_bytes)));
    if (s.row.allocated_bytes > s.live_bytes_in_history) {
      line(fmt::format("  ({} were allocated before the recorded history begins)",
                       format_bytes(s.row.allocated_bytes - s.live_bytes_in_history)));
    }
    for (std::size_t i = 0; i < s.largest.size(); ++i) {
      const auto& l = s.largest[i];
      line(fmt::format("  {:>2}. {:>11} at 0x{:x}, batch {}, {:.3f} s before the freeze", i + 1, format_bytes(l.size),
                       l.addr, l.batch, static_cast<double>(s.row.freeze_t_ns - l.t_ns) / 1e9));
      for (const auto* f : frames_to_show(a, l.stack_id, frames)) {
        line(fmt::format("        {} ({}:{})", a.string(f->function), a.string(f->file), f->line));
      }
    }
  }
  line("");
  line("other ranks against their capacity:");
  for (const auto& s : pm.ranks) {
    if (s.row.is_origin) continue;
    const auto& r = s.row;
    if (r.device_capacity_bytes == 0) {
      line(fmt::format("  rank {}: {} reserved, capacity unknown", r.rank, format_bytes(r.reserved_bytes)));
      continue;
    }
    line(fmt::format("  rank {}: {} reserved of {} ({:.1f}%), {} headroom; peak reserved {}", r.rank,
                     format_bytes(r.reserved_bytes), format_bytes(r.device_capacity_bytes),
                     100.0 * static_cast<double>(r.reserved_bytes) / static_cast<double>(r.device_capacity_bytes),
                     format_bytes(s.headroom_bytes), format_bytes(r.peak_reserved_bytes)));
  }
  return out;
}

}  // namespace oomflight
