/*
 * test_dist_mpi.c - partitioned training on real processes over MPI, against the serial run.
 *
 * Run without arguments (as tests/run.sh does), the program launches itself under
 * `mpiexec -n N --child` for N = 2, 3, 4 (4 ranks on 2 cores is fine for MPICH). Every rank of a
 * world runs the same cases and prints one line per case; a case passes when every rank passed
 * it and the world exited cleanly:
 *   boxing_steps  every boxing program between every pair of nd-SBP states of a few tensors
 *                 (uneven blocks, f32 and i32) on meshes (N) and, for N = 4, (2,2), run step by
 *                 step through adt_mesh_comm_step on each rank's own block, equals
 *                 adt_boxing_run_virtual bit for bit (values are small integers, so sums are
 *                 exact in any order);
 *   dp_<family>   the data-parallel expert plan of a tiny GPT (with dropout), an MLP, a small
 *                 VGG and a small DLRM, run with collectives overlapped (split schedule) and
 *                 again run where they stand (comm_sync), gives the serial run's loss at every
 *                 one of 5 steps within 1e-5 relative and the same parameters and optimizer
 *                 state at the end within float tolerance; its only communication is one
 *                 all-reduce per gradient, done in place in the gradient's buffer;
 *   random_<family>  two random plans per world (any usable n-D signature per node, as in
 *                 tests/test_dist_partition.c; on (N), and for N = 4 one on (2,2)) the same, one
 *                 with collectives overlapped and one blocking;
 *   overlap       the split schedule of a data-parallel MLP starts gradient all-reduces during
 *                 the backward pass and waits for each just before the update that reads it,
 *                 and the executor's communication counters add up;
 *   mesh_mismatch a mesh with more devices than the world has ranks is refused, naming both;
 *   expert_<family>  the other expert plans the world allows: dp with ZeRO, Megatron tensor
 *                 parallelism, and on 4 ranks dp x tp on a (2,2) mesh, with and without ZeRO.
 * Then, in this process: `mpiexec -n 2 adtrain train` logs the losses (and validation loss and
 * accuracy) of the 1-process run for a GPT and an MLP, data parallel by default and under plan
 * files `adtrain plan` wrote (tensor parallel, ZeRO), prints its progress once; a plan for another
 * number of devices is refused; and a flag that
 * only rank 0 trips (an unwritable --log), or a failure of rank 0 while training (an unwritable
 * --save), ends both ranks promptly with the error.
 *
 * The batch (7) is uneven over 2, 3 and 4 ranks. The seed comes from $ADT_TEST_SEED, else the
 * time, and is printed; the children get it through the environment.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "cli_run.h"
#include "mpi_world.h"
#include "serial_ref.h"
#include "train_log.h"
#include "mpi_cases.h"

#define STEPS 5
#define BATCH 7
#define LOSS_TOL 1e-5
#define STATE_TOL 2e-5

static uint64_t g_seed;
static uint64_t g_ctr;
static adt_comm *g_world;
static int g_rank, g_size;

/* The same on every rank of a world (same seed, same calls); worlds of other sizes draw other plans. */
static int irand(int lo, int hi) {
    return lo + (int)(adt_rng_u32(g_seed * 31u + (uint64_t)g_size, g_ctr++) % (uint32_t)(hi - lo + 1));
}

/* ---- model families ------------------------------------------------------------------------ */

typedef struct family {
    const char *name;
    adt_model_cfg cfg;
    adt_graph *g;
    adt_model_io io;
    int id_hi;        /* i32 input values lie in [0, id_hi) */
    int label_hi;     /* i32 labels in [0, label_hi); 0: f32 labels of 0 or 1 */
} family;

static void family_build(family *f, const char *name) {
    memset(f, 0, sizeof *f);
    f->name = name;
    f->g = adt_graph_create();
    adt_model_cfg *c = &f->cfg;
    adt_optim_cfg oc;
    if (!strcmp(name, "gpt")) {
        c->type = ADT_MODEL_GPT;
        c->gpt = (adt_gpt_cfg){.vocab_size = 11, .n_ctx = 5, .n_layer = 1, .n_embd = 12, .n_head = 2, .dropout = 0.1f};
        f->id_hi = f->label_hi = 11;
        /* a large eps keeps AdamW's step linear in small gradients, whose rounding differs by layout */
        oc = adt_optim_adamw(0.9f, 0.95f, 1e-2f, 0.01f);
    } else if (!strcmp(name, "mlp") || !strcmp(name, "wide")) {
        /* wide: messages above the eager limit, which MPI reads and writes long after the start */
        int wide = !strcmp(name, "wide");
        c->type = ADT_MODEL_MLP;
        c->mlp = wide ? (adt_mlp_cfg){.n_sizes = 4, .sizes = {64, 384, 384, 8}, .activation = ADT_ACT_RELU}
                      : (adt_mlp_cfg){.n_sizes = 4, .sizes = {9, 16, 12, 5}, .activation = ADT_ACT_GELU};
        f->label_hi = wide ? 8 : 5;
        oc = adt_optim_sgd(0.9f, wide ? 0.0f : 0.01f);
    } else if (!strcmp(name, "vgg")) {
        c->type = ADT_MODEL_VGG;
        c->vgg = (adt_vgg_cfg){.in_channels = 2, .height = 6, .width = 6, .n_blocks = 2, .n_convs = {1, 1},
                               .channels = {{4}, {6}}, .n_fc = 1, .fc = {8}, .classes = 3};
        f->label_hi = 3;
        oc = adt_optim_sgd(0.9f, 0.0f);
    } else {
        c->type = ADT_MODEL_DLRM;
        c->dlrm = (adt_dlrm_cfg){.n_dense = 3, .n_tables = 2, .table_rows = {5, 7}, .emb_dim = 4, .n_bottom = 2,
                                 .bottom = {6, 4}, .n_top = 2, .top = {5, 1}};
        f->id_hi = 5;
        oc = adt_optim_adamw(0.9f, 0.95f, 1e-2f, 0.0f);
    }
    adt_model_build(f->g, c, BATCH, &f->io);
    adt_graph_backward(f->g, f->io.loss);
    adt_graph_optimizer(f->g, &oc);
}

