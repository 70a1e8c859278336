/*
 * torch_fixture.h - running a graph against a PyTorch reference fixture (a safetensors file in
 * tests/fixtures written by scripts/gen_fixtures.py): load the fixture's parameters and inputs
 * into an executor by name, then compare logits, loss, every parameter gradient and optimizer
 * trajectories.
 *
 * Fixture names: parameters under their model names; fed values under the names a test maps
 * (fx_feed); results under "expect.", "grad.<param>" and "traj.". Integers the model is built with
 * sit in __metadata__.
 *
 * Tolerances are relative, per tensor: max|a - b| / max|b|, the error relative to the tensor's
 * largest magnitude. A per-element relative error would be dominated by elements that are near
 * zero by cancellation, whose absolute float32 error is set by the tensor's scale. The worst
 * tensor of each part is printed, so a drift towards a limit shows before it fails.
 *
 * A missing or unreadable fixture is a failure, not a skip: the comparison is the point.
 */
#ifndef ADTRAIN_TESTS_TORCH_FIXTURE_H
#define ADTRAIN_TESTS_TORCH_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"
#include "adtrain/safetensors.h"
#include "check.h"

/* ---- fixture access ---------------------------------------------------------------------- */

static inline adt_st_file *open_fixture(const char *path) {
    adt_st_file *f = NULL;
    int rc = adt_st_open(&f, path);
    CHECK(rc == ADT_OK, "cannot read the PyTorch reference fixture: %s\n"
                        "    regenerate it from the repository root with `make fixtures`",
          adt_error_message());
    return rc == ADT_OK ? f : NULL;
}

/* An integer from the fixture's __metadata__; -1 (and a failure) if absent or malformed, so the
 * model is always built with the configuration the reference was computed with. */
static inline int meta_int(const adt_st_file *f, const char *key) {
    const char *s = adt_st_metadata(f, key);
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : -1;
    int ok = s && end != s && *end == '\0' && v > 0 && v < 1000000;
    CHECK(ok, "%s: __metadata__ entry '%s' is %s%s%s, expected a positive integer", adt_st_name(f), key,
          s ? "'" : "", s ? s : "missing", s ? "'" : "");
    return ok ? (int)v : -1;
}

/* A string from __metadata__ (NULL and a failure if absent). */
static inline const char *meta_str(const adt_st_file *f, const char *key) {
    const char *s = adt_st_metadata(f, key);
    CHECK(s != NULL, "%s: __metadata__ has no entry '%s'", adt_st_name(f), key);
    return s;
}

/* The shape PyTorch gives value v: its file shape, and a parameter gradient its parameter's
 * (GPT's c_attn.weight is [C,3,C] in the graph and [C,3C] in the fixture, the same bytes). */
static inline int value_dims(const adt_graph *g, int v, int64_t *dims) {
    adt_shape s = adt_value_file_shape(g, v);
    for (int p = 0; p < g->n_values; p++)
        if (g->values[p].role == ADT_ROLE_PARAM && g->values[p].grad == v) s = adt_value_file_shape(g, p);
    for (int d = 0; d < s.ndim; d++) dims[d] = s.dim[d];
    return s.ndim;
}

/* A fixture tensor as a fresh float array of the given shape; NULL (and a failure) if absent or
 * shaped differently. */
