// The C API: a process-wide Session behind plain functions. Every entry point catches everything: no C++
// exception may cross into a C caller (or into a foreign host process).
#include "oomflight/oomflight.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <memory>
#include <optional>
#include <string_view>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "oomflight/base/log.hpp"
#include "oomflight/control/config.hpp"
#include "oomflight/control/mpi_job.hpp"
#include "oomflight/control/oom_classifier.hpp"
#include "oomflight/control/session.hpp"
#include "oomflight/control/store_client.hpp"

namespace {

using oomflight::Action;
using oomflight::DumpKind;
using oomflight::DumpResult;
using oomflight::LogLevel;

// "oomworld": the id every rank gives MPI_COMM_WORLD (oomflight_world_communicator).
constexpr std::uint64_t kWorldCommunicator = 0x6f6f6d776f726c64ull;

// The C enums are the C++ ones: a mismatch is a compile error, not a wrong archive.
static_assert(OOMFLIGHT_COLL_ALLREDUCE == static_cast<int>(oomflight::CollectiveOp::allreduce));
static_assert(OOMFLIGHT_COLL_RECV == static_cast<int>(oomflight::CollectiveOp::recv));
static_assert(OOMFLIGHT_COLL_OTHER == static_cast<int>(oomflight::CollectiveOp::other));
static_assert(OOMFLIGHT_COLL_OP_COUNT == oomflight::kCollectiveOpCount);
static_assert(OOMFLIGHT_DTYPE_BFLOAT16 == static_cast<int>(oomflight::DataType::bfloat16));
static_assert(OOMFLIGHT_DTYPE_FLOAT8E5M2 == static_cast<int>(oomflight::DataType::float8e5m2));
static_assert(OOMFLIGHT_DTYPE_OTHER == static_cast<int>(oomflight::DataType::other));
static_assert(OOMFLIGHT_COLL_DEVICE_COMPLETION == oomflight::kCollectiveDeviceCompletion);
static_assert(sizeof(oomflight_collective) == 64 && offsetof(oomflight_collective, flags) == 60);
static_assert(OOMFLIGHT_ALLOC == static_cast<int>(Action::alloc));
static_assert(OOMFLIGHT_FREE_REQUESTED == static_cast<int>(Action::free_requested));
static_assert(OOMFLIGHT_FREE_COMPLETED == static_cast<int>(Action::free_completed));
static_assert(OOMFLIGHT_SEGMENT_ALLOC == static_cast<int>(Action::segment_alloc));
static_assert(OOMFLIGHT_SEGMENT_FREE == static_cast<int>(Action::segment_free));
static_assert(OOMFLIGHT_SEGMENT_MAP == static_cast<int>(Action::segment_map));
static_assert(OOMFLIGHT_SEGMENT_UNMAP == static_cast<int>(Action::segment_unmap));
static_assert(OOMFLIGHT_OOM == static_cast<int>(Action::oom));
static_assert(OOMFLIGHT_SNAPSHOT == static_cast<int>(Action::snapshot));
static_assert(OOMFLIGHT_STEP == static_cast<int>(Action::step));
static_assert(OOMFLIGHT_ACTION_COUNT == oomflight::kActionCount);
static_assert(OOMFLIGHT_DUMP_OOM == static_cast<int>(DumpKind::oom));
static_assert(OOMFLIGHT_DUMP_SNAPSHOT == static_cast<int>(DumpKind::snapshot));
static_assert(OOMFLIGHT_DUMP_SIGNAL == static_cast<int>(DumpKind::signal));
static_assert(OOMFLIGHT_DUMP_EXIT == static_cast<int>(DumpKind::exit));
static_assert(OOMFLIGHT_DUMP_HEADROOM == static_cast<int>(DumpKind::headroom));
static_assert(OOMFLIGHT_DUMP_KIND_COUNT == oomflight::kDumpKindCount);
static_assert(OOMFLIGHT_DUMP_KIND_COUNT == oomflight::kDumpKindCount);
static_assert(OOMFLIGHT_DUMP_ARCHIVE == static_cast<int>(DumpResult::Status::archive));
static_assert(OOMFLIGHT_DUMP_RANK_LOCAL == static_cast<int>(DumpResult::Status::rank_local));
static_assert(OOMFLIGHT_DUMP_FAILED == static_cast<int>(DumpResult::Status::failed));
static_assert(OOMFLIGHT_DUMP_DISABLED == static_cast<int>(DumpResult::Status::disabled));
static_assert(OOMFLIGHT_LOG_TRACE == static_cast<int>(LogLevel::trace));
static_assert(OOMFLIGHT_LOG_DEBUG == static_cast<int>(LogLevel::debug));
static_assert(OOMFLIGHT_LOG_INFO == static_cast<int>(LogLevel::info));
static_assert(OOMFLIGHT_LOG_WARN == static_cast<int>(LogLevel::warn));
static_assert(OOMFLIGHT_LOG_ERROR == static_cast<int>(LogLevel::error));
static_assert(oomflight::kMaxDevices == 64, "oomflight_set_memory documents devices 0 .. 63");
// The ABI: these layouts are frozen for OOMFLIGHT_ABI_VERSION 1 (x86-64 and aarch64 LP64).
// oomflight_memory: 56 bytes in ABI 1.0, 64 with the memory cap (0.2.1).
static_assert(sizeof(oomflight_memory) == 64 && offsetof(oomflight_memory, memory_cap_bytes) == 56);
// The dump request grows only at its end (struct_size says which fields a caller has): 48 bytes in ABI 1.0,
// 80 with the allocator state (0.2.0), 88 with the segment details (0.2.1).
static_assert(offsetof(oomflight_dump_request, batch) == 40 && offsetof(oomflight_dump_request, segments) == 48);
static_assert(offsetof(oomflight_dump_request, segment_details) == 80 && sizeof(oomflight_dump_request) == 88);
static_assert(sizeof(oomflight_segment_detail) == 24);
static_assert(sizeof(oomflight_segment_state) == 32 && sizeof(oomflight_block_state) == 32);
static_assert(sizeof(oomflight_dump_result) == 32 && offsetof(oomflight_dump_result, seconds) == 24);
static_assert(sizeof(oomflight_frame) == 24);

// The stack resolver, kept across sessions (a plugin registers it once; a later oomflight_init must not lose it).
std::mutex g_resolver_mutex;
oomflight_stack_resolver g_resolver = nullptr;
void* g_resolver_user = nullptr;
std::mutex g_dump_mutex;
// Guarded by g_dump_mutex. Never destroyed: a dump may return on another thread while static destructors run.
std::string& g_last_dump_path = *new std::string;
// This thread's last message, in a buffer that is never destroyed: glibc destroys the exiting thread's thread_local
// objects before it runs the exit handlers, and a std::string assigned by an exit handler's error was freed twice
// (SIGABRT instead of the job's status). A longer message is cut at the buffer's end, marked "...".
constexpr std::size_t kLastErrorBytes = 4096;
thread_local char t_last_error[kLastErrorBytes] = {};
// This thread's copy of the last dump's path: a string allocated once per thread that asks, never destroyed (a path
// must not be cut short), for the same reason.
thread_local std::string* t_last_dump_path = nullptr;

// Stores this thread's message and returns `code`. Never allocates, never throws.
int fail(int code, std::string_view message) noexcept {
  const std::size_t room = kLastErrorBytes - 1;
  if (message.size() <= room) {
    std::memcpy(t_last_error, message.data(), message.size());
    t_last_error[message.size()] = '\0';
  } else {
    std::memcpy(t_last_error, message.data(), room - 3);
    std::memcpy(t_last_error + room - 3, "...", 4);
  }
  return code;
}

// fail() with a fmt message; a formatting failure (no memory) keeps the code and a fixed message.
template <typename... Args>
int failf(int code, fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    return fail(code, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
    return fail(code, "oomflight: out of host memory while describing an error");
  }
}

// Why the last oomflight_init of this process failed ("" after one that succeeded): a call made without a session
// then says so, rather than that init was never called (a settings mismatch under mpirun stops oomflight on every
// rank, and the job's later calls named the wrong cause).
std::mutex g_init_failure_mutex;
std::string g_init_failure;

int not_initialised(const char* function) noexcept {
  std::string why;
  try {
    std::lock_guard lock(g_init_failure_mutex);
    why = g_init_failure;
  } catch (...) {
  }
  if (!why.empty()) return failf(OOMFLIGHT_ESTATE, "{}: oomflight did not start: {}", function, why);
  return failf(OOMFLIGHT_ESTATE, "{}: oomflight_init was not called (or oomflight_shutdown was)", function);
}

// A figure of bytes (a size, a free or a capacity) is below 2^63: at or above it, it is a negative number that a
// caller passed as unsigned (C's -1, a ctypes conversion), never a real one. Returns OOMFLIGHT_OK or OOMFLIGHT_EINVAL
// with a message naming the function, the argument and its value as both the caller likely meant it and as given.
constexpr std::uint64_t kBytesLimit = std::uint64_t{1} << 63;
int check_bytes(const char* function, const char* argument, std::uint64_t value) noexcept {
  if (value < kBytesLimit) return OOMFLIGHT_OK;
  return failf(OOMFLIGHT_EINVAL, "{}: {} is {} ({} as an unsigned 64-bit number): a figure of bytes is 0 .. 2^63 - 1",
               function, argument, static_cast<std::int64_t>(value), value);
}

// Runs `body`, turning any exception into a return code: nothing may unwind into C.
template <typename Body>
int guarded(const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return failf(OOMFLIGHT_ENOMEM, "{}: out of host memory", function);
  } catch (const std::length_error& e) {
    return failf(OOMFLIGHT_EFULL, "{}: {}", function, e.what());
  } catch (const std::exception& e) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: {}", function, e.what());
  } catch (...) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: unknown exception", function);
  }
}

