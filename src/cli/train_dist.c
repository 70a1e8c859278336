/*
 * train_dist.c - `adtrain train` on several processes: started by mpiexec, every rank runs its
 * part of a partitioned training graph, and the run logs what one process would log.
 *
 * Every rank parses the same flags, opens the same data and builds the same global graph; the
 * plan (--plan's file, else the data-parallel expert plan) is partitioned for the rank's mesh
 * coordinate, and the executor runs the local graph with its BOXING nodes over MPI. A batch
 * is still the global batch, filled from the sampler's sample ids: each rank writes only the
 * samples of its block of every fed input, so the samples and their order never depend on the
 * number of ranks. The loss printed and logged is the global one (the partial sums of the loss's
 * P mesh axes added up, each replica once). Only rank 0 prints and writes the log; --save writes a
 * distributed checkpoint, each rank its own blocks (train_ckpt.c).
 *
 * Failures: setup is checked on every rank and the ranks agree (an all-reduce of each rank's
 * status) before anything collective starts, so a bad file or flag seen by one rank ends them
 * all at once with one message. A failure while training ends the world (MPI_Abort): a rank that
 * stops cannot leave the others waiting in a collective.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "train.h"

int train_world_init(trainer *t) {
    t->rank = 0;
    t->nranks = 1;
    if (!adt_comm_launched()) return 0;
    if (adt_comm_init(ADT_COMM_MPI, &t->world))
        return train_fail(EXIT_RUNTIME, "MPI: %s", adt_error_message());
    t->rank = adt_comm_rank(t->world);
    t->nranks = adt_comm_size(t->world);
    if (t->nranks == 1) { /* mpiexec -n 1: the one-process run */
        adt_comm_finalize(t->world);
        t->world = NULL;
    }
    cli_set_rank(t->rank, t->nranks);
    return 0;
}

/* Setup results of all ranks: codes[r] is rank r's (0 fine, -1 --help, else an exit status). The
 * lowest failing rank's message is printed, by that rank alone; every rank returns its code. */
int train_world_agree(trainer *t, int rc) {
    if (!t->world) return rc;
    int32_t *codes = adt_calloc((size_t)t->nranks, sizeof *codes);
    codes[t->rank] = rc;
    if (adt_comm_allreduce_i32(t->world, codes, t->nranks)) {
        free(codes);
        cli_defer_errors(0);
        cli_print_deferred();
        train_fail(EXIT_RUNTIME, "agreeing on the setup: %s", adt_error_message());
        adt_comm_abort(t->world, EXIT_RUNTIME);
    }
    int first = 0;
    while (first < t->nranks && !codes[first]) first++;
    int common = first < t->nranks ? codes[first] : 0;
    free(codes);
    if (first == t->rank) cli_print_deferred();
    cli_defer_errors(0);
    return common;
}

void train_world_end(trainer *t) {
    adt_mesh_comm_free(t->mc);
    t->mc = NULL;
    adt_dist_local_free(&t->loc);
    adt_plan_free(&t->xplan);
    free(t->plan_ranks);
    for (int i = 0; i < 3; i++) free(t->stage[i]);
    for (int i = 0; i < 2; i++) free(t->gathered[i]);
    if (t->world && adt_comm_finalize(t->world)) train_fail(EXIT_RUNTIME, "MPI: %s", adt_error_message());
    t->world = NULL;
}

void train_world_fatal(trainer *t, int rc) {
    if (t->world) adt_comm_abort(t->world, rc);
}

/* ---- plan and local graph ----------------------------------------------------------------------- */

/* The plan: the file given with --plan, else the data-parallel expert plan over every rank.
 * Either must be made for this model, batch and optimizer and for as many devices as there are
 * ranks, and have a single stage: pipelines are not run yet. */
static int make_plan(trainer *t) {
    char mb[32];
    const char *flag = t->o.plan_path ? "--plan" : "the default plan";
    if (t->o.plan_path) {
        if (adt_plan_load(&t->xplan, t->o.plan_path)) return train_fail(EXIT_USAGE, "--plan: %s", adt_error_message());
        snprintf(t->plan_label, sizeof t->plan_label, "%s (%s)", t->o.plan_path, t->xplan.strategy);
    } else {
        adt_expert_opts eo = {.strategy = "dp", .devices = t->nranks, .batch = (int)t->o.batch};
        if (adt_expert_plan(t->g, &t->model, &eo, &t->xplan))
            return train_fail(EXIT_USAGE, "--batch %ld over %d ranks: %s", t->o.batch, t->nranks, adt_error_message());
        snprintf(t->plan_label, sizeof t->plan_label, "data parallel (the default)");
    }
    const adt_plan *p = &t->xplan;
    if (p->mesh.nranks != t->nranks)
        return train_fail(EXIT_USAGE, "%s %s: the plan's mesh %s has %d devices, but %d rank%s started; expected "
                          "mpiexec -n %d", flag, p->name, adt_mesh_str(&p->mesh, mb, sizeof mb), p->mesh.nranks,
                          t->nranks, t->nranks == 1 ? " was" : "s were", p->mesh.nranks);
    if (p->n_stages > 1 || p->microbatches > 1)
        return train_fail(EXIT_USAGE, "%s %s: %d pipeline stages and %d microbatches; adtrain train runs plans of one "
                          "stage and no microbatches yet", flag, p->name, p->n_stages, p->microbatches);
    if (t->o.plan_path) {
        int momentum = t->oc.kind == ADT_OPTIM_SGD && t->oc.momentum != 0;
        if (adt_plan_check_model(p, &t->model, (int)t->o.batch))
            return train_fail(EXIT_USAGE, "--plan: %s", adt_error_message());
        if (p->optim != t->oc.kind || (p->optim == ADT_OPTIM_SGD && p->momentum != momentum))
            return train_fail(EXIT_USAGE, "--plan %s: made for --optimizer %s%s, this run has %s%s", p->name,
                              p->optim == ADT_OPTIM_SGD ? "sgd" : "adamw", p->momentum ? " with --momentum" : "",
                              t->oc.kind == ADT_OPTIM_SGD ? "sgd" : "adamw", momentum ? " with --momentum" : "");
        if (adt_plan_bind(&t->xplan, t->g)) return train_fail(EXIT_USAGE, "--plan: %s", adt_error_message());
    }
    int stage;
    t->plan_ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *t->plan_ranks);
    t->plan = adt_plan_dist(p, 0, t->plan_ranks);
    if (adt_plan_locate(p, t->rank, &stage, t->coord)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    return 0;
}

