/*
 * master.c - the job master's lifecycle: configuration and defaults, the state it resumes, the
 * HTTP server (libmicrohttpd, a thread per connection so that long-polls may block) and the
 * tick thread that runs the periodic checks.
 *
 * The listen socket is ours (bound here, handed to libmicrohttpd) so that the port is known
 * before the first request and SO_REUSEADDR lets a restarted master take its port back at once.
 * Every accepted connection gets TCP keepalive (idle 1 s, interval 1 s, 3 probes) and a user
 * timeout, so a peer that vanished without a FIN (a host crash, a cut link) is found in ~4 s.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "elastic/agent_internal.h"
#include "elastic/http_internal.h"
#include "elastic/master_internal.h"

#define BODY_MAX (4u << 20)

static void cfg_defaults(adt_master *m, const adt_master_config *c) {
    m->cfg = *c;
    adt_master_config *d = &m->cfg;
    if (d->nnodes_min < 1) d->nnodes_min = 1;
    if (d->nnodes_max < 0) d->nnodes_max = 0;
    if (d->max_restarts < 0) d->max_restarts = 3;
    if (d->heartbeat_s <= 0) d->heartbeat_s = 1.0;
    if (d->heartbeat_misses <= 0) d->heartbeat_misses = 3;
    if (d->join_wait_s == 0) d->join_wait_s = 1.0;
    if (d->join_wait_s < 0) d->join_wait_s = 0;
    if (d->stop_timeout_s <= 0) d->stop_timeout_s = 30;
    if (d->progress_timeout_s == 0) d->progress_timeout_s = 600;
    if (d->cooldown_min_s <= 0) d->cooldown_min_s = 10;
    if (d->cooldown_max_s <= 0) d->cooldown_max_s = 600;
    if (d->cooldown_max_s < d->cooldown_min_s) d->cooldown_max_s = d->cooldown_min_s;
    m->hb_s = d->heartbeat_s;
    m->hb_misses = d->heartbeat_misses;
    m->max_wait_ms = d->max_wait_ms == 0 ? 30000 : d->max_wait_ms < 0 ? 0 : d->max_wait_ms;
}

static int check_config(const adt_master_config *c) {
    if (!c->job_dir || !*c->job_dir) return adt_error(ADT_ERR_ARG, "--job: a job directory is required");
    if (c->nnodes_max > 0 && c->nnodes_max < c->nnodes_min)
        return adt_error(ADT_ERR_ARG, "--nnodes %d:%d: MIN above MAX", c->nnodes_min, c->nnodes_max);
    if (c->ranks_per_replica < 0)
        return adt_error(ADT_ERR_ARG, "ranks_per_replica %d, expected >= 1", c->ranks_per_replica);
    if (c->token && strlen(c->token) > 256) return adt_error(ADT_ERR_ARG, "--token: longer than 256 bytes");
    if (c->run_id && strlen(c->run_id) >= 64) return adt_error(ADT_ERR_ARG, "run id: longer than 63 bytes");
    if (c->straggler_config && (!c->straggler_policy || !strcmp(c->straggler_policy, "off")))
        return adt_error(ADT_ERR_ARG, "--straggler-config: only acts with --straggler-policy dd or nd; expected one "
                                      "of them, or no --straggler-config");
    if (c->straggler_config && strlen(c->straggler_config) >= 256)
        return adt_error(ADT_ERR_ARG, "--straggler-config: longer than 255 bytes");
    for (const char *p = c->token; p && *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 127)
            return adt_error(ADT_ERR_ARG, "--token: only printable ASCII without spaces");
    return ADT_OK;
}

/* What the job trains, as told, plus what the master adds: the straggler policy it runs and
 * where checkpoints go (the job directory, absolute: workers may start elsewhere). */
static void spec_init(adt_master *m, const adt_master_config *c) {
    if (c->spec) {
        m->spec = *c->spec;
        m->spec.model_json = c->spec->model_json ? adt_strdup(c->spec->model_json) : NULL;
    }
    if (c->straggler_policy) {
        snprintf(m->spec.straggler_policy, sizeof m->spec.straggler_policy, "%s", c->straggler_policy);
        snprintf(m->spec.straggler_config, sizeof m->spec.straggler_config, "%s",
                 c->straggler_config ? c->straggler_config : "");
        m->spec.have |= ADT_SPEC_STRAGGLER;
    }
    char abs[PATH_MAX];
    if (!m->in_memory && realpath(m->job_dir, abs) && strlen(abs) + 13 < sizeof m->spec.checkpoint_dir) {
        memcpy(m->spec.checkpoint_dir, abs, strlen(abs));
        memcpy(m->spec.checkpoint_dir + strlen(abs), "/checkpoints", 13);
        m->spec.have |= ADT_SPEC_CHECKPOINT_DIR;
    }
}

