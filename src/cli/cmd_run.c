/* cmd_run.c - `hotmoe run`: generate from a prompt, streaming tokens to stdout, or chat.
 *
 * Plain mode echoes the prompt, then streams the continuation. --chat wraps the prompt as one
 * user turn with the model's chat template; -i keeps chatting: each line from stdin is a new
 * user turn appended to the same context (the KV cache is kept between turns). Generation stops
 * at an end-of-generation token, after -n tokens, or when the context is full (said on stderr).
 * A prompt that does not fit the context (-c), or one that gives no tokens (empty, and no BOS),
 * is an error saying which; nothing is generated.
 * Speed (prompt and generation tok/s) goes to stderr at the end. */
#include <time.h>

#include "cli_pp.h"
#include "cli_spec.h"

static void usage(FILE *f) {
    fprintf(f, "usage: hotmoe run -m MODEL (-p PROMPT | -f FILE) [options]\n\n"
               "  -p, --prompt TEXT      prompt\n"
               "  -f, --file FILE        read the prompt from a file\n"
               "  -n, --n-predict N      tokens to generate (default 256; -1 = until the end or a full context)\n"
               "  -c, --ctx-size N       context positions (default: min(trained context, 4096))\n"
               "  --chat                 apply the model's chat template to the prompt\n"
               "  -i, --interactive      chat: read further user turns from stdin (implies --chat)\n"
               "  --no-think             Qwen3: answer without a thinking block\n"
               "  --temp T               temperature (default 0.8; 0 = greedy)\n"
               "  --top-k N              (default 40; 0 = off)\n"
               "  --top-p P              (default 0.95; 1 = off)\n"
               "  --min-p P              (default 0.05; 0 = off)\n"
               "  --repeat-penalty X     (default 1.0 = off)\n"
               "  --repeat-last-n N      tokens the penalty looks back over (default 64)\n"
               "  --seed N               sampling seed (default: from the clock)\n" CLI_SPEC_HELP CLI_PP_HELP
               CLI_ENGINE_HELP);
}

typedef struct run_ctx {
    hm_tokenizer *tk;
    hm_model *m;
    hm_session *s;
    hm_sampler *smp;
    hm_detok *dt;
    hm_spec *spec; /* NULL without --spec-type */
    cli_pp *pp;    /* the prompt-processing flags (its model NULL without --prompt-processing-model) */
    long n_predict;
    bool chat, no_think;
    bool turn_closed; /* the last generation ended with an end-of-generation token */
    hm_chat_reply *reply; /* chat with gpt-oss's Harmony: the turn's reply split by channel; NULL = as is */
    /* totals */
    long n_prompt, n_gen;
    double t_prompt, t_gen;
} run_ctx;

/* Print generated text: as it is, or (Harmony) the content to stdout and the analysis channel's
 * reasoning to stderr, the channel markers dropped. final: the turn's text ends here. */
static void put_text(run_ctx *r, const char *s, size_t len, bool final) {
    hm_chat_reply_part p;
    hm_err err;
    if (!r->reply || hm_chat_reply_push(r->reply, s, len, final, &p, &err) != HM_OK) {
        fwrite(s, 1, len, stdout);
    } else {
        fwrite(p.reasoning, 1, p.n_reasoning, stderr);
        fwrite(p.content, 1, p.n_content, stdout);
    }
    fflush(stdout);
}

/* Print tok unless it ends the generation; true when it does. */
static bool emit(run_ctx *r, int32_t tok) {
    const bool eog = hm_tokenizer_is_eog(r->tk, tok);
    if (!eog) {
        size_t len;
        const char *piece = hm_detok_push(r->dt, tok, &len);
        put_text(r, piece, len, false);
    }
    return eog;
}

/* generate() with speculation: each step verifies the pending token and its draft in one
 * micro-batch and yields the picks; the same tokens as the plain loop, and as there the last token
 * is evaluated too. 0 ok, 1 error (printed). */
