// A rank's context (context_log.hpp).
#include "oomflight/record/context_log.hpp"

#include "oomflight/base/redact.hpp"

namespace oomflight {

void ContextLog::set_environment(std::vector<ContextEntry> entries) {
  for (auto& e : entries) {
    e.kind = ContextEntry::Kind::environment;
    e.value = redacted(e.key, e.value);
  }
  const std::lock_guard lock(mutex_);
  environment_ = std::move(entries);
}

void ContextLog::set_metadata(std::string_view key, std::string_view value, std::int64_t batch) {
  ContextEntry e{ContextEntry::Kind::metadata, batch, std::string(key), redacted(key, value)};
  const std::lock_guard lock(mutex_);
  metadata_.push_back(std::move(e));
  if (metadata_.size() > max_metadata_) {
    metadata_.pop_front();
    ++dropped_;
  }
}

std::vector<ContextEntry> ContextLog::copy() const {
  const std::lock_guard lock(mutex_);
  std::vector<ContextEntry> out(environment_);
  out.insert(out.end(), metadata_.begin(), metadata_.end());
  return out;
}

std::uint64_t ContextLog::dropped() const {
  const std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace oomflight
