/*
 * master_plan.c - the master's state machine: membership, generations and world decisions.
 *
 *   WAITING --(enough agents)--> RUNNING(g) --(death / hang / lost agent)--------> ENDING(g)
 *                                    |   \--(join, leave, scale: planned)--> STOPPING(g)
 *                                    |                                        | workers stop
 *                                    |                                        | after stop_at
 *                                    |                              every world exited 0
 *                                    v                                        v
 *                      every world exited 0: DONE               ENDING(g) --(agents drained)-->
 *                                                                plan RUNNING(g+1) or WAITING
 *
 * A failure ends the world at once: requests of generation g are refused from that moment (the
 * master fences them; the ledger's own fence follows with the rewind), the agents stop their
 * workers, and once none runs the next world is planned and the ledger rewound to its last
 * commit with the new replica count, which starts generation g+1 there as well. Failures spend
 * the restart budget and blacklist the node they happened on (a cooldown that doubles with each
 * failure); planned changes spend nothing.
 *
 * World decisions: the agents that are alive, not leaving and not cooling down (cooling ones
 * only when the others are too few), at most nnodes_max / the scale target of them, in the order
 * they first joined (so ranks stay where they were); each runs min(its slots, what the worker
 * target leaves) ranks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elastic/master_internal.h"

const char *m_gstate_name(m_gstate s) {
    static const char *const names[] = {"waiting", "running", "stopping", "ending", "done", "failed"};
    return (unsigned)s <= G_FAILED ? names[s] : "?";
}

adt_job_state m_job_state(const adt_master *m) {
    if (m->gstate == G_DONE) return ADT_JOB_DONE;
    if (m->gstate == G_FAILED) return ADT_JOB_FAILED;
    return m->ever_planned ? ADT_JOB_RUNNING : ADT_JOB_WAITING;
}

m_agent *m_agent_find(adt_master *m, int64_t id) {
    for (int i = 0; i < m->n_agents; i++)
        if (m->agents[i].id == id) return &m->agents[i];
    return NULL;
}

m_slot *m_slot_of(adt_master *m, int64_t agent) {
    for (int i = 0; i < m->n_slots; i++)
        if (m->slots[i].agent == agent) return &m->slots[i];
    return NULL;
}

void m_changed(adt_master *m) {
    m->version++;
    pthread_cond_broadcast(&m->cv);
}

static void set_gstate(adt_master *m, m_gstate s, const char *reason) {
    m->gstate = s;
    snprintf(m->greason, sizeof m->greason, "%s", reason ? reason : "");
    m->gstate_mono = adt_now_s();
}

static int running(const adt_master *m) { return m->gstate == G_RUNNING || m->gstate == G_STOPPING; }

int64_t m_ledger_gen(const adt_master *m) { return m->gen - m->ledger_offset; }

static void clear_kvs(adt_master *m) {
    for (int i = 0; i < m->n_kvs; i++)
        cJSON_Delete(m->kvs[i].entries);
    free(m->kvs);
    m->kvs = NULL;
    m->n_kvs = 0;
}

static void job_finished(adt_master *m, m_gstate s, const char *reason) {
    set_gstate(m, s, reason);
    clear_kvs(m);
    ms_event(m, s == G_DONE ? "job_done" : "job_failed", m->gen, -1, -1, "%s", reason);
    ms_save(m);
    m_changed(m);
}

/* ---- the ledger ----------------------------------------------------------------------------- */
int m_ledger_ready(adt_master *m) {
    if (m->L) return ADT_OK;
    if (!m->have_job) return adt_error(ADT_ERR_STATE, "no data job declared yet (POST /v1/data/init)");
    if (m->gen < 1) return adt_error(ADT_ERR_STATE, "no world has been formed yet");
    char path[4096];
    if (m->in_memory)
        snprintf(path, sizeof path, ":memory:");
    else
        snprintf(path, sizeof path, "%s/%s", m->job_dir, ADT_LEDGER_FILE);
    int rc;
    if (m->ledger_offset < 0 || m->in_memory || access(path, F_OK) != 0) {
        if (m->ledger_offset < 0 && !m->in_memory && access(path, F_OK) == 0)
            return adt_error(ADT_ERR_STATE,
                             "%s exists, but the master state in the same directory never created it "
                             "(a job directory of another job?)",
                             path);
        /* A new ledger starts at its generation 1: remember which of ours that is first. */
        if (m->ledger_offset < 0) {
            m->ledger_offset = m->gen - 1;
            if ((rc = ms_save(m))) return rc;
        }
        adt_ledger_job job = m->job;
        job.replicas = m->replicas > 0 ? m->replicas : 1;
        if ((rc = adt_ledger_create(&m->L, path, &job, m->cfg.ledger_flags))) return rc;
        /* the world may have moved on since the offset was chosen (a restart in between) */
        int64_t g = 1;
        while (g < m_ledger_gen(m) && !rc)
            rc = adt_ledger_rewind(m->L, g, 0, job.replicas, "catching up", &g);
        ms_event(m, "ledger", m->gen, -1, -1, "created %s", path);
        return rc;
    }
    if ((rc = adt_ledger_open(&m->L, path, m->cfg.ledger_flags))) return rc;
    adt_ledger_status st;
    if ((rc = adt_ledger_get_status(m->L, &st))) return rc;
    /* The master saves a new world before it rewinds the ledger: a master killed in between
     * finds the ledger one generation behind and completes the rewind. */
    int64_t g = st.generation;
    while (g < m_ledger_gen(m) && !rc)
        rc = adt_ledger_rewind(m->L, g, st.committed_steps, m->replicas > 0 ? m->replicas : 1, "master restart", &g);
    if (rc) return rc;
    if (g > m_ledger_gen(m)) {
        /* the ledger started a generation of its own (opened on another boot): our world is fenced */
        m->gen = g + m->ledger_offset;
        if (running(m)) set_gstate(m, G_ENDING, "the ledger restarted from its last commit");
        ms_save(m);
    }
    ms_event(m, "ledger", m->gen, -1, -1, "opened %s at generation %lld", path, (long long)g);
    return ADT_OK;
}

