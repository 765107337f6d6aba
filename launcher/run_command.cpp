// `oomflight run [--run-name NAME] [--python|--no-python] -- CMD...`: sets the environment, checks it, and execs
// CMD. NCCL_PROFILER_PLUGIN names oomflight's NCCL profiler plugin when it is installed. For a Python command it
// also makes Python load oomflight's package at start-up (a sitecustomize on PYTHONPATH,
// python/oomflight/_bootstrap), so `mpirun -np N oomflight run -- python train.py` records with no change to
// train.py.
#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <optional>

#include "commands.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/oomflight.h"

namespace oomflight::cli {
namespace {

namespace fs = std::filesystem;

// The command is a Python interpreter (python, python3, python3.11, pythonw) or torchrun, whose workers inherit the
// environment (its own process starts no session: oomflight/_autostart.py), by the executable's name.
bool is_python(const std::string& command) {
  const std::string name = fs::path(command).filename().string();
  return name.rfind("python", 0) == 0 || name == "torchrun";
}

// The folder that holds the `oomflight` Python package this executable belongs to: a CMake install's
// (PREFIX/share/oomflight/python, beside PREFIX/bin/oomflight), a pip install's (site-packages, which holds
// oomflight/bin/oomflight itself), else the source tree this executable was built from (none for a pip build).
std::optional<fs::path> python_package_root() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    const fs::path prefix = exe.parent_path().parent_path();
    candidates.push_back(prefix / "share" / "oomflight" / "python");
    if (prefix.filename() == "oomflight") candidates.push_back(prefix.parent_path());
  }
  if (*OOMFLIGHT_PYTHON_SOURCE_DIR != '\0') candidates.emplace_back(OOMFLIGHT_PYTHON_SOURCE_DIR);
  for (const auto& root : candidates) {
    if (fs::is_regular_file(root / "oomflight" / "_bootstrap" / "sitecustomize.py", ec)) return root;
  }
  return std::nullopt;
}

// The liboomflight this process runs (the one the Python package must load: same version, same ABI).
std::string own_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&oomflight_version), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const fs::path path = fs::canonical(info.dli_fname, ec);
    return ec ? std::string(info.dli_fname) : path.string();
  }
  return {};
}

// PYTHONPATH = bootstrap folder : package root : the job's own PYTHONPATH. Returns an error text or "".
std::string inject_python_package() {
  const auto root = python_package_root();
  if (!root) {
    return fmt::format("cannot find oomflight's Python package (looked in PREFIX/share/oomflight/python, in the "
                       "site-packages of a pip install{}{})",
                       *OOMFLIGHT_PYTHON_SOURCE_DIR != '\0' ? " and in " : "", OOMFLIGHT_PYTHON_SOURCE_DIR);
  }
  std::string path = (*root / "oomflight" / "_bootstrap").string() + ":" + root->string();
  if (const char* existing = std::getenv("PYTHONPATH"); existing != nullptr && *existing != '\0') {
    path += std::string(":") + existing;
  }
  setenv("PYTHONPATH", path.c_str(), 1);
  if (std::getenv("OOMFLIGHT_LIBRARY") == nullptr) {
    const std::string library = own_library_path();
    if (!library.empty()) setenv("OOMFLIGHT_LIBRARY", library.c_str(), 1);
  }
  return {};
}

// NCCL's profiler plugin, built and installed next to liboomflight: NCCL opens it by path (NCCL_PROFILER_PLUGIN
// may name a file; docs/nccl.md), so any NCCL job run through `oomflight run` records its collectives. A job that
// names a plugin of its own (or "none") keeps it.
void set_nccl_profiler_plugin() {
  if (const char* own = std::getenv("NCCL_PROFILER_PLUGIN"); own != nullptr && *own != '\0') return;
  const std::string library = own_library_path();
  if (library.empty()) return;
  const fs::path plugin = fs::path(library).parent_path() / "libnccl-profiler-oomflight.so";
  std::error_code ec;
  if (fs::is_regular_file(plugin, ec)) setenv("NCCL_PROFILER_PLUGIN", plugin.c_str(), 1);
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Run a command (each rank, under mpirun) with oomflight's environment set");
  auto run_name = std::make_shared<std::string>();
  auto command = std::make_shared<std::vector<std::string>>();
  auto python = std::make_shared<bool>(false);
  auto no_python = std::make_shared<bool>(false);
  sub->add_option("--run-name", *run_name, "The job's name (OOMFLIGHT_RUN_NAME), shared by all ranks");
  auto* python_flag = sub->add_flag("--python", *python,
                                    "Load oomflight's Python package at start-up (the default when the command is "
                                    "python* or torchrun)");
  sub->add_flag("--no-python", *no_python, "Do not load the Python package")->excludes(python_flag);
  sub->add_option("command", *command, "The command to run, after --")->required();
  return {sub, [run_name, command, python, no_python] {
    if (!run_name->empty()) setenv("OOMFLIGHT_RUN_NAME", run_name->c_str(), 1);
    if (*python || (!*no_python && is_python((*command)[0]))) {
      if (const std::string error = inject_python_package(); !error.empty()) {
        if (*python) {  // asked for by name: a usage error before the job starts
          print_error(error);
          return kExitUsage;
        }
        // Guessed from the command's name: the job must run anyway, unwatched, and say so.
        oomflight_log(OOMFLIGHT_LOG_WARN, (error + "; running the job without it").c_str());
      }
    }
    set_nccl_profiler_plugin();
    try {
      Config::from_environment();  // a bad value stops here, before the job starts, naming the variable
    } catch (const ConfigError& e) {
      print_error(e.what());
      return kExitUsage;
    }
    std::vector<char*> argv;
    for (auto& arg : *command) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    // The shell's convention: 127 when the command is not found, 126 when it cannot be executed.
    const int error = errno;
    print_error(fmt::format("cannot run '{}': {}", (*command)[0], std::strerror(error)));
    return error == ENOENT ? 127 : 126;
  }};
}

}  // namespace oomflight::cli
