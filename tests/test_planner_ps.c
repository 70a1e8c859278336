/*
 * test_planner_ps.c - the parameter-server mode priced by the planner (src/planner/ps.c) and
 * chosen by `adtrain plan --strategy auto`: the expected distinct rows of each id law against
 * direct sums, a small case's bytes per worker and server against the closed form, auto choosing
 * ps for huge tables of little dense work and the collective plan for dense work of tiny tables,
 * and the plan file it writes run under mpiexec: the same losses as --mode ps given by flags,
 * every flag that disagrees with the plan refused with exit 2.
 */
#include "check.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "adtrain/planner.h"
#include "cli_run.h"
#include "mpi_world.h"

static const char *A100 = "configs/clusters/a100-80g-dgx.json";

/* sum_r 1 - (1 - p_r)^n, term by term */
static double direct(const double *p, long R, double n) {
    double d = 0;
    for (long r = 0; r < R; r++) d += 1 - pow(1 - p[r], n);
    return d;
}

static void test_expected_distinct(void) {
    adt_ps_ids uni = {ADT_PS_IDS_UNIFORM, 0};
    CHECK_CLOSE(adt_ps_expected_distinct(&uni, 10, 5), 10 * (1 - pow(0.9, 5)), 1e-12, 0);
    CHECK_CLOSE(adt_ps_expected_distinct(NULL, 1000, 1), 1.0, 1e-9, 0);
    CHECK(adt_ps_expected_distinct(&uni, 7, 0) == 0, "no draws, no rows");
    /* Zipf 1 on 3 rows: weights 1, 1/2, 1/3 over 11/6 */
    adt_ps_ids z1 = {ADT_PS_IDS_ZIPF, 1.0};
    double p3[3] = {6.0 / 11, 3.0 / 11, 2.0 / 11};
    CHECK_CLOSE(adt_ps_expected_distinct(&z1, 3, 4), direct(p3, 3, 4), 1e-12, 0);
    /* a table past the rows summed one by one: the integral's tail against the whole sum */
    long R = 3000000;
    double *p = malloc((size_t)R * sizeof *p), H = 0;
    adt_ps_ids z = {ADT_PS_IDS_ZIPF, 1.05};
    for (long k = 1; k <= R; k++) H += pow((double)k, -1.05);
    for (long k = 1; k <= R; k++) p[k - 1] = pow((double)k, -1.05) / H;
    for (double n = 64; n <= 65536; n *= 32) {
        double want = direct(p, R, n), got = adt_ps_expected_distinct(&z, R, n);
        CHECK(fabs(got - want) <= 2e-3 * want, "Zipf 1.05 on %ld rows, %g draws: %.3f distinct, the direct sum %.3f", R,
              n, got, want);
    }
    free(p);
    /* floor(V u^2) over V = 4 values: P(c) = sqrt((c+1)/4) - sqrt(c/4); k values over R rows */
    adt_ps_ids sq = {ADT_PS_IDS_SQUARE, 4};
    double pv[4], n = 3;
    for (int c = 0; c < 4; c++) pv[c] = sqrt((c + 1) / 4.0) - sqrt(c / 4.0);
    double k = direct(pv, 4, n);
    CHECK_CLOSE(adt_ps_expected_distinct(&sq, 100, n), 100 * (1 - pow(0.99, k)), 1e-12, 0);
}

/* 2 tables of 10 and 20 rows, width 4, uniform ids; 3 devices, 1 server, batch 8: 2 workers of 4
 * samples. Per worker: d = sum_t R_t (1 - (1 - 1/R_t)^4) rows, pulled as 8-byte ids and 16-byte
 * rows back, pushed as ids and 16-byte gradients; the server sees both workers' bytes. */
/* A DLRM config and the A100 cluster with the input unpriced; 0 when both load. */
static int load_case(adt_model_cfg *m, const char *cfg, adt_cluster *c) {
    CHECK(adt_model_cfg_parse(m, cfg, "dlrm") == 0, "config: %s", adt_error_message());
    CHECK(adt_cluster_load(c, A100) == 0, "%s", adt_error_message());
    c->input_s = 0;
    return check_cur_failed;
}