/* An expert plan (src/dist/expert.c) of a strategy for this world's ranks. */
static int expert_plan(const family *f, const char *strategy, adt_plan *p) {
    adt_expert_opts eo = {.strategy = strategy, .devices = g_size, .batch = BATCH};
    return adt_expert_plan(f->g, &f->cfg, &eo, p);
}

/* Global data of fed value v at a step: a pure function of (seed, step, name), so every rank
 * makes the same batch. */
static void feed_global(const family *f, int v, int step, void *buf) {
    const adt_value *val = &f->g->values[v];
    uint64_t key = adt_rng_key(g_seed + (uint64_t)step * 7919u, val->name);
    int64_t n = adt_shape_numel(&val->shape);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = adt_rng_u32(key, (uint64_t)i);
        if (val->dtype == ADT_I32) ((int32_t *)buf)[i] = (int32_t)(u % (uint32_t)(v == f->io.label ? f->label_hi : f->id_hi));
        else if (v == f->io.label) ((float *)buf)[i] = (float)(u & 1);
        else ((float *)buf)[i] = 2.0f * adt_rng_uniform(key, (uint64_t)i) - 1.0f;
    }
}

/* ---- the serial reference (serial_ref.h) ----------------------------------------------------- */

static const float LR = 0.05f;

static void feed_cb(void *ctx, const adt_graph *g, int v, int step, void *buf) { feed_global(ctx, v, step, buf); }

static int serial_run(const family *f, reference *ref) {
    return serial_ref_run(f->g, STEPS, LR, g_seed, feed_cb, (void *)f, ref);
}

static void reference_free(const family *f, reference *ref) { serial_ref_free(f->g, ref); }

/* ---- a distributed run -------------------------------------------------------------------------- */

typedef struct run_info {
    int n_boxing, n_allreduce_of_grads;
    int n_inplace; /* all-reduces whose output shares its input's buffer */
    adt_exec_stats stats;
    char *schedule;
    double worst_loss, worst_state;
} run_info;

