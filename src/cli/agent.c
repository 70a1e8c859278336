/*
 * agent.c - `adtrain agent`: the per-node agent of an elastic job (adtrain/elastic.h). It
 * registers with the master, runs the ranks each generation gives this node (MPI worlds started
 * through PMI-1, no mpiexec), reports their deaths and stops them when told to. SIGINT/SIGTERM
 * once: leave the job after the workers stop at a step boundary; twice: at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "cli.h"

const char cli_agent_flags_help[] =
    "  --nproc-per-node N      ranks this node may run (default 1)\n"
    "  --bind-to core|none     pin each local rank to one CPU (default none)\n"
    "  --node-id ID            this node's name in the job, the blacklist's unit (default: host name)\n"
    "  --host NAME             host name to report (default: gethostname)\n"
    "  --master-grace S        without the master for S seconds, stop the workers (default 10)\n"
    "  --master-timeout S      ... and give up after S seconds (default 60)\n"
    "  --kill-grace S          SIGTERM to SIGKILL when stopping workers (default 0.5)\n"
    "  --no-pmi                the command is not an MPI program: no PMI, a rank succeeds by\n"
    "                          exiting 0\n"
    "  --no-prefix             workers write straight to this stdout/stderr (default: lines are\n"
    "                          prefixed with [rank R])\n";

static const char *const k_value_flags[] = {
    "--master", "--token",        "--token-file",     "--nproc-per-node", "--bind-to", "--node-id",
    "--host",   "--master-grace", "--master-timeout", "--kill-grace",     NULL};

int cli_agent_has_value(const char *name) { return cli_in_list(name, k_value_flags); }

void cli_agent_defaults(cli_agent_opts *o) {
    memset(o, 0, sizeof *o);
    o->cfg.nproc = 1;
    o->cfg.prefix_output = 1;
    o->cfg.stop_fd = -1;
    const char *t = getenv("ADT_JOB_TOKEN");
    if (t && *t) snprintf(o->token, sizeof o->token, "%s", t), o->cfg.token = o->token;
}

int cli_agent_flag(const char *cmd, cli_agent_opts *o, const char *f, const char *v) {
    adt_agent_config *c = &o->cfg;
    long x;
    if (!strcmp(f, "--master"))
        c->master = v;
    else if (!strcmp(f, "--token") || !strcmp(f, "--token-file"))
        return cli_token_flag(cmd, f, v, o->token, sizeof o->token, &c->token);
    else if (!strcmp(f, "--nproc-per-node")) {
        if (cli_long(cmd, f, v, 1, 4096, &x)) return -1;
        c->nproc = (int)x;
    } else if (!strcmp(f, "--bind-to")) {
        if (!strcmp(v, "core"))
            c->bind = ADT_BIND_CORE;
        else if (!strcmp(v, "none"))
            c->bind = ADT_BIND_NONE;
        else
            return cli_fail(cmd, -1, "--bind-to: expected core or none, got '%s'", v);
    } else if (!strcmp(f, "--node-id"))
        c->node_id = v;
    else if (!strcmp(f, "--host"))
        c->host = v;
    else if (!strcmp(f, "--master-grace")) {
        if (cli_double(cmd, f, v, 0.1, 86400, &c->master_grace_s)) return -1;
    } else if (!strcmp(f, "--master-timeout")) {
        if (cli_double(cmd, f, v, 0.1, 86400, &c->master_timeout_s)) return -1;
    } else if (!strcmp(f, "--kill-grace")) {
        if (cli_double(cmd, f, v, 0, 3600, &c->kill_grace_s)) return -1;
        if (c->kill_grace_s == 0) c->kill_grace_s = -1; /* SIGKILL at once */
    } else if (!strcmp(f, "--no-prefix"))
        c->prefix_output = 0;
    else if (!strcmp(f, "--no-pmi"))
        c->no_pmi = 1;
    else
        return 0;
    return 1;
}

static void agent_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain agent --master HOST:PORT [--nproc-per-node N] [options] -- CMD [ARGS...]\n"
            "\n"
            "Runs this node's part of an elastic job: registers with the master, starts the ranks each\n"
            "generation assigns here as CMD (an MPI program: MPICH finds its peers through the agent,\n"
            "no mpiexec), reports deaths, stops them when told. Workers get RANK, LOCAL_RANK,\n"
            "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT (the master's API),\n"
            "TORCHELASTIC_RESTART_COUNT, ADT_MASTER, ADT_GENERATION, ADT_JOB_TOKEN.\n"
            "SIGINT/SIGTERM: leave after the workers stop at a step boundary; again: leave at once.\n"
            "\n"
            "  --master HOST:PORT      the master (adtrain master)\n"
            "  --token T, --token-file F   the job token (default $ADT_JOB_TOKEN)\n"
            "%s"
            "\n"
            "exit status: 0 the job finished, 1 it failed, the agent left or lost the master, 2 bad flag\n",
            cli_agent_flags_help);
}

static int agent_apply(void *ctx, const char *f, const char *v) { return cli_agent_flag("agent", ctx, f, v); }

int cli_agent(int argc, char **argv) {
    cli_agent_opts o;
    cli_agent_defaults(&o);
    int i = 1, r = cli_parse("agent", argc, argv, &i, cli_agent_has_value, agent_apply, &o, agent_usage);
    if (r) return r == 1 ? 0 : 2;
    if (!o.cfg.master) return cli_fail("agent", 2, "--master HOST:PORT is required");
    if (i >= argc) return cli_fail("agent", 2, "no worker command: give it after '--'");
    o.cfg.argv = (const char *const *)argv + i;
    o.cfg.stop_fd = cli_stop_fd();
    int rc = adt_agent_run(&o.cfg);
    if (rc) return cli_fail("agent", rc == ADT_ERR_ARG ? 2 : 1, "%s", adt_error_message());
    return 0;
}
