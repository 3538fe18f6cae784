/*
 * cmd_demo.c -- `memsnap demo-train -o FILE`: record a snapshot live from
 * a built-in simulated training loop, so that the demo (and users without
 * a recording at hand) have a real trace to inspect and replay.
 *
 * The loop drives memsnap's allocator on the sim runtime with history on
 * (context "all", Python-like stacks): a model of L linear layers keeps
 * its parameters; every step runs a forward pass (activations kept for
 * backward, small bias-sized temporaries freed at once), a backward pass
 * (a gradient per parameter; activations freed newest first), and an Adam
 * optimizer step (two state tensors per parameter, created at the first
 * step and kept), then zero_grad(set_to_none) frees the gradients.
 * record_function-style annotations mark forward/backward/optimizer.
 *
 * Stacks: a frame hook supplies synthetic interpreter frames
 * ("train.py:forward" ...) for the site being executed, so summaries and
 * the viewer show allocation sites as they would for a Python script.
 */
#include <limits.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* ---- synthetic Python frames ------------------------------------------- */
typedef struct site_s {
  const char *name;
  int line;
} site_t;

enum { S_MAIN, S_INIT, S_STEP, S_FWD, S_BWD, S_OPT, S_ZERO, S_TMP, S_LEAK,
       NSITES };
static const site_t sites[NSITES] = {
    [S_MAIN] = {"<module>", 88},   [S_INIT] = {"build_model", 21},
    [S_STEP] = {"train_step", 64}, [S_FWD] = {"forward", 33},
    [S_BWD] = {"backward", 47},    [S_OPT] = {"adam_step", 55},
    [S_ZERO] = {"zero_grad", 60},  [S_TMP] = {"gelu", 38},
    [S_LEAK] = {"remember", 70},
};
static int cur_site = S_MAIN;

static int hook_capture(void *ctx, uintptr_t (*frames)[2], int max) {
  (void)ctx;
  int n = 0;
  /* innermost first: the current site, then its callers */
  int chain[4], k = 0;
  chain[k++] = cur_site;
  if (cur_site == S_TMP)
    chain[k++] = S_FWD;
  if (cur_site != S_MAIN && cur_site != S_INIT)
    chain[k++] = S_STEP;
  chain[k++] = S_MAIN;
  for (int i = 0; i < k && n < max; i++, n++) {
    frames[n][0] = (uintptr_t)(chain[i] + 1);
    frames[n][1] = 0;
  }
  return n;
}

static void hook_ref(void *ctx, const uintptr_t frame[2]) {
  (void)ctx;
  (void)frame;
}

static int hook_resolve(void *ctx, const uintptr_t frame[2],
                        const char **name, const char **filename,
                        int64_t *line) {
  (void)ctx;
  uintptr_t i = frame[0] - 1;
  if (i >= NSITES)
    return MSNAP_EINVAL;
  *name = sites[i].name;
  *filename = "examples/train.py";
  *line = sites[i].line;
  return 0;
}

typedef struct loop_s {
  msnap_allocator_t *a;
  int err;
  char why[1024]; /* the failure, for the --json report's "error" */
} loop_t;

static uint64_t alloc_at(loop_t *l, int site, uint64_t size) {
  uint64_t p = 0;
  cur_site = site;
  if (!l->err) {
    int rc = msnap_malloc(l->a, 0, size, 0, &p);
    if (rc) {
      snprintf(l->why, sizeof l->why, "malloc(%" PRIu64 ") failed: %s (%s)",
               size, msnap_strerror(rc), msnap_last_error());
      fflush(stdout);
      fprintf(stderr, "memsnap demo-train: %s\n", l->why);
      size_t free_b = 0, total = 0;
      if (rc == MSNAP_EOOM &&
          msnap_mem_get_info(l->a, 0, &free_b, &total) == 0)
        fprintf(stderr,
                "memsnap demo-train: the simulated device has %.2f GiB: "
                "lower --hidden or --layers, or raise MEMSNAP_SIM_MEMORY\n",
                (double)total / (1 << 30));
      l->err = rc;
    }
  }
  return p;
}

