/* srv_http.c - the HTTP side of `hotmoe serve` (libmicrohttpd, one thread per connection) and the
 * hm_server life cycle.
 *
 * A request passes: first call of the access handler (auth, Content-Length cap: rejected before
 * the body is read), body chunks (accumulated up to max_body, the rest discarded and answered
 * 413), final call (static page or srv_api_handle). Completions then wait here: a non-streaming
 * one blocks this connection's thread until its task is done, a streaming one becomes a
 * response whose reader callback blocks until the engine has published more SSE bytes. Both
 * waits wake every SRV_POLL_MS to poll the socket: a client that has gone away (a reset or a
 * hangup, not only the end of its input: see peer_gone) cancels its task, and the engine frees
 * the slot before its next round.
 *
 * Limits: libmicrohttpd caps connections per client address and in all (max_conns plus the
 * health_conns only /health may use: on_request answers anything else 503 past max_conns). Every
 * connection is tracked (on_connection) with the phase of its request: waiting for headers (since
 * the connection's start or its previous answer), for a body (since the headers), or being
 * answered; a watchdog thread shuts down those past their phase's deadline. While answering, only
 * libmicrohttpd's idle timeout applies (and not while a stream waits for the engine).
 *
 * Shutdown (hm_server_close): stop accepting, stop the scheduler (every task ends cancelled, so
 * every waiting connection thread returns), stop the daemon (joins those threads), stop the
 * watchdog, free. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"

#define SRV_POLL_MS 100
#define SRV_DEFAULT_MAX_BODY ((size_t)8 << 20)
#define SRV_WATCH_MS 250 /* how often the watchdog looks for connections past their deadline */

/* Where a connection is in its current request, for the header and body deadlines. */
enum { PEER_HEADER = 0, PEER_BODY, PEER_WORK };

/* One open TCP connection (libmicrohttpd's socket_context), in hm_server.peers while open. */
typedef struct srv_peer {
    int fd;
    int phase;      /* PEER_*: WORK (handled, answering) has no deadline of ours */
    double since;   /* srv_now() when the phase began */
    bool cut;       /* the watchdog has shut it down */
    struct srv_peer *prev, *next;
} srv_peer;

/* ChatML as Qwen writes it; hm_chat_apply recognises the family from <|im_start|>. */
static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct hm_server {
    hm_server_opts o;
    char *host, *profile_out, *model_path;
    char **keys; /* [n_keys] owned: --api-key and the lines of --api-key-file; none = no auth */
    int n_keys;
    hm_model *model;
    hm_model *pp_model; /* --prompt-processing-model, owned; NULL: none */
    hm_tokenizer *tok;
    char model_id[256];
    char *chat_template; /* owned copy, NULL when none */
    srv_sched sched;
    bool sched_init;
    srv_api api;
    struct MHD_Daemon *d;
    int port;
    int stop_pipe[2];
    volatile sig_atomic_t stopping;
    bool opened; /* hm_server_open succeeded: save the profile at close (profile_on_exit) */
    /* Open connections and the watchdog that enforces their header and body deadlines. */
    pthread_mutex_t peer_mu;   /* guards peers, n_peers, watch_stop */
    pthread_cond_t watch_cv;
    srv_peer *peers;
    int n_peers;
    bool watch_stop, watch_started, peer_init;
    pthread_t watch;
};

/* Per request (libmicrohttpd's con_cls). */
typedef struct srv_conn {
    srv_peer *peer; /* the connection's, NULL when untracked */
    srv_buf body;
    bool too_big;
    bool is_static;
} srv_conn;

/* Owned by a streaming response (freed by its free callback). */
typedef struct srv_stream {
    hm_server *s;
    srv_task *t;
    int fd;
    bool eof; /* the client's input has ended (a half-close or a close: the stream's writes tell) */
    struct MHD_Connection *c;
    bool waiting; /* the idle timeout is off while the engine has nothing new (see stream_read) */
} srv_stream;

void hm_server_opts_default(hm_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->n_parallel = 1;
    o->pp_gpu_moe = -1;
}

/* ---- connections: tracking, deadlines ---- */

