// Pairing and judging collectives: see collectives.hpp.
#include "oomflight/analysis/collectives.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/units.hpp"

namespace oomflight {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

// The operation a record describes, with neither time set.
RankOperation operation_of(const CollectiveRow& r) {
  RankOperation op;
  op.comm_id = r.comm_id;
  op.seq = r.seq;
  op.op = r.op;
  op.datatype = r.datatype;
  op.count = r.count;
  op.bytes = r.bytes;
  op.peer = r.peer;
  op.batch = r.batch;
  return op;
}

// One rank's records paired by (communicator, operation, sequence number): NCCL numbers each function separately
// per communicator (ncclComm's seqNumber[func]), so allreduce #3 and broadcast #3 are two operations. A later start
// of the same key (a source that restarted its numbering) opens a new operation.
std::vector<RankOperation> pair_records(std::span<const CollectiveRow> rows) {
  std::vector<RankOperation> ops;
  std::map<std::tuple<std::uint64_t, CollectiveOp, std::uint64_t>, std::size_t> open;  // key -> index, until its end
  for (const CollectiveRow& r : rows) {
    const auto key = std::make_tuple(r.comm_id, r.op, r.seq);
    if (r.phase == CollectivePhase::start) {
      RankOperation op = operation_of(r);
      op.start_t_ns = r.t_ns;
      open[key] = ops.size();
      ops.push_back(op);
      continue;
    }
    const bool device = (r.flags & kCollectiveDeviceCompletion) != 0;
    auto it = open.find(key);
    if (it == open.end()) {
      // An end whose start was overwritten, or a second end (the device's after the host's) of a known operation.
      const auto done = std::find_if(ops.rbegin(), ops.rend(), [&](const RankOperation& o) {
        return o.comm_id == r.comm_id && o.op == r.op && o.seq == r.seq;
      });
      if (done != ops.rend()) {
        if (device && !done->device_completion) {
          done->end_t_ns = r.t_ns;
          done->device_completion = true;
        }
        continue;
      }
      RankOperation op = operation_of(r);
      op.end_t_ns = r.t_ns;
      op.device_completion = device;
      ops.push_back(op);
      continue;
    }
    RankOperation& op = ops[it->second];
    op.end_t_ns = r.t_ns;
    op.device_completion = device;
    open.erase(it);
  }
  return ops;
}

}  // namespace

CollectiveAnalysis analyze_collectives(const Archive& a) {
  CollectiveAnalysis out;
  // One verdict per (communicator, operation): each operation has its own sequence numbers.
  std::map<std::pair<std::uint64_t, CollectiveOp>, CommunicatorVerdict> series;
  std::map<std::uint64_t, std::vector<int>> members;  // communicator -> ranks that registered it or recorded on it
  for (const RankRow& row : a.ranks) {
    RankCollectiveState s;
    s.rank = row.rank;
    s.is_origin = row.is_origin != 0;
    s.batch = row.batch;
    s.freeze_t_ns = row.freeze_t_ns;
    s.operations = pair_records(a.collectives_of(row.rank));
    for (int i = 0; i < static_cast<int>(s.operations.size()); ++i) {
      const RankOperation& op = s.operations[static_cast<std::size_t>(i)];
      if (op.finished()) {
        if (s.last_finished < 0 || op.end_t_ns >= s.operations[static_cast<std::size_t>(s.last_finished)].end_t_ns) {
          s.last_finished = i;
        }
      } else {
        s.in_flight = i;  // oldest first: the last one not finished is the newest
      }
      CommunicatorVerdict& v = series[{op.comm_id, op.op}];
      v.comm_id = op.comm_id;
      v.op = op.op;
      members[op.comm_id].push_back(row.rank);
    }
    out.ranks.push_back(std::move(s));
  }
  for (const CommunicatorRow& c : a.communicators) {
    if (members.contains(c.comm_id)) members[c.comm_id].push_back(c.rank);
  }
  std::stable_sort(out.ranks.begin(), out.ranks.end(), [](const auto& x, const auto& y) { return x.rank < y.rank; });
  // Members are ranks of /ranks (the reader checks every row's rank), so each has a state.
  const auto state_of = [&](int rank) -> const RankCollectiveState& { return *out.rank_state(rank); };
  for (auto& [key, v] : series) {
    for (const CommunicatorRow& c : a.communicators) {
      if (c.comm_id == v.comm_id) {
        v.name = fixed_string(c.name);
        v.size = c.comm_size;
      }
    }
    v.members = members[v.comm_id];
    std::sort(v.members.begin(), v.members.end());
    v.members.erase(std::unique(v.members.begin(), v.members.end()), v.members.end());
    // The frontier: the highest sequence number of this operation any member entered.
    for (const int rank : v.members) {
      for (const RankOperation& op : state_of(rank).operations) {
        if (op.comm_id == v.comm_id && op.op == v.op && op.seq >= v.seq) {
          v.seq = op.seq;
          v.bytes = op.bytes;
        }
      }
    }
    for (const int rank : v.members) {
      const RankCollectiveState& s = state_of(rank);
      std::int64_t newest = -1;
      const RankOperation* at_frontier = nullptr;
      for (const RankOperation& op : s.operations) {
        if (op.comm_id != v.comm_id || op.op != v.op) continue;
        newest = std::max(newest, static_cast<std::int64_t>(op.seq));
        if (op.seq == v.seq) at_frontier = &op;
      }
      v.newest_seq.push_back(newest);
      if (at_frontier != nullptr) {
        (at_frontier->finished() ? v.finished : v.waiting).push_back(rank);
        continue;
      }
      (newest + 1 == static_cast<std::int64_t>(v.seq) ? v.short_of_it : v.behind).push_back(rank);
      // Short of this operation because it waits in another one on the same communicator: the ranks disagree.
      if (s.in_flight >= 0) {
        const RankOperation& other = s.operations[static_cast<std::size_t>(s.in_flight)];
        if (other.comm_id == v.comm_id && other.op != v.op) v.different_op.push_back(rank);
      }
    }
    out.communicators.push_back(std::move(v));
  }
  return out;
}

