// The C API in one process (no mpirun: world size 1): versions, error codes, stacks, per-device gauges and dump
// kinds, checked in the archives it writes.
#include <gtest/gtest.h>

#include <cstddef>
#include "oomflight/format/archive_merge.hpp"
#include <sys/wait.h>
#include <unistd.h>
#include <iterator>
#include <map>
#include <filesystem>
#include <fstream>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "oomflight/format/archive_reader.hpp"
#include "oomflight/oomflight.h"
#include "test_support.hpp"

namespace oomflight {
namespace {

std::string last_error() { return oomflight_last_error(); }

TEST(CApiWithoutInit, VersionAbiAndStateErrors) {
  (void)oomflight_shutdown();  // whatever ran before in this process: from here, nothing was started
  EXPECT_EQ(oomflight_abi_version(), OOMFLIGHT_ABI_VERSION);
  EXPECT_STREQ(oomflight_version(), OOMFLIGHT_VERSION_STRING);
  EXPECT_EQ(oomflight_launched_by_mpi(), 0);  // ctest is no MPI launcher
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 1, 2, 0, -1), OOMFLIGHT_ESTATE);
  EXPECT_NE(last_error().find("oomflight_record: oomflight_init was not called"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_trigger_oom(0, "x", 1, 1), OOMFLIGHT_ESTATE);
  EXPECT_EQ(oomflight_shutdown(), OOMFLIGHT_ESTATE);
  EXPECT_EQ(oomflight_is_oom("torch.OutOfMemoryError", nullptr), 1);
  EXPECT_EQ(oomflight_is_oom(nullptr, "connection refused"), 0);
  EXPECT_EQ(oomflight_log(7, "x"), OOMFLIGHT_EINVAL);
  EXPECT_EQ(oomflight_log(OOMFLIGHT_LOG_INFO, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_STREQ(oomflight_last_dump_path(), "");
}

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OOMFLIGHT_FOLDER", dir_.path().c_str(), 1);
    setenv("OOMFLIGHT_RUN_NAME", "capi", 1);
  }
  void TearDown() override {
    oomflight_shutdown();
    for (const char* name : {"OOMFLIGHT_FOLDER", "OOMFLIGHT_RUN_NAME", "OOMFLIGHT_MAX_ENTRIES", "OOMFLIGHT_ENABLED",
                             "OOMFLIGHT_MAX_BATCHES", "OOMFLIGHT_SKIP_BATCHES",
                             "OOMFLIGHT_SNAPSHOT_EVERY", "NCCL_DEBUG", "NCCL_IB_AUTH_TOKEN"}) {
      unsetenv(name);
    }
  }
  std::string path(const std::string& name) const { return (dir_.path() / name).string(); }
  test::TempDir dir_;
};

// A fork's child is not a rank: the session it inherits has no watcher there. Its calls find no session, its exit
// (status 0: the leave agreement and MPI_Finalize of a rank) ends nothing, and the parent's session goes on.
TEST_F(CApi, AForkedChildHasNoSessionAndItsExitEndsNothing) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000, 512, 0, -1), OOMFLIGHT_OK);
  const pid_t child = fork();
  if (child == 0) {
    const int rank = oomflight_rank(nullptr, nullptr);
    const int record = oomflight_record(OOMFLIGHT_ALLOC, 0, 0x2000, 512, 0, -1);
    std::exit(rank == OOMFLIGHT_ESTATE && record == OOMFLIGHT_ESTATE ? 0 : 3);
  }
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  int rank = -1;
  EXPECT_EQ(oomflight_rank(&rank, nullptr), OOMFLIGHT_OK) << "the parent's session goes on";
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x3000, 512, 0, -1), OOMFLIGHT_OK);
  EXPECT_EQ(oomflight_shutdown(), OOMFLIGHT_OK);
}

// oomflight_last_error() is a buffer that no exit handler can find destroyed; a message longer than it is cut,
// and says so.
TEST_F(CApi, AnErrorLongerThanTheBufferIsCutAndSaysSo) {
  const std::string key(10000, 'k');
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK);
  std::vector<const char*> names = {key.c_str()};
  std::vector<const char*> values = {"1"};
  EXPECT_EQ(oomflight_init_settings(names.data(), values.data(), 1), OOMFLIGHT_ESTATE);  // already initialised
  EXPECT_EQ(oomflight_set_metadata("", "x"), OOMFLIGHT_EINVAL);
  const std::string error = last_error();
  EXPECT_EQ(error, "oomflight_set_metadata: key is NULL or empty, or value is NULL");
  ASSERT_EQ(oomflight_shutdown(), OOMFLIGHT_OK);
  EXPECT_EQ(oomflight_init_settings(names.data(), values.data(), 1), OOMFLIGHT_ECONFIG);  // an unknown name
  const std::string cut = last_error();
  EXPECT_EQ(cut.size(), 4095u);
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
  EXPECT_NE(cut.find("kkkk"), std::string::npos) << cut.substr(0, 200);
}

