/*
 * cost.c - the graph cost model: what one step of a bound plan takes on a cluster, and how much
 * memory each device needs (DESIGN.md section 4; notes: autoparallel-anchors 6.3). GPTs at
 * cluster scale are priced from their shapes instead (lm.c).
 *
 * Time. Per stage, one microbatch is list-scheduled the way the executor runs a local graph
 * (src/exec/exec.c): compute nodes one after another on the compute clock, each on a roofline
 * (its FLOPs at its class's rate, its bytes at the class's byte rate where calibrated, else the
 * slower of the two with bytes / memory bandwidth; plus launch_s; times its kind's calibrated
 * op_factor); on every edge whose layouts differ the boxing program the partitioner inserts, its
 * steps alpha-beta priced per kind, group size and link level (the cluster's calibrated fits
 * where it has them) on one communication clock, started when the value is ready and the link
 * is free, waited for by the first reader. A collective whose input is a leaf starts at its
 * reader, and one that carries a forward value into the backward pass starts no earlier than the
 * reader's turn, so gradient all-reduces overlap the rest of the backward pass and weight gathers
 * do not run ahead. Pipeline: sum(t_i) + (m-1) max(t_i) (1F1B) with t_i a microbatch's forward
 * and backward through stage i including its stage-boundary transfer, plus once per step the
 * longest tail of optimizer updates and the gradient synchronisation still in flight. Several
 * microbatches also pay the gradient accumulation (each backward pass adds into the step's
 * gradients, the update scales them). A rank that holds a block of a fed value first produces
 * the samples its blocks cover (the cluster's input_s per sample).
 *
 * Memory per device of a stage: the memory plan the executor makes of the stage's local graph
 * (adt_dist_partition, and adt_pipe_stage_build for pipelines; graph/memplan.c in the executor's
 * order, one arena per microbatch slot in flight, p - s under 1F1B), plus the logits the trainer
 * keeps, the largest of the stage's devices, 0.1% over. Where the partitioner refuses a plan: a
 * liveness walk (a value lives from its producer to its last reader; saved activations once more
 * per further microbatch in flight).
 *
 * CPU ranks sharing a node's cores (compute slowdown, the loss of blocked waits, collectives
 * moved by the cores, a pipeline's waiting ranks) are modelled apart, in cores.c, and enter here
 * only through the cluster's measured device.slowdown entries or ranks outnumbering its cores.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/comm.h" /* ADT_COMM_SHM_MIN_BYTES: the collectives the in-step factor prices */
#include "adtrain/exec.h" /* adt_exec_plan_memory: the memory plan a rank's executor will make */
#include "adtrain/ops.h"
#include "adtrain/planner.h"
#include "planner/cores.h"

double adt_node_time(const adt_graph *g, int node, double parts, const adt_cluster *c) {
    const adt_node *n = &g->nodes[node];
    if (parts < 1) parts = 1;
    return adt_cluster_op_time(c, n->op, adt_node_flops(g, n) / parts, adt_node_bytes(g, n) / parts);
}

/* The bytes of the largest block of value v under s on m (adt_ndsbp_block_bounds' ceilings,
 * without its shape copies: the search prices every signature of every node with it). */
static double largest_block_bytes(const adt_graph *g, int v, const adt_ndsbp *s, const adt_mesh *m) {
    const adt_shape *sh = &g->values[v].shape;
    double b = (double)adt_value_bytes(g, v);
    int axis[ADT_MAX_MESH_DIMS], n = 0;
    int64_t cur[ADT_MAX_MESH_DIMS];
    for (int a = 0; a < s->ndim && a < m->ndim; a++) {
        if (s->s[a].kind != ADT_SBP_S) continue;
        int k = s->s[a].axis, j = 0;
        while (j < n && axis[j] != k) j++;
        if (j == n) axis[n] = k, cur[n++] = sh->dim[k];
        if (cur[j] < 1) return 0;
        int64_t next = (cur[j] + m->dim[a] - 1) / m->dim[a];
        b = b / (double)cur[j] * (double)next, cur[j] = next;
    }
    return b;
}

