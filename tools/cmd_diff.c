/*
 * cmd_diff.c -- `memsnap diff A B`: what changed from snapshot A to B.
 *
 * Live blocks (active_allocated) are keyed by (device, address, size).
 * A block of B that is not in A is new; a block of A not in B is freed; a
 * block in both with the same allocation site (innermost user frame,
 * compared as text since the two files have their own string tables; a
 * side that cannot name the site takes the other's) is a leak candidate.
 * Sites come from the stack resolver (cli_stacks.c), so blocks whose own
 * frames are empty are named by their alloc entry in the trace.  A leak
 * candidate site that also has new blocks in B is "growing": allocations
 * from it survive and more keep coming, which is what a leak looks like;
 * exit status 1 is returned only for those, never for a pseudo site
 * ("<no stack...>").
 * Segments are keyed by (device, address, total_size): opened / closed.
 */
#include <limits.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct live_s {
  int64_t device;
  uint64_t addr, size;
  char *site; /* owned */
  int side;   /* 0 only A, 1 only B, 2 both */
} live_t;

typedef struct seg_s {
  int64_t device;
  uint64_t addr, size;
} segk_t;

/* Order of live blocks: (device, address, size); sites do not take part,
 * since one side may know the site of a block the other cannot name. */
static int cmp_live(const void *a, const void *b) {
  const live_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->size < y->size ? -1 : x->size > y->size;
}

static int cmp_seg(const void *a, const void *b) {
  const segk_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->size < y->size ? -1 : x->size > y->size;
}

/* The live blocks of s, sorted by cmp_live, with their sites (the stack
 * resolver of cli_stacks.c: own frames, else the live alloc entry of the
 * trace).  NULL on ENOMEM; the caller frees each site and the array. */
static live_t *collect_live(const msnap_snap_t *s, uint32_t *n) {
  uint32_t cap = 0;
  for (uint32_t i = 0; i < s->nblocks; i++)
    cap += s->blocks[i].state == MSNAP_BLOCK_ACTIVE_ALLOCATED;
  live_t *v = calloc(cap + 1, sizeof *v);
  cli_stacks_t stk;
  if (!v)
    return NULL;
  if (cli_stacks_init(&stk, s) != 0) {
    free(v);
    return NULL;
  }
  uint32_t k = 0;
  char buf[512];
  bool oom = false;
  for (uint32_t i = 0; i < s->nsegments && !oom; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    uint64_t a = g->address;
    for (uint32_t j = 0; j < g->nblocks && k < cap; j++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + j];
      uint64_t ba = (b->keys & MSNAP_K_ADDRESS) ? b->address : a;
      a += b->size;
      if (b->state != MSNAP_BLOCK_ACTIVE_ALLOCATED)
        continue;
      cli_site_format(s, cli_stacks_site(&stk, g->device, ba, b), buf,
                      sizeof buf);
      v[k].device = g->device;
      v[k].addr = ba;
      v[k].size = b->size;
      v[k].site = strdup(buf);
      if (!v[k].site) {
        oom = true;
        break;
      }
      k++;
    }
  }
  cli_stacks_free(&stk);
  if (oom) {
    for (uint32_t i = 0; i < k; i++)
      free(v[i].site);
    free(v);
    return NULL;
  }
  *n = k;
  qsort(v, k, sizeof *v, cmp_live);
  return v;
}

static segk_t *collect_segs(const msnap_snap_t *s) {
  segk_t *v = calloc(s->nsegments + 1, sizeof *v);
  if (!v)
    return NULL;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    v[i].device = s->segments[i].device;
    v[i].addr = s->segments[i].address;
    v[i].size = s->segments[i].total_size;
  }
  qsort(v, s->nsegments, sizeof *v, cmp_seg);
  return v;
}

typedef struct group_s {
  const char *site;
  int64_t device;
  uint64_t bytes, count;
  uint64_t new_bytes, new_count; /* for leak candidates: growth */
} group_t;

static int cmp_group_site(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  return strcmp(x->site, y->site);
}

static int cmp_group_bytes(const void *a, const void *b) {
  const group_t *x = a, *y = b;
  if (x->device != y->device)
    return x->device < y->device ? -1 : 1;
  if (x->bytes != y->bytes)
    return x->bytes > y->bytes ? -1 : 1;
  return strcmp(x->site, y->site);
}

