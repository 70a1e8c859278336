/*
 * test_ps.c - the parameter-server mode's parts on one process:
 *   sync_parse     sync / ssp:K / async flags, and refusals naming the flag;
 *   clock          the staleness clock's rule case by case, and a random schedule of workers of
 *                  random speeds (each may start step s only when the clock serves it): no worker
 *                  ever runs more than K steps ahead of the slowest, the bound is reached, and the
 *                  run never stalls; pushes out of order are refused;
 *   dispatch       dynamic sharding's dispatcher under random requests from workers of random
 *                  speeds: every chunk handed out exactly once, in index order, each worker's
 *                  count its share, -1 once all are out (and for a rank that is no worker);
 *                  a negative total or no worker refused;
 *   store_init     rows created on first touch hold the one-process executor's initial values of
 *                  emb.<t>.weight (same seed), ids beyond a declared table refused;
 *   store_random   10^5 random pulls and pushes with evictions against a naive model (a list in
 *                  touch order): the same rows present, the same contents, the same LRU victims;
 *   capacity       refuse: a clear error at the capacity; evict: the least recently touched row
 *                  goes, comes back at its initial value, rows of the current step are never
 *                  evicted (an error when one step needs more rows than the capacity);
 *   optim_<kind>   SGD, Adagrad and lazy Adam on the store against a dense one-process table
 *                  updated in double precision (all rows for SGD and Adagrad, whose zero gradient
 *                  leaves a row unchanged; the touched rows for lazy Adam); untouched rows keep
 *                  their bits; lazy Adam differs from dense Adam (the semantics is real);
 *   store_lr       a schedule's rate (adt_ps_store_set_lr): SGD steps of exactly that rate on the
 *                  store's tables, of the table's own rate scaled by it on a table with its own
 *                  optimizer, the optimizer's own again after set_lr(0); the clock's start;
 *   save_load      a shard saved and loaded equals the original (rows, state, eviction order);
 *                  a file of another optimizer or table set is refused;
 *   dlrm_ps_graph  the DLRM with fed rows gives the plain DLRM's loss, and its row gradients
 *                  summed per id equal the plain table gradient;
 *   local_sgd      the parameter-server semantics on one process (store + worker graph) trains
 *                  the plain DLRM's losses and tables with SGD, step by step;
 *   refusals       too few ranks for --ps-servers, an unknown sparse optimizer, a bad table or
 *                  learning rate, Adagrad for dense parameters: each refused with a clear error.
 */
#include <math.h>
#include <stdint.h>

#include "adtrain/adtrain.h"
#include "adtrain/ps.h"
#include "check.h"
#include "ps_ref.h"

static uint64_t g_seed = 12345;

/* ---- consistency -------------------------------------------------------------------------------- */

static void test_sync_parse(void) {
    adt_ps_sync s;
    char b[32];
    CHECK(adt_ps_sync_parse("sync", "--ps-sync", &s) == ADT_OK && s.kind == ADT_PS_SYNC, "sync");
    CHECK(adt_ps_sync_parse("ssp:3", "--ps-sync", &s) == ADT_OK && s.kind == ADT_PS_SSP && s.staleness == 3, "ssp:3");
    CHECK(!strcmp(adt_ps_sync_str(s, b, sizeof b), "ssp:3"), "%s", b);
    CHECK(adt_ps_sync_parse("async", "--ps-sync", &s) == ADT_OK && s.kind == ADT_PS_ASYNC, "async");
    const char *bad[] = {"ssp:0", "ssp:", "ssp:x", "ssp:2x", "Sync", "", "ssp:-1"};
    for (int i = 0; i < (int)(sizeof bad / sizeof *bad); i++) {
        CHECK(adt_ps_sync_parse(bad[i], "--ps-sync", &s) == ADT_ERR_ARG, "'%s' accepted", bad[i]);
        CHECK(strstr(adt_error_message(), "--ps-sync") && strstr(adt_error_message(), "ssp:K"), "%s",
              adt_error_message());
    }
}