// The process's session, published through one atomic pointer that every entry point loads once. Never destroyed:
// the allocator's trace callback, NCCL's proxy thread and the extension's helper threads may still be inside it
// when it ends (a shutdown, the process's exit), and a static destructor that freed it under them crashed the job
// it watched (issue 29: SIGSEGV after an uncaught exception, via a log line after the logger was gone). An ended
// session is retired: its watcher is stopped and its communicator freed; callbacks that load the pointer after
// that find no session (OOMFLIGHT_ESTATE), and those already inside finish in memory that stays until the process
// ends.
std::atomic<oomflight::Session*> g_session{nullptr};
oomflight::Session* live_session() { return g_session.load(std::memory_order_acquire); }

// Every session this process made, live or ended (leaked on purpose, see above), and the lock that orders
// starting and ending them. Function statics allocated once and never destroyed: nothing here runs at exit.
std::mutex& lifecycle_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<oomflight::Session*>& all_sessions() {
  static auto* v = new std::vector<oomflight::Session*>;
  return *v;
}
bool g_we_initialised_mpi = false;     // oomflight_init started MPI: it is finalised at a successful exit
std::atomic<bool> g_watcher_left_behind{false};  // a watcher stuck in an MPI call: MPI must never be finalised
pid_t g_process = 0;                   // the process that made the sessions (0: none yet); a fork's child is not it

// Ends the live session as `how` says (Session::End), lifecycle_mutex() held; the pointer is unpublished first, so
// that no caller finds a session that is ending. noexcept: called from exit handlers and MPI's finalize callback.
int end_session_locked(oomflight::Session::End how, const char* function) noexcept {
  try {
    oomflight::Session* s = g_session.exchange(nullptr, std::memory_order_acq_rel);
    if (s == nullptr) return not_initialised(function);
    if (!s->shutdown(how)) {
      g_watcher_left_behind = true;  // MPI_Finalize would wait for the stuck call
      return failf(OOMFLIGHT_EDUMP, "{}: a dump was stuck in an MPI call and was left behind (the rank-local files "
                                    "hold the histories); oomflight will not finalise MPI", function);
    }
    return OOMFLIGHT_OK;
  } catch (const std::exception& e) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: {}", function, e.what());
  } catch (...) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: unknown exception", function);
  }
}

