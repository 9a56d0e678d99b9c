/* test_cuda_ops_gpu.c - the CUDA backend's ops against naive double-precision references written
 * here (the backend-ops test of the CUDA side), plus a decode-matvec bandwidth print.
 *
 * Weights of every CUDA type are made by quantising random floats with the type's reference
 * from_float and dequantising them with to_float_ref, so the reference multiplies the exact
 * weights the GPU decodes. Bounds (NMSE = sum (y - ref)^2 / sum ref^2):
 *   f32 paths (matvec, MoE, norms, rope, softmax, router, attention): float rounding only;
 *   prefill matmul: weights and activations rounded to bf16 for the tensor cores.
 * The decode row ops (rmsnorm, add_rmsnorm, the per-head norms, RoPE, qk_norm_rope_kv, router,
 * attention) run with both kernel sets of the test hook (old and new), at the shapes that take each
 * path of the new kernels (float4 and scalar loads, rows in registers and the loop kernel, one or
 * two quads a lane, padding), and the fused ops are checked bit-identical with the ops they fuse.
 * Exits 77 ("skipped: no GPU") where there is no CUDA device: what CI sees. */
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_ops.h"
#include "core/fp16.h"
#include "cuda_test.h"
#include "quant/quant.h"
#include "test.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static double rnd_u(void) { return rnd_unit(&rng_state); }
static float rnd_n(void) { return rnd_normal(&rng_state); }
static void fill(float *x, int64_t n, float scale) { fill_normal(&rng_state, x, n, scale); }
/* The double reference of one expert unit on one token, added into dst: dst += w * down(silu(gate x) *
 * up x), from the dequantised matrices. hbuf: [n_ff] work space. */
static void ref_unit_add(const float *gate, const float *up, const float *down, const float *xv, int64_t n_embd,
                         int64_t n_ff, double w, double *hbuf, double *dst) {
    for (int64_t r = 0; r < n_ff; r++) {
        double a = 0, b = 0;
        for (int64_t c = 0; c < n_embd; c++) {
            a += (double)gate[r * n_embd + c] * xv[c];
            b += (double)up[r * n_embd + c] * xv[c];
        }
        hbuf[r] = a / (1.0 + exp(-a)) * b;
    }
    for (int64_t r = 0; r < n_embd; r++) {
        double d = 0;
        for (int64_t c = 0; c < n_ff; c++) d += (double)down[r * n_ff + c] * hbuf[c];
        dst[r] += w * d;
    }
}

static double nmse(const float *y, const double *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        e += d * d;
        s += ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}
static void *dev_from(const void *host, size_t n) {
    void *d;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_upload(ctx, d, host, n, &err));
    return d;
}
static void *dev_zero(size_t n) {
    void *d;
    CK(hm_cuda_alloc(ctx, n, &d, &err));
    CK(hm_cuda_memset(ctx, d, 0, n, &err));
    return d;
}
static void dev_to(void *host, const void *d, size_t n) { CK(hm_cuda_download(ctx, host, d, n, &err)); }

static const int types[] = {HM_TYPE_F32,  HM_TYPE_F16,  HM_TYPE_BF16, HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_Q5_0,
                            HM_TYPE_MXFP4, HM_TYPE_Q4_K, HM_TYPE_Q5_K, HM_TYPE_Q6_K, HM_TYPE_IQ4_XS,
                            HM_TYPE_Q4_1, HM_TYPE_Q5_1, HM_TYPE_IQ4_NL, HM_TYPE_Q2_K, HM_TYPE_Q3_K,
                            HM_TYPE_IQ2_XXS, HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, HM_TYPE_IQ3_XXS, HM_TYPE_IQ3_S,
                            HM_TYPE_IQ1_S, HM_TYPE_IQ1_M};
#define N_TYPES ((int)(sizeof types / sizeof types[0]))

/* Random weights of `type`: quantised bytes (host) and their exact dequantisation. */
typedef struct {
    void *q;     /* host bytes, ne1 rows of rs */
    float *deq;  /* [ne1, ne0] */
    size_t rs;
} tmat;

static tmat make_weights(int type, int64_t ne0, int64_t ne1) {
    const hm_type_traits *tr = hm_type_get(type);
    tmat m;
    m.rs = hm_row_size(type, ne0);
    m.q = xmalloc(m.rs * (size_t)ne1);
    m.deq = xmalloc(sizeof(float) * (size_t)(ne0 * ne1));
    float *src = xmalloc(sizeof(float) * (size_t)ne0);
    for (int64_t r = 0; r < ne1; r++) {
        fill(src, ne0, 0.5f);
        tr->from_float_ref(src, (char *)m.q + (size_t)r * m.rs, ne0);
        tr->to_float_ref((char *)m.q + (size_t)r * m.rs, m.deq + r * ne0, ne0);
    }
    free(src);
    return m;
}
static void free_weights(tmat *m) {
    free(m->q);
    free(m->deq);
}

/* ---- the device block decoders, run on the host: bit-exact with to_float_ref (no GPU needed) ---- */

static void test_decoders_host(void) {
    const int64_t ne0 = 1024;
    float *src = xmalloc(sizeof(float) * (size_t)ne0), *a = xmalloc(sizeof(float) * (size_t)ne0),
          *b = xmalloc(sizeof(float) * (size_t)ne0);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = types[ti];
        const hm_type_traits *tr = hm_type_get(type);
        const size_t rs = hm_row_size(type, ne0);
        unsigned char *q = xmalloc(rs);
        int bad = 0;
        for (int r = 0; r < 64; r++) {
            if (r < 32) { /* quantised random data */
                fill(src, ne0, r < 16 ? 0.5f : 100.0f);
                tr->from_float_ref(src, q, ne0);
            } else { /* random bytes: every scale / exponent bit pattern */
                for (size_t i = 0; i < rs; i++) q[i] = (unsigned char)(rnd_u() * 256);
                if (type == HM_TYPE_F32) fill((float *)q, ne0, 1.0f);
            }
            tr->to_float_ref(q, a, ne0);
            CK(hm_cuda_dequant_row_host(type, q, ne0, b, &err));
            for (int64_t i = 0; i < ne0; i++)
                if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i]))) bad++;
        }
        CHECKF(bad == 0, "device decoder %s on the host: %d elements differ from to_float_ref", tr->name, bad);
        free(q);
    }
    printf("device block decoders (run on the host) bit-exact with to_float_ref for %d types\n", N_TYPES);
    free(src);
    free(a);
    free(b);
}

/* ---- matmul: decode matvec and prefill tiles, every type ---- */

/* One type at one shape (ne0 x ne1) against the double reference. */
static void test_matmul_case(int type, int64_t ne0, int64_t ne1) {
    const int64_t toks[] = {1, 2, 3, 5, 8, 9, 33, 100};
    const int64_t max_tok = 100;
    float *x = xmalloc(sizeof(float) * (size_t)(max_tok * ne0));
    fill(x, max_tok * ne0, 1.0f);
    float *dx = dev_from(x, sizeof(float) * (size_t)(max_tok * ne0));
    float *dy = dev_zero(sizeof(float) * (size_t)(max_tok * ne1));
    float *y = xmalloc(sizeof(float) * (size_t)(max_tok * ne1));
    double *ref = xmalloc(sizeof(double) * (size_t)(max_tok * ne1));
    {
        tmat m = make_weights(type, ne0, ne1);
        void *dw = dev_from(m.q, m.rs * (size_t)ne1);
        hm_cuda_mat w = {dw, type, ne0, ne1, m.rs};
        for (int64_t t = 0; t < max_tok; t++)
            for (int64_t r = 0; r < ne1; r++) {
                double s = 0;
                for (int64_t k = 0; k < ne0; k++) s += (double)m.deq[r * ne0 + k] * (double)x[t * ne0 + k];
                ref[t * ne1 + r] = s;
            }
        double worst_mv = 0, worst_mm = 0, worst_old = 0;
        for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++)
        for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
            const int64_t nt = toks[i];
            if (kern == HM_CUDA_KERN_OLD && nt > HM_CUDA_MATVEC_MAX_TOK) continue;
            hm_cuda_set_kern(ctx, kern);
            CK(hm_cuda_memset(ctx, dy, 0xff, sizeof(float) * (size_t)(max_tok * ne1), &err)); /* NaNs */
            CK(hm_cuda_matmul(ctx, &w, dx, nt, dy, &err));
            dev_to(y, dy, sizeof(float) * (size_t)(nt * ne1));
            const double e = nmse(y, ref, nt * ne1);
            const bool mv = nt <= HM_CUDA_MATVEC_MAX_TOK;
            const double bound = mv ? 1e-10 : 1e-4;
            CHECKF(e < bound, "matmul %s %lld x %lld n_tok %lld (%s kernel): nmse %.3g (bound %.0e)",
                   hm_type_name(type), (long long)ne1, (long long)ne0, (long long)nt,
                   kern == HM_CUDA_KERN_OLD ? "old" : "new", e, bound);
            if (kern == HM_CUDA_KERN_OLD) {
                if (e > worst_old) worst_old = e;
                continue;
            }
            if (mv && e > worst_mv) worst_mv = e;
            if (!mv && e > worst_mm) worst_mm = e;
        }
        hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
        printf("matmul %-7s %4lld x %4lld: decode matvec nmse old %.2e new %.2e   prefill tiles (bf16 wmma) "
               "nmse %.2e\n", hm_type_name(type), (long long)ne1, (long long)ne0, worst_old, worst_mv, worst_mm);
        hm_cuda_free(ctx, dw);
        free_weights(&m);
    }
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dy);
    free(x);
    free(y);
    free(ref);
}

static void test_matmul(void) {
    for (int ti = 0; ti < N_TYPES; ti++) test_matmul_case(types[ti], 512, 200);
    /* the 32-blocks types at widths no 256-block fits: gemma4's dense ffn_down (2112) and
     * ffn_down_exps (704), which llama.cpp's Q4_K_M writes as Q5_0 / Q8_0, and 800 (25 blocks: every
     * other row starts 2 bytes past a 4-byte boundary) */
    const int t32[] = {HM_TYPE_Q5_0, HM_TYPE_Q8_0, HM_TYPE_Q4_0};
    const int64_t w32[] = {2112, 704, 800};
    for (size_t i = 0; i < sizeof t32 / sizeof t32[0]; i++)
        for (size_t j = 0; j < sizeof w32 / sizeof w32[0]; j++) test_matmul_case(t32[i], w32[j], 70);
}

/* ---- get_rows ---- */

static void test_get_rows_at(int64_t ne0, const int *tys, int n_tys) {
    const int64_t ne1 = 50, n_ids = 7;
    const int32_t ids[7] = {3, 0, 49, 3, 17, 25, 48};
    int32_t *dids = dev_from(ids, sizeof ids);
    float *dout = dev_zero(sizeof(float) * (size_t)(n_ids * ne0));
    float *out = xmalloc(sizeof(float) * (size_t)(n_ids * ne0));
    double *ref = xmalloc(sizeof(double) * (size_t)(n_ids * ne0));
    for (int ti = 0; ti < n_tys; ti++) {
        tmat m = make_weights(tys[ti], ne0, ne1);
        void *dw = dev_from(m.q, m.rs * (size_t)ne1);
        hm_cuda_mat w = {dw, tys[ti], ne0, ne1, m.rs};
        CK(hm_cuda_get_rows(ctx, &w, dids, n_ids, dout, &err));
        dev_to(out, dout, sizeof(float) * (size_t)(n_ids * ne0));
        for (int64_t i = 0; i < n_ids; i++)
            for (int64_t k = 0; k < ne0; k++) ref[i * ne0 + k] = m.deq[ids[i] * ne0 + k];
        const double e = nmse(out, ref, n_ids * ne0);
        CHECKF(e < 1e-12, "get_rows %s width %lld: nmse %.3g", hm_type_name(tys[ti]), (long long)ne0, e);
        printf("get_rows %-7s width %4lld nmse %.2e\n", hm_type_name(tys[ti]), (long long)ne0, e);
        hm_cuda_free(ctx, dw);
        free_weights(&m);
    }
    hm_cuda_free(ctx, dids);
    hm_cuda_free(ctx, dout);
    free(out);
    free(ref);
}

