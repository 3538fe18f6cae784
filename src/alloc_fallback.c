/*
 * alloc_fallback.c -- TEMPORARY weak definitions of the functions the
 * allocator calls in files other helpers are writing (history.c,
 * stack.c, oom.c).  Each is
 * __attribute__((weak)): as soon as the real definition is linked in, it
 * wins and this one is ignored.  Delete this file once main has them all.
 * What is left: the recorder side (history.c, stack.c, oom.c); history is
 * always off with these.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

#define WEAK __attribute__((weak))

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


/* Declared by the recorder branch (oom.c); called at the end of
 * msnap_allocator_create. */
void msnap__oom_env_init(msnap_allocator_t *a);
WEAK void msnap__oom_env_init(msnap_allocator_t *a) { (void)a; }
