/*
 * main.c - the `adtrain` command: dispatches to subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "adtrain/exec.h"
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
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("adtrain %s\n", ADT_VERSION);
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
