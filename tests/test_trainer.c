/*
 * test_trainer.c - adt_trainer driven as a library, no argv: options checked with the option
 * named in the message, failures returned (never an exit), the first step's loss against the same
 * model built and run by hand through the graph API on the sampler's first batch, a resumed run
 * bit for bit the uninterrupted one, evaluation repeatable and reported on the steps it is due,
 * and no step after the last.
 */
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/data.h"
#include "adtrain/exec.h"
#include "adtrain/models.h"
#include "adtrain/train.h"

static const char *g_mlp; /* a small MLP config in the test's directory */

typedef struct notes {
    char text[8192];
} notes;

static void keep_note(void *ctx, const char *line) {
    notes *n = ctx;
    size_t k = strlen(n->text);
    snprintf(n->text + k, sizeof n->text - k, "%s\n", line);
}

static void mlp_opts(adt_train_opts *o, notes *n) {
    adt_train_opts_init(o);
    o->model_path = g_mlp;
    o->data = "synthetic:mlp";
    o->batch = 32;
    o->steps = 6;
    o->optimizer = ADT_OPTIM_SGD;
    o->momentum = 0.9, o->momentum_given = 1;
    o->note = keep_note, o->note_ctx = n;
    CHECK(adt_train_opts_check(o) == 0, "%s", adt_error_message());
}

static void test_options_checked(void) {
    adt_train_opts o;
    adt_train_opts_init(&o);
    CHECK(o.steps == 200 && o.batch == 16 && o.optimizer == ADT_OPTIM_ADAMW && o.threads == 1 && o.seed == 1337,
          "defaults: steps %ld batch %ld", o.steps, o.batch);
    CHECK(adt_train_opts_set(&o, "steps", "12") == 0 && o.steps == 12, "steps %ld", o.steps);
    CHECK(adt_train_opts_set(&o, "--batch", "8") == 0 && o.batch == 8, "batch %ld", o.batch);
    int rc = adt_train_opts_set(&o, "--steps", "-3");
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "--steps"), "rc %d: %s", rc, adt_error_message());
    rc = adt_train_opts_set(&o, "--optimizer", "lamb");
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "'sgd' or 'adamw'"), "rc %d: %s", rc, adt_error_message());
    rc = adt_train_opts_set(&o, "--no-such-flag", "1");
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "no-such-flag"), "rc %d: %s", rc, adt_error_message());
    CHECK(!adt_train_opts_known("--no-such-flag") && adt_train_opts_known("--lr") && adt_train_opts_known("lr"), "known");
    adt_train_opts_init(&o);
    o.warmup = 300;
    rc = adt_train_opts_check(&o);
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "--warmup"), "rc %d: %s", rc, adt_error_message());
    adt_train_opts_init(&o);
    CHECK(adt_train_opts_check(&o) == 0 && o.lr == 1e-3, "adamw's default lr %g", o.lr);
    adt_train_opts_init(&o);
    o.optimizer = ADT_OPTIM_SGD;
    CHECK(adt_train_opts_check(&o) == 0 && o.lr == 0.1, "sgd's default lr %g", o.lr);
}

static void test_create_fails_cleanly(void) {
    adt_train_opts o;
    notes n = {{0}};
    mlp_opts(&o, &n);
    o.model_path = check_tmp_path("missing.json");
    adt_trainer *t = (adt_trainer *)&o; /* must be reset to NULL */
    int rc = adt_trainer_create(&t, &o);
    CHECK(rc == ADT_ERR_ARG && t == NULL, "rc %d", rc);
    CHECK(strstr(adt_error_message(), "--model") && strstr(adt_error_message(), "missing.json"), "%s",
          adt_error_message());
    mlp_opts(&o, &n);
    o.batch = 1 << 20; /* more than the data holds */
    rc = adt_trainer_create(&t, &o);
    CHECK(rc == ADT_ERR_ARG && t == NULL && strstr(adt_error_message(), "--batch"), "rc %d: %s", rc,
          adt_error_message());
}

/* The same model at the same batch, run by hand on the sampler's first batch: the loss before
 * any update is the trainer's first step's. */