/* Runs STEPS steps of plan p over MPI and compares with the reference; 0 when it ran. */
static int dist_run(const family *f, adt_mesh_comm *mc, const adt_dist_plan *p, int sync, const reference *ref,
                    const char *what, run_info *info) {
    const adt_graph *g = f->g;
    memset(info, 0, sizeof *info);
    adt_dist_local loc;
    int rc = adt_dist_partition(g, p, adt_mesh_comm_coord(mc), &loc);
    CHECK(rc == ADT_OK, "%s: partition: %s", what, adt_error_message());
    if (rc) return -1;
    info->n_boxing = loc.n_boxing;
    for (int i = 0; i < loc.g->n_nodes; i++) {
        const adt_node *n = &loc.g->nodes[i];
        if (n->op == ADT_OP_BOXING && (n->a.i[0] & 0xff) == ADT_BOXING_ALL_REDUCE &&
            loc.g->values[n->in[0]].role == ADT_ROLE_GRAD)
            info->n_allreduce_of_grads++;
    }
    adt_exec *ex = NULL;
    adt_exec_opts o = {.threads = 1, .seed = g_seed, .comm = adt_mesh_comm_hook(mc, loc.g), .comm_sync = sync};
    rc = adt_exec_create(&ex, loc.g, &o);
    CHECK(rc == ADT_OK, "%s: executor: %s", what, adt_error_message());
    if (rc) {
        adt_mesh_comm_release(mc, loc.g);
        adt_dist_local_free(&loc);
        return -1;
    }
    adt_exec_init_params(ex);
    const adt_memplan *mp = adt_exec_memplan(ex);
    adt_memplan ahead; /* what a planner is told this executor will hold */
    CHECK(adt_exec_plan_memory(loc.g, &o, &ahead) == ADT_OK, "%s: plan memory: %s", what, adt_error_message());
    int same = ahead.arena_bytes == mp->arena_bytes && ahead.state_bytes == mp->state_bytes &&
               ahead.scratch_bytes == mp->scratch_bytes && ahead.accum_bytes == mp->accum_bytes &&
               ahead.n_values == mp->n_values;
    for (int v = 0; same && v < mp->n_values; v++) same = ahead.offset[v] == mp->offset[v] && ahead.root[v] == mp->root[v];
    CHECK(same, "%s: adt_exec_plan_memory (arena %lld) differs from the executor's plan (arena %lld)", what,
          (long long)ahead.arena_bytes, (long long)mp->arena_bytes);
    adt_memplan_free(&ahead);
    for (int i = 0; i < loc.g->n_nodes; i++) {
        const adt_node *n = &loc.g->nodes[i];
        info->n_inplace += n->op == ADT_OP_BOXING && mp->root[n->out[0]] == mp->root[n->in[0]];
    }
    const adt_mesh *m = adt_mesh_comm_mesh(mc);
    const int *coord = adt_mesh_comm_coord(mc);
    int64_t big = 1;
    for (int v = 0; v < g->n_values; v++)
        if (adt_value_numel(g, v) > big) big = adt_value_numel(g, v);
    float *full = malloc((size_t)big * sizeof *full);
    for (int step = 1; step <= STEPS && !rc; step++) {
        adt_exec_set_lr_step(ex, LR, step);
        for (int v = 0; v < g->n_values; v++) {
            if (!serial_is_data(g, v)) continue;
            feed_global(f, v, step, full);
            adt_box all = {.global = g->values[v].shape, .shape = g->values[v].shape};
            adt_box b = adt_ndsbp_block(&loc.layout[v], m, coord, g->values[v].shape);
            adt_box_transfer(adt_exec_data(ex, loc.value[v]), &b, full, &all, 4, 0);
        }
        rc = adt_exec_run(ex);
        CHECK(rc == ADT_OK, "%s, step %d: %s", what, step, adt_error_message());
        if (rc) break;
        float loss = 0;
        rc = adt_mesh_comm_gather(mc, &loc.layout[g->loss], g->values[g->loss].shape, ADT_F32,
                                  adt_exec_data(ex, loc.value[g->loss]), &loss);
        CHECK(rc == ADT_OK, "%s: gathering the loss: %s", what, adt_error_message());
        double e = fabs(loss - ref->loss[step - 1]) / fabs(ref->loss[step - 1]);
        CHECK(e <= LOSS_TOL, "%s, step %d: loss %.9g, serial %.9g (relative error %.3g; seed %llu)", what, step, loss,
              ref->loss[step - 1], e, (unsigned long long)g_seed);
        if (!(e <= info->worst_loss)) info->worst_loss = e;
    }
    for (int v = 0; v < g->n_values && !rc; v++) {
        if (!ref->state[v]) continue;
        rc = adt_mesh_comm_gather(mc, &loc.layout[v], g->values[v].shape, ADT_F32, adt_exec_data(ex, loc.value[v]),
                                  full);
        CHECK(rc == ADT_OK, "%s: gathering %s: %s", what, g->values[v].name, adt_error_message());
        double e = check_scaled_err_floor(full, ref->state[v], adt_value_numel(g, v), ref->scale[v]);
        char lay[64];
        CHECK(e <= STATE_TOL, "%s: '%s' (%s) after %d steps differs from the serial run by %.3g (seed %llu)", what,
              g->values[v].name, adt_ndsbp_str(&loc.layout[v], lay, sizeof lay), STEPS, e, (unsigned long long)g_seed);
        if (!(e <= info->worst_state)) info->worst_state = e;
    }
    adt_exec_get_stats(ex, &info->stats, NULL);
    info->schedule = adt_exec_schedule_str(ex);
    free(full);
    adt_exec_free(ex);
    adt_mesh_comm_release(mc, loc.g);
    adt_dist_local_free(&loc);
    return rc ? -1 : 0;
}

/* A plan with a random usable signature per node. */
static adt_nd_sig *random_plan(const adt_graph *g, const adt_mesh *m) {
    adt_nd_sig *sig = calloc((size_t)g->n_nodes, sizeof *sig);
    for (int i = 0; i < g->n_nodes; i++) {
        int n = adt_node_nd_sigs(g, i, m, NULL, 0);
        adt_nd_sig *all = calloc((size_t)n, sizeof *all);
        adt_node_nd_sigs(g, i, m, all, n);
        sig[i] = all[irand(0, n - 1)];
        free(all);
    }
    return sig;
}

static adt_mesh_comm *mesh_comm_1d(void) {
    adt_mesh m;
    adt_mesh_init(&m, 1, &g_size);
    adt_mesh_comm *mc = NULL;
    int rc = adt_mesh_comm_create(&mc, g_world, &m);
    CHECK(rc == ADT_OK, "mesh comm (%d): %s", g_size, adt_error_message());
    return mc;
}

/* ---- cases ------------------------------------------------------------------------------------ */

/* Runs the expert plan of `strategy` overlapped (and blocking too when both is set); returns the
 * boxing nodes of the last run, -1 when the strategy does not apply to this model and world. */
