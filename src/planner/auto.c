/*
 * auto.c - the automatic planner: the outer loop over pipeline degrees and mesh shapes (the
 * intra-node axis innermost), per candidate the signature search on the stage mesh (started
 * from every expert plan of that shape and from the greedy one), layers to stages by dynamic
 * programming over the chosen plan's per-layer times, the memory penalty raised until the plan
 * fits, and the final choice by the cost model among everything searched and every expert plan,
 * so the result is never predicted worse than the best expert plan.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"

/* ---- training graphs per microbatch count ------------------------------------------------------ */

typedef struct graphs {
    int micro[16];
    adt_graph *g[16];
    int n;
} graphs;

static adt_plan base_plan(const adt_model_cfg *c, const adt_planner_opts *o, int micro) {
    adt_plan p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "auto plan");
    p.model = *c;
    p.batch = o->batch;
    p.microbatches = micro;
    p.optim = o->optim;
    p.momentum = o->momentum;
    return p;
}

static adt_graph *graph_for(graphs *gs, const adt_model_cfg *c, const adt_planner_opts *o, int micro) {
    for (int i = 0; i < gs->n; i++)
        if (gs->micro[i] == micro) return gs->g[i];
    if (gs->n == 16) return NULL;
    adt_plan p = base_plan(c, o, micro);
    adt_graph *g = NULL;
    if (adt_plan_build_graph(&p, NULL, &g)) return NULL;
    gs->micro[gs->n] = micro, gs->g[gs->n++] = g;
    return g;
}

static int largest_tag(const adt_graph *g) {
    int t = 0;
    for (int i = 0; i < g->n_nodes; i++) t = g->nodes[i].layer_tag > t ? g->nodes[i].layer_tag : t;
    for (int v = 0; v < g->n_values; v++) t = g->values[v].layer_tag > t ? g->values[v].layer_tag : t;
    return t;
}

/* Microbatches for pp stages: 4 per stage where the batch allows (1F1B's bubble is (p-1)/(m+p-1)),
 * else fewer, each microbatch keeping at least min_samples; 1 without a pipeline. */
static int micro_for(int pp, int batch, int min_samples) {
    if (pp <= 1) return 1;
    for (int f = 4; f >= 1; f /= 2)
        if (batch % (f * pp) == 0 && batch / (f * pp) >= min_samples) return f * pp;
    return 1;
}

/* ---- the plan object ------------------------------------------------------------------------------ */

static void plan_mesh(adt_plan *p, int pp, int nd, const int *dims) {
    int all[ADT_MAX_MESH_DIMS], n = 0;
    p->pp_axis = -1;
    if (pp > 1) p->pp_axis = 0, snprintf(p->axis[n], ADT_PLAN_AXIS_LEN, "pp"), all[n++] = pp;
    for (int a = 0; a < nd; a++) snprintf(p->axis[n], ADT_PLAN_AXIS_LEN, "d%d", a), all[n++] = dims[a];
    adt_mesh_init(&p->mesh, n, all);
    p->mesh.intra_axis = n - 1;
    p->mesh.ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *p->mesh.ranks);
    for (int i = 0; i < p->mesh.nranks; i++) p->mesh.ranks[i] = i;
}

/* ---- candidates ----------------------------------------------------------------------------------- */

typedef struct expert_rec {
    adt_plan plan;
    int ok, micro;
    adt_graph *g;
} expert_rec;

typedef struct ctx {
    const adt_model_cfg *c;
    adt_cluster cl;           /* memory_bytes replaced by the limit */
    const adt_planner_opts *o;
    int devices, layers;
    graphs gs;
    expert_rec ex[ADT_PLANNER_MAX_EXPERTS];
    int n_ex;
    adt_plan best;
    adt_graph *best_g;
    adt_cost_report best_cost;
    int have_best, best_expert, n_cand;
    adt_sig_pool sigs; /* usable signatures by (graph, stage mesh shape), shared by every plan */
} ctx;

static int better(const adt_cost_report *a, const adt_cost_report *b) {
    if (a->feasible != b->feasible) return a->feasible;
    if (!a->feasible) return a->peak_mem_bytes < b->peak_mem_bytes;
    return a->step_s < b->step_s * (1 - 1e-9);
}

