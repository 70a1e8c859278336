/*
 * train_opts.c - the flags of `adtrain train`: usage text, parsing, and checks across flags.
 * Every flag is checked before any file is touched, so a typo never costs a run.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "train.h"

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain train [options]\n"
            "       mpiexec -n N adtrain train [options]\n"
            "\n"
            "Trains a model on one process, or under mpiexec on N processes (data parallel: each rank\n"
            "takes its part of every batch; the logged losses are those of the one-process run; only\n"
            "rank 0 prints and writes the log). With no options: the built-in tiny GPT (2 layers, width\n"
            "64, 4 heads, n_ctx 64) on Tiny Shakespeare if " CLI_DEFAULT_TEXT "\n"
            "exists, else on synthetic:text.\n"
            "\n"
            "model and data:\n"
            "  --model CFG.json        model config (configs/*.json); default: built-in gpt-tiny,\n"
            "                          whose vocab_size follows the data\n"
            "  --data KIND:PATH        text:FILE (characters are tokens), synthetic:text, synthetic:mlp\n"
            "  --val KIND:PATH         validation data; default: the last 10%% of --data's samples\n"
            "optimization:\n"
            "  --steps N               optimizer steps (default 200)\n"
            "  --batch B               samples per step (default 16)\n"
            "  --optimizer sgd|adamw   default adamw: lr 1e-3, betas (0.9, 0.95), eps 1e-8;\n"
            "                          sgd: lr 0.1, no momentum\n"
            "  --lr X                  peak learning rate\n"
            "  --momentum M            SGD momentum in [0, 1) (default 0)\n"
            "  --weight-decay W        decoupled weight decay (default 0)\n"
            "  --warmup N              linear warmup steps (default 0)\n"
            "  --schedule constant|cosine   after warmup; cosine decays to 10%% of lr (default cosine)\n"
            "  --shuffle on|off        per-epoch seeded permutation of samples (default on)\n"
            "  --seed S                initialisation, dropout and shuffling (default 1337)\n"
            "  --threads T             BLAS threads, per rank (default 1)\n"
            "  --plan PLAN.json        the parallel plan of an mpiexec run (adtrain plan -o PLAN.json; made\n"
            "                          for this model, --batch and optimizer, one device per rank, one\n"
            "                          stage); default: data parallel over all ranks\n"
            "stragglers (balanced data parallelism: each rank its own local batch, the gradients weighted\n"
            "by their share of --batch, so the update is the one-process one):\n"
            "  --straggler-policy off|dd|nd   off: a fixed split; dd: local batches follow measured speed;\n"
            "                          nd: the same, quicker, and a persistent straggler is reported for a\n"
            "                          restart when the remaining run pays for it\n"
            "  --straggler-config K=V,...     warmup, k, persist, clear, alpha, clip, gain, dd_after,\n"
            "                          nd_after, first, cooldown, restart_cost, min_local\n"
            "  --straggler-master HOST:PORT   rank 0 reports every step to this master (adtrain master\n"
            "                          --straggler-policy ...; token from $ADT_JOB_TOKEN), whose controller\n"
            "                          decides the split, and whose /dashboard shows the run\n"
            "  --split B0,B1,...       the initial local batches (sum --batch); default equal\n"
            "  --micro-batch M         at most M samples per forward/backward pass; a larger local batch\n"
            "                          accumulates gradients over several passes\n"
            "  --inject-slowdown RANK:FACTOR[@FIRST-LAST]   rank RANK sleeps so its compute takes FACTOR\n"
            "                          times as long (on steps FIRST..LAST); RANK:+SECONDS: a pause\n"
            "evaluation and logging:\n"
            "  --eval-every N          validation loss every N steps and at the end (default 0: off)\n"
            "  --eval-batches K        validation batches per evaluation (default 20)\n"
            "  --profile on|off        at the end, each rank prints where its steps went (after the first,\n"
            "                          a warm-up): compute per op, time in each kind of collective,\n"
            "                          polling collectives in flight between nodes, the slowest nodes\n"
            "                          (default off)\n"
            "  --log FILE.jsonl        one JSON object per step: step, loss, lr, ms, tokens_per_s,\n"
            "                          time_s (training time so far), wall_s (since the first step\n"
            "                          began: everything between steps included);\n"
            "                          and per evaluation: step, val_loss\n"
            "checkpoints (safetensors; PyTorch loads the parameters by name):\n"
            "  --init CKPT             start from these weights (adtrain or Hugging Face GPT-2 names)\n"
            "  --save PATH             write weights, optimizer state, step and data position at the end;\n"
            "                          \"{step}\" in PATH is replaced by the step (ckpt-{step}.safetensors)\n"
            "  --save-every N          ... and every N steps (atomically: a crash keeps the last one)\n"
            "  --resume PATH           continue a run saved with --save up to --steps in total; with the\n"
            "                          same flags it reproduces the uninterrupted run's losses bit for bit\n"
            "  under mpiexec (N > 1 ranks), --save PATH is a directory: a distributed checkpoint (each\n"
            "  rank writes its blocks, a manifest joins them; adtrain ckpt export makes one file);\n"
            "  --init and --resume read a directory or a file under any plan and number of ranks\n"
            "elastic runs (under adtrain launch / adtrain agent, which set ADT_MASTER): the samples of\n"
            "every step come from the master's leases (the same order as above), each step is\n"
            "reported, and checkpoints are committed with the data position; a new world restores\n"
            "the committed one. SIGTERM or a planned change stops at a step boundary with a commit.\n"
            "  --elastic-dir DIR       committed checkpoints (default adtrain-elastic)\n"
            "  --commit-every N        flash checkpoint, persisted and committed every N steps\n"
            "                          (default 10)\n"
            "  --flash on|off          copy the state to shared memory (/dev/shm, two slots with a\n"
            "                          crc32c) and write the file in the background (default on)\n"
            "  --lease-timeout S       a replica silent for S seconds loses its leases (default 30)\n"
            "\n"
            "exit status: 0 done, 1 failure while training, 2 bad flag, config or data\n");
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return train_fail(EXIT_USAGE, "%s: expected an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    *out = (long)v;
    return 0;
}

/* A finite number in [lo, hi] (or (lo, hi] when lo_open). */
static int parse_double(const char *flag, const char *s, double lo, double hi, int lo_open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    int ok = *s && !*end && !errno && isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    if (!ok)
        return train_fail(EXIT_USAGE, "%s: expected a number in %c%g, %g], got '%s'", flag, lo_open ? '(' : '[', lo,
                          hi, s);
    *out = v;
    return 0;
}

