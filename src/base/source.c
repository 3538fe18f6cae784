/*
 * source.c -- input sources (source.h): memory, mapped files, streams,
 * gzip and zstd (zlib and libzstd opened at run time, see below).
 *
 * Invariants:
 *   - start <= end; for memory and mapped plain sources the window is the
 *     whole input and never moves; for the others it lies in buf, and
 *     end - buf <= cap;
 *   - produced = bytes ever put into the window (decompressed bytes for
 *     gzip/zstd) <= limit + 1; more than limit is an error;
 *   - eof: the producer has nothing more; once set it stays set;
 *   - a named FIFO is read without blocking until its first byte (poll
 *     with a timeout), then in blocking mode;
 *   - zl / zs (the codec libraries) are loaded at most once per process;
 *     lib.ok means every entry point was resolved, and only then is a
 *     gzip / zstd source started (z_init, zs are set only after that).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/base.h"
#include "base/source.h"

/* ---- zlib and libzstd, opened at run time ----------------------------------
 * Both are opened with dlopen on the first compressed input (optional at
 * run time, as libdw is in record/stack.c): a build needs neither their
 * headers nor their libraries, and a plain snapshot never loads them.
 * The few types, constants and entry points used below are declared here
 * as zlib.h (1.2.13) and zstd.h (1.5.4) of Debian 12 declare them; the
 * entry points are resolved with dlsym.  Where the real headers are
 * found at build time they are included after these declarations and the
 * build checks every one against them (layouts with sizeof/offsetof,
 * field and function types with _Generic, constants by value).  At run
 * time zlib checks the stream's size itself (inflateInit2_). */

/* zlib's z_stream (zlib.h: struct z_stream_s; z_const is empty unless
 * ZLIB_CONST, `state` points to zlib's private struct internal_state). */
typedef struct msnap__z_stream_s {
  unsigned char *next_in;
  unsigned avail_in;
  unsigned long total_in;
  unsigned char *next_out;
  unsigned avail_out;
  unsigned long total_out;
  char *msg;
  void *state;
  void *(*zalloc)(void *opaque, unsigned items, unsigned size);
  void (*zfree)(void *opaque, void *address);
  void *opaque;
  int data_type;
  unsigned long adler;
  unsigned long reserved;
} msnap__z_stream_t;
/* The version handed to inflateInit2_ (zlib compares its first digit). */
#define MSNAP_ZLIB_VERSION "1.2.13"
#define MSNAP_ZLIB_CONSTS(X)                                                  \
  X(Z_OK, 0) X(Z_STREAM_END, 1) X(Z_NO_FLUSH, 0) X(Z_MEM_ERROR, -4)          \
  X(Z_BUF_ERROR, -5)
enum {
#define MSNAP_ZC_(name, value) MSNAP__##name = (value),
  MSNAP_ZLIB_CONSTS(MSNAP_ZC_)
#undef MSNAP_ZC_
};
/* The entry points (name, return type, parameters), over the stream type
 * zs: ours for the calls, zlib's z_stream for the check. */
#define MSNAP_ZLIB_FNS(X, zs)                                                 \
  X(inflateInit2_, int,                                                       \
    (zs * strm, int windowBits, const char *version, int stream_size))       \
  X(inflate, int, (zs * strm, int flush))                                     \
  X(inflateEnd, int, (zs * strm))                                             \
  X(inflateReset, int, (zs * strm))

/* zstd's opaque decompression context (the same typedefs as zstd.h) and
 * its buffers (zstd.h: struct ZSTD_inBuffer_s / ZSTD_outBuffer_s). */
typedef struct ZSTD_DCtx_s ZSTD_DCtx;
typedef ZSTD_DCtx ZSTD_DStream;
typedef struct msnap__zstd_in_s {
  const void *src;
  size_t size;
  size_t pos;
} msnap__zstd_in_t;
typedef struct msnap__zstd_out_s {
  void *dst;
  size_t size;
  size_t pos;
} msnap__zstd_out_t;
/* ZSTD_dParameter is an enum of non-negative values: an unsigned int for
 * the compilers memsnap supports (checked against zstd.h below). */
#define MSNAP_ZSTD_D_WINDOWLOGMAX 100u /* ZSTD_d_windowLogMax */
#define MSNAP_ZSTD_FNS(X, zin, zout, dparam)                                  \
  X(ZSTD_createDStream, ZSTD_DStream *, (void))                               \
  X(ZSTD_freeDStream, size_t, (ZSTD_DStream * zds))                           \
  X(ZSTD_initDStream, size_t, (ZSTD_DStream * zds))                           \
  X(ZSTD_decompressStream, size_t,                                            \
    (ZSTD_DStream * zds, zout * output, zin * input))                         \
  X(ZSTD_isError, unsigned, (size_t code))                                    \
  X(ZSTD_getErrorName, const char *, (size_t code))                           \
  X(ZSTD_DCtx_setParameter, size_t,                                           \
    (ZSTD_DCtx * dctx, dparam param, int value))

