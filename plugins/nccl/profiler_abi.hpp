// NCCL's profiler plugin ABI, versions 4, 5 and 6: the structs NCCL hands a profiler plugin and the struct the
// plugin exports (symbol ncclProfiler_vN). Written from NVIDIA's documentation of that interface, not copied:
// ext-profiler/README.md of NCCL 2.28.9 (the v5 API, event types, states, the event hierarchy), the per-version
// layouts in NCCL's src/include/plugin/profiler/profiler_v4.h and profiler_v5.h (v2.28.9-1) and profiler_v6.h
// (v2.30.7-1), and src/include/plugin/nccl_profiler.h (v2.28.9-1) for the event type bits and states. Only the
// layout is ABI: names here are ours, each with NCCL's in its comment. The static_asserts pin every offset the
// plugin reads (x86-64 and aarch64 Linux, LP64), so a wrong member order cannot compile.
//
// What differs between the versions (the plugin reads only the coll, p2p and kernelCh members):
// - init: v4 is init(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn); v5 and v6 moved the id first,
//   init(ctx, commId, mask, commName, nNodes, nranks, rank, logfn).
// - the descriptor's `type` is uint8_t in v4 and uint64_t from v5 (same offsets after it: parentObj is aligned).
// - v5 added the API events (groupApi, collApi, p2pApi, kernelLaunch) and a parentGroup at the end of coll and
//   p2p; v6 added the copy-engine events (ceColl, ceCollSync, ceCollBatch). coll, p2p and kernelCh keep their
//   offsets across the three.
//
// No NCCL header is included: a plugin must build without NCCL (NCCL's README, "Headers management").
#ifndef OOMFLIGHT_PLUGINS_NCCL_PROFILER_ABI_HPP
#define OOMFLIGHT_PLUGINS_NCCL_PROFILER_ABI_HPP

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace oomflight::nccl {

/// NCCL's ncclResult_t (nccl.h): only init may return anything but success, and that disables the plugin.
enum Result : int {
  kSuccess = 0,           ///< ncclSuccess
  kSystemError = 2,       ///< ncclSystemError
  kInternalError = 3,     ///< ncclInternalError
  kInvalidUsage = 5,      ///< ncclInvalidUsage
};

/// Event types: the descriptor's `type` and the bits of the activation mask init returns (nccl_profiler.h).
enum EventType : std::uint64_t {
  kGroup = 1u << 0,          ///< ncclProfileGroup
  kColl = 1u << 1,           ///< ncclProfileColl: a collective, as enqueued
  kP2p = 1u << 2,            ///< ncclProfileP2p: a send or receive, as enqueued
  kProxyOp = 1u << 3,        ///< ncclProfileProxyOp
  kProxyStep = 1u << 4,      ///< ncclProfileProxyStep
  kProxyCtrl = 1u << 5,      ///< ncclProfileProxyCtrl
  kKernelCh = 1u << 6,       ///< ncclProfileKernelCh: one channel of the kernel working on a coll or p2p
  kNetPlugin = 1u << 7,      ///< ncclProfileNetPlugin
  kGroupApi = 1u << 8,       ///< ncclProfileGroupApi (v5)
  kCollApi = 1u << 9,        ///< ncclProfileCollApi (v5)
  kP2pApi = 1u << 10,        ///< ncclProfileP2pApi (v5)
  kKernelLaunch = 1u << 11,  ///< ncclProfileKernelLaunch (v5)
  kCeColl = 1u << 12,        ///< ncclProfileCeColl (v6)
  kCeSync = 1u << 13,        ///< ncclProfileCeSync (v6)
  kCeBatch = 1u << 14,       ///< ncclProfileCeBatch (v6)
};

/// Event states passed to recordEventState (ncclProfilerEventState_t; an int-sized enum in every version). Only
/// those the plugin or its tests name; the others (proxy, net and group API states) are ignored.
enum EventState : int {
  kKernelChStop = 22,  ///< ncclProfilerKernelChStop: the channel's work finished (pTimer: the GPU's timestamp)
};

/// NCCL's ncclDebugLogger_t: level (ncclDebugLogLevel: 2 warn, 3 info), subsystem flags (1: NCCL_INIT), printf.
using DebugLogger = void (*)(int level, unsigned long flags, const char* file, int line, const char* format, ...);
inline constexpr int kLogWarn = 2;
inline constexpr int kLogInfo = 3;
inline constexpr unsigned long kLogInit = 0x1;

// --- members of the descriptors' unions, as each version lays them out ---

/// coll, v4: a collective (ncclProfileColl).
struct CollV4 {
  std::uint64_t seqNumber;  ///< the communicator's count of this function's collectives before this one
  const char* func;         ///< "AllReduce", "Broadcast", ... (ncclFuncToString)
  const void* sendBuff;
  void* recvBuff;
  std::size_t count;        ///< elements
  int root;                 ///< meaningful for rooted collectives only
  const char* datatype;     ///< "ncclFloat32", ... (ncclDatatypeToString)
  std::uint8_t nChannels;   ///< channels the collective runs on: one kernelCh event each
  std::uint8_t nWarps;
  const char* algo;
  const char* proto;
};
/// coll, v5 and v6: v4's members, then the legacy group parent.
struct CollV5 {
  std::uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  std::size_t count;
  int root;
  const char* datatype;
  std::uint8_t nChannels;
  std::uint8_t nWarps;
  const char* algo;
  const char* proto;
  void* parentGroup;
};

/// p2p, v4: a send or receive (ncclProfileP2p).
struct P2pV4 {
  const char* func;  ///< "Send" or "Recv"
  void* buff;
  const char* datatype;
  std::size_t count;
  int peer;          ///< the other rank of the communicator
  std::uint8_t nChannels;
};
/// p2p, v5 and v6: v4's members, then the legacy group parent.
struct P2pV5 {
  const char* func;
  void* buff;
  const char* datatype;
  std::size_t count;
  int peer;
  std::uint8_t nChannels;
  void* parentGroup;
};

struct ProxyOpDescr {
  pid_t pid;
  std::uint8_t channelId;
  int peer;
  int nSteps;
  int chunkSize;
  int isSend;
};
struct ProxyStepDescr {
  int step;
};
/// kernelCh: one channel of the kernel (ncclProfileKernelCh); parentObj is the coll or p2p event's handle.
struct KernelChDescr {
  std::uint8_t channelId;
  std::uint64_t pTimer;  ///< the GPU's timestamp at the channel's start
};
struct NetPluginDescr {
  std::int64_t id;
  void* data;
};
struct GroupApiDescr {
  bool graphCaptured;
  int groupDepth;
};
struct CollApiDescr {
  const char* func;
  std::size_t count;
  const char* datatype;
  int root;
  void* stream;
  bool graphCaptured;
};
struct P2pApiDescr {
  const char* func;
  std::size_t count;
  const char* datatype;
  void* stream;
  bool graphCaptured;
};
struct KernelLaunchDescr {
  void* stream;
};
struct CeCollDescr {
  std::uint64_t seqNumber;
  const char* func;
  const void* sendBuff;
  void* recvBuff;
  std::size_t count;
  int root;
  const char* datatype;
  const char* syncStrategy;
  bool intraBatchSync;
  std::uint32_t batchSize;
  std::uint32_t numBatches;
  std::uint32_t ceSeqNum;
  void* stream;
};
struct CeCollSyncDescr {
  bool isComplete;
  int nRanks;
};
struct CeCollBatchDescr {
  int numOps;
  std::size_t totalBytes;
  bool useIntraSync;
};

// --- event descriptors (startEvent's argument) ---

/// ncclProfilerEventDescr_v4_t.
struct EventDescrV4 {
  std::uint8_t type;  ///< one EventType bit
  void* parentObj;    ///< the parent event's handle (kernelCh: its coll or p2p)
  int rank;
  union {
    CollV4 coll;
    P2pV4 p2p;
    ProxyOpDescr proxyOp;
    ProxyStepDescr proxyStep;
    KernelChDescr kernelCh;
    NetPluginDescr netPlugin;
  };
};

/// The copy-engine events of v6, one member of its descriptor's union.
union CeDescrs {
  CeCollDescr ceColl;
  CeCollSyncDescr ceCollSync;
  CeCollBatchDescr ceCollBatch;
};
/// v5 has no copy-engine events.
struct NoCeDescrs {};

/// ncclProfilerEventDescr_v5_t and _v6_t: one layout, v6's union also holds the copy-engine events (NCCL names
/// them ceColl, ceCollSync and ceCollBatch in the union itself; here they are ce.ceColl ...).
template <typename Ce>
struct EventDescrV5Layout {
  std::uint64_t type;
  void* parentObj;
  int rank;
  union {
    GroupApiDescr groupApi;
    CollApiDescr collApi;
    P2pApiDescr p2pApi;
    KernelLaunchDescr kernelLaunch;
    CollV5 coll;
    P2pV5 p2p;
    ProxyOpDescr proxyOp;
    ProxyStepDescr proxyStep;
    KernelChDescr kernelCh;
    NetPluginDescr netPlugin;
    Ce ce;
  };
};
using EventDescrV5 = EventDescrV5Layout<NoCeDescrs>;
using EventDescrV6 = EventDescrV5Layout<CeDescrs>;

/// ncclProfilerEventStateArgs_v4_t, _v5_t and _v6_t: one layout.
union EventStateArgs {
  struct {
    std::size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    std::uint64_t pTimer;  ///< the GPU's timestamp at the channel's stop
  } kernelCh;
};

// --- the exported structs (ncclProfiler_vN_t): a name, then five functions ---

/// ncclProfiler_v4_t.
struct ProfilerV4 {
  const char* name;
  Result (*init)(void** context, int* eActivationMask, const char* commName, std::uint64_t commHash, int nNodes,
                 int nranks, int rank, DebugLogger logfn);
  Result (*startEvent)(void* context, void** eHandle, EventDescrV4* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, EventState eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};

/// ncclProfiler_v5_t and ncclProfiler_v6_t: the same functions over their own descriptor.
template <typename Descr>
struct ProfilerV5Layout {
  const char* name;
  Result (*init)(void** context, std::uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                 int nranks, int rank, DebugLogger logfn);
  Result (*startEvent)(void* context, void** eHandle, Descr* eDescr);
  Result (*stopEvent)(void* eHandle);
  Result (*recordEventState)(void* eHandle, EventState eState, EventStateArgs* eStateArgs);
  Result (*finalize)(void* context);
};
using ProfilerV5 = ProfilerV5Layout<EventDescrV5>;
using ProfilerV6 = ProfilerV5Layout<EventDescrV6>;

// --- the layout, pinned (LP64) ---

static_assert(sizeof(Result) == sizeof(int) && sizeof(EventState) == sizeof(int));
static_assert(offsetof(EventDescrV4, parentObj) == 8 && offsetof(EventDescrV4, rank) == 16);
static_assert(offsetof(EventDescrV4, coll.seqNumber) == 24 && offsetof(EventDescrV4, coll.func) == 32);
static_assert(offsetof(EventDescrV4, coll.count) == 56 && offsetof(EventDescrV4, coll.root) == 64);
static_assert(offsetof(EventDescrV4, coll.datatype) == 72 && offsetof(EventDescrV4, coll.nChannels) == 80);
static_assert(offsetof(EventDescrV4, p2p.func) == 24 && offsetof(EventDescrV4, p2p.datatype) == 40);
static_assert(offsetof(EventDescrV4, p2p.count) == 48 && offsetof(EventDescrV4, p2p.peer) == 56);
static_assert(offsetof(EventDescrV4, p2p.nChannels) == 60 && offsetof(EventDescrV4, kernelCh.channelId) == 24);
static_assert(sizeof(EventDescrV4) == 104);

template <typename Descr>
constexpr bool v5_layout() {  // v6 keeps v5's offsets for everything the plugin reads
  return offsetof(Descr, parentObj) == 8 && offsetof(Descr, rank) == 16 && offsetof(Descr, coll.seqNumber) == 24 &&
         offsetof(Descr, coll.func) == 32 && offsetof(Descr, coll.count) == 56 && offsetof(Descr, coll.root) == 64 &&
         offsetof(Descr, coll.datatype) == 72 && offsetof(Descr, coll.nChannels) == 80 &&
         offsetof(Descr, coll.parentGroup) == 104 && offsetof(Descr, p2p.func) == 24 &&
         offsetof(Descr, p2p.datatype) == 40 && offsetof(Descr, p2p.count) == 48 && offsetof(Descr, p2p.peer) == 56 &&
         offsetof(Descr, p2p.nChannels) == 60 && offsetof(Descr, p2p.parentGroup) == 64 &&
         offsetof(Descr, kernelCh.channelId) == 24 && sizeof(Descr) == 112;
}
static_assert(v5_layout<EventDescrV5>() && v5_layout<EventDescrV6>());
static_assert(offsetof(EventDescrV6, ce.ceColl.stream) == 104);
static_assert(sizeof(EventStateArgs) == 8);
static_assert(sizeof(ProfilerV4) == 48 && sizeof(ProfilerV5) == 48 && sizeof(ProfilerV6) == 48);

}  // namespace oomflight::nccl

#endif  // OOMFLIGHT_PLUGINS_NCCL_PROFILER_ABI_HPP
