// `oomflight replay TRACE.pickle --device-memory SIZE [--rank-device-memory R=SIZE] [--steps N]`: flags only; the
// job is plugins/sim's replay job.
#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <stdexcept>

#include "commands.hpp"
#include "oomflight/analysis/what_if.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/sim/replay_job.hpp"

namespace oomflight::cli {
namespace {

struct ReplayFlags {
  std::string trace;
  std::string device_memory;
  std::vector<std::string> rank_device_memory;
  std::vector<std::string> rank_delay;
  int steps = 1;
  int rank_memory_from_step = 0;
  int device = -1;
  bool pace = false;
  std::optional<std::string> alloc_conf;
  std::vector<std::string> rank_leak;
};

// Turns the flags into the job's options. Throws std::invalid_argument naming the flag and the value.
sim::ReplayOptions to_options(const ReplayFlags& f) {
  sim::ReplayOptions o;
  o.trace = f.trace;
  o.steps = f.steps;
  o.rank_memory_from_step = f.rank_memory_from_step;
  o.device = f.device;
  if (f.alloc_conf) {
    // Said before the trace is read: a bad option, or one the simulated device does not replay.
    try {
      if (parse_alloc_conf(*f.alloc_conf).expandable_segments) {
        throw std::invalid_argument("expandable_segments:True is not replayed on the simulated device yet ("
                                    "`oomflight whatif TRACE --alloc-conf expandable_segments:True` models it)");
      }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("--alloc-conf: {}", e.what()));
    }
    o.alloc_conf = *f.alloc_conf;
  }
  o.pace = f.pace;
  try {
    o.device_memory_bytes = parse_bytes(f.device_memory);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--device-memory: {}", e.what()));
  }
  // RANK=VALUE, VALUE parsed by `parse`: the flag, the expected form and the value are named on error.
  const auto per_rank = [](const std::vector<std::string>& specs, const char* flag, const char* form,
                           const char* example, const auto& parse, auto& into) {
    for (const auto& spec : specs) {
      const auto eq = spec.find('=');
      int rank = -1;
      const auto [end, ec] = std::from_chars(spec.data(), spec.data() + (eq == std::string::npos ? 0 : eq), rank);
      if (eq == std::string::npos || ec != std::errc() || end != spec.data() + eq || rank < 0) {
        throw std::invalid_argument(fmt::format("{} '{}': expected {}, e.g. {}", flag, spec, form, example));
      }
      try {
        into[rank] = parse(spec.substr(eq + 1));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{} '{}': {}", flag, spec, e.what()));
      }
    }
  };
  per_rank(f.rank_device_memory, "--rank-device-memory", "RANK=SIZE", "2=40GiB",
           [](const std::string& v) { return parse_bytes(v); }, o.rank_device_memory_bytes);
  per_rank(f.rank_delay, "--rank-delay", "RANK=DURATION", "3=1s", [](const std::string& v) { return parse_duration(v); },
           o.rank_delay);
  per_rank(f.rank_leak, "--rank-leak", "RANK=SIZE", "1=256MiB", [](const std::string& v) { return parse_bytes(v); },
           o.rank_leak_bytes);
  return o;
}

}  // namespace

Command add_replay(CLI::App& app) {
  auto* sub = app.add_subcommand("replay", "Replay a PyTorch memory snapshot's trace on a simulated device");
  auto f = std::make_shared<ReplayFlags>();
  sub->add_option("trace", f->trace, "A torch.cuda.memory._dump_snapshot() pickle")->required();
  sub->add_option("--device-memory", f->device_memory, "Simulated device capacity, e.g. 40GiB")->required();
  sub->add_option("--rank-device-memory", f->rank_device_memory,
                  "Capacity for one rank, RANK=SIZE (repeatable), e.g. 2=40GiB");
  sub->add_option("--rank-delay", f->rank_delay,
                  "A straggler: RANK=DURATION (repeatable), e.g. 3=1s: that rank starts every step this much later, as "
                  "with a slow input pipeline; the others wait for it in the step's all-reduce");
  sub->add_option("--steps", f->steps, "Loops of the trace, one batch each")->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--rank-memory-from-step", f->rank_memory_from_step,
                  "Step from which the --rank-device-memory capacities apply (before it, every rank has "
                  "--device-memory): a rank that runs out of memory later in the job, as when another process takes "
                  "memory on its GPU")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_option("--device", f->device,
                  "The trace's device to replay (default: the only device with a trace; several need this flag)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--rank-leak", f->rank_leak,
                  "A rank that keeps memory step after step: RANK=SIZE (repeatable), e.g. 1=256MiB: after each step "
                  "that rank holds SIZE more, from a call site of its own (as a list that grows, or a history never "
                  "cleared), until it runs out of memory");
  sub->add_option("--alloc-conf", f->alloc_conf,
                  "Allocator settings to replay under, as PYTORCH_CUDA_ALLOC_CONF gives them (e.g. "
                  "max_split_size_mb:256,roundup_power2_divisions:4), over those the trace records: the allocator's "
                  "decisions (where blocks go, which segments are reserved, what the retry path releases) are then "
                  "the model's (docs/allocator-model.md), not the trace's");
  sub->add_flag("--pace", f->pace,
                "Serve each trace entry at its own time (time_us) from the step's start, so that the archive's "
                "times are the trace's (a step then lasts as long as it did)");
  return {sub, [f] {
    sim::ReplayOptions options;
    try {
      options = to_options(*f);
    } catch (const std::invalid_argument& e) {
      print_error(e.what());
      return kExitUsage;
    }
    return sim::run_replay_job(options);
  }};
}

}  // namespace oomflight::cli
