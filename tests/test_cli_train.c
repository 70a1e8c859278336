/*
 * test_cli_train.c - `adtrain train` and `adtrain graph` end to end, through the binary: a short
 * run on synthetic text must lower the logged loss clearly, an MLP run on synthetic:mlp too, and
 * every bad flag, config or dataset must exit 2 with a message naming the flag.
 *
 * The binary is $ADT_BIN, else $BUILD/adtrain (the Makefile's test target sets BUILD), else
 * build/adtrain; tests run from the repository root.
 */
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "mpi_world.h"

static double mean(const double *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s / n;
}

static void test_binary_exists(void) {
    CHECK(access(g_bin, X_OK) == 0, "%s is not an executable (build it with make, or set ADT_BIN)", g_bin);
}

static void test_train_synthetic_text(void) {
    const char *cfg = check_tmp_path("tiny.json"), *log = check_tmp_path("text.jsonl");
    write_text(cfg, "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":32,\"n_layer\":1,\"n_embd\":32,\"n_head\":4}\n");
    char args[1024], out[16384];
    snprintf(args, sizeof args,
             "train --model '%s' --data synthetic:text --steps 30 --batch 16 --lr 3e-3 --eval-every 15 "
             "--eval-batches 2 --log '%s'",
             cfg, log);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "exit %d; output:\n%s", rc, out);
    double loss[64];
    int n_eval, n = read_losses(log, loss, 64, &n_eval);
    CHECK(n == 30, "%d step lines in %s", n, log);
    CHECK(n_eval == 2, "%d eval lines (expected steps 15 and 30)", n_eval);
    if (n < 30) return;
    double first = mean(loss, 3), last = mean(loss + n - 3, 3);
    CHECK(fabs(loss[0] - 4.1744) < 0.3, "initial loss %.3f, expected about ln 65 = 4.17", loss[0]);
    CHECK(last < first - 0.5, "loss went from %.3f to %.3f, expected a clear drop", first, last);
    CHECK(contains(out, "step 30/30") && contains(out, "val_loss"), "progress lines:\n%s", out);
    unlink(log);
}

static void test_train_synthetic_mlp(void) {
    const char *cfg = check_tmp_path("mlp.json"), *log = check_tmp_path("mlp.jsonl");
    write_text(cfg, "{\"type\":\"mlp\",\"sizes\":[16,32,4],\"activation\":\"relu\"}\n");
    char args[1024], out[16384];
    snprintf(args, sizeof args,
             "train --model '%s' --data synthetic:mlp --steps 60 --batch 32 --optimizer sgd --lr 0.5 --log '%s'", cfg,
             log);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "exit %d; output:\n%s", rc, out);
    double loss[64];
    int n_eval, n = read_losses(log, loss, 64, &n_eval);
    CHECK(n == 60, "%d step lines", n);
    if (n == 60) CHECK(mean(loss + 50, 10) < mean(loss, 10) - 0.3, "mlp loss %.3f -> %.3f", mean(loss, 10), mean(loss + 50, 10));
    unlink(log);
}

/* Each bad invocation exits 2 and its message names what is wrong. */
/* The value of "key": in the last line of a log that has it, or -1. */
static double last_value(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512], pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    double v = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, pat);
        if (p) v = atof(p + strlen(pat));
    }
    fclose(f);
    return v;
}

/* Tiny IDX files: 16x16 images whose class (0..3) is the quadrant holding a bright square. */
static void write_idx(const char *prefix, int n) {
    char path[600];
    snprintf(path, sizeof path, "%s-images-idx3-ubyte", prefix);
    FILE *fi = fopen(path, "wb");
    snprintf(path, sizeof path, "%s-labels-idx1-ubyte", prefix);
    FILE *fl = fopen(path, "wb");
    const unsigned char hi[16] = {0, 0, 8, 3, 0, 0, (unsigned char)(n >> 8), (unsigned char)n, 0, 0, 0, 16, 0, 0, 0, 16};
    const unsigned char hl[8] = {0, 0, 8, 1, 0, 0, (unsigned char)(n >> 8), (unsigned char)n};
    fwrite(hi, 1, 16, fi), fwrite(hl, 1, 8, fl);
    uint32_t r = 7;
    for (int i = 0; i < n; i++) {
        unsigned char img[256], c = (unsigned char)(i * 7 % 4);
        for (int k = 0; k < 256; k++) r = r * 1103515245u + 12345u, img[k] = (unsigned char)((r >> 16) % 60);
        int y0 = (c / 2) * 8 + 2, x0 = (c % 2) * 8 + 2;
        for (int y = y0; y < y0 + 4; y++)
            for (int x = x0; x < x0 + 4; x++) img[y * 16 + x] = 250;
        fwrite(img, 1, 256, fi), fputc(c, fl);
    }
    fclose(fi), fclose(fl);
}

