/* cpu_kernels.c - the matmul tile: specialised kernels per type where compiled, else vec_dot.
 *
 * Specialised kernels (AVX-512 BW + VNNI): Q4_K and Q6_K rows against Q8_K activations, Q8_0
 * rows against Q8_0 (tokens in the outer loop there: the row chunk stays in L1/L2). Each
 * weight super-block is decoded once into four 64-level vectors in the activation's element order
 * plus their per-lane scale vectors, then dotted with up to KT tokens (maddubs + dpwssd per 64
 * elements). For every (row, token) pair the instruction sequence is the same whatever the tile
 * shape, so results do not depend on how rows are chunked over threads. Block layouts come from
 * quant/quant_k_impl.h (the one definition of the formats). */
#include "cpu_kernels.h"

#include "quant/quant.h"

#define TOK_TILE 16 /* tokens per pass over a block of rows */
#define PREFETCH_ROWS 4       /* at least this many rows ahead of the one being computed */
#define PREFETCH_BYTES 4096   /* and at least this many bytes ahead (short rows: a 512-wide Q4_K row is 288) */

/* Decode streams each weight row once from DRAM; the hardware prefetcher alone leaves the dot
 * products waiting (one core, rows of an 810 MiB pool in random order: Q4_K 7.6 GB/s without,
 * 11.3 with this). Rows past the caller's range are fetched too: the next chunk usually follows.
 * always_inline: GCC 12 finds the plain inline function "pure" (a prefetch is no side effect to
 * it) and deletes the calls, whose result is unused, before it would inline them. */
static inline __attribute__((always_inline)) void prefetch_row(const hm_mat *w, int64_t r, size_t row_bytes) {
    if (r >= w->ne1) return;
    const char *p = (const char *)w->data + (size_t)r * w->nb1;
    for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

/* How many rows ahead to prefetch rows of row_bytes. */
static inline int64_t prefetch_ahead(size_t row_bytes) {
    const int64_t by_bytes = (int64_t)((PREFETCH_BYTES + row_bytes - 1) / (row_bytes ? row_bytes : 1));
    return by_bytes > PREFETCH_ROWS ? by_bytes : PREFETCH_ROWS;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define HM_KERNELS_AVX512 1
#include <immintrin.h>

#include "quant/quant_impl.h"
#include "quant/quant_k_impl.h"

#define KT 8 /* tokens per inner step */

static inline __m512i bcast256(const void *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* vpermw index: words 0-15 take scale 2c, words 16-31 scale 2c+1 (two 32-element sub-blocks). */
static inline __m512i idx_pair32(int c) {
    return _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
}
/* vpermw index: words 8k..8k+7 take scale 4h+k (four 16-element sub-blocks). */
static inline __m512i idx_quad16(int h) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14,
                                          13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_add_epi16(_mm512_srli_epi16(lane, 3), _mm512_set1_epi16((short)(4 * h)));
}

/* One Q4_K row against nt (<= KT) Q8_K token rows: out[t * ldo] = dot. */
static inline __attribute__((always_inline)) void q4k_row(const hm_block_q4_k *w, const hm_block_q8_k *const *x,
                                                          int nt, int64_t nb, float *out, int64_t ldo) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i i0 = idx_pair32(0), i1 = idx_pair32(1), i2 = idx_pair32(2), i3 = idx_pair32(3);
    __m512 acc[KT];
    for (int t = 0; t < KT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        uint64_t sc, m;
        hm_k4_unpack_scales64(w[b].scales, &sc, &m);
        const __m512 vd = _mm512_set1_ps(hm_k_half(w[b].d)), vdmin = _mm512_set1_ps(hm_k_half(w[b].dmin));
        const __m512i scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)m));
        const __m256i mdup = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
        const uint8_t *q = w[b].qs;
        const __m512i q0 = _mm512_and_si512(_mm512_srlv_epi16(bcast256(q), shift), m4);
        const __m512i q1 = _mm512_and_si512(_mm512_srlv_epi16(bcast256(q + 32), shift), m4);
        const __m512i q2 = _mm512_and_si512(_mm512_srlv_epi16(bcast256(q + 64), shift), m4);
        const __m512i q3 = _mm512_and_si512(_mm512_srlv_epi16(bcast256(q + 96), shift), m4);
        const __m512i s0 = _mm512_permutexvar_epi16(i0, scz), s1 = _mm512_permutexvar_epi16(i1, scz);
        const __m512i s2 = _mm512_permutexvar_epi16(i2, scz), s3 = _mm512_permutexvar_epi16(i3, scz);
