/* The C API in a few lines: record events for two batches with a stack and the device's gauges, then report an
 * out-of-memory error. Run it alone (an archive of one rank) or under mpirun (one archive for all ranks):
 *   ./build/bin/oomflight_c_api_example
 *   mpirun -np 2 ./build/bin/oomflight_c_api_example
 */
#include <oomflight/oomflight.h>
#include <stdio.h>

int main(void) {
  if (oomflight_abi_version() != OOMFLIGHT_ABI_VERSION) {
    fprintf(stderr, "liboomflight %s has C ABI %d; this program was built for %d\n", oomflight_version(),
            oomflight_abi_version(), OOMFLIGHT_ABI_VERSION);
    return 2;
  }
  if (oomflight_init() != OOMFLIGHT_OK) {
    fprintf(stderr, "oomflight_init: %s\n", oomflight_last_error());
    return 2;
  }
  const struct oomflight_frame frames[] = {{"forward", "model.py", 42}, {"train_step", "train.py", 7}};
  int32_t stack = -1;
  oomflight_intern_stack(frames, 2, &stack);

  const uint64_t base = 0x7f0000000000ull;
  struct oomflight_memory gauges = OOMFLIGHT_MEMORY_INIT;
  gauges.device_capacity_bytes = 80ull << 30;
  for (int64_t batch = 0; batch < 2; ++batch) {
    oomflight_mark_batch(batch);
    oomflight_record(OOMFLIGHT_SEGMENT_ALLOC, 0, base, 20u << 20, 0, -1);
    for (uint64_t i = 0; i < 16; ++i) oomflight_record(OOMFLIGHT_ALLOC, 0, base + i * (1u << 20), 1u << 20, 0, stack);
    gauges.allocated_bytes = gauges.peak_allocated_bytes = 16u << 20;
    gauges.reserved_bytes = gauges.peak_reserved_bytes = 20u << 20;
    gauges.device_free_bytes = gauges.device_capacity_bytes - gauges.reserved_bytes;
    oomflight_set_memory(0, &gauges);
  }
  /* cudaMalloc failed on device 0: record it and dump before letting the error propagate. */
  const int status = oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 2.00 GiB", 2ull << 30, 1ull << 30);
  printf("archive: %s (%s)\n", oomflight_last_dump_path(), status == OOMFLIGHT_OK ? "written" : oomflight_last_error());
  oomflight_shutdown();
  return status == OOMFLIGHT_OK ? 0 : 1;
}
