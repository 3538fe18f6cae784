/*
 * acl.c -- the Ascend "acl" device runtime, loaded with dlopen.
 *
 * The library is MEMSNAP_ACL_LIBRARY when set, else "libascendcl.so" (found
 * through the usual loader path, e.g. LD_LIBRARY_PATH set by CANN's
 * set_env.sh).  No vendor header is used: the few types and constants are
 * declared below with the values of acl_rt.h (torch-npu-today.md §5).
 *
 * Required symbols: aclrtSetDevice, aclrtGetDeviceCount, aclrtMalloc,
 * aclrtFree, aclrtGetMemInfo, aclrtCreateEvent, aclrtDestroyEvent,
 * aclrtRecordEvent, aclrtQueryEventStatus, aclrtSynchronizeEvent,
 * aclrtSynchronizeDevice.  Optional: aclInit (called once with NULL; a
 * "repeat initialize" answer is fine since torch_npu may have done it),
 * aclrtGetDevice (to restore the caller's device after each call),
 * aclrtMallocAlign32 (preferred over aclrtMalloc, as torch_npu does),
 * aclrtMallocHost/aclrtFreeHost, and the VMM set aclrtReserveMemAddress,
 * aclrtReleaseMemAddress, aclrtMallocPhysical, aclrtMapMem, aclrtUnmapMem,
 * aclrtFreePhysical (all six or the VMM ops answer MSNAP_ENOTSUP);
 * aclrtGetSocName and aclsysGetCANNVersion (the npu pad rule, alloc/pad.c),
 * aclrtGetMemUsageInfo (CANN's per-module usage CSV) and
 * aclGetRecentErrMsg (CANN's text for a failed call, appended to the
 * error message).  A missing optional symbol makes its op answer
 * MSNAP_ENOTSUP, as torch_npu's wrappers answer
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT (AclInterface.cpp).
 *
 * Error mapping: ACL_ERROR_RT_MEMORY_ALLOCATION (207001) -> MSNAP_EOOM,
 * ACL_ERROR_RT_FEATURE_NOT_SUPPORT (207000) -> MSNAP_ENOTSUP, any other
 * non-zero code -> MSNAP_ERUNTIME, except that an error whose CANN text
 * is a CANN-reported OOM (torch_npu isCannOOM: "EL0004" or "Failed to
 * allocate") is MSNAP_EOOM too; the message names the call and code and
 * carries aclGetRecentErrMsg's text when there is one.
 *
 * Every device call runs under a device guard: the calling thread's
 * current device is switched to `device` if needed and switched back
 * afterwards (when aclrtGetDevice can tell what it was).
 *
 * Invariants: the context is immutable after init (function pointers and
 * the dlopen handle), so calls need no lock; ACL itself is thread safe.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

typedef int aclError;
typedef void *aclrtEvent;
typedef void *aclrtStream;
typedef void *aclrtDrvMemHandle;

enum {
  ACL_SUCCESS = 0,
  ACL_ERROR_REPEAT_INITIALIZE = 100002,
  ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000,
  ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
};
enum { ACL_MEM_MALLOC_HUGE_FIRST = 0 };
enum { ACL_HBM_MEM = 1, ACL_HBM_MEM_HUGE = 4 };
enum { ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
       ACL_EVENT_RECORDED_STATUS_COMPLETE = 1 };
enum { ACL_MEM_HANDLE_TYPE_NONE = 0 };
enum { ACL_MEM_ALLOCATION_TYPE_PINNED = 0 };
enum { ACL_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { ACL_PKG_NAME_CANN = 0 }; /* aclCANNPackageName */
#define ACL_PKG_VERSION_MAX_SIZE 128
#define ACL_PKG_VERSION_PARTS_MAX_SIZE 64
#define ACL_MEM_USAGE_MAX 128 /* torch_npu kMaxModuleNum */

/* acl_rt.h aclCANNPackageVersion. */
typedef struct acl_cann_version_s {
  char version[ACL_PKG_VERSION_MAX_SIZE];
  char majorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char minorVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char releaseVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char patchVersion[ACL_PKG_VERSION_PARTS_MAX_SIZE];
  char reserved[ACL_PKG_VERSION_MAX_SIZE];
} acl_cann_version_t;

