/*
 * plan_auto.c - `adtrain plan --strategy auto`: searches a plan for a model on a cluster
 * (planner.h), prints it with its predicted step time and peak memory per device next to every
 * expert plan's, optionally where the time goes (--explain) or all of it as JSON (--json), and
 * writes the plan file `adtrain train --plan` runs.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"
#include "adtrain/train.h"
#include "cli.h"

#define auto_fail(...) cli_fail("plan", __VA_ARGS__)

static const char *gib(double b, char *buf, size_t n) {
    snprintf(buf, n, "%.3f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

static void print_explain(const adt_cost_report *r) {
    printf("\nwhere the time goes (per step, the slowest stage's clock)\n");
    printf("  compute                 %10.4f ms\n", r->compute_s * 1e3);
    if (r->input_s > 0) printf("  input                   %10.4f ms (producing the rank's samples of --data)\n", r->input_s * 1e3);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        if (r->comm_s[k] > 0) printf("  %-23s %10.4f ms busy\n", adt_boxing_kind_name(k), r->comm_s[k] * 1e3);
    if (r->accumulate_s > 0)
        printf("  gradient accumulation   %10.4f ms (adding each microbatch's gradients, scaling the sum)\n",
               r->accumulate_s * 1e3);
    printf("  communication exposed   %10.4f ms (not hidden behind compute)\n", r->exposed_comm_s * 1e3);
    if (r->sync_s > 0) printf("  of which peers' arrival %10.4f ms (blocked waits x the cluster's sync_s)\n", r->sync_s * 1e3);
    if (r->n_stages > 1) {
        printf("  stage transfers         %10.4f ms\n", r->p2p_s * 1e3);
        printf("  pipeline bubbles        %10.4f ms (%d stages, %d microbatches)\n", r->bubble_s * 1e3, r->n_stages,
               r->microbatches);
        for (int s = 0; s < r->n_stages; s++)
            printf("  stage %-3d               %10.4f ms per microbatch, %.3f GiB per device\n", s, r->stage_s[s] * 1e3,
                   r->stage_mem[s] / (1024.0 * 1024.0 * 1024.0));
    }
    printf("memory per device: state %.3f GiB, activations peak %.3f GiB, kept for backward %.3f GiB per microbatch\n",
           r->state_bytes / (1024.0 * 1024.0 * 1024.0), r->act_bytes / (1024.0 * 1024.0 * 1024.0),
           r->saved_bytes / (1024.0 * 1024.0 * 1024.0));
}

static cJSON *report_json(const adt_cost_report *r) {
    cJSON *j = cJSON_CreateObject(), *comm = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "predicted_step_s", r->step_s);
    cJSON_AddNumberToObject(j, "peak_mem_bytes", r->peak_mem_bytes);
    cJSON_AddBoolToObject(j, "feasible", r->feasible);
    cJSON_AddNumberToObject(j, "compute_s", r->compute_s);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        if (r->comm_s[k] > 0) cJSON_AddNumberToObject(comm, adt_boxing_kind_name(k), r->comm_s[k]);
    cJSON_AddItemToObject(j, "comm_s", comm);
    cJSON_AddNumberToObject(j, "exposed_comm_s", r->exposed_comm_s);
    cJSON_AddNumberToObject(j, "p2p_s", r->p2p_s);
    cJSON_AddNumberToObject(j, "sync_s", r->sync_s);
    cJSON_AddNumberToObject(j, "input_s", r->input_s);
    cJSON_AddNumberToObject(j, "accumulate_s", r->accumulate_s);
    cJSON_AddNumberToObject(j, "bubble_s", r->bubble_s);
    return j;
}

static void print_json(const adt_planner_result *res, const adt_cluster *cl, const char *label) {
    cJSON *root = report_json(&res->cost), *ex = cJSON_CreateArray();
    char mb[64];
    cJSON_AddStringToObject(root, "model", label);
    cJSON_AddStringToObject(root, "cluster", cl->name);
    cJSON_AddNumberToObject(root, "input_per_sample_s", cl->input_s);
    cJSON_AddNumberToObject(root, "devices", res->plan.mesh.nranks);
    cJSON_AddStringToObject(root, "strategy", res->plan.strategy);
    cJSON_AddStringToObject(root, "mesh", adt_mesh_str(&res->plan.mesh, mb, sizeof mb));
    cJSON_AddNumberToObject(root, "stages", res->plan.n_stages);
    cJSON_AddNumberToObject(root, "microbatches", res->plan.microbatches);
    cJSON_AddNumberToObject(root, "search_s", res->search_s);
    cJSON_AddNumberToObject(root, "search_cpu_s", res->search_cpu_s);
    cJSON_AddNumberToObject(root, "candidates", res->n_candidates);
    for (int i = 0; i < res->n_experts; i++) {
        cJSON *e = res->expert_ok[i] ? report_json(&res->expert_cost[i]) : cJSON_CreateObject();
        cJSON_AddStringToObject(e, "strategy", res->expert_name[i]);
        cJSON_AddBoolToObject(e, "applies", res->expert_ok[i] != 0);
        cJSON_AddItemToArray(ex, e);
    }
    cJSON_AddItemToObject(root, "experts", ex);
    char *s = cJSON_Print(root);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(root);
}

/* The cluster file, with the input of the run's data priced: what producing one sample of
 * --data (or the default data) takes here, or --input-s as given. */