static int conn_fd(struct MHD_Connection *c);

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    hm_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        srv_peer *p = calloc(1, sizeof *p);
        if (!p) return; /* untracked: counted by libmicrohttpd's own limits only */
        p->fd = conn_fd(c);
        p->since = srv_now();
        pthread_mutex_lock(&s->peer_mu);
        p->next = s->peers;
        if (s->peers) s->peers->prev = p;
        s->peers = p;
        s->n_peers++;
        pthread_mutex_unlock(&s->peer_mu);
        *socket_context = p;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        /* libmicrohttpd closes the socket after this returns: the watchdog, which shuts sockets
         * down under peer_mu, never touches a closed one */
        srv_peer *p = *socket_context;
        pthread_mutex_lock(&s->peer_mu);
        if (p->prev) p->prev->next = p->next;
        else s->peers = p->next;
        if (p->next) p->next->prev = p->prev;
        s->n_peers--;
        pthread_mutex_unlock(&s->peer_mu);
        free(p);
        *socket_context = NULL;
    }
}

static srv_peer *peer_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Enter a phase; returns the number of open connections. */
static int peer_phase(hm_server *s, srv_peer *p, int phase) {
    pthread_mutex_lock(&s->peer_mu);
    if (p) {
        p->phase = phase;
        p->since = srv_now();
    }
    int n = s->n_peers;
    pthread_mutex_unlock(&s->peer_mu);
    return n;
}

/* Shut down every connection still waiting for headers or a body past its deadline (a slow or
 * stalled client): libmicrohttpd then reads the end of input and closes it. */
static void *watchdog(void *arg) {
    hm_server *s = arg;
    pthread_mutex_lock(&s->peer_mu);
    while (!s->watch_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_nsec -= 1000000000L;
            ts.tv_sec++;
        }
        pthread_cond_timedwait(&s->watch_cv, &s->peer_mu, &ts);
        double now = srv_now();
        for (srv_peer *p = s->peers; p; p = p->next) {
            double limit = p->phase == PEER_HEADER ? s->o.header_timeout_s
                           : p->phase == PEER_BODY ? s->o.body_timeout_s : 0;
            if (limit > 0 && !p->cut && p->fd >= 0 && now - p->since > limit) {
                shutdown(p->fd, SHUT_RDWR);
                p->cut = true;
                if (s->o.verbose)
                    fprintf(stderr, "serve: closed a connection that sent no complete request %s in %g s\n",
                            p->phase == PEER_HEADER ? "header" : "body", limit);
            }
        }
    }
    pthread_mutex_unlock(&s->peer_mu);
    return NULL;
}

/* ---- helpers ---- */

/* Has the client gone away? End of input is not enough: a client that half-closes after its
 * request (shutdown(SHUT_WR), as some HTTP/1.0 clients and proxies do) still reads the answer,
 * and its FIN looks the same as a closed socket's. Only a reset or hangup on the socket is a
 * disconnect: a closed client's kernel answers the next bytes we send with RST. *eof is set when
 * the input has ended (the caller may then probe with bytes of its own). */
static bool peer_gone(int fd, bool *eof) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLRDHUP) *eof = true;
    return false;
}

/* The input of an HTTP/1.1 client has ended while its answer is not ready: send an interim
 * "102 Processing" (a 1xx answer every HTTP/1.1 client skips; none may go to HTTP/1.0). A
 * half-closed client reads it and goes on waiting; a closed one's kernel resets the connection,
 * which peer_gone sees. Written straight to the socket: with a thread per connection,
 * libmicrohttpd writes nothing on it until this request's handler returns. False when the write
 * already fails (the client is gone). */
static bool probe_peer(int fd) {
    static const char probe[] = "HTTP/1.1 102 Processing\r\n\r\n";
    ssize_t w = send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return w >= 0 || errno == EAGAIN || errno == EWOULDBLOCK;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void deadline_in(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    while (ts->tv_nsec >= 1000000000L) {
        ts->tv_nsec -= 1000000000L;
        ts->tv_sec++;
    }
}

static enum MHD_Result send_reply(struct MHD_Connection *c, srv_reply *r) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(r->body_len, r->body ? r->body : (char *)"", r->body ? MHD_RESPMEM_MUST_FREE
                                                                                              : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(r->body);
        return MHD_NO;
    }
    r->body = NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, r->content_type ? r->content_type : "application/json");
    if (r->status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *type,
                                  const char *code) {
    srv_reply r = {0};
    srv_reply_error(&r, status, msg, type, NULL, code);
    return send_reply(c, &r);
}

/* The bytes of the sent key are compared with every key in full (no early exit on the first
 * difference), so the time does not tell how much of a key was right. */
