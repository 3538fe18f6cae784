/*
 * test_pickle_write.c -- the protocol-4 encoder and the sinks.
 *
 * Values are written with msnap__pw_* while their canonical text (see
 * canon.py) is built alongside; CPython must load the pickle to the same
 * canonical text (pwcheck.py: also opcode subset, protocol 4, frames <=
 * 64 KiB) and so must our own reader.  Sinks: memory/fd/callback,
 * sticky errors, ENOSPC from /dev/full, atomic commit and abort.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "api/api.h"
#include "runtime/runtime.h"
#include "model/pickle.h"
#include "canon.h"
#include "testutil.h"

typedef struct dual_s {
  msnap_pw_t pw;
  msnap_sink_t out, canon;
  msnap_membuf_t out_mb, canon_mb;
} dual_t;

static void cput(dual_t *d, const char *s) {
  msnap__sink_write(&d->canon, s, strlen(s));
}

static void chex(dual_t *d, const char *p, size_t n) {
  char b[3];
  for (size_t i = 0; i < n; i++) {
    snprintf(b, sizeof b, "%02x", (unsigned char)p[i]);
    cput(d, b);
  }
}

static void e_int(dual_t *d, int64_t v) {
  char b[32];
  msnap__pw_int(&d->pw, v);
  snprintf(b, sizeof b, "i%lld", (long long)v);
  cput(d, b);
}

static void e_float(dual_t *d, double v) {
  char b[32];
  uint64_t u;
  memcpy(&u, &v, 8);
  msnap__pw_float(&d->pw, v);
  snprintf(b, sizeof b, "f%016llx", (unsigned long long)u);
  cput(d, b);
}

static void e_str(dual_t *d, const char *s, size_t n) {
  msnap__pw_str(&d->pw, s, n);
  cput(d, "s");
  chex(d, s, n);
  cput(d, ";");
}

/* A list of n items written by fn(i), in MARK/APPENDS batches of 1000. */
static void e_list(dual_t *d, uint32_t n, void (*fn)(dual_t *, uint32_t)) {
  msnap__pw_op(&d->pw, MSNAP_OP_EMPTY_LIST);
  cput(d, "[");
  for (uint32_t i = 0; i < n; i++) {
    if (i % 1000 == 0) {
      if (i) msnap__pw_op(&d->pw, MSNAP_OP_APPENDS);
      msnap__pw_op(&d->pw, MSNAP_OP_MARK);
    }
    if (i) cput(d, ",");
    fn(d, i);
  }
  if (n) msnap__pw_op(&d->pw, MSNAP_OP_APPENDS);
  cput(d, "]");
}

static const int64_t edge_ints[] = {
    0, 1, 255, 256, 65535, 65536, INT32_MAX, (int64_t)INT32_MAX + 1, -1,
    INT32_MIN, (int64_t)INT32_MIN - 1, INT64_C(1) << 53, (INT64_C(1) << 53) + 1,
    INT64_C(1) << 47, (INT64_C(1) << 55) - 1, INT64_C(1) << 55,
    -(INT64_C(1) << 55),
    INT64_MAX, INT64_MIN, 139927954128896, 1772552894612167};

static void f_edge(dual_t *d, uint32_t i) { e_int(d, edge_ints[i]); }

static const double floats[] = {0.0, -0.0, 1.5, -2.25, 1e300, 5e-324, 0.1,
                                3.141592653589793};
static void f_float(dual_t *d, uint32_t i) {
  if (i < 8)
    e_float(d, floats[i]);
  else
    e_float(d, i == 8 ? INFINITY : -INFINITY);
}

static char big[70001];
static void f_str(dual_t *d, uint32_t i) {
  static const char *const s[] = {"", "a", "caf\xc3\xa9",
                                  "\xe4\xb8\xad\xe6\x96\x87",
                                  "\xf0\x9f\x98\x80", "new\nline\\"};
  if (i < 6)
    e_str(d, s[i], strlen(s[i]));
  else if (i == 6)
    e_str(d, big, 255);
  else if (i == 7)
    e_str(d, big, 256);
  else
    e_str(d, big, 70000);
}

static void f_count(dual_t *d, uint32_t i) { e_int(d, (int64_t)i * 7919); }

