/*
 * test_cli_plan.c - `adtrain plan` end to end, through the binary: plans for every strategy kind
 * are written and load back against the graph they name; the printed boxing of a data-parallel
 * MLP equals the ring all-reduce volume of its parameters in closed form; every bad flag or a
 * strategy that cannot apply exits 2 with a message naming the flag and the reason.
 */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "adtrain/adtrain.h"
#include "cli_run.h"

static const char *g_mlp, *g_1t;

#define A100 "configs/clusters/a100-80g-dgx.json"

static void test_plans_written(void) {
    static const char *const args[] = {
        "--devices 2 --strategy dp",
        "--devices 4 --strategy dp=2,tp=2 --batch 8",
        "--devices 3 --strategy zero --batch 6 --optimizer sgd-momentum",
        "--devices 4 --strategy dp=2,pp=2 --batch 8 --microbatches 2",
    };
    const char *plan = check_tmp_path("plan.json");
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        char cmd[1024], out[65536];
        snprintf(cmd, sizeof cmd, "plan %s -o '%s'", args[i], plan);
        int rc = run_adtrain(cmd, out, sizeof out);
        CHECK(rc == 0, "'%s': exit %d:\n%s", cmd, rc, out);
        CHECK(contains(out, "strategy ") && contains(out, "mesh ") && contains(out, "layer 1 (stage 0)") &&
                  contains(out, "wrote"),
              "'%s': summary:\n%s", cmd, out);
        adt_plan p;
        adt_graph *g = NULL;
        rc = adt_plan_load(&p, plan);
        if (!rc) rc = adt_plan_build_graph(&p, NULL, &g);
        if (!rc) rc = adt_plan_bind(&p, g);
        CHECK(rc == ADT_OK, "'%s': the written plan does not load: %s", cmd, adt_error_message());
        adt_graph_free(g);
        adt_plan_free(&p);
        unlink(plan);
    }
}

/* Data parallel on n devices: one ring all-reduce per parameter gradient, 2(n-1)/n of its bytes
 * each, and nothing else. */
static void test_dp_bytes(void) {
    char cmd[1024], out[65536];
    snprintf(cmd, sizeof cmd, "plan --model '%s' --devices 4 --strategy dp --batch 8", g_mlp);
    int rc = run_adtrain(cmd, out, sizeof out);
    CHECK(rc == 0, "exit %d:\n%s", rc, out);
    /* sizes 7-9-5: weights 9x7, 5x9 and biases 9, 5 */
    int64_t params = 9 * 7 + 9 + 5 * 9 + 5;
    double bytes = 2.0 * 3.0 / 4.0 * 4.0 * (double)params;
    int steps = 0;
    double got = 0;
    const char *l = strstr(out, "            all_reduce");
    CHECK(l && sscanf(l, " all_reduce %d steps %lf B", &steps, &got) == 2, "no all_reduce line:\n%s", out);
    CHECK(steps == 4 && fabs(got - bytes) < 1, "all_reduce: %d steps, %g B; expected 4 steps, %g B", steps, got, bytes);
    CHECK(!contains(out, "all_gather") && !contains(out, "reduce_scatter") && !contains(out, "all_to_all"),
          "other collectives in a data-parallel plan:\n%s", out);
}

