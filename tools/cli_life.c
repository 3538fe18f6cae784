/*
 * cli_life.c -- lifetimes of a trace's allocations and the allocation
 * sites of a model's stacks: what `summary` (the OOM explanation), `diff`,
 * `leaks` and `fleet` read from a device trace.
 *
 * Pairing (cli_pair_entries).  For entry i of a device trace, pair[i] is
 *   alloc           the index of the free_completed that ends it, or
 *                   CLI_NO_PAIR when it is still live at the end;
 *   free_completed  the index of the alloc it ends, or CLI_NO_PAIR when the
 *                   block was allocated before the first entry (before
 *                   recording began, or in entries the ring dropped);
 *   anything else   CLI_NO_PAIR, and so are torch_npu's synthetic
 *                   workspace entries (cli_workspace_synthetic: no
 *                   history; cli_live_sites_at skips them too).
 * Events are sorted by (address, index) (cli_sort_ev, linear time); at one
 * address an alloc is ended by the next event when that is a
 * free_completed.  So allocation i is live in the states i+1 .. pair[i]
 * (state s = after entries 0..s-1, as in view_model.c): a block freed and
 * allocated again at the same address is two allocations.
 *
 * Sites (cli_sites_t).  Every stack id of a model maps to one site index;
 * stacks with the same site (cli_site: innermost user frame and its via)
 * share the index.  Index CLI_SITEIX_NONE is the empty stack ("<no
 * stack>"), CLI_SITEIX_BEFORE the blocks allocated before the trace.
 * Invariants (cli_sites_check, run after every cli_sites_init in builds
 * with MSNAP_DEBUG >= 2): of_stack[st] < n for every stack; site[k] are
 * distinct and increasing for k >= 2; site[0] = NONE, site[1] = BEFORE.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "base/base.h"

/* ---- events by address --------------------------------------------------- */

typedef cli_ev_t ev_t;

