/*
 * sim.c -- the simulated device runtime ("sim").
 *
 * It behaves like a device runtime without any device and without host RAM
 * behind the "memory": only address ranges and byte counts are tracked, so
 * a 64 GiB device costs a few kilobytes.  Everything is deterministic: the
 * same sequence of calls yields the same addresses, handles and event ids.
 *
 * Address layout (documented policy; tests and replay rely on it):
 *   - Device d owns [base_d, base_d + span) with
 *       span   = max(2^44, next_pow2(memory) * 64)
 *       base_d = 0x7f0000000000 + d * span.
 *     The first sixteenth, [base_d, base_d + span/16), is the malloc region;
 *     the rest is the VMM (virtual address) region.
 *   - malloc places a request at the LOWEST address of the malloc region
 *     where it fits, aligned to 2 MiB when size >= 2 MiB (segment-sized
 *     requests) and to 512 bytes otherwise.  Its footprint in the address
 *     space is size rounded up to 512 bytes; device memory is charged the
 *     exact size.  msnap_sim_set_next_address overrides the placement of the
 *     next malloc on a device (any 512-aligned address whose range is free,
 *     inside or outside the region: replay may use real addresses; 0
 *     cancels an override no malloc used).
 *   - vmm_reserve places a range at the lowest fitting address of the VMM
 *     region, aligned to max(next_pow2(alignment), 2 MiB) (a granule such as
 *     20 MiB becomes 32 MiB); sizes must be multiples of the 2 MiB granule.  A reservation is not charged to device memory;
 *     each vmm_map charges its size.
 *   - Host (pinned) memory lives in [0x7e0000000000, 0x7f0000000000), placed
 *     lowest-fit with 4 KiB alignment, and is not charged to any device.
 *   - size 0 mallocs return address 0 (as cudaMalloc); freeing 0 is a no-op.
 *
 * Events: ids 1, 2, 3... never reused.  By default a recorded event is
 * complete at once.  In manual mode (msnap_sim_set_manual_events) a recorded
 * event stays pending until msnap_sim_complete_events covers its stream, or
 * it is synchronized (event_synchronize, device_synchronize).  Leaving
 * manual mode completes every pending event.  A never-recorded event
 * queries as complete (CUDA semantics).
 *
 * Fault switch (msnap_sim_fail_nth): the nth matching call from now fails
 * once, then the switch disarms.  Call names are the ops-table member names.
 * The allocating calls (malloc, vmm_map, host_malloc) fail with MSNAP_EOOM,
 * every other call with MSNAP_ERUNTIME.  vmm_reserve also fails with
 * MSNAP_EOOM when the VMM region is exhausted.
 *
 * Invariants (msnap__sim_check):
 *   - Each device's range set is sorted by address and non-overlapping; it
 *     holds malloc ranges and VA reservations.
 *   - used(d) = sum of live malloc sizes + sum of live mapping sizes of d,
 *     and used(d) <= total(d).
 *   - Every live mapping lies inside one VA reservation of its device and
 *     no two mappings overlap.
 *   - live_events equals the number of created, not destroyed events.
 *   - The host range set is sorted and non-overlapping inside its region.
 *
 * Host-backed option (MEMSNAP_SIM_HOST_BACKED=1, msnap_options_t
 * .sim_host_backed, msnap__sim_create_ex): the device memory is real host
 * memory, so that a torch device built on memsnap (memsnap.torch
 * .register_device) can copy bytes to and from it and run CPU kernels on
 * it.  Each device's span (next_pow2(memory) * 64, without the 2^44
 * minimum) and the host region (1 TiB) are one PROT_NONE, MAP_NORESERVE
 * reservation each, whose base replaces base_d / 0x7e0000000000 (aligned
 * to 1 GiB); where they do not fit (an address-space limit, ulimit -v) the
 * host region shrinks to 1 GiB and then the spans to 8x (hb_reserve_all); placement, alignment and charging are as above except that
 * footprints and alignments are at least one page.  malloc, vmm_map and
 * host_malloc make their footprint readable and writable (pages are
 * allocated by the kernel on first touch); free, vmm_unmap and host_free
 * discard the pages (MADV_DONTNEED) and make them inaccessible again, so
 * a use after free faults as on a device.  msnap_sim_set_next_address
 * accepts only addresses inside the reservation.  Freshly committed memory
 * reads as zeros.  A fork()ed child has a copy-on-write copy of it all.
 * Host-backed invariant (beyond the list above): exactly the footprints
 * of live malloc ranges, live mappings and live host ranges are readable
 * and writable inside the reservations.
 *
 * One mutex guards the whole context (every op and control call).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define SIM_GRANULE MSNAP_SIM_MIN_MEMORY
#define SIM_MIN_ALIGN ((uint64_t)512)
#define SIM_HOST_ALIGN ((uint64_t)4096)
#define SIM_BASE ((uint64_t)0x7f0000000000ull)
#define SIM_HOST_BASE ((uint64_t)0x7e0000000000ull)
#define SIM_HOST_END SIM_BASE
#define SIM_MAX_DEVICES MSNAP_SIM_MAX_DEVICES
#define SIM_MAX_MEMORY MSNAP_SIM_MAX_MEMORY
#define SIM_DEFAULT_MEMORY ((uint64_t)64 << 30)
#define SIM_HOST_SPAN (SIM_HOST_END - SIM_HOST_BASE)
#define SIM_HB_BASE_ALIGN ((uint64_t)1 << 30)
#define SIM_HB_MIN_HOST_SPAN ((uint64_t)1 << 30)
#define SIM_HB_HEADROOM_MIN ((uint64_t)1 << 30)
#define SIM_HB_HEADROOM_MAX ((uint64_t)8 << 30)

enum { RANGE_MALLOC = 1, RANGE_VA = 2, RANGE_HOST = 3 };
enum { EV_DEAD = 0, EV_CREATED, EV_PENDING, EV_COMPLETE };

typedef struct sim_range_s {
  uint64_t addr; /* start address                          */
  uint64_t len;  /* footprint in the address space         */
  uint64_t size; /* bytes charged (malloc) or reserved (VA) */
  int kind;
} sim_range_t;

typedef struct sim_rangeset_s {
  sim_range_t *v;
  size_t n, cap;
} sim_rangeset_t;