/* A searched plan displaces an expert plan only when predicted at least min_gain faster (default
 * 2%): below that the two tie within the cost model's error (median 6-30% on this machine, see
 * docs/BENCHMARKS.md), and the expert plan has fewer collectives, each of which a step pays for
 * more than the model says (a VGG on 2 ranks: searched 0.6% faster predicted, 28% slower run). */
#define SEARCH_MIN_GAIN 0.02

static void offer(ctx *x, adt_plan *p, adt_graph *g, const adt_cost_report *r, int expert) {
    double gain = x->o->min_gain > 0 ? x->o->min_gain : SEARCH_MIN_GAIN;
    int tie = x->have_best && expert < 0 && x->best_expert >= 0 && r->feasible && x->best_cost.feasible &&
              r->step_s > x->best_cost.step_s * (1 - gain);
    if (x->have_best && (tie || !better(r, &x->best_cost))) {
        if (expert < 0) adt_plan_free(p);
        return;
    }
    if (x->have_best && x->best_expert < 0) adt_plan_free(&x->best);
    x->best = *p, x->best_g = g, x->best_cost = *r, x->have_best = 1, x->best_expert = expert;
}

static void add_expert(ctx *x, const char *strategy) {
    if (x->n_ex == ADT_PLANNER_MAX_EXPERTS) return;
    for (int i = 0; i < x->n_ex; i++)
        if (!strcmp(x->ex[i].plan.strategy, strategy) || !strcmp(x->ex[i].plan.name, strategy)) return;
    expert_rec *e = &x->ex[x->n_ex++];
    memset(e, 0, sizeof *e);
    adt_strategy st;
    snprintf(e->plan.name, sizeof e->plan.name, "%s", strategy);
    if (adt_strategy_parse(strategy, x->devices, &st)) return;
    e->micro = micro_for(st.pp, x->o->batch, st.dp); /* a sample per data-parallel rank at least */
    e->g = graph_for(&x->gs, x->c, x->o, e->micro);
    if (!e->g) return;
    adt_expert_opts eo = {.strategy = strategy, .devices = x->devices, .batch = x->o->batch, .microbatches = e->micro,
                          .flop_rate = adt_cluster_rate(&x->cl, ADT_OPCLASS_MATMUL), .sigs = &x->sigs};
    if (adt_expert_plan(e->g, x->c, &eo, &e->plan)) {
        snprintf(e->plan.name, sizeof e->plan.name, "%s", strategy);
        return;
    }
    snprintf(e->plan.name, sizeof e->plan.name, "%s", strategy);
    int *rk = adt_malloc((size_t)e->plan.mesh.nranks * sizeof *rk);
    adt_mesh sm;
    adt_plan_stage_mesh(&e->plan, 0, &sm, rk);
    e->plan.cost = adt_cluster_mesh_cost(&x->cl, &sm); /* the links it will really run on */
    free(rk);
    e->ok = 1;
}

static void make_experts(ctx *x) {
    int N = x->devices, G = x->cl.devices_per_node;
    char s[64];
    add_expert(x, "dp");
    if (N >= 2) add_expert(x, "dp,zero");
    if (N >= 2) add_expert(x, "tp");
    for (int t = 2; t < N && t <= G; t *= 2)
        if (N % t == 0) {
            snprintf(s, sizeof s, "dp,tp=%d", t), add_expert(x, s);
            snprintf(s, sizeof s, "dp,tp=%d,zero", t), add_expert(x, s);
        }
    for (int p = 2; p <= N && p <= x->layers && p <= 16; p *= 2) {
        if (N % p) continue;
        snprintf(s, sizeof s, "pp=%d,dp", p), add_expert(x, s);
        int t = G < N / p ? G : N / p;
        if (t >= 2 && t < N / p) snprintf(s, sizeof s, "pp=%d,dp,tp=%d", p, t), add_expert(x, s);
    }
}

