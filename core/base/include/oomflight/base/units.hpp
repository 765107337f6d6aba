// Parsing and printing of byte sizes and durations, for configuration values, flags and reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// Parses a byte size: a non-negative number (decimals allowed) with an optional unit: B, KB, MB, GB, TB
/// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024); K, M, G, T alone mean KiB, MiB, GiB, TiB, as in
/// Slurm and PyTorch's allocator settings. Case-insensitive, spaces between number and unit allowed.
/// Returns bytes. Throws std::invalid_argument naming the text when it is malformed, negative or above 2^64.
OOMFLIGHT_API std::uint64_t parse_bytes(std::string_view text);

/// Prints bytes with a binary unit and two decimals: "512 B", "1.50 KiB", "40.00 GiB". Thread-safe.
OOMFLIGHT_API std::string format_bytes(std::uint64_t bytes);

/// Parses a duration: a number with an optional unit ms, s, m, h; without a unit, seconds ("30" is 30 s).
/// Throws std::invalid_argument naming the text when it is malformed or negative.
OOMFLIGHT_API std::chrono::milliseconds parse_duration(std::string_view text);

/// Prints a duration in seconds with up to three decimals: "0.412 s".
OOMFLIGHT_API std::string format_seconds(double seconds);

/// Seconds from `from_ns` to `to_ns` (nanoseconds of one clock), with the difference taken modulo 2^64: a damaged
/// archive's times can be anything, and INT64_MIN from a time is not defined behaviour (the fuzz target found
/// `end - start` in the HTML report). Pure; thread-safe.
OOMFLIGHT_API double seconds_between(std::int64_t from_ns, std::int64_t to_ns);

}  // namespace oomflight
