/*
 * test_reader.c -- the snapshot reader's fast path and input layer on real
 * data: every real input, every corpus seed and CPython pickles of them at
 * protocols 2, 4 and 5 give the same model whichever way they are read --
 * the fast path, the generic interpreter alone, a stream that hands out a
 * few bytes per read, a pipe, gzip and zstd -- and the fast path really
 * decodes every batch of real files (no roll-back; a list referred to
 * through the memo before its container is stored makes it roll back, as
 * in the corpus' small_shared_*; lists of memo references that end in a
 * pair, which the fast path's run gives back), and two hostile shapes
 * fuzzing found where it did not (a FRAME where a list's APPENDS should
 * be, a put taking its own dict's memo slot).  A model that reads passes
 * the deep model check.  A read with skip_stacks (memsnap replay's) gives
 * the same outcome -- the same error, or the same model but for its
 * stacks, all empty -- on the fast path and the generic one.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zlib.h>
#include <zstd.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "canon.h"
#include "testutil.h"

static unsigned char *rewrite(const msnap_snap_t *s, size_t *len) {
  msnap_membuf_t mb;
  if (test_model_rewrite(s, &mb) != 0) {
    *len = 0;
    return NULL;
  }
  *len = mb.len;
  return (unsigned char *)mb.data;
}

/* The outcome of one way of reading, kept for comparison. */
typedef struct outcome_s {
  int rc;
  char msg[512];
  unsigned char *w; /* the pickle rewrite of the model */
  size_t n;
  uint64_t batches, rollbacks;
} outcome_t;

static void take(outcome_t *o, int rc, msnap_snap_t *s,
                 const msnap_read_error_t *e) {
  o->rc = rc;
  snprintf(o->msg, sizeof o->msg, "%s", rc ? e->msg : "");
  o->w = NULL;
  o->n = 0;
  if (rc == 0) {
    char msg[256];
    if (msnap__snap_check_model(s, msg, sizeof msg) != 0)
      fail_msg("deep model check: %s", msg);
    o->w = rewrite(s, &o->n);
  }
  msnap__snap_free(s);
}

static void expect_same(const char *name, const char *how,
                        const outcome_t *a, const outcome_t *b) {
  /* a declared length beyond MSNAP_SOURCE_MAX_NEED: a stream refuses the
   * item without reading to the end to count what remains */
  if (strcmp(how, "the generic interpreter") != 0 &&
      a->rc == MSNAP_EFORMAT && b->rc == MSNAP_ELIMIT &&
      strstr(a->msg, "bytes but only") && strstr(b->msg, "an item of"))
    return;
  if (a->rc != b->rc || strcmp(a->msg, b->msg) != 0 || a->n != b->n ||
      (a->n && memcmp(a->w, b->w, a->n) != 0))
    fail_msg("%s: %s differs: rc %d/%d '%s' / '%s', %zu/%zu bytes", name,
             how, a->rc, b->rc, a->msg, b->msg, a->n, b->n);
}

typedef struct pipe_arg_s {
  int fd;
  const unsigned char *p;
  size_t n;
} pipe_arg_t;

/* Write in uneven pieces, as a slow producer would. */
static void *pipe_writer(void *arg) {
  pipe_arg_t *a = arg;
  size_t off = 0, k = 1;
  while (off < a->n) {
    size_t w = a->n - off < k ? a->n - off : k;
    ssize_t r = write(a->fd, a->p + off, w);
    if (r <= 0) break;
    off += (size_t)r;
    k = k * 7 % 65521 + 1;
  }
  close(a->fd);
  return NULL;
}

/* take() of a model read with (skipped) or without skip_stacks, its
 * stacks stripped (test_model_strip_stacks): a skip_stacks model stores
 * no stack and the writer refuses it as it is. */
static void take_stripped(outcome_t *o, int rc, msnap_snap_t *s,
                          const msnap_read_error_t *e, bool skipped) {
  if (rc == 0) {
    assert_int_equal(s->stacks_skipped, skipped);
    if (skipped) {
      assert_true(s->nstacks <= 2); /* absent and empty only */
      msnap_membuf_t mb;
      assert_int_equal(test_model_rewrite(s, &mb), MSNAP_EINVAL);
    }
    test_model_strip_stacks(s);
  }
  take(o, rc, s, e);
}

/* Every way of reading data[0..n) must agree with the buffer read. */
/* expect_fast: 1 the fast path decodes some batch, 2 every batch (no
 * roll-back). */
