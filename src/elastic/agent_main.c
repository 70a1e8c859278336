/*
 * agent_main.c - adt_agent_run: the per-node agent of an elastic job.
 *
 * One thread, one loop: curl_multi_poll waits on the master transfers (libcurl) and on the
 * world's descriptors (adtrain/agent.h) at once, so a death is reported the moment the world
 * sees it, while a heartbeat long-poll is outstanding. Up to one transfer of each kind is in
 * flight:
 *   register   until the master knows this agent (again: after a master that forgot it, or
 *              that declared it dead)
 *   heartbeat  a long-poll: the master answers when the plan changes, or after ~1 s; its
 *              arrival is the heartbeat. The reply is the plan: the generation, its state, this
 *              node's part of the world, whether the job is over.
 *   event      started / rank_failed / world_done, in order, each until acknowledged
 *   kvs        the PMI key-value exchange of a world spread over several agents (the world's
 *              barrier hook), held by the master until every agent of the world arrived
 *   leave      asked to leave (a first SIGTERM): the master stops the world at a step
 *              boundary and plans the next one without this node
 * Every message carries `seq`, the agent's count of world-state changes, so the master never
 * lets an older message (a heartbeat that overtook an event) undo a newer one.
 *
 * The plan is applied after every reply: a world of another generation than the one assigned
 * is stopped; an assigned generation not started yet is started once the old world is gone. A
 * world this node started is never started again, whatever happens to it: the master decides
 * the next generation. Without a reply from the master for master_grace_s the workers are
 * stopped (they could not report or commit anyway, and a partitioned node must not train on);
 * after master_timeout_s the agent gives up.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "elastic/http_internal.h"
#include "elastic/wire_internal.h"

typedef enum { XF_REGISTER, XF_HEARTBEAT, XF_EVENT, XF_KVS, XF_LEAVE, XF_N } xf_kind;
static const char *const k_xf_name[XF_N] = {"register", "heartbeat", "event", "kvs", "leave"};

typedef struct assignment {
    int world_size, local_size, rank_offset, group_rank, n_groups, restart_count, max_restarts;
    int group_sizes[1024];
    char run_id[64];
} assignment;

typedef struct agent {
    const adt_agent_config *cfg;
    char node[128], host[128], master_host[256];
    int master_port;
    CURLM *multi;
    eh_req x[XF_N];
    int busy[XF_N];
    double next[XF_N]; /* mono: not before */

    int64_t id;
    int64_t seq;
    /* the plan, as last received */
    int64_t version;
    int64_t plan_gen;
    char plan_state[16], job_state[16], reason[1100];
    int assigned;
    assignment as;
    double hb_s;

    /* the world */
    adt_world *w;
    int64_t w_gen, last_started;
    int w_stopping;

    /* events to send, in order (JSON text) */
    char **evq;
    int evq_n;

    /* the pending PMI barrier */
    int kvs_pending, kvs_epoch, kvs_first_new;

    double last_ok; /* mono: the master's last reply */
    int w_ok;       /* the world of w_gen ended with every rank exiting 0 */
    int lost;       /* stopped the world for want of a master */
    int leave;      /* 0, 1 = asked (to send), 2 = sent, 3 = forced */
    int finished;   /* the job is over: exit when the world is gone */
    int failed;     /* ... and it failed */
    int refused;    /* the master refused this agent for good (reason says why) */
} agent;

/* ---- messages ------------------------------------------------------------------------------ */
static void add_world_state(agent *a, cJSON *b) {
    cJSON_AddNumberToObject(b, "agent", (double)a->id);
    cJSON_AddNumberToObject(b, "seq", (double)a->seq);
    cJSON_AddNumberToObject(b, "pid", getpid());
    cJSON_AddNumberToObject(b, "generation", (double)a->w_gen);
    cJSON_AddNumberToObject(b, "running", a->w != NULL);
    cJSON_AddNumberToObject(b, "world_ok", a->w == NULL && a->w_ok);
    cJSON *p = cJSON_AddArrayToObject(b, "pids");
    for (int l = 0; a->w && l < adt_world_local_size(a->w); l++) {
        const adt_world_rank *ri = adt_world_rank_info(a->w, l);
        cJSON_AddItemToArray(p, cJSON_CreateNumber(ri->running ? ri->pid : 0));
    }
}

