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

#include "adtrain/adtrain.h"
#include "cli_run.h"

static const char *g_mlp;

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

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("cli_plan")) return 2;
    g_mlp = check_tmp_path("mlp.json");
    static char mlp[512];
    snprintf(mlp, sizeof mlp, "%s", g_mlp);
    g_mlp = mlp;
    write_text(g_mlp, "{\"type\":\"mlp\",\"sizes\":[7,9,5],\"activation\":\"relu\"}\n");
    RUN(test_plans_written);
    RUN(test_dp_bytes);
    RUN(test_bad_input);
    const char *leaves[] = {"mlp.json", "plan.json"};
    check_tmpdir_remove(leaves, 2);
    return check_finish();
}
