/*
 * plan_split.c - balanced data parallelism under any plan with a data-parallel axis: the batch
 * split along that axis is an uneven S(0) split of the plan (adt_plan_set_batch_split), and the
 * straggler controller moves it between steps.
 *
 * The plan runner keeps running the plan (ZeRO, tensor parallel inside a replica, pipeline
 * stages with microbatches): every block of a batch-split value follows the split, and the loss
 * is still the mean over the global batch, so the update is the one-process one whatever the
 * split. After each step every rank adds its compute seconds (the executor's run time less its
 * waits in collectives, and an injected slowdown) to one all-reduce; a replica's time is its
 * slowest rank's; every rank feeds the same numbers to its own monitor and takes the same
 * decision. A new split is rounded to multiples of the plan's microbatches, set on the plan, and
 * the rank's partition, communicators and executor are remade for it with the state carried
 * over (adt_dist_rebuild; adt_pipe_rebuild for a stage).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "train_internal.h"

struct train_psplit {
    int axis, replicas, micro;
    int *sizes;        /* [replicas] the split in force                       */
    int *replica_of;   /* [nranks] the data-axis coordinate of every rank      */
    double *times;     /* [nranks] the step's compute seconds, all-reduced     */
    adt_straggler *mon;
    adt_straggler_cfg cfg;
    double run_s, wait_s; /* the executor's totals at the last step's end     */
    long changes;
};

/* --split's text: `n` local batches separated by commas. */
static int parse_sizes(const char *text, int n, int *sizes) {
    const char *p = text;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > (1 << 24) || (i < n - 1 ? *end != ',' : *end != 0)) return -1;
        sizes[i] = (int)v;
        p = end + 1;
    }
    return 0;
}

int train_psplit_init(trainer *t, const adt_graph *g, const char *flag) {
    adt_plan *p = &t->xplan;
    int axis;
    if (adt_plan_data_axis(p, g, &axis))
        return train_fail(EXIT_USAGE, "--straggler-policy/--split with %s: %s", flag, adt_error_message());
    train_psplit *s = t->psplit = adt_calloc(1, sizeof *s);
    s->axis = axis;
    s->micro = p->microbatches > 1 ? p->microbatches : 1;
    adt_mesh m;
    int *ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *ranks);
    int rc = adt_plan_stage_mesh(p, 0, &m, ranks);
    s->replicas = rc ? 1 : m.dim[axis];
    free(ranks);
    if (rc) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    s->sizes = adt_malloc((size_t)s->replicas * sizeof *s->sizes);
    if (t->o.bal.split) {
        if (parse_sizes(t->o.bal.split, s->replicas, s->sizes))
            return train_fail(EXIT_USAGE, "--split '%s': expected %d local batches >= 1 separated by commas, one per "
                              "replica of the plan's data-parallel axis", t->o.bal.split, s->replicas);
    } else { /* even, in whole microbatches */
        int units = (int)t->o.batch / s->micro;
        for (int i = 0; i < s->replicas; i++) s->sizes[i] = (units / s->replicas + (i < units % s->replicas)) * s->micro;
    }
    if (adt_plan_set_batch_split(p, g, s->sizes, s->replicas))
        return train_fail(EXIT_USAGE, "--split with %s: %s", flag, adt_error_message());
    s->replica_of = adt_malloc((size_t)t->nranks * sizeof *s->replica_of);
    for (int r = 0; r < t->nranks; r++) {
        int stage, coord[ADT_MAX_MESH_DIMS];
        if (adt_plan_locate(p, r, &stage, coord)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
        s->replica_of[r] = coord[axis];
    }
    s->times = adt_calloc((size_t)t->nranks, sizeof *s->times);
    s->cfg = adt_straggler_defaults(t->o.bal.policy);
    if (t->o.bal.config && adt_straggler_cfg_parse(&s->cfg, t->o.bal.config))
        return train_fail(EXIT_USAGE, "--straggler-config: %s", adt_error_message());
    s->mon = adt_straggler_create(s->replicas, &s->cfg);
    if (!s->mon) return train_fail(EXIT_USAGE, "--straggler-config: %s", adt_error_message());
    return 0;
}

void train_psplit_free(trainer *t) {
    train_psplit *s = t->psplit;
    if (!s) return;
    adt_straggler_free(s->mon);
    free(s->sizes), free(s->replica_of), free(s->times);
    free(s);
    t->psplit = NULL;
}

void train_psplit_banner(const trainer *t, FILE *f) {
    const train_psplit *s = t->psplit;
    if (!s) return;
    fprintf(f, "split  the batch over %d data-parallel replicas:", s->replicas);
    for (int i = 0; i < s->replicas; i++) fprintf(f, "%s%d", i ? "/" : " ", s->sizes[i]);
    fprintf(f, " (straggler policy %s)\n", adt_straggler_policy_name(s->cfg.policy));
}

