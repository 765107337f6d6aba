// One coordinated dump on one rank, from its freeze to its end (dump_run.hpp).
#include "dump_run.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <utility>

#include "dump_outcome.hpp"
#include "dump_words.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "protocol_timing.hpp"
#include "retention.hpp"

namespace oomflight {
namespace {

std::string origin_reason(int rank, bool is_origin, const DumpRequest& request) {
  return is_origin ? fmt::format("rank {}: {}", rank, request.reason) : std::string();
}

void remove_file(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

}  // namespace

std::string DumpRun::rank_file() {
  std::lock_guard lock(mutex_);
  return rank_file_;
}

DumpResult DumpRun::run(DumpAssembly& transport, FrozenHistory& h, bool is_origin, DumpRequest request,
                        std::int64_t start_ns, DumpTimeline& timeline) {
  std::int64_t number = 0;
  {
    std::lock_guard lock(mutex_);
    number = ledger_.number();
  }
  const std::int64_t deadline_ns = start_ns + to_ns(config_.dump_timeout);

  // 1. This rank's history reaches disk before anything waits on another rank: no collective and no key can
  // complete before every rank's copy is written, so whatever happens to any rank after this, its history stands.
  // (Posting the vote first and writing the copy while it travels overlaps the two, but another thread's MPI calls
  // can complete the votes meanwhile, and a rank stopped then lost its copy: tests/faults/dump_faults.py caught it.)
  const DumpFacts known = transport.facts_known(h, is_origin, request);
  ArchiveHeader header = executor_.header(known.kind, known.batch, origin_reason(id_.rank, is_origin, request),
                                          known.origins, {id_.rank});
  header.dump_number = number;  // the files of one dump carry one number: merge checks it
  std::string mine;
  try {
    const auto files = transport.lock_files();
    mine = executor_.write_rank_local(header, executor_.rank_row(h, is_origin, request), h, known.batch,
                                      Durability::handed_to_kernel,  // the verified archive replaces it
                                      &request.state);
    log().debug("safety copy of this rank's history: {}", mine);
  } catch (const std::exception& e) {
    // The history is still in memory: the archive may yet hold it. Say so now, in case it does not.
    log().error("cannot write this rank's rank-local file before the archive: {}", e.what());
  }
  {
    std::lock_guard lock(mutex_);
    rank_file_ = mine;
  }
  timeline.mark("safety copy");

  // 2. An origin through its oom event: another rank's dump reached this watcher before the failing thread asked.
  // Its request carries the job's own error text for the archive's reason: waited for a little (the others wait in
  // their vote or for the files meanwhile, so not for long), and this rank's file is written again with it.
  std::optional<DumpRequest> words;
  {
    std::unique_lock lock(mutex_);
    words = ledger_.words(lock, cv_, stop_, config_.dump_timeout);
  }
  if (words) {
    request = std::move(*words);
    header.reason = origin_reason(id_.rank, true, request);
    if (!mine.empty()) {
      try {
        const auto files = transport.lock_files();
        const RankRow row = executor_.rank_row(h, true, request);
        write_archive(mine, header, DumpExecutor::dump_of(row, h, &request.state), Durability::handed_to_kernel,
                      Naming::replace);
      } catch (const std::exception& e) {
        log().warn("this rank's file keeps its oom event's words ({})", e.what());  // the first file stands
      }
    }
  }
  timeline.mark("late request");

  // 3. The transport's assembly of the archive.
  AssembledDump a;
  try {
    a = transport.assemble(h, is_origin, request, mine, deadline_ns, timeline);
  } catch (const std::exception& e) {
    a = AssembledDump{};
    a.facts = known;
    a.error = e.what();
  }
  if (a.facts.origins.empty()) a.facts.origins = known.origins;
  if (!a.archive && a.error.empty()) a.error = "no archive was written";

  // 4. The archive, if this rank is in it; else this rank's own file is the result.
  DumpResult r;
  r.kind = a.facts.kind;
  r.batch = a.facts.batch;
  r.origin_ranks.assign(a.facts.origins.begin(), a.facts.origins.end());
  r.world_size = id_.world_size;
  const std::string summary =
      dump_summary(a.facts.kind, a.facts.origins, a.facts.batch, a.facts.requested_bytes, a.facts.device_free_bytes,
                   a.facts.numbers_from_message, a.facts.reason);
  if (a.archive) {
    r.status = DumpResult::Status::archive;
    r.path = a.path;
    r.ranks_written = a.ranks_written;
    r.error = a.error;
    if (!mine.empty() && !config_.keep_rank_files) remove_file(mine);  // the archive holds it now, verified
    // A joint archive that another name was given (a lower late origin named it) supersedes the first one.
    if (!a.replaces.empty() && a.replaces != a.path) remove_file(a.replaces);
    timeline.mark("remove safety copy");
    r.seconds = seconds_since(start_ns);
    if (a.speaks) {
      say_archive_written(summary, r);
      if (!a.replaces.empty()) {
        log().info("{} replaces the archive of dump {}: it names every rank that failed during that dump", r.path,
                   number - 1);
      }
    }
    if (a.prunes) {
      const auto files = transport.lock_files();
      prune_archives(r.path, id_.run_name, id_.job_id, config_);  // one rank prunes: the one that named it
    }
  } else {
    header = executor_.header(a.facts.kind, a.facts.batch, header.reason, a.facts.origins, {id_.rank});
    header.dump_number = number;
    r = settle_without_archive(transport, std::move(r), a, summary, mine, header, h, is_origin, request);
    r.seconds = seconds_since(start_ns);
  }

  // 5. Done: an origin's error ends the job as soon as its request returns, so it waits until every rank with a
  // file of the dump has finished with it (a rank torn down first would leave its safety copy beside the archive).
  bool late = false;
  {
    std::lock_guard lock(mutex_);
    late = ledger_.says_late();  // this rank failed during the dump, after its freeze: its own dump follows
  }
  std::vector<int> late_ranks;
  try {
    late_ranks = transport.end_dump(is_origin, a.facts.origins, late, !mine.empty(),
                                    monotonic_ns() + to_ns(config_.dump_timeout));
  } catch (const std::exception& e) {
    log().warn("at the end of dump {}: {}", number, e.what());
  }
  timeline.mark("done messages");
  // Ranks that ran out of memory during an oom dump: their dump follows, names this rank's origins too and replaces
  // this archive (the joint dump). After a dump of another kind theirs is a dump of its own: nobody stays.
  if (!late_ranks.empty() && r.status == DumpResult::Status::archive && r.kind == DumpKind::oom) {
    log().info("{}", late_origins_text(late_ranks));
    std::lock_guard lock(mutex_);
    ledger_.expect_joint(request, r.batch, r.path);
  }
  {
    std::lock_guard lock(mutex_);
    rank_file_.clear();
  }
  log().debug("dump phases on rank {} of {} from {} ns (wall/CPU ms): {}", id_.rank, id_.world_size,
              timeline.start_ns(), timeline.text());
  return r;
}

DumpResult DumpRun::settle_without_archive(DumpAssembly& transport, DumpResult r, const AssembledDump& a,
                                           const std::string& summary, const std::string& rank_file,
                                           const ArchiveHeader& header, const FrozenHistory& h, bool is_origin,
                                           const DumpRequest& request) {
  if (!rank_file.empty()) {
    settle_rank_local(r, summary, rank_file, false, a.error, id_);  // the safety copy is the result now
    return r;
  }
  // The safety copy failed: the history is still in memory, and both folders are tried once more.
  try {
    std::string path;
    {
      const auto files = transport.lock_files();
      path = executor_.write_rank_local(header, executor_.rank_row(h, is_origin, request), h, a.facts.batch,
                                        Durability::verified, &request.state);
    }
    settle_rank_local(r, summary, path, true, a.error, id_);
  } catch (const std::exception& e) {
    settle_no_file(r, summary, fmt::format("{}; and the rank-local file failed: {}", a.error, e.what()));
  }
  return r;
}

}  // namespace oomflight
