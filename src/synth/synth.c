/* synth.c - `hotmoe synth`: write a random-weight qwen3moe GGUF that llama.cpp and hotmoe load.
 *
 * Flow: options -> preset + type mix -> tensor plan (synth_plan.c) -> metadata (llama.cpp's
 * qwen3moe keys, as its converter writes them) + tokenizer keys (synth_vocab.c) -> tensor data,
 * streamed: each tensor is produced in chunks of rows; the rows of a chunk are split over
 * n_threads threads, each generating its rows' floats (hm_synth_gauss) and quantising them with
 * the type's reference quantiser into the chunk buffer, which is then appended to the file.
 *
 * --fast-experts: the expert tensors' rows are random quantised blocks (synth_fast.c) instead of
 * quantised gaussians; every other tensor is the same bytes as without it.
 *
 * Invariants: memory is O(chunk + threads * row), independent of the model size; the bytes
 * depend only on the options and the seed, never on n_threads or chunking (the generator is
 * counter-based and every row is quantised independently). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/timer.h"
#include "../quant/quant.h"
#include "synth_deepseek2.h"
#include "synth_deepseek4.h"
#include "synth_gemma4.h"
#include "synth_moe_archs.h"
#include "synth_gptoss.h"
#include "synth_imatrix.h"
#include "synth_impl.h"

#define CHUNK_BYTES ((size_t)4 << 20) /* quantised bytes per chunk */
#define MAX_THREADS 64

typedef struct chunk_job {
    const hm_synth_tensor *t;
    hm_from_float_fn quantise;
    uint64_t key;
    size_t row_bytes;
    int64_t row0, n_rows; /* rows of this chunk; a row is ne[0] elements */
    uint8_t *out;         /* n_rows * row_bytes */
    float *scratch[MAX_THREADS];
    int n_threads;
    const hm_synth_routing *routing; /* --routing-profile, or NULL */
    int route_op;                    /* what routing does to this tensor's rows (0: nothing) */
    int32_t route_layer;
    bool fast; /* --fast-experts and an expert tensor of a type with a generator */
    const float *qw; /* --imatrix: the tensor's importance, ne[0] per matrix (ne[2] of them); or NULL */
    _Atomic int64_t next_row; /* the next row of the chunk no thread has taken */
} chunk_job;

typedef struct worker_arg {
    chunk_job *job;
    int ith;
} worker_arg;

/* Threads take ROWS_PER_GRAB rows at a time from a shared counter, so a thread slowed down by
 * other work on the machine does not hold the chunk up; which thread does a row does not
 * change its bytes. */
#define ROWS_PER_GRAB 8

static void run_rows(chunk_job *j, int ith) {
    const int64_t ne0 = j->t->ne[0];
    float *x = j->scratch[ith];
    const float mean = j->t->mean, sd = j->t->std;
    for (;;) {
        int64_t r0 = atomic_fetch_add(&j->next_row, ROWS_PER_GRAB);
        if (r0 >= j->n_rows) break;
        int64_t r1 = r0 + ROWS_PER_GRAB < j->n_rows ? r0 + ROWS_PER_GRAB : j->n_rows;
        for (int64_t r = r0; r < r1; r++) {
            uint8_t *y = j->out + (size_t)r * j->row_bytes;
            if (j->fast) { /* random blocks; a reserved-channel row of ffn_down_exps stays exact zeros */
                if (hm_synth_routing_zeroes_row(j->routing, j->route_op, j->row0 + r)) memset(y, 0, j->row_bytes);
                else hm_synth_fast_row(j->t->type, j->key, j->row0 + r, ne0, sd, y);
                continue;
            }
            if (j->t->hash_experts) { /* an I32 table: distinct ids, spread from the row's start */
                const int64_t ne = j->t->hash_experts, step = ne / ne0 > 0 ? ne / ne0 : 1;
                const int64_t start = (int64_t)(hm_synth_mix64(j->key + (uint64_t)(j->row0 + r)) % (uint64_t)ne);
                for (int64_t c = 0; c < ne0; c++) {
                    int32_t id = (int32_t)((start + c * step) % ne);
                    memcpy(y + (size_t)c * 4, &id, 4);
                }
                continue;
            }
            uint64_t base = (uint64_t)(j->row0 + r) * (uint64_t)ne0;
            for (int64_t c = 0; c < ne0; c++) x[c] = mean + sd * hm_synth_gauss(j->key, base + (uint64_t)c);
            if (j->t->rope_pairs) /* rope_freqs: fixed values */
                for (int64_t c = 0; c < ne0; c++) x[c] = c < j->t->rope_pairs ? 1.0f : 1e30f;
            if (j->route_op) hm_synth_routing_row(j->routing, j->route_op, j->route_layer, j->key, j->row0 + r, x, ne0);
            if (j->qw) /* the expert's (matrix's) importance, as llama-quantize slices it */
                hm_quant_quantize(j->t->type, x, y, 1, ne0, j->qw + ((j->row0 + r) / j->t->ne[1]) * ne0);
            else j->quantise(x, y, ne0);
        }
    }
}

