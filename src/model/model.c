/* model.c - opening a model: map the GGUF, pick the architecture, let it bind its tensors, open
 * its expert store (model_experts.c). Also the helpers every arch uses (hparam keys, tensor
 * binding with shape/type checks, the CPU state's buffers, the CPU forward's KV cache dispatch,
 * last-layer compaction and logits) and the public model getters. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/alloc.h"
#include "exec/moe.h"
#include "quant/quant.h"

extern const hm_arch hm_arch_gemma4; /* gemma4.c */
extern const hm_arch hm_arch_qwen3next; /* qwen35moe.c */
extern const hm_arch hm_arch_deepseek2; /* deepseek2.c */
extern const hm_arch hm_arch_deepseek4; /* deepseek4.c */
extern const hm_arch hm_arch_glm4moe; /* qwen3moe.c: the same layer, a variant row */
extern const hm_arch hm_arch_olmoe;   /* qwen3moe.c */
extern const hm_arch hm_arch_llama;   /* qwen3moe.c: llama with experts (Mixtral) */
extern const hm_arch hm_arch_gptoss;  /* gptoss.c */

static const hm_arch *const archs[] = {
    &hm_arch_qwen3moe,
    &hm_arch_gemma4,
    &hm_arch_qwen35moe,
    &hm_arch_qwen3next,
    &hm_arch_deepseek2,
    &hm_arch_deepseek4,
    &hm_arch_glm4moe,
    &hm_arch_olmoe,
    &hm_arch_llama,
    &hm_arch_gptoss,
};

void hm_model_opts_default(hm_model_opts *o) { memset(o, 0, sizeof *o); }

/* hm_model_opts.share_dense: m's non-expert tensors equal to o's (name, type, shape, bytes) bound to
 * o's mapping before the arch binds them; the pages of m's own copy, read once by the comparison,
 * are dropped from its mapping (the whole pages inside the tensor). */
static void share_dense(hm_model *m, const hm_model *o) {
    const long pg = sysconf(_SC_PAGESIZE);
    const uintptr_t mask = (uintptr_t)(pg > 0 ? pg : 4096) - 1;
    for (int64_t i = 0; i < hm_gguf_n_tensors(m->gguf); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(m->gguf, i), *u = hm_gguf_find_tensor(o->gguf, t->name);
        if (!u || strstr(t->name, "_exps") || t->type != u->type || t->nbytes != u->nbytes ||
            t->n_dims != u->n_dims || memcmp(t->ne, u->ne, sizeof t->ne) || !t->data || !u->data ||
            memcmp(t->data, u->data, t->nbytes))
            continue;
        const uintptr_t a = ((uintptr_t)t->data + mask) & ~mask, b = ((uintptr_t)t->data + t->nbytes) & ~mask;
        if (b > a) (void)madvise((void *)a, (size_t)(b - a), MADV_DONTNEED); /* clean file pages: advice */
        hm_gguf_tensor_alias(m->gguf, i, u->data);
        m->info.shared_bytes += t->nbytes;
        m->info.shared_tensors++;
    }
}