TEST_F(CApi, ABadSettingIsEconfigNamingTheVariable) {
  setenv("OOMFLIGHT_MAX_ENTRIES", "lots", 1);
  EXPECT_EQ(oomflight_init(), OOMFLIGHT_ECONFIG);
  EXPECT_NE(last_error().find("OOMFLIGHT_MAX_ENTRIES='lots'"), std::string::npos) << last_error();
  // The job's later calls say why oomflight is not there, not that nobody started it.
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 1, 2, 0, -1), OOMFLIGHT_ESTATE);
  EXPECT_NE(last_error().find("oomflight_record: oomflight did not start: "), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("OOMFLIGHT_MAX_ENTRIES='lots'"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_shutdown(), OOMFLIGHT_ESTATE);
  EXPECT_EQ(oomflight_mark_batch(1), OOMFLIGHT_ESTATE);
  EXPECT_NE(last_error().find("oomflight_init was not called (or oomflight_shutdown was)"), std::string::npos)
      << last_error();
}

TEST_F(CApi, InitTwiceIsEstate) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_init(), OOMFLIGHT_ESTATE);
  int rank = -1, size = -1;
  EXPECT_EQ(oomflight_rank(&rank, &size), OOMFLIGHT_OK);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
}

TEST_F(CApi, ArgumentsOutOfRangeAreEinvalNamingThem) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ACTION_COUNT, 0, 0, 0, 0, -1), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("action 10"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, -1, 0, 0, 0, -1), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("device -1"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_mark_batch(-3), OOMFLIGHT_EINVAL);
  int32_t id = 0;
  EXPECT_EQ(oomflight_intern_stack(nullptr, 1, &id), OOMFLIGHT_EINVAL);
  const oomflight_frame null_file = {"f", nullptr, 1};
  EXPECT_EQ(oomflight_intern_stack(&null_file, 1, &id), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("frame 0"), std::string::npos) << last_error();
  oomflight_memory memory = OOMFLIGHT_MEMORY_INIT;
  EXPECT_EQ(oomflight_set_memory(64, &memory), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("device 64"), std::string::npos) << last_error();
  memory.struct_size = 8;
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  EXPECT_EQ(oomflight_request_dump(nullptr, nullptr), OOMFLIGHT_EINVAL);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = 9;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("kind 9"), std::string::npos) << last_error();
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  request.device = 64;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_TRUE(test::files_with_suffix(dir_.path(), ".h5").empty());  // nothing was dumped by a refused call
}

// A negative figure that reached the C API as unsigned (C's -1, a wrapped ctypes conversion: free = capacity -
// reserved with reserved above the capacity) is refused naming the argument and its value, never stored as 2^64 -
// 512 MiB ("device free 16777216.00 TiB of 8.00 GiB" in the report, issue 39); so is free memory above the device.
TEST_F(CApi, NegativeAndImpossibleFiguresAreRefusedNamingTheArgumentAndItsValue) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  constexpr std::uint64_t GiB = std::uint64_t{1} << 30;
  const std::uint64_t minus_half_gib = static_cast<std::uint64_t>(-static_cast<std::int64_t>(GiB / 2));
  oomflight_memory memory = OOMFLIGHT_MEMORY_INIT;
  memory.reserved_bytes = 8 * GiB + GiB / 2;
  memory.device_capacity_bytes = 8 * GiB;
  memory.device_free_bytes = minus_half_gib;
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  EXPECT_EQ(last_error(), "oomflight_set_memory: device_free_bytes is -536870912 (18446744073172680704 as an unsigned "
                          "64-bit number): a figure of bytes is 0 .. 2^63 - 1");
  memory.device_free_bytes = 9 * GiB;
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  EXPECT_EQ(last_error(), "oomflight_set_memory: device_free_bytes 9663676416 is above device_capacity_bytes "
                          "8589934592");
  memory.device_free_bytes = 0;
  memory.memory_cap_bytes = 9 * GiB;
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("memory_cap_bytes 9663676416 is above device_capacity_bytes"), std::string::npos);
  memory.memory_cap_bytes = 0;
  memory.peak_allocated_bytes = ~std::uint64_t{0};
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("peak_allocated_bytes is -1"), std::string::npos) << last_error();

  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000, ~std::uint64_t{0}, 0, -1), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("oomflight_record: size is -1"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_record(OOMFLIGHT_OOM, 0, minus_half_gib, 1024, 0, -1), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("addr (an oom event's free bytes) is -536870912"), std::string::npos) << last_error();
  // An address is any 64-bit number.
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, ~std::uint64_t{0} - 4095, 512, 0, -1), OOMFLIGHT_OK);

  EXPECT_EQ(oomflight_trigger_oom(0, "x", minus_half_gib, 0), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("oomflight_trigger_oom: requested_bytes is -536870912"), std::string::npos);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  request.device_free_bytes = minus_half_gib;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("oomflight_request_dump: device_free_bytes is -536870912"), std::string::npos);
  request.device_free_bytes = 0;
  request.batch = -2;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("batch -2 is below -1"), std::string::npos) << last_error();
  request.batch = -1;
  oomflight_block_state block{0x1000, ~std::uint64_t{0}, 512, -1, 0};
  oomflight_segment_state segment{0x1000, 2 << 20, 0, 0, 0};
  request.segments = &segment;
  request.segment_count = 1;
  request.blocks = &block;
  request.block_count = 1;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("blocks[0].size is -1"), std::string::npos) << last_error();
  EXPECT_TRUE(test::files_with_suffix(dir_.path(), ".h5").empty());  // nothing was dumped by a refused call
  // Nothing refused was published: a dump reports the figures of before.
  oomflight_memory good = OOMFLIGHT_MEMORY_INIT;
  good.device_capacity_bytes = 8 * GiB;
  good.device_free_bytes = GiB;
  ASSERT_EQ(oomflight_set_memory(0, &good), OOMFLIGHT_OK);
  memory.peak_allocated_bytes = 0;
  memory.device_free_bytes = minus_half_gib;
  EXPECT_EQ(oomflight_set_memory(0, &memory), OOMFLIGHT_EINVAL);
  request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const Archive a = read_archive(oomflight_last_dump_path());
  ASSERT_EQ(a.ranks.size(), 1u);
  EXPECT_EQ(a.ranks[0].device_free_bytes, GiB);
  EXPECT_EQ(a.ranks[0].device_capacity_bytes, 8 * GiB);
}