double adt_node_sig_time(const adt_graph *g, int node, const adt_nd_sig *sig, const adt_mesh *m, const adt_cluster *c) {
    const adt_node *n = &g->nodes[node];
    double bytes = 0;
    for (int i = 0; i < n->n_in; i++) bytes += largest_block_bytes(g, n->in[i], &sig->in[i], m);
    for (int k = 0; k < n->n_out; k++) bytes += largest_block_bytes(g, n->out[k], &sig->out[k], m);
    return adt_cluster_op_time(c, n->op, adt_node_flops(g, n) / adt_nd_sig_parts(n, sig, m), bytes);
}

/* The product of the mesh axes on which some operand of the signature is split: the share of
 * the node's work one device does (the greedy's and OneFlow's rule). */
double adt_nd_sig_parts(const adt_node *n, const adt_nd_sig *s, const adt_mesh *m) {
    double parts = 1;
    for (int a = 0; a < m->ndim; a++) {
        int split = 0;
        for (int i = 0; i < n->n_in && !split; i++) split = s->in[i].s[a].kind == ADT_SBP_S;
        for (int k = 0; k < n->n_out && !split; k++) split = s->out[k].s[a].kind == ADT_SBP_S;
        if (split) parts *= m->dim[a];
    }
    return parts;
}

static double block_bytes(const adt_graph *g, int v, const adt_ndsbp *s, const adt_mesh *m) {
    adt_shape lo, hi;
    adt_ndsbp_block_bounds(s, m, g->values[v].shape, &lo, &hi);
    return (double)adt_shape_numel(&hi) * (double)adt_dtype_size(g->values[v].dtype);
}


/* The held layout of every leaf: the plan's where it says one, else the partitioner's default. */
static void held_layouts(const adt_plan *p, const adt_graph *g, adt_ndsbp *held) {
    adt_leaf_layouts(g, p->node_sig, held);
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].producer < 0 && p->leaf_sbp && p->leaf_sbp[v].ndim) held[v] = p->leaf_sbp[v];
}

/* The most ranks of the plan on one node: the devices busy at once there (a pipeline's idle
 * stages still poll for messages). */
static int busy_per_node(const adt_plan *p, const adt_cluster *c) {
    int best = 0, dpn = c->devices_per_node > 0 ? c->devices_per_node : 1, nodes = 1;
    for (int i = 0; i < p->mesh.nranks; i++) {
        int node = (p->mesh.ranks ? p->mesh.ranks[i] : i) / dpn;
        if (node + 1 > nodes) nodes = node + 1;
    }
    int *k = adt_calloc((size_t)nodes, sizeof *k);
    for (int i = 0; i < p->mesh.nranks; i++) {
        int node = (p->mesh.ranks ? p->mesh.ranks[i] : i) / dpn;
        if (++k[node] > best) best = k[node];
    }
    free(k);
    return best;
}

static int calibrated_links(const adt_cluster *c) {
    for (int i = 0; i < c->n_links; i++)
        if (c->link[i].n_coll) return 1;
    return 0;
}

/* The collectives the executor's shared buffers run through shared memory (comm.h). */
static int shm_kind(int kind) {
    return kind == ADT_BOXING_ALL_REDUCE || kind == ADT_BOXING_REDUCE_SCATTER || kind == ADT_BOXING_ALL_GATHER;
}

/* The boxing program the partitioner inserts (chosen with the plan's link prices), its steps
 * priced with the cluster's calibrated collectives: per kind, group size and link level of the
 * step's mesh axis; local steps as the program prices them. kind[] gets the steps' times. */
