/*
 * test_recorder.c -- the recorder with the real allocator on the sim
 * runtime: dumps loaded by CPython's pickle, snapshot consistency with
 * msnap_stats_get and with a replay of device_traces, filters,
 * include_traces, the workspace allocator, allocation tracebacks, dump
 * failures leaving no file.
 */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc/alloc.h"
#include "api/api.h"
#include "runtime/runtime.h"
#include "record/stack.h"

static char tmpdir[256];

/* ---- helpers --------------------------------------------------------------- */

static msnap_allocator_t *make(int profile, int ndev) {
  msnap_options_t o;
  msnap_options_init(&o);
  /* The sim runtime reads the environment (options too, when honoured). */
  char nd[16];
  snprintf(nd, sizeof nd, "%d", ndev);
  setenv("MEMSNAP_SIM_DEVICES", nd, 1);
  setenv("MEMSNAP_SIM_MEMORY", "8G", 1);
  o.profile = profile;
  o.runtime_name = "sim";
  o.alloc_conf = "";
  o.caching_disabled = 0;
  o.sim_devices = ndev;
  o.sim_memory = 8ull << 30;
  char err[256] = "";
  o.error_buf = err;
  o.error_buf_len = sizeof err;
  msnap_allocator_t *a = NULL;
  int rc = msnap_allocator_create(&o, &a);
  if (rc != 0) fail_msg("allocator_create: %s %s", msnap_strerror(rc), err);
  assert_int_equal(msnap_device_count(a), ndev);
  return a;
}

static void enable(msnap_allocator_t *a, msnap_record_context_t ctx,
                   uint64_t max_entries) {
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.context = ctx;
  o.max_entries = max_entries;
  o.clear_history = true;
  assert_int_equal(msnap_record_history(a, &o), 0);
}

static bool have_python(void) {
  static int have = -1;
  if (have < 0) have = system("python3 -c 'import pickle' 2>/dev/null") == 0;
  return have;
}

/* Run check_dump.py; returns its exit status, stdout in out. */
static int run_check(const char *mode, const char *file, const char *extra,
                     char *out, size_t outlen) {
  const char *root = getenv("MEMSNAP_SOURCE_ROOT");
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "python3 %s/tests/recorder/check_dump.py %s %s %s",
           root ? root : "..", mode, file, extra ? extra : "");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, outlen - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define REQUIRE_PYTHON()                                                      \
  do {                                                                        \
    if (!have_python()) {                                                     \
      print_error("SKIP: python3 not found; CPython pickle checks skipped\n"); \
      skip();                                                                 \
    }                                                                         \
  } while (0)

static void check_model(const msnap_snap_t *s) {
  char msg[256];
  int rc = msnap__snap_check_model(s, msg, sizeof msg);
  if (rc != 0) fail_msg("model: %s", msg);
  char m2[256];
  rc = msnap__stack_check(m2, sizeof m2);
  if (rc != 0) fail_msg("%s", m2);
}

static int count_files(const char *dir, const char *prefix, const char *ext) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name), el = ext ? strlen(ext) : 0;
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    if (ext && (l < el || strcmp(e->d_name + l - el, ext) != 0)) continue;
    n++;
  }
  closedir(d);
  return n;
}

static void rm_dir_files(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
}

/* A fixed workload: allocations of every size class on two streams, frees,
 * a pending free via record_stream, an empty_cache. */
static uint64_t lcg_state = 12345;
static uint64_t lcg(void) {
  lcg_state = lcg_state * 6364136223846793005ull + 1442695040888963407ull;
  return lcg_state >> 33;
}

typedef struct live_s {
  uint64_t ptr;
  int dev;
} live_t;

static void workload(msnap_allocator_t *a, int ndev, int ops, live_t *live,
                     int *nlive) {
  static const size_t sizes[] = {400, 512, 4096, 100000, 1 << 20,
                                 3 << 20, 12 << 20, 25 << 20};
  for (int i = 0; i < ops; i++) {
    uint64_t r = lcg();
    if (*nlive > 0 && r % 3 == 0) {
      int k = (int)(lcg() % (uint64_t)*nlive);
      assert_int_equal(msnap_free(a, live[k].ptr), 0);
      live[k] = live[--*nlive];
      continue;
    }
    if (r % 41 == 0) {
      assert_int_equal(msnap_empty_cache(a, -1), 0);
      continue;
    }
    int dev = (int)(lcg() % (uint64_t)ndev);
    size_t sz = sizes[lcg() % 8] + (size_t)(lcg() % 1000);
    uint64_t stream = (lcg() % 2) ? 0 : 0x5000;
    uint64_t p = 0;
    assert_int_equal(msnap_malloc(a, dev, sz, stream, &p), 0);
    live[*nlive].ptr = p;
    live[*nlive].dev = dev;
    ++*nlive;
  }
}

/* Replay device d's trace from empty and compare with the segments. */
static void replay_device(const msnap_snap_t *s, int d) {
  const msnap_trace_list_t *l = &s->device_traces[d];
  enum { MAXL = 4096 };
  static uint64_t addr[MAXL], req[MAXL], seg_a[MAXL], seg_s[MAXL];
  int n = 0, ns = 0;
  for (uint32_t i = 0; i < l->n; i++) {
    const msnap_strace_t *t = &l->v[i];
    switch (t->action) {
    case MSNAP_ACTION_ALLOC:
      assert_true(n < MAXL);
      addr[n] = t->addr;
      req[n++] = t->size;
      break;
    case MSNAP_ACTION_FREE_COMPLETED: {
      int k = 0;
      while (k < n && addr[k] != t->addr) k++;
      if (k == n) fail_msg("device %d entry %u: free_completed of 0x%llx "
                           "never allocated", d, i,
                           (unsigned long long)t->addr);
      assert_int_equal(req[k], t->size);
      addr[k] = addr[n - 1];
      req[k] = req[--n];
      break;
    }
    case MSNAP_ACTION_SEGMENT_ALLOC:
      seg_a[ns] = t->addr;
      seg_s[ns++] = t->size;
      break;
    case MSNAP_ACTION_SEGMENT_FREE: {
      int k = 0;
      while (k < ns && seg_a[k] != t->addr) k++;
      if (k == ns) fail_msg("device %d: segment_free of unknown 0x%llx", d,
                            (unsigned long long)t->addr);
      seg_a[k] = seg_a[ns - 1];
      seg_s[k] = seg_s[--ns];
      break;
    }
    default:
      break;
    }
  }
  /* live blocks == replayed allocations */
  int seen = 0, segs = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != d) continue;
    segs++;
    int k = 0;
    while (k < ns && (seg_a[k] != g->address || seg_s[k] != g->total_size))
      k++;
    if (k == ns) fail_msg("device %d: segment 0x%llx not in the replay", d,
                          (unsigned long long)g->address);
    for (uint32_t j = 0; j < g->nblocks; j++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + j];
      if (b->state == MSNAP_BLOCK_INACTIVE) continue;
      seen++;
      int m = 0;
      while (m < n && addr[m] != b->address) m++;
      if (m == n) fail_msg("device %d: live block 0x%llx not in the replay", d,
                           (unsigned long long)b->address);
      assert_int_equal(req[m], b->requested_size);
    }
  }
  assert_int_equal(seen, n);
  assert_int_equal(segs, ns);
}

