// The leave agreement (leave_agreement.hpp).
#include "leave_agreement.hpp"

#include <cstdint>

#include "protocol_messages.hpp"

namespace oomflight {

LeaveAgreement::LeaveAgreement(MPI_Comm comm, MPI_Comm leave_comm, int rank, int world_size)
    : comm_(comm), leave_comm_(leave_comm), rank_(rank), world_size_(world_size) {}

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
  bool any = false;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, protocol::kTagLeft, comm_, &arrived, &status) != MPI_SUCCESS || !arrived) break;
    std::int32_t who = -1;
    MPI_Recv(&who, 1, MPI_INT32_T, status.MPI_SOURCE, protocol::kTagLeft, comm_, MPI_STATUS_IGNORE);
    any = gone_.insert(status.MPI_SOURCE).second || any;
  }
  return any;
}

void LeaveAgreement::announce_leaving() {
  if (complete_) return;
  // The payload must outlive the sends, which may complete after this object is gone: a static.
  static const std::int32_t kLeft = 1;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_ || gone_.count(r) > 0) continue;
    MPI_Request request;
    if (MPI_Isend(&kLeft, 1, MPI_INT32_T, r, protocol::kTagLeft, comm_, &request) == MPI_SUCCESS) {
      MPI_Request_free(&request);
    }
  }
}

void LeaveAgreement::close() {
  if (leave_comm_ == MPI_COMM_NULL) return;
  if (barrier_ == MPI_REQUEST_NULL || complete_) MPI_Comm_free(&leave_comm_);
}

}  // namespace oomflight
