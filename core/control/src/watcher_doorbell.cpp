// The watcher's doorbell: an autobound abstract datagram socket (unix(7)), with a condition variable as fallback.
#include "oomflight/control/watcher_doorbell.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

namespace oomflight {
namespace {

sockaddr_un to_sockaddr(const DoorbellAddress& a, socklen_t& length) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, a.name, a.length);
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + a.length);
  return sa;
}

}  // namespace

WatcherDoorbell::WatcherDoorbell() {
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  // Binding with the family alone asks the kernel for a unique abstract name: five hex digits after a '\0'. No
  // file is created, so nothing is left behind when the process dies, and no other job's name can collide.
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  socklen_t length = sizeof(sa);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa_family_t)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &length) != 0) {
    ::close(fd);
    return;
  }
  const auto name_length = static_cast<std::size_t>(length) - offsetof(sockaddr_un, sun_path);
  if (name_length == 0 || name_length > sizeof(address_.name)) {
    ::close(fd);
    return;
  }
  fd_ = fd;
  address_.length = static_cast<std::uint8_t>(name_length);
  std::memcpy(address_.name, sa.sun_path, name_length);
}

WatcherDoorbell::~WatcherDoorbell() {
  if (fd_ >= 0) ::close(fd_);
}

void WatcherDoorbell::ring() {
  if (fd_ >= 0) {
    ring(address_);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    rung_ = true;
  }
  rung_cv_.notify_one();
}

void WatcherDoorbell::ring(const DoorbellAddress& peer) const {
  if (fd_ < 0 || peer.length == 0 || peer.length > sizeof(peer.name)) return;
  socklen_t length = 0;
  const sockaddr_un sa = to_sockaddr(peer, length);
  const char byte = 0;
  // EAGAIN: the peer's queue is full, so it is rung already; ECONNREFUSED: it is gone. Neither matters.
  (void)::sendto(fd_, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&sa), length);
}

WatcherDoorbell::Rings WatcherDoorbell::wait(std::chrono::milliseconds timeout) {
  Rings rings;
  if (fd_ < 0) {
    std::unique_lock lock(mutex_);
    rings.self = rung_cv_.wait_for(lock, timeout, [&] { return rung_; });
    rung_ = false;
    return rings;
  }
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return rings;  // the timeout, or EINTR
  char buffer[16];
  for (;;) {
    sockaddr_un from{};
    socklen_t length = sizeof(from);
    if (::recvfrom(fd_, buffer, sizeof(buffer), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &length) < 0) break;
    const auto name_length = static_cast<std::size_t>(length) - std::min<std::size_t>(length, offsetof(sockaddr_un, sun_path));
    const bool mine = name_length == address_.length && std::memcmp(from.sun_path, address_.name, name_length) == 0;
    (mine ? rings.self : rings.other) = true;
  }
  return rings;
}

}  // namespace oomflight
