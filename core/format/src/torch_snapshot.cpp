// Decoding PyTorch snapshot dicts into plain structs.
#include "oomflight/format/torch_snapshot.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <unordered_map>

#include "oomflight/format/pickle_writer.hpp"

namespace oomflight {
namespace {

using pickle::Kind;
using pickle::Value;

// Where in the snapshot a value is, for error messages only: "device_traces[0][12]" is built when something is
// wrong, never for the 700,000 values that are right (formatting it eagerly cost more than decoding).
struct Where {
  const Where* parent = nullptr;
  const char* name = "";                        // ".blocks", "segments", ...
  std::size_t index = static_cast<std::size_t>(-1);  // [index] when set

  std::string text() const {
    std::string out = parent ? parent->text() : std::string();
    out += name;
    if (index != static_cast<std::size_t>(-1)) out += fmt::format("[{}]", index);
    return out;
  }
};

class Decoder {
 public:
  Decoder(StackTable& stacks, std::size_t max_elements)
      : stacks_(stacks), max_elements_(max_elements), left_(max_elements) {}

  // Charges `n` decoded elements (segments, blocks, trace entries) before they are decoded.
  void charge(std::size_t n, const Where& where) {
    if (n > left_) {
      fail(where, fmt::format("decodes to more segments, blocks and trace entries than the pickle holds values "
                              "({}): its lists share entries through the pickle memo, which PyTorch never "
                              "writes; refused before it multiplies (a decompression bomb)",
                              max_elements_));
    }
    left_ -= n;
  }

  // Counts the keys of `dict` that are not in `known` (what this reader carries), under `what` ("trace entry").
  void note_unknown_keys(const Value& dict, std::initializer_list<std::string_view> known, const char* what) {
    for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
      const Value& k = *dict.items[i];
      if (k.kind == Kind::string && std::find(known.begin(), known.end(), k.text) != known.end()) continue;
      ++dropped_[fmt::format("{} '{}'", what, k.kind == Kind::string ? k.text : std::string_view("(not a string)"))];
    }
  }

  // A trace entry's keys beyond the ones decoded (PyTorch 2.6's `compile_context`, `user_metadata`): each one's
  // count, and whether every entry so far gave it the same scalar value.
  void note_entry_extras(const Value& entry) {
    ++entries_seen_;
    for (std::size_t i = 0; i + 1 < entry.items.size(); i += 2) {
      const Value& k = *entry.items[i];
      if (k.kind != Kind::string) {
        ++dropped_["trace entry key that is not a string"];
        continue;
      }
      static constexpr std::string_view kKnown[] = {"action", "addr", "device_free", "size", "stream", "time_us", "frames"};
      if (std::find(std::begin(kKnown), std::end(kKnown), k.text) != std::end(kKnown)) continue;
      const Value& v = *entry.items[i + 1];
      auto [it, inserted] = extras_.try_emplace(std::string(k.text), Extra{&v, 0, true});
      ++it->second.count;
      if (!inserted && it->second.constant) it->second.constant = same_scalar(*it->second.first, v);
    }
  }

  // Extra keys every entry had with one value go to `constants` (the writer gives them back); the rest are dropped.
  void finish_entry_extras(TorchSnapshot& out) {
    for (const auto& [key, extra] : extras_) {
      if (extra.constant && extra.count == entries_seen_) {
        pickle::Writer w;
        pickle::write_value(w, *extra.first);
        out.trace_constants.emplace_back(key, w.finish());
      } else {
        dropped_[fmt::format("trace entry '{}'{}", key, extra.constant ? " (not on every entry)" : " (values differ)")] +=
            extra.count;
      }
    }
  }

  static bool same_scalar(const Value& a, const Value& b) {
    if (a.kind != b.kind) return false;
    switch (a.kind) {
      case Kind::none: return true;
      case Kind::boolean: return a.boolean == b.boolean;
      case Kind::integer: return a.integer == b.integer && a.above_int64 == b.above_int64;
      case Kind::floating: return std::memcmp(&a.floating, &b.floating, sizeof a.floating) == 0;
      case Kind::string:
      case Kind::bytes: return a.text == b.text;
      default: return false;  // containers: not compared
    }
  }

