/*
 * cuda.c -- the "cuda" device runtime, loaded with dlopen.
 *
 * The runtime library is MEMSNAP_CUDA_LIBRARY when set, else the first of
 * libcudart.so, libcudart.so.13, libcudart.so.12, libcudart.so.11.0 that
 * loads.  The driver library (only for the VMM ops of expandable segments)
 * is MEMSNAP_CUDA_DRIVER_LIBRARY when set, else libcuda.so.1 or libcuda.so.
 * No vendor header is used: the few types and constants are declared below.
 *
 * Required runtime symbols: cudaSetDevice, cudaGetDeviceCount, cudaMalloc,
 * cudaFree, cudaMemGetInfo, cudaEventCreateWithFlags, cudaEventDestroy,
 * cudaEventRecord, cudaEventQuery, cudaEventSynchronize,
 * cudaDeviceSynchronize.  Optional: cudaGetDevice (restore the caller's
 * device after each call), cudaGetLastError (clear the sticky error after
 * an OOM, as PyTorch does), cudaHostAlloc/cudaFreeHost.  Driver (all of
 * them or the VMM ops answer MSNAP_ENOTSUP): cuInit, cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 * cuMemAddressFree.
 *
 * NVML (optional, for the processes named in the OOM message, PyTorch's
 * reportProcessMemoryInfo): MEMSNAP_NVML_LIBRARY when set, else
 * libnvidia-ml.so.1; nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 and
 * nvmlDeviceGetComputeRunningProcesses (the v1 process records PyTorch
 * reads), with the device's PCI bus id from cudaDeviceGetPCIBusId.
 * Without them process_memory answers MSNAP_ENOTSUP.
 *
 * Error mapping: cudaErrorMemoryAllocation (2) and CUDA_ERROR_OUT_OF_MEMORY
 * (2) -> MSNAP_EOOM; CUDA_ERROR_NOT_SUPPORTED (801) and
 * cudaErrorNotSupported (801) -> MSNAP_ENOTSUP; cudaErrorNotReady (600) from
 * cudaEventQuery means "not done"; other codes -> MSNAP_ERUNTIME.
 *
 * Invariants: the context is immutable after init (but for the atomic
 * nvml_state, set once by the first process_memory call), so calls need
 * no lock.
 * Every device call runs under a device guard (switch to `device`, switch
 * back afterwards).
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

typedef int cudaError_t;
typedef void *cudaEvent_t;
typedef void *cudaStream_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNotReady = 600,
  cudaErrorNotSupported = 801
};
enum { cudaEventDisableTiming = 0x2 };
enum { cudaHostAllocDefault = 0 };
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_SUPPORTED = 801
};
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 };
enum { CU_MEM_HANDLE_TYPE_NONE = 0x0 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };

typedef struct cu_mem_location_s {
  int type;
  int id;
} cu_mem_location_t;

typedef struct cu_mem_allocation_prop_s {
  int type;
  int requestedHandleTypes;
  cu_mem_location_t location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
} cu_mem_allocation_prop_t;

typedef struct cu_mem_access_desc_s {
  cu_mem_location_t location;
  int flags;
} cu_mem_access_desc_t;

/* nvmlProcessInfo_v1_t (nvml.h). */
typedef struct nvml_proc_v1_s {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvml_proc_v1_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INSUFFICIENT_SIZE = 7 };

