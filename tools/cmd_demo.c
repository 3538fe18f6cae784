#include "cli.h"
int cli_cmd_demo_train(int argc, char **argv) { (void)argc; (void)argv; cli_err("demo: not written yet"); return CLI_UNUSABLE; }
