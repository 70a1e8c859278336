/*
 * train_data.c - the model and data of `adtrain train`: the config, the training and validation
 * datasets that fit it (with the 10% holdout when no --val is given), batches written into the
 * graph's fed values, and the evaluation metrics each model family reports.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "train.h"

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

/* Opens --data (vocab NULL) or --val (the training vocabulary for text) for the model. */
static int open_source(trainer *t, train_source *s, const char *flag, const char *spec, const adt_text_vocab *vocab,
                       int is_val) {
    memset(s, 0, sizeof *s);
    s->spec = spec;
    adt_data_shape shape;
    cli_data_shape(&t->model, t->builtin_model, spec, &shape);
    if (t->model.type == ADT_MODEL_DLRM && t->model.dlrm.n_tables > ADT_DATA_MAX_TABLES)
        return train_fail(EXIT_USAGE, "--model %s: %d embedding tables; the data loaders take at most %d",
                          t->model_label, t->model.dlrm.n_tables, ADT_DATA_MAX_TABLES);
    if (adt_dataset_open(&s->ds, spec, &shape, vocab, is_val)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    s->owns = 1; /* from here on freed with the trainer, refused or not */
    adt_data_layout want = cli_data_layout(&t->model);
    if (adt_dataset_layout(s->ds) != want)
        return train_fail(EXIT_USAGE, "%s %s holds %s, but --model %s (%s) trains on %s", flag, spec,
                          cli_data_layout_name(adt_dataset_layout(s->ds)), t->model_label,
                          adt_model_type_name(t->model.type), cli_data_layout_name(want));
    s->count = adt_dataset_samples(s->ds);
    if (s->count < 1)
        return train_fail(EXIT_USAGE, "%s %s: no complete sample%s", flag, spec,
                          want == ADT_DATA_SEQ ? " (the text is shorter than n_ctx + 1 tokens)" : "");
    return 0;
}

/* A GPT's vocabulary must hold the data's tokens: text must match it exactly (a character-level
 * model is its vocabulary), token files must fit under it; the built-in model adopts the data's. */
static int match_vocab(trainer *t) {
    if (t->model.type != ADT_MODEL_GPT) return 0;
    int dv = adt_dataset_vocab_size(t->train.ds);
    int is_text = adt_dataset_vocab(t->train.ds) != NULL;
    if (t->builtin_model) t->model.gpt.vocab_size = dv;
    if (is_text ? t->model.gpt.vocab_size != dv : t->model.gpt.vocab_size < dv)
        return train_fail(EXIT_USAGE,
                          "vocabulary mismatch: --data %s has %d %s but --model %s has vocab_size %d; expected %s "
                          "(set \"vocab_size\": %d)",
                          t->train.spec, dv, is_text ? "distinct symbols" : "token ids", t->model_label,
                          t->model.gpt.vocab_size, is_text ? "them equal" : "at least as many", dv);
    return 0;
}

/* Without --val, the last 10% of the training samples are held out (the nanoGPT split). */
int train_open_data(trainer *t) {
    if (!t->o.data) t->o.data = cli_default_data(&t->model, "train", !cli_quiet);
    int rc = open_source(t, &t->train, "--data", t->o.data, NULL, 0);
    if (rc) return rc;
    if ((rc = match_vocab(t))) return rc;
    if (t->o.val) return open_source(t, &t->val, "--val", t->o.val, adt_dataset_vocab(t->train.ds), 1);
    int64_t n_val = t->train.count / 10;
    t->val = t->train;
    t->val.owns = 0;
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

int train_source_fill(const train_source *s, int64_t *idx, int n, void *input, void *input2, void *label) {
    for (int k = 0; k < n; k++) idx[k] += s->first;
    return adt_dataset_fill(s->ds, idx, n, input, input2, label);
}

/* ---- evaluation metrics ------------------------------------------------------------------- */

void train_metric_reset(trainer *t) {
    t->metric_hits = 0;
    t->metric_n = 0;
}

/* After a forward run on a validation batch: classifiers count correct argmaxes, DLRM keeps the
 * scores and labels for the AUC. Collective on a distributed run (the whole logits). */
int train_metric_add(trainer *t, int B) {
    if (t->model.type == ADT_MODEL_GPT) return 0;
    const void *lp, *yp;
    if (train_read(t, t->io.logits, 0, &lp) || train_read(t, t->io.label, 1, &yp)) return -1;
    const float *logits = lp;
    if (t->model.type == ADT_MODEL_MLP || t->model.type == ADT_MODEL_VGG) {
        const int32_t *y = yp;
        int C = t->model.type == ADT_MODEL_MLP ? t->model.mlp.sizes[t->model.mlp.n_sizes - 1] : t->model.vgg.classes;
        for (int b = 0; b < B; b++) {
            int best = 0;
            for (int c = 1; c < C; c++)
                if (logits[(int64_t)b * C + c] > logits[(int64_t)b * C + best]) best = c;
            t->metric_hits += best == y[b];
        }
        t->metric_n += B;
    } else if (t->model.type == ADT_MODEL_DLRM) {
        const float *y = yp;
        for (int b = 0; b < B; b++) {
            t->scores[t->metric_n + b] = logits[b];
            t->labels[t->metric_n + b] = y[b];
        }
        t->metric_n += B;
    }
    return 0;
}

/* ",\"val_acc\":0.97" for the log line and " val_acc 0.9700" for the terminal; empty for GPT. */
void train_metric_format(trainer *t, char *json, size_t nj, char *text, size_t nt) {
    json[0] = text[0] = 0;
    if (!t->metric_n) return;
    if (t->model.type == ADT_MODEL_DLRM) {
        double auc;
        if (adt_auc(t->scores, t->labels, t->metric_n, &auc)) {
            snprintf(text, nt, "  val_auc undefined (%s)", adt_error_message());
            return;
        }
        snprintf(json, nj, ",\"val_auc\":%.6f", auc);
        snprintf(text, nt, "  val_auc %.4f", auc);
        return;
    }
    double acc = (double)t->metric_hits / (double)t->metric_n;
    snprintf(json, nj, ",\"val_acc\":%.6f", acc);
    snprintf(text, nt, "  val_acc %.4f", acc);
}

void train_data_free(trainer *t) {
    if (t->val.owns) adt_dataset_free(t->val.ds);
    if (t->train.owns) adt_dataset_free(t->train.ds);
    free(t->scores);
    free(t->labels);
}
