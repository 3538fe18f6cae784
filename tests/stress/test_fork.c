/*
 * test_fork.c -- fork safety (src/fork.c).
 *
 * test_fork_while_busy: three threads work on one sim allocator with
 * history on (C stacks, so the unwinder and the stack table are busy):
 *   - an allocator thread: malloc/free of mixed sizes on two streams;
 *   - a recorder thread: record_stream across streams, annotations,
 *     memory metadata, record_function markers, empty_cache;
 *   - a dumper thread: snapshot pickles, dumps to a file, memory_summary.
 * Meanwhile the main thread forks 40 times.  Each child allocates, frees,
 * records, takes a snapshot, dumps it and checks the allocator's
 * invariants, then exits; the parent waits at most 30 s per child.  Every
 * child must exit 0 (0 hangs, 0 failures).  Without the atfork handlers
 * a child that inherits a held device or stack-table lock hangs.
 *
 * test_bad_fork_on_real_runtime: an allocator on a runtime other than the
 * sim (the allocator tests' fake runtime) is marked "bad fork" in the
 * child, as torch does for CUDA: malloc fails with MSNAP_ESTATE and the
 * 'spawn' advice, freeing an inherited pointer is a no-op, statistics
 * still read; the parent is unaffected.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memsnap.h"
#include "../alloc/fake_rt.h"

#define NFORKS 40
#define WAIT_SECONDS 30

typedef struct shared_s {
  msnap_allocator_t *a;
  atomic_bool stop;
  atomic_long ops[3];
  char dump_path[64];
} shared_t;

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void *allocating(void *arg) {
  shared_t *sh = arg;
  uint64_t rng = 0x9e3779b97f4a7c15ull, live[32] = {0};
  while (!atomic_load(&sh->stop)) {
    int k = (int)(rng_next(&rng) % 32);
    if (live[k] != 0) {
      msnap_free(sh->a, live[k]);
      live[k] = 0;
    } else {
      size_t size = (size_t)(512u << (rng_next(&rng) % 15));
      uint64_t stream = rng_next(&rng) % 2;
      if (msnap_malloc(sh->a, 0, size, stream, &live[k]) != 0) live[k] = 0;
    }
    atomic_fetch_add(&sh->ops[0], 1);
  }
  for (int k = 0; k < 32; k++) msnap_free(sh->a, live[k]);
  return NULL;
}

static void *recording(void *arg) {
  shared_t *sh = arg;
  uint64_t rng = 12345;
  int i = 0;
  while (!atomic_load(&sh->stop)) {
    uint64_t p = 0;
    size_t size = (size_t)(1u << (10 + rng_next(&rng) % 12));
    if (msnap_malloc(sh->a, 0, size, 1, &p) == 0) {
      msnap_record_stream(sh->a, p, 2 + (uint64_t)(i % 3));
      msnap_annotate_memory(sh->a, p, "fork-test");
      msnap_free(sh->a, p);
    }
    msnap_set_memory_metadata(i % 2 ? "step" : "");
    msnap_record_annotation(sh->a, 0, "region", i % 2 == 0);
    if (i % 50 == 0) msnap_empty_cache(sh->a, -1);
    i++;
    atomic_fetch_add(&sh->ops[1], 1);
  }
  return NULL;
}

static void *dumping(void *arg) {
  shared_t *sh = arg;
  while (!atomic_load(&sh->stop)) {
    char *pk = NULL, *summary = NULL;
    size_t len = 0;
    if (msnap_snapshot_pickle(sh->a, NULL, &pk, &len) == 0) msnap_free_string(pk);
    msnap_dump_snapshot(sh->a, NULL, sh->dump_path);
    if (msnap_memory_summary(sh->a, 0, false, &summary) == 0)
      msnap_free_string(summary);
    atomic_fetch_add(&sh->ops[2], 1);
  }
  return NULL;
}

/* What a child does: every kind of call must work on its copy. */
static int child_work(msnap_allocator_t *a, const char *dir, int n) {
  uint64_t p = 0, q = 0;
  if (msnap_malloc(a, 0, 3u << 20, 0, &p) != 0) return 10;
  if (msnap_malloc(a, 0, 4096, 1, &q) != 0) return 11;
  if (msnap_record_stream(a, q, 7) != 0) return 12;
  if (msnap_free(a, q) != 0 || msnap_free(a, p) != 0) return 13;
  char *pk = NULL;
  size_t len = 0;
  if (msnap_snapshot_pickle(a, NULL, &pk, &len) != 0 || len == 0) return 14;
  msnap_free_string(pk);
  char path[128];
  snprintf(path, sizeof path, "%s/child%d.pickle", dir, n);
  if (msnap_dump_snapshot(a, NULL, path) != 0) return 15;
  unlink(path);
  if (msnap_empty_cache(a, -1) != 0) return 16;
  char msg[256];
  if (msnap_check_invariants(a, msg, sizeof msg) != 0) {
    fprintf(stderr, "child %d: %s\n", n, msg);
    return 17;
  }
  if (msnap_in_bad_fork(a)) return 18;
  return 0;
}

