// Pairing and judging collectives: see collectives.hpp.
#include "oomflight/analysis/collectives.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/base/printable.hpp"
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
// of the same key (a source that restarted its numbering) opens a new operation. O(n log n): an end finds its
// operation through maps, never by scanning back (100k ends whose starts never came took 54 s that way).
std::vector<RankOperation> pair_records(std::span<const CollectiveRow> rows) {
  using Key = std::tuple<std::uint64_t, CollectiveOp, std::uint64_t>;
  std::vector<RankOperation> ops;
  std::map<Key, std::size_t> open;    // key -> index of its operation, until its end
  std::map<Key, std::size_t> newest;  // key -> index of the newest operation of that key, ended or not
  for (const CollectiveRow& r : rows) {
    const Key key{r.comm_id, r.op, r.seq};
    const bool untracked = (r.flags & kCollectiveUntracked) != 0;
    if (r.phase == CollectivePhase::start) {
      RankOperation op = operation_of(r);
      op.start_t_ns = r.t_ns;
      op.untracked = untracked;
      if (untracked) {
        open.erase(key);  // no end of it will come
      } else {
        open[key] = ops.size();
      }
      newest[key] = ops.size();
      ops.push_back(op);
      continue;
    }
    if (untracked) {
      // The source stopped following it: an open operation's end is not known. After an end, or for an operation
      // already untracked, it says nothing new.
      if (auto it = open.find(key); it != open.end()) {
        ops[it->second].untracked = true;
        open.erase(it);
      } else if (newest.find(key) == newest.end()) {
        RankOperation op = operation_of(r);  // its start was overwritten
        op.untracked = true;
        newest[key] = ops.size();
        ops.push_back(op);
      }
      continue;
    }
    const bool device = (r.flags & kCollectiveDeviceCompletion) != 0;
    if (auto it = open.find(key); it != open.end()) {
      RankOperation& op = ops[it->second];
      op.end_t_ns = r.t_ns;
      op.device_completion = device;
      open.erase(it);
      continue;
    }
    if (auto it = newest.find(key); it != newest.end()) {
      // A second end (the device's after the host's) of a known operation.
      RankOperation& done = ops[it->second];
      if (device && !done.device_completion && !done.untracked) {
        done.end_t_ns = r.t_ns;
        done.device_completion = true;
      }
      continue;
    }
    // An end whose start was overwritten.
    RankOperation op = operation_of(r);
    op.end_t_ns = r.t_ns;
    op.device_completion = device;
    newest[key] = ops.size();
    ops.push_back(op);
  }
  return ops;
}

// Whether the newest operation a rank entered on a communicator is untracked: then no older operation without an
// end is "the one it waits in" (it went on past it, as far as anyone knows).
bool newest_untracked(const RankCollectiveState& s, std::uint64_t comm_id) {
  const RankCollectiveState::OnCommunicator* on = s.on(comm_id);
  return on != nullptr && on->last_entered >= 0 && s.operations[static_cast<std::size_t>(on->last_entered)].untracked;
}

// Where a rank stands on one (communicator, operation): the newest sequence number it entered and the last of its
// operations with that number.
struct MemberState {
  std::int64_t newest = -1;
  int at_newest = -1;
};

}  // namespace

