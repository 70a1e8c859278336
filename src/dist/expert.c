/*
 * expert.c - the hand-designed plans (data, ZeRO, Megatron tensor and pipeline parallelism, and
 * their combinations on 2-D meshes) for the model families, made the way a person would: fix
 * the layout of every leaf the strategy implies (parameters and optimizer state per model
 * family, fed inputs split on the batch over dp), then let the greedy (greedy.c) choose every
 * node's signature under the strategy's rules:
 *   - on a dp axis, parameter data is read whole (B): a ZeRO-held shard is gathered at use;
 *   - on a tp axis, parameter data is read as it is held (the weights never move), and the other
 *     activations are replicated, partial, or split on their feature axis only (the channel axis
 *     of an NCHW tensor, the heads of attention probabilities, the last axis otherwise):
 *     Megatron's layout, no batch or sequence split. GPT attention runs split by heads (qkv
 *     [B,T,3,C] on its last axis), so a transformer block's forward pass communicates only the
 *     two all-reduces of its row-parallel projections.
 * Gradient synchronisation is then the boxing the partitioner inserts before each optimizer
 * step: P -> B (all-reduce) for dp, P -> S (reduce-scatter) for zero.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* ---- strategies ---------------------------------------------------------------------------------- */

int adt_strategy_parse(const char *text, int devices, adt_strategy *out) {
    memset(out, 0, sizeof *out);
    if (devices < 1) return adt_error(ADT_ERR_ARG, "strategy: %d devices, expected at least 1", devices);
    if (!text || !*text)
        return adt_error(ADT_ERR_ARG, "strategy: empty, expected a list such as \"dp\", \"dp=2,tp=2\" or \"dp,zero\"");
    int deg[3] = {0, 0, 0}, given[3] = {0, 0, 0}; /* dp, tp, pp; given: 1 with a number, 2 without */
    static const char *const names[3] = {"dp", "tp", "pp"};
    for (const char *p = text;;) {
        char item[32];
        size_t n = strcspn(p, ",");
        if (!n || n >= sizeof item)
            return adt_error(ADT_ERR_ARG, "strategy '%.64s': %s item, expected dp[=N], tp[=N], pp[=N] or zero", text,
                             n ? "a too long" : "an empty");
        memcpy(item, p, n);
        item[n] = 0;
        int more = p[n] == ',';
        p += n + more;
        char *eq = strchr(item, '=');
        if (eq) *eq = 0;
        if (!strcmp(item, "zero")) {
            if (eq) return adt_error(ADT_ERR_ARG, "strategy '%.64s': zero takes no degree (it shards over dp)", text);
            if (out->zero) return adt_error(ADT_ERR_ARG, "strategy '%.64s': zero given twice", text);
            out->zero = 1;
            if (!more) break;
            continue;
        }
        int k = 0;
        while (k < 3 && strcmp(item, names[k])) k++;
        if (k == 3)
            return adt_error(ADT_ERR_ARG, "strategy '%.64s': unknown item '%s', expected dp[=N], tp[=N], pp[=N] or zero",
                             text, item);
        if (given[k]) return adt_error(ADT_ERR_ARG, "strategy '%.64s': %s given twice", text, names[k]);
        given[k] = 2;
        if (eq) {
            char *end;
            long v = strtol(eq + 1, &end, 10);
            if (!isdigit((unsigned char)eq[1]) || *end || v < 1 || v > devices)
                return adt_error(ADT_ERR_ARG, "strategy '%.64s': %s=%s, expected a degree in [1, %d] (the device count)",
                                 text, names[k], eq + 1, devices);
            deg[k] = (int)v, given[k] = 1;
        }
        if (!more) break;
    }
    if (out->zero && !given[0]) given[0] = 2; /* zero shards over dp: dp takes what is left */
    int open = -1, prod = 1;
    for (int k = 0; k < 3; k++) {
        if (given[k] == 2) {
            if (open >= 0)
                return adt_error(ADT_ERR_ARG, "strategy '%.64s': both %s and %s lack a degree; give all but one", text,
                                 names[open], names[k]);
            open = k;
        } else if (given[k] == 1) prod *= deg[k];
    }
    if (open >= 0) {
        if (devices % prod)
            return adt_error(ADT_ERR_ARG, "strategy '%.64s': %d devices do not split into the given degrees (product %d), "
                             "expected a multiple of %d", text, devices, prod, prod);
        deg[open] = devices / prod;
    } else if (prod != devices) {
        return adt_error(ADT_ERR_ARG, "strategy '%.64s': the degrees multiply to %d devices, but %d are given", text, prod,
                         devices);
    }
    out->dp = deg[0] ? deg[0] : 1, out->tp = deg[1] ? deg[1] : 1, out->pp = deg[2] ? deg[2] : 1;
    if (out->zero && out->dp < 2)
        return adt_error(ADT_ERR_ARG, "strategy '%.64s': zero shards over the dp axis, which has %d device(s); expected "
                         "dp >= 2", text, out->dp);
    return ADT_OK;
}

