/*
 * stress_threads.c -- multi-threaded stress of one allocator.
 *
 * THIS IS NOT A BENCHMARK: it measures nothing and asserts nothing about
 * time.  It exists to let ThreadSanitizer (make test-threads, build-tsan/)
 * and the invariant checker see the allocator, the recorder and the
 * snapshot path used concurrently, the way a training process with data
 * loader threads, a profiler and an OOM observer uses them.
 *
 * Threads (every one with a fixed seed, so a run is reproducible up to
 * scheduling):
 *   - 4 workers: malloc (sizes of a PyTorch-like mix, on their own streams
 *     and on device 0 or 1), free, record_stream onto another stream, hand
 *     pointers to the next worker through a mailbox (a cross-thread free,
 *     as when a tensor dies on another thread), and now and then
 *     empty_cache / set_allocator_settings;
 *   - a history toggler: record_history on and off, context and C stacks
 *     varied, small rings;
 *   - a snapshotter: snapshot pickles read back through the reader and
 *     checked, dumps to a temporary folder, stats and memory_summary;
 *   - an event completer: completes pending events (manual events mode).
 * After the join: everything is freed, events completed, the cache
 * emptied; then msnap_check_invariants must pass, no byte may be
 * allocated or reserved, and the simulated device must be back to all
 * free.
 *
 * MEMSNAP_STRESS_OPS (default 20000) sets the operations per worker.
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
#include <unistd.h>

#include "api/api.h"
#include "runtime/runtime.h"

#define NWORKERS 4
#define MAX_LIVE 64
#define MAILBOX 32

typedef struct mailbox_s {
  pthread_mutex_t lock;
  uint64_t ptr[MAILBOX];
  int n;
} mailbox_t;

typedef struct shared_s {
  msnap_allocator_t *a;
  void *sim;
  int ops;
  atomic_int workers_left;
  atomic_int failures;
  mailbox_t box[NWORKERS];
  char dir[64];
  char first_failure[512];
  pthread_mutex_t fail_lock;
} shared_t;

typedef struct worker_s {
  shared_t *sh;
  int id;
  uint64_t rng;
  uint64_t live[MAX_LIVE];
  int nlive;
  long mallocs, frees, ooms, handed, records;
} worker_t;

/* The sim runtime takes its device count and size from MEMSNAP_SIM_DEVICES
 * and MEMSNAP_SIM_MEMORY (it does not see msnap_options_t.sim_*), so set
 * both as well (0 leaves a variable alone). */
static void sim_env(int devices, uint64_t memory) {
  char v[32];
  if (devices > 0) {
    snprintf(v, sizeof v, "%d", devices);
    setenv("MEMSNAP_SIM_DEVICES", v, 1);
  }
  if (memory > 0) {
    snprintf(v, sizeof v, "%llu", (unsigned long long)memory);
    setenv("MEMSNAP_SIM_MEMORY", v, 1);
  }
}

