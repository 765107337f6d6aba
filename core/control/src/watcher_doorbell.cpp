// The watcher's doorbell: an autobound abstract datagram socket (unix(7)), with a condition variable as fallback.
#include "oomflight/control/watcher_doorbell.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

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

std::string doorbell_text(const DoorbellAddress& address) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  for (std::size_t i = 0; i < address.length && i < sizeof(address.name); ++i) {
    const auto byte = static_cast<unsigned char>(address.name[i]);
    text += kHex[byte >> 4];
    text += kHex[byte & 15];
  }
  return text;
}

std::optional<DoorbellAddress> doorbell_from_text(std::string_view text) {
  DoorbellAddress address;
  if (text.size() % 2 != 0 || text.size() / 2 > sizeof(address.name)) return std::nullopt;
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < text.size(); i += 2) {
    const int high = digit(text[i]), low = digit(text[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    address.name[i / 2] = static_cast<char>(high * 16 + low);
  }
  address.length = static_cast<std::uint8_t>(text.size() / 2);
  return address;
}

WatcherDoorbell::WatcherDoorbell() {
  // Rings of this process go through an eventfd of their own: through the socket, they would share its send
  // buffer with the rings sent to peers, which peers that never read (a dead rank whose socket a forked child
  // keeps open) could fill, and a local wake-up would then be lost.
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return;  // the condition variable, and no socket either (wait() would not watch it)
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
  if (event_fd_ >= 0) ::close(event_fd_);
}

void WatcherDoorbell::ring() {
  if (event_fd_ >= 0) {
    const std::uint64_t one = 1;
    (void)::write(event_fd_, &one, sizeof(one));  // EAGAIN only when the counter is full: rung already
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
  if (event_fd_ < 0) {
    std::unique_lock lock(mutex_);
    rings.self = rung_cv_.wait_for(lock, timeout, [&] { return rung_; });
    rung_ = false;
    return rings;
  }
  pollfd p[2] = {{event_fd_, POLLIN, 0}, {fd_, POLLIN, 0}};
  if (::poll(p, fd_ >= 0 ? 2 : 1, static_cast<int>(timeout.count())) <= 0) return rings;  // the timeout, or EINTR
  std::uint64_t count = 0;
  rings.self = ::read(event_fd_, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count));
  // The socket's queue is short (net.unix.max_dgram_qlen, 10 by default); a bound anyway, against a flood.
  char buffer[16];
  for (int i = 0; fd_ >= 0 && i < 64 && ::recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT) >= 0; ++i) rings.other = true;
  return rings;
}

}  // namespace oomflight
