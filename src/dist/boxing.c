/*
 * boxing.c - SBP conversions: which collective converts one mesh axis, what it costs under the
 * alpha-beta model, and the cheapest multi-axis program as a shortest path over nd-SBP states.
 *
 * The state graph of a tensor of rank r on a d-axis mesh has (r+2)^d states (each mesh axis B,
 * P or S(k)); an edge changes one mesh axis by one valid step. At most 8^3 = 512 states, so a
 * plain O(V^2) Dijkstra is quick enough; callers that price many edges cache by
 * (from, to, shape, mesh).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

const char *adt_boxing_kind_name(int kind) {
    static const char *names[] = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                  "slice",      "keep_one",       "zero_fill"};
    return kind >= 0 && kind < ADT_BOXING_KIND_COUNT ? names[kind] : "?";
}

static int sbp_same(adt_sbp a, adt_sbp b) {
    return a.kind == b.kind && (a.kind != ADT_SBP_S || a.axis == b.axis);
}

int adt_boxing_kind_of(adt_sbp from, adt_sbp to) {
    if (sbp_same(from, to)) return -1;
    switch (from.kind) {
    case ADT_SBP_P: return to.kind == ADT_SBP_B ? ADT_BOXING_ALL_REDUCE : ADT_BOXING_REDUCE_SCATTER;
    case ADT_SBP_S: return to.kind == ADT_SBP_B ? ADT_BOXING_ALL_GATHER
                         : to.kind == ADT_SBP_S ? ADT_BOXING_ALL_TO_ALL
                                                : ADT_BOXING_ZERO_FILL;
    default: return to.kind == ADT_SBP_S ? ADT_BOXING_SLICE : ADT_BOXING_KEEP_ONE;
    }
}

/* A step on mesh axis `axis` must not change the block that an inner axis splits further. */
int adt_boxing_step_valid(const adt_ndsbp *s, int axis, adt_sbp to) {
    if (axis < 0 || axis >= s->ndim) return 0;
    adt_sbp from = s->s[axis];
    if (sbp_same(from, to)) return 0;
    for (int b = axis + 1; b < s->ndim; b++) {
        if (s->s[b].kind != ADT_SBP_S) continue;
        int k = s->s[b].axis;
        if (from.kind == ADT_SBP_S && from.axis == k) return 0;
        if (to.kind == ADT_SBP_S && to.axis == k) return 0;
    }
    return 1;
}

double adt_boxing_bytes(int kind, int n, double group_bytes) {
    double f = n > 0 ? (double)(n - 1) / n : 0.0;
    switch (kind) {
    case ADT_BOXING_ALL_REDUCE: return 2.0 * f * group_bytes;
    case ADT_BOXING_REDUCE_SCATTER:
    case ADT_BOXING_ALL_GATHER: return f * group_bytes;
    case ADT_BOXING_ALL_TO_ALL: return f / n * group_bytes;
    default: return 0.0;
    }
}

double adt_boxing_time(int kind, int n, double group_bytes, double alpha, double beta, double local) {
    double msgs;
    switch (kind) {
    case ADT_BOXING_ALL_REDUCE: msgs = 2.0 * (n - 1); break;
    case ADT_BOXING_REDUCE_SCATTER:
    case ADT_BOXING_ALL_GATHER:
    case ADT_BOXING_ALL_TO_ALL: msgs = n - 1; break;
    default: return local;
    }
    return msgs * alpha + adt_boxing_bytes(kind, n, group_bytes) * beta;
}

double adt_boxing_group_bytes(const adt_ndsbp *s, int axis, const adt_mesh *m, adt_shape global,
                              size_t elem_size) {
    adt_ndsbp other = *s;
    other.s[axis] = (adt_sbp){ADT_SBP_B, 0};
    adt_shape lo, hi;
    adt_ndsbp_block_bounds(&other, m, global, &lo, &hi);
    return (double)adt_shape_numel(&hi) * (double)elem_size;
}

/* ---- the state graph ---------------------------------------------------------------------- */

/* per mesh axis: 0 = B, 1 = P, 2 + k = S(k) */
static adt_sbp code_sbp(int c) {
    if (c == 0) return (adt_sbp){ADT_SBP_B, 0};
    if (c == 1) return (adt_sbp){ADT_SBP_P, 0};
    return (adt_sbp){ADT_SBP_S, (int8_t)(c - 2)};
}

static int sbp_code(adt_sbp s) { return s.kind == ADT_SBP_B ? 0 : s.kind == ADT_SBP_P ? 1 : 2 + s.axis; }

