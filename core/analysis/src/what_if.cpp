// What-if replays (what_if.hpp).
#include "oomflight/analysis/what_if.hpp"

#include "oomflight/analysis/allocator_replay.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

namespace oomflight {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
// No device holds 16 TiB: a larger request is a damaged entry, skipped (counted). Addresses the model gives its own
// segments start above every recorded one below 2^60, so that neither can wrap whatever a file holds.
constexpr std::uint64_t kLargestRequest = 1ull << 44;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::uint64_t read_count(std::string_view key, std::string_view value) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw std::invalid_argument(fmt::format("{}: '{}' is not a whole number", key, value));
  }
  return v;
}

}  // namespace

AllocatorSettings parse_alloc_conf(std::string_view text, AllocatorSettings settings) {
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view option = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (option.empty()) continue;
    const std::size_t colon = option.find(':');
    if (colon == std::string_view::npos) {
      throw std::invalid_argument(fmt::format("'{}' is not key:value", option));
    }
    const std::string_view key = trim(option.substr(0, colon));
    const std::string_view value = trim(option.substr(colon + 1));
    if (key == "max_split_size_mb") {
      const std::uint64_t mb = read_count(key, value);
      // parseMaxSplitSize(): torch refuses 20 MiB and less (kLargeBuffer), and caps it at what fits a size_t.
      if (mb <= 20) throw std::invalid_argument(fmt::format("max_split_size_mb: {} is too small: torch needs > 20", mb));
      settings.max_split_size = mb > UINT64_MAX / kMiB ? UINT64_MAX : mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      if (!value.empty() && value.front() == '[') {
        throw std::invalid_argument("roundup_power2_divisions: the per-interval form [..] is not read yet; give one "
                                    "power of two for every size");
      }
      const std::uint64_t d = read_count(key, value);
      if (d != 0 && !std::has_single_bit(d)) {
        throw std::invalid_argument(fmt::format("roundup_power2_divisions: {} is not a power of two", d));
      }
      std::fill(settings.roundup_power2_divisions.begin(), settings.roundup_power2_divisions.end(), d);
    } else if (key == "expandable_segments") {
      if (value != "True" && value != "False") {
        throw std::invalid_argument(fmt::format("expandable_segments: '{}' is neither True nor False", value));
      }
      settings.expandable_segments = value == "True";
    } else if (key == "garbage_collection_threshold") {
      throw std::invalid_argument("garbage_collection_threshold is not modelled yet (docs/allocator-model.md)");
    } else if (key == "backend" && value != "native") {
      // cudaMallocAsync hands every request to CUDA's own stream-ordered pool: no caching allocator to model.
      throw std::invalid_argument(fmt::format(
          "backend:{} is not PyTorch's caching allocator (backend:native), which is what the model replays", value));
    } else if (key == "backend" || key == "release_lock_on_cudamalloc" || key.starts_with("pinned_")) {
      // Where memory goes does not depend on them.
    } else {
      throw std::invalid_argument(fmt::format(
          "'{}' is not an option the model reads (max_split_size_mb, roundup_power2_divisions, expandable_segments, "
          "garbage_collection_threshold, backend, release_lock_on_cudamalloc, pinned_*)",
          key));
    }
  }
  return settings;
}

WhatIfOutcome replay_what_if(const TorchSnapshot& snapshot, int device, const AllocatorSettings& settings,
                             std::uint64_t capacity) {
  WhatIfOutcome out;
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return out;
  const std::vector<TraceEntry>& trace = snapshot.device_traces[static_cast<std::size_t>(device)];
  AllocatorReplay replay(snapshot_start_state(snapshot, device), trace, settings, capacity);
  const AllocatorModel& model = replay.model();
  const auto note_peaks = [&] {
    out.peak_reserved = std::max(out.peak_reserved, model.reserved_bytes());
    if (model.allocated_bytes() > out.peak_allocated) {
      out.peak_allocated = model.allocated_bytes();
      out.unallocated_at_peak = model.reserved_bytes() - model.allocated_bytes();
    }
  };
  note_peaks();
  for (std::size_t i = 0; i < trace.size() && out.fits; ++i) {
    const TraceEntry& e = trace[i];
    switch (e.action) {
      case Action::alloc:
      case Action::oom: {  // an oom entry is the request that failed: asked again here
        if (e.size > kLargestRequest) {
          ++out.skipped_requests;
          break;
        }
        ++out.allocations;
        const ModelledAllocation a =
            replay.allocate(e.size, e.stream, e.action == Action::alloc ? std::optional(e.addr) : std::nullopt);
        out.released_by_retries += a.released;
        if (!a.address && a.needed != 0) {
          out.fits = false;
          out.failing_entry = i;
          out.failing_size = e.size;
          out.failing_segment = a.needed;
          out.failing_pages = a.pages;
          out.reserved_at_failure = model.reserved_bytes();
          break;
        }
        note_peaks();
        break;
      }
      case Action::free_completed:
        (void)replay.free(e.addr);
        break;
      case Action::segment_free: {
        const SegmentFreeBurst burst = segment_free_burst(trace, i);
        if (!burst.retry_path) (void)replay.empty_cache();
        i = burst.end - 1;
        break;
      }
      default:
        break;
    }
  }
  out.small = model.pool_figures(true);
  out.large = model.pool_figures(false);
  return out;
}

std::optional<std::uint64_t> capacity_at_oom(const TorchSnapshot& snapshot, int device) {
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return std::nullopt;
  std::uint64_t reserved = 0;
  for (const auto& [address, segment] : snapshot_start_state(snapshot, device).segments) reserved += segment.size;
  for (const TraceEntry& e : snapshot.device_traces[static_cast<std::size_t>(device)]) {
    if (e.action == Action::segment_alloc) reserved += e.size;
    if (e.action == Action::segment_free) reserved -= std::min(reserved, e.size);
    if (e.action == Action::oom) return reserved + e.addr;
  }
  return std::nullopt;
}

}  // namespace oomflight
