// Output and input checks of the commands that write archives or exports: see output_guard.hpp.
#include "output_guard.hpp"

#include <array>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace oomflight::cli {

std::string refuse_output(const std::string& output, const std::vector<std::string>& inputs, bool force,
                          const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string& in : inputs) {
    if (fs::equivalent(in, output, ec)) {
      return fmt::format("the output {} is the input {}: writing it would destroy what it is made from", output, in);
    }
  }
  const fs::file_status status = fs::status(output, ec);
  if (fs::is_directory(status)) return fmt::format("the output {} is a folder, not a file name", output);
  if (fs::exists(status) && !force) {
    return fmt::format("{} exists: give --force to replace that {}, or another -o", output, what);
  }
  return {};
}

bool is_hdf5(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::array<char, 8> head{};
  in.read(head.data(), head.size());
  static constexpr std::array<char, 8> kHdf5 = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  return in.gcount() == 8 && head == kHdf5;
}

std::string not_a_pickle(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) return fmt::format("{}: no such file", path);
  if (fs::is_directory(status)) return fmt::format("{} is a folder, not a snapshot pickle", path);
  std::ifstream in(path, std::ios::binary);
  if (in.get() == std::ifstream::traits_type::eof()) return fmt::format("{} is empty, not a snapshot pickle", path);
  if (is_hdf5(path)) {
    return fmt::format("{} is an HDF5 file (an oomflight archive? `oomflight report` reads it), not a snapshot "
                       "pickle", path);
  }
  return {};
}

}  // namespace oomflight::cli