static uint64_t check_all_ways(const char *name, const unsigned char *data,
                               size_t n, int expect_fast) {
  outcome_t ref, o;
  msnap_snap_t *s = NULL;
  msnap_read_error_t e;
  msnap_read_stats_t st = {0};
  { int rc_ = msnap__snap_read_buffer_ex(data, n, &s, &e, &st); take(&ref, rc_, s, &e); }
  if (expect_fast && ref.rc == 0) {
    if (st.fast_batches == 0 || (expect_fast > 1 && st.fast_rollbacks))
      fail_msg("%s: fast path %llu batches, %llu rolled back", name,
               (unsigned long long)st.fast_batches,
               (unsigned long long)st.fast_rollbacks);
  }
  msnap_read_stats_t gen = {.generic_only = true};
  s = NULL;
  { int rc_ = msnap__snap_read_buffer_ex(data, n, &s, &e, &gen); take(&o, rc_, s, &e); }
  assert_int_equal(gen.fast_batches, 0);
  expect_same(name, "the generic interpreter", &ref, &o);
  free(o.w);
  /* skip_stacks (memsnap replay's read), on the fast path and the
   * generic one: the same outcome, the same model but for its stacks */
  {
    outcome_t bare;
    s = NULL;
    int rc_ = msnap__snap_read_buffer_ex(data, n, &s, &e, NULL);
    take_stripped(&bare, rc_, s, &e, false);
    for (int g = 0; g < 2; g++) {
      msnap_read_stats_t sk = {.generic_only = g == 1, .skip_stacks = true};
      s = NULL;
      rc_ = msnap__snap_read_buffer_ex(data, n, &s, &e, &sk);
      take_stripped(&o, rc_, s, &e, true);
      expect_same(name, g ? "skip_stacks, the generic interpreter"
                          : "skip_stacks",
                  &bare, &o);
      if (g == 0 && expect_fast > 1 && bare.rc == 0 &&
          (sk.fast_batches != st.fast_batches || sk.fast_rollbacks))
        fail_msg("%s: skip_stacks decoded %llu batches on the fast path "
                 "(%llu rolled back), the full read %llu",
                 name, (unsigned long long)sk.fast_batches,
                 (unsigned long long)sk.fast_rollbacks,
                 (unsigned long long)st.fast_batches);
      free(o.w);
    }
    free(bare.w);
  }
  /* (bytes with a gzip/zstd magic are decompressed by the stream and
   * file readers, not by the buffer reader) */
  if ((n >= 2 && data[0] == 0x1f && data[1] == 0x8b) ||
      (n >= 4 && data[0] == 0x28 && data[1] == 0xb5)) {
    free(ref.w);
    return st.fast_batches;
  }
  for (size_t chunk = 1; chunk <= 4096; chunk *= 8) {
    msnap_source_t *src;
    assert_int_equal(msnap__source_chunked(&src, data, n, chunk, 0), 0);
    s = NULL;
    msnap_read_stats_t sst = {0};
    { int rc_ = msnap__snap_read_source(src, &s, &e, &sst); take(&o, rc_, s, &e); }
    msnap__source_close(src);
    expect_same(name, "a stream", &ref, &o);
    free(o.w);
    /* the stream reads ahead (msnap__source_fill_ahead): every batch the
     * buffer read decoded on the fast path is whole in its window too */
    if (expect_fast > 1 && ref.rc == 0 &&
        (sst.fast_batches != st.fast_batches || sst.fast_rollbacks))
      fail_msg("%s: a stream in %zu-byte reads decoded %llu batches on "
               "the fast path (%llu rolled back), the buffer %llu",
               name, chunk, (unsigned long long)sst.fast_batches,
               (unsigned long long)sst.fast_rollbacks,
               (unsigned long long)st.fast_batches);
  }
  /* a real pipe, through the path reader ("/dev/fd/N") */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pipe_arg_t pa = {fds[1], data, n};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, pipe_writer, &pa), 0);
  char path[64];
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  s = NULL;
  { int rc_ = msnap__snap_read_file(path, &s, &e); take(&o, rc_, s, &e); }
  close(fds[0]); /* (the writer may still block on a full pipe) */
  pthread_join(th, NULL);
  if (ref.rc == 0) expect_same(name, "a pipe", &ref, &o);
  free(o.w);
  /* gzip and zstd */
  uLong cap = compressBound((uLong)n) + 64;
  unsigned char *gz = malloc(cap);
  z_stream z;
  memset(&z, 0, sizeof z);
  assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8,
                                Z_DEFAULT_STRATEGY),
                   Z_OK);
  z.next_in = (unsigned char *)data;
  z.avail_in = (uInt)n;
  z.next_out = gz;
  z.avail_out = (uInt)cap;
  assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
  size_t gzn = cap - z.avail_out;
  deflateEnd(&z);
  msnap_source_t *src;
  assert_int_equal(msnap__source_chunked(&src, gz, gzn, 1000, 0), 0);
  s = NULL;
  { int rc_ = msnap__snap_read_source(src, &s, &e, NULL); take(&o, rc_, s, &e); }
  msnap__source_close(src);
  if (ref.rc == 0) expect_same(name, "gzip", &ref, &o);
  free(o.w);
  free(gz);
  size_t zcap = ZSTD_compressBound(n);
  unsigned char *zs = malloc(zcap);
  size_t zn = ZSTD_compress(zs, zcap, data, n, 3);
  assert_false(ZSTD_isError(zn));
  assert_int_equal(msnap__source_chunked(&src, zs, zn, 777, 0), 0);
  s = NULL;
  { int rc_ = msnap__snap_read_source(src, &s, &e, NULL); take(&o, rc_, s, &e); }
  msnap__source_close(src);
  if (ref.rc == 0) expect_same(name, "zstd", &ref, &o);
  free(o.w);
  free(zs);
  free(ref.w);
  return st.fast_batches;
}

