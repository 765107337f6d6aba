// Decoding PyTorch snapshot dicts into plain structs.
#include "oomflight/format/torch_snapshot.hpp"

#include <fmt/format.h>
#include <unordered_map>

namespace oomflight {
namespace {

using pickle::Kind;
using pickle::Value;

class Decoder {
 public:
  Decoder(StackTable& stacks, std::size_t max_elements)
      : stacks_(stacks), max_elements_(max_elements), left_(max_elements) {}

  // Charges `n` decoded elements (segments, blocks, trace entries) before they are decoded.
  void charge(std::size_t n, const std::string& where) {
    if (n > left_) {
      fail(where, fmt::format("decodes to more segments, blocks and trace entries than the pickle holds values "
                              "({}): its lists share entries through the pickle memo, which PyTorch never "
                              "writes; refused before it multiplies (a decompression bomb)",
                              max_elements_));
    }
    left_ -= n;
  }

  [[noreturn]] static void fail(const std::string& where, const std::string& what) {
    throw SnapshotError(fmt::format("{}: {}", where, what));
  }

  static const Value& field(const Value& dict, const char* key, const std::string& where) {
    const Value* v = dict.get(key);
    if (v == nullptr) fail(where, fmt::format("'{}' is missing", key));
    return *v;
  }

  static std::int64_t integer(const Value& dict, const char* key, const std::string& where) {
    const Value& v = field(dict, key, where);
    if (v.kind == Kind::boolean) return v.boolean ? 1 : 0;
    if (v.kind != Kind::integer) fail(where, fmt::format("'{}' is not an integer", key));
    return v.integer;
  }

  static std::uint64_t bytes(const Value& dict, const char* key, const std::string& where) {
    const std::int64_t v = integer(dict, key, where);
    if (v < 0) fail(where, fmt::format("'{}' is negative ({})", key, v));
    return static_cast<std::uint64_t>(v);
  }

  static std::uint64_t optional_bytes(const Value& dict, const char* key, std::uint64_t fallback,
                                      const std::string& where) {
    return dict.get(key) ? bytes(dict, key, where) : fallback;
  }

  static std::string text(const Value& dict, const char* key, const std::string& where) {
    const Value& v = field(dict, key, where);
    if (v.kind != Kind::string) fail(where, fmt::format("'{}' is not a string", key));
    return std::string(v.text);
  }

  static const Value& list(const Value& v, const std::string& where) {
    if (v.kind != Kind::list && v.kind != Kind::tuple) fail(where, "is not a list");
    return v;
  }

  static const Value& dict(const Value& v, const std::string& where) {
    if (v.kind != Kind::dict) fail(where, "is not a dict");
    return v;
  }

  // Interns the entry's frames. Pickles share identical frame lists through the memo, so cache by object.
  std::int32_t stack(const Value& owner, const std::string& where) {
    const Value* frames = owner.get("frames");
    if (frames == nullptr) return kNoStack;
    if (auto it = by_object_.find(frames); it != by_object_.end()) return it->second;
    list(*frames, where + ".frames");
    refs_.clear();
    for (const Value* f : frames->items) {
      if (f->kind != Kind::dict) fail(where + ".frames", "a frame is not a dict");
      const Value* name = f->get("name");
      const Value* file = f->get("filename");
      const Value* line = f->get("line");
      refs_.push_back(FrameRef{name && name->kind == Kind::string ? name->text : std::string_view("??"),
                               file && file->kind == Kind::string ? file->text : std::string_view("??"),
                               line && line->kind == Kind::integer ? static_cast<std::int32_t>(line->integer) : 0});
    }
    const std::int32_t id = stacks_.intern(refs_);
    by_object_.emplace(frames, id);
    return id;
  }

