/* exec_impl.h - the executor's internals shared by its files: a pass in progress (hm_exec), the
 * backend op table a pass dispatches to, and a session's state (host buffers for the CPU, a chain
 * of device states for the GPU). exec.c dispatches, exec_cpu.c is the CPU backend, exec_cuda.c the
 * CUDA backends (per-launch, graph capture, upload pass). */
#ifndef HM_EXEC_IMPL_H
#define HM_EXEC_IMPL_H

#include "exec.h"

/* One backend: the ops of exec.h over that backend's buffers (hm_exec.buf). */
typedef struct hm_exec_ops {
    hm_status (*rmsnorm)(hm_exec *x, hm_buf in, const float *w, hm_buf out);
    hm_status (*matmul_n)(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n);
    hm_status (*add_rmsnorm)(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out);
    hm_status (*qk_norm_rope_kv)(hm_exec *x, int32_t il, const hm_qk_rope *p);
    hm_status (*out_rows)(hm_exec *x, int32_t il, const hm_buf *bufs, const int64_t *widths, int n);
    hm_status (*attention)(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale);
    hm_status (*route)(hm_exec *x, int32_t il, hm_buf in);
    hm_status (*experts)(hm_exec *x, int32_t il, hm_buf in, hm_buf out);
    hm_status (*split_gate)(hm_exec *x, hm_buf mix, hm_buf q, hm_buf gate);
    hm_status (*sigmoid_mul)(hm_exec *x, hm_buf a, hm_buf gate, int64_t width);
    hm_status (*swiglu)(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width);
    hm_status (*add_sigmoid_scaled)(hm_exec *x, hm_buf acc, hm_buf y, hm_buf s);
    hm_status (*deltanet)(hm_exec *x, int32_t il, hm_buf io, const hm_deltanet *p);
    hm_status (*add)(hm_exec *x, hm_buf acc, hm_buf add);
    hm_status (*scale)(hm_exec *x, hm_buf a, float s, int64_t width);
    hm_status (*zero)(hm_exec *x, hm_buf a, int64_t width);
    hm_status (*copy)(hm_exec *x, hm_buf src, hm_buf dst, int64_t width);
    hm_status (*geglu)(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width);
    hm_status (*attn_in_ring)(hm_exec *x, int32_t il, const hm_ring_in *p);
    hm_status (*attention_ring)(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale);
    hm_status (*rmsnorm_w)(hm_exec *x, hm_buf in, const float *w, hm_buf out, int64_t width);
    hm_status (*mla_in)(hm_exec *x, int32_t il, const hm_mla_in *p);
    hm_status (*matmul_heads)(hm_exec *x, const hm_mat_heads *w, const hm_heads_io *io);
    /* DeepSeek-V4's (NULL on a backend without them) */
    hm_status (*hc_expand)(hm_exec *x, hm_buf io);
    hm_status (*hc_pre)(hm_exec *x, hm_buf in, const hm_hc *p, hm_buf norm, hm_buf mix, hm_buf out, bool head);
    hm_status (*hc_post)(hm_exec *x, hm_buf f, hm_buf res, hm_buf mix, hm_buf out);
    hm_status (*dsv4_attn)(hm_exec *x, int32_t il, const hm_dsv4_attn *p);
    hm_status (*swiglu_clamp)(hm_exec *x, hm_buf g, hm_buf u, hm_buf out, int64_t width, float limit);
    hm_status (*add_bias)(hm_exec *x, hm_buf a, const float *b, int64_t width);
    hm_status (*concat)(hm_exec *x, hm_buf a, int64_t wa, hm_buf b, int64_t wb, hm_buf out); /* NULL: refused */
    void (*sync)(hm_exec *x); /* waits for the ops queued so far (NULL: ops finish when they return) */
} hm_exec_ops;

/* The ops a profile times (HOTMOE_OP_PROFILE; exec.c): each op's calls and microseconds. */
#define HM_OPP_LIST(X)                                                                              \
    X(rmsnorm) X(matmul_n) X(add_rmsnorm) X(qk_norm_rope_kv) X(out_rows) X(attention) X(route)      \
    X(experts) X(split_gate) X(sigmoid_mul) X(swiglu) X(add_sigmoid_scaled) X(deltanet) X(add)      \
    X(scale) X(zero) X(copy) X(geglu) X(attn_in_ring) X(attention_ring) X(rmsnorm_w) X(mla_in)        \
    X(matmul_heads) X(hc_expand) X(hc_pre) X(hc_post) X(dsv4_attn) X(swiglu_clamp) X(add_bias) X(concat)
enum {
#define X(name) HM_OPP_##name,
    HM_OPP_LIST(X)
#undef X
    HM_OPP_COUNT
};
typedef struct hm_op_prof {
    int64_t us[HM_OPP_COUNT], calls[HM_OPP_COUNT];
} hm_op_prof;

/* One layer's K then V in a KV block: [n_kv][cap] rows of head_dim values of the cache's type
 * each (bytes bytes), from byte off on; K only when xm->kv_v_is_k (MLA's compressed cache). */
typedef struct hm_kv_layer {
    size_t off, bytes;
    int64_t cap;
    int32_t n_head_kv; /* bytes = n_head_kv x cap rows (K, and V after it unless kv_v_is_k) */
} hm_kv_layer;


/* A forward pass in progress. */
struct hm_exec {
    const hm_model *m;
    const hm_exec_model *xm;
    const hm_exec_ops *ops;
    hm_pool *pool;
    hm_err *err;
    int64_t n;                    /* rows of the micro-batch(es) */
    int64_t nr;                   /* rows carried now (n, or the wanted rows after out_rows) */
    int64_t n_out;                /* rows whose logits are wanted */
    bool done;                    /* nothing more to compute this pass */
    float *buf[HM_EXEC_MAX_BUF];  /* the buffers on this pass's backend (the current device's) */
    void *be;                     /* the backend's own context of this pass */
    hm_op_prof *prof;             /* the session's op profile, NULL: not timed (exec.c) */
};

