/*
 * canon.c -- the canonical text of a pickle (canon.h), built on the safe
 * VM's public accessors (src/model/pickle.h): the tests compare it with
 * what tests/pickle/canon.py prints for CPython's object.
 *
 * The canonical form (tests/pickle/canon.py produces the same from a
 * Python object): N, T, F; i<decimal> for ints in [-2^63, 2^64), else
 * I[-]0x<hex>; f<16 hex digits of the IEEE bits>; s<hex utf-8>; ;
 * b<hex>; and B<hex>; for bytes/bytearray; [..] lists, (..) tuples,
 * {k:v,..} dicts in insertion order, S{..} / Z{..} sets / frozensets with
 * elements sorted by their canonical text; items separated by ','.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h"

/* The containers being printed (a value that contains itself is an
 * error, as CPython's repr would recurse). */
typedef struct canon_s {
  msnap_pvm_t *vm;
  const msnap_snap_t *strings;
  msnap_sink_t *out;
  uint64_t budget;
  const msnap_pobj_t *active[MSNAP_PICKLE_MAX_DEPTH + 2];
  unsigned nactive;
} canon_t;

/*
 * Canonical text of v (recursive; depth and size bounded).
 */
static int canon(canon_t *c, msnap_pv_t v, unsigned depth);

static int cput(canon_t *c, const char *s) {
  return msnap__sink_write(c->out, s, strlen(s));
}

static int chex(canon_t *c, const unsigned char *p, size_t n) {
  static const char hx[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    char b[2] = {hx[p[i] >> 4], hx[p[i] & 15]};
    msnap__sink_write(c->out, b, 2);
  }
  return c->out->err;
}

static int canon_big(canon_t *c, const unsigned char *b, size_t n) {
  bool neg = n && (b[n - 1] & 0x80);
  unsigned char *m = malloc(n ? n : 1);
  if (!m) return MSNAP_ENOMEM;
  memcpy(m, b, n);
  if (neg) {
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) {
      unsigned x = (unsigned)(unsigned char)~m[i] + carry;
      m[i] = (unsigned char)x;
      carry = x >> 8;
    }
  }
  size_t top = n;
  while (top > 1 && m[top - 1] == 0) top--;
  cput(c, neg ? "I-0x" : "I0x");
  static const char hx[] = "0123456789abcdef";
  bool lead = true;
  for (size_t i = top; i-- > 0;) {
    for (int h = 1; h >= 0; h--) {
      unsigned d = (m[i] >> (4 * h)) & 15;
      if (lead && d == 0 && !(i == 0 && h == 0)) continue;
      lead = false;
      msnap__sink_write(c->out, &hx[d], 1);
    }
  }
  free(m);
  return c->out->err;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int canon_set(canon_t *c, const msnap_pobj_t *o, unsigned depth) {
  uint32_t n = o->n;
  char **parts = calloc(n ? n : 1, sizeof *parts);
  if (!parts) return MSNAP_ENOMEM;
  int rc = 0;
  msnap_sink_t *saved = c->out;
  for (uint32_t k = 0; k < n && rc == 0; k++) {
    msnap_membuf_t mb = {0};
    msnap_sink_t s;
    if ((rc = msnap__sink_init_mem(&s, &mb)) < 0) break;
    c->out = &s;
    rc = canon(c, msnap__pobj_item(o, k), depth + 1);
    c->out = saved;
    if (rc == 0) rc = msnap__sink_write(&s, "", 1);
    int frc = msnap__sink_finish(&s);
    if (rc == 0) rc = frc;
    parts[k] = mb.data;
    if (rc == 0 && !mb.data) rc = MSNAP_ENOMEM;
  }
  c->out = saved;
  if (rc == 0) {
    qsort(parts, n, sizeof *parts, cmp_str);
    for (uint32_t k = 0; k < n; k++) {
      if (k) cput(c, ",");
      cput(c, parts[k]);
    }
  }
  for (uint32_t k = 0; k < n; k++) free(parts[k]);
  free(parts);
  return rc;
}

