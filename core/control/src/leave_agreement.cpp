// The leave agreement (leave_agreement.hpp).
#include "leave_agreement.hpp"

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "oomflight/record/clock.hpp"
#include "protocol_messages.hpp"

namespace oomflight {

LeaveAgreement::LeaveAgreement(MPI_Comm comm, MPI_Comm leave_comm, int rank, int world_size,
                               std::unique_ptr<PeerProcesses> node_peers)
    : comm_(comm), leave_comm_(leave_comm), rank_(rank), world_size_(world_size), node_peers_(std::move(node_peers)) {}

void LeaveAgreement::post() {
  if (posted_) return;
  posted_ = true;
  if (MPI_Ibarrier(leave_comm_, &barrier_) != MPI_SUCCESS) barrier_ = MPI_REQUEST_NULL;
}

bool LeaveAgreement::everyone_left() {
  if (complete_) return true;
  if (!posted_ || barrier_ == MPI_REQUEST_NULL) return false;
  int done = 0;
  if (MPI_Test(&barrier_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) complete_ = true;
  return complete_;
}

bool LeaveAgreement::receive_left_messages() {
  // The processes first, the messages second: a rank that says LEFT waits for its message to leave before its
  // process ends (announce_leaving), so a process seen ended has its message here already, if it sent one.
  const std::vector<int> ended = node_peers_ ? node_peers_->newly_ended() : std::vector<int>{};
  bool any = false;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, protocol::kTagLeft, comm_, &arrived, &status) != MPI_SUCCESS || !arrived) break;
    std::int32_t how = 0;
    MPI_Recv(&how, 1, MPI_INT32_T, status.MPI_SOURCE, protocol::kTagLeft, comm_, MPI_STATUS_IGNORE);
    // Older senders wrote 1 (on an error) whatever the reason; anything unknown is taken as an error too.
    if (how != static_cast<std::int32_t>(Leaving::normally)) left_on_error_ = true;
    any = gone_.insert(status.MPI_SOURCE).second || any;
  }
  for (int r : ended) {
    if (gone_.insert(r).second) {
      vanished_.insert(r);
      any = true;
    }
  }
  return any;
}

bool LeaveAgreement::peer_process_ended() {
  if (node_peers_ && !complete_) {
    for (int r : node_peers_->newly_ended()) {
      if (gone_.insert(r).second) vanished_.insert(r);
    }
  }
  return !vanished_.empty();
}

void LeaveAgreement::announce_leaving(Leaving how) {
  if (complete_ || announced_) return;
  announced_ = true;
  // The payloads must outlive the sends, which may complete after this object is gone: statics.
  static const std::int32_t kOnError = static_cast<std::int32_t>(Leaving::on_error);
  static const std::int32_t kNormally = static_cast<std::int32_t>(Leaving::normally);
  const std::int32_t* payload = how == Leaving::normally ? &kNormally : &kOnError;
  std::vector<MPI_Request> sends;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || gone_.count(r) > 0) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(payload, 1, MPI_INT32_T, r, protocol::kTagLeft, comm_, &request) == MPI_SUCCESS) {
      sends.push_back(request);
    }
  }
  // A message freed at once may still sit in this process's send queue when the process ends (over TCP it
  // does: the survivor of a rank that died of its OOM waited out its whole leave agreement, issue 29). Tiny
  // messages go eagerly, so this is microseconds; a peer that is gone cannot hold it up for more than the bound.
  const std::int64_t until = monotonic_ns() + 250'000'000;
  while (!sends.empty()) {
    int all = 0;
    MPI_Testall(static_cast<int>(sends.size()), sends.data(), &all, MPI_STATUSES_IGNORE);
    if (all) return;
    if (monotonic_ns() > until) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (MPI_Request& r : sends) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
}

void LeaveAgreement::close() {
  if (leave_comm_ == MPI_COMM_NULL) return;
  if (barrier_ == MPI_REQUEST_NULL || complete_) MPI_Comm_free(&leave_comm_);
}

}  // namespace oomflight
