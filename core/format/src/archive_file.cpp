// The archive as a file: laid out by one process with HDF5, rows written by any number of processes with pwrite().
#include "archive_file.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <vector>

#include "h5_types.hpp"

namespace oomflight::format_detail {
namespace {

static_assert(std::endian::native == std::endian::little,
              "rows are written as they lie in memory: the file types are little-endian");

// The dataset's type in memory and in the file (one and the same: h5_types builds it from the row's layout).
h5::Handle table_type(Table t) {
  switch (t) {
    case kRanks: return h5::rank_row_type();
    case kEvents: return h5::event_type();
    case kStacks: return h5::stack_row_type();
    case kStackFrames: return h5::type(H5Tcopy(H5T_NATIVE_UINT32));
    case kFrames: return h5::frame_row_type();
    case kStrings: return h5::string_row_type();
    case kStringData: return h5::type(H5Tcopy(H5T_NATIVE_UINT8));
    case kBatches: return h5::batch_row_type();
    case kContext: return h5::context_row_type();
    case kStateSegments: return h5::state_segment_row_type();
    case kStateBlocks: return h5::state_block_row_type();
    case kCollectives: return h5::collective_row_type();
    case kCommunicators: return h5::communicator_row_type();
    case kTables: break;
  }
  return {};
}

class Attributes {
 public:
  Attributes(hid_t file, std::string& failed) : file_(file), failed_(failed) {}

  void string(const char* name, const std::string& value) {
    auto t = h5::fixed_string_type(value.size());
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, t, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, t, value.empty() ? "" : value.data()) >= 0, name);
  }

  void int32(const char* name, std::int32_t value) {
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, H5T_NATIVE_INT32, &value) >= 0, name);
  }

  void int64(const char* name, std::int64_t value) {
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, H5T_NATIVE_INT64, &value) >= 0, name);
  }

  void int32_array(const char* name, const std::vector<std::int32_t>& values) {
    const hsize_t n = values.size();
    auto s = h5::space(H5Screate_simple(1, &n, nullptr));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT));
    // An empty list (a dump with no origin, such as a scheduled snapshot) is an attribute of zero elements:
    // nothing to write, and H5Awrite refuses a null buffer.
    check(a.valid() && (values.empty() || H5Awrite(a, H5T_NATIVE_INT32, values.data()) >= 0), name);
  }

 private:
  void check(bool ok, const char* name) {
    if (!ok && failed_.empty()) failed_ = fmt::format("attribute '{}'", name);
  }
  hid_t file_;
  std::string& failed_;
};

// The reopened file says it is complete and every dataset has the size that was laid out.
std::string check_metadata(const std::string& path, const Counts& total) {
  auto file = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, h5::file_access()));
  if (!file.valid()) return "it does not open as HDF5 after the close (disk full?)";
  std::int32_t complete = 0;
  auto a = h5::attr(H5Aopen(file, kCompleteAttribute, H5P_DEFAULT));
  if (!a.valid() || H5Aread(a, H5T_NATIVE_INT32, &complete) < 0 || complete != 1) {
    return "its 'complete' attribute did not reach the file (disk full?)";
  }
  for (int t = 0; t < kTables; ++t) {
    const char* name = table_name(static_cast<Table>(t));
    auto d = h5::dset(H5Dopen2(file, name, H5P_DEFAULT));
    auto sp = d.valid() ? h5::space(H5Dget_space(d)) : h5::Handle();
    hsize_t n = 0;
    if (!sp.valid() || H5Sget_simple_extent_dims(sp, &n, nullptr) != 1 || n != total[static_cast<std::size_t>(t)]) {
      return fmt::format("dataset '/{}' did not reach the file whole (disk full?)", name);
    }
  }
  return {};
}

std::string errno_text(int err) { return std::strerror(err); }

// Writes all of `bytes` at `offset`; returns "" or errno's text (a write that makes no progress is ENOSPC's).
std::string pwrite_all(int fd, std::span<const std::uint8_t> bytes, std::uint64_t offset) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_text(errno);
    if (n == 0) return errno_text(ENOSPC);
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return {};
}

}  // namespace

