// The store transport's dump (store_protocol.hpp; docs/protocol.md, "Jobs without MPI").
#include "store_protocol.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <utility>

#include "dump_outcome.hpp"
#include "dump_role.hpp"
#include "dump_run.hpp"
#include "dump_signal.hpp"
#include "dump_timeline.hpp"
#include "dump_words.hpp"
#include "environment.hpp"
#include "leave_rule.hpp"
#include "oomflight/base/log.hpp"
#include "oomflight/base/units.hpp"
#include "oomflight/format/archive_merge.hpp"
#include "oomflight/format/archive_writer.hpp"
#include "protocol_timing.hpp"
#include "retention.hpp"
#include "agreed_settings.hpp"
#include "snapshot_dump.hpp"
#include "store_pacing.hpp"

namespace oomflight {
namespace {

// 2: the hello holds the pid namespace (node peers, issue 40); 3: the network namespace and the watcher's doorbell.
constexpr int kHelloVersion = 3;
// Fields as "<size>\n<bytes>" one after another: any byte may occur in a field (a reason has newlines).
std::string pack(const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) {
    out += std::to_string(f.size());
    out += '\n';
    out += f;
  }
  return out;
}

std::optional<std::vector<std::string>> unpack(const std::string& text) {
  std::vector<std::string> fields;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t nl = text.find('\n', at);
    if (nl == std::string::npos) return std::nullopt;
    std::size_t size = 0;
    const auto [end, ec] = std::from_chars(text.data() + at, text.data() + nl, size);
    if (ec != std::errc() || end != text.data() + nl || size > text.size() - nl - 1) return std::nullopt;
    fields.push_back(text.substr(nl + 1, size));
    at = nl + 1 + size;
  }
  return fields;
}

std::optional<std::int64_t> to_int(const std::string& s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

void sleep_for(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

// "0,2,3" (ranks as the cause and dN/merged write them; "" is none), or nullopt when an entry is not a rank.
std::optional<std::vector<std::int32_t>> to_ranks(const std::string& text) {
  std::vector<std::int32_t> ranks;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const auto r = to_int(text.substr(at, comma - at));
    if (!r || *r < 0 || *r > INT32_MAX) return std::nullopt;
    ranks.push_back(static_cast<std::int32_t>(*r));
    at = comma + 1;
  }
  return ranks;
}

}  // namespace

StoreProtocol::StoreProtocol(const Config& config, RankIdentity& identity, std::mutex& identity_mutex,
                             std::mutex& files_mutex, Recorder& recorder, DumpExecutor& executor,
                             std::unique_ptr<StoreClient> store, HeadroomWatch* headroom)
    : Coordinator(config, identity, recorder, executor, headroom),
      id_(identity), identity_mutex_(identity_mutex), executor_(executor),
      store_(std::make_unique<StoreHandle>(std::move(store))), pacing_(store_pacing(config.poll_interval, identity.world_size)),
      files_mutex_(files_mutex) {
  // Rank 0 gives up on missing hellos after one deadline; the others wait for its verdict one deadline more (rank 0
  // may have started later than they did).
  agree_deadline_ns_ = monotonic_ns() + to_ns(config_.dump_timeout) * (identity.rank == 0 ? 1 : 2);
  std::vector<std::string> hello = {std::to_string(kHelloVersion)};
  for (std::string& v : agreed_setting_values(config_)) hello.push_back(std::move(v));
  hello.push_back(id_.run_name);  // rank 0's (configured or generated) is everyone's
  hello.push_back(id_.job_id);
  hello.push_back(id_.host);
  hello.push_back(std::to_string(id_.pid));
  hello.push_back(own_namespace("pid").text());  // "": not watched by its peers
  hello.push_back(own_namespace("net").text());  // "": its doorbell is not rung by its peers
  hello.push_back(doorbell_text(doorbell_.address()));
  store_->set(fmt::format("hello/{}", id_.rank), pack(hello));  // throws: the caller reports it, nothing started
  store_->add("hellos", 1);  // rank 0's watcher reads the hellos once all are there, and publishes its verdict
  // A launcher that loses one worker stops the others with SIGTERM (torchrun: then SIGKILL 30 s later): a rank
  // busy with a dump finishes it first, so that the survivors' histories still reach one archive.
  start_watcher();
  // Once there is a watcher to act on their flags (which it reads under the mutex: signal_flags).
  const bool exit_signal = install_exit_signal();
  const bool dump_signal = install_dump_signal();  // SIGUSR1 to any rank: every rank's history, and the job goes on
  std::lock_guard lock(mutex_);
  term_handler_ = exit_signal;
  usr1_handler_ = dump_signal;
}

StoreProtocol::~StoreProtocol() {
  shutdown(false);
  if (watcher_.joinable()) watcher_.detach();  // shutdown left it behind (stuck in a store call); it ends on stop_
}

std::string StoreProtocol::key(std::int64_t n, const std::string& what) const { return fmt::format("d{}/{}", n, what); }

std::string StoreProtocol::encode(const Cause& c) {
  return pack({std::to_string(c.origin), std::to_string(static_cast<int>(c.kind)), std::to_string(c.batch),
               std::to_string(c.requested_bytes), std::to_string(c.device_free_bytes),
               std::to_string(c.numbers_from_message), c.reason, c.replaces,
               fmt::format("{}", fmt::join(c.joint_origins, ","))});
}

std::optional<StoreProtocol::Cause> StoreProtocol::decode(const std::string& text) {
  const auto f = unpack(text);
  if (!f || f->size() != 9) return std::nullopt;
  const auto origin = to_int((*f)[0]), kind = to_int((*f)[1]), batch = to_int((*f)[2]), requested = to_int((*f)[3]),
             free = to_int((*f)[4]), from = to_int((*f)[5]);
  if (!origin || !kind || !batch || !requested || !free || !from || *kind < 0 || *kind >= kDumpKindCount) {
    return std::nullopt;
  }
  Cause c;
  c.origin = static_cast<int>(*origin);
  c.kind = static_cast<DumpKind>(*kind);
  c.batch = *batch;
  c.requested_bytes = static_cast<std::uint64_t>(*requested);
  c.device_free_bytes = static_cast<std::uint64_t>(*free);
  c.numbers_from_message = static_cast<std::uint32_t>(*from);
  c.reason = (*f)[6];
  c.replaces = (*f)[7];
  auto joint = to_ranks((*f)[8]);
  if (!joint) return std::nullopt;
  c.joint_origins = std::move(*joint);
  return c;
}