/* Each family trains from the command line on its kinds of data and reports its metric. */
static void test_train_families(void) {
    char prefix[512], args[4096], out[16384], log[512], cfg[512];
    snprintf(prefix, sizeof prefix, "%s", check_tmp_path("digits"));
    write_idx(prefix, 600);
    snprintf(log, sizeof log, "%s", check_tmp_path("fam.jsonl"));
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("vgg.json"));
    write_text(cfg, "{\"type\":\"vgg\",\"in_channels\":1,\"height\":16,\"width\":16,\"blocks\":[[8]],\"fc\":[32],"
               "\"classes\":4}");
    snprintf(args, sizeof args, "train --model '%s' --data 'mnist:%s@:500' --val 'mnist:%s@500:' --steps 80 --batch 20 "
             "--lr 3e-3 --eval-every 80 --eval-batches 5 --log '%s'", cfg, prefix, prefix, log);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "val_acc"), "vgg on mnist: exit %d:\n%s", rc, out);
    CHECK(last_value(log, "val_acc") >= 0.9, "vgg val_acc %.3f on a 4-quadrant task", last_value(log, "val_acc"));

    write_text(cfg, "{\"type\":\"mlp\",\"sizes\":[256,32,4],\"activation\":\"relu\"}");
    snprintf(args, sizeof args, "train --model '%s' --data 'mnist:%s@:500' --val 'mnist:%s@500:' --steps 80 --batch 20 "
             "--lr 3e-3 --eval-every 80 --eval-batches 5 --log '%s'", cfg, prefix, prefix, log);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && last_value(log, "val_acc") >= 0.9, "mlp on mnist: exit %d, val_acc %.3f:\n%s", rc,
          last_value(log, "val_acc"), out);

    write_text(cfg, "{\"type\":\"dlrm\",\"n_dense\":13,\"n_tables\":26,\"table_rows\":200,\"emb_dim\":8,"
               "\"bottom\":[32,8],\"top\":[32,1]}");
    snprintf(args, sizeof args, "train --model '%s' --data synthetic:dlrm --val synthetic:dlrm --steps 300 --batch 128 "
             "--lr 3e-3 --eval-every 300 --eval-batches 8 --log '%s'", cfg, log);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && last_value(log, "val_auc") >= 0.75, "dlrm on synthetic:dlrm: exit %d, val_auc %.3f:\n%s", rc,
          last_value(log, "val_auc"), out);

    /* A model and data of different families: refused before any step, naming both. */
    snprintf(args, sizeof args, "train --data 'mnist:%s' --steps 1", prefix);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "labelled examples") && strstr(out, "token sequences"), "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "train --model configs/mlp-mnist.json --data 'mnist:%s' --steps 1", prefix);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "784"), "mlp of 784 inputs on 16x16 images: exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "train --model '%s' --data 'criteo:%s-images-idx3-ubyte' --steps 1", cfg, prefix);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--data"), "dlrm on a binary file: exit %d:\n%s", rc, out);
}

