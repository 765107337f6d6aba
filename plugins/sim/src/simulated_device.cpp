// The simulated device: start-state reconstruction, trace replay against a capacity, and the rewind between
// loops. Release policy: with PyTorch's default settings (no max_split_size), a failed cudaMalloc makes the
// caching allocator release every cached segment that holds no live block and retry once
// (release_cached_blocks in c10/cuda/CUDACachingAllocator.cpp); the model does the same.
#include "oomflight/sim/simulated_device.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <stdexcept>

#include "oomflight/base/units.hpp"

namespace oomflight::sim {
namespace {
constexpr std::uint64_t kNoSegment = ~std::uint64_t{0};
constexpr std::size_t kLookahead = 256;  // how far after a segment_alloc to look for the alloc it serves
// Keys the model knows blocks by that the trace gave no address: a failed request asked again (3 << 61 and up) and
// the blocks hold() keeps (1 << 62 and up): above every device address and apart.
constexpr std::uint64_t kFailedRequestKeys = 3ull << 61;

// What a block of `requested` bytes counts in PyTorch's allocated bytes: the block's size, the request rounded
// up to 512 bytes (kMinBlockSize; round_size in c10/cuda/CUDACachingAllocator.cpp). A large block left unsplit
// can be larger; the trace does not say, so that is not modelled.
std::uint64_t block_bytes(std::uint64_t requested) {
  constexpr std::uint64_t kMinBlockSize = 512;
  return requested < kMinBlockSize ? kMinBlockSize : (requested + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

const std::vector<TraceEntry>& trace_of(const TorchSnapshot& s, int device) {
  if (device < 0 || static_cast<std::size_t>(device) >= s.device_traces.size()) {
    throw std::invalid_argument(fmt::format("the snapshot has no trace for device {} ({} device trace(s))", device,
                                            s.device_traces.size()));
  }
  return s.device_traces[static_cast<std::size_t>(device)];
}
}  // namespace

SimulatedDevice::SimulatedDevice(const TorchSnapshot& snapshot, std::uint64_t capacity_bytes, int device,
                                 std::optional<AllocatorSettings> modelled)
    : trace_(trace_of(snapshot, device)), capacity_(capacity_bytes), device_(device) {
  if (modelled && modelled->expandable_segments) {
    throw std::invalid_argument(
        "expandable_segments:True is not replayed on the simulated device yet (its pages are modelled by "
        "`oomflight whatif --alloc-conf expandable_segments:True`)");
  }
  // The snapshot's segments are the end state; undo the trace, newest first, to get the start state.
  const SnapshotStartState start = snapshot_start_state(snapshot, device);
  for (const auto& [addr, seg] : start.segments) segments_[addr] = Segment{seg.size, seg.stream, 0, 0, true};
  for (const auto& [addr, b] : start.blocks) {
    blocks_[addr] = Block{b.size, b.stream, kNoSegment, b.stack_id, b.block_size};
  }
  for (const auto& [addr, seg] : segments_) reserved_ += seg.size;
  auto blocks = std::move(blocks_);
  blocks_.clear();
  for (const auto& [addr, b] : blocks) take_block(addr, b.size, b.stream, b.stack_id, b.block_bytes);
  // A trace may start with more reserved than the capacity replayed: the real run kept segments cached that a
  // smaller device would have released. PyTorch's allocator releases every cached segment that holds no live
  // block before it gives up (release_cached_blocks), so the start state does the same; only live blocks that
  // cannot fit make the start impossible.
  std::uint64_t released = 0;
  if (reserved_ > capacity_) {
    for (auto& [addr, seg] : segments_) {
      if (seg.live_blocks != 0) continue;
      seg.reserved = false;
      reserved_ -= seg.size;
      released += seg.size;
    }
  }
  start_released_ = released;
  if (modelled) {
    // The model starts from the same state: what was released above is what its retry path gives back (segments
    // with no live block), and a released segment is gone, not kept to be reserved again at its recorded place.
    model_.emplace(start, trace_, *modelled, capacity_);
    // A block that predates the trace and that the model could not place where it was (with the configured rounding
    // it would overlap the next one) is not the model's: the device drops it too, or the two would count different
    // blocks for the rest of the run. Counted, as any entry the model does not follow.
    std::vector<std::uint64_t> refused;
    for (const auto& [addr, b] : blocks_) {
      if (!model_->address_of(addr)) refused.push_back(addr);
    }
    for (const auto addr : refused) drop_block(addr);
    anomalies_.start_blocks_not_modelled = refused.size();
    if (released != 0) (void)model_->empty_cache();
    std::erase_if(segments_, [](const auto& s) { return !s.second.reserved; });
  }
  start_reserved_ = peak_reserved_ = reserved_;
  start_allocated_ = peak_allocated_ = allocated_;
  start_segments_ = segments_;
  start_blocks_ = blocks_;
  if (reserved_ > capacity_) {
    throw std::invalid_argument(fmt::format(
        "device memory {} is smaller than the {} of segments holding live blocks at the trace's start ({} "
        "allocated in them; {} of cached segments already released)",
        format_bytes(capacity_), format_bytes(reserved_), format_bytes(allocated_), format_bytes(released)));
  }
}

void SimulatedDevice::emit_start_state(EventSink& sink) {
  for (const auto& [addr, seg] : segments_) {
    if (seg.reserved) sink.event(Action::segment_alloc, addr, seg.size, seg.stream, kNoStack);
  }
  std::vector<std::uint64_t> addrs;
  addrs.reserve(blocks_.size());
  for (const auto& [addr, b] : blocks_) addrs.push_back(addr);
  std::sort(addrs.begin(), addrs.end());
  for (const auto addr : addrs) {
    const Block& b = blocks_.at(addr);
    sink.event(Action::alloc, addr, b.size, b.stream, b.stack_id);
  }
  publish(sink);
}

SimulatedDevice::Segment* SimulatedDevice::segment_of(std::uint64_t addr) {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.size ? &it->second : nullptr;
}

void SimulatedDevice::take_block(std::uint64_t addr, std::uint64_t size, std::uint64_t stream, std::int32_t stack_id,
                                 std::uint64_t block_size) {
  Block b{size, stream, kNoSegment, stack_id, block_size != 0 ? block_size : block_bytes(size)};
  auto it = segments_.upper_bound(addr);
  if (it != segments_.begin() && addr < std::prev(it)->first + std::prev(it)->second.size) {
    --it;
    b.segment = it->first;
    it->second.live_bytes += size;
    ++it->second.live_blocks;
  } else {
    ++anomalies_.alloc_outside_segments;
  }
  blocks_[addr] = b;
  allocated_ += b.block_bytes;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
}

void SimulatedDevice::drop_block(std::uint64_t addr) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) {
    ++anomalies_.free_of_unknown_block;
    return;
  }
  if (auto seg = segments_.find(it->second.segment); seg != segments_.end()) {
    seg->second.live_bytes -= it->second.size;
    --seg->second.live_blocks;
  }
  allocated_ -= it->second.block_bytes;
  blocks_.erase(it);
}

void SimulatedDevice::release_unused(EventSink& sink) {
  for (auto& [addr, seg] : segments_) {
    if (!seg.reserved || seg.live_blocks != 0) continue;
    seg.reserved = false;
    reserved_ -= seg.size;
    sink.event(Action::segment_free, addr, seg.size, seg.stream, kNoStack);
  }
}

SimulatedDevice::Request SimulatedDevice::request_for_segment(std::size_t index) const {
  const TraceEntry& seg = trace_[index];
  const std::size_t end = std::min(trace_.size(), index + 1 + kLookahead);
  for (std::size_t j = index + 1; j < end; ++j) {
    const TraceEntry& e = trace_[j];
    if (e.action == Action::alloc && e.addr >= seg.addr && e.addr < seg.addr + seg.size) {
      return Request{e.size, seg.size, e.stream, e.stack_id};
    }
  }
  return Request{seg.size, seg.size, seg.stream, kNoStack};
}

OutOfMemory SimulatedDevice::out_of_memory(const Request& request, std::size_t index, EventSink& sink) {
  OutOfMemory oom;
  oom.trace_index = index;
  oom.requested_bytes = request.bytes;
  oom.segment_bytes = request.segment_bytes;
  oom.device_free_bytes = reserved_ < capacity_ ? capacity_ - reserved_ : 0;  // set_capacity may go below
  oom.reserved_bytes = reserved_;
  oom.allocated_bytes = allocated_;
  oom.message = fmt::format(
      "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. Of the "
      "allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
      format_bytes(request.segment_bytes), device_, format_bytes(capacity_), format_bytes(oom.device_free_bytes),
      format_bytes(allocated_), format_bytes(reserved_ - allocated_));
  // As PyTorch's trace: addr = the device's free bytes, size = the request, the failing allocation's frames.
  sink.event(Action::oom, oom.device_free_bytes, request.bytes, request.stream, request.stack_id);
  publish(sink);
  return oom;
}

std::optional<OutOfMemory> SimulatedDevice::reserve(std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                                                    const Request& request, std::size_t index, EventSink& sink) {
  if (reserved_ + size > capacity_) {
    release_unused(sink);
    if (reserved_ + size > capacity_) return out_of_memory(request, index, sink);
  }
  auto [it, inserted] = segments_.try_emplace(addr, Segment{size, stream, 0, 0, false});
  it->second.reserved = true;
  reserved_ += it->second.size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  // PyTorch records a segment_alloc with the frames of the allocation that needed it.
  sink.event(Action::segment_alloc, addr, it->second.size, it->second.stream, request.stack_id);
  return std::nullopt;
}

void SimulatedDevice::set_capacity(std::uint64_t capacity_bytes) {
  capacity_ = capacity_bytes;
  if (model_) model_->set_capacity(capacity_bytes);
}

void SimulatedDevice::apply(const std::vector<SegmentChange>& changes, std::int32_t stack_id, EventSink& sink) {
  for (const SegmentChange& c : changes) {
    if (c.action == Action::segment_alloc) {
      segments_[c.address] = Segment{c.size, c.stream, 0, 0, true};
      reserved_ += c.size;
      peak_reserved_ = std::max(peak_reserved_, reserved_);
      // PyTorch records a segment_alloc with the frames of the allocation that needed it.
      sink.event(Action::segment_alloc, c.address, c.size, c.stream, stack_id);
    } else {
      segments_.erase(c.address);
      reserved_ -= c.size;
      sink.event(c.action, c.address, c.size, c.stream, kNoStack);
    }
  }
}

std::optional<OutOfMemory> SimulatedDevice::replay_modelled(EventSink& sink) {
  std::vector<SegmentChange> changes;
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    const TraceEntry& e = trace_[i];
    if (pacer_ && e.time_us >= 0) pacer_(e.time_us);
    switch (e.action) {
      case Action::alloc:
      case Action::oom: {
        // An oom entry is the request the recorded allocator failed: asked again, it may fit as configured (and is
        // then never freed: the program never had it).
        // It gets a key of its own (the trace gives it no address), so that the rewind frees it with the step's
        // other blocks.
        changes.clear();
        const ModelledAllocation a =
            model_->allocate(e.size, e.stream, e.action == Action::alloc ? e.addr : kFailedRequestKeys + failed_++,
                             &changes);
        apply(changes, e.stack_id, sink);
        if (!a.address) {
          return out_of_memory(Request{e.size, a.needed != 0 ? a.needed : e.size, e.stream, e.stack_id}, i, sink);
        }
        take_block(*a.address, e.size, e.stream, e.stack_id, a.block_size);
        sink.event(Action::alloc, *a.address, e.size, e.stream, e.stack_id);
        break;
      }
      case Action::free_requested:
        if (const auto at = model_->address_of(e.addr)) {
          if (auto it = blocks_.find(*at); it != blocks_.end()) it->second.pending_free = true;
          sink.event(e.action, *at, e.size, e.stream, e.stack_id);
        }
        break;
      case Action::free_completed:
        if (const auto at = model_->free(e.addr)) {
          drop_block(*at);
          sink.event(e.action, *at, e.size, e.stream, e.stack_id);
        } else {
          ++anomalies_.free_of_unknown_block;
        }
        break;
      case Action::segment_alloc:
      case Action::segment_map:
      case Action::segment_unmap:
        break;  // the recorded allocator's decisions: the model makes its own
      case Action::segment_free: {
        const SegmentFreeBurst burst = segment_free_burst(trace_, i);
        if (!burst.retry_path) {  // the program's empty_cache()
          changes.clear();
          (void)model_->empty_cache(&changes);
          apply(changes, kNoStack, sink);
        }
        i = burst.end - 1;
        break;
      }
      default:  // snapshot: recorded as it is
        sink.event(e.action, e.addr, e.size, e.stream, e.stack_id);
        break;
    }
    publish(sink);
  }
  return std::nullopt;
}