static void test_bad_input(void) {
    static const struct { const char *args, *want; } bad[] = {
        {"plan --strategy dp", "--devices: missing"},
        {"plan --devices 2", "--strategy: missing"},
        {"plan --devices 0 --strategy dp", "--devices: expected an integer in [1, 1048576], got '0'"},
        {"plan --devices 2 --strategy dp --batch x", "--batch: expected an integer"},
        {"plan --devices 2 --strategy dp --optimizer adam", "--optimizer: expected 'adamw', 'sgd' or 'sgd-momentum'"},
        {"plan --devices 2 --strategy dp --frobnicate 1", "unknown flag '--frobnicate'"},
        {"plan --devices 2 --strategy dp stray", "unexpected argument 'stray'"},
        {"plan --devices 6 --strategy dp=2,tp=2", "--strategy dp=2,tp=2 on --devices 6: strategy 'dp=2,tp=2': the degrees "
                                                  "multiply to 4 devices, but 6 are given"},
        {"plan --devices 8 --strategy pp", "pp=8 stages, but the gpt model has only 4 layers"},
        {"plan --devices 4 --strategy dp --batch 2", "does not split over dp=4"},
        {"plan --devices 2 --strategy dp --batch 6 --microbatches 4", "--microbatches: 4 does not divide --batch 6"},
        {"plan --devices 2 --strategy tp=2,zero", "expected dp >= 2"},
        {"plan --devices 2 --strategy dp --model /no/such.json", "--model: /no/such.json: cannot open model config"},
        {"plan --devices 2 --strategy dp --devices", "--devices: missing value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[16384];
        int rc = run_adtrain(bad[i].args, out, sizeof out);
        CHECK(rc == 2 && contains(out, "adtrain plan: ") && contains(out, bad[i].want), "'%s': exit %d, output '%s', "
              "expected exit 2 and '%s'", bad[i].args, rc, out, bad[i].want);
    }
    char out[8192];
    CHECK(run_adtrain("plan --help", out, sizeof out) == 0 && contains(out, "usage: adtrain plan"), "%s", out);
    snprintf(out, sizeof out, "plan --devices 2 --strategy dp -o '%s/no/dir/p.json'", check_tmpdir());
    char res[16384];
    CHECK(run_adtrain(out, res, sizeof res) == 1 && contains(res, "-o: ") && contains(res, "cannot write the plan"),
          "%s", res);
}


/* A 1T-parameter GPT at cluster scale, from its shapes: the JSON names the plan and the
 * prediction, Megatron-LM's configuration is priced as given, the searched plan is at least as
 * fast, and a GPT this large goes to the shape-level planner without its flags. */
static cJSON *plan_json(const char *args, int *rc) {
    static char out[65536];
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "plan --model '%s' --cluster " A100 " --devices 3072 --batch 3072 %s --json", g_1t, args);
    *rc = run_adtrain(cmd, out, sizeof out);
    cJSON *j = *rc == 0 ? cJSON_Parse(out) : NULL;
    CHECK(j, "'%s': exit %d:\n%s", cmd, *rc, out);
    return j;
}

static double num(const cJSON *j, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static const char *str(const cJSON *j, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, a), b);
    return cJSON_IsString(x) ? x->valuestring : "";
}

static void test_shapes_1t(void) {
    int rc;
    cJSON *own = plan_json("--strategy tp=8,pp=64 --precision bf16 --recompute full --micro-batch 1", &rc);
    cJSON *au = plan_json("--strategy auto --precision bf16", &rc);
    cJSON *bare = plan_json("--strategy dp=6,tp=8,pp=64", &rc);
    if (own && au && bare) {
        CHECK(num(own, "plan", "dp") == 6 && num(own, "plan", "tp") == 8 && num(own, "plan", "pp") == 64 &&
                  num(own, "plan", "micro_batch") == 1 && num(own, "plan", "virtual_stages") == 1 &&
                  !strcmp(str(own, "plan", "precision"), "bf16") && !strcmp(str(own, "plan", "recompute"), "full"),
              "the given plan is reported as given");
        CHECK(num(own, "predicted_step_s", NULL) > 0 && num(own, "peak_mem_bytes", NULL) > 0 &&
                  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(own, "feasible")) && num(own, "microbatches", NULL) == 512,
              "prediction fields");
        /* TFLOP/s per device = the paper's FLOPs / step / devices */
        double F = 96.0 * 3072 * 2048 * 128 * 25600.0 * 25600 * (1 + 2048 / (6.0 * 25600) + 51200 / (16.0 * 128 * 25600));
        CHECK_CLOSE(num(own, "tflops_per_device", NULL), F / num(own, "predicted_step_s", NULL) / 3072 / 1e12, 1e-6, 0);
        CHECK_CLOSE(num(own, "mfu", NULL), 0.75 * num(own, "tflops_per_device", NULL) / 312, 1e-6, 0); /* A100 bf16 */
        CHECK(num(au, "predicted_step_s", NULL) <= num(own, "predicted_step_s", NULL) &&
                  num(au, "peak_mem_bytes", NULL) <= 85899345920.0 && num(au, "search_s", NULL) < 10 &&
                  num(au, "plans_priced", NULL) > 100,
              "auto: %g s vs %g s, searched in %g s", num(au, "predicted_step_s", NULL), num(own, "predicted_step_s", NULL),
              num(au, "search_s", NULL));
        CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(bare, "planner")->valuestring, "shapes") &&
                  !strcmp(str(bare, "plan", "recompute"), "none") && !strcmp(str(bare, "plan", "precision"), "bf16"),
              "a 1T GPT without the flags: the shape-level planner, the cluster's dtype, no recomputation");
    }
    cJSON_Delete(own), cJSON_Delete(au), cJSON_Delete(bare);
}

