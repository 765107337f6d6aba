#include "dump_requests.hpp"

#include <string>
#include <utility>

#include "dump_executor.hpp"
#include "dump_outcome.hpp"
#include "oomflight/base/log.hpp"

namespace oomflight {

DumpRequests::DumpRequests(std::condition_variable& cv, const bool& stop, DumpLedger& ledger, Recorder& recorder,
                           Transport& transport, int rank, std::chrono::milliseconds dump_timeout)
    : cv_(cv),
      stop_(stop),
      ledger_(ledger),
      recorder_(recorder),
      transport_(transport),
      rank_(rank),
      dump_timeout_(dump_timeout) {}

std::optional<DumpResult> DumpRequests::request(std::unique_lock<std::mutex>& lock, const DumpRequest& request) {
  // The watcher is freezing this rank for a dump it did not ask for: whether that dump counts this rank as an
  // origin (its oom event is in the ring) is known after the freeze, a millisecond or two (DumpLedger::deciding).
  cv_.wait_for(lock, dump_timeout_, [&] { return stop_ || !ledger_.deciding(); });
  if (stop_) return std::nullopt;
  std::int64_t target = 0;
  const std::uint64_t ended_before = ledger_.ended();
  std::string say;
  // A request of this process that the watcher has not begun yet (another thread asked first): share its dump.
  const bool share = pending_.has_value() && !ledger_.under_way();
  const DumpLedger::Turn turn =
      share ? DumpLedger::Turn::covered : ledger_.join(request, recorder_.oom_events(), rank_, say);
  if (!say.empty()) log().error("{}", say);
  switch (turn) {
    case DumpLedger::Turn::answered:
      return await_joint(lock);  // that dump finished before the failing thread asked, on a loaded machine
    case DumpLedger::Turn::joins:
      // That dump began on another rank's trigger, and this rank's line named the failure from its oom event only:
      // the job's own words reach the user here, and the dump takes them (DumpLedger::words).
      cv_.notify_all();
      target = ledger_.number();
      break;
    case DumpLedger::Turn::covered:
      target = share ? number_ : ledger_.number();
      break;
    case DumpLedger::Turn::follows:
      // Its dump follows the one under way; the dump's origins stay for it when this rank's end of that dump says
      // so in time (the joint dump, docs/protocol.md).
      if (ledger_.kind_under_way() == DumpKind::oom) {
        log().warn("rank {}'s failure came after its history was frozen for the dump under way; a dump of its own "
                   "follows",
                   rank_);
      } else {
        log().warn("rank {} ran out of memory during a {} dump; a dump of its own follows", rank_,
                   dump_kind_name(ledger_.kind_under_way()));
      }
      if (pending_) {
        target = number_;  // another thread of this process asked for the dump that follows: share it
        break;
      }
      [[fallthrough]];
    case DumpLedger::Turn::asks: {
      // The reason first (before any step another rank could block), then the other ranks are told, then the
      // freeze: their freezes overlap this one's instead of following it (the freeze copies the whole ring: 1 to 2 ms
      // for 100,000 events). While a dump is under way the watcher tells them instead, with this one's dump.
      const std::int64_t batch = request.batch >= 0 ? request.batch : recorder_.batch();
      announce_dump(request, rank_, batch);
      const bool under_way = ledger_.under_way();
      const bool ask_now = !under_way && transport_.can_ask();
      number_ = under_way ? ledger_.number() + 1 : ledger_.number();
      target = number_;
      pending_.emplace();
      pending_->request = request;
      ready_ = false;  // another request shares it meanwhile; the watcher waits for the freeze (take_due)
      lock.unlock();
      const std::int64_t asked = ask_now ? transport_.ask_others(request, batch, target) : 0;
      FrozenHistory h = recorder_.freeze(request.device);
      h.batch = batch;
      lock.lock();
      pending_->history = std::move(h);
      pending_->asked = asked;
      ready_ = true;
      cv_.notify_all();
      transport_.wake_watcher();
      break;
    }
  }
  // Its dump ended: counted (the numbers moved past it), or not counted (the other ranks never heard of it), once no
  // request waits and none is under way.
  const auto ended = [&] {
    return ledger_.number() > target ||
           (ledger_.ended() > ended_before && !pending_.has_value() && !ledger_.under_way());
  };
  cv_.wait_for(lock, dump_timeout_ * 3, [&] { return stop_ || ended(); });
  if (ended()) return await_joint(lock);
  if (stop_ && pending_.has_value() && ready_ && number_ == target) {
    pending_.reset();  // the watcher stopped before it began the dump: the history is written alone
    return std::nullopt;
  }
  return gave_up_waiting(request.kind, dump_timeout_);
}

bool DumpRequests::queue(const DumpRequest& request) {
  if (busy()) return false;
  FrozenHistory h = recorder_.freeze(request.device);
  if (request.batch >= 0) h.batch = request.batch;  // a headroom dump: the batch of the crossing
  announce_dump(request, rank_, h.batch);
  pending_ = Pending{std::move(h), request, 0};
  ready_ = true;
  number_ = ledger_.number();
  return true;
}

std::optional<DumpRequests::Pending> DumpRequests::take_due(std::unique_lock<std::mutex>& lock) {
  if (!due()) return std::nullopt;
  // A request that is telling the other ranks (a store's round trip) freezes right after: a short wait.
  cv_.wait_for(lock, dump_timeout_, [&] { return ready_ || !pending_.has_value(); });
  if (!pending_.has_value() || !ready_) return std::nullopt;
  std::optional<Pending> taken;
  taken.swap(pending_);
  return taken;
}

DumpResult DumpRequests::await_joint(std::unique_lock<std::mutex>& lock) {
  switch (ledger_.await_joint(lock, cv_, stop_, dump_timeout_)) {
    case DumpLedger::Joint::never_started: log().warn("{}", kJointNeverStartedText); break;
    case DumpLedger::Joint::unfinished: return gave_up_waiting(ledger_.last_result().kind, dump_timeout_);
    default: break;
  }
  return ledger_.last_result();
}

}  // namespace oomflight
