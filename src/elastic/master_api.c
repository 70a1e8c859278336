/*
 * master_api.c - adt_master_handle: the master's HTTP+JSON API (docs/formats.md, "Master API").
 *
 * Every request is checked before anything changes: the token (when the master has one), the
 * method and path, the body (a JSON object), every field (type and range; the error names the
 * field). A refused request changes nothing and gets 4xx with {"error": "..."}: 400 malformed,
 * 401 no or wrong token, 404 unknown path or agent, 405 wrong method, 409 fenced (a request of a
 * generation that ended), 410 an agent the master declared dead, 422 refused by the ledger,
 * 503 not ready (no data job, no world yet). The data calls are fenced twice: here by
 * (generation, state), and in the ledger by its own generation and the lease's.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "elastic/master_internal.h"
#include "elastic/wire_internal.h"

/* ---- replies -------------------------------------------------------------------------------- */
static void reply_text(adt_http_reply *rp, int status, const char *type, char *body) {
    rp->status = status;
    rp->content_type = type;
    rp->body = body ? body : adt_strdup("");
    rp->len = strlen(rp->body);
}

static void reply_json(adt_http_reply *rp, int status, cJSON *o) {
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    reply_text(rp, status, "application/json", txt);
}

static void reply_error(adt_http_reply *rp, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reply_error(adt_http_reply *rp, int status, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    if (status == 409) cJSON_AddBoolToObject(o, "stale", 1);
    reply_json(rp, status, o);
}

/* A malformed field (a wj_* check failed): 400 with its message. Returns rc, for
 * `if (bad_field(rp, wj_int(...) || ...)) return;`. */
static int bad_field(adt_http_reply *rp, int rc) {
    if (rc) reply_error(rp, 400, "%s", adt_error_message());
    return rc;
}

/* A failed library call: its adt_status as an HTTP status, its message as the error. */
static void reply_status(adt_http_reply *rp, int rc) {
    int http = rc == ADT_ERR_STALE ? 409 : rc == ADT_ERR_ARG || rc == ADT_ERR_STATE ? 422 : 500;
    reply_error(rp, http, "%s", adt_error_message());
}

void m_reply_json(adt_http_reply *rp, int status, cJSON *o) { reply_json(rp, status, o); }

void m_reply_error(adt_http_reply *rp, int status, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_error(rp, status, "%s", msg);
}

void adt_http_reply_free(adt_http_reply *rp) {
    free(rp->body);
    rp->body = NULL;
    rp->len = 0;
}

static const char *query_arg(const adt_http_request *rq, const char *key) {
    for (const char *const *q = rq->query; q && q[0] && q[1]; q += 2)
        if (!strcmp(q[0], key)) return q[1];
    return NULL;
}

/* A non-negative integer query argument; -1 if malformed, def if absent. */
static int64_t query_int(const adt_http_request *rq, const char *key, int64_t def) {
    const char *v = query_arg(rq, key);
    if (!v) return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    return *v && !*end && x >= 0 ? (int64_t)x : -1;
}

/* ---- the objects ---------------------------------------------------------------------------- */
static cJSON *assignment_json(adt_master *m, const m_slot *sl) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "world_size", m->world_size);
    cJSON_AddNumberToObject(o, "local_size", sl->local_size);
    cJSON_AddNumberToObject(o, "rank_offset", sl->rank_offset);
    cJSON_AddNumberToObject(o, "group_rank", sl->group_rank);
    cJSON_AddNumberToObject(o, "n_groups", m->n_slots);
    cJSON *gs = cJSON_AddArrayToObject(o, "group_sizes");
    for (int i = 0; i < m->n_slots; i++)
        cJSON_AddItemToArray(gs, cJSON_CreateNumber(m->slots[i].local_size));
    cJSON_AddNumberToObject(o, "restart_count", m->restarts);
    cJSON_AddNumberToObject(o, "max_restarts", m->cfg.max_restarts);
    cJSON_AddStringToObject(o, "run_id", m->run_id);
    return o;
}

/* What an agent is told: the generation, its part of the world (if any), whether to exit. */
static cJSON *plan_json(adt_master *m, const m_agent *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "agent", (double)a->id);
    cJSON_AddNumberToObject(o, "version", (double)m->version);
    cJSON_AddNumberToObject(o, "generation", (double)m->gen);
    cJSON_AddStringToObject(o, "state", m_gstate_name(m->gstate));
    static const char *const js[] = {"waiting", "running", "done", "failed"};
    cJSON_AddStringToObject(o, "job_state", js[m_job_state(m)]);
    cJSON_AddNumberToObject(o, "heartbeat_s", m->hb_s);
    cJSON_AddStringToObject(o, "reason", m->greason);
    m_slot *sl = m_slot_of(m, a->id);
    if ((m->gstate == G_RUNNING || m->gstate == G_STOPPING) && sl)
        cJSON_AddItemToObject(o, "assignment", assignment_json(m, sl));
    if (m->gstate == G_STOPPING) cJSON_AddNumberToObject(o, "stop_at", (double)m->stop_at);
    return o;
}

int64_t m_job_steps(const adt_master *m) {
    int64_t steps = adt_ledger_job_steps(&m->job);
    return m->run_steps > 0 && m->run_steps < steps ? m->run_steps : steps;
}

/* The ledger's status as /v1/job and /v1/shards show it. */
static cJSON *ledger_status_json(adt_master *m, const adt_ledger_status *st) {
    cJSON *l = cJSON_CreateObject();
    cJSON_AddNumberToObject(l, "generation", (double)st->generation);
    cJSON_AddNumberToObject(l, "committed_steps", (double)st->committed_steps);
    cJSON_AddNumberToObject(l, "total_steps", (double)m_job_steps(m));
    cJSON_AddStringToObject(l, "checkpoint", st->checkpoint);
    cJSON_AddNumberToObject(l, "next_step", (double)st->next_step);
    cJSON_AddNumberToObject(l, "epochs_opened", (double)st->epochs_opened);
    cJSON_AddNumberToObject(l, "pool_samples", (double)st->pool_samples);
    cJSON_AddNumberToObject(l, "leased_samples", (double)st->leased_samples);
    cJSON_AddNumberToObject(l, "uncommitted_samples", (double)st->uncommitted);
    cJSON_AddNumberToObject(l, "committed_samples", (double)st->committed);
    cJSON_AddNumberToObject(l, "dead_samples", (double)st->dead_samples);
    cJSON_AddNumberToObject(l, "active_leases", (double)st->active_leases);
    cJSON_AddBoolToObject(l, "done", st->done);
    return l;
}

