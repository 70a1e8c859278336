/*
 * test_dist_expert.c - the expert plans (dp, zero, tp, pp and combinations) for every model
 * family: each plan partitions, and run through the in-memory threaded executor (dist_world.h)
 * reproduces the serial run's per-step losses (1e-5 relative) and weights and optimizer state;
 * the Megatron plan splits attention by heads and communicates as Megatron does (two all-reduces
 * per transformer block in the forward pass, no gather of qkv); ZeRO keeps 1/dp of the optimizer state per rank; pipeline stages are balanced
 * (checked against every contiguous split); strategies that cannot apply are refused with the
 * reason.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "dist_world.h"

#define BATCH 6

/* ---- the model families ---------------------------------------------------------------------- */

typedef struct family {
    const char *name;
    const char *json;
} family;

static const family families[] = {
    /* 12 heads: every tp degree of the cases (2, 3, 4) gives each rank whole heads */
    {"gpt", "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":16,\"n_layer\":2,\"n_embd\":48,\"n_head\":12}"},
    {"mlp", "{\"type\":\"mlp\",\"sizes\":[9,11,13,5],\"activation\":\"gelu\"}"},
    {"vgg", "{\"type\":\"vgg\",\"in_channels\":2,\"height\":8,\"width\":8,\"blocks\":[[4],[6]],\"fc\":[10],"
            "\"classes\":5}"},
    {"dlrm", "{\"type\":\"dlrm\",\"n_dense\":5,\"table_rows\":[7,9,11],\"emb_dim\":4,\"bottom\":[6,4],\"top\":[8,1]}"},
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

typedef struct fmodel {
    adt_model_cfg cfg;
    adt_graph *g;
    adt_model_io io;
} fmodel;

static void build(fmodel *md, const family *f, int batch) {
    CHECK(adt_model_cfg_parse(&md->cfg, f->json, f->name) == ADT_OK, "%s", adt_error_message());
    md->g = adt_graph_create();
    adt_model_build(md->g, &md->cfg, batch, &md->io);
    adt_graph_backward(md->g, md->io.loss);
    /* a large eps keeps AdamW's step linear in small gradients, whose rounding differs by layout */
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.95f, 0.1f, 0.01f);
    adt_graph_optimizer(md->g, &oc);
    CHECK(!adt_graph_error(md->g), "%s: %s", f->name, adt_graph_error_message(md->g));
}

/* Random data of one step in each family's ranges (token ids, class labels, per-table rows,
 * click labels). */
static void fill_model(void *ctx, const adt_graph *g, int v, int64_t i, void *e) {
    const fmodel *md = ctx;
    const adt_value *val = &g->values[v];
    float *f = e;
    int32_t *d = e;
    if (md->cfg.type == ADT_MODEL_GPT && val->dtype == ADT_I32) *d = irand(0, md->cfg.gpt.vocab_size - 1);
    else if (md->cfg.type == ADT_MODEL_DLRM && val->dtype == ADT_I32) /* column t: a row of table t */
        *d = irand(0, md->cfg.dlrm.table_rows[i % val->shape.dim[val->shape.ndim - 1]] - 1);
    else if (md->cfg.type == ADT_MODEL_DLRM && val->role == ADT_ROLE_LABEL) *f = (float)irand(0, 1);
    else if (val->dtype == ADT_I32) {
        const adt_shape *ls = &g->values[md->io.logits].shape;
        *d = irand(0, (int)ls->dim[ls->ndim - 1] - 1);
    } else *f = urand(-1, 1);
}

static void feed_model(void *ctx, const adt_graph *g, void **feed) { world_feed_fill(g, feed, fill_model, ctx); }

static int make_plan(const fmodel *md, const char *strategy, int devices, int micro, adt_plan *p) {
    adt_expert_opts o = {.strategy = strategy, .devices = devices, .batch = BATCH * (micro ? micro : 1),
                         .microbatches = micro};
    return adt_expert_plan(md->g, &md->cfg, &o, p);
}

/* ---- every plan against the serial run ---------------------------------------------------------- */

