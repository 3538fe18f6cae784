/*
 * conf.c -- the allocator configuration (PYTORCH_{CUDA,NPU}_ALLOC_CONF).
 *
 * Parsing follows allocator-algorithm.md §17 (cuda profile) and §20.2 with
 * torch-npu-today.md §6.2 (npu profile):
 *   - Tokenizer: ',' ':' '[' ']' are one-character tokens, whitespace is
 *     dropped (so "a b" is the token "ab"), other runs are tokens.
 *   - Each key is followed by a separator token and its value (or a
 *     bracketed list).  As in PyTorch the separator characters are not
 *     checked, only token positions matter ("max_split_size_mb,100" is
 *     accepted as 100).
 *   - Every parse first resets max_split_size (SIZE_MAX), the 16
 *     roundup_power2_divisions (0) and garbage_collection_threshold (0),
 *     parses large_segment_size_mb in a first pass, sets
 *     max_non_split_rounding_size = large_segment_size, then parses the
 *     other keys in order.  large_segment_size, expandable_segments,
 *     pinned_use_background_threads and every profile-specific key keep
 *     their previous values when absent.  So a later
 *     "expandable_segments:True" drops an earlier max_split_size_mb.
 *   - Deliberate difference: numbers must be whole tokens ("100abc" and
 *     "-1" are errors here, std::stoull would take 100 / wrap).
 *   - On error the conf is left unchanged (the parse works on a copy) and
 *     the message names the offending token and its 1-based position:
 *       alloc conf: unrecognized key 'max_split_sise_mb' at token 1 in
 *       "max_split_sise_mb:100"
 *     It is also stored as this thread's last error (msnap_last_error).
 *
 * Invariants of msnap_conf_t (msnap__conf_check):
 *   - raw is never NULL: the static "" or a heap copy of the last applied
 *     string, owned by the struct and freed by msnap__conf_destroy.
 *   - large_segment_size > 10 MiB; max_split_size is SIZE_MAX or
 *     >= large_segment_size; max_non_split_rounding_size >=
 *     large_segment_size.
 *   - 0 <= garbage_collection_threshold < 1; 0 <= fraction <= 1.
 *   - every division is 0 or a power of two; base_addr_aligned_kb <= 16;
 *     segment_size_mb is 0 or in [20, 512]; pinned_num_register_threads is
 *     a power of two <= 128.
 *   - npu profile: expandable_segments excludes max_split_size and
 *     garbage_collection_threshold.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/conf.h"

#define MiB ((uint64_t)1 << 20)

static char empty_raw[1];

void msnap__conf_init(msnap_conf_t *c, msnap_profile_t profile) {
  memset(c, 0, sizeof *c);
  c->profile = profile;
  c->raw = empty_raw;
  c->max_split_size = SIZE_MAX;
  c->large_segment_size = 20 * MiB;
  c->max_non_split_rounding_size = 20 * MiB;
  c->garbage_collection_threshold = 0.0;
  c->per_process_memory_fraction = 1.0;
  c->pinned_num_register_threads = 1;
  c->base_addr_aligned_kb = 16;
  c->segment_size_mb = 0;
  /* AcceleratorAllocatorConfig: pinned_max_round_threshold_ and
   * pinned_max_cached_size_ default to SIZE_MAX (no limit). */
  c->pinned_max_round_threshold = UINT64_MAX;
  c->pinned_max_cached_size = UINT64_MAX;
}

void msnap__conf_destroy(msnap_conf_t *c) {
  if (c->raw != NULL && c->raw != empty_raw) free(c->raw);
  c->raw = empty_raw;
}

static bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

static unsigned log2_floor(uint64_t x) {
  return 63u - (unsigned)__builtin_clzll(x);
}

uint64_t msnap__roundup_divisions(const msnap_conf_t *c, size_t size) {
  if (size == 0) return c->roundup_power2_divisions[0];
  unsigned lg = log2_floor(size);
  unsigned idx = lg > 20 ? lg - 20 : 0;
  if (idx > MSNAP_ROUNDUP_INTERVALS - 1) idx = MSNAP_ROUNDUP_INTERVALS - 1;
  return c->roundup_power2_divisions[idx];
}

/* ---- the parser ------------------------------------------------------------ */

typedef struct parser_s {
  const char *src;
  char *buf;        /* token texts, each NUL-terminated */
  const char **tok; /* ntok pointers into buf */
  size_t ntok;
  msnap_conf_t *c; /* the copy being filled */
  bool npu;
  bool runtime; /* a run-time change (npu: restricted key set) */
  int pass;     /* 0: large_segment_size_mb only; 1: the rest */
  size_t mss_tok, gc_tok, exp_tok; /* 1 + token index of the key, 0 = none */
  char *err;
  size_t errlen;
} parser_t;