/* Group the entries of `side` by (device, site); *n groups. */
static group_t *group(const live_t *v, uint32_t nv, int side, uint32_t *n) {
  group_t *g = calloc(nv + 1, sizeof *g);
  uint32_t k = 0;
  if (!g)
    return NULL;
  for (uint32_t i = 0; i < nv; i++)
    if (v[i].side == side) {
      g[k].site = v[i].site;
      g[k].device = v[i].device;
      g[k].bytes = v[i].size;
      g[k].count = 1;
      k++;
    }
  qsort(g, k, sizeof *g, cmp_group_site);
  uint32_t m = 0;
  for (uint32_t i = 0; i < k; i++) {
    if (m && g[m - 1].device == g[i].device &&
        !strcmp(g[m - 1].site, g[i].site)) {
      g[m - 1].bytes += g[i].bytes;
      g[m - 1].count++;
    } else {
      g[m++] = g[i];
    }
  }
  *n = m;
  return g;
}

static void dev_totals(const msnap_snap_t *s, int64_t dev, uint64_t *res,
                       uint64_t *alloc, uint64_t *nseg) {
  *res = *alloc = *nseg = 0;
  for (uint32_t i = 0; i < s->nsegments; i++) {
    const msnap_ssegment_t *g = &s->segments[i];
    if (g->device != dev)
      continue;
    (*nseg)++;
    *res += g->total_size;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const msnap_sblock_t *b = &s->blocks[g->first_block + k];
      if (b->state == MSNAP_BLOCK_ACTIVE_ALLOCATED)
        *alloc += b->size;
    }
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap diff [--json] [--top N] A B\n"
          "\n"
          "Compare two snapshots (e.g. two steps of a training loop):\n"
          "reserved and allocated deltas per device, segments opened and\n"
          "closed, new and freed live blocks grouped by allocation site,\n"
          "and leak candidates: live blocks present in both with the same\n"
          "site.  A candidate site that also gained new live blocks in B is\n"
          "marked growing.\n"
          "\n"
          "  --json     JSON object {devices: [{device, reserved_delta,\n"
          "             allocated_delta, segments_opened, segments_closed,\n"
          "             new_by_site, freed_by_site, leak_candidates}]}\n"
          "  --top N    sites shown per list (default 10, 0 = all)\n"
          "  -h, --help this text\n"
          "\nExit status: 0 no growing leak candidate, 1 growing leak\n"
          "candidates found, 2 unusable input.\n");
}

static void print_groups(cli_json_t *j, bool json, const char *title,
                         group_t *g, uint32_t n, int64_t dev, long topn,
                         bool leak) {
  char b1[32];
  uint32_t shown = 0, total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += g[i].device == dev;
  if (json) {
    cj_key(j, title);
    cj_arr(j);
  } else if (total) {
    printf("  %s (%u site%s):\n", title, total, total == 1 ? "" : "s");
  }
  for (uint32_t i = 0; i < n; i++) {
    if (g[i].device != dev)
      continue;
    if (topn > 0 && shown >= (uint32_t)topn)
      break;
    shown++;
    if (json) {
      cj_obj(j);
      cj_key(j, "site");
      cj_cstr(j, g[i].site);
      cj_key(j, "bytes");
      cj_u64(j, g[i].bytes);
      cj_key(j, "count");
      cj_u64(j, g[i].count);
      if (leak) {
        cj_key(j, "growing");
        cj_bool(j, g[i].new_count > 0);
        cj_key(j, "new_bytes");
        cj_u64(j, g[i].new_bytes);
      }
      cj_obj_end(j);
    } else {
      printf("    %12s  %5" PRIu64 " x  %s", cli_bytes(g[i].bytes, b1,
                                                      sizeof b1),
             g[i].count, g[i].site);
      if (leak && g[i].new_count)
        printf("  [growing: +%" PRIu64 " new, %s]", g[i].new_count,
               cli_bytes(g[i].new_bytes, b1, sizeof b1));
      printf("\n");
    }
  }
  if (json)
    cj_arr_end(j);
  else if (total > shown)
    printf("    ... %u more\n", total - shown);
}

