/*
 * test_dist_partition.c - the partitioner end to end: a whole training graph (MLP with AdamW,
 * GPT with dropout and SGD) under random plans on meshes (2), (3), (2,2), (2,3) is cut into
 * one local graph per rank; the ranks run as threads whose BOXING nodes meet in an in-memory
 * communicator (a barrier and adt_boxing_step_local, the same rule as adt_boxing_run_virtual);
 * after each training step the loss and every parameter and optimizer state, gathered from the
 * ranks, must equal the serial run's.
 *
 * A random plan picks, for every node, any n-D signature usable on the mesh, so it mixes data,
 * tensor and ZeRO-like layouts with silly ones; the boxing between them is what makes it right.
 */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "dist_check.h"

static uint64_t g_seed;
static uint64_t g_ctr;
static int irand(int lo, int hi) { return lo + (int)(adt_rng_u32(g_seed, g_ctr++) % (uint32_t)(hi - lo + 1)); }
static float urand(float lo, float hi) { return lo + (hi - lo) * adt_rng_uniform(g_seed, g_ctr++); }

/* ---- an in-memory communicator: ranks are threads --------------------------------------------- */

typedef struct vcomm {
    adt_mesh mesh;
    pthread_barrier_t bar;
    void *slot[64];
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

static int vcomm_run(void *ctx, const adt_kctx *k) {
    vrank *r = ctx;
    vcomm *c = r->c;
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

static void *rank_main(void *arg) {
    vrank *r = arg;
    adt_exec_run(r->ex);
    return NULL;
}

/* ---- models and data ----------------------------------------------------------------------------- */

typedef struct model {
    const char *name;
    adt_graph *g;
    adt_model_io io;
    int vocab; /* > 0: the input is token ids */
} model;

static void build_mlp(model *m) {
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

static void build_gpt(model *m) {
    m->name = "gpt";
    m->g = adt_graph_create();
    adt_gpt_cfg c = {.vocab_size = 13, .n_ctx = 6, .n_layer = 1, .n_embd = 12, .n_head = 3, .dropout = 0.2f};
    adt_model_gpt(m->g, &c, 3, &m->io);
    adt_graph_backward(m->g, m->io.loss);
    adt_optim_cfg oc = adt_optim_sgd(0.9f, 0.01f);
    adt_graph_optimizer(m->g, &oc);
    m->vocab = 13;
}

/* Fed data of one step: global arrays for every fed leaf (lr and step set separately). */
static void make_feed(const model *m, void **feed) {
    const adt_graph *g = m->g;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        feed[v] = NULL;
        if (!adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input) continue;
        int64_t n = adt_shape_numel(&val->shape);
        feed[v] = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {
            if (val->dtype == ADT_I32) {
                int hi = m->vocab ? m->vocab : g->values[m->io.logits].shape.dim[g->values[m->io.logits].shape.ndim - 1];
                ((int32_t *)feed[v])[i] = irand(0, hi - 1);
            } else {
                ((float *)feed[v])[i] = urand(-1, 1);
            }
        }
    }
}

/* Largest |local - serial| / (|serial| + max|serial|) of global value v over all ranks, P
 * groups summed first. */
static double value_err(const adt_graph *g, int v, const float *ref, const adt_mesh *m, adt_dist_local *loc, vrank *rk) {
    const adt_value *val = &g->values[v];
    const adt_ndsbp *s = &loc[0].layout[v];
    unsigned pm = adt_ndsbp_partial_mask(s);
    int64_t gn = adt_shape_numel(&val->shape);
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < gn; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0) scale = 1;
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
            double err = fabs(acc[e] - want[e]) / (fabs(want[e]) + scale);
            if (!(err <= worst)) worst = err;
        }
        free(acc);
        free(want);
    }
    return worst;
}

/* ---- one plan ------------------------------------------------------------------------------------ */

/* A plan with a random usable signature per node (choice 0, all-B, when random == 0). */
static adt_nd_sig *random_plan(const adt_graph *g, const adt_mesh *m, int random) {
    adt_nd_sig *sig = calloc((size_t)g->n_nodes, sizeof *sig);
    for (int i = 0; i < g->n_nodes; i++) {
        int n = adt_node_nd_sigs(g, i, m, NULL, 0);
        adt_nd_sig *all = calloc((size_t)n, sizeof *all);
        adt_node_nd_sigs(g, i, m, all, n);
        sig[i] = all[random ? irand(0, n - 1) : 0];
        free(all);
    }
    return sig;
}

