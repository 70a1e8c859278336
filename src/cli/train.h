/*
 * train.h - what the pieces of `adtrain train` share: the options, the data sources and the
 * trainer (model, data, graph, executor, log) that train.c sets up and runs.
 */
#ifndef ADTRAIN_CLI_TRAIN_H
#define ADTRAIN_CLI_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "adtrain/data.h"
#include "adtrain/exec.h"
#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "cli.h"

#define TRAIN_DEFAULT_TEXT "../shared/data/tinyshakespeare/input.txt"
#define EXIT_RUNTIME 1
#define EXIT_USAGE 2
#define train_fail(...) cli_fail("train", __VA_ARGS__)

typedef struct train_opts {
    const char *model_path; /* NULL: the built-in tiny GPT */
    const char *data, *val; /* KIND:PATH; data NULL until defaulted */
    long steps, batch, warmup, eval_every, eval_batches;
    adt_optim_kind optimizer;
    double lr, momentum, weight_decay;
    int lr_given, momentum_given;
    int cosine, shuffle, threads;
    uint64_t seed;
    const char *log_path;
    const char *init_path, *resume_path, *save_path;
    long save_every;
} train_opts;

/* Parses argv into o (defaults first) and checks flags against each other. Returns 0 to go on,
 * -1 after --help, else an exit code (the message is printed). */
int train_parse_opts(train_opts *o, int argc, char **argv);

/* ---- data sources (train_data.c): a range of sample ids of one dataset ---------------------- */
typedef struct train_source {
    const char *spec;
    adt_dataset *ds;
    int owns;             /* frees ds (the holdout shares the training dataset) */
    int64_t first, count; /* sample ids [first, first+count) of ds */
} train_source;

typedef struct trainer {
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
} trainer;

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
void train_metric_add(trainer *t, int batch);
void train_metric_format(trainer *t, char *json, size_t nj, char *text, size_t nt);

/* train_ckpt.c: --init, --resume and --save. */
int train_ckpt_init(trainer *t);   /* --init: weights only                              */
int train_ckpt_resume(trainer *t); /* --resume: weights, optimizer state, step; sets t->start_step */
int train_ckpt_save(trainer *t, const char *path, long step);

#endif
