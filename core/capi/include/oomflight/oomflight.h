/* oomflight C API: the one ABI-stable surface of liboomflight, for frameworks, allocator hooks, plugins loaded
 * into foreign processes (a PyTorch extension, an NCCL profiler plugin, a CUDA injection library) and the Python
 * package (ctypes). Plain C: no C++ type crosses it.
 *
 * Example (one rank; under mpirun every rank does the same):
 *
 *   #include <oomflight/oomflight.h>
 *
 *   if (oomflight_init() != OOMFLIGHT_OK) fprintf(stderr, "%s\n", oomflight_last_error());
 *   const struct oomflight_frame frames[] = {{"forward", "model.py", 42}, {"main", "train.py", 7}};
 *   int32_t stack = -1;
 *   oomflight_intern_stack(frames, 2, &stack);
 *   oomflight_mark_batch(0);
 *   oomflight_record(OOMFLIGHT_ALLOC, 0, ptr, bytes, stream, stack);
 *   struct oomflight_memory gauges = OOMFLIGHT_MEMORY_INIT;
 *   gauges.allocated_bytes = ...; gauges.reserved_bytes = ...; gauges.device_capacity_bytes = ...;
 *   oomflight_set_memory(0, &gauges);
 *   ...
 *   if (cuda_malloc_failed) {
 *     oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 2.00 GiB", bytes, free_bytes);
 *     // every rank's history is in one archive now (oomflight_last_dump_path()); let the error propagate
 *   }
 *   // at exit the library ends the session as the exit status says (oomflight_shutdown, oomflight_end)
 *
 * Conventions, for every function:
 * - Units: sizes and addresses in bytes, device ordinals as CUDA numbers them, batches counted from 0.
 * - Return values: OOMFLIGHT_OK (0) on success, a negative OOMFLIGHT_E* code on failure; oomflight_last_error()
 *   then says why, in this thread.
 * - Thread-safety: every function is safe to call from any thread. A call that races oomflight_shutdown() or
 *   oomflight_end() either finishes on the ending session (whose memory stays until the process ends) or finds
 *   none (OOMFLIGHT_ESTATE); oomflight_init() and the endings are ordered by one lock.
 * - Extensible structs start with `struct_size` (set it with the *_INIT initialisers): a newer library reads
 *   only the fields an older caller's struct has, so callers built against this header keep working.
 * - No returned pointer depends on a lock: strings are static or this thread's own copies.
 */
#ifndef OOMFLIGHT_OOMFLIGHT_H
#define OOMFLIGHT_OOMFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "oomflight/api.h"
#include "oomflight/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The C ABI's version. It changes only when an existing function, enum value or struct layout changes in a way
 *  that breaks callers built against an older header; new functions and appended struct fields keep it. */
#define OOMFLIGHT_ABI_VERSION 1

/** Event actions. The first nine are PyTorch's TraceEntry actions (c10/cuda/CUDACachingAllocator.h) with the
 *  same names and meanings; map torch's values by name, never by number (their order differs). The values are
 *  the archive's enumeration (docs/archive-format.md): never renumbered, only appended. */
enum oomflight_action {
  OOMFLIGHT_ALLOC = 0,           /**< a block was handed out: addr, size of the block */
  OOMFLIGHT_FREE_REQUESTED = 1,  /**< the program freed the block; a stream may still use it */
  OOMFLIGHT_FREE_COMPLETED = 2,  /**< the block went back to the allocator's cache */
  OOMFLIGHT_SEGMENT_ALLOC = 3,   /**< the allocator reserved a segment from the device (cudaMalloc) */
  OOMFLIGHT_SEGMENT_FREE = 4,    /**< the allocator returned a segment to the device (cudaFree) */
  OOMFLIGHT_SEGMENT_MAP = 5,     /**< expandable segments: pages mapped */
  OOMFLIGHT_SEGMENT_UNMAP = 6,   /**< expandable segments: pages unmapped */
  OOMFLIGHT_OOM = 7,             /**< an allocation failed: size = requested bytes, addr = device free bytes */
  OOMFLIGHT_SNAPSHOT = 8,        /**< a snapshot was taken here */
  OOMFLIGHT_STEP = 9,            /**< oomflight: a batch started */
  OOMFLIGHT_ACTION_COUNT = 10
};

/** Why a dump is asked for; the archive's `kind` attribute and the {kind} filename placeholder. */
enum oomflight_dump_kind {
  OOMFLIGHT_DUMP_OOM = 0,       /**< a rank ran out of memory */
  OOMFLIGHT_DUMP_SNAPSHOT = 1,  /**< a schedule's window closed */
  OOMFLIGHT_DUMP_SIGNAL = 2,    /**< on demand */
  OOMFLIGHT_DUMP_EXIT = 3,      /**< the job is being torn down */
  OOMFLIGHT_DUMP_HEADROOM = 4,  /**< a rank's memory crossed OOMFLIGHT_HEADROOM_DUMP (since 0.3) */
  OOMFLIGHT_DUMP_KIND_COUNT = 5
};