adt_comm_cost adt_comm_cost_default(const adt_mesh *m) {
    adt_comm_cost c = {.local = 1e-9};
    for (int a = 0; a < ADT_MAX_MESH_DIMS; a++) {
        int intra = a == m->intra_axis;
        c.alpha[a] = intra ? 2e-6 : 1e-5;
        c.beta[a] = intra ? 1.0 / 50e9 : 1.0 / 10e9;
    }
    return c;
}

/* ---- what the tensor-parallel axis does to each parameter --------------------------------------- */

typedef enum split_kind { KEEP = 0, COL, ROW, ROWS } split_kind; /* ROWS: embedding rows (vocab) */

/* Layer i of a chain of n weight layers: row-parallel when an even number of layers follow, so
 * the chain ends on a row-parallel layer whose partial sums are reduced once. */
static split_kind chain_kind(int i, int n) { return (n - 1 - i) % 2 == 0 ? ROW : COL; }

static int name_index(const char *name, const char *prefix, const char *suffix, int *idx) {
    size_t lp = strlen(prefix);
    if (strncmp(name, prefix, lp) || !isdigit((unsigned char)name[lp])) return 0;
    char *end;
    long v = strtol(name + lp, &end, 10);
    if (strcmp(end, suffix)) return 0;
    *idx = (int)v;
    return 1;
}

/* The tensor axis a tp axis splits in parameter `name` (its .weight or .bias) of rank `rank`, or
 * -1 to keep it whole: Megatron's column (output) / row (input) split per layer, vocabulary rows
 * for embeddings. GPT's Conv1D weights are [in, out] (c_attn [C,3,C]: the output axis is the last,
 * inside each of q, k and v, so a split gives whole heads); nn.Linear's [out, in]; convolutions
 * [Co, Ci, k, k]. A bias follows its layer's output (its last axis, [3,C] for c_attn): split with
 * a column split, whole with a row split. */
