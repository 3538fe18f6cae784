/*
 * cli_json.c -- a small streaming JSON writer for `--json` output.
 *
 * Invariants: depth is the number of open containers; nonempty[d] is true
 * once container d received a value (so the next one needs a comma);
 * after_key is true between cj_key() and the value written for it.  The
 * writer never buffers: every call writes straight to the FILE.
 *
 * Also here: the compact text form of allocator_settings (the other
 * formatter of a generic model value).
 */
#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cj_init(cli_json_t *j, FILE *f) {
  j->f = f;
  j->depth = 0;
  j->nonempty[0] = false;
  j->after_key = false;
  j->compact = false;
  j->html = false;
}

static void cj_indent(cli_json_t *j) {
  if (j->compact)
    return;
  fputc('\n', j->f);
  for (int i = 0; i < j->depth; i++)
    fputs("  ", j->f);
}

/* Separator before a value: a comma and a new line inside containers,
 * nothing right after a key. */
static void cj_pre(cli_json_t *j) {
  if (j->after_key) {
    j->after_key = false;
    return;
  }
  if (j->depth > 0) {
    if (j->nonempty[j->depth])
      fputc(',', j->f);
    cj_indent(j);
  }
  j->nonempty[j->depth] = true;
}

static void cj_escape_x(FILE *f, const char *s, size_t len, bool html) {
  fputc('"', f);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': fputs("\\\"", f); break;
    case '\\': fputs("\\\\", f); break;
    case '\n': fputs("\\n", f); break;
    case '\r': fputs("\\r", f); break;
    case '\t': fputs("\\t", f); break;
    default:
      if (c < 0x20 || c == 0x7f || (html && (c == '<' || c == '>' || c == '&')))
        fprintf(f, "\\u%04x", c);
      else
        fputc(c, f);
    }
  }
  fputc('"', f);
}

void cj_escape(FILE *f, const char *s, size_t len) {
  cj_escape_x(f, s, len, false);
}

static void cj_open(cli_json_t *j, char c) {
  cj_pre(j);
  fputc(c, j->f);
  if (j->depth + 1 < CJ_MAX_DEPTH)
    j->depth++;
  j->nonempty[j->depth] = false;
}

static void cj_close(cli_json_t *j, char c) {
  bool had = j->nonempty[j->depth];
  if (j->depth > 0)
    j->depth--;
  if (had)
    cj_indent(j);
  fputc(c, j->f);
}

void cj_obj(cli_json_t *j) { cj_open(j, '{'); }
void cj_obj_end(cli_json_t *j) { cj_close(j, '}'); }
void cj_arr(cli_json_t *j) { cj_open(j, '['); }
void cj_arr_end(cli_json_t *j) { cj_close(j, ']'); }

void cj_key(cli_json_t *j, const char *key) {
  cj_pre(j);
  cj_escape_x(j->f, key, strlen(key), j->html);
  fputs(j->compact ? ":" : ": ", j->f);
  j->after_key = true;
}

void cj_str(cli_json_t *j, const char *s, size_t len) {
  cj_pre(j);
  cj_escape_x(j->f, s, len, j->html);
}

void cj_cstr(cli_json_t *j, const char *s) {
  if (!s) {
    cj_null(j);
    return;
  }
  cj_str(j, s, strlen(s));
}

void cj_u64(cli_json_t *j, uint64_t v) {
  cj_pre(j);
  fprintf(j->f, "%" PRIu64, v);
}

void cj_i64(cli_json_t *j, int64_t v) {
  cj_pre(j);
  fprintf(j->f, "%" PRId64, v);
}

void cj_dbl(cli_json_t *j, double v) {
  cj_pre(j);
  if (isfinite(v))
    fprintf(j->f, "%.17g", v);
  else
    fputs("null", j->f);
}

void cj_bool(cli_json_t *j, bool v) {
  cj_pre(j);
  fputs(v ? "true" : "false", j->f);
}

void cj_null(cli_json_t *j) {
  cj_pre(j);
  fputs("null", j->f);
}

void cj_end(cli_json_t *j) {
  fputc('\n', j->f);
  fflush(j->f);
}

/* Write a generic value of the model (allocator_settings) as JSON.  Depth
 * is bounded by CJ_MAX_DEPTH; deeper parts are written as null. */
