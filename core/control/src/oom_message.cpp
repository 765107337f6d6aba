// Reading the figures of PyTorch's out-of-memory message: see oom_message.hpp.
#include "oomflight/control/oom_message.hpp"

#include <cmath>

namespace oomflight {
namespace {

// The multiplier of torch's format_size unit, or 0.
double unit_bytes(std::string_view unit) {
  if (unit == "bytes") return 1.0;
  if (unit == "KiB") return 1024.0;
  if (unit == "MiB") return 1048576.0;
  if (unit == "GiB") return 1073741824.0;
  return 0.0;
}

// "12.34 GiB" (or "512 bytes") as bytes: the number (digits, at most one '.') and the unit after one space.
std::optional<std::uint64_t> size_of(std::string_view number, std::string_view unit) {
  const double scale = unit_bytes(unit);
  if (number.empty() || number.size() > 24 || scale == 0.0) return std::nullopt;
  double value = 0;
  double fraction = 0;  // 0: before the point; else the weight of the next digit
  for (const char c : number) {
    if (c == '.') {
      if (fraction != 0) return std::nullopt;
      fraction = 0.1;
    } else if (c >= '0' && c <= '9') {
      if (fraction == 0) {
        value = value * 10 + (c - '0');
      } else {
        value += (c - '0') * fraction;
        fraction /= 10;
      }
    } else {
      return std::nullopt;
    }
  }
  const double bytes = std::round(value * scale);
  if (!(bytes < 18446744073709551616.0)) return std::nullopt;  // 2^64
  return static_cast<std::uint64_t>(bytes);
}

bool is_number_char(char c) { return (c >= '0' && c <= '9') || c == '.'; }

// The size that starts right after `after` in text (the first occurrence), e.g. after "Tried to allocate ".
std::optional<std::uint64_t> size_after(std::string_view text, std::string_view after) {
  const std::size_t at = text.find(after);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = text.substr(at + after.size());
  std::size_t n = 0;
  while (n < rest.size() && is_number_char(rest[n])) ++n;
  if (n == 0 || n >= rest.size() || rest[n] != ' ') return std::nullopt;
  const std::string_view number = rest.substr(0, n);
  rest.remove_prefix(n + 1);
  std::size_t u = 0;
  while (u < rest.size() && rest[u] != ' ' && rest[u] != '.' && rest[u] != ';' && rest[u] != ',') ++u;
  return size_of(number, rest.substr(0, u));
}

// The size that ends right before `before` in text, e.g. "4.00 GiB" before " allowed; ".
std::optional<std::uint64_t> size_before(std::string_view text, std::string_view before) {
  const std::size_t at = text.find(before);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view head = text.substr(0, at);
  const std::size_t space = head.rfind(' ');
  if (space == std::string_view::npos || space == 0) return std::nullopt;
  const std::string_view unit = head.substr(space + 1);
  std::size_t start = space;
  while (start > 0 && is_number_char(head[start - 1])) --start;
  return size_of(head.substr(start, space - start), unit);
}

}  // namespace

OomMessageFigures parse_oom_message(std::string_view message) noexcept {
  OomMessageFigures f;
  // Only torch's CUDA message: its first sentence names it. (Other runtimes' messages state other things.)
  if (message.find("out of memory. Tried to allocate ") == std::string_view::npos) return f;
  f.requested_bytes = size_after(message, "Tried to allocate ");
  f.device_capacity_bytes = size_after(message, " has a total capacity of ");
  f.device_free_bytes = size_after(message, " of which ");
  if (f.device_free_bytes && message.find(" is free", message.find(" of which ")) == std::string_view::npos) {
    f.device_free_bytes.reset();
  }
  f.memory_cap_bytes = size_before(message, " allowed; ");
  return f;
}

}  // namespace oomflight