/* Segment and block sums equal the allocator's statistics. */
static void sums_match_stats(msnap_allocator_t *a, const msnap_snap_t *s,
                             int d, uint64_t ws_reserved,
                             uint64_t ws_allocated) {
  uint64_t reserved = 0, allocated = 0, active = 0, requested = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != d) continue;
    reserved += g->total_size;
    allocated += g->allocated_size;
    active += g->active_size;
    requested += g->requested_size;
  }
  msnap_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  st.version = MSNAP_STATS_VERSION;
  assert_int_equal(msnap_stats_get(a, d, &st), 0);
  assert_int_equal(reserved - ws_reserved,
                   st.reserved_bytes[MSNAP_STAT_ALL].current);
  assert_int_equal(allocated - ws_allocated,
                   st.allocated_bytes[MSNAP_STAT_ALL].current);
  assert_int_equal(active - ws_allocated,
                   st.active_bytes[MSNAP_STAT_ALL].current);
}

/* ---- tests --------------------------------------------------------------------- */

static void test_dump_loads_in_cpython(void **state) {
  (void)state;
  REQUIRE_PYTHON();
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, 2);
  enable(a, MSNAP_CONTEXT_ALL, UINT64_MAX);
  assert_int_equal(msnap_set_memory_metadata("step=1"), 0);
  assert_int_equal(msnap_compile_context_push("Torch-Compiled Region: 0/0"),
                   0);
  uint64_t p1, p2, p3;
  assert_int_equal(msnap_malloc(a, 0, 400, 0, &p1), 0);
  assert_int_equal(msnap_malloc(a, 0, 5 << 20, 0x77, &p2), 0);
  assert_int_equal(msnap_malloc(a, 1, 1000, 0, &p3), 0);
  assert_int_equal(msnap_compile_context_pop(), 0);
  assert_int_equal(msnap_set_memory_metadata(""), 0);
  assert_int_equal(msnap_annotate_memory(a, p2, "weights"), 0);
  assert_int_equal(msnap_record_annotation(a, 0, "forward", true), 0);
  assert_int_equal(msnap_record_annotation(a, 0, "forward", false), 0);
  assert_int_equal(msnap_free(a, p1), 0);
  char path[512], out[4096];
  snprintf(path, sizeof path, "%s/full.pickle", tmpdir);
  assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
  int rc = run_check("full", path, "2", out, sizeof out);
  print_message("%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\"alloc\": 3"));
  assert_non_null(strstr(out, "\"annotate\": 1"));
  assert_non_null(strstr(out, "\"annotations\": 2"));
  /* A second dump shows the `snapshot` entry recorded by the first. */
  assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
  rc = run_check("full", path, "2", out, sizeof out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "\"snapshot\": 2"));

  /* In memory: the same bytes shape. */
  char *buf = NULL;
  size_t len = 0;
  assert_int_equal(msnap_snapshot_pickle(a, NULL, &buf, &len), 0);
  assert_true(len > 100);
  assert_int_equal((unsigned char)buf[0], 0x80);
  assert_int_equal(buf[1], 4);
  assert_int_equal(buf[len - 1], '.');
  free(buf);

  /* The model itself: metadata, compile context, frames. */
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  check_model(s);
  const msnap_trace_list_t *l = &s->device_traces[0];
  int saw = 0;
  for (uint32_t i = 0; i < l->n; i++) {
    const msnap_strace_t *t = &l->v[i];
    if (t->action != MSNAP_ACTION_ALLOC) continue;
    size_t n;
    assert_string_equal(msnap__snap_str(s, msnap__tattr(s, t)->user_metadata,
                                        &n),
                        "step=1");
    assert_string_equal(msnap__snap_str(s, msnap__tattr(s, t)->compile_context,
                                        &n),
                        "Torch-Compiled Region: 0/0");
    assert_true(t->frames > MSNAP_STACK_EMPTY);
    saw++;
  }
  assert_int_equal(saw, 2);
  msnap__snap_free(s);
  msnap_free(a, p2);
  msnap_free(a, p3);
  msnap_allocator_destroy(a);
}

