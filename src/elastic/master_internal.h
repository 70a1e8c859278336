/*
 * master_internal.h - what the master's files share: the state (membership, the generation and
 * its world, the ledger handle), its persistence in DIR/master.db, the state machine, and the
 * request handler.
 *
 *   master.c        lifecycle, the HTTP server glue (libmicrohttpd), the tick thread
 *   master_store.c  master.db: schema, saving and loading the state, the event log
 *   master_plan.c   membership, generations, world decisions, the periodic checks
 *   master_api.c    adt_master_handle: routing, JSON, every endpoint, /metrics
 *
 * Locking: one mutex (mu) guards everything below, including every ledger call; cv is
 * broadcast whenever `version` moves (a plan changed) or a KVS barrier fills, so long-polls
 * wake up. Times: `mono` fields are adt_now_s(), `wall` fields adt_wall_s() (persisted).
 */
#ifndef ADTRAIN_ELASTIC_MASTER_INTERNAL_H
#define ADTRAIN_ELASTIC_MASTER_INTERNAL_H

#include <cJSON.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"

typedef struct m_strag m_strag; /* master_dash.c */

/* Generation states. The number `gen` is that of the last world decided (0: none yet). */
typedef enum m_gstate {
    G_WAITING = 0, /* no world: too few agents; the next one is gen + 1                   */
    G_RUNNING,     /* world `gen` assigned; its workers run                               */
    G_STOPPING,    /* planned stop: the workers finish steps < stop_at, commit, exit 0    */
    G_ENDING,      /* world `gen` ended; waiting for the agents to stop its workers       */
    G_DONE,        /* the job finished                                                    */
    G_FAILED,      /* the job failed                                                      */
} m_gstate;

typedef struct m_agent {
    int64_t id;             /* >= 1, never reused                                         */
    char node[128];         /* node id: the blacklist's unit                              */
    char host[128];
    int slots;
    int pid;
    int alive;              /* registered and heartbeating                                */
    int leaving;            /* asked to leave: not placed in the next world               */
    double last_seen;       /* mono: its last request                                     */
    int64_t world_gen;      /* the generation of its world, as it last said (0: none)     */
    int world_running;      /* that world still runs                                       */
    int world_ok;           /* that world ended with every rank exiting 0                  */
    int64_t seq;            /* the agent's counter of world-state reports: older ones are
                               ignored (a heartbeat may overtake an event)                 */
    int failures;           /* failures attributed to its node                            */
    double cooldown_until;  /* wall: not placed in a world before this (if others can run) */
    int n_pids;
    int *pids;              /* [rank_offset + i] -> pid of its live world, n_pids of them    */
    int n_speed;
    double *speed;          /* [local rank]: samples/s of compute measured there, 0 unknown   */
} m_agent;

/* One agent's part of a world. */
typedef struct m_slot {
    int64_t agent;
    int group_rank, rank_offset, local_size;
} m_slot;

/* PMI key-value puts an agent posted for one barrier epoch of the current generation. */
typedef struct m_kvs {
    int64_t agent;
    int epoch;
    cJSON *entries; /* [[key, value], ...] */
} m_kvs;

/* The workers' data calls, by what they carry (step: a report and a lease in one). */
enum { DC_LEASE, DC_REPORT, DC_STEP, DC_COUNT };

struct adt_master {
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* configuration (strings owned) */
    adt_master_config cfg;
    char *job_dir, *listen, *token;
    char run_id[64];
    int in_memory;
    double hb_s;
    int hb_misses;
    int max_wait_ms;

    /* persistence */
    sqlite3 *db;
    int lock_fd;

    /* data */
    adt_ledger *L;
    int have_job;            /* the data job is known (flags or a declaration)            */
    adt_ledger_job job;
    int rpr;                 /* ranks per replica                                         */
    int64_t run_steps;       /* the run's steps as the trainer declared them; 0: the ledger's */
    int idle;                /* replicas [0, idle) take no samples (parameter servers): the
                                split and the monitor are over the others               */
    int64_t ledger_offset;   /* ledger generation = gen - ledger_offset; -1: no ledger yet  */

    /* the generation */
    int64_t gen;
    m_gstate gstate;
    char greason[1024];
    double gstate_mono;      /* when it entered gstate                                    */
    m_slot *slots;
    int n_slots, world_size, replicas;
    int64_t stop_at;         /* G_STOPPING: stop after this many steps                     */
    int64_t gen_first_step;  /* the commit in force when the generation started           */
    int64_t max_reported;    /* the highest step reported in this generation, -1 if none   */
    double last_report_mono; /* when the last step was reported in this generation           */
    double fail_wall;        /* when the failure that ended the previous world was seen; 0 */
    double last_recovery_s;  /* failure to the first reported step of the next world; -1   */

    /* membership */
    m_agent *agents;
    int n_agents;
    int target_workers, target_nodes; /* 0 = no limit                                    */
    double last_join_mono;
    int ever_planned;

    /* the restart budget */
    double *fail_t;          /* wall times of the failures, in order                      */
    int n_fail;
    int restarts, planned_changes;

    /* PMI barriers of multi-agent worlds (current generation only) */
    m_kvs *kvs;
    int n_kvs;

