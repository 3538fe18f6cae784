/*
 * fake_cudart.c -- a stand-in libcudart.so for tests: the CUDA runtime
 * calls memsnap's "cuda" runtime uses, over host memory.  The fake driver
 * (fake_cuda.c, libcuda.so) links against it and charges its physical
 * allocations through fake_cuda_charge, so both share one capacity.
 *
 * Environment: FAKE_CUDA_DEVICES (default 2), FAKE_CUDA_MEMORY (bytes per
 * device, default 256 MiB).
 *
 * fake_cuda_control(what, value):
 *   "pending_events" 1/0, "fail_next" code, "live" (allocations, events,
 *   host blocks, plus the driver's handles and reservations as reported
 *   through fake_cuda_live_add), "set_device_calls", "current_device",
 *   "used" dev, "last_error" (peek), "complete_all" (complete every pending
 *   event), "pending_count".
 *
 * Invariants: used[d] = sum of live cudaMalloc sizes on d plus the driver
 * allocations charged on d; one mutex guards everything.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;

#define MAX_DEV 8
#define E_INVALID_VALUE 1
#define E_OOM 2
#define E_INVALID_DEVICE 101
#define E_NOT_READY 600

typedef struct node_s {
  struct node_s *next;
  void *ptr;
  size_t size;
  int dev, kind; /* 1 malloc, 2 event, 5 host */
  int state;     /* events: 1 pending, else complete */
} node_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static node_t *nodes;
static int ndev = -1;
static size_t capacity;
static size_t used[MAX_DEV];
static int pending_mode;
static long fail_next, set_device_calls, driver_live;
static cudaError_t last_error;
static _Thread_local int current = 0;

cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaEventCreateWithFlags(void **ev, unsigned flags);
cudaError_t cudaEventDestroy(void *ev);
cudaError_t cudaEventRecord(void *ev, void *stream);
cudaError_t cudaEventQuery(void *ev);
cudaError_t cudaEventSynchronize(void *ev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags);
cudaError_t cudaFreeHost(void *p);
int fake_cuda_charge(int dev, long long delta);
int fake_cuda_device_count(void);
long long fake_cuda_used(int dev);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
void fake_cuda_live_add(long delta);
long fake_cuda_control(const char *what, long value);

static void setup(void) {
  if (ndev >= 0) return;
  const char *d = getenv("FAKE_CUDA_DEVICES");
  const char *m = getenv("FAKE_CUDA_MEMORY");
  ndev = d ? atoi(d) : 2;
  if (ndev < 1 || ndev > MAX_DEV) ndev = 2;
  capacity = m ? (size_t)strtoull(m, NULL, 10) : ((size_t)256 << 20);
}

static cudaError_t enter(void) {
  pthread_mutex_lock(&lock);
  setup();
  if (fail_next != 0) {
    cudaError_t e = (cudaError_t)fail_next;
    fail_next = 0;
    last_error = e;
    return e;
  }
  return 0;
}

/* Device selection never consumes an armed failure. */
static cudaError_t enter_nofault(void) {
  pthread_mutex_lock(&lock);
  setup();
  return 0;
}

static cudaError_t leave(cudaError_t e) {
  if (e != 0 && e != E_NOT_READY) last_error = e;
  pthread_mutex_unlock(&lock);
  return e;
}

