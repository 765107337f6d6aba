// What an origin did, by the archive's kind, in the words every export uses alike (the text report, the HTML page,
// Perfetto's process names): it ran out of memory, crossed OOMFLIGHT_HEADROOM_DUMP's threshold (issue 42), or asked
// for the dump (a signal, the API, a teardown). A kind the reader does not know is "asked for".
#pragma once

#include <string>
#include <string_view>

namespace oomflight {

/// The mark beside an origin's row: "out of memory", "crossed the headroom threshold" or "asked for the dump". Pure.
inline const char* origin_mark(std::string_view kind) {
  if (kind == "oom") return "out of memory";
  if (kind == "headroom") return "crossed the headroom threshold";
  return "asked for the dump";
}

/// What a non-oom origin did, for its line under "origin:": "crossed the headroom threshold", or "asked for a
/// signal dump" / "asked for an exit dump" (`kind` as given: the caller makes it printable). Pure.
inline std::string origin_deed(std::string_view kind) {
  if (kind == "headroom") return "crossed the headroom threshold";
  const bool vowel = !kind.empty() && std::string_view("aeiou").find(kind.front()) != std::string_view::npos;
  return std::string(vowel ? "asked for an " : "asked for a ") + std::string(kind) + " dump";
}

}  // namespace oomflight
