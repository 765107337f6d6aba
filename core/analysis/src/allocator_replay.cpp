#include "oomflight/analysis/allocator_replay.hpp"

#include <algorithm>

namespace oomflight {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kLargestRequest = 1ull << 44;  // 16 TiB: larger than any device; a damaged file's
// The highest recorded address that moves the model's own segments up; a damaged file's larger ones are not followed
// (the model's expandable segments live at 1 << 56 and up, apart from any real device address).
constexpr std::uint64_t kHighestAddress = 1ull << 60;

}  // namespace

AllocatorReplay::AllocatorReplay(const SnapshotStartState& start, const std::vector<TraceEntry>& trace,
                                 const AllocatorSettings& settings, std::uint64_t capacity)
    : settings_(settings), model_(settings), capacity_(capacity) {
  for (const auto& [address, segment] : start.segments) {
    model_.add_segment(address, segment.size, segment.stream, segment.size == 2 * kMiB && !segment.is_expandable);
    if (address < kHighestAddress && segment.size < kLargestRequest) {
      next_address_ = std::max(next_address_, address + segment.size);
    }
  }
  for (const auto& [address, block] : start.blocks) {
    if (model_.restore_allocated(address, block.block_size != 0 ? block.block_size : model_.round_size(block.size))) {
      placed_[address] = address;
    }
  }
  for (const TraceEntry& e : trace) {
    if (e.action != Action::oom && e.addr < kHighestAddress && e.size < kLargestRequest) {
      next_address_ = std::max(next_address_, e.addr + e.size);
    }
  }
  // The model's own segments start 1 GiB above every recorded address, on a 2 MiB boundary: none is mistaken for one
  // the trace recorded.
  next_address_ = std::min(next_address_, kHighestAddress);
  next_address_ = (next_address_ + (1ull << 30)) & ~((1ull << 21) - 1);
}

std::uint64_t AllocatorReplay::release(std::vector<SegmentChange>* changes) {
  return model_.release_free_segments(changes);
}

ModelledAllocation AllocatorReplay::allocate(std::uint64_t size, std::uint64_t stream,
                                             std::optional<std::uint64_t> recorded,
                                             std::vector<SegmentChange>* changes) {
  ModelledAllocation out;
  if (size > kLargestRequest) return out;
  const std::uint64_t rounded = model_.round_size(size);
  std::optional<std::uint64_t> at = model_.place(size, stream);
  if (!at && capacity_ != 0 && rounded > capacity_) {
    // Larger than the whole capacity: it fails whatever the cache holds (and no search is spent on it).
    out.needed = settings_.expandable_segments ? rounded : AllocatorModel::segment_size(rounded);
    out.pages = settings_.expandable_segments;
    return out;
  }
  if (!at && settings_.expandable_segments) {
    // Pages of the stream's expandable segment; at the capacity, the retry path unmaps every free page and the
    // request looks again (a cached block first, then pages).
    AllocatorModel::Expansion x = model_.expand(size, stream, capacity_);
    if (!x.address) {
      out.released += release(changes);
      at = model_.place(size, stream);
      if (!at) x = model_.expand(size, stream, capacity_);
    }
    if (!at && !x.address) {
      out.needed = x.mapped;
      out.pages = true;
      return out;
    }
    if (!at) at = x.address;
  } else if (!at) {
    const std::uint64_t need = AllocatorModel::segment_size(rounded);
    const auto too_much = [&] { return capacity_ != 0 && model_.reserved_bytes() + need > capacity_; };
    // The retry path (malloc): the oversize cached blocks the request needs (with max_split_size), then all that are
    // wholly free (release_cached_blocks) unless the first step said it released enough and the segment then fits.
    if (too_much()) {
      const bool enough = model_.release_available_cached_blocks(rounded, stream, out.released, changes) && !too_much();
      if (!enough) out.released += release(changes);
    }
    if (too_much() || next_address_ > UINT64_MAX - need) {  // the second: a damaged file's endless requests
      out.needed = need;
      return out;
    }
    model_.add_segment(next_address_, need, stream, AllocatorModel::small_pool(rounded));
    if (changes) changes->push_back(SegmentChange{Action::segment_alloc, next_address_, need, stream});
    at = next_address_;
    next_address_ += need;
  }
  if (model_.allocate(*at, size, stream)) {
    out.address = *at;
    out.block_size = model_.block_size(*at);
    if (recorded) placed_[*recorded] = *at;
  }
  return out;
}

std::optional<std::uint64_t> AllocatorReplay::free(std::uint64_t recorded) {
  const auto it = placed_.find(recorded);
  if (it == placed_.end()) return std::nullopt;
  const std::uint64_t address = it->second;
  (void)model_.free(address);
  placed_.erase(it);
  return address;
}

std::optional<std::uint64_t> AllocatorReplay::address_of(std::uint64_t recorded) const {
  const auto it = placed_.find(recorded);
  return it == placed_.end() ? std::nullopt : std::optional<std::uint64_t>(it->second);
}

SegmentFreeBurst segment_free_burst(const std::vector<TraceEntry>& trace, std::size_t i) {
  SegmentFreeBurst burst;
  burst.end = i + 1;
  while (burst.end < trace.size() && trace[burst.end].action == Action::segment_free) ++burst.end;
  burst.retry_path = burst.end < trace.size() && (trace[burst.end].action == Action::segment_alloc ||
                                                  trace[burst.end].action == Action::oom);
  return burst;
}

std::uint64_t AllocatorReplay::empty_cache(std::vector<SegmentChange>* changes) { return release(changes); }

}  // namespace oomflight
