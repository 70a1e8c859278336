/*
 * mesh_comm.c - BOXING nodes over real communicators: a mesh's per-axis sub-communicators and
 * the executor hook that turns each boxing step into the collective of its kind.
 *
 * A step on mesh axis a runs within this rank's group (the ranks whose coordinates differ only
 * in a; the axis communicator, whose rank is the coordinate on a). What each rank sends to peer
 * q is the part of its old block that lies in q's new block, and what it receives from q is the
 * part of q's old block that lies in its own new block: the overlaps adt_boxing_step_local walks.
 * For each kind those overlaps are what the collective moves:
 *   all_reduce      old = new block on every rank; sum in place on the output
 *   reduce_scatter  old = the group's block; peer q's part is q's new block; summed
 *   all_gather      my whole old block goes to every peer; q's old block lands in my new one
 *   all_to_all      a distinct part per peer each way
 * A part is a box; the parts go in peer order, each contiguous, in the send and receive buffers.
 * When a buffer's parts are already laid out that way in the block itself (a split of the
 * outermost axis that is not 1), the block is the buffer; otherwise the parts are packed into
 * a staging buffer before the send or placed from one after the receive.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"

/* One step's transfer, worked out once and reused every training step. */
typedef struct xfer {
    adt_boxing_step st;
    adt_shape global;
    adt_dtype dt;
    size_t es;
    adt_comm *c;
    int n;                   /* group size */
    adt_box from_me, to_me;  /* my block before and after */
    int64_t n_in, n_out;
    adt_box *sbox, *rbox;    /* [n] the part sent to / received from each peer */
    int64_t *scount, *rcount; /* [n] their element counts */
    int send_direct, recv_direct;
    void *sbuf, *rbuf;       /* staging, when not direct */
    const void **group;      /* [n] for the local kinds */
    adt_comm_req *req;
} xfer;

typedef struct binding {
    adt_mesh_comm *mc;
    const adt_graph *lg;
    xfer **x; /* [lg->n_nodes] */
    adt_comm_hook hook;
    struct binding *next;
} binding;

struct adt_mesh_comm {
    adt_comm *world;
    adt_mesh mesh;
    int *ranks; /* the mesh's rank table (owned; the identity when the mesh has none) */
    int *split; /* the mesh's batch split (owned), or NULL */
    int coord[ADT_MAX_MESH_DIMS];
    adt_comm *axis[ADT_MAX_MESH_DIMS];
    binding *bindings;
    int64_t ops;
    double bytes;
};

/* ---- the parts ------------------------------------------------------------------------------- */

/* Whether box b is one contiguous run of its parent block p, and where it starts. */
static int box_run(const adt_box *b, const adt_box *p, int64_t *start) {
    int nd = p->shape.ndim, d = 0;
    while (d < nd && b->shape.dim[d] == 1) d++;
    for (int e = d + 1; e < nd; e++)
        if (b->shape.dim[e] != p->shape.dim[e]) return 0;
    int64_t off = 0, stride = 1;
    for (int e = nd - 1; e >= 0; e--) {
        off += (b->offset[e] - p->offset[e]) * stride;
        stride *= p->shape.dim[e];
    }
    *start = off;
    return 1;
}

/* Whether the parts, in peer order, tile block p exactly as they lie in it. */
static int parts_in_place(const adt_box *parts, const int64_t *count, int n, const adt_box *p) {
    int64_t at = 0, start;
    for (int q = 0; q < n; q++) {
        if (!count[q]) continue;
        if (!box_run(&parts[q], p, &start) || start != at) return 0;
        at += count[q];
    }
    return at == adt_shape_numel(&p->shape);
}

static void xfer_free(xfer *x) {
    if (!x) return;
    free(x->sbox);
    free(x->rbox);
    free(x->scount);
    free(x->rcount);
    adt_comm_shared_free(x->sbuf);
    adt_comm_shared_free(x->rbuf);
    free(x->group);
    free(x);
}

static int is_local_kind(int kind) {
    return kind == ADT_BOXING_SLICE || kind == ADT_BOXING_KEEP_ONE || kind == ADT_BOXING_ZERO_FILL;
}

