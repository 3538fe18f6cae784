/*
 * bench_read.c -- the reader against the physical floor (issue 13 row 1).
 *
 *   bench_read walk FILE   a minimal C opcode walk over the mmap'ed file:
 *                          each pickle opcode's length is decoded and its
 *                          argument skipped, nothing is built -- what
 *                          reading the bytes costs at the least
 *   bench_read read FILE   msnap__snap_read_file: the whole model
 *   bench_read generic FILE  the same with the fast path off (the generic
 *                          interpreter alone), for comparison
 *
 * Each run is one fresh process (bench/run.py alternates them and takes
 * medians); both map the file the same way (MAP_PRIVATE, sequential
 * advice, the page cache warm).  Prints RESULT lines: wall and CPU
 * (user + sys) seconds, bytes, and for read the peak RSS growth (VmHWM
 * after minus before).  The CPU time is what the comparison uses on a
 * shared machine; the wall time is reported as well.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "model/snapshot.h"

static double wall(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 +
         (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static uint64_t le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Skip every opcode and its argument up to STOP; returns the opcode
 * count (or 0 for a pickle it does not understand). */
static uint64_t walk(const unsigned char *p, const unsigned char *e,
                     uint64_t *check) {
  uint64_t n = 0, sum = 0;
  while (p < e) {
    unsigned op = *p++;
    n++;
    switch (op) {
    case 0x80: case 'K': case 'h': case 'q': p += 1; break;
    case 'M': p += 2; break;
    case 'J': case 'j': case 'r': p += 4; break;
    case 0x95: case 'G': p += 8; break;
    case 0x8a: case 0x8c: case 'C': case 'U': {
      size_t k = *p++;
      sum += k ? p[0] : 0; /* touch the argument, as a reader does */
      p += k;
      break;
    }
    case 'X': case 'B': case 'T': {
      size_t k = (size_t)le(p, 4);
      p += 4;
      sum += k ? p[0] : 0;
      p += k;
      break;
    }
    case 0x8d: case 0x8e: case 0x96: {
      size_t k = (size_t)le(p, 8);
      p += 8 + k;
      break;
    }
    case '.':
      *check = sum;
      return n;
    case '(': case ')': case ']': case '}': case 'a': case 'e': case 'u':
    case 's': case 't': case 'l': case 'd': case 'N': case 0x85:
    case 0x86: case 0x87: case 0x88: case 0x89: case 0x94: case '0':
    case '1': case '2':
      break;
    default:
      return 0;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "walk") && strcmp(argv[1], "read") &&
                    strcmp(argv[1], "generic"))) {
    fprintf(stderr, "usage: bench_read walk|read|generic FILE\n");
    return 2;
  }
  const char *path = argv[2];
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return 1;
  }
  uint64_t before = bench_peak_rss_bytes();
  double w0 = wall(), c0 = cpu();
  if (strcmp(argv[1], "walk") == 0) {
    int fd = open(path, O_RDONLY);
    const unsigned char *m =
        mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
      perror("mmap");
      return 1;
    }
    madvise((void *)m, (size_t)st.st_size, MADV_SEQUENTIAL);
    uint64_t check = 0;
    uint64_t ops = walk(m, m + st.st_size, &check);
    double w1 = wall(), c1 = cpu();
    if (ops == 0) {
      fprintf(stderr, "walk: an opcode it does not know\n");
      return 1;
    }
    printf("RESULT ops=%llu\nRESULT check=%llu\n", (unsigned long long)ops,
           (unsigned long long)check);
    printf("RESULT wall_s=%.4f\nRESULT cpu_s=%.4f\n", w1 - w0, c1 - c0);
  } else {
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    int rc;
    if (strcmp(argv[1], "generic") == 0) {
      /* the file in memory first (not timed): the buffer reader */
      int fd = open(path, O_RDONLY);
      const unsigned char *m =
          mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
      close(fd);
      msnap_read_stats_t stt = {.generic_only = true};
      w0 = wall();
      c0 = cpu();
      rc = msnap__snap_read_buffer_ex(m, (size_t)st.st_size, &s, &err, &stt);
    } else {
      rc = msnap__snap_read_file(path, &s, &err);
    }
    double w1 = wall(), c1 = cpu();
    uint64_t after = bench_peak_rss_bytes();
    if (rc != 0) {
      fprintf(stderr, "read failed: %s\n", err.msg);
      return 1;
    }
    uint64_t ne = 0;
    for (uint32_t d = 0; d < s->ndevices; d++) ne += s->device_traces[d].n;
    printf("RESULT entries=%llu\nRESULT stacks=%u\nRESULT frames=%u\n",
           (unsigned long long)ne, s->nstacks, s->nframes);
    printf("RESULT stack_bytes=%llu\n", (unsigned long long)s->nstack_bytes);
    printf("RESULT wall_s=%.4f\nRESULT cpu_s=%.4f\n", w1 - w0, c1 - c0);
    printf("RESULT rss_growth=%llu\n",
           (unsigned long long)(after - before));
    msnap__snap_free(s);
  }
  printf("RESULT bytes=%lld\n", (long long)st.st_size);
  return 0;
}