/* A real input's file name: *.pickle or *.pkl. */
static bool snapshot_name(const char *name) {
  size_t l = strlen(name);
  return (l > 7 && !strcmp(name + l - 7, ".pickle")) ||
         (l > 4 && !strcmp(name + l - 4, ".pkl"));
}

/* Every real input, and CPython's pickles of it at protocols 2, 4, 5. */
static void test_real_inputs(void **state) {
  (void)state;
  const char *real = tu_real_inputs();
  if (!real) {
    print_message("SKIP real inputs missing: the reader's equivalence on "
                  "real files did NOT run\n");
    skip();
  }
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  DIR *d = opendir(real);
  assert_non_null(d);
  struct dirent *de;
  int nfiles = 0;
  while ((de = readdir(d))) {
    if (!snapshot_name(de->d_name)) continue;
    char path[8192], cmd[16384];
    snprintf(path, sizeof path, "%s/%s", real, de->d_name);
    size_t n = 0;
    unsigned char *data = tu_slurp(path, &n);
    assert_non_null(data);
    check_all_ways(de->d_name, data, n, 2);
    free(data);
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import pickle,sys\n"
             "d=pickle.load(open(sys.argv[1],'rb'))\n"
             "for p in (2,4,5):\n"
             " open(sys.argv[2]+'.p%%d'%%p,'wb').write(pickle.dumps(d,"
             "protocol=p))\" '%s' '%s/x'",
             path, tmp);
    assert_int_equal(system(cmd), 0);
    for (int p = 2; p <= 5; p += p == 2 ? 2 : 1) {
      char name[8300];
      snprintf(path, sizeof path, "%s/x.p%d", tmp, p);
      snprintf(name, sizeof name, "%s (CPython protocol %d)", de->d_name, p);
      data = tu_slurp(path, &n);
      assert_non_null(data);
      check_all_ways(name, data, n, 2);
      free(data);
    }
    nfiles++;
  }
  closedir(d);
  tu_rmrf(tmp);
  free(tmp);
  assert_true(nfiles >= 8);
}

/* Every seed of the fuzz corpus; the snapshot-shaped ones use the fast
 * path. */
static void test_corpus(void **state) {
  (void)state;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/tests/corpus/pickle_read", tu_src());
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *de;
  int n = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    size_t len = 0;
    unsigned char *data = tu_slurp(path, &len);
    assert_non_null(data);
    int fast = strncmp(de->d_name, "small_shared_", 13) == 0 ||
               strncmp(de->d_name, "small_memo_", 11) == 0;
    check_all_ways(de->d_name, data, len, fast);
    free(data);
    n++;
  }
  closedir(d);
  assert_true(n >= 25);
}

/* The fast path rolls back cleanly: a batch whose entry refers to its own
 * frame list before the list is stored, and one whose last entry holds a
 * dict the consumer keeps generic, read as the generic interpreter reads
 * them. */
static void test_rollback(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  char cmd[8192], path[4200];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import pickle,sys\n"
           "fr=[{'name':'f','filename':'/a.py','line':1}]\n"
           "e=[{'action':'alloc','addr':i,'size':8,'frames':fr}"
           " for i in range(50)]\n"
           "e[40]['extra']={'k':[1,2]}\n"
           "open(sys.argv[1],'wb').write(pickle.dumps({'segments':[],"
           "'device_traces':[e]},protocol=4))\" '%s/r.pickle'",
           tmp);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/r.pickle", tmp);
  size_t n = 0;
  unsigned char *data = tu_slurp(path, &n);
  assert_non_null(data);
  msnap_snap_t *s = NULL;
  msnap_read_error_t e;
  msnap_read_stats_t st = {0};
  assert_int_equal(msnap__snap_read_buffer_ex(data, n, &s, &e, &st), 0);
  assert_true(st.fast_rollbacks >= 1);
  assert_int_equal(s->device_traces[0].n, 50);
  msnap__snap_free(s);
  check_all_ways("rollback", data, n, 0);
  free(data);
  tu_rmrf(tmp);
  free(tmp);
}

/* Runs a python3 script that writes its pickles under the folder given
 * as sys.argv[1] (tmp), then returns the bytes of tmp/name. */
