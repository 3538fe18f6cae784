/*
 * test_snapshot.c -- snapshot reading and writing against CPython:
 *   - every real input (../shared/real_inputs) is read into the model,
 *     checked (msnap__snap_check_model) and its figures compared with the
 *     ones CPython's pickle computes; then written back and compared with
 *     CPython (equal objects, same key order, protocol 4, MemoryViz opcodes
 *     only).  Skipped LOUDLY when the folder is missing.
 *   - synthetic snapshots of every generation and key variant round-trip;
 *   - hostile input: truncation at every byte of a real file, random bit
 *     flips, code-executing pickles -- errors, never crashes;
 *   - a live model (not from the reader) is written with every key;
 *   - values >= 2^63 are refused by the writer, > 64 bits by the reader;
 *   - the reader's stack encoder matches msnap__stack_put at every length
 *     boundary, and merging appended stacks gives one id per content.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "canon.h"
#include "testutil.h"

static char cmd[16384];

static int py(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

/* Figures of a model, in snapcheck.py's "key value" format. */
static void model_figures(const msnap_snap_t *s, char *out, size_t len) {
  uint64_t total = 0, bsize = 0, alloc = 0, trace_size = 0, entries = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    total += s->segments[i].total_size;
  for (uint32_t i = 0; i < s->nblocks; i++) {
    bsize += s->blocks[i].size;
    alloc += s->blocks[i].state == MSNAP_BLOCK_ACTIVE_ALLOCATED;
  }
  for (uint32_t d = 0; d < s->ndevices; d++)
    for (uint32_t i = 0; i < s->device_traces[d].n; i++) {
      trace_size += s->device_traces[d].v[i].size;
      entries++;
    }
  int n = snprintf(out, len,
                   "segments %u\nblocks %u\ntotal_size %llu\nblock_size "
                   "%llu\nactive_allocated %llu\ndevices %u\ntrace_entries "
                   "%llu\n",
                   s->nsegments, s->nblocks, (unsigned long long)total,
                   (unsigned long long)bsize, (unsigned long long)alloc,
                   s->ndevices, (unsigned long long)entries);
  for (uint32_t d = 0; d < s->ndevices; d++)
    n += snprintf(out + n, len - (size_t)n, "device%u %u\n", d,
                  s->device_traces[d].n);
  snprintf(out + n, len - (size_t)n, "trace_size %llu\nannotations %u\n",
           (unsigned long long)trace_size, s->nannotations);
}

static int is_snapshot_file(const char *name) {
  size_t n = strlen(name);
  return (n > 7 && strcmp(name + n - 7, ".pickle") == 0) ||
         (n > 4 && strcmp(name + n - 4, ".pkl") == 0);
}

