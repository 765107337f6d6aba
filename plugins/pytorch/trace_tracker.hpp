// The PyTorch plugin's logic, apart from torch: what to do with each CUDA caching-allocator TraceEntry and with
// the allocator's out-of-memory observer call. Header-only and templated on the entry type, so that the torch
// extension (oomflight_torch.cpp) instantiates it with torch's own TraceEntry and the tests with stand-ins shaped
// like torch 2.4's (c10/cuda/CUDACachingAllocator.h, stream_ a cudaStream_t) and the newest layout
// (c10/core/CachingDeviceAllocator.h, stream_ a void*).
//
// It reaches liboomflight only through C function pointers (CApiTable) that the Python package resolves with
// ctypes from the library it loaded: no C++ type crosses the boundary, and the extension needs neither
// oomflight's headers nor a link line to build against any torch.
//
// Constraints from the allocator (PyTorch's record_trace / malloc): the tracker runs with the device's allocator
// mutex held and possibly the GIL held, so it must not take the GIL, call torch or allocate; it only forwards the
// event (a wait-free ring push) and updates this device's gauges with relaxed atomics. The OOM observer runs after
// the OOM trace entry with the mutex released, before OutOfMemoryError is thrown: the place for the blocking,
// coordinated dump.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <utility>

namespace oomflight::torch_plugin {

/// liboomflight's C ABI version 1 (oomflight/oomflight.h), as the plugin uses it. A test compiles this header
/// beside oomflight.h and checks every value and layout below against it.
namespace abi {
inline constexpr int kVersion = 1;
inline constexpr int kAlloc = 0, kFreeRequested = 1, kFreeCompleted = 2, kSegmentAlloc = 3, kSegmentFree = 4,
                     kSegmentMap = 5, kSegmentUnmap = 6, kOom = 7, kSnapshot = 8;
inline constexpr int kDumpOom = 0, kDumpSignal = 2;
inline constexpr int kLogInfo = 2, kLogWarn = 3;
inline constexpr int kMaxDevices = 64;  ///< devices oomflight_set_memory accepts (0 .. 63)

struct Memory {  ///< struct oomflight_memory
  std::uint32_t struct_size = sizeof(Memory);
  std::uint32_t reserved0 = 0;
  std::uint64_t allocated_bytes = 0, reserved_bytes = 0, peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  std::uint64_t device_capacity_bytes = 0, device_free_bytes = 0;
  std::uint64_t memory_cap_bytes = 0;  ///< since 0.2.1
};
struct Frame {  ///< struct oomflight_frame
  const char* function = nullptr;
  const char* file = nullptr;
  std::int32_t line = 0;
};
struct SegmentState {  ///< struct oomflight_segment_state (PyTorch's SegmentInfo), bytes
  std::uint64_t address = 0, total_size = 0, stream = 0;
  std::int32_t device = 0, is_expandable = 0;
};
inline constexpr int kBlockActiveAllocated = 0, kBlockActivePendingFree = 1, kBlockInactive = 2;
struct BlockState {  ///< struct oomflight_block_state (PyTorch's BlockInfo), bytes
  std::uint64_t address = 0, size = 0, requested_size = 0;
  std::int32_t stack_id = -1, state = kBlockInactive;
};
struct SegmentDetail {  ///< struct oomflight_segment_detail (PyTorch's SegmentInfo: pool, frames, pool kind)
  std::uint64_t pool_id[2] = {0, 0};
  std::int32_t stack_id = -1, segment_type = -1;
};
struct DumpRequest {  ///< struct oomflight_dump_request, the 0.2.1 layout (allocator state and segment details)
  std::uint32_t struct_size = sizeof(DumpRequest);
  std::int32_t kind = kDumpOom;
  const char* reason = nullptr;
  std::uint64_t requested_bytes = 0, device_free_bytes = 0;
  std::int32_t device = -1;
  std::int32_t reserved0 = 0;
  std::int64_t batch = -1;
  const SegmentState* segments = nullptr;
  std::uint64_t segment_count = 0;
  const BlockState* blocks = nullptr;
  std::uint64_t block_count = 0;
  const SegmentDetail* segment_details = nullptr;
};
struct DumpResult {  ///< struct oomflight_dump_result
  std::uint32_t struct_size = sizeof(DumpResult);
  std::int32_t status = 2, ranks_written = 0, world_size = 0;
  std::int64_t batch = -1;
  double seconds = 0.0;
};
static_assert(sizeof(Memory) == 64 && sizeof(DumpRequest) == 88 && sizeof(DumpResult) == 32 &&
              sizeof(SegmentDetail) == 24);
static_assert(sizeof(Frame) == 24 && sizeof(SegmentState) == 32 && sizeof(BlockState) == 32);
}  // namespace abi

/// The C API functions the plugin calls (addresses from ctypes). Every pointer must be set before attaching.
struct CApiTable {
  int (*abi_version)() = nullptr;
  int (*record)(int action, int device, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
                std::int32_t stack_id) = nullptr;
  int (*set_memory)(int device, const abi::Memory* memory) = nullptr;
  int (*request_dump)(const abi::DumpRequest* request, abi::DumpResult* result) = nullptr;
  int (*log)(int level, const char* message) = nullptr;
  int (*intern_stack)(const abi::Frame* frames, std::size_t count, std::int32_t* stack_id) = nullptr;
  /// oomflight_set_stack_resolver: optional (a liboomflight before it gives events without stacks).
  using StackResolver = int (*)(void* user, const std::int32_t* deferred, std::size_t count, std::int32_t* stack_ids,
                                std::uint32_t timeout_ms);
  int (*set_stack_resolver)(StackResolver resolver, void* user, std::uint64_t* max_entries) = nullptr;
  /// oomflight_set_metadata: optional (the call sites are then not named in the archive's metadata).
  int (*set_metadata)(const char* key, const char* value) = nullptr;

