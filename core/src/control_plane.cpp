// The control plane. Protocol (docs/protocol.md):
//   1. The origin freezes its ring in the failing thread and sends a trigger to every rank (point to point).
//   2. Every rank's watcher, on a trigger, freezes its own ring, then all ranks run two non-blocking
//      collectives under one deadline: an allgather of votes (am I an origin, my batch, my request) and a
//      broadcast of the archive path from the lowest origin.
//   3. All ranks write the archive collectively. If a collective does not complete by the deadline, the
//      communicator is abandoned and every live rank writes a rank-local file; ranks then tell the origins
//      they are done, so that an origin does not let its error end the job before the others wrote.
#include "control_plane.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "oomflight/archive_writer.hpp"
#include "oomflight/clock.hpp"
#include "oomflight/logging.hpp"
#include "oomflight/units.hpp"

namespace oomflight {
namespace {

constexpr int kTagTrigger = 0x00F1;
constexpr int kTagDone = 0x00F2;

// One rank's contribution to the agreement. Fixed size: exchanged as bytes.
struct Vote {
  std::int32_t is_origin = 0;
  std::int32_t rank = 0;
  std::int64_t batch = -1;
  std::uint64_t requested_bytes = 0;
  std::uint64_t device_free_bytes = 0;
  char reason[224] = {};
};

std::int64_t to_ns(std::chrono::milliseconds ms) { return static_cast<std::int64_t>(ms.count()) * 1'000'000; }

double seconds_since(std::int64_t start_ns) { return static_cast<double>(monotonic_ns() - start_ns) / 1e9; }

// Reason and request for a rank that is an origin because its ring holds an oom event no dump has reported.
TriggerInfo info_from_oom_event(const FrozenHistory& h) {
  for (auto it = h.ring.events.rbegin(); it != h.ring.events.rend(); ++it) {
    if (it->action == Action::oom) {
      return TriggerInfo{fmt::format("out of memory at batch {}: tried to allocate {} with {} free", it->batch,
                                     format_bytes(it->size), format_bytes(it->addr)),
                         it->size, it->addr};
    }
  }
  return TriggerInfo{"out of memory (the oom event is no longer in the ring)", 0, 0};
}

std::string origins_text(const std::vector<std::int32_t>& origins) {
  return fmt::format("{} {}", origins.size() == 1 ? "rank" : "ranks", fmt::join(origins, ", "));
}

// Trigger messages must outlive their MPI_Isend; they are tiny and rare, so they are kept for the process.
std::deque<std::array<std::int64_t, 3>>& outgoing_messages() {
  static std::deque<std::array<std::int64_t, 3>> messages;
  return messages;
}

}  // namespace

ControlPlane::ControlPlane(const Config& config, RankIdentity& identity, Recorder& recorder, MPI_Comm comm)
    : config_(config), id_(identity), recorder_(recorder), comm_(comm) {
  static_assert(sizeof(TriggerMessage) == 24);
  MPI_Irecv(&incoming_, sizeof(incoming_), MPI_BYTE, MPI_ANY_SOURCE, kTagTrigger, comm_, &trigger_request_);
  watcher_ = std::thread([this] { watch(); });
}

ControlPlane::~ControlPlane() { shutdown(); }

void ControlPlane::shutdown() {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  done_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (trigger_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&trigger_request_);
    MPI_Wait(&trigger_request_, MPI_STATUS_IGNORE);
  }
  // A communicator with an abandoned collective on it must not be freed (the collective still refers to it).
  if (!broken_) MPI_Comm_free(&comm_);
}