/* 503 with Retry-After, and the connection closed: its place is what the client lacks. */
static enum MHD_Result send_busy(struct MHD_Connection *c, const char *msg) {
    srv_reply r = {0};
    srv_reply_error(&r, 503, msg, "server_error", NULL, "server_busy");
    struct MHD_Response *resp = MHD_create_response_from_buffer(r.body_len, r.body ? r.body : (char *)"",
                                                                r.body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(r.body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, 503, resp);
    MHD_destroy_response(resp);
    return ret;
}

static bool authorized(hm_server *s, struct MHD_Connection *c) {
    if (s->n_keys == 0) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    bool ok = false;
    for (int j = 0; j < s->n_keys; j++) {
        const char *key = s->keys[j];
        size_t k = strlen(key);
        unsigned char diff = (unsigned char)(n != k);
        for (size_t i = 0; i < k; i++) diff |= (unsigned char)(key[i] ^ (i < n ? h[i] : 0));
        ok |= diff == 0;
    }
    return ok;
}

static const srv_asset *find_asset(const char *url) {
    if (!strcmp(url, "/")) url = "/index.html";
    for (size_t i = 0; i < srv_n_assets; i++)
        if (!strcmp(srv_assets[i].path, url)) return &srv_assets[i];
    return NULL;
}

/* ---- streaming ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_stream *st = cls;
    srv_sched *sc = &st->s->sched;
    srv_task *t = st->t;
    pthread_mutex_lock(&sc->mu);
    for (;;) {
        if (t->out.len || t->done) {
            /* libmicrohttpd's idle timeout counts while this callback blocks: it is off while we
             * wait for the engine (a queued request, a long prompt) and back on for the client's
             * reading (a client that stops reading is closed after idle_timeout_s) */
            if (st->waiting) {
                MHD_set_connection_option(st->c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)st->s->o.idle_timeout_s);
                st->waiting = false;
            }
        }
        if (t->out.len) {
            size_t n = t->out.len < max ? t->out.len : max;
            memcpy(buf, t->out.p, n);
            srv_buf_consume(&t->out, n);
            pthread_mutex_unlock(&sc->mu);
            return (ssize_t)n;
        }
        if (t->done) {
            pthread_mutex_unlock(&sc->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (!st->waiting) {
            MHD_set_connection_option(st->c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
            st->waiting = true;
        }
        struct timespec ts;
        deadline_in(&ts, SRV_POLL_MS);
        pthread_cond_timedwait(&t->cv, &sc->mu, &ts);
        if (!t->done && !t->out.len && peer_gone(st->fd, &st->eof)) {
            t->cancelled = true;
            pthread_cond_signal(&sc->cv);
            pthread_mutex_unlock(&sc->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    srv_stream *st = cls;
    srv_sched_cancel(&st->s->sched, st->t); /* no-op when done */
    srv_task_release(&st->s->sched, st->t);
    free(st);
}

static enum MHD_Result start_stream(hm_server *s, struct MHD_Connection *c, srv_task *t) {
    srv_stream *st = malloc(sizeof *st);
    struct MHD_Response *resp = NULL;
    if (st) {
        *st = (srv_stream){.s = s, .t = t, .fd = conn_fd(c), .c = c};
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
    }
    if (!resp) {
        free(st);
        srv_sched_cancel(&s->sched, t);
        srv_task_release(&s->sched, t);
        return send_error(c, 500, "out of memory", "server_error", NULL);
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Block until t is done; false when the client went away first (t is then cancelled). An
 * HTTP/1.0 client whose input ended cannot be probed: its request runs to the end, and the
 * answer's write finds out whether anyone is left to read it. */
static bool wait_task(hm_server *s, struct MHD_Connection *c, srv_task *t, bool http11) {
    int fd = conn_fd(c);
    bool eof = false, probed = false;
    srv_sched *sc = &s->sched;
    pthread_mutex_lock(&sc->mu);
    while (!t->done) {
        struct timespec ts;
        deadline_in(&ts, SRV_POLL_MS);
        pthread_cond_timedwait(&t->cv, &sc->mu, &ts);
        bool gone = !t->done && peer_gone(fd, &eof);
        if (!gone && eof && !probed && http11) {
            probed = true;
            gone = !probe_peer(fd);
        }
        if (gone) {
            t->cancelled = true;
            pthread_cond_signal(&sc->cv);
            pthread_mutex_unlock(&sc->mu);
            return false;
        }
    }
    pthread_mutex_unlock(&sc->mu);
    return true;
}

/* ---- the access handler ---- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    hm_server *s = cls;
    srv_conn *rc = *con_cls;
    if (!rc) { /* headers are in; the body (if any) is not */
        if (!(rc = calloc(1, sizeof *rc))) return MHD_NO;
        *con_cls = rc;
        rc->peer = peer_of(c);
        int n_open = peer_phase(s, rc->peer, PEER_BODY);
        if (n_open > s->o.max_conns && strcmp(url, "/health") != 0) { /* the rest is /health's */
            char msg[160];
            snprintf(msg, sizeof msg, "the server has too many open connections (%d); try again", n_open);
            return send_busy(c, msg);
        }
        rc->is_static = (!strcmp(method, "GET") || !strcmp(method, "HEAD")) && find_asset(url);
        if (!rc->is_static && strcmp(url, "/health") != 0 && !authorized(s, c))
            return send_error(c, 401, "invalid or missing API key (send \"Authorization: Bearer KEY\")",
                              "invalid_request_error", "invalid_api_key");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o.max_body);
            return send_error(c, 413, msg, "invalid_request_error", "request_too_large");
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rc->too_big) {
            if (rc->body.len + *upload_data_size > s->o.max_body) {
                rc->too_big = true;
                srv_buf_free(&rc->body);
            } else if (!srv_buf_add(&rc->body, upload_data, *upload_data_size)) {
                return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    peer_phase(s, rc->peer, PEER_WORK); /* the request is in: no deadline of ours while answering */
    if (rc->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o.max_body);
        return send_error(c, 413, msg, "invalid_request_error", "request_too_large");
    }
    if (rc->is_static) {
        const srv_asset *a = find_asset(url);
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(a->len, (void *)(uintptr_t)a->data, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->mime);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    srv_reply r = {0};
    const char *format = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "format");
    srv_api_handle(&s->api, method, url, format, rc->body.p, rc->body.len, &r);
    if (s->o.verbose) {
        char m[160], u[600], who[INET6_ADDRSTRLEN] = "?"; /* client bytes: escaped, cut */
        srv_text(m, sizeof m, method, strlen(method), 32);
        srv_text(u, sizeof u, url, strlen(url), 200);
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *sa = ci ? ci->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, who, sizeof who);
        else if (sa && sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, who, sizeof who);
        if (r.stream_task || r.wait_task)
            fprintf(stderr, "serve: %s %s %s -> %s\n", who, m, u, r.stream_task ? "stream" : "wait");
        else fprintf(stderr, "serve: %s %s %s -> %u\n", who, m, u, r.status);
    }
    if (r.stream_task) return start_stream(s, c, r.stream_task);
    if (r.wait_task) {
        srv_task *t = r.wait_task;
        if (!wait_task(s, c, t, version && !strcmp(version, MHD_HTTP_VERSION_1_1))) {
            srv_task_release(&s->sched, t);
            return MHD_NO; /* nobody to answer: close */
        }
        srv_api_finish_reply(&s->api, t, &r);
        srv_task_release(&s->sched, t);
    }
    return send_reply(c, &r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    hm_server *s = cls;
    srv_conn *rc = *con_cls;
    if (!rc) return;
    peer_phase(s, rc->peer, PEER_HEADER); /* kept alive: the next request's headers are due */
    srv_buf_free(&rc->body);
    free(rc);
    *con_cls = NULL;
}

/* ---- life cycle ---- */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static void set_err(hm_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(hm_err *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

/* Add one key; it must be text a client can send in a header: no control bytes, no spaces. */
static hm_status add_key(hm_server *s, const char *key, size_t n, const char *file, int line, hm_err *err) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)key[i];
        if (ch <= 0x20 || ch == 0x7f) {
            if (file)
                set_err(err, "serve: --api-key-file %s line %d: a key cannot hold spaces or control characters", file,
                        line);
            else set_err(err, "serve: --api-key: a key cannot hold spaces or control characters");
            return HM_ERR_ARG;
        }
    }
    char **k = realloc(s->keys, (size_t)(s->n_keys + 1) * sizeof *k);
    if (!k) return HM_ERR_NOMEM;
    s->keys = k;
    if (!(k[s->n_keys] = strndup(key, n))) return HM_ERR_NOMEM;
    s->n_keys++;
    return HM_OK;
}

/* --api-key-file: one key per line; blank lines and lines starting with '#' are skipped, spaces
 * around a key are trimmed. A file without a key is an error: it would turn authentication off. */
static hm_status load_key_file(hm_server *s, const char *path, hm_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        set_err(err, "serve: --api-key-file %s: %s", path, strerror(errno));
        return HM_ERR_IO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > (1 << 20)) {
        set_err(err, "serve: --api-key-file %s: not a regular file of at most 1 MiB", path);
        fclose(f);
        return HM_ERR_ARG;
    }
    hm_status st = HM_OK;
    int n_before = s->n_keys, line = 0;
    char buf[4096];
    while (st == HM_OK && fgets(buf, sizeof buf, f)) {
        line++;
        size_t n = strlen(buf);
        if (n == sizeof buf - 1 && buf[n - 1] != '\n' && !feof(f)) {
            set_err(err, "serve: --api-key-file %s line %d: longer than %zu bytes", path, line, sizeof buf - 2);
            st = HM_ERR_ARG;
            break;
        }
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) n--;
        buf[n] = 0;
        char *a = buf;
        while (*a == ' ' || *a == '\t') a++;
        if (!*a || *a == '#') continue;
        st = add_key(s, a, strlen(a), path, line, err);
    }
    if (st == HM_OK && ferror(f)) {
        set_err(err, "serve: --api-key-file %s: %s", path, strerror(errno));
        st = HM_ERR_IO;
    }
    fclose(f);
    if (st == HM_OK && s->n_keys == n_before) {
        set_err(err, "serve: --api-key-file %s holds no key (one key per line; '#' starts a comment)", path);
        st = HM_ERR_ARG;
    }
    return st;
}

hm_status hm_server_open(hm_server **out, const hm_server_opts *opts, hm_err *err) {
    *out = NULL;
    hm_status st = HM_OK;
    hm_server *s = calloc(1, sizeof *s);
    if (!s) return HM_ERR_NOMEM;
    s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->o = *opts;
    if (!s->o.host) s->o.host = "127.0.0.1";
    if (s->o.port == 0) s->o.port = 8080;
    if (s->o.n_parallel <= 0) s->o.n_parallel = 1;
    if (s->o.max_body == 0) s->o.max_body = SRV_DEFAULT_MAX_BODY;
    if (s->o.max_conns == 0) s->o.max_conns = 256;
    if (s->o.max_conns_per_ip == 0) s->o.max_conns_per_ip = 32;
    if (s->o.health_conns == 0) s->o.health_conns = 4;
    if (s->o.health_conns < 0) s->o.health_conns = 0;
    if (s->o.header_timeout_s == 0) s->o.header_timeout_s = 10;
    if (s->o.body_timeout_s == 0) s->o.body_timeout_s = 60;
    if (s->o.idle_timeout_s == 0) s->o.idle_timeout_s = 120;
    pthread_mutex_init(&s->peer_mu, NULL);
    pthread_cond_init(&s->watch_cv, NULL);
    s->peer_init = true;
    if (s->o.max_conns < 1 || s->o.max_conns > 16384 || s->o.max_conns_per_ip < 1 || s->o.health_conns > 1024 ||
        s->o.header_timeout_s < 1 || s->o.body_timeout_s < 1 || s->o.idle_timeout_s < 1) {
        set_err(err, "serve: connection limits must be >= 1 (--max-conns at most 16384, --health-conns at most "
                     "1024) and timeouts >= 1 s");
        st = HM_ERR_ARG;
        goto fail;
    }
    if (!s->o.profile_out) s->o.profile_out = "hotmoe-profile.json";
    if (!opts->model_path) {
        set_err(err, "serve: no model (-m FILE)");
        st = HM_ERR_ARG;
        goto fail;
    }
    if (s->o.port < 1 || s->o.port > 65535 || s->o.n_parallel > 256) {
        set_err(err, "serve: port must be in 1..65535 and --parallel in 1..256");
        st = HM_ERR_ARG;
        goto fail;
    }
    s->host = dup_or_null(s->o.host);
    if (s->o.api_key && !*s->o.api_key) { /* asked for a key and gave none: never serve open by mistake */
        set_err(err, "serve: the API key is empty; give a key, or no --api-key (and no HOTMOE_API_KEY) to serve "
                     "without one");
        st = HM_ERR_ARG;
        goto fail;
    }
    if (s->o.api_key && (st = add_key(s, s->o.api_key, strlen(s->o.api_key), NULL, 0, err)) != HM_OK) goto fail;
    if (s->o.api_key_file && (st = load_key_file(s, s->o.api_key_file, err)) != HM_OK) goto fail;
    s->profile_out = dup_or_null(s->o.profile_out);
    s->model_path = dup_or_null(s->o.model_path);
    if (!s->host || !s->profile_out || !s->model_path) {
        st = HM_ERR_NOMEM;
        goto fail;
    }
    if (pipe(s->stop_pipe) != 0) {
        set_err(err, "serve: pipe: %s", strerror(errno));
        st = HM_ERR_IO;
        goto fail;
    }

    hm_model_opts mo;
    hm_model_opts_default(&mo);
    mo.verbose = s->o.verbose;
    mo.placement = s->o.placement;
    hm_placement_opts ppo; /* the copy's: the main model's, --prompt-processing-gpu-moe as its --n-cpu-moe */
    if (s->o.placement) ppo = *s->o.placement;
    else hm_placement_opts_default(&ppo);
    if (s->o.pp_gpu_moe >= 0) ppo.n_cpu_moe = s->o.pp_gpu_moe;
    s->o.placement = NULL; /* borrowed during open only */
    if ((st = hm_model_open(&s->model, s->model_path, &mo, err)) != HM_OK) goto fail;
    if (s->o.pp_model_path) {
        mo.placement = &ppo;
        mo.share_dense = s->model; /* identical dense tensors held once (closed before it) */
        if ((st = hm_model_open(&s->pp_model, s->o.pp_model_path, &mo, err)) != HM_OK) goto fail;
    }
    if (s->o.trace_out && (st = hm_model_trace_out(s->model, s->o.trace_out, err)) != HM_OK) goto fail;
    if ((st = hm_tokenizer_open(&s->tok, s->model_path, err)) != HM_OK) goto fail;
    if (s->o.alias) {
        size_t n = strlen(s->o.alias);
        if (n == 0 || n >= sizeof s->model_id || srv_text(s->model_id, sizeof s->model_id, s->o.alias, n, n) != n) {
            set_err(err, "serve: --alias must be 1 to %zu bytes of UTF-8 text without control characters",
                    sizeof s->model_id - 1);
            st = HM_ERR_ARG;
            goto fail;
        }
    } else { /* the file name, shown as text whatever its bytes */
        const char *base = strrchr(s->model_path, '/');
        base = base ? base + 1 : s->model_path;
        srv_text(s->model_id, sizeof s->model_id, base, strlen(base), 128);
    }
    const char *tmpl = s->o.chat_template;
    if (tmpl && !strcmp(tmpl, "chatml")) tmpl = chatml_template;
    if (!tmpl) tmpl = hm_tokenizer_chat_template(s->tok);
    if (tmpl && *tmpl) {
        if (!hm_chat_template_name(tmpl)) {
            if (s->o.chat_template) {
                set_err(err,
                        "serve: --chat-template '%.60s%s' is not a template hotmoe renders (chatml, gemma4, chatglm4, "
                        "deepseek3, harmony)",
                        s->o.chat_template, strlen(s->o.chat_template) > 60 ? "..." : "");
                st = HM_ERR_ARG;
                goto fail;
            }
            fprintf(stderr, "serve: warning: the model's chat template is not one hotmoe renders; "
                            "/v1/chat/completions will answer 400 (use --chat-template chatml)\n");
        } else if (!(s->chat_template = strdup(tmpl))) {
            st = HM_ERR_NOMEM;
            goto fail;
        }
    }

    if ((st = srv_sched_init(&s->sched, s->model, s->tok, s->model_id, s->o.n_parallel, s->o.n_ctx, s->o.n_ubatch,
                             s->o.n_threads, s->o.kv_type, s->o.spec, err)) != HM_OK) {
        s->sched_init = true;
        goto fail;
    }
    s->sched_init = true;
    s->sched.profile_format = s->o.profile_format;
    if (s->pp_model) {
        hm_pp_opts po;
        hm_pp_opts_default(&po);
        po.model = s->pp_model;
        if (s->o.pp_min_tokens > 0) po.min_tokens = s->o.pp_min_tokens;
        po.refresh = s->o.pp_refresh;
        if ((st = srv_sched_set_pp(&s->sched, &po, err)) != HM_OK) goto fail;
    }
    s->api = (srv_api){.sched = &s->sched, .model = s->model, .tok = s->tok, .info = hm_model_get_info(s->model),
                       .model_id = s->model_id, .model_path = s->model_path, .chat_template = s->chat_template,
                       .profile_out = s->profile_out, .n_ctx = s->sched.n_ctx, .n_slots = s->o.n_parallel,
                       .started = srv_unix_time()};
    if ((st = srv_sched_start(&s->sched, err)) != HM_OK) goto fail;

    /* the address to bind */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", s->o.port);
    int gai = getaddrinfo(s->host, port_s, &hints, &ai);
    if (gai != 0 || !ai) {
        set_err(err, "serve: cannot resolve --host '%s': %s", s->host, gai_strerror(gai));
        st = HM_ERR_ARG;
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (s->o.verbose) flags |= MHD_USE_ERROR_LOG;
    if (pthread_create(&s->watch, NULL, watchdog, s) != 0) {
        freeaddrinfo(ai);
        set_err(err, "serve: cannot start the connection watchdog thread");
        st = HM_ERR_INTERNAL;
        goto fail;
    }
    s->watch_started = true;
    /* max_conns for everything, health_conns more for /health (checked in on_request) */
    s->d = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(s->o.max_conns + s->o.health_conns),
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.max_conns_per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->o.idle_timeout_s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        set_err(err, "serve: cannot listen on %s:%d (address in use, or not an address of this machine)", s->host,
                s->o.port);
        st = HM_ERR_IO;
        goto fail;
    }
    s->port = s->o.port;
    s->opened = true;
    *out = s;
    return HM_OK;
fail:
    hm_server_close(s);
    return st;
}

int hm_server_port(const hm_server *s) { return s->port; }

void hm_server_stop(hm_server *s) {
    s->stopping = 1;
    char b = 1;
    if (s->stop_pipe[1] >= 0) {
        ssize_t w = write(s->stop_pipe[1], &b, 1);
        (void)w;
    }
}

void hm_server_wait(hm_server *s) {
    char b;
    while (!s->stopping) {
        ssize_t r = read(s->stop_pipe[0], &b, 1);
        if (r == 1 || (r < 0 && errno != EINTR)) break;
    }
}

void hm_server_close(hm_server *s) {
    if (!s) return;
    if (s->d) MHD_quiesce_daemon(s->d);
    if (s->sched_init) srv_sched_stop(&s->sched);
    if (s->d) MHD_stop_daemon(s->d);
    if (s->watch_started) { /* after the daemon: no connection is left to watch */
        pthread_mutex_lock(&s->peer_mu);
        s->watch_stop = true;
        pthread_cond_signal(&s->watch_cv);
        pthread_mutex_unlock(&s->peer_mu);
        pthread_join(s->watch, NULL);
    }
    if (s->peer_init) {
        pthread_mutex_destroy(&s->peer_mu);
        pthread_cond_destroy(&s->watch_cv);
    }
    if (s->sched_init) srv_sched_free(&s->sched);
    if (s->opened && s->o.profile_on_exit && s->model && hm_model_has_experts(s->model)) {
        /* the engine thread has stopped: the store is quiet */
        hm_err err;
        if (hm_model_profile_save(s->model, s->profile_out, s->o.profile_format, &err) != HM_OK)
            fprintf(stderr, "serve: %s\n", err.msg);
        else
            fprintf(stderr, "serve: wrote the expert usage profile to %s\n", s->profile_out);
    }
    if (s->opened && s->o.trace_out && s->model) { /* the engine thread has stopped: flush the trace */
        hm_err err;
        if (hm_model_trace_close(s->model, &err) != HM_OK) fprintf(stderr, "serve: %s\n", err.msg);
    }
    hm_tokenizer_close(s->tok);
    hm_model_close(s->pp_model); /* after the sessions that borrowed it (srv_sched_free) */
    hm_model_close(s->model);
    if (s->stop_pipe[0] >= 0) close(s->stop_pipe[0]);
    if (s->stop_pipe[1] >= 0) close(s->stop_pipe[1]);
    free(s->chat_template);
    free(s->host);
    for (int i = 0; i < s->n_keys; i++) free(s->keys[i]);
    free(s->keys);
    free(s->profile_out);
    free(s->model_path);
    free(s);
}
