// How a coordinated dump ends on a rank (dump_outcome.hpp).
#include "dump_outcome.hpp"

#include <fmt/format.h>

#include <exception>

#include "dump_words.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/archive_writer.hpp"

namespace oomflight {

void say_archive_written(const std::string& summary, const DumpResult& r) {
  log().info("{}; archive {} written by {} of {} ranks in {}{}{}", summary, r.path, r.ranks_written, r.world_size,
             format_seconds(r.seconds), r.error.empty() ? "" : ": ", r.error);
}

void settle_rank_local(DumpResult& r, const std::string& summary, const std::string& path, bool synced,
                       const std::string& why, const RankIdentity& id) {
  r.status = DumpResult::Status::rank_local;
  r.path = path;
  r.ranks_written = 1;
  r.error = why;
  if (!synced) {
    try {
      sync_file(path);  // the result now: as durable as an archive
    } catch (const std::exception& e) {
      r.error += fmt::format("; and it may not have reached the disk: {}", e.what());
      log().error("{}", e.what());
    }
  }
  log().warn("{}; {}; this rank's history is in the rank-local file {}", summary, r.error, path);
  if (!r.origin_ranks.empty() && r.origin_ranks.front() == id.rank && id.world_size > 1) {
    // One line, from one rank, on how to get the archive back. The default rank-local template names files by
    // rank, so this rank's path with its rank as a wildcard is the glob (where TMPDIR is node-local, the files of
    // other nodes are in their own TMPDIR).
    std::string glob = path;
    const std::string mine = fmt::format("rank{}", id.rank);
    if (const auto at = glob.rfind(mine); at != std::string::npos) glob.replace(at, mine.size(), "rank*");
    log().warn("to join every rank's file into one archive: oomflight merge {} -o ARCHIVE.h5", glob);
  }
}

void settle_no_file(DumpResult& r, const std::string& summary, const std::string& why) {
  r.status = DumpResult::Status::failed;
  r.error = why;
  log().error("{}; no file written: {}", summary, why);
}

DumpResult gave_up_waiting(DumpKind kind, std::chrono::milliseconds dump_timeout) {
  DumpResult r;
  r.kind = kind;
  r.error = gave_up_on_the_dump_text(dump_timeout);
  log().error("{}", r.error);
  return r;
}

}  // namespace oomflight
