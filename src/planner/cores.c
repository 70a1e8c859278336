/*
 * cores.c - CPU ranks sharing a node: what the cost model adds on a CPU cluster. The compute
 * slowdown of co-located ranks (memory bandwidth and caches they share) applies at any count a
 * calibration measured; everything else here models ranks TIME-SHARING cores and applies only
 * where a node's busy ranks outnumber its cores_per_node (shared_entry), whatever a calibration
 * measured: at one rank per core no waiting rank takes a busy one's core. None of it applies to
 * an accelerator cluster (its files carry no slowdown).
 *
 *  - compute slowdown: k ranks busy on a node run at the measured factor, at least k / cores
 *    when they outnumber the cores (adt_cluster_share, adt_cluster_share_load);
 *  - waits: a rank blocked on a collective inside a step loses more than the back-to-back fit
 *    (its peers arrive spread out by their compute, a blocked rank is woken late), by the
 *    measured curve of that loss against the compute since the last wait (sync_curve, sync_s:
 *    adt_cluster_sync_loss); collectives whose data the cores themselves move run on the
 *    compute clock at coll_factor times the fit's bytes part (adt_cluster_coll_factor);
 *  - pipelines: a waiting rank still takes a share of the cores while its wait yields and
 *    naps (relay_factor, relay_segment_s, relay_long_factor: adt_cluster_share_active,
 *    adt_cluster_yield_share, adt_cluster_nap_share), so the 1F1B schedule is played out pass
 *    by pass (cores_play_1f1b) instead of the closed form;
 *  - a shared-memory collective of a group smaller than the node's busy ranks waits for all of
 *    them when they outnumber the cores (cores_group_waits).
 * docs/BENCHMARKS.md ("Planner: predicted against measured on this machine") records what each
 * of these did to the accuracy on a 2-core machine.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/comm.h" /* ADT_COMM_YIELD_MIN_S, adt_comm_yield_window_s: how long a waiting rank yields */
#include "adtrain/planner.h"
#include "planner/cores.h"

/* The slowdown entry of the largest rank count <= ranks, -1 if none. */
static int slowdown_entry(const adt_cluster *c, int ranks) {
    int best = -1;
    for (int i = 0; i < c->n_slowdown; i++)
        if (c->slowdown[i].ranks <= ranks && (best < 0 || c->slowdown[i].ranks > c->slowdown[best].ranks)) best = i;
    return best;
}

/* The slowdown entry whose time-sharing effects apply to `ranks` busy ranks of a node: only where
 * they outnumber its cores (cores_per_node, known). At one rank per core a waiting rank takes no
 * core from a busy one and nobody is woken late by the scheduler, whatever a calibration's probe
 * happened to see; a calibration without cores_per_node keeps its measurements out. -1: none. */
static int shared_entry(const adt_cluster *c, int ranks) {
    return c->cores_per_node > 0 && ranks > c->cores_per_node ? slowdown_entry(c, ranks) : -1;
}

double adt_cluster_sync_s(const adt_cluster *c, int ranks) {
    int e = shared_entry(c, ranks);
    return e >= 0 ? c->slowdown[e].sync_s : 0;
}

/* The compute after a blocked wait over which the next one's loss grows to sync_s where the
 * entry has no sync_curve, or the wait is for one of MPI's collectives (an all-to-all): about the
 * sync probe's 1 ms of compute on one core. The curve is measured with the shared-memory
 * all-reduce; MPI's collectives inside a step cost more than it says (MPI moves a message only
 * while both ranks are in an MPI call: a DLRM's reduce-scatters through MPI on 3 ranks waited
 * 0.4-0.8 ms each after 0.3 ms of compute, where the curve says 0.15). */
#define SYNC_RAMP_S 1e-3

double adt_cluster_sync_loss(const adt_cluster *c, int ranks, double compute_s, int mpi) {
    int e = shared_entry(c, ranks);
    if (e < 0 || !(compute_s > 0)) return 0;
    int n = mpi ? 0 : c->slowdown[e].n_sync;
    if (n < 1) return c->slowdown[e].sync_s * fmin(1.0, compute_s / SYNC_RAMP_S);
    const double(*p)[2] = c->slowdown[e].sync_curve;
    double s0 = 0, l0 = 0;
    for (int k = 0; k < n; s0 = p[k][0], l0 = p[k][1], k++)
        if (compute_s <= p[k][0]) return l0 + (p[k][1] - l0) * (compute_s - s0) / (p[k][0] - s0);
    return p[n - 1][1];
}

