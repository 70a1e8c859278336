/*
 * exec.c - runs a training graph: one state block, one planned arena, one scratch buffer, and
 * the nodes in order through the op registry's kernels; communication nodes through the hook,
 * split into start and wait around the computation when the hook allows (split schedule below).
 *
 * Without split communication the run order is the graph's with each optimizer update moved up
 * to right after the last node it conflicts with (schedule below); with it, the split schedule
 * decides. The memory plan is made for the order that runs. Two fusions: a matmul whose product
 * only a bias_add reads runs as a product-plus-bias that writes the bias_add's output directly,
 * and the bias_add is skipped; a weight gradient's matmul feeding an SGD update with momentum
 * accumulates into the momentum buffer (fold_nodes).
 *
 * With microbatch slots (a pipeline stage) the passes run apart, in pass order, each microbatch
 * in its own activation set, with the gradients the update reads accumulated (the end of the file).
 */
#include "adtrain/exec.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/dist.h"
#include "adtrain/gemm.h"
#include "adtrain/ops.h"

/* One event of a split schedule: run a compute node, start a communication node, or wait for it. */
enum { EV_RUN, EV_START, EV_WAIT };
typedef struct sched_ev {
    int kind, node;
} sched_ev;

struct adt_exec {
    const adt_graph *g;
    adt_exec_opts o;
    adt_memplan mp;
    char *arena, *state;
    int shared;         /* the graph communicates: its buffers are exec_buffer's shared ones */
    float *scratch;
    void **ptr; /* [n_values] */
    double *node_s;
    /* split communication (hook with start / test / finish, and not comm_sync) */
    int split;
    sched_ev *ev, *fev; /* the whole step; the forward pass only */
    int n_ev, n_fev;
    int *pend, n_pend;    /* started communication nodes not finished yet, in start order */
    unsigned char *done;  /* [n_nodes] completion seen by a poll                          */
    double *t_start;      /* [n_nodes] when the start returned                            */
    double *t_done;       /* [n_nodes] when a poll saw it complete                        */
    adt_exec_stats last, total;
    int *bias_of;       /* [n_nodes] for a matmul: the bias_add folded into it, else -1 */
    unsigned char *done_by_matmul; /* [n_nodes] bias_adds folded into their matmul       */
    int *momentum_of;   /* [n_nodes] for a matmul: the SGD update it accumulates for, or -1 */
    unsigned char *momentum_done;  /* [n_nodes] SGD updates whose momentum a matmul made  */
    int *order;         /* [n_nodes] node ids in the order they run (or start)           */
    int *pos;           /* [n_nodes] a node's position in that order (the plan's time)   */
    /* microbatch slots (opts.microbatch_slots > 0; the end of this file): ptr is slot 0's
     * table, or the slot's or the update's while a pass runs */
    int n_slots;
    void ***slot_ptr;   /* [n_slots][n_values]                                            */
    void **upd_ptr;     /* [n_values] slot 0's, with accumulated gradients in place       */
    char **slot_arena, **slot_fed; /* [n_slots] (slot 0's arena is `arena`)              */
    float **acc;        /* [n_values] per root: the accumulator of a gradient the update reads */
    char *acc_block;    /* the accumulators' one allocation (exec_buffer's)                   */
    int n_acc;          /* backward passes accumulated since the last update             */
    int microbatch;     /* adt_exec_set_microbatch                                        */
};

static int root_of(const adt_graph *g, int v) {
    while (g->values[v].alias_of >= 0) v = g->values[v].alias_of;
    return v;
}

/* The arena and the state block, zeroed. A step streams them through the TLB several times
 * (every weight, gradient and optimizer moment), and with 4 KiB pages a model of some MB
 * outgrows it, so blocks of 2 MiB and more are 2 MiB-aligned and marked for transparent huge
 * pages (the kernel's "madvise" mode; where it refuses, the block stays as it is). */
static void *exec_block(size_t n) {
    const size_t huge = (size_t)2 << 20;
#ifdef MADV_HUGEPAGE
    if (n >= huge) {
        size_t sz = (n + huge - 1) & ~(huge - 1);
        void *p = NULL;
        if (posix_memalign(&p, huge, sz) == 0) {
            (void)madvise(p, sz, MADV_HUGEPAGE);
            memset(p, 0, sz);
            return p;
        }
    }
#endif
    return adt_alloc_aligned(n);
}

/* A block of the executor's own (arena, state, slots, accumulators): where the graph
 * communicates, memory the other ranks of this node can read, so that its all-reduces,
 * reduce-scatters and all-gathers read the buffers in place (comm.h, "Shared memory"), else
 * exec_block's. */
static void *exec_buffer(const adt_exec *ex, size_t n) {
    return ex->shared ? adt_comm_shared_alloc(n) : exec_block(n);
}

static void exec_buffer_free(const adt_exec *ex, void *p) {
    if (ex->shared) adt_comm_shared_free(p);
    else free(p); /* exec_block: posix_memalign or adt_alloc_aligned, both free() */
}

/* The run order: the graph's, except that each optimizer node runs as soon as every earlier
 * node it conflicts with has run (one that writes storage it reads, or reads or writes storage
 * it writes): right after its parameter's last use in the backward pass, once its gradient is
 * complete. The update then finds the gradient, and the weights the backward pass just read,
 * still in cache instead of streaming every parameter, gradient and state through memory again
 * at the end, and each gradient buffer is free for reuse earlier. Nothing moves past a node it
 * depends on or that depends on it: nodes after an optimizer node in the graph still run after
 * it. */
typedef struct opt_sched {
    /* after[0]: optimizer nodes that conflict with no earlier node; after[i + 1]: those that
     * run right after node i. Each a list through next[]. */
    int *after, *next, *order, *pos, n;
} opt_sched;

static void sched_emit(opt_sched *s, int i) {
    s->pos[i] = s->n;
    s->order[s->n++] = i;
    for (int o = s->after[i + 1]; o >= 0; o = s->next[o]) sched_emit(s, o);
}