static void test_get_rows(void) {
    test_get_rows_at(768, types, N_TYPES);
    const int t32[] = {HM_TYPE_Q5_0, HM_TYPE_Q8_0, HM_TYPE_Q4_0}; /* 25 blocks a row: rows 2-aligned only */
    test_get_rows_at(800, t32, 3);
}

/* ---- row and elementwise ops ---- */

static const char *kern_name(int kern) { return kern == HM_CUDA_KERN_OLD ? "old" : "new"; }

static void test_row_ops_at(int kern) {
    hm_cuda_set_kern(ctx, kern);
    printf("-- row ops, %s kernels\n", kern_name(kern));
    const int64_t n_rows = 5, n = 2048;
    const size_t bytes = sizeof(float) * (size_t)(n_rows * n);
    float *x = xmalloc(bytes), *b = xmalloc(bytes), *w = xmalloc(sizeof(float) * (size_t)n), *y = xmalloc(bytes);
    double *ref = xmalloc(sizeof(double) * (size_t)(n_rows * n));
    fill(x, n_rows * n, 2.0f);
    fill(b, n_rows * n, 1.0f);
    fill(w, n, 1.0f);
    float *dx = dev_from(x, bytes), *db = dev_from(b, bytes), *dw = dev_from(w, sizeof(float) * (size_t)n);
    float *dy = dev_zero(bytes);
    const float eps = 1e-6f;

    /* rmsnorm, with and without weight */
    for (int with_w = 0; with_w < 2; with_w++) {
        CK(hm_cuda_rmsnorm(ctx, dx, with_w ? dw : NULL, dy, n_rows, n, eps, &err));
        dev_to(y, dy, bytes);
        for (int64_t r = 0; r < n_rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
            double sc = 1.0 / sqrt(ss / (double)n + eps);
            for (int64_t i = 0; i < n; i++) ref[r * n + i] = x[r * n + i] * sc * (with_w ? w[i] : 1.0);
        }
        double e = nmse(y, ref, n_rows * n);
        CHECKF(e < 1e-12, "rmsnorm w=%d nmse %.3g", with_w, e);
        printf("rmsnorm%s nmse %.2e\n", with_w ? "" : " (no weight)", e);
    }
    /* per-head rmsnorm: 5 rows of 2048 = 5 tokens x 16 heads x 128 */
    {
        const int n_head = 16, hd = 128;
        CK(hm_cuda_upload(ctx, dy, x, bytes, &err));
        CK(hm_cuda_rmsnorm_heads(ctx, dy, dw, n_rows, n_head, hd, eps, &err));
        dev_to(y, dy, bytes);
        for (int64_t s = 0; s < n_rows * n_head; s++) {
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)x[s * hd + i] * x[s * hd + i];
            double sc = 1.0 / sqrt(ss / hd + eps);
            for (int i = 0; i < hd; i++) ref[s * hd + i] = x[s * hd + i] * sc * w[i];
        }
        double e = nmse(y, ref, n_rows * n);
        CHECKF(e < 1e-12, "rmsnorm_heads nmse %.3g", e);
        printf("rmsnorm_heads nmse %.2e\n", e);
    }
    /* rope neox: full and partial rotation, large positions */
    for (int partial = 0; partial < 2; partial++) {
        const int n_head = 16, hd = 128, n_rot = partial ? 64 : 128;
        const int32_t pos[5] = {0, 1, 777, 4095, 31999};
        int32_t *dpos = dev_from(pos, sizeof pos);
        const float theta = 1e6f;
        CK(hm_cuda_upload(ctx, dy, x, bytes, &err));
        CK(hm_cuda_rope_neox(ctx, dy, n_rows, n_head, hd, n_rot, dpos, theta, &err));
        dev_to(y, dy, bytes);
        for (int64_t t = 0; t < n_rows; t++)
            for (int h = 0; h < n_head; h++) {
                const float *v = x + (t * n_head + h) * hd;
                double *o = ref + (t * n_head + h) * hd;
                for (int i = 0; i < hd; i++) o[i] = v[i];
                for (int i = 0; i < n_rot / 2; i++) {
                    double a = pos[t] * pow(theta, -2.0 * i / n_rot);
                    o[i] = v[i] * cos(a) - v[i + n_rot / 2] * sin(a);
                    o[i + n_rot / 2] = v[i] * sin(a) + v[i + n_rot / 2] * cos(a);
                }
            }
        double e = nmse(y, ref, n_rows * n);
        CHECKF(e < 1e-12, "rope n_rot %d nmse %.3g", n_rot, e);
        printf("rope_neox n_rot %d nmse %.2e\n", n_rot, e);
        hm_cuda_free(ctx, dpos);
    }
    /* elementwise */
    const char *names[4] = {"add", "mul", "scale", "swiglu"};
    for (int op = 0; op < 4; op++) {
        const int64_t ne = n_rows * n;
        if (op == 0) CK(hm_cuda_add(ctx, dx, db, dy, ne, &err));
        if (op == 1) CK(hm_cuda_mul(ctx, dx, db, dy, ne, &err));
        if (op == 2) CK(hm_cuda_scale(ctx, dx, 0.37f, dy, ne, &err));
        if (op == 3) CK(hm_cuda_swiglu(ctx, dx, db, dy, ne, &err));
        dev_to(y, dy, bytes);
        for (int64_t i = 0; i < ne; i++) {
            double a = x[i], bb = b[i];
            ref[i] = op == 0 ? a + bb : op == 1 ? a * bb : op == 2 ? a * 0.37f : a / (1.0 + exp(-a)) * bb;
        }
        double e = nmse(y, ref, ne);
        CHECKF(e < 1e-12, "%s nmse %.3g", names[op], e);
        printf("%s nmse %.2e\n", names[op], e);
    }
    /* softmax over rows of 1000 (not a multiple of the block) */
    {
        const int64_t rows = 3, m = 1000;
        CK(hm_cuda_upload(ctx, dy, x, sizeof(float) * (size_t)(rows * m), &err));
        CK(hm_cuda_softmax(ctx, dy, rows, m, &err));
        dev_to(y, dy, sizeof(float) * (size_t)(rows * m));
        for (int64_t r = 0; r < rows; r++) {
            double mx = -INFINITY, s = 0;
            for (int64_t i = 0; i < m; i++) mx = fmax(mx, x[r * m + i]);
            for (int64_t i = 0; i < m; i++) s += exp(x[r * m + i] - mx);
            for (int64_t i = 0; i < m; i++) ref[r * m + i] = exp(x[r * m + i] - mx) / s;
        }
        double e = nmse(y, ref, rows * m);
        CHECKF(e < 1e-12, "softmax nmse %.3g", e);
        printf("softmax nmse %.2e\n", e);
    }
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, db);
    hm_cuda_free(ctx, dw);
    hm_cuda_free(ctx, dy);
    free(x);
    free(b);
    free(w);
    free(y);
    free(ref);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
}

/* Whole-row RMSNorm at the shapes that take each path of the default kernel (one quad a thread,
 * two, the loop kernel, a row shorter than a warp, n % 4 != 0 and rows that are not 16-byte
 * aligned: scalar loads), with and without weight, against the double reference; add_rmsnorm
 * (out aliasing h) bit-identical with hm_cuda_add then hm_cuda_rmsnorm, as the header promises. */
static void test_rows_shapes(void) {
    const int64_t ns[] = {2048, 6144, 10000, 2050, 1001, 24, 1};
    const int64_t n_rows = 3;
    for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++)
        for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++)
            for (int off = 0; off < 2; off++) {
                const int64_t n = ns[si], ne = n_rows * n;
                const size_t bytes = sizeof(float) * (size_t)(ne + 1);
                hm_cuda_set_kern(ctx, kern);
                float *x = xmalloc(bytes), *h = xmalloc(bytes), *w = xmalloc(sizeof(float) * (size_t)(n + 1));
                float *y = xmalloc(bytes), *x1 = xmalloc(bytes), *x2 = xmalloc(bytes), *y2 = xmalloc(bytes);
                double *ref = xmalloc(sizeof(double) * (size_t)ne);
                fill(x, ne + 1, 2.0f);
                fill(h, ne + 1, 1.0f);
                fill(w, n + 1, 1.0f);
                float *dx = dev_from(x, bytes), *dh = dev_from(h, bytes), *dw = dev_from(w, sizeof(float) * (size_t)(n + 1));
                float *dy = dev_zero(bytes), *dx2 = dev_from(x, bytes), *dh2 = dev_from(h, bytes);
                /* off = 1: every pointer one float past a 256-byte boundary */
                float *ax = dx + off, *ah = dh + off, *aw = dw + off, *ay = dy + off, *ax2 = dx2 + off, *ah2 = dh2 + off;
                const float *hx = x + off, *hh = h + off, *hw = w + off;
                const float eps = 1e-6f;
                double worst = 0;
                for (int with_w = 0; with_w < 2; with_w++) {
                    CK(hm_cuda_rmsnorm(ctx, ax, with_w ? aw : NULL, ay, n_rows, n, eps, &err));
                    dev_to(y, ay, sizeof(float) * (size_t)ne);
                    for (int64_t r = 0; r < n_rows; r++) {
                        double ss = 0;
                        for (int64_t i = 0; i < n; i++) ss += (double)hx[r * n + i] * hx[r * n + i];
                        const double sc = 1.0 / sqrt(ss / (double)n + eps);
                        for (int64_t i = 0; i < n; i++) ref[r * n + i] = hx[r * n + i] * sc * (with_w ? hw[i] : 1.0);
                    }
                    const double e = nmse(y, ref, ne);
                    CHECKF(e < 1e-12, "rmsnorm n %lld off %d w %d (%s): nmse %.3g", (long long)n, off, with_w,
                           kern_name(kern), e);
                    if (e > worst) worst = e;
                }
                /* fused: x += h, h = rmsnorm(x) * w; unfused on copies: x2 = x2 + h2, y = rmsnorm(x2) * w */
                CK(hm_cuda_add_rmsnorm(ctx, ax, ah, aw, ah, n_rows, n, eps, &err));
                CK(hm_cuda_add(ctx, ax2, ah2, ax2, ne, &err));
                CK(hm_cuda_rmsnorm(ctx, ax2, aw, ay, n_rows, n, eps, &err));
                dev_to(x1, ax, sizeof(float) * (size_t)ne);
                dev_to(x2, ax2, sizeof(float) * (size_t)ne);
                dev_to(y, ah, sizeof(float) * (size_t)ne);
                dev_to(y2, ay, sizeof(float) * (size_t)ne);
                CHECKF(!memcmp(x1, x2, sizeof(float) * (size_t)ne), "add_rmsnorm n %lld off %d (%s): residual differs "
                       "from hm_cuda_add", (long long)n, off, kern_name(kern));
                CHECKF(!memcmp(y, y2, sizeof(float) * (size_t)ne), "add_rmsnorm n %lld off %d (%s): out differs from "
                       "add + rmsnorm", (long long)n, off, kern_name(kern));
                for (int64_t r = 0; r < n_rows; r++) {
                    double ss = 0;
                    for (int64_t i = 0; i < n; i++) {
                        const float v = hx[r * n + i] + hh[r * n + i];
                        ss += (double)v * v;
                    }
                    const double sc = 1.0 / sqrt(ss / (double)n + eps);
                    for (int64_t i = 0; i < n; i++) ref[r * n + i] = (double)(hx[r * n + i] + hh[r * n + i]) * sc * hw[i];
                }
                const double e = nmse(y, ref, ne);
                CHECKF(e < 1e-12, "add_rmsnorm n %lld off %d (%s): nmse %.3g", (long long)n, off, kern_name(kern), e);
                printf("rmsnorm n %5lld%s (%s): nmse %.2e; add_rmsnorm bit-identical with add + rmsnorm, nmse %.2e\n",
                       (long long)n, off ? " unaligned" : "          ", kern_name(kern), worst, e);
                void *fr[] = {dx, dh, dw, dy, dx2, dh2};
                for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
                free(x); free(h); free(w); free(y); free(x1); free(x2); free(y2); free(ref);
            }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
}

