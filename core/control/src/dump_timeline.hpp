// Where one dump's time goes on this rank, step by step, as wall time and as the watcher thread's own CPU time
// (internal to the control wing). The dump logs it at debug level as one line; bench/scale.py reads that line from
// every rank to split a dump's cost into what grows with the world size, with the bytes, or stays constant
// (docs/scale.md). Wall time on the rank that lays the archive out is the critical path: each step between the
// ranks ends there only when the slowest rank has reached it. CPU time is this rank's own work in the step, which
// on a cluster runs in parallel with the other ranks' (on the 2 cores of a test machine it does not).
#pragma once

#include <ctime>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "oomflight/record/clock.hpp"

namespace oomflight {

class DumpTimeline {
 public:
  /// Starts the first step now.
  DumpTimeline() : start_ns_(monotonic_ns()), last_wall_ns_(start_ns_), last_cpu_ns_(thread_cpu_ns()) {}

  /// When the first step started (monotonic_ns(): comparable between the ranks of one host only).
  std::int64_t start_ns() const { return start_ns_; }

  /// Ends the step under way as `name` (a string literal) and starts the next. Not thread-safe: the watcher's.
  void mark(const char* name) {
    const std::int64_t wall = monotonic_ns(), cpu = thread_cpu_ns();
    steps_.push_back({name, wall - last_wall_ns_, cpu - last_cpu_ns_});
    last_wall_ns_ = wall;
    last_cpu_ns_ = cpu;
  }

  /// "triggers 0.02/0.02, safety copy 1.51/1.20, ...": each step's wall / CPU milliseconds, in order.
  std::string text() const {
    std::string out;
    for (const Step& s : steps_) {
      out += fmt::format("{}{} {:.3f}/{:.3f}", out.empty() ? "" : ", ", s.name, static_cast<double>(s.wall_ns) / 1e6,
                         static_cast<double>(s.cpu_ns) / 1e6);
    }
    return out;
  }

 private:
  struct Step {
    const char* name;
    std::int64_t wall_ns, cpu_ns;
  };
  // CPU time of the calling thread (Linux: CLOCK_THREAD_CPUTIME_ID, tens of ns per read).
  static std::int64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  }
  std::int64_t start_ns_, last_wall_ns_, last_cpu_ns_;
  std::vector<Step> steps_;
};

}  // namespace oomflight