  // The first dict of a kind decides which optional keys the source wrote (PyTorch writes them all, or none).
  static void note_omitted(const Value& dict, std::initializer_list<const char*> optional, std::vector<std::string>& out) {
    for (const char* key : optional) {
      if (dict.get(key) == nullptr) out.emplace_back(key);
    }
  }

  std::vector<std::pair<std::string, std::size_t>> dropped() const {
    return {dropped_.begin(), dropped_.end()};
  }

  [[noreturn]] static void fail(const Where& where, const std::string& what) {
    throw SnapshotError(fmt::format("{}: {}", where.text(), what));
  }

  static const Value& field(const Value& dict, const char* key, const Where& where) {
    const Value* v = dict.get(key);
    if (v == nullptr) fail(where, fmt::format("'{}' is missing", key));
    return *v;
  }

  static std::int64_t integer(const Value& dict, const char* key, const Where& where) {
    const Value& v = field(dict, key, where);
    if (v.kind == Kind::boolean) return v.boolean ? 1 : 0;
    if (v.kind != Kind::integer) fail(where, fmt::format("'{}' is not an integer", key));
    if (v.above_int64) fail(where, fmt::format("'{}' is out of range ({})", key, static_cast<std::uint64_t>(v.integer)));
    return v.integer;
  }

  static std::uint64_t bytes(const Value& dict, const char* key, const Where& where) {
    if (const Value* u = dict.get(key); u && u->kind == Kind::integer && u->above_int64) {
      return static_cast<std::uint64_t>(u->integer);
    }
    const std::int64_t v = integer(dict, key, where);
    if (v < 0) fail(where, fmt::format("'{}' is negative ({})", key, v));
    return static_cast<std::uint64_t>(v);
  }

  static std::uint64_t optional_bytes(const Value& dict, const char* key, std::uint64_t fallback,
                                      const Where& where) {
    return dict.get(key) ? bytes(dict, key, where) : fallback;
  }

  static std::string_view text(const Value& dict, const char* key, const Where& where) {
    const Value& v = field(dict, key, where);
    if (v.kind != Kind::string) fail(where, fmt::format("'{}' is not a string", key));
    return v.text;
  }

  static const Value& list(const Value& v, const Where& where) {
    if (v.kind != Kind::list && v.kind != Kind::tuple) fail(where, "is not a list");
    return v;
  }

  static const Value& dict(const Value& v, const Where& where) {
    if (v.kind != Kind::dict) fail(where, "is not a dict");
    return v;
  }

  // Interns the entry's frames. PyTorch builds a new frames list per entry but shares its frame dicts (one per
  // distinct frame: 668 of them behind 705,000 references in the transformer snapshot). So a stack is looked up
  // by the addresses of its frame dicts, one hash per entry; only a sequence not seen before resolves its frames
  // (each frame dict interned once, remembered by address) and interns the stack.
  std::int32_t stack(const Value& owner, const Where& where) {
    const Value* frames = owner.get("frames");
    if (frames == nullptr) return kNoStack;
    if (frames->kind == Kind::list || frames->kind == Kind::tuple) {
      const std::string_view key(reinterpret_cast<const char*>(frames->items.data()),
                                 frames->items.size() * sizeof(const Value*));
      if (auto it = by_frames_.find(key); it != by_frames_.end()) return it->second;
    }
    const Where at{&where, ".frames"};
    list(*frames, at);
    ids_.clear();
    for (const Value* f : frames->items) {
      auto known = frame_ids_.find(f);
      if (known == frame_ids_.end()) {
        if (f->kind != Kind::dict) fail(at, "a frame is not a dict");
        note_unknown_keys(*f, {"name", "filename", "line"}, "frame");
        const Value* name = f->get("name");
        const Value* file = f->get("filename");
        const Value* line = f->get("line");
        const FrameRef ref{name && name->kind == Kind::string ? name->text : std::string_view("??"),
                           file && file->kind == Kind::string ? file->text : std::string_view("??"),
                           line && line->kind == Kind::integer ? frame_line(*line) : 0};
        known = frame_ids_.emplace(f, stacks_.intern_frame(ref)).first;
      }
      ids_.push_back(known->second);
    }
    const std::int32_t id = stacks_.intern_frame_ids(ids_);
    by_frames_.emplace(std::string(reinterpret_cast<const char*>(frames->items.data()),
                                   frames->items.size() * sizeof(const Value*)),
                       id);
    return id;
  }