double adt_cluster_coll_factor(const adt_cluster *c, int ranks) {
    int e = shared_entry(c, ranks);
    return e >= 0 ? c->slowdown[e].coll_factor : 0;
}

/* adt_cluster_share between rank counts: a load of x busy ranks, x >= 1 */
static double share_at(const adt_cluster *c, double x) {
    int lo = (int)x;
    if (lo < 1) return adt_cluster_share(c, 1);
    double a = adt_cluster_share(c, lo);
    return x > lo ? a + (x - lo) * (adt_cluster_share(c, lo + 1) - a) : a;
}

double adt_cluster_share_load(const adt_cluster *c, double load) {
    return share_at(c, load < 1 ? 1 : load);
}

/* The share of a busy rank a waiting one is, w in [0, 1], by a relay factor r of entry e: the
 * load 1 + w (ranks - 1) at which share_at is the factor (monotone in w). */
static double share_of_relay(const adt_cluster *c, double r, int ranks) {
    double lo = 0, hi = 1;
    if (ranks < 2 || share_at(c, ranks) <= r) lo = 1;
    else if (share_at(c, 1) >= r) hi = 0;
    for (int i = 0; i < 40 && hi - lo > 1e-9; i++) {
        double mid = (lo + hi) / 2;
        *(share_at(c, 1 + mid * (ranks - 1)) < r ? &lo : &hi) = mid;
    }
    return (lo + hi) / 2;
}

static double waiting_share(const adt_cluster *c, int e, int ranks) {
    return share_of_relay(c, c->slowdown[e].relay_factor, ranks);
}

/* The part of a relay's waits that yields: each waited ranks - 1 turns of factor x segment and
 * yielded for the first ADT_COMM_YIELD_MIN_S of it. */
static double yielding_part(int ranks, double factor, double segment) {
    double wait = (ranks - 1) * factor * segment;
    return wait > ADT_COMM_YIELD_MIN_S ? ADT_COMM_YIELD_MIN_S / wait : 1;
}

/* The yield and nap shares (y, f) of entry e: the short relay's constant share w_s is
 * ys y + (1 - ys) f, the long one's w_l is yl y + (1 - yl) f (ys, yl: their yielding parts);
 * without a long relay f = 0. Both within [0, 1], f at most y (a napping rank takes no more of
 * the cores than a yielding one). */
static void relay_shares(const adt_cluster *c, int e, int ranks, double *y, double *f) {
    double ws = waiting_share(c, e, ranks), ys = yielding_part(c->slowdown[e].ranks, c->slowdown[e].relay_factor,
                                                                c->slowdown[e].relay_segment_s);
    *f = 0;
    if (c->slowdown[e].relay_long_factor > 0 && c->slowdown[e].relay_long_segment_s > 0) {
        double wl = share_of_relay(c, c->slowdown[e].relay_long_factor, ranks);
        double yl = yielding_part(c->slowdown[e].ranks, c->slowdown[e].relay_long_factor,
                                  c->slowdown[e].relay_long_segment_s);
        /* ys > yl: the long relay's waits yield for a smaller part */
        *f = ys - yl > 1e-9 ? (ys * wl - yl * ws) / (ys - yl) : wl;
        if (*f < 0) *f = 0;
        if (*f > ws) *f = ws; /* the short relay waits partly napping: its share bounds the nap's */
    }
    *y = (ws - (1 - ys) * *f) / ys;
    if (*y > 1) *y = 1;
    if (*y < *f) *y = *f;
}

double adt_cluster_share_active(const adt_cluster *c, int ranks, double active) {
    int e = shared_entry(c, ranks);
    if (e < 0 || !(c->slowdown[e].relay_factor > 0)) return -1;
    double w = waiting_share(c, e, ranks), load = active + w * (ranks - active);
    return share_at(c, load < 1 ? 1 : load);
}