/* The plan's new split, and the rank's partition, communicators and executor remade for it. */
static int resplit(trainer *t, const int *sizes) {
    train_psplit *s = t->psplit;
    const adt_graph *g = t->pg ? t->pg : t->g;
    if (adt_plan_set_batch_split(&t->xplan, g, sizes, s->replicas))
        return train_fail(EXIT_RUNTIME, "a new batch split: %s", adt_error_message());
    if (t->pipe) {
        if (adt_pipe_rebuild(&t->pipe)) return train_fail(EXIT_RUNTIME, "a new batch split: %s", adt_error_message());
        t->ex = adt_pipe_exec(t->pipe);
    } else {
        int stage;
        if (adt_plan_locate(&t->xplan, t->rank, &stage, t->coord))
            return train_fail(EXIT_RUNTIME, "a new batch split: %s", adt_error_message());
        t->plan = adt_plan_dist(&t->xplan, stage, t->plan_ranks);
        adt_exec_opts eo = t->eo;
        if (adt_dist_rebuild(t->world, t->g, &t->plan, &eo, &t->loc, &t->mc, &t->ex))
            return train_fail(EXIT_RUNTIME, "a new batch split: %s", adt_error_message());
    }
    memcpy(s->sizes, sizes, (size_t)s->replicas * sizeof *sizes);
    s->run_s = s->wait_s = 0; /* a new executor counts from zero */
    s->changes++;
    return 0;
}

/* A split of whole microbatches nearest to want (summing to the batch). */
static void round_split(const train_psplit *s, const int64_t *want, long batch, int *out) {
    int units = (int)(batch / s->micro), used = 0;
    for (int i = 0; i < s->replicas; i++) {
        out[i] = (int)floor((double)want[i] / s->micro);
        if (out[i] < 1) out[i] = 1;
        used += out[i];
    }
    while (used < units) { /* the largest remainders get the units left */
        int best = 0;
        double rem = -1;
        for (int i = 0; i < s->replicas; i++) {
            double r = (double)want[i] / s->micro - out[i];
            if (r > rem) rem = r, best = i;
        }
        out[best]++, used++;
    }
    while (used > units) {
        int best = -1;
        for (int i = 0; i < s->replicas; i++)
            if (out[i] > 1 && (best < 0 || out[i] > out[best])) best = i;
        out[best]--, used--;
    }
    for (int i = 0; i < s->replicas; i++) out[i] *= s->micro;
}

int train_psplit_after_step(trainer *t, long step) {
    train_psplit *s = t->psplit;
    if (!s) return 0;
    adt_exec_stats tot;
    adt_exec_get_stats(t->ex, NULL, &tot);
    double compute = (tot.run_s - s->run_s) - (tot.comm_wait_s - s->wait_s);
    s->run_s = tot.run_s, s->wait_s = tot.comm_wait_s;
    compute = train_slow_step(t, step, compute); /* a slower device */
    memset(s->times, 0, (size_t)t->nranks * sizeof *s->times);
    s->times[t->rank] = compute;
    if (adt_comm_allreduce_f64(t->world, s->times, t->nranks))
        return train_fail(EXIT_RUNTIME, "step %ld: the replicas' timings: %s", step, adt_error_message());
    double rep[ADT_STRAGGLER_MAX_RANKS] = {0};
    int64_t samples[ADT_STRAGGLER_MAX_RANKS], split[ADT_STRAGGLER_MAX_RANKS];
    for (int r = 0; r < t->nranks; r++) rep[s->replica_of[r]] = fmax(rep[s->replica_of[r]], s->times[r]);
    for (int i = 0; i < s->replicas; i++) samples[i] = split[i] = s->sizes[i];
    adt_straggler_action act;
    if (adt_straggler_observe(s->mon, step, ADT_PHASE_TRAIN, rep, samples, split, t->o.steps - step, &act))
        return train_fail(EXIT_RUNTIME, "straggler monitor: %s", adt_error_message());
    if (act.kind == ADT_ACTION_NONE) return 0;
    int sizes[ADT_STRAGGLER_MAX_RANKS];
    round_split(s, split, t->o.batch, sizes);
    if (!memcmp(sizes, s->sizes, (size_t)s->replicas * sizeof *sizes)) return 0;
    int rc = resplit(t, sizes);
    if (rc) return rc;
    char text[256];
    size_t k = 0;
    for (int i = 0; i < s->replicas && k < sizeof text; i++)
        k += (size_t)snprintf(text + k, sizeof text - k, "%s%d", i ? "/" : "", sizes[i]);
    train_note(t, "straggler: step %ld: rebalance (replica %d): %s; the plan's batch split is now %s", step, act.rank,
               act.why, text);
    int64_t logged[ADT_STRAGGLER_MAX_RANKS];
    for (int i = 0; i < s->replicas; i++) logged[i] = sizes[i];
    train_log_action(t, &act, "ranks", logged, s->replicas, s->mon);
    return 0;
}
