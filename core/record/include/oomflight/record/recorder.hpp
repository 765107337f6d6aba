// The recorder: a rank's ring, its stack table, its batch counter and its memory gauges (one set per device).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <mutex>
#include <span>

#include "oomflight/api.h"
#include "oomflight/record/batch_table.hpp"
#include "oomflight/record/clock.hpp"
#include "oomflight/record/collective_ring.hpp"
#include "oomflight/record/communicator_table.hpp"
#include "oomflight/record/context_log.hpp"
#include "oomflight/record/event.hpp"
#include "oomflight/record/event_clock.hpp"
#include "oomflight/record/ring.hpp"
#include "oomflight/record/stack_table.hpp"

namespace oomflight {

/// One device's memory as the source (allocator, simulator) last reported it. Bytes. "Allocated" and
/// "reserved" as PyTorch's caching allocator defines them (torch.cuda.memory_allocated / memory_reserved).
struct MemoryStats {
  std::uint64_t allocated_bytes = 0;       ///< in live blocks
  std::uint64_t reserved_bytes = 0;        ///< in segments the allocator holds (allocated + cached)
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0; ///< 0 when unknown
  std::uint64_t device_free_bytes = 0;     ///< as the driver reports it; 0 when unknown
  /// The process's own limit below the device's capacity (torch.cuda.set_per_process_memory_fraction); 0: none.
  std::uint64_t memory_cap_bytes = 0;
};

/// Devices whose gauges a recorder keeps: ordinals 0 .. kMaxDevices - 1 (one node's GPUs with a wide margin).
inline constexpr int kMaxDevices = 64;

/// Resolves deferred stack ids (see Recorder::set_stack_resolver): for each of the `count` ids in `deferred`
/// (each <= kFirstDeferredStack), stores a stack id of the recorder's StackTable in stack_ids[i], or kNoStack.
/// Returns within about `timeout_ms`; returns 0, or non-zero when it resolved nothing.
using StackResolver = int (*)(void* user, const std::int32_t* deferred, std::size_t count, std::int32_t* stack_ids,
                              std::uint32_t timeout_ms);

/// Event stack ids at or below this are deferred: a source (the PyTorch plugin) keeps the call site it cannot
/// symbolise on the hot path and names it by such an id; freeze() turns them into interned stacks.
inline constexpr std::int32_t kFirstDeferredStack = -2;

/// Everything a dump needs from one rank, copied at the moment of the trigger.
struct FrozenHistory {
  RingCopy ring;
  StackTableCopy stacks;
  int device = 0;                     ///< the device whose gauges `memory` holds
  MemoryStats memory;
  /// The device memory the process held outside the caching allocator, as last set (Recorder::
  /// set_outside_allocator); -1: unknown.
  std::int64_t outside_allocator_bytes = -1;
  std::int64_t batch = -1;
  std::uint64_t oom_events = 0;       ///< oom events recorded up to the freeze
  std::int64_t freeze_t_ns = 0;       ///< monotonic ns
  std::int64_t anchor_monotonic_ns = 0;  ///< taken back to back with anchor_realtime_ns
  std::int64_t anchor_realtime_ns = 0;
  /// The per-batch figures, oldest first; the last row is the batch running at the freeze (end_t_ns 0).
  BatchTableCopy batches;
  /// The rank's environment and the job's metadata (ContextLog::copy()).
  std::vector<ContextEntry> context;
  /// Events whose deferred stack id the resolver did not turn into a stack (they carry kNoStack).
  std::uint64_t unresolved_stacks = 0;
  /// The collective history (stamps in ns, like the events') and the communicators registered.
  CollectiveRingCopy collectives;
  std::vector<CommunicatorInfo> communicators;
};

/// Records events into the ring. One per process.
///
/// Thread-safety: record() and set_memory() are safe from any thread and lock-free (record() is the ring's push
/// plus an rdtsc or a CLOCK_MONOTONIC read); mark_batch() takes the batch table's mutex (once per batch);
/// intern_stack() takes the stack table's mutex; freeze() may run concurrently with all of them.
class OOMFLIGHT_API Recorder {
 public:
  /// Keeps the newest `max_entries` events. Stamps them with the invariant TSC where there is one and
  /// `allow_tsc` is true (converted to CLOCK_MONOTONIC at freeze), else with CLOCK_MONOTONIC (see EventClock).
  /// Keeps the newest `max_batches` rows of per-batch figures (BatchTable). Throws std::invalid_argument when
  /// max_entries is outside 1 .. 2^30 or max_batches is 0, std::bad_alloc when the ring (64 bytes per slot)
  /// cannot be allocated.
  explicit Recorder(std::size_t max_entries, bool allow_tsc = true, std::size_t max_batches = 10000);

