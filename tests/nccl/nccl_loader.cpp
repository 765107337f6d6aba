// Test driver: loads the NCCL profiler plugin exactly as NCCL does (NCCL_PROFILER_PLUGIN: unset ->
// libnccl-profiler.so, a name -> libnccl-profiler-NAME.so, a path -> that file; dlopen RTLD_NOW | RTLD_LOCAL,
// dlsym ncclProfiler_vN) and calls it with the events NCCL would send, in NCCL's layouts (profiler_abi.hpp).
// Links liboomflight (as the job's framework would load it), not the plugin. No GPU, no NCCL.
//   oomflight_nccl_loader VERSION [N [quiet|threads|pool|many]]
// VERSION: v4, v5 or v6. N (default 5): allreduces; they are, on communicator 0x1234abcd "test-comm" of the
// MPI world's ranks, in this order:
//   allreduce seq 0, its stopEvent before its two kernel channels (the host end comes first, then the device's);
//   allreduce seq 1 .. N-2, two kernel channels each (started together, stopped together), then the stopEvent;
//   broadcast seq 0 from root 0 and a send of 256 bfloat16 to rank + 1, one kernel channel each;
//   allreduce seq N-1: its start alone (the rank is inside it when the dump comes).
// count 1 << 20 float32 for every collective. Also a group event (and, v5 on, a collective API event), which
// the plugin must ignore. Then rank 0 asks for a signal dump (after a barrier, so that every rank's events are in
// it) and prints the archive's path; every rank finalizes the plugin, dlcloses it and shuts oomflight down.
// quiet: oomflight is never initialised; every call must still succeed and hand out no handle.
// threads: one process; the main thread starts and stops N allreduces (seq 0 .. N-1, two channels each) while a
// second thread, as NCCL's proxy thread, reports each one's two kernel channels (at most 256 operations in
// flight: the plugin's 1024 slots must never run out), then the dump.
// pool: one thread starts N allreduces (seq 0 .. N-1, two channels each) and stops none, past the plugin's pool of
// 1024 operations in flight: the first 1024 get a handle, the others none (they are recorded untracked); the dump.
// many: 16 threads on the one communicator, each with at most one operation in flight: start (seq from a shared
// counter), its two kernel channels, its stop; N operations in all. Every start must get a handle. Then the dump.
// Exits 0 on success, 1 with a message on stderr.
#include <dlfcn.h>
#include <mpi.h>
#include <oomflight/oomflight.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "profiler_abi.hpp"

namespace nccl = oomflight::nccl;

namespace {

constexpr std::uint64_t kCommId = 0x1234abcd;
std::atomic<bool> g_failed{false};
int g_rank = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "nccl_loader[rank %d]: %s\n", g_rank, what.c_str());
  g_failed = true;
}

void logger(int level, unsigned long, const char*, int, const char* format, ...) {
  std::fprintf(stderr, "NCCL log (level %d): ", level);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
}

