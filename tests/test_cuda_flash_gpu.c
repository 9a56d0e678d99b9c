/* test_cuda_flash_gpu.c - the attention op on long batches, where the tensor-core flash kernel
 * (cuda_flash.cu) runs, against a double-precision reference computed here.
 *
 * Each case fills an f16 cache [n_kv][cap][hd] (position p in row p % cap: a plain cache when cap
 * covers every position, a ring otherwise) and n_tok queries at positions pos0.., runs
 * hm_cuda_gemma_attention (the general contract: ring, window, GQA; hm_cuda_attention is its
 * cap = n_ctx, window = 0 case and is run too where that applies) and compares query rows (all of
 * them for short batches, a sample of first, last and spread rows for long ones) with two double
 * references:
 *   - the kernel's contract: q * scale / ln 2 rounded to f16 once (cuda_flash.cu's documented rounding),
 *     then exact softmax attention. The kernel differs from it only by rounding each softmax
 *     weight to f16 (relative 2^-11 each: |err| <= 2^-11 max|v|, plus 2^-25 per visible key
 *     for weights in f16's subnormal range) and f32 accumulation; bound: max|v| (1.25 * 2^-11 +
 *     n_keys 2^-25).
 *   - exact attention (f32 q): its NMSE is what flash costs; bounded at 1e-5 (a misplaced row,
 *     mask or tile is > 1e-2) and printed.
 * Flash runs with its KV-split scratch (short batches over long contexts split each block's key
 * range; "ring") and without it (unsplit, "ring1"). Batches below HM_CUDA_FLASH_MIN_TOK (decode,
 * verify) run the flash kernel's decode shape on both ops (a tile's 16 rows are a kv head's GQA
 * group, the keys split over up to 256 blocks, fewer with the ring op's own scratch: the same
 * bounds as flash), except head dims 256 and 512 seeing up to 2048 positions, which run the exact
 * kernels and must match the exact reference within 1e-10 NMSE; with flash off
 * (hm_cuda_set_flash) every batch must. Every run twice into a NaN-filled output: bit-identical. The times printed are
 * information, not checks.
 * q8_0, q4_0 and bf16 caches (-ctk; hm_cuda_attention_kv for plain caches, hm_cuda_gemma_attention_kv
 * for rings and every case as the ring op): the cache is written on the device by
 * hm_cuda_kv_write_kv from f32 K/V and must hold the CPU reference quantiser's bytes (ggml's);
 * the references are computed from its dequantised values (code * scale, exact in f32): the exact
 * kernels within 1e-10 NMSE of exact attention over them, flash within the same bound as above
 * against its contract, where the K and V values are rounded to f16 once too (cuda_flash.cu
 * dequantises into its f16 tiles: f16(code * scale), an exact product rounded once), and 1e-5 NMSE
 * against exact attention over the dequantised values. */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_gemma.h"
#include "core/fp16.h"
#include "cuda_test.h"
#include "quant/quant.h"

typedef struct {
    const char *what;
    int hd, n_head, n_kv;
    int64_t cap;
    int32_t window;
    int64_t pos0, n_tok;
    bool k_is_v; /* gemma4's global layers: one cache for K and V */
    int kvq;     /* 0: an f16 cache; else the hm_type (Q8_0, Q4_0, BF16) of a cache written on the device */
} flash_case;

static uint64_t seed = 0x5eedf1a5ull;

/* up to 16 rows: the first, the last and spread ones (all rows when n <= 64) */
static int64_t sample_rows(int64_t n, int64_t *rows) {
    if (n <= 64) {
        for (int64_t i = 0; i < n; i++) rows[i] = i;
        return n;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < 5; i++) rows[k++] = i;
    for (int64_t i = 1; i <= 6; i++) rows[k++] = i * n / 7 + (i * 13) % (n / 7); /* < (i + 1) n / 7 */
    for (int64_t i = n - 5; i < n; i++) rows[k++] = i;
    return k;
}

static double f16r(float v) { return hm_fp16_to_f32(hm_f32_to_fp16(v)); }

/* double references for query row t, every head, over the cache's values kc, vc (f32: an f16 cache's
 * values, or a q8_0 cache's dequantised ones): exact (ex) and the flash contract (fq): q*scale
 * rounded to f16, and the K and V values rounded to f16 (a no-op for an f16 cache) */
