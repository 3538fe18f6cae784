/*
 * fake_rt.c -- see fake_rt.h.  Not thread safe beyond one mutex around
 * every call (enough for the 4-thread smoke test).
 */
#include "fake_rt.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define MAXD 4
#define MAXA 4096
#define MAXE 4096

typedef struct alloc_s {
  uint64_t ptr, size;
  int device;
  int kind; /* 0 free slot, 1 malloc, 2 reserve, 3 handle */
} fake_alloc_t;

typedef struct event_s {
  bool live, recorded, done;
  uint64_t stream;
} fake_event_t;

static struct {
  pthread_mutex_t mu;
  fake_cfg_t cfg;
  uint64_t next[MAXD], next_va[MAXD], used[MAXD];
  fake_alloc_t allocs[MAXA];
  fake_event_t events[MAXE];
  bool manual;
  char fail_call[32];
  uint64_t fail_left;
  int fail_code;
  uint64_t ncalls[16];
  uint64_t next_handle;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *sites[] = {"malloc",       "free",
                              "event_create", "event_record",
                              "event_query",  "event_synchronize",
                              "vmm_reserve",  "vmm_map",
                              "vmm_unmap",    "vmm_release",
                              "event_destroy", "device_synchronize",
                              "mem_get_info"};
#define NSITES (sizeof sites / sizeof sites[0])

static int site_index(const char *call) {
  for (unsigned i = 0; i < NSITES; i++)
    if (strcmp(sites[i], call) == 0)
      return (int)i;
  return -1;
}

/* Count the call; returns the injected error or 0. */
static int enter(const char *call) {
  int i = site_index(call);
  if (i >= 0)
    F.ncalls[i]++;
  if (F.fail_left &&
      (F.fail_call[0] == 0 || strcmp(F.fail_call, call) == 0)) {
    if (--F.fail_left == 0)
      return F.fail_code;
  }
  return 0;
}

static int add_alloc(uint64_t ptr, uint64_t size, int device, int kind) {
  for (int i = 0; i < MAXA; i++) {
    if (F.allocs[i].kind == 0) {
      F.allocs[i] = (fake_alloc_t){ptr, size, device, kind};
      return 0;
    }
  }
  return MSNAP_ENOMEM;
}

static fake_alloc_t *find_alloc(uint64_t ptr, int kind) {
  for (int i = 0; i < MAXA; i++)
    if (F.allocs[i].kind == kind && F.allocs[i].ptr == ptr)
      return &F.allocs[i];
  return NULL;
}

static uint64_t base_of(int device) {
  return 0x7f0000000000ull + (uint64_t)device * (1ull << 40);
}

static uint64_t va_base_of(int device) {
  return 0x100000000000ull + (uint64_t)device * (1ull << 42);
}

static int f_init(void **ctx) {
  *ctx = &F;
  return 0;
}
static void f_fini(void *ctx) { (void)ctx; }
static int f_count(void *ctx, int *n) {
  (void)ctx;
  *n = F.cfg.devices;
  return 0;
}

#define LOCKED(...)                                                           \
  do {                                                                        \
    pthread_mutex_lock(&F.mu);                                                \
    __VA_ARGS__;                                                              \
    pthread_mutex_unlock(&F.mu);                                              \
  } while (0)

static int f_malloc(void *ctx, int dev, size_t size, uint64_t *ptr) {
  (void)ctx;
  int rc;
  LOCKED({
    rc = enter("malloc");
    if (!rc && F.used[dev] + size > F.cfg.total)
      rc = MSNAP_EOOM;
    if (!rc) {
      uint64_t p = F.next[dev];
      rc = add_alloc(p, size, dev, 1);
      if (!rc) {
        F.next[dev] = (p + size + 2097151) & ~2097151ull;
        F.used[dev] += size;
        *ptr = p;
      }
    }
  });
  return rc;
}

static int f_free(void *ctx, int dev, uint64_t ptr) {
  (void)ctx;
  int rc;
  LOCKED({
    rc = enter("free");
    if (!rc) {
      fake_alloc_t *a = find_alloc(ptr, 1);
      if (!a || a->device != dev) {
        rc = MSNAP_EINVAL;
      } else {
        F.used[dev] -= a->size;
        a->kind = 0;
      }
    }
  });
  return rc;
}

static int f_info(void *ctx, int dev, size_t *fr, size_t *tot) {
  (void)ctx;
  LOCKED({
    enter("mem_get_info");
    *tot = F.cfg.total;
    *fr = F.cfg.total - F.used[dev];
  });
  return 0;
}

static int f_ev_create(void *ctx, int dev, uint64_t *ev) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("event_create");
    if (!rc) {
      rc = MSNAP_ENOMEM;
      for (int i = 1; i < MAXE; i++) {
        if (!F.events[i].live) {
          F.events[i] = (fake_event_t){true, false, false, 0};
          *ev = (uint64_t)i;
          rc = 0;
          break;
        }
      }
    }
  });
  return rc;
}