std::optional<OutOfMemory> SimulatedDevice::rewind_modelled(EventSink& sink) {
  // The blocks the loop allocated are freed and the blocks that predate the trace are allocated again, through the
  // model: its cache stays as the loop left it, as a real allocator's does from one step to the next.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> extra;  // (model's address, trace's)
  for (const auto& [recorded, at] : model_->live()) {
    const auto b = blocks_.find(at);
    const auto s = start_blocks_.find(recorded);
    if (b != blocks_.end() && (s == start_blocks_.end() || s->second.size != b->second.size) &&
        !held_.contains(recorded)) {
      extra.emplace_back(at, recorded);
    }
  }
  std::sort(extra.begin(), extra.end());
  for (const auto& [at, recorded] : extra) {
    const Block b = blocks_.at(at);
    sink.event(Action::free_requested, at, b.size, b.stream, b.stack_id);
    (void)model_->free(recorded);
    drop_block(at);
    sink.event(Action::free_completed, at, b.size, b.stream, b.stack_id);
  }
  std::vector<SegmentChange> changes;
  std::vector<std::uint64_t> missing;
  for (const auto& [recorded, b] : start_blocks_) {
    if (!model_->address_of(recorded)) missing.push_back(recorded);
  }
  std::sort(missing.begin(), missing.end());
  for (const auto recorded : missing) {
    const Block& b = start_blocks_.at(recorded);
    changes.clear();
    const ModelledAllocation a = model_->allocate(b.size, b.stream, recorded, &changes);
    apply(changes, b.stack_id, sink);
    if (!a.address) {
      return out_of_memory(Request{b.size, a.needed != 0 ? a.needed : b.size, b.stream, b.stack_id}, trace_.size(),
                           sink);
    }
    take_block(*a.address, b.size, b.stream, b.stack_id, a.block_size);
    sink.event(Action::alloc, *a.address, b.size, b.stream, b.stack_id);
  }
  publish(sink);
  return std::nullopt;
}