static void test_real_inputs(void **state) {
  (void)state;
  const char *dir = tu_real_inputs();
  if (!dir) {
    fprintf(stderr, "SKIP test_real_inputs: real inputs folder "
                    "../shared/real_inputs is missing\n");
    skip();
  }
  char *tmp = tu_tmpdir();
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  int nfiles = 0;
  while ((e = readdir(d))) {
    if (!is_snapshot_file(e->d_name)) continue;
    char path[8192], out[8192], want[8192], got[8192];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    int rc = msnap__snap_read_file(path, &s, &err);
    if (rc) fprintf(stderr, "%s: %s\n", e->d_name, err.msg);
    assert_int_equal(rc, 0);
    char msg[256];
    assert_int_equal(msnap__snap_check_model(s, msg, sizeof msg), 0);
    /* figures against CPython */
    snprintf(out, sizeof out, "%s/figures.txt", tmp);
    assert_int_equal(py("python3 '%s/tests/pickle/snapcheck.py' figures "
                        "'%s' > '%s'",
                        tu_src(), path, out),
                     0);
    size_t wn = 0;
    char *w = (char *)tu_slurp(out, &wn);
    assert_non_null(w);
    memcpy(want, w, wn);
    want[wn] = 0;
    free(w);
    model_figures(s, got, sizeof got);
    if (strcmp(want, got))
      fprintf(stderr, "%s:\nCPython:\n%s\nmodel:\n%s\n", e->d_name, want,
              got);
    assert_string_equal(want, got);
    /* 2.0 files: computed block addresses, K_ADDRESS clear */
    if (s->generation == MSNAP_GEN_2_0) {
      assert_true(s->nhistories > 0);
      const msnap_ssegment_t *g = &s->segments[0];
      assert_int_equal(s->blocks[g->first_block].address, g->address);
      assert_false(s->blocks[g->first_block].keys & MSNAP_K_ADDRESS);
    }
    /* write back, compare with CPython */
    snprintf(out, sizeof out, "%s/%s", tmp, e->d_name);
    assert_int_equal(msnap__snap_write_file(s, out, false), 0);
    int same = py("python3 '%s/tests/pickle/snapcheck.py' same '%s' '%s'",
                  tu_src(), path, out);
    if (same) fprintf(stderr, "%s: rewrite differs\n", e->d_name);
    assert_int_equal(same, 0);
    /* and the rewrite reads back to the same figures */
    msnap_snap_t *s2 = NULL;
    assert_int_equal(msnap__snap_read_file(out, &s2, &err), 0);
    char got2[8192];
    model_figures(s2, got2, sizeof got2);
    assert_string_equal(got, got2);
    assert_int_equal(s2->generation, s->generation);
    assert_int_equal(s2->top_keys, s->top_keys);
    msnap__snap_free(s2);
    msnap__snap_free(s);
    nfiles++;
  }
  closedir(d);
  assert_true(nfiles >= 8);
  tu_rmrf(tmp);
  free(tmp);
}