// A source that knows its allocator's state (PyTorch's segments) gives it with the request: it lands in the
// archive as the rank's /state_segments and /state_blocks, stacks as interned; bad rows are refused by name.
TEST_F(CApi, CollectivesAndCommunicatorsReachTheArchiveAndMerge) {
  oomflight_collective c = OOMFLIGHT_COLLECTIVE_INIT;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_ESTATE);  // before init
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_record_collective(nullptr), OOMFLIGHT_EINVAL);
  c.op = OOMFLIGHT_COLL_OP_COUNT;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("op 12 is not an enum oomflight_collective_op"), std::string::npos) << last_error();
  c.op = OOMFLIGHT_COLL_ALLGATHER;
  c.datatype = 12;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_EINVAL);
  c.datatype = OOMFLIGHT_DTYPE_BFLOAT16;
  c.phase = 2;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_EINVAL);
  c.phase = OOMFLIGHT_COLL_START;
  c.peer = -2;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_EINVAL);
  c.peer = -1;
  c.struct_size = 32;
  EXPECT_EQ(oomflight_record_collective(&c), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("struct_size 32"), std::string::npos) << last_error();
  c.struct_size = sizeof(c);
  EXPECT_EQ(oomflight_register_communicator(5, "pg", 2, 2), OOMFLIGHT_EINVAL);
  ASSERT_EQ(oomflight_register_communicator(0x5eed, "tp-group", 1, 2), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_mark_batch(4), OOMFLIGHT_OK);
  c.comm_id = 0x5eed;
  c.seq = 11;
  c.count = 1 << 20;
  c.stream = 0x77;
  ASSERT_EQ(oomflight_record_collective(&c), OOMFLIGHT_OK) << last_error();
  c.phase = OOMFLIGHT_COLL_END;
  c.flags = OOMFLIGHT_COLL_DEVICE_COMPLETION;
  ASSERT_EQ(oomflight_record_collective(&c), OOMFLIGHT_OK);
  oomflight_collective send = OOMFLIGHT_COLLECTIVE_INIT;
  send.op = OOMFLIGHT_COLL_SEND;
  send.comm_id = 0x5eed;
  send.peer = 0;
  send.bytes = 1000;  // given: kept, whatever the datatype says
  ASSERT_EQ(oomflight_record_collective(&send), OOMFLIGHT_OK);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const std::string written = oomflight_last_dump_path();
  for (const std::string& file : {written, path("merged.h5")}) {
    if (file != written) merge_archives({written}, file);
    const Archive a = read_archive(file);
    const auto rows = a.collectives_of(0);
    ASSERT_EQ(rows.size(), 3u) << file;
    EXPECT_EQ(rows[0].op, CollectiveOp::allgather);
    EXPECT_EQ(rows[0].datatype, DataType::bfloat16);
    EXPECT_EQ(rows[0].bytes, 2u << 20);  // count x 2 bytes
    EXPECT_EQ(rows[0].seq, 11u);
    EXPECT_EQ(rows[0].stream, 0x77u);
    EXPECT_EQ(rows[0].batch, 4);
    EXPECT_EQ(rows[0].phase, CollectivePhase::start);
    EXPECT_EQ(rows[1].phase, CollectivePhase::end);
    EXPECT_EQ(rows[1].flags, kCollectiveDeviceCompletion);
    EXPECT_LE(rows[0].t_ns, rows[1].t_ns);
    EXPECT_EQ(rows[2].op, CollectiveOp::send);
    EXPECT_EQ(rows[2].bytes, 1000u);
    EXPECT_EQ(rows[2].peer, 0);
    ASSERT_NE(a.rank_row(0), nullptr);
    EXPECT_EQ(a.rank_row(0)->collectives_recorded, 3u);
    EXPECT_EQ(a.rank_row(0)->collectives_overwritten, 0u);
    const auto comms = a.communicators_of(0);
    ASSERT_EQ(comms.size(), 2u);  // "world" from init, then the job's own
    EXPECT_EQ(fixed_string(comms[0].name), "world");
    EXPECT_EQ(comms[0].comm_id, oomflight_world_communicator());
    EXPECT_EQ(comms[0].comm_size, 1);
    EXPECT_EQ(fixed_string(comms[1].name), "tp-group");
    EXPECT_EQ(comms[1].comm_rank, 1);
    EXPECT_EQ(comms[1].comm_size, 2);
  }
}