int train_dist_partition(trainer *t) {
    if (!t->world) return t->o.plan_path ? make_plan(t) : 0; /* a plan of one device runs serially */
    int rc = make_plan(t);
    if (rc) return rc;
    if (adt_dist_partition(t->g, &t->plan, t->coord, &t->loc))
        return train_fail(EXIT_RUNTIME, "partitioning the training graph: %s", adt_error_message());
    int fed[3] = {t->io.input, t->io.input2, t->io.label};
    for (int i = 0; i < 3; i++)
        if (fed[i] >= 0) t->stage[i] = adt_malloc((size_t)adt_value_bytes(t->g, fed[i]));
    int read[2] = {t->io.logits, t->io.label};
    for (int i = 0; i < 2; i++) t->gathered[i] = adt_malloc((size_t)adt_value_bytes(t->g, read[i]));
    return 0;
}

int train_dist_executor(trainer *t, const adt_exec_opts *eo) {
    if (adt_mesh_comm_create(&t->mc, t->world, &t->plan.mesh))
        return train_fail(EXIT_RUNTIME, "communicators: %s", adt_error_message());
    adt_exec_opts o = *eo;
    o.comm = adt_mesh_comm_hook(t->mc, t->loc.g);
    if (adt_exec_create(&t->ex, t->loc.g, &o)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    return 0;
}

const adt_graph *train_run_graph(const trainer *t) { return t->loc.g ? t->loc.g : t->g; }

void *train_value(trainer *t, int v) {
    if (!t->loc.g) return adt_exec_data(t->ex, v);
    return t->loc.value[v] >= 0 ? adt_exec_data(t->ex, t->loc.value[v]) : NULL;
}

/* ---- data in, results out ------------------------------------------------------------------------ */

int train_fill(trainer *t, const train_source *s, int64_t *idx) {
    int B = (int)t->o.batch;
    if (!t->loc.g)
        return train_source_fill(s, idx, B, train_value(t, t->io.input),
                                 t->io.input2 >= 0 ? train_value(t, t->io.input2) : NULL, train_value(t, t->io.label));
    /* the samples any of this rank's blocks covers (blocks of the batch axis, or all of it) */
    int fed[3] = {t->io.input, t->io.input2, t->io.label};
    int64_t lo = B, hi = 0;
    adt_box blk[3];
    for (int i = 0; i < 3; i++) {
        if (fed[i] < 0) continue;
        blk[i] = adt_ndsbp_block(&t->loc.layout[fed[i]], &t->plan.mesh, t->coord, t->g->values[fed[i]].shape);
        if (blk[i].offset[0] < lo) lo = blk[i].offset[0];
        if (blk[i].offset[0] + blk[i].shape.dim[0] > hi) hi = blk[i].offset[0] + blk[i].shape.dim[0];
    }
    if (train_source_fill(s, idx + lo, (int)(hi - lo), t->stage[0], t->stage[1], t->stage[2])) return -1;
    for (int i = 0; i < 3; i++) {
        if (fed[i] < 0) continue;
        adt_box got = {.global = t->g->values[fed[i]].shape, .shape = t->g->values[fed[i]].shape};
        got.offset[0] = lo;
        got.shape.dim[0] = hi - lo;
        adt_box_transfer(train_value(t, fed[i]), &blk[i], t->stage[i], &got, adt_dtype_size(t->g->values[fed[i]].dtype), 0);
    }
    return 0;
}

int train_read(trainer *t, int v, int slot, const void **out) {
    if (!t->loc.g) {
        *out = train_value(t, v);
        return 0;
    }
    const adt_value *val = &t->g->values[v];
    if (adt_mesh_comm_gather(t->mc, &t->loc.layout[v], val->shape, val->dtype, train_value(t, v), t->gathered[slot]))
        return -1;
    *out = t->gathered[slot];
    return 0;
}

int train_read_loss(trainer *t, double *loss) {
    float l = 0;
    if (!t->loc.g) l = *(const float *)train_value(t, t->io.loss);
    else if (adt_mesh_comm_gather(t->mc, &t->loc.layout[t->io.loss], t->g->values[t->io.loss].shape, ADT_F32,
                                  train_value(t, t->io.loss), &l))
        return -1;
    *loss = l;
    return 0;
}
