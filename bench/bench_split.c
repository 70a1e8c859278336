/*
 * bench_split.c - what changing a batch split between steps costs (adt_dist_rebuild: a rank's
 * local graph, communicators and executor made again, parameters and optimizer state carried),
 * against the training step it interrupts.
 *
 *   mpiexec -n N build/bench/bench_split [--model configs/gpt-s.json] [--batch 32] [--rounds 11]
 *                                        [--steps 4] [--strategy dp|dp,zero]
 *
 * The data-parallel expert plan of the model over N ranks, with a batch split. Each round runs
 * `steps` training steps at the current split (their median is the round's step time), then one
 * rebuild to the other split, the two splits in turn: the even one, and the skewed one that gives
 * the first replica a quarter of its even share (what a straggler policy does to a slow rank).
 * Each timed call starts after a barrier and ends when the slowest rank is done (an all-reduce
 * of the ranks' times, max). Rank 0 prints one JSON line: the rebuild and the step times at each
 * split (median, min, max over rounds) and the rebuild in steps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/dist.h"
#include "adtrain/exec.h"
#include "bench_stats.h"

typedef struct opts {
    const char *model, *strategy;
    int batch, rounds, steps;
} opts;

static double slowest(adt_comm *w, double t) {
    int n = adt_comm_size(w);
    double *all = calloc((size_t)n, sizeof *all), x = 0;
    all[adt_comm_rank(w)] = t;
    adt_comm_allreduce_f64(w, all, n);
    for (int i = 0; i < n; i++) x = all[i] > x ? all[i] : x;
    free(all);
    return x;
}

static void feed(const adt_graph *g, const adt_dist_local *loc, adt_exec *ex, const adt_mesh *m, const int *coord,
                 int step, int vocab) {
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (!adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input || loc->value[v] < 0) continue;
        adt_box b = adt_ndsbp_block(&loc->layout[v], m, coord, val->shape);
        int64_t n = adt_shape_numel(&b.shape);
        void *d = adt_exec_data(ex, loc->value[v]);
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = adt_rng_u32((uint64_t)step, (uint64_t)(i + b.offset[0]));
            if (val->dtype == ADT_I32) ((int32_t *)d)[i] = (int32_t)(u % (uint32_t)vocab);
            else ((float *)d)[i] = (float)(u & 1);
        }
    }
}

static void print_ms(const char *name, double *t, int n, int comma) {
    stat_us s = summarise(t, n);
    printf("\"%s\": {\"n\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f}%s", name, n, s.median / 1e3,
           1e3 * t[0], s.max / 1e3, comma ? ", " : "");
}

int main(int argc, char **argv) {
    opts o = {.model = "configs/gpt-s.json", .strategy = "dp", .batch = 32, .rounds = 11, .steps = 4};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) o.model = argv[i + 1];
        else if (!strcmp(argv[i], "--strategy")) o.strategy = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) o.batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) o.rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) o.steps = atoi(argv[i + 1]);
        else return fprintf(stderr, "bench_split: unknown flag %s\n", argv[i]), 2;
    }
    adt_comm *w = NULL;
    if (adt_comm_init(adt_comm_launched() ? ADT_COMM_MPI : ADT_COMM_SELF, &w))
        return fprintf(stderr, "bench_split: %s\n", adt_error_message()), 1;
    int rank = adt_comm_rank(w), n = adt_comm_size(w), rc;
    adt_model_cfg cfg;
    adt_model_io io;
    adt_graph *g = adt_graph_create();
    adt_plan p;
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f);
    adt_expert_opts eo = {.strategy = o.strategy, .devices = n, .batch = o.batch};
    if ((rc = adt_model_cfg_load(&cfg, o.model)) || (rc = adt_model_build(g, &cfg, o.batch, &io)) ||
        (adt_graph_backward(g, io.loss), adt_graph_optimizer(g, &oc), rc = adt_graph_error(g)) ||
        (rc = adt_expert_plan(g, &cfg, &eo, &p)))
        return fprintf(stderr, "bench_split: %s\n", adt_error_message()), 1;
    int *even = malloc((size_t)n * sizeof *even), *skew = malloc((size_t)n * sizeof *skew);
    for (int i = 0; i < n; i++) even[i] = o.batch / n + (i < o.batch % n), skew[i] = even[i];
    skew[0] = even[0] / 4 > 0 ? even[0] / 4 : 1; /* the first replica slowed down: its surplus to the others */
    for (int i = 1, left = even[0] - skew[0]; left > 0; i = i % (n - 1) + 1, left--) skew[i]++;
    int ranks[1024], stage, coord[ADT_MAX_MESH_DIMS];
    adt_dist_local loc;
    adt_mesh_comm *mc = NULL;
    adt_exec *ex = NULL;
    adt_exec_opts xo = {.threads = 1, .seed = 1};
    if ((rc = adt_plan_set_batch_split(&p, g, even, n)) || (rc = adt_plan_locate(&p, rank, &stage, coord)))
        return fprintf(stderr, "bench_split: %s\n", adt_error_message()), 1;
    adt_dist_plan d = adt_plan_dist(&p, 0, ranks);
    if ((rc = adt_dist_partition(g, &d, coord, &loc)) || (rc = adt_mesh_comm_create(&mc, w, &d.mesh)))
        return fprintf(stderr, "bench_split: %s\n", adt_error_message()), 1;
    xo.comm = adt_mesh_comm_hook(mc, loc.g);
    if ((rc = adt_exec_create(&ex, loc.g, &xo))) return fprintf(stderr, "bench_split: %s\n", adt_error_message()), 1;
    xo.comm = NULL;
    adt_exec_init_params(ex);
    double *rebuild = calloc((size_t)o.rounds, sizeof *rebuild), *step[2], *one = calloc((size_t)o.steps, sizeof *one);
    step[0] = calloc((size_t)o.rounds, sizeof(double)), step[1] = calloc((size_t)o.rounds, sizeof(double));
    int n_step[2] = {0, 0}, at = 0, k = 0, vocab = cfg.type == ADT_MODEL_GPT ? cfg.gpt.vocab_size : 2;
    for (int r = 0; r < o.rounds && !rc; r++) {
        for (int s = 0; s < o.steps && !rc; s++) {
            adt_exec_set_lr_step(ex, 1e-4f, ++k);
            feed(g, &loc, ex, adt_mesh_comm_mesh(mc), adt_mesh_comm_coord(mc), k, vocab);
            adt_comm_barrier(w);
            double t0 = adt_now_s();
            rc = adt_exec_run(ex);
            one[s] = slowest(w, adt_now_s() - t0);
        }
        summarise(one, o.steps);
        step[at][n_step[at]++] = one[o.steps / 2];
        at ^= 1;
        if (!rc) rc = adt_plan_set_batch_split(&p, g, at ? skew : even, n);
        d = adt_plan_dist(&p, 0, ranks);
        adt_comm_barrier(w);
        double t0 = adt_now_s();
        if (!rc) rc = adt_dist_rebuild(w, g, &d, &xo, &loc, &mc, &ex);
        rebuild[r] = slowest(w, adt_now_s() - t0);
    }
    if (rc) return fprintf(stderr, "bench_split rank %d: %s\n", rank, adt_error_message()), 1;
    if (rank == 0) {
        printf("{\"model\": \"%s\", \"strategy\": \"%s\", \"ranks\": %d, \"batch\": %d, \"skewed_first\": %d, ", o.model,
               o.strategy, n, o.batch, skew[0]);
        print_ms("rebuild", rebuild, o.rounds, 1);
        double rb = rebuild[o.rounds / 2], st = 0;
        print_ms("step_even", step[0], n_step[0], 1);
        st = step[0][n_step[0] / 2];
        print_ms("step_skewed", step[1], n_step[1], 1);
        printf("\"rebuild_in_even_steps\": %.2f}\n", rb / st);
    }
    adt_exec_free(ex);
    adt_mesh_comm_release(mc, loc.g);
    adt_mesh_comm_free(mc);
    adt_dist_local_free(&loc);
    adt_plan_free(&p);
    adt_graph_free(g);
    free(even), free(skew), free(rebuild), free(step[0]), free(step[1]), free(one);
    return adt_comm_finalize(w) ? 1 : 0;
}