/* The per-head ops at one shape: hm_cuda_rmsnorm_heads and hm_cuda_rope_neox against the double
 * reference, and hm_cuda_qk_norm_rope_kv bit-identical with rmsnorm_heads, rope_neox and kv_write
 * (its contract). off = 1: q, k, v and the norm weights one float off 16-byte alignment. */
static void test_heads_case(int nh, int nkv, int hd, int n_rot, int off, int kern) {
    hm_cuda_set_kern(ctx, kern);
    const int64_t n_tok = 3, n_ctx = 32000;
    const int32_t pos[3] = {0, 777, 31999};
    const int64_t nq = n_tok * nh * hd, nk = n_tok * nkv * hd;
    const size_t qb = sizeof(float) * (size_t)(nq + 1), kb = sizeof(float) * (size_t)(nk + 1);
    const size_t cb = sizeof(uint16_t) * (size_t)(nkv * n_ctx * hd);
    float *q = xmalloc(qb), *k = xmalloc(kb), *v = xmalloc(kb), *wq = xmalloc(sizeof(float) * (size_t)(hd + 1)),
          *wk = xmalloc(sizeof(float) * (size_t)(hd + 1)), *y = xmalloc(qb), *a = xmalloc(qb), *b = xmalloc(qb);
    double *ref = xmalloc(sizeof(double) * (size_t)nq);
    fill(q, nq + 1, 2.0f);
    fill(k, nk + 1, 2.0f);
    fill(v, nk + 1, 1.0f);
    fill(wq, hd + 1, 1.0f);
    fill(wk, hd + 1, 1.0f);
    const float eps = 1e-6f, theta = 1e7f;
    const float *hq = q + off, *hwq = wq + off;
    int32_t *dpos = dev_from(pos, sizeof pos);
    float *dwq = dev_from(wq, sizeof(float) * (size_t)(hd + 1)), *dwk = dev_from(wk, sizeof(float) * (size_t)(hd + 1));
    float *dv = dev_from(v, kb), *dy = dev_from(q, qb);
    float *dq0 = dev_from(q, qb), *dk0 = dev_from(k, kb), *dq1 = dev_from(q, qb), *dk1 = dev_from(k, kb);
    uint16_t *kc0 = dev_zero(cb), *vc0 = dev_zero(cb), *kc1 = dev_zero(cb), *vc1 = dev_zero(cb);
    float *awq = dwq + off, *awk = dwk + off, *av = dv + off, *ay = dy + off;
    float *aq0 = dq0 + off, *ak0 = dk0 + off, *aq1 = dq1 + off, *ak1 = dk1 + off;

    /* rmsnorm_heads of q */
    CK(hm_cuda_rmsnorm_heads(ctx, ay, awq, n_tok, nh, hd, eps, &err));
    dev_to(y, ay, sizeof(float) * (size_t)nq);
    for (int64_t sg = 0; sg < n_tok * nh; sg++) {
        double ss = 0;
        for (int i = 0; i < hd; i++) ss += (double)hq[sg * hd + i] * hq[sg * hd + i];
        const double sc = 1.0 / sqrt(ss / hd + eps);
        for (int i = 0; i < hd; i++) ref[sg * hd + i] = hq[sg * hd + i] * sc * hwq[i];
    }
    const double e_norm = nmse(y, ref, nq);
    CHECKF(e_norm < 1e-12, "rmsnorm_heads hd %d off %d (%s): nmse %.3g", hd, off, kern_name(kern), e_norm);
    /* rope of q (the raw rows) */
    CK(hm_cuda_upload(ctx, dy, q, qb, &err));
    CK(hm_cuda_rope_neox(ctx, ay, n_tok, nh, hd, n_rot, dpos, theta, &err));
    dev_to(y, ay, sizeof(float) * (size_t)nq);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            const float *vv = hq + (t * nh + h) * hd;
            double *o = ref + (t * nh + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = vv[i];
            for (int i = 0; i < n_rot / 2; i++) {
                const double an = pos[t] * pow(theta, -2.0 * i / n_rot);
                o[i] = vv[i] * cos(an) - vv[i + n_rot / 2] * sin(an);
                o[i + n_rot / 2] = vv[i] * sin(an) + vv[i + n_rot / 2] * cos(an);
            }
        }
    const double e_rope = nmse(y, ref, nq);
    CHECKF(e_rope < 1e-12, "rope hd %d n_rot %d off %d (%s): nmse %.3g", hd, n_rot, off, kern_name(kern), e_rope);
    /* fused vs unfused */
    CK(hm_cuda_rmsnorm_heads(ctx, aq0, awq, n_tok, nh, hd, eps, &err));
    CK(hm_cuda_rmsnorm_heads(ctx, ak0, awk, n_tok, nkv, hd, eps, &err));
    CK(hm_cuda_rope_neox(ctx, aq0, n_tok, nh, hd, n_rot, dpos, theta, &err));
    CK(hm_cuda_rope_neox(ctx, ak0, n_tok, nkv, hd, n_rot, dpos, theta, &err));
    CK(hm_cuda_kv_write(ctx, kc0, vc0, n_ctx, nkv, hd, ak0, av, n_tok, dpos, &err));
    CK(hm_cuda_qk_norm_rope_kv(ctx, aq1, ak1, av, awq, awk, n_tok, nh, nkv, hd, n_rot, dpos, theta, eps, kc1, vc1,
                               n_ctx, &err));
    int bad = 0;
    dev_to(a, aq0, sizeof(float) * (size_t)nq);
    dev_to(b, aq1, sizeof(float) * (size_t)nq);
    bad += memcmp(a, b, sizeof(float) * (size_t)nq) != 0;
    dev_to(a, ak0, sizeof(float) * (size_t)nk);
    dev_to(b, ak1, sizeof(float) * (size_t)nk);
    bad += 2 * (memcmp(a, b, sizeof(float) * (size_t)nk) != 0);
    uint16_t *ca = xmalloc(cb), *cb2 = xmalloc(cb);
    dev_to(ca, kc0, cb);
    dev_to(cb2, kc1, cb);
    bad += 4 * (memcmp(ca, cb2, cb) != 0);
    dev_to(ca, vc0, cb);
    dev_to(cb2, vc1, cb);
    bad += 8 * (memcmp(ca, cb2, cb) != 0);
    CHECKF(bad == 0, "qk_norm_rope_kv %d/%d heads hd %d n_rot %d off %d (%s): differs from the unfused ops "
           "(mask %d: 1 q, 2 k, 4 K cache, 8 V cache)", nh, nkv, hd, n_rot, off, kern_name(kern), bad);
    printf("heads %2d/%d hd %3d n_rot %3d%s (%s): rmsnorm_heads nmse %.2e, rope nmse %.2e, qk_norm_rope_kv "
           "bit-identical with the unfused ops\n", nh, nkv, hd, n_rot, off ? " unaligned" : "", kern_name(kern),
           e_norm, e_rope);
    void *fr[] = {dpos, dwq, dwk, dv, dy, dq0, dk0, dq1, dk1, kc0, vc0, kc1, vc1};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
    free(q); free(k); free(v); free(wq); free(wk); free(y); free(a); free(b); free(ref); free(ca); free(cb2);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
}

static void test_heads(void) {
    for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++) {
        test_heads_case(32, 4, 128, 128, 0, kern); /* qwen3 / qwen36-geom */
        test_heads_case(32, 4, 128, 64, 1, kern);  /* partial rotation, unaligned: scalar loads */
        test_heads_case(16, 2, 256, 256, 0, kern); /* two quads a lane */
        test_heads_case(8, 4, 64, 64, 0, kern);    /* half a warp of quads */
        test_heads_case(4, 2, 98, 64, 0, kern);    /* head_dim % 4 != 0: scalar loads, a partial quad */
        test_heads_case(3, 1, 256, 128, 1, kern);  /* one block, idle warps */
    }
}

/* ---- router ---- */

/* Softmax + top-k against the double reference: ids exact (ties: lower id first), weights by NMSE.
 * Ties: two experts share the top logit; off = 1: logits off 16-byte alignment (scalar loads). */
static void test_router_case(int64_t n_tok, int n_expert, int k, int off, int kern) {
    hm_cuda_set_kern(ctx, kern);
    const int64_t nl = n_tok * n_expert;
    float *lg = xmalloc(sizeof(float) * (size_t)(nl + 1));
    fill(lg, nl + 1, 2.0f);
    float *hl = lg + off;
    const int t_tie = (int)(n_tok - 1), lo = n_expert > 3 ? 3 : 0, hi = n_expert - 1;
    hl[t_tie * n_expert + hi] = hl[t_tie * n_expert + lo] = 9.0f; /* an exact tie: lower id first */
    float *dl = dev_from(lg, sizeof(float) * (size_t)(nl + 1));
    int32_t *did = dev_zero(sizeof(int32_t) * (size_t)(n_tok * k));
    float *dwt = dev_zero(sizeof(float) * (size_t)(n_tok * k));
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_tok * k));
    float *wt = xmalloc(sizeof(float) * (size_t)(n_tok * k));
    double *ref = xmalloc(sizeof(double) * (size_t)(n_tok * k)), *p = xmalloc(sizeof(double) * (size_t)n_expert);
    bool *taken = xmalloc(sizeof(bool) * (size_t)n_expert);
    int *rid = xmalloc(sizeof(int) * (size_t)k);
    for (int renorm = 0; renorm < 2; renorm++) {
        CK(hm_cuda_memset(ctx, did, 0xff, sizeof(int32_t) * (size_t)(n_tok * k), &err));
        CK(hm_cuda_router(ctx, dl + off, n_tok, n_expert, k, renorm, did, dwt, &err));
        dev_to(ids, did, sizeof(int32_t) * (size_t)(n_tok * k));
        dev_to(wt, dwt, sizeof(float) * (size_t)(n_tok * k));
        int bad_ids = 0;
        for (int64_t t = 0; t < n_tok; t++) {
            double mx = -INFINITY, sum = 0;
            for (int e = 0; e < n_expert; e++) {
                mx = fmax(mx, hl[t * n_expert + e]);
                taken[e] = false;
            }
            for (int e = 0; e < n_expert; e++) sum += p[e] = exp(hl[t * n_expert + e] - mx);
            double sel = 0;
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < n_expert; e++)
                    if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
                taken[best] = true;
                rid[j] = best;
                ref[t * k + j] = p[best] / sum;
                sel += p[best] / sum;
            }
            for (int j = 0; j < k; j++) {
                if (renorm) ref[t * k + j] /= sel;
                if (ids[t * k + j] != rid[j]) bad_ids++;
            }
        }
        const double e = nmse(wt, ref, n_tok * k);
        CHECKF(bad_ids == 0, "router %d experts k %d off %d renorm %d (%s): %d ids differ", n_expert, k, off, renorm,
               kern_name(kern), bad_ids);
        CHECKF(e < 1e-12, "router %d experts k %d off %d renorm %d (%s): weights nmse %.3g", n_expert, k, off, renorm,
               kern_name(kern), e);
        if (k >= 2 && lo != hi)
            CHECKF(ids[t_tie * k] == lo && ids[t_tie * k + 1] == hi, "router tie order %d %d (want %d %d, %s)",
                   ids[t_tie * k], ids[t_tie * k + 1], lo, hi, kern_name(kern));
        printf("router (softmax, top-%d of %d, %lld tokens, renorm %d%s, %s) ids exact, weights nmse %.2e\n", k,
               n_expert, (long long)n_tok, renorm, off ? ", unaligned" : "", kern_name(kern), e);
    }
    hm_cuda_free(ctx, dl);
    hm_cuda_free(ctx, did);
    hm_cuda_free(ctx, dwt);
    free(lg); free(ids); free(wt); free(ref); free(p); free(taken); free(rid);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
}