#pragma GCC unroll 8
        for (int t = 0; t < KT; t++) {
            if (t >= nt) break;
            const hm_block_q8_k *y = &x[t][b];
            const int8_t *a = y->qs;
            /* one dependent chain per token: the KT tokens give the parallelism */
            __m512i e = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(q0, _mm512_loadu_si512(a)), s0);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(q1, _mm512_loadu_si512(a + 64)), s1);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(q2, _mm512_loadu_si512(a + 128)), s2);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(q3, _mm512_loadu_si512(a + 192)), s3);
            const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mdup);
            /* weight-side scales first (shared by all tokens), the token's scale last */
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(e), vd);
            v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)), vdmin, v);
            acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(y->d), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

/* One Q6_K row against nt (<= KT) Q8_K token rows. */
static inline __attribute__((always_inline)) void q6k_row(const hm_block_q6_k *w, const hm_block_q8_k *const *x,
                                                          int nt, int64_t nb, float *out, int64_t ldo) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i lshift = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i rshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i i0 = idx_quad16(0), i1 = idx_quad16(1), i2 = idx_quad16(2), i3 = idx_quad16(3);
    __m512 acc[KT];
    for (int t = 0; t < KT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512 vd = _mm512_set1_ps(hm_k_half(w[b].d));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        __m512i lv[4];
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(w[b].ql + 64 * h);
            const __m512i qh = bcast256(w[b].qh + 32 * h);
            lv[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, lshift), m30));
            lv[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi16(qh, rshift), m30));
        }
        const __m512i s0 = _mm512_permutexvar_epi16(i0, scz), s1 = _mm512_permutexvar_epi16(i1, scz);
        const __m512i s2 = _mm512_permutexvar_epi16(i2, scz), s3 = _mm512_permutexvar_epi16(i3, scz);
#pragma GCC unroll 8
        for (int t = 0; t < KT; t++) {
            if (t >= nt) break;
            const hm_block_q8_k *y = &x[t][b];
            const int8_t *a = y->qs;
            /* levels are q in [0, 63]; the -32 offset is applied once through the block sums */
            const __m256i offs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), sc16);
            __m512i e = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(lv[0], _mm512_loadu_si512(a)), s0);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(lv[1], _mm512_loadu_si512(a + 64)), s1);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(lv[2], _mm512_loadu_si512(a + 128)), s2);
            e = _mm512_dpwssd_epi32(e, _mm512_maddubs_epi16(lv[3], _mm512_loadu_si512(a + 192)), s3);
            const __m512i s = _mm512_sub_epi32(e, _mm512_zextsi256_si512(_mm256_slli_epi32(offs, 5)));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), vd), _mm512_set1_ps(y->d), acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

#define Q8_MAX_BLOCKS 1024 /* ne0 <= 32768 for the Q8_0 kernel (else vec_dot) */

static inline __m512i q8_pair(const hm_block_q8_0 *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[0].qs)),
                              _mm256_loadu_si256((const __m256i *)b[1].qs), 1);
}

/* One Q8_0 row against nt (<= KT) Q8_0 token rows; two blocks per zmm. |w| (u8) times x with w's
 * sign (activations are in [-127, 127], so negating them cannot overflow). dxs[t][b]: the
 * tokens' block scales as f32. */
static inline __attribute__((always_inline)) void q80_row(const hm_block_q8_0 *w, const hm_block_q8_0 *const *x,
                                                          const float (*dxs)[Q8_MAX_BLOCKS], int nt, int64_t nb,
                                                          float *out, int64_t ldo) {
    __m512 acc[KT];
    for (int t = 0; t < KT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        const __m512i wv = q8_pair(w + b);
        const __m512i wabs = _mm512_abs_epi8(wv);
        const __mmask64 neg = _mm512_movepi8_mask(wv);
        const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(hm_k_half(w[b].d)), _mm256_set1_ps(hm_k_half(w[b + 1].d)), 1);
#pragma GCC unroll 8
        for (int t = 0; t < KT; t++) {
            if (t >= nt) break;
            const __m512i xv = q8_pair(x[t] + b);
            const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs, _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv));
            const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(dxs[t][b]), _mm256_set1_ps(dxs[t][b + 1]), 1);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), dw), dx, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t * ldo] = _mm512_reduce_add_ps(acc[t]);
}