static void copy_str(char *dst, size_t cap, hm_gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

/* After the arch's load (n_vocab = the embedding's rows): the tokenizer's token list must fit
 * the embedding (a longer one gives ids that index past it) and the special ids the engine uses
 * must be token ids; a key that is present but out of range is an error naming it, not a
 * silently dropped id. */
static hm_status check_vocab(hm_model *m, const char *path, hm_err *err) {
    hm_model_info *inf = &m->info;
    hm_gguf_arr toks;
    if (hm_gguf_get_arr(m->gguf, "tokenizer.ggml.tokens", &toks) && toks.n > (uint64_t)inf->n_vocab)
        return hm_errf(err, HM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries but token_embd.weight only %d "
                       "rows", path, (unsigned long long)toks.n, inf->n_vocab);
    static const char *const keys[2] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"};
    int32_t *dst[2] = {&inf->bos_id, &inf->eos_id};
    for (int i = 0; i < 2; i++) {
        int64_t v;
        if (!hm_gguf_get_int(m->gguf, keys[i], &v)) {
            if (hm_gguf_find_key(m->gguf, keys[i]) >= 0)
                return hm_errf(err, HM_ERR_FORMAT, "%s: key %s is not an integer", path, keys[i]);
            continue;
        }
        if (v < 0 || v >= inf->n_vocab)
            return hm_errf(err, HM_ERR_FORMAT, "%s: key %s = %lld is not a token id (the vocabulary has %d)", path,
                           keys[i], (long long)v, inf->n_vocab);
        *dst[i] = (int32_t)v;
    }
    return HM_OK;
}

hm_status hm_model_open(hm_model **out, const char *path, const hm_model_opts *opts, hm_err *err) {
    *out = NULL;
    hm_model_opts o;
    if (opts) o = *opts;
    else hm_model_opts_default(&o);
    hm_model *m = calloc(1, sizeof *m);
    if (!m) return hm_errf(err, HM_ERR_NOMEM, "model: out of memory");
    m->log.level = o.verbose ? HM_LOG_INFO : HM_LOG_WARN;
    hm_status st = HM_OK;
    if (o.rope_scaling && strcmp(o.rope_scaling, "none") && strcmp(o.rope_scaling, "linear") &&
        strcmp(o.rope_scaling, "yarn")) {
        st = hm_errf(err, HM_ERR_ARG, "--rope-scaling %s: takes none, linear or yarn", o.rope_scaling);
        goto fail;
    }
    if (o.rope_scaling) snprintf(m->rope_scaling, sizeof m->rope_scaling, "%s", o.rope_scaling);
    m->rope_scale = o.rope_scale > 0 ? o.rope_scale : 0;
    m->yarn_orig_ctx = o.yarn_orig_ctx > 0 ? o.yarn_orig_ctx : 0;
    st = hm_gguf_open(&m->gguf, path, err);
    if (st != HM_OK) goto fail;

    hm_gguf_str s;
    if (!hm_gguf_get_str(m->gguf, "general.architecture", &s)) {
        st = hm_errf(err, HM_ERR_FORMAT, "%s: no general.architecture key (not a model file?)", path);
        goto fail;
    }
    copy_str(m->arch_name, sizeof m->arch_name, s);
    if (hm_gguf_get_str(m->gguf, "general.name", &s)) copy_str(m->name, sizeof m->name, s);
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i]->name, m->arch_name) == 0) m->arch = archs[i];
    if (!m->arch) {
        char list[256] = "";
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", archs[i]->name);
        st = hm_errf(err, HM_ERR_UNSUPPORTED, "%s: architecture '%s' is not supported (supported: %s)",
                     path, m->arch_name, list);
        goto fail;
    }

    hm_model_info *inf = &m->info;
    inf->arch = m->arch_name;
    inf->name = m->name;
    inf->bos_id = inf->eos_id = -1;
    bool b;
    if (hm_gguf_get_bool(m->gguf, "tokenizer.ggml.add_bos_token", &b)) inf->add_bos = b;
    inf->file_bytes = hm_gguf_file_size(m->gguf);
    for (int64_t i = 0; i < hm_gguf_n_tensors(m->gguf); i++) {
        const hm_gguf_tensor *t = hm_gguf_tensor_at(m->gguf, i);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
        inf->n_params += n;
    }

    if (o.share_dense) share_dense(m, o.share_dense);
    st = m->arch->load(m, err);
    if (st != HM_OK) {
        /* prefix the path once, so messages read "FILE: tensor 'x' ..." */
        if (err) {
            char tmp[sizeof err->msg];
            snprintf(tmp, sizeof tmp, "%s", err->msg);
            hm_errf(err, st, "%s: %s", path, tmp);
        }
        goto fail;
    }
    if ((st = check_vocab(m, path, err)) != HM_OK) goto fail;
    if ((st = hm_model_experts_open(m, o.placement, err)) != HM_OK) goto fail;
    *out = m;
    return HM_OK;
fail:
    hm_model_close(m);
    return st;
}

void hm_model_close(hm_model *m) {
    if (!m) return;
    hm_model_experts_close(m); /* flushes a trace being written */
    if (m->arch && m->impl) m->arch->unload(m);
    hm_gguf_close(m->gguf);
    free(m);
}

const hm_model_info *hm_model_get_info(const hm_model *m) { return &m->info; }
int32_t hm_model_n_vocab(const hm_model *m) { return m->info.n_vocab; }
int32_t hm_model_n_ctx_train(const hm_model *m) { return m->info.n_ctx_train; }
const char *hm_model_arch(const hm_model *m) { return m->arch_name; }