static adt_ndsbp state_ndsbp(int id, int base, int d) {
    adt_ndsbp s = adt_ndsbp_all_b(d);
    for (int m = d - 1; m >= 0; m--) {
        s.s[m] = code_sbp(id % base);
        id /= base;
    }
    return s;
}

static int state_id(const adt_ndsbp *s, int base) {
    int id = 0;
    for (int m = 0; m < s->ndim; m++) id = id * base + sbp_code(s->s[m]);
    return id;
}

static void make_step(const adt_mesh *m, adt_shape global, size_t elem, const adt_ndsbp *from, int axis,
                      adt_sbp to, const adt_comm_cost *cost, adt_boxing_step *st) {
    memset(st, 0, sizeof *st);
    st->mesh_axis = axis;
    st->from = *from;
    st->to = *from;
    st->to.s[axis] = to;
    st->kind = adt_boxing_kind_of(from->s[axis], to);
    st->from_axis = from->s[axis].kind == ADT_SBP_S ? from->s[axis].axis : -1;
    st->to_axis = to.kind == ADT_SBP_S ? to.axis : -1;
    st->group_size = m->dim[axis];
    st->group_bytes = adt_boxing_group_bytes(from, axis, m, global, elem);
    st->bytes = adt_boxing_bytes(st->kind, st->group_size, st->group_bytes);
    st->time = adt_boxing_time(st->kind, st->group_size, st->group_bytes, cost->alpha[axis], cost->beta[axis],
                               cost->local);
}

static int check_state(const char *what, const adt_ndsbp *s, const adt_mesh *m, adt_shape global) {
    char buf[64];
    if (s->ndim != m->ndim)
        return adt_error(ADT_ERR_ARG, "boxing: %s state %s has %d entries for a %d-axis mesh", what,
                         adt_ndsbp_str(s, buf, sizeof buf), s->ndim, m->ndim);
    for (int a = 0; a < s->ndim; a++) {
        const adt_sbp *x = &s->s[a];
        if (x->kind < ADT_SBP_B || x->kind > ADT_SBP_P || (x->kind == ADT_SBP_S && (x->axis < 0 || x->axis >= global.ndim)))
            return adt_error(ADT_ERR_ARG, "boxing: %s state %s does not fit a rank-%d tensor", what,
                             adt_ndsbp_str(s, buf, sizeof buf), global.ndim);
    }
    return ADT_OK;
}

#define MAX_STATES 512 /* (ADT_MAX_DIMS + 2) ^ ADT_MAX_MESH_DIMS */

/* Only f32 partial sums exist (the virtual and the comm executors reduce f32). */
static int dtype_sums(adt_dtype dt) { return dt == ADT_F32; }

/* Dijkstra from src; intermediate states must have non-empty blocks unless allow_empty. */
static void search(const adt_mesh *m, adt_shape global, adt_dtype dtype, const adt_comm_cost *cost, int src, int dst,
                   int allow_empty, double *dist, int *prev, int *prev_axis) {
    int d = m->ndim, base = global.ndim + 2, n = 1;
    size_t elem_size = adt_dtype_size(dtype);
    for (int a = 0; a < d; a++) n *= base;
    int done[MAX_STATES];
    for (int i = 0; i < n; i++) dist[i] = INFINITY, prev[i] = -1, prev_axis[i] = -1, done[i] = 0;
    dist[src] = 0;
    for (;;) {
        int u = -1;
        for (int i = 0; i < n; i++)
            if (!done[i] && dist[i] < INFINITY && (u < 0 || dist[i] < dist[u])) u = i;
        if (u < 0 || u == dst) break;
        done[u] = 1;
        adt_ndsbp su = state_ndsbp(u, base, d);
        for (int a = 0; a < d; a++)
            for (int c = 0; c < base; c++) {
                adt_sbp t = code_sbp(c);
                if (!adt_boxing_step_valid(&su, a, t)) continue;
                if (t.kind == ADT_SBP_P && !dtype_sums(dtype)) continue;
                adt_boxing_step st;
                make_step(m, global, elem_size, &su, a, t, cost, &st);
                int v = state_id(&st.to, base);
                if (done[v] || !(dist[u] + st.time < dist[v])) continue;
                if (v != dst && !allow_empty && !adt_ndsbp_fits(&st.to, m, global)) continue;
                dist[v] = dist[u] + st.time;
                prev[v] = u;
                prev_axis[v] = a;
            }
    }
}

