/*
 * cmd_view.c -- `memsnap view FILE -o OUT.html`: one self-contained HTML
 * file (no network, vanilla JavaScript from view.js, data inline) with the
 * active-memory timeline, the segment/block layout at a chosen entry and
 * the stacks on click.
 *
 * The data is a compact JSON object DATA (see view.js): frames and stacks
 * are written once each (only those referenced) and referred to by index;
 * per device the top allocation sites, the final segments with their
 * blocks [address, size, state, requested, stack, alloc entry (-1 unknown,
 * -2 before the trace)], the start state of the
 * trace (backward replay), the trace entries as
 * [action, addr, size, stack, time_us|null] and the record_function
 * annotations as [entry index, name, is_start].  Strings are escaped so that
 * "</script>" cannot occur inside the data.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "view_js.h"

typedef struct remap_s {
  uint32_t *stack; /* model stack id -> DATA.stacks index (0 = none) */
  uint32_t *frame; /* model frame id -> DATA.frames index + 1         */
  uint32_t *stack_list;
  uint32_t nstack_list;
  uint32_t *frame_list;
  uint32_t nframe_list;
} remap_t;

static uint32_t use_stack(remap_t *m, const msnap_snap_t *s,
                          msnap_stack_t st) {
  uint32_t n;
  const uint32_t *fr = cli_stack(s, st, &n);
  if (!fr || n == 0)
    return 0;
  if (m->stack[st])
    return m->stack[st];
  m->stack_list[m->nstack_list] = st;
  m->stack[st] = ++m->nstack_list;
  for (uint32_t i = 0; i < n; i++)
    if (fr[i] < s->nframes && !m->frame[fr[i]]) {
      m->frame_list[m->nframe_list] = fr[i];
      m->frame[fr[i]] = ++m->nframe_list;
    }
  return m->stack[st];
}

static const char *CSS =
    "body{font:13px sans-serif;margin:12px;color:#222}"
    "h1{font-size:16px;margin:4px 0}"
    "h2{font-size:13px;margin:12px 0 4px}"
    "#main{display:flex;gap:12px}#left{flex:3;min-width:0}"
    "#right{flex:2;min-width:0;max-height:80vh;overflow:auto;"
    "border-left:1px solid #ddd;padding-left:10px}"
    "#layoutbox{max-height:60vh;overflow:auto;border:1px solid #ddd}"
    ".dim{color:#777}li.sys{color:#888}li.user{font-weight:bold}"
    "ol{padding-left:22px;font-family:monospace;font-size:12px}"
    "ol ol{padding-left:14px}summary{cursor:pointer;color:#777}"
    "#slider{width:100%}"
    ".legend{margin:4px 0;font-size:12px;color:#333}"
    ".legend span.sw{display:inline-block;width:14px;height:10px;"
    "margin:0 4px 0 12px;vertical-align:baseline}"
    ".legend span.sw:first-child{margin-left:0}"
    "table{border-collapse:collapse;font-size:12px}"
    "td{padding:1px 6px;vertical-align:top}td.n{text-align:right;"
    "white-space:nowrap}td.site{font-family:monospace;overflow-wrap:anywhere}"
    "#settings{font-family:monospace;font-size:11px;line-height:1.6}"
    "#settings span{white-space:nowrap;margin-right:10px}";

/* An active block of the final state and its address. */
typedef struct fblock_s {
  uint64_t addr;
  const msnap_sblock_t *b;
} fblock_t;

static int cmp_fblock(const void *a, const void *b) {
  uint64_t x = ((const fblock_t *)a)->addr, y = ((const fblock_t *)b)->addr;
  return x < y ? -1 : x > y;
}

/* The active blocks of device dev in the final segments, sorted by
 * address; *n set; NULL on ENOMEM (caller frees). */
static fblock_t *final_blocks(const msnap_snap_t *s, int64_t dev,
                              uint32_t *n) {
  uint32_t cap = 0, k = 0;
  for (uint32_t gi = 0; gi < s->nsegments; gi++)
    if (s->segments[gi].device == dev)
      cap += s->segments[gi].nblocks;
  fblock_t *v = malloc(((size_t)cap + 1) * sizeof *v);
  if (!v)
    return NULL;
  for (uint32_t gi = 0; gi < s->nsegments; gi++) {
    const msnap_ssegment_t *g = &s->segments[gi];
    if (g->device != dev)
      continue;
    uint64_t a = g->address;
    for (uint32_t i = 0; i < g->nblocks; i++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + i];
      if (b->keys & MSNAP_K_ADDRESS)
        a = b->address;
      if (cli_block_active(b)) {
        v[k].addr = a;
        v[k++].b = b;
      }
      a += b->size;
    }
  }
  qsort(v, k, sizeof *v, cmp_fblock);
  *n = k;
  return v;
}

