/*
 * cli_args.c -- the prologue every `memsnap` command shares: options from
 * a const table (getopt_long), the number of FILE arguments, the -o
 * output (required or not, never one of the inputs, never a directory)
 * and, for one-file commands, loading that file (with --json, a file that
 * cannot be loaded gives the unusable document on stdout).
 *
 * Messages and exit codes are the commands' own (a table row names them):
 * a usage error prints "memsnap CMD: <what>" and "Try 'memsnap CMD
 * --help'." and gives 2; -h/--help prints the usage on stdout and gives 0.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Store one option's argument; a message on a bad number. */
static int set_opt(const cli_cmd_t *c, const cli_opt_t *op,
                   const char *arg) {
  switch (op->kind) {
  case CLI_OPT_FLAG: *(bool *)op->dest = true; return CLI_OK;
  case CLI_OPT_STRING: *(const char **)op->dest = arg; return CLI_OK;
  case CLI_OPT_LONG: {
    char *end;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || v < op->lo || v > op->hi)
      return cli_usage_error(c->name, op->what);
    *(long *)op->dest = v;
    return CLI_OK;
  }
  case CLI_OPT_DOUBLE: {
    char *end;
    double v = strtod(arg, &end);
    if (end == arg || *end || !(v >= op->dlo && v <= op->dhi))
      return cli_usage_error(c->name, op->what);
    *(double *)op->dest = v;
    return CLI_OK;
  }
  }
  return CLI_UNUSABLE;
}

bool cli_file_id(const char *file, cli_file_id_t *id) {
  struct stat st;
  int r = strcmp(file, "-") == 0 ? fstat(STDIN_FILENO, &st) : stat(file, &st);
  if (r != 0) return false;
  *id = (cli_file_id_t){st.st_dev, st.st_ino, st.st_mode};
  return true;
}

bool cli_file_id_stream(const cli_file_id_t *id) {
  return !S_ISREG(id->mode) && !S_ISDIR(id->mode);
}

/* A name of cli_file_repeats: its file's id, or the name itself when
 * cli_file_id cannot identify it. */
typedef struct name_id_s {
  const char *name; /* NULL: known by id (cli_file_id) */
  cli_file_id_t id;
  uint32_t idx;
} name_id_t;

