#include "dump_ledger.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace oomflight {

void DumpLedger::begin(DumpKind kind) {
  kind_ = kind;
  under_way_ = true;
  deciding_ = true;
  origin_ = false;
}

void DumpLedger::finish(DumpResult result, bool counted) {
  exit_dumped_ = exit_dumped_ || result.kind == DumpKind::exit;
  last_result_ = std::move(result);
  under_way_ = false;
  deciding_ = false;
  origin_ = false;
  awaiting_words_ = false;
  words_.reset();
  if (counted) ++number_;
  ++ended_;
  if (joint_expected_ && number_ > joint_after_ + 1) joint_expected_ = false;  // the joint dump is over
}

void DumpLedger::asked(std::uint64_t oom_events) {
  oom_events_covered_ = std::max(oom_events_covered_, oom_events);
  unclaimed_oom_events_ = 0;
  origin_ = true;
}

void DumpLedger::rejoined(std::uint64_t oom_events) {
  oom_events_covered_ = std::max(oom_events_covered_, oom_events);
  origin_ = true;
}

bool DumpLedger::origin_through_event(std::uint64_t oom_events) {
  // An oom event in a dump of another kind is no origin of it: the failure's own oom dump follows (join), and the
  // headroom archive does not call the failing rank one that crossed its threshold.
  const bool origin = kind_ == DumpKind::oom && oom_events > oom_events_covered_;
  origin_ = origin;
  if (origin) oom_events_covered_ = oom_events;
  // A request of the failing thread that comes after this dump finished finds its failure in it (answered()).
  unclaimed_oom_events_ = origin ? oom_events : 0;
  awaiting_words_ = origin;
  return origin;
}

std::string DumpLedger::offer(const DumpRequest& request, int rank) {
  if (request.kind == DumpKind::oom) {
    unclaimed_oom_events_ = 0;  // the dump under way answers it
    // Kept even before the dump awaits them: the store transport's watcher decides after its freeze.
    if (!words_) words_ = request;
  }
  if (request.reason.empty()) return {};
  return fmt::format("rank {} reports, in the dump under way: {}", rank, request.reason);
}

DumpLedger::Turn DumpLedger::join(const DumpRequest& request, std::uint64_t oom_events_now, int rank,
                                  std::string& say) {
  say.clear();
  if (under_way_) {
    // A failure during a dump of another kind (this rank crossed its headroom threshold, or asked on a signal, and
    // then ran out of memory) is no part of it: its own oom dump follows, kind oom, naming it for its failure.
    if (kind_ != DumpKind::oom && request.kind == DumpKind::oom) {
      failed_late();
      return Turn::follows;
    }
    if (origin_) {
      say = offer(request, rank);
      return Turn::joins;
    }
    // Not an origin of it (or not known yet: deciding_). A failure is this rank's own dump, after this one: the
    // freeze that made this rank no origin did not hold it (on a GPU its oom event came after the freeze; without
    // the allocator's hooks, a CPU job's, there is no event at all, and the request is the failure). Anything else
    // (the API's dump, a signal's) is answered by the dump under way, which holds every rank's history: a second
    // archive would hold the same.
    if (!deciding_ && request.kind == DumpKind::oom) {
      failed_late();
      return Turn::follows;
    }
    say = offer(request, rank);
    return Turn::covered;
  }
  return answered(request, oom_events_now, rank, say) ? Turn::answered : Turn::asks;
}

bool DumpLedger::answered(const DumpRequest& request, std::uint64_t oom_events_now, int rank, std::string& say) {
  say.clear();
  if (request.kind != DumpKind::oom || unclaimed_oom_events_ == 0 || oom_events_now != unclaimed_oom_events_) {
    return false;
  }
  unclaimed_oom_events_ = 0;
  if (!request.reason.empty()) say = fmt::format("rank {} reports, after the dump that holds its failure: {}", rank,
                                                 request.reason);
  return true;
}

std::optional<DumpRequest> DumpLedger::words(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                                             const bool& stop, std::chrono::milliseconds dump_timeout) {
  if (!awaiting_words_) return std::nullopt;
  // The dump's own file (or safety copy) is written already, and every other rank waits for this one meanwhile:
  // a little, not a deadline.
  const auto bound = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(200), dump_timeout / 4);
  cv.wait_for(lock, bound, [&] { return stop || words_.has_value(); });
  awaiting_words_ = false;
  std::optional<DumpRequest> r;
  r.swap(words_);
  return r;
}

void DumpLedger::expect_joint(const DumpRequest& request, std::int64_t batch, std::string path) {
  joint_expected_ = true;
  joint_after_ = number_;
  joint_request_ = request;
  joint_batch_ = batch;
  joint_path_ = std::move(path);
}

DumpLedger::Joint DumpLedger::await_joint(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                                          const bool& stop, std::chrono::milliseconds dump_timeout) {
  if (!joint_expected_) return Joint::not_expected;
  for (;;) {
    const std::int64_t joint = joint_after_ + 1;
    const bool started = cv.wait_for(lock, dump_timeout, [&] {
      return stop || number_ > joint || (under_way_ && number_ == joint);
    });
    if (!started || (stop && number_ <= joint && !under_way_)) {
      joint_expected_ = false;  // a later dump is not a joint one
      return started ? Joint::stopped : Joint::never_started;
    }
    const bool ended = cv.wait_for(lock, dump_timeout * 3, [&] { return stop || number_ > joint; });
    if (number_ <= joint) return ended ? Joint::stopped : Joint::unfinished;
    // A rank failed during the joint dump too: its dump names this rank again and replaces the joint archive, so
    // this rank's request waits for that one as well (returning first would end the job before it).
    if (!stop && joint_expected_ && joint_after_ + 1 > joint) continue;
    return Joint::finished;
  }
}

}  // namespace oomflight
