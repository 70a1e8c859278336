/*
 * adtrain/elastic.h - the control plane of the elastic runtime: the job master, the per-node
 * agent, and the client library a training process calls.
 *
 * One master per job keeps the membership (agents that registered and heartbeat), decides each
 * world generation (which agents run how many ranks), and serves the data-sharding ledger
 * (adtrain/ledger.h) to the workers, all over an HTTP+JSON API (docs/formats.md, "Master API").
 * One agent per node registers with the master, starts the ranks the master gives it as an MPI
 * world of its own (adtrain/agent.h: PMI-1, no mpiexec), reports deaths at once and stops its
 * workers when told to, or when it loses the master. Workers lease data, report what each step
 * consumed and commit checkpoints through the client library; every request names the
 * generation it belongs to, so a request of an ended generation is refused (HTTP 409).
 *
 * Generations. A death (a rank failed, an agent stopped heartbeating, a lease expired or no step
 * was reported for the progress timeout: a rank hangs), a join or a leave ends the generation: the master tells the agents to stop
 * their workers, waits until they have, decides the next world, rewinds the ledger to its last
 * commit (what was consumed after it is handed out again) and the agents start the workers of
 * the next generation, which restore the committed checkpoint. A planned change (a join, a
 * leave, `adtrain scale`) instead asks the workers to stop after step S (they learn S in the
 * reply to a report, commit a checkpoint after S steps and exit 0), so nothing is lost.
 * Failures count against a restart budget per time window; the node of a failure is
 * blacklisted with a growing cooldown. The master keeps its state in DIR/master.db next to the
 * ledger (DIR/ledger.db) and can be killed and restarted: agents and workers retry until it is
 * back and the generation carries on.
 *
 * Security: the API listens on 127.0.0.1 unless told otherwise; off loopback it requires the
 * job token ("Authorization: Bearer T") on every request.
 */
#ifndef ADTRAIN_ELASTIC_H
#define ADTRAIN_ELASTIC_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/agent.h"
#include "adtrain/ledger.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_MASTER_DEFAULT_PORT 29400
/* The master's own state inside the job directory, next to ADT_LEDGER_FILE. */
#define ADT_MASTER_STATE_FILE "master.db"

/* ---------------------------------------------------------------------------------------------
 * HTTP requests as the master's handler sees them (the server glue, tests and the fuzzer build
 * them; nothing here touches a socket).
 */
typedef struct adt_http_request {
    const char *method;        /* "GET", "POST", ...                                     */
    const char *path;          /* "/v1/job": the URL path, without the query             */
    const char *const *query;  /* "key", "value", ..., NULL: the query arguments, or NULL */
    const char *authorization; /* the Authorization header, NULL if absent               */
    const char *body;          /* request body (any bytes), body_len of them              */
    size_t body_len;
} adt_http_request;

typedef struct adt_http_reply {
    int status;               /* HTTP status                                            */
    const char *content_type; /* a static string                                        */
    char *body;               /* malloc'd, NUL-terminated; free with adt_http_reply_free */
    size_t len;
} adt_http_reply;

void adt_http_reply_free(adt_http_reply *rp);

/* ---------------------------------------------------------------------------------------------
 * The master
 */
typedef struct adt_master adt_master;

typedef enum adt_job_state {
    ADT_JOB_WAITING = 0, /* no world yet: too few agents                       */
    ADT_JOB_RUNNING,     /* a generation runs, or the next one is being formed  */
    ADT_JOB_DONE,        /* the workers finished                                */
    ADT_JOB_FAILED,      /* the restart budget is spent                         */
} adt_job_state;

/* What the job trains, said once: on `adtrain launch` / `adtrain master`, served to every worker
 * (GET /v1/job, field "spec"; adt_elastic_client_job). Fields the master was not told are absent
 * (their ADT_SPEC_* bit is clear): the worker keeps its own value. A worker takes the told ones
 * as its defaults, and refuses (exit status 2) a flag of its own that disagrees with one. The
 * optimizer is told whenever the master plans worlds (--model): plans are made for it. */
