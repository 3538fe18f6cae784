/*
 * source.h -- input sources, the reading counterpart of sink.h: the bytes
 * of a file, a pipe or a memory buffer, decompressed when they are gzip or
 * zstd, handed to a reader through a window that it advances.
 *
 * The window is [start, end): the bytes at stream offsets [start_off,
 * start_off + (end - start)).  A reader keeps a position p inside it and
 * calls msnap__source_fill(src, &p, need) when it needs `need` bytes from
 * p; the window may then move (p is updated, pointers into the old window
 * are invalid).  So a streamed input is held in memory only as far as the
 * longest single item the reader needs at once, plus one read chunk.
 *
 * Kinds (msnap__source_open classifies the path before opening it):
 *   - memory: a caller's buffer, never refilled (msnap__source_mem);
 *   - mapped: a regular file, mmap'ed read-only, no copy; pages behind the
 *     reader are dropped (MADV_DONTNEED) by msnap__source_progress;
 *   - stream: what has no size but can be read -- a pipe ("-" is standard
 *     input), a named FIFO, a file of a pseudo file system whose stat
 *     size is 0 (/proc/self/maps): read(2) in 1 MiB chunks (more where
 *     the reader reads ahead, msnap__source_fill_ahead).  A named FIFO
 *     is opened without blocking; when no byte comes within
 *     MSNAP_SOURCE_FIFO_WAIT_MS and no program has it open for writing it
 *     is refused (MSNAP_EIO "no writer"), so a FIFO nobody writes never
 *     hangs the reader, while one whose writer is slow is waited for, as
 *     a pipe;
 *   - gzip / zstd: a mapped or streamed file whose first bytes are the
 *     gzip (1f 8b) or zstd (28 b5 2f fd) magic number, decompressed into
 *     the window (zlib, libzstd: opened with dlopen on the first such
 *     input, MEMSNAP_ZLIB_LIBRARY / MEMSNAP_ZSTD_LIBRARY naming other
 *     files; MSNAP_ENOTSUP "reading gzip input needs libz.so.1 ..." when
 *     one cannot be loaded); concatenated members/frames are read as one
 *     stream.
 * Refused with a clear message (MSNAP_EFORMAT, nothing opened): character
 * and block devices (/dev/zero, /dev/urandom, a terminal), sockets by
 * path, directories.
 *
 * Bounds: streamed and decompressed bytes count against `limit` (the
 * reader passes MEMSNAP_INPUT_LIMIT, default MSNAP_SOURCE_LIMIT_DEFAULT);
 * past it msnap__source_fill fails with MSNAP_ELIMIT.  The window of a
 * stream holds at most MSNAP_SOURCE_MAX_NEED bytes for one item plus a
 * 1 MiB chunk; a zstd frame may ask for a 128 MiB window at most
 * (MSNAP_SOURCE_ZSTD_WINDOW_LOG, ZSTD_d_windowLogMax 27; a frame that asks
 * for more, as `zstd --long=31` writes, is refused with MSNAP_ELIMIT
 * naming both sizes), gzip needs 32 KiB.
 *
 * Errors: open and fill return 0 or a negative MSNAP_E* code with the
 * reason in src->err (open: in the caller's buffer), never naming the
 * path (the caller does).
 */
#ifndef MSNAP_SOURCE_H
#define MSNAP_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MSNAP_SOURCE_LIMIT_DEFAULT (UINT64_C(8) << 30)
#define MSNAP_SOURCE_FIFO_WAIT_MS 5000
/* The most a streamed or decompressed source holds for one item (a
 * string): larger ones are refused with MSNAP_ELIMIT. */
#define MSNAP_SOURCE_MAX_NEED (256u << 20)
/* The largest zstd window (log2 bytes) a source decompresses with: zstd's
 * own default limit (ZSTD_WINDOWLOG_LIMIT_DEFAULT), so that the memory a
 * decompressor needs stays bounded whatever the frame asks. */
#define MSNAP_SOURCE_ZSTD_WINDOW_LOG 27

typedef enum msnap_source_codec_e {
  MSNAP_SOURCE_PLAIN = 0,
  MSNAP_SOURCE_GZIP,
  MSNAP_SOURCE_ZSTD
} msnap_source_codec_t;

typedef struct msnap_source_s {
  /* The window (read-only for the reader). */
  const unsigned char *start, *end;
  uint64_t start_off;
  /* What the bytes are: plain, gzip or zstd; whether the file was mapped
   * (its size known: `size`) or is streamed. */
  msnap_source_codec_t codec;
  bool mapped;
  uint64_t size; /* mapped: bytes of the file (compressed ones for gzip/zstd) */
  char err[256];
  struct msnap_source_priv_s *priv;
} msnap_source_t;