static cJSON *job_json(adt_master *m) {
    cJSON *o = cJSON_CreateObject();
    static const char *const js[] = {"waiting", "running", "done", "failed"};
    cJSON_AddStringToObject(o, "run_id", m->run_id);
    cJSON_AddStringToObject(o, "job_state", js[m_job_state(m)]);
    cJSON_AddNumberToObject(o, "generation", (double)m->gen);
    cJSON_AddStringToObject(o, "state", m_gstate_name(m->gstate));
    cJSON_AddStringToObject(o, "reason", m->greason);
    cJSON_AddNumberToObject(o, "world_size", m->world_size);
    cJSON_AddNumberToObject(o, "replicas", m->replicas);
    cJSON_AddNumberToObject(o, "ranks_per_replica", m->rpr);
    cJSON_AddNumberToObject(o, "idle_replicas", m->idle);
    cJSON_AddNumberToObject(o, "restarts", m->restarts);
    cJSON_AddNumberToObject(o, "max_restarts", m->cfg.max_restarts);
    cJSON_AddNumberToObject(o, "restart_window_s", m->cfg.restart_window_s);
    cJSON_AddNumberToObject(o, "planned_changes", m->planned_changes);
    cJSON_AddNumberToObject(o, "nnodes_min", m->cfg.nnodes_min);
    cJSON_AddNumberToObject(o, "nnodes_max", m->cfg.nnodes_max);
    cJSON_AddNumberToObject(o, "target_workers", m->target_workers);
    cJSON_AddNumberToObject(o, "target_nodes", m->target_nodes);
    int alive = 0;
    for (int i = 0; i < m->n_agents; i++)
        alive += m->agents[i].alive;
    cJSON_AddNumberToObject(o, "agents_alive", alive);
    cJSON_AddNumberToObject(o, "stop_at", (double)m->stop_at);
    if (m->last_recovery_s >= 0) cJSON_AddNumberToObject(o, "last_recovery_s", m->last_recovery_s);
    cJSON_AddNumberToObject(o, "uptime_s", adt_wall_s() - m->started_wall);
    cJSON_AddItemToObject(o, "data", m->have_job ? wj_job_to_json(&m->job) : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "spec", wj_spec_to_json(&m->spec));
    if (m->cfg.plan_world && m->plan_gen == m->gen && m->gen > 0) {
        cJSON *p = cJSON_AddObjectToObject(o, "plan");
        cJSON_AddNumberToObject(p, "generation", (double)m->plan_gen);
        cJSON_AddStringToObject(p, "strategy", m->plan.json ? m->plan.strategy : "dp (no plan file)");
        cJSON_AddStringToObject(p, "mesh", m->plan.mesh);
        cJSON_AddNumberToObject(p, "predicted_step_s", m->plan.predicted_step_s);
        cJSON_AddStringToObject(p, "note", m->plan.note);
        cJSON_AddNumberToObject(p, "planning_s", m->plan_s);
    } else {
        cJSON_AddNullToObject(o, "plan");
    }
    adt_ledger_status st;
    if (m->L && adt_ledger_get_status(m->L, &st) == ADT_OK) {
        cJSON_AddItemToObject(o, "ledger", ledger_status_json(m, &st));
    } else {
        cJSON_AddNullToObject(o, "ledger");
    }
    return o;
}

static cJSON *generation_json(adt_master *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "generation", (double)m->gen);
    cJSON_AddStringToObject(o, "state", m_gstate_name(m->gstate));
    cJSON_AddStringToObject(o, "reason", m->greason);
    cJSON_AddNumberToObject(o, "world_size", m->world_size);
    cJSON_AddNumberToObject(o, "replicas", m->replicas);
    cJSON_AddNumberToObject(o, "first_step", (double)m->gen_first_step);
    cJSON_AddNumberToObject(o, "max_reported_step", (double)m->max_reported);
    cJSON_AddNumberToObject(o, "stop_at", (double)m->stop_at);
    cJSON_AddNumberToObject(o, "restarts", m->restarts);
    cJSON *arr = cJSON_AddArrayToObject(o, "world");
    for (int i = 0; i < m->n_slots; i++) {
        const m_slot *s = &m->slots[i];
        const m_agent *a = m_agent_find(m, s->agent);
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "agent", (double)s->agent);
        cJSON_AddStringToObject(x, "node", a ? a->node : "?");
        cJSON_AddNumberToObject(x, "group_rank", s->group_rank);
        cJSON_AddNumberToObject(x, "rank_offset", s->rank_offset);
        cJSON_AddNumberToObject(x, "local_size", s->local_size);
        cJSON_AddItemToArray(arr, x);
    }
    return o;
}

static cJSON *agents_json(adt_master *m) {
    cJSON *arr = cJSON_CreateArray();
    double now = adt_now_s(), wall = adt_wall_s();
    for (int i = 0; i < m->n_agents; i++) {
        const m_agent *a = &m->agents[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", (double)a->id);
        cJSON_AddStringToObject(x, "node", a->node);
        cJSON_AddStringToObject(x, "host", a->host);
        cJSON_AddNumberToObject(x, "slots", a->slots);
        cJSON_AddNumberToObject(x, "pid", a->pid);
        cJSON_AddBoolToObject(x, "alive", a->alive);
        cJSON_AddBoolToObject(x, "leaving", a->leaving);
        cJSON_AddBoolToObject(x, "in_world", m_slot_of(m, a->id) != NULL);
        cJSON_AddNumberToObject(x, "world_generation", (double)a->world_gen);
        cJSON_AddBoolToObject(x, "world_running", a->world_running);
        cJSON_AddNumberToObject(x, "failures", a->failures);
        cJSON_AddNumberToObject(x, "cooldown_s", a->cooldown_until > wall ? a->cooldown_until - wall : 0);
        cJSON_AddNumberToObject(x, "last_seen_s", now - a->last_seen);
        cJSON_AddItemToArray(arr, x);
    }
    return arr;
}

static cJSON *workers_json(adt_master *m) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < m->n_slots; i++) {
        const m_slot *s = &m->slots[i];
        const m_agent *a = m_agent_find(m, s->agent);
        for (int l = 0; l < s->local_size; l++) {
            cJSON *x = cJSON_CreateObject();
            int rank = s->rank_offset + l;
            cJSON_AddNumberToObject(x, "rank", rank);
            cJSON_AddNumberToObject(x, "local_rank", l);
            cJSON_AddNumberToObject(x, "replica", rank / m->rpr);
            cJSON_AddNumberToObject(x, "agent", (double)s->agent);
            cJSON_AddStringToObject(x, "node", a ? a->node : "?");
            int pid = a && a->world_gen == m->gen && a->world_running && l < a->n_pids ? a->pids[l] : 0;
            cJSON_AddNumberToObject(x, "pid", pid);
            cJSON_AddItemToArray(arr, x);
        }
    }
    return arr;
}

/* ---- read-only endpoints -------------------------------------------------------------------- */
static void ep_shards(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    if (!m->L) {
        reply_error(rp, 503, "no data ledger yet (no data job declared, or no world formed)");
        return;
    }
    const char *which = query_arg(rq, "leases");
    int all = which && !strcmp(which, "all");
    if (which && !all && strcmp(which, "active")) {
        reply_error(rp, 400, "query 'leases': expected 'active' or 'all'");
        return;
    }
    adt_ledger_status st;
    adt_ledger_lease *ls = NULL;
    adt_ledger_dead *dd = NULL;
    int64_t nl = 0, nd = 0;
    int rc = adt_ledger_get_status(m->L, &st);
    if (!rc) rc = adt_ledger_leases(m->L, !all, &ls, &nl);
    if (!rc) rc = adt_ledger_dead_letters(m->L, &dd, &nd);
    if (rc) {
        free(ls);
        free(dd);
        reply_status(rp, rc);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *s = ledger_status_json(m, &st);
    cJSON_AddItemToObject(o, "status", s);
    cJSON_AddNumberToObject(s, "replicas", st.replicas);
    cJSON_AddNumberToObject(s, "shards_per_epoch", (double)adt_ledger_job_shards(&m->job));
    cJSON *la = cJSON_AddArrayToObject(o, "leases");
    for (int64_t i = 0; i < nl; i++)
        cJSON_AddItemToArray(la, wj_lease_to_json(&ls[i]));
    cJSON *da = cJSON_AddArrayToObject(o, "dead_letters");
    for (int64_t i = 0; i < nd; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "epoch", (double)dd[i].epoch);
        cJSON_AddNumberToObject(x, "shard", (double)dd[i].shard);
        cJSON_AddNumberToObject(x, "start", (double)dd[i].start);
        cJSON_AddNumberToObject(x, "end", (double)dd[i].end);
        cJSON_AddNumberToObject(x, "failures", dd[i].failures);
        cJSON_AddItemToArray(da, x);
    }
    free(ls);
    free(dd);
    reply_json(rp, 200, o);
}

typedef struct ev_line {
    double t;
    char *text;
} ev_line;

