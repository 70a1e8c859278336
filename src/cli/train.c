/*
 * train.c - `adtrain train`: trains a model from a JSON config on a dataset in one process.
 *
 * The flow is the one every later (distributed, elastic) trainer follows: parse and check every
 * flag before touching data, open the data, build the training graph (model, backward,
 * optimizer), plan memory once, then per step fill the fed inputs, set lr and step, run, read the
 * loss. Exit status: 0 done, 1 a failure while running, 2 a bad flag, config or dataset
 * (found before the first step, so a typo never costs a run).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/data.h"
#include "adtrain/exec.h"
#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "cli.h"

#define TRAIN_DEFAULT_TEXT "../shared/data/tinyshakespeare/input.txt"
#define SYN_TEXT_TOKENS (1 << 20)   /* synthetic:text training stream */
#define SYN_TEXT_VAL_TOKENS (1 << 17)
#define SYN_MLP_SAMPLES 60000       /* synthetic:mlp, like MNIST's training set */
#define SYN_MLP_VAL_SAMPLES 10000
#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

/* ============================================================================================
 * Options
 */
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
} train_opts;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain train [options]\n"
            "\n"
            "Trains a model on one process. With no options: the built-in tiny GPT (2 layers, width 64,\n"
            "4 heads, n_ctx 64) on Tiny Shakespeare if " TRAIN_DEFAULT_TEXT " exists,\n"
            "else on synthetic:text.\n"
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
            "  --threads T             BLAS threads (default 1)\n"
            "evaluation and logging:\n"
            "  --eval-every N          validation loss every N steps and at the end (default 0: off)\n"
            "  --eval-batches K        validation batches per evaluation (default 20)\n"
            "  --log FILE.jsonl        one JSON object per step: step, loss, lr, ms, tokens_per_s;\n"
            "                          and per evaluation: step, val_loss\n"
            "\n"
            "exit status: 0 done, 1 failure while training, 2 bad flag, config or data\n");
}

#define train_fail(...) cli_fail("train", __VA_ARGS__)

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
    else ADT_ASSERT(0 && "flag in the table without a handler");
    return rc;
}

static const char *const train_flags[] = {
    "--model", "--data", "--val", "--steps", "--batch", "--optimizer", "--lr", "--momentum", "--weight-decay",
    "--warmup", "--schedule", "--shuffle", "--seed", "--threads", "--eval-every", "--eval-batches", "--log", NULL,
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
    if (o->warmup > o->steps)
        return train_fail(EXIT_USAGE, "--warmup: %ld warmup steps exceed --steps %ld; expected at most %ld", o->warmup,
                          o->steps, o->steps);
    return 0;
}

/* Returns 0 to go on, -1 after --help, else an exit code. */
static int parse_opts(train_opts *o, int argc, char **argv) {
    *o = (train_opts){.steps = 200, .batch = 16, .eval_batches = 20, .optimizer = ADT_OPTIM_ADAMW,
                      .cosine = 1, .shuffle = 1, .threads = 1, .seed = 1337};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout);
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

/* ============================================================================================
 * Data sources: a range of sample ids of one dataset, and how to write a batch of them into the
 * graph's fed inputs.
 */
typedef enum { SRC_TEXT, SRC_MLP } src_kind;

typedef struct mlp_teacher {
    int in, classes;
    float *w; /* [classes, in], fixed: the labels are a learnable linear function of x */
} mlp_teacher;

typedef struct train_source {
    src_kind kind;
    const char *spec;
    adt_text_dataset *text; /* SRC_TEXT */
    int owns_text;
    const mlp_teacher *teacher; /* SRC_MLP */
    uint64_t x_key;             /* SRC_MLP: the input stream */
    int64_t first, count;       /* sample ids [first, first+count) */
} train_source;

static void source_free(train_source *s) {
    if (s->owns_text) adt_text_dataset_free(s->text);
    memset(s, 0, sizeof *s);
}

static void teacher_init(mlp_teacher *t, int in, int classes) {
    t->in = in, t->classes = classes;
    t->w = adt_malloc((size_t)in * (size_t)classes * sizeof *t->w);
    uint64_t key = adt_rng_key(0x7eac, "synthetic.mlp.teacher");
    for (int64_t i = 0; i < (int64_t)in * classes; i++) t->w[i] = adt_rng_normal(key, (uint64_t)i);
}