enum {
    ADT_SPEC_MODEL = 1u << 0,        /* model, model_json                                       */
    ADT_SPEC_BATCH = 1u << 1,        /* batch                                                   */
    ADT_SPEC_OPTIMIZER = 1u << 2,    /* optimizer                                               */
    ADT_SPEC_LR = 1u << 3,           /* lr                                                      */
    ADT_SPEC_MOMENTUM = 1u << 4,     /* momentum                                                */
    ADT_SPEC_WEIGHT_DECAY = 1u << 5, /* weight_decay                                            */
    ADT_SPEC_STEPS = 1u << 6,        /* steps                                                   */
    ADT_SPEC_SEED = 1u << 7,         /* seed                                                    */
    ADT_SPEC_DATA = 1u << 8,         /* data                                                    */
    ADT_SPEC_STRAGGLER = 1u << 9,    /* straggler_policy, straggler_config                      */
    ADT_SPEC_CHECKPOINT_DIR = 1u << 10, /* checkpoint_dir                                       */
};

typedef struct adt_elastic_job_spec {
    unsigned have;               /* ADT_SPEC_* bits of the fields told                          */
    char model[1024];            /* --model as given: a config path (or inline JSON text)       */
    char *model_json;            /* the config's JSON text, so that a worker on another host
                                    needs no copy of the file; malloc'd (adt_elastic_job_spec_free) */
    int64_t batch;               /* global samples per step                                     */
    char optimizer[16];          /* "adamw" or "sgd" (momentum says whether SGD has a state)    */
    double lr, momentum, weight_decay;
    int64_t steps;               /* optimizer steps of the whole run                            */
    uint64_t seed;               /* initialisation and every epoch's sample order               */
    char data[1024];             /* the data spec, as adtrain train --data                      */
    char straggler_policy[8];    /* "off", "dd" or "nd"                                         */
    char straggler_config[256];  /* "key=value,..." or ""                                       */
    char checkpoint_dir[1024];   /* where elastic checkpoints go: DIR/checkpoints of the job
                                    directory (absolute); absent for an in-memory master        */
} adt_elastic_job_spec;

void adt_elastic_job_spec_free(adt_elastic_job_spec *s);

/* The world a re-planning hook plans for. */
typedef struct adt_world_shape {
    int world;            /* ranks                                                              */
    int replicas;         /* data-parallel replicas the data job has (world / ranks per replica) */
    int64_t batch;        /* the global batch, 0 if unknown                                     */
    /* [world] samples/s of compute (no collective waits) each rank's device was measured at in
     * an earlier world of this job (the workers' step reports), 0 where never measured; NULL
     * when none was. */
    const double *speed;
} adt_world_shape;

/* The plan of one world, as a re-planning hook (adt_master_config.plan_world) makes it. */
typedef struct adt_world_plan {
    char *json;              /* the plan file's text (malloc'd; the master frees it); NULL: none,
                                the workers run data parallel                                  */
    char strategy[64];       /* as the plan says: "zero", "dp=2,tp=2", "auto: ..."             */
    char mesh[64];           /* "(2)", "(2,2)"                                                  */
    double predicted_step_s; /* the cost model's step time; 0: not priced (no cluster)         */
    char note[256];          /* why a requested strategy fell back, or "" */
    /* The local batch of each data-parallel replica (summing to the global batch), as the plan
     * text's "batch_split" field says; n_split 0: an even split. malloc'd; the master frees it. */
    int64_t *batch_split;
    int n_split;
} adt_world_plan;

