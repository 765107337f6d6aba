#include "headroom_watch.hpp"

#include <fmt/format.h>

#include "oomflight/base/units.hpp"

namespace oomflight {

MemoryLimit memory_limit(const MemoryStats& m) noexcept {
  const std::uint64_t capacity = m.device_capacity_bytes, cap = m.memory_cap_bytes;
  if (cap != 0 && (capacity == 0 || cap < capacity)) return {cap, true};
  return {capacity, false};
}

std::uint64_t share_of(std::uint64_t limit, std::uint32_t share_ppm) noexcept {
  // (limit / 10^6) * ppm <= limit, and (limit % 10^6) * ppm < 10^12: neither overflows.
  return limit / 1000000 * share_ppm + limit % 1000000 * share_ppm / 1000000;
}

std::string percent_text(std::uint32_t share_ppm) {
  std::string text = fmt::format("{:.4f}", share_ppm / 1e4);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text + "%";
}

HeadroomWatch::HeadroomWatch(std::uint32_t share_ppm) noexcept : share_ppm_(share_ppm) {
  for (auto& a : armed_) a.store(true, std::memory_order_relaxed);
  for (auto& l : last_in_use_) l.store(UINT64_MAX, std::memory_order_relaxed);
}

void HeadroomWatch::observe(int device, const MemoryStats& m, std::int64_t batch, std::uint64_t outside) noexcept {
  if (device < 0 || device >= kMaxDevices) return;
  const auto d = static_cast<std::size_t>(device);
  const MemoryLimit limit = memory_limit(m);
  if (limit.bytes == 0) return;  // no capacity published yet: nothing to measure against (looked at again later)
  // A cap bounds the allocator's reserved alone; the device's capacity is shared with what lies outside it.
  const std::uint64_t extra = limit.cap ? 0 : outside;
  const std::uint64_t in_use = m.reserved_bytes + extra < m.reserved_bytes ? UINT64_MAX - 1 : m.reserved_bytes + extra;
  if (last_in_use_[d].load(std::memory_order_relaxed) == in_use) return;  // an allocation's: reserved did not move
  last_in_use_[d].store(in_use, std::memory_order_relaxed);
  const std::uint64_t threshold = share_of(limit.bytes, share_ppm_);
  std::atomic<bool>& armed = armed_[d];
  if (in_use >= threshold) {
    if (!armed.load(std::memory_order_relaxed)) return;
    int empty = kEmpty;
    if (!slot_.compare_exchange_strong(empty, kFilling, std::memory_order_acquire)) {
      last_in_use_[d].store(UINT64_MAX, std::memory_order_relaxed);  // another device's crossing waits: retry later
      return;
    }
    if (!armed.exchange(false, std::memory_order_relaxed)) {
      // Another thread's crossing of this device won between the look above and the slot: it is the one kept.
      slot_.store(kEmpty, std::memory_order_release);
      return;
    }
    crossing_ = Crossing{device,
                         batch,
                         m.reserved_bytes,
                         outside,
                         limit.bytes,
                         m.device_capacity_bytes,
                         m.memory_cap_bytes,
                         m.device_free_bytes,
                         limit.cap};
    slot_.store(kFull, std::memory_order_release);
    return;
  }
  if (!armed.load(std::memory_order_relaxed) && threshold - in_use >= share_of(limit.bytes, kRearmPpm)) {
    armed.store(true, std::memory_order_relaxed);
  }
}

std::optional<DumpRequest> HeadroomWatch::take() {
  int full = kFull;
  if (!slot_.compare_exchange_strong(full, kTaking, std::memory_order_acquire)) return std::nullopt;
  const Crossing c = crossing_;
  // The request's words allocate: should that fail, the crossing is kept for a later turn.
  struct KeepUnlessTaken {
    std::atomic<int>& slot;
    bool taken = false;
    ~KeepUnlessTaken() { slot.store(taken ? kEmpty : kFull, std::memory_order_release); }
  } keep{slot_};
  DumpRequest r;
  r.kind = DumpKind::headroom;
  r.device = c.device;
  r.batch = c.batch;
  r.device_capacity_bytes = c.capacity;
  r.memory_cap_bytes = c.cap;
  r.device_free_bytes = c.device_free;
  const std::string outside = c.outside == 0 || c.is_cap
                                  ? ""
                                  : fmt::format(" and {} outside the caching allocator", format_bytes(c.outside));
  r.reason = fmt::format("device {}: reserved {}{} of its {} {}, over OOMFLIGHT_HEADROOM_DUMP={} ({})", c.device,
                         format_bytes(c.reserved), outside, format_bytes(c.limit),
                         c.is_cap ? "per-process cap" : "capacity", percent_text(share_ppm_),
                         format_bytes(share_of(c.limit, share_ppm_)));
  keep.taken = true;
  return r;
}

}  // namespace oomflight
