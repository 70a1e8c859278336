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
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "dist_world.h"

/* ---- one plan ------------------------------------------------------------------------------------ */

#define STEPS 3
#define TOL 2e-5

static void feed_model(void *ctx, const adt_graph *g, void **feed) { world_feed_fill(g, feed, model_fill, ctx); }

static void run_plan(const model *md, const adt_mesh *m, const adt_nd_sig *sig, world_check_stats *rs, const char *what) {
    adt_dist_plan plan = {.mesh = *m, .node_sig = sig, .cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12}};
    world_check_opts o = {.steps = STEPS, .lr = 0.05f, .tol = TOL, .loss_tol = TOL, .seed = g_seed};
    world_check_plan(md->g, &plan, feed_model, (void *)md, &o, rs, what);
}

static void test_random_plans(void) {
    static const int meshes[][4] = {{1, 2}, {1, 3}, {2, 2, 2}, {2, 2, 3}};
    world_check_stats rs = {0};
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

/* adt_dist_local.uneven (the planner partitions one coordinate when it is 0): 0 exactly where every
 * coordinate's local graph has the first one's value shapes, over random plans on meshes whose
 * axes of 3 split some tensors unevenly. */
static void test_uneven_flag(void) {
    static const int meshes[][4] = {{1, 2}, {1, 3}, {2, 2, 3}};
    int n_even = 0, n_uneven = 0;
    void (*builders[])(model *) = {build_mlp, build_gpt};
    for (int b = 0; b < 2; b++) {
        model md;
        builders[b](&md);
        for (size_t mi = 0; mi < sizeof meshes / sizeof meshes[0]; mi++) {
            adt_mesh m;
            adt_mesh_init(&m, meshes[mi][0], &meshes[mi][1]);
            for (int p = 0; p <= 12; p++) {
                adt_nd_sig *sig = random_plan(md.g, &m, p); /* 0: all-B, even */
                adt_dist_plan plan = {.mesh = m, .node_sig = sig, .cost = {{1e-6, 1e-6}, {1e-9, 1e-9}, 0}};
                adt_dist_local first;
                int coord[ADT_MAX_MESH_DIMS] = {0}, differs = 0;
                int rc = adt_dist_partition(md.g, &plan, coord, &first);
                CHECK(rc == ADT_OK, "%s plan %d: %s", md.name, p, adt_error_message());
                if (rc) {
                    free(sig);
                    continue;
                }
                for (int r = 1; r < m.nranks && !differs; r++) {
                    adt_dist_local loc;
                    adt_mesh_coord(&m, r, coord);
                    if (adt_dist_partition(md.g, &plan, coord, &loc)) break;
                    differs = loc.g->n_values != first.g->n_values;
                    for (int v = 0; v < loc.g->n_values && !differs; v++)
                        differs = !adt_shape_equal(&loc.g->values[v].shape, &first.g->values[v].shape);
                    adt_dist_local_free(&loc);
                }
                CHECK(first.uneven == differs, "%s plan %d on %d ranks: uneven %d, local shapes differ %d", md.name, p,
                      m.nranks, first.uneven, differs);
                differs ? n_uneven++ : n_even++;
                adt_dist_local_free(&first);
                free(sig);
            }
        }
        adt_graph_free(md.g);
    }
    printf("uneven flag: %d plans even, %d uneven, each matching its local graphs\n", n_even, n_uneven);
    CHECK(n_even > 0 && n_uneven > 0, "the plans cover both cases (%d even, %d uneven)", n_even, n_uneven);
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
    RUN(test_uneven_flag);
    RUN(test_plan_errors);
    return check_finish();
}