/** What a dump wrote, as the rank that asked for it sees it. */
enum oomflight_dump_status {
  OOMFLIGHT_DUMP_ARCHIVE = 0,     /**< one archive, written by all ranks together */
  OOMFLIGHT_DUMP_RANK_LOCAL = 1,  /**< the ranks did not agree in time: this rank wrote its own file */
  OOMFLIGHT_DUMP_FAILED = 2,      /**< nothing could be written */
  OOMFLIGHT_DUMP_DISABLED = 3     /**< OOMFLIGHT_ENABLED=0 */
};

/** Log levels for oomflight_log(), lowest first (OOMFLIGHT_LOG_LEVEL's names). */
enum oomflight_log_level {
  OOMFLIGHT_LOG_TRACE = 0,
  OOMFLIGHT_LOG_DEBUG = 1,
  OOMFLIGHT_LOG_INFO = 2,
  OOMFLIGHT_LOG_WARN = 3,
  OOMFLIGHT_LOG_ERROR = 4
};

/** Return codes. Each failure has its own code. */
enum oomflight_status {
  OOMFLIGHT_OK = 0,
  OOMFLIGHT_ECONFIG = -1,    /**< an OOMFLIGHT_* variable is malformed or unknown (the message names it) */
  OOMFLIGHT_ESTATE = -2,     /**< not initialised, initialised twice, or already shut down */
  OOMFLIGHT_EINVAL = -3,     /**< an argument is out of range or NULL (the message names it) */
  OOMFLIGHT_EDUMP = -4,      /**< the dump wrote no archive: a rank-local file, or nothing (see the result) */
  OOMFLIGHT_EDROPPED = -5,   /**< the ring refused the event: more than 64 threads record at once (counted in the archive) */
  OOMFLIGHT_EMPI = -6,       /**< MPI could not be initialised or set up */
  OOMFLIGHT_ENOMEM = -7,     /**< memory for the history could not be allocated (OOMFLIGHT_MAX_ENTRIES too big?) */
  OOMFLIGHT_EDISABLED = -8,  /**< OOMFLIGHT_ENABLED=0: nothing is dumped */
  OOMFLIGHT_EINTERNAL = -9,  /**< an unexpected failure inside oomflight (a bug: please report the message) */
  OOMFLIGHT_EFULL = -10      /**< a bounded table is full (oomflight_intern_stack: 2^31 - 1 stacks) */
};

/** One frame of a stack. Strings are copied; they need to live only during the call. line 0: unknown. */
struct oomflight_frame {
  const char* function;
  const char* file;
  int32_t line;
};

/** One device's memory figures, bytes; 0 where unknown. "Allocated" and "reserved" as PyTorch defines them
 *  (torch.cuda.memory_allocated / memory_reserved). */
struct oomflight_memory {
  uint32_t struct_size;            /**< sizeof(struct oomflight_memory): use OOMFLIGHT_MEMORY_INIT */
  uint32_t reserved0;              /**< zero */
  uint64_t allocated_bytes;        /**< in live blocks */
  uint64_t reserved_bytes;         /**< in segments the allocator holds (allocated + cached) */
  uint64_t peak_allocated_bytes;
  uint64_t peak_reserved_bytes;
  uint64_t device_capacity_bytes;  /**< the device's total memory */
  uint64_t device_free_bytes;      /**< free as the driver reports it (cudaMemGetInfo) */
  /* Since 0.2.1 (read only when struct_size covers it: a caller built against the 0.2.0 header passes 56 bytes): */
  uint64_t memory_cap_bytes;       /**< the process's own limit below the device's capacity (PyTorch's
                                        torch.cuda.set_per_process_memory_fraction); 0: none. Kept apart from
                                        device_capacity_bytes, which stays the device's */
};
#define OOMFLIGHT_MEMORY_INIT {sizeof(struct oomflight_memory), 0, 0, 0, 0, 0, 0, 0, 0}

/** A request for a dump. */
/** One segment of the allocator's state (PyTorch's SegmentInfo, torch/cuda/memory.py `_snapshot`). Bytes. */
struct oomflight_segment_state {
  uint64_t address;
  uint64_t total_size;
  uint64_t stream;
  int32_t device;         /**< 0 .. 63 */
  int32_t is_expandable;  /**< 0 or 1 */
};

/** One block of the allocator's state (PyTorch's BlockInfo). Bytes: `size` as the allocator sized the block,
 *  `requested_size` what was asked for. */
struct oomflight_block_state {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size;
  int32_t stack_id;  /**< from oomflight_intern_stack: the frames of the block's alloc; -1 for none */
  int32_t state;     /**< 0 active_allocated, 1 active_pending_free, 2 inactive */
};