static void test_bad_flags(void) {
    const char *cfg = check_tmp_path("tiny.json"), *v50 = check_tmp_path("v50.json");
    write_text(v50, "{\"type\":\"gpt\",\"vocab_size\":50,\"n_ctx\":32,\"n_layer\":1,\"n_embd\":32,\"n_head\":4}\n");
    char a[24][600];
    const char *frag[24];
    int n = 0;
#define BAD(f, ...) (snprintf(a[n], sizeof a[n], __VA_ARGS__), frag[n++] = (f))
    BAD("--steps", "train --steps abc");
    BAD("--steps", "train --steps 0");
    BAD("--steps", "train --steps");
    BAD("--batch", "train --batch -4");
    BAD("--bogus", "train --bogus 3");
    BAD("stray", "train stray");
    BAD("--optimizer", "train --optimizer rmsprop");
    BAD("--schedule", "train --schedule linear");
    BAD("--shuffle", "train --shuffle maybe");
    BAD("--profile", "train --profile yes");
    BAD("--lr", "train --lr -1");
    BAD("--lr", "train --lr=nan");
    BAD("--momentum", "train --momentum 0.9");
    BAD("--warmup", "train --warmup 500 --steps 100");
    BAD("--seed", "train --seed -1");
    BAD("--threads", "train --threads 0");
    BAD("--model", "train --model '%s'", check_tmp_path("no-such.json"));
    BAD("--data", "train --data csv:foo");
    BAD("--data", "train --model '%s' --data text:'%s'", cfg, check_tmp_path("no-such.txt"));
    BAD("--data", "train --model '%s' --data synthetic:mlp", cfg);
    BAD("vocab_size 50", "train --model '%s' --data synthetic:text", v50);
    BAD("--log", "train --model '%s' --data synthetic:text --log '%s/no/such/dir/x.jsonl'", cfg, check_tmpdir());
    BAD("--format", "graph --format svg");
#undef BAD
    for (int i = 0; i < n; i++) {
        char out[8192];
        int rc = run_adtrain(a[i], out, sizeof out);
        CHECK(rc == 2, "'%s' exited %d, expected 2; output:\n%s", a[i], rc, out);
        CHECK(contains(out, frag[i]), "'%s': '%s' not in:\n%s", a[i], frag[i], out);
    }
    char out[8192];
    int rc = run_adtrain("train --model '/dev/null' --steps 1", out, sizeof out);
    CHECK(rc == 2 && contains(out, "--model") && contains(out, "/dev/null"), "%d %s", rc, out);
    rc = run_adtrain("train --model configs/gpt-tiny.json --data synthetic:text --steps 1 --batch 4 --eval-every 1 "
                     "--val text:configs/gpt-tiny.json",
                     out, sizeof out);
    CHECK(rc == 2 && contains(out, "--val") && contains(out, "not in the training vocabulary"), "%d %s", rc, out);
    unlink(v50);
}

/* The "profile rank R: S steps, X ms per step in the executor: compute C ms, collectives K ms
 * (...), polling between nodes P ms" line of rank r in out, with the op and collective lines after
 * it summed; 0 when absent. */
static int read_profile(const char *out, int r, int *steps, double *exec_ms, double *compute, double *coll,
                        double *poll, double *op_sum, double *coll_sum, int *kinds) {
    char head[64];
    snprintf(head, sizeof head, "profile rank %d: ", r);
    const char *p = strstr(out, head);
    if (!p || sscanf(p + strlen(head), "%d steps, %lf ms per step in the executor: compute %lf ms, collectives %lf",
                     steps, exec_ms, compute, coll) != 4)
        return 0;
    const char *eol = strchr(p, '\n'), *pl = strstr(p, "polling between nodes ");
    if (!pl || (eol && pl > eol) || sscanf(pl + strlen("polling between nodes "), "%lf", poll) != 1) return 0;
    *op_sum = *coll_sum = 0, *kinds = 0;
    for (const char *q = strstr(p, head); q; q = strstr(q + 1, head)) {
        const char *rest = q + strlen(head);
        double ms;
        char name[64];
        if (sscanf(rest, "  op %63s %lf ms", name, &ms) == 2) *op_sum += ms;
        else if ((sscanf(rest, "  all_gather %lf", &ms) == 1 || sscanf(rest, "  reduce_scatter %lf", &ms) == 1 ||
                  sscanf(rest, "  all_reduce %lf", &ms) == 1))
            *coll_sum += ms, ++*kinds;
    }
    return 1;
}

/* --profile on: each rank's time by op sums to its compute, which fits in the executor's time;
 * the first step (warm-up) is left out; ranks of a ZeRO plan list their collectives. */
