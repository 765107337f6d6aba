// Configuration from OOMFLIGHT_* environment variables, described once in a table (name, type, default,
// description) that parsing, validation, `oomflight config` and the README's table all come from.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/control/filename_template.hpp"

namespace oomflight {

/// Thrown for a bad value; the message names the variable and the value ("OOMFLIGHT_MAX_ENTRIES='abc': ...").
/// The longest OOMFLIGHT_RUN_NAME, bytes: it names a folder (a path component has at most 255 bytes, and file
/// names add their own), and rank 0 sends it to every rank in a 256-byte field. Longer names are refused, never cut.
inline constexpr std::size_t kMaxRunNameBytes = 200;

struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// The recorder's settings. Defaults are the table's (see option_table()).
struct OOMFLIGHT_API Config {
  bool enabled = true;
  std::string run_name;               ///< empty: generated once by rank 0 and shared with every rank
  std::size_t max_entries = 100000;   ///< ring bound, events per rank
  std::size_t max_batches = 10000;    ///< per-batch figures kept per rank (rows of /batches)
  /// The snapshot schedule (Composer's MemorySnapshot names): batches skipped before the first window, the
  /// window's length, and how often it repeats. Each is set only when its variable is; snapshots are on when any
  /// is (snapshot_window() gives the effective values).
  std::optional<std::int64_t> skip_batches;
  std::optional<std::int64_t> interval_batches;
  std::optional<std::int64_t> snapshot_every_batches;
  /// Retention: after each archive, the oldest archives of this run in its folder beyond this many are removed.
  std::optional<std::size_t> max_dumps;
  /// Retention: ... and beyond this many bytes in all (OOMFLIGHT_MAX_TOTAL_MB, in MB of 10^6 bytes).
  std::optional<std::uint64_t> max_total_bytes;
  FilenameTemplate folder;            ///< folder of every file, relative to the working directory
  FilenameTemplate filename;          ///< archive name (written by all ranks together)
  FilenameTemplate rank_filename;     ///< rank-local file name (written by one rank alone)
  std::chrono::milliseconds dump_timeout{30000};  ///< deadline for the ranks to agree on a dump
  std::chrono::milliseconds poll_interval{10};    ///< the watcher thread's sleep between MPI_Test polls
  /// Stripes an archive asks a parallel file system for: -1 auto (one per GiB of archive, from 2), 0 the folder's
  /// layout, N (<= 2000) that many (OOMFLIGHT_ARCHIVE_STRIPES; docs/scale.md)
  int archive_stripes = -1;
  bool overwrite = false;             ///< replace an existing file instead of choosing a new name
  bool keep_rank_files = false;       ///< keep every rank's safety copy after the archive is verified
  /// SIGUSR1 dumps closer than this to the last one are skipped (a burst of signals is one dump); 0: none skipped
  std::chrono::milliseconds signal_dump_interval{10000};
  bool dump_on_exit = false;          ///< on SIGTERM, dump every rank (kind exit), then end as SIGTERM would
  /// OOMFLIGHT_HEADROOM_DUMP in parts per million of the rank's limit (900000: 90%); 0: off (headroom_watch.hpp)
  std::uint32_t headroom_ppm = 0;
  std::string log_level = "info";
  /// Every setting given (by the environment or explicitly), as its variable's name and text, in table order: what
  /// an archive's /context records as the run's OOMFLIGHT_* settings.
  std::vector<std::pair<std::string, std::string>> given;
  std::string library;                ///< liboomflight's path for the Python package; unused by the library itself
  std::string stacks = "python";      ///< the PyTorch extension's call sites: python, torch or off; unused here

  /// Reads every OOMFLIGHT_* variable through `lookup` (getenv by default), starting from the defaults.
  /// Throws ConfigError for a malformed value or an unknown OOMFLIGHT_* variable (a misspelt name must not be
  /// ignored silently). Not thread-safe with concurrent setenv().
  static Config from_environment(
      const std::function<std::optional<std::string>(std::string_view)>& lookup = {},
      const std::vector<std::string>& present_names = {});

  /// The defaults, as the table gives them.
  static Config defaults();

  /// Whether a snapshot schedule is set (any of OOMFLIGHT_SKIP_BATCHES, OOMFLIGHT_INTERVAL,
  /// OOMFLIGHT_SNAPSHOT_EVERY).
  bool snapshots() const { return skip_batches || interval_batches || snapshot_every_batches; }
};

/// One configuration option.
struct OptionSpec {
  std::string_view env;            ///< environment variable, e.g. "OOMFLIGHT_MAX_ENTRIES"
  std::string_view type;           ///< "integer", "bytes", "duration", "bool", "string", "template"
  std::string_view default_value;  ///< as text, parsed like a user's value
  std::string_view description;
  std::function<void(Config&, std::string_view)> apply;  ///< parses and stores; throws std::invalid_argument
};

/// Every option, in the order `oomflight config` prints them.
OOMFLIGHT_API const std::vector<OptionSpec>& option_table();

/// The options as a Markdown table (the README's).
OOMFLIGHT_API std::string option_table_markdown();

/// Names of the OOMFLIGHT_* variables set in this process's environment.
OOMFLIGHT_API std::vector<std::string> oomflight_environment_names();

}  // namespace oomflight
