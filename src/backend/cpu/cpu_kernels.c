/* cpu_kernels.c - the matmul tile: specialised kernels per type where compiled, else vec_dot. */
#include "cpu_kernels.h"

#include "quant/quant.h"

#define TOK_TILE 16 /* tokens per pass over a block of rows */

void hm_cpu_rows(const hm_mat *w, int64_t r0, int64_t r1, const char *xq, size_t xs,
                 const int32_t *xidx, int64_t n_tok, float *y, int64_t ldy) {
    const hm_vec_dot_fn dot = hm_type_get(w->type)->vec_dot;
    const int64_t ne0 = w->ne0;
    for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
        const int64_t t1 = t0 + TOK_TILE < n_tok ? t0 + TOK_TILE : n_tok;
        for (int64_t r = r0; r < r1; r++) {
            const char *wr = (const char *)w->data + (size_t)r * w->nb1;
            for (int64_t t = t0; t < t1; t++) {
                const char *xr = xq + (size_t)(xidx ? xidx[t] : t) * xs;
                dot(ne0, &y[t * ldy + r], wr, xr);
            }
        }
    }
}
