/* cmd_bench.c - `hotmoe bench` (placeholder until its module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_bench(int argc, char **argv) { fprintf(stderr, "bench: not built yet\n"); return 1; }
