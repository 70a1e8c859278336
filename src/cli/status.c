/*
 * status.c - `adtrain status` (the job, its generation, agents, workers and data progress as
 * tables) and `adtrain scale` (a planned change of the world's size), both clients of a running
 * master's API.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "cli.h"

typedef struct client_opts {
    const char *master;
    char token[300];
    const char *tok;
    int json;
} client_opts;

static int client_has_value(const char *name) {
    return !strcmp(name, "--master") || !strcmp(name, "--token") || !strcmp(name, "--token-file") ||
           !strcmp(name, "--workers") || !strcmp(name, "--nodes");
}

/* --master, --token, --token-file, --json; 1 if the flag was one of them. */
static int client_flag(const char *cmd, client_opts *o, const char *f, const char *v) {
    if (!strcmp(f, "--master"))
        o->master = v;
    else if (!strcmp(f, "--token") || !strcmp(f, "--token-file"))
        return cli_token_flag(cmd, f, v, o->token, sizeof o->token, &o->tok);
    else if (!strcmp(f, "--json"))
        o->json = 1;
    else
        return 0;
    return 1;
}

static void client_defaults(client_opts *o) {
    static char addr[64];
    memset(o, 0, sizeof *o);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ADT_MASTER_DEFAULT_PORT);
    o->master = getenv("ADT_MASTER") && *getenv("ADT_MASTER") ? getenv("ADT_MASTER") : addr;
    const char *t = getenv("ADT_JOB_TOKEN");
    if (t && *t) snprintf(o->token, sizeof o->token, "%s", t), o->tok = o->token;
}

/* GET/POST path; the parsed reply of a 200, else NULL after printing why. */
static cJSON *fetch(const char *cmd, const client_opts *o, const char *method, const char *path, const char *body) {
    int status;
    char *reply;
    if (adt_master_call(o->master, o->tok, method, path, body, 5.0, &status, &reply)) {
        cli_fail(cmd, 1, "%s", adt_error_message());
        return NULL;
    }
    cJSON *j = cJSON_Parse(reply);
    if (status != 200 || !j) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        cli_fail(cmd, 1, "%s %s: %d %s", method, path, status, cJSON_IsString(e) ? e->valuestring : reply);
        cJSON_Delete(j);
        j = NULL;
    }
    free(reply);
    return j;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsTrue(v) ? 1 : 0;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static void print_status(const cJSON *job, const cJSON *agents, const cJSON *workers) {
    printf("job %s: %s; generation %.0f (%s%s%s)\n", str(job, "run_id"), str(job, "job_state"), num(job, "generation"),
           str(job, "state"), str(job, "reason")[0] ? ": " : "", str(job, "reason"));
    printf("world: %.0f ranks, %.0f replicas; restarts %.0f of %.0f allowed; planned changes %.0f",
           num(job, "world_size"), num(job, "replicas"), num(job, "restarts"), num(job, "max_restarts"),
           num(job, "planned_changes"));
    if (cJSON_GetObjectItemCaseSensitive(job, "last_recovery_s"))
        printf("; last recovery %.2f s", num(job, "last_recovery_s"));
    printf("\n");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(job, "plan");
    if (cJSON_IsObject(pl)) {
        printf("plan of generation %.0f: %s on mesh %s", num(pl, "generation"), str(pl, "strategy"), str(pl, "mesh"));
        if (num(pl, "predicted_step_s") > 0) printf(", predicted %.4f ms/step", num(pl, "predicted_step_s") * 1e3);
        printf("; planned in %.1f ms%s%s\n", num(pl, "planning_s") * 1e3, str(pl, "note")[0] ? "; " : "",
               str(pl, "note"));
    }
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(job, "ledger");
    if (cJSON_IsObject(l)) {
        double done = num(l, "committed_steps"), total = num(l, "total_steps");
        printf("data: %.0f of %.0f steps committed (%.1f%%)%s%s; samples: %.0f waiting, %.0f leased, %.0f uncommitted, "
               "%.0f committed, %.0f dead-lettered; %.0f active leases%s\n",
               done, total, total > 0 ? 100 * done / total : 0, str(l, "checkpoint")[0] ? ", checkpoint " : "",
               str(l, "checkpoint"), num(l, "pool_samples"), num(l, "leased_samples"), num(l, "uncommitted_samples"),
               num(l, "committed_samples"), num(l, "dead_samples"), num(l, "active_leases"),
               num(l, "done") ? " (all consumed)" : "");
    } else {
        printf("data: no data job declared yet\n");
    }
    printf("\n%-6s %-16s %-16s %5s %-6s %-8s %8s %9s %9s\n", "AGENT", "NODE", "HOST", "SLOTS", "STATE", "IN WORLD",
           "FAILURES", "COOLDOWN", "LAST SEEN");
    for (const cJSON *a = agents ? agents->child : NULL; a; a = a->next)
        printf("%-6.0f %-16.16s %-16.16s %5.0f %-6s %-8s %8.0f %8.1fs %8.1fs\n", num(a, "id"), str(a, "node"),
               str(a, "host"), num(a, "slots"), num(a, "alive") ? num(a, "leaving") ? "leave" : "alive" : "dead",
               num(a, "in_world") ? "yes" : "no", num(a, "failures"), num(a, "cooldown_s"), num(a, "last_seen_s"));
    printf("\n%-6s %-8s %-6s %-16s %-8s\n", "RANK", "REPLICA", "AGENT", "NODE", "PID");
    for (const cJSON *w = workers ? workers->child : NULL; w; w = w->next)
        printf("%-6.0f %-8.0f %-6.0f %-16.16s %-8.0f\n", num(w, "rank"), num(w, "replica"), num(w, "agent"),
               str(w, "node"), num(w, "pid"));
}