static int cmp_ev(const void *a, const void *b) {
    const ev_line *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

/* The master's and the ledger's events, merged by time, as JSON lines with "source". */
static void ep_events(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    int64_t after = query_int(rq, "after", 0), lafter = query_int(rq, "ledger_after", 0), max = query_int(rq, "max", 0);
    if (after < 0 || lafter < 0 || max < 0) {
        reply_error(rp, 400, "query 'after', 'ledger_after' and 'max' must be non-negative integers");
        return;
    }
    ev_line *ev = NULL;
    size_t n = 0;
    int64_t last;
    cJSON *arr = ms_events(m, after, max, &last);
    for (cJSON *o = arr->child; o; o = o->next) {
        cJSON_AddStringToObject(o, "source", "master");
        ev = adt_realloc(ev, (n + 1) * sizeof *ev);
        ev[n++] = (ev_line){cJSON_GetObjectItemCaseSensitive(o, "t")->valuedouble, cJSON_PrintUnformatted(o)};
    }
    cJSON_Delete(arr);
    if (m->L) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *f = open_memstream(&buf, &blen);
        if (f) {
            adt_ledger_events_export(m->L, f, lafter, max, NULL);
            fclose(f);
            for (char *line = buf, *nl; line && *line; line = nl ? nl + 1 : NULL) {
                nl = strchr(line, '\n');
                if (nl) *nl = 0;
                cJSON *o = cJSON_Parse(line);
                if (!o) continue;
                cJSON_AddStringToObject(o, "source", "ledger");
                ev = adt_realloc(ev, (n + 1) * sizeof *ev);
                ev[n++] = (ev_line){cJSON_GetObjectItemCaseSensitive(o, "t")->valuedouble, cJSON_PrintUnformatted(o)};
                cJSON_Delete(o);
            }
            free(buf);
        }
    }
    if (n) qsort(ev, n, sizeof *ev, cmp_ev);
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(ev[i].text) + 1;
    char *out = adt_malloc(len), *p = out;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(ev[i].text);
        memcpy(p, ev[i].text, k);
        p[k] = '\n';
        p += k + 1;
        free(ev[i].text);
    }
    *p = 0;
    free(ev);
    reply_text(rp, 200, "application/x-ndjson", out);
}

/* Prometheus text exposition format 0.0.4. */
static void ep_metrics(adt_master *m, adt_http_reply *rp) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        reply_error(rp, 500, "out of memory");
        return;
    }
#define GAUGE(name, help, fmt, ...)                                                                                    \
    fprintf(f, "# HELP " name " " help "\n# TYPE " name " gauge\n" name fmt "\n", __VA_ARGS__)
#define COUNTER(name, help, fmt, ...)                                                                                  \
    fprintf(f, "# HELP " name " " help "\n# TYPE " name " counter\n" name fmt "\n", __VA_ARGS__)
    GAUGE("adtrain_generation", "Current world generation.", " %lld", (long long)m->gen);
    fprintf(f, "# HELP adtrain_generation_state 1 for the state the generation is in.\n"
               "# TYPE adtrain_generation_state gauge\n");
    for (int s = G_WAITING; s <= G_FAILED; s++)
        fprintf(f, "adtrain_generation_state{state=\"%s\"} %d\n", m_gstate_name((m_gstate)s), m->gstate == (m_gstate)s);
    GAUGE("adtrain_world_size", "Ranks in the current world.", " %d", m->world_size);
    GAUGE("adtrain_replicas", "Data-parallel replicas in the current world.", " %d", m->replicas);
    int alive = 0, cooling = 0;
    double wall = adt_wall_s();
    for (int i = 0; i < m->n_agents; i++) {
        alive += m->agents[i].alive;
        cooling += m->agents[i].cooldown_until > wall;
    }
    GAUGE("adtrain_agents_alive", "Agents registered and heartbeating.", " %d", alive);
    GAUGE("adtrain_agents_blacklisted", "Agents whose node is cooling down after a failure.", " %d", cooling);
    COUNTER("adtrain_restarts_total", "Generations ended by a failure.", " %d", m->restarts);
    COUNTER("adtrain_planned_changes_total", "Generations ended by a planned change.", " %d", m->planned_changes);
    COUNTER("adtrain_deaths_total", "Ranks or agents that died.", " %lld", (long long)m->n_deaths);
    COUNTER("adtrain_heartbeat_misses_total", "Agents declared dead for missing heartbeats.", " %lld",
            (long long)m->n_heartbeat_miss);
    COUNTER("adtrain_stale_requests_total", "Requests refused because their generation had ended.", " %lld",
            (long long)m->n_stale);
    fprintf(f, "# HELP adtrain_http_requests_total Requests served, by status class.\n"
               "# TYPE adtrain_http_requests_total counter\n");
    for (int c = 1; c <= 5; c++)
        fprintf(f, "adtrain_http_requests_total{code=\"%dxx\"} %lld\n", c, (long long)m->n_requests[c]);
    fprintf(f, "# HELP adtrain_data_calls_total Workers' data calls answered, by call (step: a report and a "
               "lease in one).\n# TYPE adtrain_data_calls_total counter\n");
    for (int c = 0; c < DC_COUNT; c++)
        fprintf(f, "adtrain_data_calls_total{call=\"%s\"} %lld\n", (const char *[]){"lease", "report", "step"}[c],
                (long long)m->n_data_calls[c]);
    if (m->last_recovery_s >= 0)
        GAUGE("adtrain_last_recovery_seconds", "From the last failure to the first step of the next world.", " %.6f",
              m->last_recovery_s);
    adt_ledger_status st;
    if (m->L && adt_ledger_get_status(m->L, &st) == ADT_OK) {
        GAUGE("adtrain_ledger_committed_steps", "Steps in the committed checkpoint.", " %lld",
              (long long)st.committed_steps);
        GAUGE("adtrain_ledger_total_steps", "Steps of the whole job.", " %lld",
              (long long)m_job_steps(m));
        GAUGE("adtrain_ledger_pool_samples", "Samples waiting to be leased.", " %lld", (long long)st.pool_samples);
        GAUGE("adtrain_ledger_leased_samples", "Samples leased, not yet consumed.", " %lld",
              (long long)st.leased_samples);
        GAUGE("adtrain_ledger_uncommitted_samples", "Samples consumed after the last commit.", " %lld",
              (long long)st.uncommitted);
        GAUGE("adtrain_ledger_committed_samples", "Samples in the committed model.", " %lld", (long long)st.committed);
        GAUGE("adtrain_ledger_dead_samples", "Samples in the dead letters.", " %lld", (long long)st.dead_samples);
        GAUGE("adtrain_ledger_active_leases", "Leases held.", " %lld", (long long)st.active_leases);
    }
#undef GAUGE
#undef COUNTER
    fclose(f);
    reply_text(rp, 200, "text/plain; version=0.0.4", buf);
}

/* ---- agents --------------------------------------------------------------------------------- */
/* The world-state part of an agent's message: what generation its world is, whether it runs,
 * whether it ended with every rank exiting 0, its ranks' pids. Applied only if newer than what
 * the master has. The ending is in every message, not only in the world_done event: a master
 * that acknowledged the event and was killed before it wrote anything learns it again from the
 * agent's next heartbeat. */