static int generate_spec(run_ctx *r, const float *lg) {
    hm_err err;
    if (r->n_predict == 0) return 0;
    int32_t tok = hm_sampler_sample(r->smp, lg), out[1025];
    hm_sampler_accept(r->smp, tok);
    for (long i = 0;;) {
        const bool eog = emit(r, tok);
        i++;
        if (hm_session_n_past(r->s) >= hm_session_n_ctx(r->s)) {
            fprintf(stderr, "\nhotmoe run: context full (%d positions)\n", hm_session_n_ctx(r->s));
            return 0;
        }
        if (eog || (r->n_predict >= 0 && i >= r->n_predict)) {
            if (hm_session_eval(r->s, &tok, 1, false, &lg, &err) != HM_OK ||
                hm_spec_add(r->spec, &tok, 1, &err) != HM_OK)
                goto fail;
            r->n_gen++;
            r->turn_closed = eog;
            return 0;
        }
        long room = r->n_predict < 0 ? 1024 : r->n_predict - i;
        if (room > 1024) room = 1024;
        int32_t n;
        if (hm_spec_step(r->spec, r->smp, tok, (int32_t)room, out, &n, &err) != HM_OK) goto fail;
        r->n_gen += n; /* tok and out[0..n-1) were evaluated; out[n-1] is pending */
        for (int32_t j = 0; j + 1 < n; j++) {
            emit(r, out[j]);
            i++;
        }
        tok = out[n - 1];
    }
fail:
    fprintf(stderr, "\nhotmoe run: %s\n", err.msg);
    return 1;
}

/* Feed text (the next part of the conversation) and generate. 0 ok, 1 error (printed). */
static int turn(run_ctx *r, const char *text, bool first) {
    hm_err err;
    hm_tokenize_opts to;
    hm_tokenize_opts_default(r->tk, &to);
    to.add_bos = first && to.add_bos;
    int32_t *ids = NULL;
    size_t n = 0;
    if (hm_tokenize(r->tk, text, strlen(text), &to, &ids, &n, &err) != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        return 1;
    }
    int32_t room = hm_session_n_ctx(r->s) - hm_session_n_past(r->s);
    if (n == 0) { /* nothing to start from: not a context problem */
        fprintf(stderr, "hotmoe run: the prompt is empty: it gives no tokens (and this model's tokenizer adds no BOS "
                        "token), so there is nothing to continue; give some text with -p or -f\n");
        free(ids);
        return 1;
    }
    if ((size_t)room < n + 1) {
        fprintf(stderr, "hotmoe run: the prompt (%zu tokens) does not fit the context (%d of %d positions free); "
                        "use a larger -c\n", n, room, hm_session_n_ctx(r->s));
        free(ids);
        return 1;
    }
    const float *lg = NULL;
    double t0 = cli_now_s();
    hm_status st = hm_session_prefill(r->s, ids, (int32_t)n, &lg, &err);
    r->t_prompt += cli_now_s() - t0;
    if (st == HM_OK) cli_pp_print(stderr, "run", r->pp, r->s, (long)n);
    r->n_prompt += (long)n;
    for (size_t i = 0; i < n; i++) hm_sampler_accept(r->smp, ids[i]);
    if (st == HM_OK && r->spec) st = hm_spec_add(r->spec, ids, (int32_t)n, &err);
    free(ids);
    if (st != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        return 1;
    }
    t0 = cli_now_s();
    size_t len;
    r->turn_closed = false;
    hm_chat_reply_close(r->reply);
    r->reply = NULL;
    if (r->chat && hm_chat_reply_open(&r->reply, hm_tokenizer_chat_template(r->tk), &err) != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        return 1;
    }
    if (r->spec) {
        int rc = generate_spec(r, lg);
        r->t_gen += cli_now_s() - t0;
        const char *rest = hm_detok_flush(r->dt, &len);
        put_text(r, rest, len, true);
        printf("\n");
        fflush(stdout);
        return rc;
    }
    for (long i = 0; r->n_predict < 0 || i < r->n_predict; i++) {
        int32_t tok = hm_sampler_sample(r->smp, lg);
        hm_sampler_accept(r->smp, tok);
        bool eog = hm_tokenizer_is_eog(r->tk, tok);
        if (!eog) {
            const char *piece = hm_detok_push(r->dt, tok, &len);
            put_text(r, piece, len, false);
        }
        if (hm_session_n_past(r->s) >= hm_session_n_ctx(r->s)) {
            fprintf(stderr, "\nhotmoe run: context full (%d positions)\n", hm_session_n_ctx(r->s));
            break;
        }
        /* the last token is evaluated too, even at the end, so a next chat turn follows it */
        st = hm_session_eval(r->s, &tok, 1, false, &lg, &err);
        r->n_gen++;
        if (st != HM_OK) {
            fprintf(stderr, "\nhotmoe run: %s\n", err.msg);
            return 1;
        }
        if (eog) {
            r->turn_closed = true;
            break;
        }
    }
    r->t_gen += cli_now_s() - t0;
    const char *rest = hm_detok_flush(r->dt, &len);
    put_text(r, rest, len, true);
    printf("\n");
    fflush(stdout);
    return 0;
}

