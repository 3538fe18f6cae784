/*
 * json.h -- the one JSON writer of memsnap (json.c): a streaming writer
 * over a sink (sink.h), used by the snapshot model's JSON output
 * (model/snapshot_write.c) and by the CLI's --json output and viewer data
 * (tools/).  Strings are checked as UTF-8 on the way out: a byte sequence
 * that is not valid UTF-8 is written as U+FFFD, so the output always
 * decodes.
 */
#ifndef MSNAP_JSON_H
#define MSNAP_JSON_H

#include "base/base.h"
#include "base/sink.h"

/* Deep enough for every value the model can hold (the pickle reader's
 * nesting limit is lower). */
#define MSNAP_JSON_MAX_DEPTH 1152

enum {
  MSNAP_JSON_PRETTY = 1u << 0,      /* new lines, two-space indent, ": " */
  MSNAP_JSON_HTML = 1u << 1,        /* also escape < > & (inside <script>) */
  MSNAP_JSON_FLOAT_POINT = 1u << 2  /* doubles always show a "." or an
                                     * exponent, as Python writes floats */
};

typedef struct msnap_json_s {
  msnap_sink_t *out;
  unsigned flags;
  int depth;                                  /* open containers     */
  uint64_t nonempty[MSNAP_JSON_MAX_DEPTH / 64]; /* bit d: container d
                                                 * has a value         */
  bool after_key;                       /* a key waits for its value */
  /* the last double written (dbl_len 0: none), its text without the
   * ".0" of MSNAP_JSON_FLOAT_POINT */
  uint64_t dbl_bits;
  uint8_t dbl_len;
  char dbl_text[31];
} msnap_json_t;

void msnap__json_init(msnap_json_t *j, msnap_sink_t *out, unsigned flags);
/* Containers; more than MSNAP_JSON_MAX_DEPTH - 1 open at once is
 * MSNAP_ELIMIT (sticky in the sink). */
void msnap__json_obj(msnap_json_t *j);
void msnap__json_obj_end(msnap_json_t *j);
void msnap__json_arr(msnap_json_t *j);
void msnap__json_arr_end(msnap_json_t *j);
/* A key of the open object; the next value belongs to it. */
void msnap__json_key(msnap_json_t *j, const char *k, size_t len);
void msnap__json_ckey(msnap_json_t *j, const char *k);
/* Values.  msnap__json_cstr(NULL) writes null; doubles are written with
 * the fewest significant digits that read back as the same double (the
 * digits of Python's repr: 0.1, not 0.10000000000000001); doubles that
 * are not finite are written as null. */
void msnap__json_str(msnap_json_t *j, const char *s, size_t len);
void msnap__json_cstr(msnap_json_t *j, const char *s);
void msnap__json_i64(msnap_json_t *j, int64_t v);
void msnap__json_u64(msnap_json_t *j, uint64_t v);
void msnap__json_dbl(msnap_json_t *j, double v);
void msnap__json_bool(msnap_json_t *j, bool v);
void msnap__json_null(msnap_json_t *j);
/* The sink's sticky error (0 when every write went through). */
int msnap__json_err(const msnap_json_t *j);

#endif /* MSNAP_JSON_H */