static unsigned char *py_pickle(const char *tmp, const char *script,
                                const char *name, size_t *n) {
  char cmd[8192], path[4200];
  snprintf(cmd, sizeof cmd, "python3 -c \"%s\" '%s'", script, tmp);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/%s", tmp, name);
  unsigned char *data = tu_slurp(path, n);
  assert_non_null(data);
  return data;
}

/* check_all_ways on the file tmp/<file>. */
static void check_file(const char *tmp, const char *file, const char *name,
                       int expect_fast) {
  char path[4200];
  size_t n = 0;
  snprintf(path, sizeof path, "%s/%s", tmp, file);
  unsigned char *data = tu_slurp(path, &n);
  assert_non_null(data);
  check_all_ways(name, data, n, expect_fast);
  free(data);
}

/* check_all_ways on tmp/<stem><p>.pickle for protocols p = 2, 4, 5. */
static void check_protocols(const char *tmp, const char *stem,
                            const char *name, int expect_fast) {
  for (int p = 2; p <= 5; p += p == 2 ? 2 : 1) {
    char file[256];
    snprintf(file, sizeof file, "%s%d.pickle", stem, p);
    check_file(tmp, file, name, expect_fast);
  }
}

/* Refused with MSNAP_EFORMAT (and a message holding `want`), the same
 * way whichever way it is read. */
static void expect_refused(const char *name, const unsigned char *data,
                           size_t n, const char *want) {
  msnap_snap_t *s = NULL;
  msnap_read_error_t e;
  assert_int_equal(msnap__snap_read_buffer_ex(data, n, &s, &e, NULL),
                   MSNAP_EFORMAT);
  if (want && !strstr(e.msg, want))
    fail_msg("%s: '%s' does not say '%s'", name, e.msg, want);
  check_all_ways(name, data, n, 0);
}

/* Lists of memo references that end in an (a, b) tuple (the fast path's
 * run of references gives the pair's items back where it stops) read as
 * the generic interpreter reads them, at protocols 2, 4 and 5. */
static void test_tuple_after_run(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  static const char script[] =
      "import pickle,sys\n"
      "fr=[{'name':'f%d'%i,'filename':'/a.py','line':i} for i in range(4)]\n"
      "e=[{'action':'alloc','addr':i,'size':8,'frames':fr}"
      " for i in range(40)]\n"
      "e[5]['frames']=fr+[(fr[0],fr[1])]\n"
      "e[7]['frames']=[fr[0],(fr[0],5)]\n"
      "e[9]['extra']=['a','b','a',('a','b')]\n"
      "e[11]['frames']=[(fr[2],fr[3])]+fr\n"
      "e[13]['frames']=[fr[0],fr[1],'x',fr[2]]\n"
      "e[15]['extra']=['a','b',('a',7),'b']\n"
      "for p in (2,4,5):\n"
      " open(sys.argv[1]+'/t%d.pickle'%p,'wb').write(pickle.dumps("
      "{'segments':[],'device_traces':[e]},protocol=p))";
  size_t n = 0;
  free(py_pickle(tmp, script, "t2.pickle", &n));
  check_protocols(tmp, "t", "tuple after a run", 0);
  tu_rmrf(tmp);
  free(tmp);
}

/* A FRAME whose declared length runs past the input, met where a batch's
 * list of dicts ends (found by fuzzing: the fast path took the FRAME for
 * the list's APPENDS and read the length's bytes as opcodes): the fast
 * path hands the batch back and the reader refuses the file as the
 * generic interpreter does.  Here a frame list's APPENDS is replaced by
 * FRAME, whose length is the 8 well-formed opcodes after it. */
static void test_bad_frame_in_batch(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  static const char script[] =
      "import pickle,sys\n"
      "fr=[{'name':'f%d'%i,'filename':'/a.py','line':i} for i in range(3)]\n"
      "e=[{'action':'alloc','addr':i,'size':8,'frames':[dict(f)"
      " for f in fr]} for i in range(6)]\n"
      "d=pickle.dumps({'segments':[],'device_traces':[e]},protocol=4)\n"
      "i=d.index(b'ue',d.index(b'device_traces'))\n"
      "open(sys.argv[1]+'/f.pickle','wb').write("
      "d[:i+1]+bytes([0x95])+d[i+2:])";
  size_t n = 0;
  unsigned char *data = py_pickle(tmp, script, "f.pickle", &n);
  expect_refused("bad FRAME in a batch", data, n, "frame of");
  free(data);
  tu_rmrf(tmp);
  free(tmp);
}

/* A put inside a dict that takes the dict's own memo slot (found by
 * fuzzing; here the first frame's name string is put there): the slot
 * keeps what was put last, as the generic interpreter keeps it, so the
 * later references to that frame read the string, and the frame lists
 * holding them are refused both ways. */
