/*
 * bench_ps.c - training throughput of the parameter-server mode: a DLRM with large Zipf tables
 * (synthetic:criteo-zipf), the first S ranks serving its rows, the others working.
 *
 *   mpiexec -n 4 build/bench/bench_ps [--servers 2] [--sync sync|ssp:K|async] [--prefetch D]
 *       [--steps 60] [--warmup 10] [--batch 512] [--tables 8] [--rows 1000000] [--dim 16]
 *       [--alpha 1.05] [--threads 1] [--dense workers|servers]
 *
 * Sparse rows: Adagrad (lr 0.05) on the servers, created on first touch; dense parameters: Adam
 * (lr 1e-3), all-reduced among the workers (--dense workers) or kept on the servers. The batches are made before the clock starts (the
 * PyTorch peer, bench/torch_ps_peer.py, does the same), so the figure is training alone. Worker 0
 * prints one JSON line: samples/s over the timed steps (global batch x steps / wall time), the
 * median and spread of its step times, the mean loss of the last 10 steps, rows created.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"
#include "adtrain/ps.h"
#include "bench_stats.h"

typedef struct opts {
    int servers, prefetch, steps, warmup, batch, tables, dim, threads, dense_servers;
    int64_t rows;
    double alpha;
    const char *sync;
} opts;

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){2, 0, 60, 10, 512, 8, 16, 1, 0, 1000000, 1.05, "sync"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "bench_ps: %s needs a value\n", a), 2;
        i++;
        if (!strcmp(a, "--servers")) o->servers = atoi(v);
        else if (!strcmp(a, "--sync")) o->sync = v;
        else if (!strcmp(a, "--prefetch")) o->prefetch = atoi(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o->warmup = atoi(v);
        else if (!strcmp(a, "--batch")) o->batch = atoi(v);
        else if (!strcmp(a, "--tables")) o->tables = atoi(v);
        else if (!strcmp(a, "--rows")) o->rows = atoll(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--alpha")) o->alpha = atof(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--dense")) o->dense_servers = !strcmp(v, "servers");
        else return fprintf(stderr, "bench_ps: unknown flag %s\n", a), 2;
    }
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_ps: %s: %s\n", what, adt_error_message());
    return 1;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    adt_comm *world;
    if (adt_comm_init(ADT_COMM_AUTO, &world)) return fail("comm");
    adt_dlrm_cfg c = {.n_dense = 13, .n_tables = o.tables, .emb_dim = o.dim, .n_bottom = 2, .bottom = {64, o.dim},
                      .n_top = 2, .top = {64, 1}};
    for (int t = 0; t < o.tables; t++) c.table_rows[t] = (int)o.rows;
    adt_ps_cfg pc = {.n_servers = o.servers, .optim = {ADT_PS_ADAGRAD, 0.05f, 0, 0, 1e-8f}, .prefetch = o.prefetch,
                     .seed = 1, .timeout_s = 120};
    if (adt_ps_sync_parse(o.sync, "--sync", &pc.sync) || adt_ps_tables_dlrm(&pc, &c, 0, ADT_PS_REFUSE))
        return fail("config");
    adt_ps_optim dense_opt = {ADT_PS_ADAM, 1e-3f, 0.9f, 0.999f, 1e-8f};
    if (o.dense_servers && adt_ps_tables_dlrm_dense(&pc, &c, &dense_opt)) return fail("dense tables");
    adt_ps_world pw;
    if (adt_ps_world_init(&pw, world, o.servers)) return fail("world");
    int rc = 0;
    if (pw.is_server) {
        adt_ps_store *st;
        if (adt_ps_store_create(&st, pc.tables, pc.n_tables, &pc.optim, pc.seed)) return fail("store");
        adt_ps_server_stats ss;
        if (adt_ps_server_run(&pw, &pc, st, &ss)) rc = fail("server");
        adt_ps_store_free(st);
    } else {
        int W = pw.n_workers, w = pw.worker, B = o.batch, T = o.tables;
        int lo = w * B / W, Bw = (w + 1) * B / W - lo;
        float scale = (float)Bw / (float)B;
        adt_data_shape sh = {.n_dense = 13, .n_tables = T};
        for (int t = 0; t < T; t++) sh.table_rows[t] = o.rows;
        char spec[96];
        snprintf(spec, sizeof spec, "synthetic:criteo-zipf,alpha=%g", o.alpha);
        adt_dataset *ds;
        if (adt_dataset_open(&ds, spec, &sh, NULL, 0)) return fail("data");
        int S = o.steps + o.warmup;
        float *dense = malloc(sizeof(float) * (size_t)S * (size_t)Bw * 13), *labels = malloc(sizeof(float) * (size_t)S * (size_t)Bw);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)S * (size_t)Bw * (size_t)T);
        int64_t *sid = malloc(sizeof(int64_t) * (size_t)Bw);
        for (int s = 0; s < S; s++) {
            for (int b = 0; b < Bw; b++) sid[b] = (int64_t)s * B + lo + b;
            adt_dataset_fill(ds, sid, Bw, dense + (size_t)s * Bw * 13, ids + (size_t)s * Bw * T, labels + (size_t)s * Bw);
        }
        adt_ps_worker *wk;
        adt_ps_dlrm *d;
        if (adt_ps_worker_create(&wk, &pw, &pc) ||
            adt_ps_dlrm_create(&d, &c, Bw, &dense_opt, &(adt_exec_opts){.threads = o.threads, .seed = pc.seed}))
            return fail("worker");
        double *dt = malloc(sizeof(double) * (size_t)S), t_start = 0, loss_tail = 0;
        for (int s = 0; s <= o.prefetch && s < S && !rc; s++) rc = adt_ps_worker_pull(wk, s, ids + (size_t)s * Bw * T, Bw);
        for (int s = 0; s < S && !rc; s++) {
            if (s == o.warmup) {
                adt_comm_barrier(pw.workers);
                t_start = adt_now_s();
            }
            double t0 = adt_now_s();
            float loss;
            rc = adt_ps_dlrm_step(d, wk, pw.workers, s, dense + (size_t)s * Bw * 13, labels + (size_t)s * Bw, scale, &loss);
            int nx = s + o.prefetch + 1;
            if (!rc && nx < S) rc = adt_ps_worker_pull(wk, nx, ids + (size_t)nx * Bw * T, Bw);
            dt[s] = adt_now_s() - t0;
            if (s >= S - 10) loss_tail += loss / 10;
        }
        double wall = adt_now_s() - t_start;
        if (rc) fail("step");
        if (adt_ps_worker_done(wk)) rc = fail("done");
        if (!rc && w == 0) {
            stat_us st = summarise(dt + o.warmup, o.steps);
            printf("{\"config\": \"adtrain-ps\", \"sync\": \"%s\", \"prefetch\": %d, \"dense\": \"%s\", "
                   "\"servers\": %d, \"workers\": %d, \"batch\": %d, \"tables\": %d, \"rows\": %lld, \"dim\": %d, \"alpha\": %g, \"steps\": %d, "
                   "\"samples_per_s\": %.1f, \"loss_last10\": %.4f, ", o.sync, o.prefetch,
                   o.dense_servers ? "servers" : "workers", o.servers, W, B, T,
                   (long long)o.rows, o.dim, o.alpha, o.steps, (double)B * o.steps / wall, loss_tail);
            print_stat(stdout, "step", st, 0);
            printf("}\n");
            fflush(stdout);
        }
        free(dense), free(labels), free(ids), free(sid), free(dt);
        adt_ps_dlrm_free(d);
        adt_ps_worker_free(wk);
        adt_dataset_free(ds);
    }
    adt_comm_barrier(world);
    adt_ps_world_free(&pw);
    adt_comm_finalize(world);
    return rc;
}
