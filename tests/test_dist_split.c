/*
 * test_dist_split.c - balanced data parallelism as an uneven S(0) split of the batch (a plan's
 * batch_split, adt_plan_set_batch_split) on real processes, against the one-process run.
 *
 * Run without arguments, the program first checks in this process what needs no world: the
 * blocks a batch split gives (adt_mesh_cut), the errors of adt_plan_set_batch_split (wrong length,
 * sum, non-positive, not a multiple of the microbatches, a plan with no data-parallel axis) and
 * of plan files carrying "batch_split" (parse and bind), and that a plan file keeps its split
 * through save and load. Then it launches itself under `mpiexec -n N --child` for N = 2 and 4.
 * Every case runs expert plans of a GPT (dropout on), an MLP, a VGG and a DLRM with a global batch
 * of 8 split unevenly over the data-parallel replicas ({3,5} on 2 replicas, {1,2,2,3} on 4), checks
 * that each rank's block of the input holds its replica's share, and compares with the plain
 * executor on the whole batch: the loss at each of 5 steps within 1e-5 relative, every parameter
 * and optimizer state after the last step within float tolerance:
 *   dp_<family>   data parallel;
 *   zero          dp with ZeRO (optimizer state and weights sharded over the data axis);
 *   dp_tp         on 4 ranks, dp=2 x tp=2 on a (2,2) mesh, split {3,5}, and with ZeRO, split {1,7};
 *   pipe          microbatches (dp=N, 2 microbatches, so each replica's share is cut in two) and,
 *                 on 4 ranks, dp=2 x pp=2 pipeline stages with 2 microbatches, split {2,6};
 *   change        the split changed after step 2 (to its reverse): adt_dist_rebuild for dp and
 *                 dp+ZeRO (ZeRO's shards of batch-divided length move between ranks), and
 *                 adt_pipe_rebuild for the pipelined plans; the run still equals the serial one.
 *
 * The seed comes from $ADT_TEST_SEED, else the time, and is printed.
 */
#include <cJSON.h>
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "cli_run.h"
#include "mpi_world.h"
#include "serial_ref.h"
#include "mpi_families.h"
#include "mpi_cases.h"

#define STEPS 5
#define CHANGE_AT 2
#define BATCH 8
#define LOSS_TOL 1e-5
#define STATE_TOL 2e-5

static uint64_t g_seed;
static adt_comm *g_world;
static int g_rank, g_size;
static const float LR = 0.05f;

/* ---- data and the serial reference ------------------------------------------------------------- */

/* The whole batch's data of fed value v (of the whole-batch graph) at a step. */
static void feed_global(const family *f, const adt_graph *g, const adt_model_io *io, int v, int step, void *buf) {
    family_feed(f, g_seed, g, io, v, step, buf);
}

typedef struct whole_batch {
    const family *f;
    adt_graph *g;
    adt_model_io io;
    reference r;
} whole_batch;

static void feed_cb(void *ctx, const adt_graph *g, int v, int step, void *buf) {
    whole_batch *w = ctx;
    feed_global(w->f, g, &w->io, v, step, buf);
}

static int serial_run(const family *f, whole_batch *w) {
    w->f = f;
    w->g = family_graph(f, BATCH, &w->io);
    if (adt_graph_error(w->g)) return -1;
    return serial_ref_run(w->g, STEPS, LR, g_seed, feed_cb, w, &w->r);
}

static void whole_batch_free(whole_batch *w) {
    if (w->g) serial_ref_free(w->g, &w->r);
    adt_graph_free(w->g);
}

/* ---- a run under a split ------------------------------------------------------------------------ */

typedef struct run {
    const family *f;
    const whole_batch *ref;
    adt_graph *pg; /* the plan's graph (BATCH / microbatches) */
    adt_model_io pio;
    adt_plan p;
    int piped, ranks[64];
    adt_dist_plan d; /* plain runs: the partitioner's plan, local graph, communicators, executor */
    adt_dist_local loc;
    adt_mesh_comm *mc;
    adt_exec *ex;
    adt_pipe *pp; /* pipelined runs */
    int step;
    float *full;
    const char *what;
} run;

static adt_exec_opts run_opts(void) { return (adt_exec_opts){.threads = 1, .seed = g_seed}; }

