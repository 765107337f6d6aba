// Ring implementation. Slot memory ordering follows the seqlock recipe of Boehm, "Can Seqlocks Get Along With
// Programming Language Memory Models?" (MSPC 2012): payload words are relaxed atomics, the writer fences after
// marking the slot busy, the reader fences before re-reading the sequence number. Writer counts are published
// with release after the slot is complete, and a copy reads them with acquire before it scans the slots.
#include "oomflight/record/ring.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <mutex>
#include <pthread.h>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace oomflight {

struct alignas(64) Ring::Writer {
  std::atomic<std::uint64_t> owner{0};   // token of the thread that owns it; 0 when free
  std::atomic<std::uint64_t> pushed{0};  // events pushed through it, all complete: the next event's ordinal
  std::atomic<std::uint64_t> allocs{0};  // alloc events pushed through it (stored by the owner only)
  std::atomic<std::uint64_t> frees{0};   // free_completed events pushed through it (stored by the owner only)
  std::uint64_t next = 0;                // the unfinished chunk [next, end): touched by the owner only
  std::uint64_t end = 0;
};

namespace {

constexpr std::uint64_t kOrdinalBits = 48;  // 2.8e14 events per writer: years at any allocator's rate
constexpr std::uint64_t kOrdinalMask = (std::uint64_t{1} << kOrdinalBits) - 1;

std::atomic<std::uint64_t> g_next_serial{1};

// Rings alive now, by serial, so that a thread that exits can give its writers back without touching a ring
// that was destroyed first. Leaked on purpose: threads may exit during static destruction.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_set<std::uint64_t>& live_rings() {
  static auto* s = new std::unordered_set<std::uint64_t>;
  return *s;
}

// The writers this thread owns, given back when it exits (the next new thread continues their chunks).
struct ThreadLeases {
  struct Lease {
    std::uint64_t serial;
    Ring::Writer* writer;
  };
  std::vector<Lease> leases;
  ~ThreadLeases();
};

thread_local ThreadLeases t_leases;
// Set when t_leases is destroyed: glibc destroys the exiting thread's thread_local objects before the exit handlers
// run, and a record of that thread afterwards (a CUDA free during teardown) must not push into the destroyed vector.
// Trivially destructible, so it is still readable then.
thread_local bool t_leases_destroyed = false;

// Identifies the calling thread among live threads: its thread descriptor's address. Read with no TLS lookup
// (a dynamically loaded liboomflight would pay a __tls_get_addr call, 5 ns, on every event for a thread_local).
// Reused only after a thread has exited, and an exiting thread gives its writers back first (ThreadLeases).
std::uint64_t this_thread_token() noexcept { return static_cast<std::uint64_t>(pthread_self()); }

// Where a thread's writer index is hinted: descriptors are page-aligned and megabytes apart, so mix the bits.
std::size_t hint_index(std::uint64_t token) noexcept {
  return static_cast<std::size_t>((token * 0x9E3779B97F4A7C15ull) >> 56);  // 0 .. 255
}

}  // namespace

ThreadLeases::~ThreadLeases() {
  t_leases_destroyed = true;
  std::lock_guard lock(registry_mutex());
  for (const Lease& l : leases) {
    if (live_rings().contains(l.serial)) l.writer->owner.store(0, std::memory_order_release);
  }
}

Ring::Ring(std::size_t max_entries) : max_entries_(max_entries) {
  if (max_entries == 0 || max_entries > (std::size_t{1} << 30)) {
    throw std::invalid_argument("ring size " + std::to_string(max_entries) + " is outside 1 .. 2^30 entries");
  }
  const std::uint64_t slots = std::bit_ceil(static_cast<std::uint64_t>(max_entries + kMaxWriters * kChunk));
  mask_ = slots - 1;
  slots_ = std::make_unique<Slot[]>(slots);
  writers_ = std::make_unique<Writer[]>(kMaxWriters);
  serial_ = g_next_serial.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(registry_mutex());
  live_rings().insert(serial_);
}

Ring::~Ring() {
  std::lock_guard lock(registry_mutex());
  live_rings().erase(serial_);
}

Ring::Writer* Ring::writer_for_this_thread() noexcept {
  const std::uint64_t token = this_thread_token();
  Writer& hinted = writers_[hints_[hint_index(token)].load(std::memory_order_relaxed)];
  if (hinted.owner.load(std::memory_order_relaxed) == token) return &hinted;
  return acquire_writer();
}

