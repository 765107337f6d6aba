// See archive_summary.hpp.
#include "archive_summary.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace oomflight::cli {

void print_archive_summary(const std::string& path, const ArchiveHeader& h) {
  fmt::print("{}: run {}, kind {}, ranks {} ({} of {}), origins {}\n", path, h.run_name, h.kind,
             fmt::join(h.ranks_present, ","), h.ranks_present.size(), h.world_size,
             h.origin_ranks.empty() ? std::string("none") : fmt::format("{}", fmt::join(h.origin_ranks, ",")));
}

}  // namespace oomflight::cli