/* ---- failures, the budget, the blacklist ---------------------------------------------------- */
static void blame(adt_master *m, int64_t agent, const char *why) {
    m_agent *a = m_agent_find(m, agent);
    if (!a) return;
    a->failures++;
    double lo = m->cfg.cooldown_min_s, hi = m->cfg.cooldown_max_s;
    double cool = lo * pow(2.0, a->failures - 1);
    if (cool > hi) cool = hi;
    a->cooldown_until = adt_wall_s() + cool;
    ms_event(m, "blacklist", m->gen, a->id, -1, "node %s: failure %d (%s), cooldown %.1f s", a->node, a->failures, why,
             cool);
}

/* Failures within the restart window, this one included. */
static int failures_in_window(const adt_master *m, double now) {
    int n = 0;
    for (int i = 0; i < m->n_fail; i++)
        if (m->cfg.restart_window_s <= 0 || m->fail_t[i] > now - m->cfg.restart_window_s) n++;
    return n;
}

void m_end_generation(adt_master *m, const char *reason, int failure, int64_t agent) {
    if (!running(m)) return;
    double now = adt_wall_s();
    if (failure) {
        m->fail_t = adt_realloc(m->fail_t, (size_t)(m->n_fail + 1) * sizeof *m->fail_t);
        m->fail_t[m->n_fail++] = now;
        if (m->cfg.restart_window_s > 0) { /* forget what fell out of the window */
            int k = 0;
            for (int i = 0; i < m->n_fail; i++)
                if (m->fail_t[i] > now - m->cfg.restart_window_s) m->fail_t[k++] = m->fail_t[i];
            m->n_fail = k;
        }
        m->restarts++;
        if (m->fail_wall <= 0) m->fail_wall = now;
        if (agent > 0) blame(m, agent, reason);
    } else {
        m->planned_changes++;
        m->fail_wall = 0;
    }
    ms_event(m, "ended", m->gen, agent > 0 ? agent : -1, -1, "%s: %s", failure ? "failure" : "planned", reason);
    int n = failures_in_window(m, now);
    if (failure && n > m->cfg.max_restarts) {
        char why[300];
        snprintf(why, sizeof why, "%d failures%s exceed --max-restarts %d (last: %s)", n,
                 m->cfg.restart_window_s > 0 ? " within the restart window" : "", m->cfg.max_restarts, reason);
        job_finished(m, G_FAILED, why);
        return;
    }
    set_gstate(m, G_ENDING, reason);
    clear_kvs(m);
    ms_save(m);
    m_changed(m);
}

