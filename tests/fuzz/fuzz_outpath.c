/*
 * fuzz_outpath.c -- fuzz target for the output-path resolver
 * (msnap__outpath_resolve, src/base/outpath.c), checked against the
 * kernel's own path walk.
 *
 * The input is text (cut at its first NUL), one command per line, run in
 * a fresh sandbox directory:
 *   d PATH          mkdir PATH (0755)
 *   D PATH          mkdir PATH, sticky and world-writable (01777, as /tmp)
 *   f PATH          create a regular file
 *   p PATH          create a FIFO
 *   l PATH TARGET   symlink PATH -> TARGET (a TARGET starting with '/'
 *                   is taken inside the sandbox)
 *   o PATH          lchown PATH to nobody (65534; as root only)
 *   > PATH          the output path to resolve (the last one counts;
 *                   inside the sandbox)
 * Setup paths may not contain ".." (they stay in the sandbox); the output
 * path and link targets may.  Nothing is ever written: resolution only.
 *
 * Checked, for every input:
 *   - the result is 0 or a negative MSNAP_E* code with a message, and a
 *     resolved target passes msnap__outpath_check (its invariants);
 *   - the walk agrees with the kernel's (open(path, O_PATH), which follows
 *     links the same way): a target found is the inode the kernel finds; a
 *     target reported absent, a missing or non-directory component, a
 *     link loop or a dangling link are failures for the kernel too;
 *   - a link refused by the protected_symlinks rule (EACCES) is refused by
 *     the kernel as well when fs.protected_symlinks is 1 (the same rule),
 *     and a target the kernel refuses so is never accepted; with the
 *     sysctl off (containers), a second walk on path strings with lstat
 *     decides the rule instead: memsnap refuses exactly when it meets a
 *     protected link.
 * A violation prints what and aborts (a crash for libFuzzer, a failed
 * test for the corpus replay).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/sink.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "fuzz_outpath: %s: ", #cond);                           \
      fprintf(stderr, __VA_ARGS__);                                           \
      fputc('\n', stderr);                                                    \
      abort();                                                                \
    }                                                                         \
  } while (0)

#define MAX_LINES 64
#define MAX_PATH_LEN 600

static int rm_one(const char *p, const struct stat *st, int flag,
                  struct FTW *f) {
  (void)st;
  (void)flag;
  (void)f;
  remove(p);
  return 0;
}

/* fs.protected_symlinks: 1, 0, or -1 when unreadable. */
static int kernel_rule(void) {
  static int v = -2;
  if (v == -2) {
    FILE *f = fopen("/proc/sys/fs/protected_symlinks", "r");
    v = -1;
    if (f) {
      if (fscanf(f, "%d", &v) != 1) v = -1;
      fclose(f);
    }
  }
  return v;
}

static bool safe_setup_path(const char *p) {
  if (!*p || p[0] == '/') return false;
  for (const char *c = p; (c = strstr(c, "..")) != NULL; c += 2)
    if ((c == p || c[-1] == '/') && (c[2] == '\0' || c[2] == '/'))
      return false;
  return true;
}

/* "<root>/<p>" (an absolute p is taken inside the sandbox too). */
static void in_box(char *out, size_t n, const char *root, const char *p) {
  snprintf(out, n, "%s/%s", root, p[0] == '/' ? p + 1 : p);
}

/*
 * A second walk, on path strings with lstat (not descriptors), for the
 * rule alone when the kernel's sysctl is off: 1 when the walk of `path`
 * meets a link that msnap__link_protected refuses before anything else
 * fails, else 0.  `cur` is always a link-free absolute path, so ".." is
 * its lexical parent.
 */
static int oracle_refuses(const char *path) {
  char cur[4096] = "", todo[8192], link[4096];
  snprintf(todo, sizeof todo, "%s", path);
  for (int links = 0; links <= 40;) {
    char *c = todo;
    while (*c == '/') c++;
    if (!*c) return 0;
    char *end = strchr(c, '/');
    size_t n = end ? (size_t)(end - c) : strlen(c);
    char comp[256];
    if (n >= sizeof comp) return 0;
    memcpy(comp, c, n);
    comp[n] = '\0';
    memmove(todo, c + n, strlen(c + n) + 1);
    if (strcmp(comp, ".") == 0) continue;
    if (strcmp(comp, "..") == 0) {
      char *slash = strrchr(cur, '/');
      if (slash) *slash = '\0';
      continue;
    }
    char next[4352];
    snprintf(next, sizeof next, "%.4000s/%.255s", cur, comp);
    struct stat ls, ds;
    if (lstat(next, &ls) != 0) return 0;
    if (!S_ISLNK(ls.st_mode)) {
      snprintf(cur, sizeof cur, "%.4095s", next);
      continue;
    }
    if (stat(cur[0] ? cur : "/", &ds) != 0) return 0;
    /* the kernel's may_follow_link, written out again */
    if ((ds.st_mode & (S_ISVTX | S_IWOTH)) == (S_ISVTX | S_IWOTH) &&
        ls.st_uid != geteuid() && ls.st_uid != ds.st_uid)
      return 1;
    ssize_t k = readlink(next, link, sizeof link - 1);
    if (k <= 0) return 0;
    link[k] = '\0';
    char rest[8192];
    snprintf(rest, sizeof rest, "%.4095s/%.4095s", link, todo);
    memcpy(todo, rest, sizeof todo);
    if (link[0] == '/') cur[0] = '\0';
    links++;
  }
  return 0;
}