typedef struct case_ {
    const char *strategy;
    int devices;
} case_;

static const case_ cases[] = {
    {"dp", 2}, {"dp", 3}, {"dp", 4}, {"zero", 2}, {"zero", 3}, {"zero", 4}, {"tp", 2}, {"tp", 3}, {"tp", 4},
    {"dp=2,tp=2", 4}, {"dp=2,tp=2,zero", 4}, {"tp=2,dp", 4},
};

static void test_plans_match_serial(void) {
    world_check_stats rs = {0};
    int runs = 0, matched = 0;
    for (int f = 0; f < N_FAMILIES; f++) {
        fmodel md;
        build(&md, &families[f], BATCH);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            adt_plan p;
            char what[128];
            snprintf(what, sizeof what, "%s, %s on %d devices", families[f].name, cases[c].strategy, cases[c].devices);
            int rc = make_plan(&md, cases[c].strategy, cases[c].devices, 0, &p);
            CHECK(rc == ADT_OK, "%s: %s", what, adt_error_message());
            if (rc) continue;
            CHECK(p.mesh.nranks == cases[c].devices, "%s: mesh of %d ranks", what, p.mesh.nranks);
            int ranks[64];
            adt_dist_plan dp = adt_plan_dist(&p, 0, ranks);
            /* weights and AdamW moments after each of 3 steps, at the scale each reached
             * (a sharded plan sums gradients in another order, so a moment that nearly
             * cancels keeps its operands' rounding; a bias's gradient that nearly cancels
             * over the batch at step 1 has no earlier scale and can differ by a few 1e-5) */
            world_check_opts o = {.steps = 3, .lr = 0.05f, .tol = 1e-4, .loss_tol = 1e-5, .seed = g_seed};
            runs++;
            matched += world_check_plan(md.g, &dp, feed_model, &md, &o, &rs, what);
            adt_plan_free(&p);
        }
        adt_graph_free(md.g);
    }
    printf("expert plans: %d of %d (4 families x %zu strategies) match the serial run over %d steps; worst loss error "
           "%.2e (relative), worst state error %.2e\n",
           matched, runs, sizeof cases / sizeof cases[0], rs.steps_checked, rs.worst_loss, rs.worst);
    printf("  steps run by kind:");
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) printf(" %s %d", adt_boxing_kind_name(k), rs.kinds[k]);
    printf("\n");
    CHECK(runs == N_FAMILIES * (int)(sizeof cases / sizeof cases[0]) && matched == runs, "%d of %d plans matched",
          matched, runs);
}

/* ---- what each strategy's communication is ------------------------------------------------------- */

/* Boxing steps of rank 0's local graph, by layer tag, pass (0 forward, 1 backward and update),
 * mesh axis and kind. */
typedef struct boxing_count {
    int n[16][2][ADT_MAX_MESH_DIMS][ADT_BOXING_KIND_COUNT];
} boxing_count;

static int count_boxing(const adt_graph *g, const adt_plan *p, boxing_count *bc, adt_dist_local *keep) {
    memset(bc, 0, sizeof *bc);
    int ranks[64];
    adt_dist_plan dp = adt_plan_dist(p, 0, ranks);
    int coord[ADT_MAX_MESH_DIMS] = {0};
    adt_dist_local loc;
    int rc = adt_dist_partition(g, &dp, coord, &loc);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc) return rc;
    for (int i = 0; i < loc.g->n_nodes; i++) {
        const adt_node *n = &loc.g->nodes[i];
        adt_boxing_step st;
        if (n->op != ADT_OP_BOXING || adt_boxing_node_step(loc.g, n, &dp.mesh, &st)) continue;
        if (n->layer_tag < 16) bc->n[n->layer_tag][i >= loc.g->n_forward_nodes][st.mesh_axis][st.kind]++;
    }
    if (keep) *keep = loc;
    else adt_dist_local_free(&loc);
    return ADT_OK;
}

