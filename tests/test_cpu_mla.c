/* test_cpu_mla.c - multi-head latent attention (DeepSeek-V2/V3, model/deepseek2.c) on the CPU: the
 * absorbed form hotmoe runs (hm_cpu_mla_in, the compressed row into a one-head cache whose V is
 * its K (hm_cpu_mla_kv_write), hm_cpu_matmul_heads through attn_k_b, hm_cpu_mla_attention, attn_v_b)
 * against a double-precision reference of the decompressed form (per head k = [K_b^T c | k_pe], v = V_b c,
 * plain causal multi-head attention over the weights' values), in one pass, in chunks of 7 and token
 * by token, over F32, F16 and Q8_0 caches; weights F32 and F16. Bounds relative to the output's
 * rms: the F32 cache is exact up to float rounding (2e-4), an F16 cache rounds c and k_pe (5e-3),
 * Q8_0 more (4e-2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_mla.h"
#include "core/alloc.h"
#include "core/fp16.h"
#include "model/model.h"
#include "quant/quant.h"
#include "test.h"

enum { H = 4, NOPE = 32, ROT = 32, LORA = 64, VD = 48, QK = NOPE + ROT, AW = LORA + ROT, N_CTX = 48 };

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The reference in double over the decompressed heads: rows [0, n) at positions 0..n-1, each
 * attending to positions <= its own. w_kb [H][LORA][NOPE], w_vb [H][VD][LORA] as float values. */
static void reference(const float *q, const float *kv_in, const float *w_kb, const float *w_vb, const float *norm,
                      const float *ff, float theta, float scale, int n, double *out) {
    double *c = calloc((size_t)n * LORA, sizeof *c), *kpe = calloc((size_t)n * ROT, sizeof *kpe);
    double *qpe = calloc((size_t)n * H * ROT, sizeof *qpe), *k = calloc((size_t)n * H * QK, sizeof *k);
    double *v = calloc((size_t)n * H * VD, sizeof *v), *p = calloc((size_t)n, sizeof *p);
    for (int t = 0; t < n; t++) {
        const float *r = kv_in + (size_t)t * AW;
        double ss = 0;
        for (int i = 0; i < LORA; i++) ss += (double)r[i] * r[i];
        const double inv = 1.0 / sqrt(ss / LORA + 1e-6);
        for (int i = 0; i < LORA; i++) c[t * LORA + i] = r[i] * inv * norm[i];
        for (int i = 0; i < ROT / 2; i++) { /* interleaved pairs */
            const double a = t * pow(theta, -2.0 * i / ROT) / ff[i];
            const double x0 = r[LORA + 2 * i], x1 = r[LORA + 2 * i + 1];
            kpe[t * ROT + 2 * i] = x0 * cos(a) - x1 * sin(a);
            kpe[t * ROT + 2 * i + 1] = x0 * sin(a) + x1 * cos(a);
            for (int h = 0; h < H; h++) {
                const float *qh = q + ((size_t)t * H + h) * QK + NOPE;
                qpe[(t * H + h) * ROT + 2 * i] = qh[2 * i] * cos(a) - qh[2 * i + 1] * sin(a);
                qpe[(t * H + h) * ROT + 2 * i + 1] = qh[2 * i] * sin(a) + qh[2 * i + 1] * cos(a);
            }
        }
        for (int h = 0; h < H; h++) {
            for (int j = 0; j < NOPE; j++) { /* k_nope = K_b^T c */
                double s = 0;
                for (int l = 0; l < LORA; l++) s += (double)w_kb[((size_t)h * LORA + l) * NOPE + j] * c[t * LORA + l];
                k[(t * H + h) * QK + j] = s;
            }
            for (int j = 0; j < ROT; j++) k[(t * H + h) * QK + NOPE + j] = kpe[t * ROT + j];
            for (int j = 0; j < VD; j++) {
                double s = 0;
                for (int l = 0; l < LORA; l++) s += (double)w_vb[((size_t)h * VD + j) * LORA + l] * c[t * LORA + l];
                v[(t * H + h) * VD + j] = s;
            }
        }
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            double mx = -1e300, den = 0;
            for (int u = 0; u <= t; u++) {
                double s = 0;
                for (int j = 0; j < NOPE; j++) s += (double)q[((size_t)t * H + h) * QK + j] * k[(u * H + h) * QK + j];
                for (int j = 0; j < ROT; j++) s += qpe[(t * H + h) * ROT + j] * k[(u * H + h) * QK + NOPE + j];
                p[u] = s * scale;
                if (p[u] > mx) mx = p[u];
            }
            for (int u = 0; u <= t; u++) den += (p[u] = exp(p[u] - mx));
            for (int j = 0; j < VD; j++) {
                double s = 0;
                for (int u = 0; u <= t; u++) s += p[u] * v[(u * H + h) * VD + j];
                out[((size_t)t * H + h) * VD + j] = s / den;
            }
        }
    free(c), free(kpe), free(qpe), free(k), free(v), free(p);
}

