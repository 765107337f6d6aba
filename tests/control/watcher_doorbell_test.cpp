// The watcher's doorbell with real sockets: who rang is told apart, a ring before the wait is not lost, and a ring
// to a doorbell that is gone neither blocks nor fails.
#include "oomflight/control/watcher_doorbell.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

namespace oomflight {
namespace {

using std::chrono::milliseconds;

TEST(WatcherDoorbell, HasAnAbstractAddress) {
  WatcherDoorbell bell;
  ASSERT_GT(bell.address().length, 1) << "no AF_UNIX socket here: the rest of these tests would test the fallback";
  EXPECT_EQ(bell.address().name[0], '\0') << "an abstract name starts with a NUL byte (unix(7))";
  WatcherDoorbell other;
  EXPECT_NE(std::string(bell.address().name, bell.address().length),
            std::string(other.address().name, other.address().length));
}

TEST(WatcherDoorbell, ItsAddressTravelsAsTextAndIsRungFromIt) {
  WatcherDoorbell bell;
  const std::string text = doorbell_text(bell.address());
  EXPECT_EQ(text.size(), 2u * bell.address().length);
  EXPECT_EQ(text.substr(0, 2), "00") << "the abstract name's NUL byte, as hex";
  const auto back = doorbell_from_text(text);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(std::string(back->name, back->length), std::string(bell.address().name, bell.address().length));
  // Rung through the address read back, as a rank of the same node rings it after the job's store told it.
  WatcherDoorbell peer;
  peer.ring(*back);
  EXPECT_TRUE(bell.wait(milliseconds(60'000)).other);
  // What is not an address does not read; "" is no doorbell.
  for (const char* bad : {"0", "zz", "0g", "000102030405060708090a0b0c0d0e0f10"}) {
    EXPECT_FALSE(doorbell_from_text(bad).has_value()) << bad;
  }
  ASSERT_TRUE(doorbell_from_text("").has_value());
  EXPECT_EQ(doorbell_from_text("")->length, 0);
  EXPECT_EQ(doorbell_text(DoorbellAddress{}), "");
}

TEST(WatcherDoorbell, ARingBeforeTheWaitIsNotLost) {
  WatcherDoorbell bell;
  bell.ring();
  bell.ring();  // two rings before one wait: one wake-up, both cleared
  const auto rings = bell.wait(milliseconds(60'000));
  EXPECT_TRUE(rings.self);
  EXPECT_FALSE(rings.other);
  const auto none = bell.wait(milliseconds(1));
  EXPECT_FALSE(none.self);
  EXPECT_FALSE(none.other);
}

TEST(WatcherDoorbell, TellsAnotherProcessFromItself) {
  WatcherDoorbell watcher;
  WatcherDoorbell origin;
  origin.ring(watcher.address());
  const auto rings = watcher.wait(milliseconds(60'000));
  EXPECT_TRUE(rings.other);
  EXPECT_FALSE(rings.self);
}

TEST(WatcherDoorbell, WakesAWaitUnderWay) {
  WatcherDoorbell watcher;
  WatcherDoorbell origin;
  std::optional<WatcherDoorbell::Rings> seen;
  std::thread waiting([&] { seen = watcher.wait(milliseconds(60'000)); });
  std::this_thread::sleep_for(milliseconds(20));
  origin.ring(watcher.address());
  waiting.join();  // would take a minute if the ring did not end the wait
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(seen->other);
}

TEST(WatcherDoorbell, RingingADoorbellThatIsGoneDoesNothing) {
  DoorbellAddress gone;
  {
    WatcherDoorbell bell;
    gone = bell.address();
  }
  WatcherDoorbell origin;
  for (int i = 0; i < 1000; ++i) origin.ring(gone);  // ECONNREFUSED every time: ignored, never blocks
  DoorbellAddress empty;
  origin.ring(empty);
  DoorbellAddress hostile;
  hostile.length = 200;  // longer than the name it says it holds
  origin.ring(hostile);
  EXPECT_FALSE(origin.wait(milliseconds(1)).other);
}

TEST(WatcherDoorbell, AFullQueueMeansItIsRungAlready) {
  WatcherDoorbell watcher;
  WatcherDoorbell origin;
  for (int i = 0; i < 100'000; ++i) origin.ring(watcher.address());  // far past the socket's queue: never blocks
  EXPECT_TRUE(watcher.wait(milliseconds(60'000)).other);
  EXPECT_FALSE(watcher.wait(milliseconds(1)).other) << "one wait clears every ring queued";
}

}  // namespace
}  // namespace oomflight