static int find_node_reading(const adt_graph *g, const char *param, int op) {
    int v = adt_graph_find_value(g, param);
    for (int i = 0; i < g->n_forward_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++)
            if (g->nodes[i].in[j] == v && g->nodes[i].op == op) return i;
    return -1;
}

/* Megatron: column-parallel c_attn and c_fc (weights split on their output axis, outputs split on
 * the feature axis, no communication), attention split by heads (c_attn's [C,3,C] split on its
 * last axis gives each rank whole heads of q, k and v: qkv [B,T,3,C] S(3) in, y S(2) and the
 * probabilities S(1) out), row-parallel c_proj (inputs split, outputs partial), and per
 * transformer block in the forward pass exactly two all-reduces on the tp axis and nothing else:
 * no gather of qkv. With tp alone, the backward pass of a block all-reduces the two activation
 * gradients that Megatron does and the gradients of the replicated parameters, nothing else. */
static int is_split(const adt_sbp *s, int axis) { return s->kind == ADT_SBP_S && s->axis == axis; }

static void test_megatron(void) {
    fmodel md;
    build(&md, &families[0], BATCH);
    const char *strategies[] = {"tp=2", "dp=2,tp=2", "tp=3", "tp=4"};
    int devices[] = {2, 4, 3, 4};
    for (int s = 0; s < 4; s++) {
        adt_plan p;
        int rc = make_plan(&md, strategies[s], devices[s], 0, &p);
        CHECK(rc == ADT_OK, "%s: %s", strategies[s], adt_error_message());
        if (rc) continue;
        int tp = p.mesh.ndim - 1; /* tp is the inner axis */
        const adt_graph *g = md.g;
        for (int l = 0; l < md.cfg.gpt.n_layer; l++) {
            char name[64];
            const char *col[] = {"attn.c_attn", "mlp.c_fc"}, *row[] = {"attn.c_proj", "mlp.c_proj"};
            for (int k = 0; k < 2; k++) {
                /* column-parallel: the weight on its last (output) axis, [C,3,C] or [C,4C] */
                snprintf(name, sizeof name, "h.%d.%s.weight", l, col[k]);
                int v = adt_graph_find_value(g, name), i = find_node_reading(g, name, ADT_OP_MATMUL);
                int last = v >= 0 ? g->values[v].shape.ndim - 1 : -1;
                CHECK(v >= 0 && is_split(&p.leaf_sbp[v].s[tp], last), "%s: %s is not split on its output axis",
                      strategies[s], name);
                int out_last = i >= 0 ? g->values[g->nodes[i].out[0]].shape.ndim - 1 : -1;
                CHECK(i >= 0 && p.node_sig[i].in[0].s[tp].kind == ADT_SBP_B && is_split(&p.node_sig[i].out[0].s[tp], out_last),
                      "%s: %s's matmul is not column-parallel", strategies[s], name);
                snprintf(name, sizeof name, "h.%d.%s.bias", l, col[k]);
                v = adt_graph_find_value(g, name);
                CHECK(v >= 0 && is_split(&p.leaf_sbp[v].s[tp], g->values[v].shape.ndim - 1),
                      "%s: %s is not split with its layer's output", strategies[s], name);
                snprintf(name, sizeof name, "h.%d.%s.weight", l, row[k]);
                v = adt_graph_find_value(g, name), i = find_node_reading(g, name, ADT_OP_MATMUL);
                CHECK(v >= 0 && is_split(&p.leaf_sbp[v].s[tp], 0), "%s: %s is not split on its input axis", strategies[s],
                      name);
                CHECK(i >= 0 && p.node_sig[i].in[0].s[tp].kind == ADT_SBP_S && p.node_sig[i].out[0].s[tp].kind == ADT_SBP_P,
                      "%s: %s's matmul is not row-parallel", strategies[s], name);
            }
        }
        int heads = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const adt_nd_sig *sg = &p.node_sig[i];
            if (g->nodes[i].op == ADT_OP_ATTENTION)
                heads += is_split(&sg->in[0].s[tp], 3) && is_split(&sg->out[0].s[tp], 2) && is_split(&sg->out[1].s[tp], 1);
            if (g->nodes[i].op == ADT_OP_ATTENTION_BWD) /* dy, qkv, att -> dqkv */
                heads += is_split(&sg->in[0].s[tp], 2) && is_split(&sg->in[1].s[tp], 3) && is_split(&sg->in[2].s[tp], 1) &&
                         is_split(&sg->out[0].s[tp], 3);
        }
        CHECK(heads == 2 * md.cfg.gpt.n_layer, "%s: %d of %d attention nodes (forward and backward) split by heads",
              strategies[s], heads, 2 * md.cfg.gpt.n_layer);
        boxing_count bc;
        if (!count_boxing(g, &p, &bc, NULL)) {
            for (int l = 1; l <= md.cfg.gpt.n_layer; l++) {
                int *f = bc.n[l][0][tp];
                CHECK(f[ADT_BOXING_ALL_REDUCE] == 2, "%s: block %d: %d all-reduces in the forward pass, Megatron has 2",
                      strategies[s], l - 1, f[ADT_BOXING_ALL_REDUCE]);
                CHECK(f[ADT_BOXING_ALL_GATHER] == 0 && f[ADT_BOXING_REDUCE_SCATTER] == 0 && f[ADT_BOXING_ALL_TO_ALL] == 0,
                      "%s: block %d: forward all-gathers %d (qkv stays split by heads: 0), reduce-scatters %d, "
                      "all-to-alls %d", strategies[s], l - 1, f[ADT_BOXING_ALL_GATHER], f[ADT_BOXING_REDUCE_SCATTER],
                      f[ADT_BOXING_ALL_TO_ALL]);
                int *b = bc.n[l][1][tp];
                if (p.mesh.ndim == 1) { /* tp alone: the backward pass mirrors the forward's */
                    int whole = 0; /* gradients of the block's replicated parameters, each all-reduced */
                    for (int v = 0; v < g->n_values; v++)
                        whole += g->values[v].role == ADT_ROLE_PARAM && g->values[v].layer_tag == l &&
                                 p.leaf_sbp[v].s[tp].kind == ADT_SBP_B;
                    CHECK(b[ADT_BOXING_ALL_REDUCE] == 2 + whole && b[ADT_BOXING_ALL_GATHER] == 0 &&
                              b[ADT_BOXING_REDUCE_SCATTER] == 0 && b[ADT_BOXING_ALL_TO_ALL] == 0,
                          "%s: block %d: backward all-reduces %d (expected 2 + %d replicated gradients), all-gathers %d, "
                          "reduce-scatters %d, all-to-alls %d (expected none)", strategies[s], l - 1,
                          b[ADT_BOXING_ALL_REDUCE], whole, b[ADT_BOXING_ALL_GATHER], b[ADT_BOXING_REDUCE_SCATTER],
                          b[ADT_BOXING_ALL_TO_ALL]);
                }
                if (s == 0)
                    printf("megatron %s block %d: forward all_reduce %d all_gather %d; backward all_reduce %d "
                           "reduce_scatter %d all_gather %d\n", strategies[s], l - 1, f[ADT_BOXING_ALL_REDUCE],
                           f[ADT_BOXING_ALL_GATHER], b[ADT_BOXING_ALL_REDUCE], b[ADT_BOXING_REDUCE_SCATTER],
                           b[ADT_BOXING_ALL_GATHER]);
                if (p.mesh.ndim == 2) /* dp: nothing in the forward pass, gradients all-reduced */
                    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
                        CHECK(k == ADT_BOXING_SLICE || !bc.n[l][0][0][k], "%s: block %d: forward %s on the dp axis",
                              strategies[s], l - 1, adt_boxing_kind_name(k));
            }
        }
        adt_plan_free(&p);
    }
    adt_graph_free(md.g);
}

