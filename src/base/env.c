/*
 * env.c -- the one table of environment variables memsnap reads, and
 * their parsers.  msnap__env_get is the only getenv call of src/; every
 * other file asks for a variable of the table by its msnap_env_t.
 *
 * MEMSNAP_PROFILE      "npu" or "cuda" (default: the caller's -- the live
 *                      runtime's profile, cuda on the sim).
 * MEMSNAP_RUNTIME      runtime name ("sim" default; checked by the caller).
 * MEMSNAP_SIM_DEVICES  a device count, a plain decimal number in [1, 64]
 *                      (msnap__env_count).
 * MEMSNAP_SIM_MEMORY (2M to 256T, the sim's range: "0" or "1M" warns) and
 * any other size option
 * (MEMSNAP_INPUT_LIMIT: the most bytes the snapshot reader takes from a
 *                      pipe, a FIFO or a decompressor; default 8G):
 *                      a decimal number, a fraction allowed, with an
 *                      optional binary suffix K, M, G, T or P (optionally
 *                      followed by "B" or "iB", any case) or a bare "B":
 *                      "64G" = 64 GiB, "1.5G" (msnap__parse_size, the
 *                      forms of memsnap.predict's --memory).  Values that
 *                      overflow 64 bits are clamped to UINT64_MAX.
 * MEMSNAP_SIM_HOST_BACKED  "1": the sim runtime's device memory is real
 *                      host memory (runtime_sim.c); "0" or unset: address
 *                      ranges only (msnap__env_bool).
 * PYTORCH_NO_NPU_MEMORY_CACHING / PYTORCH_NO_CUDA_MEMORY_CACHING
 *                      only exactly "1" is true and "0" false (PyTorch's
 *                      check_env); anything else warns and counts as unset.
 * OOM_SNAPSHOT_ENABLE  torch_npu's rule (strtol): unset, "" or "0" off;
 *                      non-numeric off with a warning; "2" history "state";
 *                      any other number full history (api/oom_dump.c).
 * RANK, WORLD_SIZE, LOCAL_RANK  the process's place in a distributed job
 *                      (torchrun sets all three): whole numbers, recorded
 *                      in snapshots' process_info and in OOM dump names
 *                      (api/process.c).
 * The others (library paths, unwinder, clock, alloc-conf strings, the OOM
 * dump directory, the sim's SoC name and CANN version, the workspace view
 * and usage-report choices) are read as text by the file named in the
 * table.
 *
 * A bad value never fails: it prints one warning on stderr (once per
 * variable per process) and the default is used.  The environment is read
 * on every call; callers cache what they need.
 *
 * Invariants: the warned-once table only grows; it is guarded by a mutex.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"

#define MSNAP_ENV_WARN_SLOTS 32

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *warned[MSNAP_ENV_WARN_SLOTS];
static int nwarned;

/* The table: every variable memsnap reads, and who reads it. */
static const struct {
  const char *name, *used_by;
} env_table[MSNAP_ENV_COUNT] = {
    [MSNAP_ENV_PROFILE] = {"MEMSNAP_PROFILE", "alloc/create.c: profile"},
    [MSNAP_ENV_RUNTIME] = {"MEMSNAP_RUNTIME", "alloc/create.c: runtime"},
    [MSNAP_ENV_SIM_DEVICES] = {"MEMSNAP_SIM_DEVICES",
                               "runtime/sim.c: device count"},
    [MSNAP_ENV_SIM_HOST_BACKED] = {"MEMSNAP_SIM_HOST_BACKED",
                                   "runtime/sim.c: host-backed memory"},
    [MSNAP_ENV_SIM_MEMORY] = {"MEMSNAP_SIM_MEMORY",
                              "runtime/sim.c: bytes per device"},
    [MSNAP_ENV_ACL_LIBRARY] = {"MEMSNAP_ACL_LIBRARY",
                               "runtime/acl.c: libascendcl.so path"},
    [MSNAP_ENV_CUDA_LIBRARY] = {"MEMSNAP_CUDA_LIBRARY",
                                "runtime/cuda.c: libcudart.so path"},
    [MSNAP_ENV_CUDA_DRIVER_LIBRARY] = {"MEMSNAP_CUDA_DRIVER_LIBRARY",
                                       "runtime/cuda.c: libcuda.so path"},
    [MSNAP_ENV_UNWIND] = {"MEMSNAP_UNWIND",
                          "record/stack.c: auto, cfi, libunwind, backtrace "
                          "or fp"},
    [MSNAP_ENV_NO_LIBDW] = {"MEMSNAP_NO_LIBDW",
                            "record/stack.c: symbolize with dladdr only"},
    [MSNAP_ENV_CLOCK_FALLBACK] = {"MEMSNAP_CLOCK_FALLBACK",
                                  "base/clock.c: clock_gettime counter"},
    [MSNAP_ENV_PYTORCH_CUDA_ALLOC_CONF] = {"PYTORCH_CUDA_ALLOC_CONF",
                                           "alloc/conf.c: cuda alloc conf"},
    [MSNAP_ENV_PYTORCH_NPU_ALLOC_CONF] = {"PYTORCH_NPU_ALLOC_CONF",
                                          "alloc/conf.c: npu alloc conf"},
    [MSNAP_ENV_PYTORCH_ALLOC_CONF] = {"PYTORCH_ALLOC_CONF",
                                      "alloc/conf.c: either profile"},
    [MSNAP_ENV_NO_CUDA_MEMORY_CACHING] = {"PYTORCH_NO_CUDA_MEMORY_CACHING",
                                          "alloc/create.c: caching off"},
    [MSNAP_ENV_NO_NPU_MEMORY_CACHING] = {"PYTORCH_NO_NPU_MEMORY_CACHING",
                                         "alloc/create.c: caching off"},
    [MSNAP_ENV_OOM_SNAPSHOT_ENABLE] = {"OOM_SNAPSHOT_ENABLE",
                                       "api/oom_dump.c: automatic dump"},
    [MSNAP_ENV_OOM_SNAPSHOT_PATH] = {"OOM_SNAPSHOT_PATH",
                                     "api/oom_dump.c: dump directory"},
    [MSNAP_ENV_RANK] = {"RANK", "api/process.c: global rank"},
    [MSNAP_ENV_WORLD_SIZE] = {"WORLD_SIZE", "api/process.c: world size"},
    [MSNAP_ENV_LOCAL_RANK] = {"LOCAL_RANK", "api/process.c: local rank"},
    [MSNAP_ENV_SIM_SOC_NAME] = {"MEMSNAP_SIM_SOC_NAME",
                                "runtime/sim.c: SoC name the sim reports"},
    [MSNAP_ENV_SIM_CANN_VERSION] = {"MEMSNAP_SIM_CANN_VERSION",
                                    "runtime/sim.c: CANN version the sim "
                                    "reports"},
    [MSNAP_ENV_WORKSPACE_VIEW] = {"MEMSNAP_WORKSPACE_VIEW",
                                  "api/snapshot.c: workspace in snapshots"},
    [MSNAP_ENV_USAGE_REPORT] = {"MEMSNAP_USAGE_REPORT",
                                "api/usage.c: usage CSV on dumps"},
    [MSNAP_ENV_NVML_LIBRARY] = {"MEMSNAP_NVML_LIBRARY",
                                "runtime/cuda.c: libnvidia-ml.so path"},
    [MSNAP_ENV_INPUT_LIMIT] = {"MEMSNAP_INPUT_LIMIT",
                               "model/snapshot_read.c: most bytes read "
                               "from a stream or decompressed (a size)"},
    [MSNAP_ENV_ZLIB_LIBRARY] = {"MEMSNAP_ZLIB_LIBRARY",
                                "base/source.c: zlib for gzip input"},
    [MSNAP_ENV_ZSTD_LIBRARY] = {"MEMSNAP_ZSTD_LIBRARY",
                                "base/source.c: libzstd for zstd input"},
};

