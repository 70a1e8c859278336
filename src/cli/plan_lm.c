/*
 * plan_lm.c - `adtrain plan` for a GPT at cluster scale: the shape-level planner (planner.h,
 * "decoder language models at scale") prices a given strategy or searches one (--strategy auto)
 * with mixed precision, ZeRO, recomputation, micro-batch size and interleaved stages, and
 * prints the plan, its predicted step time, TFLOP/s per device and memory by its parts (--json:
 * the same as one object). Nothing of the model's size is built: a 1T-parameter GPT plans in
 * the time of its arithmetic.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"
#include "cli.h"

#define lm_fail(...) cli_fail("plan", __VA_ARGS__)

/* "dp=D,tp=T,pp=P[,zero=K]": one of the degrees may be left out and takes the rest. */
static int parse_strategy(const char *s, long devices, adt_lm_plan *p) {
    char buf[128];
    if (strlen(s) >= sizeof buf) return lm_fail(2, "--strategy: '%s' is too long", s);
    snprintf(buf, sizeof buf, "%s", s);
    int dp = 0, tp = 0, pp = 0, zero = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '='), *end = NULL;
        if (!eq) return lm_fail(2, "--strategy: '%s' in '%s', expected dp=D, tp=T, pp=P or zero=K", tok, s);
        *eq = 0;
        long v = strtol(eq + 1, &end, 10);
        if (!*(eq + 1) || *end || v < 0 || v > (1 << 20))
            return lm_fail(2, "--strategy: '%s=%s' in '%s', expected a whole number", tok, eq + 1, s);
        if (!strcmp(tok, "dp")) dp = (int)v;
        else if (!strcmp(tok, "tp")) tp = (int)v;
        else if (!strcmp(tok, "pp")) pp = (int)v;
        else if (!strcmp(tok, "zero")) zero = (int)v;
        else return lm_fail(2, "--strategy: '%s' in '%s', expected dp, tp, pp or zero", tok, s);
    }
    if (zero > 3) return lm_fail(2, "--strategy: zero=%d, expected 0, 1, 2 or 3", zero);
    int missing = !dp + !tp + !pp;
    if (missing > 1) {
        if (!tp) tp = 1;
        if (!pp && (dp || missing == 3)) pp = 1;
        missing = !dp + !tp + !pp;
    }
    long known = (long)(dp ? dp : 1) * (tp ? tp : 1) * (pp ? pp : 1);
    if (missing == 1) {
        if (devices % known)
            return lm_fail(2, "--strategy: the given degrees (%ld devices) do not divide --devices %ld", known, devices);
        int rest = (int)(devices / known);
        if (!dp) dp = rest;
        else if (!tp) tp = rest;
        else pp = rest;
    } else if (known != devices)
        return lm_fail(2, "--strategy: dp x tp x pp = %ld, but --devices is %ld", known, devices);
    p->dp = dp, p->tp = tp, p->pp = pp, p->zero = zero;
    return 0;
}

static cJSON *plan_json(const adt_lm_plan *p) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "dp", p->dp);
    cJSON_AddNumberToObject(j, "tp", p->tp);
    cJSON_AddNumberToObject(j, "pp", p->pp);
    cJSON_AddNumberToObject(j, "zero", p->zero);
    cJSON_AddNumberToObject(j, "micro_batch", p->micro_batch);
    cJSON_AddNumberToObject(j, "virtual_stages", p->vstages);
    cJSON_AddStringToObject(j, "precision", adt_lm_precision_name(p->precision));
    cJSON_AddStringToObject(j, "recompute", adt_lm_recompute_name(p->recompute));
    return j;
}

static void print_report(const adt_lm_plan *p, const adt_lm_report *r, const char *label, const adt_cluster *c) {
    const double gib = 1024.0 * 1024 * 1024;
    printf("model       %s (shape-level: nothing of its size is built)\n", label);
    printf("plan        dp=%d tp=%d pp=%d zero=%d, micro-batch %d (%d microbatches), %d chunk(s) per stage, %s, "
           "recompute %s\n",
           p->dp, p->tp, p->pp, p->zero, p->micro_batch, r->microbatches, p->vstages,
           adt_lm_precision_name(p->precision), adt_lm_recompute_name(p->recompute));
    printf("predicted   %.4f s per step, %.1f TFLOP/s per device as Narayanan et al. count them (one recomputed\n"
           "            forward included), MFU %.1f%% of %s's %s peak\n",
           r->step_s, r->tflops_per_device, 100 * r->mfu, c->device_kind, adt_lm_precision_name(p->precision));
    printf("time        compute %.4f s, tensor-parallel all-reduces %.4f s, stage transfers %.4f s, bubbles %.4f s,\n"
           "            data-parallel sync %.4f s (%.4f s exposed), optimizer %.4f s\n",
           r->compute_s, r->tp_comm_s, r->p2p_s, r->bubble_s, r->dp_comm_s, r->dp_exposed_s, r->optimizer_s);
    printf("memory      %.2f GiB per device of %.2f: weights %.2f, gradients %.2f, optimizer %.2f, activations %.2f, "
           "logits %.2f%s\n",
           r->peak_mem_bytes / gib, c->memory_bytes / gib, r->weight_bytes / gib, r->grad_bytes / gib,
           r->optim_bytes / gib, r->act_bytes / gib, r->logits_bytes / gib, r->feasible ? "" : "  (DOES NOT FIT)");
}

