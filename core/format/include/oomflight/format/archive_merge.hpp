// Joins rank-local files (and archives) into one archive: what a dump that could not agree leaves behind becomes
// the archive it would have written, for report and the exporters.
#pragma once

#include <string>
#include <vector>

#include "oomflight/api.h"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight {

/// Reads every file of `inputs` (rank-local files of one dump, any subset of its ranks, or archives) and writes
/// `output`: one archive of the same schema with every rank found, rows in rank order, written as
/// write_archive_ranks() writes (a partial name, synced, checked, renamed). ranks_present says who is in it;
/// origin_ranks is the union of the inputs' origins; reason joins their distinct reasons; world_size, run_name
/// kind and a snapshot's window are the inputs' (which must agree).
///
/// Throws ArchiveError naming the file and what is wrong: an input that does not read (read_archive's errors),
/// inputs of different runs, kinds or world sizes, a rank present in two inputs, `output` naming an input, or
/// the write's own failure. Memory: every input is held at once (about 50 bytes per event). Call it from one
/// thread (serial HDF5). Returns the header written.
OOMFLIGHT_API ArchiveHeader merge_archives(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace oomflight
