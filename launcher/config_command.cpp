// `oomflight config`: the OOMFLIGHT_* settings, their defaults and this environment's values.
#include <fmt/format.h>

#include "commands.hpp"
#include "oomflight/control/config.hpp"

namespace oomflight::cli {

Command add_config(CLI::App& app) {
  auto* sub = app.add_subcommand("config", "List the OOMFLIGHT_* settings and check this environment's values");
  auto markdown = std::make_shared<bool>(false);
  sub->add_flag("--markdown", *markdown, "Print the settings as the README's Markdown table");
  return {sub, [markdown] {
    if (*markdown) {
      fmt::print("{}", option_table_markdown());
      return kExitOk;
    }
    for (const auto& s : option_table()) {
      fmt::print("{:<26} {:<9} default {:<28} {}\n", s.env, s.type,
                 s.default_value.empty() ? "(empty)" : std::string(s.default_value), s.description);
    }
    try {
      Config::from_environment();
      fmt::print("\nthis environment's OOMFLIGHT_* values are valid\n");
      return kExitOk;
    } catch (const ConfigError& e) {
      print_error(e.what());
      return kExitUsage;
    }
  }};
}

}  // namespace oomflight::cli
