// The node's peer processes, watched for their end (peer_processes.hpp).
#include "peer_processes.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace oomflight {
namespace {

int open_pidfd(std::int64_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0u);
  if (fd >= 0) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);  // pidfds are close-on-exec already; be sure
  return fd >= 0 ? static_cast<int>(fd) : -1;
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// What /proc/PID/stat says of a process: gone (no file, or zombie / dead), or its start time (clock ticks since
// boot, field 22). The command name (field 2) is in parentheses and may hold anything, spaces and ')' included:
// the fields are counted from the last ')'.
struct ProcState {
  bool readable = false;
  bool ended = false;
  std::uint64_t start_time = 0;
};

ProcState read_proc_stat(std::int64_t pid) {
  ProcState s;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    s.readable = errno == ENOENT;  // no such process: it ended (and was reaped)
    s.ended = s.readable;
    return s;
  }
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) {
    s.readable = n == 0 || errno == ESRCH;  // the process went while we read
    s.ended = s.readable;
    return s;
  }
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') return s;
  const char* p = close_paren + 2;  // field 3, the state
  const char state = *p;
  int field = 3;
  while (*p != '\0' && field < 22) {
    if (*p++ == ' ') ++field;
  }
  if (field != 22) return s;
  s.readable = true;
  s.ended = state == 'Z' || state == 'X' || state == 'x';
  s.start_time = std::strtoull(p, nullptr, 10);
  return s;
}

}  // namespace

PeerProcesses::PeerProcesses(const std::vector<Peer>& peers, Way way) {
  watched_.reserve(peers.size());
  for (const Peer& peer : peers) {
    if (peer.pid <= 0 || peer.pid == static_cast<std::int64_t>(::getpid())) continue;
    Watched w;
    w.rank = peer.rank;
    w.pid = peer.pid;
    if (way == Way::pidfd) {
      w.pidfd = open_pidfd(peer.pid);
    } else {
      errno = ENOSYS;
    }
    if (w.pidfd < 0) {
      if (errno == ESRCH) {
        w.gone_at_start = true;  // ended before we looked: reported by the first newly_ended()
      } else {
        const ProcState s = read_proc_stat(peer.pid);
        if (!s.readable) continue;  // cannot be watched: its end is learnt as across nodes
        w.gone_at_start = s.ended;
        w.start_time = s.start_time;
      }
    }
    watched_.push_back(w);
  }
}

PeerProcesses::~PeerProcesses() {
  for (const Watched& w : watched_) {
    if (w.pidfd >= 0) ::close(w.pidfd);
  }
}

std::vector<int> PeerProcesses::newly_ended() {
  std::vector<int> ended;
  for (Watched& w : watched_) {
    if (w.ended) continue;
    bool now_ended = false;
    if (w.gone_at_start) {
      now_ended = true;
    } else if (w.pidfd >= 0) {
      pollfd p{w.pidfd, POLLIN, 0};
      now_ended = ::poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    } else {
      const ProcState s = read_proc_stat(w.pid);
      now_ended = s.readable && (s.ended || s.start_time != w.start_time);
    }
    if (now_ended) {
      w.ended = true;
      if (w.pidfd >= 0) {
        ::close(w.pidfd);
        w.pidfd = -1;
      }
      ended.push_back(w.rank);
    }
  }
  return ended;
}

std::size_t PeerProcesses::watched() const {
  std::size_t n = 0;
  for (const Watched& w : watched_) n += w.ended ? 0 : 1;
  return n;
}

NamespaceId own_namespace(const char* kind) {
  struct stat ns {};
  if (::stat((std::string("/proc/self/ns/") + kind).c_str(), &ns) != 0) return {};
  return {static_cast<std::uint64_t>(ns.st_dev), static_cast<std::uint64_t>(ns.st_ino)};
}

std::string NamespaceId::text() const {
  return ino == 0 ? std::string() : std::to_string(dev) + ":" + std::to_string(ino);
}

}  // namespace oomflight
