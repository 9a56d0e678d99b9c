/* cmd_perplexity.c - `hotmoe perplexity` (placeholder until its module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_perplexity(int argc, char **argv) { fprintf(stderr, "perplexity: not built yet\n"); return 1; }
