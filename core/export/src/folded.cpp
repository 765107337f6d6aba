// Folded stacks of live bytes: see folded.hpp.
#include "oomflight/export/folded.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/base/printable.hpp"
#include "oomflight/export/user_frames.hpp"

namespace oomflight {
namespace {

// A frame as one folded segment: the separator ';' may not appear inside it, nor a line feed (one stack per line),
// nor anything a terminal acts on (the file is text that people cat and grep): printable() shows those as escapes.
std::string frame_text(const Archive& a, const FrameRow& f) {
  std::string s = printable(fmt::format("{} ({}:{})", a.string(f.function), a.string(f.file), f.line));
  std::replace(s.begin(), s.end(), ';', ':');
  return s;
}

}  // namespace

std::string render_folded(const Archive& a) {
  std::map<std::string, std::uint64_t> lines;
  for (const RankRow& row : a.ranks) {
    for (const auto& [stack_id, bytes] : live_bytes_by_stack(a, row)) {
      std::string line = fmt::format("rank {}", row.rank);
      const auto frames = a.stack(stack_id);
      bool any = false;
      for (auto it = frames.rbegin(); it != frames.rend(); ++it) {  // outermost first
        if (allocator_frame(a, **it)) continue;
        line += ';';
        line += frame_text(a, **it);
        any = true;
      }
      if (!any) line += frames.empty() ? ";<no stack recorded>" : ";<allocator frames only>";
      lines[line] += bytes;
    }
  }
  std::string out;
  for (const auto& [line, bytes] : lines) out += fmt::format("{} {}\n", line, bytes);
  return out;
}

}  // namespace oomflight
