/*
 * cmd_plot.c -- `memsnap plot FILE -o OUT.svg`: the active-memory timeline
 * as a static SVG: active bytes (requested sizes of live allocations) and
 * reserved bytes after each trace entry, x = entry index as in MemoryViz.
 * Long traces are bucketed to at most 1600 columns keeping each bucket's
 * maximum, so peaks survive.  A file without a trace gets the final
 * figures as bars.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/sink.h"

#define W 960
#define H 440
#define ML 80
#define MR 24
#define MT 58
#define MB 52
#define MAXCOLS 1600
#define MAXANN 40

/* Text of an SVG element: XML's special characters escaped, control
 * bytes and U+FFFE / U+FFFF (not allowed in XML 1.0) as '?', and what is
 * not UTF-8 repaired
 * (base/utf8.c: one U+FFFD per ill-formed part, as JSON and the model
 * do), so that the file always parses -- a file name is any bytes. */
static void svg_textn(FILE *f, const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    if (c >= 0x80) {
      size_t bad = 1, k = msnap__utf8_seq(p + i, n - i, &bad);
      if (k == 3 && p[i] == 0xef && p[i + 1] == 0xbf && p[i + 2] >= 0xbe) {
        fputc('?', f); /* U+FFFE, U+FFFF: no XML 1.0 Char */
        i += k;
      } else if (k) {
        fwrite(p + i, 1, k, f);
        i += k;
      } else {
        fputs("\xef\xbf\xbd", f);
        i += bad;
      }
      continue;
    }
    switch (c) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    default: fputc(c < 0x20 || c == 0x7f ? '?' : c, f);
    }
    i++;
  }
}

static void svg_text(FILE *f, const char *s) { svg_textn(f, s, strlen(s)); }

typedef struct plot_s {
  uint32_t n;     /* points (entries + 1) */
  uint64_t ymax;  /* top of the y axis    */
  double pw, ph;  /* plot area            */
} plot_t;

static double px(const plot_t *p, double k) {
  return ML + (p->n > 1 ? p->pw * k / (p->n - 1) : p->pw / 2);
}

static double py(const plot_t *p, uint64_t v) {
  return MT + p->ph - p->ph * (double)v / (double)p->ymax;
}

/* v[0..n) bucketed into at most MAXCOLS points (each bucket's maximum,
 * so peaks survive): a polyline, or with `fill` a polygon down to 0. */
static void series(FILE *f, const plot_t *p, const uint64_t *v,
                   const char *color, double width, bool fill) {
  uint32_t n = p->n, cols = n < MAXCOLS ? n : MAXCOLS;
  if (fill)
    fprintf(f, "<polygon fill=\"%s\" stroke=\"none\" points=\"%.1f,%.1f ",
            color, px(p, 0), py(p, 0));
  else
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" "
               "stroke-linejoin=\"round\" points=\"",
            color, width);
  for (uint32_t c = 0; c < cols; c++) {
    uint64_t lo = (uint64_t)c * n / cols, hi = (uint64_t)(c + 1) * n / cols;
    uint64_t m = 0;
    for (uint64_t i = lo; i < hi; i++)
      if (v[i] > m)
        m = v[i];
    double x = cols > 1 ? ML + p->pw * c / (cols - 1) : px(p, 0);
    fprintf(f, "%.1f,%.1f ", x, py(p, m));
  }
  if (fill)
    fprintf(f, "%.1f,%.1f", px(p, n - 1), py(p, 0));
  fputs("\"/>\n", f);
}

/* The legend row under the title: swatch + label items from left. */
static double legend_item(FILE *f, double x, const char *kind,
                          const char *color, const char *label) {
  double y = 40;
  if (!strcmp(kind, "area"))
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"10\" "
               "fill=\"%s\"/>\n", x, y - 9, color);
  else if (!strcmp(kind, "dash"))
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
               "stroke=\"%s\" stroke-dasharray=\"3,3\"/>\n",
            x + 7, x + 7, y - 11, y + 2, color);
  else if (!strcmp(kind, "dot"))
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n",
            x + 7, y - 4, color);
  else
    fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" "
               "stroke=\"%s\" stroke-width=\"2\"/>\n",
            x, x + 14, y - 4, y - 4, color);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 19, y, label);
  return x + 19 + 6.1 * (double)strlen(label) + 16;
}