static void test_router(void) {
    for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++) {
        test_router_case(6, 128, 8, 0, kern);   /* qwen3-30b-a3b */
        test_router_case(1, 256, 8, 0, kern);   /* qwen36-geom decode */
        test_router_case(9, 256, 8, 1, kern);   /* two blocks of warps, unaligned */
        test_router_case(3, 1024, 32, 0, kern); /* the limits */
        test_router_case(5, 100, 4, 0, kern);   /* n_expert % 4 != 0, padding */
        test_router_case(2, 33, 1, 0, kern);
        test_router_case(2, 8, 8, 0, kern);     /* k = n_expert */
    }
}

/* The general routing spec (hm_cuda_route) against the CPU's hm_cpu_route (test_cpu_ops checks that
 * one by hand and against a double reference): ids equal, weights within float rounding. With and
 * without a bias, groups, every score; a hash-routed case; an exact tie in the choice. */
static void test_route_spec_case(const hm_route_spec *sp, int64_t n_tok, bool with_bias, bool hashed) {
    const int ne = sp->n_expert, k = sp->k, n_vocab = 50;
    const int64_t nl = n_tok * ne;
    float *lg = xmalloc(sizeof(float) * (size_t)nl), *bias = xmalloc(sizeof(float) * (size_t)ne);
    fill(lg, nl, 1.5f); /* where the scores' slopes keep the CPU's and the GPU's expf from flipping a choice */
    fill(bias, ne, 0.5f);
    lg[2] = lg[ne - 1] = 40.0f; /* token 0: an exact tie at the top (lower id first) */
    if (with_bias) bias[2] = bias[ne - 1] = 0.0f;
    int32_t *table = xmalloc(sizeof(int32_t) * (size_t)(n_vocab * k)), *tok = xmalloc(sizeof(int32_t) * (size_t)n_tok);
    for (int i = 0; i < n_vocab * k; i++) table[i] = (int32_t)((i * 37 + 11) % ne);
    for (int64_t t = 0; t < n_tok; t++) tok[t] = (int32_t)((t * 13 + 5) % n_vocab);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_tok * k)), *rid = xmalloc(sizeof(int32_t) * (size_t)(n_tok * k));
    float *wt = xmalloc(sizeof(float) * (size_t)(n_tok * k)), *rw = xmalloc(sizeof(float) * (size_t)(n_tok * k));
    hm_cpu_route(sp, lg, n_tok, with_bias ? bias : NULL, hashed ? table : NULL, tok, rid, rw);
    float *dl = dev_from(lg, sizeof(float) * (size_t)nl), *db = dev_from(bias, sizeof(float) * (size_t)ne);
    int32_t *dt = dev_from(table, sizeof(int32_t) * (size_t)(n_vocab * k)), *dtok = dev_from(tok, sizeof(int32_t) * (size_t)n_tok);
    int32_t *did = dev_zero(sizeof(int32_t) * (size_t)(n_tok * k));
    float *dwt = dev_zero(sizeof(float) * (size_t)(n_tok * k));
    CK(hm_cuda_route(ctx, sp, dl, n_tok, with_bias ? db : NULL, hashed ? dt : NULL, dtok, did, dwt, &err));
    dev_to(ids, did, sizeof(int32_t) * (size_t)(n_tok * k));
    dev_to(wt, dwt, sizeof(float) * (size_t)(n_tok * k));
    int bad = 0;
    double maxd = 0;
    for (int64_t i = 0; i < n_tok * k; i++) {
        bad += ids[i] != rid[i];
        const double d = fabs((double)wt[i] - rw[i]) / (fabs(rw[i]) + 1e-30);
        maxd = d > maxd ? d : maxd;
    }
    CHECKF(bad == 0 && maxd < 1e-5, "route score %d groups %d/%d k %d of %d bias %d hash %d: %d ids differ, weights %.2e",
           (int)sp->score, sp->n_group, sp->topk_group, k, ne, with_bias, hashed, bad, maxd);
    hm_cuda_free(ctx, dl); hm_cuda_free(ctx, db); hm_cuda_free(ctx, dt); hm_cuda_free(ctx, dtok);
    hm_cuda_free(ctx, did); hm_cuda_free(ctx, dwt);
    free(lg); free(bias); free(table); free(tok); free(ids); free(rid); free(wt); free(rw);
}

static void test_route_spec(void) {
    const hm_route_spec specs[] = {
        {.n_expert = 256, .k = 8, .score = HM_ROUTE_SIGMOID, .norm = true, .scale = 2.5f, .n_group = 8, .topk_group = 4},
        {.n_expert = 256, .k = 6, .score = HM_ROUTE_SQRT_SOFTPLUS, .norm = true, .scale = 1.5f},
        {.n_expert = 128, .k = 4, .score = HM_ROUTE_SOFTMAX_TOPK},
        {.n_expert = 160, .k = 6, .score = HM_ROUTE_SOFTMAX, .norm = false, .n_group = 8, .topk_group = 3},
        {.n_expert = 1024, .k = 32, .score = HM_ROUTE_SIGMOID, .norm = true, .n_group = 32, .topk_group = 2},
        {.n_expert = 8, .k = 8, .score = HM_ROUTE_SOFTMAX, .norm = true},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        for (int b = 0; b < 2; b++) test_route_spec_case(&specs[i], 37, b, false);
    test_route_spec_case(&specs[1], 37, true, true); /* DeepSeek-V4's hash-routed layers */
    test_route_spec_case(&specs[2], 5, false, true);
}

/* ---- KV write and attention ---- */

typedef struct {
    int n_head, n_kv_head, hd;
    int64_t n_ctx, n_tok, pos0; /* queries at positions pos0 .. pos0 + n_tok - 1 */
} attn_case;

static void test_attention_case(const attn_case *ac, int kern) {
    hm_cuda_set_kern(ctx, kern);
    const int nh = ac->n_head, nkv = ac->n_kv_head, hd = ac->hd;
    const int64_t n_ctx = ac->n_ctx, n_tok = ac->n_tok, kv_len = ac->pos0 + n_tok;
    const size_t cache_n = (size_t)nkv * (size_t)n_ctx * (size_t)hd;
    uint16_t *kc = xmalloc(cache_n * 2), *vc = xmalloc(cache_n * 2);
    /* history rows 0..pos0-1 straight into the cache; the batch's own rows through kv_write */
    for (size_t i = 0; i < cache_n; i++) {
        kc[i] = hm_f32_to_fp16(rnd_n());
        vc[i] = hm_f32_to_fp16(rnd_n());
    }
    const size_t kvb = sizeof(float) * (size_t)(n_tok * nkv * hd);
    float *k = xmalloc(kvb), *v = xmalloc(kvb);
    fill(k, n_tok * nkv * hd, 1.0f);
    fill(v, n_tok * nkv * hd, 1.0f);
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)(ac->pos0 + t);
    uint16_t *dkc = dev_from(kc, cache_n * 2), *dvc = dev_from(vc, cache_n * 2);
    float *dk = dev_from(k, kvb), *dv = dev_from(v, kvb);
    int32_t *dpos = dev_from(pos, sizeof(int32_t) * (size_t)n_tok);
    CK(hm_cuda_kv_write(ctx, dkc, dvc, n_ctx, nkv, hd, dk, dv, n_tok, dpos, &err));
    /* the reference cache gets the same rows through the scalar f16 conversion */
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nkv; h++)
            for (int d = 0; d < hd; d++) {
                size_t dst = ((size_t)h * (size_t)n_ctx + (size_t)pos[t]) * (size_t)hd + (size_t)d;
                kc[dst] = hm_f32_to_fp16(k[(t * nkv + h) * hd + d]);
                vc[dst] = hm_f32_to_fp16(v[(t * nkv + h) * hd + d]);
            }
    uint16_t *kc2 = xmalloc(cache_n * 2), *vc2 = xmalloc(cache_n * 2);
    dev_to(kc2, dkc, cache_n * 2);
    dev_to(vc2, dvc, cache_n * 2);
    CHECKF(!memcmp(kc, kc2, cache_n * 2) && !memcmp(vc, vc2, cache_n * 2), "kv_write: cache differs");

    const size_t qn = (size_t)(n_tok * nh * hd);
    float *q = xmalloc(qn * sizeof(float)), *out = xmalloc(qn * sizeof(float));
    double *ref = xmalloc(qn * sizeof(double));
    fill(q, (int64_t)qn, 1.0f);
    float *dq = dev_from(q, qn * sizeof(float)), *dout = dev_zero(qn * sizeof(float));
    const size_t ss = hm_cuda_attention_scratch_size(ctx, n_tok, kv_len, nh, nkv, hd);
    void *scr = dev_zero(ss);
    const float scale = 1.0f / sqrtf((float)hd);
    CK(hm_cuda_attention(ctx, dq, n_tok, dpos, kv_len, dkc, dvc, n_ctx, nh, nkv, hd, scale, dout, scr, ss, &err));
    dev_to(out, dout, qn * sizeof(float));
    double *sc = xmalloc(sizeof(double) * (size_t)kv_len);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / nkv);
            const float *qv = q + (t * nh + h) * hd;
            double mx = -INFINITY, s = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qv[i] * hm_fp16_to_f32(kc[((size_t)g * (size_t)n_ctx + (size_t)p) * (size_t)hd + (size_t)i]);
                sc[p] = d * scale;
                mx = fmax(mx, sc[p]);
            }
            double *o = ref + (t * nh + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                double e = exp(sc[p] - mx);
                s += e;
                for (int i = 0; i < hd; i++)
                    o[i] += e * hm_fp16_to_f32(vc[((size_t)g * (size_t)n_ctx + (size_t)p) * (size_t)hd + (size_t)i]);
            }
            for (int i = 0; i < hd; i++) o[i] /= s;
        }
    const double e = nmse(out, ref, (int64_t)qn);
    CHECKF(e < 1e-10, "attention %d/%d heads hd %d n_tok %lld pos0 %lld (%s): nmse %.3g", nh, nkv, hd,
           (long long)n_tok, (long long)ac->pos0, kern_name(kern), e);
    /* twice more into a NaN-filled output: bit-identical (deterministic, every element written) */
    float *out2 = xmalloc(qn * sizeof(float));
    CK(hm_cuda_memset(ctx, dout, 0xff, qn * sizeof(float), &err));
    CK(hm_cuda_attention(ctx, dq, n_tok, dpos, kv_len, dkc, dvc, n_ctx, nh, nkv, hd, scale, dout, scr, ss, &err));
    dev_to(out2, dout, qn * sizeof(float));
    CHECKF(!memcmp(out, out2, qn * sizeof(float)), "attention %d/%d hd %d n_tok %lld pos0 %lld (%s): runs differ",
           nh, nkv, hd, (long long)n_tok, (long long)ac->pos0, kern_name(kern));
    free(out2);
    printf("kv_write exact; attention q %d / kv %d heads, hd %d, %lld queries at %lld.. (%s, scratch %zu KiB) nmse "
           "%.2e, deterministic\n", nh, nkv, hd, (long long)n_tok, (long long)ac->pos0, kern_name(kern), ss / 1024, e);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    hm_cuda_free(ctx, dkc);
    hm_cuda_free(ctx, dvc);
    hm_cuda_free(ctx, dk);
    hm_cuda_free(ctx, dv);
    hm_cuda_free(ctx, dpos);
    hm_cuda_free(ctx, dq);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, scr);
    free(kc); free(vc); free(kc2); free(vc2); free(k); free(v); free(pos);
    free(q); free(out); free(ref); free(sc);
}

