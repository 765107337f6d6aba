// analyze_collectives and its sentences on archives built in memory: every case the report must tell apart.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "oomflight/analysis/collectives.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t kWorld = 0x6f6f6d776f726c64ull;

struct Builder {
  Archive a;
  explicit Builder(int ranks, std::vector<int> origins = {}) {
    a.header.kind = "oom";
    for (int r = 0; r < ranks; ++r) {
      RankRow row;
      row.rank = r;
      row.batch = 5;
      row.freeze_t_ns = 1'000'000'000;
      row.is_origin = std::find(origins.begin(), origins.end(), r) != origins.end() ? 1 : 0;
      a.ranks.push_back(row);
      CommunicatorRow c;
      c.rank = r;
      c.comm_rank = r;
      c.comm_size = ranks;
      c.comm_id = kWorld;
      set_fixed_string(c.name, "world");
      a.communicators.push_back(c);
    }
  }
  // Records are added rank after rank, as the archive groups them.
  Builder& op(int rank, std::uint64_t seq, bool ended, CollectiveOp op = CollectiveOp::allreduce,
              std::uint8_t end_flags = 0, std::uint64_t comm = kWorld) {
    CollectiveRow r;
    r.rank = rank;
    r.comm_id = comm;
    r.seq = seq;
    r.op = op;
    r.bytes = 8 << 20;
    r.batch = static_cast<std::int64_t>(seq);
    r.t_ns = 1000 + static_cast<std::int64_t>(seq) * 100;
    a.collectives.push_back(r);
    if (ended) {
      r.phase = CollectivePhase::end;
      r.t_ns += 50;
      r.flags = end_flags;
      a.collectives.push_back(r);
    }
    return *this;
  }
};

TEST(Collectives, TheRanksThatWaitAndTheOriginThatNeverEntered) {
  Builder b(4, {2});
  b.op(0, 0, true).op(0, 1, false).op(1, 0, true).op(1, 1, false).op(2, 0, true).op(3, 0, true);
  const CollectiveAnalysis c = analyze_collectives(b.a);
  ASSERT_EQ(c.communicators.size(), 1u);
  const CommunicatorVerdict& v = c.communicators[0];
  EXPECT_EQ(v.seq, 1u);
  EXPECT_EQ(v.size, 4);
  EXPECT_EQ(v.waiting, (std::vector<int>{0, 1}));
  EXPECT_EQ(v.short_of_it, (std::vector<int>{2, 3}));
  EXPECT_TRUE(v.behind.empty());
  const auto lines = describe_verdict(b.a, c, v);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "ranks 0, 1 wait in allreduce #1 on the world communicator (4 ranks; 8.00 MiB), which rank 2 "
                      "never entered: it ran out of memory in batch 5");
  EXPECT_EQ(lines[1], "rank 3 had not reached it yet: still computing batch 5 (its last finished operation on it: "
                      "allreduce #0 (8.00 MiB) in batch 0)");
  EXPECT_EQ(c.ranks[0].in_flight, 1);
  EXPECT_EQ(c.ranks[2].in_flight, -1);
  EXPECT_EQ(c.ranks[2].last_finished, 0);
}

TEST(Collectives, ARankMoreThanOneBehindAndOneInAnotherOperation) {
  Builder b(4, {3});
  b.op(0, 0, true).op(0, 1, true).op(0, 2, true).op(0, 3, false);
  // Rank 1 finished allreduce #2, then entered a broadcast the others never called: NCCL numbers it on its own.
  b.op(1, 0, true).op(1, 1, true).op(1, 2, true).op(1, 0, false, CollectiveOp::broadcast);
  b.op(2, 0, true).op(2, 1, false);  // waits in #1: two behind
  // rank 3, the origin, entered nothing at all
  const CollectiveAnalysis c = analyze_collectives(b.a);
  ASSERT_EQ(c.communicators.size(), 2u);  // allreduce and broadcast, each its own sequence
  const CommunicatorVerdict& v = c.communicators[0];
  EXPECT_EQ(v.op, CollectiveOp::allreduce);
  EXPECT_EQ(v.seq, 3u);
  EXPECT_EQ(v.waiting, (std::vector<int>{0}));
  EXPECT_EQ(v.short_of_it, (std::vector<int>{1}));
  EXPECT_EQ(v.different_op, (std::vector<int>{1}));
  EXPECT_EQ(v.behind, (std::vector<int>{2, 3}));
  const auto lines = describe_verdict(b.a, c, v);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "rank 0 waits in allreduce #3 on the world communicator (4 ranks; 8.00 MiB), which rank 3 never "
                      "entered: it ran out of memory in batch 5");
  EXPECT_EQ(lines[1], "rank 1 never entered it: it waits in broadcast #0 (8.00 MiB) on the same communicator instead "
                      "(the ranks are in different operations)");
  EXPECT_EQ(lines[2], "rank 2 is 2 operations behind: it waits in allreduce #1 (8.00 MiB)");
  EXPECT_EQ(c.communicators[1].op, CollectiveOp::broadcast);
  EXPECT_EQ(c.communicators[1].waiting, (std::vector<int>{1}));
}