typedef struct cuda_s {
  void *lib, *drv;
  char path[256];
  cudaError_t (*cudaSetDevice)(int);
  cudaError_t (*cudaGetDevice)(int *);
  cudaError_t (*cudaGetDeviceCount)(int *);
  cudaError_t (*cudaMalloc)(void **, size_t);
  cudaError_t (*cudaFree)(void *);
  cudaError_t (*cudaMemGetInfo)(size_t *, size_t *);
  cudaError_t (*cudaEventCreateWithFlags)(cudaEvent_t *, unsigned);
  cudaError_t (*cudaEventDestroy)(cudaEvent_t);
  cudaError_t (*cudaEventRecord)(cudaEvent_t, cudaStream_t);
  cudaError_t (*cudaEventQuery)(cudaEvent_t);
  cudaError_t (*cudaEventSynchronize)(cudaEvent_t);
  cudaError_t (*cudaDeviceSynchronize)(void);
  cudaError_t (*cudaGetLastError)(void);
  cudaError_t (*cudaHostAlloc)(void **, size_t, unsigned);
  cudaError_t (*cudaFreeHost)(void *);
  CUresult (*cuInit)(unsigned);
  CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                  unsigned long long);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t,
                          const cu_mem_allocation_prop_t *,
                          unsigned long long);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t,
                       CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const cu_mem_access_desc_t *,
                             size_t);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  bool has_vmm;
  char vmm_why[200];
  /* NVML (process_memory) */
  void *nvml;
  cudaError_t (*cudaDeviceGetPCIBusId)(char *, int, int);
  int (*nvmlInit_v2)(void);
  int (*nvmlDeviceGetHandleByPciBusId_v2)(const char *, void **);
  int (*nvmlDeviceGetComputeRunningProcesses)(void *, unsigned *,
                                              nvml_proc_v1_t *);
  _Atomic int nvml_state; /* 0 not initialised, 1 ready, -1 unusable */
} cuda_t;

static int cuda_err(const char *call, int e, int device) {
  int code = e == 2 ? MSNAP_EOOM : e == 801 ? MSNAP_ENOTSUP : MSNAP_ERUNTIME;
  if (device >= 0)
    return msnap__set_error(code, "cuda runtime: %s on device %d failed with "
                            "error %d", call, device, e);
  return msnap__set_error(code, "cuda runtime: %s failed with error %d", call,
                          e);
}

/* ---- device guard ------------------------------------------------------------ */

typedef struct guard_s {
  int prev;
} guard_t;

static int guard_enter(cuda_t *c, int device, guard_t *g) {
  g->prev = -1;
  int cur = -1;
  if (c->cudaGetDevice != NULL && c->cudaGetDevice(&cur) == cudaSuccess &&
      cur == device)
    return 0;
  cudaError_t e = c->cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_err("cudaSetDevice", e, device);
  if (c->cudaGetDevice != NULL && cur >= 0) g->prev = cur;
  return 0;
}

static void guard_leave(cuda_t *c, guard_t *g) {
  if (g->prev >= 0) c->cudaSetDevice(g->prev);
}

/* ---- init/fini ------------------------------------------------------------------ */


