/*
 * pipe.c - pipeline-parallel training over MPI: each rank runs its stage's part of the training
 * graph (adt_pipe_stage_build, partitioned for its place on the stage mesh) with microbatch slots,
 * in the 1F1B order, sending the values that cross stages to the rank at the same stage-mesh
 * coordinate of the other stage.
 *
 * A step: for each forward or backward of the stage's schedule, receive the links that pass
 * needs (blocking, bounded by the communicator's timeout), run the pass in the microbatch's slot,
 * copy the links it makes into a staging buffer per link and microbatch and send them
 * non-blocking (so two neighbours sending to each other never wait on one another); then sum the
 * tied parameters' gradients over their holders, run the update once, and wait for the sends.
 * The last stage reads each microbatch's loss after its forward pass (gathered over the stage
 * mesh); the step's loss, their mean, is summed into every rank with one all-reduce.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"

struct adt_pipe {
    adt_comm *world, *stage_comm;
    adt_comm **tied_comm;   /* [st.n_tied] the holders of each tied parameter at this coordinate */
    const adt_plan *p;
    const adt_graph *g;
    adt_pipe_stage st;
    adt_dist_local loc;
    adt_mesh mesh;          /* the stage mesh, positions = ranks of stage_comm */
    int ranks[1024], coord[ADT_MAX_MESH_DIMS], pos;
    adt_mesh_comm *mc;
    adt_exec *ex;
    adt_exec_opts opts;     /* as given: a rebuild makes its executor with them */
    int slots, M;
    int *peer;              /* [st.n_links] the world rank at the other end */
    char **stage_buf;       /* [st.n_links * M] staging of sent blocks */
    adt_comm_req **req;     /* [st.n_links * M] */
    adt_boxing_prog *sum;   /* [st.n_links] what a link made as P takes to be sent (no steps: as is) */
    void *sum_tmp;
    adt_pipe_op *ops;
    double *mb_loss;        /* [M] the last stage's per-microbatch losses */
};

static int local_value(const adt_pipe *pp, int v) {
    int sv = v >= 0 && v < pp->g->n_values ? pp->st.local_of[v] : -1;
    return sv >= 0 ? pp->loc.value[sv] : -1;
}

static int64_t link_bytes(const adt_pipe *pp, int j) {
    return adt_value_bytes(pp->loc.g, pp->loc.value[pp->st.links[j].local]);
}

/* Every rank of the world makes the same calls in the same order (splits are collective). */
static int pipe_comms(adt_pipe *pp) {
    const adt_plan *p = pp->p;
    int rc = adt_comm_split(pp->world, pp->st.stage, pp->pos, &pp->stage_comm);
    if (rc) return rc;
    pp->tied_comm = adt_calloc((size_t)pp->st.n_tied + 1, sizeof *pp->tied_comm);
    for (int k = 0; k < pp->st.n_tied && !rc; k++) {
        const adt_pipe_tied *t = &pp->st.tied[k];
        int held = t->grad >= 0;
        rc = adt_comm_split(pp->world, held ? pp->pos : -1, pp->st.stage, &pp->tied_comm[k]);
    }
    pp->peer = adt_malloc((size_t)(pp->st.n_links + 1) * sizeof *pp->peer);
    int *rk = adt_malloc((size_t)p->mesh.nranks * sizeof *rk);
    for (int j = 0; j < pp->st.n_links && !rc; j++) {
        const adt_pipe_link *l = &pp->st.links[j];
        adt_mesh m;
        rc = adt_plan_stage_mesh(p, l->from == pp->st.stage ? l->to : l->from, &m, rk);
        pp->peer[j] = rk[pp->pos];
    }
    free(rk);
    return rc;
}

/* The tied parameters' accumulated gradients are in the same layout on every holder. */
static int check_tied(adt_pipe *pp) {
    int rc = ADT_OK;
    for (int k = 0; k < pp->st.n_tied && !rc; k++) {
        adt_comm *c = pp->tied_comm[k];
        if (!c) continue;
        int n = adt_comm_size(c), me = adt_comm_rank(c);
        int lv = pp->loc.value[pp->st.tied[k].read];
        int32_t *have = adt_calloc((size_t)n, sizeof *have);
        have[me] = (int32_t)adt_value_numel(pp->loc.g, lv);
        rc = adt_comm_allreduce_i32(c, have, n);
        for (int i = 1; i < n && !rc; i++)
            if (have[i] != have[0] || !adt_exec_grad_acc(pp->ex, lv))
                rc = adt_error(ADT_ERR_ARG, "%s: tied parameter '%s': its gradient blocks differ between the stages "
                               "holding it (%d and %d elements); expected the same layout on each", pp->p->name,
                               pp->g->values[pp->st.tied[k].param].name, have[0], have[i]);
        free(have);
    }
    return rc;
}