/* The text of one user turn: the template applied to it. After an earlier turn it starts with
 * what closes the previous assistant turn: a newline after ChatML's or Gemma's end token, nothing
 * after DeepSeek's, Harmony's or GLM's; when the turn was cut off by -n or the context, the end
 * token itself too (ChatML's, DeepSeek's, Harmony's <|return|>); and it loses what the template
 * writes once at the start of a conversation (GLM's [gMASK]<sop>). *out malloc'd. */
static int render_user(run_ctx *r, const char *content, bool first, char **out) {
    hm_chat_msg msg = {"user", content};
    hm_chat_opts co = {.add_generation_prompt = true, .no_thinking = r->no_think};
    hm_err err;
    char *txt = NULL;
    if (hm_chat_apply(hm_tokenizer_chat_template(r->tk), &msg, 1, &co, &txt, &err) != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        return 1;
    }
    if (first) {
        *out = txt;
        return 0;
    }
    const char *tmpl = hm_tokenizer_chat_template(r->tk), *name = hm_chat_template_name(tmpl);
    static const struct {
        const char *name, *closed, *cut;
    } closes[] = {{"chatml", "\n", "<|im_end|>\n"},
                  {"deepseek3", "", "<｜end▁of▁sentence｜>"},
                  {"harmony", "", "<|return|>"},
                  {"chatglm4", "", ""}};
    const char *close = "\n";
    for (size_t i = 0; name && i < sizeof closes / sizeof closes[0]; i++)
        if (!strcmp(name, closes[i].name)) close = r->turn_closed ? closes[i].closed : closes[i].cut;
    char *head = NULL; /* what an empty conversation renders: written once, at the start */
    co.add_generation_prompt = false;
    size_t skip = 0;
    if (hm_chat_apply(tmpl, NULL, 0, &co, &head, &err) == HM_OK && strncmp(txt, head, strlen(head)) == 0)
        skip = strlen(head);
    free(head);
    size_t l = strlen(txt + skip), lc = strlen(close);
    *out = malloc(lc + l + 1);
    if (*out) {
        memcpy(*out, close, lc);
        memcpy(*out + lc, txt + skip, l + 1);
    }
    free(txt);
    return *out ? 0 : 1;
}

int hm_cmd_run(int argc, char **argv) {
    cli_engine e = {.cmd = "run"};
    const char *prompt = NULL, *file = NULL;
    bool interactive = false;
    run_ctx r = {.n_predict = 256};
    cli_spec sp = {0};
    cli_pp pp = {0};
    r.pp = &pp;
    hm_sampler_opts so;
    hm_sampler_opts_default(&so);
    so.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        int rr = cli_common_arg(&e, argc, argv, &i, usage);
        if (rr == CLI_ARG_NEXT) continue;
        if (rr != CLI_ARG_OWN) return rr;
        if ((rr = cli_spec_arg(&sp, e.cmd, argc, argv, &i)) == CLI_ARG_NEXT) continue;
        if (rr != CLI_ARG_OWN) return rr;
        if ((rr = cli_pp_arg(&pp, e.cmd, argc, argv, &i)) == CLI_ARG_NEXT) continue;
        if (rr != CLI_ARG_OWN) return rr;
        const char *a = argv[i], *v;
        long n;
        double d;
#define VAL() (v = cli_value(e.cmd, argc, argv, &i))
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_value(e.cmd, argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!VAL() || cli_long(e.cmd, a, v, -1, 1 << 30, &r.n_predict)) return 2;
        } else if (!strcmp(a, "--chat")) {
            r.chat = true;
        } else if (!strcmp(a, "-i") || !strcmp(a, "--interactive")) {
            interactive = r.chat = true;
        } else if (!strcmp(a, "--no-think")) {
            r.no_think = true;
        } else if (!strcmp(a, "--temp")) {
            if (!VAL() || cli_float(e.cmd, a, v, 0, 100, &d)) return 2;
            so.temp = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if (!VAL() || cli_long(e.cmd, a, v, 0, 1 << 30, &n)) return 2;
            so.top_k = (int32_t)n;
        } else if (!strcmp(a, "--top-p")) {
            if (!VAL() || cli_float(e.cmd, a, v, 0, 1, &d)) return 2;
            so.top_p = (float)d;
        } else if (!strcmp(a, "--min-p")) {
            if (!VAL() || cli_float(e.cmd, a, v, 0, 1, &d)) return 2;
            so.min_p = (float)d;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!VAL() || cli_float(e.cmd, a, v, 0.01, 100, &d)) return 2;
            so.repeat_penalty = (float)d;
        } else if (!strcmp(a, "--repeat-last-n")) {
            if (!VAL() || cli_long(e.cmd, a, v, 0, 1 << 20, &n)) return 2;
            so.repeat_last_n = (int32_t)n;
        } else if (!strcmp(a, "--seed")) {
            if (!VAL() || cli_long(e.cmd, a, v, 0, 0x7fffffffL, &n)) return 2;
            so.seed = (uint64_t)n;
        } else {
            return cli_unknown_arg(&e, a, usage);
        }
