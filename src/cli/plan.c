/*
 * plan.c - `adtrain plan`: makes an expert plan (dp, zero, tp, pp and their combinations) for a
 * model on a device count, prints what it does (the mesh, the stages, per layer the layouts of
 * its parameters and the signatures of its matrix products, and the boxing bytes each step
 * sends, from the boxing programs the partitioner inserts), and writes it as a plan file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"
#include "adtrain/models.h"
#include "adtrain/planner.h"
#include "cli.h"

typedef struct plan_opts {
    const char *model_path; /* NULL: the built-in gpt-tiny */
    const char *out_path;
    const char *strategy;
    long devices, batch, microbatches;
    adt_optim_kind optimizer;
    int momentum;
    cli_plan_auto_opts a; /* --strategy auto (plan_auto.c) */
    /* the shape-level planner's dimensions (plan_lm.c); given: that planner */
    int precision, recompute, optimizer_given, microbatches_given;
    long micro_batch, vstages;
} plan_opts;

/* A GPT above this many parameters is planned from its shapes even without the shape-level flags:
 * the graph planner builds every layer's nodes and prices them one by one. */
#define PLAN_GRAPH_MAX_PARAMS 1e10

#define plan_fail(...) cli_fail("plan", __VA_ARGS__)

static void plan_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain plan --devices N --strategy S [--model CFG.json] [--batch B] [--microbatches M]\n"
            "                    [--optimizer adamw|sgd|sgd-momentum] [-o PLAN.json]\n"
            "\n"
            "Makes the expert plan of a strategy for a model (default: built-in gpt-tiny) on N devices,\n"
            "prints a summary (mesh, stages, per layer the parameter layouts and matmul signatures, the\n"
            "boxing bytes per step) and with -o writes the plan file (docs/formats.md, \"Plan files\").\n"
            "\n"
            "strategies: a comma-separated list; one degree may be left out and takes the rest\n"
            "  dp[=N]    data parallel: batch split, parameters and optimizer state replicated\n"
            "  zero      with dp: optimizer state, update and stored weights split over dp\n"
            "  tp[=N]    tensor (Megatron) parallel: column/row-split weights\n"
            "  pp[=N]    pipeline stages balanced by FLOPs (use --microbatches)\n"
            "  e.g. dp   zero   tp   dp=2,tp=2   dp=2,pp=2   dp=2,tp=2,zero\n"
            "\n"
            "  --batch B          global samples per step (default 16)\n"
            "  --microbatches M   a step in M microbatches of B/M samples (default 1)\n"
            "  --optimizer K      the optimizer the training graph ends with (default adamw)\n"
            "\n"
            "With --cluster C.json an expert plan is priced on the cluster too (predicted step time and peak\n"
            "memory; --json: only that, as JSON; --explain: where the time goes).\n"
            "\n"
            "--strategy auto searches the plan (pipeline degree, mesh, per-node signatures) with the cost\n"
            "model of a cluster, and prints it next to every expert plan's prediction (a searched plan is\n"
            "chosen over the best expert plan only when predicted at least 2%% faster):\n"
            "  --cluster C.json   the cluster (docs/formats.md \"Cluster files\"; adtrain calibrate writes one)\n"
            "  --devices N        plan for the cluster's first N devices (default: all)\n"
            "  --mem-limit BYTES  memory per device (default: the cluster's)\n"
            "  --max-pp P         largest pipeline degree tried\n"
            "  --json             the predictions as JSON (predicted_step_s, peak_mem_bytes, search_s, experts)\n"
            "  --data KIND:PATH   the data the run will read (as adtrain train --data; default: the same\n"
            "                     default as train): each rank produces its samples before a step's passes,\n"
            "                     timed here per sample and priced by the samples a rank's blocks cover\n"
            "  --input-s S        seconds per sample of --data, instead of timing it: the same price on\n"
            "                     every call (a timing moves 20%% between processes on a shared machine;\n"
            "                     --json reports the figure used as input_per_sample_s)\n"
            "  --explain          where the predicted time goes: compute, each collective, bubbles\n"
            "A DLRM's parameter-server mode is priced beside (--explain, --json \"ps\"; auto chooses it when\n"
            "predicted faster), by default sync with prefetch 1 and the servers searched; its setting:\n"
            "  --mode collective|ps   auto chooses only a collective plan, or the parameter-server mode\n"
            "  --ps-servers S     server ranks (as adtrain train --ps-servers)\n"
            "  --ps-sync MODE     sync, ssp:K or async (as adtrain train --ps-sync)\n"
            "  --ps-prefetch D    steps of rows pulled ahead (as adtrain train --ps-prefetch)\n"
            "\n"
            "GPT models at cluster scale (shape-level planner: nothing of the model's size is built; used with\n"
            "any of these flags, or for a GPT of more than 1e10 parameters; --cluster required):\n"
            "  --strategy dp=D,tp=T,pp=P[,zero=K] | auto   degrees (one may be left out), ZeRO stage 0-3\n"
            "  --precision f32|bf16|f16   compute dtype, fp32 master weights and optimizer state below f32\n"
            "                     (default: the cluster's compute_dtype)\n"
            "  --recompute none|selective|full   activation recomputation (auto: searched)\n"
            "  --micro-batch b    samples per microbatch (auto: searched; a given strategy: 1)\n"
            "  --virtual-stages v model chunks per pipeline stage, interleaved 1F1B (auto: searched; else 1)\n"
            "  --batch B          global batch in sequences of n_ctx tokens\n"
            "\n"
            "exit status: 0 done, 1 failure writing the file, 2 bad flag, config or a strategy that\n"
            "cannot apply (the message says why)\n");
}