const char *msnap__env_name(msnap_env_t var) {
  return (unsigned)var < MSNAP_ENV_COUNT ? env_table[var].name : "?";
}

const char *msnap__env_get(msnap_env_t var) {
  if ((unsigned)var >= MSNAP_ENV_COUNT) return NULL;
  return getenv(env_table[var].name);
}

/*
 * True the first time it is called for variable `name` (a string literal or
 * other storage that outlives the process), false afterwards.  When the
 * table is full every call returns true (warnings repeat rather than get
 * lost).
 */
static bool first_warning(const char *name) {
  bool first = true;
  msnap__mutex_lock(&warn_lock, MSNAP_RANK_ENV);
  for (int i = 0; i < nwarned; i++) {
    if (strcmp(warned[i], name) == 0) {
      first = false;
      break;
    }
  }
  if (first && nwarned < MSNAP_ENV_WARN_SLOTS) warned[nwarned++] = name;
  msnap__mutex_unlock(&warn_lock, MSNAP_RANK_ENV);
  return first;
}

int msnap__env_profile(msnap_profile_t *out, msnap_profile_t dflt) {
  const char *v = msnap__env_get(MSNAP_ENV_PROFILE);
  if (v == NULL || *v == '\0') {
    *out = dflt;
  } else if (strcasecmp(v, "npu") == 0) {
    *out = MSNAP_PROFILE_NPU;
  } else if (strcasecmp(v, "cuda") == 0) {
    *out = MSNAP_PROFILE_CUDA;
  } else {
    if (first_warning("MEMSNAP_PROFILE"))
      fprintf(stderr,
              "memsnap: warning: ignoring invalid MEMSNAP_PROFILE '%s' "
              "(valid values are npu and cuda); using %s\n",
              v, dflt == MSNAP_PROFILE_CUDA ? "cuda" : "npu");
    *out = dflt;
  }
  return 0;
}