/* x ~ N(0, 1) drawn per (sample, feature); label = argmax of the teacher's logits. */
static void mlp_fill(const train_source *s, const int64_t *ids, int n, float *x, int32_t *labels) {
    const mlp_teacher *t = s->teacher;
    for (int k = 0; k < n; k++) {
        float *xk = x + (int64_t)k * t->in;
        for (int j = 0; j < t->in; j++) xk[j] = adt_rng_normal(s->x_key, (uint64_t)ids[k] * (uint64_t)t->in + (uint64_t)j);
        int best = 0;
        double best_v = -INFINITY;
        for (int c = 0; c < t->classes; c++) {
            double acc = 0;
            for (int j = 0; j < t->in; j++) acc += (double)t->w[(int64_t)c * t->in + j] * xk[j];
            if (acc > best_v) best_v = acc, best = c;
        }
        labels[k] = best;
    }
}

/* Writes the batch of local sample indices `idx` (0-based within the source's range; turned into
 * dataset sample ids in place). */
static int source_fill(const train_source *s, int64_t *idx, int n, int T, void *input, void *label) {
    for (int k = 0; k < n; k++) idx[k] += s->first;
    if (s->kind == SRC_TEXT) return adt_text_dataset_fill(s->text, idx, n, T, input, label);
    mlp_fill(s, idx, n, input, label);
    return ADT_OK;
}

/* Splits "KIND:PATH"; returns 0 for text:PATH, 1 for synthetic:text, 2 for synthetic:mlp. */
static int parse_data_spec(const char *flag, const char *spec, const char **path) {
    *path = NULL;
    if (!strncmp(spec, "text:", 5) && spec[5]) {
        *path = spec + 5;
        return 0;
    }
    if (!strcmp(spec, "synthetic:text")) return 1;
    if (!strcmp(spec, "synthetic:mlp")) return 2;
    train_fail(EXIT_USAGE, "%s: '%s' is not a dataset; expected text:FILE, synthetic:text or synthetic:mlp", flag, spec);
    return -1;
}

/* The default when no --data is given, announced so a user knows what the run trains on. */
static const char *default_data(const adt_model_cfg *m) {
    if (m->type == ADT_MODEL_MLP) {
        fprintf(stderr, "adtrain train: no --data given: using synthetic:mlp\n");
        return "synthetic:mlp";
    }
    if (access(TRAIN_DEFAULT_TEXT, R_OK) == 0) {
        fprintf(stderr, "adtrain train: no --data given: using text:%s\n", TRAIN_DEFAULT_TEXT);
        return "text:" TRAIN_DEFAULT_TEXT;
    }
    fprintf(stderr, "adtrain train: no --data given and %s not found: using synthetic:text\n", TRAIN_DEFAULT_TEXT);
    return "synthetic:text";
}

/* Opens a dataset named by --data (vocab NULL) or --val (vocab of the training data). */
static int open_source(train_source *s, const char *flag, const char *spec, const adt_text_vocab *vocab,
                       const adt_model_cfg *m, const mlp_teacher *teacher, int is_val) {
    memset(s, 0, sizeof *s);
    s->spec = spec;
    const char *path;
    int kind = parse_data_spec(flag, spec, &path);
    if (kind < 0) return EXIT_USAGE;
    if ((kind == 2) != (m->type == ADT_MODEL_MLP))
        return train_fail(EXIT_USAGE, "%s: %s does not fit the model (type %s); expected %s", flag, spec,
                          adt_model_type_name(m->type),
                          m->type == ADT_MODEL_MLP ? "synthetic:mlp" : "text:FILE or synthetic:text");
    int rc = ADT_OK;
    if (kind == 2) {
        s->kind = SRC_MLP;
        s->teacher = teacher;
        s->x_key = adt_rng_key((uint64_t)is_val, "synthetic.mlp.x");
        s->count = is_val ? SYN_MLP_VAL_SAMPLES : SYN_MLP_SAMPLES;
        return 0;
    }
    s->kind = SRC_TEXT;
    s->owns_text = 1;
    if (kind == 0) rc = adt_text_dataset_open(&s->text, path, vocab);
    else rc = adt_text_dataset_synthetic(&s->text, is_val ? SYN_TEXT_VAL_TOKENS : SYN_TEXT_TOKENS, (uint64_t)is_val);
    if (rc) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    const adt_text_vocab *own = adt_text_dataset_vocab(s->text);
    if (vocab && kind == 1 && (own->size != vocab->size || memcmp(own->byte, vocab->byte, (size_t)own->size)))
        return train_fail(EXIT_USAGE, "%s: synthetic:text has its own %d-symbol vocabulary, which differs from the "
                          "training data's (%d symbols); expected --data synthetic:text too", flag, own->size,
                          vocab->size);
    if (adt_text_dataset_check_window(s->text, m->gpt.n_ctx))
        return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    s->count = adt_text_dataset_samples(s->text, m->gpt.n_ctx);
    return 0;
}

