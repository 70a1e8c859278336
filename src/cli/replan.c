/*
 * replan.c - the master's re-planning (`adtrain master/launch --model CFG.json [--cluster C.json]
 * [--strategy S] [--batch B] [--optimizer K]`): each time a world of N ranks forms, the plan of
 * the model for N devices, as the plan file `adtrain train --plan` runs, handed to the master
 * through its plan_world hook (adtrain/elastic.h). The master stays below the planner: it only
 * calls the hook and serves the text.
 *
 * Strategies: auto searches (adt_planner_search on the cluster, grown by whole nodes when the
 * world has more ranks than it has devices; pipelines included: the elastic trainer checkpoints
 * and restores a pipeline's stages like any other plan); an expert strategy (dp, zero, tp, dp=2,tp=2, ...) is made with
 * adt_expert_plan and priced on the cluster when there is one. A strategy that cannot apply to
 * the world (zero on one rank, tp=2 on three) falls back to data parallel, the reason in the
 * plan's note and so in the master's "replan" event; auto falls back the same way when the
 * search fails.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"
#include "adtrain/straggler.h"
#include "cli.h"

const char cli_replan_flags_help[] =
    "what the job trains (said once: served to the workers, GET /v1/job \"spec\"; a worker takes these as\n"
    "its defaults and refuses a flag of its own that disagrees; with --model each new world also gets a\n"
    "plan for its size, else every world is data parallel):\n"
    "  --model CFG.json        the model the workers train (the same config as adtrain train --model)\n"
    "  --batch B               its global batch (default: --global-batch)\n"
    "  --optimizer K           adamw, sgd or sgd-momentum (default adamw, as adtrain train's)\n"
    "  --lr X, --momentum M, --weight-decay W   the optimizer's hyperparameters\n"
    "  --steps N               optimizer steps of the run\n"
    "  --data KIND:PATH        the training data, as adtrain train --data\n"
    "  --strategy S            auto (the planner; needs --cluster), or an expert strategy: dp, zero, tp,\n"
    "                          dp=2,tp=2, ... (default: auto with --cluster, else dp). One that cannot\n"
    "                          apply to a world falls back to dp, and the replan event says why\n"
    "  --cluster C.json        the cluster to plan and price on (adtrain calibrate writes one); grown by\n"
    "                          whole nodes when a world has more ranks than it has devices\n";

int cli_replan_flag(const char *cmd, cli_replan_opts *r, const char *f, const char *v) {
    long x;
    if (!strcmp(f, "--model"))
        r->model_path = v;
    else if (!strcmp(f, "--cluster"))
        r->cluster_path = v;
    else if (!strcmp(f, "--strategy"))
        r->strategy = v;
    else if (!strcmp(f, "--batch")) {
        if (cli_long(cmd, f, v, 1, 1 << 24, &x)) return -1;
        r->batch = x;
    } else if (!strcmp(f, "--optimizer")) {
        if (!strcmp(v, "adamw")) r->optim = ADT_OPTIM_ADAMW, r->momentum = 0;
        else if (!strcmp(v, "sgd")) r->optim = ADT_OPTIM_SGD, r->momentum = 0;
        else if (!strcmp(v, "sgd-momentum")) r->optim = ADT_OPTIM_SGD, r->momentum = 1;
        else return cli_fail(cmd, -1, "--optimizer: expected adamw, sgd or sgd-momentum, got '%s'", v);
        r->optim_given = 1;
    } else
        return 0;
    return 1;
}

/* A strategy text is well formed when some device count accepts it. */
static int strategy_known(const char *s) {
    adt_strategy st;
    for (int d = 1; d <= 64; d++)
        if (adt_strategy_parse(s, d, &st) == ADT_OK) return 1;
    return 0;
}

