// Writes a PyTorch memory snapshot (the dict of `torch.cuda.memory._snapshot()`, as `_dump_snapshot()` pickles
// it) from oomflight's decoded form (torch_snapshot.hpp), for pytorch.org/memory_viz, torch.cuda._memory_viz and
// every tool that reads such pickles. Field names and layout follow torch/cuda/memory.py (`_snapshot`'s
// documented Segment, Block and TraceEntry dicts); the pickle uses only the opcodes of pickle_writer.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "oomflight/api.h"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight {

/// Where the writer finds the frames of a stack id used in the snapshot. Identical frames must have the same
/// frame id: each frame dict is written once and referred to by memo afterwards (PyTorch shares its frame
/// dicts the same way), which keeps a 100k-entry trace's pickle small.
class OOMFLIGHT_API SnapshotFrameSource {
 public:
  virtual ~SnapshotFrameSource() = default;
  /// The frame ids of a stack, innermost first; empty for kNoStack or an unknown id.
  virtual std::span<const std::uint32_t> stack(std::int32_t stack_id) const = 0;
  /// A frame by id (views valid while the source lives).
  virtual FrameRef frame(std::uint32_t frame_id) const = 0;
};

/// The frames of a StackTableCopy (what decode_torch_snapshot filled).
class OOMFLIGHT_API StackTableFrames final : public SnapshotFrameSource {
 public:
  explicit StackTableFrames(const StackTableCopy& table) : table_(table) {}
  std::span<const std::uint32_t> stack(std::int32_t stack_id) const override;
  FrameRef frame(std::uint32_t frame_id) const override;

 private:
  const StackTableCopy& table_;
};

/// Pickles `snapshot` (protocol 4) and returns the bytes. Written per segment: device, address, total_size,
/// allocated_size, active_size, requested_size (sums over its blocks by state, as PyTorch sums them), stream,
/// segment_type, segment_pool_id (a tuple), is_expandable, frames (when its stack_id is not kNoStack) and blocks
/// (address, size, requested_size, state, frames when the block has a stack), blocks in the order given (they must
/// tile the segment: readers compute addresses from sizes). device_traces: one list per device, entries with
/// action, addr (an oom's is written as device_free, as PyTorch does), size, stream, time_us when >= 0, and frames
/// when the entry has a stack (PyTorch writes none for an entry recorded without context). The keys listed in
/// snapshot.omitted_*_keys are left out; snapshot.fields are written as top-level keys, their pickled values
/// re-read with the strict reader and written as they were (pickle::write_value). Pure; thread-safe for distinct
/// arguments. Throws std::length_error only for a string over 4 GiB, pickle::PickleError for a field that is not a
/// pickle.
OOMFLIGHT_API std::string write_torch_snapshot(const TorchSnapshot& snapshot, const SnapshotFrameSource& frames);

}  // namespace oomflight