typedef struct sim_device_s {
  uint64_t total, used;
  uint64_t base, span;
  uint64_t malloc_len; /* [base, base + malloc_len): the malloc region */
  sim_rangeset_t ranges;
  bool has_next;
  uint64_t next_addr;
  void *map;      /* host-backed: the reservation (NULL otherwise) */
  size_t map_len;
} sim_device_t;

typedef struct sim_map_s {
  uint64_t handle, va, size;
  int device;
} sim_map_t;

typedef struct sim_event_s {
  uint64_t stream;
  int device;
  int state;
} sim_event_t;

#define SIM_MAGIC 0x6d73696du /* "msim": guards the msnap_sim_* calls */

typedef struct msnap_sim_s {
  uint32_t magic;
  pthread_mutex_t lock;
  int ndev;
  sim_device_t *dev;
  sim_rangeset_t host;
  sim_map_t *maps;
  size_t nmaps, capmaps;
  uint64_t next_handle;
  sim_event_t *events; /* index = id - 1 */
  size_t nevents, capevents;
  uint64_t live_events;
  bool manual;
  bool fault_any;
  char fault_call[32];
  uint64_t fault_countdown; /* 0 = disarmed */
  /* Address layout knobs (512 / 4096 and the fixed host region unless
   * host-backed). */
  bool host_backed;
  uint64_t min_align, host_align;
  uint64_t host_lo, host_hi;
  void *host_map;
  size_t host_map_len;
  /* What the sim reports as SoC name and CANN version (empty: unknown),
   * from MEMSNAP_SIM_SOC_NAME / MEMSNAP_SIM_CANN_VERSION at creation. */
  char soc_name[64], cann_version[64];
} msnap_sim_t;

/* ---- small helpers -------------------------------------------------------- */

static uint64_t align_up(uint64_t x, uint64_t a) {
  /* a is a power of two; saturates instead of wrapping. */
  if (x > UINT64_MAX - (a - 1)) return UINT64_MAX & ~(a - 1);
  return (x + a - 1) & ~(a - 1);
}

static uint64_t next_pow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

/* Index of the first range whose addr >= addr. */
static size_t rs_lower(const sim_rangeset_t *rs, uint64_t addr) {
  size_t lo = 0, hi = rs->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (rs->v[mid].addr < addr) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* The range starting exactly at addr, or NULL. */
static sim_range_t *rs_find(sim_rangeset_t *rs, uint64_t addr, size_t *idx) {
  size_t i = rs_lower(rs, addr);
  if (i < rs->n && rs->v[i].addr == addr) {
    if (idx) *idx = i;
    return &rs->v[i];
  }
  return NULL;
}

/* True when [addr, addr+len) overlaps no range of rs. */
static bool rs_is_free(const sim_rangeset_t *rs, uint64_t addr, uint64_t len) {
  size_t i = rs_lower(rs, addr);
  if (i < rs->n && rs->v[i].addr < addr + len) return false;
  if (i > 0 && rs->v[i - 1].addr + rs->v[i - 1].len > addr) return false;
  return true;
}

/*
 * Lowest address in [lo, hi) aligned to `align` where `len` bytes fit
 * between the ranges of rs.  Returns false when nothing fits.
 */
static bool rs_place(const sim_rangeset_t *rs, uint64_t lo, uint64_t hi,
                     uint64_t len, uint64_t align, uint64_t *out) {
  uint64_t cur = align_up(lo, align);
  size_t i = rs_lower(rs, lo);
  if (i > 0 && rs->v[i - 1].addr + rs->v[i - 1].len > cur)
    cur = align_up(rs->v[i - 1].addr + rs->v[i - 1].len, align);
  for (; i < rs->n; i++) {
    const sim_range_t *r = &rs->v[i];
    if (cur >= hi || len > hi - cur) return false;
    if (r->addr >= cur + len) break;
    if (r->addr + r->len > cur) cur = align_up(r->addr + r->len, align);
  }
  if (cur >= hi || len > hi - cur) return false;
  *out = cur;
  return true;
}

static int rs_insert(sim_rangeset_t *rs, sim_range_t r) {
  if (MSNAP_GROW(rs->v, rs->cap, rs->n + 1) != 0)
    return msnap__set_error(MSNAP_ENOMEM, "sim: out of host memory growing "
                            "a range table");
  size_t i = rs_lower(rs, r.addr);
  memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof r);
  rs->v[i] = r;
  rs->n++;
  return 0;
}

/* Place a range of `len` bytes (`size` of them in use) of `kind` in
 * [lo, hi) at `align` and insert it: 0 with *addr, MSNAP_EOOM (message
 * "sim: <what> exhausted ...", printf format) when nothing fits, or an
 * error. */
static int rs_take(sim_rangeset_t *rs, uint64_t lo, uint64_t hi,
                   uint64_t len, uint64_t size, uint64_t align, int kind,
                   uint64_t *addr, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
static int rs_take(sim_rangeset_t *rs, uint64_t lo, uint64_t hi,
                   uint64_t len, uint64_t size, uint64_t align, int kind,
                   uint64_t *addr, const char *fmt, ...) {
  if (!rs_place(rs, lo, hi, len, align, addr)) {
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return msnap__set_error(MSNAP_EOOM, "sim: %s", what);
  }
  return rs_insert(rs, (sim_range_t){*addr, len, size, kind});
}

static void rs_remove(sim_rangeset_t *rs, size_t i) {
  memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof rs->v[0]);
  rs->n--;
}

/*
 * Fault switch: true when this call of `name` is the one that must fail.
 * Lock held.
 */
static bool fault_hit(msnap_sim_t *s, const char *name) {
  if (s->fault_countdown == 0) return false;
  if (!s->fault_any && strcmp(s->fault_call, name) != 0) return false;
  if (--s->fault_countdown != 0) return false;
  return true;
}

static int fault_error(const char *name) {
  bool alloc = strcmp(name, "malloc") == 0 || strcmp(name, "vmm_map") == 0 ||
               strcmp(name, "host_malloc") == 0;
  return msnap__set_error(alloc ? MSNAP_EOOM : MSNAP_ERUNTIME,
                          "sim: injected failure of %s (msnap_sim_fail_nth)",
                          name);
}

