// The NCCL profiler plugin's core (profiler_core.hpp): per communicator, a fixed pool of event slots, and the
// records it sends to oomflight through the C API.
//
// When an operation ends. NCCL's stopEvent of a coll or p2p only means "enqueued" (NCCL's README, "Profiling of
// collective and p2p operations"); the device's end is seen through the kernel channel events (ncclProfileKernelCh),
// whose parent is the operation's handle: when as many channels have stopped as the operation has (nChannels),
// the operation is done on the device, and its end is recorded with OOMFLIGHT_COLL_DEVICE_COMPLETION. Until a
// communicator has shown one kernel channel event (the first operation's channels come after its stopEvent; a
// NCCL that sends none never shows one), each stopEvent also records a host end, without the flag; the device
// end still follows when that operation's channels finish.
//
// Hot path: no lock, no allocation, no system call, no log. startEvent and stopEvent come from the user's thread
// and NCCL's proxy thread at once, so a slot's whole life is one 64-bit atomic word (Slot::state), changed only
// by compare-and-swap:
//   bits 0-7 kernel channels running, bits 8-15 kernel channels stopped, bit 16 busy, bit 17 host open (the
//   coll/p2p stopEvent has not come), bit 18 device open (its device end is not recorded yet), bits 32-63 the
//   generation, bumped at every claim.
// A handle is the slot's address (slots are 128-byte aligned) with the generation's low 6 bits in bits 1-6 and,
// for a kernel channel, bit 0 set. A claim starts at the next slot round robin and probes on to the first free one
// (claim()); a busy slot is taken over only when nothing can still use it (its host stop came and no channel is
// running: a device end that never came, as when NCCL sends no channel events), and then the operation's end is
// recorded as untracked unless its host end was; its old channels that start later see another generation and are
// ignored. When every slot holds an operation in flight, the start is recorded flagged untracked, with no handle
// (OOMFLIGHT_COLL_UNTRACKED: the archive counts such operations per communicator, and the report names the last
// one entered). Counts are also logged once, at finalize (which never runs in a crash).
#include "profiler_core.hpp"

#include <oomflight/oomflight.h>

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