/* memo: 300 strings memoized, then fetched in reverse (BINGET and
 * LONG_BINGET), and one shared dict referenced 5 times. */
static uint32_t memo_ids[300];
static void f_memo_def(dual_t *d, uint32_t i) {
  char s[16];
  int n = snprintf(s, sizeof s, "k%u", i);
  e_str(d, s, (size_t)n);
  memo_ids[i] = msnap__pw_memoize(&d->pw);
}
static void f_memo_use(dual_t *d, uint32_t i) {
  char s[16];
  uint32_t k = 299 - i;
  int n = snprintf(s, sizeof s, "k%u", k);
  msnap__pw_get(&d->pw, memo_ids[k]);
  cput(d, "s");
  chex(d, s, (size_t)n);
  cput(d, ";");
}

static void write_value(dual_t *d) {
  /* a dict of everything */
  msnap__pw_op(&d->pw, MSNAP_OP_EMPTY_DICT);
  msnap__pw_op(&d->pw, MSNAP_OP_MARK);
  cput(d, "{");
  e_str(d, "ints", 4);
  cput(d, ":");
  e_list(d, sizeof edge_ints / sizeof *edge_ints, f_edge);
  cput(d, ",");
  e_str(d, "floats", 6);
  cput(d, ":");
  e_list(d, 10, f_float);
  cput(d, ",");
  e_str(d, "strs", 4);
  cput(d, ":");
  e_list(d, 9, f_str);
  cput(d, ",");
  e_str(d, "big", 3);
  cput(d, ":");
  e_list(d, 2500, f_count);
  cput(d, ",");
  e_str(d, "memo_def", 8);
  cput(d, ":");
  e_list(d, 300, f_memo_def);
  cput(d, ",");
  e_str(d, "memo_use", 8);
  cput(d, ":");
  e_list(d, 300, f_memo_use);
  cput(d, ",");
  e_str(d, "consts", 6);
  cput(d, ":");
  /* (None, True, False, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)) */
  msnap__pw_op(&d->pw, MSNAP_OP_MARK);
  msnap__pw_op(&d->pw, MSNAP_OP_NONE);
  msnap__pw_bool(&d->pw, true);
  msnap__pw_bool(&d->pw, false);
  msnap__pw_op(&d->pw, MSNAP_OP_EMPTY_TUPLE);
  msnap__pw_int(&d->pw, 1);
  msnap__pw_op(&d->pw, MSNAP_OP_TUPLE1);
  msnap__pw_int(&d->pw, 1);
  msnap__pw_int(&d->pw, 2);
  msnap__pw_op(&d->pw, MSNAP_OP_TUPLE2);
  msnap__pw_int(&d->pw, 1);
  msnap__pw_int(&d->pw, 2);
  msnap__pw_int(&d->pw, 3);
  msnap__pw_op(&d->pw, MSNAP_OP_TUPLE3);
  msnap__pw_op(&d->pw, MSNAP_OP_MARK);
  for (int i = 1; i <= 4; i++) msnap__pw_int(&d->pw, i);
  msnap__pw_op(&d->pw, MSNAP_OP_TUPLE);
  msnap__pw_op(&d->pw, MSNAP_OP_TUPLE);
  cput(d, "(N,T,F,(),(i1),(i1,i2),(i1,i2,i3),(i1,i2,i3,i4))");
  cput(d, ",");
  /* a shared frame dict through the memo */
  e_str(d, "shared", 6);
  cput(d, ":[");
  msnap__pw_op(&d->pw, MSNAP_OP_EMPTY_LIST);
  msnap__pw_op(&d->pw, MSNAP_OP_MARK);
  msnap__pw_op(&d->pw, MSNAP_OP_EMPTY_DICT);
  uint32_t fm = msnap__pw_memoize(&d->pw);
  msnap__pw_op(&d->pw, MSNAP_OP_MARK);
  cput(d, "{");
  e_str(d, "line", 4);
  cput(d, ":");
  e_int(d, 3);
  cput(d, "}");
  msnap__pw_op(&d->pw, MSNAP_OP_SETITEMS);
  for (int i = 0; i < 4; i++) {
    msnap__pw_get(&d->pw, fm);
    cput(d, ",{s6c696e65;:i3}");
  }
  msnap__pw_op(&d->pw, MSNAP_OP_APPENDS);
  cput(d, "]}");
  msnap__pw_op(&d->pw, MSNAP_OP_SETITEMS);
}

