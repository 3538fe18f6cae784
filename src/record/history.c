/*
 * history.c -- what the record layer offers for memory history
 * (torch.cuda.memory._record_memory_history) apart from the trace ring
 * (ring.c) and the stack table (stack.c): the action names, recording
 * settings, recording contexts captured outside the allocator lock,
 * thread-local metadata and compile context, and the annotation ring.
 * Data structures and invariants: history.h.
 *
 * Hot path with history off: the allocator reads its settings' `enabled`
 * (msnap__hsettings_on), one atomic load and a branch.  With history on,
 * msnap__rctx_capture (outside the allocator lock) captures the stack and
 * borrows the thread's metadata ids (no atomic operation when the stack
 * is in the thread's stack cache); the entry itself is stored under the
 * lock by msnap__ring_record (ring.c).
 *
 * The annotation ring has its own lock (MSNAP_RANK_ANNOTATIONS); the
 * stack table's lock is taken inside it when a name's last reference
 * goes.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record/history.h"
#include "record/stack.h"

/* ---- actions ------------------------------------------------------------ */

static const char *const action_names[MSNAP_ACTION_COUNT] = {
#define ACTION_NAME_(name, str) str,
    MSNAP_ACTION_MAP(ACTION_NAME_)
#undef ACTION_NAME_
};

const char *msnap_action_name(int action) {
  if (action < 0 || action >= MSNAP_ACTION_COUNT) return NULL;
  return action_names[action];
}

int msnap_action_parse(const char *name, msnap_action_t *out) {
  if (out == NULL)
    return msnap__set_error(MSNAP_EINVAL, "action_parse: NULL out");
  if (name != NULL) {
    for (int i = 0; i < MSNAP_ACTION_COUNT; i++) {
      if (strcmp(name, action_names[i]) == 0) {
        *out = (msnap_action_t)i;
        return 0;
      }
    }
  }
  return msnap__set_error(MSNAP_EINVAL, "Unknown TraceEntry action: %s",
                          name ? name : "(null)");
}

/* ---- settings and recording contexts --------------------------------------- */

void msnap__hsettings_init(msnap_hsettings_t *s) {
  atomic_init(&s->enabled, false);
  atomic_init(&s->level, MSNAP_CONTEXT_NEVER);
  atomic_init(&s->stacks, 0u);
  atomic_init(&s->skip, 0u);
}

/* The calling thread's recording state: one thread-local block, so that
 * a capture reaches it with one TLS lookup.  meta and cc[] hold one
 * reference each. */
typedef struct tl_rec_s {
  uint64_t next_serial; /* call serials: a range of 2^32 per thread */
  uint32_t meta;        /* string id                                */
  uint32_t cc_n, cc_cap;
  uint32_t *cc;         /* compile-context stack                    */
} tl_rec_t;
static MSNAP_TLS tl_rec_t tl_rec;

/* A serial for a new call: each thread draws a range of 2^32 serials
 * once, so serials are unique across threads and never 0. */
static inline uint64_t call_serial(tl_rec_t *t) {
  static atomic_uint_fast64_t ranges;
  if (msnap_unlikely((t->next_serial & 0xffffffffu) == 0))
    t->next_serial = (atomic_fetch_add(&ranges, 1) + 1) << 32 | 1;
  return t->next_serial++;
}

/*
 * Capture the calling thread's recording context (outside any allocator
 * lock: the frame hook may need the interpreter lock).  A stack is taken
 * for malloc-like sites at level >= STATE and for free/empty_cache sites
 * (is_free_site) only at level ALL.  The ids are borrowed (see
 * msnap_rctx_t); msnap__rctx_release ends the loan.
 */
