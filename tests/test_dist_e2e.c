/*
 * test_dist_e2e.c - `adtrain train` end to end under MPI, against the one-process run of the same
 * flags. For each model family (a tiny GPT with dropout and two blocks, an MLP, a VGG, a DLRM),
 * with a global batch of 7 (uneven over 2, 3 and 4 ranks; pipelines take 8, in 4 microbatches):
 *   - every expert strategy of the table below that applies to world sizes 2, 3 and 4 (a plan
 *     file from `adtrain plan`; pipeline stages over every rank, and dp=2,pp=2), and random valid
 *     plans (tests/plan_random.h: on meshes (2), (3), (4) and (2,2)), each run as `mpiexec -n N adtrain train --plan PLAN --save DIR`, log the
 *     serial run's loss at every one of 5 steps within 1e-5 relative, and the distributed
 *     checkpoint DIR, exported to one file, holds the serial run's parameters and optimizer
 *     state within 1e-4 (|x - ref| / (|ref| + scale) per tensor, scale the largest |x| of the
 *     tensor over the serial run's steps: check_scaled_err_floor);
 *   - a plan of one device in 4 microbatches, run by one process without mpiexec, runs them (its
 *     banner says so), logs the serial run's losses within 1e-5 and saves its state (a
 *     distributed checkpoint of world 1) within 1e-4;
 *   - a strategy that cannot apply (tensor parallelism over a degree that does not divide the
 *     GPT's heads) is refused by `adtrain plan`, naming the reason;
 *   - checkpoints across plans: saved at step 3 under plan A on a ranks (or one process: a
 *     single file), resumed under plan B on b ranks up to step 6 (pipelines on either side), the losses of steps 4-6 equal
 *     the uninterrupted serial run's within 1e-5; resumed under the same plan, they equal that
 *     plan's uninterrupted run bit for bit;
 *   - --init from a distributed checkpoint under another plan gives the losses of the one-process
 *     run started from its export, and --resume under another --batch is refused, naming it;
 *   - ADT_MEM_REPORT (the memory figures bench/run_plans.sh reads): every rank reports its state
 *     block, and ZeRO on 2 ranks holds half of the 12 P bytes (parameters, AdamW's two moments)
 *     that data parallelism holds on each, P from the model's sizes in closed form.
 * Runs use --schedule constant, so a run of 3 steps and the first 3 of a run of 6 take the same
 * learning rates. The seed comes from $ADT_TEST_SEED, else the time, and is printed.
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "cli_run.h"
#include "mpi_world.h"
#include "plan_random.h"

#define STEPS 5
#define RESUME_AT 3
#define RESUME_TO 6
#define BATCH 7
#define BATCH_PIPE 8 /* pipelines: 4 microbatches of 2 */
#define LOSS_TOL 1e-5
#define STATE_TOL 1e-4
#define N_RANDOM 24

static uint64_t g_seed;

/* ---- the model families --------------------------------------------------------------------------- */

typedef struct family {
    const char *name;
    const char *json;
    const char *flags;    /* data and optimizer flags of adtrain train */
    const char *optimizer; /* the same for adtrain plan */
} family;

/* The GPT trains with SGD: the gradient of its attention key bias is zero but for rounding (a
 * softmax ignores a shift of all its scores), and AdamW (eps 1e-8) would turn that rounding, which
 * differs by layout, into full-size steps. */