static xfer *xfer_make(adt_mesh_comm *mc, const adt_boxing_step *st, adt_shape global, adt_dtype dt) {
    xfer *x = adt_calloc(1, sizeof *x);
    int ax = st->mesh_axis, n = mc->mesh.dim[ax];
    x->st = *st;
    x->global = global;
    x->dt = dt;
    x->es = adt_dtype_size(dt);
    x->c = mc->axis[ax];
    x->n = n;
    x->from_me = adt_ndsbp_block(&st->from, &mc->mesh, mc->coord, global);
    x->to_me = adt_ndsbp_block(&st->to, &mc->mesh, mc->coord, global);
    x->n_in = adt_shape_numel(&x->from_me.shape);
    x->n_out = adt_shape_numel(&x->to_me.shape);
    x->group = adt_calloc((size_t)n, sizeof *x->group);
    x->send_direct = x->recv_direct = 1; /* all_reduce: in place on the output */
    if (is_local_kind(st->kind) || st->kind == ADT_BOXING_ALL_REDUCE) return x;
    x->sbox = adt_calloc((size_t)n, sizeof *x->sbox);
    x->rbox = adt_calloc((size_t)n, sizeof *x->rbox);
    x->scount = adt_calloc((size_t)n, sizeof *x->scount);
    x->rcount = adt_calloc((size_t)n, sizeof *x->rcount);
    int cq[ADT_MAX_MESH_DIMS];
    memcpy(cq, mc->coord, sizeof cq);
    for (int q = 0; q < n; q++) {
        cq[ax] = q;
        adt_box to_q = adt_ndsbp_block(&st->to, &mc->mesh, cq, global);
        adt_box from_q = adt_ndsbp_block(&st->from, &mc->mesh, cq, global);
        x->scount[q] = adt_box_overlap(&x->from_me, &to_q, &x->sbox[q]);
        x->rcount[q] = adt_box_overlap(&from_q, &x->to_me, &x->rbox[q]);
    }
    /* all_gather sends the whole block (the collective takes it once); reduce_scatter receives
     * straight into the output, which is its own part */
    x->send_direct = st->kind == ADT_BOXING_ALL_GATHER || parts_in_place(x->sbox, x->scount, n, &x->from_me);
    x->recv_direct = st->kind == ADT_BOXING_REDUCE_SCATTER || parts_in_place(x->rbox, x->rcount, n, &x->to_me);
    int64_t ns = 0, nr = 0;
    for (int q = 0; q < n; q++) ns += x->scount[q], nr += x->rcount[q];
    /* shared, as the executor's buffers are: the collective then runs through shared memory
     * (comm.h); a private staging buffer sent a DLRM's tensor-parallel reduce-scatters of packed
     * parts through MPI (0.27 ms for 216 KiB inside a 2-rank step) */
    if (!x->send_direct) x->sbuf = adt_comm_shared_alloc((size_t)(ns > 0 ? ns : 1) * x->es);
    if (!x->recv_direct) x->rbuf = adt_comm_shared_alloc((size_t)(nr > 0 ? nr : 1) * x->es);
    return x;
}

/* Copies each peer's part between a block and a buffer of parts in peer order. */
static void parts_pack(const xfer *x, void *buf, const void *block) {
    size_t at = 0;
    for (int q = 0; q < x->n; q++) {
        if (!x->scount[q]) continue;
        adt_box_transfer((char *)buf + at * x->es, &x->sbox[q], block, &x->from_me, x->es, 0);
        at += (size_t)x->scount[q];
    }
}

static void parts_place(const xfer *x, void *block, const void *buf) {
    size_t at = 0;
    for (int q = 0; q < x->n; q++) {
        if (!x->rcount[q]) continue;
        adt_box_transfer(block, &x->to_me, (const char *)buf + at * x->es, &x->rbox[q], x->es, 0);
        at += (size_t)x->rcount[q];
    }
}

/* ---- one step: start and finish ------------------------------------------------------------- */

static int xfer_start(adt_mesh_comm *mc, xfer *x, const void *in, void *out) {
    const adt_boxing_step *st = &x->st;
    mc->ops++;
    mc->bytes += st->bytes;
    if (is_local_kind(st->kind)) {
        x->group[mc->coord[st->mesh_axis]] = in;
        return adt_boxing_step_local(st, &mc->mesh, mc->coord, x->global, x->dt, x->group, out);
    }
    const void *send = in;
    if (!x->send_direct) {
        parts_pack(x, x->sbuf, in);
        send = x->sbuf;
    }
    void *recv = x->recv_direct ? out : x->rbuf;
    switch (st->kind) {
    case ADT_BOXING_ALL_REDUCE:
        if (out != in) memcpy(out, in, (size_t)x->n_in * x->es);
        return adt_comm_iallreduce(x->c, out, x->n_in, x->dt, &x->req);
    case ADT_BOXING_REDUCE_SCATTER:
        return adt_comm_ireduce_scatter(x->c, send, recv, x->scount, x->dt, &x->req);
    case ADT_BOXING_ALL_GATHER:
        return adt_comm_iallgather(x->c, send, recv, x->rcount, x->dt, &x->req);
    case ADT_BOXING_ALL_TO_ALL:
        return adt_comm_ialltoall(x->c, send, x->scount, recv, x->rcount, x->dt, &x->req);
    default:
        return adt_error(ADT_ERR_ARG, "boxing: unknown step kind %d", st->kind);
    }
}