bool StoreProtocol::try_agree(std::int64_t deadline_ns) {
  // Rank 0 alone reads the hellos and publishes its verdict: one key every other rank reads, so that the agreement
  // costs the store O(world size) requests, not one read of every hello by every rank (262,144 at 512 ranks).
  if (id_.rank != 0) return take_verdict(deadline_ns);
  const int size = id_.world_size;
  if (store_->add("hellos", 0) < size && monotonic_ns() < deadline_ns) return false;
  std::vector<std::vector<std::string>> hellos(static_cast<std::size_t>(size));
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    const auto text = store_->get(fmt::format("hello/{}", r));
    const auto fields = text ? unpack(*text) : std::nullopt;
    if (!fields) {
      missing.push_back(r);
      continue;
    }
    hellos[static_cast<std::size_t>(r)] = *fields;
  }
  const std::size_t settings = agreed_setting_values(config_).size();
  std::string problem;
  if (!missing.empty()) {
    if (monotonic_ns() < deadline_ns) return false;
    problem = fmt::format("{} {} did not join the job's store within {} (OOMFLIGHT_DUMP_TIMEOUT)",
                          missing.size() == 1 ? "rank" : "ranks", rank_ranges(missing),
                          format_seconds(static_cast<double>(config_.dump_timeout.count()) / 1000.0));
  } else {
    for (int r = 0; r < size; ++r) {
      const auto& h = hellos[static_cast<std::size_t>(r)];
      if (h.size() != settings + 8 || h[0] != std::to_string(kHelloVersion)) {
        problem = fmt::format("rank {} runs another version of oomflight (its hello does not read)", r);
        break;
      }
    }
  }
  if (problem.empty()) {
    std::vector<std::vector<std::string>> values(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      const auto& h = hellos[static_cast<std::size_t>(r)];
      values[static_cast<std::size_t>(r)].assign(h.begin() + 1, h.begin() + 1 + static_cast<std::ptrdiff_t>(settings));
    }
    problem = settings_mismatch(values);  // the MPI agreement's words (agreed_settings.hpp)
  }
  const std::vector<std::string> verdict =
      problem.empty() ? std::vector<std::string>{std::to_string(kHelloVersion), "ok", hellos[0][1 + settings],
                                                 hellos[0][2 + settings]}
                      : std::vector<std::string>{std::to_string(kHelloVersion), "off", problem};
  if (problem.empty()) publish_node_peers(hellos, settings);  // before the verdict: read once it is there
  store_->set("agreement", pack(verdict));
  adopt_verdict(verdict);
  return true;
}

void StoreProtocol::publish_node_peers(const std::vector<std::vector<std::string>>& hellos, std::size_t settings) {
  // The ranks of each node (same host, same pid namespace), so that each can watch the others' processes for an end
  // without a word (os._exit, a signal), and ring their watchers' doorbells with a trigger, as over MPI
  // (peer_processes.hpp, watcher_doorbell.hpp). One key per rank that has peers: node/R = "rank pid doorbell" of
  // each other rank of R's node, the doorbell "-" where the two are not in one network namespace (an abstract
  // socket's name is per namespace); rank 0 sets them (O(world size) requests, as the hellos).
  struct Peer {
    int rank;
    const std::string& pid;
    const std::string& net;
    const std::string& doorbell;
  };
  std::map<std::string, std::vector<Peer>> nodes;
  for (int r = 0; r < static_cast<int>(hellos.size()); ++r) {
    const auto& h = hellos[static_cast<std::size_t>(r)];
    if (h[settings + 5].empty()) continue;  // its pid namespace could not be read
    nodes[h[settings + 3] + '\n' + h[settings + 5]].push_back({r, h[settings + 4], h[settings + 6], h[settings + 7]});
  }
  for (const auto& [node, ranks] : nodes) {
    if (ranks.size() < 2) continue;
    for (const Peer& r : ranks) {
      std::vector<std::string> peers;
      for (const Peer& q : ranks) {
        const bool ringable = !q.doorbell.empty() && !q.net.empty() && q.net == r.net;
        if (q.rank != r.rank) peers.push_back(fmt::format("{} {} {}", q.rank, q.pid, ringable ? q.doorbell : "-"));
      }
      if (r.rank == 0) {
        start_watching(peers);
      } else {
        store_->set(fmt::format("node/{}", r.rank), pack(peers));
      }
    }
  }
}

void StoreProtocol::start_watching(const std::vector<std::string>& peers) {
  std::vector<PeerProcesses::Peer> processes;
  std::vector<DoorbellAddress> doorbells;
  for (const std::string& p : peers) {
    // "rank pid doorbell" (see publish_node_peers); a field that does not read leaves that peer out of what it
    // serves: an unwatched process is learnt of at the deadline, an unrung watcher sees the trigger at its poll.
    const std::size_t space = p.find(' ');
    const std::size_t second = space == std::string::npos ? space : p.find(' ', space + 1);
    const auto rank = to_int(p.substr(0, space));
    const std::int64_t pid =
        space == std::string::npos ? 0 : to_int(p.substr(space + 1, second - space - 1)).value_or(0);
    if (!rank || *rank < 0 || *rank >= id_.world_size || *rank == id_.rank) continue;
    if (pid > 0) processes.push_back({static_cast<int>(*rank), pid});
    if (second == std::string::npos) continue;
    if (const auto bell = doorbell_from_text(p.substr(second + 1)); bell && bell->length > 0) {
      doorbells.push_back(*bell);
    }
  }
  auto watched = processes.empty() ? nullptr : std::make_unique<PeerProcesses>(processes);
  std::lock_guard lock(peers_mutex_);
  if (watched) node_peers_ = std::move(watched);
  node_doorbells_ = std::move(doorbells);
}

