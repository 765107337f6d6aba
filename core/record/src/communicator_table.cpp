#include "oomflight/record/communicator_table.hpp"

#include <algorithm>

namespace oomflight {

void CommunicatorTable::add(CommunicatorInfo info) {
  if (info.name.size() > kMaxNameBytes) info.name.resize(kMaxNameBytes);
  const std::lock_guard lock(mutex_);
  std::erase_if(entries_, [&](const CommunicatorInfo& e) { return e.comm_id == info.comm_id; });
  entries_.push_back(std::move(info));
  while (entries_.size() > kMaxCommunicators) entries_.pop_front();
}

std::vector<CommunicatorInfo> CommunicatorTable::copy() const {
  const std::lock_guard lock(mutex_);
  return {entries_.begin(), entries_.end()};
}

}  // namespace oomflight
