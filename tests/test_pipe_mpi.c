/*
 * test_pipe_mpi.c - pipeline-parallel training (adt_pipe: stages, send/recv, 1F1B over
 * microbatches, gradient accumulation, tied weights) on real processes, against the serial run.
 *
 * Run without arguments, the program checks the 1F1B order in this process and then launches
 * itself under `mpiexec -n N --child` for N = 2, 3, 4. In each world every rank runs, for a tiny
 * GPT (dropout on, the LM head tied to the token embedding), an MLP, a small VGG and a small
 * DLRM, the expert plans the world allows: pp=N (N = 2, 3, 4, where the model has the layers) and,
 * on 4 ranks, dp=2,pp=2 and tp=2,pp=2 (Megatron stages: partial sums cross stage boundaries
 * reduced, and GPT's tied wte is summed in the layout its update reads); each with 4
 * microbatches of a batch of 8. The serial reference is the
 * plain executor on the whole batch of 8. A case passes when at each of 5 steps every rank's loss
 * is the serial one within 1e-5 relative, and after the last step every parameter and optimizer
 * state (gathered over its stage mesh, on every stage that holds it: a tied parameter on both of
 * its stages) equals the serial one within float tolerance, and every parameter was compared
 * somewhere. Then, in this process: `mpiexec -n N adtrain train --plan` of plan files `adtrain
 * plan` wrote (a GPT with dropout under pp=2 and dp=2,pp=2, an MLP under pp=3; 4 microbatches)
 * logs the one-process run's step losses, validation losses and accuracy; and --save under pp=2
 * writes a distributed checkpoint (the tied wte once) whose export is the one-process run's
 * checkpoint within float tolerance.
 *
 * The seed comes from $ADT_TEST_SEED, else the time, and is printed.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "cli_run.h"
#include "mpi_world.h"
#include "serial_ref.h"
#include "mpi_families.h"
#include "train_log.h"
#include "mpi_cases.h"

#define STEPS 5
#define BATCH 8
#define MICRO 4
#define LOSS_TOL 1e-5
#define STATE_TOL 2e-5

static uint64_t g_seed;
static adt_comm *g_world;
static int g_rank, g_size;
static const float LR = 0.05f;

/* ---- the 1F1B order ------------------------------------------------------------------------ */

/* Every microbatch forward then backward once, in order; stage s starts with min(S-1-s, M)
 * forwards; at most S-s in flight; the last stage alternates from the start. */
static void test_1f1b(void) {
    for (int S = 1; S <= 5; S++)
        for (int M = 1; M <= 6; M++)
            for (int s = 0; s < S; s++) {
                adt_pipe_op ops[12];
                int n = adt_pipe_1f1b(S, s, M, ops), f = 0, b = 0, warm = 0, most = 0;
                CHECK(n == 2 * M, "S=%d s=%d M=%d: %d ops", S, s, M, n);
                while (warm < n && !ops[warm].backward) warm++;
                int want = S - 1 - s < M ? S - 1 - s : M;
                CHECK(warm == (want < M ? want + 1 : M), "S=%d s=%d M=%d: %d forwards before the first backward", S, s,
                      M, warm);
                for (int i = 0; i < n; i++) {
                    if (ops[i].backward) CHECK(ops[i].microbatch == b++, "S=%d s=%d M=%d: backward order", S, s, M);
                    else CHECK(ops[i].microbatch == f++, "S=%d s=%d M=%d: forward order", S, s, M);
                    CHECK(b <= f, "S=%d s=%d M=%d: backward before its forward", S, s, M);
                    if (f - b > most) most = f - b;
                }
                CHECK(f == M && b == M, "S=%d s=%d M=%d: %d forwards, %d backwards", S, s, M, f, b);
                CHECK(most <= S - s, "S=%d s=%d M=%d: %d in flight", S, s, M, most);
            }
}

/* ---- model families --------------------------------------------------------------------------- */

/* The whole batch's data of fed value v (of the whole-batch graph) at a step. */
static void feed_global(const family *f, const adt_graph *g, const adt_model_io *io, int v, int step, void *buf) {
    family_feed(f, g_seed, g, io, v, step, buf);
}