/* ---- load helpers ---- */

/* What each integer hparam may be, by suffix: the values later size an allocation, index a
 * tensor or divide, so a file value outside these is refused at load, naming the key. The caps
 * are far above any real model (and keep products such as 2 * ssm.group_count * ssm.state_size
 * inside int32); keys not listed lie in [0, 2^31). */
static const struct hp_limit {
    const char *suffix;
    int64_t lo, hi;
} hp_int_limits[] = {
    {"context_length", 0, INT32_MAX},
    {"embedding_length", 1, 1 << 20},
    {"block_count", 1, 1 << 16},
    {"attention.head_count", 1, 1 << 16},
    {"attention.head_count_kv", 1, 1 << 16},
    {"attention.key_length", 1, 1 << 16},
    {"attention.value_length", 1, 1 << 16},
    {"attention.key_length_swa", 1, 1 << 16},
    {"attention.value_length_swa", 1, 1 << 16},
    {"attention.sliding_window", 1, INT32_MAX},
    {"rope.dimension_count", 0, 1 << 16},
    {"rope.dimension_count_swa", 0, 1 << 16},
    {"expert_count", 0, 1 << 16},
    {"expert_used_count", 0, 1 << 16},
    {"feed_forward_length", 0, 1 << 24},
    {"expert_feed_forward_length", 0, 1 << 24},
    {"expert_shared_feed_forward_length", 0, 1 << 24},
    {"ssm.conv_kernel", 1, 1 << 10},
    {"ssm.state_size", 1, 1 << 12},
    {"ssm.group_count", 1, 1 << 12},
    {"ssm.time_step_rank", 1, 1 << 12},
    {"ssm.inner_size", 1, 1 << 20},
    {"full_attention_interval", 1, 1 << 16},
};

hm_status hm_model_hp_check(const hm_model *m, const char *suffix, const char *index, int64_t v, hm_err *err) {
    int64_t lo = 0, hi = INT32_MAX;
    for (size_t i = 0; i < sizeof hp_int_limits / sizeof hp_int_limits[0]; i++)
        if (strcmp(hp_int_limits[i].suffix, suffix) == 0) lo = hp_int_limits[i].lo, hi = hp_int_limits[i].hi;
    if (v < lo || v > hi)
        return hm_errf(err, HM_ERR_FORMAT, "key %s.%s%s = %lld is out of range [%lld, %lld]", m->arch_name, suffix,
                       index ? index : "", (long long)v, (long long)lo, (long long)hi);
    return HM_OK;
}

hm_status hm_model_hp_int(const hm_model *m, const char *suffix, bool required, int64_t dflt,
                          int32_t *out, hm_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    int64_t v;
    if (!hm_gguf_get_int(m->gguf, key, &v)) {
        if (hm_gguf_find_key(m->gguf, key) >= 0)
            return hm_errf(err, HM_ERR_FORMAT, "key %s is not an integer", key);
        if (required) return hm_errf(err, HM_ERR_FORMAT, "missing key %s", key);
        v = dflt;
    }
    hm_status st = hm_model_hp_check(m, suffix, NULL, v, err);
    if (st != HM_OK) return st;
    *out = (int32_t)v;
    return HM_OK;
}

hm_status hm_model_hp_head_dim(const hm_model *m, const char *sfx, bool required, int64_t dflt, int32_t *out,
                               hm_err *err) {
    char key[64];
    snprintf(key, sizeof key, "attention.key_length%s", sfx);
    hm_status st = hm_model_hp_int(m, key, required, dflt, out, err);
    if (st != HM_OK) return st;
    int32_t v_len;
    snprintf(key, sizeof key, "attention.value_length%s", sfx);
    if ((st = hm_model_hp_int(m, key, false, *out, &v_len, err)) != HM_OK) return st;
    if (v_len != *out)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "attention.key_length%s %d != value_length%s %d", sfx, *out, sfx,
                       v_len);
    return HM_OK;
}

/* Float hparams: every one must be finite; these also have a range (an RMS epsilon of 0 or a
 * negative one divides by zero or takes the root of a negative, a RoPE base below 1 has no
 * meaning and one of 0 gives inf frequencies). */