static void schedule_updates_early(adt_exec *ex) {
    const adt_graph *g = ex->g;
    int nn = g->n_nodes;
    /* per storage root: the last node that wrote it, and the last that read or wrote it */
    int *last_w = adt_malloc((size_t)(g->n_values + 1) * sizeof *last_w);
    int *last_rw = adt_malloc((size_t)(g->n_values + 1) * sizeof *last_rw);
    int *tail = adt_malloc((size_t)(nn + 1) * sizeof *tail);
    opt_sched s = {adt_malloc((size_t)(nn + 1) * sizeof(int)), adt_malloc((size_t)(nn + 1) * sizeof(int)),
               ex->order, ex->pos, 0};
    for (int v = 0; v < g->n_values; v++) last_w[v] = last_rw[v] = -1;
    for (int i = 0; i <= nn; i++) s.after[i] = tail[i] = -1;
    for (int i = 0; i < nn; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->is_optimizer) {
            int a = -1;
            for (int k = 0; k < n->n_in; k++) {
                int t = last_w[root_of(g, n->in[k])];
                a = t > a ? t : a;
            }
            for (int k = 0; k < n->n_out; k++) {
                int t = last_rw[root_of(g, n->out[k])];
                a = t > a ? t : a;
            }
            s.next[i] = -1;
            if (s.after[a + 1] < 0) s.after[a + 1] = i;
            else s.next[tail[a + 1]] = i;
            tail[a + 1] = i;
        }
        for (int k = 0; k < n->n_in; k++) last_rw[root_of(g, n->in[k])] = i;
        for (int k = 0; k < n->n_out; k++) {
            int r = root_of(g, n->out[k]);
            last_w[r] = last_rw[r] = i;
        }
    }
    for (int o = s.after[0]; o >= 0; o = s.next[o]) sched_emit(&s, o);
    for (int i = 0; i < nn; i++)
        if (!g->nodes[i].is_optimizer) sched_emit(&s, i);
    ADT_ASSERT(s.n == nn);
    free(s.after);
    free(s.next);
    free(last_w);
    free(last_rw);
    free(tail);
}

/* Whether matmul node mm can do bias_add node ba's work, given reads[r] = how many nodes read
 * storage root r. The fused node writes ba's output when mm runs; that is sound when
 *  - the product has no reader but ba (nor is it kept as an output or seen through a view), so
 *    it need not exist on its own;
 *  - the bias exists when mm runs (a parameter or input, or produced earlier) and nothing
 *    writes it between mm and ba;
 *  - ba's output buffer holds nothing else alive between mm and ba: the plan placed it for
 *    ba's position only, and a value that dies at mm (an input of the product, say) or lives
 *    in between may share its bytes. */
static int can_fold_bias(const adt_exec *ex, const int *reads, int mm, int ba) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    const adt_node *m = &g->nodes[mm], *b = &g->nodes[ba];
    const int pm = ex->pos[mm], pb = ex->pos[ba]; /* the plan's times */
    int prod = m->out[0], bias = b->in[1], y = b->out[0];
    if (m->n_in != 2 || m->a.i[2] != 0 || b->in[0] != prod || mp->root[bias] == prod) return 0;
    int64_t M, N, K, batch; /* the bias is added to each of the product's M rows of N */
    adt_matmul_dims(g, m, &M, &N, &K, &batch);
    if (adt_shape_numel(&g->values[bias].shape) != N) return 0;
    if (m->is_backward != b->is_backward || m->is_optimizer != b->is_optimizer) return 0;
    if (mp->root[prod] != prod || reads[prod] != 1 || g->values[prod].is_output) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (v != prod && mp->root[v] == prod) return 0; /* a view of the product */
    int rb = mp->root[bias];
    if (mp->state_offset[rb] < 0 && !(mp->first[rb] >= 0 && mp->first[rb] < pm)) return 0;
    for (int p = pm + 1; p < pb; p++) {
        const adt_node *w = &g->nodes[ex->order[p]];
        for (int k = 0; k < w->n_out; k++)
            if (mp->root[w->out[k]] == rb) return 0;
    }
    if (mp->root[y] != y || mp->offset[y] < 0) return 0;
    int64_t y0 = mp->offset[y], y1 = y0 + adt_value_bytes(g, y);
    for (int v = 0; v < g->n_values; v++) {
        if (v == y || mp->root[v] != v || mp->offset[v] < 0) continue;
        int64_t v0 = mp->offset[v], v1 = v0 + adt_value_bytes(g, v);
        if (v0 < y1 && y0 < v1 && mp->first[v] < pb && mp->last[v] >= pm) return 0;
    }
    return 1;
}

/* Whether matmul node mm, whose product only SGD node o reads (reads[] as above), can
 * accumulate straight into o's momentum buffer. With momentum mu and no weight decay o computes
 * m = mu m + g (m = g at step 1), then w -= lr m. The accumulating matmul with beta = mu (0 at
 * step 1) gives the same m from the product's inputs (adt_k_matmul_acc rounds mu m in a pass of
 * its own, then sgemm adds the product with one rounding), so the update is left with
 * w -= lr m: the gradient buffer is never written or read, and of the update's five streams over
 * the parameter's size three remain. That equality holds only where the GEMM backend adds its
 * product to C with the product's own rounding (adt_gemm_acc_exact: OpenBLAS while the inner
 * dimension, the batch for a weight gradient, is one block of its sgemm, so up to 256; oneDNN
 * the same, but not for a product with one row or one column). The two must run back to back,
 * so that nothing sees m in between. */

static int can_fold_momentum(const adt_exec *ex, const int *reads, int mm, int o) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    const adt_node *m = &g->nodes[mm], *u = &g->nodes[o];
    int prod = m->out[0];
    if (u->op != ADT_OP_SGD || u->n_in != 5 || u->in[1] != prod || !(u->a.f[0] > 0.0f) ||
        u->a.f[1] != 0.0f)
        return 0;
    if (m->n_in != 2 || m->a.i[2] != 0 || ex->bias_of[mm] >= 0 || ex->pos[o] != ex->pos[mm] + 1)
        return 0;
    if (mp->root[prod] != prod || reads[prod] != 1 || g->values[prod].is_output) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (v != prod && mp->root[v] == prod) return 0; /* a view of the product */
    for (int k = 0; k < 2; k++) /* the product must not read what the update writes */
        if (mp->root[m->in[k]] == mp->root[u->in[0]] || mp->root[m->in[k]] == mp->root[u->in[2]])
            return 0;
    int64_t M, N, K, batch;
    adt_matmul_dims(g, m, &M, &N, &K, &batch);
    return batch == 1 && adt_gemm_acc_exact(M, N, K);
}

