// oomflight's PyTorch extension: attaches a TraceTracker (trace_tracker.hpp) to the CUDA caching allocator's
// trace-tracker and out-of-memory-observer hooks. Built ahead of time by `pip install --no-build-isolation` against
// the torch in that environment (python/setup.py), or at first use as a fallback (oomflight/_extension.py); loaded
// by oomflight.torch.install(). Every entry point catches everything and returns a message instead: a failure here
// must leave training untouched.
//
// Hooks (c10/cuda/CUDACachingAllocator.h, torch 2.4 .. 2.11): attachAllocatorTraceTracker calls the tracker for
// every TraceEntry with the device's allocator mutex held; the native allocator hands it to the device allocators
// that exist at that moment (a tracker attached before CUDA's initialisation, or with no device, reaches none),
// it cannot be detached, and the cudaMallocAsync backend throws on it. attachOutOfMemoryObserver is called after
// the OOM entry, mutex released, before OutOfMemoryError is thrown.
//
// The two callbacks handed to torch are built once (Plugin::trace_callback, Plugin::oom_observer); the functions
// whose names start with an underscore feed torch's own TraceEntry, DeviceStats and SnapshotInfo objects through
// those same callbacks' bodies, so that the tests exercise exactly what torch calls, on a machine with no GPU.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/version.h>

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "context_table.hpp"
#include "job_store.hpp"
#include "python_stacks.hpp"
#include "python_thread.hpp"
#include "trace_tracker.hpp"

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
namespace abi = oomflight::torch_plugin::abi;
using oomflight::torch_plugin::AllocatorState;
using oomflight::torch_plugin::CApiTable;
using oomflight::torch_plugin::ExactStats;
using oomflight::torch_plugin::PythonStacks;
using oomflight::torch_plugin::TraceTracker;
using Entry = alloc::TraceEntry;
using Context = std::shared_ptr<c10::GatheredContext>;
using ContextTable = oomflight::torch_plugin::ContextTable<Context>;
using abi_forced_unwind = __cxxabiv1::__forced_unwind;  // pthread_exit's unwinding: must never be swallowed

std::vector<std::int32_t> intern_contexts(const CApiTable& api, const std::vector<const Context*>& contexts);

using oomflight::torch_plugin::escape_nul;
using oomflight::torch_plugin::holds_gil;
using oomflight::torch_plugin::python_finalizing;
using oomflight::torch_plugin::python_usable;

// Thrown by HelperGil instead of taking the GIL of an interpreter that is finalising.
struct InterpreterFinalising {};

// The GIL for this scope, on a helper thread of the extension. Not pybind11::gil_scoped_acquire: when Python
// exits while a helper runs Python code (torch's first symbolize imports for seconds), the interpreter ends the
// helper with pthread_exit at its next take of the GIL, and the unwinding runs this destructor; pybind11's then
// throws ("thread state must be current") and std::terminate aborts the job's exit (SIGABRT, or SIGSEGV: found
// with a job that exits within a second of its first kept context, on the code before issue 32 too). A thread
// the interpreter is ending gives nothing back.
//
// The constructor is not noexcept, and no frame between it and the thread's entry may be: PyGILState_Ensure ends
// this thread with pthread_exit once the interpreter finalises, and that forced unwinding reaching a noexcept
// frame is std::terminate (SIGABRT: a dump on another thread while the job called sys.exit, issue 39). Seen
// finalising before the take, it throws InterpreterFinalising instead: the helper gives its job up.
class HelperGil {
 public:
  HelperGil() {
    if (!python_usable()) throw InterpreterFinalising{};
    state_ = PyGILState_Ensure();
  }
  ~HelperGil() {
    if (!python_finalizing()) PyGILState_Release(state_);
  }
  HelperGil(const HelperGil&) = delete;
  HelperGil& operator=(const HelperGil&) = delete;

 private:
  PyGILState_STATE state_ = PyGILState_UNLOCKED;
};

// torch's symbolize once on one context (with the GIL): its first call in a process imports much of torch.
void warm_up_symbolize(const Context& context) {
  auto* tb = dynamic_cast<torch::CapturedTraceback*>(context.get());
  if (tb == nullptr) return;
  HelperGil gil;
  torch::symbolize({tb});
}

// Symbolises the contexts a freeze asks for (docs/pytorch.md, "Python stacks"). torch's symboliser needs the GIL,
// and the freezing thread may be oomflight's watcher while the training thread holds the GIL in a collective:
// waiting for the GIL there could hang the dump. So a thread that holds the GIL symbolises at once; any other
// hands the work to this helper thread and waits at most the resolver's timeout. Work that finishes after its
// caller gave up is still remembered in the table, for the next freeze. A job the helper cannot finish (the
// interpreter is finalising: the process exits during a dump) ends at once, and its caller's log line says so.
class Symbolizer {
 public:
  Symbolizer(const CApiTable& api, ContextTable& table) : api_(api), table_(table) {}

  // true with `ids` filled (one per context, -1 where a context has no Python frames), false when it gave up.
  bool run(const std::vector<Context>& contexts, const std::vector<std::int32_t>& deferred,
           std::vector<std::int32_t>& ids, std::uint32_t timeout_ms) {
    if (!python_usable()) {
      not_symbolised("the Python stacks of " + std::to_string(contexts.size()) + " events", Stage::finalising, 0);
      return false;
    }
    if (holds_gil()) {
      ids = symbolize(contexts);
      return true;
    }
    auto job = std::make_shared<Job>();
    job->contexts = contexts;
    job->deferred = deferred;
    if (!post_and_wait(job, timeout_ms, "the Python stacks of " + std::to_string(contexts.size()) + " events")) {
      return false;
    }
    ids = job->ids;
    return true;
  }

  // Runs `work` with the GIL: at once on a thread that holds it, else on the helper, waiting at most timeout_ms.
  // `work` must own what it uses (it may finish after this returns false). True when it ran in time.
  bool run_with_gil(std::function<void()> work, std::uint32_t timeout_ms) {
    if (!python_usable()) {
      not_symbolised("oomflight's Python stacks", Stage::finalising, 0);
      return false;
    }
    if (holds_gil()) {
      work();
      return true;
    }
    auto job = std::make_shared<Job>();
    job->work = std::move(work);
    return post_and_wait(job, timeout_ms, "oomflight's Python stacks");
  }

  // torch's first symbolisation in a process imports half of torch (torch._dynamo and more: 1.8 s of imports
  // on the 2-core machine of docs/performance.md). Doing that with the first context kept, on the helper, means
  // a dump does not pay it within its deadline. Thread-safe; once.
  void warm_up(const Context& first) {
    if (warming_.exchange(true)) return;
    auto job = std::make_shared<Job>();
    job->contexts.push_back(first);
    job->warm_up = true;
    post(job);
  }
  bool warm() const { return warm_.load(); }

