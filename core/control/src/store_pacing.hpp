// How often a joined rank asks the job's store (store_protocol.hpp) while it waits: bounded for the whole job, not
// only for one rank, because every request of every rank lands on one server.
//
// The server is the job's TCPStore: one thread (libuv) in rank 0's process or torchrun's agent, which also serves the
// job's own rendezvous and barriers. Measured on this project's 2-core machine (torch 2.11, `check` from 1 and 2
// client processes: bench/store_server_cost.py, docs/performance.md): 20 - 60 us of that thread a request. A fixed
// 10 ms poll costs 100 requests a second a rank: 51,200 a second at 512 ranks, one to two cores of the host that
// serves the job's store, idle. PyTorch's own dump signal (ProcessGroupNCCL's heartbeat monitor) checks the store
// once a second a rank.
//
// So the ranks together ask at most kIdleRequestsPerSecond times a second while idle, and kWaitRequestsPerSecond
// times a second while they wait for one another during a dump; a rank never polls faster than the configured floor
// (OOMFLIGHT_POLL_INTERVAL when idle, 5 ms in a dump). Up to 20 ranks idle and 25 in a dump that is the floor
// itself; at 512 ranks a trigger reaches an idle rank within 256 ms (where the store path's serial merge of every rank's file is the larger
// cost: docs/scale.md).
#pragma once

#include <algorithm>
#include <chrono>

namespace oomflight {

struct StorePacing {
  std::chrono::milliseconds idle;  ///< between an idle watcher's looks for a dump (and for the hellos at start)
  std::chrono::milliseconds wait;  ///< between a waiting rank's looks (two requests) for others' keys in a dump
};

inline constexpr int kIdleRequestsPerSecond = 2000;
inline constexpr int kWaitRequestsPerSecond = 10000;
inline constexpr std::chrono::milliseconds kWaitPollFloor{5};

/// The pacing of a rank of a job of `world_size` ranks (>= 1) whose idle floor is `poll_interval` (> 0). Pure.
inline StorePacing store_pacing(std::chrono::milliseconds poll_interval, int world_size) {
  const auto spread = [&](int per_second) {
    // world_size / per_second seconds, in ms, rounded up: the ranks together stay at or below per_second.
    return std::chrono::milliseconds((static_cast<long long>(world_size) * 1000 + per_second - 1) / per_second);
  };
  // A wait poll makes up to two requests (every_rank_answered: the files' count, then the leavers'); an idle one.
  return {std::max(poll_interval, spread(kIdleRequestsPerSecond)),
          std::max(kWaitPollFloor, spread(kWaitRequestsPerSecond / 2))};
}

}  // namespace oomflight