void StoreProtocol::ring_node_peers() {
  std::lock_guard lock(peers_mutex_);
  for (const DoorbellAddress& peer : node_doorbells_) doorbell_.ring(peer);
}

void StoreProtocol::notice_vanished() {
  std::vector<int> ended;
  {
    std::lock_guard lock(peers_mutex_);
    if (!node_peers_) return;
    ended = node_peers_->newly_ended();
  }
  for (int r : ended) {
    try {
      // One rank of the node speaks for it (the first whose add gives 1), and only when it said nothing itself: a
      // rank counted as ending normally, or as left, is counted once.
      if (store_->add(fmt::format("vanished/{}", r), 1) != 1) continue;
      if (store_->get(fmt::format("ending/{}", r)) || store_->get(fmt::format("left/{}", r))) continue;
      store_->set(fmt::format("silent/{}", r), "1");  // what a dump's summary says of it (dump_words.hpp)
      store_->set(fmt::format("left/{}", r), "0");    // it answers no dump whose file it did not write
      store_->add("left", 1);
      store_->add("left_early", 1);
      log().info("rank {} ended without a word (its process is gone: killed, os._exit or a crash); no dump waits "
                 "for it",
                 r);
    } catch (const std::exception& e) {
      log().debug("cannot tell the job's store that rank {} ended: {}", r, e.what());
    }
  }
}

bool StoreProtocol::take_verdict(std::int64_t deadline_ns) {
  const auto text = store_->get("agreement");
  if (!text) {
    if (monotonic_ns() < deadline_ns) return false;
    verdict_late_ = true;  // the watcher still looks for it, slowly
    adopt_verdict({std::to_string(kHelloVersion), "off",
                   fmt::format("rank 0 did not publish the ranks' agreement within {} (2 x OOMFLIGHT_DUMP_TIMEOUT)",
                               format_seconds(2.0 * static_cast<double>(config_.dump_timeout.count()) / 1000.0))});
    return true;
  }
  const auto fields = unpack(*text);
  const bool reads =
      fields && !fields->empty() && (*fields)[0] == std::to_string(kHelloVersion) &&
      (((*fields).size() == 4 && (*fields)[1] == "ok") || ((*fields).size() == 3 && (*fields)[1] == "off"));
  if (!reads) {
    adopt_verdict({std::to_string(kHelloVersion), "off",
                   "rank 0 runs another version of oomflight (its agreement does not read)"});
    return true;
  }
  adopt_verdict(*fields);
  return true;
}

void StoreProtocol::adopt_verdict(const std::vector<std::string>& verdict) {
  if (verdict[1] != "ok") {
    log().error("{}; no dump is coordinated between ranks in this job: each rank writes its own file", verdict[2]);
    std::lock_guard lock(mutex_);
    state_ = State::off;
    return;
  }
  {
    // The batch lock first (the order of take_snapshot, which reads the identity under it and then asks agreed()).
    std::scoped_lock lock(identity_mutex_, mutex_);
    id_.run_name = verdict[2];
    id_.job_id = verdict[3];
    state_ = State::agreed;
  }
  recorder_.context().set_environment(capture_environment(id_, config_));
  log().debug("{} ranks joined through the job's store; run {}", id_.world_size, id_.run_name);
  if (id_.rank != 0) {
    try {
      if (const auto text = store_->get(fmt::format("node/{}", id_.rank))) {
        if (const auto peers = unpack(*text)) start_watching(*peers);
      }
    } catch (const std::exception& e) {
      log().debug("the ranks of this node are not watched: {}", e.what());
    }
  }
}

bool StoreProtocol::wait_agreed(std::unique_lock<std::mutex>& lock) {
  // The agreement is the watcher's; a dump this early waits for it (the others are starting too), within its bound.
  const auto left = std::chrono::nanoseconds(std::max<std::int64_t>(0, agree_deadline_ns_ - monotonic_ns()));
  cv_.wait_for(lock, left + pacing_.idle * 4, [&] { return state_ != State::agreeing || stop_; });
  return state_ == State::agreed;
}

Coordinator::SignalFlags StoreProtocol::signal_flags() {
  // SIGUSR1 once the agreement said whether the ranks coordinate (a request waits for it, and it is this thread's);
  // SIGTERM at once, whatever the state (torchrun's SIGKILL follows 30 s later).
  return SignalFlags{.usr1 = usr1_handler_ && state_ != State::agreeing,
                     .term = term_handler_,
                     .leaving = left_,
                     .dump_on_exit = config_.dump_on_exit,
                     .coordinated = state_ == State::agreed,
                     .headroom = !stop_ && !left_};
}

void StoreProtocol::tell_left_on_signal() {
  // The process ends on a signal: no dump after this one may wait for it (the others learn it now, not at their
  // deadline). A rank already counted as ending normally is not counted again as leaving early.
  std::int64_t reached = 0;
  bool agreed = false, ending = false;
  {
    std::lock_guard lock(mutex_);
    reached = ledger_.number();
    agreed = state_ == State::agreed;
    ending = said_ending_;
  }
  if (agreed) tell_left(reached, !ending);
}

bool StoreProtocol::state_off() {
  std::lock_guard lock(mutex_);
  return state_ == State::off;
}

bool StoreProtocol::agreed() {
  std::lock_guard lock(mutex_);
  return state_ == State::agreed && !stop_;
}

bool StoreProtocol::coordinates() {
  std::lock_guard lock(mutex_);
  return state_ == State::agreed;
}

bool StoreProtocol::agreeing() {
  std::lock_guard lock(mutex_);
  return state_ == State::agreeing && !stop_;
}

bool StoreProtocol::await_agreement() {
  std::unique_lock lock(mutex_);
  return wait_agreed(lock) && !stop_;
}

