// Configuration: defaults, errors naming variable and value, and the README's generated table.
#include <gtest/gtest.h>

#include <tuple>

#include <fstream>
#include <map>
#include <sstream>

#include "oomflight/control/config.hpp"

namespace oomflight {
namespace {

Config from(const std::map<std::string, std::string>& env) {
  std::vector<std::string> names;
  for (const auto& [k, v] : env) names.push_back(k);
  return Config::from_environment(
      [&](std::string_view name) -> std::optional<std::string> {
        auto it = env.find(std::string(name));
        return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
      },
      names);
}

std::string error_of(const std::map<std::string, std::string>& env) {
  try {
    from(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Defaults) {
  const Config c = from({});
  EXPECT_TRUE(c.enabled);
  EXPECT_EQ(c.max_entries, 100000u);
  EXPECT_EQ(c.folder.text(), "{run_name}/oomflight");
  EXPECT_EQ(c.filename.text(), "{kind}.{batch}.h5");
  EXPECT_EQ(c.dump_timeout.count(), 30000);
  EXPECT_FALSE(c.overwrite);
}

TEST(Config, ReadsValues) {
  const Config c = from({{"OOMFLIGHT_MAX_ENTRIES", "4096"},
                         {"OOMFLIGHT_DUMP_TIMEOUT", "2s"},
                         {"OOMFLIGHT_RUN_NAME", "llama"},
                         {"OOMFLIGHT_OVERWRITE", "yes"},
                         {"OOMFLIGHT_FOLDER", "out/{kind}//"}});  // a folder may end in '/', as people write one
  EXPECT_EQ(c.folder.text(), "out/{kind}");
  EXPECT_EQ(c.max_entries, 4096u);
  EXPECT_EQ(c.dump_timeout.count(), 2000);
  EXPECT_EQ(c.run_name, "llama");
  EXPECT_TRUE(c.overwrite);
}

TEST(Config, ErrorsNameTheVariableAndTheValue) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"OOMFLIGHT_MAX_ENTRIES", "abc"},     {"OOMFLIGHT_MAX_ENTRIES", "0"},
      {"OOMFLIGHT_DUMP_TIMEOUT", "soon"},   {"OOMFLIGHT_DUMP_TIMEOUT", "0"},
      {"OOMFLIGHT_ENABLED", "maybe"},       {"OOMFLIGHT_FOLDER", "{nope}/x"},
      {"OOMFLIGHT_FILENAME", "oom.{rank}.h5"},  // the archive is shared: no per-rank name
      {"OOMFLIGHT_RANK_FILENAME", "oom.h5"},    // a rank-local name must contain {rank}
      {"OOMFLIGHT_LOG_LEVEL", "loud"},      {"OOMFLIGHT_RUN_NAME", "a/b"},
      {"OOMFLIGHT_DUMP_TIMEOUT", "1000000h"},  // used to overflow into "did not finish within 10800000000 s"
      {"OOMFLIGHT_POLL_INTERVAL", "2min"},     {"OOMFLIGHT_FILENAME", "archives/"},
      {"OOMFLIGHT_MAX_ENTRIES", "1073741824"},  // 128 GiB of ring: refused with the figure, not a bad_alloc
      {"OOMFLIGHT_RUN_NAME", std::string(201, 'r')},  // would be cut at 256 bytes under MPI, mid-character
      {"OOMFLIGHT_RUN_NAME", "caf\xc3"},              // a cut UTF-8 sequence
      {"OOMFLIGHT_RUN_NAME", "a\nb"},                 // a control character in a folder name
      {"OOMFLIGHT_SIGNAL_DUMP_INTERVAL", "-1s"},
  };
  for (const auto& [name, value] : bad) {
    const std::string message = error_of({{name, value}});
    EXPECT_NE(message.find(name + "='" + value + "'"), std::string::npos) << name << ": " << message;
  }
}

TEST(Config, TheHeadroomThresholdIsAFractionOrAPercentageOfTheLimit) {
  EXPECT_EQ(from({}).headroom_ppm, 0u);  // off unless set
  EXPECT_EQ(from({{"OOMFLIGHT_HEADROOM_DUMP", "0.9"}}).headroom_ppm, 900000u);
  EXPECT_EQ(from({{"OOMFLIGHT_HEADROOM_DUMP", "90%"}}).headroom_ppm, 900000u);
  EXPECT_EQ(from({{"OOMFLIGHT_HEADROOM_DUMP", "92.5%"}}).headroom_ppm, 925000u);
  EXPECT_EQ(from({{"OOMFLIGHT_HEADROOM_DUMP", "1"}}).headroom_ppm, 1000000u);
  EXPECT_EQ(from({{"OOMFLIGHT_HEADROOM_DUMP", ""}}).headroom_ppm, 0u);
  for (const std::string bad : {"0", "1.5", "150%", "-0.1", "abc", "90 %", "%", "nan", "0.9x"}) {
    const std::string message = error_of({{"OOMFLIGHT_HEADROOM_DUMP", bad}});
    EXPECT_NE(message.find("OOMFLIGHT_HEADROOM_DUMP='" + bad + "'"), std::string::npos) << bad << ": " << message;
  }
  EXPECT_EQ(error_of({{"OOMFLIGHT_HEADROOM_DUMP", "150%"}}),
            "OOMFLIGHT_HEADROOM_DUMP='150%': must be above 0 and at most 1 (100%): a share of the device's capacity or "
            "cap");
}

TEST(Config, RunNamesUpToTheLimitInAnyScriptAreKept) {
  const std::string longest(kMaxRunNameBytes, 'r');
  for (const std::string& name : {longest, std::string("llama-3.1-8b"), std::string("\xe8\xae\xad\xe7\xbb\x83-run"),
                                  std::string("\xf0\x9f\x94\xa5")}) {
    EXPECT_EQ(error_of({{"OOMFLIGHT_RUN_NAME", name}}), "") << name;
  }
  EXPECT_NE(error_of({{"OOMFLIGHT_RUN_NAME", std::string(201, 'r')}}).find("is 201 bytes long; at most 200"),
            std::string::npos);
  EXPECT_NE(error_of({{"OOMFLIGHT_RUN_NAME", "\xc0\xaf"}}).find("is not UTF-8 text (byte 0)"), std::string::npos);
}

// With OOMFLIGHT_OVERWRITE=1 the next snapshot replaced an OOM archive already reported written (issue 19).
TEST(Config, TemplatesThatMakeTwoKindsOrTheArchiveAndARankFileShareAFileAreRefused) {
  EXPECT_NE(error_of({{"OOMFLIGHT_FILENAME", "dump.h5"}})
                .find("OOMFLIGHT_FILENAME='dump.h5' has no {kind}, nor has OOMFLIGHT_FOLDER (its default): an OOM "
                      "archive, a snapshot and a signal dump would share one file"),
            std::string::npos)
      << error_of({{"OOMFLIGHT_FILENAME", "dump.h5"}});
  EXPECT_NE(error_of({{"OOMFLIGHT_RANK_FILENAME", "r{rank}.h5"}}).find("OOMFLIGHT_RANK_FILENAME='r{rank}.h5' has no {kind}"),
            std::string::npos);
  EXPECT_EQ(error_of({{"OOMFLIGHT_FILENAME", "dump.h5"}, {"OOMFLIGHT_RANK_FILENAME", "dump.{rank}.h5"},
                      {"OOMFLIGHT_FOLDER", "out/{kind}"}}),
            "");
  EXPECT_NE(error_of({{"OOMFLIGHT_FILENAME", "x{kind}0.h5"}, {"OOMFLIGHT_RANK_FILENAME", "x{kind}{rank}.h5"}})
                .find("name the same file for rank 0"),
            std::string::npos);
  EXPECT_EQ(error_of({{"OOMFLIGHT_FILENAME", "{kind}.{batch}.h5"}}), "");
}

// OOMFLIGHT_ARCHIVE_STRIPES: auto (-1) by default, 0 keeps the folder's layout, 1 .. 2000 (Lustre's most
// stripes); anything else names what it accepts.
TEST(Config, ArchiveStripesAreAutoZeroOrACount) {
  EXPECT_EQ(from({}).archive_stripes, -1);
  EXPECT_EQ(from({{"OOMFLIGHT_ARCHIVE_STRIPES", "auto"}}).archive_stripes, -1);
  EXPECT_EQ(from({{"OOMFLIGHT_ARCHIVE_STRIPES", "0"}}).archive_stripes, 0);
  EXPECT_EQ(from({{"OOMFLIGHT_ARCHIVE_STRIPES", "64"}}).archive_stripes, 64);
  EXPECT_EQ(from({{"OOMFLIGHT_ARCHIVE_STRIPES", "2000"}}).archive_stripes, 2000);
  for (const char* bad : {"2001", "-1", "x", "", "4 "}) {
    const std::string message = error_of({{"OOMFLIGHT_ARCHIVE_STRIPES", bad}});
    EXPECT_NE(message.find(std::string("OOMFLIGHT_ARCHIVE_STRIPES='") + bad + "': not auto, 0 or a count of stripes "
                                                                             "in 1 .. 2000"),
              std::string::npos)
        << bad << ": " << message;
  }
}

TEST(Config, SettingsThatDefeatTheDumpTogetherAreRefused) {
  // Each value alone is fine; together the other ranks would notice the trigger after the deadline.
  const std::string message = error_of({{"OOMFLIGHT_POLL_INTERVAL", "10s"}, {"OOMFLIGHT_DUMP_TIMEOUT", "3s"}});
  EXPECT_NE(message.find("OOMFLIGHT_POLL_INTERVAL=10.000 s is longer than a quarter of OOMFLIGHT_DUMP_TIMEOUT=3.000 s"),
            std::string::npos)
      << message;
  EXPECT_EQ(error_of({{"OOMFLIGHT_POLL_INTERVAL", "500ms"}, {"OOMFLIGHT_DUMP_TIMEOUT", "2s"}}), "");
  EXPECT_NE(error_of({{"OOMFLIGHT_MAX_ENTRIES", "1073741824"}}).find("more than half of this machine's"),
            std::string::npos);
}

// Composer's names and meanings: skip_batches, interval in batches ('3ba'), and a repeat (torchtitan's
// profile_freq). Off unless one is set; each error names the variable, the value and what is wrong.
TEST(Config, SnapshotScheduleIsParsedAndChecked) {
  EXPECT_FALSE(Config::defaults().snapshots());
  EXPECT_EQ(error_of({{"OOMFLIGHT_INTERVAL", "3ba"}}), "");
  for (const auto& [name, value, words] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"OOMFLIGHT_INTERVAL", "3ep", "OOMFLIGHT_INTERVAL='3ep': unit 'ep' is not one oomflight counts"},
           {"OOMFLIGHT_INTERVAL", "3", "OOMFLIGHT_INTERVAL='3': has no unit: write batches as '3ba'"},
           {"OOMFLIGHT_SNAPSHOT_EVERY", "ba", "OOMFLIGHT_SNAPSHOT_EVERY='ba': not a time string in batches"},
           {"OOMFLIGHT_INTERVAL", "0ba", "OOMFLIGHT_INTERVAL='0ba'"},
           {"OOMFLIGHT_SKIP_BATCHES", "-1", "OOMFLIGHT_SKIP_BATCHES='-1': not an integer"},
       }) {
    const std::string message = error_of({{name, value}});
    EXPECT_NE(message.find(words), std::string::npos) << message;
  }
  EXPECT_NE(error_of({{"OOMFLIGHT_INTERVAL", "5ba"}, {"OOMFLIGHT_SNAPSHOT_EVERY", "2ba"}})
                .find("OOMFLIGHT_INTERVAL=5ba is longer than OOMFLIGHT_SNAPSHOT_EVERY=2ba"),
            std::string::npos);
}

TEST(Config, UnknownVariableIsAnError) {
  EXPECT_NE(error_of({{"OOMFLIGHT_MAX_ENTRIS", "10"}}).find("OOMFLIGHT_MAX_ENTRIS is not an oomflight setting"),
            std::string::npos);
}

TEST(Config, ReadmeTableIsGeneratedFromTheOptionTable) {
  std::ifstream in(std::string(OOMFLIGHT_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find(option_table_markdown()), std::string::npos)
      << "README's settings table is stale: paste `oomflight config --markdown` into it";
}

}  // namespace
}  // namespace oomflight
