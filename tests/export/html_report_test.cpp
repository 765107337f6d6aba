// The HTML report of a small archive built in memory: every rank and the origin shown, the curves replayed and
// shifted to the ranks' figures at the trigger, peaks kept when downsampled, and hostile strings escaped.
// tests/export/html_report_chromium.py renders a real archive's page in a browser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/analysis/post_mortem.hpp"
#include "oomflight/export/html_report.hpp"
#include "oomflight/format/archive_reader.hpp"

namespace oomflight {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr std::string_view kHostile = "</script><img src=x onerror=alert(1)>";

std::size_t count(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string_view::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Three ranks; rank 1 ran out of memory. Each rank: a step, a 1 GiB segment, 5 (rank 1) or 3 blocks of 100 MiB
// from one call site whose file name is hostile, one of them freed; rank 1 ends with its oom event. Every rank
// had 600 MiB allocated and 1 GiB reserved before its history begins. The monotonic clocks differ by rank; the
// anchors put all events on the same UTC instants, 1 ms apart.
Archive small_archive() {
  Archive a;
  a.path = "in-memory.h5";
  a.header.producer = "oomflight test";
  a.header.run_name = "html-test";
  a.header.kind = "oom";
  a.header.created_at_utc = "2026-11-23T10:00:00Z";
  a.header.reason = "rank 1: CUDA out of memory " + std::string(kHostile);
  a.header.origin_ranks = {1};
  a.header.world_size = 3;
  a.header.ranks_present = {0, 1, 2};
  a.strings = {"train_step", std::string(kHostile)};
  a.frames = {FrameRow{0, 1, 7}};
  a.stack_frames = {0};
  a.stacks = {StackRow{0, 1, 0}};
  for (int rank = 0; rank < 3; ++rank) {
    RankRow row;
    row.rank = rank;
    row.is_origin = rank == 1;
    row.batch = 0;
    row.anchor_monotonic_ns = std::int64_t{1'000'000'000} * (rank + 1);
    row.anchor_realtime_ns = 1'790'000'000'000'000'000;
    row.event_offset = a.events.size();
    std::int64_t t = row.anchor_monotonic_ns;
    const auto add = [&](Action action, std::uint64_t addr, std::uint64_t size) {
      Event e;
      e.t_ns = t;
      t += 1'000'000;
      e.action = action;
      e.addr = addr;
      e.size = size;
      e.batch = 0;
      e.stack_id = action == Action::alloc ? 0 : kNoStack;
      a.events.push_back(e);
    };
    add(Action::step, 0, 0);
    add(Action::segment_alloc, 0x10000000, kGiB);
    const int blocks = rank == 1 ? 5 : 3;
    for (int b = 0; b < blocks; ++b) add(Action::alloc, 0x10000000 + b * 100 * kMiB, 100 * kMiB);
    add(Action::free_completed, 0x10000000, 100 * kMiB);
    if (rank == 1) add(Action::oom, 3 * kMiB, 512 * kMiB);
    row.event_count = a.events.size() - row.event_offset;
    row.freeze_t_ns = t;
    row.allocated_bytes = 600 * kMiB + static_cast<std::uint64_t>(blocks - 1) * 100 * kMiB;
    row.reserved_bytes = 2 * kGiB;
    row.peak_allocated_bytes = row.allocated_bytes + 100 * kMiB;
    row.peak_reserved_bytes = row.reserved_bytes;
    row.device_capacity_bytes = rank == 1 ? 2 * kGiB + 10 * kMiB : 4 * kGiB;
    row.device_free_bytes = row.device_capacity_bytes - row.reserved_bytes;
    row.oom_requested_bytes = rank == 1 ? 512 * kMiB : 0;
    set_fixed_string(row.host, rank == 1 ? std::string(kHostile) : "node-a");
    if (rank == 1) set_fixed_string(row.reason, "CUDA out of memory " + std::string(kHostile));
    a.ranks.push_back(row);
    for (int b = 0; b < 2; ++b) {
      BatchRow batch;
      batch.rank = rank;
      batch.batch = b;
      batch.start_t_ns = row.anchor_monotonic_ns + b;
      batch.end_t_ns = b == 1 ? 0 : row.anchor_monotonic_ns + 1;
      batch.peak_allocated_bytes = row.peak_allocated_bytes;
      batch.device_capacity_bytes = row.device_capacity_bytes;
      a.batches.push_back(batch);
    }
  }
  return a;
}

// The numbers of one rank's series ("allocated" or "reserved") in the page's JSON; -1 for null.
std::vector<std::int64_t> series(const std::string& page, int rank, const std::string& name) {
  const auto at = page.find("{\"rank\":" + std::to_string(rank) + ",\"label\"");
  EXPECT_NE(at, std::string::npos) << "no JSON for rank " << rank;
  if (at == std::string::npos) return {};
  const auto open = page.find("\"" + name + "\":[", at) + name.size() + 4;
  const auto close = page.find(']', open);
  std::vector<std::int64_t> out;
  for (std::size_t i = open; i < close;) {
    const auto comma = std::min(page.find(',', i), close);
    const std::string item = page.substr(i, comma - i);
    out.push_back(item == "null" ? -1 : std::stoll(item));
    i = comma + 1;
  }
  return out;
}

std::int64_t last_value(const std::vector<std::int64_t>& v) {
  for (auto it = v.rbegin(); it != v.rend(); ++it) {
    if (*it >= 0) return *it;
  }
  return -1;
}

TEST(HtmlReport, ShowsEveryRankAndMarksTheOrigin) {
  const Archive a = small_archive();
  const std::string page = render_html_report(a, analyze(a, 5), 3);
  ASSERT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* expected : {
           "<title>oomflight: html-test (oom)</title>",
           "<span class=\"swatch\" style=\"background:#1f77b4\"></span>rank 0</li>",
           "<li class=\"origin\"><span class=\"swatch\" style=\"background:#d62728\"></span>"
           "rank 1 (out of memory)</li>",
           "<span class=\"swatch\" style=\"background:#2ca02c\"></span>rank 2</li>",
           "<g class=\"series origin\" data-rank=\"1\" stroke=\"#d62728\">",
           "<g class=\"series\" data-rank=\"0\"", "<g class=\"series\" data-rank=\"2\"",
           "<tr class=\"origin\"><td>1</td>",
           "rank 1 out of memory at ",  // the oom event's mark on the charts
           "512.00 MiB requested",
           "capacity 2.01 GiB (rank 1)", "capacity 4.00 GiB (ranks 0, 2)",
           "<th>batch 0</th><th>batch 1</th>",
           "<h2>Live memory on rank 1 by call site</h2>",
           "4 blocks x 100.00 MiB",
           "<h2>Rank 1 against its 2 peers</h2>",
           "<h2>Headroom against the limit</h2>",
           "<pre id=\"errors\" hidden></pre>",
           "document.body.dataset.rendered = '1';",
       }) {
    EXPECT_NE(page.find(expected), std::string::npos) << "missing: " << expected;
  }
  // Exactly one origin row in each table of ranks (the trigger, the per-batch peaks, the headroom).
  EXPECT_EQ(count(page, "<tr class=\"origin\">"), 3u);
  // Loads nothing from anywhere.
  EXPECT_EQ(page.find("http://"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);
  EXPECT_EQ(page.find("src=\""), std::string::npos);
}

TEST(HtmlReport, HostileStringsAppearOnlyEscaped) {
  const Archive a = small_archive();
  const std::string page = render_html_report(a, analyze(a, 5), 3);
  EXPECT_EQ(page.find(kHostile), std::string::npos);
  EXPECT_EQ(page.find("<img"), std::string::npos);
  // The page's own three scripts, and no other.
  EXPECT_EQ(count(page, "<script"), 3u);
  EXPECT_EQ(count(page, "</script>"), 3u);
  // In markup (the reason, the host, the frame's file) and in the JSON.
  EXPECT_GE(count(page, "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"), 4u);
  EXPECT_GE(count(page, "\\u003c/script\\u003e\\u003cimg src=x onerror=alert(1)\\u003e"), 4u);
}

TEST(HtmlReport, CurvesEndAtTheFiguresAtTheTriggerOnOneTimeAxis) {
  const Archive a = small_archive();
  const std::string page = render_html_report(a, analyze(a, 5), 3);
  for (int rank = 0; rank < 3; ++rank) {
    const RankRow& row = *a.rank_row(rank);
    const auto allocated = series(page, rank, "allocated");
    const auto reserved = series(page, rank, "reserved");
    ASSERT_FALSE(allocated.empty());
    EXPECT_EQ(last_value(allocated), static_cast<std::int64_t>(row.allocated_bytes)) << "rank " << rank;
    EXPECT_EQ(last_value(reserved), static_cast<std::int64_t>(row.reserved_bytes)) << "rank " << rank;
    // The peak before the free survives; nothing goes below what was allocated before the history began.
    EXPECT_EQ(*std::max_element(allocated.begin(), allocated.end()),
              static_cast<std::int64_t>(row.allocated_bytes + 100 * kMiB));
    for (const auto v : allocated) EXPECT_TRUE(v == -1 || v >= static_cast<std::int64_t>(600 * kMiB)) << v;
    EXPECT_EQ(*std::find_if(reserved.begin(), reserved.end(), [](std::int64_t v) { return v >= 0; }),
              static_cast<std::int64_t>(kGiB));
  }
  // The anchors put every rank's events on the same instants: rank 1 has 9 events and its freeze, 1 ms apart.
  const auto at = page.find("\"span_s\":");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::stod(page.substr(at + 9, 20)), 0.009, 1e-9);
  // Ranks 0 and 2 started with rank 1 and ended 2 ms before it.
  const auto r0 = series(page, 0, "allocated");
  const auto r1 = series(page, 1, "allocated");
  EXPECT_EQ(r0.size(), r1.size());
  EXPECT_GE(r0.front(), 0);
  EXPECT_EQ(r0.back(), -1);
  EXPECT_GE(r1.back(), 0);
}

// 50,000 events: at most 2,000 points per rank, and a 5 GiB block held for one event still shows as the peak.
TEST(HtmlReport, DownsamplingKeepsThePeaks) {
  Archive a = small_archive();
  a.ranks.resize(1);
  a.batches.clear();
  a.header.ranks_present = {0};
  a.header.origin_ranks = {};
  RankRow& row = a.ranks[0];
  row.is_origin = 0;
  a.events.resize(row.event_count);
  std::int64_t t = a.events.back().t_ns;
  for (int i = 0; i < 25'000; ++i) {
    const std::uint64_t size = i == 12'345 ? 5 * kGiB : kMiB;
    Event alloc;
    alloc.t_ns = ++t;
    alloc.addr = 0x90000000;
    alloc.size = size;
    a.events.push_back(alloc);
    Event free = alloc;
    free.t_ns = ++t;
    free.action = Action::free_completed;
    a.events.push_back(free);
  }
  row.event_count = a.events.size();
  row.freeze_t_ns = t + 1;
  const std::string page = render_html_report(a, analyze(a, 5), 3);
  const auto allocated = series(page, 0, "allocated");
  EXPECT_EQ(allocated.size(), 2000u);
  EXPECT_EQ(*std::max_element(allocated.begin(), allocated.end()),
            static_cast<std::int64_t>(row.allocated_bytes + 5 * kGiB));
  // The last point is the peak of the last interval, which ends at the figures at the trigger.
  EXPECT_GE(last_value(allocated), static_cast<std::int64_t>(row.allocated_bytes));
  EXPECT_LE(last_value(allocated), static_cast<std::int64_t>(row.allocated_bytes + kMiB));
  EXPECT_LT(page.size(), 400'000u);
}

}  // namespace
}  // namespace oomflight