/* acl_rt.h aclrtMemUsageInfo. */
typedef struct acl_mem_usage_s {
  char name[32];
  uint64_t curMemSize;
  uint64_t memPeakSize;
  size_t reserved[8];
} acl_mem_usage_t;

typedef struct acl_mem_location_s {
  uint32_t id;
  int type;
} acl_mem_location_t;

typedef struct acl_physical_mem_prop_s {
  int handleType;
  int allocationType;
  int memAttr;
  acl_mem_location_t location;
  uint64_t reserve;
} acl_physical_mem_prop_t;

typedef struct acl_s {
  void *lib;
  char path[256];
  aclError (*aclInit)(const char *);
  aclError (*aclrtSetDevice)(int32_t);
  aclError (*aclrtGetDevice)(int32_t *);
  aclError (*aclrtGetDeviceCount)(uint32_t *);
  aclError (*aclrtMalloc)(void **, size_t, int);
  aclError (*aclrtMallocAlign32)(void **, size_t, int);
  aclError (*aclrtFree)(void *);
  aclError (*aclrtGetMemInfo)(int, size_t *, size_t *);
  aclError (*aclrtCreateEvent)(aclrtEvent *);
  aclError (*aclrtDestroyEvent)(aclrtEvent);
  aclError (*aclrtRecordEvent)(aclrtEvent, aclrtStream);
  aclError (*aclrtQueryEventStatus)(aclrtEvent, int *);
  aclError (*aclrtSynchronizeEvent)(aclrtEvent);
  aclError (*aclrtSynchronizeDevice)(void);
  aclError (*aclrtReserveMemAddress)(void **, size_t, size_t, void *,
                                     uint64_t);
  aclError (*aclrtReleaseMemAddress)(void *);
  aclError (*aclrtMallocPhysical)(aclrtDrvMemHandle *, size_t,
                                  const acl_physical_mem_prop_t *, uint64_t);
  aclError (*aclrtMapMem)(void *, size_t, size_t, aclrtDrvMemHandle, uint64_t);
  aclError (*aclrtUnmapMem)(void *);
  aclError (*aclrtFreePhysical)(aclrtDrvMemHandle);
  aclError (*aclrtMallocHost)(void **, size_t);
  aclError (*aclrtFreeHost)(void *);
  const char *(*aclrtGetSocName)(void);
  aclError (*aclsysGetCANNVersion)(int, acl_cann_version_t *);
  aclError (*aclrtGetMemUsageInfo)(uint32_t, acl_mem_usage_t *, size_t,
                                   size_t *);
  const char *(*aclGetRecentErrMsg)(void);
  bool has_vmm;
} acl_t;


/* torch_npu isCannOOM (NPUException.cpp): CANN's own OOM text. */
bool msnap__is_cann_oom_text(const char *text) {
  return text != NULL &&
         (strstr(text, "EL0004") != NULL ||
          strstr(text, "Failed to allocate") != NULL);
}

/* Map an ACL error code to a memsnap code and record the message (with
 * CANN's recent-error text when the library provides it). */
static int acl_err(const acl_t *a, const char *call, aclError e,
                   int device) {
  const char *cann = a != NULL && a->aclGetRecentErrMsg != NULL
                         ? a->aclGetRecentErrMsg()
                         : NULL;
  int code = e == ACL_ERROR_RT_MEMORY_ALLOCATION     ? MSNAP_EOOM
             : e == ACL_ERROR_RT_FEATURE_NOT_SUPPORT ? MSNAP_ENOTSUP
             : msnap__is_cann_oom_text(cann)         ? MSNAP_EOOM
                                                     : MSNAP_ERUNTIME;
  char dev[32] = "";
  if (device >= 0) snprintf(dev, sizeof dev, " on device %d", device);
  if (cann != NULL && cann[0] != '\0')
    return msnap__set_error(code, "acl runtime: %s%s failed with ACL error "
                            "%d: %.400s", call, dev, e, cann);
  return msnap__set_error(code, "acl runtime: %s%s failed with ACL error %d",
                          call, dev, e);
}

/* ---- device guard ---------------------------------------------------------- */