static int tp_axis_of(const adt_model_cfg *c, const char *name, int rank) {
    int i, is_bias = strlen(name) > 5 && !strcmp(name + strlen(name) - 5, ".bias");
    split_kind k = KEEP;
    int conv1d = 0;
    switch (c->type) {
    case ADT_MODEL_GPT: {
        static const struct { const char *leaf; split_kind k; } gpt[] = {
            {".attn.c_attn", COL}, {".attn.c_proj", ROW}, {".mlp.c_fc", COL}, {".mlp.c_proj", ROW}};
        if (!strcmp(name, "wte.weight")) return 0;
        for (size_t q = 0; q < sizeof gpt / sizeof gpt[0]; q++) {
            char suf[48];
            snprintf(suf, sizeof suf, "%s%s", gpt[q].leaf, is_bias ? ".bias" : ".weight");
            if (name_index(name, "h.", suf, &i)) k = gpt[q].k;
        }
        conv1d = 1;
        break;
    }
    case ADT_MODEL_MLP:
        if (name_index(name, "layers.", is_bias ? ".bias" : ".weight", &i)) k = chain_kind(i, c->mlp.n_sizes - 1);
        break;
    case ADT_MODEL_VGG: {
        int convs = 0;
        for (int b = 0; b < c->vgg.n_blocks; b++) convs += c->vgg.n_convs[b];
        int n = convs + c->vgg.n_fc + 1;
        if (name_index(name, "conv", is_bias ? ".bias" : ".weight", &i)) k = chain_kind(i, n);
        else if (name_index(name, "fc", is_bias ? ".bias" : ".weight", &i)) k = chain_kind(convs + i, n);
        break;
    }
    case ADT_MODEL_DLRM:
        if (name_index(name, "emb.", ".weight", &i)) return 0;
        if (name_index(name, "bot.", is_bias ? ".bias" : ".weight", &i)) k = chain_kind(i, c->dlrm.n_bottom);
        else if (name_index(name, "top.", is_bias ? ".bias" : ".weight", &i)) k = chain_kind(i, c->dlrm.n_top);
        break;
    }
    if (k == KEEP || (is_bias && k == ROW)) return -1;
    if (is_bias) return rank - 1;
    if (conv1d) return k == COL ? rank - 1 : 0;
    return k == COL ? 0 : 1; /* nn.Linear [out,in] and conv [Co,Ci,k,k] alike */
}

/* ---- the leaf layouts of a strategy -------------------------------------------------------------- */

typedef struct mesh_axes {
    int dp, tp; /* stage-mesh axis index, or -1 */
} mesh_axes;

/* Parameter layout on the stage mesh: tp split per family, then zero's split on dp (a tensor
 * axis the tp split leaves alone first, then nesting into the same one). Axes that would leave
 * a device an empty block stay whole. */
static adt_ndsbp param_layout(const adt_graph *g, int v, const adt_model_cfg *c, const adt_mesh *sm, mesh_axes ax,
                              int zero) {
    const adt_value *val = &g->values[v];
    adt_ndsbp s = adt_ndsbp_all_b(sm->ndim);
    int t = ax.tp >= 0 ? tp_axis_of(c, val->name, val->shape.ndim) : -1;
    if (t >= 0 && t < val->shape.ndim) {
        s.s[ax.tp] = (adt_sbp){ADT_SBP_S, (int8_t)t};
        if (!adt_ndsbp_fits(&s, sm, val->shape)) s.s[ax.tp] = (adt_sbp){ADT_SBP_B, 0};
    }
    if (!zero || ax.dp < 0) return s;
    int tp_split = ax.tp >= 0 && s.s[ax.tp].kind == ADT_SBP_S ? s.s[ax.tp].axis : -1;
    for (int pass = 0; pass < 2; pass++) /* first an axis tp leaves whole, then nested in tp's */
        for (int k = 0; k < val->shape.ndim; k++) {
            if ((k == tp_split) != pass) continue;
            adt_ndsbp z = s;
            z.s[ax.dp] = (adt_sbp){ADT_SBP_S, (int8_t)k};
            if (adt_ndsbp_fits(&z, sm, val->shape)) return z;
        }
    return s;
}

static void leaf_layouts(const adt_graph *g, const adt_model_cfg *c, const adt_mesh *sm, mesh_axes ax, int zero,
                         adt_ndsbp *leaf) {
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->producer >= 0) continue;
        leaf[v] = adt_ndsbp_all_b(sm->ndim);
        if (val->role == ADT_ROLE_PARAM) leaf[v] = param_layout(g, v, c, sm, ax, zero);
        else if (adt_role_is_fed(val->role) && v != g->lr_input && v != g->step_input && ax.dp >= 0)
            leaf[v].s[ax.dp] = (adt_sbp){ADT_SBP_S, 0}; /* the batch */
    }
    for (int v = 0; v < g->n_values; v++) /* optimizer state: held like its parameter */
        if (g->values[v].producer < 0 && g->values[v].role == ADT_ROLE_OPT_STATE && g->values[v].param >= 0)
            leaf[v] = leaf[g->values[v].param];
}

