/*
 * sink.h -- output streams behind one ops struct (the redis `rio` / jemalloc
 * `write_cb` pattern): file, memory buffer, or a caller callback (Python
 * file), behind a buffered writer with a sticky error.
 *
 * Invariants: `err` is sticky -- once a write fails every later write is a
 * no-op and msnap__sink_finish returns that error; `bytes` counts bytes
 * accepted by write() (including buffered ones).
 */
#ifndef MSNAP_SINK_H
#define MSNAP_SINK_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

/* How long the atomic writer waits for a program to open a FIFO target
 * for reading before it refuses it (the reader's MSNAP_SOURCE_FIFO_WAIT_MS
 * is the same wait for a FIFO input). */
#define MSNAP_SINK_FIFO_WAIT_MS 5000

typedef struct msnap_sink_s {
  /* Backend: write len bytes; return 0 or a negative MSNAP_E* code. */
  int (*write_cb)(void *opaque, const void *p, size_t len);
  void *opaque;
  unsigned char *buf; /* buffer of cap bytes, used bytes in `used` */
  size_t used, cap;
  uint64_t bytes;
  int err;
} msnap_sink_t;

/* Buffered write; the fast path is a memcpy into buf. */
int msnap__sink_write(msnap_sink_t *s, const void *p, size_t len);
int msnap__sink_flush(msnap_sink_t *s);
/* Flush and free the buffer; returns the sticky error (0 if none). */
int msnap__sink_finish(msnap_sink_t *s);

/* Memory sink: grows *out; caller frees msnap__membuf_t.data with free(). */
typedef struct msnap_membuf_s {
  char *data;
  size_t len, cap;
} msnap_membuf_t;
int msnap__sink_init_mem(msnap_sink_t *s, msnap_membuf_t *mb);
/* File sink over an open fd (write(2) with EINTR/short-write handling;
 * ENOSPC -> MSNAP_ENOSPC, other errors MSNAP_EIO). */
int msnap__sink_init_fd(msnap_sink_t *s, int fd);
/* stdio sink: unbuffered (the FILE buffers); fwrite failures are
 * MSNAP_EIO.  Nothing to free. */
int msnap__sink_init_file(msnap_sink_t *s, FILE *f);
/* Callback sink. */
int msnap__sink_init_cb(msnap_sink_t *s,
                        int (*write_cb)(void *, const void *, size_t),
                        void *opaque);

/* ---- outpath.c: where an output path leads (the link rule) ------------ */
/* The target of an output path, resolved on directory descriptors under
 * the kernel's protected_symlinks rule (outpath.c says it in full):
 * either fd >= 0 (an open descriptor named through /proc, e.g.
 * /dev/stdout: write there) or the directory dirfd (O_PATH) holding
 * `name` (one component).  `exists`: `st` is the lstat of name (never a
 * link); `dir` is the fstat of dirfd.  `shown` is the path for messages:
 * the caller's, or the resolved one once a link was followed. */
typedef struct msnap_outpath_s {
  int dirfd, fd;
  char *name, *shown;
  bool exists;
  struct stat st, dir;
} msnap_outpath_t;
/* 0, or an error naming path (a refused link: MSNAP_EIO with errno EACCES;
 * every system error keeps its errno in msnap_last_errno()). */
int msnap__outpath_resolve(msnap_outpath_t *o, const char *path);
void msnap__outpath_release(msnap_outpath_t *o);
/* The invariants of a resolved target; MSNAP_ESTATE and msg if broken. */
int msnap__outpath_check(const msnap_outpath_t *o, char *msg, size_t len);
/* The rule: true when `entry` (a link, FIFO or socket) lies in the sticky
 * world-writable directory `dir` and belongs neither to the effective user
 * nor to the directory's owner -- it must not be followed or written. */
bool msnap__link_protected(const struct stat *dir, const struct stat *entry);
/* "<dir>/<stem><ext>", or "<dir>/<stem>_<n><ext>" when taken (n < 10000),
 * created empty with O_CREAT | O_EXCL | O_NOFOLLOW: the name is the
 * caller's (no check-then-open window; an existing file or link is never
 * reused).  Returns it (free()), or NULL with the last error set.  Write
 * the content over it with an atomic file; after a failure
 * msnap__name_unreserve removes it if it is still the empty file of ours. */
char *msnap__name_reserve(const char *dir, const char *stem, const char *ext);
void msnap__name_unreserve(const char *path);
/* 12 hex digits naming this host and pid namespace; temporaries are
 * "<name>.tmp.<tag>.<pid>.<n>". */
const char *msnap__tmp_tag(void);
/* Remove the temporaries in dirfd that dead processes of this host and
 * pid namespace left (this tag, a pid that is gone, a regular file of the
 * effective user); returns how many. */
int msnap__tmp_clean(int dirfd);

/* Atomic file output: the path is resolved (msnap__outpath_resolve); a
 * regular or new target gets "<name>.tmp.<tag>.<pid>.<n>" in its
 * directory (temporaries of dead processes there are removed first), with
 * the replaced file's permission bits; commit = fsync + renameat over
 * name; abort = unlink the temporary.  A device, FIFO or socket, or a
 * descriptor named through /proc, is written directly (direct = 1, no
 * temporary); a directory is refused.  Failures set the last error with
 * the path and strerror (and msnap_last_errno()). */
typedef struct msnap_atomic_file_s {
  int fd;
  int dirfd;       /* the target's directory (-1 when direct) */
  char *tmp_name;  /* the temporary in dirfd */
  char *name;      /* the target in dirfd */
  char *path;      /* the target for messages */
  int direct;      /* 1: fd is the target itself (device, FIFO, pipe) */
} msnap_atomic_file_t;
int msnap__atomic_open(msnap_atomic_file_t *f, const char *path);
int msnap__atomic_commit(msnap_atomic_file_t *f);
void msnap__atomic_abort(msnap_atomic_file_t *f);

/* An atomic file behind a buffered sink: open = msnap__atomic_open +
 * buffered fd sink (with the fault hook when armed); close(rc) finishes
 * the sink and commits when rc and the sink are fine, else removes the
 * temporary and sets the last error ("writing '<path>' failed: <why>; no
 * file was left").  `path` must stay valid until close. */
typedef struct msnap_fault_wrap_s {
  int (*cb)(void *, const void *, size_t);
  void *opaque;
  uint64_t written, limit;
  int err;
} msnap_fault_wrap_t;
typedef struct msnap_atomic_sink_s {
  msnap_atomic_file_t f;
  msnap_sink_t sink;
  msnap_fault_wrap_t fault;
  const char *path;
  uint64_t written, flushed; /* bytes written; writeback started below */
} msnap_atomic_sink_t;
int msnap__atomic_sink_open(msnap_atomic_sink_t *as, const char *path);
int msnap__atomic_sink_close(msnap_atomic_sink_t *as, int rc);
/* Write len bytes to path through an atomic sink. */
int msnap__write_file_atomic(const char *path, const void *p, size_t len);
/* Test hook: every atomic sink opened later fails with `err` (e.g.
 * MSNAP_ENOSPC) once `after_bytes` bytes were written; UINT64_MAX
 * disarms. */
void msnap__dump_set_fault(uint64_t after_bytes, int err);

#endif /* MSNAP_SINK_H */