#undef VAL
    }
    if (cli_need_model(&e) || cli_spec_check(&sp, e.cmd)) return 2;
    if (prompt && file) {
        fprintf(stderr, "hotmoe run: give -p or -f, not both\n");
        return 2;
    }
    if (!prompt && !file && !interactive) {
        fprintf(stderr, "hotmoe run: no prompt (-p TEXT or -f FILE)\n");
        return 2;
    }
    char *file_text = NULL;
    if (file && !(file_text = cli_read_file(e.cmd, file, NULL))) return 1;
    if (file) prompt = file_text;

    hm_err err;
    int rc = 1;
    char *text = NULL;
    if (hm_tokenizer_open(&r.tk, e.model, &err) != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        goto done;
    }
    if (!(r.m = cli_open_model(&e)) || !(r.s = cli_open_session(&e, r.m, e.n_ctx))) goto done;
    if (cli_pp_open_model(&pp, &e, r.m) || cli_pp_attach(&pp, e.cmd, r.s)) goto done;
    if (hm_sampler_open(&r.smp, hm_model_n_vocab(r.m), &so, &err) != HM_OK ||
        hm_detok_open(&r.dt, r.tk, false, &err) != HM_OK) {
        fprintf(stderr, "hotmoe run: %s\n", err.msg);
        goto done;
    }
    if (cli_spec_open(&sp, e.cmd, r.s, r.tk, &r.spec)) goto done;
    bool first = true;
    if (prompt) {
        if (r.chat) {
            if (render_user(&r, prompt, true, &text)) goto done;
        } else {
            fputs(prompt, stdout); /* echo, then the continuation follows it */
            fflush(stdout);
        }
        if (turn(&r, text ? text : prompt, true)) goto done;
        free(text);
        text = NULL;
        first = false;
    }
    if (interactive) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t got;
        for (;;) {
            fprintf(stderr, "> ");
            if ((got = getline(&line, &cap, stdin)) < 0) break;
            while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
            if (got == 0) continue;
            if (render_user(&r, line, first, &text) || turn(&r, text, first)) {
                free(line);
                goto done;
            }
            free(text);
            text = NULL;
            first = false;
        }
        free(line);
    }
    fprintf(stderr, "\nhotmoe run: prompt %ld tokens in %.2f s (%.2f tok/s), generation %ld tokens in %.2f s "
                    "(%.2f tok/s), %d threads\n",
            r.n_prompt, r.t_prompt, r.t_prompt > 0 ? (double)r.n_prompt / r.t_prompt : 0.0, r.n_gen, r.t_gen,
            r.t_gen > 0 ? (double)r.n_gen / r.t_gen : 0.0, hm_session_n_threads(r.s));
    if (r.spec) {
        hm_spec_stats ss;
        hm_spec_get_stats(r.spec, &ss);
        cli_spec_print(stderr, "run", hm_spec_type_name(sp.o.type), &ss);
    }
    {
        cli_tier_snap ts;
        cli_tier_get(r.m, &ts);
        cli_tier_print(stderr, "run", "whole run", NULL, &ts, 0);
    }
    rc = cli_engine_finish(&e, r.m);
done:
    free(text);
    free(file_text);
    hm_detok_close(r.dt);
    hm_chat_reply_close(r.reply);
    hm_sampler_close(r.smp);
    cli_spec_close(&sp, r.spec);
    hm_session_close(r.s);
    cli_pp_close(&pp);
    hm_model_close(r.m);
    hm_tokenizer_close(r.tk);
    return rc;
}
