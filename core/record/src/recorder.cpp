// Recorder: the parts that are not on the inline hot path.
#include "oomflight/record/recorder.hpp"

namespace oomflight {
namespace {
bool valid_device(int device) { return device >= 0 && device < kMaxDevices; }
}  // namespace

Recorder::Recorder(std::size_t max_entries, bool allow_tsc) : clock_(allow_tsc), ring_(max_entries) {}

void Recorder::mark_batch(std::int64_t batch) noexcept {
  batch_.store(batch, std::memory_order_relaxed);
  record(Action::step, 0, 0, 0, 0);
}

bool Recorder::set_memory(int device, const MemoryStats& s) noexcept {
  if (!valid_device(device)) return false;
  Gauges& g = gauges_[static_cast<std::size_t>(device)];
  g.allocated.store(s.allocated_bytes, std::memory_order_relaxed);
  g.reserved.store(s.reserved_bytes, std::memory_order_relaxed);
  g.peak_allocated.store(s.peak_allocated_bytes, std::memory_order_relaxed);
  g.peak_reserved.store(s.peak_reserved_bytes, std::memory_order_relaxed);
  g.capacity.store(s.device_capacity_bytes, std::memory_order_relaxed);
  g.free.store(s.device_free_bytes, std::memory_order_relaxed);
  current_device_.store(device, std::memory_order_relaxed);
  return true;
}

MemoryStats Recorder::memory(int device) const noexcept {
  if (!valid_device(device)) return {};
  const Gauges& g = gauges_[static_cast<std::size_t>(device)];
  return MemoryStats{g.allocated.load(std::memory_order_relaxed),      g.reserved.load(std::memory_order_relaxed),
                     g.peak_allocated.load(std::memory_order_relaxed), g.peak_reserved.load(std::memory_order_relaxed),
                     g.capacity.load(std::memory_order_relaxed),       g.free.load(std::memory_order_relaxed)};
}

FrozenHistory Recorder::freeze(int device) const {
  FrozenHistory h;
  h.freeze_t_ns = monotonic_ns();
  // Gauges and counters first: they describe the moment of the trigger, the copy takes a while.
  h.device = valid_device(device) ? device : current_device();
  h.memory = memory(h.device);
  h.batch = batch();
  h.oom_events = oom_events();
  h.ring = ring_.copy();
  // The second anchor after the copy: every copied stamp lies between the two anchors, where the line is exact.
  const ClockAnchor anchor = clock_.anchor();
  for (Event& e : h.ring.events) e.t_ns = clock_.to_monotonic_ns(e.t_ns, anchor);
  h.stacks = stacks_.copy();
  h.anchor_monotonic_ns = monotonic_ns();
  h.anchor_realtime_ns = realtime_ns();
  return h;
}

}  // namespace oomflight