void m_fail_job(adt_master *m, const char *reason) {
    if (m->gstate == G_DONE || m->gstate == G_FAILED) return;
    ms_event(m, "ended", m->gen, -1, -1, "failure: %s", reason);
    job_finished(m, G_FAILED, reason);
}

void m_request_stop(adt_master *m, const char *reason) {
    if (m->gstate != G_RUNNING) return;
    if (!m->L) { /* workers that report nothing cannot stop at a step boundary */
        m_end_generation(m, reason, 0, -1);
        return;
    }
    int64_t last = m->max_reported >= m->gen_first_step ? m->max_reported : m->gen_first_step - 1;
    /* Every replica has reported `last` or is about to (steps end in a collective), so the
     * earliest step all of them can still stop after is last + 1. A trainer that queues its
     * reports (adt_elastic_pipe) learns the stop step from the reply to the report before the
     * step that ends, one step later: last + 2 (0-based), which every rank reaches after
     * learning it. */
    m->stop_at = last + 3;
    set_gstate(m, G_STOPPING, reason);
    ms_event(m, "stop_request", m->gen, -1, -1, "stop after %lld steps: %s", (long long)m->stop_at, reason);
    ms_save(m);
    m_changed(m);
}

/* ---- world decisions ------------------------------------------------------------------------ */
static int cmp_slot_agent(const void *a, const void *b) {
    const m_slot *x = a, *y = b;
    return (x->agent > y->agent) - (x->agent < y->agent);
}

/* The world the master would form now: *n slots (malloc'd in *out, ordered by agent id), the
 * world size; 0 if too few agents. *candidates = agents that could take part. */
static int decide(adt_master *m, m_slot **out, int *n, int *world, int *candidates) {
    double now = adt_wall_s();
    int min_nodes = m->cfg.nnodes_min, max_nodes = m->cfg.nnodes_max > 0 ? m->cfg.nnodes_max : m->n_agents;
    if (m->target_nodes > 0 && m->target_nodes < max_nodes) max_nodes = m->target_nodes;
    if (max_nodes < min_nodes) max_nodes = min_nodes;
    int *pick = adt_malloc((size_t)(m->n_agents + 1) * sizeof *pick), k = 0, c = 0;
    /* the ready ones first, in joining order; then the cooling ones, soonest back first */
    for (int i = 0; i < m->n_agents; i++) {
        const m_agent *a = &m->agents[i];
        if (!a->alive || a->leaving || a->slots < 1) continue;
        c++;
        if (a->cooldown_until <= now && k < max_nodes) pick[k++] = i;
    }
    while (k < min_nodes) {
        int best = -1;
        for (int i = 0; i < m->n_agents; i++) {
            const m_agent *a = &m->agents[i];
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= pick[j] == i;
            if (taken || !a->alive || a->leaving || a->slots < 1) continue;
            if (best < 0 || a->cooldown_until < m->agents[best].cooldown_until) best = i;
        }
        if (best < 0) break;
        pick[k++] = best;
    }
    *candidates = c;
    *n = 0;
    *world = 0;
    *out = NULL;
    if (k < min_nodes || k == 0) {
        free(pick);
        return 0;
    }
    m_slot *s = adt_calloc((size_t)k, sizeof *s);
    for (int j = 0; j < k; j++)
        s[j].agent = m->agents[pick[j]].id;
    qsort(s, (size_t)k, sizeof *s, cmp_slot_agent);
    int left = m->target_workers > 0 ? m->target_workers : INT32_MAX, kept = 0;
    for (int j = 0; j < k; j++) {
        const m_agent *a = m_agent_find(m, s[j].agent);
        int local = a->slots < left ? a->slots : left;
        if (local < 1) continue;
        left -= local;
        s[kept] = (m_slot){s[j].agent, kept, *world, local};
        *world += local;
        kept++;
    }
    /* whole data-parallel replicas only: trim the last agents' ranks to a multiple of rpr */
    for (int cut = *world % m->rpr; cut > 0 && kept > 0;) {
        m_slot *last = &s[kept - 1];
        int take = last->local_size < cut ? last->local_size : cut;
        last->local_size -= take, *world -= take, cut -= take;
        if (!last->local_size) kept--;
    }
    free(pick);
    *n = kept;
    *out = s;
    return kept > 0;
}

