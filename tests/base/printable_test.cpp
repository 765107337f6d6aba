// printable(): what a terminal would act on is shown, everything else (UTF-8 in any script) stays as it is.
#include <gtest/gtest.h>

#include <string>

#include "oomflight/base/printable.hpp"

namespace oomflight {
namespace {

TEST(Printable, ControlSequencesBecomeVisibleEscapes) {
  // Issue 30's communicator name: retitle the window, then clear the screen.
  EXPECT_EQ(printable("\x1b]0;pwned\x07\x1b[2J"), "\\x1b]0;pwned\\x07\\x1b[2J");
  EXPECT_EQ(printable("a\nb\rc\td"), "a\\nb\\rc\\td");
  EXPECT_EQ(printable(std::string("nul\0del\x7f", 8)), "nul\\x00del\\x7f");
  EXPECT_EQ(printable("a\nb\x1b", LineFeeds::keep), "a\nb\\x1b");
}

TEST(Printable, C1ControlsAndBidirectionalOverridesAreEscaped) {
  EXPECT_EQ(printable("\xc2\x9b" "31m"), "\\u009b31m");  // 8-bit CSI
  EXPECT_EQ(printable("\xc2\x85"), "\\u0085");           // NEL: a line break on some terminals
  EXPECT_EQ(printable("abc\xe2\x80\xae" "fed"), "abc\\u202efed");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(printable("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");  // isolates
}

TEST(Printable, TextInAnyScriptStaysAsItIs) {
  for (const char* text : {"plain ascii, with \\ and \"quotes\"", "r\xc3\xa9sum\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac",
                           "\xf0\x9f\x94\xa5 fire", "\xc2\xa0nbsp", "\xe2\x80\x8f" /* RLM is not an override */}) {
    EXPECT_EQ(printable(text), text);
  }
}

TEST(Printable, BytesThatAreNotUtf8AreShownAsBytes) {
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                   // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");          // a surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("ok\xe2\x82"), "ok\\xe2\\x82");               // cut short by the end
  EXPECT_EQ(printable("\x80x"), "\\x80x");                          // a stray continuation byte
}

TEST(Printable, Utf8SequenceLength) {
  EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
  EXPECT_EQ(utf8_sequence_length("\xc3\xa9", 0), 2u);
  EXPECT_EQ(utf8_sequence_length("\xe6\x97\xa5", 0), 3u);
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x94\xa5", 0), 4u);
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f\x94", 0), 0u);
  EXPECT_EQ(utf8_sequence_length("\xe0\x80\x80", 0), 0u);  // overlong
}

}  // namespace
}  // namespace oomflight
