/*
 * testutil.h -- helpers shared by the tests/pickle suites: file slurping,
 * running python3 helpers, locating the real inputs.
 */
#ifndef MSNAP_TESTS_PICKLE_UTIL_H
#define MSNAP_TESTS_PICKLE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Read a whole file; NULL if it cannot be read.  Caller frees. */
static inline unsigned char *tu_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
  if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  if (b) *len = (size_t)n;
  return b;
}

static inline int tu_write(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, n, f);
  return fclose(f) == 0 && w == n ? 0 : -1;
}

/* Source root (MEMSNAP_SOURCE_ROOT from meson, else "."). */
static inline const char *tu_src(void) {
  const char *s = getenv("MEMSNAP_SOURCE_ROOT");
  return s ? s : ".";
}

/* The real-inputs folder, or NULL when it does not exist. */
static inline const char *tu_real_inputs(void) {
  static char buf[4096];
  const char *s = getenv("MEMSNAP_REAL_INPUTS");
  if (!s) {
    snprintf(buf, sizeof buf, "%s/../shared/real_inputs", tu_src());
    s = buf;
  }
  struct stat st;
  return stat(s, &st) == 0 && S_ISDIR(st.st_mode) ? s : NULL;
}

/* A fresh temporary directory (mkdtemp); caller removes it. */
static inline char *tu_tmpdir(void) {
  char *t = strdup("/tmp/msnap-pickle-test-XXXXXX");
  return mkdtemp(t) ? t : NULL;
}

static inline void tu_rmrf(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

#endif
