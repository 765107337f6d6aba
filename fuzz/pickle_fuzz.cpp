// libFuzzer target: the strict pickle reader and the PyTorch snapshot decoder on arbitrary bytes. The property:
// any input ends in a value or in PickleError / SnapshotError, within the memory Limits allow, and an accepted
// snapshot written back (torch_snapshot_writer) reads and decodes to as many segments and trace entries; anything else (a
// crash, a sanitizer report, another exception such as std::bad_alloc, a leak) is a finding. Built by
// -DOOMFLIGHT_FUZZ=ON with clang (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "oomflight/format/pickle.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/format/torch_snapshot_writer.hpp"
#include "oomflight/record/stack_table.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // FUZZ_PRINT_OUTCOME=1 (fuzz/run.sh, over the corpus): one line per input, which the script checks.
  static const bool print = std::getenv("FUZZ_PRINT_OUTCOME") != nullptr;
  oomflight::pickle::Limits limits;
  // libFuzzer's own RSS limit is 2 GB; a smaller budget keeps a refusal, not an RSS kill, the outcome.
  limits.max_memory_bytes = std::size_t{256} << 20;
  try {
    const auto doc =
        oomflight::pickle::Document::parse(std::string(reinterpret_cast<const char*>(data), size), limits);
    oomflight::StackTable stacks;
    const auto snapshot = oomflight::decode_torch_snapshot(doc, stacks);
    // Every decoded stack id must name an interned stack.
    for (const auto& trace : snapshot.device_traces) {
      for (const auto& e : trace) {
        if (e.stack_id != oomflight::kNoStack && static_cast<std::size_t>(e.stack_id) >= stacks.size()) {
          __builtin_trap();
        }
      }
    }
    // What import and export do with an accepted snapshot: its start state per device, and writing it back as a
    // pickle that the strict reader reads and decodes to the same number of trace entries.
    std::size_t entries_in = 0;
    for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
      (void)oomflight::snapshot_start_state(snapshot, static_cast<int>(d));
      entries_in += snapshot.device_traces[d].size();
    }
    const auto table = stacks.copy();
    const std::string written = oomflight::write_torch_snapshot(snapshot, oomflight::StackTableFrames(table));
    oomflight::StackTable again_stacks;
    const auto again = oomflight::decode_torch_snapshot(oomflight::pickle::Document::parse(written), again_stacks);
    std::size_t entries_out = 0;
    for (const auto& trace : again.device_traces) entries_out += trace.size();
    if (entries_out != entries_in || again.segments.size() != snapshot.segments.size()) __builtin_trap();
    if (print) {
      std::size_t entries = 0;
      for (const auto& trace : snapshot.device_traces) entries += trace.size();
      std::fprintf(stderr, "outcome: accepted: %zu segments, %zu trace entries, %zu stacks\n",
                   snapshot.segments.size(), entries, stacks.size());
    }
  } catch (const oomflight::pickle::PickleError& e) {
    if (print) std::fprintf(stderr, "outcome: refused: %s\n", e.what());
  } catch (const oomflight::SnapshotError& e) {
    if (print) std::fprintf(stderr, "outcome: refused: %s\n", e.what());
  }
  return 0;
}