static void check(const char *root, const char *out) {
  char full[MAX_PATH_LEN + 300];
  in_box(full, sizeof full, root, out);
  msnap_outpath_t o;
  int rc = msnap__outpath_resolve(&o, full);
  int kfd = open(full, O_PATH | O_CLOEXEC);
  int ke = kfd < 0 ? errno : 0;
  struct stat ks;
  if (kfd >= 0) {
    FZ_CHECK(fstat(kfd, &ks) == 0, "fstat");
    close(kfd);
  }
  int refuse = oracle_refuses(full);
  int e = rc == 0 ? 0 : msnap_last_errno();
  FZ_CHECK(refuse == (rc != 0 && e == EACCES) || (rc != 0 && e != EACCES),
           "%s: the link rule: memsnap %s, the string walk %s", full,
           rc == 0 ? "follows" : "refuses", refuse ? "refuses" : "follows");
  if (rc == 0) {
    char msg[160] = "";
    FZ_CHECK(msnap__outpath_check(&o, msg, sizeof msg) == 0, "%s: %s", full,
             msg);
    if (o.fd < 0) {
      if (o.exists) {
        struct stat s;
        FZ_CHECK(fstatat(o.dirfd, o.name, &s, AT_SYMLINK_NOFOLLOW) == 0,
                 "%s: the target vanished", full);
        FZ_CHECK(kfd >= 0, "%s: found by memsnap, the kernel says %s", full,
                 strerror(ke));
        FZ_CHECK(s.st_dev == ks.st_dev && s.st_ino == ks.st_ino,
                 "%s: memsnap and the kernel found different files", full);
      } else {
        FZ_CHECK(kfd < 0 && ke == ENOENT,
                 "%s: absent for memsnap, the kernel says %s", full,
                 kfd >= 0 ? "it exists" : strerror(ke));
      }
    }
    msnap__outpath_release(&o);
    return;
  }
  FZ_CHECK(rc < 0 && msnap_last_error()[0], "%s: rc %d without a message",
           full, rc);
  FZ_CHECK(o.dirfd == -1 && o.fd == -1 && o.name == NULL,
           "%s: a failed resolution holds resources", full);
  if (e == EACCES)
    FZ_CHECK(refuse, "%s: refused, but the string walk meets no protected "
             "link (%s)", full, msnap_last_error());
  if (e == ENOENT || e == ENOTDIR || e == ELOOP)
    FZ_CHECK(kfd < 0, "%s: memsnap says %s, the kernel opens it", full,
             strerror(e));
  if (e == EACCES && kernel_rule() == 1)
    FZ_CHECK(kfd < 0 && ke == EACCES,
             "%s: refused by memsnap's link rule, the kernel says %s", full,
             kfd >= 0 ? "fine" : strerror(ke));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  char root[64];
  snprintf(root, sizeof root, "%s/msnap-fuzz-outpath-XXXXXX",
           getenv("TMPDIR") && strlen(getenv("TMPDIR")) < 30 ? getenv("TMPDIR")
                                                             : "/tmp");
  if (!mkdtemp(root)) {
    free(text);
    return 0;
  }
  char out[MAX_PATH_LEN + 1] = "";
  int lines = 0;
  char *save = NULL;
  for (char *ln = strtok_r(text, "\n", &save); ln && lines < MAX_LINES;
       ln = strtok_r(NULL, "\n", &save), lines++) {
    if (strlen(ln) < 3 || ln[1] != ' ' || strlen(ln) > MAX_PATH_LEN) continue;
    char op = ln[0], *arg = ln + 2, *target = NULL;
    if (op == '>') {
      snprintf(out, sizeof out, "%s", arg);
      continue;
    }
    if (op == 'l') {
      target = strchr(arg, ' ');
      if (!target) continue;
      *target++ = '\0';
    }
    if (!safe_setup_path(arg)) continue;
    char p[MAX_PATH_LEN + 300], t[MAX_PATH_LEN + 300];
    in_box(p, sizeof p, root, arg);
    switch (op) {
    case 'd': (void)mkdir(p, 0755); break;
    case 'D':
      if (mkdir(p, 0777) == 0) (void)chmod(p, 01777);
      break;
    case 'f': {
      int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
      if (fd >= 0) close(fd);
      break;
    }
    case 'p': (void)mkfifo(p, 0644); break;
    case 'l':
      if (target[0] == '/') {
        in_box(t, sizeof t, root, target);
        target = t;
      }
      (void)symlink(target, p);
      break;
    case 'o':
      if (geteuid() == 0) (void)lchown(p, 65534, 65534);
      break;
    default: break;
    }
  }
  if (out[0]) check(root, out);
  nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  free(text);
  return 0;
}