    /* counters for /metrics */
    uint64_t version;
    int64_t n_requests[6];   /* by status class: 1xx..5xx, [0] other                       */
    int64_t n_data_calls[DC_COUNT]; /* worker data calls answered 200, by kind                */
    int64_t n_stale, n_heartbeat_miss, n_deaths;
    int64_t stale_gen;       /* stale requests logged as events in this generation: stale_logged */
    int stale_logged;
    double started_wall;
    double next_lease_check;

    /* serving */
    void *mhd;               /* struct MHD_Daemon                                          */
    int listen_fd, port;
    pthread_t ticker;
    int ticker_on, stopping;

    m_strag *strag;          /* the straggler monitor and controller (master_dash.c)       */
    adt_elastic_job_spec spec; /* what the job trains (cfg.spec, plus the master's own)       */

    /* re-planning (cfg.plan_world): the plan of world `plan_gen`, its text served to workers */
    adt_world_plan plan;     /* plan.json: the text, or NULL (data parallel)                 */
    int64_t plan_gen;        /* 0: none made yet                                            */
    double plan_s;           /* how long making it took                                      */
};

/* ---- master_store.c ----------------------------------------------------------------------- */
/* Opens or creates master.db (":memory:" for an in-memory master) and loads any saved state. */
int ms_open(adt_master *m);
void ms_close(adt_master *m);
/* Saves the whole state (generation, world, agents, budget) in one transaction. */
int ms_save(adt_master *m);
/* Appends an event: kind, then optional fields (generation/agent/rank < 0 are left out). */
void ms_event(adt_master *m, const char *kind, int64_t generation, int64_t agent, int rank, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Events with seq > after (at most max, 0 = all) as a JSON array of objects; *last = last seq. */
cJSON *ms_events(adt_master *m, int64_t after, int64_t max, int64_t *last);
/* The split in force at a commit of `steps` steps, saved before the ledger commits; load
 * returns its replicas (0: none stored). */
int ms_split_save(adt_master *m, int64_t steps, const int64_t *split, int n);
int ms_split_load(adt_master *m, int64_t steps, int64_t *split, int max);
/* The split of generation gen as JSON text (m_split_reply's fields); load: NULL if none (malloc'd). */
int ms_split_state_save(adt_master *m, int64_t gen, const char *json);
char *ms_split_state_load(adt_master *m, int64_t gen);

/* ---- master_plan.c ------------------------------------------------------------------------ */
const char *m_gstate_name(m_gstate s);
adt_job_state m_job_state(const adt_master *m);
m_agent *m_agent_find(adt_master *m, int64_t id);
m_slot *m_slot_of(adt_master *m, int64_t agent);
/* Moves the state machine as far as it can go now (deaths, drains, plans, stops). */
void m_progress(adt_master *m);
void m_tick_locked(adt_master *m);
/* A change of plan: bump the version and wake long-polls. */
void m_changed(adt_master *m);
/* Ends the current generation. failure: counts against the budget; agent >= 1 is blamed. */
void m_end_generation(adt_master *m, const char *reason, int failure, int64_t agent);
/* Opens the ledger (creating it if the job is known and none exists); aligns generations. */
int m_ledger_ready(adt_master *m);
/* The steps of the whole run: the ledger's job of whole epochs, or the trainer's --steps where it
 * declared fewer (run_steps); what the dashboard shows and ND prices a restart's gain over. */
int64_t m_job_steps(const adt_master *m);
/* The ledger's generation for the current one. */
int64_t m_ledger_gen(const adt_master *m);
/* The job fails now, whatever the restart budget (a worker's usage error). */
void m_fail_job(adt_master *m, const char *reason);
/* Asks the running world to stop at a step boundary (a planned change). */
void m_request_stop(adt_master *m, const char *reason);
/* The plan of the current generation (JSON text), reading DIR/plan-g<G>.json after a restart;
 * NULL: none (data parallel). */
const char *m_plan_text(adt_master *m);

/* ---- master_api.c: replies, for the other files' endpoints ------------------------------- */
void m_reply_json(adt_http_reply *rp, int status, cJSON *o); /* takes o */
void m_reply_error(adt_http_reply *rp, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- master_dash.c: the straggler monitor and controller, the dashboard page -------------- */
int m_dash_init(adt_master *m, const adt_master_config *c); /* checks the straggler flags */
void m_dash_free(adt_master *m);
/* Serves /dashboard, /v1/straggler and /v1/straggler/report; 0 for any other path. */
int m_dash_handle(adt_master *m, const adt_http_request *rq, adt_http_reply *rp);
/* The split of the current generation (adt_elastic_local_batch): the reply fields of a data
 * call; one replica's step report with its compute seconds (fed to the controller once every
 * replica reported the step); the split in force at a commit of `steps`, saved before the
 * ledger commits (ADT_OK when there is none to save). */
void m_split_reply(adt_master *m, cJSON *o);
/* server_s[0..n_srv): the replica's answer time of each idle replica (parameter server) at the
 * step, n_srv = 0: none. */
void m_split_step(adt_master *m, int replica, int64_t step, double compute_s, int64_t samples, const double *server_s,
                  int n_srv);
int m_split_commit(adt_master *m, int64_t steps);
/* The speeds measured on the devices of the current world's slots, [world] (0: unknown), or
 * NULL when none was measured; malloc'd. */
double *m_split_speeds(adt_master *m);

#endif
