/* srv_api.c - the endpoints: OpenAI's /v1/completions, /v1/chat/completions, /v1/models;
 * llama-server's /health, /props, /slots, /metrics; hotmoe's /experts, /experts/policy and
 * /profile/save.
 *
 * A completion request is checked field by field (type, range) and turned into an srv_task here,
 * on the connection thread: tokenizing and templating never touch the engine thread. Every
 * rejection is an OpenAI error object with the field in "param". */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

void srv_reply_json(srv_reply *r, unsigned status, json_t *j) {
    r->status = status;
    r->content_type = "application/json";
    r->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    r->body_len = r->body ? strlen(r->body) : 0;
    json_decref(j);
    if (!r->body) { /* out of memory: still answer */
        r->status = 500;
        r->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":null}}");
        r->body_len = r->body ? strlen(r->body) : 0;
    }
}

void srv_reply_error(srv_reply *r, unsigned status, const char *message, const char *type, const char *param,
                     const char *code) {
    srv_reply_json(r, status, srv_error_json(message, type, param, code));
}

static void reply_text(srv_reply *r, unsigned status, const char *ctype, srv_buf *b) {
    r->status = status;
    r->content_type = ctype;
    r->body = b->p ? b->p : strdup("");
    r->body_len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- request checking ---- */

typedef struct bad {
    char msg[384];
    const char *param;
    const char *code;
    unsigned status;
} bad;

static bool fail(bad *b, unsigned status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static bool fail(bad *b, unsigned status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof b->msg) srv_utf8_trim(b->msg); /* cut: not in the middle of a character */
    b->param = param;
    b->code = code;
    b->status = status;
    return false;
}

/* Optional number field in [lo, hi]; null = absent. */
static bool get_num(json_t *req, const char *key, double lo, double hi, double *out, bad *b) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return fail(b, 400, key, "invalid_type", "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return fail(b, 400, key, "invalid_value", "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return true;
}

static bool get_int(json_t *req, const char *key, json_int_t lo, json_int_t hi, json_int_t *out, bool *present, bad *b) {
    json_t *v = json_object_get(req, key);
    if (present) *present = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return fail(b, 400, key, "invalid_type", "'%s' must be an integer", key);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return fail(b, 400, key, "invalid_value", "'%s' must be in [%lld, %lld], got %lld", key, (long long)lo,
                    (long long)hi, (long long)i);
    *out = i;
    if (present) *present = true;
    return true;
}

static bool get_bool(json_t *req, const char *key, bool *out, bad *b) {
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return fail(b, 400, key, "invalid_type", "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

static bool add_stop(srv_task *t, const char *s, bad *b) {
    if (!*s) return true; /* an empty stop string would stop before anything; ignore it */
    if (t->n_stop == SRV_MAX_STOP) return fail(b, 400, "stop", "invalid_value", "at most %d stop strings", SRV_MAX_STOP);
    if (strlen(s) > 256) return fail(b, 400, "stop", "invalid_value", "a stop string is at most 256 bytes");
    if (!(t->stop[t->n_stop] = strdup(s))) return fail(b, 500, NULL, NULL, "out of memory");
    t->n_stop++;
    return true;
}

/* The sampling and length fields shared by both completion endpoints. */
static bool parse_common(srv_api *a, json_t *req, srv_task *t, bad *b) {
    /* One model is loaded: whatever name the client sends (its own default, another provider's
     * model) is served by it, and the answer says which model that was (a->model_id). */
    json_t *model = json_object_get(req, "model");
    if (model && !json_is_null(model) && !json_is_string(model))
        return fail(b, 400, "model", "invalid_type", "'model' must be a string");
    json_int_t n = 1;
    if (!get_int(req, "n", 1, 1, &n, NULL, b)) return false;
    if (!get_bool(req, "stream", &t->stream, b)) return false;
    if (!get_bool(req, "ignore_eos", &t->ignore_eos, b)) return false;
    json_t *so = json_object_get(req, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return fail(b, 400, "stream_options", "invalid_type", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &t->include_usage, b)) return false;
    }
    hm_sampler_opts_default(&t->sampling);
    t->sampling.temp = 1.0f; /* OpenAI's defaults: temperature 1, top_p 1, no top-k / min-p */
    t->sampling.top_p = 1.0f;
    t->sampling.top_k = 0;
    t->sampling.min_p = 0.0f;
    double d;
    d = t->sampling.temp;
    if (!get_num(req, "temperature", 0, 2, &d, b)) return false;
    t->sampling.temp = (float)d;
    d = t->sampling.top_p;
    if (!get_num(req, "top_p", 0, 1, &d, b)) return false;
    t->sampling.top_p = (float)d;
    d = t->sampling.min_p;
    if (!get_num(req, "min_p", 0, 1, &d, b)) return false;
    t->sampling.min_p = (float)d;
    d = t->sampling.repeat_penalty;
    if (!get_num(req, "repeat_penalty", 0, 10, &d, b)) return false;
    t->sampling.repeat_penalty = (float)d;
    json_int_t i = 0;
    if (!get_int(req, "top_k", 0, 1 << 30, &i, NULL, b)) return false;
    t->sampling.top_k = (int32_t)i;
    bool has_seed = false;
    json_int_t seed = 0;
    if (!get_int(req, "seed", INT64_MIN, INT64_MAX, &seed, &has_seed, b)) return false;
    if (has_seed) t->sampling.seed = (uint64_t)seed;
    else t->sampling.seed = (uint64_t)srv_now() * 1000003u ^ (uint64_t)(uintptr_t)t;
    json_int_t mt = 0;
    bool has_mt = false;
    if (!get_int(req, "max_tokens", 1, 1 << 30, &mt, &has_mt, b)) return false;
    if (!has_mt && !get_int(req, "max_completion_tokens", 1, 1 << 30, &mt, &has_mt, b)) return false;
    t->max_tokens = has_mt ? (int32_t)mt : a->n_ctx;
    /* llama-server's per-request speculative decoding fields (used when the server speculates) */
    bool has_sp = false;
    json_int_t sn = 0;
    if (!get_int(req, "speculative.n_max", 1, 1024, &sn, &has_sp, b)) return false;
    t->spec_n_max = has_sp ? (int32_t)sn : -1;
    if (!get_int(req, "speculative.n_min", 0, 1024, &sn, &has_sp, b)) return false;
    t->spec_n_min = has_sp ? (int32_t)sn : -1;
    d = -1;
    if (!get_num(req, "speculative.p_min", 0, 1, &d, b)) return false;
    t->spec_p_min = (float)d;
    json_t *stop = json_object_get(req, "stop");
    if (stop && !json_is_null(stop)) {
        if (json_is_string(stop)) {
            if (!add_stop(t, json_string_value(stop), b)) return false;
        } else if (json_is_array(stop)) {
            size_t k;
            json_t *v;
            json_array_foreach(stop, k, v) {
                if (!json_is_string(v)) return fail(b, 400, "stop", "invalid_type", "'stop' items must be strings");
                if (!add_stop(t, json_string_value(v), b)) return false;
            }
        } else {
            return fail(b, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings");
        }
    }
    return true;
}

static bool tokenize_text(srv_api *a, const char *text, srv_task *t, bad *b) {
    hm_tokenize_opts o;
    hm_tokenize_opts_default(a->tok, &o);
    int32_t *ids = NULL;
    size_t n = 0;
    hm_err err = {{0}};
    if (hm_tokenize(a->tok, text, strlen(text), &o, &ids, &n, &err) != HM_OK) return fail(b, 500, NULL, NULL, "%s", err.msg);
    t->prompt = ids;
    t->n_prompt = (int32_t)(n > INT32_MAX ? INT32_MAX : n);
    return true;
}

static bool parse_prompt(srv_api *a, json_t *req, srv_task *t, bad *b) {
    json_t *p = json_object_get(req, "prompt");
    if (!p || json_is_null(p)) return fail(b, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) return tokenize_text(a, json_string_value(p), t, b);
    if (!json_is_array(p))
        return fail(b, 400, "prompt", "invalid_type", "'prompt' must be a string, or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0) return fail(b, 400, "prompt", "invalid_value", "'prompt' is empty");
    if (n > (size_t)a->n_ctx)
        return fail(b, 400, "prompt", "context_length_exceeded",
                    "the prompt has %zu tokens; this server's context is %d tokens", n, a->n_ctx);
    if (!(t->prompt = malloc(n * sizeof(int32_t)))) return fail(b, 500, NULL, NULL, "out of memory");
    int32_t n_vocab = a->info->n_vocab;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v))
            return fail(b, 400, "prompt", "invalid_type",
                        "'prompt' must be a string, or an array of token ids (one string only: n = 1)");
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= n_vocab)
            return fail(b, 400, "prompt", "invalid_value", "token id %lld outside the vocabulary [0, %d)", (long long)id, n_vocab);
        t->prompt[i] = (int32_t)id;
    }
    t->n_prompt = (int32_t)n;
    return true;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts (joined). */
static bool content_text(json_t *c, srv_buf *out, bad *b) {
    if (!c || json_is_null(c)) return srv_buf_add(out, "", 0);
    if (json_is_string(c)) return srv_buf_str(out, json_string_value(c));
    if (!json_is_array(c))
        return fail(b, 400, "messages", "invalid_type", "message content must be a string or an array of text parts");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0 || !json_is_string(tx))
            return fail(b, 400, "messages", "invalid_value", "only text content parts are supported");
        srv_buf_str(out, json_string_value(tx));
    }
    srv_buf_add(out, "", 0);
    return true;
}