ArchiveFile::ArchiveFile(std::string partial, const ArchiveHeader& header, const Counts& total)
    : partial_(std::move(partial)), total_(total) {
  layout_.address.fill(Layout::kNoAddress);
  file_ = h5::file(H5Fcreate(partial_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, h5::file_access()));
  if (!file_.valid()) {
    std::remove(partial_.c_str());  // H5Fcreate may leave an empty file behind when the disk is full
    throw ArchiveError(fmt::format("cannot create archive '{}' (folder missing or not writable, or disk full?)",
                                   partial_));
  }
  std::string failed;
  Attributes a(file_, failed);
  a.string("producer", header.producer);
  a.int32("schema_version", header.schema_version);
  a.string("run_name", header.run_name);
  if (!header.job_id.empty()) a.string("job_id", header.job_id);
  a.string("kind", header.kind);
  a.string("created_at_utc", header.created_at_utc);
  a.string("reason", header.reason);
  a.int32_array("origin_ranks", header.origin_ranks);
  a.int32("world_size", header.world_size);
  a.int32_array("ranks_present", header.ranks_present);
  if (header.dump_batch) a.int64("dump_batch", *header.dump_batch);
  if (header.dump_number) a.int64("dump_number", *header.dump_number);
  if (header.window_first_batch >= 0) {
    a.int64("window_first_batch", header.window_first_batch);
    a.int64("window_last_batch", header.window_last_batch);
  }
  if (header.snapshot_windows_skipped) a.int64("snapshot_windows_skipped", *header.snapshot_windows_skipped);
  // Contiguous, allocated at creation, never filled: each dataset is one range of the file whose address is
  // known now, and which the writers fill row for row.
  auto dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  for (int t = 0; t < kTables && failed.empty(); ++t) {
    const auto table = static_cast<Table>(t);
    const hsize_t rows = total[static_cast<std::size_t>(t)];
    auto type = table_type(table);
    if (H5Tget_size(type) != row_bytes(table)) {  // cannot happen: the types are built from the rows
      failed = fmt::format("dataset '/{}': file rows of {} bytes, memory rows of {}", table_name(table),
                           H5Tget_size(type), row_bytes(table));
      break;
    }
    auto space = h5::space(H5Screate_simple(1, &rows, nullptr));
    auto d = h5::dset(H5Dcreate2(file_, table_name(table), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    if (!d.valid()) {
      failed = fmt::format("dataset '/{}'", table_name(table));
      break;
    }
    if (rows == 0) continue;
    const haddr_t at = H5Dget_offset(d);
    if (at == HADDR_UNDEF) {
      failed = fmt::format("dataset '/{}' has no address", table_name(table));
      break;
    }
    layout_.address[static_cast<std::size_t>(t)] = at;
  }
  if (!failed.empty()) {
    abandon();
    throw ArchiveError(fmt::format("cannot lay out archive '{}': {} (disk full?)", partial_, failed));
  }
}

ArchiveFile::~ArchiveFile() {
  if (file_.valid()) abandon();
}

std::string ArchiveFile::finish(bool sync) {
  {
    // Every writer has closed its file. Taking a lock makes an NFS client revalidate its cache of the file: HDF5
    // is about to rewrite metadata pages that may also hold other ranks' first rows, and must not write back a
    // stale copy of them. The lock itself is not needed after that (the close releases it at once). Best effort,
    // never blocking, as lock_range(); a no-op on a local file system.
    const int fd = ::open(partial_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      struct flock lock {};
      lock.l_type = F_RDLCK;
      lock.l_whence = SEEK_SET;
      (void)::fcntl(fd, F_SETLK, &lock);
      ::close(fd);
    }
  }
  std::string failed;
  {
    Attributes a(file_, failed);
    a.int32(kCompleteAttribute, 1);  // the last attribute: a file without it never finished
  }
  if (!file_.reset() && failed.empty()) failed = "closing it (disk full?)";
  if (!failed.empty()) return fmt::format("at {}", failed);
  if (!sync) return {};
  const int fd = ::open(partial_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot reopen it to sync it: {}", errno_text(errno));
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL;  // EINVAL: a file system without sync
  const int err = errno;
  ::close(fd);
  if (!synced) return fmt::format("fsync failed: {}", errno_text(err));
  return check_metadata(partial_, total_);
}

void ArchiveFile::abandon() {
  file_.reset();
  std::remove(partial_.c_str());
}

void lock_range(int fd, std::uint64_t offset, std::uint64_t bytes) {
  // A POSIX write lock on the bytes about to be written: where several clients write one file (NFS), a client that
  // holds no lock may write back a whole cached page around a write (zeros included, beyond the size it knew) and
  // overwrite the neighbouring rank's rows in that page; with a lock it writes back only the bytes written, and
  // taking the lock revalidates its cache. ROMIO's NFS driver locks for the same reason. Free elsewhere (the
  // ranges never overlap). Best effort: a file system without locks, or a lock held by someone else, does not
  // stop the write (the lock never blocks: a dump never waits on a foreign process).
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = static_cast<off_t>(offset);
  lock.l_len = static_cast<off_t>(bytes);
  (void)::fcntl(fd, F_SETLK, &lock);
}

std::string write_rows(const std::string& partial, const Layout& layout, std::span<const PlacedRows> ranks,
                       bool sync) {
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot open it to write this rank's rows: {}", errno_text(errno));
  std::string error;
  std::vector<Event> buffer;  // events with global stack ids, a slice at a time
  for (const PlacedRows& placed : ranks) {
    const RankRows& rows = *placed.rows;
    for (int t = 0; t < kTables && error.empty(); ++t) {
      const auto table = static_cast<Table>(t);
      const std::uint64_t count = rows.count[static_cast<std::size_t>(t)];
      if (count == 0) continue;
      const std::uint64_t base = layout.address[static_cast<std::size_t>(t)];
      if (base == Layout::kNoAddress) {
        error = fmt::format("dataset '/{}' has no space in the file for this rank's rows", table_name(table));
        break;
      }
      const std::uint64_t offset = base + placed.at[static_cast<std::size_t>(t)] * row_bytes(table);
      lock_range(fd, offset, count * row_bytes(table));
      std::string failed;
      if (table == kEvents && rows.event_stack_shift != 0) {
        constexpr std::size_t kSlice = 8192;  // 384 KiB: stays in cache, no page faults on a fresh copy
        buffer.resize(kSlice);
        for (std::size_t i = 0; i < rows.events.size() && failed.empty(); i += kSlice) {
          const auto part = rows.events.subspan(i, std::min(kSlice, rows.events.size() - i));
          events_with_global_stacks(part, rows.event_stack_shift, buffer);
          failed = pwrite_all(fd, {reinterpret_cast<const std::uint8_t*>(buffer.data()), part.size_bytes()},
                              offset + i * sizeof(Event));
        }
      } else {
        failed = pwrite_all(fd, rows.bytes(table), offset);
      }
      if (!failed.empty()) {
        error = fmt::format("writing {} rows of '/{}' at offset {}: {}", count, table_name(table), offset, failed);
      }
    }
  }
  if (error.empty() && sync && ::fsync(fd) != 0 && errno != EINVAL) {
    error = fmt::format("fsync failed: {}", errno_text(errno));
  }
  // NFS and others report a failed write at the close.
  if (::close(fd) != 0 && error.empty()) error = fmt::format("close failed: {}", errno_text(errno));
  return error;
}

std::string check_rank_rows(const std::string& partial, const Layout& layout, int rank_count,
                            std::uint64_t total_events, std::span<const std::int32_t> ranks) {
  if (rank_count <= 0) return {};
  if (layout.address[kRanks] == Layout::kNoAddress) return "dataset '/ranks' has no space in the file";
  std::vector<RankRow> rows(static_cast<std::size_t>(rank_count));
  const int fd = ::open(partial.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot reopen it to check /ranks: {}", errno_text(errno));
  const auto bytes = static_cast<ssize_t>(rows.size() * sizeof(RankRow));
  const ssize_t got = ::pread(fd, rows.data(), static_cast<std::size_t>(bytes),
                              static_cast<off_t>(layout.address[kRanks]));
  ::close(fd);
  if (got != bytes) return "its /ranks rows cannot be read back";
  std::uint64_t events = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int32_t want = i < ranks.size() ? ranks[i] : static_cast<std::int32_t>(i);
    if (rows[i].rank != want) {
      return fmt::format("row {} of /ranks did not reach this file (it reads rank {}, not rank {}): is the folder "
                         "shared by every node?",
                         i, rows[i].rank, want);
    }
    events += rows[i].event_count;
  }
  if (events != total_events) {
    return fmt::format("the rows of /ranks count {} events, not the {} the ranks wrote: is the folder shared by "
                       "every node?",
                       events, total_events);
  }
  return {};
}

std::string sync_folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_text(errno);
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;
  const int err = errno;
  ::close(fd);
  return ok ? std::string() : errno_text(err);
}

}  // namespace oomflight::format_detail
