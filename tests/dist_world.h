/*
 * dist_world.h - a partitioned training run inside one test process: ranks are threads whose
 * BOXING nodes meet in an in-memory communicator (a barrier and adt_boxing_step_local, the same
 * rule as adt_boxing_run_virtual), the two test models (an MLP with AdamW, a GPT with dropout
 * and SGD), random fed data, random plans (tests/plan_random.h), and the check of a plan
 * against the serial run. Used by the partitioner's, the expert plans' and the checkpoints'
 * tests; include after check.h.
 *
 *   world w;
 *   world_create(&w, g, &mesh, sig, seed, "what");   partition + one executor per rank
 *   world_feed(&w, feed, lr, step); world_run(&w, "what");
 *   world_gather(&w, v, out);                        the global value from the ranks' blocks
 *   world_check_plan(g, &plan, feed_fn, ctx, &opts, &stats, "what");
 *                                                    steps vs the serial run, CHECKed
 */
#ifndef ADTRAIN_TESTS_DIST_WORLD_H
#define ADTRAIN_TESTS_DIST_WORLD_H

#include <pthread.h>
#include <stdint.h>

#include "adtrain/adtrain.h"
#include "dist_check.h"
#include "plan_random.h"

static uint64_t g_seed;
static uint64_t g_ctr;
static inline int irand(int lo, int hi) { return lo + (int)(adt_rng_u32(g_seed, g_ctr++) % (uint32_t)(hi - lo + 1)); }
static inline float urand(float lo, float hi) { return lo + (hi - lo) * adt_rng_uniform(g_seed, g_ctr++); }

/* ---- an in-memory communicator: ranks are threads ---------------------------------------------- */

#define WORLD_MAX_RANKS 64

typedef struct vcomm {
    adt_mesh mesh;
    pthread_barrier_t bar;
    void *slot[WORLD_MAX_RANKS];
    int kinds[ADT_BOXING_KIND_COUNT]; /* steps run, by kind (rank 0 counts) */
} vcomm;

typedef struct vrank {
    vcomm *c;
    int rank, coord[ADT_MAX_MESH_DIMS];
    adt_comm_hook hook;
    adt_exec *ex;
    int err;
    char msg[512]; /* error messages are per thread: the rank keeps its own */
} vrank;

static inline int vcomm_run(void *ctx, const adt_kctx *k) {
    vrank *r = ctx;
    vcomm *c = r->c;
    adt_boxing_step st;
    int rc = adt_boxing_node_step(k->g, k->n, &c->mesh, &st);
    c->slot[r->rank] = k->in[0];
    pthread_barrier_wait(&c->bar); /* every rank's input is posted */
    if (!rc) {
        const void *group[WORLD_MAX_RANKS];
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

/* ---- models and data --------------------------------------------------------------------------- */

typedef struct model {
    const char *name;
    adt_graph *g;
    adt_model_io io;
    int vocab; /* > 0: the input is token ids */
} model;

static inline void build_mlp(model *m) {
    m->name = "mlp";
    m->g = adt_graph_create();
    adt_mlp_cfg c = {.n_sizes = 4, .sizes = {9, 11, 13, 5}, .activation = ADT_ACT_GELU};
    adt_model_mlp(m->g, &c, 7, &m->io);
    adt_graph_backward(m->g, m->io.loss);
    /* a large eps keeps AdamW's step linear in small gradients, whose rounding differs by layout */
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.95f, 0.1f, 0.01f);
    adt_graph_optimizer(m->g, &oc);
    m->vocab = 0;
}

static inline void build_gpt(model *m) {
    m->name = "gpt";
    m->g = adt_graph_create();
    adt_gpt_cfg c = {.vocab_size = 13, .n_ctx = 6, .n_layer = 1, .n_embd = 12, .n_head = 3, .dropout = 0.2f};
    adt_model_gpt(m->g, &c, 3, &m->io);
    adt_graph_backward(m->g, m->io.loss);
    adt_optim_cfg oc = adt_optim_sgd(0.9f, 0.01f);
    adt_graph_optimizer(m->g, &oc);
    m->vocab = 13;
}

/* Fills feed[v] with a malloc'd global array for every fed leaf but lr and step (NULL else). */
typedef void (*world_feed_fn)(void *ctx, const adt_graph *g, void **feed);

/* A world_feed_fn's loop: allocates those arrays (4-byte elements) and lets fill(ctx, g, v, i, e)
 * write element i of value v to e. */
typedef void (*world_fill_fn)(void *ctx, const adt_graph *g, int v, int64_t i, void *e);
static inline void world_feed_fill(const adt_graph *g, void **feed, world_fill_fn fill, void *ctx) {
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        feed[v] = NULL;
        if (!adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input) continue;
        int64_t n = adt_shape_numel(&val->shape);
        feed[v] = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) fill(ctx, g, v, i, (char *)feed[v] + 4 * i);
    }
}

