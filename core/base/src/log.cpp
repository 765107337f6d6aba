// The oomflight log: one stderr logger whose pattern gains the rank once it is known.
#include "oomflight/base/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>
#include <string>

#include "oomflight/base/printable.hpp"

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

// The message of a line, made printable (%v would copy it as it is): a log line quotes what the job named (a
// communicator, a reason, a path), and neither a control sequence nor a line feed of the job's reaches stderr
// through oomflight.
class PrintableMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text = printable(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<PrintableMessage>(); }
};

void set_pattern(spdlog::logger& logger, const std::string& pattern) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PrintableMessage>('*').set_pattern(pattern);
  logger.set_formatter(std::move(formatter));
}

}  // namespace

spdlog::logger& log() {
  // Never destroyed (a heap object, not a static one): the watcher, an exit handler or a plugin's callback may log
  // while the process's static destructors run, and a destroyed logger crashed a job's exit (issue 29).
  static spdlog::logger* const logger = [] {
    auto* l = new spdlog::logger("oomflight", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    set_pattern(*l, "oomflight %l: %*");
    l->flush_on(spdlog::level::trace);
    return l;
  }();
  return *logger;
}

void set_log_level(std::string_view level) { log().set_level(spdlog::level::from_str(std::string(level))); }

void set_log_rank(int rank) { set_pattern(log(), "oomflight[rank " + std::to_string(rank) + "] %l: %*"); }

void log_message(LogLevel level, std::string_view message) {
  if (level == LogLevel::off) return;
  log().log(to_spdlog(level), "{}", message);
}

}  // namespace oomflight