  // At process exit, before torch's statics go: no new work; a thread waiting for the GIL is left as it is.
  void stop() {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    wake_.notify_all();
    if (thread_.joinable()) thread_.detach();
  }

 private:
  // Where a job is; what its caller's log line says when it waited in vain.
  enum class Stage {
    queued,            // behind an earlier job of the helper's
    waiting_for_gil,   // the helper waits for the GIL, which another thread holds
    holding_gil,       // the helper holds the GIL and symbolises: the work itself takes this long
    done,
    failed,            // the work threw (named in `error`)
    finalising,        // the interpreter is finalising: nothing was taken, the job given up
    ended,             // the interpreter ended the helper (pthread_exit) inside the job: the process is exiting
  };
  struct Job {
    std::vector<Context> contexts;
    std::vector<std::int32_t> deferred;
    std::vector<std::int32_t> ids;
    Stage stage = Stage::queued;
    std::string error;
    bool warm_up = false;  // symbolise only: nothing is interned
    std::function<void()> work;  // run_with_gil's: run under the GIL instead
  };

  // The one line a caller that did not get its stacks logs, naming the real cause.
  void not_symbolised(const std::string& what, Stage stage, std::uint32_t timeout_ms, const std::string& error = "") {
    std::string why;
    switch (stage) {
      case Stage::queued:
        why = "were not symbolised within " + std::to_string(timeout_ms) +
              " ms: the helper thread had not taken them up yet (it was busy with an earlier freeze's, or starting)";
        break;
      case Stage::waiting_for_gil:
        why = "were not symbolised within " + std::to_string(timeout_ms) +
              " ms: the helper thread was still waiting to take the GIL (another thread held it)";
        break;
      case Stage::holding_gil:
        why = "were not symbolised within " + std::to_string(timeout_ms) +
              " ms: the helper held the GIL, and symbolising them took longer than that (it goes on; a later dump "
              "gets them)";
        break;
      case Stage::failed:
        why = "were not symbolised: " + error;
        break;
      case Stage::finalising:
      case Stage::ended:
        why = "were not symbolised: the Python interpreter is finalising (the process is exiting), and no thread "
              "may take the GIL then";
        break;
      case Stage::done:
        return;
    }
    api_.log(abi::kLogWarn, (what + " " + why + "; their events are recorded with no call site").c_str());
  }

  // Queues `job` and waits for it at most timeout_ms; false (logged once, naming `what` and why) when it did not
  // finish.
  bool post_and_wait(const std::shared_ptr<Job>& job, std::uint32_t timeout_ms, const std::string& what) {
    if (!post(job)) {
      not_symbolised(what, Stage::finalising, timeout_ms);
      return false;
    }
    std::unique_lock lock(mutex_);
    finished_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return ended(job->stage); });
    const Stage stage = job->stage;
    const std::string error = job->error;
    lock.unlock();
    if (stage == Stage::done) return true;
    not_symbolised(what, stage, timeout_ms, error);
    return false;
  }

  static bool ended(Stage s) { return s != Stage::queued && s != Stage::waiting_for_gil && s != Stage::holding_gil; }

  // Queues a job for the helper thread (started at the first); false once stopped.
  bool post(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_) return false;
      queue_.push_back(job);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    wake_.notify_one();
    return true;
  }

  std::vector<std::int32_t> symbolize(const std::vector<Context>& contexts) {
    std::vector<const Context*> pointers;
    pointers.reserve(contexts.size());
    for (const Context& c : contexts) pointers.push_back(&c);
    return intern_contexts(api_, pointers);
  }

  void set_stage(Job& job, Stage stage) {
    std::lock_guard lock(mutex_);
    job.stage = stage;
  }

  // The helper's end of a job, however it ends: normally, by an exception, or by the interpreter ending this
  // thread inside it (pthread_exit's forced unwinding runs this guard's destructor), so that its caller never
  // waits out its timeout for a job nobody runs any more.
  struct Finish {
    Finish(Symbolizer& s, Job& j) : self(s), job(j) {}
    Finish(const Finish&) = delete;
    Finish& operator=(const Finish&) = delete;
    Symbolizer& self;
    Job& job;
    Stage stage = Stage::ended;  // unless the job says otherwise before the guard goes
    std::vector<std::int32_t> ids;
    std::string error;
    ~Finish() {
      try {
        for (std::size_t k = 0; k < ids.size() && k < job.deferred.size(); ++k) {
          if (ids[k] >= 0) self.table_.remember(job.deferred[k], ids[k]);
        }
        {
          std::lock_guard lock(self.mutex_);
          job.ids = std::move(ids);
          job.ids.resize(job.contexts.size(), -1);
          job.stage = stage;
          job.error = std::move(error);
          if (job.warm_up && stage == Stage::done) self.warm_ = true;
        }
        self.finished_.notify_all();
      } catch (...) {
      }
    }
  };

  void run_job(Job& job) {
    Finish finish(*this, job);
    try {
      set_stage(job, Stage::waiting_for_gil);
      HelperGil gil;  // throws InterpreterFinalising; may end this thread (pthread_exit) if finalising begins now
      set_stage(job, Stage::holding_gil);
      if (job.work) {
        job.work();
      } else if (job.warm_up) {
        warm_up_symbolize(job.contexts.front());
      } else {
        finish.ids = symbolize(job.contexts);
      }
      finish.stage = Stage::done;
    } catch (abi_forced_unwind&) {
      throw;  // the interpreter ends this thread: let it (Finish tells the caller)
    } catch (const InterpreterFinalising&) {
      finish.stage = Stage::finalising;
    } catch (const std::exception& e) {
      finish.error = e.what();
      finish.stage = Stage::failed;
    } catch (...) {
      finish.error = "an unknown error";
      finish.stage = Stage::failed;
    }
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
        if (stopped_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      run_job(*job);
    }
  }

  CApiTable api_;
  ContextTable& table_;
  std::atomic<bool> warming_{false}, warm_{false};
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::thread thread_;
  bool stopped_ = false;
};

// Empties the context table's stale slots every 20 ms, on its own thread: dropping a context may take torch's
// locks, which the tracker must never do (context_table.hpp).
class Reclaimer {
 public:
  Reclaimer(ContextTable& table, Symbolizer& symbolizer)
      : table_(table), symbolizer_(symbolizer), thread_([this] { loop(); }) {}
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(20), [&] { return stopped_; })) {
      lock.unlock();
      table_.reclaim();
      if (!warm_up_asked_ && table_.kept() > 0) {
        // The first context this process kept (deferred id -2: sequence 0), if the history still holds it.
        if (auto first = table_.find(-2); first.found && first.context) symbolizer_.warm_up(first.context);
        warm_up_asked_ = true;
      }
      lock.lock();
    }
  }
  ContextTable& table_;
  Symbolizer& symbolizer_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  bool warm_up_asked_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