/* ---- the rules the greedy follows ---------------------------------------------------------------- */

typedef struct policy {
    const adt_graph *g;
    mesh_axes ax;
    int nchw;     /* 4-D values are images [N,C,H,W] (vgg) */
    char *weight; /* [n_values] parameter data: parameters, optimizer state, forward values of them alone */
    char *wgrad;  /* [n_values] gradients on their way into an optimizer step */
} policy;

static void classify(policy *pl) {
    const adt_graph *g = pl->g;
    pl->weight = adt_calloc((size_t)g->n_values + 1, 1);
    pl->wgrad = adt_calloc((size_t)g->n_values + 1, 1);
    for (int v = 0; v < g->n_values; v++)
        pl->weight[v] = g->values[v].role == ADT_ROLE_PARAM || g->values[v].role == ADT_ROLE_OPT_STATE;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->is_backward || n->is_optimizer) continue;
        int all = n->n_in > 0;
        for (int j = 0; j < n->n_in && all; j++) all = pl->weight[n->in[j]];
        for (int k = 0; k < n->n_out && all; k++) pl->weight[n->out[k]] = 1;
    }
    /* consumers of each value, then backwards: a gradient all of whose readers lead only into
     * optimizer steps (add_n of tied uses, reshapes back) is a weight gradient */
    int *cnt = adt_calloc((size_t)g->n_values + 1, sizeof *cnt);
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++) cnt[g->nodes[i].in[j]]++;
    int *start = adt_calloc((size_t)g->n_values + 2, sizeof *start), *fill = adt_calloc((size_t)g->n_values + 1, sizeof *fill);
    for (int v = 0; v < g->n_values; v++) start[v + 1] = start[v] + cnt[v];
    int *cons = adt_malloc((size_t)start[g->n_values] * sizeof *cons + 1);
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++) {
            int v = g->nodes[i].in[j];
            cons[start[v] + fill[v]++] = i * ADT_MAX_INPUTS + j;
        }
    for (int i = g->n_nodes - 1; i >= 0; i--)
        for (int k = 0; k < g->nodes[i].n_out; k++) {
            int v = g->nodes[i].out[k], ok = cnt[v] > 0 && g->values[v].role == ADT_ROLE_GRAD;
            for (int c = start[v]; c < start[v + 1] && ok; c++) {
                const adt_node *r = &g->nodes[cons[c] / ADT_MAX_INPUTS];
                if (r->is_optimizer) ok = cons[c] % ADT_MAX_INPUTS == 1;
                else
                    for (int q = 0; q < r->n_out && ok; q++) ok = pl->wgrad[r->out[q]];
            }
            pl->wgrad[v] = (char)ok;
        }
    free(cnt);
    free(start);
    free(fill);
    free(cons);
}

/* The axis along which a tp axis may split an activation: channels of an NCHW image, heads of
 * attention probabilities [B,H,T,T], else the last axis (features; heads' columns of qkv
 * [B,T,3,C]); vectors (per-sample numbers) not at all. */
static int feature_axis(const policy *pl, int v) {
    const adt_value *val = &pl->g->values[v];
    if (val->shape.ndim <= 1) return -1;
    if (val->producer >= 0 && pl->g->nodes[val->producer].op == ADT_OP_ATTENTION && val->out_index == 1) return 1;
    return val->shape.ndim == 4 && pl->nchw ? 1 : val->shape.ndim - 1;
}

static int activation_ok(const policy *pl, int v, adt_sbp x) {
    if (x.kind != ADT_SBP_S || pl->weight[v] || pl->wgrad[v]) return 1;
    return x.axis == feature_axis(pl, v);
}