std::optional<OutOfMemory> SimulatedDevice::replay(EventSink& sink) {
  if (model_) return replay_modelled(sink);
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    const TraceEntry& e = trace_[i];
    if (pacer_ && e.time_us >= 0) pacer_(e.time_us);
    switch (e.action) {
      case Action::alloc: {
        Segment* seg = segment_of(e.addr);
        if (seg && !seg->reserved) {
          // The real run kept this segment cached; the model released it under pressure: reserve it again.
          const auto base = std::prev(segments_.upper_bound(e.addr))->first;
          if (auto oom = reserve(base, seg->size, seg->stream, Request{e.size, seg->size, e.stream, e.stack_id}, i,
                                 sink)) {
            return oom;
          }
        }
        take_block(e.addr, e.size, e.stream, e.stack_id);
        sink.event(Action::alloc, e.addr, e.size, e.stream, e.stack_id);
        break;
      }
      case Action::free_completed:
        drop_block(e.addr);
        sink.event(e.action, e.addr, e.size, e.stream, e.stack_id);
        break;
      case Action::segment_alloc:
      case Action::segment_map: {
        auto it = segments_.find(e.addr);
        if (it != segments_.end() && it->second.reserved) break;  // already reserved in the model
        Request request = request_for_segment(i);
        if (e.stack_id != kNoStack) request.stack_id = e.stack_id;  // the trace's own frames for the segment
        if (auto oom = reserve(e.addr, e.size, e.stream, request, i, sink)) return oom;
        break;
      }
      case Action::segment_free:
      case Action::segment_unmap: {
        auto it = segments_.find(e.addr);
        if (it == segments_.end()) {
          ++anomalies_.free_of_unknown_segment;
          break;
        }
        if (it->second.reserved) {
          reserved_ -= it->second.size;
          sink.event(e.action, e.addr, it->second.size, e.stream, e.stack_id);
        }
        segments_.erase(it);
        break;
      }
      case Action::oom:
        // The real run failed here: one oom event, with the model's figures, as for any other failure.
        return out_of_memory(Request{e.size, e.size, e.stream, e.stack_id}, i, sink);
      case Action::free_requested:
        if (auto it = blocks_.find(e.addr); it != blocks_.end()) it->second.pending_free = true;
        sink.event(e.action, e.addr, e.size, e.stream, e.stack_id);
        break;
      default:  // snapshot: recorded as it is
        sink.event(e.action, e.addr, e.size, e.stream, e.stack_id);
        break;
    }
    publish(sink);
  }
  return std::nullopt;
}