const char *msnap__env_runtime(void) {
  const char *v = msnap__env_get(MSNAP_ENV_RUNTIME);
  return (v == NULL || *v == '\0') ? "sim" : v;
}

/*
 * floor(0.<d[0..n-1]> * 2^shift), exactly: the decimal fraction doubled
 * `shift` times, each carry out of its first digit one bit of the result.
 * Digits past the 64th cannot change it (2^-shift, shift <= 50, has at
 * most 50 decimals, so a fraction at or above a multiple of it stays so
 * when cut after 64 digits).
 */
static uint64_t frac_bits(const char *d, size_t n, unsigned shift) {
  unsigned char dig[64];
  if (n > sizeof dig) n = sizeof dig;
  for (size_t i = 0; i < n; i++) dig[i] = (unsigned char)(d[i] - '0');
  uint64_t f = 0;
  for (unsigned b = 0; b < shift; b++) {
    unsigned carry = 0;
    for (size_t j = n; j > 0; j--) {
      unsigned t = dig[j - 1] * 2u + carry;
      dig[j - 1] = (unsigned char)(t % 10u);
      carry = t / 10u;
    }
    f = f << 1 | carry;
  }
  return f;
}

/*
 * Parse a size: decimal digits with an optional fraction ("1.5"), then
 * optional spaces and an optional binary unit K, M, G, T or P (any case)
 * followed by an optional "B" or "iB", or a bare "B": "64G", "80GB",
 * "1.5TiB", "512 M", "1024B".  The fraction counts exactly, truncated to
 * whole bytes ("0.1K" = 102).  The same forms as Python's
 * memsnap.predict.parse_size (tests/runtime/size_forms.txt is the table
 * both are tested with).  Returns false for malformed text; clamps to
 * UINT64_MAX on overflow.
 */
bool msnap__parse_size(const char *s, uint64_t *out) {
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s)) return false;
  uint64_t v = 0;
  bool overflow = false;
  while (isdigit((unsigned char)*s)) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) overflow = true;
    else v = v * 10 + d;
    s++;
  }
  const char *frac = NULL;
  size_t nfrac = 0;
  if (*s == '.') {
    s++;
    if (!isdigit((unsigned char)*s)) return false;
    frac = s;
    while (isdigit((unsigned char)*s)) s++;
    nfrac = (size_t)(s - frac);
  }
  while (isspace((unsigned char)*s)) s++;
  unsigned shift = 0;
  switch (toupper((unsigned char)*s)) {
  case 'K': shift = 10; break;
  case 'M': shift = 20; break;
  case 'G': shift = 30; break;
  case 'T': shift = 40; break;
  case 'P': shift = 50; break;
  default: break;
  }
  if (shift != 0) {
    s++;
    if (toupper((unsigned char)s[0]) == 'I' &&
        toupper((unsigned char)s[1]) == 'B')
      s += 2;
    else if (toupper((unsigned char)s[0]) == 'B')
      s++;
  } else if (toupper((unsigned char)*s) == 'B') {
    s++;
  }
  while (isspace((unsigned char)*s)) s++;
  if (*s != '\0') return false;
  if (shift != 0 && v > (UINT64_MAX >> shift)) overflow = true;
  uint64_t r = overflow ? UINT64_MAX : (v << shift);
  if (!overflow && frac != NULL && shift != 0) {
    uint64_t f = frac_bits(frac, nfrac, shift);
    r = r > UINT64_MAX - f ? UINT64_MAX : r + f;
  }
  *out = r;
  return true;
}