TEST_F(CApi, TheAllocatorStateGivenWithARequestReachesTheArchive) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  const oomflight_frame f[] = {{"forward", "model.py", 42}};
  int32_t stack = -1;
  ASSERT_EQ(oomflight_intern_stack(f, 1, &stack), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x10000, 1000, 0, stack), OOMFLIGHT_OK);
  const oomflight_segment_state segments[] = {{0x10000, 2u << 20, 0, 0, 0}};
  oomflight_block_state blocks[] = {{0x10000, 1024, 1000, stack, 0}, {0x10400, (2u << 20) - 1024, 0, -1, 2}};
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  request.segments = segments;
  request.segment_count = 1;
  request.blocks = blocks;
  request.block_count = 2;
  blocks[1].state = 3;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("blocks[1].state 3"), std::string::npos) << last_error();
  blocks[1].state = 2;
  blocks[0].stack_id = 99;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("blocks[0].stack_id 99 was not interned"), std::string::npos) << last_error();
  blocks[0].stack_id = stack;
  request.blocks = nullptr;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  request.blocks = blocks;
  EXPECT_TRUE(test::files_with_suffix(dir_.path(), ".h5").empty());  // nothing was dumped by a refused call
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const Archive archive = read_archive(oomflight_last_dump_path());
  const auto segs = archive.state_segments_of(0);
  const auto rows = archive.state_blocks_of(0);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].total_size, 2u << 20);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].size, 1024u);
  EXPECT_EQ(rows[0].requested_size, 1000u);
  EXPECT_EQ(rows[0].state, BlockState::active_allocated);
  ASSERT_EQ(archive.stack(rows[0].stack_id).size(), 1u);
  EXPECT_EQ(archive.string(archive.stack(rows[0].stack_id)[0]->function), "forward");
  EXPECT_EQ(rows[1].state, BlockState::inactive);
  EXPECT_EQ(rows[1].stack_id, kNoStack);
  EXPECT_EQ(segs[0].segment_type, SegmentType::unknown);  // no details given
  EXPECT_EQ(segs[0].stack_id, kNoStack);
  // The segment details (0.2.1): type, pool and frames of each segment; bad ones refused by name.
  oomflight_segment_detail details[] = {{{3, 7}, stack, 1}};
  request.segment_details = details;
  details[0].segment_type = 2;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("segment_details[0].segment_type 2"), std::string::npos) << last_error();
  details[0].segment_type = 1;
  details[0].stack_id = 99;
  EXPECT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("segment_details[0].stack_id 99 was not interned"), std::string::npos) << last_error();
  details[0].stack_id = stack;
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const Archive detailed = read_archive(oomflight_last_dump_path());
  ASSERT_EQ(detailed.state_segments_of(0).size(), 1u);
  const StateSegmentRow& seg = detailed.state_segments_of(0)[0];
  EXPECT_EQ(seg.segment_type, SegmentType::small);
  EXPECT_EQ(seg.segment_pool_id[0], 3u);
  EXPECT_EQ(seg.segment_pool_id[1], 7u);
  EXPECT_EQ(detailed.string(detailed.stack(seg.stack_id)[0]->function), "forward");
  // A caller built against the 0.2.0 header passes 80 bytes: its state is read, the details are not.
  request.struct_size = offsetof(oomflight_dump_request, segment_details);
  details[0].segment_type = 7;  // beyond the struct the caller has: must not be read
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const Archive shorter = read_archive(oomflight_last_dump_path());
  ASSERT_EQ(shorter.state_segments_of(0).size(), 1u);
  EXPECT_EQ(shorter.state_segments_of(0)[0].segment_type, SegmentType::unknown);
  // A caller built against the 1.0 header passes the shorter struct: accepted, and no state is read.
  oomflight_dump_request old = OOMFLIGHT_DUMP_REQUEST_INIT;
  old.kind = OOMFLIGHT_DUMP_SIGNAL;
  old.struct_size = offsetof(oomflight_dump_request, segments);
  old.segment_count = 5;  // beyond the struct the caller has: must not be read
  ASSERT_EQ(oomflight_request_dump(&old, nullptr), OOMFLIGHT_OK) << last_error();
  EXPECT_TRUE(read_archive(oomflight_last_dump_path()).state_segments.empty());
}

