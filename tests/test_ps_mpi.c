/*
 * test_ps_mpi.c - the parameter-server mode on real processes over MPI.
 *
 * Run without arguments (as tests/run.sh does), the program launches itself under
 * `mpiexec -n N --child` for N = 4 (2 servers, 2 workers) and N = 5 (2 servers, 3 workers; the
 * global batch of 13 splits unevenly). Every rank runs every case and reports it:
 *   sync_sgd        a DLRM trained 6 steps with SGD (sparse rows on the servers, dense parameters
 *                   all-reduced among workers) gives the one-process DLRM's loss at every step
 *                   within 1e-5 and, on every server, the one-process tables' values on each row
 *                   it holds (each row on the server its hash names);
 *                   After training each worker evaluates batch STEPS on the rows and dense
 *                   parameters the servers hold (adt_ps_dlrm_eval: a lookup outside the clock):
 *                   the reference's forward-only loss on that batch, in every DLRM case;
 *   sync_adagrad    sparse Adagrad, dense SGD, prefetch 1: the parameter-server semantics run on
 *                   one process (tests/ps_ref.h: a local store, its own dedup) step by step;
 *   sync_adam       lazy sparse Adam, dense Adam, prefetch 2: the same;
 *   sync_sgd_dense_servers, sync_adam_dense_servers   the dense parameters kept on the servers
 *                   (whole tables pulled and pushed each step, no all-reduce): the plain DLRM
 *                   (SGD), and the one-process semantics (Adagrad rows, Adam dense), again;
 *   ssp             ssp:2, prefetch 3, an embedding-only quadratic (pull rows, push row - target),
 *                   worker 0 slowed: from every worker's logged times, no worker started a step
 *                   more than 2 ahead of the slowest worker's pushes, the lead did reach 2 (the
 *                   bound held someone back), and the rows converge to their targets;
 *   async           the same quadratic under async with worker 0 slowed: it converges;
 *   silent_worker   a worker that stops talking: the servers fail within their 2 s timeout,
 *                   naming it, instead of waiting forever.
 * The seed comes from $ADT_TEST_SEED, else the time, and is printed; the children get it.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "adtrain/ps.h"
#include "check.h"
#include "cli_run.h"
#include "mpi_world.h"
#include "mpi_cases.h"
#include "ps_ref.h"

#define STEPS 6
#define BATCH 13

static uint64_t g_seed;
static adt_comm *g_world;
static int g_rank, g_size;

static const adt_dlrm_cfg MODEL = {.n_dense = 3, .n_tables = 3, .table_rows = {40, 9, 25}, .emb_dim = 4,
                                   .n_bottom = 2, .bottom = {6, 4}, .n_top = 2, .top = {5, 1}};

static int n_servers(void) { return 2; }

static void nap_s(double s) {
    struct timespec ts = {0, (long)(s * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- DLRM runs ------------------------------------------------------------------------------------ */

typedef struct dlrm_run {
    adt_ps_optim sparse, dense;
    int prefetch;
    int vs_plain; /* compare with the plain DLRM (SGD only), else with ps_ref_local */
    int dense_servers; /* the dense parameters on the servers (adt_ps_tables_dlrm_dense) */
    adt_optim_cfg plain_oc;
} dlrm_run;