/* Searches one (pp, stage mesh shape); offers what it finds. */
static void search_one(ctx *x, int pp, int nd, const int *dims) {
    int micro = micro_for(pp, x->o->batch, 1);
    if (x->o->batch % micro) return;
    adt_graph *g = graph_for(&x->gs, x->c, x->o, micro);
    if (!g) return;
    adt_plan p = base_plan(x->c, x->o, micro);
    snprintf(p.strategy, sizeof p.strategy, "auto");
    plan_mesh(&p, pp, nd, dims);
    p.n_layers = largest_tag(g) + 1;
    p.n_nodes = g->n_nodes, p.n_values = g->n_values;
    p.checksum = adt_plan_graph_checksum(g);
    p.n_stages = pp;
    int *rk = adt_malloc((size_t)p.mesh.nranks * sizeof *rk);
    adt_mesh sm;
    adt_plan_stage_mesh(&p, 0, &sm, rk);
    p.cost = adt_cluster_mesh_cost(&x->cl, &sm);
    x->n_cand++;

    adt_sbp_space sp;
    adt_sig_cache *sigs = adt_sig_pool_get(&x->sigs, g, &sm);
    adt_boxing_cache bc = {.m = &sm, .cost = &p.cost}; /* the greedy start's prices and the space's */
    if (adt_sbp_space_build(&sp, g, &sm, &p.cost, &x->cl, 0.0, sigs, &bc)) {
        adt_boxing_cache_free(&bc);
        free(rk), adt_plan_free(&p);
        return;
    }
    int nv = sp.prob.n_vars;
    /* starts: every expert plan of this shape, and the greedy one */
    int *starts_mem = adt_malloc((size_t)(x->n_ex + 1) * (nv ? nv : 1) * sizeof *starts_mem);
    const int *starts[ADT_PLANNER_MAX_EXPERTS + 1];
    int n_starts = 0;
    for (int i = 0; i < x->n_ex; i++) {
        const expert_rec *e = &x->ex[i];
        if (!e->ok || e->g != g || e->plan.n_stages != pp) continue;
        adt_mesh em;
        int *erk = adt_malloc((size_t)e->plan.mesh.nranks * sizeof *erk);
        adt_plan_stage_mesh(&e->plan, 0, &em, erk);
        int same = em.ndim == sm.ndim;
        for (int a = 0; same && a < sm.ndim; a++) same = em.dim[a] == sm.dim[a];
        free(erk);
        if (!same) continue;
        int *xs = starts_mem + (size_t)n_starts * (nv ? nv : 1);
        adt_sbp_space_choice(&sp, g, e->plan.node_sig, xs);
        starts[n_starts++] = xs;
    }
    {
        adt_ndsbp *leaf = adt_calloc((size_t)g->n_values, sizeof *leaf);
        adt_nd_sig *ns = adt_calloc((size_t)g->n_nodes, sizeof *ns);
        adt_greedy_opts go = {.cost = p.cost, .flop_rate = adt_cluster_rate(&x->cl, ADT_OPCLASS_MATMUL), .sigs = sigs,
                              .boxing = &bc};
        if (!adt_dist_greedy(g, &sm, &go, leaf, ns)) {
            int *xs = starts_mem + (size_t)n_starts * (nv ? nv : 1);
            adt_sbp_space_choice(&sp, g, ns, xs);
            starts[n_starts++] = xs;
        }
        free(leaf), free(ns);
    }
    int *sol = adt_malloc((size_t)(nv ? nv : 1) * sizeof *sol);
    p.node_sig = adt_calloc((size_t)g->n_nodes, sizeof *p.node_sig);
    p.leaf_sbp = adt_calloc((size_t)g->n_values, sizeof *p.leaf_sbp);
    double lambda = 0;
    for (int round = 0; round < 6; round++) {
        if (round) adt_sbp_space_set_penalty(&sp, lambda); /* over memory: the bytes each choice keeps, harder every round */
        adt_search_solve(&sp.prob, starts, n_starts, x->o->max_sweeps, ADT_SEARCH_CORE_STEPS, sol, NULL);
        adt_sbp_space_apply(&sp, g, sol, p.node_sig, p.leaf_sbp);
        /* stages: per layer the compute and boxing the solution costs, cut by dynamic programming */
        if (pp > 1) {
            double *w = adt_calloc((size_t)p.n_layers, sizeof *w);
            for (int i = 0; i < g->n_nodes; i++) {
                int t = g->nodes[i].layer_tag;
                if (t >= 0 && t < p.n_layers)
                    w[t] += adt_node_sig_time(g, i, &p.node_sig[i], &sm, &x->cl);
            }
            adt_stage_cut(w, p.n_layers, pp, p.stage_first, p.stage_last);
            free(w);
        } else {
            p.stage_first[0] = 0, p.stage_last[0] = p.n_layers - 1;
        }
        adt_cost_report r;
        if (adt_plan_cost(&p, g, &x->cl, &r)) break; /* the chosen plan is validated at the end */
        if (r.feasible || round == 5) {
            adt_plan keep = p;
            keep.mesh.ranks = adt_malloc((size_t)p.mesh.nranks * sizeof *keep.mesh.ranks);
            memcpy(keep.mesh.ranks, p.mesh.ranks, (size_t)p.mesh.nranks * sizeof *keep.mesh.ranks);
            keep.node_sig = adt_malloc((size_t)g->n_nodes * sizeof *keep.node_sig);
            memcpy(keep.node_sig, p.node_sig, (size_t)g->n_nodes * sizeof *keep.node_sig);
            keep.leaf_sbp = adt_malloc((size_t)g->n_values * sizeof *keep.leaf_sbp);
            memcpy(keep.leaf_sbp, p.leaf_sbp, (size_t)g->n_values * sizeof *keep.leaf_sbp);
            keep.pending = NULL;
            offer(x, &keep, g, &r, -1);
            break;
        }
        /* lambda in seconds per byte: the step time spread over the bytes to save, growing 4x */
        double over = r.peak_mem_bytes - x->cl.memory_bytes;
        lambda = lambda > 0 ? lambda * 4 : r.step_s / (over > 1 ? over : 1) / 4;
    }
    free(sol), free(starts_mem), free(rk);
    adt_boxing_cache_free(&bc);
    adt_sbp_space_free(&sp);
    adt_plan_free(&p);
}

