#include "process_device_memory.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <fmt/format.h>

namespace oomflight {
namespace {

// NVML's documented constants (nvml.h).
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlErrorInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
// The most processes one GPU lists that are read: a node's GPU with more is not a training job's.
constexpr unsigned int kMostProcesses = 4096;
// Room for each entry the driver writes: a driver whose entries are larger than the 24 bytes read (see the
// constructor) must not write past the buffer; the entries are then read at the wrong stride and the process not
// found (unknown), never memory that is not ours.
constexpr std::size_t kSlack = 2;

template <typename Fn>
Fn symbol(void* library, const char* name) {
  return reinterpret_cast<Fn>(dlsym(library, name));
}

}  // namespace

ProcessDeviceMemory::ProcessDeviceMemory() noexcept {
  try {
    library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) {
      const char* error = dlerror();
      why_unknown_ = fmt::format("libnvidia-ml.so.1 could not be loaded ({})", error ? error : "no reason given");
      return;
    }
    const auto init = symbol<InitFn>(library_, "nvmlInit_v2");
    shutdown_ = symbol<InitFn>(library_, "nvmlShutdown");
    count_ = symbol<CountFn>(library_, "nvmlDeviceGetCount_v2");
    handle_ = symbol<HandleFn>(library_, "nvmlDeviceGetHandleByIndex_v2");
    // _v2 first: its entries are nvmlProcessInfo_v2_t (24 bytes) on every driver that has it, while some 535
    // drivers' _v3 writes 32-byte entries (with usedGpuCcProtectedMemory) into the same call.
    processes_ = symbol<ProcessesFn>(library_, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (processes_ == nullptr) processes_ = symbol<ProcessesFn>(library_, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (init == nullptr || count_ == nullptr || handle_ == nullptr || processes_ == nullptr) {
      why_unknown_ = "libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v2 (a driver before CUDA 11)";
      return;
    }
    if (const int rc = init(); rc != kNvmlSuccess) {
      why_unknown_ = fmt::format("nvmlInit_v2 failed (NVML error {})", rc);
      return;
    }
    initialised_ = true;
    buffer_.resize(64 * kSlack);
  } catch (...) {
    why_unknown_ = "out of memory while loading NVML";
    initialised_ = false;
  }
}

ProcessDeviceMemory::~ProcessDeviceMemory() {
  if (initialised_ && shutdown_ != nullptr) (void)shutdown_();
}

std::optional<std::uint64_t> ProcessDeviceMemory::used_bytes() noexcept {
  if (!initialised_) return std::nullopt;
  std::vector<unsigned int> asked;
  try {
    if (listed_on_.empty() || calls_++ % 32 == 0) {
      unsigned int devices = 0;
      if (count_(&devices) != kNvmlSuccess) return std::nullopt;
      for (unsigned int d = 0; d < devices && d < 1024; ++d) asked.push_back(d);
    } else {
      asked = listed_on_;
    }
    listed_on_.clear();
    listed_on_.reserve(asked.size());
  } catch (...) {
    return std::nullopt;
  }
  const auto me = static_cast<unsigned int>(getpid());
  std::uint64_t total = 0;
  bool listed = false;
  for (const unsigned int d : asked) {
    Device device = nullptr;
    if (handle_(d, &device) != kNvmlSuccess) continue;  // a GPU NVML may not touch (no permission): not ours to count
    unsigned int n = static_cast<unsigned int>(buffer_.size() / kSlack);
    int rc = processes_(device, &n, buffer_.data());
    if (rc == kNvmlErrorInsufficientSize && n <= kMostProcesses) {
      try {
        buffer_.resize((n + 16) * kSlack);  // processes may start between the two calls
      } catch (...) {
        return std::nullopt;
      }
      n = static_cast<unsigned int>(buffer_.size() / kSlack);
      rc = processes_(device, &n, buffer_.data());
    }
    if (rc != kNvmlSuccess) continue;
    for (unsigned int i = 0; i < n && i < buffer_.size() / kSlack; ++i) {
      if (buffer_[i].pid != me) continue;
      if (buffer_[i].used_gpu_memory == kNvmlValueNotAvailable) return std::nullopt;
      total += buffer_[i].used_gpu_memory;
      listed = true;
      listed_on_.push_back(d);  // reserved above: no allocation
    }
  }
  if (!listed) return std::nullopt;
  return total;
}

}  // namespace oomflight
