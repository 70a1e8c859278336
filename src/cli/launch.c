/*
 * launch.c - `adtrain launch`: torchrun's habits on top of the elastic runtime. On one machine
 * (--standalone, the default) it runs a master and an agent in this process; with
 * --rdzv-endpoint HOST:PORT every node runs the same command: the one whose endpoint is free
 * and local starts the master there, the others join it as agents.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "cli.h"

static int launch_has_value(const char *name) {
    return cli_master_has_value(name) || cli_agent_has_value(name) || !strcmp(name, "--rdzv-endpoint") ||
           !strcmp(name, "--rdzv-id") || !strcmp(name, "--rdzv-backend") || !strcmp(name, "--monitor-interval");
}

static void launch_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain launch [--nproc-per-node N] [--nnodes MIN:MAX] [--rdzv-endpoint HOST:PORT]\n"
            "                      [--standalone] [--max-restarts R] [--job DIR] [options] -- CMD [ARGS...]\n"
            "\n"
            "Starts an elastic job like torchrun. --standalone (the default without --rdzv-endpoint):\n"
            "a master on a free loopback port and one agent, in this process. --rdzv-endpoint HOST:PORT\n"
            "(run the same command on every node): the node where HOST:PORT is local and no master\n"
            "answers yet starts the master there; every node runs an agent.\n"
            "\n"
            "  --job DIR               the job directory: the master's state, the ledger, the plans, and the\n"
            "                          workers' elastic checkpoints (DIR/checkpoints, the job spec's\n"
            "                          checkpoint_dir, the workers' default); default: a new\n"
            "                          $TMPDIR/adtrain-job-XXXXXX, never the directory a run starts from\n"
            "  --rdzv-id ID            the job's id (TORCHELASTIC_RUN_ID)\n"
            "  --token T               the job token (required when HOST is not loopback)\n"
            "agent:\n%s"
            "master:\n%s%s"
            "\n"
            "exit status: 0 the job finished, 1 it failed, 2 bad flag\n",
            cli_agent_flags_help, cli_master_flags_help, cli_replan_flags_help);
}

/* Is a master answering at hostport? */
static int master_answers(const char *hostport, const char *token) {
    int status;
    char *reply;
    int rc = adt_master_call(hostport, token, "GET", "/v1/job", NULL, 1.0, &status, &reply);
    free(reply);
    return rc == ADT_OK && status == 200;
}

typedef struct launch_opts {
    cli_master_opts mo;
    cli_agent_opts ao;
    const char *endpoint;
    int standalone;
} launch_opts;

static int launch_apply(void *ctx, const char *f, const char *v) {
    launch_opts *o = ctx;
    if (!strcmp(f, "--rdzv-endpoint"))
        o->endpoint = v;
    else if (!strcmp(f, "--standalone"))
        o->standalone = 1;
    else if (!strcmp(f, "--rdzv-id"))
        o->mo.cfg.run_id = v;
    else if (!strcmp(f, "--rdzv-backend")) {
        if (strcmp(v, "c10d") && strcmp(v, "static") && strcmp(v, "adtrain"))
            return cli_fail("launch", -1, "--rdzv-backend: only the built-in master (c10d, static), got '%s'", v);
    } else if (!strcmp(f, "--monitor-interval")) {
        double d; /* accepted for torchrun's sake: deaths are seen at once here */
        if (cli_double("launch", f, v, 0, 3600, &d)) return -1;
    } else if (!strcmp(f, "--token") || !strcmp(f, "--token-file")) {
        if (cli_master_flag("launch", &o->mo, f, v) < 0) return -1;
        snprintf(o->ao.token, sizeof o->ao.token, "%s", o->mo.token);
        o->ao.cfg.token = o->ao.token;
    } else {
        int k = cli_agent_flag("launch", &o->ao, f, v);
        return k ? k : cli_master_flag("launch", &o->mo, f, v);
    }
    return 1;
}

/* At the job's end, what adapted, from the master's events: each world (its size and why it
 * formed), the plan made for it, the straggler policy's splits, deaths, leaves and joins, and how
 * long each new world took to its first step. */
