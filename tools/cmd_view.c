/*
 * cmd_view.c -- `memsnap view FILE [FILE2] -o OUT.html`: one
 * self-contained HTML file (no network; the viewer view.js and the data
 * inline) with PyTorch memory_viz's three views (Active Memory Timeline,
 * Allocator State History, Active Cached Segment Timeline) and what it
 * lacks: OOM markers and their explanation, annotation lanes, leak
 * highlighting over repeated steps, a comparison of two files, and level
 * of detail: the data is pre-aggregated here (view_model.c) and cut to a
 * byte budget, so the page of a gigabyte snapshot stays a few percent of
 * its size.  The page's data is `const DATA = {files: [...]}`, one object
 * per input as view_model.c describes; strings are escaped so that
 * "</script>" cannot occur inside it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "view_js.h"
#include "view_model.h"

#define VIEW_MIN_BUDGET (8ull << 20)
#define VIEW_MAX_BUDGET (64ull << 20)
#define VIEW_DETAIL 20000u
#define VIEW_MAX_DETAIL 2000000u

static const char *CSS =
    "body{font:13px sans-serif;margin:10px;color:#222}"
    "h1{font-size:15px;margin:2px 0 6px}h2{font-size:13px;margin:10px 0 4px}"
    "#bar{display:flex;flex-wrap:wrap;gap:6px;align-items:center;"
    "margin-bottom:6px}#bar button.tab{border:1px solid #bbb;background:#f4f4f4;"
    "padding:3px 9px;cursor:pointer;border-radius:3px}"
    "#bar button.tab.on{background:#1f77b4;color:#fff;border-color:#1f77b4}"
    ".dim{color:#777}.warn{color:#b35900}.bad{color:#c00}"
    "#lodnote{font-size:12px;margin:2px 0}"
    ".legend{margin:3px 0;font-size:12px;color:#333}"
    ".legend span.sw{display:inline-block;width:14px;height:10px;"
    "margin:0 4px 0 12px;vertical-align:baseline}"
    ".legend span.sw:first-child{margin-left:0}"
    "#main{display:flex;gap:10px}#left{flex:3;min-width:0}"
    "#right{flex:2;min-width:0;max-height:88vh;overflow:auto;"
    "border-left:1px solid #ddd;padding-left:10px}"
    "canvas{display:block}#plot{cursor:crosshair}#mini{cursor:ew-resize}"
    "#zoominfo{font-size:12px;color:#555}"
    "#hist{display:flex;gap:10px}#evlist{flex:0 0 470px;height:62vh;"
    "overflow:auto;border:1px solid #ddd;font:12px monospace;"
    "position:relative;outline:none}#evlist:focus{border-color:#1f77b4}"
    "#evlist div.row{position:absolute;left:0;right:0;height:18px;"
    "line-height:18px;white-space:pre;padding-left:4px;cursor:pointer}"
    "#evlist div.row.sel{background:#edc949}#evlist div.row.gap{color:#888;"
    "background:#f3f3f3;font-style:italic}#evlist div.row.oom{color:#c00;"
    "font-weight:bold}#layoutbox{flex:3;min-width:0;height:62vh;overflow:auto;"
    "border:1px solid #ddd}"
    "#info{white-space:pre-wrap;font-size:12px}"
    "ol{padding-left:22px;font-family:monospace;font-size:12px;margin:4px 0}"
    "ol ol{padding-left:14px}summary{cursor:pointer;color:#777}"
    "li.sys{color:#888}li.user{font-weight:bold}"
    "table{border-collapse:collapse;font-size:12px}"
    "td,th{padding:1px 6px;vertical-align:top;text-align:left}"
    "td.n,th.n{text-align:right;white-space:nowrap}"
    "td.site{font-family:monospace;overflow-wrap:anywhere}"
    "tr.clk{cursor:pointer}tr.clk:hover{background:#f0f6ff}"
    "#settings{font-family:monospace;font-size:11px;line-height:1.6}"
    "#settings span{white-space:nowrap;margin-right:10px}"
    "#oombox div.oom{border-left:3px solid #c00;padding:2px 6px;"
    "margin:4px 0;cursor:pointer}";

/* The page: the markup, DATA (one object per file), view.js.  0, or -1 on
 * ENOMEM. */
#define HTML_HEAD                                                            \
  "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n"                   \
  "<title>memsnap view</title>\n<style>%s</style></head>\n<body>\n"         \
  "<h1 id=\"title\"></h1>\n<div id=\"app\"></div>\n"                        \
  "<script>\nconst DATA = {\"files\":["
#define HTML_TAIL_A "]};\n"
#define HTML_TAIL_B "</script>\n</body></html>\n"

/* The page: the markup, DATA (one object per file), view.js.  The budget
 * bounds the page less view.js: each file's object gets the budget less
 * its share of the markup.  0, or -1 on ENOMEM. */