static int plan_apply(void *opts, const char *f, const char *v) {
    plan_opts *o = opts;
    if (!strcmp(f, "--model")) o->model_path = v;
    else if (!strcmp(f, "-o") || !strcmp(f, "--output")) o->out_path = v;
    else if (!strcmp(f, "--strategy")) o->strategy = v;
    else if (!strcmp(f, "--devices")) return cli_parse_long("plan", f, v, 1, 1 << 20, &o->devices);
    else if (!strcmp(f, "--batch")) return cli_parse_long("plan", f, v, 1, 1 << 20, &o->batch);
    else if (!strcmp(f, "--microbatches")) {
        o->microbatches_given = 1;
        return cli_parse_long("plan", f, v, 1, 1 << 20, &o->microbatches);
    } else if (!strcmp(f, "--precision")) {
        if ((o->precision = adt_lm_precision_parse(v)) < 0)
            return plan_fail(2, "--precision: expected 'f32', 'bf16' or 'f16', got '%s'", v);
    } else if (!strcmp(f, "--recompute")) {
        if ((o->recompute = adt_lm_recompute_parse(v)) < 0)
            return plan_fail(2, "--recompute: expected 'none', 'selective' or 'full', got '%s'", v);
    } else if (!strcmp(f, "--micro-batch")) return cli_parse_long("plan", f, v, 1, 1 << 20, &o->micro_batch);
    else if (!strcmp(f, "--virtual-stages")) return cli_parse_long("plan", f, v, 1, 1024, &o->vstages);
    else if (!strcmp(f, "--optimizer")) {
        o->optimizer_given = 1;
        if (!strcmp(v, "adamw")) o->optimizer = ADT_OPTIM_ADAMW, o->momentum = 0;
        else if (!strcmp(v, "sgd")) o->optimizer = ADT_OPTIM_SGD, o->momentum = 0;
        else if (!strcmp(v, "sgd-momentum")) o->optimizer = ADT_OPTIM_SGD, o->momentum = 1;
        else return plan_fail(2, "--optimizer: expected 'adamw', 'sgd' or 'sgd-momentum', got '%s'", v);
    } else if (!strcmp(f, "--cluster")) o->a.cluster_path = v;
    else if (!strcmp(f, "--data")) o->a.data = v;
    else if (!strcmp(f, "--input-s")) return cli_double("plan", f, v, 0, 10, &o->a.input_s) ? 2 : 0;
    else if (!strcmp(f, "--mem-limit")) return cli_double("plan", f, v, 1, 1e18, &o->a.mem_limit) ? 2 : 0;
    else if (!strcmp(f, "--max-pp")) return cli_parse_long("plan", f, v, 1, ADT_PLAN_MAX_STAGES, &o->a.max_pp);
    else if (!strcmp(f, "--ps-servers")) return cli_parse_long("plan", f, v, 1, 1 << 20, &o->a.ps_servers);
    else if (!strcmp(f, "--ps-prefetch")) return cli_parse_long("plan", f, v, 0, 64, &o->a.ps_prefetch);
    else if (!strcmp(f, "--ps-sync")) o->a.ps_sync = v;
    else if (!strcmp(f, "--mode")) {
        if (strcmp(v, "collective") && strcmp(v, "ps"))
            return plan_fail(2, "--mode: expected 'collective' or 'ps' (the mode --strategy auto chooses in), got '%s'", v);
        o->a.mode = v;
    }
    else if (!strcmp(f, "--json")) o->a.json = 1;
    else if (!strcmp(f, "--explain")) o->a.explain = 1;
    else {
        return plan_fail(2, "unknown flag '%s' (see adtrain plan --help)", f);
    }
    return 0;
}