static int parse_choice(const char *flag, const char *s, const char *a, const char *b, int *out) {
    if (!strcmp(s, a)) *out = 0;
    else if (!strcmp(s, b)) *out = 1;
    else return train_fail(EXIT_USAGE, "%s: expected '%s' or '%s', got '%s'", flag, a, b, s);
    return 0;
}

static int parse_seed(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (!*s || *end || errno || s[0] == '-')
        return train_fail(EXIT_USAGE, "--seed: expected a non-negative integer below 2^64, got '%s'", s);
    *out = v;
    return 0;
}

static int apply_flag(train_opts *o, const char *f, const char *v) {
    long l = 0;
    int c = 0, rc = 0;
    if (!strcmp(f, "--model")) o->model_path = v;
    else if (!strcmp(f, "--data")) o->data = v;
    else if (!strcmp(f, "--val")) o->val = v;
    else if (!strcmp(f, "--log")) o->log_path = v;
    else if (!strcmp(f, "--init")) o->init_path = v;
    else if (!strcmp(f, "--resume")) o->resume_path = v;
    else if (!strcmp(f, "--save")) o->save_path = v;
    else if (!strcmp(f, "--plan")) o->plan_path = v;
    else if (!strncmp(f, "--straggler-", 12) || !strcmp(f, "--split") || !strcmp(f, "--micro-batch") ||
             !strcmp(f, "--inject-slowdown"))
        rc = train_balance_flag(o, f, v);
    else if (!strcmp(f, "--elastic-dir")) o->elastic_dir = v;
    else if (!strcmp(f, "--commit-every")) rc = parse_long(f, v, 1, INT32_MAX, &o->commit_every);
    else if (!strcmp(f, "--lease-timeout")) rc = parse_double(f, v, 0, 1e6, 1, &o->lease_timeout);
    else if (!strcmp(f, "--flash")) rc = parse_choice(f, v, "off", "on", &o->flash);
    else if (!strcmp(f, "--save-every")) rc = parse_long(f, v, 1, INT32_MAX, &o->save_every);
    else if (!strcmp(f, "--steps")) rc = parse_long(f, v, 1, INT32_MAX, &o->steps);
    else if (!strcmp(f, "--batch")) rc = parse_long(f, v, 1, 1 << 20, &o->batch);
    else if (!strcmp(f, "--warmup")) rc = parse_long(f, v, 0, INT32_MAX, &o->warmup);
    else if (!strcmp(f, "--eval-every")) rc = parse_long(f, v, 0, INT32_MAX, &o->eval_every);
    else if (!strcmp(f, "--eval-batches")) rc = parse_long(f, v, 1, 1000000, &o->eval_batches);
    else if (!strcmp(f, "--threads")) rc = parse_long(f, v, 1, 1024, &l), o->threads = (int)l;
    else if (!strcmp(f, "--lr")) rc = parse_double(f, v, 0, 1e3, 1, &o->lr), o->lr_given = 1;
    else if (!strcmp(f, "--momentum")) rc = parse_double(f, v, 0, 0.999999, 0, &o->momentum), o->momentum_given = 1;
    else if (!strcmp(f, "--weight-decay")) rc = parse_double(f, v, 0, 1e3, 0, &o->weight_decay);
    else if (!strcmp(f, "--seed")) rc = parse_seed(v, &o->seed);
    else if (!strcmp(f, "--optimizer")) rc = parse_choice(f, v, "sgd", "adamw", &c), o->optimizer = c ? ADT_OPTIM_ADAMW : ADT_OPTIM_SGD;
    else if (!strcmp(f, "--schedule")) rc = parse_choice(f, v, "constant", "cosine", &o->cosine);
    else if (!strcmp(f, "--shuffle")) rc = parse_choice(f, v, "off", "on", &o->shuffle);
    else if (!strcmp(f, "--profile")) rc = parse_choice(f, v, "off", "on", &o->profile);
    else ADT_ASSERT(0 && "flag in the table without a handler");
    return rc;
}