static double reprice_boxing(const adt_plan *p, const adt_cluster *c, const adt_mesh *m, const adt_value *val,
                             const adt_ndsbp *from, const adt_ndsbp *to, int busy, double *kind) {
    adt_boxing_prog prog;
    if (adt_boxing_plan(m, val->shape, val->dtype, from, to, &p->cost, &prog)) return ADT_BOXING_NONE;
    double t = 0, cf = adt_cluster_coll_factor(c, busy);
    for (int i = 0; i < prog.n_steps; i++) {
        const adt_boxing_step *st = &prog.step[i];
        double ts = st->time, t0 = 0; /* t0: the fit's latency part */
        if (st->kind <= ADT_BOXING_ALL_TO_ALL) {
            int level = adt_cluster_axis_level(c, m, st->mesh_axis);
            ts = adt_cluster_coll_time(c, level, st->kind, st->group_size, st->group_bytes, busy);
            t0 = adt_cluster_coll_time(c, level, st->kind, st->group_size, 0, busy);
            if (shm_kind(st->kind) && cores_group_waits(c, st->group_size, busy)) {
                double t0_node = adt_cluster_coll_time(c, level, st->kind, busy, 0, busy);
                ts += t0_node - t0, t0 = t0_node;
            }
        }
        /* a shared-memory collective inside a step: its bytes at the in-step rate `calibrate`
         * measured (the cores that copy them share the memory with the peers' compute), its
         * latency as back to back (a small all-reduce right after a wait costs its fit:
         * bench/bench_lockstep.c, 34 of 40 KB) */
        if (cf > 0 && shm_kind(st->kind) && st->group_size > 1 && st->group_bytes >= ADT_COMM_SHM_MIN_BYTES)
            ts = t0 + cf * (ts - t0);
        kind[st->kind] += ts;
        t += ts;
    }
    return t;
}

/* Layouts a value has been boxed to in this stage, with the time each is ready. */
typedef struct boxed {
    adt_ndsbp to[8];
    double ready[8];
    int n;
} boxed;

/* Samples of one (micro)batch the busiest rank of a stage reads: of the fed values the stage
 * reads (last[v] >= 0), the largest block along the batch axis (the trainer reads the union of
 * its blocks once; they nest). */
static double input_rows(const adt_graph *g, const adt_ndsbp *held, const adt_mesh *m, const int *last) {
    double rows = 0;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (last[v] < 0 || !adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input || val->shape.ndim < 1)
            continue;
        double r = (double)val->shape.dim[0];
        for (int a = 0; a < m->ndim && a < held[v].ndim; a++)
            if (held[v].s[a].kind == ADT_SBP_S && held[v].s[a].axis == 0) r = ceil(r / m->dim[a]);
        if (r > rows) rows = r;
    }
    return rows;
}

static int root_of(const adt_graph *g, int v) {
    while (g->values[v].alias_of >= 0) v = g->values[v].alias_of;
    return v;
}