static int write_svg(FILE *f, const char *file, const msnap_snap_t *s,
                     int64_t dev) {
  uint64_t *act = NULL, *res = NULL;
  uint32_t n = 0;
  char b1[32], b2[96];
  if (cli_timeline(s, dev, &act, &res, &n) < 0)
    return -1;
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  uint64_t top = 1;
  uint32_t peak_at = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (res[i] > top)
      top = res[i];
    if (act[i] > top)
      top = act[i];
    if (act[i] > act[peak_at])
      peak_at = i;
  }
  if (n <= 1) {
    /* No trace: the final state as bars. */
    for (uint32_t i = 0; i < s->nsegments; i++)
      if (s->segments[i].device == dev && s->segments[i].total_size > top)
        top += s->segments[i].total_size;
  }
  uint64_t ystep = cli_nice_step(top, true, 9);
  plot_t p = {.n = n, .pw = W - ML - MR, .ph = H - MT - MB};
  p.ymax = ystep >= top ? ystep : (top + ystep - 1) / ystep * ystep;
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  fprintf(f,
          "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
          "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" "
          "font-size=\"12\">\n"
          "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%d\" y=\"20\" font-size=\"15\" "
             "font-weight=\"bold\">Memory timeline, device %" PRId64
             "</text>\n<text x=\"%d\" y=\"20\" text-anchor=\"end\" "
             "fill=\"#666\">",
          ML, dev, W - MR);
  svg_text(f, base);
  fputs("</text>\n", f);
  /* Horizontal grid and y labels. */
  for (uint64_t v = 0; v <= p.ymax; v += ystep) {
    double y = py(&p, v);
    fprintf(f,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"%s\"/>\n<text x=\"%d\" y=\"%.1f\" "
            "text-anchor=\"end\">%s</text>\n",
            ML, W - MR, y, y, v ? "#e6e6e6" : "#999", ML - 6, y + 4,
            cli_bytes_tick(v, b1, sizeof b1));
    if (v > UINT64_MAX - ystep)
      break;
  }
  if (n > 1) {
    /* Vertical grid and x labels (entry index). */
    uint64_t xstep = cli_nice_step(n - 1, false, 8);
    for (uint64_t k = 0; k <= n - 1; k += xstep) {
      double x = px(&p, (double)k);
      fprintf(f,
              "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
              "stroke=\"#999\"/>\n<text x=\"%.1f\" y=\"%d\" "
              "text-anchor=\"middle\">%" PRIu64 "</text>\n",
              x, x, H - MB, H - MB + 5, x, H - MB + 18, k);
    }
    const char *unit = "";
    char span[96] = "";
    if (tl && tl->n && (msnap__tattr(s, &tl->v[0])->keys & MSNAP_K_TIME) &&
        (msnap__tattr(s, &tl->v[tl->n - 1])->keys & MSNAP_K_TIME)) {
      char d[32];
      snprintf(span, sizeof span, " over %s",
               cli_duration(tl->v[tl->n - 1].time_us - tl->v[0].time_us, d,
                            sizeof d));
      unit = span;
    }
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">"
            "trace entries done (%u %s%s)</text>\n",
            ML + (W - ML - MR) / 2, H - 12, n - 1,
            cli_plural(n - 1, "entry", "entries"), unit);
    /* record_function ranges: a dashed line at each START. */
    uint32_t shown = 0;
    for (uint32_t i = 0; tl && i < s->nannotations && shown < MAXANN; i++) {
      const msnap_sannotation_t *an = &s->annotations[i];
      if (an->device != dev || !an->is_start ||
          !(msnap__tattr(s, &tl->v[tl->n - 1])->keys & MSNAP_K_TIME))
        continue;
      uint32_t at = cli_entry_at_time(tl, an->time_us);
      double x = px(&p, at);
      size_t nl;
      const char *nm = cli_str(s, an->name, &nl);
      fprintf(f,
              "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
              "stroke=\"#9467bd\" stroke-opacity=\"0.6\" "
              "stroke-dasharray=\"3,3\"/>\n<text x=\"%.1f\" y=\"%u\" "
              "font-size=\"10\" fill=\"#7b4fa8\">",
              x, x, MT, H - MB, x + 3, MT + 10 + 11 * (shown % 3));
      svg_textn(f, nm, msnap__utf8_cut((const unsigned char *)nm, nl, 40));
      fputs("</text>\n", f);
      shown++;
    }
    series(f, &p, act, "#9ec5e3", 0, true);
    series(f, &p, act, "#1f77b4", 1.2, false);
    series(f, &p, res, "#666", 1.5, false);
    /* The peak of active memory: a dot, its figure in the legend. */
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n",
            px(&p, peak_at), py(&p, act[peak_at]));
    double lx = ML;
    lx = legend_item(f, lx, "area", "#9ec5e3",
                     "active (requested bytes of live allocations)");
    lx = legend_item(f, lx, "line", "#666", "reserved (segments)");
    if (shown)
      lx = legend_item(f, lx, "dash", "#9467bd", "record_function");
    /* x = k is the state after k entries: after entry k - 1 (entries
     * are numbered from 0, as everywhere) */
    if (peak_at == 0)
      snprintf(b2, sizeof b2, "peak active %s before the first entry",
               cli_bytes(act[peak_at], b1, sizeof b1));
    else
      snprintf(b2, sizeof b2, "peak active %s after entry %u",
               cli_bytes(act[peak_at], b1, sizeof b1), peak_at - 1);
    legend_item(f, lx, "dot", "#d62728", b2);
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
    double hr = p.ph * (double)reserved / (double)p.ymax;
    double ha = p.ph * (double)alloc / (double)p.ymax;
    fprintf(f,
            "<rect x=\"%d\" y=\"%.1f\" width=\"120\" height=\"%.1f\" "
            "fill=\"#bbb\"/><rect x=\"%d\" y=\"%.1f\" width=\"120\" "
            "height=\"%.1f\" fill=\"#1f77b4\"/>\n",
            ML + 60, MT + p.ph - hr, hr, ML + 220, MT + p.ph - ha, ha);
    snprintf(b2, sizeof b2, "%s", cli_bytes(alloc, b1, sizeof b1));
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">reserved %s"
            "</text><text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
            "allocated %s</text>\n<text x=\"%d\" y=\"40\" fill=\"#666\">"
            "No trace for this device in the file: its final state "
            "only.</text>\n",
            ML + 120, H - MB + 18, cli_bytes(reserved, b1, sizeof b1),
            ML + 280, H - MB + 18, b2, ML);
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
          "  --json            print {output, output_error, device, bytes}\n"
          "                    on stdout\n"
          "  --device D        device (default: the one with the longest\n"
          "                    trace)\n"
          "  -h, --help        this text\n"
          "\nExit status: 0 ok, 2 unusable input or write error.\n");
}

