/* exec.c - the executor's backend-neutral part: the ops a layer description calls, dispatched to
 * the pass's backend (exec_impl.h), and the session entry points hm_arch points at, which pick the
 * CPU or the GPU path by the model's placement. */
#include <stdlib.h>

#include "exec_impl.h"

hm_status hm_op_rmsnorm(hm_exec *x, hm_buf in, const float *w, hm_buf out) {
    return x->ops->rmsnorm(x, in, w, out);
}

hm_status hm_op_matmul_n(hm_exec *x, hm_buf in, const hm_mat *const *ws, const hm_buf *outs, int n) {
    HM_ASSERT(n >= 1 && n <= 3);
    return x->ops->matmul_n(x, in, ws, outs, n);
}

hm_status hm_op_add_rmsnorm(hm_exec *x, hm_buf acc, hm_buf add, const float *w, hm_buf out) {
    return x->ops->add_rmsnorm(x, acc, add, w, out);
}

hm_status hm_op_qk_norm_rope_kv(hm_exec *x, int32_t il, const hm_qk_rope *p) {
    return x->ops->qk_norm_rope_kv(x, il, p);
}

hm_status hm_op_out_rows(hm_exec *x, int32_t il, const hm_buf *bufs, int n) {
    if (il != x->xm->n_layer - 1 || x->n_out >= x->n) return HM_OK;
    return x->ops->out_rows(x, il, bufs, n);
}

bool hm_exec_done(const hm_exec *x) { return x->done; }

hm_status hm_op_attention(hm_exec *x, int32_t il, hm_buf q, hm_buf out, float scale) {
    return x->ops->attention(x, il, q, out, scale);
}

hm_status hm_op_moe(hm_exec *x, int32_t il, hm_buf in, hm_buf out) { return x->ops->moe(x, il, in, out); }

/* ---- session entry points ---- */

void hm_exec_state_close(void *p) {
    hm_exec_state *s = p;
    if (!s) return;
#ifdef HM_HAVE_CUDA
    hm_exec_gpu_state_close(s);
#endif
    hm_model_state_free(s->kv, s->kv_scratch, s->act, &s->scratch, &s->route);
    free(s);
}

hm_status hm_exec_state_open(const hm_model *m, const hm_state_opts *o, void **out, hm_err *err) {
    *out = NULL;
    hm_exec_state *s = calloc(1, sizeof *s);
    if (!s) return hm_errf(err, HM_ERR_NOMEM, "out of memory");
    s->n_ctx = o->n_ctx;
    s->n_ubatch = o->n_ubatch;
    s->n_threads = o->n_threads;
    s->kv_type = o->kv_type;
    hm_status st;
#ifdef HM_HAVE_CUDA
    if (m->gpu) /* the device state instead of the host KV cache and activations */
        st = hm_exec_gpu_state_open(m, o, s, err);
    else
#endif
        st = hm_exec_cpu_state_open(m, o, s, err);
    if (st != HM_OK) {
        hm_exec_state_close(s);
        return st;
    }
    *out = s;
    return HM_OK;
}

hm_status hm_exec_state_trim(void *state, int32_t n_keep, hm_err *err) {
    (void)state;
    (void)n_keep;
    (void)err;
    return HM_OK; /* KV rows past n_keep are overwritten by the next eval */
}

hm_status hm_exec_forward(const hm_model *m, void *state, hm_pool *pool, const hm_fwd_batch *b, hm_err *err) {
#ifdef HM_HAVE_CUDA
    if (m->gpu) return hm_exec_gpu_forward(m, state, pool, b, err);
#endif
    const hm_fwd_seq seq = {.state = state, .b = *b};
    return hm_exec_forward_multi(m, state, pool, &seq, 1, b->logits, err);
}
