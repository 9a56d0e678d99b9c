/* test_deepseek4_gpu.c - deepseek4 (DeepSeek-V4) on the GPU against the CPU engine (whose logits
 * tests/cli_llama_ref_deepseek4.sh holds to llama.cpp), and the V4 CUDA ops (cuda_dsv4.h) against
 * their CPU twins (cpu_dsv4.h) and references.
 *
 * The orders the kernels use (the compressors' chunks, the indexer's reduction) are emulated on the
 * host by test_dsv4_cuda_order (label fast, every build).
 * Kernels (random inputs; max error relative to the largest value KERN_REL 1e-5 where the CPU twin
 * runs the same float expression, the rest against double references): hc_expand (exact), hc_mix,
 * hc_reduce, hc_post, swiglu_clamp against cpu_dsv4.c; the grouped expert kernels' clamp
 * (hm_cuda_moe_act_lim host-routed, decode and prefill batches, hm_cuda_moe_dev_act_lim device-routed
 * with a cold expert) on F32 units against a double reference; the compressor's ring write (exact)
 * and block compression (ratios 4 and 128) against a double reference; rope_tail against the CPU's
 * float recurrence;
 * the indexer on integer-valued inputs (every score exact in f32: the choice must equal the CPU
 * algorithm's, ties included); the attention (window ring + compressed rows + sinks, de-roped) at
 * head dims 64 and 512 against a double reference (ATTN_ABS 1e-4, as test_deepseek2_gpu's).
 *
 * Model: synth deepseek4 tiny (5 layers: ratios 0, 4, 128, 4, 128; window 16, indexer top 8 of
 * 16 x 64, hc 4, hash layers 0-1, a SwiGLU clamp of 0.5 that clamps), under -ngl 99 (every unit
 * hot; decode on the CUDA graph), --cpu-moe, a --vram-budget of a third of the units and
 * --n-cpu-moe 3, logits compared step by step with gpu_compare.h's rule:
 *   - long (F32): a 150-token prompt (past one ratio-128 block and 37 ratio-4 blocks: the indexer's
 *     top-k is live) then 16 decode steps, n_ubatch 256 (one prefill pass of 150 rows: the
 *     compressors in two chunks), 64 (three passes: the state carried) and 8 (the decode path
 *     throughout), the GPU's matmuls exact (HOTMOE_CUDA_EXACT=1): a top-k choice is discrete, and
 *     a near-tie of two compressed rows' index scores that bf16 or Q8 rounding flips between the
 *     engines changes the logits by more than any rounding bound (the tiny preset's compressor
 *     norms make compressed rows count); exact f32 on both sides leaves ~1e-7 of noise, so every
 *     step NMSE_EXACT 1e-6;
 *   - short (F32 and Q8_0): a 20-token prompt and 14 steps (positions < 36: every ratio-4 block
 *     visible, no choice to flip) on the default kernels, n_ubatch 64 and 8; bounds as
 *     test_deepseek2_gpu's (the same kinds of numerics): F32 decode NMSE_EXACT 1e-6, F32 prefill
 *     (bf16 tensor cores) NMSE_BF16 1e-4, Q8_0 (the CPU quantises activations to Q8, the GPU keeps
 *     f32) NMSE_Q8 3e-4.
 * On the long run's -ngl 99: HOTMOE_CUDA_GRAPH=0 must equal the graph's decode logits byte for
 * byte (the same kernels in the same order); back within the current 128-block (hm_session_trim)
 * and on again equals the uninterrupted GPU run (BOUND 1e-4 relative, as test_deepseek4_state's)
 * and the CPU doing the same (NMSE_EXACT); back further is refused naming the
 * compressed state. HM_DS4_REAL_LAYERS=N (3 or 4) adds the real deepseek-v4-flash shape (head 512,
 * 64 heads, indexer 64 x 128 top 512, window 128; --fast-experts q4_k_m, N layers: about 3.6 GB a
 * layer) under -ngl 99 and --n-cpu-moe 2 against the CPU. Exits 77 without a CUDA device. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_dsv4.h"
#include "backend/cuda/cuda_dsv4.h"
#include "core/fp16.h"
#include "gpu_compare.h"
#include "hotmoe.h"
#include "test.h"
/* last: its file-scope `err` would shadow the parameters of the helpers above */
#include "cuda_test.h"

#define NMSE_EXACT 1e-6
#define NMSE_BF16 1e-4
#define NMSE_Q8 3e-4
#define KERN_REL 1e-5
#define ATTN_ABS 1e-4
#define BOUND 1e-4

static float frand(uint64_t *s) { return (float)(rnd_unit(s) * 2.0 - 1.0); }

/* The CPU's choice (cpu_dsv4.c's index_row): k passes of the first maximum among the untaken. */
static void topk_cpu(float *sc, int64_t n, int k, int32_t *sel) {
    for (int i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t b = 0; b < n; b++)
            if (sc[b] != -INFINITY && (best < 0 || sc[b] > sc[best])) best = b;
        sel[i] = (int32_t)best;
        sc[best] = -INFINITY;
    }
}


/* ---- kernels ---- */

static void *dev_copy(const void *h, size_t n) {
    void *d = NULL;
    CK(hm_cuda_alloc(ctx, n ? n : 4, &d, &err));
    if (h && n) CK(hm_cuda_upload(ctx, d, h, n, &err)); /* h NULL: uninitialised room */
    return d;
}

static void dev_get(void *h, const void *d, size_t n) {
    CK(hm_cuda_sync(ctx, &err));
    CK(hm_cuda_download(ctx, h, d, n, &err));
}

static double max_rel(const float *a, const float *b, size_t n) {
    double md = 0, mr = 1e-30;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - b[i]));
        mr = fmax(mr, fabs((double)b[i]));
    }
    return md / mr;
}