typedef struct adt_master_config {
    const char *job_dir;     /* DIR: DIR/master.db and DIR/ledger.db, created if missing; a
                                state found there is resumed. ":memory:" keeps nothing on disk */
    const char *listen;      /* "HOST:PORT" (IPv4 or a name); default "127.0.0.1:29400"; port 0
                                = any free port (adt_master_port says which)                  */
    const char *token;       /* required on every request when set; a master listening off
                                loopback refuses to start without one                        */
    int nnodes_min;          /* agents a world needs; 0 = 1                                    */
    int nnodes_max;          /* agents a world may use; 0 = no limit                           */
    int max_workers;         /* ranks a world may have (adt_master_scale changes it); 0 = every
                                slot of the agents in it                                       */
    int max_restarts;        /* failures tolerated per restart window; < 0 = default 3         */
    double restart_window_s; /* 0 = the whole job                                              */
    double heartbeat_s;      /* agents heartbeat this often; 0 = 1 s                          */
    int heartbeat_misses;    /* an agent silent for this many intervals is dead; 0 = 3         */
    double join_wait_s;      /* the first world waits this long after the last join for more
                                agents (unless nnodes_max are there); 0 = 1 s, < 0 = none      */
    double stop_timeout_s;   /* a planned stop or a drain that takes longer is forced; 0 = 30 s */
    double progress_timeout_s; /* a running world that reported steps and then none for this long
                                  hangs (a stopped rank between steps holds no lease): it is ended
                                  as a failure; 0 = 600 s, < 0 = never                          */
    double cooldown_min_s;   /* blacklist cooldown after the k-th failure of a node:           */
    double cooldown_max_s;   /*   min * 2^(k-1), at most max; 0 = 10 s and 600 s               */
    /* The data job. Set: the ledger is created with it when the first world forms. NULL: the
     * workers declare it (adt_elastic_data_init) and the first declaration creates it. */
    const adt_ledger_job *data;
    int ranks_per_replica;   /* with `data`: ranks of one data-parallel replica; 0 = 1         */
    unsigned ledger_flags;   /* ADT_LEDGER_NOSYNC for tests                                     */
    int max_wait_ms;         /* longest a long-poll request is held; 0 = 30000, < 0 = never
                                hold one (the fuzzer)                                          */
    const char *run_id;      /* the job's id (TORCHELASTIC_RUN_ID); default: kept in the state,
                                or made up                                                     */
    /* The straggler controller (adtrain/straggler.h): "off" (default), "dd" or "nd", and its
     * "key=value,..." config (NULL: the defaults; refused without a policy). With dd or nd the
     * master drives every world's split from the compute times the workers send with their step
     * reports (adt_elastic_report_compute): the data calls' replies carry the split and the step
     * it applies from, the same for every replica; commits store it. Trainers outside the
     * agents may still report to /v1/straggler/report. */
    const char *straggler_policy, *straggler_config;
    /* What the job trains (served as GET /v1/job's "spec"); NULL: nothing told. Copied. The
     * master adds checkpoint_dir (DIR/checkpoints) and the straggler policy itself. */
    const adt_elastic_job_spec *spec;
    /* Re-planning. When set, called (under the master's lock) each time a world of `world`
     * ranks forms, before its agents learn of it: the plan for that world into *out (zeroed
     * first). The master writes out->json to DIR/plan-g<G>.json (an atomic rename), records a
     * "replan" event (strategy, mesh, predicted step time, the note, how long planning took) and
     * serves the text to the workers (GET /v1/plan). A non-zero return leaves the world without
     * a plan (data parallel), the message in the event. NULL: every world is data parallel. */
    int (*plan_world)(void *ctx, const adt_world_shape *shape, adt_world_plan *out);
    void *plan_ctx;
} adt_master_config;

/* Opens (or creates) the job's state; serves nothing yet. Errors name the flag or file. */
int adt_master_create(adt_master **out, const adt_master_config *cfg);
/* Binds the listen address and serves the API (a thread per connection, plus one thread that
 * runs adt_master_tick every 100 ms). */
int adt_master_start(adt_master *m);
/* The port it listens on (after adt_master_start). */
int adt_master_port(const adt_master *m);
/* Waits until the job is done or failed, or timeout_s passed (< 0: no limit); returns the job
 * state at that moment. */
