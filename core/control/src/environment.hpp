// What an archive says about each rank's process: where and how it ran (host, pid, working directory, command
// line, library versions) and the environment variables that shape a training job's memory and placement. Values
// whose names look secret are redacted (oomflight/base/redact.hpp) before anything is stored.
#pragma once

#include <vector>

#include "oomflight/control/config.hpp"
#include "oomflight/control/rank_identity.hpp"
#include "oomflight/record/context_log.hpp"

namespace oomflight {

/// The rank's environment entries (kind environment, batch -1): host, pid, rank, cwd, command_line (secret-looking
/// options redacted), oomflight_version, mpi_library (when MPI is initialised), the OOMFLIGHT_* settings given
/// (config.given: from the environment or explicit), then every variable starting with CUDA_ (CUDA_VISIBLE_DEVICES),
/// NCCL_, PYTORCH_, TORCH_, OMPI_COMM_WORLD_, SLURM_JOB, or one of MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK,
/// WORLD_SIZE, sorted by name. Reads /proc/self/cmdline.
std::vector<ContextEntry> capture_environment(const RankIdentity& identity, const Config& config);

}  // namespace oomflight