static int eval_stage(const adt_plan *p, const adt_graph *g, const adt_cluster *c, int s, const adt_mesh *m,
                      const adt_ndsbp *held, adt_boxing_cache *bc, stage_eval *ev) {
    /* ranks time-sharing the cores compute slower, and collectives use the fits at that load */
    int busy = busy_per_node(p, c), reprice = calibrated_links(c);
    double share = adt_cluster_share(c, busy);
    double on_cores = adt_cluster_coll_factor(c, busy); /* > 0: collectives run on the compute clock */
    memset(ev, 0, sizeof *ev);
    int lo = p->stage_first[s], hi = p->stage_last[s];
    int nv = g->n_values;
    double *ready = adt_calloc((size_t)nv, sizeof *ready);
    boxed *bx = adt_calloc((size_t)nv, sizeof *bx);
    int *last = adt_malloc((size_t)nv * sizeof *last);
    double *extra = adt_calloc((size_t)nv, sizeof *extra); /* boxing buffers freed with the value */
    for (int v = 0; v < nv; v++) last[v] = -1;
    const adt_ndsbp **lay = adt_malloc((size_t)nv * sizeof *lay);
    for (int v = 0; v < nv; v++) {
        int pr = g->values[v].producer;
        lay[v] = pr < 0 ? &held[v] : &p->node_sig[pr].out[g->values[v].out_index];
    }
    int in_stage_any = 0;
    char *bwd_read = adt_calloc((size_t)nv, 1); /* a forward value the backward pass reads */
    char *acc_seen = adt_calloc((size_t)nv, 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->layer_tag < lo || n->layer_tag > hi) continue;
        in_stage_any = 1;
        for (int j = 0; j < n->n_in; j++) {
            last[root_of(g, n->in[j])] = i;
            if (n->is_backward) bwd_read[root_of(g, n->in[j])] = 1;
        }
    }
    int rc = ADT_OK;
    double tc = 0, tm = 0, live = 0, peak = 0, t_sync = 0;
    if (c->input_s > 0 && in_stage_any) tc = ev->input = share * c->input_s * input_rows(g, held, m, last);
    int backward_started = 0, opt_started = 0;
    /* persistent and fed values of the stage: held for the whole step */
    for (int v = 0; v < nv; v++) {
        const adt_value *val = &g->values[v];
        if (val->producer < 0 && val->alias_of < 0 && last[v] >= 0) ev->state += block_bytes(g, v, &held[v], m);
    }
    for (int i = 0; i < g->n_nodes && in_stage_any && !rc; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->layer_tag < lo || n->layer_tag > hi) continue;
        const adt_nd_sig *sig = &p->node_sig[i];
        for (int j = 0; n->is_optimizer && j < n->n_in; j++) {
            int r = root_of(g, n->in[j]), pr = g->values[r].producer;
            if (pr >= 0 && g->nodes[pr].is_backward && !acc_seen[r])
                acc_seen[r] = 1, ev->acc_bytes += block_bytes(g, r, lay[r], m);
        }
        if ((n->is_backward || n->is_optimizer) && !backward_started) backward_started = 1, ev->f = tc;
        if (n->is_optimizer && !opt_started) opt_started = 1, ev->fb = tc;
        double start = tc, boxed_at = tc; /* when the inputs are in, and the boxed ones */
        double blocked = -1;              /* when the cores started this node's collectives */
        int mpi_wait = 0;                 /* one of them is MPI's (not through shared memory) */
        for (int j = 0; j < n->n_in; j++) {
            int v = n->in[j];
            const adt_value *val = &g->values[v];
            int pr = val->producer;
            double t_in = ready[v];
            if (pr >= 0 && (g->nodes[pr].layer_tag < lo || g->nodes[pr].layer_tag > hi)) {
                /* from another stage: one transfer per microbatch over the link between them */
                if (bx[v].n == 0 && ready[v] == 0) {
                    int ps = adt_plan_stage_of(p, g->nodes[pr].layer_tag);
                    int r0[ADT_MAX_MESH_DIMS] = {0}, r1[ADT_MAX_MESH_DIMS] = {0}, d0 = 0, d1 = 0;
                    if (p->pp_axis >= 0 && ps >= 0) {
                        r0[p->pp_axis] = ps, r1[p->pp_axis] = s;
                        d0 = adt_mesh_rank(&p->mesh, r0), d1 = adt_mesh_rank(&p->mesh, r1);
                    }
                    double t = adt_cluster_coll_time(c, adt_cluster_level(c, d0, d1), ADT_COLL_SEND_RECV, 2,
                                                     block_bytes(g, v, lay[v], m), busy);
                    ev->p2p += t, ev->p2p_bytes += block_bytes(g, v, lay[v], m);
                    tm = (tm > tc ? tm : tc) + t;
                    ready[v] = tm;
                }
                t_in = ready[v];
            }
            if (!adt_ndsbp_equal(lay[v], &sig->in[j])) {
                boxed *b = &bx[v];
                int k = 0;
                while (k < b->n && !adt_ndsbp_equal(&b->to[k], &sig->in[j])) k++;
                if (k < b->n) {
                    t_in = b->ready[k];
                } else {
                    const adt_boxing_cached *kinds;
                    double bt = adt_boxing_cache_time(bc, val, lay[v], &sig->in[j], &kinds), kt[ADT_BOXING_KIND_COUNT];
                    if (bt >= ADT_BOXING_NONE) {
                        char fa[64], fb[64];
                        rc = adt_error(ADT_ERR_ARG, "cost of plan: node %s input %d: no boxing from %s to %s", n->name, j,
                                       adt_ndsbp_str(lay[v], fa, sizeof fa), adt_ndsbp_str(&sig->in[j], fb, sizeof fb));
                        break;
                    }
                    double t0 = ready[v] > tm ? ready[v] : tm;
                    int late = pr < 0 || (!g->nodes[pr].is_backward && !g->nodes[pr].is_optimizer &&
                                          (n->is_backward || n->is_optimizer));
                    if (late && t0 < tc) t0 = tc;
                    for (int q = 0; q < ADT_BOXING_KIND_COUNT; q++) kt[q] = kinds->kind[q];
                    if (reprice) {
                        memset(kt, 0, sizeof kt);
                        bt = reprice_boxing(p, c, m, val, lay[v], &sig->in[j], busy, kt);
                    }
                    double coll_t = 0; /* the program's collectives (its local steps aside) */
                    for (int q = 0; q <= ADT_BOXING_ALL_TO_ALL; q++) {
                        coll_t += kt[q];
                        if (kt[q] > 0 && !shm_kind(q)) mpi_wait = 1;
                    }
                    if (on_cores > 0 && coll_t > 0) { /* the cores move the data: no overlap */
                        if (t0 < tc) t0 = tc;
                        if (blocked < 0) blocked = t0;
                        tc = t0 + bt;
                    }
                    for (int q = 0; q < ADT_BOXING_KIND_COUNT; q++) ev->comm[q] += kt[q];
                    tm = t0 + bt;
                    t_in = tm;
                    if (b->n < 8) b->to[b->n] = sig->in[j], b->ready[b->n++] = tm;
                    double buf = block_bytes(g, v, &sig->in[j], m);
                    live += buf, extra[root_of(g, v)] += buf;
                }
            }
            if (t_in > start) start = t_in;
            if (t_in > boxed_at && !adt_ndsbp_equal(lay[v], &sig->in[j])) boxed_at = t_in;
        }
        if (rc) break;
        /* blocked on a collective: the peers arrive spread out, and a waiting rank is woken late;
         * less so right after the last blocked wait, which left the ranks together. Not on a
         * stage boundary: one peer, whose lateness the pipeline's schedule already is. */
        if (boxed_at > tc || blocked >= 0) {
            double pen = adt_cluster_sync_loss(c, busy, (blocked >= 0 ? blocked : tc) - t_sync, mpi_wait);
            start += pen, ev->sync += pen, t_sync = start;
        }
        double t = share * adt_node_sig_time(g, i, sig, m, c);
        ev->compute += t;
        tc = start + t;
        for (int k = 0; k < n->n_out; k++) {
            int v = n->out[k];
            ready[v] = tc;
            if (g->values[v].alias_of >= 0) continue;
            live += block_bytes(g, v, &sig->out[k], m);
            if (!n->is_backward && !n->is_optimizer && bwd_read[v]) ev->saved += block_bytes(g, v, &sig->out[k], m);
        }
        if (live > peak) peak = live;
        for (int j = 0; j < n->n_in; j++) { /* values whose last reader this was */
            int r = root_of(g, n->in[j]);
            if (last[r] != i || g->values[r].producer < 0) continue;
            last[r] = -2; /* freed once */
            live -= block_bytes(g, r, lay[r], m) + extra[r];
        }
        for (int k = 0; k < n->n_out; k++) { /* outputs nobody reads here die at once */
            int v = n->out[k];
            if (g->values[v].alias_of >= 0 || last[v] != -1 || g->values[v].is_output) continue;
            live -= block_bytes(g, v, &sig->out[k], m);
        }
    }
    ev->time = tc > tm ? tc : tm;
    if (!opt_started) ev->fb = ev->time;
    if (!backward_started) ev->f = ev->fb;
    ev->act_peak = peak;
    free(ready), free(bx), free(last), free(extra), free(lay), free(bwd_read), free(acc_seen);
    return rc;
}

