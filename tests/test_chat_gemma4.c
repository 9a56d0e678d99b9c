/* test_chat_gemma4.c - the Gemma 4 chat template, hand-derived from google/gemma-4-31B-it's
 * chat_template.jinja (llama.cpp models/templates/google-gemma-4-31B-it.jinja) for plain
 * conversations with enable_thinking unset: system turn, user/model turns, the thinking channel
 * stripped from model turns, consecutive assistant messages in one model turn, and the generation
 * prompt with its empty thought channel. */
#include <stdlib.h>
#include <string.h>

#include "hotmoe.h"
#include "test.h"

/* enough of the real template for detection */
static const char *TMPL = "{{- bos_token -}}{%- if messages[0]['role'] in ['system', 'developer'] -%}"
                          "{{- '<|turn>system\\n' -}}...{{- '<turn|>\\n' -}}";

static void expect(const hm_chat_msg *m, size_t n, bool gen, const char *want) {
    hm_chat_opts o = {.add_generation_prompt = gen};
    char *out = NULL;
    hm_err err = {{0}};
    CHECKF(hm_chat_apply(TMPL, m, n, &o, &out, &err) == HM_OK, "%s", err.msg);
    CHECKF(out && strcmp(out, want) == 0, "got [%s]\nwant [%s]", out ? out : "(null)", want);
    free(out);
}

int main(void) {
    CHECK(hm_chat_template_name(TMPL) && strcmp(hm_chat_template_name(TMPL), "gemma4") == 0);

    hm_chat_msg a[] = {{"system", "  Be brief.\n"}, {"user", "Hi "}, {"assistant", "Hello"}, {"user", "Bye"}};
    expect(a, 4, true,
           "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello<turn|>\n"
           "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
    expect(a + 1, 1, false, "<|turn>user\nHi<turn|>\n");

    /* the thinking channel of a model turn is dropped, the rest trimmed */
    hm_chat_msg b[] = {{"user", "Q"}, {"assistant", "<|channel>thought\nhmm<channel|>\n The answer. "}};
    expect(b, 2, false, "<|turn>user\nQ<turn|>\n<|turn>model\nThe answer.<turn|>\n");

    /* two assistant messages in a row (a tool message between them is skipped): one model turn */
    hm_chat_msg c[] = {{"user", "Q"}, {"assistant", "A1"}, {"tool", "r"}, {"assistant", "A2"}};
    expect(c, 4, false, "<|turn>user\nQ<turn|>\n<|turn>model\nA1<turn|>\nA2<turn|>\n");

    /* developer counts as the system turn; no system turn without one */
    hm_chat_msg d[] = {{"developer", "D"}, {"user", "U"}};
    expect(d, 2, true, "<|turn>system\nD<turn|>\n<|turn>user\nU<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
    expect(d + 1, 1, true, "<|turn>user\nU<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
    return test_done();
}
