#include "oomflight/analysis/growth.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace oomflight {

std::optional<Trend> peak_reserved_trend(std::span<const BatchRow> batches, std::uint64_t limit,
                                         std::size_t window) {
  std::vector<const BatchRow*> ended;
  for (const BatchRow& b : batches) {
    if (b.end_t_ns != 0) ended.push_back(&b);
  }
  std::stable_sort(ended.begin(), ended.end(),
                   [](const BatchRow* x, const BatchRow* y) { return x->batch < y->batch; });
  // A damaged file may repeat a batch: the first row of each counts.
  ended.erase(std::unique(ended.begin(), ended.end(),
                          [](const BatchRow* x, const BatchRow* y) { return x->batch == y->batch; }),
              ended.end());
  if (ended.size() > window) ended.erase(ended.begin(), ended.end() - static_cast<std::ptrdiff_t>(window));
  std::vector<std::int64_t> x;
  std::vector<double> y;
  for (const BatchRow* b : ended) {
    x.push_back(b->batch);
    y.push_back(static_cast<double>(b->peak_reserved_bytes));
  }
  return fit_trend(x, y, limit);
}

std::vector<GrowingSite> growing_call_sites(const Archive& archive, const RankRow& row, std::size_t top,
                                            std::size_t window) {
  // One pass: the history falls into runs of one batch each; a run is whole when a later batch's event follows it.
  // Each call site logs its live bytes at the end of each run in which they changed, so the series of a site that
  // changes rarely costs little, and a history of many batches and many sites stays near-linear.
  __extension__ typedef __int128 Wide;  // sizes below 2^50 summed over any history: no overflow
  struct Change {
    std::size_t run;
    Wide bytes;
  };
  std::unordered_map<std::int32_t, std::vector<Change>> log;
  std::unordered_map<std::uint64_t, std::pair<std::uint64_t, std::int32_t>> live;  // address -> size, stack
  std::vector<std::int64_t> run_batch;  // the batch of each run
  const auto change = [&](std::int32_t stack, Wide delta) {
    auto& changes = log[stack];
    const std::size_t run = run_batch.size() - 1;
    if (changes.empty() || changes.back().run != run) {
      changes.push_back(Change{run, changes.empty() ? 0 : changes.back().bytes});
    }
    changes.back().bytes += delta;
  };
  for (const Event& e : archive.events_of(row)) {
    if (e.action != Action::alloc && e.action != Action::free_completed) continue;
    if (run_batch.empty() || e.batch > run_batch.back()) run_batch.push_back(e.batch);
    if (e.action == Action::alloc) {
      if (e.size > (1ull << 50)) continue;  // a damaged file's size: not a call site's bytes
      live[e.addr] = {e.size, e.stack_id};
      change(e.stack_id, static_cast<Wide>(e.size));
    } else if (const auto it = live.find(e.addr); it != live.end()) {
      change(it->second.second, -static_cast<Wide>(it->second.first));
      live.erase(it);
    }
  }
  if (run_batch.size() < 4) return {};  // at least 3 whole runs: the last one is still open at the freeze
  const std::size_t whole = run_batch.size() - 1;
  const std::size_t first = whole > window ? whole - window : 0;
  std::vector<std::int64_t> batches(run_batch.begin() + static_cast<std::ptrdiff_t>(first),
                                    run_batch.begin() + static_cast<std::ptrdiff_t>(whole));
  std::vector<GrowingSite> out;
  std::vector<double> series;
  for (const auto& [stack, changes] : log) {
    // The site's live bytes at the end of each whole run of the window: its last change at or before that run.
    series.assign(batches.size(), 0);
    std::size_t c = 0;
    Wide bytes = 0;
    for (std::size_t r = first; r < whole; ++r) {
      while (c < changes.size() && changes[c].run <= r) bytes = changes[c++].bytes;
      series[r - first] = static_cast<double>(bytes);
    }
    std::size_t rises = 0;
    bool fell = false;
    for (std::size_t i = 1; i < series.size(); ++i) {
      if (series[i] > series[i - 1]) ++rises;
      if (series[i] < series[i - 1]) fell = true;
    }
    if (fell || 3 * rises < 2 * (series.size() - 1)) continue;
    const std::optional<Trend> t = fit_trend(batches, series, 0);
    if (!t || !t->rising) continue;
    out.push_back(GrowingSite{stack, *t, trend_bytes(series.front()), trend_bytes(series.back())});
  }
  std::sort(out.begin(), out.end(), [](const GrowingSite& x, const GrowingSite& y) {
    return x.trend.slope != y.trend.slope ? x.trend.slope > y.trend.slope : x.stack_id < y.stack_id;
  });
  if (out.size() > top) out.resize(top);
  return out;
}

}  // namespace oomflight
