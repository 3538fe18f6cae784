/*
 * memsnap.c -- the `memsnap` command-line tool: dispatch to one command
 * per file (cmd_*.c).  Every command parses its own options with
 * getopt_long, has --help, and --json where it reports; exit codes are
 * 0 ok, 1 finding, 2 unusable input (cli.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct cli_command_s {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *what;
} cli_command_t;

static const cli_command_t commands[] = {
    {"check", cli_cmd_check, "check files against the snapshot schema"},
    {"summary", cli_cmd_summary, "per-device memory figures of a snapshot"},
    {"diff", cli_cmd_diff, "what changed between two snapshots"},
    {"leaks", cli_cmd_leaks,
     "sites whose live memory grows step after step"},
    {"fleet", cli_cmd_fleet, "per-rank table and outliers of many files"},
    {"replay", cli_cmd_replay,
     "re-run the recorded allocations through memsnap's allocator"},
    {"view", cli_cmd_view, "write a self-contained HTML viewer"},
    {"plot", cli_cmd_plot, "write the active-memory timeline as SVG"},
    {"convert", cli_cmd_convert,
     "rewrite any generation as a current pickle or JSON"},
    {"demo-train", cli_cmd_demo_train,
     "record a snapshot of a simulated training loop"},
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: memsnap COMMAND [OPTIONS] ARGS...\n"
          "\n"
          "Inspect PyTorch / torch_npu memory snapshots (the pickles of\n"
          "torch.cuda.memory._dump_snapshot) and replay them through\n"
          "memsnap's caching allocator.\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    fprintf(f, "  %-11s %s\n", commands[i].name, commands[i].what);
  fprintf(f,
          "\nEvery command takes --help; --json gives machine-readable "
          "output\n(a FILE that cannot be read: {file, usable: false, "
          "error}).\nExit status: 0 ok, 1 finding (violation, leak, "
          "mismatch), 2 unusable input.\n");
}

/*
 * A command's stdout may be a full disk or a closed pipe: flush it and
 * turn a write error into exit 2 with the reason, never a silent 0.
 */
static int check_stdout(int rc) {
  int e = errno; /* a failed flush earlier in the command left its errno */
  errno = 0;
  int bad = fflush(stdout) != 0;
  if (bad && errno)
    e = errno;
  if (bad || ferror(stdout)) {
    cli_write_failed(NULL, "", e ? msnap__errno_code(e) : MSNAP_EIO,
                     e ? strerror(e) : "");
    return CLI_UNUSABLE;
  }
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_UNUSABLE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    if (!strcmp(cmd, "help") && argc > 2) {
      char *sub[] = {argv[2], (char *)"--help", NULL};
      for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(commands[i].name, argv[2]))
          return check_stdout(commands[i].fn(2, sub));
      /* `help bogus` as `bogus`: an unknown command (help's own names
       * give the usage) */
      if (strcmp(argv[2], "help") && strcmp(argv[2], "--help") &&
          strcmp(argv[2], "-h")) {
        fprintf(stderr, "memsnap: unknown command '%s'\n\n",
                cli_shown(argv[2]));
        usage(stderr);
        return CLI_UNUSABLE;
      }
    }
    usage(stdout);
    return check_stdout(CLI_OK);
  }
  if (!strcmp(cmd, "--version")) {
    printf("memsnap %s\n", MSNAP_VERSION_STRING);
    return check_stdout(CLI_OK);
  }
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (!strcmp(commands[i].name, cmd)) {
      /* getopt names argv[0] in its messages: "memsnap CMD: ..." */
      char prog[64];
      snprintf(prog, sizeof prog, "memsnap %s", cmd);
      argv[1] = prog;
      return check_stdout(commands[i].fn(argc - 1, argv + 1));
    }
  fprintf(stderr, "memsnap: unknown command '%s'\n\n", cli_shown(cmd));
  usage(stderr);
  return CLI_UNUSABLE;
}