static void check_hc(void) {
    enum { N = 3, E = 96, HC = 4, MW = (2 + HC) * HC };
    uint64_t s = 7;
    float x[N * HC * E], mix[N * MW], head[N * HC], f[N * E], scale[3], base[MW];
    for (int i = 0; i < N * HC * E; i++) x[i] = frand(&s);
    for (int i = 0; i < N * MW; i++) mix[i] = 2.0f * frand(&s);
    for (int i = 0; i < N * HC; i++) head[i] = 2.0f * frand(&s);
    for (int i = 0; i < N * E; i++) f[i] = frand(&s);
    for (int i = 0; i < 3; i++) scale[i] = 0.5f + 0.1f * frand(&s);
    for (int i = 0; i < MW; i++) base[i] = 0.5f * frand(&s);
    hm_pool *pool = NULL;
    CK(hm_pool_open(&pool, 2, &err));
    /* expand: the packed rows into hc copies (exact) */
    float packed[N * E], ex_c[N * HC * E], ex_g[N * HC * E];
    memcpy(packed, x, sizeof packed);
    memcpy(ex_c, x, sizeof packed);
    hm_dsv4_hc_expand(ex_c, N, E, HC);
    float *pd = dev_copy(packed, sizeof packed), *ed = dev_copy(NULL, sizeof ex_g);
    CK(hm_cuda_dsv4_hc_expand(ctx, pd, ed, N, E, HC, &err));
    dev_get(ex_g, ed, sizeof ex_g);
    CHECKF(memcmp(ex_g, ex_c, sizeof ex_g) == 0, "hc_expand differs from the CPU's");
    /* mix (both forms) */
    float mix_c[N * MW], mix_g[N * MW], head_c[N * HC], head_g[N * HC];
    memcpy(mix_c, mix, sizeof mix);
    memcpy(head_c, head, sizeof head);
    hm_dsv4_hc_mix(mix_c, N, HC, false, scale, base, 20, 1e-6f);
    hm_dsv4_hc_mix(head_c, N, HC, true, scale, base, 20, 1e-6f);
    float *md = dev_copy(mix, sizeof mix), *hd_ = dev_copy(head, sizeof head), *scd = dev_copy(scale, sizeof scale);
    float *bd = dev_copy(base, sizeof base);
    CK(hm_cuda_dsv4_hc_mix(ctx, md, N, HC, false, scd, bd, 20, 1e-6f, &err));
    CK(hm_cuda_dsv4_hc_mix(ctx, hd_, N, HC, true, scd, bd, 20, 1e-6f, &err));
    dev_get(mix_g, md, sizeof mix_g);
    dev_get(head_g, hd_, sizeof head_g);
    const double e_mix = max_rel(mix_g, mix_c, N * MW), e_head = max_rel(head_g, head_c, N * HC);
    /* reduce by pre, post: from the CPU's mixes (each kernel on its own) */
    float y_c[N * E], y_g[N * E], o_c[N * HC * E], o_g[N * HC * E];
    hm_dsv4_hc_reduce(pool, x, mix_c, MW, N, E, HC, y_c);
    hm_dsv4_hc_post(pool, f, x, mix_c, N, E, HC, o_c);
    float *xd = dev_copy(x, sizeof x), *mcd = dev_copy(mix_c, sizeof mix_c), *fd = dev_copy(f, sizeof f);
    float *yd = dev_copy(NULL, sizeof y_g), *od = dev_copy(NULL, sizeof o_g);
    CK(hm_cuda_dsv4_hc_reduce(ctx, xd, mcd, MW, N, E, HC, yd, &err));
    CK(hm_cuda_dsv4_hc_post(ctx, fd, xd, mcd, N, E, HC, od, &err));
    dev_get(y_g, yd, sizeof y_g);
    dev_get(o_g, od, sizeof o_g);
    const double e_red = max_rel(y_g, y_c, N * E), e_post = max_rel(o_g, o_c, N * HC * E);
    /* clamped SwiGLU (limit 0.5 clamps most values) */
    float g[N * E], u[N * E], sw_c[N * E], sw_g[N * E];
    for (int i = 0; i < N * E; i++) g[i] = 2.0f * frand(&s), u[i] = 2.0f * frand(&s);
    float uc[N * E];
    memcpy(uc, u, sizeof u);
    hm_dsv4_swiglu_clamp(pool, g, uc, sw_c, N * E, 0.5f);
    float *gd = dev_copy(g, sizeof g), *ud = dev_copy(u, sizeof u), *sd = dev_copy(NULL, sizeof sw_g);
    CK(hm_cuda_swiglu_clamp(ctx, gd, ud, sd, N * E, 0.5f, &err));
    dev_get(sw_g, sd, sizeof sw_g);
    const double e_sw = max_rel(sw_g, sw_c, N * E);
    printf("hc: mix %.3g, head mix %.3g, reduce %.3g, post %.3g, swiglu_clamp %.3g (max rel err)\n", e_mix, e_head,
           e_red, e_post, e_sw);
    CHECKF(e_mix <= KERN_REL && e_head <= KERN_REL, "hc_mix: %.3g, head %.3g", e_mix, e_head);
    CHECKF(e_red <= KERN_REL && e_post <= KERN_REL, "hc_reduce %.3g, hc_post %.3g", e_red, e_post);
    CHECKF(e_sw <= KERN_REL, "swiglu_clamp: %.3g", e_sw);
    hm_pool_close(pool);
    void *fr[] = {pd, ed, md, hd_, scd, bd, xd, mcd, fd, yd, od, gd, ud, sd};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
}

/* cpu_dsv4.c's rope_tail, the test's copy (the reference) */
static void rope_tail_ref(float *x, int hd, int n_rot, int32_t p, float base, const float *ff, bool inv) {
    const float tscale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)p;
    float *r = x + (hd - n_rot);
    for (int i = 0; i < n_rot; i += 2) {
        const float th = ff ? theta / ff[i / 2] : theta;
        const float c = cosf(th), sn = inv ? -sinf(th) : sinf(th);
        const float a = r[i], b = r[i + 1];
        r[i] = a * c - b * sn;
        r[i + 1] = a * sn + b * c;
        theta *= tscale;
    }
}