/* Fed data of one step: global arrays for every fed leaf (lr and step set separately): token ids
 * or class labels for i32 values, U(-1, 1) else. */
static inline void model_fill(void *ctx, const adt_graph *g, int v, int64_t i, void *e) {
    const model *m = ctx;
    (void)i;
    if (g->values[v].dtype == ADT_I32) {
        const adt_shape *ls = &g->values[m->io.logits].shape;
        *(int32_t *)e = irand(0, (m->vocab ? m->vocab : (int)ls->dim[ls->ndim - 1]) - 1);
    } else {
        *(float *)e = urand(-1, 1);
    }
}

static inline void make_feed(const model *m, void **feed) { world_feed_fill(m->g, feed, model_fill, (void *)m); }

static inline void free_feed(const adt_graph *g, void **feed) {
    for (int v = 0; v < g->n_values; v++) free(feed[v]);
    free(feed);
}

/* A plan with a random usable signature per node (tests/plan_random.h; the seed drawn from
 * g_seed), or choice 0, all-B, when random == 0. */
static inline adt_nd_sig *random_plan(const adt_graph *g, const adt_mesh *m, int random) {
    if (random) {
        uint64_t hi = adt_rng_u32(g_seed, g_ctr++), lo = adt_rng_u32(g_seed, g_ctr++);
        return plan_random_sigs(g, m, hi << 32 | lo);
    }
    adt_nd_sig *sig = calloc((size_t)g->n_nodes, sizeof *sig);
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        sig[i] = adt_nd_sig_all_b(m->ndim, n->n_in, n->n_out);
    }
    return sig;
}

/* ---- a world: the partitioned run ---------------------------------------------------------------- */

typedef struct world {
    const adt_graph *g;
    adt_mesh mesh;
    adt_dist_local *loc; /* [nranks] */
    vcomm *vc;
    vrank *rk; /* [nranks] */
    int ok;    /* every rank partitioned and has an executor */
} world;

static inline void *world_rank_main(void *arg) {
    vrank *r = arg;
    adt_exec_run(r->ex);
    return NULL;
}

/* Partitions g under `plan` for every rank and creates the executors, parameters initialised
 * from `seed`. Failures are CHECKs; w->ok says whether the world is usable. */
static inline void world_create_plan(world *w, const adt_graph *g, const adt_dist_plan *plan, uint64_t seed,
                                     const char *what) {
    const adt_mesh *m = &plan->mesh;
    memset(w, 0, sizeof *w);
    w->g = g;
    w->mesh = *m;
    w->loc = calloc((size_t)m->nranks, sizeof *w->loc);
    w->vc = calloc(1, sizeof *w->vc);
    w->vc->mesh = *m;
    pthread_barrier_init(&w->vc->bar, NULL, (unsigned)m->nranks);
    w->rk = calloc((size_t)m->nranks, sizeof *w->rk);
    w->ok = m->nranks <= WORLD_MAX_RANKS;
    for (int r = 0; r < m->nranks && w->ok; r++) {
        vrank *k = &w->rk[r];
        k->c = w->vc;
        k->rank = r;
        adt_mesh_coord(m, r, k->coord);
        k->hook = (adt_comm_hook){.run = vcomm_run, .ctx = k};
        int rc = adt_dist_partition(g, plan, k->coord, &w->loc[r]);
        CHECK(rc == ADT_OK, "%s: partition for rank %d: %s", what, r, adt_error_message());
        if (rc) {
            w->ok = 0;
            break;
        }
        adt_exec_opts o = {.threads = 1, .seed = seed, .comm = &k->hook};
        rc = adt_exec_create(&k->ex, w->loc[r].g, &o);
        CHECK(rc == ADT_OK, "%s: executor for rank %d: %s", what, r, adt_error_message());
        if (rc) w->ok = 0;
        else adt_exec_init_params(k->ex);
    }
    /* every rank built the same node sequence (SPMD) */
    for (int r = 1; r < m->nranks && w->ok; r++) {
        int same = w->loc[r].g->n_nodes == w->loc[0].g->n_nodes;
        for (int i = 0; same && i < w->loc[0].g->n_nodes; i++) same = w->loc[r].g->nodes[i].op == w->loc[0].g->nodes[i].op;
        CHECK(same, "%s: rank %d's local graph differs in structure from rank 0's", what, r);
        w->ok &= same;
    }
}

