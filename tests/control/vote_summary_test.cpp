// The dump's agreement as a reduction: merging summaries keeps what the gather of every vote gave (the origins,
// the lowest origins' votes whole, the replacer, abandoned snapshots), in any order of merging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "vote_summary.hpp"

namespace oomflight::protocol {
namespace {

Vote vote(int rank, bool origin, std::int64_t batch = 7) {
  Vote v;
  v.rank = rank;
  v.is_origin = origin ? 1 : 0;
  v.batch = batch;
  v.requested_bytes = 1000u + static_cast<unsigned>(rank);
  v.kind = 0;
  const std::string why = "rank " + std::to_string(rank) + " failed";
  std::memcpy(v.reason, why.c_str(), why.size());
  return v;
}

// Reduces every rank's summary in the given order, as MPI may.
// Rank r's history adds r + 1 rows to every dataset.
ArchiveRowCounts rows_of(int rank) {
  ArchiveRowCounts rows{};
  rows.fill(static_cast<std::uint64_t>(rank) + 1);
  return rows;
}

VoteSummary reduce(const std::vector<Vote>& votes, const std::vector<int>& order) {
  const int size = static_cast<int>(votes.size());
  VoteSummary acc(votes[static_cast<std::size_t>(order[0])], rows_of(order[0]), size);
  for (std::size_t i = 1; i < order.size(); ++i) {
    VoteSummary one(votes[static_cast<std::size_t>(order[i])], rows_of(order[i]), size);
    merge_vote_summaries(one.data(), acc.data());
  }
  return acc;
}

TEST(VoteSummary, KeepsEveryOriginAndTheLowestOriginsVotesWholeInAnyOrder) {
  // 1,000 ranks, 9 of them origins: more than kVotesKept, not in the first byte of the bitmap.
  const std::vector<int> origin_ranks{3, 17, 64, 65, 200, 511, 512, 998, 999};
  std::vector<Vote> votes;
  for (int r = 0; r < 1000; ++r) {
    votes.push_back(vote(r, std::find(origin_ranks.begin(), origin_ranks.end(), r) != origin_ranks.end()));
  }
  std::vector<int> order(votes.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 random(42);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(order.begin(), order.end(), random);
    const VoteSummary s = reduce(votes, order);
    const VoteSummaryHead h = s.head();
    EXPECT_EQ(h.world_size, 1000);
    EXPECT_EQ(h.origin_count, 9);
    EXPECT_EQ(s.origins(), std::vector<std::int32_t>(origin_ranks.begin(), origin_ranks.end()));
    ASSERT_EQ(h.kept_count, kVotesKept);
    for (int i = 0; i < kVotesKept; ++i) {
      EXPECT_EQ(h.kept[i].rank, origin_ranks[static_cast<std::size_t>(i)]);
      EXPECT_EQ(h.kept[i].requested_bytes, 1000u + static_cast<unsigned>(origin_ranks[static_cast<std::size_t>(i)]));
      EXPECT_STREQ(h.kept[i].reason, ("rank " + std::to_string(origin_ranks[static_cast<std::size_t>(i)]) +
                                      " failed").c_str());
    }
    EXPECT_EQ(h.first.rank, 0);
    for (std::uint64_t total : h.row_totals) EXPECT_EQ(total, 1000u * 1001u / 2u);  // 1 + 2 + ... + 1000
    EXPECT_EQ(h.replacer, INT32_MAX);
    EXPECT_EQ(h.snapshots_broken, 0);
  }
}

TEST(VoteSummary, NamesTheLowestReplacingOriginAndAnyAbandonedSnapshot) {
  std::vector<Vote> votes{vote(0, false), vote(1, true), vote(2, true), vote(3, true), vote(4, false)};
  votes[3].replaces_archive = 1;
  votes[2].replaces_archive = 1;
  votes[4].snapshots_broken = 1;
  votes[0].replaces_archive = 1;  // not an origin: it names nothing
  const VoteSummary s = reduce(votes, {4, 0, 3, 1, 2});
  EXPECT_EQ(s.head().replacer, 2);
  EXPECT_EQ(s.head().snapshots_broken, 1);
  EXPECT_EQ(s.head().kept_count, 3);
  EXPECT_EQ(s.origins(), (std::vector<std::int32_t>{1, 2, 3}));
}

TEST(VoteSummary, WithoutOriginsTheLowestRanksVoteNamesTheDump) {
  const std::vector<Vote> votes{vote(0, false, 11), vote(1, false, 12), vote(2, false, 13)};
  const VoteSummary s = reduce(votes, {2, 1, 0});
  EXPECT_EQ(s.head().origin_count, 0);
  EXPECT_EQ(s.head().kept_count, 0);
  EXPECT_TRUE(s.origins().empty());
  EXPECT_EQ(s.head().first.rank, 0);
  EXPECT_EQ(s.head().first.batch, 11);
}

TEST(VoteSummary, IsAFewKilobytesAtSixteenThousandRanks) {
  // The gather it replaces put 16,384 x 888 bytes (14.5 MB) on every rank.
  EXPECT_EQ(VoteSummary::bytes(16384), sizeof(VoteSummaryHead) + 2048);
  EXPECT_LT(VoteSummary::bytes(16384), 8u * 1024u);
  EXPECT_EQ(VoteSummary::bytes(1), sizeof(VoteSummaryHead) + 1);
}

}  // namespace
}  // namespace oomflight::protocol
