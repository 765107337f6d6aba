// Reading a PyTorch memory snapshot: the strict pickle parse alone, and parse + decode into trace entries and
// interned stacks (what `oomflight replay` and `import` do), for the shared snapshots. The peer is Python's own C
// pickle.load of the same file: bench/decode_vs_python.sh runs both, one after the other.
//   oomflight_decode_bench SNAPSHOT_DIR [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <string>

#include "oomflight/format/pickle.hpp"
#include "oomflight/format/torch_snapshot.hpp"

namespace {

std::string g_dir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

void BM_Parse(benchmark::State& state, const char* name) {
  const std::string bytes = slurp(g_dir + "/" + name);
  for (auto _ : state) benchmark::DoNotOptimize(oomflight::pickle::Document::parse(bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
}

void BM_ParseAndDecode(benchmark::State& state, const char* name) {
  const std::string path = g_dir + "/" + name;
  for (auto _ : state) {
    oomflight::StackTable stacks;
    benchmark::DoNotOptimize(oomflight::read_torch_snapshot(path, stacks));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  g_dir = argv[1];
  for (const char* name : {"cnn-train-eor.pickle", "transformer-lm-forward-mixed-ctx128.pickle",
                           "transformer-lm-fullstep-ctx128.pickle"}) {
    benchmark::RegisterBenchmark((std::string("Parse/") + name).c_str(), BM_Parse, name)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("ParseAndDecode/") + name).c_str(), BM_ParseAndDecode, name)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
