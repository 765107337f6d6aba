// Selecting a snapshot window's events (snapshot_events.hpp).
#include "snapshot_events.hpp"

#include <algorithm>
#include <unordered_map>

namespace oomflight {

std::vector<Event> snapshot_events(const std::vector<Event>& events, std::int64_t first, std::int64_t last) {
  // Live at the window's start: replay the ring up to it, keyed by address (blocks and segments apart).
  std::unordered_map<std::uint64_t, std::size_t> blocks, segments;
  std::size_t start = 0;
  for (; start < events.size() && events[start].batch < first; ++start) {
    const Event& e = events[start];
    switch (e.action) {
      case Action::alloc: blocks[e.addr] = start; break;
      case Action::free_completed: blocks.erase(e.addr); break;
      case Action::segment_alloc: segments[e.addr] = start; break;
      case Action::segment_free: segments.erase(e.addr); break;
      default: break;
    }
  }
  std::vector<std::size_t> live;
  live.reserve(blocks.size() + segments.size());
  for (const auto& [addr, at] : blocks) live.push_back(at);
  for (const auto& [addr, at] : segments) live.push_back(at);
  std::sort(live.begin(), live.end());
  std::vector<Event> out;
  out.reserve(live.size() + (events.size() - start));
  for (const std::size_t at : live) out.push_back(events[at]);
  for (std::size_t i = start; i < events.size(); ++i) {
    if (events[i].batch >= first && events[i].batch <= last) out.push_back(events[i]);
  }
  return out;
}

std::vector<Collective> snapshot_collectives(const std::vector<Collective>& records, std::int64_t first,
                                             std::int64_t last) {
  std::vector<Collective> out;
  for (const Collective& c : records) {
    if (c.batch >= first && c.batch <= last) out.push_back(c);
  }
  return out;
}

}  // namespace oomflight
