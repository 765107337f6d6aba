#include "oomflight/record/collective.hpp"

#include <array>

namespace oomflight {

namespace {
constexpr std::array<std::string_view, kCollectiveOpCount> kOpNames = {
    "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall",
    "send",      "recv",      "gather",        "scatter",   "barrier", "other"};
constexpr std::array<std::string_view, 12> kTypeNames = {"int8",    "uint8",   "int32",   "uint32",
                                                         "int64",   "uint64",  "float16", "float32",
                                                         "float64", "bfloat16", "float8e4m3", "float8e5m2"};
constexpr std::array<std::uint8_t, 12> kTypeSizes = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
}  // namespace

std::string_view collective_op_name(CollectiveOp op) {
  const auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : "other";
}

std::optional<CollectiveOp> collective_op_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<CollectiveOp>(i);
  }
  return std::nullopt;
}

std::string_view data_type_name(DataType type) {
  const auto i = static_cast<std::size_t>(type);
  return i < kTypeNames.size() ? kTypeNames[i] : "other";
}

std::uint64_t data_type_size(DataType type) {
  const auto i = static_cast<std::size_t>(type);
  return i < kTypeSizes.size() ? kTypeSizes[i] : 0;
}

bool valid_data_type(std::uint8_t value) { return value < kTypeNames.size() || value == 255; }

}  // namespace oomflight