int adt_master_create(adt_master **out, const adt_master_config *c) {
    *out = NULL;
    int rc = check_config(c);
    if (rc) return rc;
    adt_master *m = adt_calloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    cfg_defaults(m, c);
    m->job_dir = adt_strdup(c->job_dir);
    m->listen = adt_strdup(c->listen ? c->listen : "127.0.0.1:29400");
    m->token = c->token && *c->token ? adt_strdup(c->token) : NULL;
    m->cfg.job_dir = m->job_dir;
    m->cfg.listen = m->listen;
    m->cfg.token = m->token;
    m->cfg.data = NULL;
    m->in_memory = !strcmp(c->job_dir, ":memory:");
    m->lock_fd = -1;
    m->listen_fd = -1;
    m->ledger_offset = -1;
    m->rpr = c->ranks_per_replica > 0 ? c->ranks_per_replica : 1;
    m->max_reported = -1;
    m->last_recovery_s = -1;
    m->started_wall = adt_wall_s();
    /* plan versions of a restarted master must not repeat the previous one's: an agent that
     * long-polls with an old version would wait for nothing */
    m->version = (uint64_t)(m->started_wall * 1000);
    m->last_join_mono = adt_now_s();
    m->gstate_mono = adt_now_s();
    if (c->data) {
        m->job = *c->data;
        m->have_job = 1;
    }
    if (c->run_id) snprintf(m->run_id, sizeof m->run_id, "%s", c->run_id);
    if ((rc = m_dash_init(m, c))) {
        adt_master_free(m);
        return rc;
    }
    m->target_workers = c->max_workers > 0 ? c->max_workers : 0; /* a resumed job keeps its own */
    if ((rc = ms_open(m))) {
        adt_master_free(m);
        return rc;
    }
    spec_init(m, c);
    if (!m->run_id[0]) {
        uint64_t r = adt_rng_mix64((uint64_t)(adt_wall_s() * 1e6) ^ ((uint64_t)getpid() << 32));
        snprintf(m->run_id, sizeof m->run_id, "adt-%012llx", (unsigned long long)(r & 0xffffffffffffULL));
    }
    /* A resumed world: its agents are taken to be running it until they say otherwise. */
    for (int i = 0; i < m->n_slots; i++) {
        m_agent *a = m_agent_find(m, m->slots[i].agent);
        if (a) a->world_running = 1, a->world_gen = m->gen;
    }
    m->gstate_mono = adt_now_s();
    if (m->ledger_offset >= 0 && (rc = m_ledger_ready(m))) {
        adt_master_free(m);
        return rc;
    }
    ms_event(m, "master_start", m->gen, -1, -1, "run %s, generation %lld (%s), %d agents known", m->run_id,
             (long long)m->gen, m_gstate_name(m->gstate), m->n_agents);
    ms_save(m);
    *out = m;
    return ADT_OK;
}

/* ---- HTTP glue ------------------------------------------------------------------------------ */
typedef struct conn_ctx {
    char *body;
    size_t n, cap;
    int too_big;
} conn_ctx;

typedef struct arg_vec {
    const char **v;
    int n, cap;
} arg_vec;

static enum MHD_Result collect_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    arg_vec *a = cls;
    if (a->n + 3 > a->cap) {
        a->cap = a->cap ? 2 * a->cap : 16;
        a->v = adt_realloc(a->v, (size_t)a->cap * sizeof *a->v);
    }
    a->v[a->n++] = key ? key : "";
    a->v[a->n++] = value ? value : "";
    a->v[a->n] = NULL;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    adt_master *m = cls;
    conn_ctx *x = *con_cls;
    if (!x) {
        *con_cls = adt_calloc(1, sizeof *x);
        return MHD_YES;
    }
    if (*upload_size) {
        if (!x->too_big && x->n + *upload_size <= BODY_MAX) {
            if (x->n + *upload_size + 1 > x->cap) {
                x->cap = x->n + *upload_size + 1 > 2 * x->cap ? x->n + *upload_size + 1 : 2 * x->cap;
                x->body = adt_realloc(x->body, x->cap);
            }
            memcpy(x->body + x->n, upload, *upload_size);
            x->n += *upload_size;
        } else {
            x->too_big = 1;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    adt_http_reply rp = {0};
    if (x->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "{\"error\":\"request body larger than %u bytes\"}", BODY_MAX);
        rp = (adt_http_reply){413, "application/json", adt_strdup(msg), strlen(msg)};
        pthread_mutex_lock(&m->mu);
        m->n_requests[4]++;
        pthread_mutex_unlock(&m->mu);
    } else {
        arg_vec args = {0};
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_arg, &args);
        adt_http_request rq = {.method = method,
                               .path = url,
                               .query = args.v,
                               .authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
                               .body = x->body,
                               .body_len = x->n};
        adt_master_handle(m, &rq, &rp);
        free(args.v);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(rp.len, rp.body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(rp.body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", rp.content_type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)rp.status, r);
    MHD_destroy_response(r);
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)cls, (void)c, (void)code;
    conn_ctx *x = *con_cls;
    if (x) free(x->body), free(x);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
    (void)cls, (void)socket_ctx;
    if (code != MHD_CONNECTION_NOTIFY_STARTED) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    wk_tcp_live(ci->connect_fd, 10000);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = 0;
    adt_log(ADT_LOG_DEBUG, "master http: %s", msg);
}

/* Binds HOST:PORT (IPv4). *loopback: the address is 127.0.0.0/8. */
static int bind_listen(adt_master *m, int *loopback) {
    char host[256];
    int port, rc;
    if ((rc = eh_parse_hostport(m->listen, host, sizeof host, &port, "--listen"))) return rc;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int g = getaddrinfo(host, NULL, &hints, &ai);
    if (g || !ai)
        return adt_error(ADT_ERR_ARG, "--listen %s: cannot resolve '%s': %s", m->listen, host, gai_strerror(g));
    struct sockaddr_in sa = *(struct sockaddr_in *)ai->ai_addr;
    freeaddrinfo(ai);
    sa.sin_port = htons((uint16_t)port);
    *loopback = (ntohl(sa.sin_addr.s_addr) >> 24) == 127;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 256) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int e = errno;
        if (fd >= 0) close(fd);
        return adt_error(ADT_ERR_IO, "--listen %s: %s", m->listen, strerror(e));
    }
    m->listen_fd = fd;
    m->port = ntohs(sa.sin_port);
    return ADT_OK;
}