/** More of a segment (PyTorch's SegmentInfo), since 0.2.1: element i of oomflight_dump_request's segment_details
 *  describes segments[i]. Written into the archive's /state_segments (segment_type, stack_id, segment_pool_id), so
 *  that the memory_viz export gives PyTorch's own segment fields. */
struct oomflight_segment_detail {
  uint64_t pool_id[2];   /**< PyTorch's segment_pool_id (owner_private_pool_id: a CUDA graph's private pool);
                              0, 0: the default pools */
  int32_t stack_id;      /**< the segment's frames (context_when_allocated), from oomflight_intern_stack; -1: none */
  int32_t segment_type;  /**< 0: the large pool, 1: the small pool (PyTorch's is_large false), -1: not known */
};

struct oomflight_dump_request {
  uint32_t struct_size;        /**< sizeof(struct oomflight_dump_request): use OOMFLIGHT_DUMP_REQUEST_INIT */
  int32_t kind;                /**< enum oomflight_dump_kind */
  const char* reason;          /**< the error message or why; may be NULL; copied */
  uint64_t requested_bytes;    /**< the allocation that failed; 0 when not an allocation */
  uint64_t device_free_bytes;  /**< free device memory as the allocator saw it; 0 when unknown */
  int32_t device;              /**< the device concerned; -1: the device that last published gauges */
  int32_t reserved0;           /**< zero */
  int64_t batch;               /**< the batch concerned; -1: the current batch */
  /* Since 0.3: the requesting rank's allocator state now (the source's own: PyTorch's segments), written into the
   * archive as that rank's /state_segments and /state_blocks. Copied. Optional: NULL and 0 when the source has
   * none (the state is then rebuilt from the history). A caller compiled against an older header passes a
   * smaller struct_size, and these fields are not read. */
  const struct oomflight_segment_state* segments;
  uint64_t segment_count;      /**< at most 2^24 */
  const struct oomflight_block_state* blocks;
  uint64_t block_count;        /**< at most 2^26 */
  /* Since 0.2.1: NULL, or segment_count details, one per segment, in the same order. Read only when struct_size
   * covers it (a caller built against the 0.2.0 header passes 80 bytes). */
  const struct oomflight_segment_detail* segment_details;
};
#define OOMFLIGHT_DUMP_REQUEST_INIT \
  {sizeof(struct oomflight_dump_request), OOMFLIGHT_DUMP_OOM, NULL, 0, 0, -1, 0, -1, NULL, 0, NULL, 0, NULL}

/** The outcome of a dump; the written path is oomflight_last_dump_path(). */
struct oomflight_dump_result {
  uint32_t struct_size;   /**< sizeof(struct oomflight_dump_result): use OOMFLIGHT_DUMP_RESULT_INIT */
  int32_t status;         /**< enum oomflight_dump_status */
  int32_t ranks_written;  /**< ranks in the file written (1 for a rank-local file) */
  int32_t world_size;
  int64_t batch;          /**< the batch that names the file (the lowest origin's) */
  double seconds;         /**< from the request to the file's close */
};
#define OOMFLIGHT_DUMP_RESULT_INIT {sizeof(struct oomflight_dump_result), OOMFLIGHT_DUMP_FAILED, 0, 0, -1, 0.0}

/** Collective and point-to-point operations (since 0.2.1), the archive's /collectives `op` enumeration
 *  (docs/archive-format.md): never renumbered, only appended. Names as NCCL's API spells them (ncclAllReduce ...). */
enum oomflight_collective_op {
  OOMFLIGHT_COLL_ALLREDUCE = 0,
  OOMFLIGHT_COLL_ALLGATHER = 1,
  OOMFLIGHT_COLL_REDUCESCATTER = 2,
  OOMFLIGHT_COLL_BROADCAST = 3,
  OOMFLIGHT_COLL_REDUCE = 4,
  OOMFLIGHT_COLL_ALLTOALL = 5,
  OOMFLIGHT_COLL_SEND = 6,      /**< point-to-point: peer = the receiving rank */
  OOMFLIGHT_COLL_RECV = 7,      /**< point-to-point: peer = the sending rank */
  OOMFLIGHT_COLL_GATHER = 8,
  OOMFLIGHT_COLL_SCATTER = 9,
  OOMFLIGHT_COLL_BARRIER = 10,
  OOMFLIGHT_COLL_OTHER = 11,    /**< an operation with no name here */
  OOMFLIGHT_COLL_OP_COUNT = 12
};

/** Element types of a collective: NCCL's ncclDataType_t values (nccl.h, 2.19+), so an NCCL source passes its own;
 *  OOMFLIGHT_DTYPE_OTHER for anything else (an MPI derived type: give `bytes`). */
