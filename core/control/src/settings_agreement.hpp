// The start-up agreement (internal to the control wing): the settings that every rank must share are compared in
// one collective step at init, before any collective that depends on them.
//
// Why a step of its own: the snapshot schedule decides whether a rank creates the snapshots' communicator (a
// collective) and when it enters each snapshot's barrier, and OOMFLIGHT_ENABLED decides whether it answers
// triggers at all. One rank with another schedule blocked in MPI_Comm_dup while its peers were already in the
// job's own collectives: the job hung with nothing logged (issue 19). Every rank takes part here whatever its
// settings, even a rank whose settings did not parse, so a mismatch ends start-up on every rank alike.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "agreed_settings.hpp"
#include "oomflight/control/config.hpp"

namespace oomflight {

/// Collective over `comm` (every rank of it must call it once, before any other collective of the recorder that
/// depends on the settings). `config` is this rank's settings, or nullptr when this rank cannot start (its settings
/// did not parse, or its history could not be allocated): it still takes part, so that no peer waits for it. Costs one MPI_Allreduce of 10 int64 values; only when ranks
/// disagree, one MPI_Allgather of 5 int64 values per rank follows, to name them.
///
/// Returns when every rank's settings parsed and agree. Otherwise throws ConfigError on every rank, with the same
/// message everywhere (settings_mismatch(), then "; oomflight did not start on any rank"): each variable that differs, its values and the ranks that hold each ("OOMFLIGHT_SNAPSHOT_EVERY
/// differs between ranks: 1ba on rank 1; unset on ranks 0, 2-3"), and the ranks that could not start.
/// Throws std::runtime_error when an MPI call fails. Not thread-safe with other collectives on `comm`.
void agree_on_settings(const Config* config, MPI_Comm comm);

}  // namespace oomflight