int end_session(oomflight::Session::End how, const char* function) noexcept {
  const std::lock_guard lock(lifecycle_mutex());  // std::mutex::lock throws only on a deadlock, ruled out here
  return end_session_locked(how, function);
}

// Whether a rank is known to end without MPI_Finalize, as any session of this process saw it (no MPI call).
bool a_peer_never_finalises() {
  for (oomflight::Session* s : all_sessions()) {
    if (s->peer_never_finalises()) return true;
  }
  return false;
}

// MPI_Finalize of the MPI that oomflight_init started, at a successful exit. It waits for every rank to finalise,
// and a rank that never will (its process ended without a word before the ranks agreed to leave: killed, os._exit,
// a crash; or it said it leaves on an error) may keep it waiting for good: Open MPI 4.1's finalize fence did in 1
// run of 3 here after a peer's _exit, while the launcher kept the job (issue 29: a survivor exited 113 s after its
// last step). A watchdog then ends the process with its own status, stdio flushed, 1 s after it learns of such a
// rank (a finalize takes milliseconds). mpirun may report the missing finalize, but the job has failed already:
// that rank never finalised either. A rank on another node that ends without a word is not seen, and the wait is
// MPI's own.
void finalise_mpi_at_exit(int status) {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    std::optional<std::chrono::steady_clock::time_point> give_up;
    while (!done) {
      if (!give_up && a_peer_never_finalises()) give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      if (give_up && std::chrono::steady_clock::now() >= *give_up) {
        oomflight::log().warn("MPI_Finalize did not return within 1 s of learning that a rank never finalises "
                              "(it ended without a word, or on an error); ending the process with its own status {} "
                              "without it", status);
        std::fflush(nullptr);
        std::_Exit(status);
      }
      finished.wait_for(lock, std::chrono::milliseconds(20));
    }
  });
  oomflight::finalise_mpi();
  {
    const std::lock_guard lock(mutex);
    done = true;
  }
  finished.notify_all();
  watchdog.join();
}

// glibc's on_exit, unlike atexit, is told the exit status: a successful exit ends the session as a normal end
// (the leave agreement) and finalises the MPI that oomflight started (without it mpirun fails the job: "exited
// improperly"); any other status leaves at once (LEFT to every rank, no wait, no MPI_Finalize, which could wait
// for ranks that are still running). It runs after Python's finalisation, whatever language the job is in. An end
// under way on another thread (an explicit shutdown racing the exit) is waited for, under the lifecycle lock, and
// MPI is finalised only after it, with the lock released (MPI_Finalize's own callback takes it). A forked child
// inherits the handler, not the session: it does nothing.
void end_at_exit(int status, void*) {
  if (::getpid() != g_process) return;
  {
    const std::lock_guard lock(lifecycle_mutex());
    if (live_session() != nullptr) {
      end_session_locked(status == 0 ? oomflight::Session::End::normal : oomflight::Session::End::error, "exit");
    }
  }
  if (status == 0 && g_we_initialised_mpi && !g_watcher_left_behind) finalise_mpi_at_exit(status);
}

// MPI_Finalize called by the job itself (mpi4py at interpreter exit, a C program's last line) while the session is
// live: the standard runs MPI_COMM_SELF's attribute delete callbacks first, with MPI still whole (MPI-4.1 §11.2.4),
// so the session ends there, as a requested end, before the MPI it uses goes (an end under way on another thread
// is waited for). Open MPI runs it without a lock of its own that oomflight's watcher would need; an MPI that holds
// one here would make the watcher's MPI calls wait until the leave agreement's deadline (not seen: only Open MPI is
// tested).
int end_at_mpi_finalize(MPI_Comm, int, void*, void*) {
  if (::getpid() != g_process) return MPI_SUCCESS;
  const std::lock_guard lock(lifecycle_mutex());
  if (live_session() != nullptr) end_session_locked(oomflight::Session::End::requested, "MPI_Finalize");
  return MPI_SUCCESS;
}

// A fork's child is not a rank: the session it inherited has no watcher there, and its MPI is its parent's. Its
// calls find no session (OOMFLIGHT_ESTATE) and its exit does nothing (end_at_exit).
void forget_session_in_child() { g_session.store(nullptr, std::memory_order_relaxed); }

// The exit handler, the fork handler and (with MPI) MPI_Finalize's callback, once per process; called under the
// lifecycle lock as soon as there is something to end: MPI that oomflight started, or a session.
void end_at_exit_once(bool with_mpi) {
  static bool at_exit = false, at_fork = false, at_finalize = false;
  if (g_process == 0) g_process = ::getpid();
  if (!at_exit) at_exit = on_exit(&end_at_exit, nullptr) == 0;
  if (!at_fork) at_fork = pthread_atfork(nullptr, nullptr, &forget_session_in_child) == 0;
  if (with_mpi && !at_finalize) {
    int keyval = MPI_KEYVAL_INVALID;
    at_finalize = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &end_at_mpi_finalize, &keyval, nullptr) ==
                      MPI_SUCCESS &&
                  MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) == MPI_SUCCESS;
  }
}

int dump_status_code(const DumpResult& r) {
  switch (r.status) {
    case DumpResult::Status::archive: return OOMFLIGHT_OK;
    case DumpResult::Status::disabled: return fail(OOMFLIGHT_EDISABLED, "OOMFLIGHT_ENABLED=0: nothing was dumped");
    default: break;
  }
  return fail(OOMFLIGHT_EDUMP, r.error.empty() ? "no archive was written" : r.error);
}