static int write_html(FILE *f, char **paths, msnap_snap_t **snaps, int n,
                      const vm_opts_t *o, vm_stats_t *st) {
  vm_opts_t fo = *o;
  uint64_t markup = (uint64_t)snprintf(NULL, 0, HTML_HEAD, CSS) +
                    strlen(HTML_TAIL_A) + strlen(HTML_TAIL_B) +
                    (uint64_t)(n - 1);
  fo.overhead = (markup + (uint64_t)n - 1) / (uint64_t)n;
  fprintf(f, HTML_HEAD, CSS);
  for (int i = 0; i < n; i++) {
    cli_json_t j;
    cj_init_html(&j, f);
    if (i)
      fputc(',', f);
    if (vm_write_file(&j, paths[i], snaps[i], &fo, &st[i]) != 0)
      return -1;
  }
  fprintf(f, HTML_TAIL_A "%s" HTML_TAIL_B, view_js);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap view [--json] [--budget BYTES] [--detail N] "
          "[--step NAME]\n"
          "                    FILE [FILE2] -o OUT.html\n"
          "\n"
          "Write one self-contained HTML file (no network access; the viewer\n"
          "and the data inline) with PyTorch memory_viz's views of FILE:\n"
          "  Active Memory Timeline   every allocation as a band, stacked;\n"
          "                           hover for size, stack and lifetime\n"
          "  Allocator State History  the trace entries (arrow keys step)\n"
          "                           and the segments/blocks after each\n"
          "  Active Cached Segment Timeline  segments as bands\n"
          "plus OOM markers with their explanation, record_function lanes,\n"
          "the sites of `memsnap leaks` (growing step after step), zoom (wheel,\n"
          "drag, the overview's brush) and, with FILE2, a comparison.\n"
          "Entries are numbered from 0 as in the file's device_traces.\n"
          "\n"
          "Level of detail: the page holds at most BYTES of data per file\n"
          "(more only when the series and final state alone need it): the\n"
          "memory series (exact up to 32768 entries, else the maximum per\n"
          "bucket), the final state, and as many of N allocations as bands\n"
          "(those live at the peak, then those covering the most of the\n"
          "timeline; the others summed in one band) and of the\n"
          "trace entries, in runs of 4096 (OOMs, the end, the peaks first),\n"
          "as fit; a larger BYTES never keeps less.\n"
          "\n"
          "Links: OUT.html#device=D&entry=N&block=0xADDR&view=history opens\n"
          "device D after entry N with the stack of the block at ADDR.\n"
          "\n"
          "  -o, --output OUT   the HTML file (required)\n"
          "  --budget BYTES     data per file (K/M/G suffixes); default the\n"
          "                     input's size / 16, at least 8M, at most 64M\n"
          "  --detail N         allocations drawn one by one per timeline\n"
          "                     (default %u)\n"
          "  --step NAME        the annotation that marks one step (default:\n"
          "                     the most repeated one; trailing digits ignored)\n"
          "  --json             print {output, output_error, bytes (the\n"
          "                     page's size), budget, data_bytes (the page\n"
          "                     less the viewer's code), files: [{file,\n"
          "                     input_bytes, data_bytes (the file's\n"
          "                     object), entries, embedded_entries,\n"
          "                     allocations, bands, ooms, leak_sites}]}\n"
          "                     on stdout\n"
          "  -h, --help         this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n",
          VIEW_DETAIL);
}