static void test_slot_taken_inside(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  static const char script[] =
      "import pickle,pickletools,sys\n"
      "fr=[{'name':'f%d'%i,'filename':'/a.py','line':i} for i in range(3)]\n"
      "e=[{'action':'alloc','addr':i,'size':8,'frames':list(fr)}"
      " for i in range(6)]\n"
      "d=bytearray(pickle.dumps({'segments':[],'device_traces':[e]},"
      "protocol=2))\n"
      "ops=list(pickletools.genops(bytes(d)))\n"
      "k=[j for j,(o,a,p) in enumerate(ops) if o.name=='EMPTY_DICT'"
      " and p>d.index(b'frames')][0]\n"
      "own=ops[k+1][1]\n"
      "q=[p for o,a,p in ops[k+2:] if o.name=='BINPUT'][1]\n"
      "d[q+1]=own\n"
      "open(sys.argv[1]+'/s.pickle','wb').write(bytes(d))";
  size_t n = 0;
  unsigned char *data = py_pickle(tmp, script, "s.pickle", &n);
  expect_refused("a slot taken inside its dict", data, n,
                 "frames[0] is a str, expected a frame dict");
  free(data);
  tu_rmrf(tmp);
  free(tmp);
}

/* Frame lists the fast path encodes straight from their memo references
 * (pickle.h, msnap_pvm_refs_t), short ones and one batch of 900 frames
 * (the scan's buffer grows), and the shapes where it must not: a list of
 * two APPENDS batches (over 1000 frames), frames mixed with another item,
 * a list of frame lists, a list starting with a reference to a string, a
 * FRAME opcode inside a list (protocol 4's 64 KiB frames) --
 * every one read as the generic interpreter reads it, at protocols 2, 4
 * and 5, with no batch rolled back where the items are all frames. */
static void test_frame_ref_lists(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  static const char script[] =
      "import pickle,sys\n"
      "fr=[{'name':'f%d'%i,'filename':'/a.py','line':i} for i in range(300)]\n"
      "e=[{'action':'alloc','addr':i,'size':8,'frames':fr[i%7:i%7+40]}"
      " for i in range(4000)]\n"
      "e[3]['frames']=fr*4\n"
      "e[4]['frames']=fr[:5]+fr[:5]\n"
      "e[5]['frames']=fr*3\n"
      "big=[{'action':'alloc','addr':i,'size':8,'frames':fr[i%13::3]}"
      " for i in range(400)]\n"
      "for p in (2,4,5):\n"
      " open(sys.argv[1]+'/ok%d.pickle'%p,'wb').write(pickle.dumps("
      "{'segments':[],'device_traces':[e,big]},protocol=p))\n"
      "e2=[dict(x) for x in e[:50]]\n"
      "e2[6]['frames']=fr[:3]+['x']+fr[3:6]\n"
      "e2[8]['extra']=[fr[:3],fr[3:6]]\n"
      "e2[9]['extra']=['name',fr[0]]\n"
      "for p in (2,4,5):\n"
      " open(sys.argv[1]+'/mix%d.pickle'%p,'wb').write(pickle.dumps("
      "{'segments':[],'device_traces':[e2]},protocol=p))";
  size_t n = 0;
  free(py_pickle(tmp, script, "ok2.pickle", &n));
  check_protocols(tmp, "ok", "frame lists", 2);
  check_protocols(tmp, "mix", "frames mixed with other items", 0);
  tu_rmrf(tmp);
  free(tmp);
}

/* Trace entries the reader's entry scan reads straight into the pool
 * (snapshot_read.c entry_scan) and the shapes it leaves to the VM: every
 * one read as the generic interpreter reads it, at protocols 2, 4 and 5
 * and without a memo (pickle's fast mode: no puts, no shared lists).
 * Taken: the keys of every PyTorch version (time_us or not, metadata
 * strings), shared, new and empty frame lists, ints of every width,
 * negative streams.  Left: keys out of order, an unknown action's first
 * appearance, device_free (oom), pool_id, an unknown key, big and
 * negative addresses (refused both ways), a frames value of another
 * kind, a list of one frame (APPEND), a list of over 1000 frames (two
 * batches). */
