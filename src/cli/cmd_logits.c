/* cmd_logits.c - `hotmoe logits` (placeholder until its module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_logits(int argc, char **argv) { fprintf(stderr, "logits: not built yet\n"); return 1; }