/* ---- the serial reference (serial_ref.h): the plain executor on the whole batch ---------------- */

typedef struct whole_batch {
    adt_graph *g;
    adt_model_io io;
    reference r;
} whole_batch;

static const family *g_family; /* what feed_cb feeds */

static void feed_cb(void *ctx, const adt_graph *g, int v, int step, void *buf) {
    feed_global(g_family, g, &((whole_batch *)ctx)->io, v, step, buf);
}

static int serial_run(const family *f, whole_batch *ref) {
    ref->g = family_graph(f, BATCH, &ref->io);
    if (adt_graph_error(ref->g)) return -1;
    g_family = f;
    return serial_ref_run(ref->g, STEPS, LR, g_seed, feed_cb, ref, &ref->r);
}

static void reference_free(whole_batch *ref) {
    if (ref->g) serial_ref_free(ref->g, &ref->r);
    adt_graph_free(ref->g);
}

/* ---- microbatch slots in one process ------------------------------------------------------------
 * The executor alone (no stages): the plan's graph of a family at BATCH / MICRO with 3 slots, the
 * microbatches' passes interleaved as a 1F1B stage would run them (F0 F1 F2 B0 F3 B1 B2 B3), then
 * one update: the mean of the microbatch losses and the state after STEPS steps equal the serial
 * run on the whole batch (dropout included: each microbatch draws its rows of the whole mask). */
static void slots_run(const char *name) {
    family f = family_of(name);
    whole_batch ref = {0};
    int rc = serial_run(&f, &ref);
    CHECK(rc == 0, "%s: serial run: %s", name, adt_error_message());
    adt_model_io io;
    adt_graph *g = family_graph(&f, BATCH / MICRO, &io);
    adt_exec *ex = NULL;
    if (!rc) rc = adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = g_seed, .microbatch_slots = 3});
    CHECK(rc == 0, "%s: executor with slots: %s", name, adt_error_message());
    float *full = malloc(1 << 20);
    double worst = 0;
    static const adt_pipe_op order[2 * MICRO] = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {0, 3}, {1, 1}, {1, 2}, {1, 3}};
    if (!rc) adt_exec_init_params(ex);
    for (int step = 1; step <= STEPS && !rc; step++) {
        adt_exec_set_lr_step(ex, LR, step);
        double loss = 0;
        for (int i = 0; i < 2 * MICRO && !rc; i++) {
            int mb = order[i].microbatch, slot = mb % 3;
            if (!order[i].backward)
                for (int v = 0; v < g->n_values; v++) {
                    if (!serial_is_data(g, v)) continue;
                    feed_global(&f, ref.g, &ref.io, adt_graph_find_value(ref.g, g->values[v].name), step, full);
                    size_t bytes = (size_t)adt_value_bytes(g, v);
                    memcpy(adt_exec_slot_data(ex, slot, v), (char *)full + (size_t)mb * bytes, bytes);
                }
            adt_exec_set_microbatch(ex, mb);
            rc = adt_exec_run_pass(ex, slot, order[i].backward);
            if (!order[i].backward) loss += *(float *)adt_exec_slot_data(ex, slot, g->loss) / MICRO;
        }
        if (!rc) rc = adt_exec_run_update(ex);
        CHECK(rc == 0, "%s, step %d: %s", name, step, adt_error_message());
        double e = fabs(loss - ref.r.loss[step - 1]) / fabs(ref.r.loss[step - 1]);
        CHECK(e <= LOSS_TOL, "%s, step %d: mean microbatch loss %.9g, serial %.9g", name, step, loss, ref.r.loss[step - 1]);
        worst = fmax(worst, e);
    }
    for (int v = 0; v < g->n_values && !rc; v++) {
        if (!adt_role_is_persistent(g->values[v].role)) continue;
        int rv = adt_graph_find_value(ref.g, g->values[v].name);
        double e = check_scaled_err_floor(adt_exec_data(ex, v), ref.r.state[rv], adt_value_numel(g, v), ref.r.scale[rv]);
        CHECK(e <= STATE_TOL, "%s: '%s' after %d steps differs from the serial run by %.3g", name, g->values[v].name,
              STEPS, e);
    }
    CHECK(adt_exec_run_update(ex) == ADT_ERR_STATE, "%s: an update without a backward pass is refused", name);
    CHECK(adt_exec_run_pass(ex, 3, 0) == ADT_ERR_ARG && strstr(adt_error_message(), "slot 3"),
          "%s: a pass in slot 3 of 3 is refused, naming the slot: %s", name, adt_error_message());
    fprintf(stderr, "%s: microbatch slots in one process: worst loss error %.2e\n", name, worst);
    free(full);
    adt_exec_free(ex);
    adt_graph_free(g);
    reference_free(&ref);
}