/* ---- the summary ------------------------------------------------------------------------------- */

static const char *bytes_str(double b, char *buf, size_t n) {
    if (b >= 1024.0 * 1024.0) snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024.0));
    else if (b >= 1024.0) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%.0f B", b);
    return buf;
}

/* What one rank's boxing sends per step, by layer tag and by kind (rank 0 of stage 0). */
typedef struct boxing_tally {
    int *steps;     /* [n_layers] */
    double *bytes;  /* [n_layers] */
    int kind_steps[ADT_BOXING_KIND_COUNT];
    double kind_bytes[ADT_BOXING_KIND_COUNT];
    double time;
} boxing_tally;

static int tally_boxing(const adt_plan *p, const adt_graph *g, boxing_tally *t) {
    int *ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *ranks);
    adt_dist_plan dp = adt_plan_dist(p, 0, ranks);
    int coord[ADT_MAX_MESH_DIMS] = {0};
    adt_dist_local loc;
    int rc = adt_dist_partition(g, &dp, coord, &loc);
    if (!rc) {
        for (int i = 0; i < loc.g->n_nodes; i++) {
            const adt_node *n = &loc.g->nodes[i];
            adt_boxing_step st;
            if (n->op != ADT_OP_BOXING || adt_boxing_node_step(loc.g, n, &dp.mesh, &st)) continue;
            int tag = n->layer_tag >= 0 && n->layer_tag < p->n_layers ? n->layer_tag : 0;
            t->steps[tag]++;
            t->bytes[tag] += st.bytes;
            t->kind_steps[st.kind]++;
            t->kind_bytes[st.kind] += st.bytes;
        }
        t->time = loc.boxing_time;
        adt_dist_local_free(&loc);
    }
    free(ranks);
    return rc;
}

static int is_product(int op) { return op == ADT_OP_MATMUL || op == ADT_OP_CONV2D || op == ADT_OP_EMBEDDING; }

static void print_layer(const adt_plan *p, const adt_graph *g, int t) {
    char sh[64], lay[128], sig[1024];
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM || val->layer_tag != t) continue;
        printf("    %-34s %-14s %s\n", val->name, adt_shape_str(&val->shape, sh, sizeof sh),
               adt_ndsbp_str(&p->leaf_sbp[v], lay, sizeof lay));
    }
    for (int i = 0; i < g->n_forward_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->layer_tag != t || !is_product(n->op)) continue;
        printf("    %-34s %s\n", n->name, adt_nd_sig_str(&p->node_sig[i], n->n_in, n->n_out, sig, sizeof sig));
    }
}

