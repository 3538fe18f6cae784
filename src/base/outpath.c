/*
 * outpath.c -- where an output path really leads, under the kernel's
 * protected_symlinks rule, and the temporaries that killed writers left.
 *
 * Every file memsnap writes (dumps, `-o` of the CLI, the OOM dump, the
 * usage-report CSV) is resolved here before anything is created.  The
 * walk is done component by component on directory descriptors (openat
 * with O_NOFOLLOW; each symbolic link is read with readlinkat and spliced
 * into the rest of the path), never with realpath(3): a check and the
 * use it guards always name the same inode.  Rules:
 *
 *   - A symbolic link is followed only when fs.protected_symlinks would
 *     let the kernel follow it: not in a sticky world-writable directory
 *     (/tmp), or owned by the writer (euid), or owned by the directory's
 *     owner.  Otherwise the output is refused with EACCES and a message
 *     naming the link, its owner and the directory: a link someone else
 *     planted in /tmp never redirects a dump onto another file of the
 *     user (Linux fs/namei.c: may_follow_link).  At most 40 links
 *     (ELOOP), as the kernel.
 *   - A FIFO or socket that another user left in such a directory is
 *     refused the same way (fs.protected_fifos=2 applies it only to
 *     O_CREAT opens; a dump opens without O_CREAT).
 *   - A descriptor link of /proc (/dev/stdout -> /proc/self/fd/1, and
 *     /dev/fd/N, /proc/<pid>/fd/N) names an open file, not a path: for
 *     this process's own descriptors the descriptor is duplicated (a pipe,
 *     a socket, a file opened with >> keep their semantics); another
 *     process's descriptor is opened through the link.
 *   - A path ending in '/' names a directory, never a file: refused
 *     (EISDIR, as open(2) with O_CREAT; ENOTDIR after a file), the
 *     message saying whether a directory, a file or nothing is there.
 *
 * Invariants of a resolved msnap_outpath_t: either fd >= 0 (a descriptor
 * to write to; dirfd -1, name NULL) or dirfd >= 0 is the directory that
 * holds `name`, a single component without '/', and `dir` is that
 * directory's fstat.  When `exists`, `st` is the lstat of `name` and is
 * never a symbolic link at resolution time.  msnap__outpath_check()
 * checks this.
 *
 * Unique names (msnap__name_reserve, the OOM dump's files): the name is
 * created empty with O_CREAT | O_EXCL | O_NOFOLLOW -- "<stem><ext>", else
 * "<stem>_<n><ext>" for n = 1..99 (the next dumps of the same second),
 * else "<stem>_<r><ext>" with r 16 random hex digits (msnap__random_u64),
 * up to 100 of them -- so it is the caller's from the moment it exists:
 * no check-then-open window, and an existing name (an earlier file, a
 * planted link, even a dangling one) is never reused.  The random names
 * keep another user who took every numbered name in advance in a shared
 * directory from refusing the dump.  The content is
 * then renamed over it by an atomic file.
 *
 * Temporaries: an atomic file is written as
 * "<name>.tmp.<tag>.<pid>.<n>" (<n> random: sink.c, msnap__random_u64), where
 * <tag> is 12 hex digits naming the
 * host and the pid namespace (a hash of the host name, /etc/machine-id
 * and /proc/self/ns/pid).  msnap__tmp_clean removes, in one directory,
 * the regular files of that form whose tag is this process's tag, whose
 * owner is the effective user and whose pid no longer exists (kill(pid,
 * 0) == ESRCH): the leftovers of dumps killed on this host.  Nothing else
 * is ever removed -- not a link, not another user's file, not a name of
 * another host or container sharing the directory, not the older
 * "<name>.tmp.<pid>.<n>" form whose host cannot be known.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "base/base.h"
#include "base/sink.h"

#define OUT_MAX_LINKS 40
#ifndef PROC_SUPER_MAGIC
#define PROC_SUPER_MAGIC 0x9fa0
#endif

bool msnap__link_protected(const struct stat *dir, const struct stat *entry) {
  if ((dir->st_mode & (S_ISVTX | S_IWOTH)) != (S_ISVTX | S_IWOTH))
    return false;
  uid_t me = geteuid();
  return entry->st_uid != me && entry->st_uid != dir->st_uid;
}

static int out_err(int e, const char *path, const char *why) {
  return msnap__set_error_errno(msnap__errno_code(e), e,
                                "cannot write '%s': %s", path,
                                why ? why : strerror(e));
}

/* The refusal of the link rule, naming everything a user needs. */
static int out_refuse(const char *path, const char *what, const char *name,
                      const struct stat *entry, const struct stat *dir,
                      const char *dirname) {
  return msnap__set_error_errno(
      MSNAP_EIO, EACCES,
      "cannot write '%s': %s '%s' in the sticky world-writable directory "
      "'%s' belongs to uid %ld, neither you (uid %ld) nor the directory's "
      "owner (uid %ld); not following it (the kernel's protected_symlinks "
      "rule)",
      path, what, name, dirname, (long)entry->st_uid,
      (long)geteuid(), (long)dir->st_uid);
}