static void test_synthetic_generations(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_int_equal(py("python3 '%s/tests/pickle/snapcheck.py' synth '%s' "
                      ">/dev/null",
                      tu_src(), tmp),
                   0);
  static const struct {
    const char *name;
    int gen;
    const char *flags;
  } cases[] = {
      {"newest", MSNAP_GEN_CURRENT, ""},
      {"newest_p2", MSNAP_GEN_CURRENT, ""},
      {"newest_p5", MSNAP_GEN_CURRENT, ""},
      {"v22", MSNAP_GEN_2_2, ""},
      {"minimal", MSNAP_GEN_2_1, "--unordered"},
      {"empty_traces", MSNAP_GEN_2_1, ""},
      {"npu", MSNAP_GEN_CURRENT, ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/%s.pickle", tmp, cases[i].name);
    snprintf(out, sizeof out, "%s/%s.out", tmp, cases[i].name);
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    int rc = msnap__snap_read_file(in, &s, &err);
    if (rc) fprintf(stderr, "%s: %s\n", cases[i].name, err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(s->generation, cases[i].gen);
    assert_int_equal(msnap__snap_write_file(s, out, false), 0);
    int same = py("python3 '%s/tests/pickle/snapcheck.py' same '%s' '%s' %s",
                  tu_src(), in, out, cases[i].flags);
    if (same) fprintf(stderr, "%s: rewrite differs\n", cases[i].name);
    assert_int_equal(same, 0);
    if (strcmp(cases[i].name, "npu") == 0) {
      const msnap_strace_t *t = &s->device_traces[0].v[0];
      assert_int_equal(t->action, MSNAP_ACTION_WORKSPACE_SNAPSHOT);
      assert_true(msnap__tattr(s, t)->keys & MSNAP_K_POOL_ID);
      assert_false(msnap__tattr(s, t)->keys & (MSNAP_K_TIME | MSNAP_K_COMPILE_CTX));
    }
    if (strcmp(cases[i].name, "newest") == 0) {
      assert_int_equal(s->ndevices, 3);
      assert_int_equal(s->device_traces[2].n, 1500);
      assert_int_equal(s->nhost_segments, 1);
      assert_int_equal(s->nhost_blocks, 1);
      assert_int_equal(s->host_traces.n, 1);
      assert_int_equal(s->top_keys, 0x3f);
      const msnap_strace_t *oom = &s->device_traces[0].v[2];
      assert_int_equal(oom->action, MSNAP_ACTION_OOM);
      assert_true(msnap__tattr(s, oom)->keys & MSNAP_K_DEVICE_FREE);
      assert_int_equal(oom->addr, 1024);
      const msnap_strace_t *fr = &s->device_traces[0].v[4];
      assert_int_equal(fr->action, MSNAP_ACTION_UNKNOWN);
      assert_string_equal(msnap__snap_str(s, msnap__tattr(s, fr)->action_str, NULL), "free");
      assert_int_equal(s->segments[1].pool_id.first, 1);
      assert_int_equal(s->segments[1].pool_id.second, 7);
      assert_int_equal(s->blocks[1].state, MSNAP_BLOCK_ACTIVE_PENDING_FREE);
      assert_int_equal(s->nannotations, 2);
      /* the shared stack is interned once */
      assert_int_equal(s->device_traces[0].v[0].frames, s->blocks[0].frames);
      /* JSON has the same structure (tuples as arrays) once its
       * `frames` stack ids are resolved through the two tables */
      assert_int_equal(msnap__snap_write_file(s, out, true), 0);
      assert_int_equal(
          py("python3 -c \"import json,pickle,sys\n"
             "a=json.load(open('%s'))\n"
             "F,S=a.pop('frame_table'),a.pop('stack_table')\n"
             "a.pop('format')\n"
             "def n(x,k=None):\n"
             " if k=='frames' and isinstance(x,int):"
             " return [n(F[i]) for i in S[x]]\n"
             " if isinstance(x,(list,tuple)): return [n(v) for v in x]\n"
             " if isinstance(x,dict):"
             " return {k:n(v,k) for k,v in x.items()}\n"
             " return x\n"
             "b=pickle.load(open('%s','rb'))\n"
             "sys.exit(0 if n(a)==n(b) else 1)\"",
             out, in),
                       0);
    }
    msnap__snap_free(s);
  }
  /* 2^63 reads (as uint64) but the writer refuses it; 2^70 is refused */
  char in[4096];
  msnap_snap_t *s = NULL;
  msnap_read_error_t err;
  snprintf(in, sizeof in, "%s/addr_2_63.pickle", tmp);
  assert_int_equal(msnap__snap_read_file(in, &s, &err), 0);
  assert_int_equal(s->device_traces[0].v[0].addr, UINT64_C(1) << 63);
  msnap_membuf_t mb;
  assert_int_equal(test_model_rewrite(s, &mb), MSNAP_EINVAL);
  msnap__snap_free(s);
  s = NULL;
  snprintf(in, sizeof in, "%s/addr_2_70.pickle", tmp);
  assert_int_equal(msnap__snap_read_file(in, &s, &err), MSNAP_EFORMAT);
  assert_null(s);
  assert_non_null(strstr(err.msg, "'addr' does not fit in 64 bits"));
  /* a negative address is refused as negative, by its value, whether it
   * fits in 64 bits or not */
  static const char *const neg[][2] = {
      {"addr_neg5", "'addr' is -5, expected a non-negative int"},
      {"addr_neg_2_64",
       "'addr' is -18446744073709551616, expected a non-negative int"}};
  for (size_t i = 0; i < sizeof neg / sizeof neg[0]; i++) {
    snprintf(in, sizeof in, "%s/%s.pickle", tmp, neg[i][0]);
    assert_int_equal(msnap__snap_read_file(in, &s, &err), MSNAP_EFORMAT);
    assert_null(s);
    assert_non_null(strstr(err.msg, neg[i][1]));
  }
  tu_rmrf(tmp);
  free(tmp);
}

/* Read must fail cleanly on every prefix of a real file. */
static void test_truncation(void **state) {
  (void)state;
  const char *dir = tu_real_inputs();
  if (!dir) {
    fprintf(stderr, "SKIP test_truncation: ../shared/real_inputs missing\n");
    skip();
  }
  static const struct {
    const char *file;
    size_t stride;
  } files[] = {{"maphsge4_select_n__snapshot_dec166a.pickle", 1},
               {"silmont2000_a2__mem_snapshot.pickle", 7},
               {"yiyi_llm_inference__oom_snapshot.pickle", 13}};
  for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, files[f].file);
    size_t len = 0;
    unsigned char *buf = tu_slurp(path, &len);
    assert_non_null(buf);
    for (size_t n = 0; n < len; n += files[f].stride) {
      msnap_snap_t *s = NULL;
      msnap_read_error_t err;
      int rc = msnap__snap_read_buffer(buf, n, &s, &err);
      if (rc == 0) fprintf(stderr, "%s: prefix %zu read\n", files[f].file, n);
      assert_int_equal(rc, MSNAP_EFORMAT);
      assert_null(s);
      assert_int_equal(strncmp(err.msg, "offset ", 7), 0);
    }
    free(buf);
  }
}

