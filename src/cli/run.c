/* run.c - placeholder until written */
#include "cli/cli.h"
int cli_run(int argc, char **argv) { return 2; }
