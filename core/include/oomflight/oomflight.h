/* oomflight C API: the stable surface for frameworks, allocator hooks and the Python package (ctypes).
 *
 * Example (one rank; under mpirun every rank does the same):
 *
 *   #include <oomflight/oomflight.h>
 *   if (oomflight_init() != 0) fprintf(stderr, "%s\n", oomflight_last_error());
 *   oomflight_mark_batch(0);
 *   oomflight_record(OOMFLIGHT_ALLOC, 0, ptr, bytes, stream, -1);
 *   ...
 *   if (cuda_malloc_failed) {
 *     oomflight_trigger_dump("CUDA out of memory. Tried to allocate 2.00 GiB", bytes, free_bytes);
 *     // the archive is closed now; let the error propagate
 *   }
 *   oomflight_shutdown();
 *
 * Return values: 0 on success, a negative OOMFLIGHT_E* code on failure; oomflight_last_error() then says why.
 * Thread-safety: oomflight_record, oomflight_mark_batch and oomflight_trigger_dump are safe from any thread once
 * oomflight_init has returned; oomflight_init and oomflight_shutdown must not race with anything.
 */
#ifndef OOMFLIGHT_OOMFLIGHT_H
#define OOMFLIGHT_OOMFLIGHT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define OOMFLIGHT_C_API __declspec(dllexport)
#else
#define OOMFLIGHT_C_API __attribute__((visibility("default")))
#endif

/** Event actions; values equal oomflight::Action and the archive's enumeration (schema v1). */
enum oomflight_action {
  OOMFLIGHT_ALLOC = 0,
  OOMFLIGHT_FREE_REQUESTED = 1,
  OOMFLIGHT_FREE_COMPLETED = 2,
  OOMFLIGHT_SEGMENT_ALLOC = 3,
  OOMFLIGHT_SEGMENT_FREE = 4,
  OOMFLIGHT_SEGMENT_MAP = 5,
  OOMFLIGHT_SEGMENT_UNMAP = 6,
  OOMFLIGHT_OOM = 7,
  OOMFLIGHT_SNAPSHOT = 8,
  OOMFLIGHT_STEP = 9
};

/** Error codes. */
enum oomflight_status {
  OOMFLIGHT_OK = 0,
  OOMFLIGHT_ECONFIG = -1,     /**< an OOMFLIGHT_* variable is malformed (the message names it) */
  OOMFLIGHT_ESTATE = -2,      /**< not initialised, or initialised twice */
  OOMFLIGHT_EINVAL = -3,      /**< an argument is out of range */
  OOMFLIGHT_EDUMP = -4,       /**< the dump wrote no archive (a rank-local file may exist; see the message) */
  OOMFLIGHT_EDROPPED = -5     /**< the event was dropped by the ring (counted in the archive) */
};

/** Initialises from OOMFLIGHT_* environment variables. Under an MPI launcher (OMPI_COMM_WORLD_SIZE, PMIX_RANK or
 *  PMI_SIZE set) it joins the job's control plane: if MPI is not initialised yet, it initialises it with
 *  MPI_THREAD_MULTIPLE (and finalises it in oomflight_shutdown); this call is then collective. Otherwise it runs
 *  as a single process (world size 1). Returns 0, OOMFLIGHT_ECONFIG or OOMFLIGHT_ESTATE. */
OOMFLIGHT_C_API int oomflight_init(void);

/** Records one event stamped now with the current batch. action: enum oomflight_action; device: ordinal;
 *  addr: device address (for OOMFLIGHT_OOM: device free bytes); size: bytes (for OOMFLIGHT_OOM: the requested
 *  bytes); stream: stream handle; stack_id: -1 for none. Wait-free; no allocation, lock or system call.
 *  Returns 0, OOMFLIGHT_EDROPPED, OOMFLIGHT_EINVAL (bad action) or OOMFLIGHT_ESTATE. */
OOMFLIGHT_C_API int oomflight_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream,
                                     int32_t stack_id);

/** Starts batch `batch` (>= 0) and records a step event. Returns 0, OOMFLIGHT_EINVAL or OOMFLIGHT_ESTATE. */
OOMFLIGHT_C_API int oomflight_mark_batch(int64_t batch);

/** Records an oom event (size = requested_bytes, addr = device_free_bytes) and triggers a coordinated dump;
 *  returns once the archive is closed (or the fallback files are written, or 3 x OOMFLIGHT_DUMP_TIMEOUT has
 *  passed). reason: the error message (may be NULL). Returns 0 when an archive was written, OOMFLIGHT_EDUMP
 *  otherwise. The written path is available from oomflight_last_dump_path(). */
OOMFLIGHT_C_API int oomflight_trigger_dump(const char* reason, uint64_t requested_bytes, uint64_t device_free_bytes);

/** Classifies an error: returns 1 when (type_name, message) is an out-of-memory error, else 0. Either may be
 *  NULL. Pure; thread-safe; needs no init. */
OOMFLIGHT_C_API int oomflight_is_oom(const char* type_name, const char* message);

/** Stops the watcher thread and, if oomflight_init initialised MPI, finalises it. Returns 0 or OOMFLIGHT_ESTATE. */
OOMFLIGHT_C_API int oomflight_shutdown(void);

/** The last error message of this thread ("" if none). Valid until the next call on this thread. */
OOMFLIGHT_C_API const char* oomflight_last_error(void);

/** The path written by this process's last dump ("" if none). Valid until the next dump. */
OOMFLIGHT_C_API const char* oomflight_last_dump_path(void);

#ifdef __cplusplus
}
#endif

#endif /* OOMFLIGHT_OOMFLIGHT_H */
