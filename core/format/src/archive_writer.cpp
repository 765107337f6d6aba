// The archive writer, serial and collective in one implementation. Offsets of every rank's rows come from one
// MPI_Allgather of six counts; each dataset is created once with its total size and written with one collective
// hyperslab write.
//
// A file carries the archive's name only when it is complete: it is written as "<name>.partial", the root
// attribute `complete` is its last write, and after the close every rank syncs the file and reads its own rows
// back (Open MPI's OMPIO reports success for writes that failed with ENOSPC: a full disk left a sparse file that
// said "written" before this check). Only when every rank agrees does the first rank rename it.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>

#include "h5_handle.hpp"
#include "oomflight/base/log.hpp"
#include "file_size_signal.hpp"
#include "h5_types.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/format/collective_writer.hpp"

namespace oomflight {
namespace {

enum Table {
  kEvents, kStacks, kStackFrames, kFrames, kStrings, kStringBytes, kBatches, kContext, kStateSegments, kStateBlocks,
  kTables
};
using Counts = std::array<std::uint64_t, kTables>;

// Local rows in the archive's layout, with every id turned into a global one. The events are by far the largest
// table (48 bytes each, 4.8 MB per 100,000): when their stack ids need no offset (the first rank of a file: every
// rank-local file, every safety copy) they are written from the frozen history itself, not from a fresh copy
// whose first-touch page faults cost more than the write.
struct GlobalRows {
  std::span<const Event> events;  // what is written: `event_copy`, or the caller's events when no offset applies
  std::vector<Event> event_copy;
  std::vector<StackRow> stacks;
  std::vector<std::uint32_t> stack_frames;
  std::vector<FrameRow> frames;
  std::vector<StringRow> strings;
  std::vector<std::uint8_t> string_data;
  std::vector<BatchRow> batches;
  std::vector<ContextRow> context;
  std::vector<StateSegmentRow> state_segments;
  std::vector<StateBlockRow> state_blocks;
};

Counts local_counts(const RankDump& d) {
  Counts c{};
  c[kEvents] = d.events.size();
  c[kStacks] = d.stacks->stacks.size();
  c[kStackFrames] = d.stacks->stack_frames.size();
  c[kFrames] = d.stacks->frames.size();
  c[kStrings] = d.stacks->strings.size();
  for (const auto& s : d.stacks->strings) c[kStringBytes] += s.size();
  c[kBatches] = d.batches.size();
  c[kContext] = d.context.size();
  c[kStrings] += 2 * d.context.size();  // each entry's key and value follow the stacks' strings
  for (const auto& e : d.context) c[kStringBytes] += e.key.size() + e.value.size();
  c[kStateSegments] = d.state_segments.size();
  c[kStateBlocks] = d.state_blocks.size();
  return c;
}

void offset_stack_ids(std::span<Event> events, std::int32_t shift) {
  for (auto& e : events) {
    if (e.stack_id != kNoStack) e.stack_id += shift;
  }
}

GlobalRows rebase(const RankDump& d, const Counts& off) {
  GlobalRows g;
  if (off[kStacks] == 0) {
    g.events = d.events;
  } else {
    g.event_copy.assign(d.events.begin(), d.events.end());
    offset_stack_ids(g.event_copy, static_cast<std::int32_t>(off[kStacks]));
    g.events = g.event_copy;
  }
  g.stacks.reserve(d.stacks->stacks.size());
  for (const auto& s : d.stacks->stacks) g.stacks.push_back(StackRow{s.frame_offset + off[kStackFrames], s.frame_count, 0});
  g.stack_frames = d.stacks->stack_frames;
  for (auto& f : g.stack_frames) f += static_cast<std::uint32_t>(off[kFrames]);
  g.frames.reserve(d.stacks->frames.size());
  for (const auto& f : d.stacks->frames) {
    g.frames.push_back(FrameRow{f.function + static_cast<std::uint32_t>(off[kStrings]),
                                f.file + static_cast<std::uint32_t>(off[kStrings]), f.line});
  }
  std::uint64_t at = off[kStringBytes];
  for (const auto& s : d.stacks->strings) {
    g.strings.push_back(StringRow{at, s.size()});
    g.string_data.insert(g.string_data.end(), s.begin(), s.end());
    at += s.size();
  }
  // The context's strings follow the stack table's: key, value, key, value, ...
  auto id = static_cast<std::uint32_t>(off[kStrings] + d.stacks->strings.size());
  for (const ContextEntry& e : d.context) {
    for (const std::string* text : {&e.key, &e.value}) {
      g.strings.push_back(StringRow{at, text->size()});
      g.string_data.insert(g.string_data.end(), text->begin(), text->end());
      at += text->size();
    }
    g.context.push_back(ContextRow{d.row.rank, static_cast<std::uint8_t>(e.kind), {}, e.batch, id, id + 1});
    id += 2;
  }
  g.batches.reserve(d.batches.size());
  for (const BatchStats& b : d.batches) {
    g.batches.push_back(BatchRow{d.row.rank, b.device, b.batch, b.start_t_ns, b.end_t_ns, b.allocated_bytes,
                                 b.reserved_bytes, b.peak_allocated_bytes, b.peak_reserved_bytes,
                                 b.device_capacity_bytes, b.device_free_bytes, b.alloc_events, b.free_events,
                                 b.oom_events});
  }
  g.state_segments.assign(d.state_segments.begin(), d.state_segments.end());
  for (auto& seg : g.state_segments) seg.rank = d.row.rank;
  g.state_blocks.assign(d.state_blocks.begin(), d.state_blocks.end());
  for (auto& b : g.state_blocks) {
    b.rank = d.row.rank;
    if (b.stack_id != kNoStack) b.stack_id += static_cast<std::int32_t>(off[kStacks]);
  }
  return g;
}

class Writer {
 public:
  Writer(const std::string& path, MPI_Comm comm) : path_(path), comm_(comm) {}