static int search_all(ctx *x) {
    int N = x->devices, G = x->cl.devices_per_node;
    int max_pp = x->o->max_pp > 0 ? x->o->max_pp : x->layers;
    if (max_pp > ADT_PLAN_MAX_STAGES) max_pp = ADT_PLAN_MAX_STAGES;
    for (int pp = 1; pp <= N && pp <= max_pp; pp++) {
        if (N % pp) continue;
        int D = N / pp;
        int one[1] = {D};
        search_one(x, pp, 1, one);
        /* 2-D stage meshes: the inner axis within a node (a divisor of the devices per node) */
        for (int d1 = 2; d1 < D && d1 <= G; d1++) {
            if (D % d1 || G % d1) continue;
            int two[2] = {D / d1, d1};
            search_one(x, pp, 2, two);
        }
    }
    return ADT_OK;
}

int adt_planner_search(const adt_model_cfg *c, const adt_cluster *cl, const adt_planner_opts *o,
                       adt_planner_result *out) {
    memset(out, 0, sizeof *out);
    out->from_expert = -1;
    double t0 = adt_now_s();
    struct timespec c0, c1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    int total = adt_cluster_devices(cl);
    int N = o->devices > 0 ? o->devices : total;
    if (N > total)
        return adt_error(ADT_ERR_ARG, "planner: --devices %d, but cluster %s has %d devices", N, cl->name, total);
    if (o->batch < 1) return adt_error(ADT_ERR_ARG, "planner: batch %d, expected at least 1", o->batch);
    ctx *x = adt_calloc(1, sizeof *x);
    x->c = c, x->o = o, x->cl = *cl, x->devices = N;
    if (o->mem_limit > 0) x->cl.memory_bytes = o->mem_limit;
    adt_graph *g1 = graph_for(&x->gs, c, o, 1);
    int rc = ADT_OK;
    if (!g1) rc = adt_error_prefix(ADT_ERR_ARG, "planner: ");
    if (!rc) {
        x->layers = largest_tag(g1) + 1;
        make_experts(x);
        for (int i = 0; i < x->n_ex; i++) {
            expert_rec *e = &x->ex[i];
            if (e->ok && adt_plan_cost(&e->plan, e->g, &x->cl, &out->expert_cost[i])) e->ok = 0;
            snprintf(out->expert_name[i], sizeof out->expert_name[i], "%s", e->plan.name);
            out->expert_ok[i] = e->ok;
            if (e->ok) offer(x, &e->plan, e->g, &out->expert_cost[i], i);
        }
        out->n_experts = x->n_ex;
        if (!o->no_search) search_all(x);
        if (!x->have_best) rc = adt_error(ADT_ERR_ARG, "planner: no plan of model %s fits %d devices of cluster %s",
                                          adt_model_type_name(c->type), N, cl->name);
    }
    if (!rc && x->best_expert < 0) adt_planner_place(&x->best, x->best_g, &x->cl, &x->best_cost); /* never worse */
    if (!rc && (rc = adt_plan_validate(&x->best, x->best_g)) && x->best_expert < 0) adt_plan_free(&x->best);
    if (!rc) {
        out->from_expert = x->best_expert;
        out->cost = x->best_cost;
        out->n_candidates = x->n_cand;
        /* hand over the chosen plan and its graph; free the rest */
        if (x->best_expert >= 0) {
            out->plan = x->best;
            x->ex[x->best_expert].ok = 2; /* owned by the result now */
        } else {
            out->plan = x->best;
        }
        snprintf(out->plan.name, sizeof out->plan.name, "plan");
        if (x->best_expert < 0) snprintf(out->plan.strategy, sizeof out->plan.strategy, "auto");
        out->graph = x->best_g;
    }
    for (int i = 0; i < x->n_ex; i++)
        if (x->ex[i].ok != 2) adt_plan_free(&x->ex[i].plan);
    adt_sig_pool_free(&x->sigs);
    for (int i = 0; i < x->gs.n; i++)
        if (rc || x->gs.g[i] != out->graph) adt_graph_free(x->gs.g[i]);
    free(x);
    out->search_s = adt_now_s() - t0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    out->search_cpu_s = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
    return rc;
}