enum oomflight_datatype {
  OOMFLIGHT_DTYPE_INT8 = 0,
  OOMFLIGHT_DTYPE_UINT8 = 1,
  OOMFLIGHT_DTYPE_INT32 = 2,
  OOMFLIGHT_DTYPE_UINT32 = 3,
  OOMFLIGHT_DTYPE_INT64 = 4,
  OOMFLIGHT_DTYPE_UINT64 = 5,
  OOMFLIGHT_DTYPE_FLOAT16 = 6,
  OOMFLIGHT_DTYPE_FLOAT32 = 7,
  OOMFLIGHT_DTYPE_FLOAT64 = 8,
  OOMFLIGHT_DTYPE_BFLOAT16 = 9,
  OOMFLIGHT_DTYPE_FLOAT8E4M3 = 10,
  OOMFLIGHT_DTYPE_FLOAT8E5M2 = 11,
  OOMFLIGHT_DTYPE_OTHER = 255
};

/** Which end of an operation a record marks. */
enum oomflight_collective_phase {
  OOMFLIGHT_COLL_START = 0,  /**< the rank entered the operation (called it, or NCCL enqueued it) */
  OOMFLIGHT_COLL_END = 1     /**< the rank's part of it finished (see OOMFLIGHT_COLL_DEVICE_COMPLETION) */
};

/** flags of an OOMFLIGHT_COLL_END record: the end is the device finishing the operation (NCCL's kernel, seen
 *  through the profiler's kernel events); without it the end is the host call returning (a blocking MPI call
 *  returns when the operation is done; NCCL's returns once it is enqueued). */
#define OOMFLIGHT_COLL_DEVICE_COMPLETION 0x1u
/** flags of any record: the source does not follow this operation to its end, so no (further) end of it will be
 *  recorded, and whether it finished is not known. On a start: it was never followed (the NCCL plugin had no free
 *  slot: more operations in flight on the communicator than its pool holds); on an end: the source stopped
 *  following it before its end was seen (the plugin gave its slot to a newer operation). Readers count such
 *  operations per communicator and never call one "in flight" or "finished" (docs/nccl.md). */
#define OOMFLIGHT_COLL_UNTRACKED 0x2u

/** One start or end of a collective or point-to-point operation on one rank (oomflight_record_collective). */
struct oomflight_collective {
  uint32_t struct_size;  /**< sizeof(struct oomflight_collective): use OOMFLIGHT_COLLECTIVE_INIT */
  int32_t op;            /**< enum oomflight_collective_op */
  uint64_t comm_id;      /**< the communicator: the same value on every rank of it (NCCL's commId/commHash; the
                              MPI sources use oomflight_world_communicator()) */
  uint64_t seq;          /**< this rank's sequence number of this operation (op) on the communicator, from 0:
                              NCCL's seqNumber, which counts each function separately (allreduce #3 and broadcast #3
                              are two operations); a start and its end carry the same */
  uint64_t count;        /**< elements */
  uint64_t bytes;        /**< bytes this rank sends (its buffer); 0: count x the datatype's size */
  uint64_t stream;       /**< the CUDA stream handle as an integer; 0: none (a host collective) */
  int32_t datatype;      /**< enum oomflight_datatype */
  int32_t peer;          /**< the root (broadcast, reduce, gather, scatter) or the peer (send, recv), a rank of the
                              communicator; -1: none */
  int32_t phase;         /**< enum oomflight_collective_phase */
  uint32_t flags;        /**< OOMFLIGHT_COLL_* bits; 0 */
};
#define OOMFLIGHT_COLLECTIVE_INIT \
  {sizeof(struct oomflight_collective), OOMFLIGHT_COLL_OTHER, 0, 0, 0, 0, 0, OOMFLIGHT_DTYPE_OTHER, -1, OOMFLIGHT_COLL_START, 0}

/** OOMFLIGHT_ABI_VERSION of the loaded library. A plugin compares it with the OOMFLIGHT_ABI_VERSION it was
 *  compiled with and refuses to run (never crashes the host) when they differ. Needs no init. */
OOMFLIGHT_API int oomflight_abi_version(void);

/** The loaded library's version, "MAJOR.MINOR.PATCH" (static storage). Needs no init. */
OOMFLIGHT_API const char* oomflight_version(void);

/** 1 when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE is set), else 0.
 *  Needs no init. */
OOMFLIGHT_API int oomflight_launched_by_mpi(void);

