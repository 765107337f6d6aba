// Recorder: the parts that are not on the inline hot path.
#include "oomflight/record/recorder.hpp"

#include <algorithm>

#include "oomflight/base/log.hpp"

namespace oomflight {
namespace {
bool valid_device(int device) { return device >= 0 && device < kMaxDevices; }

void raise_to(std::atomic<std::uint64_t>& peak, std::uint64_t value) noexcept {
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
}  // namespace

Recorder::Recorder(std::size_t max_entries, bool allow_tsc, std::size_t max_batches)
    : clock_(allow_tsc), ring_(max_entries), batches_(max_batches) {}

BatchStats Recorder::running_row(const RunningBatch& running, std::int64_t batch, std::int64_t end_t_ns) const {
  BatchStats row;
  row.batch = batch;
  row.start_t_ns = running.start_t_ns;
  row.end_t_ns = end_t_ns;
  row.device = current_device();
  const MemoryStats m = memory(row.device);
  row.allocated_bytes = m.allocated_bytes;
  row.reserved_bytes = m.reserved_bytes;
  row.peak_allocated_bytes = std::max(batch_peak_allocated_.load(std::memory_order_relaxed), m.allocated_bytes);
  row.peak_reserved_bytes = std::max(batch_peak_reserved_.load(std::memory_order_relaxed), m.reserved_bytes);
  row.device_capacity_bytes = m.device_capacity_bytes;
  row.device_free_bytes = m.device_free_bytes;
  row.outside_allocator_bytes = outside_allocator();
  const Ring::ActionCounts now = ring_.action_counts();
  row.alloc_events = now.allocs - running.counts_at_start.allocs;
  row.free_events = now.frees - running.counts_at_start.frees;
  row.oom_events = oom_events() - running.ooms_at_start;
  return row;
}

void Recorder::mark_batch(std::int64_t batch) noexcept {
  {
    const std::lock_guard lock(batch_mutex_);
    const std::int64_t now = monotonic_ns();
    const std::int64_t ended = batch_.load(std::memory_order_relaxed);
    // The running batch marked again: one batch, not a second row of the same number (`oomflight run` marks batch 0
    // at start for the optimizer hook, and a job that numbers its own batches marks batch 0 too: two rows of batch
    // 0, the first of zeros, made every rank's trend of peaks a false one).
    if (batch == ended) return;
    if (ended >= 0) {
      last_ended_ = running_row(running_, ended, now);
      batches_.push(*last_ended_);
    }
    running_.start_t_ns = now;
    running_.counts_at_start = ring_.action_counts();
    running_.ooms_at_start = oom_events();
    const MemoryStats m = memory(current_device());
    batch_peak_allocated_.store(m.allocated_bytes, std::memory_order_relaxed);
    batch_peak_reserved_.store(m.reserved_bytes, std::memory_order_relaxed);
    batch_.store(batch, std::memory_order_relaxed);
  }
  record(Action::step, 0, 0, 0, 0);
}

std::optional<BatchStats> Recorder::last_ended_batch() const {
  const std::lock_guard lock(batch_mutex_);
  return last_ended_;
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
  g.cap.store(s.memory_cap_bytes, std::memory_order_relaxed);
  current_device_.store(device, std::memory_order_relaxed);
  raise_to(batch_peak_allocated_, s.allocated_bytes);
  raise_to(batch_peak_reserved_, s.reserved_bytes);
  return true;
}

MemoryStats Recorder::memory(int device) const noexcept {
  if (!valid_device(device)) return {};
  const Gauges& g = gauges_[static_cast<std::size_t>(device)];
  return MemoryStats{g.allocated.load(std::memory_order_relaxed),      g.reserved.load(std::memory_order_relaxed),
                     g.peak_allocated.load(std::memory_order_relaxed), g.peak_reserved.load(std::memory_order_relaxed),
                     g.capacity.load(std::memory_order_relaxed),       g.free.load(std::memory_order_relaxed),
                     g.cap.load(std::memory_order_relaxed)};
}

FrozenHistory Recorder::freeze(int device, std::vector<Event> storage) const {
  FrozenHistory h;
  h.freeze_t_ns = monotonic_ns();
  // Gauges and counters first: they describe the moment of the trigger, the copy takes a while.
  h.device = valid_device(device) ? device : current_device();
  h.memory = memory(h.device);
  h.outside_allocator_bytes = outside_allocator();
  h.batch = batch();
  h.oom_events = oom_events();
  {
    const std::lock_guard lock(batch_mutex_);
    h.batches = batches_.copy();
    if (h.batch >= 0) h.batches.rows.push_back(running_row(running_, h.batch, 0));  // the batch still running
  }
  h.ring = ring_.copy(std::move(storage));
  h.collectives = collectives_.copy();
  h.communicators = communicators_.copy();
  h.context = context_.copy();
  // The second anchor after the copy: every copied stamp lies between the two anchors, where the line is exact.
  const ClockAnchor anchor = clock_.anchor();
  const TickConversion to_ns = clock_.conversion(anchor);
  for (Event& e : h.ring.events) e.t_ns = to_ns(e.t_ns);
  for (Collective& c : h.collectives.records) c.t_ns = to_ns(c.t_ns);
  resolve_deferred_stacks(h);
  h.stacks = stacks_.copy();
  h.anchor_monotonic_ns = monotonic_ns();
  h.anchor_realtime_ns = realtime_ns();
  return h;
}

void Recorder::set_stack_resolver(StackResolver resolver, void* user) noexcept {
  const std::lock_guard lock(resolver_mutex_);
  resolver_ = resolver;
  resolver_user_ = user;
}

void Recorder::resolve_deferred_stacks(FrozenHistory& h) const {
  std::vector<std::int32_t> deferred;
  for (const Event& e : h.ring.events) {
    if (e.stack_id <= kFirstDeferredStack) deferred.push_back(e.stack_id);
  }
  if (deferred.empty()) return;
  std::sort(deferred.begin(), deferred.end());
  deferred.erase(std::unique(deferred.begin(), deferred.end()), deferred.end());
  std::vector<std::int32_t> ids(deferred.size(), kNoStack);
  StackResolver resolver = nullptr;
  void* user = nullptr;
  {
    const std::lock_guard lock(resolver_mutex_);
    resolver = resolver_;
    user = resolver_user_;
  }
  if (resolver != nullptr) {
    resolver(user, deferred.data(), deferred.size(), ids.data(), resolve_timeout_ms_.load());
  }
  // Only ids the table holds by now reach the archive: a resolver's bad answer must not make a dangling stack.
  const std::size_t interned = stacks_.size();
  for (Event& e : h.ring.events) {
    if (e.stack_id > kFirstDeferredStack) continue;
    const auto at = std::lower_bound(deferred.begin(), deferred.end(), e.stack_id) - deferred.begin();
    const std::int32_t id = ids[static_cast<std::size_t>(at)];
    const bool valid = id >= 0 && static_cast<std::size_t>(id) < interned;
    e.stack_id = valid ? id : kNoStack;
    if (!valid) ++h.unresolved_stacks;
  }
  if (h.unresolved_stacks > 0) {
    log().warn("{} events' call sites were not symbolised{} (they are recorded with no stack)", h.unresolved_stacks,
               resolver == nullptr ? " (no stack resolver is registered)" : "");
  }
}

}  // namespace oomflight