static int apply_world_state(adt_master *m, m_agent *a, const cJSON *b, adt_http_reply *rp) {
    int64_t seq, gen, run, ended_ok;
    int rc;
    if (bad_field(rp, (rc = wj_int(b, "seq", 0, INT64_MAX, 1, 0, &seq)) ||
                          (rc = wj_int(b, "generation", 0, INT64_MAX, 1, 0, &gen)) ||
                          (rc = wj_int(b, "running", 0, 1, 1, 0, &run)) ||
                          (rc = wj_int(b, "world_ok", 0, 1, 1, 0, &ended_ok))))
        return rc;
    const cJSON *pids = cJSON_GetObjectItemCaseSensitive(b, "pids");
    if (pids && !cJSON_IsArray(pids)) {
        reply_error(rp, 400, "field 'pids': expected an array of integers");
        return ADT_ERR_ARG;
    }
    int np = cJSON_GetArraySize(pids);
    if (np > 4096) {
        reply_error(rp, 400, "field 'pids': more than 4096 entries");
        return ADT_ERR_ARG;
    }
    int *pv = np ? adt_calloc((size_t)np, sizeof *pv) : NULL;
    int k = 0;
    for (const cJSON *p = pids ? pids->child : NULL; p; p = p->next) {
        if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > INT32_MAX ||
            p->valuedouble != (double)(int)p->valuedouble) {
            free(pv);
            reply_error(rp, 400, "field 'pids': expected an array of non-negative integers");
            return ADT_ERR_ARG;
        }
        pv[k++] = (int)p->valuedouble;
    }
    if (seq < a->seq) {
        free(pv);
        return ADT_OK;
    }
    a->seq = seq;
    a->world_gen = gen;
    a->world_running = (int)run;
    if (pids) {
        free(a->pids);
        a->pids = pv;
        a->n_pids = np;
    } else {
        free(pv);
    }
    if (!run && ended_ok && gen == m->gen) a->world_ok = 1; /* heartbeats then check worlds_maybe_done */
    return ADT_OK;
}

static void ep_register(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    const char *node, *host;
    int64_t slots, pid, id;
    int rc;
    if (bad_field(rp, (rc = wj_str(b, "node", 127, 0, &node)) || (rc = wj_str(b, "host", 127, 1, &host)) ||
                          (rc = wj_int(b, "slots", 1, 4096, 0, 0, &slots)) ||
                          (rc = wj_int(b, "pid", 0, INT32_MAX, 1, 0, &pid)) ||
                          (rc = wj_int(b, "agent", 0, INT64_MAX, 1, 0, &id))))
        return;
    if (!node[0]) {
        reply_error(rp, 400, "field 'node': expected a non-empty string");
        return;
    }
    m_agent *a = id ? m_agent_find(m, id) : NULL;
    if (a && strcmp(a->node, node)) a = NULL; /* an id from another job's master */
    if (!a)
        for (int i = 0; i < m->n_agents && !a; i++)
            if (!strcmp(m->agents[i].node, node)) a = &m->agents[i];
    int fresh = !a, returning = a && !a->alive;
    if (a && a->alive && (a->pid != (int)pid || a->id != id)) {
        /* The node registered again under another process: the previous one is gone, and with
         * it its workers. */
        m_slot *sl = m_slot_of(m, a->id);
        if (sl && (m->gstate == G_RUNNING || m->gstate == G_STOPPING)) {
            char why[300];
            snprintf(why, sizeof why, "agent %lld (node %s) restarted as pid %lld", (long long)a->id, a->node,
                     (long long)pid);
            ms_event(m, "death", m->gen, a->id, -1, "%s", why);
            m->n_deaths++;
            if (m->L)
                for (int r = sl->rank_offset / m->rpr; r <= (sl->rank_offset + sl->local_size - 1) / m->rpr; r++)
                    adt_ledger_revoke_replica(m->L, m_ledger_gen(m), r, why, NULL);
            m_end_generation(m, why, 1, a->id);
        }
        a->seq = 0;
    }
    if (!a) {
        int64_t next = 1;
        for (int i = 0; i < m->n_agents; i++)
            if (m->agents[i].id >= next) next = m->agents[i].id + 1;
        m->agents = adt_realloc(m->agents, (size_t)(m->n_agents + 1) * sizeof *m->agents);
        a = &m->agents[m->n_agents++];
        memset(a, 0, sizeof *a);
        a->id = next;
        snprintf(a->node, sizeof a->node, "%s", node);
    }
    if (returning || fresh) a->seq = 0;
    snprintf(a->host, sizeof a->host, "%s", host ? host : "");
    a->slots = (int)slots;
    a->pid = (int)pid;
    a->alive = 1;
    a->leaving = 0;
    a->last_seen = adt_now_s();
    if (apply_world_state(m, a, b, rp)) return;
    if (fresh || returning) {
        m->last_join_mono = a->last_seen;
        ms_event(m, "join", m->gen, a->id, -1, "node %s host %s, %d slots, pid %d%s", a->node, a->host, a->slots,
                 a->pid, returning ? " (returning)" : "");
    } else {
        ms_event(m, "reconnect", m->gen, a->id, -1, "node %s, pid %d", a->node, a->pid);
    }
    ms_save(m);
    m_progress(m);
    m_changed(m);
    reply_json(rp, 200, plan_json(m, a));
}

/* The agent named by "agent"; replies 404/410 itself when there is none or it was declared
 * dead. */
static m_agent *body_agent(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    int64_t id;
    if (bad_field(rp, wj_int(b, "agent", 1, INT64_MAX, 0, 0, &id))) return NULL;
    m_agent *a = m_agent_find(m, id);
    if (!a) {
        reply_error(rp, 404, "agent %lld is unknown to this master: register again", (long long)id);
        return NULL;
    }
    if (!a->alive) {
        reply_error(rp, 410, "agent %lld (node %s) was declared dead: stop its workers and register again",
                    (long long)id, a->node);
        return NULL;
    }
    int64_t pid;
    if (bad_field(rp, wj_int(b, "pid", 0, INT32_MAX, 1, 0, &pid))) return NULL;
    if (pid && a->pid && pid != a->pid) {
        reply_error(rp, 409, "node %s is registered by another agent process (pid %d) now", a->node, a->pid);
        return NULL;
    }
    if (pid) a->pid = (int)pid;
    return a;
}

/* Waits on cv until `version` moves, the deadline passes or the master stops. */
static void wait_version(adt_master *m, uint64_t known, int64_t wait_ms) {
    if (wait_ms > m->max_wait_ms) wait_ms = m->max_wait_ms;
    if (wait_ms <= 0) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = ts.tv_nsec + (wait_ms % 1000) * 1000000;
    ts.tv_sec += wait_ms / 1000 + ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    while (m->version == known && !m->stopping)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts)) break;
}

static void worlds_maybe_done(adt_master *m);

static void ep_heartbeat(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    m_agent *a = body_agent(m, b, rp);
    if (!a) return;
    int64_t known, wait_ms;
    if (bad_field(rp, wj_int(b, "version", -1, INT64_MAX, 1, -1, &known) ||
                          wj_int(b, "wait_ms", 0, 600000, 1, 0, &wait_ms)))
        return;
    int64_t id = a->id;
    a->last_seen = adt_now_s();
    if (apply_world_state(m, a, b, rp)) return;
    worlds_maybe_done(m);
    m_progress(m);
    if (known == (int64_t)m->version) wait_version(m, m->version, wait_ms);
    /* the agents array may have moved while the lock was released */
    a = m_agent_find(m, id);
    if (!a || !a->alive) {
        reply_error(rp, 410, "agent %lld was declared dead: stop its workers and register again", (long long)id);
        return;
    }
    a->last_seen = adt_now_s();
    reply_json(rp, 200, plan_json(m, a));
}

static int all_worlds_ok(adt_master *m) {
    for (int i = 0; i < m->n_slots; i++) {
        const m_agent *a = m_agent_find(m, m->slots[i].agent);
        if (!a || a->world_gen != m->gen || a->world_running || !a->world_ok) return 0;
    }
    return m->n_slots > 0;
}

/* Every world of the current generation ended with its ranks exiting 0: the next generation
 * for a planned stop with work left, else the job is done (workers that exit 0 unasked are done,
 * whatever data is left). */