static int f_ev_destroy(void *ctx, int dev, uint64_t ev) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("event_destroy");
    if (!rc) {
      if (ev == 0 || ev >= MAXE || !F.events[ev].live)
        rc = MSNAP_EINVAL;
      else
        F.events[ev].live = false;
    }
  });
  return rc;
}

static int f_ev_record(void *ctx, int dev, uint64_t ev, uint64_t stream) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("event_record");
    if (!rc) {
      F.events[ev].recorded = true;
      F.events[ev].stream = stream;
      F.events[ev].done = !F.manual;
    }
  });
  return rc;
}

static int f_ev_query(void *ctx, int dev, uint64_t ev, bool *done) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("event_query");
    if (!rc)
      *done = F.events[ev].done;
  });
  return rc;
}

static int f_ev_sync(void *ctx, int dev, uint64_t ev) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("event_synchronize");
    if (!rc)
      F.events[ev].done = true;
  });
  return rc;
}

static int f_dev_sync(void *ctx, int dev) {
  (void)ctx, (void)dev;
  int rc;
  LOCKED({
    rc = enter("device_synchronize");
    for (int i = 0; i < MAXE; i++)
      if (F.events[i].live && F.events[i].recorded)
        F.events[i].done = true;
  });
  return rc;
}

static int f_reserve(void *ctx, int dev, size_t size, size_t align,
                     uint64_t *va) {
  (void)ctx;
  int rc;
  LOCKED({
    rc = enter("vmm_reserve");
    if (!rc) {
      if (align < 2097152)
        align = 2097152;
      uint64_t p = (F.next_va[dev] + align - 1) / align * align;
      rc = add_alloc(p, size, dev, 2);
      if (!rc) {
        F.next_va[dev] = p + size;
        *va = p;
      }
    }
  });
  return rc;
}

static int f_release(void *ctx, int dev, uint64_t va, size_t size) {
  (void)ctx, (void)dev, (void)size;
  int rc;
  LOCKED({
    rc = enter("vmm_release");
    if (!rc) {
      fake_alloc_t *a = find_alloc(va, 2);
      if (!a)
        rc = MSNAP_EINVAL;
      else
        a->kind = 0;
    }
  });
  return rc;
}

static int f_map(void *ctx, int dev, uint64_t va, size_t size,
                 uint64_t *handle) {
  (void)ctx;
  int rc;
  LOCKED({
    rc = enter("vmm_map");
    if (!rc && F.used[dev] + size > F.cfg.total)
      rc = MSNAP_EOOM;
    if (!rc) {
      rc = add_alloc(va, size, dev, 3);
      if (!rc) {
        F.used[dev] += size;
        *handle = ++F.next_handle;
      }
    }
  });
  return rc;
}

