// Escaping for terminals and logs: see printable.hpp.
#include "oomflight/base/printable.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace oomflight {

std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if ((c & 0xe0) == 0xc0) {
    n = 1, cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 2, cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 3, cp = c & 0x07;
  } else {
    return 0;  // a continuation byte, or 0xf8 to 0xff
  }
  if (i + n >= text.size()) return 0;
  for (std::size_t k = 1; k <= n; ++k) {
    const auto cc = static_cast<unsigned char>(text[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n + 1;
}

namespace {

// The code point of the well-formed sequence of `length` bytes at text[i].
std::uint32_t code_point(std::string_view text, std::size_t i, std::size_t length) {
  static constexpr unsigned char kLeadMask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
  std::uint32_t cp = static_cast<unsigned char>(text[i]) & kLeadMask[length];
  for (std::size_t k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
  return cp;
}

bool acts_on_display(std::uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string printable(std::string_view text, LineFeeds line_feeds) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c < 0x80) {  // C0 or DEL
      if (c == '\n' && line_feeds == LineFeeds::keep) {
        out += '\n';
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else {
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      ++i;
      continue;
    }
    if (const std::uint32_t cp = code_point(text, i, length); acts_on_display(cp)) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

}  // namespace oomflight
