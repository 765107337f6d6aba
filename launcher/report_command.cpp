// `oomflight report ARCHIVE [--html FILE]`: the post-mortem across ranks, as text, and as one HTML page.
#include <memory>
#include <string>

#include <fmt/format.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "output_file.hpp"
#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/html_report.hpp"
#include "oomflight/export/text_report.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight::cli {

Command add_report(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Print the post-mortem of an archive (or a rank-local file)");
  auto path = std::make_shared<std::string>();
  auto top = std::make_shared<std::size_t>(10);
  auto frames = std::make_shared<std::size_t>(6);
  auto html = std::make_shared<std::string>();
  sub->add_option("archive", *path, "The archive (.h5)")->required();
  sub->add_option("--top", *top, "Largest live allocations to list per origin")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  sub->add_option("--frames", *frames, "Frames to show per allocation")->capture_default_str()->check(CLI::Range(0, 1000));
  sub->add_option("--html", *html, "Also write the post-mortem as one self-contained HTML file")
      ->option_text("FILE");
  return {sub, [path, top, frames, html] {
    // Whatever the file holds, report ends with its text or a message, never on a signal (isolate.hpp); the page
    // is rendered in the same child, from the same reading.
    return run_isolated(*path, [&] {
      try {
        const Archive archive = read_archive(*path);
        const PostMortem pm = analyze(archive, *top);
        fmt::print("{}", render_report(archive, pm, *frames));
        if (!html->empty()) {
          if (const std::string error =
                  write_file_atomically(*html, render_html_report(archive, pm, *frames), "HTML report");
              !error.empty()) {
            print_error(error);
            return kExitFailure;
          }
        }
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