/** Initialises from the OOMFLIGHT_* environment variables (`oomflight config` lists them). Under an MPI launcher
 *  it joins the job's control plane: if MPI is not initialised yet it initialises it with MPI_THREAD_MULTIPLE (and
 *  finalises it at the process's successful exit); this call is then collective over MPI_COMM_WORLD. Otherwise it runs as a
 *  single process (world size 1) and makes no MPI call.
 *  Under MPI it also installs a SIGUSR1 handler when SIGUSR1 is at its default action (a handler the process has
 *  is kept; one it installs later replaces oomflight's): SIGUSR1 to any rank then dumps every rank into one
 *  archive of kind "signal", from oomflight's own thread, and training goes on. oomflight_shutdown restores the
 *  default.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_ECONFIG (a bad variable), OOMFLIGHT_ENOMEM (the ring of OOMFLIGHT_MAX_ENTRIES
 *  events cannot be allocated), OOMFLIGHT_EMPI (MPI_Init_thread failed), OOMFLIGHT_ESTATE (already initialised)
 *  or OOMFLIGHT_EINTERNAL. */
OOMFLIGHT_API int oomflight_init(void);

/** As oomflight_init, with `count` settings given as (name, value) pairs that override the environment: names
 *  are the OOMFLIGHT_* variables' (`oomflight config` lists them), values are parsed and checked exactly as the
 *  variables' are (the Python package's keyword arguments come through here). An unknown name or a bad value
 *  gives OOMFLIGHT_ECONFIG with a message that names both. names and values are arrays of `count` strings,
 *  copied; either may be NULL when count is 0. Returns as oomflight_init, or OOMFLIGHT_EINVAL (a NULL array or
 *  string). */
OOMFLIGHT_API int oomflight_init_settings(const char* const* names, const char* const* values, size_t count);

/** This process's rank and the job's world size (0 and 1 without MPI). Either pointer may be NULL.
 *  Returns OOMFLIGHT_OK or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_rank(int* rank, int* world_size);

/** Or-ed into oomflight_record's action (since 0.2.1): the event stands for allocator state that existed before
 *  recording began (a segment or block already there when the history starts, e.g. a replay's start state). It is
 *  counted like any event, and the memory_viz export shows it in the end state instead of as a trace entry, as
 *  PyTorch's own snapshot would. The archive's events carry it as flags bit 1. */
#define OOMFLIGHT_RECORD_PREDATES_HISTORY 0x100

/** Records one event stamped now (CLOCK_MONOTONIC) with the current batch. action: enum oomflight_action,
 *  optionally or-ed with OOMFLIGHT_RECORD_PREDATES_HISTORY;
 *  device: ordinal (0 .. 32767); addr: device address (for OOMFLIGHT_OOM: device free bytes); size: bytes (for
 *  OOMFLIGHT_OOM: the requested bytes); stream: the stream handle as an integer; stack_id: from
 *  oomflight_intern_stack, -1 for none, or a deferred id (<= -2) for the registered stack resolver. Wait-free: no allocation, lock or system call.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EDROPPED, OOMFLIGHT_EINVAL (bad action, flag or device; a size, or an
 *  OOMFLIGHT_OOM event's free bytes, of 2^63 or more: a negative figure passed as unsigned; the message names it)
 *  or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_record(int action, int device, uint64_t addr, uint64_t size, uint64_t stream,
                                   int32_t stack_id);

/** Starts batch `batch` (>= 0) and records a step event; the running batch marked again stays that batch (no
 *  second row of it: `oomflight run` marks batch 0 at start, and a job that numbers its batches marks 0 too).
 *  Wait-free.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (batch < 0) or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_mark_batch(int64_t batch);

/** Interns a stack of `count` frames, innermost first (PyTorch's order), and stores its id in *stack_id (0, 1,
 *  2, ...; the same frames always give the same id). count 0 is a valid empty stack. Takes a mutex and may
 *  allocate: not for the hot path; intern each distinct stack once and reuse its id.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (stack_id NULL, frames NULL with count > 0, or a NULL string),
 *  OOMFLIGHT_ENOMEM (no host memory for the table), OOMFLIGHT_EFULL (the table holds 2^31 - 1 stacks),
 *  OOMFLIGHT_ESTATE or OOMFLIGHT_EINTERNAL. */
OOMFLIGHT_API int oomflight_intern_stack(const struct oomflight_frame* frames, size_t count, int32_t* stack_id);

/** A resolver of deferred stack ids (see oomflight_set_stack_resolver): for each of the `count` ids in `deferred`
 *  (distinct, each <= -2), stores in stack_ids[i] a stack id from oomflight_intern_stack, or -1. Called at every
 *  freeze of the history (a dump's first step) on the freezing thread: a failing thread, oomflight's watcher,
 *  or the thread that closes a snapshot window. It must return within about `timeout_ms` milliseconds (a
 *  quarter of OOMFLIGHT_DUMP_TIMEOUT, at most 2000), whatever holds the locks it needs; ids it leaves at -1 reach
 *  the archive as "no stack". Returns 0, or non-zero when it resolved nothing. */
typedef int (*oomflight_stack_resolver)(void* user, const int32_t* deferred, size_t count, int32_t* stack_ids,
                                        uint32_t timeout_ms);

