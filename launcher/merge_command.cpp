// `oomflight merge FILE... -o ARCHIVE`: rank-local files (from one dump, any subset of its ranks) become one
// archive that report and the exporters read like any other.
#include <fmt/format.h>

#include "archive_summary.hpp"
#include "commands.hpp"
#include "isolate.hpp"
#include "output_guard.hpp"
#include "oomflight/format/archive_merge.hpp"

namespace oomflight::cli {

Command add_merge(CLI::App& app) {
  auto* sub = app.add_subcommand("merge", "Join rank-local files (or archives) of one dump into one archive");
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto output = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  sub->add_option("files", *inputs, "Rank-local files (.h5) of one dump")->required();
  sub->add_option("-o,--output", *output, "The archive to write")->required();
  sub->add_flag("--force", *force, "Replace the output archive if it exists");
  return {sub, [inputs, output, force] {
    if (const std::string why = refuse_output(*output, *inputs, *force, "archive"); !why.empty()) {
      print_error(why);
      return kExitUsage;
    }
    return run_isolated(fmt::format("merge into {}", *output), [&] {
      try {
        const ArchiveHeader h = merge_archives(*inputs, *output);
        print_archive_summary(*output, h);
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