/* Data parallel: no communication in the forward pass; in the backward pass one all-reduce per
 * parameter gradient and nothing else. */
static void test_dp_communication(void) {
    for (int f = 0; f < N_FAMILIES; f++) {
        fmodel md;
        build(&md, &families[f], BATCH);
        adt_plan p;
        int rc = make_plan(&md, "dp", 3, 0, &p);
        CHECK(rc == ADT_OK, "%s", adt_error_message());
        boxing_count bc;
        if (!rc && !count_boxing(md.g, &p, &bc, NULL)) {
            int fwd = 0, ar = 0, other = 0;
            for (int l = 0; l < 16; l++)
                for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) {
                    if (k == ADT_BOXING_SLICE) continue; /* local */
                    fwd += bc.n[l][0][0][k];
                    if (k == ADT_BOXING_ALL_REDUCE) ar += bc.n[l][1][0][k];
                    else other += bc.n[l][1][0][k];
                }
            int params = 0;
            for (int v = 0; v < md.g->n_values; v++) params += md.g->values[v].role == ADT_ROLE_PARAM;
            CHECK(fwd == 0 && ar == params && other == 0,
                  "%s dp: forward steps %d (expected 0), backward all-reduces %d (expected one per parameter: %d), "
                  "other backward steps %d", families[f].name, fwd, ar, params, other);
        }
        if (!rc) adt_plan_free(&p);
        adt_graph_free(md.g);
    }
}