namespace oomflight::nccl {
namespace {

constexpr std::size_t kSlots = 1024;  // operations in flight per communicator (a power of two)
constexpr std::uintptr_t kHandleAlign = 128;
constexpr std::uintptr_t kKernelTag = 1;
constexpr std::uint64_t kGenerationMask = 0x3f;  // the generation bits a handle carries

constexpr std::uint64_t kRunningOne = 1;
constexpr std::uint64_t kStoppedOne = 1u << 8;
constexpr std::uint64_t kBusy = 1u << 16;
constexpr std::uint64_t kHostOpen = 1u << 17;
constexpr std::uint64_t kDeviceOpen = 1u << 18;

constexpr std::uint64_t running(std::uint64_t s) { return s & 0xff; }
constexpr std::uint64_t stopped(std::uint64_t s) { return (s >> 8) & 0xff; }
constexpr std::uint64_t generation(std::uint64_t s) { return s >> 32; }
constexpr std::uint64_t free_state(std::uint64_t s) { return s & ~std::uint64_t{0xffffffff}; }
// Nothing can use the slot any more: its host stop came, no channel runs, its device end is recorded.
constexpr bool finished(std::uint64_t s) { return (s & (kHostOpen | kDeviceOpen)) == 0 && running(s) == 0; }

struct Context;

struct alignas(kHandleAlign) Slot {
  std::atomic<std::uint64_t> state{0};
  Context* context = nullptr;
  std::uint32_t channels = 0;          // kernel channels to expect
  bool host_end_recorded = false;      // its stopEvent recorded a host end (before any channel event was seen)
  oomflight_collective record{};       // the start's record; the end is the same with phase and flags changed
};
static_assert(alignof(Slot) == kHandleAlign && sizeof(Slot) == kHandleAlign);

struct Context {
  std::uint64_t comm_id = 0;
  int rank = 0;
  int nranks = 1;
  char name[48] = {};
  DebugLogger log = nullptr;
  std::atomic<bool> registered{false};
  std::atomic<bool> saw_kernel_channel{false};
  alignas(64) std::atomic<std::uint64_t> next_slot{0};
  // NCCL numbers collectives per function (coll.seqNumber) but gives point-to-point operations no number: this
  // rank's sends and receives on the communicator are numbered here, together, from 0, in the order NCCL starts
  // them (like NCCL's own numbers, whether oomflight recorded them or not). Not matched across ranks: rank A's
  // k-th send to B need not be B's k-th receive.
  std::atomic<std::uint64_t> p2p_seq{0};
  // Counted on the rare paths only, logged at finalize.
  std::atomic<std::uint64_t> dropped{0};      // a start with every slot in use: recorded untracked
  std::atomic<std::uint64_t> stale{0};        // a channel event for an operation whose slot was taken over
  std::atomic<std::uint64_t> unfinished{0};   // slots taken over before their device end came: an untracked end
  std::array<Slot, kSlots> slots;
};

Slot* slot_of(void* handle) {
  return reinterpret_cast<Slot*>(reinterpret_cast<std::uintptr_t>(handle) & ~(kHandleAlign - 1));
}
std::uint64_t generation_of(void* handle) { return (reinterpret_cast<std::uintptr_t>(handle) >> 1) & kGenerationMask; }
bool is_kernel_channel(void* handle) { return (reinterpret_cast<std::uintptr_t>(handle) & kKernelTag) != 0; }
void* make_handle(Slot* slot, std::uint64_t gen, bool kernel) {
  return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(slot) | ((gen & kGenerationMask) << 1) |
                                 (kernel ? kKernelTag : 0));
}

// NCCL's names (ncclFuncToString, collectives.cc; the same in 2.23 to 2.30). "SendRecv", NCCL 2.30's signal
// operations and anything newer are "other".
int op_of(const char* func) {
  struct Name { std::string_view name; int op; };
  static constexpr Name names[] = {
      {"AllReduce", OOMFLIGHT_COLL_ALLREDUCE}, {"AllGather", OOMFLIGHT_COLL_ALLGATHER},
      {"ReduceScatter", OOMFLIGHT_COLL_REDUCESCATTER}, {"Broadcast", OOMFLIGHT_COLL_BROADCAST},
      {"Reduce", OOMFLIGHT_COLL_REDUCE}, {"AlltoAll", OOMFLIGHT_COLL_ALLTOALL}, {"Send", OOMFLIGHT_COLL_SEND},
      {"Recv", OOMFLIGHT_COLL_RECV}, {"Gather", OOMFLIGHT_COLL_GATHER}, {"Scatter", OOMFLIGHT_COLL_SCATTER}};
  if (func == nullptr) return OOMFLIGHT_COLL_OTHER;
  const std::string_view f(func);
  for (const auto& n : names) {
    if (n.name == f) return n.op;
  }
  return OOMFLIGHT_COLL_OTHER;
}

// NCCL's names (ncclDatatypeToString): "ncclFloat32" and so on; enum oomflight_datatype has NCCL's numbering.
// (NCCL 2.28's table has no ncclUint8: it names it "Unknown". It is accepted here should a later one add it.)
int datatype_of(const char* datatype) {
  static constexpr std::string_view names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",
                                               "ncclInt64",   "ncclUint64",  "ncclFloat16",  "ncclFloat32",
                                               "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  if (datatype == nullptr) return OOMFLIGHT_DTYPE_OTHER;
  const std::string_view d(datatype);
  for (std::size_t i = 0; i < std::size(names); ++i) {
    if (names[i] == d) return static_cast<int>(i);
  }
  return OOMFLIGHT_DTYPE_OTHER;
}

bool has_root(int op) {
  return op == OOMFLIGHT_COLL_BROADCAST || op == OOMFLIGHT_COLL_REDUCE || op == OOMFLIGHT_COLL_GATHER ||
         op == OOMFLIGHT_COLL_SCATTER;
}

// Registers the communicator once oomflight is initialised; retried at each recorded start until then.
void register_communicator(Context& c) {
  const int rc = oomflight_register_communicator(c.comm_id, c.name, c.rank, c.nranks);
  if (rc != OOMFLIGHT_ESTATE) c.registered.store(true, std::memory_order_relaxed);  // done, or never possible
}

void record_end(const Slot& slot, std::uint32_t flags) {
  oomflight_collective end = slot.record;
  end.phase = OOMFLIGHT_COLL_END;
  end.flags = flags;
  oomflight_record_collective(&end);
}

// A slot taken over before its operation's device end came: the archive says the operation is no longer followed
// (an end flagged untracked; a host end recorded before stays its end), and the count is logged at finalize. Called
// by the thread that now owns the slot, before it writes the new operation's record over the old one.
void give_up(Slot& slot) {
  slot.context->unfinished.fetch_add(1, std::memory_order_relaxed);
  if (!slot.host_end_recorded) record_end(slot, OOMFLIGHT_COLL_UNTRACKED);
}

// A slot that nothing can still use although it is busy: its host stop came and no channel runs; only its device
// end is missing (a NCCL that sends no channel events, or channels that have not started yet).
bool can_take_over(std::uint64_t s) { return (s & kHostOpen) == 0 && running(s) == 0; }

// Takes `slot` for a new operation when it is free, or, unless `free_only`, when only its device end is missing
// (that operation is then given up on). False when it holds an operation that can still use it (or, with
// `free_only`, one waiting for its device end). One acquire load and a compare-and-swap when it is free.
bool try_claim(Slot& slot, std::uint32_t channels, bool free_only, std::uint64_t* gen) {
  std::uint64_t s = slot.state.load(std::memory_order_acquire);
  for (;;) {
    const bool busy = (s & kBusy) != 0;
    if (busy && (free_only || !can_take_over(s))) return false;
    const std::uint64_t next = ((generation(s) + 1) << 32) | kBusy | kHostOpen | (channels > 0 ? kDeviceOpen : 0);
    if (slot.state.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
      if (busy) give_up(slot);
      *gen = generation(next);
      return true;
    }
  }
}

// Claims a slot for an operation, starting at the next one round robin and probing onwards: the first free slot,
// else (once the whole pool was seen busy) one that only waits for a device end, which is then given up on; nullptr
// when every slot holds an operation still in flight. On a communicator that has shown no channel event yet, a slot
// waiting for a device end is taken at once, as a free one (no device end is expected to come there). Probing, not
// giving up on a busy slot: with 16 threads each having one operation in flight, a round-robin claim that gave up
// found a busy slot for 0.9% of operations (issue 30). The first probe is free in the common case; a probe is one
// acquire load.
Slot* claim(Context& c, std::uint32_t channels, std::uint64_t* gen) {
  const std::uint64_t first = c.next_slot.fetch_add(1, std::memory_order_relaxed);
  // A communicator that has shown no channel event has no device end coming: a slot waiting for one is as good as
  // free, and is taken at once rather than after a scan of the pool.
  const bool device_ends = c.saw_kernel_channel.load(std::memory_order_relaxed);
  Slot* fallback = nullptr;
  for (std::size_t probe = 0; probe < kSlots; ++probe) {
    Slot& slot = c.slots[(first + probe) & (kSlots - 1)];
    if (try_claim(slot, channels, device_ends, gen)) return &slot;
    if (fallback == nullptr && device_ends && can_take_over(slot.state.load(std::memory_order_acquire))) {
      fallback = &slot;
    }
  }
  // The pool held no free slot: take over one that only waits for its device end.
  return fallback != nullptr && try_claim(*fallback, channels, false, gen) ? fallback : nullptr;
}

// Clears `bits` (and, with `release_channel`, one running channel); frees the slot when nothing can use it.
void settle(Slot& slot, std::uint64_t bits, bool release_channel) {
  std::uint64_t s = slot.state.load(std::memory_order_relaxed);
  for (;;) {
    std::uint64_t next = (s & ~bits) - (release_channel ? kRunningOne : 0);
    if (finished(next)) next = free_state(next);
    if (slot.state.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_relaxed)) return;
  }
}