static bool parse_messages(srv_api *a, json_t *req, srv_task *t, bad *b) {
    json_t *ms = json_object_get(req, "messages");
    if (!ms || json_is_null(ms)) return fail(b, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return fail(b, 400, "messages", "invalid_type", "'messages' must be a non-empty array");
    if (!a->chat_template)
        return fail(b, 400, "messages", "chat_template_missing",
                    "this model has no chat template; start the server with --chat-template chatml, or use "
                    "/v1/completions");
    size_t n = json_array_size(ms);
    hm_chat_msg *msgs = calloc(n, sizeof *msgs);
    srv_buf *texts = calloc(n, sizeof *texts);
    bool ok = msgs && texts;
    if (!ok) fail(b, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; ok && i < n; i++) {
        json_t *m = json_array_get(ms, i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role)) {
            ok = fail(b, 400, "messages", "invalid_type", "messages[%zu] must be an object with a string 'role'", i);
            break;
        }
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") &&
            strcmp(r, "developer")) {
            char shown[160];
            srv_text(shown, sizeof shown, r, strlen(r), 64);
            ok = fail(b, 400, "messages", "invalid_value",
                      "messages[%zu].role '%s' is not system/user/assistant/tool", i, shown);
            break;
        }
        msgs[i].role = strcmp(r, "developer") == 0 ? "system" : r;
        if (!(ok = content_text(json_object_get(m, "content"), &texts[i], b))) break;
        msgs[i].content = texts[i].p ? texts[i].p : "";
    }
    char *prompt = NULL;
    if (ok) {
        hm_chat_opts co = {.add_generation_prompt = true};
        hm_err err = {{0}};
        if (hm_chat_apply(a->chat_template, msgs, n, &co, &prompt, &err) != HM_OK)
            ok = fail(b, 400, "messages", "chat_template_error", "%s", err.msg);
    }
    if (ok) ok = tokenize_text(a, prompt, t, b);
    /* gpt-oss: the analysis channel is reasoning_content, not content, unless the request asks
     * for the raw text (llama-server's reasoning_format "none") */
    json_t *rf = json_object_get(req, "reasoning_format");
    const char *rfs = json_string_value(rf);
    if (ok && rf && !json_is_null(rf) &&
        (!rfs || (strcmp(rfs, "none") && strcmp(rfs, "auto") && strcmp(rfs, "deepseek") && strcmp(rfs, "deepseek-legacy"))))
        ok = fail(b, 400, "reasoning_format", "invalid_value", "'reasoning_format' must be none, auto, deepseek or deepseek-legacy");
    if (ok && !(rfs && !strcmp(rfs, "none"))) {
        hm_err err = {{0}};
        if (hm_chat_reply_open(&t->reply, a->chat_template, &err) != HM_OK) ok = fail(b, 500, NULL, NULL, "%s", err.msg);
    }
    free(prompt);
    for (size_t i = 0; texts && i < n; i++) srv_buf_free(&texts[i]);
    free(texts);
    free(msgs);
    return ok;
}

