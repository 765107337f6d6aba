// SIGUSR1 asks for a dump of every rank (kind "signal"), as `kill -USR1 <pid>` of any one rank.
//
// The handler only sets a flag (async-signal-safe); the watcher thread sees it at its next poll (within
// OOMFLIGHT_POLL_INTERVAL), freezes this rank's history and becomes the dump's origin, so the training thread is
// never interrupted for more than the handler's one store. SIGUSR1's default action kills the process, so a job
// that relies on the default has none; a job (or a framework: PyTorch Lightning requeues SLURM jobs on SIGUSR1)
// that installed its own handler keeps it: the handler is installed only over the default, and a handler the job
// installs later replaces it.
#pragma once

#include <chrono>
#include <cstdint>

#include "oomflight/control/dump_request.hpp"
#include "sigterm_plan.hpp"

namespace oomflight {

/// A burst of SIGUSR1 (a script in a loop, a pkill per node) is one dump, not one archive per signal: allow() says
/// whether a signal that arrives now may start a dump (none within `interval` of the last one allowed; 0: all), and
/// logs the first one it skips and, at the next allowed one, how many it skipped. One caller at a time (a watcher).
class SignalDumpLimiter {
 public:
  bool allow(std::chrono::milliseconds interval);

 private:
  std::int64_t last_ns_ = 0;
  int skipped_ = 0;
};

/// Installs the handler when SIGUSR1 is at its default action. Returns whether it did. Call once per session.
bool install_dump_signal();

/// Puts the default action back if the handler installed is still oomflight's.
void uninstall_dump_signal();

/// The request a caught signal makes of a rank's dumps, in the same words over both transports: `DumpKind::signal`
/// for SIGUSR1 ("SIGUSR1 received"), `DumpKind::exit` for SIGTERM under OOMFLIGHT_DUMP_ON_EXIT ("SIGTERM received:
/// the job is being torn down"). Pure.
DumpRequest signal_request(DumpKind kind);

/// Whether SIGUSR1 arrived since the last call (and clears it). Thread-safe.
bool take_dump_signal();

/// OOMFLIGHT_DUMP_ON_EXIT: catches SIGTERM (a scheduler's or mpirun's teardown) when it is at its default action,
/// so that the watcher can write every rank's history (kind "exit") before the process ends. The handler only
/// sets a flag; once the dump is done, end_with_sigterm() puts the default back and raises SIGTERM again, so the
/// process ends as the sender meant. Returns whether it installed the handler.
bool install_exit_signal();

/// Puts SIGTERM's default action back if the handler installed is still oomflight's.
void uninstall_exit_signal();

/// Whether SIGTERM arrived since the last call (and clears it). Thread-safe.
bool take_exit_signal();

/// Restores SIGTERM's default action and sends SIGTERM to this process: it ends now, as it would have without
/// oomflight. Does not return when SIGTERM is delivered.
void end_with_sigterm();

/// Logs why this process ends on the SIGTERM it caught ("SIGTERM: <why>; ending the process as SIGTERM would"), in
/// the same words on both transports, then ends it as end_with_sigterm() does. The caller has told the other ranks
/// that this one leaves (no dump may wait for it). Does not return when SIGTERM is delivered.
void end_by_sigterm_saying(const char* why);

}  // namespace oomflight