static void test_entry_scan(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  static const char script[] =
      "import pickle,io,sys\n"
      "fr=[{'name':'f%d'%i,'filename':'/a.py','line':i} for i in range(60)]\n"
      "sh=fr[3:9]\n"
      "def ent(i):\n"
      " e={'action':('alloc','free_requested','free_completed',"
      "'segment_alloc')[i%4],'addr':(i*4096)<<(i%40),"
      "'size':(i*37)%(1<<(i%33)),'stream':(i%5)-2,"
      "'time_us':1700000000000000+i}\n"
      " e['frames']=sh if i%3==0 else [] if i%11==0 else"
      " fr[i%13:i%13+i%17+2]\n"
      " if i%7==0: del e['time_us']\n"
      " if i%9==0: e['compile_context']='ctx%d'%(i%2); e['user_metadata']='m'\n"
      " return e\n"
      "ok=[ent(i) for i in range(600)]\n"
      "odd=[ent(i) for i in range(200)]\n"
      "odd[3]={'addr':1,'action':'alloc','size':8,'frames':sh}\n"
      "odd[5]['action']='free'\n"
      "odd[7]={'action':'oom','device_free':123,'size':8,'stream':0,"
      "'frames':sh}\n"
      "odd[9]['pool_id']=(0,1)\n"
      "odd[11]['category']='x'\n"
      "odd[13]['frames']=fr*20\n"
      "odd[15]['stream']=-(1<<40)\n"
      "odd[17]['size']=0\n"
      "odd[19]['frames']=(fr[0],fr[1])\n"
      "odd[21]['frames']=[fr[2]]\n"
      "bad=[ent(i) for i in range(20)]\n"
      "bad[4]['addr']=-5\n"
      "huge=[ent(i) for i in range(20)]\n"
      "huge[6]['addr']=(1<<64)-1\n"
      "def dump(o,p,fast=False):\n"
      " b=io.BytesIO(); pk=pickle.Pickler(b,protocol=p); pk.fast=fast\n"
      " pk.dump(o); return b.getvalue()\n"
      "for name,e in (('ok',ok),('odd',odd),('bad',bad),('huge',huge)):\n"
      " for p in (2,4,5):\n"
      "  open(sys.argv[1]+'/%s%d.pickle'%(name,p),'wb').write(dump("
      "{'segments':[],'device_traces':[e]},p))\n"
      " open(sys.argv[1]+'/%s-nomemo.pickle'%name,'wb').write(dump("
      "{'segments':[],'device_traces':[e]},4,True))";
  size_t n = 0;
  free(py_pickle(tmp, script, "ok2.pickle", &n));
  check_protocols(tmp, "ok", "entries the scan reads", 2);
  check_protocols(tmp, "odd", "entries left to the VM", 0);
  check_protocols(tmp, "bad", "a negative address", 0);
  check_protocols(tmp, "huge", "a 64-bit address", 0);
  static const char *const names[] = {"ok", "odd", "bad", "huge"};
  for (int i = 0; i < 4; i++) {
    char file[64], name[64];
    snprintf(file, sizeof file, "%s-nomemo.pickle", names[i]);
    snprintf(name, sizeof name, "%s, no memo", names[i]);
    check_file(tmp, file, name, 0);
  }
  /* the scan read nearly every good entry: not the first of each action
   * and metadata string (its strings are new there), nor one a
   * protocol-4 FRAME splits */
  for (int p = 2; p <= 5; p += p == 2 ? 2 : 1) {
    char path[4200];
    snprintf(path, sizeof path, "%s/ok%d.pickle", tmp, p);
    unsigned char *data = tu_slurp(path, &n);
    assert_non_null(data);
    msnap_snap_t *s = NULL;
    msnap_read_error_t e;
    msnap_read_stats_t st = {0};
    assert_int_equal(msnap__snap_read_buffer_ex(data, n, &s, &e, &st), 0);
    if (st.entries_scanned < 580)
      fail_msg("protocol %d: the entry scan read %llu of 600 entries", p,
               (unsigned long long)st.entries_scanned);
    assert_int_equal(s->device_traces[0].n, 600);
    msnap__snap_free(s);
    free(data);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/bad2.pickle", tmp);
  unsigned char *data = tu_slurp(path, &n);
  assert_non_null(data);
  expect_refused("a negative address", data, n, "'addr'");
  free(data);
  tu_rmrf(tmp);
  free(tmp);
}

/* Corrupted copies of every real input: bytes changed at deterministic
 * pseudo-random places (most land in frame lists: 90% of a snapshot's
 * bytes are their memo references), each copy read with the fast path
 * and with the generic interpreter alone -- the same model or the same
 * error, and a model that reads passes the deep check. */
static void test_corrupted_real_inputs(void **state) {
  (void)state;
  const char *real = tu_real_inputs();
  if (!real) {
    print_message("SKIP real inputs missing: corrupted copies of real "
                  "files did NOT run\n");
    skip();
  }
  DIR *d = opendir(real);
  assert_non_null(d);
  struct dirent *de;
  int nfiles = 0;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  while ((de = readdir(d))) {
    if (!snapshot_name(de->d_name)) continue;
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", real, de->d_name);
    size_t n = 0;
    unsigned char *data = tu_slurp(path, &n);
    assert_non_null(data);
    unsigned char *copy = malloc(n);
    assert_non_null(copy);
    for (int k = 0; k < 24 && n > 64; k++) {
      memcpy(copy, data, n);
      int nflip = 1 + k % 4;
      for (int j = 0; j < nflip; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        /* past the protocol header; every third change a whole byte
         * (an opcode turned into another), else one bit */
        size_t at = 2 + (size_t)(x % (n - 2));
        if (j % 3 == 2)
          copy[at] = (unsigned char)(x >> 32);
        else
          copy[at] ^= (unsigned char)(1u << ((x >> 40) % 8));
      }
      outcome_t ref, o;
      msnap_snap_t *s = NULL;
      msnap_read_error_t e;
      int rc = msnap__snap_read_buffer_ex(copy, n, &s, &e, NULL);
      take(&ref, rc, s, &e);
      msnap_read_stats_t gen = {.generic_only = true};
      s = NULL;
      rc = msnap__snap_read_buffer_ex(copy, n, &s, &e, &gen);
      take(&o, rc, s, &e);
      char name[8300];
      snprintf(name, sizeof name, "%s (corrupted copy %d)", de->d_name, k);
      expect_same(name, "the generic interpreter", &ref, &o);
      free(ref.w);
      free(o.w);
    }
    free(copy);
    free(data);
    nfiles++;
  }
  closedir(d);
  assert_true(nfiles >= 8);
}

/* A pickle of `count` small ints in batches of 1000 (MARK ... APPENDS,
 * protocol 4, no frames): not a snapshot, but the reader runs it to STOP
 * with the fast path's read-ahead at every MARK. */
static unsigned char *int_batches(size_t count, size_t *len) {
  unsigned char *b = malloc(count * 3 + count / 1000 * 2 + 16), *q = b;
  assert_non_null(b);
  *q++ = 0x80; *q++ = 4; *q++ = ']';                 /* PROTO 4, EMPTY_LIST */
  for (size_t i = 0; i < count; i++) {
    if (i % 1000 == 0) *q++ = '(';                   /* MARK */
    *q++ = 'M';                                       /* BININT2 */
    *q++ = (unsigned char)i;
    *q++ = (unsigned char)(i >> 8);
    if (i % 1000 == 999 || i + 1 == count) *q++ = 'e'; /* APPENDS */
  }
  *q++ = '.';                                         /* STOP */
  *len = (size_t)(q - b);
  return b;
}

static size_t gzip_of(const unsigned char *data, size_t n,
                      unsigned char **out) {
  uLong cap = compressBound((uLong)n) + 64;
  *out = malloc(cap);
  assert_non_null(*out);
  z_stream z;
  memset(&z, 0, sizeof z);
  assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8,
                                Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = (unsigned char *)data;
  z.avail_in = (uInt)n;
  z.next_out = *out;
  z.avail_out = (uInt)cap;
  assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
  deflateEnd(&z);
  return cap - z.avail_out;
}

/* Read compressed bytes c[0..n) every way a stream or a file is read. */
static void read_ways(const char *name, const unsigned char *c, size_t n,
                      const char *tmp, outcome_t *ref) {
  static const size_t chunks[] = {1000, 65536, 1u << 20, 0};
  msnap_snap_t *s;
  msnap_read_error_t e;
  outcome_t o;
  char path[4200], how[64];
  /* a file: mapped, decompressed in windows */
  snprintf(path, sizeof path, "%s/c.bin", tmp);
  assert_int_equal(tu_write(path, c, n), 0);
  s = NULL;
  { int rc_ = msnap__snap_read_file(path, &s, &e); take(ref, rc_, s, &e); }
  for (size_t k = 0; k < sizeof chunks / sizeof *chunks; k++) {
    size_t chunk = chunks[k] ? chunks[k] : n; /* 0: all in one read */
    msnap_source_t *src;
    assert_int_equal(msnap__source_chunked(&src, c, n, chunk, 0), 0);
    s = NULL;
    { int rc_ = msnap__snap_read_source(src, &s, &e, NULL); take(&o, rc_, s, &e); }
    msnap__source_close(src);
    snprintf(how, sizeof how, "a stream in %zu-byte reads", chunk);
    expect_same(name, how, ref, &o);
    free(o.w);
  }
  /* a pipe written in uneven pieces (the reader may stop before its
   * end: the writer's write then fails, EPIPE) */
  signal(SIGPIPE, SIG_IGN);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pipe_arg_t pa = {fds[1], c, n};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, pipe_writer, &pa), 0);
  snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
  s = NULL;
  { int rc_ = msnap__snap_read_file(path, &s, &e); take(&o, rc_, s, &e); }
  close(fds[0]);
  pthread_join(th, NULL);
  expect_same(name, "a pipe", ref, &o);
  free(o.w);
}