static int policy_allow(void *ctx, const adt_graph *g, int node, const adt_nd_sig *s, const adt_ndsbp *layout) {
    const policy *pl = ctx;
    const adt_node *n = &g->nodes[node];
    int inplace = adt_op_get(n->op)->inplace;
    for (int j = 0; j < n->n_in; j++) {
        int v = n->in[j];
        if (pl->weight[v] && !inplace) {
            if (pl->ax.dp >= 0 && s->in[j].s[pl->ax.dp].kind != ADT_SBP_B) return 0;
            if (pl->ax.tp >= 0 && layout[v].ndim) {
                adt_sbp want = layout[v].s[pl->ax.tp], got = s->in[j].s[pl->ax.tp];
                int same = want.kind == got.kind && (want.kind != ADT_SBP_S || want.axis == got.axis);
                if (!same && !(want.kind == ADT_SBP_B && got.kind == ADT_SBP_P)) return 0; /* B -> P is local */
            }
        }
        if (pl->ax.tp >= 0 && !activation_ok(pl, v, s->in[j].s[pl->ax.tp])) return 0;
    }
    for (int k = 0; k < n->n_out && pl->ax.tp >= 0; k++)
        if (!activation_ok(pl, n->out[k], s->out[k].s[pl->ax.tp])) return 0;
    return 1;
}

/* ---- pipeline stages ----------------------------------------------------------------------------- */

/* Cuts layers 0..L-1 into p contiguous stages minimising the largest stage's FLOPs (forward,
 * backward and update of the layer's nodes). */
static void balance_stages(const adt_graph *g, int L, int p, int *first, int *last) {
    double *w = adt_calloc((size_t)L, sizeof *w);
    for (int i = 0; i < g->n_nodes; i++) w[g->nodes[i].layer_tag] += adt_node_flops(g, &g->nodes[i]);
    adt_stage_cut(w, L, p, first, last);
    free(w);
}

/* The linear partition problem, by dynamic programming over (stages, layers). */
void adt_stage_cut(const double *w, int L, int p, int *first, int *last) {
    double *f = adt_calloc((size_t)L + 1, sizeof *f); /* prefix sums */
    for (int t = 0; t < L; t++) f[t + 1] = f[t] + w[t];
    double *best = adt_malloc((size_t)(p + 1) * (L + 1) * sizeof *best);
    int *cut = adt_malloc((size_t)(p + 1) * (L + 1) * sizeof *cut);
#define AT(s, t) ((size_t)(s) * (size_t)(L + 1) + (size_t)(t))
    for (int t = 0; t <= L; t++) best[AT(1, t)] = f[t], cut[AT(1, t)] = 0;
    for (int s = 2; s <= p; s++)
        for (int t = s; t <= L; t++) {
            best[AT(s, t)] = -1;
            for (int c = s - 1; c < t; c++) { /* stage s holds layers c..t-1 */
                double x = f[t] - f[c], m = best[AT(s - 1, c)] > x ? best[AT(s - 1, c)] : x;
                if (best[AT(s, t)] < 0 || m < best[AT(s, t)]) best[AT(s, t)] = m, cut[AT(s, t)] = c;
            }
        }
    for (int s = p, t = L; s >= 1; s--) {
        int c = cut[AT(s, t)];
        first[s - 1] = c, last[s - 1] = t - 1;
        t = c;
    }
#undef AT
    free(f);
    free(best);
    free(cut);
}

/* ---- the plan ------------------------------------------------------------------------------------- */

static int largest_tag(const adt_graph *g) {
    int t = 0;
    for (int i = 0; i < g->n_nodes; i++) t = g->nodes[i].layer_tag > t ? g->nodes[i].layer_tag : t;
    for (int v = 0; v < g->n_values; v++) t = g->values[v].layer_tag > t ? g->values[v].layer_tag : t;
    return t;
}

