// The record one rank keeps of its coordinated dumps, and the rules on it that both transports keep (internal to the
// control wing; docs/protocol.md, "One coordinator, two transports"): the dump numbers every rank counts alike, the
// dump under way, whether this rank is an origin through an oom event its failing thread has not reported yet, whose
// words a dump takes, when a request is answered by a dump that already holds its failure, a failure that came
// during a dump after this rank's freeze, and the joint dump that follows it. The transports keep their mechanics
// (messages, votes and the collective write; keys, rank-local files and the merge) and ask this what to do.
//
// Issue 40: each transport held its own copy of these fields and of the rules on them (the MPI one an `epoch_`, the
// store one a `next_dump_`, each its own joint-dump wait), and the copies had drifted.
//
// Pure: no log, no transport, no clock but the waits' (it is compiled into the unit tests as it is into the library).
// What a rule says is returned as text, and the transport logs it.
//
// Thread-safety: none of its own. Every call is made under the transport's mutex (the one `cv` waits with); the waits
// take that lock and release it while they wait. The transport notifies `cv` whenever what a wait looks at changes
// (its stop flag, begin(), finish(), offer()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "oomflight/control/dump_request.hpp"

namespace oomflight {

class DumpLedger {
 public:
  // --- The dumps, numbered alike on every rank.

  /// The number of the dump under way, or else of the next one: the dumps this rank finished that the other ranks
  /// heard of. Every rank counts alike, so a number names one dump of the job (its files carry it; merge checks it).
  std::int64_t number() const { return number_; }

  /// Whether a dump is under way on this rank (begin() to finish()).
  bool under_way() const { return under_way_; }

  /// A dump begins on this rank: dump number(), of `kind` as this rank knows it (its own request's, or the one it
  /// heard of). The caller owns it until finish(). Whether this rank is an origin of it is not known yet
  /// (deciding()): the caller says so with asked(), rejoined() or origin_through_event(), then decided().
  void begin(DumpKind kind = DumpKind::oom);

  /// Whether the dump under way has yet to say whether this rank is an origin of it: from begin() to decided(), the
  /// freeze (1 to 2 ms for 100,000 events). A request in that window waits for the verdict before join(), or it
  /// would ask for a second dump of the same failure.
  bool deciding() const { return deciding_; }

  /// The dump under way has said whether this rank is an origin of it, and said so on this rank's stderr: a request
  /// that waited may join() now (its words follow the dump's own line).
  void decided() { deciding_ = false; }

  /// The kind of the dump under way, as begin() was told.
  DumpKind kind_under_way() const { return kind_; }

  /// Whether this rank is an origin of the dump under way (asked(), rejoined(), or origin_through_event() true).
  bool origin_of_under_way() const { return under_way_ && origin_; }

  /// The dump under way ended with `result`. `counted`: the other ranks heard of it, and the numbers move on (a dump
  /// whose trigger never reached them does not count, or the ranks' numbers would part). Clears what was for that
  /// dump only; a joint dump that was expected and is now over is no longer expected.
  void finish(DumpResult result, bool counted = true);

  /// How many dumps ended on this rank (finish()), counted or not: a request whose dump did not count sees it end.
  std::uint64_t ended() const { return ended_; }

  /// The last dump's result: the answer to a request that the dump already holds (answered()).
  const DumpResult& last_result() const { return last_result_; }

  /// Whether an exit dump (OOMFLIGHT_DUMP_ON_EXIT) finished on this rank: a later SIGTERM ends the process with no
  /// second one (sigterm_plan.hpp).
  bool exit_dumped() const { return exit_dumped_; }

  // --- Origins: which rank's failure a dump reports.

  /// This rank asked for the dump under way, and its freeze holds `oom_events` (the recorder's count): they are
  /// reported from now on.
  void asked(std::uint64_t oom_events);

  /// This rank is an origin of the dump under way because it was one of the dump that dump replaces (the joint
  /// dump): its freeze holds `oom_events`, reported from now on. A failing thread still to ask is still answered by
  /// the dump that made this rank an origin.
  void rejoined(std::uint64_t oom_events);