static const family families[] = {
    {"gpt", "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":5,\"n_layer\":2,\"n_embd\":8,\"n_head\":4,\"dropout\":0.1}",
     "--data synthetic:text --optimizer sgd --momentum 0.9 --lr 0.5", "sgd-momentum"},
    {"mlp", "{\"type\":\"mlp\",\"sizes\":[9,16,12,5],\"activation\":\"gelu\"}",
     "--data synthetic:mlp --optimizer sgd --momentum 0.9 --lr 0.1", "sgd-momentum"},
    {"vgg", "{\"type\":\"vgg\",\"in_channels\":2,\"height\":6,\"width\":6,\"blocks\":[[4],[6]],\"fc\":[8],\"classes\":3}",
     "--data synthetic:vgg --optimizer sgd --momentum 0.9 --lr 0.05", "sgd-momentum"},
    {"dlrm", "{\"type\":\"dlrm\",\"n_dense\":3,\"table_rows\":[5,7],\"emb_dim\":4,\"bottom\":[6,4],\"top\":[5,1]}",
     "--data synthetic:dlrm --optimizer adamw --lr 1e-2", "adamw"},
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

/* ---- the strategies: adding one is adding a line --------------------------------------------------- */

#define W2 (1 << 2)
#define W3 (1 << 3)
#define W4 (1 << 4)

typedef struct strategy {
    const char *text;  /* adtrain plan --strategy */
    int worlds;        /* world sizes it runs on (bits) */
    const char *flags; /* more adtrain plan flags */
    int batch;         /* the global batch */
} strategy;

static const strategy strategies[] = {
    {"dp", W2 | W3 | W4, "", BATCH},
    {"tp", W2 | W3 | W4, "", BATCH},
    {"zero", W2 | W3 | W4, "", BATCH},
    {"dp=2,tp=2", W4, "", BATCH},
    {"pp", W2 | W3 | W4, "--microbatches 4", BATCH_PIPE}, /* a stage per rank */
    {"dp=2,pp=2", W4, "--microbatches 4", BATCH_PIPE},
};
#define N_STRATEGIES ((int)(sizeof strategies / sizeof strategies[0]))

/* ---- files and runs -------------------------------------------------------------------------------- */

/* snprintf for command lines and paths; a line that does not fit fails the test. */
static void fmt(char *buf, size_t n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int k = vsnprintf(buf, n, f, ap);
    va_end(ap);
    CHECK(k >= 0 && (size_t)k < n, "a command line of %d characters does not fit %zu", k, n);
}

/* The serial references, per global batch: [0] BATCH, [1] BATCH_PIPE. */
typedef struct family_files {
    char cfg[512];       /* the model config */
    char serial[2][512]; /* the serial run's checkpoint after STEPS steps */
    double loss[2][RESUME_TO]; /* the serial run's losses */
    int n_scale[2];
    char (*scale_name[2])[128];
    double *scale[2]; /* max |x| of each tensor over steps 1..STEPS: check_scaled_err_floor's floor */
} family_files;

static int batch_index(int batch) { return batch == BATCH_PIPE; }

static family_files g_ff[N_FAMILIES];

typedef struct figures {
    int runs;
    double worst_loss, worst_state;
} figures;

static figures g_fig_expert, g_fig_random, g_fig_resume;

static void fig_add(figures *f, double loss, double state) {
    f->runs++;
    if (!(loss <= f->worst_loss)) f->worst_loss = loss;
    if (!(state <= f->worst_state)) f->worst_state = state;
}

static void common_flags(const family *f, int fi, int batch, int steps, char *buf, size_t n) {
    fmt(buf, n, "train --model '%s' %s --batch %d --schedule constant --seed %llu --steps %d", g_ff[fi].cfg, f->flags,
             batch, (unsigned long long)(g_seed % 100000), steps);
}

/* `mpiexec -n N adtrain <args>` (N 0: one process, no launcher); args split at blanks (paths
 * here have none). Returns the exit status; the output is printed on failure. */
static int run_world(int n, const char *args, const char *what) {
    char buf[4096];
    fmt(buf, sizeof buf, "%s", args);
    const char *argv[64];
    int k = 0;
    argv[k++] = g_bin;
    for (char *t = strtok(buf, " "); t && k < 63; t = strtok(NULL, " ")) {
        size_t l = strlen(t);
        if (l >= 2 && t[0] == '\'' && t[l - 1] == '\'') t[l - 1] = 0, t++;
        argv[k++] = t;
    }
    argv[k] = NULL;
    mpi_world wd = {.n = n, .argv = argv};
    mpi_run_world(&wd, check_tmpdir(), 120);
    int st = wd.status;
    CHECK(st == 0, "%s: mpiexec -n %d adtrain %s: exit %d after %.1f s", what, n, args, st, wd.secs);
    if (st) mpi_print_failure(&wd);
    mpi_world_free(&wd);
    return st;
}

/* The losses of a log (steps first..last) against want[first-1 .. last-1]; worst relative error. */
static double compare_losses(const char *log, int first, int last, const double *want, const char *what) {
    double got[16];
    int n_eval;
    int n = read_losses(log, got, 16, &n_eval);
    CHECK(n == last - first + 1, "%s: %d step lines in %s, expected %d", what, n, log, last - first + 1);
    double worst = 0;
    for (int i = 0; i < n && i < last - first + 1; i++) {
        double w = want[first - 1 + i], e = fabs(got[i] - w) / fabs(w);
        CHECK(e <= LOSS_TOL, "%s: step %d loss %.9g, the serial run's %.9g (relative error %.2e)", what, first + i, got[i],
              w, e);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            fmt(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* The distributed checkpoint `dir`, exported to one file, against the serial run's checkpoint:
 * the same tensors (parameters and optimizer state) in the same shapes, values within STATE_TOL.
 * Returns the worst error. */
static double compare_checkpoint(const char *dir, const family_files *ff, int bi, int world, const char *what,
                                 char *worst_name, size_t nn) {
    const char *serial = ff->serial[bi];
    adt_dckpt *c = NULL;
    int rc = adt_dckpt_open(&c, dir);
    CHECK(rc == ADT_OK, "%s: %s", what, adt_error_message());
    if (rc) return INFINITY;
    CHECK(adt_dckpt_world(c) == world && adt_dckpt_step(c) == STEPS, "%s: the checkpoint is of world %d, step %lld",
          what, adt_dckpt_world(c), (long long)adt_dckpt_step(c));
    char one[512];
    fmt(one, sizeof one, "%s", check_tmp_path("export.safetensors"));
    rc = adt_dckpt_export(c, one, 1);
    CHECK(rc == ADT_OK, "%s: export: %s", what, adt_error_message());
    adt_dckpt_close(c);
    adt_st_file *a = NULL, *b = NULL;
    double worst = 0;
    if (!rc && !adt_st_open(&a, one) && !adt_st_open(&b, serial)) {
        CHECK(adt_st_count(a) == adt_st_count(b), "%s: %d tensors exported, the serial checkpoint has %d", what,
              adt_st_count(a), adt_st_count(b));
        for (int i = 0; i < adt_st_count(b); i++) {
            const adt_st_tensor *want = adt_st_get(b, i);
            const adt_st_tensor *got = adt_st_find(a, want->name);
            CHECK(got != NULL, "%s: '%s' is not in the distributed checkpoint", what, want->name);
            if (!got) continue;
            int64_t n = 1;
            for (int d = 0; d < want->ndim; d++) n *= want->shape[d];
            float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
            rc = adt_st_read_f32(a, want->name, x, want->ndim, want->shape) |
                 adt_st_read_f32(b, want->name, y, want->ndim, want->shape);
            CHECK(rc == ADT_OK, "%s: %s", what, adt_error_message());
            double floor_ = 0;
            for (int k = 0; k < ff->n_scale[bi]; k++)
                if (!strcmp(ff->scale_name[bi][k], want->name)) floor_ = ff->scale[bi][k];
            double e = rc ? INFINITY : check_scaled_err_floor(x, y, n, floor_);
            CHECK(e <= STATE_TOL, "%s: '%s' after %d steps differs from the serial run's by %.3g", what, want->name, STEPS,
                  e);
            if (!(e <= worst)) worst = e, fmt(worst_name, nn, "%s", want->name);
            free(x), free(y);
        }
    } else {
        CHECK(0, "%s: %s", what, adt_error_message());
    }
    adt_st_close(a);
    adt_st_close(b);
    unlink(one);
    return worst;
}

/* One distributed run of STEPS steps under plan file `plan` against the serial run. */
static void run_plan(int fi, int world, int batch, const char *plan, const char *what, figures *fig) {
    const family *f = &families[fi];
    char args[4096], flags[2048], log[512], dir[512];
    int bi = batch_index(batch);
    common_flags(f, fi, batch, STEPS, flags, sizeof flags);
    fmt(log, sizeof log, "%s", check_tmp_path("dist.jsonl"));
    fmt(dir, sizeof dir, "%s", check_tmp_path("dist.ckpt"));
    fmt(args, sizeof args, "%s --plan %s --log %s --save %s", flags, plan, log, dir);
    if (run_world(world, args, what)) return;
    double el = compare_losses(log, 1, STEPS, g_ff[fi].loss[bi], what);
    char worst[256] = "";
    double es = compare_checkpoint(dir, &g_ff[fi], bi, world, what, worst, sizeof worst);
    printf("  %-58s loss %.1e, state %.1e (%s)\n", what, el, es, worst);
    fig_add(fig, el, es);
    unlink(log);
    remove_tree(dir);
}

/* ---- the serial references ------------------------------------------------------------------------- */

/* The largest |x| of each tensor of the serial checkpoints at steps 1..STEPS (file `pattern` with
 * {step}); removes those of the steps before RESUME_TO other than STEPS. */
static void serial_scales(family_files *ff, int bi, const char *pattern) {
    char path[512];
    for (int step = 1; step < RESUME_TO; step++) {
        const char *at = strstr(pattern, "{step}");
        fmt(path, sizeof path, "%.*s%d%s", (int)(at - pattern), pattern, step, at + strlen("{step}"));
        adt_st_file *st = NULL;
        int rc = step <= STEPS ? adt_st_open(&st, path) : ADT_OK;
        CHECK(rc == ADT_OK, "%s: %s", path, adt_error_message());
        for (int i = 0; st && i < adt_st_count(st); i++) {
            const adt_st_tensor *t = adt_st_get(st, i);
            int64_t n = 1;
            for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
            float *x = malloc((size_t)n * sizeof *x);
            double m = adt_st_read_f32(st, t->name, x, t->ndim, t->shape) == ADT_OK ? check_max_abs(x, (long)n) : 0;
            free(x);
            int k = 0;
            while (k < ff->n_scale[bi] && strcmp(ff->scale_name[bi][k], t->name)) k++;
            if (k == ff->n_scale[bi]) {
                ff->scale_name[bi] = realloc(ff->scale_name[bi], (size_t)(k + 1) * sizeof *ff->scale_name[bi]);
                ff->scale[bi] = realloc(ff->scale[bi], (size_t)(k + 1) * sizeof *ff->scale[bi]);
                fmt(ff->scale_name[bi][k], sizeof ff->scale_name[bi][k], "%s", t->name);
                ff->scale[bi][k] = 0;
                ff->n_scale[bi]++;
            }
            ff->scale[bi][k] = fmax(ff->scale[bi][k], m);
        }
        adt_st_close(st);
        if (step != STEPS) unlink(path);
    }
}

static void test_serial(void) {
    for (int fi = 0; fi < N_FAMILIES; fi++) {
        const family *f = &families[fi];
        char name[64], flags[2048], args[4096], log[512];
        fmt(name, sizeof name, "%s.json", f->name);
        fmt(g_ff[fi].cfg, sizeof g_ff[fi].cfg, "%s", check_tmp_path(name));
        CHECK(write_text(g_ff[fi].cfg, f->json) == 0, "writing %s", g_ff[fi].cfg);
        for (int bi = 0; bi < 2; bi++) {
            int batch = bi ? BATCH_PIPE : BATCH;
            fmt(name, sizeof name, "%s-b%d-serial-{step}.safetensors", f->name, batch);
            char pattern[512];
            fmt(pattern, sizeof pattern, "%s", check_tmp_path(name));
            fmt(name, sizeof name, "%s-b%d-serial-%d.safetensors", f->name, batch, STEPS);
            fmt(g_ff[fi].serial[bi], sizeof g_ff[fi].serial[bi], "%s", check_tmp_path(name));
            fmt(log, sizeof log, "%s", check_tmp_path("serial.jsonl"));
            /* one run to RESUME_TO steps saves every step: STEPS (the matrix's end) and the end
             * are kept, the steps up to STEPS give each tensor's scale */
            common_flags(f, fi, batch, RESUME_TO, flags, sizeof flags);
            fmt(args, sizeof args, "%s --log %s --save-every 1 --save %s", flags, log, pattern);
            if (run_world(0, args, f->name)) continue;
            serial_scales(&g_ff[fi], bi, pattern);
            int n_eval;
            double *loss = g_ff[fi].loss[bi];
            int n = read_losses(log, loss, RESUME_TO, &n_eval);
            CHECK(n == RESUME_TO, "%s: %d step lines in the serial log", f->name, n);
            for (int i = 0; i < n; i++) CHECK(isfinite(loss[i]), "%s: step %d loss %g", f->name, i + 1, loss[i]);
            unlink(log);
        }
    }
}

/* ---- expert plans ------------------------------------------------------------------------------------ */

/* Whether `adtrain plan` must refuse a strategy, and the words of the reason: tensor
 * parallelism gives each rank whole attention heads, so its degree must divide the GPT's. */
static const char *expected_refusal(const family *f, const strategy *s, int world) {
    adt_model_cfg cfg;
    adt_strategy st;
    if (adt_model_cfg_parse(&cfg, f->json, f->name) || adt_strategy_parse(s->text, world, &st)) return "?";
    if (cfg.type == ADT_MODEL_GPT && cfg.gpt.n_head % st.tp) return "attention heads";
    return NULL;
}

static void test_expert_plans(void) {
    int refused = 0;
    for (int fi = 0; fi < N_FAMILIES; fi++)
        for (int si = 0; si < N_STRATEGIES; si++)
            for (int world = 2; world <= 4; world++) {
                const family *f = &families[fi];
                const strategy *s = &strategies[si];
                if (!(s->worlds & (1 << world))) continue;
                char what[128], args[2048], out[8192], plan[512];
                fmt(what, sizeof what, "%s, %s on %d ranks", f->name, s->text, world);
                fmt(plan, sizeof plan, "%s", check_tmp_path("plan.json"));
                int batch = s->batch;
                fmt(args, sizeof args, "plan --devices %d --strategy %s %s --model '%s' --batch %d --optimizer %s -o '%s'",
                         world, s->text, s->flags, g_ff[fi].cfg, batch, f->optimizer, plan);
                int rc = run_adtrain(args, out, sizeof out);
                const char *why = expected_refusal(f, s, world);
                if (why) {
                    CHECK(rc == 2 && strstr(out, why), "%s: expected a refusal naming '%s', got exit %d:\n%s", what, why, rc,
                          out);
                    refused++;
                    continue;
                }
                CHECK(rc == 0, "%s: adtrain %s: exit %d:\n%s", what, args, rc, out);
                if (!rc) run_plan(fi, world, batch, plan, what, &g_fig_expert);
                unlink(plan);
            }
    printf("expert plans: %d runs (%d refused as expected), worst loss error %.2e (relative), worst state error %.2e\n",
           g_fig_expert.runs, refused, g_fig_expert.worst_loss, g_fig_expert.worst_state);
    CHECK(refused > 0, "no strategy was refused: the refusal check checked nothing");
}

/* A plan of one device with microbatches, run by one process without mpiexec: the step runs its
 * microbatches one after another (gradient accumulation through the pipeline executor, what the
 * cost model prices), and its losses equal the one-process full-batch run's. */
static void test_one_process_microbatches(void) {
    for (int fi = 0; fi < N_FAMILIES; fi++) {
        const family *f = &families[fi];
        char what[128], args[4096], flags[2048], out[16384], plan[512], log[512], dir[512];
        fmt(what, sizeof what, "%s, 4 microbatches in one process", f->name);
        fmt(plan, sizeof plan, "%s", check_tmp_path("plan-mb.json"));
        fmt(log, sizeof log, "%s", check_tmp_path("mb.jsonl"));
        fmt(args, sizeof args, "plan --devices 1 --strategy dp --microbatches 4 --model '%s' --batch %d --optimizer %s -o '%s'",
            g_ff[fi].cfg, BATCH_PIPE, f->optimizer, plan);
        int rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "%s: adtrain %s: exit %d:\n%s", what, args, rc, out);
        if (rc) continue;
        fmt(dir, sizeof dir, "%s", check_tmp_path("mb.ckpt"));
        common_flags(f, fi, BATCH_PIPE, STEPS, flags, sizeof flags);
        fmt(args, sizeof args, "%s --plan %s --log %s --save %s", flags, plan, log, dir);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "%s: exit %d:\n%s", what, rc, out);
        CHECK(strstr(out, "pipe   1 stages x 4 microbatches of 2 samples"), "%s: no microbatches in the banner:\n%s", what,
              out);
        if (!rc) {
            int bi = batch_index(BATCH_PIPE);
            char worst[256] = "";
            double el = compare_losses(log, 1, STEPS, g_ff[fi].loss[bi], what);
            double es = compare_checkpoint(dir, &g_ff[fi], bi, 1, what, worst, sizeof worst);
            printf("  %-58s loss %.1e, state %.1e (%s)\n", what, el, es, worst);
        }
        unlink(plan), unlink(log);
        remove_tree(dir);
    }
}

/* ---- random plans ------------------------------------------------------------------------------------ */

/* The training graph adtrain train builds for family f (and adtrain plan: the same checksum). */
static adt_graph *family_graph(const family *f, adt_model_cfg *cfg) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    CHECK(adt_model_cfg_parse(cfg, f->json, f->name) == ADT_OK, "%s: %s", f->name, adt_error_message());
    adt_model_build(g, cfg, BATCH, &io);
    adt_graph_backward(g, io.loss);
    adt_optim_cfg oc = !strcmp(f->optimizer, "adamw") ? adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f) : adt_optim_sgd(0.9f, 0.0f);
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s: %s", f->name, adt_graph_error_message(g));
    return g;
}