/* Whether dev has a segment or a non-empty trace in s. */
static bool has_device(const msnap_snap_t *s, int64_t dev) {
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device == dev)
      return true;
  return dev >= 0 && (uint64_t)dev < s->ndevices &&
         s->device_traces[dev].n > 0;
}

/* "0, 1" -- the devices of s (segments or trace entries), or "none". */
static void device_list(const msnap_snap_t *s, char *out, size_t cap) {
  size_t used = 0;
  out[0] = 0;
  int64_t top = (int64_t)s->ndevices;
  for (uint32_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device >= top && s->segments[i].device < (1 << 16))
      top = s->segments[i].device + 1;
  for (int64_t d = 0; d < top; d++) {
    if (!has_device(s, d))
      continue;
    int n = snprintf(out + used, cap - used, "%s%" PRId64, used ? ", " : "",
                     d);
    if (n < 0 || (size_t)n >= cap - used)
      break;
    used += (size_t)n;
  }
  if (!used)
    snprintf(out, cap, "none");
}

int cli_cmd_plot(int argc, char **argv) {
  const char *out = NULL;
  bool json = false;
  long devarg = -1;
  const cli_opt_t opts[] = {CLI_LONG("device", 'd', &devarg, 0, LONG_MAX,
                                     "--device needs a number >= 0"),
                            CLI_OPT_END};
  /* (the timeline needs no stacks: the file's are not read) */
  const cli_cmd_t cmd = {"plot", usage, opts, 1, "expects exactly one FILE",
                         &json, &out, "-o OUT.svg is required", true};
  int first;
  msnap_snap_t *s;
  int brc = cli_begin(&cmd, argc, argv, &first, &s);
  if (brc != CLI_CONTINUE) return brc;
  int64_t dev = devarg;
  if (dev < 0) {
    dev = cli_default_device(s);
  } else if (!has_device(s, dev)) {
    char list[256];
    device_list(s, list, sizeof list);
    fprintf(stderr, "memsnap plot: %s has no device %" PRId64
            " (devices in the file: %s)\n", cli_shown(argv[first]), dev, list);
    msnap__snap_free(s);
    return CLI_UNUSABLE;
  }
  msnap_membuf_t mb = {0};
  FILE *f = open_memstream(&mb.data, &mb.len);
  int rc = CLI_OK;
  if (!f || write_svg(f, argv[first], s, dev) != 0) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
  }
  if (f)
    fclose(f);
  bool made = rc == CLI_OK, wrote = false;
  if (made) {
    wrote = cli_write_file(out, mb.data, mb.len) == 0;
    if (!wrote)
      rc = CLI_UNUSABLE;
  }
  msnap__snap_free(s);
  if (wrote)
    fprintf(stderr, "memsnap: wrote %s\n", cli_output_shown(out));
  if (made && json) {
    cli_json_t j;
    cj_init(&j, stdout);
    cj_obj(&j);
    cj_output(&j, wrote ? out : NULL);
    cj_key(&j, "device");
    cj_i64(&j, dev);
    cj_key(&j, "bytes");
    cj_u64(&j, mb.len);
    cj_obj_end(&j);
    cj_end(&j);
  }
  free(mb.data);
  return rc;
}
