// Base64 as RFC 4648 section 10 spells its test vectors, and the texts the decoder must refuse.
#include "oomflight/base/base64.hpp"

#include <gtest/gtest.h>

namespace oomflight {
namespace {

TEST(Base64, EncodesTheRfcTestVectors) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64_encode("foobar"), "Zm9vYmFy");
}

TEST(Base64, EveryByteValueRoundTrips) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (std::size_t n = 0; n <= all.size(); n += 37) {
    const std::string part = all.substr(0, n);
    EXPECT_EQ(base64_decode(base64_encode(part)), part) << n << " bytes";
  }
  EXPECT_EQ(base64_encode(std::string_view("\xff\xfe\x00", 3)), "//4A");
}

TEST(Base64, RefusesWhatItDidNotWrite) {
  EXPECT_FALSE(base64_decode("Zg="));         // length not a multiple of 4
  EXPECT_FALSE(base64_decode("Zg==Zg=="));    // padding before the end
  EXPECT_FALSE(base64_decode("Z==="));        // three pads
  EXPECT_FALSE(base64_decode("Zh=="));        // bits set after the last byte: not the one encoding of "f"
  EXPECT_FALSE(base64_decode("Zm8 "));        // outside the alphabet
  EXPECT_FALSE(base64_decode("Zm=v"));        // a pad inside the group
  EXPECT_EQ(base64_decode(""), std::string());
}

}  // namespace
}  // namespace oomflight