/* Random bit flips: any result but a crash; a model that reads is valid
 * and can be written. */
static void test_bit_flips(void **state) {
  (void)state;
  const char *dir = tu_real_inputs();
  if (!dir) {
    fprintf(stderr, "SKIP test_bit_flips: ../shared/real_inputs missing\n");
    skip();
  }
  const char *names[] = {"maphsge4_select_n__snapshot_dec166a.pickle",
                         "silmont2000_a2__mem_snapshot.pickle",
                         "yiyi_llm_inference__oom_snapshot.pickle"};
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  int ok = 0, failed = 0;
  for (size_t f = 0; f < 3; f++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, names[f]);
    size_t len = 0;
    unsigned char *orig = tu_slurp(path, &len);
    assert_non_null(orig);
    unsigned char *buf = malloc(len);
    for (int trial = 0; trial < 400; trial++) {
      memcpy(buf, orig, len);
      int flips = 1 + trial % 4;
      for (int k = 0; k < flips; k++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        size_t pos = (size_t)(rng % len);
        buf[pos] ^= (unsigned char)(1u << ((rng >> 40) % 8));
      }
      msnap_snap_t *s = NULL;
      msnap_read_error_t err;
      int rc = msnap__snap_read_buffer(buf, len, &s, &err);
      if (rc == 0) {
        char msg[256];
        assert_int_equal(msnap__snap_check_model(s, msg, sizeof msg), 0);
        msnap_membuf_t mb;
        int wrc = test_model_rewrite(s, &mb);
        assert_true(wrc == 0 || wrc == MSNAP_EINVAL);
        free(mb.data);
        msnap__snap_free(s);
        ok++;
      } else {
        assert_true(rc == MSNAP_EFORMAT || rc == MSNAP_ELIMIT ||
                    rc == MSNAP_EUNSAFE);
        assert_int_equal(strncmp(err.msg, "offset ", 7), 0);
        failed++;
      }
    }
    free(buf);
    free(orig);
  }
  assert_true(failed > 0);
  fprintf(stderr, "bit flips: %d read, %d refused\n", ok, failed);
}