  bool complete() const noexcept {
    return abi_version != nullptr && record != nullptr && set_memory != nullptr && request_dump != nullptr &&
           log != nullptr && intern_stack != nullptr;
  }
};

/// oomflight's action for a torch action, mapped by name (torch's numbering differs from the archive's and has
/// changed between versions). -1 for a name oomflight does not record (USER_DEFINED in newer torch).
template <typename TorchAction>
constexpr int action_code(TorchAction action) noexcept {
  switch (action) {
    case TorchAction::ALLOC: return abi::kAlloc;
    case TorchAction::FREE_REQUESTED: return abi::kFreeRequested;
    case TorchAction::FREE_COMPLETED: return abi::kFreeCompleted;
    case TorchAction::SEGMENT_ALLOC: return abi::kSegmentAlloc;
    case TorchAction::SEGMENT_FREE: return abi::kSegmentFree;
    case TorchAction::SEGMENT_MAP: return abi::kSegmentMap;
    case TorchAction::SEGMENT_UNMAP: return abi::kSegmentUnmap;
    case TorchAction::OOM: return abi::kOom;
    case TorchAction::SNAPSHOT: return abi::kSnapshot;
    default: return -1;
  }
}

/// A stream handle as an integer: cudaStream_t (a pointer) in torch 2.4, void* later, an integer in stand-ins.
template <typename Stream>
std::uint64_t stream_value(const Stream& stream) noexcept {
  if constexpr (std::is_pointer_v<Stream>) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(stream));
  } else {
    return static_cast<std::uint64_t>(stream);
  }
}

/// Whether a TraceEntry type carries torch's gathered context (context_, a shared_ptr; stand-ins may not).
template <typename T, typename = void>
struct has_context : std::false_type {};
template <typename T>
struct has_context<T, std::void_t<decltype(std::declval<const T&>().context_)>> : std::true_type {};

