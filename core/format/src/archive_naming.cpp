// Final names that never replace a file (oomflight/format/archive_naming.hpp).
#include "oomflight/format/archive_naming.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight::format_detail {
namespace {

namespace fs = std::filesystem;

// A name's candidates are bounded: past this many, something other than dumps is filling the folder.
constexpr int kMaxCandidates = 100000;

// Whether the file at `path` is an archive of job `job_id`. Anything else (another job's archive, an older
// archive without a job id, a file that is not an archive) is not.
bool ours(const fs::path& path, const std::string& job_id) {
  try {
    return read_archive_header(path.string()).job_id == job_id;
  } catch (const std::exception&) {
    return false;
  }
}

// Candidate `i` (0: the wanted name) of `wanted` in the series that `job` (empty: none) selects.
fs::path candidate(const fs::path& wanted, const std::string& job, int i) {
  const std::string stem = wanted.stem().string() + (job.empty() ? "" : "." + job);
  const std::string ext = wanted.extension().string();
  if (i == 0) return wanted.parent_path() / (stem + ext);
  return wanted.parent_path() / fmt::format("{}-{}{}", stem, i, ext);
}

// Which series follows a taken `wanted`: the counter after an archive of this job, the job's own names after
// anything else.
std::string series_after(const fs::path& wanted, const std::string& job_id) {
  return job_id.empty() || ours(wanted, job_id) ? std::string() : job_id;
}

// rename(2) that fails with EEXIST instead of replacing `to`.
int rename_no_replace(const char* from, const char* to) {
#ifdef RENAME_NOREPLACE
  if (::renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;  // EINVAL: not on this file system
#endif
  // link(2) fails with EEXIST on a taken name on every POSIX file system, NFS included.
  if (::link(from, to) == 0) {
    ::unlink(from);
    return 0;
  }
  if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == ENOSYS) {
    // No hard links here (FUSE object stores such as gcsfuse and s3fs, CIFS without unix extensions): a name is
    // checked, then taken by rename(2). Two writers racing for one name in the same instant can still meet there;
    // a dump is never lost for it, as refusing the rename would lose it.
    if (::access(to, F_OK) == 0) {
      errno = EEXIST;
      return -1;
    }
    return std::rename(from, to);
  }
  return -1;
}

}  // namespace

std::string free_name(const std::string& wanted, const std::string& job_id) {
  const fs::path w(wanted);
  std::error_code ec;
  if (!fs::exists(w, ec)) return wanted;
  const std::string job = series_after(w, job_id);
  for (int i = job.empty() ? 1 : 0; i < kMaxCandidates; ++i) {
    const fs::path c = candidate(w, job, i);
    if (!fs::exists(c, ec)) return c.string();
  }
  throw ArchiveError(fmt::format("no free name for '{}': {} names like it are taken", wanted, kMaxCandidates));
}

std::string claim_name(const std::string& from, const std::string& wanted, const std::string& job_id, bool replace) {
  if (replace) {
    if (std::rename(from.c_str(), wanted.c_str()) != 0) {
      throw ArchiveError(fmt::format("cannot rename it to its final name: {}", std::strerror(errno)));
    }
    return wanted;
  }
  const fs::path w(wanted);
  if (rename_no_replace(from.c_str(), wanted.c_str()) == 0) return wanted;
  if (errno != EEXIST) {
    throw ArchiveError(fmt::format("cannot rename it to its final name: {}", std::strerror(errno)));
  }
  const std::string job = series_after(w, job_id);
  for (int i = job.empty() ? 1 : 0; i < kMaxCandidates; ++i) {
    const fs::path c = candidate(w, job, i);
    if (rename_no_replace(from.c_str(), c.c_str()) == 0) return c.string();
    if (errno != EEXIST) {
      throw ArchiveError(fmt::format("cannot rename it to '{}': {}", c.string(), std::strerror(errno)));
    }
  }
  throw ArchiveError(fmt::format("no free name for '{}': {} names like it are taken", wanted, kMaxCandidates));
}

}  // namespace oomflight::format_detail