int dump(oomflight::Session& session, const oomflight::DumpRequest& request, oomflight_dump_result* out) {
  const DumpResult r = session.dump(request);
  {
    std::lock_guard lock(g_dump_mutex);
    g_last_dump_path = r.path;
  }
  if (out != nullptr && out->struct_size >= sizeof(oomflight_dump_result)) {
    out->status = static_cast<int32_t>(r.status);
    out->ranks_written = r.ranks_written;
    out->world_size = r.world_size;
    out->batch = r.batch;
    out->seconds = r.seconds;
  }
  return dump_status_code(r);
}

// oomflight_init and oomflight_init_settings: `count` explicit settings (OOMFLIGHT_* names) override the
// environment; both go through the one option table, so a keyword argument and a variable fail alike.
int init_session(const char* const* names, const char* const* values, size_t count, const char* function) noexcept {
  // One start or end at a time (a second init racing this one, an exit handler): the lock cannot throw here, a
  // std::mutex's lock fails only on a deadlock, which ordering by this one lock rules out.
  const std::lock_guard lifecycle(lifecycle_mutex());
  if (live_session() != nullptr) return failf(OOMFLIGHT_ESTATE, "{}: already initialised", function);
  if (count > 0 && (names == nullptr || values == nullptr)) {
    return failf(OOMFLIGHT_EINVAL, "{}: names or values is NULL", function);
  }
  std::size_t entries = 0;
  try {
    std::map<std::string, std::string, std::less<>> explicit_settings;
    for (size_t i = 0; i < count; ++i) {
      if (names[i] == nullptr || values[i] == nullptr) {
        return failf(OOMFLIGHT_EINVAL, "{}: setting {} has a NULL name or value", function, i);
      }
      explicit_settings[names[i]] = values[i];
    }
    std::vector<std::string> present = oomflight::oomflight_environment_names();
    for (const auto& [name, value] : explicit_settings) present.push_back(name);
    const auto lookup = [&](std::string_view name) -> std::optional<std::string> {
      if (auto it = explicit_settings.find(name); it != explicit_settings.end()) return it->second;
      const char* v = std::getenv(std::string(name).c_str());
      return v ? std::optional<std::string>(v) : std::nullopt;
    };
    std::optional<oomflight::Config> config;
    std::string config_error;
    try {
      config = oomflight::Config::from_environment(lookup, present);
    } catch (const oomflight::ConfigError& e) {
      config_error = e.what();
    }
    MPI_Comm world = MPI_COMM_NULL;
    if (oomflight::launched_by_mpi()) {
      try {
        // Only ever set, never cleared here: a retry after a failed init must still finalise what we started, and
        // so must the exit of a job whose init fails past this point (mpirun fails a rank that exits 0 without it).
        const bool here = oomflight::initialise_mpi_if_needed();
        if (here) {
          g_we_initialised_mpi = true;
          end_at_exit_once(true);
        }
        oomflight::require_thread_multiple(here);
      } catch (const std::exception& e) {
        return failf(OOMFLIGHT_EMPI, "{}: {}", function, e.what());
      }
      world = MPI_COMM_WORLD;
    }
    if (!config) {
      // The other ranks are in the start-up agreement: take part, so that they fail too instead of waiting.
      if (world != MPI_COMM_NULL) oomflight::Session::refuse_start_up(world);
      return fail(OOMFLIGHT_ECONFIG, config_error);
    }
    entries = config->max_entries;
    all_sessions().reserve(all_sessions().size() + 1);  // the push below cannot fail once the session exists
    // Ended sessions stay (callbacks may still be inside them) but need not watch the node's processes any more.
    for (oomflight::Session* ended : all_sessions()) ended->stop_watching_peers();
    oomflight::Session* session = nullptr;
    try {
      session = new oomflight::Session(std::move(*config), world);
    } catch (const std::bad_alloc&) {
      // Thrown only before the session's first collective (the ring): the peers must not wait for this rank.
      if (world != MPI_COMM_NULL) oomflight::Session::refuse_start_up(world);
      throw;
    }
    all_sessions().push_back(session);
    end_at_exit_once(world != MPI_COMM_NULL);
    {
      const std::lock_guard lock(g_resolver_mutex);
      session->recorder().set_stack_resolver(g_resolver, g_resolver_user);
    }
    // The job's own communicator, so that an MPI source's records (the replay's all-reduce) name it.
    session->recorder().register_communicator(
        {kWorldCommunicator, "world", session->identity().rank, session->identity().world_size});
    g_session.store(session, std::memory_order_release);
  } catch (const oomflight::ConfigError& e) {
    return fail(OOMFLIGHT_ECONFIG, e.what());
  } catch (const std::bad_alloc&) {
    return failf(OOMFLIGHT_ENOMEM,
                 "{}: cannot allocate the history of OOMFLIGHT_MAX_ENTRIES={} events ({} MiB); "
                 "set a smaller OOMFLIGHT_MAX_ENTRIES",
                 function, entries, (entries * 64) >> 20);
  } catch (const std::exception& e) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: {}", function, e.what());
  } catch (...) {
    return failf(OOMFLIGHT_EINTERNAL, "{}: unknown exception", function);
  }
  return OOMFLIGHT_OK;
}

}  // namespace

extern "C" {

int oomflight_abi_version(void) { return OOMFLIGHT_ABI_VERSION; }

const char* oomflight_version(void) { return OOMFLIGHT_VERSION_STRING; }

int oomflight_launched_by_mpi(void) { return oomflight::launched_by_mpi() ? 1 : 0; }

void forget_init_failure() noexcept {
  try {
    std::lock_guard lock(g_init_failure_mutex);
    g_init_failure.clear();
  } catch (...) {
  }
}

// init_session, remembering why it failed for the calls that follow without a session (not_initialised).
int start_session(const char* const* names, const char* const* values, size_t count, const char* function) noexcept {
  const int rc = init_session(names, values, count, function);
  if (rc == OOMFLIGHT_ESTATE && live_session() != nullptr) return rc;  // already initialised: the session stands
  try {
    std::lock_guard lock(g_init_failure_mutex);
    g_init_failure = rc == OOMFLIGHT_OK ? std::string() : std::string(oomflight_last_error());
  } catch (...) {
  }
  return rc;
}

int oomflight_init(void) { return start_session(nullptr, nullptr, 0, "oomflight_init"); }

int oomflight_init_settings(const char* const* names, const char* const* values, size_t count) {
  return start_session(names, values, count, "oomflight_init_settings");
}

int oomflight_rank(int* rank, int* world_size) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_rank");
  if (rank) *rank = session->identity().rank;
  if (world_size) *world_size = session->identity().world_size;
  return OOMFLIGHT_OK;
}

