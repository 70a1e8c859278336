/*
 * adtrain/ps.h - the parameter-server mode: embedding rows held by server ranks, pulled and
 * pushed by worker ranks.
 *
 * Rows. A row is (table t, id): id any 64-bit value, so a hashed id space of unbounded size works
 * as well as a table of declared size. Row (t, id) lives on server mix64(t, id) mod S. A server's
 * store creates a row the first time a worker touches it, with the value the one-process model
 * would have given element (id, j) of its table "emb.<t>.weight": lo + (hi - lo) U(key(seed,
 * name), id * dim + j) (adt_exec_init_params), so a run over servers starts where a one-process
 * run does. Each table holds at most `capacity` rows per server; when a new row does not fit, the
 * table's full-rule decides: REFUSE (the lookup fails with an error naming the table and its
 * capacity) or EVICT (the least recently touched row is dropped, weights and optimizer state;
 * touching it again re-creates it at its initial value). Rows touched at the current step are
 * never evicted: a step that needs more rows than the capacity fails with an error either way.
 *
 * Sparse optimizers, applied per row to the gradient summed over the step's occurrences (and, in
 * sync mode, over the workers):
 *   SGD      w -= lr g                                                 (= dense SGD, any row)
 *   Adagrad  s += g g;  w -= lr g / (sqrt(s) + eps)                     (PyTorch's Adagrad)
 *   Adam     lazy: m and v of a row change only at steps that touch it; the bias corrections use
 *            the global step t (PyTorch's SparseAdam, TensorFlow's LazyAdam). The one-process
 *            reference is dense Adam (weight decay 0) applied at step t to the rows whose gradient
 *            row is nonzero, and not to the others.
 * SGD and Adagrad leave a row with a zero gradient unchanged, so sparse equals dense exactly on
 * every row; lazy Adam equals the reference above.
 *
 * Consistency (adt_ps_sync): each worker pulls and pushes once per step to every server (empty
 * lists included: the messages carry the step clock). A server answers the pull of step s of any
 * worker only when every worker has pushed step s - 1 - K (the staleness clock below), so no
 * worker computes more than K steps ahead of the slowest:
 *   sync     K = 0, and the pushes of a step are summed in worker order and applied once: each
 *            step's update equals the one-process update of the whole batch.
 *   ssp:K    K >= 1, each push applied when it arrives.
 *   async    no bound, each push applied when it arrives.
 *
 * Ranks: of a world of N, ranks [0, S) serve and [S, N) work. Dense parameters either stay with
 * the workers, which all-reduce their gradients among themselves (adt_ps_world's worker
 * communicator: hybrid), or live on the servers as whole tables pulled and pushed every step
 * (adt_ps_tables_dlrm_dense), so workers share nothing but the servers and ssp/async let them
 * drift apart for the dense part too. Every wait is bounded by the timeout: a peer that stops
 * answering is an error naming it, never a hang.
 */
#ifndef ADTRAIN_PS_H
#define ADTRAIN_PS_H

#include <stdint.h>

#include "adtrain/comm.h"
#include "adtrain/exec.h"
#include "adtrain/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_PS_MAX_TABLES 256

/* ---- consistency and the staleness clock ---------------------------------------------------- */
typedef enum adt_ps_sync_kind { ADT_PS_SYNC = 0, ADT_PS_SSP, ADT_PS_ASYNC } adt_ps_sync_kind;
typedef struct adt_ps_sync {
    adt_ps_sync_kind kind;
    int staleness; /* K: 0 for sync, >= 1 for ssp, unused for async */
} adt_ps_sync;

/* "sync", "ssp:K" (K >= 1) or "async"; an error naming `what` (a flag) and the forms expected. */
int adt_ps_sync_parse(const char *s, const char *what, adt_ps_sync *out);
/* "sync", "ssp:3", "async" into buf. */
const char *adt_ps_sync_str(adt_ps_sync s, char *buf, int n);

/* The staleness clock: a pure state machine (no I/O), one per server. done[w] is the number of
 * steps worker w has pushed (its pushes must come in step order: 0, 1, 2, ...). */
typedef struct adt_ps_clock {
    adt_ps_sync sync;
    int n_workers;
    int64_t *done; /* [n_workers] */
} adt_ps_clock;

int adt_ps_clock_init(adt_ps_clock *c, int n_workers, adt_ps_sync sync);
void adt_ps_clock_free(adt_ps_clock *c);
/* Worker w pushed step `step`: ADT_OK, or ADT_ERR_STATE when it is not the step expected next
 * (a protocol error: the message names both). */