static void fold_nodes(adt_exec *ex) {
    const adt_graph *g = ex->g;
    int *reads = adt_calloc((size_t)g->n_values, sizeof *reads);
    int *reader = adt_malloc((size_t)g->n_values * sizeof *reader); /* the last reading node */
    for (int v = 0; v < g->n_values; v++) reader[v] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        ex->bias_of[i] = -1;
        for (int k = 0; k < n->n_in; k++) {
            int r = ex->mp.root[n->in[k]];
            int seen = 0; /* a node reading the same root twice counts once */
            for (int j = 0; j < k; j++) seen |= ex->mp.root[n->in[j]] == r;
            if (!seen) reads[r]++, reader[r] = i;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->op != ADT_OP_MATMUL) continue;
        int ba = reader[n->out[0]];
        if (ba >= 0 && ex->pos[ba] > ex->pos[i] && g->nodes[ba].op == ADT_OP_BIAS_ADD &&
            can_fold_bias(ex, reads, i, ba)) {
            ex->bias_of[i] = ba;
            ex->done_by_matmul[ba] = 1;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ex->momentum_of[i] = -1;
        const adt_node *n = &g->nodes[i];
        if (n->op != ADT_OP_MATMUL || ex->n_slots) continue; /* slots accumulate the gradient */
        int o = reader[n->out[0]];
        if (o >= 0 && can_fold_momentum(ex, reads, i, o)) {
            ex->momentum_of[i] = o;
            ex->momentum_done[o] = 1;
        }
    }
    free(reads);
    free(reader);
}

static int node_phase(const adt_node *n) { return n->is_optimizer ? 2 : n->is_backward ? 1 : 0; }
static int is_comm(const adt_graph *g, int i) { return adt_op_get(g->nodes[i].op)->is_comm; }

/* ---- the split schedule ----------------------------------------------------------------------
 * Built once: node order with every communication node started as soon as its input is ready and
 * waited for just before the first node that reads its output (or updates its input in place).
 * `order` lists the started and run nodes (the memory plan's positions) and read_until[p] the
 * position before which node order[p]'s wait comes, so that its buffers outlive the transfer.
 */
typedef struct sched {
    const adt_graph *g;
    sched_ev *ev;
    int n_ev;
    int *order, n_order, *pos, *read_until;
    int *pend, n_pend;
    unsigned char *started;
    int *reader_at, *readers; /* [n_values + 1], [n_comm]: the collectives reading value v as in[0],
                               * readers[reader_at[v] .. reader_at[v + 1]), ascending */
    int *cand;                /* [n_comm]: start_readers' scratch */
} sched;

static void emit(sched *s, int kind, int node) {
    s->ev[s->n_ev++] = (sched_ev){kind, node};
    if (kind == EV_WAIT) {
        s->read_until[s->pos[node]] = s->n_order; /* in flight until just before the next position */
        int j = 0;
        while (s->pend[j] != node) j++;
        memmove(s->pend + j, s->pend + j + 1, (size_t)(s->n_pend - j - 1) * sizeof *s->pend);
        s->n_pend--;
        return;
    }
    s->pos[node] = s->n_order;
    s->read_until[s->n_order] = s->n_order;
    s->order[s->n_order++] = node;
    if (kind == EV_START) {
        s->started[node] = 1;
        s->pend[s->n_pend++] = node;
    }
}

/* Waits for every pending collective node i depends on: one whose output it reads, or (an
 * in-place update) one whose input shares storage with what it overwrites. */
static void wait_for(sched *s, int i) {
    const adt_graph *g = s->g;
    const adt_node *n = &g->nodes[i];
    int inplace = adt_op_get(n->op)->inplace;
    for (int j = 0; j < s->n_pend;) {
        const adt_node *b = &g->nodes[s->pend[j]];
        int dep = 0;
        for (int k = 0; k < n->n_in && !dep; k++)
            dep = n->in[k] == b->out[0] || (inplace && root_of(g, n->in[k]) == root_of(g, b->in[0]));
        if (dep) emit(s, EV_WAIT, s->pend[j]); /* removes entry j */
        else j++;
    }
}

/* A collective may start right after its input's producer unless the input is a leaf (it starts
 * where the partitioner put it) or a forward value that a later phase reads (it would hold a
 * buffer across the whole forward pass). */
static int hoistable(const adt_graph *g, int c) {
    int p = g->values[g->nodes[c].in[0]].producer;
    if (p < 0 || is_comm(g, p)) return 0;
    return !(node_phase(&g->nodes[p]) == 0 && node_phase(&g->nodes[c]) != 0);
}

/* Starts the collectives that read an output of node i, in node order. */
static void start_readers(sched *s, int i) {
    const adt_node *n = &s->g->nodes[i];
    int *cand = s->cand, nc = 0;
    for (int k = 0; k < n->n_out; k++)
        for (int r = s->reader_at[n->out[k]]; r < s->reader_at[n->out[k] + 1]; r++) {
            int c = s->readers[r];
            if (c <= i || s->started[c] || !hoistable(s->g, c)) continue;
            int at = nc++; /* insertion, ascending: the outputs' lists interleave */
            while (at > 0 && cand[at - 1] > c) cand[at] = cand[at - 1], at--;
            cand[at] = c;
        }
    for (int a = 0; a < nc; a++) emit(s, EV_START, cand[a]);
}

/* Key of an optimizer node: the latest start among the collectives it waits for. */
static int ready_key(const sched *s, int i) {
    const adt_node *n = &s->g->nodes[i];
    int key = -1;
    for (int j = 0; j < s->n_pend; j++)
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == s->g->nodes[s->pend[j]].out[0] && j > key) key = j;
    return key;
}

/* From node i0 on, the optimizer updates only, every collective they wait for already started:
 * they are independent, so run them in the order their collectives started. 1 when done. */
static int run_updates_by_arrival(sched *s, int i0) {
    const adt_graph *g = s->g;
    int n = g->n_nodes - i0;
    for (int i = i0; i < g->n_nodes; i++)
        if (is_comm(g, i) ? !s->started[i] : !g->nodes[i].is_optimizer) return 0;
    int *ids = adt_malloc((size_t)n * sizeof *ids), *key = adt_malloc((size_t)n * sizeof *key), m = 0;
    for (int i = i0; i < g->n_nodes; i++)
        if (!is_comm(g, i)) ids[m] = i, key[m++] = ready_key(s, i);
    for (int a = 1; a < m; a++) /* stable insertion sort by key */
        for (int b = a; b > 0 && key[b - 1] > key[b]; b--) {
            int t = key[b]; key[b] = key[b - 1]; key[b - 1] = t;
            t = ids[b]; ids[b] = ids[b - 1]; ids[b - 1] = t;
        }
    for (int a = 0; a < m; a++) {
        wait_for(s, ids[a]);
        emit(s, EV_RUN, ids[a]);
    }
    free(ids);
    free(key);
    return 1;
}