/* The relay measurement's waits, ranks - 1 turns each (a 4-byte token), yielded for their first
 * ADT_COMM_YIELD_MIN_S: w = the yielding share x that part of a wait. At most a busy rank: a
 * rank that yields takes no more than its core (where w says more, the rest of the relay's
 * excess is its wake-ups, which the windows of a pipeline's waits then leave out). */
/* The entry of `ranks` whose short relay was measured with its turns, its shares into *y and *f;
 * -1 where there is none. */
static int measured_relay_shares(const adt_cluster *c, int ranks, double *y, double *f) {
    int e = shared_entry(c, ranks);
    if (e < 0 || ranks < 2 || !(c->slowdown[e].relay_factor > 0) || !(c->slowdown[e].relay_segment_s > 0)) return -1;
    relay_shares(c, e, ranks, y, f);
    return e;
}

double adt_cluster_yield_share(const adt_cluster *c, int ranks) {
    double y, f;
    return measured_relay_shares(c, ranks, &y, &f) < 0 ? -1 : y;
}

double adt_cluster_nap_share(const adt_cluster *c, int ranks) {
    double y, f;
    return measured_relay_shares(c, ranks, &y, &f) < 0 ? 0 : f;
}

double adt_cluster_share(const adt_cluster *c, int ranks) {
    int best = slowdown_entry(c, ranks);
    /* ranks that outnumber the cores share them: none gets more than cores / ranks of one, what
     * ever a short probe happened to see */
    double shared = c->cores_per_node > 0 && ranks > c->cores_per_node ? (double)ranks / c->cores_per_node : 1.0;
    double f = best >= 0 ? c->slowdown[best].factor : 1.0;
    return f > shared ? f : shared;
}

/* A shared-memory collective of a group smaller than the node's busy ranks, where those
 * outnumber the cores, waits as long as one of all of them: its latency is the busy ranks' fit
 * for that many ranks. Each phase of it (comm_shm.c: arrive, reduced, done) waits until every
 * member has been on a core since, and the members take the cores in the same rotation as the
 * ranks outside the group; the group's own latency terms price a group that holds the cores.
 * On a 2x2 mesh of 4 ranks sharing 2 cores, a DLRM's pair all-reduces took 24 us each inside
 * the step (37 a step) and its pair reduce-scatters 25 us, where the 4-rank fit's latency is 26
 * and 13 us and the pair's 8.5 and 4.4 (docs/BENCHMARKS.md, "Pair collectives wait for the
 * whole node"). MPI's all-to-all keeps the pair's: an eager message lands in the peer's queue
 * while the peer is off the cores (priced at the 4-rank world's instead, the stored runs ranked
 * worse). */
int cores_group_waits(const adt_cluster *c, int group, int busy) {
    return c->cores_per_node > 0 && busy > c->cores_per_node && group > 1 && group < busy;
}