/* The communicator a rank's executor runs with under mpiexec (src/dist's MPI mesh): collectives
 * split into start and wait, all-reduces in place. Only planned with, never called. */
static int plan_comm_run(void *ctx, const struct adt_kctx *k) {
    (void)ctx, (void)k;
    return adt_error(ADT_ERR_STATE, "the planner's communicator only plans memory");
}
static int plan_comm_test(void *ctx, const struct adt_kctx *k, int *done) {
    *done = 0;
    return plan_comm_run(ctx, k);
}
static const adt_comm_hook plan_comm = {.run = plan_comm_run, .start = plan_comm_run, .test = plan_comm_test,
                                        .finish = plan_comm_run, .inplace_allreduce = 1};

/* The memory plan the executor makes of local graph lg (partitioned at one coordinate): its
 * schedule under the MPI mesh's communicator, or in passes with `slots` microbatch arenas for a
 * pipeline stage (adt_exec_plan_memory). Bytes: slots x (arena + kept logits) + state + the
 * largest scratch. */
static int local_memplan(const adt_plan *p, const adt_graph *lg, int piped, int slots, double *bytes) {
    adt_exec_opts eo = {.comm = &plan_comm, .microbatch_slots = piped ? slots : 0};
    adt_memplan mp;
    int rc = adt_exec_plan_memory(lg, &eo, &mp);
    if (rc) return rc;
    double kept = 0; /* `adtrain train` keeps a classifier's logits to the step's end (metrics) */
    for (int i = 0; i < lg->n_nodes && p->model.type != ADT_MODEL_GPT; i++) {
        const adt_node *nd = &lg->nodes[i];
        if ((nd->op == ADT_OP_SOFTMAX_XENT || nd->op == ADT_OP_BCE_LOGITS) && !lg->values[nd->in[0]].is_output)
            kept += (double)adt_value_bytes(lg, nd->in[0]);
    }
    *bytes = (double)slots * ((double)mp.arena_bytes + kept) + (double)mp.state_bytes + (double)mp.scratch_bytes +
             (double)mp.accum_bytes;
    adt_memplan_free(&mp);
    return ADT_OK;
}

