// The one-process archive writer: a rank-local file, the archive of a job of one rank, or an archive joined from
// several ranks' files. It lays the file out with HDF5 and writes the rows with pwrite(), as the collective
// writer does (collective_writer.cpp), so both paths share every step but the messages between ranks.
//
// A file carries the archive's name only when it is complete: it is written as "<name>.partial", every write,
// fsync and close is checked, the root attribute `complete` is its last attribute, the reopened file is checked, and
// only then is it renamed.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "archive_file.hpp"
#include "archive_rows.hpp"
#include "file_size_signal.hpp"
#include "oomflight/format/archive_naming.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/format/collective_writer.hpp"
#include "write_phases.hpp"

namespace oomflight {
namespace {

using format_detail::Counts;

std::string write_ranks(const std::string& path, const ArchiveHeader& header, std::span<const RankDump> dumps,
                        Durability durability, Naming naming) {
  // First, so that it outlives every write: a write past `ulimit -f` must fail, not kill the job.
  const format_detail::IgnoreFileSizeSignal no_sigxfsz;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by us, with the file's name
  format_detail::WritePhases phases;
  std::vector<format_detail::RankRows> rows;
  rows.reserve(dumps.size());
  std::vector<format_detail::PlacedRows> placed;
  Counts total{};
  for (const RankDump& d : dumps) {
    rows.push_back(format_detail::global_rows(d, total));  // this rank's rows follow the previous ranks' rows
    placed.push_back({&rows.back(), total});
    for (int t = 0; t < format_detail::kTables; ++t) total[t] += rows.back().count[t];
  }
  const bool sync = durability == Durability::verified;
  const std::string partial = partial_archive_path(path, header.job_id);
  std::string error;
  std::string named;
  try {
    format_detail::ArchiveFile file(partial, header, total);
    phases.mark("layout");
    error = format_detail::write_rows(partial, file.layout(), placed, sync);
    phases.mark("rows");
    if (error.empty()) error = file.finish(sync);
    phases.mark("complete");
    if (error.empty()) {
      try {
        named = format_detail::claim_name(partial, path, header.job_id, naming == Naming::replace);
      } catch (const ArchiveError& e) {
        error = e.what();
      }
    }
    if (!error.empty()) file.abandon();  // a failed write keeps no name at all
    if (error.empty() && sync) {
      if (const std::string failed = format_detail::sync_folder_of(named); !failed.empty()) {
        log().warn("{}: the rename may not survive a crash of this node (fsync of its folder: {})", named, failed);
      }
    }
  } catch (const ArchiveError& e) {
    throw ArchiveError(fmt::format("{}{}", e.what(), format_detail::file_size_limit_note()));
  }
  if (!error.empty()) {
    std::remove(partial.c_str());
    throw ArchiveError(
        fmt::format("writing archive '{}' failed: {}{}", path, error, format_detail::file_size_limit_note()));
  }
  log().debug("{}: {}", named, phases.text());
  return named;
}

}  // namespace

std::string write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                          Durability durability, Naming naming) {
  return write_ranks(path, header, std::span<const RankDump>(&dump, 1), durability, naming);
}

void write_archive_ranks(const std::string& path, const ArchiveHeader& header, std::span<const RankDump> dumps) {
  write_ranks(path, header, dumps, Durability::verified, Naming::replace);
}

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ArchiveError(fmt::format("cannot open '{}' to sync it: {}", path, std::strerror(errno)));
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // EINVAL: a file system without sync (nothing to do)
  const int err = errno;
  ::close(fd);
  if (!ok) throw ArchiveError(fmt::format("fsync of '{}' failed: {}", path, std::strerror(err)));
}

std::string partial_archive_path(const std::string& path, const std::string& job_id) {
  return job_id.empty() ? path + ".partial" : path + "." + job_id + ".partial";
}

void keep_hdf5_out_of_process_exit() {
  // First: any other HDF5 call (even H5Eset_auto2) initialises the library, which registers the handler.
  if (H5dont_atexit() < 0) {
    log().debug("HDF5 was initialised before the session; its atexit handler stays");
  }
}

}  // namespace oomflight
