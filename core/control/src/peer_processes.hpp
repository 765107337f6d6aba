// The processes of the other ranks on this node, watched for their end (internal to the control wing).
//
// A rank that ends through os._exit, SIGKILL, a segfault or any signal's default action says nothing to the others:
// no LEFT message (leave_agreement.hpp), no DONE, no vote. Its peers used to learn of it only at
// OOMFLIGHT_DUMP_TIMEOUT (in their leave agreement, in a dump's vote), and a survivor's MPI_Finalize could wait for
// it for good (issue 29: a survivor exited 113 s after its last step). On one node the kernel says so at once: a
// pidfd (pidfd_open(2), Linux 5.3) polls readable once its process has ended, zombie or reaped, and it names that
// very process (a pid reused later is another process). Where pidfd_open is refused (an older kernel, a seccomp
// filter), /proc/PID/stat is read instead: the process has ended when the file is gone, its state is Z (zombie) or
// X (dead), or its start time is not the one read at start-up (the pid was reused).
//
// Only processes of this process's pid namespace are watched (a pid means nothing in another one); ranks on other
// nodes cannot be watched this way at all: their end is learnt from LEFT, or at the deadline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oomflight {

class PeerProcesses {
 public:
  struct Peer {
    int rank = -1;
    std::int64_t pid = 0;
  };

  /// How a process is watched: a pidfd where the kernel gives one (else /proc), or /proc alone (for tests).
  enum class Way { pidfd, proc };

  PeerProcesses() = default;
  /// Starts watching `peers` (other ranks' processes in this pid namespace). Never fails: a process that cannot be
  /// watched (gone already is "ended", a pid that cannot be read is not watched) is left out. Throws std::bad_alloc.
  explicit PeerProcesses(const std::vector<Peer>& peers, Way way = Way::pidfd);
  ~PeerProcesses();
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;

  /// The ranks whose process ended since the last call, each reported once. Never blocks (a poll(2) with no
  /// timeout, or a read of /proc). One caller at a time; async-signal-safe it is not.
  std::vector<int> newly_ended();

  /// How many processes are watched (and not yet reported ended).
  std::size_t watched() const;

 private:
  struct Watched {
    int rank = -1;
    std::int64_t pid = 0;
    int pidfd = -1;                   // -1: /proc is read instead
    std::uint64_t start_time = 0;     // /proc/PID/stat field 22, for the /proc way
    bool gone_at_start = false;       // it had ended before the watch began
    bool ended = false;               // reported by newly_ended()
  };
  std::vector<Watched> watched_;
};

/// A Linux namespace of this process (/proc/self/ns/<kind>: device and inode), so that ranks can tell which of
/// their node's peers share it: the pid namespace (whose processes a rank can watch) and the network one (whose
/// abstract sockets, the doorbells, a rank can reach). {0, 0} when it cannot be read.
struct NamespaceId {
  std::uint64_t dev = 0, ino = 0;
  bool operator==(const NamespaceId&) const = default;
  /// "dev:ino", or "" when unknown (never equal to another's). For a store's value.
  std::string text() const;
};
/// `kind`: "pid" or "net". Never throws.
NamespaceId own_namespace(const char* kind);

}  // namespace oomflight