/* The same case over a q8_0, q4_0 or bf16 cache (-ctk; qt its hm_type): history rows quantised on the
 * host by the reference quantiser (ggml's), the batch's own rows by hm_cuda_kv_write_kv on the
 * device, which must write the reference's bytes; hm_cuda_attention_kv against a double reference
 * over the dequantised cache (code * scale: the exact kernels read exactly these values), nmse <
 * 1e-10; two runs bit-identical. */
static void test_attention_case_kv(const attn_case *ac, int kern, int qt) {
    hm_cuda_set_kern(ctx, kern);
    const hm_type_traits *tt = hm_type_get(qt);
    const hm_cuda_kv kv = qt == HM_TYPE_Q8_0 ? HM_CUDA_KV_Q8_0 : qt == HM_TYPE_Q4_0 ? HM_CUDA_KV_Q4_0 : HM_CUDA_KV_BF16;
    const int nh = ac->n_head, nkv = ac->n_kv_head, hd = ac->hd;
    const int64_t n_ctx = ac->n_ctx, n_tok = ac->n_tok, kv_len = ac->pos0 + n_tok;
    const size_t rb = hm_row_size(qt, hd), rows = (size_t)nkv * (size_t)n_ctx, cb = rows * rb;
    unsigned char *kc = xmalloc(cb), *vc = xmalloc(cb);
    float *row = xmalloc(sizeof(float) * (size_t)hd);
    for (size_t r = 0; r < rows; r++) {
        fill(row, hd, 1.0f);
        tt->from_float_ref(row, kc + r * rb, hd);
        fill(row, hd, 1.0f);
        tt->from_float_ref(row, vc + r * rb, hd);
    }
    const size_t kvb = sizeof(float) * (size_t)(n_tok * nkv * hd);
    float *k = xmalloc(kvb), *v = xmalloc(kvb);
    fill(k, n_tok * nkv * hd, 1.0f);
    fill(v, n_tok * nkv * hd, 1.0f);
    for (int64_t i = 0; i < n_tok * nkv * hd; i += 37) k[i] *= 5.0f; /* outliers set their block's scale */
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++) pos[t] = (int32_t)(ac->pos0 + t);
    void *dkc = dev_from(kc, cb), *dvc = dev_from(vc, cb);
    float *dk = dev_from(k, kvb), *dv = dev_from(v, kvb);
    int32_t *dpos = dev_from(pos, sizeof(int32_t) * (size_t)n_tok);
    CK(hm_cuda_kv_write_kv(ctx, kv, dkc, dvc, n_ctx, nkv, hd, dk, dv, n_tok, dpos, &err));
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nkv; h++) {
            const size_t dst = ((size_t)h * (size_t)n_ctx + (size_t)pos[t]) * rb;
            tt->from_float_ref(k + (t * nkv + h) * hd, kc + dst, hd);
            tt->from_float_ref(v + (t * nkv + h) * hd, vc + dst, hd);
        }
    unsigned char *kc2 = xmalloc(cb), *vc2 = xmalloc(cb);
    dev_to(kc2, dkc, cb);
    dev_to(vc2, dvc, cb);
    CHECKF(!memcmp(kc, kc2, cb) && !memcmp(vc, vc2, cb), "kv_write %s: the cache differs from the reference quantiser",
           tt->name);
    float *kf = xmalloc(sizeof(float) * rows * (size_t)hd), *vf = xmalloc(sizeof(float) * rows * (size_t)hd);
    for (size_t r = 0; r < rows; r++) {
        tt->to_float_ref(kc + r * rb, kf + r * (size_t)hd, hd);
        tt->to_float_ref(vc + r * rb, vf + r * (size_t)hd, hd);
    }

    const size_t qn = (size_t)(n_tok * nh * hd);
    float *q = xmalloc(qn * sizeof(float)), *out = xmalloc(qn * sizeof(float)), *out2 = xmalloc(qn * sizeof(float));
    double *ref = xmalloc(qn * sizeof(double));
    fill(q, (int64_t)qn, 1.0f);
    float *dq = dev_from(q, qn * sizeof(float)), *dout = dev_zero(qn * sizeof(float));
    const size_t ss = hm_cuda_attention_scratch_size(ctx, n_tok, kv_len, nh, nkv, hd);
    void *scr = dev_zero(ss);
    const float scale = 1.0f / sqrtf((float)hd);
    CK(hm_cuda_attention_kv(ctx, kv, dq, n_tok, dpos, kv_len, dkc, dvc, n_ctx, nh, nkv, hd, scale, dout, scr, ss, &err));
    dev_to(out, dout, qn * sizeof(float));
    double *sc = xmalloc(sizeof(double) * (size_t)kv_len);
    for (int64_t t = 0; t < n_tok; t++)
        for (int h = 0; h < nh; h++) {
            const int g = h / (nh / nkv);
            const float *qv = q + (t * nh + h) * hd;
            double mx = -INFINITY, s = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                const float *kr = kf + ((size_t)g * (size_t)n_ctx + (size_t)p) * (size_t)hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qv[i] * kr[i];
                sc[p] = d * scale;
                mx = fmax(mx, sc[p]);
            }
            double *o = ref + (t * nh + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
            for (int64_t p = 0; p <= pos[t]; p++) {
                const double e = exp(sc[p] - mx);
                const float *vr = vf + ((size_t)g * (size_t)n_ctx + (size_t)p) * (size_t)hd;
                s += e;
                for (int i = 0; i < hd; i++) o[i] += e * vr[i];
            }
            for (int i = 0; i < hd; i++) o[i] /= s;
        }
    const double e = nmse(out, ref, (int64_t)qn);
    CHECKF(e < 1e-10, "%s attention %d/%d heads hd %d n_tok %lld pos0 %lld (%s): nmse %.3g", tt->name, nh, nkv, hd,
           (long long)n_tok, (long long)ac->pos0, kern_name(kern), e);
    CK(hm_cuda_memset(ctx, dout, 0xff, qn * sizeof(float), &err));
    CK(hm_cuda_attention_kv(ctx, kv, dq, n_tok, dpos, kv_len, dkc, dvc, n_ctx, nh, nkv, hd, scale, dout, scr, ss, &err));
    dev_to(out2, dout, qn * sizeof(float));
    CHECKF(!memcmp(out, out2, qn * sizeof(float)), "%s attention hd %d n_tok %lld (%s): runs differ", tt->name, hd,
           (long long)n_tok, kern_name(kern));
    printf("kv_write %s = reference quantiser; %s attention q %d / kv %d heads, hd %d, %lld queries at %lld.. "
           "(%s) nmse %.2e vs the dequantised cache, deterministic\n", tt->name, tt->name, nh, nkv, hd,
           (long long)n_tok, (long long)ac->pos0, kern_name(kern), e);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    hm_cuda_free(ctx, dkc);
    hm_cuda_free(ctx, dvc);
    hm_cuda_free(ctx, dk);
    hm_cuda_free(ctx, dv);
    hm_cuda_free(ctx, dpos);
    hm_cuda_free(ctx, dq);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, scr);
    free(kc); free(vc); free(kc2); free(vc2); free(kf); free(vf); free(row); free(k); free(v); free(pos);
    free(q); free(out); free(out2); free(ref); free(sc);
}

static void test_attention(void) {
    const attn_case cases[] = {
        {32, 4, 128, 4096, 1, 3000},  /* decode at long context: flash-decoding split */
        {32, 4, 128, 256, 40, 100},   /* prefill batch, causal */
        {32, 4, 128, 64, 1, 0},       /* the very first token */
        {8, 4, 64, 2048, 3, 1500},    /* hd 64, G 2 */
        {32, 2, 256, 1024, 2, 700},   /* hd 256, G 16: head chunks of 4 */
        {32, 4, 128, 1024, 1, 511},   /* decode at short context (qwen36-geom): many short ranges */
        {32, 4, 128, 1024, 1, 20},    /* one range: no merge kernel (new) */
        {16, 2, 256, 1024, 1, 100},   /* hd 256 decode: two head chunks, a few short ranges */
    };
    for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention_case(&cases[i], kern);
    const int qts[] = {HM_TYPE_Q8_0, HM_TYPE_Q4_0, HM_TYPE_BF16}; /* the same cases over quantised caches */
    for (size_t t = 0; t < sizeof qts / sizeof qts[0]; t++)
        for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++)
            for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention_case_kv(&cases[i], kern, qts[t]);
}

/* ---- grouped MoE ---- */

static void test_moe_case_w(int gate_type, int down_type, int64_t n_batch, int n_units, int k, int64_t n_embd,
                            int64_t n_ff) {
    tmat *g = xmalloc(sizeof(tmat) * (size_t)n_units), *u = xmalloc(sizeof(tmat) * (size_t)n_units),
         *dn = xmalloc(sizeof(tmat) * (size_t)n_units);
    hm_cuda_moe_unit *mu = xmalloc(sizeof(hm_cuda_moe_unit) * (size_t)n_units);
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)(n_units * n_batch));
    float *wts = xmalloc(sizeof(float) * (size_t)(n_units * n_batch));
    void **dptr = xmalloc(sizeof(void *) * (size_t)(3 * n_units));
    /* routing: token t picks k distinct units (unit n_units-1 gets none unless k = n_units) */
    int32_t *cnt = calloc((size_t)n_units, sizeof(int32_t));
    for (int64_t t = 0; t < n_batch; t++) {
        bool used[64] = {false};
        for (int j = 0; j < k; j++) {
            int e;
            do e = (int)(rnd_u() * (n_units - 1)); while (used[e]);
            used[e] = true;
            tok[e * n_batch + cnt[e]] = (int32_t)t;
            wts[e * n_batch + cnt[e]] = (float)(0.1 + rnd_u());
            cnt[e]++;
        }
    }
    int64_t n_pairs = 0;
    for (int e = 0; e < n_units; e++) {
        g[e] = make_weights(gate_type, n_embd, n_ff);
        u[e] = make_weights(gate_type, n_embd, n_ff);
        dn[e] = make_weights(down_type, n_ff, n_embd);
        dptr[3 * e] = dev_from(g[e].q, g[e].rs * (size_t)n_ff);
        dptr[3 * e + 1] = dev_from(u[e].q, u[e].rs * (size_t)n_ff);
        dptr[3 * e + 2] = dev_from(dn[e].q, dn[e].rs * (size_t)n_embd);
        mu[e] = (hm_cuda_moe_unit){.gate = dptr[3 * e], .up = dptr[3 * e + 1], .down = dptr[3 * e + 2],
                                   .tok_host = tok + e * n_batch, .w_host = wts + e * n_batch, .n_tok = cnt[e]};
        n_pairs += cnt[e];
    }
    const size_t xb = sizeof(float) * (size_t)(n_batch * n_embd);
    float *x = xmalloc(xb), *out0 = xmalloc(xb), *out = xmalloc(xb), *out2 = xmalloc(xb);
    double *ref = xmalloc(sizeof(double) * (size_t)(n_batch * n_embd));
    fill(x, n_batch * n_embd, 1.0f);
    fill(out0, n_batch * n_embd, 1.0f);
    float *dx = dev_from(x, xb), *dout = dev_from(out0, xb);
    const size_t ss = hm_cuda_moe_scratch_size(n_batch, n_pairs, n_units, n_ff);
    void *scr = dev_zero(ss);
    /* the f32 grouped kernels: batches > 8 of the int8 types would take the MMQ tiles (Q8_K
     * numerics, checked by test_cuda_mmq_gpu), so the switch is off here */
    CK(hm_cuda_set_mmq(ctx, false, &err));
    CK(hm_cuda_moe(ctx, mu, n_units, gate_type, down_type, dx, n_batch, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out, dout, xb);
    CK(hm_cuda_upload(ctx, dout, out0, xb, &err));
    CK(hm_cuda_moe(ctx, mu, n_units, gate_type, down_type, dx, n_batch, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out2, dout, xb);
    CK(hm_cuda_set_mmq(ctx, true, &err));
    CHECKF(!memcmp(out, out2, xb), "moe: two runs differ (not deterministic)");

    for (int64_t i = 0; i < n_batch * n_embd; i++) ref[i] = out0[i];
    double *hbuf = xmalloc(sizeof(double) * (size_t)n_ff);
    for (int e = 0; e < n_units; e++)
        for (int32_t i = 0; i < cnt[e]; i++) {
            const int32_t t = tok[e * n_batch + i];
            const float *xv = x + t * n_embd;
            ref_unit_add(g[e].deq, u[e].deq, dn[e].deq, xv, n_embd, n_ff, wts[e * n_batch + i], hbuf,
                         ref + t * n_embd);
        }
    const double err_n = nmse(out, ref, n_batch * n_embd);
    CHECKF(err_n < 1e-10, "moe %s/%s batch %lld: nmse %.3g", hm_type_name(gate_type), hm_type_name(down_type),
           (long long)n_batch, err_n);
    printf("moe gate/up %s down %s: %d units, batch %lld, top-%d, %lld pairs: nmse %.2e, deterministic\n",
           hm_type_name(gate_type), hm_type_name(down_type), n_units, (long long)n_batch, k,
           (long long)n_pairs, err_n);
    for (int e = 0; e < 3 * n_units; e++) hm_cuda_free(ctx, dptr[e]);
    for (int e = 0; e < n_units; e++) {
        free_weights(&g[e]);
        free_weights(&u[e]);
        free_weights(&dn[e]);
    }
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, scr);
    free(g); free(u); free(dn); free(mu); free(tok); free(wts); free(dptr); free(cnt);
    free(x); free(out0); free(out); free(out2); free(ref); free(hbuf);
}

