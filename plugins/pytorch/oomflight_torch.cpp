// oomflight's PyTorch extension: attaches a TraceTracker (trace_tracker.hpp) to the CUDA caching allocator's
// trace-tracker and out-of-memory-observer hooks. Built by the Python package with torch.utils.cpp_extension
// against the user's own torch (oomflight/_extension.py), loaded by oomflight.torch.install(). Every entry point
// catches everything and returns a message instead: a failure here must leave training untouched.
//
// Hooks (c10/cuda/CUDACachingAllocator.h, torch 2.4 .. 2.11): attachAllocatorTraceTracker calls the tracker for
// every TraceEntry with the device's allocator mutex held; it must be attached after CUDA is initialised (an
// allocator not yet initialised drops it silently), cannot be detached, and the cudaMallocAsync backend throws on
// it. attachOutOfMemoryObserver is called after the OOM entry, mutex released, before OutOfMemoryError is thrown.
#include <torch/extension.h>

#include <c10/cuda/CUDACachingAllocator.h>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "trace_tracker.hpp"

namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;
using oomflight::torch_plugin::CApiTable;
using oomflight::torch_plugin::ExactStats;
using oomflight::torch_plugin::TraceTracker;

// Attached once and never detached (torch cannot detach): the tracker lives until the process ends.
TraceTracker* g_tracker = nullptr;

// PyTorch's format_size, so that the archive's reason reads like torch's own OutOfMemoryError.
std::string format_size(std::uint64_t bytes) {
  char text[64];
  if (bytes <= 1024) {
    std::snprintf(text, sizeof text, "%" PRIu64 " bytes", bytes);
  } else if (bytes <= 1048576) {
    std::snprintf(text, sizeof text, "%.2f KiB", bytes / 1024.0);
  } else if (bytes <= 1073741824ull) {
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / 1048576.0);
  } else {
    std::snprintf(text, sizeof text, "%.2f GiB", bytes / 1073741824.0);
  }
  return text;
}

template <typename Function>
Function* function_at(const std::map<std::string, std::uint64_t>& addresses, const char* name) {
  const auto it = addresses.find(name);
  if (it == addresses.end() || it->second == 0) return nullptr;
  return reinterpret_cast<Function*>(static_cast<std::uintptr_t>(it->second));
}

// Torch's exact figures for a device; only where the allocator mutex is not held (the observer).
bool exact_stats(int device, ExactStats& out) {
  try {
    const auto stats = alloc::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    constexpr std::size_t kAggregate = 0;  // StatType::AGGREGATE
    out.allocated = stats.allocated_bytes[kAggregate].current;
    out.reserved = stats.reserved_bytes[kAggregate].current;
    out.peak_allocated = stats.allocated_bytes[kAggregate].peak;
    out.peak_reserved = stats.reserved_bytes[kAggregate].peak;
    return true;
  } catch (...) {
    return false;
  }
}

// addresses: C API function name -> address (ctypes); seeds: (device, allocated, reserved, capacity) per device.
// Returns "" once attached, else why not (nothing is attached then).
std::string attach(const std::map<std::string, std::uint64_t>& addresses,
                   const std::vector<std::tuple<int, std::int64_t, std::int64_t, std::uint64_t>>& seeds) {
  try {
    if (g_tracker != nullptr) return "";  // attached already: hooks cannot be detached, never attach twice
    CApiTable api;
    api.abi_version = function_at<int()>(addresses, "oomflight_abi_version");
    api.record = function_at<int(int, int, std::uint64_t, std::uint64_t, std::uint64_t, std::int32_t)>(
        addresses, "oomflight_record");
    api.set_memory = function_at<int(int, const oomflight::torch_plugin::abi::Memory*)>(addresses,
                                                                                          "oomflight_set_memory");
    api.request_dump = function_at<int(const oomflight::torch_plugin::abi::DumpRequest*,
                                       oomflight::torch_plugin::abi::DumpResult*)>(addresses,
                                                                                   "oomflight_request_dump");
    api.log = function_at<int(int, const char*)>(addresses, "oomflight_log");
    if (!api.complete()) return "the oomflight C API table is incomplete (an older liboomflight?)";
    if (api.abi_version() != oomflight::torch_plugin::abi::kVersion) {
      return "liboomflight's C ABI version " + std::to_string(api.abi_version()) + " is not the plugin's " +
             std::to_string(oomflight::torch_plugin::abi::kVersion);
    }
    if (alloc::get() == nullptr) return "the CUDA caching allocator is not initialised (call after CUDA init)";
    auto tracker = std::make_unique<TraceTracker>(api);
    for (const auto& [device, allocated, reserved, capacity] : seeds) {
      tracker->seed(device, allocated, reserved, capacity);
    }
    TraceTracker* t = tracker.get();
    // Throws for the cudaMallocAsync backend (c10::Error): reported, nothing attached.
    alloc::attachAllocatorTraceTracker([t](const auto& entry) { t->on_entry(entry); });
    g_tracker = tracker.release();
    alloc::attachOutOfMemoryObserver(
        [t](int64_t device, size_t alloc_bytes, size_t device_total, size_t device_free) {
          ExactStats exact;
          const bool have_exact = exact_stats(static_cast<int>(device), exact);
          std::string reason;
          try {
            reason = "CUDA out of memory. Tried to allocate " + format_size(alloc_bytes) + ". GPU " +
                     std::to_string(device) + " has a total capacity of " + format_size(device_total) +
                     " of which " + format_size(device_free) + " is free.";
          } catch (...) {
          }
          t->on_out_of_memory(static_cast<int>(device), alloc_bytes, device_total, device_free,
                              have_exact ? &exact : nullptr, reason.c_str());
        });
    return "";
  } catch (const std::exception& e) {
    return std::string("cannot attach to the CUDA caching allocator: ") + e.what();
  } catch (...) {
    return "cannot attach to the CUDA caching allocator: unknown error";
  }
}

std::map<std::string, std::uint64_t> counters() {
  if (g_tracker == nullptr) return {};
  return {{"forwarded", g_tracker->forwarded()},
          {"unmapped", g_tracker->unmapped()},
          {"not_recorded", g_tracker->not_recorded()},
          {"observer_dumps", g_tracker->observer_dumps()}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "oomflight's CUDA caching-allocator hooks (see oomflight.torch)";
  m.def("attach", &attach, "Attach the trace tracker and the OOM observer; returns '' or why not");
  m.def("counters", &counters, "Entries forwarded, unmapped actions, ring drops, observer dumps");
}