static void reference(const flash_case *fc, const float *q, const float *kc, const float *vc, float scale,
                      int64_t t, double *ex, double *fq, double *sc_e, double *sc_f, int64_t *n_vis) {
    const int hd = fc->hd;
    const int64_t p1 = fc->pos0 + t;
    int64_t p0 = fc->window > 0 ? p1 - fc->window + 1 : 0;
    if (p0 < 0) p0 = 0;
    *n_vis = p1 - p0 + 1;
    for (int h = 0; h < fc->n_head; h++) {
        const int g = h / (fc->n_head / fc->n_kv);
        const float *qv = q + ((size_t)t * (size_t)fc->n_head + (size_t)h) * (size_t)hd;
        double qe[512], qf[512];
        for (int i = 0; i < hd; i++) {
            qe[i] = (double)qv[i] * (double)scale;
            /* the kernel's rounding: q * scale / ln 2 to f16 (its softmax runs in base 2), the
             * score back in natural units exactly */
            qf[i] = (double)hm_fp16_to_f32(hm_f32_to_fp16(qv[i] * (scale * 1.44269504088896341f))) *
                    0.69314718055994531;
        }
        double me = -INFINITY, mf = -INFINITY;
        for (int64_t p = p0; p <= p1; p++) {
            const float *kr = kc + ((size_t)g * (size_t)fc->cap + (size_t)(p % fc->cap)) * (size_t)hd;
            double a = 0, b = 0;
            for (int i = 0; i < hd; i++) {
                a += qe[i] * (double)kr[i];
                b += qf[i] * f16r(kr[i]);
            }
            sc_e[p - p0] = a;
            sc_f[p - p0] = b;
            me = fmax(me, a);
            mf = fmax(mf, b);
        }
        double *oe = ex + (size_t)h * (size_t)hd, *of = fq + (size_t)h * (size_t)hd, se = 0, sf = 0;
        for (int i = 0; i < hd; i++) oe[i] = of[i] = 0;
        for (int64_t p = p0; p <= p1; p++) {
            const double ee = exp(sc_e[p - p0] - me), ef = exp(sc_f[p - p0] - mf);
            se += ee;
            sf += ef;
            const float *vr = vc + ((size_t)g * (size_t)fc->cap + (size_t)(p % fc->cap)) * (size_t)hd;
            for (int i = 0; i < hd; i++) {
                oe[i] += ee * (double)vr[i];
                of[i] += ef * f16r(vr[i]);
            }
        }
        for (int i = 0; i < hd; i++) {
            oe[i] /= se;
            of[i] /= sf;
        }
    }
}

/* Run the op once into a NaN-filled output; returns seconds (after a sync). */
static double run_op(const flash_case *fc, bool plain, const float *dq, const int32_t *dpos, const void *dk,
                     const void *dv, float scale, float *dout, void *scr, size_t scr_n) {
    const size_t nq = (size_t)fc->n_tok * (size_t)fc->n_head * (size_t)fc->hd;
    CK(hm_cuda_memset(ctx, dout, 0xff, nq * 4, &err));
    CK(hm_cuda_sync(ctx, &err));
    const double t0 = now_s();
    const int64_t kv_len = fc->pos0 + fc->n_tok;
    const hm_cuda_kv kv = fc->kvq == HM_TYPE_Q8_0 ? HM_CUDA_KV_Q8_0 : fc->kvq == HM_TYPE_Q4_0 ? HM_CUDA_KV_Q4_0
                          : fc->kvq == HM_TYPE_BF16 ? HM_CUDA_KV_BF16 : HM_CUDA_KV_F16;
    if (fc->kvq && plain)
        CK(hm_cuda_attention_kv(ctx, kv, dq, fc->n_tok, dpos, kv_len, dk, dv, fc->cap, fc->n_head,
                                fc->n_kv, fc->hd, scale, dout, scr, scr_n, &err));
    else if (fc->kvq)
        CK(hm_cuda_gemma_attention_kv(ctx, kv, dq, fc->n_tok, dpos, kv_len, dk, dv, fc->cap, fc->window,
                                      fc->n_head, fc->n_kv, fc->hd, scale, dout, scr, scr_n, &err));
    else if (plain)
        CK(hm_cuda_attention(ctx, dq, fc->n_tok, dpos, kv_len, (const uint16_t *)dk, (const uint16_t *)dv, fc->cap,
                             fc->n_head, fc->n_kv, fc->hd, scale, dout, scr, scr_n, &err));
    else
        CK(hm_cuda_gemma_attention(ctx, dq, fc->n_tok, dpos, kv_len, (const uint16_t *)dk, (const uint16_t *)dv,
                                   fc->cap, fc->window, fc->n_head, fc->n_kv, fc->hd, scale, dout, scr, scr_n, &err));
    CK(hm_cuda_sync(ctx, &err));
    return now_s() - t0;
}