/* v as a whole number of the largest binary unit dividing it ("2M",
 * "256T"), else bytes. */
static const char *size_text(uint64_t v, char *buf, size_t len) {
  static const char units[] = "PTGMK";
  for (int k = 0; k < 5; k++) {
    unsigned shift = 10u * (unsigned)(5 - k);
    if (v && v % ((uint64_t)1 << shift) == 0) {
      snprintf(buf, len, "%llu%c", (unsigned long long)(v >> shift),
               units[k]);
      return buf;
    }
  }
  snprintf(buf, len, "%llu byte%s", (unsigned long long)v, v == 1 ? "" : "s");
  return buf;
}

uint64_t msnap__env_parse_size(const char *name, const char *v,
                               uint64_t dflt) {
  if (v == NULL || *v == '\0') return dflt;
  uint64_t r;
  if (msnap__parse_size(v, &r)) return r;
  if (first_warning(name)) {
    char d[32];
    fprintf(stderr,
            "memsnap: warning: ignoring invalid size '%s' in %s (expected a "
            "number with an optional K, M, G, T or P suffix, e.g. 64G or "
            "1.5G); using %s\n",
            v, name, size_text(dflt, d, sizeof d));
  }
  return dflt;
}

/*
 * A count (MEMSNAP_SIM_DEVICES): a plain decimal number in [lo, hi], no
 * suffix.  Anything else ("-1", "0", "65", "1K") warns once, naming the
 * variable, the value and the accepted range, and returns dflt.
 */
uint64_t msnap__env_parse_count(const char *name, const char *v,
                                uint64_t dflt, uint64_t lo, uint64_t hi) {
  if (v == NULL || *v == '\0') return dflt;
  const char *s = v;
  while (isspace((unsigned char)*s)) s++;
  bool ok = isdigit((unsigned char)*s);
  uint64_t n = 0;
  for (; ok && isdigit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (n > (UINT64_MAX - d) / 10) ok = false;
    else n = n * 10 + d;
  }
  while (ok && isspace((unsigned char)*s)) s++;
  if (ok && *s == '\0' && n >= lo && n <= hi) return n;
  if (first_warning(name))
    fprintf(stderr,
            "memsnap: warning: ignoring invalid %s '%s' (expected a whole "
            "number from %llu to %llu); using %llu\n",
            name, v, (unsigned long long)lo, (unsigned long long)hi,
            (unsigned long long)dflt);
  return dflt;
}

/*
 * A size (see msnap__parse_size) in [lo, hi] bytes.  A malformed value or
 * one out of range ("0") warns once, naming the variable and the range,
 * and returns dflt: never a silently clamped value.
 */
uint64_t msnap__env_parse_size_range(const char *name, const char *v,
                                     uint64_t dflt, uint64_t lo, uint64_t hi) {
  if (v == NULL || *v == '\0') return dflt;
  uint64_t r;
  bool parsed = msnap__parse_size(v, &r);
  if (parsed && r >= lo && r <= hi) return r;
  /* malformed or out of range: one warning of one form, naming the range
   * and the default as sizes ("using 8G") */
  if (first_warning(name)) {
    char a[32], b[32], d[32], range[80];
    if (hi == UINT64_MAX)
      snprintf(range, sizeof range, "at least %s", size_text(lo, a, sizeof a));
    else
      snprintf(range, sizeof range, "from %s to %s", size_text(lo, a, sizeof a),
               size_text(hi, b, sizeof b));
    fprintf(stderr,
            "memsnap: warning: ignoring %s '%s': it must be %s (a number with "
            "an optional K, M, G, T or P suffix); using %s\n",
            name, v, range, size_text(dflt, d, sizeof d));
  }
  return dflt;
}

uint64_t msnap__env_size(msnap_env_t var, uint64_t dflt) {
  return msnap__env_parse_size(msnap__env_name(var), msnap__env_get(var),
                               dflt);
}

uint64_t msnap__env_count(msnap_env_t var, uint64_t dflt, uint64_t lo,
                          uint64_t hi) {
  return msnap__env_parse_count(msnap__env_name(var), msnap__env_get(var),
                                dflt, lo, hi);
}