typedef struct vsite_s {
  char *text;
  uint64_t bytes, count;
} vsite_t;

static int cmp_vsite_text(const void *a, const void *b) {
  return strcmp(((const vsite_t *)a)->text, ((const vsite_t *)b)->text);
}

static int cmp_vsite_bytes(const void *a, const void *b) {
  const vsite_t *x = a, *y = b;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  return strcmp(x->text, y->text);
}

#define VIEW_SITES 12

/* "sites": the VIEW_SITES allocation sites with the most live bytes at the
 * end of the file, [text, bytes, count] (as `memsnap summary`).  0 or -1
 * on ENOMEM. */
static int write_sites(cli_json_t *j, const msnap_snap_t *s,
                       const cli_stacks_t *stk, int64_t dev) {
  uint32_t cap = 0, n = 0;
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device == dev)
      cap += s->segments[i].nblocks;
  vsite_t *v = calloc((size_t)cap + 1, sizeof *v);
  if (!v)
    return -1;
  int rc = 0;
  char buf[512];
  for (uint32_t i = 0; i < s->nsegments && rc == 0; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    uint64_t a = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      uint64_t ba = (b->keys & MSNAP_K_ADDRESS) ? b->address : a;
      a += b->size;
      if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
        continue;
      cli_site_format(s, cli_stacks_site(stk, dev, ba, b), buf, sizeof buf);
      v[n].text = strdup(buf);
      v[n].bytes = b->size;
      v[n].count = 1;
      if (!v[n].text) {
        rc = -1;
        break;
      }
      n++;
    }
  }
  uint32_t m = 0;
  if (rc == 0) {
    qsort(v, n, sizeof *v, cmp_vsite_text);
    for (uint32_t i = 0; i < n; i++) {
      if (m > 0 && !strcmp(v[m - 1].text, v[i].text)) {
        v[m - 1].bytes += v[i].bytes;
        v[m - 1].count++;
        free(v[i].text);
      } else {
        v[m++] = v[i];
      }
    }
    qsort(v, m, sizeof *v, cmp_vsite_bytes);
    cj_key(j, "sites");
    cj_arr(j);
    for (uint32_t i = 0; i < m && i < VIEW_SITES; i++) {
      cj_arr(j);
      cj_cstr(j, v[i].text);
      cj_u64(j, v[i].bytes);
      cj_u64(j, v[i].count);
      cj_arr_end(j);
    }
    cj_arr_end(j);
  } else {
    m = n;
  }
  for (uint32_t i = 0; i < m; i++)
    free(v[i].text);
  free(v);
  return rc;
}