/** Registers the resolver of deferred stack ids (NULL: none), for sources whose call sites cannot be symbolised
 *  where the event is recorded (the PyTorch plugin keeps torch's Python context and symbolises it only when a
 *  dump needs it, off the allocator's lock): such a source records events with a stack_id <= -2 of its own
 *  choosing, and every freeze hands the distinct ones to `resolver`. `user` is passed back. One resolver per
 *  process; it stays registered across oomflight_shutdown and a later oomflight_init. Without a resolver, deferred
 *  ids become -1. Thread-safe. Returns OOMFLIGHT_OK; *max_entries (may be NULL) receives the events the history
 *  keeps (OOMFLIGHT_MAX_ENTRIES), or 0 before oomflight_init: a source keeps contexts for that many events. */
OOMFLIGHT_API int oomflight_set_stack_resolver(oomflight_stack_resolver resolver, void* user, uint64_t* max_entries);

/** Publishes one device's memory figures (see struct oomflight_memory); the device becomes the one whose figures
 *  a dump reports unless a request names another. Lock-free (relaxed atomic stores): cheap enough after every
 *  event. Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (memory NULL, memory->struct_size below 0.2.0's 56 bytes,
 *  device outside 0 .. 63, a figure of 2^63 or more: a negative number passed as unsigned, device_free_bytes or
 *  memory_cap_bytes above a known device_capacity_bytes; the message names the field and its value; nothing is
 *  published then) or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_set_memory(int device, const struct oomflight_memory* memory);

/** Records one start or end of a collective or point-to-point operation, stamped now (the events' clock) with the
 *  current batch, into the rank's collective history (the newest 16,384 records, beside the event ring; frozen and
 *  dumped with it: the archive's /collectives). Lock-free, no allocation or system call: one atomic add and a
 *  64-byte store, so that an NCCL profiler callback can call it. Thread-safe.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (record NULL, struct_size below this header's sizeof, op, datatype or
 *  phase out of range, peer below -1) or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_record_collective(const struct oomflight_collective* record);

/** Names a communicator whose operations this rank records: its id (as in oomflight_collective.comm_id), a name
 *  (e.g. "world", NCCL's commName; NULL or "": none; cut at 47 bytes), this rank's rank in it and its size. The
 *  archive's /communicators holds every one registered (the newest 4096 per rank), so that the report can say
 *  "on the world communicator (4 ranks)". Registering an id again replaces its entry. Takes a mutex: once per
 *  communicator, not per operation. Thread-safe.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (comm_size < 1, comm_rank outside 0 .. comm_size - 1) or
 *  OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_register_communicator(uint64_t comm_id, const char* name, int comm_rank, int comm_size);

/** The communicator id oomflight's MPI sources (the replay, the launcher's jobs) give MPI_COMM_WORLD: the same
 *  constant on every rank ("world" registered at oomflight_init under MPI). Needs no init. */
OOMFLIGHT_API uint64_t oomflight_world_communicator(void);

/** Sets a metadata key/value pair of this rank (epoch, learning rate, batch size, sequence length, ...), stored
 *  with the current batch; every later archive holds every pair set so far (the newest 4096), in the order set,
 *  in its /context dataset. A key that looks secret (contains KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL, AUTH, ...:
 *  docs/archive-format.md) has its value stored as "<redacted>". Both strings are copied. Thread-safe.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (key NULL or empty, value NULL) or OOMFLIGHT_ESTATE. */
OOMFLIGHT_API int oomflight_set_metadata(const char* key, const char* value);

/** Asks for a dump of request->kind: freezes this rank's history at once, asks every rank to dump, and returns
 *  once the archive is closed (or every rank's rank-local fallback is written, or 3 x OOMFLIGHT_DUMP_TIMEOUT has
 *  passed). It records no event itself: a source that saw the failure records its oom event with
 *  oomflight_record first (or calls oomflight_trigger_oom). `result` may be NULL; it is filled only when its
 *  struct_size is at least sizeof(struct oomflight_dump_result) (use OOMFLIGHT_DUMP_RESULT_INIT), else left as is.
 *  Returns OOMFLIGHT_OK when an archive was written, OOMFLIGHT_EDUMP otherwise (result->status says what was
 *  written), OOMFLIGHT_EDISABLED, OOMFLIGHT_EINVAL (request NULL, request->struct_size below the 0.2 request's
 *  48 bytes, kind out of range, device outside -1 .. 63, batch below -1, requested_bytes or device_free_bytes of
 *  2^63 or more (a negative figure passed as unsigned); an allocator state with a NULL array, more rows than its
 *  limits, a segment's device outside 0 .. 63, a size of 2^63 or more, a block's state outside 0 .. 2, a segment detail's type outside
 *  -1 .. 1, or a stack id not interned: the
 *  message names the row), OOMFLIGHT_ENOMEM (no host memory for the dump),
 *  OOMFLIGHT_EINTERNAL or OOMFLIGHT_ESTATE. The path written is oomflight_last_dump_path(). Blocks the calling
 *  thread; never throws. */