static void worker_side(adt_ps_world *pw, const adt_ps_cfg *pc, const dlrm_run *r, const float *ref_loss) {
    int W = pw->n_workers, w = pw->worker, T = MODEL.n_tables;
    int lo = w * BATCH / W, hi = (w + 1) * BATCH / W, Bw = hi - lo;
    float scale = (float)Bw / (float)BATCH;
    adt_ps_worker *wk;
    adt_ps_dlrm *d;
    CHECK(adt_ps_worker_create(&wk, pw, pc) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ps_dlrm_create(&d, &MODEL, Bw, &r->dense, &(adt_exec_opts){.threads = 1, .seed = g_seed}) == ADT_OK,
          "%s", adt_error_message());
    float dense[BATCH * 3], labels[BATCH];
    int32_t ids[BATCH * 3];
    int rc = ADT_OK;
    for (int s = 0; s <= r->prefetch && s < STEPS && !rc; s++) {
        ps_batch(&MODEL, g_seed, s, BATCH, dense, ids, labels);
        rc = adt_ps_worker_pull(wk, s, ids + lo * T, Bw);
    }
    for (int s = 0; s < STEPS && !rc; s++) {
        ps_batch(&MODEL, g_seed, s, BATCH, dense, ids, labels);
        float loss;
        rc = adt_ps_dlrm_step(d, wk, pw->workers, s, dense + lo * MODEL.n_dense, labels + lo, scale, &loss);
        if (rc) break;
        int nx = s + r->prefetch + 1;
        if (nx <= STEPS) { /* step STEPS: pulled for the evaluation after training */
            ps_batch(&MODEL, g_seed, nx, BATCH, dense, ids, labels);
            rc = adt_ps_worker_pull(wk, nx, ids + lo * T, Bw);
        }
        double gl = (double)loss * scale;
        if (!rc) rc = adt_comm_allreduce_f64(pw->workers, &gl, 1);
        CHECK_CLOSE(gl, ref_loss[s], 1e-5, 0);
    }
    /* evaluation after training: pulling step STEPS waits (sync) for every push of the last step,
     * then a lookup reads the trained rows: the reference's forward-only loss on that batch */
    ps_batch(&MODEL, g_seed, STEPS, BATCH, dense, ids, labels);
    float *rows[ADT_PS_MAX_TABLES]; /* the embedding tables' and, dense on servers, the whole tables' */
    for (int t = 0; t < pc->n_tables; t++)
        rows[t] = malloc(sizeof(float) * (size_t)(pc->tables[t].whole ? pc->tables[t].rows * pc->tables[t].dim
                                                                        : Bw * pc->tables[t].dim));
    if (!rc) rc = adt_ps_worker_rows(wk, STEPS, rows);
    float eval_loss = 0;
    if (!rc) rc = adt_ps_dlrm_eval(d, wk, ids + lo * T, dense + lo * MODEL.n_dense, labels + lo, &eval_loss, NULL);
    for (int t = 0; t < pc->n_tables; t++) free(rows[t]);
    double gl = (double)eval_loss * scale;
    if (!rc) rc = adt_comm_allreduce_f64(pw->workers, &gl, 1);
    CHECK_CLOSE(gl, ref_loss[STEPS], 1e-5, 0);
    CHECK(rc == ADT_OK, "worker %d: %s", w, adt_error_message());
    CHECK(adt_ps_worker_done(wk) == ADT_OK, "done: %s", adt_error_message());
    adt_ps_dlrm_free(d);
    adt_ps_worker_free(wk);
}

static void server_side(adt_ps_world *pw, const adt_ps_cfg *pc, const dlrm_run *r, float **ref_tables,
                        adt_ps_store *ref_store) {
    adt_ps_store *st;
    CHECK(adt_ps_store_create(&st, pc->tables, pc->n_tables, &r->sparse, g_seed) == ADT_OK, "%s", adt_error_message());
    adt_ps_server_stats ss;
    int rc = adt_ps_server_run(pw, pc, st, &ss);
    CHECK(rc == ADT_OK, "server %d: %s", pw->server, adt_error_message());
    CHECK(ss.pulls == (int64_t)(STEPS + 1) * pw->n_workers && ss.pushes == (int64_t)STEPS * pw->n_workers,
          "server %d: %lld pulls, %lld pushes",
          pw->server, (long long)ss.pulls, (long long)ss.pushes);
    int held = 0, misplaced = 0, off = 0;
    for (int t = 0; t < MODEL.n_tables; t++)
        for (int id = 0; id < MODEL.table_rows[t]; id++) {
            const float *state;
            const float *w = adt_ps_store_row(st, t, (uint64_t)id, &state);
            if (!w) continue;
            held++;
            misplaced += adt_ps_owner(t, (uint64_t)id, pw->n_servers) != pw->server;
            const float *ref = NULL, *ref_state = NULL;
            if (ref_tables) ref = ref_tables[t] + id * MODEL.emb_dim;
            else ref = adt_ps_store_row(ref_store, t, (uint64_t)id, &ref_state);
            if (!ref || check_max_rel_err(w, ref, MODEL.emb_dim, 1e-2) > 1e-4) {
                if (off++ < 5) fprintf(stderr, "  server %d: table %d row %d differs from the reference\n", pw->server, t, id);
            } else if (ref_state) {
                int k = adt_ps_optim_states(r->sparse.kind) * MODEL.emb_dim;
                if (check_max_rel_err(state, ref_state, k, 1e-2) > 1e-4 && off++ < 5)
                    fprintf(stderr, "  server %d: table %d row %d's state differs\n", pw->server, t, id);
            }
        }
    CHECK(held > 10 && misplaced == 0 && off == 0, "server %d holds %d rows, %d on the wrong server, %d off the "
          "reference", pw->server, held, misplaced, off);
    adt_ps_store_free(st);
}

