// The Chrome trace of an archive: see perfetto.hpp. JSON through nlohmann-json, which escapes every string the
// archive holds (a hostile file cannot break the document).
#include "oomflight/export/perfetto.hpp"
#include "oomflight/export/origin_words.hpp"

#include <algorithm>
#include <vector>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "oomflight/analysis/collectives.hpp"
#include "oomflight/analysis/memory_levels.hpp"

namespace oomflight {
namespace {

using nlohmann::json;

// UTC ns of a rank's monotonic time, wrapping rather than overflowing on hostile anchors.
std::int64_t utc_ns(const RankRow& r, std::int64_t t_ns) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(t_ns) - static_cast<std::uint64_t>(r.anchor_monotonic_ns) +
                                   static_cast<std::uint64_t>(r.anchor_realtime_ns));
}

// Microseconds from `origin_ns`, as a double: Perfetto keeps sub-microsecond precision from the fraction.
double us_since(std::int64_t ns, std::int64_t origin_ns) {
  return static_cast<double>(static_cast<std::uint64_t>(ns) - static_cast<std::uint64_t>(origin_ns)) / 1000.0;
}

// Per rank: the allocated and reserved bytes after each event, from the history, anchored on the archive's own
// figures. The history's sums are the requests (an alloc's size), the figures the allocator's (block sizes,
// segments the history may not hold): they differ by a few KB a batch, and a history that starts mid-job misses
// what came before. So each batch's counters are shifted to end on that batch's row of /batches (its figures when
// it ended), the last ones on the rank's figures at the trigger, and a counter at each of those marks states the
// figures exactly. Never below zero.
struct Gauge {
  std::int64_t t_ns;
  std::uint64_t allocated, reserved;
};

std::vector<Gauge> gauges(const Archive& a, const RankRow& row) {
  // 128-bit shifts: a damaged file's figures are arbitrary, and signed 64-bit overflow would be undefined.
  __extension__ typedef __int128 Wide;
  struct Raw {
    std::int64_t t_ns;
    Wide allocated, reserved;
  };
  std::vector<Raw> raw;
  for (const MemoryLevel& l : memory_levels(a, row)) {
    // A counter track needs a point where a figure changes only.
    if (!raw.empty() && raw.back().allocated == l.allocated && raw.back().reserved == l.reserved) continue;
    raw.push_back(Raw{l.t_ns, l.allocated, l.reserved});
  }
  // The marks, oldest first: every batch that ended (its figures then), and the trigger (the rank's figures).
  struct Mark {
    std::int64_t t_ns;
    std::uint64_t allocated, reserved;
  };
  std::vector<Mark> marks;
  for (const BatchRow& b : a.batches_of(row.rank)) {
    if (b.end_t_ns != 0) marks.push_back(Mark{b.end_t_ns, b.allocated_bytes, b.reserved_bytes});
  }
  std::stable_sort(marks.begin(), marks.end(), [](const Mark& x, const Mark& y) { return x.t_ns < y.t_ns; });
  const std::int64_t last_t = raw.empty() ? row.freeze_t_ns : std::max(raw.back().t_ns, row.freeze_t_ns);
  while (!marks.empty() && marks.back().t_ns > last_t) marks.pop_back();  // a damaged file's times
  marks.push_back(Mark{last_t, row.allocated_bytes, row.reserved_bytes});
  const auto clamp = [](Wide v) {
    return v < 0 ? std::uint64_t{0} : v > static_cast<Wide>(~std::uint64_t{0}) ? ~std::uint64_t{0} : static_cast<std::uint64_t>(v);
  };
  std::vector<Gauge> out;
  out.reserve(raw.size() + marks.size());
  std::size_t i = 0;
  for (const Mark& m : marks) {
    // The history's sums at the mark: those of its last event at or before it.
    const std::size_t first = i;
    while (i < raw.size() && raw[i].t_ns <= m.t_ns) ++i;
    if (i == first && out.empty() && raw.empty()) {
      out.push_back(Gauge{m.t_ns, m.allocated, m.reserved});
      continue;
    }
    const Wide at_a = i > 0 ? raw[i - 1].allocated : 0, at_r = i > 0 ? raw[i - 1].reserved : 0;
    const Wide shift_a = static_cast<Wide>(m.allocated) - at_a, shift_r = static_cast<Wide>(m.reserved) - at_r;
    for (std::size_t k = first; k < i; ++k) {
      out.push_back(Gauge{raw[k].t_ns, clamp(raw[k].allocated + shift_a), clamp(raw[k].reserved + shift_r)});
    }
    out.push_back(Gauge{m.t_ns, m.allocated, m.reserved});
  }
  return out;
}

}  // namespace

