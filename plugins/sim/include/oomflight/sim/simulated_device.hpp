// A simulated CUDA device with a caching allocator modelled at the level a PyTorch trace records it:
// reserved segments and allocated blocks. It replays a snapshot's device trace against a chosen capacity.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "oomflight/analysis/allocator_replay.hpp"
#include "oomflight/format/torch_snapshot.hpp"
#include "oomflight/record/event.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight::sim {

/// Receives what the simulated device does, in order.
class EventSink {
 public:
  virtual ~EventSink() = default;
  /// One event (units as in oomflight::Event).
  virtual void event(Action action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                     std::int32_t stack_id) = 0;
  /// The device's figures after the event.
  virtual void memory(const MemoryStats& stats) = 0;
};

/// Why a replay stopped early.
struct OutOfMemory {
  std::size_t trace_index = 0;       ///< index of the trace entry that could not be served (or trace size)
  std::uint64_t requested_bytes = 0; ///< the allocation that failed (the oom event's size)
  std::uint64_t segment_bytes = 0;   ///< what the allocator tried to reserve for it (PyTorch's "Tried to allocate")
  std::uint64_t device_free_bytes = 0;
  std::uint64_t reserved_bytes = 0;  ///< after releasing every unused cached segment
  std::uint64_t allocated_bytes = 0;
  std::string message;               ///< as PyTorch words it: "CUDA out of memory. Tried to allocate <segment> ..."
};

/// Counters of trace entries that did not match the model (a consistent trace has none).
struct ReplayAnomalies {
  std::size_t alloc_outside_segments = 0;
  std::size_t free_of_unknown_block = 0;
  std::size_t free_of_unknown_segment = 0;
  /// With `modelled`: blocks that predate the trace which the model could not place where they were (with the
  /// configured rounding one would overlap the next); the device leaves them out as the model does.
  std::size_t start_blocks_not_modelled = 0;
};

/// The simulated device. Not thread-safe: one replaying thread.
class SimulatedDevice {
 public:
  /// Reconstructs the allocator's state at the start of the trace of `device` (segments and blocks that
  /// predate it: the snapshot's end state, walked back through the trace, each block with the frames of its
  /// alloc) and checks that it fits. When more was reserved at the start than `capacity_bytes`, the cached
  /// segments (no live block) are released first, as PyTorch's allocator would before failing.
  /// Throws std::invalid_argument naming the sizes when the segments holding live blocks alone exceed
  /// `capacity_bytes`, or when the snapshot has no trace for `device`.
  ///
  /// With `modelled` (`oomflight replay --alloc-conf`), the allocator's decisions are the model's under those
  /// settings (AllocatorReplay: where each block goes, which segments are reserved, what the retry path of a failed
  /// cudaMalloc gives back), and the trace gives only what the program did: each allocation's size and stream, each
  /// free, each empty_cache(). Without it, the trace's addresses and segments are taken as given. Throws
  /// std::invalid_argument for expandable_segments:True in `modelled` (not replayed yet: `oomflight whatif` models
  /// them).
  SimulatedDevice(const TorchSnapshot& snapshot, std::uint64_t capacity_bytes, int device = 0,
                  std::optional<AllocatorSettings> modelled = std::nullopt);

  /// Emits the start state into `sink`: a segment_alloc per segment reserved at the start, then an alloc per
  /// live block (by address, with its frames), then the figures. Call once, before the first replay(), so that
  /// a recording holds the blocks that predate the trace.
  void emit_start_state(EventSink& sink);

  /// Replays the whole trace once into `sink`. Every alloc, free_requested and free_completed is emitted in
  /// order with the trace's size; segment events are the model's own (it may release cached segments when
  /// memory runs short and reserve them again later, as PyTorch's allocator does). When a segment would exceed
  /// the capacity even after releasing every unused cached segment, emits an `oom` event (size = the requested
  /// allocation, addr = device free bytes, as PyTorch's trace does) and returns the failure.
  std::optional<OutOfMemory> replay(EventSink& sink);

  /// A block of `size` bytes that the job keeps from now on (a leak: `oomflight replay --rank-leak`), with the frames
  /// of `stack_id`: rewind() does not free it. It gets a segment of its own (its size rounded up to 2 MiB, above every
  /// address the trace holds), or, with `modelled`, whatever the model gives it. Emits its segment_alloc and alloc;
  /// returns the failure when it does not fit (after releasing the unused cached segments, as any allocation).
  std::optional<OutOfMemory> hold(std::uint64_t size, std::int32_t stack_id, EventSink& sink);

  /// Brings the model back to the trace's starting state, emitting the frees, allocs and segment events that
  /// takes, so that the next replay() starts where the trace started (one loop = one training step).
  std::optional<OutOfMemory> rewind(EventSink& sink);