static const struct hp_flimit {
    const char *suffix;
    double lo, hi;
    bool lo_open; /* lo itself is refused */
} hp_float_limits[] = {
    {"rope.freq_base", 1.0, 1e30, false},
    {"rope.freq_base_swa", 1.0, 1e30, false},
    {"attention.layer_norm_rms_epsilon", 0.0, 1.0, true},
    {"final_logit_softcapping", 0.0, 1e30, false},
    {"rope.scaling.factor", 1.0, 1e6, false},
    {"rope.scaling.attn_factor", 0.0, 1e3, true},
    {"rope.scaling.yarn_beta_fast", 0.0, 1e6, true},
    {"rope.scaling.yarn_beta_slow", 0.0, 1e6, true},
    {"rope.scaling.yarn_ext_factor", 0.0, 1.0, false},
};

hm_status hm_model_hp_float(const hm_model *m, const char *suffix, bool required, double dflt,
                            float *out, hm_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    double v;
    if (!hm_gguf_get_float(m->gguf, key, &v)) {
        if (hm_gguf_find_key(m->gguf, key) >= 0)
            return hm_errf(err, HM_ERR_FORMAT, "key %s is not a number", key);
        if (required) return hm_errf(err, HM_ERR_FORMAT, "missing key %s", key);
        v = dflt;
    }
    if (!isfinite(v) || !isfinite((float)v))
        return hm_errf(err, HM_ERR_FORMAT, "key %s = %g is not a finite number", key, v);
    for (size_t i = 0; i < sizeof hp_float_limits / sizeof hp_float_limits[0]; i++) {
        const struct hp_flimit *l = &hp_float_limits[i];
        if (strcmp(l->suffix, suffix) == 0 && (v < l->lo || v > l->hi || (l->lo_open && v == l->lo)))
            return hm_errf(err, HM_ERR_FORMAT, "key %s = %g is out of range %s%g, %g]", key, v, l->lo_open ? "(" : "[",
                           l->lo, l->hi);
    }
    *out = (float)v;
    return HM_OK;
}

/* YaRN's correction dimension: the pair index whose wavelength turns n_rot times over orig_ctx. */
static double yarn_corr_dim(int n_rot, double orig_ctx, double n_turns, double theta) {
    return n_rot * log(orig_ctx / (n_turns * 2.0 * M_PI)) / (2.0 * log(theta));
}