/* Optimizer-state elements rank r holds of each state, under a plan (all ranks partitioned). */
static int64_t *state_held(const fmodel *md, const adt_plan *p) {
    int ranks[64];
    adt_dist_plan dp = adt_plan_dist(p, 0, ranks);
    int64_t *held = calloc((size_t)dp.mesh.nranks * (size_t)md->g->n_values, sizeof *held);
    for (int r = 0; r < dp.mesh.nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(&dp.mesh, r, c);
        adt_dist_local loc;
        CHECK(adt_dist_partition(md->g, &dp, c, &loc) == ADT_OK, "%s", adt_error_message());
        for (int v = 0; v < md->g->n_values && loc.g; v++)
            if (md->g->values[v].role == ADT_ROLE_OPT_STATE)
                held[(size_t)r * md->g->n_values + v] = adt_shape_numel(&loc.g->values[loc.value[v]].shape);
        adt_dist_local_free(&loc);
    }
    return held;
}

/* ZeRO divides the optimizer state by dp: against the same plan without zero, every state is
 * held dp times less over all ranks (each element once per tp block instead of once per rank),
 * and every rank holds its 1/dp block of what it held (within one slice of the split axis for
 * uneven splits). Only a state no axis of which has dp elements stays whole. Gradients arrive by
 * reduce-scatter. */