  void check(bool ok, const char* step) {
    if (!ok && failed_step_.empty()) failed_step_ = step;
  }
  bool ok() const { return failed_step_.empty(); }
  const std::string& failed_step() const { return failed_step_; }

  void create() {
    auto fapl = h5::plist(H5Pcreate(H5P_FILE_ACCESS));
    if (comm_ != MPI_COMM_NULL) {
      H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL);
      H5Pset_all_coll_metadata_ops(fapl, true);
      H5Pset_coll_metadata_write(fapl, true);
    }
    file_ = h5::file(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    check(file_.valid(), "create the file");
    dxpl_ = h5::plist(H5Pcreate(H5P_DATASET_XFER));
    if (comm_ != MPI_COMM_NULL) H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_INDEPENDENT);
  }

  bool file_open() const { return file_.valid(); }

  /// Bytes this rank wrote, where they lie in the file: what verify_rows() reads back after the close.
  struct Range {
    std::uint64_t file_offset;
    std::uint64_t bytes;
    const void* data;
  };
  const std::vector<Range>& ranges() const { return ranges_; }

  void string_attribute(const char* name, const std::string& value) {
    auto t = h5::fixed_string_type(value.size());
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, t, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, t, value.empty() ? "" : value.data()) >= 0, name);
  }

  void int_attribute(const char* name, std::int32_t value) {
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, H5T_NATIVE_INT32, &value) >= 0, name);
  }

  void int64_attribute(const char* name, std::int64_t value) {
    auto s = h5::space(H5Screate(H5S_SCALAR));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, H5T_NATIVE_INT64, &value) >= 0, name);
  }

  void int_array_attribute(const char* name, const std::vector<std::int32_t>& values) {
    const hsize_t n = values.size();
    auto s = h5::space(H5Screate_simple(1, &n, nullptr));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT));
    // An empty list (a dump with no origin, such as a scheduled snapshot) is an attribute of zero elements:
    // nothing to write, and H5Awrite refuses a null buffer.
    check(a.valid() && (values.empty() || H5Awrite(a, H5T_NATIVE_INT32, values.data()) >= 0), name);
  }

  // Creates dataset `name` with `total` rows and writes this rank's `count` rows at `offset`.
  void rows(const char* name, hid_t type, std::uint64_t total, std::uint64_t offset, std::uint64_t count,
            const void* data) {
    const hsize_t dims = total;
    auto file_space = h5::space(H5Screate_simple(1, &dims, nullptr));
    auto dcpl = h5::plist(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    auto d = h5::dset(H5Dcreate2(file_, name, type, file_space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    check(d.valid(), name);
    const hsize_t start = offset, n = count;
    auto mem_space = h5::space(H5Screate_simple(1, &n, nullptr));
    if (count == 0) {
      H5Sselect_none(file_space);
      H5Sselect_none(mem_space);
    } else {
      H5Sselect_hyperslab(file_space, H5S_SELECT_SET, &start, nullptr, &n, nullptr);
    }
    // Every rank calls H5Dwrite, even with nothing to write: the transfer is collective. An empty dataset
    // (total 0, the same on every rank) has nothing to transfer, and MPI-IO refuses a write to it.
    if (d.valid() && total > 0) {
      check(H5Dwrite(d, type, mem_space, file_space, dxpl_, count == 0 ? nullptr : data) >= 0, name);
      // Contiguous layout: the rows lie at the dataset's address plus offset x the file type's size.
      const haddr_t at = H5Dget_offset(d);
      const std::size_t row_bytes = H5Tget_size(type);
      if (count > 0 && at != HADDR_UNDEF && row_bytes > 0) {
        ranges_.push_back(Range{at + offset * row_bytes, count * row_bytes, data});
      } else if (count > 0) {
        check(false, name);  // cannot tell where the rows went, so they cannot be verified
      }
    }
  }

  void close() {
    dxpl_.reset();
    check(file_.reset(), "close the file");
  }

 private:
  std::string path_;
  MPI_Comm comm_;
  h5::Handle file_;
  h5::Handle dxpl_;
  std::string failed_step_;
  std::vector<Range> ranges_;
};

// After the close: sync the file (ENOSPC on filesystems that allocate at writeback surfaces here) and read this
// rank's rows back. Returns an empty string, or what failed.
std::string verify_rows(const std::string& path, const std::vector<Writer::Range>& ranges) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot reopen it to verify: {}", std::strerror(errno));
  std::string error;
  if (::fsync(fd) != 0 && errno != EINVAL) error = fmt::format("fsync failed: {}", std::strerror(errno));
  std::vector<unsigned char> buffer(std::size_t{1} << 20);
  for (const auto& r : ranges) {
    for (std::uint64_t done = 0; error.empty() && done < r.bytes;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), r.bytes - done));
      const ssize_t got = ::pread(fd, buffer.data(), n, static_cast<off_t>(r.file_offset + done));
      if (got != static_cast<ssize_t>(n) ||
          std::memcmp(buffer.data(), static_cast<const unsigned char*>(r.data) + done, n) != 0) {
        error = fmt::format("{} bytes at offset {} did not reach the file (disk full?)", r.bytes, r.file_offset);
      }
      done += n;
    }
  }
  ::close(fd);
  return error;
}

