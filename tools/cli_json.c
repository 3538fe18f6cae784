/*
 * cli_json.c -- `--json` output: the library's JSON writer (base/json.c)
 * over a stdio sink, a generic model value as JSON, and the compact text
 * form of allocator_settings (the other formatter of a generic model
 * value).  The sink is unbuffered: commands may write to the same FILE
 * between two JSON values (the viewer's HTML around its data).
 */
#include <math.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cj_init(cli_json_t *j, FILE *f) {
  j->f = f;
  (void)msnap__sink_init_file(&j->sink, f);
  msnap__json_init(&j->w, &j->sink, MSNAP_JSON_PRETTY);
}

void cj_init_html(cli_json_t *j, FILE *f) {
  j->f = f;
  (void)msnap__sink_init_file(&j->sink, f);
  msnap__json_init(&j->w, &j->sink, MSNAP_JSON_HTML);
}

void cj_end(cli_json_t *j) {
  fputc('\n', j->f);
  fflush(j->f);
}

void cj_u64_fields(cli_json_t *j, const cli_u64_field_t *f, size_t n) {
  for (size_t i = 0; i < n; i++) {
    cj_key(j, f[i].key);
    cj_u64(j, f[i].v);
  }
}

void cj_output(cli_json_t *j, const char *written) {
  const char *why = cli_output_error();
  cj_key(j, "output");
  if (written != NULL && why[0] == '\0')
    cj_cstr(j, cli_output_named(written));
  else
    cj_null(j);
  cj_key(j, "output_error");
  if (why[0] != '\0')
    cj_cstr(j, why);
  else
    cj_null(j);
}

/* Write a generic value of the model (allocator_settings) as JSON.  Depth
 * is bounded by CJ_MAX_DEPTH; deeper parts are written as null. */
void cj_gv(cli_json_t *j, const msnap_snap_t *s, const msnap_gv_t *v) {
  size_t len;
  const char *p;
  if (j->w.depth >= CJ_MAX_DEPTH - 2) {
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
        msnap__json_key(&j->w, p, len);
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
 * its non-zero entries.  Nesting deeper than 8 prints "...".  At most
 * *left characters of strings and items are written: past them "..." and
 * nothing more (an item is for a person to read: a 200 MiB string in
 * allocator_settings printed 200 MiB of text). */
static void gv_text(FILE *f, const msnap_snap_t *s, const msnap_gv_t *v,
                    int depth, size_t *left) {
  size_t len;
  const char *p;
  if (*left == 0)
    return;
  if (depth > 8 || (depth == 8 && v->kind >= MSNAP_GV_LIST)) {
    fputs("...", f);
    return;
  }
  int w = 0;
  switch (v->kind) {
  case MSNAP_GV_NONE: w = fprintf(f, "None"); break;
  case MSNAP_GV_BOOL: w = fprintf(f, "%s", v->u.b ? "true" : "false"); break;
  case MSNAP_GV_INT: w = fprintf(f, "%" PRId64, v->u.i); break;
  case MSNAP_GV_FLOAT: w = fprintf(f, "%g", v->u.f); break;
  case MSNAP_GV_STR: {
    p = cli_str(s, v->u.s, &len);
    bool quote = len == 0 || memchr(p, ' ', len) || memchr(p, '\t', len);
    size_t shown = len < *left ? len : *left;
    if (quote)
      fputc('\'', f);
    for (size_t i = 0; i < shown; i++)
      fputc((unsigned char)p[i] < 0x20 || p[i] == 0x7f ? '?' : p[i], f);
    *left -= shown;
    if (shown < len) {
      fprintf(f, "... (%zu bytes)", len);
      return;
    }
    if (quote)
      fputc('\'', f);
    break;
  }
  case MSNAP_GV_LIST:
  case MSNAP_GV_TUPLE:
    fputc('[', f);
    for (uint32_t i = 0; i < v->u.seq.n && *left; i++) {
      if (i)
        fputc(',', f);
      (*left)--;
      gv_text(f, s, &v->u.seq.items[i], depth + 1, left);
    }
    if (*left == 0) {
      fprintf(f, "... (%u items)", v->u.seq.n);
      return;
    }
    fputc(']', f);
    break;
  case MSNAP_GV_DICT: {
    bool ints = int_dict(v), first = true;
    fputc('{', f);
    for (uint32_t i = 0; i + 1 < v->u.seq.n && *left; i += 2) {
      if (ints && v->u.seq.items[i + 1].u.i == 0)
        continue;
      if (!first)
        fputc(',', f);
      first = false;
      (*left)--;
      gv_text(f, s, &v->u.seq.items[i], depth + 1, left);
      fputc(':', f);
      gv_text(f, s, &v->u.seq.items[i + 1], depth + 1, left);
    }
    if (*left == 0) {
      fprintf(f, "... (%u entries)", v->u.seq.n / 2);
      return;
    }
    fputc('}', f);
    break;
  }
  }
  if (w > 0)
    *left -= (size_t)w < *left ? (size_t)w : *left;
}

/* Characters of one "key=value" item, at most (gv_text). */
#define SETTING_TEXT_MAX 512

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
    size_t left = SETTING_TEXT_MAX;
    gv_text(m, s, &d->u.seq.items[i], 0, &left);
    fputc('=', m);
    if (left)
      gv_text(m, s, val, 0, &left);
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

/* An npu recording's item that says nothing there: a CUDA-only key of
 * the CUDA conf (conf.c's S_CUDA keys, refused under the npu profile) at
 * its default, or PYTORCH_CUDA_ALLOC_CONF repeating PYTORCH_NPU_ALLOC_CONF
 * (memsnap's writer fills both from the one conf: api/snapshot.c). */
static bool cuda_only_default(const char *item, bool cuda_conf_repeats) {
  static const char *const dflt[] = {
      "release_lock_on_cudamalloc=false",
      "pinned_use_cuda_host_register=false",
      "graph_capture_record_stream_reuse=false"};
  for (size_t k = 0; k < sizeof dflt / sizeof *dflt; k++)
    if (!strcmp(item, dflt[k]))
      return true;
  static const char cuda[] = "PYTORCH_CUDA_ALLOC_CONF=";
  return cuda_conf_repeats && !strncmp(item, cuda, sizeof cuda - 1);
}

/* cli_settings_items without, on an npu recording
 * (cli_recording_profile), the items cuda_only_default names. */
char **cli_settings_shown(const msnap_snap_t *s, const msnap_gv_t *d,
                          uint32_t *n) {
  char **v = cli_settings_items(s, d, n);
  if (!v || strcmp(cli_recording_profile(s), "npu") != 0)
    return v;
  /* (the values themselves: the items cut a long one, at a length that
   * depends on the key's) */
  const msnap_gv_t *cc = cli_gv_get(s, d, "PYTORCH_CUDA_ALLOC_CONF");
  const msnap_gv_t *nc = cli_gv_get(s, d, "PYTORCH_NPU_ALLOC_CONF");
  bool repeats = false;
  if (cc && nc && cc->kind == MSNAP_GV_STR && nc->kind == MSNAP_GV_STR) {
    size_t lc, ln;
    const char *pc = cli_str(s, cc->u.s, &lc), *pn = cli_str(s, nc->u.s, &ln);
    repeats = lc == ln && memcmp(pc, pn, lc) == 0;
  }
  uint32_t k = 0;
  for (uint32_t i = 0; i < *n; i++) {
    if (cuda_only_default(v[i], repeats))
      free(v[i]);
    else
      v[k++] = v[i];
  }
  *n = k;
  return v;
}
