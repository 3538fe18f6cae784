/*
 * fake_ascendcl.c -- a stand-in libascendcl.so for tests: the ACL calls
 * memsnap's "acl" runtime uses, over host memory.
 *
 * Environment: FAKE_ACL_DEVICES (default 2), FAKE_ACL_MEMORY (bytes per
 * device, default 256 MiB).  Device memory is malloc'ed (untouched pages
 * cost nothing); VMM reservations are PROT_NONE mappings that aclrtMapMem
 * makes read/write, so mapped memory is really usable.  Built with
 * -DFAKE_NO_VMM it lacks the VMM symbols, and models an older CANN: no
 * aclrtGetSocName, aclsysGetCANNVersion, aclrtGetMemUsageInfo or
 * aclGetRecentErrMsg either.
 *
 * Platform queries (signatures of CANN's acl.h / acl_rt.h as torch_npu's
 * AclInterface.cpp calls them): aclrtGetSocName returns FAKE_ACL_SOC_NAME
 * (default "Ascend910B1"; "" = NULL, unknown); aclsysGetCANNVersion fills
 * aclCANNPackageVersion.version with FAKE_ACL_CANN_VERSION (default
 * "8.5.0") for ACL_PKG_NAME_CANN; aclrtGetMemUsageInfo reports the
 * modules "app" (bytes charged on the device now / at its peak) and
 * "runtime" (2 MiB / 2 MiB), plus `usage_extra` synthetic modules
 * "mod<i>"; outputNum is the number of modules even when more than
 * inputNum (rows beyond inputNum are not written).  aclGetRecentErrMsg
 * returns this thread's text of the last failed call, or NULL.
 *
 * fake_acl_control(what, value) lets a test steer and inspect it:
 *   "pending_events" 1/0  recorded events stay NOT_READY until synchronized
 *   "fail_next"      code: the next ACL call (other than aclrtSetDevice/
 *                    aclrtGetDevice) returns `code`
 *   "live"           number of live allocations, events, handles,
 *                    reservations and host blocks
 *   "set_device_calls"   aclrtSetDevice calls so far
 *   "current_device"     this thread's current device (-1 none)
 *   "init_calls"         aclInit calls so far
 *   "used"  dev      bytes charged on device dev
 *   "complete_all"   complete every pending event
 *   "pending_count"  number of pending events
 *   "record_calls"   aclrtRecordEvent calls so far
 *   "last_record_stream"  the stream of the last aclrtRecordEvent
 *   "sync_device_calls"   aclrtSynchronizeDevice calls so far
 *   "usage_extra" n  aclrtGetMemUsageInfo reports n more modules
 *   "err_text"  1/0  failed calls set CANN's OOM text ("EL0004: ... Failed
 *                    to allocate memory.") as the recent error message
 *                    instead of a generic one
 *   "peak" dev       peak bytes charged on device dev
 *
 * Invariants: used[d] = sum of live malloc and physical sizes on d; one
 * mutex guards every list.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int aclError;

#define MAX_DEV 8
#define ERR_INVALID 100000
#define ERR_REPEAT_INIT 100002
#define ERR_NO_DEVICE 107002
#define ERR_OOM 207001

typedef struct node_s {
  struct node_s *next;
  void *ptr;   /* user pointer / handle / va */
  size_t size;
  int dev;
  int kind;    /* 1 malloc, 2 event, 3 physical, 4 reservation, 5 host */
  int state;   /* events: 0 never recorded, 1 pending, 2 complete;
                  physical: 1 when mapped */
  void *aux;   /* physical: mapped va; reservation: mmap base */
  size_t auxlen;
} node_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static node_t *nodes;
static int ndev = -1;
static size_t capacity;
static size_t used[MAX_DEV];
static int pending_mode;
static long fail_next;
static long set_device_calls, init_calls;
static long record_calls, sync_device_calls, last_record_stream;
static _Thread_local int current = -1;
static size_t peak[MAX_DEV];
static long usage_extra;
static int err_text_oom;
static _Thread_local char recent_err[160];