static int cmp_ev(const void *a, const void *b) {
  const ev_t *x = a, *y = b;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/*
 * Sort ev[0..n) by (addr, idx) as cmp_ev does, in linear time: the events
 * are made in trace order (idx increasing), so a stable LSD radix sort on
 * addr alone gives the same order.  11-bit digits; digits that are equal
 * in every address (the high bits of device addresses) cost no pass.
 * Returns -1 when the scratch array cannot be had (the caller then uses
 * qsort).
 */
static int sort_ev(ev_t *ev, uint32_t n) {
  enum { BITS = 11, NB = 1 << BITS };
  if (n < 2)
    return 0;
  uint64_t lo = ev[0].addr, hi = ev[0].addr;
  for (uint32_t i = 1; i < n; i++) {
    lo &= ev[i].addr;
    hi |= ev[i].addr;
  }
  uint64_t varying = lo ^ hi; /* bits that differ somewhere */
  ev_t *tmp = NULL;
  ev_t *src = ev, *dst = NULL;
  uint32_t count[NB];
  for (int shift = 0; shift < 64; shift += BITS) {
    if (((varying >> shift) & (NB - 1)) == 0)
      continue;
    if (tmp == NULL) {
      tmp = malloc((size_t)n * sizeof *tmp);
      if (tmp == NULL)
        return -1;
      dst = tmp;
    }
    memset(count, 0, sizeof count);
    for (uint32_t i = 0; i < n; i++)
      count[(src[i].addr >> shift) & (NB - 1)]++;
    uint32_t sum = 0;
    for (uint32_t b = 0; b < NB; b++) {
      uint32_t c = count[b];
      count[b] = sum;
      sum += c;
    }
    for (uint32_t i = 0; i < n; i++)
      dst[count[(src[i].addr >> shift) & (NB - 1)]++] = src[i];
    ev_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != ev)
    memcpy(ev, src, (size_t)n * sizeof *ev);
  free(tmp);
  return 0;
}

void cli_sort_ev(cli_ev_t *ev, uint32_t n) {
  if (sort_ev(ev, n) != 0)
    qsort(ev, n, sizeof *ev, cmp_ev);
}

/* ---- pairing ------------------------------------------------------------- */

int cli_pair_entries(const msnap_trace_list_t *tl, uint32_t **out) {
  uint32_t n = tl ? tl->n : 0, k = 0;
  uint32_t *pair = malloc(((size_t)n + 1) * sizeof *pair);
  if (!pair)
    return -1;
  for (uint32_t i = 0; i < n; i++) {
    pair[i] = CLI_NO_PAIR;
    k += tl->v[i].action == MSNAP_ACTION_ALLOC ||
         tl->v[i].action == MSNAP_ACTION_FREE_COMPLETED;
  }
  cli_ev_t *ev = malloc(((size_t)k + 1) * sizeof *ev);
  if (!ev) {
    free(pair);
    return -1;
  }
  k = 0;
  for (uint32_t i = 0; i < n; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if ((e->action != MSNAP_ACTION_ALLOC &&
         e->action != MSNAP_ACTION_FREE_COMPLETED) ||
        cli_workspace_synthetic(tl, i))
      continue;
    ev[k++] = (cli_ev_t){e->addr, i, e->action == MSNAP_ACTION_ALLOC};
  }
  cli_sort_ev(ev, k);
  for (uint32_t i = 0; i + 1 < k; i++)
    if (ev[i].alloc && !ev[i + 1].alloc && ev[i + 1].addr == ev[i].addr) {
      pair[ev[i].idx] = ev[i + 1].idx;
      pair[ev[i + 1].idx] = ev[i].idx;
    }
  free(ev);
  *out = pair;
  return 0;
}

/* ---- sites of stacks ------------------------------------------------------ */

static uint64_t site_key(cli_site_t t) {
  return (uint64_t)t.frame << 32 | t.via;
}

int cli_sites_init(cli_sites_t *x, const msnap_snap_t *s) {
  memset(x, 0, sizeof *x);
  uint32_t ns = s->nstacks;
  x->nstacks = ns;
  x->of_stack = malloc(((size_t)ns + 1) * sizeof *x->of_stack);
  cli_key_ix_t *k = malloc(((size_t)ns + 1) * sizeof *k);
  x->site = malloc(((size_t)ns + 3) * sizeof *x->site);
  if (!x->of_stack || !k || !x->site) {
    free(k);
    cli_sites_free(x);
    return -1;
  }
  /* the empty stack: only trace entries are looked up by stack here */
  x->site[CLI_SITEIX_NONE] = (cli_site_t){cli_empty_site(s), CLI_SITE_NONE};
  x->site[CLI_SITEIX_BEFORE] = (cli_site_t){CLI_SITE_BEFORE_TRACE,
                                            CLI_SITE_NONE};
  x->n = 2;
  uint32_t m = 0;
  for (uint32_t st = 0; st < ns; st++) {
    cli_site_t t = cli_site(s, st);
    if (t.frame == CLI_SITE_NONE) {
      x->of_stack[st] = CLI_SITEIX_NONE;
      continue;
    }
    k[m++] = (cli_key_ix_t){site_key(t), st};
  }
  cli_sort_key_ix(k, m);
  for (uint32_t i = 0; i < m; i++) {
    if (i == 0 || k[i].key != k[i - 1].key)
      x->site[x->n++] = (cli_site_t){(uint32_t)(k[i].key >> 32),
                                     (uint32_t)k[i].key};
    x->of_stack[k[i].ix] = x->n - 1;
  }
  free(k);
  if (msnap_debug_level >= 2 && !cli_sites_check(x)) {
    fprintf(stderr, "memsnap: internal error: cli_sites invariants\n");
    abort();
  }
  return 0;
}

void cli_sites_free(cli_sites_t *x) {
  free(x->of_stack);
  free(x->site);
  memset(x, 0, sizeof *x);
}

bool cli_sites_check(const cli_sites_t *x) {
  if (x->n < 2 || (x->site[CLI_SITEIX_NONE].frame != CLI_SITE_NONE &&
                    x->site[CLI_SITEIX_NONE].frame != CLI_SITE_NO_PYTHON) ||
      x->site[CLI_SITEIX_BEFORE].frame != CLI_SITE_BEFORE_TRACE)
    return false;
  for (uint32_t st = 0; st < x->nstacks; st++)
    if (x->of_stack[st] >= x->n)
      return false;
  for (uint32_t i = 3; i < x->n; i++)
    if (site_key(x->site[i - 1]) >= site_key(x->site[i]))
      return false;
  return true;
}

/* ---- live allocations at a state ------------------------------------------ */

void cli_start_stacks(const msnap_snap_t *s, const cli_stacks_t *stk,
                      int64_t dev, const cli_state_t *st, msnap_stack_t *out) {
  for (cli_bwalk_t it = cli_bwalk(s, dev); cli_bwalk_next(&it);) {
    const msnap_sblock_t *b = it.b;
    uint64_t ba = it.addr;
    if (!cli_block_active(b) || cli_stacks_live_entry(stk, dev, ba) >= 0)
      continue;
    uint32_t lo = 0, hi = st->nb;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (st->b[mid].addr < ba)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < st->nb && st->b[lo].addr == ba)
      out[lo] = cli_stacks_block(stk, dev, ba, b, NULL);
  }
}

