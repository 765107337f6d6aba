// How a file gets its final name when the name may be taken (internal to liboomflight: the writers, and the dump
// executor that picks names). Two jobs with the same run name writing into one folder used to take each other's
// names: the final rename replaced whatever held the name, so each job was told "archive .../signal.N.h5 written"
// for a file that held the other's dump, and each job's retention removed the other's archives (issue 30).
//
// The rule: a name is claimed with a rename that never replaces (renameat2's RENAME_NOREPLACE; where the file
// system lacks it, link(2) then unlink(2), which fails the same way on a taken name). When the wanted name
// folder/STEM.EXT is taken, the candidates that follow say whose the file is:
//   - taken by an archive of this job (the same job_id: the same batch dumped twice): STEM-1.EXT, STEM-2.EXT, ...
//   - taken by anything else (another job's archive, a file that is not an archive): STEM.JOB.EXT, then
//     STEM.JOB-1.EXT, ... where JOB is this job's id (the archives' root attribute job_id).
// Without a job id (a merge, an import) the counter alone is used.
#pragma once

#include <string>

namespace oomflight::format_detail {

/// The first candidate for `wanted` that does not exist now (see above). Does not create it: a writer claims it
/// later with claim_name(), which tries the next candidates if another process took it meanwhile. Thread-safe.
std::string free_name(const std::string& wanted, const std::string& job_id);

/// Renames `from` to the first candidate for `wanted` that is free at the moment of the rename, never replacing a
/// file (with `replace`, OOMFLIGHT_OVERWRITE=1: a plain rename onto `wanted`). Returns the name it got; throws
/// ArchiveError naming the file and errno's text when the rename fails for another reason. Thread-safe.
std::string claim_name(const std::string& from, const std::string& wanted, const std::string& job_id, bool replace);

}  // namespace oomflight::format_detail