int oomflight_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream, int32_t stack_id) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_record");
  const bool predates = (action & OOMFLIGHT_RECORD_PREDATES_HISTORY) != 0;
  action &= ~OOMFLIGHT_RECORD_PREDATES_HISTORY;
  if (action < 0 || action >= OOMFLIGHT_ACTION_COUNT) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record: action {} is not an enum oomflight_action (optionally or-ed "
                 "with OOMFLIGHT_RECORD_PREDATES_HISTORY)", action);
  }
  if (device < 0 || device > INT16_MAX) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record: device {} is outside 0 .. 32767", device);
  }
  // One compare on the hot path: a size (and an oom event's free bytes, carried in addr) is a figure of bytes.
  if ((size | (action == OOMFLIGHT_OOM ? addr : 0)) >= kBytesLimit) [[unlikely]] {
    return size >= kBytesLimit ? check_bytes("oomflight_record", "size", size)
                               : check_bytes("oomflight_record", "addr (an oom event's free bytes)", addr);
  }
  const bool kept = session->recorder().record(static_cast<Action>(action), static_cast<std::int16_t>(device),
                                                 addr, size, stream, stack_id,
                                                 predates ? oomflight::kEventPredatesHistory : std::uint8_t{0});
  return kept ? OOMFLIGHT_OK : OOMFLIGHT_EDROPPED;
}

int oomflight_mark_batch(int64_t batch) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_mark_batch");
  if (batch < 0) return failf(OOMFLIGHT_EINVAL, "oomflight_mark_batch: batch {} is negative", batch);
  return guarded("oomflight_mark_batch", [&]() -> int {
    session->mark_batch(batch);
    return OOMFLIGHT_OK;
  });
}

int oomflight_intern_stack(const struct oomflight_frame* frames, size_t count, int32_t* stack_id) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_intern_stack");
  if (stack_id == nullptr) return fail(OOMFLIGHT_EINVAL, "oomflight_intern_stack: stack_id is NULL");
  if (frames == nullptr && count > 0) return fail(OOMFLIGHT_EINVAL, "oomflight_intern_stack: frames is NULL");
  return guarded("oomflight_intern_stack", [&]() -> int {
    std::vector<oomflight::FrameRef> refs;
    refs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (frames[i].function == nullptr || frames[i].file == nullptr) {
        return failf(OOMFLIGHT_EINVAL, "oomflight_intern_stack: frame {} has a NULL function or file", i);
      }
      refs.push_back({frames[i].function, frames[i].file, frames[i].line});
    }
    *stack_id = session->recorder().intern_stack(refs);
    return OOMFLIGHT_OK;
  });
}

int oomflight_set_stack_resolver(oomflight_stack_resolver resolver, void* user, uint64_t* max_entries) {
  const std::lock_guard lock(g_resolver_mutex);
  g_resolver = resolver;
  g_resolver_user = user;
  oomflight::Session* const session = live_session();
  if (session != nullptr) session->recorder().set_stack_resolver(resolver, user);
  if (max_entries) *max_entries = session != nullptr ? session->config().max_entries : 0;
  return OOMFLIGHT_OK;
}

int oomflight_set_memory(int device, const struct oomflight_memory* memory) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_set_memory");
  if (memory == nullptr || memory->struct_size < offsetof(oomflight_memory, memory_cap_bytes)) {
    return fail(OOMFLIGHT_EINVAL, "oomflight_set_memory: memory is NULL or its struct_size is too small "
                                  "(initialise it with OOMFLIGHT_MEMORY_INIT)");
  }
  const bool has_cap = memory->struct_size >= sizeof(oomflight_memory);
  const std::pair<const char*, std::uint64_t> figures[] = {
      {"allocated_bytes", memory->allocated_bytes},
      {"reserved_bytes", memory->reserved_bytes},
      {"peak_allocated_bytes", memory->peak_allocated_bytes},
      {"peak_reserved_bytes", memory->peak_reserved_bytes},
      {"device_capacity_bytes", memory->device_capacity_bytes},
      {"device_free_bytes", memory->device_free_bytes},
      {"memory_cap_bytes", has_cap ? memory->memory_cap_bytes : 0}};
  for (const auto& [argument, value] : figures) {
    if (const int rc = check_bytes("oomflight_set_memory", argument, value); rc != OOMFLIGHT_OK) return rc;
  }
  // What the driver reports can never exceed the device: a larger free figure is a caller's arithmetic gone wrong.
  if (memory->device_capacity_bytes != 0 && memory->device_free_bytes > memory->device_capacity_bytes) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_set_memory: device_free_bytes {} is above device_capacity_bytes {}",
                 memory->device_free_bytes, memory->device_capacity_bytes);
  }
  if (has_cap && memory->device_capacity_bytes != 0 && memory->memory_cap_bytes > memory->device_capacity_bytes) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_set_memory: memory_cap_bytes {} is above device_capacity_bytes {}",
                 memory->memory_cap_bytes, memory->device_capacity_bytes);
  }
  const oomflight::MemoryStats stats{memory->allocated_bytes,       memory->reserved_bytes,
                                     memory->peak_allocated_bytes,  memory->peak_reserved_bytes,
                                     memory->device_capacity_bytes, memory->device_free_bytes,
                                     has_cap ? memory->memory_cap_bytes : 0};
  if (!session->set_memory(device, stats)) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_set_memory: device {} is outside 0 .. {}", device,
                                              oomflight::kMaxDevices - 1);
  }
  return OOMFLIGHT_OK;
}

