// Child-process isolation for readers of untrusted files (see isolate.hpp).
#include "isolate.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>

#include "commands.hpp"

namespace oomflight::cli {

int run_isolated(const std::string& what, const std::function<int()>& work) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) return work();
  if (child == 0) {
    int rc = kExitFailure;
    try {
      rc = work();
    } catch (...) {
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      print_error(fmt::format("{}: lost track of the reader process: {}", what, std::strerror(errno)));
      return kExitFailure;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  if (sig == SIGPIPE) {
    // Not the reader: whoever read our output went away (`oomflight report A.h5 | head`). End as a filter does,
    // quietly and by the same signal, so the shell sees what happened.
    std::signal(SIGPIPE, SIG_DFL);
    std::raise(SIGPIPE);
    return 128 + SIGPIPE;
  }
  print_error(fmt::format("{}: reading it crashed the HDF5 library ({}): the file is damaged, or not an oomflight "
                          "archive",
                          what, sig ? strsignal(sig) : "unknown status"));
  return kExitFailure;
}

}  // namespace oomflight::cli
