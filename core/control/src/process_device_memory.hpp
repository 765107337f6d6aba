// The device memory the driver counts for this process (issue 42, item 4): NVML's list of each GPU's compute
// processes, this process's usedGpuMemory summed over the node's GPUs. Less the caching allocator's reserved bytes
// it is what the process holds outside the allocator: the CUDA context, cuBLAS and cuDNN workspaces, NCCL's
// communicator buffers (10-20 GB a GPU at scale, invisible to a memory snapshot). Internal to the control wing.
//
// libnvidia-ml is loaded at run time (dlopen of libnvidia-ml.so.1, the driver's own), never linked: a machine
// without a driver runs oomflight as before, and its figure is unknown, never 0. The few NVML declarations used are
// written here from NVML's documented ABI (nvml.h is not needed to build).
//
// Thread-safety: none; one owner (the session's batch thread, under its batch lock).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oomflight {

class ProcessDeviceMemory {
 public:
  /// Loads libnvidia-ml.so.1 and initialises NVML (nvmlInit_v2: once per process, up to a second on a node whose
  /// driver was idle). On failure every later call answers unknown, and why_unknown() says why. Never throws.
  ProcessDeviceMemory() noexcept;
  /// nvmlShutdown when NVML was initialised here. The library stays loaded: a thread of another part of the process
  /// may still be inside it.
  ~ProcessDeviceMemory();
  ProcessDeviceMemory(const ProcessDeviceMemory&) = delete;
  ProcessDeviceMemory& operator=(const ProcessDeviceMemory&) = delete;

  /// This process's device memory as the driver counts it, in bytes, summed over the GPUs that list it; nothing when
  /// unknown: NVML absent, no GPU lists this process (before its CUDA context, or a PID namespace that NVML does not
  /// see into), or a GPU lists it without a figure (NVML_VALUE_NOT_AVAILABLE). Asks only the GPUs that listed the
  /// process last time, and every GPU of the node when none did and at every 32nd call (a process list can cost a
  /// millisecond a GPU). Never throws.
  std::optional<std::uint64_t> used_bytes() noexcept;

  /// Why NVML cannot be asked at all ("libnvidia-ml.so.1 could not be loaded (...)"); empty once it is loaded and
  /// initialised (used_bytes() may still answer unknown for this process).
  const std::string& why_unknown() const noexcept { return why_unknown_; }

 private:
  using Device = void*;
  struct ProcessInfo {  // nvmlProcessInfo_v2_t, the layout of the _v2 and _v3 calls
    unsigned int pid;
    unsigned long long used_gpu_memory;
    unsigned int gpu_instance_id;
    unsigned int compute_instance_id;
  };
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned int*);
  using HandleFn = int (*)(unsigned int, Device*);
  using ProcessesFn = int (*)(Device, unsigned int*, ProcessInfo*);

  void* library_ = nullptr;
  bool initialised_ = false;
  InitFn shutdown_ = nullptr;
  CountFn count_ = nullptr;
  HandleFn handle_ = nullptr;
  ProcessesFn processes_ = nullptr;
  std::vector<ProcessInfo> buffer_;
  std::vector<unsigned int> listed_on_;  // the GPUs (NVML indices) that listed this process at the last call
  unsigned int calls_ = 0;
  std::string why_unknown_;
};

}  // namespace oomflight