static void test_snapshot_consistency(void **state) {
  (void)state;
  for (int profile = 0; profile < 2; profile++) {
    msnap_allocator_t *a = make(profile, 2);
    enable(a, MSNAP_CONTEXT_ALLOC, UINT64_MAX);
    live_t live[512];
    int nlive = 0;
    lcg_state = 99 + (uint64_t)profile;
    workload(a, 2, 300, live, &nlive);
    /* a pending free: used on another stream, event not complete */
    msnap_sim_set_manual_events(msnap_runtime_ctx(a), true);
    uint64_t pf;
    assert_int_equal(msnap_malloc(a, 0, 7000, 0, &pf), 0);
    assert_int_equal(msnap_record_stream(a, pf, 0x9999), 0);
    assert_int_equal(msnap_free(a, pf), 0);
    msnap_snap_t *s = NULL;
    assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
    check_model(s);
    int pending = 0;
    for (uint32_t i = 0; i < s->nblocks; i++)
      pending += s->blocks[i].state == MSNAP_BLOCK_ACTIVE_PENDING_FREE;
    assert_int_equal(pending, 1);
    for (int d = 0; d < 2; d++) {
      sums_match_stats(a, s, d, 0, 0);
      replay_device(s, d);
    }
    msnap__snap_free(s);
    msnap_sim_complete_events(msnap_runtime_ctx(a), 0, true);
    msnap_sim_set_manual_events(msnap_runtime_ctx(a), false);
    for (int i = 0; i < nlive; i++) assert_int_equal(msnap_free(a, live[i].ptr), 0);
    assert_int_equal(msnap_empty_cache(a, -1), 0);
    /* everything freed: the replay still matches (no live blocks) */
    assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
    for (int d = 0; d < 2; d++) replay_device(s, d);
    msnap__snap_free(s);
    msnap_allocator_destroy(a);
  }
}

static void test_filters_and_include_traces(void **state) {
  (void)state;
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, 2);
  enable(a, MSNAP_CONTEXT_STATE, 100);
  uint64_t p0, p1;
  assert_int_equal(msnap_malloc(a, 0, 1000, 0, &p0), 0);
  assert_int_equal(msnap_malloc(a, 1, 1000, 0, &p1), 0);
  msnap_snapshot_options_t o;
  msnap_snapshot_options_init(&o);
  assert_int_equal(o.device, -1);
  assert_true(o.include_traces);
  o.device = 1;
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, &o, &s), 0);
  assert_int_equal(s->ndevices, 2);
  assert_int_equal(s->device_traces[0].n, 0);
  assert_true(s->device_traces[1].n >= 2);
  for (uint32_t i = 0; i < s->nsegments; i++)
    assert_int_equal(s->segments[i].device, 1);
  /* context STATE: blocks have frames, entries do not */
  for (uint32_t i = 0; i < s->device_traces[1].n; i++)
    assert_int_equal(s->device_traces[1].v[i].frames, MSNAP_STACK_ABSENT);
  int framed = 0;
  for (uint32_t i = 0; i < s->nblocks; i++)
    framed += s->blocks[i].frames > MSNAP_STACK_EMPTY;
  assert_int_equal(framed, 1);
  msnap__snap_free(s);

  /* include_traces false: no lists at all, but a snapshot entry. */
  o.device = -1;
  o.include_traces = false;
  assert_int_equal(msnap__snapshot_take(a, &o, &s), 0);
  assert_int_equal(s->ndevices, 0);
  assert_int_equal(s->nsegments, 2);
  msnap__snap_free(s);
  o.include_traces = true;
  assert_int_equal(msnap__snapshot_take(a, &o, &s), 0);
  const msnap_trace_list_t *l = &s->device_traces[0];
  assert_int_equal(l->v[l->n - 1].action, MSNAP_ACTION_SNAPSHOT);
  assert_int_equal(l->v[l->n - 1].addr, 0);
  assert_int_equal(msnap__tattr(s, &l->v[l->n - 1])->stream, 0);
  assert_true(l->v[l->n - 1].size >= 1024); /* active bytes of device 0 */
  msnap__snap_free(s);

  /* A private pool that does not exist: no segments. */
  o.mempool = (msnap_mempool_id_t){0, 77};
  assert_int_equal(msnap__snapshot_take(a, &o, &s), 0);
  assert_int_equal(s->nsegments, 0);
  msnap__snap_free(s);
  /* Bad device. */
  o.mempool = (msnap_mempool_id_t){0, 0};
  o.device = 5;
  assert_int_equal(msnap__snapshot_take(a, &o, &s), MSNAP_EINVAL);
  assert_non_null(strstr(msnap_last_error(), "device 5"));

  /* segments_only: a bare list in CPython. */
  if (have_python()) {
    char path[512], out[1024];
    msnap_snapshot_options_init(&o);
    o.segments_only = true;
    snprintf(path, sizeof path, "%s/segs.pickle", tmpdir);
    assert_int_equal(msnap_dump_snapshot(a, &o, path), 0);
    int rc = run_check("segments", path, NULL, out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"segments\": 2"));
  }
  msnap_free(a, p0);
  msnap_free(a, p1);
  msnap_allocator_destroy(a);
}

static void test_overflow_reported(void **state) {
  (void)state;
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, 1);
  enable(a, MSNAP_CONTEXT_NEVER, 4);
  for (int i = 0; i < 10; i++) {
    uint64_t p;
    assert_int_equal(msnap_malloc(a, 0, 1000, 0, &p), 0);
    assert_int_equal(msnap_free(a, p), 0);
  }
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  assert_int_equal(s->device_traces[0].n, 4);
  /* newest entries kept: the last is a free_completed */
  assert_int_equal(s->device_traces[0].v[3].action,
                   MSNAP_ACTION_FREE_COMPLETED);
  const msnap_gv_t *st = &s->allocator_settings;
  assert_int_equal(st->kind, MSNAP_GV_DICT);
  bool found_over = false, found_npu = false;
  for (uint32_t i = 0; i + 1 < st->u.seq.n; i += 2) {
    size_t n;
    const char *k = msnap__snap_str(s, st->u.seq.items[i].u.s, &n);
    const msnap_gv_t *v = &st->u.seq.items[i + 1];
    if (strcmp(k, "trace_alloc_overflowed") == 0) {
      found_over = true;
      assert_true(v->u.b);
    }
    if (strcmp(k, "trace_alloc_max_entries") == 0)
      assert_int_equal(v->u.i, 4);
    if (strcmp(k, "trace_alloc_dropped") == 0) {
      assert_int_equal(v->kind, MSNAP_GV_LIST);
      assert_true(v->u.seq.items[0].u.i >= 16);
    }
    if (strcmp(k, "PYTORCH_NPU_ALLOC_CONF") == 0) found_npu = true;
  }
  assert_true(found_over);
  assert_true(found_npu);
  msnap__snap_free(s);
  msnap_allocator_destroy(a);
}