/* Corrupt compressed data is named with the same offset however it is
 * read -- a mapped file, a stream in small or large reads, a pipe: the
 * bytes the decompressor made before it met the error are all given to
 * the reader (the read-ahead at a MARK asks for 4 MiB at once: they were
 * dropped with the error, so the offset depended on the window), and the
 * error is reported where the reader needs the bytes after them. */
static void test_corrupt_compressed_offsets(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  size_t n;
  unsigned char *data = int_batches(2500000, &n); /* 7.5 MB */
  unsigned char *gz;
  size_t gzn = gzip_of(data, n, &gz);
  size_t zcap = ZSTD_compressBound(n);
  unsigned char *zs = malloc(zcap);
  assert_non_null(zs);
  size_t zn = ZSTD_compress(zs, zcap, data, n, 3);
  assert_false(ZSTD_isError(zn));
  unsigned char *zc = malloc(zcap); /* with a checksum */
  assert_non_null(zc);
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  assert_non_null(cc);
  assert_false(
      ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1)));
  size_t zcn = ZSTD_compress2(cc, zc, zcap, data, n);
  assert_false(ZSTD_isError(zcn));
  ZSTD_freeCCtx(cc);
  struct {
    const char *name;
    unsigned char *c;
    size_t n, at;
    const char *says;
  } cases[] = {
      {"gzip, its CRC flipped", gz, gzn, gzn - 8, "incorrect data check"},
      {"gzip, its size flipped", gz, gzn, gzn - 2, "incorrect length check"},
      {"gzip, a byte flipped at 60%", gz, gzn, gzn / 5 * 3, "corrupt"},
      {"zstd, its checksum flipped", zc, zcn, zcn - 1, "checksum"},
      {"zstd, its last byte flipped", zs, zn, zn - 1, "corrupt"},
      {"zstd, a byte flipped at 60%", zc, zcn, zcn / 5 * 3, "corrupt"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    unsigned char *c = malloc(cases[i].n);
    assert_non_null(c);
    memcpy(c, cases[i].c, cases[i].n);
    c[cases[i].at] ^= 0x55;
    outcome_t ref;
    read_ways(cases[i].name, c, cases[i].n, tmp, &ref);
    if (ref.rc != MSNAP_EFORMAT || !strstr(ref.msg, cases[i].says))
      fail_msg("%s: %d '%s'", cases[i].name, ref.rc, ref.msg);
    free(ref.w);
    free(c);
  }
  free(zc);
  free(zs);
  free(gz);
  free(data);
  tu_rmrf(tmp);
  free(tmp);
}

