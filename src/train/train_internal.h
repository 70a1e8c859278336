/*
 * train_internal.h - what the parts of the trainer share: the data sources, the trainer object
 * (model, data, graph, plan, executor, log), and the two interfaces a step runs through: a runner
 * (how the graph runs) and a feed (where the samples come from, what follows a step).
 */
#ifndef ADTRAIN_TRAIN_INTERNAL_H
#define ADTRAIN_TRAIN_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "adtrain/ckpt.h"
#include "adtrain/comm.h"
#include "adtrain/data.h"
#include "adtrain/dist.h"
#include "adtrain/exec.h"
#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "adtrain/elastic.h"
#include "adtrain/train.h"

/* Failure classes: ADT_ERR_ARG is the user's input, found before the first step (exit 2 in the
 * CLI); TRAIN_ERR_RUN a failure while running (exit 1). The message goes to the error slot. */
#define EXIT_USAGE ADT_ERR_ARG
#define EXIT_RUNTIME ADT_ERR_RUNTIME
#define train_fail(code, ...) adt_error((code), __VA_ARGS__)

typedef adt_train_opts train_opts;

/* ---- data sources (train_data.c): a range of sample ids of one dataset ---------------------- */
typedef struct train_source {
    const char *spec;
    adt_dataset *ds;
    int owns;             /* frees ds (the holdout shares the training dataset) */
    int64_t first, count; /* sample ids [first, first+count) of ds */
} train_source;

typedef struct train_runner train_runner;
typedef struct train_psplit train_psplit;
typedef struct train_ps train_ps;
typedef struct train_feed train_feed;

struct adt_trainer {
    const train_runner *run; /* how a step runs                                             */
    const train_feed *feed;  /* where its samples come from, what follows it                */
    train_opts o;
    adt_model_cfg model;
    char model_label[320];
    int builtin_model;
    train_source train, val;
    int val_holdout; /* val is the tail of --data */
    int T;           /* tokens per sample (1 for the other families) */
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex;
    adt_sampler sampler;
    int64_t *idx; /* [batch] sample indices of the current batch */
    FILE *log;
    int tty;
    long start_step; /* steps already done: 0, or the step of the --resume checkpoint */
    /* evaluation metric beyond the loss: accuracy (mlp, vgg) or AUC (dlrm) */
    int64_t metric_hits, metric_n;
    float *scores, *labels; /* dlrm: [eval batches * batch] */
    /* distributed (train_dist.c): started by an MPI launcher with more than one rank */
    adt_comm *world;      /* NULL: one process */
    int rank, nranks;
    adt_plan xplan;       /* the plan: --plan's file, or the data-parallel expert plan */
    adt_dist_plan plan;   /* what the partitioner takes from it (its stage mesh and layouts) */
    int *plan_ranks;      /* the stage mesh's ranks */
    int coord[ADT_MAX_MESH_DIMS]; /* this rank's place on that mesh */
    char plan_label[320];
    adt_optim_cfg oc;     /* the run's optimizer (a plan must be made for its kind) */
    adt_dist_local loc;   /* the local graph the executor runs (loc.g), and where each value lives */
    adt_mesh_comm *mc;
    void *stage[3];       /* the fed samples of this rank's part of a batch: input, input2, label */
    void *gathered[2];    /* whole values read back for metrics (logits, label) */
    /* a plan with pipeline stages or microbatches (train_dist.c): its graph at batch / M */
    adt_graph *pg;
    adt_model_io pio;
    adt_pipe *pipe;       /* the rank's stage; t->ex is its executor */
    char *ckpt_elsewhere; /* [pg's n_values] the stage's checkpoint view: what an earlier stage writes */
    struct train_bal *bal; /* balanced data parallelism (train_balance.c), NULL when off */
    struct train_elastic *el; /* NULL unless started by an elastic agent */
    char *plan_text;          /* the elastic master's plan for this world, or NULL             */
    adt_elastic_job_spec spec; /* an elastic job's spec (what its master was told)             */
    char *spec_model_json;    /* the elastic job's model config (its spec), when --model was not given */
    char spec_ckpt_dir[1024]; /* the elastic job's checkpoint directory, when told             */
    long next_step;           /* the step adt_trainer_step runs next                           */
    int finished;             /* no step left: the run is complete or stopped                  */
    int saved_at_end;         /* adt_trainer_finish has nothing left to save                   */
    double first_loss, loop_t0, total_s;
    long profiled_from;       /* the first step the profile counts                            */
    double step_flops;        /* FLOPs of one step on the global batch (the runner's graphs)  */
    adt_exec_opts eo;         /* the options the executors were made with                     */
    train_psplit *psplit;     /* balanced data parallelism under a plan (plan_split.c), or NULL */
    train_ps *ps;             /* the parameter-server mode (ps.c), or NULL                     */
    int reporter;             /* the rank that logs and notes: 0, or the first worker (ps mode) */
    int serving;              /* this rank's one step was its whole service (a parameter server) */
};
typedef struct adt_trainer trainer;