/* share[] for the memory plan: the output of an all-reduce step whose input nothing else reads
 * (a partial gradient) takes the input's buffer, when the hook allows; NULL if none does. */
static int *inplace_allreduces(const adt_graph *g) {
    int *share = NULL, *readers = adt_calloc((size_t)(g->n_values + 1), sizeof *readers);
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) readers[root_of(g, g->nodes[i].in[k])]++;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (!is_comm(g, i) || (n->a.i[0] & 0xff) != ADT_BOXING_ALL_REDUCE) continue; /* ops.h: i0 = kind | ... */
        /* the input may be a view (a reshaped gradient): then the views between it and its root
         * are the root's only other readers */
        int r = n->in[0], links = 0, ok = 1;
        for (; g->values[r].alias_of >= 0; r = g->values[r].alias_of, links++) {
            const adt_value *v = &g->values[r];
            ok &= v->producer >= 0 && adt_op_get(g->nodes[v->producer].op)->view_of >= 0 && !v->is_output;
        }
        const adt_value *root = &g->values[r];
        if (!ok || root->producer < 0 || root->is_output || readers[r] != links + 1) continue;
        if (!share) {
            share = adt_malloc((size_t)g->n_values * sizeof *share);
            for (int v = 0; v < g->n_values; v++) share[v] = -1;
        }
        share[n->out[0]] = n->in[0];
    }
    free(readers);
    return share;
}

static void build_schedule(adt_exec *ex, int **order_out, int **read_until_out) {
    const adt_graph *g = ex->g;
    int nn = g->n_nodes;
    sched s = {.g = g};
    s.ev = adt_malloc((size_t)(2 * nn + 1) * sizeof *s.ev);
    s.order = adt_malloc((size_t)(nn + 1) * sizeof *s.order);
    s.pos = adt_calloc((size_t)(nn + 1), sizeof *s.pos);
    s.read_until = adt_calloc((size_t)(nn + 1), sizeof *s.read_until);
    s.pend = adt_malloc((size_t)(nn + 1) * sizeof *s.pend);
    s.started = adt_calloc((size_t)(nn + 1), 1);
    s.reader_at = adt_calloc((size_t)(g->n_values + 2), sizeof *s.reader_at);
    for (int i = 0; i < nn; i++)
        if (is_comm(g, i)) s.reader_at[g->nodes[i].in[0] + 1]++;
    for (int v = 0; v < g->n_values; v++) s.reader_at[v + 1] += s.reader_at[v];
    s.readers = adt_malloc((size_t)(s.reader_at[g->n_values] + 1) * sizeof *s.readers);
    int *fill = adt_malloc((size_t)(g->n_values + 1) * sizeof *fill);
    memcpy(fill, s.reader_at, (size_t)g->n_values * sizeof *fill);
    for (int i = 0; i < nn; i++)
        if (is_comm(g, i)) s.readers[fill[g->nodes[i].in[0]]++] = i;
    free(fill);
    s.cand = adt_malloc((size_t)(s.reader_at[g->n_values] + 1) * sizeof *s.cand);
    for (int i = 0; i < nn; i++) {
        if (g->nodes[i].is_optimizer && !is_comm(g, i) && run_updates_by_arrival(&s, i)) break;
        if (is_comm(g, i)) {
            if (s.started[i]) continue;
            wait_for(&s, i);
            emit(&s, EV_START, i);
            continue;
        }
        wait_for(&s, i);
        emit(&s, EV_RUN, i);
        start_readers(&s, i);
    }
    while (s.n_pend) emit(&s, EV_WAIT, s.pend[0]);
    ex->ev = s.ev;
    ex->n_ev = s.n_ev;
    ex->fev = adt_malloc((size_t)(s.n_ev + 1) * sizeof *ex->fev);
    for (int e = 0; e < s.n_ev; e++)
        if (node_phase(&g->nodes[s.ev[e].node]) == 0) ex->fev[ex->n_fev++] = s.ev[e];
    ADT_ASSERT(s.n_order == nn);
    memcpy(ex->order, s.order, (size_t)nn * sizeof *ex->order);
    memcpy(ex->pos, s.pos, (size_t)nn * sizeof *ex->pos);
    *order_out = s.order;
    *read_until_out = s.read_until;
    free(s.pos);
    free(s.pend);
    free(s.started);
    free(s.reader_at);
    free(s.readers);
    free(s.cand);
}

static int any_comm_node(const adt_graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (is_comm(g, i)) return 1;
    return 0;
}

static void slots_create(adt_exec *ex);
static void slots_free(adt_exec *ex);
static void accumulated(const adt_graph *g, const adt_memplan *mp, char *acc);

/* The order ex->g's nodes run in under ex->o (ex->order, ex->pos; collectives split into start
 * and wait or not: ex->split; microbatch slots) and the memory plan for it (ex->mp). The
 * communicator's functions are looked at, never called. */
static void plan_schedule(adt_exec *ex) {
    const adt_graph *g = ex->g;
    const adt_comm_hook *h = ex->o.comm;
    ex->split = h && h->start && h->test && h->finish && !ex->o.comm_sync;
    int any_comm = any_comm_node(g);
    ex->order = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->order);
    ex->pos = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->pos);
    int *share = any_comm && h->inplace_allreduce ? inplace_allreduces(g) : NULL;
    if (ex->o.microbatch_slots > 0) { /* passes apart: forward, backward, update, each in graph order */
        ex->split = 0;
        ex->n_slots = ex->o.microbatch_slots;
        int n = 0;
        for (int ph = 0; ph < 3; ph++)
            for (int i = 0; i < g->n_nodes; i++)
                if (node_phase(&g->nodes[i]) == ph) ex->pos[i] = n, ex->order[n++] = i;
        adt_memplan_build_sched(&ex->mp, g, ex->order, g->n_nodes, ex->o.no_reuse, NULL, share);
        char *acc = adt_malloc((size_t)g->n_values + 1);
        accumulated(g, &ex->mp, acc);
        for (int r = 0; r < g->n_values; r++)
            if (acc[r]) ex->mp.accum_bytes += adt_value_bytes(g, r);
        free(acc);
    } else if (ex->split && any_comm) {
        int *order, *read_until;
        build_schedule(ex, &order, &read_until);
        adt_memplan_build_sched(&ex->mp, g, order, g->n_nodes, ex->o.no_reuse, read_until, share);
        free(order);
        free(read_until);
    } else {
        ex->split = 0;
        schedule_updates_early(ex);
        adt_memplan_build_sched(&ex->mp, g, ex->order, g->n_nodes, ex->o.no_reuse, NULL, share);
    }
    free(share);
}

