/*
 * cli.h - the subcommands of the `adtrain` command and what they share.
 */
#ifndef ADTRAIN_CLI_H
#define ADTRAIN_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "adtrain/data.h"
#include "adtrain/dist.h"
#include "adtrain/elastic.h"
#include "adtrain/models.h"
#include "adtrain/planner.h"

#define ADT_VERSION "0.1.0"

int cli_train(int argc, char **argv);
/* Prints "adtrain <command>: <message>" to stderr and returns `code`, so that a subcommand can
 * `return cli_fail("train", 2, "...")`. */
int cli_fail(const char *command, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int cli_graph(int argc, char **argv);
int cli_plan(int argc, char **argv);
/* `adtrain plan --strategy auto` (plan_auto.c) */
typedef struct cli_plan_auto_opts {
    const char *cluster_path, *out_path;
    const char *data; /* --data the run reads (NULL: the model's default), whose input is priced */
    double input_s;   /* --input-s: seconds per sample of that data, as given; < 0: timed here    */
    int builtin_model; /* no --model: the built-in gpt-tiny, which adopts the data's vocabulary */
    long devices, batch, max_pp;
    double mem_limit;
    adt_optim_kind optimizer;
    int momentum, json, explain;
    /* the parameter-server estimate's setting (--ps-servers, --ps-sync, --ps-prefetch): servers 0
     * searched; ps_sync NULL: sync; ps_prefetch < 0: the trainer's default */
    long ps_servers, ps_prefetch;
    const char *ps_sync;
    const char *mode; /* --mode: NULL either, "collective" or "ps": the mode auto chooses in */
} cli_plan_auto_opts;
int cli_plan_auto(const cli_plan_auto_opts *o, const adt_model_cfg *m, const char *label);
/* --cluster with an expert strategy: the plan's predicted step time and peak memory (--json). */
int cli_plan_price(const cli_plan_auto_opts *o, const adt_plan *p, const adt_graph *g);
int cli_plan_print(const adt_plan *p, const adt_graph *g, const char *label);
/* `adtrain plan` on the shape-level planner (plan_lm.c): a GPT with --precision, --recompute,
 * --micro-batch or --virtual-stages, or one too large for the graph planner. */
typedef struct cli_plan_lm_opts {
    const char *cluster_path, *strategy; /* strategy NULL or "auto": searched */
    long devices, batch, micro_batch, vstages; /* 0: not given */
    double mem_limit;
    int precision, recompute; /* -1: not given */
    int json;
} cli_plan_lm_opts;
int cli_plan_lm(const cli_plan_lm_opts *o, const adt_model_cfg *m, const char *label);
int cli_calibrate(int argc, char **argv);

/* The flag loop of a subcommand: "--flag value" or "--flag=value", each handed to apply(opts,
 * flag, value); -h/--help prints usage to stdout. Returns 0 to go on, -1 after --help, else the
 * exit code (2 for a bad or unknown flag, with the message printed). */
int cli_parse_flags(const char *command, int argc, char **argv, void (*usage)(FILE *),
                    int (*apply)(void *opts, const char *flag, const char *value), void *opts);
/* The --model config (path NULL: the built-in gpt-tiny) and a label for summaries; exit code 2
 * with the message when it does not load. */
int cli_load_model(const char *command, const char *path, adt_model_cfg *m, char *label, size_t n);
/* An integer flag value in [lo, hi], else exit code 2 with a message naming the flag. */
/* The same, with flags that take no value (`switches`, NULL-terminated; apply gets NULL). */
int cli_parse_flags_switches(const char *command, int argc, char **argv, void (*usage)(FILE *),
                             int (*apply)(void *opts, const char *flag, const char *value), void *opts,
                             const char *const *switches);
int cli_parse_long(const char *command, const char *flag, const char *v, long lo, long hi, long *out);
int cli_ckpt(int argc, char **argv);

/* The elastic runtime's commands (master.c, agent.c, launch.c, status.c, audit.c). */
int cli_master(int argc, char **argv);
int cli_agent(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_status(int argc, char **argv);
int cli_scale(int argc, char **argv);
int cli_audit(int argc, char **argv);

/* The master's re-planning flags (replan.c): --model, --cluster, --strategy, --batch,
 * --optimizer; what cli_replan_finish loaded from them. */
typedef struct cli_replan_opts {
    const char *model_path, *cluster_path, *strategy;
    long batch;
    adt_optim_kind optim;
    int momentum, optim_given;
    adt_model_cfg model;
    char label[320];
    adt_cluster cluster;
    int have_cluster;
} cli_replan_opts;
/* 1: the flag was one of them and is applied; 0: not one; -1: bad value (printed). */
int cli_replan_flag(const char *command, cli_replan_opts *r, const char *name, const char *value);
/* Loads and checks the model, cluster and strategy; with --model sets cfg's plan_world hook
 * (ctx r, which must outlive the master). -1 after printing the problem. */
int cli_replan_finish(const char *command, cli_replan_opts *r, adt_master_config *cfg, long global_batch);
/* The hook: the plan of the model for `world` devices (adt_master_config.plan_world). */
int cli_replan_world(void *ctx, const adt_world_shape *shape, adt_world_plan *out);
/* The training graph the plans are made for (*out is set even on failure; free it). */
int cli_replan_graph(const cli_replan_opts *r, adt_graph **out);
extern const char cli_replan_flags_help[];

/* The master's flags, shared by `adtrain master` and `adtrain launch` (master.c). */
typedef struct cli_master_opts {
    adt_master_config cfg;
    cli_replan_opts rp;
    adt_elastic_job_spec spec; /* what the job trains, said here once (--model, --batch, ...) */
    adt_ledger_job job; /* the data flags (--samples ...), if any */
    int data_flags;
    char token[300];
    double linger_s; /* after the job ended, keep answering this long (agents learn it) */
} cli_master_opts;
void cli_master_defaults(cli_master_opts *o);
int cli_master_has_value(const char *name);
/* 1: the flag was the master's and is applied; 0: not a master flag; -1: bad value (printed). */
int cli_master_flag(const char *command, cli_master_opts *o, const char *name, const char *value);
/* Checks across flags (the data flags come together); -1 after printing the problem. */
int cli_master_finish(const char *command, cli_master_opts *o);
/* The usage lines of the master's flags. */
extern const char cli_master_flags_help[];

/* The agent's flags, shared by `adtrain agent` and `adtrain launch` (agent.c). */
typedef struct cli_agent_opts {
    adt_agent_config cfg;
    char token[300];
} cli_agent_opts;
void cli_agent_defaults(cli_agent_opts *o);
int cli_agent_has_value(const char *name);
int cli_agent_flag(const char *command, cli_agent_opts *o, const char *name, const char *value);
extern const char cli_agent_flags_help[];

/* The whole flag loop of a command, over flags of the form "--name VALUE" or "--name=VALUE"
 * (underscores in a name read as dashes: torchrun's --nproc_per_node; has_value says which flags
 * take a value). -h/--help prints `usage` to stdout and gives 1; every other
 * flag goes to apply(ctx, name, value), which answers 1 (taken), 0 (not a flag of this command:
 * an error naming it) or -1 (a bad value, already printed). Returns 0 when the flags are done
 * (*i then indexes the first word after "--", or argc), 1 after help, 2 after an error. */
int cli_parse(const char *command, int argc, char **argv, int *i, int (*has_value)(const char *name),
              int (*apply)(void *ctx, const char *name, const char *value), void *ctx, void (*usage)(FILE *f));
/* 1 if name is one of the NULL-terminated list (flags that take a value). */
int cli_in_list(const char *name, const char *const *list);
/* Checked numbers: print "adtrain COMMAND: FLAG: expected ..." and return -1 when bad. */
int cli_long(const char *command, const char *flag, const char *s, long lo, long hi, long *out);
int cli_double(const char *command, const char *flag, const char *s, double lo, double hi, double *out);
/* "MIN:MAX" or "N" (= N:N); MAX may be 0 meaning no limit. */
int cli_range(const char *command, const char *flag, const char *s, long *lo, long *hi);
/* --token T or --token-file F (the file's first line) into buf, and *dst = buf: 1 if the flag
 * was one of them, 0 if not, -1 on an unreadable file. */
int cli_token_flag(const char *command, const char *name, const char *value, char *buf, int cap, const char **dst);
/* SIGINT, SIGTERM and SIGHUP write a byte to the returned descriptor (readable = stop asked);
 * SIGPIPE is ignored. */
int cli_stop_fd(void);

/* Distributed runs: every rank makes the same checks, and only rank 0 speaks. cli_quiet is set on
 * the other ranks (no banner, progress or notices); their error lines name the rank. */
extern int cli_quiet;
void cli_set_rank(int rank, int nranks);
/* While on, cli_fail keeps its first message instead of printing it, so that ranks can first
 * agree on who failed and then print one message (cli_print_deferred). */
void cli_defer_errors(int on);
void cli_print_deferred(void);

#endif
