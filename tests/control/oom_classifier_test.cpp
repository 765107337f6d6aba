// The out-of-memory classifier, table-driven.
#include <gtest/gtest.h>

#include "oomflight/control/oom_classifier.hpp"

namespace oomflight {
namespace {

struct Case {
  const char* type;
  const char* message;
  OomKind expected;
};

const Case kCases[] = {
    {"torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", OomKind::torch},
    {"torch.cuda.OutOfMemoryError", "", OomKind::torch},
    {"OutOfMemoryError", "", OomKind::torch},
    {"tensorflow.python.framework.errors_impl.ResourceExhaustedError", "OOM when allocating tensor", OomKind::xla},
    {"jaxlib.xla_extension.XlaRuntimeError", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate",
     OomKind::xla},
    {"RuntimeError", "CUDA error: cudaErrorMemoryAllocation", OomKind::cuda},
    {"", "CUDA_ERROR_OUT_OF_MEMORY: out of memory", OomKind::cuda},
    {"RuntimeError", "HIP out of memory. Tried to allocate 20.00 MiB", OomKind::hip},
    {"", "hipErrorOutOfMemory", OomKind::hip},
    {"torch.distributed.DistBackendError",
     "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.19.3\nCuda failure 'out of "
     "memory'",
     OomKind::nccl},
    {"std::bad_alloc", "std::bad_alloc", OomKind::host},
    {"MemoryError", "", OomKind::host},
    {"builtins.MemoryError", "cannot allocate pinned memory", OomKind::host},
    {"RuntimeError", "Failed to allocate 1073741824 bytes", OomKind::message},
    {"RuntimeError", "cuBLAS allocation failed", OomKind::message},
    {"Error", "Resource exhausted: OOM", OomKind::message},
    {"RuntimeError", "DefaultCPUAllocator: not enough memory: you tried to allocate ... out of memory", OomKind::message},
    // Not out of memory:
    {"RuntimeError", "CUDA error: an illegal memory access was encountered", OomKind::none},
    {"ValueError", "Expected input batch_size (32) to match target batch_size (16)", OomKind::none},
    {"torch.distributed.DistBackendError", "NCCL communicator was aborted on rank 3", OomKind::none},
    {"", "", OomKind::none},
};

TEST(OomClassifier, Table) {
  for (const auto& c : kCases) {
    EXPECT_EQ(classify_oom(c.type, c.message), c.expected)
        << "type '" << c.type << "' message '" << c.message << "' gave " << oom_kind_name(classify_oom(c.type, c.message));
  }
}

}  // namespace
}  // namespace oomflight