adt_job_state adt_master_wait(adt_master *m, double timeout_s);
adt_job_state adt_master_job_state(adt_master *m);
/* Serves one request: every reply is JSON (or the Prometheus text of /metrics); a malformed or
 * refused request gets a 4xx reply with {"error": "..."}. Thread-safe; may block up to the
 * request's long-poll wait (at most max_wait_ms). */
void adt_master_handle(adt_master *m, const adt_http_request *rq, adt_http_reply *rp);
/* The periodic checks: heartbeat deadlines, expired leases, stop timeouts, blacklist cooldowns,
 * forming the next world. */
void adt_master_tick(adt_master *m);
/* Stops serving (in-flight requests are answered first) and closes the state. */
void adt_master_free(adt_master *m);

/* ---------------------------------------------------------------------------------------------
 * The agent
 */
typedef struct adt_agent_config {
    const char *master;       /* "HOST:PORT" of the master                                   */
    const char *token;        /* the job token, or NULL                                        */
    const char *node_id;      /* this node's name in the job (the blacklist's unit); default:
                                 the host name                                                */
    const char *host;         /* the host name to report; default gethostname()               */
    int nproc;                /* slots: ranks this node may run (>= 1)                         */
    adt_bind bind;            /* pin each local rank to a CPU                                  */
    const char *const *argv;  /* the worker command                                           */
    const char *const *env;   /* extra "NAME=value" for every worker, NULL-terminated, or NULL */
    double master_grace_s;    /* without a reply from the master this long, stop the workers;
                                 0 = 10 s                                                      */
    double master_timeout_s;  /* ... and give up (return an error) after this long; 0 = 60 s  */
    double kill_grace_s;      /* SIGTERM to SIGKILL when stopping workers; 0 = 0.5 s (a stopped
                                 world is discarded: its ranks have nothing left to save)      */
    int prefix_output;        /* workers' lines come back as "[rank R] ..."                    */
    int no_pmi;               /* plain commands, not MPI programs: no PMI; a rank succeeds by
                                 exiting 0                                                     */
    int stop_fd;              /* readable = leave the job: the first time after the workers
                                 stopped at a step boundary, the second time at once; -1 none  */
} adt_agent_config;

/* Runs the agent until the job ends: ADT_OK if it finished, an error (with the reason) if it
 * failed, the agent left, or the master stayed unreachable. Call it from the thread that lives
 * as long as the agent (workers die with the thread that started them). */
int adt_agent_run(const adt_agent_config *cfg);

/* ---------------------------------------------------------------------------------------------
 * The worker client. Environment the agent gives every worker, besides the torchrun contract
 * (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RESTART_COUNT, ...; MASTER_ADDR:MASTER_PORT is the master's API):
 *   ADT_MASTER       HOST:PORT of the master
 *   ADT_JOB_TOKEN    the job token (absent if none)
 *   ADT_GENERATION   the world generation the worker belongs to
 *   ADT_AGENT_ID     the agent that started it
 *   ADT_NODE_ID      its node (--node-id; the same after the agent restarts)
 * Every call has a deadline (timeout_s) and retries while the master cannot be reached (it may
 * be restarting); a call that reached the master and was refused is not retried.
 */
typedef struct adt_elastic adt_elastic;

typedef struct adt_elastic_config {
    const char *master;   /* NULL: $ADT_MASTER, else $MASTER_ADDR:$MASTER_PORT                */
    const char *token;    /* NULL: $ADT_JOB_TOKEN                                               */
    int64_t generation;   /* 0: $ADT_GENERATION                                                 */
    int replica;          /* the data-parallel replica; -1: $RANK / ranks_per_replica (the
                             master's)                                                         */
    double timeout_s;     /* per call; 0 = 30 s                                                  */
    int idle_replicas;    /* declared with the data job: replicas [0, idle_replicas) take no
                             samples (parameter servers) and no part in the master's split     */
    int64_t run_steps;    /* declared with the data job: the run stops after this many steps
                             (the trainer's --steps), below the ledger's job of whole epochs;
                             the master counts the steps left from it. 0: the ledger's        */
} adt_elastic_config;

