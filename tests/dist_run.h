/*
 * dist_run.h - runs a plan the way a cluster would, in one process: the global training graph is
 * partitioned for every mesh coordinate, each rank's local graph runs in its own thread, and the
 * BOXING nodes meet in an in-memory communicator (a barrier and adt_boxing_step_local, the same
 * rule as adt_boxing_run_virtual). The serial run of the global graph is the reference: after
 * each step the loss and every parameter and optimizer state, gathered from the ranks (partial
 * sums added up), must equal it. Include after check.h.
 */
#ifndef ADTRAIN_TESTS_DIST_RUN_H
#define ADTRAIN_TESTS_DIST_RUN_H

#include <pthread.h>
#include <stdint.h>

#include "adtrain/adtrain.h"
#include "dist_check.h"

/* ---- an in-memory communicator: ranks are threads --------------------------------------------- */

typedef struct dr_comm {
    adt_mesh mesh;
    pthread_barrier_t bar;
    void *slot[64];
    int kinds[ADT_BOXING_KIND_COUNT]; /* steps run, by kind (rank 0 counts) */
} dr_comm;

typedef struct dr_rank {
    dr_comm *c;
    int rank, coord[ADT_MAX_MESH_DIMS];
    adt_comm_hook hook;
    adt_exec *ex;
    int err;
    char msg[512]; /* error messages are per thread: the rank keeps its own */
} dr_rank;

static int dr_comm_run(void *ctx, const adt_kctx *k) {
    dr_rank *r = ctx;
    dr_comm *c = r->c;
    adt_boxing_step st;
    int rc = adt_boxing_node_step(k->g, k->n, &c->mesh, &st);
    c->slot[r->rank] = k->in[0];
    pthread_barrier_wait(&c->bar); /* every rank's input is posted */
    if (!rc) {
        const void *group[64];
        int cj[ADT_MAX_MESH_DIMS];
        memcpy(cj, r->coord, sizeof cj);
        for (int j = 0; j < c->mesh.dim[st.mesh_axis]; j++) {
            cj[st.mesh_axis] = j;
            group[j] = c->slot[adt_mesh_index(&c->mesh, cj)];
        }
        const adt_value *x = &k->g->values[k->n->in[0]];
        rc = adt_boxing_step_local(&st, &c->mesh, r->coord, x->global_shape, x->dtype, group, k->out[0]);
        if (r->rank == 0) c->kinds[st.kind]++;
    }
    pthread_barrier_wait(&c->bar); /* every rank has read the others' inputs */
    if (rc && !r->err) {
        r->err = rc;
        snprintf(r->msg, sizeof r->msg, "%s", adt_error_message());
    }
    return rc;
}

static void *dr_rank_main(void *arg) {
    dr_rank *r = arg;
    adt_exec_run(r->ex);
    return NULL;
}

/* Largest error of global value v over all ranks, P groups summed first: |local - serial| /
 * (|serial| + max|serial|), or with `relative` plain |local - serial| / |serial|. */
static double dr_value_err(const adt_graph *g, int v, const float *ref, const adt_mesh *m, adt_dist_local *loc,
                           dr_rank *rk, int relative) {
    const adt_value *val = &g->values[v];
    const adt_ndsbp *s = &loc[0].layout[v];
    unsigned pm = adt_ndsbp_partial_mask(s);
    int64_t gn = adt_shape_numel(&val->shape);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < gn; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0 || relative) scale = 0;
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        if (!dc_group_leader(m, pm, c)) continue;
        adt_box b = adt_ndsbp_block(s, m, c, val->shape);
        int64_t n = adt_shape_numel(&b.shape);
        double *acc = calloc((size_t)n, sizeof *acc);
        for (int q = 0; q < m->nranks; q++) {
            int cq[ADT_MAX_MESH_DIMS];
            adt_mesh_coord(m, q, cq);
            if (!dc_same_group(m, pm, c, cq)) continue;
            const float *x = adt_exec_data(rk[q].ex, loc[q].value[v]);
            for (int64_t e = 0; e < n; e++) acc[e] += x[e];
        }
        float *want = malloc((size_t)n * sizeof *want);
        dc_copy_block(want, ref, &b, 4);
        for (int64_t e = 0; e < n; e++) {
            double den = fabs(want[e]) + scale;
            double err = fabs(acc[e] - want[e]) / (den > 0 ? den : 1);
            if (!(err <= worst)) worst = err;
        }
        free(acc);
        free(want);
    }
    return worst;
}

/* ---- one plan against the serial run ---------------------------------------------------------- */

/* Fills feed[v] with a malloc'd global array for every fed leaf but lr and step (NULL else). */
typedef void (*dr_feed_fn)(void *ctx, const adt_graph *g, void **feed);

/* A dr_feed_fn's loop: allocates those arrays (4-byte elements) and lets fill(ctx, g, v, i, e)
 * write element i of value v to e. */
typedef void (*dr_fill_fn)(void *ctx, const adt_graph *g, int v, int64_t i, void *e);
static void dr_feed_fill(const adt_graph *g, void **feed, dr_fill_fn fill, void *ctx) {
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        feed[v] = NULL;
        if (!adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input) continue;
        int64_t n = adt_shape_numel(&val->shape);
        feed[v] = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) fill(ctx, g, v, i, (char *)feed[v] + 4 * i);
    }
}

typedef struct dr_opts {
    int steps;
    float lr;
    double tol;      /* parameters and optimizer state: dr_value_err's scaled error */
    double loss_tol; /* the loss: relative */
    uint64_t seed;
} dr_opts;

typedef struct dr_stats {
    int plans, steps_checked, boxing_nodes, worst_plan_boxing;
    int kinds[ADT_BOXING_KIND_COUNT];
    double worst, worst_loss;
} dr_stats;