std::string StoreProtocol::why_alone() {
  std::lock_guard lock(mutex_);
  if (stop_) return "after this rank left the job's store";
  if (state_ == State::agreeing) return "before the job's ranks agreed at start to coordinate their dumps";
  return "the job's ranks did not agree at start to coordinate their dumps";
}

bool StoreProtocol::take_snapshot(const SnapshotWindow& window,
                                  const std::function<FrozenHistory(std::vector<Event>)>& freeze) {
  if (!agreed()) return false;  // asked before the files' lock: never with it
  // This rank's window in its rank-local file, here (on the batch thread, as one process writes its snapshot); the
  // rank whose file completes the window merges them on its watcher, so that no training thread waits for another.
  const FrozenHistory h = freeze({});
  const WindowDump part = window_dump(executor_, h, window, id_.rank);
  std::string mine;
  {
    const auto files = lock_files();
    mine = executor_.write_rank_local(part.header, part.view(h), DumpKind::snapshot, window.first,
                                      Durability::verified);
  }
  snapshot_written(window.first, window.last, mine);
  return true;
}

bool StoreProtocol::end(bool normal, bool /*error*/) {
  shutdown(normal);
  return true;
}

void StoreProtocol::stop_watching_peers() {
  std::lock_guard lock(peers_mutex_);
  node_peers_.reset();
}

void StoreProtocol::snapshot_written(std::int64_t first_batch, std::int64_t last_batch, const std::string& path) {
  try {
    store_->set(fmt::format("s{}/file/{}", first_batch, id_.rank), path);
    if (store_->add(fmt::format("s{}/files", first_batch), 1) < id_.world_size) return;
    {
      std::lock_guard lock(mutex_);
      snapshots_to_merge_.emplace_back(first_batch, last_batch);
    }
    doorbell_.ring();  // the watcher merges it at its next look
  } catch (const std::exception& e) {
    log().warn("snapshot of batches {} to {}: this rank's history stays in {} ({})", first_batch, last_batch, path,
               e.what());
  }
}

void StoreProtocol::merge_snapshot(std::int64_t first_batch, std::int64_t last_batch) {
  const std::int64_t start = monotonic_ns();
  std::vector<std::int32_t> ranks;
  const std::vector<std::string> files = visible_files(fmt::format("s{}/file/", first_batch), &ranks);
  try {
    const std::string path = executor_.archive_path(DumpKind::snapshot, first_batch);
    const auto lock = lock_files();
    merge_archives(files, path);
    if (!config_.keep_rank_files) {
      for (const std::string& f : files) {
        std::error_code ec;
        std::filesystem::remove(f, ec);  // the archive holds them now, verified
      }
    }
    log().info("snapshot of batches {} to {}: archive {} written by {} of {} ranks in {}", first_batch, last_batch,
               path, files.size(), id_.world_size, format_seconds(seconds_since(start)));
    prune_archives(path, id_.run_name, id_.job_id, config_);
  } catch (const std::exception& e) {
    log().error("snapshot of batches {} to {}: the ranks' files stay as they are: {}", first_batch, last_batch,
                e.what());
  }
}

void StoreProtocol::look_for_dump(const WatcherDoorbell::Rings& rings) {
  const std::int64_t now = monotonic_ns();
  if (state_off()) {
    if (verdict_late_ && now >= next_store_ns_) {
      // This rank gave up on rank 0's verdict; rank 0 may still publish one (it started late): adopt it then, or
      // this rank would stay out of every dump the others coordinate.
      next_store_ns_ = now + to_ns(pacing_.idle * 10);
      try {
        if (store_->get("agreement")) {
          verdict_late_ = false;
          log().info("rank 0's agreement came after this rank's deadline; it holds from now on");
          take_verdict(now);  // adopts it: coordinated from now on, or off for rank 0's reason
          cv_.notify_all();
        }
      } catch (const std::exception& e) {
        log().debug("the job's store: {}", e.what());
      }
    }
    return;
  }
  // The store is asked at the job's pace (store_pacing.hpp), or at once when a rank of this node wrote a dump's
  // cause and rang this doorbell (issue 40, item 7).
  if (now < next_store_ns_ && !rings.other) return;
  next_store_ns_ = now + to_ns(pacing_.idle);
  // The store answered again after failures: said once, with their count.
  const auto answered = [&] {
    if (failures_ == 0) return;
    log().info("the job's store answers again, after {} failed {}", store_failures_,
               store_failures_ == 1 ? "look" : "looks");
    failures_ = 0;
    store_failures_ = 0;
  };
  try {
    State state;
    {
      std::lock_guard lock(mutex_);
      state = state_;
    }
    if (state == State::agreeing) {
      if (try_agree(agree_deadline_ns_)) cv_.notify_all();
      answered();
      return;
    }
    std::int64_t n = 0;
    {
      std::lock_guard lock(mutex_);
      if (ledger_.under_way()) return;
      n = ledger_.number();
    }
    notice_vanished();
    const auto text = store_->get(key(n, "cause"));
    answered();
    if (text) {
      run_heard(n, *text, rings);
      return;
    }
    // No dump to answer: a snapshot window this rank completed is merged now.
    std::optional<std::pair<std::int64_t, std::int64_t>> window;
    {
      std::lock_guard lock(mutex_);
      if (!snapshots_to_merge_.empty()) {
        window = snapshots_to_merge_.front();
        snapshots_to_merge_.erase(snapshots_to_merge_.begin());
      }
    }
    if (window) merge_snapshot(window->first, window->second);
  } catch (const std::exception& e) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;  // the store was let go of under this look (leave): not a failure of the store's
    }
    store_failed(e);
    // Back off, doubling up to 30 s: a store that went away must cost neither a core nor the job's log (torch
    // may log each failed request of its own).
    const std::int64_t backoff = std::min<std::int64_t>(to_ns(pacing_.idle * 10) << std::min(failures_, 12),
                                                        30'000'000'000);
    ++failures_;
    next_store_ns_ = monotonic_ns() + backoff;
  }
}