std::optional<OutOfMemory> SimulatedDevice::hold(std::uint64_t size, std::int32_t stack_id, EventSink& sink) {
  constexpr std::uint64_t k2MiB = 2ull << 20;
  if (next_held_ == 0) {
    // Above every address the trace and the state hold, 1 GiB clear of them, on a 2 MiB boundary (with the model,
    // a key it never sees as an address: 2^62 and up).
    std::uint64_t top = 0;
    for (const auto& [addr, seg] : segments_) top = std::max(top, addr + seg.size);
    for (const TraceEntry& e : trace_) {
      if (e.action != Action::oom && e.addr < (1ull << 60) && e.size < (1ull << 44)) {
        top = std::max(top, e.addr + e.size);
      }
    }
    const std::uint64_t above = std::min<std::uint64_t>(top, 1ull << 60) + (1ull << 30);
    next_held_ = model_ ? (1ull << 62) : (above + k2MiB - 1) / k2MiB * k2MiB;
  }
  const std::uint64_t key = next_held_;
  if (model_) {
    std::vector<SegmentChange> changes;
    const ModelledAllocation a = model_->allocate(size, 0, key, &changes);
    apply(changes, stack_id, sink);
    if (!a.address) {
      return out_of_memory(Request{size, a.needed != 0 ? a.needed : size, 0, stack_id}, trace_.size(), sink);
    }
    ++next_held_;
    take_block(*a.address, size, 0, stack_id, a.block_size);
    sink.event(Action::alloc, *a.address, size, 0, stack_id);
  } else {
    const std::uint64_t segment = (std::max<std::uint64_t>(size, 1) + k2MiB - 1) / k2MiB * k2MiB;
    if (auto oom = reserve(key, segment, 0, Request{size, segment, 0, stack_id}, trace_.size(), sink)) return oom;
    next_held_ += segment;
    take_block(key, size, 0, stack_id);
    sink.event(Action::alloc, key, size, 0, stack_id);
  }
  held_.insert(key);
  publish(sink);
  return std::nullopt;
}