int oomflight_record_collective(const struct oomflight_collective* c) {
  // Without a session this is the NCCL plugin's every call in a job oomflight does not watch: a fixed message (an
  // assign into the thread's kept buffer), not a formatted one, so that the quiet path costs less than recording.
  oomflight::Session* const session = live_session();
  if (session == nullptr) {
    return fail(OOMFLIGHT_ESTATE, "oomflight_record_collective: oomflight_init was not called (or oomflight_shutdown was)");
  }
  if (c == nullptr) return fail(OOMFLIGHT_EINVAL, "oomflight_record_collective: record is NULL");
  if (c->struct_size < sizeof(oomflight_collective)) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record_collective: struct_size {} is below {} (use OOMFLIGHT_COLLECTIVE_INIT)",
                 c->struct_size, sizeof(oomflight_collective));
  }
  if (c->op < 0 || c->op >= OOMFLIGHT_COLL_OP_COUNT) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record_collective: op {} is not an enum oomflight_collective_op", c->op);
  }
  if (c->datatype < 0 || c->datatype > 255 || !oomflight::valid_data_type(static_cast<std::uint8_t>(c->datatype))) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record_collective: datatype {} is not an enum oomflight_datatype",
                 c->datatype);
  }
  if (c->phase != OOMFLIGHT_COLL_START && c->phase != OOMFLIGHT_COLL_END) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_record_collective: phase {} is neither start (0) nor end (1)", c->phase);
  }
  if (c->peer < -1) return failf(OOMFLIGHT_EINVAL, "oomflight_record_collective: peer {} is below -1", c->peer);
  oomflight::Collective r;
  r.comm_id = c->comm_id;
  r.seq = c->seq;
  r.count = c->count;
  const auto type = static_cast<oomflight::DataType>(c->datatype);
  r.bytes = c->bytes != 0 ? c->bytes : c->count * oomflight::data_type_size(type);
  r.stream = c->stream;
  r.peer = c->peer;
  r.op = static_cast<oomflight::CollectiveOp>(c->op);
  r.datatype = type;
  r.phase = static_cast<oomflight::CollectivePhase>(c->phase);
  r.flags = static_cast<std::uint8_t>(c->flags & (OOMFLIGHT_COLL_DEVICE_COMPLETION | OOMFLIGHT_COLL_UNTRACKED));
  session->recorder().record_collective(r);
  return OOMFLIGHT_OK;
}

int oomflight_register_communicator(uint64_t comm_id, const char* name, int comm_rank, int comm_size) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_register_communicator");
  if (comm_size < 1 || comm_rank < 0 || comm_rank >= comm_size) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_register_communicator: rank {} of size {} is not 0 .. size - 1 with "
                 "size >= 1", comm_rank, comm_size);
  }
  return guarded("oomflight_register_communicator", [&]() -> int {
    session->recorder().register_communicator({comm_id, name == nullptr ? "" : name, comm_rank, comm_size});
    return OOMFLIGHT_OK;
  });
}

uint64_t oomflight_world_communicator(void) { return kWorldCommunicator; }

int oomflight_set_metadata(const char* key, const char* value) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_set_metadata");
  if (key == nullptr || *key == '\0' || value == nullptr) {
    return fail(OOMFLIGHT_EINVAL, "oomflight_set_metadata: key is NULL or empty, or value is NULL");
  }
  return guarded("oomflight_set_metadata", [&]() -> int {
    session->recorder().context().set_metadata(key, value, session->recorder().batch());
    return OOMFLIGHT_OK;
  });
}

namespace {
// The allocator state given with a request, checked and copied into the archive's rows.
int copy_state(oomflight::Session& session, const oomflight_dump_request& q, bool with_details,
               oomflight::AllocatorStateRows& out) {
  constexpr std::uint64_t kMaxSegments = std::uint64_t{1} << 24, kMaxBlocks = std::uint64_t{1} << 26;
  if ((q.segments == nullptr && q.segment_count > 0) || (q.blocks == nullptr && q.block_count > 0)) {
    return fail(OOMFLIGHT_EINVAL, "oomflight_request_dump: segments or blocks is NULL with a count above 0");
  }
  if (q.segment_count > kMaxSegments || q.block_count > kMaxBlocks) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: {} segments and {} blocks exceed the limits ({}, {})",
                 q.segment_count, q.block_count, kMaxSegments, kMaxBlocks);
  }
  const std::size_t stacks = session.recorder().stacks().size();
  out.segments.reserve(q.segment_count);
  for (std::uint64_t i = 0; i < q.segment_count; ++i) {
    const oomflight_segment_state& s = q.segments[i];
    if (s.device < 0 || s.device >= oomflight::kMaxDevices) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: segments[{}].device {} is outside 0 .. {}", i, s.device,
                   oomflight::kMaxDevices - 1);
    }
    if (s.total_size >= kBytesLimit) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: segments[{}].total_size is {}: a figure of bytes is "
                   "0 .. 2^63 - 1", i, static_cast<std::int64_t>(s.total_size));
    }
    oomflight::StateSegmentRow row;
    row.device = s.device;
    row.address = s.address;
    row.total_size = s.total_size;
    row.stream = s.stream;
    row.is_expandable = s.is_expandable != 0 ? 1 : 0;
    if (with_details && q.segment_details != nullptr) {
      const oomflight_segment_detail& d = q.segment_details[i];
      if (d.segment_type < -1 || d.segment_type > 1) {
        return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: segment_details[{}].segment_type {} is not -1, 0 or 1",
                     i, d.segment_type);
      }
      if (d.stack_id != oomflight::kNoStack && (d.stack_id < 0 || static_cast<std::size_t>(d.stack_id) >= stacks)) {
        return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: segment_details[{}].stack_id {} was not interned ({} "
                     "stacks)", i, d.stack_id, stacks);
      }
      row.segment_type = d.segment_type < 0 ? oomflight::SegmentType::unknown : static_cast<oomflight::SegmentType>(d.segment_type);
      row.stack_id = d.stack_id;
      row.segment_pool_id[0] = d.pool_id[0];
      row.segment_pool_id[1] = d.pool_id[1];
    }
    out.segments.push_back(row);
  }
  out.blocks.reserve(q.block_count);
  for (std::uint64_t i = 0; i < q.block_count; ++i) {
    const oomflight_block_state& b = q.blocks[i];
    if (b.size >= kBytesLimit || b.requested_size >= kBytesLimit) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: blocks[{}].{} is {}: a figure of bytes is 0 .. 2^63 - 1",
                   i, b.size >= kBytesLimit ? "size" : "requested_size",
                   static_cast<std::int64_t>(b.size >= kBytesLimit ? b.size : b.requested_size));
    }
    if (b.state < 0 || b.state >= oomflight::kBlockStateCount) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: blocks[{}].state {} is not 0, 1 or 2", i, b.state);
    }
    if (b.stack_id != oomflight::kNoStack && (b.stack_id < 0 || static_cast<std::size_t>(b.stack_id) >= stacks)) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: blocks[{}].stack_id {} was not interned ({} stacks)", i,
                   b.stack_id, stacks);
    }
    oomflight::StateBlockRow row;
    row.stack_id = b.stack_id;
    row.address = b.address;
    row.size = b.size;
    row.requested_size = b.requested_size;
    row.state = static_cast<oomflight::BlockState>(b.state);
    out.blocks.push_back(row);
  }
  return OOMFLIGHT_OK;
}
}  // namespace