static void test_bytes_closed_form(void) {
    adt_model_cfg m;
    adt_cluster c;
    if (load_case(&m, "{\"type\":\"dlrm\",\"n_dense\":3,\"n_tables\":2,\"table_rows\":[10,20],\"emb_dim\":4,"
                  "\"bottom\":[8,4],\"top\":[8,1]}", &c)) return;
    adt_ps_opts o = {.devices = 3, .servers = 1, .batch = 8, .prefetch = 1, .optim = ADT_OPTIM_SGD};
    adt_ps_report r;
    CHECK(adt_ps_cost(&m, &c, &o, &r) == 0, "%s", adt_error_message());
    double dw = 10 * (1 - pow(0.9, 4)) + 20 * (1 - pow(0.95, 4)), db = 10 * (1 - pow(0.9, 8)) + 20 * (1 - pow(0.95, 8));
    CHECK(r.servers == 1 && r.workers == 2, "%d servers, %d workers", r.servers, r.workers);
    CHECK_CLOSE(r.rows_worker, dw, 1e-12, 0);
    CHECK_CLOSE(r.rows_step, db, 1e-12, 0);
    CHECK_CLOSE(r.pull_bytes, dw * (8 + 16), 1e-12, 0);
    CHECK_CLOSE(r.push_bytes, dw * (8 + 16), 1e-12, 0);
    CHECK_CLOSE(r.server_bytes, 2 * 2 * dw * 24, 1e-12, 0);
    /* the server stores every row: 16 bytes of weight (SGD: no moments) + 24 of bookkeeping */
    CHECK_CLOSE(r.server_mem_bytes, 30 * (16 + 24.0), 1e-12, 0);
    /* the parts add up; the pull (reply only, prefetched ids) crosses the server's NIC */
    const adt_link *k = &c.link[0];
    double pull = 2 * dw * 16 / k->bandwidth + 2 * k->latency + k->latency;
    CHECK_CLOSE(r.pull_s, fmax(pull, dw * 16 / k->bandwidth + k->latency + k->latency), 1e-9, 0);
    CHECK_CLOSE(r.step_s, r.compute_s + r.push_s + r.update_s + r.pull_s + r.dense_s, 1e-12, 0);
    /* servers searched: never slower than the one given */
    o.servers = 0;
    adt_ps_report best;
    CHECK(adt_ps_cost(&m, &c, &o, &best) == 0 && best.step_s <= r.step_s * (1 + 1e-12), "searched %.6g vs %.6g",
          best.step_s, r.step_s);
    /* refusals */
    o.servers = 3;
    CHECK(adt_ps_cost(&m, &c, &o, &r) != 0 && strstr(adt_error_message(), "--ps-servers 3"), "%s", adt_error_message());
    adt_model_cfg mlp;
    CHECK(adt_model_cfg_load(&mlp, "configs/mlp-mnist.json") == 0, "%s", adt_error_message());
    o.servers = 1;
    CHECK(adt_ps_cost(&mlp, &c, &o, &r) != 0 && strstr(adt_error_message(), "DLRM"), "%s", adt_error_message());
}

/* The staleness priced (ps.c, ps_schedule): sync waits for the whole round trip each step; a
 * pull answered L = min(K, prefetch) steps ahead (async: prefetch) hides it behind L steps. On a
 * link of 10 ms latency the round trip dominates, so answers 2 steps ahead give 3 steps in flight:
 * a third of sync's step (what is left: the worker's own work and the update's difference). */