static void test_clock(void) {
    adt_ps_clock c;
    /* sync: the pull of step 1 waits for every push of step 0 */
    adt_ps_clock_init(&c, 3, (adt_ps_sync){ADT_PS_SYNC, 0});
    CHECK(adt_ps_clock_may_serve(&c, 0) && !adt_ps_clock_may_serve(&c, 1), "sync at start");
    adt_ps_clock_push(&c, 0, 0), adt_ps_clock_push(&c, 2, 0);
    CHECK(!adt_ps_clock_may_serve(&c, 1) && !adt_ps_clock_step_gathered(&c, 0), "sync with one push missing");
    adt_ps_clock_push(&c, 1, 0);
    CHECK(adt_ps_clock_may_serve(&c, 1) && adt_ps_clock_step_gathered(&c, 0) && !adt_ps_clock_may_serve(&c, 2),
          "sync after every push of step 0");
    CHECK(adt_ps_clock_push(&c, 1, 5) == ADT_ERR_STATE && strstr(adt_error_message(), "expected step 1"), "%s",
          adt_error_message());
    CHECK(adt_ps_clock_push(&c, 1, 0) == ADT_ERR_STATE, "a step pushed twice");
    CHECK(adt_ps_clock_push(&c, 3, 1) == ADT_ERR_STATE, "an unknown worker");
    /* a worker that leaves holds nobody back */
    adt_ps_clock_push(&c, 0, 1), adt_ps_clock_push(&c, 1, 1);
    CHECK(!adt_ps_clock_may_serve(&c, 2), "worker 2 behind");
    adt_ps_clock_leave(&c, 2);
    CHECK(adt_ps_clock_may_serve(&c, 2) && adt_ps_clock_step_gathered(&c, 1), "after worker 2 left");
    adt_ps_clock_free(&c);
    /* async serves anything */
    adt_ps_clock_init(&c, 2, (adt_ps_sync){ADT_PS_ASYNC, 0});
    CHECK(adt_ps_clock_may_serve(&c, 1000), "async");
    adt_ps_clock_free(&c);
    CHECK(adt_ps_clock_init(&c, 2, (adt_ps_sync){ADT_PS_SSP, 0}) == ADT_ERR_ARG, "ssp:0 refused");

    /* a random schedule: each tick one random worker tries to advance; it may start step s only
     * when the clock serves s, and pushes s when it finishes */
    for (int K = 0; K <= 4; K++) {
        int W = 4;
        adt_ps_clock_init(&c, W, K ? (adt_ps_sync){ADT_PS_SSP, K} : (adt_ps_sync){ADT_PS_SYNC, 0});
        int64_t running[4] = {0, 0, 0, 0}; /* the step each works on */
        int64_t worst = 0, stalls = 0;
        for (int tick = 0; tick < 20000; tick++) {
            /* worker 0 is 5x slower than the others */
            uint32_t u = adt_rng_u32(g_seed + (uint64_t)K, (uint64_t)tick);
            int w = (int)(u % 16u) < 1 ? 0 : 1 + (int)(u % 3u);
            if (!adt_ps_clock_may_serve(&c, running[w])) {
                stalls++;
                continue;
            }
            int64_t lead = running[w] - adt_ps_clock_min(&c);
            if (lead > worst) worst = lead;
            CHECK(adt_ps_clock_push(&c, w, running[w]) == ADT_OK, "push");
            running[w]++;
        }
        int64_t lo = adt_ps_clock_min(&c);
        CHECK(worst == K, "K=%d: the largest lead was %lld, expected exactly the bound", K, (long long)worst);
        CHECK(lo > 500, "K=%d: the slowest worker made %lld steps: the schedule stalled", K, (long long)lo);
        for (int w = 0; w < W; w++) CHECK(running[w] - lo <= K + 1, "K=%d worker %d at %lld, slowest %lld", K, w,
                                         (long long)running[w], (long long)lo);
        CHECK(stalls > 0, "K=%d: the bound never held anyone back", K);
        adt_ps_clock_free(&c);
    }
}

/* ---- the store ------------------------------------------------------------------------------------ */

