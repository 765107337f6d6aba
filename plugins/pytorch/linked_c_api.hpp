// A CApiTable of the liboomflight this program links (tests and benchmarks). The torch extension never uses it:
// it gets its table from the Python package (ctypes), so that it needs no oomflight header or link line.
#pragma once

#include "oomflight/oomflight.h"
#include "trace_tracker.hpp"

namespace oomflight::torch_plugin {

inline CApiTable linked_c_api() {
  CApiTable api;
  api.abi_version = &oomflight_abi_version;
  api.record = &oomflight_record;
  // The mirrored structs have oomflight.h's layouts (static_asserts in tests/pytorch/trace_tracker_test.cpp).
  api.set_memory = reinterpret_cast<int (*)(int, const abi::Memory*)>(&oomflight_set_memory);
  api.request_dump = reinterpret_cast<int (*)(const abi::DumpRequest*, abi::DumpResult*)>(&oomflight_request_dump);
  api.log = &oomflight_log;
  api.intern_stack = reinterpret_cast<int (*)(const abi::Frame*, std::size_t, std::int32_t*)>(&oomflight_intern_stack);
  api.set_stack_resolver = &oomflight_set_stack_resolver;
  return api;
}

}  // namespace oomflight::torch_plugin