/// One device's figures as the trace implies them, in bytes, following CUDACachingAllocator's own statistics:
/// allocated grows at ALLOC and shrinks at FREE_REQUESTED (free() decreases allocated_bytes before the block's
/// stream uses end); reserved grows at SEGMENT_ALLOC / SEGMENT_MAP and shrinks at SEGMENT_FREE / SEGMENT_UNMAP.
/// The trace carries requested sizes for blocks, so "allocated" here is requested bytes plus the seed (torch's
/// allocated_bytes at attach time); the OOM observer replaces it with torch's exact figures.
struct DeviceGauges {
  std::atomic<std::int64_t> allocated{0}, reserved{0}, peak_allocated{0}, peak_reserved{0};
  std::atomic<std::uint64_t> capacity{0};  ///< the device's total memory (seeded from its properties)
  std::atomic<std::uint64_t> cap{0};       ///< the process's own cap (per-process memory fraction); 0: none seen
  std::atomic<bool> oom_entry_seen{false};  ///< an OOM trace entry since the last observer call
};

/// Exact figures of one device from torch's getDeviceStats (observer time only: the mutex is free then).
struct ExactStats {
  std::int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
};

/// The failing device's allocator state at the OOM, as rows of the C API (built by the extension from torch's
/// snapshot(): segments with their blocks, block addresses from the segment's address and the sizes before them,
/// blocks' stack ids interned from their contexts). Borrowed for the observer call.
struct AllocatorState {
  const abi::SegmentState* segments = nullptr;
  const abi::SegmentDetail* segment_details = nullptr;  ///< segment_count of them, or nullptr
  std::size_t segment_count = 0;
  const abi::BlockState* blocks = nullptr;
  std::size_t block_count = 0;
};

/// Forwards trace entries and OOM observer calls to liboomflight. Thread-safety: on_entry may run concurrently
/// for different devices (one allocator mutex per device) and concurrently with on_out_of_memory; all shared
/// state is atomic. Nothing on on_entry's path allocates, locks or throws.
class TraceTracker {
 public:
  explicit TraceTracker(const CApiTable& api) : api_(api) {}

  /// Starts a device's gauges from torch's figures at attach time (bytes).
  void seed(int device, std::int64_t allocated, std::int64_t reserved, std::uint64_t capacity) noexcept {
    if (device < 0 || device >= abi::kMaxDevices) return;
    DeviceGauges& g = gauges_[device];
    g.allocated.store(allocated, std::memory_order_relaxed);
    g.reserved.store(reserved, std::memory_order_relaxed);
    g.peak_allocated.store(allocated, std::memory_order_relaxed);
    g.peak_reserved.store(reserved, std::memory_order_relaxed);
    g.capacity.store(capacity, std::memory_order_relaxed);
  }

  /// Where entries' contexts go (ContextTable::put through `keep`, which returns a deferred stack id or -1).
  /// Call before the tracker is attached (not synchronised with on_entry); without it events carry no stack.
  using KeepContext = std::int32_t (*)(void* sink, const void* context) noexcept;
  void set_context_sink(KeepContext keep, void* sink) noexcept {
    keep_context_ = keep;
    context_sink_ = sink;
  }

  /// Where entries without a context get their stack: oomflight's own capture of the calling thread's Python
  /// stack (PythonStacks::capture through `capture`, which returns a deferred stack id or -1). Call before the
  /// tracker is attached; without it such events carry no stack.
  using CaptureStack = std::int32_t (*)(void* sink) noexcept;
  void set_stack_capture(CaptureStack capture, void* sink) noexcept {
    capture_stack_ = capture;
    capture_sink_ = sink;
  }