static void test_encoder_vs_cpython(void **state) {
  (void)state;
  memset(big, 'x', sizeof big - 1);
  for (size_t i = 0; i < sizeof big - 1; i += 97) big[i] = 'a' + i % 26;
  dual_t d;
  memset(&d, 0, sizeof d);
  assert_int_equal(msnap__sink_init_mem(&d.out, &d.out_mb), 0);
  assert_int_equal(msnap__sink_init_mem(&d.canon, &d.canon_mb), 0);
  assert_int_equal(msnap__pw_init(&d.pw, &d.out), 0);
  write_value(&d);
  assert_int_equal(msnap__pw_finish(&d.pw), 0);
  assert_int_equal(msnap__sink_finish(&d.out), 0);
  msnap__sink_write(&d.canon, "", 1);
  assert_int_equal(msnap__sink_finish(&d.canon), 0);
  /* our reader agrees */
  msnap_membuf_t mb = {0};
  msnap_read_error_t err;
  assert_int_equal(test_pickle_canon(d.out_mb.data, d.out_mb.len, &mb, &err),
                   0);
  assert_string_equal(mb.data, d.canon_mb.data);
  free(mb.data);
  /* and CPython */
  char *tmp = tu_tmpdir();
  char p[4096], c[4096], cmd[12000];
  snprintf(p, sizeof p, "%s/v.pickle", tmp);
  snprintf(c, sizeof c, "%s/v.canon", tmp);
  assert_int_equal(tu_write(p, d.out_mb.data, d.out_mb.len), 0);
  assert_int_equal(tu_write(c, d.canon_mb.data, strlen(d.canon_mb.data)), 0);
  snprintf(cmd, sizeof cmd, "python3 '%s/tests/pickle/pwcheck.py' '%s' '%s'",
           tu_src(), p, c);
  assert_int_equal(system(cmd), 0);
  tu_rmrf(tmp);
  free(tmp);
  free(d.out_mb.data);
  free(d.canon_mb.data);
}

static void test_encoder_refuses(void **state) {
  (void)state;
  msnap_sink_t s;
  msnap_membuf_t mb = {0};
  msnap_pw_t pw;
  assert_int_equal(msnap__sink_init_mem(&s, &mb), 0);
  assert_int_equal(msnap__pw_init(&pw, &s), 0);
  msnap__pw_uint(&pw, INT64_MAX, "ok");
  assert_int_equal(pw.err, 0);
  msnap__pw_uint(&pw, UINT64_MAX, "addr");
  assert_int_equal(pw.err, MSNAP_EINVAL);
  assert_string_equal(pw.msg, "addr = 18446744073709551615 is >= 2^63; "
                              "refused (MemoryViz cannot read it)");
  size_t used = pw.used;
  msnap__pw_int(&pw, 5); /* sticky: no-op */
  assert_int_equal(pw.used, used);
  assert_int_equal(msnap__pw_finish(&pw), MSNAP_EINVAL);
  msnap__sink_finish(&s);
  free(mb.data);
}

/* ---- sinks -------------------------------------------------------------- */

typedef struct cbstate_s {
  size_t bytes, calls, fail_after;
} cbstate_t;

static int cb_write(void *opaque, const void *p, size_t len) {
  cbstate_t *c = opaque;
  (void)p;
  if (c->calls++ >= c->fail_after) return MSNAP_EIO;
  c->bytes += len;
  return 0;
}