static void free_at(loop_t *l, int site, uint64_t p) {
  cur_site = site;
  if (p && !l->err) {
    int rc = msnap_free(l->a, p);
    if (rc) {
      snprintf(l->why, sizeof l->why, "free(0x%" PRIx64 ") failed: %s", p,
               msnap_strerror(rc));
      fflush(stdout);
      fprintf(stderr, "memsnap demo-train: %s\n", l->why);
      l->err = rc;
    }
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap demo-train [--steps N] [--layers L] "
          "[--hidden H]\n"
          "                          [--profile cuda|npu] [--alloc-conf STR]\n"
          "                          [--leak BYTES] [--json] -o FILE\n"
          "\n"
          "Record a memory snapshot (pickle, as torch.cuda.memory."
          "_dump_snapshot)\nfrom a built-in simulated training loop: "
          "parameters, activations,\ngradients and Adam optimizer states "
          "of L linear layers of width H,\nwith history on.  Used by the "
          "demo when no recording is at hand.\n"
          "\n"
          "  -o, --output FILE  the snapshot to write (required)\n"
          "  --steps N          training steps (default 3)\n"
          "  --layers L         layers (default 6)\n"
          "  --hidden H         layer width (default 2048)\n"
          "  --profile P        allocator profile, cuda or npu (default:\n"
          "                     MEMSNAP_PROFILE, else the sim's own, cuda)\n"
          "  --alloc-conf STR   allocator configuration, as\n"
          "                     PYTORCH_CUDA_ALLOC_CONF (e.g.\n"
          "                     expandable_segments:True; default none)\n"
          "  --leak BYTES       keep BYTES per step from one site, never\n"
          "                     freed (a planted leak; default 0; a size\n"
          "                     such as 4096, 4K or 1.5M, up to 16G)\n"
          "  --json             print {output, output_error, profile, steps,\n"
          "                     layers, hidden, leak} on stdout\n"
          "  -h, --help         this text\n"
          "\nEach step is a record_function range \"ProfilerStep#N\" (as\n"
          "torch.profiler names them); RANK / WORLD_SIZE / LOCAL_RANK in\n"
          "the environment are recorded in process_info.\n");
}