static void test_slots(void) {
    slots_run("gpt");
    slots_run("vgg");
}

/* ---- a pipelined run ------------------------------------------------------------------------------ */

typedef struct feed_ctx {
    const family *f;
    const whole_batch *ref;
    const adt_graph *pg; /* the plan's graph (batch / MICRO) */
    int step;
    float *full;         /* scratch of the largest fed value */
} feed_ctx;

/* Microbatch mb's rows of the whole batch, this rank's block of each fed value its stage holds. */
static int feed_microbatch(void *vctx, adt_pipe *pp, int mb) {
    feed_ctx *c = vctx;
    for (int v = 0; v < c->pg->n_values; v++) {
        if (!serial_is_data(c->pg, v)) continue;
        adt_box blk;
        void *dst = adt_pipe_value(pp, mb, v, &blk);
        if (!dst) continue;
        int sv = adt_graph_find_value(c->ref->g, c->pg->values[v].name);
        feed_global(c->f, c->ref->g, &c->ref->io, sv, c->step, c->full);
        const adt_value *val = &c->pg->values[v];
        size_t es = adt_dtype_size(val->dtype);
        adt_box all = {.global = val->shape, .shape = val->shape};
        const char *rows = (const char *)c->full + (size_t)mb * (size_t)adt_shape_numel(&val->shape) * es;
        adt_box_transfer(dst, &blk, rows, &all, es, 0);
    }
    return 0;
}