DumpResult ControlPlane::trigger(const TriggerInfo& info) {
  std::unique_lock lock(mutex_);
  if (stop_) {
    DumpResult r;
    r.error = "the oomflight session was already shut down";
    return r;
  }
  std::int64_t target = 0;
  if (active_ && active_is_origin_) {
    target = epoch_;  // the dump under way already counts this rank as an origin
  } else if (pending_) {
    target = pending_epoch_;  // another thread of this process asked first: share its dump
  } else {
    pending_ = Pending{recorder_.freeze(), info};  // freeze at once: later events must not push history out
    pending_epoch_ = active_ ? epoch_ + 1 : epoch_;
    target = pending_epoch_;
    wake_.notify_one();
  }
  const bool finished = done_.wait_for(lock, 3 * config_.dump_timeout, [&] { return stop_ || epoch_ > target; });
  if (!finished || epoch_ <= target) {
    DumpResult r;
    r.error = fmt::format("the dump did not finish within {} (3 x OOMFLIGHT_DUMP_TIMEOUT); giving up waiting",
                          format_seconds(3 * config_.dump_timeout.count() / 1000.0));
    log().error("rank {}: {}", id_.rank, r.error);
    return r;
  }
  return last_result_;
}

void ControlPlane::watch() {
  for (;;) {
    bool local = false;
    {
      std::unique_lock lock(mutex_);
      // Sleep, not spin: an idle watcher costs one wake-up per poll interval.
      wake_.wait_for(lock, config_.poll_interval, [&] { return stop_ || pending_.has_value(); });
      if (stop_) return;
      local = pending_.has_value() && pending_epoch_ <= epoch_;
    }
    const bool remote = poll_trigger_message();
    if (local || remote) run_dump();
  }
}

bool ControlPlane::poll_trigger_message() {
  int arrived = 0;
  MPI_Test(&trigger_request_, &arrived, MPI_STATUS_IGNORE);
  if (!arrived) return false;
  const TriggerMessage msg = incoming_;
  MPI_Irecv(&incoming_, sizeof(incoming_), MPI_BYTE, MPI_ANY_SOURCE, kTagTrigger, comm_, &trigger_request_);
  if (msg.epoch < epoch_) return false;  // a second origin's trigger for a dump that is already written
  heard_origins_.insert(msg.origin);
  if (heard_batch_ < 0) heard_batch_ = msg.batch;
  return true;
}

void ControlPlane::send_triggers(std::int64_t batch) {
  int size = 0;
  MPI_Comm_size(comm_, &size);
  auto& msg = outgoing_messages().emplace_back();
  TriggerMessage m{epoch_, batch, id_.rank, 0};
  std::memcpy(msg.data(), &m, sizeof(m));
  for (int r = 0; r < size; ++r) {
    if (r == id_.rank) continue;
    MPI_Request request;
    MPI_Isend(msg.data(), sizeof(m), MPI_BYTE, r, kTagTrigger, comm_, &request);
    MPI_Request_free(&request);  // completes on its own; the buffer lives in outgoing_messages()
  }
}