/* The same for signatures `sig` on mesh m (leaves in the partitioner's default layouts). */
static inline void world_create(world *w, const adt_graph *g, const adt_mesh *m, const adt_nd_sig *sig, uint64_t seed,
                                const char *what) {
    adt_dist_plan plan = {.mesh = *m, .node_sig = sig, .cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12}};
    world_create_plan(w, g, &plan, seed, what);
}

static inline void world_free(world *w) {
    for (int r = 0; r < w->mesh.nranks; r++) {
        adt_exec_free(w->rk[r].ex);
        adt_dist_local_free(&w->loc[r]);
    }
    pthread_barrier_destroy(&w->vc->bar);
    free(w->vc);
    free(w->rk);
    free(w->loc);
    memset(w, 0, sizeof *w);
}

/* Each rank's block of every fed global array, and lr and step. */
static inline void world_feed(world *w, void *const *feed, float lr, int step) {
    const adt_graph *g = w->g;
    for (int r = 0; r < w->mesh.nranks; r++) {
        adt_exec_set_lr_step(w->rk[r].ex, lr, step);
        for (int v = 0; v < g->n_values; v++) {
            if (!feed[v]) continue;
            adt_box b = adt_ndsbp_block(&w->loc[r].layout[v], &w->mesh, w->rk[r].coord, g->values[v].shape);
            dc_copy_block(adt_exec_data(w->rk[r].ex, w->loc[r].value[v]), feed[v], &b, 4);
        }
    }
}

/* One training step on every rank; returns 0 when no rank's communicator failed. */
static inline int world_run(world *w, const char *what) {
    pthread_t th[WORLD_MAX_RANKS];
    for (int r = 0; r < w->mesh.nranks; r++) pthread_create(&th[r], NULL, world_rank_main, &w->rk[r]);
    for (int r = 0; r < w->mesh.nranks; r++) pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < w->mesh.nranks; r++) {
        CHECK(w->rk[r].err == 0, "%s: rank %d communicator: %s", what, r, w->rk[r].msg);
        bad |= w->rk[r].err;
    }
    return bad;
}

/* The global f32 value v assembled from the ranks' blocks (the blocks of a P group summed in
 * rank order, so two identical worlds give identical bits). */
static inline void world_gather(const world *w, int v, float *out) {
    const adt_mesh *m = &w->mesh;
    const adt_ndsbp *s = &w->loc[0].layout[v];
    unsigned pm = adt_ndsbp_partial_mask(s);
    const adt_shape *gs = &w->g->values[v].shape;
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        if (!dc_group_leader(m, pm, c)) continue;
        adt_box b = adt_ndsbp_block(s, m, c, *gs);
        int64_t n = adt_shape_numel(&b.shape);
        int first = 1;
        for (int q = 0; q < m->nranks; q++) {
            int cq[ADT_MAX_MESH_DIMS];
            adt_mesh_coord(m, q, cq);
            if (!dc_same_group(m, pm, c, cq)) continue;
            const float *x = adt_exec_data(w->rk[q].ex, w->loc[q].value[v]);
            for (int64_t e = 0; e < n; e++) {
                float *o = &out[dc_global_index(&b, e)];
                *o = first ? x[e] : *o + x[e];
            }
            first = 0;
        }
    }
}

/* ---- one plan against the serial run ----------------------------------------------------------- */

