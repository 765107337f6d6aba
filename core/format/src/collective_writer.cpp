// The collective archive writer: the root lays the file out, every rank writes its own rows, the root names it.
#include "oomflight/format/collective_writer.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <memory>
#include <optional>
#include <vector>

#include "archive_file.hpp"
#include "archive_rows.hpp"
#include "archive_striping.hpp"
#include "file_size_signal.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/format/archive_naming.hpp"
#include "oomflight/format/row_placement.hpp"
#include "write_phases.hpp"

namespace oomflight {
namespace {

using format_detail::Counts;
using format_detail::kTables;
static_assert(std::is_same_v<Counts, ArchiveRowCounts>);

// The root's word after creating the file: where each dataset lies, and the file's path.
struct LayoutMessage {
  std::uint64_t address[kTables] = {};
  std::int32_t created = 0;  // 1: the file exists with this layout
  char path[4096] = {};
};

// What the collectives read and write. A collective given up on may still complete later (a stalled rank
// resumes): its buffers must then still be there, so they live on the heap and are leaked on a timeout.
struct Exchange {
  Counts mine{};
  LayoutMessage layout;
  int ok = 0, all_ok = 0;
  char named[4096] = {};  // the name the root's rename got; empty: not renamed
};

}  // namespace

ArchiveRowCounts archive_row_counts(const RankDump& dump) { return format_detail::local_counts(dump); }

std::string write_archive_collective(const std::string& path, const ArchiveHeader& header, const RankDump& dump,
                                     MPI_Comm comm, const CollectiveArchive& how) {
  if (comm == MPI_COMM_NULL) return write_archive(path, header, dump, Durability::verified, how.naming);
  const format_detail::IgnoreFileSizeSignal no_sigxfsz;  // a write past `ulimit -f` fails, it does not kill
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  format_detail::WritePhases phases;
  auto step_done = [&](const char* step) {
    if (how.step_done) how.step_done(step);
  };
  int index = 0, size = 1;
  MPI_Comm_rank(comm, &index);
  MPI_Comm_size(comm, &size);
  const bool root = index == how.root;
  auto x = std::make_unique<Exchange>();
  x->mine = format_detail::local_counts(dump);
  const std::string shown = root ? path : std::string("the archive");  // what errors name before the path is known
  auto complete = [&](int started, MPI_Request& request, const char* step) {
    if (started != MPI_SUCCESS) {
      // The communicator returns errors (MPI_ERRORS_RETURN). This rank leaves alone and the others will time
      // out: for the caller it is a collective given up on.
      x.release();  // NOLINT: as below
      throw CollectiveTimeout(fmt::format("writing {}: MPI error {} at the {}", shown, started, step));
    }
    const bool done = how.wait ? how.wait(request) : MPI_Wait(&request, MPI_STATUS_IGNORE) == MPI_SUCCESS;
    if (done) return;
    x.release();  // NOLINT: deliberately leaked, MPI may still write into it
    throw CollectiveTimeout(fmt::format("writing {}: not every rank reached the {} in time", shown, step));
  };
  std::optional<format_detail::ArchiveFile> file;  // the root's: removed on any throw unless renamed

  // 1. Where this rank's rows go: after those of the ranks before it (O(log P) messages, row_placement.hpp).
  MPI_Request request = MPI_REQUEST_NULL;
  const RowPlacement placement =
      place_rows(x->mine, comm, how.wait, shown, how.row_totals ? &*how.row_totals : nullptr);
  const Counts& at = placement.before;
  const Counts& total = placement.total;
  phases.mark("counts");
  step_done("counts");

  // 2. The root creates the file and every dataset alone, and tells the others its path and where each dataset
  //    lies.
  std::string create_error;
  if (root) {
    if (path.empty()) {
      create_error = "it could not be named";
    } else if (path.size() >= sizeof(LayoutMessage::path)) {
      create_error = fmt::format("its path is longer than {} bytes", sizeof(LayoutMessage::path) - 1);
    } else {
      try {
        // One stripe on one server would carry every rank's rows at scale (archive_striping.hpp).
        std::uint64_t bytes = 0;
        for (int t = 0; t < kTables; ++t) bytes += total[t] * format_detail::row_bytes(static_cast<format_detail::Table>(t));
        const std::string striped =
            format_detail::create_striped(partial_archive_path(path, header.job_id),
                                          format_detail::archive_stripes(how.stripes, bytes));
        if (!striped.empty()) log().debug("{}: {} bytes; {}", partial_archive_path(path, header.job_id), bytes, striped);
        file.emplace(partial_archive_path(path, header.job_id), header, total);
        std::copy(file->layout().address.begin(), file->layout().address.end(), x->layout.address);
        std::memcpy(x->layout.path, path.c_str(), path.size() + 1);
        x->layout.created = 1;
      } catch (const ArchiveError& e) {
        create_error = e.what();
      }
    }
  }
  complete(MPI_Ibcast(&x->layout, sizeof(LayoutMessage), MPI_BYTE, how.root, comm, &request), request,
           "file's layout");
  if (x->layout.created != 1) {
    throw ArchiveError(fmt::format("{}{}",
                                   create_error.empty()
                                       ? fmt::format("rank {} could not create the archive (its folder missing or "
                                                     "not writable, or disk full?)",
                                                     how.root)
                                       : fmt::format("rank {} could not create {}: {}", how.root, shown, create_error),
                                   format_detail::file_size_limit_note()));
  }
  x->layout.path[sizeof(LayoutMessage::path) - 1] = '\0';
  const std::string final_path = x->layout.path;
  const std::string partial = partial_archive_path(final_path, header.job_id);
  format_detail::Layout layout;
  std::copy(std::begin(x->layout.address), std::end(x->layout.address), layout.address.begin());
  phases.mark("layout");
  step_done("layout");

  // 3. Every rank writes its own rows and syncs them; all agree on the outcome. A local failure of any kind is
  //    this rank's "no" in the agreement, never an exception that would leave the others waiting.
  std::string error;
  try {
    const format_detail::RankRows rows = format_detail::global_rows(dump, at);
    const format_detail::PlacedRows placed{&rows, at};
    error = format_detail::write_rows(partial, layout, std::span(&placed, 1), true);
  } catch (const std::bad_alloc&) {
    error = "out of memory while preparing this rank's rows";
  } catch (const std::exception& e) {
    error = e.what();
  }
  phases.mark("rows and sync");
  step_done("rows and sync");
  x->ok = error.empty() ? 1 : 0;
  complete(MPI_Iallreduce(&x->ok, &x->all_ok, 1, MPI_INT, MPI_LAND, comm, &request), request,
           "agreement on the rows");
  phases.mark("agreement");
  step_done("agreement");

  // 4. The root marks it complete, checks it and gives it its name, or removes it.
  if (root) {
    if (x->all_ok) {
      error = format_detail::check_rank_rows(partial, layout, size, total[format_detail::kEvents],
                                             header.ranks_present);
      if (error.empty()) error = file->finish(true);
      std::string named;
      if (error.empty()) {
        // Never onto another process's file: two jobs of one run name in one folder (archive_naming.hpp).
        try {
          named = format_detail::claim_name(partial, final_path, header.job_id, how.naming == Naming::replace);
        } catch (const ArchiveError& e) {
          error = e.what();
        }
      }
      if (error.empty() && named.size() >= sizeof(x->named)) {
        error = fmt::format("its final name '{}' is longer than {} bytes", named, sizeof(x->named) - 1);
        std::remove(named.c_str());
      }
      if (error.empty()) {
        // The others remove their safety copies once they hear of the rename: it must outlive a crash first.
        if (const std::string failed = format_detail::sync_folder_of(named); !failed.empty()) {
          log().warn("{}: the rename may not survive a crash of this node (fsync of its folder: {})", named,
                     failed);
        }
        std::memcpy(x->named, named.c_str(), named.size() + 1);
      }
    }
    if (x->named[0] == '\0') file->abandon();  // a failed write keeps no name at all
    file.reset();
  }
  step_done("verify and rename");
  complete(MPI_Ibcast(x->named, sizeof(x->named), MPI_CHAR, how.root, comm, &request), request, "rename");
  phases.mark("complete and rename");
  step_done("rename heard");
  x->named[sizeof(x->named) - 1] = '\0';
  const std::string named = x->named;
  if (root) log().debug("{}: {}", named.empty() ? final_path : named, phases.text());
  if (named.empty()) {
    throw ArchiveError(fmt::format("writing archive '{}' failed: {}{}", final_path,
                                   error.empty() ? std::string("on another rank") : error,
                                   format_detail::file_size_limit_note()));
  }
  return named;
}

}  // namespace oomflight
