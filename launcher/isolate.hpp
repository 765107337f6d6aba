// Runs a command's work on untrusted files in a child process, so that a crash there is an error message.
#pragma once

#include <functional>
#include <string>

namespace oomflight::cli {

/// Forks; the child runs `work` and exits with its return value (flushing stdout and stderr first); the parent
/// waits and returns that value. When the child dies of a signal (HDF5's own parser is not hardened against
/// damaged files: a flipped byte in an object header can make H5Dopen write out of bounds, before any check of
/// ours can run), prints "oomflight error: WHAT: ..." naming the signal and returns 1. Without fork (it failed),
/// runs `work` in this process. Call it from a single-threaded process (the launcher's commands are).
int run_isolated(const std::string& what, const std::function<int()>& work);

}  // namespace oomflight::cli