int adt_exec_plan_memory(const adt_graph *g, const adt_exec_opts *opts, adt_memplan *out) {
    memset(out, 0, sizeof *out);
    if (g->status) return adt_error(g->status, "%s", g->err);
    adt_exec *ex = adt_calloc(1, sizeof *ex);
    ex->g = g;
    if (opts) ex->o = *opts;
    plan_schedule(ex);
    *out = ex->mp;
    memset(&ex->mp, 0, sizeof ex->mp);
    ex->n_slots = 0; /* no slot was made */
    adt_exec_free(ex);
    return ADT_OK;
}

int adt_exec_create(adt_exec **out, const adt_graph *g, const adt_exec_opts *opts) {
    *out = NULL;
    if (g->status) return adt_error(g->status, "%s", g->err);
    for (int i = 0; i < g->n_nodes; i++)
        if (adt_op_get(g->nodes[i].op)->is_comm && !(opts && opts->comm && opts->comm->run))
            return adt_error(ADT_ERR_ARG, "node %s communicates, but the executor was given no communicator (adt_exec_opts.comm)",
                             g->nodes[i].name);
    int rc = adt_gemm_init(); /* a bad ADT_GEMM is this call's error, not a log line mid-step */
    if (rc) return rc;
    adt_exec *ex = adt_calloc(1, sizeof *ex);
    ex->g = g;
    if (opts) ex->o = *opts;
    adt_gemm_set_threads(ex->o.threads); /* every GEMM backend; 0 keeps the libraries' settings */
    plan_schedule(ex);
    if (ex->split) { /* the split run's state per node */
        ex->pend = adt_malloc((size_t)g->n_nodes * sizeof *ex->pend);
        ex->done = adt_calloc((size_t)g->n_nodes, 1);
        ex->t_start = adt_calloc((size_t)g->n_nodes, sizeof *ex->t_start);
        ex->t_done = adt_calloc((size_t)g->n_nodes, sizeof *ex->t_done);
    }
    /* shared where the graph communicates (exec_buffer): the state too, whose shards ZeRO
     * gathers. Shared pages are not transparent huge pages (the kernel's default for shared
     * memory); that measured no slower for the MLP and GPT-S steps here. */
    ex->shared = any_comm_node(g);
    ex->arena = exec_buffer(ex, (size_t)ex->mp.arena_bytes);
    ex->state = exec_buffer(ex, (size_t)ex->mp.state_bytes);
    ex->scratch = adt_alloc_aligned((size_t)ex->mp.scratch_bytes);
    ex->ptr = adt_calloc((size_t)g->n_values, sizeof *ex->ptr);
    ex->node_s = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->node_s);
    ex->bias_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->bias_of);
    ex->done_by_matmul = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->done_by_matmul);
    ex->momentum_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->momentum_of);
    ex->momentum_done = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->momentum_done);
    for (int v = 0; v < g->n_values; v++) { /* a view shares its root's storage */
        int r = ex->mp.root[v];
        if (ex->mp.state_offset[r] >= 0) ex->ptr[v] = ex->state + ex->mp.state_offset[r];
        else if (ex->mp.offset[r] >= 0) ex->ptr[v] = ex->arena + ex->mp.offset[r];
    }
    fold_nodes(ex);
    if (ex->n_slots) slots_create(ex);
    *out = ex;
    return ADT_OK;
}

void adt_exec_free(adt_exec *ex) {
    if (!ex) return;
    adt_memplan_free(&ex->mp);
    exec_buffer_free(ex, ex->arena);
    exec_buffer_free(ex, ex->state);
    adt_free_aligned(ex->scratch);
    free(ex->ptr);
    free(ex->node_s);
    free(ex->ev);
    free(ex->fev);
    free(ex->pend);
    free(ex->done);
    free(ex->t_start);
    free(ex->t_done);
    free(ex->bias_of);
    free(ex->done_by_matmul);
    free(ex->momentum_of);
    free(ex->momentum_done);
    free(ex->order);
    free(ex->pos);
    slots_free(ex);
    free(ex);
}

void *adt_exec_data(adt_exec *ex, int value) {
    if (value < 0 || value >= ex->g->n_values) return NULL;
    return ex->ptr[value];
}

int adt_exec_bind(adt_exec *ex, int value, void *p) {
    const adt_graph *g = ex->g;
    if (value < 0 || value >= g->n_values || ex->mp.root[value] != value || ex->mp.state_offset[value] < 0)
        return adt_error(ADT_ERR_ARG, "exec bind: value %d is not a persistent or fed value that owns its storage", value);
    if (ex->n_slots) return adt_error(ADT_ERR_ARG, "exec bind: '%s': not with microbatch slots", g->values[value].name);
    for (int v = 0; v < g->n_values; v++)
        if (ex->mp.root[v] == value) ex->ptr[v] = p;
    return ADT_OK;
}

float *adt_exec_f32(adt_exec *ex, const char *name) {
    int v = adt_graph_find_value(ex->g, name);
    if (v < 0 || ex->g->values[v].dtype != ADT_F32) return NULL;
    return ex->ptr[v];
}

/* Global flat index of local element i of a value that is a box of a larger tensor. */
static int64_t global_index(const adt_value *v, int64_t i) {
    int64_t gidx = 0, stride = 1;
    for (int d = v->shape.ndim - 1; d >= 0; d--) {
        int64_t c = i % v->shape.dim[d];
        i /= v->shape.dim[d];
        gidx += (c + v->offset[d]) * stride;
        stride *= v->global_shape.dim[d];
    }
    return gidx;
}