/* Open `path` ("-" = standard input).  On failure *out is NULL and err
 * (errlen bytes) holds the reason, e.g. "is a character device ...";
 * MSNAP_ENOENT when no such file exists, MSNAP_EIO when it cannot be
 * opened or read, MSNAP_EFORMAT for a type refused unread. */
int msnap__source_open(msnap_source_t **out, const char *path, uint64_t limit,
                       char *err, size_t errlen);
/* A source over buf[0..len) (the caller keeps buf; not decompressed). */
int msnap__source_mem(msnap_source_t **out, const void *buf, size_t len);
void msnap__source_close(msnap_source_t *src);
/* Tests and fuzzing: buf[0..len) as a stream that yields at most `chunk`
 * bytes per read (so every refill path runs), decompressed when it starts
 * with a gzip or zstd magic, with `limit` (0: the default). */
int msnap__source_chunked(msnap_source_t **out, const void *buf, size_t len,
                          size_t chunk, uint64_t limit);

/* Make `need` bytes available at *p (start <= *p <= end).  0 when they
 * are; 1 at the end of the input with fewer (end - *p < need); a
 * negative MSNAP_E* code with src->err on a read, decompression or limit
 * error.  *p, start and end may move.  Every byte a decompressor made
 * before its error is given first (the error is returned by the fill
 * that needs the bytes after them), so the error's offset is where it
 * was met, whatever the window and read sizes. */
int msnap__source_fill(msnap_source_t *src, const unsigned char **p,
                       size_t need);
/* Read ahead without waiting: make up to `want` bytes available at *p
 * (at most MSNAP_SOURCE_MAX_NEED), taking only what is ready now -- a
 * pipe's or FIFO's bytes already written (poll, no wait), what a
 * decompressor makes of them or of a mapped file -- and never past the
 * limit.  A reader calls it where a bigger window lets it decode more in
 * one piece (the pickle reader's fast path, at a batch of trace entries).
 * Always 0: an error it meets (a read error, corrupt compressed data) is
 * kept and returned by the msnap__source_fill that needs the bytes past
 * the last good one, as if that fill had read them; the source's err is
 * empty until then.  *p, start and end may move.  A mapped plain file or
 * a memory buffer has all its bytes already: nothing to do. */
int msnap__source_fill_ahead(msnap_source_t *src, const unsigned char **p,
                             size_t want);
/* The stream offset of p (inside the window). */
static inline uint64_t msnap__source_offset(const msnap_source_t *src,
                                            const unsigned char *p) {
  return src->start_off + (uint64_t)(p - src->start);
}
/* The reader is at p: what lies before it will not be asked again
 * (mapped files drop those pages). */
void msnap__source_progress(msnap_source_t *src, const unsigned char *p);
/* The reader is done (its pickle ended at stream offset `end`, just past
 * its STOP): a compressed regular file must also end whole -- the rest
 * is decompressed and dropped, so that a file cut inside its last member
 * or frame (a gzip member without its CRC/size trailer) or with a bad
 * checksum is an error, as gzip -t says.  0, or a negative MSNAP_E* code
 * with src->err.  Plain inputs: 0 at once; streams too (a stream's
 * writer may keep its end open), unless an error was met already in the
 * member or frame the pickle ended in (read ahead: its CRC, its end). */
int msnap__source_finish(msnap_source_t *src, uint64_t end);
/* The reader failed on decompressed bytes, at stream offset `at`:
 * decompress on to the end of the gzip member or zstd frame it was in
 * (dropping the bytes; within the limit), so that corrupt compressed
 * data -- whose garbage is what the reader failed on, before the
 * member's CRC or the frame's checksum was reached -- is named as such.
 * A negative MSNAP_E* code with src->err (MSNAP_EFORMAT: the data is
 * corrupt or cut), else 0.  Plain inputs, a source that failed already,
 * and a member that was decompressed to its end already (the read-ahead
 * went past it; an error met after it is another member's): 0 at once.
 * It never reads past the end of the member, so a stream's writer that
 * keeps its end open is not waited for; the source gives no more bytes
 * afterwards. */
int msnap__source_check_member(msnap_source_t *src, uint64_t at);
/* "gzip-compressed " / "zstd-compressed " / "" for messages. */
const char *msnap__source_codec_name(const msnap_source_t *src);
/* The codec whose magic number starts p[0..n) (gzip 1f 8b, zstd
 * 28 b5 2f fd), else MSNAP_SOURCE_PLAIN. */
msnap_source_codec_t msnap__source_codec_of(const unsigned char *p, size_t n);

#endif /* MSNAP_SOURCE_H */
