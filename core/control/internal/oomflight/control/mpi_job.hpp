// The MPI job this process belongs to, if any (internal to liboomflight): launcher detection, MPI set-up and the
// identity of this rank.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>

#include "oomflight/control/config.hpp"
#include "oomflight/control/rank_identity.hpp"

namespace oomflight {

/// True when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE is set): then the
/// recorder joins the job's control plane; otherwise it runs as a single process and makes no MPI call.
/// Thread-safe (reads the environment).
bool launched_by_mpi();

/// The rank a launcher that is not MPI's gave this process (torchrun, the trainers' own launchers, accelerate):
/// RANK and WORLD_SIZE, each a whole decimal number, RANK below WORLD_SIZE; LOCAL_RANK when it is one below
/// WORLD_SIZE, else 0. nullopt when either is missing or malformed (then the process is rank 0 of 1 until it joins the
/// job's store). Thread-safe (reads the environment).
struct LauncherRank {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
};
std::optional<LauncherRank> launcher_rank();

/// Initialises MPI with MPI_THREAD_MULTIPLE unless the process already did (the application owns MPI when it
/// initialised it). Returns true when this call initialised it (the caller then owns its MPI_Finalize, whatever
/// happens next). Throws std::runtime_error when MPI_Init_thread fails. Call from the main thread, before any other
/// MPI use of oomflight, then require_thread_multiple().
bool initialise_mpi_if_needed();

/// Throws std::runtime_error, naming the levels, when MPI (the job's, or oomflight's when `initialised_here`) runs
/// below MPI_THREAD_MULTIPLE: the watcher thread calls MPI while the job's threads do.
void require_thread_multiple(bool initialised_here);

/// Finalises MPI unless it is already finalised. Only for a process whose MPI oomflight initialised, on a normal
/// exit that every rank reaches (MPI_Finalize waits for the other ranks).
void finalise_mpi();

/// Generates a run name: "oomflight-YYYYMMDD-HHMMSS-xxxx" (UTC, 4 random hex digits).
std::string generate_run_name();

/// This process's identity in `comm` (collective over it when it is not MPI_COMM_NULL): rank, world size,
/// local rank (MPI_Comm_split_type SHARED), pid, host and the run name (rank 0's configured or generated name,
/// broadcast, so that every rank names files alike). With MPI_COMM_NULL, no MPI call: launcher_rank()'s numbers, else
/// rank 0 of 1.
RankIdentity identify(const Config& config, MPI_Comm comm);

}  // namespace oomflight
