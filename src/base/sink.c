/*
 * sink.c -- buffered output sinks (memory, fd, callback) and atomic files.
 *
 * A msnap_sink_t is a byte stream with a buffer in front of a backend
 * callback.  Invariants:
 *   - used <= cap; buf is NULL only when cap == 0 (unbuffered);
 *   - err is sticky: once a backend write fails, every later write is a
 *     no-op returning err, and msnap__sink_finish returns it;
 *   - bytes counts every byte accepted by msnap__sink_write, including the
 *     ones still in the buffer.
 * The fast path of msnap__sink_write is one memcpy into buf; writes larger
 * than the buffer go straight to the backend after a flush.
 *
 * Atomic files: msnap__atomic_open resolves the path under the kernel's
 * protected_symlinks rule (outpath.c: a link planted by another user in a
 * sticky world-writable directory is never followed), removes the
 * temporaries that dead processes left in the target's directory, and
 * creates "<name>.tmp.<tag>.<pid>.<n>" there (same file system, so
 * renameat(2) is atomic) with the permission bits of the file it will
 * replace; msnap__atomic_commit fsyncs, closes and renames it over the
 * target; msnap__atomic_abort closes and unlinks it.  Every step after the
 * resolution works on the directory's descriptor.  A failed commit also
 * removes the temporary, so no partial file is ever left at `path`.  A
 * symlink that may be followed is (the link survives, the file it names is
 * replaced); a device, FIFO, socket or a descriptor named through /proc
 * (/dev/stdout) is written directly (never replaced); a directory target
 * is refused.
 *
 * An atomic sink (msnap__atomic_sink_open/close) is a buffered sink over
 * an atomic file; every dump and report of the library is written through
 * one.  It starts the writeback of the temporary every 8 MiB
 * (sync_file_range, no waiting), so that the commit's fsync waits for the
 * last part only; a direct target (device, FIFO, /dev/stdout) is written
 * as is.  The fault hook (msnap__dump_set_fault, tests) makes every
 * atomic sink opened afterwards fail with a chosen error once a number of
 * bytes were written, after really writing the part below the limit.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "base/sink.h"

#define SINK_BUF_SIZE (256u * 1024u)

static int sink_backend(msnap_sink_t *s, const void *p, size_t len) {
  if (len == 0) return 0;
  int rc = s->write_cb(s->opaque, p, len);
  if (rc < 0) s->err = rc;
  return rc;
}

/*
 * Flush the buffered bytes to the backend.  Returns the sticky error or 0.
 */
int msnap__sink_flush(msnap_sink_t *s) {
  if (s->err) return s->err;
  if (s->used) {
    size_t n = s->used;
    s->used = 0;
    if (sink_backend(s, s->buf, n) < 0) return s->err;
  }
  return 0;
}

/*
 * Append len bytes.  On a backend failure the error becomes sticky and is
 * returned now and by every later call.
 */
int msnap__sink_write(msnap_sink_t *s, const void *p, size_t len) {
  if (msnap_unlikely(s->err)) return s->err;
  s->bytes += len;
  if (msnap_likely(s->cap - s->used >= len && s->cap != 0)) {
    memcpy(s->buf + s->used, p, len);
    s->used += len;
    return 0;
  }
  if (msnap__sink_flush(s) < 0) return s->err;
  if (len >= s->cap) return sink_backend(s, p, len) < 0 ? s->err : 0;
  memcpy(s->buf, p, len);
  s->used = len;
  return 0;
}

/*
 * Flush, release the buffer and return the sticky error (0 if none).  The
 * sink may be finished once; afterwards it holds no memory.
 */
int msnap__sink_finish(msnap_sink_t *s) {
  int rc = msnap__sink_flush(s);
  free(s->buf);
  s->buf = NULL;
  s->cap = s->used = 0;
  if (s->err == 0) s->err = MSNAP_ESTATE; /* later writes are refused */
  return rc;
}

static int sink_init(msnap_sink_t *s,
                     int (*write_cb)(void *, const void *, size_t),
                     void *opaque) {
  memset(s, 0, sizeof *s);
  s->buf = malloc(SINK_BUF_SIZE);
  if (!s->buf) return MSNAP_ENOMEM;
  s->cap = SINK_BUF_SIZE;
  s->write_cb = write_cb;
  s->opaque = opaque;
  return 0;
}

