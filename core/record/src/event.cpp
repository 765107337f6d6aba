// Action names, shared by the archive's HDF5 enumeration, the pickle decoder and the report.
#include "oomflight/record/event.hpp"

#include "oomflight/base/name_table.hpp"

namespace oomflight {
namespace {
constexpr std::array<std::string_view, kActionCount> kNames = {
    "alloc",         "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map",   "segment_unmap",  "oom",            "snapshot",      "step"};
}  // namespace

std::string_view action_name(Action action) { return name_at(kNames, static_cast<std::size_t>(action)); }

std::optional<Action> action_from_name(std::string_view name) {
  const auto i = index_of(kNames, name);
  return i ? std::optional<Action>(static_cast<Action>(*i)) : std::nullopt;
}

}  // namespace oomflight