hm_status hm_model_rope_scaling(const hm_model *m, int32_t n_rot, float theta, float **ff, float *attn_mul, hm_err *err) {
    *ff = NULL;
    *attn_mul = 1.0f;
    char key[160];
    hm_gguf_str s;
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch_name);
    if (m->rope_scaling[0]) { /* --rope-scaling over the file's type */
        s.ptr = m->rope_scaling;
        s.len = (uint64_t)strlen(m->rope_scaling);
    } else if (!hm_gguf_get_str(m->gguf, key, &s)) {
        s.len = 0;
    }
    if (s.len == 0 || (s.len == 4 && memcmp(s.ptr, "none", 4) == 0)) return HM_OK;
    const bool linear = s.len == 6 && memcmp(s.ptr, "linear", 6) == 0, yarn = s.len == 4 && memcmp(s.ptr, "yarn", 4) == 0;
    if (!linear && !yarn)
        return hm_errf(err, HM_ERR_UNSUPPORTED, "%s = %.*s: hotmoe runs linear and yarn RoPE scaling (and none)", key,
                       (int)s.len, s.ptr);
    float factor, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f, ext = 1.0f;
    int32_t orig = 0;
    hm_status st = m->rope_scale > 0 ? HM_OK : hm_model_hp_float(m, "rope.scaling.factor", true, 1.0, &factor, err);
    if (m->rope_scale > 0) factor = m->rope_scale;
    if (st == HM_OK && yarn && m->yarn_orig_ctx > 0) orig = m->yarn_orig_ctx;
    else if (st == HM_OK && yarn)
        st = hm_model_hp_int(m, "rope.scaling.original_context_length", true, 0, &orig, err);
    if (st == HM_OK && yarn) st = hm_model_hp_float(m, "rope.scaling.attn_factor", false, 1.0, &attn_factor, err);
    if (st == HM_OK && yarn) st = hm_model_hp_float(m, "rope.scaling.yarn_beta_fast", false, 32.0, &beta_fast, err);
    if (st == HM_OK && yarn) st = hm_model_hp_float(m, "rope.scaling.yarn_beta_slow", false, 1.0, &beta_slow, err);
    if (st == HM_OK && yarn) st = hm_model_hp_float(m, "rope.scaling.yarn_ext_factor", false, 1.0, &ext, err);
    if (st != HM_OK) return st;
    if (yarn && orig < 1) return hm_errf(err, HM_ERR_FORMAT, "%s.rope.scaling.original_context_length = %d", m->arch_name, orig);
    if (n_rot < 2 || factor == 1.0f) return HM_OK; /* nothing to scale */
    float *f = malloc((size_t)(n_rot / 2) * sizeof(float));
    if (!f) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    /* angle_i = pos theta^(-2i/n_rot) / ff[i]: linear divides every pair by the factor; YaRN keeps
     * the fast pairs (i < low) as they are, interpolates the slow ones (i > high) by the factor and
     * ramps between them, and scales q and k by 1 + 0.1 ln(factor) (times attn_factor), which
     * multiplies the attention logits by its square (llama.cpp's rope_yarn, transformers' yarn) */
    double lo = 0, hi = 0;
    if (yarn) {
        lo = floor(yarn_corr_dim(n_rot, orig, beta_fast, theta));
        hi = ceil(yarn_corr_dim(n_rot, orig, beta_slow, theta));
        if (lo < 0) lo = 0;
        if (hi > n_rot - 1) hi = n_rot - 1;
    }
    for (int32_t i = 0; i < n_rot / 2; i++) {
        double keep = 0.0; /* the share of the unscaled (extrapolated) frequency */
        if (yarn) {
            const double ramp = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
            keep = (1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp)) * ext;
        }
        f[i] = (float)(1.0 / ((1.0 - keep) / factor + keep));
    }
    if (yarn) {
        const float ms = attn_factor * (1.0f + 0.1f * logf(factor));
        *attn_mul = ms * ms;
    }
    *ff = f;
    hm_log_printf(&m->log, HM_LOG_INFO, "rope scaling %.*s: factor %g%s, attention logits x %g", (int)s.len, s.ptr,
                  (double)factor, yarn ? " (yarn)" : "", (double)*attn_mul);
    return HM_OK;
}

hm_status hm_model_rope_scaling_none(const hm_model *m, hm_err *err) {
    float *ff = NULL, attn_mul = 1.0f;
    hm_status st = hm_model_rope_scaling(m, 64, 10000.0f, &ff, &attn_mul, err);
    if (st != HM_OK) return st;
    free(ff);
    if (!ff && attn_mul == 1.0f) return HM_OK;
    return hm_errf(err, HM_ERR_UNSUPPORTED, "%s: RoPE scaling (the file's %s.rope.scaling keys or --rope-scaling / "
                   "--rope-scale) is not implemented for this architecture; refusing rather than ignoring it "
                   "(--rope-scaling none runs without)", m->arch_name, m->arch_name);
}

hm_status hm_model_hp_moe(const hm_model *m, hm_moe_hp *hp, hm_err *err) {
    hm_status st;
#define HP_INT(suffix, req, dflt, dst) \
    do { if ((st = hm_model_hp_int(m, suffix, req, dflt, dst, err)) != HM_OK) return st; } while (0)
    HP_INT("context_length", true, 0, &hp->n_ctx_train);
    HP_INT("embedding_length", true, 0, &hp->n_embd);
    HP_INT("block_count", true, 0, &hp->n_layer);
    HP_INT("attention.head_count", true, 0, &hp->n_head);
    HP_INT("attention.head_count_kv", false, hp->n_head, &hp->n_head_kv);
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0)
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: embedding_length %d, block_count %d, head_count %d and "
                       "head_count_kv %d must all be > 0", hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv);
    if (hp->n_head % hp->n_head_kv)
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: head_count %d is not a multiple of head_count_kv %d",
                       hp->n_head, hp->n_head_kv);
    if ((st = hm_model_hp_head_dim(m, "", false, hp->n_embd / hp->n_head, &hp->head_dim, err)) != HM_OK) return st;
    HP_INT("rope.dimension_count", false, hp->head_dim, &hp->n_rot);
    if (hp->head_dim <= 0 || hp->head_dim % 2 || hp->n_rot % 2 || hp->n_rot > hp->head_dim)
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: key_length %d, rope.dimension_count %d", hp->head_dim,
                       hp->n_rot);
    HP_INT("expert_count", true, 0, &hp->n_expert);
    HP_INT("expert_used_count", true, 0, &hp->n_expert_used);