#if defined(__has_include)
#if __has_include(<zlib.h>)
#include <zlib.h>
#define MSNAP_Z_FIELD_SAME(f)                                                 \
  _Static_assert(offsetof(z_stream, f) == offsetof(msnap__z_stream_t, f) &&   \
                     sizeof(((z_stream *)0)->f) ==                            \
                         sizeof(((msnap__z_stream_t *)0)->f),                 \
                 "z_stream." #f " differs from zlib.h")
#define MSNAP_Z_TYPE_SAME(f)                                                  \
  MSNAP_Z_FIELD_SAME(f);                                                      \
  _Static_assert(_Generic(((z_stream *)0)->f,                                 \
                     __typeof__(((msnap__z_stream_t *)0)->f): 1,              \
                     default: 0),                                             \
                 "z_stream." #f ": type differs from zlib.h")
MSNAP_Z_TYPE_SAME(next_in);
MSNAP_Z_TYPE_SAME(avail_in);
MSNAP_Z_TYPE_SAME(total_in);
MSNAP_Z_TYPE_SAME(next_out);
MSNAP_Z_TYPE_SAME(avail_out);
MSNAP_Z_TYPE_SAME(total_out);
MSNAP_Z_TYPE_SAME(msg);
MSNAP_Z_FIELD_SAME(state); /* a pointer to zlib's private struct */
MSNAP_Z_TYPE_SAME(zalloc);
MSNAP_Z_TYPE_SAME(zfree);
MSNAP_Z_TYPE_SAME(opaque);
MSNAP_Z_TYPE_SAME(data_type);
MSNAP_Z_TYPE_SAME(adler);
MSNAP_Z_TYPE_SAME(reserved);
_Static_assert(sizeof(z_stream) == sizeof(msnap__z_stream_t),
               "z_stream differs from zlib.h");
#undef MSNAP_Z_TYPE_SAME
#undef MSNAP_Z_FIELD_SAME
#define MSNAP_ZC_(name, value)                                                \
  _Static_assert(name == MSNAP__##name, "zlib.h: " #name " differs");
MSNAP_ZLIB_CONSTS(MSNAP_ZC_)
#undef MSNAP_ZC_
#define MSNAP_ZF_(name, ret, params)                                          \
  _Static_assert(_Generic(&name, ret(*) params: 1, default: 0),              \
                 "zlib.h: " #name " differs");
MSNAP_ZLIB_FNS(MSNAP_ZF_, z_stream)
#undef MSNAP_ZF_
#endif
#if __has_include(<zstd.h>)
#include <zstd.h>
#define MSNAP_ZSTD_BUF_SAME(real, ours, f)                                    \
  _Static_assert(offsetof(real, f) == offsetof(ours, f) &&                    \
                     _Generic(((real *)0)->f,                                 \
                         __typeof__(((ours *)0)->f): 1,                       \
                         default: 0),                                         \
                 #real "." #f " differs from zstd.h")
MSNAP_ZSTD_BUF_SAME(ZSTD_inBuffer, msnap__zstd_in_t, src);
MSNAP_ZSTD_BUF_SAME(ZSTD_inBuffer, msnap__zstd_in_t, size);
MSNAP_ZSTD_BUF_SAME(ZSTD_inBuffer, msnap__zstd_in_t, pos);
MSNAP_ZSTD_BUF_SAME(ZSTD_outBuffer, msnap__zstd_out_t, dst);
MSNAP_ZSTD_BUF_SAME(ZSTD_outBuffer, msnap__zstd_out_t, size);
MSNAP_ZSTD_BUF_SAME(ZSTD_outBuffer, msnap__zstd_out_t, pos);
_Static_assert(sizeof(ZSTD_inBuffer) == sizeof(msnap__zstd_in_t) &&
                   sizeof(ZSTD_outBuffer) == sizeof(msnap__zstd_out_t),
               "ZSTD_inBuffer / ZSTD_outBuffer differ from zstd.h");
#undef MSNAP_ZSTD_BUF_SAME
_Static_assert(ZSTD_d_windowLogMax == MSNAP_ZSTD_D_WINDOWLOGMAX,
               "zstd.h: ZSTD_d_windowLogMax differs");
/* (with `unsigned` for ZSTD_dParameter: an enum type is compatible with
 * its underlying type, so this also checks that assumption) */
#define MSNAP_ZF_(name, ret, params)                                          \
  _Static_assert(_Generic(&name, ret(*) params: 1, default: 0),              \
                 "zstd.h: " #name " differs");
MSNAP_ZSTD_FNS(MSNAP_ZF_, ZSTD_inBuffer, ZSTD_outBuffer, unsigned)
#undef MSNAP_ZF_
#endif
#endif

/* The loaded entry points (pthread_once: loaded at most once). */
#define MSNAP_FN_FIELD_(name, ret, params) ret(*name) params;
typedef struct codec_lib_s {
  const char *codec;   /* "gzip" / "zstd" for messages */
  const char *soname;  /* what is opened by default */
  const char *what;    /* the library and its Debian package */
  msnap_env_t env;     /* the variable naming another file */
  const char *file;    /* what was opened: soname or the variable's file */
  bool ok;
  char why[224];       /* why not, when !ok */
} codec_lib_t;
static struct {
  codec_lib_t lib;
  MSNAP_ZLIB_FNS(MSNAP_FN_FIELD_, msnap__z_stream_t)
} zl = {.lib = {.codec = "gzip",
               .soname = "libz.so.1",
               .what = "zlib; Debian/Ubuntu package zlib1g",
               .env = MSNAP_ENV_ZLIB_LIBRARY}};
static struct {
  codec_lib_t lib;
  MSNAP_ZSTD_FNS(MSNAP_FN_FIELD_, msnap__zstd_in_t, msnap__zstd_out_t,
                 unsigned)
} zs = {.lib = {.codec = "zstd",
               .soname = "libzstd.so.1",
               .what = "zstd >= 1.4.0; Debian/Ubuntu package libzstd1",
               .env = MSNAP_ENV_ZSTD_LIBRARY}};
#undef MSNAP_FN_FIELD_
static pthread_once_t zl_once = PTHREAD_ONCE_INIT, zs_once = PTHREAD_ONCE_INIT;

/* dlopen the library of l (its variable's file, else its soname); NULL
 * with l->why set when it cannot be opened. */
static void *lib_open(codec_lib_t *l) {
  l->file = msnap__env_get(l->env);
  if (l->file == NULL || l->file[0] == 0) l->file = l->soname;
  void *h = dlopen(l->file, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    snprintf(l->why, sizeof l->why, "%s", e ? e : l->file);
  }
  return h;
}

/* Resolve one entry point into *slot; false with l->why set. */
static bool lib_sym(codec_lib_t *l, void *h, const char *name, void **slot) {
  *slot = dlsym(h, name);
  if (*slot == NULL)
    snprintf(l->why, sizeof l->why, "%.160s has no %s", l->file, name);
  return *slot != NULL;
}

#define MSNAP_FN_LOAD_(name, ret, params)                                    \
  &&lib_sym(&LIB_.lib, h, #name, (void **)&LIB_.name)
static void zl_load(void) {
  void *h = lib_open(&zl.lib);
#define LIB_ zl
  zl.lib.ok = h != NULL MSNAP_ZLIB_FNS(MSNAP_FN_LOAD_, msnap__z_stream_t);
#undef LIB_
  if (h != NULL && !zl.lib.ok) dlclose(h);
}
static void zs_load(void) {
  void *h = lib_open(&zs.lib);
#define LIB_ zs
  zs.lib.ok = h != NULL MSNAP_ZSTD_FNS(MSNAP_FN_LOAD_, msnap__zstd_in_t,
                                       msnap__zstd_out_t, unsigned);
#undef LIB_
  if (h != NULL && !zs.lib.ok) dlclose(h);
}
#undef MSNAP_FN_LOAD_

/* The longest zstd frame header: magic 4, descriptor 1, window 1,
 * dictionary id 4, content size 8 (RFC 8878, 3.1.1; zstd.h's
 * ZSTD_FRAMEHEADERSIZE_MAX). */
#define ZSTD_HEAD_MAX 18

#define CHUNK (1u << 20)
#define IN_CHUNK (256u << 10)
#define DROP_STEP (2u << 20)
/* fill_ahead tries again after nothing was ready once the reader has read
 * this much on (or refilled): few polls for a slow writer, while a fast
 * one behind a 64 KiB pipe is still read as soon as it has written */
#define DRY_STEP (1u << 10)

struct msnap_source_priv_s {
  int fd;                    /* streams: the file; -1 otherwise       */
  unsigned char *map;        /* mapped files                          */
  size_t map_len, dropped;   /* dropped: mapped bytes given back      */
  unsigned char *buf;        /* window buffer (streams, decompressed) */
  size_t cap;
  unsigned char *in;         /* compressed input read from fd         */
  size_t in_cap;
  const unsigned char *raw;  /* compressed bytes not yet consumed     */
  size_t raw_n;
  bool raw_eof;              /* no more compressed bytes to read      */
  uint64_t limit, produced;
  bool eof;
  bool fifo_wait;            /* named FIFO before its first byte      */
  msnap__z_stream_t z;
  bool z_init, z_member_end;
  bool member_only;          /* msnap__source_check_member: stop at the
                                end of the gzip member / zstd frame    */
  ZSTD_DStream *zs;
  size_t zs_last;            /* last ZSTD_decompressStream result     */
  bool zs_flush;             /* ... filled the output: more may be
                                decoded, not yet given                */
  bool ahead;                /* in msnap__source_fill_ahead: read only
                                what is ready (poll, no wait)         */
  bool stalled;              /* ... and a read found nothing ready    */
  bool dry;                  /* the last fill_ahead found nothing more
                                ready, the reader at dry_at, the
                                window ending at dry_end              */
  uint64_t dry_at, dry_end;
  uint64_t member_from;      /* stream offset where the gzip member /
                                zstd frame being decompressed began   */
  int pending;               /* an error met before the reader needed
                                the bytes after it (fill_ahead; the
                                decompressor after good bytes), given
                                to it when it needs them              */
  uint64_t pending_from;     /* ... member_from of its member         */
  char pending_err[sizeof ((msnap_source_t *)0)->err];
  unsigned char zs_head[ZSTD_HEAD_MAX]; /* the first bytes of the frame
                                being decompressed (its header)       */
  size_t zs_head_n;
  const unsigned char *chunked; /* tests: a buffer read in small pieces */
  size_t chunked_len, chunked_pos, chunk;
};

static int fail(msnap_source_t *src, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(msnap_source_t *src, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(src->err, sizeof src->err, fmt, ap);
  va_end(ap);
  return rc;
}

/* Keep the error rc (src->err says what) for the fill that needs the
 * bytes after the last good one; until then the source has no error. */
static void keep_pending(msnap_source_t *src, int rc) {
  struct msnap_source_priv_s *pr = src->priv;
  pr->pending = rc;
  pr->pending_from = pr->member_from;
  memcpy(pr->pending_err, src->err, sizeof pr->pending_err);
  src->err[0] = 0;
}

/* The kept error, now that the reader needs the bytes after it. */
static int give_pending(msnap_source_t *src) {
  struct msnap_source_priv_s *pr = src->priv;
  memcpy(src->err, pr->pending_err, sizeof src->err);
  return pr->pending;
}

/* ---- reading the file ---------------------------------------------------- */

/* Wait for the first byte of a named FIFO (a FIFO nobody opens for
 * writing would block read(2) forever in blocking mode).  Every
 * MSNAP_SOURCE_FIFO_WAIT_MS without data, a non-blocking read tells a
 * writer that has the FIFO open (EAGAIN: wait on, as on a pipe whose
 * producer is slow) from none (0: refused, so a FIFO nobody writes never
 * hangs the reader).  Returns the bytes that read got into dst (> 0), 0
 * when data is ready to read, or a negative MSNAP_E*. */
static ssize_t fifo_first(msnap_source_t *src, unsigned char *dst,
                          size_t n) {
  struct msnap_source_priv_s *pr = src->priv;
  struct pollfd pf = {pr->fd, POLLIN, 0};
  ssize_t got = 0;
  for (;;) {
    int k;
    do
      k = poll(&pf, 1, MSNAP_SOURCE_FIFO_WAIT_MS);
    while (k < 0 && errno == EINTR);
    if (k < 0) return fail(src, MSNAP_EIO, "poll: %s", strerror(errno));
    if (k > 0) break;
    ssize_t r;
    do
      r = read(pr->fd, dst, n);
    while (r < 0 && errno == EINTR);
    if (r > 0) {
      got = r;
      break;
    }
    if (r == 0)
      return fail(src, MSNAP_EIO,
                  "is a FIFO that no program has open for writing (no "
                  "writer and no data within %d s)",
                  MSNAP_SOURCE_FIFO_WAIT_MS / 1000);
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return fail(src, MSNAP_EIO, "read error: %s", strerror(errno));
  }
  int fl = fcntl(pr->fd, F_GETFL);
  if (fl >= 0) fcntl(pr->fd, F_SETFL, fl & ~O_NONBLOCK);
  pr->fifo_wait = false;
  return got;
}

/* read(2) up to n bytes; 0 at the end, negative MSNAP_E* on error. */
static ssize_t read_fd(msnap_source_t *src, unsigned char *dst, size_t n) {
  struct msnap_source_priv_s *pr = src->priv;
  if (pr->chunked) {
    size_t k = pr->chunked_len - pr->chunked_pos;
    if (k > n) k = n;
    if (k > pr->chunk) k = pr->chunk;
    memcpy(dst, pr->chunked + pr->chunked_pos, k);
    pr->chunked_pos += k;
    return (ssize_t)k;
  }
  if (pr->fifo_wait) {
    ssize_t k = fifo_first(src, dst, n);
    if (k != 0) return k; /* its first bytes, or an error */
  }
  if (pr->ahead) {
    /* only what is there now: a writer that keeps its end open after the
     * pickle's STOP must never block a read the reader did not need */
    struct pollfd pf = {pr->fd, POLLIN, 0};
    int k;
    do
      k = poll(&pf, 1, 0);
    while (k < 0 && errno == EINTR);
    if (k == 0) {
      pr->stalled = true;
      return 0;
    }
  }
  for (;;) {
    ssize_t k = read(pr->fd, dst, n);
    if (k >= 0) return k;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      struct pollfd pf = {pr->fd, POLLIN, 0};
      poll(&pf, 1, -1);
      continue;
    }
    return fail(src, MSNAP_EIO, "read error: %s", strerror(errno));
  }
}

/* Compressed input: make raw bytes available (0), or none left (1), or
 * none ready in fill_ahead's no-wait mode (2). */
static int raw_more(msnap_source_t *src) {
  struct msnap_source_priv_s *pr = src->priv;
  if (pr->raw_n) return 0;
  if (pr->raw_eof) return 1;
  if (pr->fd < 0 && !pr->chunked) {
    pr->raw_eof = true;
    return 1;
  }
  ssize_t k = read_fd(src, pr->in, pr->in_cap);
  if (k < 0) return (int)k;
  if (k == 0 && pr->stalled) return 2;
  if (k == 0) {
    pr->raw_eof = true;
    return 1;
  }
  pr->raw = pr->in;
  pr->raw_n = (size_t)k;
  return 0;
}

/* ---- decompression ------------------------------------------------------- */

/* A decompression error rc (src->err says what) met after `made` new
 * bytes of this call: they are given and the error is kept for the fill
 * that needs the bytes after them, so that it is reported where the
 * decompressor met it, whatever the window and read sizes. */
static ssize_t after_made(msnap_source_t *src, int rc, size_t made) {
  if (made == 0) return rc;
  keep_pending(src, rc);
  return (ssize_t)made;
}

static ssize_t produce_gzip(msnap_source_t *src, unsigned char *dst,
                            size_t n) {
  struct msnap_source_priv_s *pr = src->priv;
  msnap__z_stream_t *z = &pr->z;
  unsigned cap = (unsigned)(n > UINT32_MAX ? UINT32_MAX : n);
  z->next_out = dst;
  z->avail_out = cap;
  while (z->avail_out == cap) {
    if (pr->z_member_end && pr->member_only) return 0;
    int more = raw_more(src);
    if (more < 0) return more;
    if (more == 2) break; /* nothing ready (fill_ahead) */
    if (pr->z_member_end) {
      /* another member follows (cat a.gz b.gz), else the end; bytes
       * after the last member that do not start one are ignored, as
       * gzip(1) does */
      if (more == 1 || pr->raw_n < 2 || pr->raw[0] != 0x1f ||
          pr->raw[1] != 0x8b)
        return 0;
      zl.inflateReset(z);
      pr->z_member_end = false;
      pr->member_from = pr->produced; /* (nothing made in this call) */
    }
    if (more == 1)
      return fail(src, MSNAP_EFORMAT,
                  "the gzip-compressed data is truncated (the file ends "
                  "inside a member; the offset counts decompressed "
                  "bytes)");
    z->next_in = (unsigned char *)pr->raw;
    z->avail_in =
        (unsigned)(pr->raw_n > UINT32_MAX ? UINT32_MAX : pr->raw_n);
    unsigned before = z->avail_in;
    int zr = zl.inflate(z, MSNAP__Z_NO_FLUSH);
    size_t used = before - z->avail_in;
    pr->raw += used;
    pr->raw_n -= used;
    size_t made = cap - z->avail_out;
    if (zr == MSNAP__Z_STREAM_END) {
      pr->z_member_end = true;
      continue;
    }
    if (zr == MSNAP__Z_MEM_ERROR)
      return after_made(src, fail(src, MSNAP_ENOMEM, "out of memory"), made);
    if (zr != MSNAP__Z_OK && zr != MSNAP__Z_BUF_ERROR)
      return after_made(src,
                        fail(src, MSNAP_EFORMAT,
                             "the gzip-compressed data is corrupt: %s",
                             z->msg ? z->msg : "inflate failed"),
                        made);
  }
  return (ssize_t)(cap - z->avail_out);
}

/*
 * The window a zstd frame asks for, from its header (RFC 8878, 3.1.1.1):
 * head[0..hn) then more[0..mn) are the frame's first bytes.  False when
 * they hold no complete header of a zstd frame (a skippable frame, too
 * few bytes).  A single-segment frame's window is its content size.
 */
static bool zstd_frame_window(const unsigned char *head, size_t hn,
                              const unsigned char *more, size_t mn,
                              uint64_t *window) {
  unsigned char h[ZSTD_HEAD_MAX];
  size_t n = hn < sizeof h ? hn : sizeof h;
  memcpy(h, head, n);
  size_t k = sizeof h - n < mn ? sizeof h - n : mn;
  memcpy(h + n, more, k);
  n += k;
  if (n < 6 || h[0] != 0x28 || h[1] != 0xb5 || h[2] != 0x2f || h[3] != 0xfd)
    return false;
  unsigned fhd = h[4];
  if (!(fhd & 0x20)) { /* Window_Descriptor */
    unsigned exp = h[5] >> 3, mant = h[5] & 7;
    uint64_t base = UINT64_C(1) << (10 + exp);
    *window = base + base / 8 * mant;
    return true;
  }
  static const unsigned did_len[4] = {0, 1, 2, 4}, fcs_len[4] = {1, 2, 4, 8};
  size_t at = 5 + did_len[fhd & 3], len = fcs_len[fhd >> 6];
  if (n < at + len) return false;
  uint64_t fcs = 0;
  for (size_t i = 0; i < len; i++) fcs |= (uint64_t)h[at + i] << (8 * i);
  *window = len == 2 ? fcs + 256 : fcs;
  return true;
}

/* The refusal of a frame whose window is over MSNAP_SOURCE_ZSTD_WINDOW_LOG:
 * a limit of this reader (zstd -d reads it with --long), not corrupt data.
 * Windows over 2^31 bytes, which no zstd decoder takes, stay corrupt. */
static int zstd_window_refused(msnap_source_t *src, uint64_t w) {
  unsigned lg = 0;
  while (lg < 63 && (UINT64_C(1) << lg) < w) lg++;
  if (lg > 31)
    return fail(src, MSNAP_EFORMAT,
                "the zstd-compressed data is corrupt: a frame asks for a "
                "window of %llu bytes, more than zstd allows (2^31)",
                (unsigned long long)w);
  char ws[32], lim[32];
  msnap__format_size(w, ws, sizeof ws);
  msnap__format_size(UINT64_C(1) << MSNAP_SOURCE_ZSTD_WINDOW_LOG, lim,
                     sizeof lim);
  /* (src->err holds 255 characters: the message fits at any size) */
  return fail(src, MSNAP_ELIMIT,
              "a zstd frame needs a window of %s (%llu bytes), more than "
              "the %s (2^%d bytes) memsnap decompresses with (a fixed "
              "limit): decompress it first, zstd -dc --long=%u FILE | "
              "memsnap COMMAND -",
              ws, (unsigned long long)w, lim, MSNAP_SOURCE_ZSTD_WINDOW_LOG,
              lg);
}

static ssize_t produce_zstd(msnap_source_t *src, unsigned char *dst,
                            size_t n) {
  struct msnap_source_priv_s *pr = src->priv;
  msnap__zstd_out_t out = {dst, n, 0};
  /* ZSTD_decompressStream returns an error without the bytes that call
   * made, so a call makes those of one block at most, after earlier
   * calls gave all they decoded: what a block decoded but could not give
   * is flushed first, by a call without input; then a call has the bytes
   * zstd's hint asks for (the next block and the header after it), and
   * at a frame's start only its header (the whole frame at once would be
   * decoded in one piece where the window has room).  So corrupt data is
   * met after every good byte before it, whatever the window and the
   * reads. */
  while (out.pos == 0) {
    if (pr->zs_last == 0 && pr->member_only) return 0;
    size_t give = 0;
    if (!pr->zs_flush || pr->zs_last == 0) {
      int more = raw_more(src);
      if (more < 0) return more;
      if (more == 2) break; /* nothing ready (fill_ahead) */
      if (more == 1) {
        if (pr->zs_last != 0)
          return fail(src, MSNAP_EFORMAT,
                      "the zstd-compressed data is truncated (the file "
                      "ends inside a frame; the offset counts decompressed "
                      "bytes)");
        return 0;
      }
      size_t hint = pr->zs_last ? pr->zs_last : ZSTD_HEAD_MAX;
      give = pr->raw_n < hint ? pr->raw_n : hint;
    }
    msnap__zstd_in_t in = {pr->raw, give, 0};
    if (pr->zs_last == 0) /* a frame starts (nothing made in this call) */
      pr->member_from = pr->produced;
    size_t r = zs.ZSTD_decompressStream(pr->zs, &out, &in);
    if (zs.ZSTD_isError(r)) {
      /* A frame whose header asks for a larger window than the decoder's
       * limit is refused at its header; any error of such a frame is
       * that one.  (The bytes of this call are its input from the start:
       * an error leaves in.pos as it was.) */
      uint64_t w;
      if (zstd_frame_window(pr->zs_head, pr->zs_head_n, pr->raw, pr->raw_n,
                            &w) &&
          w > (UINT64_C(1) << MSNAP_SOURCE_ZSTD_WINDOW_LOG))
        return zstd_window_refused(src, w);
      return fail(src, MSNAP_EFORMAT, "the zstd-compressed data is corrupt: %s",
                  zs.ZSTD_getErrorName(r));
    }
    if (pr->zs_head_n < ZSTD_HEAD_MAX) { /* the frame's header, kept */
      size_t k = ZSTD_HEAD_MAX - pr->zs_head_n;
      if (k > in.pos) k = in.pos;
      memcpy(pr->zs_head + pr->zs_head_n, pr->raw, k);
      pr->zs_head_n += k;
    }
    pr->raw += in.pos;
    pr->raw_n -= in.pos;
    pr->zs_flush = out.pos == out.size;
    pr->zs_last = r;
    if (r == 0) pr->zs_head_n = 0; /* the frame ended: the next starts */
  }
  return (ssize_t)out.pos;
}

/* Put up to n new bytes at dst; 0 at the end. */
static ssize_t produce(msnap_source_t *src, unsigned char *dst, size_t n) {
  switch (src->codec) {
  case MSNAP_SOURCE_GZIP: return produce_gzip(src, dst, n);
  case MSNAP_SOURCE_ZSTD: return produce_zstd(src, dst, n);
  default: return read_fd(src, dst, n);
  }
}

/* ---- the window ---------------------------------------------------------- */

int msnap__source_fill(msnap_source_t *src, const unsigned char **p,
                       size_t need) {
  struct msnap_source_priv_s *pr = src->priv;
  size_t have = (size_t)(src->end - *p);
  if (have >= need) return 0;
  if (pr->pending) return give_pending(src); /* it needs those bytes */
  if (pr->eof) return 1;
  if (need > MSNAP_SOURCE_MAX_NEED)
    return fail(src, MSNAP_ELIMIT,
                "an item of %zu bytes: more than the %u MiB a streamed or "
                "decompressed input may hold at once",
                need, MSNAP_SOURCE_MAX_NEED >> 20);
  src->start_off += (uint64_t)(*p - src->start);
  /* fill_ahead reads on after the window where the buffer has room for
   * `need` bytes from *p: moving the window (up to 1 MiB) to the front
   * at every MARK cost far more than the bytes a slow writer had sent */
  size_t dead = (size_t)((uintptr_t)*p - (uintptr_t)pr->buf);
  if (pr->ahead && pr->buf && dead <= pr->cap && pr->cap - dead >= need) {
    src->start = *p;
  } else {
    /* move what is left to the front, grow for `need` plus a chunk */
    size_t want = need > SIZE_MAX - CHUNK ? SIZE_MAX : need + CHUNK;
    if (pr->cap < want) {
      unsigned char *nb = malloc(want);
      if (!nb) return fail(src, MSNAP_ENOMEM, "out of memory for %zu bytes",
                           want);
      if (have) memcpy(nb, *p, have);
      free(pr->buf);
      pr->buf = nb;
      pr->cap = want;
    } else if (have && *p != pr->buf) {
      memmove(pr->buf, *p, have);
    }
    src->start = pr->buf;
    *p = pr->buf;
  }
  unsigned char *e = pr->buf + (size_t)(*p - pr->buf) + have;
  while ((size_t)(e - *p) < need && !pr->pending) {
    size_t room = pr->cap - (size_t)(e - pr->buf);
    /* one byte past the limit says the input exceeds it */
    uint64_t left = pr->limit + 1 - pr->produced;
    if (pr->ahead) { /* ahead: up to the limit, never past it */
      if (left <= 1) break;
      left--;
    }
    if (room > left) room = (size_t)left;
    ssize_t k = room ? produce(src, e, room) : 0;
    if (k < 0) {
      src->end = e;
      return (int)k;
    }
    if (k == 0) {
      if (pr->stalled) break; /* fill_ahead: nothing ready, not the end */
      pr->eof = true;
      break;
    }
    e += k;
    pr->produced += (uint64_t)k;
    if (pr->produced > pr->limit) {
      src->end = e;
      return fail(src, MSNAP_ELIMIT,
                  "the input is larger than the limit of %llu bytes for "
                  "streamed or decompressed input (MEMSNAP_INPUT_LIMIT)",
                  (unsigned long long)pr->limit);
    }
  }
  src->end = e;
  if ((size_t)(e - *p) >= need) return 0;
  /* the decompressor's error after the good bytes it made */
  return pr->pending ? give_pending(src) : 1;
}

int msnap__source_fill_ahead(msnap_source_t *src, const unsigned char **p,
                             size_t want) {
  struct msnap_source_priv_s *pr = src->priv;
  if (pr->eof || pr->pending || (size_t)(src->end - *p) >= want) return 0;
  /* nothing was ready at the last try, the reader has not refilled
   * since and has read less than DRY_STEP on: a writer slower than the
   * reader would have every MARK poll again */
  if (pr->dry && pr->dry_end == msnap__source_offset(src, src->end) &&
      msnap__source_offset(src, *p) - pr->dry_at < DRY_STEP)
    return 0;
  if (want > MSNAP_SOURCE_MAX_NEED) want = MSNAP_SOURCE_MAX_NEED;
  pr->ahead = true;
  pr->stalled = false;
  int rc = msnap__source_fill(src, p, want);
  pr->ahead = false;
  pr->dry = pr->stalled;
  pr->dry_at = msnap__source_offset(src, *p);
  pr->dry_end = msnap__source_offset(src, src->end);
  pr->stalled = false;
  /* kept for the fill that needs those bytes (the window holds what
   * came before the error); one the decompressor met after good bytes
   * is kept already */
  if (rc < 0 && !pr->pending) keep_pending(src, rc);
  src->err[0] = 0;
  return 0;
}

int msnap__source_finish(msnap_source_t *src, uint64_t end) {
  struct msnap_source_priv_s *pr = src->priv;
  if (src->codec == MSNAP_SOURCE_PLAIN) return 0;
  /* a stream is not read on, but an error already met in the member or
   * frame the pickle ended in (a CRC that does not match its bytes) is
   * the input's */
  if (!src->mapped)
    return pr->pending && pr->pending_from < end ? give_pending(src) : 0;
  const unsigned char *p = src->end;
  for (;;) {
    msnap__source_progress(src, p);
    int rc = msnap__source_fill(src, &p, 1);
    if (rc != 0) return rc < 0 ? rc : 0;
    p = src->end; /* what follows the pickle: dropped */
  }
}

int msnap__source_check_member(msnap_source_t *src, uint64_t at) {
  if (src->codec == MSNAP_SOURCE_PLAIN || src->err[0]) return 0;
  struct msnap_source_priv_s *pr = src->priv;
  /* the member the reader stopped in ended whole (its CRC matched): the
   * read-ahead went on past its end, and what it met or would meet
   * there is another member's */
  if (pr->member_from > at) return 0;
  pr->member_only = true;
  const unsigned char *p = src->end;
  for (;;) {
    msnap__source_progress(src, p);
    int rc = msnap__source_fill(src, &p, 1);
    if (rc != 0) return rc < 0 ? rc : 0;
    p = src->end; /* decompressed only to be checked: dropped */
  }
}

void msnap__source_progress(msnap_source_t *src, const unsigned char *p) {
  struct msnap_source_priv_s *pr = src->priv;
  if (!pr->map) return;
  /* the mapped bytes before the reader (or before the decompressor) */
  const unsigned char *at =
      src->codec == MSNAP_SOURCE_PLAIN ? p : pr->raw;
  if (at < pr->map || at > pr->map + pr->map_len) return;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  size_t upto = ((size_t)(at - pr->map) / pg) * pg;
  if (upto >= pr->dropped + DROP_STEP) {
    madvise(pr->map + pr->dropped, upto - pr->dropped, MADV_DONTNEED);
    pr->dropped = upto;
  }
}

const char *msnap__source_codec_name(const msnap_source_t *src) {
  switch (src->codec) {
  case MSNAP_SOURCE_GZIP: return "gzip-compressed ";
  case MSNAP_SOURCE_ZSTD: return "zstd-compressed ";
  default: return "";
  }
}

/* ---- opening ------------------------------------------------------------- */

static msnap_source_t *source_new(uint64_t limit) {
  msnap_source_t *src = calloc(1, sizeof *src);
  if (!src) return NULL;
  src->priv = calloc(1, sizeof *src->priv);
  if (!src->priv) {
    free(src);
    return NULL;
  }
  src->priv->fd = -1;
  /* the reads ask for limit + 1 bytes (one past says "too large"): a
   * limit of UINT64_MAX (an overflowing MEMSNAP_INPUT_LIMIT is clamped to
   * it) would wrap to 0 and read every stream as empty */
  src->priv->limit = limit < UINT64_MAX ? limit : UINT64_MAX - 1;
  return src;
}

void msnap__source_close(msnap_source_t *src) {
  if (!src) return;
  struct msnap_source_priv_s *pr = src->priv;
  if (pr) {
    if (pr->fd >= 0) close(pr->fd);
    if (pr->map) munmap(pr->map, pr->map_len);
    if (pr->z_init) zl.inflateEnd(&pr->z);
    if (pr->zs) zs.ZSTD_freeDStream(pr->zs);
    free(pr->buf);
    free(pr->in);
    free(pr);
  }
  free(src);
}

int msnap__source_mem(msnap_source_t **out, const void *buf, size_t len) {
  *out = NULL;
  msnap_source_t *src = source_new(UINT64_MAX - 1);
  if (!src) return MSNAP_ENOMEM;
  static const unsigned char none[1];
  src->start = len ? buf : none;
  src->end = src->start + len;
  src->size = len;
  src->priv->eof = true;
  *out = src;
  return 0;
}

static int detect_codec(msnap_source_t *src);

int msnap__source_chunked(msnap_source_t **out, const void *buf, size_t len,
                          size_t chunk, uint64_t limit) {
  *out = NULL;
  msnap_source_t *src = source_new(limit ? limit : MSNAP_SOURCE_LIMIT_DEFAULT);
  if (!src) return MSNAP_ENOMEM;
  struct msnap_source_priv_s *pr = src->priv;
  static const unsigned char none[1];
  pr->chunked = len ? buf : none;
  pr->chunked_len = len;
  pr->chunk = chunk ? chunk : 1;
  src->start = src->end = none;
  const unsigned char *p = src->start;
  int rc = msnap__source_fill(src, &p, 4);
  if (rc == 0 || rc == 1) rc = detect_codec(src);
  if (rc < 0) {
    msnap__source_close(src);
    return rc;
  }
  *out = src;
  return 0;
}

/* Why a file of this type cannot be a snapshot, or NULL.  fd >= 0: the
 * already open standard input (a socket is fine there). */
static const char *refused_type(mode_t m, dev_t rdev, int fd) {
  if (S_ISDIR(m)) return "is a directory, not a snapshot file";
  if (S_ISCHR(m))
    return fd >= 0 && isatty(fd) ? "is a terminal, not a snapshot file"
           : rdev == makedev(1, 3)
               ? "is /dev/null (always empty), not a snapshot file"
               : "is a character device, not a snapshot file (a "
                 "terminal, a device such as /dev/zero or /dev/urandom "
                 "whose data never ends, or another device: it is not "
                 "read)";
  if (S_ISBLK(m)) return "is a block device, not a snapshot file";
  if (S_ISSOCK(m) && fd < 0) return "is a socket, not a snapshot file";
  if (!S_ISREG(m) && !S_ISFIFO(m) && !S_ISSOCK(m))
    return "is not a regular file, a pipe or a FIFO";
  return NULL;
}

msnap_source_codec_t msnap__source_codec_of(const unsigned char *p,
                                            size_t n) {
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b)
    return MSNAP_SOURCE_GZIP;
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd)
    return MSNAP_SOURCE_ZSTD;
  return MSNAP_SOURCE_PLAIN;
}

/* Switch a source to decompression when its first bytes say so.  The
 * bytes already in the window become the first compressed input. */
static int detect_codec(msnap_source_t *src) {
  struct msnap_source_priv_s *pr = src->priv;
  const unsigned char *p = src->start;
  size_t n = (size_t)(src->end - src->start);
  msnap_source_codec_t c = msnap__source_codec_of(p, n);
  if (c == MSNAP_SOURCE_PLAIN) return 0;
  /* the library of the codec, opened on the first such input */
  pthread_once(c == MSNAP_SOURCE_GZIP ? &zl_once : &zs_once,
               c == MSNAP_SOURCE_GZIP ? zl_load : zs_load);
  const codec_lib_t *l = c == MSNAP_SOURCE_GZIP ? &zl.lib : &zs.lib;
  if (!l->ok)
    return fail(src, MSNAP_ENOTSUP,
                "reading %s input needs %s (%s), which could not be "
                "loaded: %s",
                l->codec, l->soname, l->what, l->why);
  if (c == MSNAP_SOURCE_GZIP) {
    memset(&pr->z, 0, sizeof pr->z);
    /* 15 + 16: gzip wrapper only (zlib.h's inflateInit2 macro) */
    if (zl.inflateInit2_(&pr->z, 15 + 16, MSNAP_ZLIB_VERSION,
                         (int)sizeof pr->z) != MSNAP__Z_OK)
      return fail(src, MSNAP_ENOMEM, "cannot start gzip decompression");
    pr->z_init = true;
  } else {
    pr->zs = zs.ZSTD_createDStream();
    if (!pr->zs || zs.ZSTD_isError(zs.ZSTD_initDStream(pr->zs)))
      return fail(src, MSNAP_ENOMEM, "cannot start zstd decompression");
    /* a frame may ask for a window up to 2^27 bytes (zstd's default
     * limit): the memory a decompressor needs stays bounded */
    zs.ZSTD_DCtx_setParameter(pr->zs, MSNAP_ZSTD_D_WINDOWLOGMAX,
                              MSNAP_SOURCE_ZSTD_WINDOW_LOG);
  }
  src->codec = c;
  if (pr->map) {
    pr->raw = pr->map;
    pr->raw_n = pr->map_len;
    pr->raw_eof = true;
  } else {
    /* the window holds the first compressed bytes: they become `in` */
    pr->in_cap = n > IN_CHUNK ? n : IN_CHUNK;
    pr->in = malloc(pr->in_cap);
    if (!pr->in) return fail(src, MSNAP_ENOMEM, "out of memory");
    memcpy(pr->in, p, n);
    pr->raw = pr->in;
    pr->raw_n = n;
    pr->raw_eof = pr->eof;
  }
  /* an empty window over the decompressed stream */
  pr->eof = false;
  pr->produced = 0;
  src->start = src->end = pr->buf ? pr->buf : (const unsigned char *)"";
  src->start_off = 0;
  return 0;
}

/* True when fd is the read end of an anonymous pipe ("pipe:[ino]"). */
static bool anonymous_pipe(int fd) {
  char link[64], target[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = 0;
  return strncmp(target, "pipe:", 5) == 0;
}

/* The code of an input that cannot be opened: MSNAP_ENOENT when nothing
 * is there (ENOENT: no such file, a dangling link, a missing directory on
 * the way; ENOTDIR: a file on the way), the table's "no such item", so
 * that a mistyped name is told from a file that exists but cannot be
 * read (permissions, I/O: MSNAP_EIO). */
static int open_errno_code(int e) {
  return e == ENOENT || e == ENOTDIR ? MSNAP_ENOENT : MSNAP_EIO;
}

int msnap__source_open(msnap_source_t **out, const char *path, uint64_t limit,
                       char *err, size_t errlen) {
  *out = NULL;
  err[0] = 0;
  bool is_stdin = strcmp(path, "-") == 0;
  struct stat st;
  int fd;
  if (is_stdin) {
    fd = fcntl(0, F_DUPFD_CLOEXEC, 3);
    if (fd < 0 || fstat(fd, &st) != 0) {
      snprintf(err, errlen, "cannot read standard input: %s",
               strerror(errno));
      if (fd >= 0) close(fd);
      return MSNAP_EIO;
    }
  } else {
    if (stat(path, &st) != 0) {
      int e = errno;
      struct stat lst;
      char target[256];
      ssize_t tn;
      if (e == ENOENT && lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) &&
          (tn = readlink(path, target, sizeof target - 1)) > 0) {
        /* the name is there, what it points to is not (or is a link
         * that leads nowhere in turn) */
        /* (at most 160 bytes of it: the message keeps its end) */
        bool cut = (size_t)tn == sizeof target - 1 || tn > 160;
        if (tn > 160) tn = 160;
        target[tn] = 0;
        for (ssize_t i = 0; i < tn; i++) /* (one line, whatever it holds) */
          if ((unsigned char)target[i] < 0x20 || target[i] == 0x7f)
            target[i] = '?';
        snprintf(err, errlen, "cannot open: a dangling symbolic link: its "
                 "target '%s'%s%s does not lead to a file", target,
                 cut ? "..." : "",
                 target[0] == '/' ? "" : " (relative to the link's "
                                         "directory)");
      } else {
        snprintf(err, errlen, "cannot open: %s", strerror(e));
      }
      return open_errno_code(e);
    }
    /* classified without opening it: opening a device can have effects */
    const char *why = refused_type(st.st_mode, st.st_rdev, -1);
    if (why) {
      snprintf(err, errlen, "%s", why);
      return MSNAP_EFORMAT;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
      int e = errno; /* (removed since the stat) */
      snprintf(err, errlen, "cannot open: %s", strerror(e));
      return open_errno_code(e);
    }
    if (fstat(fd, &st) != 0) {
      snprintf(err, errlen, "cannot stat: %s", strerror(errno));
      close(fd);
      return MSNAP_EIO;
    }
  }
  const char *why = refused_type(st.st_mode, st.st_rdev, is_stdin ? fd : -1);
  if (why) {
    snprintf(err, errlen, "%s%s", is_stdin ? "standard input " : "", why);
    close(fd);
    return MSNAP_EFORMAT;
  }
  msnap_source_t *src = source_new(limit ? limit : MSNAP_SOURCE_LIMIT_DEFAULT);
  if (!src) {
    close(fd);
    snprintf(err, errlen, "out of memory");
    return MSNAP_ENOMEM;
  }
  struct msnap_source_priv_s *pr = src->priv;
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      close(fd);
      madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
      pr->map = m;
      pr->map_len = (size_t)st.st_size;
      pr->eof = true;
      src->mapped = true;
      src->size = (uint64_t)st.st_size;
      src->start = m;
      src->end = src->start + pr->map_len;
      int rc = detect_codec(src);
      if (rc < 0) {
        snprintf(err, errlen, "%s", src->err);
        msnap__source_close(src);
        return rc;
      }
      *out = src;
      return 0;
    }
    /* not mappable (some FUSE file systems): read it as a stream */
  }
  pr->fd = fd;
  if (S_ISFIFO(st.st_mode) && !is_stdin && !anonymous_pipe(fd)) {
    pr->fifo_wait = true;
  } else {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  }
  static const unsigned char none[1];
  src->start = src->end = none;
  const unsigned char *p = src->start;
  int rc = msnap__source_fill(src, &p, 4);
  if (rc == 0 || rc == 1) rc = detect_codec(src);
  if (rc < 0) {
    snprintf(err, errlen, "%s", src->err);
    msnap__source_close(src);
    return rc;
  }
  *out = src;
  return 0;
}
