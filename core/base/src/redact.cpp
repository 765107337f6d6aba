// The redaction rule (redact.hpp).
#include "oomflight/base/redact.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace oomflight {

bool looks_secret(std::string_view name) {
  static constexpr std::array<std::string_view, 12> kWords = {"KEY",        "TOKEN", "SECRET", "PASSWORD",
                                                              "PASSWD",     "PASSPHRASE", "CREDENTIAL", "AUTH",
                                                              "COOKIE",     "SESSION", "SIGNATURE", "PRIVATE"};
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  return std::any_of(kWords.begin(), kWords.end(),
                     [&](std::string_view w) { return upper.find(w) != std::string::npos; });
}

std::string redacted(std::string_view name, std::string_view value) {
  return looks_secret(name) ? std::string(kRedacted) : redacted_urls(value);
}

std::string redacted_urls(std::string_view text) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t scheme_end = text.find("://", i);
    if (scheme_end == std::string_view::npos) break;
    const std::size_t start = scheme_end + 3;
    std::size_t end = start;
    while (end < text.size() && text[end] != '/' && text[end] != '?' && text[end] != '#' && text[end] != '"' &&
           text[end] != '\'' && std::isspace(static_cast<unsigned char>(text[end])) == 0) {
      ++end;
    }
    const std::size_t at = text.substr(start, end - start).rfind('@');
    out.append(text, i, start - i);
    if (at != std::string_view::npos && at > 0) {
      out += kRedacted;
      out.append(text, start + at, end - (start + at));
    } else {
      out.append(text, start, end - start);
    }
    i = end;
  }
  out.append(text, i, std::string_view::npos);
  return out;
}

namespace {

bool name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
}

// Every NAME=VALUE inside `arg` whose NAME looks secret gets its VALUE replaced: "--api-key=x", "API_KEY=x" before a
// command, and `wandb_api_key="x"` inside a `python -c` script alike. A quoted value ends at its closing quote,
// a bare one at whitespace, a comma, a semicolon or a closing parenthesis.
std::string redact_assignments(const std::string& arg) {
  std::string out;
  std::size_t i = 0;
  while (i < arg.size()) {
    const std::size_t eq = arg.find('=', i);
    if (eq == std::string::npos) break;
    std::size_t name_start = eq;
    while (name_start > i && name_char(arg[name_start - 1])) --name_start;
    out.append(arg, i, eq + 1 - i);
    i = eq + 1;
    if (name_start == eq || !looks_secret(std::string_view(arg).substr(name_start, eq - name_start))) continue;
    std::size_t end = i;
    if (end < arg.size() && (arg[end] == '"' || arg[end] == '\'')) {
      const char quote = arg[end];
      const std::size_t close = arg.find(quote, end + 1);
      out += quote;
      out += kRedacted;
      if (close == std::string::npos) return out;  // unterminated: everything after is the value
      out += quote;
      i = close + 1;
      continue;
    }
    while (end < arg.size() && !std::isspace(static_cast<unsigned char>(arg[end])) && arg[end] != ',' &&
           arg[end] != ';' && arg[end] != ')') {
      ++end;
    }
    out += kRedacted;
    i = end;
  }
  out.append(arg, i, std::string::npos);
  return out;
}

}  // namespace

std::string redacted_command_line(const std::vector<std::string>& arguments) {
  std::string out;
  bool hide_next = false;
  for (const std::string& arg : arguments) {
    if (!out.empty()) out += ' ';
    if (hide_next) {
      out += kRedacted;
      hide_next = false;
      continue;
    }
    const bool option = arg.size() > 1 && arg[0] == '-';
    out += redacted_urls(redact_assignments(arg));
    hide_next = option && arg.find('=') == std::string::npos && looks_secret(arg);
  }
  return out;
}

}  // namespace oomflight