static int load_cluster(const cli_plan_auto_opts *o, const adt_model_cfg *m, long batch, adt_cluster *cl) {
    if (adt_cluster_load(cl, o->cluster_path)) return auto_fail(2, "--cluster: %s", adt_error_message());
    if (o->input_s >= 0) {
        cl->input_s = o->input_s;
        return 0;
    }
    const char *spec = o->data ? o->data : adt_train_default_data(m, NULL);
    if (adt_train_measure_input(m, o->builtin_model, spec, (int)batch, &cl->input_s))
        return auto_fail(2, "--data %s: %s", spec, adt_error_message());
    return 0;
}

/* An expert plan priced on a cluster (--cluster with another strategy): what the cost model
 * predicts for exactly the plan written, so that it can be set beside a measured run. */
int cli_plan_price(const cli_plan_auto_opts *o, const adt_plan *p, const adt_graph *g) {
    adt_cluster cl;
    int rc = load_cluster(o, &p->model, p->batch, &cl);
    if (rc) return rc;
    if (p->mesh.nranks > adt_cluster_devices(&cl))
        return auto_fail(2, "--devices: %d, but cluster %s has %d devices", p->mesh.nranks, cl.name,
                         adt_cluster_devices(&cl));
    adt_cost_report r;
    if (adt_plan_cost(p, g, &cl, &r)) return auto_fail(2, "pricing the plan: %s", adt_error_message());
    if (o->json) {
        cJSON *j = report_json(&r);
        char mb[64];
        cJSON_AddStringToObject(j, "cluster", cl.name);
        cJSON_AddNumberToObject(j, "input_per_sample_s", cl.input_s);
        cJSON_AddNumberToObject(j, "devices", p->mesh.nranks);
        cJSON_AddStringToObject(j, "strategy", p->strategy);
        cJSON_AddStringToObject(j, "mesh", adt_mesh_str(&p->mesh, mb, sizeof mb));
        cJSON_AddNumberToObject(j, "stages", p->n_stages);
        cJSON_AddNumberToObject(j, "microbatches", p->microbatches);
        char *s = cJSON_Print(j);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
        return 0;
    }
    char b1[32];
    printf("\ncluster     %s: %d devices (%s), %d per node\n", cl.name, p->mesh.nranks, cl.device_kind,
           cl.devices_per_node);
    printf("predicted   %.4f ms per step, peak %s per device%s\n", r.step_s * 1e3, gib(r.peak_mem_bytes, b1, sizeof b1),
           r.feasible ? "" : " OVER MEMORY");
    if (o->explain) print_explain(&r);
    return 0;
}

int cli_plan_auto(const cli_plan_auto_opts *o, const adt_model_cfg *m, const char *label) {
    if (!o->cluster_path) return auto_fail(2, "--cluster: missing; --strategy auto plans on a cluster file "
                                           "(configs/clusters/*.json, or one adtrain calibrate writes)");
    adt_cluster cl;
    int rc = load_cluster(o, m, o->batch, &cl);
    if (rc) return rc;
    if (o->devices > adt_cluster_devices(&cl))
        return auto_fail(2, "--devices: %ld, but cluster %s has %d devices", o->devices, cl.name, adt_cluster_devices(&cl));
    adt_planner_opts po = {.devices = (int)o->devices, .batch = (int)o->batch, .optim = o->optimizer,
                           .momentum = o->momentum, .mem_limit = o->mem_limit, .max_pp = (int)o->max_pp};
    adt_planner_result res;
    if (adt_planner_search(m, &cl, &po, &res)) return auto_fail(2, "%s", adt_error_message());
    char b1[32], b2[32];
    if (o->json) {
        print_json(&res, &cl, label);
    } else {
        if ((rc = cli_plan_print(&res.plan, res.graph, label))) goto done;
        printf("\ncluster     %s: %d devices (%s), %d per node\n", cl.name, res.plan.mesh.nranks, cl.device_kind,
               cl.devices_per_node);
        printf("predicted   %.4f ms per step, peak %s per device (limit %s)%s; searched %d candidates in %.3f s%s\n",
               res.cost.step_s * 1e3, gib(res.cost.peak_mem_bytes, b1, sizeof b1),
               gib(o->mem_limit > 0 ? o->mem_limit : cl.memory_bytes, b2, sizeof b2),
               res.cost.feasible ? "" : " OVER MEMORY", res.n_candidates, res.search_s,
               res.from_expert >= 0 ? " (an expert plan is best)" : "");
        printf("\n%-24s %14s %14s %s\n", "plan", "step (ms)", "peak mem", "vs chosen");
        printf("%-24s %14.4f %14s %s\n", "chosen", res.cost.step_s * 1e3, gib(res.cost.peak_mem_bytes, b1, sizeof b1), "1.000");
        for (int i = 0; i < res.n_experts; i++) {
            if (!res.expert_ok[i]) {
                printf("%-24s %14s %14s does not apply\n", res.expert_name[i], "-", "-");
                continue;
            }
            const adt_cost_report *r = &res.expert_cost[i];
            printf("%-24s %14.4f %14s %.3f%s\n", res.expert_name[i], r->step_s * 1e3, gib(r->peak_mem_bytes, b1, sizeof b1),
                   r->step_s / res.cost.step_s, r->feasible ? "" : " over memory");
        }
        if (o->explain) print_explain(&res.cost);
    }
    if (o->out_path) {
        if (adt_plan_save(&res.plan, res.graph, o->out_path)) rc = auto_fail(1, "-o: %s", adt_error_message());
        else if (!o->json) printf("\nwrote       %s\n", o->out_path);
    }
done:
    adt_planner_result_free(&res);
    return rc;
}
