// Post-mortem analysis: per-rank summaries, the live allocations of each origin, which origin failed first.
#include "oomflight/analysis/post_mortem.hpp"

#include "oomflight/analysis/archive_diff.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

// Wrapping arithmetic: a damaged archive's anchors can be anything, and signed overflow would be undefined.
std::int64_t to_utc(const RankRow& row, std::int64_t t_ns) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(t_ns) - static_cast<std::uint64_t>(row.anchor_monotonic_ns) +
                                   static_cast<std::uint64_t>(row.anchor_realtime_ns));
}

// A call site's identity across ranks: its frames' text (each rank interns its own stack ids and strings).
std::string site_key(const Archive& a, std::int32_t stack_id) { return call_site_key(a, stack_id); }

// The blocks of a rank's history still live at its freeze: allocated in it and not freed (free_completed), at their
// recorded size. The one walk every live figure of the post-mortem comes from.
std::unordered_map<std::uint64_t, LiveAllocation> live_allocations(const Archive& a, const RankRow& row) {
  std::unordered_map<std::uint64_t, LiveAllocation> live;
  for (const Event& e : a.events_of(row)) {
    if (e.action == Action::alloc) {
      live[e.addr] = LiveAllocation{e.addr, e.size, e.batch, e.t_ns, e.stack_id};
    } else if (e.action == Action::free_completed) {
      live.erase(e.addr);
    }
  }
  return live;
}

// Live bytes by call site key, for one rank.
std::unordered_map<std::string, std::uint64_t> live_by_site(const Archive& a, const RankRow& row) {
  std::unordered_map<std::string, std::uint64_t> out;
  for (const auto& [stack, bytes] : live_bytes_by_stack(a, row)) out[site_key(a, stack)] += bytes;
  return out;
}