/* Append "/comp" (or "comp" first in a relative path) to the display. */
static void shown_push(msnap_strbuf_t *b, bool absolute, const char *c,
                       size_t n) {
  if (b->len > 0 || absolute) msnap__strbuf_append(b, "/", 1);
  msnap__strbuf_append(b, c, n);
}

/* The descriptor link /proc/<pid>/fd/N of this very process: is `dir`
 * (the "fd" directory on procfs) the one /proc/self/fd names? */
static bool own_fd_dir(const struct stat *dir) {
  struct stat s;
  if (stat("/proc/self/fd", &s) == 0 && s.st_dev == dir->st_dev &&
      s.st_ino == dir->st_ino)
    return true;
  return stat("/proc/thread-self/fd", &s) == 0 && s.st_dev == dir->st_dev &&
         s.st_ino == dir->st_ino;
}

/* The display path of directory component `c` under the directories
 * walked so far (`shown`), for the messages below; "?" without memory. */
static char *shown_with(const msnap_strbuf_t *shown, bool absolute,
                        const char *c) {
  msnap_strbuf_t b = {0};
  if (shown->len) msnap__strbuf_append(&b, shown->p, shown->len);
  shown_push(&b, absolute, c, strlen(c));
  if (b.err || !b.p) {
    free(b.p);
    return NULL;
  }
  return b.p;
}

/* Component `c` on the way to `path` is missing (e == ENOENT) or not a
 * directory (ENOTDIR): name it -- "No such file or directory" alone does
 * not say which one, nor that the file itself would be created. */
static int out_on_way(const char *path, const msnap_strbuf_t *shown,
                      bool absolute, const char *c, int e) {
  char *d = shown_with(shown, absolute, c);
  int rc = e == ENOENT
               ? msnap__set_error_errno(MSNAP_EIO, ENOENT,
                                        "cannot write '%s': the directory "
                                        "'%s' does not exist",
                                        path, d ? d : c)
               : msnap__set_error_errno(MSNAP_EIO, ENOTDIR,
                                        "cannot write '%s': '%s' is not a "
                                        "directory",
                                        path, d ? d : c);
  free(d);
  return rc;
}

/* Does the display path so far end in a directory named "fd"? */
static bool in_fd_dir(const msnap_strbuf_t *b) {
  return b->len >= 2 && strcmp(b->p + b->len - 2, "fd") == 0 &&
         (b->len == 2 || b->p[b->len - 3] == '/');
}

static bool all_digits(const char *s) {
  if (!*s) return false;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return false;
  return true;
}

/* A descriptor link on procfs: /proc/<pid>/fd/N.  Own descriptors are
 * duplicated; others opened through the link (the kernel follows it). */
static int out_fd_link(msnap_outpath_t *o, const char *path, int cur,
                       const struct stat *dir, const char *comp) {
  int fd;
  if (own_fd_dir(dir)) {
    long n = strtol(comp, NULL, 10);
    int fl = n <= INT_MAX ? fcntl((int)n, F_GETFL) : -1;
    if (fl < 0) return out_err(EBADF, path, NULL);
    if ((fl & O_ACCMODE) == O_RDONLY)
      return out_err(EBADF, path, "the descriptor is not open for writing");
    fd = fcntl((int)n, F_DUPFD_CLOEXEC, 3);
  } else {
    fd = openat(cur, comp, O_WRONLY | O_NOCTTY | O_CLOEXEC);
  }
  if (fd < 0) return out_err(errno, path, NULL);
  struct stat st;
  if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    close(fd);
    return out_err(EISDIR, path, "it is a directory");
  }
  o->fd = fd;
  o->exists = true;
  o->st = st;
  return 0;
}

