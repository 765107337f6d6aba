// The archive reader: serial HDF5, whole datasets at once, checked against each other before use.
#include "oomflight/format/archive_reader.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <sys/stat.h>

#include <fmt/format.h>

#include "h5_handle.hpp"
#include "h5_types.hpp"
#include "oomflight/record/context_log.hpp"

namespace oomflight {
namespace {

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const { throw ArchiveError(fmt::format("{}: {}", path_, what)); }

  hid_t file() const { return file_; }

  void open() {
    struct stat st {};
    if (stat(path_.c_str(), &st) != 0) fail("no such file");
    file_bytes_ = static_cast<std::uint64_t>(st.st_size);
    if (path_.ends_with(".partial")) {
      fail("a partial file: the dump that wrote it did not finish, so it is not an archive (the log of that "
           "dump names the rank-local files that hold the histories)");
    }
    if (H5Fis_hdf5(path_.c_str()) <= 0) fail("not an HDF5 file, so not an oomflight archive");
    file_ = h5::file(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, h5::file_access()));
    if (!file_.valid()) fail("cannot open the HDF5 file");
    if (H5Aexists(file_, "schema_version") <= 0) {
      fail("not an oomflight archive (no root attribute 'schema_version')");
    }
  }

  std::string string_attribute(const char* name) const {
    auto a = h5::attr(H5Aopen(file_, name, H5P_DEFAULT));
    if (!a.valid()) fail(fmt::format("root attribute '{}' is missing", name));
    auto t = h5::type(H5Aget_type(a));
    if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0) {
      fail(fmt::format("root attribute '{}' is not a fixed-length string", name));
    }
    std::string value(H5Tget_size(t), '\0');
    auto mem = h5::fixed_string_type(value.size());
    if (H5Aread(a, mem, value.data()) < 0) fail(fmt::format("cannot read root attribute '{}'", name));
    value.resize(value.find('\0') == std::string::npos ? value.size() : value.find('\0'));
    return value;
  }

  std::int64_t int64_attribute(const char* name) const {
    auto a = h5::attr(H5Aopen(file_, name, H5P_DEFAULT));
    if (!a.valid()) fail(fmt::format("root attribute '{}' is missing", name));
    auto s = h5::space(H5Aget_space(a));
    std::int64_t value = 0;
    if (H5Sget_simple_extent_npoints(s) != 1 || H5Aread(a, H5T_NATIVE_INT64, &value) < 0) {
      fail(fmt::format("root attribute '{}' is not a single integer", name));
    }
    return value;
  }

  bool has_dataset(const char* name) const { return H5Lexists(file_, name, H5P_DEFAULT) > 0; }

  std::vector<std::int32_t> int_attribute(const char* name) const {
    auto a = h5::attr(H5Aopen(file_, name, H5P_DEFAULT));
    if (!a.valid()) fail(fmt::format("root attribute '{}' is missing", name));
    auto s = h5::space(H5Aget_space(a));
    const auto n = H5Sget_simple_extent_npoints(s);
    std::vector<std::int32_t> values(static_cast<std::size_t>(n < 0 ? 0 : n));
    if (!values.empty() && H5Aread(a, H5T_NATIVE_INT32, values.data()) < 0) {
      fail(fmt::format("cannot read root attribute '{}'", name));
    }
    return values;
  }

  // True when the dataset's rows have exactly `type` (an older layout the reader still converts).
  bool has_row_type(const char* name, hid_t type) const {
    if (H5Lexists(file_, name, H5P_DEFAULT) <= 0) return false;
    auto d = h5::dset(H5Dopen2(file_, name, H5P_DEFAULT));
    if (!d.valid()) return false;
    auto file_type = h5::type(H5Dget_type(d));
    return file_type.valid() && H5Tget_size(file_type) == H5Tget_size(type) && H5Tequal(file_type, type) > 0;
  }

  template <typename T>
  std::vector<T> rows(const char* name, hid_t type) const {
    if (H5Lexists(file_, name, H5P_DEFAULT) <= 0) fail(fmt::format("dataset '/{}' is missing", name));
    auto d = h5::dset(H5Dopen2(file_, name, H5P_DEFAULT));
    if (!d.valid()) fail(fmt::format("dataset '/{}' cannot be opened", name));
    // The file's own description of the rows must be the schema's: HDF5 converts from it while reading, and a
    // damaged one (a member's offset or size flipped) makes that conversion write out of bounds.
    auto file_type = h5::type(H5Dget_type(d));
    if (!file_type.valid() || H5Tget_size(file_type) != H5Tget_size(type) || H5Tequal(file_type, type) <= 0) {
      fail(fmt::format("dataset '/{}' does not have the schema's row type (a damaged or foreign file)", name));
    }
    auto s = h5::space(H5Dget_space(d));
    if (!s.valid() || H5Sget_simple_extent_ndims(s) != 1) fail(fmt::format("dataset '/{}' is not one-dimensional", name));
    const auto n = H5Sget_simple_extent_npoints(s);
    if (n < 0) fail(fmt::format("dataset '/{}' has no readable size", name));
    // Bound memory before allocating: our datasets are stored whole (contiguous, no compression), so a dataset
    // cannot hold more rows than the file has bytes for. A hostile file declaring 1e10 rows is refused here.
    const std::uint64_t rows_declared = static_cast<std::uint64_t>(n);
    if (rows_declared > (file_bytes_ + (1u << 20)) / sizeof(T)) {
      fail(fmt::format("dataset '/{}' declares {} rows of {} bytes, more than the file's {} bytes can hold", name,
                       rows_declared, sizeof(T), file_bytes_));
    }
    std::vector<T> out(static_cast<std::size_t>(n));
    if (!out.empty() && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
      fail(fmt::format("cannot read dataset '/{}'", name));
    }
    return out;
  }

 private:
  std::string path_;
  h5::Handle file_;
  std::uint64_t file_bytes_ = 0;
};