static void test_profile(void) {
    const char *cfg = check_tmp_path("mlp.json"), *plan = check_tmp_path("zero.json");
    write_text(cfg, "{\"type\":\"mlp\",\"sizes\":[16,64,64,4],\"activation\":\"relu\"}\n");
    char args[1024], out[32768];
    snprintf(args, sizeof args, "train --model '%s' --data synthetic:mlp --steps 7 --batch 32 --profile on", cfg);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "exit %d; output:\n%s", rc, out);
    int steps, kinds;
    double ex, comp, coll, poll, ops, colls;
    CHECK(read_profile(out, 0, &steps, &ex, &comp, &coll, &poll, &ops, &colls, &kinds), "no profile of rank 0 in:\n%s",
          out);
    CHECK(steps == 6, "%d steps profiled, expected 6 (the first warms up)", steps);
    CHECK(comp > 0 && comp <= ex * 1.001 + 0.002, "compute %.3f ms, executor %.3f ms per step", comp, ex);
    CHECK(fabs(ops - comp) <= 0.002 + 0.0005 * 30, "ops sum to %.3f ms, compute %.3f ms", ops, comp);
    CHECK(coll == 0 && kinds == 0 && poll == 0, "one process: collectives %.3f ms over %d kinds, polling %.3f ms", coll,
          kinds, poll);
    CHECK(contains(out, "  op matmul ") && contains(out, "  node "), "op and node lines:\n%s", out);
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    snprintf(args, sizeof args, "plan --model '%s' --strategy zero --devices 2 --batch 32 -o '%s'", cfg, plan);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "plan: exit %d:\n%s", rc, out);
    const char *argv[] = {g_bin, "train", "--model", cfg, "--data", "synthetic:mlp", "--steps", "5", "--batch", "32",
                          "--plan", plan, "--profile", "on", NULL};
    mpi_world wd = {.n = 2, .argv = argv};
    mpi_run_world(&wd, check_tmpdir(), 120);
    CHECK(wd.status == 0, "2 ranks: exit %d", wd.status);
    for (int r = 0; r < 2 && wd.status == 0; r++) {
        CHECK(read_profile(wd.err, r, &steps, &ex, &comp, &coll, &poll, &ops, &colls, &kinds), "no profile of rank %d",
              r);
        CHECK(steps == 4 && kinds == 2 && coll > 0, "rank %d: %d steps, %d kinds of collective, %.3f ms", r, steps,
              kinds, coll);
        CHECK(fabs(colls - coll) <= 0.002 + 0.0005 * 3, "rank %d: collectives sum to %.3f ms of %.3f", r, colls, coll);
        CHECK(poll >= 0 && comp + coll + poll <= ex * 1.001 + 0.01,
              "rank %d: compute %.3f + collectives %.3f + polling %.3f ms over the executor's %.3f", r, comp, coll, poll,
              ex);
    }
    if (check_cur_failed) mpi_print_tail("stderr", wd.err, 40);
    mpi_world_free(&wd);
    unlink(plan);
}

static void test_help_and_graph(void) {
    char out[16384];
    int rc = run_adtrain("train --help", out, sizeof out);
    CHECK(rc == 0 && contains(out, "--steps") && contains(out, "--eval-every") && contains(out, "synthetic:text"),
          "%d %s", rc, out);
    const char *dump = check_tmp_path("g.json");
    char args[1024];
    snprintf(args, sizeof args, "graph --model configs/gpt-tiny.json --batch 2 -o '%s'", dump);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && contains(out, "parameters") && contains(out, "FLOPs/step") && contains(out, "peak"), "%d %s", rc,
          out);
    FILE *f = fopen(dump, "r");
    CHECK(f != NULL, "no %s", dump);
    if (f) {
        CHECK(fgetc(f) == '{', "JSON dump");
        fclose(f);
    }
    unlink(dump);
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("cli")) return 2;
    RUN(test_binary_exists);
    RUN(test_train_synthetic_text);
    RUN(test_train_synthetic_mlp);
    RUN(test_train_families);
    RUN(test_bad_flags);
    RUN(test_profile);
    RUN(test_help_and_graph);
    const char *leaves[] = {"tiny.json", "mlp.json"};
    check_tmpdir_remove(leaves, 2);
    return check_finish();
}
