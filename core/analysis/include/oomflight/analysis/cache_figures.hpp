// What PyTorch's caching allocator held at a failure (issue 41, item 4): cached but free bytes in each pool and the
// largest free block, from the allocator state a rank's archive holds at its freeze (/state_segments,
// /state_blocks). torch's own OOM message gives one figure ("reserved by PyTorch but unallocated"); which pool it
// sits in, in how many blocks, and whether any one of them could have held the request is what tells fragmentation
// from a device that is simply full (pytorch #29554).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight {

/// One pool's figures at the freeze. Bytes.
struct PoolFigures {
  std::uint64_t reserved = 0;      ///< in this pool's segments
  std::uint64_t free = 0;          ///< in its inactive blocks (cached, not allocated, not waiting on a stream)
  std::uint64_t free_blocks = 0;   ///< how many
  std::uint64_t largest_free = 0;  ///< the largest inactive block
};

/// Both pools: the small one (blocks of 1 MiB and less, in 2 MiB segments) and the large one.
struct CacheFigures {
  PoolFigures small;
  PoolFigures large;
  std::uint64_t free() const { return small.free + large.free; }
};

/// The figures of one rank's state at its freeze. A segment's pool is its segment_type, or for unknown (archives of
/// 0.2.0, some live states) PyTorch's sizing rule: a 2 MiB segment that is not expandable is small. Free is what no
/// block that is allocated or waiting on a stream covers (a snapshot lists its inactive blocks; the live tracker and
/// the simulator list only the others), and each run of it is one free block (torch coalesces free neighbours).
/// Blocks outside every segment are ignored. nullopt when the rank's archive holds no state (its source gave none).
OOMFLIGHT_API std::optional<CacheFigures> cache_figures(std::span<const StateSegmentRow> segments,
                                                        std::span<const StateBlockRow> blocks);

/// The sentence a report prints under an OOM origin, e.g. "the cache at the failure: 646.22 MiB reserved but free
/// (large pool 640.00 MiB in 3 blocks, the largest 512.00 MiB; small pool 6.22 MiB in 20 blocks, the largest
/// 1.50 MiB); no free block holds the request of 998.05 MiB, though 646.22 MiB is free in all: fragmentation". The
/// verdict compares the request with the largest free block of its pool (a request of at most 1 MiB is the small
/// pool's), then with the free bytes of both pools together.
/// `requested`: the failing request in bytes (0: unknown; then no verdict). Plain text.
OOMFLIGHT_API std::string cache_at_failure_text(const CacheFigures& cache, std::uint64_t requested);

}  // namespace oomflight
