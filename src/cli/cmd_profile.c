/* cmd_profile.c - `hotmoe profile`: run a workload only to record which experts it routes to.
 *
 * Each non-empty line of the prompts file is one prompt: in a fresh context it is evaluated
 * (prefill), then N tokens are decoded greedily, one at a time (decode steps), so the profile has
 * the prompt/decode split of real use. Nothing is printed on stdout; progress goes to stderr.
 * The usage profile (and the trace, with --trace-out) covers every prompt; it is written
 * atomically at the end. A prompt longer than the context keeps its first n_ctx - N tokens.
 *
 * With a profile instead of prompts (-i / --profile FILE --export FMT -o OUT) nothing runs: the
 * profile is converted between formats (ours, the seed-1 fork's, SGLang's logical_count), checked
 * against the model's layers and experts when -m is given (docs/CLUSTER.md). */
#include <time.h>

#include "cmd_engine.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe profile -m MODEL -f PROMPTS.txt -o PROFILE.json [--format hotmoe|seed1|sglang] [-n N]\n"
               "       hotmoe profile -i PROFILE.json --export hotmoe|seed1|sglang -o OUT.json [-m MODEL]\n\n"
               "Runs each line of PROMPTS.txt (prefill + N greedy decode tokens) and writes how often each\n"
               "expert unit was routed: the input of `--profile`, `hotmoe plan --profile`, the seed-1 fork and\n"
               "(--format sglang) SGLang's --init-expert-location. With -i instead of -f it runs nothing: it\n"
               "converts a profile (any format --profile reads) to --export's format (docs/CLUSTER.md).\n\n"
               "  -f, --file FILE        prompts, one per line (empty lines are skipped)\n"
               "  -o, --output FILE      the profile to write (same as --profile-out)\n"
               "  --format F             hotmoe (default), seed1 or sglang (same as --profile-format)\n"
               "  -i, --input FILE       a profile to convert (also --profile FILE); -m checks its shape\n"
               "  --export F             the format to convert to (hotmoe, seed1, sglang)\n"
               "  -n, --n-predict N      tokens decoded after each prompt (default 64; 0 = prefill only)\n"
               "  -c, --ctx-size N       context positions (default: min(trained context, 4096))\n" CLI_ENGINE_HELP);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* -i IN --export FMT -o OUT: a conversion; with -m the model's layers and experts are checked. */