int adt_exec_init_params(adt_exec *ex) {
    const adt_graph *g = ex->g;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (!adt_role_is_persistent(val->role)) continue;
        float *p = ex->ptr[v];
        int64_t n = adt_shape_numel(&val->shape);
        uint64_t key = adt_rng_key(ex->o.seed, val->name);
        adt_init in = val->role == ADT_ROLE_PARAM ? val->init : (adt_init){ADT_INIT_ZEROS, 0, 0};
        for (int64_t i = 0; i < n; i++) {
            switch (in.kind) {
            case ADT_INIT_ZEROS: p[i] = 0.0f; break;
            case ADT_INIT_ONES: p[i] = 1.0f; break;
            case ADT_INIT_CONST: p[i] = in.a; break;
            case ADT_INIT_NORMAL: p[i] = in.a * adt_rng_normal(key, (uint64_t)global_index(val, i)); break;
            case ADT_INIT_UNIFORM:
                p[i] = in.a + (in.b - in.a) * adt_rng_uniform(key, (uint64_t)global_index(val, i));
                break;
            }
        }
    }
    return ADT_OK;
}

void adt_exec_set_lr_step(adt_exec *ex, float lr, int32_t step) {
    if (ex->g->lr_input >= 0) *(float *)ex->ptr[ex->g->lr_input] = lr;
    if (ex->g->step_input >= 0) *(int32_t *)ex->ptr[ex->g->step_input] = step;
}

/* The node to run for compute node id: the graph's, or its fused form (matmul with the bias
 * or into the momentum buffer, the SGD update left after that); NULL when a fusion did its work. */
static const adt_node *fused_node(adt_exec *ex, int id, adt_node *fused) {
    const adt_graph *g = ex->g;
    const adt_node *n = &g->nodes[id];
    if (ex->done_by_matmul[id]) return NULL;
    *fused = *n;
    if (ex->bias_of[id] >= 0) { /* the bias as a third input, writing the bias_add's output */
        const adt_node *ba = &g->nodes[ex->bias_of[id]];
        fused->n_in = 3;
        fused->in[2] = ba->in[1];
        fused->out[0] = ba->out[0];
        return fused;
    }
    if (ex->momentum_of[id] >= 0) { /* m = beta m + product, beta 0 at step 1 */
        const adt_node *u = &g->nodes[ex->momentum_of[id]];
        int32_t step = *(const int32_t *)ex->ptr[u->in[4]];
        fused->out[0] = u->in[2];
        fused->a.i[5] = 1; /* op_math.c: accumulate */
        fused->a.f[0] = step <= 1 ? 0.0f : u->a.f[0];
        return fused;
    }
    if (ex->momentum_done[id]) { /* w -= lr m: plain SGD with m as the gradient */
        fused->n_in = 4;
        fused->in[1] = n->in[2];
        fused->in[2] = n->in[3];
        fused->in[3] = n->in[4];
        fused->n_out = 1;
        fused->a.f[0] = 0.0f;
        return fused;
    }
    return n;
}

static adt_kctx make_kctx(adt_exec *ex, const adt_node *n, int training, void **in, void **outp) {
    for (int i = 0; i < n->n_in; i++) in[i] = ex->ptr[n->in[i]];
    for (int k = 0; k < n->n_out; k++) outp[k] = ex->ptr[n->out[k]];
    return (adt_kctx){.g = ex->g, .n = n, .in = in, .out = outp, .scratch = ex->scratch, .seed = ex->o.seed,
                      .training = training, .comm = ex->o.comm, .microbatch = ex->microbatch};
}

/* A node where it stands: a kernel, or a communication node run to completion. */
static int run_node(adt_exec *ex, int id, int training) {
    adt_node fused;
    const adt_node *n = is_comm(ex->g, id) ? &ex->g->nodes[id] : fused_node(ex, id, &fused);
    if (!n) return ADT_OK;
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    adt_kctx k = make_kctx(ex, n, training, in, outp);
    const adt_comm_hook *h = ex->o.comm;
    double t0 = ex->o.profile ? adt_now_s() : 0;
    int rc = ADT_OK;
    if (!is_comm(ex->g, id)) {
        adt_op_get(n->op)->forward(&k);
    } else {
        double c0 = adt_now_s(), c1 = c0;
        if (h->start && h->finish) {
            rc = h->start(h->ctx, &k);
            c1 = adt_now_s();
            if (!rc) rc = h->finish(h->ctx, &k);
        } else {
            rc = h->run(h->ctx, &k);
        }
        double c2 = adt_now_s();
        ex->last.comm_ops++;
        ex->last.comm_start_s += c1 - c0;
        ex->last.comm_wait_s += c2 - c1;
        ex->last.comm_flight_s += c2 - c1;
    }
    if (ex->o.profile) ex->node_s[id] += adt_now_s() - t0;
    return rc;
}

/* Polls the oldest collectives in flight until one is not complete yet: MPI progresses every
 * operation inside any of its calls, so one test moves them all. */
static int poll_pending(adt_exec *ex) {
    const adt_comm_hook *h = ex->o.comm;
    double t0 = adt_now_s();
    int rc = ADT_OK;
    for (int j = 0; j < ex->n_pend && !rc; j++) {
        int b = ex->pend[j];
        if (ex->done[b]) continue;
        void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
        adt_kctx k = make_kctx(ex, &ex->g->nodes[b], 1, in, outp);
        int d = 0;
        rc = h->test(h->ctx, &k, &d);
        if (!d) break;
        ex->done[b] = 1;
        ex->t_done[b] = adt_now_s();
    }
    ex->last.comm_poll_s += adt_now_s() - t0;
    return rc;
}

