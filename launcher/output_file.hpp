// Files the commands write for people and other tools (exports, the HTML report): whole or not at all.
#pragma once

#include <string>
#include <string_view>

namespace oomflight::cli {

/// Writes `bytes` to PATH.tmp, then renames it to `path`, so that no reader ever opens half a file (and an
/// earlier file of that name stays whole when this one cannot be written). Returns "" on success, else an error
/// naming `what`, `path`, the step and the errno text ("cannot write the Perfetto trace to x.json: No space
/// left on device (writing x.json.tmp)"). A full disk is caught at the flush as well as at the write.
std::string write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what);

}  // namespace oomflight::cli