static adt_ps_table table(const char *name, int dim, int64_t rows, int64_t cap, adt_ps_full_rule full) {
    adt_ps_table t = {.dim = dim, .rows = rows, .init_lo = -0.5f, .init_hi = 0.5f, .capacity = cap, .full = full};
    snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

static const adt_dlrm_cfg SMALL = {.n_dense = 3, .n_tables = 2, .table_rows = {5, 7}, .emb_dim = 4, .n_bottom = 2,
                                   .bottom = {6, 4}, .n_top = 2, .top = {5, 1}};

static void test_dispatch(void) {
    enum { W = 4, TOTAL = 1000 };
    adt_ps_dispatch d;
    CHECK(adt_ps_dispatch_init(&d, -1, W) == ADT_ERR_ARG, "a negative total");
    CHECK(adt_ps_dispatch_init(&d, 10, 0) == ADT_ERR_ARG, "no worker");
    CHECK(adt_ps_dispatch_init(&d, TOTAL, W) == ADT_OK, "init");
    int seen[TOTAL] = {0};
    int64_t mine[W] = {0}, expect_next = 0;
    int in_order = 1, tick = 0;
    /* worker w asks with probability (w + 1) / W at each tick: the fast take more */
    for (int64_t got = 0; got >= 0; tick++) {
        int w = (int)(adt_rng_u32(g_seed ^ 0xd15, (uint64_t)tick) % W);
        if (adt_rng_u32(g_seed ^ 0xd16, (uint64_t)tick) % W > (uint32_t)w) continue;
        got = adt_ps_dispatch_next(&d, w);
        if (got < 0) break;
        in_order &= got == expect_next++;
        if (got < TOTAL) seen[got]++;
        mine[w]++;
    }
    int once = 1;
    for (int c = 0; c < TOTAL; c++) once &= seen[c] == 1;
    CHECK(once && in_order, "every chunk once (%d) and in index order (%d)", once, in_order);
    int64_t sum = 0;
    for (int w = 0; w < W; w++) {
        CHECK(d.taken[w] == mine[w], "worker %d: the dispatcher counts %lld, it got %lld", w, (long long)d.taken[w],
              (long long)mine[w]);
        sum += mine[w];
    }
    CHECK(sum == TOTAL && mine[W - 1] > mine[0], "shares %lld .. %lld of %lld", (long long)mine[0],
          (long long)mine[W - 1], (long long)sum);
    CHECK(adt_ps_dispatch_next(&d, 2) == -1 && adt_ps_dispatch_next(&d, 0) == -1, "-1 once every chunk is out");
    adt_ps_dispatch_free(&d);
    CHECK(adt_ps_dispatch_init(&d, 3, 2) == ADT_OK, "init");
    CHECK(adt_ps_dispatch_next(&d, 2) == -1 && adt_ps_dispatch_next(&d, -1) == -1 && d.next == 0,
          "a rank that is no worker gets nothing and takes nothing");
    adt_ps_dispatch_free(&d);
}

static void test_store_init(void) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    adt_model_dlrm(g, &SMALL, 2, &io);
    adt_exec *ex;
    CHECK(adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = g_seed}) == ADT_OK, "exec");
    adt_exec_init_params(ex);
    adt_ps_cfg pc = {0};
    adt_ps_tables_dlrm(&pc, &SMALL, 0, ADT_PS_REFUSE);
    adt_ps_store *st;
    adt_ps_optim o = {ADT_PS_SGD, 0.1f, 0, 0, 0};
    CHECK(adt_ps_store_create(&st, pc.tables, pc.n_tables, &o, g_seed) == ADT_OK, "%s", adt_error_message());
    for (int t = 0; t < 2; t++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        const float *ref = adt_exec_f32(ex, name);
        for (int r = SMALL.table_rows[t] - 1; r >= 0; r--) {
            float row[4];
            CHECK(adt_ps_store_pull(st, t, (uint64_t[]){(uint64_t)r}, 1, row, 0) == ADT_OK, "%s", adt_error_message());
            CHECK(!memcmp(row, ref + r * 4, sizeof row), "table %d row %d differs from the executor's", t, r);
        }
    }
    float row[4];
    CHECK(adt_ps_store_pull(st, 1, (uint64_t[]){7}, 1, row, 0) == ADT_ERR_ARG &&
          strstr(adt_error_message(), "emb.1.weight") && strstr(adt_error_message(), "[0, 7)"), "%s",
          adt_error_message());
    CHECK(adt_ps_store_pull(st, 2, (uint64_t[]){0}, 1, row, 0) == ADT_ERR_ARG, "table 2 of 2");
    adt_ps_store_free(st);
    adt_exec_free(ex);
    adt_graph_free(g);
}

/* The naive model: rows in touch order (least recent first), each with its weights. */
typedef struct naive {
    int n;
    uint64_t id[64];
    float w[64][3];
} naive;

static int naive_find(const naive *m, uint64_t id) {
    for (int i = 0; i < m->n; i++)
        if (m->id[i] == id) return i;
    return -1;
}

static void naive_touch(naive *m, int i) { /* to the most recent end */
    uint64_t id = m->id[i];
    float w[3];
    memcpy(w, m->w[i], sizeof w);
    memmove(&m->id[i], &m->id[i + 1], sizeof(uint64_t) * (size_t)(m->n - i - 1));
    memmove(&m->w[i], &m->w[i + 1], sizeof w * (size_t)(m->n - i - 1));
    m->id[m->n - 1] = id;
    memcpy(m->w[m->n - 1], w, sizeof w);
}

