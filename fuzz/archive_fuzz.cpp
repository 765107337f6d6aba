// libFuzzer target: the archive reader's checks and everything that trusts them (the post-mortem analysis and
// the text report), on archives whose contents are arbitrary.
//
// Why structure-aware: flipping bytes of an HDF5 file mostly exercises HDF5's own parser, which is not ours and
// which can crash on a damaged file; `oomflight report` reads in a child process for that reason (launcher/
// isolate.hpp), and tests/format/hostile_archives.py covers it with bit flips. What is ours is every value the
// file holds: offsets, counts, ids, ranks, attributes. So the input is decoded into those values and written as
// a well-formed HDF5 file with the schema's own row types (taken from an archive that write_archive makes at
// start-up), then read. The property: read_archive ends in ArchiveError, or it returns an archive that analyze,
// render_report, render_html_report and the exporters (memory_viz, whose pickle the strict reader must read back,
// perfetto, folded) handle without a crash, a sanitizer report or another exception.
//
// Input, little-endian; a read past the end gives zeros (fuzz/make_corpus.py writes the same layout):
//   u8 flags            bit 0: write the 'complete' attribute; bit 1: its value is 0, not 1;
//                       bit 2: producer "oomflight 0.1.0" (no mark needed) instead of "oomflight 0.2.0"
//   i32 schema_version, i32 world_size
//   u8 n, then n x i32  origin_ranks (n <= 16)
//   u8 n, then n x i32  ranks_present (n <= 16)
//   11 x (u16 rows, then rows x row-size bytes in the file type's layout) for ranks, events, stacks,
//   stack_frames, frames, strings, string_data, batches, context, collectives, communicators
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/folded.hpp"
#include "oomflight/export/html_report.hpp"
#include "oomflight/export/memory_viz.hpp"
#include "oomflight/export/perfetto.hpp"
#include "oomflight/export/text_report.hpp"
#include "oomflight/format/pickle.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/archive_writer.hpp"

namespace {

constexpr const char* kDatasets[] = {"ranks",   "events",      "stacks",  "stack_frames", "frames",
                                     "strings", "string_data", "batches", "context", "collectives",
                                     "communicators"};
constexpr std::size_t kMaxRows = 4096;

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  void bytes(void* out, std::size_t n) {
    auto* o = static_cast<std::uint8_t*>(out);
    for (std::size_t i = 0; i < n; ++i) o[i] = pos_ < size_ ? data_[pos_++] : 0;
  }
  template <typename T>
  T get() {
    T v{};
    bytes(&v, sizeof v);
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

std::string scratch(const char* what) {
  return (std::filesystem::temp_directory_path() / ("oomflight-fuzz-" + std::to_string(getpid()) + what)).string();
}

// The schema's file types, as the writer makes them: one real archive of one rank with one event.
std::vector<hid_t> schema_types() {
  const std::string path = scratch("-seed.h5");
  oomflight::ArchiveHeader header;
  header.ranks_present = {0};
  oomflight::StackTable table;
  const auto stacks = table.copy();
  oomflight::Event event{};
  oomflight::RankDump dump;
  dump.events = std::span<const oomflight::Event>(&event, 1);
  dump.stacks = &stacks;
  oomflight::write_archive(path, header, dump);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  std::vector<hid_t> types;
  for (const char* name : kDatasets) {
    const hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    types.push_back(H5Dget_type(d));
    H5Dclose(d);
  }
  H5Fclose(file);
  std::filesystem::remove(path);
  return types;
}

void int_attribute(hid_t file, const char* name, const std::vector<std::int32_t>& values, bool scalar) {
  const hsize_t n = values.size();
  const hid_t space = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  const hid_t a = H5Acreate2(file, name, H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT);
  if (!values.empty()) H5Awrite(a, H5T_NATIVE_INT32, values.data());
  H5Aclose(a);
  H5Sclose(space);
}

void string_attribute(hid_t file, const char* name, const std::string& value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, value.empty() ? 1 : value.size());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  std::string padded = value;
  padded.resize(value.empty() ? 1 : value.size(), '\0');
  H5Awrite(a, type, padded.data());
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
}

std::vector<std::int32_t> int_list(Input& in) {
  std::vector<std::int32_t> v(in.get<std::uint8_t>() % 17);
  for (auto& x : v) x = in.get<std::int32_t>();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<hid_t> types = schema_types();
  static const std::string path = scratch(".h5");
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Input in(data, size);
  const auto flags = in.get<std::uint8_t>();
  const auto schema_version = in.get<std::int32_t>();
  const auto world_size = in.get<std::int32_t>();
  const auto origins = int_list(in);
  const auto present = int_list(in);

  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) __builtin_trap();  // the scratch folder must be writable: a harness fault, not a finding
  int_attribute(file, "schema_version", {schema_version}, true);
  string_attribute(file, "producer", (flags & 4) ? "oomflight 0.1.0" : "oomflight 0.2.0");
  string_attribute(file, "run_name", "fuzz");
  string_attribute(file, "kind", "oom");
  string_attribute(file, "created_at_utc", "2026-11-23T00:00:00Z");
  string_attribute(file, "reason", "rank 0: fuzz");
  int_attribute(file, "origin_ranks", origins, false);
  int_attribute(file, "world_size", {world_size}, true);
  int_attribute(file, "ranks_present", present, false);
  for (std::size_t i = 0; i < std::size(kDatasets); ++i) {
    const hsize_t rows = in.get<std::uint16_t>() % (kMaxRows + 1);
    std::vector<std::uint8_t> bytes(rows * H5Tget_size(types[i]));
    in.bytes(bytes.data(), bytes.size());
    const hid_t space = H5Screate_simple(1, &rows, nullptr);
    const hid_t d = H5Dcreate2(file, kDatasets[i], types[i], space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (rows > 0) H5Dwrite(d, types[i], H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
    H5Dclose(d);
    H5Sclose(space);
  }
  if (flags & 1) int_attribute(file, oomflight::kCompleteAttribute, {(flags & 2) ? 0 : 1}, true);
  H5Fclose(file);

  // FUZZ_PRINT_OUTCOME=1 (fuzz/run.sh, over the corpus): one line per input, which the script checks.
  static const bool print = std::getenv("FUZZ_PRINT_OUTCOME") != nullptr;
  try {
    const oomflight::Archive archive = oomflight::read_archive(path);
    const auto pm = oomflight::analyze(archive, 10);
    const std::string text = oomflight::render_report(archive, pm, 6);
    if (text.empty()) __builtin_trap();
    // Every other reader of an accepted archive: the page and the three exports.
    if (oomflight::render_html_report(archive, pm, 6).empty()) __builtin_trap();
    for (const auto& row : archive.ranks) {
      const std::string pickle = oomflight::render_memory_viz(archive, row);
      if (pickle.size() < 3) __builtin_trap();
      oomflight::pickle::Document::parse(pickle);  // ours must read back
    }
    if (oomflight::render_perfetto(archive).empty()) __builtin_trap();
    (void)oomflight::render_folded(archive);
    if (print) std::fprintf(stderr, "outcome: accepted: %zu ranks, %zu events\n", archive.ranks.size(), archive.events.size());
  } catch (const oomflight::ArchiveError& e) {
    if (print) std::fprintf(stderr, "outcome: refused: %s\n", e.what());
  }
  return 0;
}
