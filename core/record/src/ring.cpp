// Ring implementation. Memory ordering follows the seqlock recipe of Boehm, "Can Seqlocks Get Along With
// Programming Language Memory Models?" (MSPC 2012): payload words are relaxed atomics, the writer fences
// after marking the slot busy, the reader fences before re-reading the sequence number.
#include "oomflight/record/ring.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

namespace oomflight {

Ring::Ring(std::size_t max_entries) : max_entries_(max_entries) {
  if (max_entries == 0 || max_entries > (std::size_t{1} << 30)) {
    throw std::invalid_argument("ring size " + std::to_string(max_entries) + " is outside 1 .. 2^30 entries");
  }
  const std::uint64_t slots = std::bit_ceil(static_cast<std::uint64_t>(max_entries));
  mask_ = slots - 1;
  slots_ = std::make_unique<Slot[]>(slots);
}

Ring::~Ring() = default;

bool Ring::push(const Event& event) noexcept {
  const std::uint64_t i = head_.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = slots_[i & mask_];
  std::uint64_t seq = slot.seq.load(std::memory_order_relaxed);
  // Busy (odd), or already holding index >= i: a lagging writer must not overwrite newer history.
  if ((seq & 1) != 0 || seq >= 2 * i + 2 ||
      !slot.seq.compare_exchange_strong(seq, 2 * i + 1, std::memory_order_relaxed)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::atomic_thread_fence(std::memory_order_release);
  std::uint64_t words[6];
  std::memcpy(words, &event, sizeof(words));
  for (int w = 0; w < 6; ++w) slot.words[w].store(words[w], std::memory_order_relaxed);
  slot.seq.store(2 * i + 2, std::memory_order_release);
  return true;
}

RingCopy Ring::copy() const {
  RingCopy out;
  const std::uint64_t head = head_.load(std::memory_order_acquire);
  const std::uint64_t first = head > max_entries_ ? head - max_entries_ : 0;
  out.recorded = head;
  out.overwritten = first;
  out.dropped = dropped_.load(std::memory_order_relaxed);
  out.events.reserve(head - first);
  for (std::uint64_t i = first; i < head; ++i) {
    const Slot& slot = slots_[i & mask_];
    const std::uint64_t before = slot.seq.load(std::memory_order_acquire);
    if (before != 2 * i + 2) {
      // Still being written, dropped by its writer, or already overwritten by a newer lap.
      if (before < 2 * i + 2) ++out.in_flight;
      else ++out.overwritten;
      continue;
    }
    std::uint64_t words[6];
    for (int w = 0; w < 6; ++w) words[w] = slot.words[w].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_relaxed) != before) {
      ++out.overwritten;  // a newer lap took the slot while we copied it
      continue;
    }
    Event e;
    std::memcpy(&e, words, sizeof(e));
    out.events.push_back(e);
  }
  return out;
}

}  // namespace oomflight
