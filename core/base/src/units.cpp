// Byte sizes and durations: parsing for configuration and flags, printing for logs and reports.
#include "oomflight/base/units.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fmt/format.h>

namespace oomflight {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "12.5 GiB" into 12.5 and "gib"; throws when there is no number.
std::pair<double, std::string> split_number(std::string_view text, std::string_view what) {
  const std::string_view s = trim(text);
  std::size_t end = 0;
  while (end < s.size() && (std::isdigit(static_cast<unsigned char>(s[end])) || s[end] == '.')) ++end;
  double value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + end, value);
  if (end == 0 || ec != std::errc() || ptr != s.data() + end || !std::isfinite(value)) {
    throw std::invalid_argument(fmt::format("'{}' is not a {}", text, what));
  }
  return {value, lower(trim(s.substr(end)))};
}

}  // namespace

std::uint64_t parse_bytes(std::string_view text) {
  const auto [value, unit] = split_number(text, "byte size (examples: 4096, 512MiB, 40GiB, 1.5GB)");
  struct Unit { std::string_view name; double factor; };
  static constexpr std::array<Unit, 14> kUnits = {{{"", 1.0},
                                                   {"b", 1.0},
                                                   {"kb", 1e3},
                                                   {"mb", 1e6},
                                                   {"gb", 1e9},
                                                   {"tb", 1e12},
                                                   {"kib", 1024.0},
                                                   {"mib", 1048576.0},
                                                   {"gib", 1073741824.0},
                                                   {"tib", 1099511627776.0},
                                                   {"k", 1024.0},
                                                   {"m", 1048576.0},
                                                   {"g", 1073741824.0},
                                                   {"t", 1099511627776.0}}};
  for (const auto& u : kUnits) {
    if (u.name == unit) {
      const double bytes = std::round(value * u.factor);
      if (bytes >= 18446744073709551616.0) {
        throw std::invalid_argument(fmt::format("'{}' is larger than 2^64 bytes", text));
      }
      return static_cast<std::uint64_t>(bytes);
    }
  }
  throw std::invalid_argument(
      fmt::format("'{}' has an unknown unit '{}' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)", text, unit));
}

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes);
  std::size_t i = 0;
  while (v >= 1024.0 && i + 1 < kNames.size()) {
    v /= 1024.0;
    ++i;
  }
  return fmt::format("{:.2f} {}", v, kNames[i]);
}

std::chrono::milliseconds parse_duration(std::string_view text) {
  const auto [value, unit] = split_number(text, "duration (examples: 30, 30s, 500ms, 2m)");
  double ms = 0;
  if (unit.empty() || unit == "s") {
    ms = value * 1e3;
  } else if (unit == "ms") {
    ms = value;
  } else if (unit == "m" || unit == "min") {
    ms = value * 60e3;
  } else if (unit == "h") {
    ms = value * 3600e3;
  } else {
    throw std::invalid_argument(fmt::format("'{}' has an unknown unit '{}' (use ms, s, m or h)", text, unit));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(ms)));
}

std::string format_seconds(double seconds) { return fmt::format("{:.3f} s", seconds); }

double seconds_between(std::int64_t from_ns, std::int64_t to_ns) {
  return static_cast<double>(static_cast<std::int64_t>(static_cast<std::uint64_t>(to_ns) -
                                                       static_cast<std::uint64_t>(from_ns))) *
         1e-9;
}

}  // namespace oomflight
