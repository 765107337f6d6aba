// Filename templates with Composer's braces: "{run_name}/oomflight/{kind}.{batch}.rank{rank}.h5".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// Values a template can name. Placeholders: {run_name}, {rank}, {local_rank}, {world_size}, {batch}, {pid},
/// {host}, {kind}. "{{" and "}}" stand for literal braces.
struct TemplateValues {
  std::string run_name;
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  std::int64_t batch = -1;
  std::int64_t pid = 0;
  std::string host;
  std::string kind;
};

/// Thrown for a malformed template; the message names the template and the bad part.
struct TemplateError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// A parsed template. Parsing validates once at start-up so that rendering at dump time cannot fail.
class OOMFLIGHT_API FilenameTemplate {
 public:
  enum class Field { literal, run_name, rank, local_rank, world_size, batch, pid, host, kind };

  FilenameTemplate() = default;
  /// Parses `text`. Throws TemplateError naming an unknown placeholder ("{rnk}"), an unclosed '{' or a stray
  /// '}'. Not thread-safe to parse into the same object; a parsed template is immutable.
  explicit FilenameTemplate(std::string_view text);

  /// Substitutes the values. Thread-safe. Allocates the result.
  std::string render(const TemplateValues& values) const;

  /// True when the template uses the placeholder.
  bool uses(Field field) const;

  /// The text it was parsed from.
  const std::string& text() const { return text_; }

 private:
  struct Piece {
    Field field;
    std::string literal;
  };
  std::string text_;
  std::vector<Piece> pieces_;
};

}  // namespace oomflight