struct hm_xdev;

/* A session's state. On the CPU the host fields; with a GPU placement `dev` (the chain) and only
 * the cold units' route and scratch on the host. */
typedef struct hm_exec_state {
    const char *arch;       /* the model's architecture name (messages) */
    int32_t n_ctx, n_ubatch;
    bool recurrent;         /* the arch has recurrent layers (xm->n_rs_layer > 0) */
    int32_t n_pos;          /* recurrent archs: positions the recurrent state has absorbed */
    int n_threads;
    hm_kv_type kv_type;
    int32_t window;         /* ring archs: the sliding window */
    int64_t ring;           /* the sliding layers' ring rows (n_ctx when none, or they hold all) */
    int64_t n_hi;           /* 1 + the highest position written since the last reset */
    hm_kv_layer *kvl;       /* [n_layer] each layer's K/V in the KV block (bytes 0: none), owned */
    int32_t n_layer, n_rs;  /* the model's layers and recurrent layers (hm_exec_state_copy) */
    size_t rs_floats;       /* floats of one recurrent layer's state (0 without) */
    bool kv_v_is_k;         /* the KV block holds K rows only (xm->kv_v_is_k) */
    size_t aux_total;       /* floats of aux */
    size_t kv_bytes;        /* bytes of the KV block (every layer's K and V) */
    int kv_row_type;        /* hm_kv_row_type(kv_type) */
    void *kv;               /* the CPU's KV block (kvl), owned */
    float *rs;              /* [n_rs_layer][hm_exec_rs_floats] recurrent state, owned */
    size_t rs_total;        /* floats of rs */
    float *rs_saved;        /* hm_exec_state_save's copy of rs (CPU), owned; NULL until the first save */
    int32_t saved_pos;      /* n_pos at the last save; -1: none */
    float *kv_scratch;      /* attention scores (an f32 cache, or the ring attention), owned */
    void *act;              /* one block holding the activations below, owned */
    float *buf[HM_EXEC_MAX_BUF]; /* [U, buf_width[i]] the arch's buffers */
    float *rlog;            /* [U, n_expert] router logits */
    float *rw;              /* [U, k] routing weights */
    int32_t *rid;           /* [U, k] routed experts */
    float *hout;            /* [U, n_embd] rows whose logits are wanted */
    int32_t *pos_out;       /* [U] positions of those rows */
    int32_t *tok_out;       /* [U] their tokens */
    int32_t *tok_all, *pos_all, *row_out; /* [U] forward_multi: the sequences' tokens, positions and
                                             wanted rows (batch indexes), concatenated */
    hm_moe_route route;
    hm_scratch scratch;
    bool dsv4;              /* DeepSeek-V4: the layers keep their attention state (cpu_dsv4.h; trimmed
                               by hm_dsv4_can_trim), on the CPU in aux, on the GPU per device */
    float *aux;             /* DeepSeek-V4 on the CPU: every layer's attention state, owned */
    size_t *aux_off;        /* [n_layer] layer il's floats from aux on, owned */
    struct hm_xdev *dev;    /* the GPU chain (exec_cuda.c), owned; NULL on the CPU */
    hm_op_prof *prof;       /* HOTMOE_OP_PROFILE: the ops' times, owned; NULL: none */
} hm_exec_state;

/* exec_cpu.c: the host state of s; a CPU pass over n_seq sequences (forward_multi's contract). */
hm_status hm_exec_cpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err);
hm_status hm_exec_cpu_forward(const hm_model *m, hm_exec_state *work, hm_pool *pool, const hm_fwd_seq *seqs,
                              int n_seq, float *logits, hm_err *err);

/* Layer il's KV cache index (-1: none) and recurrent state index (-1: none). */
static inline int32_t hm_exec_kv_slot(const hm_exec_model *xm, int32_t il) {
    return xm->kv_slot ? xm->kv_slot[il] : il;
}
static inline int32_t hm_exec_rs_slot(const hm_exec_model *xm, int32_t il) {
    return xm->rs_slot ? xm->rs_slot[il] : -1;
}
#ifdef HM_HAVE_CUDA
/* exec_cuda.c: the device chain of s (and its host cold part); its close; a micro-batch on it. */
hm_status hm_exec_gpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err);
void hm_exec_gpu_state_close(hm_exec_state *s);
hm_status hm_exec_gpu_state_reset(hm_exec_state *s, hm_err *err); /* zero the recurrent state */
/* save: copy each device's recurrent state aside (allocated at the first save); restore: back */
hm_status hm_exec_gpu_state_save(hm_exec_state *s, bool restore, hm_err *err);
hm_status hm_exec_gpu_forward(const hm_model *m, hm_exec_state *s, hm_pool *pool, const hm_fwd_batch *b,
                              hm_err *err);
/* hm_exec_state_copy's device side: n bytes at byte `off` of the host layout of layer il's KV block
 * (s->kvl offsets; rs: recurrent slot il, off bytes into it) between the device that holds it and
 * host (get: device -> host after its queued work; put: host -> device, the device idle first). */
hm_status hm_exec_gpu_seg(hm_exec_state *s, bool rs, int32_t il, size_t off, void *host, size_t n, bool put,
                          hm_err *err);
#endif

/* Run the arch's description of layer il on x (x->m->arch->layer). */
static inline hm_status hm_exec_layer(hm_exec *x, int32_t il) { return x->m->arch->layer(x, x->m, il); }

#endif