static int run_expert(const family *f, const reference *ref, const char *strategy, int both, run_info *last) {
    adt_plan p;
    if (expert_plan(f, strategy, &p)) return -1;
    int ranks[64], n = -1;
    adt_dist_plan d = adt_plan_dist(&p, 0, ranks);
    adt_mesh_comm *mc = NULL;
    int rc = adt_mesh_comm_create(&mc, g_world, &d.mesh);
    CHECK(rc == ADT_OK, "%s: mesh comm: %s", strategy, adt_error_message());
    for (int sync = 0; sync <= both && !rc; sync++) {
        char what[128], mb[32];
        snprintf(what, sizeof what, "%s, %s on mesh %s, %s", f->name, strategy, adt_mesh_str(&d.mesh, mb, sizeof mb),
                 sync ? "blocking" : "overlapped");
        run_info ri;
        if (dist_run(f, mc, &d, sync, ref, what, &ri)) break;
        if (g_rank == 0)
            fprintf(stderr, "%s: %d boxing nodes, worst loss error %.2e, state %.2e\n", what, ri.n_boxing, ri.worst_loss,
                    ri.worst_state);
        free(last->schedule);
        *last = ri;
        n = ri.n_boxing;
    }
    adt_mesh_comm_free(mc);
    adt_plan_free(&p);
    return n;
}

static void case_dp(const char *name) {
    family f;
    family_build(&f, name);
    CHECK(!adt_graph_error(f.g), "%s: %s", name, adt_graph_error_message(f.g));
    reference ref = {0};
    if (!serial_run(&f, &ref)) {
        int n_grads = 0;
        for (int v = 0; v < f.g->n_values; v++) n_grads += f.g->values[v].role == ADT_ROLE_PARAM && f.g->values[v].grad >= 0;
        run_info ri = {0};
        int n = run_expert(&f, &ref, "dp", 1, &ri);
        CHECK(n >= 0, "%s: no data-parallel plan over %d ranks: %s", name, g_size, adt_error_message());
        if (n >= 0) {
            /* data parallelism: gradients all-reduced in their own buffers, nothing else moves */
            CHECK(ri.n_boxing == n_grads && ri.n_allreduce_of_grads == n_grads,
                  "%s: %d boxing nodes, %d of them gradient all-reduces; expected one per gradient (%d)", name,
                  ri.n_boxing, ri.n_allreduce_of_grads, n_grads);
            CHECK(ri.n_inplace == n_grads, "%s: %d of %d gradient all-reduces in place", name, ri.n_inplace, n_grads);
            CHECK(ri.stats.comm_ops == ri.n_boxing, "%s: %lld collectives in the last run, %d boxing nodes", name,
                  (long long)ri.stats.comm_ops, ri.n_boxing);
            CHECK(ri.stats.comm_flight_s > 0 && ri.stats.comm_wait_s >= 0 && ri.stats.comm_wait_s <= ri.stats.run_s,
                  "%s: in flight %.3g s, blocked %.3g s, run %.3g s", name, ri.stats.comm_flight_s,
                  ri.stats.comm_wait_s, ri.stats.run_s);
        }
        free(ri.schedule);
    }
    reference_free(&f, &ref);
    adt_graph_free(f.g);
}

/* The other expert strategies a world of this size allows (ZeRO, Megatron tensor parallelism,
 * both axes on 4 ranks), with collectives overlapped. */
static void case_expert(const char *name) {
    family f;
    family_build(&f, name);
    reference ref = {0};
    if (!serial_run(&f, &ref)) {
        const char *strategies[] = {"dp,zero", "tp", g_size == 4 ? "dp=2,tp=2" : NULL, g_size == 4 ? "dp=2,tp=2,zero" : NULL};
        int ran = 0;
        for (size_t k = 0; k < sizeof strategies / sizeof *strategies; k++) {
            if (!strategies[k]) continue;
            run_info ri = {0};
            if (run_expert(&f, &ref, strategies[k], 0, &ri) >= 0) ran++;
            else if (g_rank == 0) fprintf(stderr, "%s, %s over %d ranks: not applicable: %s\n", name, strategies[k], g_size,
                                          adt_error_message());
            free(ri.schedule);
        }
        CHECK(ran > 0, "%s: no expert strategy applied over %d ranks", name, g_size);
    }
    reference_free(&f, &ref);
    adt_graph_free(f.g);
}

