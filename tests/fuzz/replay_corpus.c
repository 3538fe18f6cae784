/*
 * replay_corpus.c -- runs LLVMFuzzerTestOneInput over every file of a
 * corpus folder (tests/corpus/) as a normal test, and checks the expected
 * outcome encoded in the file name: "hostile_*" files must be refused by
 * the snapshot reader with an "offset N: ..." message; "small_*",
 * "old20_*" and "seglist_*" must read.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "runtime/runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/corpus";
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "cannot open corpus folder %s\n", dir);
    return 1;
  }
  struct dirent *e;
  int n = 0, bad = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    size_t got = buf ? fread(buf, 1, (size_t)len, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)len) {
      free(buf);
      fprintf(stderr, "%s: read error\n", path);
      bad++;
      continue;
    }
    LLVMFuzzerTestOneInput(buf, got);
    msnap_snap_t *s = NULL;
    msnap_read_error_t err;
    int rc = msnap__snap_read_buffer(buf, got, &s, &err);
    if (strncmp(e->d_name, "hostile_", 8) == 0) {
      if (rc == 0 || strncmp(err.msg, "offset ", 7) != 0) {
        fprintf(stderr, "%s: expected a refusal, got %d\n", e->d_name, rc);
        bad++;
      } else {
        printf("%s: refused: %s\n", e->d_name, err.msg);
      }
    } else if (strncmp(e->d_name, "small_", 6) == 0 ||
               strncmp(e->d_name, "old20_", 6) == 0 ||
               strncmp(e->d_name, "seglist_", 8) == 0) {
      if (rc != 0) {
        fprintf(stderr, "%s: expected to read: %s\n", e->d_name, err.msg);
        bad++;
      }
    }
    msnap__snap_free(s);
    free(buf);
    n++;
  }
  closedir(d);
  printf("%d corpus files replayed, %d unexpected\n", n, bad);
  return bad || n == 0 ? 1 : 0;
}
