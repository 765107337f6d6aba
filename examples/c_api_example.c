/* The C API in a few lines: record events for two batches, then report an out-of-memory error.
 * Run it alone (an archive of one rank) or under mpirun (one archive for all ranks):
 *   ./build/bin/oomflight_c_api_example
 *   mpirun -np 2 ./build/bin/oomflight_c_api_example
 */
#include <oomflight/oomflight.h>
#include <stdio.h>

int main(void) {
  if (oomflight_init() != 0) {
    fprintf(stderr, "oomflight_init: %s\n", oomflight_last_error());
    return 2;
  }
  const uint64_t base = 0x7f0000000000ull;
  for (int64_t batch = 0; batch < 2; ++batch) {
    oomflight_mark_batch(batch);
    oomflight_record(OOMFLIGHT_SEGMENT_ALLOC, 0, base, 20u << 20, 0, -1);
    for (uint64_t i = 0; i < 16; ++i) oomflight_record(OOMFLIGHT_ALLOC, 0, base + i * (1u << 20), 1u << 20, 0, -1);
  }
  /* cudaMalloc failed: record it and dump before letting the error propagate. */
  const int status = oomflight_trigger_dump("CUDA out of memory. Tried to allocate 2.00 GiB", 2ull << 30, 1ull << 30);
  printf("archive: %s (%s)\n", oomflight_last_dump_path(), status == 0 ? "written" : oomflight_last_error());
  oomflight_shutdown();
  return status == 0 ? 0 : 1;
}
