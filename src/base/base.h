/*
 * base.h -- the base layer's internal interface: every function with
 * external linkage of error.c, env.c, clock.c, util.c and lockrank.c
 * (sink.c has its own header, sink.h).  Every other layer may include it;
 * base calls no other layer.  Internal names are msnap__*.
 *
 * Layers (docs/design.md): base <- runtime, record, model <- alloc <- api
 * <- tools, python.  Each layer is its own static library; a lower layer
 * never references a symbol of a higher one (tests/layers checks it with
 * nm, and the per-layer link checks in src/meson.build fail to link).
 *
 * Debug tiers (meson -Ddebug_level=N defines MSNAP_DEBUG=N; debug code is
 * always compiled and removed by `if` on the constant):
 *   >= 1  lock-rank checking: every library mutex is taken through
 *         msnap__rank_acquire / msnap__rank_release (lockrank.c), and a
 *         lock taken out of order aborts with both lock names;
 *   >= 2  internal asserts (MSNAP_ASSERT): "caller holds the device lock"
 *         and other preconditions of internal functions;
 *   >= 3  expensive checks: the allocator runs its device invariant
 *         checker after every malloc / free (alloc.c).
 */
#ifndef MSNAP_BASE_H
#define MSNAP_BASE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap.h"

#if defined(__GNUC__)
#define msnap_likely(x) __builtin_expect(!!(x), 1)
#define msnap_unlikely(x) __builtin_expect(!!(x), 0)
#else
#define msnap_likely(x) (x)
#define msnap_unlikely(x) (x)
#endif

#ifndef MSNAP_DEBUG
#define MSNAP_DEBUG 0
#endif
static const int msnap_debug_level = MSNAP_DEBUG;

/* Thread-local variables of the library.  (initial-exec TLS was tried:
 * it puts libmemsnap.so's whole TLS block, error buffers included, into
 * the static TLS surplus, and dlopen from Python then fails with "cannot
 * allocate memory in static TLS block"; the default model costs a
 * __tls_get_addr call per access instead.) */
#define MSNAP_TLS _Thread_local
/* The address of this thread's copy of a MSNAP_TLS variable, as
 * `T *t = msnap__tls_addr(&var);` once per function: the empty asm hides
 * where the pointer came from, so the compiler keeps it in a register
 * instead of calling __tls_get_addr again at every use past a branch or a
 * call (GCC rematerializes TLS addresses: a stack capture had 27 such
 * call sites). */
static inline void *msnap__tls_addr(void *p) {
  __asm__("" : "+r"(p));
  return p;
}