static const char *const train_flags[] = {
    "--model", "--data", "--val", "--steps", "--batch", "--optimizer", "--lr", "--momentum", "--weight-decay",
    "--warmup", "--schedule", "--shuffle", "--seed", "--threads", "--eval-every", "--eval-batches", "--log",
    "--init", "--resume", "--save", "--save-every", "--plan",
    "--straggler-policy", "--straggler-config", "--straggler-master", "--split", "--micro-batch", "--inject-slowdown",
    "--elastic-dir", "--commit-every", "--lease-timeout", "--flash", "--profile", NULL,
};

/* The flag `arg` names ("--steps" or "--steps=10"); *inline_val gets the part after '='. */
static const char *find_flag(const char *arg, const char **inline_val) {
    *inline_val = NULL;
    size_t len = strcspn(arg, "=");
    for (int i = 0; train_flags[i]; i++)
        if (strlen(train_flags[i]) == len && !strncmp(arg, train_flags[i], len)) {
            if (arg[len] == '=') *inline_val = arg + len + 1;
            return train_flags[i];
        }
    return NULL;
}

/* Cross-flag checks, once every flag is known. */
static int check_opts(train_opts *o) {
    if (o->momentum_given && o->optimizer != ADT_OPTIM_SGD)
        return train_fail(EXIT_USAGE, "--momentum: only applies to --optimizer sgd (adamw uses betas 0.9, 0.95)");
    if (!o->lr_given) o->lr = o->optimizer == ADT_OPTIM_SGD ? 0.1 : 1e-3;
    if (o->init_path && o->resume_path)
        return train_fail(EXIT_USAGE, "--init and --resume: expected one of them (--resume already restores the weights)");
    if (o->save_every && !o->save_path)
        return train_fail(EXIT_USAGE, "--save-every: expected --save PATH too (where to write)");
    int rc = o->bal.on ? train_balance_check(o) : 0;
    if (rc) return rc;
    if (o->warmup > o->steps)
        return train_fail(EXIT_USAGE, "--warmup: %ld warmup steps exceed --steps %ld; expected at most %ld", o->warmup,
                          o->steps, o->steps);
    return 0;
}

/* Returns 0 to go on, -1 after --help, else an exit code. */
int train_parse_opts(train_opts *o, int argc, char **argv) {
    *o = (train_opts){.steps = 200, .batch = 16, .eval_batches = 20, .optimizer = ADT_OPTIM_ADAMW,
                      .cosine = 1, .shuffle = 1, .threads = 1, .seed = 1337, .bal = {.slow_rank = -1},
                      .elastic_dir = "adtrain-elastic", .commit_every = 10, .lease_timeout = 30, .flash = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (!cli_quiet) train_usage(stdout);
            return -1;
        }
        const char *f = find_flag(a, &v);
        if (!f) {
            if (a[0] == '-') return train_fail(EXIT_USAGE, "unknown flag '%s' (see adtrain train --help)", a);
            return train_fail(EXIT_USAGE, "unexpected argument '%s': every option is a --flag (see adtrain train --help)", a);
        }
        if (!v) {
            if (i + 1 >= argc) return train_fail(EXIT_USAGE, "%s: missing value (see adtrain train --help)", f);
            v = argv[++i];
        }
        int rc = apply_flag(o, f, v);
        if (rc) return rc;
    }
    return check_opts(o);
}
