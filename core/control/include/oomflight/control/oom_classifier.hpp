// Is this error an out-of-memory error, and from which runtime? For framework hooks that see an exception's
// type name and message (PyTorch, TensorFlow, JAX) and for native code that sees an error string.
#pragma once

#include <string_view>

#include "oomflight/api.h"

namespace oomflight {

/// Which kind of out-of-memory error, most specific first.
enum class OomKind {
  none,            ///< not an out-of-memory error
  torch,           ///< torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
  xla,             ///< TensorFlow/JAX/XLA ResourceExhaustedError or a RESOURCE_EXHAUSTED status
  cuda,            ///< cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
  hip,             ///< hipErrorOutOfMemory / "HIP out of memory"
  nccl,            ///< NCCL's "Cuda failure 'out of memory'"
  host,            ///< std::bad_alloc: host memory
  message,         ///< only the message says so ("out of memory", "failed to allocate", ...)
};

/// Short lower-case name of the kind ("torch", "xla", ..., "none").
OOMFLIGHT_API std::string_view oom_kind_name(OomKind kind);

/// Classifies an error from its type name (fully qualified or not, may be empty) and its message (may be
/// empty). Pure function of its arguments: thread-safe, no allocation beyond a lower-cased copy of the message.
/// The rules are a table in oom_classifier.cpp, checked most specific first; message patterns are
/// case-insensitive.
OOMFLIGHT_API OomKind classify_oom(std::string_view type_name, std::string_view message);

}  // namespace oomflight