static inline float *read_expect(const adt_st_file *f, const char *name, int ndim, const int64_t *dims, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    int rc = adt_st_read_f32(f, name, p, ndim, dims);
    CHECK(rc == ADT_OK, "reference tensor: %s", adt_error_message());
    if (rc != ADT_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* A fed graph value and the fixture tensor that holds its contents. */
typedef struct feed_map {
    const char *value;   /* name in the graph   */
    const char *fixture; /* name in the fixture */
} feed_map;

/* Fixture names that hold results rather than model state. */
static inline int is_reference_name(const char *name) {
    return !strncmp(name, "expect.", 7) || !strncmp(name, "grad.", 5) || !strncmp(name, "traj.", 5);
}

/* Writes every parameter of g and every mapped fed value from the fixture into the executor,
 * and checks the correspondence both ways: each model parameter must be in the fixture with the
 * model's shape, and each fixture tensor that is not a reference result must be a model
 * parameter or a mapped input. A name mismatch would otherwise leave a weight at whatever the
 * state block held and the comparison would fail far from the cause. Returns 0 if all loaded. */
static inline int load_fixture(adt_exec *ex, const adt_graph *g, const adt_st_file *f, const feed_map *feeds,
                               int nfeeds) {
    int bad = 0, nparams = 0;
    int64_t dims[ADT_MAX_DIMS];
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM) continue;
        nparams++;
        int nd = value_dims(g, v, dims);
        int rc = adt_st_read_f32(f, val->name, adt_exec_data(ex, v), nd, dims);
        CHECK(rc == ADT_OK, "model parameter '%s' could not be loaded: %s", val->name, adt_error_message());
        bad |= rc != ADT_OK;
    }
    CHECK(nparams > 0, "the graph has no parameters");
    for (int i = 0; i < nfeeds; i++) {
        int v = adt_graph_find_value(g, feeds[i].value);
        CHECK(v >= 0, "the graph has no value '%s'", feeds[i].value);
        if (v < 0) {
            bad = 1;
            continue;
        }
        int nd = value_dims(g, v, dims);
        int rc = g->values[v].dtype == ADT_I32
                     ? adt_st_read_i32(f, feeds[i].fixture, adt_exec_data(ex, v), nd, dims)
                     : adt_st_read_f32(f, feeds[i].fixture, adt_exec_data(ex, v), nd, dims);
        CHECK(rc == ADT_OK, "input '%s' could not be loaded: %s", feeds[i].value, adt_error_message());
        bad |= rc != ADT_OK;
    }
    for (int i = 0; i < adt_st_count(f); i++) {
        const char *name = adt_st_get(f, i)->name;
        if (is_reference_name(name)) continue;
        int known = 0;
        for (int k = 0; k < nfeeds; k++) known |= !strcmp(name, feeds[k].fixture);
        int v = adt_graph_find_value(g, name);
        known |= v >= 0 && g->values[v].role == ADT_ROLE_PARAM;
        CHECK(known, "%s holds tensor '%s', which is not a parameter of the model", adt_st_name(f), name);
        bad |= !known;
    }
    return bad;
}

/* ---- comparison -------------------------------------------------------------------------- */

/* The worst tensor of a part, for the summary line. */
typedef struct worst {
    double err;
    char what[ADT_NAME_LEN + 32];
} worst;

/* max|a - b| / max|b| over the tensor (a NaN anywhere counts as infinite); *at gets the index of
 * the largest difference. */
static inline double tensor_rel_err(const float *a, const float *b, int64_t n, int64_t *at) {
    double dmax = 0, bmax = 0;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) {
            *at = i;
            return INFINITY;
        }
        if (d > dmax) {
            dmax = d;
            *at = i;
        }
        bmax = fmax(bmax, fabs((double)b[i]));
    }
    return dmax / fmax(bmax, 1e-30);
}

static inline void compare(worst *w, const char *what, const float *got, const float *want, int64_t n, double tol) {
    int64_t at;
    double err = tensor_rel_err(got, want, n, &at);
    if (err > w->err || w->what[0] == '\0') {
        w->err = err;
        snprintf(w->what, sizeof w->what, "%s", what);
    }
    CHECK(err <= tol, "%s: max|adtrain - torch| / max|torch| = %.3e > %.0e (element %lld: adtrain %.9g, torch %.9g)",
          what, err, tol, (long long)at, got[at], want[at]);
}

/* Compares value v (read from the executor) with fixture tensor `ref`. */
static inline void compare_value(worst *w, adt_exec *ex, const adt_graph *g, int v, const adt_st_file *f,
                                 const char *ref, double tol) {
    int64_t dims[ADT_MAX_DIMS];
    int nd = value_dims(g, v, dims);
    int64_t n = adt_value_numel(g, v);
    /* the loss is [1] in the graph and a 0-d tensor in PyTorch */
    if (n == 1 && adt_st_find(f, ref) && adt_st_find(f, ref)->ndim == 0) nd = 0;
    float *want = read_expect(f, ref, nd, dims, n);
    if (!want) return;
    compare(w, ref, adt_exec_data(ex, v), want, n, tol);
    free(want);
}