TEST_F(CApi, ASignalDumpCarriesItsKindBatchDeviceGaugesAndStacks) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  const oomflight_frame a[] = {{"forward", "model.py", 42}, {"main", "train.py", 7}};
  const oomflight_frame b[] = {{"backward", "model.py", 50}};
  int32_t sa = -1, sb = -1, again = -1;
  ASSERT_EQ(oomflight_intern_stack(a, 2, &sa), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_intern_stack(b, 1, &sb), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_intern_stack(a, 2, &again), OOMFLIGHT_OK);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(sa, again);
  oomflight_memory device1 = OOMFLIGHT_MEMORY_INIT, device3 = OOMFLIGHT_MEMORY_INIT;
  device1.allocated_bytes = 111;
  device3.allocated_bytes = 3000;
  device3.reserved_bytes = 4000;
  device3.peak_allocated_bytes = 3500;
  device3.peak_reserved_bytes = 4500;
  device3.device_capacity_bytes = 80000;
  device3.device_free_bytes = 76000;
  ASSERT_EQ(oomflight_set_memory(3, &device3), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_set_memory(1, &device1), OOMFLIGHT_OK);  // the current device is 1 now
  ASSERT_EQ(oomflight_mark_batch(4), OOMFLIGHT_OK);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 3, 0x1000u * i, 256, 7, i % 2 ? sb : sa), 0);

  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  request.reason = "asked by a test";
  request.device = 3;
  request.batch = 5;
  oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
  ASSERT_EQ(oomflight_request_dump(&request, &result), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(result.status, OOMFLIGHT_DUMP_ARCHIVE);
  EXPECT_EQ(result.ranks_written, 1);
  EXPECT_EQ(result.world_size, 1);
  EXPECT_EQ(result.batch, 5);
  EXPECT_GT(result.seconds, 0.0);
  EXPECT_EQ(std::string(oomflight_last_dump_path()), path("signal.5.h5"));

  const Archive archive = read_archive(path("signal.5.h5"));
  EXPECT_EQ(archive.header.kind, "signal");
  EXPECT_EQ(archive.header.run_name, "capi");
  EXPECT_EQ(archive.header.reason, "rank 0: asked by a test");
  EXPECT_EQ(archive.header.origin_ranks, std::vector<std::int32_t>{0});
  ASSERT_EQ(archive.ranks.size(), 1u);
  const RankRow& row = archive.ranks[0];
  EXPECT_EQ(row.device, 3);
  EXPECT_EQ(row.batch, 5);
  EXPECT_EQ(row.allocated_bytes, 3000u);
  EXPECT_EQ(row.reserved_bytes, 4000u);
  EXPECT_EQ(row.peak_reserved_bytes, 4500u);
  EXPECT_EQ(row.device_capacity_bytes, 80000u);
  EXPECT_EQ(row.device_free_bytes, 76000u);
  EXPECT_EQ(row.oom_requested_bytes, 0u);
  ASSERT_EQ(archive.events.size(), 11u);  // the step event and ten allocs
  EXPECT_EQ(archive.events[0].action, Action::step);
  EXPECT_EQ(archive.events[0].batch, 4);
  for (std::size_t i = 1; i < archive.events.size(); ++i) {
    EXPECT_EQ(archive.events[i].device, 3);
    EXPECT_EQ(archive.events[i].stream, 7u);
  }
  const auto frames = archive.stack(archive.events[1].stack_id);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(archive.string(frames[0]->function), "forward");
  EXPECT_EQ(archive.string(frames[1]->file), "train.py");
  EXPECT_EQ(frames[1]->line, 7);
  EXPECT_EQ(archive.stack(archive.events[2].stack_id).at(0)->line, 50);
}

// Every archive carries the per-batch table: each batch's end figures, its own peaks (reset at the batch mark)
// and its event counts; the batch running at the dump is the last row, with no end time.
TEST_F(CApi, EveryArchiveCarriesThePerBatchFigures) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  const auto publish = [](std::uint64_t allocated, std::uint64_t reserved) {
    oomflight_memory m = OOMFLIGHT_MEMORY_INIT;
    m.allocated_bytes = allocated;
    m.reserved_bytes = reserved;
    m.device_capacity_bytes = 1000;
    m.device_free_bytes = 1000 - reserved;
    ASSERT_EQ(oomflight_set_memory(0, &m), OOMFLIGHT_OK);
  };
  publish(100, 200);
  ASSERT_EQ(oomflight_mark_batch(0), OOMFLIGHT_OK);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x100u * i, 100, 0, -1), 0);
  publish(400, 500);
  ASSERT_EQ(oomflight_record(OOMFLIGHT_FREE_COMPLETED, 0, 0, 100, 0, -1), 0);
  publish(300, 500);
  ASSERT_EQ(oomflight_mark_batch(1), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x900, 50, 0, -1), 0);
  publish(350, 500);
  ASSERT_EQ(oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 600 B", 600, 500), OOMFLIGHT_OK);

  const Archive a = read_archive(oomflight_last_dump_path());
  const auto rows = a.batches_of(0);
  ASSERT_EQ(rows.size(), 2u);
  const BatchRow& first = rows[0];
  EXPECT_EQ(first.batch, 0);
  EXPECT_GT(first.end_t_ns, first.start_t_ns);
  EXPECT_EQ(first.allocated_bytes, 300u);
  EXPECT_EQ(first.reserved_bytes, 500u);
  EXPECT_EQ(first.peak_allocated_bytes, 400u);  // between two publications, not at either end
  EXPECT_EQ(first.peak_reserved_bytes, 500u);
  EXPECT_EQ(first.device_capacity_bytes, 1000u);
  EXPECT_EQ(first.device_free_bytes, 500u);
  EXPECT_EQ(first.alloc_events, 3u);
  EXPECT_EQ(first.free_events, 1u);
  EXPECT_EQ(first.oom_events, 0u);
  const BatchRow& running = rows[1];
  EXPECT_EQ(running.batch, 1);
  EXPECT_EQ(running.end_t_ns, 0);  // still running at the dump
  EXPECT_EQ(running.start_t_ns, first.end_t_ns);
  EXPECT_EQ(running.peak_allocated_bytes, 350u);  // reset to 300 at the mark, then 350
  EXPECT_EQ(running.alloc_events, 1u);
  EXPECT_EQ(running.oom_events, 1u);
}