int adt_pipe_create(adt_pipe **out, adt_comm *world, const adt_plan *p, const adt_graph *g, const adt_exec_opts *opts) {
    *out = NULL;
    if (p->mesh.nranks != adt_comm_size(world))
        return adt_error(ADT_ERR_ARG, "%s: the plan's mesh has %d devices, the world %d ranks", p->name, p->mesh.nranks,
                         adt_comm_size(world));
    if (p->mesh.nranks > 1024) return adt_error(ADT_ERR_ARG, "%s: %d devices, a pipeline runs at most 1024", p->name, p->mesh.nranks);
    adt_pipe *pp = adt_calloc(1, sizeof *pp);
    pp->world = world;
    pp->p = p;
    pp->g = g;
    pp->M = p->microbatches > 0 ? p->microbatches : 1;
    if (opts) pp->opts = *opts;
    int stage, rc = adt_plan_locate(p, adt_comm_rank(world), &stage, pp->coord);
    if (!rc) rc = adt_pipe_stage_build(g, p, stage, &pp->st);
    adt_dist_plan d = {0};
    if (!rc) {
        d = adt_pipe_stage_dist(&pp->st, p, pp->ranks);
        pp->pos = adt_mesh_index(&d.mesh, pp->coord);
        rc = adt_dist_partition(pp->st.g, &d, pp->coord, &pp->loc);
    }
    /* from here on every rank must make the same collective calls: agree on the setup first */
    int32_t bad = rc != 0;
    int rc2 = adt_comm_allreduce_i32(world, &bad, 1);
    if (rc || rc2 || bad) {
        if (!rc && !rc2) rc = adt_error(ADT_ERR_ARG, "%s: another rank could not set up its pipeline stage", p->name);
        adt_pipe_free(pp);
        return rc ? rc : rc2;
    }
    pp->mesh = d.mesh;
    pp->mesh.ranks = NULL;
    rc = pipe_comms(pp);
    if (!rc) rc = adt_mesh_comm_create(&pp->mc, pp->stage_comm, &pp->mesh);
    if (!rc) pp->mesh.split = adt_mesh_comm_mesh(pp->mc)->split; /* its own copy: the plan's may change */
    if (!rc) {
        int S = p->n_stages, s = pp->st.stage;
        pp->slots = S - s < pp->M ? S - s : pp->M;
        adt_exec_opts o = opts ? *opts : (adt_exec_opts){0};
        o.microbatch_slots = pp->slots;
        o.comm = adt_mesh_comm_hook(pp->mc, pp->loc.g);
        rc = adt_exec_create(&pp->ex, pp->loc.g, &o);
    }
    bad = rc != 0; /* a rank that failed here must not leave the others waiting in check_tied */
    rc2 = adt_comm_allreduce_i32(world, &bad, 1);
    if (!rc && (rc2 || bad)) rc = rc2 ? rc2 : adt_error(ADT_ERR_ARG, "%s: another rank could not set up its pipeline stage", p->name);
    if (!rc) rc = check_tied(pp);
    if (rc) {
        adt_pipe_free(pp);
        return rc;
    }
    int nl = pp->st.n_links, M = pp->M;
    pp->stage_buf = adt_calloc((size_t)(nl * M + 1), sizeof *pp->stage_buf);
    pp->req = adt_calloc((size_t)(nl * M + 1), sizeof *pp->req);
    for (int j = 0; j < nl; j++)
        if (pp->st.links[j].from == pp->st.stage)
            /* shared: summing a partial value over the stage's mesh reads it in place (comm.h) */
            for (int m = 0; m < M; m++) pp->stage_buf[j * M + m] = adt_comm_shared_alloc((size_t)link_bytes(pp, j));
    pp->sum = adt_calloc((size_t)nl + 1, sizeof *pp->sum);
    int64_t tmp = 0;
    for (int j = 0; j < nl && !rc; j++) {
        const adt_pipe_link *l = &pp->st.links[j];
        const adt_ndsbp *made = &pp->loc.layout[l->local];
        if (l->from != pp->st.stage || !adt_ndsbp_partial_mask(made)) continue;
        adt_ndsbp sent = adt_pipe_sent_layout(made);
        const adt_value *val = &pp->g->values[l->value];
        rc = adt_boxing_plan(&pp->mesh, val->shape, val->dtype, made, &sent, &p->cost, &pp->sum[j]);
        if (link_bytes(pp, j) > tmp) tmp = link_bytes(pp, j);
    }
    pp->sum_tmp = adt_comm_shared_alloc((size_t)tmp + 1);
    if (rc) { /* every rank plans the same programs: they fail alike */
        adt_pipe_free(pp);
        return rc;
    }
    pp->ops = adt_malloc((size_t)(2 * M) * sizeof *pp->ops);
    adt_pipe_1f1b(p->n_stages, pp->st.stage, M, pp->ops);
    pp->mb_loss = adt_calloc((size_t)M, sizeof *pp->mb_loss);
    *out = pp;
    return ADT_OK;
}