typedef struct guard_s {
  int32_t prev; /* -1: unknown or already current */
} guard_t;

static int guard_enter(acl_t *a, int device, guard_t *g) {
  g->prev = -1;
  int32_t cur = -1;
  if (a->aclrtGetDevice != NULL && a->aclrtGetDevice(&cur) == ACL_SUCCESS &&
      cur == device)
    return 0;
  aclError e = a->aclrtSetDevice(device);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtSetDevice", e, device);
  if (a->aclrtGetDevice != NULL && cur >= 0) g->prev = cur;
  return 0;
}

static void guard_leave(acl_t *a, guard_t *g) {
  if (g->prev >= 0) a->aclrtSetDevice(g->prev);
}

/* ---- init/fini --------------------------------------------------------------- */

#define SYM(name, required)                                                   \
  do {                                                                        \
    *(void **)&a->name = dlsym(a->lib, #name);                                \
    if ((required) && a->name == NULL) {                                      \
      missing = #name;                                                        \
      goto fail;                                                              \
    }                                                                         \
  } while (0)

static int acl_init(void **ctx) {
  const char *env = msnap__env_get(MSNAP_ENV_ACL_LIBRARY);
  const char *path = env != NULL && *env ? env : "libascendcl.so";
  acl_t *a = calloc(1, sizeof *a);
  if (a == NULL) return msnap__set_error(MSNAP_ENOMEM, "acl runtime: out of "
                                         "host memory");
  snprintf(a->path, sizeof a->path, "%s", path);
  dlerror();
  a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (a->lib == NULL) {
    const char *why = dlerror();
    free(a);
    return msnap__set_error(
        MSNAP_ENORUNTIME,
        "acl runtime: cannot load %s (%s); install the CANN toolkit and "
        "source its set_env.sh, or set MEMSNAP_ACL_LIBRARY to the path of "
        "libascendcl.so",
        path, why ? why : "unknown dlopen error");
  }
  const char *missing = NULL;
  SYM(aclInit, false);
  SYM(aclrtSetDevice, true);
  SYM(aclrtGetDevice, false);
  SYM(aclrtGetDeviceCount, true);
  SYM(aclrtMalloc, true);
  SYM(aclrtMallocAlign32, false);
  SYM(aclrtFree, true);
  SYM(aclrtGetMemInfo, true);
  SYM(aclrtCreateEvent, true);
  SYM(aclrtDestroyEvent, true);
  SYM(aclrtRecordEvent, true);
  SYM(aclrtQueryEventStatus, true);
  SYM(aclrtSynchronizeEvent, true);
  SYM(aclrtSynchronizeDevice, true);
  SYM(aclrtReserveMemAddress, false);
  SYM(aclrtReleaseMemAddress, false);
  SYM(aclrtMallocPhysical, false);
  SYM(aclrtMapMem, false);
  SYM(aclrtUnmapMem, false);
  SYM(aclrtFreePhysical, false);
  SYM(aclrtMallocHost, false);
  SYM(aclrtFreeHost, false);
  SYM(aclrtGetSocName, false);
  SYM(aclsysGetCANNVersion, false);
  SYM(aclrtGetMemUsageInfo, false);
  SYM(aclGetRecentErrMsg, false);
  a->has_vmm = a->aclrtReserveMemAddress && a->aclrtReleaseMemAddress &&
               a->aclrtMallocPhysical && a->aclrtMapMem && a->aclrtUnmapMem &&
               a->aclrtFreePhysical;
  if (a->aclInit != NULL) {
    aclError e = a->aclInit(NULL);
    if (e != ACL_SUCCESS && e != ACL_ERROR_REPEAT_INITIALIZE) {
      int rc = acl_err(a, "aclInit", e, -1);
      dlclose(a->lib);
      free(a);
      return msnap__set_error(rc == MSNAP_EOOM ? rc : MSNAP_ENORUNTIME,
                              "acl runtime: aclInit(NULL) in %s failed with "
                              "ACL error %d",
                              path, e);
    }
  }
  *ctx = a;
  return 0;
fail:
  dlclose(a->lib);
  free(a);
  return msnap__set_error(MSNAP_ENORUNTIME,
                          "acl runtime: %s has no symbol %s (is it "
                          "libascendcl.so? set MEMSNAP_ACL_LIBRARY)",
                          path, missing);
}

/* aclFinalize is not called: torch_npu (or the application) owns ACL. */
static void acl_fini(void *ctx) {
  acl_t *a = ctx;
  if (a == NULL) return;
  dlclose(a->lib);
  free(a);
}

static int acl_device_count(void *ctx, int *count) {
  acl_t *a = ctx;
  uint32_t n = 0;
  aclError e = a->aclrtGetDeviceCount(&n);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtGetDeviceCount", e, -1);
  *count = (int)n;
  return 0;
}

/* ---- device memory ------------------------------------------------------------ */

static int acl_malloc(void *ctx, int device, size_t size, uint64_t *ptr) {
  acl_t *a = ctx;
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  void *p = NULL;
  aclError e;
  const char *call;
  if (a->aclrtMallocAlign32 != NULL) {
    call = "aclrtMallocAlign32";
    e = a->aclrtMallocAlign32(&p, size, ACL_MEM_MALLOC_HUGE_FIRST);
  } else {
    call = "aclrtMalloc";
    e = a->aclrtMalloc(&p, size, ACL_MEM_MALLOC_HUGE_FIRST);
  }
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) {
    rc = acl_err(a, call, e, device);
    if (rc == MSNAP_EOOM)
      msnap__set_error(MSNAP_EOOM, "acl runtime: %s of %zu bytes on device %d "
                       "failed: out of device memory (ACL error %d)",
                       call, size, device, e);
    return rc;
  }
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

static int acl_free(void *ctx, int device, uint64_t ptr) {
  acl_t *a = ctx;
  if (ptr == 0) return 0;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtFree((void *)(uintptr_t)ptr);
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) {
    acl_err(a, "aclrtFree", e, device);
    return msnap__set_error(MSNAP_ERUNTIME, "acl runtime: aclrtFree(0x%llx) "
                            "on device %d failed with ACL error %d",
                            (unsigned long long)ptr, device, e);
  }
  return 0;
}