/* Memory backend: append to a growing buffer. */
static int mem_write_cb(void *opaque, const void *p, size_t len) {
  msnap_membuf_t *mb = opaque;
  if (MSNAP_GROW(mb->data, mb->cap, (uint64_t)mb->len + len) != 0)
    return MSNAP_ENOMEM;
  memcpy(mb->data + mb->len, p, len);
  mb->len += len;
  return 0;
}

int msnap__sink_init_mem(msnap_sink_t *s, msnap_membuf_t *mb) {
  return sink_init(s, mem_write_cb, mb);
}

/* fd backend: write(2) until done, retrying EINTR and short writes. */
static int fd_write_cb(void *opaque, const void *p, size_t len) {
  int fd = (int)(intptr_t)opaque;
  const char *c = p;
  while (len) {
    ssize_t w = write(fd, c, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return msnap__set_error_errno(msnap__errno_code(e), e, "write failed: %s",
                                    strerror(e));
    }
    if (w == 0) return MSNAP_EIO;
    c += w;
    len -= (size_t)w;
  }
  return 0;
}

int msnap__sink_init_fd(msnap_sink_t *s, int fd) {
  if (fd < 0) return MSNAP_EINVAL;
  return sink_init(s, fd_write_cb, (void *)(intptr_t)fd);
}

/* stdio backend, unbuffered here (the FILE has its own buffer, and the
 * caller may write to it directly between two sink writes). */
static int file_write_cb(void *opaque, const void *p, size_t len) {
  return fwrite(p, 1, len, (FILE *)opaque) == len ? 0 : MSNAP_EIO;
}

int msnap__sink_init_file(msnap_sink_t *s, FILE *f) {
  if (f == NULL) return MSNAP_EINVAL;
  memset(s, 0, sizeof *s);
  s->write_cb = file_write_cb;
  s->opaque = f;
  return 0;
}

int msnap__sink_init_cb(msnap_sink_t *s,
                        int (*write_cb)(void *, const void *, size_t),
                        void *opaque) {
  if (!write_cb) return MSNAP_EINVAL;
  return sink_init(s, write_cb, opaque);
}

/* ---- atomic files -------------------------------------------------------- */

/* The temporary's name keeps at most this much of the target's name, so
 * that "<name>.tmp.<tag>.<pid>.<n>" fits NAME_MAX. */
#define TMP_NAME_KEEP 200

/* A FIFO or socket that another user left in a sticky world-writable
 * directory is not written into (the link rule, see outpath.c): 0, or the
 * refusal (the writer's and msnap_check_output's). */
static int direct_protected_check(const msnap_outpath_t *o) {
  if ((S_ISFIFO(o->st.st_mode) || S_ISSOCK(o->st.st_mode)) &&
      msnap__link_protected(&o->dir, &o->st))
    return msnap__set_error_errno(
        MSNAP_EIO, EACCES,
        "cannot write '%s': it is a %s of uid %ld in a sticky "
        "world-writable directory owned by uid %ld; not writing into it",
        o->shown, S_ISFIFO(o->st.st_mode) ? "FIFO" : "socket",
        (long)o->st.st_uid, (long)o->dir.st_uid);
  return 0;
}

/*
 * Open the target of a resolved path that is not replaced through a
 * temporary: a device, FIFO or socket (f->direct).  A FIFO or socket that
 * another user left in a sticky world-writable directory is refused
 * (direct_protected_check).  Returns 0 or a negative error.
 */