void msnap__outpath_release(msnap_outpath_t *o) {
  if (o->dirfd >= 0) close(o->dirfd);
  if (o->fd >= 0) close(o->fd);
  free(o->name);
  free(o->shown);
  o->dirfd = o->fd = -1;
  o->name = o->shown = NULL;
}

int msnap__outpath_check(const msnap_outpath_t *o, char *msg, size_t len) {
  const char *bad = NULL;
  if (o->fd >= 0) {
    if (o->dirfd >= 0 || o->name) bad = "a descriptor target has a name";
  } else if (o->dirfd < 0 || !o->name || !o->name[0]) {
    bad = "no directory or name";
  } else if (strchr(o->name, '/')) {
    bad = "the name has a '/'";
  } else if (o->exists && S_ISLNK(o->st.st_mode)) {
    bad = "the target is a symbolic link";
  } else if (!S_ISDIR(o->dir.st_mode)) {
    bad = "dirfd is not a directory";
  }
  if (bad && msg && len) snprintf(msg, len, "%s", bad);
  return bad ? MSNAP_ESTATE : 0;
}

/*
 * Resolve `path` for writing.  The walk keeps the unresolved rest in
 * `todo` (a link's text spliced in front of what followed it) and the
 * directory reached so far in `cur`.  On success *o is filled (see the
 * invariants); on failure it is released and the last error names `path`.
 */
