// A rank's context as every rendering shows it: the metadata its job set and where it ran.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "oomflight/format/archive_reader.hpp"

namespace oomflight {

struct RankContext {
  std::vector<std::pair<std::string, std::string>> metadata;  ///< the newest value of each key, in the order first set
  std::string host;                                           ///< the environment's host ("" when not captured)
  std::string command;                                        ///< the environment's command_line
};

/// The context of `rank` from /context (empty for an archive without it). Pure.
RankContext rank_context(const Archive& a, int rank);

}  // namespace oomflight