#define SYM(h, name, required)                                                \
  do {                                                                        \
    *(void **)&c->name = dlsym((h), #name);                                   \
    if ((required) && c->name == NULL) {                                      \
      missing = #name;                                                        \
      goto fail;                                                              \
    }                                                                         \
  } while (0)

/* dlopen the first loadable name; NULL with the last dlerror in why. */
static void *open_first(const char *const *names, const char **opened,
                        char *why, size_t whylen) {
  for (; *names != NULL; names++) {
    dlerror();
    void *h = dlopen(*names, RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) {
      *opened = *names;
      return h;
    }
    const char *e = dlerror();
    snprintf(why, whylen, "%s", e ? e : "unknown dlopen error");
  }
  return NULL;
}

static void load_nvml(cuda_t *c) {
  const char *env = msnap__env_get(MSNAP_ENV_NVML_LIBRARY);
  const char *defaults[] = {"libnvidia-ml.so.1", NULL};
  const char *one[] = {env, NULL};
  const char *opened = NULL;
  char why[160] = "";
  *(void **)&c->cudaDeviceGetPCIBusId = dlsym(c->lib, "cudaDeviceGetPCIBusId");
  if (c->cudaDeviceGetPCIBusId == NULL) return;
  c->nvml = open_first(env != NULL && *env ? one : defaults, &opened, why,
                       sizeof why);
  if (c->nvml == NULL) return;
  *(void **)&c->nvmlInit_v2 = dlsym(c->nvml, "nvmlInit_v2");
  *(void **)&c->nvmlDeviceGetHandleByPciBusId_v2 =
      dlsym(c->nvml, "nvmlDeviceGetHandleByPciBusId_v2");
  *(void **)&c->nvmlDeviceGetComputeRunningProcesses =
      dlsym(c->nvml, "nvmlDeviceGetComputeRunningProcesses");
  if (c->nvmlInit_v2 == NULL || c->nvmlDeviceGetHandleByPciBusId_v2 == NULL ||
      c->nvmlDeviceGetComputeRunningProcesses == NULL) {
    dlclose(c->nvml);
    c->nvml = NULL;
  }
}

static void load_driver(cuda_t *c) {
  const char *env = msnap__env_get(MSNAP_ENV_CUDA_DRIVER_LIBRARY);
  const char *defaults[] = {"libcuda.so.1", "libcuda.so", NULL};
  const char *one[] = {env, NULL};
  const char *opened = NULL;
  char why[160] = "";
  c->drv = open_first(env != NULL && *env ? one : defaults, &opened, why,
                      sizeof why);
  if (c->drv == NULL) {
    snprintf(c->vmm_why, sizeof c->vmm_why,
             "the CUDA driver library could not be loaded (%s); set "
             "MEMSNAP_CUDA_DRIVER_LIBRARY",
             why);
    return;
  }
  const char *missing = NULL;
  SYM(c->drv, cuInit, true);
  SYM(c->drv, cuMemAddressReserve, true);
  SYM(c->drv, cuMemCreate, true);
  SYM(c->drv, cuMemMap, true);
  SYM(c->drv, cuMemSetAccess, true);
  SYM(c->drv, cuMemUnmap, true);
  SYM(c->drv, cuMemRelease, true);
  SYM(c->drv, cuMemAddressFree, true);
  CUresult r = c->cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(c->vmm_why, sizeof c->vmm_why, "cuInit(0) in %s failed with "
             "error %d", opened, r);
    dlclose(c->drv);
    c->drv = NULL;
    return;
  }
  c->has_vmm = true;
  return;
fail:
  snprintf(c->vmm_why, sizeof c->vmm_why, "%s has no symbol %s", opened,
           missing);
  dlclose(c->drv);
  c->drv = NULL;
}

static int cuda_init(void **ctx) {
  const char *env = msnap__env_get(MSNAP_ENV_CUDA_LIBRARY);
  const char *defaults[] = {"libcudart.so", "libcudart.so.13",
                            "libcudart.so.12", "libcudart.so.11.0", NULL};
  const char *one[] = {env, NULL};
  const char *const *names = env != NULL && *env ? one : defaults;
  cuda_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return msnap__set_error(MSNAP_ENOMEM, "cuda runtime: out of host memory");
  const char *opened = NULL;
  char why[200] = "";
  c->lib = open_first(names, &opened, why, sizeof why);
  if (c->lib == NULL) {
    free(c);
    return msnap__set_error(
        MSNAP_ENORUNTIME,
        "cuda runtime: cannot load %s (%s); install the CUDA runtime or set "
        "MEMSNAP_CUDA_LIBRARY to the path of libcudart.so",
        names == one ? env : "libcudart.so", why);
  }
  snprintf(c->path, sizeof c->path, "%s", opened);
  const char *missing = NULL;
  SYM(c->lib, cudaSetDevice, true);
  SYM(c->lib, cudaGetDevice, false);
  SYM(c->lib, cudaGetDeviceCount, true);
  SYM(c->lib, cudaMalloc, true);
  SYM(c->lib, cudaFree, true);
  SYM(c->lib, cudaMemGetInfo, true);
  SYM(c->lib, cudaEventCreateWithFlags, true);
  SYM(c->lib, cudaEventDestroy, true);
  SYM(c->lib, cudaEventRecord, true);
  SYM(c->lib, cudaEventQuery, true);
  SYM(c->lib, cudaEventSynchronize, true);
  SYM(c->lib, cudaDeviceSynchronize, true);
  SYM(c->lib, cudaGetLastError, false);
  SYM(c->lib, cudaHostAlloc, false);
  SYM(c->lib, cudaFreeHost, false);
  load_driver(c);
  load_nvml(c);
  *ctx = c;
  return 0;
fail:
  dlclose(c->lib);
  free(c);
  return msnap__set_error(MSNAP_ENORUNTIME,
                          "cuda runtime: %s has no symbol %s (is it "
                          "libcudart.so? set MEMSNAP_CUDA_LIBRARY)",
                          opened, missing);
}