/* Enter an op: lock, check the fault switch and the device index. */
static int enter(msnap_sim_t *s, const char *name, int device,
                 bool has_device) {
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  if (has_device && (device < 0 || device >= s->ndev)) {
    msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
    return msnap__set_error(MSNAP_EINVAL,
                            "sim: %s: invalid device %d (%d device%s)", name,
                            device, s->ndev, s->ndev == 1 ? "" : "s");
  }
  if (fault_hit(s, name)) {
    msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
    return fault_error(name);
  }
  return 0;
}

static int leave(msnap_sim_t *s, int rc) {
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
  return rc;
}

/* ---- host backing ------------------------------------------------------- */

/* Reserve len bytes of address space (no memory) aligned to `align`; the
 * aligned start in *base.  MSNAP_EOOM names what was being reserved
 * (errno: mmap's). */
static int hb_reserve(uint64_t len, uint64_t align, void **map,
                      size_t *map_len, uint64_t *base, const char *what) {
  size_t total = (size_t)(len + align);
  void *p = mmap(NULL, total, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    msnap__set_error_errno(
        MSNAP_EOOM, e,
        "sim: host-backed memory: cannot reserve %llu bytes of address "
        "space for %s (%s); lower MEMSNAP_SIM_MEMORY or "
        "MEMSNAP_SIM_DEVICES",
        (unsigned long long)total, what, strerror(e));
    errno = e;
    return MSNAP_EOOM;
  }
  *map = p;
  *map_len = total;
  *base = align_up((uint64_t)(uintptr_t)p, align);
  return 0;
}

/* The error when even the smallest host-backed reservations do not fit:
 * what they need, and the address-space limit when there is one. */
static int hb_limit_error(int err, int ndev, uint64_t memory,
                          uint64_t host_span, uint64_t span) {
  uint64_t need = host_span + SIM_HB_BASE_ALIGN +
                  (uint64_t)ndev * (span + SIM_HB_BASE_ALIGN);
  char limit[128];
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    snprintf(limit, sizeof limit,
             "the address-space limit is %llu bytes (ulimit -v, RLIMIT_AS): "
             "raise it, or",
             (unsigned long long)rl.rlim_cur);
  else
    snprintf(limit, sizeof limit, "%s;", strerror(err));
  return msnap__set_error_errno(
      MSNAP_EOOM, err,
      "sim: host-backed memory: cannot reserve the address space of %d "
      "device%s of %llu bytes: it takes %llu bytes at least (8x each "
      "device's memory rounded up to a power of two, and 1 GiB of pinned "
      "host memory, each with 1 GiB of alignment), and the process keeps "
      "an eighth of the limit (1 to 8 GiB) for itself; %s lower "
      "MEMSNAP_SIM_MEMORY or MEMSNAP_SIM_DEVICES",
      ndev, ndev == 1 ? "" : "s", (unsigned long long)memory,
      (unsigned long long)need, limit);
}

/* Under an address-space limit, whether the process keeps room of its own
 * after the reservations: an eighth of the limit, at least 1 GiB and at
 * most 8 GiB (the interpreter, torch's CPU tensors, thread stacks).  True
 * without a limit, or where the process's size cannot be read. */
static bool hb_headroom_left(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return true;
  unsigned long long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return true;
  int ok = fscanf(f, "%llu", &pages) == 1;
  fclose(f);
  if (!ok) return true;
  long pg = sysconf(_SC_PAGESIZE);
  uint64_t used = (uint64_t)pages * (uint64_t)(pg > 0 ? pg : 4096);
  uint64_t want = (uint64_t)rl.rlim_cur / 8;
  if (want < SIM_HB_HEADROOM_MIN) want = SIM_HB_HEADROOM_MIN;
  if (want > SIM_HB_HEADROOM_MAX) want = SIM_HB_HEADROOM_MAX;
  return used <= (uint64_t)rl.rlim_cur && (uint64_t)rl.rlim_cur - used >= want;
}

/* Release what hb_reserve_all reserved so far. */
static void hb_release_all(msnap_sim_t *s) {
  for (int d = 0; d < s->ndev; d++)
    if (s->dev[d].map != NULL) {
      munmap(s->dev[d].map, s->dev[d].map_len);
      s->dev[d].map = NULL;
      s->dev[d].map_len = 0;
    }
  if (s->host_map != NULL) {
    munmap(s->host_map, s->host_map_len);
    s->host_map = NULL;
    s->host_map_len = 0;
  }
}

/* The host-backed reservations: the pinned-host region, then each
 * device's span (its memory's next power of two x 64).  Under an
 * address-space limit (ulimit -v, RLIMIT_AS, which counts PROT_NONE
 * reservations) that the full sizes do not fit, the host region shrinks
 * first (by 8x steps, to SIM_HB_MIN_HOST_SPAN), then each device's span
 * (by halves, to 8x the memory's power of two, where the malloc region
 * is that power of two and the VMM region the rest, not a sixteenth and
 * the rest: 7x, room for the expandable segments of both pools of three
 * streams, 1.125x the memory each).  Cut sizes must also
 * leave the process room of its own (hb_headroom_left).  Nothing else
 * changes: the sizes are address space, and an allocation that fits the
 * device's memory still fits its region. */
static int hb_reserve_all(msnap_sim_t *s, uint64_t span, uint64_t memory) {
  uint64_t host_span = SIM_HOST_SPAN;
  uint64_t pow2 = next_pow2(memory);
  uint64_t min_span = pow2 * 8;
  for (;;) {
    int rc = hb_reserve(host_span, SIM_HB_BASE_ALIGN, &s->host_map,
                        &s->host_map_len, &s->host_lo, "pinned host memory");
    for (int d = 0; rc == 0 && d < s->ndev; d++) {
      char what[32];
      snprintf(what, sizeof what, "device %d", d);
      s->dev[d].total = memory;
      s->dev[d].span = span;
      /* a sixteenth, and at least the memory's power of two when the
       * span was cut (the VMM region then gets the rest) */
      s->dev[d].malloc_len = span / 16 >= pow2 ? span / 16 : pow2;
      rc = hb_reserve(span, SIM_HB_BASE_ALIGN, &s->dev[d].map,
                      &s->dev[d].map_len, &s->dev[d].base, what);
    }
    if (rc == 0 && (host_span < SIM_HOST_SPAN || span < pow2 * 64) &&
        !hb_headroom_left()) {
      /* cut sizes that fit, but leave the process too little */
      rc = MSNAP_EOOM;
      errno = ENOMEM;
    }
    if (rc == 0) {
      s->host_hi = s->host_lo + host_span;
      return 0;
    }
    int err = errno; /* mmap's (hb_reserve keeps it) */
    hb_release_all(s);
    if (host_span > SIM_HB_MIN_HOST_SPAN)
      host_span = host_span / 8 > SIM_HB_MIN_HOST_SPAN ? host_span / 8
                                                       : SIM_HB_MIN_HOST_SPAN;
    else if (span > min_span)
      span /= 2;
    else
      return hb_limit_error(err, s->ndev, memory, host_span, span);
  }
}

