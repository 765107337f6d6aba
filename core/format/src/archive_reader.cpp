// The archive reader: serial HDF5, whole datasets at once, checked against each other before use.
#include "oomflight/format/archive_reader.hpp"

#include <hdf5.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include "h5_handle.hpp"
#include "h5_types.hpp"

namespace oomflight {
namespace {

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& what) const { throw ArchiveError(fmt::format("{}: {}", path_, what)); }

  void open() {
    struct stat st {};
    if (stat(path_.c_str(), &st) != 0) fail("no such file");
    if (H5Fis_hdf5(path_.c_str()) <= 0) fail("not an HDF5 file, so not an oomflight archive");
    file_ = h5::file(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
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

  template <typename T>
  std::vector<T> rows(const char* name, hid_t type) const {
    if (H5Lexists(file_, name, H5P_DEFAULT) <= 0) fail(fmt::format("dataset '/{}' is missing", name));
    auto d = h5::dset(H5Dopen2(file_, name, H5P_DEFAULT));
    auto s = h5::space(H5Dget_space(d));
    const auto n = H5Sget_simple_extent_npoints(s);
    std::vector<T> out(static_cast<std::size_t>(n < 0 ? 0 : n));
    if (!out.empty() && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
      fail(fmt::format("cannot read dataset '/{}'", name));
    }
    return out;
  }

 private:
  std::string path_;
  h5::Handle file_;
};

void check_consistency(const Archive& a, const Reader& r) {
  for (const auto& row : a.ranks) {
    if (row.event_offset + row.event_count > a.events.size()) {
      r.fail(fmt::format("rank {}: events {}+{} lie outside /events ({} rows)", row.rank, row.event_offset,
                         row.event_count, a.events.size()));
    }
  }
  for (const auto& s : a.stacks) {
    if (s.frame_offset + s.frame_count > a.stack_frames.size()) r.fail("/stacks points outside /stack_frames");
  }
  for (const auto f : a.stack_frames) {
    if (f >= a.frames.size()) r.fail("/stack_frames points outside /frames");
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

Archive read_archive(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Reader r(path);
  r.open();
  Archive a;
  a.path = path;
  const auto version = r.int_attribute("schema_version");
  if (version.size() != 1) r.fail("root attribute 'schema_version' is not a single integer");
  a.header.schema_version = version[0];
  if (a.header.schema_version > kSchemaVersion || a.header.schema_version < 1) {
    r.fail(fmt::format("written with archive schema {}; this oomflight reads schema 1 to {}",
                       a.header.schema_version, kSchemaVersion));
  }
  a.header.producer = r.string_attribute("producer");
  a.header.run_name = r.string_attribute("run_name");
  a.header.kind = r.string_attribute("kind");
  a.header.created_at_utc = r.string_attribute("created_at_utc");
  a.header.reason = r.string_attribute("reason");
  a.header.origin_ranks = r.int_attribute("origin_ranks");
  const auto world = r.int_attribute("world_size");
  a.header.world_size = world.empty() ? 0 : world[0];
  a.header.ranks_present = r.int_attribute("ranks_present");

  a.ranks = r.rows<RankRow>(dataset::ranks, h5::rank_row_type());
  a.events = r.rows<Event>(dataset::events, h5::event_type());
  a.stacks = r.rows<StackRow>(dataset::stacks, h5::stack_row_type());
  a.stack_frames = r.rows<std::uint32_t>(dataset::stack_frames, H5T_NATIVE_UINT32);
  a.frames = r.rows<FrameRow>(dataset::frames, h5::frame_row_type());
  const auto string_rows = r.rows<StringRow>(dataset::strings, h5::string_row_type());
  const auto data = r.rows<char>(dataset::string_data, H5T_NATIVE_UINT8);
  a.strings.reserve(string_rows.size());
  for (const auto& s : string_rows) {
    if (s.offset + s.length > data.size()) r.fail("/strings points outside /string_data");
    a.strings.emplace_back(data.data() + s.offset, s.length);
  }
  check_consistency(a, r);
  return a;
}

}  // namespace oomflight
