// How a coordinated dump ends on a rank, in the same words and with the same care over both transports (issue 40,
// item 5): the one line that says the archive is written, and the rank-local file that stands in for it when no
// archive holds this rank (made durable, said, and how to join every rank's file). The MPI transport's fallback and
// the store transport's said these differently (only the MPI one said how to merge).
#pragma once

#include <chrono>
#include <string>

#include "oomflight/control/dump_request.hpp"
#include "oomflight/control/rank_identity.hpp"

namespace oomflight {

/// The summary line of a dump written as an archive, said by the one rank that speaks for the dump (info level):
/// "<summary>; archive <r.path> written by <r.ranks_written> of <r.world_size> ranks in <r.seconds>", then
/// ": <r.error>" when ranks are missing. `summary`: dump_summary()'s words. Never throws but std::bad_alloc.
void say_archive_written(const std::string& summary, const DumpResult& r);

/// This rank's rank-local file `path` is the dump's result (no archive holds this rank): fsyncs it unless `synced`
/// (a safety copy written with Durability::handed_to_kernel becomes as durable as an archive), sets r.status
/// (rank_local), r.path, r.ranks_written (1) and r.error (`why`, plus a failed sync's error), and says so (warning
/// level): "<summary>; <why>; this rank's history is in the rank-local file <path>". The lowest origin (r.origin_ranks)
/// of a job of several ranks also says how to join every rank's file ("oomflight merge <path with rank* for its
/// rank> -o ARCHIVE.h5"). Never throws but std::bad_alloc.
void settle_rank_local(DumpResult& r, const std::string& summary, const std::string& path, bool synced,
                       const std::string& why, const RankIdentity& id);

/// No file holds this rank's history: r.status failed, r.error `why`, said at error level ("<summary>; no file
/// written: <why>"). Never throws but std::bad_alloc.
void settle_no_file(DumpResult& r, const std::string& summary, const std::string& why);

/// A request that waited for a dump returns without it (3 x `dump_timeout`, OOMFLIGHT_DUMP_TIMEOUT, passed): a failed
/// result of `kind` whose error is gave_up_on_the_dump_text(), said at error level. Never throws but std::bad_alloc.
DumpResult gave_up_waiting(DumpKind kind, std::chrono::milliseconds dump_timeout);

}  // namespace oomflight
