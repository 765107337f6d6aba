// Session: identity, the recorder, and either the trigger protocol (MPI) or the single-process dump.
#include "oomflight/control/session.hpp"

#include <fmt/format.h>

#include "dump_executor.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/control/mpi_job.hpp"
#include "oomflight/format/collective_writer.hpp"
#include "trigger_protocol.hpp"

namespace oomflight {

Session::Session(Config config, MPI_Comm world)
    : config_(std::move(config)), recorder_(config_.max_entries, true, config_.max_batches) {
  set_log_level(config_.log_level);
  keep_hdf5_out_of_process_exit();
  MPI_Comm comm = MPI_COMM_NULL;
  if (world != MPI_COMM_NULL) {
    MPI_Comm_dup(world, &comm);
    // A failed MPI call of the recorder (a peer that died, a transport error) must come back to us as an error
    // code, never abort the job it watches. MPI-IO files default to MPI_ERRORS_RETURN already.
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }
  identity_ = identify(config_, comm);
  set_log_rank(identity_.rank);
  executor_ = std::make_unique<DumpExecutor>(config_, identity_);
  if (comm == MPI_COMM_NULL) return;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    log().warn("MPI was initialised without MPI_THREAD_MULTIPLE; coordinated dumps are off and each rank writes a "
               "rank-local file");
    MPI_Comm_free(&comm);
    return;
  }
  protocol_ = std::make_unique<TriggerProtocol>(config_, identity_, recorder_, *executor_, comm);
}

Session::~Session() {
  if (!shutdown()) {
    // The watcher is stuck inside a dump and still refers to this session: keep the parts it uses alive.
    (void)protocol_.release();
    (void)executor_.release();
  }
}

bool Session::shutdown() { return protocol_ ? protocol_->shutdown() : true; }

DumpResult Session::dump(const DumpRequest& request) {
  if (!config_.enabled) {
    DumpResult r;
    r.kind = request.kind;
    r.status = DumpResult::Status::disabled;
    return r;
  }
  if (protocol_) return protocol_->request(request);
  return dump_alone(request);
}

DumpResult Session::dump_alone(const DumpRequest& request) {
  const std::int64_t start = monotonic_ns();
  FrozenHistory h = recorder_.freeze(request.device);
  if (request.batch >= 0) h.batch = request.batch;
  const std::vector<std::int32_t> me = {identity_.rank};
  // The root cause first (as the trigger protocol does), before any file is touched.
  const std::string cause = dump_summary(request.kind, me, h.batch, request.requested_bytes, request.device_free_bytes);
  if (request.kind == DumpKind::oom) {
    log().error("{}{}{}", cause, request.reason.empty() ? "" : ": ", request.reason);
  }
  const ArchiveHeader header =
      executor_->header(request.kind, fmt::format("rank {}: {}", identity_.rank, request.reason), me, me);
  DumpResult r = executor_->write_single_rank(header, executor_->rank_row(h, true, request), h, h.batch);
  r.seconds = static_cast<double>(monotonic_ns() - start) / 1e9;
  const std::string summary =
      dump_summary(request.kind, me, h.batch, request.requested_bytes, request.device_free_bytes);
  switch (r.status) {
    case DumpResult::Status::archive:
      log().info("{}; archive {} written in {}", summary, r.path, format_seconds(r.seconds));
      break;
    case DumpResult::Status::rank_local:
      log().warn("{}; rank-local file {} written in {}{}", summary, r.path, format_seconds(r.seconds),
                 r.error.empty() ? "" : fmt::format(" ({})", r.error));
      break;
    default:
      log().error("{}; no file written: {}", summary, r.error);
      break;
  }
  return r;
}

}  // namespace oomflight
