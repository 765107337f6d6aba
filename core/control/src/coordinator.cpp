// The watcher's loop, one for both transports (coordinator.hpp).
#include "coordinator.hpp"

#include "oomflight/base/log.hpp"
#include "signal_turn.hpp"

namespace oomflight {

Coordinator::Coordinator(const Config& config, const RankIdentity& identity, Recorder& recorder,
                         const DumpExecutor& executor, HeadroomWatch* headroom)
    : config_(config),
      recorder_(recorder),
      requests_(cv_, stop_, ledger_, recorder, *this, identity.rank, config.dump_timeout),
      run_(config, identity, executor, ledger_, mutex_, cv_, stop_),
      headroom_(headroom) {}

void Coordinator::start_watcher() {
  watcher_ = std::thread([this] { watch(); });
}

void Coordinator::watch() {
  watch_until_stopped();
  {
    std::lock_guard lock(mutex_);
    watcher_exited_ = true;
  }
  cv_.notify_all();
}

bool Coordinator::claim_sigterm() {
  std::lock_guard lock(mutex_);
  if (!exiting_ || sigterm_claimed_) return false;
  sigterm_claimed_ = true;
  return true;
}

void Coordinator::take_signal_turn() {
  SignalTurn turn;
  {
    std::lock_guard lock(mutex_);
    const SignalFlags f = signal_flags();
    turn = take_signals(requests_, ledger_, signal_limiter_, config_.signal_dump_interval, f.usr1, f.term, f.leaving,
                        f.dump_on_exit, f.coordinated, f.headroom ? headroom_ : nullptr);
    if (turn.end_why != nullptr && !exiting_) {
      exiting_ = true;
      exit_why_ = turn.end_why;
    }
  }
  if (turn.usr1_alone) {
    log().warn("SIGUSR1 received, but this job's ranks did not agree at start: no dump of every rank");
  }
}

void Coordinator::watch_until_stopped() {
  for (;;) {
    // Sleep, not spin: an idle watcher costs one wake-up per poll interval. Whatever queues a request, sets stop_ or
    // a snapshot rings after setting it, and a ring outlives a wait that has not started yet, so none is missed. A
    // rank of this node that asks for a dump rings it too: the transport looks for that dump now, not at its pace.
    const WatcherDoorbell::Rings rings = doorbell_.wait(config_.poll_interval);
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      if (stop_) {
        // A request whose other ranks were told already: they are on their way into its dump. Run it (the
        // session's end waits for it, within its bound) rather than leave them to time out, where the transport
        // still can.
        if (!runs_asked_dump_after_stop() || !requests_.due_and_asked()) return;
        stopping = true;
      }
    }
    if (stopping) {
      (void)run_own_dump();
      return;  // a SIGTERM this watcher took is the session's end's to act on (claim_sigterm)
    }
    // The signals (SIGUSR1, SIGTERM, a headroom crossing) queue their dump for this turn.
    take_signal_turn();
    // This rank's own request first: its thread waits for it, whatever the transport's pace.
    if (!run_own_dump()) look_for_dump(rings);
    between_dumps();
    // SIGTERM: once what it queued (an exit dump, or a request's that waited), and what was due, is done, the process
    // ends as SIGTERM would, the others told first.
    bool end = false;
    const char* why = "";
    {
      std::lock_guard lock(mutex_);
      // Nothing due or under way: a request that can never become due (its dump did not count) holds no one up.
      // Claimed here or by the session's end (claim_sigterm), never by both: the others are told once.
      end = exiting_ && !sigterm_claimed_ && !requests_.due() && !ledger_.under_way();
      sigterm_claimed_ = sigterm_claimed_ || end;
      why = exit_why_;
    }
    if (end) {
      tell_left_on_signal();
      end_by_sigterm_saying(why);  // the process ends here
    }
  }
}

}  // namespace oomflight