typedef struct run_stats {
    int plans, steps_checked, boxing_nodes, worst_plan_boxing;
    int kinds[ADT_BOXING_KIND_COUNT];
    double worst;
} run_stats;

#define STEPS 3
#define TOL 2e-5

static void run_plan(const model *md, const adt_mesh *m, const adt_nd_sig *sig, run_stats *rs, const char *what) {
    const adt_graph *g = md->g;
    adt_dist_plan plan = {.mesh = *m, .node_sig = sig, .cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12}};
    adt_dist_local *loc = calloc((size_t)m->nranks, sizeof *loc);
    vcomm *vc = calloc(1, sizeof *vc);
    vc->mesh = *m;
    pthread_barrier_init(&vc->bar, NULL, (unsigned)m->nranks);
    vrank *rk = calloc((size_t)m->nranks, sizeof *rk);
    int ok = 1;
    for (int r = 0; r < m->nranks && ok; r++) {
        rk[r].c = vc;
        rk[r].rank = r;
        adt_mesh_coord(m, r, rk[r].coord);
        rk[r].hook = (adt_comm_hook){.run = vcomm_run, .ctx = &rk[r]};
        int rc = adt_dist_partition(g, &plan, rk[r].coord, &loc[r]);
        CHECK(rc == ADT_OK, "%s: partition for rank %d: %s", what, r, adt_error_message());
        if (rc) {
            ok = 0;
            break;
        }
        adt_exec_opts o = {.threads = 1, .seed = g_seed, .comm = &rk[r].hook};
        rc = adt_exec_create(&rk[r].ex, loc[r].g, &o);
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
    adt_exec_opts so = {.threads = 1, .seed = g_seed};
    adt_exec_create(&serial, g, &so);
    adt_exec_init_params(serial);
    double worst = 0;
    for (int step = 1; step <= STEPS && ok; step++) {
        void **feed = calloc((size_t)g->n_values, sizeof *feed);
        make_feed(md, feed);
        float lr = 0.05f;
        adt_exec_set_lr_step(serial, lr, step);
        for (int v = 0; v < g->n_values; v++)
            if (feed[v]) memcpy(adt_exec_data(serial, v), feed[v], (size_t)adt_value_bytes(g, v));
        adt_exec_run(serial);
        for (int r = 0; r < m->nranks; r++) {
            adt_exec_set_lr_step(rk[r].ex, lr, step);
            for (int v = 0; v < g->n_values; v++) {
                if (!feed[v]) continue;
                adt_box b = adt_ndsbp_block(&loc[r].layout[v], m, rk[r].coord, g->values[v].shape);
                dc_copy_block(adt_exec_data(rk[r].ex, loc[r].value[v]), feed[v], &b, 4);
            }
        }
        pthread_t th[64];
        for (int r = 0; r < m->nranks; r++) pthread_create(&th[r], NULL, rank_main, &rk[r]);
        for (int r = 0; r < m->nranks; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < m->nranks; r++) CHECK(rk[r].err == 0, "%s: rank %d communicator: %s", what, r, rk[r].msg);
        /* the loss and all persistent state against the serial run */
        for (int v = 0; v < g->n_values; v++) {
            const adt_value *val = &g->values[v];
            if (v != g->loss && !adt_role_is_persistent(val->role)) continue;
            double e = value_err(g, v, adt_exec_data(serial, v), m, loc, rk);
            char lay[64];
            CHECK(e <= TOL, "%s, step %d: '%s' (%s) differs from the serial run by %.3g (seed %llu)", what, step, val->name,
                  adt_ndsbp_str(&loc[0].layout[v], lay, sizeof lay), e, (unsigned long long)g_seed);
            if (!(e <= worst)) worst = e;
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
}

static void test_random_plans(void) {
    static const int meshes[][4] = {{1, 2}, {1, 3}, {2, 2, 2}, {2, 2, 3}};
    run_stats rs = {0};
    void (*builders[])(model *) = {build_mlp, build_gpt};
    for (int b = 0; b < 2; b++) {
        model md;
        builders[b](&md);
        CHECK(!adt_graph_error(md.g), "%s: %s", md.name, adt_graph_error_message(md.g));
        for (size_t mi = 0; mi < sizeof meshes / sizeof meshes[0]; mi++) {
            adt_mesh m;
            adt_mesh_init(&m, meshes[mi][0], &meshes[mi][1]);
            int plans = b == 0 ? 24 : 12;
            for (int p = 0; p <= plans; p++) {
                adt_nd_sig *sig = random_plan(md.g, &m, p);
                char what[96], mb[32];
                snprintf(what, sizeof what, "%s on %s, %s plan %d", md.name, adt_mesh_str(&m, mb, sizeof mb),
                         p ? "random" : "all-B", p);
                run_plan(&md, &m, sig, &rs, what);
                free(sig);
            }
        }
        adt_graph_free(md.g);
    }
    printf("partition: %d plans, %d training steps compared with the serial run, worst error %.2e\n", rs.plans,
           rs.steps_checked, rs.worst);
    printf("  %d boxing nodes per rank over all plans (at most %d in one); steps run by kind:", rs.boxing_nodes,
           rs.worst_plan_boxing);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) printf(" %s %d", adt_boxing_kind_name(k), rs.kinds[k]);
    printf("\n");
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        CHECK(rs.kinds[k] > 0, "no plan ran a %s step", adt_boxing_kind_name(k));
}

/* Plans that cannot work are refused with a message naming the value and the layouts. */
static void test_plan_errors(void) {
    model md;
    build_mlp(&md);
    adt_mesh m;
    adt_mesh_init(&m, 1, (int[]){2});
    adt_nd_sig *sig = random_plan(md.g, &m, 0);
    adt_ndsbp *leaf = calloc((size_t)md.g->n_values, sizeof *leaf);
    int w = adt_graph_find_value(md.g, "layers.0.weight");
    CHECK(w >= 0, "no layers.0.weight");
    /* held split, updated whole (all-B plan): the in-place update would miss the stored state */
    adt_ndsbp_parse("S0", 1, 2, &leaf[w]);
    adt_dist_plan plan = {.mesh = m, .node_sig = sig, .leaf_sbp = leaf, .cost = {{1e-6}, {1e-9}, 0}};
    adt_dist_local loc;
    int rc = adt_dist_partition(md.g, &plan, (int[]){0}, &loc);
    CHECK(rc == ADT_ERR_ARG, "held S0, updated B accepted");
    CHECK(strstr(adt_error_message(), "updates 'layers.0.weight' in place as (B)") &&
              strstr(adt_error_message(), "held as (S(0))"),
          "%s", adt_error_message());
    /* a leaf may not be held as partial sums */
    adt_ndsbp_parse("P", 1, 2, &leaf[w]);
    rc = adt_dist_partition(md.g, &plan, (int[]){0}, &loc);
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "leaf 'layers.0.weight'"), "%s", adt_error_message());
    /* a signature that does not fit the mesh */
    leaf[w].ndim = 0;
    for (int i = 0; i < md.g->n_nodes; i++)
        if (md.g->nodes[i].op == ADT_OP_MATMUL) {
            sig[i].in[0].s[0] = (adt_sbp){ADT_SBP_S, 1};
            rc = adt_dist_partition(md.g, &plan, (int[]){0}, &loc);
            CHECK(rc == ADT_ERR_SHAPE && strstr(adt_error_message(), md.g->nodes[i].name), "%s", adt_error_message());
            break;
        }
    /* an executor without a communicator refuses a graph with boxing */
    free(sig);
    sig = random_plan(md.g, &m, 0);
    plan.node_sig = sig;
    for (int i = 0; i < md.g->n_nodes; i++) /* force the first matmul to read its input split */
        if (md.g->nodes[i].op == ADT_OP_MATMUL) {
            adt_sbp_sig s1[32];
            int n1 = adt_node_sbp_signatures(md.g, &md.g->nodes[i], s1, 32);
            adt_nd_sig_product(s1, (int[]){n1 > 1 ? 1 : 0}, 1, 2, 1, &sig[i]);
            break;
        }
    rc = adt_dist_partition(md.g, &plan, (int[]){0}, &loc);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (!rc) {
        CHECK(loc.n_boxing > 0, "no boxing inserted");
        /* parameters know their gradients, optimizer states their parameters, in local ids */
        int lw = loc.value[w], lm = loc.value[adt_graph_find_value(md.g, "opt.m.layers.0.weight")];
        CHECK(lw >= 0 && loc.g->values[lw].grad == loc.value[md.g->values[w].grad], "local gradient link");
        CHECK(lm >= 0 && loc.g->values[lm].param == lw, "local parameter link of the optimizer state");
        adt_exec *ex;
        rc = adt_exec_create(&ex, loc.g, &(adt_exec_opts){.threads = 1});
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "no communicator"), "%s", adt_error_message());
        adt_dist_local_free(&loc);
    }
    free(sig);
    free(leaf);
    adt_graph_free(md.g);
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_seed);
    RUN(test_random_plans);
    RUN(test_plan_errors);
    return check_finish();
}
