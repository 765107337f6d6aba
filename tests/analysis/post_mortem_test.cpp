// The post-mortem of a known archive (the schema-v1 fixture of tests/data/v1: 4 ranks, origins 2 and 3, rank r
// holding 20 + 10 r allocs of 1000 + r bytes, none freed).
#include <gtest/gtest.h>

#include <string>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {
namespace {

Archive fixture() { return read_archive(std::string(OOMFLIGHT_SOURCE_DIR) + "/tests/data/v1/oom-4ranks-2origins.h5"); }

TEST(PostMortem, OriginsFirstFailureAndLiveBlocksOfEachRank) {
  const Archive a = fixture();
  const PostMortem pm = analyze(a, 3);
  EXPECT_EQ(pm.origins, (std::vector<int>{2, 3}));
  EXPECT_EQ(pm.first_origin, 2);  // its oom event is earlier on the common UTC axis
  ASSERT_EQ(pm.ranks.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const RankSummary& s = pm.ranks[static_cast<std::size_t>(rank)];
    const std::size_t allocs = 20 + 10 * static_cast<std::size_t>(rank);
    EXPECT_EQ(s.row.rank, rank);
    EXPECT_EQ(s.live_count, allocs);
    EXPECT_EQ(s.live_bytes_in_history, allocs * (1000u + static_cast<unsigned>(rank)));
    EXPECT_EQ(s.action_counts[static_cast<int>(Action::alloc)], allocs);
    EXPECT_EQ(s.action_counts[static_cast<int>(Action::step)], 1u);
    EXPECT_EQ(s.action_counts[static_cast<int>(Action::oom)], rank >= 2 ? 1u : 0u);
    EXPECT_EQ(s.headroom_bytes, 2'000'000u);  // 4.0 MB capacity - 2.0 MB reserved
    EXPECT_EQ(s.oom_utc_ns != 0, rank >= 2);
    if (rank < 2) {
      EXPECT_TRUE(s.largest.empty()) << "only origins list their largest allocations";
      continue;
    }
    ASSERT_EQ(s.largest.size(), 3u);  // top 3 asked for
    // All the same size: ties are broken by address, lowest first.
    EXPECT_EQ(s.largest[0].addr, 0x1000u);
    EXPECT_EQ(s.largest[2].addr, 0x3000u);
    EXPECT_EQ(s.largest[0].size, 1000u + static_cast<unsigned>(rank));
    EXPECT_GE(s.largest[0].stack_id, 0);
  }
}

// An origin against its median peer, in live bytes of the recorded history. 0 B against 0 B was called "an outlier"
// (issue 30); "as much" was said of an origin that held less.
TEST(PostMortem, AnOriginIsAnOutlierOnlyAboveATenthOverItsMedianPeer) {
  const auto judge = [](std::uint64_t mine, std::uint64_t median) {
    RankSummary s;
    s.live_bytes_in_history = mine;
    s.peers_median_live_bytes = median;
    return judge_against_peers(s);
  };
  EXPECT_EQ(judge(0, 0), AgainstPeers::nothing_live);
  EXPECT_EQ(judge(1, 0), AgainstPeers::outlier);
  EXPECT_EQ(judge(0, 1), AgainstPeers::at_most_peers);
  EXPECT_EQ(judge(1000, 1000), AgainstPeers::at_most_peers);
  EXPECT_EQ(judge(1100, 1000), AgainstPeers::within_a_tenth);
  EXPECT_EQ(judge(1101, 1000), AgainstPeers::outlier);
  EXPECT_EQ(judge(UINT64_MAX, UINT64_MAX - 1), AgainstPeers::within_a_tenth);  // no overflow at the top
  EXPECT_STREQ(against_peers_words(judge(0, 0)),
               "not an outlier; neither it nor its median peer held live memory in the recorded history");
  EXPECT_STREQ(against_peers_words(judge(0, 1)), "not an outlier; its median peer held as much or more");
}

}  // namespace
}  // namespace oomflight