static void test_refuses_code(void **state) {
  (void)state;
  static const char p0[] = "cos\nsystem\n(S'touch /tmp/pwned'\ntR.";
  static const char p4[] = "\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00"
                           "\x8c\x02os\x94\x8c\x06system\x94\x93\x94"
                           "\x8c\x04" "date\x94\x85\x94R\x94.";
  msnap_snap_t *s = NULL;
  msnap_read_error_t err;
  assert_int_equal(msnap__snap_read_buffer(p0, sizeof p0 - 1, &s, &err),
                   MSNAP_EUNSAFE);
  assert_non_null(strstr(err.msg, "GLOBAL"));
  assert_int_equal(msnap__snap_read_buffer(p4, sizeof p4 - 1, &s, &err),
                   MSNAP_EUNSAFE);
  assert_non_null(strstr(err.msg, "offset 25: opcode STACK_GLOBAL"));
  assert_null(s);
  /* not a snapshot */
  assert_int_equal(msnap__snap_read_buffer("K\x05.", 3, &s, &err),
                   MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "the pickle holds an int, not"));
  assert_int_equal(msnap__snap_read_buffer("N.", 2, &s, &err),
                   MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "the pickle holds None, not"));
  assert_int_equal(msnap__snap_read_buffer("]K\x01K\x02" "a.", 7, &s, &err),
                   MSNAP_EFORMAT);
  assert_non_null(strstr(err.msg, "applied to an int"));
  /* a missing file is the table's "no such item", not an I/O error */
  assert_int_equal(msnap__snap_read_file("/nonexistent/x.pickle", &s, &err),
                   MSNAP_ENOENT);
  assert_non_null(strstr(err.msg, "/nonexistent/x.pickle"));
}

/* A live model (not from the reader), generation CURRENT: every key. */
static void test_live_model_keys(void **state) {
  (void)state;
  msnap_snap_t *s = msnap__snap_new();
  assert_non_null(s);
  msnap_frame_t fr = {.name = msnap__snap_intern(s, "f", 1),
                      .filename = msnap__snap_intern(s, "a.py", 4),
                      .line = 3};
  uint32_t fid = msnap__snap_frame(s, &fr);
  assert_int_equal(msnap__snap_frame(s, &fr), fid);
  msnap_stack_t st = msnap__snap_stack(s, &fid, 1);
  assert_int_equal(msnap__snap_stack(s, &fid, 1), st);
  msnap_ssegment_t *g = msnap__snap_add_segment(s);
  g->address = 1 << 21;
  g->total_size = 2 << 20;
  g->nblocks = 2;
  g->frames = st;
  msnap_sblock_t *b = msnap__snap_add_block(s);
  b->address = 1 << 21;
  b->size = 512;
  b->requested_size = 400;
  b->state = MSNAP_BLOCK_ACTIVE_ALLOCATED;
  b->frames = st;
  b = msnap__snap_add_block(s);
  b->address = (1 << 21) + 512;
  b->size = (2 << 20) - 512;
  b->frames = MSNAP_STACK_EMPTY;
  assert_int_equal(msnap__snap_set_devices(s, 2), 0);
  msnap_strace_t *t = msnap__snap_add_trace(s, &s->device_traces[0]);
  t->action = MSNAP_ACTION_ALLOC;
  t->addr = 1 << 21;
  t->size = 400;
  t->frames = st;
  t = msnap__snap_add_trace(s, &s->device_traces[0]);
  t->action = MSNAP_ACTION_OOM;
  t->addr = 77;
  t->size = 1 << 30;
  char msg[256];
  assert_int_equal(msnap__snap_check_model(s, msg, sizeof msg), 0);
  char *tmp = tu_tmpdir();
  char out[4096];
  snprintf(out, sizeof out, "%s/live.pickle", tmp);
  assert_int_equal(msnap__snap_write_file(s, out, false), 0);
  int rc = py(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open('%s','rb'))\n"
      "assert list(d)==['segments','device_traces','allocator_settings',"
      "'external_annotations','host_segments','host_traces'],list(d)\n"
      "s=d['segments'][0]\n"
      "assert list(s)==['device','address','total_size','allocated_size',"
      "'active_size','requested_size','stream','segment_type',"
      "'segment_pool_id','is_expandable','frames','blocks'],list(s)\n"
      "assert list(s['blocks'][0])==['address','size','requested_size',"
      "'state','frames']\n"
      "assert s['blocks'][1]['frames']==[] and s['blocks'][1]['state']=="
      "'inactive'\n"
      "e=d['device_traces'][0]\n"
      "assert list(e[0])==['action','addr','size','stream','time_us',"
      "'compile_context','user_metadata','pool_id','frames'],list(e[0])\n"
      "assert e[0]['frames']==[{'name':'f','filename':'a.py','line':3}]\n"
      "assert e[1]['device_free']==77 and 'addr' not in e[1] and 'frames' "
      "not in e[1]\n"
      "assert e[1]['compile_context']=='N/A' and e[1]['user_metadata']==''\n"
      "assert d['device_traces'][1]==[] and s['segment_pool_id']==(0,0)\n"
      "\"",
      out);
  assert_int_equal(rc, 0);
  /* a write that fails leaves no file and no temporary behind */
  s->segments[0].address = UINT64_MAX;
  snprintf(out, sizeof out, "%s/bad.pickle", tmp);
  assert_int_equal(msnap__snap_write_file(s, out, false), MSNAP_EINVAL);
  assert_int_equal(py("test -z \"$(ls '%s' | grep -v live.pickle)\"", tmp),
                   0);
  msnap__snap_free(s);
  tu_rmrf(tmp);
  free(tmp);
}