int msnap__outpath_resolve(msnap_outpath_t *o, const char *path) {
  memset(o, 0, sizeof *o);
  o->dirfd = o->fd = -1;
  if (!path)
    return msnap__set_error(MSNAP_EINVAL, "output path is NULL");
  if (!*path) /* as open(2) of "": ENOENT (Python's open('') too) */
    return msnap__set_error_errno(MSNAP_EIO, ENOENT,
                                  "cannot write '': No such file or "
                                  "directory (the path is empty)");
  char *todo = strdup(path);
  char *link = malloc(PATH_MAX);
  msnap_strbuf_t shown = {0};
  if (!todo || !link) {
    free(todo);
    free(link);
    return MSNAP_ENOMEM;
  }
  /* The last `own` bytes of todo are the caller's text; what precedes
   * them came from links (a missing component there: a dangling link). */
  bool absolute = path[0] == '/', followed = false;
  size_t own = strlen(path);
  int links = 0, rc = 0;
  int cur = open(absolute ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0) rc = out_err(errno, path, NULL);
  size_t pos = 0;
  char comp[NAME_MAX + 1];
  while (rc == 0) {
    while (todo[pos] == '/') pos++;
    size_t end = pos;
    while (todo[end] && todo[end] != '/') end++;
    size_t after = end;
    while (todo[after] == '/') after++;
    bool last = todo[after] == '\0';
    if (end == pos) {
      /* "/" (or a link to it): the root directory. */
      rc = out_err(EISDIR, path, "it is a directory");
      break;
    }
    if (end - pos > NAME_MAX) {
      rc = out_err(ENAMETOOLONG, path, NULL);
      break;
    }
    memcpy(comp, todo + pos, end - pos);
    comp[end - pos] = '\0';
    if (last && todo[end] == '/') {
      /* "x/" names a directory, never a file: refused, saying what is
       * there (the stat follows a link only for this message). */
      struct stat ts;
      int e = fstatat(cur, comp, &ts, 0) == 0 ? 0 : errno;
      if (e == 0 && S_ISDIR(ts.st_mode))
        rc = out_err(EISDIR, path, "it is a directory");
      else if (e == 0)
        rc = out_err(ENOTDIR, path,
                     "it ends in '/', which names a directory, but it is "
                     "not one");
      else if (e == ENOENT)
        rc = out_err(EISDIR, path,
                     "it ends in '/', which names a directory, not a file "
                     "(and there is no such directory)");
      else
        rc = out_err(e, path, NULL);
      break;
    }
    if (strcmp(comp, ".") == 0 && !last) {
      pos = end;
      continue;
    }
    struct stat ls, ds;
    if (fstat(cur, &ds) != 0) {
      rc = out_err(errno, path, NULL);
      break;
    }
    if (fstatat(cur, comp, &ls, AT_SYMLINK_NOFOLLOW) != 0) {
      int e = errno;
      if (e == ENOENT && pos < strlen(todo) - own) {
        rc = msnap__set_error_errno(
            MSNAP_EIO, e, "cannot write '%s': it is a dangling symlink",
            path);
        break;
      }
      if (e == ENOENT && last) {
        shown_push(&shown, absolute, comp, strlen(comp));
        o->exists = false;
        o->dir = ds;
        break; /* a new file in cur */
      }
      if (e == ENOENT) {
        rc = out_on_way(path, &shown, absolute, comp, ENOENT);
        break;
      }
      rc = out_err(e, path, NULL);
      break;
    }
    if (S_ISLNK(ls.st_mode)) {
      if (++links > OUT_MAX_LINKS) {
        rc = out_err(ELOOP, path, NULL);
        break;
      }
      if (msnap__link_protected(&ds, &ls)) {
        rc = out_refuse(path, "the symbolic link", comp, &ls, &ds,
                        shown.len ? shown.p : (absolute ? "/" : "."));
        break;
      }
      struct statfs sf;
      if (last && all_digits(comp) && in_fd_dir(&shown) &&
          fstatfs(cur, &sf) == 0 && sf.f_type == PROC_SUPER_MAGIC) {
        rc = out_fd_link(o, path, cur, &ds, comp);
        break;
      }
      ssize_t n = readlinkat(cur, comp, link, PATH_MAX);
      if (n < 0 || n >= PATH_MAX) {
        rc = out_err(n < 0 ? errno : ENAMETOOLONG, path, NULL);
        break;
      }
      link[n] = '\0';
      if (n == 0) {
        rc = out_err(ENOENT, path, NULL);
        break;
      }
      /* todo = link text + "/" + rest (rest may be empty). */
      const char *rest = todo + end;
      size_t rl = strlen(rest);
      char *next = malloc((size_t)n + rl + 1);
      if (!next) {
        rc = MSNAP_ENOMEM;
        break;
      }
      memcpy(next, link, (size_t)n);
      memcpy(next + n, rest, rl + 1);
      free(todo);
      todo = next;
      pos = 0;
      followed = true;
      if (own > rl) own = rl;
      if (link[0] == '/') {
        int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) {
          rc = out_err(errno, path, NULL);
          break;
        }
        close(cur);
        cur = root;
        absolute = true;
        shown.len = 0;
        if (shown.p) shown.p[0] = '\0';
      }
      continue;
    }
    if (last) {
      shown_push(&shown, absolute, comp, strlen(comp));
      o->exists = true;
      o->st = ls;
      o->dir = ds;
      break;
    }
    if (!S_ISDIR(ls.st_mode)) {
      rc = out_on_way(path, &shown, absolute, comp, ENOTDIR);
      break;
    }
    int nfd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd < 0) {
      rc = out_err(errno, path, NULL);
      break;
    }
    close(cur);
    cur = nfd;
    shown_push(&shown, absolute, comp, strlen(comp));
    pos = end;
  }
  free(link);
  if (rc == 0 && shown.err) rc = MSNAP_ENOMEM;
  if (rc == 0 && o->fd < 0) {
    o->dirfd = cur;
    cur = -1;
    o->name = strdup(comp);
    if (!o->name) rc = MSNAP_ENOMEM;
  }
  if (rc == 0) {
    o->shown = strdup(followed && shown.p ? shown.p : path);
    if (!o->shown) rc = MSNAP_ENOMEM;
  }
  if (cur >= 0) close(cur);
  free(todo);
  free(shown.p);
  if (rc != 0) msnap__outpath_release(o);
  return rc;
}

/* ---- unique names -------------------------------------------------------- */

