// Test driver for the protocol's agreements on their own, under mpirun (4 ranks): the settings agreement, where
// each rank's rows go and the votes' reduction, the snapshot writer's rule for skipped windows, and the leave
// agreement, each driven directly (not through a
// session), so that each rule is checked alone. Prints "ok: ..." lines and exits 0 when every check holds on this
// rank; otherwise prints "FAIL: ..." and exits 1. Usage: mpirun -np 4 oomflight_agreements_driver FOLDER
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dump_executor.hpp"
#include "leave_agreement.hpp"
#include "oomflight/format/archive_reader.hpp"
#include "oomflight/format/row_placement.hpp"
#include "settings_agreement.hpp"
#include "snapshot_writer.hpp"
#include "vote_summary.hpp"

namespace {

using namespace oomflight;

int failures = 0;
int rank = 0;
int size = 1;

void check(bool ok, const std::string& what) {
  std::printf("%s: rank %d: %s\n", ok ? "ok" : "FAIL", rank, what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

std::string agreement_error(const Config* config) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  std::string error;
  try {
    agree_on_settings(config, comm);
  } catch (const ConfigError& e) {
    error = e.what();
  }
  MPI_Comm_free(&comm);
  return error;
}

// Every rank's text is the same: gathered and compared.
bool same_everywhere(const std::string& text) {
  const std::size_t hash = std::hash<std::string>{}(text);
  std::vector<std::size_t> all(static_cast<std::size_t>(size));
  MPI_Allgather(&hash, sizeof(hash), MPI_BYTE, all.data(), sizeof(hash), MPI_BYTE, MPI_COMM_WORLD);
  for (std::size_t h : all) {
    if (h != hash) return false;
  }
  return true;
}

void settings_agreement() {
  Config c = Config::defaults();
  check(agreement_error(&c).empty(), "the same settings everywhere agree");
  Config schedule = Config::defaults();
  if (rank == 1) schedule.snapshot_every_batches = 1;
  const std::string e1 = agreement_error(&schedule);
  check(e1.find("OOMFLIGHT_SNAPSHOT_EVERY differs between ranks: unset on ranks 0, 2-3; 1ba on rank 1.") == 0, e1);
  check(same_everywhere(e1), "every rank has the same message");
  Config two = Config::defaults();
  two.enabled = rank != 3;
  if (rank >= 2) two.skip_batches = 5;
  const std::string e2 = agreement_error(rank == 0 ? nullptr : &two);
  check(e2.find("OOMFLIGHT_ENABLED differs between ranks: 1 on ranks 1-2; 0 on rank 3; and OOMFLIGHT_SKIP_BATCHES "
                "differs between ranks: unset on rank 1; 5 on ranks 2-3; and rank 0 could not start") == 0,
        e2);
  check(rank_ranges({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8" && rank_ranges({}).empty(), "rank_ranges");
}

// The watcher's part, here in the test's thread: poll until every window handed over is written or skipped.
void poll_until_drained(SnapshotWriter& writer) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!writer.drain(std::chrono::milliseconds(0)) && std::chrono::steady_clock::now() < until) {
    writer.poll([] { return false; });
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Each rank hands over windows 0..9 one at a time and waits for the agreement on each; rank 2 has no place for
// window 3's history, rank 1 none for window 6's. Every rank must skip exactly those two, write the other eight
// archives together, and the archives after a skip must say so.
void snapshot_writer(const std::filesystem::path& folder) {
  Config config = Config::defaults();
  config.snapshot_every_batches = 1;
  config.skip_batches = 0;
  config.folder = FilenameTemplate(folder.string());
  config.dump_timeout = std::chrono::milliseconds(10000);
  RankIdentity id;
  id.rank = rank;
  id.world_size = size;
  id.run_name = "writer";
  DumpExecutor executor(config, id);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    SnapshotWriter writer(config, id, executor, comm);
    Recorder recorder(1000);
    for (std::int64_t w = 0; w < 10; ++w) {
      recorder.mark_batch(w);
      for (int i = 0; i < 5; ++i) {
        recorder.record(Action::alloc, 0, 0x1000u * static_cast<std::uint64_t>(w * 8 + i + 1), 512, 0, -1);
      }
      const SnapshotWindow window{w, w, w};
      const bool no_place = (rank == 2 && w == 3) || (rank == 1 && w == 6);
      if (no_place || !writer.wants_history(window)) {
        writer.queue_skipped(window);
      } else {
        writer.queue(recorder.freeze(), window);
      }
      poll_until_drained(writer);
    }
    check(writer.windows_skipped() == 2, fmt::format("{} windows skipped, expected 2", writer.windows_skipped()));
    // Then windows 10..15 handed over at once, faster than any write: 2 keep a history (the bound), the rest wait
    // as placeholders (rank 2 has none for 11 either). Window 10 is written; at 11 every rank skips through 15,
    // the newest any rank had handed over.
    for (std::int64_t w = 10; w < 16; ++w) {
      recorder.mark_batch(w);
      recorder.record(Action::alloc, 0, 0x100000u + static_cast<std::uint64_t>(w), 512, 0, -1);
      const SnapshotWindow window{w, w, w};
      if ((rank == 2 && w == 11) || !writer.wants_history(window)) {
        writer.queue_skipped(window);
      } else {
        writer.queue(recorder.freeze(), window);
      }
    }
    poll_until_drained(writer);
    check(writer.windows_skipped() == 2 + 5,
          fmt::format("{} windows skipped in all, expected 7 (11 to 15 in one agreement)", writer.windows_skipped()));
    check(!writer.wants_history(SnapshotWindow{15, 15, 15}) && writer.wants_history(SnapshotWindow{16, 16, 16}),
          "windows up to 15 take no turn any more; 16 does");
    writer.stop();
    writer.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != 0) return;
  std::vector<std::int64_t> written;
  for (std::int64_t w = 0; w < 10; ++w) {
    const auto path = folder / fmt::format("snapshot.{}.h5", w);
    if (!std::filesystem::exists(path)) continue;
    written.push_back(w);
    const Archive a = read_archive(path.string());
    check(a.header.ranks_present == std::vector<std::int32_t>{0, 1, 2, 3}, fmt::format("window {}: every rank", w));
    const std::int64_t expected = w == 4 || w == 7 ? 1 : 0;
    check(a.header.snapshot_windows_skipped.value_or(0) == expected,
          fmt::format("window {}: {} skipped before it, expected {}", w, a.header.snapshot_windows_skipped.value_or(0),
                      expected));
  }
  check(written == std::vector<std::int64_t>{0, 1, 2, 4, 5, 7, 8, 9},
        fmt::format("archives of windows {}", fmt::join(written, ",")));
  check(std::filesystem::exists(folder / "snapshot.10.h5") && !std::filesystem::exists(folder / "snapshot.12.h5"),
        "window 10 written, none of 11 to 15");
}

// Ranks 1-3 post the leave barrier; rank 0 leaves without it (LEFT): the others learn it, and their barrier does not
// complete. Then a second round where every rank posts: it completes everywhere.
void leave_agreement() {
  const auto make = [] {
    MPI_Comm leave;
    MPI_Comm_dup(MPI_COMM_WORLD, &leave);
    return leave;
  };
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    LeaveAgreement together(comm, make(), rank, size);
    together.post();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!together.everyone_left() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    check(together.everyone_left(), "every rank posted: the leave barrier completes");
    together.announce_leaving(LeaveAgreement::Leaving::on_error);  // nothing: they left together
    together.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    LeaveAgreement one_gone(comm, make(), rank, size);
    if (rank == 0) {
      one_gone.announce_leaving(LeaveAgreement::Leaving::normally);
    } else {
      one_gone.post();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (one_gone.gone().empty() && std::chrono::steady_clock::now() < until) {
        one_gone.receive_left_messages();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      check(one_gone.gone() == std::set<int>{0}, "rank 0's LEFT message arrived");
      check(!one_gone.any_left_on_error() && one_gone.vanished().empty(),
            "rank 0 said it left normally, and its process did not vanish");
      check(!one_gone.everyone_left(), "the barrier does not complete without rank 0");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // Rank 0 posts late (a test's tidiness: no request may be pending at MPI_Finalize): then it completes.
    if (rank == 0) one_gone.post();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!one_gone.everyone_left() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    check(one_gone.everyone_left(), "the barrier completes once the last rank posts");
    one_gone.close();
  }
  MPI_Comm_free(&comm);
}

// place_rows() on communicators of 1 to 4 ranks (3: not a power of two): rank r adds (r + 1) * 10^t rows to
// dataset t, so its offset is the sum over the ranks below it, and every rank sees the same total. Then the vote's
// reduction on 4 ranks with origins 1 and 3, rank 3 replacing an archive and rank 2 with abandoned snapshots.
void row_placement_and_votes() {
  for (int members = 1; members <= 4; ++members) {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, rank < members ? 0 : MPI_UNDEFINED, rank, &comm);
    if (comm == MPI_COMM_NULL) continue;
    ArchiveRowCounts mine{};
    std::uint64_t scale = 1;
    for (std::size_t t = 0; t < kArchiveTables; ++t, scale = scale < 1000000 ? scale * 10 : 1) {
      mine[t] = static_cast<std::uint64_t>(rank + 1) * scale;
    }
    const RowPlacement p = place_rows(mine, comm, {}, "the test archive");
    ArchiveRowCounts given{};
    given.fill(42);
    const RowPlacement q = place_rows(mine, comm, {}, "the test archive", &given);  // the total known: no reduction
    bool ok = q.before == p.before && q.total == given;
    for (std::size_t t = 0; t < kArchiveTables; ++t) {
      const std::uint64_t unit = mine[t] / static_cast<std::uint64_t>(rank + 1);
      const auto below = static_cast<std::uint64_t>(rank * (rank + 1) / 2);
      const auto all = static_cast<std::uint64_t>(members * (members + 1) / 2);
      ok = ok && p.before[t] == below * unit && p.total[t] == all * unit;
    }
    check(ok, fmt::format("place_rows on {} ranks: offset {} and total {} of /ranks", members, p.before[0],
                          p.total[0]));
    MPI_Comm_free(&comm);
  }
  protocol::Vote v;
  v.rank = rank;
  v.is_origin = rank == 1 || rank == 3 ? 1 : 0;
  v.batch = 100 + rank;
  v.replaces_archive = rank == 3 ? 1 : 0;
  v.snapshots_broken = rank == 2 ? 1 : 0;
  const protocol::VoteReduction reduction(size);
  ArchiveRowCounts rows{};
  rows.fill(static_cast<std::uint64_t>(rank) + 1);
  protocol::VoteSummary mine(v, rows, size), all(size);
  MPI_Request request;
  MPI_Iallreduce(mine.data(), all.data(), 1, reduction.type(), reduction.op(), MPI_COMM_WORLD, &request);
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  const protocol::VoteSummaryHead h = all.head();
  check(all.origins() == std::vector<std::int32_t>{1, 3} && h.origin_count == 2 && h.kept_count == 2 &&
            h.kept[0].rank == 1 && h.kept[0].batch == 101 && h.kept[1].rank == 3 && h.replacer == 3 &&
            h.snapshots_broken == 1 && h.first.rank == 0 && h.row_totals[0] == 10 && h.row_totals[12] == 10,
        fmt::format("the votes reduced: origins {}, kept {}, replacer {}, snapshots broken {}",
                    fmt::join(all.origins(), ","), h.kept_count, h.replacer, h.snapshots_broken));
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4 || argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np 4 %s FOLDER\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  settings_agreement();
  row_placement_and_votes();
  snapshot_writer(argv[1]);
  leave_agreement();
  int all_failures = 0;
  MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return all_failures == 0 ? 0 : 1;
}