  /// A dump this rank did not ask for froze its history holding `oom_events`. Returns whether one of them no dump
  /// has reported: this rank is then an origin of that dump too (ranks of a data-parallel job run out of memory at
  /// the same step, and one whose failing thread had not asked yet is named with the first), and the dump awaits its
  /// failing thread's words (words()). Only in an oom dump: a dump of another kind (a headroom crossing, a signal)
  /// holds the history but is not this rank's failure, which gets a dump of its own after it (join(): follows).
  bool origin_through_event(std::uint64_t oom_events);

  /// Whether a failure counted now (`oom_events_now`) came after this rank's last freeze: no dump holds it yet.
  bool unreported(std::uint64_t oom_events_now) const { return oom_events_now > oom_events_covered_; }

  // --- Requests while a dump is under way, or after the one that holds their failure.

  /// What a request of this rank does (join()).
  enum class Turn {
    joins,     // the dump under way counts this rank an origin: it answers the request (its words: offer())
    covered,   // a dump is under way that does not count this rank an origin, and the request is not an oom one (the
               // API's dump, a signal's): that dump answers it
    follows,   // an oom request during a dump that does not count this rank an origin (its freeze held no new oom
               // event: the failure came after it, or a CPU job has no allocator events): its own dump follows that
               // one (failed_late(): the joint dump, when said in time)
    answered,  // no dump under way, and the last one holds its failure (answered()): last_result() is the answer
    asks,      // no dump under way: a new dump, number(), this rank its origin
  };

  /// The rule for a request of this rank, the same for both transports; the transport carries it out (MPI: the
  /// watcher runs the dump; the store: the asking thread). `oom_events_now`: the recorder's count. `say` gets the line
  /// to log at error level (offer(), answered()), or is cleared. Call it when !deciding() (a request made while the
  /// dump is still deciding is covered by it).
  Turn join(const DumpRequest& request, std::uint64_t oom_events_now, int rank, std::string& say);

  /// A request of this rank arrives while a dump is under way that counts this rank an origin (or may: the store
  /// transport's freeze is not over yet). The dump answers an oom request; its words go into the dump's reason when
  /// the dump awaits them (words()). Returns the line to log at error level ("rank 3 reports, in the dump under way:
  /// ..."), empty when the request has no words: the job's own error reaches the user whatever the archive says.
  std::string offer(const DumpRequest& request, int rank);

  /// Whether `request` is the failing thread's oom request of a failure that a finished dump already holds: its oom
  /// event made this rank an origin of that dump and no oom event came since (`oom_events_now`). Then that dump is
  /// the answer (last_result()), not a second archive of the same failure, and `say` gets the line to log at error
  /// level (empty when the request has no words).
  bool answered(const DumpRequest& request, std::uint64_t oom_events_now, int rank, std::string& say);

  /// In a dump that made this rank an origin through its oom event (origin_through_event()): waits, at most a little
  /// (200 ms, or a quarter of `dump_timeout` when that is less), for the failing thread's request, whose words and
  /// figures are the job's own, and returns it; nullopt when it did not come in time, when `stop` was set, or when
  /// the dump awaits none. Only once per dump. `lock` holds the transport's mutex.
  std::optional<DumpRequest> words(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, const bool& stop,
                                   std::chrono::milliseconds dump_timeout);

  // --- The joint dump (docs/protocol.md, "Two origins at once"): a rank fails during dump N after its freeze; its
  // own dump names N's origins too and replaces N's archive.

  /// This rank's failure came during the dump under way, after its freeze for it (the dump does not hold it): it
  /// says so at that dump's end, and its own dump, the joint one, follows. Not once that end said it (says_late()):
  /// the origins are gone then, and its own dump follows as a dump of its own.
  void failed_late() {
    if (late_said_in_ != number_) late_in_ = number_;
  }