static void check_rope(void) {
    enum { N = 4, H = 3, HD = 96, ROT = 32 };
    uint64_t s = 9;
    float x[N * H * HD], xr[N * H * HD], got[N * H * HD], ff[ROT / 2];
    const int32_t pos[N] = {0, 17, 300, 4095};
    for (int i = 0; i < N * H * HD; i++) x[i] = frand(&s);
    for (int i = 0; i < ROT / 2; i++) ff[i] = 1.0f + 0.7f * (float)i;
    float *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, sizeof pos);
    double worst = 0;
    for (int v = 0; v < 4; v++) { /* plain, scaled, inverse, inverse scaled */
        const bool inv = v >= 2, sc = v % 2 == 1;
        const float base = sc ? 160000.0f : 10000.0f;
        memcpy(xr, x, sizeof x);
        for (int t = 0; t < N; t++)
            for (int h = 0; h < H; h++)
                rope_tail_ref(xr + (t * H + h) * HD, HD, ROT, pos[t], base, sc ? ff : NULL, inv);
        float *xd = dev_copy(x, sizeof x);
        CK(hm_cuda_dsv4_rope_tail(ctx, xd, N, H, HD, ROT, pd, powf(base, -2.0f / (float)ROT), sc ? fd : NULL, inv,
                                  &err));
        dev_get(got, xd, sizeof got);
        hm_cuda_free(ctx, xd);
        worst = fmax(worst, max_rel(got, xr, N * H * HD));
    }
    printf("rope_tail: max rel err %.3g\n", worst);
    CHECKF(worst <= KERN_REL, "rope_tail: %.3g", worst);
    hm_cuda_free(ctx, fd), hm_cuda_free(ctx, pd);
}

/* The indexer on integer-valued inputs: every dot and score exact in f32, so the GPU's choice must be
 * the CPU algorithm's exactly (ties among them). */
static void check_index(void) {
    enum { IH = 4, IHD = 64, TOPK = 8, N = 3, NC = 64 };
    uint64_t s = 21;
    const int32_t pos[N] = {20, 150, 255}; /* 5 visible rows (all taken), 37, 64 */
    float iq[N * IH * IHD], iw[N * IH], icomp[NC * IHD];
    for (int i = 0; i < N * IH * IHD; i++) iq[i] = (float)(int)(frand(&s) * 3.0f);
    for (int i = 0; i < N * IH; i++) iw[i] = (float)(1 + (int)(rnd_unit(&s) * 3.0));
    for (int i = 0; i < NC * IHD; i++) icomp[i] = (float)(int)(frand(&s) * 2.0f);
    uint16_t icomp_h[NC * IHD]; /* the device keeps compressed rows as f16: small integers, exact */
    for (int i = 0; i < NC * IHD; i++) icomp_h[i] = hm_f32_to_fp16(icomp[i]);
    float *qd = dev_copy(iq, sizeof iq), *wd = dev_copy(iw, sizeof iw);
    uint16_t *cd = dev_copy(icomp_h, sizeof icomp_h);
    int32_t *pd = dev_copy(pos, sizeof pos);
    float *scd = dev_copy(NULL, (size_t)N * NC * 4);
    int32_t *seld = dev_copy(NULL, sizeof(int32_t) * N * TOPK), *nsd = dev_copy(NULL, sizeof(int32_t) * N);
    CK(hm_cuda_dsv4_index(ctx, qd, wd, cd, pd, 0, N, IH, IHD, TOPK, scd, NC, seld, nsd, &err));
    int32_t sel[N * TOPK], ns[N];
    dev_get(sel, seld, sizeof sel);
    dev_get(ns, nsd, sizeof ns);
    int bad = 0;
    for (int t = 0; t < N; t++) {
        const int64_t n_vis = (pos[t] + 1) / 4;
        int32_t want[TOPK];
        int nw;
        if (n_vis <= TOPK) {
            for (int b = 0; b < n_vis; b++) want[b] = b;
            nw = (int)n_vis;
        } else {
            float sc[NC];
            for (int64_t b = 0; b < n_vis; b++) {
                double sum = 0;
                for (int h = 0; h < IH; h++) {
                    double dot = 0;
                    for (int i = 0; i < IHD; i++) dot += (double)iq[(t * IH + h) * IHD + i] * icomp[b * IHD + i];
                    sum += (dot > 0 ? dot : 0) * iw[t * IH + h];
                }
                sc[b] = (float)sum;
            }
            topk_cpu(sc, n_vis, TOPK, want);
            nw = TOPK;
        }
        const bool ok = ns[t] == nw && memcmp(sel + t * TOPK, want, (size_t)nw * 4) == 0;
        bad += !ok;
        printf("index row %d (pos %d): %d chosen%s, first %d %d %d\n", t, pos[t], ns[t], ok ? "" : " (WRONG)",
               sel[t * TOPK], sel[t * TOPK + 1], sel[t * TOPK + 2]);
    }
    CHECKF(bad == 0, "indexer: %d rows chose other rows than the CPU's algorithm", bad);
    void *fr[] = {qd, wd, cd, pd, scd, seld, nsd};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
}

