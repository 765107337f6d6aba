// parse_oom_message: the figures of PyTorch's CUDA out-of-memory message, exactly as torch's format_size wrote them.
#include <gtest/gtest.h>

#include <string>

#include "oomflight/control/oom_message.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;
constexpr std::uint64_t kMiB = 1ull << 20;

// Two decimals of a unit, as torch prints them: what reading them back gives.
std::uint64_t rounded(double value, std::uint64_t unit) { return static_cast<std::uint64_t>(value * unit + 0.5); }

TEST(OomMessage, TorchsMessageWithAPerProcessCap) {
  // torch 2.11's wording (c10/cuda/CUDACachingAllocator.cpp), under set_per_process_memory_fraction on an H200.
  const std::string message =
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
      "139.80 GiB of which 133.65 GiB is free. Including non-PyTorch memory, this process has 6.14 GiB memory in "
      "use. 4.00 GiB allowed; Of the allocated memory 3.50 GiB is allocated by PyTorch, and 20.00 MiB is reserved "
      "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
      "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";
  const OomMessageFigures f = parse_oom_message(message);
  EXPECT_EQ(f.requested_bytes, 2 * kGiB);
  EXPECT_EQ(f.device_capacity_bytes, rounded(139.80, kGiB));
  EXPECT_EQ(f.device_free_bytes, rounded(133.65, kGiB));
  EXPECT_EQ(f.memory_cap_bytes, 4 * kGiB);
}

TEST(OomMessage, WithoutACapAndInEveryUnit) {
  const OomMessageFigures f = parse_oom_message(
      "CUDA out of memory. Tried to allocate 512 bytes. GPU 3 has a total capacity of 79.19 GiB of which 17.06 MiB "
      "is free. Process 4242 has 79.17 GiB memory in use. Of the allocated memory 1.50 KiB is allocated by PyTorch");
  EXPECT_EQ(f.requested_bytes, 512u);
  EXPECT_EQ(f.device_capacity_bytes, rounded(79.19, kGiB));
  EXPECT_EQ(f.device_free_bytes, rounded(17.06, kMiB));
  EXPECT_FALSE(f.memory_cap_bytes.has_value());
}

TEST(OomMessage, OtherTextStatesNothing) {
  for (const char* text : {"", "RuntimeError: CUDA error: out of memory", "Tried to allocate 2.00 GiB",
                           "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 bytes.",
                           "CUDA out of memory. Tried to allocate lots. GPU 0 has a total capacity of many GiB",
                           "CUDA out of memory. Tried to allocate 99999999999999999999999.00 GiB."}) {
    const OomMessageFigures f = parse_oom_message(text);
    EXPECT_FALSE(f.requested_bytes || f.device_capacity_bytes || f.device_free_bytes || f.memory_cap_bytes) << text;
  }
}

TEST(OomMessage, ACutMessageGivesWhatItStill) {
  // The archive's reason field holds 255 bytes: a message cut there keeps its first figures.
  const OomMessageFigures f =
      parse_oom_message("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 15.77 Gi");
  EXPECT_EQ(f.requested_bytes, 20 * kMiB);
  EXPECT_FALSE(f.device_capacity_bytes.has_value());
  EXPECT_FALSE(f.device_free_bytes.has_value());
}

}  // namespace
}  // namespace oomflight