static int same_world(const adt_master *m, const m_slot *s, int n) {
    if (n != m->n_slots) return 0;
    for (int i = 0; i < n; i++)
        if (s[i].agent != m->slots[i].agent || s[i].local_size != m->slots[i].local_size) return 0;
    return 1;
}

/* ---- re-planning ---------------------------------------------------------------------------- */
static void plan_path(const adt_master *m, int64_t gen, char *buf, size_t n) {
    snprintf(buf, n, "%s/plan-g%lld.json", m->job_dir, (long long)gen);
}

/* The new world's plan (cfg.plan_world), written next to the state and recorded as an event.
 * Planning runs before the agents can learn of the world (the lock is held), so every worker
 * of the generation finds its plan. A failure leaves the world data parallel, and says why. */
static void plan_clear(adt_master *m) {
    free(m->plan.json);
    free(m->plan.batch_split);
    memset(&m->plan, 0, sizeof m->plan);
}

/* The plan text's "batch_split" (a restarted master reads the plan file back). */
static void plan_split_from_text(adt_master *m) {
    cJSON *o = cJSON_Parse(m->plan.json);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "batch_split"), *x;
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
    if (n > 0) {
        m->plan.batch_split = adt_calloc((size_t)n, sizeof *m->plan.batch_split);
        cJSON_ArrayForEach(x, a) m->plan.batch_split[m->plan.n_split++] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : 0;
    }
    cJSON_Delete(o);
}

static void replan(adt_master *m) {
    plan_clear(m);
    m->plan_gen = m->gen;
    if (!m->cfg.plan_world) return;
    double t0 = adt_now_s();
    /* the devices of the new world at the speeds the job measured them (straggler reports) */
    double *speed = m_split_speeds(m);
    adt_world_shape shape = {.world = m->world_size, .replicas = m->replicas,
                             .batch = m->have_job ? m->job.global_batch : 0, .speed = speed};
    int rc = m->cfg.plan_world(m->cfg.plan_ctx, &shape, &m->plan);
    free(speed);
    if (!rc && m->plan.json && !m->in_memory) {
        char path[4096];
        plan_path(m, m->gen, path, sizeof path);
        rc = adt_file_write_atomic(path, m->plan.json, strlen(m->plan.json));
    }
    m->plan_s = adt_now_s() - t0;
    if (rc) {
        plan_clear(m);
        ms_event(m, "replan", m->gen, -1, -1, "world %d: no plan, data parallel (%s); %.1f ms", m->world_size,
                 adt_error_message(), m->plan_s * 1e3);
        return;
    }
    char pred[64] = "not priced (no --cluster)";
    if (m->plan.predicted_step_s > 0)
        snprintf(pred, sizeof pred, "predicted %.4f ms/step", m->plan.predicted_step_s * 1e3);
    char split[256] = "";
    for (int i = 0, o = 0; i < m->plan.n_split && o < (int)sizeof split - 24; i++)
        o += snprintf(split + o, sizeof split - (size_t)o, "%s%lld", i ? "," : "; batch_split ",
                      (long long)m->plan.batch_split[i]);
    ms_event(m, "replan", m->gen, -1, -1, "world %d: strategy %s, mesh %s, %s%s%s%s; planned in %.1f ms", m->world_size,
             m->plan.json ? m->plan.strategy : "dp (no plan file)", m->plan.mesh, pred, m->plan.note[0] ? "; " : "",
             m->plan.note, split, m->plan_s * 1e3);
}