/* The attention op against a double reference: ratio 4 (chosen rows), 128 (all blocks) or 0. */
static void check_attention(int hd, int n_head, int ratio, int64_t n, int64_t p0) {
    enum { WIN = 16, TOPK = 8 };
    const int n_rot = hd / 8;
    const int64_t n_ctx = 1024, cap = WIN + n, n_comp = n_ctx / (ratio ? ratio : 4) + 1;
    uint64_t s = 31 + (uint64_t)hd + (uint64_t)ratio;
    const size_t nq = (size_t)(n * n_head * hd);
    float *q = xmalloc(nq * 4), *o = xmalloc(nq * 4), *raw = xmalloc((size_t)cap * hd * 4);
    float *comp = xmalloc((size_t)n_comp * hd * 4), sinks[64], ff[64];
    double *ref = xmalloc(nq * 8), *sc = xmalloc((size_t)(WIN + n_comp) * 8);
    int32_t *pos = xmalloc((size_t)n * 4), *sel = xmalloc((size_t)n * TOPK * 4), *ns = xmalloc((size_t)n * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand(&s);
    for (int64_t i = 0; i < cap * hd; i++) raw[i] = hm_fp16_to_f32(hm_f32_to_fp16(frand(&s)));
    for (int64_t i = 0; i < n_comp * hd; i++) comp[i] = hm_fp16_to_f32(hm_f32_to_fp16(2.0f * frand(&s)));
    for (int h = 0; h < n_head; h++) sinks[h] = frand(&s);
    for (int i = 0; i < n_rot / 2; i++) ff[i] = 1.0f + 0.3f * (float)i;
    for (int64_t t = 0; t < n; t++) {
        pos[t] = (int32_t)(p0 + t);
        const int64_t vis = (pos[t] + 1) / 4;
        ns[t] = (int32_t)(vis < TOPK ? vis : TOPK);
        for (int k = 0; k < ns[t]; k++) sel[t * TOPK + k] = (int32_t)((k * 5 + t) % vis); /* any distinct-ish rows */
    }
    const float theta = ratio ? 160000.0f : 10000.0f, scale = 1.0f / sqrtf((float)hd);
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < n_head; h++) {
            const float *qv = q + ((size_t)t * n_head + h) * hd;
            const int64_t p = pos[t], j0 = p - WIN + 1 > 0 ? p - WIN + 1 : 0, n_raw = p - j0 + 1;
            const int64_t n_cmp = ratio == 128 ? (p + 1) / 128 : ratio == 4 ? ns[t] : 0;
            double mx = sinks[h];
            for (int64_t i = 0; i < n_raw + n_cmp; i++) {
                const float *k = i < n_raw ? raw + ((j0 + i) % cap) * hd
                                           : comp + (ratio == 4 ? sel[t * TOPK + i - n_raw] : i - n_raw) * hd;
                double a = 0;
                for (int e = 0; e < hd; e++) a += (double)qv[e] * k[e];
                sc[i] = a * scale;
                mx = fmax(mx, sc[i]);
            }
            double sum = exp(sinks[h] - mx);
            double *r = ref + ((size_t)t * n_head + h) * hd;
            for (int e = 0; e < hd; e++) r[e] = 0;
            for (int64_t i = 0; i < n_raw + n_cmp; i++) {
                const float *v = i < n_raw ? raw + ((j0 + i) % cap) * hd
                                           : comp + (ratio == 4 ? sel[t * TOPK + i - n_raw] : i - n_raw) * hd;
                const double e = exp(sc[i] - mx);
                sum += e;
                for (int d = 0; d < hd; d++) r[d] += e * v[d];
            }
            for (int d = 0; d < hd; d++) r[d] /= sum;
            /* the inverse RoPE of the tail in double, at the angles the contract forms (the CPU's float
             * products: cuda_dsv4.h) */
            const float ts = powf(theta, -2.0f / (float)n_rot);
            float thf = (float)p;
            for (int i = 0; i < n_rot / 2; i++, thf *= ts) {
                const double th = ratio ? (double)(thf / ff[i]) : (double)thf;
                const double c = cos(th), sn = -sin(th), a = r[hd - n_rot + 2 * i], b = r[hd - n_rot + 2 * i + 1];
                r[hd - n_rot + 2 * i] = a * c - b * sn;
                r[hd - n_rot + 2 * i + 1] = a * sn + b * c;
            }
        }
    /* the device's rows are f16: the f16-rounded values above, exactly */
    uint16_t *raw_h = xmalloc((size_t)cap * hd * 2), *comp_h = xmalloc((size_t)n_comp * hd * 2);
    for (int64_t i = 0; i < cap * hd; i++) raw_h[i] = hm_f32_to_fp16(raw[i]);
    for (int64_t i = 0; i < n_comp * hd; i++) comp_h[i] = hm_f32_to_fp16(comp[i]);
    float *qd = dev_copy(q, nq * 4), *sd = dev_copy(sinks, sizeof sinks);
    uint16_t *rd = dev_copy(raw_h, (size_t)cap * hd * 2), *cd = dev_copy(comp_h, (size_t)n_comp * hd * 2);
    float *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, (size_t)n * 4), *seld = dev_copy(sel, (size_t)n * TOPK * 4);
    int32_t *nsd = dev_copy(ns, (size_t)n * 4);
    const hm_cuda_dsv4_attn a = {.raw = rd, .comp = ratio ? cd : NULL, .sinks = sd, .ff = ratio ? fd : NULL,
                                 .sel = seld, .n_sel = nsd, .cap = cap, .ratio = ratio, .window = WIN, .topk = TOPK,
                                 .n_head = n_head, .hd = hd, .n_rot = n_rot,
                                 .tscale = powf(theta, -2.0f / (float)n_rot),
                                 .max_keys = WIN + (ratio == 4 ? TOPK : ratio == 128 ? n_ctx / 128 + 1 : 0)};
    CK(hm_cuda_dsv4_attention(ctx, &a, qd, n, pd, &err));
    dev_get(o, qd, nq * 4);
    double e = 0;
    for (size_t i = 0; i < nq; i++) e = fmax(e, fabs(o[i] - ref[i]));
    printf("dsv4 attention hd %d, %d heads, ratio %d, %lld rows at %lld: max abs err %.3g\n", hd, n_head, ratio,
           (long long)n, (long long)p0, e);
    CHECKF(e <= ATTN_ABS, "dsv4 attention hd %d ratio %d: %.3g", hd, ratio, e);
    void *fr[] = {qd, rd, cd, sd, fd, pd, seld, nsd};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
    free(q), free(o), free(raw), free(comp), free(ref), free(sc), free(pos), free(sel), free(ns);
    free(raw_h), free(comp_h);
}

/* The compressor's steps: hm_cuda_dsv4_comp_write (the ring rows, exact) then hm_cuda_dsv4_compress
 * over a chunk of rows starting mid-block after earlier positions in the ring, for ratio 4 (the
 * overlapping pair of blocks) and 128, against a double reference of cpu_dsv4.c's compress_block
 * (softmax of the scores over the block's positions weighting the values, rmsnorm * norm, RoPE of
 * the tail at the block's first position); the f16 rows within 1e-3 of the largest value (one f16
 * rounding is 4.9e-4 relative). */
