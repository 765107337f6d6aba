// The option table and the environment parser built on it.
#include "oomflight/control/config.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <cstdlib>
#include <fmt/format.h>
#include <unistd.h>

#include "oomflight/base/printable.hpp"
#include "oomflight/base/units.hpp"

extern char** environ;

namespace oomflight {
namespace {

std::size_t parse_positive(std::string_view text, std::size_t max) {
  std::size_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v == 0 || v > max) {
    throw std::invalid_argument(fmt::format("not an integer in 1 .. {}", max));
  }
  return v;
}

bool parse_bool(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  throw std::invalid_argument("not a boolean (use 1/0, true/false, yes/no, on/off)");
}

// The first byte of `text` that is not part of well-formed UTF-8 or is a control character, or nothing.
std::optional<std::size_t> invalid_utf8_at(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t length = utf8_sequence_length(text, i);
    if (c < 0x20 || c == 0x7f || length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

// Durations are bounded above as well: a deadline of a million hours overflowed into "did not finish within
// 10800000000 s" at once and wrote nothing; no dump needs more than an hour to agree.
std::chrono::milliseconds parse_positive_duration(std::string_view text, std::chrono::milliseconds max) {
  const auto d = parse_duration(text);
  if (d.count() <= 0) throw std::invalid_argument("must be longer than 0 ms");
  if (d > max) {
    throw std::invalid_argument(fmt::format("must be at most {}", format_seconds(static_cast<double>(max.count()) / 1e3)));
  }
  return d;
}

// A Composer time string in batches ("3ba"), the only unit a rank's recorder counts. Other Composer units (ep,
// sp, tok, dur) are named in the error: they are valid for Composer, not here.
std::int64_t parse_batches(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string_view unit = text.substr(digits);
  if (digits == 0) throw std::invalid_argument("not a time string in batches such as '3ba'");
  if (unit != "ba") {
    if (unit.empty()) throw std::invalid_argument("has no unit: write batches as '3ba' (Composer's time strings)");
    throw std::invalid_argument(fmt::format("unit '{}' is not one oomflight counts: only batches, as '3ba'", unit));
  }
  return static_cast<std::int64_t>(parse_positive(text.substr(0, digits), std::size_t{1} << 40));
}

// The ring's memory for `entries` (Ring's slot array: 64 bytes a slot, the next power of two above entries plus
// the writers' room), against half of this machine's memory: refused at start-up with the figure, never a
// std::bad_alloc later.
std::size_t parse_max_entries(std::string_view text) {
  const std::size_t n = parse_positive(text, std::size_t{1} << 30);
  std::uint64_t slots = 1;
  while (slots < n + 64 * 64) slots <<= 1;
  const std::uint64_t bytes = slots * 64;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const std::uint64_t memory = pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) : 0;
  if (memory > 0 && bytes > memory / 2) {
    throw std::invalid_argument(fmt::format("the history would take {} (64 bytes a slot), more than half of this "
                                            "machine's {}", format_bytes(bytes), format_bytes(memory)));
  }
  return n;
}

// OOMFLIGHT_HEADROOM_DUMP: a share of the rank's limit, written as a fraction ("0.9") or a percentage ("90%"),
// above 0 and at most 1. Empty: off. Returned as parts per million, so that the check compares integers.
std::uint32_t parse_headroom(std::string_view text) {
  if (text.empty()) return 0;
  const bool percent = text.back() == '%';
  if (percent) text.remove_suffix(1);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !(v == v)) {
    throw std::invalid_argument("not a fraction of the limit such as 0.9, nor a percentage such as 90%");
  }
  if (percent) v /= 100;
  if (!(v > 0 && v <= 1)) {
    throw std::invalid_argument("must be above 0 and at most 1 (100%): a share of the device's capacity or cap");
  }
  const auto ppm = static_cast<std::uint32_t>(v * 1e6 + 0.5);
  if (ppm == 0) throw std::invalid_argument("is below one part in a million of the limit (0.0001%): it would be off");
  return ppm;
}

FilenameTemplate parse_file_template(std::string_view text, bool per_rank) {
  FilenameTemplate t(text);
  if (t.text().empty()) throw std::invalid_argument("must not be empty");
  if (t.text().back() == '/') throw std::invalid_argument("names a folder, not a file");
  // The archive is one file for all ranks: a per-rank placeholder would give each rank another name.
  if (!per_rank) {
    for (auto f : {FilenameTemplate::Field::rank, FilenameTemplate::Field::local_rank, FilenameTemplate::Field::pid,
                   FilenameTemplate::Field::host}) {
      if (t.uses(f)) {
        throw std::invalid_argument(
            "names a per-rank placeholder ({rank}, {local_rank}, {pid} or {host}); the archive is one file "
            "shared by all ranks");
      }
    }
  }
  return t;
}

std::vector<OptionSpec> make_table() {
  return {
      {"OOMFLIGHT_ENABLED", "bool", "1", "Record and dump at all. 0 turns oomflight into a no-op. Must be the same on every rank (checked at start).",
       [](Config& c, std::string_view v) { c.enabled = parse_bool(v); }},
      {"OOMFLIGHT_RUN_NAME", "string", "",
       "The job's name, shared by all ranks: UTF-8 text of at most 200 bytes, no '/' and no control characters "
       "(longer or malformed names are refused, never cut). Empty: rank 0 generates one "
       "(oomflight-YYYYMMDD-HHMMSS-XXXX) and sends it to every rank.",
       [](Config& c, std::string_view v) {
         if (v.find('/') != std::string_view::npos) throw std::invalid_argument("must not contain '/'");
         // It names a folder and travels to every rank in a fixed field: never cut, never invalid UTF-8.
         if (v.size() > kMaxRunNameBytes) {
           throw std::invalid_argument(fmt::format("is {} bytes long; at most {}", v.size(), kMaxRunNameBytes));
         }
         if (const auto bad = invalid_utf8_at(v)) {
           throw std::invalid_argument(fmt::format("is not UTF-8 text (byte {})", *bad));
         }
         c.run_name = std::string(v);
       }},
      {"OOMFLIGHT_MAX_ENTRIES", "integer", "100000",
       "Events kept per rank (the ring's bound). Older events are overwritten and counted.",
       [](Config& c, std::string_view v) { c.max_entries = parse_max_entries(v); }},
      {"OOMFLIGHT_MAX_BATCHES", "integer", "10000",
       "Batches whose memory figures each rank keeps (allocated, reserved, the batch's own peaks, event counts; "
       "112 bytes a batch): hours of training at the default. Every archive holds them.",
       [](Config& c, std::string_view v) { c.max_batches = parse_positive(v, std::size_t{10000000}); }},
      {"OOMFLIGHT_SKIP_BATCHES", "integer", "",
       "Snapshots: batches to skip before the first window (Composer's skip_batches; 1 when only another schedule "
       "variable is set). Setting any of the three schedule variables turns interval snapshots on. The three must be the "
       "same on every rank (checked at start: a mismatch ends start-up on every rank, naming it).",
       [](Config& c, std::string_view v) {
         if (v.empty()) return;
         c.skip_batches = v == "0" ? 0 : static_cast<std::int64_t>(parse_positive(v, std::size_t{1} << 40));
       }},
      {"OOMFLIGHT_INTERVAL", "batches", "",
       "Snapshots: the window's length, a Composer time string in batches ('3ba'; Composer's interval): every rank "
       "records batches [skip, skip + interval) and all ranks write them as one archive of kind snapshot. Default "
       "3ba, or OOMFLIGHT_SNAPSHOT_EVERY when that is set.",
       [](Config& c, std::string_view v) {
         if (!v.empty()) c.interval_batches = parse_batches(v);
       }},
      {"OOMFLIGHT_SNAPSHOT_EVERY", "batches", "",
       "Snapshots: repeat the window every this many batches ('100ba'; torchtitan's profile_freq). Unset: one window.",
       [](Config& c, std::string_view v) {
         if (!v.empty()) c.snapshot_every_batches = parse_batches(v);
       }},
      {"OOMFLIGHT_MAX_DUMPS", "integer", "",
       "Retention: after each archive, keep only the newest this many archives of this job in its folder (the "
       "one just written always stays; rank-local files and other jobs' archives are not counted). Unset: keep "
       "all.",
       [](Config& c, std::string_view v) {
         if (!v.empty()) c.max_dumps = parse_positive(v, std::size_t{1} << 30);
       }},
      {"OOMFLIGHT_MAX_TOTAL_MB", "integer", "",
       "Retention: after each archive, remove this job's oldest archives in its folder until they take at most "
       "this many MB (10^6 bytes); the one just written always stays. Unset: no limit.",
       [](Config& c, std::string_view v) {
         if (!v.empty()) c.max_total_bytes = static_cast<std::uint64_t>(parse_positive(v, std::size_t{1} << 40)) * 1000000;
       }},
      {"OOMFLIGHT_FOLDER", "template", "{run_name}/oomflight",
       "Folder for archives and rank-local files, relative to the working directory.",
       [](Config& c, std::string_view v) {
         // A folder may end in '/' (as people write one: "out/"); the names under it add their own.
         while (v.size() > 1 && v.back() == '/') v.remove_suffix(1);
         c.folder = parse_file_template(v, true);
       }},
      {"OOMFLIGHT_FILENAME", "template", "{kind}.{batch}.h5",
       "Name of the archive all ranks write together. No per-rank placeholders. {kind} must be in it or in "
       "OOMFLIGHT_FOLDER: archives of different kinds never share a file.",
       [](Config& c, std::string_view v) { c.filename = parse_file_template(v, false); }},
      {"OOMFLIGHT_RANK_FILENAME", "template", "{kind}.{batch}.rank{rank}.h5",
       "Name of a rank-local file: every rank writes its history there first, before any step another rank can "
       "block, and removes it once the archive is verified (see OOMFLIGHT_KEEP_RANK_FILES). Needs {rank}, and {kind} "
       "here or in OOMFLIGHT_FOLDER. When its folder cannot be written it goes to $TMPDIR/oomflight-{run_name}/ "
       "(an absolute name: its whole path under that folder).",
       [](Config& c, std::string_view v) {
         c.rank_filename = parse_file_template(v, true);
         if (!c.rank_filename.uses(FilenameTemplate::Field::rank)) {
           throw std::invalid_argument("must contain {rank}: each rank writes its own file");
         }
       }},
      {"OOMFLIGHT_DUMP_TIMEOUT", "duration", "30s",
       "Deadline for all ranks to agree on a dump; after it each rank's rank-local file is the result. No process "
       "waits more than 3 x this for a dump, even when a rank stalls inside the collective write (under torchrun, a "
       "dump asked for before the ranks' start-up agreement first waits for it, up to 2 x this).",
       [](Config& c, std::string_view v) { c.dump_timeout = parse_positive_duration(v, std::chrono::hours(1)); }},
      {"OOMFLIGHT_ARCHIVE_STRIPES", "string", "auto",
       "How many stripes (servers) the archive asks a parallel file system for, through the MPI library's "
       "striping hints (Lustre heeds them; elsewhere they are ignored). auto: one per GiB of archive when that is 2 "
       "or more (a large archive on one Lustre OST, the default layout, takes longer than the dump's deadline at "
       "thousands of ranks: docs/scale.md); 0: the folder's own layout; N: N stripes of 4 MiB.",
       [](Config& c, std::string_view v) {
         if (v == "auto") {
           c.archive_stripes = -1;
         } else if (v == "0") {
           c.archive_stripes = 0;
         } else {
           try {
             c.archive_stripes = static_cast<int>(parse_positive(v, 2000));  // Lustre's most stripes
           } catch (const std::invalid_argument&) {
             throw std::invalid_argument("not auto, 0 or a count of stripes in 1 .. 2000");
           }
         }
       }},
      {"OOMFLIGHT_POLL_INTERVAL", "duration", "10ms",
       "How long the watcher thread sleeps between polls for a trigger (MPI_Test).",
       [](Config& c, std::string_view v) { c.poll_interval = parse_positive_duration(v, std::chrono::minutes(1)); }},
      {"OOMFLIGHT_OVERWRITE", "bool", "0",
       "Replace an existing file. 0: never replace one: the new file is NAME-1.h5, NAME-2.h5, ... after this job's "
       "own, NAME.JOB.h5 after another job's (docs/archive-format.md, \"File names\").",
       [](Config& c, std::string_view v) { c.overwrite = parse_bool(v); }},
      {"OOMFLIGHT_KEEP_RANK_FILES", "bool", "0",
       "Keep every rank's rank-local file after the archive is written and verified. 0: remove them then (they "
       "stay whenever the archive fails; `oomflight merge` joins them).",
       [](Config& c, std::string_view v) { c.keep_rank_files = parse_bool(v); }},
      {"OOMFLIGHT_SIGNAL_DUMP_INTERVAL", "duration", "10s",
       "Least time between two SIGUSR1 dumps of a rank: a signal sooner after the last one is skipped (logged "
       "once per burst, counted at the next dump), so that a burst of signals costs one archive, not one each. 0: "
       "every signal dumps.",
       [](Config& c, std::string_view v) {
         const auto d = parse_duration(v);
         if (d.count() < 0) throw std::invalid_argument("must not be negative");
         if (d > std::chrono::hours(24)) throw std::invalid_argument("must be at most 86400 s");
         c.signal_dump_interval = d;
       }},
      {"OOMFLIGHT_DUMP_ON_EXIT", "bool", "0",
       "On SIGTERM (a scheduler or watchdog tearing the job down), write every rank's history into one archive of "
       "kind exit, then end the process as SIGTERM would. Only where SIGTERM is at its default action; the dump is "
       "bounded by OOMFLIGHT_DUMP_TIMEOUT, and a sender's grace period shorter than the dump cuts it short. One "
       "dump per ending: a SIGTERM after an exit dump (a launcher's teardown) ends the process at once.",
       [](Config& c, std::string_view v) { c.dump_on_exit = parse_bool(v); }},
      {"OOMFLIGHT_HEADROOM_DUMP", "fraction", "",
       "Headroom: the first time a rank's reserved memory (its caching allocator's, plus what the process holds "
       "outside it where NVML says) crosses this share of its limit (the per-process cap where one is set, counting "
       "reserved alone, else the device's capacity), every rank writes its history into one archive of kind "
       "headroom, and the job goes on (a rank whose dumps are not coordinated writes its own file). Another comes "
       "only once that rank fell back 5 points below it. 0.9 or 90%; empty: off. Checked only where those figures "
       "change (a segment event, oomflight_set_memory): an allocation costs it one compare, and the dump is never "
       "written on the allocating thread.",
       [](Config& c, std::string_view v) { c.headroom_ppm = parse_headroom(v); }},
      {"OOMFLIGHT_LIBRARY", "path", "",
       "liboomflight for the Python package to load (`oomflight run` sets it to its own). Empty: the package's "
       "own (a pip install's), then beside the `oomflight` on PATH, then the loader's search path.",
       [](Config& c, std::string_view v) { c.library = std::string(v); }},
      {"OOMFLIGHT_STACKS", "string", "python",
       "Call sites of the PyTorch extension's events: python (the allocating thread's Python stack, captured by "
       "oomflight at a fraction of torch's cost), torch (torch's own contexts: its memory history with Python "
       "frames) or off. A job that records torch's memory history itself has its contexts used as they are.",
       [](Config& c, std::string_view v) {
         if (v != "python" && v != "torch" && v != "off") {
           throw std::invalid_argument("must be python, torch or off");
         }
         c.stacks = std::string(v);
       }},
      {"OOMFLIGHT_LOG_LEVEL", "string", "info", "trace, debug, info, warn, error or off.",
       [](Config& c, std::string_view v) {
         static const std::vector<std::string_view> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
         if (std::find(kLevels.begin(), kLevels.end(), v) == kLevels.end()) {
           throw std::invalid_argument("not one of trace, debug, info, warn, error, off");
         }
         c.log_level = std::string(v);
       }},
  };
}

std::optional<std::string> getenv_lookup(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  return v ? std::optional<std::string>(v) : std::nullopt;
}

void apply_checked(const OptionSpec& spec, Config& config, std::string_view value) {
  try {
    spec.apply(config, value);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{}='{}': {}", spec.env, value, e.what()));
  }
}

// Settings that each parse but defeat the dump together.
void check_together(const Config& c) {
  if (c.interval_batches && c.snapshot_every_batches && *c.interval_batches > *c.snapshot_every_batches) {
    throw ConfigError(fmt::format("OOMFLIGHT_INTERVAL={}ba is longer than OOMFLIGHT_SNAPSHOT_EVERY={}ba: windows "
                                  "would overlap",
                                  *c.interval_batches, *c.snapshot_every_batches));
  }
  // Archives of different kinds must never share a file: with OOMFLIGHT_OVERWRITE=1 the next snapshot replaced the
  // OOM archive just reported written, without a word.
  const auto given = [&](std::string_view name) {
    for (const auto& [n, v] : c.given) {
      if (n == name) return fmt::format("{}='{}'", n, v);
    }
    return fmt::format("{} (its default)", name);
  };
  using Field = FilenameTemplate::Field;
  for (const auto& [name, tmpl] : {std::pair<std::string_view, const FilenameTemplate*>{"OOMFLIGHT_FILENAME", &c.filename},
                                   {"OOMFLIGHT_RANK_FILENAME", &c.rank_filename}}) {
    if (!tmpl->uses(Field::kind) && !c.folder.uses(Field::kind)) {
      throw ConfigError(fmt::format("{} has no {{kind}}, nor has {}: an OOM archive, a snapshot and a signal dump "
                                    "would share one file; add {{kind}} to either",
                                    given(name), given("OOMFLIGHT_FOLDER")));
    }
  }
  // ... and rank 0's rank-local file must not be the archive (it is removed once the archive is verified).
  const TemplateValues sample{"run", 0, 0, 2, 7, 1, "host", "oom"};
  if (c.filename.render(sample) == c.rank_filename.render(sample)) {
    throw ConfigError(fmt::format("{} and {} name the same file for rank 0: its rank-local file would be the "
                                  "archive",
                                  given("OOMFLIGHT_FILENAME"), given("OOMFLIGHT_RANK_FILENAME")));
  }
  // A rank notices a trigger only at its next poll: with polls as long as the deadline, every other rank would
  // arrive after it and only the origin's history would be kept.
  if (c.poll_interval * 4 > c.dump_timeout) {
    throw ConfigError(fmt::format(
        "OOMFLIGHT_POLL_INTERVAL={} is longer than a quarter of OOMFLIGHT_DUMP_TIMEOUT={}: the other ranks would "
        "notice a trigger after the dump's deadline. Shorten the interval or lengthen the timeout",
        format_seconds(static_cast<double>(c.poll_interval.count()) / 1e3),
        format_seconds(static_cast<double>(c.dump_timeout.count()) / 1e3)));
  }
}

}  // namespace

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = make_table();
  return table;
}

