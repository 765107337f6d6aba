// A rank's environment for the archive (environment.hpp).
#include "environment.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "oomflight/base/redact.hpp"
#include "oomflight/version.h"

extern char** environ;

namespace oomflight {
namespace {

bool wanted(std::string_view name) {
  static constexpr std::array<std::string_view, 6> kPrefixes = {"CUDA_", "NCCL_", "PYTORCH_", "TORCH_",
                                                                "OMPI_COMM_WORLD_", "SLURM_JOB"};
  static constexpr std::array<std::string_view, 5> kNames = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                                                             "WORLD_SIZE"};
  return std::any_of(kPrefixes.begin(), kPrefixes.end(), [&](std::string_view p) { return name.starts_with(p); }) ||
         std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

std::vector<std::string> command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t end = all.find('\0', start);
    args.push_back(all.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return args;
}

}  // namespace

std::vector<ContextEntry> capture_environment(const RankIdentity& identity, const Config& config) {
  std::vector<ContextEntry> out;
  const auto add = [&](std::string key, std::string value) {
    out.push_back(ContextEntry{ContextEntry::Kind::environment, -1, std::move(key), std::move(value)});
  };
  add("host", identity.host);
  add("pid", std::to_string(identity.pid));
  add("rank", std::to_string(identity.rank));
  std::error_code ec;
  add("cwd", std::filesystem::current_path(ec).string());
  add("command_line", redacted_command_line(command_line()));
  add("oomflight_version", OOMFLIGHT_VERSION_STRING);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) {
    std::array<char, MPI_MAX_LIBRARY_VERSION_STRING> version{};
    int length = 0;
    MPI_Get_library_version(version.data(), &length);
    std::string text(version.data(), static_cast<std::size_t>(std::max(length, 0)));
    text = text.substr(0, text.find_first_of("\r\n"));
    add("mpi_library", text);
  }
  for (const auto& [name, value] : config.given) add(name, value);
  std::vector<std::pair<std::string, std::string>> variables;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos || !wanted(entry.substr(0, eq))) continue;
    variables.emplace_back(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  std::sort(variables.begin(), variables.end());
  for (auto& [name, value] : variables) add(std::move(name), std::move(value));
  return out;  // ContextLog::set_environment redacts by key
}

}  // namespace oomflight
