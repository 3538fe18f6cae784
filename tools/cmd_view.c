#include "cli.h"
int cli_cmd_view(int argc, char **argv) { (void)argc; (void)argv; cli_err("view: not written yet"); return CLI_UNUSABLE; }