void StoreProtocol::run_heard(std::int64_t n, const std::string& text, const WatcherDoorbell::Rings& rings) {
  const std::optional<Cause> decoded = decode(text);
  if (!decoded) {
    log().error("dump {}: the cause in the job's store does not read; dumping as for an out-of-memory error", n);
  }
  // Read by tell_others() when this rank enters dump n as another rank's (not when a request of its own is due: it
  // is then that dump's origin, and reads the cause back itself).
  heard_cause_ = decoded.value_or(Cause{});
  log().debug("dump {}'s cause from rank {} seen {}", n, heard_cause_.origin,
              rings.other ? "at once (a rank of this node rang)" : "at a look");
  (void)enter_dump(heard_cause_.kind, n);
}

void StoreProtocol::store_failed(const std::exception& e) {
  if (store_failures_++ == 0) {
    log().warn("the job's store failed: {}; oomflight asks it again less and less often, and says how many more "
               "looks failed when it answers again or this rank ends",
               e.what());
  }
}

std::optional<DumpResult> StoreProtocol::request(const DumpRequest& request) {
  std::unique_lock lock(mutex_);
  if (!wait_agreed(lock) || stop_) return std::nullopt;
  return requests_.request(lock, request);  // the watcher runs the dump (enter_dump)
}

std::int64_t StoreProtocol::ask_others(const DumpRequest& request, std::int64_t batch, std::int64_t number) {
  return tell_cause(number, cause_for(request, batch, false));
}

StoreProtocol::Cause StoreProtocol::cause_for(const DumpRequest& request, std::int64_t batch, bool say) {
  Cause cause{id_.rank, request.kind, batch, request.requested_bytes, request.device_free_bytes,
              request.numbers_from_message, request.reason, {}, {}};
  std::lock_guard lock(mutex_);
  const DumpResult& last = ledger_.last_result();
  if (!ledger_.asks_joint(request.kind)) return cause;  // the ledger's rule, MPI's trigger's too
  // The joint archive keeps the name and batch of the one it replaces.
  cause.replaces = last.path;
  cause.joint_origins.assign(last.origin_ranks.begin(), last.origin_ranks.end());
  cause.batch = last.batch;
  if (say) {
    log().info("rank {}'s dump names the last dump's {} too and replaces {}", id_.rank,
               last.origin_ranks.size() == 1 ? "origin" : "origins", last.path);
  }
  return cause;
}

std::int64_t StoreProtocol::tell_cause(std::int64_t n, const Cause& cause) {
  // The first origin (the add gives it 1) writes the cause at once, before its freeze: the others start theirs
  // meanwhile, and no window is left between the trigger and the cause in which its death would hide the dump.
  try {
    const std::int64_t order = store_->add(key(n, "trigger"), 1);
    if (order == 1) {
      store_->set(key(n, "cause"), encode(cause));
      ring_node_peers();  // their watchers look at the store now (over MPI: the triggers' doorbells)
    }
    return order;
  } catch (const std::exception& e) {
    log().error("cannot tell the other ranks through the job's store: {}", e.what());
    return 0;
  }
}

bool StoreProtocol::heard_is_joint() {
  // The late origin's cause names the archive it replaces and the origins that rejoin: a dump of another rank's
  // failure, after a joint dump that never came, is not it.
  return (!heard_cause_.replaces.empty() && heard_cause_.replaces == ledger_.joint_path()) ||
         std::find(heard_cause_.joint_origins.begin(), heard_cause_.joint_origins.end(), id_.rank) !=
             heard_cause_.joint_origins.end();
}