static void test_random_plans(void) {
    static const int meshes[][3] = {{1, 2}, {1, 3}, {1, 4}, {2, 2, 2}, {1, 2}, {1, 3}};
    const int n_meshes = (int)(sizeof meshes / sizeof meshes[0]);
    for (int k = 0; k < N_RANDOM; k++) {
        int fi = k % N_FAMILIES;
        const int *md = meshes[(k / N_FAMILIES) % n_meshes];
        adt_mesh m;
        adt_mesh_init(&m, md[0], &md[1]);
        adt_model_cfg cfg;
        adt_graph *g = family_graph(&families[fi], &cfg);
        uint64_t seed = g_seed * 1000003u + (uint64_t)k;
        char what[160], mb[32], plan[512];
        fmt(what, sizeof what, "%s, random plan %d (seed %llu) on mesh %s", families[fi].name, k,
                 (unsigned long long)seed, adt_mesh_str(&m, mb, sizeof mb));
        fmt(plan, sizeof plan, "%s", check_tmp_path("random.json"));
        int rc = plan_random_file(g, &cfg, BATCH, &m, seed, plan);
        CHECK(rc == 0, "%s: %s", what, adt_error_message());
        if (!rc) run_plan(fi, m.nranks, BATCH, plan, what, &g_fig_random);
        unlink(plan);
        adt_graph_free(g);
    }
    printf("random plans: %d runs, worst loss error %.2e (relative), worst state error %.2e\n", g_fig_random.runs,
           g_fig_random.worst_loss, g_fig_random.worst_state);
    CHECK(g_fig_random.runs >= 20, "%d random plans ran, expected at least 20", g_fig_random.runs);
}