static void case_random(const char *name) {
    family f;
    family_build(&f, name);
    reference ref = {0};
    if (serial_run(&f, &ref)) {
        CHECK(0, "%s: serial run", name);
        adt_graph_free(f.g);
        return;
    }
    /* two plans per world: on (N), and on (2,2) for the second plan of a 4-rank world */
    for (int k = 0; k < 2; k++) {
        adt_mesh m;
        if (g_size == 4 && k == 1) adt_mesh_init(&m, 2, (int[]){2, 2});
        else adt_mesh_init(&m, 1, &g_size);
        adt_mesh_comm *mc = NULL;
        int rc = adt_mesh_comm_create(&mc, g_world, &m);
        CHECK(rc == ADT_OK, "mesh comm: %s", adt_error_message());
        if (rc) break;
        adt_nd_sig *sig = random_plan(f.g, &m);
        adt_dist_plan p = {.mesh = m, .node_sig = sig, .cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12}};
        char what[128], mb[32];
        int sync = g_size == 4 ? k == 0 : k == 1; /* every mesh shape meets both schedules */
        snprintf(what, sizeof what, "%s, random plan %d on mesh %s (%s)", name, k, adt_mesh_str(&m, mb, sizeof mb),
                 sync ? "blocking" : "overlapped");
        run_info ri;
        if (!dist_run(&f, mc, &p, sync, &ref, what, &ri)) {
            if (g_rank == 0)
                fprintf(stderr, "%s: %d boxing nodes, worst loss error %.2e, state %.2e\n", what, ri.n_boxing,
                        ri.worst_loss, ri.worst_state);
            free(ri.schedule);
        }
        free(sig);
        adt_mesh_comm_free(mc);
    }
    reference_free(&f, &ref);
    adt_graph_free(f.g);
}

/* Random plans of an MLP with wide layers, collectives overlapped: only messages this large stay
 * in flight across nodes, so only they show a buffer reused before its collective's wait. */
static void case_random_wide(void) {
    family f;
    family_build(&f, "wide");
    reference ref = {0};
    adt_mesh_comm *mc = mesh_comm_1d();
    if (mc && !serial_run(&f, &ref))
        for (int k = 0; k < 3; k++) {
            adt_nd_sig *sig = random_plan(f.g, adt_mesh_comm_mesh(mc));
            adt_dist_plan p = {.mesh = *adt_mesh_comm_mesh(mc), .node_sig = sig,
                               .cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12}};
            char what[96];
            snprintf(what, sizeof what, "wide mlp, random plan %d over %d ranks (overlapped)", k, g_size);
            run_info ri;
            if (!dist_run(&f, mc, &p, 0, &ref, what, &ri)) free(ri.schedule);
            free(sig);
        }
    reference_free(&f, &ref);
    adt_mesh_comm_free(mc);
    adt_graph_free(f.g);
}

static void case_expert_gpt(void) { case_expert("gpt"); }
static void case_expert_mlp(void) { case_expert("mlp"); }
static void case_expert_vgg(void) { case_expert("vgg"); }
static void case_expert_dlrm(void) { case_expert("dlrm"); }
static void case_dp_gpt(void) { case_dp("gpt"); }
static void case_dp_mlp(void) { case_dp("mlp"); }
static void case_dp_vgg(void) { case_dp("vgg"); }
static void case_dp_dlrm(void) { case_dp("dlrm"); }
static void case_random_gpt(void) { case_random("gpt"); }
static void case_random_mlp(void) { case_random("mlp"); }
static void case_random_vgg(void) { case_random("vgg"); }
static void case_random_dlrm(void) { case_random("dlrm"); }

/* Part of the value of element e (global index) that the rank at position r holds in a state
 * with P mask pm: small integers, the group leader's making up the difference, so any summation
 * order is exact. */
static int32_t part_value(const adt_mesh *m, unsigned pm, int r, int64_t e) {
    int32_t whole = (int32_t)(adt_rng_u32(g_seed, (uint64_t)e) % 61) - 30;
    if (!pm) return whole;
    int c[ADT_MAX_MESH_DIMS], q[ADT_MAX_MESH_DIMS];
    adt_mesh_coord(m, r, c);
    int leader = 1;
    for (int a = 0; a < m->ndim; a++) leader &= !(pm >> a & 1) || c[a] == 0;
    int32_t own = (int32_t)(adt_rng_u32(g_seed + 1 + (uint64_t)r, (uint64_t)e) % 21) - 10;
    if (!leader) return own;
    int32_t rest = 0; /* the others in the group: same coordinates off the P axes */
    for (int s = 0; s < m->nranks; s++) {
        adt_mesh_coord(m, s, q);
        int same = s != r;
        for (int a = 0; a < m->ndim && same; a++) same = (pm >> a & 1) || q[a] == c[a];
        if (same) rest += (int32_t)(adt_rng_u32(g_seed + 1 + (uint64_t)s, (uint64_t)e) % 21) - 10;
    }
    return whole - rest;
}

static void fill_block(const adt_mesh *m, const adt_ndsbp *s, int r, adt_shape global, adt_dtype dt, void *buf) {
    int c[ADT_MAX_MESH_DIMS];
    adt_mesh_coord(m, r, c);
    adt_box b = adt_ndsbp_block(s, m, c, global);
    unsigned pm = adt_ndsbp_partial_mask(s);
    int64_t n = adt_shape_numel(&b.shape);
    for (int64_t i = 0; i < n; i++) {
        int64_t gi = 0, stride = 1, li = i;
        for (int d = b.shape.ndim - 1; d >= 0; d--) {
            gi += (li % b.shape.dim[d] + b.offset[d]) * stride;
            li /= b.shape.dim[d];
            stride *= global.dim[d];
        }
        int32_t x = part_value(m, pm, r, gi);
        if (dt == ADT_I32) ((int32_t *)buf)[i] = x;
        else ((float *)buf)[i] = (float)x;
    }
}