static void test_zero_memory(void) {
    const char *zero[] = {"zero", "zero", "dp=2,tp=2,zero"}, *plain[] = {"dp", "dp", "dp=2,tp=2"};
    int devices[] = {2, 3, 4};
    for (int f = 0; f < N_FAMILIES; f++) {
        fmodel md;
        build(&md, &families[f], BATCH);
        for (int s = 0; s < 3; s++) {
            adt_plan pz, pn;
            int rc = make_plan(&md, zero[s], devices[s], 0, &pz);
            CHECK(rc == ADT_OK, "%s", adt_error_message());
            if (rc) continue;
            rc = make_plan(&md, plain[s], devices[s], 0, &pn);
            CHECK(rc == ADT_OK, "%s", adt_error_message());
            if (rc) {
                adt_plan_free(&pz);
                continue;
            }
            int n_dp = pz.mesh.dim[0], nr = pz.mesh.nranks, nv = md.g->n_values; /* dp is the outer axis */
            int64_t *z = state_held(&md, &pz), *n = state_held(&md, &pn);
            int64_t sum_z = 0, sum_n = 0, whole = 0;
            double worst_rank = 0;
            for (int v = 0; v < nv; v++) {
                const adt_value *val = &md.g->values[v];
                if (val->role != ADT_ROLE_OPT_STATE) continue;
                int64_t tz = 0, tn = 0;
                for (int r = 0; r < nr; r++) tz += z[(size_t)r * nv + v], tn += n[(size_t)r * nv + v];
                sum_z += tz, sum_n += tn;
                const adt_ndsbp *lay = &pz.leaf_sbp[v];
                if (lay->s[0].kind != ADT_SBP_S) {
                    whole += tz;
                    int fits = 0;
                    for (int k = 0; k < val->shape.ndim; k++) fits |= val->shape.dim[k] >= n_dp;
                    CHECK(!fits, "%s %s: '%s' stays whole though an axis has %d elements or more", families[f].name,
                          zero[s], val->name, n_dp);
                    continue;
                }
                CHECK(tz * n_dp == tn, "%s %s: '%s' held %lld times in all, %lld without zero: expected 1/%d",
                      families[f].name, zero[s], val->name, (long long)tz, (long long)tn, n_dp);
                int64_t slice = adt_shape_numel(&val->shape) / val->shape.dim[lay->s[0].axis];
                for (int r = 0; r < nr; r++) {
                    int64_t zr = z[(size_t)r * nv + v], nr_ = n[(size_t)r * nv + v];
                    CHECK(zr * n_dp <= nr_ + (int64_t)n_dp * slice, "%s %s: rank %d holds %lld of '%s', %lld without "
                          "zero", families[f].name, zero[s], r, (long long)zr, val->name, (long long)nr_);
                }
            }
            for (int r = 0; r < nr; r++) {
                int64_t zr = 0, nr_ = 0;
                for (int v = 0; v < nv; v++) zr += z[(size_t)r * nv + v], nr_ += n[(size_t)r * nv + v];
                double ratio = (double)zr / (double)nr_;
                worst_rank = ratio > worst_rank ? ratio : worst_rank;
            }
            printf("zero %s %s on %d: optimizer state %lld elements over all ranks (%lld without zero: 1/%.4g); the "
                   "fullest rank holds %.4f of its share without zero (1/dp = %.4f); %lld in tensors too small to "
                   "split\n", families[f].name, zero[s], devices[s], (long long)sum_z, (long long)sum_n,
                   (double)sum_n / (double)sum_z, worst_rank, 1.0 / n_dp, (long long)whole);
            boxing_count bc;
            if (!count_boxing(md.g, &pz, &bc, NULL)) {
                int rs = 0;
                for (int l = 0; l < 16; l++) rs += bc.n[l][1][0][ADT_BOXING_REDUCE_SCATTER];
                CHECK(rs > 0, "%s %s: no reduce-scatter of gradients on the dp axis", families[f].name, zero[s]);
            }
            free(z);
            free(n);
            adt_plan_free(&pz);
            adt_plan_free(&pn);
        }
        adt_graph_free(md.g);
    }
}

/* ---- pipeline plans: the format and the balance (the pipeline runtime comes later) -------------- */

static double stage_max(const double *tag_flops, const int *first, const int *last, int p) {
    double m = 0;
    for (int s = 0; s < p; s++) {
        double f = 0;
        for (int t = first[s]; t <= last[s]; t++) f += tag_flops[t];
        m = f > m ? f : m;
    }
    return m;
}

/* The smallest largest-stage FLOPs over every way to cut L layers into p contiguous stages. */
static double brute_best(const double *tag_flops, int L, int p, int s, int from, int *first, int *last) {
    if (s == p - 1) {
        first[s] = from, last[s] = L - 1;
        return from <= L - 1 ? stage_max(tag_flops, first, last, p) : -1;
    }
    double best = -1;
    for (int end = from; end <= L - 1 - (p - 1 - s); end++) {
        first[s] = from, last[s] = end;
        double b = brute_best(tag_flops, L, p, s + 1, end + 1, first, last);
        if (b >= 0 && (best < 0 || b < best)) best = b;
    }
    return best;
}