static void *worker_main(void *p) {
    worker_arg *a = p;
    run_rows(a->job, a->ith);
    return NULL;
}

/* Run the chunk on n_threads threads (the caller is thread 0). A thread that cannot be started
 * is not an error: the others take its rows. */
static void run_chunk(chunk_job *j) {
    atomic_store(&j->next_row, 0);
    pthread_t tid[MAX_THREADS];
    worker_arg args[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int i = 1; i < j->n_threads; i++) {
        args[i] = (worker_arg){j, i};
        started[i] = pthread_create(&tid[i], NULL, worker_main, &args[i]) == 0;
    }
    run_rows(j, 0);
    for (int i = 1; i < j->n_threads; i++) /* a thread that did not start left its rows to us */
        if (started[i]) pthread_join(tid[i], NULL);
}

/* The preset of the arch that is not qwen3moe (each its own type; all NULL: qwen3moe). */
typedef struct synth_arch {
    const hm_synth_q35 *q35;
    const hm_synth_g4 *g4;
    const hm_synth_ds2 *ds2;
    const hm_synth_ma *ma;
    const hm_synth_gpt *gpt;
} synth_arch;

/* The deepseek4 preset of o (NULL: another arch). */
static const hm_synth_ds4 *ds4_of(const hm_synth_opts *o) {
    return o->arch && strcmp(o->arch, "deepseek4") == 0 ? hm_synth_find_ds4(o->preset) : NULL;
}

/* Which importance each tensor of the plan is quantised with, as llama-quantize picks it: the entry
 * of the same name for every tensor it quantises (not F32, not a hash table); its size must be
 * ne[0] * ne[2] (token_embd of another size goes without, as llama-quantize lets it); a tensor of a
 * type llama-quantize will not write without one (the grid i-quants but for token_embd / output)
 * must have an entry. *out[i] borrowed from im, NULL for none; *out owned by the caller. */
static hm_status imatrix_bind(const hm_imatrix *im, const char *path, const hm_synth_tensor *plan, int64_t n,
                              const float ***out, hm_err *err) {
    const float **qw = calloc((size_t)n, sizeof *qw);
    if (!qw) return hm_errf(err, HM_ERR_NOMEM, "synth: out of memory");
    for (int64_t i = 0; i < n; i++) {
        const hm_synth_tensor *t = &plan[i];
        if (t->type == HM_TYPE_F32 || t->hash_experts) continue;
        const bool embd_or_out = !strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "output.weight");
        int64_t nv = 0;
        const float *v = hm_imatrix_find(im, t->name, &nv);
        if (v && nv != t->ne[0] * t->ne[2]) {
            if (strcmp(t->name, "token_embd.weight") != 0) {
                free(qw);
                return hm_errf(err, HM_ERR_ARG, "synth: imatrix %s: %s has %lld values, the tensor needs %lld "
                               "(%lld per row x %lld matrices): an imatrix of another model?", path, t->name,
                               (long long)nv, (long long)(t->ne[0] * t->ne[2]), (long long)t->ne[0], (long long)t->ne[2]);
            }
            v = NULL;
        }
        const bool needs = !embd_or_out && (t->type == HM_TYPE_IQ2_XXS || t->type == HM_TYPE_IQ2_XS ||
                                            t->type == HM_TYPE_IQ2_S || t->type == HM_TYPE_IQ3_XXS ||
                                            t->type == HM_TYPE_IQ1_S || t->type == HM_TYPE_IQ1_M);
        if (!v && needs) {
            free(qw);
            return hm_errf(err, HM_ERR_ARG, "synth: imatrix %s has no entry for %s, which is %s (llama-quantize "
                           "refuses that type without one)", path, t->name, hm_type_name(t->type));
        }
        if (v && !hm_quant_weighted_supported(t->type)) {
            free(qw);
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: %s is %s, which has no importance-weighted quantiser here",
                           t->name, hm_type_name(t->type));
        }
        qw[i] = v;
    }
    *out = qw;
    return HM_OK;
}