/* Every state of a tensor of rank `rank` on m (P only for f32), by number. */
static int state_of(int idx, int rank, const adt_mesh *m, adt_dtype dt, adt_ndsbp *s) {
    int base = rank + (dt == ADT_F32 ? 2 : 1);
    *s = adt_ndsbp_all_b(m->ndim);
    for (int a = m->ndim - 1; a >= 0; a--) {
        int k = idx % base;
        idx /= base;
        s->s[a] = k == 0 ? (adt_sbp){ADT_SBP_B, 0} : k == 1 && dt == ADT_F32 ? (adt_sbp){ADT_SBP_P, 0}
                                                                       : (adt_sbp){ADT_SBP_S, (int8_t)(k - (dt == ADT_F32 ? 2 : 1))};
    }
    return idx == 0;
}

static void case_boxing_steps(void) {
    static const struct { int ndim; int64_t dim[3]; adt_dtype dt; } tensors[] = {
        {2, {5, 6}, ADT_F32}, {3, {4, 5, 6}, ADT_F32}, {2, {7, 4}, ADT_I32}};
    int kinds[ADT_BOXING_KIND_COUNT] = {0}, programs = 0, mismatches = 0;
    adt_comm_cost cost = {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12};
    for (int mi = 0; mi < (g_size == 4 ? 2 : 1); mi++) {
        adt_mesh m;
        if (mi == 1) adt_mesh_init(&m, 2, (int[]){2, 2});
        else adt_mesh_init(&m, 1, &g_size);
        adt_mesh_comm *mc = NULL;
        if (adt_mesh_comm_create(&mc, g_world, &m)) {
            CHECK(0, "mesh comm: %s", adt_error_message());
            return;
        }
        for (size_t t = 0; t < sizeof tensors / sizeof *tensors; t++) {
            adt_shape gs = {.ndim = tensors[t].ndim};
            for (int d = 0; d < gs.ndim; d++) gs.dim[d] = tensors[t].dim[d];
            adt_dtype dt = tensors[t].dt;
            int base = gs.ndim + (dt == ADT_F32 ? 2 : 1), n_states = 1;
            for (int a = 0; a < m.ndim; a++) n_states *= base;
            for (int si = 0; si < n_states; si++)
                for (int ti = 0; ti < n_states; ti++) {
                    adt_ndsbp from, to;
                    state_of(si, gs.ndim, &m, dt, &from);
                    state_of(ti, gs.ndim, &m, dt, &to);
                    adt_boxing_prog prog;
                    if (!adt_ndsbp_fits(&from, &m, gs) || !adt_ndsbp_fits(&to, &m, gs) ||
                        adt_boxing_plan(&m, gs, dt, &from, &to, &cost, &prog))
                        continue;
                    /* the reference: every rank's blocks in memory */
                    void **bufs = calloc((size_t)m.nranks, sizeof *bufs);
                    for (int r = 0; r < m.nranks; r++) {
                        int c[ADT_MAX_MESH_DIMS];
                        adt_mesh_coord(&m, r, c);
                        adt_box b = adt_ndsbp_block(&from, &m, c, gs);
                        bufs[r] = malloc((size_t)adt_shape_numel(&b.shape) * 4);
                        fill_block(&m, &from, r, gs, dt, bufs[r]);
                    }
                    int me = adt_mesh_index(&m, adt_mesh_comm_coord(mc));
                    adt_box mine = adt_ndsbp_block(&from, &m, adt_mesh_comm_coord(mc), gs);
                    size_t nmine = (size_t)adt_shape_numel(&mine.shape);
                    void *cur = malloc(nmine * 4);
                    memcpy(cur, bufs[me], nmine * 4);
                    int rc = adt_boxing_run_virtual(&prog, &m, bufs);
                    for (int s = 0; s < prog.n_steps && !rc; s++) {
                        adt_box ob = adt_ndsbp_block(&prog.step[s].to, &m, adt_mesh_comm_coord(mc), gs);
                        void *next = malloc((size_t)adt_shape_numel(&ob.shape) * 4);
                        rc = adt_mesh_comm_step(mc, &prog.step[s], gs, dt, cur, next);
                        free(cur);
                        cur = next;
                        kinds[prog.step[s].kind]++;
                    }
                    char a[64], b[64];
                    CHECK(rc == ADT_OK, "%s -> %s: %s", adt_ndsbp_str(&from, a, sizeof a), adt_ndsbp_str(&to, b, sizeof b),
                          adt_error_message());
                    adt_box outb = adt_ndsbp_block(&to, &m, adt_mesh_comm_coord(mc), gs);
                    size_t nout = (size_t)adt_shape_numel(&outb.shape);
                    if (!rc && memcmp(cur, bufs[me], nout * 4)) {
                        if (mismatches++ < 5)
                            CHECK(0, "rank %d: %s -> %s of %s on a %d-axis mesh differs from the in-memory reference",
                                  g_rank, adt_ndsbp_str(&from, a, sizeof a), adt_ndsbp_str(&to, b, sizeof b),
                                  adt_dtype_name(dt), m.ndim);
                    }
                    programs++;
                    free(cur);
                    for (int r = 0; r < m.nranks; r++) free(bufs[r]);
                    free(bufs);
                }
        }
        adt_mesh_comm_free(mc);
    }
    CHECK(mismatches == 0, "%d programs differ", mismatches);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) CHECK(kinds[k] > 0, "no program ran a %s step", adt_boxing_kind_name(k));
    if (g_rank == 0) {
        fprintf(stderr, "boxing over %d ranks: %d programs, steps by kind:", g_size, programs);
        for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) fprintf(stderr, " %s %d", adt_boxing_kind_name(k), kinds[k]);
        fprintf(stderr, "\n");
    }
}

