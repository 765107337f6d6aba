#include "oomflight/analysis/allocator_model.hpp"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <iterator>
#include <set>

#include <fmt/format.h>

namespace oomflight {
namespace {

// c10/cuda/CUDACachingAllocator.cpp's constants (namespace Native, top of the file).
constexpr std::uint64_t kMinBlockSize = 512;            // every block is a multiple of this
constexpr std::uint64_t kSmallSize = 1ull << 20;        // the largest block of the small pool
constexpr std::uint64_t kSmallBuffer = 2ull << 20;      // a small pool's segment
constexpr std::uint64_t kLargeBuffer = 20ull << 20;     // a large pool's segment for blocks below kMinLargeAlloc
constexpr std::uint64_t kMinLargeAlloc = 10ull << 20;   // from here a segment is the block rounded to kRoundLarge
constexpr std::uint64_t kRoundLarge = 2ull << 20;

std::uint64_t read_size(const std::string& key, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') {
    throw SnapshotError(fmt::format("allocator_settings: '{}' is {}, not a number", key, text));
  }
  return v <= 0 ? UINT64_MAX : static_cast<std::uint64_t>(v);  // torch writes -1 (or 0) for "no limit"
}

}  // namespace

AllocatorSettings allocator_settings_of(const TorchSnapshot& snapshot) {
  AllocatorSettings s;
  for (const auto& [key, value] : snapshot.allocator_settings) {
    if (key == "max_split_size") {
      s.max_split_size = read_size(key, value);
    } else if (key == "expandable_segments") {
      s.expandable_segments = value == "True";
    } else if (key == "garbage_collection_threshold") {
      s.garbage_collection_threshold = std::strtod(value.c_str(), nullptr);
    } else if (key == "roundup_power2_divisions" && value.size() > 2 && value.front() == '{') {
      // {'1': 0, '2': 0, ..., '32768': 0}: the intervals in MiB, in order (at most 200 characters are kept, which
      // holds the 16 of them).
      std::size_t i = 0, pos = 1;
      while (i < s.roundup_power2_divisions.size()) {
        const std::size_t colon = value.find(':', pos);
        if (colon == std::string::npos) break;
        s.roundup_power2_divisions[i++] = std::strtoull(value.c_str() + colon + 1, nullptr, 10);
        pos = colon + 1;
      }
    }
  }
  return s;
}

std::vector<std::pair<std::string, std::string>> allocator_settings_entries(const AllocatorSettings& settings) {
  std::string divisions = "{";
  for (std::size_t i = 0; i < settings.roundup_power2_divisions.size(); ++i) {
    divisions += fmt::format("{}'{}': {}", i == 0 ? "" : ", ", 1ull << i, settings.roundup_power2_divisions[i]);
  }
  divisions += "}";
  return {
      {"max_split_size", settings.max_split_size == UINT64_MAX ? std::string("-1")
                                                               : std::to_string(settings.max_split_size)},
      {"garbage_collection_threshold", fmt::format("{}", settings.garbage_collection_threshold)},
      {"expandable_segments", settings.expandable_segments ? "True" : "False"},
      {"roundup_power2_divisions", divisions},
  };
}

bool AllocatorModel::FreeKey::operator<(const FreeKey& o) const {
  if (stream != o.stream) return stream < o.stream;
  if (size != o.size) return size < o.size;
  return address < o.address;
}

AllocatorModel::AllocatorModel(AllocatorSettings settings) : settings_(std::move(settings)) {}

