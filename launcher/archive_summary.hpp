// The one line `import` and `merge` print for the archive they wrote.
#pragma once

#include <string>

#include "oomflight/format/archive_schema.hpp"

namespace oomflight::cli {

/// "PATH: run NAME, kind KIND, ranks 0,1,2 (3 of 4), origins 2" on stdout; "origins none" when the archive names no
/// origin (an import of snapshots, a merge of them), never an empty list.
void print_archive_summary(const std::string& path, const ArchiveHeader& header);

}  // namespace oomflight::cli