// What is attached. Built once and never freed (torch cannot detach a hook): lives until the process ends.
struct Plugin {
  explicit Plugin(const CApiTable& api) : api(api), tracker(api) {}
  CApiTable api;
  TraceTracker tracker;
  alloc::AllocatorTraceTracker trace_callback;  // the exact callables torch holds (copies of these)
  alloc::OutOfMemoryObserver oom_observer;
  bool attached = false;  // handed to the allocator
  int devices = 0;        // CUDA devices visible when attached (0: torch passed the hooks to no device allocator)
  // Python stacks of live events (when liboomflight has oomflight_set_stack_resolver)
  std::unique_ptr<ContextTable> contexts;
  std::unique_ptr<Symbolizer> symbolizer;
  std::unique_ptr<Reclaimer> reclaimer;
  // oomflight's own capture of the allocating thread's Python stack (stacks "python", the default): for entries
  // that come without torch's context
  std::unique_ptr<PythonStacks> python_stacks;
  std::string stacks = "python";  // off, python or torch (OOMFLIGHT_STACKS; oomflight.torch.install)
};
Plugin* g_plugin = nullptr;

std::int32_t keep_context(void* sink, const void* context) noexcept {
  return static_cast<ContextTable*>(sink)->put(*static_cast<const Context*>(context));
}

std::int32_t capture_python_stack(void* sink) noexcept { return static_cast<PythonStacks*>(sink)->capture(); }

// Symbolises and interns oomflight's own stacks not interned yet (with the GIL; each stack once, remembered).
void intern_python_stacks(const CApiTable& api, PythonStacks& stacks, const std::vector<std::int32_t>& deferred) {
  std::vector<abi::Frame> frames;
  for (const std::int32_t d : deferred) {
    if (stacks.interned(d) >= 0) continue;
    const std::vector<PythonStacks::Frame> resolved = stacks.resolve(d);
    if (resolved.empty()) continue;
    frames.clear();
    for (const auto& [function, file, line] : resolved) {
      abi::Frame f;
      f.function = function.c_str();
      f.file = file.c_str();
      f.line = line;
      frames.push_back(f);
    }
    std::int32_t id = -1;
    if (api.intern_stack(frames.data(), frames.size(), &id) == 0 && id >= 0) stacks.remember(d, id);
  }
}

// oomflight_stack_resolver: liboomflight calls it at every freeze with the deferred ids of the frozen events:
// oomflight's own stacks (PythonStacks::owns) and torch's contexts (the context table's).
int resolve_stacks(void* user, const std::int32_t* deferred, std::size_t count, std::int32_t* ids,
                   std::uint32_t timeout_ms) noexcept {
  try {
    Plugin& p = *static_cast<Plugin*>(user);
    std::vector<std::size_t> ours, theirs;
    for (std::size_t i = 0; i < count; ++i) {
      ids[i] = -1;
      (PythonStacks::owns(deferred[i]) ? ours : theirs).push_back(i);
    }
    if (!ours.empty() && p.python_stacks) {
      std::vector<std::int32_t> todo;
      for (const std::size_t i : ours) {
        if (p.python_stacks->interned(deferred[i]) < 0) todo.push_back(deferred[i]);
      }
      std::sort(todo.begin(), todo.end());
      todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
      if (!todo.empty()) {
        Plugin* plugin = &p;  // lives until the process ends, as does its table
        p.symbolizer->run_with_gil([plugin, todo] { intern_python_stacks(plugin->api, *plugin->python_stacks, todo); },
                                   timeout_ms);
      }
      for (const std::size_t i : ours) ids[i] = p.python_stacks->interned(deferred[i]);
    }
    if (!theirs.empty() && p.contexts) {
      std::vector<std::int32_t> their_deferred, their_ids(theirs.size(), -1);
      for (const std::size_t i : theirs) their_deferred.push_back(deferred[i]);
      p.contexts->resolve(their_deferred.data(), their_deferred.size(), their_ids.data(),
                          [&](const std::vector<Context>& contexts, const std::vector<std::int32_t>& context_ids,
                              std::vector<std::int32_t>& stack_ids) {
                            return p.symbolizer->run(contexts, context_ids, stack_ids, timeout_ms);
                          });
      for (std::size_t k = 0; k < theirs.size(); ++k) ids[theirs[k]] = their_ids[k];
    }
    return 0;
  } catch (...) {
    return 1;  // the ids left at -1: events without stacks, never a failed dump
  }
}

// Keeps entries' contexts, captures Python stacks for the entries without one (stacks "python"), and registers
// the resolver, when this liboomflight can take deferred stacks. Stacks "off": none of it.
void start_stacks(Plugin& p) {
  if (p.api.set_stack_resolver == nullptr || p.stacks == "off") return;
  std::uint64_t max_entries = 0;
  p.api.set_stack_resolver(nullptr, nullptr, &max_entries);
  if (max_entries == 0) return;  // not initialised: no history to keep contexts for
  const std::size_t keep = std::min<std::size_t>(static_cast<std::size_t>(max_entries), ContextTable::kMaxKeep);
  p.contexts = std::make_unique<ContextTable>(keep);
  p.symbolizer = std::make_unique<Symbolizer>(p.api, *p.contexts);
  p.reclaimer = std::make_unique<Reclaimer>(*p.contexts, *p.symbolizer);
  p.tracker.set_context_sink(&keep_context, p.contexts.get());
  if (p.stacks == "python") {
    // Bounded by the history: at most one new stack per event it keeps, 65,536 stacks, 16 frames a stack on
    // average (16 bytes a frame: 16 MiB at most).
    const std::size_t max_stacks = std::min<std::size_t>(keep, 65536);
    p.python_stacks = std::make_unique<PythonStacks>(max_stacks, max_stacks * 16);
    p.tracker.set_stack_capture(&capture_python_stack, p.python_stacks.get());
  }
  p.api.set_stack_resolver(&resolve_stacks, &p, nullptr);
  // Registered after torch's statics were built, so run before they are destroyed: the reclaimer drops
  // contexts through torch's CapturedTraceback code.
  std::atexit([] {
    if (g_plugin != nullptr && g_plugin->reclaimer) g_plugin->reclaimer->stop();
    if (g_plugin != nullptr && g_plugin->symbolizer) g_plugin->symbolizer->stop();
  });
}

// Names in the archive's metadata (the report prints it with the origin) which call sites the events carry, so
// that a report without stacks says why, and one with them says whose they are.
void note_call_sites(const Plugin& p) {
  if (p.api.set_metadata == nullptr) return;
  std::string what;
  if (p.python_stacks) {
    what = std::string("python (oomflight's own capture of the allocating thread's stack, frames read ") +
           (std::string(PythonStacks::method()) == "in place" ? "in place" : "through the public frame API") +
           "; torch's contexts where the job records memory history)";
  } else if (p.contexts) {
    what = p.stacks == "torch" ? "torch (torch's contexts: its memory history with Python frames)"
                               : "torch's contexts only, where the job records memory history";
  } else {
    what = p.stacks == "off" ? "off (no call sites recorded)" : "none (this liboomflight takes no deferred stacks)";
  }
  p.api.set_metadata("oomflight.call_sites", what.c_str());
}