static void print_summary(const adt_plan *p, const adt_graph *g, const char *label, const boxing_tally *t) {
    char b1[32], b2[64];
    printf("strategy    %s on %d devices\n", p->strategy, p->mesh.nranks);
    printf("mesh        %s, axes", adt_mesh_str(&p->mesh, b2, sizeof b2));
    for (int a = 0; a < p->mesh.ndim; a++) printf("%s%s", a ? "," : " ", p->axis[a]);
    printf(", intra-node axis %s, ranks", p->mesh.intra_axis >= 0 ? p->axis[p->mesh.intra_axis] : "none");
    for (int i = 0; i < p->mesh.nranks && i < 32; i++) printf(" %d", p->mesh.ranks[i]);
    printf("%s\n", p->mesh.nranks > 32 ? " ..." : "");
    printf("model       %s, %lld parameters, global batch %d in %d microbatch(es), optimizer %s%s\n", label,
           (long long)adt_graph_param_count(g), p->batch, p->microbatches, p->optim == ADT_OPTIM_ADAMW ? "adamw" : "sgd",
           p->momentum ? " with momentum" : "");
    printf("graph       %d nodes, %d values, %d layers, checksum %08x\n", p->n_nodes, p->n_values, p->n_layers,
           (unsigned)p->checksum);
    if (p->pp_axis < 0) printf("pipeline    none\n");
    else {
        double *f = adt_calloc((size_t)p->n_stages, sizeof *f);
        for (int i = 0; i < g->n_nodes; i++) f[adt_plan_stage_of(p, g->nodes[i].layer_tag)] += adt_node_flops(g, &g->nodes[i]);
        printf("pipeline    %d stages over axis %s:", p->n_stages, p->axis[p->pp_axis]);
        for (int s = 0; s < p->n_stages; s++)
            printf("%s layers %d-%d (%.4g GFLOP/microbatch)", s ? "," : "", p->stage_first[s], p->stage_last[s], f[s] * 1e-9);
        printf("\n");
        free(f);
    }
    int total_steps = 0;
    double total_bytes = 0;
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) total_steps += t->kind_steps[k], total_bytes += t->kind_bytes[k];
    printf("boxing      rank 0 per %s: %d steps sending %s, predicted %.3g ms\n",
           p->microbatches > 1 ? "microbatch" : "step", total_steps, bytes_str(total_bytes, b1, sizeof b1), t->time * 1e3);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        if (t->kind_steps[k])
            printf("            %-15s %4d steps %s\n", adt_boxing_kind_name(k), t->kind_steps[k],
                   bytes_str(t->kind_bytes[k], b1, sizeof b1));
    int *group_of = adt_malloc((size_t)p->n_layers * sizeof *group_of);
    adt_plan_layer_groups(p, g, group_of);
    printf("\nper layer: parameter layouts, forward matrix products (inputs -> outputs), boxing per step\n");
    for (int l = 0; l < p->n_layers; l++) {
        printf("layer %d (stage %d): boxing %d steps, %s", l, adt_plan_stage_of(p, l), t->steps[l],
               bytes_str(t->bytes[l], b1, sizeof b1));
        if (group_of[l] != l) printf("; layouts as layer %d\n", group_of[l]);
        else {
            printf("\n");
            print_layer(p, g, l);
        }
    }
    free(group_of);
}

/* ---- the command --------------------------------------------------------------------------------- */

