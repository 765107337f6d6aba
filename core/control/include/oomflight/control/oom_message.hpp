// The figures an out-of-memory message states. When no allocator hook saw the failure (a CPU job, a hook that
// could not attach), the error's own message is all oomflight has: PyTorch's caching allocator writes the request,
// the device's capacity and free memory, and a per-process cap into it (c10/cuda/CUDACachingAllocator.cpp, the
// same wording from torch 2.1 to 2.11):
//   "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 GiB is
//    free. Process 1234 has 77.95 GiB memory in use. 4.00 GiB allowed; Of the allocated memory ..."
// ("N allowed; " only under torch.cuda.set_per_process_memory_fraction). Before issue 30 such an error was logged
// and archived as "requested 0 B, 0 B free" while its message said "Tried to allocate 2.00 GiB".
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// What a message states; a figure it does not state is empty. Bytes, as torch's format_size printed them: sizes
/// up to 1024 bytes exactly ("512 bytes"), larger ones to two decimals of KiB, MiB or GiB, so a figure read back
/// is within half a hundredth of its unit of the allocator's.
struct OomMessageFigures {
  std::optional<std::uint64_t> requested_bytes;        ///< "Tried to allocate X"
  std::optional<std::uint64_t> device_capacity_bytes;  ///< "has a total capacity of X"
  std::optional<std::uint64_t> device_free_bytes;      ///< "of which X is free"
  std::optional<std::uint64_t> memory_cap_bytes;       ///< "X allowed; " (the per-process memory fraction)
};

/// Reads the figures of PyTorch's CUDA out-of-memory message (above) from `message`; any other text gives none.
/// Never throws; linear in message.size(); a number too large for 64 bits is not a figure. Pure; thread-safe.
OOMFLIGHT_API OomMessageFigures parse_oom_message(std::string_view message) noexcept;

}  // namespace oomflight