static void test_sinks(void **state) {
  (void)state;
  /* memory: many writes, content intact */
  msnap_sink_t s;
  msnap_membuf_t mb = {0};
  assert_int_equal(msnap__sink_init_mem(&s, &mb), 0);
  char chunk[1000];
  for (int i = 0; i < 3000; i++) {
    memset(chunk, 'a' + i % 26, sizeof chunk);
    assert_int_equal(msnap__sink_write(&s, chunk, (size_t)(i % 1000) + 1), 0);
  }
  uint64_t expect = 0;
  for (int i = 0; i < 3000; i++) expect += (uint64_t)(i % 1000) + 1;
  assert_int_equal(s.bytes, expect);
  static char huge[1 << 20];
  assert_int_equal(msnap__sink_write(&s, huge, sizeof huge), 0);
  assert_int_equal(msnap__sink_finish(&s), 0);
  assert_int_equal(mb.len, expect + sizeof huge);
  assert_int_equal(mb.data[0], 'a');
  assert_int_equal(mb.data[1], 'b');
  free(mb.data);
  /* callback: error is sticky */
  cbstate_t cs = {0, 0, 1};
  assert_int_equal(msnap__sink_init_cb(&s, cb_write, &cs), 0);
  assert_int_equal(msnap__sink_write(&s, huge, sizeof huge), 0);
  assert_int_equal(msnap__sink_write(&s, huge, sizeof huge), MSNAP_EIO);
  assert_int_equal(msnap__sink_write(&s, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap__sink_finish(&s), MSNAP_EIO);
  assert_int_equal(cs.calls, 2);
  /* fd on a full disk: ENOSPC */
  int fd = open("/dev/full", O_WRONLY);
  if (fd >= 0) {
    assert_int_equal(msnap__sink_init_fd(&s, fd), 0);
    assert_int_equal(msnap__sink_write(&s, "abc", 3), 0);
    assert_int_equal(msnap__sink_finish(&s), MSNAP_ENOSPC);
    close(fd);
  } else {
    fprintf(stderr, "note: /dev/full missing, ENOSPC case not run\n");
  }
  assert_int_equal(msnap__sink_init_fd(&s, -1), MSNAP_EINVAL);
}

static int count_entries(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  int n = -1;
  if (p) {
    if (fscanf(p, "%d", &n) != 1) n = -1;
    pclose(p);
  }
  return n;
}

static void test_atomic(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  char path[4096];
  snprintf(path, sizeof path, "%s/out.pickle", tmp);
  assert_int_equal(tu_write(path, "old", 3), 0);
  /* abort: target unchanged, temporary removed */
  msnap_atomic_file_t f;
  assert_int_equal(msnap__atomic_open(&f, path), 0);
  assert_non_null(strstr(f.tmp_name, "out.pickle.tmp."));
  assert_int_equal(count_entries(tmp), 2);
  assert_int_equal(write(f.fd, "new!", 4), 4);
  msnap__atomic_abort(&f);
  assert_int_equal(count_entries(tmp), 1);
  size_t n = 0;
  char *c = (char *)tu_slurp(path, &n);
  assert_int_equal(n, 3);
  assert_memory_equal(c, "old", 3);
  free(c);
  /* commit: replaced */
  assert_int_equal(msnap__atomic_open(&f, path), 0);
  msnap_sink_t s;
  assert_int_equal(msnap__sink_init_fd(&s, f.fd), 0);
  assert_int_equal(msnap__sink_write(&s, "new!", 4), 0);
  assert_int_equal(msnap__sink_finish(&s), 0);
  assert_int_equal(msnap__atomic_commit(&f), 0);
  assert_null(f.tmp_name);
  assert_int_equal(count_entries(tmp), 1);
  c = (char *)tu_slurp(path, &n);
  assert_int_equal(n, 4);
  assert_memory_equal(c, "new!", 4);
  free(c);
  /* a directory that does not exist */
  assert_int_equal(msnap__atomic_open(&f, "/nonexistent-dir/x.pickle"),
                   MSNAP_EIO);
  assert_int_equal(f.fd, -1);
  tu_rmrf(tmp);
  free(tmp);
}

/* Write "data!" to path through the atomic-file API; returns the first
 * error (open, sink or commit). */
static int atomic_put(const char *path) {
  msnap_atomic_file_t f;
  int rc = msnap__atomic_open(&f, path);
  if (rc != 0) return rc;
  msnap_sink_t s;
  assert_int_equal(msnap__sink_init_fd(&s, f.fd), 0);
  msnap__sink_write(&s, "data!", 5);
  rc = msnap__sink_finish(&s);
  if (rc != 0) {
    msnap__atomic_abort(&f);
    return rc;
  }
  return msnap__atomic_commit(&f);
}

static void *fifo_reader(void *arg) {
  const char *path = arg;
  static char got[64];
  memset(got, 0, sizeof got);
  int fd = open(path, O_RDONLY);
  if (fd >= 0) {
    size_t n = 0;
    ssize_t r;
    while (n < sizeof got - 1 && (r = read(fd, got + n, sizeof got - 1 - n)) > 0)
      n += (size_t)r;
    close(fd);
  }
  return got;
}

/* Regression: the atomic file used to rename its temporary over symlinks,
 * devices and FIFOs (turning /dev/full into a regular file) and reported
 * every failure as "input/output error". */
static void test_atomic_special_targets(void **state) {
  (void)state;
  char *tmp = tu_tmpdir();
  char path[4096], link[4096];
  struct stat st;
  /* Symlink: the link survives, the file it names gets the bytes, the
   * temporary lives next to the real file. */
  char sub[4096];
  snprintf(sub, sizeof sub, "%s/real", tmp);
  assert_int_equal(mkdir(sub, 0755), 0);
  snprintf(path, sizeof path, "%s/real/out.pickle", tmp);
  assert_int_equal(tu_write(path, "old", 3), 0);
  snprintf(link, sizeof link, "%s/link.pickle", tmp);
  assert_int_equal(symlink(path, link), 0);
  assert_int_equal(atomic_put(link), 0);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  size_t n = 0;
  char *c = (char *)tu_slurp(path, &n);
  assert_int_equal(n, 5);
  assert_memory_equal(c, "data!", 5);
  free(c);
  assert_int_equal(count_entries(tmp), 2);
  assert_int_equal(count_entries(sub), 1);
  /* Dangling symlink: refused, clearly. */
  snprintf(link, sizeof link, "%s/dangling", tmp);
  assert_int_equal(symlink("/nonexistent-dir/zz", link), 0);
  assert_int_equal(atomic_put(link), MSNAP_EIO);
  assert_non_null(strstr(msnap_last_error(), "dangling symlink"));
  assert_non_null(strstr(msnap_last_error(), link));
  /* Directory: "is a directory" with the path and errno EISDIR. */
  assert_int_equal(atomic_put(sub), MSNAP_EIO);
  assert_non_null(strstr(msnap_last_error(), "is a directory"));
  assert_non_null(strstr(msnap_last_error(), sub));
  assert_int_equal(msnap_last_errno(), EISDIR);
  assert_int_equal(stat(sub, &st), 0);
  assert_true(S_ISDIR(st.st_mode));
  /* Missing directory: named, not "input/output error" (nor a bare "No
   * such file or directory"). */
  assert_int_equal(atomic_put("/nonexistent-dir/x.pickle"), MSNAP_EIO);
  assert_string_equal(msnap_last_error(),
                      "cannot write '/nonexistent-dir/x.pickle': the "
                      "directory '/nonexistent-dir' does not exist");
  assert_int_equal(msnap_last_errno(), ENOENT);
  /* FIFO: written directly (a reader thread gets the bytes), still a FIFO. */
  snprintf(path, sizeof path, "%s/fifo", tmp);
  assert_int_equal(mkfifo(path, 0600), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fifo_reader, path), 0);
  assert_int_equal(atomic_put(path), 0);
  void *got = NULL;
  pthread_join(th, &got);
  assert_string_equal((char *)got, "data!");
  assert_int_equal(lstat(path, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  /* Character devices: own nodes in the temp dir (never the real /dev
   * ones, so a broken fix cannot destroy them); needs root. */
  snprintf(path, sizeof path, "%s/full", tmp);
  if (mknod(path, S_IFCHR | 0666, makedev(1, 7)) != 0) {
    fprintf(stderr, "SKIP: device targets: mknod: %s (needs root)\n",
            strerror(errno));
  } else {
    assert_int_equal(atomic_put(path), MSNAP_ENOSPC);
    assert_int_equal(msnap_last_errno(), ENOSPC);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(st.st_rdev, makedev(1, 7));
    snprintf(path, sizeof path, "%s/null", tmp);
    assert_int_equal(mknod(path, S_IFCHR | 0666, makedev(1, 3)), 0);
    assert_int_equal(atomic_put(path), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(st.st_rdev, makedev(1, 3));
  }
  tu_rmrf(tmp);
  free(tmp);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder_vs_cpython),
      cmocka_unit_test(test_encoder_refuses),
      cmocka_unit_test(test_sinks),
      cmocka_unit_test(test_atomic),
      cmocka_unit_test(test_atomic_special_targets),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