static int convert(cli_engine *e, const char *input) {
    if (!e->profile_out) {
        fprintf(stderr, "hotmoe profile: need where to write the converted profile (-o FILE)\n");
        return 2;
    }
    hm_err err = {{0}};
    int32_t n_layer = 0, n_expert = 0;
    if (e->model) {
        e->place.profile = NULL; /* the model only gives the shape: no placement from the input */
        hm_model *m = cli_open_model(e);
        if (!m) return 1;
        hm_usage u;
        hm_status st = hm_model_usage(m, &u, &err);
        hm_model_close(m);
        if (st != HM_OK) {
            fprintf(stderr, "hotmoe profile: %s: %s\n", e->model, err.msg);
            return 1;
        }
        n_layer = u.n_layer, n_expert = u.n_expert;
        hm_usage_free(&u);
    }
    if (hm_profile_convert(input, e->profile_out, e->profile_format, n_layer, n_expert, &err) != HM_OK) {
        fprintf(stderr, "hotmoe profile: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "hotmoe profile: wrote %s (%s)\n", e->profile_out, hm_profile_fmt_name(e->profile_format));
    return 0;
}

int hm_cmd_profile(int argc, char **argv) {
    cli_engine e = {.cmd = "profile"};
    const char *file = NULL, *input = NULL;
    long n_gen = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(e.profile_out = cli_value(e.cmd, argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(a, "--format") || !strcmp(a, "--export")) {
            int f = (v = cli_value(e.cmd, argc, argv, &i)) ? hm_profile_fmt_from_name(v) : -1;
            if (f < 0) {
                fprintf(stderr, "hotmoe profile: %s expects hotmoe, seed1 or sglang\n", a);
                return 2;
            }
            e.profile_format = (hm_profile_fmt)f;
            continue;
        }
        if (!strcmp(a, "-i") || !strcmp(a, "--input")) {
            if (!(input = cli_value(e.cmd, argc, argv, &i))) return 2;
            continue;
        }
        int r = cli_common_arg(&e, argc, argv, &i, usage);
        if (r == CLI_ARG_NEXT) continue;
        if (r != CLI_ARG_OWN) return r;
        if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = cli_value(e.cmd, argc, argv, &i)) || cli_long(e.cmd, a, v, 0, 1 << 20, &n_gen)) return 2;
        } else {
            return cli_unknown_arg(&e, a, usage);
        }
    }
    if (!input && !file && e.place_init && e.place.profile) input = e.place.profile; /* --profile FILE */
    if (input) {
        if (file) {
            fprintf(stderr, "hotmoe profile: give prompts to record (-f) or a profile to convert (-i), not both\n");
            return 2;
        }
        return convert(&e, input);
    }
    if (cli_need_model(&e)) return 2;
    if (!file || !e.profile_out) {
        fprintf(stderr, "hotmoe profile: need the prompts (-f FILE) and where to write the profile (-o FILE)\n");
        return 2;
    }
    char *text = cli_read_file(e.cmd, file, NULL);
    if (!text) return 1;
    int n_prompts = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        for (size_t j = 0; j < len; j++)
            if (p[j] != ' ' && p[j] != '\t' && p[j] != '\r') {
                n_prompts++;
                break;
            }
        p += len + (nl ? 1 : 0);
    }
    if (n_prompts == 0) {
        fprintf(stderr, "hotmoe profile: %s has no prompts (one per line)\n", file);
        free(text);
        return 1;
    }

    hm_err err;
    hm_tokenizer *tk = NULL;
    hm_model *m = NULL;
    hm_session *s = NULL;
    int rc = 1;
    if (hm_tokenizer_open(&tk, e.model, &err) != HM_OK) {
        fprintf(stderr, "hotmoe profile: %s\n", err.msg);
        goto done;
    }
    if (!(m = cli_open_model(&e)) || !(s = cli_open_session(&e, m, e.n_ctx))) goto done;
    if (!hm_model_has_experts(m)) {
        fprintf(stderr, "hotmoe profile: %s has no expert tensors: there is nothing to profile\n", e.model);
        goto done;
    }
    const int32_t n_ctx = hm_session_n_ctx(s), n_vocab = hm_model_n_vocab(m);
    if (n_gen >= n_ctx) {
        fprintf(stderr, "hotmoe profile: -n %ld does not fit the context of %d positions\n", n_gen, n_ctx);
        goto done;
    }
    hm_tokenize_opts to;
    hm_tokenize_opts_default(tk, &to);
    long tot_prompt = 0, tot_gen = 0;
    double t0 = cli_now_s();
    int ip = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char *line = p;
        p += len + (nl ? 1 : 0);
        while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t')) len--;
        size_t lead = 0;
        while (lead < len && (line[lead] == ' ' || line[lead] == '\t')) lead++;
        if (lead == len) continue;
        ip++;
        int32_t *ids = NULL;
        size_t n = 0;
        if (hm_tokenize(tk, line + lead, len - lead, &to, &ids, &n, &err) != HM_OK) {
            fprintf(stderr, "hotmoe profile: prompt %d: %s\n", ip, err.msg);
            goto done;
        }
        size_t room = (size_t)(n_ctx - n_gen);
        if (n > room) {
            fprintf(stderr, "hotmoe profile: prompt %d: %zu tokens, keeping the first %zu (-c %d, -n %ld)\n", ip, n,
                    room, n_ctx, n_gen);
            n = room;
        }
        hm_session_reset(s);
        const float *lg = NULL;
        hm_status st = n ? hm_session_eval(s, ids, (int32_t)n, false, &lg, &err) : HM_OK;
        free(ids);
        long g = 0;
        for (; st == HM_OK && lg && g < n_gen; g++) {
            int32_t tok = argmax(lg, n_vocab);
            st = hm_session_eval(s, &tok, 1, false, &lg, &err);
        }
        if (st != HM_OK) {
            fprintf(stderr, "hotmoe profile: prompt %d: %s\n", ip, err.msg);
            goto done;
        }
        tot_prompt += (long)n;
        tot_gen += g;
        double dt = cli_now_s() - t0;
        fprintf(stderr, "hotmoe profile: [%d/%d] %zu prompt + %ld decoded tokens (%.1f tok/s so far)\n", ip, n_prompts,
                n, g, dt > 0 ? (double)(tot_prompt + tot_gen) / dt : 0.0);
    }
    fprintf(stderr, "hotmoe profile: %d prompts, %ld prompt + %ld decoded tokens in %.1f s\n", n_prompts, tot_prompt,
            tot_gen, cli_now_s() - t0);
    rc = cli_engine_finish(&e, m);
done:
    hm_session_close(s);
    hm_model_close(m);
    hm_tokenizer_close(tk);
    free(text);
    return rc;
}