/* ---- checkpoints across plans -------------------------------------------------------------------------- */

/* A side of a resume: world 0 is one process (no plan, one file); strategy NULL a random plan;
 * flags: more adtrain plan flags. */
typedef struct side {
    int world;
    const char *strategy;
    const char *flags;
} side;

typedef struct resume_case {
    int family;
    side a, b;
    int batch;
} resume_case;

static const resume_case resumes[] = {
    {1, {3, "zero", ""}, {2, "tp", ""}, BATCH},        /* sharded optimizer state -> column/row-split weights */
    {0, {2, "tp", ""}, {4, "dp=2,tp=2", ""}, BATCH},   /* tensor parallel -> 2-D, other world size */
    {2, {4, "dp", ""}, {0, NULL, ""}, BATCH},          /* distributed -> one process */
    {3, {0, NULL, ""}, {3, "zero", ""}, BATCH},        /* one file -> sharded over 3 */
    {3, {3, NULL, ""}, {2, "zero", ""}, BATCH},        /* a random plan -> ZeRO */
    {1, {3, "zero", ""}, {3, "zero", ""}, BATCH},      /* the same plan: bit for bit */
    {0, {2, "pp", "--microbatches 4"}, {3, "zero", ""}, BATCH_PIPE}, /* pipeline stages (tied wte) -> ZeRO */
    {0, {2, "tp", ""}, {4, "dp=2,pp=2", "--microbatches 4"}, BATCH_PIPE}, /* tensor parallel -> replicated stages */
    {2, {0, NULL, ""}, {3, "pp", "--microbatches 4"}, BATCH_PIPE},          /* one file -> three stages */
};