bool StoreProtocol::tell_others(DumpEntry entry, bool through_event, std::int64_t asked, FrozenHistory& h,
                                const DumpRequest& request) {
  std::int64_t n = 0;
  {
    std::lock_guard lock(mutex_);
    n = ledger_.number();
  }
  dump_number_ = n;
  if (entry != DumpEntry::asked) {
    cause_ = heard_cause_;  // a rejoining origin's too: the late origin's cause names this rank's first dump
    if (through_event) {
      try {
        store_->add(key(n, "trigger"), 1);  // an origin's trigger, as tell_cause() adds it
      } catch (const std::exception& e) {
        log().warn("the job's store: {}", e.what());
      }
    }
    return true;
  }
  Cause cause = cause_for(request, h.batch, asked == 0);
  // Told by the request before its freeze, or now (a dump was under way when it asked).
  const std::int64_t order = asked != 0 ? asked : tell_cause(n, cause);
  h.batch = cause.batch;
  if (order > 1) {
    // Another rank asked first: its cause names the dump (kind and batch alike in every rank's file). It is
    // written right after its trigger, so this waits a round trip, at most a second.
    const auto bound = std::min<std::int64_t>(to_ns(config_.dump_timeout), 1'000'000'000);
    if (const auto c = wait_for_cause(n, monotonic_ns() + bound)) cause = *c;
  }
  cause_ = std::move(cause);
  // A dump the others never heard of (the store failed at its trigger) does not count.
  return order != 0;
}

std::optional<StoreProtocol::Cause> StoreProtocol::wait_for_cause(std::int64_t n, std::int64_t deadline_ns) {
  for (;;) {
    try {
      if (const auto text = store_->get(key(n, "cause"))) return decode(*text);
    } catch (const std::exception& e) {
      log().warn("the job's store: {}", e.what());
      return std::nullopt;
    }
    if (monotonic_ns() >= deadline_ns) return std::nullopt;
    sleep_for(pacing_.wait);
  }
}

std::optional<std::vector<std::string>> StoreProtocol::wait_merged(std::int64_t n, std::int64_t until_ns) {
  for (;;) {
    if (const auto text = store_->get(key(n, "merged"))) return unpack(*text);
    if (monotonic_ns() >= until_ns) return std::nullopt;
    sleep_for(pacing_.wait);
  }
}

bool StoreProtocol::every_rank_answered(std::int64_t n, std::vector<char>& answered) {
  const int size = id_.world_size;
  if (store_->add(key(n, "files"), 0) >= size) return true;
  if (store_->add("left", 0) == 0) return false;
  // Some rank left: a rank whose session ended before dump n will never answer it. A rank seen to have answered
  // (or left) stays so, and the look stops at the first that has not: a poll is a few requests, not two a rank.
  answered.resize(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    char& known = answered[static_cast<std::size_t>(r)];
    if (known) continue;
    if (!store_->get(key(n, fmt::format("file/{}", r)))) {
      const auto left_at = store_->get(fmt::format("left/{}", r));
      const auto reached = left_at ? to_int(*left_at) : std::nullopt;
      if (!reached || *reached > n) return false;
    }
    known = 1;
  }
  return true;
}

std::vector<std::string> StoreProtocol::visible_files(const std::string& prefix, std::vector<std::int32_t>* ranks) {
  std::vector<std::string> files;
  std::vector<int> elsewhere;
  for (int r = 0; r < id_.world_size; ++r) {
    if (auto path = store_->get(fmt::format("{}{}", prefix, r))) {
      std::error_code ec;
      if (!std::filesystem::exists(*path, ec)) {
        // Written on another host's own disk (a node-local folder, the $TMPDIR fallback): it stays there, and the
        // archive is merged without it (the result names the rank as missing).
        elsewhere.push_back(r);
        continue;
      }
      files.push_back(std::move(*path));
      ranks->push_back(r);
    }
  }
  if (!elsewhere.empty()) {
    log().warn("the files of {} {} are not visible from this host: the archive is merged without them (they stay "
               "on their hosts; oomflight merge joins them later)",
               elsewhere.size() == 1 ? "rank" : "ranks", rank_ranges(elsewhere));
  }
  return files;
}

std::string StoreProtocol::merge(std::int64_t n, DumpKind kind, std::int64_t batch, const std::string& replaces,
                                 std::vector<std::int32_t>* ranks) {
  const std::vector<std::string> files = visible_files(key(n, "file/"), ranks);
  try {
    // A joint dump's archive takes the name of the one it replaces (written under a partial name, then renamed
    // over it: the first archive stands until the joint one is complete).
    const std::string path = replaces.empty() ? executor_.archive_path(kind, batch) : replaces;
    const auto lock = lock_files();
    const ArchiveHeader merged = merge_archives(files, path);
    // The archive's origins are the union of the files' (a rank may have become one after the cause was written):
    // every rank's summary and result name them all.
    return pack({"ok", path, fmt::format("{}", fmt::join(*ranks, ",")),
                 fmt::format("{}", fmt::join(merged.origin_ranks, ","))});
  } catch (const std::exception& e) {
    log().error("cannot merge the ranks' files into one archive: {}", e.what());
    return pack({"failed", e.what()});
  }
}

DumpFacts StoreProtocol::facts_known(const FrozenHistory& /*h*/, bool is_origin, const DumpRequest& /*request*/) {
  // Every rank's file of the dump says what its cause says (the first origin's words and figures), and names
  // every origin this rank knows of.
  DumpFacts f;
  f.kind = cause_.kind;
  f.batch = cause_.batch;
  f.origins = cause_.joint_origins;
  f.origins.push_back(cause_.origin);
  if (is_origin) f.origins.push_back(id_.rank);
  std::sort(f.origins.begin(), f.origins.end());
  f.origins.erase(std::unique(f.origins.begin(), f.origins.end()), f.origins.end());
  f.requested_bytes = cause_.requested_bytes;
  f.device_free_bytes = cause_.device_free_bytes;
  f.numbers_from_message = cause_.numbers_from_message;
  f.reason = cause_.reason;
  return f;
}

AssembledDump StoreProtocol::assemble(FrozenHistory& h, bool is_origin, const DumpRequest& request,
                                      const std::string& mine, std::int64_t deadline, DumpTimeline& timeline) {
  const std::int64_t n = dump_number_;
  const Cause& cause = cause_;
  const int me = id_.rank;
  const int size = id_.world_size;
  AssembledDump a;
  a.facts = facts_known(h, is_origin, request);

  // Say that this rank's file is written, wait for the others' (or the deadline), and let the lowest rank with a
  // file merge them.
  std::optional<std::vector<std::string>> merged;
  std::vector<std::int32_t> merged_ranks;
  try {
    if (!mine.empty()) {
      store_->set(key(n, fmt::format("file/{}", me)), mine);
      store_->add(key(n, "files"), 1);
    }
    std::vector<char> answered;  // per rank: its file or its leave before dump n was seen
    while (!every_rank_answered(n, answered) && monotonic_ns() < deadline) {
      notice_vanished();  // a rank of this node that died without its file is not waited for
      sleep_for(pacing_.wait);
    }
    timeline.mark("every rank's file");
    int lowest = -1;
    for (int q = 0; q < me && lowest < 0; ++q) {
      if (store_->get(key(n, fmt::format("file/{}", q)))) lowest = q;
    }
    if (lowest < 0 && !mine.empty() && store_->add(key(n, "claim"), 1) == 1) {
      const std::string text = merge(n, cause.kind, cause.batch, cause.replaces, &merged_ranks);
      store_->set(key(n, "merged"), text);
      merged = unpack(text);
      timeline.mark("merge");
    } else {
      // The merger writes it after its own wait: up to one more deadline.
      merged = wait_merged(n, deadline + to_ns(config_.dump_timeout));
      if (!merged && !mine.empty()) {
        if (store_->add(key(n, "claim_late"), 1) == 1) {
          // The merging rank died or stalled after its claim: the first rank to get here merges instead.
          log().warn("dump {}: no rank merged the histories within the deadline; this rank merges them", n);
          const std::string text = merge(n, cause.kind, cause.batch, cause.replaces, &merged_ranks);
          store_->set(key(n, "merged"), text);
          merged = unpack(text);
        } else {
          merged = wait_merged(n, monotonic_ns() + to_ns(config_.dump_timeout));  // the late merger's turn
        }
      }
      timeline.mark("the merge");
    }
  } catch (const std::exception& e) {
    a.error = fmt::format("the job's store failed during the dump: {}", e.what());
    log().error("{}", a.error);
    return a;
  }

  // The archive, if this rank is in it; else why not.
  const auto rank_list = [](const std::string& text) { return to_ranks(text).value_or(std::vector<std::int32_t>{}); };
  const bool merged_ok = merged && merged->size() == 4 && (*merged)[0] == "ok";
  if (merged_ok) {
    merged_ranks = rank_list((*merged)[2]);
    // The archive's origins are the union of the files' (a rank may have become one after the cause was written).
    if (auto all = rank_list((*merged)[3]); !all.empty()) a.facts.origins = std::move(all);
  }
  const bool in_archive =
      merged_ok && std::find(merged_ranks.begin(), merged_ranks.end(), me) != merged_ranks.end();
  if (!in_archive) {
    const std::string detail = merged && merged->size() > 1 ? (*merged)[1] : "";
    a.error = !merged     ? "no rank merged the histories into one archive in time"
              : merged_ok ? "this rank's history came too late for the archive " + detail
                          : "the merge into one archive failed: " + detail;
    return a;
  }
  a.archive = true;
  a.path = (*merged)[1];
  a.ranks_written = static_cast<int>(merged_ranks.size());
  a.replaces = cause.replaces;
  a.speaks = is_origin && me == cause.origin;  // one line per dump, from the origin that named it
  a.prunes = merged_ranks.front() == me;       // the rank that merged it
  // Who is not in it, and why: its session had ended before this dump, or it did not answer in time.
  std::vector<int> missing, left, vanished, elsewhere;
  for (int q = 0; q < size; ++q) {
    if (std::find(merged_ranks.begin(), merged_ranks.end(), q) != merged_ranks.end()) continue;
    std::optional<std::int64_t> reached;
    bool wrote = false, silent = false;
    try {
      wrote = store_->get(key(n, fmt::format("file/{}", q))).has_value();
      if (const auto text = store_->get(fmt::format("left/{}", q))) reached = to_int(*text);
      silent = reached && store_->get(fmt::format("silent/{}", q));  // a peer spoke for it (notice_vanished)
    } catch (const std::exception&) {
    }
    (wrote ? elsewhere : reached && *reached <= n ? left : missing).push_back(q);
    if (!wrote && silent) vanished.push_back(q);
  }
  if (!left.empty()) a.error = gone_ranks_text(left, vanished, true);  // the MPI transport's words
  if (!elsewhere.empty()) {
    a.error += fmt::format("{}{} {} wrote {} history where the merging rank could not read it (or too late): {} "
                           "rank-local {}", a.error.empty() ? "" : "; ", elsewhere.size() == 1 ? "rank" : "ranks",
                           rank_ranges(elsewhere), elsewhere.size() == 1 ? "its" : "their",
                           elsewhere.size() == 1 ? "its" : "their", elsewhere.size() == 1 ? "file" : "files");
  }
  if (!missing.empty()) {
    a.error += fmt::format("{}{} {} did not write a history within {} (OOMFLIGHT_DUMP_TIMEOUT)",
                           a.error.empty() ? "" : "; ", missing.size() == 1 ? "rank" : "ranks", rank_ranges(missing),
                           format_seconds(static_cast<double>(config_.dump_timeout.count()) / 1000.0));
  }
  return a;
}

std::vector<int> StoreProtocol::end_dump(bool is_origin, const std::vector<std::int32_t>& /*origins*/, bool late,
                                         bool wrote, std::int64_t deadline_ns) {
  const std::int64_t n = dump_number_;
  std::vector<int> late_ranks;
  try {
    if (late) store_->add(key(n, "late"), 1);  // before done/R: an origin that sees this rank done sees it late
    store_->set(key(n, fmt::format("done/{}", id_.rank)), late ? "late" : "ok");
    // Counted only with a file: an origin waits until as many ranks said done as wrote files.
    if (wrote) store_->add(key(n, "done"), 1);
    if (!is_origin) return late_ranks;
    std::vector<char> seen;  // per rank: seen done, or left, with its file (every_file_done)
    for (;;) {
      const std::int64_t files = store_->add(key(n, "files"), 0);
      const std::int64_t done = store_->add(key(n, "done"), 0);
      if (done >= files) break;
      if (monotonic_ns() >= deadline_ns) {
        log().warn("{}", done_before_deadline_text(done, files));
        break;
      }
      if (store_->add("left", 0) > 0 && every_file_done(n, seen)) break;  // a rank with a file left (or died)
      notice_vanished();
      sleep_for(pacing_.wait);
    }
    if (store_->add(key(n, "late"), 0) > 0) {
      for (int q = 0; q < id_.world_size; ++q) {
        if (q == id_.rank) continue;
        if (const auto v = store_->get(key(n, fmt::format("done/{}", q))); v && *v == "late") late_ranks.push_back(q);
      }
    }
  } catch (const std::exception& e) {
    log().warn("the job's store at the end of dump {}: {}", n, e.what());
  }
  return late_ranks;
}
bool StoreProtocol::every_file_done(std::int64_t n, std::vector<char>& seen) {
  // As every_rank_answered: a rank seen done stays so, and the look stops at the first that is not: a poll is a
  // few requests, not three a rank.
  seen.resize(static_cast<std::size_t>(id_.world_size), 0);
  for (int q = 0; q < id_.world_size; ++q) {
    char& known = seen[static_cast<std::size_t>(q)];
    if (known) continue;
    if (!store_->get(key(n, fmt::format("file/{}", q)))) continue;  // no file yet: looked at again next time
    if (!store_->get(key(n, fmt::format("done/{}", q))) && !store_->get(fmt::format("left/{}", q))) return false;
    known = 1;
  }
  return true;
}

// The leave agreement of the store (docs/protocol.md, "Leaving"): Coordinator::leave_together()'s rule over two
// counters, who ended (`ending`) and who is gone (`left_early`: on an error, after its store, or seen ending in silence
// by a peer of its node, notice_vanished).
void StoreProtocol::say_ending() {
  {
    std::lock_guard lock(mutex_);
    said_ending_ = true;  // a SIGTERM from here on tells the store nothing more (this rank is counted as ending)
  }
  store_->set(fmt::format("ending/{}", id_.rank), "1");  // first: a peer that sees this process end then counts
  store_->add("ending", 1);                               // it once (notice_vanished)
}

std::optional<LeaveTally> StoreProtocol::leave_tally() {
  LeaveTally tally;
  tally.world_size = id_.world_size;
  tally.ended = static_cast<int>(store_->add("ending", 0));
  tally.gone = static_cast<int>(store_->add("left_early", 0));
  return tally;
}

void StoreProtocol::await_leave_news(std::int64_t deadline_ns) {
  notice_vanished();
  const std::int64_t left = deadline_ns - monotonic_ns();
  if (left > 0) std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(std::chrono::nanoseconds(left), pacing_.wait * 2));
}