/* The memory plan the executor makes for stage s: the stage's local graph as the partitioner
 * (and, with several stages, adt_pipe_stage_build, once per stage) makes it, the largest of the
 * stage's devices (blocks that do not divide evenly differ between ranks): every coordinate of a
 * small stage mesh, the first and the last of a large one, the first alone where the partitioner
 * split nothing unevenly (adt_dist_local.uneven: every coordinate then has its shapes). The
 * signatures are checked at the first coordinate only (the check is the same at every one). */
static int stage_memplan(const adt_plan *p, const adt_graph *g, int s, int slots, double *bytes) {
    adt_mesh sm;
    int *ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *ranks), *sranks = adt_malloc((size_t)p->mesh.nranks * sizeof *sranks);
    /* a plan of several stages or microbatches runs through the pipeline executor (train_dist.c) */
    int rc = adt_plan_stage_mesh(p, s, &sm, sranks), piped = p->n_stages > 1 || p->microbatches > 1;
    adt_pipe_stage st;
    memset(&st, 0, sizeof st);
    if (!rc && piped) rc = adt_pipe_stage_build(g, p, s, &st);
    adt_dist_plan d = {0};
    int even = 0;
    if (!rc) d = piped ? adt_pipe_stage_dist(&st, p, ranks) : adt_plan_dist(p, 0, ranks);
    *bytes = 0;
    for (int i = 0; i < sm.nranks && !rc; i++) {
        if (sm.nranks > 4 && i > 0 && i < sm.nranks - 1) continue;
        if (i > 0 && even) break; /* every coordinate's local graph has the first one's shapes */
        int coord[ADT_MAX_MESH_DIMS] = {0};
        double b = 0;
        adt_mesh_coord(&sm, i, coord);
        adt_dist_local loc;
        if ((rc = adt_dist_partition(piped ? st.g : g, &d, coord, &loc))) break;
        d.sigs_checked = 1, even = !loc.uneven;
        if (!(rc = local_memplan(p, loc.g, piped, slots, &b)) && b > *bytes) *bytes = b;
        adt_dist_local_free(&loc);
    }
    if (piped) adt_pipe_stage_free(&st);
    free(ranks);
    free(sranks);
    return rc;
}

