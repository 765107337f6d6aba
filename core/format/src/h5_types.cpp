// Builds the compound and enumeration types of schema v1 from the C++ rows, so that the memory layout and
// the file layout cannot drift apart.
#include "h5_types.hpp"

#include <cstddef>
#include <string>

#include "oomflight/format/archive_schema.hpp"

namespace oomflight::h5 {

Handle batch_row_type() {
  Handle t = batch_row_type_v0();
  H5Tset_size(t, sizeof(BatchRow));
  H5Tinsert(t, "outside_allocator_bytes", offsetof(BatchRow, outside_allocator_bytes), H5T_NATIVE_INT64);
  return t;
}

Handle batch_row_type_v0() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, kBatchRowV0Bytes));
#define OOMFLIGHT_BATCH_FIELD(name, h5type) H5Tinsert(t, #name, offsetof(BatchRow, name), h5type)
  OOMFLIGHT_BATCH_FIELD(rank, H5T_NATIVE_INT32);
  OOMFLIGHT_BATCH_FIELD(device, H5T_NATIVE_INT32);
  OOMFLIGHT_BATCH_FIELD(batch, H5T_NATIVE_INT64);
  OOMFLIGHT_BATCH_FIELD(start_t_ns, H5T_NATIVE_INT64);
  OOMFLIGHT_BATCH_FIELD(end_t_ns, H5T_NATIVE_INT64);
  OOMFLIGHT_BATCH_FIELD(allocated_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(reserved_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(peak_allocated_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(peak_reserved_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(device_capacity_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(device_free_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(alloc_events, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(free_events, H5T_NATIVE_UINT64);
  OOMFLIGHT_BATCH_FIELD(oom_events, H5T_NATIVE_UINT64);
#undef OOMFLIGHT_BATCH_FIELD
  return t;
}

namespace {
// The members 0.2.0 wrote, at the same offsets in both layouts (StateSegmentRowV0 is StateSegmentRow's prefix).
template <typename Row>
Handle segment_row_type_base() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(Row)));
  H5Tinsert(t, "rank", offsetof(Row, rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "device", offsetof(Row, device), H5T_NATIVE_INT32);
  H5Tinsert(t, "address", offsetof(Row, address), H5T_NATIVE_UINT64);
  H5Tinsert(t, "total_size", offsetof(Row, total_size), H5T_NATIVE_UINT64);
  H5Tinsert(t, "stream", offsetof(Row, stream), H5T_NATIVE_UINT64);
  H5Tinsert(t, "is_expandable", offsetof(Row, is_expandable), H5T_NATIVE_UINT8);
  return t;
}
}  // namespace

Handle state_segment_row_type() {
  Handle t = segment_row_type_base<StateSegmentRow>();
  H5Tinsert(t, "segment_type", offsetof(StateSegmentRow, segment_type), H5T_NATIVE_UINT8);
  H5Tinsert(t, "stack_id", offsetof(StateSegmentRow, stack_id), H5T_NATIVE_INT32);
  const hsize_t two = 2;
  Handle pool = type(H5Tarray_create2(H5T_NATIVE_UINT64, 1, &two));
  H5Tinsert(t, "segment_pool_id", offsetof(StateSegmentRow, segment_pool_id), pool);
  return t;
}

Handle state_segment_row_type_v0() { return segment_row_type_base<StateSegmentRowV0>(); }

Handle state_block_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(StateBlockRow)));
  H5Tinsert(t, "rank", offsetof(StateBlockRow, rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "stack_id", offsetof(StateBlockRow, stack_id), H5T_NATIVE_INT32);
  H5Tinsert(t, "address", offsetof(StateBlockRow, address), H5T_NATIVE_UINT64);
  H5Tinsert(t, "size", offsetof(StateBlockRow, size), H5T_NATIVE_UINT64);
  H5Tinsert(t, "requested_size", offsetof(StateBlockRow, requested_size), H5T_NATIVE_UINT64);
  H5Tinsert(t, "state", offsetof(StateBlockRow, state), H5T_NATIVE_UINT8);
  return t;
}

Handle collective_op_enum_type() {
  Handle t = type(H5Tenum_create(H5T_NATIVE_UINT8));
  for (int i = 0; i < kCollectiveOpCount; ++i) {
    const auto value = static_cast<std::uint8_t>(i);
    H5Tenum_insert(t, std::string(collective_op_name(static_cast<CollectiveOp>(i))).c_str(), &value);
  }
  return t;
}

Handle collective_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(CollectiveRow)));
#define OOMFLIGHT_COLL_FIELD(name, h5type) H5Tinsert(t, #name, offsetof(CollectiveRow, name), h5type)
  OOMFLIGHT_COLL_FIELD(rank, H5T_NATIVE_INT32);
  OOMFLIGHT_COLL_FIELD(peer, H5T_NATIVE_INT32);
  OOMFLIGHT_COLL_FIELD(t_ns, H5T_NATIVE_INT64);
  OOMFLIGHT_COLL_FIELD(comm_id, H5T_NATIVE_UINT64);
  OOMFLIGHT_COLL_FIELD(seq, H5T_NATIVE_UINT64);
  OOMFLIGHT_COLL_FIELD(count, H5T_NATIVE_UINT64);
  OOMFLIGHT_COLL_FIELD(bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_COLL_FIELD(stream, H5T_NATIVE_UINT64);
  OOMFLIGHT_COLL_FIELD(batch, H5T_NATIVE_INT64);
  auto op = collective_op_enum_type();
  OOMFLIGHT_COLL_FIELD(op, op);
  OOMFLIGHT_COLL_FIELD(datatype, H5T_NATIVE_UINT8);
  OOMFLIGHT_COLL_FIELD(phase, H5T_NATIVE_UINT8);
  OOMFLIGHT_COLL_FIELD(flags, H5T_NATIVE_UINT8);
#undef OOMFLIGHT_COLL_FIELD
  return t;
}