// PyTorch's format_size, so that the archive's reason reads like torch's own OutOfMemoryError.
std::string format_size(std::uint64_t bytes) {
  char text[64];
  if (bytes <= 1024) {
    std::snprintf(text, sizeof text, "%" PRIu64 " bytes", bytes);
  } else if (bytes <= 1048576) {
    std::snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
  } else if (bytes <= 1073741824ull) {
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  }
  return text;
}

template <typename Function>
Function* function_at(const std::map<std::string, std::uint64_t>& addresses, const char* name) {
  const auto it = addresses.find(name);
  if (it == addresses.end() || it->second == 0) return nullptr;
  return reinterpret_cast<Function*>(static_cast<std::uintptr_t>(it->second));
}

// Symbolises contexts that torch gathered (CapturedTraceback: _record_memory_history's context recording, or
// CapturedTraceback::gather) and interns each as a stack, innermost frame first as torch lists them. Returns one
// stack id per context, -1 where it has none. Takes the GIL (torch's Python symboliser reads code objects): never
// with the allocator mutex held (observer time, or a test).
std::vector<std::int32_t> intern_contexts(const CApiTable& api, const std::vector<const Context*>& contexts) {
  std::vector<std::int32_t> ids(contexts.size(), -1);
  std::vector<torch::CapturedTraceback*> tracebacks;
  std::vector<std::size_t> owners;
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    if (contexts[i] == nullptr || !*contexts[i]) continue;
    if (auto* tb = dynamic_cast<torch::CapturedTraceback*>(contexts[i]->get())) {
      tracebacks.push_back(tb);
      owners.push_back(i);
    }
  }
  if (tracebacks.empty()) return ids;
  torch::SymbolizedTracebacks symbolized;
  {
    HelperGil gil;
    symbolized = torch::symbolize(tracebacks);
  }
  // torch's names as C strings: a NUL it kept inside a name becomes "\x00" (escape_nul), so that the C API's
  // copy keeps what follows it; once per frame of the batch.
  for (auto& f : symbolized.all_frames) {
    if (f.funcname.find('\0') != std::string::npos) f.funcname = escape_nul(std::move(f.funcname));
    if (f.filename.find('\0') != std::string::npos) f.filename = escape_nul(std::move(f.filename));
  }
  std::vector<abi::Frame> frames;
  // Many contexts share a call site (every step allocates from the same lines): intern each stack once.
  std::map<std::vector<std::uint64_t>, std::int32_t> interned;
  for (std::size_t k = 0; k < symbolized.tracebacks.size() && k < owners.size(); ++k) {
    if (const auto it = interned.find(symbolized.tracebacks[k]); it != interned.end()) {
      ids[owners[k]] = it->second;
      continue;
    }
    frames.clear();
    for (const std::uint64_t index : symbolized.tracebacks[k]) {
      if (index >= symbolized.all_frames.size()) continue;
      const auto& f = symbolized.all_frames[index];
      abi::Frame frame;
      frame.function = f.funcname.c_str();
      frame.file = f.filename.c_str();
      frame.line = static_cast<std::int32_t>(f.lineno);
      frames.push_back(frame);
    }
    std::int32_t id = -1;
    if (api.intern_stack(frames.data(), frames.size(), &id) == 0) ids[owners[k]] = id;
    interned.emplace(symbolized.tracebacks[k], ids[owners[k]]);
  }
  return ids;
}

// The failing device's state from torch's snapshot, as the C API's rows (PyTorch's _snapshot lays blocks out the
// same way: each block's address is its segment's plus the sizes of the blocks before it).
struct StateRows {
  std::vector<abi::SegmentState> segments;
  std::vector<abi::SegmentDetail> details;  // one per segment: its pool, pool kind and frames
  std::vector<abi::BlockState> blocks;
};

StateRows state_rows(const CApiTable& api, const alloc::SnapshotInfo& snapshot, int device) {
  StateRows rows;
  std::vector<const Context*> contexts;
  for (const auto& segment : snapshot.segments) {
    if (static_cast<int>(segment.device) != device) continue;
    abi::SegmentState s;
    s.address = static_cast<std::uint64_t>(segment.address);
    s.total_size = static_cast<std::uint64_t>(segment.total_size);
    s.stream = oomflight::torch_plugin::stream_value(segment.stream);
    s.device = static_cast<std::int32_t>(segment.device);
    s.is_expandable = segment.is_expandable ? 1 : 0;
    rows.segments.push_back(s);
    abi::SegmentDetail d;
    d.pool_id[0] = static_cast<std::uint64_t>(segment.owner_private_pool_id.first);
    d.pool_id[1] = static_cast<std::uint64_t>(segment.owner_private_pool_id.second);
    d.segment_type = segment.is_large ? 0 : 1;
    rows.details.push_back(d);
    std::uint64_t address = s.address;
    for (const auto& block : segment.blocks) {
      abi::BlockState b;
      b.address = address;
      b.size = static_cast<std::uint64_t>(block.size);
      b.requested_size = static_cast<std::uint64_t>(block.requested_size);
      b.state = block.allocated ? abi::kBlockActiveAllocated
                                : (block.active ? abi::kBlockActivePendingFree : abi::kBlockInactive);
      rows.blocks.push_back(b);
      contexts.push_back(&block.context_when_allocated);
      address += b.size;
    }
  }
  // The segments' own frames (where each was cudaMalloc'd) after the blocks', interned in the same pass.
  for (const auto& segment : snapshot.segments) {
    if (static_cast<int>(segment.device) == device) contexts.push_back(&segment.context_when_allocated);
  }
  const std::vector<std::int32_t> stacks = intern_contexts(api, contexts);
  for (std::size_t i = 0; i < rows.blocks.size(); ++i) rows.blocks[i].stack_id = stacks[i];
  for (std::size_t i = 0; i < rows.details.size(); ++i) rows.details[i].stack_id = stacks[rows.blocks.size() + i];
  return rows;
}

