// The control plane (internal): a watcher thread on a duplicated communicator that receives dump triggers,
// agrees with every rank on the archive within a deadline, and writes it collectively.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "oomflight/config.hpp"
#include "oomflight/dump.hpp"
#include "oomflight/dump_files.hpp"
#include "oomflight/recorder.hpp"

namespace oomflight {

class ControlPlane {
 public:
  /// Collective over `comm` (already duplicated for us; we own it).
  ControlPlane(const Config& config, RankIdentity& identity, Recorder& recorder, MPI_Comm comm);
  ~ControlPlane();

  /// See Session::trigger.
  DumpResult trigger(const TriggerInfo& info);
  void shutdown();

 private:
  struct Pending {
    FrozenHistory history;
    TriggerInfo info;
  };

  void watch();
  bool poll_trigger_message();
  void run_dump();
  void send_triggers(std::int64_t batch);
  bool wait_for(MPI_Request& request, std::int64_t deadline_ns);
  DumpResult agree_and_write(FrozenHistory& h, bool is_origin, const TriggerInfo& info, std::int64_t deadline_ns,
                             std::int64_t start_ns);
  DumpResult write_alone(FrozenHistory& h, bool is_origin, const TriggerInfo& info, std::int64_t start_ns,
                         const std::string& why, std::vector<std::int32_t> origins = {});
  void exchange_done(bool is_origin, const std::vector<std::int32_t>& origins, std::int64_t deadline_ns);
  std::string choose_archive_path(std::int64_t batch);
  void finish(DumpResult result);

  const Config& config_;
  RankIdentity& id_;
  Recorder& recorder_;
  MPI_Comm comm_;

  std::mutex mutex_;
  std::condition_variable wake_;   // the watcher waits here between polls
  std::condition_variable done_;   // triggering threads wait here for their dump
  bool stop_ = false;
  std::optional<Pending> pending_;       // a local trigger not yet taken by the watcher
  std::int64_t pending_epoch_ = 0;       // the dump the pending trigger belongs to
  std::int64_t epoch_ = 0;               // dumps completed
  bool active_ = false;                  // a dump is under way
  bool active_is_origin_ = false;
  DumpResult last_result_;
  std::uint64_t oom_events_covered_ = 0; // oom events already reported by an earlier dump
  bool broken_ = false;                  // a collective was abandoned: comm_ must not be used collectively

  MPI_Request trigger_request_ = MPI_REQUEST_NULL;
  struct TriggerMessage {
    std::int64_t epoch;
    std::int64_t batch;
    std::int32_t origin;
    std::int32_t reserved;
  } incoming_{};
  std::set<int> heard_origins_;  // origins named by trigger messages in this dump
  std::int64_t heard_batch_ = -1;
  std::thread watcher_;
};

}  // namespace oomflight