/* Exported API (prototypes for -Wmissing-prototypes). */
aclError aclInit(const char *config);
aclError aclrtSetDevice(int32_t dev);
aclError aclrtGetDevice(int32_t *dev);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtMalloc(void **p, size_t size, int policy);
aclError aclrtFree(void *p);
aclError aclrtGetMemInfo(int attr, size_t *free_bytes, size_t *total);
aclError aclrtCreateEvent(void **ev);
aclError aclrtDestroyEvent(void *ev);
aclError aclrtRecordEvent(void *ev, void *stream);
aclError aclrtQueryEventStatus(void *ev, int *status);
aclError aclrtSynchronizeEvent(void *ev);
aclError aclrtSynchronizeDevice(void);
aclError aclrtMallocHost(void **p, size_t size);
aclError aclrtFreeHost(void *p);
long fake_acl_control(const char *what, long value);

static void setup(void) {
  if (ndev >= 0) return;
  const char *d = getenv("FAKE_ACL_DEVICES");
  const char *m = getenv("FAKE_ACL_MEMORY");
  ndev = d ? atoi(d) : 2;
  if (ndev < 1 || ndev > MAX_DEV) ndev = 2;
  capacity = m ? (size_t)strtoull(m, NULL, 10) : ((size_t)256 << 20);
}

/* The recent error text of a failed call (aclGetRecentErrMsg). */
static void set_recent(aclError e) {
  if (err_text_oom)
    snprintf(recent_err, sizeof recent_err,
             "EL0004: [PID: %d] The memory is insufficient. Failed to "
             "allocate memory. (error %d)", (int)getpid(), e);
  else
    snprintf(recent_err, sizeof recent_err, "EE9999: Inner Error (error %d)",
             e);
}

/* Lock, set up, and consume an armed failure.  Returns the forced code. */
static aclError enter(void) {
  pthread_mutex_lock(&lock);
  setup();
  if (fail_next != 0) {
    aclError e = (aclError)fail_next;
    fail_next = 0;
    set_recent(e);
    return e;
  }
  return 0;
}

/* Device selection never consumes an armed failure. */
static aclError enter_nofault(void) {
  pthread_mutex_lock(&lock);
  setup();
  return 0;
}

static aclError leave(aclError e) {
  pthread_mutex_unlock(&lock);
  return e;
}

static node_t *add(void *ptr, size_t size, int dev, int kind) {
  node_t *n = calloc(1, sizeof *n);
  if (n == NULL) return NULL;
  n->ptr = ptr;
  n->size = size;
  n->dev = dev;
  n->kind = kind;
  n->next = nodes;
  nodes = n;
  return n;
}

static node_t *find(void *ptr, int kind) {
  for (node_t *n = nodes; n; n = n->next)
    if (n->ptr == ptr && n->kind == kind) return n;
  return NULL;
}

static void drop(node_t *x) {
  for (node_t **pp = &nodes; *pp; pp = &(*pp)->next)
    if (*pp == x) {
      *pp = x->next;
      free(x);
      return;
    }
}

aclError aclInit(const char *config) {
  (void)config;
  aclError e = enter();
  if (e) return leave(e);
  return leave(init_calls++ == 0 ? 0 : ERR_REPEAT_INIT);
}

aclError aclrtSetDevice(int32_t dev) {
  aclError e = enter_nofault();
  if (e) return leave(e);
  set_device_calls++;
  if (dev < 0 || dev >= ndev) return leave(ERR_INVALID);
  current = dev;
  return leave(0);
}

aclError aclrtGetDevice(int32_t *dev) {
  aclError e = enter_nofault();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  *dev = current;
  return leave(0);
}

aclError aclrtGetDeviceCount(uint32_t *count) {
  aclError e = enter();
  if (e) return leave(e);
  *count = (uint32_t)ndev;
  return leave(0);
}