std::optional<OutOfMemory> SimulatedDevice::rewind(EventSink& sink) {
  if (model_) return rewind_modelled(sink);
  std::vector<std::uint64_t> extra;
  for (const auto& [addr, b] : blocks_) {
    auto s = start_blocks_.find(addr);
    if ((s == start_blocks_.end() || s->second.size != b.size) && !held_.contains(addr)) extra.push_back(addr);
  }
  std::sort(extra.begin(), extra.end());
  for (auto addr : extra) {
    const Block b = blocks_.at(addr);
    sink.event(Action::free_requested, addr, b.size, b.stream, b.stack_id);
    drop_block(addr);
    sink.event(Action::free_completed, addr, b.size, b.stream, b.stack_id);
  }
  for (auto it = segments_.begin(); it != segments_.end();) {
    if (start_segments_.count(it->first) || it->second.live_blocks != 0) {
      ++it;
      continue;
    }
    if (it->second.reserved) {
      reserved_ -= it->second.size;
      sink.event(Action::segment_free, it->first, it->second.size, it->second.stream, kNoStack);
    }
    it = segments_.erase(it);
  }
  for (const auto& [addr, seg] : start_segments_) {
    auto [it, inserted] = segments_.try_emplace(addr, Segment{seg.size, seg.stream, 0, 0, false});
    if (it->second.reserved || !seg.reserved) continue;  // reserved now, or released at the start
    if (auto oom = reserve(addr, seg.size, seg.stream, Request{seg.size, seg.size, seg.stream, kNoStack}, trace_.size(),
                           sink)) {
      return oom;
    }
  }
  std::vector<std::uint64_t> missing;
  for (const auto& [addr, b] : start_blocks_) {
    if (!blocks_.count(addr)) missing.push_back(addr);
  }
  std::sort(missing.begin(), missing.end());
  for (auto addr : missing) {
    const Block& b = start_blocks_.at(addr);
    take_block(addr, b.size, b.stream, b.stack_id, b.block_bytes);
    sink.event(Action::alloc, addr, b.size, b.stream, b.stack_id);
  }
  publish(sink);
  return std::nullopt;
}

SimulatedDevice::State SimulatedDevice::state() const {
  State st;
  for (const auto& [addr, seg] : segments_) {
    if (seg.reserved) st.segments.push_back(State::Segment{addr, seg.size, seg.stream});
  }
  for (const auto& [addr, b] : blocks_) {
    const auto seg = segments_.find(b.segment);
    if (seg == segments_.end() || !seg->second.reserved) continue;  // outside every reserved segment: no state
    st.blocks.push_back(State::Block{addr, b.size, b.block_bytes, b.stack_id, b.pending_free});
  }
  std::sort(st.blocks.begin(), st.blocks.end(),
            [](const State::Block& x, const State::Block& y) { return x.address < y.address; });
  return st;
}

MemoryStats SimulatedDevice::stats() const {
  return MemoryStats{allocated_, reserved_, peak_allocated_, peak_reserved_, capacity_, capacity_ - reserved_};
}

void SimulatedDevice::publish(EventSink& sink) { sink.memory(stats()); }

}  // namespace oomflight::sim