static int f_unmap(void *ctx, int dev, uint64_t va, size_t size,
                   uint64_t handle) {
  (void)ctx, (void)handle;
  int rc;
  LOCKED({
    rc = enter("vmm_unmap");
    if (!rc) {
      fake_alloc_t *a = find_alloc(va, 3);
      if (!a || a->size != size) {
        rc = MSNAP_EINVAL;
      } else {
        F.used[dev] -= size;
        a->kind = 0;
      }
    }
  });
  return rc;
}

static int f_text(const char *v, char *buf, size_t len) {
  if (v == NULL || len == 0) return MSNAP_ENOTSUP;
  snprintf(buf, len, "%s", v);
  return 0;
}

static int f_soc(void *ctx, char *buf, size_t len) {
  (void)ctx;
  return f_text(F.cfg.soc_name, buf, len);
}

static int f_cann(void *ctx, char *buf, size_t len) {
  (void)ctx;
  return f_text(F.cfg.cann_version, buf, len);
}

static msnap_runtime_ops_t ops = {
    .name = "fake",
    .init = f_init,
    .fini = f_fini,
    .device_count = f_count,
    .malloc = f_malloc,
    .free = f_free,
    .mem_get_info = f_info,
    .event_create = f_ev_create,
    .event_destroy = f_ev_destroy,
    .event_record = f_ev_record,
    .event_query = f_ev_query,
    .event_synchronize = f_ev_sync,
    .device_synchronize = f_dev_sync,
    .vmm_reserve = f_reserve,
    .vmm_release = f_release,
    .vmm_map = f_map,
    .vmm_unmap = f_unmap,
};

const msnap_runtime_ops_t *fake_rt(const fake_cfg_t *cfg) {
  pthread_mutex_lock(&F.mu);
  memset(F.allocs, 0, sizeof F.allocs);
  memset(F.events, 0, sizeof F.events);
  memset(F.ncalls, 0, sizeof F.ncalls);
  F.cfg.devices = cfg && cfg->devices ? cfg->devices : 1;
  F.cfg.total = cfg && cfg->total ? cfg->total : (64ull << 30);
  F.cfg.no_vmm = cfg && cfg->no_vmm;
  F.cfg.soc_name = cfg ? cfg->soc_name : NULL;
  F.cfg.cann_version = cfg ? cfg->cann_version : NULL;
  ops.soc_name = F.cfg.soc_name ? f_soc : NULL;
  ops.cann_version = F.cfg.cann_version ? f_cann : NULL;
  for (int d = 0; d < MAXD; d++) {
    F.next[d] = base_of(d);
    F.next_va[d] = va_base_of(d);
    F.used[d] = 0;
  }
  F.manual = false;
  F.fail_left = 0;
  F.next_handle = 0;
  ops.vmm_reserve = F.cfg.no_vmm ? NULL : f_reserve;
  pthread_mutex_unlock(&F.mu);
  return &ops;
}

void fake_set_manual_events(bool manual) { LOCKED(F.manual = manual); }

void fake_complete_events(uint64_t stream) {
  LOCKED({
    for (int i = 0; i < MAXE; i++)
      if (F.events[i].live && F.events[i].recorded &&
          F.events[i].stream == stream)
        F.events[i].done = true;
  });
}

void fake_fail_nth(const char *call, uint64_t nth, int code) {
  LOCKED({
    F.fail_call[0] = 0;
    if (call) {
      strncpy(F.fail_call, call, sizeof F.fail_call - 1);
      F.fail_call[sizeof F.fail_call - 1] = 0;
    }
    F.fail_left = nth;
    F.fail_code = code ? code : MSNAP_ERUNTIME;
  });
}

uint64_t fake_live(void) {
  uint64_t n = 0;
  LOCKED({
    for (int i = 0; i < MAXA; i++)
      n += F.allocs[i].kind != 0;
    for (int i = 0; i < MAXE; i++)
      n += F.events[i].live;
  });
  return n;
}

uint64_t fake_calls(const char *call) {
  int i = site_index(call);
  return i < 0 ? 0 : F.ncalls[i];
}

uint64_t fake_next_address(int device) { return F.next[device]; }

uint64_t fake_used(int device) { return F.used[device]; }