Result start_operation(Context& c, void** handle, const Event& e) {
  const bool p2p = e.kind == Event::Kind::p2p;
  const std::uint32_t channels = e.count > 0 && e.channels > 0 ? static_cast<std::uint32_t>(e.channels) : 0;
  std::uint64_t gen = 0;
  Slot* slot = claim(c, channels, &gen);
  oomflight_collective untracked = OOMFLIGHT_COLLECTIVE_INIT;
  // Every slot holds an operation in flight: the start is still recorded, flagged untracked (no handle, so no end
  // of it will come), so that the archive counts it per communicator and names the last operation entered.
  oomflight_collective& r = slot != nullptr ? slot->record : untracked;
  r = OOMFLIGHT_COLLECTIVE_INIT;
  r.op = op_of(e.func);
  r.comm_id = c.comm_id;
  r.seq = p2p ? c.p2p_seq.fetch_add(1, std::memory_order_relaxed) : e.seq;
  r.count = e.count;
  r.datatype = datatype_of(e.datatype);
  r.peer = p2p || has_root(r.op) ? (e.peer >= 0 ? e.peer : -1) : -1;
  if (slot == nullptr) {
    r.flags = OOMFLIGHT_COLL_UNTRACKED;
    if (oomflight_record_collective(&r) == OOMFLIGHT_OK) {
      c.dropped.fetch_add(1, std::memory_order_relaxed);
      if (!c.registered.load(std::memory_order_relaxed)) register_communicator(c);
    }
    return kSuccess;
  }
  slot->channels = channels;
  slot->host_end_recorded = false;
  if (oomflight_record_collective(&r) != OOMFLIGHT_OK) {
    // oomflight is not initialised in this process (or refused the record): stay quiet, hand NCCL no handle.
    slot->state.store(free_state(slot->state.load(std::memory_order_relaxed)), std::memory_order_release);
    return kSuccess;
  }
  if (!c.registered.load(std::memory_order_relaxed)) register_communicator(c);
  *handle = make_handle(slot, gen, false);
  return kSuccess;
}

