// A key-value store every rank reaches (internal to liboomflight; the C API's oomflight_store is its ABI-stable
// face, which the PyTorch plugin fills with the job's c10d store). The control wing's second transport runs on it
// (store_protocol.hpp) for jobs that no MPI launcher started.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace oomflight {

/// Thread-safe: the watcher thread and a failing thread call it at once. Every call is one round trip to the
/// store; none waits for a key to appear. Every failure of the store throws std::runtime_error naming the key.
class StoreClient {
 public:
  virtual ~StoreClient() = default;
  /// Sets `key` to `value` (bytes).
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// The value of `key`, or nullopt when it does not exist yet.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  /// Adds `delta` to the counter `key` (created at 0) and returns its new value; 0 reads it.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

}  // namespace oomflight