const RankCollectiveState* CollectiveAnalysis::rank_state(int rank) const {
  const auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                                   [](const RankCollectiveState& s, int r) { return s.rank < r; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

std::string communicator_label(const CommunicatorVerdict& v) {
  if (v.name == "world") return "the world communicator";
  if (!v.name.empty()) return fmt::format("communicator '{}'", v.name);
  return fmt::format("communicator {:#x}", v.comm_id);
}

std::string describe_operation(const RankOperation& op) {
  return fmt::format("{} #{} ({})", collective_op_name(op.op), op.seq, format_bytes(op.bytes));
}

std::vector<std::string> describe_verdict(const Archive& a, const CollectiveAnalysis& analysis,
                                          const CommunicatorVerdict& v) {
  std::vector<std::string> lines;
  if (v.waiting.empty() && v.short_of_it.empty() && v.behind.empty()) return lines;
  const auto state = [&](int rank) -> const RankCollectiveState& { return *analysis.rank_state(rank); };
  const std::string what = fmt::format("{} #{} on {} ({}{})", collective_op_name(v.op), v.seq, communicator_label(v),
                                       v.size > 0 ? fmt::format("{} ranks; ", v.size) : "", format_bytes(v.bytes));
  std::vector<int> missing_origins, missing_others;
  for (const auto* group : {&v.short_of_it, &v.behind}) {
    for (const int rank : *group) (state(rank).is_origin ? missing_origins : missing_others).push_back(rank);
  }
  std::sort(missing_origins.begin(), missing_origins.end());
  std::sort(missing_others.begin(), missing_others.end());
  const bool oom = a.header.kind == "oom";
  std::string first;
  if (!v.waiting.empty()) {
    first = fmt::format("{} {} in {}", ranks_text(v.waiting), v.waiting.size() == 1 ? "waits" : "wait", what);
  } else {
    first = fmt::format("{} finished {}", ranks_text(v.finished), what);
  }
  if (!missing_origins.empty()) {
    std::vector<std::string> why;
    for (const int rank : missing_origins) {
      why.push_back(fmt::format("{} in batch {}", oom ? "ran out of memory" : "asked for the dump", state(rank).batch));
    }
    std::sort(why.begin(), why.end());
    why.erase(std::unique(why.begin(), why.end()), why.end());
    first += fmt::format(", which {} never entered: {} {}", ranks_text(missing_origins),
                         missing_origins.size() == 1 ? "it" : "they", fmt::join(why, "; "));
  } else if (!missing_others.empty() && !v.waiting.empty()) {
    first += fmt::format(", which {} had not entered", ranks_text(missing_others));
  }
  lines.push_back(first);
  for (const int rank : missing_others) {
    const RankCollectiveState& s = state(rank);
    const std::int64_t newest = v.newest_seq[static_cast<std::size_t>(
        std::lower_bound(v.members.begin(), v.members.end(), rank) - v.members.begin())];  // members ascend
    const auto short_by = static_cast<std::int64_t>(v.seq) - newest;
    std::string last = "none";
    for (auto it = s.operations.rbegin(); it != s.operations.rend(); ++it) {
      if (it->comm_id == v.comm_id && it->finished()) {
        last = fmt::format("{} in batch {}", describe_operation(*it), it->batch);
        break;
      }
    }
    const RankOperation* waits = s.in_flight >= 0 ? &s.operations[static_cast<std::size_t>(s.in_flight)] : nullptr;
    if (waits != nullptr && waits->comm_id == v.comm_id && waits->op != v.op) {
      lines.push_back(fmt::format("rank {} never entered it: it waits in {} on the same communicator instead (the "
                                  "ranks are in different operations)",
                                  rank, describe_operation(*waits)));
    } else if (waits != nullptr && waits->comm_id == v.comm_id) {
      lines.push_back(fmt::format("rank {} is {} behind: it waits in {}", rank,
                                  short_by == 1 ? "one operation" : fmt::format("{} operations", short_by),
                                  describe_operation(*waits)));
    } else if (short_by <= 1) {
      lines.push_back(fmt::format("rank {} had not reached it yet: still computing batch {} (its last finished "
                                  "operation on it: {})",
                                  rank, s.batch, last));
    } else {
      lines.push_back(fmt::format("rank {} is {} operations behind, still computing batch {} (its last finished "
                                  "operation on it: {})",
                                  rank, newest < 0 ? fmt::format("{} (it entered none)", short_by) : std::to_string(short_by),
                                  s.batch, last));
    }
  }
  return lines;
}

}  // namespace oomflight