static void test_store_random(void) {
    const int CAP = 48, DIM = 3;
    adt_ps_table tb = table("t", DIM, 0, CAP, ADT_PS_EVICT);
    adt_ps_optim o = {ADT_PS_SGD, 0.5f, 0, 0, 0};
    adt_ps_store *st;
    CHECK(adt_ps_store_create(&st, &tb, 1, &o, g_seed) == ADT_OK, "%s", adt_error_message());
    naive m = {0};
    uint64_t key = adt_rng_key(g_seed, "t");
    int64_t evictions = 0, bad = 0;
    for (int op = 0; op < 100000; op++) {
        uint32_t u = adt_rng_u32(g_seed, (uint64_t)op);
        /* ids spread over a space twice the capacity, with far-apart values that share hash slots */
        uint64_t id = (uint64_t)(u % 96u) * 0x100000001ull + (u % 3u == 0 ? (1ull << 40) : 0);
        int push = (u >> 20) & 1;
        float g[3] = {(float)((u >> 8) % 7) - 3.0f, 1.0f, -0.5f};
        int i = naive_find(&m, id);
        if (i < 0) {
            if (m.n == CAP) { /* evict the least recent */
                memmove(&m.id[0], &m.id[1], sizeof(uint64_t) * (size_t)(CAP - 1));
                memmove(&m.w[0], &m.w[1], sizeof m.w[0] * (size_t)(CAP - 1));
                m.n--;
                evictions++;
            }
            i = m.n++;
            m.id[i] = id;
            for (int j = 0; j < DIM; j++) m.w[i][j] = -0.5f + 1.0f * adt_rng_uniform(key, id * 3 + (uint64_t)j);
        }
        naive_touch(&m, i);
        float *w = m.w[m.n - 1];
        float row[3];
        int rc = push ? adt_ps_store_push(st, 0, &id, 1, g, op + 1, op) : adt_ps_store_pull(st, 0, &id, 1, row, op);
        CHECK(rc == ADT_OK, "op %d: %s", op, adt_error_message());
        if (push)
            for (int j = 0; j < DIM; j++) w[j] = fmaf(g[j], -0.5f, w[j]);
        else
            bad += memcmp(row, w, sizeof row) != 0;
    }
    CHECK(bad == 0, "%lld pulls differ from the model", (long long)bad);
    adt_ps_store_stats ss;
    adt_ps_store_get_stats(st, 0, &ss);
    CHECK(ss.rows == m.n && ss.evicted == evictions && evictions > 1000, "rows %lld (model %d), evicted %lld (model "
          "%lld)", (long long)ss.rows, m.n, (long long)ss.evicted, (long long)evictions);
    int missing = 0;
    for (int i = 0; i < m.n; i++) {
        const float *w = adt_ps_store_row(st, 0, m.id[i], NULL);
        missing += !w || memcmp(w, m.w[i], sizeof m.w[i]);
    }
    CHECK(missing == 0, "%d rows of the model absent or different in the store", missing);
    adt_ps_store_free(st);
}

static void test_capacity(void) {
    adt_ps_optim o = {ADT_PS_SGD, 1.0f, 0, 0, 0};
    adt_ps_store *st;
    float row[2];
    /* refuse */
    adt_ps_table tr = table("refusing", 2, 0, 3, ADT_PS_REFUSE);
    adt_ps_store_create(&st, &tr, 1, &o, g_seed);
    uint64_t ids[3] = {10, 20, 30};
    float rows[6];
    CHECK(adt_ps_store_pull(st, 0, ids, 3, rows, 0) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ps_store_pull(st, 0, (uint64_t[]){40}, 1, row, 1) == ADT_ERR_ARG &&
          strstr(adt_error_message(), "refusing") && strstr(adt_error_message(), "capacity of 3 rows"), "%s",
          adt_error_message());
    CHECK(adt_ps_store_pull(st, 0, (uint64_t[]){20}, 1, row, 1) == ADT_OK, "a present row still pulls");
    adt_ps_store_free(st);
    /* evict: least recently touched first */
    adt_ps_table te = table("evicting", 2, 0, 3, ADT_PS_EVICT);
    adt_ps_store_create(&st, &te, 1, &o, g_seed);
    float init10[2];
    adt_ps_store_pull(st, 0, (uint64_t[]){10}, 1, init10, 0);
    adt_ps_store_pull(st, 0, (uint64_t[]){20}, 1, row, 1);
    adt_ps_store_pull(st, 0, (uint64_t[]){30}, 1, row, 2);
    adt_ps_store_push(st, 0, (uint64_t[]){10}, 1, (float[]){1, 1}, 1, 3); /* 10 touched last: 20 is oldest */
    CHECK(adt_ps_store_pull(st, 0, (uint64_t[]){40}, 1, row, 4) == ADT_OK, "%s", adt_error_message());
    CHECK(!adt_ps_store_row(st, 0, 20, NULL) && adt_ps_store_row(st, 0, 10, NULL) && adt_ps_store_row(st, 0, 30, NULL),
          "row 20 (least recent) should have gone");
    const float *w10 = adt_ps_store_row(st, 0, 10, NULL);
    CHECK(w10 && w10[0] == init10[0] - 1.0f, "row 10 kept its update");
    /* 30 is now oldest; evicted by 50, then 10 by 60; 10 comes back at its initial value */
    adt_ps_store_pull(st, 0, (uint64_t[]){50}, 1, row, 5);
    adt_ps_store_pull(st, 0, (uint64_t[]){60}, 1, row, 6);
    CHECK(!adt_ps_store_row(st, 0, 30, NULL) && !adt_ps_store_row(st, 0, 10, NULL), "30 then 10 evicted");
    adt_ps_store_pull(st, 0, (uint64_t[]){10}, 1, row, 7);
    CHECK(!memcmp(row, init10, sizeof row), "an evicted row returns at its initial value");
    /* a step that touches more rows than the capacity */
    uint64_t many[4] = {100, 101, 102, 103};
    float r4[8];
    CHECK(adt_ps_store_pull(st, 0, many, 4, r4, 8) == ADT_ERR_ARG && strstr(adt_error_message(), "step 8") &&
          strstr(adt_error_message(), "capacity 3"), "%s", adt_error_message());
    adt_ps_store_stats ss;
    adt_ps_store_get_stats(st, 0, &ss);
    CHECK(ss.rows == 3, "rows %lld", (long long)ss.rows);
    adt_ps_store_free(st);
}