static hm_status write_metadata(hm_gguf_writer *w, const hm_synth_opts *o, const hm_synth_preset *p,
                                const synth_arch *a, int32_t n_layer, const hm_synth_mix *m,
                                const hm_synth_routing *routing, const hm_imatrix *im, hm_err *err) {
    hm_status st = HM_OK;
#define SET(call) do { if (!st) st = (call); } while (0)
    if (a->gpt) {
        SET(hm_synth_meta_gpt(w, a->gpt, n_layer, m));
        goto provenance;
    }
    if (a->ds2) {
        SET(hm_synth_meta_ds2(w, a->ds2, n_layer, m));
        goto provenance;
    }
    if (a->ma) {
        SET(hm_synth_meta_ma(w, a->ma, n_layer, m));
        goto provenance;
    }
    if (a->q35) {
        SET(hm_synth_meta_q35(w, a->q35, n_layer, o->n_nextn, m));
        goto provenance;
    }
    if (a->g4) {
        SET(hm_synth_meta_g4(w, a->g4, n_layer, m));
        goto provenance;
    }
    if (ds4_of(o)) {
        SET(hm_synth_meta_ds4(w, ds4_of(o), n_layer, m));
        goto provenance;
    }
    /* general.* and qwen3moe.* in the order and with the value types llama.cpp's converter
     * writes (u32 counts, f32 floats) */
    SET(hm_gguf_writer_set_str(w, "general.architecture", "qwen3moe"));
    SET(hm_gguf_writer_set_str(w, "general.type", "model"));
    SET(hm_gguf_writer_set_str(w, "general.name", p->model_name));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.block_count", (uint32_t)n_layer));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.context_length", (uint32_t)p->n_ctx));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.embedding_length", (uint32_t)p->n_embd));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.feed_forward_length", (uint32_t)p->n_ff));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.attention.head_count", (uint32_t)p->n_head));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.attention.head_count_kv", (uint32_t)p->n_head_kv));
    SET(hm_gguf_writer_set_f32(w, "qwen3moe.rope.freq_base", p->rope_theta));
    SET(hm_gguf_writer_set_f32(w, "qwen3moe.attention.layer_norm_rms_epsilon", p->rms_eps));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.expert_used_count", (uint32_t)p->n_expert_used));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.attention.key_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.attention.value_length", (uint32_t)p->head_dim));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.expert_count", (uint32_t)p->n_expert));
    SET(hm_gguf_writer_set_u32(w, "qwen3moe.expert_feed_forward_length", (uint32_t)p->n_ff_exp));
    SET(hm_gguf_writer_set_u32(w, "general.file_type", (uint32_t)m->ftype));
    SET(hm_gguf_writer_set_u32(w, "general.quantization_version", 2));
provenance:
    /* provenance (llama.cpp ignores keys it does not know) */
    SET(hm_gguf_writer_set_str(w, "hotmoe.synth.preset", p->name));
    SET(hm_gguf_writer_set_str(w, "hotmoe.synth.type", m->name));
    SET(hm_gguf_writer_set_u64(w, "hotmoe.synth.seed", o->seed));
    if (o->fast_experts) SET(hm_gguf_writer_set_bool(w, "hotmoe.synth.fast_experts", true));
    SET(hm_synth_routing_write_meta(routing, w));
    if (im) { /* the keys llama-quantize writes */
        SET(hm_gguf_writer_set_str(w, "quantize.imatrix.file", o->imatrix));
        SET(hm_gguf_writer_set_i32(w, "quantize.imatrix.entries_count", (int32_t)hm_imatrix_n_entries(im)));
        SET(hm_gguf_writer_set_i32(w, "quantize.imatrix.chunks_count", hm_imatrix_chunk_count(im)));
    }
