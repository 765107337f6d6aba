// Post-mortem analysis: per-rank summaries, the live allocations of each origin, which origin failed first.
#include "oomflight/analysis/post_mortem.hpp"

#include <algorithm>
#include <unordered_map>

namespace oomflight {
namespace {

// Wrapping arithmetic: a damaged archive's anchors can be anything, and signed overflow would be undefined.
std::int64_t to_utc(const RankRow& row, std::int64_t t_ns) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(t_ns) - static_cast<std::uint64_t>(row.anchor_monotonic_ns) +
                                   static_cast<std::uint64_t>(row.anchor_realtime_ns));
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
    std::unordered_map<std::int32_t, CallSite> sites;
    for (const auto& [addr, l] : live) {
      CallSite& c = sites[l.stack_id];
      c.stack_id = l.stack_id;
      c.smallest = c.blocks == 0 ? l.size : std::min(c.smallest, l.size);
      ++c.blocks;
      c.bytes += l.size;
      c.largest = std::max(c.largest, l.size);
    }
    for (const auto& [id, c] : sites) s.call_sites.push_back(c);
    std::sort(s.call_sites.begin(), s.call_sites.end(), [](const CallSite& x, const CallSite& y) {
      return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack_id < y.stack_id;
    });
    if (s.call_sites.size() > top) s.call_sites.resize(top);
  }
  return s;
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

}  // namespace oomflight
