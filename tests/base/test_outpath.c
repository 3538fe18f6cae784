/*
 * test_outpath.c -- where every output of memsnap goes (src/base/outpath.c
 * and the atomic files of src/base/sink.c): the kernel's
 * protected_symlinks rule in user space, the replaced file's mode, links
 * in the middle of a path, descriptor links of /proc (/dev/stdout into a
 * pipe), unique names created with O_EXCL (the OOM dump's), and the
 * cleaning of temporaries that dead processes left.
 * msnap__outpath_check runs after every resolution.
 *
 * The rule needs a link owned by another user: as root the tests create
 * links owned by `nobody` (uid 65534) with lchown; without root those
 * cases are skipped, saying so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "base/sink.h"

#define NOBODY 65534

static char root[256];

static void path_of(char *buf, size_t n, const char *rel) {
  snprintf(buf, n, "%s/%s", root, rel);
}

static void put(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  assert_int_equal(chmod(path, mode), 0);
}

static char *slurp(const char *path) {
  static char buf[4096];
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n < 0 ? 0 : n] = '\0';
  return buf;
}

/* Resolve, check the invariants, release; returns the resolve code. */
static int resolve_checked(const char *path, msnap_outpath_t *o) {
  int rc = msnap__outpath_resolve(o, path);
  if (rc == 0) {
    char msg[128] = "";
    if (msnap__outpath_check(o, msg, sizeof msg) != 0)
      fail_msg("outpath invariants broken for %s: %s", path, msg);
  }
  return rc;
}

static int setup(void **state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/msnap-outpath-XXXXXX");
  if (!mkdtemp(root)) return -1;
  umask(022);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

/* A sticky world-writable directory (as /tmp), owned by `owner`. */
static void sticky_dir(char *buf, size_t n, const char *rel, uid_t owner) {
  path_of(buf, n, rel);
  assert_int_equal(mkdir(buf, 0777), 0);
  assert_int_equal(chmod(buf, 01777), 0);
  if (owner != geteuid()) assert_int_equal(chown(buf, owner, owner), 0);
}

static void test_plain_and_new(void **state) {
  (void)state;
  char p[512];
  msnap_outpath_t o;
  path_of(p, sizeof p, "new.pickle");
  assert_int_equal(resolve_checked(p, &o), 0);
  assert_false(o.exists);
  assert_string_equal(o.name, "new.pickle");
  assert_string_equal(o.shown, p);
  msnap__outpath_release(&o);
  /* a new file gets 0666 less the umask, as open(2) */
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), 0);
  struct stat st;
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  /* directories and trailing slashes are refused */
  path_of(p, sizeof p, "");
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EISDIR);
  assert_int_equal(msnap__write_file_atomic(root, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EISDIR);
  assert_non_null(strstr(msnap_last_error(), "it is a directory"));
  /* a trailing slash where nothing exists: refused (EISDIR, as open(2)),
   * saying there is no such directory, and nothing is created */
  path_of(p, sizeof p, "nodir/");
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EISDIR);
  assert_non_null(strstr(msnap_last_error(), "no such directory"));
  assert_null(strstr(msnap_last_error(), "it is a directory"));
  struct stat none;
  path_of(p, sizeof p, "nodir");
  assert_int_equal(lstat(p, &none), -1);
  /* a trailing slash after a file: ENOTDIR, the file untouched */
  path_of(p, sizeof p, "new.pickle/");
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENOTDIR);
  assert_non_null(strstr(msnap_last_error(), "but it is not one"));
  path_of(p, sizeof p, "new.pickle");
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_size, 1);
  /* a file in the middle of a path */
  path_of(p, sizeof p, "new.pickle/x");
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENOTDIR);
  /* "" as open(2) takes it: ENOENT */
  assert_int_equal(msnap__outpath_resolve(&o, ""), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENOENT);
}