static void test_staleness(void) {
    adt_model_cfg m;
    adt_cluster c;
    if (load_case(&m, "{\"type\":\"dlrm\",\"n_dense\":13,\"n_tables\":8,\"table_rows\":1000000,\"emb_dim\":16,"
                  "\"bottom\":[64,16],\"top\":[64,1]}", &c)) return;
    adt_ps_ids ids[8];
    for (int t = 0; t < 8; t++) ids[t] = (adt_ps_ids){ADT_PS_IDS_ZIPF, 1.05};
    adt_ps_opts o = {.devices = 4, .servers = 2, .batch = 512, .ids = ids, .optim = ADT_OPTIM_ADAMW};
    adt_ps_report sync[3], as[3], ssp[5];
    for (int P = 0; P <= 2; P++) {
        o.prefetch = P, o.staleness = 0;
        CHECK(adt_ps_cost(&m, &c, &o, &sync[P]) == 0, "%s", adt_error_message());
        o.staleness = ADT_PS_COST_ASYNC;
        CHECK(adt_ps_cost(&m, &c, &o, &as[P]) == 0, "%s", adt_error_message());
        /* sync: every part in a row, none hidden */
        const adt_ps_report *r = &sync[P];
        CHECK(r->lookahead == 0, "sync prefetch %d: lookahead %d", P, r->lookahead);
        CHECK_CLOSE(r->step_s, r->compute_s + r->push_s + r->update_s + r->pull_s + r->dense_s, 1e-12, 0);
        CHECK_CLOSE(r->wait_s, r->round_s, 1e-9, 0);
        CHECK(as[P].lookahead == P, "async prefetch %d: lookahead %d", P, as[P].lookahead);
        if (P == 0) { /* nothing asked ahead: async waits for its round trip too, as ssp does */
            CHECK_CLOSE(as[0].step_s, as[0].compute_s + as[0].round_s + as[0].dense_s, 1e-12, 0);
            adt_ps_report k3;
            o.staleness = 3;
            CHECK(adt_ps_cost(&m, &c, &o, &k3) == 0 && k3.step_s == as[0].step_s && k3.lookahead == 0,
                  "prefetch 0: ssp:3 %.9g, async %.9g", k3.step_s, as[0].step_s);
        }
        else
            CHECK(as[P].step_s < sync[P].step_s, "prefetch %d: async %.6g not below sync %.6g", P, as[P].step_s,
                  sync[P].step_s);
    }
    /* async applies each push apart: every row a worker pushed is updated, not the batch's union */
    CHECK(as[2].update_s >= sync[2].update_s, "update: async %.6g, sync %.6g", as[2].update_s, sync[2].update_s);
    /* ssp:K at prefetch 4: lookahead min(K, 4), the step never longer for a larger K, ssp:K >= 4 = async */
    o.prefetch = 4;
    adt_ps_report a4;
    o.staleness = ADT_PS_COST_ASYNC;
    CHECK(adt_ps_cost(&m, &c, &o, &a4) == 0, "%s", adt_error_message());
    for (int K = 1; K <= 5; K++) {
        o.staleness = K;
        adt_ps_report *r = &ssp[K - 1];
        CHECK(adt_ps_cost(&m, &c, &o, r) == 0, "%s", adt_error_message());
        CHECK(r->lookahead == (K < 4 ? K : 4), "ssp:%d prefetch 4: lookahead %d", K, r->lookahead);
        if (K > 1) CHECK(r->step_s <= ssp[K - 2].step_s, "ssp:%d %.6g above ssp:%d %.6g", K, r->step_s, K - 1, ssp[K - 2].step_s);
        if (K >= 4) CHECK(r->step_s == a4.step_s, "ssp:%d %.6g, async %.6g", K, r->step_s, a4.step_s);
    }
    /* a slow link: 3 steps in flight make the step a third of (the worker's work + the round trip) */
    for (int l = 0; l < c.n_links; l++) c.link[l].latency = 10e-3;
    o.prefetch = 2, o.staleness = 0;
    adt_ps_report s2, a2;
    CHECK(adt_ps_cost(&m, &c, &o, &s2) == 0, "%s", adt_error_message());
    o.staleness = ADT_PS_COST_ASYNC;
    CHECK(adt_ps_cost(&m, &c, &o, &a2) == 0, "%s", adt_error_message());
    CHECK(s2.round_s > 50e-3 && fabs(a2.step_s / s2.step_s - 1.0 / 3) < 0.02, "10 ms links: sync %.6g s, async "
          "prefetch 2 %.6g s (%.3f x, expected 1/3)", s2.step_s, a2.step_s, a2.step_s / s2.step_s);
    /* a staleness below async's code is refused, naming the flag */
    o.staleness = -2;
    CHECK(adt_ps_cost(&m, &c, &o, &a2) != 0 && strstr(adt_error_message(), "--ps-sync"), "%s", adt_error_message());
}