int adt_ps_clock_push(adt_ps_clock *c, int w, int64_t step);
/* Worker w stopped: it no longer holds the others back. */
void adt_ps_clock_leave(adt_ps_clock *c, int w);
/* The fewest steps any worker has pushed (workers that left count as infinitely far). */
int64_t adt_ps_clock_min(const adt_ps_clock *c);
/* Whether a pull of step `step` may be answered now: step - min <= K (always under async). */
int adt_ps_clock_may_serve(const adt_ps_clock *c, int64_t step);
/* A resumed run: every worker has pushed steps 0 .. step-1. */
void adt_ps_clock_start(adt_ps_clock *c, int64_t step);
/* Sync only: whether every worker has pushed step `step` (its summed update may be applied). */
int adt_ps_clock_step_gathered(const adt_ps_clock *c, int64_t step);

/* ---- dynamic sharding ------------------------------------------------------------------------
 * The run's samples cut into `total` chunks (a worker's batch each), handed out in index order to
 * whichever worker asks: each chunk exactly once, a slow worker taking fewer. A pure state
 * machine; server 0 runs one when adt_ps_cfg.chunks > 0 and answers adt_ps_worker_next_chunk. */
typedef struct adt_ps_dispatch {
    int64_t total, next;
    int n_workers;
    int64_t *taken; /* [n_workers] chunks handed to each */
} adt_ps_dispatch;
int adt_ps_dispatch_init(adt_ps_dispatch *d, int64_t total, int n_workers);
void adt_ps_dispatch_free(adt_ps_dispatch *d);
/* The next chunk for worker w, or -1 when every chunk is out (or w is not a worker). */
int64_t adt_ps_dispatch_next(adt_ps_dispatch *d, int w);

/* ---- sparse optimizers -------------------------------------------------------------------- */
typedef enum adt_ps_optim_kind { ADT_PS_SGD = 0, ADT_PS_ADAGRAD, ADT_PS_ADAM } adt_ps_optim_kind;
typedef struct adt_ps_optim {
    adt_ps_optim_kind kind;
    float lr;
    float beta1, beta2; /* Adam */
    float eps;          /* Adam, Adagrad */
} adt_ps_optim;
/* Optimizer state floats per weight: 0 (SGD), 1 (Adagrad's sum), 2 (Adam's m then v). */
int adt_ps_optim_states(adt_ps_optim_kind k);
/* "sgd", "adagrad", "adam" -> kind; an error naming `what` otherwise. */
int adt_ps_optim_parse(const char *s, const char *what, adt_ps_optim_kind *out);
/* One update of n weights w with gradient g at global step `step` (1-based); state holds
 * adt_ps_optim_states(kind) * n floats laid out [m(n) | v(n)] (Adam) or [s(n)] (Adagrad). The
 * same arithmetic as the executor's dense update (SGD, Adam: its kernels with weight decay 0),
 * so a whole dense parameter can be updated by it too. */
void adt_ps_optim_apply(const adt_ps_optim *o, float *w, float *state, const float *g, int64_t n, int64_t step);

/* ---- the row store (one server's shard) ------------------------------------------------------ */
typedef enum adt_ps_full_rule { ADT_PS_REFUSE = 0, ADT_PS_EVICT } adt_ps_full_rule;

typedef struct adt_ps_table {
    char name[96];    /* "emb.<t>.weight": the initialisation key, and the name in messages */
    int dim;          /* floats per row */
    int64_t rows;     /* declared id space [0, rows); 0: any 64-bit id */
    float init_lo, init_hi; /* a new row's elements: uniform in [init_lo, init_hi) */
    int64_t capacity; /* rows held at most (per server) */
    adt_ps_full_rule full;
    /* A dense parameter kept on the servers: every row is pulled and pushed at every step (the
     * worker's rows and gradients for it are the flat parameter, rows * dim floats, not per
     * sample), updated by `optim` when its lr > 0 (else the store's). */
    int whole;
    adt_ps_optim optim;
} adt_ps_table;

typedef struct adt_ps_store_stats {
    int64_t rows, created, evicted, lookups, updates;
} adt_ps_store_stats;

typedef struct adt_ps_store adt_ps_store;

int adt_ps_store_create(adt_ps_store **out, const adt_ps_table *tables, int n_tables, const adt_ps_optim *optim,
                        uint64_t seed);