static const msnap_gv_t *setting(const msnap_snap_t *s, const char *key) {
  const msnap_gv_t *st = &s->allocator_settings;
  for (uint32_t i = 0; i + 1 < st->u.seq.n; i += 2) {
    size_t n;
    if (strcmp(msnap__snap_str(s, st->u.seq.items[i].u.s, &n), key) == 0)
      return &st->u.seq.items[i + 1];
  }
  fail_msg("allocator_settings has no %s", key);
  return NULL;
}

static void test_allocator_settings(void **state) {
  (void)state;
  msnap_options_t o;
  msnap_options_init(&o);
  setenv("MEMSNAP_SIM_DEVICES", "1", 1);
  o.profile = MSNAP_PROFILE_CUDA;
  o.runtime_name = "sim";
  o.alloc_conf = "max_split_size_mb:100,garbage_collection_threshold:0.6,"
                 "roundup_power2_divisions:[256:4,>:8]";
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  size_t n;
  const msnap_gv_t *v = setting(s, "PYTORCH_CUDA_ALLOC_CONF");
  assert_string_equal(msnap__snap_str(s, v->u.s, &n), o.alloc_conf);
  v = setting(s, "max_split_size");
  assert_int_equal(v->kind, MSNAP_GV_INT);
  assert_int_equal(v->u.i, 100 << 20);
  v = setting(s, "garbage_collection_threshold");
  assert_int_equal(v->kind, MSNAP_GV_FLOAT);
  assert_true(v->u.f > 0.59 && v->u.f < 0.61);
  v = setting(s, "expandable_segments");
  assert_int_equal(v->kind, MSNAP_GV_BOOL);
  v = setting(s, "roundup_power2_divisions");
  assert_int_equal(v->kind, MSNAP_GV_DICT);
  assert_int_equal(v->u.seq.n, 32);
  /* "256" is interval 8: 4 divisions; later intervals 8 */
  assert_string_equal(msnap__snap_str(s, v->u.seq.items[16].u.s, &n), "256");
  assert_int_equal(v->u.seq.items[17].u.i, 4);
  assert_int_equal(v->u.seq.items[31].u.i, 8);
  /* no history ever: capacity 0, nothing dropped */
  assert_int_equal(setting(s, "trace_alloc_max_entries")->u.i, 0);
  assert_false(setting(s, "trace_alloc_overflowed")->u.b);
  msnap__snap_free(s);
  msnap_allocator_destroy(a);
  /* default conf: unlimited max_split_size is -1, never 2^64-1 */
  a = make(MSNAP_PROFILE_NPU, 1);
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  assert_int_equal(setting(s, "max_split_size")->u.i, -1);
  v = setting(s, "PYTORCH_NPU_ALLOC_CONF");
  assert_string_equal(msnap__snap_str(s, v->u.s, &n), "");
  msnap__snap_free(s);
  msnap_allocator_destroy(a);
}

/* memsnap's workspace view (MEMSNAP_WORKSPACE_VIEW=memsnap); the npu
 * profile's default, torch_npu's view, is test_workspace_torch_npu_view. */
static void test_workspace(void **state) {
  (void)state;
  setenv("MEMSNAP_WORKSPACE_VIEW", "memsnap", 1);
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, 1);
  enable(a, MSNAP_CONTEXT_ALLOC, UINT64_MAX);
  uint64_t w1, w2, w3, p;
  assert_int_equal(msnap_malloc(a, 0, 3000, 0, &p), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 1000, 0, &w1), 0);
  assert_int_equal(msnap_workspace_free(a, w1), 0);
  /* reuse: same buffer while it is large enough */
  assert_int_equal(msnap_workspace_malloc(a, 0, (2 << 20) - 32, 0, &w2), 0);
  assert_int_equal(w2, w1);
  assert_int_equal(msnap_workspace_free(a, w2), 0);
  /* grow: a new 4 MiB buffer replaces it */
  assert_int_equal(msnap_workspace_malloc(a, 0, (2 << 20) - 31, 0, &w2), 0);
  /* another stream, still allocated at snapshot time */
  assert_int_equal(msnap_workspace_malloc(a, 0, 5000, 0x42, &w3), 0);
  uint64_t wr, wa;
  msnap__ws_totals(a, 0, &wr, &wa);
  assert_int_equal(wr, (4u << 20) + (2u << 20));
  assert_int_equal(wa, wr);
  char wmsg[256];
  if (msnap__ws_check(a, wmsg, sizeof wmsg) != 0) fail_msg("%s", wmsg);
  assert_int_equal(msnap_workspace_free(a, w2), 0);
  assert_int_equal(msnap_workspace_free(a, w2), MSNAP_EBADPTR);
  assert_non_null(strstr(msnap_last_error(), "not a live workspace"));

  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  check_model(s);
  sums_match_stats(a, s, 0, 6u << 20, 2u << 20);
  int ws_segs = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (i > 0) assert_true(g->address > s->segments[i - 1].address);
    if (g->address != w2 && g->address != w3) continue;
    ws_segs++;
    assert_int_equal(g->nblocks, 1);
    assert_true(g->is_large);
    const msnap_sblock_t *b = &s->blocks[g->first_block];
    if (g->address == w3) {
      assert_int_equal(b->state, MSNAP_BLOCK_ACTIVE_ALLOCATED);
      assert_int_equal(b->requested_size, 5000);
    } else {
      assert_int_equal(b->state, MSNAP_BLOCK_INACTIVE);
    }
  }
  assert_int_equal(ws_segs, 2);
  /* synthetic entries first: workspace_snapshot, segment_alloc, [alloc] */
  const msnap_trace_list_t *l = &s->device_traces[0];
  assert_true(l->n >= 5);
  int nws = 0, nalloc_ws = 0;
  for (uint32_t i = 0; i < 5; i++) {
    nws += l->v[i].action == MSNAP_ACTION_WORKSPACE_SNAPSHOT;
    nalloc_ws += l->v[i].action == MSNAP_ACTION_ALLOC;
  }
  assert_int_equal(nws, 2);
  assert_int_equal(nalloc_ws, 1);
  for (uint32_t i = 1; i < l->n; i++)
    assert_true(l->v[i].time_us >= l->v[i - 1].time_us);
  msnap__snap_free(s);

  if (have_python()) {
    char path[512], out[1024];
    snprintf(path, sizeof path, "%s/ws.pickle", tmpdir);
    assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
    int rc = run_check("full", path, "1", out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"workspace_snapshot\": 2"));
  }
  /* empty_cache keeps the allocated buffer, frees the other */
  assert_int_equal(msnap_workspace_empty_cache(a, 0), 0);
  msnap__ws_totals(a, 0, &wr, &wa);
  assert_int_equal(wr, 2u << 20);
  assert_int_equal(msnap_workspace_free(a, w3), 0);
  assert_int_equal(msnap_workspace_empty_cache(a, -1), 0);
  msnap__ws_totals(a, 0, &wr, &wa);
  assert_int_equal(wr, 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 0, 0, &w1), 0);
  assert_int_equal(w1, 0);
  assert_int_equal(msnap_workspace_malloc(a, 3, 10, 0, &w1), MSNAP_EINVAL);
  /* caching disabled: every request is its own runtime allocation */
  void *rt = msnap_runtime_ctx(a);
  uint64_t live0 = msnap_sim_live_allocations(rt);
  assert_int_equal(msnap_set_caching_enabled(a, false), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 100, 0, &w1), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 100, 0, &w2), 0);
  assert_int_not_equal(w1, w2);
  assert_int_equal(msnap_sim_live_allocations(rt), live0 + 2);
  assert_int_equal(msnap_workspace_free(a, w1), 0);
  assert_int_equal(msnap_workspace_free(a, w2), 0);
  assert_int_equal(msnap_sim_live_allocations(rt), live0);
  assert_int_equal(msnap_set_caching_enabled(a, true), 0);
  msnap_free(a, p);
  msnap_allocator_destroy(a);
  unsetenv("MEMSNAP_WORKSPACE_VIEW");
}