void adt_pipe_free(adt_pipe *pp) {
    if (!pp) return;
    adt_exec_free(pp->ex);
    adt_mesh_comm_free(pp->mc);
    for (int k = 0; pp->tied_comm && k < pp->st.n_tied; k++) adt_comm_free(pp->tied_comm[k]);
    free(pp->tied_comm);
    adt_comm_free(pp->stage_comm);
    for (int i = 0; pp->stage_buf && i < pp->st.n_links * pp->M; i++) adt_comm_shared_free(pp->stage_buf[i]);
    free(pp->stage_buf);
    free(pp->req);
    free(pp->sum);
    adt_comm_shared_free(pp->sum_tmp);
    free(pp->peer);
    free(pp->ops);
    free(pp->mb_loss);
    adt_dist_local_free(&pp->loc);
    adt_pipe_stage_free(&pp->st);
    free(pp);
}

int adt_pipe_rebuild(adt_pipe **pp) {
    adt_pipe *old = *pp, *nw = NULL;
    int rc = adt_pipe_create(&nw, old->world, old->p, old->g, &old->opts);
    if (rc) return rc; /* adt_pipe_create agrees on failures across the world */
    rc = adt_dist_move_state(old->st.g, old->mc, &old->loc, old->ex, &nw->mesh, &nw->loc, nw->ex);
    if (rc) {
        adt_pipe_free(nw);
        return rc;
    }
    adt_pipe_free(old);
    *pp = nw;
    return ADT_OK;
}

adt_exec *adt_pipe_exec(adt_pipe *pp) { return pp->ex; }
int adt_pipe_stage_index(const adt_pipe *pp) { return pp->st.stage; }
int adt_pipe_slot(const adt_pipe *pp, int microbatch) { return microbatch % pp->slots; }
const adt_pipe_stage *adt_pipe_stage_info(const adt_pipe *pp) { return &pp->st; }
const adt_dist_local *adt_pipe_local(const adt_pipe *pp) { return &pp->loc; }
adt_mesh_comm *adt_pipe_mesh_comm(adt_pipe *pp) { return pp->mc; }

void *adt_pipe_value(adt_pipe *pp, int microbatch, int v, adt_box *block) {
    int lv = local_value(pp, v);
    if (lv < 0) return NULL;
    if (block) {
        int sv = pp->st.local_of[v];
        *block = adt_ndsbp_block(&pp->loc.layout[sv], &pp->mesh, pp->coord, pp->g->values[v].shape);
    }
    return adt_exec_slot_data(pp->ex, adt_pipe_slot(pp, microbatch), lv);
}

/* A link made as partial sums, summed over the stage mesh into `out` (the sent layout's block):
 * the program's all-reduce steps, collective within the stage, which every rank of it reaches
 * at the same point of the same schedule. */
static int sum_partial(adt_pipe *pp, const adt_boxing_prog *prog, const void *in, void *out, size_t bytes) {
    int rc = ADT_OK; /* all-reduces: the block keeps its size */
    memcpy(out, in, bytes);
    for (int i = 0; i < prog->n_steps && !rc; i++) {
        memcpy(pp->sum_tmp, out, bytes);
        rc = adt_mesh_comm_step(pp->mc, &prog->step[i], prog->global, prog->dtype, pp->sum_tmp, out);
    }
    return rc;
}

/* The links of pass `phase` of microbatch mb: received before it, or sent after it. */
static int recv_links(adt_pipe *pp, int phase, int mb) {
    int rc = ADT_OK;
    for (int j = 0; j < pp->st.n_links && !rc; j++) {
        const adt_pipe_link *l = &pp->st.links[j];
        if (l->to != pp->st.stage || l->recv_phase != phase) continue;
        int lv = pp->loc.value[l->local];
        rc = adt_comm_recv(pp->world, adt_exec_slot_data(pp->ex, adt_pipe_slot(pp, mb), lv),
                           adt_value_numel(pp->loc.g, lv), pp->loc.g->values[lv].dtype, pp->peer[j],
                           l->tag % (ADT_COMM_TAG_MAX + 1));
    }
    return rc;
}