static void test_own_link_keeps_mode(void **state) {
  (void)state;
  char dir[512], victim[600], link[600];
  sticky_dir(dir, sizeof dir, "own", geteuid());
  snprintf(victim, sizeof victim, "%s/private", dir);
  snprintf(link, sizeof link, "%s/link.pickle", dir);
  put(victim, "secret", 0600);
  assert_int_equal(symlink("private", link), 0);
  msnap_outpath_t o;
  assert_int_equal(resolve_checked(link, &o), 0);
  assert_true(o.exists);
  assert_string_equal(o.name, "private");
  assert_non_null(strstr(o.shown, "/own/private"));
  msnap__outpath_release(&o);
  assert_int_equal(msnap__write_file_atomic(link, "dump", 4), 0);
  struct stat st;
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode)); /* the link survives */
  assert_string_equal(slurp(victim), "dump");
  assert_int_equal(stat(victim, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0600); /* not 0644 */
  /* 0640 is kept too (the umask does not apply to a replaced file) */
  assert_int_equal(chmod(victim, 0640), 0);
  umask(077);
  assert_int_equal(msnap__write_file_atomic(victim, "again", 5), 0);
  umask(022);
  assert_int_equal(stat(victim, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0640);
}

static bool need_root(void) {
  if (geteuid() == 0) return true;
  fprintf(stderr, "SKIP: links owned by another user need root (lchown)\n");
  return false;
}

static void test_planted_link_refused(void **state) {
  (void)state;
  if (!need_root()) return;
  char dir[512], victim[600], link[600], mid[600], out[700];
  sticky_dir(dir, sizeof dir, "planted", geteuid());
  snprintf(victim, sizeof victim, "%s/victim", root);
  put(victim, "secret", 0600);
  snprintf(link, sizeof link, "%s/dump.pickle", dir);
  assert_int_equal(symlink(victim, link), 0);
  assert_int_equal(lchown(link, NOBODY, NOBODY), 0);
  assert_int_equal(msnap_check_output(link), MSNAP_EIO); /* the pre-check */
  assert_int_equal(msnap_last_errno(), EACCES);
  assert_non_null(strstr(msnap_last_error(), "protected_symlinks"));
  msnap_outpath_t o;
  assert_int_equal(resolve_checked(link, &o), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EACCES);
  const char *m = msnap_last_error();
  assert_non_null(strstr(m, "protected_symlinks"));
  assert_non_null(strstr(m, "uid 65534"));
  assert_non_null(strstr(m, "'dump.pickle'"));
  assert_int_equal(o.dirfd, -1);
  assert_int_equal(o.fd, -1);
  assert_int_equal(msnap__write_file_atomic(link, "dump", 4), MSNAP_EIO);
  assert_string_equal(slurp(victim), "secret");
  struct stat st;
  assert_int_equal(stat(victim, &st), 0);
  assert_int_equal(st.st_mode & 07777, 0600);
  /* nothing was created next to the link either */
  char cmd[700];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", dir);
  assert_int_equal(system(cmd), 0);
  /* a planted link to a directory, in the middle of the path */
  snprintf(mid, sizeof mid, "%s/dirlink", dir);
  assert_int_equal(symlink(root, mid), 0);
  assert_int_equal(lchown(mid, NOBODY, NOBODY), 0);
  snprintf(out, sizeof out, "%s/victim", mid);
  assert_int_equal(msnap__write_file_atomic(out, "dump", 4), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EACCES);
  assert_string_equal(slurp(victim), "secret");
  /* a FIFO another user left there is not written into */
  snprintf(out, sizeof out, "%s/fifo", dir);
  assert_int_equal(mkfifo(out, 0666), 0);
  assert_int_equal(chown(out, NOBODY, NOBODY), 0);
  assert_int_equal(msnap__write_file_atomic(out, "dump", 4), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EACCES);
  /* and the pre-check refuses it as the write does (it let it pass) */
  assert_int_equal(msnap_check_output(out), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EACCES);
  assert_non_null(strstr(msnap_last_error(), "FIFO of uid 65534"));
}

static void test_rule_exceptions(void **state) {
  (void)state;
  if (!need_root()) return;
  char dir[512], victim[600], link[600];
  snprintf(victim, sizeof victim, "%s/target", root);
  put(victim, "old", 0600);
  /* The same link of nobody's is followed in a sticky directory of
   * nobody's (the directory owner's link), a directory that is not sticky
   * (0777), and one that is sticky but not world-writable (01775). */
  const struct {
    const char *name;
    mode_t mode;
    uid_t owner;
  } dirs[] = {{"nobodys", 01777, NOBODY}, {"open", 0777, 0},
              {"group", 01775, 0}};
  for (int i = 0; i < 3; i++) {
    path_of(dir, sizeof dir, dirs[i].name);
    assert_int_equal(mkdir(dir, 0777), 0);
    assert_int_equal(chmod(dir, dirs[i].mode), 0);
    assert_int_equal(chown(dir, dirs[i].owner, dirs[i].owner), 0);
    snprintf(link, sizeof link, "%s/l", dir);
    assert_int_equal(symlink(victim, link), 0);
    assert_int_equal(lchown(link, NOBODY, NOBODY), 0);
    msnap_outpath_t o;
    assert_int_equal(resolve_checked(link, &o), 0);
    assert_string_equal(o.name, "target");
    msnap__outpath_release(&o);
  }
  /* the predicate itself */
  struct stat d = {0}, e = {0};
  d.st_mode = S_IFDIR | 01777;
  d.st_uid = 0;
  e.st_uid = geteuid() + 1;
  assert_true(msnap__link_protected(&d, &e));
  e.st_uid = geteuid();
  assert_false(msnap__link_protected(&d, &e));
  e.st_uid = 4242;
  d.st_uid = 4242;
  assert_false(msnap__link_protected(&d, &e));
  d.st_mode = S_IFDIR | 0777;
  d.st_uid = 0;
  assert_false(msnap__link_protected(&d, &e));
}

static void test_loops_and_dangling(void **state) {
  (void)state;
  char a[512], b[512], p[600];
  path_of(a, sizeof a, "loop-a");
  path_of(b, sizeof b, "loop-b");
  assert_int_equal(symlink("loop-b", a), 0);
  assert_int_equal(symlink("loop-a", b), 0);
  assert_int_equal(msnap__write_file_atomic(a, "x", 1), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ELOOP);
  path_of(a, sizeof a, "dangling");
  assert_int_equal(symlink("no-such-dir/zz", a), 0);
  assert_int_equal(msnap__write_file_atomic(a, "x", 1), MSNAP_EIO);
  assert_non_null(strstr(msnap_last_error(), "dangling symlink"));
  /* a link to a directory in the middle, then a new name: created there */
  path_of(a, sizeof a, "sub");
  assert_int_equal(mkdir(a, 0755), 0);
  path_of(b, sizeof b, "sublink");
  assert_int_equal(symlink("sub", b), 0);
  snprintf(p, sizeof p, "%s/made.pickle", b);
  assert_int_equal(msnap__write_file_atomic(p, "made", 4), 0);
  snprintf(p, sizeof p, "%s/made.pickle", a);
  assert_string_equal(slurp(p), "made");
  /* ".." after a link goes up from where the link led (as the kernel) */
  snprintf(p, sizeof p, "%s/../up.pickle", b);
  assert_int_equal(msnap__write_file_atomic(p, "up", 2), 0);
  path_of(p, sizeof p, "up.pickle");
  assert_string_equal(slurp(p), "up");
}

/* msnap_check_output: what the write would refuse, refused up front with
 * the write's own errno and reason; nothing created either way (a planted
 * link: test_planted_link_refused). */
static void test_check_output(void **state) {
  (void)state;
  char p[600], q[600];
  path_of(p, sizeof p, "new.pickle");
  assert_int_equal(msnap_check_output(p), 0);
  assert_int_equal(access(p, F_OK), -1); /* not created */
  DIR *dir = opendir(root); /* nor the temporary it tried */
  assert_non_null(dir);
  for (struct dirent *de; (de = readdir(dir)) != NULL;)
    assert_true(strcmp(de->d_name, ".") == 0 ||
                strcmp(de->d_name, "..") == 0);
  closedir(dir);
  /* a file of /proc cannot be replaced (no file can be created beside
   * it), also by root, whom access(2) would let: the reason, not ENOENT's
   * "No such file or directory"; the same at the write */
  if (access("/proc/version", F_OK) == 0) {
    assert_int_equal(msnap_check_output("/proc/version"), MSNAP_EIO);
    assert_non_null(strstr(msnap_last_error(),
                           "cannot write '/proc/version': cannot replace it: "
                           "its directory is on a proc file system"));
    assert_null(strstr(msnap_last_error(), "No such file"));
    assert_int_equal(msnap__write_file_atomic("/proc/version", "x", 1),
                     MSNAP_EIO);
    assert_non_null(strstr(msnap_last_error(), "proc file system"));
  }
  path_of(p, sizeof p, "dangling");
  assert_int_equal(symlink("no-such-dir/zz", p), 0);
  assert_int_equal(msnap_check_output(p), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENOENT);
  assert_non_null(strstr(msnap_last_error(), "dangling symlink"));
  path_of(q, sizeof q, "no-such-dir");
  assert_int_equal(access(q, F_OK), -1);
  assert_int_equal(msnap_check_output(root), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EISDIR);
  path_of(p, sizeof p, "no-such-dir/x.pickle");
  assert_int_equal(msnap_check_output(p), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENOENT);
  path_of(p, sizeof p, "nodir/");
  assert_int_equal(msnap_check_output(p), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EISDIR);
  assert_int_equal(msnap_check_output("/dev/stdout"), 0);
}

/* A file of another user in a sticky directory of a third (/tmp): the
 * final rename would fail with EPERM, so the check and the atomic write
 * refuse it first and leave it as it was.  Needs root (a child becomes
 * nobody); skipped otherwise, saying so. */
static void test_sticky_replace(void **state) {
  (void)state;
  if (geteuid() != 0) {
    fprintf(stderr, "SKIP sticky replace: needs root to act as another "
                    "user\n");
    return;
  }
  char d[600], p[700];
  assert_int_equal(chmod(root, 0755), 0); /* nobody may look inside */
  sticky_dir(d, sizeof d, "shared", geteuid());
  snprintf(p, sizeof p, "%s/theirs.pickle", d);
  put(p, "kept", 0666);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0) _exit(3);
    if (msnap_check_output(p) != MSNAP_EIO || msnap_last_errno() != EPERM ||
        strstr(msnap_last_error(), "sticky directory") == NULL)
      _exit(4);
    if (msnap__write_file_atomic(p, "new", 3) != MSNAP_EIO) _exit(5);
    /* a new name in the same directory is fine */
    char q[800];
    snprintf(q, sizeof q, "%s/mine.pickle", d);
    if (msnap_check_output(q) != 0 || msnap__write_file_atomic(q, "x", 1))
      _exit(6);
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_string_equal(slurp(p), "kept");
  /* root (CAP_FOWNER) replaces it: the file is the directory owner's */
  assert_int_equal(msnap_check_output(p), 0);
  /* but not a file nobody planted there, in this world-writable sticky
   * directory (the kernel's protected_regular rule) */
  snprintf(p, sizeof p, "%s/planted.pickle", d);
  put(p, "planted", 0666);
  assert_int_equal(chown(p, NOBODY, NOBODY), 0);
  assert_int_equal(msnap_check_output(p), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), EPERM);
  assert_non_null(strstr(msnap_last_error(), "protected_regular"));
  assert_int_equal(msnap__write_file_atomic(p, "root's", 6), MSNAP_EIO);
  assert_string_equal(slurp(p), "planted");
}