/* ev: a rank's failure, whose exit code and last stderr lines go with it (the master fails the
 * job at once on exit status 2, a usage error, and shows the worker's words); else NULL. */
static void queue_event(agent *a, const char *kind, int64_t gen, int rank, int ok, const char *msg,
                        const adt_world_event *ev) {
    cJSON *b = cJSON_CreateObject();
    add_world_state(a, b);
    cJSON_ReplaceItemInObject(b, "generation", cJSON_CreateNumber((double)gen));
    cJSON_AddStringToObject(b, "kind", kind);
    if (rank >= 0) cJSON_AddNumberToObject(b, "rank", rank);
    cJSON_AddNumberToObject(b, "ok", ok);
    if (msg) cJSON_AddStringToObject(b, "msg", msg);
    if (ev && ev->reason == ADT_FAIL_EXIT) cJSON_AddNumberToObject(b, "exit_code", ev->code);
    if (ev && ev->tail[0]) cJSON_AddStringToObject(b, "stderr", ev->tail);
    cJSON_AddNumberToObject(b, "t", adt_wall_s());
    a->evq = adt_realloc(a->evq, (size_t)(a->evq_n + 1) * sizeof *a->evq);
    a->evq[a->evq_n++] = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
}

static void start(agent *a, xf_kind k, const char *path, const char *body, long timeout_ms) {
    if (eh_req_setup(&a->x[k], a->cfg->master, a->cfg->token, "POST", path, body, timeout_ms)) {
        adt_log(ADT_LOG_ERROR, "agent: %s: %s", k_xf_name[k], adt_error_message());
        a->next[k] = adt_now_s() + 1;
        return;
    }
    curl_easy_setopt(a->x[k].e, CURLOPT_PRIVATE, (void *)(intptr_t)k);
    curl_multi_add_handle(a->multi, a->x[k].e);
    a->busy[k] = 1;
}

static void send_register(agent *a) {
    cJSON *b = cJSON_CreateObject();
    add_world_state(a, b);
    cJSON_AddStringToObject(b, "node", a->node);
    cJSON_AddStringToObject(b, "host", a->host);
    cJSON_AddNumberToObject(b, "slots", a->cfg->nproc);
    char *txt = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    start(a, XF_REGISTER, "/v1/agents", txt, 5000);
    free(txt);
}

static void send_heartbeat(agent *a) {
    cJSON *b = cJSON_CreateObject();
    add_world_state(a, b);
    long wait = (long)(a->hb_s * 1000);
    cJSON_AddNumberToObject(b, "version", (double)a->version);
    cJSON_AddNumberToObject(b, "wait_ms", (double)wait);
    char *txt = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    start(a, XF_HEARTBEAT, "/v1/agents/heartbeat", txt, wait + 4000);
    free(txt);
}

static void send_kvs(agent *a) {
    adt_pmi_server *s = adt_world_pmi(a->w);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddNumberToObject(b, "agent", (double)a->id);
    cJSON_AddNumberToObject(b, "generation", (double)a->w_gen);
    cJSON_AddNumberToObject(b, "epoch", a->kvs_epoch);
    cJSON_AddNumberToObject(b, "wait_ms", 10000);
    cJSON *e = cJSON_AddArrayToObject(b, "entries");
    for (int i = a->kvs_first_new; i < adt_pmi_kvs_count(s); i++) {
        const char *k, *v;
        adt_pmi_kvs_entry(s, i, &k, &v);
        cJSON *kv = cJSON_CreateArray();
        cJSON_AddItemToArray(kv, cJSON_CreateString(k));
        cJSON_AddItemToArray(kv, cJSON_CreateString(v));
        cJSON_AddItemToArray(e, kv);
    }
    char *txt = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    start(a, XF_KVS, "/v1/kvs", txt, 15000);
    free(txt);
}