Handle communicator_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(CommunicatorRow)));
  H5Tinsert(t, "rank", offsetof(CommunicatorRow, rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "comm_rank", offsetof(CommunicatorRow, comm_rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "comm_size", offsetof(CommunicatorRow, comm_size), H5T_NATIVE_INT32);
  H5Tinsert(t, "comm_id", offsetof(CommunicatorRow, comm_id), H5T_NATIVE_UINT64);
  auto name = fixed_string_type(sizeof(CommunicatorRow::name));
  H5Tinsert(t, "name", offsetof(CommunicatorRow, name), name);
  return t;
}

Handle context_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(ContextRow)));
  H5Tinsert(t, "rank", offsetof(ContextRow, rank), H5T_NATIVE_INT32);
  H5Tinsert(t, "kind", offsetof(ContextRow, kind), H5T_NATIVE_UINT8);
  H5Tinsert(t, "batch", offsetof(ContextRow, batch), H5T_NATIVE_INT64);
  H5Tinsert(t, "key", offsetof(ContextRow, key), H5T_NATIVE_UINT32);
  H5Tinsert(t, "value", offsetof(ContextRow, value), H5T_NATIVE_UINT32);
  return t;
}

Handle fixed_string_type(std::size_t size) {
  Handle t = type(H5Tcopy(H5T_C_S1));
  H5Tset_size(t, size == 0 ? 1 : size);
  H5Tset_strpad(t, H5T_STR_NULLPAD);
  return t;
}

Handle action_enum_type() {
  Handle t = type(H5Tenum_create(H5T_NATIVE_UINT8));
  for (int i = 0; i < kActionCount; ++i) {
    const auto value = static_cast<std::uint8_t>(i);
    H5Tenum_insert(t, std::string(action_name(static_cast<Action>(i))).c_str(), &value);
  }
  return t;
}

Handle event_type() {
  Handle t = event_type_v0();
  H5Tinsert(t, "flags", offsetof(Event, flags), H5T_NATIVE_UINT8);
  return t;
}

Handle event_type_v0() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(Event)));
  H5Tinsert(t, "t_ns", offsetof(Event, t_ns), H5T_NATIVE_INT64);
  H5Tinsert(t, "addr", offsetof(Event, addr), H5T_NATIVE_UINT64);
  H5Tinsert(t, "size", offsetof(Event, size), H5T_NATIVE_UINT64);
  H5Tinsert(t, "stream", offsetof(Event, stream), H5T_NATIVE_UINT64);
  H5Tinsert(t, "batch", offsetof(Event, batch), H5T_NATIVE_INT64);
  H5Tinsert(t, "stack_id", offsetof(Event, stack_id), H5T_NATIVE_INT32);
  H5Tinsert(t, "device", offsetof(Event, device), H5T_NATIVE_INT16);
  auto action = action_enum_type();
  H5Tinsert(t, "action", offsetof(Event, action), action);
  return t;
}