/* The split schedule of a data-parallel MLP: starts inside the backward pass, waits right before
 * the update that reads the result. */
static void case_overlap(void) {
    family f;
    family_build(&f, "mlp");
    reference ref = {0};
    adt_mesh_comm *mc = mesh_comm_1d();
    adt_plan xp;
    if (!mc || serial_run(&f, &ref) || expert_plan(&f, "dp", &xp)) {
        CHECK(0, "setup: %s", adt_error_message());
    } else {
        int ranks[64];
        adt_dist_plan p = adt_plan_dist(&xp, 0, ranks);
        run_info ri;
        if (!dist_run(&f, mc, &p, 0, &ref, "overlap", &ri)) {
            CHECK(ri.schedule != NULL, "the executor did not split its collectives");
            /* walk the schedule: a start followed later by a backward run; each wait followed by
             * the run of an update */
            adt_dist_local loc;
            adt_dist_partition(f.g, &p, adt_mesh_comm_coord(mc), &loc);
            int starts = 0, early = 0, waits = 0, wait_then_update = 0, pending_wait = 0;
            for (const char *l = ri.schedule; l && *l;) {
                char kind[8];
                int node = -1;
                sscanf(l, "%7s %d", kind, &node);
                const adt_node *n = node >= 0 && node < loc.g->n_nodes ? &loc.g->nodes[node] : NULL;
                if (!strcmp(kind, "start")) starts++;
                if (!strcmp(kind, "run") && n && n->is_backward && starts) early = 1;
                if (!strcmp(kind, "wait")) waits++, pending_wait = 1;
                else if (!strcmp(kind, "run") && pending_wait) wait_then_update += n && n->is_optimizer, pending_wait = 0;
                l = strchr(l, '\n');
                l = l ? l + 1 : NULL;
            }
            CHECK(starts == loc.n_boxing && waits == loc.n_boxing, "%d starts, %d waits, %d boxing nodes", starts, waits,
                  loc.n_boxing);
            CHECK(early, "no all-reduce started before the backward pass ended:\n%s", ri.schedule);
            CHECK(wait_then_update > 0, "no wait is followed by the update that reads it:\n%s", ri.schedule);
            CHECK(ri.stats.comm_ops == loc.n_boxing && ri.stats.runs == 1, "stats of the last run: %lld ops, %lld runs",
                  (long long)ri.stats.comm_ops, (long long)ri.stats.runs);
            CHECK(ri.stats.run_s > 0 && ri.stats.comm_flight_s > 0 && ri.stats.comm_start_s > 0,
                  "times: run %.3g, flight %.3g, start %.3g", ri.stats.run_s, ri.stats.comm_flight_s,
                  ri.stats.comm_start_s);
            adt_dist_local_free(&loc);
            free(ri.schedule);
        }
        adt_plan_free(&xp);
    }
    reference_free(&f, &ref);
    adt_mesh_comm_free(mc);
    adt_graph_free(f.g);
}

/* A mesh of another size than the world is refused before any communication, naming both. */
static void case_mesh_mismatch(void) {
    adt_mesh m;
    int n = g_size + 1;
    adt_mesh_init(&m, 1, &n);
    adt_mesh_comm *mc = (adt_mesh_comm *)&mc;
    int rc = adt_mesh_comm_create(&mc, g_world, &m);
    char want[128];
    snprintf(want, sizeof want, "mesh (%d) has %d devices, but the world (world) has %d ranks", n, n, g_size);
    CHECK(rc == ADT_ERR_ARG && mc == NULL && strstr(adt_error_message(), want), "rc %d: %s", rc, adt_error_message());
}

static const mpi_case CASES[] = {
    {"boxing_steps", case_boxing_steps}, {"dp_gpt", case_dp_gpt},         {"dp_mlp", case_dp_mlp},
    {"dp_vgg", case_dp_vgg},             {"dp_dlrm", case_dp_dlrm},       {"random_gpt", case_random_gpt},
    {"random_mlp", case_random_mlp},     {"random_vgg", case_random_vgg}, {"random_dlrm", case_random_dlrm},
    {"random_wide", case_random_wide},   {"overlap", case_overlap},       {"mesh_mismatch", case_mesh_mismatch},
    {"expert_gpt", case_expert_gpt},     {"expert_mlp", case_expert_mlp}, {"expert_vgg", case_expert_vgg},
    {"expert_dlrm", case_expert_dlrm},
};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static int child_main(void) {
    if (!(g_world = mpi_child_world())) return 1;
    g_rank = adt_comm_rank(g_world);
    g_size = adt_comm_size(g_world);
    return mpi_child_cases(g_world, CASES, N_CASES);
}

