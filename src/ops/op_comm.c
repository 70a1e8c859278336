/*
 * op_comm.c - communication ops of a rank's local graph. BOXING is one step of an SBP
 * conversion (dist/ plans the steps and packs them into the attributes, ops.h); the kernel
 * hands the node to the executor's communicator, which knows the mesh and this rank's place.
 */
#include "op_util.h"

static int boxing_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    const adt_value *x = OP_IN(g, n, 0);
    adt_shape o = {0};
    o.ndim = x->shape.ndim;
    for (int d = 0; d < o.ndim; d++) {
        o.dim[d] = n->a.i[2 + d];
        if (o.dim[d] < 1) return op_fail_shape(g, n, 0, "a block with a non-empty output block (attributes i2..)");
    }
    os[0] = o;
    od[0] = x->dtype;
    return 0;
}

static void boxing_forward(const adt_kctx *k) {
    /* adt_exec_create refuses a graph with communication ops and no communicator */
    ADT_ASSERT(k->comm && k->comm->run);
    k->comm->run(k->comm->ctx, k);
}

const adt_op_def adt_opdef_boxing = {
    .name = "boxing", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = boxing_infer, .forward = boxing_forward, .is_comm = 1,
};