static void random_id(char *out, size_t cap, const char *prefix, const void *salt) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = (uint64_t)(srv_now() * 1e9) ^ (uint64_t)(uintptr_t)salt * 0x9e3779b97f4a7c15ull;
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (int i = 0; i < 24 && n + 1 < cap; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
        out[n++] = al[x % (sizeof al - 1)];
    }
    out[n] = 0;
}

static void handle_completion(srv_api *a, bool chat, const char *body, size_t len, srv_reply *r) {
    json_error_t je;
    json_t *req = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!req) {
        char msg[300];
        snprintf(msg, sizeof msg, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        srv_reply_error(r, 400, msg, "invalid_request_error", NULL, "invalid_json");
        return;
    }
    srv_task *t = srv_task_new();
    bad b = {.status = 400};
    bool ok = t != NULL;
    if (!ok) fail(&b, 500, NULL, NULL, "out of memory");
    if (ok && !json_is_object(req)) ok = fail(&b, 400, NULL, "invalid_type", "the request body must be a JSON object");
    if (ok) t->kind = chat ? SRV_TASK_CHAT : SRV_TASK_COMPLETION;
    if (ok) ok = parse_common(a, req, t, &b);
    if (ok) ok = chat ? parse_messages(a, req, t, &b) : parse_prompt(a, req, t, &b);
    if (ok && t->n_prompt == 0) ok = fail(&b, 400, chat ? "messages" : "prompt", "invalid_value", "the prompt is empty");
    if (ok && t->n_prompt >= a->n_ctx)
        ok = fail(&b, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                  "the prompt has %d tokens; this server's context is %d tokens (at least one must be left to "
                  "generate)", t->n_prompt, a->n_ctx);
    json_decref(req);
    if (!ok) {
        srv_reply_error(r, b.status, b.msg, b.status >= 500 ? "server_error" : "invalid_request_error", b.param, b.code);
        if (t) srv_task_release(a->sched, t);
        return;
    }
    if (t->max_tokens > a->n_ctx - t->n_prompt) t->max_tokens = a->n_ctx - t->n_prompt;
    random_id(t->id, sizeof t->id, chat ? "chatcmpl-" : "cmpl-", t);
    t->created = srv_unix_time();
    srv_sched_submit(a->sched, t);
    if (t->stream) r->stream_task = t;
    else r->wait_task = t;
}