static int acl_mem_get_info(void *ctx, int device, size_t *free_bytes,
                            size_t *total_bytes) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  size_t f = 0, t = 0;
  aclError e = a->aclrtGetMemInfo(ACL_HBM_MEM, &f, &t);
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtGetMemInfo", e, device);
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

/* ---- events ------------------------------------------------------------------- */

static int acl_event_create(void *ctx, int device, uint64_t *event) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclrtEvent ev = NULL;
  aclError e = a->aclrtCreateEvent(&ev);
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtCreateEvent", e, device);
  *event = (uint64_t)(uintptr_t)ev;
  return 0;
}

static int acl_event_destroy(void *ctx, int device, uint64_t event) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtDestroyEvent((aclrtEvent)(uintptr_t)event);
  guard_leave(a, &g);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtDestroyEvent", e, device);
}

static int acl_event_record(void *ctx, int device, uint64_t event,
                            uint64_t stream) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtRecordEvent((aclrtEvent)(uintptr_t)event,
                                   (aclrtStream)(uintptr_t)stream);
  guard_leave(a, &g);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtRecordEvent", e, device);
}

static int acl_event_query(void *ctx, int device, uint64_t event, bool *done) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  int status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  aclError e = a->aclrtQueryEventStatus((aclrtEvent)(uintptr_t)event, &status);
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtQueryEventStatus", e, device);
  *done = status == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  return 0;
}

static int acl_event_synchronize(void *ctx, int device, uint64_t event) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtSynchronizeEvent((aclrtEvent)(uintptr_t)event);
  guard_leave(a, &g);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtSynchronizeEvent", e, device);
}

static int acl_device_synchronize(void *ctx, int device) {
  acl_t *a = ctx;
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtSynchronizeDevice();
  guard_leave(a, &g);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtSynchronizeDevice", e, device);
}

/* ---- virtual memory ------------------------------------------------------------- */

static int no_vmm(acl_t *a, const char *op) {
  return msnap__set_error(MSNAP_ENOTSUP, "acl runtime: %s: %s lacks the "
                          "virtual memory API (aclrtReserveMemAddress...); "
                          "expandable segments are not available",
                          op, a->path);
}