static int canon(canon_t *c, msnap_pv_t v, unsigned depth) {
  msnap_pvm_t *vm = c->vm;
  char tmp[64];
  if (depth > MSNAP_PICKLE_MAX_DEPTH + 1 || c->budget-- == 0)
    return msnap__pvm_fail(vm, MSNAP_ELIMIT,
                           "value too deep or too large to print");
  int64_t i;
  uint64_t u;
  double f;
  size_t n = 0;
  switch (MSNAP_PV_TAG(v)) {
  case MSNAP_PV_CONST:
    return cput(c, MSNAP_PV_PAYLOAD(v) == MSNAP_PVC_NONE    ? "N"
                   : MSNAP_PV_PAYLOAD(v) == MSNAP_PVC_TRUE ? "T"
                                                           : "F");
  case MSNAP_PV_STR:
  case MSNAP_PV_BYTES:
  case MSNAP_PV_BYTEARRAY: {
    const char *s =
        msnap__snap_str(c->strings, (msnap_str_t)MSNAP_PV_PAYLOAD(v), &n);
    unsigned t = MSNAP_PV_TAG(v);
    cput(c, t == MSNAP_PV_STR ? "s" : t == MSNAP_PV_BYTES ? "b" : "B");
    chex(c, (const unsigned char *)s, n);
    return cput(c, ";");
  }
  case MSNAP_PV_INT:
  case MSNAP_PV_BOX:
    switch (msnap__pvm_int(vm, v, &i, &u)) {
    case MSNAP_PINT_I64:
      snprintf(tmp, sizeof tmp, "i%lld", (long long)i);
      return cput(c, tmp);
    case MSNAP_PINT_U64:
      snprintf(tmp, sizeof tmp, "i%llu", (unsigned long long)u);
      return cput(c, tmp);
    case MSNAP_PINT_BIG: {
      const unsigned char *b = msnap__pvm_big(vm, v, &n);
      return canon_big(c, b, n);
    }
    default:
      break;
    }
    if (msnap__pvm_float(vm, v, &f)) {
      memcpy(&u, &f, 8);
      snprintf(tmp, sizeof tmp, "f%016llx", (unsigned long long)u);
      return cput(c, tmp);
    }
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "unknown boxed value");
  case MSNAP_PV_OBJ: {
    const msnap_pobj_t *o = msnap__pvm_obj(vm, v);
    if (!o) return msnap__pvm_fail(vm, MSNAP_EFORMAT, "consumed container");
    for (unsigned k = 0; k < c->nactive; k++)
      if (c->active[k] == o)
        return msnap__pvm_fail(vm, MSNAP_EFORMAT, "recursive structure");
    c->active[c->nactive++] = o;
    static const char *const open[] = {"", "[", "(", "{", "S{", "Z{"};
    static const char *const close[] = {"", "]", ")", "}", "}", "}"};
    uint8_t kind = o->kind;
    int rc = kind <= MSNAP_POBJ_FROZENSET
                 ? cput(c, open[kind])
                 : msnap__pvm_fail(vm, MSNAP_EFORMAT, "forwarded container");
    if (rc == 0 && (kind == MSNAP_POBJ_SET || kind == MSNAP_POBJ_FROZENSET)) {
      rc = canon_set(c, o, depth);
    } else {
      for (uint32_t k = 0; rc == 0 && k < o->n; k++) {
        if (k) cput(c, kind == MSNAP_POBJ_DICT && (k & 1) ? ":" : ",");
        rc = canon(c, msnap__pobj_item(o, k), depth + 1);
      }
    }
    c->nactive--;
    if (rc == 0) rc = cput(c, close[kind]);
    return rc;
  }
  default:
    return msnap__pvm_fail(vm, MSNAP_EFORMAT, "record in a generic value");
  }
}

/*
 * Run a pickle with no consumer and print its canonical text.
 */
int test_pickle_canon(const void *buf, size_t len, msnap_membuf_t *out,
                      msnap_read_error_t *err) {
  msnap_snap_t *strings = msnap__snap_new();
  msnap_pvm_t *vm = strings ? msnap__pvm_new(strings, NULL, NULL) : NULL;
  if (!vm) {
    msnap__snap_free(strings);
    return MSNAP_ENOMEM;
  }
  msnap_pv_t root;
  int rc = msnap__pvm_run(vm, buf, len, &root, err);
  if (rc == 0) {
    msnap_sink_t s;
    memset(out, 0, sizeof *out);
    rc = msnap__sink_init_mem(&s, out);
    if (rc == 0) {
      /* shared containers are printed each time: bound the expansion */
      canon_t *c = calloc(1, sizeof *c);
      if (c == NULL) {
        rc = MSNAP_ENOMEM;
      } else {
        c->vm = vm;
        c->strings = strings;
        c->out = &s;
        c->budget = (uint64_t)len * 16 + 65536;
        msnap__pvm_set_phase(vm, "printing the canonical form");
        rc = canon(c, root, 0);
        free(c);
      }
      if (rc == 0) rc = msnap__sink_write(&s, "", 1);
      int frc = msnap__sink_finish(&s);
      if (rc == 0) rc = frc;
      if (rc < 0) {
        free(out->data);
        memset(out, 0, sizeof *out);
      }
    }
  }
  msnap__pvm_free(vm);
  msnap__snap_free(strings);
  return rc;
}

static void strip_one(msnap_stack_t *st) {
  if (*st != MSNAP_STACK_ABSENT) *st = MSNAP_STACK_EMPTY;
}

static void strip_traces(msnap_trace_list_t *l) {
  for (uint32_t i = 0; i < l->n; i++)
    strip_one(&l->v[i].frames);
}

void test_model_strip_stacks(msnap_snap_t *s) {
  for (uint32_t i = 0; i < s->nsegments; i++)
    strip_one(&s->segments[i].frames);
  for (uint32_t i = 0; i < s->nblocks; i++)
    strip_one(&s->blocks[i].frames);
  for (uint32_t i = 0; i < s->nhistories; i++)
    strip_one(&s->histories[i].frames);
  for (uint32_t i = 0; i < s->nhost_segments; i++)
    strip_one(&s->host_segments[i].frames);
  for (uint32_t i = 0; i < s->nhost_blocks; i++)
    strip_one(&s->host_blocks[i].frames);
  for (uint32_t d = 0; d < s->ndevices; d++)
    strip_traces(&s->device_traces[d]);
  strip_traces(&s->host_traces);
  s->stacks_skipped = false;
}

int test_model_rewrite(const msnap_snap_t *s, msnap_membuf_t *out) {
  msnap_sink_t sink;
  *out = (msnap_membuf_t){0};
  int rc = msnap__sink_init_mem(&sink, out);
  if (rc != 0) return rc;
  int wrc = msnap__snap_write_pickle(s, &sink);
  int frc = msnap__sink_finish(&sink);
  rc = wrc != 0 ? wrc : frc;
  if (rc != 0) {
    free(out->data);
    *out = (msnap_membuf_t){0};
  }
  return rc;
}