OOMFLIGHT_API int oomflight_request_dump(const struct oomflight_dump_request* request,
                                         struct oomflight_dump_result* result);

/** The common case for an allocator hook: records an OOMFLIGHT_OOM event on `device` (size = requested_bytes,
 *  addr = device_free_bytes) and asks for an oom dump of that device; returns as oomflight_request_dump, or
 *  OOMFLIGHT_EINVAL for a device outside 0 .. 63 or a figure of 2^63 or more (nothing recorded then). */
OOMFLIGHT_API int oomflight_trigger_oom(int device, const char* reason, uint64_t requested_bytes,
                                        uint64_t device_free_bytes);

/** Deprecated since 0.1 (kept so that callers built against the first header still link and run):
 *  oomflight_trigger_oom(0, reason, requested_bytes, device_free_bytes). */
OOMFLIGHT_API int oomflight_trigger_dump(const char* reason, uint64_t requested_bytes, uint64_t device_free_bytes)
    OOMFLIGHT_DEPRECATED("use oomflight_trigger_oom(device, ...)");

/** Classifies an error: 1 when (type_name, message) is an out-of-memory error (PyTorch, XLA, CUDA, HIP, NCCL,
 *  host), else 0. Either may be NULL. Pure; thread-safe; needs no init. */
OOMFLIGHT_API int oomflight_is_oom(const char* type_name, const char* message);

/** Writes one line in oomflight's log format ("oomflight[rank N] level: message" once oomflight_init has named
 *  the rank, "oomflight level: message" before) to stderr, if `level` passes OOMFLIGHT_LOG_LEVEL (info until
 *  oomflight_init has read it). For plugins, so that their messages read like oomflight's. Needs no init.
 *  Returns OOMFLIGHT_OK or OOMFLIGHT_EINVAL (level out of range, message NULL). */
OOMFLIGHT_API int oomflight_log(int level, const char* message);

/** Ends the session as a normal end that the program asks for (docs/protocol.md, "Leaving"): the running batch
 *  ends (a snapshot window it completes is written), and the watcher keeps answering the other ranks' dumps until
 *  every rank has ended its session, one has left without them, or OOMFLIGHT_DUMP_TIMEOUT; then it stops. After
 *  this rank's own OOM dump it does not wait (its job is ending on that error, and the others may be stuck in the
 *  job's collectives). MPI is not finalised here: the MPI that oomflight_init started is finalised at the
 *  process's successful exit (below), so the job may still use it.
 *  The library ends a session by itself, so that no program needs to call this (glibc's on_exit, which is told the
 *  exit status; it runs after Python's finalisation): an exit with status 0 ends it as this call does, but even
 *  after an OOM dump (a caught and retried OOM is a normal end), then finalises the MPI that oomflight_init started
 *  (mpirun fails a job whose rank exits without it); any other status ends it as oomflight_end does. A job that
 *  finalises MPI itself ends the session first, inside its MPI_Finalize (an MPI_COMM_SELF attribute's callback).
 *  The session's memory is kept until the process ends: callbacks already inside it (torch's allocator hook,
 *  NCCL's profiler) finish safely, later calls get OOMFLIGHT_ESTATE.
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_ESTATE (not initialised), OOMFLIGHT_EDUMP (a dump was stuck in an MPI call
 *  past 3 x OOMFLIGHT_DUMP_TIMEOUT and was left behind; oomflight will then not finalise MPI) or
 *  OOMFLIGHT_EINTERNAL. A fork's child has no session (its calls get OOMFLIGHT_ESTATE; its exit ends nothing). */
OOMFLIGHT_API int oomflight_shutdown(void);

/** Ends the session as a process that exits with `exit_status` ends it, for a caller that knows the status
 *  before the process's exit does (the Python package calls it at an uncaught exception, so that the other ranks
 *  learn at once rather than after the interpreter's finalisation). 0 is a normal end (as oomflight_shutdown, even
 *  after an OOM dump). Any other status leaves at once: a dump under way is finished (within its deadline), every
 *  other rank is told that this one left (LEFT, so that none of them waits for it: their dumps fall back to
 *  rank-local files at once, their leave agreement ends), and nothing waits for another rank; MPI is not finalised
 *  here (MPI_Finalize can wait for the living), and at the exit only if that exit's status is 0 after all. Since
 *  0.2.1.
 *  Returns as oomflight_shutdown. */
OOMFLIGHT_API int oomflight_end(int exit_status);