/* A python3 that has torch (for torch.cuda._memory_viz), or NULL. */
static const char *torch_python(void) {
  static char buf[4096];
  const char *env = getenv("MEMSNAP_TORCH_PYTHON");
  const char *cands[3] = {env, NULL, "python3"};
  snprintf(buf, sizeof buf, "%s/.venv/bin/python", tu_src());
  cands[1] = buf;
  for (int i = 0; i < 3; i++) {
    if (!cands[i]) continue;
    if (py("'%s' -c 'import torch.cuda._memory_viz' >/dev/null 2>&1",
           cands[i]) == 0)
      return cands[i];
  }
  return NULL;
}

/* `python -m torch.cuda._memory_viz stats|trace` prints the same for each
 * real input and its rewrite (memsnap convert's promise); vizcheck.py
 * runs segsum()/trace() for all files in one process. */
static void test_memory_viz_cli(void **state) {
  (void)state;
  const char *dir = tu_real_inputs();
  const char *tp = torch_python();
  if (!dir || !tp) {
    fprintf(stderr, "SKIP test_memory_viz_cli: %s\n",
            !dir ? "../shared/real_inputs missing"
                 : "no python with torch (set MEMSNAP_TORCH_PYTHON)");
    skip();
  }
  char *tmp = tu_tmpdir();
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  static char args[12000];
  size_t al = 0;
  int n = 0;
  while ((e = readdir(d))) {
    if (!is_snapshot_file(e->d_name)) continue;
    char path[8192], out[8192];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    snprintf(out, sizeof out, "%s/%s", tmp, e->d_name);
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    assert_int_equal(msnap__snap_read_file(path, &s, &err), 0);
    assert_int_equal(msnap__snap_write_file(s, out, false), 0);
    msnap__snap_free(s);
    al += (size_t)snprintf(args + al, sizeof args - al, " '%s' '%s'", path,
                           out);
    assert_true(al < sizeof args);
    n++;
  }
  closedir(d);
  assert_true(n >= 8);
  int rc = py("'%s' '%s/tests/pickle/vizcheck.py' %s 2>/dev/null", tp,
              tu_src(), args);
  assert_int_equal(rc, 0);
  tu_rmrf(tmp);
  free(tmp);
}

/* The reader's stack encoder (msnap__stack_put2, branch-free for 1 and 2
 * bytes) writes the bytes of msnap__stack_put at every length boundary,
 * and at most one byte past them. */
static void test_stack_put2(void **state) {
  (void)state;
  static const uint32_t zs[] = {0,       1,        0x7e,      0x7f,
                                0x80,    0x81,     0x3ffe,    0x3fff,
                                0x4000,  0x4001,   0x1fffff,  0x200000,
                                0xfffffff, 0x10000000, UINT32_MAX - 1,
                                UINT32_MAX};
  for (size_t a = 0; a < sizeof zs / sizeof *zs; a++) {
    for (size_t b = 0; b < sizeof zs / sizeof *zs; b++) {
      for (int d = -2; d <= 2; d++) {
        uint32_t prev = zs[a], id = zs[b] + (uint32_t)d;
        unsigned char x[16], y[16];
        memset(x, 0xAA, sizeof x);
        memset(y, 0xAA, sizeof y);
        size_t nx = (size_t)(msnap__stack_put(x, prev, id) - x);
        size_t ny = (size_t)(msnap__stack_put2(y, prev, id) - y);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx);
        for (size_t k = nx + 1; k < sizeof y; k++)
          assert_int_equal(y[k], 0xAA);
      }
    }
  }
}