static int acl_vmm_reserve(void *ctx, int device, size_t size,
                           size_t alignment, uint64_t *va) {
  acl_t *a = ctx;
  if (!a->has_vmm) return no_vmm(a, "vmm_reserve");
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  void *p = NULL;
  /* A non-power-of-two alignment (e.g. a 20 MiB granule) is rounded up
   * to the next power of two, as the drivers want powers of two. */
  size_t align = alignment;
  while (align & (align - 1)) align += align & -align;
  /* flags = 1 as torch_npu passes. */
  aclError e = a->aclrtReserveMemAddress(&p, size, align, NULL, 1);
  guard_leave(a, &g);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtReserveMemAddress", e, device);
  *va = (uint64_t)(uintptr_t)p;
  return 0;
}

static int acl_vmm_release(void *ctx, int device, uint64_t va, size_t size) {
  acl_t *a = ctx;
  (void)size;
  if (!a->has_vmm) return no_vmm(a, "vmm_release");
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtReleaseMemAddress((void *)(uintptr_t)va);
  guard_leave(a, &g);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtReleaseMemAddress", e, device);
}

static int acl_vmm_map(void *ctx, int device, uint64_t va, size_t size,
                       uint64_t *handle) {
  acl_t *a = ctx;
  if (!a->has_vmm) return no_vmm(a, "vmm_map");
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  acl_physical_mem_prop_t prop = {
      ACL_MEM_HANDLE_TYPE_NONE, ACL_MEM_ALLOCATION_TYPE_PINNED,
      ACL_HBM_MEM_HUGE, {(uint32_t)device, ACL_MEM_LOCATION_TYPE_DEVICE}, 0};
  aclrtDrvMemHandle h = NULL;
  aclError e = a->aclrtMallocPhysical(&h, size, &prop, 0);
  if (e != ACL_SUCCESS) {
    guard_leave(a, &g);
    return acl_err(a, "aclrtMallocPhysical", e, device);
  }
  e = a->aclrtMapMem((void *)(uintptr_t)va, size, 0, h, 0);
  if (e != ACL_SUCCESS) {
    a->aclrtFreePhysical(h);
    guard_leave(a, &g);
    return acl_err(a, "aclrtMapMem", e, device);
  }
  guard_leave(a, &g);
  *handle = (uint64_t)(uintptr_t)h;
  return 0;
}

static int acl_vmm_unmap(void *ctx, int device, uint64_t va, size_t size,
                         uint64_t handle) {
  acl_t *a = ctx;
  (void)size;
  if (!a->has_vmm) return no_vmm(a, "vmm_unmap");
  guard_t g;
  int rc = guard_enter(a, device, &g);
  if (rc) return rc;
  aclError e = a->aclrtUnmapMem((void *)(uintptr_t)va);
  if (e == ACL_SUCCESS)
    e = a->aclrtFreePhysical((aclrtDrvMemHandle)(uintptr_t)handle);
  else
    rc = acl_err(a, "aclrtUnmapMem", e, device);
  if (rc == 0 && e != ACL_SUCCESS) rc = acl_err(a, "aclrtFreePhysical", e, device);
  guard_leave(a, &g);
  return rc;
}

/* ---- host memory ------------------------------------------------------------------ */

static int acl_host_malloc(void *ctx, size_t size, uint64_t *ptr) {
  acl_t *a = ctx;
  if (a->aclrtMallocHost == NULL || a->aclrtFreeHost == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "acl runtime: %s has no "
                            "aclrtMallocHost/aclrtFreeHost", a->path);
  if (size == 0) {
    *ptr = 0;
    return 0;
  }
  void *p = NULL;
  aclError e = a->aclrtMallocHost(&p, size);
  if (e != ACL_SUCCESS) return acl_err(a, "aclrtMallocHost", e, -1);
  *ptr = (uint64_t)(uintptr_t)p;
  return 0;
}