/* This rank's block of fed value v (plan graph) for microbatch mb, filled from the whole batch. */
static void fill_block(run *r, int v, int mb, void *dst, const adt_box *blk) {
    const adt_value *val = &r->pg->values[v];
    int sv = adt_graph_find_value(r->ref->g, val->name);
    feed_global(r->f, r->ref->g, &r->ref->io, sv, r->step, r->full);
    size_t es = adt_dtype_size(val->dtype);
    adt_box all = {.global = val->shape, .shape = val->shape};
    adt_box_transfer(dst, blk, (const char *)r->full + (size_t)mb * (size_t)adt_shape_numel(&val->shape) * es, &all, es, 0);
}

static int feed_microbatch(void *ctx, adt_pipe *pp, int mb) {
    run *r = ctx;
    for (int v = 0; v < r->pg->n_values; v++) {
        adt_box blk;
        void *dst = serial_is_data(r->pg, v) ? adt_pipe_value(pp, mb, v, &blk) : NULL;
        if (dst) fill_block(r, v, mb, dst, &blk);
    }
    return 0;
}

/* The input's block on this rank holds its replica's share of each microbatch. */
static void check_share(run *r, const int *split) {
    adt_box blk;
    const int *coord;
    int v = r->pio.input;
    if (r->piped) {
        if (!adt_pipe_value(r->pp, 0, v, &blk)) return; /* a later stage: no input here */
        coord = adt_mesh_comm_coord(adt_pipe_mesh_comm(r->pp));
    } else {
        coord = adt_mesh_comm_coord(r->mc);
        blk = adt_ndsbp_block(&r->loc.layout[v], adt_mesh_comm_mesh(r->mc), coord, r->pg->values[v].shape);
    }
    int want = split[coord[r->p.split_axis]] / r->p.microbatches;
    CHECK(blk.shape.dim[0] == want, "%s: this rank's block of the input has %lld samples, its replica's share is %d",
          r->what, (long long)blk.shape.dim[0], want);
}

static int run_setup(run *r) {
    int stage, coord[ADT_MAX_MESH_DIMS], rc = adt_plan_locate(&r->p, g_rank, &stage, coord);
    adt_exec_opts o = run_opts();
    if (r->piped) return rc ? rc : adt_pipe_create(&r->pp, g_world, &r->p, r->pg, &o);
    r->d = adt_plan_dist(&r->p, 0, r->ranks);
    if (!rc) rc = adt_dist_partition(r->pg, &r->d, coord, &r->loc);
    if (!rc) rc = adt_mesh_comm_create(&r->mc, g_world, &r->d.mesh);
    if (!rc) {
        o.comm = adt_mesh_comm_hook(r->mc, r->loc.g);
        rc = adt_exec_create(&r->ex, r->loc.g, &o);
    }
    return rc;
}

static int run_step(run *r, double *loss) {
    if (r->piped) return adt_pipe_step(r->pp, feed_microbatch, r, loss);
    const adt_graph *g = r->pg;
    for (int v = 0; v < g->n_values; v++) {
        if (!serial_is_data(g, v)) continue;
        adt_box blk = adt_ndsbp_block(&r->loc.layout[v], adt_mesh_comm_mesh(r->mc), adt_mesh_comm_coord(r->mc),
                                      g->values[v].shape);
        fill_block(r, v, 0, adt_exec_data(r->ex, r->loc.value[v]), &blk);
    }
    int rc = adt_exec_run(r->ex);
    float l = 0;
    if (!rc) rc = adt_mesh_comm_gather(r->mc, &r->loc.layout[g->loss], g->values[g->loss].shape, ADT_F32,
                                       adt_exec_data(r->ex, r->loc.value[g->loss]), &l);
    *loss = l;
    return rc;
}

/* Every persistent value this rank holds, gathered over its (stage) mesh, against the serial
 * state; returns the worst scaled error. */