/* Compares the gradient of every parameter with "grad.<name>", and checks that every reference
 * gradient belongs to a parameter of the graph. Returns the number of parameters. */
static inline int compare_gradients(worst *w, adt_exec *ex, const adt_graph *g, const adt_st_file *f, double tol) {
    int nparams = 0;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM) continue;
        nparams++;
        CHECK(val->grad >= 0, "parameter '%s' got no gradient", val->name);
        if (val->grad < 0) continue;
        char ref[ADT_NAME_LEN + 8];
        snprintf(ref, sizeof ref, "grad.%s", val->name);
        compare_value(w, ex, g, val->grad, f, ref, tol);
    }
    for (int i = 0; i < adt_st_count(f); i++) {
        const char *name = adt_st_get(f, i)->name;
        if (strncmp(name, "grad.", 5)) continue;
        int v = adt_graph_find_value(g, name + 5);
        CHECK(v >= 0 && g->values[v].role == ADT_ROLE_PARAM,
              "%s holds gradient '%s' of a tensor that is not a parameter of the graph", adt_st_name(f), name);
    }
    return nparams;
}

/* ---- a model against its fixture ----------------------------------------------------------- */

/* How a test builds its model (forward and loss) from the fixture; nonzero on failure. */
typedef int (*fixture_build_fn)(adt_graph *g, const adt_st_file *f, adt_model_io *io, void *ctx);

typedef struct fixture_model {
    const char *label; /* in messages and summary lines */
    const char *path;  /* the fixture file              */
    fixture_build_fn build;
    void *ctx;
    const feed_map *feeds;
    int nfeeds;
} fixture_model;

/* Builds the model with autodiff (and an optimizer if `opt`), the executor, and loads the
 * fixture. Logits, loss and every gradient are marked as outputs first: the arena would
 * otherwise reuse their buffers before the step ends. Returns NULL (after reporting) on any
 * failure. */
static inline adt_exec *fixture_setup(const fixture_model *m, const adt_st_file *f, const adt_optim_cfg *opt,
                                      adt_graph **gout, adt_model_io *io) {
    *gout = NULL;
    adt_graph *g = adt_graph_create();
    int failed = m->build(g, f, io, m->ctx);
    if (!failed && !adt_graph_error(g)) adt_graph_backward(g, io->loss);
    if (!failed && !adt_graph_error(g)) {
        adt_graph_mark_output(g, io->logits);
        adt_graph_mark_output(g, io->loss);
        for (int v = 0; v < g->n_values; v++)
            if (g->values[v].role == ADT_ROLE_PARAM && g->values[v].grad >= 0) adt_graph_mark_output(g, g->values[v].grad);
    }
    if (!failed && opt && !adt_graph_error(g)) adt_graph_optimizer(g, opt);
    CHECK(!failed && !adt_graph_error(g), "building %s: %s", m->label,
          adt_graph_error(g) ? adt_graph_error_message(g) : adt_error_message());
    adt_exec *ex = NULL;
    if (!failed && !adt_graph_error(g)) {
        adt_exec_opts eo = {.threads = 1};
        int rc = adt_exec_create(&ex, g, &eo);
        CHECK(rc == ADT_OK, "executor: %s", adt_error_message());
    }
    if (ex && load_fixture(ex, g, f, m->feeds, m->nfeeds)) {
        adt_exec_free(ex);
        ex = NULL;
    }
    if (!ex) {
        adt_graph_free(g);
        return NULL;
    }
    *gout = g;
    return ex;
}

/* One step without an optimizer: logits and loss ("expect.logits", "expect.loss") and the
 * gradient of every parameter, each within `tol`. */
static inline void fixture_check_step(const fixture_model *m, double tol) {
    adt_st_file *f = open_fixture(m->path);
    if (!f) return;
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex = fixture_setup(m, f, NULL, &g, &io);
    if (!ex) {
        adt_st_close(f);
        return;
    }
    adt_exec_run(ex); /* no optimizer in this graph: forward and backward only */
    worst w = {0, ""}, wg = {0, ""};
    compare_value(&w, ex, g, io.logits, f, "expect.logits", tol);
    compare_value(&w, ex, g, io.loss, f, "expect.loss", tol);
    int nparams = compare_gradients(&wg, ex, g, f, tol);
    printf("%s step: logits/loss worst %.2e (%s); gradients of %d parameters worst %.2e (%s)\n", m->label, w.err,
           w.what, nparams, wg.err, wg.what);
    adt_exec_free(ex);
    adt_graph_free(g);
    adt_st_close(f);
}

