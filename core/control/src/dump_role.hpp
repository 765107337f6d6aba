// Whether this rank is an origin of the dump it just froze its history for, and why: the rule both transports keep
// between the freeze and their part in the dump (internal to the control wing; docs/protocol.md, "One coordinator,
// two transports"). Issue 40: the MPI transport's run_dump and the store's watcher each wrote it in their own lines,
// and the two had drifted (the store froze a joint dump's history of every device, MPI of the joint request's).
#pragma once

#include <condition_variable>
#include <mutex>

#include "dump_ledger.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

/// Why this rank takes part in the dump under way.
enum class DumpEntry {
  asked,     // its own request: it is an origin
  rejoined,  // it was an origin of the dump this one replaces (the joint dump): an origin again, with that request
  heard,     // another rank's: an origin only through an oom event no dump has reported
};

/// What settle_role() found.
struct DumpRole {
  bool origin = false;         // asked, rejoined, or through an unreported oom event
  bool through_event = false;  // the last: the transport tells the other ranks of its failure as an origin's
};

/// The history to freeze for a dump entered as `entry`: a joint dump's is of the device its request names (the one
/// the first dump reported), any other of every device. Call it under the transport's mutex.
int freeze_device(DumpEntry entry, const DumpLedger& ledger);

/// Records on `ledger`, under `mutex`, why this rank is in the dump under way whose freeze is `h` (`rank`: this
/// rank). An origin through its oom event gets `request` from that event (request_from_oom_event) and says its line
/// on stderr (announce_dump) before the ledger is told the verdict (decided()): a request of its failing thread,
/// which waits for the verdict, says its own words after it. Then notifies `cv`, where such a request waits.
/// `request` is left as it is otherwise (the caller's own, or the joint one). Thread-safety: takes `mutex` itself;
/// call it without it.
DumpRole settle_role(DumpLedger& ledger, std::mutex& mutex, std::condition_variable& cv, DumpEntry entry,
                     const FrozenHistory& h, int rank, DumpRequest& request);

}  // namespace oomflight