static void pipe_run(const family *f, const whole_batch *ref, const char *strategy) {
    adt_model_io pio;
    adt_graph *pg = family_graph(f, BATCH / MICRO, &pio);
    adt_plan p;
    adt_expert_opts eo = {.strategy = strategy, .devices = g_size, .batch = BATCH, .microbatches = MICRO};
    if (adt_expert_plan(pg, &f->cfg, &eo, &p)) {
        if (g_rank == 0) fprintf(stderr, "%s, %s on %d ranks: not applicable: %s\n", f->name, strategy, g_size,
                                 adt_error_message());
        adt_graph_free(pg);
        return;
    }
    char what[160];
    snprintf(what, sizeof what, "%s, %s (%d stages, %d microbatches)", f->name, strategy, p.n_stages, p.microbatches);
    adt_pipe *pp = NULL;
    int rc = adt_pipe_create(&pp, g_world, &p, pg, &(adt_exec_opts){.threads = 1, .seed = g_seed});
    CHECK(rc == ADT_OK, "%s: adt_pipe_create: %s", what, adt_error_message());
    int64_t big = 1;
    for (int v = 0; v < ref->g->n_values; v++)
        if (adt_value_numel(ref->g, v) > big) big = adt_value_numel(ref->g, v);
    feed_ctx c = {.f = f, .ref = ref, .pg = pg, .full = malloc((size_t)big * sizeof(float))};
    double worst_loss = 0, worst_state = 0;
    if (!rc) {
        adt_exec *ex = adt_pipe_exec(pp);
        adt_exec_init_params(ex);
        for (int step = 1; step <= STEPS && !rc; step++) {
            adt_exec_set_lr_step(ex, LR, step);
            c.step = step;
            double loss = 0;
            rc = adt_pipe_step(pp, feed_microbatch, &c, &loss);
            CHECK(rc == ADT_OK, "%s, step %d: %s", what, step, adt_error_message());
            double e = fabs(loss - ref->r.loss[step - 1]) / fabs(ref->r.loss[step - 1]);
            CHECK(e <= LOSS_TOL, "%s, step %d: loss %.9g, serial %.9g (relative error %.3g; seed %llu)", what, step,
                  loss, ref->r.loss[step - 1], e, (unsigned long long)g_seed);
            if (!(e <= worst_loss)) worst_loss = e;
        }
        /* the state of every stage, gathered over its mesh; each parameter compared somewhere */
        const adt_pipe_stage *st = adt_pipe_stage_info(pp);
        const adt_dist_local *loc = adt_pipe_local(pp);
        int32_t *seen = calloc((size_t)pg->n_values + 1, sizeof *seen);
        int n_params = 0;
        for (int v = 0; v < pg->n_values && !rc; v++) {
            if (!adt_role_is_persistent(pg->values[v].role)) continue;
            n_params += pg->values[v].role == ADT_ROLE_PARAM;
            void *data = adt_pipe_value(pp, 0, v, NULL);
            if (!data) continue;
            int sv = st->local_of[v], rv = adt_graph_find_value(ref->g, pg->values[v].name);
            rc = adt_mesh_comm_gather(adt_pipe_mesh_comm(pp), &loc->layout[sv], pg->values[v].shape, ADT_F32, data, c.full);
            CHECK(rc == ADT_OK && rv >= 0, "%s: gathering %s: %s", what, pg->values[v].name, adt_error_message());
            if (rc || rv < 0) break;
            double e = check_scaled_err_floor(c.full, ref->r.state[rv], adt_value_numel(pg, v), ref->r.scale[rv]);
            CHECK(e <= STATE_TOL, "%s: '%s' on stage %d after %d steps differs from the serial run by %.3g (seed %llu)",
                  what, pg->values[v].name, st->stage, STEPS, e, (unsigned long long)g_seed);
            if (!(e <= worst_state)) worst_state = e;
            seen[v] = 1;
        }
        if (!rc) rc = adt_comm_allreduce_i32(g_world, seen, pg->n_values);
        int n_seen = 0;
        for (int v = 0; v < pg->n_values; v++) n_seen += seen[v] > 0 && pg->values[v].role == ADT_ROLE_PARAM;
        CHECK(rc == ADT_OK && n_seen == n_params, "%s: %d of %d parameters held by some stage", what, n_seen, n_params);
        if (f->cfg.type == ADT_MODEL_GPT) { /* wte: the embedding on the first stage, the head on the last */
            uint64_t both = 1u | (uint64_t)1 << (p.n_stages - 1);
            CHECK(st->n_tied == 1 && st->tied[0].holders == both &&
                  (st->tied[0].grad >= 0) == (st->stage == 0 || st->stage == p.n_stages - 1),
                  "%s: %d tied parameters on stage %d, expected wte held by stages 0 and %d", what, st->n_tied,
                  st->stage, p.n_stages - 1);
        }
        free(seen);
    }
    double *w = calloc(2 * (size_t)g_size, sizeof *w); /* every rank's worst, to print the largest */
    w[2 * g_rank] = worst_loss, w[2 * g_rank + 1] = worst_state;
    if (!rc) rc = adt_comm_allreduce_f64(g_world, w, 2 * g_size);
    for (int r = 1; r < g_size; r++) w[0] = fmax(w[0], w[2 * r]), w[1] = fmax(w[1], w[2 * r + 1]);
    if (g_rank == 0 && !rc)
        fprintf(stderr, "%s on %d ranks: worst loss error %.2e, state %.2e\n", what, g_size, w[0], w[1]);
    free(w);
    free(c.full);
    adt_pipe_free(pp);
    adt_plan_free(&p);
    adt_graph_free(pg);
}

static void case_family(const char *name) {
    family f = family_of(name);
    whole_batch ref = {0};
    int rc = serial_run(&f, &ref);
    CHECK(rc == 0, "%s: serial run: %s", name, adt_error_message());
    if (!rc) {
        char s[32];
        snprintf(s, sizeof s, "pp=%d", g_size);
        pipe_run(&f, &ref, s);
        if (g_size == 4) pipe_run(&f, &ref, "dp=2,pp=2");
        if (g_size == 4) pipe_run(&f, &ref, "tp=2,pp=2");
    }
    reference_free(&ref);
}

