/* cmd_tokenize.c - `hotmoe tokenize` (placeholder until its module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_tokenize(int argc, char **argv) { fprintf(stderr, "tokenize: not built yet\n"); return 1; }