// The slow path, once per thread and ring (or after the thread used another ring): find the writer this thread
// already owns, else take a free one, else a never-used one.
Ring::Writer* Ring::acquire_writer() noexcept {
  const std::uint64_t token = this_thread_token();
  const std::uint64_t used = std::min<std::uint64_t>(writers_used_.load(std::memory_order_acquire), kMaxWriters);
  Writer* mine = nullptr;
  for (std::uint64_t w = 0; w < used && mine == nullptr; ++w) {
    if (writers_[w].owner.load(std::memory_order_relaxed) == token) mine = &writers_[w];
  }
  if (mine == nullptr) {
    for (std::uint64_t w = 0; w < used && mine == nullptr; ++w) {
      std::uint64_t free = 0;
      if (writers_[w].owner.compare_exchange_strong(free, token, std::memory_order_acquire)) mine = &writers_[w];
    }
    while (mine == nullptr) {
      std::uint64_t u = writers_used_.load(std::memory_order_relaxed);
      if (u >= kMaxWriters) return nullptr;
      if (writers_used_.compare_exchange_weak(u, u + 1, std::memory_order_acq_rel)) {
        writers_[u].owner.store(token, std::memory_order_relaxed);
        mine = &writers_[u];
      }
    }
    try {
      // A thread past its thread_local destructors (exit handlers) owns the writer without a lease: it is ending,
      // and a thread that later gets its descriptor's address (its token) takes the writer on as its own.
      if (!t_leases_destroyed) {
        std::lock_guard lock(registry_mutex());
        std::erase_if(t_leases.leases, [](const ThreadLeases::Lease& l) { return !live_rings().contains(l.serial); });
        t_leases.leases.push_back({serial_, mine});
      }
    } catch (...) {  // std::bad_alloc: give the writer back rather than own it past this thread's exit
      mine->owner.store(0, std::memory_order_release);
      return nullptr;
    }
  }
  // Two live threads whose hints collide take turns through this path: slower, never wrong.
  hints_[hint_index(token)].store(static_cast<std::uint8_t>(mine - writers_.get()), std::memory_order_relaxed);
  return mine;
}