/* /dev/stdout, /dev/fd/N, /proc/self/fd/N: this process's descriptor is
 * written (a pipe works; no temporary, no rename). */
static void test_descriptor_links(void **state) {
  (void)state;
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  for (int i = 0; i < 2; i++) {
    char p[64];
    snprintf(p, sizeof p, "%s/%d", i ? "/dev/fd" : "/proc/self/fd", pfd[1]);
    msnap_outpath_t o;
    assert_int_equal(resolve_checked(p, &o), 0);
    assert_true(o.fd >= 0);
    assert_null(o.name);
    msnap__outpath_release(&o);
    assert_int_equal(msnap__write_file_atomic(p, "piped", 5), 0);
    char got[8] = "";
    assert_int_equal(read(pfd[0], got, 5), 5);
    assert_memory_equal(got, "piped", 5);
  }
  /* /dev/stdout itself, with stdout made the pipe */
  int saved = dup(1);
  assert_int_equal(dup2(pfd[1], 1), 1);
  int rc = msnap__write_file_atomic("/dev/stdout", "stdout", 6);
  dup2(saved, 1);
  close(saved);
  assert_int_equal(rc, 0);
  char got[8] = "";
  assert_int_equal(read(pfd[0], got, 6), 6);
  assert_memory_equal(got, "stdout", 6);
  /* a descriptor open only for reading is refused, clearly */
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", pfd[0]);
  assert_int_equal(msnap__write_file_atomic(p, "x", 1), MSNAP_EIO);
  assert_non_null(strstr(msnap_last_error(), "not open for writing"));
  close(pfd[0]);
  close(pfd[1]);
}

