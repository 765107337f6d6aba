// Where a write's time goes, for the debug log ("layout 0.6 ms, rows 2.1 ms, ..."): on a parallel file system
// the split shows which step is slow (docs/performance.md was measured so). Internal to the format wing.
#pragma once

#include <chrono>
#include <fmt/format.h>
#include <string>

namespace oomflight::format_detail {

class WritePhases {
 public:
  /// Ends the phase under way as `name`. Not thread-safe.
  void mark(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    text_ += fmt::format("{}{} {:.1f} ms", text_.empty() ? "" : ", ", name,
                         std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const std::string& text() const { return text_; }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string text_;
};

}  // namespace oomflight::format_detail