int cli_replan_finish(const char *cmd, cli_replan_opts *r, adt_master_config *cfg, long global_batch) {
    if (!r->model_path) {
        if (r->cluster_path || r->strategy)
            return cli_fail(cmd, -1, "--cluster and --strategy plan a model: expected --model CFG.json with them");
        return 0;
    }
    if (cli_load_model(cmd, r->model_path, &r->model, r->label, sizeof r->label)) return -1;
    if (!r->batch) r->batch = global_batch;
    if (!r->batch) return cli_fail(cmd, -1, "--model: expected --batch B (the workers' global batch) to plan for");
    if (r->cluster_path) {
        if (adt_cluster_load(&r->cluster, r->cluster_path)) return cli_fail(cmd, -1, "--cluster: %s", adt_error_message());
        r->have_cluster = 1;
    }
    if (!r->strategy) r->strategy = r->have_cluster ? "auto" : "dp";
    if (!strcmp(r->strategy, "auto")) {
        if (!r->have_cluster)
            return cli_fail(cmd, -1, "--strategy auto: the planner needs --cluster C.json (adtrain calibrate writes "
                            "one; configs/clusters/ has examples)");
    } else if (!strategy_known(r->strategy)) {
        return cli_fail(cmd, -1, "--strategy '%s': expected auto, or a list of dp[=N], zero, tp[=N] (e.g. dp, zero, "
                        "tp, dp=2,tp=2)", r->strategy);
    }
    /* the model must build at that batch (a typo costs no world) */
    adt_graph *g = NULL;
    if (cli_replan_graph(r, &g)) {
        adt_graph_free(g);
        return cli_fail(cmd, -1, "--model %s at --batch %ld: %s", r->label, r->batch, adt_error_message());
    }
    adt_graph_free(g);
    cfg->plan_world = cli_replan_world;
    cfg->plan_ctx = r;
    return 0;
}

/* The training graph the plan is made for: the model at the batch, autodiff, the optimizer
 * (default hyperparameters: a plan depends on the optimizer's kind only). */
int cli_replan_graph(const cli_replan_opts *r, adt_graph **out) {
    adt_graph *g = *out = adt_graph_create();
    adt_model_io io;
    if (adt_model_build(g, &r->model, (int)r->batch, &io)) return -1;
    adt_optim_cfg oc = r->optim == ADT_OPTIM_SGD ? adt_optim_sgd(r->momentum ? 0.9f : 0.0f, 0.0f)
                                                 : adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f);
    adt_graph_backward(g, io.loss);
    adt_graph_optimizer(g, &oc);
    if (adt_graph_error(g)) return adt_error(ADT_ERR_STATE, "%s", adt_graph_error_message(g));
    return 0;
}

/* The devices' compute at the speeds the job measured: the cluster file describes a device
 * running as the fastest one measured; each device ran at speed_i of it, and a step whose
 * local batches follow speed (the plan's batch_split) computes at their mean, so every compute
 * and memory rate is scaled by mean(speed) / max(speed). A device never measured counts as the
 * fastest. The cluster object prices one kind of device, so this is the one number it can take. */
static double speed_scale(const adt_world_shape *w) {
    if (!w || !w->speed || w->world < 1) return 1;
    double mx = 0, sum = 0;
    for (int i = 0; i < w->world; i++)
        if (w->speed[i] > mx) mx = w->speed[i];
    if (mx <= 0) return 1;
    for (int i = 0; i < w->world; i++) sum += w->speed[i] > 0 ? w->speed[i] : mx;
    return sum / w->world / mx;
}

/* The cluster with at least `world` devices (whole nodes added), at the measured speeds. */
static adt_cluster cluster_for(const cli_replan_opts *r, const adt_world_shape *w) {
    adt_cluster c = r->cluster;
    int have = adt_cluster_devices(&c);
    if (have < w->world) adt_cluster_add_nodes(&c, (w->world - have + c.devices_per_node - 1) / c.devices_per_node);
    double f = speed_scale(w);
    if (f != 1) {
        for (int i = 0; i < ADT_DTYPE_COUNT; i++) c.peak_flops[i] *= f;
        for (int i = 0; i < ADT_OPCLASS_COUNT; i++) {
            c.rate[i] *= f, c.rate_small[i] *= f;
            c.byte_rate[i] *= f, c.byte_rate_small[i] *= f;
        }
        c.memory_bw *= f;
    }
    return c;
}

/* A plan whose mesh is one axis over every rank (dp, zero) runs one data-parallel replica per
 * rank: with measured speeds, its local batches follow them ("batch_split" in the plan text,
 * the field plan files carry a per-replica split in). */