/* Split p->src into tokens.  Returns MSNAP_ENOMEM on allocation failure. */
static int tokenize(parser_t *p) {
  size_t n = strlen(p->src);
  p->buf = malloc(2 * n + 1);
  p->tok = malloc((n + 1) * sizeof *p->tok);
  if (p->buf == NULL || p->tok == NULL) return MSNAP_ENOMEM;
  char *w = p->buf;
  bool in_run = false;
  for (const char *s = p->src; *s; s++) {
    if (isspace((unsigned char)*s)) continue;
    if (strchr(",:[]", *s) != NULL) {
      if (in_run) *w++ = '\0';
      in_run = false;
      p->tok[p->ntok++] = w;
      *w++ = *s;
      *w++ = '\0';
    } else {
      if (!in_run) p->tok[p->ntok++] = w;
      in_run = true;
      *w++ = *s;
    }
  }
  if (in_run) *w++ = '\0';
  return 0;
}

/*
 * Record an error about token i (0-based) and return MSNAP_ECONF.  The
 * message gets " at token N in \"<source>\"" appended; i == ntok means the
 * end of the string.
 */
static int fail(parser_t *p, size_t i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(parser_t *p, size_t i, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (i >= p->ntok)
    msnap__set_error(MSNAP_ECONF, "alloc conf: %s at end of \"%s\"", what,
                     p->src);
  else
    msnap__set_error(MSNAP_ECONF, "alloc conf: %s at token %zu in \"%s\"",
                     what, i + 1, p->src);
  if (p->err != NULL && p->errlen > 0)
    snprintf(p->err, p->errlen, "%s", msnap_last_error());
  return MSNAP_ECONF;
}

/*
 * Move *i from a key to its value token (skipping the separator, which is
 * not checked).  Error when the string ends first.
 */
static int to_value(parser_t *p, size_t key, size_t *i) {
  *i = key + 2;
  if (*i >= p->ntok)
    return fail(p, p->ntok, "missing value for key '%s' (token %zu)",
                p->tok[key], key + 1);
  return 0;
}

/* Skip a key's value (one token or a bracketed list); *i ends on it. */
static int skip_value(parser_t *p, size_t key, size_t *i) {
  int rc = to_value(p, key, i);
  if (rc) return rc;
  if (strcmp(p->tok[*i], "[") != 0) return 0;
  while (*i < p->ntok && strcmp(p->tok[*i], "]") != 0) (*i)++;
  if (*i >= p->ntok)
    return fail(p, p->ntok, "missing ']' closing the list of '%s' (token %zu)",
                p->tok[key], key + 1);
  return 0;
}

/*
 * A whole-token non-negative decimal integer.  A value above UINT64_MAX
 * is an error naming the token (PyTorch's std::stoull throws
 * out_of_range there).
 */
static int tok_u64(parser_t *p, size_t key, size_t i, uint64_t *out) {
  const char *t = p->tok[i];
  uint64_t v = 0;
  if (!isdigit((unsigned char)*t))
    return fail(p, i, "expected a non-negative integer for '%s'; got '%s'",
                p->tok[key], t);
  for (; *t; t++) {
    if (!isdigit((unsigned char)*t))
      return fail(p, i, "expected a non-negative integer for '%s'; got '%s'",
                  p->tok[key], p->tok[i]);
    unsigned d = (unsigned)(*t - '0');
    if (v > (UINT64_MAX - d) / 10)
      return fail(p, i, "value '%s' for '%s' is out of range (largest "
                  "accepted: %llu)", p->tok[i], p->tok[key],
                  (unsigned long long)UINT64_MAX);
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

static int tok_double(parser_t *p, size_t key, size_t i, double *out) {
  const char *t = p->tok[i];
  char *end;
  errno = 0;
  double v = strtod(t, &end);
  if (end == t || *end != '\0' || errno == ERANGE || !isfinite(v))
    return fail(p, i, "expected a number for '%s'; got '%s'", p->tok[key], t);
  *out = v;
  return 0;
}

static int tok_bool(parser_t *p, size_t key, size_t i, bool *out) {
  const char *t = p->tok[i];
  if (strcmp(t, "True") == 0) *out = true;
  else if (strcmp(t, "False") == 0) *out = false;
  else
    return fail(p, i, "expected 'True' or 'False' for '%s'; got '%s'",
                p->tok[key], t);
  return 0;
}

/* MiB value, clamped as PyTorch: min(v, SIZE_MAX / MiB) * MiB. */
static uint64_t mb_bytes(uint64_t v) {
  uint64_t lim = (uint64_t)SIZE_MAX / MiB;
  return (v < lim ? v : lim) * MiB;
}

typedef int (*key_fn)(parser_t *p, size_t key, size_t *i);

/* ---- generic keys (AcceleratorAllocatorConfig) ------------------------------ */

static int k_large_segment_size_mb(parser_t *p, size_t key, size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  if (v <= 10)
    return fail(p, *i, "CachingAllocator option large_segment_size_mb must be "
                "> 10 MB; got '%s'", p->tok[*i]);
  p->c->large_segment_size = mb_bytes(v);
  p->c->large_segment_size_set = true;
  return 0;
}

/* max_split_size_mb and max_non_split_rounding_mb share the rule. */
static int mb_at_least_segment(parser_t *p, size_t key, size_t *i,
                               const char *name, uint64_t *dst) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  uint64_t min_mb = p->c->large_segment_size / MiB;
  if (v < min_mb)
    return fail(p, *i, "CachingAllocator option %s too small, must be >= "
                "%llu; got '%s'", name, (unsigned long long)min_mb,
                p->tok[*i]);
  *dst = mb_bytes(v);
  return 0;
}

static int k_max_split_size_mb(parser_t *p, size_t key, size_t *i) {
  p->mss_tok = key + 1;
  return mb_at_least_segment(p, key, i, "max_split_size_mb",
                             &p->c->max_split_size);
}

static int k_max_non_split_rounding_mb(parser_t *p, size_t key, size_t *i) {
  return mb_at_least_segment(p, key, i, "max_non_split_rounding_mb",
                             &p->c->max_non_split_rounding_size);
}

static int k_garbage_collection_threshold(parser_t *p, size_t key,
                                          size_t *i) {
  double v = 0.0; /* (set by tok_double when it returns 0) */
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_double(p, key, *i, &v);
  if (rc) return rc;
  if (!(v > 0.0 && v < 1.0))
    return fail(p, *i, "garbage_collect_threshold is invalid, set it in "
                "(0.0, 1.0); got '%s'", p->tok[*i]);
  p->c->garbage_collection_threshold = v;
  p->gc_tok = key + 1;
  return 0;
}

/*
 * roundup_power2_divisions: a scalar power of two for every class, or a
 * list [b:d, ..., >:d] of boundaries b (MiB, powers of two; class
 * log2(b) clamped to 15) and divisions d (0 or powers of two).  The first
 * boundary entry (while no class above 0 was set) also fills the classes
 * below it; '>' fills every class after the last explicit one.
 */
static int k_roundup_power2_divisions(parser_t *p, size_t key, size_t *i) {
  uint64_t *tab = p->c->roundup_power2_divisions;
  int rc = to_value(p, key, i);
  if (rc) return rc;
  if (strcmp(p->tok[*i], "[") != 0) {
    uint64_t v;
    rc = tok_u64(p, key, *i, &v);
    if (rc) return rc;
    if (!is_pow2(v))
      return fail(p, *i, "For roundups, the divisions has to be power of 2; "
                  "got '%s'", p->tok[*i]);
    for (int k = 0; k < MSNAP_ROUNDUP_INTERVALS; k++) tab[k] = v;
    return 0;
  }
  size_t last = 0;
  /* only the first boundary listed fills the classes below it (c10's
   * AllocatorConfig::parseRoundUpPower2Divisions keeps a flag for that:
   * a first boundary of 1 leaves `last` at 0 too) */
  bool first = true;
  while (++*i < p->ntok && strcmp(p->tok[*i], "]") != 0) {
    size_t bound = *i;
    *i += 2; /* separator (unchecked) and the division */
    if (*i >= p->ntok)
      return fail(p, p->ntok, "missing division after '%s' (token %zu) in "
                  "the list of '%s'", p->tok[bound], bound + 1, p->tok[key]);
    uint64_t d;
    rc = tok_u64(p, key, *i, &d);
    if (rc) return rc;
    if (d != 0 && !is_pow2(d))
      return fail(p, *i, "For roundups, the divisions has to be power of 2 "
                  "or 0 to disable roundup; got '%s'", p->tok[*i]);
    if (strcmp(p->tok[bound], ">") == 0) {
      for (size_t k = last + 1; k < MSNAP_ROUNDUP_INTERVALS; k++) tab[k] = d;
    } else {
      uint64_t b;
      rc = tok_u64(p, key, bound, &b);
      if (rc) return rc;
      if (!is_pow2(b))
        return fail(p, bound, "For roundups, the intervals have to be power "
                    "of 2; got '%s'", p->tok[bound]);
      size_t idx = log2_floor(b);
      if (idx > MSNAP_ROUNDUP_INTERVALS - 1) idx = MSNAP_ROUNDUP_INTERVALS - 1;
      if (first)
        for (size_t k = 0; k < idx; k++) tab[k] = d;
      first = false;
      tab[idx] = d;
      last = idx;
    }
    /* Skip the ',' unless the list closes next. */
    if (*i + 1 >= p->ntok)
      return fail(p, p->ntok, "missing ']' closing the list of '%s' (token "
                  "%zu)", p->tok[key], key + 1);
    if (strcmp(p->tok[*i + 1], "]") != 0) ++*i;
  }
  if (*i >= p->ntok)
    return fail(p, p->ntok, "missing ']' closing the list of '%s' (token %zu)",
                p->tok[key], key + 1);
  return 0;
}

#define BOOL_KEY(fn, field, extra)                                            \
  static int fn(parser_t *p, size_t key, size_t *i) {                         \
    int rc = to_value(p, key, i);                                             \
    if (!rc) rc = tok_bool(p, key, *i, &p->c->field);                         \
    if (!rc) { extra; }                                                       \
    return rc;                                                                \
  }

BOOL_KEY(k_expandable_segments, expandable_segments, p->exp_tok = key + 1)
BOOL_KEY(k_pinned_use_background_threads, pinned_use_background_threads, )
BOOL_KEY(k_release_lock, release_lock_on_malloc, )
BOOL_KEY(k_pinned_use_host_register, pinned_use_host_register, )
BOOL_KEY(k_graph_capture_record_stream_reuse,
         graph_capture_record_stream_reuse, )
BOOL_KEY(k_throw_on_malloc_oom, throw_on_malloc_oom, )
BOOL_KEY(k_multi_stream_lazy_reclaim, multi_stream_lazy_reclaim, )

/* A boolean that memsnap accepts and validates but does not use. */
static int k_bool_ignored(parser_t *p, size_t key, size_t *i) {
  bool v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_bool(p, key, *i, &v);
  return rc;
}

static int k_pinned_max_round_threshold_mb(parser_t *p, size_t key,
                                           size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (!rc) p->c->pinned_max_round_threshold = mb_bytes(v);
  return rc;
}

static int k_pinned_max_cached_size_mb(parser_t *p, size_t key, size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (!rc) p->c->pinned_max_cached_size = mb_bytes(v);
  return rc;
}

/* ---- CUDA keys (CUDAAllocatorConfig) ------------------------------------------ */

static int k_backend(parser_t *p, size_t key, size_t *i) {
  int rc = to_value(p, key, i);
  if (rc) return rc;
  if (strcmp(p->tok[*i], "native") == 0) return 0;
  if (strcmp(p->tok[*i], "cudaMallocAsync") == 0)
    return fail(p, *i, "memsnap implements only the native allocator backend; "
                "got '%s'", p->tok[*i]);
  return fail(p, *i, "Unknown allocator backend, options are native and "
              "cudaMallocAsync; got '%s'", p->tok[*i]);
}

static int k_pinned_num_register_threads(parser_t *p, size_t key, size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  if (!is_pow2(v))
    return fail(p, *i, "Number of register threads has to be power of 2, got "
                "'%s'", p->tok[*i]);
  if (v > 128)
    return fail(p, *i, "Number of register threads should be less than or "
                "equal to 128, got '%s'", p->tok[*i]);
  p->c->pinned_num_register_threads = v;
  return 0;
}

static int k_pinned_reserve_segment_size_mb(parser_t *p, size_t key,
                                            size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  /* (torch_npu's NPUAllocatorConfig::parseArgs takes any size_t: 0 is
   * "no reserve segment", the default, in the npu profile) */
  if (v == 0 && !p->npu)
    return fail(p, *i, "Pinned reserve segment size has to be greater than 0; "
                "got '%s'", p->tok[*i]);
  p->c->pinned_reserve_segment_size = mb_bytes(v);
  return 0;
}

static int k_per_process_memory_fraction(parser_t *p, size_t key,
                                         size_t *i) {
  double v = 0.0; /* (set by tok_double when it returns 0) */
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_double(p, key, *i, &v);
  if (rc) return rc;
  if (!(v >= 0.0 && v <= 1.0))
    return fail(p, *i, "per_process_memory_fraction is invalid, set it in "
                "[0.0, 1.0]; got '%s'", p->tok[*i]);
  p->c->per_process_memory_fraction = v;
  return 0;
}

/*
 * expandable_segments_reserve / expandable_segments_reserve_by_class
 * (CUDAAllocatorConfig parseReserveSpec, pytorch#192269): a value is a
 * positive fraction of the device memory ("0.5") or a positive number of
 * GiB with a 'G' suffix ("40G").  As in PyTorch a malformed or
 * non-positive value only warns and is ignored (the previous value stays);
 * in the by-class list a bad entry is skipped and the good ones apply.
 * The list replaces the previous class table; memsnap keeps the first
 * MSNAP_RESERVE_CLASSES classes (a warning names the others).
 */
static bool reserve_spec(const char *t, msnap_reserve_spec_t *out) {
  char *end;
  errno = 0;
  double v = strtod(t, &end);
  if (end == t || errno == ERANGE || !isfinite(v) || !(v > 0.0)) return false;
  if (*end == '\0') {
    *out = (msnap_reserve_spec_t){true, v};
    return true;
  }
  if ((*end == 'G' || *end == 'g') && end[1] == '\0') {
    *out = (msnap_reserve_spec_t){false, v};
    return true;
  }
  return false;
}

static void reserve_warn(parser_t *p, size_t i, const char *what) {
  if (p->c->quiet) return;
  fprintf(stderr,
          "memsnap: warning: alloc conf: ignoring invalid %s '%s' at token "
          "%zu in \"%s\"\n",
          what, p->tok[i], i + 1, p->src);
}

static int k_expandable_segments_reserve(parser_t *p, size_t key, size_t *i) {
  int rc = to_value(p, key, i);
  if (rc) return rc;
  msnap_reserve_spec_t spec;
  if (reserve_spec(p->tok[*i], &spec)) {
    p->c->reserve = spec;
    p->c->reserve_set = true;
  } else {
    reserve_warn(p, *i, "expandable_segments_reserve");
  }
  return 0;
}

/* [name:value,...] */
static int k_expandable_segments_reserve_by_class(parser_t *p, size_t key,
                                                  size_t *i) {
  int rc = to_value(p, key, i);
  if (rc) return rc;
  if (strcmp(p->tok[*i], "[") != 0)
    return fail(p, *i, "expected a list [class:value,...] for '%s'; got '%s'",
                p->tok[key], p->tok[*i]);
  msnap_conf_t *c = p->c;
  c->nreserve_classes = 0;
  while (++*i < p->ntok && strcmp(p->tok[*i], "]") != 0) {
    size_t name = *i;
    if (strcmp(p->tok[name], ",") == 0) continue;
    *i += 2; /* separator (unchecked) and the value */
    if (*i >= p->ntok || strcmp(p->tok[*i], "]") == 0)
      return fail(p, *i >= p->ntok ? p->ntok : *i,
                  "missing value after class '%s' (token %zu) in the list "
                  "of '%s'", p->tok[name], name + 1, p->tok[key]);
    msnap_reserve_spec_t spec;
    if (!reserve_spec(p->tok[*i], &spec)) {
      reserve_warn(p, *i, "expandable_segments_reserve_by_class value");
      continue;
    }
    if (strlen(p->tok[name]) >= MSNAP_RESERVE_CLASS_LEN ||
        c->nreserve_classes == MSNAP_RESERVE_CLASSES) {
      reserve_warn(p, name, "(too long, or one too many) reserve class");
      continue;
    }
    uint32_t k = 0;
    while (k < c->nreserve_classes &&
           strcmp(c->reserve_classes[k].name, p->tok[name]) != 0)
      k++;
    snprintf(c->reserve_classes[k].name, MSNAP_RESERVE_CLASS_LEN, "%s",
             p->tok[name]);
    c->reserve_classes[k].spec = spec;
    if (k == c->nreserve_classes) c->nreserve_classes++;
  }
  if (*i >= p->ntok)
    return fail(p, p->ntok, "missing ']' closing the list of '%s' (token %zu)",
                p->tok[key], key + 1);
  return 0;
}

/* ExpandableSegmentReserveSpec::resolveBytes, saturating. */
static uint64_t reserve_resolve(const msnap_reserve_spec_t *s,
                                uint64_t total) {
  double b = s->is_fraction ? s->value * (double)total
                            : s->value * (double)(1ull << 30);
  if (!(b < 18446744073709551615.0)) return UINT64_MAX;
  return (uint64_t)b;
}

uint64_t msnap__conf_reserve_bytes(const msnap_conf_t *c, const char *cls,
                                   uint64_t total) {
  uint64_t full = total + total / 8;
  const msnap_reserve_spec_t *spec = NULL;
  for (uint32_t k = 0; k < c->nreserve_classes && spec == NULL; k++)
    if (strcmp(c->reserve_classes[k].name, cls ? cls : "") == 0)
      spec = &c->reserve_classes[k].spec;
  if (spec == NULL && c->reserve_set) spec = &c->reserve;
  if (spec == NULL) return full;
  uint64_t b = reserve_resolve(spec, total);
  return b < full ? b : full;
}

/* ---- NPU keys (NPUAllocatorConfig) --------------------------------------------- */

static int k_base_addr_aligned_kb(parser_t *p, size_t key, size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  if (v > 16)
    return fail(p, *i, "base_addr_aligned_kb must be in [0, 16]; got '%s'",
                p->tok[*i]);
  p->c->base_addr_aligned_kb = v;
  return 0;
}

static int k_page_size(parser_t *p, size_t key, size_t *i) {
  int rc = to_value(p, key, i);
  if (rc) return rc;
  if (strcmp(p->tok[*i], "1g") != 0)
    return fail(p, *i, "page_size only supports '1g'; got '%s'", p->tok[*i]);
  p->c->page_size_1g = true;
  return 0;
}

static int k_segment_size_mb(parser_t *p, size_t key, size_t *i) {
  uint64_t v;
  int rc = to_value(p, key, i);
  if (!rc) rc = tok_u64(p, key, *i, &v);
  if (rc) return rc;
  if (v < 20 || v > 512)
    return fail(p, *i, "segment_size_mb must be in [20, 512]; got '%s'",
                p->tok[*i]);
  p->c->segment_size_mb = v;
  /* torch_npu warns once (NPUAllocatorConfig::parseSegmentSizeMb) */
  static atomic_bool warned;
  if (!p->c->quiet && !atomic_exchange(&warned, true))
    fprintf(stderr,
            "memsnap: warning: alloc conf: segment_size_mb is deprecated "
            "(torch_npu): use large_segment_size_mb\n");
  return 0;
}

/* ---- the key table ------------------------------------------------------------- */

enum {
  S_GENERIC = 1u, /* both profiles                         */
  S_CUDA = 2u,    /* cuda profile only                     */
  S_NPU = 4u,     /* npu profile only                      */
  S_NPU_RT = 8u   /* npu: may be changed at run time       */
};

typedef struct key_s {
  const char *name;
  unsigned scope;
  key_fn fn;
} conf_key_t;

static const conf_key_t keys[] = {
    /* generic (the npu whitelist is exactly these) */
    {"large_segment_size_mb", S_GENERIC, k_large_segment_size_mb},
    {"max_split_size_mb", S_GENERIC | S_NPU_RT, k_max_split_size_mb},
    {"max_non_split_rounding_mb", S_GENERIC | S_NPU_RT,
     k_max_non_split_rounding_mb},
    {"garbage_collection_threshold", S_GENERIC,
     k_garbage_collection_threshold},
    {"roundup_power2_divisions", S_GENERIC, k_roundup_power2_divisions},
    {"expandable_segments", S_GENERIC | S_NPU_RT, k_expandable_segments},
    {"pinned_use_background_threads", S_GENERIC,
     k_pinned_use_background_threads},
    {"pinned_max_round_threshold_mb", S_GENERIC | S_NPU_RT,
     k_pinned_max_round_threshold_mb},
    {"pinned_max_cached_size_mb", S_GENERIC | S_NPU_RT,
     k_pinned_max_cached_size_mb},
    /* both profiles, profile-specific in upstream */
    {"per_process_memory_fraction", S_CUDA | S_NPU | S_NPU_RT,
     k_per_process_memory_fraction},
    {"pinned_reserve_segment_size_mb", S_CUDA | S_NPU,
     k_pinned_reserve_segment_size_mb},
    /* cuda */
    {"backend", S_CUDA, k_backend},
    {"release_lock_on_cudamalloc", S_CUDA, k_release_lock},
    {"release_lock_on_hipmalloc", S_CUDA, k_release_lock},
    {"pinned_use_cuda_host_register", S_CUDA, k_pinned_use_host_register},
    {"pinned_use_hip_host_register", S_CUDA, k_pinned_use_host_register},
    {"pinned_num_register_threads", S_CUDA, k_pinned_num_register_threads},
    {"graph_capture_record_stream_reuse", S_CUDA,
     k_graph_capture_record_stream_reuse},
    {"pinned_free_catch_all", S_CUDA, k_bool_ignored},
    {"throw_on_cudamalloc_oom", S_CUDA, k_throw_on_malloc_oom},
    {"expandable_segments_reserve", S_CUDA, k_expandable_segments_reserve},
    {"expandable_segments_reserve_by_class", S_CUDA,
     k_expandable_segments_reserve_by_class},
    /* npu */
    {"base_addr_aligned_kb", S_NPU, k_base_addr_aligned_kb},
    {"page_size", S_NPU, k_page_size},
    {"segment_size_mb", S_NPU, k_segment_size_mb},
    {"multi_stream_lazy_reclaim", S_NPU, k_multi_stream_lazy_reclaim},
    {"pin_memory_expandable_segments", S_NPU, k_bool_ignored},
    {"pinned_mem_register", S_NPU, k_pinned_use_host_register},
    {"release_lock_on_npumalloc", S_NPU | S_NPU_RT, k_release_lock},
    {"throw_on_npumalloc_oom", S_NPU | S_NPU_RT, k_throw_on_malloc_oom},
};

static const conf_key_t *find_key(const char *name) {
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    if (strcmp(keys[k].name, name) == 0) return &keys[k];
  return NULL;
}

/* Look up the key at token i for the parser's profile, or fail. */
static int lookup(parser_t *p, size_t i, const conf_key_t **out) {
  const char *name = p->tok[i];
  const conf_key_t *k = find_key(name);
  unsigned mine = S_GENERIC | (p->npu ? S_NPU : S_CUDA);
  if (k == NULL)
    return fail(p, i, "unrecognized key '%s'", name);
  if (!(k->scope & mine)) {
    if (p->npu)
      return fail(p, i, "torch_npu does not support key '%s' (a CUDA "
                  "allocator key)", name);
    return fail(p, i, "unrecognized key '%s' (an NPU allocator key; it needs "
                "MEMSNAP_PROFILE=npu)", name);
  }
  if (p->npu && p->runtime && !(k->scope & S_NPU_RT))
    return fail(p, i, "key '%s' cannot be changed at run time (torch_npu "
                "accepts expandable_segments, max_split_size_mb, "
                "max_non_split_rounding_mb, release_lock_on_npumalloc, "
                "throw_on_npumalloc_oom, per_process_memory_fraction, "
                "pinned_max_round_threshold_mb, pinned_max_cached_size_mb)",
                name);
  *out = k;
  return 0;
}

/* One pass over the tokens (p->pass 0: large_segment_size_mb only). */
static int parse_pass(parser_t *p) {
  for (size_t i = 0; i < p->ntok; i++) {
    const conf_key_t *k = NULL;
    size_t key = i;
    int rc = lookup(p, key, &k);
    if (rc) return rc;
    bool lss = k->fn == k_large_segment_size_mb;
    if (lss == (p->pass == 0)) rc = k->fn(p, key, &i);
    else rc = skip_value(p, key, &i);
    if (rc) return rc;
    if (i + 1 < p->ntok) i++; /* the ',' (unchecked) */
  }
  return 0;
}

static int parse(msnap_conf_t *c, const char *s, char *err, size_t errlen,
                 bool runtime) {
  if (s == NULL) return 0;
  parser_t p = {0};
  p.src = s;
  p.npu = c->profile == MSNAP_PROFILE_NPU;
  p.runtime = runtime;
  p.err = err;
  p.errlen = errlen;
  msnap_conf_t copy = *c;
  p.c = &copy;
  int rc = tokenize(&p);
  if (rc) {
    rc = msnap__set_error(MSNAP_ENOMEM, "alloc conf: out of host memory "
                          "parsing \"%.64s\"", s);
    if (err != NULL && errlen > 0) snprintf(err, errlen, "%s",
                                            msnap_last_error());
    goto out;
  }
  /* The resets of every parse. */
  copy.max_split_size = SIZE_MAX;
  memset(copy.roundup_power2_divisions, 0,
         sizeof copy.roundup_power2_divisions);
  copy.garbage_collection_threshold = 0.0;
  p.pass = 0;
  rc = parse_pass(&p);
  if (rc) goto out;
  copy.max_non_split_rounding_size = copy.large_segment_size;
  p.pass = 1;
  rc = parse_pass(&p);
  if (rc) goto out;
  if (p.npu && copy.expandable_segments &&
      (copy.max_split_size != SIZE_MAX ||
       copy.garbage_collection_threshold > 0.0)) {
    size_t at = p.mss_tok ? p.mss_tok - 1 : p.gc_tok - 1;
    rc = fail(&p, at, "expandable_segments:True cannot be combined with '%s' "
              "in the npu profile (torch_npu rejects it)", p.tok[at]);
    goto out;
  }
  char *raw = strdup(s);
  if (raw == NULL) {
    rc = msnap__set_error(MSNAP_ENOMEM, "alloc conf: out of host memory");
    goto out;
  }
  copy.raw = raw;
  msnap__conf_destroy(c);
  *c = copy;
out:
  free(p.buf);
  free(p.tok);
  return rc;
}

int msnap__conf_parse(msnap_conf_t *c, const char *s, char *err,
                      size_t errlen) {
  return parse(c, s, err, errlen, false);
}

int msnap__conf_parse_runtime(msnap_conf_t *c, const char *s, char *err,
                              size_t errlen) {
  return parse(c, s, err, errlen, true);
}

int msnap__conf_from_env(msnap_profile_t profile, const char **out,
                         char *err, size_t errlen) {
  if (profile == MSNAP_PROFILE_CUDA) {
    const char *v = msnap__env_get(MSNAP_ENV_PYTORCH_CUDA_ALLOC_CONF);
    if (v == NULL) v = msnap__env_get(MSNAP_ENV_PYTORCH_ALLOC_CONF);
    *out = v;
    return 0;
  }
  const char *npu = msnap__env_get(MSNAP_ENV_PYTORCH_NPU_ALLOC_CONF);
  const char *any = msnap__env_get(MSNAP_ENV_PYTORCH_ALLOC_CONF);
  if (npu != NULL && any != NULL) {
    msnap__set_error(MSNAP_ECONF,
                     "alloc conf: Both PYTORCH_NPU_ALLOC_CONF and "
                     "PYTORCH_ALLOC_CONF have been set, please set only one "
                     "of them. (PYTORCH_NPU_ALLOC_CONF=\"%s\", "
                     "PYTORCH_ALLOC_CONF=\"%s\")",
                     npu, any);
    if (err != NULL && errlen > 0)
      snprintf(err, errlen, "%s", msnap_last_error());
    return MSNAP_ECONF;
  }
  *out = npu != NULL ? npu : any;
  return 0;
}

/* ---- invariant checker ---------------------------------------------------------- */

int msnap__conf_check(const msnap_conf_t *c, char *msg, size_t msg_len) {
  const char *what = NULL;
  bool bad_reserve = c->reserve_set && !(c->reserve.value > 0.0);
  bool bad_class = c->nreserve_classes > MSNAP_RESERVE_CLASSES;
  for (uint32_t k = 0; !bad_class && k < c->nreserve_classes; k++)
    bad_class = c->reserve_classes[k].name[0] == '\0' ||
                !(c->reserve_classes[k].spec.value > 0.0);
  if (c->raw == NULL) what = "raw is NULL";
  else if (bad_reserve) what = "expandable_segments_reserve not positive";
  else if (bad_class) what = "a bad expandable_segments_reserve class";
  else if (c->large_segment_size <= 10 * MiB)
    what = "large_segment_size <= 10 MiB";
  else if (c->max_split_size != SIZE_MAX &&
           c->max_split_size < c->large_segment_size)
    what = "max_split_size below large_segment_size";
  else if (c->max_non_split_rounding_size < c->large_segment_size)
    what = "max_non_split_rounding_size below large_segment_size";
  else if (!(c->garbage_collection_threshold >= 0.0 &&
             c->garbage_collection_threshold < 1.0))
    what = "garbage_collection_threshold outside [0, 1)";
  else if (!(c->per_process_memory_fraction >= 0.0 &&
             c->per_process_memory_fraction <= 1.0))
    what = "per_process_memory_fraction outside [0, 1]";
  else if (c->base_addr_aligned_kb > 16) what = "base_addr_aligned_kb > 16";
  else if (c->segment_size_mb != 0 &&
           (c->segment_size_mb < 20 || c->segment_size_mb > 512))
    what = "segment_size_mb outside [20, 512]";
  else if (!is_pow2(c->pinned_num_register_threads) ||
           c->pinned_num_register_threads > 128)
    what = "pinned_num_register_threads not a power of two <= 128";
  else if (c->profile == MSNAP_PROFILE_NPU && c->expandable_segments &&
           (c->max_split_size != SIZE_MAX ||
            c->garbage_collection_threshold > 0.0))
    what = "npu: expandable_segments with max_split_size or gc threshold";
  for (int k = 0; what == NULL && k < MSNAP_ROUNDUP_INTERVALS; k++)
    if (c->roundup_power2_divisions[k] != 0 &&
        !is_pow2(c->roundup_power2_divisions[k]))
      what = "a roundup division is neither 0 nor a power of two";
  if (what == NULL) return 0;
  if (msg != NULL && msg_len > 0) snprintf(msg, msg_len, "conf: %s", what);
  return MSNAP_ESTATE;
}