/*
 * The npu profile's default workspace view is torch_npu's: Module.cpp
 * THNPModule_memorySnapshot appends NPUWorkspaceAllocator::snapshot()'s
 * segments after the caching allocator's (get_segm: one block, allocated
 * never set, requested_size 0) and, while history records
 * (NPUWorkspaceAllocator.cpp get_trace), puts three entries per buffer --
 * WORKSPACE_SNAPSHOT, SEGMENT_ALLOC, ALLOC, each sized to the buffer --
 * in front of the device trace.
 */
static void test_workspace_torch_npu_view(void **state) {
  (void)state;
  unsetenv("MEMSNAP_WORKSPACE_VIEW");
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, 1);
  uint64_t p, q, w1, w2;
  assert_int_equal(msnap_malloc(a, 0, 3000, 0, &p), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 5000, 0x42, &w1), 0);
  assert_int_equal(msnap_workspace_malloc(a, 0, 3u << 20, 0x43, &w2), 0);
  assert_int_equal(msnap_workspace_free(a, w2), 0);
  assert_int_equal(msnap_malloc(a, 0, 30u << 20, 0, &q), 0);
  /* History off: segments, no synthetic entries. */
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  check_model(s);
  assert_int_equal(s->nsegments, 4);
  /* the caching segments first, sorted; then the buffers in creation
   * order */
  assert_true(s->segments[0].address < s->segments[1].address);
  assert_int_equal(s->segments[2].address, w1);
  assert_int_equal(s->segments[3].address, w2);
  for (uint32_t i = 2; i < 4; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    const msnap_sblock_t *b = &s->blocks[g->first_block];
    assert_int_equal(g->nblocks, 1);
    assert_true(g->is_large);
    assert_int_equal(g->allocated_size, 0);
    assert_int_equal(g->active_size, 0);
    assert_int_equal(g->requested_size, 0);
    assert_int_equal(b->state, MSNAP_BLOCK_INACTIVE);
    assert_int_equal(b->requested_size, 0);
  }
  assert_int_equal(s->segments[2].total_size, 2u << 20);
  assert_int_equal(s->segments[3].total_size, 4u << 20);
  for (uint32_t i = 0; i < s->device_traces[0].n; i++)
    assert_int_not_equal(s->device_traces[0].v[i].action,
                         MSNAP_ACTION_WORKSPACE_SNAPSHOT);
  msnap__snap_free(s);
  /* History on: three entries per buffer, sized to the buffer. */
  enable(a, MSNAP_CONTEXT_ALLOC, UINT64_MAX);
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  check_model(s);
  const msnap_trace_list_t *l = &s->device_traces[0];
  assert_true(l->n >= 6);
  static const int acts[3] = {MSNAP_ACTION_WORKSPACE_SNAPSHOT,
                              MSNAP_ACTION_SEGMENT_ALLOC, MSNAP_ACTION_ALLOC};
  for (uint32_t i = 0; i < 6; i++) {
    uint64_t w = i < 3 ? w1 : w2;
    assert_int_equal(l->v[i].action, acts[i % 3]);
    assert_int_equal(l->v[i].addr, w);
    assert_int_equal(l->v[i].size, i < 3 ? 2u << 20 : 4u << 20);
    assert_int_equal(msnap__tattr(s, &l->v[i])->stream,
                     i < 3 ? 0x42 : 0x43);
  }
  msnap__snap_free(s);
  if (have_python()) {
    char path[512], out[1024];
    snprintf(path, sizeof path, "%s/ws_npu.pickle", tmpdir);
    assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
    int rc = run_check("full", path, "1", out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"workspace_snapshot\": 2"));
  }
  assert_int_equal(msnap_workspace_free(a, w1), 0);
  assert_int_equal(msnap_free(a, p), 0);
  assert_int_equal(msnap_free(a, q), 0);
  msnap_allocator_destroy(a);
}

