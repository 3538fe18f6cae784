#include "cli.h"
int cli_cmd_plot(int argc, char **argv) { (void)argc; (void)argv; cli_err("plot: not written yet"); return CLI_UNUSABLE; }