const char *m_plan_text(adt_master *m) {
    if (m->plan_gen == m->gen) return m->plan.json;
    /* a restarted master: the plan its predecessor wrote for this generation, if any */
    plan_clear(m);
    m->plan_gen = m->gen;
    if (m->in_memory || m->gen < 1) return NULL;
    char path[4096];
    plan_path(m, m->gen, path, sizeof path);
    size_t n;
    if (access(path, R_OK) || adt_file_read(path, 64u << 20, "plan", &m->plan.json, &n)) m->plan.json = NULL;
    if (m->plan.json) snprintf(m->plan.strategy, sizeof m->plan.strategy, "plan-g%lld.json", (long long)m->gen);
    if (m->plan.json) plan_split_from_text(m);
    return m->plan.json;
}

/* Forms the next world (generation gen + 1) if the agents allow. */
static void plan_next(adt_master *m) {
    m_slot *s;
    int n, world, candidates;
    if (!decide(m, &s, &n, &world, &candidates)) {
        free(s);
        if (m->gstate != G_WAITING) {
            set_gstate(m, G_WAITING, "waiting for agents");
            ms_event(m, "waiting", m->gen, -1, -1, "%d agents can run, --nnodes needs %d", candidates,
                     m->cfg.nnodes_min);
            ms_save(m);
            m_changed(m);
        }
        return;
    }
    /* The first world waits a little for more agents to join, unless all it may use are here. */
    int room = m->cfg.nnodes_max <= 0 || candidates < m->cfg.nnodes_max;
    if (!m->ever_planned && room && adt_now_s() - m->last_join_mono < m->cfg.join_wait_s) {
        free(s);
        return;
    }
    int64_t committed = 0;
    adt_ledger_status st;
    if (m->L && adt_ledger_get_status(m->L, &st) == ADT_OK) committed = st.committed_steps;
    int64_t from = m->gen;
    char why[sizeof m->greason];
    snprintf(why, sizeof why, "%s", m->greason[0] ? m->greason : "the first world");
    free(m->slots);
    m->slots = s;
    m->n_slots = n;
    m->world_size = world;
    m->replicas = world / m->rpr > 0 ? world / m->rpr : 1;
    m->gen = from + 1;
    m->stop_at = 0;
    m->gen_first_step = committed;
    m->max_reported = -1;
    m->ever_planned = 1;
    for (int i = 0; i < m->n_agents; i++)
        m->agents[i].world_ok = 0;
    set_gstate(m, G_RUNNING, "");
    clear_kvs(m);
    if (ms_save(m)) {
        job_finished(m, G_FAILED, adt_error_message());
        return;
    }
    char who[512] = "";
    for (int i = 0, o = 0; i < n && o < (int)sizeof who - 40; i++)
        o += snprintf(who + o, sizeof who - (size_t)o, "%s%s:%d", i ? "," : "", m_agent_find(m, s[i].agent)->node,
                      s[i].local_size);
    ms_event(m, "generation", m->gen, -1, -1, "world %d (%d replicas) on %s, from step %lld (%s)", world, m->replicas,
             who, (long long)committed, why);
    replan(m);
    int rc = ADT_OK;
    if (m->L) {
        int64_t g;
        rc = adt_ledger_rewind(m->L, from - m->ledger_offset, committed, m->replicas, why, &g);
    } else if (m->have_job) {
        rc = m_ledger_ready(m);
    }
    if (rc) {
        job_finished(m, G_FAILED, adt_error_message());
        return;
    }
    m_changed(m);
}

/* ---- the periodic checks -------------------------------------------------------------------- */
static void revoke_agent_replicas(adt_master *m, const m_slot *sl, const char *why) {
    if (!m->L || !sl) return;
    for (int r = sl->rank_offset / m->rpr; r <= (sl->rank_offset + sl->local_size - 1) / m->rpr; r++)
        adt_ledger_revoke_replica(m->L, m_ledger_gen(m), r, why, NULL);
}