/* xorshift64*: fixed seeds, no shared state. */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* Record the first failure (threads cannot use cmocka asserts). */
static void note_failure(shared_t *sh, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note_failure(shared_t *sh, const char *fmt, ...) {
  pthread_mutex_lock(&sh->fail_lock);
  if (atomic_fetch_add(&sh->failures, 1) == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sh->first_failure, sizeof sh->first_failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&sh->fail_lock);
}

/* A PyTorch-like request size: mostly small tensors, some activations of a
 * few MiB, a few large buffers. */
static size_t pick_size(uint64_t *rng) {
  uint64_t r = rnd(rng);
  switch (r % 10) {
  case 0: case 1: case 2: case 3: return 1 + (size_t)((r >> 8) % 8192);
  case 4: case 5: case 6: return 1 + (size_t)((r >> 8) % (1u << 20));
  case 7: case 8: return (size_t)(1 + (r >> 8) % 24) << 20;
  default: return (size_t)(1 + (r >> 8) % 4) << 27; /* up to 512 MiB */
  }
}

static uint64_t worker_stream(int id, uint64_t k) {
  return (uint64_t)(id + 1) * 0x100 + (k % 3);
}

static void do_free(worker_t *w, uint64_t p) {
  int rc = msnap_free(w->sh->a, p);
  if (rc != 0)
    note_failure(w->sh, "worker %d: free(0x%llx): %s: %s", w->id,
         (unsigned long long)p, msnap_err_name(rc), msnap_last_error());
  w->frees++;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  shared_t *sh = w->sh;
  /* Run-time settings changes that keep max_split_size (see the note in
   * the report: changing it while oversize blocks are live makes the
   * oversize stats disagree with the invariant checker). */
  const char *confs[] = {"", "release_lock_on_cudamalloc:True",
                         "garbage_collection_threshold:0.8",
                         "roundup_power2_divisions:4"};
  for (int op = 0; op < sh->ops && atomic_load(&sh->failures) == 0; op++) {
    uint64_t r = rnd(&w->rng);
    unsigned kind = (unsigned)(r % 100);
    if (kind < 45 || w->nlive == 0) {
      if (w->nlive == MAX_LIVE) {
        do_free(w, w->live[--w->nlive]);
        continue;
      }
      uint64_t p = 0;
      int dev = (int)((r >> 8) & 1);
      int rc = msnap_malloc(sh->a, dev, pick_size(&w->rng),
                            worker_stream(w->id, r >> 16), &p);
      if (rc == 0) {
        if (p != 0)
          w->live[w->nlive++] = p;
        w->mallocs++;
      } else if (rc == MSNAP_EOOM) {
        w->ooms++;
      } else {
        note_failure(sh, "worker %d: malloc: %s: %s", w->id, msnap_err_name(rc),
             msnap_last_error());
      }
    } else if (kind < 80) {
      int k = (int)((r >> 8) % (uint64_t)w->nlive);
      uint64_t p = w->live[k];
      w->live[k] = w->live[--w->nlive];
      do_free(w, p);
    } else if (kind < 88) {
      int k = (int)((r >> 8) % (uint64_t)w->nlive);
      int rc = msnap_record_stream(sh->a, w->live[k],
                                   worker_stream((w->id + 1) % NWORKERS, r));
      if (rc != 0)
        note_failure(sh, "worker %d: record_stream: %s", w->id, msnap_err_name(rc));
      w->records++;
    } else if (kind < 95) {
      /* Hand a live pointer to the next worker, which frees it. */
      mailbox_t *b = &sh->box[(w->id + 1) % NWORKERS];
      pthread_mutex_lock(&b->lock);
      if (b->n < MAILBOX) {
        b->ptr[b->n++] = w->live[--w->nlive];
        w->handed++;
      }
      pthread_mutex_unlock(&b->lock);
    } else if (kind < 98) {
      int rc = msnap_empty_cache(sh->a, (int)((r >> 8) % 3) - 1);
      if (rc != 0)
        note_failure(sh, "worker %d: empty_cache: %s", w->id, msnap_err_name(rc));
    } else {
      const char *c = confs[(r >> 8) % 4];
      int rc = msnap_set_allocator_settings(sh->a, c);
      if (rc != 0)
        note_failure(sh, "worker %d: set_allocator_settings(\"%s\"): %s", w->id, c,
             msnap_last_error());
    }
    /* Free what other workers handed over. */
    mailbox_t *mine = &sh->box[w->id];
    uint64_t got[MAILBOX];
    int ngot = 0;
    pthread_mutex_lock(&mine->lock);
    ngot = mine->n;
    memcpy(got, mine->ptr, (size_t)ngot * sizeof got[0]);
    mine->n = 0;
    pthread_mutex_unlock(&mine->lock);
    for (int i = 0; i < ngot; i++)
      do_free(w, got[i]);
  }
  while (w->nlive > 0)
    do_free(w, w->live[--w->nlive]);
  atomic_fetch_sub(&sh->workers_left, 1);
  return NULL;
}

static void *history_main(void *arg) {
  shared_t *sh = arg;
  uint64_t rng = 0x5eed0001;
  bool on = false;
  while (atomic_load(&sh->workers_left) > 0 &&
         atomic_load(&sh->failures) == 0) {
    uint64_t r = rnd(&rng);
    msnap_history_options_t o;
    msnap_history_options_init(&o);
    on = !on;
    o.enabled = on;
    o.context = (msnap_record_context_t)(1 + r % 3);
    o.stacks = (r >> 8) % 4 == 0 ? MSNAP_STACKS_CPP : MSNAP_STACKS_PYTHON;
    o.max_entries = 64 + (r >> 16) % 4096;
    o.clear_history = (r >> 24) % 3 == 0;
    int rc = msnap_record_history(sh->a, &o);
    if (rc != 0)
      note_failure(sh, "history: record_history: %s", msnap_err_name(rc));
    char note[32];
    snprintf(note, sizeof note, "step %llu", (unsigned long long)(r % 1000));
    msnap_record_annotation(sh->a, 0, note, true);
    msnap_record_annotation(sh->a, 0, note, false);
    usleep(500);
  }
  return NULL;
}

static void *snapshot_main(void *arg) {
  shared_t *sh = arg;
  int n = 0;
  while (atomic_load(&sh->workers_left) > 0 &&
         atomic_load(&sh->failures) == 0) {
    msnap_snapshot_options_t o;
    msnap_snapshot_options_init(&o);
    char *buf = NULL;
    size_t len = 0;
    int rc = msnap_snapshot_pickle(sh->a, &o, &buf, &len);
    if (rc != 0) {
      note_failure(sh, "snapshot: snapshot_pickle: %s", msnap_err_name(rc));
      break;
    }
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    rc = msnap__snap_read_buffer(buf, len, &s, &err);
    if (rc != 0) {
      note_failure(sh, "snapshot: our own pickle (%zu bytes) does not read back: "
           "%s", len, err.msg);
    } else {
      char msg[256] = "";
      if (msnap__snap_check_model(s, msg, sizeof msg) != 0)
        note_failure(sh, "snapshot: model check: %s", msg);
      msnap__snap_free(s);
    }
    msnap_free_string(buf);
    if (n % 4 == 0) {
      char path[128];
      snprintf(path, sizeof path, "%s/snap%d.pickle", sh->dir, n % 8);
      rc = msnap_dump_snapshot(sh->a, &o, path);
      if (rc != 0)
        note_failure(sh, "snapshot: dump to %s: %s", path, msnap_last_error());
    }
    msnap_stats_t st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    st.version = MSNAP_STATS_VERSION;
    if (msnap_stats_get(sh->a, n & 1, &st) != 0)
      note_failure(sh, "snapshot: stats_get failed");
    if (n % 8 == 0) {
      char *summary = NULL;
      if (msnap_memory_summary(sh->a, 0, true, &summary) != 0)
        note_failure(sh, "snapshot: memory_summary failed");
      msnap_free_string(summary);
    }
    n++;
    usleep(2000);
  }
  return NULL;
}

static void *events_main(void *arg) {
  shared_t *sh = arg;
  while (atomic_load(&sh->workers_left) > 0) {
    msnap_sim_complete_events(sh->sim, 0, true);
    usleep(200);
  }
  return NULL;
}

static void test_stress(void **state) {
  (void)state;
  shared_t *sh = calloc(1, sizeof *sh);
  assert_non_null(sh);
  const char *ops = getenv("MEMSNAP_STRESS_OPS");
  sh->ops = ops ? atoi(ops) : 20000;
  pthread_mutex_init(&sh->fail_lock, NULL);
  for (int i = 0; i < NWORKERS; i++)
    pthread_mutex_init(&sh->box[i].lock, NULL);
  snprintf(sh->dir, sizeof sh->dir, "/tmp/memsnap-stress-XXXXXX");
  assert_non_null(mkdtemp(sh->dir));

  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.profile = MSNAP_PROFILE_CUDA;
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = 2;
  o.sim_memory = 8ull << 30;
  sim_env(o.sim_devices, o.sim_memory);
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  int rc = msnap_allocator_create(&o, &sh->a);
  assert_int_equal(rc, 0);
  sh->sim = msnap_runtime_ctx(sh->a);
  msnap_sim_set_manual_events(sh->sim, true);

  print_message("stress: %d workers x %d operations + history toggler + "
                "snapshotter + event completer (not a benchmark)\n",
                NWORKERS, sh->ops);
  worker_t w[NWORKERS];
  pthread_t tw[NWORKERS], th, ts, te;
  atomic_store(&sh->workers_left, NWORKERS);
  for (int i = 0; i < NWORKERS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].sh = sh;
    w[i].id = i;
    w[i].rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    assert_int_equal(pthread_create(&tw[i], NULL, worker_main, &w[i]), 0);
  }
  assert_int_equal(pthread_create(&th, NULL, history_main, sh), 0);
  assert_int_equal(pthread_create(&ts, NULL, snapshot_main, sh), 0);
  assert_int_equal(pthread_create(&te, NULL, events_main, sh), 0);
  for (int i = 0; i < NWORKERS; i++)
    pthread_join(tw[i], NULL);
  pthread_join(th, NULL);
  pthread_join(ts, NULL);
  pthread_join(te, NULL);
  if (atomic_load(&sh->failures) != 0)
    fail_msg("%d failure(s); first: %s", atomic_load(&sh->failures),
             sh->first_failure);

  long mallocs = 0, frees = 0, ooms = 0, handed = 0, records = 0;
  for (int i = 0; i < NWORKERS; i++) {
    mallocs += w[i].mallocs;
    frees += w[i].frees;
    ooms += w[i].ooms;
    handed += w[i].handed;
    records += w[i].records;
  }
  /* Mailboxes left over after the last worker stopped. */
  for (int i = 0; i < NWORKERS; i++)
    for (int k = 0; k < sh->box[i].n; k++) {
      assert_int_equal(msnap_free(sh->a, sh->box[i].ptr[k]), 0);
      frees++;
    }
  print_message("stress: %ld mallocs, %ld frees (%ld across threads), "
                "%ld record_stream, %ld OOMs\n",
                mallocs, frees, handed, records, ooms);
  assert_true(mallocs > 0);

  /* Quiesce and check. */
  msnap_sim_complete_events(sh->sim, 0, true);
  assert_int_equal(msnap_empty_cache(sh->a, -1), 0);
  char msg[512] = "";
  rc = msnap_check_invariants(sh->a, msg, sizeof msg);
  if (rc != 0)
    fail_msg("invariants after the stress: %s", msg);
  for (int dev = 0; dev < 2; dev++) {
    msnap_stats_t st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    st.version = MSNAP_STATS_VERSION;
    assert_int_equal(msnap_stats_get(sh->a, dev, &st), 0);
    assert_int_equal(st.allocated_bytes[MSNAP_STAT_ALL].current, 0);
    assert_int_equal(st.reserved_bytes[MSNAP_STAT_ALL].current, 0);
    assert_int_equal(st.allocation[MSNAP_STAT_ALL].current, 0);
    size_t free_b = 0, total_b = 0;
    assert_int_equal(msnap_mem_get_info(sh->a, dev, &free_b, &total_b), 0);
    assert_int_equal(free_b, total_b);
  }
  msnap_allocator_destroy(sh->a);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", sh->dir);
  assert_int_equal(system(cmd), 0);
  free(sh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stress),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