static void add_batch_split(const cli_replan_opts *r, const adt_world_shape *w, adt_world_plan *out) {
    if (!w->speed || !out->json || w->replicas != w->world || w->world < 2 || strchr(out->mesh, ',')) return;
    double *speed = adt_calloc((size_t)w->world, sizeof *speed), mx = 0;
    for (int i = 0; i < w->world; i++)
        if (w->speed[i] > mx) mx = w->speed[i];
    for (int i = 0; i < w->world; i++) speed[i] = w->speed[i] > 0 ? w->speed[i] : mx;
    int64_t *split = adt_calloc((size_t)w->world, sizeof *split);
    cJSON *o = cJSON_Parse(out->json);
    if (o && r->batch >= w->world && !adt_straggler_split(r->batch, w->world, speed, 1, split)) {
        cJSON *a = cJSON_AddArrayToObject(o, "batch_split");
        for (int i = 0; i < w->world; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)split[i]));
        char *txt = cJSON_Print(o);
        free(out->json);
        out->json = txt;
        out->batch_split = split, out->n_split = w->world;
        split = NULL;
    }
    cJSON_Delete(o);
    free(split);
    free(speed);
}

/* The expert plan of `strategy` for `world` devices into out (text, mesh, price). */
static int expert(const cli_replan_opts *r, const char *strategy, const adt_world_shape *w, adt_world_plan *out) {
    int world = w->world;
    adt_graph *g = NULL;
    adt_plan p;
    memset(&p, 0, sizeof p);
    int rc = cli_replan_graph(r, &g);
    adt_expert_opts eo = {.strategy = strategy, .devices = world, .batch = (int)r->batch};
    if (!rc) rc = adt_expert_plan(g, &r->model, &eo, &p);
    if (!rc && r->have_cluster) {
        adt_cluster c = cluster_for(r, w);
        adt_cost_report cr;
        if (adt_plan_cost(&p, g, &c, &cr) == ADT_OK) out->predicted_step_s = cr.step_s;
    }
    if (!rc) {
        out->json = adt_plan_to_json(&p, g);
        snprintf(out->strategy, sizeof out->strategy, "%s", p.strategy);
        adt_mesh_str(&p.mesh, out->mesh, sizeof out->mesh);
    }
    adt_plan_free(&p);
    adt_graph_free(g);
    return rc;
}

static int search(const cli_replan_opts *r, const adt_world_shape *w, adt_world_plan *out) {
    int world = w->world;
    adt_cluster c = cluster_for(r, w);
    adt_planner_opts po = {.devices = world, .batch = (int)r->batch, .optim = r->optim, .momentum = r->momentum};
    adt_planner_result res;
    if (adt_planner_search(&r->model, &c, &po, &res)) return -1;
    out->json = adt_plan_to_json(&res.plan, res.graph);
    if (res.from_expert >= 0) /* the search found nothing better than this expert plan */
        snprintf(out->strategy, sizeof out->strategy, "auto (expert %.40s)", res.expert_name[res.from_expert]);
    else
        snprintf(out->strategy, sizeof out->strategy, "auto (searched, %d candidates)", res.n_candidates);
    adt_mesh_str(&res.plan.mesh, out->mesh, sizeof out->mesh);
    out->predicted_step_s = res.cost.step_s;
    adt_planner_result_free(&res);
    return 0;
}

int cli_replan_world(void *ctx, const adt_world_shape *w, adt_world_plan *out) {
    const cli_replan_opts *r = ctx;
    int rc = !strcmp(r->strategy, "auto") ? search(r, w, out) : expert(r, r->strategy, w, out);
    if (!rc) {
        add_batch_split(r, w, out);
        return 0;
    }
    /* the requested strategy does not apply to this world: data parallel, and why */
    char why[200];
    snprintf(why, sizeof why, "%s", adt_error_message());
    free(out->json);
    memset(out, 0, sizeof *out);
    if (expert(r, "dp", w, out)) return -1;
    add_batch_split(r, w, out);
    snprintf(out->note, sizeof out->note, "--strategy %s cannot apply to %d ranks (%s): fell back to dp", r->strategy,
             w->world, why);
    return 0;
}