typedef struct adt_elastic_info {
    int64_t generation;      /* the master's current generation                              */
    int running;             /* 1: it is running (requests of it are accepted)               */
    int world_size, replicas;
    int ranks_per_replica;
    int restarts;            /* failures so far                                              */
    int have_job;            /* a data job is declared (job below)                           */
    adt_ledger_job job;
    int64_t committed_steps; /* the commit in force: restore this checkpoint                 */
    char checkpoint[256];    /* its id ("" if none)                                          */
    int64_t stop_at;         /* > 0: stop after this many steps (a planned change)           */
    int have_split;          /* the master drives the split (below)                            */
} adt_elastic_info;

/* cfg may be NULL (everything from the environment). */
int adt_elastic_open(adt_elastic **out, const adt_elastic_config *cfg);
void adt_elastic_close(adt_elastic *c);
int64_t adt_elastic_generation(const adt_elastic *c);
int adt_elastic_replica(const adt_elastic *c);

/* Declares the data job (job->replicas is ignored: the master knows the world). The first
 * declaration creates the ledger; later ones must be identical (else ADT_ERR_ARG). */
int adt_elastic_data_init(adt_elastic *c, const adt_ledger_job *job, int ranks_per_replica);
int adt_elastic_get_info(adt_elastic *c, adt_elastic_info *out);
/* Leases at most max_samples positions (0: up to a shard); *grant as adt_ledger_lease_next. A
 * lease granted by a request whose reply was lost is handed out again, not a second one. */
int adt_elastic_lease(adt_elastic *c, int64_t max_samples, adt_ledger_lease *out, int *grant);
/* This replica consumed r[0..n) at step `step` (call it after the step's collectives, so that
 * every replica reported step s-1 before any reports step s+1). ADT_ERR_STALE: the generation
 * ended; stop. A report whose reply was lost is not counted twice. */
int adt_elastic_report(adt_elastic *c, int64_t step, const adt_ledger_range *r, int n);
/* adt_elastic_report then adt_elastic_lease in one round trip (POST /v1/data/step): the master
 * applies the report first; a refused report leases nothing. */
int adt_elastic_report_lease(adt_elastic *c, int64_t step, const adt_ledger_range *r, int n, int64_t max_samples,
                             adt_ledger_lease *out, int *grant);
/* A checkpoint after `steps` steps is durable; call it once every replica reported steps
 * < `steps` (e.g. after the checkpoint's own collective). */
int adt_elastic_commit(adt_elastic *c, int64_t steps, const char *checkpoint);
/* > 0: the master asked this generation to stop after this many steps (known from the last
 * reply); 0: no stop requested. */
int64_t adt_elastic_stop_at(const adt_elastic *c);

/* What the job trains, as the master was told it (GET /v1/job, "spec"); free with
 * adt_elastic_job_spec_free. */
int adt_elastic_client_job(adt_elastic *c, adt_elastic_job_spec *out);

/* Reports as adt_elastic_report / adt_elastic_report_lease, with this replica's compute seconds
 * of the step (its forward and backward passes, not the time blocked in collectives; < 0: not
 * measured). The master's straggler controller (dd, nd) judges speeds from them and decides the
 * split; the samples are the reported ranges' sizes. */
int adt_elastic_report_compute(adt_elastic *c, int64_t step, const adt_ledger_range *r, int n, double compute_s);
/* The next report (of any kind above) also carries each parameter server's answer time to this
 * replica's pulls of its step, s[0..n) seconds (field server_s; n equal to the data job's
 * idle_replicas): the master's monitor compares the servers by them. n <= 0: none. */
#define ADT_ELASTIC_MAX_SERVERS 64
void adt_elastic_set_server_times(adt_elastic *c, const double *s, int n);
int adt_elastic_report_lease_compute(adt_elastic *c, int64_t step, const adt_ledger_range *r, int n,
                                     double compute_s, int64_t max_samples, adt_ledger_lease *out, int *grant);