std::uint64_t AllocatorModel::round_size(std::uint64_t size) const {
  // round_size(), with roundup_power2_divisions() choosing the interval: [1 MiB, 2 MiB) and below is the first,
  // each power of two MiB the next, 64 GiB and above the last.
  if (size < kMinBlockSize) return kMinBlockSize;
  const int log_size = std::bit_width(size) - 1;
  const int interval_start = 20;  // log2(1 MiB)
  std::size_t index = log_size > interval_start ? static_cast<std::size_t>(log_size - interval_start) : 0;
  index = std::min(index, settings_.roundup_power2_divisions.size() - 1);
  const std::uint64_t divisions = settings_.roundup_power2_divisions.empty() ? 0
                                                                            : settings_.roundup_power2_divisions[index];
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    // roundup_power2_next_division(): the space between two powers of two in `divisions` equal steps.
    if (std::has_single_bit(size)) return size;
    const std::uint64_t floor = std::bit_floor(size);
    const std::uint64_t step = floor >> (std::bit_width(divisions) - 1);
    if (step == 0) return floor << 1;
    const std::uint64_t below = size & ~(step - 1);
    return below == size ? size : below + step;
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

bool AllocatorModel::small_pool(std::uint64_t rounded) { return rounded <= kSmallSize; }

std::uint64_t AllocatorModel::segment_size(std::uint64_t rounded) {
  // get_allocation_size().
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}

std::optional<std::uint64_t> AllocatorModel::place(std::uint64_t size, std::uint64_t stream) const {
  // get_free_block(): the smallest free block of the request's pool and stream that holds it, lowest address first.
  const std::uint64_t rounded = round_size(size);
  const auto& pool = small_pool(rounded) ? free_small_ : free_large_;
  const auto it = pool.lower_bound(FreeKey{stream, rounded, 0});
  if (it == pool.end() || it->first.stream != stream) return std::nullopt;
  const std::uint64_t max_split = settings_.max_split_size;
  // An oversize block (max_split_size and above) never serves a request below it, and serves a larger one only
  // when it wastes less than kLargeBuffer.
  if (rounded < max_split && it->first.size >= max_split) return std::nullopt;
  if (rounded >= max_split && it->first.size >= rounded + kLargeBuffer) return std::nullopt;
  return it->second;
}

void AllocatorModel::insert_free(std::uint64_t address) {
  const Block& b = blocks_.at(address);
  (b.small ? free_small_ : free_large_).emplace(FreeKey{b.stream, b.size, address}, address);
}

void AllocatorModel::erase_free(std::uint64_t address) {
  const Block& b = blocks_.at(address);
  (b.small ? free_small_ : free_large_).erase(FreeKey{b.stream, b.size, address});
}

bool AllocatorModel::allocate(std::uint64_t address, std::uint64_t size, std::uint64_t stream) {
  const auto it = blocks_.find(address);
  if (it == blocks_.end() || it->second.allocated || !it->second.mapped || it->second.stream != stream) return false;
  const std::uint64_t rounded = round_size(size);
  Block& b = it->second;
  if (b.size < rounded) return false;
  erase_free(address);
  // should_split(): the small pool splits off any rest of at least kMinBlockSize; the large pool a rest above
  // kSmallSize, and never a block for a request of max_split_size or more. The allocation takes the front.
  const std::uint64_t rest = b.size - rounded;
  // With expandable segments the 512 B rule holds in the large pool too.
  const bool split = b.small || b.expandable ? rest >= kMinBlockSize
                                             : (rounded < settings_.max_split_size && rest > kSmallSize);
  if (split) {
    Block remainder = b;
    remainder.size = rest;
    b.size = rounded;
    blocks_.emplace(address + rounded, remainder);
    insert_free(address + rounded);
  }
  Block& taken = blocks_.at(address);
  taken.allocated = true;
  allocated_ += taken.size;
  return true;
}

void AllocatorModel::add_segment(std::uint64_t address, std::uint64_t size, std::uint64_t stream, bool small) {
  segments_[address] = size;
  reserved_ += size;
  blocks_[address] = Block{size, stream, address, small, false};
  insert_free(address);
}

bool AllocatorModel::free(std::uint64_t address) {
  // free_block(): the block merges with a free neighbour on either side within its segment (try_merge_blocks).
  auto it = blocks_.find(address);
  if (it == blocks_.end() || !it->second.allocated) return false;
  it->second.allocated = false;
  allocated_ -= it->second.size;
  const auto next = std::next(it);
  // try_merge_blocks(): only with a neighbour in the same state (an unmapped range is not a free block).
  if (next != blocks_.end() && !next->second.allocated && next->second.mapped &&
      next->second.segment == it->second.segment) {
    erase_free(next->first);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    const auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.mapped && prev->second.segment == it->second.segment) {
      erase_free(prev->first);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  insert_free(it->first);
  return true;
}

bool AllocatorModel::release_segment(std::uint64_t address) {
  const auto seg = segments_.find(address);
  if (seg == segments_.end()) return false;
  const auto b = blocks_.find(address);
  if (b == blocks_.end() || b->second.allocated || b->second.size != seg->second) return false;  // not all free
  erase_free(address);
  blocks_.erase(b);
  reserved_ -= seg->second;
  segments_.erase(seg);
  return true;
}

bool AllocatorModel::holds(std::uint64_t address) const {
  auto it = segments_.upper_bound(address);
  if (it != segments_.begin() && address < std::prev(it)->first + std::prev(it)->second) return true;
  auto e = expandable_.upper_bound(address);
  return e != expandable_.begin() && address < std::prev(e)->first + std::prev(e)->second.size;
}

std::uint64_t AllocatorModel::block_size(std::uint64_t address) const {
  const auto b = blocks_.find(address);
  return b == blocks_.end() ? 0 : b->second.size;
}

bool AllocatorModel::release_available_cached_blocks(std::uint64_t rounded, std::uint64_t stream,
                                                     std::uint64_t& released_bytes,
                                                     std::vector<SegmentChange>* released) {
  // torch 2.11, release_available_cached_blocks(): a no-op without max_split_size; the search key is the request,
  // at least max_split_size, in the large pool's (stream, size, address) order.
  if (settings_.max_split_size == UINT64_MAX) return false;
  // It searches the request's own pool: a small request's holds no oversize block (they are all above 20 MiB).
  if (small_pool(rounded)) return false;
  const std::uint64_t key = std::max(rounded, settings_.max_split_size);
  const auto give_back = [&](std::uint64_t address) {
    const auto seg = segments_.find(address);
    const auto b = blocks_.find(address);
    if (seg == segments_.end() || b == blocks_.end() || b->second.expandable || b->second.size != seg->second) {
      return std::uint64_t{0};  // not a whole segment of its own (never, for an oversize block)
    }
    const std::uint64_t size = seg->second;
    if (released) released->push_back(SegmentChange{Action::segment_free, address, size, b->second.stream});
    (void)release_segment(address);
    released_bytes += size;
    return size;
  };
  auto it = free_large_.lower_bound(FreeKey{stream, key, 0});
  if (it != free_large_.end() && it->first.stream == stream) {
    (void)give_back(it->second);
    return true;
  }
  // No one block is large enough: the oversize ones, from the largest of this stream down, until as many bytes.
  if (it == free_large_.begin()) return false;
  --it;
  std::uint64_t total = 0;
  while (total < key && it->first.stream == stream && it->first.size >= settings_.max_split_size) {
    const auto cur = it;
    const bool first = cur == free_large_.begin();
    if (!first) --it;
    total += give_back(cur->second);  // erases cur from the pool; `it` stays valid
    if (first) break;
  }
  return total >= key;
}

std::uint64_t AllocatorModel::release_free_segments(std::vector<SegmentChange>* released_segments) {
  std::uint64_t released = 0;
  for (auto seg = segments_.begin(); seg != segments_.end();) {
    const auto b = blocks_.find(seg->first);
    if (b == blocks_.end() || b->second.allocated || b->second.size != seg->second) {
      ++seg;
      continue;
    }
    if (released_segments) {
      released_segments->push_back(SegmentChange{Action::segment_free, seg->first, seg->second, b->second.stream});
    }
    erase_free(seg->first);
    blocks_.erase(b);
    reserved_ -= seg->second;
    released += seg->second;
    seg = segments_.erase(seg);
  }
  return released + unmap_free_pages();
}

std::uint64_t AllocatorModel::unmap_free_pages() {
  // release_blocks() of an expandable segment's free blocks (unmap_block): the pages wholly inside a free block are
  // unmapped; the free bytes before and after them stay free, mapped.
  std::uint64_t released = 0;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if (!it->second.expandable || !it->second.mapped || it->second.allocated) {
      ++it;
      continue;
    }
    const std::uint64_t address = it->first;
    const Block whole = it->second;
    ExpandableSegment& seg = expandable_.at(whole.segment);
    const std::uint64_t lo = whole.segment + (address - whole.segment + seg.page - 1) / seg.page * seg.page;
    const std::uint64_t hi = whole.segment + (address + whole.size - whole.segment) / seg.page * seg.page;
    if (hi <= lo) {
      ++it;
      continue;
    }
    Block hole = whole;
    hole.mapped = false;
    cut_free_block(address, lo, hi, hole);
    unmapped_.insert(lo);
    reserved_ -= hi - lo;
    seg.mapped -= hi - lo;
    released += hi - lo;
    merge_unmapped(lo);
    it = blocks_.lower_bound(hi);
  }
  return released;
}

void AllocatorModel::merge_unmapped(std::uint64_t address) {
  auto it = blocks_.find(address);
  if (it == blocks_.end()) return;
  const auto next = std::next(it);
  if (next != blocks_.end() && !next->second.mapped && next->second.segment == it->second.segment) {
    it->second.size += next->second.size;
    unmapped_.erase(next->first);
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    const auto prev = std::prev(it);
    if (!prev->second.mapped && prev->second.segment == it->second.segment) {
      prev->second.size += it->second.size;
      unmapped_.erase(it->first);
      blocks_.erase(it);
    }
  }
}

AllocatorModel::Expansion AllocatorModel::expand(std::uint64_t size, std::uint64_t stream, std::uint64_t capacity) {
  Expansion out;
  const std::uint64_t rounded = round_size(size);
  const bool small = small_pool(rounded);
  const auto [key, made] = expandable_of_.try_emplace({stream, small}, next_expandable_base_);
  const std::uint64_t base = key->second;
  if (made) {
    // Address space for more than any device holds (torch reserves 9/8 of the device's memory): 2 TiB of 2 MiB
    // pages for the small pool, 20 TiB of 20 MiB pages for the large one, each segment 64 TiB from the last.
    const std::uint64_t page = small ? kSmallBuffer : kLargeBuffer;
    next_expandable_base_ += 1ull << 46;
    expandable_[base] = ExpandableSegment{page << 20, page, 0, small};
    blocks_[base] = Block{page << 20, stream, base, small, false, false, true};
    unmapped_.insert(base);
  }
  ExpandableSegment& seg = expandable_.at(base);
  const std::uint64_t end = base + seg.size;
  const auto available = [&](std::map<std::uint64_t, Block>::iterator it) {
    return it != blocks_.end() && it->first < end && !it->second.allocated;
  };
  // find_expandable_block(): the lowest unmapped range (with the free block before it, if any) from which free and
  // unmapped blocks hold the request.
  // After 64 ranges tried, the last one (the segment's unmapped end, which always holds it): a history torch would
  // scan further costs the model no more than that per request, so that any file replays in near-linear time.
  std::optional<std::uint64_t> candidate;
  std::size_t tried = 0;
  for (auto u = unmapped_.lower_bound(base); u != unmapped_.end() && *u < end && !candidate; ++u) {
    if (++tried > 64) {
      auto last = unmapped_.lower_bound(end);
      --last;  // the segment's own: *u < end and u is in it
      u = last;
    }
    auto c = blocks_.find(*u);
    if (c != blocks_.begin()) {
      const auto prev = std::prev(c);
      if (prev->first >= base && !prev->second.allocated && prev->second.mapped) c = prev;
    }
    std::uint64_t bytes = 0;
    for (auto it = c; bytes < rounded && available(it); ++it) bytes += it->second.size;
    if (bytes >= rounded) candidate = c->first;
  }
  if (!candidate) return out;
  // The pages it maps: from the candidate on, each unmapped range as far as the request still needs, in pages
  // (ExpandableSegment::map rounds the range out to pages).
  const auto pages_for = [&](std::uint64_t have, const Block& b) {
    return std::min(b.size, (rounded - have + seg.page - 1) / seg.page * seg.page);
  };
  std::uint64_t have = 0;
  for (auto it = blocks_.find(*candidate); have < rounded && available(it); ++it) {
    const std::uint64_t more = it->second.mapped ? it->second.size : pages_for(have, it->second);
    if (!it->second.mapped) out.mapped += more;
    have += more;
  }
  if (capacity != 0 && reserved_ + out.mapped > capacity) return out;
  // Map them, then merge everything from the candidate to the last block mapped (and a free block right after it)
  // into one free block.
  have = 0;
  auto it = blocks_.find(*candidate);
  while (have < rounded && available(it)) {
    Block& b = it->second;
    if (b.mapped) {
      erase_free(it->first);
      have += b.size;
      ++it;
      continue;
    }
    const std::uint64_t more = pages_for(have, b);
    unmapped_.erase(it->first);
    if (more < b.size) {
      Block rest = b;
      rest.size = b.size - more;
      blocks_.emplace(it->first + more, rest);
      unmapped_.insert(it->first + more);
      b.size = more;
    }
    b.mapped = true;
    reserved_ += more;
    seg.mapped += more;
    have += more;
    ++it;
  }
  if (available(it) && it->second.mapped) {
    erase_free(it->first);
    ++it;
  }
  auto first = blocks_.find(*candidate);
  for (auto m = std::next(first); m != it;) {
    first->second.size += m->second.size;
    m = blocks_.erase(m);
  }
  insert_free(first->first);
  out.address = first->first;
  return out;
}

PoolFigures AllocatorModel::pool_figures(bool small) const {
  PoolFigures p;
  for (const auto& [base, seg] : expandable_) {
    if (seg.small == small) p.reserved += seg.mapped;
  }
  for (const auto& [address, b] : blocks_) {
    if (b.small != small) continue;
    if (address == b.segment && !b.expandable) {
      const auto seg = segments_.find(address);
      if (seg != segments_.end()) p.reserved += seg->second;
    }
    if (b.allocated || !b.mapped) continue;
    p.free += b.size;
    ++p.free_blocks;
    p.largest_free = std::max(p.largest_free, b.size);
  }
  return p;
}

void AllocatorModel::cut_free_block(std::uint64_t start, std::uint64_t lo, std::uint64_t hi, Block middle) {
  const Block whole = blocks_.at(start);
  erase_free(start);
  blocks_.erase(start);
  if (lo > start) {
    Block before = whole;
    before.size = lo - start;
    blocks_.emplace(start, before);
    insert_free(start);
  }
  if (start + whole.size > hi) {
    Block after = whole;
    after.size = start + whole.size - hi;
    blocks_.emplace(hi, after);
    insert_free(hi);
  }
  middle.size = hi - lo;
  blocks_.emplace(lo, middle);
}

bool AllocatorModel::restore_allocated(std::uint64_t address, std::uint64_t block_size) {
  // The free block that holds it is cut in up to three: before, the block, after (each rest stays free).
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) return false;
  --it;
  Block taken = it->second;
  if (taken.allocated || !taken.mapped || address + block_size > it->first + taken.size) return false;
  taken.allocated = true;
  cut_free_block(it->first, address, address + block_size, taken);
  allocated_ += block_size;
  return true;
}