static void worlds_maybe_done(adt_master *m) {
    if (!(m->gstate == G_RUNNING || m->gstate == G_STOPPING) || !all_worlds_ok(m)) return;
    adt_ledger_status st;
    int done = m->L && adt_ledger_get_status(m->L, &st) == ADT_OK && st.done;
    if (m->gstate == G_STOPPING && !done) {
        m_end_generation(m, m->greason, 0, -1);
        return;
    }
    m->gstate = G_DONE;
    snprintf(m->greason, sizeof m->greason, "%s", done || !m->L ? "every rank exited 0" : "every rank exited 0 (data left)");
    ms_event(m, "job_done", m->gen, -1, -1, "%s", m->greason);
    ms_save(m);
    m_changed(m);
}

static void ep_agent_event(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    m_agent *a = body_agent(m, b, rp);
    if (!a) return;
    const char *kind, *msg, *tail;
    int64_t gen, rank, ok, code;
    double t;
    if (bad_field(rp, wj_str(b, "kind", 32, 0, &kind) || wj_int(b, "generation", 0, INT64_MAX, 0, 0, &gen) ||
                          wj_int(b, "rank", -1, INT32_MAX, 1, -1, &rank) || wj_int(b, "ok", 0, 1, 1, 0, &ok) ||
                          wj_str(b, "msg", 400, 1, &msg) || wj_num(b, "t", 0, 1e12, 1, 0, &t) ||
                          wj_int(b, "exit_code", -1, 255, 1, -1, &code) || wj_str(b, "stderr", 2048, 1, &tail)))
        return;
    int is_start = !strcmp(kind, "started"), is_fail = !strcmp(kind, "rank_failed"),
        is_done = !strcmp(kind, "world_done");
    if (!is_start && !is_fail && !is_done) {
        reply_error(rp, 400, "field 'kind': '%s', expected started, rank_failed or world_done", kind);
        return;
    }
    a->last_seen = adt_now_s();
    if (apply_world_state(m, a, b, rp)) return;
    int current = gen == m->gen && (m->gstate == G_RUNNING || m->gstate == G_STOPPING);
    if (is_done && gen == a->world_gen) a->world_ok = (int)ok;
    if (is_start) {
        ms_event(m, "started", gen, a->id, -1, "%d ranks", a->n_pids);
    } else if (is_fail) {
        ms_event(m, "death", gen, a->id, (int)rank, "%s", msg ? msg : "");
        if (current) {
            m->n_deaths++;
            if (m->L && rank >= 0)
                adt_ledger_revoke_replica(m->L, m_ledger_gen(m), (int)(rank / m->rpr), msg ? msg : "rank failed", NULL);
            if (m->fail_wall <= 0) m->fail_wall = t > 0 ? t : adt_wall_s();
            char why[2600];
            snprintf(why, sizeof why, "rank %lld on node %s failed: %s%s%s", (long long)rank, a->node, msg ? msg : "",
                     tail && *tail ? "; its last output: " : "", tail ? tail : "");
            if (code == 2) {
                /* exit status 2 is a usage error (a bad flag, config or data): every restart would
                 * fail the same way, so the job fails now, with the worker's own words */
                size_t k = strlen(why);
                snprintf(why + k, sizeof why - k, " (exit status 2, a usage error: not restarted)");
                m_fail_job(m, why);
            } else {
                m_end_generation(m, why, 1, a->id);
            }
        }
    } else {
        ms_event(m, "world_done", gen, a->id, -1, "%s", ok ? "every rank exited 0" : "failed");
        if (current && !ok) {
            char why[300];
            snprintf(why, sizeof why, "the world on node %s failed: %s", a->node, msg ? msg : "");
            m_end_generation(m, why, 1, a->id);
        } else if (current) {
            worlds_maybe_done(m);
        }
    }
    m_progress(m);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", 1);
    reply_json(rp, 200, o);
}

static void ep_leave(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    m_agent *a = body_agent(m, b, rp);
    if (!a) return;
    if (!a->leaving) {
        a->leaving = 1;
        ms_event(m, "leave", m->gen, a->id, -1, "node %s asked to leave", a->node);
        ms_save(m);
        if (m_slot_of(m, a->id)) m_request_stop(m, "an agent leaves");
        m_changed(m);
    }
    reply_json(rp, 200, plan_json(m, a));
}

/* ---- PMI barriers of worlds spread over several agents -------------------------------------- */
static m_kvs *kvs_find(adt_master *m, int64_t agent, int epoch) {
    for (int i = 0; i < m->n_kvs; i++)
        if (m->kvs[i].agent == agent && m->kvs[i].epoch == epoch) return &m->kvs[i];
    return NULL;
}

static int kvs_complete(adt_master *m, int epoch) {
    for (int i = 0; i < m->n_slots; i++)
        if (!kvs_find(m, m->slots[i].agent, epoch)) return 0;
    return 1;
}

static void ep_kvs(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    m_agent *a = body_agent(m, b, rp);
    if (!a) return;
    int64_t gen, epoch, wait_ms;
    if (bad_field(rp, wj_int(b, "generation", 1, INT64_MAX, 0, 0, &gen) ||
                          wj_int(b, "epoch", 0, 1 << 20, 0, 0, &epoch) ||
                          wj_int(b, "wait_ms", 0, 600000, 1, 0, &wait_ms)))
        return;
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(b, "entries");
    if (!cJSON_IsArray(entries) || cJSON_GetArraySize(entries) > 65536) {
        reply_error(rp, 400, "field 'entries': expected an array of [key, value] string pairs (at most 65536)");
        return;
    }
    for (const cJSON *e = entries->child; e; e = e->next) {
        const cJSON *k = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(k) || !cJSON_IsString(v) ||
            strlen(k->valuestring) >= ADT_PMI_KEYLEN_MAX || strlen(v->valuestring) >= ADT_PMI_VALLEN_MAX) {
            reply_error(rp, 400, "field 'entries': expected [key, value] string pairs (key < %d, value < %d bytes)",
                        ADT_PMI_KEYLEN_MAX, ADT_PMI_VALLEN_MAX);
            return;
        }
    }
    if (gen != m->gen || (m->gstate != G_RUNNING && m->gstate != G_STOPPING)) {
        m->n_stale++;
        reply_error(rp, 409, "generation %lld has ended (current %lld, %s)", (long long)gen, (long long)m->gen,
                    m_gstate_name(m->gstate));
        return;
    }
    if (!m_slot_of(m, a->id)) {
        reply_error(rp, 409, "agent %lld has no part in generation %lld", (long long)a->id, (long long)gen);
        return;
    }
    int64_t id = a->id;
    if (!kvs_find(m, id, (int)epoch)) {
        m->kvs = adt_realloc(m->kvs, (size_t)(m->n_kvs + 1) * sizeof *m->kvs);
        m->kvs[m->n_kvs++] = (m_kvs){id, (int)epoch, cJSON_Duplicate(entries, 1)};
        pthread_cond_broadcast(&m->cv);
    }
    if (wait_ms > m->max_wait_ms) wait_ms = m->max_wait_ms;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = ts.tv_nsec + (wait_ms % 1000) * 1000000;
    ts.tv_sec += wait_ms / 1000 + ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    while (!kvs_complete(m, (int)epoch) && gen == m->gen && (m->gstate == G_RUNNING || m->gstate == G_STOPPING) &&
           !m->stopping && wait_ms > 0)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts)) break;
    if (gen != m->gen || (m->gstate != G_RUNNING && m->gstate != G_STOPPING)) {
        reply_error(rp, 409, "generation %lld ended during the barrier", (long long)gen);
        return;
    }
    if (!kvs_complete(m, (int)epoch)) {
        reply_error(rp, 504, "barrier %lld of generation %lld: not every agent has arrived yet; ask again",
                    (long long)epoch, (long long)gen);
        return;
    }
    cJSON *o = cJSON_CreateObject(), *all = cJSON_AddArrayToObject(o, "entries");
    for (int i = 0; i < m->n_kvs; i++)
        if (m->kvs[i].epoch == (int)epoch && m->kvs[i].agent != id)
            for (const cJSON *e = m->kvs[i].entries->child; e; e = e->next)
                cJSON_AddItemToArray(all, cJSON_Duplicate(e, 1));
    reply_json(rp, 200, o);
}