bool Ring::push(const Event& event) noexcept {
  Writer* w = writer_for_this_thread();
  if (w == nullptr) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::uint64_t words[6];
  std::memcpy(words, &event, sizeof(words));
  const std::uint64_t ordinal = w->pushed.load(std::memory_order_relaxed);  // only this thread stores it
  const std::uint64_t tag = (static_cast<std::uint64_t>(w - writers_.get()) << kOrdinalBits) | (ordinal & kOrdinalMask);
  for (;;) {
    if (w->next == w->end) {
      w->next = next_chunk_.fetch_add(1, std::memory_order_relaxed) * kChunk;
      w->end = w->next + kChunk;
    }
    const std::uint64_t i = w->next++;
    Slot& slot = slots_[i & mask_];
    std::uint64_t seq = slot.seq.load(std::memory_order_relaxed);
    if (seq > 2 * i) {  // a newer lap took this position while the chunk sat unfinished: take a fresh chunk
      w->next = w->end;
      continue;
    }
    // Odd: the writer of an older lap is still in it (preempted mid-write). Skip the slot; its event stays.
    if ((seq & 1) != 0 || !slot.seq.compare_exchange_strong(seq, 2 * i + 1, std::memory_order_relaxed)) continue;
    std::atomic_thread_fence(std::memory_order_release);
    for (int k = 0; k < 6; ++k) slot.words[k].store(words[k], std::memory_order_relaxed);
    slot.tag.store(tag, std::memory_order_relaxed);
    slot.seq.store(2 * i + 2, std::memory_order_release);
    w->pushed.store(ordinal + 1, std::memory_order_release);
    // Per-batch figures: the owner's own counters, a plain load and store (no locked instruction).
    if (event.action == Action::alloc) {
      w->allocs.store(w->allocs.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    } else if (event.action == Action::free_completed) {
      w->frees.store(w->frees.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    // The next push's slot is the next line of this chunk: start fetching it for writing now, so that its
    // sequence-number load does not stall on a cache miss (the slot array is far larger than L2).
    if (w->next != w->end) __builtin_prefetch(&slots_[w->next & mask_], 1);
    return true;
  }
}

std::uint64_t Ring::recorded() const noexcept {
  const std::uint64_t used = std::min<std::uint64_t>(writers_used_.load(std::memory_order_acquire), kMaxWriters);
  std::uint64_t n = dropped_.load(std::memory_order_relaxed);
  for (std::uint64_t w = 0; w < used; ++w) n += writers_[w].pushed.load(std::memory_order_relaxed);
  return n;
}

Ring::ActionCounts Ring::action_counts() const noexcept {
  const std::uint64_t used = std::min<std::uint64_t>(writers_used_.load(std::memory_order_acquire), kMaxWriters);
  ActionCounts c;
  for (std::uint64_t w = 0; w < used; ++w) {
    c.allocs += writers_[w].allocs.load(std::memory_order_relaxed);
    c.frees += writers_[w].frees.load(std::memory_order_relaxed);
  }
  return c;
}

RingCopy Ring::copy(std::vector<Event> storage) const {
  RingCopy out;
  out.events = std::move(storage);
  out.events.clear();
  // The moment of the copy: every writer's count. Events with a smaller ordinal are complete and visible.
  const std::uint64_t used = std::min<std::uint64_t>(writers_used_.load(std::memory_order_acquire), kMaxWriters);
  std::array<std::uint64_t, kMaxWriters> pushed{};
  std::uint64_t complete = 0;
  for (std::uint64_t w = 0; w < used; ++w) {
    pushed[w] = writers_[w].pushed.load(std::memory_order_acquire);
    complete += pushed[w];
  }
  out.dropped = dropped_.load(std::memory_order_relaxed);
  out.recorded = complete + out.dropped;

  const std::uint64_t slots = mask_ + 1;
  out.events.reserve(static_cast<std::size_t>(std::min(complete, slots)));
  // Start at the oldest positions (the next chunk to be claimed), so one writer's events come out in order.
  const std::uint64_t start = next_chunk_.load(std::memory_order_relaxed) * kChunk;
  for (std::uint64_t k = 0; k < slots; ++k) {
    const Slot& slot = slots_[(start + k) & mask_];
    const std::uint64_t before = slot.seq.load(std::memory_order_acquire);
    if (before == 0 || (before & 1) != 0) continue;  // empty, or being (over)written now
    // The words go to their place in the copy straight from registers: gathered in a local array first, they were
    // reread as 16-byte loads that could not be forwarded from the 8-byte stores (a stall on every event, 40% of
    // the copy's time in perf).
    const std::uint64_t w0 = slot.words[0].load(std::memory_order_relaxed);
    const std::uint64_t w1 = slot.words[1].load(std::memory_order_relaxed);
    const std::uint64_t w2 = slot.words[2].load(std::memory_order_relaxed);
    const std::uint64_t w3 = slot.words[3].load(std::memory_order_relaxed);
    const std::uint64_t w4 = slot.words[4].load(std::memory_order_relaxed);
    const std::uint64_t w5 = slot.words[5].load(std::memory_order_relaxed);
    const std::uint64_t tag = slot.tag.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_relaxed) != before) continue;  // a newer lap took it while we read
    const std::uint64_t writer = tag >> kOrdinalBits;
    if (writer >= used || (tag & kOrdinalMask) >= pushed[writer]) continue;  // pushed after the copy began
    auto* to = reinterpret_cast<unsigned char*>(&out.events.emplace_back());
    std::memcpy(to, &w0, 8);
    std::memcpy(to + 8, &w1, 8);
    std::memcpy(to + 16, &w2, 8);
    std::memcpy(to + 24, &w3, 8);
    std::memcpy(to + 32, &w4, 8);
    std::memcpy(to + 40, &w5, 8);
  }
  // Nearly sorted already: from the oldest position on, each writer's chunks come out in order. What breaks the
  // order is usually only a tail (the slots of unfinished chunks still hold an older lap's events, read last):
  // sort the part from the first break on and merge it in, O(n) for one writer instead of a full sort (5 ms of a
  // 100,000-event freeze once the ring had wrapped). Equal stamps keep their slot order either way.
  const auto by_stamp = [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; };
  const auto sorted_end = std::is_sorted_until(out.events.begin(), out.events.end(), by_stamp);
  if (sorted_end != out.events.end()) {
    std::stable_sort(sorted_end, out.events.end(), by_stamp);
    std::inplace_merge(out.events.begin(), sorted_end, out.events.end(), by_stamp);
  }
  if (out.events.size() > max_entries_) {
    out.events.erase(out.events.begin(), out.events.end() - static_cast<std::ptrdiff_t>(max_entries_));
  }
  // Every complete event is either kept or gone: overwritten by a newer lap, or beyond the bound.
  out.overwritten = complete - out.events.size();
  return out;
}

}  // namespace oomflight