void adt_ps_store_free(adt_ps_store *s);
/* Copies rows ids[0..n) of table t into out[n * dim] as they are, neither creating nor touching
 * any: an absent row reads as its initial value. */
int adt_ps_store_peek(const adt_ps_store *s, int t, const uint64_t *ids, int64_t n, float *out);
/* Copies rows ids[0..n) of table t into out[n * dim], creating missing ones (and evicting under
 * EVICT). `now` is the caller's step: rows it touches are stamped with it and not evicted while
 * it lasts. An id outside a declared id space, or a full table under REFUSE, is an error. */
int adt_ps_store_pull(adt_ps_store *s, int t, const uint64_t *ids, int64_t n, float *out, int64_t now);
/* Applies the optimizer to rows ids[0..n) (distinct) of table t with gradients g[n * dim] at
 * global step `step` (1-based); a row not present is created first. */
int adt_ps_store_push(adt_ps_store *s, int t, const uint64_t *ids, int64_t n, const float *g, int64_t step,
                      int64_t now);
/* The learning rate of the pushes that follow, in place of the optimizer's: tables updated by
 * the store's optimizer take `lr`, tables with their own (adt_ps_table.optim) theirs scaled by
 * lr / the store's; 0: every optimizer's own rate again. */
void adt_ps_store_set_lr(adt_ps_store *s, float lr);
/* Row (t, id)'s weights and optimizer state (NULL when absent), for tests and inspection. */
const float *adt_ps_store_row(const adt_ps_store *s, int t, uint64_t id, const float **state);
void adt_ps_store_get_stats(const adt_ps_store *s, int t, adt_ps_store_stats *st);
/* The whole shard as safetensors: per table "<name>.ids" (U64 [n]), "<name>.w" (F32 [n, dim]),
 * "<name>.state" (F32 [n, states*dim], absent for SGD), rows in least- to most-recently touched
 * order, with metadata "adtrain.ps" = "1" and the optimizer kind. load replaces the store's rows
 * with the file's (tables matched by name and dim; an unknown or missing one is an error). */
int adt_ps_store_save(const adt_ps_store *s, const char *path);
int adt_ps_store_load(adt_ps_store *s, const char *path);

/* The server of row (t, id) among n_servers. */
int adt_ps_owner(int t, uint64_t id, int n_servers);

/* ---- ranks over MPI ----------------------------------------------------------------------- */
typedef struct adt_ps_cfg {
    int n_servers;
    int n_tables;
    adt_ps_table tables[ADT_PS_MAX_TABLES];
    adt_ps_optim optim;
    adt_ps_sync sync;
    int prefetch; /* pulls of up to this many later steps in flight beside the current one */
    uint64_t seed;
    double timeout_s; /* 0: the world's communicator timeout */
    /* A learning-rate schedule, or NULL (optim.lr throughout): the rate of global step `step`
     * (1-based), with which a server applies the pushes of that step (adt_ps_store_set_lr). A
     * pure function of the step, so a push applied late (ssp, async) gets its own step's rate. */
    float (*lr_at)(void *ctx, int64_t step);
    void *lr_ctx;
    /* Steps run before this run (it resumes a checkpoint): the clock starts with every worker
     * having pushed steps 0 .. first_step-1, and a worker's first pull is of step first_step. */
    int64_t first_step;
    /* Dynamic sharding: server 0 hands out chunks [0, chunks) one per request
     * (adt_ps_worker_next_chunk); 0: none (every worker takes its fixed block of each step). */
    int64_t chunks;
    /* A test's slower server (--inject-slowdown on a server rank): it sleeps this long before
     * answering each pull. 0: none. */
    double answer_delay_s;
} adt_ps_cfg;

/* Where this rank sits: a server, or worker `worker` of n_workers, with the communicator of the
 * workers (for their dense all-reduces; NULL on servers). Collective over world. */
typedef struct adt_ps_world {
    adt_comm *world;
    int is_server;
    int server; /* index among the servers, or -1 */
    int worker; /* index among the workers, or -1 */
    int n_servers, n_workers;
    adt_comm *workers;
    void *mpi; /* a duplicate of the world's MPI communicator: the PS protocol's own */
} adt_ps_world;
int adt_ps_world_init(adt_ps_world *pw, adt_comm *world, int n_servers);
int adt_ps_world_free(adt_ps_world *pw);

/* A server: answers pulls and applies pushes until every worker has said it is done, then
 * returns (the store stays with the caller, who may save it). */