static void check_compress(int32_t r, int64_t p0, int64_t n) {
    enum { DIM = 64, ROT = 16, S = HM_DSV4_RING };
    const bool ov = r == 4;
    const int64_t w = (ov ? 2 : 1) * DIM, n_blk = (p0 + n) / r + 1;
    uint64_t sd_ = 41 + (uint64_t)r;
    float *kv = xmalloc((size_t)S * w * 4), *sc = xmalloc((size_t)S * w * 4), *a = xmalloc((size_t)n * w * 4);
    float *b = xmalloc((size_t)n * w * 4), *ape = xmalloc((size_t)r * w * 4), norm[DIM], ff[ROT / 2];
    int32_t *pos = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < S * w; i++) kv[i] = frand(&sd_), sc[i] = 2.0f * frand(&sd_); /* earlier positions */
    for (int64_t i = 0; i < n * w; i++) a[i] = frand(&sd_), b[i] = 2.0f * frand(&sd_);
    for (int64_t i = 0; i < r * w; i++) ape[i] = 0.3f * frand(&sd_);
    for (int i = 0; i < DIM; i++) norm[i] = 1.0f + 0.2f * frand(&sd_);
    for (int i = 0; i < ROT / 2; i++) ff[i] = 1.0f + 0.5f * (float)i;
    for (int64_t t = 0; t < n; t++) pos[t] = (int32_t)(p0 + t);
    /* the reference ring: the chunk's rows written over the earlier ones */
    float *rkv = xmalloc((size_t)S * w * 4), *rsc = xmalloc((size_t)S * w * 4);
    memcpy(rkv, kv, (size_t)S * w * 4);
    memcpy(rsc, sc, (size_t)S * w * 4);
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < w; e++) {
            rkv[(pos[t] % S) * w + e] = a[t * w + e];
            rsc[(pos[t] % S) * w + e] = b[t * w + e] + ape[(pos[t] % r) * w + e];
        }
    float *kvd = dev_copy(kv, (size_t)S * w * 4), *scd = dev_copy(sc, (size_t)S * w * 4);
    float *ad = dev_copy(a, (size_t)n * w * 4), *bd = dev_copy(b, (size_t)n * w * 4);
    float *aped = dev_copy(ape, (size_t)r * w * 4), *nd = dev_copy(norm, sizeof norm), *fd = dev_copy(ff, sizeof ff);
    int32_t *pd = dev_copy(pos, (size_t)n * 4);
    uint16_t *outd = dev_copy(NULL, (size_t)n_blk * DIM * 2), *out = xmalloc((size_t)n_blk * DIM * 2);
    const float theta = 160000.0f, ts = powf(theta, -2.0f / ROT);
    CK(hm_cuda_dsv4_comp_write(ctx, ad, bd, aped, 0, n, w, r, pd, kvd, scd, &err));
    CK(hm_cuda_dsv4_compress(ctx, kvd, scd, w, r, ov, DIM, nd, ROT, ts, fd, 1e-6f, pd, 0, n, outd, &err));
    float *gkv = xmalloc((size_t)S * w * 4), *gsc = xmalloc((size_t)S * w * 4);
    dev_get(gkv, kvd, (size_t)S * w * 4);
    dev_get(gsc, scd, (size_t)S * w * 4);
    dev_get(out, outd, (size_t)n_blk * DIM * 2);
    const bool ring_ok = memcmp(gkv, rkv, (size_t)S * w * 4) == 0 && memcmp(gsc, rsc, (size_t)S * w * 4) == 0;
    double worst = 0, mx = 1e-30;
    int n_done = 0;
    for (int64_t t = 0; t < n; t++) {
        if ((pos[t] + 1) % r) continue;
        const int64_t blk = pos[t] / r, start = blk * r;
        double o[DIM];
        for (int d = 0; d < DIM; d++) {
            double m = -INFINITY, sum = 0, acc = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int half = ov ? 0 : 1; half < 2; half++)
                    for (int64_t j = 0; j < r; j++) {
                        const int64_t p = (half == 0 ? start - r : start) + j, col = ov && half == 1 ? DIM + d : d;
                        if (p < 0) continue;
                        const double sv = rsc[(p % S) * w + col];
                        if (pass == 0) m = fmax(m, sv);
                        else sum += exp(sv - m), acc += exp(sv - m) * rkv[(p % S) * w + col];
                    }
            o[d] = acc / sum;
        }
        double ss = 0;
        for (int d = 0; d < DIM; d++) ss += o[d] * o[d];
        const double scl = 1.0 / sqrt(ss / DIM + 1e-6);
        for (int d = 0; d < DIM; d++) o[d] *= scl * norm[d];
        float thf = (float)start; /* the contract's angles: the CPU's float products */
        for (int i = 0; i < ROT / 2; i++, thf *= ts) {
            const double th = (double)(thf / ff[i]), c = cos(th), sn = sin(th);
            const double x0 = o[DIM - ROT + 2 * i], x1 = o[DIM - ROT + 2 * i + 1];
            o[DIM - ROT + 2 * i] = x0 * c - x1 * sn;
            o[DIM - ROT + 2 * i + 1] = x0 * sn + x1 * c;
        }
        for (int d = 0; d < DIM; d++) {
            worst = fmax(worst, fabs(hm_fp16_to_f32(out[blk * DIM + d]) - o[d]));
            mx = fmax(mx, fabs(o[d]));
        }
        n_done++;
    }
    printf("compressor ratio %d, rows %lld..%lld: ring %s, %d blocks, max err %.3g of max %.3g\n", r, (long long)p0,
           (long long)(p0 + n - 1), ring_ok ? "exact" : "WRONG", n_done, worst, mx);
    CHECKF(ring_ok, "comp_write ratio %d: the ring differs from the reference", r);
    CHECKF(n_done > 0 && worst <= 1e-3 * mx, "compress ratio %d: %.3g of %.3g", r, worst, mx);
    void *fr[] = {kvd, scd, ad, bd, aped, nd, fd, pd, outd};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
    free(kv), free(sc), free(a), free(b), free(ape), free(pos), free(rkv), free(rsc), free(out), free(gkv), free(gsc);
}

/* The grouped expert kernels with DeepSeek-V4's clamp (hm_cuda_moe_act_lim, host-routed, a decode
 * batch and a prefill batch of 12 tokens; hm_cuda_moe_dev_act_lim, device-routed with one expert
 * cold) on F32 units against a double reference of silu(min(g, L)) clamp(u, -L, L) (cpu_moe.c's
 * act_mul); the limit 0.5 clamps most rows. Bound KERN_REL (f32 math against double). */
