// `oomflight diff A B [--rank R] [--top N] [--frames N]`: two archives (or two snapshot windows of one job) compared
// by call site (issue 42, item 3; archive_diff.hpp): what grew, what shrank, and on which rank.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "oomflight/analysis/archive_diff.hpp"
#include "oomflight/base/printable.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/export/user_frames.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight::cli {
namespace {

std::string signed_bytes(std::int64_t v) {
  return v >= 0 ? "+" + format_bytes(static_cast<std::uint64_t>(v))
                : "-" + format_bytes(-static_cast<std::uint64_t>(v));
}

// From `from` to `to` bytes, signed, whatever their size (a damaged archive's may pass INT64_MAX).
std::string change_text(std::uint64_t from, std::uint64_t to) {
  return to >= from ? "+" + format_bytes(to - from) : "-" + format_bytes(from - to);
}

std::string ranks_list(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

std::string render_diff(const Archive& a, const Archive& b, const ArchiveDiff& d, std::size_t frames) {
  std::string out = fmt::format("oomflight diff: {} -> {}\n", printable(a.path), printable(b.path));
  out += fmt::format("  A: run {}, kind {}, written {}\n  B: run {}, kind {}, written {}\n", printable(a.header.run_name),
                     printable(a.header.kind), printable(a.header.created_at_utc), printable(b.header.run_name),
                     printable(b.header.kind), printable(b.header.created_at_utc));
  out += fmt::format("ranks compared: {}", d.ranks.empty() ? std::string("none") : ranks_list(d.ranks));
  if (!d.only_a.empty()) out += fmt::format("; only in A: {}", ranks_list(d.only_a));
  if (!d.only_b.empty()) out += fmt::format("; only in B: {}", ranks_list(d.only_b));
  out += "\n";
  if (d.ranks.empty()) return out;
  out += fmt::format("live in their recorded histories: {} -> {} ({})\n", format_bytes(d.live_a),
                     format_bytes(d.live_b), change_text(d.live_a, d.live_b));
  if (d.changed == 0) return out + "no call site's live bytes changed\n";
  out += fmt::format("{} call {} live bytes changed{}:\n", d.changed, d.changed == 1 ? "site's" : "sites'",
                     d.sites.size() < d.changed ? fmt::format(" (the {} largest changes shown)", d.sites.size()) : "");
  for (std::size_t i = 0; i < d.sites.size(); ++i) {
    const SiteChange& c = d.sites[i];
    std::string where;
    if (d.ranks.size() > 1) {
      where = fmt::format("; most on rank {} ({}), the median rank {}", c.widest_rank, signed_bytes(c.widest_change),
                          signed_bytes(c.median_change));
    }
    out += fmt::format("  {:>2}. {} ({} -> {}){}\n", i + 1, change_text(c.bytes_a, c.bytes_b), format_bytes(c.bytes_a),
                       format_bytes(c.bytes_b), where);
    // The frames as the archive that holds the site gives them (B's where both do).
    const Archive& holder = c.stack_b != kNoStack ? b : a;
    const std::int32_t stack = c.stack_b != kNoStack ? c.stack_b : c.stack_a;
    if (stack == kNoStack || holder.stack(stack).empty()) out += "        (no stack recorded)\n";
    out += frame_lines(holder, stack, frames, "        ");
  }
  return out;
}

}  // namespace

Command add_diff(CLI::App& app) {
  auto* sub = app.add_subcommand("diff", "Compare two archives (or two snapshot windows) by call site");
  auto paths = std::make_shared<std::vector<std::string>>();
  auto rank = std::make_shared<std::optional<int>>();
  auto top = std::make_shared<std::size_t>(10);
  auto frames = std::make_shared<std::size_t>(6);
  sub->add_option("archives", *paths, "A and B: the archives (.h5) to compare, the earlier first")
      ->required()
      ->expected(2);
  sub->add_option("--rank", *rank, "Only this rank (it must be in both)")->check(CLI::Range(0, kMaxRank));
  sub->add_option("--top", *top, "Call sites to list, the largest changes first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  sub->add_option("--frames", *frames, "Frames to show per call site")->capture_default_str()->check(CLI::Range(0, 1000));
  return {sub, [paths, rank, top, frames] {
    // Whatever the files hold, diff ends with its text or a message, never on a signal (isolate.hpp).
    return run_isolated(fmt::format("{} and {}", (*paths)[0], (*paths)[1]), [&] {
      try {
        const Archive a = read_archive((*paths)[0]);
        const Archive b = read_archive((*paths)[1]);
        const ArchiveDiff d = diff_archives(a, b, *rank, *top);
        fmt::print("{}", render_diff(a, b, d, *frames));
        if (*rank && d.ranks.empty()) {
          print_error(fmt::format("--rank {}: not in both archives", **rank));
          return kExitFailure;
        }
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