  /// Records an event stamped now with the current batch. Returns false if the ring dropped it (see Ring::push).
  /// Units as in Event; flags: kEvent* bits. Wait-free: no allocation, lock or system call.
  bool record(Action action, std::int16_t device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
              std::int32_t stack_id = kNoStack, std::uint8_t flags = 0) noexcept {
    if (action == Action::oom) oom_events_.fetch_add(1, std::memory_order_relaxed);
    Event e;
    e.t_ns = clock_.now();  // raw ticks until freeze() converts them
    e.addr = addr;
    e.size = size;
    e.stream = stream;
    e.batch = batch_.load(std::memory_order_relaxed);
    e.stack_id = stack_id;
    e.device = device;
    e.action = action;
    e.flags = flags;
    return ring_.push(e);
  }

  /// Records a collective or point-to-point record stamped now (by the events' clock, so that both histories share
  /// one time line) with the current batch; the record's own t_ns and batch are ignored. Lock-free, no allocation.
  void record_collective(Collective record) noexcept {
    record.t_ns = clock_.now();
    record.batch = batch_.load(std::memory_order_relaxed);
    collectives_.push(record);
  }
  /// Registers a communicator (CommunicatorTable::add). Throws std::bad_alloc.
  void register_communicator(CommunicatorInfo info) { communicators_.add(std::move(info)); }
  /// Records the collective ring keeps.
  static constexpr std::size_t kMaxCollectives = 16384;
  /// Ends the running batch (its row goes to the batch table: the current device's figures, the batch's own
  /// peaks, its event counts), starts batch `batch` (>= 0) with its peaks reset to the current figures, and
  /// records a `step` event for it. Marking the running batch again does nothing: it is still that batch.
  void mark_batch(std::int64_t batch) noexcept;

  /// The row of the batch the last mark_batch() ended (nothing before the second one). Takes the batch table's mutex.
  std::optional<BatchStats> last_ended_batch() const;

  /// The current batch, -1 before the first mark_batch().
  std::int64_t batch() const noexcept { return batch_.load(std::memory_order_relaxed); }

  /// Interns a stack (innermost frame first) for use as an event's stack_id. Throws as StackTable::intern.
  std::int32_t intern_stack(std::span<const FrameRef> frames) { return stacks_.intern(frames); }

  /// Publishes one device's memory figures (relaxed atomic stores; cheap enough to call after every event) and
  /// makes it the current device; raises the running batch's own peaks (BatchStats) where these are higher.
  /// Returns false, and stores nothing, for a device outside 0 .. kMaxDevices - 1.
  bool set_memory(int device, const MemoryStats& stats) noexcept;
  /// The figures last published for `device` (zeros when none, or when the device is out of range).
  MemoryStats memory(int device) const noexcept;
  /// The device memory this process holds outside the caching allocator, in bytes (-1: unknown), as its source last
  /// measured it (the session's NVML sample, process_device_memory.hpp): each batch's row and each freeze carry the
  /// figure set last. Lock-free; any thread.
  void set_outside_allocator(std::int64_t bytes) noexcept { outside_.store(bytes, std::memory_order_relaxed); }
  std::int64_t outside_allocator() const noexcept { return outside_.load(std::memory_order_relaxed); }

