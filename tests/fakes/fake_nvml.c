/*
 * fake_nvml.c -- a stand-in libnvidia-ml.so for tests: the three NVML
 * calls memsnap's cuda runtime makes for the OOM message's process list
 * (PyTorch's reportProcessMemoryInfo), with NVML's signatures (nvml.h):
 * nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 and the unversioned
 * nvmlDeviceGetComputeRunningProcesses, which fills v1 process records.
 *
 * It links against the fake libcudart.so: a device is found by the bus id
 * the fake cudaDeviceGetPCIBusId gives ("0000:<dev + 0x10>:00.0"), and
 * this process is reported with the bytes the fake runtime charged on the
 * device.  FAKE_NVML_OTHER="<pid>:<bytes>" adds another process.  The
 * process list is reported with NVML's protocol: a count larger than the
 * caller's array gives NVML_ERROR_INSUFFICIENT_SIZE and the count needed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7
};

long long fake_cuda_used(int dev);
int fake_cuda_device_count(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                              void **device);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device,
                                                  unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos);

static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
  initialized = 1;
  return NVML_SUCCESS;
}

/* Handles are device index + 1. */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                              void **device) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (pciBusId == NULL || device == NULL ||
      sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
    return NVML_ERROR_INVALID_ARGUMENT;
  int idx = (int)bus - 0x10;
  if (dom != 0 || dev != 0 || idx < 0 || idx >= fake_cuda_device_count())
    return NVML_ERROR_NOT_FOUND;
  *device = (void *)(long)(idx + 1);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device,
                                                  unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  int idx = (int)(long)device - 1;
  if (idx < 0 || idx >= fake_cuda_device_count() || infoCount == NULL)
    return NVML_ERROR_INVALID_ARGUMENT;
  nvmlProcessInfo_v1_t p[2];
  unsigned n = 0;
  const char *other = getenv("FAKE_NVML_OTHER");
  unsigned opid = 0;
  unsigned long long obytes = 0;
  if (other != NULL && sscanf(other, "%u:%llu", &opid, &obytes) == 2)
    p[n++] = (nvmlProcessInfo_v1_t){opid, obytes};
  long long used = fake_cuda_used(idx);
  if (used > 0)
    p[n++] = (nvmlProcessInfo_v1_t){(unsigned)getpid(),
                                    (unsigned long long)used};
  if (*infoCount < n) {
    *infoCount = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  if (n > 0 && infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  memcpy(infos, p, n * sizeof *p);
  *infoCount = n;
  return NVML_SUCCESS;
}