static void test_allocation_traceback(void **state) {
  (void)state;
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, 1);
  uint64_t p0, p1;
  char *buf = (char *)1;
  size_t len = 1;
  /* no context at allocation time: None */
  assert_int_equal(msnap_malloc(a, 0, 100, 0, &p0), 0);
  assert_int_equal(msnap_allocation_traceback(a, p0, &buf, &len), 0);
  assert_null(buf);
  assert_int_equal(len, 0);
  enable(a, MSNAP_CONTEXT_STATE, 1);
  assert_int_equal(msnap_malloc(a, 0, 100, 0, &p1), 0);
  assert_int_equal(msnap_allocation_traceback(a, p1, &buf, &len), 0);
  assert_non_null(buf);
  /* not a live base pointer (interior, never allocated): MSNAP_EBADPTR,
   * as msnap_annotate_memory; the out-parameters stay untouched */
  char *b2 = (char *)1;
  size_t l2 = 7;
  assert_int_equal(msnap_allocation_traceback(a, p1 + 8, &b2, &l2),
                   MSNAP_EBADPTR);
  assert_ptr_equal(b2, (char *)1);
  assert_int_equal(l2, 7);
  char want[96];
  snprintf(want, sizeof want,
           "allocation_traceback: no live allocation found at pointer "
           "0x%" PRIx64, p1 + 8);
  assert_string_equal(msnap_last_error(), want);
  assert_int_equal(msnap_allocation_traceback(a, 0xdead, &b2, &l2),
                   MSNAP_EBADPTR);
  assert_int_equal(msnap_annotate_memory(a, 0xdead, "x"), MSNAP_EBADPTR);
  assert_ptr_equal(b2, (char *)1);
  /* NULL arguments: MSNAP_EINVAL */
  assert_int_equal(msnap_allocation_traceback(NULL, p1, &b2, &l2),
                   MSNAP_EINVAL);
  assert_int_equal(msnap_allocation_traceback(a, p1, NULL, &l2),
                   MSNAP_EINVAL);
  if (have_python()) {
    char path[512], out[1024];
    free(buf);
    assert_int_equal(msnap_allocation_traceback(a, p1, &buf, &len), 0);
    snprintf(path, sizeof path, "%s/tb.pickle", tmpdir);
    FILE *f = fopen(path, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    int rc = run_check("frames", path, NULL, out, sizeof out);
    print_message("%s", out);
    assert_int_equal(rc, 0);
  }
  free(buf);
  /* Stacks survive disabling for live blocks. */
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.enabled = false;
  assert_int_equal(msnap_record_history(a, &o), 0);
  assert_int_equal(msnap_allocation_traceback(a, p1, &buf, &len), 0);
  assert_non_null(buf);
  free(buf);
  /* a freed pointer is no longer live */
  assert_int_equal(msnap_free(a, p0), 0);
  assert_int_equal(msnap_allocation_traceback(a, p0, &b2, &l2),
                   MSNAP_EBADPTR);
  assert_ptr_equal(b2, (char *)1);
  msnap_free(a, p1);
  msnap_allocator_destroy(a);
}

/* msnap_set_process_rank: a known rank and local rank must be below a
 * known world size (MSNAP_EINVAL otherwise, naming the values), and a
 * refused call changes nothing. */
static void test_set_process_rank(void **state) {
  (void)state;
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("LOCAL_RANK");
  msnap_process_t p;
  assert_int_equal(msnap_set_process_rank(5, 8, 1), 0);
  msnap__process_get(&p);
  assert_int_equal(p.rank, 5);
  assert_int_equal(p.world_size, 8);
  assert_int_equal(p.local_rank, 1);
  /* local rank at or above the world size */
  assert_int_equal(msnap_set_process_rank(1, 4, 4), MSNAP_EINVAL);
  assert_string_equal(msnap_last_error(),
                      "set_process_rank: invalid rank 1 / world size 4 / "
                      "local rank 4 (-1 = unknown)");
  assert_int_equal(msnap_set_process_rank(-1, 2, 7), MSNAP_EINVAL);
  /* as a rank at or above it */
  assert_int_equal(msnap_set_process_rank(4, 4, 0), MSNAP_EINVAL);
  assert_int_equal(msnap_set_process_rank(0, 0, 0), MSNAP_EINVAL);
  assert_int_equal(msnap_set_process_rank(0, 4, -2), MSNAP_EINVAL);
  msnap__process_get(&p); /* unchanged */
  assert_int_equal(p.rank, 5);
  assert_int_equal(p.world_size, 8);
  assert_int_equal(p.local_rank, 1);
  /* the last local rank, and any local rank under an unknown world size */
  assert_int_equal(msnap_set_process_rank(3, 4, 3), 0);
  msnap__process_get(&p);
  assert_int_equal(p.local_rank, 3);
  assert_int_equal(msnap_set_process_rank(-1, -1, 9), 0);
  msnap__process_get(&p);
  assert_int_equal(p.rank, -1);
  assert_int_equal(p.world_size, -1);
  assert_int_equal(p.local_rank, 9);
  assert_int_equal(msnap_set_process_rank(-1, -1, -1), 0);
  msnap__process_get(&p);
  assert_int_equal(p.local_rank, -1);
}