typedef struct adt_ps_server_stats {
    int64_t pulls, pushes, rows_pulled, rows_pushed, deferred;
    int64_t max_lead; /* largest (pull step - slowest worker's pushed steps) ever answered */
    double idle_s;
} adt_ps_server_stats;
int adt_ps_server_run(adt_ps_world *pw, const adt_ps_cfg *cfg, adt_ps_store *store, adt_ps_server_stats *st);

/* A worker. Per step s: adt_ps_worker_pull (ids of its part of the batch, [B, tables that are not
 * whole], may be called ahead for steps s+1 .. s+prefetch), adt_ps_worker_rows (waits, then
 * rows[t] = [B, dim_t] in batch order; [rows_t, dim_t] for a whole table), compute,
 * adt_ps_worker_push (gradients [B, dim_t] per table ([rows_t, dim_t] whole), already scaled
 * as the global loss wants them: summed per distinct row here, and over workers by the servers).
 * Steps are 0-based and consecutive. adt_ps_worker_done tells the servers this worker stops. */
typedef struct adt_ps_worker adt_ps_worker;
typedef struct adt_ps_worker_stats {
    int64_t ids, unique_ids;
    double wait_rows_s, push_s;
} adt_ps_worker_stats;
int adt_ps_worker_create(adt_ps_worker **out, adt_ps_world *pw, const adt_ps_cfg *cfg);
void adt_ps_worker_free(adt_ps_worker *w);
int adt_ps_worker_pull(adt_ps_worker *w, int64_t step, const int32_t *ids, int B);
int adt_ps_worker_rows(adt_ps_worker *w, int64_t step, float *const *rows);
/* Each server's answer time to the last rows waited for (adt_ps_worker_rows): from the pull's
 * requests going out to its answer seen, into s[0..min(n, S)); returns S. A slow server shows
 * here before it shows in a step: the elastic master's monitor compares the servers by it. */
int adt_ps_worker_answer_s(const adt_ps_worker *w, double *s, int n);
int adt_ps_worker_push(adt_ps_worker *w, int64_t step, const float *const *grads);
int adt_ps_worker_done(adt_ps_worker *w);
/* Dynamic sharding (cfg.chunks > 0): the next chunk from server 0; *chunk is -1 once every chunk
 * of the run is out. Waits for the answer to the ask in flight (or asks), then asks for the one
 * after, so the round trip overlaps the caller's work; call it until it gives -1 before
 * adt_ps_worker_done. May come between any two calls above (a worker asks ahead for the steps it
 * prefetches). */
int adt_ps_worker_next_chunk(adt_ps_worker *w, int64_t *chunk);
/* Evaluation: the rows of ids [B, tables that are not whole] (and whole tables) as the servers
 * hold them once every worker has pushed the steps this one has pushed (so under sync a lookup
 * after step s reads the one-process rows of step s; under ssp/async pushes of later steps by
 * faster workers may be in them too), outside the step clock, creating and touching nothing (an
 * absent row reads as its initial value). Blocking; may come between any two calls above. */
int adt_ps_worker_lookup(adt_ps_worker *w, const int32_t *ids, int B, float *const *rows);
/* A consistent cut after the steps this worker has pushed: sends every server a cut marker with
 * the path of its shard file (paths[k] for server k) and waits until each has written it
 * (adt_ps_store_save) or failed (its message returned). Every worker must call it after the same
 * step. A server writes once every working worker's marker has come: each worker's pushes come
 * before its marker on the same channel and are applied on arrival (sync: the step's sum once
 * its last push is in), so the shard holds every push of the steps before the cut; and no worker
 * pushes again before its answer, so it holds none after. Under ssp/async the faster workers
 * wait here for the slowest. */
int adt_ps_worker_save(adt_ps_worker *w, const char *const *paths);
void adt_ps_worker_get_stats(const adt_ps_worker *w, adt_ps_worker_stats *st);
const adt_ps_cfg *adt_ps_worker_cfg(const adt_ps_worker *w);

/* ---- a DLRM on a worker ---------------------------------------------------------------------- */
/* The tables of a DLRM config as the servers hold them: emb.<t>.weight, dim emb_dim, rows as
 * declared, DLRM's initial range U(-sqrt(1/rows), sqrt(1/rows)), the given capacity per server
 * (0: every declared row) and full-rule. Sets cfg->n_tables and cfg->tables. */
struct adt_dlrm_cfg;
int adt_ps_tables_dlrm(adt_ps_cfg *cfg, const struct adt_dlrm_cfg *c, int64_t capacity, adt_ps_full_rule full);