static void check_moe_clamp(void) {
    enum { E = 256, F = 128, NX = 3, T = 12, K = 2 };
    const float L = 0.5f;
    uint64_t seed = 91;
    const size_t mw = (size_t)E * F;
    float *w = xmalloc(3 * NX * mw * 4), *x = xmalloc(T * E * 4), *o = xmalloc(T * E * 4);
    double *r = xmalloc(T * E * 8), *r_hot = xmalloc(T * E * 8), hbuf[F];
    for (size_t i = 0; i < 3 * NX * mw; i++) w[i] = 0.25f * frand(&seed);
    for (int i = 0; i < T * E; i++) x[i] = frand(&seed);
    int32_t ids[T * K];
    float wt[T * K];
    for (int t = 0; t < T; t++) { /* token t: experts t % 3 and (t + 1) % 3 */
        ids[t * K] = t % NX, ids[t * K + 1] = (t + 1) % NX;
        wt[t * K] = 0.6f, wt[t * K + 1] = 0.4f;
    }
    int n_clamped = 0;
    for (int i = 0; i < T * E; i++) r[i] = r_hot[i] = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int e = ids[t * K + j];
            const float *gw = w + (size_t)(3 * e) * mw, *uw = gw + mw, *dw = uw + mw;
            for (int f = 0; f < F; f++) {
                double gs = 0, us = 0;
                for (int c = 0; c < E; c++) {
                    gs += (double)gw[(size_t)f * E + c] * x[t * E + c];
                    us += (double)uw[(size_t)f * E + c] * x[t * E + c];
                }
                n_clamped += gs > L || fabs(us) > L;
                const double g = gs > L ? L : gs, u = us > L ? L : us < -L ? -L : us;
                hbuf[f] = g / (1.0 + exp(-g)) * u;
            }
            for (int i = 0; i < E; i++) {
                double a = 0;
                for (int f = 0; f < F; f++) a += (double)dw[(size_t)i * F + f] * hbuf[f];
                r[t * E + i] += wt[t * K + j] * a;
                if (e != 2) r_hot[t * E + i] += wt[t * K + j] * a;
            }
        }
    float *wd = dev_copy(w, 3 * NX * mw * 4), *xd = dev_copy(x, T * E * 4), *od = dev_copy(NULL, T * E * 4);
    const size_t scr = hm_cuda_moe_scratch_size(T, T * K, NX, F), scr2 = hm_cuda_moe_dev_scratch_size(T, K, F);
    void *sd = dev_copy(NULL, scr > scr2 ? scr : scr2);
    double e_host[2] = {0, 0};
    for (int b = 0; b < 2; b++) { /* a decode batch of 2 tokens, then the prefill batch of T */
        const int nt = b ? T : 2;
        int32_t toks[NX][T];
        float wts[NX][T];
        hm_cuda_moe_unit units[NX];
        for (int e = 0; e < NX; e++) {
            int n = 0;
            for (int t = 0; t < nt; t++)
                for (int j = 0; j < K; j++)
                    if (ids[t * K + j] == e) toks[e][n] = t, wts[e][n++] = wt[t * K + j];
            units[e] = (hm_cuda_moe_unit){.gate = wd + (size_t)(3 * e) * mw, .up = wd + (size_t)(3 * e + 1) * mw,
                                          .down = wd + (size_t)(3 * e + 2) * mw, .tok_host = toks[e],
                                          .w_host = wts[e], .n_tok = n};
        }
        CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
        CK(hm_cuda_moe_act_lim(ctx, units, NX, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_SILU, L, xd, nt, E, F, od, sd,
                               scr, &err));
        dev_get(o, od, (size_t)nt * E * 4);
        double md = 0, mr = 1e-30;
        for (int i = 0; i < nt * E; i++) md = fmax(md, fabs(o[i] - r[i])), mr = fmax(mr, fabs(r[i]));
        e_host[b] = md / mr;
    }
    hm_cuda_moe_slot slots[NX];
    for (int e = 0; e < NX; e++)
        slots[e] = e == 2 ? (hm_cuda_moe_slot){.gate = NULL}
                          : (hm_cuda_moe_slot){.gate = wd + (size_t)(3 * e) * mw, .up = wd + (size_t)(3 * e + 1) * mw,
                                               .down = wd + (size_t)(3 * e + 2) * mw};
    hm_cuda_moe_slot *sld = dev_copy(slots, sizeof slots);
    int32_t *idd = dev_copy(ids, sizeof ids);
    float *wtd = dev_copy(wt, sizeof wt);
    CK(hm_cuda_memset(ctx, od, 0, T * E * 4, &err));
    CK(hm_cuda_moe_dev_act_lim(ctx, sld, HM_TYPE_F32, HM_TYPE_F32, HM_CUDA_ACT_SILU, L, idd, wtd, K, xd, 2, E, F, od,
                               sd, scr2, &err));
    dev_get(o, od, 2 * E * 4);
    double md = 0, mr = 1e-30;
    for (int i = 0; i < 2 * E; i++) md = fmax(md, fabs(o[i] - r_hot[i])), mr = fmax(mr, fabs(r_hot[i]));
    const double e_dev = md / mr;
    printf("experts' clamp (limit %.2g, %d of %d gate/up rows clamped): host-routed decode %.3g, prefill %.3g, "
           "device-routed %.3g (max rel err)\n", (double)L, n_clamped, T * K * F, e_host[0], e_host[1], e_dev);
    CHECKF(n_clamped > T * K * F / 4, "the clamp test clamps too few rows (%d)", n_clamped);
    CHECKF(e_host[0] <= KERN_REL && e_host[1] <= KERN_REL && e_dev <= KERN_REL,
           "experts' clamp: host-routed %.3g / %.3g, device-routed %.3g", e_host[0], e_host[1], e_dev);
    void *fr[] = {wd, xd, od, sd, sld, idd, wtd};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) hm_cuda_free(ctx, fr[i]);
    free(w), free(x), free(o), free(r), free(r_hot);
}

/* ---- the model ---- */

#define SP 150  /* the long runs' prompt: past a ratio-128 block, 37 ratio-4 blocks (top-k live) */
#define SDEC 16
#define SSTEP (1 + SDEC)
#define SP_SHORT 20 /* the short runs': positions < 36, every ratio-4 block visible (no top-k) */
#define SDEC_SHORT 14
#define NCTX 256

static hm_model *open_gpu(const char *path, const hm_placement_opts *po, bool exact, hm_err *e) {
    hm_model_opts mo;
    memset(&mo, 0, sizeof mo);
    mo.placement = po;
    hm_model *m = NULL;
    if (exact) setenv("HOTMOE_CUDA_EXACT", "1", 1); /* read when the device context opens */
    const hm_status st = hm_model_open(&m, path, &mo, e);
    if (exact) unsetenv("HOTMOE_CUDA_EXACT");
    return st == HM_OK ? m : NULL;
}

/* The placements: -ngl 99, --cpu-moe, a third of the units by --vram-budget, --n-cpu-moe 3. */
enum { PL_ALL, PL_CPU_MOE, PL_BUDGET, PL_NCPUMOE, PL_COUNT };
static const char *const pl_name[PL_COUNT] = {"-ngl 99", "--cpu-moe", "--vram-budget 1/3", "--n-cpu-moe 3"};