// The observer's body: torch's exact figures (getDeviceStats) and state (snapshot) when it could give them.
void observe(Plugin& p, std::int64_t device, std::size_t alloc_bytes, std::size_t device_total,
             std::size_t device_free, const alloc::DeviceStats* stats, const alloc::SnapshotInfo* snapshot) {
  ExactStats exact;
  if (stats != nullptr) {
    constexpr std::size_t kAggregate = 0;  // StatType::AGGREGATE
    exact.allocated = stats->allocated_bytes[kAggregate].current;
    exact.reserved = stats->reserved_bytes[kAggregate].current;
    exact.peak_allocated = stats->allocated_bytes[kAggregate].peak;
    exact.peak_reserved = stats->reserved_bytes[kAggregate].peak;
  }
  std::string reason;
  StateRows rows;
  AllocatorState state;
  bool have_state = false;
  try {
    // torch's own wording, with the device's capacity, not the cap torch hands its observers in its place.
    const auto [capacity, cap] = p.tracker.capacity_and_cap(static_cast<int>(device), device_total);
    reason = "CUDA out of memory. Tried to allocate " + format_size(alloc_bytes) + ". GPU " + std::to_string(device) +
             " has a total capacity of " + format_size(capacity) + " of which " + format_size(device_free) +
             " is free.";
    if (cap != 0) reason += " " + format_size(cap) + " allowed; (torch.cuda.set_per_process_memory_fraction)";
    if (snapshot != nullptr) {
      rows = state_rows(p.api, *snapshot, static_cast<int>(device));
      state = AllocatorState{rows.segments.data(), rows.details.data(), rows.segments.size(), rows.blocks.data(),
                             rows.blocks.size()};
      have_state = !rows.segments.empty();
    }
  } catch (abi_forced_unwind&) {
    throw;  // the interpreter ends this thread (its GIL taken at finalisation): never swallowed
  } catch (const InterpreterFinalising&) {
    p.api.log(abi::kLogWarn, "the allocator state at the OOM is not in the archive: the Python interpreter is "
                             "finalising (its call sites cannot be read)");
  } catch (const std::exception& e) {
    p.api.log(abi::kLogWarn, (std::string("the allocator state at the OOM is not in the archive: ") + e.what()).c_str());
  } catch (...) {
  }
  p.tracker.on_out_of_memory(static_cast<int>(device), alloc_bytes, device_total, device_free,
                             stats != nullptr ? &exact : nullptr, reason.c_str(), have_state ? &state : nullptr);
}

// torch's snapshot of every device: SnapshotInfo snapshot(MempoolId_t, bool include_traces) since 2.6 (without
// traces: the ring has them), snapshot() before.
template <typename Allocator>
auto snapshot_of(Allocator* a, int) -> decltype(a->snapshot(c10::cuda::MempoolId_t{0, 0}, false)) {
  return a->snapshot(c10::cuda::MempoolId_t{0, 0}, false);
}
template <typename Allocator>
auto snapshot_of(Allocator* a, long) -> decltype(a->snapshot()) {
  return a->snapshot();
}

// addresses: C API function name -> address (ctypes); seeds: (device, allocated, reserved, capacity) per device.
// Builds the tracker and the two callbacks once; with `to_allocator`, hands them to torch's allocator.
// Returns "" when done, else why not (nothing is attached then).
std::string attach(const std::map<std::string, std::uint64_t>& addresses,
                   const std::vector<std::tuple<int, std::int64_t, std::int64_t, std::uint64_t>>& seeds,
                   bool to_allocator, int devices, const std::string& stacks) {
  try {
    if (stacks != "off" && stacks != "python" && stacks != "torch") {
      return "stacks must be off, python or torch, not '" + stacks + "'";
    }
    if (g_plugin == nullptr) {
      CApiTable api;
      api.abi_version = function_at<int()>(addresses, "oomflight_abi_version");
      api.record = function_at<int(int, int, std::uint64_t, std::uint64_t, std::uint64_t, std::int32_t)>(
          addresses, "oomflight_record");
      api.set_memory = function_at<int(int, const abi::Memory*)>(addresses, "oomflight_set_memory");
      api.request_dump =
          function_at<int(const abi::DumpRequest*, abi::DumpResult*)>(addresses, "oomflight_request_dump");
      api.log = function_at<int(int, const char*)>(addresses, "oomflight_log");
      api.intern_stack = function_at<int(const abi::Frame*, std::size_t, std::int32_t*)>(addresses,
                                                                                        "oomflight_intern_stack");
      api.set_stack_resolver = function_at<int(CApiTable::StackResolver, void*, std::uint64_t*)>(
          addresses, "oomflight_set_stack_resolver");
      api.set_metadata = function_at<int(const char*, const char*)>(addresses, "oomflight_set_metadata");
      if (!api.complete()) return "the oomflight C API table is incomplete (an older liboomflight?)";
      if (api.abi_version() != abi::kVersion) {
        return "liboomflight's C ABI version " + std::to_string(api.abi_version()) + " is not the plugin's " +
               std::to_string(abi::kVersion);
      }
      auto plugin = std::make_unique<Plugin>(api);
      for (const auto& [device, allocated, reserved, capacity] : seeds) {
        plugin->tracker.seed(device, allocated, reserved, capacity);
      }
      Plugin* p = plugin.get();
      p->stacks = stacks;
      start_stacks(*p);
      note_call_sites(*p);
      p->trace_callback = [p](const Entry& entry) { p->tracker.on_entry(entry); };
      p->oom_observer = [p](std::int64_t device, std::size_t alloc_bytes, std::size_t device_total,
                            std::size_t device_free) {
        std::unique_ptr<alloc::DeviceStats> stats;
        std::unique_ptr<alloc::SnapshotInfo> snapshot;
        try {
          stats = std::make_unique<alloc::DeviceStats>(alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device)));
        } catch (...) {
        }
        try {
          snapshot = std::make_unique<alloc::SnapshotInfo>(snapshot_of(alloc::get(), 0));
        } catch (...) {
        }
        observe(*p, device, alloc_bytes, device_total, device_free, stats.get(), snapshot.get());
      };
      g_plugin = plugin.release();
    }
    if (!to_allocator || g_plugin->attached) return "";
    if (alloc::get() == nullptr) return "the CUDA caching allocator is not initialised (call after CUDA init)";
    // Throws for the cudaMallocAsync backend (c10::Error): reported, nothing attached.
    alloc::attachAllocatorTraceTracker(g_plugin->trace_callback);
    alloc::attachOutOfMemoryObserver(g_plugin->oom_observer);
    g_plugin->attached = true;
    g_plugin->devices = devices;
    return "";
  } catch (const std::exception& e) {
    return std::string("cannot attach to the CUDA caching allocator: ") + e.what();
  } catch (...) {
    return "cannot attach to the CUDA caching allocator: unknown error";
  }
}

std::map<std::string, std::uint64_t> counters() {
  if (g_plugin == nullptr) return {};
  return {{"forwarded", g_plugin->tracker.forwarded()},
          {"unmapped", g_plugin->tracker.unmapped()},
          {"not_recorded", g_plugin->tracker.not_recorded()},
          {"observer_dumps", g_plugin->tracker.observer_dumps()},
          {"contexts_kept", g_plugin->contexts ? g_plugin->contexts->kept() : 0u},
          {"contexts_refused", g_plugin->contexts ? g_plugin->contexts->busy() : 0u},
          {"symbolizer_warm", g_plugin->symbolizer && g_plugin->symbolizer->warm() ? 1u : 0u},
          {"python_stacks", g_plugin->python_stacks ? g_plugin->python_stacks->stacks() : 0u},
          {"python_stacks_dropped", g_plugin->python_stacks ? g_plugin->python_stacks->dropped() : 0u},
          {"python_stacks_truncated", g_plugin->python_stacks ? g_plugin->python_stacks->truncated() : 0u},
          {"attached", g_plugin->attached ? 1u : 0u},
          {"devices", static_cast<std::uint64_t>(g_plugin->devices)}};
}