/* Writes the plan of a side to `path` (an expert plan, or a random one); 0 when written. */
static int side_plan(int fi, const side *s, int batch, uint64_t seed, const char *path, const char *what) {
    char args[2048], out[8192];
    if (s->strategy) {
        fmt(args, sizeof args, "plan --devices %d --strategy %s %s --model '%s' --batch %d --optimizer %s -o '%s'",
                 s->world, s->strategy, s->flags, g_ff[fi].cfg, batch, families[fi].optimizer, path);
        int rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "%s: adtrain %s: exit %d:\n%s", what, args, rc, out);
        return rc;
    }
    adt_model_cfg cfg;
    adt_graph *g = family_graph(&families[fi], &cfg);
    adt_mesh m;
    adt_mesh_init(&m, 1, &s->world);
    int rc = plan_random_file(g, &cfg, batch, &m, seed, path);
    CHECK(rc == 0, "%s: %s", what, adt_error_message());
    adt_graph_free(g);
    return rc;
}

static const char *side_str(const side *s, char *buf, size_t n) {
    if (!s->world) fmt(buf, n, "one process");
    else fmt(buf, n, "%s on %d ranks", s->strategy ? s->strategy : "a random plan", s->world);
    return buf;
}

static void test_resume_across_plans(void) {
    int same_plan_exact = 0;
    for (size_t r = 0; r < sizeof resumes / sizeof resumes[0]; r++) {
        const resume_case *rc_ = &resumes[r];
        int fi = rc_->family;
        const family *f = &families[fi];
        char what[256], sa[64], sb[64];
        fmt(what, sizeof what, "%s: saved under %s, resumed under %s", f->name, side_str(&rc_->a, sa, sizeof sa),
                 side_str(&rc_->b, sb, sizeof sb));
        char plan_a[512], plan_b[512], ck[512], log[512], flags[2048], args[4096];
        fmt(plan_a, sizeof plan_a, "%s", check_tmp_path("plan_a.json"));
        fmt(plan_b, sizeof plan_b, "%s", check_tmp_path("plan_b.json"));
        fmt(ck, sizeof ck, "%s", check_tmp_path(rc_->a.world ? "resume.ckpt" : "resume.safetensors"));
        fmt(log, sizeof log, "%s", check_tmp_path("resume.jsonl"));
        uint64_t seed = g_seed * 7919u + r;
        int batch = rc_->batch;
        if ((rc_->a.world && side_plan(fi, &rc_->a, batch, seed, plan_a, what)) ||
            (rc_->b.world && side_plan(fi, &rc_->b, batch, seed, plan_b, what)))
            continue;
        /* A: RESUME_AT steps, saved */
        common_flags(f, fi, batch, RESUME_AT, flags, sizeof flags);
        fmt(args, sizeof args, "%s%s%s --save %s", flags, rc_->a.world ? " --plan " : "", rc_->a.world ? plan_a : "", ck);
        if (run_world(rc_->a.world, args, what)) continue;
        struct stat st;
        CHECK(stat(ck, &st) == 0 && (rc_->a.world ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)),
              "%s: %s is not a %s", what, ck, rc_->a.world ? "directory (a distributed checkpoint)" : "file");
        /* B: resumed up to RESUME_TO; for the same plan, also the uninterrupted run under it */
        common_flags(f, fi, batch, RESUME_TO, flags, sizeof flags);
        fmt(args, sizeof args, "%s%s%s --resume %s --log %s", flags, rc_->b.world ? " --plan " : "",
                 rc_->b.world ? plan_b : "", ck, log);
        if (run_world(rc_->b.world, args, what)) continue;
        double el = compare_losses(log, RESUME_AT + 1, RESUME_TO, g_ff[fi].loss[batch_index(batch)], what);
        printf("  %-90s loss %.1e\n", what, el);
        fig_add(&g_fig_resume, el, 0);
        int same = rc_->a.world == rc_->b.world && rc_->a.strategy && rc_->b.strategy && !strcmp(rc_->a.strategy, rc_->b.strategy);
        if (same) {
            char full[512];
            fmt(full, sizeof full, "%s", check_tmp_path("full.jsonl"));
            fmt(args, sizeof args, "%s --plan %s --log %s", flags, plan_b, full);
            if (!run_world(rc_->b.world, args, what)) {
                double want[RESUME_TO], got[RESUME_TO];
                int ne, nw = read_losses(full, want, RESUME_TO, &ne), ng = read_losses(log, got, RESUME_TO, &ne);
                CHECK(nw == RESUME_TO && ng == RESUME_TO - RESUME_AT, "%s: %d and %d step lines", what, nw, ng);
                int exact = nw == RESUME_TO && ng == RESUME_TO - RESUME_AT;
                for (int i = 0; exact && i < ng; i++) exact = got[i] == want[RESUME_AT + i];
                CHECK(exact, "%s: the resumed losses are not bit for bit those of the uninterrupted run under the plan",
                      what);
                same_plan_exact += exact;
            }
            unlink(full);
        }
        unlink(log);
        unlink(plan_a);
        unlink(plan_b);
        if (rc_->a.world) remove_tree(ck);
        else unlink(ck);
    }
    printf("resume across plans: %d resumed runs, worst loss error of steps %d-%d %.2e (relative); %d resumed under "
           "the same plan bit for bit\n",
           g_fig_resume.runs, RESUME_AT + 1, RESUME_TO, g_fig_resume.worst_loss, same_plan_exact);
    CHECK(g_fig_resume.runs == (int)(sizeof resumes / sizeof resumes[0]), "%d of %zu resumes ran", g_fig_resume.runs,
          sizeof resumes / sizeof resumes[0]);
}