/* Make [addr, addr+len) readable and writable (host-backed only). */
static int hb_commit(msnap_sim_t *s, uint64_t addr, uint64_t len) {
  if (!s->host_backed || len == 0) return 0;
  if (mprotect((void *)(uintptr_t)addr, (size_t)len,
               PROT_READ | PROT_WRITE) != 0)
    return msnap__set_error_errno(
        MSNAP_EOOM, errno,
        "sim: host-backed memory: cannot commit %llu bytes at 0x%llx (%s)",
        (unsigned long long)len, (unsigned long long)addr, strerror(errno));
  return 0;
}

/* Discard the pages of [addr, addr+len) and make them inaccessible. */
static void hb_release(msnap_sim_t *s, uint64_t addr, uint64_t len) {
  if (!s->host_backed || len == 0) return;
  void *p = (void *)(uintptr_t)addr;
  (void)madvise(p, (size_t)len, MADV_DONTNEED);
  (void)mprotect(p, (size_t)len, PROT_NONE);
}

/* ---- context ------------------------------------------------------------- */

int msnap__sim_create(int devices, uint64_t memory, void **ctx) {
  return msnap__sim_create_ex(devices, memory, false, ctx);
}

static void sim_free_ctx(msnap_sim_t *s) {
  for (int d = 0; d < s->ndev; d++) {
    free(s->dev[d].ranges.v);
    if (s->dev[d].map != NULL) munmap(s->dev[d].map, s->dev[d].map_len);
  }
  if (s->host_map != NULL) munmap(s->host_map, s->host_map_len);
  free(s->dev);
  free(s->host.v);
  free(s->maps);
  free(s->events);
  pthread_mutex_destroy(&s->lock);
  s->magic = 0;
  free(s);
}

int msnap__sim_create_ex(int devices, uint64_t memory, bool host_backed,
                         void **ctx) {
  if (devices < 1) devices = 1;
  if (devices > SIM_MAX_DEVICES) devices = SIM_MAX_DEVICES;
  if (memory < SIM_GRANULE) memory = SIM_GRANULE;
  if (memory > SIM_MAX_MEMORY) memory = SIM_MAX_MEMORY;
  msnap_sim_t *s = calloc(1, sizeof *s);
  if (s == NULL) return msnap__set_error(MSNAP_ENOMEM, "sim: out of host memory");
  s->dev = calloc((size_t)devices, sizeof *s->dev);
  if (s->dev == NULL) {
    free(s);
    return msnap__set_error(MSNAP_ENOMEM, "sim: out of host memory");
  }
  pthread_mutex_init(&s->lock, NULL);
  s->magic = SIM_MAGIC;
  s->ndev = devices;
  s->host_backed = host_backed;
  s->min_align = SIM_MIN_ALIGN;
  s->host_align = SIM_HOST_ALIGN;
  s->host_lo = SIM_HOST_BASE;
  s->host_hi = SIM_HOST_END;
  uint64_t span = next_pow2(memory) * 64;
  if (host_backed) {
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t page = pg > 0 ? (uint64_t)pg : 4096;
    if (page > s->min_align) s->min_align = page;
    if (page > s->host_align) s->host_align = page;
    int rc = hb_reserve_all(s, span, memory);
    if (rc != 0) {
      sim_free_ctx(s);
      return rc;
    }
  } else {
    if (span < ((uint64_t)1 << 44)) span = (uint64_t)1 << 44;
    for (int d = 0; d < devices; d++) {
      s->dev[d].total = memory;
      s->dev[d].span = span;
      s->dev[d].malloc_len = span / 16;
      s->dev[d].base = SIM_BASE + (uint64_t)d * span;
    }
  }
  s->next_handle = 1;
  const char *soc = msnap__env_get(MSNAP_ENV_SIM_SOC_NAME);
  const char *cann = msnap__env_get(MSNAP_ENV_SIM_CANN_VERSION);
  snprintf(s->soc_name, sizeof s->soc_name, "%s", soc ? soc : "");
  snprintf(s->cann_version, sizeof s->cann_version, "%s", cann ? cann : "");
  *ctx = s;
  return 0;
}

static int sim_init(void **ctx) {
  /* Out-of-range values warn (naming the variable) and use the default. */
  uint64_t n = msnap__env_count(MSNAP_ENV_SIM_DEVICES, 1, 1, SIM_MAX_DEVICES);
  uint64_t mem = msnap__env_size_range(MSNAP_ENV_SIM_MEMORY,
                                       SIM_DEFAULT_MEMORY, SIM_GRANULE,
                                       SIM_MAX_MEMORY);
  bool hb = msnap__env_bool(MSNAP_ENV_SIM_HOST_BACKED, false);
  return msnap__sim_create_ex((int)n, mem, hb, ctx);
}

static void sim_fini(void *ctx) {
  msnap_sim_t *s = ctx;
  if (s == NULL) return;
  sim_free_ctx(s);
}

static int sim_device_count(void *ctx, int *count) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "device_count", 0, false);
  if (rc) return rc;
  *count = s->ndev;
  return leave(s, 0);
}

/* ---- device memory --------------------------------------------------------- */

