/*
 * collective.c - the runners of a plan: started by mpiexec (or alone), every rank runs its part of
 * a partitioned training graph, or its pipeline stage, and the run logs what one process would.
 *
 * Every rank parses the same flags, opens the same data and builds the same global graph; the
 * plan (--plan's file, else the data-parallel expert plan) is partitioned for the rank's mesh
 * coordinate, and the executor runs the local graph with its BOXING nodes over MPI. A batch
 * is still the global batch, filled from the sampler's sample ids: each rank writes only the
 * samples of its block of every fed input, so the samples and their order never depend on the
 * number of ranks. The loss printed and logged is the global one (the partial sums of the loss's
 * P mesh axes added up, each replica once). Only rank 0 prints and writes the log; --save writes a
 * distributed checkpoint, each rank its own blocks (ckpt.c).
 *
 * Failures: setup is checked on every rank and the ranks agree (an all-reduce of each rank's
 * status) before anything collective starts, so a bad file or flag seen by one rank ends them
 * all at once with one message. A failure while training ends the world (MPI_Abort): a rank that
 * stops cannot leave the others waiting in a collective.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "adtrain/base.h"
#include "train_internal.h"

int train_world_init(trainer *t) {
    t->rank = 0;
    t->nranks = 1;
    if (!adt_comm_launched()) return 0;
    train_elastic_poll_env();
    if (adt_comm_init(ADT_COMM_MPI, &t->world))
        return train_fail(EXIT_RUNTIME, "MPI: %s", adt_error_message());
    t->rank = adt_comm_rank(t->world);
    t->nranks = adt_comm_size(t->world);
    if (t->nranks == 1) { /* mpiexec -n 1: the one-process run */
        adt_comm_finalize(t->world);
        t->world = NULL;
    }
    return 0;
}

/* Which rank reports the failure the ranks agreed on (adt_trainer_error_is_mine). */
static _Thread_local int g_error_mine = 1;
/* The last failure was agreed on by every rank: none waits in a collective, none need abort. */
static _Thread_local int g_error_agreed;
int adt_trainer_error_is_mine(void) { return g_error_mine; }
void train_error_mine(int mine) { g_error_mine = mine; }
void train_error_reset(void) { g_error_mine = 1, g_error_agreed = 0; }

/* Setup results of all ranks: codes[r] is rank r's (0 fine, else a negative status). The lowest
 * failing rank keeps its message and reports it; every rank returns its code. */
int train_world_agree(trainer *t, int rc) { return train_group_agree(t, t->world, 0, rc); }

int train_group_agree(trainer *t, adt_comm *c, int first_rank, int rc) {
    if (!c) return rc;
    int n = adt_comm_size(c), me = adt_comm_rank(c);
    int32_t *codes = adt_calloc((size_t)n, sizeof *codes);
    codes[me] = rc;
    if (adt_comm_allreduce_i32(c, codes, n)) {
        free(codes);
        train_error_mine(1);
        return train_fail(EXIT_RUNTIME, "agreeing on the setup: %s", adt_error_message());
    }
    int first = 0;
    while (first < n && !codes[first]) first++;
    int common = first < n ? codes[first] : 0;
    free(codes);
    train_error_mine(first == me || !common);
    /* agreed by a part of the world only (the workers of --mode ps): the others still need ending */
    if (c == t->world) g_error_agreed = common != 0;
    if (!common) return 0;
    /* every rank learns why: under adtrain agent the first rank to exit may be any of them, and
     * the agent stops the others before the reporting one may have said it */
    int32_t why[128]; /* the failing rank's message, 511 bytes at most */
    memset(why, 0, sizeof why);
    if (first == me) snprintf((char *)why, sizeof why, "%s", adt_error_message());
    int brc = adt_comm_bcast(c, why, (int64_t)(sizeof why / sizeof why[0]), ADT_I32, first);
    ((char *)why)[sizeof why - 1] = 0;
    if (first != me) adt_error(common, "rank %d failed: %s", first_rank + first, brc ? "(its message was lost)" : (char *)why);
    return common;
}

void train_world_end(trainer *t) {
    adt_pipe_free(t->pipe);
    t->pipe = NULL;
    free(t->ckpt_elsewhere);
    t->ckpt_elsewhere = NULL;
    adt_graph_free(t->pg);
    t->pg = NULL;
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
    if (t->world && !g_error_agreed) adt_comm_abort(t->world, rc);
}

/* ---- plan and local graph ----------------------------------------------------------------------- */