static int xfer_finish(xfer *x, void *out) {
    int rc = adt_comm_wait(&x->req);
    if (!rc && !x->recv_direct && x->rbuf) parts_place(x, out, x->rbuf);
    return rc;
}

int adt_mesh_comm_step(adt_mesh_comm *mc, const adt_boxing_step *st, adt_shape global, adt_dtype dt,
                       const void *in, void *out) {
    if (st->mesh_axis < 0 || st->mesh_axis >= mc->mesh.ndim || st->from.ndim != mc->mesh.ndim ||
        st->to.ndim != mc->mesh.ndim)
        return adt_error(ADT_ERR_ARG, "boxing step on mesh axis %d with %d-axis states, on a %d-axis mesh",
                         st->mesh_axis, st->from.ndim, mc->mesh.ndim);
    xfer *x = xfer_make(mc, st, global, dt);
    int rc = xfer_start(mc, x, in, out);
    if (!rc) rc = xfer_finish(x, out);
    xfer_free(x);
    return rc;
}

/* ---- the executor hook ------------------------------------------------------------------------ */

static int node_xfer(binding *b, const adt_kctx *k, xfer **out) {
    int id = (int)(k->n - k->g->nodes);
    if (k->g != b->lg || id < 0 || id >= b->lg->n_nodes)
        return adt_error(ADT_ERR_ARG, "boxing node %s: the hook was made for another graph", k->n->name);
    if (!b->x[id]) {
        adt_boxing_step st;
        int rc = adt_boxing_node_step(b->lg, k->n, &b->mc->mesh, &st);
        if (rc) return rc;
        const adt_value *v = &b->lg->values[k->n->in[0]];
        b->x[id] = xfer_make(b->mc, &st, v->global_shape, v->dtype);
    }
    *out = b->x[id];
    return ADT_OK;
}

static int hook_start(void *ctx, const adt_kctx *k) {
    binding *b = ctx;
    xfer *x = NULL;
    int rc = node_xfer(b, k, &x);
    return rc ? rc : xfer_start(b->mc, x, k->in[0], k->out[0]);
}

static int hook_test(void *ctx, const adt_kctx *k, int *done) {
    binding *b = ctx;
    xfer *x = NULL;
    int rc = node_xfer(b, k, &x);
    if (rc) return *done = 1, rc;
    return adt_comm_test(&x->req, done);
}

static int hook_finish(void *ctx, const adt_kctx *k) {
    binding *b = ctx;
    xfer *x = NULL;
    int rc = node_xfer(b, k, &x);
    return rc ? rc : xfer_finish(x, k->out[0]);
}

static int hook_run(void *ctx, const adt_kctx *k) {
    int rc = hook_start(ctx, k);
    return rc ? rc : hook_finish(ctx, k);
}

static void binding_free(binding *b) {
    for (int i = 0; i < b->lg->n_nodes; i++) xfer_free(b->x[i]);
    free(b->x);
    free(b);
}

const adt_comm_hook *adt_mesh_comm_hook(adt_mesh_comm *mc, const adt_graph *lg) {
    for (binding *b = mc->bindings; b; b = b->next)
        if (b->lg == lg) return &b->hook;
    binding *b = adt_calloc(1, sizeof *b);
    b->mc = mc;
    b->lg = lg;
    b->x = adt_calloc((size_t)(lg->n_nodes ? lg->n_nodes : 1), sizeof *b->x);
    b->hook = (adt_comm_hook){.run = hook_run, .ctx = b, .start = hook_start, .test = hook_test, .finish = hook_finish,
                              .inplace_allreduce = 1};
    b->next = mc->bindings;
    mc->bindings = b;
    return &b->hook;
}

void adt_mesh_comm_release(adt_mesh_comm *mc, const adt_graph *lg) {
    for (binding **p = &mc->bindings; *p; p = &(*p)->next)
        if ((*p)->lg == lg) {
            binding *b = *p;
            *p = b->next;
            binding_free(b);
            return;
        }
}

