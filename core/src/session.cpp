// Session: sets up identity and the control plane; the single-process dump path.
#include "oomflight/session.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <random>

#include "control_plane.hpp"
#include "oomflight/archive_writer.hpp"
#include "oomflight/clock.hpp"
#include "oomflight/logging.hpp"
#include "oomflight/units.hpp"

namespace oomflight {
namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// Rank 0's run name, shared with every rank (the name must be one for the whole job).
std::string shared_run_name(const std::string& configured, int rank, MPI_Comm comm) {
  char buf[256] = {};
  if (rank == 0) set_fixed_string(buf, configured.empty() ? generate_run_name() : configured);
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, comm);
  return fixed_string(buf);
}

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
}

std::string generate_run_name() {
  std::random_device rd;
  return fmt::format("oomflight-{}-{:04x}", utc_now("%Y%m%d-%H%M%S"), rd() & 0xffff);
}

Session::Session(Config config, MPI_Comm world) : config_(std::move(config)), recorder_(config_.max_entries) {
  set_log_level(config_.log_level);
  identity_.pid = static_cast<std::int64_t>(getpid());
  identity_.host = host_name();
  if (world == MPI_COMM_NULL) {
    identity_.run_name = config_.run_name.empty() ? generate_run_name() : config_.run_name;
    return;
  }
  MPI_Comm comm;
  MPI_Comm_dup(world, &comm);
  MPI_Comm_rank(comm, &identity_.rank);
  MPI_Comm_size(comm, &identity_.world_size);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, identity_.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &identity_.local_rank);
  MPI_Comm_free(&node);
  identity_.run_name = shared_run_name(config_.run_name, identity_.rank, comm);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    log().warn("rank {}: MPI was initialised without MPI_THREAD_MULTIPLE; coordinated dumps are off and each rank "
               "writes a rank-local file",
               identity_.rank);
    MPI_Comm_free(&comm);
    return;
  }
  control_ = std::make_unique<ControlPlane>(config_, identity_, recorder_, comm);
}

Session::~Session() { shutdown(); }

void Session::shutdown() {
  if (control_) control_->shutdown();
}

DumpResult Session::trigger(const TriggerInfo& info) {
  if (!config_.enabled) {
    DumpResult r;
    r.status = DumpResult::Status::disabled;
    return r;
  }
  if (control_) return control_->trigger(info);
  return dump_alone(info);
}

DumpResult Session::dump_alone(const TriggerInfo& info) {
  const std::int64_t start = monotonic_ns();
  FrozenHistory h = recorder_.freeze();
  const RankRow row = make_rank_row(identity_, h, true, info);
  const ArchiveHeader header =
      make_header(identity_, fmt::format("rank {}: {}", identity_.rank, info.reason), {identity_.rank}, {identity_.rank});
  DumpResult r;
  r.origin_ranks = {identity_.rank};
  r.world_size = identity_.world_size;
  r.batch = h.batch;
  r.ranks_written = 1;
  try {
    if (identity_.world_size == 1) {
      TemplateValues values{identity_.run_name, 0, 0, 1, h.batch, identity_.pid, identity_.host, "oom"};
      r.path = prepare_dump_path(config_, config_.filename, values);
      write_archive(r.path, header, RankDump{row, &h.ring.events, &h.stacks}, MPI_COMM_NULL);
      r.status = DumpResult::Status::archive;
    } else {
      r.path = write_rank_local(config_, identity_, header, row, h, h.batch);
      r.status = DumpResult::Status::rank_local;
    }
  } catch (const std::exception& e) {
    // The archive's folder failed: the rank-local writer has a fallback folder.
    try {
      r.path = write_rank_local(config_, identity_, header, row, h, h.batch);
      r.status = DumpResult::Status::rank_local;
      r.error = e.what();
    } catch (const std::exception& e2) {
      r.status = DumpResult::Status::failed;
      r.error = fmt::format("{}; {}", e.what(), e2.what());
      log().error("rank {}: no file written: {}", identity_.rank, r.error);
      return r;
    }
  }
  r.seconds = static_cast<double>(monotonic_ns() - start) / 1e9;
  log().info("rank {} out of memory at batch {} (requested {}, {} free); {} {} written in {}", identity_.rank, h.batch,
             format_bytes(info.requested_bytes), format_bytes(info.device_free_bytes),
             r.status == DumpResult::Status::archive ? "archive" : "rank-local file", r.path, format_seconds(r.seconds));
  return r;
}

}  // namespace oomflight