static void cuda_fini(void *ctx) {
  cuda_t *c = ctx;
  if (c == NULL) return;
  if (c->drv != NULL) dlclose(c->drv);
  if (c->nvml != NULL) dlclose(c->nvml);
  dlclose(c->lib);
  free(c);
}

static int cuda_device_count(void *ctx, int *count) {
  cuda_t *c = ctx;
  int n = 0;
  cudaError_t e = c->cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_err("cudaGetDeviceCount", e, -1);
  *count = n;
  return 0;
}

/* ---- device memory -------------------------------------------------------------- */

static int cuda_malloc(void *ctx, int device, size_t size, uint64_t *ptr) {
  cuda_t *c = ctx;
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  void *p = NULL;
  cudaError_t e = c->cudaMalloc(&p, size);
  /* An OOM leaves a sticky error in the runtime: clear it. */
  if (e != cudaSuccess && c->cudaGetLastError != NULL) c->cudaGetLastError();
  guard_leave(c, &g);
  if (e == cudaErrorMemoryAllocation)
    return msnap__set_error(MSNAP_EOOM, "cuda runtime: cudaMalloc of %zu bytes "
                            "on device %d failed: out of device memory",
                            size, device);
  if (e != cudaSuccess) return cuda_err("cudaMalloc", e, device);
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

static int cuda_free(void *ctx, int device, uint64_t ptr) {
  cuda_t *c = ctx;
  if (ptr == 0) return 0;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaFree((void *)(uintptr_t)ptr);
  guard_leave(c, &g);
  if (e != cudaSuccess)
    return msnap__set_error(MSNAP_ERUNTIME, "cuda runtime: cudaFree(0x%llx) "
                            "on device %d failed with error %d",
                            (unsigned long long)ptr, device, e);
  return 0;
}

static int cuda_mem_get_info(void *ctx, int device, size_t *free_bytes,
                             size_t *total_bytes) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  size_t f = 0, t = 0;
  cudaError_t e = c->cudaMemGetInfo(&f, &t);
  guard_leave(c, &g);
  if (e != cudaSuccess) return cuda_err("cudaMemGetInfo", e, device);
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

/* ---- events ------------------------------------------------------------------------ */

static int cuda_event_create(void *ctx, int device, uint64_t *event) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaEvent_t ev = NULL;
  cudaError_t e = c->cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  guard_leave(c, &g);
  if (e != cudaSuccess) return cuda_err("cudaEventCreateWithFlags", e, device);
  *event = (uint64_t)(uintptr_t)ev;
  return 0;
}

static int cuda_event_destroy(void *ctx, int device, uint64_t event) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaEventDestroy((cudaEvent_t)(uintptr_t)event);
  guard_leave(c, &g);
  return e == cudaSuccess ? 0 : cuda_err("cudaEventDestroy", e, device);
}

static int cuda_event_record(void *ctx, int device, uint64_t event,
                             uint64_t stream) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaEventRecord((cudaEvent_t)(uintptr_t)event,
                                     (cudaStream_t)(uintptr_t)stream);
  guard_leave(c, &g);
  return e == cudaSuccess ? 0 : cuda_err("cudaEventRecord", e, device);
}

static int cuda_event_query(void *ctx, int device, uint64_t event,
                            bool *done) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaEventQuery((cudaEvent_t)(uintptr_t)event);
  if (e == cudaErrorNotReady && c->cudaGetLastError != NULL)
    c->cudaGetLastError();
  guard_leave(c, &g);
  if (e == cudaSuccess || e == cudaErrorNotReady) {
    *done = e == cudaSuccess;
    return 0;
  }
  return cuda_err("cudaEventQuery", e, device);
}