/* Wait for pid at most WAIT_SECONDS; -1 when it hung (it is killed). */
static int wait_child(pid_t pid) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > WAIT_SECONDS) {
      /* A hang is a bug to find: show where the child waits when gdb is
       * there (stderr goes to the test log). */
      char cmd[160];
      snprintf(cmd, sizeof cmd,
               "gdb -p %d -batch -ex 'thread apply all bt' </dev/null "
               ">&2 2>&1 || true", (int)pid);
      if (access("/usr/bin/gdb", X_OK) == 0 && system(cmd) < 0)
        fprintf(stderr, "fork test: could not run gdb\n");
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    usleep(2000);
  }
}

/* GCC 12's AddressSanitizer allocator takes no lock around fork(): a
 * child forked while another thread is inside ASan's malloc blocks in
 * ASan's own allocator lock (seen here: SizeClassAllocator64::
 * GetFromAllocator in the child, memsnap holding none of its locks).  The
 * test is about memsnap's locks, so it runs in the builds without ASan
 * (make test, the release stress build). */
#if defined(__SANITIZE_ADDRESS__)
#define MSNAP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MSNAP_ASAN 1
#endif
#endif

static void test_fork_while_busy(void **state) {
  (void)state;
#ifdef MSNAP_ASAN
  fprintf(stderr, "SKIP test_fork_while_busy: the AddressSanitizer "
                  "allocator is not fork-safe (see the comment above)\n");
  skip();
#endif
  char dir[] = "/tmp/msnap_forkXXXXXX";
  assert_non_null(mkdtemp(dir));
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime_name = "sim";
  o.sim_memory = 8ull << 30;
  o.sim_devices = 1;
  static shared_t sh;
  assert_int_equal(msnap_allocator_create(&o, &sh.a), 0);
  msnap_history_options_t h;
  msnap_history_options_init(&h);
  h.stacks = MSNAP_STACKS_CPP;
  h.max_entries = 4096;
  assert_int_equal(msnap_record_history(sh.a, &h), 0);
  snprintf(sh.dump_path, sizeof sh.dump_path, "%s/parent.pickle", dir);
  atomic_store(&sh.stop, false);
  pthread_t th[3];
  void *(*fn[3])(void *) = {allocating, recording, dumping};
  for (int i = 0; i < 3; i++)
    assert_int_equal(pthread_create(&th[i], NULL, fn[i], &sh), 0);
  int hangs = 0, failures = 0;
  for (int n = 0; n < NFORKS; n++) {
    /* Let the threads get going (and vary where they are at the fork). */
    usleep((useconds_t)(500 + (n * 737) % 3000));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_work(sh.a, dir, n));
    int rc = wait_child(pid);
    if (rc == -1) {
      hangs++;
      fprintf(stderr, "fork %d: the child hung\n", n);
    } else if (rc != 0) {
      failures++;
      fprintf(stderr, "fork %d: the child exited with %d\n", n, rc);
    }
  }
  atomic_store(&sh.stop, true);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  assert_int_equal(hangs, 0);
  assert_int_equal(failures, 0);
  /* The threads really ran around the forks. */
  for (int i = 0; i < 3; i++) assert_true(atomic_load(&sh.ops[i]) > 0);
  char msg[256];
  assert_int_equal(msnap_check_invariants(sh.a, msg, sizeof msg), 0);
  assert_false(msnap_in_bad_fork(sh.a));
  msnap_allocator_destroy(sh.a);
  unlink(sh.dump_path);
  rmdir(dir);
}

static void test_bad_fork_on_real_runtime(void **state) {
  (void)state;
  fake_cfg_t cfg = {.devices = 1, .total = 1ull << 30, .no_vmm = false};
  msnap_options_t o;
  msnap_options_init(&o);
  o.runtime = fake_rt(&cfg);
  msnap_allocator_t *a = NULL;
  assert_int_equal(msnap_allocator_create(&o, &a), 0);
  uint64_t p = 0;
  assert_int_equal(msnap_malloc(a, 0, 1 << 20, 0, &p), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int code = 0;
    uint64_t q = 0;
    if (!msnap_in_bad_fork(a)) code = 1;
    else if (msnap_malloc(a, 0, 4096, 0, &q) != MSNAP_ESTATE) code = 2;
    else if (strstr(msnap_last_error(), "forked subprocess") == NULL ||
             strstr(msnap_last_error(), "'spawn' start method") == NULL)
      code = 3;
    else if (msnap_free(a, p) != 0) code = 4; /* inherited: forgotten */
    else if (msnap_empty_cache(a, -1) != MSNAP_ESTATE) code = 5;
    else {
      size_t f, t;
      msnap_stats_t st;
      memset(&st, 0, sizeof st);
      st.size = sizeof st;
      st.version = MSNAP_STATS_VERSION;
      if (msnap_mem_get_info(a, 0, &f, &t) != MSNAP_ESTATE) code = 6;
      else if (msnap_stats_get(a, 0, &st) != 0 ||
               st.allocated_bytes[MSNAP_STAT_ALL].current < (1 << 20))
        code = 7;
    }
    msnap_allocator_destroy(a); /* releases nothing in a bad fork */
    _exit(code);
  }
  assert_int_equal(wait_child(pid), 0);
  assert_false(msnap_in_bad_fork(a));
  uint64_t q = 0;
  assert_int_equal(msnap_malloc(a, 0, 4096, 0, &q), 0);
  assert_int_equal(msnap_free(a, q), 0);
  assert_int_equal(msnap_free(a, p), 0);
  msnap_allocator_destroy(a);
  assert_int_equal(fake_live(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_while_busy),
      cmocka_unit_test(test_bad_fork_on_real_runtime),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