// offset + count <= size, without the sum overflowing (a hostile offset near 2^64 must not wrap into range).
bool range_inside(std::uint64_t offset, std::uint64_t count, std::uint64_t size) {
  return offset <= size && count <= size - offset;
}

// Every cross-reference a reader follows, checked once here so that no reader indexes out of range: rows per
// rank inside their datasets, ranks unique and inside the world, origins inside the world, stack, frame and
// string ids inside their tables. Each failure names the dataset and the field.
void check_consistency(const Archive& a, const Reader& r) {
  const auto& h = a.header;
  if (h.world_size < 1) r.fail(fmt::format("root attribute 'world_size' is {}; it must be at least 1", h.world_size));
  if (a.ranks.size() != h.ranks_present.size()) {
    r.fail(fmt::format("/ranks has {} rows but root attribute 'ranks_present' lists {} ranks", a.ranks.size(),
                       h.ranks_present.size()));
  }
  if (a.ranks.empty()) r.fail("/ranks has no rows: the file holds no rank");
  std::vector<bool> seen(static_cast<std::size_t>(h.world_size), false);
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const RankRow& row = a.ranks[i];
    if (row.rank < 0 || row.rank >= h.world_size) {
      r.fail(fmt::format("/ranks row {}: rank {} is outside 0 .. world_size - 1 ({})", i, row.rank, h.world_size - 1));
    }
    if (seen[static_cast<std::size_t>(row.rank)]) r.fail(fmt::format("/ranks: rank {} appears twice", row.rank));
    seen[static_cast<std::size_t>(row.rank)] = true;
  }
  for (std::size_t i = 0; i < a.ranks.size(); ++i) {
    const RankRow& row = a.ranks[i];
    if (row.rank != h.ranks_present[i]) {
      r.fail(fmt::format("/ranks row {} is rank {} but 'ranks_present' says {}", i, row.rank, h.ranks_present[i]));
    }
    const struct {
      const char* field;
      std::uint64_t offset, count, size;
      const char* table;
    } ranges[] = {{"event", row.event_offset, row.event_count, a.events.size(), "/events"},
                  {"stack", row.stack_offset, row.stack_count, a.stacks.size(), "/stacks"},
                  {"frame", row.frame_offset, row.frame_count, a.frames.size(), "/frames"},
                  {"string", row.string_offset, row.string_count, a.strings.size(), "/strings"}};
    for (const auto& x : ranges) {
      if (!range_inside(x.offset, x.count, x.size)) {
        r.fail(fmt::format("/ranks rank {}: {}_offset {} + {}_count {} lie outside {} ({} rows)", row.rank, x.field,
                           x.offset, x.field, x.count, x.table, x.size));
      }
    }
  }
  for (const auto origin : h.origin_ranks) {
    if (origin < 0 || origin >= h.world_size) {
      r.fail(fmt::format("root attribute 'origin_ranks' names rank {}, outside 0 .. {}", origin, h.world_size - 1));
    }
  }
  // /batches and /context: every row names a rank of /ranks, and each rank's rows form one group, in the order
  // of /ranks.
  const auto check_groups = [&](const auto& rows, const char* table) {
    std::size_t group = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::int32_t rank = rows[i].rank;
      if (i > 0 && rank == rows[i - 1].rank) continue;
      while (group < a.ranks.size() && a.ranks[group].rank != rank) ++group;
      if (group == a.ranks.size()) {
        r.fail(fmt::format("{} row {}: rank {} is not in /ranks, or its rows are not grouped in the order of "
                           "/ranks",
                           table, i, rank));
      }
      ++group;
    }
  };
  check_groups(a.batches, "/batches");
  check_groups(a.context, "/context");
  check_groups(a.state_segments, "/state_segments");
  check_groups(a.state_blocks, "/state_blocks");
  check_groups(a.collectives, "/collectives");
  check_groups(a.communicators, "/communicators");
  for (std::size_t i = 0; i < a.collectives.size(); ++i) {
    const CollectiveRow& c = a.collectives[i];
    const auto op = static_cast<int>(c.op);
    if (op < 0 || op >= kCollectiveOpCount || !valid_data_type(static_cast<std::uint8_t>(c.datatype)) ||
        static_cast<int>(c.phase) > 1 || c.peer < -1) {
      r.fail(fmt::format("/collectives row {}: op {}, datatype {}, phase {} or peer {} is out of range", i, op,
                         static_cast<int>(c.datatype), static_cast<int>(c.phase), c.peer));
    }
  }
  for (std::size_t i = 0; i < a.communicators.size(); ++i) {
    const CommunicatorRow& c = a.communicators[i];
    if (c.comm_size < 1 || c.comm_rank < 0 || c.comm_rank >= c.comm_size) {
      r.fail(fmt::format("/communicators row {}: rank {} of size {} is out of range", i, c.comm_rank, c.comm_size));
    }
  }
  // A state row's stack: none, or one of its own rank's stacks (global ids).
  const auto own_stack = [&a](std::int32_t rank, std::int32_t stack_id) {
    const RankRow* row = a.rank_row(rank);
    return stack_id == kNoStack ||
           (row != nullptr && stack_id >= 0 && static_cast<std::uint64_t>(stack_id) >= row->stack_offset &&
            static_cast<std::uint64_t>(stack_id) - row->stack_offset < row->stack_count);
  };
  for (std::size_t i = 0; i < a.state_blocks.size(); ++i) {
    const StateBlockRow& b = a.state_blocks[i];
    if (!own_stack(b.rank, b.stack_id) || static_cast<int>(b.state) >= kBlockStateCount) {
      r.fail(fmt::format("/state_blocks row {}: stack_id {} is outside rank {}'s stacks, or state {} is unknown", i,
                         b.stack_id, b.rank, static_cast<int>(b.state)));
    }
  }
  for (std::size_t i = 0; i < a.state_segments.size(); ++i) {
    const StateSegmentRow& seg = a.state_segments[i];
    const auto type = static_cast<int>(seg.segment_type);
    if (!own_stack(seg.rank, seg.stack_id) || (type > 1 && seg.segment_type != SegmentType::unknown)) {
      r.fail(fmt::format("/state_segments row {}: stack_id {} is outside rank {}'s stacks, or segment_type {} is unknown",
                         i, seg.stack_id, seg.rank, type));
    }
  }
  for (std::size_t i = 0; i < a.context.size(); ++i) {
    const ContextRow& c = a.context[i];
    const RankRow* row = a.rank_row(c.rank);
    const auto inside = [&](std::uint32_t id) {
      return row != nullptr && id >= row->string_offset && id - row->string_offset < row->string_count;
    };
    if (!inside(c.key) || !inside(c.value) || c.kind >= ContextEntry::kKindCount) {
      r.fail(fmt::format("/context row {}: key {} or value {} is outside rank {}'s strings, or kind {} is unknown",
                         i, c.key, c.value, c.rank, c.kind));
    }
  }
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    const Event& e = a.events[i];
    if (static_cast<int>(e.action) >= kActionCount) {
      r.fail(fmt::format("/events row {}: action {} is not a known action", i, static_cast<int>(e.action)));
    }
    if (e.stack_id != kNoStack && (e.stack_id < 0 || static_cast<std::size_t>(e.stack_id) >= a.stacks.size())) {
      r.fail(fmt::format("/events row {}: stack_id {} is outside /stacks ({} rows)", i, e.stack_id, a.stacks.size()));
    }
  }
  for (std::size_t i = 0; i < a.stacks.size(); ++i) {
    if (!range_inside(a.stacks[i].frame_offset, a.stacks[i].frame_count, a.stack_frames.size())) {
      r.fail(fmt::format("/stacks row {}: frame_offset {} + frame_count {} lie outside /stack_frames ({} rows)", i,
                         a.stacks[i].frame_offset, a.stacks[i].frame_count, a.stack_frames.size()));
    }
  }
  for (std::size_t i = 0; i < a.stack_frames.size(); ++i) {
    if (a.stack_frames[i] >= a.frames.size()) {
      r.fail(fmt::format("/stack_frames row {}: frame {} is outside /frames ({} rows)", i, a.stack_frames[i],
                         a.frames.size()));
    }
  }
  for (std::size_t i = 0; i < a.frames.size(); ++i) {
    if (a.frames[i].function >= a.strings.size() || a.frames[i].file >= a.strings.size()) {
      r.fail(fmt::format("/frames row {}: string id {} or {} is outside /strings ({} rows)", i, a.frames[i].function,
                         a.frames[i].file, a.strings.size()));
    }
  }
}

}  // namespace