// What this build was compiled against, and which hooks it uses (python -m oomflight.torch --check).
std::map<std::string, std::string> build_info() {
  return {{"torch_version", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                                std::to_string(TORCH_VERSION_PATCH)},
          {"hooks", "c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker, attachOutOfMemoryObserver"},
          {"trace_entry", std::is_pointer_v<decltype(Entry::stream_)> ? "stream_ as a pointer" : "stream_ as an integer"},
          {"python_frames", PythonStacks::method()}};
}

// ---- torch's own objects, built here, through the callbacks' bodies (tests and --check) ----

Entry::Action action_named(const std::string& name) {
  static const std::map<std::string, Entry::Action> kNames = {
      {"alloc", Entry::Action::ALLOC},
      {"free_requested", Entry::Action::FREE_REQUESTED},
      {"free_completed", Entry::Action::FREE_COMPLETED},
      {"segment_alloc", Entry::Action::SEGMENT_ALLOC},
      {"segment_free", Entry::Action::SEGMENT_FREE},
      {"segment_map", Entry::Action::SEGMENT_MAP},
      {"segment_unmap", Entry::Action::SEGMENT_UNMAP},
      {"snapshot", Entry::Action::SNAPSHOT},
      {"oom", Entry::Action::OOM}};
  const auto it = kNames.find(name);
  if (it == kNames.end()) throw std::invalid_argument("unknown TraceEntry action '" + name + "'");
  return it->second;
}

// torch's TraceEntry constructor: (action, device, addr, size, stream, mempool, time, context, ...) since 2.6,
// (action, device, addr, size, stream, time, context) before.
template <typename E, typename Stream>
E make_entry(typename E::Action action, c10::DeviceIndex device, std::size_t addr, std::size_t size, Stream stream,
             Context context) {
  c10::approx_time_t now = c10::getApproximateTime();
  if constexpr (std::is_constructible_v<E, typename E::Action, c10::DeviceIndex, std::size_t, std::size_t, Stream,
                                        c10::cuda::MempoolId_t, c10::approx_time_t, Context>) {
    return E(action, device, addr, size, stream, c10::cuda::MempoolId_t{0, 0}, now, std::move(context));
  } else {
    return E(action, device, static_cast<std::int64_t>(addr), size, stream, now, std::move(context));
  }
}

using StreamType = decltype(Entry::stream_);

template <typename Stream = StreamType>
Stream stream_from(std::uint64_t value) {
  if constexpr (std::is_pointer_v<Stream>) {
    return reinterpret_cast<Stream>(static_cast<std::uintptr_t>(value));
  } else {
    return static_cast<Stream>(value);
  }
}

Context gather_python_context() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
}