/* ---- optimizers against a dense table ------------------------------------------------------------ */

static void optim_case(adt_ps_optim_kind kind) {
    const int R = 40, D = 5, STEPS = 12;
    adt_ps_optim o = {kind, kind == ADT_PS_SGD ? 0.3f : 0.05f, 0.9f, 0.99f, 1e-6f};
    adt_ps_table tb = table("emb", D, R, R, ADT_PS_REFUSE);
    adt_ps_store *st;
    CHECK(adt_ps_store_create(&st, &tb, 1, &o, g_seed) == ADT_OK, "%s", adt_error_message());
    /* the dense reference in double: w, m, v (or s) for every row */
    double *w = calloc((size_t)(R * D), sizeof *w), *m = calloc((size_t)(R * D), sizeof *m),
           *v = calloc((size_t)(R * D), sizeof *v), *dense_w = calloc((size_t)(R * D), sizeof *w),
           *dm = calloc((size_t)(R * D), sizeof *m), *dv = calloc((size_t)(R * D), sizeof *v);
    float *init = malloc(sizeof(float) * (size_t)(R * D));
    uint64_t all[40];
    for (int r = 0; r < R; r++) all[r] = (uint64_t)r;
    adt_ps_store_pull(st, 0, all, R, init, -1);
    for (int i = 0; i < R * D; i++) w[i] = dense_w[i] = init[i];
    float *g = malloc(sizeof(float) * (size_t)(R * D));
    int touched_any[40] = {0};
    for (int s = 1; s <= STEPS; s++) {
        uint64_t ids[40];
        int n = 0;
        for (int r = 0; r < R; r++)
            if (adt_rng_u32(g_seed ^ 0x77, (uint64_t)(s * R + r)) % 3u == 0) ids[n++] = (uint64_t)r, touched_any[r] = 1;
        for (int k = 0; k < n * D; k++) g[k] = adt_rng_normal(g_seed ^ 0x78, (uint64_t)(s * 1000 + k));
        CHECK(adt_ps_store_push(st, 0, ids, n, g, s, s) == ADT_OK, "%s", adt_error_message());
        double bc1 = 1 - pow(0.9, s), bc2 = 1 - pow(0.99, s);
        for (int r = 0, k = 0; r < R; r++) {
            int hit = k < n && ids[k] == (uint64_t)r;
            for (int j = 0; j < D; j++) {
                double gj = hit ? g[k * D + j] : 0.0;
                int i = r * D + j;
                if (kind == ADT_PS_SGD) w[i] -= o.lr * gj;
                else if (kind == ADT_PS_ADAGRAD) {
                    v[i] += gj * gj;
                    w[i] -= o.lr * gj / (sqrt(v[i]) + o.eps);
                } else {
                    /* dense Adam on every row (what lazy Adam is not) */
                    dm[i] = 0.9 * dm[i] + 0.1 * gj;
                    dv[i] = 0.99 * dv[i] + 0.01 * gj * gj;
                    dense_w[i] -= o.lr * (dm[i] / bc1) / (sqrt(dv[i] / bc2) + o.eps);
                    if (!hit) continue; /* lazy: the reference moves touched rows only */
                    m[i] = 0.9 * m[i] + 0.1 * gj;
                    v[i] = 0.99 * v[i] + 0.01 * gj * gj;
                    w[i] -= o.lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + o.eps);
                }
            }
            k += hit;
        }
    }
    double worst = 0, lazy_gap = 0;
    int untouched_changed = 0;
    for (int r = 0; r < R; r++) {
        const float *state;
        const float *row = adt_ps_store_row(st, 0, (uint64_t)r, &state);
        for (int j = 0; j < D; j++) {
            int i = r * D + j;
            worst = fmax(worst, fabs(row[j] - w[i]) / (fabs(w[i]) + 1e-3));
            if (kind == ADT_PS_ADAM) lazy_gap = fmax(lazy_gap, fabs(row[j] - dense_w[i]));
            if (kind == ADT_PS_ADAGRAD) worst = fmax(worst, fabs(state[j] - v[i]) / (fabs(v[i]) + 1e-3));
            if (kind == ADT_PS_ADAM) {
                worst = fmax(worst, fabs(state[j] - m[i]) / (fabs(m[i]) + 1e-3));
                worst = fmax(worst, fabs(state[D + j] - v[i]) / (fabs(v[i]) + 1e-3));
            }
            if (!touched_any[r]) untouched_changed += row[j] != init[i];
        }
    }
    CHECK(worst < 2e-5, "largest relative difference from the dense reference %.3g", worst);
    CHECK(untouched_changed == 0, "%d weights of never-touched rows changed", untouched_changed);
    if (kind == ADT_PS_ADAM) CHECK(lazy_gap > 1e-3, "lazy Adam equals dense Adam (gap %.3g): the test cannot tell", lazy_gap);
    free(w), free(m), free(v), free(dense_w), free(dm), free(dv), free(init), free(g);
    adt_ps_store_free(st);
}