static int atomic_open_direct(msnap_atomic_file_t *f, msnap_outpath_t *o) {
  int rc = direct_protected_check(o);
  if (rc != 0) return rc;
  int fd;
  if (S_ISFIFO(o->st.st_mode)) {
    /* a FIFO that no program reads would block open(2) forever: it is
     * opened without blocking (ENXIO while no reader has it open), and
     * given up after MSNAP_SINK_FIFO_WAIT_MS, as the reader gives up on
     * a FIFO that no program writes */
    for (int waited = 0;; waited += 50) {
      fd = openat(o->dirfd, o->name,
                  O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
      if (fd >= 0 || errno != ENXIO) break;
      if (waited >= MSNAP_SINK_FIFO_WAIT_MS)
        return msnap__set_error_errno(
            MSNAP_EIO, ENXIO,
            "cannot write '%s': it is a FIFO that no reader opened (none "
            "within %d s)", o->shown, MSNAP_SINK_FIFO_WAIT_MS / 1000);
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    /* writes then wait for the reader, as on any pipe */
    int fl = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
    if (fd >= 0 && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)) {
      int e = errno;
      close(fd);
      errno = e;
      fd = -1;
    }
  } else {
    fd = openat(o->dirfd, o->name,
                O_WRONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
  }
  if (fd < 0) {
    int e = errno;
    return msnap__set_error_errno(msnap__errno_code(e), e, "cannot open '%s': %s",
                                  o->shown, strerror(e));
  }
  f->fd = fd;
  return 0;
}

/*
 * Create the temporary next to the target (or open a non-regular target
 * directly).  On failure *f is left closed (fd -1, no names), nothing is
 * created and the last error names `path` with the system's reason
 * (msnap_last_errno() keeps the errno).
 */
/* rename(2) over a file in a sticky directory (/tmp) fails with EPERM
 * unless the caller owns the file or the directory (or is privileged, as
 * root with CAP_FOWNER): such a target is refused before anything is
 * written, as the kernel would refuse the final rename.  In a
 * world-writable sticky directory the kernel's protected_regular rule
 * is stricter (fs/namei.c: may_create_in_sticky): an O_CREAT open of a
 * regular file is refused unless the file is the caller's or the
 * directory owner's -- to root and to the directory's owner too -- and
 * so is the replace here: a file another user planted under the name
 * would otherwise get the caller's data, handed back to that user
 * (fchown) with the planter's mode. */
static int sticky_replace_check(const msnap_outpath_t *o, const char *path) {
  if (!o->exists || !S_ISREG(o->st.st_mode) || !(o->dir.st_mode & S_ISVTX))
    return 0;
  uid_t me = geteuid();
  bool world = (o->dir.st_mode & S_IWOTH) != 0;
  /* rename(2)'s rule, and in a world-writable directory protected_regular */
  bool may_rename = o->st.st_uid == me || o->dir.st_uid == me || me == 0;
  bool may_open = o->st.st_uid == me || o->st.st_uid == o->dir.st_uid;
  if (may_rename && (!world || may_open)) return 0;
  if (may_rename)
    return msnap__set_error_errno(
        MSNAP_EIO, EPERM,
        "cannot write '%s': it belongs to uid %ld in a world-writable sticky "
        "directory of uid %ld, where only a file of yours or of the "
        "directory's owner is replaced, whoever you are (the kernel's "
        "protected_regular rule; you are uid %ld)",
        path, (long)o->st.st_uid, (long)o->dir.st_uid, (long)me);
  return msnap__set_error_errno(
      MSNAP_EIO, EPERM,
      "cannot write '%s': it belongs to uid %ld in a sticky directory of uid "
      "%ld, where only the file's or the directory's owner may replace it "
      "(you are uid %ld)",
      path, (long)o->st.st_uid, (long)o->dir.st_uid, (long)me);
}

/* Create a temporary "<name>.tmp.<tag>.<pid>.<n>" beside o's name (the
 * form msnap__tmp_clean knows) into tmp; the descriptor, or -1 with errno
 * (EEXIST when the 100 names tried are taken).  <n> is random
 * (msnap__random_u64): another
 * user who can read <tag> and the pid could otherwise take the names in
 * advance in a shared directory and refuse every dump there. */
static int tmp_create(const msnap_outpath_t *o, mode_t mode, char *tmp,
                      size_t len) {
  for (int tries = 0; tries < 100; tries++) {
    unsigned k = (unsigned)msnap__random_u64();
    snprintf(tmp, len, "%.*s.tmp.%s.%ld.%u", TMP_NAME_KEEP, o->name,
             msnap__tmp_tag(), (long)getpid(), k);
    int fd = openat(o->dirfd, tmp,
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    mode);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

#ifndef PROC_SUPER_MAGIC
#define PROC_SUPER_MAGIC 0x9fa0
#endif
#ifndef SYSFS_MAGIC
#define SYSFS_MAGIC 0x62656572
#endif

/*
 * The directory of o did not take a new file (the temporary; errno e):
 * the last error names the user's path and the reason -- a read-only
 * file system, a file system that makes no files (/proc, /sys: it says
 * ENOENT, which would read as a missing path), no write permission, else
 * the system's word -- never the temporary's name.  Releases o.
 */
static int dir_refused(msnap_outpath_t *o, const char *path, int e) {
  const char *again = o->exists ? "cannot replace it: " : "";
  struct statfs sf;
  struct statvfs sv;
  const char *fs = NULL;
  if (fstatfs(o->dirfd, &sf) == 0)
    fs = sf.f_type == PROC_SUPER_MAGIC ? "a proc"
         : sf.f_type == SYSFS_MAGIC    ? "a sysfs"
                                       : NULL;
  if (e == EROFS || (fstatvfs(o->dirfd, &sv) == 0 && (sv.f_flag & ST_RDONLY)))
    fs = fs ? fs : "a read-only";
  msnap__outpath_release(o);
  int code = e == ENOMEM ? MSNAP_EIO : msnap__errno_code(e);
  if (fs)
    return msnap__set_error_errno(
        code, e,
        "cannot write '%s': %sits directory is on %s file system, where no "
        "new file can be created",
        path, again, fs);
  if (e == EACCES || e == EPERM)
    return msnap__set_error_errno(code, e,
                                  "cannot write '%s': %sits directory is not "
                                  "writable: %s",
                                  path, again, strerror(e));
  if (e == EEXIST)
    return msnap__set_error_errno(
        code, e,
        "cannot write '%s': %sits directory does not accept a new file (the "
        "100 names tried are taken)",
        path, again);
  return msnap__set_error_errno(
      code, e, "cannot write '%s': %sits directory does not accept a new file "
      "(%s)", path, again, strerror(e));
}

int msnap__atomic_open(msnap_atomic_file_t *f, const char *path) {
  f->fd = f->dirfd = -1;
  f->direct = 0;
  f->tmp_name = f->name = f->path = NULL;
  msnap_outpath_t o;
  int rc = msnap__outpath_resolve(&o, path);
  if (rc != 0) return rc;
  if (o.fd >= 0) { /* a descriptor named through /proc (/dev/stdout) */
    f->fd = o.fd;
    f->direct = 1;
    f->path = o.shown;
    o.fd = -1;
    o.shown = NULL;
    msnap__outpath_release(&o);
    return 0;
  }
  if (o.exists && S_ISDIR(o.st.st_mode)) {
    rc = msnap__set_error_errno(MSNAP_EIO, EISDIR,
                                "cannot write '%s': it is a directory", path);
    msnap__outpath_release(&o);
    return rc;
  }
  if (o.exists && !S_ISREG(o.st.st_mode)) {
    rc = atomic_open_direct(f, &o);
    if (rc == 0) {
      f->direct = 1;
      f->path = o.shown;
      o.shown = NULL;
    }
    msnap__outpath_release(&o);
    return rc;
  }
  if ((rc = sticky_replace_check(&o, path)) != 0) {
    msnap__outpath_release(&o);
    return rc;
  }
  msnap__tmp_clean(o.dirfd);
  /* A replaced file keeps its permission bits (and, where allowed, its
   * owner); a new one gets 0666 less the umask, as open(2) gives. */
  mode_t mode = o.exists ? (o.st.st_mode & 0777) : 0666;
  char tmp[TMP_NAME_KEEP + 64];
  int fd = tmp_create(&o, mode, tmp, sizeof tmp);
  if (fd < 0)
    return dir_refused(&o, path, errno); /* /proc/version, a read-only fs */
  if (o.exists) {
    /* fchown fails unless allowed (root, or a group of ours): then
     * the file is ours; fchmod of our own new file cannot fail. */
    if (o.st.st_uid != geteuid() || o.st.st_gid != getegid())
      (void)!fchown(fd, o.st.st_uid, o.st.st_gid);
    (void)!fchmod(fd, mode);
  }
  f->fd = fd;
  f->dirfd = o.dirfd;
  f->tmp_name = strdup(tmp);
  f->name = o.name;
  f->path = o.shown;
  o.dirfd = -1;
  o.name = o.shown = NULL;
  msnap__outpath_release(&o);
  if (!f->tmp_name) {
    msnap__atomic_abort(f);
    return MSNAP_ENOMEM;
  }
  return 0;
}

static void atomic_release(msnap_atomic_file_t *f) {
  if (f->dirfd >= 0) close(f->dirfd);
  free(f->tmp_name);
  free(f->name);
  free(f->path);
  f->tmp_name = f->name = f->path = NULL;
  f->fd = f->dirfd = -1;
  f->direct = 0;
}

/*
 * fsync + close + renameat over the target (a direct target: fsync where
 * the device supports it + close).  On any failure the temporary is
 * removed and the error returned (MSNAP_ENOSPC for a full disk) with the
 * system's reason and the path in the last error.
 */
int msnap__atomic_commit(msnap_atomic_file_t *f) {
  if (f->fd < 0 || (!f->tmp_name && !f->direct)) return MSNAP_EINVAL;
  int rc = 0;
  if (fsync(f->fd) != 0 && errno != EINVAL && errno != EROFS &&
      errno != ENOTSUP && errno != ESPIPE)
    rc = msnap__set_error_errno(msnap__errno_code(errno), errno,
                                "cannot sync '%s': %s", f->path,
                                strerror(errno));
  if (close(f->fd) != 0 && rc == 0 && errno != EINTR)
    rc = msnap__set_error_errno(msnap__errno_code(errno), errno,
                                "cannot close '%s': %s", f->path,
                                strerror(errno));
  f->fd = -1;
  if (rc == 0 && !f->direct &&
      renameat(f->dirfd, f->tmp_name, f->dirfd, f->name) != 0)
    rc = msnap__set_error_errno(msnap__errno_code(errno), errno,
                                "cannot write '%s': cannot replace it (%s)",
                                f->path, strerror(errno));
  if (rc != 0 && f->tmp_name) unlinkat(f->dirfd, f->tmp_name, 0);
  atomic_release(f);
  return rc;
}

void msnap__atomic_abort(msnap_atomic_file_t *f) {
  if (f->fd >= 0) close(f->fd);
  if (f->tmp_name) unlinkat(f->dirfd, f->tmp_name, 0);
  atomic_release(f);
}

/* ---- atomic file sinks and the fault hook ----------------------------------- */

static _Atomic uint64_t fault_after = UINT64_MAX;
static _Atomic int fault_err = MSNAP_ENOSPC;

void msnap__dump_set_fault(uint64_t after_bytes, int err) {
  atomic_store(&fault_err, err);
  atomic_store(&fault_after, after_bytes);
}

/* Pass writes through until the limit, write the part below it (so that a
 * partial temporary file really exists), then fail. */
static int fault_write_cb(void *p, const void *buf, size_t len) {
  msnap_fault_wrap_t *w = p;
  if (w->written + len > w->limit) {
    size_t part = (size_t)(w->limit - w->written);
    if (part) w->cb(w->opaque, buf, part);
    w->written = w->limit;
    return w->err;
  }
  w->written += len;
  return w->cb(w->opaque, buf, len);
}

/* The atomic sink's writes: the fd backend, and writeback of the
 * temporary started every WRITEBACK_CHUNK bytes (sync_file_range, which
 * does not wait): the file is fsynced at commit anyway, and that fsync
 * then waits for the last chunk only instead of the whole file (a 57 MB
 * dump: ~30 ms less on the development VM). */
#define WRITEBACK_CHUNK ((uint64_t)8 << 20)
static int atomic_write_cb(void *p, const void *buf, size_t len) {
  msnap_atomic_sink_t *as = p;
  int rc = fd_write_cb((void *)(intptr_t)as->f.fd, buf, len);
  if (rc != 0) return rc;
  as->written += len;
#ifdef SYNC_FILE_RANGE_WRITE
  if (!as->f.direct && as->written - as->flushed >= WRITEBACK_CHUNK) {
    (void)sync_file_range(as->f.fd, (off_t)as->flushed,
                          (off_t)(as->written - as->flushed),
                          SYNC_FILE_RANGE_WRITE);
    as->flushed = as->written;
  }
#endif
  return 0;
}

int msnap__atomic_sink_open(msnap_atomic_sink_t *as, const char *path) {
  msnap_atomic_file_t *f = &as->f;
  msnap_sink_t *sink = &as->sink;
  msnap_fault_wrap_t *fw = &as->fault;
  as->path = path;
  as->written = as->flushed = 0;
  int rc = msnap__atomic_open(f, path);
  if (rc != 0)
    return rc; /* the last error names path and the system's reason */
  rc = msnap__sink_init_cb(sink, atomic_write_cb, as);
  if (rc != 0) {
    msnap__atomic_abort(f);
    return rc;
  }
  uint64_t lim = atomic_load(&fault_after);
  if (lim != UINT64_MAX) {
    fw->cb = sink->write_cb;
    fw->opaque = sink->opaque;
    fw->written = 0;
    fw->limit = lim;
    fw->err = atomic_load(&fault_err);
    sink->write_cb = fault_write_cb;
    sink->opaque = fw;
  }
  return 0;
}

int msnap__atomic_sink_close(msnap_atomic_sink_t *as, int rc) {
  const char *path = as->path;
  msnap_atomic_file_t *f = &as->f;
  msnap_sink_t *sink = &as->sink;
  int frc = msnap__sink_finish(sink);
  if (rc == 0) rc = frc;
  if (rc != 0) {
    int e = msnap_last_errno();
    const char *why = e ? strerror(e) : msnap_strerror(rc);
    bool direct = f->direct;
    msnap__atomic_abort(f);
    return msnap__set_error_errno(rc, e, "writing '%s' failed: %s%s", path,
                                  why,
                                  direct ? ""
                                         : "; the path is as it was (an "
                                           "existing file kept, no new one)");
  }
  rc = msnap__atomic_commit(f);
  return rc; /* the last error names path and the system's reason */
}

int msnap_write_file(const char *path, const void *data, size_t len) {
  if (path == NULL || (data == NULL && len > 0))
    return msnap__set_error(MSNAP_EINVAL, "write_file: NULL argument");
  return msnap__write_file_atomic(path, data, len);
}

int msnap_check_output(const char *path) {
  if (path == NULL)
    return msnap__set_error(MSNAP_EINVAL, "check_output: NULL path");
  msnap_outpath_t o;
  int rc = msnap__outpath_resolve(&o, path);
  if (rc != 0) return rc; /* the writer's own refusal (link rule, '/'...) */
  if (o.fd >= 0) {        /* a descriptor named through /proc */
    msnap__outpath_release(&o);
    return 0;
  }
  if (o.exists && S_ISDIR(o.st.st_mode)) {
    msnap__outpath_release(&o);
    return msnap__set_error_errno(MSNAP_EIO, EISDIR,
                                  "cannot write '%s': it is a directory", path);
  }
  /* A new or regular file: the temporary is created in its directory --
   * so it is created here and removed at once: access(2) would pass for
   * root where the creation fails (/proc, a read-only mount); a device or
   * FIFO is opened for writing itself. */
  bool file = !o.exists || S_ISREG(o.st.st_mode);
  if ((rc = sticky_replace_check(&o, path)) != 0) {
    msnap__outpath_release(&o);
    return rc;
  }
  if (file) {
    char tmp[TMP_NAME_KEEP + 64];
    int fd = tmp_create(&o, 0600, tmp, sizeof tmp);
    if (fd < 0) return dir_refused(&o, path, errno);
    close(fd);
    unlinkat(o.dirfd, tmp, 0);
    msnap__outpath_release(&o);
    return 0;
  }
  if ((rc = direct_protected_check(&o)) != 0) {
    msnap__outpath_release(&o);
    return rc;
  }
  int e = faccessat(o.dirfd, o.name, W_OK, 0) != 0 ? errno : 0;
  msnap__outpath_release(&o);
  if (e != 0)
    return msnap__set_error_errno(msnap__errno_code(e), e, "cannot write '%s': %s",
                                  path, strerror(e));
  return 0;
}

int msnap__write_file_atomic(const char *path, const void *p, size_t len) {
  msnap_atomic_sink_t as;
  int rc = msnap__atomic_sink_open(&as, path);
  if (rc != 0) return rc;
  rc = msnap__sink_write(&as.sink, p, len);
  return msnap__atomic_sink_close(&as, rc);
}
