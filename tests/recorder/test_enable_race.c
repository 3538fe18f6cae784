/*
 * test_enable_race.c -- history switched on while other threads allocate.
 *
 * Worker threads allocate, free and empty the cache on the sim runtime
 * while the main thread turns history off, then on, then takes a
 * snapshot.  Every call that changes the allocator once history is on
 * must be in the trace: a call that began before the switch (its
 * context gathered with history off) but took the device lock after it
 * is recorded too, as PyTorch's record_trace decides under the lock
 * (alloc_core.h, msnap__trace).  Before that fix a trace could hold two
 * frees of one address with no alloc between them.
 *
 * The check, per address of the trace, in trace order: after an alloc
 * the next entry of that address is its free_requested, after a
 * free_requested its free_completed, after a free_completed an alloc
 * (or nothing); the first entry of an address may be any of them (the
 * block was live before history was switched on).
 *
 * MEMSNAP_STRESS_OPS (operations; a trial per 2500 of them, 40 to 400,
 * 40 when unset) sets the number of trials; RACE_DEBUG=1 prints the first
 * entries of a torn trace.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "model/snapshot.h"

#define NWORKERS 3
#define NHELD 32

typedef struct race_s {
  msnap_allocator_t *a;
  atomic_int stop;
  atomic_int failures;
} race_t;

typedef struct worker_s {
  race_t *r;
  unsigned seed;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  race_t *r = w->r;
  uint64_t held[NHELD] = {0};
  unsigned s = w->seed;
  while (!atomic_load(&r->stop)) {
    s = s * 1103515245u + 12345u;
    int i = (int)((s >> 8) % NHELD);
    if (held[i]) {
      if (msnap_free(r->a, held[i]) != 0) atomic_fetch_add(&r->failures, 1);
      held[i] = 0;
    } else if (msnap_malloc(r->a, 0, (s >> 4) & 1 ? 3u << 20 : 512, 0,
                            &held[i]) != 0) {
      atomic_fetch_add(&r->failures, 1);
    }
    if (((s >> 12) & 63) == 0) msnap_empty_cache(r->a, -1);
  }
  for (int i = 0; i < NHELD; i++)
    if (held[i]) msnap_free(r->a, held[i]);
  return NULL;
}

/* Per address: the action of its last entry (-1: none yet). */
typedef struct last_s {
  uint64_t addr;
  int act;
} last_t;

static int last_cmp(const void *x, const void *y) {
  uint64_t a = ((const last_t *)x)->addr, b = ((const last_t *)y)->addr;
  return a < b ? -1 : a > b;
}

/* The order rule of the file comment over device 0's trace; 0 or the
 * index of the first entry that breaks it (+1). */
static uint32_t torn_at(const msnap_snap_t *s) {
  if (s->ndevices == 0) return 0;
  const msnap_trace_list_t *tl = &s->device_traces[0];
  last_t *v = calloc((size_t)tl->n + 1, sizeof *v);
  assert_non_null(v);
  uint32_t nv = 0;
  for (uint32_t i = 0; i < tl->n; i++) {
    int act = (int)tl->v[i].action;
    if (act == MSNAP_ACTION_ALLOC || act == MSNAP_ACTION_FREE_REQUESTED ||
        act == MSNAP_ACTION_FREE_COMPLETED)
      v[nv++] = (last_t){tl->v[i].addr, -1};
  }
  qsort(v, nv, sizeof *v, last_cmp);
  uint32_t m = 0;
  for (uint32_t i = 0; i < nv; i++)
    if (m == 0 || v[m - 1].addr != v[i].addr) v[m++] = v[i];
  uint32_t bad = 0;
  for (uint32_t i = 0; i < tl->n && !bad; i++) {
    int act = (int)tl->v[i].action;
    if (act != MSNAP_ACTION_ALLOC && act != MSNAP_ACTION_FREE_REQUESTED &&
        act != MSNAP_ACTION_FREE_COMPLETED)
      continue;
    last_t key = {tl->v[i].addr, 0};
    last_t *l = bsearch(&key, v, m, sizeof *v, last_cmp);
    assert_non_null(l);
    int want = l->act == MSNAP_ACTION_ALLOC ? MSNAP_ACTION_FREE_REQUESTED
               : l->act == MSNAP_ACTION_FREE_REQUESTED
                   ? MSNAP_ACTION_FREE_COMPLETED
               : l->act == MSNAP_ACTION_FREE_COMPLETED ? MSNAP_ACTION_ALLOC
                                                       : act;
    if (act != want) bad = i + 1;
    l->act = act;
  }
  free(v);
  return bad;
}