static void *ticker_main(void *arg) {
    adt_master *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stopping) {
        m_tick_locked(m);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int adt_master_start(adt_master *m) {
    if (m->mhd) return adt_error(ADT_ERR_STATE, "master: already serving");
    int loopback = 0, rc = bind_listen(m, &loopback);
    if (rc) return rc;
    if (!loopback && !m->token) {
        close(m->listen_fd);
        m->listen_fd = -1;
        return adt_error(ADT_ERR_ARG, "--listen %s is not a loopback address: the API then needs a job token (--token)",
                         m->listen);
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    m->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_LISTEN_SOCKET, m->listen_fd,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
                              m, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)1000, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, m, MHD_OPTION_END);
    if (!m->mhd) {
        close(m->listen_fd);
        m->listen_fd = -1;
        return adt_error(ADT_ERR_IO, "--listen %s: libmicrohttpd could not start", m->listen);
    }
    if (pthread_create(&m->ticker, NULL, ticker_main, m)) return adt_error(ADT_ERR_IO, "master: cannot start a thread");
    m->ticker_on = 1;
    adt_log(ADT_LOG_INFO, "master: job %s (run %s) on port %d%s", m->in_memory ? "(in memory)" : m->job_dir, m->run_id,
            m->port, m->token ? ", token required" : "");
    return ADT_OK;
}

int adt_master_port(const adt_master *m) { return m->port; }

adt_job_state adt_master_job_state(adt_master *m) {
    pthread_mutex_lock(&m->mu);
    adt_job_state s = m_job_state(m);
    pthread_mutex_unlock(&m->mu);
    return s;
}

adt_job_state adt_master_wait(adt_master *m, double timeout_s) {
    double end = adt_now_s() + timeout_s;
    pthread_mutex_lock(&m->mu);
    while (m->gstate != G_DONE && m->gstate != G_FAILED && !m->stopping && (timeout_s < 0 || adt_now_s() < end)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 200 * 1000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    adt_job_state s = m_job_state(m);
    pthread_mutex_unlock(&m->mu);
    return s;
}

void adt_master_tick(adt_master *m) {
    pthread_mutex_lock(&m->mu);
    m_tick_locked(m);
    pthread_mutex_unlock(&m->mu);
}

void adt_master_free(adt_master *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (m->ticker_on) pthread_join(m->ticker, NULL);
    if (m->mhd)
        MHD_stop_daemon(m->mhd); /* closes the listen socket */
    else if (m->listen_fd >= 0)
        close(m->listen_fd);
    if (m->L) adt_ledger_close(m->L);
    ms_close(m);
    for (int i = 0; i < m->n_agents; i++)
        free(m->agents[i].pids), free(m->agents[i].speed);
    for (int i = 0; i < m->n_kvs; i++)
        cJSON_Delete(m->kvs[i].entries);
    free(m->kvs);
    free(m->agents);
    free(m->slots);
    free(m->fail_t);
    free(m->plan.json);
    free(m->plan.batch_split);
    adt_elastic_job_spec_free(&m->spec);
    m_dash_free(m);
    free(m->job_dir);
    free(m->listen);
    free(m->token);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}
