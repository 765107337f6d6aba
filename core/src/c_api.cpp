// The C API: a process-wide Session behind plain functions.
#include "oomflight/oomflight.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "oomflight/config.hpp"
#include "oomflight/oom_classifier.hpp"
#include "oomflight/session.hpp"

namespace {

std::unique_ptr<oomflight::Session> g_session;
bool g_we_initialised_mpi = false;
std::mutex g_dump_mutex;
std::string g_last_dump_path;
thread_local std::string t_last_error;

int fail(int code, std::string message) {
  t_last_error = std::move(message);
  return code;
}

}  // namespace

extern "C" {

int oomflight_init(void) {
  if (g_session) return fail(OOMFLIGHT_ESTATE, "oomflight_init: already initialised");
  try {
    auto config = oomflight::Config::from_environment();
    MPI_Comm world = MPI_COMM_NULL;
    if (oomflight::launched_by_mpi()) {
      int initialised = 0;
      MPI_Initialized(&initialised);
      if (!initialised) {
        int provided = 0;
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
        g_we_initialised_mpi = true;
      }
      world = MPI_COMM_WORLD;
    }
    g_session = std::make_unique<oomflight::Session>(std::move(config), world);
  } catch (const oomflight::ConfigError& e) {
    return fail(OOMFLIGHT_ECONFIG, e.what());
  } catch (const std::exception& e) {
    return fail(OOMFLIGHT_ECONFIG, e.what());
  }
  return OOMFLIGHT_OK;
}

int oomflight_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream, int32_t stack_id) {
  if (!g_session) return fail(OOMFLIGHT_ESTATE, "oomflight_record: oomflight_init was not called");
  if (action < 0 || action >= oomflight::kActionCount) return fail(OOMFLIGHT_EINVAL, "oomflight_record: bad action");
  const bool kept = g_session->recorder().record(static_cast<oomflight::Action>(action),
                                                 static_cast<std::int16_t>(device), addr, size, stream, stack_id);
  return kept ? OOMFLIGHT_OK : OOMFLIGHT_EDROPPED;
}

int oomflight_mark_batch(int64_t batch) {
  if (!g_session) return fail(OOMFLIGHT_ESTATE, "oomflight_mark_batch: oomflight_init was not called");
  if (batch < 0) return fail(OOMFLIGHT_EINVAL, "oomflight_mark_batch: batch must be >= 0");
  g_session->recorder().mark_batch(batch);
  return OOMFLIGHT_OK;
}

int oomflight_trigger_dump(const char* reason, uint64_t requested_bytes, uint64_t device_free_bytes) {
  if (!g_session) return fail(OOMFLIGHT_ESTATE, "oomflight_trigger_dump: oomflight_init was not called");
  g_session->recorder().record(oomflight::Action::oom, 0, device_free_bytes, requested_bytes, 0);
  const auto result = g_session->trigger({reason ? reason : "", requested_bytes, device_free_bytes});
  {
    std::lock_guard lock(g_dump_mutex);
    g_last_dump_path = result.path;
  }
  if (result.status != oomflight::DumpResult::Status::archive) {
    return fail(OOMFLIGHT_EDUMP, result.error.empty() ? "no archive was written" : result.error);
  }
  return OOMFLIGHT_OK;
}

int oomflight_is_oom(const char* type_name, const char* message) {
  return oomflight::classify_oom(type_name ? type_name : "", message ? message : "") != oomflight::OomKind::none;
}

int oomflight_shutdown(void) {
  if (!g_session) return fail(OOMFLIGHT_ESTATE, "oomflight_shutdown: oomflight_init was not called");
  g_session.reset();
  if (g_we_initialised_mpi) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    g_we_initialised_mpi = false;
  }
  return OOMFLIGHT_OK;
}

const char* oomflight_last_error(void) { return t_last_error.c_str(); }

const char* oomflight_last_dump_path(void) {
  std::lock_guard lock(g_dump_mutex);
  return g_last_dump_path.c_str();
}

}  // extern "C"
