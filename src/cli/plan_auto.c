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
#include "adtrain/data.h"
#include "adtrain/dist.h"
#include "adtrain/planner.h"
#include "adtrain/ps.h"
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

static void ps_json(cJSON *j, const cli_plan_auto_opts *o, const adt_ps_report *r, int chosen);

/* ps: the parameter-server estimate beside (NULL: none); use_ps: it is the plan chosen */
static void print_json(const cli_plan_auto_opts *o, const adt_planner_result *res, const adt_cluster *cl,
                       const char *label, const adt_ps_report *ps, int use_ps) {
    cJSON *root = report_json(&res->cost), *ex = cJSON_CreateArray();
    if (use_ps) { /* the chosen plan's figures at the top, the collective plan's under "collective" */
        cJSON_AddItemToObject(root, "collective", report_json(&res->cost));
        cJSON_ReplaceItemInObject(root, "predicted_step_s", cJSON_CreateNumber(ps->step_s));
        cJSON_ReplaceItemInObject(root, "peak_mem_bytes", cJSON_CreateNumber(
            ps->server_mem_bytes > ps->worker_mem_bytes ? ps->server_mem_bytes : ps->worker_mem_bytes));
        cJSON_ReplaceItemInObject(root, "feasible", cJSON_CreateBool(ps->feasible));
    }
    if (ps) ps_json(root, o, ps, use_ps);
    char mb[64];
    cJSON_AddStringToObject(root, "model", label);
    cJSON_AddStringToObject(root, "cluster", cl->name);
    cJSON_AddNumberToObject(root, "input_per_sample_s", cl->input_s);
    cJSON_AddNumberToObject(root, "devices", res->plan.mesh.nranks);
    cJSON_AddStringToObject(root, "strategy", use_ps ? "ps" : res->plan.strategy);
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

/* The parameter-server mode of a DLRM priced beside the collective plans (planner.h): the ids'
 * law per table from the run's data (a file's: uniform, the most distinct rows), the setting of
 * --ps-servers (else searched), --ps-sync (else sync) and --ps-prefetch (else the trainer's
 * default), the dense part on the workers. 0 and *ok 0 for a model without tables or a world too
 * small for servers and workers; the --ps-* flags are refused there (they could not act). */
#define PS_PREFETCH 1
static int ps_prefetch(const cli_plan_auto_opts *o) { return o->ps_prefetch >= 0 ? (int)o->ps_prefetch : PS_PREFETCH; }
static const char *ps_sync(const cli_plan_auto_opts *o) { return o->ps_sync ? o->ps_sync : "sync"; }

static int ps_estimate(const cli_plan_auto_opts *o, const adt_model_cfg *m, const adt_cluster *cl, int devices, int batch,
                       adt_ps_report *r, int *ok, int *law_known) {
    *ok = 0, *law_known = 1;
    const char *flag = o->ps_servers ? "--ps-servers" : o->ps_sync ? "--ps-sync" : o->ps_prefetch >= 0 ? "--ps-prefetch" : NULL;
    if (flag && m->type != ADT_MODEL_DLRM)
        return auto_fail(2, "%s: the parameter-server mode holds a DLRM's embedding tables; this model is '%s'", flag,
                         adt_model_type_name(m->type));
    if (flag && (devices < 2 || batch < 2))
        return auto_fail(2, "%s: the parameter-server mode needs 2 devices and 2 samples at least (a server and a "
                         "worker), got %d and %d", flag, devices, batch);
    adt_ps_sync sync;
    if (adt_ps_sync_parse(ps_sync(o), "--ps-sync", &sync)) return auto_fail(2, "%s", adt_error_message());
    int staleness = sync.kind == ADT_PS_ASYNC ? ADT_PS_COST_ASYNC : sync.kind == ADT_PS_SSP ? sync.staleness : 0;
    if (m->type != ADT_MODEL_DLRM || devices < 2) return 0;
    const char *spec = o->data ? o->data : adt_train_default_data(m, NULL);
    adt_ps_ids ids[ADT_DLRM_MAX_TABLES];
    for (int t = 0; t < m->dlrm.n_tables; t++) {
        int kind;
        double param;
        if (adt_data_id_law(spec, t, &kind, &param)) return auto_fail(2, "--data %s: %s", spec, adt_error_message());
        ids[t].kind = kind == ADT_IDS_ZIPF ? ADT_PS_IDS_ZIPF : kind == ADT_IDS_SQUARE ? ADT_PS_IDS_SQUARE : ADT_PS_IDS_UNIFORM;
        ids[t].param = param;
        if (kind == ADT_IDS_UNKNOWN) *law_known = 0;
    }
    adt_ps_opts po = {.devices = devices, .servers = (int)o->ps_servers, .batch = batch, .prefetch = ps_prefetch(o),
                      .staleness = staleness, .ids = ids, .optim = o->optimizer, .mem_limit = o->mem_limit};
    if (batch < 2) return 0;
    if (adt_ps_cost(m, cl, &po, r)) return auto_fail(2, "the parameter-server estimate: %s", adt_error_message());
    *ok = 1;
    return 0;
}

static void print_ps(const cli_plan_auto_opts *o, const adt_ps_report *r, int law_known, double collective_s) {
    char b1[32], b2[32];
    printf("\nparameter-server mode (--mode ps, %s, prefetch %d, dense on the workers): %d servers + %d workers\n",
           ps_sync(o), ps_prefetch(o), r->servers, r->workers);
    printf("  predicted             %10.4f ms per step (%.3f x the collective plan)%s\n", r->step_s * 1e3,
           r->step_s / collective_s, r->feasible ? "" : " OVER MEMORY");
    printf("  worker compute        %10.4f ms (dense part, rows copied)\n", r->compute_s * 1e3);
    printf("  push + server update  %10.4f + %.4f ms\n", r->push_s * 1e3, r->update_s * 1e3);
    printf("  pull                  %10.4f ms\n", r->pull_s * 1e3);
    printf("  dense all-reduce      %10.4f ms among the workers\n", r->dense_s * 1e3);
    printf("  waited                %10.4f ms of the round trip's %.4f (answers made %d step%s ahead); a server busy "
           "%.4f ms\n", r->wait_s * 1e3, r->round_s * 1e3, r->lookahead, r->lookahead == 1 ? "" : "s", r->server_s * 1e3);
    printf("  rows per step         %.1f distinct per worker, %.1f over the batch%s\n", r->rows_worker, r->rows_step,
           law_known ? "" : " (ids of unknown law priced as uniform)");
    printf("  bytes per step        pull %.0f, push %.0f per worker; %.0f per server\n", r->pull_bytes, r->push_bytes,
           r->server_bytes);
    printf("  memory                %s per server, %s per worker\n", gib(r->server_mem_bytes, b1, sizeof b1),
           gib(r->worker_mem_bytes, b2, sizeof b2));
}

static void ps_json(cJSON *j, const cli_plan_auto_opts *o, const adt_ps_report *r, int chosen) {
    cJSON_AddStringToObject(j, "mode", chosen ? "ps" : "collective");
    if (chosen) {
        cJSON_AddNumberToObject(j, "ps_servers", r->servers);
        cJSON_AddStringToObject(j, "ps_sync", ps_sync(o));
    }
    cJSON *p = cJSON_AddObjectToObject(j, "ps");
    cJSON_AddNumberToObject(p, "servers", r->servers);
    cJSON_AddNumberToObject(p, "workers", r->workers);
    cJSON_AddStringToObject(p, "sync", ps_sync(o));
    cJSON_AddNumberToObject(p, "prefetch", ps_prefetch(o));
    cJSON_AddNumberToObject(p, "predicted_step_s", r->step_s);
    cJSON_AddBoolToObject(p, "feasible", r->feasible);
    cJSON_AddNumberToObject(p, "compute_s", r->compute_s);
    cJSON_AddNumberToObject(p, "pull_s", r->pull_s);
    cJSON_AddNumberToObject(p, "push_s", r->push_s);
    cJSON_AddNumberToObject(p, "update_s", r->update_s);
    cJSON_AddNumberToObject(p, "dense_s", r->dense_s);
    cJSON_AddNumberToObject(p, "lookahead", r->lookahead);
    cJSON_AddNumberToObject(p, "round_s", r->round_s);
    cJSON_AddNumberToObject(p, "wait_s", r->wait_s);
    cJSON_AddNumberToObject(p, "server_s", r->server_s);
    cJSON_AddNumberToObject(p, "rows_worker", r->rows_worker);
    cJSON_AddNumberToObject(p, "rows_step", r->rows_step);
    cJSON_AddNumberToObject(p, "pull_bytes", r->pull_bytes);
    cJSON_AddNumberToObject(p, "push_bytes", r->push_bytes);
    cJSON_AddNumberToObject(p, "server_bytes", r->server_bytes);
    cJSON_AddNumberToObject(p, "server_mem_bytes", r->server_mem_bytes);
    cJSON_AddNumberToObject(p, "worker_mem_bytes", r->worker_mem_bytes);
}

static int save_ps(const cli_plan_auto_opts *o, const adt_model_cfg *m, const adt_ps_report *r, int devices, int batch,
                   const char *path) {
    adt_ps_plan pp = {.model = *m, .batch = batch, .devices = devices, .servers = r->servers, .prefetch = ps_prefetch(o)};
    snprintf(pp.sync, sizeof pp.sync, "%s", ps_sync(o));
    if (adt_ps_plan_save(&pp, path)) return auto_fail(1, "-o: %s", adt_error_message());
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
    adt_ps_report ps;
    int ps_ok, law_known;
    if ((rc = ps_estimate(o, &p->model, &cl, p->mesh.nranks, p->batch, &ps, &ps_ok, &law_known))) return rc;
    if (o->json) {
        cJSON *j = report_json(&r);
        char mb[64];
        if (ps_ok) ps_json(j, o, &ps, 0);
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
    if (o->explain && ps_ok) print_ps(o, &ps, law_known, r.step_s);
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
    int have = !adt_planner_search(m, &cl, &po, &res);
    char why[1024];
    snprintf(why, sizeof why, "%s", have ? "" : adt_error_message());
    /* the parameter-server mode beside the collective plans: chosen when predicted faster, or
     * when it alone fits */
    adt_ps_report ps;
    int ps_ok, law_known, devices = o->devices ? (int)o->devices : adt_cluster_devices(&cl);
    if ((rc = ps_estimate(o, m, &cl, devices, (int)o->batch, &ps, &ps_ok, &law_known))) goto done;
    int use_ps = ps_ok && ps.feasible && (!have || !res.cost.feasible || ps.step_s < res.cost.step_s);
    if (o->mode && !strcmp(o->mode, "collective")) use_ps = 0; /* priced beside, never chosen */
    if (o->mode && !strcmp(o->mode, "ps")) {
        if (!ps_ok) {
            rc = auto_fail(2, "--mode ps: the parameter-server mode holds a DLRM's tables on 2 devices or more; this "
                           "is a '%s' on %d", adt_model_type_name(m->type), devices);
            goto done;
        }
        use_ps = 1; /* chosen whatever the collective plans' price, even over memory (said so) */
    }
    if (!have && !use_ps) return auto_fail(2, "%s", why);
    char b1[32], b2[32];
    if (!have) { /* only the ps mode: its estimate */
        if (o->json) {
            cJSON *root = cJSON_CreateObject();
            cJSON_AddNumberToObject(root, "predicted_step_s", ps.step_s);
            cJSON_AddNumberToObject(root, "peak_mem_bytes", ps.server_mem_bytes > ps.worker_mem_bytes ? ps.server_mem_bytes
                                                                                                     : ps.worker_mem_bytes);
            cJSON_AddBoolToObject(root, "feasible", 1);
            cJSON_AddStringToObject(root, "model", label);
            cJSON_AddStringToObject(root, "cluster", cl.name);
            cJSON_AddNumberToObject(root, "devices", devices);
            cJSON_AddStringToObject(root, "strategy", "ps");
            cJSON_AddNumberToObject(root, "microbatches", 1);
            cJSON_AddStringToObject(root, "collective", why);
            ps_json(root, o, &ps, 1);
            char *txt = cJSON_Print(root);
            printf("%s\n", txt);
            free(txt);
            cJSON_Delete(root);
        } else {
            printf("no collective plan: %s\n", why);
            print_ps(o, &ps, law_known, ps.step_s);
            printf("\nchosen      the parameter-server mode\n");
        }
        if (o->out_path && (rc = save_ps(o, m, &ps, devices, (int)o->batch, o->out_path))) return rc;
        if (o->out_path && !o->json) printf("\nwrote       %s\n", o->out_path);
        return 0;
    }
    if (o->json) {
        print_json(o, &res, &cl, label, ps_ok ? &ps : NULL, use_ps);
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
        if (ps_ok && (o->explain || use_ps)) print_ps(o, &ps, law_known, res.cost.step_s);
        if (use_ps) printf("\nchosen      the parameter-server mode (predicted %.3f x the collective plan)\n",
                           ps.step_s / res.cost.step_s);
    }
    if (o->out_path && use_ps) {
        if (!(rc = save_ps(o, m, &ps, devices, (int)o->batch, o->out_path)) && !o->json)
            printf("\nwrote       %s\n", o->out_path);
    } else if (o->out_path) {
        if (adt_plan_save(&res.plan, res.graph, o->out_path)) rc = auto_fail(1, "-o: %s", adt_error_message());
        else if (!o->json) printf("\nwrote       %s\n", o->out_path);
    }
done:
    adt_planner_result_free(&res);
    return rc;
}