// The first rank's check of what only the library wrote: the file opens, says it is complete, and every dataset
// has the size all ranks wrote. Returns an empty string, or what failed.
std::string verify_metadata(const std::string& path, const std::array<std::uint64_t, 11>& dims) {
  auto file = h5::file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) return "it does not open as HDF5 after the close (disk full?)";
  std::int32_t complete = 0;
  auto a = h5::attr(H5Aopen(file, "complete", H5P_DEFAULT));
  if (!a.valid() || H5Aread(a, H5T_NATIVE_INT32, &complete) < 0 || complete != 1) {
    return "its 'complete' attribute did not reach the file (disk full?)";
  }
  const std::array<const char*, 11> names = {dataset::ranks,        dataset::events,         dataset::stacks,
                                             dataset::stack_frames, dataset::frames,         dataset::strings,
                                             dataset::string_data,  dataset::batches,        dataset::context,
                                             dataset::state_segments, dataset::state_blocks};
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto d = h5::dset(H5Dopen2(file, names[i], H5P_DEFAULT));
    auto sp = d.valid() ? h5::space(H5Dget_space(d)) : h5::Handle();
    hsize_t n = 0;
    if (!sp.valid() || H5Sget_simple_extent_dims(sp, &n, nullptr) != 1 || n != dims[i]) {
      return fmt::format("dataset '/{}' did not reach the file whole (disk full?)", names[i]);
    }
  }
  return {};
}

