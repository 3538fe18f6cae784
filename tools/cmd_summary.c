#include "cli.h"
int cli_cmd_summary(int argc, char **argv) { (void)argc; (void)argv; cli_err("summary: not written yet"); return CLI_UNUSABLE; }
