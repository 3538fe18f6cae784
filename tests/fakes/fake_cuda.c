/*
 * fake_cuda.c -- a stand-in libcuda.so (driver API) for tests: the cuMem*
 * virtual-memory calls of expandable segments, over host memory.
 * Reservations are PROT_NONE mappings; cuMemSetAccess makes a mapped range
 * read/write.  Physical allocations are charged to the fake runtime
 * (fake_cudart.c) so that cudaMalloc and cuMemCreate share one capacity.
 *
 * fake_cuda_driver_control("fail_next", code): the next cuMem* call
 * returns code.
 *
 * Invariants: every handle is in the list once; a handle is mapped at most
 * at one va; one mutex guards the list.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUhandle;

#define E_INVALID_VALUE 1
#define E_OOM 2

typedef struct loc_s {
  int type, id;
} loc_t;
typedef struct prop_s {
  int type, requestedHandleTypes;
  loc_t location;
  void *win32;
  unsigned char flags[8];
} prop_t;
typedef struct access_s {
  loc_t location;
  int flags;
} access_t;

typedef struct node_s {
  struct node_s *next;
  uintptr_t key; /* va (reservation) or handle id */
  size_t size;
  int kind;      /* 3 physical, 4 reservation */
  int dev;
  uintptr_t mapped; /* physical: va or 0 */
  void *base;       /* reservation: mmap base */
  size_t len;
} node_t;

int fake_cuda_charge(int dev, long long delta);
int fake_cuda_device_count(void);
void fake_cuda_live_add(long delta);

CUresult cuInit(unsigned flags);
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
                             CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
CUresult cuMemCreate(CUhandle *h, size_t size, const prop_t *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUhandle h);
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUhandle h,
                  unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_t *desc,
                        size_t count);
CUresult cuMemUnmap(CUdeviceptr p, size_t size);
long fake_cuda_driver_control(const char *what, long value);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static node_t *nodes;
static uintptr_t next_handle = 0x1000;
static long fail_next;

static CUresult enter(void) {
  pthread_mutex_lock(&lock);
  if (fail_next) {
    CUresult e = (CUresult)fail_next;
    fail_next = 0;
    return e;
  }
  return 0;
}

static CUresult leave(CUresult e) {
  pthread_mutex_unlock(&lock);
  return e;
}

static node_t *find(uintptr_t key, int kind) {
  for (node_t *n = nodes; n; n = n->next)
    if (n->key == key && n->kind == kind) return n;
  return NULL;
}

static void drop(node_t *x) {
  for (node_t **pp = &nodes; *pp; pp = &(*pp)->next)
    if (*pp == x) {
      *pp = x->next;
      free(x);
      fake_cuda_live_add(-1);
      return;
    }
}

static node_t *add(void) {
  node_t *n = calloc(1, sizeof *n);
  if (n == NULL) return NULL;
  n->next = nodes;
  nodes = n;
  fake_cuda_live_add(1);
  return n;
}

CUresult cuInit(unsigned flags) {
  (void)flags;
  return 0;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align,
                             CUdeviceptr addr, unsigned long long flags) {
  (void)addr;
  (void)flags;
  CUresult e = enter();
  if (e) return leave(e);
  if (size == 0 || (align & (align - 1)) != 0) return leave(E_INVALID_VALUE);
  if (align < ((size_t)2 << 20)) align = (size_t)2 << 20;
  size_t len = size + align;
  void *base = mmap(NULL, len, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return leave(E_OOM);
  node_t *n = add();
  if (n == NULL) {
    munmap(base, len);
    return leave(E_OOM);
  }
  n->key = ((uintptr_t)base + align - 1) & ~(uintptr_t)(align - 1);
  n->size = size;
  n->kind = 4;
  n->base = base;
  n->len = len;
  *p = n->key;
  return leave(0);
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  CUresult e = enter();
  if (e) return leave(e);
  node_t *n = find((uintptr_t)p, 4);
  if (n == NULL || n->size != size) return leave(E_INVALID_VALUE);
  for (node_t *m = nodes; m; m = m->next)
    if (m->kind == 3 && m->mapped >= p && m->mapped < p + size)
      return leave(E_INVALID_VALUE);
  munmap(n->base, n->len);
  drop(n);
  return leave(0);
}

CUresult cuMemCreate(CUhandle *h, size_t size, const prop_t *prop,
                     unsigned long long flags) {
  (void)flags;
  CUresult e = enter();
  if (e) return leave(e);
  if (prop == NULL || prop->type != 1 || prop->location.type != 1 ||
      prop->location.id < 0 || prop->location.id >= fake_cuda_device_count())
    return leave(E_INVALID_VALUE);
  int rc = fake_cuda_charge(prop->location.id, (long long)size);
  if (rc) return leave(rc);
  node_t *n = add();
  if (n == NULL) {
    fake_cuda_charge(prop->location.id, -(long long)size);
    return leave(E_OOM);
  }
  n->key = next_handle++;
  n->size = size;
  n->kind = 3;
  n->dev = prop->location.id;
  *h = n->key;
  return leave(0);
}

CUresult cuMemRelease(CUhandle h) {
  CUresult e = enter();
  if (e) return leave(e);
  node_t *n = find((uintptr_t)h, 3);
  if (n == NULL || n->mapped != 0) return leave(E_INVALID_VALUE);
  fake_cuda_charge(n->dev, -(long long)n->size);
  drop(n);
  return leave(0);
}

CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUhandle h,
                  unsigned long long flags) {
  (void)flags;
  CUresult e = enter();
  if (e) return leave(e);
  node_t *n = find((uintptr_t)h, 3);
  if (n == NULL || n->mapped != 0 || offset != 0 || size != n->size)
    return leave(E_INVALID_VALUE);
  int inside = 0;
  for (node_t *r = nodes; r; r = r->next)
    if (r->kind == 4 && p >= r->key && p + size <= r->key + r->size)
      inside = 1;
  if (!inside) return leave(E_INVALID_VALUE);
  n->mapped = (uintptr_t)p;
  return leave(0);
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const access_t *desc,
                        size_t count) {
  CUresult e = enter();
  if (e) return leave(e);
  if (desc == NULL || count != 1 || desc->flags != 3)
    return leave(E_INVALID_VALUE);
  if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) != 0)
    return leave(E_INVALID_VALUE);
  return leave(0);
}

CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  CUresult e = enter();
  if (e) return leave(e);
  for (node_t *n = nodes; n; n = n->next)
    if (n->kind == 3 && n->mapped == (uintptr_t)p && n->size == size) {
      madvise((void *)(uintptr_t)p, size, MADV_DONTNEED);
      mprotect((void *)(uintptr_t)p, size, PROT_NONE);
      n->mapped = 0;
      return leave(0);
    }
  return leave(E_INVALID_VALUE);
}

long fake_cuda_driver_control(const char *what, long value) {
  pthread_mutex_lock(&lock);
  long r = 0;
  if (strcmp(what, "fail_next") == 0) fail_next = value;
  else r = -1;
  pthread_mutex_unlock(&lock);
  return r;
}