/* The plan: the file given with --plan, else the data-parallel expert plan over every rank.
 * Either must be made for this model, batch and optimizer and for as many devices as there are
 * ranks. A plan with pipeline stages or microbatches is bound to its own graph (the model at
 * batch / microbatches) and runs as a pipeline (adt_pipe); on one process the whole batch runs
 * at once, which is the same step. */
static int make_plan(trainer *t) {
    char mb[32];
    /* a plan given: --plan's file, or the text the elastic master made for this world */
    int given = t->o.plan_path || t->plan_text;
    const char *flag = t->o.plan_path ? "--plan" : given ? "the master's plan" : "the default plan";
    if (t->o.plan_path) {
        if (adt_plan_load(&t->xplan, t->o.plan_path)) return train_fail(EXIT_USAGE, "--plan: %s", adt_error_message());
        snprintf(t->plan_label, sizeof t->plan_label, "%s (%s)", t->o.plan_path, t->xplan.strategy);
    } else if (given) {
        if (adt_plan_parse(&t->xplan, t->plan_text, "the master's plan"))
            return train_fail(EXIT_USAGE, "%s", adt_error_message());
        snprintf(t->plan_label, sizeof t->plan_label, "the master's plan (%s)", t->xplan.strategy);
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
    if (given) {
        int momentum = t->oc.kind == ADT_OPTIM_SGD && t->oc.momentum != 0;
        if (adt_plan_check_model(p, &t->model, (int)t->o.batch))
            return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
        if (p->optim != t->oc.kind || (p->optim == ADT_OPTIM_SGD && p->momentum != momentum))
            return train_fail(EXIT_USAGE, "%s %s: made for --optimizer %s%s, this run has %s%s", flag, p->name,
                              p->optim == ADT_OPTIM_SGD ? "sgd" : "adamw", p->momentum ? " with --momentum" : "",
                              t->oc.kind == ADT_OPTIM_SGD ? "sgd" : "adamw", momentum ? " with --momentum" : "");
        const adt_graph *bind_to = t->g;
        if (p->n_stages > 1 || p->microbatches > 1) {
            if (adt_plan_build_graph(p, &t->oc, &t->pg)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
            int *io[5] = {&t->pio.input, &t->pio.input2, &t->pio.label, &t->pio.logits, &t->pio.loss};
            const int from[5] = {t->io.input, t->io.input2, t->io.label, t->io.logits, t->io.loss};
            for (int i = 0; i < 5; i++) *io[i] = from[i] >= 0 ? adt_graph_find_value(t->pg, t->g->values[from[i]].name) : -1;
            if (t->model.type != ADT_MODEL_GPT && t->pio.logits >= 0) adt_graph_mark_output(t->pg, t->pio.logits);
            bind_to = t->pg;
        }
        if (adt_plan_bind(&t->xplan, bind_to)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
        if (t->o.bal.on && t->world) { /* balanced data parallelism: the plan's batch split */
            int rc = train_psplit_init(t, bind_to, flag);
            if (rc) return rc;
        }
    }
    int stage;
    if (adt_plan_locate(p, t->rank, &stage, t->coord)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    t->plan_ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *t->plan_ranks);
    t->plan = adt_plan_dist(p, stage, t->plan_ranks);
    return 0;
}

int train_dist_partition(trainer *t) {
    int rc = ADT_OK;
    if (!t->world) { /* a plan of one device runs serially */
        if (!t->o.plan_path) return 0;
        if ((rc = make_plan(t)) || !t->pg) return rc;
        /* ... but its microbatches (gradient accumulation: activations of one microbatch at a
         * time) run through the pipeline executor, on a world of this process alone */
        if (adt_comm_init(ADT_COMM_SELF, &t->world))
            return train_fail(EXIT_RUNTIME, "a one-process world for the plan's microbatches: %s", adt_error_message());
    } else if ((rc = make_plan(t))) {
        return rc;
    }
    /* a pipeline: each rank partitions its stage when the pipe is made */
    if (!t->pg && adt_dist_partition(t->g, &t->plan, t->coord, &t->loc)) {
        return train_fail(EXIT_RUNTIME, "partitioning the training graph: %s", adt_error_message());
    }
    int fed[3] = {t->io.input, t->io.input2, t->io.label};
    for (int i = 0; i < 3; i++)
        if (fed[i] >= 0) t->stage[i] = adt_malloc((size_t)adt_value_bytes(t->g, fed[i]));
    int read[2] = {t->io.logits, t->io.label};
    for (int i = 0; i < 2; i++) t->gathered[i] = adt_malloc((size_t)adt_value_bytes(t->g, read[i]));
    return 0;
}

int train_dist_executor(trainer *t, const adt_exec_opts *eo) {
    if (t->pg) {
        if (adt_pipe_create(&t->pipe, t->world, &t->xplan, t->pg, eo))
            return train_fail(EXIT_RUNTIME, "pipeline: %s", adt_error_message());
        t->ex = adt_pipe_exec(t->pipe);
        return 0;
    }
    if (adt_mesh_comm_create(&t->mc, t->world, &t->plan.mesh))
        return train_fail(EXIT_RUNTIME, "communicators: %s", adt_error_message());
    adt_exec_opts o = *eo;
    o.comm = adt_mesh_comm_hook(t->mc, t->loc.g);
    if (adt_exec_create(&t->ex, t->loc.g, &o)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    return 0;
}

/* With ADT_MEM_REPORT set in the environment, every rank prints one JSON line to stderr: its peak
 * resident set so far (getrusage) and the memory plan of its executor, so that a benchmark can
 * set what each plan's ranks hold next to what the plan predicts (bench/run_plans.sh). A pipeline
 * stage holds `slots` arenas (min(stages - stage, microbatches)) next to one state block, and
 * the accumulators of the gradients its update reads. */
void train_dist_mem_report(trainer *t, const char *when) {
    if (!t->world || !getenv("ADT_MEM_REPORT")) return;
    struct rusage ru;
    long maxrss_kib = getrusage(RUSAGE_SELF, &ru) ? -1 : ru.ru_maxrss;
    if (!t->ex) {
        fprintf(stderr, "{\"mem_report\": \"%s\", \"rank\": %d, \"maxrss_kib\": %ld}\n", when, t->rank, maxrss_kib);
        return;
    }
    const adt_memplan *mp = adt_exec_memplan(t->ex);
    int stage = t->pipe ? adt_pipe_stage_index(t->pipe) : 0, slots = 1;
    if (t->pipe) {
        slots = t->xplan.n_stages - stage;
        if (t->xplan.microbatches < slots) slots = t->xplan.microbatches;
    }
    fprintf(stderr, "{\"mem_report\": \"%s\", \"rank\": %d, \"stage\": %d, \"slots\": %d, \"maxrss_kib\": %ld, "
            "\"arena_bytes\": %lld, \"state_bytes\": %lld, \"scratch_bytes\": %lld, \"accum_bytes\": %lld}\n", when,
            t->rank, stage, slots, maxrss_kib, (long long)mp->arena_bytes, (long long)mp->state_bytes,
            (long long)mp->scratch_bytes, (long long)mp->accum_bytes);
}

const adt_graph *train_run_graph(const trainer *t) { return t->loc.g ? t->loc.g : t->g; }

void *train_value(trainer *t, int v) {
    if (!t->loc.g) return adt_exec_data(t->ex, v);
    return t->loc.value[v] >= 0 ? adt_exec_data(t->ex, t->loc.value[v]) : NULL;
}

/* ---- data in, results out ------------------------------------------------------------------------ */

/* The samples idx[0..) of a (micro)batch into dst[i], this rank's block blk[i] of fed value i
 * (input, input2, label; NULL: not held here): the samples any block covers (blocks of the
 * batch axis, or all of it) are read once and each block cut from them. */
static int fill_blocks(trainer *t, const train_source *s, int64_t *idx, void *const *dst, const adt_box *blk) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int i = 0; i < 3; i++) {
        if (!dst[i]) continue;
        if (blk[i].offset[0] < lo) lo = blk[i].offset[0];
        if (blk[i].offset[0] + blk[i].shape.dim[0] > hi) hi = blk[i].offset[0] + blk[i].shape.dim[0];
    }
    if (hi <= lo) return 0;
    if (train_source_fill(s, idx + lo, (int)(hi - lo), t->stage[0], t->stage[1], t->stage[2])) return -1;
    for (int i = 0; i < 3; i++) {
        if (!dst[i]) continue;
        adt_box got = {.global = blk[i].global, .shape = blk[i].global};
        got.offset[0] = lo;
        got.shape.dim[0] = hi - lo;
        int v = i == 0 ? t->io.input : i == 1 ? t->io.input2 : t->io.label;
        adt_box_transfer(dst[i], &blk[i], t->stage[i], &got, adt_dtype_size(t->g->values[v].dtype), 0);
    }
    return 0;
}

int train_fill(trainer *t, const train_source *s, int64_t *idx) {
    int B = (int)t->o.batch;
    if (!t->loc.g)
        return train_source_fill(s, idx, B, train_value(t, t->io.input),
                                 t->io.input2 >= 0 ? train_value(t, t->io.input2) : NULL, train_value(t, t->io.label));
    int fed[3] = {t->io.input, t->io.input2, t->io.label};
    void *dst[3] = {NULL, NULL, NULL};
    adt_box blk[3];
    for (int i = 0; i < 3; i++) {
        if (fed[i] < 0) continue;
        blk[i] = adt_ndsbp_block(&t->loc.layout[fed[i]], &t->plan.mesh, t->coord, t->g->values[fed[i]].shape);
        dst[i] = train_value(t, fed[i]);
    }
    return fill_blocks(t, s, idx, dst, blk);
}

int train_read(trainer *t, int v, int slot, const void **out) {
    if (t->pipe || t->ps) { /* train_pipe_eval (the ps runner's eval) gathered the batch */
        *out = t->gathered[slot];
        return 0;
    }
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

/* ---- pipelines ------------------------------------------------------------------------------------
 * The plan's graph runs batch / M samples at a time: microbatch m is samples [m B/M, (m+1) B/M) of
 * the batch, fed on the stages that read them. Evaluation gathers each microbatch's logits and
 * labels on the last stage into the whole batch's buffers, which one all-reduce then brings to
 * every rank (zeros elsewhere), so that rank 0 computes the metric as a single process would.
 */
typedef struct pipe_feed {
    trainer *t;
    const train_source *s;
    int64_t *idx;
} pipe_feed;

static int pipe_fill(void *ctx, adt_pipe *pp, int mb) {
    pipe_feed *f = ctx;
    trainer *t = f->t;
    int fed[3] = {t->pio.input, t->pio.input2, t->pio.label};
    void *dst[3] = {NULL, NULL, NULL};
    adt_box blk[3];
    for (int i = 0; i < 3; i++)
        if (fed[i] >= 0) dst[i] = adt_pipe_value(pp, mb, fed[i], &blk[i]);
    int64_t rows = t->o.batch / t->xplan.microbatches;
    return fill_blocks(t, f->s, f->idx + (int64_t)mb * rows, dst, blk);
}

static int pipe_read(void *ctx, adt_pipe *pp, int mb) {
    trainer *t = ((pipe_feed *)ctx)->t;
    int read[2] = {t->pio.logits, t->pio.label};
    const adt_pipe_stage *st = adt_pipe_stage_info(pp);
    const adt_dist_local *loc = adt_pipe_local(pp);
    for (int i = 0; i < 2; i++) {
        int v = read[i];
        void *data = v >= 0 ? adt_pipe_value(pp, mb, v, NULL) : NULL;
        if (!data) continue;
        const adt_value *val = &t->pg->values[v];
        size_t bytes = (size_t)adt_value_bytes(t->pg, v);
        if (adt_mesh_comm_gather(adt_pipe_mesh_comm(pp), &loc->layout[st->local_of[v]], val->shape, val->dtype, data,
                                 (char *)t->gathered[i] + (size_t)mb * bytes))
            return -1;
    }
    return 0;
}

int train_pipe_step(trainer *t, const train_source *s, int64_t *idx, double *loss) {
    pipe_feed f = {t, s, idx};
    return adt_pipe_step(t->pipe, pipe_fill, &f, loss);
}

int train_pipe_eval(trainer *t, const train_source *s, int64_t *idx, double *loss) {
    pipe_feed f = {t, s, idx};
    int metric = t->model.type != ADT_MODEL_GPT;
    int read[2] = {t->io.logits, t->io.label};
    for (int i = 0; i < 2 && metric; i++) memset(t->gathered[i], 0, (size_t)adt_value_bytes(t->g, read[i]));
    if (adt_pipe_forward(t->pipe, pipe_fill, metric ? pipe_read : NULL, &f, loss)) return -1;
    const adt_pipe_stage *st = adt_pipe_stage_info(t->pipe);
    const int *c = adt_mesh_comm_coord(adt_pipe_mesh_comm(t->pipe));
    int first = 1; /* the last stage's rank at coordinate 0 keeps what it gathered */
    for (int a = 0; a < adt_mesh_comm_mesh(adt_pipe_mesh_comm(t->pipe))->ndim; a++) first &= c[a] == 0;
    int keep = first && st->stage == st->n_stages - 1;
    for (int i = 0; i < 2 && metric; i++) {
        const adt_value *val = &t->g->values[read[i]];
        if (!keep) memset(t->gathered[i], 0, (size_t)adt_value_bytes(t->g, read[i]));
        if (adt_comm_allreduce(t->world, t->gathered[i], adt_value_numel(t->g, read[i]), val->dtype)) return -1;
    }
    return 0;
}

/* ---- the runners ------------------------------------------------------------------------------ */

/* The global training graph (model, backward, optimizer), the plan the feed names or the
 * default one, and the rank's part of the graph. A plan with stages or microbatches hands the
 * run to the pipeline runner. */
static int plan_build(trainer *t) {
    t->g = adt_graph_create();
    if (adt_model_build(t->g, &t->model, (int)t->o.batch, &t->io))
        return train_fail(EXIT_USAGE, "--model %s: %s", t->model_label, adt_error_message());
    t->oc = t->o.optimizer == ADT_OPTIM_SGD ? adt_optim_sgd((float)t->o.momentum, (float)t->o.weight_decay)
                                            : adt_optim_adamw(0.9f, 0.95f, 1e-8f, (float)t->o.weight_decay);
    adt_graph_backward(t->g, t->io.loss);
    adt_graph_optimizer(t->g, &t->oc);
    if (adt_graph_error(t->g))
        return train_fail(EXIT_RUNTIME, "building the training graph: %s", adt_graph_error_message(t->g));
    /* Accuracy and AUC read the logits after a forward run. */
    if (t->model.type != ADT_MODEL_GPT) adt_graph_mark_output(t->g, t->io.logits);
    t->step_flops = adt_graph_flops(t->g);
    int rc = t->feed->plan ? t->feed->plan(t) : 0;
    if (!rc) rc = train_dist_partition(t);
    if (!rc && t->pg) t->run = &train_runner_pipe;
    return rc ? rc : train_check_memory(t);
}

static int plan_executor(trainer *t, const adt_exec_opts *eo) {
    t->eo = *eo;
    if (!t->world) {
        if (adt_exec_create(&t->ex, t->g, eo)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
        return 0;
    }
    train_dist_mem_report(t, "before_executor");
    return train_dist_executor(t, eo);
}

static int plan_step(trainer *t, long step, int64_t *idx, double *loss) {
    if (train_fill(t, &t->train, idx)) return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    if (adt_exec_run(t->ex) || train_read_loss(t, loss))
        return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    return train_psplit_after_step(t, step);
}

static int plan_eval(trainer *t, const train_source *s, int64_t *idx, double *loss) {
    if (train_fill(t, s, idx)) return train_fail(EXIT_RUNTIME, "--val: %s", adt_error_message());
    if (adt_exec_run_forward(t->ex) || train_read_loss(t, loss))
        return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
    return 0;
}

static void plan_banner(const trainer *t, FILE *f) {
    if (!t->world) return;
    char mb[32];
    fprintf(f, "dist   %d rank%s (%s), plan %s on mesh %s; %d collectives per step on rank 0, %s; --threads %d per rank\n",
            t->nranks, t->nranks == 1 ? "" : "s", t->nranks == 1 ? "this process" : "MPI", t->plan_label,
            adt_mesh_str(&t->plan.mesh, mb, sizeof mb), t->pipe ? adt_pipe_local(t->pipe)->n_boxing : t->loc.n_boxing,
            adt_exec_overlaps(t->ex) ? "overlapped with computation" : "blocking", t->o.threads);
    if (t->pipe)
        fprintf(f, "pipe   %d stages x %d microbatches of %ld samples, 1F1B; rank 0 runs stage 0 (the collectives "
                "above: its, per microbatch)\n", t->xplan.n_stages, t->xplan.microbatches,
                t->o.batch / t->xplan.microbatches);
    train_psplit_banner(t, f);
}

static void plan_free(trainer *t) {
    train_psplit_free(t);
    if (!t->pipe) adt_exec_free(t->ex); /* else the pipe's, freed with it */
    t->ex = NULL;
}

static int pipe_step(trainer *t, long step, int64_t *idx, double *loss) {
    if (train_pipe_step(t, &t->train, idx, loss)) return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    return train_psplit_after_step(t, step);
}

static int pipe_eval(trainer *t, const train_source *s, int64_t *idx, double *loss) {
    if (train_pipe_eval(t, s, idx, loss)) return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
    return 0;
}

const train_runner train_runner_plan = {"plan", plan_build, plan_executor, plan_step, plan_eval, plan_banner, plan_free,
                                        NULL};
const train_runner train_runner_pipe = {"pipeline", plan_build, plan_executor, pipe_step, pipe_eval, plan_banner,
                                        plan_free, NULL};