static int sim_malloc(void *ctx, int device, size_t size, uint64_t *ptr) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "malloc", device, true);
  if (rc) return rc;
  sim_device_t *d = &s->dev[device];
  bool forced = d->has_next;
  uint64_t forced_addr = d->next_addr;
  if (size == 0) {
    *ptr = 0;
    return leave(s, 0);
  }
  d->has_next = false;
  if ((uint64_t)size > d->total - d->used)
    return leave(s, msnap__set_error(
                        MSNAP_EOOM,
                        "sim: device %d out of memory allocating %zu bytes "
                        "(%llu of %llu bytes in use)",
                        device, size, (unsigned long long)d->used,
                        (unsigned long long)d->total));
  uint64_t len = align_up(size, s->min_align);
  uint64_t addr;
  if (forced) {
    if (forced_addr == 0 || forced_addr % s->min_align != 0 ||
        forced_addr > UINT64_MAX - len ||
        !rs_is_free(&d->ranges, forced_addr, len) ||
        (s->host_backed &&
         (forced_addr < d->base || forced_addr + len > d->base + d->span)))
      return leave(s, msnap__set_error(
                          MSNAP_EINVAL,
                          "sim: forced address 0x%llx for %zu bytes on "
                          "device %d is not a free %llu-aligned range%s",
                          (unsigned long long)forced_addr, size, device,
                          (unsigned long long)s->min_align,
                          s->host_backed ? " of the host-backed device" : ""));
    addr = forced_addr;
    rc = rs_insert(&d->ranges, (sim_range_t){addr, len, size, RANGE_MALLOC});
  } else {
    uint64_t align = size >= SIM_GRANULE ? SIM_GRANULE : s->min_align;
    rc = rs_take(&d->ranges, d->base, d->base + d->malloc_len, len, size,
                 align, RANGE_MALLOC, &addr,
                 "device %d address space exhausted allocating %zu bytes",
                 device, size);
  }
  if (rc) return leave(s, rc);
  rc = hb_commit(s, addr, len);
  if (rc) {
    size_t i;
    if (rs_find(&d->ranges, addr, &i)) rs_remove(&d->ranges, i);
    return leave(s, rc);
  }
  d->used += size;
  *ptr = addr;
  return leave(s, 0);
}

static int sim_free(void *ctx, int device, uint64_t ptr) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "free", device, true);
  if (rc) return rc;
  if (ptr == 0) return leave(s, 0);
  sim_device_t *d = &s->dev[device];
  size_t i;
  sim_range_t *r = rs_find(&d->ranges, ptr, &i);
  if (r == NULL || r->kind != RANGE_MALLOC)
    return leave(s, msnap__set_error(
                        MSNAP_ERUNTIME,
                        "sim: free of 0x%llx on device %d: not a live "
                        "device allocation",
                        (unsigned long long)ptr, device));
  d->used -= r->size;
  hb_release(s, r->addr, r->len);
  rs_remove(&d->ranges, i);
  return leave(s, 0);
}

static int sim_mem_get_info(void *ctx, int device, size_t *free_bytes,
                            size_t *total_bytes) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "mem_get_info", device, true);
  if (rc) return rc;
  *free_bytes = (size_t)(s->dev[device].total - s->dev[device].used);
  *total_bytes = (size_t)s->dev[device].total;
  return leave(s, 0);
}

/* ---- events ---------------------------------------------------------------- */

/* The live event `id` of `device`, or NULL (error set).  Lock held. */
static sim_event_t *event_get(msnap_sim_t *s, const char *name, int device,
                              uint64_t id) {
  if (id == 0 || id > s->nevents || s->events[id - 1].state == EV_DEAD) {
    msnap__set_error(MSNAP_ERUNTIME, "sim: %s: event %llu is not a live event",
                     name, (unsigned long long)id);
    return NULL;
  }
  sim_event_t *e = &s->events[id - 1];
  if (e->device != device) {
    msnap__set_error(MSNAP_ERUNTIME,
                     "sim: %s: event %llu belongs to device %d, not %d", name,
                     (unsigned long long)id, e->device, device);
    return NULL;
  }
  return e;
}

/* Enter an event op: lock, checks, the live event of `device`.  NULL
 * (the lock released, the error in *rc) when anything is wrong. */
static sim_event_t *event_enter(msnap_sim_t *s, const char *name, int device,
                                uint64_t id, int *rc) {
  *rc = enter(s, name, device, true);
  if (*rc) return NULL;
  sim_event_t *e = event_get(s, name, device, id);
  if (e == NULL) *rc = leave(s, MSNAP_ERUNTIME);
  return e;
}

static int sim_event_create(void *ctx, int device, uint64_t *event) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "event_create", device, true);
  if (rc) return rc;
  if (MSNAP_GROW(s->events, s->capevents, s->nevents + 1) != 0)
    return leave(s, msnap__set_error(MSNAP_ENOMEM, "sim: out of host memory "
                                     "creating an event"));
  s->events[s->nevents] = (sim_event_t){0, device, EV_CREATED};
  s->nevents++;
  s->live_events++;
  *event = s->nevents;
  return leave(s, 0);
}

static int sim_event_destroy(void *ctx, int device, uint64_t event) {
  msnap_sim_t *s = ctx;
  int rc;
  sim_event_t *e = event_enter(s, "event_destroy", device, event, &rc);
  if (e == NULL) return rc;
  e->state = EV_DEAD;
  s->live_events--;
  return leave(s, 0);
}

static int sim_event_record(void *ctx, int device, uint64_t event,
                            uint64_t stream) {
  msnap_sim_t *s = ctx;
  int rc;
  sim_event_t *e = event_enter(s, "event_record", device, event, &rc);
  if (e == NULL) return rc;
  e->stream = stream;
  e->state = s->manual ? EV_PENDING : EV_COMPLETE;
  return leave(s, 0);
}

static int sim_event_query(void *ctx, int device, uint64_t event, bool *done) {
  msnap_sim_t *s = ctx;
  int rc;
  sim_event_t *e = event_enter(s, "event_query", device, event, &rc);
  if (e == NULL) return rc;
  *done = e->state != EV_PENDING;
  return leave(s, 0);
}

static int sim_event_synchronize(void *ctx, int device, uint64_t event) {
  msnap_sim_t *s = ctx;
  int rc;
  sim_event_t *e = event_enter(s, "event_synchronize", device, event, &rc);
  if (e == NULL) return rc;
  if (e->state == EV_PENDING) e->state = EV_COMPLETE;
  return leave(s, 0);
}

static int sim_device_synchronize(void *ctx, int device) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "device_synchronize", device, true);
  if (rc) return rc;
  for (size_t i = 0; i < s->nevents; i++)
    if (s->events[i].device == device && s->events[i].state == EV_PENDING)
      s->events[i].state = EV_COMPLETE;
  return leave(s, 0);
}

