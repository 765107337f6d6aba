// A process that may not write files past a size (RLIMIT_FSIZE, `ulimit -f`) gets SIGXFSZ when a write crosses
// it, and SIGXFSZ's default action kills the process. A dump must never kill the job it records, so while an
// archive is written the signal is ignored, and the write fails with EFBIG instead: the writer reports it, the
// file is removed, and the rank-local copy written earlier stays the history.
#pragma once

#include <string>

namespace oomflight::format_detail {

/// Ignores SIGXFSZ for its lifetime when the process leaves it at the default action (a handler the job
/// installed is left alone). Nestable and usable from several threads at once: the first guard changes the
/// action, the last one restores it. The action is process-wide, so a job thread that crosses the limit while
/// a dump is written gets EFBIG too, instead of dying.
class IgnoreFileSizeSignal {
 public:
  IgnoreFileSizeSignal();
  ~IgnoreFileSizeSignal();
  IgnoreFileSizeSignal(const IgnoreFileSizeSignal&) = delete;
  IgnoreFileSizeSignal& operator=(const IgnoreFileSizeSignal&) = delete;
};

/// "" when the process may write files of any size; else "; this process may not write files over N bytes
/// (RLIMIT_FSIZE, ulimit -f)", to append to a write error.
std::string file_size_limit_note();

}  // namespace oomflight::format_detail