// entries: (action name, device, addr, size, stream, with a Python context gathered here) -> through the trace
// callback torch holds. Returns "" or the error.
std::string feed(const std::vector<std::tuple<std::string, int, std::uint64_t, std::uint64_t, std::uint64_t, bool>>&
                     entries) {
  try {
    if (g_plugin == nullptr) return "not attached";
    for (const auto& [action, device, addr, size, stream, with_context] : entries) {
      const Entry e = make_entry<Entry>(action_named(action), static_cast<c10::DeviceIndex>(device), addr, size,
                                        stream_from(stream), with_context ? gather_python_context() : nullptr);
      g_plugin->trace_callback(e);
    }
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// One alloc entry (no context) through the trace callback from a thread of this extension's own, named `name`
// (pthread_setname_np, 15 bytes at most), that never ran Python: as autograd's and NCCL's threads reach the
// allocator. Returns "" or the error.
std::string feed_from_native_thread(const std::string& name, std::uint64_t addr, std::uint64_t size) {
  if (g_plugin == nullptr) return "not attached";
  std::string error;
  std::thread worker([&] {
    try {
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      g_plugin->trace_callback(make_entry<Entry>(Entry::Action::ALLOC, 0, addr, size, stream_from(0), nullptr));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  return error;
}

// The observer's body with a DeviceStats and a SnapshotInfo built here. stats: (allocated, reserved,
// peak allocated, peak reserved) or empty; segments: (device, address, stream, is_expandable, is_large,
// (pool id, pool id), with a Python context, blocks), blocks: (size, requested_size, "active_allocated" |
// "active_pending_free" | "inactive", with a Python context).
using BlockSpec = std::tuple<std::uint64_t, std::uint64_t, std::string, bool>;
using SegmentSpec = std::tuple<int, std::uint64_t, std::uint64_t, bool, bool, std::pair<std::uint64_t, std::uint64_t>,
                               bool, std::vector<BlockSpec>>;

std::string observe_built(std::int64_t device, std::uint64_t alloc_bytes, std::uint64_t device_total,
                          std::uint64_t device_free, const std::vector<std::int64_t>& stats,
                          const std::vector<SegmentSpec>& segments, bool with_snapshot) {
  try {
    if (g_plugin == nullptr) return "not attached";
    alloc::DeviceStats device_stats;
    if (stats.size() == 4) {
      device_stats.allocated_bytes[0].current = stats[0];
      device_stats.reserved_bytes[0].current = stats[1];
      device_stats.allocated_bytes[0].peak = stats[2];
      device_stats.reserved_bytes[0].peak = stats[3];
    }
    alloc::SnapshotInfo snapshot;
    for (const auto& [seg_device, address, stream, expandable, large, pool, seg_context, blocks] : segments) {
      alloc::SegmentInfo s;
      s.device = static_cast<c10::DeviceIndex>(seg_device);
      s.address = static_cast<std::size_t>(address);
      s.stream = stream_from<decltype(s.stream)>(stream);
      s.is_expandable = expandable;
      s.is_large = large;
      s.owner_private_pool_id = {static_cast<decltype(s.owner_private_pool_id.first)>(pool.first),
                                 static_cast<decltype(s.owner_private_pool_id.second)>(pool.second)};
      if (seg_context) s.context_when_allocated = gather_python_context();
      for (const auto& [size, requested, state, with_context] : blocks) {
        alloc::BlockInfo b;
        b.size = static_cast<std::size_t>(size);
        b.requested_size = static_cast<std::size_t>(requested);
        b.allocated = state == "active_allocated";
        b.active = state != "inactive";
        if (with_context) b.context_when_allocated = gather_python_context();
        s.total_size += b.size;
        if (b.allocated) s.allocated_size += b.size;
        if (b.active) s.active_size += b.size;
        s.blocks.push_back(std::move(b));
      }
      snapshot.segments.push_back(std::move(s));
    }
    observe(*g_plugin, device, alloc_bytes, device_total, device_free, stats.size() == 4 ? &device_stats : nullptr,
            with_snapshot ? &snapshot : nullptr);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// A signal dump asked for on another thread while this one keeps the GIL (the caller's, never released here): what
// oomflight's watcher meets when the training thread holds the GIL in a collective. Returns (the dump's seconds
// as liboomflight measured them, the C API's return code).
std::tuple<double, int> dump_from_thread_holding_gil() {
  if (g_plugin == nullptr) return {0.0, -1};
  abi::DumpResult result;
  int code = 0;
  std::thread other([&] {
    abi::DumpRequest request;
    request.kind = abi::kDumpSignal;
    request.reason = "a dump while another thread holds the GIL";
    code = g_plugin->api.request_dump(&request, &result);
  });
  other.join();
  return {result.seconds, code};
}

// Per-event costs, ns, measured here in the same run (bench/torch_tracker_bench.py; docs/performance.md): what torch
// pays per allocation when it records memory history (gathering the Python context; building a TraceEntry and
// storing it in a ring of entries under a mutex, as its trace buffer does), and what oomflight's trace callback
// adds, without and with a context to keep. Then, at a freeze, resolving `n` deferred ids of distinct contexts
// gathered at one call site (the helper's first symbolisation done first). Needs an attached plugin with stacks
// (attach after init); the events go to the ring as any would.
std::map<std::string, double> bench(std::size_t n) {
  std::map<std::string, double> out;
  if (g_plugin == nullptr || !g_plugin->contexts) return out;
  Plugin& p = *g_plugin;
  using clock = std::chrono::steady_clock;
  const auto ns_per = [&](clock::time_point start, std::size_t count) {
    return std::chrono::duration<double, std::nano>(clock::now() - start).count() / static_cast<double>(count);
  };
  const std::size_t keep = p.contexts->keep();
  const std::size_t batch = std::min(n, keep);
  // torch: the context gathered for each allocation (CapturedTraceback::gather, Python frames only)
  std::vector<Context> contexts;
  contexts.reserve(batch);
  auto start = clock::now();
  for (std::size_t i = 0; i < batch; ++i) contexts.push_back(gather_python_context());
  out["torch_gather_context_ns"] = ns_per(start, batch);
  // torch: a TraceEntry built and stored in a ring of entries under a mutex (its alloc_buffer)
  std::vector<Entry> ring(1000, make_entry<Entry>(Entry::Action::ALLOC, 0, 0, 0, stream_from(0), nullptr));
  std::mutex ring_mutex;
  start = clock::now();
  for (std::size_t i = 0; i < batch; ++i) {
    Entry e = make_entry<Entry>(Entry::Action::ALLOC, 0, 0x1000 + 512 * i, 512, stream_from(0), contexts[i]);
    std::lock_guard lock(ring_mutex);
    ring[i % ring.size()] = std::move(e);
  }
  out["torch_trace_entry_ns"] = ns_per(start, batch);
  ring.clear();
  // oomflight: the trace callback torch calls, without a context, then with one (kept in the table)
  std::vector<Entry> plain, with_context;
  plain.reserve(batch);
  with_context.reserve(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    const auto action = i % 2 == 0 ? Entry::Action::ALLOC : Entry::Action::FREE_REQUESTED;
    plain.push_back(make_entry<Entry>(action, 0, 0x1000 + 512 * (i / 2), 512, stream_from(0), nullptr));
    with_context.push_back(make_entry<Entry>(action, 0, 0x1000 + 512 * (i / 2), 512, stream_from(0), contexts[i]));
  }
  start = clock::now();
  for (const Entry& e : plain) p.trace_callback(e);
  out["oomflight_tracker_ns"] = ns_per(start, batch);
  p.contexts->reclaim();  // the slots this batch will use are empty (reclaimed every 20 ms in a job)
  const std::uint64_t refused = p.contexts->busy();
  start = clock::now();
  for (const Entry& e : with_context) p.trace_callback(e);
  out["oomflight_tracker_with_context_ns"] = ns_per(start, batch);
  out["contexts_refused"] = static_cast<double>(p.contexts->busy() - refused);
  // the freeze: resolving the deferred ids of the last batch (symbolise on this thread, which holds the GIL)
  p.contexts->reclaim();
  std::vector<std::int32_t> deferred;
  for (std::size_t i = 0; i < batch; ++i) deferred.push_back(p.contexts->put(contexts[i]));
  std::vector<std::int32_t> ids(deferred.size(), -1);
  warm_up_symbolize(contexts.front());
  start = clock::now();
  resolve_stacks(&p, deferred.data(), deferred.size(), ids.data(), 60000);
  out["resolve_ms"] = std::chrono::duration<double, std::milli>(clock::now() - start).count();
  out["resolved"] = static_cast<double>(std::count_if(ids.begin(), ids.end(), [](std::int32_t id) { return id >= 0; }));
  // torch's symbolize alone on the same contexts (what _snapshot pays for their frames)
  std::vector<torch::CapturedTraceback*> tracebacks;
  for (const Context& c : contexts) tracebacks.push_back(dynamic_cast<torch::CapturedTraceback*>(c.get()));
  start = clock::now();
  torch::symbolize(tracebacks);
  out["torch_symbolize_ms"] = std::chrono::duration<double, std::milli>(clock::now() - start).count();
  out["events"] = static_cast<double>(batch);
  return out;
}

// The frames torch gathers here, symbolised (what a context of the caller's line would give).
std::vector<std::tuple<std::string, std::string, int>> gather_frames() {
  std::vector<std::tuple<std::string, std::string, int>> out;
  const Context context = gather_python_context();
  auto* tb = dynamic_cast<torch::CapturedTraceback*>(context.get());
  if (tb == nullptr) return out;
  const torch::SymbolizedTracebacks s = torch::symbolize({tb});
  for (const std::uint64_t index : s.tracebacks.at(0)) {
    const auto& f = s.all_frames.at(index);
    out.emplace_back(f.funcname, f.filename, static_cast<int>(f.lineno));
  }
  return out;
}

// The frames oomflight's own capture keeps for the caller's line, resolved as a freeze resolves them.
std::vector<PythonStacks::Frame> capture_frames() {
  if (g_plugin == nullptr || !g_plugin->python_stacks) return {};
  const std::int32_t id = g_plugin->python_stacks->capture();
  if (id == -1) return {};
  return g_plugin->python_stacks->resolve(id);
}

// Per-event ns at the caller's Python depth, side by side in one run (bench/torch_tracker_bench.py): a clock read
// (steady_clock, the floor a hot path is held to), oomflight's capture of the stack (walk, hash, lookup of a stack
// seen before), and torch's CapturedTraceback::gather of the same frames (what memory history pays per event).
std::map<std::string, double> bench_capture(std::size_t n) {
  std::map<std::string, double> out;
  if (g_plugin == nullptr || !g_plugin->python_stacks || n == 0) return out;
  using clock = std::chrono::steady_clock;
  const auto ns_per = [&](clock::time_point start) {
    return std::chrono::duration<double, std::nano>(clock::now() - start).count() / static_cast<double>(n);
  };
  volatile std::int64_t sink = 0;
  auto start = clock::now();
  for (std::size_t i = 0; i < n; ++i) sink = sink + clock::now().time_since_epoch().count();
  out["clock_read_ns"] = ns_per(start);
  PythonStacks& stacks = *g_plugin->python_stacks;
  const std::int32_t first = stacks.capture();  // the stack's first sight (interned) is not what a step repeats
  start = clock::now();
  std::int32_t same = 0;
  for (std::size_t i = 0; i < n; ++i) same += stacks.capture() == first ? 1 : 0;
  out["oomflight_capture_ns"] = ns_per(start);
  out["oomflight_same_stack"] = same;
  std::vector<Context> contexts;
  contexts.reserve(n);
  start = clock::now();
  for (std::size_t i = 0; i < n; ++i) contexts.push_back(gather_python_context());
  out["torch_gather_ns"] = ns_per(start);
  out["frames"] = static_cast<double>(stacks.resolve(first).size());
  return out;
}

// A tracker over a stand-in C API that only counts, fed one torch TraceEntry of every action and one observer call
// with a DeviceStats and a one-segment SnapshotInfo: what `python -m oomflight.torch --check` can verify with no
// device and no liboomflight session (nothing is written).
namespace self_test {
std::uint64_t recorded[abi::kSnapshot + 1] = {};
std::uint64_t dumps = 0, segments = 0, blocks = 0, request_size = 0;
int abi_version() { return abi::kVersion; }
int record(int action, int, std::uint64_t, std::uint64_t, std::uint64_t, std::int32_t) {
  if (action >= 0 && action <= abi::kSnapshot) ++recorded[action];
  return 0;
}
int set_memory(int, const abi::Memory*) { return 0; }
int request_dump(const abi::DumpRequest* r, abi::DumpResult*) {
  ++dumps;
  request_size = r->struct_size;
  segments += r->segment_count;
  blocks += r->block_count;
  return 0;
}
int log(int, const char*) { return 0; }
int intern_stack(const abi::Frame*, std::size_t, std::int32_t* id) {
  *id = -1;
  return 0;
}

std::map<std::string, std::uint64_t> run() {
  CApiTable api;
  api.abi_version = &abi_version;
  api.record = &record;
  api.set_memory = &set_memory;
  api.request_dump = &request_dump;
  api.log = &log;
  api.intern_stack = &intern_stack;
  Plugin p(api);
  const char* names[] = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                         "segment_map", "segment_unmap", "snapshot", "oom"};
  for (const char* name : names) p.tracker.on_entry(make_entry<Entry>(action_named(name), 0, 0x1000, 512,
                                                                       stream_from(0), nullptr));
  alloc::DeviceStats stats;
  alloc::SnapshotInfo snapshot;
  alloc::SegmentInfo segment;
  segment.device = 0;
  segment.address = 0x1000;
  segment.total_size = 2 << 20;
  alloc::BlockInfo block;
  block.size = 2 << 20;
  segment.blocks.push_back(block);
  snapshot.segments.push_back(segment);
  observe(p, 0, 1024, 8 << 20, 0, &stats, &snapshot);
  std::map<std::string, std::uint64_t> out = {{"dumps", dumps}, {"segments", segments}, {"blocks", blocks},
                                              {"request_size", request_size}};
  const char* abi_names[] = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                             "segment_map", "segment_unmap", "oom", "snapshot"};  // the archive's numbering
  static_assert(abi::kOom == 7 && abi::kSnapshot == 8);
  for (int i = 0; i <= abi::kSnapshot; ++i) out[std::string("recorded_") + abi_names[i]] = recorded[i];
  return out;
}
}  // namespace self_test

}  // namespace

// Stops the reclaimer before Python's finalisation (oomflight.torch registers it with Python's atexit once the hooks
// are attached). Dropping a context may take the GIL (torch's CapturedTraceback releases its Python frames under
// it), which no thread can have while the interpreter finalises: Python 3.12 ends such a thread, 3.14 blocks it for
// good, and the C atexit's join (start_stacks) would then wait for ever. The GIL is released while this waits, so
// that a drop in progress finishes. Idempotent; the C atexit's stop finds it stopped.
void stop_reclaimer() {
  if (g_plugin != nullptr && g_plugin->reclaimer) g_plugin->reclaimer->stop();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "oomflight's CUDA caching-allocator hooks (see oomflight.torch)";
  m.def("attach", &attach, pybind11::arg("addresses"), pybind11::arg("seeds"), pybind11::arg("to_allocator"),
        pybind11::arg("devices"), pybind11::arg("stacks") = "python",
        "Build the trace tracker and the OOM observer (once; stacks: off, python or torch) and, with to_allocator, "
        "attach them; '' or why not");
  m.def("stop_reclaimer", &stop_reclaimer, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "Stop the context reclaimer's thread (at Python's exit, before the interpreter finalises); idempotent");
  m.def("join_store", &oomflight::torch_plugin::join_store, pybind11::arg("address"), pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("world_size"), pybind11::arg("local_rank"),
        pybind11::arg("keep") = pybind11::none(),
        "Hands a torch.distributed Store to oomflight_join_store at `address`, holding `keep` (the job's own "
        "store) as long as it: \"\" or why not");
  m.def("counters", &counters, "Entries forwarded, unmapped actions, ring drops, observer dumps, attached, devices");
  m.def("build_info", &build_info, "The torch version this extension was compiled against, and its hooks");
  m.def("_feed", &feed, "Test: torch TraceEntry objects built here, through the attached trace callback");
  m.def("_observe", &observe_built, "Test: DeviceStats and SnapshotInfo built here, through the observer's body");
  m.def("self_test", &self_test::run, "One TraceEntry of every action and one observer call over a counting C API");
  m.def("_gather_frames", &gather_frames, "Test: the caller's frames as torch's CapturedTraceback gathers them");
  m.def("_capture_frames", &capture_frames, "Test: the caller's frames as oomflight's own capture keeps them");
  m.def("_feed_from_native_thread", &feed_from_native_thread, pybind11::arg("name"), pybind11::arg("addr"),
        pybind11::arg("size"), pybind11::call_guard<pybind11::gil_scoped_release>(),
        "Test: one alloc entry through the trace callback from a named thread that never ran Python");
  m.def("_bench_capture", &bench_capture, pybind11::arg("n"),
        "Benchmark: per-event ns, at the caller's depth, of a clock read, oomflight's capture and torch's gather");
  m.def("_bench", &bench, pybind11::arg("n"), "Benchmark: per-event ns of torch's history and of the tracker");
  m.def("_dump_from_thread_holding_gil", &dump_from_thread_holding_gil,
        "Test: a signal dump on another thread while this one holds the GIL; (seconds, code)");
}