void adt_planner_result_free(adt_planner_result *r) {
    adt_plan_free(&r->plan);
    adt_graph_free(r->graph);
    memset(r, 0, sizeof *r);
}

int adt_planner_replan(const adt_plan *old, const adt_cluster *cl, adt_planner_result *out) {
    adt_planner_opts o = {.batch = old->batch, .optim = old->optim, .momentum = old->momentum};
    return adt_planner_search(&old->model, cl, &o, out);
}

/* ---- placement ------------------------------------------------------------------------------------ */

/* Device ids of a mesh whose axes nest in `order` (order[0] outermost): coordinate c sits at the
 * row-major index of (c[order[0]], c[order[1]], ...). */
static void order_ranks(const adt_mesh *m, const int *order, int *ranks) {
    for (int i = 0; i < m->nranks; i++) {
        int c[ADT_MAX_MESH_DIMS], id = 0;
        adt_mesh_coord(m, i, c);
        for (int k = 0; k < m->ndim; k++) id = id * m->dim[order[k]] + c[order[k]];
        ranks[i] = id;
    }
}

int adt_planner_place(adt_plan *p, const adt_graph *g, const adt_cluster *c, adt_cost_report *r) {
    static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    int nd = p->mesh.ndim, n = p->mesh.nranks;
    int *ranks = adt_malloc((size_t)n * sizeof *ranks), *keep = adt_malloc((size_t)n * sizeof *keep);
    int *srk = adt_malloc((size_t)n * sizeof *srk);
    memcpy(keep, p->mesh.ranks, (size_t)n * sizeof *keep);
    adt_comm_cost keep_cost = p->cost;
    int keep_intra = p->mesh.intra_axis;
    adt_cost_report best;
    int rc = adt_plan_cost(p, g, c, &best);
    for (int q = 0; !rc && q < 6; q++) {
        int ok = 1; /* the orders of nd axes: the permutations of 0..nd-1 among the six */
        for (int k = 0; k < nd; k++) ok &= perms[q][k] < nd;
        if (!ok || (nd == 1 && q) || (nd == 2 && perms[q][2] != 2)) continue;
        order_ranks(&p->mesh, perms[q], ranks);
        memcpy(p->mesh.ranks, ranks, (size_t)n * sizeof *ranks);
        adt_mesh sm;
        adt_plan_stage_mesh(p, 0, &sm, srk);
        p->cost = adt_cluster_mesh_cost(c, &sm);
        adt_cost_report t;
        if (adt_plan_cost(p, g, c, &t)) continue;
        if ((t.feasible && !best.feasible) || (t.feasible == best.feasible && t.step_s < best.step_s * (1 - 1e-9))) {
            best = t, keep_cost = p->cost, keep_intra = perms[q][nd - 1];
            memcpy(keep, ranks, (size_t)n * sizeof *keep);
        }
    }
    memcpy(p->mesh.ranks, keep, (size_t)n * sizeof *keep);
    p->cost = keep_cost;
    p->mesh.intra_axis = keep_intra;
    if (r) *r = best;
    free(ranks), free(keep), free(srk);
    return rc;
}