/* ---- error.c ------------------------------------------------------------ */
/* Set this thread's last-error text (printf format); returns err. */
int msnap__set_error(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Same, and remember the system errno `sys_errno` (msnap_last_errno());
 * msnap__set_error resets it to 0. */
int msnap__set_error_errno(int err, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error code of a failed write or open for system errno e: ENOSPC and
 * EDQUOT -> MSNAP_ENOSPC, ENOMEM -> MSNAP_ENOMEM, others MSNAP_EIO. */
int msnap__errno_code(int e);
/* MSNAP_DEBUG >= 2: report a failed internal assertion and abort. */
void msnap__assert_fail(const char *cond, const char *file, int line)
    __attribute__((noreturn));
#define MSNAP_ASSERT(cond)                                                   \
  do {                                                                       \
    if (msnap_debug_level >= 2 && msnap_unlikely(!(cond)))                   \
      msnap__assert_fail(#cond, __FILE__, __LINE__);                         \
  } while (0)

/* ---- env.c: the one table of environment variables ---------------------- */
/* Every variable memsnap reads; env.c's table gives each one's name and
 * meaning, and msnap__env_get is the only getenv of src/. */
typedef enum msnap_env_e {
  MSNAP_ENV_PROFILE,                   /* MEMSNAP_PROFILE                  */
  MSNAP_ENV_RUNTIME,                   /* MEMSNAP_RUNTIME                  */
  MSNAP_ENV_SIM_DEVICES,               /* MEMSNAP_SIM_DEVICES              */
  MSNAP_ENV_SIM_MEMORY,                /* MEMSNAP_SIM_MEMORY               */
  MSNAP_ENV_SIM_HOST_BACKED,           /* MEMSNAP_SIM_HOST_BACKED          */
  MSNAP_ENV_ACL_LIBRARY,               /* MEMSNAP_ACL_LIBRARY              */
  MSNAP_ENV_CUDA_LIBRARY,              /* MEMSNAP_CUDA_LIBRARY             */
  MSNAP_ENV_CUDA_DRIVER_LIBRARY,       /* MEMSNAP_CUDA_DRIVER_LIBRARY      */
  MSNAP_ENV_UNWIND,                    /* MEMSNAP_UNWIND                   */
  MSNAP_ENV_NO_LIBDW,                  /* MEMSNAP_NO_LIBDW                 */
  MSNAP_ENV_CLOCK_FALLBACK,            /* MEMSNAP_CLOCK_FALLBACK           */
  MSNAP_ENV_PYTORCH_CUDA_ALLOC_CONF,   /* PYTORCH_CUDA_ALLOC_CONF          */
  MSNAP_ENV_PYTORCH_NPU_ALLOC_CONF,    /* PYTORCH_NPU_ALLOC_CONF           */
  MSNAP_ENV_PYTORCH_ALLOC_CONF,        /* PYTORCH_ALLOC_CONF               */
  MSNAP_ENV_NO_CUDA_MEMORY_CACHING,    /* PYTORCH_NO_CUDA_MEMORY_CACHING   */
  MSNAP_ENV_NO_NPU_MEMORY_CACHING,     /* PYTORCH_NO_NPU_MEMORY_CACHING    */
  MSNAP_ENV_OOM_SNAPSHOT_ENABLE,       /* OOM_SNAPSHOT_ENABLE              */
  MSNAP_ENV_OOM_SNAPSHOT_PATH,         /* OOM_SNAPSHOT_PATH                */
  MSNAP_ENV_RANK,                      /* RANK (torchrun)                  */
  MSNAP_ENV_WORLD_SIZE,                /* WORLD_SIZE                       */
  MSNAP_ENV_LOCAL_RANK,                /* LOCAL_RANK                       */
  MSNAP_ENV_SIM_SOC_NAME,              /* MEMSNAP_SIM_SOC_NAME             */
  MSNAP_ENV_SIM_CANN_VERSION,          /* MEMSNAP_SIM_CANN_VERSION         */
  MSNAP_ENV_WORKSPACE_VIEW,            /* MEMSNAP_WORKSPACE_VIEW           */
  MSNAP_ENV_USAGE_REPORT,              /* MEMSNAP_USAGE_REPORT             */
  MSNAP_ENV_NVML_LIBRARY,              /* MEMSNAP_NVML_LIBRARY             */
  MSNAP_ENV_INPUT_LIMIT,               /* MEMSNAP_INPUT_LIMIT              */
  MSNAP_ENV_ZLIB_LIBRARY,              /* MEMSNAP_ZLIB_LIBRARY             */
  MSNAP_ENV_ZSTD_LIBRARY,              /* MEMSNAP_ZSTD_LIBRARY             */
  MSNAP_ENV_COUNT
} msnap_env_t;
/* The raw value (NULL when unset); read on every call. */
const char *msnap__env_get(msnap_env_t var);
/* The variable's name ("MEMSNAP_PROFILE"). */
const char *msnap__env_name(msnap_env_t var);
/* MEMSNAP_PROFILE: npu or cuda; unset or empty gives dflt (the runtime's
 * own profile, chosen by alloc/create.c); anything else warns once and
 * gives dflt. */
int msnap__env_profile(msnap_profile_t *out, msnap_profile_t dflt);
/* MEMSNAP_RUNTIME ("sim" when unset or empty). */
const char *msnap__env_runtime(void);
/* Typed reads of a variable of the table: a size (K/M/G/T suffixes), a
 * count in [lo, hi], a size in [lo, hi] bytes.  A bad value warns once per
 * variable and gives dflt. */
uint64_t msnap__env_size(msnap_env_t var, uint64_t dflt);
uint64_t msnap__env_count(msnap_env_t var, uint64_t dflt, uint64_t lo,
                          uint64_t hi);
uint64_t msnap__env_size_range(msnap_env_t var, uint64_t dflt, uint64_t lo,
                               uint64_t hi);
/* A size: decimal digits with an optional fraction, optional spaces, an
 * optional K/M/G/T/P suffix (binary) then an optional B or iB, or a bare
 * B ("1.5G", "80GB", "512 M"); the fraction counts exactly, truncated to
 * bytes.  False for malformed text; UINT64_MAX on overflow.  The one size
 * parser of memsnap (environment, CLI options); Python's
 * memsnap.predict.parse_size accepts the same forms. */
bool msnap__parse_size(const char *s, uint64_t *out);
/* The parsers behind them, on a value already read (`name` is only used
 * in the warning and as the warn-once key; it must outlive the process). */
uint64_t msnap__env_parse_size(const char *name, const char *value,
                               uint64_t dflt);
uint64_t msnap__env_parse_count(const char *name, const char *value,
                                uint64_t dflt, uint64_t lo, uint64_t hi);
uint64_t msnap__env_parse_size_range(const char *name, const char *value,
                                     uint64_t dflt, uint64_t lo, uint64_t hi);
/* MEMSNAP_SIM_DEVICES accepts 1..MSNAP_SIM_MAX_DEVICES; MEMSNAP_SIM_MEMORY
 * (and msnap_sim_create's size) MSNAP_SIM_MIN_MEMORY..MSNAP_SIM_MAX_MEMORY
 * (2 MiB, the sim's granule, to 256 TiB). */
#define MSNAP_SIM_MAX_DEVICES 64
#define MSNAP_SIM_MIN_MEMORY ((uint64_t)2 << 20)
#define MSNAP_SIM_MAX_MEMORY ((uint64_t)1 << 48)
/* PYTORCH_NO_{NPU,CUDA}_MEMORY_CACHING of the profile: exactly "1". */
bool msnap__env_no_caching(msnap_profile_t profile);
/* A 0/1 switch (MEMSNAP_SIM_HOST_BACKED); bad values warn once. */
bool msnap__env_bool(msnap_env_t var, bool dflt);
/* Fork safety: the warned-once lock (alloc/fork.c). */
void msnap__env_atfork(int phase);
/* Fork safety: the calibration lock (clock.c). */
void msnap__clock_atfork(int phase);
/* OOM_SNAPSHOT_ENABLE as torch_npu parses it (strtol; unset, "" or "0":
 * 0; non-numeric: 0 with a warning; "2": 2 (state); other numbers: 1). */
int msnap__env_oom_snapshot_mode(void);
/* RANK / WORLD_SIZE / LOCAL_RANK (set by torchrun and most launchers): a
 * whole number in [0, 2^31 - 1] (WORLD_SIZE: >= 1); -1 when unset; a bad
 * value warns once and gives -1. */
int64_t msnap__env_rank(msnap_env_t var);
/* A word from `choices` (NULL-terminated, case-insensitive): its index;
 * unset or "" gives dflt; another value warns once and gives dflt
 * (MEMSNAP_USAGE_REPORT, MEMSNAP_WORKSPACE_VIEW). */
int msnap__env_choice(msnap_env_t var, const char *const *choices, int dflt);

/* ---- clock.c: time stamps ----------------------------------------------- */
/* Raw cycle counter (rdtsc / cntvct_el0 / clock_gettime fallback). */
uint64_t msnap__clock_raw(void);
/* Convert a raw reading to microseconds since the Unix epoch (calibrated
 * against CLOCK_REALTIME; monotone). */
int64_t msnap__clock_to_us(uint64_t raw);
/* The conversion as of now, for converting many readings (a snapshot's
 * trace) without the clock lock per reading: msnap__clock_map takes it
 * once, msnap__clock_map_us converts exactly as msnap__clock_to_us. */
typedef struct msnap_clock_map_s {
  uint64_t raw1;   /* the anchor: a raw reading ...  */
  int64_t real1_ns; /* ... and its CLOCK_REALTIME    */
  double scale;    /* ns per tick                    */
} msnap_clock_map_t;
void msnap__clock_map(msnap_clock_map_t *m);
static inline int64_t msnap__clock_map_us(const msnap_clock_map_t *m,
                                          uint64_t raw) {
  double delta = raw >= m->raw1 ? (double)(raw - m->raw1) * m->scale
                                : -(double)(m->raw1 - raw) * m->scale;
  int64_t ns = m->real1_ns + (int64_t)delta;
  /* floor division, as the binding's ns / 1000 for positive times */
  return ns >= 0 ? ns / 1000 : -((-ns + 999) / 1000);
}
int64_t msnap__clock_now_us(void);
/* First use: pick the counter, take the first anchor (idempotent). */
void msnap__clock_init(void);
/* Refresh the conversion anchor against CLOCK_REALTIME (snapshot time). */
void msnap__clock_calibrate(void);
/* "tsc", "cntvct" or "clock_gettime". */
const char *msnap__clock_source(void);
int msnap__clock_check(char *msg, size_t len);

/* ---- util.c: small helpers ---------------------------------------------- */
/* The array-growth helper of the library: make room for `need` elements
 * of `size` bytes in *p, whose capacity is the unsigned integer at `cap`
 * (cap_size 4 or 8 bytes).  The capacity grows by half plus 16 (16 at
 * first) up to what its type holds.  0 or MSNAP_ENOMEM (then *p and *cap
 * are unchanged).  MSNAP_GROW(arr, cap, need) is the usual call. */
int msnap__grow_to(void **p, void *cap, size_t cap_size, uint64_t need,
                   size_t size);
#define MSNAP_GROW(arr, cap, need)                                          \
  msnap__grow_to((void **)&(arr), &(cap), sizeof(cap), (uint64_t)(need),   \
                 sizeof *(arr))
/* The same for a uint32_t capacity with n used and `extra` more wanted. */
int msnap__grow(void **p, uint32_t *cap, uint32_t n, uint32_t extra,
                size_t size);
/* murmur3's 64-bit finalizer: every input bit reaches every output bit
 * (hash tables keyed by addresses, msnap__random_u64's fallback). */
static inline uint64_t msnap__mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
/* 64 bits no other user can guess: the kernel's random bytes (getrandom,
 * never blocking), else the clock, a per-process counter and an address
 * mixed.  For names other users could take in advance in a shared
 * directory (temporaries, the OOM dump's suffixes) and hash seeds. */
uint64_t msnap__random_u64(void);
/* Scratch memory that is written in full at once (snapshot copies of a
 * trace ring, model arrays of a dump): large sizes are mapped and
 * prefaulted in one system call (MAP_POPULATE) instead of one page fault
 * per 4 KiB page as they are first written; small sizes, sanitizer builds
 * and systems without MAP_POPULATE use malloc.  Contents are zero only
 * when mapped: callers write every byte.  NULL on ENOMEM (or bytes 0);
 * free with msnap__prefaulted_free and the same size. */
void *msnap__prefaulted_alloc(size_t bytes);
void msnap__prefaulted_free(void *p, size_t bytes);
/* Prefault [p, p + bytes) of memory about to be written in full (best
 * effort: MADV_POPULATE_WRITE, Linux 5.14; a no-op elsewhere). */
void msnap__prefault(void *p, size_t bytes);
/* An array written front to back (a reader's growing model arrays): once
 * its first `used` bytes pass *ahead (0 at first), the next
 * MSNAP_PREFAULT_AHEAD bytes (at most up to cap) are prefaulted and
 * *ahead moves past them.  Saves the page fault per 4 KiB that writing
 * them would take, at the cost of at most MSNAP_PREFAULT_AHEAD resident
 * bytes not written yet.  Best effort: where a growth copied the array
 * elsewhere, its pages past the copy fault as usual. */
#define MSNAP_PREFAULT_AHEAD ((size_t)2 << 20)
static inline void msnap__prefault_ahead(void *base, size_t used, size_t cap,
                                         size_t *ahead) {
  if (msnap_likely(used <= *ahead)) return;
  size_t from = used;
  size_t to = cap - from > MSNAP_PREFAULT_AHEAD ? from + MSNAP_PREFAULT_AHEAD
                                                : cap;
  if (to > from) msnap__prefault((char *)base + from, to - from);
  *ahead = to;
}
/* A growable text buffer (stats text, CSV reports): printf appends; the
 * first failure is sticky in err (MSNAP_ENOMEM, MSNAP_EINVAL for a bad
 * format) and later appends do nothing.  A zeroed one is empty; free p. */
typedef struct msnap_strbuf_s {
  char *p;
  size_t len, cap;
  int err;
} msnap_strbuf_t;
void msnap__strbuf_printf(msnap_strbuf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void msnap__strbuf_append(msnap_strbuf_t *b, const char *s, size_t n);
/* "%.2f KiB" etc. (PyTorch's format_size, allocator-algorithm §8.3). */
void msnap__format_size(uint64_t size, char *buf, size_t len);

/* ---- utf8.c: the one UTF-8 policy --------------------------------------- */
/* Length of the valid UTF-8 sequence at p (p[0..n), n >= 1): 1 for ASCII;
 * 0 when it is not valid, *bad then the length of its maximal ill-formed
 * subpart, replaced by one U+FFFD (3 for an encoded surrogate). */
size_t msnap__utf8_seq(const unsigned char *p, size_t n, size_t *bad);
/* Length of the valid UTF-8 prefix of p[0..len). */
size_t msnap__utf8_valid_prefix(const unsigned char *p, size_t len);
/* p[0..len) repaired into out (room for 3 * len bytes): each maximal
 * ill-formed subpart one U+FFFD (CPython's errors="replace", a lone
 * surrogate one U+FFFD).  Returns the bytes written. */
size_t msnap__utf8_repair(const unsigned char *p, size_t len, char *out);
/* The length of p[0..len) cut to at most max bytes without splitting a
 * sequence (len itself when len <= max). */
size_t msnap__utf8_cut(const unsigned char *p, size_t len, size_t max);

/* ---- lockrank.c: lock ranks (checked when MSNAP_DEBUG >= 1) -------------- */
/*
 * Every mutex of the library has a rank; a thread may only take a lock
 * whose (rank, sub) is greater than that of every lock it holds (sub
 * orders the device locks by device index), and some pairs may never be
 * held together at all.  Outermost first:
 */
typedef enum msnap_rank_e {
  MSNAP_RANK_OOM_DUMP = 1,  /* api/oom_dump.c: automatic OOM dumps       */
  MSNAP_RANK_DEVICE,        /* alloc: one per device (sub = device)      */
  MSNAP_RANK_HOST_CREATE,   /* alloc/host.c: lazy creation of its state  */
  MSNAP_RANK_HOST,          /* alloc/host.c: never with a device lock    */
  MSNAP_RANK_WORKSPACE,     /* alloc/workspace.c                         */
  MSNAP_RANK_RAW,           /* alloc/raw.c: caching-disabled table       */
  MSNAP_RANK_OBSERVERS,     /* alloc/oom.c: the OOM observer list        */
  MSNAP_RANK_ANNOTATIONS,   /* record/history.c: the annotation ring     */
  MSNAP_RANK_RUNTIME,       /* runtime/sim.c: the sim context            */
  MSNAP_RANK_STACK_TABLE,   /* record/stack.c: intern table              */
  MSNAP_RANK_UNWIND,        /* record/stack.c: unwinder choice           */
  MSNAP_RANK_UNWIND_CACHE,  /* record/unwind.c: CFI rule cache writers   */
  MSNAP_RANK_SYMBOLS,       /* record/stack.c: symbol cache              */
  MSNAP_RANK_CLOCK,         /* base/clock.c: calibration anchors         */
  MSNAP_RANK_ENV,           /* base/env.c: warned-once table             */
  MSNAP_RANK_COUNT
} msnap_rank_t;
/* Record that this thread takes / dropped lock (rank, sub).  A violation
 * calls the hook (tests) or prints both locks and aborts. */
void msnap__rank_acquire(msnap_rank_t rank, uint32_t sub);
void msnap__rank_release(msnap_rank_t rank, uint32_t sub);
/* True when this thread holds lock (rank, sub) (sub UINT32_MAX: any). */
bool msnap__rank_held(msnap_rank_t rank, uint32_t sub);
const char *msnap__rank_name(msnap_rank_t rank);
/* Test hook: called with the violation's text instead of aborting (NULL
 * restores the abort). */
void msnap__rank_set_hook(void (*hook)(const char *msg));

/* A pthread mutex taken with its rank checked (MSNAP_DEBUG >= 1). */
static inline void msnap__mutex_lock(pthread_mutex_t *m, msnap_rank_t rank) {
  if (msnap_debug_level >= 1) msnap__rank_acquire(rank, 0);
  pthread_mutex_lock(m);
}
static inline void msnap__mutex_unlock(pthread_mutex_t *m,
                                       msnap_rank_t rank) {
  pthread_mutex_unlock(m);
  if (msnap_debug_level >= 1) msnap__rank_release(rank, 0);
}

/* ---- fork safety (the handlers live in alloc/fork.c) --------------------- */
/* Phases of a fork.  PREPARE takes a module's locks, PARENT and CHILD
 * release them: the child's only thread is the one that forked and still
 * owns them.  Each module exposes one hook for its locks; alloc/fork.c
 * calls them in lock-rank order.  Raw pthread calls: the rank checker
 * would (rightly) object to one thread holding every lock at once, which
 * only the fork handlers ever do. */
enum { MSNAP_FORK_PREPARE = 0, MSNAP_FORK_PARENT = 1, MSNAP_FORK_CHILD = 2 };
static inline void msnap__fork_mutex(pthread_mutex_t *m, int phase) {
  if (phase == MSNAP_FORK_PREPARE)
    pthread_mutex_lock(m);
  else
    pthread_mutex_unlock(m);
}

#endif /* MSNAP_BASE_H */