AllocatorFidelity replay_fidelity(const TorchSnapshot& snapshot, int device, const AllocatorSettings& settings,
                                  const std::set<std::uint64_t>& made_up_segments) {
  AllocatorFidelity f;
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return f;
  const std::vector<TraceEntry>& trace = snapshot.device_traces[static_cast<std::size_t>(device)];
  AllocatorModel model(settings);
  const auto differ = [&](std::size_t i, const std::string& why) {
    if (f.first_difference.empty()) {
      f.first_difference = fmt::format("entry {} ({} of {} B at {:#x}): {}", i, action_name(trace[i].action),
                                       trace[i].size, trace[i].addr, why);
    }
  };
  const SnapshotStartState start = snapshot_start_state(snapshot, device);
  for (const auto& [address, segment] : start.segments) {
    if (made_up_segments.count(address) != 0) continue;
    if (segment.is_expandable) f.expandable = true;
    model.add_segment(address, segment.size, segment.stream, segment.size == kSmallBuffer);
  }
  for (const auto& [address, block] : start.blocks) {
    (void)model.restore_allocated(address, block.block_size != 0 ? block.block_size : model.round_size(block.size));
  }
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceEntry& e = trace[i];
    switch (e.action) {
      case Action::segment_alloc: {
        ++f.segment_events;
        // The allocation that asked for it is the next alloc of its stream (malloc records the segment first).
        std::size_t j = i + 1;
        while (j < trace.size() && !(trace[j].action == Action::alloc && trace[j].stream == e.stream)) ++j;
        if (j == trace.size()) {
          differ(i, "no allocation follows it");
          model.add_segment(e.addr, e.size, e.stream, e.size == kSmallBuffer);
          break;
        }
        const std::uint64_t rounded = model.round_size(trace[j].size);
        const auto cached = model.place(trace[j].size, e.stream);
        const std::uint64_t wanted = AllocatorModel::segment_size(rounded);
        if (cached) {
          differ(i, fmt::format("the model would place the next allocation at {:#x}, a cached block", *cached));
        } else if (wanted != e.size) {
          differ(i, fmt::format("the model asks for a segment of {} B", wanted));
        } else {
          ++f.segment_events_matched;
        }
        model.add_segment(e.addr, e.size, e.stream, AllocatorModel::small_pool(rounded));
        break;
      }
      case Action::alloc: {
        if (!model.holds(e.addr)) {
          ++f.allocations_outside_segments;
          break;
        }
        ++f.allocations;
        const auto placed = model.place(e.size, e.stream);
        if (placed && *placed == e.addr && model.allocate(e.addr, e.size, e.stream)) {
          ++f.allocations_matched;
          break;
        }
        differ(i, placed ? fmt::format("the model places it at {:#x}", *placed)
                         : std::string("the model finds no cached block and asks for a segment"));
        // Follow the trace: take the block there (cut out of the free block that holds it, if need be).
        if (!model.allocate(e.addr, e.size, e.stream)) (void)model.restore_allocated(e.addr, model.round_size(e.size));
        break;
      }
      case Action::free_completed:
        (void)model.free(e.addr);
        break;
      case Action::segment_free:
        ++f.segment_events;
        if (model.release_segment(e.addr)) {
          ++f.segment_events_matched;
        } else {
          differ(i, "the model holds no free segment there");
        }
        break;
      default:
        break;
    }
  }
  return f;
}

}  // namespace oomflight
