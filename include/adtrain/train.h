/*
 * adtrain/train.h - the trainer: one object that trains a model on a dataset, in one process, on
 * the ranks of an MPI world, or as a worker of an elastic job, under any plan.
 *
 *     adt_train_opts o;
 *     adt_train_opts_init(&o);                          // the documented defaults
 *     adt_train_opts_set(&o, "model", "configs/gpt-s.json");  // or set the fields directly
 *     adt_train_opts_check(&o);                         // every option against the others
 *     adt_trainer *t;
 *     if (adt_trainer_create(&t, &o)) ... adt_error_message()
 *     adt_train_step_info st;
 *     while (adt_trainer_step(t, &st) == ADT_OK) ... st.loss
 *     adt_trainer_finish(t); adt_trainer_free(t);
 *
 * A step runs through two composable parts chosen at creation (src/train/README.md):
 *   - a runner, how the graph runs: the partitioned graph of a plan (one process or MPI ranks),
 *     a pipeline (stages, microbatches), or balanced data parallelism (per-rank local batches);
 *   - a feed, where each step's samples come from and what follows a step: the seeded sampler,
 *     or an elastic job's leases (report, flash checkpoint, commit, restore, planned stop).
 * Evaluation, checkpoints and the JSON log are the trainer's own, the same for every part.
 *
 * Errors: every call returns ADT_OK or a negative adt_status and leaves the message in the
 * calling thread's error slot. ADT_ERR_ARG means the user's input (an option, a config, a
 * dataset, a checkpoint that does not fit) and is found before the first step; anything else
 * is a failure while running. On an MPI world creation is collective and every rank returns the
 * same status; the message is on the lowest failing rank (adt_trainer_error_is_mine()).
 * The library prints nothing: rank 0's notes (what was restored, saved, decided) go to
 * opts.note; a caller that prints progress reads adt_train_step_info.
 */
#ifndef ADTRAIN_TRAIN_H
#define ADTRAIN_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "adtrain/graph.h"
#include "adtrain/straggler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Balanced data parallelism (AntDT's DD/ND): each data-parallel replica takes its own local
 * batch, the gradients weighted by their share of the global batch so the update is unchanged.
 * `on` once any of its fields is set through adt_train_opts_set. */
typedef struct adt_train_balance_opts {
    int on;
    adt_straggler_policy policy;
    const char *config;  /* "K=V,..." thresholds (adt_straggler_cfg_parse), or NULL        */
    const char *split;   /* "B0,B1,..." the initial local batches, or NULL: equal          */
    const char *master;  /* HOST:PORT of a master whose controller decides, or NULL        */
    int by_feed;         /* the elastic job's master drives the split through its data replies */
    long micro_batch;    /* at most this many samples per pass; 0: the whole local batch   */
    int slow_rank;       /* injected slowness (tests, benchmarks): -1 none                 */
    double slow_factor, slow_add_s;
    long slow_first, slow_last;
} adt_train_balance_opts;

/* Everything a training run is told. adt_train_opts_init sets the documented defaults; strings
 * are borrowed (they must outlive the trainer). */