/* The absorbed form as deepseek2.c runs it, over chunks of `chunk` rows; out [n, H * VD]. */
static void absorbed(hm_pool *pool, hm_kv_type kv_type, const float *q_in, const float *kv_in, const hm_mat *kb,
                     size_t kb_nb2, const hm_mat *vb, size_t vb_nb2, const float *norm, const float *ff, float theta,
                     float scale, int n, int chunk, float *out) {
    hm_err err = {0};
    const int rt = hm_kv_row_type(kv_type);
    void *kv = NULL;
    float *att_scratch = NULL;
    hm_scratch sc = {0};
    CHECK(hm_model_kv_alloc(&kv, (size_t)N_CTX * hm_row_size(rt, AW), kv_type, N_CTX, &err) == HM_OK);
    CHECK(hm_model_att_scratch_alloc(&att_scratch, hm_cpu_mla_scratch_floats(H, AW, 2), &err) == HM_OK);
    CHECK(hm_model_scratch_alloc(&sc, hm_cpu_matmul_scratch_size(AW, N_CTX, 2), &err) == HM_OK);
    float *q = malloc(sizeof(float) * (size_t)chunk * H * QK), *kvr = malloc(sizeof(float) * (size_t)chunk * AW);
    float *qa = malloc(sizeof(float) * (size_t)chunk * H * AW), *lat = malloc(sizeof(float) * (size_t)chunk * H * AW);
    float *tin = malloc(sizeof(float) * (size_t)chunk * LORA), *tout = malloc(sizeof(float) * (size_t)chunk * LORA);
    int32_t pos[N_CTX];
    for (int t0 = 0; t0 < n; t0 += chunk) {
        const int m = n - t0 < chunk ? n - t0 : chunk;
        for (int i = 0; i < m; i++) pos[i] = t0 + i;
        memcpy(q, q_in + (size_t)t0 * H * QK, sizeof(float) * (size_t)m * H * QK);
        memcpy(kvr, kv_in + (size_t)t0 * AW, sizeof(float) * (size_t)m * AW);
        hm_cpu_mla_in(pool, q, qa, kvr, m, H, NOPE, LORA, ROT, pos, theta, ff, norm, 1e-6f);
        hm_cpu_mla_kv_write(pool, rt, kv, AW, kvr, m, pos);
        hm_cpu_matmul_heads(pool, kb, kb_nb2, H, q, QK, m, qa, AW, tin, tout, &sc);
        hm_cpu_mla_attention(pool, rt, qa, m, pos, kv, H, AW, scale, lat, att_scratch);
        hm_cpu_matmul_heads(pool, vb, vb_nb2, H, lat, AW, m, out + (size_t)t0 * H * VD, VD, tin, tout, &sc);
    }
    free(q), free(kvr), free(qa), free(lat), free(tin), free(tout);
    hm_free_aligned(kv);
    hm_free_aligned(att_scratch);
    hm_free_aligned(sc.data);
}