static int write_html(FILE *f, const char *file, const msnap_snap_t *s) {
  remap_t m = {0};
  cli_stacks_t stk;
  bool have_stk = false;
  m.stack = calloc(s->nstacks + 1, sizeof *m.stack);
  m.frame = calloc(s->nframes + 1, sizeof *m.frame);
  m.stack_list = calloc(s->nstacks + 1, sizeof *m.stack_list);
  m.frame_list = calloc(s->nframes + 1, sizeof *m.frame_list);
  uint32_t nd = 0;
  int64_t *devs = cli_devices(s, &nd);
  int rc = -1;
  if (!m.stack || !m.frame || !m.stack_list || !m.frame_list ||
      (!devs && nd))
    goto out;
  fprintf(f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n"
             "<title>memsnap view</title>\n<style>%s</style></head>\n<body>\n"
             "<h1 id=\"title\"></h1>\n"
             "<div><select id=\"device\"></select> "
             "<span id=\"pos\"></span></div>\n"
             "<div id=\"notrace\" class=\"dim\" style=\"display:none\">This "
             "file holds no trace for this device: the layout is its final "
             "state.</div>\n"
             "<div id=\"tlegend\" class=\"legend\"></div>\n"
             "<canvas id=\"timeline\"></canvas>\n"
             "<input id=\"slider\" type=\"range\" min=\"0\" max=\"0\" "
             "value=\"0\" title=\"trace entry\">\n"
             "<div id=\"main\"><div id=\"left\">"
             "<h2>Segments <span id=\"layoutinfo\" class=\"dim\" "
             "style=\"font-weight:normal\"></span></h2>"
             "<div id=\"blegend\" class=\"legend\"></div>"
             "<div id=\"layoutbox\"><canvas id=\"layout\"></canvas></div>"
             "</div>\n"
             "<div id=\"right\"><div id=\"stack\" class=\"dim\">Click a block "
             "or the timeline to see a stack.</div>"
             "<div id=\"sitesbox\"><h2>Top allocation sites "
             "<span class=\"dim\" style=\"font-weight:normal\">(live bytes "
             "at the end of the file)</span></h2><table id=\"sites\">"
             "</table></div>"
             "<div id=\"settingsbox\"><h2>Allocator settings</h2>"
             "<div id=\"settings\"></div></div></div></div>\n"
             "<script>\nconst DATA = ",
          CSS);
  cli_json_t j;
  cj_init_html(&j, f);
  /* The device part first in a buffer would cost memory; instead the
   * stacks are assigned while writing devices and written last. */
  cj_obj(&j);
  cj_key(&j, "file");
  cj_cstr(&j, file);
  cj_key(&j, "generation");
  cj_cstr(&j, cli_generation_name(s->generation));
  if (s->top_keys & MSNAP_TOP_ALLOCATOR_SETTINGS) {
    /* As compact key=value text, formatted here: JSON numbers would lose
     * 64-bit values (trace_alloc_max_entries) in the browser. */
    uint32_t ni = 0;
    char **items = cli_settings_items(s, &s->allocator_settings, &ni);
    cj_key(&j, "settings");
    cj_arr(&j);
    for (uint32_t i = 0; i < ni; i++) {
      cj_cstr(&j, items[i]);
      free(items[i]);
    }
    cj_arr_end(&j);
    free(items);
  }
  if (cli_stacks_init(&stk, s) != 0)
    goto out;
  have_stk = true;
  cj_key(&j, "devices");
  cj_arr(&j);
  for (uint32_t d = 0; d < nd; d++) {
    int64_t dev = devs[d];
    cj_obj(&j);
    cj_key(&j, "device");
    cj_i64(&j, dev);
    if (write_sites(&j, s, &stk, dev) != 0)
      goto out;
    cj_key(&j, "segments");
    cj_arr(&j);
    for (uint32_t i = 0; i < s->nsegments; i++) {
      const msnap_ssegment_t *g = &s->segments[i];
      if (g->device != dev)
        continue;
      cj_arr(&j);
      cj_u64(&j, g->address);
      cj_u64(&j, g->total_size);
      cj_i64(&j, g->stream);
      cj_arr(&j);
      uint64_t ba = g->address;
      for (uint32_t k = 0; k < g->nblocks; k++) {
        const msnap_sblock_t *b = &s->blocks[g->first_block + k];
        if (b->keys & MSNAP_K_ADDRESS)
          ba = b->address;
        cli_stack_src_t src;
        msnap_stack_t bst = cli_stacks_block(&stk, dev, ba, b, &src);
        long ent = cli_block_active(b) ? cli_stacks_live_entry(&stk, dev, ba)
                                       : -1;
        cj_arr(&j);
        cj_u64(&j, ba);
        cj_u64(&j, b->size);
        cj_u64(&j, b->state <= 2 ? b->state : 3);
        cj_u64(&j, b->requested_size);
        cj_u64(&j, use_stack(&m, s, bst));
        /* The trace entry of its allocation, -1 when not in the trace, -2
         * when allocated before the first entry. */
        cj_i64(&j, ent >= 0 ? ent : src == CLI_SRC_BEFORE_TRACE ? -2 : -1);
        cj_arr_end(&j);
        ba += b->size;
      }
      cj_arr_end(&j);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    cli_state_t st;
    if (cli_backward(s, dev, NULL, NULL, &st) < 0)
      goto out;
    cj_key(&j, "start");
    cj_obj(&j);
    cj_key(&j, "segments");
    cj_arr(&j);
    for (uint32_t i = 0; i < st.ng; i++) {
      cj_arr(&j);
      cj_u64(&j, st.g[i].addr);
      cj_u64(&j, st.g[i].size);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    cj_key(&j, "blocks");
    cj_arr(&j);
    uint32_t nfin = 0, fi = 0;
    fblock_t *fin = final_blocks(s, dev, &nfin);
    if (!fin) {
      cli_state_free(&st);
      goto out;
    }
    for (uint32_t i = 0; i < st.nb; i++) {
      /* The stack of a block live since before the trace: the frames of
       * the final block at its address, if that block is the same
       * allocation (no alloc entry for it in the trace).  st.b and fin
       * are both sorted by address. */
      uint32_t stk_id = 0;
      const msnap_sblock_t *fb = NULL;
      while (fi < nfin && fin[fi].addr < st.b[i].addr)
        fi++;
      if (fi < nfin && fin[fi].addr == st.b[i].addr &&
          cli_stacks_live_entry(&stk, dev, st.b[i].addr) < 0)
        fb = fin[fi].b;
      if (fb)
        stk_id = use_stack(&m, s, cli_stacks_block(&stk, dev, st.b[i].addr,
                                                   fb, NULL));
      cj_arr(&j);
      cj_u64(&j, st.b[i].addr);
      cj_u64(&j, st.b[i].size ? st.b[i].size : st.b[i].requested);
      cj_u64(&j, st.b[i].requested ? st.b[i].requested : st.b[i].size);
      cj_u64(&j, stk_id);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    cj_obj_end(&j);
    free(fin);
    cli_state_free(&st);
    cj_key(&j, "events");
    cj_arr(&j);
    const msnap_trace_list_t *tl = cli_trace(s, dev);
    for (uint32_t i = 0; tl && i < tl->n; i++) {
      const msnap_strace_t *e = &tl->v[i];
      cj_arr(&j);
      cj_u64(&j, e->action);
      cj_u64(&j, e->addr);
      cj_u64(&j, e->size);
      cj_u64(&j, use_stack(&m, s, e->frames));
      if (e->keys & MSNAP_K_TIME)
        cj_i64(&j, e->time_us);
      else
        cj_null(&j);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    /* record_function annotations placed at the first entry at or after
     * their time (only when the trace has times). */
    cj_key(&j, "annotations");
    cj_arr(&j);
    for (uint32_t i = 0; tl && i < s->nannotations; i++) {
      const msnap_sannotation_t *an = &s->annotations[i];
      if (an->device != dev || tl->n == 0 ||
          !(tl->v[tl->n - 1].keys & MSNAP_K_TIME))
        continue;
      uint32_t lo = cli_entry_at_time(tl, an->time_us);
      size_t nl;
      const char *nm = cli_str(s, an->name, &nl);
      cj_arr(&j);
      cj_u64(&j, lo);
      cj_str(&j, nm, nl);
      cj_bool(&j, an->is_start != 0);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    cj_obj_end(&j);
  }
  cj_arr_end(&j);
  cj_key(&j, "frames");
  cj_arr(&j);
  for (uint32_t i = 0; i < m.nframe_list; i++) {
    const msnap_frame_t *fr = &s->frames[m.frame_list[i]];
    size_t l;
    const char *p;
    cj_arr(&j);
    p = cli_str(s, fr->name, &l);
    cj_str(&j, p, l);
    p = cli_str(s, fr->filename, &l);
    cj_str(&j, p, l);
    cj_i64(&j, fr->line);
    cj_arr_end(&j);
  }
  cj_arr_end(&j);
  cj_key(&j, "stacks");
  cj_arr(&j);
  cj_null(&j); /* index 0: no stack */
  for (uint32_t i = 0; i < m.nstack_list; i++) {
    uint32_t n;
    const uint32_t *fr = cli_stack(s, m.stack_list[i], &n);
    cj_arr(&j);
    for (uint32_t k = 0; k < n; k++)
      if (fr[k] < s->nframes)
        cj_u64(&j, m.frame[fr[k]] - 1);
    cj_arr_end(&j);
  }
  cj_arr_end(&j);
  cj_obj_end(&j);
  fprintf(f, ";\n%s</script>\n</body></html>\n", view_js);
  rc = 0;
out:
  if (have_stk)
    cli_stacks_free(&stk);
  free(m.stack);
  free(m.frame);
  free(m.stack_list);
  free(m.frame_list);
  free(devs);
  return rc;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap view [--json] FILE -o OUT.html\n"
          "\n"
          "Write one self-contained HTML file (no network access, plain\n"
          "JavaScript, the data inline) showing the active-memory timeline,\n"
          "the segment/block layout after any trace entry (slider, or click\n"
          "the timeline) and the stack of a clicked block or entry, the top\n"
          "allocation sites and the allocator settings.  Blocks whose own\n"
          "frames are empty show the stack of their alloc entry.\n"
          "\n"
          "Links: OUT.html#device=D&entry=N&block=0xADDR opens device D at\n"
          "entry N with the stack of the block at ADDR shown.\n"
          "\n"
          "  -o, --output OUT  the HTML file (required)\n"
          "  --json            print {output, bytes} on stdout\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n");
}

int cli_cmd_view(int argc, char **argv) {
  const char *out = NULL;
  bool json = false;
  const cli_cmd_t cmd = {"view", usage, NULL, 1, "expects exactly one FILE",
                         &json, &out, "-o OUT.html is required"};
  int first;
  msnap_snap_t *s;
  int brc = cli_begin(&cmd, argc, argv, &first, &s);
  if (brc != CLI_CONTINUE) return brc;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  int rc = CLI_OK;
  if (!f || write_html(f, argv[first], s) != 0) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
  }
  if (f)
    fclose(f);
  if (rc == CLI_OK && cli_write_file(out, buf, len) != 0)
    rc = CLI_UNUSABLE;
  free(buf);
  msnap__snap_free(s);
  if (rc == CLI_OK) {
    fprintf(stderr, "memsnap: wrote %s (%zu bytes)\n", out, len);
    if (json) {
      const cli_field_t fields[] = {{"output", out, 0},
                                    {"bytes", NULL, (int64_t)len}};
      cli_print_fields(fields, 2);
    }
  }
  return rc;
}