static void send_leave(agent *a) {
    char body[64];
    snprintf(body, sizeof body, "{\"agent\":%lld}", (long long)a->id);
    start(a, XF_LEAVE, "/v1/agents/leave", body, 5000);
}

/* ---- the plan -------------------------------------------------------------------------------- */
static void read_plan(agent *a, const cJSON *r) {
    int64_t v;
    double hb;
    const char *s;
    if (wj_int(r, "agent", 1, INT64_MAX, 0, 0, &v) == ADT_OK) a->id = v;
    if (wj_int(r, "version", 0, INT64_MAX, 0, 0, &v) == ADT_OK) a->version = v;
    if (wj_int(r, "generation", 0, INT64_MAX, 0, 0, &v) == ADT_OK) a->plan_gen = v;
    if (wj_str(r, "state", 15, 0, &s) == ADT_OK) snprintf(a->plan_state, sizeof a->plan_state, "%s", s);
    if (wj_str(r, "job_state", 15, 0, &s) == ADT_OK) snprintf(a->job_state, sizeof a->job_state, "%s", s);
    if (wj_num(r, "heartbeat_s", 0.05, 60, 0, 1, &hb) == ADT_OK) a->hb_s = hb;
    if (wj_str(r, "reason", 1099, 0, &s) == ADT_OK) snprintf(a->reason, sizeof a->reason, "%s", s);
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(r, "assignment");
    a->assigned = 0;
    if (cJSON_IsObject(as)) {
        assignment x = {0};
        int64_t f[7];
        const char *run = NULL;
        const cJSON *gs = cJSON_GetObjectItemCaseSensitive(as, "group_sizes");
        if (wj_int(as, "world_size", 1, 1 << 20, 0, 0, &f[0]) || wj_int(as, "local_size", 1, 4096, 0, 0, &f[1]) ||
            wj_int(as, "rank_offset", 0, 1 << 20, 0, 0, &f[2]) || wj_int(as, "group_rank", 0, 1023, 0, 0, &f[3]) ||
            wj_int(as, "n_groups", 1, 1024, 0, 0, &f[4]) || wj_int(as, "restart_count", 0, INT32_MAX, 0, 0, &f[5]) ||
            wj_int(as, "max_restarts", 0, INT32_MAX, 0, 0, &f[6]) || wj_str(as, "run_id", 63, 0, &run) ||
            cJSON_GetArraySize(gs) != f[4]) {
            adt_log(ADT_LOG_ERROR, "agent: the master's assignment is malformed: %s", adt_error_message());
            return;
        }
        x.world_size = (int)f[0], x.local_size = (int)f[1], x.rank_offset = (int)f[2], x.group_rank = (int)f[3];
        x.n_groups = (int)f[4], x.restart_count = (int)f[5], x.max_restarts = (int)f[6];
        int i = 0;
        for (const cJSON *g = gs->child; g; g = g->next)
            x.group_sizes[i++] = cJSON_IsNumber(g) ? (int)g->valuedouble : 0;
        snprintf(x.run_id, sizeof x.run_id, "%s", run);
        a->as = x;
        a->assigned = 1;
    }
}

/* The barrier hook of a multi-agent world: the exchange goes through the master. */
static void on_barrier(void *ctx, int epoch, int first_new) {
    agent *a = ctx;
    a->kvs_pending = 1;
    a->kvs_epoch = epoch;
    a->kvs_first_new = first_new;
    a->next[XF_KVS] = 0;
}

