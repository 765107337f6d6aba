// How many stripes an archive asks for (docs/scale.md): one per GiB from 2, capped at Lustre's 2,000, none for
// a small archive (the folder's own layout stays), and the setting's count or 0 as given.
#include <gtest/gtest.h>

#include "archive_striping.hpp"

namespace oomflight::format_detail {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

TEST(ArchiveStriping, AutoAsksForOneStripePerGibFromTwo) {
  EXPECT_EQ(archive_stripes(-1, 0), 0);
  EXPECT_EQ(archive_stripes(-1, kGiB), 0);           // one stripe: the folder's layout is left alone
  EXPECT_EQ(archive_stripes(-1, kGiB + 1), 2);
  EXPECT_EQ(archive_stripes(-1, 75 * kGiB), 75);     // 16,384 ranks x 100,000 events
  EXPECT_EQ(archive_stripes(-1, 5000 * kGiB), 2000);  // Lustre's most
}

TEST(ArchiveStriping, AGivenCountOrZeroIsKept) {
  EXPECT_EQ(archive_stripes(0, 75 * kGiB), 0);
  EXPECT_EQ(archive_stripes(7, 1), 7);
}

TEST(ArchiveStriping, NothingIsCreatedWithoutStripes) {
  EXPECT_EQ(create_striped("/nonexistent-folder/x.h5.partial", 0), "");
}

}  // namespace
}  // namespace oomflight::format_detail
