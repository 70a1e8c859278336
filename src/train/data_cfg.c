/*
 * data_cfg.c - what the trainer and the planner's commands share about a model's data: the shape a dataset must fit, what
 * each model family reads, the --data a run reads when none is given, and what producing one
 * sample costs on this machine (the input term of the cost model: adt_cluster.input_s), which
 * `adtrain plan --cluster` measures on the data the run will read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/data.h"
#include "adtrain/train.h"

void adt_train_data_shape(const adt_model_cfg *m, int builtin_model, const char *spec, adt_data_shape *s) {
    memset(s, 0, sizeof *s);
    switch (m->type) {
    case ADT_MODEL_GPT:
        s->n_ctx = m->gpt.n_ctx;
        /* the built-in model adopts the data's */
        s->vocab_size = builtin_model || !strncmp(spec, "text:", 5) ? 0 : m->gpt.vocab_size;
        break;
    case ADT_MODEL_MLP:
        s->in_features = m->mlp.sizes[0];
        s->classes = m->mlp.sizes[m->mlp.n_sizes - 1];
        break;
    case ADT_MODEL_VGG:
        s->channels = m->vgg.in_channels, s->height = m->vgg.height, s->width = m->vgg.width;
        s->in_features = s->channels * s->height * s->width;
        s->classes = m->vgg.classes;
        break;
    case ADT_MODEL_DLRM:
        s->n_dense = m->dlrm.n_dense;
        s->n_tables = m->dlrm.n_tables;
        for (int i = 0; i < m->dlrm.n_tables && i < ADT_DATA_MAX_TABLES; i++) s->table_rows[i] = m->dlrm.table_rows[i];
        break;
    }
}

adt_data_layout adt_train_data_layout(const adt_model_cfg *m) {
    switch (m->type) {
    case ADT_MODEL_GPT: return ADT_DATA_SEQ;
    case ADT_MODEL_DLRM: return ADT_DATA_CTR;
    default: return ADT_DATA_CLASS;
    }
}

const char *adt_train_data_layout_name(adt_data_layout l) {
    return l == ADT_DATA_SEQ ? "token sequences (text:, tokens:, synthetic:text)"
           : l == ADT_DATA_CLASS ? "labelled examples (mnist:, synthetic:mlp, synthetic:vgg)"
                                 : "click logs (criteo:, synthetic:dlrm)";
}

const char *adt_train_default_data(const adt_model_cfg *m, const char **why) {
    static const char *const syn[] = {[ADT_MODEL_GPT] = "synthetic:text", [ADT_MODEL_MLP] = "synthetic:mlp",
                                      [ADT_MODEL_VGG] = "synthetic:vgg", [ADT_MODEL_DLRM] = "synthetic:dlrm"};
    const char *w;
    const char *spec = syn[m->type];
    if (m->type == ADT_MODEL_GPT && access(ADT_TRAIN_DEFAULT_TEXT, R_OK) == 0) {
        w = "no --data given: using text:" ADT_TRAIN_DEFAULT_TEXT;
        spec = "text:" ADT_TRAIN_DEFAULT_TEXT;
    } else if (m->type == ADT_MODEL_GPT) {
        w = "no --data given and " ADT_TRAIN_DEFAULT_TEXT " not found: using synthetic:text";
    } else {
        static const char *const said[] = {[ADT_MODEL_GPT] = "", [ADT_MODEL_MLP] = "no --data given: using synthetic:mlp",
                                           [ADT_MODEL_VGG] = "no --data given: using synthetic:vgg",
                                           [ADT_MODEL_DLRM] = "no --data given: using synthetic:dlrm"};
        w = said[m->type];
    }
    if (why) *why = w;
    return spec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define INPUT_MAX_SAMPLES 256
#define INPUT_MIN_ROUNDS 9
#define INPUT_MAX_ROUNDS 401
#define INPUT_MIN_S 0.05

/* What the trainer does per step before the passes (collective.c fill_blocks): the
 * samples read from the source into staging buffers, then copied into the fed values. Timed on
 * up to INPUT_MAX_SAMPLES samples spread over the dataset, after one round that faults the
 * buffers in; the median of the rounds of INPUT_MIN_S (at least INPUT_MIN_ROUNDS): a DLRM's 256
 * samples fill in about 0.3 ms, and the median of 5 fills priced them at 0.85 and 1.32 us a
 * sample in two runs an hour apart, moving its tensor-parallel plans (every rank reads the whole
 * batch) by a tenth against its data-parallel ones. */
int adt_train_measure_input(const adt_model_cfg *m, int builtin_model, const char *spec, int batch, double *s_per_sample) {
    *s_per_sample = 0;
    adt_data_shape shape;
    adt_train_data_shape(m, builtin_model, spec, &shape);
    adt_dataset *ds = NULL;
    if (adt_dataset_open(&ds, spec, &shape, NULL, 0)) return ADT_ERR_ARG;
    int rc = 0;
    if (adt_dataset_layout(ds) != adt_train_data_layout(m)) {
        rc = adt_error(ADT_ERR_ARG, "%s holds %s, but the model (%s) trains on %s", spec,
                       adt_train_data_layout_name(adt_dataset_layout(ds)), adt_model_type_name(m->type),
                       adt_train_data_layout_name(adt_train_data_layout(m)));
        adt_dataset_free(ds);
        return rc;
    }
    int64_t count = adt_dataset_samples(ds);
    int n = batch < INPUT_MAX_SAMPLES ? batch : INPUT_MAX_SAMPLES;
    if (count < n) n = (int)count;
    if (n < 1) {
        adt_dataset_free(ds);
        return adt_error(ADT_ERR_ARG, "%s: no complete sample", spec);
    }
    size_t bytes[3]; /* every element is 4 bytes: f32 features and labels, i32 tokens and rows */
    void *buf[3], *dst[3];
    for (int i = 0; i < 3; i++) {
        bytes[i] = (size_t)n * (size_t)adt_dataset_sample_elems(ds, i) * 4;
        buf[i] = bytes[i] ? adt_malloc(bytes[i]) : NULL;
        dst[i] = bytes[i] ? adt_malloc(bytes[i]) : NULL;
    }
    int64_t *ids = adt_malloc((size_t)n * sizeof *ids);
    for (int k = 0; k < n; k++) ids[k] = (int64_t)(((uint64_t)k * 2654435761u) % (uint64_t)count);
    double t[INPUT_MAX_ROUNDS + 1], start = adt_now_s();
    int rounds = 0; /* timed, after round 0 */
    for (int r = 0; r <= INPUT_MAX_ROUNDS && !rc; r++) {
        double t0 = adt_now_s();
        rc = adt_dataset_fill(ds, ids, n, buf[0], buf[1], buf[2]);
        for (int i = 0; i < 3; i++)
            if (bytes[i]) memcpy(dst[i], buf[i], bytes[i]);
        t[r] = adt_now_s() - t0;
        rounds = r;
        if (r >= INPUT_MIN_ROUNDS && adt_now_s() - start >= INPUT_MIN_S) break;
    }
    if (!rc) {
        qsort(t + 1, (size_t)rounds, sizeof *t, cmp_double);
        *s_per_sample = t[1 + rounds / 2] / n;
    }
    for (int i = 0; i < 3; i++) free(buf[i]), free(dst[i]);
    free(ids);
    adt_dataset_free(ds);
    return rc;
}
