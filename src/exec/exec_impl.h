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
    hm_status (*out_rows)(hm_exec *x, int32_t il, const hm_buf *bufs, int n);
    hm_status (*attention)(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale);
    hm_status (*moe)(hm_exec *x, int32_t il, hm_buf in, hm_buf out);
} hm_exec_ops;

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
};

struct hm_xdev;

/* A session's state. On the CPU the host fields; with a GPU placement `dev` (the chain) and only
 * the cold units' route and scratch on the host. */
typedef struct hm_exec_state {
    int32_t n_ctx, n_ubatch;
    int n_threads;
    hm_kv_type kv_type;
    size_t kv_layer_elems;  /* n_head_kv * n_ctx * head_dim: one of K or V of one layer */
    size_t kv_elem_size;    /* 2 (f16) or 4 (f32) */
    void *kv;               /* [n_layer][2][n_head_kv][n_ctx][head_dim], owned */
    float *kv_scratch;      /* f32 cache only: attention scores, owned */
    void *act;              /* one block holding the activations below, owned */
    float *buf[HM_EXEC_MAX_BUF]; /* [U, buf_width[i]] the arch's buffers */
    float *rlog;            /* [U, n_expert] router logits */
    float *rw;              /* [U, k] routing weights */
    int32_t *rid;           /* [U, k] routed experts */
    float *hout;            /* [U, n_embd] rows whose logits are wanted */
    int32_t *pos_out;       /* [U] positions of those rows */
    int32_t *tok_all, *pos_all, *row_out; /* [U] forward_multi: the sequences' tokens, positions and
                                             wanted rows (batch indexes), concatenated */
    hm_moe_route route;
    hm_scratch scratch;
    struct hm_xdev *dev;    /* the GPU chain (exec_cuda.c), owned; NULL on the CPU */
} hm_exec_state;

/* exec_cpu.c */
hm_status hm_exec_cpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err);
#ifdef HM_HAVE_CUDA
/* exec_cuda.c: the device chain of s (and its host cold part); its close; a micro-batch on it. */
hm_status hm_exec_gpu_state_open(const hm_model *m, const hm_state_opts *o, hm_exec_state *s, hm_err *err);
void hm_exec_gpu_state_close(hm_exec_state *s);
hm_status hm_exec_gpu_forward(const hm_model *m, hm_exec_state *s, hm_pool *pool, const hm_fwd_batch *b,
                              hm_err *err);
#endif

/* Run the arch's description of layer il on x (x->m->arch->layer). */
static inline hm_status hm_exec_layer(hm_exec *x, int32_t il) { return x->m->arch->layer(x, x->m, il); }

#endif