static int make_plan(const plan_opts *o, const adt_model_cfg *m, const char *label) {
    if (o->batch % o->microbatches)
        return plan_fail(2, "--microbatches: %ld does not divide --batch %ld", o->microbatches, o->batch);
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rc = 0;
    adt_plan p;
    memset(&p, 0, sizeof p);
    boxing_tally t = {0};
    if (adt_model_build(g, m, (int)(o->batch / o->microbatches), &io)) {
        rc = plan_fail(2, "--model %s: %s", label, adt_error_message());
        goto done;
    }
    adt_optim_cfg oc = o->optimizer == ADT_OPTIM_SGD ? adt_optim_sgd(o->momentum ? 0.9f : 0.0f, 0.0f)
                                                     : adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f);
    adt_graph_backward(g, io.loss);
    adt_graph_optimizer(g, &oc);
    if (adt_graph_error(g)) {
        rc = plan_fail(1, "building the training graph: %s", adt_graph_error_message(g));
        goto done;
    }
    adt_expert_opts eo = {.strategy = o->strategy, .devices = (int)o->devices, .batch = (int)o->batch,
                          .microbatches = (int)o->microbatches};
    if (adt_expert_plan(g, m, &eo, &p)) {
        rc = plan_fail(2, "--strategy %s on --devices %ld: %s", o->strategy, o->devices, adt_error_message());
        goto done;
    }
    t.steps = adt_calloc((size_t)p.n_layers, sizeof *t.steps);
    t.bytes = adt_calloc((size_t)p.n_layers, sizeof *t.bytes);
    if (tally_boxing(&p, g, &t)) {
        rc = plan_fail(1, "partitioning the plan: %s", adt_error_message());
        goto done;
    }
    if (!o->a.json) print_summary(&p, g, label, &t);
    if (o->a.cluster_path && (rc = cli_plan_price(&o->a, &p, g))) goto done;
    if (o->out_path) {
        if (adt_plan_save(&p, g, o->out_path)) rc = plan_fail(1, "-o: %s", adt_error_message());
        else if (!o->a.json) printf("\nwrote       %s\n", o->out_path);
    }
done:
    free(t.steps);
    free(t.bytes);
    adt_plan_free(&p);
    adt_graph_free(g);
    return rc;
}

/* The summary of a bound plan (auto plans print it too). */
int cli_plan_print(const adt_plan *p, const adt_graph *g, const char *label) {
    boxing_tally t = {0};
    t.steps = adt_calloc((size_t)p->n_layers, sizeof *t.steps);
    t.bytes = adt_calloc((size_t)p->n_layers, sizeof *t.bytes);
    int rc = tally_boxing(p, g, &t);
    if (rc) rc = plan_fail(1, "partitioning the plan: %s", adt_error_message());
    else print_summary(p, g, label, &t);
    free(t.steps);
    free(t.bytes);
    return rc;
}

/* The shape-level planner: flags that cannot act there are refused. */
static int plan_shapes(const plan_opts *o, const adt_model_cfg *m, const char *label) {
    const char *given = o->precision >= 0 ? "--precision" : o->recompute >= 0 ? "--recompute"
                        : o->micro_batch                  ? "--micro-batch"
                        : o->vstages                      ? "--virtual-stages"
                                                          : "a GPT of this size";
    if (m->type != ADT_MODEL_GPT)
        return plan_fail(2, "%s: the shape-level planner prices GPT models; --model %s is '%s'", given, label,
                         adt_model_type_name(m->type));
    if (!o->a.cluster_path) return plan_fail(2, "%s goes with --cluster (the plan is priced on a cluster)", given);
    const char *refused = o->out_path ? "-o" : o->a.data ? "--data" : o->a.input_s >= 0 ? "--input-s"
                          : o->a.max_pp ? "--max-pp" : o->a.explain ? "--explain" : o->microbatches_given ? "--microbatches"
                          : o->optimizer_given ? "--optimizer" : o->a.ps_servers ? "--ps-servers"
                          : o->a.ps_sync ? "--ps-sync" : o->a.ps_prefetch >= 0 ? "--ps-prefetch"
                          : o->a.mode ? "--mode" : NULL;
    if (refused)
        return plan_fail(2, "%s cannot act with the shape-level planner (%s): it writes no plan file, prices Adam in "
                         "mixed precision and takes --micro-batch for the microbatch size", refused, given);
    cli_plan_lm_opts lo = {.cluster_path = o->a.cluster_path, .strategy = o->strategy, .devices = o->devices,
                           .batch = o->batch, .micro_batch = o->micro_batch, .vstages = o->vstages,
                           .mem_limit = o->a.mem_limit, .precision = o->precision, .recompute = o->recompute,
                           .json = o->a.json};
    return cli_plan_lm(&lo, m, label);
}