#undef HP_INT
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0)
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: expert_count %d and expert_used_count %d must be > 0",
                       hp->n_expert, hp->n_expert_used);
    if (hp->n_expert_used > hp->n_expert)
        return hm_errf(err, HM_ERR_FORMAT, "bad hparams: expert_used_count %d > expert_count %d", hp->n_expert_used,
                       hp->n_expert);
    if ((st = hm_model_hp_float(m, "rope.freq_base", false, 10000.0, &hp->theta, err)) != HM_OK) return st;
    return hm_model_hp_float(m, "attention.layer_norm_rms_epsilon", false, 1e-6, &hp->eps, err);
}

void hm_model_info_moe(hm_model *m, const hm_moe_hp *hp) {
    hm_model_info *inf = &m->info;
    inf->n_vocab = hp->n_vocab;
    inf->n_ctx_train = hp->n_ctx_train;
    inf->n_embd = hp->n_embd;
    inf->n_layer = hp->n_layer;
    inf->n_head = hp->n_head;
    inf->n_head_kv = hp->n_head_kv;
    inf->head_dim = hp->head_dim;
    inf->n_expert = hp->n_expert;
    inf->n_expert_used = hp->n_expert_used;
    inf->n_ff_exp = hp->n_ff_exp;
}

static void fmt_shape(char *buf, size_t cap, uint32_t n_dims, const int64_t *ne) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (uint32_t d = 0; d < n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)ne[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

hm_status hm_model_bind(const hm_model *m, const char *name, hm_bind_kind kind, uint32_t n_dims,
                        const int64_t *ne, bool required, const hm_gguf_tensor **out, hm_err *err) {
    *out = NULL;
    char want[96], got[96];
    fmt_shape(want, sizeof want, n_dims, ne);
    const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (!required) return HM_OK;
        return hm_errf(err, HM_ERR_FORMAT, "missing tensor '%s' (expected shape %s)", name, want);
    }
    /* trailing dims of 1 are not significant */
    uint32_t nd = t->n_dims;
    while (nd > n_dims && t->ne[nd - 1] == 1) nd--;
    bool ok = nd == n_dims;
    for (uint32_t d = 0; ok && d < n_dims; d++) ok = t->ne[d] == ne[d];
    if (!ok) {
        fmt_shape(got, sizeof got, t->n_dims, t->ne);
        return hm_errf(err, HM_ERR_FORMAT, "tensor '%s': expected shape %s, found %s", name, want, got);
    }
    const hm_type_traits *tr = hm_type_get(t->type);
    switch (kind) {
    case HM_BIND_F32:
        if (t->type != HM_TYPE_F32)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': type %s, expected f32", name,
                           hm_type_name(t->type));
        break;
    case HM_BIND_MATMUL:
        if (!hm_cpu_type_ok(t->type))
            return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': type %s (id %d) is not supported for compute",
                           name, hm_type_name(t->type), t->type);
        if (ne[0] % tr->blck_size)
            return hm_errf(err, HM_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of %s's block %lld",
                           name, (long long)ne[0], hm_type_name(t->type), (long long)tr->blck_size);
        break;
    case HM_BIND_ROWS:
        if (!tr || !tr->name || !tr->to_float || ne[0] % tr->blck_size)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "tensor '%s': type %s (id %d) cannot be dequantised",
                           name, hm_type_name(t->type), t->type);
        break;
    }
    *out = t;
    return HM_OK;
}

hm_mat hm_model_mat(const hm_gguf_tensor *t) {
    size_t nb1 = hm_row_size(t->type, t->ne[0]);
    return hm_mat_make(t->data, t->type, t->ne[0], t->ne[1], nb1);
}