/* How a step runs. build makes the graphs and plan (no communication), executor the executors
 * (collective), step one training step on the global batch idx, eval the forward pass of one
 * evaluation batch (NULL: the runner cannot evaluate), finish what ends a run after its final
 * checkpoint (NULL: nothing). */
struct train_runner {
    const char *name;
    int (*build)(trainer *t);
    int (*executor)(trainer *t, const adt_exec_opts *eo);
    int (*step)(trainer *t, long step, int64_t *idx, double *loss);
    int (*eval)(trainer *t, const train_source *s, int64_t *idx, double *loss);
    void (*banner)(const trainer *t, FILE *f);
    void (*free)(trainer *t);
    int (*finish)(trainer *t);
};
extern const train_runner train_runner_plan;    /* the partitioned graph of a plan (collective.c) */
extern const train_runner train_runner_pipe;    /* a plan with stages or microbatches (collective.c) */
extern const train_runner train_runner_balance; /* per-rank local batches (balance.c)           */
extern const train_runner train_runner_ps;      /* servers and workers, --mode ps (ps.c)         */
/* ps.c: the options and world --mode ps needs, checked (ADT_ERR_ARG naming the flag). */
int train_ps_check(trainer *t);
/* A checkpoint of --mode ps: a directory with each server's shard (server-K.safetensors) and,
 * written last, the run file: the metadata pairs kv and the workers' dense parameters with their
 * optimizer state. Collective over the workers (servers write when asked, in their loop). */
#define TRAIN_PS_CKPT_FORMAT "adtrain-ps-state-1"
#define TRAIN_PS_RUN_FILE "run.safetensors"
int train_ps_save(trainer *t, const char *dir, long step, const char *const *kv, int n_pairs);
/* After the run file's metadata was checked: this rank's shard or dense state, the clock's start. */
int train_ps_resume(trainer *t, const char *dir, long step);
/* Under --mode ps only the workers take samples (an elastic job's leases, reports, commits): whether
 * this rank serves, the workers' communicator (NULL on a server), a rank's samples per step (0 on a
 * server). */
int train_ps_serves(const trainer *t);
adt_comm *train_ps_workers(const trainer *t);
int64_t train_ps_local_batch(const trainer *t);
/* The last step's compute seconds of a worker (-1 on a server, or before its first step). */
double train_ps_compute_s(const trainer *t);
/* A worker's last step's answer time per server (adt_ps_worker_answer_s) into s[0..n); returns
 * the number of servers, 0 on a server or before the first step. */
int train_ps_answer_s(const trainer *t, double *s, int n);
/* Under the elastic master's split: the workers' local batches of `step` (the gathered leases);
 * a worker whose share changed remakes its model at the new batch. */
int train_ps_set_split(trainer *t, const int64_t *split, int n, long step);
/* The rows' optimizer ("sgd", "adagrad", "adam"), saved with a checkpoint and checked on resume. */
const char *train_ps_sparse_optimizer(const trainer *t);

/* Where a step's samples come from and what follows it. plan: before the graph is partitioned,
 * the plan to run (NULL: --plan or data parallel); start: after the executor and checkpoints
 * (1: no step left); batch: the step's global batch of sample indices; done: after the step
 * (*stop: leave the loop). */
struct train_feed {
    const char *name;
    int (*plan)(trainer *t);
    int (*start)(trainer *t);
    int (*batch)(trainer *t, long step, int64_t *idx);
    int (*done)(trainer *t, long step, int *stop);
    void (*free)(trainer *t);
};
extern const train_feed train_feed_sampler; /* the seeded sampler (trainer.c)                  */
extern const train_feed train_feed_elastic; /* an elastic job's leases (elastic.c)             */

/* A straggler action as a JSON log line (rank 0's log): who decided it ("ranks", "master"), the
 * split it set (n local batches), the monitor's state of each (mon may be NULL). */