/* A pid that existed and is gone now. */
static pid_t dead_pid(void) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(0);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  return pid;
}

static void test_tmp_clean(void **state) {
  (void)state;
  char dir[300], p[600];
  path_of(dir, sizeof dir, "stale");
  assert_int_equal(mkdir(dir, 0755), 0);
  const char *tag = msnap__tmp_tag();
  assert_int_equal(strlen(tag), 12);
  pid_t dead = dead_pid();
  struct {
    char name[200];
    bool removed;
  } f[10];
  int n = 0;
  snprintf(f[n].name, 200, "a.pickle.tmp.%s.%d.0", tag, (int)dead);
  f[n++].removed = true;
  snprintf(f[n].name, 200, "b.csv.tmp.%s.%d.17", tag, (int)dead);
  f[n++].removed = true;
  snprintf(f[n].name, 200, "live.tmp.%s.%d.0", tag, (int)getppid());
  f[n++].removed = false; /* a live process */
  snprintf(f[n].name, 200, "mine.tmp.%s.%d.0", tag, (int)getpid());
  f[n++].removed = false; /* this process (another thread's dump) */
  snprintf(f[n].name, 200, "host.tmp.0123456789ab.%d.0", (int)dead);
  f[n++].removed = strcmp(tag, "0123456789ab") == 0; /* another host */
  snprintf(f[n].name, 200, "old.tmp.%d.0", (int)dead);
  f[n++].removed = false; /* the old form: its host is unknown */
  snprintf(f[n].name, 200, "x.tmp.%s.%d.0junk", tag, (int)dead);
  f[n++].removed = false;
  snprintf(f[n].name, 200, "x.tmp.%s.-%d.0", tag, (int)dead);
  f[n++].removed = false;
  snprintf(f[n].name, 200, "unrelated.pickle");
  f[n++].removed = false;
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%.199s", dir, f[i].name);
    put(p, "x", 0644);
  }
  /* a link and a directory with a matching name are never removed */
  char victim[600];
  snprintf(victim, sizeof victim, "%s/kept", root);
  put(victim, "kept", 0644);
  snprintf(p, sizeof p, "%s/l.tmp.%s.%d.1", dir, tag, (int)dead);
  assert_int_equal(symlink(victim, p), 0);
  snprintf(p, sizeof p, "%s/d.tmp.%s.%d.2", dir, tag, (int)dead);
  assert_int_equal(mkdir(p, 0755), 0);
  int other = -1;
  if (geteuid() == 0) { /* another user's stale temporary: kept */
    snprintf(p, sizeof p, "%s/nobody.tmp.%s.%d.3", dir, tag, (int)dead);
    put(p, "x", 0644);
    assert_int_equal(chown(p, NOBODY, NOBODY), 0);
    other = 1;
  }
  /* the next dump to the directory cleans */
  snprintf(p, sizeof p, "%s/next.pickle", dir);
  assert_int_equal(msnap__write_file_atomic(p, "next", 4), 0);
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%.199s", dir, f[i].name);
    struct stat st;
    bool gone = lstat(p, &st) != 0;
    if (gone != f[i].removed)
      fail_msg("%s: %s", f[i].name, gone ? "removed" : "kept");
  }
  snprintf(p, sizeof p, "%s/l.tmp.%s.%d.1", dir, tag, (int)dead);
  struct stat st;
  assert_int_equal(lstat(p, &st), 0);
  assert_string_equal(slurp(victim), "kept");
  snprintf(p, sizeof p, "%s/d.tmp.%s.%d.2", dir, tag, (int)dead);
  assert_int_equal(lstat(p, &st), 0);
  if (other > 0) {
    snprintf(p, sizeof p, "%s/nobody.tmp.%s.%d.3", dir, tag, (int)dead);
    assert_int_equal(lstat(p, &st), 0);
  }
  /* a second pass finds nothing more */
  int dfd = open(dir, O_PATH | O_DIRECTORY);
  assert_true(dfd >= 0);
  assert_int_equal(msnap__tmp_clean(dfd), 0);
  close(dfd);
}

