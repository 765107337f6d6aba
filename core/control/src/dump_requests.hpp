// A rank's requests for a dump of every rank, and who runs them: one implementation for both transports (internal to
// the control wing; docs/protocol.md, "One coordinator, two transports"). A request (a failing thread's, the API's)
// follows DumpLedger::join's rule; when it asks for a dump, it tells the other ranks through its transport, freezes
// this rank's history and hands both to the transport's watcher, which runs every dump of the rank (MPI: votes and
// the collective write; the store: rank-local files and the merge); then it waits for that dump, and for the joint
// dump that may follow. A signal's request is queued by the watcher itself, which runs it at once.
//
// Issue 40: the MPI transport ran its dumps on its watcher and the store transport on the asking thread, each with its
// own request(), wait and pending request; now both run them on the watcher, through this.
//
// Thread-safety: every call is made holding the transport's mutex (the one `cv` waits with), which request() and take_due()
// release while they wait or tell the other ranks. The transport notifies the condition variable given whenever the
// ledger changes (begin, decided, finish) or its stop flag is set.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "dump_ledger.hpp"
#include "oomflight/control/dump_request.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

/// A dump this rank asked for, handed to the watcher (DumpRequests::Pending).
struct PendingDump {
  FrozenHistory history;
  DumpRequest request;
  /// What DumpRequests::Transport::ask_others() returned when the request told the other ranks before its freeze
  /// (the store: the trigger's order; MPI: 1); 0 when the watcher tells them, with the dump (a dump was under way).
  std::int64_t asked = 0;
};

class DumpRequests {
 public:
  // Outside the class: a nested struct with default member initializers is not default-constructible (for
  // std::optional::emplace) until the enclosing class is complete, and clang says so.
  using Pending = PendingDump;

  /// What a request needs of its transport.
  class Transport {
   public:
    virtual ~Transport() = default;
    /// Whether the other ranks may be told of a dump now (MPI: not after a dump left the ranks out of step). Called
    /// with the mutex held.
    virtual bool can_ask() const = 0;
    /// Tells the other ranks that this rank asks for dump `number` (of `request`'s kind, at `batch`), before its
    /// freeze, so that theirs overlap it. Called without the mutex. Returns nonzero when they were told, 0 when not.
    /// Never throws.
    virtual std::int64_t ask_others(const DumpRequest& request, std::int64_t batch, std::int64_t number) = 0;
    /// Wakes this rank's watcher (its doorbell): a request is ready for it.
    virtual void wake_watcher() = 0;
  };

  /// `cv` is the one the transport's mutex is waited on with, `stop` its stop flag (both read under that mutex).
  DumpRequests(std::condition_variable& cv, const bool& stop, DumpLedger& ledger, Recorder& recorder,
               Transport& transport, int rank, std::chrono::milliseconds dump_timeout);

  /// A request of this rank (any thread but the watcher's), `lock` holding the transport's mutex: joins the dump
  /// under way, shares a request of another thread, or asks for a dump; then waits for the dump (3 x
  /// OOMFLIGHT_DUMP_TIMEOUT) and the joint dump that may follow, and returns the result. nullopt when the transport
  /// stopped first and the dump asked for never began (the caller writes this rank's history alone). Never throws.
  std::optional<DumpResult> request(std::unique_lock<std::mutex>& lock, const DumpRequest& request);

  /// Whether a dump is asked for or under way: a signal's request is covered by it. Mutex held.
  bool busy() const { return pending_.has_value() || ledger_.under_way(); }

  /// The watcher's own request (SIGUSR1, SIGTERM's exit dump, a headroom crossing: of the request's device and batch
  /// where it names them), mutex held: freezes this rank and queues it, for the watcher to run now. false when a dump is asked for or under way (it covers the request).
  bool queue(const DumpRequest& request);

  /// Whether a request waits for the watcher and its dump is the next (number() has come to it). Mutex held.
  bool due() const { return pending_.has_value() && number_ <= ledger_.number(); }

  /// due(), and the request told the other ranks already (they are on their way into its dump), or may have: it is
  /// still telling them.
  bool due_and_asked() const { return due() && (!ready_ || pending_->asked != 0); }

  /// Whether any request waits for the watcher.
  bool waiting() const { return pending_.has_value(); }

  /// The watcher takes the request that is due, waiting (bounded) for the freeze of a request that is still
  /// telling the other ranks. nullopt when none is due. `lock` holds the mutex.
  std::optional<Pending> take_due(std::unique_lock<std::mutex>& lock);

  /// The answer to a request that the last dump answered, on an origin of it: waits for the joint dump that follows
  /// when one is expected (DumpLedger::await_joint), then returns the last result.
  DumpResult await_joint(std::unique_lock<std::mutex>& lock);

 private:
  std::condition_variable& cv_;
  const bool& stop_;
  DumpLedger& ledger_;
  Recorder& recorder_;
  Transport& transport_;
  const int rank_;
  const std::chrono::milliseconds dump_timeout_;
  std::optional<Pending> pending_;  // a request not yet taken by the watcher
  bool ready_ = false;              // ... frozen (not still telling the other ranks)
  std::int64_t number_ = 0;         // ... the dump it belongs to
};

}  // namespace oomflight
