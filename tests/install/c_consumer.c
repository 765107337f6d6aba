/* An out-of-tree C program built against the installed package through pkg-config only
 * (cc $(pkg-config --cflags oomflight) c_consumer.c $(pkg-config --libs oomflight)): it checks the library's
 * version and ABI against the headers, records a known history and triggers an out-of-memory dump. */
#include <oomflight/oomflight.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  if (oomflight_abi_version() != OOMFLIGHT_ABI_VERSION || strcmp(oomflight_version(), OOMFLIGHT_VERSION_STRING) != 0) {
    fprintf(stderr, "c_consumer: headers %s (ABI %d) but library %s (ABI %d)\n", OOMFLIGHT_VERSION_STRING,
            OOMFLIGHT_ABI_VERSION, oomflight_version(), oomflight_abi_version());
    return 3;
  }
  if (oomflight_init() != OOMFLIGHT_OK) {
    fprintf(stderr, "c_consumer: %s\n", oomflight_last_error());
    return 2;
  }
  const struct oomflight_frame frames[] = {{"consume", "c_consumer.c", 20}};
  int32_t stack = -1;
  if (oomflight_intern_stack(frames, 1, &stack) != OOMFLIGHT_OK) return 4;
  for (int64_t batch = 0; batch < 4; ++batch) {
    oomflight_mark_batch(batch);
    for (uint64_t i = 0; i < 25; ++i) oomflight_record(OOMFLIGHT_ALLOC, 0, 0x1000 * (i + 1), 4096, 0, stack);
  }
  struct oomflight_memory gauges = OOMFLIGHT_MEMORY_INIT;
  gauges.allocated_bytes = 100 * 4096;
  gauges.reserved_bytes = 1 << 20;
  gauges.device_capacity_bytes = 16ull << 30;
  oomflight_set_memory(0, &gauges);
  const int rc = oomflight_trigger_oom(0, "CUDA out of memory. Tried to allocate 1.00 GiB", 1ull << 30, 512ull << 20);
  printf("c_consumer: oomflight %s wrote %s (rc %d)\n", oomflight_version(), oomflight_last_dump_path(), rc);
  oomflight_shutdown();
  return rc == OOMFLIGHT_OK ? 0 : 1;
}