bool ControlPlane::wait_for(MPI_Request& request, std::int64_t deadline_ns) {
  for (;;) {
    int complete = 0;
    MPI_Test(&request, &complete, MPI_STATUS_IGNORE);
    if (complete) return true;
    if (monotonic_ns() > deadline_ns) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void ControlPlane::run_dump() {
  const std::int64_t start = monotonic_ns();
  bool is_origin = false;
  TriggerInfo info;
  FrozenHistory h;
  {
    std::lock_guard lock(mutex_);
    active_ = true;
    if (pending_ && pending_epoch_ <= epoch_) {
      is_origin = true;
      h = std::move(pending_->history);
      info = std::move(pending_->info);
      pending_.reset();
    }
  }
  if (!is_origin) {
    h = recorder_.freeze();
    // An oom event no dump has reported makes this rank an origin even if its trigger call comes later: two
    // ranks that fail at the same moment are both named, whatever order their messages arrive in.
    if (h.oom_events > oom_events_covered_) {
      is_origin = true;
      info = info_from_oom_event(h);
    }
  }
  if (is_origin) oom_events_covered_ = std::max(oom_events_covered_, h.oom_events);
  {
    std::lock_guard lock(mutex_);
    active_is_origin_ = is_origin;
  }
  if (is_origin && !broken_) send_triggers(h.batch);
  DumpResult result = broken_ ? write_alone(h, is_origin, info, start, "an earlier dump left the ranks out of step")
                              : agree_and_write(h, is_origin, info, start + to_ns(config_.dump_timeout), start);
  finish(std::move(result));
}

DumpResult ControlPlane::agree_and_write(FrozenHistory& h, bool is_origin, const TriggerInfo& info,
                                         std::int64_t deadline_ns, std::int64_t start_ns) {
  int size = 0;
  MPI_Comm_size(comm_, &size);
  Vote mine;
  mine.is_origin = is_origin ? 1 : 0;
  mine.rank = id_.rank;
  mine.batch = h.batch;
  mine.requested_bytes = info.requested_bytes;
  mine.device_free_bytes = info.device_free_bytes;
  set_fixed_string(mine.reason, info.reason);
  std::vector<Vote> votes(static_cast<std::size_t>(size));
  MPI_Request request;
  MPI_Iallgather(&mine, sizeof(Vote), MPI_BYTE, votes.data(), sizeof(Vote), MPI_BYTE, comm_, &request);
  const auto timeout_text = format_seconds(config_.dump_timeout.count() / 1000.0);
  if (!wait_for(request, deadline_ns)) {
    broken_ = true;
    return write_alone(h, is_origin, info, start_ns,
                       fmt::format("not every rank joined the dump within {} (OOMFLIGHT_DUMP_TIMEOUT)", timeout_text));
  }
  std::vector<std::int32_t> origins;
  std::string reason;
  for (const auto& v : votes) {
    if (!v.is_origin) continue;
    origins.push_back(v.rank);
    reason += fmt::format("{}rank {}: {}", reason.empty() ? "" : "\n", v.rank, fixed_string(v.reason));
  }
  if (origins.empty()) origins.push_back(heard_origins_.empty() ? 0 : *heard_origins_.begin());
  const int lowest = origins.front();
  const std::int64_t batch = votes[static_cast<std::size_t>(lowest)].batch;

  char path[4096] = {};
  if (id_.rank == lowest) set_fixed_string(path, choose_archive_path(batch));
  MPI_Ibcast(path, sizeof(path), MPI_CHAR, lowest, comm_, &request);
  if (!wait_for(request, deadline_ns)) {
    broken_ = true;
    return write_alone(h, is_origin, info, start_ns,
                       fmt::format("the archive's path did not reach every rank within {}", timeout_text));
  }
  if (path[0] == '\0') {
    return write_alone(h, is_origin, info, start_ns, "the archive's folder could not be created", origins);
  }

  std::vector<std::int32_t> present(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) present[static_cast<std::size_t>(r)] = r;
  const ArchiveHeader header = make_header(id_, reason, origins, present);
  const RankRow row = make_rank_row(id_, h, is_origin, info);
  try {
    write_archive(path, header, RankDump{row, &h.ring.events, &h.stacks}, comm_);
  } catch (const std::exception& e) {
    return write_alone(h, is_origin, info, start_ns, e.what(), origins);  // every rank throws together
  }
  DumpResult r;
  r.status = DumpResult::Status::archive;
  r.path = path;
  r.origin_ranks.assign(origins.begin(), origins.end());
  r.ranks_written = size;
  r.world_size = size;
  r.batch = batch;
  r.seconds = seconds_since(start_ns);
  if (id_.rank == lowest) {
    const auto& v = votes[static_cast<std::size_t>(lowest)];
    log().info("{} out of memory at batch {} (requested {}, {} free); archive {} written by {} of {} ranks in {}",
               origins_text(origins), batch, format_bytes(v.requested_bytes), format_bytes(v.device_free_bytes),
               r.path, size, size, format_seconds(r.seconds));
  }
  return r;
}

std::string ControlPlane::choose_archive_path(std::int64_t batch) {
  try {
    TemplateValues values{id_.run_name, id_.rank, id_.local_rank, id_.world_size, batch, id_.pid, id_.host, "oom"};
    // Absolute, so that every rank opens the same file whatever its working directory.
    return std::filesystem::absolute(prepare_dump_path(config_, config_.filename, values)).string();
  } catch (const std::exception& e) {
    log().error("rank {}: {}", id_.rank, e.what());
    return {};
  }
}

DumpResult ControlPlane::write_alone(FrozenHistory& h, bool is_origin, const TriggerInfo& info,
                                     std::int64_t start_ns, const std::string& why,
                                     std::vector<std::int32_t> origins) {
  // Without an agreement, the origins this rank knows of are the senders of the triggers it received.
  origins.insert(origins.end(), heard_origins_.begin(), heard_origins_.end());
  if (is_origin && std::find(origins.begin(), origins.end(), id_.rank) == origins.end()) origins.push_back(id_.rank);
  std::sort(origins.begin(), origins.end());
  origins.erase(std::unique(origins.begin(), origins.end()), origins.end());
  const std::int64_t batch = heard_batch_ >= 0 && !is_origin ? heard_batch_ : h.batch;
  const std::string reason = is_origin ? fmt::format("rank {}: {}", id_.rank, info.reason) : "";
  const ArchiveHeader header = make_header(id_, reason, origins, {id_.rank});
  const RankRow row = make_rank_row(id_, h, is_origin, info);
  DumpResult r;
  r.origin_ranks.assign(origins.begin(), origins.end());
  r.world_size = id_.world_size;
  r.batch = batch;
  r.error = why;
  try {
    r.path = write_rank_local(config_, id_, header, row, h, batch);
    r.status = DumpResult::Status::rank_local;
    r.ranks_written = 1;
    log().warn("rank {}: {}; wrote rank-local file {} (merge rank-local files later with oomflight)", id_.rank, why,
               r.path);
  } catch (const std::exception& e) {
    r.status = DumpResult::Status::failed;
    r.error = fmt::format("{}; and the rank-local file failed: {}", why, e.what());
    log().error("rank {}: {}", id_.rank, r.error);
  }
  exchange_done(is_origin, origins, monotonic_ns() + to_ns(config_.dump_timeout));
  r.seconds = seconds_since(start_ns);
  return r;
}

void ControlPlane::exchange_done(bool is_origin, const std::vector<std::int32_t>& origins, std::int64_t deadline_ns) {
  int size = 0;
  MPI_Comm_size(comm_, &size);
  auto& msg = outgoing_messages().emplace_back();
  msg[0] = epoch_;
  for (int origin : origins) {
    if (origin == id_.rank) continue;
    MPI_Request request;
    MPI_Isend(msg.data(), 1, MPI_INT64_T, origin, kTagDone, comm_, &request);
    MPI_Request_free(&request);
  }
  if (!is_origin) return;
  // An origin's error ends the job: give every other rank until the deadline to finish its own file.
  int done = 0;
  while (done < size - 1 && monotonic_ns() < deadline_ns) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kTagDone, comm_, &arrived, &status);
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    std::int64_t epoch = 0;
    MPI_Recv(&epoch, 1, MPI_INT64_T, status.MPI_SOURCE, kTagDone, comm_, MPI_STATUS_IGNORE);
    if (epoch == epoch_) ++done;
  }
  if (done < size - 1) {
    log().warn("rank {}: {} of {} other ranks reported their rank-local file before the deadline", id_.rank, done,
               size - 1);
  }
}

void ControlPlane::finish(DumpResult result) {
  {
    std::lock_guard lock(mutex_);
    last_result_ = std::move(result);
    ++epoch_;
    active_ = false;
    active_is_origin_ = false;
    heard_origins_.clear();
    heard_batch_ = -1;
  }
  done_.notify_all();
}

}  // namespace oomflight
