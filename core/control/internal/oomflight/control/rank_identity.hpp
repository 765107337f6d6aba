// Who this process is in the job: for file names, the /ranks row and the log (internal to the control wing).
#pragma once

#include <cstdint>
#include <string>

namespace oomflight {

struct RankIdentity {
  int rank = 0;
  int local_rank = 0;     ///< rank among the processes of this node
  int world_size = 1;
  std::int64_t pid = 0;
  std::string host;
  std::string run_name;   ///< the same on every rank
  std::string job_id;     ///< 12 hex digits drawn by rank 0 at start-up, the same on every rank (ArchiveHeader::job_id)
};

}  // namespace oomflight
