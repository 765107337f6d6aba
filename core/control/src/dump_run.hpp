// One coordinated dump on one rank, from its freeze to its end, written once for both transports (internal to the
// control wing; docs/protocol.md, "One coordinator, two transports"). Issue 40: the MPI transport's run_dump and
// agree_and_write and the store transport's run_dump each wrote the same steps in their own lines, and had drifted
// (the store rewrote its file with the failing thread's words and MPI did not; the store's origin with no file of
// its own told nobody it was done; each joint dump kept another batch).
//
// The steps, in order, every one of them policy:
//   1. this rank's history reaches its rank-local file (the safety copy) before anything waits on another rank;
//   2. an origin through its oom event waits a little for its failing thread's words, and its file takes them;
//   3. the transport assembles the archive (DumpAssembly::assemble: MPI's votes and collective write; the store's
//      keys, files and merge), or says why there is none;
//   4. with an archive, the safety copy goes, the rank that speaks for the dump says its summary line, and the rank
//      that named it applies the retention; without one, the safety copy is the result (settle_rank_local);
//   5. the rank says it is done (an origin waits for every rank with a file: its error ends the job), and a rank
//      that failed during an oom dump, after its freeze, gets the joint dump: this rank's origins stay for it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dump_executor.hpp"
#include "dump_ledger.hpp"
#include "dump_timeline.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

/// What names a dump in its files and its summary line (dump_summary()): its kind and batch, its origins
/// (ascending, unique), and the figures and words of the origin that speaks for it.
struct DumpFacts {
  DumpKind kind = DumpKind::oom;
  std::int64_t batch = -1;
  std::vector<std::int32_t> origins;
  std::uint64_t requested_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  std::uint32_t numbers_from_message = 0;
  std::string reason;
};

/// What a transport's assembly of a dump gave this rank.
struct AssembledDump {
  bool archive = false;     // this rank's history is in the archive at `path`
  std::string path;         // the archive's
  int ranks_written = 0;    // the ranks in it
  DumpFacts facts;          // the dump as the archive names it; without one, as this rank knows it
  std::string error;        // with an archive: the ranks it lacks, and why; without one: why there is none
  std::string replaces;     // a joint dump's archive: the first archive, which it replaces
  bool speaks = false;      // this rank says the dump's summary line (one rank per dump)
  bool prunes = false;      // this rank applies the retention (the one that named or merged the archive)
};

/// A transport's part of one dump: the mechanics between the ranks. Called on the transport's watcher, without
/// its mutex.
class DumpAssembly {
 public:
  virtual ~DumpAssembly() = default;

  /// What this rank knows of the dump under way before the ranks agree on it: the cause or the triggers it heard,
  /// or its own `request` (an origin's). Its file of the dump is named and headed so.
  virtual DumpFacts facts_known(const FrozenHistory& h, bool is_origin, const DumpRequest& request) = 0;

  /// Assembles the archive with the other ranks, within `deadline_ns` (monotonic; the store's merger may take one
  /// more deadline). `rank_file`: this rank's safety copy, already on disk (empty when it could not be written).
  /// `request`: this rank's, with its failing thread's words. Marks its steps on `timeline`. Never throws: a
  /// failure is an AssembledDump without an archive, saying why.
  virtual AssembledDump assemble(FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                 const std::string& rank_file, std::int64_t deadline_ns, DumpTimeline& timeline) = 0;

  /// The end of the dump on this rank: tells the origins it is done (`late`: a failure of this rank came during
  /// the dump, after its freeze: its own dump follows; `wrote`: it has a file of the dump). An origin then waits,
  /// until `deadline_ns`, for every other rank with a file to say so, and returns those that said late, ascending.
  /// Never throws.
  virtual std::vector<int> end_dump(bool is_origin, const std::vector<std::int32_t>& origins, bool late, bool wrote,
                                    std::int64_t deadline_ns) = 0;

  /// The lock around every file this rank writes or reads (the store's: Debian's HDF5 is not thread-safe and the
  /// store writes from several threads), or none (MPI writes from the watcher only).
  virtual std::unique_lock<std::mutex> lock_files() = 0;
};

/// Runs the steps above for the dump under way on this rank. Lives as long as the transport that owns it; the
/// references too. `mutex` is the transport's, guarding `ledger`, `stop` and rank_file(); `cv` is where requests
/// of this process wait.
class DumpRun {
 public:
  DumpRun(const Config& config, const RankIdentity& identity, const DumpExecutor& executor, DumpLedger& ledger,
          std::mutex& mutex, std::condition_variable& cv, const bool& stop)
      : config_(config), id_(identity), executor_(executor), ledger_(ledger), mutex_(mutex), cv_(cv), stop_(stop) {}

  /// The dump under way (DumpLedger::begin() and decided() were called), from this rank's frozen history `h`:
  /// `is_origin` and `request` as settle_role() left them (a joint dump's rejoining origin: the first dump's).
  /// Returns this rank's result; the caller ends the dump with it (DumpLedger::finish). Watcher thread; never
  /// throws but std::bad_alloc. `timeline` was started before the freeze (its steps so far are the caller's): the
  /// dump's steps are marked on it, and it is logged at its end (debug level: bench/scale.py reads the line).
  DumpResult run(DumpAssembly& transport, FrozenHistory& h, bool is_origin, DumpRequest request,
                 std::int64_t start_ns, DumpTimeline& timeline);

  /// This rank's file of the dump under way, once written (empty otherwise): what a shutdown that leaves a stuck
  /// dump behind names. Takes `mutex`.
  std::string rank_file();

 private:
  // Step 4 without an archive: the safety copy is the result (made durable), or a file written now, or none.
  // `summary`: the dump's dump_summary() words.
  DumpResult settle_without_archive(DumpAssembly& transport, DumpResult r, const AssembledDump& a,
                                    const std::string& summary, const std::string& rank_file,
                                    const ArchiveHeader& header, const FrozenHistory& h, bool is_origin,
                                    const DumpRequest& request);

  const Config& config_;
  const RankIdentity& id_;
  const DumpExecutor& executor_;
  DumpLedger& ledger_;
  std::mutex& mutex_;
  std::condition_variable& cv_;
  const bool& stop_;
  std::string rank_file_;  // (mutex_)
};

}  // namespace oomflight