static void test_dump_failures_leave_no_file(void **state) {
  (void)state;
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, 1);
  enable(a, MSNAP_CONTEXT_ALL, UINT64_MAX);
  uint64_t p;
  assert_int_equal(msnap_malloc(a, 0, 100, 0, &p), 0);
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/fail", tmpdir);
  mkdir(dir, 0700);
  rm_dir_files(dir);
  /* simulated ENOSPC after 100 bytes */
  snprintf(path, sizeof path, "%s/x.pickle", dir);
  msnap__dump_set_fault(100, MSNAP_ENOSPC);
  assert_int_equal(msnap_dump_snapshot(a, NULL, path), MSNAP_ENOSPC);
  assert_non_null(strstr(msnap_last_error(), "x.pickle"));
  assert_int_equal(count_files(dir, "", NULL), 2); /* "." and ".." */
  snprintf(path, sizeof path, "%s/r.csv", dir);
  assert_int_equal(msnap_write_usage_report(a, path), MSNAP_ENOSPC);
  assert_int_equal(count_files(dir, "", NULL), 2);
  msnap__dump_set_fault(UINT64_MAX, 0);
  /* a directory that does not exist */
  snprintf(path, sizeof path, "%s/no/such/dir/x.pickle", tmpdir);
  int rc = msnap_dump_snapshot(a, NULL, path);
  assert_true(rc == MSNAP_EIO || rc == MSNAP_ENOENT);
  assert_non_null(strstr(msnap_last_error(), "no/such/dir"));
  /* and then a good dump + report */
  snprintf(path, sizeof path, "%s/ok.pickle", dir);
  assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
  snprintf(path, sizeof path, "%s/ok.csv", dir);
  assert_int_equal(msnap_write_usage_report(a, path), 0);
  assert_int_equal(count_files(dir, "ok.", NULL), 2);
  assert_int_equal(count_files(dir, "", NULL), 4);
  if (have_python()) {
    char out[256];
    assert_int_equal(run_check("csv", path, NULL, out, sizeof out), 0);
  }
  /* a runtime that cannot report free/total: empty fields, a note */
  msnap_sim_fail_nth(msnap_runtime_ctx(a), "mem_get_info", 1);
  snprintf(path, sizeof path, "%s/note.csv", dir);
  assert_int_equal(msnap_write_usage_report(a, path), 0);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char text[4096];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  assert_non_null(strstr(text, "0,all,,,"));
  assert_non_null(strstr(text, "runtime could not report total/free memory"));
  assert_non_null(strstr(text, "0,workspace,"));
  msnap_free(a, p);
  msnap_allocator_destroy(a);
}


/* ---- interpreter frames merged with C frames ---------------------------- */

static int hook_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
  int n = max < 2 ? max : 2;
  for (int i = 0; i < n; i++) {
    frames[i][0] = 0xc0de00 + (uintptr_t)i;
    frames[i][1] = (uintptr_t)i;
  }
  return n;
}
static int hook_resolve(void *ctx, const uintptr_t f[2], const char **name,
                        const char **filename, int64_t *line) {
  (void)ctx;
  static const char *names[] = {"py_inner", "py_outer"};
  *name = names[f[1]];
  *filename = "train.py";
  *line = 100 + (int64_t)f[1];
  return 0;
}

static volatile int no_tail;
/* Stands for CPython's _PyEval_EvalFrameDefault: the Python frame it runs
 * must be placed just before it. */
__attribute__((noinline)) uint32_t fake_PyEval_EvalFrameDefault(void);
__attribute__((noinline)) uint32_t fake_PyEval_EvalFrameDefault(void) {
  uint32_t id = msnap__stack_capture(MSNAP_STACKS_PYTHON | MSNAP_STACKS_CPP,
                                     0);
  no_tail++;
  return id;
}

static void test_python_c_merge(void **state) {
  (void)state;
  msnap_frame_hook_t h = {.capture = hook_capture, .resolve = hook_resolve};
  assert_int_equal(msnap_set_frame_hook(&h), 0);
  uint32_t raw = fake_PyEval_EvalFrameDefault();
  assert_int_not_equal(raw, 0);
  msnap_snap_t *s = msnap__snap_new();
  msnap_ssegment_t *g = msnap__snap_add_segment(s);
  g->frames = raw; /* a raw id with its reference, as collected */
  msnap_sblock_t *b = msnap__snap_add_block(s);
  b->frames = 0;
  g = &s->segments[0];
  g->first_block = 0;
  g->nblocks = 1;
  assert_int_equal(msnap__snap_import_stacks(s, NULL, true), 0);
  check_model(s);
  assert_int_equal(s->blocks[0].frames, MSNAP_STACK_EMPTY);
  msnap_stack_t st = s->segments[0].frames;
  assert_true(st > MSNAP_STACK_EMPTY);
  const char *names[64];
  uint32_t ids[64];
  uint32_t n = msnap__stack_frames(s, st, ids, 64);
  if (n > 64) n = 64;
  for (uint32_t i = 0; i < n; i++) {
    size_t l;
    names[i] = msnap__snap_str(s, s->frames[ids[i]].name, &l);
  }
  /* C frames innermost first; py_inner just before the eval frame;
   * py_outer (no second eval frame) appended at the end. */
  int eval = -1;
  for (uint32_t i = 0; i < n; i++)
    if (strstr(names[i], "fake_PyEval_EvalFrameDefault")) eval = (int)i;
  if (strcmp(msnap__symbolizer_name(), "libdw") == 0 || eval >= 0) {
    assert_true(eval >= 1);
    assert_string_equal(names[eval - 1], "py_inner");
  }
  assert_string_equal(names[n - 1], "py_outer");
  msnap__snap_free(s);
  assert_int_equal(msnap_set_frame_hook(NULL), 0);
}

/* ---- threads: recording, snapshots and dumps at once --------------------- */

typedef struct worker_s {
  msnap_allocator_t *a;
  int id;
} worker_t;

static int tl_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
  /* a per-thread, per-call-site stack */
  uintptr_t self = (uintptr_t)pthread_self();
  int n = max < 6 ? max : 6;
  for (int i = 0; i < n; i++) {
    frames[i][0] = self + (uintptr_t)i;
    frames[i][1] = (uintptr_t)(i + (lcg_state & 1));
  }
  return n;
}

static int tl_resolve(void *ctx, const uintptr_t f[2], const char **name,
                      const char **filename, int64_t *line) {
  (void)ctx;
  *name = "worker_step";
  *filename = "worker.py";
  *line = (int64_t)f[1];
  return 0;
}