/** A key-value store that every rank of the job reaches (PyTorch's c10d store: a TCPStore, torchrun's agent store),
 *  handed to oomflight by a plugin so that a job no MPI launcher started still dumps every rank into one archive
 *  (docs/protocol.md, "Jobs without MPI"). Every function may be called from any thread, also concurrently, and
 *  must not need the caller to hold any lock of the host (no Python GIL): oomflight calls them from its watcher
 *  thread and from a thread that ran out of memory. Keys are short ASCII text; oomflight puts every key it uses
 *  under the prefix the plugin chose for it. Each function returns 0 on success and a negative number on a failure
 *  of the store (then last_error, when not NULL, says why, for this thread); none waits for a key to appear.
 *  The struct is copied at oomflight_join_store; `user` must stay valid until `release` is called (without a
 *  `release`, until the process ends). */
struct oomflight_store {
  size_t struct_size; /**< sizeof(struct oomflight_store) */
  void* user;         /**< passed to every function */
  /** Sets `key` to the `size` bytes at `value`. */
  int (*set)(void* user, const char* key, const void* value, size_t size);
  /** Reads `key` without waiting: 1 when it exists (its full size in *size, at most `capacity` bytes copied to
   *  `buffer`), 0 when it does not. */
  int (*get)(void* user, const char* key, void* buffer, size_t capacity, size_t* size);
  /** Adds `delta` to the counter `key` (created at 0) and gives its new value in *value; delta 0 reads it. */
  int (*add)(void* user, const char* key, int64_t delta, int64_t* value);
  /** This thread's message for the last failure, or NULL. May be NULL. */
  const char* (*last_error)(void* user);
  /* Since 0.3 (read only when struct_size covers it: a plugin built against the 0.2.1 header passes 48 bytes): */
  /** oomflight no longer uses the store: called once, on any thread, after the last call to the other functions
   *  has returned (when this rank's session ends, or at oomflight_leave_store), so that the plugin drops its
   *  reference and the store ends when the job lets go of it (a FileStore removes its file then). Never called
   *  for a store whose oomflight_join_store failed: that one stays the plugin's. May be NULL. */
  void (*release)(void* user);
};
/** The size of struct oomflight_store before `release` (0.2.1): the smallest oomflight_join_store takes. */
#define OOMFLIGHT_STORE_SIZE_0_2_1 (sizeof(size_t) + 5 * sizeof(void*))

/** Joins a job that no MPI launcher started through `store` (since 0.2.1): this process is rank `rank` of
 *  `world_size` (`local_rank` among the processes of its host), as the job's own launcher numbered it (torch's
 *  ranks). From then on an OOM on any rank makes every rank that joined the same store write its history, and the
 *  lowest rank that wrote one merges them into one archive of the usual schema. Not collective and never waits for
 *  another rank: the ranks agree on the run name, the job id and the settings that must agree on oomflight's own
 *  thread, within OOMFLIGHT_DUMP_TIMEOUT (until then a dump waits for that agreement; without it, or when the
 *  settings differ, each rank dumps alone, and the log says why on every rank).
 *  Returns OOMFLIGHT_OK, OOMFLIGHT_EINVAL (store NULL, a NULL function, struct_size too small, world_size < 1,
 *  rank or local_rank outside 0 .. world_size - 1), OOMFLIGHT_ESTATE (not initialised, under an MPI launcher, or
 *  already joined) or OOMFLIGHT_EINTERNAL. Thread-safe; call it before the job's first dump; again after
 *  oomflight_leave_store, with the job's new store (its keys under a prefix of their own). */
OOMFLIGHT_API int oomflight_join_store(const struct oomflight_store* store, int rank, int world_size, int local_rank);

/** The job lets go of the store this process joined (PyTorch's destroy_process_group) (since 0.3): oomflight stops
 *  using it at once. The other ranks learn that this rank left, so that no dump of theirs waits for it; a dump under
 *  way on this rank ends at its next use of the store (this rank's rank-local file stands); the store's `release`
 *  is called once no call to it is in flight. Waits for no other rank: it makes up to three requests of the store
 *  (each bounded by the store's own timeout; they stop at the first failure) and waits at most
 *  OOMFLIGHT_POLL_INTERVAL + 0.1 s for oomflight's own watcher. Until a later oomflight_join_store this rank's dumps are its own rank-local files,
 *  which say so. `reason` (may be NULL) names why in the log. Returns OOMFLIGHT_OK, OOMFLIGHT_ESTATE (not
 *  initialised, or no store joined). Thread-safe; never throws. */
OOMFLIGHT_API int oomflight_leave_store(const char* reason);

/** The last error message of this thread ("" if none). Valid until this thread's next oomflight call. */
OOMFLIGHT_API const char* oomflight_last_error(void);

/** This thread's copy of the path written by this process's last dump ("" if none). Valid until this thread's
 *  next call of oomflight_last_dump_path. */
OOMFLIGHT_API const char* oomflight_last_dump_path(void);

#ifdef __cplusplus
}
#endif

#endif /* OOMFLIGHT_OOMFLIGHT_H */
