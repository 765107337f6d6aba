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
    processes_ = symbol<ProcessesFn>(library_, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (processes_ == nullptr) processes_ = symbol<ProcessesFn>(library_, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (init == nullptr || count_ == nullptr || handle_ == nullptr || processes_ == nullptr) {
      why_unknown_ = "libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v2 (a driver before CUDA 11)";
      return;
    }
    if (const int rc = init(); rc != kNvmlSuccess) {
      why_unknown_ = fmt::format("nvmlInit_v2 failed (NVML error {})", rc);
      return;
    }
    initialised_ = true;
    buffer_.resize(64);
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
  unsigned int devices = 0;
  if (count_(&devices) != kNvmlSuccess) return std::nullopt;
  const auto me = static_cast<unsigned int>(getpid());
  std::uint64_t total = 0;
  bool listed = false;
  for (unsigned int d = 0; d < devices; ++d) {
    Device device = nullptr;
    if (handle_(d, &device) != kNvmlSuccess) continue;  // a GPU NVML may not touch (no permission): not ours to count
    unsigned int n = static_cast<unsigned int>(buffer_.size());
    int rc = processes_(device, &n, buffer_.data());
    if (rc == kNvmlErrorInsufficientSize && n <= kMostProcesses) {
      try {
        buffer_.resize(n + 16);  // processes may start between the two calls
      } catch (...) {
        return std::nullopt;
      }
      n = static_cast<unsigned int>(buffer_.size());
      rc = processes_(device, &n, buffer_.data());
    }
    if (rc != kNvmlSuccess) continue;
    for (unsigned int i = 0; i < n && i < buffer_.size(); ++i) {
      if (buffer_[i].pid != me) continue;
      if (buffer_[i].used_gpu_memory == kNvmlValueNotAvailable) return std::nullopt;
      total += buffer_[i].used_gpu_memory;
      listed = true;
    }
  }
  if (!listed) return std::nullopt;
  return total;
}

}  // namespace oomflight