// One process writes from two threads: the batch thread's snapshots and another thread's dumps. Debian's HDF5 is not
// built thread-safe, so the two must never be in it at once; every file stays whole and readable.
TEST_F(CApi, DumpsFromAnotherThreadDuringSnapshotsLeaveEveryFileWhole) {
  setenv("OOMFLIGHT_SKIP_BATCHES", "0", 1);  // windows of one batch each, from batch 0: marks 1 .. 40 close 0 .. 39
  setenv("OOMFLIGHT_SNAPSHOT_EVERY", "1ba", 1);
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  constexpr int kBatches = 40;
  constexpr int kDumps = 40;
  std::thread dumper([] {
    for (int i = 0; i < kDumps; ++i) {
      oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
      request.kind = OOMFLIGHT_DUMP_SIGNAL;
      request.reason = "from another thread";
      request.batch = 1000 + i;
      oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
      EXPECT_EQ(oomflight_request_dump(&request, &result), OOMFLIGHT_OK) << last_error();
    }
  });
  for (int b = 0; b <= kBatches; ++b) {
    for (int i = 0; i < 100; ++i) {  // nothing stays live: a window holds its own events only
      ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000u * i, 64, 0, -1), 0);
      ASSERT_EQ(oomflight_record(OOMFLIGHT_FREE_COMPLETED, 0, 0x1000u * i, 64, 0, -1), 0);
    }
    ASSERT_EQ(oomflight_mark_batch(b), OOMFLIGHT_OK);
  }
  dumper.join();
  for (int i = 0; i < kDumps; ++i) {
    const Archive a = read_archive(path("signal." + std::to_string(1000 + i) + ".h5"));
    EXPECT_EQ(a.header.kind, "signal");
    ASSERT_EQ(a.ranks.size(), 1u);
    EXPECT_EQ(a.ranks[0].batch, 1000 + i);
    EXPECT_LE(a.events.size(), std::size_t{(kBatches + 1) * 201});  // what the batch thread had recorded by then
  }
  int snapshots = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("snapshot.", 0) != 0) continue;
    const Archive a = read_archive(entry.path().string());
    EXPECT_EQ(a.header.kind, "snapshot");
    EXPECT_EQ(a.events.size(), 201u) << name;  // a window of one batch: its step and its 100 allocations and frees
    ++snapshots;
  }
  EXPECT_EQ(snapshots, kBatches);
}

// The archive's context: the rank's environment (facts and the variables that shape a job) and the metadata the
// job set, each with its batch; secret-looking values never reach the file, and merge keeps the context.
TEST_F(CApi, TheArchiveHoldsTheEnvironmentAndMetadataWithSecretsRedacted) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_IB_AUTH_TOKEN", "s3cr3t-env-value", 1);
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_set_metadata(nullptr, "x"), OOMFLIGHT_EINVAL);
  EXPECT_EQ(oomflight_set_metadata("", "x"), OOMFLIGHT_EINVAL);
  ASSERT_EQ(oomflight_set_metadata("epoch", "3"), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_mark_batch(2), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_set_metadata("learning_rate", "0.001"), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_set_metadata("hf_token", "hf_s3cr3t-metadata"), OOMFLIGHT_OK);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const std::string path = oomflight_last_dump_path();

  const auto check = [](const Archive& a) {
    std::map<std::string, std::pair<std::string, std::int64_t>> env, meta;
    for (const ContextRow& c : a.context_of(0)) {
      (c.kind == 0 ? env : meta)[std::string(a.string(c.key))] = {std::string(a.string(c.value)), c.batch};
    }
    EXPECT_EQ(env["NCCL_DEBUG"].first, "INFO");
    EXPECT_EQ(env["NCCL_IB_AUTH_TOKEN"].first, "<redacted>");
    EXPECT_EQ(env["OOMFLIGHT_RUN_NAME"].first, "capi");
    EXPECT_EQ(env["pid"].first, std::to_string(getpid()));
    EXPECT_EQ(env["oomflight_version"].first, oomflight_version());
    EXPECT_FALSE(env["command_line"].first.empty());
    EXPECT_EQ(meta["epoch"], (std::pair<std::string, std::int64_t>{"3", -1}));
    EXPECT_EQ(meta["learning_rate"], (std::pair<std::string, std::int64_t>{"0.001", 2}));
    EXPECT_EQ(meta["hf_token"].first, "<redacted>");
  };
  check(read_archive(path));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.find("s3cr3t"), std::string::npos) << "a secret reached the file";
  const std::string merged = (dir_.path() / "merged.h5").string();
  merge_archives({path}, merged);
  check(read_archive(merged));
}

TEST_F(CApi, MaxBatchesKeepsTheNewestBatches) {
  setenv("OOMFLIGHT_MAX_BATCHES", "2", 1);
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  for (int b = 0; b < 5; ++b) ASSERT_EQ(oomflight_mark_batch(b), OOMFLIGHT_OK);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  request.kind = OOMFLIGHT_DUMP_SIGNAL;
  ASSERT_EQ(oomflight_request_dump(&request, nullptr), OOMFLIGHT_OK) << last_error();
  const Archive a = read_archive(oomflight_last_dump_path());
  std::vector<std::int64_t> batches;
  for (const BatchRow& b : a.batches_of(0)) batches.push_back(b.batch);
  EXPECT_EQ(batches, (std::vector<std::int64_t>{2, 3, 4}));  // two ended batches kept, and the running one
}