int oomflight_request_dump(const struct oomflight_dump_request* request, struct oomflight_dump_result* result) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_request_dump");
  // Callers built against an older header pass the struct without the state fields: read those only when given.
  constexpr std::size_t kBaseSize = offsetof(oomflight_dump_request, segments);
  if (request == nullptr || request->struct_size < kBaseSize) {
    return fail(OOMFLIGHT_EINVAL, "oomflight_request_dump: request is NULL or its struct_size is too small "
                                  "(initialise it with OOMFLIGHT_DUMP_REQUEST_INIT)");
  }
  if (request->kind < 0 || request->kind >= OOMFLIGHT_DUMP_KIND_COUNT) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: kind {} is not an enum oomflight_dump_kind", request->kind);
  }
  if (request->device < -1 || request->device >= oomflight::kMaxDevices) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: device {} is outside -1 .. {}",
                                              request->device, oomflight::kMaxDevices - 1);
  }
  if (const int rc = check_bytes("oomflight_request_dump", "requested_bytes", request->requested_bytes); rc != 0) {
    return rc;
  }
  if (const int rc = check_bytes("oomflight_request_dump", "device_free_bytes", request->device_free_bytes); rc != 0) {
    return rc;
  }
  if (request->batch < -1) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_request_dump: batch {} is below -1 (-1: the current batch)",
                 request->batch);
  }
  return guarded("oomflight_request_dump", [&]() -> int {
    oomflight::DumpRequest r;
    r.kind = static_cast<DumpKind>(request->kind);
    r.reason = request->reason ? request->reason : "";
    r.requested_bytes = request->requested_bytes;
    r.device_free_bytes = request->device_free_bytes;
    r.device = request->device;
    r.batch = request->batch;
    if (request->struct_size >= offsetof(oomflight_dump_request, segment_details)) {
      const bool details = request->struct_size >= sizeof(oomflight_dump_request);
      if (const int rc = copy_state(*session, *request, details, r.state); rc != OOMFLIGHT_OK) return rc;
    }
    return dump(*session, r, result);
  });
}

int oomflight_trigger_oom(int device, const char* reason, uint64_t requested_bytes, uint64_t device_free_bytes) {
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_trigger_oom");
  if (device < 0 || device >= oomflight::kMaxDevices) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_trigger_oom: device {} is outside 0 .. {}", device,
                                              oomflight::kMaxDevices - 1);
  }
  if (const int rc = check_bytes("oomflight_trigger_oom", "requested_bytes", requested_bytes); rc != 0) return rc;
  if (const int rc = check_bytes("oomflight_trigger_oom", "device_free_bytes", device_free_bytes); rc != 0) return rc;
  session->recorder().record(Action::oom, static_cast<std::int16_t>(device), device_free_bytes, requested_bytes, 0);
  return guarded("oomflight_trigger_oom", [&]() -> int {
    oomflight::DumpRequest r;
    r.kind = DumpKind::oom;
    r.reason = reason ? reason : "";
    r.requested_bytes = requested_bytes;
    r.device_free_bytes = device_free_bytes;
    r.device = device;
    return dump(*session, r, nullptr);
  });
}

int oomflight_trigger_dump(const char* reason, uint64_t requested_bytes, uint64_t device_free_bytes) {
  return oomflight_trigger_oom(0, reason, requested_bytes, device_free_bytes);
}

int oomflight_is_oom(const char* type_name, const char* message) {
  try {
    return oomflight::classify_oom(type_name ? type_name : "", message ? message : "") != oomflight::OomKind::none;
  } catch (...) {
    return 0;  // the classifier allocates (lower-casing); with no host memory, say "not known to be an OOM"
  }
}

int oomflight_log(int level, const char* message) {
  if (level < OOMFLIGHT_LOG_TRACE || level > OOMFLIGHT_LOG_ERROR) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_log: level {} is not an enum oomflight_log_level", level);
  }
  if (message == nullptr) return fail(OOMFLIGHT_EINVAL, "oomflight_log: message is NULL");
  return guarded("oomflight_log", [&]() -> int {
    oomflight::log_message(static_cast<LogLevel>(level), message);
    return OOMFLIGHT_OK;
  });
}