static int run_event(adt_exec *ex, const sched_ev *e, int training) {
    const adt_comm_hook *h = ex->o.comm;
    int b = e->node, rc;
    if (e->kind == EV_RUN) {
        rc = run_node(ex, b, training);
        if (!rc && ex->o.after_node) ex->o.after_node(ex->o.after_ctx, b);
        return rc ? rc : ex->n_pend ? poll_pending(ex) : ADT_OK;
    }
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    adt_kctx k = make_kctx(ex, &ex->g->nodes[b], training, in, outp);
    double t0 = adt_now_s();
    if (e->kind == EV_START) {
        rc = h->start(h->ctx, &k);
        ex->t_start[b] = adt_now_s();
        ex->done[b] = 0;
        ex->pend[ex->n_pend++] = b;
        ex->last.comm_ops++;
        ex->last.comm_start_s += ex->t_start[b] - t0;
        if (ex->o.profile) ex->node_s[b] += ex->t_start[b] - t0;
        return rc;
    }
    rc = h->finish(h->ctx, &k);
    double t1 = adt_now_s();
    ex->last.comm_wait_s += t1 - t0;
    ex->last.comm_flight_s += (ex->done[b] ? ex->t_done[b] : t1) - ex->t_start[b];
    if (ex->o.profile) ex->node_s[b] += t1 - t0;
    int j = 0;
    while (j < ex->n_pend && ex->pend[j] != b) j++;
    if (j < ex->n_pend) memmove(ex->pend + j, ex->pend + j + 1, (size_t)(ex->n_pend - j - 1) * sizeof *ex->pend);
    ex->n_pend--;
    return rc;
}

static void stats_add(adt_exec_stats *t, const adt_exec_stats *a) {
    t->runs += a->runs;
    t->comm_ops += a->comm_ops;
    t->run_s += a->run_s;
    t->comm_start_s += a->comm_start_s;
    t->comm_poll_s += a->comm_poll_s;
    t->comm_wait_s += a->comm_wait_s;
    t->comm_flight_s += a->comm_flight_s;
}

static int run_phase(adt_exec *ex, void **ptr, int phase, int training);

/* forward_only: the forward nodes only (evaluation or gradient checks). */
static int exec_run(adt_exec *ex, int forward_only, int training) {
    if (ex->n_slots) {
        int rc = run_phase(ex, ex->slot_ptr[0], 0, training);
        if (forward_only || rc) return rc;
        return (rc = adt_exec_run_pass(ex, 0, 1)) ? rc : adt_exec_run_update(ex);
    }
    double t0 = adt_now_s();
    memset(&ex->last, 0, sizeof ex->last);
    ex->last.runs = 1;
    int rc = ADT_OK;
    if (ex->split) {
        const sched_ev *ev = forward_only ? ex->fev : ex->ev;
        int n = forward_only ? ex->n_fev : ex->n_ev;
        for (int e = 0; e < n && !rc; e++) rc = run_event(ex, &ev[e], training);
        ex->n_pend = 0; /* after an error the collectives left in flight are the caller's to end */
    } else {
        for (int p = 0; p < ex->g->n_nodes && !rc; p++) {
            int i = ex->order[p];
            const adt_node *n = &ex->g->nodes[i];
            if (forward_only && (n->is_backward || n->is_optimizer)) continue;
            rc = run_node(ex, i, training);
            if (!rc && ex->o.after_node) ex->o.after_node(ex->o.after_ctx, i);
        }
    }
    ex->last.run_s = adt_now_s() - t0;
    stats_add(&ex->total, &ex->last);
    return rc;
}

int adt_exec_run(adt_exec *ex) { return exec_run(ex, 0, 1); }
int adt_exec_run_forward_mode(adt_exec *ex, int training) { return exec_run(ex, 1, training); }
int adt_exec_run_forward(adt_exec *ex) { return exec_run(ex, 1, 0); }

void adt_exec_get_stats(const adt_exec *ex, adt_exec_stats *last, adt_exec_stats *total) {
    if (last) *last = ex->last;
    if (total) *total = ex->total;
}

void adt_exec_reset_stats(adt_exec *ex) {
    memset(&ex->last, 0, sizeof ex->last);
    memset(&ex->total, 0, sizeof ex->total);
    memset(ex->node_s, 0, (size_t)(ex->g->n_nodes + 1) * sizeof *ex->node_s);
}

const adt_graph *adt_exec_graph(const adt_exec *ex) { return ex->g; }

int adt_exec_overlaps(const adt_exec *ex) { return ex->split; }

int adt_exec_matmul_accumulates(const adt_exec *ex, int node) {
    if (node < 0 || node >= ex->g->n_nodes || ex->g->nodes[node].op != ADT_OP_MATMUL) return 0;
    return ex->bias_of[node] >= 0 || ex->momentum_of[node] >= 0;
}

char *adt_exec_schedule_str(const adt_exec *ex) {
    if (!ex->split) return NULL;
    static const char *const kind[] = {"run", "start", "wait"};
    size_t cap = (size_t)ex->n_ev * (ADT_NAME_LEN + 24) + 1, k = 0;
    char *s = adt_malloc(cap);
    s[0] = 0;
    for (int e = 0; e < ex->n_ev; e++)
        k += (size_t)snprintf(s + k, cap - k, "%s %d %s\n", kind[ex->ev[e].kind], ex->ev[e].node,
                              ex->g->nodes[ex->ev[e].node].name);
    return s;
}

const adt_memplan *adt_exec_memplan(const adt_exec *ex) { return &ex->mp; }
const double *adt_exec_node_seconds(const adt_exec *ex) { return ex->node_s; }

/* ---- microbatch slots ----------------------------------------------------------------------------
 * Each slot is an arena and a copy of the fed values (lr and step excepted: one per step); the
 * parameters and optimizer state are the one state block. A gradient the update reads (a value a
 * backward node makes and an optimizer node, or the communication before it, reads) is summed
 * over the backward passes into an accumulator; the update runs on slot 0's table with each such
 * value pointing at its accumulator, so its all-reduce, or the update itself, reads the sum.
 */
/* The root values that get an accumulator (acc[r] = 1): a backward node makes them in the arena
 * and an update-phase node reads them. */
static void accumulated(const adt_graph *g, const adt_memplan *mp, char *acc) {
    memset(acc, 0, (size_t)g->n_values);
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; node_phase(&g->nodes[i]) == 2 && k < g->nodes[i].n_in; k++) {
            int r = mp->root[g->nodes[i].in[k]], pr = g->values[r].producer;
            acc[r] |= mp->offset[r] >= 0 && pr >= 0 && node_phase(&g->nodes[pr]) == 1;
        }
}

static int slot_fed(const adt_exec *ex, int r) {
    const adt_graph *g = ex->g;
    return ex->mp.state_offset[r] >= 0 && adt_role_is_fed(g->values[r].role) && r != g->lr_input && r != g->step_input;
}