static void case_gpt(void) { case_family("gpt"); }
static void case_mlp(void) { case_family("mlp"); }
static void case_vgg(void) { case_family("vgg"); }
static void case_dlrm(void) { case_family("dlrm"); }

static const mpi_case CASES[] = {{"pipe_gpt", case_gpt}, {"pipe_mlp", case_mlp}, {"pipe_vgg", case_vgg},
                                 {"pipe_dlrm", case_dlrm}};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static int child_main(void) {
    if (!(g_world = mpi_child_world())) return 1;
    g_rank = adt_comm_rank(g_world);
    g_size = adt_comm_size(g_world);
    return mpi_child_cases(g_world, CASES, N_CASES);
}

/* ---- the parent ------------------------------------------------------------------------------- */

static void test_worlds(void) { mpi_test_worlds(CASES, N_CASES, 2, 4, 300); }

/* `mpiexec -n N adtrain train --plan` of a plan `adtrain plan <plan_flags>` wrote (stages and
 * microbatches) against `adtrain train` on one process. */
static void cli_compare(const char *label, int n, const char *model_json, const char *flags, const char *plan_flags) {
    const char *says[] = {"done:", "pipe   ", NULL};
    double worst = train_compare(label, n, model_json, flags, plan_flags, says);
    fprintf(stderr, "%s, mpiexec -n %d: worst step loss error %.2e over 5 steps\n", label, n, worst);
}

static void cli_save_pipe(const char *gpt);

static void test_cli_train_pipe(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *gpt = "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":16,\"n_layer\":2,\"n_embd\":16,\"n_head\":2,"
                      "\"dropout\":0.1}\n";
    const char *mlp = "{\"type\":\"mlp\",\"sizes\":[16,24,12,4],\"activation\":\"relu\"}\n";
    const char *gpt_flags = "--data synthetic:text --steps 5 --batch 8 --lr 3e-3 --eval-every 5 --eval-batches 2 --seed 11";
    const char *mlp_flags = "--data synthetic:mlp --steps 5 --batch 8 --optimizer sgd --momentum 0.9 --lr 0.1 "
                            "--eval-every 5 --eval-batches 3 --seed 5";
    cli_compare("gpt, pp=2", 2, gpt, gpt_flags, "--strategy pp=2 --microbatches 4 --batch 8");
    cli_compare("mlp, pp=3", 3, mlp, mlp_flags, "--strategy pp=3 --microbatches 4 --batch 8 --optimizer sgd-momentum");
    cli_compare("gpt, dp=2,pp=2", 4, gpt, gpt_flags, "--strategy dp=2,pp=2 --microbatches 4 --batch 8");
    cli_save_pipe(gpt);
}

/* --save under a pipeline plan (GPT, pp=2, its wte tied across the stages): a distributed
 * checkpoint of the world of 2, each tied tensor written by one rank only, whose export holds
 * the one-process run's parameters and optimizer state after the same steps. */
