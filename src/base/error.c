/*
 * error.c -- error codes and the per-thread last-error text.
 *
 * The code table is the MSNAP_ERRNO_MAP X-macro of memsnap.h; this file only
 * turns it into text.  Every thread owns one fixed-size buffer holding the
 * text of the last error reported on that thread (msnap__set_error).
 *
 * Invariants:
 *   - The last-error buffer is always NUL-terminated; it is "" until the
 *     first error on the thread.
 *   - msnap__set_error never allocates, so it is safe on out-of-memory
 *     paths; messages longer than the buffer are truncated with "...".
 *
 * msnap__assert_fail is where MSNAP_ASSERT (base.h, MSNAP_DEBUG >= 2)
 * ends: it names the condition and its place, then aborts.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define MSNAP_LAST_ERROR_MAX 2048

static _Thread_local char last_error[MSNAP_LAST_ERROR_MAX];
static _Thread_local int last_errno;

const char *msnap_strerror(int err) {
  switch (err) {
  case MSNAP_OK:
    return "success";
#define MSNAP_STRERROR_CASE_(name, value, text)                               \
  case MSNAP_##name:                                                          \
    return text;
    MSNAP_ERRNO_MAP(MSNAP_STRERROR_CASE_)
#undef MSNAP_STRERROR_CASE_
  default:
    return "unknown error";
  }
}

const char *msnap_err_name(int err) {
  switch (err) {
  case MSNAP_OK:
    return "MSNAP_OK";
#define MSNAP_ERR_NAME_CASE_(name, value, text)                               \
  case MSNAP_##name:                                                          \
    return "MSNAP_" #name;
    MSNAP_ERRNO_MAP(MSNAP_ERR_NAME_CASE_)
#undef MSNAP_ERR_NAME_CASE_
  default:
    return "MSNAP_EUNKNOWN";
  }
}

void msnap_free_string(char *s) { free(s); }

/*
 * Format a message into this thread's last-error buffer and return err.
 * The text is built in a local buffer first, so the arguments may point
 * into the current last-error text (msnap_last_error()).  A NULL fmt stores
 * msnap_strerror(err).
 */
static int set_error_v(int err, int sys_errno, const char *fmt,
                       va_list ap) {
  char tmp[MSNAP_LAST_ERROR_MAX];
  if (fmt == NULL) {
    snprintf(tmp, sizeof tmp, "%s", msnap_strerror(err));
  } else {
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    if (n < 0) {
      snprintf(tmp, sizeof tmp, "%s", msnap_strerror(err));
    } else if ((size_t)n >= sizeof tmp) {
      memcpy(tmp + sizeof tmp - 4, "...", 4);
    }
  }
  memcpy(last_error, tmp, sizeof tmp);
  last_errno = sys_errno;
  return err;
}

int msnap__set_error(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error_v(err, 0, fmt, ap);
  va_end(ap);
  return err;
}

/* As msnap__set_error, also keeping the system errno for callers that
 * rebuild an OSError (Python) or print strerror (CLI). */
int msnap__set_error_errno(int err, int sys_errno, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error_v(err, sys_errno, fmt, ap);
  va_end(ap);
  return err;
}

int msnap__errno_code(int e) {
  if (e == ENOSPC || e == EDQUOT) return MSNAP_ENOSPC;
  if (e == ENOMEM) return MSNAP_ENOMEM;
  return MSNAP_EIO;
}

int msnap_last_errno(void) { return last_errno; }

const char *msnap_last_error(void) { return last_error; }

void msnap__assert_fail(const char *cond, const char *file, int line) {
  fprintf(stderr, "memsnap: internal assertion failed: %s (%s:%d)\n", cond,
          file, line);
  abort();
}