/* --init reads a distributed checkpoint's weights under another plan: the losses of a run started
 * from it equal those of the one-process run started from its export; --resume under flags the
 * checkpoint was not saved with is refused, naming the flag. */
static void test_init_from_directory(void) {
    int fi = 2; /* vgg */
    const family *f = &families[fi];
    char plan_a[512], plan_b[512], ck[512], one[512], log_a[512], log_b[512], flags[2048], args[4096], out[8192];
    fmt(plan_a, sizeof plan_a, "%s", check_tmp_path("init_a.json"));
    fmt(plan_b, sizeof plan_b, "%s", check_tmp_path("init_b.json"));
    fmt(ck, sizeof ck, "%s", check_tmp_path("init.ckpt"));
    fmt(one, sizeof one, "%s", check_tmp_path("init.safetensors"));
    const side a = {3, "zero", ""}, b = {2, "tp", ""};
    if (side_plan(fi, &a, BATCH, 0, plan_a, "init") || side_plan(fi, &b, BATCH, 0, plan_b, "init")) return;
    common_flags(f, fi, BATCH, RESUME_AT, flags, sizeof flags);
    fmt(args, sizeof args, "%s --plan %s --save %s", flags, plan_a, ck);
    if (run_world(a.world, args, "init: saving under zero on 3 ranks")) return;
    adt_dckpt *c = NULL;
    int rc = adt_dckpt_open(&c, ck);
    if (!rc) rc = adt_dckpt_export(c, one, 0);
    CHECK(rc == ADT_OK, "init: export: %s", adt_error_message());
    adt_dckpt_close(c);
    if (rc) return;
    /* from the export, in one process; from the directory, under tp on 2 ranks */
    fmt(log_a, sizeof log_a, "%s", check_tmp_path("init_one.jsonl"));
    fmt(log_b, sizeof log_b, "%s", check_tmp_path("init_dist.jsonl"));
    common_flags(f, fi, BATCH, STEPS, flags, sizeof flags);
    fmt(args, sizeof args, "%s --init %s --log %s", flags, one, log_a);
    if (run_world(0, args, "init: one process from the export")) return;
    fmt(args, sizeof args, "%s --plan %s --init %s --log %s", flags, plan_b, ck, log_b);
    if (run_world(b.world, args, "init: tp on 2 ranks from the directory")) return;
    double want[STEPS];
    int ne, n = read_losses(log_a, want, STEPS, &ne);
    CHECK(n == STEPS, "init: %d step lines", n);
    double e = n == STEPS ? compare_losses(log_b, 1, STEPS, want, "init: tp on 2 ranks from the directory") : INFINITY;
    CHECK(fabs(want[0] - g_ff[fi].loss[0][0]) > 1e-6 * fabs(want[0]),
          "init: the first loss %.9g equals a fresh run's: the weights were not loaded", want[0]);
    printf("--init from a distributed checkpoint under another plan: worst loss error %.2e (relative)\n", e);
    /* --resume with another --batch is refused, naming it, from the manifest's metadata */
    fmt(args, sizeof args, "train --model '%s' %s --batch %d --schedule constant --seed %llu --steps %d --resume %s",
        g_ff[fi].cfg, f->flags, BATCH + 1, (unsigned long long)(g_seed % 100000), RESUME_TO, ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--resume") && strstr(out, "--batch 7, this one has 8"), "exit %d:\n%s", rc, out);
    unlink(log_a), unlink(log_b), unlink(one), unlink(plan_a), unlink(plan_b);
    remove_tree(ck);
}

/* ---- memory report ----------------------------------------------------------------------------------- */

/* The "end" lines of ADT_MEM_REPORT in `err`: state bytes per rank into state[0..n); returns how
 * many ranks reported, -1 on a malformed line. */
static int mem_states(const char *err, long long *state, int n, long *maxrss) {
    int got = 0;
    for (const char *l = strstr(err, "{\"mem_report\": \"end\""); l; l = strstr(l + 1, "{\"mem_report\": \"end\"")) {
        int rank;
        long rss;
        long long st;
        if (sscanf(l, "{\"mem_report\": \"end\", \"rank\": %d, \"stage\": %*d, \"slots\": %*d, \"maxrss_kib\": %ld, "
                      "\"arena_bytes\": %*d, \"state_bytes\": %lld", &rank, &rss, &st) != 3 || rank < 0 || rank >= n)
            return -1;
        state[rank] = st, maxrss[rank] = rss, got++;
    }
    return got;
}

static void test_mem_report(void) {
    static const int sizes[] = {64, 128, 96, 10};
    long long p = 0; /* parameters: weights and biases */
    for (int i = 0; i + 1 < 4; i++) p += (long long)sizes[i] * sizes[i + 1] + sizes[i + 1];
    char cfg[512], args[2048], out[8192], plan[512];
    fmt(cfg, sizeof cfg, "%s", check_tmp_path("mem-mlp.json"));
    CHECK(write_text(cfg, "{\"type\":\"mlp\",\"sizes\":[64,128,96,10],\"activation\":\"gelu\"}") == 0, "writing %s", cfg);
    long long state[2][2] = {{-1, -1}, {-1, -1}};
    const char *strat[2] = {"dp", "zero"};
    setenv("ADT_MEM_REPORT", "1", 1);
    for (int k = 0; k < 2; k++) {
        fmt(plan, sizeof plan, "%s", check_tmp_path("mem-plan.json"));
        fmt(args, sizeof args, "plan --devices 2 --strategy %s --model %s --batch 8 -o %s", strat[k], cfg, plan);
        int rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "adtrain %s: exit %d\n%s", args, rc, out);
        const char *argv[] = {g_bin, "train", "--model", cfg, "--data", "synthetic:mlp", "--batch", "8", "--steps", "2",
                              "--plan", plan, NULL};
        mpi_world wd = {.n = 2, .argv = argv};
        mpi_run_world(&wd, check_tmpdir(), 120);
        CHECK(wd.status == 0, "%s: mpiexec -n 2 adtrain train: exit %d", strat[k], wd.status);
        if (wd.status) mpi_print_failure(&wd);
        long rss[2] = {0, 0};
        int n = mem_states(wd.err ? wd.err : "", state[k], 2, rss);
        CHECK(n == 2, "%s: %d ranks reported their memory (expected 2):\n%s", strat[k], n, wd.err ? wd.err : "");
        for (int r = 0; r < 2 && n == 2; r++)
            CHECK(rss[r] > 0 && state[k][r] > 0, "%s rank %d: maxrss %ld KiB, state %lld bytes", strat[k], r, rss[r],
                  state[k][r]);
        mpi_world_free(&wd);
        unlink(plan);
    }
    unsetenv("ADT_MEM_REPORT");
    unlink(cfg);
    /* dp: 12 P + F per rank (F: the rank's fed inputs); zero: 12 P + 2 F over both ranks. Each
     * block of the state is aligned to 64 bytes: 3 values per parameter tensor (6 of them) per rank. */
    long long diff = 2 * state[0][0] - state[1][0] - state[1][1], slack = 4LL * 18 * 64;
    CHECK(state[0][0] == state[0][1], "dp: the ranks hold %lld and %lld state bytes, expected the same", state[0][0],
          state[0][1]);
    CHECK(llabs(diff - 12 * p) <= slack, "zero holds %lld + %lld state bytes, dp %lld per rank: the difference %lld, "
          "expected 12 P = %lld (P = %lld) within %lld", state[1][0], state[1][1], state[0][0], diff, 12 * p, p, slack);
    printf("state per rank: dp %lld bytes, zero %lld + %lld; 12 P = %lld\n", state[0][0], state[1][0], state[1][1], 12 * p);
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_seed);
    cli_find_binary();
    if (!mpi_find_mpiexec()) {
        CHECK(0, "no mpiexec found (set $ADT_MPIEXEC)");
        return check_finish();
    }
    if (check_tmpdir_make("dist_e2e")) return 1;
    setenv("ADT_COMM_TIMEOUT", "60", 1); /* a hang ends in 60 s with an error */
    mpi_world_sanitizer_env();
    double t0 = adt_now_s();
    RUN(test_serial);
    RUN(test_expert_plans);
    RUN(test_one_process_microbatches);
    RUN(test_random_plans);
    RUN(test_resume_across_plans);
    RUN(test_init_from_directory);
    RUN(test_mem_report);
    printf("%d distributed runs compared with the serial run; the whole file took %.1f s\n",
           g_fig_expert.runs + g_fig_random.runs + g_fig_resume.runs, adt_now_s() - t0);
    for (int fi = 0; fi < N_FAMILIES; fi++) {
        unlink(g_ff[fi].cfg);
        for (int bi = 0; bi < 2; bi++) {
            unlink(g_ff[fi].serial[bi]);
            free(g_ff[fi].scale_name[bi]);
            free(g_ff[fi].scale[bi]);
            char p[512];
            fmt(p, sizeof p, "%s", g_ff[fi].serial[bi]);
            char *at = strstr(p, "-serial-");
            if (at) {
                fmt(at, sizeof p - (size_t)(at - p), "-serial-%d.safetensors", RESUME_TO);
                unlink(p);
            }
        }
    }
    rmdir(check_tmpdir());
    return check_finish();
}