static void check_case(const flash_case *fc, bool flash) {
    hm_cuda_set_flash(ctx, flash);
    const int hd = fc->hd;
    /* both ops run flash for prefill batches and for decode batches (head dims 256 and 512: past
     * 2048 visible positions) */
    const bool ring_takes = hm_cuda_gemma_attention_flash(ctx, fc->n_tok, fc->pos0 + fc->n_tok, fc->window, hd);
    {
        const int64_t kv_len = fc->pos0 + fc->n_tok, span = fc->window > 0 && fc->window < kv_len ? fc->window : kv_len;
        CHECKF(ring_takes == (flash && (fc->n_tok >= HM_CUDA_FLASH_MIN_TOK || hd < 256 || span > 2048)),
               "%s: the ring op takes flash for %lld queries: %d", fc->what, (long long)fc->n_tok, (int)ring_takes);
    }
    const size_t nq = (size_t)fc->n_tok * (size_t)fc->n_head * (size_t)hd;
    const size_t nc = (size_t)fc->n_kv * (size_t)fc->cap * (size_t)hd;
    float *q = xmalloc(nq * 4), *o = xmalloc(nq * 4), *o2 = xmalloc(nq * 4);
    int32_t *pos = xmalloc((size_t)fc->n_tok * 4);
    fill_normal(&seed, q, (int64_t)nq, 1.0f);
    for (int64_t t = 0; t < fc->n_tok; t++) pos[t] = (int32_t)(fc->pos0 + t);
    const float scale = 1.0f / sqrtf((float)hd);
    /* the cache's values as f32 ([n_kv][cap][hd]): kf, vf */
    float *kf = xmalloc(nc * 4), *vf = fc->k_is_v ? kf : xmalloc(nc * 4);
    const size_t rb = fc->kvq ? hm_row_size(fc->kvq, hd) : (size_t)hd * 2; /* bytes of a cache row */
    const size_t cb = (size_t)fc->n_kv * (size_t)fc->cap * rb;                /* bytes of a cache */
    void *dk = NULL, *dv = NULL;
    CK(hm_cuda_alloc(ctx, cb, &dk, &err));
    if (fc->k_is_v) dv = dk;
    else CK(hm_cuda_alloc(ctx, cb, &dv, &err));
    if (!fc->kvq) {
        uint16_t *kc = xmalloc(nc * 2), *vc = fc->k_is_v ? kc : xmalloc(nc * 2);
        for (size_t i = 0; i < nc; i++) kc[i] = hm_f32_to_fp16(rnd_normal(&seed));
        if (!fc->k_is_v)
            for (size_t i = 0; i < nc; i++) vc[i] = hm_f32_to_fp16(rnd_normal(&seed));
        for (size_t i = 0; i < nc; i++) kf[i] = hm_fp16_to_f32(kc[i]);
        if (!fc->k_is_v)
            for (size_t i = 0; i < nc; i++) vf[i] = hm_fp16_to_f32(vc[i]);
        CK(hm_cuda_upload(ctx, dk, kc, nc * 2, &err));
        if (!fc->k_is_v) CK(hm_cuda_upload(ctx, dv, vc, nc * 2, &err));
        free(kc);
        if (!fc->k_is_v) free(vc);
    } else {
        /* K/V rows of every position [cap][n_kv][hd] in f32 (every 97th value an outlier: a block's
         * scale is its max), written by the device's write of the type at positions 0 .. cap - 1 */
        /* (the cases with kvq set have K != V and hd a multiple of 32; a ring's rows are filled the
         * same way: row p % cap for p < cap is row p) */
        const int64_t row = (int64_t)fc->n_kv * hd;
        float *kin = xmalloc(nc * 4), *vin = xmalloc(nc * 4);
        fill_normal(&seed, kin, (int64_t)nc, 1.0f);
        fill_normal(&seed, vin, (int64_t)nc, 1.0f);
        for (size_t i = 0; i < nc; i += 97) kin[i] *= 6.0f;
        int32_t *all = xmalloc((size_t)fc->cap * 4);
        for (int64_t p = 0; p < fc->cap; p++) all[p] = (int32_t)p;
        float *dkin = NULL, *dvin = NULL;
        int32_t *dall = NULL;
        CK(hm_cuda_alloc(ctx, nc * 4, (void **)&dkin, &err));
        CK(hm_cuda_alloc(ctx, nc * 4, (void **)&dvin, &err));
        CK(hm_cuda_alloc(ctx, (size_t)fc->cap * 4, (void **)&dall, &err));
        CK(hm_cuda_upload(ctx, dkin, kin, nc * 4, &err));
        CK(hm_cuda_upload(ctx, dvin, vin, nc * 4, &err));
        CK(hm_cuda_upload(ctx, dall, all, (size_t)fc->cap * 4, &err));
        const hm_cuda_kv wkv = fc->kvq == HM_TYPE_Q8_0 ? HM_CUDA_KV_Q8_0 : fc->kvq == HM_TYPE_Q4_0 ? HM_CUDA_KV_Q4_0
                                                                                           : HM_CUDA_KV_BF16;
        CK(hm_cuda_kv_write_kv(ctx, wkv, dk, dv, fc->cap, fc->n_kv, hd, dkin, dvin, fc->cap, dall, &err));
        unsigned char *kq = xmalloc(cb), *vq = xmalloc(cb), *want = xmalloc(rb);
        CK(hm_cuda_download(ctx, kq, dk, cb, &err));
        CK(hm_cuda_download(ctx, vq, dv, cb, &err));
        const hm_type_traits *tt = hm_type_get(fc->kvq);
        int64_t bad = 0;
        for (int64_t p = 0; p < fc->cap; p++)
            for (int h = 0; h < fc->n_kv; h++) {
                const size_t at = ((size_t)h * (size_t)fc->cap + (size_t)p) * rb;
                const size_t el = ((size_t)h * (size_t)fc->cap + (size_t)p) * (size_t)hd;
                tt->from_float_ref(kin + p * row + h * hd, want, hd);
                bad += memcmp(kq + at, want, rb) != 0;
                tt->from_float_ref(vin + p * row + h * hd, want, hd);
                bad += memcmp(vq + at, want, rb) != 0;
                tt->to_float_ref(kq + at, kf + el, hd);
                tt->to_float_ref(vq + at, vf + el, hd);
            }
        CHECKF(bad == 0, "%s: %lld rows written on the device differ from the reference quantiser", fc->what,
               (long long)bad);
        hm_cuda_free(ctx, dkin);
        hm_cuda_free(ctx, dvin);
        hm_cuda_free(ctx, dall);
        free(kin), free(vin), free(all), free(kq), free(vq), free(want);
    }
    float max_v = 0.0f;
    for (size_t i = 0; i < nc; i++) max_v = fmaxf(max_v, fabsf((float)f16r(vf[i])));

    float *dq = NULL, *dout = NULL;
    int32_t *dpos = NULL;
    void *scr = NULL;
    const bool plain = fc->window == 0 && fc->cap >= fc->pos0 + fc->n_tok && hd >= 64 && hd <= 256;
    const size_t scr_ring = hm_cuda_gemma_attention_scratch_size(ctx, hd);
    const size_t scr_flash = hm_cuda_flash_scratch_size(ctx, fc->n_tok, fc->n_head, hd, fc->pos0 + fc->n_tok);
    size_t scr_n = scr_ring + scr_flash;
    if (plain) {
        const size_t a = hm_cuda_attention_scratch_size(ctx, fc->n_tok, fc->pos0 + fc->n_tok, fc->n_head, fc->n_kv, hd);
        if (a > scr_n) scr_n = a;
    }
    CK(hm_cuda_alloc(ctx, nq * 4, (void **)&dq, &err));
    CK(hm_cuda_alloc(ctx, nq * 4, (void **)&dout, &err));
    CK(hm_cuda_alloc(ctx, (size_t)fc->n_tok * 4, (void **)&dpos, &err));
    CK(hm_cuda_alloc(ctx, scr_n, &scr, &err));
    CK(hm_cuda_upload(ctx, dq, q, nq * 4, &err));
    CK(hm_cuda_upload(ctx, dpos, pos, (size_t)fc->n_tok * 4, &err));

    /* entries: the ring op with the flash scratch (a KV split where the grid is small), the plain
     * op, the ring op with only its own scratch (flash unsplit) */
    for (int entry = 0; entry < 3; entry++) {
        if ((entry == 1 && !plain) || (entry == 2 && !scr_flash)) continue;
        const bool via_plain = entry == 1;
        const size_t sn = entry == 2 ? scr_ring : scr_n;
        const char *how = entry == 0 ? "ring" : entry == 1 ? "plain" : "ring1";
        const bool takes = via_plain ? hm_cuda_attention_flash(ctx, fc->n_tok, fc->pos0 + fc->n_tok, hd) : ring_takes;
        CHECKF(!via_plain || takes == (flash && (hd < 256 || fc->n_tok >= HM_CUDA_FLASH_MIN_TOK || fc->pos0 + fc->n_tok > 2048)),
               "%s: the plain op takes flash for %lld queries: %d", fc->what, (long long)fc->n_tok, (int)takes);
        const double secs = run_op(fc, via_plain, dq, dpos, dk, dv, scale, dout, scr, sn);
        CK(hm_cuda_download(ctx, o, dout, nq * 4, &err));
        run_op(fc, via_plain, dq, dpos, dk, dv, scale, dout, scr, sn);
        CK(hm_cuda_download(ctx, o2, dout, nq * 4, &err));
        CHECKF(!memcmp(o, o2, nq * 4), "%s (%s): two runs differ", fc->what, how);

        int64_t rows[64];
        const int64_t nr = sample_rows(fc->n_tok, rows);
        double *ex = xmalloc((size_t)fc->n_head * (size_t)hd * 8), *fq = xmalloc((size_t)fc->n_head * (size_t)hd * 8);
        double *sce = xmalloc((size_t)(fc->pos0 + fc->n_tok) * 8), *scf = xmalloc((size_t)(fc->pos0 + fc->n_tok) * 8);
        double num = 0, den = 0, max_abs = 0, bound_min = INFINITY;
        bool bound_ok = true;
        for (int64_t i = 0; i < nr; i++) {
            int64_t n_vis;
            reference(fc, q, kf, vf, scale, rows[i], ex, fq, sce, scf, &n_vis);
            const double bound = (double)max_v * (1.25 * ldexp(1.0, -11) + (double)n_vis * ldexp(1.0, -25));
            if (bound < bound_min) bound_min = bound;
            const float *ov = o + (size_t)rows[i] * (size_t)fc->n_head * (size_t)hd;
            for (size_t j = 0; j < (size_t)fc->n_head * (size_t)hd; j++) {
                const double d = (double)ov[j] - ex[j];
                num += d * d;
                den += ex[j] * ex[j];
                const double a = fabs((double)ov[j] - fq[j]);
                if (!(a <= max_abs)) max_abs = a; /* NaN sticks */
                if (!(a <= bound)) bound_ok = false;
            }
        }
        const double e = num / den;
        printf("%-34s %-5s %-9s %s hd %3d, %2d/%d heads, cap %6lld, window %4d, %6lld queries at %6lld: nmse vs exact "
               "%.2e, max |err| vs f16-q ref %.2e (bound %.2e), %.3f ms\n",
               fc->what, how, takes ? "flash" : "exact", fc->kvq ? hm_type_name(fc->kvq) : "f16", hd, fc->n_head, fc->n_kv,
               (long long)fc->cap, fc->window, (long long)fc->n_tok, (long long)fc->pos0, e, max_abs, bound_min,
               secs * 1e3);
        if (takes) {
            CHECKF(bound_ok, "%s (flash): max |err| %.3g against the f16-q reference, past the bound", fc->what,
                   max_abs);
            CHECKF(e < 1e-5, "%s (flash): nmse %.3g against exact attention", fc->what, e);
        } else {
            CHECKF(e < 1e-10, "%s (exact kernel): nmse %.3g", fc->what, e);
        }
        free(ex);
        free(fq);
        free(sce);
        free(scf);
    }
    hm_cuda_free(ctx, dq);
    hm_cuda_free(ctx, dout);
    hm_cuda_free(ctx, dk);
    if (!fc->k_is_v) hm_cuda_free(ctx, dv);
    hm_cuda_free(ctx, dpos);
    hm_cuda_free(ctx, scr);
    free(q);
    free(o);
    free(o2);
    free(kf);
    if (!fc->k_is_v) free(vf);
    free(pos);
    hm_cuda_set_flash(ctx, true);
}

