// A rank's context: see rank_context.hpp.
#include "oomflight/export/rank_context.hpp"

#include <algorithm>

#include "oomflight/record/context_log.hpp"

namespace oomflight {

RankContext rank_context(const Archive& a, int rank) {
  RankContext out;
  for (const ContextRow& c : a.context_of(rank)) {
    std::string key(a.string(c.key)), value(a.string(c.value));
    if (c.kind == 0) {
      if (key == "host") out.host = value;
      if (key == "command_line") out.command = value;
      continue;
    }
    // An imported snapshot's own fields and layout are for the memory_viz export, not the job's metadata.
    if (c.kind != static_cast<std::uint8_t>(ContextEntry::Kind::metadata)) continue;
    const auto it = std::find_if(out.metadata.begin(), out.metadata.end(), [&](const auto& m) { return m.first == key; });
    if (it == out.metadata.end()) {
      out.metadata.emplace_back(std::move(key), std::move(value));
    } else {
      it->second = std::move(value);
    }
  }
  return out;
}

}  // namespace oomflight
