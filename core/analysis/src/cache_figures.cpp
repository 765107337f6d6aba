// What the caching allocator held at a failure (cache_figures.hpp).
#include "oomflight/analysis/cache_figures.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t kSmallSegment = 2ull << 20;  // kSmallBuffer: the small pool's segments
constexpr std::uint64_t kSmallBlock = 1ull << 20;    // kSmallSize: the small pool's largest block

bool is_small(const StateSegmentRow& s) {
  if (s.segment_type == SegmentType::small) return true;
  if (s.segment_type == SegmentType::large) return false;
  return s.total_size == kSmallSegment && s.is_expandable == 0;
}

std::string pool_text(const char* name, const PoolFigures& p) {
  if (p.reserved == 0) return fmt::format("{} pool empty", name);
  if (p.free == 0) return fmt::format("{} pool nothing free of {}", name, format_bytes(p.reserved));
  return fmt::format("{} pool {} in {} {}, the largest {}", name, format_bytes(p.free), p.free_blocks,
                     p.free_blocks == 1 ? "block" : "blocks", format_bytes(p.largest_free));
}

}  // namespace

std::optional<CacheFigures> cache_figures(std::span<const StateSegmentRow> segments,
                                          std::span<const StateBlockRow> blocks) {
  if (segments.empty()) return std::nullopt;
  // Free space is what no allocated block (nor one waiting on a stream) covers: a snapshot lists its inactive blocks,
  // the live tracker and the simulator only the others. torch coalesces free neighbours, so each run of it is one
  // free block.
  std::map<std::uint64_t, std::uint64_t> taken;  // address -> size, of the blocks that are not free
  for (const StateBlockRow& b : blocks) {
    if (b.state != BlockState::inactive && b.size != 0) taken[b.address] = std::max(taken[b.address], b.size);
  }
  // In address order, each segment walked from where the last one ended: segments of a real state never overlap,
  // and a damaged file's that do cost no more than one walk over the blocks (near-linear, whatever the rows).
  std::vector<const StateSegmentRow*> ordered;
  ordered.reserve(segments.size());
  for (const StateSegmentRow& s : segments) ordered.push_back(&s);
  std::sort(ordered.begin(), ordered.end(),
            [](const StateSegmentRow* x, const StateSegmentRow* y) { return x->address < y->address; });
  CacheFigures c;
  std::uint64_t walked_to = 0;
  for (const StateSegmentRow* segment : ordered) {
    const StateSegmentRow& s = *segment;
    PoolFigures& p = is_small(s) ? c.small : c.large;
    p.reserved += s.total_size;
    const std::uint64_t end = s.address + s.total_size < s.address ? UINT64_MAX : s.address + s.total_size;
    if (end <= walked_to) continue;
    std::uint64_t cursor = std::max(s.address, walked_to);
    walked_to = end;
    const auto run = [&](std::uint64_t to) {
      if (to <= cursor) return;
      p.free += to - cursor;
      ++p.free_blocks;
      p.largest_free = std::max(p.largest_free, to - cursor);
    };
    for (auto it = taken.lower_bound(cursor); it != taken.end() && it->first < end; ++it) {
      run(it->first);
      const std::uint64_t block_end = it->first + it->second < it->first ? UINT64_MAX : it->first + it->second;
      cursor = std::max(cursor, std::min(block_end, end));
    }
    run(end);
  }
  return c;
}

std::string cache_at_failure_text(const CacheFigures& cache, std::uint64_t requested) {
  std::string out = fmt::format("the cache at the failure: {} reserved but free ({}; {})", format_bytes(cache.free()),
                                pool_text("large", cache.large), pool_text("small", cache.small));
  if (requested == 0) return out;
  // A request of at most 1 MiB is a block of the small pool (round_size keeps it at most 1 MiB), any other the large.
  const bool small = requested <= kSmallBlock;
  const PoolFigures& pool = small ? cache.small : cache.large;
  const char* name = small ? "small" : "large";
  if (pool.largest_free >= requested) {
    out += fmt::format(
        "; a free block of the {} pool ({}) is as large as the request of {}: the allocator did not take it (it is "
        "another stream's, max_split_size_mb keeps it for larger requests, or it was freed after the failure)",
        name, format_bytes(pool.largest_free), format_bytes(requested));
  } else if (cache.free() >= requested) {
    out += fmt::format("; no free block holds the request of {}, though {} is free in all: fragmentation",
                       format_bytes(requested), format_bytes(cache.free()));
  } else {
    out += fmt::format("; no free block holds the request of {}, nor would all the cache's free bytes together",
                       format_bytes(requested));
  }
  return out;
}

}  // namespace oomflight