/* The optimizer of a training graph, from its update nodes. */
static int graph_optim(const adt_graph *g, adt_optim_kind *kind, int *momentum) {
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->op == ADT_OP_ADAMW) return *kind = ADT_OPTIM_ADAMW, *momentum = 0, ADT_OK;
        if (n->op == ADT_OP_SGD) return *kind = ADT_OPTIM_SGD, *momentum = n->n_in == 5, ADT_OK;
    }
    return adt_error(ADT_ERR_ARG, "expert plan: the graph has no optimizer step (build it with adt_graph_optimizer)");
}

static void build_mesh(adt_plan *p, const adt_strategy *st) {
    int dims[ADT_MAX_MESH_DIMS], nd = 0;
    p->pp_axis = -1;
    if (st->pp > 1) p->pp_axis = nd, snprintf(p->axis[nd], ADT_PLAN_AXIS_LEN, "pp"), dims[nd++] = st->pp;
    if (st->dp > 1 || st->tp == 1) snprintf(p->axis[nd], ADT_PLAN_AXIS_LEN, "dp"), dims[nd++] = st->dp;
    if (st->tp > 1) snprintf(p->axis[nd], ADT_PLAN_AXIS_LEN, "tp"), dims[nd++] = st->tp;
    adt_mesh_init(&p->mesh, nd, dims);
    p->mesh.intra_axis = nd - 1;
    p->mesh.ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *p->mesh.ranks);
    for (int i = 0; i < p->mesh.nranks; i++) p->mesh.ranks[i] = i;
}

static void strategy_text(const adt_strategy *st, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    const struct { const char *name; int d; } items[] = {{"dp", st->dp}, {"tp", st->tp}, {"pp", st->pp}};
    for (int i = 0; i < 3; i++)
        if (items[i].d > 1 || (i == 0 && st->tp == 1 && st->pp == 1))
            k += (size_t)snprintf(buf + k, k < n ? n - k : 0, "%s%s=%d", k ? "," : "", items[i].name, items[i].d);
    if (st->zero && k < n) snprintf(buf + k, n - k, "%szero", k ? "," : "");
}

/* Refusals that need the model: the batch, the microbatches, the pipeline depth and the heads. */
static int check_fit(const adt_graph *g, const adt_model_cfg *c, const adt_expert_opts *o, const adt_strategy *st,
                     int micro) {
    if (o->batch < 1 || micro < 1 || o->batch % micro)
        return adt_error(ADT_ERR_ARG, "expert plan: batch %d does not split into %d microbatches", o->batch, micro);
    if (o->batch / micro < st->dp)
        return adt_error(ADT_ERR_ARG, "expert plan: a microbatch of %d samples (batch %d / %d microbatches) does not "
                         "split over dp=%d; expected at least one sample per data-parallel rank",
                         o->batch / micro, o->batch, micro, st->dp);
    int layers = largest_tag(g) + 1;
    if (st->pp > layers)
        return adt_error(ADT_ERR_ARG, "expert plan: pp=%d stages, but the %s model has only %d layers to place "
                         "(layer tags 0..%d)", st->pp, adt_model_type_name(c->type), layers, layers - 1);
    if (st->pp > ADT_PLAN_MAX_STAGES)
        return adt_error(ADT_ERR_ARG, "expert plan: pp=%d, expected at most %d stages", st->pp, ADT_PLAN_MAX_STAGES);
    /* Megatron splits attention by heads: a block of qkv's last axis must hold whole heads,
     * which the block distribution gives exactly when the degree divides the head count */
    if (c->type == ADT_MODEL_GPT && st->tp > 1 && c->gpt.n_head % st->tp)
        return adt_error(ADT_ERR_ARG, "expert plan: tp=%d does not divide the gpt model's %d attention heads (n_head); "
                         "tensor parallelism gives each rank whole heads, expected a tp degree that divides %d",
                         st->tp, c->gpt.n_head, c->gpt.n_head);
    return ADT_OK;
}