static void start_world(agent *a) {
    const assignment *as = &a->as;
    int64_t gen = a->plan_gen;
    char envs[5][320];
    const char *env[64];
    int n = 0;
    snprintf(envs[0], sizeof envs[0], "ADT_MASTER=%s", a->cfg->master);
    snprintf(envs[1], sizeof envs[1], "ADT_GENERATION=%lld", (long long)gen);
    snprintf(envs[2], sizeof envs[2], "ADT_AGENT_ID=%lld", (long long)a->id);
    snprintf(envs[3], sizeof envs[3], "ADT_NODE_ID=%s", a->node); /* stable across the agent's restarts */
    snprintf(envs[4], sizeof envs[4], "ADT_JOB_TOKEN=%s", a->cfg->token ? a->cfg->token : "");
    for (int i = 0; i < 5; i++)
        if (i < 4 || (a->cfg->token && *a->cfg->token)) env[n++] = envs[i];
    for (const char *const *e = a->cfg->env; e && *e && n < 63; e++)
        env[n++] = *e;
    env[n] = NULL;
    adt_world_config wc = {.argv = a->cfg->argv,
                           .world_size = as->world_size,
                           .local_size = as->local_size,
                           .rank_offset = as->rank_offset,
                           .group_rank = as->group_rank,
                           .n_groups = as->n_groups,
                           .group_sizes = as->group_sizes,
                           .master_addr = a->master_host,
                           .master_port = a->master_port,
                           .restart_count = as->restart_count,
                           .max_restarts = as->max_restarts,
                           .run_id = as->run_id,
                           .pmi = a->cfg->no_pmi ? ADT_PMI_OFF : ADT_PMI_FD,
                           .bind = a->cfg->bind,
                           .prefix_output = a->cfg->prefix_output,
                           .env = env,
                           .kill_grace_s = a->cfg->kill_grace_s,
                           .on_barrier = as->n_groups > 1 ? on_barrier : NULL,
                           .ctx = a};
    a->last_started = gen;
    a->seq++;
    a->w_ok = 0;
    if (adt_world_start(&a->w, &wc)) {
        char msg[400];
        snprintf(msg, sizeof msg, "node %s could not start its workers: %s", a->node, adt_error_message());
        adt_log(ADT_LOG_ERROR, "agent: %s", msg);
        a->w = NULL;
        a->w_gen = gen;
        queue_event(a, "world_done", gen, -1, 0, msg, NULL);
        return;
    }
    a->w_gen = gen;
    a->w_stopping = 0;
    a->kvs_pending = 0;
    adt_log(ADT_LOG_INFO, "agent: generation %lld: ranks %d..%d of %d", (long long)gen, as->rank_offset,
            as->rank_offset + as->local_size - 1, as->world_size);
    queue_event(a, "started", gen, -1, 1, NULL, NULL);
}

static void stop_world(agent *a, const char *why) {
    if (!a->w || a->w_stopping) return;
    adt_log(ADT_LOG_INFO, "agent: stopping the workers of generation %lld: %s", (long long)a->w_gen, why);
    adt_world_stop(a->w);
    a->w_stopping = 1;
}

static void apply_plan(agent *a) {
    if (!strcmp(a->job_state, "done") || !strcmp(a->job_state, "failed")) {
        a->finished = 1;
        a->failed = !strcmp(a->job_state, "failed");
        stop_world(a, "the job is over");
        return;
    }
    int run = !strcmp(a->plan_state, "running") || !strcmp(a->plan_state, "stopping");
    int64_t want = run && a->assigned && a->leave != 3 ? a->plan_gen : 0;
    if (a->w && a->w_gen != want) stop_world(a, want ? "a new generation" : "the generation ended");
    if (!a->w && want && want > a->last_started && !a->lost) start_world(a);
}

/* ---- replies -------------------------------------------------------------------------------- */
static void forget_registration(agent *a, const char *why) {
    adt_log(ADT_LOG_WARN, "agent: %s; registering again", why);
    stop_world(a, why);
    a->id = -a->id; /* re-register under the same id */
    a->version = -1;
}

