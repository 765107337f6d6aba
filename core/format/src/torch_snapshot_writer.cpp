// The snapshot writer: TorchSnapshot -> the dict PyTorch's `_snapshot()` returns, pickled.
#include "oomflight/format/torch_snapshot_writer.hpp"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "oomflight/format/pickle.hpp"
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
      if (f.line == -1) {
        w_.unsigned_integer(~std::uint64_t{0});  // PyTorch's unknown line: (size_t)-1 (torch_snapshot.cpp)
      } else {
        w_.integer(f.line);
      }
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

// The optional keys a source left out (TorchSnapshot::omitted_*_keys), looked up per dict written.
struct Omitted {
  explicit Omitted(const std::vector<std::string>& keys) : keys_(keys) {}
  bool operator()(std::string_view key) const {
    return !keys_.empty() && std::find(keys_.begin(), keys_.end(), key) != keys_.end();
  }

 private:
  const std::vector<std::string>& keys_;
};

void write_segment(pickle::Writer& w, FramesWriter& frames, const SnapshotSegment& s, const Omitted& omitted_segment,
                   const Omitted& omitted_block) {
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
  const auto optional = [&](const char* key, auto write) {
    if (omitted_segment(key)) return;
    w.key(key);
    write();
  };
  optional("allocated_size", [&] { w.unsigned_integer(allocated); });
  optional("active_size", [&] { w.unsigned_integer(active); });
  optional("requested_size", [&] { w.unsigned_integer(requested); });
  optional("stream", [&] { w.unsigned_integer(s.stream); });
  optional("segment_type", [&] { w.memoized_string(s.segment_type.empty() ? "large" : s.segment_type); });
  optional("segment_pool_id", [&] {
    w.unsigned_integer(s.segment_pool_id[0]);
    w.unsigned_integer(s.segment_pool_id[1]);
    w.tuple2();
  });
  optional("is_expandable", [&] { w.boolean(s.is_expandable); });
  if (s.stack_id != kNoStack) {
    w.key("frames");
    frames.write(s.stack_id);
  }
  w.key("blocks");
  w.begin_list();
  for (const auto& b : s.blocks) {
    w.begin_dict();
    if (!omitted_block("address")) {
      w.key("address");
      w.unsigned_integer(b.address);
    }
    w.key("size");
    w.unsigned_integer(b.size);
    if (!omitted_block("requested_size")) {
      w.key("requested_size");
      w.unsigned_integer(b.requested_size);
    }
    w.key("state");
    w.memoized_string(b.state);
    if (b.stack_id != kNoStack) {
      w.key("frames");
      frames.write(b.stack_id);
    }
    w.end_dict();
  }
  w.end_list();
  w.end_dict();
}

void write_entry(pickle::Writer& w, FramesWriter& frames, const TraceEntry& e, bool with_stream,
                 const std::vector<std::pair<std::string, pickle::Document>>& constants) {
  w.begin_dict();
  w.key("action");
  w.key(action_name(e.action));  // static storage: found by address
  w.key(e.action == Action::oom ? "device_free" : "addr");
  w.unsigned_integer(e.addr);
  w.key("size");
  w.unsigned_integer(e.size);
  if (with_stream) {
    w.key("stream");
    w.unsigned_integer(e.stream);
  }
  if (e.time_us >= 0) {
    w.key("time_us");
    w.integer(e.time_us);
  }
  if (e.stack_id != kNoStack) {
    w.key("frames");
    frames.write(e.stack_id);
  }
  for (const auto& [key, value] : constants) {
    w.memoized_string(key);
    pickle::write_value(w, value.root());
  }
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
  const Omitted omitted_segment(snapshot.omitted_segment_keys), omitted_block(snapshot.omitted_block_keys);
  for (const auto& s : snapshot.segments) write_segment(w, frames, s, omitted_segment, omitted_block);
  w.end_list();
  w.key("device_traces");
  w.begin_list();
  const bool with_stream = !Omitted(snapshot.omitted_trace_keys)("stream");
  std::vector<std::pair<std::string, pickle::Document>> constants;
  for (const auto& [key, pickled] : snapshot.trace_constants) constants.emplace_back(key, pickle::Document::parse(pickled));
  for (const auto& trace : snapshot.device_traces) {
    w.begin_list();
    for (const auto& e : trace) write_entry(w, frames, e, with_stream, constants);
    w.end_list();
  }
  w.end_list();
  for (const auto& [key, pickled] : snapshot.fields) {
    if (key == "segments" || key == "device_traces") continue;
    const auto value = pickle::Document::parse(pickled);
    w.string(key);
    pickle::write_value(w, value.root());
  }
  w.end_dict();
  return w.finish();
}

}  // namespace oomflight