  /// The device that published gauges last; 0 before any did.
  int current_device() const noexcept { return current_device_.load(std::memory_order_relaxed); }

  /// The rank's context (environment, metadata), frozen with the history. Thread-safe.
  ContextLog& context() noexcept { return context_; }

  /// Number of oom events recorded so far.
  std::uint64_t oom_events() const noexcept { return oom_events_.load(std::memory_order_relaxed); }

  /// Copies the history (ring, stacks, the gauges of `device`, or of current_device() when `device` is outside
  /// 0 .. kMaxDevices - 1) without stopping writers. Allocates (~1 ms per 100k events), reusing `storage` for
  /// the events when given (see Ring::copy); throws std::bad_alloc. Deferred stack ids in the copy go to the
  /// stack resolver (set_stack_resolver) before the stack table is copied, which may add up to the resolver's
  /// timeout; without a resolver, or where it gives none, they become kNoStack (counted in unresolved_stacks).
  FrozenHistory freeze(int device = -1, std::vector<Event> storage = {}) const;

  /// Registers the resolver freeze() calls with the distinct deferred stack ids of its copy (nullptr: none).
  /// `user` is passed back. The resolver runs on the freezing thread (a failing thread, the watcher, or the
  /// thread that closes a snapshot window) and may call intern_stack(). Thread-safe.
  void set_stack_resolver(StackResolver resolver, void* user) noexcept;
  /// The time the resolver is given per freeze (ms); the session derives it from OOMFLIGHT_DUMP_TIMEOUT.
  void set_resolve_timeout(std::uint32_t timeout_ms) noexcept { resolve_timeout_ms_.store(timeout_ms); }

  /// The ring, for readers that copy it themselves (freeze() is the usual way): its events carry raw stamps of
  /// clock(), not ns. Thread-safe to read.
  const Ring& ring() const noexcept { return ring_; }
  /// The stack table, for sources that intern whole batches of stacks (the snapshot decoder).
  StackTable& stacks() noexcept { return stacks_; }
  /// The clock that stamps events.
  const EventClock& clock() const noexcept { return clock_; }

 private:
  struct Gauges {
    std::atomic<std::uint64_t> allocated{0}, reserved{0}, peak_allocated{0}, peak_reserved{0}, capacity{0}, free{0},
        cap{0};
  };

  // The running batch: where its counts started, and its own peaks (raised by set_memory, reset at mark_batch).
  struct RunningBatch {
    std::int64_t start_t_ns = 0;
    Ring::ActionCounts counts_at_start;
    std::uint64_t ooms_at_start = 0;
  };
  BatchStats running_row(const RunningBatch& running, std::int64_t batch, std::int64_t end_t_ns) const;

  EventClock clock_;
  Ring ring_;
  CollectiveRing collectives_{kMaxCollectives};
  CommunicatorTable communicators_;
  BatchTable batches_;
  std::optional<BatchStats> last_ended_;  // guarded by batch_mutex_
  ContextLog context_;
  mutable std::mutex batch_mutex_;  // guards running_ (mark_batch and freeze)
  RunningBatch running_;
  std::atomic<std::uint64_t> batch_peak_allocated_{0}, batch_peak_reserved_{0};
  StackTable stacks_;
  std::atomic<std::int64_t> batch_{-1};
  std::atomic<std::uint64_t> oom_events_{0};
  std::atomic<int> current_device_{0};
  std::atomic<std::int64_t> outside_{-1};
  mutable std::mutex resolver_mutex_;  // guards resolver_ and resolver_user_ (set rarely, read once per freeze)
  StackResolver resolver_ = nullptr;
  void* resolver_user_ = nullptr;
  std::atomic<std::uint32_t> resolve_timeout_ms_{2000};
  void resolve_deferred_stacks(FrozenHistory& h) const;
  std::array<Gauges, kMaxDevices> gauges_;
};

}  // namespace oomflight