/* The 1F1B schedule (adt_pipe_1f1b) played out pass by pass where a node's ranks share its cores:
 * the closed form prices every pass at the slowdown of all the plan's ranks computing at once,
 * but a pipeline's ranks take turns. Pass (s, i) starts when its stage is free and its input is
 * done (the forward of i on stage s-1, the backward of i on stage s+1); while it runs it goes at
 * the slowdown of the ranks computing on its node at that moment, the waiting ones counted as
 * the share of a busy rank that the cluster's relay_factor implies (adt_cluster_share_active:
 * src/comm's polite wait yields and naps, and still takes some of the cores). Where the cluster
 * also measured the relay's turns (relay_segment_s), a waiting rank counts only for the window
 * in which that wait yields (comm.h: 1 ms, or its message's bytes at 1 GB/s), at the share that
 * explains the relay's own waits (adt_cluster_yield_share), and once it naps at the share the
 * long relay measured (adt_cluster_nap_share; nothing where it was not measured): a pipeline of
 * 100 ms passes runs them beside napping ranks, one of 0.3 ms passes with its waiting ranks all
 * yielding. (Napping ranks took nothing on the 2-core VM the window was made on; on another,
 * 4 stages of GPT-S at one microbatch, 150 ms passes, ran 1.24 times one rank's step, and the
 * long relay's share re-priced a stored run from tau 0.58 / 0.74 / 0.79 / 0.76 to 0.75 / 0.89 /
 * 0.77 / 0.90, MLP / VGG / DLRM / GPT-S; docs/BENCHMARKS.md.) (Re-pricing the five full accuracy
 * runs of 2026-11-28 with the window: GPT-S's tau 0.67 -> 0.75 on the mean, the three small
 * models' within 0.005; the median errors of DLRM 12.5 -> 9.6%, GPT-S 11.3 -> 9.4%.) A stage
 * that reads the input or the labels fills them first, waiting for no stage (the trainer fills a microbatch
 * before it posts the receive): the last stage's labels are ready while the stages before run
 * their forwards (charging the fill after them priced the MLP's pipelines of one microbatch on
 * 2-4 ranks 43-53% over their measurement, against 20-38% now; DLRM's 2 stages +12%, now -1%).
 * A pass's time in
 * eval_stage was priced at the slowdown of `busy` ranks; here it runs at share(busy) /
 * share_active of that speed. (4 stages of the MLP at m = 1 take 1.4 times one rank's step on 2
 * cores, not the 2 times the closed form said.) Returns the makespan of the passes. */
