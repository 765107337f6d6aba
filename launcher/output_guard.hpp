// Checks made before a command writes: an output must never replace one of its inputs, an existing archive is
// replaced only when asked (--force), and an input that is not what the command reads is named for what it is.
#pragma once

#include <string>
#include <vector>

namespace oomflight::cli {

/// "" when `output` may be written, else the refusal: `output` is (or resolves to, through links or `..`) one of
/// `inputs`; or it exists and `force` is false (`what` names it: "archive"); or it is a folder.
std::string refuse_output(const std::string& output, const std::vector<std::string>& inputs, bool force,
                          const char* what);

/// Whether `path` starts with HDF5's signature (HDF5 File Format Specification, "Format Signature"): an archive or a
/// rank-local file, not a pickle. False for a file that cannot be read.
bool is_hdf5(const std::string& path);

/// "" when `path` may be a pickle, else what it is instead: missing, a folder, an HDF5 file (an archive: its
/// signature, HDF5 File Format Specification, "Format Signature"), or empty.
std::string not_a_pickle(const std::string& path);

}  // namespace oomflight::cli