static void placement(int p, uint64_t unit_bytes, uint64_t n_units, hm_placement_opts *po) {
    hm_placement_opts_default(po);
    po->n_gpu_layers = 99;
    po->n_ctx = NCTX;
    if (p == PL_CPU_MOE) po->cpu_moe = true;
    if (p == PL_BUDGET) po->vram_budget = (int64_t)(unit_bytes * (n_units / 3));
    if (p == PL_NCPUMOE) po->n_cpu_moe = 3;
}

/* On a fresh session (n_ubatch ub): the prompt and SDEC decode steps (logits into full, [SSTEP][V]),
 * back to SP + 2 (within the current 128-block) and the tokens from there again, one by one (logits
 * into out, [SDEC - 2][V]: out[i] is full[i + 3]'s step). Then back to 100 must be refused naming the
 * compressed state. */
static hm_status run_trim(hm_model *m, int32_t ub, const int32_t *toks, float *full, float *out, int32_t V,
                          hm_err *e) {
    hm_session_opts so;
    hm_session_opts_default(&so);
    so.n_ctx = NCTX;
    so.n_ubatch = ub;
    so.n_threads = 4;
    hm_session *s = NULL;
    hm_status st = hm_session_open(&s, m, &so, e);
    if (st != HM_OK) return st;
    int32_t t[SP + SDEC];
    memcpy(t, toks, sizeof t);
    if ((st = gpu_compare_run(s, t, SP, SDEC, false, full, V, e)) != HM_OK) goto out;
    if ((st = hm_session_trim(s, SP + 2, e)) != HM_OK) goto out;
    for (int i = 2; i < SDEC; i++) { /* step i + 1 of full: token toks[SP + i] at position SP + i */
        const float *lg = NULL;
        if ((st = hm_session_eval(s, toks + SP + i, 1, false, &lg, e)) != HM_OK) goto out;
        memcpy(out + (size_t)(i - 2) * (size_t)V, lg, (size_t)V * sizeof(float));
    }
    st = hm_session_trim(s, 100, e);
    CHECKF(st == HM_ERR_UNSUPPORTED && strstr(e->msg, "compressed"), "trim to 100: status %d (%s)", st, e->msg);
    st = HM_OK;
out:
    hm_session_close(s);
    return st;
}

static double max_rel_steps(const float *a, const float *b, int n_step, int32_t V) {
    double w = 0;
    for (int i = 0; i < n_step; i++) w = fmax(w, max_rel(a + (size_t)i * V, b + (size_t)i * V, (size_t)V));
    return w;
}

/* One synth file through every placement. long_run: SP + SDEC positions with the GPU's matmuls exact
 * (HOTMOE_CUDA_EXACT=1, so that no near-tie of the indexer's scores can flip between the engines:
 * every step NMSE_EXACT), n_ubatch 256, 64 and 8, then the graph and trim checks; else SP_SHORT +
 * SDEC_SHORT positions (no top-k to flip) on the default kernels: n_ubatch 64 (the prompt on the
 * tensor cores) and 8, bounds by the numerics (F32 bf16 prefill NMSE_BF16, decode NMSE_EXACT; Q8_0
 * NMSE_Q8). */
static void run_synth(const char *type, bool quant, bool long_run) {
    char path[] = "/tmp/hm_ds4gpu_XXXXXX";
    if (!gpu_compare_synth(path, "deepseek4", "tiny", type, 1)) return;
    hm_err e = {{0}};
    int32_t V = 0, n_layer = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, type, &V, &n_layer, &K, &unit_bytes, &n_units, &e);
    if (!m) {
        unlink(path);
        return;
    }
    const int32_t sp = long_run ? SP : SP_SHORT, sdec = long_run ? SDEC : SDEC_SHORT, nst = 1 + sdec;
    printf("deepseek4 tiny %s (%s run: %d + %d positions): %d layers, vocab %d, k %d, %llu units of %llu bytes\n",
           type, long_run ? "long, exact" : "short", sp, sdec, n_layer, V, K, (unsigned long long)n_units,
           (unsigned long long)unit_bytes);
    const int32_t ubs_long[3] = {256, 64, 8}, ubs_short[2] = {64, 8};
    const int nub = long_run ? 3 : 2;
    const int32_t *ubs = long_run ? ubs_long : ubs_short;
    int32_t toks[SP + SDEC], dummy[1];
    gpu_compare_prompts(0x9e3779b97f4a7c15ull, V, toks, sp, dummy, 0);
    const size_t sz = (size_t)SSTEP * (size_t)V * sizeof(float);
    float *cpu[3], *gpu = xmalloc(sz), *graph = xmalloc(sz), *full = xmalloc(sz), *trim = xmalloc(sz);
    float *cpu_full = xmalloc(sz), *cpu_trim = xmalloc(sz);
    for (int i = 0; i < nub; i++) {
        cpu[i] = xmalloc(sz);
        CHECKF(gpu_compare_run_fresh(m, NCTX, ubs[i], toks, sp, sdec, i == 0, cpu[i], V, &e) == HM_OK,
               "%s CPU run n_ubatch %d: %s", type, ubs[i], e.msg);
    }
    if (long_run)
        CHECKF(run_trim(m, 64, toks, cpu_full, cpu_trim, V, &e) == HM_OK, "%s CPU trim run: %s", type, e.msg);
    hm_model_close(m);
    for (int p = 0; p < PL_COUNT; p++) {
        hm_placement_opts po;
        placement(p, unit_bytes, n_units, &po);
        m = open_gpu(path, &po, long_run, &e);
        CHECKF(m != NULL, "%s %s: open: %s", type, pl_name[p], e.msg);
        if (!m) continue;
        for (int i = 0; i < nub; i++) {
            char what[160];
            snprintf(what, sizeof what, "deepseek4-tiny %s %s n_ubatch %d%s", type, pl_name[p], ubs[i],
                     long_run ? " (exact)" : "");
            hm_status st = gpu_compare_run_fresh(m, NCTX, ubs[i], toks, sp, sdec, false, gpu, V, &e);
            CHECKF(st == HM_OK, "%s: %s", what, e.msg);
            if (st != HM_OK) continue;
            /* n_ubatch 8: everything on the decode path (exact f32 matvecs); larger: the prompt on
             * the tensor cores unless exact, decode after */
            const double bound = quant ? NMSE_Q8 : (long_run || ubs[i] == 8 ? NMSE_EXACT : NMSE_BF16);
            const double w = gpu_compare_logits(what, gpu, cpu[i], nst, V, bound);
            printf("%s: worst NMSE %.3g (bound %g)\n", what, w, bound);
            if (p == PL_ALL && ubs[i] == 8) memcpy(graph, gpu, sz);
        }
        if (p == PL_ALL && long_run) {
            /* the per-launch decode must be the graph's, byte for byte */
            setenv("HOTMOE_CUDA_GRAPH", "0", 1);
            hm_status st = gpu_compare_run_fresh(m, NCTX, 8, toks, sp, sdec, false, gpu, V, &e);
            unsetenv("HOTMOE_CUDA_GRAPH");
            CHECKF(st == HM_OK, "%s per-launch run: %s", type, e.msg);
            if (st == HM_OK) {
                const double d = max_rel_steps(gpu, graph, nst, V);
                printf("deepseek4-tiny %s -ngl 99: per-launch vs graph decode, max rel difference %.3g\n", type, d);
                CHECKF(memcmp(gpu, graph, (size_t)nst * V * sizeof(float)) == 0,
                       "%s: per-launch decode differs from the graph's (max rel %.3g)", type, d);
            }
            /* the state: back within the block and on again */
            st = run_trim(m, 64, toks, full, trim, V, &e);
            CHECKF(st == HM_OK, "%s GPU trim run: %s", type, e.msg);
            if (st == HM_OK) {
                const double d = max_rel_steps(trim, full + 3 * (size_t)V, SDEC - 2, V);
                printf("deepseek4-tiny %s -ngl 99: trim to %d and on, max rel difference to the uninterrupted run "
                       "%.3g\n", type, SP + 2, d);
                CHECKF(d <= BOUND, "%s: after the trim %.3g > %g", type, d, BOUND);
                const double w = gpu_compare_logits("deepseek4-tiny trimmed vs CPU trimmed", trim, cpu_trim, SDEC - 2,
                                                    V, quant ? NMSE_Q8 : NMSE_EXACT);
                printf("deepseek4-tiny %s -ngl 99: trimmed run vs the CPU's trimmed run, worst NMSE %.3g\n", type, w);
            }
        }
        hm_model_close(m);
    }
    for (int i = 0; i < nub; i++) free(cpu[i]);
    free(gpu), free(graph), free(full), free(trim), free(cpu_full), free(cpu_trim);
    unlink(path);
}