int cli_live_sites_at(const msnap_snap_t *s, const cli_stacks_t *stk,
                      const cli_sites_t *sites, int64_t dev,
                      const uint32_t *pair, uint32_t state,
                      cli_site_sum_t **out, uint32_t *nout) {
  const msnap_trace_list_t *tl = cli_trace(s, dev);
  uint32_t n = tl ? tl->n : 0;
  if (state > n)
    state = n;
  cli_state_t st;
  *out = NULL;
  *nout = 0;
  if (cli_backward(s, dev, NULL, NULL, &st) < 0)
    return -1;
  cli_site_sum_t *sum = calloc((size_t)sites->n + 1, sizeof *sum);
  msnap_stack_t *pre = calloc((size_t)st.nb + 1, sizeof *pre);
  uint8_t *gone = calloc((size_t)st.nb + 1, 1);
  if (!sum || !pre || !gone) {
    free(sum);
    free(pre);
    free(gone);
    cli_state_free(&st);
    return -1;
  }
  for (uint32_t k = 0; k < sites->n; k++)
    sum[k].site = sites->site[k];
  cli_start_stacks(s, stk, dev, &st, pre);
  /* blocks of the start state freed before `state` */
  for (uint32_t i = 0; i < state; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (e->action != MSNAP_ACTION_FREE_COMPLETED || pair[i] != CLI_NO_PAIR)
      continue;
    uint32_t lo = 0, hi = st.nb;
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (st.b[mid].addr < e->addr)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < st.nb && st.b[lo].addr == e->addr)
      gone[lo] = 1;
  }
  for (uint32_t k = 0; k < st.nb; k++) {
    if (gone[k])
      continue;
    uint32_t ix = pre[k] != MSNAP_STACK_ABSENT
                      ? cli_sites_of(sites, pre[k])
                      : CLI_SITEIX_BEFORE;
    sum[ix].bytes += st.b[k].requested ? st.b[k].requested : st.b[k].size;
    sum[ix].count++;
  }
  for (uint32_t i = 0; i < state; i++) {
    const msnap_strace_t *e = &tl->v[i];
    if (e->action != MSNAP_ACTION_ALLOC ||
        (pair[i] != CLI_NO_PAIR && pair[i] < state) ||
        cli_workspace_synthetic(tl, i))
      continue;
    uint32_t ix = cli_sites_of(sites, e->frames);
    sum[ix].bytes += e->size;
    sum[ix].count++;
  }
  free(pre);
  free(gone);
  cli_state_free(&st);
  uint32_t m = 0;
  for (uint32_t k = 0; k < sites->n; k++)
    if (sum[k].count)
      sum[m++] = sum[k];
  cli_site_sums_rank(s, sum, m);
  *out = sum;
  *nout = m;
  return 0;
}
