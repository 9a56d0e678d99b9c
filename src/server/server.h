/* server.h - the internals of `hotmoe serve`, shared by the files of src/server/.
 *
 *   srv_http.c   libmicrohttpd daemon: routing, auth, request bodies, static page, waiting for tasks,
 *                connection limits and the header/body deadlines (a watchdog thread)
 *   srv_api.c    the OpenAI / llama-server endpoints: parse a request into a task, format answers
 *   srv_sched.c  the slot scheduler: the one engine thread that steps every active slot
 *   srv_store.c  the expert store's view (/experts, hotmoe_expert_* metrics, profile, policy)
 *   srv_util.c   byte buffers, error objects, client text made safe for messages, clocks
 *
 * Threads: libmicrohttpd runs one thread per connection. A connection thread parses and
 * tokenizes its request, builds an srv_task, submits it and then only waits on the task's
 * condition variable (polling its socket so a client that goes away cancels at once). The engine
 * thread is the only one that touches sessions, samplers and the model; it runs rounds: every
 * active slot advances by one step (a prefill chunk or one decoded token) per round.
 *
 * Locking: one mutex (srv_sched.mu) guards the queue, every task's shared fields (marked below)
 * and the slots' published state. The engine never holds it while evaluating.
 *
 * Task lifetime: a task is reference-counted (the connection and, once submitted, the
 * scheduler); the last srv_task_release frees it. */
#ifndef HM_SERVER_H
#define HM_SERVER_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hotmoe_tools.h"

/* ---- srv_util.c ---- */

typedef struct srv_buf {
    char *p;   /* NUL-terminated when len > 0 */
    size_t len, cap;
} srv_buf;

bool srv_buf_add(srv_buf *b, const char *s, size_t n); /* false when out of memory */
bool srv_buf_str(srv_buf *b, const char *s);
bool srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_consume(srv_buf *b, size_t n); /* drop the first n bytes */
void srv_buf_free(srv_buf *b);

double srv_now(void);          /* monotonic seconds */
int64_t srv_unix_time(void);   /* wall clock seconds */

/* Client text in messages. srv_utf8_char: the length of the well-formed UTF-8 character at s
 * (1..4), 0 when the bytes there are not one (invalid, overlong, surrogate, cut off). */
size_t srv_utf8_char(const char *s, size_t n);
/* Render s[0..n) into out[cap] (NUL-terminated, valid UTF-8, returns its length) for an error
 * message or a log line: characters as they are, control bytes and bytes that are not UTF-8 as
 * \xNN; at most max input bytes; a longer text is cut on a character boundary and ends "...". */
size_t srv_text(char *out, size_t cap, const char *s, size_t n, size_t max);
/* Drop an incomplete character at the end of s (what a truncating snprintf leaves). */
void srv_utf8_trim(char *s);

/* An OpenAI error object {"error":{"message","type","param","code"}} (new reference). message
 * may hold any bytes: what is not UTF-8 is escaped as \xNN. type:
 * "invalid_request_error", "authentication_error", "not_found_error", "server_error", ...;
 * param and code may be NULL (JSON null). */
json_t *srv_error_json(const char *message, const char *type, const char *param, const char *code);

/* ---- srv_sched.c ---- */

typedef enum srv_task_kind { SRV_TASK_COMPLETION = 0, SRV_TASK_CHAT = 1 } srv_task_kind;

typedef enum srv_finish {
    SRV_FINISH_NONE = 0, /* still running */
    SRV_FINISH_STOP,     /* end-of-generation token or a stop string */
    SRV_FINISH_LENGTH,   /* max_tokens or the context is full */
    SRV_FINISH_CANCEL,   /* the client went away or the server is stopping */
    SRV_FINISH_ERROR,    /* the engine failed; err says why */
} srv_finish;

const char *srv_finish_name(srv_finish f); /* "stop", "length", ... */

#define SRV_MAX_STOP 8