TEST(Collectives, EachOperationHasItsOwnSequence) {
  // As torch's DDP does: broadcasts #0, #1 at start, then allreduces #0, #1 on the same communicator.
  Builder b(2);
  for (int rank = 0; rank < 2; ++rank) {
    b.op(rank, 0, true, CollectiveOp::broadcast).op(rank, 1, true, CollectiveOp::broadcast);
    b.op(rank, 0, true).op(rank, 1, rank == 0);
  }
  const CollectiveAnalysis c = analyze_collectives(b.a);
  ASSERT_EQ(c.ranks[0].operations.size(), 4u);  // broadcast #0 and allreduce #0 are two operations
  EXPECT_TRUE(c.ranks[0].operations[2].finished());
  ASSERT_EQ(c.communicators.size(), 2u);
  EXPECT_EQ(c.communicators[0].op, CollectiveOp::allreduce);
  EXPECT_EQ(c.communicators[0].seq, 1u);
  EXPECT_EQ(c.communicators[0].finished, (std::vector<int>{0}));  // allreduce #1: rank 0 done, rank 1 inside
  EXPECT_EQ(c.communicators[0].waiting, (std::vector<int>{1}));
  EXPECT_TRUE(describe_verdict(b.a, c, c.communicators[1]).empty());  // broadcasts: all finished
}

TEST(Collectives, AllFinishedGivesNoVerdictAndTheDeviceEndWins) {
  Builder b(2);
  b.op(0, 0, true).op(1, 0, true);
  // A second end of rank 1's operation, the device's, later than the host's.
  CollectiveRow device_end = b.a.collectives.back();
  device_end.t_ns += 500;
  device_end.flags = kCollectiveDeviceCompletion;
  b.a.collectives.push_back(device_end);
  const CollectiveAnalysis c = analyze_collectives(b.a);
  EXPECT_TRUE(describe_verdict(b.a, c, c.communicators.at(0)).empty());
  EXPECT_EQ(c.communicators[0].finished, (std::vector<int>{0, 1}));
  const RankOperation& op = c.ranks[1].operations.at(0);
  EXPECT_TRUE(op.device_completion);
  EXPECT_EQ(op.end_t_ns, device_end.t_ns);
  EXPECT_FALSE(c.ranks[0].operations.at(0).device_completion);
}

TEST(Collectives, AnEndWhoseStartWasOverwrittenAndAnUnregisteredCommunicator) {
  Builder b(2);
  CollectiveRow end;
  end.rank = 0;
  end.comm_id = 0xabc;
  end.seq = 9;
  end.phase = CollectivePhase::end;
  end.t_ns = 77;
  end.op = CollectiveOp::send;
  end.peer = 1;
  b.a.collectives.push_back(end);
  const CollectiveAnalysis c = analyze_collectives(b.a);
  ASSERT_EQ(c.ranks[0].operations.size(), 1u);
  EXPECT_EQ(c.ranks[0].operations[0].start_t_ns, 0);
  EXPECT_EQ(c.ranks[0].operations[0].end_t_ns, 77);
  ASSERT_EQ(c.communicators.size(), 1u);
  EXPECT_EQ(communicator_label(c.communicators[0]), "communicator 0xabc");
  EXPECT_EQ(c.communicators[0].members, (std::vector<int>{0}));
}

TEST(Collectives, AnArchiveWithoutCollectivesIsEmpty) {
  Builder b(3, {1});
  EXPECT_TRUE(analyze_collectives(b.a).empty());
}

}  // namespace
}  // namespace oomflight