  // A frame's line as the archive keeps it (int32). PyTorch's lines are size_t, and an unknown one is
  // (size_t)-1 = 2^64 - 1 (a Python frame whose code has no line: torch/csrc/profiler/unwind): kept as -1, which the
  // writer gives back as 2^64 - 1. Any other line outside int32 is kept as 0 (unknown) and counted.
  std::int32_t frame_line(const Value& line) {
    if (line.above_int64 && line.integer == -1) return -1;
    if (!line.above_int64 && line.integer >= 0 && line.integer <= INT32_MAX) return static_cast<std::int32_t>(line.integer);
    ++dropped_["frame 'line' outside 0 .. 2^31 - 1 (kept as 0)"];
    return 0;
  }

  SnapshotSegment segment(const Value& v, const Where& where, TorchSnapshot& out) {
    dict(v, where);
    if (first_segment_) {
      note_omitted(v, {"allocated_size", "active_size", "requested_size", "stream", "segment_type", "segment_pool_id",
                       "is_expandable"}, out.omitted_segment_keys);
      first_segment_ = false;
    }
    note_unknown_keys(v, {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                          "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}, "segment");
    SnapshotSegment s;
    s.device = static_cast<int>(integer(v, "device", where));
    s.address = bytes(v, "address", where);
    s.total_size = bytes(v, "total_size", where);
    s.allocated_size = optional_bytes(v, "allocated_size", 0, where);
    s.active_size = optional_bytes(v, "active_size", 0, where);
    s.stream = optional_bytes(v, "stream", 0, where);
    if (const Value* t = v.get("segment_type"); t && t->kind == Kind::string) s.segment_type = std::string(t->text);
    if (const Value* e = v.get("is_expandable"); e && e->kind == Kind::boolean) s.is_expandable = e->boolean;
    if (const Value* p = v.get("segment_pool_id"); p && (p->kind == Kind::tuple || p->kind == Kind::list)) {
      for (std::size_t i = 0; i < 2 && i < p->items.size(); ++i) {
        if (p->items[i]->kind == Kind::integer) s.segment_pool_id[i] = static_cast<std::uint64_t>(p->items[i]->integer);
      }
    }
    s.stack_id = stack(v, where);
    const Where blocks_at{&where, ".blocks"};
    const Value& blocks = list(field(v, "blocks", where), blocks_at);
    charge(blocks.items.size(), blocks_at);
    std::uint64_t next = s.address;  // older snapshots give no block address: blocks tile the segment in order
    for (std::size_t i = 0; i < blocks.items.size(); ++i) {
      const Where bw{&where, ".blocks", i};
      const Value& b = dict(*blocks.items[i], bw);
      if (first_block_) {
        note_omitted(b, {"address", "requested_size"}, out.omitted_block_keys);
        first_block_ = false;
      }
      note_unknown_keys(b, {"address", "size", "requested_size", "state", "frames"}, "block");
      SnapshotBlock block;
      block.size = bytes(b, "size", bw);
      block.address = optional_bytes(b, "address", next, bw);
      block.requested_size = optional_bytes(b, "requested_size", block.size, bw);
      block.state = std::string(text(b, "state", bw));
      block.stack_id = stack(b, bw);
      next = block.address + block.size;
      s.blocks.push_back(std::move(block));
    }
    return s;
  }

  std::vector<TraceEntry> trace(const Value& v, const Where& where, TorchSnapshot& out) {
    std::vector<TraceEntry> entries;
    charge(list(v, where).items.size(), where);
    entries.reserve(v.items.size());
    for (std::size_t i = 0; i < v.items.size(); ++i) {
      const Where ew{&where, "", i};
      const Value& e = dict(*v.items[i], ew);
      if (first_entry_) {
        note_omitted(e, {"stream", "time_us"}, out.omitted_trace_keys);
        first_entry_ = false;
      }
      note_entry_extras(e);
      const auto action = action_from_name(text(e, "action", ew));
      if (!action || *action == Action::step) {
        ++out.skipped_unknown_actions;
        continue;
      }
      TraceEntry t;
      t.action = *action;
      // PyTorch writes an oom's device free bytes as device_free (older versions as addr): ours is addr.
      t.addr = *action == Action::oom && e.get("device_free") ? bytes(e, "device_free", ew) : bytes(e, "addr", ew);
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
  // Heterogeneous lookup: the bytes of a frames list's item pointers find a key without building a string.
  // The key is a run of frame-dict pointers. Hashing all of it was 9 % of a snapshot's decode (stacks run to 50
  // frames); its length and its first and last four pointers tell stacks apart as well, and equality still
  // compares every byte.
  struct BytesHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      const std::size_t n = s.size() / sizeof(std::uint64_t);
      std::uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
      const auto mix = [&h](std::uint64_t v) {
        h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
      };
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < n && i < 4; ++i) {
        std::memcpy(&v, s.data() + i * sizeof v, sizeof v);
        mix(v);
      }
      for (std::size_t i = n > 8 ? n - 4 : std::min<std::size_t>(n, 4); i < n; ++i) {
        std::memcpy(&v, s.data() + i * sizeof v, sizeof v);
        mix(v);
      }
      return static_cast<std::size_t>(h ^ (h >> 33));
    }
  };
  std::unordered_map<std::string, std::int32_t, BytesHash, std::equal_to<>> by_frames_;  // frame dicts -> stack
  std::unordered_map<const Value*, std::uint32_t> frame_ids_;  // frame dict -> frame id
  std::vector<std::uint32_t> ids_;
  std::map<std::string, std::size_t> dropped_;  // "trace entry 'user_metadata'" -> dicts that had it
  bool first_segment_ = true, first_block_ = true, first_entry_ = true;
  struct Extra {
    const Value* first;
    std::size_t count;
    bool constant;
  };
  std::map<std::string, Extra> extras_;  // trace entries' extra keys
  std::size_t entries_seen_ = 0;
};

}  // namespace

namespace {

// A value as Python's repr writes it, cut at 200 characters (settings are short; a hostile file's are not).
void append_repr(const Value& v, std::string& out, std::size_t limit) {
  if (out.size() >= limit) return;
  switch (v.kind) {
    case Kind::none: out += "None"; break;
    case Kind::boolean: out += v.boolean ? "True" : "False"; break;
    case Kind::integer: out += std::to_string(v.integer); break;
    case Kind::floating: out += fmt::format("{}", v.floating); break;
    case Kind::string: out += fmt::format("'{}'", v.text.substr(0, limit)); break;
    case Kind::bytes: out += fmt::format("b<{} bytes>", v.text.size()); break;
    case Kind::dict:
      out += '{';
      for (std::size_t i = 0; i + 1 < v.items.size() && out.size() < limit; i += 2) {
        if (i) out += ", ";
        append_repr(*v.items[i], out, limit);
        out += ": ";
        append_repr(*v.items[i + 1], out, limit);
      }
      out += '}';
      break;
    default: {  // list, tuple, set
      out += v.kind == Kind::list ? '[' : '(';
      for (std::size_t i = 0; i < v.items.size() && out.size() < limit; ++i) {
        if (i) out += ", ";
        append_repr(*v.items[i], out, limit);
      }
      out += v.kind == Kind::list ? ']' : ')';
    }
  }
}

std::string python_repr(const Value& v) {
  constexpr std::size_t kLimit = 200;
  std::string out;
  append_repr(v, out, kLimit);
  if (out.size() > kLimit) out = out.substr(0, kLimit - 3) + "...";
  return out;
}

}  // namespace

TorchSnapshot decode_torch_snapshot(const pickle::Document& doc, StackTable& stacks) {
  const Value& root = doc.root();
  Decoder d(stacks, doc.value_count());
  const Where snapshot{nullptr, "snapshot"};
  Decoder::dict(root, snapshot);
  TorchSnapshot out;
  const Where segments_at{nullptr, "segments"};
  const Value& segments = Decoder::list(Decoder::field(root, "segments", snapshot), segments_at);
  d.charge(segments.items.size(), segments_at);
  for (std::size_t i = 0; i < segments.items.size(); ++i) {
    out.segments.push_back(d.segment(*segments.items[i], Where{nullptr, "segments", i}, out));
  }
  const Where traces_at{nullptr, "device_traces"};
  const Value& traces = Decoder::list(Decoder::field(root, "device_traces", snapshot), traces_at);
  for (std::size_t i = 0; i < traces.items.size(); ++i) {
    out.device_traces.push_back(d.trace(*traces.items[i], Where{nullptr, "device_traces", i}, out));
  }
  for (std::size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const Value& key = *root.items[i];
    if (key.kind != Kind::string) {
      out.dropped_keys.emplace_back("snapshot key that is not a string", 1);
      continue;
    }
    if (key.text == "segments" || key.text == "device_traces") continue;
    pickle::Writer w;
    pickle::write_value(w, *root.items[i + 1]);
    out.fields.emplace_back(std::string(key.text), w.finish());
  }
  d.finish_entry_extras(out);
  for (auto& dropped : d.dropped()) out.dropped_keys.push_back(std::move(dropped));
  if (const Value* settings = root.get("allocator_settings")) {
    out.has_allocator_settings = true;
    if (settings->kind == Kind::dict) {
      for (std::size_t i = 0; i + 1 < settings->items.size(); i += 2) {
        if (settings->items[i]->kind != Kind::string) continue;
        out.allocator_settings.emplace_back(std::string(settings->items[i]->text), python_repr(*settings->items[i + 1]));
      }
    }
  }
  return out;
}

SnapshotStartState snapshot_start_state(const TorchSnapshot& snapshot, int device) {
  SnapshotStartState st;
  for (const auto& seg : snapshot.segments) {
    if (seg.device != device) continue;
    st.segments[seg.address] = StartSegment{seg.total_size, seg.stream, seg.is_expandable};
    for (const auto& b : seg.blocks) {
      // As a trace's alloc would give it: the request (the block's own size is the allocator's rounding).
      if (b.live()) st.blocks[b.address] = StartBlock{b.requested_size, b.size, seg.stream, b.stack_id};
    }
  }
  if (device < 0 || static_cast<std::size_t>(device) >= snapshot.device_traces.size()) return st;
  const auto& trace = snapshot.device_traces[static_cast<std::size_t>(device)];
  for (auto it = trace.rbegin(); it != trace.rend(); ++it) {
    switch (it->action) {
      case Action::segment_alloc:
      case Action::segment_map: st.segments.erase(it->addr); break;
      case Action::segment_free:
      case Action::segment_unmap:
        st.segments[it->addr] = StartSegment{it->size, it->stream, it->action == Action::segment_unmap};
        break;
      case Action::alloc: st.blocks.erase(it->addr); break;
      case Action::free_completed: st.blocks[it->addr] = StartBlock{it->size, 0, it->stream, it->stack_id}; break;
      default: break;
    }
  }
  return st;
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