// ncclOpenProfilerPluginLib (NCCL's src/plugin/plugin_open.cc), in short.
void* open_plugin() {
  const char* name = std::getenv("NCCL_PROFILER_PLUGIN");
  if (name != nullptr && strcasecmp(name, "none") == 0) return nullptr;
  const std::string given = name != nullptr && *name != '\0' ? name : "libnccl-profiler.so";
  if (void* lib = dlopen(given.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
  std::fprintf(stderr, "nccl_loader: %s\n", dlerror());
  const std::string n = given;
  const bool library_name = n.rfind("lib", 0) == 0 && n.size() >= 3 && n.compare(n.size() - 3, 3, ".so") == 0;
  if (name == nullptr || *name == '\0' || n.find('/') != std::string::npos || library_name) return nullptr;
  const std::string full = "libnccl-profiler-" + n + ".so";
  void* lib = dlopen(full.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) std::fprintf(stderr, "nccl_loader: %s\n", dlerror());
  return lib;
}

nccl::Result call_init(const nccl::ProfilerV4& p, void** ctx, int* mask, int rank, int nranks) {
  return p.init(ctx, mask, "test-comm", kCommId, 1, nranks, rank, logger);
}
template <typename Descr>
nccl::Result call_init(const nccl::ProfilerV5Layout<Descr>& p, void** ctx, int* mask, int rank, int nranks) {
  return p.init(ctx, kCommId, mask, "test-comm", 1, nranks, rank, logger);
}

template <typename Profiler, typename Descr>
class Driver {
 public:
  Driver(const Profiler& p, void* ctx, bool quiet) : p_(p), ctx_(ctx), quiet_(quiet) {}

  void* start(const Descr& d, const char* what, bool expect_handle) {
    void* handle = nullptr;
    Descr copy = d;  // NCCL's descriptor lives on its stack only during the call
    check(p_.startEvent(ctx_, &handle, &copy), what);
    if ((handle != nullptr) != (expect_handle && !quiet_)) {
      fail(std::string(what) + (handle ? ": a handle, where none was expected" : ": no handle"));
    }
    std::memset(&copy, 0xa5, sizeof copy);
    return handle;
  }
  void stop(void* handle, const char* what) {
    if (handle != nullptr) check(p_.stopEvent(handle), what);
  }

  void* coll(const char* func, std::uint64_t seq, int root, int channels) {
    return start(coll_descr(func, seq, root, channels), func, true);
  }
  Descr coll_descr(const char* func, std::uint64_t seq, int root, int channels) {
    Descr d{};
    d.type = static_cast<decltype(d.type)>(nccl::kColl);
    d.rank = g_rank;
    d.coll.seqNumber = seq;
    d.coll.func = func;
    d.coll.count = 1u << 20;
    d.coll.root = root;
    d.coll.datatype = "ncclFloat32";
    d.coll.nChannels = static_cast<std::uint8_t>(channels);
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    return d;
  }
  void* send(int peer) {
    Descr d{};
    d.type = static_cast<decltype(d.type)>(nccl::kP2p);
    d.rank = g_rank;
    d.p2p.func = "Send";
    d.p2p.datatype = "ncclBfloat16";
    d.p2p.count = 256;
    d.p2p.peer = peer;
    d.p2p.nChannels = 1;
    return start(d, "Send", true);
  }
  // `channels` kernel channels of `parent`: all start, then all stop (state ncclProfilerKernelChStop first), as
  // NCCL's proxy thread reports them.
  void kernel_channels(void* parent, int channels) {
    void* handles[8] = {};
    for (int c = 0; c < channels; ++c) {
      Descr d{};
      d.type = static_cast<decltype(d.type)>(nccl::kKernelCh);
      d.parentObj = parent;
      d.kernelCh.channelId = static_cast<std::uint8_t>(c);
      d.kernelCh.pTimer = 1000 + c;
      handles[c] = start(d, "KernelCh", parent != nullptr);
    }
    for (int c = 0; c < channels; ++c) {
      if (handles[c] == nullptr) continue;
      nccl::EventStateArgs args{};
      args.kernelCh.pTimer = 2000 + c;
      check(p_.recordEventState(handles[c], nccl::kKernelChStop, &args), "recordEventState");
      stop(handles[c], "KernelCh");
    }
  }
  void ignored(std::uint64_t type) {
    Descr d{};
    d.type = static_cast<decltype(d.type)>(type);
    start(d, "group or API event", false);
  }

  void run(int rank, int nranks, int n) {
    ignored(nccl::kGroup);
    if constexpr (!std::is_same_v<Descr, nccl::EventDescrV4>) ignored(nccl::kCollApi);
    void* first = coll("AllReduce", 0, 0, 2);
    stop(first, "AllReduce");
    kernel_channels(first, 2);
    for (int seq = 1; seq < n - 1; ++seq) {
      void* h = coll("AllReduce", static_cast<std::uint64_t>(seq), 0, 2);
      kernel_channels(h, 2);
      stop(h, "AllReduce");
    }
    void* bcast = coll("Broadcast", 0, 0, 1);
    kernel_channels(bcast, 1);
    stop(bcast, "Broadcast");
    void* s = send((rank + 1) % nranks);
    kernel_channels(s, 1);
    stop(s, "Send");
    coll("AllReduce", static_cast<std::uint64_t>(n - 1), 0, 2);  // never completes
  }

  void run_pool(int n) {
    constexpr int kPool = 1024;  // profiler_core.cpp's kSlots
    for (int seq = 0; seq < n; ++seq) {
      Descr d = coll_descr("AllReduce", static_cast<std::uint64_t>(seq), 0, 2);
      start(d, "AllReduce", seq < kPool);
    }
  }

  void run_many(int n) {
    constexpr int kThreads = 16;
    std::atomic<std::uint64_t> next_seq{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (;;) {
          const std::uint64_t seq = next_seq.fetch_add(1);
          if (seq >= static_cast<std::uint64_t>(n)) return;
          void* h = coll("AllReduce", seq, 0, 2);
          kernel_channels(h, 2);
          stop(h, "AllReduce");
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  void run_threads(int n) {
    constexpr std::uint64_t kInFlight = 256;
    std::vector<std::atomic<void*>> queue(kInFlight);
    std::atomic<std::uint64_t> published{0}, reported{0};
    const auto ops = static_cast<std::uint64_t>(n);
    std::thread proxy([&] {
      for (std::uint64_t i = 0; i < ops; ++i) {
        while (published.load(std::memory_order_acquire) == i) std::this_thread::yield();
        kernel_channels(queue[i % kInFlight].load(std::memory_order_relaxed), 2);
        reported.store(i + 1, std::memory_order_release);
      }
    });
    for (std::uint64_t seq = 0; seq < ops; ++seq) {
      while (seq - reported.load(std::memory_order_acquire) >= kInFlight) std::this_thread::yield();
      void* h = coll("AllReduce", seq, 0, 2);
      queue[seq % kInFlight].store(h, std::memory_order_relaxed);
      published.store(seq + 1, std::memory_order_release);
      stop(h, "AllReduce");  // enqueued: before, during or after its channels on the other thread
    }
    proxy.join();
  }

 private:
  void check(nccl::Result r, const char* what) {
    if (r != nccl::kSuccess) fail(std::string(what) + ": the plugin returned " + std::to_string(r));
  }
  const Profiler& p_;
  void* ctx_;
  bool quiet_;
};

template <typename Profiler, typename Descr>
void drive(void* symbol, int rank, int nranks, int n, bool quiet, const std::string& mode) {
  const auto& p = *static_cast<const Profiler*>(symbol);
  if (p.name == nullptr || std::strcmp(p.name, "oomflight") != 0) fail("the plugin's name is not \"oomflight\"");
  void* ctx = nullptr;
  int mask = 0;
  if (const auto r = call_init(p, &ctx, &mask, rank, nranks); r != nccl::kSuccess) {
    fail("init returned " + std::to_string(r));
    return;
  }
  const int wanted = static_cast<int>(nccl::kColl | nccl::kP2p | nccl::kKernelCh);
  if ((mask & wanted) != wanted) fail("init's activation mask " + std::to_string(mask) + " lacks Coll, P2p or KernelCh");
  if (ctx == nullptr) fail("init gave no context");
  Driver<Profiler, Descr> driver(p, ctx, quiet);
  if (mode == "threads") {
    driver.run_threads(n);
  } else if (mode == "pool") {
    driver.run_pool(n);
  } else if (mode == "many") {
    driver.run_many(n);
  } else {
    driver.run(rank, nranks, n);
  }
  if (!quiet) {
    // Every rank's events are recorded before the dump freezes them (MPI is oomflight's, under a launcher).
    if (oomflight_launched_by_mpi()) MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
      request.kind = OOMFLIGHT_DUMP_SIGNAL;
      request.reason = "nccl_loader";
      oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
      if (oomflight_request_dump(&request, &result) != OOMFLIGHT_OK) {
        fail(std::string("the dump failed: ") + oomflight_last_error());
      } else {
        std::printf("archive %s\n", oomflight_last_dump_path());
      }
    }
  }
  if (const auto r = p.finalize(ctx); r != nccl::kSuccess) fail("finalize returned " + std::to_string(r));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string version = argc > 1 ? argv[1] : "v5";
  const int n = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::string mode = argc > 3 ? argv[3] : "";
  const bool quiet = mode == "quiet";
  if ((version != "v4" && version != "v5" && version != "v6") || n < 2 || n > 10000000 ||
      (argc > 3 && mode != "quiet" && mode != "threads" && mode != "pool" && mode != "many")) {
    std::fprintf(stderr, "usage: %s v4|v5|v6 [N (2 .. 10^7) [quiet|threads|pool|many]]\n", argv[0]);
    return 2;
  }
  int rank = 0, nranks = 1;
  if (!quiet) {
    if (oomflight_init() != OOMFLIGHT_OK || oomflight_rank(&rank, &nranks) != OOMFLIGHT_OK) {
      std::fprintf(stderr, "nccl_loader: oomflight_init: %s\n", oomflight_last_error());
      return 1;
    }
    g_rank = rank;
    oomflight_mark_batch(0);  // as a training job does: the records carry batch 0
  }
  void* lib = open_plugin();
  if (lib == nullptr) {
    fail("no profiler plugin could be opened");
    return 1;
  }
  void* symbol = dlsym(lib, ("ncclProfiler_" + version).c_str());
  if (symbol == nullptr) {
    fail("ncclProfiler_" + version + " not found");
  } else if (version == "v4") {
    drive<nccl::ProfilerV4, nccl::EventDescrV4>(symbol, rank, nranks, n, quiet, mode);
  } else if (version == "v5") {
    drive<nccl::ProfilerV5, nccl::EventDescrV5>(symbol, rank, nranks, n, quiet, mode);
  } else {
    drive<nccl::ProfilerV6, nccl::EventDescrV6>(symbol, rank, nranks, n, quiet, mode);
  }
  if (dlclose(lib) != 0) fail(std::string("dlclose: ") + dlerror());
  if (!quiet && oomflight_shutdown() != OOMFLIGHT_OK) fail(std::string("oomflight_shutdown: ") + oomflight_last_error());
  if (quiet && !g_failed) std::printf("quiet: every call succeeded, no handle was handed out\n");
  return g_failed ? 1 : 0;
}
