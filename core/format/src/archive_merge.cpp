// Merging: every input rank becomes a RankDump with its own (local) stack tables again, and the serial writer
// rebases them all into one archive, exactly as the collective writer would have.
#include "oomflight/format/archive_merge.hpp"

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <map>
#include <set>

#include "oomflight/base/utc_time.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "oomflight/version.h"

namespace oomflight {
namespace {

// One rank of an input, with ids local to it: what its recorder would have handed to the writer.
struct LocalRank {
  RankRow row;
  std::vector<Event> events;
  std::vector<BatchStats> batches;
  std::vector<ContextEntry> context;
  std::vector<StateSegmentRow> state_segments;
  std::vector<StateBlockRow> state_blocks;
  std::vector<Collective> collectives;
  std::vector<CommunicatorInfo> communicators;
  StackTableCopy stacks;
};

// The reader has checked every range and id (check_consistency), so the slicing below stays inside the tables.
LocalRank localise(const Archive& a, const RankRow& row) {
  LocalRank out;
  out.row = row;
  const auto events = a.events_of(row);
  out.events.assign(events.begin(), events.end());
  for (Event& e : out.events) {
    if (e.stack_id == kNoStack) continue;
    const auto id = static_cast<std::uint64_t>(e.stack_id);
    if (id < row.stack_offset || id - row.stack_offset >= row.stack_count) {
      throw ArchiveError(fmt::format("{}: rank {} has an event whose stack {} is another rank's", a.path, row.rank,
                                     e.stack_id));
    }
    e.stack_id = static_cast<std::int32_t>(id - row.stack_offset);
  }
  for (const StateSegmentRow& seg : a.state_segments_of(row.rank)) {  // the reader checked the ids are this rank's
    out.state_segments.push_back(seg);
    if (seg.stack_id != kNoStack) out.state_segments.back().stack_id = static_cast<std::int32_t>(seg.stack_id - row.stack_offset);
  }
  for (const StateBlockRow& b : a.state_blocks_of(row.rank)) {  // the reader checked the ids are this rank's
    out.state_blocks.push_back(b);
    if (b.stack_id != kNoStack) out.state_blocks.back().stack_id = static_cast<std::int32_t>(b.stack_id - row.stack_offset);
  }
  for (const CollectiveRow& c : a.collectives_of(row.rank)) {
    out.collectives.push_back(Collective{c.t_ns, c.comm_id, c.seq, c.count, c.bytes, c.stream, c.batch, c.peer, c.op,
                                         c.datatype, c.phase, c.flags});
  }
  for (const CommunicatorRow& c : a.communicators_of(row.rank)) {
    out.communicators.push_back(CommunicatorInfo{c.comm_id, fixed_string(c.name), c.comm_rank, c.comm_size});
  }
  for (const BatchRow& b : a.batches_of(row.rank)) {
    out.batches.push_back(BatchStats{b.batch, b.start_t_ns, b.end_t_ns, b.device, 0, b.allocated_bytes,
                                     b.reserved_bytes, b.peak_allocated_bytes, b.peak_reserved_bytes,
                                     b.device_capacity_bytes, b.device_free_bytes, b.alloc_events, b.free_events,
                                     b.oom_events});
  }
  // The rank's context strings follow its stack strings (the writer appends them): keep only the stacks' here,
  // the writer appends the context's again.
  std::uint64_t stack_strings = row.string_count;
  for (const ContextRow& c : a.context_of(row.rank)) {
    stack_strings = std::min<std::uint64_t>(stack_strings, std::min(c.key, c.value) - row.string_offset);
    out.context.push_back(ContextEntry{static_cast<ContextEntry::Kind>(c.kind), c.batch, std::string(a.string(c.key)),
                                       std::string(a.string(c.value))});
  }
  for (std::uint64_t i = 0; i < stack_strings; ++i) out.stacks.strings.push_back(a.strings[row.string_offset + i]);
  const auto local_string = [&](std::uint32_t id) -> std::uint32_t {
    if (id < row.string_offset || id - row.string_offset >= stack_strings) {
      throw ArchiveError(fmt::format("{}: rank {} has a frame naming string {}, another rank's", a.path, row.rank, id));
    }
    return static_cast<std::uint32_t>(id - row.string_offset);
  };
  for (std::uint64_t i = 0; i < row.frame_count; ++i) {
    const FrameRow& f = a.frames[row.frame_offset + i];
    out.stacks.frames.push_back(InternedFrame{local_string(f.function), local_string(f.file), f.line});
  }
  for (std::uint64_t i = 0; i < row.stack_count; ++i) {
    const StackRow& s = a.stacks[row.stack_offset + i];
    out.stacks.stacks.push_back(InternedStack{out.stacks.stack_frames.size(), s.frame_count});
    for (std::uint64_t k = 0; k < s.frame_count; ++k) {
      const std::uint32_t frame = a.stack_frames[s.frame_offset + k];
      if (frame < row.frame_offset || frame - row.frame_offset >= row.frame_count) {
        throw ArchiveError(fmt::format("{}: rank {} has a stack using frame {}, another rank's", a.path, row.rank, frame));
      }
      out.stacks.stack_frames.push_back(static_cast<std::uint32_t>(frame - row.frame_offset));
    }
  }
  return out;
}

void require_same(const Archive& first, const Archive& other, const char* field, const std::string& a,
                  const std::string& b) {
  if (a != b) {
    throw ArchiveError(fmt::format("{} and {} are not from one dump: {} '{}' against '{}'", first.path, other.path,
                                   field, a, b));
  }
}

}  // namespace

ArchiveHeader merge_archives(const std::vector<std::string>& inputs, const std::string& output) {
  namespace fs = std::filesystem;
  if (inputs.empty()) throw ArchiveError("merge: no input files");
  std::error_code ec;
  for (const auto& in : inputs) {
    if (fs::equivalent(in, output, ec)) {
      throw ArchiveError(fmt::format("merge: the output {} is one of the inputs", output));
    }
  }
  std::vector<Archive> archives;
  archives.reserve(inputs.size());
  for (const auto& in : inputs) archives.push_back(read_archive(in));

  const Archive& first = archives.front();
  std::map<std::int32_t, std::pair<const Archive*, const RankRow*>> by_rank;
  std::set<std::int32_t> origins;
  std::vector<std::string> reasons;
  for (const Archive& a : archives) {
    require_same(first, a, "run_name", first.header.run_name, a.header.run_name);
    require_same(first, a, "kind", first.header.kind, a.header.kind);
    if (!first.header.job_id.empty() && !a.header.job_id.empty()) {  // files of 0.2.1 on; older ones do not say
      require_same(first, a, "job_id", first.header.job_id, a.header.job_id);
    }
    require_same(first, a, "world_size", std::to_string(first.header.world_size), std::to_string(a.header.world_size));
    if (first.header.dump_batch && a.header.dump_batch) {  // files of 0.2.1 on; older ones do not say
      require_same(first, a, "dump_batch", std::to_string(*first.header.dump_batch),
                   std::to_string(*a.header.dump_batch));
    }
    require_same(first, a, "window_first_batch", std::to_string(first.header.window_first_batch),
                 std::to_string(a.header.window_first_batch));
    require_same(first, a, "window_last_batch", std::to_string(first.header.window_last_batch),
                 std::to_string(a.header.window_last_batch));
    if (first.header.dump_number && a.header.dump_number) {
      require_same(first, a, "dump_number", std::to_string(*first.header.dump_number),
                   std::to_string(*a.header.dump_number));
    }
    for (const RankRow& row : a.ranks) {
      const auto [it, inserted] = by_rank.emplace(row.rank, std::make_pair(&a, &row));
      if (!inserted) {
        throw ArchiveError(fmt::format("merge: rank {} is in both {} and {}", row.rank, it->second.first->path, a.path));
      }
    }
    origins.insert(a.header.origin_ranks.begin(), a.header.origin_ranks.end());
    std::size_t start = 0;
    const std::string& text = a.header.reason;
    while (start < text.size()) {  // one line per origin: keep each distinct line once
      const std::size_t end = std::min(text.find('\n', start), text.size());
      const std::string line = text.substr(start, end - start);
      if (!line.empty() && std::find(reasons.begin(), reasons.end(), line) == reasons.end()) reasons.push_back(line);
      start = end + 1;
    }
  }

  ArchiveHeader header;
  header.producer = "oomflight " OOMFLIGHT_VERSION_STRING;
  header.run_name = first.header.run_name;
  header.job_id = first.header.job_id;
  header.kind = first.header.kind;
  header.created_at_utc = utc_now_iso8601();
  for (const auto& line : reasons) header.reason += (header.reason.empty() ? "" : "\n") + line;
  header.origin_ranks.assign(origins.begin(), origins.end());
  header.world_size = first.header.world_size;
  header.dump_batch = first.header.dump_batch;
  header.dump_number = first.header.dump_number;
  header.window_first_batch = first.header.window_first_batch;  // a snapshot's window (the same in every input)
  header.window_last_batch = first.header.window_last_batch;

  std::vector<LocalRank> ranks;
  ranks.reserve(by_rank.size());
  for (const auto& [rank, where] : by_rank) {
    ranks.push_back(localise(*where.first, *where.second));
    header.ranks_present.push_back(rank);
  }
  std::vector<RankDump> dumps;
  dumps.reserve(ranks.size());
  for (const LocalRank& r : ranks) {
    dumps.push_back(RankDump{r.row, r.events, &r.stacks, r.batches, r.context, r.state_segments, r.state_blocks,
                             r.collectives, r.communicators});
  }
  write_archive_ranks(output, header, dumps);
  return header;
}

}  // namespace oomflight