char *msnap__name_reserve(const char *dir, const char *stem, const char *ext) {
  size_t len = strlen(dir) + strlen(stem) + strlen(ext) + 32;
  char *p = malloc(len);
  if (p == NULL) {
    msnap__set_error(MSNAP_ENOMEM, "out of memory");
    return NULL;
  }
  int e = EEXIST;
  for (int n = 0; n < 200 && e == EEXIST; n++) {
    if (n == 0)
      snprintf(p, len, "%s/%s%s", dir, stem, ext);
    else if (n < 100)
      snprintf(p, len, "%s/%s_%d%s", dir, stem, n, ext);
    else
      snprintf(p, len, "%s/%s_%016" PRIx64 "%s", dir, stem,
               msnap__random_u64(), ext);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  0666);
    if (fd >= 0) {
      close(fd);
      return p;
    }
    e = errno;
  }
  msnap__set_error_errno(MSNAP_EIO, e, "cannot create '%s': %s", p,
                         strerror(e));
  free(p);
  return NULL;
}

void msnap__name_unreserve(const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 &&
      st.st_uid == geteuid())
    unlink(path);
}

/* ---- temporaries ------------------------------------------------------- */

static char tmp_tag[16];
static pthread_once_t tmp_tag_once = PTHREAD_ONCE_INIT;

static uint64_t fnv1a(uint64_t h, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

static uint64_t fnv1a_file(uint64_t h, const char *path) {
  char buf[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fnv1a(h, "-", 1);
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 ? fnv1a(h, buf, (size_t)n) : fnv1a(h, "-", 1);
}

static void tmp_tag_init(void) {
  uint64_t h = 0xcbf29ce484222325ULL;
  char buf[256] = "";
  if (gethostname(buf, sizeof buf - 1) == 0) h = fnv1a(h, buf, strlen(buf));
  h = fnv1a(h, "\n", 1);
  h = fnv1a_file(h, "/etc/machine-id");
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  h = fnv1a(h, "\n", 1);
  if (n > 0) h = fnv1a(h, buf, (size_t)n);
  snprintf(tmp_tag, sizeof tmp_tag, "%012llx",
           (unsigned long long)(h & 0xffffffffffffULL));
}

const char *msnap__tmp_tag(void) {
  pthread_once(&tmp_tag_once, tmp_tag_init);
  return tmp_tag;
}

/* The pid of "<anything>.tmp.<tag>.<pid>.<n>" when the tag is ours, else
 * 0.  Digits only, no sign, pid in [1, INT_MAX]. */
static long tmp_name_pid(const char *name, const char *tag) {
  size_t len = strlen(name), tl = strlen(tag);
  const char *p = name + len;
  /* <n> */
  const char *q = p;
  while (q > name && q[-1] >= '0' && q[-1] <= '9') q--;
  if (q == p || q - name < 1 || q[-1] != '.' || p - q > 10) return 0;
  p = q - 1;
  q = p;
  while (q > name && q[-1] >= '0' && q[-1] <= '9') q--;
  if (q == p || p - q > 10 || q[-1] != '.') return 0;
  const char *pid_at = q;
  /* ".tmp.<tag>" before the pid */
  size_t need = 5 + tl + 1; /* ".tmp." tag "." */
  if ((size_t)(pid_at - name) < need + 1) return 0;
  const char *t = pid_at - 1 - tl;
  if (memcmp(t, tag, tl) != 0 || memcmp(t - 5, ".tmp.", 5) != 0) return 0;
  long pid = strtol(pid_at, NULL, 10);
  return pid > 0 && pid <= INT_MAX ? pid : 0;
}

int msnap__tmp_clean(int dirfd) {
  const char *tag = msnap__tmp_tag();
  int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0; /* a write-only directory: nothing to list */
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return 0;
  }
  int removed = 0;
  uid_t me = geteuid();
  pid_t self = getpid();
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    long pid = tmp_name_pid(de->d_name, tag);
    if (pid == 0 || pid == (long)self) continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive */
    struct stat st;
    if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || st.st_uid != me)
      continue;
    if (unlinkat(dirfd, de->d_name, 0) == 0) removed++;
  }
  closedir(d);
  return removed;
}
