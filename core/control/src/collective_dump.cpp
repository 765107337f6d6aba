// The MPI transport's collective write of a dump (collective_dump.hpp).
#include "collective_dump.hpp"

namespace oomflight {

std::string write_dump_collective(const DumpExecutor& executor, const std::string& path, const ArchiveHeader& header,
                                  const RankRow& row, const FrozenHistory& h, MPI_Comm comm,
                                  const CollectiveArchive& how, const AllocatorStateRows* state) {
  CollectiveArchive named = how;
  if (named.naming != Naming::replace) named.naming = executor.naming();  // the caller's replace (a joint dump) stands
  return write_archive_collective(path, header, DumpExecutor::dump_of(row, h, state), comm, named);
}

ArchiveRowCounts dump_row_counts(const FrozenHistory& h, const AllocatorStateRows* state) {
  return archive_row_counts(DumpExecutor::dump_of(RankRow{}, h, state));
}

}  // namespace oomflight