int cli_cmd_demo_train(int argc, char **argv) {
  const char *out = NULL, *profile = NULL, *conf = "", *leak_arg = NULL;
  long steps = 3, layers = 6, hidden = 2048, leak = 0;
  bool json = false;
  const cli_opt_t opts[] = {
      CLI_LONG("steps", 0, &steps, LONG_MIN, LONG_MAX,
               "--steps needs a number 1..1000"),
      CLI_LONG("layers", 0, &layers, LONG_MIN, LONG_MAX,
               "--layers needs a number 1..256"),
      CLI_LONG("hidden", 0, &hidden, LONG_MIN, LONG_MAX,
               "--hidden needs a number 16..65536"),
      CLI_STRING("profile", 0, &profile),
      CLI_STRING("alloc-conf", 0, &conf),
      CLI_STRING("leak", 0, &leak_arg),
      CLI_OPT_END};
  const cli_cmd_t cmd = {"demo-train", usage, opts, 0, "-o FILE is required",
                         &json, &out, "-o FILE is required", false};
  int first;
  int brc = cli_begin(&cmd, argc, argv, &first, NULL);
  if (brc != CLI_CONTINUE) return brc;
  uint64_t leak_bytes = 0;
  if (leak_arg != NULL) {
    if (!msnap__parse_size(leak_arg, &leak_bytes) || leak_bytes > (1ull << 34))
      return cli_usage_error("demo-train", "--leak needs a size 0..16G (a "
                                           "number of bytes, or 4K, 1.5M)");
    leak = (long)leak_bytes;
  }
  if (steps < 1 || steps > 1000 || layers < 1 || layers > 256 ||
      hidden < 16 || hidden > 65536 || leak < 0 || leak > (1l << 34))
    return cli_usage_error("demo-train",
                           "steps 1..1000, layers 1..256, hidden 16..65536, "
                           "leak 0..16 GiB");
  msnap_options_t mo;
  char ebuf[256] = "";
  msnap_options_init(&mo);
  if (!profile)
    mo.profile = -1; /* MEMSNAP_PROFILE, else the sim's own (cuda) */
  else if (!strcmp(profile, "cuda"))
    mo.profile = MSNAP_PROFILE_CUDA;
  else if (!strcmp(profile, "npu"))
    mo.profile = MSNAP_PROFILE_NPU;
  else
    return cli_usage_error("demo-train", "--profile must be cuda or npu");
  mo.runtime_name = "sim";
  mo.alloc_conf = conf;
  mo.caching_disabled = 0;
  mo.sim_devices = 1;
  mo.error_buf = ebuf;
  mo.error_buf_len = sizeof ebuf;
  loop_t l = {0};
  int rc = msnap_allocator_create(&mo, &l.a);
  if (rc) {
    char msg[sizeof ebuf + 64];
    snprintf(msg, sizeof msg, "cannot create the allocator: %s %s",
             msnap_strerror(rc), ebuf);
    if (rc == MSNAP_ECONF) /* --alloc-conf */
      return cli_usage_error("demo-train", msg);
    fprintf(stderr, "memsnap demo-train: %s\n", msg);
    return CLI_UNUSABLE;
  }
  msnap_frame_hook_t hook = {.capture = hook_capture,
                             .retain = hook_ref,
                             .release = hook_ref,
                             .resolve = hook_resolve};
  msnap_set_frame_hook(&hook);
  msnap_history_options_t ho;
  msnap_history_options_init(&ho);
  ho.stacks = MSNAP_STACKS_PYTHON;
  rc = msnap_record_history(l.a, &ho);
  if (rc) {
    fprintf(stderr, "memsnap demo-train: cannot record history: %s\n",
            msnap_strerror(rc));
    msnap_allocator_destroy(l.a);
    return CLI_UNUSABLE;
  }
  uint64_t batch_tokens = 8 * 256; /* batch x sequence */
  uint64_t wsize = (uint64_t)hidden * (uint64_t)hidden * 4;
  uint64_t bsize = (uint64_t)hidden * 4;
  uint64_t asize = batch_tokens * (uint64_t)hidden * 2; /* bf16 */
  uint64_t *w = calloc((size_t)layers, sizeof *w);
  uint64_t *b = calloc((size_t)layers, sizeof *b);
  uint64_t *gw = calloc((size_t)layers, sizeof *gw);
  uint64_t *gb = calloc((size_t)layers, sizeof *gb);
  uint64_t *act = calloc((size_t)layers + 1, sizeof *act);
  uint64_t *m1 = calloc((size_t)layers * 4, sizeof *m1);
  if (!w || !b || !gw || !gb || !act || !m1) {
    cli_err("out of memory");
    rc = MSNAP_ENOMEM;
    goto out;
  }
  for (long i = 0; i < layers; i++) {
    w[i] = alloc_at(&l, S_INIT, wsize);
    b[i] = alloc_at(&l, S_INIT, bsize);
  }
  uint64_t *leaked = calloc((size_t)steps + 1, sizeof *leaked);
  if (!leaked) {
    cli_err("out of memory");
    rc = MSNAP_ENOMEM;
    goto out;
  }
  for (long s = 0; s < steps && !l.err; s++) {
    char stepname[40];
    snprintf(stepname, sizeof stepname, "ProfilerStep#%ld", s);
    msnap_record_annotation(l.a, 0, stepname, true);
    msnap_record_annotation(l.a, 0, "forward", true);
    act[0] = alloc_at(&l, S_STEP, asize); /* input batch */
    for (long i = 0; i < layers; i++) {
      uint64_t t = alloc_at(&l, S_TMP, asize + 4096 * (uint64_t)(i % 3));
      act[i + 1] = alloc_at(&l, S_FWD, asize);
      free_at(&l, S_TMP, t);
    }
    msnap_record_annotation(l.a, 0, "forward", false);
    msnap_record_annotation(l.a, 0, "backward", true);
    for (long i = layers - 1; i >= 0; i--) {
      gw[i] = alloc_at(&l, S_BWD, wsize);
      gb[i] = alloc_at(&l, S_BWD, bsize);
      free_at(&l, S_BWD, act[i + 1]);
    }
    free_at(&l, S_BWD, act[0]);
    msnap_record_annotation(l.a, 0, "backward", false);
    msnap_record_annotation(l.a, 0, "optimizer", true);
    if (s == 0)
      for (long i = 0; i < layers; i++) {
        m1[4 * i] = alloc_at(&l, S_OPT, wsize);
        m1[4 * i + 1] = alloc_at(&l, S_OPT, wsize);
        m1[4 * i + 2] = alloc_at(&l, S_OPT, bsize);
        m1[4 * i + 3] = alloc_at(&l, S_OPT, bsize);
      }
    msnap_record_annotation(l.a, 0, "optimizer", false);
    for (long i = 0; i < layers; i++) {
      free_at(&l, S_ZERO, gw[i]);
      free_at(&l, S_ZERO, gb[i]);
    }
    if (leak)
      leaked[s] = alloc_at(&l, S_LEAK, (uint64_t)leak);
    /* Annotations carry only a time_us: a step's END in the same
     * microsecond as its last allocation is ambiguous to every reader
     * (memsnap leaks places such an entry after the END).  A real step
     * ends later than its last allocation; so does this one. */
    nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    msnap_record_annotation(l.a, 0, stepname, false);
  }
  free(leaked); /* the leaked blocks stay allocated: that is the point */
  rc = l.err;
  if (rc && json) {
    /* the loop failed: the report all the same, no output, the error */
    cli_json_t j;
    cj_init(&j, stdout);
    cj_obj(&j);
    cj_output(&j, NULL);
    cj_key(&j, "error");
    cj_cstr(&j, l.why);
    cj_obj_end(&j);
    cj_end(&j);
  }
  if (!rc) {
    msnap_snapshot_options_t so;
    msnap_snapshot_options_init(&so);
    rc = msnap_dump_snapshot(l.a, &so, out);
    if (rc)
      cli_write_failed(out, "the snapshot", rc, msnap_last_error());
    else
      fprintf(stderr,
              "memsnap: recorded %ld training %s of a %ld-layer model "
              "(width %ld) on the simulated device: %s\n",
              steps, cli_plural((uint64_t)steps, "step", "steps"), layers,
              hidden, cli_output_shown(out));
    if (json) {
      cli_json_t j;
      cj_init(&j, stdout);
      cj_obj(&j);
      cj_output(&j, rc ? NULL : out);
      cj_key(&j, "profile");
      cj_cstr(&j, msnap_profile(l.a) == MSNAP_PROFILE_CUDA ? "cuda" : "npu");
      cj_key(&j, "steps");
      cj_i64(&j, steps);
      cj_key(&j, "layers");
      cj_i64(&j, layers);
      cj_key(&j, "hidden");
      cj_i64(&j, hidden);
      cj_key(&j, "leak");
      cj_i64(&j, leak);
      cj_obj_end(&j);
      cj_end(&j);
    }
  }
out:
  msnap_set_frame_hook(NULL);
  free(w);
  free(b);
  free(gw);
  free(gb);
  free(act);
  free(m1);
  msnap_allocator_destroy(l.a);
  return rc ? CLI_UNUSABLE : CLI_OK;
}
