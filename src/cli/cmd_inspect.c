/* cmd_inspect.c - `hotmoe inspect` (placeholder until the inspect module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_inspect(int argc, char **argv) { fprintf(stderr, "inspect: not built yet\n"); return 1; }
