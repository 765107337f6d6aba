#include "oomflight/analysis/memory_levels.hpp"

#include <limits>
#include <unordered_map>

namespace oomflight {
namespace {

__extension__ typedef __int128 Wide;

std::int64_t saturated(Wide v) {
  constexpr Wide lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  return static_cast<std::int64_t>(v < lo ? lo : v > hi ? hi : v);
}

}  // namespace

std::vector<MemoryLevel> memory_levels(const Archive& archive, const RankRow& row) {
  const auto events = archive.events_of(row);
  std::vector<MemoryLevel> levels;
  levels.reserve(events.size());
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // block address -> size
  // 128-bit: sizes below 2^64 summed over fewer than 2^63 events cannot overflow it, so only the result saturates.
  Wide allocated = 0, reserved = 0;
  for (const Event& e : events) {
    switch (e.action) {
      case Action::alloc:
        allocated += e.size;
        live[e.addr] = e.size;
        break;
      case Action::free_completed:
        if (const auto it = live.find(e.addr); it != live.end()) {
          allocated -= it->second;
          live.erase(it);
        } else {
          allocated -= e.size;
        }
        break;
      case Action::segment_alloc:
      case Action::segment_map: reserved += e.size; break;
      case Action::segment_free:
      case Action::segment_unmap: reserved -= e.size; break;
      default: break;
    }
    levels.push_back(MemoryLevel{e.t_ns, saturated(allocated), saturated(reserved)});
  }
  return levels;
}

}  // namespace oomflight
