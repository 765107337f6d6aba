// The text report: a PostMortem rendered for a terminal.
#include "oomflight/export/text_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

// The frames worth showing: Python frames first (the user's code), else any frame with a known file.
std::vector<const FrameRow*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n) {
  const auto all = a.stack(stack_id);
  std::vector<const FrameRow*> out;
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
                       l.addr, l.batch, (static_cast<double>(s.row.freeze_t_ns) - static_cast<double>(l.t_ns)) / 1e9));
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