/* Steps with optimizer `opt` at learning rate lr, as many as the reference trajectory `ref_loss`
 * holds; compares the loss before each update with it (relative error within loss_tol) and
 * requires the loss to fall. Then every fixture tensor named "<final_prefix><param>" (at least
 * one when final_prefix is given) against that parameter after the last update (weight_tol). */
static inline void fixture_check_trajectory(const fixture_model *m, const char *label, const adt_optim_cfg *opt,
                                            float lr, const char *ref_loss, double loss_tol,
                                            const char *final_prefix, double weight_tol) {
    adt_st_file *f = open_fixture(m->path);
    if (!f) return;
    const adt_st_tensor *t = adt_st_find(f, ref_loss);
    CHECK(t && t->ndim == 1 && t->shape[0] >= 2 && t->shape[0] <= 100,
          "%s has no trajectory '%s' of 2 to 100 losses", adt_st_name(f), ref_loss);
    adt_graph *g = NULL;
    adt_model_io io;
    adt_exec *ex = t && t->ndim == 1 && t->shape[0] >= 2 && t->shape[0] <= 100 ? fixture_setup(m, f, opt, &g, &io) : NULL;
    if (!ex) {
        adt_st_close(f);
        return;
    }
    int steps = (int)t->shape[0];
    float want[100], got[100];
    int64_t dims[1] = {steps};
    int rc = adt_st_read_f32(f, ref_loss, want, 1, dims);
    CHECK(rc == ADT_OK, "reference trajectory: %s", adt_error_message());
    for (int k = 0; k < steps; k++) {
        adt_exec_set_lr_step(ex, lr, k + 1);
        adt_exec_run(ex);
        got[k] = *(const float *)adt_exec_data(ex, io.loss); /* computed before this step's update */
    }
    double worst_loss = 0;
    int worst_k = 0;
    for (int k = 0; rc == ADT_OK && k < steps; k++) {
        double err = fabs((double)got[k] - (double)want[k]) / fabs((double)want[k]);
        if (err != err) err = INFINITY; /* a NaN loss is the worst possible and must fail */
        if (err > worst_loss) {
            worst_loss = err;
            worst_k = k;
        }
        CHECK(err <= loss_tol, "%s %s: loss before update %d: adtrain %.9g, torch %.9g, rel err %.3e > %.0e", m->label,
              label, k + 1, got[k], want[k], err, loss_tol);
    }
    CHECK(rc != ADT_OK || got[steps - 1] < got[0], "%s %s: the loss did not decrease (%.6f -> %.6f)", m->label, label,
          got[0], got[steps - 1]);
    worst wf = {0, ""};
    int nfinals = 0;
    size_t plen = final_prefix ? strlen(final_prefix) : 0;
    for (int i = 0; final_prefix && i < adt_st_count(f); i++) {
        const char *name = adt_st_get(f, i)->name;
        if (strncmp(name, final_prefix, plen)) continue;
        int v = adt_graph_find_value(g, name + plen);
        CHECK(v >= 0 && g->values[v].role == ADT_ROLE_PARAM, "%s holds '%s', but the model has no parameter '%s'",
              adt_st_name(f), name, name + plen);
        if (v < 0 || g->values[v].role != ADT_ROLE_PARAM) continue;
        compare_value(&wf, ex, g, v, f, name, weight_tol); /* persistent: updated in place */
        nfinals++;
    }
    CHECK(!final_prefix || nfinals > 0, "%s holds no final weights '%s*'", adt_st_name(f), final_prefix);
    printf("%s %s: %d losses %.6f -> %.6f, worst rel err %.2e (update %d)", m->label, label, steps, got[0],
           got[steps - 1], worst_loss, worst_k + 1);
    if (nfinals) printf("; %d final weights worst %.2e (%s)", nfinals, wf.err, wf.what);
    printf("\n");
    adt_exec_free(ex);
    adt_graph_free(g);
    adt_st_close(f);
}

#endif