hm_status hm_model_bind_vec(const hm_model *m, const char *name, int64_t n, bool required, const float **out,
                            hm_err *err) {
    const hm_gguf_tensor *t;
    hm_status st = hm_model_bind(m, name, HM_BIND_F32, 1, &n, required, &t, err);
    *out = t ? (const float *)t->data : NULL;
    return st;
}

hm_status hm_model_bind_mat(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, bool required,
                            hm_mat *out, hm_err *err) {
    const int64_t ne[2] = {ne0, ne1};
    const hm_gguf_tensor *t;
    hm_status st = hm_model_bind(m, name, HM_BIND_MATMUL, 2, ne, required, &t, err);
    if (st == HM_OK && t) *out = hm_model_mat(t);
    return st;
}

hm_status hm_model_bind_exps(const hm_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t n_expert,
                             bool required, hm_mat *out, size_t *nb2, hm_err *err) {
    const int64_t ne[3] = {ne0, ne1, n_expert};
    const hm_gguf_tensor *t;
    hm_status st = hm_model_bind(m, name, HM_BIND_MATMUL, 3, ne, required, &t, err);
    if (st != HM_OK || !t) return st;
    *out = hm_model_mat(t);
    out->ne1 = ne1;
    *nb2 = out->nb1 * (size_t)ne1;
    return HM_OK;
}

hm_status hm_model_bind_vocab(const hm_model *m, int64_t n_embd, hm_mat *tok_embd, hm_mat *output,
                              int32_t *n_vocab, hm_err *err) {
    const hm_gguf_tensor *t = hm_gguf_find_tensor(m->gguf, "token_embd.weight");
    const int64_t nv = t && t->n_dims >= 2 ? t->ne[1] : 0;
    if (t && (nv <= 0 || nv > INT32_MAX))
        return hm_errf(err, HM_ERR_FORMAT, "tensor 'token_embd.weight': bad vocabulary size %lld", (long long)nv);
    const int64_t ne[2] = {n_embd, nv};
    hm_status st = hm_model_bind(m, "token_embd.weight", HM_BIND_ROWS, 2, ne, true, &t, err);
    if (st != HM_OK) return st;
    *tok_embd = hm_model_mat(t);
    *n_vocab = (int32_t)nv;
    if ((st = hm_model_bind(m, "output.weight", HM_BIND_MATMUL, 2, ne, false, &t, err)) != HM_OK) return st;
    if (t) {
        *output = hm_model_mat(t);
    } else { /* tied embeddings: the table must then be computable as a matmul too */
        if ((st = hm_model_bind(m, "token_embd.weight", HM_BIND_MATMUL, 2, ne, true, &t, err)) != HM_OK) return st;
        *output = *tok_embd;
    }
    return HM_OK;
}

hm_status hm_model_carve(void **block, const size_t *n_elems, float **const *dst, size_t n, hm_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += hm_align_up(n_elems[i] * 4, HM_ALIGN);
    if (!(*block = hm_malloc_aligned(total)))
        return hm_errf(err, HM_ERR_NOMEM, "cannot allocate activations (%.1f MiB)", (double)total / (1 << 20));
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *dst[i] = (float *)(void *)((char *)*block + off);
        off += hm_align_up(n_elems[i] * 4, HM_ALIGN);
    }
    return HM_OK;
}

hm_status hm_model_kv_alloc(void **kv, size_t bytes, hm_kv_type kv_type, int32_t n_ctx, hm_err *err) {
    *kv = NULL;
    /* refused now, with the numbers, rather than killed by the OOM killer when a long prompt
     * reaches pages the kernel promised but cannot give */
    const uint64_t avail = hm_mem_available_bytes();
    if (avail && bytes > avail) {
        const double fit = (double)n_ctx * (double)avail / (double)bytes;
        return hm_errf(err, HM_ERR_NOMEM, "the KV cache of %d positions needs %.2f GiB of RAM but %.2f GiB is "
                       "available: use a smaller context (-c %d or less)%s, or put the cache on the GPU (-ngl)", n_ctx,
                       (double)bytes / (1 << 30), (double)avail / (1 << 30), fit > 1.0 ? (int)fit : 1,
                       kv_type == HM_KV_F32 ? ", an f16 cache (--kv-type f16: half the bytes)"
                       : kv_type == HM_KV_F16 || kv_type == HM_KV_BF16 ? ", a q8_0 cache (-ctk q8_0 -ctv q8_0: 17/32 of the bytes)"
                                                                       : "");
    }
    if (!(*kv = hm_malloc_aligned(bytes)))
        return hm_errf(err, HM_ERR_NOMEM, "cannot allocate the KV cache (%d positions, %.1f MiB)", n_ctx,
                       (double)bytes / (1 << 20));
    memset(*kv, 0, bytes); /* the pages are taken now, while a failure is still a load failure */
    return HM_OK;
}