static void test_optim_sgd(void) { optim_case(ADT_PS_SGD); }
static void test_optim_adagrad(void) { optim_case(ADT_PS_ADAGRAD); }
static void test_optim_adam(void) { optim_case(ADT_PS_ADAM); }

/* ---- save and load ----------------------------------------------------------------------------- */

static void test_store_lr(void) {
    adt_ps_optim o = {ADT_PS_SGD, 0.1f, 0, 0, 0};
    adt_ps_table tb[2] = {table("plain", 2, 0, 4, ADT_PS_REFUSE), table("own", 2, 0, 4, ADT_PS_REFUSE)};
    tb[1].optim = (adt_ps_optim){ADT_PS_SGD, 0.4f, 0, 0, 0};
    adt_ps_store *st;
    CHECK(adt_ps_store_create(&st, tb, 2, &o, g_seed) == ADT_OK, "%s", adt_error_message());
    float w0[2][2], g[2] = {1.0f, -2.0f};
    for (int t = 0; t < 2; t++) adt_ps_store_pull(st, t, (uint64_t[]){3}, 1, w0[t], 0);
    /* (lr, the plain table's rate, the own table's rate) for three pushes */
    const float rates[3][3] = {{0.05f, 0.05f, 0.4f * (0.05f / 0.1f)}, {0.025f, 0.025f, 0.4f * (0.025f / 0.1f)},
                               {0, 0.1f, 0.4f}};
    for (int k = 0; k < 3; k++) {
        adt_ps_store_set_lr(st, rates[k][0]);
        for (int t = 0; t < 2; t++) {
            adt_ps_store_push(st, t, (uint64_t[]){3}, 1, g, k + 1, k + 1);
            const float *w = adt_ps_store_row(st, t, 3, NULL);
            for (int j = 0; j < 2; j++) {
                float want = w0[t][j] - rates[k][1 + t] * g[j]; /* adt_k_sgd_update's w - lr g in float */
                CHECK(w[j] == want, "push %d, table %d, element %d: %.9g, expected %.9g", k, t, j, w[j], want);
                w0[t][j] = w[j];
            }
        }
    }
    adt_ps_store_free(st);
    adt_ps_clock c;
    adt_ps_clock_init(&c, 2, (adt_ps_sync){ADT_PS_SYNC, 0});
    adt_ps_clock_start(&c, 7);
    CHECK(adt_ps_clock_may_serve(&c, 7) && !adt_ps_clock_may_serve(&c, 8) && adt_ps_clock_push(&c, 0, 7) == ADT_OK &&
          adt_ps_clock_push(&c, 1, 6) == ADT_ERR_STATE, "a clock started at step 7");
    adt_ps_clock_free(&c);
}