static double loss_by_hand(const adt_train_opts *o) {
    adt_model_cfg cfg;
    if (adt_model_cfg_load(&cfg, o->model_path)) return NAN;
    adt_data_shape shape;
    adt_train_data_shape(&cfg, 0, o->data, &shape);
    adt_dataset *ds = NULL;
    if (adt_dataset_open(&ds, o->data, &shape, NULL, 0)) return NAN;
    int64_t train_count = adt_dataset_samples(ds) - adt_dataset_samples(ds) / 10; /* the 10% holdout */
    adt_sampler smp;
    adt_sampler_init(&smp, train_count, (int)o->batch, o->shuffle, o->seed);
    int64_t *idx = malloc((size_t)o->batch * sizeof *idx);
    adt_sampler_batch(&smp, 0, idx);
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    double loss = NAN;
    adt_exec *ex = NULL;
    adt_exec_opts eo = {.threads = 1, .seed = o->seed};
    if (!adt_model_build(g, &cfg, (int)o->batch, &io) && !adt_exec_create(&ex, g, &eo)) {
        adt_exec_init_params(ex);
        if (!adt_dataset_fill(ds, idx, (int)o->batch, adt_exec_data(ex, io.input), NULL, adt_exec_data(ex, io.label)) &&
            !adt_exec_run_forward(ex))
            loss = *(const float *)adt_exec_data(ex, io.loss);
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    free(idx);
    adt_sampler_free(&smp);
    adt_dataset_free(ds);
    return loss;
}

static void test_first_step_is_the_models_loss(void) {
    adt_train_opts o;
    notes n = {{0}};
    mlp_opts(&o, &n);
    adt_trainer *t;
    int rc = adt_trainer_create(&t, &o);
    CHECK(rc == 0, "%s", adt_error_message());
    if (rc) return;
    adt_train_step_info st;
    rc = adt_trainer_step(t, &st);
    CHECK(rc == 0 && st.step == 1 && st.steps == 6, "rc %d step %ld", rc, st.step);
    double ref = loss_by_hand(&o);
    CHECK_CLOSE(st.loss, ref, 1e-6, 0);
    CHECK(st.lr > 0 && st.seconds > 0 && st.items_per_s > 0, "lr %g, %g s", st.lr, st.seconds);
    adt_trainer_free(t);
}

/* Six steps straight, against three steps saved and three more resumed from the file. */
static void test_resume_is_bitwise(void) {
    adt_train_opts o;
    notes n = {{0}};
    mlp_opts(&o, &n);
    adt_trainer *t;
    double straight[6] = {0}, resumed[6] = {0};
    adt_train_step_info st;
    CHECK(adt_trainer_create(&t, &o) == 0, "%s", adt_error_message());
    if (!t) return;
    for (int s = 0; s < 6 && adt_trainer_step(t, &st) == 0; s++) straight[s] = st.loss;
    CHECK(adt_trainer_step(t, &st) == 1, "a step after the last");
    adt_trainer_free(t);

    /* the same run of 6 steps (the schedule depends on them), stopped after its step-3 save */
    char pattern[512], ck[512];
    snprintf(pattern, sizeof pattern, "%s", check_tmp_path("half-{step}.safetensors"));
    snprintf(ck, sizeof ck, "%s", check_tmp_path("half-3.safetensors"));
    mlp_opts(&o, &n);
    o.save_path = pattern;
    o.save_every = 3;
    CHECK(adt_trainer_create(&t, &o) == 0, "%s", adt_error_message());
    if (!t) return;
    for (int s = 0; s < 3 && adt_trainer_step(t, &st) == 0; s++) resumed[s] = st.loss;
    CHECK(st.saved, "step 3 saved");
    adt_trainer_free(t);
    CHECK(strstr(n.text, "saved") != NULL, "notes: %s", n.text);

    mlp_opts(&o, &n);
    o.resume_path = ck;
    CHECK(adt_trainer_create(&t, &o) == 0, "%s", adt_error_message());
    if (!t) return;
    CHECK(adt_trainer_start_step(t) == 3, "start step %ld", adt_trainer_start_step(t));
    CHECK(strstr(n.text, "continuing after step 3") != NULL, "notes: %s", n.text);
    for (int s = 3; s < 6 && adt_trainer_step(t, &st) == 0; s++) resumed[s] = st.loss;
    adt_trainer_free(t);
    for (int s = 0; s < 6; s++) CHECK(resumed[s] == straight[s], "step %d: %.9g resumed, %.9g straight", s + 1, resumed[s], straight[s]);
}

static void test_eval_when_due(void) {
    adt_train_opts o;
    notes n = {{0}};
    mlp_opts(&o, &n);
    o.eval_every = 4;
    o.eval_batches = 2;
    adt_trainer *t;
    CHECK(adt_trainer_create(&t, &o) == 0, "%s", adt_error_message());
    if (!t) return;
    double v1, v2;
    char js[64], tx[160];
    CHECK(adt_trainer_eval(t, &v1, js, sizeof js, tx, sizeof tx) == 0, "%s", adt_error_message());
    CHECK(adt_trainer_eval(t, &v2, js, sizeof js, tx, sizeof tx) == 0 && v1 == v2, "%.9g then %.9g", v1, v2);
    CHECK(strstr(js, "val_acc") != NULL, "metric json '%s'", js);
    adt_train_step_info st;
    int evaluated[7] = {0};
    for (int s = 1; s <= 6 && adt_trainer_step(t, &st) == 0; s++) evaluated[s] = st.evaluated;
    CHECK(!evaluated[1] && !evaluated[3] && evaluated[4] && !evaluated[5] && evaluated[6], "evaluated on steps 4 and 6");
    adt_trainer_free(t);
}

int main(void) {
    check_tmpdir_make("trainer");
    g_mlp = check_tmp_path("mlp.json");
    FILE *f = fopen(g_mlp, "w");
    fprintf(f, "{\"type\":\"mlp\",\"sizes\":[784,64,10],\"activation\":\"relu\"}\n");
    fclose(f);
    g_mlp = strdup(g_mlp);
    RUN(test_options_checked);
    RUN(test_create_fails_cleanly);
    RUN(test_first_step_is_the_models_loss);
    RUN(test_resume_is_bitwise);
    RUN(test_eval_when_due);
    return check_finish();
}