/* ---- data (workers) -------------------------------------------------------------------------- */
/* The checks every data call shares: the ledger exists, the generation runs, the replica is one
 * of it. Replies itself and returns 0 when the request cannot go on. */
static int data_gate(adt_master *m, const cJSON *b, int64_t *gen, int64_t *replica, adt_http_reply *rp) {
    if (bad_field(rp, wj_int(b, "generation", 0, INT64_MAX, 0, 0, gen) ||
                          (replica && wj_int(b, "replica", 0, 1 << 20, 0, 0, replica))))
        return 0;
    if (*gen != m->gen || (m->gstate != G_RUNNING && m->gstate != G_STOPPING)) {
        m->n_stale++;
        /* the event log notes the first few of each generation, not a zombie's every retry */
        if (m->stale_gen != m->gen) m->stale_gen = m->gen, m->stale_logged = 0;
        if (m->stale_logged++ < 16)
            ms_event(m, "stale", *gen, -1, replica ? (int)*replica : -1,
                     "refused a request of generation %lld (current %lld, %s)", (long long)*gen, (long long)m->gen,
                     m_gstate_name(m->gstate));
        reply_error(rp, 409, "generation %lld has ended (current %lld, %s); refused", (long long)*gen,
                    (long long)m->gen, m_gstate_name(m->gstate));
        return 0;
    }
    if (m_ledger_ready(m)) {
        reply_error(rp, 503, "%s", adt_error_message());
        return 0;
    }
    if (replica && *replica >= m->replicas) {
        reply_error(rp, 422, "replica %lld out of range: generation %lld has %d replicas", (long long)*replica,
                    (long long)*gen, m->replicas);
        return 0;
    }
    return 1;
}

static void add_control(adt_master *m, cJSON *o) {
    cJSON_AddNumberToObject(o, "generation", (double)m->gen);
    cJSON_AddNumberToObject(o, "stop_at", m->gstate == G_STOPPING ? (double)m->stop_at : 0);
    if (m->gstate == G_RUNNING || m->gstate == G_STOPPING) m_split_reply(m, o);
}

static void ep_data_init(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    adt_ledger_job job;
    int64_t gen, rpr, idle, run_steps;
    if (bad_field(rp, wj_int(b, "generation", 0, INT64_MAX, 0, 0, &gen) ||
                          wj_int(b, "ranks_per_replica", 1, 1 << 20, 1, 1, &rpr) ||
                          wj_int(b, "idle_replicas", 0, 1 << 20, 1, 0, &idle) ||
                          wj_int(b, "run_steps", 0, INT64_MAX, 1, 0, &run_steps) ||
                          wj_job_from_json(cJSON_GetObjectItemCaseSensitive(b, "job"), &job)))
        return;
    if (job.global_batch > job.samples) {
        reply_error(rp, 422, "data job: global_batch %lld exceeds samples %lld", (long long)job.global_batch,
                    (long long)job.samples);
        return;
    }
    if (m->have_job) {
        if (!wj_job_equal(&job, &m->job) || rpr != m->rpr || idle != m->idle) {
            reply_error(rp, 422,
                        "data job, ranks_per_replica or idle_replicas differ from the ones declared before (GET "
                        "/v1/job shows them)");
            return;
        }
    } else {
        if (gen != m->gen || (m->gstate != G_RUNNING && m->gstate != G_STOPPING)) {
            m->n_stale++;
            reply_error(rp, 409, "generation %lld has ended (current %lld, %s)", (long long)gen, (long long)m->gen,
                        m_gstate_name(m->gstate));
            return;
        }
        if (rpr > m->world_size || m->world_size % rpr) {
            reply_error(rp, 422, "ranks_per_replica %lld does not divide the world of %d ranks", (long long)rpr,
                        m->world_size);
            return;
        }
        if (idle >= m->world_size / rpr) {
            reply_error(rp, 422, "idle_replicas %lld: the world of %d ranks has %lld replicas; expected fewer idle "
                        "ones (some must take samples)", (long long)idle, m->world_size, (long long)(m->world_size / rpr));
            return;
        }
        m->job = job;
        m->have_job = 1;
        m->rpr = (int)rpr;
        m->idle = (int)idle;
        m->replicas = m->world_size / m->rpr;
        ms_event(m, "data_job", m->gen, -1, -1, "%lld samples, batch %lld, shard %lld, %lld epochs",
                 (long long)job.samples, (long long)job.global_batch, (long long)job.shard_size, (long long)job.epochs);
        ms_save(m);
    }
    if (run_steps > 0 && run_steps != m->run_steps) { /* a resumed run may stop elsewhere: the latest says */
        m->run_steps = run_steps;
        ms_save(m);
    }
    if (!m->L && gen == m->gen && (m->gstate == G_RUNNING || m->gstate == G_STOPPING)) {
        int rc = m_ledger_ready(m);
        if (rc) {
            reply_status(rp, rc);
            return;
        }
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", 1);
    add_control(m, o);
    reply_json(rp, 200, o);
}

static void ep_data_info(adt_master *m, adt_http_reply *rp) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "generation", (double)m->gen);
    cJSON_AddStringToObject(o, "state", m_gstate_name(m->gstate));
    cJSON_AddBoolToObject(o, "running", m->gstate == G_RUNNING || m->gstate == G_STOPPING);
    cJSON_AddNumberToObject(o, "world_size", m->world_size);
    cJSON_AddNumberToObject(o, "replicas", m->replicas);
    cJSON_AddNumberToObject(o, "ranks_per_replica", m->rpr);
    cJSON_AddNumberToObject(o, "restarts", m->restarts);
    cJSON_AddNumberToObject(o, "stop_at", m->gstate == G_STOPPING ? (double)m->stop_at : 0);
    cJSON_AddItemToObject(o, "job", m->have_job ? wj_job_to_json(&m->job) : cJSON_CreateNull());
    adt_ledger_status st;
    if (m->L && adt_ledger_get_status(m->L, &st) == ADT_OK) {
        cJSON_AddNumberToObject(o, "committed_steps", (double)st.committed_steps);
        cJSON_AddStringToObject(o, "checkpoint", st.checkpoint);
    } else {
        cJSON_AddNumberToObject(o, "committed_steps", 0);
        cJSON_AddStringToObject(o, "checkpoint", "");
    }
    if (m->gstate == G_RUNNING || m->gstate == G_STOPPING) m_split_reply(m, o);
    reply_json(rp, 200, o);
}

/* A lease call's fields (max_samples, held); 0 with rp set when malformed. */
static int lease_fields(const cJSON *b, adt_http_reply *rp, int64_t *max_samples, const cJSON **held) {
    if (bad_field(rp, wj_int(b, "max_samples", 0, INT64_C(1) << 40, 1, 0, max_samples))) return 0;
    *held = cJSON_GetObjectItemCaseSensitive(b, "held");
    if (*held && (!cJSON_IsArray(*held) || cJSON_GetArraySize(*held) > 1024)) {
        reply_error(rp, 400, "field 'held': expected an array of lease ids (at most 1024)");
        return 0;
    }
    return 1;
}