bool all_agree(bool ok, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return ok;
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm);
  return all != 0;
}

// What this process writes: its ranks' rows (one rank for the collective writer, any number for the serial one)
// and where they go among every process's rows.
struct Plan {
  std::vector<RankRow> rank_rows;
  std::uint64_t rank_offset = 0, rank_total = 0;
  Counts offset{}, total{}, mine{};
  GlobalRows rows;
};

void append(GlobalRows& to, GlobalRows&& from) {
  if (to.events.empty() && to.event_copy.empty()) {  // the first rank: keep its events as they are (a view or not)
    to.event_copy = std::move(from.event_copy);
    to.events = from.events.data() == nullptr || !to.event_copy.empty() ? std::span<const Event>(to.event_copy)
                                                                          : from.events;
  } else {
    if (to.event_copy.empty()) to.event_copy.assign(to.events.begin(), to.events.end());
    to.event_copy.insert(to.event_copy.end(), from.events.begin(), from.events.end());
    to.events = to.event_copy;
  }
  to.stacks.insert(to.stacks.end(), from.stacks.begin(), from.stacks.end());
  to.stack_frames.insert(to.stack_frames.end(), from.stack_frames.begin(), from.stack_frames.end());
  to.frames.insert(to.frames.end(), from.frames.begin(), from.frames.end());
  to.strings.insert(to.strings.end(), from.strings.begin(), from.strings.end());
  to.string_data.insert(to.string_data.end(), from.string_data.begin(), from.string_data.end());
  to.batches.insert(to.batches.end(), from.batches.begin(), from.batches.end());
  to.context.insert(to.context.end(), from.context.begin(), from.context.end());
  to.state_segments.insert(to.state_segments.end(), from.state_segments.begin(), from.state_segments.end());
  to.state_blocks.insert(to.state_blocks.end(), from.state_blocks.begin(), from.state_blocks.end());
}

// Adds one rank at `at` (its offsets among all rows) to the plan, its ids moved by `rebase_by` (`at`, or less
// what the caller already applied in place).
void add_rank(Plan& plan, const RankDump& dump, const Counts& rebase_by, const Counts& at) {
  const Counts c = local_counts(dump);
  RankRow row = dump.row;
  row.event_offset = at[kEvents];
  row.event_count = c[kEvents];
  row.stack_offset = at[kStacks];
  row.stack_count = c[kStacks];
  row.frame_offset = at[kFrames];
  row.frame_count = c[kFrames];
  row.string_offset = at[kStrings];
  row.string_count = c[kStrings];
  plan.rank_rows.push_back(row);
  append(plan.rows, rebase(dump, rebase_by));
  for (int t = 0; t < kTables; ++t) plan.mine[t] += c[t];
}