/* The temporary keeps at most 200 bytes of the name: a 250-byte name
 * still gets a temporary within NAME_MAX. */
static void test_long_name(void **state) {
  (void)state;
  char name[251], p[900];
  memset(name, 'n', 250);
  name[250] = '\0';
  snprintf(p, sizeof p, "%s/%s", root, name);
  assert_int_equal(msnap__write_file_atomic(p, "long", 4), 0);
  assert_string_equal(slurp(p), "long");
}

/* The temporaries' names cannot be taken in advance: the first 1000 of
 * the sequential form another user could compute (tag and pid are public;
 * each try took the next number of a per-process counter) planted as
 * links, an atomic write still succeeds and follows none. */
static void test_tmp_names_unpredictable(void **state) {
  (void)state;
  char p[700], victim[600];
  snprintf(victim, sizeof victim, "%s/victim2", root);
  put(victim, "secret", 0600);
  for (int n = 0; n < 1000; n++) {
    snprintf(p, sizeof p, "%s/t.pickle.tmp.%s.%d.%d", root, msnap__tmp_tag(),
             (int)getpid(), n);
    assert_int_equal(symlink(victim, p), 0);
  }
  snprintf(p, sizeof p, "%s/t.pickle", root);
  assert_int_equal(msnap__write_file_atomic(p, "fresh", 5), 0);
  assert_string_equal(slurp(p), "fresh");
  assert_string_equal(slurp(victim), "secret");
  for (int n = 0; n < 1000; n++) {
    snprintf(p, sizeof p, "%s/t.pickle.tmp.%s.%d.%d", root, msnap__tmp_tag(),
             (int)getpid(), n);
    unlink(p);
  }
}

