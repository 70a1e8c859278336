/*
 * serial_ref.h - the serial reference of the distributed tests: a training graph run on one
 * process by the plain executor for a few steps (its loss at each step and every persistent value
 * at the end, with the largest magnitude each reached on the way). Include after check.h.
 */
#ifndef ADTRAIN_TESTS_SERIAL_REF_H
#define ADTRAIN_TESTS_SERIAL_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/exec.h"

#define SERIAL_REF_MAX_STEPS 16

typedef struct reference {
    float loss[SERIAL_REF_MAX_STEPS];
    float **state; /* [n_values]: persistent values after the last step, else NULL */
    double *scale; /* [n_values]: max |x| of each persistent value over all steps: the floor of
                    * check_scaled_err_floor, as its updates rounded at that magnitude */
} reference;

/* Writes the data of fed value v of g at a step into buf. */
typedef void (*serial_feed_fn)(void *ctx, const adt_graph *g, int v, int step, void *buf);

static inline int serial_is_data(const adt_graph *g, int v) {
    return adt_role_is_fed(g->values[v].role) && v != g->lr_input && v != g->step_input;
}

/* `steps` steps of g at learning rate lr (1 thread, parameters from seed). */
static inline int serial_ref_run(const adt_graph *g, int steps, float lr, uint64_t seed, serial_feed_fn feed, void *ctx,
                                 reference *ref) {
    adt_exec *ex;
    if (steps > SERIAL_REF_MAX_STEPS || adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = seed})) return -1;
    adt_exec_init_params(ex);
    ref->scale = calloc((size_t)g->n_values, sizeof *ref->scale);
    for (int step = 1; step <= steps; step++) {
        adt_exec_set_lr_step(ex, lr, step);
        for (int v = 0; v < g->n_values; v++)
            if (serial_is_data(g, v)) feed(ctx, g, v, step, adt_exec_data(ex, v));
        adt_exec_run(ex);
        ref->loss[step - 1] = *(float *)adt_exec_data(ex, g->loss);
        for (int v = 0; v < g->n_values; v++)
            if (adt_role_is_persistent(g->values[v].role))
                ref->scale[v] = fmax(ref->scale[v], check_max_abs(adt_exec_data(ex, v), adt_value_numel(g, v)));
    }
    ref->state = calloc((size_t)g->n_values, sizeof *ref->state);
    for (int v = 0; v < g->n_values; v++) {
        if (!adt_role_is_persistent(g->values[v].role)) continue;
        size_t bytes = (size_t)adt_value_bytes(g, v);
        ref->state[v] = malloc(bytes);
        memcpy(ref->state[v], adt_exec_data(ex, v), bytes);
    }
    adt_exec_free(ex);
    return 0;
}

static inline void serial_ref_free(const adt_graph *g, reference *ref) {
    for (int v = 0; v < g->n_values && ref->state; v++) free(ref->state[v]);
    free(ref->state);
    free(ref->scale);
    ref->state = NULL;
    ref->scale = NULL;
}

#endif
