// The node's peer processes, watched for their end (core/control/src/peer_processes.hpp): real child processes that
// end as ranks do (exit, SIGKILL), seen through a pidfd and through /proc, while still zombies (not yet reaped) and
// after; a pid that never existed, and this process itself, are not watched.
#include "peer_processes.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace oomflight {
namespace {

// A child that sleeps until killed, or exits with `status` after `ms` milliseconds.
pid_t child(int status = -1, int ms = 0) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (status >= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::_exit(status);
    }
    for (;;) ::pause();
  }
  return pid;
}

// newly_ended() polled until it reports something or `ms` pass.
std::vector<int> ended_within(PeerProcesses& p, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    std::vector<int> e = p.newly_ended();
    if (!e.empty() || std::chrono::steady_clock::now() > until) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

class PeerProcessesWays : public ::testing::TestWithParam<PeerProcesses::Way> {};

TEST_P(PeerProcessesWays, AKilledRankIsSeenEndedOnceWhileStillAZombie) {
  const pid_t killed = child(), running = child();
  PeerProcesses peers({{3, killed}, {5, running}}, GetParam());
  EXPECT_EQ(peers.watched(), 2u);
  EXPECT_TRUE(peers.newly_ended().empty()) << "both are running";
  ASSERT_EQ(::kill(killed, SIGKILL), 0);
  // Not reaped yet: the process is a zombie, as a rank is until its launcher waits for it.
  EXPECT_EQ(ended_within(peers, 5000), std::vector<int>{3});
  EXPECT_TRUE(peers.newly_ended().empty()) << "each end is reported once";
  EXPECT_EQ(peers.watched(), 1u);
  ::waitpid(killed, nullptr, 0);
  EXPECT_TRUE(peers.newly_ended().empty()) << "reaping it reports nothing new";
  ::kill(running, SIGKILL);
  ::waitpid(running, nullptr, 0);  // reaped before the next look: still seen ended
  EXPECT_EQ(ended_within(peers, 5000), std::vector<int>{5});
  EXPECT_EQ(peers.watched(), 0u);
}

TEST_P(PeerProcessesWays, ARankThatExitsIsSeenEndedAndOneGoneBeforeTheWatchIsReportedAtOnce) {
  const pid_t gone = child(0, 0);
  ::waitpid(gone, nullptr, 0);  // ended and reaped before the watch begins
  const pid_t exits = child(3, 50);
  PeerProcesses peers({{1, gone}, {2, exits}}, GetParam());
  EXPECT_EQ(peers.newly_ended(), std::vector<int>{1});
  EXPECT_EQ(ended_within(peers, 5000), std::vector<int>{2});
  ::waitpid(exits, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(Ways, PeerProcessesWays,
                         ::testing::Values(PeerProcesses::Way::pidfd, PeerProcesses::Way::proc),
                         [](const auto& info) { return info.param == PeerProcesses::Way::pidfd ? "pidfd" : "proc"; });

TEST(PeerProcesses, ThisProcessAndNonPositivePidsAreNotWatched) {
  PeerProcesses peers({{0, ::getpid()}, {1, 0}, {2, -4}});
  EXPECT_EQ(peers.watched(), 0u);
  EXPECT_TRUE(peers.newly_ended().empty());
}

TEST(PeerProcesses, ThePidAndNetworkNamespacesAreReadableAndApart) {
  const NamespaceId pids = own_namespace("pid");
  EXPECT_NE(pids.ino, 0u);
  EXPECT_EQ(pids, own_namespace("pid"));
  const NamespaceId net = own_namespace("net");
  EXPECT_NE(net.ino, 0u);
  EXPECT_NE(net, pids) << "two namespaces, two inodes";
  EXPECT_EQ(net.text(), std::to_string(net.dev) + ":" + std::to_string(net.ino));
  EXPECT_EQ(NamespaceId{}.text(), "") << "unknown: never equal to another's";
  EXPECT_EQ(own_namespace("no-such-kind"), NamespaceId{});
}

}  // namespace
}  // namespace oomflight
