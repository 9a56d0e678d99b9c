/* cpu_kernels.h - the inner matmul tile shared by matmul and moe (internal to backend/cpu).
 *
 * hm_cpu_rows computes a block of weight rows against a set of activation rows. The generic path is
 * one traits vec_dot per (row, token), tokens tiled so the rows stay in cache; type-specific kernels
 * (where compiled) decode each weight block once and reuse it for several tokens. */
#ifndef HM_BACKEND_CPU_KERNELS_H
#define HM_BACKEND_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_ops.h"

/* y[t * ldy + r] = dot(row r of w, activation row t) for r in [r0, r1), t < n_tok. xq holds the
 * activation rows quantised to w's partner type (raw f32 when the partner is F32), xs bytes apart;
 * activation row t is xq + (xidx ? xidx[t] : t) * xs. */
void hm_cpu_rows(const hm_mat *w, int64_t r0, int64_t r1, const char *xq, size_t xs,
                 const int32_t *xidx, int64_t n_tok, float *y, int64_t ldy);

#endif