Config Config::defaults() {
  Config c;
  for (const auto& spec : option_table()) apply_checked(spec, c, spec.default_value);
  return c;
}

Config Config::from_environment(const std::function<std::optional<std::string>(std::string_view)>& lookup,
                                const std::vector<std::string>& present_names) {
  const auto& get = lookup ? lookup : getenv_lookup;
  const auto names = lookup ? present_names : oomflight_environment_names();
  for (const auto& name : names) {
    const bool known = std::any_of(option_table().begin(), option_table().end(),
                                   [&](const OptionSpec& s) { return s.env == name; });
    if (!known) {
      throw ConfigError(fmt::format("{} is not an oomflight setting (run `oomflight config` for the list)", name));
    }
  }
  Config c = defaults();
  for (const auto& spec : option_table()) {
    if (auto value = get(spec.env)) {
      apply_checked(spec, c, *value);
      c.given.emplace_back(std::string(spec.env), *value);
    }
  }
  check_together(c);
  return c;
}

std::vector<std::string> oomflight_environment_names() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    if (entry.rfind("OOMFLIGHT_", 0) == 0) names.emplace_back(entry.substr(0, entry.find('=')));
  }
  return names;
}

std::string option_table_markdown() {
  std::string out = "| variable | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& s : option_table()) {
    out += fmt::format("| `{}` | {} | {} | {} |\n", s.env, s.type,
                       s.default_value.empty() ? std::string("(empty)") : fmt::format("`{}`", s.default_value),
                       s.description);
  }
  return out;
}

}  // namespace oomflight
