// UTC time as text.
#include "oomflight/base/utc_time.hpp"

#include <ctime>

namespace oomflight {

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  return std::string(buf, std::strftime(buf, sizeof(buf), format, &tm));
}

}  // namespace oomflight