int adt_boxing_plan(const adt_mesh *m, adt_shape global, adt_dtype dtype, const adt_ndsbp *from,
                    const adt_ndsbp *to, const adt_comm_cost *cost, adt_boxing_prog *out) {
    memset(out, 0, sizeof *out);
    out->global = global;
    out->dtype = dtype;
    int rc = check_state("source", from, m, global);
    if (!rc) rc = check_state("target", to, m, global);
    if (rc) return rc;
    char a[64], b[64];
    if (!dtype_sums(dtype) && (adt_ndsbp_partial_mask(from) || adt_ndsbp_partial_mask(to)))
        return adt_error(ADT_ERR_ARG, "boxing: %s -> %s of %s data: only f32 is held as partial sums",
                         adt_ndsbp_str(from, a, sizeof a), adt_ndsbp_str(to, b, sizeof b), adt_dtype_name(dtype));
    int d = m->ndim, base = global.ndim + 2;
    size_t elem_size = adt_dtype_size(dtype);
    double dist[MAX_STATES];
    int prev[MAX_STATES], prev_axis[MAX_STATES];
    int src = state_id(from, base), dst = state_id(to, base);
    search(m, global, dtype, cost, src, dst, 0, dist, prev, prev_axis);
    if (!(dist[dst] < INFINITY)) search(m, global, dtype, cost, src, dst, 1, dist, prev, prev_axis);
    if (!(dist[dst] < INFINITY)) { /* cannot happen: all-B is reachable from and reaches every state */
        return adt_error(ADT_ERR_ARG, "boxing: no path from %s to %s", adt_ndsbp_str(from, a, sizeof a),
                         adt_ndsbp_str(to, b, sizeof b));
    }
    int path[MAX_STATES], len = 0;
    for (int v = dst; v != src; v = prev[v]) path[len++] = v;
    if (len > ADT_BOXING_MAX_STEPS)
        return adt_error(ADT_ERR_ARG, "boxing: the cheapest path has %d steps, more than %d", len, ADT_BOXING_MAX_STEPS);
    for (int i = len - 1; i >= 0; i--) {
        int v = path[i];
        adt_ndsbp su = state_ndsbp(prev[v], base, d), sv = state_ndsbp(v, base, d);
        int ax = prev_axis[v];
        adt_boxing_step *st = &out->step[out->n_steps++];
        make_step(m, global, elem_size, &su, ax, sv.s[ax], cost, st);
        out->time += st->time;
    }
    return ADT_OK;
}

int adt_boxing_plan_all(const adt_mesh *m, adt_shape global, adt_dtype dtype, const adt_ndsbp *from,
                        const adt_comm_cost *cost, adt_ndsbp *to, adt_boxing_cached *out) {
    if (check_state("source", from, m, global) || (!dtype_sums(dtype) && adt_ndsbp_partial_mask(from))) return -1;
    int d = m->ndim, base = global.ndim + 2, n = 1;
    for (int a = 0; a < d; a++) n *= base;
    size_t elem_size = adt_dtype_size(dtype);
    double dist[MAX_STATES];
    int prev[MAX_STATES], prev_axis[MAX_STATES], src = state_id(from, base);
    search(m, global, dtype, cost, src, -1, 0, dist, prev, prev_axis);
    for (int v = 0; v < n; v++) {
        to[v] = state_ndsbp(v, base, d);
        memset(&out[v], 0, sizeof out[v]);
        out[v].time = dist[v] < INFINITY ? dist[v] : ADT_BOXING_NONE;
        int len = 0;
        for (int u = v; u != src && dist[v] < INFINITY; u = prev[u], len++) {
            adt_ndsbp su = state_ndsbp(prev[u], base, d), sv = state_ndsbp(u, base, d);
            adt_boxing_step st;
            make_step(m, global, elem_size, &su, prev_axis[u], sv.s[prev_axis[u]], cost, &st);
            out[v].kind[st.kind] += st.time;
        }
        if (len > ADT_BOXING_MAX_STEPS) out[v].time = ADT_BOXING_NONE; /* adt_boxing_plan refuses it */
    }
    return n;
}

char *adt_boxing_prog_str(const adt_boxing_prog *p, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    if (!p->n_steps) snprintf(buf, n, "no steps\n");
    for (int i = 0; i < p->n_steps && k < n; i++) {
        const adt_boxing_step *s = &p->step[i];
        char a[64], b[64];
        k += (size_t)snprintf(buf + k, n - k, "axis %d: %s %s -> %s, G %.0f B, sends %.0f B\n", s->mesh_axis,
                              adt_boxing_kind_name(s->kind), adt_ndsbp_str(&s->from, a, sizeof a),
                              adt_ndsbp_str(&s->to, b, sizeof b), s->group_bytes, s->bytes);
    }
    return buf;
}