/* Unique names (the OOM dump's): created with O_EXCL, an existing file,
 * a link or a dangling link is skipped, never reused or followed. */
static void test_name_reserve(void **state) {
  (void)state;
  char p[600], victim[600];
  snprintf(victim, sizeof victim, "%s/victim", root);
  put(victim, "secret", 0600);
  path_of(p, sizeof p, "oom.pickle");
  put(p, "earlier dump", 0644);
  path_of(p, sizeof p, "oom_1.pickle");
  assert_int_equal(symlink(victim, p), 0);
  path_of(p, sizeof p, "oom_2.pickle");
  assert_int_equal(symlink("nowhere/new", p), 0);
  char *got = msnap__name_reserve(root, "oom", ".pickle");
  assert_non_null(got);
  path_of(p, sizeof p, "oom_3.pickle");
  assert_string_equal(got, p);
  struct stat st;
  assert_int_equal(lstat(got, &st), 0);
  assert_true(S_ISREG(st.st_mode) && st.st_size == 0);
  assert_string_equal(slurp(victim), "secret");
  /* the dump goes over the reserved file */
  assert_int_equal(msnap__write_file_atomic(got, "dump", 4), 0);
  assert_string_equal(slurp(got), "dump");
  /* unreserve removes only the empty file of ours */
  msnap__name_unreserve(got);
  assert_int_equal(lstat(got, &st), 0);
  free(got);
  got = msnap__name_reserve(root, "oom", ".pickle");
  assert_non_null(strstr(got, "oom_4.pickle"));
  msnap__name_unreserve(got);
  assert_int_equal(lstat(got, &st), -1);
  free(got);
  path_of(p, sizeof p, "oom_1.pickle");
  assert_int_equal(lstat(p, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  /* every numbered name taken in advance (links to the victim, as another
   * user of a shared directory could plant them): a random name, 16 hex
   * digits, still created, still nothing written through a link */
  for (int n = 4; n < 100; n++) {
    char name[64];
    snprintf(name, sizeof name, "oom_%d.pickle", n);
    path_of(p, sizeof p, name);
    assert_int_equal(symlink(victim, p), 0);
  }
  got = msnap__name_reserve(root, "oom", ".pickle");
  assert_non_null(got);
  const char *base = strrchr(got, '/') + 1;
  assert_int_equal(strlen(base), strlen("oom_") + 16 + strlen(".pickle"));
  assert_int_equal(strncmp(base, "oom_", 4), 0);
  assert_int_equal(strspn(base + 4, "0123456789abcdef"), 16);
  assert_string_equal(base + 20, ".pickle");
  assert_int_equal(lstat(got, &st), 0);
  assert_true(S_ISREG(st.st_mode) && st.st_size == 0);
  assert_int_equal(msnap__write_file_atomic(got, "dump", 4), 0);
  assert_string_equal(slurp(got), "dump");
  assert_string_equal(slurp(victim), "secret");
  free(got);
  /* a directory that does not exist: NULL with the reason */
  path_of(p, sizeof p, "missing");
  assert_null(msnap__name_reserve(p, "oom", ".csv"));
  assert_int_equal(msnap_last_errno(), ENOENT);
}

/* A FIFO target: written directly once a program reads it; one that no
 * program opens for reading is refused after MSNAP_SINK_FIFO_WAIT_MS
 * instead of blocking open(2) for ever. */
static void test_fifo_target(void **state) {
  (void)state;
  char fifo[512];
  path_of(fifo, sizeof fifo, "out.fifo");
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(msnap__write_file_atomic(fifo, "dump", 4), MSNAP_EIO);
  assert_int_equal(msnap_last_errno(), ENXIO);
  assert_non_null(strstr(msnap_last_error(), "out.fifo': it is a FIFO that "
                                             "no reader opened (none within "
                                             "5 s)"));
  /* a reader that comes later (200 ms) gets every byte; the FIFO stays */
  static char big[1 << 18]; /* more than a pipe's buffer */
  for (size_t i = 0; i < sizeof big; i++) big[i] = (char)('a' + i % 26);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    int fd = open(fifo, O_RDONLY);
    size_t got = 0;
    bool same = fd >= 0;
    char b[4096];
    ssize_t n;
    while (fd >= 0 && (n = read(fd, b, sizeof b)) > 0) {
      same = same && got + (size_t)n <= sizeof big &&
             memcmp(b, big + got, (size_t)n) == 0;
      got += (size_t)n;
    }
    _exit(same && got == sizeof big ? 0 : 1);
  }
  assert_int_equal(msnap__write_file_atomic(fifo, big, sizeof big), 0);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  struct stat st;
  assert_int_equal(lstat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_plain_and_new, setup, teardown),
      cmocka_unit_test_setup_teardown(test_own_link_keeps_mode, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_planted_link_refused, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_rule_exceptions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_loops_and_dangling, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_descriptor_links, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tmp_clean, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_name, setup, teardown),
      cmocka_unit_test_setup_teardown(test_tmp_names_unpredictable, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_name_reserve, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_output, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fifo_target, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sticky_replace, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