static void cli_save_pipe(const char *gpt) {
    char cfgp[512], planp[512], dir[512], serial[512], one[512], args[2048], out[8192];
    snprintf(cfgp, sizeof cfgp, "%s", check_tmp_path("ckpt_model.json"));
    snprintf(planp, sizeof planp, "%s", check_tmp_path("ckpt_plan.json"));
    snprintf(dir, sizeof dir, "%s", check_tmp_path("ckpt_pipe"));
    snprintf(serial, sizeof serial, "%s", check_tmp_path("ckpt_serial.safetensors"));
    snprintf(one, sizeof one, "%s", check_tmp_path("ckpt_export.safetensors"));
    write_text(cfgp, gpt);
    snprintf(args, sizeof args, "plan --devices 2 --model '%s' --strategy pp=2 --microbatches 2 --batch 8 "
             "--optimizer sgd-momentum -o '%s'", cfgp, planp);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "adtrain %s: exit %d:\n%s", args, rc, out);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)(g_seed % 100000));
    const char *argv[] = {g_bin, "train", "--model", cfgp, "--data", "synthetic:text", "--steps", "3", "--batch", "8",
                          "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1", "--seed", seed, "--save", serial,
                          "--plan", planp, NULL};
    argv[20] = NULL; /* one process: no plan */
    mpi_world wd = {.n = 0, .argv = argv};
    if (!rc) mpi_run_world(&wd, check_tmpdir(), 60);
    CHECK(!rc && wd.status == 0, "the one-process run: exit %d:\n%s", wd.status, wd.err);
    mpi_world_free(&wd);
    argv[19] = dir, argv[20] = "--plan";
    wd = (mpi_world){.n = 2, .argv = argv};
    if (!rc) mpi_run_world(&wd, check_tmpdir(), 60);
    CHECK(!rc && wd.status == 0, "--save under pp=2: exit %d:\n%s", wd.status, wd.err);
    mpi_world_free(&wd);
    adt_dckpt *c = NULL;
    rc = adt_dckpt_open(&c, dir);
    CHECK(rc == ADT_OK, "--save under pp=2: %s", adt_error_message());
    if (!rc) {
        CHECK(adt_dckpt_world(c) == 2 && adt_dckpt_step(c) == 3, "world %d, step %lld; expected 2 and 3",
              adt_dckpt_world(c), (long long)adt_dckpt_step(c));
        const char *tied[] = {"wte.weight", "opt.m.wte.weight"};
        for (int k = 0; k < 2; k++) { /* held by both stages, written by one */
            int files = 0;
            for (int i = 0; i < adt_dckpt_file_count(c); i++) {
                const adt_dckpt_file *fl = adt_dckpt_file_get(c, i);
                for (int j = 0; j < fl->n_slices; j++) files += !strcmp(adt_dckpt_tensor_get(c, fl->slices[j].tensor)->name, tied[k]);
            }
            CHECK(files == 1, "'%s' is written by %d ranks, expected 1", tied[k], files);
        }
        rc = adt_dckpt_export(c, one, 1);
        CHECK(rc == ADT_OK, "export: %s", adt_error_message());
    }
    adt_dckpt_close(c);
    adt_st_file *a = NULL, *b = NULL;
    if (!rc && !(rc = adt_st_open(&a, one)) && !(rc = adt_st_open(&b, serial))) {
        CHECK(adt_st_count(a) == adt_st_count(b), "%d tensors exported, the one-process file has %d", adt_st_count(a),
              adt_st_count(b));
        double worst = 0;
        for (int i = 0; i < adt_st_count(b); i++) {
            const adt_st_tensor *want = adt_st_get(b, i);
            long n = 1;
            for (int d = 0; d < want->ndim; d++) n *= (long)want->shape[d];
            float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
            int r2 = adt_st_read_f32(a, want->name, x, want->ndim, want->shape) |
                     adt_st_read_f32(b, want->name, y, want->ndim, want->shape);
            double e = r2 ? INFINITY : check_scaled_err(x, y, n);
            CHECK(e <= STATE_TOL, "'%s' saved under pp=2 differs from the one-process run's by %.3g (%s)", want->name, e,
                  r2 ? adt_error_message() : "values");
            if (!(e <= worst)) worst = e;
            free(x), free(y);
        }
        fprintf(stderr, "gpt, pp=2, --save: %d tensors, worst error against the one-process checkpoint %.2e\n",
                adt_st_count(b), worst);
    }
    CHECK(rc == ADT_OK, "reading the checkpoints: %s", adt_error_message());
    adt_st_close(a);
    adt_st_close(b);
    unlink(one), unlink(serial), unlink(cfgp), unlink(planp);
    char p[1024];
    for (int r = 0; r < 2; r++) {
        snprintf(p, sizeof p, "%s/step3-rank%05d-of-00002.safetensors", dir, r);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    unlink(p);
    rmdir(dir);
}

int main(int argc, char **argv) {
    int code;
    if (mpi_test_start(argc, argv, "pipe_mpi", &g_seed, child_main, &code)) return code;
    RUN(test_1f1b);
    RUN(test_slots);
    RUN(test_worlds);
    RUN(test_cli_train_pipe);
    rmdir(check_tmpdir());
    return check_finish();
}