TEST_F(CApi, TriggerOomRecordsTheEventOnItsDeviceAndDumps) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  oomflight_memory device1 = OOMFLIGHT_MEMORY_INIT;
  device1.reserved_bytes = 70ull << 30;
  device1.device_capacity_bytes = 80ull << 30;
  ASSERT_EQ(oomflight_set_memory(1, &device1), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_mark_batch(0), OOMFLIGHT_OK);
  EXPECT_EQ(oomflight_trigger_oom(1, "CUDA out of memory. Tried to allocate 2.00 GiB", 2ull << 30, 1ull << 30),
            OOMFLIGHT_OK)
      << last_error();
  const Archive archive = read_archive(path("oom.0.h5"));
  EXPECT_EQ(archive.header.kind, "oom");
  ASSERT_EQ(archive.events.size(), 2u);
  const Event& oom = archive.events.back();
  EXPECT_EQ(oom.action, Action::oom);
  EXPECT_EQ(oom.device, 1);
  EXPECT_EQ(oom.size, 2ull << 30);
  EXPECT_EQ(oom.addr, 1ull << 30);
  const RankRow& row = archive.ranks.at(0);
  EXPECT_EQ(row.device, 1);
  EXPECT_EQ(row.is_origin, 1);
  EXPECT_EQ(row.oom_requested_bytes, 2ull << 30);
  EXPECT_EQ(row.device_free_bytes, 1ull << 30);
  EXPECT_EQ(row.reserved_bytes, 70ull << 30);
  // A second dump of the same batch keeps the first file and takes the next name.
  EXPECT_EQ(oomflight_trigger_oom(1, "again", 1, 1), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(std::string(oomflight_last_dump_path()), path("oom.0-1.h5"));
}

// An OutOfMemoryError that no allocator hook saw: the caller has its message only (the excepthook path), and the
// figures the message states reach the row, marked as the message's; a figure the caller gives is kept (issue 30).
TEST_F(CApi, AnOomWithItsMessageOnlyTakesTheFiguresTheMessageStates) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  const char* message =
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
      "139.80 GiB of which 133.65 GiB is free. Including non-PyTorch memory, this process has 3.90 GiB memory in "
      "use. 4.00 GiB allowed; Of the allocated memory 3.50 GiB is allocated by PyTorch";
  ASSERT_EQ(oomflight_trigger_oom(0, message, 0, 0), OOMFLIGHT_OK) << last_error();
  const Archive archive = read_archive(oomflight_last_dump_path());
  const RankRow& row = archive.ranks.at(0);
  EXPECT_EQ(row.oom_requested_bytes, 2ull << 30);
  EXPECT_EQ(row.device_capacity_bytes, static_cast<std::uint64_t>(139.80 * (1ull << 30) + 0.5));
  EXPECT_EQ(row.device_free_bytes, static_cast<std::uint64_t>(133.65 * (1ull << 30) + 0.5));
  EXPECT_EQ(row.memory_cap_bytes, 4ull << 30);
  EXPECT_EQ(row.numbers_from_message, kFromMessageRequested | kFromMessageDevice | kFromMessageCap);
  // The allocator's own figures win over the message's.
  ASSERT_EQ(oomflight_trigger_oom(0, message, 3ull << 30, 0), OOMFLIGHT_OK) << last_error();
  const RankRow& second = read_archive(oomflight_last_dump_path()).ranks.at(0);
  EXPECT_EQ(second.oom_requested_bytes, 3ull << 30);
  EXPECT_EQ(second.numbers_from_message, kFromMessageDevice | kFromMessageCap);
}

TEST_F(CApi, ExplicitSettingsOverrideTheEnvironmentAndAreCheckedAlike) {
  setenv("OOMFLIGHT_MAX_ENTRIES", "lots", 1);  // overridden: never parsed
  const char* names[] = {"OOMFLIGHT_MAX_ENTRIES", "OOMFLIGHT_RUN_NAME"};
  const char* values[] = {"3", "explicit"};
  ASSERT_EQ(oomflight_init_settings(names, values, 2), OOMFLIGHT_OK) << last_error();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 4096 * i, 512, 0, -1), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_trigger_oom(0, "CUDA out of memory", 1 << 20, 0), OOMFLIGHT_OK) << last_error();
  const Archive archive = read_archive(oomflight_last_dump_path());
  EXPECT_EQ(archive.header.run_name, "explicit");
  EXPECT_EQ(archive.events.size(), 3u);  // the ring's bound is the explicit 3
  EXPECT_EQ(archive.ranks.at(0).overwritten, 3u);  // 5 allocs + the oom event, 3 kept
  ASSERT_EQ(oomflight_shutdown(), OOMFLIGHT_OK);
  EXPECT_EQ(oomflight_init(), OOMFLIGHT_ECONFIG);  // the variable alone is still checked
  EXPECT_NE(last_error().find("OOMFLIGHT_MAX_ENTRIES='lots'"), std::string::npos) << last_error();
  unsetenv("OOMFLIGHT_MAX_ENTRIES");

  const char* bad_names[] = {"OOMFLIGHT_POLL_INTERVAL"};
  const char* bad_values[] = {"soon"};
  EXPECT_EQ(oomflight_init_settings(bad_names, bad_values, 1), OOMFLIGHT_ECONFIG);
  EXPECT_NE(last_error().find("OOMFLIGHT_POLL_INTERVAL='soon'"), std::string::npos) << last_error();
  const char* unknown[] = {"OOMFLIGHT_MAX_ENTRYS"};
  EXPECT_EQ(oomflight_init_settings(unknown, values, 1), OOMFLIGHT_ECONFIG);
  EXPECT_NE(last_error().find("OOMFLIGHT_MAX_ENTRYS is not an oomflight setting"), std::string::npos) << last_error();
  EXPECT_EQ(oomflight_init_settings(nullptr, values, 1), OOMFLIGHT_EINVAL);
  const char* null_value[] = {nullptr};
  EXPECT_EQ(oomflight_init_settings(names, null_value, 1), OOMFLIGHT_EINVAL);
  EXPECT_NE(last_error().find("setting 0"), std::string::npos) << last_error();
}

