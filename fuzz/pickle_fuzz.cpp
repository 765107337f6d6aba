// libFuzzer target: the strict pickle reader and the PyTorch snapshot decoder on arbitrary bytes. The property:
// any input ends in a value or in PickleError / SnapshotError, within the memory Limits allow; anything else (a
// crash, a sanitizer report, another exception such as std::bad_alloc, a leak) is a finding. Built by
// -DOOMFLIGHT_FUZZ=ON with clang (fuzz/README.md).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "oomflight/format/pickle.hpp"
#include "oomflight/format/torch_snapshot.hpp"
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