const RankRow* Archive::rank_row(int rank) const {
  for (const auto& r : ranks) {
    if (r.rank == rank) return &r;
  }
  return nullptr;
}

std::span<const Event> Archive::events_of(const RankRow& row) const {
  return std::span<const Event>(events).subspan(row.event_offset, row.event_count);
}

namespace {
// Rows grouped by rank (checked by the reader): the group of `rank`.
template <typename Row>
std::span<const Row> group_of(const std::vector<Row>& rows, int rank) {
  const auto first = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.rank == rank; });
  const auto last = std::find_if(first, rows.end(), [&](const Row& r) { return r.rank != rank; });
  return std::span<const Row>(first, last);
}
}  // namespace

std::span<const BatchRow> Archive::batches_of(int rank) const { return group_of(batches, rank); }
std::span<const CollectiveRow> Archive::collectives_of(int rank) const { return group_of(collectives, rank); }
std::span<const CommunicatorRow> Archive::communicators_of(int rank) const { return group_of(communicators, rank); }

std::span<const ContextRow> Archive::context_of(int rank) const { return group_of(context, rank); }

std::span<const StateSegmentRow> Archive::state_segments_of(int rank) const { return group_of(state_segments, rank); }

std::span<const StateBlockRow> Archive::state_blocks_of(int rank) const { return group_of(state_blocks, rank); }