void srv_api_finish_reply(srv_api *a, srv_task *t, srv_reply *r) {
    if (t->finish == SRV_FINISH_ERROR) {
        srv_reply_error(r, 500, t->err[0] ? t->err : "the engine failed", "server_error", NULL, NULL);
        return;
    }
    if (t->finish == SRV_FINISH_CANCEL) {
        srv_reply_error(r, 503, t->err[0] ? t->err : "the request was cancelled", "server_error", NULL, "cancelled");
        return;
    }
    json_t *text = json_stringn(t->text.p ? t->text.p : "", t->text.len);
    if (!text) text = json_string("");
    json_t *choice;
    if (t->kind == SRV_TASK_CHAT) {
        choice = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content", text,
                           "logprobs", "finish_reason", srv_finish_name(t->finish));
        json_t *rc = t->reasoning.len ? json_stringn(t->reasoning.p, t->reasoning.len) : NULL;
        if (choice && rc) json_object_set_new(json_object_get(choice, "message"), "reasoning_content", rc);
    }
    else
        choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text, "logprobs", "finish_reason",
                           srv_finish_name(t->finish));
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:{s:i, s:i, s:i, s:{s:i}}, s:{s:f, s:f}}", "id", t->id,
                          "object", t->kind == SRV_TASK_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)t->created, "model", a->model_id, "system_fingerprint", "hotmoe-" HOTMOE_VERSION,
                          "choices", choice, "usage", "prompt_tokens", (int)t->n_prompt, "completion_tokens",
                          (int)t->n_gen, "total_tokens", (int)(t->n_prompt + t->n_gen),
                          "prompt_tokens_details", "cached_tokens", (int)t->n_cached, "timings", "prompt_ms",
                          t->t_prompt_s * 1e3, "predicted_ms", t->t_gen_s * 1e3);
    srv_reply_json(r, 200, j);
}

/* ---- the other endpoints ---- */

/* A server-side string (a path) as a JSON string whatever its bytes (jansson takes only UTF-8). */
static json_t *shown_json(const char *s) {
    size_t n = strlen(s), cap = 4 * n + 8;
    char *b = malloc(cap);
    if (!b) return NULL;
    srv_text(b, cap, s, n, n);
    json_t *j = json_string(b);
    free(b);
    return j;
}