static int cuda_event_synchronize(void *ctx, int device, uint64_t event) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaEventSynchronize((cudaEvent_t)(uintptr_t)event);
  guard_leave(c, &g);
  return e == cudaSuccess ? 0 : cuda_err("cudaEventSynchronize", e, device);
}

static int cuda_device_synchronize(void *ctx, int device) {
  cuda_t *c = ctx;
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cudaError_t e = c->cudaDeviceSynchronize();
  guard_leave(c, &g);
  return e == cudaSuccess ? 0 : cuda_err("cudaDeviceSynchronize", e, device);
}

/* ---- virtual memory (driver API) ------------------------------------------------------ */

static int no_vmm(cuda_t *c, const char *op) {
  return msnap__set_error(MSNAP_ENOTSUP, "cuda runtime: %s: %s; expandable "
                          "segments are not available", op, c->vmm_why);
}

static int cuda_vmm_reserve(void *ctx, int device, size_t size,
                            size_t alignment, uint64_t *va) {
  cuda_t *c = ctx;
  if (!c->has_vmm) return no_vmm(c, "vmm_reserve");
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  CUdeviceptr p = 0;
  /* A non-power-of-two alignment (e.g. a 20 MiB granule) is rounded up
   * to the next power of two, as the drivers want powers of two. */
  size_t align = alignment;
  while (align & (align - 1)) align += align & -align;
  CUresult r = c->cuMemAddressReserve(&p, size, align, 0, 0);
  guard_leave(c, &g);
  if (r != CUDA_SUCCESS) return cuda_err("cuMemAddressReserve", r, device);
  *va = (uint64_t)p;
  return 0;
}

static int cuda_vmm_release(void *ctx, int device, uint64_t va, size_t size) {
  cuda_t *c = ctx;
  if (!c->has_vmm) return no_vmm(c, "vmm_release");
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  CUresult r = c->cuMemAddressFree((CUdeviceptr)va, size);
  guard_leave(c, &g);
  return r == CUDA_SUCCESS ? 0 : cuda_err("cuMemAddressFree", r, device);
}

