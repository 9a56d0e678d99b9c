/* cmd_synth.c - `hotmoe synth`: flags -> hm_synth, and the progress display on stderr (a live
 * bar when stderr is a terminal, else a line every 10 %). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Each arch's main real shape: its preset when --arch comes without --preset (qwen3moe, the
 * default arch, keeps asking: its presets are shapes of several models). */
static const struct {
    const char *arch, *preset;
} default_preset[] = {
    {"qwen35moe", "qwen36-35b-a3b"}, {"qwen3next", "qwen3-next-80b-a3b"}, {"gemma4", "gemma4-26b-a4b"},
    {"deepseek2", "deepseek-v2-lite"}, {"deepseek4", "deepseek-v4-flash"}, {"glm4moe", "glm4.5-air"},
    {"olmoe", "olmoe-1b-7b"},          {"llama", "mixtral-8x7b"},            {"gpt-oss", "gpt-oss-20b"},
};

static void usage(FILE *f) {
    fputs("usage: hotmoe synth [--arch ARCH] [--preset NAME] --type TYPE -o FILE.gguf [options]\n"
          "\n"
          "Write a random-weight MoE model with real tensor names, shapes and GGUF keys (llama.cpp\n"
          "loads it): for tests, benchmarks and demos without downloading a model.\n"
          "\n"
          "  --arch ARCH             qwen3moe (default), qwen35moe (presets qwen36-35b-a3b; tiny),\n"
          "                          qwen3next (presets qwen3-next-80b-a3b: 48 layers, 512 experts\n"
          "                          k 10 + a shared expert; tiny: a few MB), gemma4 (presets\n"
          "                          gemma4-26b-a4b: 30 layers, 128 experts k 8, vocab 262144;\n"
          "                          gemma4-tiny: a few MB), deepseek2 (presets\n"
          "                          deepseek-v2-lite, the default: 27 layers, MLA kv_lora 512,\n"
          "                          64 experts k 6 + 2 shared, 1 dense layer, YaRN, vocab 102400;\n"
          "                          deepseek-v3: 61 layers, q LoRA 1536, 256 experts k 8 in 8 groups;\n"
          "                          deepseek2-tiny: a few MB, q LoRA, sigmoid + bias + groups),\n"
          "                          deepseek4 (presets deepseek-v4-flash: 43 layers, 256 experts\n"
          "                          k 6 + 1 shared, n_ff 2048; tiny: a few MB, every V4 feature on),\n"
          "                          glm4moe (glm4.5-air, glm4moe-tiny), olmoe (olmoe-1b-7b,\n"
          "                          olmoe-tiny), llama with experts (mixtral-8x7b, mixtral-tiny) or\n"
          "                          gpt-oss (presets gpt-oss-20b, the default: 24 layers, 32\n"
          "                          experts k 4, n_embd 2880, vocab 201088; gpt-oss-120b: 36\n"
          "                          layers, 128 experts; gpt-oss-tiny (or tiny): a few MB; --type\n"
          "                          mxfp4 as the real files, or a pure type); the tiny presets\n"
          "                          switch every feature of the arch on (docs/SYNTH.md); without\n"
          "                          --preset an arch other than qwen3moe takes its main real shape\n"
          "                          (the first preset named above; llama: mixtral-8x7b, glm4moe:\n"
          "                          glm4.5-air, olmoe: olmoe-1b-7b)\n"
          "  --preset NAME           qwen3-30b-a3b: Qwen3-30B-A3B's shapes (48 layers, 128 experts,\n"
          "                          k 8, vocab 151936; 17 GB at q4_k_m); tiny: a few MB;\n"
          "                          qwen36-geom: Qwen3.6-35B-A3B's expert geometry (40 layers,\n"
          "                          256 experts of n_ff 512, k 8) on qwen3moe\n"
          "  --layers N              override the preset's depth\n"
          "  --nextn N               qwen35moe, qwen3next: 1 adds the multi-token-prediction\n"
          "                          block after the layers as llama.cpp's converter writes it\n"
          "                          (for --spec-type draft-mtp)\n"
          "  --type TYPE             q4_k_m (llama.cpp's Q4_K_M mix), q8_0, f16, f32, bf16, q4_0,\n"
          "                          q4_1, q5_1, iq4_nl, q4_k, q5_k, q6_k, iq4_xs (pure), mxfp4\n"
          "                          (experts MXFP4, rest Q8_0), q2_k, q3_k_m, iq2_m, iq2_xxs,\n"
          "                          iq1_s, iq3_xxs (llama-quantize's mixes, every arch), iq2_xs,\n"
          "                          iq2_s, iq3_s, iq1_m (pure), ud-iq1_s, ud-iq2_m, ud-q2_k_xl\n"
          "                          (unsloth-dynamic-like: routed experts low, the rest Q5_K/Q6_K;\n"
          "                          docs/SYNTH.md)\n"
          "  --imatrix FILE          llama.cpp importance matrix (llama-imatrix's GGUF or legacy\n"
          "                          .dat): quantise as llama-quantize --imatrix does (same bytes)\n"
          "  --seed S                random seed (default 1); same options + seed = same bytes\n"
          "  --routing-profile P.json  build the profile's per-layer expert popularity into the\n"
          "                          weights: every engine then routes with that skew (profile\n"
          "                          n_expert = the preset's; layers mapped proportionally;\n"
          "                          docs/SYNTH.md)\n"
          "  --fast-experts          for I/O benchmarks: expert values are random blocks, not\n"
          "                          quantised Gaussians (same types, shapes and magnitude; the\n"
          "                          rest of the file unchanged); disk-bound, minutes for 40 GB\n"
          "  --tokenizer FILE        a Hugging Face tokenizer.json to embed (default: a small\n"
          "                          built-in byte-level BPE vocabulary)\n"
          "  --tokenizer-config FILE its tokenizer_config.json (special tokens, chat template)\n"
          "  -t, --threads N         quantisation threads (default: all CPUs)\n"
          "  -q, --quiet             no progress display\n"
          "  -o, --output FILE       where to write (atomically: FILE.tmp, then rename)\n"
          "  --split-max-size N(M|G) write llama-gguf-split's layout: FILE-00001-of-0000N.gguf ...,\n"
          "                          a new file when its tensor bytes would pass N (decimal MB/GB as\n"
          "                          llama-gguf-split reads them; or a size like 512MiB); FILE must\n"
          "                          end in .gguf, and the model loads from the first file's name\n"
          "  --split-max-tensors N   the same layout with N tensors a file\n"
          "  -h, --help              this text\n",
          f);
}