uint64_t msnap__env_size_range(msnap_env_t var, uint64_t dflt, uint64_t lo,
                               uint64_t hi) {
  return msnap__env_parse_size_range(msnap__env_name(var), msnap__env_get(var),
                                     dflt, lo, hi);
}

/*
 * A switch: exactly "1" is true and "0" false; unset or empty gives dflt;
 * anything else warns once, naming the variable, and gives dflt.
 */
bool msnap__env_bool(msnap_env_t var, bool dflt) {
  const char *v = msnap__env_get(var);
  const char *name = msnap__env_name(var);
  if (v == NULL || *v == '\0') return dflt;
  if (strcmp(v, "1") == 0) return true;
  if (strcmp(v, "0") == 0) return false;
  if (first_warning(name))
    fprintf(stderr,
            "memsnap: warning: ignoring invalid %s '%s' (expected 0 or 1); "
            "using %d\n",
            name, v, dflt ? 1 : 0);
  return dflt;
}

bool msnap__env_no_caching(msnap_profile_t profile) {
  msnap_env_t var = profile == MSNAP_PROFILE_CUDA
                        ? MSNAP_ENV_NO_CUDA_MEMORY_CACHING
                        : MSNAP_ENV_NO_NPU_MEMORY_CACHING;
  const char *name = msnap__env_name(var);
  const char *v = msnap__env_get(var);
  if (v == NULL) return false;
  if (strcmp(v, "1") == 0) return true;
  if (strcmp(v, "0") == 0) return false;
  /* PyTorch's text, including its missing space before "valid". */
  if (first_warning(name))
    fprintf(stderr,
            "Ignoring invalid value for boolean flag %s: %svalid values are "
            "0 or 1.\n",
            name, v);
  return false;
}

/* OOM_SNAPSHOT_ENABLE, parsed here only (torch_npu: strtol, non-numeric =
 * 0).  The warning repeats for each allocator created with a bad value,
 * as the variable is read once per allocator. */
int msnap__env_oom_snapshot_mode(void) {
  const char *s = msnap__env_get(MSNAP_ENV_OOM_SNAPSHOT_ENABLE);
  if (s == NULL || *s == '\0') return 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s) {
    fprintf(stderr,
            "memsnap: OOM_SNAPSHOT_ENABLE='%s' is not a number; OOM "
            "snapshots stay off\n", s);
    return 0;
  }
  return v == 0 ? 0 : (v == 2 ? 2 : 1);
}

int64_t msnap__env_rank(msnap_env_t var) {
  const char *v = msnap__env_get(var);
  if (v == NULL || *v == '\0') return -1;
  int64_t lo = var == MSNAP_ENV_WORLD_SIZE ? 1 : 0, n = 0;
  const char *s = v;
  bool ok = isdigit((unsigned char)*s);
  for (; ok && isdigit((unsigned char)*s); s++) {
    n = n * 10 + (*s - '0');
    if (n > INT32_MAX) ok = false;
  }
  if (ok && *s == '\0' && n >= lo) return n;
  const char *name = msnap__env_name(var);
  if (first_warning(name))
    fprintf(stderr,
            "memsnap: warning: ignoring invalid %s '%s' (expected a whole "
            "number from %lld); snapshots will not record it\n",
            name, v, (long long)lo);
  return -1;
}

void msnap__env_atfork(int phase) { msnap__fork_mutex(&warn_lock, phase); }

/* One of a fixed set of words (case-insensitive): its index; unset or ""
 * gives dflt; anything else warns once (naming the accepted words) and
 * gives dflt.  `choices` ends with NULL. */
int msnap__env_choice(msnap_env_t var, const char *const *choices, int dflt) {
  const char *v = msnap__env_get(var);
  if (v == NULL || *v == '\0') return dflt;
  int n = 0;
  for (; choices[n] != NULL; n++)
    if (strcasecmp(v, choices[n]) == 0) return n;
  const char *name = msnap__env_name(var);
  if (first_warning(name)) {
    fprintf(stderr, "memsnap: warning: %s='%s' is not one of", name, v);
    for (int i = 0; i < n; i++)
      fprintf(stderr, "%s %s", i ? "," : "", choices[i]);
    fprintf(stderr, "; using %s\n", choices[dflt]);
  }
  return dflt;
}
