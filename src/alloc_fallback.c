/*
 * alloc_fallback.c -- TEMPORARY weak definitions of the functions the
 * allocator calls in files other helpers are writing (error.c, env.c,
 * conf.c, runtime.c, history.c/stack.c, oom.c, snapshot.c).  Each is
 * __attribute__((weak)): as soon as the real definition is linked in, it
 * wins and this one is ignored.  Delete this file once main has them all.
 *
 * Behaviour: errors go to a thread-local buffer; the conf gets PyTorch's
 * defaults and accepts only the empty string; history is always off.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define WEAK __attribute__((weak))

static _Thread_local char fb_err[1024];

WEAK int msnap__set_error(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fb_err, sizeof fb_err, fmt, ap);
  va_end(ap);
  return err;
}

WEAK const char *msnap_last_error(void) { return fb_err; }

WEAK const char *msnap_strerror(int err) {
  switch (err) {
#define FB_CASE_(name, value, text)                                           \
  case value:                                                                 \
    return text;
    MSNAP_ERRNO_MAP(FB_CASE_)
#undef FB_CASE_
  case 0:
    return "success";
  default:
    return "unknown error";
  }
}

WEAK void msnap__conf_init(msnap_conf_t *c, msnap_profile_t profile) {
  memset(c, 0, sizeof *c);
  c->profile = profile;
  c->max_split_size = UINT64_MAX;
  c->large_segment_size = 20971520;
  c->max_non_split_rounding_size = 20971520;
  c->per_process_memory_fraction = 1.0;
  c->base_addr_aligned_kb = 16;
}

WEAK void msnap__conf_destroy(msnap_conf_t *c) {
  free(c->raw);
  c->raw = NULL;
}

WEAK int msnap__conf_parse(msnap_conf_t *c, const char *s, char *err,
                           size_t errlen) {
  (void)c;
  if (s && s[0]) {
    snprintf(err, errlen, "alloc conf parser not available: '%s'", s);
    return MSNAP_ECONF;
  }
  return 0;
}

WEAK int msnap__conf_from_env(msnap_profile_t profile, const char **out,
                              char *err, size_t errlen) {
  (void)profile;
  (void)err;
  (void)errlen;
  *out = NULL;
  return 0;
}

WEAK int msnap__env_profile(msnap_profile_t *out) {
  const char *p = getenv("MEMSNAP_PROFILE");
  *out = p && strcmp(p, "cuda") == 0 ? MSNAP_PROFILE_CUDA : MSNAP_PROFILE_NPU;
  return 0;
}

WEAK const char *msnap__env_runtime(void) { return getenv("MEMSNAP_RUNTIME"); }

WEAK bool msnap__env_no_caching(msnap_profile_t profile) {
  const char *v = getenv(profile == MSNAP_PROFILE_CUDA
                             ? "PYTORCH_NO_CUDA_MEMORY_CACHING"
                             : "PYTORCH_NO_NPU_MEMORY_CACHING");
  return v && strcmp(v, "1") == 0;
}

WEAK const msnap_runtime_ops_t *msnap_runtime_by_name(const char *name) {
  (void)name;
  return NULL;
}

WEAK bool msnap__history_active(const msnap_allocator_t *a) {
  (void)a;
  return false;
}

WEAK void msnap__rctx_capture(msnap_allocator_t *a, msnap_rctx_t *ctx,
                              bool is_free_site) {
  (void)a;
  (void)is_free_site;
  memset(ctx, 0, sizeof *ctx);
}

WEAK void msnap__rctx_release(msnap_rctx_t *ctx) { (void)ctx; }
WEAK void msnap__stack_ref(uint32_t stack) { (void)stack; }
WEAK void msnap__stack_unref(uint32_t stack) { (void)stack; }

WEAK void msnap__history_record_locked(msnap_allocator_t *a, int device,
                                       msnap_action_t action, uint64_t addr,
                                       uint64_t size, uint64_t stream,
                                       msnap_mempool_id_t pool,
                                       const msnap_rctx_t *ctx,
                                       uint32_t stack_override) {
  (void)a, (void)device, (void)action, (void)addr, (void)size;
  (void)stream, (void)pool, (void)ctx, (void)stack_override;
}

WEAK void msnap__recorder_destroy(struct msnap_recorder_s *r) { (void)r; }

WEAK void msnap__oom_notify(msnap_allocator_t *a, int device,
                            uint64_t alloc_size, uint64_t device_total,
                            uint64_t device_free) {
  (void)a, (void)device, (void)alloc_size, (void)device_total;
  (void)device_free;
}

WEAK msnap_ssegment_t *msnap__snap_add_segment(msnap_snap_t *s) {
  if (s->nsegments == s->segments_cap) {
    uint32_t nc = s->segments_cap ? s->segments_cap * 2 : 16;
    msnap_ssegment_t *nv = realloc(s->segments, nc * sizeof *nv);
    if (!nv)
      return NULL;
    s->segments = nv;
    s->segments_cap = nc;
  }
  msnap_ssegment_t *r = &s->segments[s->nsegments++];
  memset(r, 0, sizeof *r);
  return r;
}

WEAK msnap_sblock_t *msnap__snap_add_block(msnap_snap_t *s) {
  if (s->nblocks == s->blocks_cap) {
    uint32_t nc = s->blocks_cap ? s->blocks_cap * 2 : 64;
    msnap_sblock_t *nv = realloc(s->blocks, nc * sizeof *nv);
    if (!nv)
      return NULL;
    s->blocks = nv;
    s->blocks_cap = nc;
  }
  msnap_sblock_t *r = &s->blocks[s->nblocks++];
  memset(r, 0, sizeof *r);
  return r;
}

WEAK msnap_snap_t *msnap__snap_new(void) {
  return calloc(1, sizeof(msnap_snap_t));
}

WEAK void msnap__snap_free(msnap_snap_t *s) {
  if (!s)
    return;
  free(s->segments);
  free(s->blocks);
  free(s);
}