int main(void) {
    int rc = cuda_test_open("nothing to check without one");
    if (rc >= 0) return rc;
    const flash_case cases[] = {
        {"decode at depth (length 1)", 128, 16, 2, 8192, 0, 5000, 1, false, 0},
        /* decode on the flash kernel (the plain op): GQA groups of 8, 16, 1 and 4 as the 16 rows
         * of a tile (a group of 16 fills it, 8 leaves padding rows, a batch of 3 x 8 spans two
         * blocks), short and deep caches (the KV split grows to its cap of 256), every head dim */
        {"decode qwen36-geom at 32768", 128, 32, 4, 32768, 0, 32767, 1, false, 0},
        {"decode qwen36-geom at 65536", 128, 32, 4, 65536, 0, 65535, 1, false, 0},
        {"decode G 16 at 3000", 128, 32, 2, 4096, 0, 2999, 1, false, 0},
        {"verify batch of 3 at 20000", 128, 32, 4, 20480, 0, 20000, 3, false, 0},
        {"verify batch of 31 at 9000", 128, 16, 2, 12288, 0, 9000, 31, false, 0},
        {"decode hd 64 G 1 at 10", 64, 4, 4, 2048, 0, 9, 1, false, 0},
        {"decode hd 256 G 8 at 40000", 256, 16, 2, 40960, 0, 40000, 1, false, 0},
        {"decode hd 256 G 8 at 1000 (exact kernel)", 256, 16, 2, 2048, 0, 1000, 1, false, 0},
        {"decode at position 0", 128, 16, 2, 64, 0, 0, 1, false, 0},
        {"length 7", 128, 16, 2, 8192, 0, 300, 7, false, 0},
        {"length 32 (the smallest flash batch)", 128, 16, 2, 8192, 0, 0, 32, false, 0},
        {"qwen3moe prefill 512", 128, 32, 4, 4096, 0, 0, 512, false, 0},
        {"unaligned batch at depth", 128, 16, 2, 8192, 0, 4000, 100, false, 0},
        {"hd 64, G 1", 64, 4, 4, 2048, 0, 100, 200, false, 0},
        {"qwen35moe hd 256 at 4096", 256, 16, 2, 8192, 0, 0, 4096, false, 0},
        {"gemma4 sliding ring, window 1024", 256, 16, 8, 1600, 1024, 3000, 512, false, 0},
        {"gemma4 global hd 512, K=V", 512, 16, 2, 4608, 0, 0, 4096, true, 0},
        {"gemma4 global hd 512 at depth", 512, 8, 1, 8192, 0, 6000, 64, true, 0},
        /* decode on rings: the flash decode shape with a window (gpt-oss's sliding layers), a ring
         * that has wrapped, gemma4's K=V global layer at depth, and one short enough for the exact
         * kernel (head dim 512, 1001 positions) */
        {"gpt-oss sliding ring decode, window 128", 64, 64, 8, 640, 128, 5000, 1, false, 0},
        {"wrapped ring decode, window 4096", 128, 32, 4, 4608, 4096, 20000, 2, false, 0},
        {"gemma4 global hd 512 decode, K=V", 512, 16, 2, 8192, 0, 6000, 1, true, 0},
        {"gemma4 global hd 512 decode at 1000 (exact)", 512, 16, 2, 2048, 0, 1000, 1, true, 0},
        {"long prefill 32768", 128, 16, 2, 32768, 0, 0, 32768, false, 0},
        {"long prefill 65536", 128, 16, 2, 65536, 0, 0, 65536, false, 0},
        /* q8_0 caches (-ctk q8_0): decode, short batches, flash prefill, at depth, each head_dim */
        {"q8_0 decode at depth (length 1)", 128, 16, 2, 8192, 0, 5000, 1, false, HM_TYPE_Q8_0},
        {"q8_0 decode G 8 at 30000", 128, 32, 4, 30720, 0, 30000, 1, false, HM_TYPE_Q8_0},
        {"q4_0 decode G 8 at 30000", 128, 32, 4, 30720, 0, 30000, 1, false, HM_TYPE_Q4_0},
        {"bf16 decode hd 256 at 12000", 256, 16, 2, 12288, 0, 12000, 2, false, HM_TYPE_BF16},
        {"q8_0 length 7", 128, 16, 2, 8192, 0, 300, 7, false, HM_TYPE_Q8_0},
        {"q8_0 qwen3moe prefill 512", 128, 32, 4, 4096, 0, 0, 512, false, HM_TYPE_Q8_0},
        {"q8_0 unaligned batch at depth", 128, 16, 2, 8192, 0, 4000, 100, false, HM_TYPE_Q8_0},
        {"q8_0 hd 64, G 1", 64, 4, 4, 2048, 0, 100, 200, false, HM_TYPE_Q8_0},
        {"q8_0 hd 256 at 4096", 256, 16, 2, 8192, 0, 0, 4096, false, HM_TYPE_Q8_0},
        {"q8_0 long prefill 32768", 128, 16, 2, 32768, 0, 0, 32768, false, HM_TYPE_Q8_0},
        {"q8_0 gemma4 sliding ring, window 1024", 256, 16, 8, 1600, 1024, 3000, 512, false, HM_TYPE_Q8_0},
        {"q8_0 gemma4 ring decode, window 1024", 256, 16, 8, 1600, 1024, 3000, 1, false, HM_TYPE_Q8_0},
        {"q8_0 hd 512 at depth", 512, 8, 1, 8192, 0, 6000, 64, false, HM_TYPE_Q8_0},
        {"q8_0 hd 512 decode", 512, 8, 1, 8192, 0, 6000, 1, false, HM_TYPE_Q8_0},
        /* q4_0 and bf16 caches: the same paths */
        {"q4_0 decode at depth (length 1)", 128, 16, 2, 8192, 0, 5000, 1, false, HM_TYPE_Q4_0},
        {"q4_0 qwen3moe prefill 512", 128, 32, 4, 4096, 0, 0, 512, false, HM_TYPE_Q4_0},
        {"q4_0 gemma4 sliding ring, window 1024", 256, 16, 8, 1600, 1024, 3000, 512, false, HM_TYPE_Q4_0},
        {"bf16 decode at depth (length 1)", 128, 16, 2, 8192, 0, 5000, 1, false, HM_TYPE_BF16},
        {"bf16 qwen3moe prefill 512", 128, 32, 4, 4096, 0, 0, 512, false, HM_TYPE_BF16},
        {"bf16 hd 512 at depth", 512, 8, 1, 8192, 0, 6000, 64, false, HM_TYPE_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], true);
    /* the exact kernels (flash off) on decode and on long batches, where their cost allows */
    const char *exact_too[] = {"decode at depth (length 1)", "decode qwen36-geom at 32768", "verify batch of 3 at 20000",
                               "qwen3moe prefill 512", "gemma4 sliding ring, window 1024",
                               "gemma4 global hd 512 at depth", "q8_0 qwen3moe prefill 512", "q4_0 decode G 8 at 30000"};
    for (size_t j = 0; j < sizeof exact_too / sizeof exact_too[0]; j++) {
        size_t i = 0;
        while (i < sizeof cases / sizeof cases[0] && strcmp(cases[i].what, exact_too[j])) i++;
        CHECKF(i < sizeof cases / sizeof cases[0], "no case named %s", exact_too[j]);
        if (i < sizeof cases / sizeof cases[0]) check_case(&cases[i], false);
    }
    hm_cuda_close(ctx);
    return test_done();
}