static void *worker(void *p) {
  worker_t *w = p;
  uint64_t ptrs[32] = {0};
  uint64_t seed = 777 + (uint64_t)w->id;
  for (int i = 0; i < 3000; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((seed >> 33) % 32);
    if (ptrs[k]) {
      assert_int_equal(msnap_free(w->a, ptrs[k]), 0);
      ptrs[k] = 0;
    } else {
      size_t sz = 512 + (size_t)((seed >> 40) % (3u << 20));
      assert_int_equal(msnap_malloc(w->a, (int)((seed >> 20) & 1), sz,
                                    (uint64_t)w->id, &ptrs[k]), 0);
      if ((seed >> 50) % 8 == 0)
        assert_int_equal(msnap_annotate_memory(w->a, ptrs[k], "t"), 0);
    }
    if (i % 500 == 0) msnap_set_memory_metadata(i % 1000 ? "odd" : "");
  }
  for (int k = 0; k < 32; k++)
    if (ptrs[k]) assert_int_equal(msnap_free(w->a, ptrs[k]), 0);
  msnap_set_memory_metadata("");
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  msnap__stack_tcache_flush();
  size_t live0 = msnap__stack_live();
  msnap_frame_hook_t h = {.capture = tl_capture, .resolve = tl_resolve};
  assert_int_equal(msnap_set_frame_hook(&h), 0);
  msnap_allocator_t *a = make(MSNAP_PROFILE_NPU, 2);
  msnap_history_options_t o;
  msnap_history_options_init(&o);
  o.stacks = MSNAP_STACKS_PYTHON;
  o.max_entries = 5000;
  assert_int_equal(msnap_record_history(a, &o), 0);
  enum { NT = 4 };
  pthread_t th[NT];
  worker_t w[NT];
  for (int i = 0; i < NT; i++) {
    w[i] = (worker_t){a, i + 1};
    assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
  }
  char path[512];
  snprintf(path, sizeof path, "%s/threads.pickle", tmpdir);
  for (int i = 0; i < 20; i++) {
    msnap_snap_t *s = NULL;
    assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
    check_model(s);
    msnap__snap_free(s);
    if (i % 5 == 0) assert_int_equal(msnap_dump_snapshot(a, NULL, path), 0);
  }
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  char msg[256];
  assert_int_equal(msnap_check_invariants(a, msg, sizeof msg), 0);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  for (uint32_t i = 0; i < s->nblocks; i++)
    assert_int_not_equal(s->blocks[i].state, MSNAP_BLOCK_ACTIVE_ALLOCATED);
  msnap__snap_free(s);
  /* Everything freed, history off: every stack is gone again. */
  o.enabled = false;
  assert_int_equal(msnap_record_history(a, &o), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(msnap_set_frame_hook(NULL), 0);
  msnap__stack_tcache_flush();
  assert_int_equal(msnap__stack_check(msg, sizeof msg), 0);
  assert_int_equal(msnap__stack_live(), live0);
}

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/msnap_rec_XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char p[512];
  snprintf(p, sizeof p, "%s/fail", tmpdir);
  rm_dir_files(p);
  rmdir(p);
  rm_dir_files(tmpdir);
  rmdir(tmpdir);
  return 0;
}

/* Every int of allocator_settings, recursively, within 2^53 - 1 (what a
 * JavaScript viewer reads exactly). */
static void ints_js_safe(const msnap_gv_t *v) {
  if (v->kind == MSNAP_GV_INT) {
    assert_true(v->u.i <= (int64_t)((1ull << 53) - 1));
    assert_true(v->u.i >= -(int64_t)((1ull << 53) - 1));
  }
  if (v->kind == MSNAP_GV_DICT || v->kind == MSNAP_GV_LIST)
    for (uint32_t i = 0; i < v->u.seq.n; i++) ints_js_safe(&v->u.seq.items[i]);
}

/* trace_alloc_max_entries: the ring capacity when it is at most 2^53 - 1,
 * -1 ("unlimited") above (the default UINT64_MAX, Python's sys.maxsize),
 * 0 before any history; no other setting above 2^53 - 1 either. */
static void test_settings_js_safe(void **state) {
  (void)state;
  static const struct {
    uint64_t max_entries;
    int64_t written;
  } cases[] = {
      {UINT64_MAX, -1},
      {(uint64_t)INT64_MAX, -1}, /* sys.maxsize */
      {1ull << 53, -1},
      {(1ull << 53) - 1, (int64_t)((1ull << 53) - 1)},
      {100000, 100000},
      {1, 1},
  };
  msnap_allocator_t *a = make(MSNAP_PROFILE_CUDA, 1);
  msnap_snap_t *s = NULL;
  assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
  assert_int_equal(setting(s, "trace_alloc_max_entries")->u.i, 0);
  msnap__snap_free(s);
  /* Huge thresholds from the conf are limits too. */
  assert_int_equal(msnap_set_allocator_settings(
                       a, "pinned_max_cached_size_mb:17179869184,"
                          "pinned_max_round_threshold_mb:1024"),
                   0);
  msnap_history_options_t ho;
  msnap_history_options_init(&ho);
  assert_int_equal(ho.max_entries, UINT64_MAX);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    enable(a, MSNAP_CONTEXT_STATE, cases[i].max_entries);
    uint64_t p;
    assert_int_equal(msnap_malloc(a, 0, 1000, 0, &p), 0);
    assert_int_equal(msnap_free(a, p), 0);
    assert_int_equal(msnap__snapshot_take(a, NULL, &s), 0);
    assert_int_equal(setting(s, "trace_alloc_max_entries")->u.i,
                     cases[i].written);
    assert_int_equal(setting(s, "max_split_size")->u.i, -1);
    assert_int_equal(setting(s, "max_cached_size")->u.i, -1);
    assert_int_equal(setting(s, "max_round_threshold")->u.i, 1ll << 30);
    ints_js_safe(&s->allocator_settings);
    msnap__snap_free(s);
  }
  msnap_allocator_destroy(a);
}

int main(void) {
  unsetenv("OOM_SNAPSHOT_ENABLE");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dump_loads_in_cpython),
      cmocka_unit_test(test_snapshot_consistency),
      cmocka_unit_test(test_filters_and_include_traces),
      cmocka_unit_test(test_overflow_reported),
      cmocka_unit_test(test_allocator_settings),
      cmocka_unit_test(test_settings_js_safe),
      cmocka_unit_test(test_workspace),
      cmocka_unit_test(test_workspace_torch_npu_view),
      cmocka_unit_test(test_allocation_traceback),
      cmocka_unit_test(test_set_process_rank),
      cmocka_unit_test(test_dump_failures_leave_no_file),
      cmocka_unit_test(test_python_c_merge),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