static void status_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain status [--master HOST:PORT] [--token T | --token-file F] [--json]\n"
            "\n"
            "Prints a running job: its state and generation, the world, shard progress, the agents and\n"
            "the workers. --master defaults to $ADT_MASTER, else 127.0.0.1:%d; the token to\n"
            "$ADT_JOB_TOKEN. --json prints {\"job\", \"agents\", \"workers\"} as the API returns them.\n"
            "\n"
            "exit status: 0 printed, 1 the master did not answer, 2 bad flag\n",
            ADT_MASTER_DEFAULT_PORT);
}

static int status_apply(void *ctx, const char *f, const char *v) { return client_flag("status", ctx, f, v); }

int cli_status(int argc, char **argv) {
    client_opts o;
    client_defaults(&o);
    int i = 1, r = cli_parse("status", argc, argv, &i, client_has_value, status_apply, &o, status_usage);
    if (r) return r == 1 ? 0 : 2;
    cJSON *job = fetch("status", &o, "GET", "/v1/job", NULL);
    if (!job) return 1;
    cJSON *agents = fetch("status", &o, "GET", "/v1/agents", NULL);
    cJSON *workers = fetch("status", &o, "GET", "/v1/workers", NULL);
    if (o.json) {
        cJSON *all = cJSON_CreateObject();
        cJSON_AddItemToObject(all, "job", job);
        cJSON_AddItemToObject(all, "agents", agents ? agents : cJSON_CreateNull());
        cJSON_AddItemToObject(all, "workers", workers ? workers : cJSON_CreateNull());
        char *txt = cJSON_Print(all);
        printf("%s\n", txt);
        free(txt);
        cJSON_Delete(all);
        return 0;
    }
    print_status(job, agents, workers);
    cJSON_Delete(job);
    cJSON_Delete(agents);
    cJSON_Delete(workers);
    return 0;
}

static void scale_usage(FILE *f) {
    fprintf(f, "usage: adtrain scale [--master HOST:PORT] [--token T] (--workers N | --nodes N)\n"
               "\n"
               "Sets the world's size: at most N ranks (--workers) or N agents (--nodes); 0 = no limit.\n"
               "The running world stops at a step boundary (nothing is lost) and the next one has the\n"
               "new size.\n"
               "\n"
               "exit status: 0 accepted, 1 the master refused or did not answer, 2 bad flag\n");
}

typedef struct scale_opts {
    client_opts c;
    long workers, nodes;
} scale_opts;

static int scale_apply(void *ctx, const char *f, const char *v) {
    scale_opts *o = ctx;
    int k = client_flag("scale", &o->c, f, v);
    if (k == 0 && !strcmp(f, "--workers")) k = cli_long("scale", f, v, 0, 1 << 20, &o->workers) ? -1 : 1;
    if (k == 0 && !strcmp(f, "--nodes")) k = cli_long("scale", f, v, 0, 1 << 20, &o->nodes) ? -1 : 1;
    return k;
}

int cli_scale(int argc, char **argv) {
    scale_opts so = {.workers = -1, .nodes = -1};
    client_defaults(&so.c);
    int i = 1, r = cli_parse("scale", argc, argv, &i, client_has_value, scale_apply, &so, scale_usage);
    if (r) return r == 1 ? 0 : 2;
    client_opts o = so.c;
    long workers = so.workers, nodes = so.nodes;
    if (workers < 0 && nodes < 0) return cli_fail("scale", 2, "give --workers N or --nodes N");
    char body[96];
    if (workers >= 0 && nodes >= 0)
        snprintf(body, sizeof body, "{\"workers\":%ld,\"nodes\":%ld}", workers, nodes);
    else if (workers >= 0)
        snprintf(body, sizeof body, "{\"workers\":%ld}", workers);
    else
        snprintf(body, sizeof body, "{\"nodes\":%ld}", nodes);
    cJSON *job = fetch("scale", &o, "POST", "/v1/scale", body);
    if (!job) return 1;
    printf("adtrain scale: target %.0f workers, %.0f nodes (0 = no limit); generation %.0f is %s\n",
           num(job, "target_workers"), num(job, "target_nodes"), num(job, "generation"), str(job, "state"));
    cJSON_Delete(job);
    return 0;
}