static int cmp_name_id(const void *a, const void *b) {
  const name_id_t *x = a, *y = b;
  if ((x->name == NULL) != (y->name == NULL)) return x->name ? 1 : -1;
  if (x->name) {
    int c = strcmp(x->name, y->name);
    if (c) return c;
  } else {
    if (x->id.dev != y->id.dev) return x->id.dev < y->id.dev ? -1 : 1;
    if (x->id.ino != y->id.ino) return x->id.ino < y->id.ino ? -1 : 1;
  }
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static bool same_file(const name_id_t *x, const name_id_t *y) {
  if (x->name || y->name)
    return x->name && y->name && strcmp(x->name, y->name) == 0;
  return cli_file_id_same(&x->id, &y->id);
}

uint32_t cli_file_repeats(char *const *v, uint32_t n, uint32_t *first_of,
                          char *dup, size_t dup_size) {
  if (dup_size) dup[0] = '\0';
  for (uint32_t i = 0; first_of && i < n; i++) first_of[i] = i;
  name_id_t *id = malloc(((size_t)n + 1) * sizeof *id);
  uint32_t *keep = malloc(((size_t)n + 1) * sizeof *keep);
  uint32_t ndup = 0, first = UINT32_MAX;
  if (!id || !keep) {
    free(id);
    free(keep);
    return 0;
  }
  for (uint32_t i = 0; i < n; i++) {
    cli_file_id_t fid;
    keep[i] = i;
    if (cli_file_id(v[i], &fid))
      id[i] = (name_id_t){.name = NULL, .id = fid, .idx = i};
    else
      id[i] = (name_id_t){.name = v[i], .idx = i};
  }
  qsort(id, n, sizeof *id, cmp_name_id);
  for (uint32_t j = 1; j < n; j++)
    if (same_file(&id[j], &id[j - 1])) {
      /* (the group's first name is its lowest index: sorted) */
      keep[id[j].idx] = keep[id[j - 1].idx];
      if (id[j].idx < first) first = id[j].idx;
      ndup++;
    }
  if (first != UINT32_MAX && dup_size) {
    const char *kept = v[keep[first]];
    if (strcmp(v[first], kept) != 0)
      snprintf(dup, dup_size, "%s is %s", v[first], kept);
    else
      snprintf(dup, dup_size, "%s given again", kept);
  }
  if (first_of) memcpy(first_of, keep, (size_t)n * sizeof *keep);
  free(id);
  free(keep);
  return ndup;
}

/* The argument that named the long option getopt_long just matched:
 * optind has moved past it, and past its value when that came separate
 * ("--name VALUE"; "--name=VALUE" is one argument). */
static const char *long_token(char **argv) {
  const char *arg = argv[optind - 1];
  if (optarg != NULL && optarg == arg && optind >= 2) arg = argv[optind - 2];
  return arg;
}

/* Whether that argument spelled the option (`name`) in full: --name or
 * --name=..., not a shorter prefix that getopt accepts. */
static bool spelled_in_full(const char *arg, const char *name) {
  if (arg[0] != '-' || arg[1] != '-') return true;
  size_t n = strlen(name);
  return strncmp(arg + 2, name, n) == 0 &&
         (arg[2 + n] == '\0' || arg[2 + n] == '=');
}

/* The usage error for `arg`, a prefix of the long option `name`. */
static int abbreviation_error(const cli_cmd_t *c, const char *arg,
                              const char *name) {
  char msg[512];
  const char *eq = strchr(arg, '=');
  int len = eq ? (int)(eq - arg) : (int)strlen(arg);
  if (len > 200) len = 200;
  snprintf(msg, sizeof msg,
           "unrecognized option '%.*s' (did you mean '--%s'? long options "
           "are spelled in full)",
           len, arg, name);
  return cli_usage_error(c->name, msg);
}

/* getopt's refusal (o: '?' or ':') in getopt's own words: an unknown
 * option, one that needs an argument, or a long one given an argument it
 * does not take (optopt: the option, 0 when unknown).  The argument it
 * stopped at is argv[optind - 1], except inside a cluster of short
 * options ("-zq" at 'z'), where optind has not moved yet. */
static int bad_option(const cli_cmd_t *c, int o, int argc, char **argv,
                      const struct option *lo) {
  char msg[512];
  const char *arg = optind >= 1 ? argv[optind - 1] : NULL;
  const char *cur = optind < argc ? argv[optind] : NULL;
  bool in_cluster = o == '?' && optopt > 0 && optopt < 128 && cur &&
                    cur[0] == '-' && cur[1] != '-' && cur[1] != '\0' &&
                    strchr(cur + 1, optopt) != NULL;
  bool islong = !in_cluster && arg != NULL && arg[0] == '-' && arg[1] == '-';
  if (islong) {
    const char *eq = strchr(arg, '=');
    int len = eq ? (int)(eq - arg) : (int)strlen(arg);
    if (len > 200) len = 200;
    /* the option getopt matched (optopt: its val), when it was refused
     * for its argument: an abbreviation is no option (cli_begin) */
    for (size_t k = 0; optopt != 0 && lo[k].name; k++)
      if (lo[k].val == optopt && !spelled_in_full(arg, lo[k].name))
        return abbreviation_error(c, arg, lo[k].name);
    if (o == ':')
      snprintf(msg, sizeof msg, "option '%.*s' requires an argument", len,
               arg);
    else if (optopt != 0)
      snprintf(msg, sizeof msg, "option '%.*s' doesn't allow an argument",
               len, arg);
    else
      snprintf(msg, sizeof msg, "unrecognized option '%.*s'", len, arg);
  } else if (o == ':') {
    snprintf(msg, sizeof msg, "option requires an argument -- '%c'", optopt);
  } else {
    snprintf(msg, sizeof msg, "invalid option -- '%c'", optopt);
  }
  return cli_usage_error(c->name, msg);
}

int cli_begin(const cli_cmd_t *c, int argc, char **argv, int *first,
              msnap_snap_t **load) {
  /* the command's options, then --json and -o/--output when it has them */
  cli_opt_t all[CLI_MAX_OPTS + 3];
  size_t na = 0;
  for (; c->opts && c->opts[na].name && na < CLI_MAX_OPTS; na++)
    all[na] = c->opts[na];
  if (c->json) all[na++] = (cli_opt_t)CLI_FLAG("json", 0, c->json);
  if (c->output) all[na++] = (cli_opt_t)CLI_STRING("output", 'o', c->output);
  all[na] = (cli_opt_t)CLI_OPT_END;
  struct option lo[CLI_MAX_OPTS + 4];
  char shorts[2 * CLI_MAX_OPTS + 8];
  size_t ns = 0, n = 0;
  /* ':' first: getopt prints nothing and tells a missing argument (':')
   * from an unknown option ('?'); the message is ours (bad_option), as
   * valid UTF-8 whatever bytes the argument holds */
  shorts[ns++] = ':';
  shorts[ns++] = 'h';
  for (; all[n].name; n++) {
    const cli_opt_t *op = &all[n];
    lo[n] = (struct option){op->name,
                            op->kind == CLI_OPT_FLAG ? no_argument
                                                     : required_argument,
                            NULL, op->letter ? op->letter : 256 + (int)n};
    if (op->letter) {
      shorts[ns++] = op->letter;
      if (op->kind != CLI_OPT_FLAG) shorts[ns++] = ':';
    }
  }
  lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
  lo[n] = (struct option){NULL, 0, NULL, 0};
  shorts[ns] = '\0';
  int o;
  optind = 1;
  opterr = 0;
  int li = -1;
  optarg = NULL; /* (getopt leaves it as it was for an option without one) */
  while ((o = getopt_long(argc, argv, shorts, lo, &li)) != -1) {
    if (o == '?' || o == ':')
      return bad_option(c, o, argc, argv, lo);
    const char *arg = li >= 0 ? long_token(argv) : NULL;
    /* getopt takes a unique prefix of a long option ("--device" for
     * replay's --device-memory); memsnap's commands share option names
     * with other meanings (plot's --device), so only full names go */
    if (arg != NULL && !spelled_in_full(arg, lo[li].name))
      return abbreviation_error(c, arg, lo[li].name);
    li = -1;
    if (o == 'h') {
      c->usage(stdout);
      return CLI_DONE;
    }
    const cli_opt_t *op = NULL;
    for (size_t k = 0; all[k].name && !op; k++)
      if (o == (all[k].letter ? all[k].letter : 256 + (int)k))
        op = &all[k];
    if (op == NULL) return cli_usage_error(c->name, NULL);
    int rc = set_opt(c, op, optarg);
    if (rc != CLI_OK) return rc;
    optarg = NULL;
  }
  int nfiles = argc - optind;
  if (c->nfiles >= 0 ? nfiles != c->nfiles : nfiles < 1)
    return cli_usage_error(c->name, c->files_msg);
  /* '-' is standard input: it can be read once, so it names one FILE at
   * most (refused before anything is read, rather than the second '-'
   * reading an empty input); fleet reads it once, as any input named
   * twice, with a warning (cmd_fleet.c) */
  bool fleet = strcmp(c->name, "fleet") == 0;
  for (int i = optind, seen = 0; !fleet && i < argc; i++)
    if (strcmp(argv[i], "-") == 0 && seen++)
      return cli_usage_error(c->name,
                             "standard input ('-') is given more than "
                             "once; it can be read only once: give it "
                             "for one FILE and name files for the others");
  /* The same for one pipe, FIFO or device under two names ('-' and
   * /dev/stdin, a FIFO and a link to it): its bytes go to the first only.
   * Regular files may be named twice.  fleet reads each input once by
   * device and inode (cmd_fleet.c), with a warning. */
  if (!fleet) {
    struct stream_s {
      cli_file_id_t id;
      int arg;
    } streams[16];
    int nstreams = 0;
    for (int i = optind; i < argc && nstreams < 16; i++) {
      cli_file_id_t id;
      if (!cli_file_id(argv[i], &id) || !cli_file_id_stream(&id)) continue;
      for (int k = 0; k < nstreams; k++)
        if (cli_file_id_same(&streams[k].id, &id)) {
          char msg[1024];
          snprintf(msg, sizeof msg,
                   "'%s' and '%s' are the same %s, which can be read only "
                   "once: give it for one FILE",
                   argv[streams[k].arg], argv[i],
                   S_ISFIFO(id.mode) ? "pipe" : "stream");
          return cli_usage_error(c->name, msg);
        }
      streams[nstreams++] = (struct stream_s){id, i};
    }
  }
  if (c->output != NULL) {
    /* "-o -": standard output (as "-" for an input is standard input),
     * written through the descriptor link (base/outpath.c). */
    const char *given = *c->output;
    if (*c->output != NULL && strcmp(*c->output, "-") == 0)
      *c->output = "/dev/stdout";
    /* The file owns standard output then: the command's report (text or
     * --json) goes to standard error, so that a pipe gets the file alone.
     * The file is written to a duplicate of the original descriptor. */
    if (*c->output != NULL && (strcmp(*c->output, "/dev/stdout") == 0 ||
                               strcmp(*c->output, "/dev/fd/1") == 0 ||
                               strcmp(*c->output, "/proc/self/fd/1") == 0)) {
      /* said of standard output, before the duplicate (whose /dev/fd/N
       * name the user never gave) exists */
      int fl = fcntl(STDOUT_FILENO, F_GETFL);
      if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY) {
        fprintf(stderr, "memsnap %s: cannot write standard output: it is "
                "%s\n", c->name,
                fl < 0 ? "closed" : "open for reading only");
        return CLI_UNUSABLE;
      }
      fflush(stdout);
      int fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
      if (fd >= 0 && dup2(STDERR_FILENO, STDOUT_FILENO) >= 0) {
        snprintf(cli_stdout_kept, sizeof cli_stdout_kept, "/dev/fd/%d", fd);
        cli_stdout_given = given;
        *c->output = cli_stdout_kept;
      } else if (fd >= 0) {
        close(fd);
      }
    }
    const char *out = *c->output;
    if (out == NULL && c->output_msg != NULL)
      return cli_usage_error(c->name, c->output_msg);
    if (out != NULL &&
        cli_check_output(c->name, out, argv + optind, nfiles) != CLI_OK)
      return CLI_UNUSABLE;
  }
  *first = optind;
  if (load != NULL &&
      cli_load_ex(argv[optind], load, c->skip_stacks) != CLI_OK) {
    if (c->json != NULL && *c->json)
      cli_json_unusable(argv[optind], NULL);
    return CLI_UNUSABLE;
  }
  return CLI_CONTINUE;
}
