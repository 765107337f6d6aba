// The SIGUSR1 flag (dump_signal.hpp).
#include "dump_signal.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/record/clock.hpp"

namespace oomflight {

DumpRequest signal_request(DumpKind kind) {
  DumpRequest r;
  r.kind = kind;
  r.reason = kind == DumpKind::exit ? "SIGTERM received: the job is being torn down" : "SIGUSR1 received";
  return r;
}
namespace {

std::atomic<int> g_requested{0};
std::atomic<int> g_exit{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch a lock-free atomic");

extern "C" void on_dump_signal(int) { g_requested.store(1, std::memory_order_relaxed); }
extern "C" void on_exit_signal(int) { g_exit.store(1, std::memory_order_relaxed); }

bool ours(const struct sigaction& action, void (*handler)(int) = &on_dump_signal) {
  return (action.sa_flags & SA_SIGINFO) == 0 && action.sa_handler == handler;
}

// Puts `sig`'s default action back if `handler` is still the one installed.
void restore_default(int sig, void (*handler)(int)) {
  struct sigaction current {};
  if (sigaction(sig, nullptr, &current) != 0 || !ours(current, handler)) return;
  struct sigaction restore {};
  restore.sa_handler = SIG_DFL;
  sigemptyset(&restore.sa_mask);
  sigaction(sig, &restore, nullptr);
}

// A forked child (a DataLoader worker) inherits the handlers but not the watcher that acts on their flags: it would
// ignore SIGTERM (its parent's terminate() could not end it) and SIGUSR1. Its child-side fork handler puts the default
// back where the handler is still oomflight's.
extern "C" void restore_defaults_in_child() {
  restore_default(SIGUSR1, &on_dump_signal);
  restore_default(SIGTERM, &on_exit_signal);
}

void restore_defaults_at_fork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, &restore_defaults_in_child); });
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
  restore_defaults_at_fork();
  return sigaction(SIGUSR1, &handler, nullptr) == 0;
}

void uninstall_dump_signal() { restore_default(SIGUSR1, &on_dump_signal); }

bool take_dump_signal() { return g_requested.exchange(0, std::memory_order_relaxed) != 0; }

bool install_exit_signal() {
  struct sigaction current {};
  if (sigaction(SIGTERM, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction handler {};
  handler.sa_handler = &on_exit_signal;
  handler.sa_flags = SA_RESTART;
  sigemptyset(&handler.sa_mask);
  restore_defaults_at_fork();
  return sigaction(SIGTERM, &handler, nullptr) == 0;
}

void uninstall_exit_signal() { restore_default(SIGTERM, &on_exit_signal); }

bool take_exit_signal() { return g_exit.exchange(0, std::memory_order_relaxed) != 0; }

void end_with_sigterm() {
  struct sigaction restore {};
  restore.sa_handler = SIG_DFL;
  sigemptyset(&restore.sa_mask);
  sigaction(SIGTERM, &restore, nullptr);
  kill(getpid(), SIGTERM);
}

bool SignalDumpLimiter::allow(std::chrono::milliseconds interval) {
  const std::int64_t now = monotonic_ns();
  const std::int64_t interval_ns = static_cast<std::int64_t>(interval.count()) * 1'000'000;
  if (last_ns_ != 0 && now - last_ns_ < interval_ns) {
    if (skipped_++ == 0) {
      log().warn("SIGUSR1 {} after the last signal dump: skipped (OOMFLIGHT_SIGNAL_DUMP_INTERVAL={}); further "
                 "ones within it are skipped without a word",
                 format_seconds(static_cast<double>(now - last_ns_) / 1e9),
                 format_seconds(static_cast<double>(interval.count()) / 1e3));
    }
    return false;
  }
  if (skipped_ > 0) {
    log().info("{} SIGUSR1 skipped since the last signal dump", skipped_);
    skipped_ = 0;
  }
  last_ns_ = now;
  return true;
}

void end_by_sigterm_saying(const char* why) {
  log().info("SIGTERM: {}; ending the process as SIGTERM would", why);
  end_with_sigterm();
}

}  // namespace oomflight
