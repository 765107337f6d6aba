/* A stand-in for the driver's libnvidia-ml.so.1 where no GPU is (tests only): the few calls
 * core/control/src/process_device_memory.cpp makes, answering as NVML does. One GPU, which lists a process of
 * another pid and, when TEST_NVML_USED_BYTES is set, this process with that many bytes ("na": NVML's
 * NVML_VALUE_NOT_AVAILABLE). TEST_NVML_INIT_ERROR makes nvmlInit_v2 fail with that error code. A test points the
 * loader at it with LD_LIBRARY_PATH. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} ProcessInfo;

static int device_token;

/* The project builds with hidden visibility: the driver's names are exported. */
#define EXPORT __attribute__((visibility("default")))

EXPORT int nvmlInit_v2(void) {
  const char* error = getenv("TEST_NVML_INIT_ERROR");
  return error ? atoi(error) : 0;
}

EXPORT int nvmlShutdown(void) { return 0; }

EXPORT int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 1;
  return 0;
}

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index != 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
  *device = &device_token;
  return 0;
}

EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, ProcessInfo* infos) {
  const char* used = getenv("TEST_NVML_USED_BYTES");
  const unsigned int n = used ? 2 : 1;
  if (device != &device_token) return 2;
  if (*count < n) {
    *count = n;
    return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
  }
  *count = n;
  memset(infos, 0, n * sizeof(ProcessInfo));
  infos[0].pid = 1; /* another process: never this one */
  infos[0].usedGpuMemory = 1ull << 30;
  if (used) {
    infos[1].pid = (unsigned int)getpid();
    infos[1].usedGpuMemory = strcmp(used, "na") == 0 ? ~0ull : strtoull(used, NULL, 10);
  }
  return 0;
}