static void on_done(agent *a, xf_kind k, CURLcode cc) {
    double now = adt_now_s();
    eh_req *r = &a->x[k];
    long status = cc == CURLE_OK ? eh_req_status(r) : 0;
    cJSON *reply = status ? cJSON_Parse(eh_req_reply(r)) : NULL;
    a->busy[k] = 0;
    if (status) a->last_ok = now;
    if (status && a->lost) {
        adt_log(ADT_LOG_INFO, "agent: the master answers again");
        a->lost = 0;
    }
    if (!status) {
        adt_log(ADT_LOG_DEBUG, "agent: %s: %s", k_xf_name[k], r->err[0] ? r->err : curl_easy_strerror(cc));
        a->next[k] = now + (k == XF_HEARTBEAT || k == XF_REGISTER ? 0.2 : 0.1);
    } else if (status == 401) { /* a wrong token never heals */
        eh_reply_status(status, eh_req_reply(r), k_xf_name[k]);
        snprintf(a->reason, sizeof a->reason, "%s", adt_error_message());
        adt_log(ADT_LOG_ERROR, "agent: %s", a->reason);
        a->finished = a->failed = a->refused = 1;
        stop_world(a, "refused by the master");
    } else if (status == 404 || status == 410) {
        if (k != XF_REGISTER) forget_registration(a, eh_req_reply(r));
        a->next[k] = now + 0.1;
    } else if (k == XF_REGISTER || k == XF_HEARTBEAT || k == XF_LEAVE) {
        if (status == 200 && reply) {
            int64_t before = a->id;
            read_plan(a, reply);
            if (k == XF_REGISTER)
                adt_log(ADT_LOG_INFO, "agent: registered as agent %lld (node %s, %d slots)%s", (long long)a->id,
                        a->node, a->cfg->nproc, before < 0 ? " again" : "");
            if (k == XF_LEAVE) a->leave = a->leave == 1 ? 2 : a->leave;
            apply_plan(a);
            a->next[k] = now;
        } else {
            eh_reply_status(status, eh_req_reply(r), k_xf_name[k]);
            adt_log(ADT_LOG_ERROR, "agent: %s", adt_error_message());
            a->next[k] = now + 1;
            /* refused for good: a bad token or flags; another agent took this node id over */
            if ((k == XF_REGISTER && status >= 400 && status < 500) || (k == XF_HEARTBEAT && status == 409)) {
                snprintf(a->reason, sizeof a->reason, "%s", adt_error_message());
                a->finished = a->failed = a->refused = 1;
                stop_world(a, "refused by the master");
            }
        }
    } else if (k == XF_EVENT) {
        if (status >= 500) {
            a->next[k] = now + 0.1;
        } else {
            if (status != 200) {
                eh_reply_status(status, eh_req_reply(r), "event");
                adt_log(ADT_LOG_WARN, "agent: dropped an event: %s", adt_error_message());
            }
            free(a->evq[0]);
            memmove(a->evq, a->evq + 1, (size_t)--a->evq_n * sizeof *a->evq);
            a->next[k] = now;
        }
    } else if (k == XF_KVS) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(reply, "entries");
        if (status == 200 && cJSON_IsArray(e) && a->w && a->kvs_pending) {
            adt_pmi_server *s = adt_world_pmi(a->w);
            for (const cJSON *kv = e->child; kv; kv = kv->next) {
                const cJSON *kk = cJSON_GetArrayItem(kv, 0), *vv = cJSON_GetArrayItem(kv, 1);
                if (cJSON_IsString(kk) && cJSON_IsString(vv) && !adt_pmi_kvs_get(s, kk->valuestring))
                    adt_pmi_kvs_put(s, kk->valuestring, vv->valuestring);
            }
            a->kvs_pending = 0;
            adt_pmi_server_barrier_release(s);
        } else if (status == 409) {
            a->kvs_pending = 0;
            stop_world(a, "the generation ended during MPI start-up");
        } else {
            a->next[k] = now + (status == 504 ? 0 : 0.2);
        }
    }
    cJSON_Delete(reply);
}