static json_t *model_json(srv_api *a) {
    const hm_model_info *mi = a->info;
    return json_pack("{s:s, s:s, s:I, s:s, s:{s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I}}", "id", a->model_id, "object",
                     "model", "created", (json_int_t)a->started, "owned_by", "hotmoe", "meta", "arch", mi->arch, "n_vocab",
                     mi->n_vocab, "n_ctx_train", mi->n_ctx_train, "n_layer", mi->n_layer, "n_expert", mi->n_expert,
                     "n_expert_used", mi->n_expert_used, "n_params", (json_int_t)mi->n_params, "size",
                     (json_int_t)mi->file_bytes);
}

static void handle_props(srv_api *a, srv_reply *r) {
    int busy, queued;
    srv_sched_counts(a->sched, &busy, &queued);
    json_t *j = json_pack("{s:{s:i, s:f, s:f, s:i, s:i}, s:i, s:o, s:s?, s:s?, s:s, s:o}", "default_generation_settings",
                          "n_ctx", a->n_ctx, "temperature", 1.0, "top_p", 1.0, "top_k", 0, "n_predict", -1, "total_slots",
                          a->n_slots, "model_path", shown_json(a->model_path), "chat_template", a->chat_template,
                          "chat_template_name",
                          a->chat_template ? hm_chat_template_name(a->chat_template) : NULL, "build_info",
                          "hotmoe " HOTMOE_VERSION, "model", model_json(a));
    srv_reply_json(r, 200, j);
}

typedef struct call_json {
    srv_sched *s;
    json_t *out;
} call_json;

static void experts_on_engine(void *arg) {
    call_json *c = arg;
    c->out = srv_store_experts_json(c->s);
}

typedef struct call_metrics {
    srv_sched *s;
    srv_buf *b;
} call_metrics;

static void metrics_on_engine(void *arg) {
    call_metrics *c = arg;
    srv_store_metrics(c->s, c->b);
}

typedef struct call_status {
    srv_sched *s;
    const char *arg;
    hm_profile_fmt fmt; /* of /profile/save */
    hm_status st;
    hm_err err;
} call_status;

static void profile_on_engine(void *arg) {
    call_status *c = arg;
    c->st = srv_store_profile_save(c->s, c->arg, c->fmt, &c->err);
}

static void policy_on_engine(void *arg) {
    call_status *c = arg;
    c->st = srv_store_set_policy(c->s, c->arg, &c->err);
}

static void reply_status(srv_reply *r, const call_status *c, json_t *ok_body) {
    if (c->st == HM_OK) {
        srv_reply_json(r, 200, ok_body);
        return;
    }
    json_decref(ok_body);
    unsigned code = c->st == HM_ERR_ARG ? 400 : c->st == HM_ERR_UNSUPPORTED ? 501 : 500;
    srv_reply_error(r, code, c->err.msg, code == 400 ? "invalid_request_error" : "server_error", NULL,
                    code == 501 ? "not_implemented" : NULL);
}

static void handle_policy(srv_api *a, const char *body, size_t len, srv_reply *r) {
    json_error_t je;
    json_t *req = json_loadb(body ? body : "", len, 0, &je);
    json_t *p = req ? json_object_get(req, "policy") : NULL;
    if (!req || !json_is_string(p)) {
        srv_reply_error(r, 400, req ? "'policy' must be a string" : "the request body is not valid JSON",
                        "invalid_request_error", req ? "policy" : NULL, req ? "invalid_type" : "invalid_json");
        json_decref(req);
        return;
    }
    call_status c = {.s = a->sched, .arg = json_string_value(p)};
    if (!srv_sched_call(a->sched, policy_on_engine, &c)) {
        c.st = HM_ERR_INTERNAL;
        snprintf(c.err.msg, sizeof c.err.msg, "the server is stopping");
    }
    reply_status(r, &c, json_pack("{s:b, s:s}", "ok", 1, "policy", c.arg));
    json_decref(req);
}

/* POST /profile/save[?format=F]: the server's --profile-out in its --profile-format; another
 * format goes beside it, its name's ".json" replaced by ".F.json" (hotmoe-profile.sglang.json), so
 * one file never changes format under a reader. */
