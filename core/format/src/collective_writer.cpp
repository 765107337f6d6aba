// The collective archive writer: rank 0 lays the file out, every rank writes its own rows, rank 0 names it.
#include "oomflight/format/collective_writer.hpp"

#include <hdf5.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <optional>
#include <vector>

#include "archive_file.hpp"
#include "archive_rows.hpp"
#include "file_size_signal.hpp"
#include "oomflight/base/log.hpp"
#include "write_phases.hpp"

namespace oomflight {
namespace {

using format_detail::Counts;
using format_detail::kTables;

// What the collectives read and write. A collective given up on may still complete later (a stalled rank
// resumes): its buffers must then still be there, so they live on the heap and are leaked on a timeout.
struct Exchange {
  Counts mine{};
  std::vector<Counts> all;
  std::array<std::uint64_t, kTables + 1> layout{};  // each dataset's address, then 1 if the file was created
  int ok = 0, all_ok = 0;
  int renamed = 0;
};

}  // namespace

void write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                              MPI_Comm comm, const CollectiveWait& wait) {
  if (comm == MPI_COMM_NULL) return write_archive(path, header, dump);
  const format_detail::IgnoreFileSizeSignal no_sigxfsz;  // a write past `ulimit -f` fails, it does not kill
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  format_detail::WritePhases phases;
  int index = 0, size = 1;
  MPI_Comm_rank(comm, &index);
  MPI_Comm_size(comm, &size);
  auto x = std::make_unique<Exchange>();
  x->mine = format_detail::local_counts(dump);
  x->all.resize(static_cast<std::size_t>(size));
  auto complete = [&](int started, MPI_Request& request, const char* step) {
    if (started != MPI_SUCCESS) {  // the communicator returns errors (MPI_ERRORS_RETURN): the others time out
      throw ArchiveError(fmt::format("writing archive '{}': MPI error {} at the {}", path, started, step));
    }
    const bool done = wait ? wait(request) : MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    if (done) return;
    x.release();  // NOLINT: deliberately leaked, MPI may still write into it
    throw CollectiveTimeout(fmt::format("writing archive '{}': not every rank reached the {} in time", path, step));
  };
  const std::string partial = partial_archive_path(path);
  std::optional<format_detail::ArchiveFile> file;  // rank 0's: removed on any throw unless finished

  // 1. Every rank's row counts: this rank's rows follow those of the ranks before it.
  MPI_Request request = MPI_REQUEST_NULL;
  complete(MPI_Iallgather(x->mine.data(), kTables, MPI_UINT64_T, x->all.data(), kTables, MPI_UINT64_T, comm,
                          &request),
           request, "row counts");
  Counts at{}, total{};
  for (int r = 0; r < size; ++r) {
    for (int t = 0; t < kTables; ++t) {
      if (r < index) at[t] += x->all[static_cast<std::size_t>(r)][t];
      total[t] += x->all[static_cast<std::size_t>(r)][t];
    }
  }
  phases.mark("counts");

  // 2. Rank 0 creates the file and every dataset alone, and tells the others where each dataset lies.
  std::string create_error;
  if (index == 0) {
    try {
      file.emplace(partial, header, total);
      std::copy(file->layout().address.begin(), file->layout().address.end(), x->layout.begin());
      x->layout[kTables] = 1;
    } catch (const ArchiveError& e) {
      create_error = e.what();
    }
  }
  complete(MPI_Ibcast(x->layout.data(), kTables + 1, MPI_UINT64_T, 0, comm, &request), request, "file's layout");
  if (x->layout[kTables] != 1) {
    throw ArchiveError(fmt::format("{}{}",
                                   create_error.empty()
                                       ? fmt::format("rank 0 could not create archive '{}' (folder missing or not "
                                                     "writable, or disk full?)",
                                                     partial)
                                       : create_error,
                                   format_detail::file_size_limit_note()));
  }
  format_detail::Layout layout;
  std::copy(x->layout.begin(), x->layout.begin() + kTables, layout.address.begin());
  phases.mark("layout");

  // 3. Every rank writes its own rows and syncs them; all agree on the outcome.
  const format_detail::RankRows rows = format_detail::global_rows(dump, at);
  const format_detail::PlacedRows placed{&rows, at};
  std::string error = format_detail::write_rows(partial, layout, std::span(&placed, 1), true);
  phases.mark("rows and sync");
  x->ok = error.empty() ? 1 : 0;
  complete(MPI_Iallreduce(&x->ok, &x->all_ok, 1, MPI_INT, MPI_LAND, comm, &request), request,
           "agreement on the rows");
  phases.mark("agreement");

  // 4. Rank 0 marks it complete, checks it and gives it its name, or removes it.
  if (index == 0) {
    if (x->all_ok) {
      error = file->finish(true);
      if (error.empty() && std::rename(partial.c_str(), path.c_str()) != 0) {
        error = fmt::format("cannot rename it to its final name: {}", std::strerror(errno));
      }
      x->renamed = error.empty() ? 1 : 0;
    }
    if (!x->renamed) file->abandon();  // a failed write keeps no name at all
    file.reset();
  }
  complete(MPI_Ibcast(&x->renamed, 1, MPI_INT, 0, comm, &request), request, "rename");
  phases.mark("complete and rename");
  if (index == 0) log().debug("{}: {}", path, phases.text());
  if (!x->renamed) {
    throw ArchiveError(fmt::format("writing archive '{}' failed: {}{}", path,
                                   error.empty() ? std::string("on another rank") : error,
                                   format_detail::file_size_limit_note()));
  }
}

}  // namespace oomflight