typedef struct progress_state {
    bool tty;
    int last_decile;
    double last_draw;
} progress_state;

/* On SIGINT/SIGTERM remove the half-written OUT.tmp (the GGUF writer's temporary name) before
 * dying, so an interrupted 17 GB run leaves nothing behind. unlink and _exit are
 * async-signal-safe; the name is built before the handler is installed. */
static char tmp_path[4096];

static void on_signal(int sig) {
    if (tmp_path[0]) unlink(tmp_path);
    _exit(128 + sig);
}

static void show_progress(void *ud, const hm_synth_progress *p) {
    progress_state *s = ud;
    double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 1.0;
    double mbs = p->elapsed_s > 0 ? (double)p->bytes_done / 1048576.0 / p->elapsed_s : 0;
    double eta = frac > 0 ? p->elapsed_s * (1.0 - frac) / frac : 0;
    bool last = p->bytes_done >= p->bytes_total;
    if (s->tty) {
        if (!last && p->elapsed_s - s->last_draw < 0.1) return;
        s->last_draw = p->elapsed_s;
        char bar[31];
        int fill = (int)(frac * 30.0);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r\033[K[%s] %5.1f%% %-28.28s %7.0f MB/s ETA %3d:%02d", bar, 100.0 * frac, p->tensor, mbs,
                (int)eta / 60, (int)eta % 60);
        if (last) fputc('\n', stderr);
    } else {
        int decile = (int)(frac * 10.0);
        if (decile == s->last_decile && !last && p->elapsed_s - s->last_draw < 30.0) return;
        s->last_decile = decile;
        s->last_draw = p->elapsed_s;
        fprintf(stderr, "synth: %3.0f%% %s (%" PRIu64 "/%" PRIu64 " MB, %.0f MB/s, ETA %.0f s)\n", 100.0 * frac,
                p->tensor, p->bytes_done >> 20, p->bytes_total >> 20, mbs, eta);
    }
}