static void test_moe_case(int gate_type, int down_type, int64_t n_batch, int n_units, int k, int64_t n_ff) {
    test_moe_case_w(gate_type, down_type, n_batch, n_units, k, 512, n_ff);
}

static void test_moe(void) {
    test_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, 1, 9, 4, 256);   /* decode */
    test_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, 5, 9, 3, 256);
    test_moe_case(HM_TYPE_IQ4_XS, HM_TYPE_Q5_K, 3, 5, 2, 256);
    test_moe_case(HM_TYPE_F16, HM_TYPE_Q8_0, 23, 4, 2, 256);   /* units with > 8 tokens */
    test_moe_case(HM_TYPE_MXFP4, HM_TYPE_BF16, 4, 6, 2, 256);
    test_moe_case(HM_TYPE_IQ2_S, HM_TYPE_IQ3_S, 1, 9, 4, 256);   /* IQ2_M's experts (decode) */
    test_moe_case(HM_TYPE_IQ2_XXS, HM_TYPE_IQ1_M, 5, 7, 3, 256);
    test_moe_case(HM_TYPE_IQ1_S, HM_TYPE_IQ3_XXS, 3, 6, 2, 256);
    test_moe_case(HM_TYPE_IQ2_XS, HM_TYPE_IQ2_S, 12, 4, 2, 256);
    test_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q5_0, 3, 7, 2, 256);   /* gemma4 Q4_K_M's expert mix */
    test_moe_case(HM_TYPE_Q5_0, HM_TYPE_Q5_0, 19, 4, 2, 256);
    test_moe_case(HM_TYPE_Q2_K, HM_TYPE_Q3_K, 5, 7, 2, 256);   /* Q2_K's experts: Q3_K down */
    test_moe_case(HM_TYPE_Q4_1, HM_TYPE_Q5_1, 3, 5, 2, 256);
    test_moe_case(HM_TYPE_IQ4_NL, HM_TYPE_Q4_K, 1, 6, 3, 256);
    /* Gemma-4 26B-A4B's expert width 704 (not a multiple of 256: the down part is Q5_0 / Q8_0) */
    test_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q5_0, 3, 7, 2, 704);
    test_moe_case(HM_TYPE_Q4_K, HM_TYPE_Q8_0, 12, 4, 2, 704);
    /* gpt-oss's width 2880 (a multiple of 32, not of 256): MXFP4 and Q8_0 experts, n_embd = n_ff */
    test_moe_case_w(HM_TYPE_MXFP4, HM_TYPE_MXFP4, 3, 5, 2, 2880, 2880);
    test_moe_case_w(HM_TYPE_Q8_0, HM_TYPE_Q8_0, 11, 4, 2, 2880, 2880);
}

/* ---- fused decode ops: the same results as the ops they fuse ---- */

static void test_fused(void) {
    /* add + rmsnorm: x += h exactly, out (aliasing h) = rmsnorm(x) * w */
    {
        const int64_t n_rows = 5, n = 2048;
        const size_t bytes = sizeof(float) * (size_t)(n_rows * n);
        float *x = xmalloc(bytes), *h = xmalloc(bytes), *w = xmalloc(sizeof(float) * (size_t)n);
        float *xo = xmalloc(bytes), *y = xmalloc(bytes);
        double *ref = xmalloc(sizeof(double) * (size_t)(n_rows * n));
        fill(x, n_rows * n, 2.0f);
        fill(h, n_rows * n, 1.0f);
        fill(w, n, 1.0f);
        float *dx = dev_from(x, bytes), *dh = dev_from(h, bytes), *dw = dev_from(w, sizeof(float) * (size_t)n);
        CK(hm_cuda_add_rmsnorm(ctx, dx, dh, dw, dh, n_rows, n, 1e-6f, &err));
        dev_to(xo, dx, bytes);
        dev_to(y, dh, bytes);
        int bad = 0;
        for (int64_t r = 0; r < n_rows; r++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) {
                const float v = x[r * n + i] + h[r * n + i];
                if (xo[r * n + i] != v) bad++;
                ss += (double)v * v;
            }
            const double sc = 1.0 / sqrt(ss / (double)n + 1e-6);
            for (int64_t i = 0; i < n; i++) ref[r * n + i] = (double)(x[r * n + i] + h[r * n + i]) * sc * w[i];
        }
        const double e = nmse(y, ref, n_rows * n);
        CHECKF(bad == 0, "add_rmsnorm: %d residual elements differ from x + h", bad);
        CHECKF(e < 1e-12, "add_rmsnorm nmse %.3g", e);
        printf("add_rmsnorm: residual exact, norm nmse %.2e\n", e);
        hm_cuda_free(ctx, dx);
        hm_cuda_free(ctx, dh);
        hm_cuda_free(ctx, dw);
        free(x); free(h); free(w); free(xo); free(y); free(ref);
    }
    /* q/k norms + RoPE + K/V write: bit-identical with rmsnorm_heads, rope_neox and kv_write */
    for (int partial = 0; partial < 2; partial++) {
        const int nh = 8, nkv = 2, hd = 128, n_rot = partial ? 64 : 128;
        const int64_t n_tok = 3, n_ctx = 64;
        const int32_t pos[3] = {5, 17, 63};
        const size_t qb = sizeof(float) * (size_t)(n_tok * nh * hd), kb = sizeof(float) * (size_t)(n_tok * nkv * hd);
        const size_t cb = sizeof(uint16_t) * (size_t)(nkv * n_ctx * hd);
        float *q = xmalloc(qb), *k = xmalloc(kb), *v = xmalloc(kb), *wq = xmalloc(sizeof(float) * hd),
              *wk = xmalloc(sizeof(float) * hd);
        fill(q, n_tok * nh * hd, 2.0f);
        fill(k, n_tok * nkv * hd, 2.0f);
        fill(v, n_tok * nkv * hd, 1.0f);
        fill(wq, hd, 1.0f);
        fill(wk, hd, 1.0f);
        int32_t *dpos = dev_from(pos, sizeof pos);
        float *dwq = dev_from(wq, sizeof(float) * hd), *dwk = dev_from(wk, sizeof(float) * hd);
        float *dv = dev_from(v, kb);
        float *dq0 = dev_from(q, qb), *dk0 = dev_from(k, kb), *dq1 = dev_from(q, qb), *dk1 = dev_from(k, kb);
        uint16_t *kc0 = dev_zero(cb), *vc0 = dev_zero(cb), *kc1 = dev_zero(cb), *vc1 = dev_zero(cb);
        const float eps = 1e-6f, theta = 1e6f;
        CK(hm_cuda_rmsnorm_heads(ctx, dq0, dwq, n_tok, nh, hd, eps, &err));
        CK(hm_cuda_rmsnorm_heads(ctx, dk0, dwk, n_tok, nkv, hd, eps, &err));
        CK(hm_cuda_rope_neox(ctx, dq0, n_tok, nh, hd, n_rot, dpos, theta, &err));
        CK(hm_cuda_rope_neox(ctx, dk0, n_tok, nkv, hd, n_rot, dpos, theta, &err));
        CK(hm_cuda_kv_write(ctx, kc0, vc0, n_ctx, nkv, hd, dk0, dv, n_tok, dpos, &err));
        CK(hm_cuda_qk_norm_rope_kv(ctx, dq1, dk1, dv, dwq, dwk, n_tok, nh, nkv, hd, n_rot, dpos, theta, eps, kc1,
                                   vc1, n_ctx, &err));
        float *a = xmalloc(qb), *b = xmalloc(qb);
        uint16_t *ca = xmalloc(cb), *cb2 = xmalloc(cb);
        dev_to(a, dq0, qb);
        dev_to(b, dq1, qb);
        CHECKF(!memcmp(a, b, qb), "qk_norm_rope_kv n_rot %d: q differs from the unfused ops", n_rot);
        dev_to(a, dk0, kb);
        dev_to(b, dk1, kb);
        CHECKF(!memcmp(a, b, kb), "qk_norm_rope_kv n_rot %d: k differs from the unfused ops", n_rot);
        dev_to(ca, kc0, cb);
        dev_to(cb2, kc1, cb);
        CHECKF(!memcmp(ca, cb2, cb), "qk_norm_rope_kv n_rot %d: K cache differs from the unfused ops", n_rot);
        dev_to(ca, vc0, cb);
        dev_to(cb2, vc1, cb);
        CHECKF(!memcmp(ca, cb2, cb), "qk_norm_rope_kv n_rot %d: V cache differs from the unfused ops", n_rot);
        printf("qk_norm_rope_kv n_rot %d: q, k and the K/V cache bit-identical with the 5 unfused ops\n", n_rot);
        void *fr[] = {dpos, dwq, dwk, dv, dq0, dk0, dq1, dk1, kc0, vc0, kc1, vc1};
        for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
        free(q); free(k); free(v); free(wq); free(wk); free(a); free(b); free(ca); free(cb2);
    }
}

