/*
 * cmd_view.c -- `memsnap view FILE -o OUT.html`: one self-contained HTML
 * file (no network, vanilla JavaScript from view.js, data inline) with the
 * active-memory timeline, the segment/block layout at a chosen entry and
 * the stacks on click.
 *
 * The data is a compact JSON object DATA (see view.js): frames and stacks
 * are written once each (only those referenced) and referred to by index;
 * per device the final segments with their blocks, the start state of the
 * trace (backward replay), the trace entries as
 * [action, addr, size, stack, time_us|null] and the record_function
 * annotations as [entry index, name, is_start].  Strings are escaped so that
 * "</script>" cannot occur inside the data.
 */
#include <getopt.h>
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
    "#main{display:flex;gap:12px}#left{flex:3;min-width:0}"
    "#right{flex:2;min-width:0;max-height:80vh;overflow:auto;"
    "border-left:1px solid #ddd;padding-left:10px}"
    "#layoutbox{max-height:60vh;overflow:auto;border:1px solid #ddd}"
    ".dim{color:#888}li.sys{color:#888}li.user{font-weight:bold}"
    "ol{padding-left:22px;font-family:monospace;font-size:12px}"
    "#slider{width:100%}pre{font-size:11px;white-space:pre-wrap}";

static int write_html(FILE *f, const char *file, const msnap_snap_t *s) {
  remap_t m = {0};
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
             "<canvas id=\"timeline\"></canvas>\n"
             "<input id=\"slider\" type=\"range\" min=\"0\" max=\"0\" "
             "value=\"0\">\n"
             "<div id=\"main\"><div id=\"left\"><div id=\"layoutinfo\" "
             "class=\"dim\"></div><div id=\"layoutbox\"><canvas "
             "id=\"layout\"></canvas></div></div>\n"
             "<div id=\"right\"><div id=\"stack\" class=\"dim\">Click a block "
             "or the timeline to see a stack.</div><pre "
             "id=\"settings\"></pre></div></div>\n"
             "<script>\nconst DATA = ",
          CSS);
  cli_json_t j;
  cj_init(&j, f);
  j.compact = true;
  j.html = true;
  /* The device part first in a buffer would cost memory; instead the
   * stacks are assigned while writing devices and written last. */
  cj_obj(&j);
  cj_key(&j, "file");
  cj_cstr(&j, file);
  cj_key(&j, "generation");
  cj_cstr(&j, cli_generation_name(s->generation));
  if (s->top_keys & MSNAP_TOP_ALLOCATOR_SETTINGS) {
    cj_key(&j, "settings");
    cj_gv(&j, s, &s->allocator_settings);
  }
  cj_key(&j, "devices");
  cj_arr(&j);
  for (uint32_t d = 0; d < nd; d++) {
    int64_t dev = devs[d];
    cj_obj(&j);
    cj_key(&j, "device");
    cj_i64(&j, dev);
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
      for (uint32_t k = 0; k < g->nblocks; k++) {
        const msnap_sblock_t *b = &s->blocks[g->first_block + k];
        cj_arr(&j);
        cj_u64(&j, cli_block_addr(s, g, k));
        cj_u64(&j, b->size);
        cj_u64(&j, b->state <= 2 ? b->state : 3);
        cj_u64(&j, b->requested_size);
        cj_u64(&j, use_stack(&m, s, cli_block_stack(s, b)));
        cj_arr_end(&j);
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
    for (uint32_t i = 0; i < st.nb; i++) {
      /* The stack of a block live since before the trace: its final
       * block's frames (found by address in the final segments). */
      uint32_t stk = 0;
      for (uint32_t gi = 0; gi < s->nsegments && !stk; gi++) {
        const msnap_ssegment_t *g = &s->segments[gi];
        if (g->device != dev || st.b[i].addr < g->address ||
            st.b[i].addr >= g->address + g->total_size)
          continue;
        for (uint32_t k = 0; k < g->nblocks; k++)
          if (cli_block_addr(s, g, k) == st.b[i].addr) {
            stk = use_stack(&m, s,
                            cli_block_stack(s, &s->blocks[g->first_block + k]));
            break;
          }
      }
      cj_arr(&j);
      cj_u64(&j, st.b[i].addr);
      cj_u64(&j, st.b[i].size ? st.b[i].size : st.b[i].requested);
      cj_u64(&j, st.b[i].requested ? st.b[i].requested : st.b[i].size);
      cj_u64(&j, stk);
      cj_arr_end(&j);
    }
    cj_arr_end(&j);
    cj_obj_end(&j);
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
      uint32_t lo = 0, hi = tl->n;
      while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (tl->v[mid].time_us < an->time_us)
          lo = mid + 1;
        else
          hi = mid;
      }
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
          "the timeline) and the stack of a clicked block or entry.\n"
          "\n"
          "  -o, --output OUT  the HTML file (required)\n"
          "  --json            print {output, bytes} on stdout\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n");
}

int cli_cmd_view(int argc, char **argv) {
  static const struct option opts[] = {
      {"output", required_argument, NULL, 'o'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *out = NULL;
  bool json = false;
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
    switch (o) {
    case 'o': out = optarg; break;
    case 'j': json = true; break;
    case 'h': usage(stdout); return CLI_OK;
    default: return cli_usage_error("view", NULL);
    }
  }
  if (optind + 1 != argc)
    return cli_usage_error("view", "expects exactly one FILE");
  if (!out)
    return cli_usage_error("view", "-o OUT.html is required");
  msnap_snap_t *s;
  if (cli_load(argv[optind], &s) != CLI_OK)
    return CLI_UNUSABLE;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  int rc = CLI_OK;
  if (!f || write_html(f, argv[optind], s) != 0) {
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
      cli_json_t j;
      cj_init(&j, stdout);
      cj_obj(&j);
      cj_key(&j, "output");
      cj_cstr(&j, out);
      cj_key(&j, "bytes");
      cj_u64(&j, len);
      cj_obj_end(&j);
      cj_end(&j);
    }
  }
  return rc;
}