int adt_plan_cost(const adt_plan *p, const adt_graph *g, const adt_cluster *c, adt_cost_report *out) {
    memset(out, 0, sizeof *out);
    if (!p->node_sig) return adt_error(ADT_ERR_STATE, "%s: cost of an unbound plan", p->name);
    adt_ndsbp *held = adt_malloc((size_t)g->n_values * sizeof *held);
    held_layouts(p, g, held);
    int *ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *ranks);
    int rc = ADT_OK, crit = 0, m = p->microbatches > 0 ? p->microbatches : 1, busy = busy_per_node(p, c);
    stage_eval ev[ADT_PLAN_MAX_STAGES], *e;
    double sum = 0, mx = 0, once = 0;
    out->n_stages = p->n_stages, out->microbatches = m;
    out->peak_mem_bytes = 0;
    for (int s = 0; s < p->n_stages && !rc; s++) {
        adt_mesh sm;
        if ((rc = adt_plan_stage_mesh(p, s, &sm, ranks))) break;
        adt_boxing_cache bc = {.m = &sm, .cost = &p->cost};
        rc = eval_stage(p, g, c, s, &sm, held, &bc, &ev[s]);
        adt_boxing_cache_free(&bc);
        if (rc) break;
        if (p->n_stages > 1 || m > 1) {
            /* microbatch slots: each backward pass adds its gradients into the step's (the first
             * copies: two streams of three), and the update first scales the sum by 1/m (two); at
             * the rate measured for that many bytes (what stays in cache adds faster) */
            double add = adt_cluster_accumulate_s(c, ev[s].acc_bytes, busy);
            ev[s].acc_s = add * (m - 1 + 2.0 / 3) / m;
            ev[s].acc_tail = m > 1 ? add * 2.0 / 3 : 0;
            ev[s].fb += ev[s].acc_s, ev[s].time += ev[s].acc_s + ev[s].acc_tail;
        }
        /* per microbatch: forward, backward and what overlaps them; once per step: the update and
         * the gradient synchronisation still in flight when it starts */
        out->stage_s[s] = ev[s].fb;
        sum += ev[s].fb;
        if (ev[s].fb > mx) mx = ev[s].fb, crit = s;
        if (ev[s].time - ev[s].fb > once) once = ev[s].time - ev[s].fb;
        double inflight = m > 1 ? (p->n_stages - s < m ? p->n_stages - s : m) : 1;
        /* the executor's memory plan of the stage, 0.1% over it: ranks whose blocks differ by a
         * row (uneven splits) place their buffers at other aligned offsets (tens of bytes apart
         * on this machine's runs); where the partitioner refuses the plan (the planner prices
         * plans it has not validated yet), the liveness walk with a 5% slack */
        double planned = 0;
        int slots = p->n_stages > 1 ? (int)inflight : 1;
        if (!stage_memplan(p, g, s, slots, &planned)) {
            planned *= 1.001;
        } else {
            adt_error_clear();
            planned = 1.05 * (ev[s].state + ev[s].act_peak + (inflight - 1) * ev[s].saved);
        }
        out->stage_mem[s] = planned;
        if (out->stage_mem[s] > out->peak_mem_bytes) out->peak_mem_bytes = out->stage_mem[s];
    }
    if (!rc) {
        e = &ev[crit];
        out->step_s = sum + (m - 1) * mx + once;
        /* where the cluster measured how a pipeline's ranks take turns: play the schedule out */
        if (p->n_stages > 1 && adt_cluster_share_active(c, busy, busy) > 0)
            out->step_s = cores_play_1f1b(p, c, ev, m, busy) + once;
        out->compute_s = e->compute * m;
        for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) out->comm_s[k] = e->comm[k] * m;
        out->p2p_s = e->p2p * m;
        out->sync_s = e->sync * m;
        out->input_s = e->input * m;
        out->accumulate_s = e->acc_s * m + e->acc_tail;
        out->exposed_comm_s = (e->fb - e->compute - e->input) * m + (e->time - e->fb) - out->accumulate_s;
        if (out->exposed_comm_s < 0) out->exposed_comm_s = 0;
        out->bubble_s = sum - mx;
        out->state_bytes = e->state;
        out->act_bytes = e->act_peak;
        out->saved_bytes = e->saved;
        out->feasible = out->peak_mem_bytes <= c->memory_bytes;
    }
    free(ranks);
    free(held);
    return rc;
}
