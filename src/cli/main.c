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
    fprintf(stderr, "adtrain: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
