#include "oomflight/analysis/archive_diff.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "oomflight/analysis/post_mortem.hpp"

namespace oomflight {
namespace {

// A damaged archive's sizes are arbitrary: its sums stop at the top instead of wrapping.
std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

std::string call_site_key(const Archive& a, std::int32_t stack_id) {
  std::string key;
  for (const FrameRow* f : a.stack(stack_id)) {
    key += a.string(f->function);
    key += '\x1f';
    key += a.string(f->file);
    key += '\x1f';
    key += std::to_string(f->line);
    key += '\x1e';
  }
  return key;
}

ArchiveDiff diff_archives(const Archive& a, const Archive& b, std::optional<int> rank, std::size_t top) {
  ArchiveDiff d;
  std::map<int, const RankRow*> in_a, in_b;
  for (const RankRow& r : a.ranks) in_a.emplace(r.rank, &r);
  for (const RankRow& r : b.ranks) in_b.emplace(r.rank, &r);
  for (const auto& [r, row] : in_a) {
    (in_b.contains(r) ? d.ranks : d.only_a).push_back(r);
  }
  for (const auto& [r, row] : in_b) {
    if (!in_a.contains(r)) d.only_b.push_back(r);
  }
  if (rank) {
    const bool both = std::find(d.ranks.begin(), d.ranks.end(), *rank) != d.ranks.end();
    d.ranks = both ? std::vector<int>{*rank} : std::vector<int>{};
  }
  // Per call site: its stacks, and each matched rank's bytes in A and in B.
  struct Site {
    std::int32_t stack_a = kNoStack, stack_b = kNoStack;
    std::map<int, std::pair<std::uint64_t, std::uint64_t>> by_rank;
  };
  std::unordered_map<std::string, Site> sites;
  for (const int r : d.ranks) {
    for (const auto& [stack, bytes] : live_bytes_by_stack(a, *in_a.at(r))) {
      Site& s = sites[call_site_key(a, stack)];
      s.stack_a = s.stack_a == kNoStack ? stack : s.stack_a;
      s.by_rank[r].first = saturating_add(s.by_rank[r].first, bytes);
      d.live_a = saturating_add(d.live_a, bytes);
    }
    for (const auto& [stack, bytes] : live_bytes_by_stack(b, *in_b.at(r))) {
      Site& s = sites[call_site_key(b, stack)];
      s.stack_b = s.stack_b == kNoStack ? stack : s.stack_b;
      s.by_rank[r].second = saturating_add(s.by_rank[r].second, bytes);
      d.live_b = saturating_add(d.live_b, bytes);
    }
  }
  const auto change = [](std::uint64_t from, std::uint64_t to) {
    return to >= from ? static_cast<std::int64_t>(std::min<std::uint64_t>(to - from, INT64_MAX))
                      : -static_cast<std::int64_t>(std::min<std::uint64_t>(from - to, INT64_MAX));
  };
  const auto size = [](std::int64_t v) { return v < 0 ? -static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v); };
  for (auto& [key, s] : sites) {
    SiteChange c;
    c.key = key;
    c.stack_a = s.stack_a;
    c.stack_b = s.stack_b;
    std::vector<std::int64_t> changes;
    for (const int r : d.ranks) {
      const auto it = s.by_rank.find(r);
      const std::uint64_t from = it == s.by_rank.end() ? 0 : it->second.first;
      const std::uint64_t to = it == s.by_rank.end() ? 0 : it->second.second;
      c.bytes_a = saturating_add(c.bytes_a, from);
      c.bytes_b = saturating_add(c.bytes_b, to);
      const std::int64_t delta = change(from, to);
      changes.push_back(delta);
      if (c.widest_rank < 0 || size(delta) > size(c.widest_change)) {
        c.widest_rank = r;
        c.widest_change = delta;
      }
    }
    if (c.bytes_a == c.bytes_b && std::all_of(changes.begin(), changes.end(), [](std::int64_t v) { return v == 0; })) {
      continue;
    }
    std::sort(changes.begin(), changes.end());
    c.median_change = changes.empty() ? 0 : changes[(changes.size() - 1) / 2];
    d.sites.push_back(std::move(c));
  }
  d.changed = d.sites.size();
  std::sort(d.sites.begin(), d.sites.end(), [&](const SiteChange& x, const SiteChange& y) {
    const std::uint64_t sx = size(change(x.bytes_a, x.bytes_b)), sy = size(change(y.bytes_a, y.bytes_b));
    return sx != sy ? sx > sy : x.key < y.key;
  });
  if (d.sites.size() > top) d.sites.resize(top);
  return d;
}

}  // namespace oomflight
