// PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`), decoded from the strict pickle reader's
// values. Field names follow torch/cuda/memory.py (`_snapshot`'s documented dict layout) and
// c10/cuda/CUDACachingAllocator.h (`TraceEntry`, `SegmentInfo`, `BlockInfo`).
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "oomflight/record/event.hpp"
#include "oomflight/api.h"
#include "oomflight/format/pickle.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight {

/// Thrown for a pickle that is valid but not a memory snapshot; the message names the field at fault
/// ("device_traces[0][12]: 'size' is missing").
struct SnapshotError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One entry of a device trace. Bytes; time_us is -1 when the snapshot has none (older PyTorch); stack_id is
/// kNoStack when the entry has no `frames` key (PyTorch writes none for an entry recorded without context).
struct TraceEntry {
  Action action = Action::alloc;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = -1;
  std::int32_t stack_id = kNoStack;  ///< in the StackTable given to the decoder
};

/// A block of a segment at the time of the snapshot. state: "active_allocated", "active_pending_free",
/// "inactive".
struct SnapshotBlock {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::string state;
  std::int32_t stack_id = kNoStack;
  bool live() const { return state != "inactive"; }
};

/// A segment (one cudaMalloc, or an expandable segment) at the time of the snapshot.
struct SnapshotSegment {
  int device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t allocated_size = 0;
  std::uint64_t active_size = 0;
  std::uint64_t stream = 0;
  std::string segment_type;  ///< "large" or "small"
  bool is_expandable = false;
  std::uint64_t segment_pool_id[2] = {};  ///< a CUDA graph's private pool; (0, 0): the default pools
  std::int32_t stack_id = kNoStack;       ///< the segment's `frames`; kNoStack when it has no such key
  std::vector<SnapshotBlock> blocks;
};

/// A decoded snapshot: the allocator's state at the dump (`segments`) and the trace that led there.
struct TorchSnapshot {
  std::vector<SnapshotSegment> segments;
  std::vector<std::vector<TraceEntry>> device_traces;  ///< one trace per device, oldest first
  bool has_allocator_settings = false;
  /// `allocator_settings` (PyTorch 2.1 on: PYTORCH_CUDA_ALLOC_CONF as the allocator parsed it), key by key; each
  /// value written as Python's repr would write a scalar ("True", "0.8", "'native'"), a list or dict shortened to
  /// at most 200 characters.
  std::vector<std::pair<std::string, std::string>> allocator_settings;
  bool has_time_us = false;
  std::size_t skipped_unknown_actions = 0;  ///< trace entries with an action this version does not know
  /// Every top-level key other than `segments` and `device_traces` (`allocator_settings`,
  /// `external_annotations`, any newer one), in the snapshot's order, its value pickled as it was
  /// (pickle::write_value): the memory_viz writer writes them back verbatim.
  std::vector<std::pair<std::string, std::string>> fields;
  /// The optional keys the snapshot's first trace entry, segment and block did not have (PyTorch writes them all
  /// or none, by version: "time_us" before 2.1, a block's "address" and "requested_size" before 2.0), which the
  /// writer leaves out too. A trace entry's optional keys: "stream", "time_us"; a segment's: "allocated_size",
  /// "active_size", "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable"; a block's:
  /// "address", "requested_size".
  std::vector<std::string> omitted_trace_keys, omitted_segment_keys, omitted_block_keys;
  /// Keys every trace entry had with one and the same value (PyTorch 2.6 on writes `compile_context` "N/A" and
  /// `user_metadata` "" on each entry), the value pickled: the writer puts them on every entry it writes.
  std::vector<std::pair<std::string, std::string>> trace_constants;
  /// Keys this reader does not carry, each with how many dicts had it ("trace entry 'user_metadata'" -> 12): an
  /// export of the import gives those dicts back without them.
  std::vector<std::pair<std::string, std::size_t>> dropped_keys;
};

/// A segment or block of the allocator's state at a trace's start (snapshot_start_state).
struct StartSegment {
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  bool is_expandable = false;
};
struct StartBlock {
  std::uint64_t size = 0;            ///< bytes as a trace's alloc gives them: the request (requested_size)
  std::uint64_t block_size = 0;      ///< the block as the allocator sized it, when the end state says; else 0
  std::uint64_t stream = 0;
  std::int32_t stack_id = kNoStack;  ///< the frames of its alloc (PyTorch records a free with them)
};

/// The allocator's state on `device` when the snapshot's trace begins: the snapshot's end state (segments, and
/// blocks that are active_allocated or active_pending_free), walked back through the trace newest first (an
/// alloc removes its block, a free_completed restores it, segment_alloc/map remove the segment, segment_free/unmap
/// restore it). Blocks and segments by address. Pure.
struct SnapshotStartState {
  std::map<std::uint64_t, StartSegment> segments;
  std::map<std::uint64_t, StartBlock> blocks;
};
OOMFLIGHT_API SnapshotStartState snapshot_start_state(const TorchSnapshot& snapshot, int device);

/// Decodes a snapshot from a parsed pickle. Frames become interned stacks in `stacks` (innermost first).
/// Throws SnapshotError naming the missing or mistyped field, or when the segments, blocks and trace entries
/// decoded would outnumber the values in the pickle (`doc.value_count()`): PyTorch writes every entry as its
/// own dict, so only a pickle that shares entries through the memo gets there, and such a pickle can make
/// 8 KB decode to millions of entries. Memory is therefore bounded by the Document's own (pickle::Limits).
OOMFLIGHT_API TorchSnapshot decode_torch_snapshot(const pickle::Document& doc, StackTable& stacks);

/// Reads and decodes a snapshot file. Throws std::runtime_error (unreadable file), pickle::PickleError (refused
/// pickle) or SnapshotError, each message starting with the path.
OOMFLIGHT_API TorchSnapshot read_torch_snapshot(const std::string& path, StackTable& stacks);

}  // namespace oomflight