static bool q80_rows(const hm_mat *w, int64_t r0, int64_t r1, const char *xq, size_t xs,
                     const int32_t *xidx, int64_t n_tok, float *y, int64_t ldy) {
    const int64_t nb = w->ne0 / HM_QK8_0;
    if (nb % 2 || nb > Q8_MAX_BLOCKS) return false;
    const size_t row_bytes = hm_row_size(w->type, w->ne0);
    const int64_t ahead = prefetch_ahead(row_bytes);
    const hm_block_q8_0 *xr[KT];
    static _Thread_local float dxs[KT][Q8_MAX_BLOCKS];
    for (int64_t t0 = 0; t0 < n_tok; t0 += KT) {
        const int nt = (int)(n_tok - t0 < KT ? n_tok - t0 : KT);
        for (int i = 0; i < nt; i++) {
            xr[i] = (const hm_block_q8_0 *)(xq + (size_t)(xidx ? xidx[t0 + i] : t0 + i) * xs);
            for (int64_t b = 0; b < nb; b++) dxs[i][b] = hm_k_half(xr[i][b].d);
        }
        for (int64_t r = r0; r < r1; r++) {
            if (t0 == 0) prefetch_row(w, r + ahead, row_bytes);
            q80_row((const hm_block_q8_0 *)((const char *)w->data + (size_t)r * w->nb1), xr,
                    (const float (*)[Q8_MAX_BLOCKS])dxs, nt, nb, &y[t0 * ldy + r], ldy);
        }
    }
    return true;
}

static bool kernel_rows(const hm_mat *w, int64_t r0, int64_t r1, const char *xq, size_t xs,
                        const int32_t *xidx, int64_t n_tok, float *y, int64_t ldy) {
    /* one token: nothing to reuse, the traits' vec_dot is as fast */
    if (n_tok < 2) return false;
    if (w->type == HM_TYPE_Q8_0) return q80_rows(w, r0, r1, xq, xs, xidx, n_tok, y, ldy);
    if (w->type != HM_TYPE_Q4_K && w->type != HM_TYPE_Q6_K) return false;
    const int64_t nb = w->ne0 / HM_QK_K;
    const size_t row_bytes = hm_row_size(w->type, w->ne0);
    const int64_t ahead = prefetch_ahead(row_bytes);
    const hm_block_q8_k *xr[KT];
    for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
        const int64_t t1 = t0 + TOK_TILE < n_tok ? t0 + TOK_TILE : n_tok;
        for (int64_t r = r0; r < r1; r++) {
            const void *wr = (const char *)w->data + (size_t)r * w->nb1;
            if (t0 == 0) prefetch_row(w, r + ahead, row_bytes);
            for (int64_t t = t0; t < t1; t += KT) {
                const int nt = (int)(t1 - t < KT ? t1 - t : KT);
                for (int i = 0; i < nt; i++)
                    xr[i] = (const hm_block_q8_k *)(xq + (size_t)(xidx ? xidx[t + i] : t + i) * xs);
                if (w->type == HM_TYPE_Q4_K) q4k_row(wr, xr, nt, nb, &y[t * ldy + r], ldy);
                else q6k_row(wr, xr, nt, nb, &y[t * ldy + r], ldy);
            }
        }
    }
    return true;
}
#endif

void hm_cpu_rows(const hm_mat *w, int64_t r0, int64_t r1, const char *xq, size_t xs,
                 const int32_t *xidx, int64_t n_tok, float *y, int64_t ldy) {
#ifdef HM_KERNELS_AVX512
    if (kernel_rows(w, r0, r1, xq, xs, xidx, n_tok, y, ldy)) return;
#endif
    const hm_vec_dot_fn dot = hm_type_get(w->type)->vec_dot;
    const int64_t ne0 = w->ne0;
    const size_t row_bytes = hm_row_size(w->type, ne0);
    const int64_t ahead = prefetch_ahead(row_bytes);
    for (int64_t t0 = 0; t0 < n_tok; t0 += TOK_TILE) {
        const int64_t t1 = t0 + TOK_TILE < n_tok ? t0 + TOK_TILE : n_tok;
        for (int64_t r = r0; r < r1; r++) {
            const char *wr = (const char *)w->data + (size_t)r * w->nb1;
            if (t0 == 0) prefetch_row(w, r + ahead, row_bytes);
            for (int64_t t = t0; t < t1; t++) {
                const char *xr = xq + (size_t)(xidx ? xidx[t] : t) * xs;
                dot(ne0, &y[t * ldy + r], wr, xr);
            }
        }
    }
}
