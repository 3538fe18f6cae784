#include "cli.h"
int cli_cmd_diff(int argc, char **argv) { (void)argc; (void)argv; cli_err("diff: not written yet"); return CLI_UNUSABLE; }