/* `adtrain plan --strategy auto --json` on a model: its "mode" and the ps estimate's step */
static void auto_mode(const char *model_json, int devices, int batch, char *mode, double *chosen, double *ps_s,
                      double *coll_s) {
    char cfg[512], args[2048], out[65536];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("auto.json"));
    write_text(cfg, model_json);
    snprintf(args, sizeof args, "plan --model %s --cluster %s --devices %d --batch %d --strategy auto --json --input-s 0 "
             "--data synthetic:criteo-zipf", cfg, A100, devices, batch);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: exit %d:\n%.2000s", args, rc, out);
    const char *m = strstr(out, "\"mode\":");
    mode[0] = 0;
    if (m) sscanf(m, "\"mode\": \"%15[a-z]\"", mode);
    const char *s = strstr(out, "\"predicted_step_s\":");
    *chosen = s ? atof(s + 19) : -1;
    const char *p = strstr(out, "\"ps\":");
    p = p ? strstr(p, "\"predicted_step_s\":") : NULL;
    *ps_s = p ? atof(p + 19) : -1;
    const char *c = strstr(out, "\"collective\":");
    c = c ? strstr(c, "\"predicted_step_s\":") : NULL;
    *coll_s = c ? atof(c + 19) : *chosen;
    unlink(cfg);
}

static void test_auto_chooses(void) {
    char mode[16];
    double chosen, ps, coll;
    /* 8 tables of 5M rows x 64 (10 GB of weights), a tiny MLP: a collective plan updates whole
     * tables (or all-reduces them) every step, the servers only the rows a batch touches */
    auto_mode("{\"type\":\"dlrm\",\"n_dense\":13,\"n_tables\":8,\"table_rows\":[5000000,5000000,5000000,5000000,"
              "5000000,5000000,5000000,5000000],\"emb_dim\":64,\"bottom\":[64,64],\"top\":[64,1]}",
              16, 1024, mode, &chosen, &ps, &coll);
    CHECK(!strcmp(mode, "ps"), "huge tables: mode '%s', expected ps", mode);
    CHECK(chosen == ps && ps < coll, "huge tables: chosen %.6g, ps %.6g, collective %.6g", chosen, ps, coll);
    /* two tables of 10 rows, 4096-wide layers on 2 devices: the only worker beside a server does
     * the whole batch's dense work that data parallelism splits in two */
    auto_mode("{\"type\":\"dlrm\",\"n_dense\":512,\"n_tables\":2,\"table_rows\":[10,10],\"emb_dim\":64,"
              "\"bottom\":[4096,4096,64],\"top\":[4096,4096,1]}", 2, 8192, mode, &chosen, &ps, &coll);
    CHECK(!strcmp(mode, "collective"), "dense work: mode '%s', expected collective", mode);
    CHECK(ps > 1.5 * chosen, "dense work: ps %.6g, chosen %.6g", ps, chosen);
}

static const char *DLRM = "{\"type\":\"dlrm\",\"n_dense\":5,\"n_tables\":4,\"table_rows\":[50,9,200,31],\"emb_dim\":4,"
                          "\"bottom\":[16,4],\"top\":[16,1]}\n";
static const char *COMMON = "--data synthetic:dlrm --steps 8 --batch 32 --optimizer sgd --lr 0.5 --schedule constant --seed 5";

static void run_world(int nranks, const char *flags, mpi_world *wd) {
    static char buf[2048];
    static const char *argv[64];
    snprintf(buf, sizeof buf, "%s", flags);
    int k = 0;
    argv[k++] = g_bin, argv[k++] = "train";
    for (char *t = strtok(buf, " "); t && k < 62; t = strtok(NULL, " ")) argv[k++] = t;
    argv[k] = NULL;
    *wd = (mpi_world){.n = nranks, .argv = argv};
    mpi_run_world(wd, check_tmpdir(), 180);
}