static node_t *add(void *ptr, size_t size, int dev, int kind) {
  node_t *n = calloc(1, sizeof *n);
  if (n == NULL) return NULL;
  *n = (node_t){nodes, ptr, size, dev, kind, 0};
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

cudaError_t cudaSetDevice(int dev) {
  cudaError_t e = enter_nofault();
  if (e) return leave(e);
  set_device_calls++;
  if (dev < 0 || dev >= ndev) return leave(E_INVALID_DEVICE);
  current = dev;
  return leave(0);
}

cudaError_t cudaGetDevice(int *dev) {
  cudaError_t e = enter_nofault();
  if (e) return leave(e);
  *dev = current;
  return leave(0);
}

cudaError_t cudaGetDeviceCount(int *n) {
  cudaError_t e = enter();
  if (e) return leave(e);
  *n = ndev;
  return leave(0);
}

cudaError_t cudaMalloc(void **p, size_t size) {
  cudaError_t e = enter();
  if (e) return leave(e);
  if (size > capacity - used[current]) return leave(E_OOM);
  void *m = aligned_alloc(512, (size + 511) / 512 * 512);
  if (m == NULL || add(m, size, current, 1) == NULL) {
    free(m);
    return leave(E_OOM);
  }
  used[current] += size;
  *p = m;
  return leave(0);
}

cudaError_t cudaFree(void *p) {
  cudaError_t e = enter();
  if (e) return leave(e);
  if (p == NULL) return leave(0);
  node_t *n = find(p, 1);
  if (n == NULL) return leave(E_INVALID_VALUE);
  used[n->dev] -= n->size;
  free(n->ptr);
  drop(n);
  return leave(0);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  cudaError_t e = enter();
  if (e) return leave(e);
  *free_bytes = capacity - used[current];
  *total = capacity;
  return leave(0);
}

cudaError_t cudaEventCreateWithFlags(void **ev, unsigned flags) {
  (void)flags;
  cudaError_t e = enter();
  if (e) return leave(e);
  void *h = malloc(1);
  if (h == NULL || add(h, 0, current, 2) == NULL) {
    free(h);
    return leave(E_OOM);
  }
  *ev = h;
  return leave(0);
}

cudaError_t cudaEventDestroy(void *ev) {
  cudaError_t e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(E_INVALID_VALUE);
  free(n->ptr);
  drop(n);
  return leave(0);
}

cudaError_t cudaEventRecord(void *ev, void *stream) {
  (void)stream;
  cudaError_t e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(E_INVALID_VALUE);
  n->state = pending_mode ? 1 : 2;
  return leave(0);
}

cudaError_t cudaEventQuery(void *ev) {
  cudaError_t e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(E_INVALID_VALUE);
  return leave(n->state == 1 ? E_NOT_READY : 0);
}

cudaError_t cudaEventSynchronize(void *ev) {
  cudaError_t e = enter();
  if (e) return leave(e);
  node_t *n = find(ev, 2);
  if (n == NULL) return leave(E_INVALID_VALUE);
  n->state = 2;
  return leave(0);
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = enter();
  if (e) return leave(e);
  for (node_t *n = nodes; n; n = n->next)
    if (n->kind == 2 && n->dev == current && n->state == 1) n->state = 2;
  return leave(0);
}

cudaError_t cudaGetLastError(void) {
  pthread_mutex_lock(&lock);
  cudaError_t e = last_error;
  last_error = 0;
  pthread_mutex_unlock(&lock);
  return e;
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags) {
  (void)flags;
  cudaError_t e = enter();
  if (e) return leave(e);
  void *m = malloc(size ? size : 1);
  if (m == NULL || add(m, size, -1, 5) == NULL) {
    free(m);
    return leave(E_OOM);
  }
  *p = m;
  return leave(0);
}

cudaError_t cudaFreeHost(void *p) {
  cudaError_t e = enter();
  if (e) return leave(e);
  node_t *n = find(p, 5);
  if (n == NULL) return leave(E_INVALID_VALUE);
  free(n->ptr);
  drop(n);
  return leave(0);
}

/* Driver support: charge (delta > 0) or credit device memory; 0 or E_OOM. */
int fake_cuda_charge(int dev, long long delta) {
  pthread_mutex_lock(&lock);
  setup();
  int rc = 0;
  if (dev < 0 || dev >= ndev) rc = E_INVALID_VALUE;
  else if (delta > 0 && (size_t)delta > capacity - used[dev]) rc = E_OOM;
  else used[dev] = (size_t)((long long)used[dev] + delta);
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Bytes charged on a device (the fake NVML reports them). */
long long fake_cuda_used(int dev) {
  pthread_mutex_lock(&lock);
  setup();
  long long r = dev >= 0 && dev < ndev ? (long long)used[dev] : -1;
  pthread_mutex_unlock(&lock);
  return r;
}

/* cudaDeviceGetPCIBusId: "0000:<dev + 0x10>:00.0". */
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
  cudaError_t e = enter_nofault();
  if (e) return leave(e);
  if (device < 0 || device >= ndev) return leave(E_INVALID_DEVICE);
  if (pciBusId == NULL || len < 13) return leave(E_INVALID_VALUE);
  snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", device + 0x10);
  return leave(0);
}

int fake_cuda_device_count(void) {
  pthread_mutex_lock(&lock);
  setup();
  int n = ndev;
  pthread_mutex_unlock(&lock);
  return n;
}

void fake_cuda_live_add(long delta) {
  pthread_mutex_lock(&lock);
  driver_live += delta;
  pthread_mutex_unlock(&lock);
}

long fake_cuda_control(const char *what, long value) {
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
  else if (strcmp(what, "live") == 0) {
    for (node_t *n = nodes; n; n = n->next) r++;
    r += driver_live;
  } else if (strcmp(what, "set_device_calls") == 0) r = set_device_calls;
  else if (strcmp(what, "current_device") == 0) r = current;
  else if (strcmp(what, "used") == 0 && value >= 0 && value < MAX_DEV)
    r = (long)used[value];
  else if (strcmp(what, "last_error") == 0) r = last_error;
  else r = -1;
  pthread_mutex_unlock(&lock);
  return r;
}
