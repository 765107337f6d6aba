// How a collective archive asks a parallel file system to spread it over its servers (internal to the format
// wing). docs/scale.md: on Lustre a new file takes its folder's layout, by default one stripe on one OST, and an
// archive of 16,384 ranks x 100,000 events (75 GiB) written through one OST takes ~40 s, past the dump's deadline.
#pragma once

#include <cstdint>
#include <string>

namespace oomflight::format_detail {

/// The stripe unit asked for: 4 MiB, Lustre's default stripe size in current releases (Lustre wiki, "Lustre
/// Striping Best Practices").
inline constexpr std::uint64_t kStripeUnitBytes = 4u << 20;

/// How many stripes to ask for an archive of `bytes`: `setting` > 0 is that many; 0 is none (the folder's own
/// layout); < 0 (auto) is one stripe per GiB, at most 2,000 (Lustre's most), and none below 2 (small archives keep
/// the folder's layout, which a site may have chosen).
int archive_stripes(int setting, std::uint64_t bytes);

/// Creates the empty file `path` through MPI-IO (MPI_COMM_SELF) with the hints "striping_factor" = `stripes` and
/// "striping_unit" = kStripeUnitBytes, so that the MPI library's own file-system driver (ROMIO's ad_lustre, Open
/// MPI's fs/lustre) sets the layout while creating it, as the MPI standard's reserved hints ask; HDF5 then opens it
/// with H5F_ACC_TRUNC, which keeps a Lustre layout. Elsewhere the hints are ignored and this is one more open.
/// Removes a leftover file of that name first (a layout is only set at creation). Never throws; returns what it
/// did, for the debug log ("" when `stripes` <= 0). Call it from one thread; it is local to this process.
std::string create_striped(const std::string& path, int stripes);

}  // namespace oomflight::format_detail
