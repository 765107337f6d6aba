// Action names, shared by the archive's HDF5 enumeration, the pickle decoder and the report.
#include "oomflight/event.hpp"

#include <array>

namespace oomflight {
namespace {
constexpr std::array<std::string_view, kActionCount> kNames = {
    "alloc",         "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map",   "segment_unmap",  "oom",            "snapshot",      "step"};
}  // namespace

std::string_view action_name(Action action) {
  const auto i = static_cast<std::size_t>(action);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

std::optional<Action> action_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<Action>(i);
  }
  return std::nullopt;
}

}  // namespace oomflight
