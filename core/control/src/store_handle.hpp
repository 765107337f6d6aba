// The job's store as the store protocol holds it: a StoreClient that can be let go of while other threads may be in
// a call to it (internal to the control wing). The job owns its store, not oomflight (issue 39): at torch's
// destroy_process_group() oomflight stops using it at once and releases its reference, so that the store goes when
// the job lets go of it (a FileStore removes its file then, a TCPStore closes its server) and a later
// init_process_group() starts from a store of its own. Calls made after release() throw; the call in flight when it
// comes finishes, and the last one out destroys the client (for the C API's store: its `release` function).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "oomflight/control/store_client.hpp"

namespace oomflight {

class StoreHandle final : public StoreClient {
 public:
  /// Owns `inner` until release() (or its own destruction).
  explicit StoreHandle(std::unique_ptr<StoreClient> inner) : inner_(std::move(inner)) {}
  /// Destroys the client if release() has not (no call may be in flight: its owner is going).
  ~StoreHandle() override = default;
  StoreHandle(const StoreHandle&) = delete;
  StoreHandle& operator=(const StoreHandle&) = delete;

  /// As StoreClient's; after release() each throws std::runtime_error naming the key and why the store was let go.
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;

  /// Lets go of the store: no call starts after this, and the client is destroyed now, or by the last call in
  /// flight as it returns (never by a thread that waits for another). `why` ends every later call's error.
  /// Thread-safe; idempotent (the first `why` stays). Never throws.
  void release(const std::string& why) noexcept;

  /// Whether release() has been called. Thread-safe.
  bool released() const;

 private:
  // One call to the client: counted in flight, refused once released; the last one out after release() destroys
  // the client.
  class Call {
   public:
    Call(StoreHandle& handle, const std::string& key);
    ~Call();
    StoreClient& client() { return *client_; }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    StoreHandle& handle_;
    StoreClient* client_ = nullptr;
  };

  mutable std::mutex mutex_;
  int in_flight_ = 0;
  bool released_ = false;
  std::string why_;
  std::unique_ptr<StoreClient> inner_;
};

}  // namespace oomflight