static void dlrm_case(const dlrm_run *r) {
    adt_ps_world pw;
    CHECK(adt_ps_world_init(&pw, g_world, n_servers()) == ADT_OK, "%s", adt_error_message());
    adt_ps_cfg pc = {.n_servers = n_servers(), .optim = r->sparse, .sync = {ADT_PS_SYNC, 0}, .prefetch = r->prefetch,
                     .seed = g_seed, .timeout_s = 60};
    adt_ps_tables_dlrm(&pc, &MODEL, 0, ADT_PS_REFUSE);
    if (r->dense_servers)
        CHECK(adt_ps_tables_dlrm_dense(&pc, &MODEL, &r->dense) == ADT_OK && pc.n_tables > MODEL.n_tables, "%s",
              adt_error_message());
    /* every rank computes the reference itself: it is small */
    float ref_loss[STEPS + 1], *tables[3] = {0};
    adt_ps_store *ref_store = NULL;
    int rc = r->vs_plain ? ps_ref_dlrm(&MODEL, BATCH, STEPS, g_seed, r->plain_oc, r->sparse.lr, ref_loss, tables)
                         : ps_ref_local(&MODEL, BATCH, STEPS, g_seed, &r->sparse, &r->dense, ref_loss, &ref_store);
    CHECK(rc == 0, "reference: %s", adt_error_message());
    CHECK(ref_loss[STEPS - 1] != ref_loss[0], "the reference's loss never moved");
    if (pw.is_server) server_side(&pw, &pc, r, r->vs_plain ? tables : NULL, ref_store);
    else worker_side(&pw, &pc, r, ref_loss);
    for (int t = 0; t < 3; t++) free(tables[t]);
    adt_ps_store_free(ref_store);
    adt_comm_barrier(g_world);
    adt_ps_world_free(&pw);
}

static void case_sync_sgd(void) {
    dlrm_run r = {.sparse = {ADT_PS_SGD, 1.0f, 0, 0, 0}, .dense = {ADT_PS_SGD, 1.0f, 0, 0, 0}, .prefetch = 1,
                  .vs_plain = 1, .plain_oc = adt_optim_sgd(0, 0)};
    dlrm_case(&r);
}

static void case_sync_sgd_dense_servers(void) {
    dlrm_run r = {.sparse = {ADT_PS_SGD, 1.0f, 0, 0, 0}, .dense = {ADT_PS_SGD, 1.0f, 0, 0, 0}, .prefetch = 1,
                  .vs_plain = 1, .plain_oc = adt_optim_sgd(0, 0), .dense_servers = 1};
    dlrm_case(&r);
}

static void case_sync_adam_dense_servers(void) {
    dlrm_run r = {.sparse = {ADT_PS_ADAGRAD, 0.1f, 0, 0, 1e-2f}, .dense = {ADT_PS_ADAM, 0.01f, 0.9f, 0.999f, 1e-2f},
                  .prefetch = 2, .dense_servers = 1};
    dlrm_case(&r);
}