static void test_save_load(void) {
    CHECK(check_tmpdir_make("ps") == 0, "tmpdir");
    const char *path = check_tmp_path("shard.safetensors");
    adt_ps_table tabs[2] = {table("a", 3, 0, 20, ADT_PS_EVICT), table("b", 2, 100, 50, ADT_PS_REFUSE)};
    adt_ps_optim o = {ADT_PS_ADAM, 0.01f, 0.9f, 0.999f, 1e-8f};
    adt_ps_store *st, *st2;
    adt_ps_store_create(&st, tabs, 2, &o, g_seed);
    float g[3] = {0.5f, -1, 2};
    for (int s = 0; s < 60; s++) {
        uint64_t id = (uint64_t)((s * 7) % 31);
        adt_ps_store_push(st, 0, &id, 1, g, s + 1, s);
        uint64_t id2 = (uint64_t)((s * 3) % 41);
        adt_ps_store_push(st, 1, &id2, 1, g, s + 1, s);
    }
    CHECK(adt_ps_store_save(st, path) == ADT_OK, "%s", adt_error_message());
    adt_ps_store_create(&st2, tabs, 2, &o, g_seed + 1);
    CHECK(adt_ps_store_load(st2, path) == ADT_OK, "%s", adt_error_message());
    int diff = 0;
    for (int t = 0; t < 2; t++) {
        adt_ps_store_stats a, b;
        adt_ps_store_get_stats(st, t, &a), adt_ps_store_get_stats(st2, t, &b);
        CHECK(a.rows == b.rows, "table %d: %lld rows, loaded %lld", t, (long long)a.rows, (long long)b.rows);
        for (uint64_t id = 0; id < 64; id++) {
            const float *sa, *sb;
            const float *ra = adt_ps_store_row(st, t, id, &sa), *rb = adt_ps_store_row(st2, t, id, &sb);
            if (!ra != !rb) diff++;
            else if (ra) diff += memcmp(ra, rb, sizeof(float) * (size_t)tabs[t].dim) != 0 ||
                                 memcmp(sa, sb, sizeof(float) * 2 * (size_t)tabs[t].dim) != 0;
        }
    }
    CHECK(diff == 0, "%d rows differ after the load", diff);
    /* the same eviction order: new rows push out the same victims in both */
    float row[3];
    for (uint64_t id = 1000; id < 1010; id++) {
        adt_ps_store_pull(st, 0, &id, 1, row, 100 + (int64_t)id);
        adt_ps_store_pull(st2, 0, &id, 1, row, 100 + (int64_t)id);
    }
    for (uint64_t id = 0; id < 31; id++)
        diff += !adt_ps_store_row(st, 0, id, NULL) != !adt_ps_store_row(st2, 0, id, NULL);
    CHECK(diff == 0, "%d rows evicted differently after the load", diff);
    adt_ps_store_free(st2);
    /* another optimizer, another table set */
    adt_ps_optim sgd = {ADT_PS_SGD, 0.1f, 0, 0, 0};
    adt_ps_store_create(&st2, tabs, 2, &sgd, g_seed);
    CHECK(adt_ps_store_load(st2, path) == ADT_ERR_FORMAT && strstr(adt_error_message(), "optimizer 'adam'"), "%s",
          adt_error_message());
    adt_ps_store_free(st2);
    adt_ps_store_create(&st2, tabs, 1, &o, g_seed);
    CHECK(adt_ps_store_load(st2, path) == ADT_ERR_FORMAT && strstr(adt_error_message(), "'b.ids'"), "%s",
          adt_error_message());
    adt_ps_store_free(st2);
    adt_ps_store_free(st);
    const char *leaves[] = {"shard.safetensors"};
    check_tmpdir_remove(leaves, 1);
}

/* ---- the DLRM with fed rows ---------------------------------------------------------------------- */

static void test_dlrm_ps_graph(void) {
    const int B = 6;
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    adt_model_dlrm(g, &SMALL, B, &io);
    adt_graph_backward(g, io.loss);
    for (int t = 0; t < 2; t++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        adt_graph_mark_output(g, g->values[adt_graph_find_value(g, name)].grad);
    }
    adt_exec *ex;
    CHECK(adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = g_seed}) == ADT_OK, "%s", adt_error_message());
    adt_exec_init_params(ex);
    float dense[18], labels[6];
    int32_t *ids = adt_exec_data(ex, io.input2);
    ps_batch(&SMALL, g_seed, 3, B, dense, ids, labels);
    memcpy(adt_exec_data(ex, io.input), dense, sizeof dense);
    memcpy(adt_exec_data(ex, io.label), labels, sizeof labels);
    adt_exec_run(ex);
    float loss = *(float *)adt_exec_data(ex, io.loss);

    adt_ps_optim o = {ADT_PS_SGD, 0.1f, 0, 0, 0};
    adt_ps_dlrm *d;
    CHECK(adt_ps_dlrm_create(&d, &SMALL, B, &o, &(adt_exec_opts){.threads = 1, .seed = g_seed}) == ADT_OK, "%s",
          adt_error_message());
    for (int t = 0; t < 2; t++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        const float *tab = adt_exec_f32(ex, name);
        for (int b = 0; b < B; b++) memcpy(adt_ps_dlrm_rows(d, t) + b * 4, tab + ids[b * 2 + t] * 4, 4 * sizeof(float));
    }
    float loss2;
    CHECK(adt_ps_dlrm_compute(d, dense, labels, &loss2) == ADT_OK, "%s", adt_error_message());
    CHECK(loss2 == loss, "fed-rows loss %.9g, plain %.9g", loss2, loss);
    for (int t = 0; t < 2; t++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        const float *gt = adt_exec_data(ex, g->values[adt_graph_find_value(g, name)].grad);
        float sum[7 * 4] = {0};
        const float *gr = adt_ps_dlrm_row_grad(d, t);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < 4; j++) sum[ids[b * 2 + t] * 4 + j] += gr[b * 4 + j];
        CHECK(check_max_rel_err(sum, gt, SMALL.table_rows[t] * 4, 1e-4) < 1e-5, "table %d's gradient", t);
    }
    adt_ps_dlrm_free(d);
    adt_exec_free(ex);
    adt_graph_free(g);
}