static void check_heartbeats(adt_master *m) {
    double now = adt_now_s(), limit = m->hb_s * m->hb_misses;
    for (int i = 0; i < m->n_agents; i++) {
        m_agent *a = &m->agents[i];
        if (!a->alive || now - a->last_seen <= limit) continue;
        a->alive = 0;
        a->world_running = 0;
        if (a->leaving) {
            ms_event(m, "left", m->gen, a->id, -1, "node %s", a->node);
            ms_save(m);
            continue;
        }
        m->n_heartbeat_miss++;
        char why[300];
        snprintf(why, sizeof why, "agent %lld (node %s) missed %d heartbeats (%.1f s)", (long long)a->id, a->node,
                 m->hb_misses, now - a->last_seen);
        ms_event(m, "heartbeat_miss", m->gen, a->id, -1, "%s", why);
        m_slot *sl = m_slot_of(m, a->id);
        if (running(m) && sl) {
            m->n_deaths++;
            revoke_agent_replicas(m, sl, why);
            m->fail_wall = adt_wall_s() - (now - a->last_seen - limit);
            m_end_generation(m, why, 1, a->id);
        } else {
            ms_save(m);
            m_changed(m);
        }
    }
}

/* Alive agents whose world is still running. */
static int undrained(const adt_master *m) {
    int n = 0;
    for (int i = 0; i < m->n_agents; i++)
        n += m->agents[i].alive && m->agents[i].world_running;
    return n;
}

/* The progress watchdog: steps were reported in this generation, then none for the progress
 * timeout. A rank stopped between two steps holds no lease, so the leases' deadlines alone would
 * never notice. Ends the generation (a failure) and says so. */
static int hung(adt_master *m, double now) {
    if (m->cfg.progress_timeout_s < 0 || m->max_reported < m->gen_first_step ||
        now - m->last_report_mono <= m->cfg.progress_timeout_s)
        return 0;
    char why[200];
    snprintf(why, sizeof why, "no step reported for %.1f s after step %lld: a rank hangs", now - m->last_report_mono,
             (long long)m->max_reported);
    ms_event(m, "hang", m->gen, -1, -1, "%s", why);
    m_end_generation(m, why, 1, -1);
    return 1;
}

void m_progress(adt_master *m) {
    if (m->gstate == G_DONE || m->gstate == G_FAILED) return;
    check_heartbeats(m);
    double now = adt_now_s();
    switch (m->gstate) {
    case G_WAITING: plan_next(m); break;
    case G_RUNNING: {
        if (m->L && now >= m->next_lease_check) {
            m->next_lease_check = now + 0.25;
            int64_t n = 0;
            if (adt_ledger_revoke_expired(m->L, &n) == ADT_OK && n > 0) {
                char why[200];
                snprintf(why, sizeof why, "%lld leases passed their deadline: a replica stopped reporting",
                         (long long)n);
                ms_event(m, "lease_expired", m->gen, -1, -1, "%s", why);
                m_end_generation(m, why, 1, -1);
                break;
            }
        }
        if (hung(m, now)) break;
        m_slot *s;
        int n, world, candidates;
        if (decide(m, &s, &n, &world, &candidates) && !same_world(m, s, n)) {
            char why[160];
            snprintf(why, sizeof why, "re-plan: a world of %d ranks on %d agents is possible (now %d on %d)", world, n,
                     m->world_size, m->n_slots);
            ms_event(m, "world_change", m->gen, -1, -1, "%s", why);
            m_request_stop(m, why);
        }
        free(s);
        break;
    }
    case G_STOPPING:
        if (hung(m, now)) break;
        if (now - m->gstate_mono > m->cfg.stop_timeout_s) {
            char why[160];
            snprintf(why, sizeof why, "the planned stop after step %lld took longer than %.0f s", (long long)m->stop_at,
                     m->cfg.stop_timeout_s);
            m_end_generation(m, why, 0, -1);
        }
        break;
    case G_ENDING:
        if (undrained(m) && now - m->gstate_mono > m->cfg.stop_timeout_s) {
            for (int i = 0; i < m->n_agents; i++) {
                m_agent *a = &m->agents[i];
                if (!a->alive || !a->world_running) continue;
                a->alive = 0;
                a->world_running = 0;
                ms_event(m, "death", m->gen, a->id, -1, "agent %lld did not stop its workers within %.0f s",
                         (long long)a->id, m->cfg.stop_timeout_s);
            }
            ms_save(m);
        }
        if (!undrained(m)) plan_next(m);
        break;
    default: break;
    }
}

void m_tick_locked(adt_master *m) { m_progress(m); }
