/* bench.c - placeholder replaced below */
#include "cli/cli.h"
int cli_bench(int argc, char **argv) { return 2; }