static void test_plan_file_runs(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    char cfg[512], plan[512], la[512], lb[512], args[2048], out[65536];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("dlrm.json"));
    snprintf(plan, sizeof plan, "%s", check_tmp_path("plan.json"));
    snprintf(la, sizeof la, "%s", check_tmp_path("plan.jsonl"));
    snprintf(lb, sizeof lb, "%s", check_tmp_path("flags.jsonl"));
    write_text(cfg, DLRM);
    /* on the A100 cluster the launches dominate so small a model, and the servers' rows beat
     * the collective plans' whole tables */
    snprintf(args, sizeof args, "plan --model %s --cluster %s --devices 4 --batch 32 --strategy auto --optimizer sgd "
             "--input-s 0 --data synthetic:dlrm -o %s", cfg, A100, plan);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && contains(out, "chosen      the parameter-server mode"), "plan: exit %d:\n%.3000s", rc, out);
    char *text = mpi_slurp(plan);
    cJSON *j = cJSON_Parse(text), *ps = cJSON_GetObjectItem(j, "ps");
    const char *mode = cJSON_GetStringValue(cJSON_GetObjectItem(j, "mode"));
    const char *sync = cJSON_GetStringValue(cJSON_GetObjectItem(ps, "sync"));
    const char *dense = cJSON_GetStringValue(cJSON_GetObjectItem(ps, "dense"));
    int servers = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "servers"));
    int prefetch = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "prefetch"));
    CHECK(mode && !strcmp(mode, "ps") && sync && !strcmp(sync, "sync") && prefetch == 1 && dense &&
          !strcmp(dense, "workers") && servers >= 1 && servers <= 3, "the plan file:\n%s", text);
    cJSON_Delete(j);
    free(text);
    if (check_cur_failed) return;
    char flags[2048];
    mpi_world a, b;
    snprintf(flags, sizeof flags, "--model %s %s --plan %s --log %s", cfg, COMMON, plan, la);
    run_world(4, flags, &a);
    CHECK(a.status == 0 && contains(a.err, "ps     "), "--plan: exit %d", a.status);
    if (check_cur_failed) mpi_print_tail("stderr", a.err, 30);
    snprintf(flags, sizeof flags, "--model %s %s --mode ps --ps-servers %d --ps-sync sync --ps-prefetch 1 --log %s", cfg,
             COMMON, servers, lb);
    run_world(4, flags, &b);
    CHECK(b.status == 0, "flags: exit %d", b.status);
    double ra[64], rb[64];
    int ne, na = read_losses(la, ra, 64, &ne), nb = read_losses(lb, rb, 64, &ne);
    CHECK(na == 8 && nb == 8, "%d and %d steps logged", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECK(ra[i] == rb[i], "step %d: loss %.9g with the plan, %.9g with flags", i + 1, ra[i], rb[i]);
    mpi_world_free(&a);
    mpi_world_free(&b);
    /* no --batch: the plan's batch, the same run */
    char lc[512];
    snprintf(lc, sizeof lc, "%s", check_tmp_path("nobatch.jsonl"));
    snprintf(flags, sizeof flags, "--model %s --data synthetic:dlrm --steps 8 --optimizer sgd --lr 0.5 --schedule "
             "constant --seed 5 --plan %s --log %s", cfg, plan, lc);
    run_world(4, flags, &a);
    double rc_[64];
    int nc = read_losses(lc, rc_, 64, &ne);
    CHECK(a.status == 0 && nc == 8, "the plan without --batch: exit %d, %d steps logged", a.status, nc);
    for (int i = 0; i < nc && i < nb; i++)
        CHECK(rc_[i] == rb[i], "step %d without --batch: loss %.9g, %.9g with flags", i + 1, rc_[i], rb[i]);
    if (check_cur_failed) mpi_print_tail("stderr", a.err, 20);
    mpi_world_free(&a);
    unlink(lc);
    /* the plan made for 4 ranks on 3 */
    snprintf(flags, sizeof flags, "--model %s %s --plan %s", cfg, COMMON, plan);
    run_world(3, flags, &a);
    CHECK(a.status == 2 && contains(a.err, "made for 4 ranks, 3 started"), "3 ranks: exit %d", a.status);
    if (check_cur_failed) mpi_print_tail("stderr", a.err, 10);
    mpi_world_free(&a);
    /* flags that disagree with the plan: refused before any rank starts work */
    char other[32];
    snprintf(other, sizeof other, "--ps-servers %d", servers == 1 ? 2 : 1);
    const char *cases[][2] = {
        {other, "--ps-servers"},
        {"--ps-sync async", "--ps-sync async: the parameter-server plan"},
        {"--ps-prefetch 0", "--ps-prefetch 0"},
        {"--ps-dense servers", "--ps-dense servers"},
        {"--mode collective", "--mode collective"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(args, sizeof args, "train --model %s %s --plan %s %s", cfg, COMMON, plan, cases[i][0]);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 2 && contains(out, cases[i][1]), "'%s': exit %d:\n%s", cases[i][0], rc, out);
    }
    snprintf(args, sizeof args, "train --model %s --data synthetic:dlrm --steps 2 --batch 16 --plan %s", cfg, plan);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && contains(out, "--batch 16: the parameter-server plan"), "--batch 16: exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "train --model configs/dlrm-small.json --data synthetic:dlrm --steps 2 --batch 32 --plan %s",
             plan);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && contains(out, "made for another model"), "another model: exit %d:\n%s", rc, out);
    /* a bad field is named */
    write_text(plan, "{\"format\":\"adtrain-plan\",\"version\":1,\"mode\":\"ps\",\"model\":{\"type\":\"dlrm\","
                     "\"n_dense\":5,\"n_tables\":4,\"table_rows\":[50,9,200,31],\"emb_dim\":4,\"bottom\":[16,4],"
                     "\"top\":[16,1]},\"batch\":32,\"devices\":4,\"ps\":{\"servers\":4,\"sync\":\"sync\","
                     "\"prefetch\":1,\"dense\":\"workers\"}}");
    snprintf(args, sizeof args, "train --model %s %s --plan %s", cfg, COMMON, plan);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && contains(out, "servers"), "servers 4 of 4 devices: exit %d:\n%s", rc, out);
    text = mpi_slurp(cfg);
    char bad[4096];
    snprintf(bad, sizeof bad, "{\"format\":\"adtrain-plan\",\"version\":1,\"mode\":\"ps\",\"model\":%s,\"batch\":32,"
             "\"devices\":4,\"ps\":{\"servers\":1,\"sync\":\"ssp:0\",\"prefetch\":1,\"dense\":\"workers\"}}", text);
    free(text);
    write_text(plan, bad);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && contains(out, "field \"ps.sync\": 'ssp:0'"), "sync ssp:0: exit %d:\n%s", rc, out);
    unlink(cfg), unlink(plan), unlink(la), unlink(lb);
}

