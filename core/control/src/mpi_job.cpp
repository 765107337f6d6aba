// Launcher detection, MPI set-up and the rank's identity.
#include "oomflight/control/mpi_job.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fmt/format.h>
#include <optional>
#include <random>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "oomflight/base/utc_time.hpp"
#include "oomflight/format/archive_schema.hpp"

namespace oomflight {
namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// This job's id: 48 random bits as 12 hex digits (two jobs of one run name in one folder tell their files apart by
// it; a collision needs some 16 million jobs sharing a folder).
std::string generate_job_id() {
  std::random_device rd;
  const std::uint64_t bits = (static_cast<std::uint64_t>(rd()) << 32 | rd()) & 0xffffffffffffull;
  return fmt::format("{:012x}", bits);
}

// Rank 0's run name and job id, shared with every rank (one for the whole job).
std::pair<std::string, std::string> shared_names(const std::string& configured, int rank, MPI_Comm comm) {
  struct {
    char run_name[256] = {};
    char job_id[16] = {};
  } buf;
  if (rank == 0) {
    set_fixed_string(buf.run_name, configured.empty() ? generate_run_name() : configured);
    set_fixed_string(buf.job_id, generate_job_id());
  }
  MPI_Bcast(&buf, sizeof(buf), MPI_CHAR, 0, comm);
  return {fixed_string(buf.run_name), fixed_string(buf.job_id)};
}

// A decimal number of at most 9 digits, whole: nothing else is a launcher's rank.
std::optional<int> whole_number(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  int value = 0, digits = 0;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || ++digits > 9) return std::nullopt;
    value = value * 10 + (*c - '0');
  }
  return value;
}

}  // namespace

std::optional<LauncherRank> launcher_rank() {
  const auto rank = whole_number(std::getenv("RANK"));
  const auto world_size = whole_number(std::getenv("WORLD_SIZE"));
  if (!rank || !world_size || *world_size < 1 || *rank >= *world_size) return std::nullopt;
  const auto local_rank = whole_number(std::getenv("LOCAL_RANK"));
  return LauncherRank{*rank, *world_size, local_rank && *local_rank < *world_size ? *local_rank : 0};
}

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") || std::getenv("PMI_SIZE");
}

bool initialise_mpi_if_needed() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return false;  // the job initialised MPI itself
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) throw std::runtime_error(fmt::format("MPI_Init_thread failed (MPI error {})", rc));
  return true;
}

void require_thread_multiple(bool initialised_here) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided >= MPI_THREAD_MULTIPLE) return;
  // oomflight's watcher thread makes MPI calls while the job's threads make theirs: anything below
  // MPI_THREAD_MULTIPLE would be undefined behaviour, so refuse it plainly.
  if (initialised_here) {
    throw std::runtime_error(fmt::format("this MPI provides thread level {} only; oomflight's watcher thread needs "
                                         "MPI_THREAD_MULTIPLE ({})", provided, MPI_THREAD_MULTIPLE));
  }
  throw std::runtime_error(fmt::format(
      "the job initialised MPI with thread level {} but oomflight's watcher thread needs MPI_THREAD_MULTIPLE "
      "({}); initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) (mpi4py: its default)",
      provided, MPI_THREAD_MULTIPLE));
}

void finalise_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string generate_run_name() {
  std::random_device rd;
  return fmt::format("oomflight-{}-{:04x}", utc_now("%Y%m%d-%H%M%S"), rd() & 0xffff);
}

RankIdentity identify(const Config& config, MPI_Comm comm) {
  RankIdentity id;
  id.pid = static_cast<std::int64_t>(getpid());
  id.host = host_name();
  if (comm == MPI_COMM_NULL) {
    id.run_name = config.run_name.empty() ? generate_run_name() : config.run_name;
    id.job_id = generate_job_id();
    // A process that torchrun (or a trainer's launcher) started is the launcher's rank from the start, in its log
    // and its files, before it reaches the job's store (which confirms the same numbers).
    if (const auto launched = launcher_rank()) {
      id.rank = launched->rank;
      id.world_size = launched->world_size;
      id.local_rank = launched->local_rank;
    }
    return id;
  }
  MPI_Comm_rank(comm, &id.rank);
  MPI_Comm_size(comm, &id.world_size);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, id.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &id.local_rank);
  MPI_Comm_free(&node);
  std::tie(id.run_name, id.job_id) = shared_names(config.run_name, id.rank, comm);
  return id;
}

}  // namespace oomflight