int cli_plan_lm(const cli_plan_lm_opts *o, const adt_model_cfg *m, const char *label) {
    adt_lm_shape s;
    if (adt_lm_shape_of(m, &s)) return lm_fail(2, "--model %s: %s", label, adt_error_message());
    adt_cluster c;
    if (adt_cluster_load(&c, o->cluster_path)) return lm_fail(2, "--cluster: %s", adt_error_message());
    long devices = o->devices ? o->devices : adt_cluster_devices(&c);
    if (devices > adt_cluster_devices(&c))
        return lm_fail(2, "--devices: %ld, but the cluster '%s' has %d", devices, c.name, adt_cluster_devices(&c));
    adt_lm_plan fx = {.precision = o->precision, .recompute = o->recompute, .micro_batch = (int)o->micro_batch,
                      .vstages = (int)o->vstages, .zero = -1};
    if (fx.precision < 0) fx.precision = c.compute_dtype == ADT_BF16 ? ADT_LM_BF16 : ADT_LM_F32;
    int is_auto = !o->strategy || !strcmp(o->strategy, "auto");
    adt_lm_plan p;
    adt_lm_report r;
    long evaluated = 1;
    double search_s = 0;
    if (is_auto) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = adt_lm_search(&s, &c, (int)devices, (int)o->batch, o->mem_limit, &fx, &p, &r, &evaluated);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        search_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (rc) return lm_fail(2, "--strategy auto: %s", adt_error_message());
    } else {
        p = fx;
        if (parse_strategy(o->strategy, devices, &p)) return 2;
        if (!p.micro_batch) p.micro_batch = 1;
        if (!p.vstages) p.vstages = 1;
        if (p.recompute < 0) p.recompute = ADT_LM_RECOMPUTE_NONE;
        if (adt_lm_cost(&s, &c, (int)o->batch, &p, o->mem_limit, &r)) return lm_fail(2, "%s", adt_error_message());
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "planner", "shapes");
        cJSON_AddNumberToObject(j, "predicted_step_s", r.step_s);
        cJSON_AddNumberToObject(j, "peak_mem_bytes", r.peak_mem_bytes);
        cJSON_AddBoolToObject(j, "feasible", r.feasible);
        cJSON_AddItemToObject(j, "plan", plan_json(&p));
        cJSON_AddNumberToObject(j, "devices", (double)p.dp * p.tp * p.pp);
        cJSON_AddNumberToObject(j, "batch", (double)o->batch);
        cJSON_AddNumberToObject(j, "microbatches", r.microbatches);
        cJSON_AddNumberToObject(j, "params", adt_lm_params(&s));
        cJSON_AddNumberToObject(j, "model_flops_per_step", r.model_flops);
        cJSON_AddNumberToObject(j, "tflops_per_device", r.tflops_per_device);
        cJSON_AddNumberToObject(j, "mfu", r.mfu);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "compute_s", r.compute_s);
        cJSON_AddNumberToObject(t, "tp_comm_s", r.tp_comm_s);
        cJSON_AddNumberToObject(t, "p2p_s", r.p2p_s);
        cJSON_AddNumberToObject(t, "bubble_s", r.bubble_s);
        cJSON_AddNumberToObject(t, "dp_comm_s", r.dp_comm_s);
        cJSON_AddNumberToObject(t, "dp_exposed_s", r.dp_exposed_s);
        cJSON_AddNumberToObject(t, "optimizer_s", r.optimizer_s);
        cJSON_AddItemToObject(j, "time", t);
        cJSON *mm = cJSON_CreateObject();
        cJSON_AddNumberToObject(mm, "weights", r.weight_bytes);
        cJSON_AddNumberToObject(mm, "gradients", r.grad_bytes);
        cJSON_AddNumberToObject(mm, "optimizer", r.optim_bytes);
        cJSON_AddNumberToObject(mm, "activations", r.act_bytes);
        cJSON_AddNumberToObject(mm, "logits", r.logits_bytes);
        cJSON_AddItemToObject(j, "memory_bytes", mm);
        if (is_auto) {
            cJSON_AddNumberToObject(j, "search_s", search_s);
            cJSON_AddNumberToObject(j, "plans_priced", (double)evaluated);
        }
        char *txt = cJSON_Print(j);
        printf("%s\n", txt);
        free(txt);
        cJSON_Delete(j);
        return 0;
    }
    print_report(&p, &r, label, &c);
    if (is_auto) printf("search      %ld plans priced in %.3f s\n", evaluated, search_s);
    return 0;
}