/* adtrain plan's --ps-servers, --ps-sync, --ps-prefetch: the estimate and the plan file take the
 * setting; a flag that cannot act (no cluster, no tables, a bad mode) is refused with exit 2. */
static void test_cli_ps_flags(void) {
    char cfg[512], plan[512], args[2048], out[65536];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("flags.json"));
    snprintf(plan, sizeof plan, "%s", check_tmp_path("flags-plan.json"));
    write_text(cfg, DLRM);
    snprintf(args, sizeof args, "plan --model %s --cluster %s --devices 4 --batch 32 --strategy auto --optimizer sgd "
             "--input-s 0 --data synthetic:dlrm --ps-servers 1 --ps-sync async --ps-prefetch 2 --json -o %s", cfg, A100, plan);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: exit %d:\n%.2000s", args, rc, out);
    cJSON *j = cJSON_Parse(out), *ps = cJSON_GetObjectItem(j, "ps");
    const char *sync = cJSON_GetStringValue(cJSON_GetObjectItem(ps, "sync"));
    CHECK(sync && !strcmp(sync, "async") && cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "prefetch")) == 2 &&
          cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "lookahead")) == 2 &&
          cJSON_GetNumberValue(cJSON_GetObjectItem(ps, "servers")) == 1, "the estimate:\n%.3000s", out);
    cJSON_Delete(j);
    char *text = mpi_slurp(plan);
    CHECK(text && contains(text, "\"sync\":\t\"async\"") && contains(text, "\"prefetch\":\t2"), "the plan file:\n%s",
          text ? text : "(none)");
    free(text);
    const char *bad[][2] = {
        {"--ps-sync ssp:0", "--ps-sync: 'ssp:0'"},
        {"--ps-sync fast", "--ps-sync: 'fast'"},
        {"--ps-prefetch 65", "--ps-prefetch"},
        {"--ps-servers 4", "--ps-servers 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "plan --model %s --cluster %s --devices 4 --batch 32 --strategy auto --input-s 0 "
                 "--data synthetic:dlrm %s", cfg, A100, bad[i][0]);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 2 && contains(out, bad[i][1]), "'%s': exit %d:\n%.2000s", bad[i][0], rc, out);
    }
    /* --mode collective: the collective plan written although ps is predicted faster; --mode ps
     * on a model the collective plans suit: ps chosen anyway */
    snprintf(args, sizeof args, "plan --model %s --cluster %s --devices 4 --batch 32 --strategy auto --optimizer sgd "
             "--input-s 0 --data synthetic:dlrm --mode collective -o %s", cfg, A100, plan);
    rc = run_adtrain(args, out, sizeof out);
    text = mpi_slurp(plan);
    CHECK(rc == 0 && !contains(out, "chosen      the parameter-server") && text && !contains(text, "\"mode\"") &&
          contains(text, "\"strategy\""), "--mode collective: exit %d:\n%.2000s\n%s", rc, out, text ? text : "");
    free(text);
    snprintf(args, sizeof args, "plan --model %s --cluster %s --devices 2 --batch 8192 --strategy auto --input-s 0 "
             "--data synthetic:criteo-zipf --mode ps --json", check_tmp_path("dense.json"), A100);
    write_text(check_tmp_path("dense.json"), "{\"type\":\"dlrm\",\"n_dense\":512,\"n_tables\":2,\"table_rows\":[10,10],"
               "\"emb_dim\":64,\"bottom\":[4096,4096,64],\"top\":[4096,4096,1]}");
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && contains(out, "\"mode\":\t\"ps\""), "--mode ps: exit %d:\n%.2000s", rc, out);
    unlink(check_tmp_path("dense.json"));
    /* refused: {model (NULL: the DLRM), on the A100 cluster, the rest, what the message says} */
    const struct { const char *model; int cluster; const char *rest, *says; } refused[] = {
        {NULL, 0, "--devices 4 --batch 32 --strategy dp --mode ps", "--mode goes with --strategy auto"},
        {NULL, 1, "--devices 4 --strategy auto --mode hybrid", "--mode: expected 'collective' or 'ps'"},
        {"configs/mlp-mnist.json", 1, "--devices 2 --batch 32 --strategy auto --input-s 0 --mode ps",
         "--mode ps: the parameter-server mode holds a DLRM"},
        {NULL, 0, "--devices 4 --batch 32 --strategy dp --ps-sync async", "--ps-sync goes with --cluster"},
        {"configs/mlp-mnist.json", 1, "--devices 2 --batch 32 --strategy dp --input-s 0 --ps-servers 1",
         "--ps-servers: the parameter-server mode holds a DLRM"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        snprintf(args, sizeof args, "plan --model %s %s%s %s", refused[i].model ? refused[i].model : cfg,
                 refused[i].cluster ? "--cluster " : "", refused[i].cluster ? A100 : "", refused[i].rest);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 2 && contains(out, refused[i].says), "'%s': exit %d:\n%.2000s", args, rc, out);
    }
    unlink(cfg), unlink(plan);
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("planner_ps")) return 1;
    setenv("ADT_COMM_TIMEOUT", "60", 1);
    mpi_world_sanitizer_env();
    RUN(test_expected_distinct);
    RUN(test_bytes_closed_form);
    RUN(test_staleness);
    RUN(test_auto_chooses);
    RUN(test_cli_ps_flags);
    RUN(test_plan_file_runs);
    rmdir(check_tmpdir());
    return check_finish();
}