int cli_cmd_diff(int argc, char **argv) {
  bool json = false;
  long topn = 10;
  const cli_opt_t opts[] = {
      CLI_LONG("top", 't', &topn, 0, LONG_MAX, "--top needs a number >= 0"),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"diff", usage, opts, 2, "expects two files A B",
                         &json, NULL, NULL};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  msnap_snap_t *sa = NULL, *sb = NULL;
  if (cli_load(argv[first], &sa) != CLI_OK)
    return CLI_UNUSABLE;
  if (cli_load(argv[first + 1], &sb) != CLI_OK) {
    msnap__snap_free(sa);
    return CLI_UNUSABLE;
  }
  int rc = CLI_OK;
  uint32_t na = 0, nb = 0;
  live_t *la = collect_live(sa, &na), *lb = collect_live(sb, &nb);
  segk_t *ga = collect_segs(sa), *gb = collect_segs(sb);
  live_t *all = calloc((size_t)na + nb + 1, sizeof *all);
  group_t *gnew = NULL, *gfreed = NULL, *gboth = NULL;
  uint32_t nnew = 0, nfreed = 0, nboth = 0, nall = 0;
  if (!la || !lb || !ga || !gb || !all) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
    goto out;
  }
  /* Merge the two sorted lists.  A block at the same (device, address,
   * size) on both sides is the same allocation unless both name a site and
   * the sites differ (freed and allocated again elsewhere); when only one
   * side names its site (the other's trace no longer holds its alloc
   * entry), that site is used. */
  for (uint32_t i = 0, k = 0; i < na || k < nb;) {
    int c = i >= na ? 1 : k >= nb ? -1 : cmp_live(&la[i], &lb[k]);
    if (c == 0 && (!strcmp(la[i].site, lb[k].site) ||
                   cli_site_is_pseudo(la[i].site) ||
                   cli_site_is_pseudo(lb[k].site))) {
      all[nall] = la[i++];
      if (cli_site_is_pseudo(all[nall].site))
        all[nall].site = lb[k].site;
      all[nall++].side = 2;
      k++;
    } else if (c == 0) {
      all[nall] = la[i++];
      all[nall++].side = 0;
      all[nall] = lb[k++];
      all[nall++].side = 1;
    } else if (c < 0) {
      all[nall] = la[i++];
      all[nall++].side = 0;
    } else {
      all[nall] = lb[k++];
      all[nall++].side = 1;
    }
  }
  gnew = group(all, nall, 1, &nnew);
  gfreed = group(all, nall, 0, &nfreed);
  gboth = group(all, nall, 2, &nboth);
  if (!gnew || !gfreed || !gboth) {
    cli_err("out of memory");
    rc = CLI_UNUSABLE;
    goto out;
  }
  /* Growth of leak candidate sites: new blocks from the same site.  A
   * pseudo site ("<no stack...>") names no place in the program: blocks
   * grouped under it say nothing about growth. */
  for (uint32_t i = 0; i < nboth; i++)
    for (uint32_t k = 0; k < nnew && !cli_site_is_pseudo(gboth[i].site); k++)
      if (gnew[k].device == gboth[i].device &&
          !strcmp(gnew[k].site, gboth[i].site)) {
        gboth[i].new_bytes = gnew[k].bytes;
        gboth[i].new_count = gnew[k].count;
        rc = CLI_FINDING;
      }
  qsort(gnew, nnew, sizeof *gnew, cmp_group_bytes);
  qsort(gfreed, nfreed, sizeof *gfreed, cmp_group_bytes);
  qsort(gboth, nboth, sizeof *gboth, cmp_group_bytes);

  /* Devices of either side. */
  uint32_t nda, ndb;
  int64_t *da = cli_devices(sa, &nda), *db = cli_devices(sb, &ndb);
  int64_t *devs = calloc((size_t)nda + ndb + 1, sizeof *devs);
  uint32_t nd = 0;
  if (devs) {
    for (uint32_t i = 0; i < nda; i++)
      devs[nd++] = da[i];
    for (uint32_t i = 0; i < ndb; i++) {
      bool seen = false;
      for (uint32_t k = 0; k < nda; k++)
        seen |= da[k] == db[i];
      if (!seen)
        devs[nd++] = db[i];
    }
  }
  free(da);
  free(db);
  cli_json_t j;
  cj_init(&j, stdout);
  if (json) {
    cj_obj(&j);
    cj_key(&j, "a");
    cj_cstr(&j, argv[first]);
    cj_key(&j, "b");
    cj_cstr(&j, argv[first + 1]);
    cj_key(&j, "devices");
    cj_arr(&j);
  } else {
    printf("diff %s -> %s\n", argv[first], argv[first + 1]);
  }
  char b1[32], b2[32], b3[32];
  for (uint32_t d = 0; d < nd; d++) {
    int64_t dev = devs[d];
    uint64_t ra, aa, sga, rb, ab, sgb;
    dev_totals(sa, dev, &ra, &aa, &sga);
    dev_totals(sb, dev, &rb, &ab, &sgb);
    uint64_t opened = 0, closed = 0, obytes = 0, cbytes = 0;
    for (uint32_t i = 0, k = 0; i < sa->nsegments || k < sb->nsegments;) {
      int c = i >= sa->nsegments   ? 1
              : k >= sb->nsegments ? -1
                                   : cmp_seg(&ga[i], &gb[k]);
      if (c == 0) {
        i++;
        k++;
      } else if (c < 0) {
        if (ga[i].device == dev) {
          closed++;
          cbytes += ga[i].size;
        }
        i++;
      } else {
        if (gb[k].device == dev) {
          opened++;
          obytes += gb[k].size;
        }
        k++;
      }
    }
    if (json) {
      cj_obj(&j);
      cj_key(&j, "device");
      cj_i64(&j, dev);
      cj_key(&j, "reserved_bytes_a");
      cj_u64(&j, ra);
      cj_key(&j, "reserved_bytes_b");
      cj_u64(&j, rb);
      cj_key(&j, "reserved_delta");
      cj_i64(&j, (int64_t)(rb - ra));
      cj_key(&j, "allocated_bytes_a");
      cj_u64(&j, aa);
      cj_key(&j, "allocated_bytes_b");
      cj_u64(&j, ab);
      cj_key(&j, "allocated_delta");
      cj_i64(&j, (int64_t)(ab - aa));
      cj_key(&j, "segments_opened");
      cj_u64(&j, opened);
      cj_key(&j, "segments_opened_bytes");
      cj_u64(&j, obytes);
      cj_key(&j, "segments_closed");
      cj_u64(&j, closed);
      cj_key(&j, "segments_closed_bytes");
      cj_u64(&j, cbytes);
    } else {
      printf("\ndevice %" PRId64 "\n", dev);
      printf("  reserved   %s -> %s (%s%s)\n", cli_bytes(ra, b1, sizeof b1),
             cli_bytes(rb, b2, sizeof b2), rb >= ra ? "+" : "-",
             cli_bytes(rb >= ra ? rb - ra : ra - rb, b3, sizeof b3));
      printf("  allocated  %s -> %s (%s%s)\n", cli_bytes(aa, b1, sizeof b1),
             cli_bytes(ab, b2, sizeof b2), ab >= aa ? "+" : "-",
             cli_bytes(ab >= aa ? ab - aa : aa - ab, b3, sizeof b3));
      printf("  segments   %" PRIu64 " -> %" PRIu64 ": %" PRIu64
             " opened (%s), %" PRIu64 " closed (%s)\n",
             sga, sgb, opened, cli_bytes(obytes, b1, sizeof b1), closed,
             cli_bytes(cbytes, b2, sizeof b2));
    }
    print_groups(&j, json, json ? "new_by_site" : "new live blocks", gnew,
                 nnew, dev, topn, false);
    print_groups(&j, json, json ? "freed_by_site" : "freed live blocks",
                 gfreed, nfreed, dev, topn, false);
    print_groups(&j, json,
                 json ? "leak_candidates"
                      : "leak candidates (live in both, same site)",
                 gboth, nboth, dev, topn, true);
    if (json)
      cj_obj_end(&j);
  }
  if (json) {
    cj_arr_end(&j);
    cj_key(&j, "growing_leak_candidates");
    cj_bool(&j, rc == CLI_FINDING);
    cj_obj_end(&j);
    cj_end(&j);
  }
  free(devs);
out:
  for (uint32_t i = 0; la && i < na; i++)
    free(la[i].site);
  for (uint32_t i = 0; lb && i < nb; i++)
    free(lb[i].site);
  free(la);
  free(lb);
  free(ga);
  free(gb);
  free(all);
  free(gnew);
  free(gfreed);
  free(gboth);
  msnap__snap_free(sa);
  msnap__snap_free(sb);
  return rc;
}