/* The graph must be the model's at batch / microbatches with its optimizer. */
static int check_graph(const adt_graph *g, const adt_plan *p) {
    adt_graph *ref = NULL;
    int rc = adt_plan_build_graph(p, NULL, &ref);
    if (!rc && adt_plan_graph_checksum(ref) != adt_plan_graph_checksum(g))
        rc = adt_error(ADT_ERR_ARG, "expert plan: the graph is not the %s model's training graph at batch %d "
                       "(%d nodes given, %d expected)", adt_model_type_name(p->model.type), p->batch / p->microbatches,
                       g->n_nodes, ref->n_nodes);
    adt_graph_free(ref);
    return rc;
}

int adt_expert_plan(const adt_graph *g, const adt_model_cfg *c, const adt_expert_opts *o, adt_plan *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "plan");
    if (g->status) return adt_error(g->status, "expert plan: the graph has an error: %s", g->err);
    adt_strategy st;
    int micro = o->microbatches > 0 ? o->microbatches : 1;
    int rc = adt_strategy_parse(o->strategy, o->devices, &st);
    if (!rc) rc = check_fit(g, c, o, &st, micro);
    if (rc) return rc;
    adt_plan *p = out;
    strategy_text(&st, p->strategy, sizeof p->strategy);
    p->model = *c;
    p->batch = o->batch;
    p->microbatches = micro;
    if ((rc = graph_optim(g, &p->optim, &p->momentum)) || (rc = check_graph(g, p))) {
        adt_plan_free(p);
        return rc;
    }
    build_mesh(p, &st);
    p->n_layers = largest_tag(g) + 1;
    p->n_nodes = g->n_nodes, p->n_values = g->n_values;
    p->checksum = adt_plan_graph_checksum(g);
    p->n_stages = st.pp;
    if (st.pp > 1) balance_stages(g, p->n_layers, st.pp, p->stage_first, p->stage_last);
    else p->stage_first[0] = 0, p->stage_last[0] = p->n_layers - 1;

    int *rk = adt_malloc((size_t)p->mesh.nranks * sizeof *rk);
    adt_mesh sm;
    adt_plan_stage_mesh(p, 0, &sm, rk);
    mesh_axes ax = {-1, -1};
    for (int a = 0, k = 0; a < p->mesh.ndim; a++) {
        if (a == p->pp_axis) continue;
        if (!strcmp(p->axis[a], "dp") && st.dp > 1) ax.dp = k;
        if (!strcmp(p->axis[a], "tp")) ax.tp = k;
        k++;
    }
    int cost_given = 0;
    for (int a = 0; a < ADT_MAX_MESH_DIMS; a++) cost_given |= o->cost.alpha[a] > 0 || o->cost.beta[a] > 0;
    p->cost = cost_given ? o->cost : adt_comm_cost_default(&sm);
    p->node_sig = adt_calloc((size_t)g->n_nodes, sizeof *p->node_sig);
    p->leaf_sbp = adt_calloc((size_t)g->n_values, sizeof *p->leaf_sbp);
    leaf_layouts(g, c, &sm, ax, st.zero, p->leaf_sbp);
    policy pl = {.g = g, .ax = ax, .nchw = c->type == ADT_MODEL_VGG};
    classify(&pl);
    adt_greedy_opts go = {.cost = p->cost, .flop_rate = o->flop_rate > 0 ? o->flop_rate : 1e11, .allow = policy_allow,
                          .ctx = &pl, .sigs = o->sigs ? adt_sig_pool_get(o->sigs, g, &sm) : NULL};
    rc = adt_dist_greedy(g, &sm, &go, p->leaf_sbp, p->node_sig);
    free(pl.weight);
    free(pl.wgrad);
    free(rk);
    if (!rc) rc = adt_plan_validate(p, g);
    if (rc) {
        adt_plan_free(p);
        return adt_error_prefix(rc, "expert plan %s: ", o->strategy);
    }
    return ADT_OK;
}