Handle rank_row_type() {
  Handle t = rank_row_type_v2();
  H5Tset_size(t, sizeof(RankRow));
  H5Tinsert(t, "outside_allocator_bytes", offsetof(RankRow, outside_allocator_bytes), H5T_NATIVE_INT64);
  return t;
}

Handle rank_row_type_v2() {
  Handle t = rank_row_type_v1();
  H5Tset_size(t, h5::kRankRowV2Bytes);
  H5Tinsert(t, "memory_cap_bytes", offsetof(RankRow, memory_cap_bytes), H5T_NATIVE_UINT64);
  H5Tinsert(t, "numbers_from_message", offsetof(RankRow, numbers_from_message), H5T_NATIVE_UINT32);
  return t;
}

Handle rank_row_type_v1() {
  Handle t = rank_row_type_v0();
  H5Tset_size(t, kRankRowV1Bytes);
  H5Tinsert(t, "collectives_recorded", offsetof(RankRow, collectives_recorded), H5T_NATIVE_UINT64);
  H5Tinsert(t, "collectives_overwritten", offsetof(RankRow, collectives_overwritten), H5T_NATIVE_UINT64);
  H5Tinsert(t, "collectives_in_flight", offsetof(RankRow, collectives_in_flight), H5T_NATIVE_UINT64);
  return t;
}

Handle rank_row_type_v0() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, kRankRowV0Bytes));
#define OOMFLIGHT_FIELD(name, h5type) H5Tinsert(t, #name, offsetof(RankRow, name), h5type)
  OOMFLIGHT_FIELD(rank, H5T_NATIVE_INT32);
  OOMFLIGHT_FIELD(local_rank, H5T_NATIVE_INT32);
  OOMFLIGHT_FIELD(device, H5T_NATIVE_INT32);
  OOMFLIGHT_FIELD(is_origin, H5T_NATIVE_INT32);
  OOMFLIGHT_FIELD(pid, H5T_NATIVE_INT64);
  OOMFLIGHT_FIELD(batch, H5T_NATIVE_INT64);
  OOMFLIGHT_FIELD(allocated_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(reserved_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(peak_allocated_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(peak_reserved_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(device_capacity_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(device_free_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(oom_requested_bytes, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(event_offset, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(event_count, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(events_recorded, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(overwritten, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(dropped, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(unreadable, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(stack_offset, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(stack_count, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(frame_offset, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(frame_count, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(string_offset, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(string_count, H5T_NATIVE_UINT64);
  OOMFLIGHT_FIELD(freeze_t_ns, H5T_NATIVE_INT64);
  OOMFLIGHT_FIELD(anchor_monotonic_ns, H5T_NATIVE_INT64);
  OOMFLIGHT_FIELD(anchor_realtime_ns, H5T_NATIVE_INT64);
#undef OOMFLIGHT_FIELD
  auto host = fixed_string_type(sizeof(RankRow::host));
  H5Tinsert(t, "host", offsetof(RankRow, host), host);
  auto reason = fixed_string_type(sizeof(RankRow::reason));
  H5Tinsert(t, "reason", offsetof(RankRow, reason), reason);
  return t;
}

Handle stack_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(StackRow)));
  H5Tinsert(t, "frame_offset", offsetof(StackRow, frame_offset), H5T_NATIVE_UINT64);
  H5Tinsert(t, "frame_count", offsetof(StackRow, frame_count), H5T_NATIVE_UINT32);
  return t;
}

Handle frame_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(FrameRow)));
  H5Tinsert(t, "function", offsetof(FrameRow, function), H5T_NATIVE_UINT32);
  H5Tinsert(t, "file", offsetof(FrameRow, file), H5T_NATIVE_UINT32);
  H5Tinsert(t, "line", offsetof(FrameRow, line), H5T_NATIVE_INT32);
  return t;
}

Handle string_row_type() {
  Handle t = type(H5Tcreate(H5T_COMPOUND, sizeof(StringRow)));
  H5Tinsert(t, "offset", offsetof(StringRow, offset), H5T_NATIVE_UINT64);
  H5Tinsert(t, "length", offsetof(StringRow, length), H5T_NATIVE_UINT64);
  return t;
}

}  // namespace oomflight::h5
