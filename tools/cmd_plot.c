/*
 * cmd_plot.c -- `memsnap plot FILE -o OUT.svg`: the active-memory timeline
 * as a static SVG: active bytes (requested sizes of live allocations) and
 * reserved bytes after each trace entry, x = entry index as in MemoryViz.
 * Long traces are bucketed to at most 1600 columns keeping each bucket's
 * maximum, so peaks survive.  A file without a trace gets the final
 * figures as bars.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "msnap_internal.h"

#define W 960
#define H 420
#define ML 90
#define MR 20
#define MT 40
#define MB 50
#define MAXCOLS 1600

static void svg_text(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    default: fputc(*s, f);
    }
  }
}

/* Polyline of v[0..n) bucketed into at most MAXCOLS points. */
static void series(FILE *f, const uint64_t *v, uint32_t n, uint64_t ymax,
                   const char *color, double width) {
  uint32_t cols = n < MAXCOLS ? n : MAXCOLS;
  double pw = W - ML - MR, ph = H - MT - MB;
  fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
             "points=\"",
          color, width);
  for (uint32_t c = 0; c < cols; c++) {
    uint64_t lo = (uint64_t)c * n / cols, hi = (uint64_t)(c + 1) * n / cols;
    uint64_t m = 0;
    for (uint64_t i = lo; i < hi; i++)
      if (v[i] > m)
        m = v[i];
    double x = ML + (cols > 1 ? pw * c / (cols - 1) : pw / 2);
    double y = MT + ph - (ymax ? ph * (double)m / (double)ymax : 0);
    fprintf(f, "%.1f,%.1f ", x, y);
  }
  fputs("\"/>\n", f);
}

static int write_svg(FILE *f, const char *file, const msnap_snap_t *s,
                     int64_t dev) {
  uint64_t *act = NULL, *res = NULL;
  uint32_t n = 0;
  char b1[32], b2[64];
  if (cli_timeline(s, dev, &act, &res, &n) < 0)
    return -1;
  uint64_t ymax = 1;
  for (uint32_t i = 0; i < n; i++) {
    if (res[i] > ymax)
      ymax = res[i];
    if (act[i] > ymax)
      ymax = act[i];
  }
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
          "font-size=\"12\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\">Active memory "
             "timeline, device %" PRId64 ": ",
          ML, dev);
  svg_text(f, file);
  fputs("</text>\n", f);
  double ph = H - MT - MB;
  for (int t = 0; t <= 4; t++) {
    double y = MT + ph - ph * t / 4.0;
    fprintf(f,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#ddd\"/>\n<text x=\"%d\" y=\"%.1f\" "
            "text-anchor=\"end\">%s</text>\n",
            ML, W - MR, y, y, ML - 6, y + 4,
            cli_bytes((uint64_t)((double)ymax * t / 4.0), b1, sizeof b1));
  }
  if (n > 1) {
    series(f, res, n, ymax, "#999", 1.5);
    series(f, act, n, ymax, "#1f77b4", 2.0);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">trace entry "
            "(0 .. %u)</text>\n",
            ML + (W - ML - MR) / 2, H - 15, n - 1);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" fill=\"#1f77b4\">active (requested "
            "bytes)</text><text x=\"%d\" y=\"%d\" fill=\"#777\">reserved"
            "</text>\n",
            ML + 10, MT + 14, ML + 200, MT + 14);
  } else {
    /* No trace: bars of the final state. */
    uint64_t alloc = 0, reserved = 0;
    for (uint32_t i = 0; i < s->nsegments; i++) {
      const msnap_ssegment_t *g = &s->segments[i];
      if (g->device != dev)
        continue;
      reserved += g->total_size;
      for (uint32_t k = 0; k < g->nblocks; k++)
        if (s->blocks[g->first_block + k].state ==
            MSNAP_BLOCK_ACTIVE_ALLOCATED)
          alloc += s->blocks[g->first_block + k].size;
    }
    if (reserved > ymax)
      ymax = reserved;
    double hr = ph * (double)reserved / (double)ymax;
    double ha = ph * (double)alloc / (double)ymax;
    fprintf(f,
            "<rect x=\"%d\" y=\"%.1f\" width=\"120\" height=\"%.1f\" "
            "fill=\"#bbb\"/><rect x=\"%d\" y=\"%.1f\" width=\"120\" "
            "height=\"%.1f\" fill=\"#1f77b4\"/>\n",
            ML + 60, MT + ph - hr, hr, ML + 220, MT + ph - ha, ha);
    snprintf(b2, sizeof b2, "%s", cli_bytes(alloc, b1, sizeof b1));
    fprintf(f,
            "<text x=\"%d\" y=\"%d\">reserved %s</text><text x=\"%d\" "
            "y=\"%d\">allocated %s</text>\n<text x=\"%d\" y=\"%d\">(no "
            "trace in this file: final state only)</text>\n",
            ML + 60, H - 30, cli_bytes(reserved, b1, sizeof b1), ML + 220,
            H - 30, b2, ML + 400, MT + 40);
  }
  fputs("</svg>\n", f);
  free(act);
  free(res);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap plot [--device D] [--json] FILE -o OUT.svg\n"
          "\n"
          "Write the active-memory timeline of one device as a static SVG:\n"
          "active bytes (requested sizes of live allocations) and reserved\n"
          "bytes after each trace entry.  Without a trace the final state\n"
          "is drawn as bars.\n"
          "\n"
          "  -o, --output OUT  the SVG file (required)\n"
          "  --json            print {output, device, bytes} on stdout\n"
          "  --device D        device (default: the one with the longest\n"
          "                    trace)\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n");
}

int cli_cmd_plot(int argc, char **argv) {
  static const struct option opts[] = {
      {"output", required_argument, NULL, 'o'},
      {"device", required_argument, NULL, 'd'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *out = NULL;
  bool json = false;
  int64_t dev = -1;
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "ho:d:", opts, NULL)) != -1) {
    switch (o) {
    case 'o': out = optarg; break;
    case 'j': json = true; break;
    case 'd': {
      char *end;
      dev = strtoll(optarg, &end, 10);
      if (*end || dev < 0)
        return cli_usage_error("plot", "--device needs a number >= 0");
      break;
    }
    case 'h': usage(stdout); return CLI_OK;
    default: return cli_usage_error("plot", NULL);
    }
  }
  if (optind + 1 != argc)
    return cli_usage_error("plot", "expects exactly one FILE");
  if (!out)
    return cli_usage_error("plot", "-o OUT.svg is required");
  msnap_snap_t *s;
  if (cli_load(argv[optind], &s) != CLI_OK)
    return CLI_UNUSABLE;
  if (dev < 0)
    dev = cli_default_device(s);
  msnap_membuf_t mb = {0};
  FILE *f = open_memstream(&mb.data, &mb.len);
  int rc = CLI_OK;
  if (!f || write_svg(f, argv[optind], s, dev) != 0) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
  }
  if (f)
    fclose(f);
  if (rc == CLI_OK && cli_write_file(out, mb.data, mb.len) != 0)
    rc = CLI_UNUSABLE;
  msnap__snap_free(s);
  if (rc == CLI_OK) {
    fprintf(stderr, "memsnap: wrote %s\n", out);
    if (json) {
      cli_json_t j;
      cj_init(&j, stdout);
      cj_obj(&j);
      cj_key(&j, "output");
      cj_cstr(&j, out);
      cj_key(&j, "device");
      cj_i64(&j, dev);
      cj_key(&j, "bytes");
      cj_u64(&j, mb.len);
      cj_obj_end(&j);
      cj_end(&j);
    }
  }
  free(mb.data);
  return rc;
}