/* Partitions g under `plan` for every coordinate, runs o->steps training steps on the ranks and
 * serially with the same data, and CHECKs the loss and all persistent state after each step.
 * Returns 1 when everything ran and matched. */
static int dr_run_plan(const adt_graph *g, const adt_dist_plan *plan, dr_feed_fn feed_fn, void *feed_ctx,
                       const dr_opts *o, dr_stats *rs, const char *what) {
    const adt_mesh *m = &plan->mesh;
    adt_dist_local *loc = calloc((size_t)m->nranks, sizeof *loc);
    dr_comm *vc = calloc(1, sizeof *vc);
    vc->mesh = *m;
    pthread_barrier_init(&vc->bar, NULL, (unsigned)m->nranks);
    dr_rank *rk = calloc((size_t)m->nranks, sizeof *rk);
    int ok = 1, all_ok = 1;
    for (int r = 0; r < m->nranks && ok; r++) {
        rk[r].c = vc;
        rk[r].rank = r;
        adt_mesh_coord(m, r, rk[r].coord);
        rk[r].hook = (adt_comm_hook){.run = dr_comm_run, .ctx = &rk[r]};
        int rc = adt_dist_partition(g, plan, rk[r].coord, &loc[r]);
        CHECK(rc == ADT_OK, "%s: partition for rank %d: %s", what, r, adt_error_message());
        if (rc) {
            ok = 0;
            break;
        }
        adt_exec_opts eo = {.threads = 1, .seed = o->seed, .comm = &rk[r].hook};
        rc = adt_exec_create(&rk[r].ex, loc[r].g, &eo);
        CHECK(rc == ADT_OK, "%s: executor for rank %d: %s", what, r, adt_error_message());
        if (rc) ok = 0;
        else adt_exec_init_params(rk[r].ex);
    }
    /* every rank built the same node sequence (SPMD) */
    for (int r = 1; r < m->nranks && ok; r++) {
        int same = loc[r].g->n_nodes == loc[0].g->n_nodes;
        for (int i = 0; same && i < loc[0].g->n_nodes; i++) same = loc[r].g->nodes[i].op == loc[0].g->nodes[i].op;
        CHECK(same, "%s: rank %d's local graph differs in structure from rank 0's", what, r);
        ok &= same;
    }
    adt_exec *serial = NULL;
    adt_exec_opts so = {.threads = 1, .seed = o->seed};
    adt_exec_create(&serial, g, &so);
    adt_exec_init_params(serial);
    double worst = 0, worst_loss = 0;
    for (int step = 1; step <= o->steps && ok; step++) {
        void **feed = calloc((size_t)g->n_values, sizeof *feed);
        feed_fn(feed_ctx, g, feed);
        adt_exec_set_lr_step(serial, o->lr, step);
        for (int v = 0; v < g->n_values; v++)
            if (feed[v]) memcpy(adt_exec_data(serial, v), feed[v], (size_t)adt_value_bytes(g, v));
        adt_exec_run(serial);
        for (int r = 0; r < m->nranks; r++) {
            adt_exec_set_lr_step(rk[r].ex, o->lr, step);
            for (int v = 0; v < g->n_values; v++) {
                if (!feed[v]) continue;
                adt_box b = adt_ndsbp_block(&loc[r].layout[v], m, rk[r].coord, g->values[v].shape);
                dc_copy_block(adt_exec_data(rk[r].ex, loc[r].value[v]), feed[v], &b, 4);
            }
        }
        pthread_t th[64];
        for (int r = 0; r < m->nranks; r++) pthread_create(&th[r], NULL, dr_rank_main, &rk[r]);
        for (int r = 0; r < m->nranks; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < m->nranks; r++) {
            CHECK(rk[r].err == 0, "%s: rank %d communicator: %s", what, r, rk[r].msg);
            all_ok &= rk[r].err == 0;
        }
        /* the loss and all persistent state against the serial run */
        for (int v = 0; v < g->n_values; v++) {
            const adt_value *val = &g->values[v];
            if (v != g->loss && !adt_role_is_persistent(val->role)) continue;
            const float *ref = adt_exec_data(serial, v);
            double e = dr_value_err(g, v, ref, m, loc, rk, v == g->loss);
            double tol = v == g->loss ? o->loss_tol : o->tol;
            char lay[64];
            CHECK(e <= tol, "%s, step %d: '%s' (%s) differs from the serial run by %.3g (seed %llu)", what, step, val->name,
                  adt_ndsbp_str(&loc[0].layout[v], lay, sizeof lay), e, (unsigned long long)o->seed);
            all_ok &= e <= tol;
            if (v == g->loss) worst_loss = e > worst_loss ? e : worst_loss;
            else if (!(e <= worst)) worst = e;
        }
        for (int v = 0; v < g->n_values; v++) free(feed[v]);
        free(feed);
        rs->steps_checked++;
    }
    if (ok) {
        rs->plans++;
        rs->boxing_nodes += loc[0].n_boxing;
        if (loc[0].n_boxing > rs->worst_plan_boxing) rs->worst_plan_boxing = loc[0].n_boxing;
        for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) rs->kinds[k] += vc->kinds[k];
        if (!(worst <= rs->worst)) rs->worst = worst;
        if (!(worst_loss <= rs->worst_loss)) rs->worst_loss = worst_loss;
    }
    adt_exec_free(serial);
    for (int r = 0; r < m->nranks; r++) {
        adt_exec_free(rk[r].ex);
        adt_dist_local_free(&loc[r]);
    }
    pthread_barrier_destroy(&vc->bar);
    free(vc);
    free(rk);
    free(loc);
    return ok && all_ok;
}

#endif