/* ============================================================================================
 * Setup: model, data, graph, executor
 */
typedef struct trainer {
    train_opts o;
    adt_model_cfg model;
    char model_label[320];
    int builtin_model;
    mlp_teacher teacher;
    train_source train, val;
    int val_holdout; /* val is the tail of --data */
    int T;           /* tokens per sample (1 for mlp) */
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex;
    adt_sampler sampler;
    int64_t *idx; /* [batch] sample indices of the current batch */
    FILE *log;
    int tty;
} trainer;

static int load_model(trainer *t) {
    if (!t->o.model_path) {
        adt_model_cfg_default(&t->model);
        t->builtin_model = 1;
        snprintf(t->model_label, sizeof t->model_label, "built-in gpt-tiny");
        return 0;
    }
    if (adt_model_cfg_load(&t->model, t->o.model_path))
        return train_fail(EXIT_USAGE, "--model: %s", adt_error_message());
    snprintf(t->model_label, sizeof t->model_label, "%s", t->o.model_path);
    return 0;
}

/* The model's vocabulary must be the data's; the built-in model adopts the data's instead. */
static int match_vocab(trainer *t) {
    if (t->model.type != ADT_MODEL_GPT) return 0;
    int dv = adt_text_dataset_vocab(t->train.text)->size;
    if (t->builtin_model) t->model.gpt.vocab_size = dv;
    if (t->model.gpt.vocab_size != dv)
        return train_fail(EXIT_USAGE,
                          "vocabulary mismatch: --data %s has %d distinct symbols but --model %s has vocab_size %d; "
                          "expected them equal (set \"vocab_size\": %d)",
                          t->train.spec, dv, t->model_label, t->model.gpt.vocab_size, dv);
    return 0;
}

/* Without --val, the last 10% of the training samples are held out (the nanoGPT split). */
static int open_data(trainer *t) {
    const adt_model_cfg *m = &t->model;
    if (m->type == ADT_MODEL_MLP) teacher_init(&t->teacher, m->mlp.sizes[0], m->mlp.sizes[m->mlp.n_sizes - 1]);
    if (!t->o.data) t->o.data = default_data(m);
    int rc = open_source(&t->train, "--data", t->o.data, NULL, m, &t->teacher, 0);
    if (rc) return rc;
    if ((rc = match_vocab(t))) return rc;
    if (t->o.val) {
        const adt_text_vocab *v = t->train.kind == SRC_TEXT ? adt_text_dataset_vocab(t->train.text) : NULL;
        return open_source(&t->val, "--val", t->o.val, v, m, &t->teacher, 1);
    }
    int64_t n_val = t->train.count / 10;
    t->val = t->train;
    t->val.owns_text = 0;
    t->val.first = t->train.count - n_val;
    t->val.count = n_val;
    t->train.count -= n_val;
    t->val_holdout = 1;
    return 0;
}

static int check_batches(trainer *t) {
    int B = (int)t->o.batch;
    if (adt_sampler_init(&t->sampler, t->train.count, B, t->o.shuffle, t->o.seed))
        return train_fail(EXIT_USAGE, "--batch %d: the training data (%s) has %lld samples%s, fewer than one batch; "
                          "expected --batch <= %lld",
                          B, t->train.spec, (long long)t->train.count, t->val_holdout ? " after the 10% holdout" : "",
                          (long long)t->train.count);
    if (t->o.eval_every > 0 && t->val.count < B)
        return train_fail(EXIT_USAGE, "--eval-every: the validation data (%s) has %lld samples, fewer than one batch "
                          "of --batch %d; expected --batch <= %lld or more validation data",
                          t->o.val ? t->o.val : "last 10% of --data", (long long)t->val.count, B,
                          (long long)t->val.count);
    return 0;
}