void StoreProtocol::leave_last(std::int64_t ending) {
  // Every rank ended or left: nobody waits for anybody any more, so nothing more is said after this. The rank whose
  // process hosts the store's server (rank 0 of a job whose rank 0 serves the TCPStore: a plain env:// job,
  // Lightning's launcher) takes it down when it lets go of the store: the others' last requests must come before.
  // So each rank but 0 makes one last request, `gone`, with its watcher stopped; rank 0 lets go once every other
  // rank that ended normally has said it (at most a second: a rank that died meanwhile is not waited for longer).
  try {
    if (id_.rank != 0) {
      store_->add("gone", 1);
      return;
    }
    const std::int64_t until = monotonic_ns() + std::min<std::int64_t>(to_ns(config_.dump_timeout), 1'000'000'000);
    while (store_->add("gone", 0) < ending - 1 && monotonic_ns() < until) sleep_for(pacing_.wait);
  } catch (const std::exception& e) {
    log().debug("the job's store at the end: {}", e.what());
  }
}

void StoreProtocol::shutdown(bool normal) {
  {
    std::unique_lock lock(mutex_);
    if (left_) return;
    left_ = true;
    // A rank that ends right after it joined waits for the agreement first: it has a part in the leave agreement.
    normal = normal && wait_agreed(lock);
  }
  const std::optional<LeaveTally> all_ended = normal ? leave_together() : std::nullopt;
  stop_watching(true);
  std::int64_t reached = 0;
  bool agreed = false;
  {
    std::lock_guard lock(mutex_);
    reached = ledger_.number();
    agreed = state_ != State::off;
  }
  if (sigterm_at_end()) {
    // It came after the watcher's last look, or the watcher took it and stopped first: end as it meant, once the
    // others know (as the watcher would), and before any wait for a watcher that a hung store holds (torchrun's
    // SIGKILL follows its SIGTERM 30 s later).
    if (agreed) tell_left(reached, !said_ending_);
    end_by_sigterm_saying("while leaving at the end of the job");
  }
  // A watcher inside a round trip to a store that hangs is left behind, not waited for (sessions are never freed,
  // so what it reads stays).
  const bool self = watcher_.joinable() && watcher_.get_id() == std::this_thread::get_id();
  const bool joined = join_watcher();
  if (!joined && !self) log().warn("the store transport's watcher is left behind (inside a round trip to the store)");
  if (joined && store_failures_ > 1) {
    log().info("{} more looks at the job's store failed after the first", store_failures_ - 1);
  }
  if (agreed) {
    // A snapshot window this rank completed at the end (its last batch closes at a normal end) is merged before it
    // leaves: nobody else will.
    std::vector<std::pair<std::int64_t, std::int64_t>> windows;
    {
      std::lock_guard lock(mutex_);
      windows.swap(snapshots_to_merge_);
    }
    for (const auto& [first, last] : windows) {
      try {
        merge_snapshot(first, last);
      } catch (const std::exception& e) {
        log().error("snapshot of batches {} to {}: {}", first, last, e.what());
      }
    }
    // Said even when every rank ended: a dump that a rank whose watcher still runs asks for (a signal, an exit dump)
    // then waits for nobody that has gone.
    tell_left(reached, !normal);
    if (all_ended) leave_last(*all_ended->ended);  // the watcher is stopped: no look at the store comes after this
  }
  // The job's store is the job's: oomflight's reference goes now (or with the last call in flight), so that the
  // store ends when the job lets go of it (a FileStore's file is removed then, as without oomflight).
  store_->release("this rank's oomflight session ended");
  log().debug("let go of the job's store: this rank's session ended");
}

void StoreProtocol::tell_left(std::int64_t reached, bool early) {
  try {
    store_->set(fmt::format("left/{}", id_.rank), std::to_string(reached));
    store_->add("left", 1);
    if (early) store_->add("left_early", 1);  // ranks ending normally wait for nobody that left this way
  } catch (const std::exception& e) {
    log().debug("cannot tell the job's store that this rank left: {}", e.what());
  }
}

void StoreProtocol::leave(const std::string& why) {
  std::int64_t reached = 0;
  {
    std::lock_guard lock(mutex_);
    if (left_) {
      store_->release(why);  // ended already; its store goes now if it has not
      return;
    }
    left_ = true;
    stop_ = true;  // with left_: no request of this process and no look of the watcher uses the store after this
    reached = ledger_.number();
  }
  stop_watching(false);  // the watcher stops at its next look; a dump under way ends at its next store call
  tell_left(reached, true);
  // The watcher had not acted on a SIGTERM, or stopped before it could.
  if (sigterm_at_end()) end_by_sigterm_saying("while leaving the job's store");
  store_->release(why);
  // Never held up for long: the caller is the job, letting go of its store (destroy_process_group). A watcher still
  // in a dump (its own file is on disk) ends by itself; this protocol outlives it.
  (void)join_watcher(config_.poll_interval + std::chrono::milliseconds(100));
  log().debug("left the job's store: {}", why);
}

void StoreProtocol::finish_leaving(std::chrono::milliseconds bound) {
  try {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, bound, [&] { return watcher_exited_; });
  } catch (...) {
  }
}

}  // namespace oomflight
