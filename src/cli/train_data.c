/*
 * train_data.c - the model and data of `adtrain train`: the config, the training and validation
 * sources (with the 10% holdout when no --val is given), and batches written into the graph.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "train.h"

#define SYN_TEXT_TOKENS (1 << 20)   /* synthetic:text training stream */
#define SYN_TEXT_VAL_TOKENS (1 << 17)
#define SYN_MLP_SAMPLES 60000       /* synthetic:mlp, like MNIST's training set */
#define SYN_MLP_VAL_SAMPLES 10000

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

int train_source_fill(const train_source *s, int64_t *idx, int n, int T, void *input, void *label) {
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

int train_load_model(trainer *t) {
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
int train_open_data(trainer *t) {
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

int train_check_batches(trainer *t) {
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

void train_data_free(trainer *t) {
    source_free(&t->val);
    source_free(&t->train);
    free(t->teacher.w);
}
