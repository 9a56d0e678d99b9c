/* cpu_rope.c - RoPE with llama.cpp's "normal" pairing (llama, Mixtral): dims (2i, 2i + 1) of each
 * head rotate together, i < n_rot / 2, by angle pos * theta^(-2i/n_rot) (/ ff[i] with RoPE
 * scaling), in double as the NEOX ops compute it; dims from n_rot on are left as they are. */
#include <math.h>

#include "cpu_ops.h"
#include "core/status.h"

typedef struct rope_norm_ctx {
    float *x;
    const int32_t *pos;
    const float *ff;
    int64_t n_tok;
    int n_head, head_dim, n_rot;
    float theta;
} rope_norm_ctx;

static void rope_norm_task(void *p, int ith, int nth) {
    const rope_norm_ctx *c = p;
    const int64_t n = c->n_tok * c->n_head, lo = n * ith / nth, hi = n * (ith + 1) / nth;
    for (int64_t r = lo; r < hi; r++) {
        float *v = c->x + (size_t)r * (size_t)c->head_dim;
        const double ps = (double)c->pos[r / c->n_head];
        for (int i = 0; i < c->n_rot / 2; i++) {
            double a = ps * pow((double)c->theta, -2.0 * i / c->n_rot);
            if (c->ff) a /= (double)c->ff[i];
            const float cs = (float)cos(a), sn = (float)sin(a);
            const float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cs - x1 * sn;
            v[2 * i + 1] = x0 * sn + x1 * cs;
        }
    }
}

void hm_cpu_rope_norm(hm_pool *pool, float *x, int64_t n_tok, int n_head, int head_dim, int n_rot,
                      const int32_t *pos, float theta_base, const float *ff) {
    HM_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    rope_norm_ctx c = {.x = x, .pos = pos, .ff = ff, .n_tok = n_tok, .n_head = n_head, .head_dim = head_dim,
                       .n_rot = n_rot, .theta = theta_base};
    hm_pool_run(pool, rope_norm_task, &c);
}
