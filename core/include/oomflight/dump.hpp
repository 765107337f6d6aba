// What a dump produces and what a trigger carries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace oomflight {

/// Why a rank asks for a dump. Bytes.
struct TriggerInfo {
  std::string reason;                  ///< the error message, e.g. PyTorch's "CUDA out of memory. Tried to ..."
  std::uint64_t requested_bytes = 0;   ///< the allocation that failed; 0 when not an allocation
  std::uint64_t device_free_bytes = 0; ///< free device memory as the allocator saw it; 0 when unknown
};

/// The outcome of a dump, as the rank that asked for it sees it.
struct DumpResult {
  enum class Status {
    archive,     ///< one archive written by all ranks together
    rank_local,  ///< the ranks did not agree in time (or the archive failed): this rank wrote its own file
    failed,      ///< nothing could be written (see error)
    disabled,    ///< OOMFLIGHT_ENABLED=0
  };
  Status status = Status::failed;
  std::string path;                 ///< the archive, or this rank's rank-local file
  std::vector<int> origin_ranks;
  int ranks_written = 0;            ///< ranks in the archive (1 for a rank-local file)
  int world_size = 1;
  std::int64_t batch = -1;          ///< the (lowest) origin's batch
  double seconds = 0;               ///< from the trigger to the file's close
  std::string error;                ///< why the archive was not written, when it was not
};

}  // namespace oomflight