/* The executor allocates everything up front and aborts when memory runs out; a model or batch
 * too big for the machine is better refused with its size before that. */
static int check_memory(const trainer *t) {
    adt_memplan mp;
    if (adt_memplan_build(&mp, t->g, NULL, t->g->n_nodes, 0))
        return train_fail(EXIT_RUNTIME, "memory plan: %s", adt_error_message());
    double need = (double)(mp.arena_bytes + mp.state_bytes + mp.scratch_bytes);
    adt_memplan_free(&mp);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (have > 0 && need > have)
        return train_fail(EXIT_USAGE, "--model %s with --batch %ld needs %.1f GiB, this machine has %.1f GiB; "
                          "expected a smaller --batch or model", t->model_label, t->o.batch, need / 1073741824.0,
                          have / 1073741824.0);
    return 0;
}

static int build_graph(trainer *t) {
    t->g = adt_graph_create();
    if (adt_model_build(t->g, &t->model, (int)t->o.batch, &t->io))
        return train_fail(EXIT_USAGE, "--model %s: %s", t->model_label, adt_error_message());
    adt_optim_cfg oc = t->o.optimizer == ADT_OPTIM_SGD
                           ? adt_optim_sgd((float)t->o.momentum, (float)t->o.weight_decay)
                           : adt_optim_adamw(0.9f, 0.95f, 1e-8f, (float)t->o.weight_decay);
    adt_graph_backward(t->g, t->io.loss);
    adt_graph_optimizer(t->g, &oc);
    if (adt_graph_error(t->g))
        return train_fail(EXIT_RUNTIME, "building the training graph: %s", adt_graph_error_message(t->g));
    int rc = check_memory(t);
    if (rc) return rc;
    adt_exec_opts eo = {.threads = (int)t->o.threads, .seed = t->o.seed};
    if (adt_exec_create(&t->ex, t->g, &eo)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    adt_exec_init_params(t->ex);
    return 0;
}

static int open_log(trainer *t) {
    if (!t->o.log_path) return 0;
    t->log = fopen(t->o.log_path, "w");
    if (!t->log) return train_fail(EXIT_USAGE, "--log: cannot open '%s' for writing: %s", t->o.log_path, strerror(errno));
    return 0;
}

static void print_banner(const trainer *t) {
    const adt_model_cfg *m = &t->model;
    if (m->type == ADT_MODEL_GPT)
        fprintf(stderr, "model  gpt (%s): vocab %d, n_ctx %d, n_layer %d, n_embd %d, n_head %d, dropout %g; %lld parameters\n",
                t->model_label, m->gpt.vocab_size, m->gpt.n_ctx, m->gpt.n_layer, m->gpt.n_embd, m->gpt.n_head,
                (double)m->gpt.dropout, (long long)adt_graph_param_count(t->g));
    else
        fprintf(stderr, "model  mlp (%s): %d layers, %d inputs, %d classes; %lld parameters\n", t->model_label,
                m->mlp.n_sizes - 1, m->mlp.sizes[0], m->mlp.sizes[m->mlp.n_sizes - 1],
                (long long)adt_graph_param_count(t->g));
    if (t->train.kind == SRC_TEXT)
        fprintf(stderr, "data   %s: %lld tokens, vocab %d; %lld train / %lld val samples of %d tokens%s\n",
                t->train.spec, (long long)adt_text_dataset_tokens(t->train.text),
                adt_text_dataset_vocab(t->train.text)->size, (long long)t->train.count, (long long)t->val.count, t->T,
                t->val_holdout ? " (val = last 10%)" : "");
    else
        fprintf(stderr, "data   %s: %lld train / %lld val samples%s\n", t->train.spec, (long long)t->train.count,
                (long long)t->val.count, t->val_holdout ? " (val = last 10%)" : "");
    if (t->o.optimizer == ADT_OPTIM_ADAMW)
        fprintf(stderr, "optim  adamw lr %g, betas (0.9, 0.95), eps 1e-8, weight decay %g", t->o.lr, t->o.weight_decay);
    else
        fprintf(stderr, "optim  sgd lr %g, momentum %g, weight decay %g", t->o.lr, t->o.momentum, t->o.weight_decay);
    fprintf(stderr, "; warmup %ld, %s\n", t->o.warmup, t->o.cosine ? "cosine to 10% of lr" : "constant");
    fprintf(stderr, "run    %ld steps x batch %ld, shuffle %s, seed %llu, threads %d; %.3g GFLOP/step; eval %s\n",
            t->o.steps, t->o.batch, t->o.shuffle ? "on" : "off", (unsigned long long)t->o.seed, t->o.threads,
            adt_graph_flops(t->g) * 1e-9, t->o.eval_every > 0 ? "on" : "off");
}

static void trainer_free(trainer *t) {
    adt_exec_free(t->ex);
    adt_graph_free(t->g);
    adt_sampler_free(&t->sampler);
    source_free(&t->val);
    source_free(&t->train);
    free(t->teacher.w);
    free(t->idx);
    if (t->log) fclose(t->log);
}

static int trainer_setup(trainer *t) {
    int rc;
    if ((rc = load_model(t)) || (rc = open_data(t))) return rc;
    t->T = t->model.type == ADT_MODEL_GPT ? t->model.gpt.n_ctx : 1;
    if ((rc = check_batches(t)) || (rc = open_log(t)) || (rc = build_graph(t))) return rc;
    t->idx = adt_malloc((size_t)t->o.batch * sizeof *t->idx);
    t->tty = isatty(STDERR_FILENO);
    print_banner(t);
    return 0;
}

/* ============================================================================================
 * The loop
 */

/* Learning rate of step s (1-based): linear warmup, then constant or cosine down to lr/10. */
static double lr_at(const train_opts *o, long s) {
    if (o->warmup > 0 && s <= o->warmup) return o->lr * (double)s / (double)o->warmup;
    if (!o->cosine || o->steps <= o->warmup) return o->lr;
    double p = (double)(s - o->warmup) / (double)(o->steps - o->warmup);
    double min_lr = 0.1 * o->lr;
    return min_lr + 0.5 * (1.0 + cos(M_PI * p)) * (o->lr - min_lr);
}

static float read_loss(trainer *t) { return *(const float *)adt_exec_data(t->ex, t->io.loss); }

/* Mean loss over the first K validation batches: the same batches every time, so successive
 * evaluations compare like with like. */
static int evaluate(trainer *t, double *mean) {
    int B = (int)t->o.batch;
    int64_t k_max = t->val.count / B, K = t->o.eval_batches < k_max ? t->o.eval_batches : k_max;
    int64_t *idx = t->idx;
    double sum = 0;
    for (int64_t b = 0; b < K; b++) {
        for (int k = 0; k < B; k++) idx[k] = b * B + k;
        if (source_fill(&t->val, idx, B, t->T, adt_exec_data(t->ex, t->io.input), adt_exec_data(t->ex, t->io.label)))
            return train_fail(EXIT_RUNTIME, "--val: %s", adt_error_message());
        if (adt_exec_run_forward(t->ex)) return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
        sum += read_loss(t);
    }
    *mean = sum / (double)K;
    return 0;
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

typedef struct step_stats {
    long step;
    double loss, lr, ms, per_s;
    double total_s; /* wall time of all steps so far */
} step_stats;

static void print_progress(const trainer *t, const step_stats *st, double step_s) {
    double ms = step_s * 1e3, per_s = (double)t->o.batch * t->T / (step_s > 0 ? step_s : 1e-9);
    char eta[32];
    format_eta(eta, sizeof eta, st->total_s / (double)st->step * (double)(t->o.steps - st->step));
    const char *unit = t->model.type == ADT_MODEL_GPT ? "tok/s" : "samples/s";
    if (t->tty)
        fprintf(stderr, "\rstep %ld/%ld  loss %.4f  lr %.3g  %.3g ms/step  %.0f %s  ETA %s\033[K", st->step, t->o.steps,
                st->loss, st->lr, ms, per_s, unit, eta);
    else
        fprintf(stderr, "step %ld/%ld loss %.4f lr %.3g %.3g ms/step %.0f %s ETA %s\n", st->step, t->o.steps, st->loss,
                st->lr, ms, per_s, unit, eta);
    fflush(stderr);
}

static int log_line(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int log_line(trainer *t, const char *fmt, ...) {
    if (!t->log) return 0;
    va_list ap;
    va_start(ap, fmt);
    int bad = vfprintf(t->log, fmt, ap) < 0;
    va_end(ap);
    bad |= fflush(t->log) != 0; /* a line per step, readable while the run goes on */
    return bad ? train_fail(EXIT_RUNTIME, "--log %s: write failed: %s", t->o.log_path, strerror(errno)) : 0;
}

static int run_eval(trainer *t, long step) {
    double vl = 0;
    int rc = evaluate(t, &vl);
    if (rc) return rc;
    if (t->tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "eval step %ld/%ld: val_loss %.4f\n", step, t->o.steps, vl);
    return log_line(t, "{\"step\":%ld,\"val_loss\":%.9g}\n", step, vl);
}

static int train_step(trainer *t, long step, step_stats *st) {
    int B = (int)t->o.batch;
    int64_t *idx = t->idx;
    double t0 = adt_now_s();
    adt_sampler_batch(&t->sampler, step - 1, idx);
    if (source_fill(&t->train, idx, B, t->T, adt_exec_data(t->ex, t->io.input), adt_exec_data(t->ex, t->io.label)))
        return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    st->step = step;
    st->lr = lr_at(&t->o, step);
    adt_exec_set_lr_step(t->ex, (float)st->lr, (int32_t)step);
    if (adt_exec_run(t->ex)) return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    st->loss = read_loss(t);
    double dt = adt_now_s() - t0;
    st->total_s += dt;
    st->ms = dt * 1e3;
    st->per_s = (double)B * t->T / (dt > 0 ? dt : 1e-9);
    return 0;
}

static int train_loop(trainer *t) {
    step_stats st = {0};
    double first_loss = NAN, last_print = 0;
    double win_s = 0; /* step time since the last printed line: a smoother ms/step than one step */
    int win_n = 0;
    for (long s = 1; s <= t->o.steps; s++) {
        int rc = train_step(t, s, &st);
        if (rc) return rc;
        if (s == 1) first_loss = st.loss;
        char loss_json[32]; /* JSON has no NaN: a diverged step logs null */
        if (isfinite(st.loss)) snprintf(loss_json, sizeof loss_json, "%.9g", st.loss);
        else snprintf(loss_json, sizeof loss_json, "null");
        rc = log_line(t, "{\"step\":%ld,\"loss\":%s,\"lr\":%.9g,\"ms\":%.3f,\"tokens_per_s\":%.1f}\n", s,
                      loss_json, st.lr, st.ms, st.per_s);
        if (rc) return rc;
        if (!isfinite(st.loss)) {
            if (t->tty) fprintf(stderr, "\n");
            return train_fail(EXIT_RUNTIME, "step %ld: the loss is %g (training diverged); expected a finite loss - "
                              "try a lower --lr (now %g)", s, st.loss, t->o.lr);
        }
        int last = s == t->o.steps;
        double now = adt_now_s();
        win_s += st.ms * 1e-3, win_n++;
        if (t->tty ? (now - last_print > 0.1 || last || s == 1) : (s == 1 || s % 10 == 0 || last)) {
            print_progress(t, &st, win_s / win_n);
            last_print = now, win_s = 0, win_n = 0;
        }
        if (t->o.eval_every > 0 && (s % t->o.eval_every == 0 || last) && (rc = run_eval(t, s))) return rc;
    }
    if (t->tty) fprintf(stderr, "\n");
    fprintf(stderr, "done: %ld steps in %.2f s (%.3g ms/step); loss %.4f -> %.4f\n", t->o.steps, st.total_s,
            st.total_s * 1e3 / (double)t->o.steps, first_loss, st.loss);
    return 0;
}

int cli_train(int argc, char **argv) {
    trainer t = {0};
    int rc = parse_opts(&t.o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    rc = trainer_setup(&t);
    if (!rc) rc = train_loop(&t);
    trainer_free(&t);
    return rc;
}
