// `oomflight export ARCHIVE --format memory_viz|perfetto|folded`: an archive in the formats other tools open.
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "commands.hpp"
#include "isolate.hpp"
#include "oomflight/control/filename_template.hpp"
#include "oomflight/export/folded.hpp"
#include "oomflight/export/memory_viz.hpp"
#include "oomflight/export/perfetto.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "output_file.hpp"
#include "output_guard.hpp"

namespace oomflight::cli {
namespace {

// Composer's MemorySnapshot names its pickles rank{rank}.{batch}.memory_snapshot; the extension says what it is.
constexpr const char* kDefaultMemoryVizName = "rank{rank}.{batch}.memory_snapshot.pickle";

struct ExportOptions {
  std::string archive;
  std::string format;
  std::string output;
  std::string filename = kDefaultMemoryVizName;
  std::vector<int> ranks;
};

int export_memory_viz(const Archive& a, const ExportOptions& o, const FilenameTemplate& name) {
  const std::filesystem::path folder = o.output.empty() ? std::filesystem::path(".") : std::filesystem::path(o.output);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) {
    print_error(fmt::format("cannot create the folder {} for the snapshots: {}", folder.string(), ec.message()));
    return kExitFailure;
  }
  const std::set<int> wanted(o.ranks.begin(), o.ranks.end());
  const std::size_t ranks = wanted.empty() ? a.ranks.size() : wanted.size();
  if (ranks > 1 && !name.uses(FilenameTemplate::Field::rank)) {
    print_error(fmt::format("--filename {} has no {{rank}}: the snapshots of {} ranks would overwrite each other",
                            name.text(), ranks));
    return kExitUsage;
  }
  int written = 0;
  for (const RankRow& row : a.ranks) {
    if (!wanted.empty() && !wanted.count(row.rank)) continue;
    TemplateValues v;
    v.run_name = a.header.run_name;
    v.rank = row.rank;
    v.local_rank = row.local_rank;
    v.world_size = a.header.world_size;
    v.batch = row.batch;
    v.pid = row.pid;
    v.host = fixed_string(row.host);
    v.kind = a.header.kind;
    const std::filesystem::path path = folder / name.render(v);
    if (const std::string why = refuse_output(path.string(), {o.archive}, true, "export"); !why.empty()) {
      print_error(why);
      return kExitUsage;
    }
    std::filesystem::create_directories(path.parent_path(), ec);
    MemoryVizNotes notes;
    const std::string bytes = render_memory_viz(a, row, &notes);
    if (auto error = write_file_atomically(path.string(), bytes, fmt::format("snapshot of rank {}", row.rank));
        !error.empty()) {
      print_error(error);
      return kExitFailure;
    }
    std::string extra;
    if (notes.blocks_outside_segments) {
      extra += fmt::format("; {} live blocks lay outside every recorded segment (no segment_alloc for them in the "
                           "history: overwritten, or never recorded) and got a segment of their own",
                           notes.blocks_outside_segments);
    }
    if (notes.unreadable_fields) {
      extra += fmt::format("; {} of the source snapshot's fields in /context were not a readable pickle (a damaged "
                           "file) and were left out", notes.unreadable_fields);
    }
    fmt::print("{}: rank {}, {} trace entries, {} segments{}\n", path.string(), row.rank, notes.events,
               notes.segments, extra);
    ++written;
  }
  if (written == 0) {
    print_error(fmt::format("{} holds none of the ranks asked for", o.archive));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

Command add_export(CLI::App& app) {
  auto* sub = app.add_subcommand("export", "Write an archive in another tool's format (memory_viz, Perfetto, flame graphs)");
  auto o = std::make_shared<ExportOptions>();
  sub->add_option("archive", o->archive, "The archive (.h5)")->required();
  sub->add_option("--format", o->format,
                  "memory_viz: one PyTorch snapshot pickle per rank (pytorch.org/memory_viz); perfetto: one Chrome "
                  "trace JSON of every rank (ui.perfetto.dev); folded: folded stacks of live bytes (flamegraph.pl)")
      ->required()
      ->check(CLI::IsMember({"memory_viz", "perfetto", "folded"}));
  sub->add_option("-o,--output", o->output,
                  "memory_viz: the folder (default: .); perfetto, folded: the file (default: ARCHIVE's name with "
                  ".perfetto.json or .folded)");
  sub->add_option("--filename", o->filename, "memory_viz: the per-rank file name template")->capture_default_str();
  sub->add_option("--ranks", o->ranks, "Only these ranks (memory_viz)")->delimiter(',')->check(CLI::Range(0, kMaxRank));
  return {sub, [o] {
    FilenameTemplate name;
    try {
      name = FilenameTemplate(o->filename);
    } catch (const std::exception& e) {
      print_error(fmt::format("--filename: {}", e.what()));
      return kExitUsage;
    }
    return run_isolated(o->archive, [&] {
      try {
        const Archive a = read_archive(o->archive);
        if (o->format == "memory_viz") return export_memory_viz(a, *o, name);
        const bool perfetto = o->format == "perfetto";
        std::string path = o->output;
        if (path.empty()) {
          path = std::filesystem::path(o->archive).replace_extension(perfetto ? ".perfetto.json" : ".folded").string();
        }
        // An export may replace an earlier export, never the archive it is made from.
        if (const std::string why = refuse_output(path, {o->archive}, true, "export"); !why.empty()) {
          print_error(why);
          return kExitUsage;
        }
        const std::string bytes = perfetto ? render_perfetto(a) : render_folded(a);
        if (auto error = write_file_atomically(path, bytes, perfetto ? "Perfetto trace" : "folded stacks");
            !error.empty()) {
          print_error(error);
          return kExitFailure;
        }
        fmt::print("{}: {} of {} ranks, {} bytes\n", path, perfetto ? "Perfetto trace" : "folded stacks",
                   a.ranks.size(), bytes.size());
        return kExitOk;
      } catch (const std::exception& e) {
        print_error(e.what());
        return kExitFailure;
      }
    });
  }};
}

}  // namespace oomflight::cli