#undef SET
    if (st) return st;
    if (a->g4) return hm_synth_vocab_g4(w, p->n_vocab, err);
    return hm_synth_write_vocab(w, p->n_vocab, o->tokenizer_json, o->tokenizer_config, err);
}

static hm_status check_opts(const hm_synth_opts *o, const hm_synth_preset **p, synth_arch *a,
                            const hm_synth_mix **m, hm_err *err) {
    const bool is_q35 = o->arch && (strcmp(o->arch, "qwen35moe") == 0 || strcmp(o->arch, "qwen3next") == 0);
    const bool is_g4 = o->arch && strcmp(o->arch, "gemma4") == 0;
    const bool is_ds2 = o->arch && strcmp(o->arch, "deepseek2") == 0;
    const bool is_ds4 = o->arch && strcmp(o->arch, "deepseek4") == 0;
    const bool is_ma = hm_synth_is_ma(o->arch);
    const bool is_gpt = o->arch && strcmp(o->arch, "gpt-oss") == 0;
    if (o->arch && !is_q35 && !is_g4 && !is_ds2 && !is_ds4 && !is_ma && !is_gpt && strcmp(o->arch, "qwen3moe") != 0)
        return hm_errf(err, HM_ERR_UNSUPPORTED,
                       "synth: architecture '%s' is not supported (qwen3moe, qwen35moe, qwen3next, gemma4, "
                       "deepseek2, deepseek4, glm4moe, olmoe, llama, gpt-oss)", o->arch);
    if (is_gpt) {
        if (!(a->gpt = hm_synth_find_gpt(o->preset ? o->preset : "gpt-oss-20b")))
            return hm_errf(err, HM_ERR_ARG, "synth: unknown gpt-oss preset '%s' (one of: %s)", o->preset,
                           hm_synth_gpt_names());
        *p = &a->gpt->base;
        if (o->routing_profile)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile is not supported for gpt-oss");
    }
    if (is_ds2) { /* its own presets (default: the real shape); the built-in vocabulary or --tokenizer */
        if (!(a->ds2 = hm_synth_find_ds2(o->preset ? o->preset : "deepseek-v2-lite")))
            return hm_errf(err, HM_ERR_ARG, "synth: unknown deepseek2 preset '%s' (one of: %s)", o->preset,
                           hm_synth_ds2_names());
        *p = &a->ds2->base;
        if (o->routing_profile)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile is not supported for deepseek2");
    }
    if (is_ds4) {
        if (!ds4_of(o))
            return hm_errf(err, HM_ERR_ARG, "synth: unknown deepseek4 preset '%s' (one of: %s)",
                           o->preset ? o->preset : "", hm_synth_ds4_names());
        *p = &ds4_of(o)->base;
        if (o->tokenizer_json)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --tokenizer is not supported for deepseek4 yet");
        if (o->routing_profile)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile is not supported for deepseek4 yet");
    }
    if (is_ma) {
        if (!o->preset) return hm_errf(err, HM_ERR_ARG, "synth: no preset (one of: %s)", hm_synth_ma_names(o->arch));
        if (!(a->ma = hm_synth_find_ma(o->arch, o->preset)))
            return hm_errf(err, HM_ERR_ARG, "synth: unknown %s preset '%s' (one of: %s)", o->arch, o->preset,
                           hm_synth_ma_names(o->arch));
        *p = &a->ma->base;
        if (o->tokenizer_json)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --tokenizer is not supported for %s yet (built-in "
                           "vocabulary)", o->arch);
        if (o->routing_profile)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --routing-profile is not supported for %s yet", o->arch);
    }
    if (is_g4) {
        if (!o->preset) return hm_errf(err, HM_ERR_ARG, "synth: no preset (one of: %s)", hm_synth_g4_names());
        if (!(a->g4 = hm_synth_find_g4(o->preset)))
            return hm_errf(err, HM_ERR_ARG, "synth: unknown gemma4 preset '%s' (one of: %s)", o->preset,
                           hm_synth_g4_names());
        *p = &a->g4->base;
        if (o->tokenizer_json)
            return hm_errf(err, HM_ERR_UNSUPPORTED, "synth: --tokenizer is not supported for gemma4 (built-in vocabulary)");
    }
    const char *names = is_q35 ? hm_synth_q35_names(o->arch) : hm_synth_preset_names();
    if (!o->preset && !is_ds2 && !is_gpt) return hm_errf(err, HM_ERR_ARG, "synth: no preset (one of: %s)", names);
    a->q35 = is_q35 ? hm_synth_find_q35(o->arch, o->preset) : NULL;
    if (!is_g4 && !is_ds2 && !is_ds4 && !is_ma && !is_gpt &&
        !(*p = is_q35 ? (a->q35 ? &a->q35->base : NULL) : hm_synth_find_preset(o->preset)))
        return hm_errf(err, HM_ERR_ARG, "synth: unknown %s preset '%s' (one of: %s)", is_q35 ? o->arch : "qwen3moe",
                       o->preset, names);
    if (!o->type) return hm_errf(err, HM_ERR_ARG, "synth: no type (one of: %s)", hm_synth_mix_names());
    if (!(*m = hm_synth_find_mix(o->type)))
        return hm_errf(err, HM_ERR_ARG, "synth: unknown type '%s' (one of: %s)", o->type, hm_synth_mix_names());
    if (o->n_nextn < 0 || o->n_nextn > 1 ||
        (o->n_nextn && (!o->arch || (strcmp(o->arch, "qwen35moe") != 0 && strcmp(o->arch, "qwen3next") != 0))))
        return hm_errf(err, HM_ERR_ARG, "synth: --nextn %d: an MTP block is written for --arch qwen35moe and "
                       "qwen3next only, 0 or 1 of it (as llama.cpp runs it)", o->n_nextn);
    if (o->n_layer < 0 || o->n_layer > 1000)
        return hm_errf(err, HM_ERR_ARG, "synth: --layers %d is out of range [1, 1000]", o->n_layer);
    if (!o->out_path || !*o->out_path) return hm_errf(err, HM_ERR_ARG, "synth: no output file (-o FILE)");
    if (o->imatrix && o->fast_experts)
        return hm_errf(err, HM_ERR_ARG, "synth: --imatrix and --fast-experts do not go together (random expert blocks "
                       "are not quantised)");
    if (o->tokenizer_config && !o->tokenizer_json)
        return hm_errf(err, HM_ERR_ARG, "synth: --tokenizer-config needs --tokenizer");
    return HM_OK;
}