/* The lease part of a request into o; 0 with rp set when refused. */
static int lease_part(adt_master *m, const cJSON *b, int64_t replica, cJSON *o, adt_http_reply *rp) {
    int64_t max_samples;
    const cJSON *held;
    if (!lease_fields(b, rp, &max_samples, &held)) return 0;
    /* A grant whose reply was lost: the replica holds it without knowing. Hand it out again. */
    adt_ledger_lease *ls = NULL, out = {0};
    int64_t nl = 0;
    int grant = -1, rc = adt_ledger_leases(m->L, 1, &ls, &nl);
    for (int64_t i = 0; i < nl && !rc && grant < 0; i++) {
        if (ls[i].generation != m_ledger_gen(m) || ls[i].replica != (int)replica || ls[i].cursor != ls[i].start)
            continue;
        int known = 0;
        for (const cJSON *h = held ? held->child : NULL; h; h = h->next)
            known |= cJSON_IsNumber(h) && h->valuedouble == (double)ls[i].id;
        if (!known) {
            out = ls[i];
            grant = ADT_LEDGER_GRANTED;
        }
    }
    free(ls);
    if (!rc && grant < 0) rc = adt_ledger_lease_next(m->L, m_ledger_gen(m), (int)replica, max_samples, &out, &grant);
    if (rc) {
        reply_status(rp, rc);
        return 0;
    }
    cJSON_AddStringToObject(o, "grant", wj_grant_name(grant));
    if (grant == ADT_LEDGER_GRANTED) cJSON_AddItemToObject(o, "lease", wj_lease_to_json(&out));
    return 1;
}

/* A report already applied (its reply was lost and the worker asked again): every range ends
 * at or before its lease's cursor, and the lease was last reported at this step. */
static int already_reported(adt_master *m, int replica, int64_t step, const adt_ledger_range *r, int n) {
    for (int i = 0; i < n; i++) {
        adt_ledger_lease l;
        if (adt_ledger_lease_get(m->L, r[i].lease, &l) || l.replica != replica || l.generation != m_ledger_gen(m) ||
            l.last_step != step || r[i].b > l.cursor || r[i].a < l.start)
            return 0;
    }
    return 1;
}

/* The report part of a request (fields step, ranges) into o; 0 with rp set when refused. */
static int report_part(adt_master *m, const cJSON *b, int64_t replica, cJSON *o, adt_http_reply *rp) {
    int64_t step;
    double compute_s;
    if (bad_field(rp, wj_int(b, "step", 0, INT64_C(1) << 52, 0, 0, &step) ||
                          wj_num(b, "compute_s", 0, 1e6, 1, -1, &compute_s)))
        return 0;
    /* optional: each parameter server's answer time to this replica's pulls of the step */
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(b, "server_s");
    double srv[ADT_ELASTIC_MAX_SERVERS];
    int n_srv = 0;
    for (const cJSON *x = sv ? sv->child : NULL; x && n_srv <= ADT_ELASTIC_MAX_SERVERS; x = x->next, n_srv++) {
        if (n_srv == ADT_ELASTIC_MAX_SERVERS || !cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= 1e6)) {
            n_srv = -1;
            break;
        }
        srv[n_srv] = x->valuedouble;
    }
    if (sv && (!cJSON_IsArray(sv) || n_srv < 0)) {
        reply_error(rp, 400, "field 'server_s': expected an array of at most %d seconds in [0, 1e6]",
                    ADT_ELASTIC_MAX_SERVERS);
        return 0;
    }
    const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(b, "ranges");
    int n = cJSON_GetArraySize(ranges);
    if (!cJSON_IsArray(ranges) || n < 1 || n > 1024) {
        reply_error(rp, 400, "field 'ranges': expected 1..1024 ranges [lease, a, b]");
        return 0;
    }
    adt_ledger_range *r = adt_calloc((size_t)n, sizeof *r);
    int k = 0;
    for (const cJSON *e = ranges->child; e; e = e->next, k++) {
        int64_t v[3];
        for (int j = 0; j < 3; j++) {
            const cJSON *x = cJSON_GetArrayItem(e, j);
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 3 || !cJSON_IsNumber(x) || x->valuedouble < 0 ||
                x->valuedouble > 4503599627370496.0 || x->valuedouble != (double)(int64_t)x->valuedouble) {
                free(r);
                reply_error(rp, 400, "field 'ranges'[%d]: expected [lease, a, b], non-negative integers", k);
                return 0;
            }
            v[j] = (int64_t)x->valuedouble;
        }
        r[k] = (adt_ledger_range){v[0], v[1], v[2]};
    }
    if (m->gstate == G_STOPPING && step >= m->stop_at) {
        free(r);
        reply_error(rp, 422, "step %lld: this generation stops after step %lld", (long long)step,
                    (long long)m->stop_at - 1);
        return 0;
    }
    int rc = adt_ledger_report(m->L, m_ledger_gen(m), (int)replica, step, r, n);
    int dup = rc == ADT_ERR_ARG && already_reported(m, (int)replica, step, r, n);
    int64_t samples = 0;
    for (int i = 0; i < n; i++) samples += r[i].b - r[i].a;
    free(r);
    if (rc && !dup) {
        reply_status(rp, rc);
        return 0;
    }
    if (step > m->max_reported) m->max_reported = step;
    m->last_report_mono = adt_now_s();
    if (!dup) m_split_step(m, (int)replica, step, compute_s, samples, srv, n_srv);
    if (m->fail_wall > 0) {
        m->last_recovery_s = adt_wall_s() - m->fail_wall;
        m->fail_wall = 0;
        ms_event(m, "first_step", m->gen, -1, (int)replica, "step %lld reported %.3f s after the failure",
                 (long long)step, m->last_recovery_s);
    }
    cJSON_AddBoolToObject(o, "ok", 1);
    if (dup) cJSON_AddBoolToObject(o, "duplicate", 1);
    return 1;
}

/* POST /v1/data/lease, /report, /step: the gate, then the call's parts into one reply. A step is
 * a report and the lease of a later step in one call (one round trip, one lock): the report is
 * applied first, as if the two calls came in that order; a malformed lease part is refused
 * before the report is applied, and a refused report leases nothing. */
static void ep_data_call(adt_master *m, const cJSON *b, int call, adt_http_reply *rp) {
    int64_t gen, replica, max_samples;
    const cJSON *held;
    if (!data_gate(m, b, &gen, &replica, rp)) return;
    if (call == DC_STEP && !lease_fields(b, rp, &max_samples, &held)) return;
    cJSON *o = cJSON_CreateObject();
    if ((call != DC_LEASE && !report_part(m, b, replica, o, rp)) ||
        (call != DC_REPORT && !lease_part(m, b, replica, o, rp))) {
        cJSON_Delete(o); /* rp holds the refusal */
        return;
    }
    m->n_data_calls[call]++;
    add_control(m, o);
    reply_json(rp, 200, o);
}

static void ep_commit(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    int64_t gen, steps;
    const char *ckpt;
    if (!data_gate(m, b, &gen, NULL, rp)) return;
    if (bad_field(rp, wj_int(b, "steps", 1, INT64_C(1) << 52, 0, 0, &steps) || wj_str(b, "checkpoint", 255, 1, &ckpt)))
        return;
    /* the split in force at `steps` first: a commit the ledger keeps always has its split */
    int rc = m_split_commit(m, steps);
    if (rc) {
        reply_status(rp, rc);
        return;
    }
    rc = adt_ledger_commit(m->L, m_ledger_gen(m), steps, ckpt);
    int dup = 0;
    if (rc == ADT_ERR_ARG) { /* asked again after a lost reply? */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", adt_error_message());
        adt_ledger_status st;
        dup = adt_ledger_get_status(m->L, &st) == ADT_OK && st.committed_steps == steps &&
              !strcmp(st.checkpoint, ckpt ? ckpt : "");
        if (!dup) adt_error(rc, "%s", msg);
    }
    if (rc && !dup) {
        reply_status(rp, rc);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "ok", 1);
    if (dup) cJSON_AddBoolToObject(o, "duplicate", 1);
    cJSON_AddNumberToObject(o, "committed_steps", (double)steps);
    add_control(m, o);
    reply_json(rp, 200, o);
}

