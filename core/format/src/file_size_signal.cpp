// SIGXFSZ held at "ignore" while archives are written (file_size_signal.hpp).
#include "file_size_signal.hpp"

#include <signal.h>
#include <sys/resource.h>

#include <fmt/format.h>
#include <mutex>

namespace oomflight::format_detail {
namespace {

std::mutex g_mutex;
int g_guards = 0;          // guards alive
bool g_changed = false;    // whether the first guard set SIG_IGN (and the last must restore SIG_DFL)

}  // namespace

IgnoreFileSizeSignal::IgnoreFileSizeSignal() {
  const std::lock_guard lock(g_mutex);
  if (g_guards++ > 0) return;
  struct sigaction current {};
  if (sigaction(SIGXFSZ, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    g_changed = sigaction(SIGXFSZ, &ignore, nullptr) == 0;
  }
}

IgnoreFileSizeSignal::~IgnoreFileSizeSignal() {
  const std::lock_guard lock(g_mutex);
  if (--g_guards > 0 || !g_changed) return;
  g_changed = false;
  // Put the default back only if the action is still ours: a handler the job installed meanwhile stays.
  struct sigaction current {};
  if (sigaction(SIGXFSZ, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
      current.sa_handler == SIG_IGN) {
    struct sigaction restore {};
    restore.sa_handler = SIG_DFL;
    sigemptyset(&restore.sa_mask);
    sigaction(SIGXFSZ, &restore, nullptr);
  }
}

std::string file_size_limit_note() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return {};
  return fmt::format("; this process may not write files over {} bytes (RLIMIT_FSIZE, ulimit -f)",
                     static_cast<unsigned long long>(limit.rlim_cur));
}

}  // namespace oomflight::format_detail
