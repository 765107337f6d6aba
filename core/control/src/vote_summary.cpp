// The dump's agreement as one reduction: VoteSummary, its merge and the MPI operation (vote_summary.hpp).
#include "vote_summary.hpp"

#include <algorithm>
#include <cstring>

namespace oomflight::protocol {
namespace {

std::size_t bitmap_bytes(int world_size) { return (static_cast<std::size_t>(std::max(world_size, 0)) + 7) / 8; }

VoteSummaryHead read_head(const void* p) {
  VoteSummaryHead h;
  std::memcpy(&h, p, sizeof(h));
  return h;
}

// MPI's signature for a user-defined operation: `len` elements of our datatype, each one whole summary.
void reduce_votes(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  if (*len <= 0) return;
  const std::size_t stride = VoteSummary::bytes(read_head(in).world_size);
  for (int i = 0; i < *len; ++i) {
    merge_vote_summaries(static_cast<const char*>(in) + static_cast<std::size_t>(i) * stride,
                         static_cast<char*>(inout) + static_cast<std::size_t>(i) * stride);
  }
}

}  // namespace

std::size_t VoteSummary::bytes(int world_size) { return sizeof(VoteSummaryHead) + bitmap_bytes(world_size); }

VoteSummary::VoteSummary(int world_size) : storage_((bytes(world_size) + 7) / 8, 0) {
  VoteSummaryHead h;
  h.world_size = world_size;
  std::memcpy(storage_.data(), &h, sizeof(h));
}

VoteSummary::VoteSummary(const Vote& vote, const ArchiveRowCounts& rows, int world_size) : VoteSummary(world_size) {
  VoteSummaryHead h = head();
  h.first = vote;
  std::copy(rows.begin(), rows.end(), h.row_totals);
  h.snapshots_broken = vote.snapshots_broken;
  if (vote.is_origin != 0) {
    h.origin_count = 1;
    h.kept[0] = vote;
    h.kept_count = 1;
    if (vote.replaces_archive != 0) h.replacer = vote.rank;
    if (vote.rank >= 0 && vote.rank < world_size) {
      auto* bits = reinterpret_cast<unsigned char*>(storage_.data()) + sizeof(VoteSummaryHead);
      bits[vote.rank / 8] = static_cast<unsigned char>(bits[vote.rank / 8] | (1u << (vote.rank % 8)));
    }
  }
  std::memcpy(storage_.data(), &h, sizeof(h));
}

VoteSummaryHead VoteSummary::head() const { return read_head(storage_.data()); }

std::vector<std::int32_t> VoteSummary::origins() const {
  const VoteSummaryHead h = head();
  const auto* bits = reinterpret_cast<const unsigned char*>(storage_.data()) + sizeof(VoteSummaryHead);
  std::vector<std::int32_t> out;
  for (std::int32_t r = 0; r < h.world_size; ++r) {
    if ((bits[r / 8] >> (r % 8)) & 1u) out.push_back(r);
  }
  return out;
}

void merge_vote_summaries(const void* in, void* inout) {
  const VoteSummaryHead a = read_head(in);
  VoteSummaryHead b = read_head(inout);
  b.origin_count += a.origin_count;
  for (std::size_t t = 0; t < kArchiveTables; ++t) b.row_totals[t] += a.row_totals[t];
  b.replacer = std::min(b.replacer, a.replacer);
  b.snapshots_broken = std::max(b.snapshots_broken, a.snapshots_broken);
  if (a.first.rank < b.first.rank) b.first = a.first;
  // The two kept lists hold distinct ranks in rank order: merge them, keep the lowest kVotesKept.
  Vote merged[2 * kVotesKept];
  const int na = std::clamp(a.kept_count, 0, kVotesKept), nb = std::clamp(b.kept_count, 0, kVotesKept);
  const auto end = std::merge(a.kept, a.kept + na, b.kept, b.kept + nb, merged,
                              [](const Vote& x, const Vote& y) { return x.rank < y.rank; });
  b.kept_count = static_cast<std::int32_t>(std::min<std::ptrdiff_t>(end - merged, kVotesKept));
  std::copy(merged, merged + b.kept_count, b.kept);
  std::memcpy(inout, &b, sizeof(b));
  const std::size_t n = bitmap_bytes(b.world_size);
  const auto* from = static_cast<const unsigned char*>(in) + sizeof(VoteSummaryHead);
  auto* to = static_cast<unsigned char*>(inout) + sizeof(VoteSummaryHead);
  for (std::size_t i = 0; i < n; ++i) to[i] = static_cast<unsigned char>(to[i] | from[i]);
}

VoteReduction::VoteReduction(int world_size) {
  MPI_Type_contiguous(static_cast<int>(VoteSummary::bytes(world_size)), MPI_BYTE, &type_);
  MPI_Type_commit(&type_);
  MPI_Op_create(&reduce_votes, 1, &op_);
}

VoteReduction::~VoteReduction() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (op_ != MPI_OP_NULL) MPI_Op_free(&op_);
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

}  // namespace oomflight::protocol