Result start_kernel_channel(void** handle, void* parent) {
  if (parent == nullptr || is_kernel_channel(parent)) return kSuccess;
  Slot& slot = *slot_of(parent);
  const std::uint64_t gen = generation_of(parent);
  std::uint64_t s = slot.state.load(std::memory_order_acquire);
  for (;;) {
    if ((s & kBusy) == 0 || (generation(s) & kGenerationMask) != gen || running(s) == 0xff) {
      slot.context->stale.fetch_add(1, std::memory_order_relaxed);
      return kSuccess;
    }
    if (slot.state.compare_exchange_weak(s, s + kRunningOne, std::memory_order_acq_rel, std::memory_order_acquire)) {
      break;
    }
  }
  Context& c = *slot.context;
  if (!c.saw_kernel_channel.load(std::memory_order_relaxed)) c.saw_kernel_channel.store(true, std::memory_order_relaxed);
  *handle = make_handle(&slot, gen, true);
  return kSuccess;
}

// One channel finished: the last of the operation's channels records its device end. The channel's running
// reference keeps the slot (and its record) until it is settled.
void stop_kernel_channel(Slot& slot) {
  std::uint64_t s = slot.state.load(std::memory_order_acquire);
  bool completes = false;
  for (;;) {
    std::uint64_t next = stopped(s) < 0xff ? s + kStoppedOne : s;
    completes = (next & kDeviceOpen) != 0 && stopped(next) >= slot.channels;
    if (completes) next &= ~kDeviceOpen;
    if (slot.state.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  if (completes) record_end(slot, OOMFLIGHT_COLL_DEVICE_COMPLETION);
  settle(slot, 0, true);
}

// The coll's or p2p's stopEvent: enqueued. A host end until the communicator shows kernel channel events.
void stop_operation(Slot& slot) {
  if (!slot.context->saw_kernel_channel.load(std::memory_order_relaxed)) {
    record_end(slot, 0);
    slot.host_end_recorded = true;  // published by settle's release, read by a claim that takes the slot over
  }
  settle(slot, kHostOpen, false);
}

void log_line(const Context& c, int level, const char* format, unsigned long long a, unsigned long long b,
              unsigned long long d) {
  if (c.log != nullptr) c.log(level, kLogInit, __FILE__, __LINE__, format, a, b, d);
}

}  // namespace

Result init(void** context, std::uint64_t comm_id, int* mask, const char* comm_name, int nranks, int rank,
            DebugLogger log) noexcept {
  if (context == nullptr || mask == nullptr) return kInvalidUsage;
  *context = nullptr;
  if (oomflight_abi_version() != OOMFLIGHT_ABI_VERSION) {
    if (log != nullptr) {
      log(kLogWarn, kLogInit, __FILE__, __LINE__,
          "oomflight profiler plugin: liboomflight's C ABI is version %d, the plugin was built for %d: disabled",
          oomflight_abi_version(), OOMFLIGHT_ABI_VERSION);
    }
    return kInvalidUsage;
  }
  *mask = kActivationMask;  // NCCL keeps one mask for the process: every context asks for the same
  auto* c = new (std::nothrow) Context;
  if (c == nullptr) {
    // No host memory: NCCL goes on, and a null context makes every event of this communicator a no-op.
    if (log != nullptr) log(kLogWarn, kLogInit, __FILE__, __LINE__, "oomflight profiler plugin: out of host memory");
    return kSuccess;
  }
  c->comm_id = comm_id;
  c->rank = rank;
  c->nranks = nranks;
  c->log = log;
  if (comm_name != nullptr) std::strncpy(c->name, comm_name, sizeof(c->name) - 1);
  for (Slot& slot : c->slots) slot.context = c;
  register_communicator(*c);
  log_line(*c, kLogInfo,
           c->registered.load(std::memory_order_relaxed)
               ? "oomflight profiler plugin: recording communicator %llx, rank %llu of %llu"
               : "oomflight profiler plugin: communicator %llx, rank %llu of %llu: oomflight is not initialised in "
                 "this process yet, nothing is recorded until it is",
           comm_id, static_cast<unsigned long long>(rank), static_cast<unsigned long long>(nranks));
  *context = c;
  return kSuccess;
}

Result start_event(void* context, void** handle, const Event& event) noexcept {
  if (handle == nullptr) return kSuccess;
  *handle = nullptr;
  if (context == nullptr) return kSuccess;
  switch (event.kind) {
    case Event::Kind::coll:
    case Event::Kind::p2p: return start_operation(*static_cast<Context*>(context), handle, event);
    case Event::Kind::kernel_channel: return start_kernel_channel(handle, event.parent);
    default: return kSuccess;
  }
}

Result stop_event(void* handle) noexcept {
  if (handle == nullptr) return kSuccess;
  if (is_kernel_channel(handle)) {
    stop_kernel_channel(*slot_of(handle));
  } else {
    stop_operation(*slot_of(handle));
  }
  return kSuccess;
}

Result finalize(void* context) noexcept {
  std::unique_ptr<Context> c(static_cast<Context*>(context));
  if (!c) return kSuccess;
  const auto dropped = c->dropped.load(), stale = c->stale.load(), unfinished = c->unfinished.load();
  if (dropped + stale + unfinished > 0) {
    log_line(*c, kLogInfo,
             "oomflight profiler plugin: %llu operations recorded untracked (all slots in use), %llu kernel channel "
             "events of operations no longer tracked, %llu operations given up on before their device end came",
             dropped, stale, unfinished);
  }
  return kSuccess;
}

}  // namespace oomflight::nccl