typedef struct adt_train_opts {
    const char *model_path;  /* JSON config; NULL: the built-in tiny GPT                     */
    const char *data, *val;  /* KIND:PATH; data NULL: the model's default data               */
    long steps;              /* optimizer steps in all (default 200)                          */
    long batch;              /* global samples per step (default 16)                          */
    long warmup;             /* linear warmup steps (default 0)                               */
    long eval_every;         /* evaluate every N steps and at the end; 0: never (default)     */
    long eval_batches;       /* validation batches per evaluation (default 20)                */
    adt_optim_kind optimizer;/* default ADT_OPTIM_ADAMW                                       */
    double lr;               /* peak lr; default 1e-3 (adamw) or 0.1 (sgd) when not set       */
    double momentum, weight_decay;
    int lr_given, momentum_given;
    int cosine;              /* 1: cosine decay to lr/10 after warmup (default), 0: constant  */
    int shuffle;             /* per-epoch seeded permutation (default 1)                      */
    int threads;             /* compute threads per rank (default 1)                          */
    int profile;             /* time every node; adt_trainer_print_profile (default 0)        */
    uint64_t seed;           /* initialisation, dropout, sample order (default 1337)         */
    const char *log_path;    /* JSON lines: one per step and per evaluation, rank 0; or NULL  */
    const char *init_path;   /* weights to start from, or NULL                                */
    const char *resume_path; /* a checkpoint to continue, or NULL                             */
    const char *save_path;   /* where to save ("{step}" replaced), or NULL                    */
    long save_every;         /* also save every N steps (needs save_path); 0: at the end only */
    const char *plan_path;   /* a plan file (adtrain plan -o), or NULL: data parallel         */
    adt_train_balance_opts bal;
    /* elastic runs (under an agent: ADT_MASTER set) */
    const char *elastic_dir; /* committed checkpoints; NULL: under the job's directory        */
    long commit_every;       /* flash checkpoint and commit every N steps (default 10)        */
    double lease_timeout;    /* seconds a silent replica keeps its leases (default 30)        */
    int flash;               /* state copied to shared memory, persisted behind (default 1)   */
    /* the parameter-server mode (--mode ps): the first ps_servers ranks serve */
    int ps_mode;
    int ps_servers;           /* default 1                                                      */
    const char *ps_sync;      /* "sync" (default), "ssp:K", "async"                             */
    int ps_prefetch;          /* later steps' rows pulled while a step computes (default 1)     */
    const char *ps_optimizer; /* the rows' optimizer: sgd, adagrad, adam; NULL: the dense one's */
    int ps_dense_servers;     /* dense parameters on the servers too (default: all-reduced)      */
    int ps_plan_devices;      /* --plan is a parameter-server plan for this many ranks (0: not)  */
    char ps_plan_sync[32];    /* its sync setting (ps_sync points here then)                     */
    /* bit i: the i-th option of adt_train_opts_set was set through it (an elastic job's spec
     * yields to none of them); a field set directly counts as given when it differs from its
     * default */
    uint64_t given;
    /* rank 0's notes (a line without newline), e.g. "resume ckpt: continuing after step 100" */
    void (*note)(void *ctx, const char *line);
    void *note_ctx;
} adt_train_opts;

void adt_train_opts_init(adt_train_opts *o);
/* Sets one option by its flag name ("steps" or "--steps") from text, checked: ADT_ERR_ARG naming
 * the flag and what was expected. `value` is borrowed for string options. */
int adt_train_opts_set(adt_train_opts *o, const char *name, const char *value);
/* 1 if `name` ("--steps" or "steps") is an option adt_train_opts_set knows. */
int adt_train_opts_known(const char *name);
/* Every option against the others; fills the optimizer's default lr. ADT_ERR_ARG. */
int adt_train_opts_check(adt_train_opts *o);

typedef struct adt_trainer adt_trainer;

/* Opens the model and data, builds the training graph, makes the plan and the executor, loads
 * --init / --resume, joins an elastic job; MPI is started here when a launcher started the
 * process. opts are copied (their strings borrowed). Collective. */
int adt_trainer_create(adt_trainer **out, const adt_train_opts *opts);

/* What one step did (adt_trainer_step). */
typedef struct adt_train_step_info {
    long step, steps;      /* the step just run (1-based) of `steps`                        */
    double loss, lr;       /* the global batch's mean loss; the step's learning rate        */
    double seconds;        /* the step's wall time (the elastic step's end included)        */
    double items_per_s;    /* tokens (GPT) or samples per second of this step               */
    int evaluated;         /* an evaluation ran after it: val_loss and the metric below     */
    double val_loss;
    char metric_json[64];  /* ",\"val_acc\":0.9" or "" (for a JSON log line)                */
    char metric_text[160]; /* "  val_acc 90.0%" or ""                                       */
    int saved;             /* a checkpoint was written after it                             */
} adt_train_step_info;