hm_status hm_synth(const hm_synth_opts *o, hm_err *err) {
    const hm_synth_preset *p = NULL;
    synth_arch a = {0};
    const hm_synth_mix *m = NULL;
    hm_status st = check_opts(o, &p, &a, &m, err);
    if (st) return st;
    hm_synth_mix mi; /* with --imatrix: the mix with llama-quantize's with-imatrix rules */
    if (o->imatrix) {
        mi = *m;
        mi.imatrix = true;
        m = &mi;
    }
    const int32_t n_layer = o->n_layer ? o->n_layer : p->n_layer;

    int n_threads = o->n_threads;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;

    hm_synth_tensor *plan = NULL;
    int64_t n_tensors = 0;
    hm_gguf_writer *w = NULL;
    chunk_job job;
    memset(&job, 0, sizeof job);
    hm_synth_routing *routing = NULL;
    hm_imatrix *im = NULL;
    const float **qws = NULL;
    st = a.q35         ? hm_synth_plan_q35(a.q35, n_layer, o->n_nextn, m, &plan, &n_tensors, err)
         : a.g4        ? hm_synth_plan_g4(a.g4, n_layer, m, &plan, &n_tensors, err)
         : a.ds2       ? hm_synth_plan_ds2(a.ds2, n_layer, m, &plan, &n_tensors, err)
         : ds4_of(o)   ? hm_synth_plan_ds4(ds4_of(o), n_layer, m, &plan, &n_tensors, err)
         : a.ma        ? hm_synth_plan_ma(a.ma, n_layer, m, &plan, &n_tensors, err)
         : a.gpt       ? hm_synth_plan_gpt(a.gpt, n_layer, m, &plan, &n_tensors, err)
              : hm_synth_plan(p, n_layer, m, &plan, &n_tensors, err);
    if (st) return st;
    if (o->routing_profile &&
        (st = hm_synth_routing_open(&routing, o->routing_profile, p, n_layer, plan, n_tensors, o->seed, n_threads, err)))
        goto done;
    job.routing = routing;
    if (o->imatrix && ((st = hm_imatrix_open(&im, o->imatrix, err)) || (st = imatrix_bind(im, o->imatrix, plan, n_tensors, &qws, err))))
        goto done;

    uint64_t total = 0;
    int64_t max_ne0 = 0;
    size_t max_row = 0;
    for (int64_t i = 0; i < n_tensors; i++) {
        const hm_synth_tensor *t = &plan[i];
        const hm_type_traits *tr = hm_type_get(t->type);
        if (!t->hash_experts && (!tr || !tr->from_float_ref)) {
            st = hm_errf(err, HM_ERR_UNSUPPORTED, "synth: type %s (for %s) has no reference quantiser in this build",
                         hm_type_name(t->type), t->name);
            goto done;
        }
        size_t row = hm_row_size(t->type, t->ne[0]);
        total += (uint64_t)row * (uint64_t)(t->ne[1] * t->ne[2]);
        if (t->ne[0] > max_ne0) max_ne0 = t->ne[0];
        if (row > max_row) max_row = row;
    }

    size_t buf_bytes = max_row > CHUNK_BYTES ? max_row : CHUNK_BYTES;
    job.out = malloc(buf_bytes);
    job.n_threads = n_threads;
    for (int i = 0; i < n_threads; i++) job.scratch[i] = malloc((size_t)max_ne0 * sizeof(float));
    bool oom = !job.out;
    for (int i = 0; i < n_threads; i++) oom |= !job.scratch[i];
    if (oom) {
        st = hm_errf(err, HM_ERR_NOMEM, "synth: out of memory for the chunk buffers");
        goto done;
    }

    st = hm_gguf_writer_open(&w, o->out_path, 0, err);
    if (st) goto done;
    if (o->split_max_bytes || o->split_max_tensors)
        st = hm_gguf_writer_set_split(w, o->split_max_bytes, o->split_max_tensors);
    if (!st) st = write_metadata(w, o, p, &a, n_layer, m, routing, im, err);
    for (int64_t i = 0; !st && i < n_tensors; i++) {
        const hm_synth_tensor *t = &plan[i];
        st = hm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    if (!st) st = hm_gguf_writer_begin_data(w);

    int64_t t0 = hm_time_us();
    uint64_t done_bytes = 0;
    for (int64_t i = 0; !st && i < n_tensors; i++) {
        const hm_synth_tensor *t = &plan[i];
        job.t = t;
        job.quantise = hm_type_get(t->type)->from_float_ref;
        job.key = hm_synth_key(o->seed, t->name);
        job.route_op = hm_synth_routing_op(routing, t, &job.route_layer);
        job.fast = o->fast_experts && t->n_dims == 3 && hm_synth_fast_supported(t->type);
        job.qw = qws ? qws[i] : NULL;
        job.row_bytes = hm_row_size(t->type, t->ne[0]);
        const int64_t rows = t->ne[1] * t->ne[2];
        int64_t per_chunk = (int64_t)(buf_bytes / job.row_bytes);
        for (int64_t r = 0; !st && r < rows; r += per_chunk) {
            job.row0 = r;
            job.n_rows = rows - r < per_chunk ? rows - r : per_chunk;
            run_chunk(&job);
            size_t n = (size_t)job.n_rows * job.row_bytes;
            st = hm_gguf_writer_write(w, job.out, n);
            done_bytes += n;
            if (!st && o->progress) {
                hm_synth_progress pr = {t->name, i, n_tensors, done_bytes, total, (double)(hm_time_us() - t0) * 1e-6};
                o->progress(o->progress_ud, &pr);
            }
        }
    }
    if (!st) {
        st = hm_gguf_writer_finish(w); /* frees w, success or not */
        w = NULL;
    }

done:
    hm_gguf_writer_abort(w);
    hm_synth_routing_close(routing);
    hm_imatrix_close(im);
    free(qws);
    free(plan);
    free(job.out);
    for (int i = 0; i < MAX_THREADS; i++) free(job.scratch[i]);
    return st;
}