  /// The device's figures. allocated counts each live block at PyTorch's block size (the request rounded up to
  /// 512 bytes, as the caching allocator rounds it); reserved counts segments. Events keep the requested bytes.
  MemoryStats stats() const;

  /// The allocator's state now, as PyTorch's snapshot would give it: every reserved segment, and every live block
  /// inside one (its request, its block size, whether a free was requested, the decoder's stack id). By address.
  struct State {
    struct Segment {
      std::uint64_t address, size, stream;
    };
    struct Block {
      std::uint64_t address, requested, block_bytes;
      std::int32_t stack_id;
      bool pending_free;
    };
    std::vector<Segment> segments;
    std::vector<Block> blocks;
  };
  State state() const;

  /// Called by replay() with each trace entry's time_us (entries without one are not paced) before the entry is
  /// served: a pacer that sleeps until that time keeps the trace's own timing (`oomflight replay --pace`).
  void set_pacer(std::function<void(std::int64_t time_us)> pacer) { pacer_ = std::move(pacer); }
  const ReplayAnomalies& anomalies() const { return anomalies_; }
  std::uint64_t capacity() const { return capacity_; }
  /// Changes the capacity from now on (bytes), as when another process takes memory on the GPU: segments already
  /// reserved stay; the next segment that does not fit releases the unused cached ones first, then fails.
  void set_capacity(std::uint64_t capacity_bytes);
  /// Whether the allocator's decisions are the model's (`modelled` given).
  bool modelled() const { return model_.has_value(); }
  /// Cached segments released at the start to fit the capacity (0 when the start state fitted as it was).
  std::uint64_t start_released_bytes() const { return start_released_; }
  /// Reserved and allocated bytes at the trace's start (after that release).
  std::uint64_t start_reserved_bytes() const { return start_reserved_; }
  std::uint64_t start_allocated_bytes() const { return start_allocated_; }

 private:
  struct Segment {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::uint64_t live_bytes = 0;
    std::size_t live_blocks = 0;
    bool reserved = true;  // false: released by the model, may be reserved again
  };
  struct Block {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::uint64_t segment = 0;  // segment address, or ~0 when outside every segment
    std::int32_t stack_id = kNoStack;
    std::uint64_t block_bytes = 0;  // what it counts in allocated: the allocator's block size
    bool pending_free = false;      // free_requested seen, free_completed not yet
  };
  // An allocation the device must serve: its bytes, the segment it needs, its stream and frames.
  struct Request {
    std::uint64_t bytes = 0;
    std::uint64_t segment_bytes = 0;
    std::uint64_t stream = 0;
    std::int32_t stack_id = kNoStack;
  };

  Segment* segment_of(std::uint64_t addr);
  std::optional<OutOfMemory> reserve(std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                                     const Request& request, std::size_t index, EventSink& sink);
  void release_unused(EventSink& sink);
  /// `block_size`: the block as the allocator sized it, where the snapshot says (0: the request rounded up).
  void take_block(std::uint64_t addr, std::uint64_t size, std::uint64_t stream, std::int32_t stack_id,
                  std::uint64_t block_size = 0);
  void drop_block(std::uint64_t addr);
  OutOfMemory out_of_memory(const Request& request, std::size_t index, EventSink& sink);
  Request request_for_segment(std::size_t index) const;
  void publish(EventSink& sink);
  // The modelled allocator's (model_) replay and rewind, and its segment changes applied and emitted.
  std::optional<OutOfMemory> replay_modelled(EventSink& sink);
  std::optional<OutOfMemory> rewind_modelled(EventSink& sink);
  void apply(const std::vector<SegmentChange>& changes, std::int32_t stack_id, EventSink& sink);

  const std::vector<TraceEntry>& trace_;
  std::uint64_t capacity_;
  int device_;
  std::map<std::uint64_t, Segment> segments_;
  std::unordered_map<std::uint64_t, Block> blocks_;
  std::map<std::uint64_t, Segment> start_segments_;
  std::unordered_map<std::uint64_t, Block> start_blocks_;
  std::uint64_t reserved_ = 0, allocated_ = 0, peak_reserved_ = 0, peak_allocated_ = 0;
  std::uint64_t start_reserved_ = 0, start_allocated_ = 0, start_released_ = 0;
  ReplayAnomalies anomalies_;
  std::function<void(std::int64_t)> pacer_;
  std::optional<AllocatorReplay> model_;
  // hold(): the blocks kept (by address; with model_, by the key the model knows them by), and the next segment's
  // address (or key).
  std::set<std::uint64_t> held_;
  std::uint64_t next_held_ = 0;
  std::uint64_t failed_ = 0;  // with model_: oom entries asked again (their keys)
};

}  // namespace oomflight::sim
