// Filename template parsing (once, at start-up) and rendering (at dump time).
#include "oomflight/control/filename_template.hpp"

#include <algorithm>
#include <array>
#include <fmt/format.h>
#include <utility>

namespace oomflight {
namespace {
constexpr std::array<std::pair<std::string_view, FilenameTemplate::Field>, 8> kFields = {{
    {"run_name", FilenameTemplate::Field::run_name},
    {"rank", FilenameTemplate::Field::rank},
    {"local_rank", FilenameTemplate::Field::local_rank},
    {"world_size", FilenameTemplate::Field::world_size},
    {"batch", FilenameTemplate::Field::batch},
    {"pid", FilenameTemplate::Field::pid},
    {"host", FilenameTemplate::Field::host},
    {"kind", FilenameTemplate::Field::kind},
}};
}  // namespace

FilenameTemplate::FilenameTemplate(std::string_view text) : text_(text) {
  std::string literal;
  auto flush = [&] {
    if (!literal.empty()) pieces_.push_back({Field::literal, std::exchange(literal, {})});
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      literal += c;
      ++i;
      continue;
    }
    if (c == '}') {
      throw TemplateError(fmt::format("filename template '{}': stray '}}' at position {} (write '}}}}' for a brace)",
                                      text, i));
    }
    if (c != '{') {
      literal += c;
      continue;
    }
    const auto close = text.find('}', i);
    if (close == std::string_view::npos) {
      throw TemplateError(fmt::format("filename template '{}': '{{' at position {} is not closed", text, i));
    }
    const std::string_view name = text.substr(i + 1, close - i - 1);
    const auto it = std::find_if(kFields.begin(), kFields.end(), [&](const auto& f) { return f.first == name; });
    if (it == kFields.end()) {
      throw TemplateError(fmt::format(
          "filename template '{}': unknown placeholder '{{{}}}' (known: {{run_name}}, {{rank}}, {{local_rank}}, "
          "{{world_size}}, {{batch}}, {{pid}}, {{host}}, {{kind}})",
          text, name));
    }
    flush();
    pieces_.push_back({it->second, {}});
    i = close;
  }
  flush();
}

std::string FilenameTemplate::render(const TemplateValues& v) const {
  std::string out;
  for (const auto& p : pieces_) {
    switch (p.field) {
      case Field::literal: out += p.literal; break;
      case Field::run_name: out += v.run_name; break;
      case Field::rank: out += std::to_string(v.rank); break;
      case Field::local_rank: out += std::to_string(v.local_rank); break;
      case Field::world_size: out += std::to_string(v.world_size); break;
      case Field::batch: out += std::to_string(v.batch); break;
      case Field::pid: out += std::to_string(v.pid); break;
      case Field::host: out += v.host; break;
      case Field::kind: out += v.kind; break;
    }
  }
  return out;
}

bool FilenameTemplate::uses(Field field) const {
  return std::any_of(pieces_.begin(), pieces_.end(), [&](const Piece& p) { return p.field == field; });
}

}  // namespace oomflight
