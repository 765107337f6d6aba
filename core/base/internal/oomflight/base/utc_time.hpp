// Wall-clock time as text, for archive attributes and generated run names (internal to liboomflight).
#pragma once

#include <string>

namespace oomflight {

/// Current UTC time formatted with strftime's `format` (the result is cut at 63 characters). Thread-safe.
std::string utc_now(const char* format);

/// Current UTC time as ISO 8601, e.g. "2026-11-21T10:15:02Z". Thread-safe.
inline std::string utc_now_iso8601() { return utc_now("%Y-%m-%dT%H:%M:%SZ"); }

}  // namespace oomflight
