/*
 * replay_main.c -- the regression half of every fuzz target.
 *
 * Linked with one fuzz_<target>.c (which defines LLVMFuzzerTestOneInput),
 * it feeds every file of the folders (or files) named on the command line
 * to that entry point, in name order, exactly as libFuzzer would, and
 * fails when a folder holds no input at all: a missing corpus must never
 * pass silently.  The entry point reports a problem by aborting (as under
 * libFuzzer), so a crash found once stays a failing test until fixed.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Read a whole file into a fresh malloc'd buffer (size+1, NUL-terminated
 * for convenience; the entry point sees exactly `size` bytes).  Returns
 * NULL and prints why on failure. */
static uint8_t *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, len = 0;
  uint8_t *buf = malloc(cap);
  while (buf != NULL) {
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (len < cap)
      break;
    cap *= 2;
    uint8_t *nb = realloc(buf, cap);
    if (nb == NULL)
      free(buf);
    buf = nb;
  }
  int bad = ferror(f);
  fclose(f);
  if (buf == NULL || bad) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    free(buf);
    return NULL;
  }
  *size = len;
  return buf;
}

/* Feed one file; returns 0 or -1 when it could not be read. */
static int replay_one(const char *path) {
  size_t size = 0;
  uint8_t *data = read_file(path, &size);
  if (data == NULL)
    return -1;
  /* An exact-size copy so that ASan sees reads past the end. */
  uint8_t *exact = malloc(size ? size : 1);
  if (exact == NULL) {
    free(data);
    return -1;
  }
  memcpy(exact, data, size);
  free(data);
  printf("replay: %s (%zu bytes)\n", path, size);
  fflush(stdout);
  LLVMFuzzerTestOneInput(exact, size);
  free(exact);
  return 0;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replay every regular file of folder `dir` (except README*) in name
 * order; adds to *count.  Returns 0 or -1. */
static int replay_dir(const char *dir, int *count) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "replay: cannot open corpus folder %s: %s\n", dir,
            strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || strncmp(e->d_name, "README", 6) == 0)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **nn = realloc(names, cap * sizeof *names);
      if (nn == NULL)
        abort();
      names = nn;
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_names);
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(dir) + strlen(names[i]) + 2;
    char *path = malloc(len);
    snprintf(path, len, "%s/%s", dir, names[i]);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (replay_one(path) != 0)
        rc = -1;
      else
        (*count)++;
    }
    free(path);
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize != NULL)
    LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  int failed = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
      failed = 1;
      continue;
    }
    int count = 0;
    if (S_ISDIR(st.st_mode)) {
      if (replay_dir(argv[i], &count) != 0)
        failed = 1;
      if (count == 0) {
        fprintf(stderr, "replay: corpus folder %s holds no input\n",
                argv[i]);
        failed = 1;
      }
    } else if (replay_one(argv[i]) != 0) {
      failed = 1;
    } else {
      count = 1;
    }
    printf("replay: %d input(s) from %s passed\n", count, argv[i]);
  }
  return failed;
}
