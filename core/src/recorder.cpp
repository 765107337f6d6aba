// Recorder: the parts that are not on the inline hot path.
#include "oomflight/recorder.hpp"

namespace oomflight {

Recorder::Recorder(std::size_t max_entries) : ring_(max_entries) {}

void Recorder::mark_batch(std::int64_t batch) noexcept {
  batch_.store(batch, std::memory_order_relaxed);
  record(Action::step, 0, 0, 0, 0);
}

void Recorder::set_memory(const MemoryStats& s) noexcept {
  allocated_.store(s.allocated_bytes, std::memory_order_relaxed);
  reserved_.store(s.reserved_bytes, std::memory_order_relaxed);
  peak_allocated_.store(s.peak_allocated_bytes, std::memory_order_relaxed);
  peak_reserved_.store(s.peak_reserved_bytes, std::memory_order_relaxed);
  capacity_.store(s.device_capacity_bytes, std::memory_order_relaxed);
  free_.store(s.device_free_bytes, std::memory_order_relaxed);
}

MemoryStats Recorder::memory() const noexcept {
  return MemoryStats{allocated_.load(std::memory_order_relaxed),     reserved_.load(std::memory_order_relaxed),
                     peak_allocated_.load(std::memory_order_relaxed), peak_reserved_.load(std::memory_order_relaxed),
                     capacity_.load(std::memory_order_relaxed),      free_.load(std::memory_order_relaxed)};
}

FrozenHistory Recorder::freeze() const {
  FrozenHistory h;
  h.freeze_t_ns = monotonic_ns();
  // Gauges and counters first: they describe the moment of the trigger, the copy takes a while.
  h.memory = memory();
  h.batch = batch();
  h.oom_events = oom_events();
  h.ring = ring_.copy();
  h.stacks = stacks_.copy();
  h.anchor_monotonic_ns = monotonic_ns();
  h.anchor_realtime_ns = realtime_ns();
  return h;
}

}  // namespace oomflight