/* GET /v1/plan[?generation=G]: the plan file of the current world, as text; 404 when the world
 * has none (it runs data parallel), 409 when G is not the current generation. */
static void ep_plan(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    int64_t g = query_int(rq, "generation", m->gen);
    if (g < 0) {
        reply_error(rp, 400, "generation: expected a non-negative integer");
        return;
    }
    if (g != m->gen) {
        reply_error(rp, 409, "generation %lld is not the current one (%lld)", (long long)g, (long long)m->gen);
        return;
    }
    const char *text = m_plan_text(m);
    if (!text) {
        reply_error(rp, 404, "generation %lld has no plan: it runs data parallel", (long long)g);
        return;
    }
    reply_text(rp, 200, "application/json", adt_strdup(text));
}

static void ep_scale(adt_master *m, const cJSON *b, adt_http_reply *rp) {
    int64_t workers, nodes;
    if (bad_field(rp,
                  wj_int(b, "workers", 0, 1 << 20, 1, -1, &workers) || wj_int(b, "nodes", 0, 1 << 20, 1, -1, &nodes)))
        return;
    if (workers < 0 && nodes < 0) {
        reply_error(rp, 400, "expected 'workers' or 'nodes' (0 = no limit)");
        return;
    }
    if (workers >= 0) m->target_workers = (int)workers;
    if (nodes >= 0) m->target_nodes = (int)nodes;
    ms_event(m, "scale", m->gen, -1, -1, "target: %d workers, %d nodes (0 = no limit)", m->target_workers,
             m->target_nodes);
    ms_save(m);
    m_progress(m);
    reply_json(rp, 200, job_json(m));
}

/* ---- routing -------------------------------------------------------------------------------- */
typedef enum { R_GET, R_POST } route_kind;
typedef struct route {
    const char *path;
    route_kind kind;
    int id;
} route;

enum {
    EP_JOB,
    EP_GEN,
    EP_AGENTS,
    EP_WORKERS,
    EP_SHARDS,
    EP_EVENTS,
    EP_METRICS,
    EP_INFO,
    EP_REGISTER,
    EP_HEARTBEAT,
    EP_AGENT_EVENT,
    EP_LEAVE,
    EP_KVS,
    EP_INIT,
    EP_LEASE,
    EP_REPORT,
    EP_STEP,
    EP_COMMIT,
    EP_SCALE,
    EP_PLAN,
};

static const route k_routes[] = {
    {"/v1/job", R_GET, EP_JOB},
    {"/v1/generation", R_GET, EP_GEN},
    {"/v1/agents", R_GET, EP_AGENTS},
    {"/v1/workers", R_GET, EP_WORKERS},
    {"/v1/shards", R_GET, EP_SHARDS},
    {"/v1/events", R_GET, EP_EVENTS},
    {"/metrics", R_GET, EP_METRICS},
    {"/v1/data/info", R_GET, EP_INFO},
    {"/v1/agents", R_POST, EP_REGISTER},
    {"/v1/agents/heartbeat", R_POST, EP_HEARTBEAT},
    {"/v1/agents/event", R_POST, EP_AGENT_EVENT},
    {"/v1/agents/leave", R_POST, EP_LEAVE},
    {"/v1/kvs", R_POST, EP_KVS},
    {"/v1/data/init", R_POST, EP_INIT},
    {"/v1/data/lease", R_POST, EP_LEASE},
    {"/v1/data/report", R_POST, EP_REPORT},
    {"/v1/data/step", R_POST, EP_STEP},
    {"/v1/data/commit", R_POST, EP_COMMIT},
    {"/v1/scale", R_POST, EP_SCALE},
    {"/v1/plan", R_GET, EP_PLAN},
};

/* Compares the whole of both strings whatever they hold, so the time says nothing of the token. */
static int token_ok(const char *want, const char *auth) {
    if (!want || !*want) return 1;
    const char *given = auth && !strncmp(auth, "Bearer ", 7) ? auth + 7 : "";
    size_t lw = strlen(want), lg = strlen(given);
    unsigned diff = (unsigned)(lw ^ lg);
    for (size_t i = 0; i < lw; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < lg ? given[i] : 0);
    return diff == 0;
}

static void dispatch(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    if (!rq->method || !rq->path) {
        reply_error(rp, 400, "request without a method or a path");
        return;
    }
    if (!token_ok(m->token, rq->authorization)) {
        reply_error(rp, 401, "this master requires the job token: 'Authorization: Bearer TOKEN'");
        return;
    }
    if (m_dash_handle(m, rq, rp)) return; /* /dashboard, /v1/straggler*: master_dash.c */
    route_kind kind;
    if (!strcmp(rq->method, "GET") || !strcmp(rq->method, "HEAD"))
        kind = R_GET;
    else if (!strcmp(rq->method, "POST"))
        kind = R_POST;
    else
        kind = (route_kind)-1;
    const route *hit = NULL;
    int path_known = 0;
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (!strcmp(k_routes[i].path, rq->path)) {
            path_known = 1;
            if (k_routes[i].kind == kind) hit = &k_routes[i];
        }
    if (!hit) {
        if (path_known)
            reply_error(rp, 405, "method %.16s not allowed on %.200s", rq->method, rq->path);
        else
            reply_error(rp, 404,
                        "no such endpoint: %.200s (GET /v1/job, /v1/generation, /v1/agents, /v1/workers, "
                        "/v1/shards, /v1/events, /v1/plan, /v1/straggler, /metrics, /dashboard)",
                        rq->path);
        return;
    }
    cJSON *body = NULL;
    if (kind == R_POST) {
        body = rq->body_len ? cJSON_ParseWithLength(rq->body, rq->body_len) : NULL;
        if (!cJSON_IsObject(body)) {
            cJSON_Delete(body);
            reply_error(rp, 400, "request body: expected a JSON object");
            return;
        }
    }
    switch (hit->id) {
    case EP_JOB: reply_json(rp, 200, job_json(m)); break;
    case EP_GEN: reply_json(rp, 200, generation_json(m)); break;
    case EP_AGENTS: reply_json(rp, 200, agents_json(m)); break;
    case EP_WORKERS: reply_json(rp, 200, workers_json(m)); break;
    case EP_SHARDS: ep_shards(m, rq, rp); break;
    case EP_EVENTS: ep_events(m, rq, rp); break;
    case EP_METRICS: ep_metrics(m, rp); break;
    case EP_INFO: ep_data_info(m, rp); break;
    case EP_REGISTER: ep_register(m, body, rp); break;
    case EP_HEARTBEAT: ep_heartbeat(m, body, rp); break;
    case EP_AGENT_EVENT: ep_agent_event(m, body, rp); break;
    case EP_LEAVE: ep_leave(m, body, rp); break;
    case EP_KVS: ep_kvs(m, body, rp); break;
    case EP_INIT: ep_data_init(m, body, rp); break;
    case EP_LEASE: ep_data_call(m, body, DC_LEASE, rp); break;
    case EP_REPORT: ep_data_call(m, body, DC_REPORT, rp); break;
    case EP_STEP: ep_data_call(m, body, DC_STEP, rp); break;
    case EP_COMMIT: ep_commit(m, body, rp); break;
    case EP_SCALE: ep_scale(m, body, rp); break;
    case EP_PLAN: ep_plan(m, rq, rp); break;
    }
    cJSON_Delete(body);
}

void adt_master_handle(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    memset(rp, 0, sizeof *rp);
    pthread_mutex_lock(&m->mu);
    dispatch(m, rq, rp);
    int c = rp->status / 100;
    m->n_requests[c >= 1 && c <= 5 ? c : 0]++;
    pthread_mutex_unlock(&m->mu);
}