typedef struct world_check_opts {
    int steps;
    float lr;
    double tol;      /* parameters and optimizer state: check_scaled_err_floor over the steps so far */
    double loss_tol; /* the loss: relative */
    uint64_t seed;
} world_check_opts;

typedef struct world_check_stats {
    int plans, steps_checked, boxing_nodes, worst_plan_boxing;
    int kinds[ADT_BOXING_KIND_COUNT];
    double worst, worst_loss;
} world_check_stats;

/* Largest error of x against ref over n elements: check_scaled_err_floor at `scale`, or with
 * `relative` plain |x - ref| / |ref|. */
static inline double world_err(const float *x, const float *ref, int64_t n, int relative, double scale) {
    if (!relative) return check_scaled_err_floor(x, ref, (long)n, scale);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]) / (ref[i] != 0 ? fabs(ref[i]) : 1);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* Partitions g under `plan` for every coordinate, runs o->steps training steps on the ranks and
 * serially with the same data, and CHECKs the loss and all persistent state (gathered from the
 * ranks) after each step. Returns 1 when everything ran and matched. */
static inline int world_check_plan(const adt_graph *g, const adt_dist_plan *plan, world_feed_fn feed_fn, void *feed_ctx,
                                   const world_check_opts *o, world_check_stats *rs, const char *what) {
    world w;
    world_create_plan(&w, g, plan, o->seed, what);
    int ok = w.ok, all_ok = 1;
    adt_exec *serial = NULL;
    adt_exec_opts so = {.threads = 1, .seed = o->seed};
    adt_exec_create(&serial, g, &so);
    adt_exec_init_params(serial);
    float *got = NULL;
    size_t cap = 0;
    double worst = 0, worst_loss = 0;
    double *scale = calloc((size_t)g->n_values, sizeof *scale); /* max |x| of the serial run so far */
    for (int step = 1; step <= o->steps && ok; step++) {
        void **feed = calloc((size_t)g->n_values, sizeof *feed);
        feed_fn(feed_ctx, g, feed);
        adt_exec_set_lr_step(serial, o->lr, step);
        for (int v = 0; v < g->n_values; v++)
            if (feed[v]) memcpy(adt_exec_data(serial, v), feed[v], (size_t)adt_value_bytes(g, v));
        adt_exec_run(serial);
        world_feed(&w, feed, o->lr, step);
        all_ok &= world_run(&w, what) == 0;
        for (int v = 0; v < g->n_values; v++) {
            const adt_value *val = &g->values[v];
            if (v != g->loss && !adt_role_is_persistent(val->role)) continue;
            size_t bytes = (size_t)adt_value_bytes(g, v);
            if (bytes > cap) got = realloc(got, cap = bytes);
            world_gather(&w, v, got);
            const float *ref = adt_exec_data(serial, v);
            int64_t n = adt_shape_numel(&val->shape);
            scale[v] = fmax(scale[v], check_max_abs(ref, (long)n));
            double e = world_err(got, ref, n, v == g->loss, scale[v]);
            double tol = v == g->loss ? o->loss_tol : o->tol;
            char lay[64];
            CHECK(e <= tol, "%s, step %d: '%s' (%s) differs from the serial run by %.3g (seed %llu)", what, step, val->name,
                  adt_ndsbp_str(&w.loc[0].layout[v], lay, sizeof lay), e, (unsigned long long)o->seed);
            all_ok &= e <= tol;
            if (v == g->loss) worst_loss = e > worst_loss ? e : worst_loss;
            else if (!(e <= worst)) worst = e;
        }
        free_feed(g, feed);
        rs->steps_checked++;
    }
    if (ok) {
        rs->plans++;
        rs->boxing_nodes += w.loc[0].n_boxing;
        if (w.loc[0].n_boxing > rs->worst_plan_boxing) rs->worst_plan_boxing = w.loc[0].n_boxing;
        for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) rs->kinds[k] += w.vc->kinds[k];
        if (!(worst <= rs->worst)) rs->worst = worst;
        if (!(worst_loss <= rs->worst_loss)) rs->worst_loss = worst_loss;
    }
    free(got);
    free(scale);
    adt_exec_free(serial);
    world_free(&w);
    return ok && all_ok;
}

#endif
