// The snapshot writer: TorchSnapshot -> the dict PyTorch's `_snapshot()` returns, pickled.
#include "oomflight/format/torch_snapshot_writer.hpp"

#include <unordered_map>
#include <vector>

#include "oomflight/format/pickle_writer.hpp"

namespace oomflight {

std::span<const std::uint32_t> StackTableFrames::stack(std::int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= table_.stacks.size()) return {};
  const auto& s = table_.stacks[static_cast<std::size_t>(id)];
  return std::span<const std::uint32_t>(table_.stack_frames).subspan(s.frame_offset, s.frame_count);
}

FrameRef StackTableFrames::frame(std::uint32_t id) const {
  const auto& f = table_.frames.at(id);
  return FrameRef{table_.strings.at(f.function), table_.strings.at(f.file), f.line};
}

namespace {

// Writes frames lists, each frame dict once (memoized) and each stack's list once.
class FramesWriter {
 public:
  FramesWriter(pickle::Writer& w, const SnapshotFrameSource& source) : w_(w), source_(source) {}

  void write(std::int32_t stack_id) {
    if (auto it = stacks_.find(stack_id); it != stacks_.end()) return w_.get(it->second);
    w_.begin_list();
    for (const std::uint32_t id : source_.stack(stack_id)) {
      if (auto it = frames_.find(id); it != frames_.end()) {
        w_.get(it->second);
        continue;
      }
      const FrameRef f = source_.frame(id);
      w_.begin_dict();
      w_.key("filename");
      w_.memoized_string(f.file);
      w_.key("line");
      w_.integer(f.line);
      w_.key("name");
      w_.string(f.function);
      w_.end_dict();
      frames_.emplace(id, w_.memoize());
    }
    w_.end_list();
    stacks_.emplace(stack_id, w_.memoize());
  }

 private:
  pickle::Writer& w_;
  const SnapshotFrameSource& source_;
  std::unordered_map<std::uint32_t, std::uint32_t> frames_;  // frame id -> memo index
  std::unordered_map<std::int32_t, std::uint32_t> stacks_;   // stack id -> memo index
};

void write_segment(pickle::Writer& w, FramesWriter& frames, const SnapshotSegment& s) {
  std::uint64_t allocated = 0, active = 0, requested = 0;
  for (const auto& b : s.blocks) {
    if (b.state == "active_allocated") {
      allocated += b.size;
      requested += b.requested_size;
    }
    if (b.live()) active += b.size;
  }
  w.begin_dict();
  w.key("device");
  w.integer(s.device);
  w.key("address");
  w.unsigned_integer(s.address);
  w.key("total_size");
  w.unsigned_integer(s.total_size);
  w.key("allocated_size");
  w.unsigned_integer(allocated);
  w.key("active_size");
  w.unsigned_integer(active);
  w.key("requested_size");
  w.unsigned_integer(requested);
  w.key("stream");
  w.unsigned_integer(s.stream);
  w.key("segment_type");
  w.memoized_string(s.segment_type.empty() ? "large" : s.segment_type);
  w.key("segment_pool_id");
  w.integer(0);
  w.integer(0);
  w.tuple2();
  w.key("is_expandable");
  w.boolean(s.is_expandable);
  w.key("frames");
  frames.write(kNoStack);
  w.key("blocks");
  w.begin_list();
  for (const auto& b : s.blocks) {
    w.begin_dict();
    w.key("address");
    w.unsigned_integer(b.address);
    w.key("size");
    w.unsigned_integer(b.size);
    w.key("requested_size");
    w.unsigned_integer(b.requested_size);
    w.key("state");
    w.memoized_string(b.state);
    w.key("frames");
    frames.write(b.stack_id);
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_entry(pickle::Writer& w, FramesWriter& frames, const TraceEntry& e) {
  w.begin_dict();
  w.key("action");
  w.key(action_name(e.action));  // static storage: found by address
  w.key(e.action == Action::oom ? "device_free" : "addr");
  w.unsigned_integer(e.addr);
  w.key("size");
  w.unsigned_integer(e.size);
  w.key("stream");
  w.unsigned_integer(e.stream);
  if (e.time_us >= 0) {
    w.key("time_us");
    w.integer(e.time_us);
  }
  w.key("frames");
  frames.write(e.stack_id);
  w.end_dict();
}

}  // namespace

std::string write_torch_snapshot(const TorchSnapshot& snapshot, const SnapshotFrameSource& source) {
  pickle::Writer w;
  std::size_t entries = 0;
  for (const auto& trace : snapshot.device_traces) entries += trace.size();
  w.reserve(64 * entries + 256 * snapshot.segments.size() + 4096);  // about what an entry and a segment take
  FramesWriter frames(w, source);
  w.begin_dict();
  w.key("segments");
  w.begin_list();
  for (const auto& s : snapshot.segments) write_segment(w, frames, s);
  w.end_list();
  w.key("device_traces");
  w.begin_list();
  for (const auto& trace : snapshot.device_traces) {
    w.begin_list();
    for (const auto& e : trace) write_entry(w, frames, e);
    w.end_list();
  }
  w.end_list();
  w.end_dict();
  return w.finish();
}

}  // namespace oomflight