void cj_gv(cli_json_t *j, const msnap_snap_t *s, const msnap_gv_t *v) {
  size_t len;
  const char *p;
  if (j->depth >= CJ_MAX_DEPTH - 2) {
    cj_null(j);
    return;
  }
  switch (v->kind) {
  case MSNAP_GV_BOOL: cj_bool(j, v->u.b); break;
  case MSNAP_GV_INT: cj_i64(j, v->u.i); break;
  case MSNAP_GV_FLOAT: cj_dbl(j, v->u.f); break;
  case MSNAP_GV_STR:
    p = cli_str(s, v->u.s, &len);
    cj_str(j, p, len);
    break;
  case MSNAP_GV_LIST:
  case MSNAP_GV_TUPLE:
    cj_arr(j);
    for (uint32_t i = 0; i < v->u.seq.n; i++)
      cj_gv(j, s, &v->u.seq.items[i]);
    cj_arr_end(j);
    break;
  case MSNAP_GV_DICT:
    cj_obj(j);
    for (uint32_t i = 0; i + 1 < v->u.seq.n; i += 2) {
      const msnap_gv_t *k = &v->u.seq.items[i];
      char kb[64];
      if (k->kind == MSNAP_GV_STR) {
        p = cli_str(s, k->u.s, &len);
        cj_pre(j);
        cj_escape_x(j->f, p, len, j->html);
        fputs(j->compact ? ":" : ": ", j->f);
        j->after_key = true;
      } else {
        if (k->kind == MSNAP_GV_INT)
          snprintf(kb, sizeof kb, "%" PRId64, k->u.i);
        else
          snprintf(kb, sizeof kb, "?");
        cj_key(j, kb);
      }
      cj_gv(j, s, &v->u.seq.items[i + 1]);
    }
    cj_obj_end(j);
    break;
  default: cj_null(j); break;
  }
}

/* True for a dict whose values are all integers (roundup_power2_divisions:
 * interval -> divisions). */
static bool int_dict(const msnap_gv_t *v) {
  if (v->kind != MSNAP_GV_DICT)
    return false;
  for (uint32_t i = 1; i < v->u.seq.n; i += 2)
    if (v->u.seq.items[i].kind != MSNAP_GV_INT)
      return false;
  return true;
}

/* A settings value as compact text: strings bare (quoted when empty or
 * holding a blank), lists [a,b], dicts {k:v}; an integer dict keeps only
 * its non-zero entries.  Nesting deeper than 8 prints "...". */
static void gv_text(FILE *f, const msnap_snap_t *s, const msnap_gv_t *v,
                    int depth) {
  size_t len;
  const char *p;
  if (depth > 8 || (depth == 8 && v->kind >= MSNAP_GV_LIST)) {
    fputs("...", f);
    return;
  }
  switch (v->kind) {
  case MSNAP_GV_NONE: fputs("None", f); break;
  case MSNAP_GV_BOOL: fputs(v->u.b ? "true" : "false", f); break;
  case MSNAP_GV_INT: fprintf(f, "%" PRId64, v->u.i); break;
  case MSNAP_GV_FLOAT: fprintf(f, "%g", v->u.f); break;
  case MSNAP_GV_STR: {
    p = cli_str(s, v->u.s, &len);
    bool quote = len == 0 || memchr(p, ' ', len) || memchr(p, '\t', len);
    if (quote)
      fputc('\'', f);
    for (size_t i = 0; i < len; i++)
      fputc((unsigned char)p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i], f);
    if (quote)
      fputc('\'', f);
    break;
  }
  case MSNAP_GV_LIST:
  case MSNAP_GV_TUPLE:
    fputc('[', f);
    for (uint32_t i = 0; i < v->u.seq.n; i++) {
      if (i)
        fputc(',', f);
      gv_text(f, s, &v->u.seq.items[i], depth + 1);
    }
    fputc(']', f);
    break;
  case MSNAP_GV_DICT: {
    bool ints = int_dict(v), first = true;
    fputc('{', f);
    for (uint32_t i = 0; i + 1 < v->u.seq.n; i += 2) {
      if (ints && v->u.seq.items[i + 1].u.i == 0)
        continue;
      if (!first)
        fputc(',', f);
      first = false;
      gv_text(f, s, &v->u.seq.items[i], depth + 1);
      fputc(':', f);
      gv_text(f, s, &v->u.seq.items[i + 1], depth + 1);
    }
    fputc('}', f);
    break;
  }
  }
}

/*
 * allocator_settings (a dict) as "key=value" items: an integer dict
 * (roundup_power2_divisions) only when one entry is non-zero, and then
 * only its non-zero entries.  Returns a malloc'd array of *n malloc'd
 * strings (caller frees each and the array), NULL on ENOMEM or when d is
 * not a dict.
 */
char **cli_settings_items(const msnap_snap_t *s, const msnap_gv_t *d,
                          uint32_t *n) {
  *n = 0;
  if (d->kind != MSNAP_GV_DICT)
    return NULL;
  char **v = calloc(d->u.seq.n / 2 + 1, sizeof *v);
  if (!v)
    return NULL;
  for (uint32_t i = 0; i + 1 < d->u.seq.n; i += 2) {
    const msnap_gv_t *val = &d->u.seq.items[i + 1];
    if (int_dict(val)) {
      bool any = false;
      for (uint32_t k = 1; k < val->u.seq.n; k += 2)
        any |= val->u.seq.items[k].u.i != 0;
      if (!any)
        continue;
    }
    char *item = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&item, &len);
    if (!m)
      goto oom;
    gv_text(m, s, &d->u.seq.items[i], 0);
    fputc('=', m);
    gv_text(m, s, val, 0);
    if (fclose(m) != 0 || !item) {
      free(item);
      goto oom;
    }
    v[(*n)++] = item;
  }
  return v;
oom:
  for (uint32_t i = 0; i < *n; i++)
    free(v[i]);
  free(v);
  *n = 0;
  return NULL;
}