aclError aclrtMalloc(void **p, size_t size, int policy) {
  (void)policy;
  aclError e = enter();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  if (size == 0) return leave(ERR_INVALID);
  if (size > capacity - used[current]) { set_recent(ERR_OOM); return leave(ERR_OOM); }
  void *m = aligned_alloc(512, (size + 511) / 512 * 512);
  if (m == NULL || add(m, size, current, 1) == NULL) {
    free(m);
    { set_recent(ERR_OOM); return leave(ERR_OOM); }
  }
  used[current] += size;
  if (used[current] > peak[current]) peak[current] = used[current];
  *p = m;
  return leave(0);
}

aclError aclrtFree(void *p) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(p, 1);
  if (n == NULL) return leave(ERR_INVALID);
  used[n->dev] -= n->size;
  free(n->ptr);
  drop(n);
  return leave(0);
}

aclError aclrtGetMemInfo(int attr, size_t *free_bytes, size_t *total) {
  aclError e = enter();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  if (attr != 1) return leave(ERR_INVALID); /* ACL_HBM_MEM */
  *free_bytes = capacity - used[current];
  *total = capacity;
  return leave(0);
}

aclError aclrtCreateEvent(void **ev) {
  aclError e = enter();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  void *h = malloc(1);
  if (h == NULL || add(h, 0, current, 2) == NULL) {
    free(h);
    { set_recent(ERR_OOM); return leave(ERR_OOM); }
  }
  *ev = h;
  return leave(0);
}

aclError aclrtDestroyEvent(void *ev) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(ERR_INVALID);
  free(n->ptr);
  drop(n);
  return leave(0);
}

aclError aclrtRecordEvent(void *ev, void *stream) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(ERR_INVALID);
  n->state = pending_mode ? 1 : 2;
  record_calls++;
  last_record_stream = (long)(intptr_t)stream;
  return leave(0);
}

aclError aclrtQueryEventStatus(void *ev, int *status) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(ERR_INVALID);
  *status = n->state == 1 ? 0 : 1;
  return leave(0);
}

aclError aclrtSynchronizeEvent(void *ev) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(ERR_INVALID);
  n->state = 2;
  return leave(0);
}

aclError aclrtSynchronizeDevice(void) {
  aclError e = enter();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  sync_device_calls++;
  for (node_t *n = nodes; n; n = n->next)
    if (n->kind == 2 && n->dev == current && n->state == 1) n->state = 2;
  return leave(0);
}

#ifndef FAKE_NO_VMM
typedef struct prop_s {
  int handleType, allocationType, memAttr;
  struct { uint32_t id; int type; } location;
  uint64_t reserve;
} prop_t;

aclError aclrtReserveMemAddress(void **va, size_t size, size_t align,
                                void *expect, uint64_t flags);
aclError aclrtReleaseMemAddress(void *va);
aclError aclrtMallocPhysical(void **h, size_t size, const prop_t *prop,
                             uint64_t flags);
aclError aclrtFreePhysical(void *h);
aclError aclrtMapMem(void *va, size_t size, size_t offset, void *h,
                     uint64_t flags);
aclError aclrtUnmapMem(void *va);

aclError aclrtReserveMemAddress(void **va, size_t size, size_t align,
                                void *expect, uint64_t flags) {
  (void)expect;
  (void)flags;
  aclError e = enter();
  if (e) return leave(e);
  if (current < 0) return leave(ERR_NO_DEVICE);
  if (size == 0 || (align & (align - 1)) != 0) return leave(ERR_INVALID);
  if (align < 4096) align = 4096;
  size_t len = size + align;
  void *base = mmap(NULL, len, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) { set_recent(ERR_OOM); return leave(ERR_OOM); }
  uintptr_t a = ((uintptr_t)base + align - 1) & ~(uintptr_t)(align - 1);
  node_t *n = add((void *)a, size, current, 4);
  if (n == NULL) {
    munmap(base, len);
    { set_recent(ERR_OOM); return leave(ERR_OOM); }
  }
  n->aux = base;
  n->auxlen = len;
  *va = (void *)a;
  return leave(0);
}