/* Stacked q|k|v matvec: each output bit-identical with hm_cuda_matmul of its part alone. */
static void test_matvec_multi(void) {
    const int tys[] = {HM_TYPE_Q4_K, HM_TYPE_Q6_K, HM_TYPE_F16};
    const int64_t ne0 = 512, rows[3] = {256, 64, 32}, nrow = 256 + 64 + 32;
    for (size_t ti = 0; ti < sizeof tys / sizeof tys[0]; ti++) {
        tmat w = make_weights(tys[ti], ne0, nrow);
        void *dw = dev_from(w.q, w.rs * (size_t)nrow);
        float *x = xmalloc(sizeof(float) * (size_t)(8 * ne0));
        fill(x, 8 * ne0, 1.0f);
        float *dx = dev_from(x, sizeof(float) * (size_t)(8 * ne0));
        float *a = xmalloc(sizeof(float) * (size_t)(8 * nrow)), *b = xmalloc(sizeof(float) * (size_t)(8 * nrow));
        float *dy[3], *dz[3];
        for (int i = 0; i < 3; i++) {
            dy[i] = dev_zero(sizeof(float) * (size_t)(8 * rows[i]));
            dz[i] = dev_zero(sizeof(float) * (size_t)(8 * rows[i]));
        }
        int bad = 0;
        for (int kern = HM_CUDA_KERN_OLD; kern <= HM_CUDA_KERN_NEW; kern++)
        for (int n_out = 2; n_out <= 3; n_out++)
            for (int64_t nt = 1; nt <= 8; nt += nt < 3 ? 2 : 5) { /* 1, 3, 8 */
                const int64_t tot = rows[0] + rows[1] + (n_out == 3 ? rows[2] : 0);
                hm_cuda_mat m = {dw, tys[ti], ne0, tot, w.rs};
                hm_cuda_set_kern(ctx, kern);
                CK(hm_cuda_matvec_multi(ctx, &m, dx, nt, n_out, dy, rows, &err));
                int64_t r0 = 0;
                for (int i = 0; i < n_out; i++) {
                    hm_cuda_mat part = {(const char *)dw + (size_t)r0 * w.rs, tys[ti], ne0, rows[i], w.rs};
                    CK(hm_cuda_matmul(ctx, &part, dx, nt, dz[i], &err));
                    const size_t nb = sizeof(float) * (size_t)(nt * rows[i]);
                    dev_to(a, dy[i], nb);
                    dev_to(b, dz[i], nb);
                    if (memcmp(a, b, nb)) bad++;
                    r0 += rows[i];
                }
            }
        hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
        CHECKF(bad == 0, "matvec_multi %s: %d outputs differ from the separate matvecs", hm_type_name(tys[ti]), bad);
        printf("matvec_multi %-5s (2 and 3 stacked, n_tok 1/3/8, old and new kernel): bit-identical with separate matvecs\n",
               hm_type_name(tys[ti]));
        for (int i = 0; i < 3; i++) {
            hm_cuda_free(ctx, dy[i]);
            hm_cuda_free(ctx, dz[i]);
        }
        hm_cuda_free(ctx, dw);
        hm_cuda_free(ctx, dx);
        free_weights(&w);
        free(x); free(a); free(b);
    }
}

/* The device-routed MoE: router-shaped ids/weights [n_tok, k] on the device, a slot table with
 * some experts cold (NULL: skipped); against a double reference over the hot pairs. */
static void test_moe_dev_case_w(int gate_type, int down_type, int64_t n_tok, int n_expert, int k, int64_t n_embd,
                                int64_t n_ff) {
    tmat *g = xmalloc(sizeof(tmat) * (size_t)n_expert), *u = xmalloc(sizeof(tmat) * (size_t)n_expert),
         *dn = xmalloc(sizeof(tmat) * (size_t)n_expert);
    hm_cuda_moe_slot *slots = xmalloc(sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    void **dptr = xmalloc(sizeof(void *) * (size_t)(3 * n_expert));
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_tok * k));
    float *wts = xmalloc(sizeof(float) * (size_t)(n_tok * k));
    for (int64_t t = 0; t < n_tok; t++) {
        bool used[64] = {false};
        for (int j = 0; j < k; j++) {
            int e;
            do e = (int)(rnd_u() * n_expert); while (e >= n_expert || used[e]);
            used[e] = true;
            ids[t * k + j] = e;
            wts[t * k + j] = (float)(0.1 + rnd_u());
        }
    }
    int n_hot = 0;
    for (int e = 0; e < n_expert; e++) {
        g[e] = make_weights(gate_type, n_embd, n_ff);
        u[e] = make_weights(gate_type, n_embd, n_ff);
        dn[e] = make_weights(down_type, n_ff, n_embd);
        dptr[3 * e] = dev_from(g[e].q, g[e].rs * (size_t)n_ff);
        dptr[3 * e + 1] = dev_from(u[e].q, u[e].rs * (size_t)n_ff);
        dptr[3 * e + 2] = dev_from(dn[e].q, dn[e].rs * (size_t)n_embd);
        const bool hot = e % 3 != 1; /* every third expert cold */
        slots[e] = hot ? (hm_cuda_moe_slot){.gate = dptr[3 * e], .up = dptr[3 * e + 1], .down = dptr[3 * e + 2]}
                       : (hm_cuda_moe_slot){.gate = NULL};
        n_hot += hot;
    }
    const size_t xb = sizeof(float) * (size_t)(n_tok * n_embd);
    float *x = xmalloc(xb), *out0 = xmalloc(xb), *out = xmalloc(xb), *out2 = xmalloc(xb);
    double *ref = xmalloc(sizeof(double) * (size_t)(n_tok * n_embd)), *hbuf = xmalloc(sizeof(double) * (size_t)n_ff);
    fill(x, n_tok * n_embd, 1.0f);
    fill(out0, n_tok * n_embd, 1.0f);
    float *dx = dev_from(x, xb), *dout = dev_from(out0, xb);
    int32_t *dids = dev_from(ids, sizeof(int32_t) * (size_t)(n_tok * k));
    float *dw = dev_from(wts, sizeof(float) * (size_t)(n_tok * k));
    hm_cuda_moe_slot *dslots = dev_from(slots, sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    const size_t ss = hm_cuda_moe_dev_scratch_size(n_tok, k, n_ff);
    void *scr = dev_zero(ss);
    float *out_old = xmalloc(xb);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_OLD);
    CK(hm_cuda_moe_dev(ctx, dslots, gate_type, down_type, dids, dw, k, dx, n_tok, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out_old, dout, xb);
    CK(hm_cuda_upload(ctx, dout, out0, xb, &err));
    CK(hm_cuda_memset(ctx, scr, 0xff, ss, &err)); /* NaN h: the new kernel must write what it reads */
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_NEW);
    CK(hm_cuda_moe_dev(ctx, dslots, gate_type, down_type, dids, dw, k, dx, n_tok, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out, dout, xb);
    CK(hm_cuda_upload(ctx, dout, out0, xb, &err));
    CK(hm_cuda_moe_dev(ctx, dslots, gate_type, down_type, dids, dw, k, dx, n_tok, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out2, dout, xb);
    /* the default kernels (int8 gate/up for K-quants: activations rounded to Q8_K as the CPU does) */
    float *out_def = xmalloc(xb);
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    CK(hm_cuda_upload(ctx, dout, out0, xb, &err));
    CK(hm_cuda_moe_dev(ctx, dslots, gate_type, down_type, dids, dw, k, dx, n_tok, n_embd, n_ff, dout, scr, ss, &err));
    dev_to(out_def, dout, xb);
    CHECKF(!memcmp(out, out2, xb), "moe_dev: two runs differ (not deterministic)");
    for (int64_t i = 0; i < n_tok * n_embd; i++) ref[i] = out0[i];
    int64_t n_pairs = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int j = 0; j < k; j++) {
            const int e = ids[t * k + j];
            if (!slots[e].gate) continue;
            n_pairs++;
            const float *xv = x + t * n_embd;
            ref_unit_add(g[e].deq, u[e].deq, dn[e].deq, xv, n_embd, n_ff, wts[t * k + j], hbuf, ref + t * n_embd);
        }
    const double err_n = nmse(out, ref, n_tok * n_embd), err_o = nmse(out_old, ref, n_tok * n_embd);
    CHECKF(err_n < 1e-10, "moe_dev %s/%s n_tok %lld (new kernel): nmse %.3g", hm_type_name(gate_type),
           hm_type_name(down_type), (long long)n_tok, err_n);
    CHECKF(err_o < 1e-10, "moe_dev %s/%s n_tok %lld (old kernel): nmse %.3g", hm_type_name(gate_type),
           hm_type_name(down_type), (long long)n_tok, err_o);
    /* Q8_K activations: ~0.6 % rms rounding per element of x and h, NMSE ~4e-5 (test_cuda_q8_gpu) */
    const double err_d = nmse(out_def, ref, n_tok * n_embd);
    CHECKF(err_d < 3e-4, "moe_dev %s/%s n_tok %lld n_ff %lld (default kernels): nmse %.3g", hm_type_name(gate_type),
           hm_type_name(down_type), (long long)n_tok, (long long)n_ff, err_d);
    free(out_def);
    printf("moe_dev gate/up %s down %s n_ff %lld: %d of %d experts hot, n_tok %lld, top-%d, %lld hot pairs: nmse old "
           "%.2e new %.2e default %.2e (%s), deterministic\n", hm_type_name(gate_type), hm_type_name(down_type),
           (long long)n_ff, n_hot, n_expert, (long long)n_tok, k, (long long)n_pairs, err_o, err_n, err_d,
           memcmp(out, out_old, xb) ? "new != old bitwise" : "new == old bitwise");
    free(out_old);
    for (int e = 0; e < 3 * n_expert; e++) hm_cuda_free(ctx, dptr[e]);
    for (int e = 0; e < n_expert; e++) {
        free_weights(&g[e]);
        free_weights(&u[e]);
        free_weights(&dn[e]);
    }
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, dids);
    hm_cuda_free(ctx, dw);
    hm_cuda_free(ctx, dslots);
    hm_cuda_free(ctx, scr);
    free(g); free(u); free(dn); free(slots); free(dptr); free(ids); free(wts);
    free(x); free(out0); free(out); free(out2); free(ref); free(hbuf);
}

static void test_moe_dev_case(int gate_type, int down_type, int64_t n_tok, int n_expert, int k, int64_t n_ff) {
    test_moe_dev_case_w(gate_type, down_type, n_tok, n_expert, k, 512, n_ff);
}

static void test_moe_dev(void) {
    test_moe_dev_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, 1, 12, 4, 256); /* decode */
    test_moe_dev_case(HM_TYPE_Q4_K, HM_TYPE_Q6_K, 5, 12, 3, 256);
    test_moe_dev_case(HM_TYPE_IQ4_XS, HM_TYPE_Q5_K, 8, 9, 2, 256);
    test_moe_dev_case(HM_TYPE_F16, HM_TYPE_Q8_0, 2, 6, 6, 256); /* every expert of the layer routed */
    test_moe_dev_case(HM_TYPE_IQ2_S, HM_TYPE_IQ2_S, 1, 12, 4, 256); /* IQ2_M's experts */
    test_moe_dev_case(HM_TYPE_IQ1_S, HM_TYPE_IQ3_XXS, 5, 9, 3, 256);
    test_moe_dev_case(HM_TYPE_Q4_K, HM_TYPE_Q5_0, 1, 12, 4, 256); /* gemma4 Q4_K_M: int8 gate/up, f32 Q5_0 down */
    test_moe_dev_case(HM_TYPE_Q5_0, HM_TYPE_Q8_0, 5, 9, 3, 256);
    test_moe_dev_case(HM_TYPE_Q2_K, HM_TYPE_Q3_K, 1, 12, 4, 256); /* Q2_K decode */
    test_moe_dev_case(HM_TYPE_Q3_K, HM_TYPE_Q4_K, 4, 9, 3, 256);  /* Q3_K_M */
    test_moe_dev_case(HM_TYPE_IQ4_NL, HM_TYPE_Q5_1, 2, 6, 2, 256);
    /* Gemma-4 26B-A4B's expert width 704 (not a multiple of 256): Q4_K gate/up, Q5_0 / Q8_0 down */
    test_moe_dev_case(HM_TYPE_Q4_K, HM_TYPE_Q5_0, 1, 12, 4, 704);
    test_moe_dev_case(HM_TYPE_Q4_K, HM_TYPE_Q8_0, 3, 9, 3, 704);
    /* gpt-oss's width 2880: MXFP4 experts (the f32 paths: no Q8_K blocks of 256 in a row) */
    test_moe_dev_case_w(HM_TYPE_MXFP4, HM_TYPE_MXFP4, 1, 8, 4, 2880, 2880);
    test_moe_dev_case_w(HM_TYPE_Q8_0, HM_TYPE_MXFP4, 4, 8, 4, 2880, 2880);
}

