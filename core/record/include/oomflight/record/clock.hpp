// Clocks used for event timestamps and for the anchors that put all ranks on one time axis.
#pragma once

#include <cstdint>
#include <ctime>

namespace oomflight {

/// CLOCK_MONOTONIC in nanoseconds. Thread-safe; no allocation; a vDSO call on Linux (no system call).
inline std::int64_t monotonic_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// CLOCK_REALTIME (UTC, since the Unix epoch) in nanoseconds. Thread-safe.
inline std::int64_t realtime_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace oomflight