int cli_plan(int argc, char **argv) {
    plan_opts o = {.batch = 16, .microbatches = 1, .optimizer = ADT_OPTIM_ADAMW, .a = {.input_s = -1, .ps_prefetch = -1},
                   .precision = -1, .recompute = -1};
    static const char *const switches[] = {"--json", "--explain", NULL};
    int rc = cli_parse_flags_switches("plan", argc, argv, plan_usage, plan_apply, &o, switches);
    if (rc) return rc < 0 ? 0 : rc;
    o.a.builtin_model = !o.model_path;
    if (o.precision >= 0 || o.recompute >= 0 || o.micro_batch || o.vstages) {
        adt_model_cfg sm;
        char slabel[320];
        if ((rc = cli_load_model("plan", o.model_path, &sm, slabel, sizeof slabel))) return rc;
        return plan_shapes(&o, &sm, slabel);
    }
    if (o.model_path) {
        adt_model_cfg sm;
        char slabel[320];
        if ((rc = cli_load_model("plan", o.model_path, &sm, slabel, sizeof slabel))) return rc;
        if (sm.type == ADT_MODEL_GPT && (double)adt_model_cfg_param_count(&sm) > PLAN_GRAPH_MAX_PARAMS)
            return plan_shapes(&o, &sm, slabel);
    }
    if (o.a.mode && !(o.strategy && !strcmp(o.strategy, "auto")))
        return plan_fail(2, "--mode goes with --strategy auto (the mode it chooses in)");
    if ((o.a.ps_servers || o.a.ps_sync || o.a.ps_prefetch >= 0) && !o.a.cluster_path)
        return plan_fail(2, "%s goes with --cluster (the parameter-server mode is priced on a cluster)",
                         o.a.ps_servers ? "--ps-servers" : o.a.ps_sync ? "--ps-sync" : "--ps-prefetch");
    if ((o.a.data || o.a.input_s >= 0) && !o.a.cluster_path && !(o.strategy && !strcmp(o.strategy, "auto")))
        return plan_fail(2, "%s goes with --cluster (the input is priced on a cluster)", o.a.data ? "--data" : "--input-s");
    if (o.strategy && !strcmp(o.strategy, "auto")) {
        adt_model_cfg am;
        char alabel[320];
        if ((rc = cli_load_model("plan", o.model_path, &am, alabel, sizeof alabel))) return rc;
        o.a.devices = o.devices, o.a.batch = o.batch, o.a.optimizer = o.optimizer, o.a.momentum = o.momentum;
        o.a.out_path = o.out_path;
        return cli_plan_auto(&o.a, &am, alabel);
    }
    if (!o.devices) return plan_fail(2, "--devices: missing; expected the number of devices to plan for");
    if (!o.strategy) return plan_fail(2, "--strategy: missing; expected auto, or e.g. dp, zero, tp, dp=2,tp=2 or dp=2,pp=2");
    if (o.a.mem_limit > 0 || o.a.max_pp) return plan_fail(2, "--mem-limit and --max-pp go with --strategy auto");
    if ((o.a.json || o.a.explain) && !o.a.cluster_path)
        return plan_fail(2, "--json and --explain go with --cluster (the predictions on a cluster)");
    adt_model_cfg m;
    char label[320];
    if ((rc = cli_load_model("plan", o.model_path, &m, label, sizeof label))) return rc;
    return make_plan(&o, &m, label);
}