hm_status hm_model_att_scratch_alloc(float **out, size_t n, hm_err *err) {
    if (!(*out = hm_malloc_aligned(n * sizeof(float))))
        return hm_errf(err, HM_ERR_NOMEM, "cannot allocate attention scratch");
    return HM_OK;
}

hm_status hm_model_scratch_alloc(hm_scratch *s, size_t size, hm_err *err) {
    s->size = size;
    if (size && !(s->data = hm_malloc_aligned(size)))
        return hm_errf(err, HM_ERR_NOMEM, "cannot allocate %.1f MiB of scratch", (double)size / (1 << 20));
    return HM_OK;
}

void hm_model_state_free(void *kv, void *att_scratch, void *act, hm_scratch *scratch, hm_moe_route *route) {
    hm_free_aligned(kv);
    hm_free_aligned(att_scratch);
    hm_free_aligned(act);
    hm_free_aligned(scratch->data);
    hm_moe_route_free(route);
}

void hm_model_kv_write(hm_pool *pool, hm_kv_type kv_type, char *kc, char *vc, int64_t n_ctx, int n_kv, int hd,
                       const float *k, const float *v, int64_t n, const int32_t *pos) {
    if (kv_type != HM_KV_F16) /* the general cache's write: a plain cache is the ring of n_ctx rows */
        hm_cpu_kv_write_ring(pool, kc, vc, hm_kv_row_type(kv_type), n_ctx, n_kv, hd, k, v, n, pos);
    else
        hm_cpu_kv_write(pool, (uint16_t *)(void *)kc, (uint16_t *)(void *)vc, n_ctx, n_kv, hd, k, v, n, pos);
}

void hm_model_attention(hm_pool *pool, hm_kv_type kv_type, const float *q, int64_t n, const int32_t *pos,
                        const char *kc, const char *vc, int64_t n_ctx, int n_head, int n_kv, int hd, float scale,
                        float *out, float *att_scratch, hm_scratch *scratch) {
    const int rt = hm_kv_row_type(kv_type);
    if (kv_type != HM_KV_F16 && kv_type != HM_KV_F32 && hm_cpu_attention_kv_takes(rt, hd) &&
        !hm_cpu_attn_tiled_takes(n, n_head, n_kv, hd)) /* decode over a bf16 / quantised cache: grouped */
        hm_cpu_attention_kv(pool, rt, q, n, pos, kc, vc, n_ctx, n_head, n_kv, hd, scale, out, scratch);
    else if (kv_type != HM_KV_F16) /* the general cache's attention over n_ctx rows, no window */
        hm_cpu_attention_ring(pool, q, n, pos, kc, vc, hm_kv_row_type(kv_type), n_ctx, 0, n_head, n_kv, hd, scale, out,
                              att_scratch);
    else
        hm_cpu_attention(pool, q, n, pos, (const uint16_t *)(const void *)kc, (const uint16_t *)(const void *)vc,
                         n_ctx, n_head, n_kv, hd, scale, out, scratch);
}

void hm_model_compact_rows(float *a, int64_t w, const int32_t *rows, int32_t n_out) {
    for (int32_t i = 0; i < n_out; i++)
        if (rows[i] != i) memcpy(a + (size_t)i * (size_t)w, a + (size_t)rows[i] * (size_t)w, (size_t)w * sizeof(float));
}

void hm_model_logits(hm_pool *pool, const float *x, const float *norm, float eps, const hm_mat *wout, int64_t n_out,
                     int64_t n_embd, float *hout, float *logits, hm_scratch *scratch) {
    hm_cpu_rmsnorm(pool, x, norm, hout, n_out, n_embd, eps);
    hm_cpu_matmul(pool, wout, hout, n_out, logits, scratch);
}