static void test_shapes_bad_input(void) {
    char m[600];
    snprintf(m, sizeof m, "plan --model '%s' --cluster " A100 " --devices 3072 --batch 3072", g_1t);
    static const struct { const char *args, *want; } bad[] = {
        {" --strategy auto --precision fp8", "--precision: expected 'f32', 'bf16' or 'f16', got 'fp8'"},
        {" --strategy auto --recompute some", "--recompute: expected 'none', 'selective' or 'full', got 'some'"},
        {" --strategy auto --micro-batch 0", "--micro-batch: expected an integer"},
        {" --strategy tp=8,pp=64 --virtual-stages 3", "--virtual-stages: pp=64 x 3 chunks must divide n_layer (128)"},
        {" --strategy tp=8,pp=64 --micro-batch 5", "--micro-batch: dp=6 x micro-batch 5 must divide --batch 3072"},
        {" --strategy dp=5,tp=8,pp=64", "--strategy: dp x tp x pp = 2560, but --devices is 3072"},
        {" --strategy tp=7,pp=64", "--strategy: the given degrees (448 devices) do not divide --devices 3072"},
        {" --strategy tp=8,pp=64,zero=4", "--strategy: zero=4, expected 0, 1, 2 or 3"},
        {" --strategy tp=8,pp=64,ep=2", "--strategy: 'ep' in 'tp=8,pp=64,ep=2', expected dp, tp, pp or zero"},
        {" --strategy auto --precision bf16 -o /tmp/x.json", "-o cannot act with the shape-level planner"},
        {" --strategy auto --microbatches 4", "--microbatches cannot act with the shape-level planner"},
        {" --strategy auto --mem-limit 1e9", "--strategy auto: no plan of 3072 devices fits"},
        {" --strategy auto --precision f16 --devices 100000", "--devices: 100000, but the cluster 'a100-80g-dgx' has 4096"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[1200], out[16384];
        snprintf(cmd, sizeof cmd, "%s%s", m, bad[i].args);
        int rc = run_adtrain(cmd, out, sizeof out);
        CHECK(rc == 2 && contains(out, "adtrain plan: ") && contains(out, bad[i].want),
              "'%s': exit %d, output '%s', expected exit 2 and '%s'", cmd, rc, out, bad[i].want);
    }
    char cmd[1200], out[16384];
    snprintf(cmd, sizeof cmd, "plan --model '%s' --devices 4 --strategy dp --precision bf16", g_mlp);
    CHECK(run_adtrain(cmd, out, sizeof out) == 2 && contains(out, "--precision: the shape-level planner prices GPT models"),
          "%s", out);
    snprintf(cmd, sizeof cmd, "plan --model '%s' --devices 4 --strategy dp --recompute full", g_1t);
    CHECK(run_adtrain(cmd, out, sizeof out) == 2 && contains(out, "--recompute goes with --cluster"), "%s", out);
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("cli_plan")) return 2;
    g_mlp = check_tmp_path("mlp.json");
    static char mlp[512];
    snprintf(mlp, sizeof mlp, "%s", g_mlp);
    g_mlp = mlp;
    write_text(g_mlp, "{\"type\":\"mlp\",\"sizes\":[7,9,5],\"activation\":\"relu\"}\n");
    static char big[512];
    snprintf(big, sizeof big, "%s", check_tmp_path("gpt-1t.json"));
    g_1t = big;
    write_text(g_1t, "{\"type\":\"gpt\",\"vocab_size\":51200,\"n_ctx\":2048,\"n_layer\":128,\"n_embd\":25600,"
                     "\"n_head\":160}\n");
    RUN(test_plans_written);
    RUN(test_dp_bytes);
    RUN(test_bad_input);
    RUN(test_shapes_1t);
    RUN(test_shapes_bad_input);
    const char *leaves[] = {"mlp.json", "plan.json", "gpt-1t.json"};
    check_tmpdir_remove(leaves, 3);
    return check_finish();
}