static void test_local_sgd(void) {
    const int B = 8, STEPS = 6;
    float ref[PS_REF_MAX_STEPS], got[PS_REF_MAX_STEPS], *tables[2];
    CHECK(ps_ref_dlrm(&SMALL, B, STEPS, g_seed, adt_optim_sgd(0, 0), 0.2f, ref, tables) == 0, "reference");
    adt_ps_optim o = {ADT_PS_SGD, 0.2f, 0, 0, 0};
    adt_ps_store *st = NULL;
    CHECK(ps_ref_local(&SMALL, B, STEPS, g_seed, &o, &o, got, &st) == 0, "%s", adt_error_message());
    for (int s = 0; s < STEPS; s++) CHECK_CLOSE(got[s], ref[s], 1e-5, 0);
    CHECK(ref[STEPS - 1] != ref[0], "the loss never moved");
    for (int t = 0; st && t < 2; t++)
        for (int r = 0; r < SMALL.table_rows[t]; r++) {
            const float *w = adt_ps_store_row(st, t, (uint64_t)r, NULL);
            CHECK(!w || check_max_rel_err(w, tables[t] + r * 4, 4, 1e-3) < 1e-5, "table %d row %d", t, r);
        }
    adt_ps_store_free(st);
    free(tables[0]), free(tables[1]);
}

/* Flags that cannot act are refused, naming them. */
static void test_refusals(void) {
    adt_comm *w;
    CHECK(adt_comm_init(ADT_COMM_SELF, &w) == ADT_OK, "%s", adt_error_message());
    adt_ps_world pw;
    CHECK(adt_ps_world_init(&pw, w, 1) == ADT_ERR_ARG && strstr(adt_error_message(), "--ps-servers 1 with 1 ranks"),
          "%s", adt_error_message());
    CHECK(adt_ps_world_init(&pw, w, 0) == ADT_ERR_ARG, "0 servers accepted");
    adt_comm_finalize(w);
    adt_ps_optim_kind k;
    CHECK(adt_ps_optim_parse("adamw", "--ps-optimizer", &k) == ADT_ERR_ARG &&
          strstr(adt_error_message(), "--ps-optimizer: 'adamw', expected a sparse optimizer: sgd, adagrad or adam"), "%s",
          adt_error_message());
    adt_ps_store *st;
    adt_ps_table tb = table("t", 0, 0, 10, ADT_PS_REFUSE);
    adt_ps_optim o = {ADT_PS_SGD, 0.1f, 0, 0, 0};
    CHECK(adt_ps_store_create(&st, &tb, 1, &o, 1) == ADT_ERR_ARG && strstr(adt_error_message(), "dim 0"), "%s",
          adt_error_message());
    tb.dim = 2;
    o.lr = 0;
    CHECK(adt_ps_store_create(&st, &tb, 1, &o, 1) == ADT_ERR_ARG && strstr(adt_error_message(), "learning rate"), "%s",
          adt_error_message());
    adt_ps_optim ada = {ADT_PS_ADAGRAD, 0.1f, 0, 0, 0};
    adt_ps_dlrm *d;
    CHECK(adt_ps_dlrm_create(&d, &SMALL, 2, &ada, &(adt_exec_opts){.threads = 1}) == ADT_ERR_UNSUPPORTED, "adagrad for "
          "the dense parameters accepted");
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    if (s) g_seed = strtoull(s, NULL, 10);
    RUN(test_sync_parse);
    RUN(test_clock);
    RUN(test_dispatch);
    RUN(test_store_init);
    RUN(test_store_random);
    RUN(test_capacity);
    RUN(test_optim_sgd);
    RUN(test_optim_adagrad);
    RUN(test_optim_adam);
    RUN(test_store_lr);
    RUN(test_save_load);
    RUN(test_dlrm_ps_graph);
    RUN(test_local_sgd);
    RUN(test_refusals);
    return check_finish();
}
