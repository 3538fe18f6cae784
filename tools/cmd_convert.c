#include "cli.h"
int cli_cmd_convert(int argc, char **argv) { (void)argc; (void)argv; cli_err("convert: not written yet"); return CLI_UNUSABLE; }
