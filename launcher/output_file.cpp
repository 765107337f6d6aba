// Whole-or-nothing output files: see output_file.hpp.
#include "output_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

namespace oomflight::cli {

std::string write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what) {
  const std::string tmp = path + ".tmp";
  const auto failed = [&](int err, const char* step) {
    return fmt::format("cannot write the {} to {}: {} ({} {})", what, path, std::strerror(err), step, tmp);
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return failed(errno, "creating");
  int err = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() ? 0 : errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;  // a full disk may show only when the buffer is flushed
  if (err != 0) {
    std::remove(tmp.c_str());
    return failed(err, "writing");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    return failed(err, "renaming to it");
  }
  return {};
}

}  // namespace oomflight::cli