/* ---- the loop ------------------------------------------------------------------------------- */
static void world_events(agent *a) {
    adt_world_event ev;
    while (a->w && adt_world_next_event(a->w, &ev)) {
        if (ev.kind == ADT_WORLD_EV_RANK_FAILED) {
            adt_log(ADT_LOG_WARN, "agent: generation %lld: %s", (long long)a->w_gen, ev.msg);
            a->seq++;
            if (!a->w_stopping) queue_event(a, "rank_failed", a->w_gen, ev.rank, 0, ev.msg, &ev);
        } else if (ev.kind == ADT_WORLD_EV_DONE) {
            int ok = adt_world_result_of(a->w) == ADT_WORLD_SUCCEEDED;
            int64_t gen = a->w_gen;
            adt_world_free(a->w);
            a->w = NULL;
            a->w_ok = ok;
            a->w_stopping = 0;
            a->kvs_pending = 0;
            a->seq++;
            adt_log(ADT_LOG_INFO, "agent: generation %lld: workers ended (%s)", (long long)gen,
                    ok ? "all exited 0" : "failed or stopped");
            queue_event(a, "world_done", gen, -1, ok, ok ? "every rank exited 0" : "failed or stopped", NULL);
        }
    }
}

static int setup(agent *a, const adt_agent_config *cfg) {
    a->cfg = cfg;
    if (!cfg->argv || !cfg->argv[0]) return adt_error(ADT_ERR_ARG, "agent: no worker command (after --)");
    if (cfg->nproc < 1 || cfg->nproc > 4096)
        return adt_error(ADT_ERR_ARG, "--nproc-per-node %d, expected 1..4096", cfg->nproc);
    int rc = eh_parse_hostport(cfg->master, a->master_host, sizeof a->master_host, &a->master_port, "--master");
    if (rc) return rc;
    if (a->master_port == 0)
        return adt_error(ADT_ERR_ARG, "--master %s: port 0, expected the master's port", cfg->master);
    char hn[128] = "localhost";
    gethostname(hn, sizeof hn - 1);
    snprintf(a->host, sizeof a->host, "%s", cfg->host ? cfg->host : hn);
    snprintf(a->node, sizeof a->node, "%s", cfg->node_id ? cfg->node_id : hn);
    if (!a->node[0]) return adt_error(ADT_ERR_ARG, "--node-id: empty");
    a->multi = curl_multi_init();
    if (!a->multi) return adt_error(ADT_ERR_NOMEM, "agent: curl_multi_init failed");
    a->hb_s = 1;
    a->version = -1;
    a->last_ok = adt_now_s();
    snprintf(a->job_state, sizeof a->job_state, "waiting");
    return ADT_OK;
}