int cli_cmd_view(int argc, char **argv) {
  const char *out = NULL, *budget_arg = NULL;
  bool json = false;
  long detail = VIEW_DETAIL;
  uint64_t budget = 0;
  vm_opts_t vo = {0, VIEW_DETAIL, NULL, 0};
  const cli_opt_t opts[] = {
      CLI_STRING("budget", 0, &budget_arg),
      CLI_LONG("detail", 0, &detail, 1, (long)VIEW_MAX_DETAIL,
               "--detail expects 1..2000000"),
      CLI_STRING("step", 0, &vo.step), CLI_OPT_END};
  const cli_cmd_t cmd = {"view", usage, opts, -1,
                         "expects one FILE, or two to compare", &json, &out,
                         "-o OUT.html is required", false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE)
    return brc;
  int nf = argc - first;
  if (nf > 2)
    return cli_usage_error("view", "expects one FILE, or two to compare");
  if (budget_arg != NULL &&
      (!msnap__parse_size(budget_arg, &budget) || budget == 0 ||
       budget == UINT64_MAX))
    return cli_usage_error("view", "--budget expects a size in bytes "
                                   "(e.g. 64M)");
  if (vo.step != NULL && vo.step[0] == '\0')
    return cli_usage_error("view", "--step expects a record_function name");
  vo.detail = (uint32_t)detail;
  msnap_snap_t *snaps[2] = {NULL, NULL};
  vm_stats_t st[2];
  uint64_t insize[2] = {0, 0};
  int rc = CLI_OK;
  for (int i = 0; i < nf && rc == CLI_OK; i++) {
    struct stat sb;
    if (stat(argv[first + i], &sb) == 0)
      insize[i] = (uint64_t)sb.st_size;
    if (cli_load(argv[first + i], &snaps[i]) != CLI_OK) {
      /* --json: one document, naming the first FILE that failed (each
       * failure has its line on stderr) */
      if (json && rc == CLI_OK)
        cli_json_unusable(argv[first + i], NULL);
      rc = CLI_UNUSABLE;
    }
  }
  char *buf = NULL;
  size_t len = 0;
  if (rc == CLI_OK) {
    uint64_t in = insize[0] > insize[1] ? insize[0] : insize[1];
    vo.budget = budget ? budget : in / 16;
    if (!budget && vo.budget < VIEW_MIN_BUDGET)
      vo.budget = VIEW_MIN_BUDGET;
    if (!budget && vo.budget > VIEW_MAX_BUDGET)
      vo.budget = VIEW_MAX_BUDGET;
    FILE *f = open_memstream(&buf, &len);
    if (!f || write_html(f, argv + first, snaps, nf, &vo, st) != 0) {
      cli_err("out of memory");
      rc = CLI_UNUSABLE;
    }
    if (f)
      fclose(f);
  }
  /* The page was made: the report is printed whether or not it could be
   * written ("output": null and "output_error" when not). */
  bool made = rc == CLI_OK, wrote = false;
  if (made) {
    wrote = cli_write_file(out, buf, len) == 0;
    if (!wrote)
      rc = CLI_UNUSABLE;
  }
  free(buf);
  for (int i = 0; i < nf; i++)
    if (snaps[i])
      msnap__snap_free(snaps[i]);
  /* the page less the viewer's code: what the budget bounds */
  size_t code = sizeof view_js - 1;
  uint64_t data = len > code ? (uint64_t)(len - code) : 0;
  if (made) {
    if (wrote)
      fprintf(stderr, "memsnap: wrote %s (%zu bytes)\n",
              cli_output_shown(out), len);
    for (int i = 0; i < nf; i++)
      if (st[i].step_why[0])
        cli_err("note: --step: %s in %s: the leaks panel has no steps",
                st[i].step_why, argv[first + i]);
    /* the default budget as an explicit one; each file's object against
     * it (two files: one may be over while the average is not) */
    int over = -1;
    for (int i = 0; i < nf; i++)
      if (st[i].estimate > vo.budget &&
          (over < 0 || st[i].estimate > st[over].estimate))
        over = i;
    if (over >= 0)
      cli_err("note: the page holds %" PRIu64 " bytes of data for %s, more "
              "than --budget %" PRIu64 "%s per file: the final state, the "
              "memory series and the stacks of what is shown go in whatever "
              "the budget",
              st[over].estimate, cli_shown(argv[first + over]), vo.budget,
              budget ? "" : " (the default)");
    else if (over >= 0 || data / (uint64_t)nf > vo.budget)
      cli_err("note: the page holds %" PRIu64 " bytes of data, more than "
              "--budget %" PRIu64 "%s per file: the final state, the memory "
              "series and the stacks of what is shown go in whatever the "
              "budget",
              data, vo.budget, budget ? "" : " (the default)");
    if (json) {
      cli_json_t j;
      cj_init(&j, stdout);
      cj_obj(&j);
      cj_output(&j, wrote ? out : NULL);
      cj_key(&j, "bytes");
      cj_u64(&j, len);
      cj_key(&j, "budget");
      cj_u64(&j, vo.budget);
      cj_key(&j, "data_bytes");
      cj_u64(&j, data);
      cj_key(&j, "files");
      cj_arr(&j);
      for (int i = 0; i < nf; i++) {
        cj_obj(&j);
        cj_key(&j, "file");
        cj_cstr(&j, argv[first + i]);
        cj_key(&j, "input_bytes");
        cj_u64(&j, insize[i]);
        cj_key(&j, "entries");
        cj_u64(&j, st[i].entries);
        cj_key(&j, "data_bytes");
        cj_u64(&j, st[i].estimate);
        cj_key(&j, "embedded_entries");
        cj_u64(&j, st[i].embedded);
        cj_key(&j, "allocations");
        cj_u64(&j, st[i].allocations);
        cj_key(&j, "bands");
        cj_u64(&j, st[i].bands);
        cj_key(&j, "ooms");
        cj_u64(&j, st[i].ooms);
        cj_key(&j, "leak_sites");
        cj_u64(&j, st[i].leak_sites);
        cj_obj_end(&j);
      }
      cj_arr_end(&j);
      cj_obj_end(&j);
      cj_end(&j);
    }
  }
  return rc;
}