/* HM_DS4_REAL_LAYERS=N: the deepseek-v4-flash shape, N layers, fast q4_k_m experts. */
static void run_real(int n_layer) {
    char path[] = "/tmp/hm_ds4real_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    hm_synth_opts so = {.arch = "deepseek4", .preset = "deepseek-v4-flash", .n_layer = n_layer, .type = "q4_k_m",
                        .seed = 1, .out_path = path, .n_threads = 0, .fast_experts = true};
    hm_err e = {{0}};
    hm_status st = hm_synth(&so, &e);
    CHECKF(st == HM_OK, "synth deepseek-v4-flash %d layers: %s", n_layer, e.msg);
    if (st != HM_OK) {
        unlink(path);
        return;
    }
    int32_t V = 0, nl = 0, K = 0;
    uint64_t unit_bytes = 0, n_units = 0;
    hm_model *m = gpu_compare_open_cpu(path, "deepseek-v4-flash", &V, &nl, &K, &unit_bytes, &n_units, &e);
    if (!m) {
        unlink(path);
        return;
    }
    enum { RP = 140, RD = 6 };
    int32_t toks[RP + RD], dummy[1];
    gpu_compare_prompts(0x51ed270b27e1ull, V, toks, RP, dummy, 0);
    const size_t sz = (size_t)(1 + RD) * (size_t)V * sizeof(float);
    float *cpu = xmalloc(sz), *gpu = xmalloc(sz);
    CHECKF(gpu_compare_run_fresh(m, NCTX, 64, toks, RP, RD, true, cpu, V, &e) == HM_OK, "real CPU run: %s", e.msg);
    hm_model_close(m);
    for (int p = 0; p < 2; p++) {
        hm_placement_opts po;
        hm_placement_opts_default(&po);
        po.n_gpu_layers = 99;
        po.n_ctx = NCTX;
        if (p == 1) po.n_cpu_moe = 2;
        m = open_gpu(path, &po, false, &e);
        CHECKF(m != NULL, "real %s: open: %s", p ? "--n-cpu-moe 2" : "-ngl 99", e.msg);
        if (!m) continue;
        char what[128];
        snprintf(what, sizeof what, "deepseek-v4-flash %d layers q4_k_m %s", n_layer, p ? "--n-cpu-moe 2" : "-ngl 99");
        st = gpu_compare_run_fresh(m, NCTX, 64, toks, RP, RD, false, gpu, V, &e);
        CHECKF(st == HM_OK, "%s: %s", what, e.msg);
        if (st == HM_OK) printf("%s: worst NMSE %.3g\n", what, gpu_compare_logits(what, gpu, cpu, 1 + RD, V, NMSE_Q8));
        hm_model_close(m);
    }
    free(cpu), free(gpu);
    unlink(path);
}

int main(void) {
    int rc = cuda_test_open("no host part: test_dsv4_cuda_order holds the kernels' orders");
    if (rc >= 0) return rc;
    check_hc();
    check_moe_clamp();
    check_rope();
    check_compress(4, 150, 37);   /* 9 blocks end in the chunk, the first reads the ring's rows */
    check_compress(128, 200, 100); /* block 1 ends at 255 */
    check_compress(4, 0, 9);      /* block 0 has no previous block */
    check_index();
    check_attention(64, 8, 4, 1, 100);
    check_attention(64, 8, 4, 20, 0);
    check_attention(64, 8, 128, 3, 300);
    check_attention(64, 8, 0, 5, 7);
    check_attention(512, 64, 4, 2, 600);
    check_attention(512, 64, 128, 9, 250);
    hm_cuda_close(ctx);
    run_synth("f32", false, true);
    run_synth("f32", false, false);
    run_synth("q8_0", true, false);
    const char *real = getenv("HM_DS4_REAL_LAYERS");
    if (real && atoi(real) > 0) run_real(atoi(real));
    return test_done();
}
