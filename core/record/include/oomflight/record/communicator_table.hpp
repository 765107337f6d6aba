// The communicators a rank registered (oomflight_register_communicator): what the report needs to name a
// communicator ("world", 4 ranks) and to map a rank of it to a rank of the job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// One communicator as a rank registered it.
struct CommunicatorInfo {
  std::uint64_t comm_id = 0;
  std::string name;            ///< at most kMaxNameBytes bytes; may be empty
  std::int32_t comm_rank = 0;  ///< this rank's rank in it
  std::int32_t comm_size = 1;
};

/// Bounded table of CommunicatorInfo, newest kept. Thread-safety: every member takes the table's mutex.
class OOMFLIGHT_API CommunicatorTable {
 public:
  static constexpr std::size_t kMaxCommunicators = 4096;
  static constexpr std::size_t kMaxNameBytes = 47;
  /// Adds `info` (its name cut to kMaxNameBytes), replacing an entry of the same id; drops the oldest beyond
  /// kMaxCommunicators. Throws std::bad_alloc.
  void add(CommunicatorInfo info);
  /// Every entry, oldest first. Throws std::bad_alloc.
  std::vector<CommunicatorInfo> copy() const;

 private:
  mutable std::mutex mutex_;
  std::deque<CommunicatorInfo> entries_;
};

}  // namespace oomflight