void msnap__rctx_capture(const msnap_hsettings_t *s, msnap_rctx_t *ctx,
                         bool is_free_site) {
  memset(ctx, 0, sizeof *ctx);
  if (!msnap__hsettings_on(s)) return;
  int level = atomic_load_explicit(&s->level, memory_order_relaxed);
  ctx->level = (uint8_t)level;
  if (level != MSNAP_CONTEXT_NEVER &&
      (is_free_site ? level == MSNAP_CONTEXT_ALL
                    : level >= MSNAP_CONTEXT_STATE)) {
    unsigned stacks = atomic_load_explicit(&s->stacks, memory_order_relaxed);
    /* skip this function's frame */
    ctx->stack = msnap__stack_capture_pinned(stacks, 1, &ctx->stack_pin);
    if (ctx->stack != 0 && ctx->stack_pin == NULL)
      ctx->owns |= MSNAP_RCTX_OWNS_STACK;
  }
  tl_rec_t *t = msnap__tls_addr(&tl_rec);
  ctx->call = call_serial(t);
  ctx->user_metadata = t->meta;
  ctx->compile_context = t->cc_n ? t->cc[t->cc_n - 1] : 0;
}

void msnap__rctx_release(msnap_rctx_t *ctx) {
  if (ctx->stack_pin) msnap__stack_unpin(ctx->stack_pin);
  if (ctx->owns & MSNAP_RCTX_OWNS_STACK) msnap__stack_unref(ctx->stack);
  if (ctx->owns & MSNAP_RCTX_OWNS_META) msnap__stack_unref(ctx->user_metadata);
  ctx->stack = ctx->user_metadata = ctx->compile_context = 0;
  ctx->stack_pin = NULL;
  ctx->owns = 0;
}

void msnap__rctx_set_metadata(msnap_rctx_t *ctx, uint32_t id) {
  if (ctx->owns & MSNAP_RCTX_OWNS_META) msnap__stack_unref(ctx->user_metadata);
  ctx->user_metadata = id;
  ctx->owns |= MSNAP_RCTX_OWNS_META;
}

/* ---- thread-local metadata and compile context --------------------------- */

static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;

static void tls_destructor(void *p) {
  (void)p;
  tl_rec_t *t = msnap__tls_addr(&tl_rec);
  msnap__stack_unref(t->meta);
  t->meta = 0;
  for (uint32_t i = 0; i < t->cc_n; i++) msnap__stack_unref(t->cc[i]);
  free(t->cc);
  t->cc = NULL;
  t->cc_n = t->cc_cap = 0;
}

static void tls_key_make(void) { pthread_key_create(&tls_key, tls_destructor); }

/* Arrange for this thread's references to be dropped at thread exit. */
static void tls_register(void) {
  pthread_once(&tls_key_once, tls_key_make);
  if (pthread_getspecific(tls_key) == NULL)
    pthread_setspecific(tls_key, (void *)1);
}

int msnap_set_memory_metadata(const char *metadata) {
  uint32_t id = 0;
  if (metadata != NULL && metadata[0] != '\0') {
    id = msnap__str_intern(metadata, strlen(metadata));
    if (id == 0) return MSNAP_ENOMEM;
    tls_register();
  }
  msnap__stack_unref(tl_rec.meta);
  tl_rec.meta = id;
  return 0;
}

const char *msnap_get_memory_metadata(void) {
  return msnap__str_get(tl_rec.meta, NULL);
}

int msnap_compile_context_push(const char *name) {
  if (name == NULL)
    return msnap__set_error(MSNAP_EINVAL, "compile_context_push: NULL name");
  uint32_t id = msnap__str_intern(name, strlen(name));
  if (id == 0 && name[0] != '\0') return MSNAP_ENOMEM;
  tl_rec_t *t = msnap__tls_addr(&tl_rec);
  if (MSNAP_GROW(t->cc, t->cc_cap, t->cc_n + 1) != 0) {
    msnap__stack_unref(id);
    return MSNAP_ENOMEM;
  }
  tls_register();
  t->cc[t->cc_n++] = id;
  return 0;
}

int msnap_compile_context_pop(void) {
  tl_rec_t *t = msnap__tls_addr(&tl_rec);
  if (t->cc_n == 0)
    return msnap__set_error(MSNAP_ESTATE,
                            "compile_context_pop: the compile-context stack "
                            "of this thread is empty");
  msnap__stack_unref(t->cc[--t->cc_n]);
  return 0;
}

void msnap__tls_context(uint32_t *user_metadata, uint32_t *compile_context) {
  tl_rec_t *t = msnap__tls_addr(&tl_rec);
  *user_metadata = t->meta;
  *compile_context = t->cc_n ? t->cc[t->cc_n - 1] : 0;
}

/* ---- the annotation ring ----------------------------------------------------- */

