/*
 * test_settings_race.c -- allocator_settings of a snapshot taken while another
 * thread changes the settings (msnap_set_allocator_settings).
 *
 * The setter thread applies three conf strings in turn; each fixes
 * max_split_size and garbage_collection_threshold (every parse resets
 * both, allocator-algorithm §17).  The snapshot thread takes snapshots
 * without traces and checks that allocator_settings describes ONE applied
 * conf: PYTORCH_CUDA_ALLOC_CONF is one of the three strings and
 * max_split_size / garbage_collection_threshold are that string's values.
 * api/snapshot.c copies the conf under device 0's lock; reading it
 * without the lock is a data race that ThreadSanitizer reports (suite
 * `threads`, make test-threads) and can pair one conf's string with
 * another's numbers, or read a freed string.
 *
 * MEMSNAP_STRESS_OPS (default 2000) sets the iterations of each thread.
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

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/snapshot.h"

typedef struct conf_case_s {
  const char *s;
  int64_t max_split_size; /* as allocator_settings writes it */
  double gc;
} conf_case_t;

static const conf_case_t cases[] = {
    {"", -1, 0.0},
    {"max_split_size_mb:100,garbage_collection_threshold:0.6",
     100ll << 20, 0.6},
    {"max_split_size_mb:300,roundup_power2_divisions:4", 300ll << 20, 0.0},
};
#define NCASES (sizeof cases / sizeof cases[0])

typedef struct race_s {
  msnap_allocator_t *a;
  int iters;
  atomic_int failures;
  atomic_int setter_done;
  char first_failure[256];
} race_t;

static void note(race_t *r, const char *what, const char *detail) {
  if (atomic_fetch_add(&r->failures, 1) == 0)
    snprintf(r->first_failure, sizeof r->first_failure, "%s: %s", what,
             detail);
}

static void *setter_main(void *arg) {
  race_t *r = arg;
  for (int i = 0; i < r->iters; i++) {
    const char *s = cases[1 + i % (NCASES - 1)].s;
    if (i % 7 == 6) s = cases[0].s;
    if (msnap_set_allocator_settings(r->a, s) != 0)
      note(r, "set_allocator_settings", s);
  }
  atomic_store(&r->setter_done, 1);
  return NULL;
}

static const msnap_gv_t *setting(const msnap_snap_t *s, const char *key) {
  const msnap_gv_t *st = &s->allocator_settings;
  if (st->kind != MSNAP_GV_DICT) return NULL;
  for (uint32_t i = 0; i + 1 < st->u.seq.n; i += 2) {
    size_t n;
    const char *k = msnap__snap_str(s, st->u.seq.items[i].u.s, &n);
    if (k != NULL && strcmp(k, key) == 0) return &st->u.seq.items[i + 1];
  }
  return NULL;
}

/* One snapshot: its allocator_settings must be one applied conf. */
static void check_one(race_t *r) {
  msnap_snapshot_options_t o;
  msnap_snapshot_options_init(&o);
  o.include_traces = false;
  msnap_snap_t *s = NULL;
  if (msnap__snapshot_take(r->a, &o, &s) != 0) {
    note(r, "snapshot_take", msnap_last_error());
    return;
  }
  const msnap_gv_t *raw = setting(s, "PYTORCH_CUDA_ALLOC_CONF");
  const msnap_gv_t *mss = setting(s, "max_split_size");
  const msnap_gv_t *gc = setting(s, "garbage_collection_threshold");
  if (!raw || !mss || !gc) {
    note(r, "allocator_settings", "a key is missing");
  } else {
    size_t n;
    const char *str = msnap__snap_str(s, raw->u.s, &n);
    const conf_case_t *c = NULL;
    for (size_t i = 0; i < NCASES && str != NULL; i++)
      if (strcmp(str, cases[i].s) == 0) c = &cases[i];
    char detail[200];
    if (c == NULL) {
      snprintf(detail, sizeof detail, "unknown string \"%.60s\"",
               str ? str : "(null)");
      note(r, "PYTORCH_CUDA_ALLOC_CONF", detail);
    } else if (mss->u.i != c->max_split_size ||
               gc->u.f < c->gc - 1e-9 || gc->u.f > c->gc + 1e-9) {
      snprintf(detail, sizeof detail,
               "\"%s\" with max_split_size %lld, gc %g",
               c->s, (long long)mss->u.i, gc->u.f);
      note(r, "mixed confs", detail);
    }
  }
  msnap__snap_free(s);
}

static void *snapshot_main(void *arg) {
  race_t *r = arg;
  for (int i = 0; i < r->iters || !atomic_load(&r->setter_done); i++)
    check_one(r);
  return NULL;
}

static void settings_vs_snapshot(void **state) {
  (void)state;
  setenv("MEMSNAP_SIM_DEVICES", "2", 1);
  msnap_options_t o;
  msnap_options_init(&o);
  o.profile = MSNAP_PROFILE_CUDA;
  o.runtime_name = "sim";
  o.sim_devices = 2;
  o.alloc_conf = "";
  race_t r;
  memset(&r, 0, sizeof r);
  assert_int_equal(msnap_allocator_create(&o, &r.a), 0);
  const char *e = getenv("MEMSNAP_STRESS_OPS");
  r.iters = e ? atoi(e) : 2000;
  if (r.iters <= 0) r.iters = 2000;
  uint64_t p = 0;
  assert_int_equal(msnap_malloc(r.a, 0, 5 << 20, 0, &p), 0);
  pthread_t ts, tt;
  assert_int_equal(pthread_create(&ts, NULL, setter_main, &r), 0);
  assert_int_equal(pthread_create(&tt, NULL, snapshot_main, &r), 0);
  pthread_join(ts, NULL);
  pthread_join(tt, NULL);
  if (atomic_load(&r.failures) != 0)
    fail_msg("%d failures, first: %s", atomic_load(&r.failures),
             r.first_failure);
  /* Quiet again: the last applied conf is what a snapshot shows. */
  assert_int_equal(msnap_set_allocator_settings(r.a, cases[1].s), 0);
  check_one(&r);
  assert_int_equal(atomic_load(&r.failures), 0);
  assert_int_equal(msnap_free(r.a, p), 0);
  char msg[256];
  assert_int_equal(msnap_check_invariants(r.a, msg, sizeof msg), 0);
  msnap_allocator_destroy(r.a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(settings_vs_snapshot),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
