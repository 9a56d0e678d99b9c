/* cmd_run.c - `hotmoe run` (placeholder until its module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_run(int argc, char **argv) { fprintf(stderr, "run: not built yet\n"); return 1; }
