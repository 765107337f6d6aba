// The archive as a file (internal to the format wing): one process lays it out with HDF5, every writer puts its
// rows at their addresses with POSIX I/O, and the process that laid it out marks it complete and names it.
//
// Why not parallel HDF5 over MPI-IO (DESIGN.md's first plan; docs/protocol.md, "One write, laid out once"): every
// rank's rows are one contiguous range per dataset, so the only work that needs HDF5 is the metadata, and one
// process can do it alone in under a millisecond. MPI-IO's collective open, collective metadata and collective
// close were most of a dump (at 64 ranks on two cores, 0.3 - 0.6 s of blocking collectives that no deadline can
// interrupt), and OMPIO reported success for writes that had failed with ENOSPC. Plain pwrite() reports every
// error itself, and every step between the ranks becomes a non-blocking collective with a deadline.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "archive_rows.hpp"
#include "h5_handle.hpp"

namespace oomflight::format_detail {

/// Where each dataset's row 0 lies in the file (bytes from its start); kNoAddress for a dataset without rows.
struct Layout {
  static constexpr std::uint64_t kNoAddress = ~std::uint64_t{0};
  std::array<std::uint64_t, kTables> address{};
};

/// The file as the process that lays it out holds it: open in HDF5 from create() until finish() or abandon().
class ArchiveFile {
 public:
  /// Creates `partial` (truncating a file of that name) with the root attributes of `header` but `complete`, and
  /// every dataset at `total` rows, contiguous, its space allocated now and never filled. Throws ArchiveError
  /// naming the file and the step. Not thread-safe with other HDF5 use in the process.
  ArchiveFile(std::string partial, const ArchiveHeader& header, const Counts& total);
  ~ArchiveFile();  ///< abandon() unless finished
  ArchiveFile(const ArchiveFile&) = delete;
  ArchiveFile& operator=(const ArchiveFile&) = delete;

  const Layout& layout() const { return layout_; }

  /// Once every writer's rows are in: writes `complete` = 1 (the last attribute: HDF5 writes its metadata at the
  /// close after it, and the name is given only after the reopened file was checked), closes the file and, when `sync`,
  /// fsyncs it and reopens it to check the mark and every dataset's size. Returns "" or what failed; the file
  /// keeps its partial name either way (the caller renames or removes it).
  std::string finish(bool sync);

  /// Closes the file without the mark and removes it.
  void abandon();

 private:
  std::string partial_;
  Counts total_{};
  h5::Handle file_;
  Layout layout_;
};

/// One process's rows and where they go: `at` holds the rows of every earlier rank, per dataset.
struct PlacedRows {
  const RankRows* rows = nullptr;
  Counts at{};
};

/// Writes each rank's rows into `partial` at layout address + at x row size with pwrite() (every short write and
/// error checked; stack ids of the events made global in a small buffer on the way), then fsync()s when `sync`,
/// and closes. Returns "" or what failed (the dataset, the offset and errno's text). Thread-safe for distinct
/// rows; any number of processes may write disjoint rows of one file at once.
std::string write_rows(const std::string& partial, const Layout& layout, std::span<const PlacedRows> ranks,
                       bool sync);

/// The root's check, once every rank reported success: row i of /ranks (i < rank_count), as it lies in the file,
/// names rank `ranks[i]` (i when `ranks` is shorter), and the rows' event counts add up to `total_events`. It
/// catches rows that never reached this file (a writer that opened another file of the same name on a node-local
/// folder, a write lost by a network file system): a missing row reads as zeros. Reads rank_count rows (O(P)
/// bytes, once, on the root only). Returns "" or what is wrong.
std::string check_rank_rows(const std::string& partial, const Layout& layout, int rank_count,
                            std::uint64_t total_events, std::span<const std::int32_t> ranks);

/// fsync()s the folder holding `path`, so that a rename into it survives a crash of the node. Returns "" or
/// errno's text (EINVAL, a file system that cannot sync folders, is success).
std::string sync_folder_of(const std::string& path);

}  // namespace oomflight::format_detail