  /// At the end of the dump under way (the transport's DONE message, the store's `dN/done/R`): whether this rank says
  /// it failed late in it. Said once: a failure after this is not said of this dump (failed_late()).
  bool says_late() {
    late_said_in_ = number_;
    return late_in_ == number_;
  }

  /// Whether failed_late() was said of dump `n`.
  bool failed_late_in(std::int64_t n) const { return late_in_ == n; }

  /// Whether this rank's request of `kind` for the next dump asks for the joint dump: it is an oom request, this rank
  /// failed late in the last dump, and that dump was an oom dump that wrote an archive (the one the joint dump
  /// replaces: last_result().path). After a dump of another kind, or one without an archive, its dump is its own.
  /// The rule both transports tell the others by (the store's cause, MPI's trigger).
  bool asks_joint(DumpKind kind) const {
    return kind == DumpKind::oom && failed_late_in(number_ - 1) &&
           last_result_.status == DumpResult::Status::archive && last_result_.kind == DumpKind::oom;
  }

  /// On an origin of the dump under way, which a rank said it failed late in: stay for that rank's dump. This
  /// rank is an origin of it too, with the same `request` and `batch`, and its archive replaces `path`.
  void expect_joint(const DumpRequest& request, std::int64_t batch, std::string path);

  /// Whether a joint dump is expected after dump number() - 1, or is under way.
  bool joint_expected() const { return joint_expected_; }
  const DumpRequest& joint_request() const { return joint_request_; }
  std::int64_t joint_batch() const { return joint_batch_; }
  const std::string& joint_path() const { return joint_path_; }

  /// How a wait for the joint dump ended.
  enum class Joint {
    not_expected,   // no joint dump follows the last dump: its result is the answer
    finished,       // the joint dump ended: last_result() is its result
    never_started,  // it did not start within OOMFLIGHT_DUMP_TIMEOUT (the late rank died): no longer expected
    unfinished,     // it started and did not end within 3 x OOMFLIGHT_DUMP_TIMEOUT
    stopped,        // the session ended meanwhile
  };

  /// A request that the last dump answered, on an origin of it: waits for the joint dump that follows when one is
  /// expected (it names this rank too, and returning first would end the job before it): its start within
  /// `dump_timeout`, then its end within 3 x `dump_timeout`; and, when a rank failed during that one too, the joint
  /// dump that follows it, alike. `lock` holds the transport's mutex; `stop` is its stop
  /// flag. Never call it on the thread that runs the transport's dumps.
  Joint await_joint(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, const bool& stop,
                    std::chrono::milliseconds dump_timeout);

 private:
  std::int64_t number_ = 0;
  bool under_way_ = false;
  DumpResult last_result_;
  bool exit_dumped_ = false;
  std::uint64_t ended_ = 0;
  bool deciding_ = false;                   // begin() to decided()
  DumpKind kind_ = DumpKind::oom;           // of the dump under way, as begin() was told
  bool origin_ = false;                     // of the dump under way
  std::uint64_t oom_events_covered_ = 0;    // oom events a dump of this rank as an origin holds
  std::uint64_t unclaimed_oom_events_ = 0;  // those that made it an origin through its event, until its thread asks
  bool awaiting_words_ = false;             // the dump under way awaits the failing thread's request
  std::optional<DumpRequest> words_;        // ... which came
  std::int64_t late_in_ = -1;               // the dump this rank failed late in
  std::int64_t late_said_in_ = -1;          // the dump whose end said whether this rank failed late in it
  bool joint_expected_ = false;
  std::int64_t joint_after_ = -1;           // the dump the joint one replaces
  DumpRequest joint_request_;
  std::int64_t joint_batch_ = -1;
  std::string joint_path_;
};

/// What a rank whose joint dump never came logs (DumpLedger::Joint::never_started).
inline constexpr const char* kJointNeverStartedText =
    "the dump of the rank that failed during this one did not start within OOMFLIGHT_DUMP_TIMEOUT";

}  // namespace oomflight