std::uint64_t median(std::vector<std::uint64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

RankSummary summarize(const Archive& a, const RankRow& row, bool origin, std::size_t top) {
  RankSummary s;
  s.row = row;
  s.limit_is_cap = row.memory_cap_bytes != 0 &&
                   (row.device_capacity_bytes == 0 || row.memory_cap_bytes < row.device_capacity_bytes);
  s.limit_bytes = s.limit_is_cap ? row.memory_cap_bytes : row.device_capacity_bytes;
  // Against the device's capacity, what the process holds outside the allocator (NVML; issue 42) is not the
  // allocator's to take either; a cap bounds the allocator's reserved alone.
  const std::uint64_t outside =
      !s.limit_is_cap && row.outside_allocator_bytes > 0 ? static_cast<std::uint64_t>(row.outside_allocator_bytes) : 0;
  if (s.limit_bytes > row.reserved_bytes + outside && row.reserved_bytes + outside >= row.reserved_bytes) {
    s.headroom_bytes = s.limit_bytes - row.reserved_bytes - outside;
  }
  for (const Event& e : a.events_of(row)) {
    const auto action = static_cast<std::size_t>(e.action);
    if (action < static_cast<std::size_t>(kActionCount)) ++s.action_counts[action];
    if (e.action == Action::oom) s.oom_utc_ns = to_utc(row, e.t_ns);
  }
  const std::unordered_map<std::uint64_t, LiveAllocation> live = live_allocations(a, row);
  for (const auto& [addr, l] : live) s.live_bytes_in_history += l.size;
  s.live_count = live.size();
  if (origin && row.is_origin) s.cache = cache_figures(a.state_segments_of(row.rank), a.state_blocks_of(row.rank));
  s.peak_reserved_trend = peak_reserved_trend(a.batches_of(row.rank), s.limit_bytes);
  s.growing = growing_call_sites(a, row, top);
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
      if (l.batch < 0) ++c.before_first_batch;
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

std::unordered_map<std::int32_t, std::uint64_t> live_bytes_by_stack(const Archive& a, const RankRow& row) {
  std::unordered_map<std::int32_t, std::uint64_t> by_stack;
  for (const auto& [addr, l] : live_allocations(a, row)) by_stack[l.stack_id] += l.size;
  return by_stack;
}

PostMortem analyze(const Archive& archive, std::size_t top) {
  PostMortem pm;
  pm.origins.assign(archive.header.origin_ranks.begin(), archive.header.origin_ranks.end());
  std::vector<RankRow> rows = archive.ranks;
  std::sort(rows.begin(), rows.end(), [](const RankRow& x, const RankRow& y) { return x.rank < y.rank; });
  for (const auto& row : rows) {
    if (pm.largest_rank < 0 || row.allocated_bytes > archive.rank_row(pm.largest_rank)->allocated_bytes) {
      pm.largest_rank = row.rank;
    }
  }
  std::int64_t first = 0;
  for (const auto& row : rows) {
    const bool origin = std::find(pm.origins.begin(), pm.origins.end(), row.rank) != pm.origins.end();
    // Without an origin (a snapshot, an import), the rank holding the most is the one to look into.
    const bool focus = origin || (pm.origins.empty() && row.rank == pm.largest_rank);
    pm.ranks.push_back(summarize(archive, row, focus, top));
    const auto& s = pm.ranks.back();
    if (origin && s.oom_utc_ns != 0 && (pm.first_origin < 0 || s.oom_utc_ns < first)) {
      pm.first_origin = row.rank;
      first = s.oom_utc_ns;
    }
  }
  if (pm.first_origin < 0 && !pm.origins.empty()) pm.first_origin = pm.origins.front();
  // Each origin against its peers, call site by call site: an outlier (a longer sequence, an imbalanced stage)
  // holds more than the median peer somewhere; a job at the edge everywhere does not.
  std::vector<std::unordered_map<std::string, std::uint64_t>> peers;
  std::vector<std::uint64_t> peer_totals;
  for (const auto& s : pm.ranks) {
    if (std::find(pm.origins.begin(), pm.origins.end(), s.row.rank) != pm.origins.end()) continue;
    peers.push_back(live_by_site(archive, s.row));
    peer_totals.push_back(s.live_bytes_in_history);
  }
  if (peers.empty()) return pm;
  for (auto& s : pm.ranks) {
    if (std::find(pm.origins.begin(), pm.origins.end(), s.row.rank) == pm.origins.end()) continue;
    s.peers_median_live_bytes = median(peer_totals);
    // The origin's own sites, with a stack id to show frames by.
    std::unordered_map<std::string, CallSiteDiff> diffs;
    for (const auto& [addr, l] : live_allocations(archive, s.row)) {
      CallSiteDiff& d = diffs[site_key(archive, l.stack_id)];
      d.stack_id = l.stack_id;
      d.origin_bytes += l.size;
    }
    for (auto& [key, d] : diffs) {
      std::vector<std::uint64_t> on_peers;
      for (const auto& p : peers) {
        const auto it = p.find(key);
        on_peers.push_back(it == p.end() ? 0 : it->second);
      }
      d.peers_median_bytes = median(on_peers);
      if (d.origin_bytes > d.peers_median_bytes) s.against_peers.push_back(d);
    }
    std::sort(s.against_peers.begin(), s.against_peers.end(), [](const CallSiteDiff& x, const CallSiteDiff& y) {
      const auto ex = x.origin_bytes - x.peers_median_bytes, ey = y.origin_bytes - y.peers_median_bytes;
      return ex != ey ? ex > ey : x.stack_id < y.stack_id;
    });
    if (s.against_peers.size() > top) s.against_peers.resize(top);
  }
  return pm;
}

AgainstPeers judge_against_peers(const RankSummary& s) {
  const std::uint64_t mine = s.live_bytes_in_history, median = s.peers_median_live_bytes;
  if (mine == 0 && median == 0) return AgainstPeers::nothing_live;
  if (mine <= median) return AgainstPeers::at_most_peers;
  // More than 1.1 x the median, in integers (a tenth rounded down); the sum cannot overflow: a tenth of the
  // median is added only when mine exceeds the median, so the sum is below 1.1 x 2^64 only in theory: saturate.
  const std::uint64_t tenth = median / 10;
  const std::uint64_t bound = median > UINT64_MAX - tenth ? UINT64_MAX : median + tenth;
  return mine > bound ? AgainstPeers::outlier : AgainstPeers::within_a_tenth;
}

const char* against_peers_words(AgainstPeers judgement) {
  switch (judgement) {
    case AgainstPeers::outlier: return "an outlier";
    case AgainstPeers::within_a_tenth: return "not an outlier; within a tenth of its median peer";
    case AgainstPeers::at_most_peers: return "not an outlier; its median peer held as much or more";
    case AgainstPeers::nothing_live: return "not an outlier; neither it nor its median peer held live memory in the "
                                            "recorded history";
  }
  return "";
}

std::string device_figures_text(const RankSummary& s, bool at_failure) {
  const RankRow& r = s.row;
  const std::string capacity = r.device_capacity_bytes ? format_bytes(r.device_capacity_bytes) : "unknown";
  std::string text = r.device_free_bytes == 0 && !at_failure
                         ? fmt::format("device capacity {} (its free memory was not published)", capacity)
                         : fmt::format("device free {} of {}", format_bytes(r.device_free_bytes), capacity);
  if (s.limit_is_cap) {
    text += fmt::format("; this process may use {}{} (its per-process cap, torch's memory fraction)",
                        format_bytes(r.memory_cap_bytes), r.device_capacity_bytes ? " of it" : "");
  }
  std::vector<const char*> read;
  if (r.numbers_from_message & kFromMessageRequested) read.push_back("the request");
  if (r.numbers_from_message & kFromMessageDevice) read.push_back("the device's figures");
  if (r.numbers_from_message & kFromMessageCap) read.push_back("the cap");
  if (!read.empty()) {
    text += fmt::format(" ({} as the error's message states {}: no allocator hook saw the failure)",
                        fmt::join(read, ", "), read.size() == 1 ? "it" : "them");
  }
  return text;
}

}  // namespace oomflight
