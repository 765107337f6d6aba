// Time helpers shared by the protocol's parts (internal to the control wing): deadlines in monotonic ns and the
// pause between two tests of a step between the ranks.
#pragma once

#include <chrono>
#include <cstdint>

#include "oomflight/record/clock.hpp"

namespace oomflight {

inline std::int64_t to_ns(std::chrono::milliseconds ms) { return static_cast<std::int64_t>(ms.count()) * 1'000'000; }

inline double seconds_since(std::int64_t start_ns) { return static_cast<double>(monotonic_ns() - start_ns) / 1e9; }

// How long a watcher sleeps between two tests of a step between the ranks, `waited_ns` into it. Most steps of a
// dump complete within a millisecond: 50 us polls then (4 ranks: 2 ms less per dump than 200 us). A step that
// takes longer waits for a slow rank or for the disk, and many ranks polling that often on few cores slow it
// down (64 ranks on 2 cores: 0.67 - 0.74 s per dump at 50 us, 0.44 - 0.45 s at 200 us): 200 us after that.
inline std::chrono::microseconds poll_pause(std::int64_t waited_ns) {
  return std::chrono::microseconds(waited_ns < 1'000'000 ? 50 : 200);
}

}  // namespace oomflight