namespace {
// The plugin's store (oomflight_store) as the control wing's StoreClient: every failure becomes an exception that
// names the key and the store's own words.
class CStoreClient final : public oomflight::StoreClient {
 public:
  // `size`: the struct_size the plugin passed (its `release` only when that covers it).
  CStoreClient(const oomflight_store& store, std::size_t size) {
    std::memcpy(&s_, &store, std::min(size, sizeof s_));
    s_.struct_size = sizeof s_;
    if (size < sizeof s_) s_.release = nullptr;
  }
  // The last use of the store: the plugin lets go of it (StoreHandle destroys this client once no call is in flight).
  // Only once joined: a join that failed leaves the store the plugin's (oomflight.h).
  ~CStoreClient() override {
    if (armed_ && s_.release != nullptr) s_.release(s_.user);
  }
  void arm() { armed_ = true; }
  CStoreClient(const CStoreClient&) = delete;
  CStoreClient& operator=(const CStoreClient&) = delete;
  void set(const std::string& key, const std::string& value) override {
    check(s_.set(s_.user, key.c_str(), value.data(), value.size()), "set", key);
  }
  std::optional<std::string> get(const std::string& key) override {
    std::string buffer(4096, '\0');
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::size_t size = 0;
      const int rc = s_.get(s_.user, key.c_str(), buffer.data(), buffer.size(), &size);
      if (rc == 0) return std::nullopt;
      check(rc < 0 ? rc : 0, "get", key);
      if (size <= buffer.size()) {
        buffer.resize(size);
        return buffer;
      }
      buffer.assign(size, '\0');  // it was larger than the buffer: read it again, whole
    }
    throw std::runtime_error(fmt::format("the job's store: key {} keeps changing size", key));
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t value = 0;
    check(s_.add(s_.user, key.c_str(), delta, &value), "add", key);
    return value;
  }

 private:
  void check(int rc, const char* what, const std::string& key) const {
    if (rc >= 0) return;
    const char* why = s_.last_error != nullptr ? s_.last_error(s_.user) : nullptr;
    throw std::runtime_error(fmt::format("the job's store failed to {} {} ({}){}{}", what, key, rc,
                                         why != nullptr ? ": " : "", why != nullptr ? why : ""));
  }
  oomflight_store s_{};
  bool armed_ = false;  // set under the lifecycle lock once joined; read at destruction, which that lock orders after
};
}  // namespace

int oomflight_join_store(const struct oomflight_store* store, int rank, int world_size, int local_rank) {
  if (store == nullptr || store->struct_size < OOMFLIGHT_STORE_SIZE_0_2_1 || store->set == nullptr ||
      store->get == nullptr || store->add == nullptr) {
    return fail(OOMFLIGHT_EINVAL, "oomflight_join_store: store is NULL, smaller than struct oomflight_store of "
                                  "0.2.1, or lacks set, get or add");
  }
  if (world_size < 1 || rank < 0 || rank >= world_size || local_rank < 0 || local_rank >= world_size) {
    return failf(OOMFLIGHT_EINVAL, "oomflight_join_store: rank {} and local rank {} of world size {}: out of range",
                 rank, local_rank, world_size);
  }
  const std::lock_guard lock(lifecycle_mutex());
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_join_store");
  if (oomflight::launched_by_mpi()) {
    return fail(OOMFLIGHT_ESTATE, "oomflight_join_store: an MPI launcher started this process: its ranks are MPI's");
  }
  try {
    auto client = std::make_unique<CStoreClient>(*store, store->struct_size);
    CStoreClient* const joined = client.get();
    session->join_store(std::move(client), rank, world_size, local_rank);
    joined->arm();  // released only by a leave or the session's end, which wait for this lock
    // The session's end lets go of the plugin's store, whose destructor is the plugin's library's (c10d's); handlers
    // run in the reverse order of their registration, so one registered now, with that library loaded, ends the
    // session before its static objects go (the first, registered at oomflight_init, may predate the library).
    static const bool ends_before_the_plugin = on_exit(&end_at_exit, nullptr) == 0;
    (void)ends_before_the_plugin;
    return OOMFLIGHT_OK;
  } catch (const std::logic_error& e) {
    if (dynamic_cast<const std::invalid_argument*>(&e) != nullptr) {
      return failf(OOMFLIGHT_EINVAL, "oomflight_join_store: {}", e.what());
    }
    return failf(OOMFLIGHT_ESTATE, "oomflight_join_store: {}", e.what());
  } catch (const std::bad_alloc&) {
    return fail(OOMFLIGHT_ENOMEM, "oomflight_join_store: out of host memory");
  } catch (const std::exception& e) {
    return failf(OOMFLIGHT_EINTERNAL, "oomflight_join_store: {}", e.what());
  }
}

int oomflight_leave_store(const char* reason) {
  const std::lock_guard lock(lifecycle_mutex());
  oomflight::Session* const session = live_session();
  if (session == nullptr) return not_initialised("oomflight_leave_store");
  std::string why;
  try {
    why = reason != nullptr && *reason != '\0' ? reason : "the job let go of its store";
  } catch (...) {
  }
  if (!session->leave_store(why)) {
    return fail(OOMFLIGHT_ESTATE, "oomflight_leave_store: this process has not joined a store");
  }
  return OOMFLIGHT_OK;
}

int oomflight_shutdown(void) {
  forget_init_failure();  // from here, a call without a session is one after oomflight_shutdown
  return end_session(oomflight::Session::End::requested, "oomflight_shutdown");
}

int oomflight_end(int exit_status) {
  return end_session(exit_status == 0 ? oomflight::Session::End::normal : oomflight::Session::End::error,
                     "oomflight_end");
}

const char* oomflight_last_error(void) { return t_last_error; }

const char* oomflight_last_dump_path(void) {
  try {
    if (t_last_dump_path == nullptr) t_last_dump_path = new std::string;
    std::lock_guard lock(g_dump_mutex);
    *t_last_dump_path = g_last_dump_path;
  } catch (...) {
    if (t_last_dump_path == nullptr) return "";
    t_last_dump_path->clear();  // out of memory for the copy: say nothing rather than something stale
  }
  return t_last_dump_path->c_str();
}

}  // extern "C"