static void enable_while_allocating(void **state) {
  (void)state;
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_CUDA;
  o.runtime_name = "sim";
  o.sim_devices = 1;
  o.alloc_conf = "";
  race_t r;
  memset(&r, 0, sizeof r);
  assert_int_equal(msnap_allocator_create(&o, &r.a), 0);
  /* MEMSNAP_STRESS_OPS counts operations (make test-threads' stress run
   * sets 10^6): a trial is a few thousand of them */
  const char *e = getenv("MEMSNAP_STRESS_OPS");
  long ops = e ? atol(e) : 0;
  int trials = ops > 0 ? (int)(ops / 2500) : 40;
  if (trials < 40) trials = 40;
  if (trials > 400) trials = 400;
  msnap_history_options_t on, off;
  msnap_history_options_init(&on);
  on.context = MSNAP_CONTEXT_NEVER;
  on.stacks = 0;
  on.max_entries = 1u << 20;
  msnap_history_options_init(&off);
  off.enabled = false;
  int torn = 0;
  char first[160] = "";
  for (int t = 0; t < trials; t++) {
    assert_int_equal(msnap_record_history(r.a, &off), 0);
    atomic_store(&r.stop, 0);
    pthread_t th[NWORKERS];
    worker_t w[NWORKERS];
    for (int k = 0; k < NWORKERS; k++) {
      w[k] = (worker_t){&r, (unsigned)(t * 7919 + k * 104729 + 1)};
      assert_int_equal(pthread_create(&th[k], NULL, worker_main, &w[k]), 0);
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    assert_int_equal(msnap_record_history(r.a, &on), 0);
    nanosleep(&ms, NULL);
    atomic_store(&r.stop, 1);
    for (int k = 0; k < NWORKERS; k++) pthread_join(th[k], NULL);
    msnap_snapshot_options_t so;
    msnap_snapshot_options_init(&so);
    msnap_snap_t *s = NULL;
    assert_int_equal(msnap__snapshot_take(r.a, &so, &s), 0);
    uint32_t at = torn_at(s);
    if (at && getenv("RACE_DEBUG")) {
      const msnap_trace_list_t *tl = &s->device_traces[0];
      for (uint32_t i = 0; i < tl->n && i < at + 3; i++)
        fprintf(stderr, "%u %s 0x%llx %llu\n", i,
                msnap_action_name(tl->v[i].action),
                (unsigned long long)tl->v[i].addr,
                (unsigned long long)tl->v[i].size);
    }
    if (at && torn++ == 0)
      snprintf(first, sizeof first,
               "trial %d: entry %u (action %d, 0x%llx) out of order for its "
               "address", t, at - 1, (int)s->device_traces[0].v[at - 1].action,
               (unsigned long long)s->device_traces[0].v[at - 1].addr);
    msnap__snap_free(s);
  }
  if (torn) fail_msg("%d of %d traces torn; first: %s", torn, trials, first);
  assert_int_equal(atomic_load(&r.failures), 0);
  char msg[256];
  assert_int_equal(msnap_check_invariants(r.a, msg, sizeof msg), 0);
  msnap_allocator_destroy(r.a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(enable_while_allocating),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