static bool parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int hm_cmd_synth(int argc, char **argv) {
    hm_synth_opts o = {.arch = "qwen3moe", .seed = 1};
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (hm_cli_is_help(a)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            quiet = true;
            continue;
        }
        if (strcmp(a, "--fast-experts") == 0) {
            o.fast_experts = true;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "synth: unexpected argument '%s' (see `hotmoe synth --help`)\n", a);
            return 2;
        }
        static const char *const with_value[] = {"--arch", "--preset", "--layers", "--type", "--seed", "--tokenizer",
                                                 "--tokenizer-config", "-t", "--threads", "-o", "--output",
                                                 "--routing-profile", "--split-max-size", "--split-max-tensors",
                                                 "--imatrix", "--nextn"};
        bool known = false;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= strcmp(a, with_value[k]) == 0;
        if (!known) {
            fprintf(stderr, "synth: unknown option '%s' (see `hotmoe synth --help`)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "synth: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long long n;
        if (strcmp(a, "--arch") == 0) o.arch = v;
        else if (strcmp(a, "--preset") == 0) o.preset = v;
        else if (strcmp(a, "--type") == 0) o.type = v;
        else if (strcmp(a, "--tokenizer") == 0) o.tokenizer_json = v;
        else if (strcmp(a, "--tokenizer-config") == 0) o.tokenizer_config = v;
        else if (strcmp(a, "--routing-profile") == 0) o.routing_profile = v;
        else if (strcmp(a, "--imatrix") == 0) o.imatrix = v;
        else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) o.out_path = v;
        else if (strcmp(a, "--split-max-tensors") == 0) {
            if (!parse_int(v, 1, 1000000, &n)) {
                fprintf(stderr, "synth: --split-max-tensors '%s' is not a number in [1, 1000000]\n", v);
                return 2;
            }
            o.split_max_tensors = (int32_t)n;
        } else if (strcmp(a, "--split-max-size") == 0) {
            /* llama-gguf-split's N followed by M or G is decimal (1000^2, 1000^3) */
            char *end;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            int64_t b;
            hm_err e2;
            if (!errno && end != v && x > 0 && (!strcmp(end, "M") || !strcmp(end, "G")) && x < 1000000000LL)
                o.split_max_bytes = (uint64_t)x * (*end == 'M' ? 1000000ull : 1000000000ull);
            else if (hm_parse_size(v, &b, &e2) == HM_OK && b > 0)
                o.split_max_bytes = (uint64_t)b;
            else {
                fprintf(stderr, "synth: --split-max-size '%s' is not a size (e.g. 500M, 2G, 512MiB)\n", v);
                return 2;
            }
        }
        else if (strcmp(a, "--nextn") == 0) {
            if (!parse_int(v, 0, 1, &n)) {
                fprintf(stderr, "synth: --nextn '%s' is not 0 or 1\n", v);
                return 2;
            }
            o.n_nextn = (int32_t)n;
        } else if (strcmp(a, "--layers") == 0) {
            if (!parse_int(v, 1, 1000, &n)) {
                fprintf(stderr, "synth: --layers '%s' is not a number in [1, 1000]\n", v);
                return 2;
            }
            o.n_layer = (int32_t)n;
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 0);
            if (errno || end == v || *end || v[0] == '-') {
                fprintf(stderr, "synth: --seed '%s' is not a non-negative integer\n", v);
                return 2;
            }
            o.seed = s;
        } else { /* -t, --threads */
            if (!parse_int(v, 1, 64, &n)) {
                fprintf(stderr, "synth: --threads '%s' is not a number in [1, 64]\n", v);
                return 2;
            }
            o.n_threads = (int32_t)n;
        }
    }
    for (size_t i = 0; !o.preset && o.arch && i < sizeof default_preset / sizeof default_preset[0]; i++)
        if (strcmp(o.arch, default_preset[i].arch) == 0) o.preset = default_preset[i].preset;
    if (!o.preset || !o.type || !o.out_path) {
        fprintf(stderr, "synth: %s is required\n\n", !o.preset ? "--preset" : !o.type ? "--type" : "-o FILE");
        usage(stderr);
        return 2;
    }
    progress_state ps = {.tty = isatty(STDERR_FILENO) != 0, .last_decile = -1, .last_draw = -1.0};
    if (!quiet) {
        o.progress = show_progress;
        o.progress_ud = &ps;
    }
    /* the writer's temporary: beside the file a symlink -o points to, as the writer resolves it */
    char *real = realpath(o.out_path, NULL);
    if ((size_t)snprintf(tmp_path, sizeof tmp_path, "%s.tmp", real ? real : o.out_path) >= sizeof tmp_path)
        tmp_path[0] = 0;
    free(real);
    hm_cli_on_stop_signals(on_signal);
    hm_err err = {{0}};
    hm_status st = hm_synth(&o, &err);
    if (st != HM_OK) {
        if (ps.tty && !quiet) fputc('\n', stderr);
        fprintf(stderr, "synth: %s\n", err.msg[0] ? err.msg : hm_status_name(st));
        return st == HM_ERR_ARG ? 2 : 1;
    }
    if (!quiet && (o.split_max_bytes || o.split_max_tensors))
        fprintf(stderr, "synth: wrote %.*s-00001-of-*.gguf (llama-gguf-split's layout; load it by the first file's name)\n",
                (int)strlen(o.out_path) - 5, o.out_path);
    else if (!quiet) fprintf(stderr, "synth: wrote %s\n", o.out_path);
    return 0;
}
