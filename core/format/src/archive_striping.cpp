// Asking for a striped archive through MPI-IO's reserved hints (archive_striping.hpp).
#include "archive_striping.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fmt/format.h>

namespace oomflight::format_detail {

int archive_stripes(int setting, std::uint64_t bytes) {
  if (setting >= 0) return setting;
  constexpr std::uint64_t kGiB = 1ull << 30;
  const std::uint64_t wanted = std::min<std::uint64_t>((bytes + kGiB - 1) / kGiB, 2000);
  return wanted >= 2 ? static_cast<int>(wanted) : 0;
}

std::string create_striped(const std::string& path, int stripes) {
  if (stripes <= 0) return {};
  std::remove(path.c_str());
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "striping_factor", std::to_string(stripes).c_str());
  MPI_Info_set(info, "striping_unit", std::to_string(kStripeUnitBytes).c_str());
  MPI_File file = MPI_FILE_NULL;
  // Files return their errors (MPI_ERRORS_RETURN is the default error handler of MPI_FILE_NULL): a failure here
  // only means the file system's default layout; HDF5's create that follows says what is wrong, if anything.
  const int opened = MPI_File_open(MPI_COMM_SELF, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, info, &file);
  MPI_Info_free(&info);
  if (opened != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(opened, text, &length);
    return fmt::format("asking for {} stripes through MPI-IO failed ({}): the folder's layout", stripes, text);
  }
  MPI_File_close(&file);
  return fmt::format("created with MPI-IO hints striping_factor={} striping_unit={}", stripes, kStripeUnitBytes);
}

}  // namespace oomflight::format_detail