int adt_agent_run(const adt_agent_config *cfg_in) {
    adt_agent_config cfg = *cfg_in;
    if (cfg.master_grace_s <= 0) cfg.master_grace_s = 10;
    if (cfg.master_timeout_s <= 0) cfg.master_timeout_s = 60;
    if (cfg.master_timeout_s < cfg.master_grace_s) cfg.master_timeout_s = cfg.master_grace_s;
    if (cfg.kill_grace_s == 0) cfg.kill_grace_s = 0.5;
    agent A = {0}, *a = &A;
    int rc = setup(a, &cfg);
    if (rc) return rc;
    int result = ADT_OK;
    for (;;) {
        double now = adt_now_s();
        /* what to send */
        if (a->id <= 0 && !a->busy[XF_REGISTER] && now >= a->next[XF_REGISTER] && !a->finished) {
            a->id = -a->id;
            send_register(a);
        }
        if (a->id > 0 && !a->busy[XF_REGISTER]) {
            if (!a->busy[XF_HEARTBEAT] && now >= a->next[XF_HEARTBEAT] && !a->finished) send_heartbeat(a);
            if (a->evq_n && !a->busy[XF_EVENT] && now >= a->next[XF_EVENT])
                start(a, XF_EVENT, "/v1/agents/event", a->evq[0], 5000);
            if (a->kvs_pending && a->w && !a->busy[XF_KVS] && now >= a->next[XF_KVS]) send_kvs(a);
            if (a->leave == 1 && !a->busy[XF_LEAVE] && now >= a->next[XF_LEAVE]) send_leave(a);
        }
        /* wait for the master and the workers at once */
        struct pollfd pf[512];
        struct curl_waitfd wf[512];
        int n = a->w ? adt_world_pollfds(a->w, pf, 510) : 0;
        if (cfg.stop_fd >= 0) pf[n++] = (struct pollfd){.fd = cfg.stop_fd, .events = POLLIN};
        for (int i = 0; i < n; i++)
            wf[i] = (struct curl_waitfd){.fd = pf[i].fd, .events = (short)(pf[i].events & 7)};
        int timeout = 100, wt = a->w ? adt_world_timeout_ms(a->w) : -1;
        if (wt >= 0 && wt < timeout) timeout = wt;
        curl_multi_poll(a->multi, wf, (unsigned)n, timeout, NULL);
        /* curl passes on POLLIN/OUT/PRI only; a pipe's EOF is POLLHUP alone, so look again */
        for (int i = 0; i < n; i++)
            pf[i].revents = 0;
        if (n) poll(pf, (nfds_t)n, 0);
        int running;
        curl_multi_perform(a->multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(a->multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            void *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(a->multi, msg->easy_handle);
            on_done(a, (xf_kind)(intptr_t)priv, cc);
        }
        if (a->w) {
            int nw = cfg.stop_fd >= 0 ? n - 1 : n;
            adt_world_dispatch(a->w, pf, nw);
            world_events(a);
        }
        if (cfg.stop_fd >= 0 && (pf[n - 1].revents & (POLLIN | POLLHUP))) {
            char b[16];
            if (read(cfg.stop_fd, b, sizeof b) <= 0 && errno != EINTR && errno != EAGAIN) cfg.stop_fd = -1;
            if (a->leave == 0 && a->id > 0 && !a->finished) {
                adt_log(ADT_LOG_INFO,
                        "agent: leaving the job after the workers stop at a step boundary (again: at once)");
                a->leave = 1;
            } else {
                adt_log(ADT_LOG_INFO, "agent: leaving the job now");
                a->leave = 3;
                a->finished = 1;
                stop_world(a, "the agent leaves");
            }
        }
        /* a leave is complete once the master planned without this node and the workers are gone */
        if (a->leave == 2 && !a->w && !a->assigned) a->finished = 1;
        /* the master's silence */
        now = adt_now_s();
        if (!a->finished && now - a->last_ok > cfg.master_grace_s && a->w && !a->lost) {
            adt_log(ADT_LOG_WARN, "agent: no answer from the master %s for %.0f s", cfg.master, now - a->last_ok);
            a->lost = 1;
            stop_world(a, "lost the master");
        }
        if (now - a->last_ok > cfg.master_timeout_s) {
            result =
                adt_error(ADT_ERR_IO, "agent: the master %s did not answer for %.0f s", cfg.master, now - a->last_ok);
            a->finished = a->failed = 1;
            stop_world(a, "giving up on the master");
        }
        if (a->finished && !a->w && (!a->evq_n || now - a->last_ok > 1 || a->failed)) break;
    }
    if (a->w) adt_world_free(a->w);
    for (int k = 0; k < XF_N; k++) {
        if (a->busy[k]) curl_multi_remove_handle(a->multi, a->x[k].e);
        eh_req_free(&a->x[k]);
    }
    curl_multi_cleanup(a->multi);
    for (int i = 0; i < a->evq_n; i++)
        free(a->evq[i]);
    free(a->evq);
    if (result == ADT_OK && a->leave >= 2) result = adt_error(ADT_ERR_STATE, "agent: left the job");
    if (result == ADT_OK && a->failed)
        result = adt_error(ADT_ERR_STATE, "agent: %s: %s", a->refused ? "refused by the master" : "the job failed",
                           a->reason);
    return result;
}
