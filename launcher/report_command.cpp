// `oomflight report ARCHIVE`: the post-mortem across ranks, as text.
#include <fmt/format.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/text_report.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight::cli {

Command add_report(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Print the post-mortem of an archive (or a rank-local file)");
  auto path = std::make_shared<std::string>();
  auto top = std::make_shared<std::size_t>(10);
  auto frames = std::make_shared<std::size_t>(6);
  sub->add_option("archive", *path, "The archive (.h5)")->required();
  sub->add_option("--top", *top, "Largest live allocations to list per origin")->capture_default_str();
  sub->add_option("--frames", *frames, "Frames to show per allocation")->capture_default_str();
  return {sub, [path, top, frames] {
    // Whatever the file holds, report ends with its text or a message, never on a signal (isolate.hpp).
    return run_isolated(*path, [&] {
      try {
        const Archive archive = read_archive(*path);
        fmt::print("{}", render_report(archive, analyze(archive, *top), *frames));
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