static void case_sync_adagrad(void) {
    /* eps large beside the gradients: Adagrad's first step is lr g / (|g| + eps), a sign for
     * eps << |g|, which a gradient summed in another order near 0 can flip */
    dlrm_run r = {.sparse = {ADT_PS_ADAGRAD, 0.1f, 0, 0, 1e-2f}, .dense = {ADT_PS_SGD, 0.1f, 0, 0, 0}, .prefetch = 1};
    dlrm_case(&r);
}

static void case_sync_adam(void) {
    dlrm_run r = {.sparse = {ADT_PS_ADAM, 0.01f, 0.9f, 0.999f, 1e-2f}, .dense = {ADT_PS_ADAM, 0.01f, 0.9f, 0.999f, 1e-2f},
                  .prefetch = 2};
    dlrm_case(&r);
}

/* ---- the quadratic: rows pulled toward per-row targets ------------------------------------------- */

#define Q_ROWS 64
#define Q_DIM 2
#define Q_BATCH 8
#define Q_STEPS 80

static float q_target(uint64_t id, int j) { return (float)((id * 7 + (uint64_t)j * 3) % 11) / 10.0f - 0.5f; }

/* Runs the quadratic under `sync`; workers log the time each step started and was pushed. */
static void quadratic_case(adt_ps_sync sync, int prefetch) {
    adt_ps_world pw;
    CHECK(adt_ps_world_init(&pw, g_world, n_servers()) == ADT_OK, "%s", adt_error_message());
    adt_ps_cfg pc = {.n_servers = n_servers(), .n_tables = 1, .optim = {ADT_PS_SGD, 0.3f, 0, 0, 0}, .sync = sync,
                     .prefetch = prefetch, .seed = g_seed, .timeout_s = 60};
    pc.tables[0] = (adt_ps_table){.name = "q", .dim = Q_DIM, .rows = Q_ROWS, .init_lo = -1, .init_hi = 1,
                                  .capacity = Q_ROWS, .full = ADT_PS_REFUSE};
    int K = sync.kind == ADT_PS_SSP ? sync.staleness : -1;
    if (pw.is_server) {
        adt_ps_store *st;
        adt_ps_store_create(&st, pc.tables, 1, &pc.optim, g_seed);
        adt_ps_server_stats ss;
        CHECK(adt_ps_server_run(&pw, &pc, st, &ss) == ADT_OK, "server: %s", adt_error_message());
        if (K >= 0) CHECK(ss.max_lead <= K, "server %d answered a pull %lld steps ahead of the slowest, bound %d",
                          pw.server, (long long)ss.max_lead, K);
        double worst = 0, sq = 0, sq0 = 0;
        int held = 0;
        for (uint64_t id = 0; id < Q_ROWS; id++) {
            const float *w = adt_ps_store_row(st, 0, id, NULL);
            if (!w) continue;
            held++;
            uint64_t key = adt_rng_key(g_seed, "q");
            for (int j = 0; j < Q_DIM; j++) {
                double e = w[j] - q_target(id, j), e0 = -1 + 2 * adt_rng_uniform(key, id * Q_DIM + (uint64_t)j) -
                                                        q_target(id, j);
                worst = fmax(worst, fabs(e));
                sq += e * e, sq0 += e0 * e0;
            }
        }
        /* stale pushes (a row pulled before others moved it) keep async noisier than ssp */
        double rms = sqrt(sq / (held * Q_DIM + 1e-9)), rms0 = sqrt(sq0 / (held * Q_DIM + 1e-9));
        CHECK(held > 10 && worst < (K >= 0 ? 1e-2 : 5e-2) && rms < rms0 / 50, "server %d: %d rows, farthest from its "
              "target by %.3g, rms %.3g from %.3g at the start", pw.server, held, worst, rms, rms0);
        fprintf(stderr, "quadratic %s: server %d: %d rows, farthest from its target by %.3g, rms %.3g (start %.3g), "
                "largest lead served %lld\n", K >= 0 ? "ssp" : "async", pw.server, held, worst, rms, rms0,
                (long long)ss.max_lead);
        adt_ps_store_free(st);
    } else {
        int W = pw.n_workers, w = pw.worker;
        adt_ps_worker *wk;
        CHECK(adt_ps_worker_create(&wk, &pw, &pc) == ADT_OK, "%s", adt_error_message());
        int32_t ids[Q_STEPS][Q_BATCH];
        for (int s = 0; s < Q_STEPS; s++) /* distinct rows per step and worker: the gradient is row - target */
            for (int b = 0; b < Q_BATCH; b++) ids[s][b] = (int32_t)((s * 13 + w * 29 + b * 8) % Q_ROWS);
        double *t_start = calloc(Q_STEPS, sizeof(double)), *t_push = calloc(Q_STEPS, sizeof(double));
        float rows[Q_BATCH * Q_DIM], grads[Q_BATCH * Q_DIM];
        float *rp[1] = {rows};
        const float *gp[1] = {grads};
        int rc = ADT_OK;
        for (int s = 0; s <= prefetch && !rc; s++) rc = adt_ps_worker_pull(wk, s, ids[s], Q_BATCH);
        for (int s = 0; s < Q_STEPS && !rc; s++) {
            if ((rc = adt_ps_worker_rows(wk, s, rp))) break;
            t_start[s] = adt_now_s();
            if (w == 0) nap_s(0.004); /* the slow worker */
            for (int b = 0; b < Q_BATCH; b++)
                for (int j = 0; j < Q_DIM; j++)
                    grads[b * Q_DIM + j] = rows[b * Q_DIM + j] - q_target((uint64_t)ids[s][b], j);
            t_push[s] = adt_now_s();
            if ((rc = adt_ps_worker_push(wk, s, gp))) break;
            if (s + prefetch + 1 < Q_STEPS) rc = adt_ps_worker_pull(wk, s + prefetch + 1, ids[s + prefetch + 1], Q_BATCH);
        }
        CHECK(rc == ADT_OK, "worker %d: %s", w, adt_error_message());
        CHECK(adt_ps_worker_done(wk) == ADT_OK, "done: %s", adt_error_message());
        adt_ps_worker_free(wk);
        /* every worker's times, on this one machine's monotonic clock */
        double *all_start = calloc((size_t)(W * Q_STEPS), sizeof(double)), *all_push = calloc((size_t)(W * Q_STEPS), sizeof(double));
        /* f64 through an all-reduce of disjoint blocks (the gather helpers are f32) */
        memcpy(all_start + w * Q_STEPS, t_start, Q_STEPS * sizeof(double));
        memcpy(all_push + w * Q_STEPS, t_push, Q_STEPS * sizeof(double));
        adt_comm_allreduce_f64(pw.workers, all_start, W * Q_STEPS);
        adt_comm_allreduce_f64(pw.workers, all_push, W * Q_STEPS);
        /* the lead of worker v at the start of step s: s minus the fewest steps any worker had
         * pushed by then (pushes sent by then bound from above what any server had seen) */
        int64_t lead_max = 0;
        for (int v = 0; v < W; v++)
            for (int s = 0; s < Q_STEPS; s++) {
                double t = all_start[v * Q_STEPS + s];
                int64_t slowest = Q_STEPS;
                for (int u = 0; u < W; u++) {
                    int64_t n = 0;
                    while (n < Q_STEPS && all_push[u * Q_STEPS + n] < t) n++;
                    if (n < slowest) slowest = n;
                }
                if (s - slowest > lead_max) lead_max = s - slowest;
            }
        if (K >= 0) {
            CHECK(lead_max <= K, "a worker started a step %lld ahead of the slowest worker's pushes, bound %d",
                  (long long)lead_max, K);
            CHECK(lead_max == K, "the lead reached only %lld of the bound %d: the bound never held", (long long)lead_max, K);
        } else {
            CHECK(lead_max > 2, "async: the fast workers led by %lld steps at most, expected more than 2",
                  (long long)lead_max);
        }
        free(all_start), free(all_push), free(t_start), free(t_push);
    }
    adt_comm_barrier(g_world);
    adt_ps_world_free(&pw);
}