/* Weights of type `type` from floats (rows of ne0), and the values they hold back as floats. */
static void *make_weights(int type, float *w, int64_t rows, int64_t ne0) {
    const size_t rs = hm_row_size(type, ne0);
    char *d = hm_malloc_aligned(rs * (size_t)rows);
    const hm_type_traits *tr = hm_type_get(type);
    for (int64_t r = 0; r < rows; r++) {
        tr->from_float_ref(w + r * ne0, d + (size_t)r * rs, ne0);
        tr->to_float(d + (size_t)r * rs, w + r * ne0, ne0);
    }
    return d;
}

int main(void) {
    hm_pool *pool = NULL;
    CHECK(hm_pool_open(&pool, 2, NULL) == HM_OK);
    const int n = 41;
    unsigned s = 7;
    float *q = malloc(sizeof(float) * (size_t)n * H * QK), *kv = malloc(sizeof(float) * (size_t)n * AW);
    float *kb = malloc(sizeof(float) * H * LORA * NOPE), *vb = malloc(sizeof(float) * H * VD * LORA);
    float norm[LORA], ff[ROT / 2];
    for (int i = 0; i < n * H * QK; i++) q[i] = frand(&s) * 1.5f;
    for (int i = 0; i < n * AW; i++) kv[i] = frand(&s) * 1.5f;
    for (int i = 0; i < LORA; i++) norm[i] = 1.0f + 0.1f * frand(&s);
    for (int i = 0; i < ROT / 2; i++) ff[i] = 1.0f + 3.0f * (float)i / (ROT / 2); /* YaRN-like divisors */
    const float theta = 10000.0f, scale = 1.3f / sqrtf((float)QK);
    double *ref = malloc(sizeof(double) * (size_t)n * H * VD);
    float *got = malloc(sizeof(float) * (size_t)n * H * VD);
    const int wtypes[] = {HM_TYPE_F32, HM_TYPE_F16};
    for (size_t wi = 0; wi < 2; wi++) {
        s = 99;
        for (int i = 0; i < H * LORA * NOPE; i++) kb[i] = frand(&s) * 0.3f;
        for (int i = 0; i < H * VD * LORA; i++) vb[i] = frand(&s) * 0.3f;
        void *kbd = make_weights(wtypes[wi], kb, H * LORA, NOPE), *vbd = make_weights(wtypes[wi], vb, H * VD, LORA);
        const hm_mat mk = {kbd, wtypes[wi], NOPE, LORA, hm_row_size(wtypes[wi], NOPE)};
        const hm_mat mv = {vbd, wtypes[wi], LORA, VD, hm_row_size(wtypes[wi], LORA)};
        reference(q, kv, kb, vb, norm, ff, theta, scale, n, ref);
        double rms = 0;
        for (int i = 0; i < n * H * VD; i++) rms += ref[i] * ref[i];
        rms = sqrt(rms / (n * H * VD));
        const struct { hm_kv_type kv; int chunk; double tol; } runs[] = {
            {HM_KV_F32, 32, 2e-4}, {HM_KV_F32, 1, 2e-4}, {HM_KV_F32, 7, 2e-4},
            {HM_KV_F16, 32, 5e-3}, {HM_KV_F16, 1, 5e-3}, {HM_KV_Q8_0, 32, 4e-2}, {HM_KV_Q8_0, 1, 4e-2}};
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
            absorbed(pool, runs[r].kv, q, kv, &mk, mk.nb1 * LORA, &mv, mv.nb1 * VD, norm, ff, theta, scale, n,
                     runs[r].chunk, got);
            double e = 0;
            for (int i = 0; i < n * H * VD; i++) e = fmax(e, fabs(got[i] - ref[i]));
            const double tol = runs[r].tol;
            fprintf(stderr, "weights %s, cache %s, chunks of %d: max |absorbed - reference| %.3g (rms %.3g)\n",
                    hm_type_name(wtypes[wi]), hm_kv_type_name(runs[r].kv), runs[r].chunk, e, rms);
            CHECKF(e <= tol * rms, "%s cache, chunk %d: %g > %g", hm_kv_type_name(runs[r].kv), runs[r].chunk, e,
                   tol * rms);
        }
        hm_free_aligned(kbd);
        hm_free_aligned(vbd);
    }
    free(q), free(kv), free(kb), free(vb), free(ref), free(got);
    hm_pool_close(pool);
    return test_done();
}