/* Appending stacks unindexed and merging them afterwards
 * (msnap__snap_dedupe_stacks, whose table tags slots with hash bits
 * while it runs) gives one id per content and leaves a table that
 * msnap__snap_stack finds every stack in. */
static void test_stack_dedupe(void **state) {
  (void)state;
  msnap_snap_t *s = msnap__snap_new();
  assert_non_null(s);
  enum { NFR = 64, NST = 5000, DISTINCT = 1500 };
  uint32_t fr[NFR];
  for (int i = 0; i < NFR; i++) {
    msnap_frame_t f = {0};
    f.name = msnap__snap_intern(s, "f", 1);
    f.filename = msnap__snap_intern(s, "/a.py", 5);
    f.line = i;
    fr[i] = msnap__snap_frame(s, &f);
    assert_true(fr[i] != UINT32_MAX);
  }
  /* stack k: content c = k * 7919 % DISTINCT: its first two frames name
   * c (DISTINCT < NFR^2), then a pseudo-random walk, 2..24 frames */
  uint32_t ids[32];
  for (uint32_t k = 0; k < NST; k++) {
    uint32_t c = (k * 7919u) % DISTINCT, n = 2 + c % 23, x = c;
    ids[0] = fr[c % NFR];
    ids[1] = fr[c / NFR];
    for (uint32_t i = 2; i < n; i++) {
      x = x * 1103515245u + 12345u;
      ids[i] = fr[(x >> 16) % NFR];
    }
    unsigned char *enc = msnap__snap_stack_buf(s, n), *o = enc;
    assert_non_null(enc);
    uint32_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
      o = msnap__stack_put2(o, prev, ids[i]);
      prev = ids[i];
    }
    assert_true(msnap__snap_stack_append(s, enc, (size_t)(o - enc), n) > 1);
  }
  assert_int_equal(msnap__snap_dedupe_stacks(s), 0);
  assert_int_equal(s->nstacks, DISTINCT + 2);
  /* every content is found (not added again), under one id each */
  uint8_t *seen = calloc(DISTINCT + 2, 1);
  assert_non_null(seen);
  for (uint32_t c = 0; c < DISTINCT; c++) {
    uint32_t n = 2 + c % 23, x = c, back[32];
    ids[0] = fr[c % NFR];
    ids[1] = fr[c / NFR];
    for (uint32_t i = 2; i < n; i++) {
      x = x * 1103515245u + 12345u;
      ids[i] = fr[(x >> 16) % NFR];
    }
    msnap_stack_t st = msnap__snap_stack(s, ids, n);
    assert_true(st > 1 && st < DISTINCT + 2);
    assert_int_equal(s->nstacks, DISTINCT + 2);
    assert_int_equal(seen[st], 0);
    seen[st] = 1;
    assert_int_equal(msnap__stack_frames(s, st, back, 32), n);
    assert_memory_equal(back, ids, n * sizeof *ids);
  }
  free(seen);
  char msg[256];
  if (msnap__snap_check_model(s, msg, sizeof msg) != 0)
    fail_msg("model check: %s", msg);
  msnap__snap_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_inputs),
      cmocka_unit_test(test_synthetic_generations),
      cmocka_unit_test(test_truncation),
      cmocka_unit_test(test_bit_flips),
      cmocka_unit_test(test_refuses_code),
      cmocka_unit_test(test_live_model_keys),
      cmocka_unit_test(test_memory_viz_cli),
      cmocka_unit_test(test_stack_put2),
      cmocka_unit_test(test_stack_dedupe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