CollectiveAnalysis analyze_collectives(const Archive& a) {
  CollectiveAnalysis out;
  using Series = std::pair<std::uint64_t, CollectiveOp>;
  // One verdict per (communicator, operation): each operation has its own sequence numbers. Every structure below
  // is filled in one pass over the rows, so that the whole is O(n log n) in them (issue 30: per series x per member
  // x per operation scans took over a minute for 200,000 rows).
  std::map<Series, std::map<int, MemberState>> series;  // -> rank -> its standing
  std::map<std::uint64_t, std::set<int>> members;       // communicator -> ranks that recorded on it or registered it
  for (const RankRow& row : a.ranks) {
    RankCollectiveState s;
    s.rank = row.rank;
    s.is_origin = row.is_origin != 0;
    s.batch = row.batch;
    s.freeze_t_ns = row.freeze_t_ns;
    s.operations = pair_records(a.collectives_of(row.rank));
    std::map<std::uint64_t, RankCollectiveState::OnCommunicator> by_comm;
    for (int i = 0; i < static_cast<int>(s.operations.size()); ++i) {
      const RankOperation& op = s.operations[static_cast<std::size_t>(i)];
      RankCollectiveState::OnCommunicator& on = by_comm[op.comm_id];
      on.comm_id = op.comm_id;
      s.last_entered = i;
      on.last_entered = i;
      if (op.untracked) {
        ++s.untracked;
        ++on.untracked;
      } else if (op.finished()) {
        s.last_finished = i;  // oldest first: the last one with an end is the newest
        on.last_finished = i;
        if (op.device_completion) on.last_device_finished = i;
      } else {
        s.in_flight = i;  // oldest first: the last one not finished is the newest
      }
      MemberState& m = series[{op.comm_id, op.op}][row.rank];
      if (static_cast<std::int64_t>(op.seq) >= m.newest) {
        m.newest = static_cast<std::int64_t>(op.seq);
        m.at_newest = i;
      }
      members[op.comm_id].insert(row.rank);
    }
    s.by_communicator.reserve(by_comm.size());
    for (auto& [comm, on] : by_comm) s.by_communicator.push_back(on);
    out.ranks.push_back(std::move(s));
  }
  std::map<std::uint64_t, const CommunicatorRow*> registered;  // the last row of each communicator names it
  for (const CommunicatorRow& c : a.communicators) {
    if (auto it = members.find(c.comm_id); it != members.end()) {
      it->second.insert(c.rank);
      registered[c.comm_id] = &c;
    }
  }
  std::stable_sort(out.ranks.begin(), out.ranks.end(), [](const auto& x, const auto& y) { return x.rank < y.rank; });
  // Members are ranks of /ranks (the reader checks every row's rank), so each has a state.
  const auto state_of = [&](int rank) -> const RankCollectiveState& { return *out.rank_state(rank); };
  out.communicators.reserve(series.size());
  for (const auto& [key, standing] : series) {
    CommunicatorVerdict v;
    v.comm_id = key.first;
    v.op = key.second;
    if (auto it = registered.find(v.comm_id); it != registered.end()) {
      v.name = fixed_string(it->second->name);
      v.size = it->second->comm_size;
    }
    const std::set<int>& comm_members = members[v.comm_id];
    v.members.assign(comm_members.begin(), comm_members.end());
    // The frontier: the highest sequence number of this operation any member entered (its bytes: the last such
    // operation of the highest such rank).
    for (const auto& [rank, m] : standing) {
      if (m.newest >= static_cast<std::int64_t>(v.seq)) {
        v.seq = static_cast<std::uint64_t>(m.newest);
        v.bytes = state_of(rank).operations[static_cast<std::size_t>(m.at_newest)].bytes;
      }
    }
    for (const int rank : v.members) {
      const RankCollectiveState& s = state_of(rank);
      const auto it = standing.find(rank);
      const std::int64_t newest = it == standing.end() ? -1 : it->second.newest;
      v.newest_seq.push_back(newest);
      if (const RankCollectiveState::OnCommunicator* on = s.on(v.comm_id)) v.untracked += on->untracked;
      if (it != standing.end() && newest == static_cast<std::int64_t>(v.seq)) {
        const RankOperation& at_frontier = s.operations[static_cast<std::size_t>(it->second.at_newest)];
        (at_frontier.untracked ? v.entered_untracked : at_frontier.finished() ? v.finished : v.waiting).push_back(rank);
        continue;
      }
      (newest + 1 == static_cast<std::int64_t>(v.seq) ? v.short_of_it : v.behind).push_back(rank);
      // Short of this operation because it waits in another one on the same communicator: the ranks disagree.
      if (s.in_flight >= 0 && !newest_untracked(s, v.comm_id)) {
        const RankOperation& other = s.operations[static_cast<std::size_t>(s.in_flight)];
        if (other.comm_id == v.comm_id && other.op != v.op) v.different_op.push_back(rank);
      }
    }
    out.communicators.push_back(std::move(v));
  }
  return out;
}

const RankCollectiveState::OnCommunicator* RankCollectiveState::on(std::uint64_t comm_id) const {
  const auto it = std::lower_bound(by_communicator.begin(), by_communicator.end(), comm_id,
                                   [](const OnCommunicator& c, std::uint64_t id) { return c.comm_id < id; });
  return it != by_communicator.end() && it->comm_id == comm_id ? &*it : nullptr;
}