static int cuda_vmm_map(void *ctx, int device, uint64_t va, size_t size,
                        uint64_t *handle) {
  cuda_t *c = ctx;
  if (!c->has_vmm) return no_vmm(c, "vmm_map");
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  cu_mem_allocation_prop_t prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = c->cuMemCreate(&h, size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    if (c->cudaGetLastError != NULL) c->cudaGetLastError();
    guard_leave(c, &g);
    return cuda_err("cuMemCreate", r, device);
  }
  r = c->cuMemMap((CUdeviceptr)va, size, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    cu_mem_access_desc_t desc = {{CU_MEM_LOCATION_TYPE_DEVICE, device},
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    r = c->cuMemSetAccess((CUdeviceptr)va, size, &desc, 1);
    if (r != CUDA_SUCCESS) {
      c->cuMemUnmap((CUdeviceptr)va, size);
      rc = cuda_err("cuMemSetAccess", r, device);
    }
  } else {
    rc = cuda_err("cuMemMap", r, device);
  }
  if (rc) c->cuMemRelease(h);
  guard_leave(c, &g);
  if (rc) return rc;
  *handle = (uint64_t)h;
  return 0;
}

static int cuda_vmm_unmap(void *ctx, int device, uint64_t va, size_t size,
                          uint64_t handle) {
  cuda_t *c = ctx;
  if (!c->has_vmm) return no_vmm(c, "vmm_unmap");
  guard_t g;
  int rc = guard_enter(c, device, &g);
  if (rc) return rc;
  CUresult r = c->cuMemUnmap((CUdeviceptr)va, size);
  if (r != CUDA_SUCCESS) rc = cuda_err("cuMemUnmap", r, device);
  else if ((r = c->cuMemRelease((CUmemGenericAllocationHandle)handle)) !=
           CUDA_SUCCESS)
    rc = cuda_err("cuMemRelease", r, device);
  guard_leave(c, &g);
  return rc;
}

/* ---- host memory ------------------------------------------------------------------------ */

static int cuda_host_malloc(void *ctx, size_t size, uint64_t *ptr) {
  cuda_t *c = ctx;
  if (c->cudaHostAlloc == NULL || c->cudaFreeHost == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "cuda runtime: %s has no "
                            "cudaHostAlloc/cudaFreeHost", c->path);
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  void *p = NULL;
  cudaError_t e = c->cudaHostAlloc(&p, size, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    if (c->cudaGetLastError != NULL) c->cudaGetLastError();
    return cuda_err("cudaHostAlloc", e, -1);
  }
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

static int cuda_host_free(void *ctx, uint64_t ptr) {
  cuda_t *c = ctx;
  if (c->cudaFreeHost == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "cuda runtime: %s has no "
                            "cudaFreeHost", c->path);
  if (ptr == 0) return 0;
  cudaError_t e = c->cudaFreeHost((void *)(uintptr_t)ptr);
  return e == cudaSuccess ? 0 : cuda_err("cudaFreeHost", e, -1);
}

/* ---- processes (NVML) ------------------------------------------------------------ */

/* reportProcessMemoryInfo's query: the compute processes on the device
 * with the bytes NVML says each uses (grown until NVML stops answering
 * INSUFFICIENT_SIZE). */
static int cuda_process_memory(void *ctx, int device, msnap_proc_mem_t *out,
                               size_t cap, size_t *n) {
  cuda_t *c = ctx;
  if (c->nvml == NULL) return MSNAP_ENOTSUP;
  int st = atomic_load(&c->nvml_state);
  if (st == 0) {
    st = c->nvmlInit_v2() == NVML_SUCCESS ? 1 : -1;
    atomic_store(&c->nvml_state, st);
  }
  if (st < 0) return MSNAP_ENOTSUP;
  char pci[80] = "";
  if (c->cudaDeviceGetPCIBusId(pci, (int)sizeof pci, device) != cudaSuccess)
    return MSNAP_ENOTSUP;
  void *dev = NULL;
  if (c->nvmlDeviceGetHandleByPciBusId_v2(pci, &dev) != NVML_SUCCESS)
    return MSNAP_ENOTSUP;
  unsigned count = 8;
  nvml_proc_v1_t *procs = NULL;
  int r;
  for (int tries = 0; tries < 8; tries++) {
    nvml_proc_v1_t *np = realloc(procs, (count ? count : 1) * sizeof *np);
    if (np == NULL) {
      free(procs);
      return MSNAP_ENOMEM;
    }
    procs = np;
    unsigned want = count;
    r = c->nvmlDeviceGetComputeRunningProcesses(dev, &want, procs);
    if (r != NVML_ERROR_INSUFFICIENT_SIZE) {
      count = want;
      break;
    }
    count = want > count ? want : count * 2;
  }
  if (r != NVML_SUCCESS) {
    free(procs);
    return MSNAP_ENOTSUP;
  }
  for (unsigned i = 0; i < count && i < cap; i++) {
    out[i].pid = procs[i].pid;
    out[i].used_bytes = procs[i].usedGpuMemory;
  }
  *n = count;
  free(procs);
  return 0;
}

static const msnap_runtime_ops_t cuda_ops = {
    .name = "cuda",
    .init = cuda_init,
    .fini = cuda_fini,
    .device_count = cuda_device_count,
    .malloc = cuda_malloc,
    .free = cuda_free,
    .mem_get_info = cuda_mem_get_info,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .device_synchronize = cuda_device_synchronize,
    .vmm_reserve = cuda_vmm_reserve,
    .vmm_release = cuda_vmm_release,
    .vmm_map = cuda_vmm_map,
    .vmm_unmap = cuda_vmm_unmap,
    .host_malloc = cuda_host_malloc,
    .host_free = cuda_host_free,
    .process_memory = cuda_process_memory,
};

const msnap_runtime_ops_t *msnap_runtime_cuda(void) { return &cuda_ops; }