static double run_compare_state(run *r) {
    const adt_graph *g = r->pg;
    adt_mesh_comm *mc = r->piped ? adt_pipe_mesh_comm(r->pp) : r->mc;
    const adt_dist_local *loc = r->piped ? adt_pipe_local(r->pp) : &r->loc;
    double worst = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (!adt_role_is_persistent(g->values[v].role)) continue;
        int lv = r->piped ? adt_pipe_stage_info(r->pp)->local_of[v] : v;
        void *data = r->piped ? adt_pipe_value(r->pp, 0, v, NULL) : adt_exec_data(r->ex, r->loc.value[v]);
        if (!data || lv < 0) continue;
        int rv = adt_graph_find_value(r->ref->g, g->values[v].name);
        int rc = adt_mesh_comm_gather(mc, &loc->layout[lv], g->values[v].shape, ADT_F32, data, r->full);
        CHECK(rc == ADT_OK && rv >= 0, "%s: gathering %s: %s", r->what, g->values[v].name, adt_error_message());
        if (rc || rv < 0) return INFINITY;
        double e = check_scaled_err_floor(r->full, r->ref->r.state[rv], adt_value_numel(g, v), r->ref->r.scale[rv]);
        CHECK(e <= STATE_TOL, "%s: '%s' after %d steps differs from the serial run by %.3g (seed %llu)", r->what,
              g->values[v].name, STEPS, e, (unsigned long long)g_seed);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static void run_free(run *r) {
    adt_pipe_free(r->pp);
    adt_exec_free(r->ex);
    if (r->mc) adt_mesh_comm_release(r->mc, r->loc.g);
    adt_mesh_comm_free(r->mc);
    adt_dist_local_free(&r->loc);
    adt_plan_free(&r->p);
    adt_graph_free(r->pg);
    free(r->full);
}

/* STEPS steps of the expert plan of `strategy` (micro microbatches) with the batch split `split`
 * (n entries), changed to `split2` after step CHANGE_AT when given, against the serial run. */
static void split_run(const family *f, const whole_batch *ref, const char *strategy, int micro, const int *split,
                      const int *split2, int n) {
    char what[192], sb[64] = "", sb2[64] = "";
    for (int i = 0; i < n; i++) {
        snprintf(sb + strlen(sb), sizeof sb - strlen(sb), "%s%d", i ? "," : "", split[i]);
        if (split2) snprintf(sb2 + strlen(sb2), sizeof sb2 - strlen(sb2), "%s%d", i ? "," : "", split2[i]);
    }
    snprintf(what, sizeof what, "%s, %s, %d microbatch%s, batch split {%s}%s%s%s", f->name, strategy, micro,
             micro > 1 ? "es" : "", sb, split2 ? " then {" : "", sb2, split2 ? "}" : "");
    run r = {.f = f, .ref = ref, .what = what};
    r.pg = family_graph(f, BATCH / micro, &r.pio);
    adt_expert_opts eo = {.strategy = strategy, .devices = g_size, .batch = BATCH, .microbatches = micro};
    int rc = adt_expert_plan(r.pg, &f->cfg, &eo, &r.p);
    CHECK(rc == ADT_OK, "%s: expert plan: %s", what, adt_error_message());
    if (!rc) rc = adt_plan_set_batch_split(&r.p, r.pg, split, n);
    CHECK(rc == ADT_OK, "%s: adt_plan_set_batch_split: %s", what, adt_error_message());
    r.piped = r.p.n_stages > 1 || r.p.microbatches > 1;
    if (!rc) rc = run_setup(&r);
    CHECK(rc == ADT_OK, "%s: setup: %s", what, adt_error_message());
    int64_t big = 1;
    for (int v = 0; v < ref->g->n_values; v++)
        if (adt_value_numel(ref->g, v) > big) big = adt_value_numel(ref->g, v);
    r.full = malloc((size_t)big * sizeof(float));
    double worst_loss = 0, worst_state = 0;
    if (!rc) {
        check_share(&r, split);
        adt_exec_init_params(r.piped ? adt_pipe_exec(r.pp) : r.ex);
    }
    for (int step = 1; step <= STEPS && !rc; step++) {
        adt_exec_set_lr_step(r.piped ? adt_pipe_exec(r.pp) : r.ex, LR, step);
        r.step = step;
        double loss = 0;
        rc = run_step(&r, &loss);
        CHECK(rc == ADT_OK, "%s, step %d: %s", what, step, adt_error_message());
        if (rc) break;
        double e = fabs(loss - ref->r.loss[step - 1]) / fabs(ref->r.loss[step - 1]);
        CHECK(e <= LOSS_TOL, "%s, step %d: loss %.9g, serial %.9g (relative error %.3g; seed %llu)", what, step, loss,
              ref->r.loss[step - 1], e, (unsigned long long)g_seed);
        if (!(e <= worst_loss)) worst_loss = e;
        if (step != CHANGE_AT || !split2) continue;
        rc = adt_plan_set_batch_split(&r.p, r.pg, split2, n);
        CHECK(rc == ADT_OK, "%s: changing the split: %s", what, adt_error_message());
        if (!rc && r.piped) {
            rc = adt_pipe_rebuild(&r.pp);
        } else if (!rc) {
            adt_exec_opts o = run_opts();
            r.d = adt_plan_dist(&r.p, 0, r.ranks);
            rc = adt_dist_rebuild(g_world, r.pg, &r.d, &o, &r.loc, &r.mc, &r.ex);
        }
        CHECK(rc == ADT_OK, "%s: rebuilding for the new split: %s", what, adt_error_message());
        if (!rc) check_share(&r, split2);
    }
    if (!rc) worst_state = run_compare_state(&r);
    if (g_rank == 0 && !rc)
        fprintf(stderr, "%s on %d ranks: worst loss error %.2e, state %.2e\n", what, g_size, worst_loss, worst_state);
    run_free(&r);
}

/* The split of this world's replicas: dp over every rank, or over 2 of 4 with tp or pp. */
static const int *split_of(int replicas, int reverse) {
    static const int two[2] = {3, 5}, two_r[2] = {5, 3}, four[4] = {1, 2, 2, 3}, four_r[4] = {3, 2, 2, 1};
    if (replicas == 2) return reverse ? two_r : two;
    return reverse ? four_r : four;
}

static void with_reference(const char *name, void (*body)(const family *, const whole_batch *)) {
    family f = family_of(name);
    whole_batch w = {0};
    int rc = serial_run(&f, &w);
    CHECK(rc == 0, "%s: serial run: %s", name, adt_error_message());
    if (!rc) body(&f, &w);
    whole_batch_free(&w);
}

static void body_dp(const family *f, const whole_batch *w) { split_run(f, w, "dp", 1, split_of(g_size, 0), NULL, g_size); }
static void body_zero(const family *f, const whole_batch *w) {
    split_run(f, w, "dp,zero", 1, split_of(g_size, 0), NULL, g_size);
}
static void body_dp_tp(const family *f, const whole_batch *w) {
    if (g_size != 4) return;
    split_run(f, w, "dp=2,tp=2", 1, split_of(2, 0), NULL, 2);
    split_run(f, w, "dp=2,tp=2,zero", 1, (int[]){1, 7}, NULL, 2);
}
static void body_pipe(const family *f, const whole_batch *w) {
    static const int two[2] = {2, 6}, four[4] = {2, 2, 2, 2};
    split_run(f, w, "dp", 2, g_size == 2 ? two : four, NULL, g_size);
    if (g_size == 4) split_run(f, w, "dp=2,pp=2", 2, two, NULL, 2);
}
static void body_change(const family *f, const whole_batch *w) {
    static const int two[2] = {2, 6}, two_r[2] = {6, 2};
    split_run(f, w, "dp", 1, split_of(g_size, 0), split_of(g_size, 1), g_size);
    split_run(f, w, "dp,zero", 1, split_of(g_size, 0), split_of(g_size, 1), g_size);
    if (g_size == 2) split_run(f, w, "dp", 2, two, two_r, 2);
    if (g_size == 4) split_run(f, w, "dp=2,pp=2", 2, two, two_r, 2);
}

static void case_dp_gpt(void) { with_reference("gpt", body_dp); }
static void case_dp_mlp(void) { with_reference("mlp", body_dp); }
static void case_dp_vgg(void) { with_reference("vgg", body_dp); }
static void case_dp_dlrm(void) { with_reference("dlrm", body_dp); }
static void case_zero(void) {
    with_reference("mlp", body_zero);
    with_reference("gpt", body_zero);
}
static void case_dp_tp(void) {
    with_reference("gpt", body_dp_tp);
    with_reference("mlp", body_dp_tp);
}
static void case_pipe(void) {
    with_reference("gpt", body_pipe);
    with_reference("mlp", body_pipe);
}
static void case_change(void) {
    with_reference("mlp", body_change);
    with_reference("gpt", body_change);
}

static const mpi_case CASES[] = {{"dp_gpt", case_dp_gpt}, {"dp_mlp", case_dp_mlp}, {"dp_vgg", case_dp_vgg},
                                 {"dp_dlrm", case_dp_dlrm}, {"zero", case_zero},     {"dp_tp", case_dp_tp},
                                 {"pipe", case_pipe},       {"change", case_change}};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static int child_main(void) { return mpi_child_main(CASES, N_CASES, &g_world, &g_rank, &g_size); }

/* ---- in this process: blocks, errors, files ------------------------------------------------------ */

/* adt_mesh_cut: batch-divided lengths by the split's parts, in order; other lengths evenly. */
static void test_cut(void) {
    adt_mesh m;
    adt_mesh_init(&m, 2, (int[]){2, 3});
    static const int parts[3] = {1, 4, 3};
    m.split = parts, m.split_axis = 1, m.split_total = 8;
    int64_t s, l, at = 0;
    for (int c = 0; c < 3; c++) { /* 24 = 3 x 8: parts of 3 rows per sample */
        adt_mesh_cut(&m, 1, 24, c, &s, &l);
        CHECK(s == at && l == 3 * parts[c], "cut of 24 at %d: [%lld, +%lld), expected [%lld, +%d)", c, (long long)s,
              (long long)l, (long long)at, 3 * parts[c]);
        at += l;
    }
    adt_mesh_cut(&m, 1, 10, 2, &s, &l); /* not a multiple of the batch: the even block split */
    CHECK(s == 7 && l == 3, "cut of 10 at 2: [%lld, +%lld), expected [7, +3)", (long long)s, (long long)l);
    adt_mesh_cut(&m, 0, 8, 1, &s, &l); /* another mesh axis: even */
    CHECK(s == 4 && l == 4, "cut of 8 on axis 0 at 1: [%lld, +%lld), expected [4, +4)", (long long)s, (long long)l);
    adt_ndsbp sb;
    adt_ndsbp_parse("(B,S0)", 2, 2, &sb);
    adt_shape sh = {.ndim = 2, .dim = {16, 5}}, lo, hi;
    adt_ndsbp_block_bounds(&sb, &m, sh, &lo, &hi);
    CHECK(lo.dim[0] == 2 && hi.dim[0] == 8, "bounds of (B,S0) on [16,5]: %lld..%lld, expected 2..8", (long long)lo.dim[0],
          (long long)hi.dim[0]);
    CHECK(!adt_ndsbp_even(&sb, &m, sh), "an uneven split is not even");
}

static const char *error_after(int rc) { return rc ? adt_error_message() : "(accepted)"; }

/* adt_plan_set_batch_split refuses what cannot be, naming the field, and keeps the old split. */
static void test_set_errors(void) {
    family f = family_of("mlp");
    adt_model_io io;
    adt_graph *g = family_graph(&f, BATCH / 2, &io);
    adt_plan p, tp;
    adt_expert_opts eo = {.strategy = "dp=2", .devices = 2, .batch = BATCH, .microbatches = 2};
    int rc = adt_expert_plan(g, &f.cfg, &eo, &p);
    CHECK(rc == ADT_OK, "dp=2 plan: %s", adt_error_message());
    if (rc) return;
    rc = adt_plan_set_batch_split(&p, g, (int[]){2, 6}, 2);
    CHECK(rc == ADT_OK && p.split_axis == 0 && p.split_parts[0] == 1 && p.split_parts[1] == 3,
          "{2,6} with 2 microbatches: %s", error_after(rc));
    struct {
        int sizes[3], n;
        const char *says;
    } bad[] = {{{2, 2, 4}, 3, "3 entries, expected 2"}, {{2, 4}, 2, "sums to 6"}, {{0, 8}, 2, "batch_split[0]\" is 0"},
               {{3, 5}, 2, "multiple of the microbatches"}, {{-2, 10}, 2, "batch_split[0]\" is -2"}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        rc = adt_plan_set_batch_split(&p, g, bad[k].sizes, bad[k].n);
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), bad[k].says) && strstr(adt_error_message(), "batch_split"),
              "bad split %zu: expected an error saying '%s', got: %s", k, bad[k].says, error_after(rc));
        CHECK(p.batch_split && p.batch_split[0] == 2 && p.batch_split[1] == 6, "bad split %zu: the old split is kept", k);
    }
    rc = adt_plan_set_batch_split(&p, g, NULL, 0);
    CHECK(rc == ADT_OK && !p.batch_split && !p.split_parts, "clearing the split: %s", error_after(rc));
    adt_plan_free(&p);
    adt_graph_free(g);
    /* tensor parallelism alone splits no batch */
    g = family_graph(&f, BATCH, &io);
    eo = (adt_expert_opts){.strategy = "tp=2", .devices = 2, .batch = BATCH};
    rc = adt_expert_plan(g, &f.cfg, &eo, &tp);
    CHECK(rc == ADT_OK, "tp=2 plan: %s", adt_error_message());
    if (!rc) {
        rc = adt_plan_set_batch_split(&tp, g, (int[]){3, 5}, 2);
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "no data-parallel axis"),
              "a tp plan with a batch split: %s", error_after(rc));
        adt_plan_free(&tp);
    }
    adt_graph_free(g);
}