/* Dense parameters kept on the servers: appends to cfg, after the embedding tables, one whole
 * table per dense parameter of the DLRM (named as the parameter, rows of ADT_PS_DENSE_ROW floats,
 * the last padded; its initial range; updated by `dense`). Servers and workers make the same
 * call; adt_ps_dlrm_step then pulls and pushes them each step and all-reduces nothing. */
#define ADT_PS_DENSE_ROW 256
int adt_ps_tables_dlrm_dense(adt_ps_cfg *cfg, const struct adt_dlrm_cfg *c, const adt_ps_optim *dense);

/* A worker's DLRM: adt_model_dlrm_ps (the tables' rows fed as parameters "ps.rows.<t>") with its
 * backward pass, run by an executor; the dense parameters updated here by `dense` (SGD or Adam:
 * the executor's kernels, weight decay 0, so a one-process graph with that optimizer is the
 * reference), after their gradients are summed over the workers' communicator. */
typedef struct adt_ps_dlrm adt_ps_dlrm;
int adt_ps_dlrm_create(adt_ps_dlrm **out, const struct adt_dlrm_cfg *c, int batch, const adt_ps_optim *dense,
                       const adt_exec_opts *eo);
void adt_ps_dlrm_free(adt_ps_dlrm *d);
/* The same model at another batch (a worker whose share of the global batch changed): a new graph
 * and executor, the dense parameters and their optimizer state carried over. */
int adt_ps_dlrm_resize(adt_ps_dlrm *d, int batch, const adt_exec_opts *eo);
/* Where table t's rows for the batch go ([batch, emb_dim]), before adt_ps_dlrm_compute. */
float *adt_ps_dlrm_rows(adt_ps_dlrm *d, int t);
/* The forward and backward pass on dense features [batch, n_dense] and labels [batch]; *loss is
 * the batch's mean loss. Then adt_ps_dlrm_row_grad(t) is d(loss)/d(rows of table t). */
int adt_ps_dlrm_compute(adt_ps_dlrm *d, const float *dense, const float *labels, float *loss);
float *adt_ps_dlrm_row_grad(adt_ps_dlrm *d, int t);
/* The dense parameters' learning rate from here on (a schedule's rate of the next update). */
void adt_ps_dlrm_set_lr(adt_ps_dlrm *d, float lr);
/* Scales the dense gradients by `scale` (this worker's share of the global batch), sums them
 * over `workers` (NULL: alone) and applies the update of global step `step` (1-based). */
int adt_ps_dlrm_update_dense(adt_ps_dlrm *d, adt_comm *workers, float scale, int64_t step);
adt_exec *adt_ps_dlrm_exec(adt_ps_dlrm *d);
/* Seconds spent so far in the dense gradients' all-reduce among the workers (hybrid): a worker
 * that waits there for a slower one is not computing. */
double adt_ps_dlrm_sync_s(const adt_ps_dlrm *d);
/* The worker's dense parameters and their optimizer state as safetensors (tensor "<name>" and,
 * for Adam, "<name>.state" [2 * numel]: m then v), with the given metadata pairs; load reads
 * them back (a missing tensor or another shape is an error naming the file). */
int adt_ps_dlrm_save(const adt_ps_dlrm *d, const char *path, const char *const *kv, int n_pairs);
int adt_ps_dlrm_load(adt_ps_dlrm *d, const char *path);
/* One step s (0-based) of a worker: rows of step s (pulled before, adt_ps_worker_pull), compute,
 * row gradients scaled by `scale` and pushed, dense update of step s+1 (or, when the worker's
 * config has the dense tables of adt_ps_tables_dlrm_dense, the dense parameters pulled with the
 * rows and their gradients pushed with them). */
int adt_ps_dlrm_step(adt_ps_dlrm *d, adt_ps_worker *w, adt_comm *workers, int64_t step, const float *dense,
                     const float *labels, float scale, float *loss);
/* Evaluation of a batch (ids [batch, n_tables], dense, labels) on the rows and dense parameters
 * the servers hold after every worker's pushes of the steps this one pushed (adt_ps_worker_lookup): the forward pass only; *loss the batch's
 * mean loss, logits[batch] (either may be NULL). With hybrid dense parameters, the worker's own. */
int adt_ps_dlrm_eval(adt_ps_dlrm *d, adt_ps_worker *w, const int32_t *ids, const float *dense, const float *labels,
                     float *loss, float *logits);

#ifdef __cplusplus
}
#endif
#endif