typedef struct srv_task {
    /* The request: written by the connection thread before submit, read-only afterwards. */
    srv_task_kind kind;
    bool stream;
    bool include_usage;   /* stream_options.include_usage: a last chunk with usage, no choices */
    bool ignore_eos;      /* llama-server's ignore_eos: end-of-generation tokens are never sampled */
    int32_t *prompt;      /* [n_prompt] owned */
    int32_t n_prompt;
    int32_t max_tokens;   /* >= 1, already clipped to the context */
    hm_sampler_opts sampling;
    int32_t spec_n_max, spec_n_min; /* llama-server's speculative.n_max / .n_min; -1: the server's */
    float spec_p_min;     /* speculative.p_min; < 0: the server's */
    char *stop[SRV_MAX_STOP]; /* owned */
    int n_stop;
    char id[64];          /* "cmpl-..." / "chatcmpl-..." */
    int64_t created;
    uint64_t seq;         /* submit order, for /slots */

    /* Shared, under srv_sched.mu. */
    pthread_cond_t cv;    /* signalled when out/text grow or done becomes true */
    int refs;
    bool cancelled;       /* the connection gave up: the engine frees the slot */
    bool done;            /* the engine is finished with it: finish is set */
    srv_finish finish;
    srv_buf out;          /* stream: SSE bytes not yet sent to the client */
    srv_buf text;         /* the completion text released so far (stop strings cut; for a chat whose
                             template marks reasoning, the content part only) */
    srv_buf reasoning;    /* that reasoning (gpt-oss's analysis channel): message.reasoning_content */
    hm_chat_reply *reply; /* owned; splits the text into content and reasoning; NULL = all content */
    int32_t n_gen;        /* tokens generated (usage.completion_tokens) */
    int32_t n_cached;     /* prompt tokens reused from the slot's cache */
    int slot;             /* -1 while queued */
    double t_prompt_s, t_gen_s;
    char err[256];
    struct srv_task *next; /* queue link */
} srv_task;

typedef struct srv_slot srv_slot; /* engine-private, srv_sched.c */

/* A function run on the engine thread between rounds (srv_sched_call). */
typedef void (*srv_engine_fn)(void *arg);

typedef struct srv_stats {
    uint64_t n_prompt_tokens;   /* evaluated (cache hits not counted) */
    uint64_t n_predicted;       /* generated tokens */
    double t_prompt_s, t_predicted_s;
    uint64_t n_requests_ok, n_requests_cancelled, n_requests_failed;
    uint64_t n_rounds;
    uint64_t n_batched;         /* rounds whose slots went through one hm_batch_eval (>= 2 slots) */
    uint64_t spec_drafted, spec_accepted, spec_steps; /* speculative decoding, all slots */
    uint64_t n_prompt_tokens_pp; /* of n_prompt_tokens: evaluated by the prompt-processing copy */
    uint64_t n_requests_pp;     /* requests whose prompt went through it */
    double rate_predicted;      /* generated tokens per second over the last seconds */
    double rate_t[16];          /* ring of (time, n_predicted) samples for the rate */
    uint64_t rate_n[16];
    int rate_i;
} srv_stats;

typedef struct srv_sched {
    hm_model *model;           /* borrowed */
    const hm_tokenizer *tok;   /* borrowed */
    const char *model_id;      /* borrowed */
    int32_t n_ctx, n_vocab;
    int32_t *eog;              /* [n_eog] the vocabulary's end-of-generation ids */
    int32_t n_eog;
    int n_slots;
    srv_slot *slots;           /* [n_slots] */
    hm_spec_opts spec;         /* type none: no speculation; stop_ids borrowed from eog */

    pthread_mutex_t mu;
    pthread_cond_t cv;         /* wakes the engine thread */
    srv_task *q_head, *q_tail; /* waiting for a slot */
    int n_queued;
    uint64_t next_seq;
    bool stop;
    bool started;
    pthread_t thread;
    srv_stats stats;
    hm_profile_fmt profile_format; /* of POST /profile/save */
    hm_pp_opts pp;             /* the prompt-processing copy (pp.model NULL: none), attached to every slot */
    bool no_batch;             /* the model evaluates one session at a time (hm_batch_eval said
                                  HM_ERR_UNSUPPORTED once): eval_jobs loops over the slots */
    /* one pending engine call (srv_sched_call) */
    srv_engine_fn call_fn;
    void *call_arg;
    bool call_done;
    pthread_cond_t call_cv;
} srv_sched;

/* Open n_slots sessions of n_ctx positions, micro-batches of n_ubatch (0 = 512), n_threads
 * threads and a KV cache of kv_type each (all KV caches sized now). */
hm_status srv_sched_init(srv_sched *s, hm_model *m, const hm_tokenizer *tok, const char *model_id,
                         int n_slots, int32_t n_ctx, int32_t n_ubatch, int32_t n_threads, hm_kv_type kv_type,
                         const hm_spec_opts *spec, hm_err *err);