void msnap__ann_init(msnap_annring_t *r) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->lock, NULL);
  r->capacity = 1;
}

static void ann_clear_locked(msnap_annring_t *r) {
  for (uint64_t i = 0; i < r->n; i++)
    msnap__stack_unref(r->v[(r->head + i) % r->vcap].name);
  free(r->v);
  r->v = NULL;
  r->vcap = r->head = r->n = r->dropped = 0;
}

void msnap__ann_destroy(msnap_annring_t *r) {
  ann_clear_locked(r);
  pthread_mutex_destroy(&r->lock);
}

/* Relayout the annotation ring to vcap slots keeping the newest. */
static int ann_relayout_locked(msnap_annring_t *r, uint64_t vcap) {
  msnap_aentry_t *nv = NULL;
  if (vcap > 0) {
    if (vcap > SIZE_MAX / sizeof *nv) return MSNAP_ENOMEM;
    nv = malloc((size_t)vcap * sizeof *nv);
    if (nv == NULL) return MSNAP_ENOMEM;
  }
  uint64_t keep = r->n < vcap ? r->n : vcap;
  uint64_t drop = r->n - keep;
  for (uint64_t i = 0; i < r->n; i++) {
    msnap_aentry_t *e = &r->v[(r->head + i) % r->vcap];
    if (i < drop)
      msnap__stack_unref(e->name);
    else
      nv[i - drop] = *e;
  }
  free(r->v);
  r->v = nv;
  r->vcap = vcap;
  r->head = 0;
  r->n = keep;
  r->dropped += drop;
  return 0;
}

void msnap__ann_configure(msnap_annring_t *r, uint64_t capacity, bool clear) {
  msnap__mutex_lock(&r->lock, MSNAP_RANK_ANNOTATIONS);
  r->capacity = capacity;
  if (r->n > capacity || r->vcap > capacity) {
    if (ann_relayout_locked(r, capacity) != 0) ann_clear_locked(r);
  }
  if (clear) ann_clear_locked(r);
  msnap__mutex_unlock(&r->lock, MSNAP_RANK_ANNOTATIONS);
}

int msnap__ann_record(msnap_annring_t *r, int device, const char *name,
                      bool is_start) {
  msnap_aentry_t e;
  e.name = msnap__str_intern(name, strlen(name));
  if (e.name == 0 && name[0] != '\0') return MSNAP_ENOMEM;
  e.device = device;
  e.is_start = is_start;
  msnap__mutex_lock(&r->lock, MSNAP_RANK_ANNOTATIONS);
  e.raw_time = msnap__clock_raw();
  if (r->n == r->vcap && r->vcap < r->capacity) {
    uint64_t vcap = r->vcap ? r->vcap * 2 : 64;
    if (vcap > r->capacity) vcap = r->capacity;
    (void)ann_relayout_locked(r, vcap);
  }
  if (r->vcap == 0) {
    msnap__stack_unref(e.name);
    r->dropped++;
  } else if (r->n < r->vcap) {
    r->v[(r->head + r->n) % r->vcap] = e;
    r->n++;
  } else {
    msnap__stack_unref(r->v[r->head].name);
    r->v[r->head] = e;
    r->head = (r->head + 1) % r->vcap;
    r->dropped++;
  }
  msnap__mutex_unlock(&r->lock, MSNAP_RANK_ANNOTATIONS);
  return 0;
}

int msnap__ann_copy(msnap_annring_t *r, msnap_aentry_t **out, size_t *n) {
  msnap__mutex_lock(&r->lock, MSNAP_RANK_ANNOTATIONS);
  msnap_aentry_t *v = NULL;
  if (r->n) {
    v = malloc((size_t)r->n * sizeof *v);
    if (v == NULL) {
      msnap__mutex_unlock(&r->lock, MSNAP_RANK_ANNOTATIONS);
      return MSNAP_ENOMEM;
    }
  }
  for (uint64_t i = 0; i < r->n; i++) {
    v[i] = r->v[(r->head + i) % r->vcap];
    msnap__stack_ref(v[i].name);
  }
  *out = v;
  *n = (size_t)r->n;
  msnap__mutex_unlock(&r->lock, MSNAP_RANK_ANNOTATIONS);
  return 0;
}
