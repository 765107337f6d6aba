// An archive's rank as a PyTorch snapshot: the end state rebuilt from the recorded history, then pickled.
#include "oomflight/export/memory_viz.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <vector>

#include "oomflight/base/base64.hpp"
#include "oomflight/format/pickle.hpp"
#include "oomflight/format/torch_snapshot_writer.hpp"
#include "oomflight/record/context_log.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {
namespace {

// PyTorch's caching allocator hands out blocks in multiples of 512 bytes (kMinBlockSize, round_size in
// c10/cuda/CUDACachingAllocator.cpp).
constexpr std::uint64_t kMinBlockSize = 512;

// A block's size for `requested` bytes: rounded up to kMinBlockSize (saturating: a damaged file's sizes are
// arbitrary).
std::uint64_t block_bytes(std::uint64_t requested) {
  if (requested < kMinBlockSize) return kMinBlockSize;
  if (requested > ~std::uint64_t{0} - kMinBlockSize) return requested;
  return (requested + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

struct LiveBlock {
  std::uint64_t requested = 0;
  std::uint64_t stream = 0;
  std::int32_t stack_id = kNoStack;
  bool pending_free = false;
};

struct LiveSegment {
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  bool expandable = false;
};

// The archive's frames, for the writer.
class ArchiveFrames final : public SnapshotFrameSource {
 public:
  explicit ArchiveFrames(const Archive& a) : a_(a) {}
  std::span<const std::uint32_t> stack(std::int32_t id) const override {
    if (id < 0 || static_cast<std::size_t>(id) >= a_.stacks.size()) return {};
    const StackRow& s = a_.stacks[static_cast<std::size_t>(id)];
    return std::span<const std::uint32_t>(a_.stack_frames).subspan(s.frame_offset, s.frame_count);
  }
  FrameRef frame(std::uint32_t id) const override {
    const FrameRow& f = a_.frames.at(id);
    return FrameRef{a_.string(f.function), a_.string(f.file), f.line};
  }

 private:
  const Archive& a_;
};

// PyTorch's pool for a segment the source did not type: the small pool's segments are exactly kSmallBuffer (2 MiB)
// and never expandable; a large-pool segment is 20 MiB (kLargeBuffer) or a request of 10 MiB and more rounded up
// to 2 MiB, so never 2 MiB (c10/cuda/CUDACachingAllocator.cpp, get_allocation_size).
const char* segment_type_name(SegmentType type, std::uint64_t total_size, bool expandable) {
  if (type == SegmentType::small) return "small";
  if (type == SegmentType::large) return "large";
  return total_size == (std::uint64_t{2} << 20) && !expandable ? "small" : "large";
}

// What the rank's source snapshot carried besides segments and traces (/context kinds snapshot_field and
// snapshot_layout), to be written back as it was.
void take_source_context(const Archive& a, const RankRow& row, TorchSnapshot& snap, MemoryVizNotes& n,
                         std::size_t& device_traces) {
  const auto split = [](std::string_view list) {
    std::vector<std::string> keys;
    while (!list.empty()) {
      const auto comma = list.find(',');
      keys.emplace_back(list.substr(0, comma));
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
    return keys;
  };
  // A pickled value in base64; a damaged file's is left out (and counted), not a failed export.
  const auto pickled_value = [&n](std::string_view text) {
    auto pickled = base64_decode(text);
    try {
      if (pickled) (void)pickle::Document::parse(*pickled);
    } catch (const std::exception&) {
      pickled.reset();
    }
    if (!pickled) ++n.unreadable_fields;
    return pickled;
  };
  for (const ContextRow& c : a.context_of(row.rank)) {
    const auto kind = static_cast<ContextEntry::Kind>(c.kind);
    const std::string_view what = a.string(c.key);
    if (kind == ContextEntry::Kind::snapshot_field) {
      if (auto pickled = pickled_value(a.string(c.value))) snap.fields.emplace_back(what, std::move(*pickled));
    } else if (kind == ContextEntry::Kind::snapshot_layout && what.starts_with("trace.")) {
      if (auto pickled = pickled_value(a.string(c.value))) snap.trace_constants.emplace_back(what.substr(6), std::move(*pickled));
    } else if (kind == ContextEntry::Kind::snapshot_layout && what == "device_traces") {
      // The source's number of device traces (at most kMaxDevices: a damaged file's number is not a size).
      const std::string_view v = a.string(c.value);
      std::size_t count = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), count);
      if (ec == std::errc() && end == v.data() + v.size() && count <= static_cast<std::size_t>(kMaxDevices)) {
        device_traces = count;
      }
    } else if (kind == ContextEntry::Kind::snapshot_layout) {
      auto keys = split(a.string(c.value));
      if (what == "trace") snap.omitted_trace_keys = std::move(keys);
      if (what == "segment") snap.omitted_segment_keys = std::move(keys);
      if (what == "block") snap.omitted_block_keys = std::move(keys);
    }
  }
  snap.has_time_us = std::find(snap.omitted_trace_keys.begin(), snap.omitted_trace_keys.end(), "time_us") ==
                     snap.omitted_trace_keys.end();
}

std::int64_t utc_us(const RankRow& r, std::int64_t t_ns) {
  // Wrapping arithmetic: hostile anchors must not be undefined behaviour.
  const auto utc = static_cast<std::uint64_t>(t_ns) - static_cast<std::uint64_t>(r.anchor_monotonic_ns) +
                   static_cast<std::uint64_t>(r.anchor_realtime_ns);
  const auto v = static_cast<std::int64_t>(utc) / 1000;
  return v < 0 ? 0 : v;
}

}  // namespace

TorchSnapshot memory_viz_snapshot(const Archive& a, const RankRow& row, MemoryVizNotes* notes) {
  MemoryVizNotes local;
  MemoryVizNotes& n = notes ? *notes : local;
  n = MemoryVizNotes{};
  TorchSnapshot snap;
  std::size_t source_device_traces = 0;  // the source's number of device traces, when it said
  take_source_context(a, row, snap, n, source_device_traces);
  // device -> address -> state
  std::map<int, std::map<std::uint64_t, LiveSegment>> segments;
  std::map<int, std::map<std::uint64_t, LiveBlock>> blocks;
  for (const Event& e : a.events_of(row)) {
    if (e.action == Action::step) continue;
    const int device = e.device < 0 ? 0 : e.device;
    if (static_cast<std::size_t>(device) >= snap.device_traces.size()) snap.device_traces.resize(device + 1);
    // State that predates the history is the end state's (below), not a trace entry: PyTorch's trace starts
    // with the first event it recorded, and the viewer shows such blocks as there from the start.
    if ((e.flags & kEventPredatesHistory) == 0) {
      TraceEntry t;
      t.action = e.action;
      t.addr = e.addr;
      t.size = e.size;
      t.stream = e.stream;
      t.time_us = snap.has_time_us ? utc_us(row, e.t_ns) : -1;
      t.stack_id = e.stack_id;
      snap.device_traces[static_cast<std::size_t>(device)].push_back(t);
      ++n.events;
    }
    auto& segs = segments[device];
    auto& live = blocks[device];
    switch (e.action) {
      // A damaged file's sizes may run past 2^64: a segment ends at the top of the address space at most.
      case Action::segment_alloc: segs[e.addr] = LiveSegment{std::min(e.size, ~e.addr), e.stream, false}; break;
      case Action::segment_map: segs[e.addr] = LiveSegment{std::min(e.size, ~e.addr), e.stream, true}; break;
      case Action::segment_free:
      case Action::segment_unmap: segs.erase(e.addr); break;
      case Action::alloc: live[e.addr] = LiveBlock{e.size, e.stream, e.stack_id, false}; break;
      case Action::free_requested:
        if (auto it = live.find(e.addr); it != live.end()) it->second.pending_free = true;
        break;
      case Action::free_completed:
        if (live.erase(e.addr) == 0) ++n.frees_of_unknown_blocks;
        break;
      default: break;
    }
  }
  for (auto& [device, segs] : segments) {
    (void)segs;
    if (static_cast<std::size_t>(device) >= snap.device_traces.size()) snap.device_traces.resize(device + 1);
  }
  for (auto& [device, live] : blocks) {
    auto& segs = segments[device];
    // A live block outside every known segment: its segment_alloc was pushed out of the ring. It gets a segment
    // of its own so that the state stays consistent, and the caller is told.
    for (const auto& [addr, b] : live) {
      auto it = segs.upper_bound(addr);
      const bool inside = it != segs.begin() && addr < std::prev(it)->first + std::prev(it)->second.size;
      if (!inside) {
        segs[addr] = LiveSegment{std::min(block_bytes(b.requested), ~addr), b.stream, false};
        ++n.blocks_outside_segments;
        n.made_up_segments.emplace_back(device, addr);
      }
    }
  }
  for (const auto& [device, segs] : segments) {
    const auto& live = blocks[device];
    for (auto s = segs.begin(); s != segs.end(); ++s) {
      SnapshotSegment out;
      out.device = device;
      out.address = s->first;
      out.total_size = s->second.size;
      out.stream = s->second.stream;
      out.is_expandable = s->second.expandable;
      out.segment_type = segment_type_name(SegmentType::unknown, s->second.size, s->second.expandable);
      const std::uint64_t end = s->first + s->second.size;
      std::uint64_t at = s->first;
      for (auto b = live.lower_bound(s->first); b != live.end() && b->first < end; ++b) {
        if (b->first < at) continue;  // overlaps the previous block: inconsistent history, keep the first
        if (b->first > at) out.blocks.push_back(SnapshotBlock{at, b->first - at, 0, "inactive", kNoStack});
        const auto next = std::next(b);
        const std::uint64_t limit = next != live.end() && next->first < end ? next->first : end;
        const std::uint64_t size = std::min(block_bytes(b->second.requested), limit - b->first);
        if (size == 0) continue;
        out.blocks.push_back(SnapshotBlock{b->first, size, std::min(b->second.requested, size),
                                           b->second.pending_free ? "active_pending_free" : "active_allocated",
                                           b->second.stack_id});
        at = b->first + size;
      }
      if (at < end) out.blocks.push_back(SnapshotBlock{at, end - at, 0, "inactive", kNoStack});
      out.allocated_size = 0;
      for (const auto& b : out.blocks) out.allocated_size += b.state == "active_allocated" ? b.size : 0;
      snap.segments.push_back(std::move(out));
    }
  }
  // A source that gave the allocator's state at the freeze (an import) is taken as it is: PyTorch's own block
  // sizes and every block, not a rebuild from the history.
  if (const auto segments = a.state_segments_of(row.rank); !segments.empty()) {
    // Blocks by address once; each segment takes its range (a damaged file's rows must not make this quadratic).
    std::vector<StateBlockRow> blocks(a.state_blocks_of(row.rank).begin(), a.state_blocks_of(row.rank).end());
    std::sort(blocks.begin(), blocks.end(),
              [](const StateBlockRow& x, const StateBlockRow& y) { return x.address < y.address; });
    static constexpr const char* kStates[] = {"active_allocated", "active_pending_free", "inactive"};
    snap.segments.clear();
    n.blocks_outside_segments = 0;
    n.made_up_segments.clear();
    for (const StateSegmentRow& s : segments) {
      SnapshotSegment out;
      out.device = s.device;
      out.address = s.address;
      out.total_size = s.total_size;
      out.stream = s.stream;
      out.is_expandable = s.is_expandable != 0;
      out.segment_type = segment_type_name(s.segment_type, s.total_size, out.is_expandable);
      out.segment_pool_id[0] = s.segment_pool_id[0];
      out.segment_pool_id[1] = s.segment_pool_id[1];
      out.stack_id = s.stack_id;
      const std::uint64_t end = s.address + std::min(s.total_size, ~s.address);
      auto b = std::lower_bound(blocks.begin(), blocks.end(), s.address,
                                [](const StateBlockRow& x, std::uint64_t addr) { return x.address < addr; });
      // A source may give live blocks only (the replay does): gaps become inactive blocks so that blocks tile
      // the segment, and a block that overlaps the one before it or runs past the segment's end is cut.
      std::uint64_t at = s.address;
      for (; b != blocks.end() && b->address < end; ++b) {
        if (b->address < at) continue;
        if (b->address > at) out.blocks.push_back(SnapshotBlock{at, b->address - at, 0, "inactive", kNoStack});
        const auto state = static_cast<std::size_t>(b->state) < std::size(kStates) ? kStates[static_cast<int>(b->state)]
                                                                                   : "inactive";
        const std::uint64_t size = std::min(b->size, end - b->address);
        if (size == 0) continue;
        out.blocks.push_back(SnapshotBlock{b->address, size, b->requested_size, state, b->stack_id});
        out.allocated_size += b->state == BlockState::active_allocated ? size : 0;
        at = b->address + size;
      }
      if (at < end) out.blocks.push_back(SnapshotBlock{at, end - at, 0, "inactive", kNoStack});
      snap.segments.push_back(std::move(out));
    }
  }
  if (snap.device_traces.size() < source_device_traces) snap.device_traces.resize(source_device_traces);
  if (snap.device_traces.empty()) snap.device_traces.resize(1);
  n.segments = snap.segments.size();
  return snap;
}

std::string render_memory_viz(const Archive& a, const RankRow& row, MemoryVizNotes* notes) {
  const TorchSnapshot snap = memory_viz_snapshot(a, row, notes);
  return write_torch_snapshot(snap, ArchiveFrames(a));
}

}  // namespace oomflight
