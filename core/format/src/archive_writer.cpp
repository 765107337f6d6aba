// The archive writer, serial and collective in one implementation. Offsets of every rank's rows come from one
// MPI_Allgather of six counts; each dataset is created once with its total size and written with one collective
// hyperslab write.
#include <hdf5.h>

#include <array>
#include <fmt/format.h>

#include "h5_handle.hpp"
#include "h5_types.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/format/collective_writer.hpp"

namespace oomflight {
namespace {

enum Table { kEvents, kStacks, kStackFrames, kFrames, kStrings, kStringBytes, kTables };
using Counts = std::array<std::uint64_t, kTables>;

// Local rows in the archive's layout, with every id turned into a global one.
struct GlobalRows {
  std::vector<Event> events;
  std::vector<StackRow> stacks;
  std::vector<std::uint32_t> stack_frames;
  std::vector<FrameRow> frames;
  std::vector<StringRow> strings;
  std::vector<std::uint8_t> string_data;
};

Counts local_counts(const RankDump& d) {
  Counts c{};
  c[kEvents] = d.events.size();
  c[kStacks] = d.stacks->stacks.size();
  c[kStackFrames] = d.stacks->stack_frames.size();
  c[kFrames] = d.stacks->frames.size();
  c[kStrings] = d.stacks->strings.size();
  for (const auto& s : d.stacks->strings) c[kStringBytes] += s.size();
  return c;
}

GlobalRows rebase(const RankDump& d, const Counts& off) {
  GlobalRows g;
  g.events.assign(d.events.begin(), d.events.end());
  for (auto& e : g.events) {
    if (e.stack_id != kNoStack) e.stack_id += static_cast<std::int32_t>(off[kStacks]);
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
    if (comm_ != MPI_COMM_NULL) H5Pset_dxpl_mpio(dxpl_, H5FD_MPIO_COLLECTIVE);
  }

  bool file_open() const { return file_.valid(); }

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

  void int_array_attribute(const char* name, const std::vector<std::int32_t>& values) {
    const hsize_t n = values.size();
    auto s = h5::space(H5Screate_simple(1, &n, nullptr));
    auto a = h5::attr(H5Acreate2(file_, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT));
    check(a.valid() && H5Awrite(a, H5T_NATIVE_INT32, values.data()) >= 0, name);
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
};

bool all_agree(bool ok, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return ok;
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm);
  return all != 0;
}

}  // namespace

void write_archive(const std::string& path, const ArchiveHeader& header, const RankDump& dump) {
  write_archive_collective(path, header, dump, MPI_COMM_NULL);
}

void write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                              MPI_Comm comm) {
  if (dump.stacks == nullptr) throw std::invalid_argument("write_archive: RankDump needs its stack table");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by us, with the file's name
  int index = 0, size = 1;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &index);
    MPI_Comm_size(comm, &size);
  }
  const Counts mine = local_counts(dump);
  std::vector<Counts> all(static_cast<std::size_t>(size));
  if (comm != MPI_COMM_NULL) {
    MPI_Allgather(mine.data(), kTables, MPI_UINT64_T, all.data(), kTables, MPI_UINT64_T, comm);
  } else {
    all[0] = mine;
  }
  Counts offset{}, total{};
  for (int r = 0; r < size; ++r) {
    for (int t = 0; t < kTables; ++t) {
      if (r < index) offset[t] += all[static_cast<std::size_t>(r)][t];
      total[t] += all[static_cast<std::size_t>(r)][t];
    }
  }
  const GlobalRows rows = rebase(dump, offset);
  RankRow row = dump.row;
  row.event_offset = offset[kEvents];
  row.event_count = mine[kEvents];
  row.stack_offset = offset[kStacks];
  row.stack_count = mine[kStacks];
  row.frame_offset = offset[kFrames];
  row.frame_count = mine[kFrames];
  row.string_offset = offset[kStrings];
  row.string_count = mine[kStrings];

  Writer w(path, comm);
  w.create();
  if (!all_agree(w.file_open(), comm)) {
    throw ArchiveError(fmt::format("cannot create archive '{}' (folder missing or not writable, or disk full?)", path));
  }
  w.string_attribute("producer", header.producer);
  w.int_attribute("schema_version", header.schema_version);
  w.string_attribute("run_name", header.run_name);
  w.string_attribute("kind", header.kind);
  w.string_attribute("created_at_utc", header.created_at_utc);
  w.string_attribute("reason", header.reason);
  w.int_array_attribute("origin_ranks", header.origin_ranks);
  w.int_attribute("world_size", header.world_size);
  w.int_array_attribute("ranks_present", header.ranks_present);

  w.rows(dataset::ranks, h5::rank_row_type(), static_cast<std::uint64_t>(size), static_cast<std::uint64_t>(index), 1,
         &row);
  w.rows(dataset::events, h5::event_type(), total[kEvents], offset[kEvents], mine[kEvents], rows.events.data());
  w.rows(dataset::stacks, h5::stack_row_type(), total[kStacks], offset[kStacks], mine[kStacks],
         rows.stacks.data());
  w.rows(dataset::stack_frames, H5T_NATIVE_UINT32, total[kStackFrames], offset[kStackFrames], mine[kStackFrames],
         rows.stack_frames.data());
  w.rows(dataset::frames, h5::frame_row_type(), total[kFrames], offset[kFrames], mine[kFrames],
         rows.frames.data());
  w.rows(dataset::strings, h5::string_row_type(), total[kStrings], offset[kStrings], mine[kStrings],
         rows.strings.data());
  w.rows(dataset::string_data, H5T_NATIVE_UINT8, total[kStringBytes], offset[kStringBytes], mine[kStringBytes],
         rows.string_data.data());
  w.close();
  if (!all_agree(w.ok(), comm)) {
    throw ArchiveError(fmt::format("writing archive '{}' failed{} (disk full or I/O error?)", path,
                                   w.ok() ? " on another rank" : fmt::format(" at '{}'", w.failed_step())));
  }
}

}  // namespace oomflight