static void test_pipeline(void) {
    static const struct { int family; const char *strategy; int devices, micro; } pcs[] = {
        {0, "pp=2", 2, 2}, {0, "pp=4", 4, 3}, {0, "dp=2,pp=2", 4, 2}, {1, "pp=3", 3, 1}, {2, "pp=2,tp=2", 4, 2},
        {3, "dp=2,pp=2", 4, 2},
    };
    for (size_t c = 0; c < sizeof pcs / sizeof pcs[0]; c++) {
        fmodel md;
        build(&md, &families[pcs[c].family], BATCH);
        adt_plan p;
        char what[96];
        snprintf(what, sizeof what, "%s %s", families[pcs[c].family].name, pcs[c].strategy);
        int rc = make_plan(&md, pcs[c].strategy, pcs[c].devices, pcs[c].micro, &p);
        CHECK(rc == ADT_OK, "%s: %s", what, adt_error_message());
        if (rc) {
            adt_graph_free(md.g);
            continue;
        }
        int pp = 0;
        sscanf(strstr(pcs[c].strategy, "pp=") + 3, "%d", &pp);
        CHECK(p.pp_axis == 0 && p.n_stages == pp && p.mesh.dim[0] == pp && p.microbatches == pcs[c].micro,
              "%s: pipeline axis %d, %d stages, %d microbatches", what, p.pp_axis, p.n_stages, p.microbatches);
        CHECK(adt_plan_validate(&p, md.g) == ADT_OK, "%s: %s", what, adt_error_message());
        double tag_flops[64] = {0};
        for (int i = 0; i < md.g->n_nodes; i++) tag_flops[md.g->nodes[i].layer_tag] += adt_node_flops(md.g, &md.g->nodes[i]);
        int first[8], last[8];
        double best = brute_best(tag_flops, p.n_layers, pp, 0, 0, first, last);
        double got = stage_max(tag_flops, p.stage_first, p.stage_last, pp);
        CHECK(fabs(got - best) <= 1e-9 * best, "%s: largest stage %.6g FLOPs, the best contiguous split has %.6g", what,
              got, best);
        /* every stage's sub-mesh: its ranks are the pipeline coordinate's, disjoint and complete */
        int seen[64] = {0};
        for (int s = 0; s < pp; s++) {
            int ranks[64];
            adt_mesh sm;
            CHECK(adt_plan_stage_mesh(&p, s, &sm, ranks) == ADT_OK, "%s", adt_error_message());
            CHECK(sm.nranks * pp == p.mesh.nranks, "%s: stage %d has %d ranks", what, s, sm.nranks);
            for (int i = 0; i < sm.nranks; i++) {
                int fc[ADT_MAX_MESH_DIMS], sc[ADT_MAX_MESH_DIMS];
                adt_mesh_coord(&sm, i, sc);
                fc[0] = s;
                for (int a = 1; a < p.mesh.ndim; a++) fc[a] = sc[a - 1];
                CHECK(ranks[i] == adt_mesh_rank(&p.mesh, fc) && !seen[ranks[i]]++, "%s: stage %d rank %d", what, s, i);
                int ls = -1, lc[ADT_MAX_MESH_DIMS] = {0};
                CHECK(adt_plan_locate(&p, ranks[i], &ls, lc) == ADT_OK && ls == s &&
                          adt_mesh_index(&sm, lc) == i, "%s: rank %d located at stage %d, index %d", what, ranks[i], ls,
                      adt_mesh_index(&sm, lc));
            }
        }
        for (int t = 0; t < p.n_layers; t++)
            CHECK(adt_plan_stage_of(&p, t) >= 0, "%s: layer %d has no stage", what, t);
        /* the plan runs within a stage mesh as any plan does (here: the whole graph on stage 0's mesh) */
        int ranks[64];
        adt_dist_plan dp = adt_plan_dist(&p, 0, ranks);
        adt_dist_local loc;
        int coord[ADT_MAX_MESH_DIMS] = {0};
        CHECK(adt_dist_partition(md.g, &dp, coord, &loc) == ADT_OK, "%s: %s", what, adt_error_message());
        adt_dist_local_free(&loc);
        printf("pipeline %s, %d microbatches: stages", what, p.microbatches);
        for (int s = 0; s < pp; s++) printf(" [%d-%d]", p.stage_first[s], p.stage_last[s]);
        printf(", largest %.4g MFLOP (best contiguous split %.4g)\n", got * 1e-6, best * 1e-6);
        adt_plan_free(&p);
        adt_graph_free(md.g);
    }
}

