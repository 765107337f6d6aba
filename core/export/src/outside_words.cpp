#include "oomflight/export/outside_words.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "oomflight/base/units.hpp"

namespace oomflight {

std::string outside_cell(const RankRow& row) {
  return row.outside_allocator_bytes < 0 ? "?" : format_bytes(static_cast<std::uint64_t>(row.outside_allocator_bytes));
}

std::string outside_standout_line(const PostMortem& pm) {
  std::vector<std::pair<std::int64_t, std::int32_t>> known;  // (bytes, rank)
  for (const RankSummary& s : pm.ranks) {
    if (s.row.outside_allocator_bytes >= 0) known.emplace_back(s.row.outside_allocator_bytes, s.row.rank);
  }
  if (known.size() < 2) return "";
  std::sort(known.begin(), known.end());
  const auto [most, rank] = known.back();
  const std::int64_t median = known[(known.size() - 1) / 2].first;  // the lower median: of two, the other rank
  // Both are 0 .. 2^63 - 1: the difference fits, and twice it fits unsigned (a hostile file's figures included).
  const auto above = static_cast<std::uint64_t>(most - median);
  if (above < (std::uint64_t{256} << 20) || above * 2 < static_cast<std::uint64_t>(median)) return "";
  return fmt::format("rank {} holds {} outside the caching allocator, the median rank {} (+{}): NCCL's buffers, the "
                     "CUDA context and the libraries' workspaces are not in its snapshot",
                     rank, format_bytes(static_cast<std::uint64_t>(most)),
                     format_bytes(static_cast<std::uint64_t>(median)),
                     format_bytes(static_cast<std::uint64_t>(most - median)));
}

std::string outside_unknown_line(const PostMortem& pm) {
  for (const RankSummary& s : pm.ranks) {
    if (s.row.outside_allocator_bytes >= 0) return "";
  }
  return "memory outside the caching allocator: unknown on every rank (no NVML where they ran, or it did not list "
         "their processes; archives before oomflight 0.3 do not record it)";
}

}  // namespace oomflight
