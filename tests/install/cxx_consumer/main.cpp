// An out-of-tree C++ tool on the installed package (find_package(oomflight)): it records a known history through
// the C API, triggers a dump, then reads the archive back through the C++ faces (format, analysis, export) and
// checks what it finds. Exit 0 only when every check holds.
#include <oomflight/analysis/post_mortem.hpp>
#include <oomflight/base/units.hpp>
#include <oomflight/export/text_report.hpp>
#include <oomflight/format/archive_reader.hpp>
#include <oomflight/oomflight.h>
#include <oomflight/record/recorder.hpp>

#include <cstdio>
#include <string>

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "cxx_consumer: FAILED: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main() {
  // The C++ record face works on its own, without a session.
  oomflight::Recorder recorder(16);
  for (int i = 0; i < 20; ++i) recorder.record(oomflight::Action::alloc, 0, 0x1000u * i, 64, 0);
  const auto frozen = recorder.freeze();
  check(frozen.ring.events.size() == 16 && frozen.ring.overwritten == 4, "a Recorder of 16 keeps 16 of 20 events");

  if (oomflight_init() != OOMFLIGHT_OK) {
    std::fprintf(stderr, "cxx_consumer: %s\n", oomflight_last_error());
    return 2;
  }
  oomflight_mark_batch(7);
  for (int i = 0; i < 40; ++i) oomflight_record(OOMFLIGHT_ALLOC, 2, 0x2000u * (i + 1), 1u << 20, 0, -1);
  oomflight_memory gauges = OOMFLIGHT_MEMORY_INIT;
  gauges.allocated_bytes = 40u << 20;
  gauges.device_capacity_bytes = 8ull << 30;
  oomflight_set_memory(2, &gauges);
  const int rc = oomflight_trigger_oom(2, "CUDA out of memory. Tried to allocate 3.00 GiB", 3ull << 30, 1ull << 30);
  check(rc == OOMFLIGHT_OK, "the dump wrote an archive");
  const std::string path = oomflight_last_dump_path();
  oomflight_shutdown();

  const oomflight::Archive archive = oomflight::read_archive(path);
  check(archive.header.kind == "oom", "kind oom");
  check(archive.events.size() == 42, "step + 40 allocs + oom");
  check(archive.ranks.size() == 1 && archive.ranks[0].device == 2, "rank row of device 2");
  check(archive.ranks[0].oom_requested_bytes == (3ull << 30), "the failed request");
  const oomflight::PostMortem pm = oomflight::analyze(archive, 5);
  check(pm.origins.size() == 1 && pm.ranks.at(0).live_count == 40, "40 live blocks");
  check(pm.ranks.at(0).largest.size() == 5, "top 5 allocations");
  const std::string report = oomflight::render_report(archive, pm);
  check(report.find("requested 3.00 GiB") != std::string::npos, "the report quotes the request");
  check(oomflight::format_bytes(pm.ranks[0].live_bytes_in_history) == "40.00 MiB", "units");
  std::printf("cxx_consumer: read %s: %zu events, %zu live blocks, %d failures\n", path.c_str(), archive.events.size(),
              pm.ranks.at(0).live_count, failures);
  return failures == 0 ? 0 : 1;
}