  SnapshotSegment segment(const Value& v, const std::string& where) {
    dict(v, where);
    SnapshotSegment s;
    s.device = static_cast<int>(integer(v, "device", where));
    s.address = bytes(v, "address", where);
    s.total_size = bytes(v, "total_size", where);
    s.allocated_size = optional_bytes(v, "allocated_size", 0, where);
    s.active_size = optional_bytes(v, "active_size", 0, where);
    s.stream = optional_bytes(v, "stream", 0, where);
    if (const Value* t = v.get("segment_type"); t && t->kind == Kind::string) s.segment_type = std::string(t->text);
    if (const Value* e = v.get("is_expandable"); e && e->kind == Kind::boolean) s.is_expandable = e->boolean;
    const Value& blocks = list(field(v, "blocks", where), where + ".blocks");
    charge(blocks.items.size(), where + ".blocks");
    std::uint64_t next = s.address;  // older snapshots give no block address: blocks tile the segment in order
    for (std::size_t i = 0; i < blocks.items.size(); ++i) {
      const std::string bw = fmt::format("{}.blocks[{}]", where, i);
      const Value& b = dict(*blocks.items[i], bw);
      SnapshotBlock block;
      block.size = bytes(b, "size", bw);
      block.address = optional_bytes(b, "address", next, bw);
      block.requested_size = optional_bytes(b, "requested_size", block.size, bw);
      block.state = text(b, "state", bw);
      block.stack_id = stack(b, bw);
      next = block.address + block.size;
      s.blocks.push_back(std::move(block));
    }
    return s;
  }

  std::vector<TraceEntry> trace(const Value& v, const std::string& where, TorchSnapshot& out) {
    std::vector<TraceEntry> entries;
    charge(list(v, where).items.size(), where);
    entries.reserve(v.items.size());
    for (std::size_t i = 0; i < v.items.size(); ++i) {
      const std::string ew = fmt::format("{}[{}]", where, i);
      const Value& e = dict(*v.items[i], ew);
      const auto action = action_from_name(text(e, "action", ew));
      if (!action || *action == Action::step) {
        ++out.skipped_unknown_actions;
        continue;
      }
      TraceEntry t;
      t.action = *action;
      t.addr = bytes(e, "addr", ew);
      t.size = bytes(e, "size", ew);
      t.stream = optional_bytes(e, "stream", 0, ew);
      if (e.get("time_us")) {
        t.time_us = integer(e, "time_us", ew);
        out.has_time_us = true;
      }
      t.stack_id = stack(e, ew);
      entries.push_back(t);
    }
    return entries;
  }

 private:
  StackTable& stacks_;
  std::size_t max_elements_;
  std::size_t left_;
  std::unordered_map<const Value*, std::int32_t> by_object_;
  std::vector<FrameRef> refs_;
};

}  // namespace

TorchSnapshot decode_torch_snapshot(const pickle::Document& doc, StackTable& stacks) {
  const Value& root = doc.root();
  Decoder d(stacks, doc.value_count());
  Decoder::dict(root, "snapshot");
  TorchSnapshot out;
  const Value& segments = Decoder::list(Decoder::field(root, "segments", "snapshot"), "segments");
  d.charge(segments.items.size(), "segments");
  for (std::size_t i = 0; i < segments.items.size(); ++i) {
    out.segments.push_back(d.segment(*segments.items[i], fmt::format("segments[{}]", i)));
  }
  const Value& traces = Decoder::list(Decoder::field(root, "device_traces", "snapshot"), "device_traces");
  for (std::size_t i = 0; i < traces.items.size(); ++i) {
    out.device_traces.push_back(d.trace(*traces.items[i], fmt::format("device_traces[{}]", i), out));
  }
  out.has_allocator_settings = root.get("allocator_settings") != nullptr;
  return out;
}

TorchSnapshot read_torch_snapshot(const std::string& path, StackTable& stacks) {
  const auto doc = pickle::read_pickle_file(path);
  try {
    return decode_torch_snapshot(doc, stacks);
  } catch (const SnapshotError& e) {
    throw SnapshotError(fmt::format("{}: not a PyTorch memory snapshot: {}", path, e.what()));
  }
}

}  // namespace oomflight