/* ---- refusals ----------------------------------------------------------------------------------- */

static void test_refusals(void) {
    static const struct { int family; const char *strategy; int devices, batch, micro; const char *want; } bad[] = {
        {0, "dp=2,tp=2", 6, BATCH, 0, "multiply to 4 devices, but 6 are given"},
        {0, "dp=4", 6, BATCH, 0, "multiply to 4 devices, but 6 are given"},
        {0, "dp=4,tp", 6, BATCH, 0, "6 devices do not split into the given degrees"},
        {0, "dp,tp", 4, BATCH, 0, "both dp and tp lack a degree"},
        {0, "tp=4,zero", 4, BATCH, 0, "expected dp >= 2"},
        {0, "dp=2,mp=2", 4, BATCH, 0, "unknown item 'mp'"},
        {0, "dp=0", 4, BATCH, 0, "dp=0, expected a degree in [1, 4]"},
        {0, "dp=2,dp=2", 4, BATCH, 0, "dp given twice"},
        {0, "tp=5", 5, BATCH, 0, "tp=5 does not divide the gpt model's 12 attention heads (n_head)"},
        {0, "dp=1,tp=8", 8, BATCH, 0, "tp=8 does not divide the gpt model's 12 attention heads"},
        {0, "dp,", 2, BATCH, 0, "an empty item"},
        {0, "", 2, BATCH, 0, "empty"},
        {0, "zero=2", 2, BATCH, 0, "zero takes no degree"},
        {0, "pp=5", 5, BATCH, 0, "pp=5 stages, but the gpt model has only 4 layers"},
        {1, "dp", 8, BATCH, 0, "does not split over dp=8"},
        {0, "dp", 2, BATCH, 4, "batch 6 does not split into 4 microbatches"},
        {0, "dp=2,pp=2", 4, BATCH, 6, "a microbatch of 1 samples"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        fmodel md;
        int micro = bad[c].micro ? bad[c].micro : 1;
        build(&md, &families[bad[c].family], bad[c].batch % micro ? 1 : bad[c].batch / micro);
        adt_expert_opts o = {.strategy = bad[c].strategy, .devices = bad[c].devices, .batch = bad[c].batch,
                             .microbatches = bad[c].micro};
        adt_plan p;
        int rc = adt_expert_plan(md.g, &md.cfg, &o, &p);
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), bad[c].want), "'%s' on %d devices: rc %d, '%s'",
              bad[c].strategy, bad[c].devices, rc, adt_error_message());
        if (!rc) adt_plan_free(&p);
        adt_graph_free(md.g);
    }
    /* a graph that is not the model's at the batch asked for */
    fmodel md;
    build(&md, &families[1], BATCH);
    adt_expert_opts o = {.strategy = "dp", .devices = 2, .batch = 2 * BATCH};
    adt_plan p;
    int rc = adt_expert_plan(md.g, &md.cfg, &o, &p);
    CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "is not the mlp model's training graph at batch 12"), "%s",
          adt_error_message());
    adt_graph_free(md.g);
    /* strategies that parse: the degree left out takes the rest */
    adt_strategy st;
    CHECK(adt_strategy_parse("dp=2,tp", 6, &st) == ADT_OK && st.dp == 2 && st.tp == 3 && st.pp == 1 && !st.zero,
          "dp=2,tp on 6");
    CHECK(adt_strategy_parse("tp=2,zero", 8, &st) == ADT_OK && st.dp == 4 && st.tp == 2 && st.zero, "tp=2,zero on 8");
    CHECK(adt_strategy_parse("pp", 3, &st) == ADT_OK && st.pp == 3 && st.dp == 1, "pp on 3");
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_seed);
    RUN(test_plans_match_serial);
    RUN(test_megatron);
    RUN(test_dp_communication);
    RUN(test_zero_memory);
    RUN(test_pipeline);
    RUN(test_refusals);
    return check_finish();
}
