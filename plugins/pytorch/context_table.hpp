// The Python contexts of live events, kept until a dump needs them. torch's caching allocator hands the trace
// tracker each TraceEntry with the context it gathered (a shared_ptr to a CapturedTraceback) while it holds the
// device's mutex, and possibly the GIL: symbolising there is impossible (it needs the GIL) and interning would
// lock and allocate. So the tracker only copies the pointer into a slot of this table (one atomic increment of
// the context's reference count) and records the event with a deferred stack id that names the slot; liboomflight
// asks for those ids at the freeze (oomflight_set_stack_resolver), and the extension symbolises them then.
//
// The table has 2 x `keep` slots, `keep` being the events the history keeps (OOMFLIGHT_MAX_ENTRIES): an event
// the ring still holds is one of the newest `keep`, so its slot has not been reused. Dropping a context may run
// torch's release code (a mutex and a vector in torch's CapturedTraceback), so the tracker never does: it writes
// only empty slots, and reclaim(), on a helper thread, empties the slots of events the history no longer keeps.
// A tracker that finds its slot still full (the helper fell a whole `keep` events behind) records the event with
// no stack and counts it (busy()).
//
// Header-only and templated on the pointer type: std::shared_ptr<c10::GatheredContext> in the extension, any
// shared_ptr in the tests.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

namespace oomflight::torch_plugin {

template <typename Ptr>
class ContextTable {
 public:
  /// Keeps contexts for the newest `keep` events (>= 1). Allocates 2 x keep slots of about 40 bytes; throws
  /// std::invalid_argument for keep 0 or above kMaxKeep, std::bad_alloc.
  static constexpr std::size_t kMaxKeep = std::size_t{1} << 28;
  explicit ContextTable(std::size_t keep) : keep_(keep), slot_count_(2 * keep) {
    if (keep == 0 || keep > kMaxKeep) {
      throw std::invalid_argument("ContextTable: keep must be 1 .. 2^28 events");
    }
    // Deferred ids are -2 - (seq mod modulus_), above -2^30 (the ids below are python_stacks.hpp's); the modulus
    // is a multiple of the slot count, so that the id names the slot.
    constexpr std::uint64_t kIds = (std::uint64_t{1} << 30) - 2;
    modulus_ = kIds / slot_count_ * slot_count_;
    slots_ = std::make_unique<Slot[]>(slot_count_);
  }

