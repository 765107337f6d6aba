// The watcher's loop, one for both transports (coordinator.hpp).
#include "coordinator.hpp"

#include "oomflight/base/log.hpp"
#include "oomflight/record/clock.hpp"
#include "protocol_timing.hpp"
#include "signal_turn.hpp"

namespace oomflight {

Coordinator::Coordinator(const Config& config, const RankIdentity& identity, Recorder& recorder,
                         const DumpExecutor& executor, HeadroomWatch* headroom)
    : config_(config),
      identity_(identity),
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

bool Coordinator::sigterm_at_end() {
  // Taken first: SIGTERM's handler, where it is still installed, may have flagged one since the watcher's last turn.
  const bool late = take_exit_signal();
  std::lock_guard lock(mutex_);
  if (sigterm_claimed_ || (!late && !exiting_)) return false;
  sigterm_claimed_ = true;
  return true;
}

bool Coordinator::watcher_joined() {
  std::lock_guard lock(mutex_);
  return watcher_joined_;
}

std::optional<LeaveTally> Coordinator::leave_together() {
  const std::int64_t deadline = monotonic_ns() + to_ns(config_.dump_timeout);
  LeaveTally tally;
  LeaveStep step = LeaveStep::wait;
  try {
    say_ending();
    for (;;) {
      const std::optional<LeaveTally> now = leave_tally();
      if (!now) return std::nullopt;  // the watcher that keeps it stopped: nothing more to wait for
      tally = *now;
      step = next_leave_step(tally, monotonic_ns() >= deadline);
      if (step != LeaveStep::wait) break;
      await_leave_news(deadline);
    }
  } catch (const std::exception& e) {
    log().debug("the leave agreement at the end: {}", e.what());
    return std::nullopt;
  }
  if (step == LeaveStep::deadline) log().warn("{}", leaving_without_them_text(tally, config_.dump_timeout));
  if (step != LeaveStep::together) return std::nullopt;
  log().debug("every rank ended or left ({} of {} ended, {} gone): leaving",
              tally.ended ? std::to_string(*tally.ended) : std::string("all"), tally.world_size, tally.gone);
  return tally;
}

void Coordinator::stop_watching(bool after_dumps) {
  bool usr1 = false;
  bool term = false;
  {
    std::unique_lock lock(mutex_);
    if (after_dumps) {
      // The dump under way ends first, and one a request of this rank asked for once it is due: the watcher runs
      // both, each within its own bound (3 x OOMFLIGHT_DUMP_TIMEOUT from its start), the whole wait within two such
      // bounds. A request that is not due with no dump under way never becomes due here (the dump it follows did
      // not count: the store failed as it began) and holds nobody up, as at SIGTERM's end.
      const std::int64_t bound = 3 * to_ns(config_.dump_timeout);
      const std::int64_t cap = monotonic_ns() + 2 * bound;
      for (;;) {
        const std::int64_t until = ledger_.under_way() ? std::min(active_start_ns_ + bound, cap) : cap;
        const std::int64_t now = monotonic_ns();
        const bool dump_to_end = ledger_.under_way() || requests_.due();
        if (!dump_to_end || watcher_exited_ || now >= until) break;
        cv_.wait_for(lock, std::chrono::nanoseconds(until - now));
      }
    }
    stop_ = true;
    usr1 = usr1_handler_;
    usr1_handler_ = false;
    // SIGTERM's handler stays while a SIGTERM it took is still to end the process: a second one then ends it, as
    // the first one meant, once the others are told (sigterm_at_end).
    term = term_handler_ && !exiting_;
    term_handler_ = term_handler_ && exiting_;
  }
  if (usr1) uninstall_dump_signal();
  if (term) uninstall_exit_signal();
  doorbell_.ring();
  cv_.notify_all();
}

bool Coordinator::join_watcher(std::optional<std::chrono::nanoseconds> bound) {
  if (!watcher_.joinable()) return watcher_joined();
  if (watcher_.get_id() == std::this_thread::get_id()) {
    watcher_.detach();
    return false;
  }
  std::unique_lock lock(mutex_);
  if (!bound) {
    // A watcher inside a dump may be blocked in a call that a stalled or dead rank never lets finish: it is waited
    // for only until the dump's own bound, then left behind, so that the job's own error ends the process instead
    // of oomflight keeping it alive.
    const std::int64_t left_ns = ledger_.under_way()
                                     ? active_start_ns_ + 3 * to_ns(config_.dump_timeout) - monotonic_ns()
                                     : to_ns(config_.dump_timeout);
    bound = std::chrono::nanoseconds(std::max<std::int64_t>(left_ns, 0)) + config_.poll_interval * 2;
  }
  const bool exited = cv_.wait_for(lock, *bound, [&] { return watcher_exited_; });
  lock.unlock();
  if (!exited) {
    watcher_.detach();
    return false;
  }
  watcher_.join();
  lock.lock();
  watcher_joined_ = true;
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
      return;  // a SIGTERM this watcher took is the session's end's to act on (sigterm_at_end)
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
      // Claimed here or by the session's end (sigterm_at_end), never by both: the others are told once.
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

bool Coordinator::enter_dump(std::optional<DumpKind> heard, std::int64_t number) {
  std::int64_t start = 0;
  DumpEntry entry = DumpEntry::heard;
  DumpRequest request;
  FrozenHistory h;
  std::int64_t asked = 0;
  std::int64_t joint_batch = -1;
  int device = -1;
  std::int64_t n = 0;
  {
    std::unique_lock lock(mutex_);
    if ((stop_ && !runs_asked_dump_after_stop()) || ledger_.under_way()) return false;
    if (auto mine = requests_.take_due(lock)) {
      // This rank's own request first, even when another rank's dump was heard: it is that dump (the numbers are
      // alike), and this rank is its origin.
      entry = DumpEntry::asked;
      asked = mine->asked;
      h = std::move(mine->history);
      request = std::move(mine->request);
      ledger_.begin(request.kind);
    } else if (!heard || stop_ || (number >= 0 && number != ledger_.number())) {
      return false;  // nothing due, nothing heard, or what was heard is over (take_due may have waited)
    } else if (ledger_.joint_expected() && *heard == DumpKind::oom && heard_is_joint()) {
      // The joint dump: this rank was an origin of the dump that a late failure asked to join. It is an origin of
      // this one too, with the same reason, figures and batch, and its archive replaces the one it just wrote. The
      // ledger says so first: only a rank that heard the late failure in time holds the request it rejoins with
      // (issue 40: the store's rule trusted the late origin's cause alone, MPI's the ledger alone); and the
      // transport, where its message can tell, that the dump heard is that one (heard_is_joint).
      entry = DumpEntry::rejoined;
      request = ledger_.joint_request();
      joint_batch = ledger_.joint_batch();
      ledger_.begin(DumpKind::oom);
    } else {
      ledger_.begin(*heard);
    }
    // The dump's bounds count from here, after take_due's wait for a request still telling the others.
    start = monotonic_ns();
    active_start_ns_ = start;
    n = ledger_.number();
    device = freeze_device(entry, ledger_);
  }
  DumpTimeline timeline;
  const DumpKind kind = entry == DumpEntry::asked ? request.kind : entry == DumpEntry::rejoined ? DumpKind::oom : *heard;
  // From here this thread owns the dump: whatever throws, the dump ends, or every later request of this rank would
  // wait for it.
  try {
    if (entry != DumpEntry::asked) {
      h = recorder_.freeze(device);
      if (entry == DumpEntry::rejoined) h.batch = joint_batch;
    }
    const DumpRole role = settle_role(ledger_, mutex_, cv_, entry, h, identity_.rank, request);
    timeline.mark("freeze");
    const bool counted = tell_others(entry, role.through_event, asked, h, request);
    timeline.mark("triggers");
    // A dump the others never heard of (the store failed at its trigger) does not count: the ranks' numbers stay
    // alike.
    finish_dump(run_.run(*this, h, role.origin, std::move(request), start, timeline), counted);
  } catch (const std::exception& e) {
    dump_threw();
    DumpResult r;
    r.kind = kind;
    r.error = e.what();
    log().error("dump {} failed on this rank: {}", n, e.what());
    finish_dump(std::move(r), true);
  }
  return true;
}

void Coordinator::finish_dump(DumpResult result, bool counted) {
  {
    std::lock_guard lock(mutex_);
    ledger_.finish(std::move(result), counted);
    dump_ended();
  }
  cv_.notify_all();
}

}  // namespace oomflight
