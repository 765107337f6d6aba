// Filename templates: every placeholder, escapes, and errors that name the bad part.
#include <gtest/gtest.h>

#include "oomflight/control/filename_template.hpp"

namespace oomflight {
namespace {

TemplateValues values() {
  return TemplateValues{"llama-8b", 5, 1, 8, 1834, 4242, "node07", "oom"};
}

TEST(FilenameTemplate, RendersEveryPlaceholder) {
  FilenameTemplate t("{run_name}/{kind}.{batch}.r{rank}-l{local_rank}-of{world_size}.{host}.{pid}.h5");
  EXPECT_EQ(t.render(values()), "llama-8b/oom.1834.r5-l1-of8.node07.4242.h5");
  EXPECT_TRUE(t.uses(FilenameTemplate::Field::rank));
  EXPECT_FALSE(FilenameTemplate("{kind}.h5").uses(FilenameTemplate::Field::rank));
}

TEST(FilenameTemplate, DoubledBracesAreLiteral) {
  EXPECT_EQ(FilenameTemplate("{{x}}-{rank}").render(values()), "{x}-5");
}

TEST(FilenameTemplate, UnknownPlaceholderIsNamed) {
  try {
    FilenameTemplate("oom.{rnk}.h5");
    FAIL() << "accepted {rnk}";
  } catch (const TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("'{rnk}'"), std::string::npos) << e.what();
  }
}

TEST(FilenameTemplate, UnbalancedBracesAreErrors) {
  EXPECT_THROW(FilenameTemplate("oom.{rank.h5"), TemplateError);
  EXPECT_THROW(FilenameTemplate("oom.rank}.h5"), TemplateError);
}

}  // namespace
}  // namespace oomflight