double cores_play_1f1b(const adt_plan *p, const adt_cluster *c, const stage_eval *ev, int m, int busy) {
    int S = p->n_stages, dpn = c->devices_per_node > 0 ? c->devices_per_node : 1, nodes = 1;
    int *ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *ranks);
    int *node_of = adt_malloc((size_t)S * p->mesh.nranks * sizeof *node_of), *n_of = adt_calloc((size_t)S, sizeof *n_of);
    for (int s = 0; s < S; s++) {
        adt_mesh sm;
        if (adt_plan_stage_mesh(p, s, &sm, ranks)) continue; /* priced before: cannot fail here */
        for (int i = 0; i < sm.nranks; i++) {
            int k = ranks[i] / dpn;
            node_of[s * p->mesh.nranks + n_of[s]++] = k;
            if (k + 1 > nodes) nodes = k + 1;
        }
    }
    adt_pipe_op *ops = adt_malloc((size_t)S * 2 * m * sizeof *ops);
    int *n_ops = adt_malloc((size_t)S * sizeof *n_ops), *at = adt_calloc((size_t)S, sizeof *at);
    char *f_done = adt_calloc((size_t)S * m, 1), *b_done = adt_calloc((size_t)S * m, 1), *run = adt_calloc((size_t)S, 1);
    char *filled = adt_calloc((size_t)S, 1); /* the stage's next forward has its samples */
    double *left = adt_calloc((size_t)S, sizeof *left), *rate = adt_calloc((size_t)S, sizeof *rate);
    int *active = adt_calloc((size_t)nodes, sizeof *active), *on_node = adt_calloc((size_t)nodes, sizeof *on_node);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < n_of[s]; i++) on_node[node_of[s * p->mesh.nranks + i]]++;
    /* share_of[k * (nranks + 1) + a]: node k's slowdown with a of its ranks computing, once */
    int stride = p->mesh.nranks + 1;
    double *share_of = adt_malloc((size_t)nodes * stride * sizeof *share_of);
    for (int k = 0; k < nodes; k++)
        for (int a = 0; a <= on_node[k]; a++) share_of[k * stride + a] = adt_cluster_share_active(c, on_node[k], a);
    /* where the cluster measured the relay's turns (relay_segment_s): a waiting rank takes
     * yield_of[k] of a busy one for the first window[s] of its wait, none once it naps;
     * load[k]: the busy ranks of node k that counts */
    double *yield_of = adt_malloc((size_t)nodes * sizeof *yield_of), *load = adt_malloc((size_t)nodes * sizeof *load);
    double *nap_of = adt_malloc((size_t)nodes * sizeof *nap_of); /* a napping rank's share, the long relay's */
    double *window = adt_malloc((size_t)S * sizeof *window), *wait_from = adt_calloc((size_t)S, sizeof *wait_from);
    int windowed = 1;
    for (int k = 0; k < nodes; k++) {
        yield_of[k] = adt_cluster_yield_share(c, on_node[k]);
        if (yield_of[k] < 0 && on_node[k] > 1) windowed = 0; /* not measured: the constant share */
        if (yield_of[k] < 0) yield_of[k] = 0;
        nap_of[k] = adt_cluster_nap_share(c, on_node[k]);
    }
    for (int s = 0; s < S; s++) { /* a wait yields while its bytes could be moving (comm.h) */
        double bytes = ev[s].p2p_bytes; /* a forward waits for its input, a backward for s + 1's gradient */
        if (s + 1 < S && ev[s + 1].p2p_bytes > bytes) bytes = ev[s + 1].p2p_bytes;
        window[s] = adt_comm_yield_window_s(bytes);
    }
    for (int s = 0; s < S; s++) n_ops[s] = adt_pipe_1f1b(S, s, m, ops + (size_t)s * 2 * m);
    double t = 0, at_busy = adt_cluster_share(c, busy);
    for (;;) {
        int running = 0;
        for (int s = 0; s < S; s++) {
            if (!run[s] && at[s] < n_ops[s]) {
                adt_pipe_op o = ops[(size_t)s * 2 * m + at[s]];
                if (!o.backward && !filled[s] && ev[s].input > 0) { /* the fill waits for no stage */
                    run[s] = 2, left[s] = ev[s].input;
                } else {
                    int ready = o.backward ? s == S - 1 || b_done[(s + 1) * m + o.microbatch]
                                           : s == 0 || f_done[(s - 1) * m + o.microbatch];
                    if (ready) run[s] = 1, left[s] = o.backward ? ev[s].fb - ev[s].f : ev[s].f - ev[s].input;
                }
            }
            running += run[s];
        }
        if (!running) break;
        memset(active, 0, (size_t)nodes * sizeof *active);
        for (int s = 0; s < S; s++)
            for (int i = 0; run[s] && i < n_of[s]; i++) active[node_of[s * p->mesh.nranks + i]]++;
        double dt = INFINITY;
        if (windowed) {
            for (int k = 0; k < nodes; k++) load[k] = active[k];
            for (int s = 0; s < S; s++) {
                if (run[s]) continue;
                double end = wait_from[s] + window[s];
                int napping = t >= end * (1 - 1e-12);
                for (int i = 0; i < n_of[s]; i++) {
                    int k = node_of[s * p->mesh.nranks + i];
                    load[k] += napping ? nap_of[k] : yield_of[k];
                }
                if (napping) continue;
                if (end - t < dt) dt = end - t; /* its window closes: the load changes */
            }
        }
        for (int s = 0; s < S; s++) {
            if (!run[s]) continue;
            double sh = 1;
            for (int i = 0; i < n_of[s]; i++) {
                int k = node_of[s * p->mesh.nranks + i];
                double x = windowed ? adt_cluster_share_load(c, load[k]) : share_of[k * stride + active[k]];
                if (x > sh) sh = x;
            }
            rate[s] = at_busy / sh;
            if (left[s] / rate[s] < dt) dt = left[s] / rate[s];
        }
        t += dt;
        for (int s = 0; s < S; s++) {
            if (!run[s]) continue;
            left[s] -= rate[s] * dt;
            if (left[s] > 1e-12 * (1 + t)) continue; /* still running */
            if (run[s] == 2) { /* filled: the forward itself next */
                filled[s] = 1, run[s] = 0, wait_from[s] = t;
                continue;
            }
            filled[s] = 0;
            adt_pipe_op o = ops[(size_t)s * 2 * m + at[s]++];
            (o.backward ? b_done : f_done)[s * m + o.microbatch] = 1;
            run[s] = 0, wait_from[s] = t;
        }
    }
    free(ranks), free(node_of), free(n_of), free(ops), free(n_ops), free(at), free(f_done), free(b_done), free(run), free(filled);
    free(left), free(rate), free(active), free(on_node), free(share_of);
    free(yield_of), free(load), free(window), free(wait_from), free(nap_of);
    return t;
}
