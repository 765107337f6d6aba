// One rank's rows with global ids: the rebasing that lets every rank write its own rows of shared datasets.
#include "archive_rows.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace oomflight::format_detail {

const char* table_name(Table t) {
  static constexpr std::array<const char*, kTables> names = {
      dataset::ranks,   dataset::events,      dataset::stacks,  dataset::stack_frames,   dataset::frames,
      dataset::strings, dataset::string_data, dataset::batches, dataset::context,        dataset::state_segments,
      dataset::state_blocks, dataset::collectives, dataset::communicators};
  return names[static_cast<std::size_t>(t)];
}

std::size_t row_bytes(Table t) {
  static constexpr std::array<std::size_t, kTables> sizes = {
      sizeof(RankRow),   sizeof(Event),       sizeof(StackRow), sizeof(std::uint32_t),   sizeof(FrameRow),
      sizeof(StringRow), sizeof(std::uint8_t), sizeof(BatchRow), sizeof(ContextRow),     sizeof(StateSegmentRow),
      sizeof(StateBlockRow), sizeof(CollectiveRow), sizeof(CommunicatorRow)};
  return sizes[static_cast<std::size_t>(t)];
}

Counts local_counts(const RankDump& d) {
  if (d.stacks == nullptr) throw std::invalid_argument("write_archive: RankDump needs its stack table");
  Counts c{};
  c[kRanks] = 1;
  c[kEvents] = d.events.size();
  c[kStacks] = d.stacks->stacks.size();
  c[kStackFrames] = d.stacks->stack_frames.size();
  c[kFrames] = d.stacks->frames.size();
  c[kStrings] = d.stacks->strings.size() + 2 * d.context.size();  // each context entry's key and value follow
  for (const auto& s : d.stacks->strings) c[kStringData] += s.size();
  for (const auto& e : d.context) c[kStringData] += e.key.size() + e.value.size();
  c[kBatches] = d.batches.size();
  c[kContext] = d.context.size();
  c[kStateSegments] = d.state_segments.size();
  c[kStateBlocks] = d.state_blocks.size();
  c[kCollectives] = d.collectives.size();
  c[kCommunicators] = d.communicators.size();
  return c;
}

namespace {
template <typename T>
std::span<const std::uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(T)};
}
}  // namespace

std::span<const std::uint8_t> RankRows::bytes(Table t) const {
  switch (t) {
    case kRanks: return {reinterpret_cast<const std::uint8_t*>(&rank), sizeof(rank)};
    case kEvents: return {reinterpret_cast<const std::uint8_t*>(events.data()), events.size_bytes()};
    case kStacks: return as_bytes(stacks);
    case kStackFrames: return as_bytes(stack_frames);
    case kFrames: return as_bytes(frames);
    case kStrings: return as_bytes(strings);
    case kStringData: return as_bytes(string_data);
    case kBatches: return as_bytes(batches);
    case kContext: return as_bytes(context);
    case kStateSegments: return as_bytes(state_segments);
    case kStateBlocks: return as_bytes(state_blocks);
    case kCollectives: return as_bytes(collectives);
    case kCommunicators: return as_bytes(communicators);
    case kTables: break;
  }
  return {};
}

RankRows global_rows(const RankDump& d, const Counts& at) {
  RankRows g;
  g.count = local_counts(d);
  g.rank = d.row;
  g.rank.event_offset = at[kEvents];
  g.rank.event_count = g.count[kEvents];
  g.rank.stack_offset = at[kStacks];
  g.rank.stack_count = g.count[kStacks];
  g.rank.frame_offset = at[kFrames];
  g.rank.frame_count = g.count[kFrames];
  g.rank.string_offset = at[kStrings];
  g.rank.string_count = g.count[kStrings];
  g.events = d.events;
  g.event_stack_shift = static_cast<std::int32_t>(at[kStacks]);
  g.stacks.reserve(d.stacks->stacks.size());
  for (const auto& s : d.stacks->stacks) g.stacks.push_back(StackRow{s.frame_offset + at[kStackFrames], s.frame_count, 0});
  g.stack_frames = d.stacks->stack_frames;
  for (auto& f : g.stack_frames) f += static_cast<std::uint32_t>(at[kFrames]);
  g.frames.reserve(d.stacks->frames.size());
  for (const auto& f : d.stacks->frames) {
    g.frames.push_back(FrameRow{f.function + static_cast<std::uint32_t>(at[kStrings]),
                                f.file + static_cast<std::uint32_t>(at[kStrings]), f.line});
  }
  g.string_data.reserve(g.count[kStringData]);
  std::uint64_t offset = at[kStringData];
  auto add_string = [&](const std::string& s) {
    g.strings.push_back(StringRow{offset, s.size()});
    g.string_data.insert(g.string_data.end(), s.begin(), s.end());
    offset += s.size();
  };
  for (const auto& s : d.stacks->strings) add_string(s);
  // The context's strings follow the stack table's: key, value, key, value, ...
  auto id = static_cast<std::uint32_t>(at[kStrings] + d.stacks->strings.size());
  for (const ContextEntry& e : d.context) {
    add_string(e.key);
    add_string(e.value);
    g.context.push_back(ContextRow{d.row.rank, static_cast<std::uint8_t>(e.kind), {}, e.batch, id, id + 1});
    id += 2;
  }
  g.batches.reserve(d.batches.size());
  for (const BatchStats& b : d.batches) {
    g.batches.push_back(BatchRow{d.row.rank, b.device, b.batch, b.start_t_ns, b.end_t_ns, b.allocated_bytes,
                                 b.reserved_bytes, b.peak_allocated_bytes, b.peak_reserved_bytes,
                                 b.device_capacity_bytes, b.device_free_bytes, b.alloc_events, b.free_events,
                                 b.oom_events, b.outside_allocator_bytes});
  }
  g.state_segments.assign(d.state_segments.begin(), d.state_segments.end());
  for (auto& seg : g.state_segments) {
    seg.rank = d.row.rank;
    if (seg.stack_id != kNoStack) seg.stack_id += g.event_stack_shift;
  }
  g.state_blocks.assign(d.state_blocks.begin(), d.state_blocks.end());
  for (auto& b : g.state_blocks) {
    b.rank = d.row.rank;
    if (b.stack_id != kNoStack) b.stack_id += g.event_stack_shift;
  }
  g.collectives.reserve(d.collectives.size());
  for (const Collective& c : d.collectives) g.collectives.push_back(collective_row(d.row.rank, c));
  g.communicators.reserve(d.communicators.size());
  for (const CommunicatorInfo& c : d.communicators) {
    CommunicatorRow row;
    row.rank = d.row.rank;
    row.comm_rank = c.comm_rank;
    row.comm_size = c.comm_size;
    row.comm_id = c.comm_id;
    set_fixed_string(row.name, c.name);
    g.communicators.push_back(row);
  }
  return g;
}

void events_with_global_stacks(std::span<const Event> events, std::int32_t shift, std::span<Event> out) {
  std::memcpy(out.data(), events.data(), events.size_bytes());
  if (shift == 0) return;
  for (auto& e : out.first(events.size())) {
    if (e.stack_id != kNoStack) e.stack_id += shift;
  }
}

}  // namespace oomflight::format_detail