static int send_links(adt_pipe *pp, int phase, int mb, int training) {
    int rc = ADT_OK;
    for (int j = 0; j < pp->st.n_links && !rc; j++) {
        const adt_pipe_link *l = &pp->st.links[j];
        if (l->from != pp->st.stage || l->send_phase != phase || (!training && l->recv_phase)) continue;
        int lv = pp->loc.value[l->local], k = j * pp->M + mb;
        rc = adt_comm_wait(&pp->req[k]); /* the last step's send from this buffer */
        if (rc) break;
        const void *data = adt_exec_slot_data(pp->ex, adt_pipe_slot(pp, mb), lv);
        if (pp->sum[j].n_steps) rc = sum_partial(pp, &pp->sum[j], data, pp->stage_buf[k], (size_t)link_bytes(pp, j));
        else memcpy(pp->stage_buf[k], data, (size_t)link_bytes(pp, j));
        if (rc) break;
        rc = adt_comm_isend(pp->world, pp->stage_buf[k], adt_value_numel(pp->loc.g, lv), pp->loc.g->values[lv].dtype,
                            pp->peer[j], l->tag % (ADT_COMM_TAG_MAX + 1), &pp->req[k]);
    }
    return rc;
}

/* The last stage's loss of microbatch mb (collective over the stage mesh). */
static int read_loss(adt_pipe *pp, int mb) {
    int sv = pp->g->loss >= 0 ? pp->st.local_of[pp->g->loss] : -1;
    if (sv < 0) return ADT_OK;
    float l = 0;
    int rc = adt_mesh_comm_gather(pp->mc, &pp->loc.layout[sv], pp->g->values[pp->g->loss].shape, ADT_F32,
                                  adt_exec_slot_data(pp->ex, adt_pipe_slot(pp, mb), pp->loc.value[sv]), &l);
    pp->mb_loss[mb] = l;
    return rc;
}

/* The mean of the microbatch losses, on every rank: the last stage's first rank holds it. */
static int share_loss(adt_pipe *pp, double *loss) {
    double sum = 0;
    int has = pp->g->loss >= 0 && pp->st.local_of[pp->g->loss] >= 0 && pp->pos == 0;
    for (int m = 0; has && m < pp->M; m++) sum += pp->mb_loss[m];
    sum /= pp->M;
    int rc = adt_comm_allreduce_f64(pp->world, &sum, 1);
    if (loss) *loss = sum;
    return rc;
}

static int run_mb(adt_pipe *pp, int backward, int mb, adt_pipe_fill_fn fill, void *ctx, int training) {
    int rc = ADT_OK;
    if (!backward && fill) rc = fill(ctx, pp, mb);
    if (!rc) rc = recv_links(pp, backward, mb);
    adt_exec_set_microbatch(pp->ex, mb);
    if (!rc) rc = training ? adt_exec_run_pass(pp->ex, adt_pipe_slot(pp, mb), backward)
                           : adt_exec_run_pass(pp->ex, adt_pipe_slot(pp, mb), 2);
    if (!rc) rc = send_links(pp, backward, mb, training);
    if (!rc && !backward) rc = read_loss(pp, mb);
    return rc;
}

static int wait_sends(adt_pipe *pp) { return adt_comm_waitall(pp->req, pp->st.n_links * pp->M); }

int adt_pipe_step(adt_pipe *pp, adt_pipe_fill_fn fill, void *ctx, double *loss) {
    int rc = ADT_OK;
    for (int i = 0; i < 2 * pp->M && !rc; i++) rc = run_mb(pp, pp->ops[i].backward, pp->ops[i].microbatch, fill, ctx, 1);
    for (int k = 0; k < pp->st.n_tied && !rc; k++) { /* the holders' contributions summed */
        if (!pp->tied_comm[k]) continue;
        int lv = pp->loc.value[pp->st.tied[k].read];
        rc = adt_comm_allreduce_f32(pp->tied_comm[k], adt_exec_grad_acc(pp->ex, lv), adt_value_numel(pp->loc.g, lv));
    }
    if (!rc) rc = adt_exec_run_update(pp->ex);
    if (!rc) rc = wait_sends(pp);
    if (!rc) rc = share_loss(pp, loss);
    return rc;
}

int adt_pipe_forward(adt_pipe *pp, adt_pipe_fill_fn fill, adt_pipe_fill_fn read, void *ctx, double *loss) {
    int rc = ADT_OK;
    for (int m = 0; m < pp->M && !rc; m++) {
        rc = run_mb(pp, 0, m, fill, ctx, 0);
        if (!rc && read) rc = read(ctx, pp, m);
    }
    if (!rc) rc = wait_sends(pp);
    if (!rc) rc = share_loss(pp, loss);
    return rc;
}
