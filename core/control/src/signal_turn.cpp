#include "signal_turn.hpp"

#include "oomflight/base/log.hpp"
#include "sigterm_plan.hpp"

namespace oomflight {

SignalTurn take_signals(DumpRequests& requests, const DumpLedger& ledger, SignalDumpLimiter& limiter,
                        std::chrono::milliseconds interval, bool usr1, bool term, bool leaving, bool dump_on_exit,
                        bool coordinated, HeadroomWatch* headroom) {
  SignalTurn turn;
  if (usr1 && take_dump_signal()) {
    if (!coordinated) {
      turn.usr1_alone = true;
    } else if (!requests.busy() && limiter.allow(interval)) {  // a dump asked for or under way covers it
      (void)requests.queue(signal_request(DumpKind::signal));
    }
  }
  if (term && take_exit_signal()) {
    // One dump per ending: the launcher's teardown SIGTERM after an exit dump this rank took part in, or while it
    // leaves at its normal end, ends the process with no second dump (a stray rank-local exit file beside the
    // archive, issue 29; over the store, a second exit dump per rank waited the whole deadline, issue 40).
    const SigtermPlan plan = plan_sigterm(ledger.exit_dumped(), leaving, dump_on_exit, coordinated);
    if (plan.exit_dump) (void)requests.queue(signal_request(DumpKind::exit));  // a request waiting covers it
    turn.end_why = plan.why;
  }
  // After SIGTERM's plan: an exit dump queued goes first. A crossing taken is queued at once (nothing is busy).
  if (headroom != nullptr && coordinated && !requests.busy() && headroom->pending()) {
    // On the watcher: nothing may escape into its thread (std::terminate would end the job). A crossing whose words
    // could not be made stays for a later turn; one whose freeze failed is said, not retried.
    try {
      if (auto request = headroom->take()) {
        try {
          (void)requests.queue(*request);
        } catch (const std::exception& e) {
          log().error("the headroom dump was not written: this rank's history could not be frozen ({})", e.what());
        }
      }
    } catch (const std::exception&) {
    }
  }
  return turn;
}

}  // namespace oomflight
