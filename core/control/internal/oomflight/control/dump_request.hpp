// What asks for a dump and what a dump produced (internal to liboomflight; the C API's oomflight_dump_request
// and oomflight_dump_result are their ABI-stable faces).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oomflight/format/archive_schema.hpp"

namespace oomflight {

/// A rank's allocator state as its source gave it with a request (stack ids: the recorder's own).
struct AllocatorStateRows {
  std::vector<StateSegmentRow> segments;
  std::vector<StateBlockRow> blocks;
};

/// One request for a dump, whatever its kind. Bytes.
struct DumpRequest {
  DumpKind kind = DumpKind::oom;
  std::string reason;                   ///< e.g. PyTorch's "CUDA out of memory. Tried to allocate ..."
  std::uint64_t requested_bytes = 0;    ///< the allocation that failed; 0 when not an allocation
  std::uint64_t device_free_bytes = 0;  ///< free device memory as the allocator saw it; 0 when unknown
  /// The device's capacity and the process's own cap (0: unknown, none; the recorder's gauges then), and which of
  /// the figures were read from the reason's own text (kFromMessage* bits: complete_from_message).
  std::uint64_t device_capacity_bytes = 0;
  std::uint64_t memory_cap_bytes = 0;
  std::uint32_t numbers_from_message = 0;
  int device = -1;                      ///< the device concerned; -1: the recorder's current device
  std::int64_t batch = -1;              ///< the batch concerned; -1: the recorder's current batch
  AllocatorStateRows state;             ///< the requesting rank's allocator state now; empty when not given
};

/// An oom request's figures that the caller left at 0, taken from its reason where that is PyTorch's out-of-memory
/// message (oom_message.hpp), each marked in numbers_from_message: the requested size, the device's capacity and free
/// memory, the per-process cap. A figure the caller gave is kept; the device's figures are not read when an allocator
/// hook published them (`device_published`: its gauges know the device's capacity; a free of 0 is then the hook's
/// own figure, not a missing one). Other kinds are returned as they are.
DumpRequest complete_from_message(DumpRequest request, bool device_published);

/// The outcome of a dump, as the rank that asked for it sees it.
struct DumpResult {
  enum class Status {
    archive,     ///< one archive written by all ranks together
    rank_local,  ///< the ranks did not agree in time (or the archive failed): this rank wrote its own file
    failed,      ///< nothing could be written (see error)
    disabled,    ///< OOMFLIGHT_ENABLED=0
  };
  Status status = Status::failed;
  DumpKind kind = DumpKind::oom;
  std::string path;                 ///< the archive, or this rank's rank-local file
  std::vector<int> origin_ranks;
  int ranks_written = 0;            ///< ranks in the archive (1 for a rank-local file)
  int world_size = 1;
  std::int64_t batch = -1;          ///< the (lowest) origin's batch
  double seconds = 0;               ///< from the request to the file's close
  std::string error;                ///< why the archive was not written, when it was not
};

}  // namespace oomflight
