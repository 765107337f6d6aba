// The SIGUSR1 flag (dump_signal.hpp).
#include "dump_signal.hpp"

#include <signal.h>

#include <atomic>

namespace oomflight {
namespace {

std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch a lock-free atomic");

extern "C" void on_dump_signal(int) { g_requested.store(1, std::memory_order_relaxed); }

bool ours(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) == 0 && action.sa_handler == &on_dump_signal;
}

}  // namespace

bool install_dump_signal() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) != 0) return false;
  if (ours(current)) return true;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction handler {};
  handler.sa_handler = &on_dump_signal;
  handler.sa_flags = SA_RESTART;  // the job's interrupted system calls resume
  sigemptyset(&handler.sa_mask);
  return sigaction(SIGUSR1, &handler, nullptr) == 0;
}

void uninstall_dump_signal() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) != 0 || !ours(current)) return;
  struct sigaction restore {};
  restore.sa_handler = SIG_DFL;
  sigemptyset(&restore.sa_mask);
  sigaction(SIGUSR1, &restore, nullptr);
}

bool take_dump_signal() { return g_requested.exchange(0, std::memory_order_relaxed) != 0; }

}  // namespace oomflight
