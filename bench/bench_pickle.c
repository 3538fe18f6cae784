/*
 * bench_pickle.c -- speed and memory of the snapshot writer and reader.
 *
 *   bench_pickle [N] [OUT]   (default 1000000 entries, /tmp/msnap-bench.pickle)
 *
 * Builds a model with N trace entries (1000 distinct 20-frame stacks shared
 * by the entries, as real traces share stacks), writes it as a pickle,
 * reads it back, and prints the times, the file size and the reader's
 * peak RSS growth.  With python3 available it also times CPython's
 * pickle.dump of the same object (loaded from our file) for the ratio the
 * project aims at (write <= 0.2x CPython).  No assertions: numbers only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_common.h"
#include "api/api.h"
#include "runtime/runtime.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long rss_kb(void) { return (long)(bench_peak_rss_bytes() / 1024); }

static int discard_cb(void *opaque, const void *p, size_t len) {
  (void)opaque;
  (void)p;
  (void)len;
  return 0;
}

/* `bench_pickle read FILE`: read only, in a fresh process, so the peak
 * RSS is the reader's own. */
static int read_only(const char *path) {
  long before = rss_kb();
  double t0 = now();
  msnap_snap_t *r = NULL;
  msnap_read_error_t err;
  if (msnap__snap_read_file(path, &r, &err) != 0) {
    fprintf(stderr, "read failed: %s\n", err.msg);
    return 1;
  }
  double t1 = now();
  long after = rss_kb();
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  printf("read %s: %.3fs, peak RSS growth %.1f MB for a %.1f MB file "
         "(%.2fx)\n",
         path, t1 - t0, (after - before) / 1e3, size / 1e6,
         (after - before) * 1e3 / (double)size);
  uint64_t ne = 0, cap = 0;
  for (uint32_t d = 0; d < r->ndevices; d++)
    ne += r->device_traces[d].n, cap += r->device_traces[d].cap;
  printf("model: %llu entries (%.1f MB, cap %llu), %u stacks (%.1f MB "
         "encoded, %.2f B/frame), %u frames, %u strings (%.1f MB), %u "
         "attribute sets\n",
         (unsigned long long)ne, ne * sizeof(msnap_strace_t) / 1e6,
         (unsigned long long)cap, r->nstacks, r->nstack_bytes / 1e6,
         0.0, r->nframes, r->nstrings, r->strbuf_len / 1e6, r->ntattrs);
  msnap__snap_free(r);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "read") == 0) return read_only(argv[2]);
  uint32_t n = argc > 1 ? (uint32_t)atol(argv[1]) : 1000000u;
  const char *out = argc > 2 ? argv[2] : "/tmp/msnap-bench.pickle";
  double t0 = now();
  msnap_snap_t *s = msnap__snap_new();
  uint32_t stacks[1000];
  for (int k = 0; k < 1000; k++) {
    uint32_t ids[20];
    for (int j = 0; j < 20; j++) {
      char name[64], file[64];
      int nn = snprintf(name, sizeof name, "fn_%d_%d", k % 97, j);
      int fl = snprintf(file, sizeof file, "/src/mod%d.py", (k + j) % 53);
      msnap_frame_t f = {.name = msnap__snap_intern(s, name, (size_t)nn),
                         .filename = msnap__snap_intern(s, file, (size_t)fl),
                         .line = (k * 31 + j) % 700};
      ids[j] = msnap__snap_frame(s, &f);
    }
    stacks[k] = msnap__snap_stack(s, ids, 20);
  }
  msnap__snap_set_devices(s, 1);
  msnap_str_t na = msnap__snap_intern(s, "N/A", 3);
  for (uint32_t i = 0; i < n; i++) {
    msnap_strace_t *t = msnap__snap_add_trace(s, &s->device_traces[0]);
    t->action = (uint8_t)(i % 3 == 0 ? MSNAP_ACTION_ALLOC
                          : i % 3 == 1 ? MSNAP_ACTION_FREE_REQUESTED
                                       : MSNAP_ACTION_FREE_COMPLETED);
    t->addr = 139927954128896ull + (uint64_t)(i % 5000) * 512;
    t->size = 512 + (i % 1000) * 64;
    t->time_us = 1772552894612167ll + i;
    t->frames = stacks[i % 1000];
    msnap_tattr_t a = {.compile_context = na,
                       .user_metadata = MSNAP_STR_EMPTY};
    msnap__snap_trace_set_attr(s, t, &a);
  }
  double t1 = now();
  if (msnap__snap_write_file(s, out, false) != 0) {
    fprintf(stderr, "write failed\n");
    return 1;
  }
  double t2 = now();
  /* the encoder alone: a sink that discards */
  msnap_sink_t null_sink;
  msnap__sink_init_cb(&null_sink, discard_cb, NULL);
  double t5 = now();
  msnap__snap_write_pickle(s, &null_sink);
  double t6 = now();
  msnap__sink_finish(&null_sink);
  printf("encoder alone (discarding sink): %.3fs\n", t6 - t5);
  msnap__snap_free(s);
  FILE *f = fopen(out, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  long before = rss_kb();
  double t3 = now();
  msnap_snap_t *r = NULL;
  msnap_read_error_t err;
  if (msnap__snap_read_file(out, &r, &err) != 0) {
    fprintf(stderr, "read failed: %s\n", err.msg);
    return 1;
  }
  double t4 = now();
  long after = rss_kb();
  printf("entries %u: build %.3fs, write %.3fs, file %.1f MB, read %.3fs, "
         "reader peak RSS growth %.1f MB (%.2fx the file)\n",
         n, t1 - t0, t2 - t1, size / 1e6, t4 - t3, (after - before) / 1e3,
         (after - before) * 1e3 / (double)size);
  msnap__snap_free(r);
  if (argc > 3 && strcmp(argv[3], "--no-python") == 0) return 0;
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import pickle,time\n"
           "d=pickle.load(open('%s','rb'))\n"
           "t=time.perf_counter(); f=open('/tmp/msnap-bench-py.pickle','wb');"
           " pickle.dump(d,f); f.close(); dt=time.perf_counter()-t\n"
           "print('CPython pickle.dump %%.3fs; memsnap write / CPython = "
           "%%.3f' %% (dt, %f/dt))\"",
           out, t2 - t1);
  if (system(cmd) != 0) fprintf(stderr, "python3 comparison failed\n");
  remove("/tmp/msnap-bench-py.pickle");
  return 0;
}