// Where a write's time goes, for the debug log of the file's first rank (docs/performance.md was measured so):
// "create 6 ms, attributes 0 ms, rows 4 ms, ...". On a parallel file system the split shows which step is slow.
class Phases {
 public:
  void mark(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    text_ += fmt::format("{}{} {:.1f} ms", text_.empty() ? "" : ", ", name,
                         std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const std::string& text() const { return text_; }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string text_;
};

void write_planned(const std::string& path, const ArchiveHeader& header, const Plan& plan, int index,
                   MPI_Comm comm, Durability durability = Durability::verified) {
  Phases phases;
  // Declared first, so it outlives the writer's close: a write past `ulimit -f` must fail, not kill the job.
  const format_detail::IgnoreFileSizeSignal no_sigxfsz;
  const std::string partial = partial_archive_path(path);
  Writer w(partial, comm);
  w.create();
  if (!all_agree(w.file_open(), comm)) {
    w.close();
    if (index == 0) std::remove(partial.c_str());  // H5Fcreate may leave an empty file when the disk is full
    throw ArchiveError(fmt::format("cannot create archive '{}' (folder missing or not writable, or disk full?){}",
                                   partial, format_detail::file_size_limit_note()));
  }
  phases.mark("create");
  w.string_attribute("producer", header.producer);
  w.int_attribute("schema_version", header.schema_version);
  w.string_attribute("run_name", header.run_name);
  w.string_attribute("kind", header.kind);
  w.string_attribute("created_at_utc", header.created_at_utc);
  w.string_attribute("reason", header.reason);
  w.int_array_attribute("origin_ranks", header.origin_ranks);
  w.int_attribute("world_size", header.world_size);
  w.int_array_attribute("ranks_present", header.ranks_present);
  if (header.window_first_batch >= 0) {
    w.int64_attribute("window_first_batch", header.window_first_batch);
    w.int64_attribute("window_last_batch", header.window_last_batch);
  }

  const Counts& off = plan.offset;
  const Counts& total = plan.total;
  const Counts& mine = plan.mine;
  const GlobalRows& rows = plan.rows;
  phases.mark("attributes");
  w.rows(dataset::ranks, h5::rank_row_type(), plan.rank_total, plan.rank_offset, plan.rank_rows.size(),
         plan.rank_rows.data());
  w.rows(dataset::events, h5::event_type(), total[kEvents], off[kEvents], mine[kEvents], rows.events.data());
  w.rows(dataset::stacks, h5::stack_row_type(), total[kStacks], off[kStacks], mine[kStacks], rows.stacks.data());
  w.rows(dataset::stack_frames, H5T_NATIVE_UINT32, total[kStackFrames], off[kStackFrames], mine[kStackFrames],
         rows.stack_frames.data());
  w.rows(dataset::frames, h5::frame_row_type(), total[kFrames], off[kFrames], mine[kFrames], rows.frames.data());
  w.rows(dataset::strings, h5::string_row_type(), total[kStrings], off[kStrings], mine[kStrings],
         rows.strings.data());
  w.rows(dataset::string_data, H5T_NATIVE_UINT8, total[kStringBytes], off[kStringBytes], mine[kStringBytes],
         rows.string_data.data());
  w.rows(dataset::batches, h5::batch_row_type(), total[kBatches], off[kBatches], mine[kBatches], rows.batches.data());
  w.rows(dataset::context, h5::context_row_type(), total[kContext], off[kContext], mine[kContext], rows.context.data());
  w.rows(dataset::state_segments, h5::state_segment_row_type(), total[kStateSegments], off[kStateSegments],
         mine[kStateSegments], rows.state_segments.data());
  w.rows(dataset::state_blocks, h5::state_block_row_type(), total[kStateBlocks], off[kStateBlocks],
         mine[kStateBlocks], rows.state_blocks.data());
  phases.mark("rows");
  w.int_attribute(kCompleteAttribute, 1);  // the last write: a file without it never finished
  w.close();
  phases.mark("close");

  std::string error = w.ok() ? std::string() : fmt::format("at '{}'", w.failed_step());
  const bool verify = durability == Durability::verified;
  if (error.empty() && verify) {
    error = verify_rows(partial, w.ranges());
    phases.mark("sync and read-back");
  }
  if (error.empty() && verify && index == 0) {
    error = verify_metadata(partial, {plan.rank_total, total[kEvents], total[kStacks], total[kStackFrames],
                                      total[kFrames], total[kStrings], total[kStringBytes], total[kBatches],
                                      total[kContext], total[kStateSegments], total[kStateBlocks]});
  }
  if (verify && index == 0) phases.mark("metadata check");
  const bool verified = all_agree(error.empty(), comm);
  phases.mark("agreement");
  int renamed = 0;
  if (index == 0) {
    renamed = verified && std::rename(partial.c_str(), path.c_str()) == 0 ? 1 : 0;
    if (verified && !renamed) error = fmt::format("cannot rename it to its final name: {}", std::strerror(errno));
    if (!renamed) std::remove(partial.c_str());  // a failed write keeps no name at all
  }
  if (comm != MPI_COMM_NULL) MPI_Bcast(&renamed, 1, MPI_INT, 0, comm);
  phases.mark("rename");
  if (index == 0) log().debug("{}: {}", path, phases.text());
  if (!renamed) {
    throw ArchiveError(fmt::format("writing archive '{}' failed: {}{}", path,
                                   error.empty() ? std::string("on another rank") : error,
                                   format_detail::file_size_limit_note()));
  }
}

void write_ranks(const std::string& path, const ArchiveHeader& header, std::span<const RankDump> dumps,
                 Durability durability) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by us, with the file's name
  Plan plan;
  plan.rank_total = dumps.size();
  for (const RankDump& d : dumps) {
    if (d.stacks == nullptr) throw std::invalid_argument("write_archive: RankDump needs its stack table");
    const Counts at = plan.mine;  // this rank's rows follow the previous ranks' rows
    add_rank(plan, d, at, at);
  }
  plan.total = plan.mine;
  write_planned(path, header, plan, 0, MPI_COMM_NULL, durability);
}


}  // namespace