std::string render_perfetto(const Archive& a) {
  std::int64_t origin = std::numeric_limits<std::int64_t>::max();
  for (const RankRow& row : a.ranks) {
    const auto events = a.events_of(row);
    if (!events.empty()) origin = std::min(origin, utc_ns(row, events.front().t_ns));
    for (const BatchRow& b : a.batches_of(row.rank)) origin = std::min(origin, utc_ns(row, b.start_t_ns));
  }
  if (origin == std::numeric_limits<std::int64_t>::max()) origin = 0;
  const CollectiveAnalysis collectives = analyze_collectives(a);
  json trace = json::array();
  for (const RankRow& row : a.ranks) {
    const int pid = row.rank;
    std::string name = fmt::format("rank {}", row.rank);
    if (row.is_origin) name += fmt::format(" ({})", origin_mark(a.header.kind));
    trace.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
    trace.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", row.rank}}}});
    trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0},
                     {"args", {{"name", fmt::format("batches (device {})", row.device)}}}});
    for (const Gauge& g : gauges(a, row)) {
      trace.push_back({{"ph", "C"}, {"name", "memory"}, {"pid", pid}, {"ts", us_since(utc_ns(row, g.t_ns), origin)},
                       {"args", {{"allocated", g.allocated}, {"reserved", g.reserved}}}});
    }
    const auto events = a.events_of(row);
    const std::int64_t freeze = row.freeze_t_ns != 0 ? row.freeze_t_ns : (events.empty() ? 0 : events.back().t_ns);
    const auto batches = a.batches_of(row.rank);
    if (!batches.empty()) {
      for (const BatchRow& b : batches) {
        const std::int64_t end = b.end_t_ns != 0 ? b.end_t_ns : std::max(freeze, b.start_t_ns);
        trace.push_back({{"ph", "X"}, {"name", fmt::format("batch {}", b.batch)}, {"pid", pid}, {"tid", 0},
                         {"ts", us_since(utc_ns(row, b.start_t_ns), origin)},
                         {"dur", static_cast<double>(static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(b.start_t_ns)) / 1000.0},
                         {"args", {{"peak_allocated", b.peak_allocated_bytes}, {"peak_reserved", b.peak_reserved_bytes},
                                   {"running_at_freeze", b.end_t_ns == 0}}}});
      }
    } else {
      // Older archives: the step markers delimit the batches.
      for (std::size_t i = 0; i < events.size(); ++i) {
        if (events[i].action != Action::step) continue;
        std::size_t j = i + 1;
        while (j < events.size() && events[j].action != Action::step) ++j;
        const std::int64_t end = j < events.size() ? events[j].t_ns : std::max(freeze, events[i].t_ns);
        trace.push_back({{"ph", "X"}, {"name", fmt::format("batch {}", events[i].batch)}, {"pid", pid}, {"tid", 0},
                         {"ts", us_since(utc_ns(row, events[i].t_ns), origin)},
                         {"dur", static_cast<double>(static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(events[i].t_ns)) / 1000.0}});
      }
    }
    // Collectives on their own track: a slice from start to end, or to the freeze for one still in flight (the
    // rank waits in it), named as the report names it.
    const RankCollectiveState* rank_ops = collectives.rank_state(row.rank);
    if (rank_ops != nullptr && !rank_ops->operations.empty()) {
      trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 1},
                       {"args", {{"name", "collectives"}}}});
      for (const RankOperation& op : rank_ops->operations) {
        if (op.start_t_ns == 0 && op.end_t_ns == 0) continue;  // untracked, its start overwritten: no time known
        const std::int64_t start = op.start_t_ns != 0 ? op.start_t_ns : op.end_t_ns;
        const std::int64_t end = op.finished() ? op.end_t_ns : std::max(freeze, start);
        const CommunicatorVerdict* verdict = collectives.communicator(op.comm_id);  // O(log): per operation
        const std::string comm = verdict != nullptr ? communicator_label(*verdict) : std::string();
        trace.push_back(
            {{"ph", "X"}, {"name", fmt::format("{} #{}", collective_op_name(op.op), op.seq)}, {"pid", pid}, {"tid", 1},
             {"ts", us_since(utc_ns(row, start), origin)},
             {"dur", static_cast<double>(static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(start)) / 1000.0},
             {"args", {{"communicator", comm}, {"comm_id", op.comm_id}, {"seq", op.seq}, {"bytes", op.bytes},
                       {"count", op.count}, {"datatype", data_type_name(op.datatype)}, {"peer", op.peer},
                       {"batch", op.batch}, {"in_flight_at_freeze", !op.finished() && !op.untracked},
                       {"end_seen", op.untracked        ? "untracked"
                                    : !op.finished()    ? "none"
                                    : op.device_completion ? "device"
                                                           : "host"}}}});
      }
    }
    for (const Event& e : events) {
      if (e.action != Action::oom) continue;
      trace.push_back({{"ph", "i"}, {"s", "p"}, {"name", "out of memory"}, {"pid", pid}, {"tid", 0},
                       {"ts", us_since(utc_ns(row, e.t_ns), origin)},
                       {"args", {{"requested_bytes", e.size}, {"device_free_bytes", e.addr}, {"batch", e.batch},
                                 {"reason", fixed_string(row.reason)}}}});
    }
  }
  json doc = {{"traceEvents", std::move(trace)},
              {"displayTimeUnit", "ms"},
              {"otherData", {{"run_name", a.header.run_name}, {"kind", a.header.kind},
                             {"created_at_utc", a.header.created_at_utc}, {"reason", a.header.reason},
                             {"time_origin_utc_ns", origin}, {"producer", a.header.producer}}}};
  // Invalid UTF-8 from a damaged file is replaced, not thrown on.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace oomflight