TEST_F(CApi, AFilenameWithSubfoldersCreatesThem) {
  const char* names[] = {"OOMFLIGHT_FILENAME"};
  const char* values[] = {"by-batch/{batch}/{kind}.h5"};
  ASSERT_EQ(oomflight_init_settings(names, values, 1), OOMFLIGHT_OK) << last_error();
  ASSERT_EQ(oomflight_mark_batch(4), OOMFLIGHT_OK);
  ASSERT_EQ(oomflight_trigger_oom(0, "CUDA out of memory", 1 << 20, 0), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(std::string(oomflight_last_dump_path()), path("by-batch/4/oom.h5"));
  EXPECT_EQ(read_archive(oomflight_last_dump_path()).events.size(), 2u);  // the step mark and the oom event
}

// An absolute rank-local name used to make the fallback retry the same failed path: it goes under $TMPDIR instead.
TEST_F(CApi, AnAbsoluteRankFilenameFallsBackUnderTmpdir) {
  const test::TempDir tmp;
  const std::string blocked = path("not-a-folder");
  std::ofstream(blocked) << "a file where the folders would go";
  setenv("OOMFLIGHT_FOLDER", (blocked + "/archives").c_str(), 1);
  setenv("OOMFLIGHT_RANK_FILENAME", (blocked + "/{kind}.rank{rank}.h5").c_str(), 1);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved = old_tmpdir ? old_tmpdir : "";
  setenv("TMPDIR", tmp.path().c_str(), 1);
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_trigger_oom(0, "CUDA out of memory", 1 << 20, 0), OOMFLIGHT_EDUMP);
  if (old_tmpdir) setenv("TMPDIR", saved.c_str(), 1); else unsetenv("TMPDIR");
  unsetenv("OOMFLIGHT_RANK_FILENAME");
  const std::string expected =
      (tmp.path() / "oomflight-capi" / std::filesystem::path(blocked).relative_path() / "oom.rank0.h5").string();
  EXPECT_EQ(std::string(oomflight_last_dump_path()), expected);
  EXPECT_EQ(read_archive(expected).events.size(), 1u);  // the oom event: the history is kept
}

TEST_F(CApi, TheFirstHeadersTriggerDumpStillWorksOnDeviceZero) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(oomflight_trigger_dump("CUDA out of memory", 1 << 20, 5), OOMFLIGHT_OK) << last_error();
#pragma GCC diagnostic pop
  const Archive archive = read_archive(oomflight_last_dump_path());
  ASSERT_EQ(archive.events.size(), 1u);
  EXPECT_EQ(archive.events[0].action, Action::oom);
  EXPECT_EQ(archive.events[0].device, 0);
  EXPECT_EQ(archive.events[0].size, 1u << 20);
}

TEST_F(CApi, DisabledRecordsButDumpsNothing) {
  setenv("OOMFLIGHT_ENABLED", "0", 1);
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  EXPECT_EQ(oomflight_record(OOMFLIGHT_ALLOC, 0, 1, 2, 0, -1), OOMFLIGHT_OK);
  oomflight_dump_request request = OOMFLIGHT_DUMP_REQUEST_INIT;
  oomflight_dump_result result = OOMFLIGHT_DUMP_RESULT_INIT;
  EXPECT_EQ(oomflight_request_dump(&request, &result), OOMFLIGHT_EDISABLED);
  EXPECT_EQ(result.status, OOMFLIGHT_DUMP_DISABLED);
  EXPECT_TRUE(test::files_with_suffix(dir_.path(), ".h5").empty());
}

TEST_F(CApi, LogLinesNameTheRankOnceItIsKnown) {
  ASSERT_EQ(oomflight_init(), OOMFLIGHT_OK) << last_error();
  testing::internal::CaptureStderr();
  EXPECT_EQ(oomflight_log(OOMFLIGHT_LOG_WARN, "a plugin speaks"), OOMFLIGHT_OK);
  EXPECT_EQ(oomflight_log(OOMFLIGHT_LOG_DEBUG, "below the default level"), OOMFLIGHT_OK);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "oomflight[rank 0] warning: a plugin speaks\n");
}

}  // namespace
}  // namespace oomflight