void write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                   Durability durability) {
  write_ranks(path, header, std::span<const RankDump>(&dump, 1), durability);
}

void write_archive_ranks(const std::string& path, const ArchiveHeader& header, std::span<const RankDump> dumps) {
  write_ranks(path, header, dumps, Durability::verified);
}

void sync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ArchiveError(fmt::format("cannot open '{}' to sync it: {}", path, std::strerror(errno)));
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // EINVAL: a file system without sync (nothing to do)
  const int err = errno;
  ::close(fd);
  if (!ok) throw ArchiveError(fmt::format("fsync of '{}' failed: {}", path, std::strerror(err)));
}


void write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                              MPI_Comm comm, std::span<Event> events_in_place) {
  if (comm == MPI_COMM_NULL) return write_archive(path, header, dump);
  if (dump.stacks == nullptr) throw std::invalid_argument("write_archive: RankDump needs its stack table");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  int index = 0, size = 1;
  MPI_Comm_rank(comm, &index);
  MPI_Comm_size(comm, &size);
  const Counts mine = local_counts(dump);
  std::vector<Counts> all(static_cast<std::size_t>(size));
  MPI_Allgather(mine.data(), kTables, MPI_UINT64_T, all.data(), kTables, MPI_UINT64_T, comm);
  Plan plan;
  plan.rank_total = static_cast<std::uint64_t>(size);
  plan.rank_offset = static_cast<std::uint64_t>(index);
  for (int r = 0; r < size; ++r) {
    for (int t = 0; t < kTables; ++t) {
      if (r < index) plan.offset[t] += all[static_cast<std::size_t>(r)][t];
      plan.total[t] += all[static_cast<std::size_t>(r)][t];
    }
  }
  if (!events_in_place.empty() && events_in_place.data() == dump.events.data() && plan.offset[kStacks] != 0) {
    // Offset the stack ids where they lie, write from there, and put them back whatever happens.
    const auto shift = static_cast<std::int32_t>(plan.offset[kStacks]);
    struct Restore {
      std::span<Event> events;
      std::int32_t shift;
      ~Restore() { offset_stack_ids(events, -shift); }
    } restore{events_in_place, shift};
    offset_stack_ids(events_in_place, shift);
    Counts no_offset = plan.offset;
    no_offset[kStacks] = 0;  // already applied: rebase() must neither copy nor offset again
    // The state's blocks are few: they take the same shift from a copy.
    std::vector<StateBlockRow> blocks(dump.state_blocks.begin(), dump.state_blocks.end());
    for (auto& b : blocks) {
      if (b.stack_id != kNoStack) b.stack_id += shift;
    }
    add_rank(plan, RankDump{dump.row, events_in_place, dump.stacks, dump.batches, dump.context, dump.state_segments,
                            blocks},
             no_offset, plan.offset);
    write_planned(path, header, plan, index, comm);
    return;
  }
  add_rank(plan, dump, plan.offset, plan.offset);
  write_planned(path, header, plan, index, comm);
}

std::string partial_archive_path(const std::string& path) { return path + ".partial"; }

void keep_hdf5_out_of_process_exit() {
  // First: any other HDF5 call (even H5Eset_auto2) initialises the library, which registers the handler.
  if (H5dont_atexit() < 0) {
    log().debug("HDF5 was initialised before the session; its atexit handler stays");
  }
}

}  // namespace oomflight