/* ---- virtual memory ---------------------------------------------------------- */

static int sim_vmm_reserve(void *ctx, int device, size_t size,
                           size_t alignment, uint64_t *va) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "vmm_reserve", device, true);
  if (rc) return rc;
  if (size == 0 || size % SIM_GRANULE != 0 || alignment > ((size_t)1 << 40))
    return leave(s, msnap__set_error(
                        MSNAP_EINVAL,
                        "sim: vmm_reserve of %zu bytes aligned %zu: size must "
                        "be a non-zero multiple of 2 MiB and alignment at "
                        "most 1 TiB",
                        size, alignment));
  sim_device_t *d = &s->dev[device];
  uint64_t align = next_pow2(alignment);
  if (align < SIM_GRANULE) align = SIM_GRANULE;
  uint64_t addr;
  rc = rs_take(&d->ranges, d->base + d->malloc_len, d->base + d->span, size,
               size, align, RANGE_VA, &addr,
               "device %d virtual address space exhausted reserving %zu "
               "bytes",
               device, size);
  if (rc) return leave(s, rc);
  *va = addr;
  return leave(s, 0);
}

static int sim_vmm_release(void *ctx, int device, uint64_t va, size_t size) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "vmm_release", device, true);
  if (rc) return rc;
  sim_device_t *d = &s->dev[device];
  size_t i;
  sim_range_t *r = rs_find(&d->ranges, va, &i);
  if (r == NULL || r->kind != RANGE_VA || r->size != size)
    return leave(s, msnap__set_error(
                        MSNAP_ERUNTIME,
                        "sim: vmm_release of 0x%llx (%zu bytes) on device %d: "
                        "not a live reservation of that size",
                        (unsigned long long)va, size, device));
  for (size_t m = 0; m < s->nmaps; m++)
    if (s->maps[m].device == device && s->maps[m].va >= va &&
        s->maps[m].va < va + size)
      return leave(s, msnap__set_error(
                          MSNAP_ERUNTIME,
                          "sim: vmm_release of 0x%llx on device %d: still "
                          "mapped at 0x%llx (handle %llu)",
                          (unsigned long long)va, device,
                          (unsigned long long)s->maps[m].va,
                          (unsigned long long)s->maps[m].handle));
  rs_remove(&d->ranges, i);
  return leave(s, 0);
}

static int sim_vmm_map(void *ctx, int device, uint64_t va, size_t size,
                       uint64_t *handle) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "vmm_map", device, true);
  if (rc) return rc;
  sim_device_t *d = &s->dev[device];
  if (size == 0 || size % SIM_GRANULE != 0 || va % SIM_GRANULE != 0 ||
      va > UINT64_MAX - size)
    return leave(s, msnap__set_error(
                        MSNAP_EINVAL,
                        "sim: vmm_map of 0x%llx (%zu bytes): address and size "
                        "must be non-zero multiples of 2 MiB",
                        (unsigned long long)va, size));
  size_t i = rs_lower(&d->ranges, va + 1);
  const sim_range_t *r = i > 0 ? &d->ranges.v[i - 1] : NULL;
  if (r == NULL || r->kind != RANGE_VA || va + size > r->addr + r->len)
    return leave(s, msnap__set_error(
                        MSNAP_ERUNTIME,
                        "sim: vmm_map of 0x%llx (%zu bytes) on device %d: not "
                        "inside a reservation",
                        (unsigned long long)va, size, device));
  for (size_t m = 0; m < s->nmaps; m++) {
    const sim_map_t *mp = &s->maps[m];
    if (mp->device == device && mp->va < va + size && va < mp->va + mp->size)
      return leave(s, msnap__set_error(
                          MSNAP_ERUNTIME,
                          "sim: vmm_map of 0x%llx (%zu bytes) on device %d "
                          "overlaps the mapping at 0x%llx",
                          (unsigned long long)va, size, device,
                          (unsigned long long)mp->va));
  }
  if ((uint64_t)size > d->total - d->used)
    return leave(s, msnap__set_error(
                        MSNAP_EOOM,
                        "sim: device %d out of memory mapping %zu bytes "
                        "(%llu of %llu bytes in use)",
                        device, size, (unsigned long long)d->used,
                        (unsigned long long)d->total));
  if (MSNAP_GROW(s->maps, s->capmaps, s->nmaps + 1) != 0)
    return leave(s, msnap__set_error(MSNAP_ENOMEM, "sim: out of host memory "
                                     "growing the mapping table"));
  rc = hb_commit(s, va, size);
  if (rc) return leave(s, rc);
  s->maps[s->nmaps++] = (sim_map_t){s->next_handle, va, size, device};
  *handle = s->next_handle++;
  d->used += size;
  return leave(s, 0);
}

static int sim_vmm_unmap(void *ctx, int device, uint64_t va, size_t size,
                         uint64_t handle) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "vmm_unmap", device, true);
  if (rc) return rc;
  for (size_t m = 0; m < s->nmaps; m++) {
    sim_map_t *mp = &s->maps[m];
    if (mp->handle != handle) continue;
    if (mp->device != device || mp->va != va || mp->size != size)
      return leave(s, msnap__set_error(
                          MSNAP_ERUNTIME,
                          "sim: vmm_unmap of handle %llu at 0x%llx (%zu bytes) "
                          "on device %d: it is mapped at 0x%llx (%llu bytes) "
                          "on device %d",
                          (unsigned long long)handle, (unsigned long long)va,
                          size, device, (unsigned long long)mp->va,
                          (unsigned long long)mp->size, mp->device));
    s->dev[device].used -= size;
    hb_release(s, va, size);
    /* Keep the table in creation order (deterministic iteration). */
    memmove(mp, mp + 1, (s->nmaps - m - 1) * sizeof *mp);
    s->nmaps--;
    return leave(s, 0);
  }
  return leave(s, msnap__set_error(MSNAP_ERUNTIME,
                                   "sim: vmm_unmap: handle %llu is not mapped",
                                   (unsigned long long)handle));
}

/* ---- host memory ----------------------------------------------------------- */