/* ---- the mesh ------------------------------------------------------------------------------------ */

int adt_mesh_comm_create(adt_mesh_comm **out, adt_comm *world, const adt_mesh *mesh) {
    *out = NULL;
    char mb[32];
    if (mesh->nranks != adt_comm_size(world))
        return adt_error(ADT_ERR_ARG, "mesh %s has %d devices, but the world (%s) has %d ranks; expected the same number",
                         adt_mesh_str(mesh, mb, sizeof mb), mesh->nranks, adt_comm_name(world), adt_comm_size(world));
    adt_mesh_comm *mc = adt_calloc(1, sizeof *mc);
    mc->world = world;
    mc->mesh = *mesh;
    mc->ranks = adt_malloc((size_t)mesh->nranks * sizeof *mc->ranks); /* comm/ wants the table */
    for (int i = 0; i < mesh->nranks; i++) mc->ranks[i] = mesh->ranks ? mesh->ranks[i] : i;
    mc->mesh.ranks = mc->ranks;
    if (mesh->split) { /* blocks outlive the plan the mesh came from */
        int n = mesh->dim[mesh->split_axis];
        mc->split = adt_malloc((size_t)n * sizeof *mc->split);
        memcpy(mc->split, mesh->split, (size_t)n * sizeof *mc->split);
        mc->mesh.split = mc->split;
    }
    int rc = adt_comm_mesh_coords(&mc->mesh, adt_comm_rank(world), mc->coord);
    if (rc != 1) {
        adt_mesh_comm_free(mc);
        return rc < 0 ? rc : adt_error(ADT_ERR_ARG, "rank %d of %s is not in mesh %s", adt_comm_rank(world),
                                       adt_comm_name(world), adt_mesh_str(mesh, mb, sizeof mb));
    }
    for (int a = 0; a < mesh->ndim; a++) {
        rc = adt_comm_mesh_axis(world, &mc->mesh, a, &mc->axis[a]);
        if (rc) {
            adt_mesh_comm_free(mc);
            return rc;
        }
    }
    *out = mc;
    return ADT_OK;
}

int adt_mesh_comm_free(adt_mesh_comm *mc) {
    if (!mc) return ADT_OK;
    while (mc->bindings) {
        binding *b = mc->bindings;
        mc->bindings = b->next;
        binding_free(b);
    }
    int rc = ADT_OK;
    for (int a = 0; a < ADT_MAX_MESH_DIMS; a++) {
        int r = adt_comm_free(mc->axis[a]);
        if (r && !rc) rc = r;
    }
    free(mc->ranks);
    free(mc->split);
    free(mc);
    return rc;
}

adt_comm *adt_mesh_comm_world(const adt_mesh_comm *mc) { return mc->world; }
const adt_mesh *adt_mesh_comm_mesh(const adt_mesh_comm *mc) { return &mc->mesh; }
const int *adt_mesh_comm_coord(const adt_mesh_comm *mc) { return mc->coord; }

void adt_mesh_comm_counts(const adt_mesh_comm *mc, int64_t *ops, double *bytes) {
    if (ops) *ops = mc->ops;
    if (bytes) *bytes = mc->bytes;
}

int adt_mesh_comm_gather(adt_mesh_comm *mc, const adt_ndsbp *layout, adt_shape global, adt_dtype dt,
                         const void *block, void *full) {
    char lb[64];
    if (dt != ADT_F32 && dt != ADT_I32)
        return adt_error(ADT_ERR_ARG, "gather: %s data, expected f32 or i32", adt_dtype_name(dt));
    if (dt != ADT_F32 && adt_ndsbp_partial_mask(layout))
        return adt_error(ADT_ERR_ARG, "gather: %s data held as %s (only f32 is summed)", adt_dtype_name(dt),
                         adt_ndsbp_str(layout, lb, sizeof lb));
    size_t es = adt_dtype_size(dt);
    int64_t n = adt_shape_numel(&global);
    memset(full, 0, (size_t)n * es);
    /* every split part and every partial sum counts, each replica once: coordinate 0 of a B axis */
    int mine = 1;
    for (int a = 0; a < mc->mesh.ndim; a++)
        if (layout->s[a].kind == ADT_SBP_B && mc->coord[a] != 0) mine = 0;
    if (mine) {
        adt_box all = {.global = global, .shape = global};
        adt_box b = adt_ndsbp_block(layout, &mc->mesh, mc->coord, global);
        adt_box_transfer(full, &all, block, &b, es, 0);
    }
    return adt_comm_allreduce(mc->world, full, n, dt);
}
