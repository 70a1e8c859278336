/*
 * main.c - the `adtrain` command: dispatches to subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"
#include "adtrain/gemm.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: adtrain <command> [options]\n"
            "\n"
            "commands:\n"
            "  train     train a model (adtrain train --help)\n"
            "  graph     build a model's training graph and dump it as JSON or DOT\n"
            "  plan      make an expert parallel plan (dp, zero, tp, pp) and write it as a plan file\n"
            "  calibrate measure this machine (kernel FLOP/s, memory, MPI all-reduce) into a cluster file\n"
            "  ckpt      export or describe a distributed checkpoint (adtrain ckpt --help)\n"
            "  launch    run an elastic job (master + agent on this machine, torchrun-like)\n"
            "  master    serve an elastic job's master API\n"
            "  agent     run this node's workers of an elastic job\n"
            "  status    print a running job: generation, world, agents, workers, data\n"
            "  scale     change the world's size at the next step boundary\n"
            "  audit     check a job's data ledger: every sample trained exactly once\n"
            "  version   print the version\n");
}

int main(int argc, char **argv) {
    adt_blas_fix_coretype(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    int forced, per_shape;
    if (adt_gemm_env(&forced, &per_shape)) { /* refused up front, whatever the command */
        fprintf(stderr, "adtrain: %s\n", adt_error_message());
        return 2;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("adtrain %s\n", ADT_VERSION);
        if (adt_gemm_init()) {
            fprintf(stderr, "adtrain: %s\n", adt_error_message());
            return 2;
        }
        const adt_gemm_info *gi = adt_gemm_get_info();
        printf("gemm %s: %s (%s)\n", adt_gemm_backend_name(), adt_gemm_backend_version(gi->backend),
               adt_gemm_reason());
        char routes[1100];
        if (gi->per_shape && gi->cache_path[0] && !adt_gemm_routes_path(routes, sizeof routes, gi->cache_path))
            printf("gemm routes: %s (each other product shape runs the backend its first product on this machine "
                   "timed fastest)\n", routes);
        if (!gi->forced) { /* the probe's evidence: its estimate of each backend on the two steps */
            printf("gemm probe: ms per GFLOP of the GPT-S and MLP steps' products (plain and accumulating as the "
                   "steps run them), summed:");
            for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
                if (gi->check_ok[b]) printf(" %s %.2f", adt_gemm_backend_str(b), gi->score[b] * 1e3);
                else printf(" %s failed its check", adt_gemm_backend_str(b));
            printf("\n");
        }
        for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
            if (b != (int)gi->backend) printf("gemm %s: %s (available)\n", adt_gemm_backend_str(b), adt_gemm_backend_version(b));
        return 0;
    }
    if (!strcmp(cmd, "train")) return cli_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "graph")) return cli_graph(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return cli_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "ckpt")) return cli_ckpt(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch")) return cli_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "master")) return cli_master(argc - 1, argv + 1);
    if (!strcmp(cmd, "agent")) return cli_agent(argc - 1, argv + 1);
    if (!strcmp(cmd, "status")) return cli_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "scale")) return cli_scale(argc - 1, argv + 1);
    if (!strcmp(cmd, "audit")) return cli_audit(argc - 1, argv + 1);
    fprintf(stderr, "adtrain: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