static int sim_host_malloc(void *ctx, size_t size, uint64_t *ptr) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "host_malloc", 0, false);
  if (rc) return rc;
  if (size == 0) {
    *ptr = 0;
    return leave(s, 0);
  }
  uint64_t len = align_up(size, s->host_align), addr;
  if (!rs_place(&s->host, s->host_lo, s->host_hi, len, s->host_align,
                &addr))
    return leave(s, msnap__set_error(
                        MSNAP_EOOM,
                        "sim: host address space exhausted allocating %zu "
                        "pinned bytes%s",
                        size,
                        s->host_hi - s->host_lo < SIM_HOST_SPAN
                            ? " (the pinned region was cut to fit the "
                              "address-space limit, ulimit -v / RLIMIT_AS)"
                            : ""));
  rc = hb_commit(s, addr, len);
  if (rc) return leave(s, rc);
  rc = rs_insert(&s->host, (sim_range_t){addr, len, size, RANGE_HOST});
  if (rc) {
    hb_release(s, addr, len);
    return leave(s, rc);
  }
  *ptr = addr;
  return leave(s, 0);
}

static int sim_host_free(void *ctx, uint64_t ptr) {
  msnap_sim_t *s = ctx;
  int rc = enter(s, "host_free", 0, false);
  if (rc) return rc;
  if (ptr == 0) return leave(s, 0);
  size_t i;
  sim_range_t *hr = rs_find(&s->host, ptr, &i);
  if (hr == NULL)
    return leave(s, msnap__set_error(MSNAP_ERUNTIME,
                                     "sim: host_free of 0x%llx: not a live "
                                     "pinned allocation",
                                     (unsigned long long)ptr));
  hb_release(s, hr->addr, hr->len);
  rs_remove(&s->host, i);
  return leave(s, 0);
}

/* ---- platform ------------------------------------------------------------------ */

/* The SoC name and CANN version set for the sim (MEMSNAP_SIM_SOC_NAME,
 * MEMSNAP_SIM_CANN_VERSION): unset, the sim is no Ascend device and the
 * npu profile pads as torch_npu does on unknown hardware (32 bytes). */
static int sim_text(const char *v, char *buf, size_t len) {
  if (v[0] == '\0') return MSNAP_ENOTSUP; /* unknown: not an error */
  if (len == 0) return MSNAP_EINVAL;
  snprintf(buf, len, "%s", v);
  return 0;
}

static int sim_soc_name(void *ctx, char *buf, size_t len) {
  msnap_sim_t *s = ctx;
  return sim_text(s->soc_name, buf, len);
}

static int sim_cann_version(void *ctx, char *buf, size_t len) {
  msnap_sim_t *s = ctx;
  return sim_text(s->cann_version, buf, len);
}

/* CANN's per-module report exists only on Ascend (the acl runtime). */
static int sim_mem_usage_info(void *ctx, int device, msnap_mem_usage_t *out,
                              size_t cap, size_t *n) {
  (void)ctx;
  (void)device;
  (void)out;
  (void)cap;
  (void)n;
  return msnap__set_error(MSNAP_ENOTSUP, "sim: no CANN per-module memory "
                          "usage (aclrtGetMemUsageInfo) on the simulated "
                          "device");
}

/* As NVML on a device this process has to itself: one process, this one,
 * using what the sim has charged to the device. */
static int sim_process_memory(void *ctx, int device, msnap_proc_mem_t *out,
                              size_t cap, size_t *n) {
  msnap_sim_t *s = ctx;
  /* A query, never a fault-injection site (fault tests count calls). */
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  if (device < 0 || device >= s->ndev)
    return leave(s, msnap__set_error(MSNAP_EINVAL, "sim: process_memory: "
                                     "invalid device %d", device));
  uint64_t used = s->dev[device].used;
  *n = used > 0 ? 1 : 0;
  if (used > 0 && cap > 0) {
    out[0].pid = (uint32_t)getpid();
    out[0].used_bytes = used;
  }
  return leave(s, 0);
}

static const msnap_runtime_ops_t sim_ops = {
    .name = "sim",
    .init = sim_init,
    .fini = sim_fini,
    .device_count = sim_device_count,
    .malloc = sim_malloc,
    .free = sim_free,
    .mem_get_info = sim_mem_get_info,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .device_synchronize = sim_device_synchronize,
    .vmm_reserve = sim_vmm_reserve,
    .vmm_release = sim_vmm_release,
    .vmm_map = sim_vmm_map,
    .vmm_unmap = sim_vmm_unmap,
    .host_malloc = sim_host_malloc,
    .host_free = sim_host_free,
    .soc_name = sim_soc_name,
    .cann_version = sim_cann_version,
    .mem_usage_info = sim_mem_usage_info,
    .process_memory = sim_process_memory,
};

const msnap_runtime_ops_t *msnap_runtime_sim(void) { return &sim_ops; }

/* ---- control calls ------------------------------------------------------------ */

/* The control calls accept any runtime's context and ignore non-sim ones
 * (an allocator on acl or cuda hands out its own context). */
static msnap_sim_t *as_sim(void *ctx) {
  msnap_sim_t *s = ctx;
  return s != NULL && s->magic == SIM_MAGIC ? s : NULL;
}

void msnap_sim_set_manual_events(void *ctx, bool manual) {
  msnap_sim_t *s = as_sim(ctx);
  if (s == NULL) return;
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  s->manual = manual;
  if (!manual)
    for (size_t i = 0; i < s->nevents; i++)
      if (s->events[i].state == EV_PENDING) s->events[i].state = EV_COMPLETE;
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
}

void msnap_sim_complete_events(void *ctx, uint64_t stream, bool all_streams) {
  msnap_sim_t *s = as_sim(ctx);
  if (s == NULL) return;
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  for (size_t i = 0; i < s->nevents; i++)
    if (s->events[i].state == EV_PENDING &&
        (all_streams || s->events[i].stream == stream))
      s->events[i].state = EV_COMPLETE;
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
}

void msnap_sim_fail_nth(void *ctx, const char *call, uint64_t nth) {
  msnap_sim_t *s = as_sim(ctx);
  if (s == NULL) return;
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  s->fault_countdown = nth;
  s->fault_any = call == NULL;
  snprintf(s->fault_call, sizeof s->fault_call, "%s", call ? call : "");
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
}

