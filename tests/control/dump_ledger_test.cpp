// DumpLedger (dump_ledger.hpp): the record of one rank's dumps and the rules on it that the MPI transport and the
// job's store both keep (issue 40, item 1). The transports' own tests run these rules through real jobs
// (StoreJoin, the MPI protocol tests, python.transport_parity); here each rule is pinned on its own, with the
// interleavings a real job makes rare.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "../../core/control/src/dump_ledger.hpp"

namespace oomflight {
namespace {

using namespace std::chrono_literals;

DumpRequest oom_request(const std::string& reason) {
  DumpRequest r;
  r.kind = DumpKind::oom;
  r.reason = reason;
  return r;
}

DumpResult archive(const std::string& path, DumpKind kind = DumpKind::oom) {
  DumpResult r;
  r.status = DumpResult::Status::archive;
  r.kind = kind;
  r.path = path;
  return r;
}

// A ledger under its transport's mutex, as the transports hold it.
class DumpLedgerTest : public testing::Test {
 protected:
  DumpLedger ledger;
  std::mutex m;
  std::condition_variable cv;
  bool stop = false;
};

TEST(DumpLedger, NumbersMoveOnOnlyForDumpsTheOtherRanksHeardOf) {
  DumpLedger ledger;
  EXPECT_EQ(ledger.number(), 0);
  ledger.begin();
  EXPECT_TRUE(ledger.under_way());
  ledger.finish(archive("a.h5"));
  EXPECT_FALSE(ledger.under_way());
  EXPECT_EQ(ledger.number(), 1);
  EXPECT_EQ(ledger.last_result().path, "a.h5");
  ledger.begin();
  ledger.finish(DumpResult{}, /*counted=*/false);  // its trigger reached nobody
  EXPECT_EQ(ledger.number(), 1);
  EXPECT_FALSE(ledger.exit_dumped());
  ledger.begin();
  ledger.finish(archive("exit.h5", DumpKind::exit));
  EXPECT_TRUE(ledger.exit_dumped());
  ledger.begin();
  ledger.finish(archive("b.h5"));
  EXPECT_TRUE(ledger.exit_dumped()) << "one dump per ending: a later dump does not undo it";
}

TEST(DumpLedger, AnUnreportedOomEventMakesARankAnOriginOnceAndItsLaterRequestIsAnswered) {
  DumpLedger ledger;
  ledger.begin();
  EXPECT_TRUE(ledger.origin_through_event(1));
  ledger.finish(archive("a.h5"));
  std::string say;
  // The failing thread asks after that dump ended (a loaded machine): the dump is its answer, and its words are said.
  EXPECT_TRUE(ledger.answered(oom_request("CUDA out of memory"), 1, 0, say));
  EXPECT_EQ(say, "rank 0 reports, after the dump that holds its failure: CUDA out of memory");
  EXPECT_FALSE(ledger.answered(oom_request("again"), 1, 0, say)) << "answered once, not twice";

  // The same event seen by a second dump does not make the rank an origin again.
  ledger.begin();
  EXPECT_FALSE(ledger.origin_through_event(1));
  ledger.finish(archive("b.h5"));
  EXPECT_FALSE(ledger.answered(oom_request(""), 1, 0, say));
}

TEST(DumpLedger, ANewOomEventAfterTheDumpIsNotAnsweredByIt) {
  DumpLedger ledger;
  ledger.begin();
  ASSERT_TRUE(ledger.origin_through_event(2));
  ledger.finish(archive("a.h5"));
  std::string say;
  EXPECT_FALSE(ledger.answered(oom_request("x"), 3, 1, say)) << "its failure came after: a dump of its own";
  EXPECT_TRUE(ledger.unreported(3));
  EXPECT_FALSE(ledger.unreported(2));
  DumpRequest signal;
  signal.kind = DumpKind::signal;
  EXPECT_FALSE(ledger.answered(signal, 2, 1, say)) << "only an oom request is answered by an oom dump";
}

TEST_F(DumpLedgerTest, ARankThatAskedIsNoOriginThroughItsEventAndAwaitsNoWords) {
  ledger.begin();
  ledger.asked(4);
  EXPECT_FALSE(ledger.unreported(4));
  std::unique_lock lock(m);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(ledger.words(lock, cv, stop, 60s).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s) << "no wait at all when no words are awaited";
}

TEST_F(DumpLedgerTest, TheDumpTakesTheFailingThreadsWordsWhenTheyComeInTime) {
  {
    std::lock_guard lock(m);
    ledger.begin();
    ASSERT_TRUE(ledger.origin_through_event(1));
  }
  std::thread failing([&] {
    std::lock_guard lock(m);
    EXPECT_EQ(ledger.offer(oom_request("Tried to allocate 2.00 GiB"), 3),
              "rank 3 reports, in the dump under way: Tried to allocate 2.00 GiB");
    cv.notify_all();
  });
  std::optional<DumpRequest> words;
  {
    std::unique_lock lock(m);
    // The offer may come before the wait or during it; a generous bound, so that a loaded machine still passes.
    words = ledger.words(lock, cv, stop, 3600s);
  }
  failing.join();
  if (words) {
    EXPECT_EQ(words->reason, "Tried to allocate 2.00 GiB");
  } else {
    GTEST_SKIP() << "the failing thread did not run within 200 ms on this machine";
  }
  // Answered by this dump: no second one for the same failure.
  std::lock_guard lock(m);
  ledger.finish(archive("a.h5"));
  std::string say;
  EXPECT_FALSE(ledger.answered(oom_request("x"), 1, 3, say));
}

TEST_F(DumpLedgerTest, WordsOfferedBeforeTheFreezeDecidedAreKeptForTheDump) {
  // The store transport's watcher decides after its freeze; a request that came during the freeze offered first.
  std::unique_lock lock(m);
  ledger.begin();
  EXPECT_EQ(ledger.offer(oom_request(""), 0), "") << "no words, nothing to say";
  ledger.finish(archive("a.h5"));
  ledger.begin();
  (void)ledger.offer(oom_request("first"), 0);
  (void)ledger.offer(oom_request("second"), 0);
  ASSERT_TRUE(ledger.origin_through_event(1));
  const auto words = ledger.words(lock, cv, stop, 60s);
  ASSERT_TRUE(words.has_value());
  EXPECT_EQ(words->reason, "first");
  EXPECT_FALSE(ledger.words(lock, cv, stop, 60s).has_value()) << "taken once";
}

TEST(DumpLedger, AFailureDuringADumpIsSaidOfThatDumpOnly) {
  DumpLedger ledger;
  ledger.begin();
  ledger.failed_late();
  EXPECT_TRUE(ledger.failed_late_in(0));
  ledger.finish(archive("a.h5"));
  EXPECT_TRUE(ledger.failed_late_in(0));
  EXPECT_FALSE(ledger.failed_late_in(1));
}

TEST(DumpLedger, AnOomRequestAfterALateFailureInAnOomArchiveAsksForTheJointDump) {
  DumpLedger ledger;
  ledger.begin(DumpKind::oom);
  ledger.failed_late();
  EXPECT_FALSE(ledger.asks_joint(DumpKind::oom)) << "dump 0 is still under way: its end says the failure first";
  ledger.finish(archive("a.h5"));
  EXPECT_TRUE(ledger.asks_joint(DumpKind::oom));
  EXPECT_FALSE(ledger.asks_joint(DumpKind::signal)) << "only the failure's own oom request joins the origins";
  ledger.begin(DumpKind::oom);
  ledger.finish(archive("a.h5"));  // the joint dump: after it, a request is a dump of its own again
  EXPECT_FALSE(ledger.asks_joint(DumpKind::oom));
}

TEST(DumpLedger, ALateFailureInADumpWithoutAnArchiveOrOfAnotherKindAsksForADumpOfItsOwn) {
  DumpLedger headroom;
  headroom.begin(DumpKind::headroom);
  headroom.failed_late();
  headroom.finish(archive("h.h5", DumpKind::headroom));
  EXPECT_FALSE(headroom.asks_joint(DumpKind::oom));
  DumpLedger fallback;
  fallback.begin(DumpKind::oom);
  fallback.failed_late();
  DumpResult rank_local;
  rank_local.kind = DumpKind::oom;
  rank_local.status = DumpResult::Status::rank_local;
  fallback.finish(rank_local);
  EXPECT_FALSE(fallback.asks_joint(DumpKind::oom));
}

TEST(DumpLedger, AFailureSaidLateOnlyWhileTheDumpsEndHasNotSaidItYet) {
  DumpLedger ledger;
  ledger.begin();
  ledger.failed_late();
  EXPECT_TRUE(ledger.says_late());
  ledger.finish(archive("a.h5"));
  ledger.begin();
  EXPECT_FALSE(ledger.says_late()) << "dump 1's end: no failure yet";
  ledger.failed_late();  // after that end: the origins are gone, so the failure's own dump is not a joint one
  EXPECT_FALSE(ledger.failed_late_in(1));
}

// join(): what a request does, the one rule both transports carry out.
TEST(DumpLedger, ARequestAsksForADumpWhenNoneIsUnderWayAndNoneHoldsItsFailure) {
  DumpLedger ledger;
  std::string say = "stale";
  EXPECT_EQ(ledger.join(oom_request("torch.OutOfMemoryError"), 1, 2, say), DumpLedger::Turn::asks);
  EXPECT_EQ(say, "");
}

TEST(DumpLedger, ARequestJoinsTheDumpUnderWayThatCountsItsRankAnOrigin) {
  DumpLedger ledger;
  std::string say;
  ledger.begin();
  EXPECT_TRUE(ledger.deciding()) << "until the freeze says whether this rank is an origin";
  EXPECT_FALSE(ledger.origin_of_under_way());
  ASSERT_TRUE(ledger.origin_through_event(1));  // another rank's trigger reached the watcher first
  ledger.decided();
  EXPECT_TRUE(ledger.origin_of_under_way());
  EXPECT_EQ(ledger.join(oom_request("torch.OutOfMemoryError: CUDA out of memory"), 1, 3, say),
            DumpLedger::Turn::joins);
  EXPECT_EQ(say, "rank 3 reports, in the dump under way: torch.OutOfMemoryError: CUDA out of memory");
  EXPECT_FALSE(ledger.failed_late_in(0));
  ledger.finish(archive("a.h5"));
  EXPECT_FALSE(ledger.origin_of_under_way());
  EXPECT_EQ(ledger.join(oom_request("again"), 1, 3, say), DumpLedger::Turn::asks)
      << "its failure was offered to the dump under way: no later request is answered by that dump";
}

TEST(DumpLedger, AnOomRequestWhoseFailureCameAfterTheFreezeFollowsTheDumpUnderWay) {
  DumpLedger ledger;
  std::string say;
  ledger.begin();
  EXPECT_FALSE(ledger.origin_through_event(0));  // no oom event in this rank's freeze: another rank's dump
  ledger.decided();
  EXPECT_EQ(ledger.join(oom_request("torch.OutOfMemoryError"), 1, 1, say), DumpLedger::Turn::follows);
  EXPECT_EQ(say, "");
  EXPECT_TRUE(ledger.says_late()) << "its end asks the dump's origins to stay (the joint dump)";
  ledger.finish(archive("oom.0.h5"));
  ledger.begin();
  EXPECT_FALSE(ledger.origin_through_event(0));
  ledger.decided();
  EXPECT_EQ(ledger.join(oom_request("a CPU job's failure: no allocator event"), 0, 1, say), DumpLedger::Turn::follows)
      << "a request with no oom event is the failure itself";
}

TEST(DumpLedger, AFailureDuringADumpOfAnotherKindIsNoOriginOfItAndGetsADumpOfItsOwn) {
  // Issue 42: a headroom dump comes a few batches before the OOM. A rank whose oom event is in its freeze for it is
  // no origin of it (the archive would call it a rank that crossed the threshold); the failing thread's request
  // follows, and so does that of the rank that crossed and then failed. Nobody stays for a joint dump: the next
  // archive is an oom archive of its own.
  DumpLedger ledger;
  std::string say;
  ledger.begin(DumpKind::headroom);
  EXPECT_EQ(ledger.kind_under_way(), DumpKind::headroom);
  EXPECT_FALSE(ledger.origin_through_event(1)) << "an unreported oom event, in a headroom dump";
  ledger.decided();
  EXPECT_EQ(ledger.join(oom_request("torch.OutOfMemoryError"), 1, 2, say), DumpLedger::Turn::follows);
  ledger.finish(archive("headroom.4.h5", DumpKind::headroom));
  ledger.begin(DumpKind::oom);
  EXPECT_TRUE(ledger.origin_through_event(1)) << "the same event, in the oom dump that follows: an origin of it";
  ledger.decided();
  ledger.finish(archive("oom.5.h5"));

  DumpLedger crossed;  // the rank that asked for the headroom dump, then failed during it
  crossed.begin(DumpKind::headroom);
  crossed.asked(0);
  crossed.decided();
  EXPECT_TRUE(crossed.origin_of_under_way());
  EXPECT_EQ(crossed.join(oom_request("torch.OutOfMemoryError"), 1, 2, say), DumpLedger::Turn::follows)
      << "its failure is no part of the headroom archive";
  DumpRequest signal;
  signal.kind = DumpKind::signal;
  EXPECT_EQ(crossed.join(signal, 1, 2, say), DumpLedger::Turn::joins) << "anything else joins, as before";
}

TEST(DumpLedger, AnythingElseDuringADumpIsCoveredByIt) {
  DumpLedger ledger;
  std::string say;
  ledger.begin();
  EXPECT_FALSE(ledger.origin_through_event(0));
  ledger.decided();
  DumpRequest asked;  // the API's dump (oomflight.dump()), or SIGUSR1's
  asked.kind = DumpKind::signal;
  asked.reason = "asked by the job";
  EXPECT_EQ(ledger.join(asked, 0, 1, say), DumpLedger::Turn::covered);
  EXPECT_EQ(say, "rank 1 reports, in the dump under way: asked by the job");
  DumpRequest exit;
  exit.kind = DumpKind::exit;
  EXPECT_EQ(ledger.join(exit, 0, 1, say), DumpLedger::Turn::covered) << "one dump per ending";
  EXPECT_FALSE(ledger.says_late());
}

TEST(DumpLedger, ARequestWhileTheDumpIsStillDecidingIsCoveredNotASecondDump) {
  // The transports wait for decided() first, within a bound; past it the request is not a second dump.
  DumpLedger ledger;
  std::string say;
  ledger.begin();
  EXPECT_EQ(ledger.join(oom_request("words"), 1, 0, say), DumpLedger::Turn::covered);
  ASSERT_TRUE(ledger.origin_through_event(1));  // ... and its words are kept for the dump
  ledger.decided();
  ledger.finish(archive("a.h5"));
  EXPECT_FALSE(ledger.says_late());
}

TEST(DumpLedger, AFinishedDumpThatHoldsTheFailureAnswersItsLateRequest) {
  DumpLedger ledger;
  std::string say;
  ledger.begin();
  ASSERT_TRUE(ledger.origin_through_event(1));
  ledger.decided();
  ledger.finish(archive("oom.0.h5"));
  EXPECT_EQ(ledger.join(oom_request("torch.OutOfMemoryError"), 1, 2, say), DumpLedger::Turn::answered);
  EXPECT_EQ(say, "rank 2 reports, after the dump that holds its failure: torch.OutOfMemoryError");
  EXPECT_EQ(ledger.last_result().path, "oom.0.h5");
}

TEST_F(DumpLedgerTest, TheJointDumpIsAwaitedAndThenNoLongerExpected) {
  DumpRequest asked = oom_request("rank 0's words");
  {
    std::lock_guard lock(m);
    ledger.begin();
    ledger.asked(1);
    ledger.expect_joint(asked, 7, "oom.0.h5");
    ledger.finish(archive("oom.0.h5"));
    ASSERT_TRUE(ledger.joint_expected());
    EXPECT_EQ(ledger.joint_request().reason, "rank 0's words");
    EXPECT_EQ(ledger.joint_batch(), 7);
    EXPECT_EQ(ledger.joint_path(), "oom.0.h5");
  }
  std::thread joint([&] {
    std::lock_guard lock(m);
    ledger.begin();  // the late rank's dump, this rank an origin of it too
    ledger.rejoined(1);
    cv.notify_all();
  });
  std::thread end([&] {
    for (;;) {
      {
        std::lock_guard lock(m);
        if (ledger.under_way()) {
          ledger.finish(archive("oom.0.h5 (joint)"));
          cv.notify_all();
          return;
        }
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  DumpLedger::Joint how;
  {
    std::unique_lock lock(m);
    how = ledger.await_joint(lock, cv, stop, 3600s);
    EXPECT_EQ(ledger.last_result().path, "oom.0.h5 (joint)");
    EXPECT_FALSE(ledger.joint_expected()) << "over: the next dump is not a joint one";
  }
  joint.join();
  end.join();
  // The joint dump may also have begun and ended before the wait began (then no longer expected): either way the
  // answer is the joint dump's result, as asserted above.
  EXPECT_TRUE(how == DumpLedger::Joint::finished || how == DumpLedger::Joint::not_expected) << static_cast<int>(how);
  std::unique_lock lock(m);
  EXPECT_EQ(ledger.await_joint(lock, cv, stop, 3600s), DumpLedger::Joint::not_expected);
}

TEST_F(DumpLedgerTest, AJointDumpThatAnotherLateFailureExtendsIsAwaitedToTheEnd) {
  // Dump 0 (this rank an origin), the joint dump 1 of a late rank, and during it a third rank fails late: its dump 2
  // replaces the joint archive and names this rank again. This rank's request returns only after dump 2 (before
  // issue 40's review it returned after dump 1, and its failing thread's error began the job's teardown during 2).
  {
    std::lock_guard lock(m);
    ledger.begin();
    ledger.asked(1);
    ledger.expect_joint(oom_request("rank 0's words"), 7, "oom.0.h5");
    ledger.finish(archive("oom.0.h5"));
  }
  std::thread watcher([&] {
    const auto step = [&](const std::function<void()>& f) {
      {
        std::lock_guard lock(m);
        f();
      }
      cv.notify_all();
      std::this_thread::sleep_for(1ms);  // the waiter may look between any two steps
    };
    step([&] { ledger.begin(); });
    step([&] { ledger.rejoined(1); });
    step([&] { ledger.expect_joint(ledger.joint_request(), 7, "oom.0.h5"); });  // a third rank said late
    step([&] { ledger.finish(archive("oom.0.h5 (joint)")); });
    step([&] { ledger.begin(); });
    step([&] { ledger.rejoined(1); });
    step([&] { ledger.finish(archive("oom.0.h5 (second joint)")); });
  });
  DumpLedger::Joint how;
  std::string answer;
  {
    std::unique_lock lock(m);
    how = ledger.await_joint(lock, cv, stop, 3600s);
    answer = ledger.last_result().path;
  }
  watcher.join();
  // A waiter that only got the lock after every step finds the joint dumps over (not expected): the answer is the
  // same either way.
  EXPECT_TRUE(how == DumpLedger::Joint::finished || how == DumpLedger::Joint::not_expected) << static_cast<int>(how);
  EXPECT_EQ(answer, "oom.0.h5 (second joint)");
  std::unique_lock lock(m);
  EXPECT_FALSE(ledger.joint_expected()) << "over: the next dump is not a joint one";
}

TEST_F(DumpLedgerTest, AJointDumpThatNeverStartsIsGivenUpAfterTheTimeout) {
  std::unique_lock lock(m);
  ledger.begin();
  ledger.expect_joint(oom_request("x"), 0, "oom.0.h5");
  ledger.finish(archive("oom.0.h5"));
  EXPECT_EQ(ledger.await_joint(lock, cv, stop, 20ms), DumpLedger::Joint::never_started);
  EXPECT_FALSE(ledger.joint_expected()) << "the late rank died: a later dump is not a joint one";
  ledger.begin();
  ledger.expect_joint(oom_request("y"), 0, "oom.1.h5");
  ledger.finish(archive("oom.1.h5"));
  stop = true;
  EXPECT_EQ(ledger.await_joint(lock, cv, stop, 3600s), DumpLedger::Joint::stopped);
}

}  // namespace
}  // namespace oomflight