/* Concatenated members (cat a.gz b.gz) or frames whose first holds a
 * pickle the reader refuses and whose second is corrupt: the reader's
 * error about the pickle, as before the read-ahead -- the first member
 * ended whole (its CRC matched); the read-ahead met the second's error,
 * which msnap__source_check_member reported as the cause. */
static void test_corrupt_next_member(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  assert_non_null(tmp);
  size_t n, an, bn;
  unsigned char *pk = int_batches(3000, &n); /* a list: not a snapshot */
  unsigned char *junk = malloc(200000);
  assert_non_null(junk);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < 200000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    junk[i] = (unsigned char)x;
  }
  unsigned char *a, *b;
  an = gzip_of(pk, n, &a);
  bn = gzip_of(junk, 200000, &b);
  for (size_t i = 20; i + 8 < bn; i += 50) b[i] ^= 0x5a;
  unsigned char *ab = malloc(an + bn);
  assert_non_null(ab);
  memcpy(ab, a, an);
  memcpy(ab + an, b, bn);
  outcome_t ref;
  read_ways("a gzip member, then a corrupt one", ab, an + bn, tmp, &ref);
  if (ref.rc != MSNAP_EFORMAT || strstr(ref.msg, "compressed"))
    fail_msg("a gzip member, then a corrupt one: %d '%s'", ref.rc, ref.msg);
  free(ref.w);
  free(ab);
  free(a);
  free(b);
  size_t zcap = ZSTD_compressBound(200000) + ZSTD_compressBound(n);
  unsigned char *z = malloc(zcap);
  assert_non_null(z);
  an = ZSTD_compress(z, zcap, pk, n, 3);
  assert_false(ZSTD_isError(an));
  bn = ZSTD_compress(z + an, zcap - an, junk, 200000, 3);
  assert_false(ZSTD_isError(bn));
  for (size_t i = an + 20; i + 8 < an + bn; i += 50) z[i] ^= 0x5a;
  read_ways("a zstd frame, then a corrupt one", z, an + bn, tmp, &ref);
  if (ref.rc != MSNAP_EFORMAT || strstr(ref.msg, "compressed"))
    fail_msg("a zstd frame, then a corrupt one: %d '%s'", ref.rc, ref.msg);
  free(ref.w);
  free(z);
  free(junk);
  free(pk);
  tu_rmrf(tmp);
  free(tmp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_inputs),
      cmocka_unit_test(test_corpus),
      cmocka_unit_test(test_rollback),
      cmocka_unit_test(test_tuple_after_run),
      cmocka_unit_test(test_bad_frame_in_batch),
      cmocka_unit_test(test_slot_taken_inside),
      cmocka_unit_test(test_frame_ref_lists),
      cmocka_unit_test(test_entry_scan),
      cmocka_unit_test(test_corrupted_real_inputs),
      cmocka_unit_test(test_corrupt_compressed_offsets),
      cmocka_unit_test(test_corrupt_next_member),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