  /// The hot path (the allocator's mutex held): keeps `context` and returns its deferred id (<= -2), or -1 for a
  /// null context or a slot not yet emptied. Wait-free: no lock, no allocation, never drops a context.
  std::int32_t put(const Ptr& context) noexcept {
    if (!context) return -1;
    const std::uint64_t seq = next_.fetch_add(1, std::memory_order_relaxed);
    Slot& s = slots_[seq % slot_count_];
    std::uint32_t expected = kEmpty;
    if (!s.state.compare_exchange_strong(expected, kWriting, std::memory_order_acquire, std::memory_order_relaxed)) {
      busy_.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
    s.context = context;  // the slot was empty: a reference count increment, nothing released
    s.seq = seq;
    s.stack_id = -1;
    s.state.store(kFull, std::memory_order_release);
    return deferred_id(seq);
  }

  /// Empties the slots of events older than the newest `keep` (dropping their contexts here, on the caller's
  /// thread). One caller at a time (the helper thread). Returns the slots emptied.
  std::size_t reclaim() noexcept {
    const std::uint64_t next = next_.load(std::memory_order_relaxed);
    if (next <= keep_) return 0;
    const std::uint64_t end = next - keep_;
    std::size_t emptied = 0;
    // A cursor far behind (no reclaim for a whole table) covers each slot once.
    std::uint64_t seq = end - reclaim_cursor_ > slot_count_ ? end - slot_count_ : reclaim_cursor_;
    for (; seq < end; ++seq) {
      Slot& s = slots_[seq % slot_count_];
      std::uint32_t expected = kFull;
      if (!s.state.compare_exchange_strong(expected, kBusy, std::memory_order_acquire)) continue;
      // A slot holding this seq or an older one of the same index (a put that was slow to write it) is stale.
      if (s.seq <= seq) {
        s.context.reset();
        ++emptied;
        s.state.store(kEmpty, std::memory_order_release);
      } else {
        s.state.store(kFull, std::memory_order_release);
      }
    }
    reclaim_cursor_ = end;
    return emptied;
  }

  /// What a deferred id names, if its slot still holds that event's context: a copy of the context, and the
  /// stack id remembered for it (-1 if none yet). Not for the hot path (it may wait for a busy slot briefly).
  struct Found {
    Ptr context;
    std::int32_t stack_id = -1;
    bool found = false;
  };
  Found find(std::int32_t deferred) noexcept {
    Found out;
    Slot* s = lock_slot(deferred);
    if (s == nullptr) return out;
    out.context = s->context;
    out.stack_id = s->stack_id;
    out.found = true;
    s->state.store(kFull, std::memory_order_release);
    return out;
  }

  /// Remembers the interned stack of a deferred id, so that a later freeze does not symbolise it again.
  void remember(std::int32_t deferred, std::int32_t stack_id) noexcept {
    Slot* s = lock_slot(deferred);
    if (s == nullptr) return;
    s->stack_id = stack_id;
    s->state.store(kFull, std::memory_order_release);
  }

  /// A stack resolver's body (oomflight_stack_resolver): ids[i] for each deferred[i] from the stack remembered
  /// for it, else from `symbolize(contexts, their_deferred_ids, stack_ids)`, called once with the contexts still
  /// to symbolise; it fills stack_ids (one per context; -1 where it cannot) and returns false when it gave up
  /// (its deadline): the rest stay -1 (work that finishes later may remember() its ids itself). What it interned
  /// is remembered for the next freeze. Returns the ids resolved.
  template <typename Symbolize>
  std::size_t resolve(const std::int32_t* deferred, std::size_t count, std::int32_t* ids, Symbolize&& symbolize) {
    std::vector<Ptr> contexts;
    std::vector<std::int32_t> their_ids;
    std::vector<std::size_t> owners;
    std::size_t resolved = 0;
    for (std::size_t i = 0; i < count; ++i) {
      ids[i] = -1;
      Found f = find(deferred[i]);
      if (!f.found) continue;
      if (f.stack_id >= 0) {
        ids[i] = f.stack_id;
        ++resolved;
      } else if (f.context) {
        contexts.push_back(std::move(f.context));
        their_ids.push_back(deferred[i]);
        owners.push_back(i);
      }
    }
    if (contexts.empty()) return resolved;
    std::vector<std::int32_t> stack_ids(contexts.size(), -1);
    if (!symbolize(contexts, their_ids, stack_ids)) return resolved;
    for (std::size_t k = 0; k < owners.size() && k < stack_ids.size(); ++k) {
      if (stack_ids[k] < 0) continue;
      ids[owners[k]] = stack_ids[k];
      remember(deferred[owners[k]], stack_ids[k]);
      ++resolved;
    }
    return resolved;
  }

  /// Events recorded without a stack because their slot was not yet emptied.
  std::uint64_t busy() const noexcept { return busy_.load(std::memory_order_relaxed); }
  /// Contexts kept so far (put() calls with a context).
  std::uint64_t kept() const noexcept { return next_.load(std::memory_order_relaxed) - busy(); }
  std::size_t keep() const noexcept { return keep_; }

 private:
  static constexpr std::uint32_t kEmpty = 0, kWriting = 1, kFull = 2, kBusy = 3;
  struct Slot {
    std::atomic<std::uint32_t> state{kEmpty};
    std::int32_t stack_id = -1;  // written and read only by whoever moved state away from kFull / kEmpty
    std::uint64_t seq = 0;
    Ptr context;
  };

  std::int32_t deferred_id(std::uint64_t seq) const noexcept {
    return static_cast<std::int32_t>(-2 - static_cast<std::int64_t>(seq % modulus_));
  }

  // The slot of `deferred` in state kBusy if it holds that very event (the caller stores kFull back), else null.
  Slot* lock_slot(std::int32_t deferred) noexcept {
    if (deferred > -2) return nullptr;
    const std::uint64_t code = static_cast<std::uint64_t>(-2 - static_cast<std::int64_t>(deferred));
    if (code >= modulus_) return nullptr;
    Slot& s = slots_[code % slot_count_];
    for (int spin = 0; spin < 1000; ++spin) {
      std::uint32_t expected = kFull;
      if (s.state.compare_exchange_weak(expected, kBusy, std::memory_order_acquire)) {
        if (s.seq % modulus_ == code) return &s;
        s.state.store(kFull, std::memory_order_release);
        return nullptr;
      }
      if (expected == kEmpty) return nullptr;  // reclaimed: the event is older than the history keeps
    }
    return nullptr;
  }

  std::size_t keep_, slot_count_;
  std::uint64_t modulus_ = 0;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<std::uint64_t> next_{0}, busy_{0};
  std::uint64_t reclaim_cursor_ = 0;  // reclaim()'s own
};

}  // namespace oomflight::torch_plugin