/* Runs the next step and what falls due after it (evaluation, checkpoint, an elastic report,
 * commit or planned stop). ADT_OK: a step ran; 1: no step left (the run is complete, or an
 * elastic world stopped at a step boundary); < 0 an error (a diverged loss included: the step's
 * info is filled). Collective. */
int adt_trainer_step(adt_trainer *t, adt_train_step_info *info);
/* Mean validation loss over the first eval_batches batches and the family's metric
 * (accuracy, AUC). Collective. */
int adt_trainer_eval(adt_trainer *t, double *val_loss, char *metric_json, size_t nj, char *metric_text, size_t nt);
/* Weights, optimizer state, step and data position: one safetensors file in one process, a
 * distributed checkpoint directory on several ranks ("{step}" in path replaced). Collective. */
int adt_trainer_save(adt_trainer *t, const char *path);
/* After the last step: the final checkpoint (save_path, unless save_every wrote it). */
int adt_trainer_finish(adt_trainer *t);
void adt_trainer_free(adt_trainer *t);

/* A failure on one rank while training must not leave the others in a collective: ends every
 * rank of the world with `code` (a process of its own: returns). */
void adt_trainer_abort(adt_trainer *t, int code);

int adt_trainer_rank(const adt_trainer *t);
/* 1 on the rank that logs and notes: rank 0, or in --mode ps the first worker. */
int adt_trainer_reports(const adt_trainer *t);
int adt_trainer_nranks(const adt_trainer *t);
long adt_trainer_start_step(const adt_trainer *t); /* steps done before this run (resume)     */
long adt_trainer_steps(const adt_trainer *t);
/* "tok/s" for a GPT, else "samples/s" (adt_train_step_info.items_per_s). */
const char *adt_trainer_rate_unit(const adt_trainer *t);
/* After a failed adt_trainer_create or step: 1 if this rank holds the message to print. */
int adt_trainer_error_is_mine(void);

/* ---- a model's data (data_cfg.c), shared with the planner's commands --------------------- */
#include "adtrain/data.h"
#include "adtrain/models.h"
/* Text the built-in default data reads when it exists (relative to the working directory). */
#define ADT_TRAIN_DEFAULT_TEXT "../shared/data/tinyshakespeare/input.txt"
/* The shape dataset `spec` must fit for model m (builtin_model, or a text: spec: a GPT's vocabulary
 * is not checked by the loader; text is compared as a whole after, with a clearer message). */
void adt_train_data_shape(const adt_model_cfg *m, int builtin_model, const char *spec, adt_data_shape *s);
/* What the model family reads, and its name with the --data kinds that hold it. */
adt_data_layout adt_train_data_layout(const adt_model_cfg *m);
const char *adt_train_data_layout_name(adt_data_layout l);
/* The data a run of m reads when none is given: text:ADT_TRAIN_DEFAULT_TEXT for a GPT where that
 * file exists, else the family's synthetic kind; *why (may be NULL) says which and why. */
const char *adt_train_default_data(const adt_model_cfg *m, const char **why);
/* Seconds one rank takes to produce one sample of `spec` for model m (a fill of up to
 * min(batch, 256) samples and the copy into the fed values, median of 5): the cost model's
 * adt_cluster.input_s. ADT_ERR_ARG when the data does not open or does not fit m. */
int adt_train_measure_input(const adt_model_cfg *m, int builtin_model, const char *spec, int batch, double *s_per_sample);

/* Model, data, optimizer, run and distribution, a line each, as `adtrain train` prints them. */
void adt_trainer_print_banner(const adt_trainer *t, FILE *f);
/* Where this rank's steps (after the first) went: compute per op, collectives, slowest nodes. */
void adt_trainer_print_profile(const adt_trainer *t, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