static void case_ssp(void) { quadratic_case((adt_ps_sync){ADT_PS_SSP, 2}, 3); }
static void case_async(void) { quadratic_case((adt_ps_sync){ADT_PS_ASYNC, 0}, 2); }

/* A worker that says nothing: worker 0 never pulls, and sends its done only after the servers
 * gave up on it. */
static void case_silent_worker(void) {
    adt_ps_world pw;
    CHECK(adt_ps_world_init(&pw, g_world, n_servers()) == ADT_OK, "%s", adt_error_message());
    adt_ps_cfg pc = {.n_servers = n_servers(), .n_tables = 1, .optim = {ADT_PS_SGD, 0.3f, 0, 0, 0},
                     .sync = {ADT_PS_SYNC, 0}, .seed = g_seed, .timeout_s = 2};
    pc.tables[0] = (adt_ps_table){.name = "q", .dim = 2, .rows = 8, .init_lo = -1, .init_hi = 1, .capacity = 8};
    if (pw.is_server) {
        adt_ps_store *st;
        adt_ps_store_create(&st, pc.tables, 1, &pc.optim, g_seed);
        double t0 = adt_now_s();
        int rc = adt_ps_server_run(&pw, &pc, st, NULL);
        double secs = adt_now_s() - t0;
        CHECK(rc == ADT_ERR_COMM && strstr(adt_error_message(), "nothing from worker 0") &&
              strstr(adt_error_message(), "2 s"), "server: rc %d: %s", rc, adt_error_message());
        CHECK(secs >= 1.9 && secs < 10, "the server gave up after %.1f s, expected about 2", secs);
        adt_ps_store_free(st);
    } else {
        adt_ps_worker *wk;
        adt_ps_worker_create(&wk, &pw, &pc);
        if (pw.worker == 0) {
            nap_s(0.999);
            nap_s(0.999);
            nap_s(0.999);
        } else {
            /* the others' pull of step 1 waits for worker 0 forever: their own deadline ends it */
            int32_t id[1] = {1};
            float row[2], *rp[1] = {row};
            const float *gp[1] = {row};
            adt_ps_worker_pull(wk, 0, id, 1);
            adt_ps_worker_rows(wk, 0, rp);
            adt_ps_worker_push(wk, 0, gp);
            adt_ps_worker_pull(wk, 1, id, 1);
            double t0 = adt_now_s();
            int rc = adt_ps_worker_rows(wk, 1, rp);
            CHECK(rc == ADT_ERR_COMM && strstr(adt_error_message(), "step 1") && adt_now_s() - t0 < 10,
                  "worker %d: rc %d: %s", pw.worker, rc, adt_error_message());
        }
        adt_ps_worker_free(wk);
    }
    /* the protocol's communicator holds unanswered messages: it is dropped, the world goes on */
    adt_comm_barrier(g_world);
    adt_ps_world_free(&pw);
}

static const mpi_case CASES[] = {
    {"sync_sgd", case_sync_sgd}, {"sync_adagrad", case_sync_adagrad}, {"sync_adam", case_sync_adam},
    {"ssp", case_ssp},           {"async", case_async},               {"silent_worker", case_silent_worker},
    {"sync_sgd_dense_servers", case_sync_sgd_dense_servers},
    {"sync_adam_dense_servers", case_sync_adam_dense_servers},
};
#define N_CASES (int)(sizeof CASES / sizeof *CASES)

static int child_main(void) {
    if (!(g_world = mpi_child_world())) return 1;
    g_rank = adt_comm_rank(g_world);
    g_size = adt_comm_size(g_world);
    return mpi_child_cases(g_world, CASES, N_CASES);
}

int main(int argc, char **argv) {
    int code;
    if (mpi_test_start(argc, argv, "ps_mpi", &g_seed, child_main, &code)) return code;
    mpi_test_worlds(CASES, N_CASES, 4, 5, 240);
    rmdir(check_tmpdir());
    return check_finish();
}
