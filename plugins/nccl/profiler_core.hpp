// The NCCL profiler plugin's core, the same for every profiler version: one event representation that each
// version's file (profiler_v4.cpp, profiler_v5.cpp, profiler_v6.cpp) translates NCCL's descriptors into, and the
// five calls behind every version's struct. The core never sees a versioned type. docs/nccl.md says what it
// records and when.
#ifndef OOMFLIGHT_PLUGINS_NCCL_PROFILER_CORE_HPP
#define OOMFLIGHT_PLUGINS_NCCL_PROFILER_CORE_HPP

#include <cstdint>

#include "profiler_abi.hpp"

namespace oomflight::nccl {

/// An event as the core sees it, whatever version delivered it.
struct Event {
  enum class Kind : std::uint8_t { other, coll, p2p, kernel_channel };
  Kind kind = Kind::other;
  void* parent = nullptr;          ///< kernel_channel: the handle start() gave its coll or p2p
  const char* func = nullptr;      ///< coll, p2p: NCCL's name ("AllReduce", "Send", ...)
  const char* datatype = nullptr;  ///< coll, p2p: NCCL's name ("ncclFloat32", ...)
  std::uint64_t count = 0;         ///< coll, p2p: elements
  std::uint64_t seq = 0;           ///< coll: NCCL's seqNumber
  int peer = -1;                   ///< coll: NCCL's root; p2p: the peer
  int channels = 0;                ///< coll, p2p: nChannels, the kernel channel events to expect
};

/// The activation mask init gives NCCL: collectives, point-to-point operations and the kernel's channels.
inline constexpr int kActivationMask = static_cast<int>(kColl | kP2p | kKernelCh);

/// Reads the parts of NCCL's descriptor the core uses. Every version names and places coll, p2p and kernelCh
/// alike (profiler_abi.hpp), so one template serves all three.
template <typename Descr>
Event translate(const Descr& d) noexcept {
  Event e;
  switch (static_cast<std::uint64_t>(d.type)) {
    case kColl:
      e.kind = Event::Kind::coll;
      e.func = d.coll.func;
      e.datatype = d.coll.datatype;
      e.count = d.coll.count;
      e.seq = d.coll.seqNumber;
      e.peer = d.coll.root;
      e.channels = d.coll.nChannels;
      break;
    case kP2p:
      e.kind = Event::Kind::p2p;
      e.func = d.p2p.func;
      e.datatype = d.p2p.datatype;
      e.count = d.p2p.count;
      e.peer = d.p2p.peer;
      e.channels = d.p2p.nChannels;
      break;
    case kKernelCh:
      e.kind = Event::Kind::kernel_channel;
      e.parent = d.parentObj;
      break;
    default:
      break;
  }
  return e;
}

/// init of every version: checks liboomflight's C ABI (the only failure: NCCL then runs without the plugin),
/// sets the mask, allocates the communicator's context (its pool of event slots) and registers the
/// communicator with oomflight (now, or at its first recorded event if oomflight is initialised later).
Result init(void** context, std::uint64_t comm_id, int* mask, const char* comm_name, int nranks, int rank,
            DebugLogger log) noexcept;
/// startEvent: records a coll's or p2p's start and returns its slot as the handle; a kernel channel's start
/// takes a reference on its parent's slot. Any other event, or oomflight not initialised: *handle = nullptr.
Result start_event(void* context, void** handle, const Event& event) noexcept;
/// stopEvent: a coll's or p2p's stop (enqueued), or one kernel channel's stop (that channel's work is done).
Result stop_event(void* handle) noexcept;
/// finalize: logs what was dropped (once, through NCCL's logger) and frees the context.
Result finalize(void* context) noexcept;

/// recordEventState of every version: nothing the plugin needs comes through it (a kernel channel's stop is
/// counted at its stopEvent, which NCCL calls right after the ncclProfilerKernelChStop state).
inline Result record_event_state(void*, EventState, EventStateArgs*) noexcept { return kSuccess; }

/// The plugin's name in NCCL's log.
inline constexpr const char* kPluginName = "oomflight";

/// startEvent of a version whose descriptor is Descr.
template <typename Descr>
Result start_event_of(void* context, void** handle, Descr* descr) noexcept {
  return start_event(context, handle, descr != nullptr ? translate(*descr) : Event{});
}

/// init of v5 and v6 (nNodes is not used).
inline Result init_v5_layout(void** context, std::uint64_t comm_id, int* mask, const char* comm_name, int /*nNodes*/,
                             int nranks, int rank, DebugLogger log) noexcept {
  return init(context, comm_id, mask, comm_name, nranks, rank, log);
}

}  // namespace oomflight::nccl

/// The plugin's exports: the ncclProfiler_vN structs, and nothing else (the rest is hidden).
#define OOMFLIGHT_NCCL_EXPORT __attribute__((visibility("default")))

namespace oomflight::nccl {

}  // namespace oomflight::nccl

#endif  // OOMFLIGHT_PLUGINS_NCCL_PROFILER_CORE_HPP