static int acl_host_free(void *ctx, uint64_t ptr) {
  acl_t *a = ctx;
  if (a->aclrtFreeHost == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "acl runtime: %s has no "
                            "aclrtFreeHost", a->path);
  if (ptr == 0) return 0;
  aclError e = a->aclrtFreeHost((void *)(uintptr_t)ptr);
  return e == ACL_SUCCESS ? 0 : acl_err(a, "aclrtFreeHost", e, -1);
}

/* ---- platform ------------------------------------------------------------------- */

/* aclrtGetSocName (torch_npu AclGetSocName: NULL means unknown). */
static int acl_soc_name(void *ctx, char *buf, size_t len) {
  acl_t *a = ctx;
  if (a->aclrtGetSocName == NULL) return MSNAP_ENOTSUP;
  const char *n = a->aclrtGetSocName();
  if (n == NULL || len == 0) return MSNAP_ENOTSUP;
  snprintf(buf, len, "%s", n);
  return 0;
}

/* aclsysGetCANNVersion(ACL_PKG_NAME_CANN) (GetCANNInfo.cpp GetCANNVersion
 * for module "CANN"). */
static int acl_cann_version(void *ctx, char *buf, size_t len) {
  acl_t *a = ctx;
  if (a->aclsysGetCANNVersion == NULL || len == 0) return MSNAP_ENOTSUP;
  acl_cann_version_t v;
  memset(&v, 0, sizeof v);
  aclError e = a->aclsysGetCANNVersion(ACL_PKG_NAME_CANN, &v);
  if (e != ACL_SUCCESS) return MSNAP_ENOTSUP;
  v.version[sizeof v.version - 1] = '\0';
  snprintf(buf, len, "%s", v.version);
  return 0;
}

/* aclrtGetMemUsageInfo(device, rows[128], 128, &count) as torch_npu's
 * saveDevMemUsageInfo calls it; rows beyond 128 are not read ("moduleCount
 * is unreliable"). */
static int acl_mem_usage_info(void *ctx, int device, msnap_mem_usage_t *out,
                              size_t cap, size_t *n) {
  acl_t *a = ctx;
  if (a->aclrtGetMemUsageInfo == NULL)
    return msnap__set_error(MSNAP_ENOTSUP, "acl runtime: %s has no "
                            "aclrtGetMemUsageInfo (CANN >= 8.5.0 and HDK >= "
                            "25.5.0 provide it)", a->path);
  acl_mem_usage_t *rows = calloc(ACL_MEM_USAGE_MAX, sizeof *rows);
  if (rows == NULL)
    return msnap__set_error(MSNAP_ENOMEM, "acl runtime: out of host memory");
  size_t count = 0;
  aclError e = a->aclrtGetMemUsageInfo((uint32_t)device, rows,
                                       ACL_MEM_USAGE_MAX, &count);
  if (e != ACL_SUCCESS) {
    free(rows);
    return acl_err(a, "aclrtGetMemUsageInfo", e, device);
  }
  for (size_t i = 0; i < count && i < ACL_MEM_USAGE_MAX && i < cap; i++) {
    memcpy(out[i].name, rows[i].name, sizeof out[i].name);
    out[i].cur_bytes = rows[i].curMemSize;
    out[i].peak_bytes = rows[i].memPeakSize;
  }
  *n = count;
  free(rows);
  return 0;
}

static const msnap_runtime_ops_t acl_ops = {
    .name = "acl",
    .init = acl_init,
    .fini = acl_fini,
    .device_count = acl_device_count,
    .malloc = acl_malloc,
    .free = acl_free,
    .mem_get_info = acl_mem_get_info,
    .event_create = acl_event_create,
    .event_destroy = acl_event_destroy,
    .event_record = acl_event_record,
    .event_query = acl_event_query,
    .event_synchronize = acl_event_synchronize,
    .device_synchronize = acl_device_synchronize,
    .vmm_reserve = acl_vmm_reserve,
    .vmm_release = acl_vmm_release,
    .vmm_map = acl_vmm_map,
    .vmm_unmap = acl_vmm_unmap,
    .host_malloc = acl_host_malloc,
    .host_free = acl_host_free,
    .soc_name = acl_soc_name,
    .cann_version = acl_cann_version,
    .mem_usage_info = acl_mem_usage_info,
};

const msnap_runtime_ops_t *msnap_runtime_acl(void) { return &acl_ops; }
