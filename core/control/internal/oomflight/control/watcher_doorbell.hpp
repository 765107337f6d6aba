// The watcher's doorbell (internal to the control wing): how a watcher thread sleeps between polls, and how it is
// woken at once, by its own process (a local request, a snapshot, shutdown) or by a rank on the same node (a dump
// trigger).
//
// Why: MPI has no way to wake a thread that is not inside an MPI call short of spinning in one, and a watcher that
// spins takes a core from training. So the watcher sleeps OOMFLIGHT_POLL_INTERVAL (10 ms) between MPI_Tests, and a
// trigger waited up to that long on every rank before it was seen; the vote waits for the slowest rank, so a dump
// of R ranks paid close to a whole interval before any rank wrote. The doorbell is a Linux datagram socket with an
// abstract, kernel-chosen name (autobind, unix(7)): the watcher sleeps in poll() on it, and whoever rings it sends
// one byte. Ranks on one node learn each other's names once (an MPI_Allgather over MPI_COMM_TYPE_SHARED), so an
// origin rings every watcher of its node right after posting its triggers. Ranks on other nodes still see theirs
// at the next poll; the ring only ever shortens a sleep, it carries no meaning: a ring from anyone else (or a lost
// one) costs one early poll, never a wrong dump.
//
// Rings from this process go through an eventfd, so that they never depend on the socket's send buffer. Where
// the eventfd or the socket cannot be had (no file descriptor left, a sandbox without AF_UNIX), the doorbell falls
// back to a condition variable or to the eventfd alone: rings from this process still wake it; rings from other
// ranks do nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace oomflight {

/// A doorbell's address: the abstract socket name (sun_path bytes, starting with '\0') and its length. Plain bytes,
/// so that it travels in MPI messages. `length == 0`: no doorbell (ringing it does nothing).
struct DoorbellAddress {
  std::uint8_t length = 0;
  char name[15] = {};
};

/// The address as text, for a value in the job's store (the store transport's hello): hex of its name bytes; ""
/// for none.
std::string doorbell_text(const DoorbellAddress& address);

/// The address that doorbell_text wrote; nullopt when `text` is not one (odd length, not hex, too long), an empty
/// address for "".
std::optional<DoorbellAddress> doorbell_from_text(std::string_view text);

class WatcherDoorbell {
 public:
  /// Creates the socket (non-blocking, close-on-exec) and lets the kernel name it. Never throws: on failure the
  /// doorbell works within this process only (see above).
  WatcherDoorbell();
  ~WatcherDoorbell();
  WatcherDoorbell(const WatcherDoorbell&) = delete;
  WatcherDoorbell& operator=(const WatcherDoorbell&) = delete;

  /// This doorbell's address, for other processes of the node; empty when it has no socket.
  const DoorbellAddress& address() const { return address_; }

  /// Wakes this doorbell's wait() now, or makes its next one return at once. Thread-safe; async-signal-safe when
  /// the doorbell has its eventfd (one write(2)).
  void ring();

  /// Wakes the doorbell at `peer` (another process on this node). Best effort, never blocks: a full queue means
  /// it is already rung. Thread-safe.
  void ring(const DoorbellAddress& peer) const;

  /// Who rang during a wait().
  struct Rings {
    bool self = false;   // this process (ring())
    bool other = false;  // another process: a rank of this node that sent a trigger, or anyone else
  };

  /// Sleeps until rung or until `timeout` passes, and clears the rings. For the one thread that owns the doorbell
  /// (the watcher).
  Rings wait(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;        // the socket: rings from other processes
  int event_fd_ = -1;  // an eventfd: rings from this process
  DoorbellAddress address_;
  // The fallback without a socket.
  std::mutex mutex_;
  std::condition_variable rung_cv_;
  bool rung_ = false;
};

}  // namespace oomflight