hm_status srv_sched_start(srv_sched *s, hm_err *err); /* start the engine thread */
/* Stop the engine thread: every queued and running task finishes as SRV_FINISH_CANCEL. */
void srv_sched_stop(srv_sched *s);
void srv_sched_free(srv_sched *s); /* after stop; frees sessions */
/* Before start: attach the prompt-processing copy o->model (borrowed, must outlive s) to every slot. */
hm_status srv_sched_set_pp(srv_sched *s, const hm_pp_opts *o, hm_err *err);

srv_task *srv_task_new(void);      /* refs = 1 (the caller's) */
/* Queue t (the scheduler takes a reference). */
void srv_sched_submit(srv_sched *s, srv_task *t);
/* The caller gives up on t: a running slot is freed before the next round. */
void srv_sched_cancel(srv_sched *s, srv_task *t);
/* Drop the caller's reference (frees at 0). Locks mu. */
void srv_task_release(srv_sched *s, srv_task *t);

/* Run fn(arg) on the engine thread between two rounds and wait for it (the store's counters and
 * placement are only touched between steps). Returns false when the engine is stopping. */
bool srv_sched_call(srv_sched *s, srv_engine_fn fn, void *arg);

/* /slots (new reference) and the Prometheus lines of the scheduler. */
json_t *srv_sched_slots_json(srv_sched *s);
void srv_sched_metrics(srv_sched *s, srv_buf *out);
/* Counts for /props and /health. */
void srv_sched_counts(srv_sched *s, int *n_busy, int *n_queued);

/* ---- srv_store.c: the expert store as the server sees it ---- */

/* Live JSON of the expert store: {"available", "n_layer", "n_expert", "n_expert_used", "policy",
 * "policies", "layers": [{"counts": [...], "tier": [...], "hit_rate"}], ...}. Runs on the engine
 * thread (through srv_sched_call). New reference. */
json_t *srv_store_experts_json(srv_sched *s);
/* hotmoe_expert_* Prometheus lines (per-layer hit rate, units per tier, bytes moved). Runs on the
 * engine thread (srv_sched_call), like the two calls below. */
void srv_store_metrics(srv_sched *s, srv_buf *out);
/* Write the usage profile to path atomically (path.tmp + rename). */
hm_status srv_store_profile_save(srv_sched *s, const char *path, hm_profile_fmt fmt, hm_err *err);
/* Switch the placement policy ("static", "online", "lru"). */
hm_status srv_store_set_policy(srv_sched *s, const char *name, hm_err *err);

/* ---- srv_api.c ---- */

/* What an endpoint answers: a status and a body (JSON or text), or a task to stream. */
typedef struct srv_reply {
    unsigned status;
    const char *content_type; /* static string */
    char *body;               /* malloc'd */
    size_t body_len;
    srv_task *stream_task;    /* non-NULL: stream this task's SSE output (a reference) */
    srv_task *wait_task;      /* non-NULL: wait for it, then srv_api_finish_reply */
} srv_reply;

typedef struct srv_api {
    srv_sched *sched;
    hm_model *model;
    const hm_tokenizer *tok;
    const hm_model_info *info;
    const char *model_id;
    const char *model_path;
    const char *chat_template; /* NULL when none */
    const char *profile_out;
    int32_t n_ctx;
    int n_slots;
    int64_t started;
} srv_api;

void srv_reply_json(srv_reply *r, unsigned status, json_t *j); /* steals j */
void srv_reply_error(srv_reply *r, unsigned status, const char *message, const char *type,
                     const char *param, const char *code);

/* Handle one API request (path and method already known to be an API route). body may be NULL;
 * format is the request's ?format= argument (POST /profile/save; NULL when absent). */
void srv_api_handle(srv_api *a, const char *method, const char *path, const char *format, const char *body,
                    size_t body_len, srv_reply *r);
/* A non-streaming completion is done: fill r from the task. */
void srv_api_finish_reply(srv_api *a, srv_task *t, srv_reply *r);

/* ---- web page (generated from the files in web/ at build time) ---- */

typedef struct srv_asset {
    const char *path; /* "/index.html" */
    const char *mime;
    const unsigned char *data;
    size_t len;
} srv_asset;

extern const srv_asset srv_assets[];
extern const size_t srv_n_assets;

#endif