aclError aclrtReleaseMemAddress(void *va) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(va, 4);
  if (n == NULL) return leave(ERR_INVALID);
  for (node_t *m = nodes; m; m = m->next)
    if (m->kind == 3 && m->state == 1 && (char *)m->aux >= (char *)va &&
        (char *)m->aux < (char *)va + n->size)
      return leave(ERR_INVALID); /* still mapped */
  munmap(n->aux, n->auxlen);
  drop(n);
  return leave(0);
}

aclError aclrtMallocPhysical(void **h, size_t size, const prop_t *prop,
                             uint64_t flags) {
  (void)flags;
  aclError e = enter();
  if (e) return leave(e);
  if (prop == NULL || prop->location.type != 1 ||
      (int)prop->location.id >= ndev || prop->memAttr != 4)
    return leave(ERR_INVALID);
  int dev = (int)prop->location.id;
  if (size > capacity - used[dev]) { set_recent(ERR_OOM); return leave(ERR_OOM); }
  void *k = malloc(1);
  if (k == NULL || add(k, size, dev, 3) == NULL) {
    free(k);
    { set_recent(ERR_OOM); return leave(ERR_OOM); }
  }
  used[dev] += size;
  if (used[dev] > peak[dev]) peak[dev] = used[dev];
  *h = k;
  return leave(0);
}

aclError aclrtFreePhysical(void *h) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(h, 3);
  if (n == NULL || n->state == 1) return leave(ERR_INVALID);
  used[n->dev] -= n->size;
  free(n->ptr);
  drop(n);
  return leave(0);
}

aclError aclrtMapMem(void *va, size_t size, size_t offset, void *h,
                     uint64_t flags) {
  (void)flags;
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(h, 3);
  if (n == NULL || n->state == 1 || offset != 0 || size != n->size)
    return leave(ERR_INVALID);
  node_t *r = NULL;
  for (node_t *m = nodes; m; m = m->next)
    if (m->kind == 4 && (char *)va >= (char *)m->ptr &&
        (char *)va + size <= (char *)m->ptr + m->size)
      r = m;
  if (r == NULL) return leave(ERR_INVALID);
  if (mprotect(va, size, PROT_READ | PROT_WRITE) != 0)
    return leave(ERR_INVALID);
  n->state = 1;
  n->aux = va;
  return leave(0);
}

aclError aclrtUnmapMem(void *va) {
  aclError e = enter();
  if (e) return leave(e);
  for (node_t *n = nodes; n; n = n->next)
    if (n->kind == 3 && n->state == 1 && n->aux == va) {
      madvise(va, n->size, MADV_DONTNEED);
      mprotect(va, n->size, PROT_NONE);
      n->state = 0;
      n->aux = NULL;
      return leave(0);
    }
  return leave(ERR_INVALID);
}
#endif

aclError aclrtMallocHost(void **p, size_t size) {
  aclError e = enter();
  if (e) return leave(e);
  void *m = malloc(size ? size : 1);
  if (m == NULL || add(m, size, -1, 5) == NULL) {
    free(m);
    { set_recent(ERR_OOM); return leave(ERR_OOM); }
  }
  *p = m;
  return leave(0);
}

aclError aclrtFreeHost(void *p) {
  aclError e = enter();
  if (e) return leave(e);
  node_t *n = find(p, 5);
  if (n == NULL) return leave(ERR_INVALID);
  free(n->ptr);
  drop(n);
  return leave(0);
}

#ifndef FAKE_NO_VMM
/* ---- platform (CANN acl.h / acl_rt.h) -------------------------------------- */

typedef struct {
  char version[128];
  char majorVersion[64];
  char minorVersion[64];
  char releaseVersion[64];
  char patchVersion[64];
  char reserved[128];
} aclCANNPackageVersion;

typedef struct {
  char name[32];
  uint64_t curMemSize;
  uint64_t memPeakSize;
  size_t reserved[8];
} aclrtMemUsageInfo;

