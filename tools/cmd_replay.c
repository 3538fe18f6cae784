#include "cli.h"
int cli_cmd_replay(int argc, char **argv) { (void)argc; (void)argv; cli_err("replay: not written yet"); return CLI_UNUSABLE; }