  /// The AllocatorTraceTracker body: one TraceEntry (torch's type or a stand-in with the same member names:
  /// action_, device_, addr_, size_, stream_, and context_ where it has one; for OOM entries addr_ is the device's
  /// free bytes). An entry's context (torch's, when memory history records contexts) is kept by the context sink
  /// and the event carries its deferred id: symbolised at the freeze, not here.
  template <typename Entry>
  void on_entry(const Entry& e) noexcept {
    const int action = action_code(e.action_);
    if (action < 0) {
      unmapped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const int device = static_cast<int>(e.device_);
    const auto addr = static_cast<std::uint64_t>(e.addr_);
    const auto size = static_cast<std::uint64_t>(e.size_);
    std::int32_t stack = -1;
    if constexpr (has_context<Entry>::value) {
      if (keep_context_ != nullptr && e.context_) stack = keep_context_(context_sink_, &e.context_);
    }
    // No context from torch: the allocating thread's own Python stack. Not for FREE_COMPLETED, which the thread
    // of some later allocation records when a stream's work is done: that thread's stack says nothing of it.
    if (stack == -1 && capture_stack_ != nullptr && action != abi::kFreeCompleted) {
      stack = capture_stack_(capture_sink_);
    }
    if (api_.record(action, device, addr, size, stream_value(e.stream_), stack) != 0) {
      not_recorded_.fetch_add(1, std::memory_order_relaxed);  // dropped by the ring (counted there too)
    }
    forwarded_.fetch_add(1, std::memory_order_relaxed);
    if (device < 0 || device >= abi::kMaxDevices) return;
    DeviceGauges& g = gauges_[device];
    const auto signed_size = static_cast<std::int64_t>(size);
    switch (action) {
      case abi::kAlloc: raise(g.allocated, g.peak_allocated, signed_size); break;
      case abi::kFreeRequested: g.allocated.fetch_sub(signed_size, std::memory_order_relaxed); break;
      case abi::kSegmentAlloc:
      case abi::kSegmentMap: raise(g.reserved, g.peak_reserved, signed_size); break;
      case abi::kSegmentFree:
      case abi::kSegmentUnmap: g.reserved.fetch_sub(signed_size, std::memory_order_relaxed); break;
      case abi::kOom: g.oom_entry_seen.store(true, std::memory_order_relaxed); return;
      default: return;  // FREE_COMPLETED, SNAPSHOT: no change to allocated or reserved
    }
    publish(device, g, 0);
  }

  /// The device's capacity and the process's cap behind the `device_total` torch hands its OOM observers: torch
  /// passes `set_fraction ? allowed_memory_maximum : device_total` (c10/cuda/CUDACachingAllocator.cpp), so under
  /// torch.cuda.set_per_process_memory_fraction the figure is the cap, below the device's own capacity (seeded from
  /// its properties at attach). Issue 30: a 4 GiB cap on a 139.80 GiB H200 was reported as the device's capacity.
  /// {capacity, cap}; cap 0 when there is none; with no seeded capacity the figure is taken as the capacity.
  std::pair<std::uint64_t, std::uint64_t> capacity_and_cap(int device, std::uint64_t device_total) const noexcept {
    const std::uint64_t seeded =
        device >= 0 && device < abi::kMaxDevices ? gauges_[device].capacity.load(std::memory_order_relaxed) : 0;
    if (seeded != 0 && device_total != 0 && device_total < seeded) return {seeded, device_total};
    return {device_total != 0 ? device_total : seeded, 0};
  }

  /// The OutOfMemoryObserver body (device, the allocation torch tried, the device's total or the process's cap
  /// (capacity_and_cap), and the free bytes, as torch passes them). Records the oom event if the trace did not (torch before 2.4 recorded it only with
  /// memory history on), publishes the exact figures when given, and asks every rank for an oom dump; returns
  /// once the dump is written. `reason` is the text for the archive; may be nullptr. `state`, when given, is sent
  /// with the request (the 0.2.1 request, segment details included): the origin's /state_segments and
  /// /state_blocks are then torch's own.
  int on_out_of_memory(int device, std::uint64_t alloc_bytes, std::uint64_t device_total,
                       std::uint64_t device_free, const ExactStats* exact, const char* reason,
                       const AllocatorState* state = nullptr) noexcept {
    if (device >= 0 && device < abi::kMaxDevices) {
      DeviceGauges& g = gauges_[device];
      if (!g.oom_entry_seen.exchange(false, std::memory_order_relaxed)) {
        api_.record(abi::kOom, device, device_free, alloc_bytes, 0, -1);
      }
      if (exact != nullptr) {
        g.allocated.store(exact->allocated, std::memory_order_relaxed);
        g.reserved.store(exact->reserved, std::memory_order_relaxed);
        g.peak_allocated.store(exact->peak_allocated, std::memory_order_relaxed);
        g.peak_reserved.store(exact->peak_reserved, std::memory_order_relaxed);
      }
      const auto [capacity, cap] = capacity_and_cap(device, device_total);
      if (capacity != 0) g.capacity.store(capacity, std::memory_order_relaxed);
      g.cap.store(cap, std::memory_order_relaxed);
      publish(device, g, device_free);
    } else {
      api_.record(abi::kOom, device, device_free, alloc_bytes, 0, -1);
    }
    abi::DumpRequest request;
    request.kind = abi::kDumpOom;
    request.reason = reason;
    request.requested_bytes = alloc_bytes;
    request.device_free_bytes = device_free;
    request.device = (device >= 0 && device < abi::kMaxDevices) ? device : -1;
    if (state != nullptr) {
      request.segments = state->segments;
      request.segment_details = state->segment_details;
      request.segment_count = state->segment_count;
      request.blocks = state->blocks;
      request.block_count = state->block_count;
    }
    abi::DumpResult result;
    const int code = api_.request_dump(&request, &result);
    observer_dumps_.fetch_add(1, std::memory_order_release);
    return code;
  }

  std::uint64_t forwarded() const noexcept { return forwarded_.load(std::memory_order_relaxed); }
  std::uint64_t unmapped() const noexcept { return unmapped_.load(std::memory_order_relaxed); }
  std::uint64_t not_recorded() const noexcept { return not_recorded_.load(std::memory_order_relaxed); }
  std::uint64_t observer_dumps() const noexcept { return observer_dumps_.load(std::memory_order_acquire); }
  const DeviceGauges& gauges(int device) const { return gauges_.at(static_cast<std::size_t>(device)); }

 private:
  static void raise(std::atomic<std::int64_t>& value, std::atomic<std::int64_t>& peak, std::int64_t by) noexcept {
    const std::int64_t now = value.fetch_add(by, std::memory_order_relaxed) + by;
    std::int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }

  void publish(int device, const DeviceGauges& g, std::uint64_t device_free) noexcept {
    const auto clamp = [](std::int64_t v) { return static_cast<std::uint64_t>(v < 0 ? 0 : v); };
    abi::Memory m;
    m.allocated_bytes = clamp(g.allocated.load(std::memory_order_relaxed));
    m.reserved_bytes = clamp(g.reserved.load(std::memory_order_relaxed));
    m.peak_allocated_bytes = clamp(g.peak_allocated.load(std::memory_order_relaxed));
    m.peak_reserved_bytes = clamp(g.peak_reserved.load(std::memory_order_relaxed));
    m.device_capacity_bytes = g.capacity.load(std::memory_order_relaxed);
    m.device_free_bytes = device_free;
    m.memory_cap_bytes = g.cap.load(std::memory_order_relaxed);
    api_.set_memory(device, &m);
  }

  CApiTable api_;
  KeepContext keep_context_ = nullptr;
  void* context_sink_ = nullptr;
  CaptureStack capture_stack_ = nullptr;
  void* capture_sink_ = nullptr;
  std::array<DeviceGauges, abi::kMaxDevices> gauges_{};
  std::atomic<std::uint64_t> forwarded_{0}, unmapped_{0}, not_recorded_{0}, observer_dumps_{0};
};

}  // namespace oomflight::torch_plugin
