// Lookups in a fixed table of names indexed by an enumeration's values (internal to liboomflight): the actions'
// names, the dump kinds' names. One table per enumeration is the only place its names are spelt.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace oomflight {

/// names[index], or "unknown" for an index out of range. Thread-safe; the view points at the table's storage.
template <std::size_t N>
constexpr std::string_view name_at(const std::array<std::string_view, N>& names, std::size_t index) {
  return index < N ? names[index] : std::string_view("unknown");
}

/// The index of `name` in the table (exact match), or nothing.
template <std::size_t N>
constexpr std::optional<std::size_t> index_of(const std::array<std::string_view, N>& names, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == name) return i;
  }
  return std::nullopt;
}

}  // namespace oomflight
