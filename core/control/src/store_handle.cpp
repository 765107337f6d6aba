// The job's store, releasable while calls are in flight (store_handle.hpp).
#include "store_handle.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace oomflight {

StoreHandle::Call::Call(StoreHandle& handle, const std::string& key) : handle_(handle) {
  std::lock_guard lock(handle_.mutex_);
  if (handle_.released_ || !handle_.inner_) {
    throw std::runtime_error(fmt::format("the job's store is no longer used for {}: {}", key, handle_.why_));
  }
  ++handle_.in_flight_;
  client_ = handle_.inner_.get();
}

StoreHandle::Call::~Call() {
  std::unique_ptr<StoreClient> last;
  {
    std::lock_guard lock(handle_.mutex_);
    if (--handle_.in_flight_ == 0 && handle_.released_) last = std::move(handle_.inner_);
  }
  last.reset();  // outside the lock: a client's release may take a while (a socket closed, a file removed)
}

void StoreHandle::set(const std::string& key, const std::string& value) {
  Call call(*this, key);
  call.client().set(key, value);
}

std::optional<std::string> StoreHandle::get(const std::string& key) {
  Call call(*this, key);
  return call.client().get(key);
}

std::int64_t StoreHandle::add(const std::string& key, std::int64_t delta) {
  Call call(*this, key);
  return call.client().add(key, delta);
}

void StoreHandle::release(const std::string& why) noexcept {
  std::unique_ptr<StoreClient> now;
  {
    std::lock_guard lock(mutex_);
    if (released_) return;
    released_ = true;
    try {
      why_ = why;
    } catch (...) {
    }
    if (in_flight_ == 0) now = std::move(inner_);
  }
  now.reset();
}

bool StoreHandle::released() const {
  std::lock_guard lock(mutex_);
  return released_;
}

}  // namespace oomflight
