// The oomflight log: one stderr logger whose pattern gains the rank once it is known.
#include "oomflight/base/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <string>

namespace oomflight {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: break;
  }
  return spdlog::level::off;
}

}  // namespace

spdlog::logger& log() {
  // Never destroyed (a heap object, not a static one): the watcher, an exit handler or a plugin's callback may log
  // while the process's static destructors run, and a destroyed logger crashed a job's exit (issue 29).
  static spdlog::logger* const logger = [] {
    auto* l = new spdlog::logger("oomflight", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("oomflight %l: %v");
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

void set_log_level(std::string_view level) { log().set_level(spdlog::level::from_str(std::string(level))); }

void set_log_rank(int rank) { log().set_pattern("oomflight[rank " + std::to_string(rank) + "] %l: %v"); }

void log_message(LogLevel level, std::string_view message) {
  if (level == LogLevel::off) return;
  log().log(to_spdlog(level), "{}", message);
}

}  // namespace oomflight
