// The recorder's logger: one spdlog logger, "oomflight", writing to stderr.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "oomflight/export.hpp"

namespace oomflight {

/// The process's oomflight logger (created on first use; thread-safe).
OOMFLIGHT_API spdlog::logger& log();

/// Sets the level by name (trace, debug, info, warn, error, off). Thread-safe.
OOMFLIGHT_API void set_log_level(std::string_view level);

}  // namespace oomflight
