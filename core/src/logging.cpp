// The oomflight logger. stderr, so that the job's own stdout stays the job's.
#include "oomflight/logging.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <string>

namespace oomflight {

spdlog::logger& log() {
  static const auto logger = [] {
    auto l = std::make_shared<spdlog::logger>("oomflight", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("oomflight %l: %v");
    l->flush_on(spdlog::level::info);
    return l;
  }();
  return *logger;
}

void set_log_level(std::string_view level) { log().set_level(spdlog::level::from_str(std::string(level))); }

}  // namespace oomflight
