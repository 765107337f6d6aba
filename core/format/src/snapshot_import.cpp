// Snapshots to an archive: see snapshot_import.hpp.
#include "oomflight/format/snapshot_import.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/base64.hpp"
#include "oomflight/base/utc_time.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/version.h"

namespace oomflight {
namespace {

constexpr std::int64_t kUs = 1000;

struct ImportedRank {
  RankRow row;
  std::vector<Event> events;
  StackTableCopy stacks;
  std::vector<BatchStats> batches;
  std::vector<ContextEntry> context;
  std::vector<StateSegmentRow> state_segments;
  std::vector<StateBlockRow> state_blocks;
  std::string reason;
  std::vector<std::string> notes;
};

BlockState block_state(const std::string& state) {
  if (state == "active_allocated") return BlockState::active_allocated;
  if (state == "active_pending_free") return BlockState::active_pending_free;
  return BlockState::inactive;
}

ImportedRank import_one(const SnapshotInput& in) {
  ImportedRank r;
  StackTable table;
  TorchSnapshot snap;
  try {
    snap = read_torch_snapshot(in.path, table);
  } catch (const std::exception& e) {
    throw ArchiveError(fmt::format("import: {}", e.what()));
  }
  // The first time of any trace: the state before it is placed just before.
  std::int64_t first_us = -1;
  for (const auto& trace : snap.device_traces) {
    for (const auto& e : trace) {
      if (e.time_us >= 0 && (first_us < 0 || e.time_us < first_us)) first_us = e.time_us;
    }
  }
  const std::int64_t before_ns = first_us > 0 ? (first_us - 1) * kUs : 0;
  std::uint64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
  std::map<std::uint64_t, std::uint64_t> sizes;  // live block address -> size, per device in turn
  std::size_t most_events = 0;
  for (std::size_t d = 0; d < std::max<std::size_t>(snap.device_traces.size(), 1); ++d) {
    const int device = static_cast<int>(d);
    const SnapshotStartState start = snapshot_start_state(snap, device);
    for (const auto& [addr, s] : start.segments) {
      const auto action = s.is_expandable ? Action::segment_map : Action::segment_alloc;
      r.events.push_back(Event{before_ns, addr, s.size, s.stream, -1, kNoStack, static_cast<std::int16_t>(device), action,
                                     kEventPredatesHistory});
      reserved += s.size;
    }
    for (const auto& [addr, b] : start.blocks) {
      r.events.push_back(Event{before_ns, addr, b.size, b.stream, -1, b.stack_id, static_cast<std::int16_t>(device),
                                     Action::alloc, kEventPredatesHistory});
      allocated += b.size;
    }
  }
  peak_allocated = allocated;
  peak_reserved = reserved;
  const std::int64_t step_ns = first_us > 0 ? first_us * kUs : 1;
  r.events.push_back(Event{step_ns, 0, 0, 0, 0, kNoStack, 0, Action::step, 0});
  std::int64_t index = 1;
  for (std::size_t d = 0; d < snap.device_traces.size(); ++d) {
    const auto& trace = snap.device_traces[d];
    if (trace.size() > most_events) {
      most_events = trace.size();
      r.row.device = static_cast<int>(d);
    }
    std::map<std::uint64_t, std::uint64_t> live;
    for (const auto& [addr, b] : snapshot_start_state(snap, static_cast<int>(d)).blocks) live[addr] = b.size;
    std::map<std::uint64_t, std::uint64_t> segs;
    for (const auto& [addr, s] : snapshot_start_state(snap, static_cast<int>(d)).segments) segs[addr] = s.size;
    for (const auto& e : trace) {
      const std::int64_t t = e.time_us >= 0 ? e.time_us * kUs : step_ns + index * kUs;
      ++index;
      r.events.push_back(Event{t, e.addr, e.size, e.stream, 0, e.stack_id, static_cast<std::int16_t>(d), e.action, 0});
      switch (e.action) {
        case Action::alloc: live[e.addr] = e.size; allocated += e.size; break;
        case Action::free_completed:
          if (auto it = live.find(e.addr); it != live.end()) {
            allocated -= std::min(allocated, it->second);
            live.erase(it);
          }
          break;
        case Action::segment_alloc:
        case Action::segment_map: segs[e.addr] = e.size; reserved += e.size; break;
        case Action::segment_free:
        case Action::segment_unmap:
          if (auto it = segs.find(e.addr); it != segs.end()) {
            reserved -= std::min(reserved, it->second);
            segs.erase(it);
          }
          break;
        case Action::oom:
          r.row.is_origin = 1;
          r.row.oom_requested_bytes = e.size;
          r.row.device_free_bytes = e.addr;
          r.row.device = static_cast<int>(d);
          break;
        default: break;
      }
      peak_allocated = std::max(peak_allocated, allocated);
      peak_reserved = std::max(peak_reserved, reserved);
    }
  }
  // PyTorch's figures at the end: block sizes as the allocator rounded them, segment sizes.
  std::uint64_t end_allocated = 0, end_reserved = 0;
  for (const auto& seg : snap.segments) {
    end_reserved += seg.total_size;
    for (const auto& b : seg.blocks) end_allocated += b.state == "active_allocated" ? b.size : 0;
  }
  RankRow& row = r.row;
  row.rank = in.rank;
  row.local_rank = in.rank;
  row.batch = 0;
  row.allocated_bytes = end_allocated;
  row.reserved_bytes = end_reserved;
  row.peak_allocated_bytes = std::max(peak_allocated, end_allocated);
  row.peak_reserved_bytes = std::max(peak_reserved, end_reserved);
  row.events_recorded = r.events.size();
  row.freeze_t_ns = r.events.empty() ? 0 : std::max_element(r.events.begin(), r.events.end(), [](const Event& x, const Event& y) {
                                                 return x.t_ns < y.t_ns;
                                               })->t_ns;
  set_fixed_string(row.host, "imported");
  if (row.is_origin) {
    r.reason = fmt::format("rank {}: CUDA out of memory: the trace of {} ends in an oom entry (requested {} bytes, "
                           "{} bytes free on the device)",
                           in.rank, in.path, row.oom_requested_bytes, row.device_free_bytes);
    set_fixed_string(row.reason, r.reason.substr(r.reason.find(": ") + 2));
  }
  BatchStats b;
  b.batch = 0;
  b.start_t_ns = step_ns;
  b.end_t_ns = row.freeze_t_ns;
  b.device = row.device;
  b.allocated_bytes = end_allocated;
  b.reserved_bytes = end_reserved;
  b.peak_allocated_bytes = row.peak_allocated_bytes;
  b.peak_reserved_bytes = row.peak_reserved_bytes;
  for (const Event& e : r.events) {
    if (e.batch != 0) continue;
    b.alloc_events += e.action == Action::alloc;
    b.free_events += e.action == Action::free_completed;
    b.oom_events += e.action == Action::oom;
  }
  r.batches.push_back(b);
  r.stacks = table.copy();
  // The allocator's state at the end, exactly as the snapshot gives it (PyTorch's block sizes, every block).
  for (const auto& seg : snap.segments) {
    StateSegmentRow row_seg;
    row_seg.device = seg.device;
    row_seg.address = seg.address;
    row_seg.total_size = seg.total_size;
    row_seg.stream = seg.stream;
    row_seg.is_expandable = seg.is_expandable ? 1 : 0;
    row_seg.segment_type = seg.segment_type == "small"   ? SegmentType::small
                           : seg.segment_type == "large" ? SegmentType::large
                                                         : SegmentType::unknown;
    row_seg.stack_id = seg.stack_id;
    row_seg.segment_pool_id[0] = seg.segment_pool_id[0];
    row_seg.segment_pool_id[1] = seg.segment_pool_id[1];
    r.state_segments.push_back(row_seg);
    for (const auto& b : seg.blocks) {
      StateBlockRow row_block;
      row_block.stack_id = b.stack_id;
      row_block.address = b.address;
      row_block.size = b.size;
      row_block.requested_size = b.requested_size;
      row_block.state = block_state(b.state);
      r.state_blocks.push_back(row_block);
    }
  }
  // Where the ranks came from, and the allocator's settings as the snapshot recorded them.
  r.context.push_back(ContextEntry{ContextEntry::Kind::environment, -1, "imported_from", in.path});
  for (const auto& [key, value] : snap.allocator_settings) {
    r.context.push_back(ContextEntry{ContextEntry::Kind::environment, -1, "allocator_settings." + key, value});
  }
  // What the export needs to give the snapshot back as it was: its other top-level keys, verbatim, and the optional
  // keys its entries did not have.
  for (const auto& [key, pickled] : snap.fields) {
    r.context.push_back(ContextEntry{ContextEntry::Kind::snapshot_field, -1, key, base64_encode(pickled)});
  }
  const auto layout = [&](const char* what, const std::vector<std::string>& omitted) {
    if (!omitted.empty()) {
      r.context.push_back(ContextEntry{ContextEntry::Kind::snapshot_layout, -1, what, fmt::format("{}", fmt::join(omitted, ","))});
    }
  };
  layout("trace", snap.omitted_trace_keys);
  // How many device traces the snapshot had: trailing devices with an empty trace leave no event.
  r.context.push_back(ContextEntry{ContextEntry::Kind::snapshot_layout, -1, "device_traces",
                                   std::to_string(snap.device_traces.size())});
  for (const auto& [key, pickled] : snap.trace_constants) {
    r.context.push_back(ContextEntry{ContextEntry::Kind::snapshot_layout, -1, "trace." + key, base64_encode(pickled)});
  }
  layout("segment", snap.omitted_segment_keys);
  layout("block", snap.omitted_block_keys);
  // One line per key, the first 20 (a hostile snapshot can hold a million distinct keys).
  constexpr std::size_t kMaxNotes = 20;
  for (std::size_t i = 0; i < snap.dropped_keys.size() && i < kMaxNotes; ++i) {
    r.notes.push_back(fmt::format("{}: not carried: {} ({} dicts): an export gives them back without it", in.path,
                                  snap.dropped_keys[i].first, snap.dropped_keys[i].second));
  }
  if (snap.dropped_keys.size() > kMaxNotes) {
    r.notes.push_back(fmt::format("{}: not carried: {} more keys", in.path, snap.dropped_keys.size() - kMaxNotes));
  }
  return r;
}

}  // namespace

ArchiveHeader import_torch_snapshots(const std::vector<SnapshotInput>& inputs, const std::string& output,
                                     const ImportOptions& options, std::vector<std::string>* notes) {
  if (inputs.empty()) throw ArchiveError("import: no snapshot given");
  std::set<int> seen;
  int max_rank = 0;
  std::error_code ec;
  for (const auto& in : inputs) {
    if (in.rank < 0) throw ArchiveError(fmt::format("import: {}: rank {} is negative", in.path, in.rank));
    if (!seen.insert(in.rank).second) {
      throw ArchiveError(fmt::format("import: two snapshots for rank {} ({} is the second)", in.rank, in.path));
    }
    if (std::filesystem::equivalent(in.path, output, ec)) {
      throw ArchiveError(fmt::format("import: the output {} is one of the inputs", output));
    }
    max_rank = std::max(max_rank, in.rank);
  }
  const int world = options.world_size > 0 ? options.world_size : max_rank + 1;
  if (max_rank >= world) {
    throw ArchiveError(fmt::format("import: rank {} is outside the world size {}", max_rank, world));
  }
  std::vector<ImportedRank> ranks;
  ranks.reserve(inputs.size());
  for (const auto& in : inputs) ranks.push_back(import_one(in));
  std::sort(ranks.begin(), ranks.end(), [](const ImportedRank& a, const ImportedRank& b) { return a.row.rank < b.row.rank; });

  ArchiveHeader header;
  header.producer = "oomflight " OOMFLIGHT_VERSION_STRING;
  header.run_name = options.run_name.empty() ? std::filesystem::path(inputs.front().path).stem().string() : options.run_name;
  header.created_at_utc = utc_now_iso8601();
  header.world_size = world;
  std::vector<RankDump> dumps;
  for (auto& r : ranks) {
    if (notes) notes->insert(notes->end(), r.notes.begin(), r.notes.end());
    r.row.device_capacity_bytes = options.device_capacity_bytes;
    for (auto& b : r.batches) b.device_capacity_bytes = options.device_capacity_bytes;
    if (r.row.is_origin) {
      header.origin_ranks.push_back(r.row.rank);
      header.reason += (header.reason.empty() ? "" : "\n") + r.reason;
    }
    header.ranks_present.push_back(r.row.rank);
    // An imported snapshot has no collectives: PyTorch's snapshots hold none.
    dumps.push_back(
        RankDump{r.row, r.events, &r.stacks, r.batches, r.context, r.state_segments, r.state_blocks, {}, {}});
  }
  header.kind = header.origin_ranks.empty() ? "snapshot" : "oom";
  if (header.origin_ranks.empty()) header.window_first_batch = header.window_last_batch = 0;
  header.dump_batch = 0;  // an imported trace is one batch, 0
  write_archive_ranks(output, header, dumps);
  return header;
}

}  // namespace oomflight
