/* cmd_synth.c - `hotmoe synth` (placeholder until the synth module lands). */
#include <stdio.h>
#include "cli.h"
int hm_cmd_synth(int argc, char **argv) { fprintf(stderr, "synth: not built yet\n"); return 1; }