static void handle_profile_save(srv_api *a, const char *format, srv_reply *r) {
    hm_profile_fmt fmt = a->sched->profile_format;
    if (format) {
        int f = hm_profile_fmt_from_name(format);
        if (f < 0) {
            srv_reply_error(r, 400, "format must be hotmoe, seed1 or sglang", "invalid_request_error", "format", NULL);
            return;
        }
        fmt = (hm_profile_fmt)f;
    }
    char path[4200];
    const char *out = a->profile_out;
    if (fmt != a->sched->profile_format) {
        size_t n = strlen(out);
        if (n > 5 && !strcmp(out + n - 5, ".json")) n -= 5;
        if (n + 32 > sizeof path) {
            srv_reply_error(r, 500, "the --profile-out path is too long", "server_error", NULL, NULL);
            return;
        }
        snprintf(path, sizeof path, "%.*s.%s.json", (int)n, out, hm_profile_fmt_name(fmt));
        out = path;
    }
    call_status c = {.s = a->sched, .arg = out, .fmt = fmt};
    if (!srv_sched_call(a->sched, profile_on_engine, &c)) {
        c.st = HM_ERR_INTERNAL;
        snprintf(c.err.msg, sizeof c.err.msg, "the server is stopping");
    }
    reply_status(r, &c, json_pack("{s:b, s:o, s:s}", "ok", 1, "path", shown_json(out), "format",
                                  hm_profile_fmt_name(fmt)));
}

void srv_api_handle(srv_api *a, const char *method, const char *path, const char *format, const char *body,
                    size_t len, srv_reply *r) {
    /* HEAD is GET without the body (monitors and load balancers use it); libmicrohttpd drops the
     * body of a HEAD answer and keeps its headers. */
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(path, "/health")) {
        if (!get) goto bad_method;
        srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
    } else if (!strcmp(path, "/v1/models") || !strcmp(path, "/models")) {
        if (!get) goto bad_method;
        srv_reply_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(a)));
    } else if (!strcmp(path, "/v1/completions") || !strcmp(path, "/completions")) {
        if (!post) goto bad_method;
        handle_completion(a, false, body, len, r);
    } else if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/chat/completions")) {
        if (!post) goto bad_method;
        handle_completion(a, true, body, len, r);
    } else if (!strcmp(path, "/props")) {
        if (!get) goto bad_method;
        handle_props(a, r);
    } else if (!strcmp(path, "/slots")) {
        if (!get) goto bad_method;
        srv_reply_json(r, 200, srv_sched_slots_json(a->sched));
    } else if (!strcmp(path, "/metrics")) {
        if (!get) goto bad_method;
        srv_buf b = {0};
        srv_sched_metrics(a->sched, &b);
        call_metrics cm = {.s = a->sched, .b = &b}; /* the store is read between steps */
        srv_sched_call(a->sched, metrics_on_engine, &cm);
        reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
    } else if (!strcmp(path, "/experts")) {
        if (!get) goto bad_method;
        call_json c = {.s = a->sched};
        if (!srv_sched_call(a->sched, experts_on_engine, &c) || !c.out)
            srv_reply_error(r, 503, "the server is stopping", "server_error", NULL, NULL);
        else srv_reply_json(r, 200, c.out);
    } else if (!strcmp(path, "/experts/policy")) {
        if (!post) goto bad_method;
        handle_policy(a, body, len, r);
    } else if (!strcmp(path, "/profile/save")) {
        if (!post) goto bad_method;
        handle_profile_save(a, format, r);
    } else {
        char shown[600], msg[700];
        srv_text(shown, sizeof shown, path, strlen(path), 200);
        snprintf(msg, sizeof msg, "no endpoint %s", shown);
        srv_reply_error(r, 404, msg, "invalid_request_error", NULL, "not_found");
    }
    return;
bad_method: {
    char shown_m[160], shown_p[600], msg[800];
    srv_text(shown_m, sizeof shown_m, method, strlen(method), 32);
    srv_text(shown_p, sizeof shown_p, path, strlen(path), 200);
    snprintf(msg, sizeof msg, "%s is not allowed on %s", shown_m, shown_p);
    srv_reply_error(r, 405, msg, "invalid_request_error", NULL, "method_not_allowed");
}
}
