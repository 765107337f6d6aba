// The signals' turn in a transport's watcher loop, one rule for both (internal to the control wing; docs/protocol.md,
// "On demand: SIGUSR1", "At exit" and "Before the OOM: the headroom dump"): SIGUSR1 queues a signal dump of every
// rank (one per OOMFLIGHT_SIGNAL_DUMP_INTERVAL, none while a dump is asked for or under way), and a caught SIGTERM is
// planned by plan_sigterm (an exit dump first, once per ending, or none) and then ends the process once the watcher
// has run what is queued. A headroom crossing (headroom_watch.hpp) waits for this turn like a signal.
//
// Issue 40: each watcher took the signals in its own loop (the MPI one with an `exiting_` flag, the store one in
// `end_on_sigterm` / `dump_on_sigusr1`), with the same rules written twice.
#pragma once

#include <chrono>

#include "dump_ledger.hpp"
#include "dump_requests.hpp"
#include "dump_signal.hpp"
#include "headroom_watch.hpp"

namespace oomflight {

/// What the watcher does after this turn's signals.
struct SignalTurn {
  /// SIGUSR1 came but the ranks do not coordinate their dumps (the store's start-up agreement said off): nothing
  /// was queued, and the transport says so.
  bool usr1_alone = false;
  /// SIGTERM came: the process ends as SIGTERM would, with these words (end_by_sigterm_saying), once the watcher has
  /// run the dump queued (an exit dump, or a request's that waited) and told the other ranks it leaves. nullptr: no
  /// SIGTERM.
  const char* end_why = nullptr;
};

/// The watcher's turn, with the transport's mutex held. `usr1` / `term`: the transport installed oomflight's SIGUSR1
/// / SIGTERM handler; `leaving`: this rank is leaving at its normal end (or left); `dump_on_exit`:
/// OOMFLIGHT_DUMP_ON_EXIT; `coordinated`: the ranks agreed to coordinate their dumps. Queues on `requests` what the
/// signals ask for (DumpRequests::queue); `limiter` and `interval` bound SIGUSR1's bursts. Then, when `headroom` (may
/// be null) holds a crossing, the ranks coordinate and nothing else is asked for or under way, it queues that
/// crossing's headroom dump (else the crossing waits for a later turn: an exit dump or a signal's goes first).
SignalTurn take_signals(DumpRequests& requests, const DumpLedger& ledger, SignalDumpLimiter& limiter,
                        std::chrono::milliseconds interval, bool usr1, bool term, bool leaving, bool dump_on_exit,
                        bool coordinated, HeadroomWatch* headroom);

}  // namespace oomflight