/* ---- the parent ------------------------------------------------------------------------------- */

static const double WORLD_LIMIT_S = 300;

static void test_worlds(void) { mpi_test_worlds(CASES, N_CASES, 2, 4, WORLD_LIMIT_S); }

/* `mpiexec -n 2 adtrain train` against `adtrain train` on one process; with plan_flags, under a
 * plan file `adtrain plan <plan_flags>` wrote. */
static void cli_compare(const char *label, const char *model_json, const char *flags, const char *plan_flags) {
    const char *says[] = {"model  ", "done:", "dist   2 ranks", plan_flags ? "plan.json (" : NULL, NULL};
    train_compare(label, 2, model_json, flags, plan_flags, says);
}

static void test_cli_train_dp(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *gpt = "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":16,\"n_layer\":1,\"n_embd\":16,\"n_head\":2,"
                      "\"dropout\":0.1}\n";
    const char *mlp = "{\"type\":\"mlp\",\"sizes\":[16,24,4],\"activation\":\"relu\"}\n";
    const char *gpt_flags = "--data synthetic:text --steps 8 --batch 5 --lr 3e-3 --eval-every 4 --eval-batches 2 --seed 11";
    const char *mlp_flags = "--data synthetic:mlp --steps 8 --batch 9 --optimizer sgd --momentum 0.9 --lr 0.1 "
                            "--eval-every 4 --eval-batches 3 --seed 5";
    cli_compare("gpt", gpt, gpt_flags, NULL);
    cli_compare("mlp", mlp, mlp_flags, NULL);
    /* plan files: Megatron tensor parallelism, and ZeRO */
    cli_compare("gpt, tp plan file", gpt, gpt_flags, "--strategy tp --batch 5");
    cli_compare("mlp, zero plan file", mlp, mlp_flags, "--strategy dp,zero --batch 9 --optimizer sgd-momentum");
}

/* A check that only rank 0 makes (opening --log) fails there, or rank 0 fails while training
 * (writing --save): both ranks must end, quickly, with the error printed once. */
static void test_cli_one_rank_fails(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *argv[] = {g_bin, "train", "--data", "synthetic:mlp", "--model", "configs/mlp-mnist.json", "--steps", "2",
                          "--log", "/nonexistent-dir/x.jsonl", NULL};
    mpi_world wd = {.n = 2, .argv = argv};
    mpi_run_world(&wd, check_tmpdir(), 60);
    CHECK(wd.status == 2, "exit status %d, expected 2 (a bad flag)", wd.status);
    CHECK(wd.secs < 30, "took %.1f s to end", wd.secs);
    CHECK(count_of(wd.err, "--log: cannot open '/nonexistent-dir/x.jsonl'") == 1, "the error, once:\n%s", wd.err);
    mpi_world_free(&wd);
    /* a failure while training (rank 0 cannot write --save) ends every rank */
    const char *argv3[] = {g_bin, "train", "--data", "synthetic:mlp", "--model", "configs/mlp-mnist.json", "--steps", "2",
                           "--batch", "4", "--save", "/dev/null/ckpt", NULL};
    mpi_world w3 = {.n = 2, .argv = argv3};
    mpi_run_world(&w3, check_tmpdir(), 60);
    CHECK(w3.status == 1, "exit status %d, expected 1 (a failure while training)", w3.status);
    CHECK(w3.secs < 30, "took %.1f s to end", w3.secs);
    CHECK(count_of(w3.err, "--save:") == 1, "the error, once:\n%s", w3.err);
    mpi_world_free(&w3);
    /* a plan for 4 devices under 2 ranks: a clear refusal on every rank, printed once */
    char planp[512], args[1024], out[8192];
    snprintf(planp, sizeof planp, "%s", check_tmp_path("plan4.json"));
    snprintf(args, sizeof args, "plan --devices 4 --strategy dp --model configs/mlp-mnist.json --batch 4 -o '%s'", planp);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "adtrain %s: exit %d:\n%s", args, rc, out);
    const char *argv2[] = {g_bin, "train", "--data", "synthetic:mlp", "--model", "configs/mlp-mnist.json", "--steps", "2",
                           "--batch", "4", "--plan", planp, NULL};
    mpi_world w2 = {.n = 2, .argv = argv2};
    mpi_run_world(&w2, check_tmpdir(), 60);
    CHECK(w2.status == 2 && count_of(w2.err, "has 4 devices, but 2 ranks were started; expected mpiexec -n 4") == 1,
          "exit %d:\n%s", w2.status, w2.err);
    mpi_world_free(&w2);
    unlink(planp);
}

int main(int argc, char **argv) {
    int code;
    if (mpi_test_start(argc, argv, "dist_mpi", &g_seed, child_main, &code)) return code;
    RUN(test_worlds);
    RUN(test_cli_train_dp);
    RUN(test_cli_one_rank_fails);
    rmdir(check_tmpdir());
    return check_finish();
}
