/*
 * bench_planner.c - the automatic planner at scale, on the example clusters: how long the search
 * takes, and the predicted step time and peak memory of the plan it chooses next to the best
 * expert plan's.
 *
 *   build/bench/bench_planner [--only NAME]
 *
 * Cases (one JSON line each on stdout, a table on stderr):
 *   gpt24-64     GPT ~1.3B (configs/gpt-1.3b.json, 24 layers) on 64 H100 (configs/clusters/h100-8x8.json)
 *   gpt96-1024   the same GPT with 96 layers on 1024 H100 (the cluster grown to 128 nodes)
 *   gpt1.3b-cpu  GPT ~1.3B on the 64-socket CPU cluster (configs/clusters/cpu-epyc-32x2.json)
 *   vgg16-64     VGG-16 (configs/vgg16.json) on 64 H100
 *   dlrm-64      DLRM on the Criteo tables (configs/dlrm-criteo.json) on 64 H100
 * Every number is the cost model's prediction; search_s is measured (one run, wall clock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"

typedef struct bcase {
    const char *name, *model, *cluster;
    int n_layer, nodes, batch;
} bcase;

static const bcase cases[] = {
    {"gpt24-64", "configs/gpt-1.3b.json", "configs/clusters/h100-8x8.json", 0, 0, 512},
    {"gpt96-1024", "configs/gpt-1.3b.json", "configs/clusters/h100-8x8.json", 96, 128, 2048},
    {"gpt1.3b-cpu", "configs/gpt-1.3b.json", "configs/clusters/cpu-epyc-32x2.json", 0, 0, 512},
    {"vgg16-64", "configs/vgg16.json", "configs/clusters/h100-8x8.json", 0, 0, 2048},
    {"dlrm-64", "configs/dlrm-criteo.json", "configs/clusters/h100-8x8.json", 0, 0, 65536},
};

static int run(const bcase *b) {
    adt_model_cfg m;
    adt_cluster c;
    if (adt_model_cfg_load(&m, b->model) || adt_cluster_load(&c, b->cluster)) {
        fprintf(stderr, "%s: %s\n", b->name, adt_error_message());
        return 1;
    }
    if (b->n_layer) m.gpt.n_layer = b->n_layer;
    if (b->nodes > c.nodes && adt_cluster_add_nodes(&c, b->nodes - c.nodes)) {
        fprintf(stderr, "%s: %s\n", b->name, adt_error_message());
        return 1;
    }
    adt_planner_opts o = {.batch = b->batch, .optim = ADT_OPTIM_ADAMW};
    adt_planner_result r;
    if (adt_planner_search(&m, &c, &o, &r)) {
        fprintf(stderr, "%s: %s\n", b->name, adt_error_message());
        return 1;
    }
    int best = -1;
    for (int i = 0; i < r.n_experts; i++)
        if (r.expert_ok[i] && r.expert_cost[i].feasible &&
            (best < 0 || r.expert_cost[i].step_s < r.expert_cost[best].step_s))
            best = i;
    char mesh[64];
    adt_mesh_str(&r.plan.mesh, mesh, sizeof mesh);
    double comm = 0;
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) comm += r.cost.comm_s[k];
    printf("{\"case\":\"%s\",\"devices\":%d,\"params\":%lld,\"batch\":%d,\"search_s\":%.4f,\"search_cpu_s\":%.4f,\"candidates\":%d,"
           "\"auto\":{\"mesh\":\"%s\",\"stages\":%d,\"microbatches\":%d,\"from_expert\":%d,\"step_s\":%.6g,"
           "\"peak_mem_bytes\":%.6g,\"compute_s\":%.6g,\"comm_s\":%.6g,\"exposed_comm_s\":%.6g,\"bubble_s\":%.6g},"
           "\"best_expert\":{\"strategy\":\"%s\",\"step_s\":%.6g,\"peak_mem_bytes\":%.6g},\"experts\":[",
           b->name, r.plan.mesh.nranks, (long long)adt_model_cfg_param_count(&m), b->batch, r.search_s, r.search_cpu_s,
           r.n_candidates,
           mesh, r.plan.n_stages, r.plan.microbatches, r.from_expert, r.cost.step_s, r.cost.peak_mem_bytes,
           r.cost.compute_s, comm, r.cost.exposed_comm_s, r.cost.bubble_s, best >= 0 ? r.expert_name[best] : "none",
           best >= 0 ? r.expert_cost[best].step_s : 0, best >= 0 ? r.expert_cost[best].peak_mem_bytes : 0);
    for (int i = 0; i < r.n_experts; i++)
        printf("%s{\"strategy\":\"%s\",\"applies\":%d,\"step_s\":%.6g,\"peak_mem_bytes\":%.6g,\"feasible\":%d}", i ? "," : "",
               r.expert_name[i], r.expert_ok[i], r.expert_ok[i] ? r.expert_cost[i].step_s : 0,
               r.expert_ok[i] ? r.expert_cost[i].peak_mem_bytes : 0, r.expert_ok[i] ? r.expert_cost[i].feasible : 0);
    printf("]}\n");
    fflush(stdout);
    fprintf(stderr, "%-12s %5d dev  search %7.3f s, %.3f s CPU (%d candidates)  auto %s x%d stages m=%d: %.4g s, %.2f GiB  |  best expert %s: "
            "%.4g s, %.2f GiB  (auto/expert %.3f)\n",
            b->name, r.plan.mesh.nranks, r.search_s, r.search_cpu_s, r.n_candidates, mesh, r.plan.n_stages, r.plan.microbatches,
            r.cost.step_s, r.cost.peak_mem_bytes / 1073741824.0, best >= 0 ? r.expert_name[best] : "none",
            best >= 0 ? r.expert_cost[best].step_s : 0, best >= 0 ? r.expert_cost[best].peak_mem_bytes / 1073741824.0 : 0,
            best >= 0 ? r.cost.step_s / r.expert_cost[best].step_s : 0);
    adt_planner_result_free(&r);
    return 0;
}

int main(int argc, char **argv) {
    const char *only = argc > 2 && !strcmp(argv[1], "--only") ? argv[2] : NULL;
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!only || !strcmp(only, cases[i].name)) rc |= run(&cases[i]);
    return rc;
}