/* The split: with a straggler policy (or a plan with a "batch_split") the master decides every
 * replica's local batch. Every data reply (info, init, lease, report, step, commit) carries
 *   "split": [b_0, ..., b_{R-1}], "from_step": F, "split_before": [...]
 * the same for every replica: steps >= F run `split`, steps < F `split_before`. The master
 * picks F at least 4 steps above every step reported when it decides, and makes no new decision
 * until F was reached, so a worker that has the reply to its report of step t-3 before it leases
 * for step t (adt_elastic_pipe does: a step's end has the reply to the step before) knows
 * step t's local batch, and every replica switches at the same step. A commit stores the
 * split in force at its step; a new world of as many replicas resumes it.
 * Returns this replica's local batch at `step`, or 0 when the master sends no split (the
 * worker's own even division applies). */
int64_t adt_elastic_local_batch(const adt_elastic *c, int64_t step);
/* The whole split at `step` into split[0..n) (n >= replicas); returns the replicas, 0 if none. */
int adt_elastic_split(const adt_elastic *c, int64_t step, int64_t *split, int n);

/* The lease and report calls off the training step: a thread of the pipe makes client c's calls
 * in the order asked (c is the thread's until adt_elastic_pipe_free; the caller frees c after).
 * adt_elastic_pipe_prefetch asks for a lease ahead (nothing if one is asked already); the next
 * adt_elastic_pipe_lease returns it, waiting only if its reply is not in (without one asked, it
 * asks and waits). adt_elastic_pipe_report queues a report once the previous one was
 * acknowledged (so a step's end knows the reply to the step before); a report followed within
 * 50 ms by a lease request goes in one call with it (adt_elastic_report_lease). adt_elastic_pipe_drain
 * waits until every queued report was acknowledged: commit after it. The first refusal
 * (ADT_ERR_STALE: the generation ended) is kept: the thread sends nothing more and every call
 * returns it. adt_elastic_pipe_status returns it without waiting; adt_elastic_pipe_stop_at is
 * adt_elastic_stop_at as of the last reply. */
typedef struct adt_elastic_pipe adt_elastic_pipe;
int adt_elastic_pipe_start(adt_elastic_pipe **out, adt_elastic *c);
int adt_elastic_pipe_prefetch(adt_elastic_pipe *p, int64_t max_samples);
int adt_elastic_pipe_lease(adt_elastic_pipe *p, int64_t max_samples, adt_ledger_lease *out, int *grant);
int adt_elastic_pipe_report(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n);
/* The same with the step's compute seconds (adt_elastic_report_compute). */
int adt_elastic_pipe_report_compute(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n,
                                    double compute_s);
/* The same with the servers' answer times (adt_elastic_set_server_times). */
int adt_elastic_pipe_report_timed(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n,
                                  double compute_s, const double *server_s, int n_servers);
/* adt_elastic_local_batch as of the last reply the pipe's thread received. */
int64_t adt_elastic_pipe_local_batch(adt_elastic_pipe *p, int64_t step);
int adt_elastic_pipe_drain(adt_elastic_pipe *p);
int adt_elastic_pipe_status(adt_elastic_pipe *p);
int64_t adt_elastic_pipe_stop_at(adt_elastic_pipe *p);
/* Joins the thread (after its call in flight, if any); queued calls are dropped. */
void adt_elastic_pipe_free(adt_elastic_pipe *p);

/* One request to a master, no retries: for tools (adtrain status, scale) and tests. *reply is
 * malloc'd (free() it; may be NULL on transport errors). Returns ADT_OK when a reply came (any
 * HTTP status, in *status), ADT_ERR_IO naming the address otherwise. */
int adt_master_call(const char *master, const char *token, const char *method, const char *path,
                    const char *body, double timeout_s, int *status, char **reply);

#ifdef __cplusplus
}
#endif
#endif