const char *aclrtGetSocName(void);
aclError aclsysGetCANNVersion(int name, aclCANNPackageVersion *version);
aclError aclrtGetMemUsageInfo(uint32_t deviceId, aclrtMemUsageInfo *info,
                              size_t inputNum, size_t *outputNum);
const char *aclGetRecentErrMsg(void);

const char *aclrtGetSocName(void) {
  const char *v = getenv("FAKE_ACL_SOC_NAME");
  if (v == NULL) return "Ascend910B1";
  return v[0] ? v : NULL;
}

aclError aclsysGetCANNVersion(int name, aclCANNPackageVersion *version) {
  if (version == NULL || name < 0 || name > 7) return ERR_INVALID;
  const char *v = getenv("FAKE_ACL_CANN_VERSION");
  memset(version, 0, sizeof *version);
  snprintf(version->version, sizeof version->version, "%s", v ? v : "8.5.0");
  return 0;
}

aclError aclrtGetMemUsageInfo(uint32_t deviceId, aclrtMemUsageInfo *info,
                              size_t inputNum, size_t *outputNum) {
  aclError e = enter();
  if (e) return leave(e);
  if (deviceId >= (uint32_t)ndev || outputNum == NULL ||
      (info == NULL && inputNum > 0))
    return leave(ERR_INVALID);
  size_t total = 2 + (size_t)(usage_extra > 0 ? usage_extra : 0);
  for (size_t i = 0; i < total && i < inputNum; i++) {
    aclrtMemUsageInfo *r = &info[i];
    memset(r, 0, sizeof *r);
    if (i == 0) {
      memcpy(r->name, "app", 4);
      r->curMemSize = used[deviceId];
      r->memPeakSize = peak[deviceId];
    } else if (i == 1) {
      memcpy(r->name, "runtime", 8);
      r->curMemSize = r->memPeakSize = (uint64_t)2 << 20;
    } else {
      snprintf(r->name, sizeof r->name, "mod%zu", i - 2);
      r->curMemSize = (uint64_t)(i - 1) << 20;
      r->memPeakSize = (uint64_t)i << 20;
    }
  }
  *outputNum = total;
  return leave(0);
}

const char *aclGetRecentErrMsg(void) {
  return recent_err[0] ? recent_err : NULL;
}
#endif

long fake_acl_control(const char *what, long value) {
  pthread_mutex_lock(&lock);
  setup();
  long r = 0;
  if (strcmp(what, "pending_events") == 0) pending_mode = (int)value;
  else if (strcmp(what, "fail_next") == 0) fail_next = value;
  else if (strcmp(what, "complete_all") == 0) {
    for (node_t *n = nodes; n; n = n->next)
      if (n->kind == 2 && n->state == 1) n->state = 2;
  } else if (strcmp(what, "pending_count") == 0) {
    for (node_t *n = nodes; n; n = n->next) r += n->kind == 2 && n->state == 1;
  }
  else if (strcmp(what, "live") == 0)
    for (node_t *n = nodes; n; n = n->next) r++;
  else if (strcmp(what, "set_device_calls") == 0) r = set_device_calls;
  else if (strcmp(what, "current_device") == 0) r = current;
  else if (strcmp(what, "init_calls") == 0) r = init_calls;
  else if (strcmp(what, "record_calls") == 0) r = record_calls;
  else if (strcmp(what, "last_record_stream") == 0) r = last_record_stream;
  else if (strcmp(what, "sync_device_calls") == 0) r = sync_device_calls;
  else if (strcmp(what, "used") == 0 && value >= 0 && value < MAX_DEV)
    r = (long)used[value];
  else if (strcmp(what, "peak") == 0 && value >= 0 && value < MAX_DEV)
    r = (long)peak[value];
  else if (strcmp(what, "usage_extra") == 0) usage_extra = value;
  else if (strcmp(what, "err_text") == 0) err_text_oom = (int)value;
  else r = -1;
  pthread_mutex_unlock(&lock);
  return r;
}