const CommunicatorVerdict* CollectiveAnalysis::communicator(std::uint64_t comm_id) const {
  const auto it = std::lower_bound(communicators.begin(), communicators.end(), comm_id,
                                   [](const CommunicatorVerdict& v, std::uint64_t id) { return v.comm_id < id; });
  return it != communicators.end() && it->comm_id == comm_id ? &*it : nullptr;
}

const RankCollectiveState* CollectiveAnalysis::rank_state(int rank) const {
  const auto it = std::lower_bound(ranks.begin(), ranks.end(), rank,
                                   [](const RankCollectiveState& s, int r) { return s.rank < r; });
  return it != ranks.end() && it->rank == rank ? &*it : nullptr;
}

std::string communicator_label(const CommunicatorVerdict& v) {
  if (v.name == "world") return "the world communicator";
  if (!v.name.empty()) return fmt::format("communicator '{}'", printable(v.name));  // NCCL's commName: the job's
  return fmt::format("communicator {:#x}", v.comm_id);
}

std::string describe_operation(const RankOperation& op) {
  return fmt::format("{} #{} ({})", collective_op_name(op.op), op.seq, format_bytes(op.bytes));
}

std::string describe_last_finished(const RankCollectiveState& s, std::uint64_t comm_id) {
  const RankCollectiveState::OnCommunicator* on = s.on(comm_id);
  if (on == nullptr || on->last_finished < 0) return "none";
  const RankOperation& last = s.operations[static_cast<std::size_t>(on->last_finished)];
  std::string text = fmt::format("{} in batch {}", describe_operation(last), last.batch);
  // A host end on a communicator that reports device ends: the call returned (the operation was enqueued), and the
  // device may not have run it yet.
  if (!last.device_completion && on->last_device_finished >= 0) {
    const RankOperation& device = s.operations[static_cast<std::size_t>(on->last_device_finished)];
    text += fmt::format(" (its host call returned; no device end reported yet; the last with a device end: {} in "
                        "batch {})",
                        describe_operation(device), device.batch);
  }
  return text;
}

std::vector<std::string> describe_verdict(const Archive& a, const CollectiveAnalysis& analysis,
                                          const CommunicatorVerdict& v) {
  std::vector<std::string> lines;
  if (v.waiting.empty() && v.short_of_it.empty() && v.behind.empty() && v.entered_untracked.empty() &&
      v.untracked == 0) {
    return lines;
  }
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
  } else if (!v.finished.empty()) {
    first = fmt::format("{} finished {}", ranks_text(v.finished), what);
  } else {
    first = fmt::format("{} entered {}, and whether {} finished it is not known (untracked)",
                        ranks_text(v.entered_untracked), what, v.entered_untracked.size() == 1 ? "it" : "they");
  }
  if (!v.entered_untracked.empty() && (!v.waiting.empty() || !v.finished.empty())) {
    first += fmt::format(" ({} entered it too, untracked)", ranks_text(v.entered_untracked));
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
    // Modulo 2^64: a hostile archive's sequence numbers can be anything (newest is at least -1).
    const std::uint64_t short_by = v.seq - static_cast<std::uint64_t>(newest);
    const std::string last = describe_last_finished(s, v.comm_id);
    const RankOperation* waits = s.in_flight >= 0 ? &s.operations[static_cast<std::size_t>(s.in_flight)] : nullptr;
    if (newest_untracked(s, v.comm_id)) {
      // Its newest operation here was not followed to its end: an older one without an end is not where it is.
      const RankOperation& op = s.operations[static_cast<std::size_t>(s.on(v.comm_id)->last_entered)];
      lines.push_back(fmt::format("rank {} never entered it: its newest operation on the communicator, {}, is "
                                  "untracked (whether it finished is not known)",
                                  rank, describe_operation(op)));
    } else if (waits != nullptr && waits->comm_id == v.comm_id && waits->op != v.op) {
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
  if (v.untracked > 0) {
    lines.push_back(fmt::format("{} {} on {} {} not followed to {} end by {} source (the NCCL plugin follows at most "
                                "1024 in flight per communicator): whether {} finished is not known",
                                v.untracked, v.untracked == 1 ? "operation" : "operations", communicator_label(v),
                                v.untracked == 1 ? "was" : "were", v.untracked == 1 ? "its" : "their",
                                v.untracked == 1 ? "its" : "their", v.untracked == 1 ? "it" : "they"));
  }
  return lines;
}

}  // namespace oomflight