static void slots_create(adt_exec *ex) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    int nv = g->n_values, K = ex->n_slots;
    int64_t *fed_off = adt_malloc((size_t)(nv + 1) * sizeof *fed_off), fed_bytes = 0;
    for (int v = 0; v < nv; v++) {
        fed_off[v] = -1;
        if (mp->root[v] == v && slot_fed(ex, v)) {
            fed_off[v] = fed_bytes;
            fed_bytes += (adt_value_bytes(g, v) + 63) & ~(int64_t)63;
        }
    }
    ex->slot_ptr = adt_calloc((size_t)K, sizeof *ex->slot_ptr);
    ex->slot_arena = adt_calloc((size_t)K, sizeof *ex->slot_arena);
    ex->slot_fed = adt_calloc((size_t)K, sizeof *ex->slot_fed);
    /* exec_buffer's, as slot 0's arena: private ones sent a pipeline stage's collectives
     * through MPI */
    for (int k = 0; k < K; k++) {
        ex->slot_arena[k] = k ? exec_buffer(ex, (size_t)mp->arena_bytes) : NULL;
        ex->slot_fed[k] = k ? exec_buffer(ex, (size_t)fed_bytes) : NULL;
        void **p = ex->slot_ptr[k] = adt_calloc((size_t)nv + 1, sizeof *p);
        for (int v = 0; v < nv; v++) {
            int r = mp->root[v];
            if (!k || (mp->offset[r] < 0 && fed_off[r] < 0)) p[v] = ex->ptr[v]; /* slot 0, or shared state */
            else if (fed_off[r] >= 0) p[v] = ex->slot_fed[k] + fed_off[r];
            else p[v] = ex->slot_arena[k] + mp->offset[r];
        }
    }
    free(fed_off);
    ex->acc = adt_calloc((size_t)nv + 1, sizeof *ex->acc);
    ex->upd_ptr = adt_malloc((size_t)(nv + 1) * sizeof *ex->upd_ptr);
    char *acc = adt_malloc((size_t)nv + 1);
    accumulated(g, mp, acc);
    int64_t acc_bytes = 0; /* one block for all: a peer maps each shared block it reads */
    for (int r = 0; r < nv; r++)
        if (acc[r]) acc_bytes += (adt_value_bytes(g, r) + 63) & ~(int64_t)63;
    ex->acc_block = exec_buffer(ex, (size_t)(acc_bytes ? acc_bytes : 1));
    int64_t at = 0;
    for (int r = 0; r < nv; r++)
        if (acc[r]) ex->acc[r] = (float *)(ex->acc_block + at), at += (adt_value_bytes(g, r) + 63) & ~(int64_t)63;
    free(acc);
    for (int v = 0; v < nv; v++) {
        int r = mp->root[v];
        ex->upd_ptr[v] = ex->acc[r] ? (void *)ex->acc[r] : ex->ptr[v];
    }
}

static void slots_free(adt_exec *ex) {
    for (int k = 0; k < ex->n_slots; k++) {
        free(ex->slot_ptr[k]);
        exec_buffer_free(ex, ex->slot_arena[k]);
        exec_buffer_free(ex, ex->slot_fed[k]);
    }
    exec_buffer_free(ex, ex->acc_block);
    free(ex->acc);
    free(ex->upd_ptr);
    free(ex->slot_ptr);
    free(ex->slot_arena);
    free(ex->slot_fed);
}

/* The nodes of one pass, in order, on the pointer table `ptr`. */
static int run_phase(adt_exec *ex, void **ptr, int phase, int training) {
    double t0 = adt_now_s();
    memset(&ex->last, 0, sizeof ex->last);
    ex->last.runs = 1;
    void **saved = ex->ptr;
    ex->ptr = ptr;
    int rc = ADT_OK;
    for (int p = 0; p < ex->g->n_nodes && !rc; p++)
        if (node_phase(&ex->g->nodes[ex->order[p]]) == phase) rc = run_node(ex, ex->order[p], training);
    ex->ptr = saved;
    ex->last.run_s = adt_now_s() - t0;
    stats_add(&ex->total, &ex->last);
    return rc;
}

int adt_exec_run_pass(adt_exec *ex, int slot, int pass) {
    if (!ex->n_slots || slot < 0 || slot >= ex->n_slots)
        return adt_error(ADT_ERR_ARG, "adt_exec_run_pass: slot %d, the executor has %d microbatch slots", slot, ex->n_slots);
    int rc = run_phase(ex, ex->slot_ptr[slot], pass == 1, pass != 2);
    if (rc || pass != 1) return rc;
    const adt_graph *g = ex->g;
    for (int r = 0; r < g->n_values; r++) {
        if (!ex->acc[r]) continue;
        adt_exec_accumulate(ex->acc[r], ex->slot_ptr[slot][r], adt_value_numel(g, r), !ex->n_acc);
    }
    ex->n_acc++;
    return ADT_OK;
}

void adt_exec_accumulate(float *acc, const float *x, int64_t n, int first) {
    if (first) memcpy(acc, x, (size_t)n * sizeof *acc);
    else
        for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

int adt_exec_run_update(adt_exec *ex) {
    if (!ex->n_slots) return adt_error(ADT_ERR_ARG, "adt_exec_run_update: the executor has no microbatch slots");
    if (!ex->n_acc) return adt_error(ADT_ERR_STATE, "adt_exec_run_update: no backward pass since the last update");
    const adt_graph *g = ex->g;
    float s = 1.0f / (float)ex->n_acc; /* each microbatch's loss is its own mean */
    for (int r = 0; r < g->n_values && ex->n_acc > 1; r++) {
        if (!ex->acc[r]) continue;
        int64_t n = adt_value_numel(g, r);
        for (int64_t i = 0; i < n; i++) ex->acc[r][i] *= s;
    }
    ex->n_acc = 0;
    return run_phase(ex, ex->upd_ptr, 2, 1);
}

void adt_exec_set_microbatch(adt_exec *ex, int microbatch) { ex->microbatch = microbatch; }

void *adt_exec_slot_data(adt_exec *ex, int slot, int value) {
    if (value < 0 || value >= ex->g->n_values) return NULL;
    if (!ex->n_slots) return slot ? NULL : ex->ptr[value];
    return slot >= 0 && slot < ex->n_slots ? ex->slot_ptr[slot][value] : NULL;
}

float *adt_exec_grad_acc(adt_exec *ex, int value) {
    if (!ex->n_slots || value < 0 || value >= ex->g->n_values) return NULL;
    return ex->acc[ex->mp.root[value]];
}