void train_log_action(trainer *t, const adt_straggler_action *act, const char *by, const int64_t *split, int n,
                      const adt_straggler *mon);

/* plan_split.c: balanced data parallelism under a plan (--plan with --straggler-policy, --split,
 * --inject-slowdown): init after the plan is bound to g (its split set), after_step once a step
 * ran (the controller; a new split remakes the rank's executor), banner, free. */
int train_psplit_init(trainer *t, const adt_graph *g, const char *flag);
int train_psplit_after_step(trainer *t, long step);
void train_psplit_banner(const trainer *t, FILE *f);
void train_psplit_free(trainer *t);

/* --inject-slowdown on a whole step: on the slowed rank, within its steps, sleeps FACTOR - 1 times
 * `compute` plus any pause (as a slower device would take) and returns compute with the sleep in
 * it; elsewhere returns compute. step: the rank's own 1-based step. */
double train_slow_step(const trainer *t, long step, double compute);

/* Learning rate of step s (1-based): linear warmup, then constant or cosine down to lr/10. A pure
 * function of the step, so parameter servers apply the rate of the step a push belongs to. */
double train_lr_at(const train_opts *o, long s);

/* A note for the caller (rank 0 only): formats and hands the line to opts.note. */
void train_note(const trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* train_data.c: the model config, then the training and validation data that fit it. */
int train_load_model(trainer *t);
int train_open_data(trainer *t);
int train_check_batches(trainer *t);
/* Writes the batch of local sample indices `idx` (0-based within the source's range; turned into
 * dataset sample ids in place) into the fed inputs. */
int train_source_fill(const train_source *s, int64_t *idx, int n, void *input, void *input2, void *label);
void train_data_free(trainer *t);
/* The metric of the validation batches since the last reset (after each forward run: add). */
void train_metric_reset(trainer *t);
int train_metric_add(trainer *t, int batch);
void train_metric_format(trainer *t, char *json, size_t nj, char *text, size_t nt);

/* train_dist.c: the run over MPI ranks, and what both kinds of run read and write through. */
int train_world_init(trainer *t);            /* MPI when launched by mpiexec; sets rank, nranks */
/* Every rank's result -> the common one (the lowest failing rank's, whose message it keeps; the
 * others say which rank failed). */
int train_world_agree(trainer *t, int rc);
/* The same over the ranks of communicator c (NULL: this rank alone), whose rank 0 is world rank
 * `first_rank` (the message names world ranks). */
int train_group_agree(trainer *t, adt_comm *c, int first_rank, int rc);
void train_world_end(trainer *t);
/* A failure while training: ends every rank, unless every rank agreed on it already. */
void train_world_fatal(trainer *t, int rc);
void train_error_mine(int mine);             /* this rank reports the failure (or not)          */
void train_error_reset(void);                /* before a step: no agreed failure yet            */
void train_dist_mem_report(trainer *t, const char *when); /* ADT_MEM_REPORT: peak RSS, memory plan */
int train_dist_partition(trainer *t);        /* plan and local graph (no communication)        */
/* The executor allocates everything up front and aborts when memory runs out: a model or batch
 * too big for the machine is refused with its size before that (ADT_ERR_ARG). */
int train_check_memory(const trainer *t);
int train_dist_executor(trainer *t, const adt_exec_opts *eo); /* collective: comms, executor  */
const adt_graph *train_run_graph(const trainer *t); /* the graph the executor runs             */
void *train_value(trainer *t, int v);        /* this rank's storage of global value v          */
/* Writes the batch of source sample indices idx[0..batch) into the fed inputs (this rank's part
 * of each). idx entries are turned into dataset ids in place. */
int train_fill(trainer *t, const train_source *s, int64_t *idx);
/* The whole of global value v (io.logits or io.label) after a run; slot 0 or 1 says which buffer
 * holds it on a distributed run. Collective there. */
int train_read(trainer *t, int v, int slot, const void **out);
int train_read_loss(trainer *t, double *loss); /* the global mean loss; collective */
/* A plan with stages or microbatches: one training step over the batch idx (source s), or the
 * forward passes of an evaluation batch (whose logits and labels train_read then gives);
 * *loss the batch's mean loss on every rank. Collective. */
int train_pipe_step(trainer *t, const train_source *s, int64_t *idx, double *loss);
int train_pipe_eval(trainer *t, const train_source *s, int64_t *idx, double *loss);

/* This rank's share of the next step's global batch: its local batch under balanced data
 * parallelism (the split in force), else an equal share (the block S(0) split gives it). */
int64_t train_local_batch(const trainer *t);
/* The balanced runner's split in force ([nranks] local batches), saved with every checkpoint
 * ("adtrain.balance_split"); adopting one from a checkpoint keeps it when it fits this world
 * (as many ranks, summing to the batch) and says so, else leaves the split as it is. */
const int64_t *train_balance_split(const trainer *t);
void train_balance_adopt_split(trainer *t, const char *text);
/* The split the elastic job's master set for step `step` (every rank's leased local batch),
 * logged as the master's action when it changed. */
void train_balance_set_split(trainer *t, const int64_t *split, long step);
/* This rank's compute seconds of the last step (not its waits in collectives), -1 unknown. */
double train_balance_compute_s(const trainer *t);
/* 1 if option `flag` ("--batch") was given: set through adt_train_opts_set, or set directly to a
 * value other than its default. */
int train_opts_given(const adt_train_opts *o, const char *flag);

/* train_balance.c: data parallelism with per-rank local batches (DD), the straggler monitor and
 * controller, and injected slowdowns. Used instead of the partitioned graph when o.bal.on. */
int train_balance_flag(train_opts *o, const char *flag, const char *v); /* one of its flags */
int train_balance_check(const train_opts *o); /* against the other flags                     */
int train_balance_build(trainer *t);    /* t->g: the update graph; the per-rank step graphs   */
int train_balance_executor(trainer *t, const adt_exec_opts *eo); /* t->ex: the update executor */
/* The step's forward and backward passes on this rank's samples of idx[0..batch), the weighted
 * gradient sum over ranks, the update (lr and step already set on t->ex), the controller. */
int train_balance_step(trainer *t, long step, int64_t *idx, double *loss);
void train_balance_banner(const trainer *t, FILE *f);
void train_balance_free(trainer *t);

/* train_ckpt.c: --init, --resume and --save. */
int train_ckpt_init(trainer *t);   /* --init: weights only                              */
int train_ckpt_resume(trainer *t); /* --resume: weights, optimizer state, step; sets t->start_step */
/* One file in one process; on several ranks a distributed checkpoint directory (collective). */
int train_ckpt_save(trainer *t, const char *path, long step);
/* The file --save writes, from any storage (a flash checkpoint's slot), with the split in force
 * then (or NULL): adt_status, no message printed, so that a background thread may call it. */
int train_ckpt_write(trainer *t, const char *path, long step, const int64_t *split, adt_ckpt_data_fn data, void *ctx);
/* The two halves of a distributed checkpoint, without collectives (a background thread may call
 * them): this rank's slices into DIR, their storage given by data(ctx, v) over the ids of the
 * graph the rank's executor runs, *part its part of the manifest; then, on one rank, the
 * manifest of all t->nranks parts. adt_status, no message printed. */
int train_ckpt_write_rank(trainer *t, const char *dir, long step, adt_ckpt_data_fn data, void *ctx, char **part);
int train_ckpt_commit_parts(trainer *t, const char *dir, long step, const char *const *parts);

/* train_elastic.c: the run as a worker of an elastic job (ADT_MASTER set by `adtrain agent`). */
/* Collective: lease client, restore. -1: the job's last step is committed already (exit 0). */
int train_elastic_start(trainer *t);
/* Before the graph is partitioned: the plan the master made for this world (o.plan_text), if
 * it made one; a world without one runs data parallel. */
int train_elastic_plan(trainer *t);
int train_elastic_batch(trainer *t, long step, int64_t *idx); /* the step's samples from leases */
/* After step `step`: report it; checkpoint and commit when due; *stop: leave the loop, returning
 * the result (0 after a planned stop or the last step). */
int train_elastic_step_done(trainer *t, long step, int *stop);
void train_elastic_free(trainer *t);
/* 1 in an elastic world after the job's first: the log continues (a step redone after a restore
 * appears again; the last line of a step is the one in the model). */
int train_elastic_continues(void);
/* Under an agent whose ranks take every core, MPI waits yield and nap (ADT_COMM_POLL=polite)
 * instead of spinning, so the agent and the master beside them get the CPU to answer the
 * step's lease and report; call before MPI starts. */
void train_elastic_poll_env(void);

#endif