/* A plan file with "batch_split": saved, loaded and bound with its split; bad ones refused. */
static void test_file(void) {
    family f = family_of("gpt");
    adt_model_io io;
    adt_graph *g = family_graph(&f, BATCH, &io);
    adt_plan p, q, tp;
    adt_expert_opts eo = {.strategy = "dp=2,tp=2", .devices = 4, .batch = BATCH};
    int rc = adt_expert_plan(g, &f.cfg, &eo, &p);
    if (!rc) rc = adt_plan_set_batch_split(&p, g, (int[]){1, 7}, 2);
    CHECK(rc == ADT_OK, "dp=2,tp=2 with {1,7}: %s", adt_error_message());
    if (rc) {
        adt_graph_free(g);
        return;
    }
    char *text = adt_plan_to_json(&p, g);
    cJSON *root = cJSON_Parse(text);
    cJSON *bs = cJSON_GetObjectItemCaseSensitive(root, "batch_split");
    CHECK(cJSON_GetArraySize(bs) == 2 && cJSON_GetArrayItem(bs, 0)->valueint == 1 &&
              cJSON_GetArrayItem(bs, 1)->valueint == 7, "the file holds the split");
    rc = adt_plan_parse(&q, text, "split.json");
    if (!rc) rc = adt_plan_bind(&q, g);
    CHECK(rc == ADT_OK && q.n_batch_split == 2 && q.batch_split[0] == 1 && q.batch_split[1] == 7 && q.split_axis == 0,
          "the split read back: %s", error_after(rc));
    adt_plan_free(&q);
    /* edits of the file's split: each refused with the field named */
    struct {
        const char *to, *says;
        int at_bind;
    } bad[] = {{"[1,6]", "sums to 7, expected \"batch\" (8)", 0},
               {"[0,8]", "batch_split[0]", 0},
               {"\"1,7\"", "expected an array of local batch sizes", 0},
               {"[]", "an empty array", 0},
               {"[1,1,6]", "3 entries, expected 2", 1}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        cJSON_ReplaceItemInObjectCaseSensitive(root, "batch_split", cJSON_Parse(bad[k].to));
        char *edited = cJSON_PrintUnformatted(root);
        rc = adt_plan_parse(&q, edited, "edited.json");
        if (!rc && bad[k].at_bind) rc = adt_plan_bind(&q, g);
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "edited.json") &&
                  strstr(adt_error_message(), bad[k].says),
              "edit %zu (%s): expected an error saying '%s', got: %s", k, bad[k].to, bad[k].says, error_after(rc));
        adt_plan_free(&q);
        cJSON_free(edited);
    }
    cJSON_Delete(root);
    free(text);
    /* a tensor-parallel plan's file with a split: no data-parallel axis, at bind */
    eo = (adt_expert_opts){.strategy = "tp=2", .devices = 2, .batch = BATCH};
    rc = adt_expert_plan(g, &f.cfg, &eo, &tp);
    CHECK(rc == ADT_OK, "tp=2 plan: %s", adt_error_message());
    if (!rc) {
        text = adt_plan_to_json(&tp, g);
        root = cJSON_Parse(text);
        cJSON_AddItemToObject(root, "batch_split", cJSON_Parse("[3,5]"));
        char *edited = cJSON_PrintUnformatted(root);
        rc = adt_plan_parse(&q, edited, "tp.json");
        if (!rc) rc = adt_plan_bind(&q, g);
        CHECK(rc == ADT_ERR_ARG && strstr(adt_error_message(), "no data-parallel axis"),
              "a tp plan file with a split: %s", error_after(rc));
        adt_plan_free(&q);
        cJSON_free(edited);
        cJSON_Delete(root);
        free(text);
    }
    adt_plan_free(&tp);
    adt_plan_free(&p);
    adt_graph_free(g);
}

static void test_worlds(void) {
    mpi_test_worlds(CASES, N_CASES, 2, 2, 300);
    mpi_test_worlds(CASES, N_CASES, 4, 4, 400);
}

int main(int argc, char **argv) {
    int code;
    if (mpi_test_start(argc, argv, "dist_split", &g_seed, child_main, &code)) return code;
    RUN(test_cut);
    RUN(test_set_errors);
    RUN(test_file);
    RUN(test_worlds);
    rmdir(check_tmpdir());
    return check_finish();
}
