// The table of dump kinds: the only place their names are spelt.
#include "oomflight/format/archive_schema.hpp"

#include "oomflight/base/name_table.hpp"

namespace oomflight {
namespace {
constexpr std::array<std::string_view, kDumpKindCount> kKindNames = {"oom", "snapshot", "signal", "exit", "headroom"};
}  // namespace

std::string_view dump_kind_name(DumpKind kind) { return name_at(kKindNames, static_cast<std::size_t>(kind)); }

std::optional<DumpKind> dump_kind_from_name(std::string_view name) {
  const auto i = index_of(kKindNames, name);
  return i ? std::optional<DumpKind>(static_cast<DumpKind>(*i)) : std::nullopt;
}

}  // namespace oomflight