void msnap_sim_set_next_address(void *ctx, int device, uint64_t address) {
  msnap_sim_t *s = as_sim(ctx);
  if (s == NULL) return;
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  if (device >= 0 && device < s->ndev) {
    s->dev[device].has_next = address != 0; /* 0: cancel */
    s->dev[device].next_addr = address;
  }
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
}

void msnap__sim_atfork(void *ctx, int phase) {
  msnap_sim_t *s = as_sim(ctx);
  if (s != NULL) msnap__fork_mutex(&s->lock, phase);
}

bool msnap_sim_host_backed(void *ctx) {
  msnap_sim_t *s = as_sim(ctx);
  return s != NULL && s->host_backed;
}

uint64_t msnap_sim_live_allocations(void *ctx) {
  msnap_sim_t *s = as_sim(ctx);
  if (s == NULL) return 0;
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  uint64_t n = s->host.n + s->nmaps + s->live_events;
  for (int d = 0; d < s->ndev; d++) n += s->dev[d].ranges.n;
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
  return n;
}

/* ---- invariant checker ------------------------------------------------------- */

#define CHECK_FAIL(...)                                                       \
  do {                                                                        \
    if (msg != NULL && msg_len > 0) snprintf(msg, msg_len, __VA_ARGS__);      \
    rc = MSNAP_ESTATE;                                                        \
    goto out;                                                                 \
  } while (0)

static bool rs_sorted(const sim_rangeset_t *rs, size_t *bad) {
  for (size_t i = 0; i + 1 < rs->n; i++) {
    if (rs->v[i].addr + rs->v[i].len > rs->v[i + 1].addr) {
      *bad = i;
      return false;
    }
  }
  return true;
}

int msnap__sim_check(void *ctx, char *msg, size_t msg_len) {
  msnap_sim_t *s = as_sim(ctx);
  int rc = 0;
  if (s == NULL) {
    if (msg != NULL && msg_len > 0)
      snprintf(msg, msg_len, "not a sim runtime context");
    return MSNAP_EINVAL;
  }
  msnap__mutex_lock(&s->lock, MSNAP_RANK_RUNTIME);
  for (int dv = 0; dv < s->ndev; dv++) {
    const sim_device_t *d = &s->dev[dv];
    size_t bad;
    if (!rs_sorted(&d->ranges, &bad))
      CHECK_FAIL("device %d: range 0x%llx+%llu overlaps or precedes 0x%llx",
                 dv, (unsigned long long)d->ranges.v[bad].addr,
                 (unsigned long long)d->ranges.v[bad].len,
                 (unsigned long long)d->ranges.v[bad + 1].addr);
    uint64_t used = 0;
    for (size_t i = 0; i < d->ranges.n; i++) {
      const sim_range_t *r = &d->ranges.v[i];
      if (r->kind == RANGE_MALLOC) used += r->size;
      else if (r->kind != RANGE_VA)
        CHECK_FAIL("device %d: range 0x%llx has kind %d", dv,
                   (unsigned long long)r->addr, r->kind);
      if (r->len < r->size || r->len == 0)
        CHECK_FAIL("device %d: range 0x%llx footprint %llu < size %llu", dv,
                   (unsigned long long)r->addr, (unsigned long long)r->len,
                   (unsigned long long)r->size);
      if (s->host_backed &&
          (r->addr < d->base || r->addr + r->len > d->base + d->span ||
           r->addr % s->min_align != 0 || r->len % s->min_align != 0))
        CHECK_FAIL("device %d: host-backed range 0x%llx+%llu is outside the "
                   "reservation or not page-aligned",
                   dv, (unsigned long long)r->addr,
                   (unsigned long long)r->len);
    }
    for (size_t m = 0; m < s->nmaps; m++)
      if (s->maps[m].device == dv) used += s->maps[m].size;
    if (used != d->used)
      CHECK_FAIL("device %d: used %llu but live allocations and mappings sum "
                 "to %llu",
                 dv, (unsigned long long)d->used, (unsigned long long)used);
    if (d->used > d->total)
      CHECK_FAIL("device %d: used %llu exceeds total %llu", dv,
                 (unsigned long long)d->used, (unsigned long long)d->total);
  }
  for (size_t m = 0; m < s->nmaps; m++) {
    const sim_map_t *mp = &s->maps[m];
    if (mp->device < 0 || mp->device >= s->ndev)
      CHECK_FAIL("mapping %llu has device %d", (unsigned long long)mp->handle,
                 mp->device);
    const sim_rangeset_t *rs = &s->dev[mp->device].ranges;
    size_t i = rs_lower(rs, mp->va + 1);
    const sim_range_t *r = i > 0 ? &rs->v[i - 1] : NULL;
    if (r == NULL || r->kind != RANGE_VA || mp->va + mp->size > r->addr + r->len)
      CHECK_FAIL("mapping %llu at 0x%llx is outside every reservation",
                 (unsigned long long)mp->handle, (unsigned long long)mp->va);
    for (size_t k = m + 1; k < s->nmaps; k++) {
      const sim_map_t *o = &s->maps[k];
      if (o->device == mp->device && o->va < mp->va + mp->size &&
          mp->va < o->va + o->size)
        CHECK_FAIL("mappings %llu and %llu overlap",
                   (unsigned long long)mp->handle,
                   (unsigned long long)o->handle);
      if (o->handle == mp->handle)
        CHECK_FAIL("handle %llu mapped twice", (unsigned long long)o->handle);
    }
  }
  uint64_t live = 0;
  for (size_t i = 0; i < s->nevents; i++) live += s->events[i].state != EV_DEAD;
  if (live != s->live_events)
    CHECK_FAIL("live_events %llu but %llu events are live",
               (unsigned long long)s->live_events, (unsigned long long)live);
  size_t bad;
  if (!rs_sorted(&s->host, &bad))
    CHECK_FAIL("host range 0x%llx overlaps the next one",
               (unsigned long long)s->host.v[bad].addr);
  for (size_t i = 0; i < s->host.n; i++)
    if (s->host.v[i].addr < s->host_lo ||
        s->host.v[i].addr + s->host.v[i].len > s->host_hi)
      CHECK_FAIL("host range 0x%llx outside the host region",
                 (unsigned long long)s->host.v[i].addr);
out:
  msnap__mutex_unlock(&s->lock, MSNAP_RANK_RUNTIME);
  return rc;
}