/* ---- errors are statuses ---- */

static void test_errors(void) {
    hm_err e2;
    void *p = NULL;
    CHECK(hm_cuda_alloc(ctx, (size_t)1 << 50, &p, &e2) == HM_ERR_NOMEM && p == NULL);
    hm_cuda_mat w = {NULL, HM_TYPE_Q8_K, 512, 4, hm_row_size(HM_TYPE_Q8_K, 512)}; /* activations only */
    float *d = dev_zero(4096);
    CHECK(hm_cuda_matmul(ctx, &w, d, 1, d, &e2) == HM_ERR_UNSUPPORTED);
    w.type = HM_TYPE_Q4_K;
    w.data = (char *)d + 8;
    w.nb1 = hm_row_size(HM_TYPE_Q4_K, 512);
    CHECK(hm_cuda_matmul(ctx, &w, d, 1, d, &e2) == HM_ERR_ARG); /* misaligned */
    CHECK(hm_cuda_sync(ctx, &e2) == HM_OK);                      /* the context still works */
    hm_cuda_free(ctx, d);
}

/* ---- decode matvec bandwidth (prints, no asserts) ---- */

/* Mean time of one decode matvec of `type` (ne0 x ne1, nt tokens), weights cycled through
 * `copies` copies in buf (>= 1 GiB) so they come from HBM. */
static double time_matvec(int type, int64_t ne0, int64_t ne1, int64_t nt, void *buf, size_t mb, size_t copies,
                          const float *dx, float *dy) {
    const size_t rs = hm_row_size(type, ne0);
    const int iters = (int)(copies < 400 ? 400 : copies);
    double t0 = 0;
    for (int it = -20; it < iters; it++) {
        if (it == 0) {
            CK(hm_cuda_sync(ctx, &err));
            t0 = now_s();
        }
        hm_cuda_mat w = {(char *)buf + (size_t)((it + 20) % (int)copies) * mb, type, ne0, ne1, rs};
        CK(hm_cuda_matmul(ctx, &w, dx, nt, dy, &err));
    }
    CK(hm_cuda_sync(ctx, &err));
    return (now_s() - t0) / iters;
}

static void bench_matvec(void) {
    const int64_t shapes[][2] = {{2048, 768}, {2048, 512}, {512, 2048}, {4096, 4096}, {4608, 2048}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    printf("\ndecode matvec (ne0 x ne1 = row length x rows), weights cycled through >= 1 GiB so they come "
           "from HBM;\neach cell: OLD us -> NEW us (NEW GB/s of weight bytes)\n");
    printf("%-7s %-3s", "type", "tok");
    for (int s = 0; s < n_shapes; s++) printf(" %27lldx%-5lld", (long long)shapes[s][0], (long long)shapes[s][1]);
    printf("\n");
    float *hx = xmalloc(sizeof(float) * 4608 * 8);
    fill(hx, 4608 * 8, 1.0f);
    float *dx = dev_from(hx, sizeof(float) * 4608 * 8), *dy = dev_zero(sizeof(float) * 4608 * 8);
    free(hx);
    const int64_t nts[2] = {1, 4};
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = types[ti];
        double t[2][8][2];
        for (int s = 0; s < n_shapes; s++) {
            const int64_t ne0 = shapes[s][0], ne1 = shapes[s][1];
            const size_t rs = hm_row_size(type, ne0), mb = (rs * (size_t)ne1 + 255) & ~(size_t)255;
            const size_t copies = ((size_t)1 << 30) / mb + 1;
            void *buf;
            CK(hm_cuda_alloc(ctx, copies * mb, &buf, &err));
            CK(hm_cuda_memset(ctx, buf, 0x11, copies * mb, &err));
            for (int n = 0; n < 2; n++)
                for (int k = 0; k < 2; k++) {
                    hm_cuda_set_kern(ctx, k ? HM_CUDA_KERN_NEW : HM_CUDA_KERN_OLD);
                    t[n][s][k] = time_matvec(type, ne0, ne1, nts[n], buf, mb, copies, dx, dy);
                }
            hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
            hm_cuda_free(ctx, buf);
        }
        for (int n = 0; n < 2; n++) {
            printf("%-7s %-3lld", hm_type_name(type), (long long)nts[n]);
            for (int s = 0; s < n_shapes; s++) {
                const double bytes = (double)hm_row_size(type, shapes[s][0]) * (double)shapes[s][1];
                printf("  %7.2f -> %7.2f (%6.0f)", t[n][s][0] * 1e6, t[n][s][1] * 1e6, bytes / t[n][s][1] * 1e-9);
            }
            printf("\n");
        }
    }
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dy);
}

/* The decode MoE of the target model: 256 experts of n_ff 512 on n_embd 2048, q4_K gate/up and
 * q6_K down, top-8, one token; all experts hot (~0.5 GB, so each call's 8 experts come from HBM
 * after the first few routings). */
static void bench_moe_dev(void) {
    const int n_expert = 256, k = 8;
    const int64_t n_embd = 2048, n_ff = 512;
    const int n_route = 64;
    const size_t gs = hm_row_size(HM_TYPE_Q4_K, n_embd) * (size_t)n_ff, ds = hm_row_size(HM_TYPE_Q6_K, n_ff) * (size_t)n_embd;
    const size_t es = (2 * gs + ds + 255) & ~(size_t)255;
    char *buf;
    CK(hm_cuda_alloc(ctx, es * (size_t)n_expert, (void **)&buf, &err));
    CK(hm_cuda_memset(ctx, buf, 0x11, es * (size_t)n_expert, &err));
    hm_cuda_moe_slot *slots = xmalloc(sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    for (int e = 0; e < n_expert; e++)
        slots[e] = (hm_cuda_moe_slot){.gate = buf + (size_t)e * es, .up = buf + (size_t)e * es + gs,
                                      .down = buf + (size_t)e * es + 2 * gs};
    hm_cuda_moe_slot *dslots = dev_from(slots, sizeof(hm_cuda_moe_slot) * (size_t)n_expert);
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(n_route * k));
    float *wts = xmalloc(sizeof(float) * (size_t)(n_route * k));
    for (int i = 0; i < n_route * k; i++) {
        ids[i] = (int32_t)(rnd_u() * n_expert) % n_expert;
        wts[i] = (float)rnd_u();
    }
    int32_t *dids = dev_from(ids, sizeof(int32_t) * (size_t)(n_route * k));
    float *dw = dev_from(wts, sizeof(float) * (size_t)(n_route * k));
    float *hx = xmalloc(sizeof(float) * (size_t)n_embd);
    fill(hx, n_embd, 1.0f);
    float *dx = dev_from(hx, sizeof(float) * (size_t)n_embd), *dout = dev_zero(sizeof(float) * (size_t)n_embd);
    const size_t ss = hm_cuda_moe_dev_scratch_size(1, k, n_ff);
    void *scr = dev_zero(ss);
    double t[2];
    for (int kk = 0; kk < 2; kk++) {
        hm_cuda_set_kern(ctx, kk ? HM_CUDA_KERN_NEW : HM_CUDA_KERN_OLD);
        const int iters = 2000;
        double t0 = 0;
        for (int it = -20; it < iters; it++) {
            if (it == 0) {
                CK(hm_cuda_sync(ctx, &err));
                t0 = now_s();
            }
            const int r = (it + 20) % n_route;
            CK(hm_cuda_moe_dev(ctx, dslots, HM_TYPE_Q4_K, HM_TYPE_Q6_K, dids + r * k, dw + r * k, k, dx, 1, n_embd,
                               n_ff, dout, scr, ss, &err));
        }
        CK(hm_cuda_sync(ctx, &err));
        t[kk] = (now_s() - t0) / iters;
    }
    hm_cuda_set_kern(ctx, HM_CUDA_KERN_DEFAULT);
    const double bytes = (double)k * (double)(2 * gs + ds);
    printf("\nmoe_dev decode (256 experts, n_embd 2048, n_ff 512, q4_K/q6_K, top-8, 1 token, %.1f MB of "
           "weights a call): OLD %.2f us -> NEW %.2f us (%.0f GB/s)\n", bytes * 1e-6, t[0] * 1e6, t[1] * 1e6,
           bytes / t[1] * 1e-9);
    hm_cuda_free(ctx, buf);
    hm_cuda_free(ctx, dslots);
    hm_cuda_free(ctx, dids);
    hm_cuda_free(ctx, dw);
    hm_cuda_free(ctx, dx);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, scr);
    free(slots); free(ids); free(wts); free(hx);
}

static void bench_prefill(void) {
    /* prefill tiles: 512 tokens through a 4096 x 4096 weight */
    printf("\nprefill matmul 4096 x 4096, 512 tokens (bf16 wmma):\n");
    float *px = dev_zero(sizeof(float) * 4096 * 512), *py = dev_zero(sizeof(float) * 4096 * 512);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = types[ti];
        const size_t rs = hm_row_size(type, 4096);
        void *buf;
        CK(hm_cuda_alloc(ctx, rs * 4096, &buf, &err));
        CK(hm_cuda_memset(ctx, buf, 0x11, rs * 4096, &err));
        hm_cuda_mat w = {buf, type, 4096, 4096, rs};
        CK(hm_cuda_matmul(ctx, &w, px, 512, py, &err));
        CK(hm_cuda_sync(ctx, &err));
        const int iters = 20;
        const double t0 = now_s();
        for (int it = 0; it < iters; it++) CK(hm_cuda_matmul(ctx, &w, px, 512, py, &err));
        CK(hm_cuda_sync(ctx, &err));
        const double dt = (now_s() - t0) / iters;
        printf("%-7s %7.1f TFLOP/s (%7.1f us)\n", hm_type_name(type), 2.0 * 4096 * 4096 * 512 / dt * 1e-12, dt * 1e6);
        hm_cuda_free(ctx, buf);
    }
    hm_cuda_free(ctx, px);
    hm_cuda_free(ctx, py);
}

int main(void) {
    test_decoders_host();
    int rc = cuda_test_open("the host decoder check passed");
    if (rc >= 0) return rc;
    test_errors();
    test_matmul();
    test_get_rows();
    test_row_ops_at(HM_CUDA_KERN_OLD);
    test_row_ops_at(HM_CUDA_KERN_NEW);
    test_rows_shapes();
    test_heads();
    test_router();
    test_route_spec();
    hm_cuda_set_flash(ctx, false); /* the exact kernels (nmse 1e-10); flash: test_cuda_flash_gpu.c */
    test_attention();
    hm_cuda_set_flash(ctx, true);
    test_moe();
    test_fused();
    test_matvec_multi();
    test_moe_dev();
    if (!getenv("HM_NO_BENCH")) {
        bench_matvec();
        bench_moe_dev();
        bench_prefill();
    }
    hm_cuda_close(ctx);
    return test_done();
}
