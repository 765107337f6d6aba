// `oomflight import`: per-rank PyTorch snapshots that other tools already write (Composer's rank{rank}_oom
// pickles, torchtitan's, torch.cuda.memory._dump_snapshot() of any job) become one archive, so that yesterday's
// crash gets the same report and exports as one recorded by oomflight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight {

/// One input: a snapshot pickle and the rank it was written by.
struct SnapshotInput {
  std::string path;
  int rank = 0;
};

struct ImportOptions {
  std::string run_name;               ///< "" : the first input's file name without its extension
  int world_size = 0;                 ///< 0: the largest rank + 1
  std::uint64_t device_capacity_bytes = 0;  ///< every rank's device capacity; 0: unknown
};

/// Reads every input with the strict pickle reader and writes `output`, one rank per input, as
/// write_archive_ranks() writes (a partial name, synced, checked, renamed). Per rank, in order:
/// - the allocator state when the trace began (snapshot_start_state: segments and live blocks that predate it,
///   with their frames) as segment_alloc and alloc events of batch -1, flagged kEventPredatesHistory (they are
///   no trace entries of the snapshot);
/// - a step marker, then every trace entry of every device, batch 0 (an imported trace is one batch);
/// Times: the trace's time_us (UTC) in ns, the state before it 1 us before its first entry; a trace without
/// time_us is numbered 1 us per entry. The rank's figures are the snapshot's end state as PyTorch defines them:
/// allocated = sizes of active_allocated blocks, reserved = sizes of segments; peaks follow the trace from the
/// start state. The snapshot's end state goes into /state_segments and /state_blocks as it is (every segment
/// field, every block), its other top-level keys and the optional keys its entries lacked into /context (kinds
/// snapshot_field and snapshot_layout): `export --format memory_viz` gives the snapshot back. Keys this reader
/// does not carry (a newer PyTorch's) are named in `notes`, one line per key, when `notes` is given.
/// A rank whose trace holds an oom entry is an origin: its request, the device's free bytes and a
/// reason naming the file; the archive's kind is then "oom", else "snapshot" (window 0 to 0).
/// Throws ArchiveError naming the input: unreadable or refused (the pickle reader's and decoder's messages), two
/// inputs of one rank, a rank outside the world size, `output` naming an input, or the write's failure. Memory:
/// every snapshot decoded at once (about 60 bytes per trace entry). Call it from one thread (serial HDF5).
OOMFLIGHT_API ArchiveHeader import_torch_snapshots(const std::vector<SnapshotInput>& inputs, const std::string& output,
                                                   const ImportOptions& options = {},
                                                   std::vector<std::string>* notes = nullptr);

}  // namespace oomflight
