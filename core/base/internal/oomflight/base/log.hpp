// The process's oomflight log (internal to liboomflight: spdlog never appears in an installed header; plugins and
// the launcher write through oomflight_log() in the C API).
//
// One format for every line, set once the rank is known: "oomflight[rank 2] warning: ..." (before that, and in
// commands that are not a rank: "oomflight error: ..."). Lines go to stderr, so that the job's stdout stays the
// job's, and are flushed at once (a dying job must not lose its last words).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace oomflight {

/// Severity, lowest first. The numeric values are the C API's OOMFLIGHT_LOG_* values.
enum class LogLevel { trace = 0, debug = 1, info = 2, warn = 3, error = 4, off = 5 };

/// The logger (created on first use). Thread-safe.
spdlog::logger& log();

/// Sets the level by name: trace, debug, info, warn, error or off. Unknown names mean info. Thread-safe.
void set_log_level(std::string_view level);

/// From now on every line names this rank: "oomflight[rank N] level: message". Thread-safe.
void set_log_rank(int rank);

/// Writes one line at `level` (off writes nothing). Every message is made printable (printable.hpp): a control
/// character or line feed in it shows as an escape, so no line of the log is forged and no terminal obeys it.
/// Thread-safe.
void log_message(LogLevel level, std::string_view message);

}  // namespace oomflight