static void print_adaptation(adt_master *m) {
    adt_http_request rq = {.method = "GET", .path = "/v1/events"};
    adt_http_reply rp = {0};
    adt_master_handle(m, &rq, &rp);
    if (rp.status != 200 || !rp.body) {
        adt_http_reply_free(&rp);
        return;
    }
    static const char *const shown[] = {"generation", "replan", "straggler_action", "death", "leave", "join",
                                        "first_step", "job_done", "job_failed", NULL};
    int worlds = 0, actions = 0, deaths = 0;
    fprintf(stderr, "adtrain launch: what adapted:\n");
    for (char *line = rp.body, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        cJSON *e = cJSON_Parse(line);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(e, "kind"), *d = cJSON_GetObjectItemCaseSensitive(e, "detail"),
                    *src = cJSON_GetObjectItemCaseSensitive(e, "source");
        int known = 0;
        for (int i = 0; cJSON_IsString(k) && shown[i]; i++) known |= !strcmp(k->valuestring, shown[i]);
        /* the master's own record of each event: the agents' copies repeat it */
        if (known && (!cJSON_IsString(src) || !strcmp(src->valuestring, "master"))) {
            worlds += !strcmp(k->valuestring, "generation");
            actions += !strcmp(k->valuestring, "straggler_action");
            deaths += !strcmp(k->valuestring, "death");
            fprintf(stderr, "  %-16s %s\n", k->valuestring, cJSON_IsString(d) ? d->valuestring : "");
        }
        cJSON_Delete(e);
    }
    fprintf(stderr, "adtrain launch: %d world%s, %d straggler action%s, %d death%s\n", worlds, worlds == 1 ? "" : "s",
            actions, actions == 1 ? "" : "s", deaths, deaths == 1 ? "" : "s");
    adt_http_reply_free(&rp);
}

int cli_launch(int argc, char **argv) {
    launch_opts lo = {0};
    cli_master_defaults(&lo.mo);
    cli_agent_defaults(&lo.ao);
    int i = 1, r = cli_parse("launch", argc, argv, &i, launch_has_value, launch_apply, &lo, launch_usage);
    if (r) return r == 1 ? 0 : 2;
    cli_master_opts mo = lo.mo;
    cli_agent_opts ao = lo.ao;
    const char *endpoint = lo.endpoint;
    int standalone = lo.standalone;
    if (i >= argc) return cli_fail("launch", 2, "no worker command: give it after '--'");
    if (standalone && endpoint) return cli_fail("launch", 2, "--standalone and --rdzv-endpoint exclude each other");
    if (mo.cfg.straggler_policy && strcmp(mo.cfg.straggler_policy, "off") && !endpoint && ao.cfg.nproc == 1)
        return cli_fail("launch", 2, "--straggler-policy %s with --nproc-per-node 1 on one node: one rank has no peer "
                        "to balance against; expected --nproc-per-node 2 or more, or no policy",
                        mo.cfg.straggler_policy);
    if (cli_master_finish("launch", &mo)) return 2;
    ao.cfg.argv = (const char *const *)argv + i;
    ao.cfg.stop_fd = cli_stop_fd();

    /* the master: here, unless one already answers at the endpoint */
    adt_master *m = NULL;
    char master_addr[300], job_dir[4096];
    if (!endpoint || !master_answers(endpoint, ao.cfg.token)) {
        if (!mo.cfg.job_dir) {
            const char *tmp = getenv("TMPDIR");
            snprintf(job_dir, sizeof job_dir, "%s/adtrain-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
            if (!mkdtemp(job_dir)) {
                adt_elastic_job_spec_free(&mo.spec);
                return cli_fail("launch", 1, "%s: %s", job_dir, strerror(errno));
            }
            mo.cfg.job_dir = job_dir;
        }
        mo.cfg.listen = endpoint ? endpoint : "127.0.0.1:0";
        if (!mo.cfg.join_wait_s && !endpoint) mo.cfg.join_wait_s = -1; /* one node: no one else to wait for */
        int rc = adt_master_create(&m, &mo.cfg);
        if (!rc && (rc = adt_master_start(m))) adt_master_free(m), m = NULL;
        if (rc) {
            adt_elastic_job_spec_free(&mo.spec);
            return cli_fail("launch", rc == ADT_ERR_ARG ? 2 : 1, "%s", adt_error_message());
        }
        char host[256];
        snprintf(host, sizeof host, "127.0.0.1");
        if (endpoint) {
            const char *colon = strrchr(endpoint, ':');
            snprintf(host, sizeof host, "%.*s", (int)(colon - endpoint), endpoint);
            if (!strcmp(host, "0.0.0.0")) snprintf(host, sizeof host, "127.0.0.1");
        }
        snprintf(master_addr, sizeof master_addr, "%s:%d", host, adt_master_port(m));
        fprintf(stderr, "adtrain launch: master on %s, job directory %s\n", master_addr, mo.cfg.job_dir);
    } else {
        snprintf(master_addr, sizeof master_addr, "%s", endpoint);
        fprintf(stderr, "adtrain launch: joining the master on %s\n", master_addr);
    }
    ao.cfg.master = master_addr;
    int rc = adt_agent_run(&ao.cfg);
    int code = rc ? 1 : 0;
    if (rc) cli_fail("launch", 1, "%s", adt_error_message());
    if (m) {
        if (adt_master_job_state(m) != ADT_JOB_DONE) code = 1;
        print_adaptation(m);
        /* the other nodes' agents learn the job's end from this master: give them time */
        if (endpoint) usleep((useconds_t)(mo.linger_s * 1e6));
        adt_master_free(m);
    }
    adt_elastic_job_spec_free(&mo.spec);
    return code;
}
