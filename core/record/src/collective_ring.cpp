// CollectiveRing: the seqlock recipe of ring.cpp (Boehm, MSPC 2012) with one shared claim counter.
#include "oomflight/record/collective_ring.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

namespace oomflight {

static_assert(sizeof(Collective) == 8 * 8);

CollectiveRing::CollectiveRing(std::size_t capacity) {
  if (capacity == 0 || capacity > (std::size_t{1} << 24)) {
    throw std::invalid_argument("collective ring size " + std::to_string(capacity) + " is outside 1 .. 2^24");
  }
  const std::uint64_t slots = std::bit_ceil(static_cast<std::uint64_t>(capacity));
  mask_ = slots - 1;
  slots_ = std::make_unique<Slot[]>(slots);
}

CollectiveRing::~CollectiveRing() = default;

void CollectiveRing::push(const Collective& record) noexcept {
  std::uint64_t words[kWords];
  std::memcpy(words, &record, sizeof(words));
  for (;;) {
    const std::uint64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    Slot& slot = slots_[i & mask_];
    std::uint64_t seq = slot.seq.load(std::memory_order_relaxed);
    // A newer lap already took the slot (this thread slept through a whole lap), or an older lap's writer is still
    // in it: never wait for it; give the index up and take the next.
    if (seq > 2 * i || (seq & 1) != 0 || !slot.seq.compare_exchange_strong(seq, 2 * i + 1, std::memory_order_relaxed)) {
      skipped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::atomic_thread_fence(std::memory_order_release);
    for (int k = 0; k < kWords; ++k) slot.words[k].store(words[k], std::memory_order_relaxed);
    slot.seq.store(2 * i + 2, std::memory_order_release);
    return;
  }
}

std::uint64_t CollectiveRing::recorded() const noexcept {
  return next_.load(std::memory_order_relaxed) - skipped_.load(std::memory_order_relaxed);
}

CollectiveRingCopy CollectiveRing::copy() const {
  CollectiveRingCopy out;
  const std::uint64_t claimed = next_.load(std::memory_order_acquire);
  const std::uint64_t skipped = skipped_.load(std::memory_order_relaxed);
  const std::uint64_t slots = mask_ + 1;
  out.records.reserve(static_cast<std::size_t>(std::min(claimed, slots)));
  for (std::uint64_t k = 0; k < slots; ++k) {
    const Slot& slot = slots_[k];
    const std::uint64_t before = slot.seq.load(std::memory_order_acquire);
    if (before == 0) continue;
    if ((before & 1) != 0) {  // a write in progress (an index claimed before the copy, counted in `claimed`)
      if (before / 2 < claimed) ++out.in_flight;
      continue;
    }
    if (before / 2 - 1 >= claimed) continue;  // claimed after the copy began
    std::uint64_t words[kWords];
    for (int w = 0; w < kWords; ++w) words[w] = slot.words[w].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_relaxed) != before) continue;
    std::memcpy(&out.records.emplace_back(), words, sizeof(words));
  }
  std::stable_sort(out.records.begin(), out.records.end(),
                   [](const Collective& a, const Collective& b) { return a.t_ns < b.t_ns; });
  out.recorded = claimed >= skipped ? claimed - skipped : 0;
  // Every record offered is kept, being written, or was overwritten by a newer one (skipped indices are no
  // records): exact once the writers are quiet, and the three always add up.
  const std::uint64_t kept = out.records.size();
  out.in_flight = std::min(out.in_flight, out.recorded - std::min(out.recorded, kept));
  out.overwritten = out.recorded - kept - out.in_flight;
  return out;
}

}  // namespace oomflight
