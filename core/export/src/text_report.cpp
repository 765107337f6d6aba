// The text report: a PostMortem rendered for a terminal.
#include "oomflight/export/text_report.hpp"
#include "oomflight/export/origin_words.hpp"
#include "oomflight/export/outside_words.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/analysis/collectives.hpp"
#include "oomflight/export/growth_lines.hpp"
#include "oomflight/base/printable.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/export/rank_context.hpp"
#include "oomflight/export/user_frames.hpp"
#include "oomflight/export/what_if_line.hpp"

namespace oomflight {
namespace {

// What the table marks an origin with: its failure, or its request.

std::string signed_bytes(std::uint64_t to, std::uint64_t from) {
  return to >= from ? "+" + format_bytes(to - from) : "-" + format_bytes(from - to);
}

// How each rank's own per-batch peak moved over the last `columns` batches any rank kept: the table that shows
// which rank drifts towards its limit before it fails. Empty when the archive has no per-batch rows.
std::string batch_peaks(const Archive& a, const PostMortem& pm, std::size_t columns) {
  std::vector<std::int64_t> batches;
  for (const auto& b : a.batches) batches.push_back(b.batch);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  if (batches.empty()) return {};
  const std::size_t total = batches.size();
  if (batches.size() > columns) batches.erase(batches.begin(), batches.end() - static_cast<std::ptrdiff_t>(columns));
  std::string out = fmt::format("per-batch peak allocated (each batch's own peak; the last {} of {} batches, * still "
                                "running at the dump; growth and share over the ended ones):\n",
                                batches.size(), total);
  out += fmt::format("  {:>4}", "rank");
  for (const auto b : batches) out += fmt::format(" {:>11}", b);
  out += fmt::format(" {:>11} {:>9}\n", "growth", "of limit");
  struct Growth {
    int rank;
    std::uint64_t from, to;
  };
  std::vector<Growth> growth;
  for (const auto& s : pm.ranks) {
    const auto rows = a.batches_of(s.row.rank);
    if (rows.empty()) continue;
    out += fmt::format("  {:>4}", s.row.rank);
    // Growth over the ended batches shown: a batch still running has only a partial peak (unless it is the
    // only one, or the rank's failing batch, where the partial peak is the point).
    const BatchRow* first = nullptr;
    const BatchRow* last = nullptr;
    for (const auto b : batches) {
      const auto it = std::find_if(rows.begin(), rows.end(), [&](const BatchRow& r) { return r.batch == b; });
      if (it == rows.end()) {
        out += fmt::format(" {:>11}", "-");
        continue;
      }
      const bool counts = it->end_t_ns != 0 || s.row.is_origin || last == nullptr;
      if (counts) {
        if (first == nullptr) first = &*it;
        last = &*it;
      }
      out += fmt::format(" {:>11}", format_bytes(it->peak_allocated_bytes) + (it->end_t_ns == 0 ? "*" : ""));
    }
    if (first != nullptr) {
      growth.push_back({s.row.rank, first->peak_allocated_bytes, last->peak_allocated_bytes});
      // Against the process's cap when it has one (the allocator fails there), else the device's capacity.
      const std::uint64_t limit = s.limit_is_cap ? s.limit_bytes : last->device_capacity_bytes;
      const std::string share = limit ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(last->peak_allocated_bytes) /
                                                                   static_cast<double>(limit))
                                      : "?";
      out += fmt::format(" {:>11} {:>9}", signed_bytes(last->peak_allocated_bytes, first->peak_allocated_bytes), share);
    }
    out += s.row.is_origin ? std::string("  <- ") + origin_mark(a.header.kind) + "\n" : "\n";
  }
  if (growth.size() > 1 && batches.size() > 1) {
    const auto grew = [](const Growth& g) {
      return static_cast<double>(g.to) - static_cast<double>(g.from);
    };
    std::sort(growth.begin(), growth.end(), [&](const Growth& x, const Growth& y) { return grew(x) > grew(y); });
    const Growth& most = growth.front();
    const Growth& median = growth[growth.size() / 2];
    if (most.to > most.from) {
      out += fmt::format("  rank {}'s peak grew the most over batches {} to {}: {} (the median rank: {})\n",
                         most.rank, batches.front(), batches.back(), signed_bytes(most.to, most.from),
                         signed_bytes(median.to, median.from));
    } else {
      out += fmt::format("  no rank's peak grew over batches {} to {}\n", batches.front(), batches.back());
    }
  }
  return out;
}

// The metadata a rank's job set (the newest value of each key, in the order first set) and where it ran: one
// or two lines, for the ranks the report is about. Empty when the archive has no /context for the rank.
std::string context_lines(const Archive& a, int rank) {
  const RankContext context = rank_context(a, rank);
  const auto& metadata = context.metadata;
  const std::string& host = context.host;
  const std::string& command = context.command;
  std::string out;
  if (!metadata.empty()) {
    std::string pairs;
    for (const auto& [k, v] : metadata) {
      pairs += fmt::format("{}{}={}", pairs.empty() ? "" : ", ", printable(k), printable(v));
    }
    out += fmt::format("    metadata: {}\n", pairs);
  }
  if (!command.empty()) out += fmt::format("    ran on {}: {}\n", printable(host), printable(command.substr(0, 200)));
  return out;
}

// Which collective each rank was in at the freeze, and per communicator the one line that says who never arrived.
// Empty for an archive without collectives.
std::string collectives_text(const Archive& a) {
  const CollectiveAnalysis c = analyze_collectives(a);
  if (c.empty()) return {};
  std::string out = "collectives at the freeze:\n";
  for (const CommunicatorVerdict& v : c.communicators) {
    const auto lines = describe_verdict(a, c, v);
    if (lines.empty()) {
      out += fmt::format("  all {} ranks of {} finished {} #{}; none was inside an operation on it\n", v.members.size(),
                         communicator_label(v), collective_op_name(v.op), v.seq);
      continue;
    }
    for (std::size_t i = 0; i < lines.size(); ++i) out += fmt::format("  {}{}\n", i == 0 ? "" : "  ", lines[i]);
  }
  out += "  per rank (the operation in flight at the freeze, else the last finished):\n";
  for (const RankCollectiveState& s : c.ranks) {
    if (s.last_entered >= 0 && s.operations[static_cast<std::size_t>(s.last_entered)].untracked) {
      // The newest operation it entered was not followed to its end: name it, never call an older one "the one it
      // is in" (2,000 starts with a pool of 1,024 were reported as "waits in allreduce #1023", issue 30).
      const RankOperation& op = s.operations[static_cast<std::size_t>(s.last_entered)];
      std::string text = fmt::format("    rank {}: last entered {} in batch {}", s.rank, describe_operation(op), op.batch);
      if (op.start_t_ns != 0) {
        text += fmt::format(", {} before the freeze",
                            format_seconds(seconds_between(op.start_t_ns, s.freeze_t_ns)));
      }
      text += "; whether it finished is not known (untracked)";
      if (s.in_flight >= 0) {
        text += fmt::format("; the newest tracked operation without an end: {}",
                            describe_operation(s.operations[static_cast<std::size_t>(s.in_flight)]));
      }
      out += text + (s.is_origin ? " (the origin)\n" : "\n");
    } else if (s.in_flight >= 0) {
      const RankOperation& op = s.operations[static_cast<std::size_t>(s.in_flight)];
      out += fmt::format("    rank {}: in {}, entered in batch {}, {} before the freeze\n", s.rank, describe_operation(op),
                         op.batch, format_seconds(seconds_between(op.start_t_ns, s.freeze_t_ns)));
    } else if (s.last_finished >= 0) {
      // The newest operation it entered that has an end (not the end that came last: a device end follows the host
      // ends of the operations enqueued behind it), and whether the device may still be running it.
      const RankOperation& op = s.operations[static_cast<std::size_t>(s.last_finished)];
      out += fmt::format("    rank {}: in none; last finished {}, {} before the freeze{}\n", s.rank,
                         describe_last_finished(s, op.comm_id),
                         format_seconds(seconds_between(op.end_t_ns, s.freeze_t_ns)),
                         s.is_origin ? " (the origin)" : "");
    } else {
      out += fmt::format("    rank {}: none recorded{}\n", s.rank, s.is_origin ? " (the origin)" : "");
    }
    if (s.untracked > 0) {
      out += fmt::format("      {} of its operations untracked: not followed to their end\n", s.untracked);
    }
  }
  return out;
}


// Each rank's trend of its per-batch peak reserved bytes, and when it reaches the rank's limit at that rate (issue
// 42, item 2). Empty when no rank has 3 ended batches.
std::string trends_text(const PostMortem& pm) {
  std::string out;
  for (const auto& s : pm.ranks) {
    if (const std::string t = peak_trend_text(s); !t.empty()) out += fmt::format("  rank {}: {}\n", s.row.rank, t);
  }
  return out.empty() ? out
                     : "trend of each rank's peak reserved (least squares over its last ended batches, at most 64):\n" +
                           out;
}

// The call sites whose live bytes grew batch after batch (issue 42, item 3). Empty when none does.
std::string growing_text(const Archive& a, const PostMortem& pm, std::size_t frames) {
  std::string out;
  for (const auto& s : pm.ranks) {
    for (const GrowingSite& g : s.growing) {
      out += fmt::format("  rank {}: {}{}\n", s.row.rank, growing_site_text(g),
                         g.stack_id == kNoStack || a.stack(g.stack_id).empty() ? " (no stack recorded)" : "");
      out += frame_lines(a, g.stack_id, frames, "        ");
    }
  }
  return out.empty() ? out
                     : "call sites whose live bytes grew batch after batch (never fell, rose in at least two of three "
                       "batches):\n" + out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

}  // namespace

std::string render_report(const Archive& a, const PostMortem& pm, std::size_t frames) {
  const auto& h = a.header;
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(fmt::format("oomflight report: {}", printable(a.path)));
  line(fmt::format("run {}, kind {}, written {} by {} (schema {})", printable(h.run_name), printable(h.kind),
                   printable(h.created_at_utc), printable(h.producer), h.schema_version));
  line(fmt::format("world size {}, ranks present {} ({} of {})", h.world_size, fmt::join(h.ranks_present, ","),
                   h.ranks_present.size(), h.world_size));
  if (h.window_first_batch >= 0) {
    line(fmt::format("window: batches {} to {} (the events of these batches, after the allocator state at the "
                     "start of batch {})",
                     h.window_first_batch, h.window_last_batch, h.window_first_batch));
  }
  if (h.snapshot_windows_skipped.value_or(0) > 0) {
    line(fmt::format("skipped: {} earlier snapshot {} (writes were slower than the windows; at most 2 wait per rank)",
                     *h.snapshot_windows_skipped, *h.snapshot_windows_skipped == 1 ? "window" : "windows"));
  }
  line("");
  if (pm.origins.empty()) {
    line(h.kind == "snapshot" ? "origin: none (a scheduled snapshot)" : "origin: none recorded");
  } else {
    line(fmt::format("origin: {}{}", ranks_text(pm.origins),
                     pm.origins.size() > 1 ? fmt::format(" (rank {} failed first)", pm.first_origin) : ""));
  }
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin) continue;
    if (h.kind != "oom") {
      line(fmt::format("  rank {} at batch {}: {}; {}", s.row.rank, s.row.batch, origin_deed(printable(h.kind)),
                       device_figures_text(s, false)));
      const std::string reason = printable(fixed_string(s.row.reason));
      if (!reason.empty()) line(fmt::format("    {}", reason));
      out += context_lines(a, s.row.rank);
      continue;
    }
    line(fmt::format("  rank {} at batch {}: requested {}, {}", s.row.rank, s.row.batch,
                     format_bytes(s.row.oom_requested_bytes), device_figures_text(s)));
    const std::string reason = printable(fixed_string(s.row.reason));
    if (!reason.empty()) line(fmt::format("    {}", reason));
    if (s.cache) line(fmt::format("    {}", cache_at_failure_text(*s.cache, s.row.oom_requested_bytes)));
    if (const std::string what_if = expandable_what_if_text(a, s); !what_if.empty()) line("    " + what_if);
    out += context_lines(a, s.row.rank);
  }
  line("");
  line("per rank at the trigger:");
  line(fmt::format("  {:>4} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>11}", "rank", "batch",
                   "allocated", "reserved", "outside", "peak alloc", "peak resv", "limit", "headroom", "events",
                   "overwritten"));
  for (const auto& s : pm.ranks) {
    const auto& r = s.row;
    line(fmt::format("  {:>4} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>11}{}", r.rank, r.batch,
                     format_bytes(r.allocated_bytes), format_bytes(r.reserved_bytes), outside_cell(r),
                     format_bytes(r.peak_allocated_bytes), format_bytes(r.peak_reserved_bytes),
                     s.limit_bytes ? format_bytes(s.limit_bytes) + (s.limit_is_cap ? " cap" : "") : "?",
                     s.limit_bytes ? format_bytes(s.headroom_bytes) : "?", r.event_count, r.overwritten,
                     r.is_origin ? std::string("  <- ") + origin_mark(a.header.kind) : ""));
  }
  // "outside": the memory outside the caching allocator (NVML's count of the process less its reserved).
  for (const std::string& said : {outside_standout_line(pm), outside_unknown_line(pm)}) {
    if (!said.empty()) line("  " + said);
  }
  if (const std::string peaks = batch_peaks(a, pm, 8); !peaks.empty()) {
    line("");
    out += peaks;
  }
  if (const std::string trends = trends_text(pm); !trends.empty()) {
    line("");
    out += trends;
  }
  if (const std::string growing = growing_text(a, pm, frames); !growing.empty()) {
    line("");
    out += growing;
  }
  if (const std::string collectives = collectives_text(a); !collectives.empty()) {
    line("");
    out += collectives;
  }
  if (pm.origins.empty() && pm.largest_rank >= 0) {
    const RankRow* r = a.rank_row(pm.largest_rank);
    line("");
    line(fmt::format("the rank holding the most: rank {}, {} allocated and {} reserved at the dump (peak {} allocated)",
                     r->rank, format_bytes(r->allocated_bytes), format_bytes(r->reserved_bytes),
                     format_bytes(r->peak_allocated_bytes)));
  }
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin && !(pm.origins.empty() && s.row.rank == pm.largest_rank)) continue;
    line("");
    line(fmt::format("live memory on rank {} by call site (of {} live blocks, {} in the recorded history; {} "
                     "allocated in all):",
                     s.row.rank, s.live_count, format_bytes(s.live_bytes_in_history),
                     format_bytes(s.row.allocated_bytes)));
    if (s.row.allocated_bytes > s.live_bytes_in_history) {
      // The history counts each block at its request; PyTorch's allocated counts the rounded block.
      line(fmt::format("  ({} more allocated than the history's live blocks hold: blocks allocated before it began, "
                       "or the allocator's rounding)",
                       format_bytes(s.row.allocated_bytes - s.live_bytes_in_history)));
    }
    // By call site: identical stacks merged, so ten 100 MiB blocks of one line read as one line.
    for (std::size_t i = 0; i < s.call_sites.size(); ++i) {
      const CallSite& c = s.call_sites[i];
      const std::string what =
          c.blocks == 1 ? fmt::format("1 block of {}", format_bytes(c.bytes))
          : c.smallest == c.largest
              ? fmt::format("{} blocks x {} = {}", c.blocks, format_bytes(c.largest), format_bytes(c.bytes))
              : fmt::format("{} blocks, {} in all, {} to {}", c.blocks, format_bytes(c.bytes), format_bytes(c.smallest),
                            format_bytes(c.largest));
      const auto shown = frames_to_show(a, c.stack_id, frames);
      const std::string before =
          c.before_first_batch == 0 ? std::string()
          : c.before_first_batch == c.blocks
              ? std::string(", allocated before the first batch")
              : fmt::format(", {} of them allocated before the first batch", c.before_first_batch);
      const char* no_frames = c.stack_id == kNoStack || a.stack(c.stack_id).empty()
                                  ? " (no stack recorded)"
                              : shown.empty() ? " (only the allocator's own frames recorded)"
                                              : "";
      line(fmt::format("  {:>2}. {}{}{}", i + 1, what, before, no_frames));
      out += frame_lines(a, c.stack_id, frames, "        ");
    }
  }
  for (const auto& s : pm.ranks) {
    if (!s.row.is_origin || pm.ranks.size() < 2) continue;
    std::size_t peer_count = 0;
    for (const auto& p : pm.ranks) peer_count += p.row.is_origin ? 0 : 1;
    if (peer_count == 0) continue;
    line("");
    line(fmt::format("rank {} against its {} peers: {} live in the recorded history, the median peer {} ({}): {}",
                     s.row.rank, peer_count, format_bytes(s.live_bytes_in_history),
                     format_bytes(s.peers_median_live_bytes),
                     signed_bytes(s.live_bytes_in_history, s.peers_median_live_bytes),
                     against_peers_words(judge_against_peers(s))));
    for (std::size_t i = 0; i < s.against_peers.size() && i < 5; ++i) {
      const CallSiteDiff& d = s.against_peers[i];
      const auto shown = frames_to_show(a, d.stack_id, 1);
      const std::string where = shown.empty() ? std::string("(no stack recorded)")
                                              : fmt::format("{} ({}:{})",
                                                            printable(a.string(shown[0]->function).substr(0, 80)),
                                                            printable(a.string(shown[0]->file)), shown[0]->line);
      line(fmt::format("  {:>11} at {}: {} against {} on the median peer",
                       signed_bytes(d.origin_bytes, d.peers_median_bytes), where, format_bytes(d.origin_bytes),
                       format_bytes(d.peers_median_bytes)));
    }
    // A smaller device, not more memory, is the other way to fail first.
    std::vector<std::uint64_t> capacities;
    for (const auto& p : pm.ranks) {
      if (!p.row.is_origin && p.row.device_capacity_bytes) capacities.push_back(p.row.device_capacity_bytes);
    }
    std::sort(capacities.begin(), capacities.end());
    if (!capacities.empty() && s.row.device_capacity_bytes &&
        s.row.device_capacity_bytes != capacities[capacities.size() / 2]) {
      line(fmt::format("  its device holds {}, the median peer's {}", format_bytes(s.row.device_capacity_bytes),
                       format_bytes(capacities[capacities.size() / 2])));
    }
  }
  line("");
  line("other ranks against their capacity:");
  for (const auto& s : pm.ranks) {
    if (s.row.is_origin) continue;
    const auto& r = s.row;
    if (s.limit_bytes == 0) {
      line(fmt::format("  rank {}: {} reserved, capacity unknown", r.rank, format_bytes(r.reserved_bytes)));
      continue;
    }
    // The headroom is less what the process holds outside the allocator against the device (RankSummary): said.
    const std::string outside = !s.limit_is_cap && r.outside_allocator_bytes > 0
                                    ? fmt::format(" and {} outside the allocator", outside_cell(r))
                                    : std::string();
    line(fmt::format("  rank {}: {} reserved{} of {}{} ({:.1f}%), {} headroom; peak reserved {}", r.rank,
                     format_bytes(r.reserved_bytes), outside, format_bytes(s.limit_bytes),
                     s.limit_is_cap ? (r.device_capacity_bytes ? fmt::format(" (its cap; the device holds {})",
                                                                             format_bytes(r.device_capacity_bytes))
                                                               : std::string(" (its cap)"))
                                    : std::string(),
                     100.0 * static_cast<double>(r.reserved_bytes) / static_cast<double>(s.limit_bytes),
                     format_bytes(s.headroom_bytes), format_bytes(r.peak_reserved_bytes)));
  }
  // Each string from the archive was made printable where it was placed; this pass is the guarantee for any that a
  // later change forgets (a forgotten one can still end its line early, but never acts on the terminal).
  return printable(out, LineFeeds::keep);
}

}  // namespace oomflight