std::vector<const FrameRow*> Archive::stack(std::int32_t stack_id) const {
  std::vector<const FrameRow*> out;
  if (stack_id < 0 || static_cast<std::size_t>(stack_id) >= stacks.size()) return out;
  const auto& s = stacks[static_cast<std::size_t>(stack_id)];
  for (std::uint64_t i = 0; i < s.frame_count; ++i) out.push_back(&frames[stack_frames[s.frame_offset + i]]);
  return out;
}

std::string_view Archive::string(std::uint32_t id) const {
  return id < strings.size() ? std::string_view(strings[id]) : std::string_view();
}

namespace {

// The root attributes, checked: what read_archive_header returns and read_archive starts with.
ArchiveHeader read_header(Reader& r) {
  ArchiveHeader h;
  const auto version = r.int_attribute("schema_version");
  if (version.size() != 1) r.fail("root attribute 'schema_version' is not a single integer");
  h.schema_version = version[0];
  if (h.schema_version > kSchemaVersion || h.schema_version < 1) {
    r.fail(fmt::format("written with archive schema {}; this oomflight reads schema 1 to {}", h.schema_version,
                       kSchemaVersion));
  }
  h.producer = r.string_attribute("producer");
  // Since 0.2 the writer marks a finished file last; a file without the mark (a crash mid-write, or a partial
  // file renamed by hand) is refused. 0.1.x wrote no mark but never gave an unfinished file a final name.
  if (H5Aexists(r.file(), kCompleteAttribute) <= 0) {
    if (!h.producer.starts_with("oomflight 0.1.")) {
      r.fail(fmt::format("incomplete archive: the dump that wrote it did not finish (no root attribute '{}'; "
                         "written by {})", kCompleteAttribute, h.producer));
    }
  } else {
    const auto complete = r.int_attribute(kCompleteAttribute);
    if (complete.size() != 1 || complete[0] != 1) {
      r.fail(fmt::format("incomplete archive: root attribute '{}' is not 1", kCompleteAttribute));
    }
  }
  h.run_name = r.string_attribute("run_name");
  if (H5Aexists(r.file(), "job_id") > 0) {
    // 12 lower-case hex digits as oomflight draws them; anything else (a crafted file) is no job id: it goes into
    // file names (a merge's partial file, retention), where '/' or ".." must never come from a file.
    std::string id = r.string_attribute("job_id");
    const bool well_formed = id.size() == 12 && std::all_of(id.begin(), id.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
    if (well_formed) h.job_id = std::move(id);
  }
  h.kind = r.string_attribute("kind");
  h.created_at_utc = r.string_attribute("created_at_utc");
  h.reason = r.string_attribute("reason");
  h.origin_ranks = r.int_attribute("origin_ranks");
  const auto world = r.int_attribute("world_size");
  h.world_size = world.empty() ? 0 : world[0];
  h.ranks_present = r.int_attribute("ranks_present");
  if (H5Aexists(r.file(), "dump_batch") > 0) h.dump_batch = r.int64_attribute("dump_batch");
  if (H5Aexists(r.file(), "dump_number") > 0) h.dump_number = r.int64_attribute("dump_number");
  if (H5Aexists(r.file(), "snapshot_windows_skipped") > 0) {
    h.snapshot_windows_skipped = r.int64_attribute("snapshot_windows_skipped");
    if (*h.snapshot_windows_skipped < 0) {
      r.fail(fmt::format("root attribute 'snapshot_windows_skipped' is {}; a count of windows must be >= 0",
                         *h.snapshot_windows_skipped));
    }
  }
  if (H5Aexists(r.file(), "window_first_batch") > 0) {
    h.window_first_batch = r.int64_attribute("window_first_batch");
    h.window_last_batch = r.int64_attribute("window_last_batch");
    if (h.window_first_batch < 0 || h.window_last_batch < h.window_first_batch) {
      r.fail(fmt::format("root attributes 'window_first_batch' {} and 'window_last_batch' {} are not a window",
                         h.window_first_batch, h.window_last_batch));
    }
  }
  return h;
}

}  // namespace

ArchiveHeader read_archive_header(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r(path);
  r.open();
  return read_header(r);
}

Archive read_archive(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r(path);
  r.open();
  Archive a;
  a.path = path;
  a.header = read_header(r);

  {
    // Older /ranks rows are prefixes of RankRow: before 0.2.1 they ended before the collective counts, 0.2.1's
    // first archives before the memory cap, and those before 0.3 before the memory outside the allocator. Read the
    // prefix; the members after it keep RankRow's defaults (0; -1, unknown, for the memory outside the allocator).
    const auto read_prefix = [&]<std::size_t Bytes>(const h5::Handle& type) {
      struct Prefix {
        unsigned char bytes[Bytes];
      };
      for (const Prefix& p : r.rows<Prefix>(dataset::ranks, type)) {
        RankRow& row = a.ranks.emplace_back();
        std::memcpy(static_cast<void*>(&row), p.bytes, sizeof(p.bytes));
      }
    };
    const auto v0 = h5::rank_row_type_v0();
    const auto v1 = h5::rank_row_type_v1();
    const auto v2 = h5::rank_row_type_v2();
    if (r.has_row_type(dataset::ranks, v0)) {
      read_prefix.operator()<h5::kRankRowV0Bytes>(v0);
    } else if (r.has_row_type(dataset::ranks, v1)) {
      read_prefix.operator()<h5::kRankRowV1Bytes>(v1);
    } else if (r.has_row_type(dataset::ranks, v2)) {
      read_prefix.operator()<h5::kRankRowV2Bytes>(v2);
    } else {
      a.ranks = r.rows<RankRow>(dataset::ranks, h5::rank_row_type());
    }
  }
  {
    // 0.2.0's events have the same layout without `flags`: read with that type, flags stay 0.
    const auto v0 = h5::event_type_v0();
    if (r.has_row_type(dataset::events, v0)) {
      a.events = r.rows<Event>(dataset::events, v0);
      // The same layout reads as a raw copy, and the byte under `flags` was padding then: whatever the file held.
      for (Event& e : a.events) e.flags = 0;
    } else {
      a.events = r.rows<Event>(dataset::events, h5::event_type());
    }
  }
  a.stacks = r.rows<StackRow>(dataset::stacks, h5::stack_row_type());
  a.stack_frames = r.rows<std::uint32_t>(dataset::stack_frames, H5T_NATIVE_UINT32);
  a.frames = r.rows<FrameRow>(dataset::frames, h5::frame_row_type());
  if (r.has_dataset(dataset::batches)) {
    const auto v0 = h5::batch_row_type_v0();
    if (r.has_row_type(dataset::batches, v0)) {  // before 0.3: the memory outside the allocator is unknown
      struct Prefix {
        unsigned char bytes[h5::kBatchRowV0Bytes];
      };
      for (const Prefix& p : r.rows<Prefix>(dataset::batches, v0)) {
        BatchRow& row = a.batches.emplace_back();
        std::memcpy(static_cast<void*>(&row), p.bytes, sizeof(p.bytes));
      }
    } else {
      a.batches = r.rows<BatchRow>(dataset::batches, h5::batch_row_type());
    }
  }
  if (r.has_dataset(dataset::context)) a.context = r.rows<ContextRow>(dataset::context, h5::context_row_type());
  if (r.has_dataset(dataset::state_segments)) {
    const auto v0 = h5::state_segment_row_type_v0();
    if (r.has_row_type(dataset::state_segments, v0)) {  // 0.2.0: no segment_type, frames or pool id
      for (const StateSegmentRowV0& old : r.rows<StateSegmentRowV0>(dataset::state_segments, v0)) {
        StateSegmentRow row;
        row.rank = old.rank;
        row.device = old.device;
        row.address = old.address;
        row.total_size = old.total_size;
        row.stream = old.stream;
        row.is_expandable = old.is_expandable;
        a.state_segments.push_back(row);
      }
    } else {
      a.state_segments = r.rows<StateSegmentRow>(dataset::state_segments, h5::state_segment_row_type());
    }
  }
  if (r.has_dataset(dataset::state_blocks)) {
    a.state_blocks = r.rows<StateBlockRow>(dataset::state_blocks, h5::state_block_row_type());
  }
  if (r.has_dataset(dataset::collectives)) {
    a.collectives = r.rows<CollectiveRow>(dataset::collectives, h5::collective_row_type());
  }
  if (r.has_dataset(dataset::communicators)) {
    a.communicators = r.rows<CommunicatorRow>(dataset::communicators, h5::communicator_row_type());
  }
  const auto string_rows = r.rows<StringRow>(dataset::strings, h5::string_row_type());
  const auto data = r.rows<char>(dataset::string_data, H5T_NATIVE_UINT8);
  a.strings.reserve(string_rows.size());
  // Strings are stored once each: rows that point at the same bytes again and again would copy them out of all
  // proportion (a hostile file: a million rows over 4 MB). Bound the copy by the bytes the file holds.
  const std::uint64_t bound = 4 * static_cast<std::uint64_t>(data.size()) + (1u << 20);
  std::uint64_t copied = 0;
  for (std::size_t i = 0; i < string_rows.size(); ++i) {
    const StringRow& s = string_rows[i];
    copied += std::min<std::uint64_t>(s.length, data.size());
    if (copied > bound) r.fail(fmt::format("/strings rows reference {} bytes of /string_data's {} again and again", copied, data.size()));
    if (!range_inside(s.offset, s.length, data.size())) {
      r.fail(fmt::format("/strings row {}: offset {} + length {} lie outside /string_data ({} bytes)", i, s.offset,
                         s.length, data.size()));
    }
    a.strings.emplace_back(data.data() + s.offset, s.length);
  }
  check_consistency(a, r);
  return a;
}

}  // namespace oomflight
