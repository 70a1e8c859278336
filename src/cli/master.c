/*
 * master.c - `adtrain master`: the job master of an elastic job (adtrain/elastic.h) as a
 * process: it serves the API until the job is done or failed (then a few seconds more, so the
 * agents hear it), or until SIGINT/SIGTERM. Killed and started again on the same --job
 * directory, it resumes the job.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "cli.h"

const char cli_master_flags_help[] =
    "membership and restarts:\n"
    "  --nnodes MIN:MAX        agents a world needs / may use (default 1:0, 0 = no limit)\n"
    "  --workers N             ranks a world may have (default 0: every slot; adtrain scale changes it)\n"
    "  --max-restarts R        failures tolerated per --restart-window (default 3)\n"
    "  --restart-window S      seconds; 0 = the whole job (default 0)\n"
    "  --heartbeat S           agents heartbeat every S seconds (default 1)\n"
    "  --heartbeat-misses K    an agent silent for K intervals is dead (default 3)\n"
    "  --join-wait S           the first world waits S s after the last join for more agents (default 1;\n"
    "                          adtrain launch on one node, without --rdzv-endpoint: 0)\n"
    "  --stop-timeout S        a planned stop or a drain taking longer is forced (default 30)\n"
    "  --progress-timeout S    a world that reported steps and then none for S seconds hangs: it is\n"
    "                          ended as a failure (default 600; 0 = never)\n"
    "  --blacklist-cooldown MIN:MAX   seconds a failed node sits out: MIN * 2^(failures-1), at most\n"
    "                          MAX (default 10:600)\n"
    "data (else the workers declare their data job themselves):\n"
    "  --samples N --global-batch B --epochs E   the data job of the ledger\n"
    "  --shard-size S          positions per shard (default: B)\n"
    "  --seed X                seed of every epoch's order (default 0)\n"
    "  --shuffle on|off        seeded permutation per epoch (default on)\n"
    "  --max-shard-failures K  a shard failing K times goes to the dead letters (default 3)\n"
    "  --max-leases K          leases one replica may hold at once (default 2)\n"
    "  --lease-timeout S       a lease not reported for S seconds is taken back and the world\n"
    "                          restarted (default 60)\n"
    "  --ranks-per-replica R   ranks of one data-parallel replica (default 1)\n"
    "  --nosync                no fsync in the ledger (tests and benchmarks)\n"
    "stragglers (the workers' step reports carry their compute times; the master decides every\n"
    "replica's local batch and sends it in the data replies; GET /dashboard shows the job):\n"
    "  --straggler-policy off|dd|nd   dd: local batches follow speed; nd: also restart a persistent\n"
    "                          straggler's node out of the next world when that pays (default off;\n"
    "                          refused where one rank has no peer: --workers 1, one rank per launch)\n"
    "  --straggler-config K=V,...     thresholds and cooldowns (adtrain train --help); only with a policy\n";

static const char *const k_value_flags[] = {"--listen",
                                            "--job",
                                            "--token",
                                            "--token-file",
                                            "--nnodes",
                                            "--workers",
                                            "--max-restarts",
                                            "--restart-window",
                                            "--heartbeat",
                                            "--heartbeat-misses",
                                            "--join-wait",
                                            "--stop-timeout",
                                            "--progress-timeout",
                                            "--blacklist-cooldown",
                                            "--samples",
                                            "--global-batch",
                                            "--epochs",
                                            "--shard-size",
                                            "--seed",
                                            "--shuffle",
                                            "--max-shard-failures",
                                            "--max-leases",
                                            "--lease-timeout",
                                            "--ranks-per-replica",
                                            "--run-id",
                                            "--linger",
                                            "--straggler-policy",
                                            "--straggler-config",
                                            "--model",
                                            "--cluster",
                                            "--strategy",
                                            "--batch",
                                            "--optimizer",
                                            "--lr",
                                            "--momentum",
                                            "--weight-decay",
                                            "--steps",
                                            "--data",
                                            NULL};

int cli_master_has_value(const char *name) { return cli_in_list(name, k_value_flags); }

void cli_master_defaults(cli_master_opts *o) {
    memset(o, 0, sizeof *o);
    o->cfg.max_restarts = -1;
    o->job.shuffle = 1;
    o->rp.optim = ADT_OPTIM_ADAMW; /* the help's default and the trainer's (zero would be sgd) */
    o->linger_s = 3;
}

/* The flags of what the job trains that only the spec holds (--model, --batch and --optimizer
 * are the re-planning's, --seed the data job's too). */
static int spec_flag(const char *cmd, cli_master_opts *o, const char *f, const char *v) {
    adt_elastic_job_spec *sp = &o->spec;
    long x;
    if (!strcmp(f, "--lr")) {
        if (cli_double(cmd, f, v, 1e-12, 1e3, &sp->lr)) return -1;
        sp->have |= ADT_SPEC_LR;
    } else if (!strcmp(f, "--momentum")) {
        if (cli_double(cmd, f, v, 0, 0.999999, &sp->momentum)) return -1;
        sp->have |= ADT_SPEC_MOMENTUM;
    } else if (!strcmp(f, "--weight-decay")) {
        if (cli_double(cmd, f, v, 0, 1e3, &sp->weight_decay)) return -1;
        sp->have |= ADT_SPEC_WEIGHT_DECAY;
    } else if (!strcmp(f, "--steps")) {
        if (cli_long(cmd, f, v, 1, INT32_MAX, &x)) return -1;
        sp->steps = x, sp->have |= ADT_SPEC_STEPS;
    } else if (!strcmp(f, "--data")) {
        if (strlen(v) >= sizeof sp->data) return cli_fail(cmd, -1, "--data: longer than %zu bytes", sizeof sp->data - 1);
        snprintf(sp->data, sizeof sp->data, "%s", v);
        sp->have |= ADT_SPEC_DATA;
    } else
        return 0;
    return 1;
}

int cli_master_flag(const char *cmd, cli_master_opts *o, const char *f, const char *v) {
    adt_master_config *c = &o->cfg;
    long x, y;
    double d;
    int k = cli_replan_flag(cmd, &o->rp, f, v);
    if (!k) k = spec_flag(cmd, o, f, v);
    if (k) return k;
    if (!strcmp(f, "--listen"))
        c->listen = v;
    else if (!strcmp(f, "--job"))
        c->job_dir = v;
    else if (!strcmp(f, "--token") || !strcmp(f, "--token-file"))
        return cli_token_flag(cmd, f, v, o->token, sizeof o->token, &c->token);
    else if (!strcmp(f, "--run-id"))
        c->run_id = v;
    else if (!strcmp(f, "--straggler-policy")) /* checked by adt_master_create */
        c->straggler_policy = v;
    else if (!strcmp(f, "--straggler-config"))
        c->straggler_config = v;
    else if (!strcmp(f, "--nnodes")) {
        if (cli_range(cmd, f, v, &x, &y)) return -1;
        c->nnodes_min = (int)x, c->nnodes_max = (int)y;
    } else if (!strcmp(f, "--workers")) {
        if (cli_long(cmd, f, v, 0, 1 << 20, &x)) return -1;
        c->max_workers = (int)x;
    } else if (!strcmp(f, "--max-restarts")) {
        if (cli_long(cmd, f, v, 0, 1 << 30, &x)) return -1;
        c->max_restarts = (int)x;
    } else if (!strcmp(f, "--restart-window")) {
        if (cli_double(cmd, f, v, 0, 1e9, &c->restart_window_s)) return -1;
    } else if (!strcmp(f, "--heartbeat")) {
        if (cli_double(cmd, f, v, 0.05, 60, &c->heartbeat_s)) return -1;
    } else if (!strcmp(f, "--heartbeat-misses")) {
        if (cli_long(cmd, f, v, 1, 1000, &x)) return -1;
        c->heartbeat_misses = (int)x;
    } else if (!strcmp(f, "--join-wait")) {
        if (cli_double(cmd, f, v, 0, 3600, &d)) return -1;
        c->join_wait_s = d > 0 ? d : -1;
    } else if (!strcmp(f, "--progress-timeout")) {
        if (cli_double(cmd, f, v, 0, 1e7, &c->progress_timeout_s)) return -1;
        if (c->progress_timeout_s == 0) c->progress_timeout_s = -1;
    } else if (!strcmp(f, "--stop-timeout")) {
        if (cli_double(cmd, f, v, 0.1, 86400, &c->stop_timeout_s)) return -1;
    } else if (!strcmp(f, "--blacklist-cooldown")) {
        const char *colon = strchr(v, ':');
        char a[32];
        snprintf(a, sizeof a, "%.*s", colon ? (int)(colon - v) : (int)strlen(v), v);
        if (cli_double(cmd, f, a, 0.01, 1e7, &c->cooldown_min_s)) return -1;
        c->cooldown_max_s = c->cooldown_min_s;
        if (colon && cli_double(cmd, f, colon + 1, c->cooldown_min_s, 1e7, &c->cooldown_max_s)) return -1;
    } else if (!strcmp(f, "--samples")) {
        if (cli_long(cmd, f, v, 1, 1L << 40, &x)) return -1;
        o->job.samples = x, o->data_flags |= 1;
    } else if (!strcmp(f, "--global-batch")) {
        if (cli_long(cmd, f, v, 1, 1L << 40, &x)) return -1;
        o->job.global_batch = x, o->data_flags |= 2;
    } else if (!strcmp(f, "--epochs")) {
        if (cli_long(cmd, f, v, 1, 1 << 20, &x)) return -1;
        o->job.epochs = x, o->data_flags |= 4;
    } else if (!strcmp(f, "--shard-size")) {
        if (cli_long(cmd, f, v, 1, 1L << 40, &x)) return -1;
        o->job.shard_size = x, o->data_flags |= 8;
    } else if (!strcmp(f, "--seed")) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (!*v || *end || errno || *v == '-')
            return cli_fail(cmd, -1, "--seed: expected an unsigned integer, got '%s'", v);
        o->job.seed = s, o->data_flags |= 16; /* also the spec's: alone, no data job */
        o->spec.seed = s, o->spec.have |= ADT_SPEC_SEED;
    } else if (!strcmp(f, "--shuffle")) {
        if (strcmp(v, "on") && strcmp(v, "off")) return cli_fail(cmd, -1, "--shuffle: expected on or off, got '%s'", v);
        o->job.shuffle = !strcmp(v, "on"), o->data_flags |= 8;
    } else if (!strcmp(f, "--max-shard-failures")) {
        if (cli_long(cmd, f, v, 1, 1 << 20, &x)) return -1;
        o->job.max_failures = (int)x, o->data_flags |= 8;
    } else if (!strcmp(f, "--max-leases")) {
        if (cli_long(cmd, f, v, 1, 1 << 20, &x)) return -1;
        o->job.max_leases = (int)x, o->data_flags |= 8;
    } else if (!strcmp(f, "--lease-timeout")) {
        if (cli_double(cmd, f, v, 0.01, 1e7, &o->job.lease_timeout_s)) return -1;
        o->data_flags |= 8;
    } else if (!strcmp(f, "--ranks-per-replica")) {
        if (cli_long(cmd, f, v, 1, 1 << 20, &x)) return -1;
        c->ranks_per_replica = (int)x;
    } else if (!strcmp(f, "--nosync"))
        c->ledger_flags |= ADT_LEDGER_NOSYNC;
    else if (!strcmp(f, "--linger")) {
        if (cli_double(cmd, f, v, 0, 3600, &o->linger_s)) return -1;
    } else
        return 0;
    return 1;
}

/* The spec from the flags, checked across them; -1 after printing the problem. */
static int spec_finish(const char *cmd, cli_master_opts *o) {
    adt_elastic_job_spec *sp = &o->spec;
    cli_replan_opts *r = &o->rp;
    if (r->batch && (o->data_flags & 2) && r->batch != (long)o->job.global_batch)
        return cli_fail(cmd, -1, "--batch %ld and --global-batch %lld: the same global batch said twice, differently; "
                        "expected one of them", r->batch, (long long)o->job.global_batch);
    if (r->batch || (o->data_flags & 2)) sp->batch = r->batch ? r->batch : o->job.global_batch, sp->have |= ADT_SPEC_BATCH;
    if ((sp->have & ADT_SPEC_MOMENTUM) && r->optim != ADT_OPTIM_SGD)
        return cli_fail(cmd, -1, "--momentum: only applies to --optimizer sgd (adamw, the default, uses betas 0.9, "
                        "0.95)");
    if ((sp->have & ADT_SPEC_MOMENTUM) && r->momentum && sp->momentum == 0)
        return cli_fail(cmd, -1, "--optimizer sgd-momentum with --momentum 0: expected --optimizer sgd, or a momentum "
                        "above 0");
    if (sp->have & ADT_SPEC_MOMENTUM) r->momentum = sp->momentum > 0; /* plans: SGD with a state or not */
    /* plans are made for an optimizer: whenever the master plans, the workers are told which */
    if (r->optim_given || r->model_path) {
        snprintf(sp->optimizer, sizeof sp->optimizer, "%s", r->optim == ADT_OPTIM_SGD ? "sgd" : "adamw");
        sp->have |= ADT_SPEC_OPTIMIZER;
    }
    if (r->model_path) {
        if (strlen(r->model_path) >= sizeof sp->model)
            return cli_fail(cmd, -1, "--model: a path longer than %zu bytes", sizeof sp->model - 1);
        snprintf(sp->model, sizeof sp->model, "%s", r->model_path);
        size_t n;
        if (adt_file_read(r->model_path, 16u << 20, "--model", &sp->model_json, &n))
            return cli_fail(cmd, -1, "%s", adt_error_message());
        sp->have |= ADT_SPEC_MODEL;
    }
    if (sp->have) o->cfg.spec = sp;
    return 0;
}

int cli_master_finish(const char *cmd, cli_master_opts *o) {
    if ((o->data_flags & ~16) && (o->data_flags & 7) != 7)
        return cli_fail(cmd, -1, "the data job needs --samples, --global-batch and --epochs together");
    if (o->cfg.straggler_config && (!o->cfg.straggler_policy || !strcmp(o->cfg.straggler_policy, "off")))
        return cli_fail(cmd, -1, "--straggler-config: only acts with --straggler-policy dd or nd; expected one of them, "
                        "or no --straggler-config");
    if (o->cfg.straggler_policy && strcmp(o->cfg.straggler_policy, "off") && o->cfg.max_workers == 1)
        return cli_fail(cmd, -1, "--straggler-policy %s with --workers 1: one rank has no peer to balance against; "
                        "expected more workers, or no policy", o->cfg.straggler_policy);
    if (spec_finish(cmd, o)) return adt_elastic_job_spec_free(&o->spec), -1;
    if (o->data_flags & 7) {
        if (o->job.global_batch > o->job.samples)
            return adt_elastic_job_spec_free(&o->spec),
                   cli_fail(cmd, -1, "--global-batch %lld exceeds --samples %lld", (long long)o->job.global_batch,
                            (long long)o->job.samples);
        if (!o->job.shard_size) o->job.shard_size = o->job.global_batch;
        o->job.replicas = 1;
        o->cfg.data = &o->job;
    }
    int rc = cli_replan_finish(cmd, &o->rp, &o->cfg, (o->data_flags & 2) ? (long)o->job.global_batch : 0);
    if (rc) adt_elastic_job_spec_free(&o->spec); /* the caller frees it after a success only */
    return rc;
}

static void master_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain master --job DIR [--listen HOST:PORT] [--token T | --token-file F] [options]\n"
            "\n"
            "Serves an elastic job's master API (docs/formats.md, \"Master API\") until the job is done.\n"
            "State lives in DIR (master.db, ledger.db); started again on the same DIR it resumes.\n"
            "\n"
            "  --job DIR               the job directory (created if missing): master.db, ledger.db, the plans,\n"
            "                          and the workers' elastic checkpoints in DIR/checkpoints (served to them\n"
            "                          as the job spec's checkpoint_dir)\n"
            "  --listen HOST:PORT      default 127.0.0.1:%d; off loopback a token is required: without\n"
            "                          --token one is made and written to DIR/token (mode 0600)\n"
            "  --token T, --token-file F   every request must carry 'Authorization: Bearer T'\n"
            "  --run-id ID             the job's id (TORCHELASTIC_RUN_ID of the workers)\n"
            "  --linger S              after the job ends, keep serving S seconds (default 3)\n"
            "%s%s"
            "\n"
            "exit status: 0 the job finished, 1 it failed or the master could not run, 2 bad flag\n",
            ADT_MASTER_DEFAULT_PORT, cli_master_flags_help, cli_replan_flags_help);
}

/* Off loopback without a token: the one in DIR/token (a restarted master keeps its agents'), or
 * a new random one kept there for the agents. */
static int make_token(cli_master_opts *o) {
    char path[4096];
    snprintf(path, sizeof path, "%s/token", o->cfg.job_dir);
    const char *dst;
    if (access(path, R_OK) == 0) {
        if (cli_token_flag("master", "--token-file", path, o->token, sizeof o->token, &dst) < 0) return -1;
        o->cfg.token = o->token;
        fprintf(stderr, "adtrain master: listening off loopback: the job token is in %s\n", path);
        return 0;
    }
    unsigned char r[24];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
        if (fd >= 0) close(fd);
        return cli_fail("master", -1, "cannot read /dev/urandom for a token: %s", strerror(errno));
    }
    close(fd);
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(o->token + 2 * i, 3, "%02x", r[i]);
    mkdir(o->cfg.job_dir, 0755);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return cli_fail("master", -1, "%s: %s", path, strerror(errno));
    int ok = write(fd, o->token, strlen(o->token)) == (ssize_t)strlen(o->token) && write(fd, "\n", 1) == 1;
    close(fd);
    if (!ok) return cli_fail("master", -1, "%s: write failed", path);
    o->cfg.token = o->token;
    fprintf(stderr, "adtrain master: listening off loopback: the job token is in %s\n", path);
    return 0;
}

static int listen_is_loopback(const char *listen) {
    return !listen || !strncmp(listen, "127.", 4) || !strncmp(listen, "localhost:", 10);
}

static int master_apply(void *ctx, const char *f, const char *v) { return cli_master_flag("master", ctx, f, v); }

int cli_master(int argc, char **argv) {
    cli_master_opts o;
    cli_master_defaults(&o);
    int i = 1, r = cli_parse("master", argc, argv, &i, cli_master_has_value, master_apply, &o, master_usage);
    if (r) return r == 1 ? 0 : 2;
    if (i < argc) return cli_fail("master", 2, "unexpected argument '%s'", argv[i]);
    if (!o.cfg.job_dir) return cli_fail("master", 2, "--job DIR is required");
    if (cli_master_finish("master", &o)) return 2;
    if (!o.cfg.token && !listen_is_loopback(o.cfg.listen) && make_token(&o))
        return adt_elastic_job_spec_free(&o.spec), 1;
    int stop_fd = cli_stop_fd();
    adt_master *m;
    int rc = adt_master_create(&m, &o.cfg);
    if (!rc && (rc = adt_master_start(m))) adt_master_free(m);
    if (rc) {
        adt_elastic_job_spec_free(&o.spec);
        return cli_fail("master", rc == ADT_ERR_ARG ? 2 : 1, "%s", adt_error_message());
    }
    printf("adtrain master: serving on port %d\n", adt_master_port(m));
    fflush(stdout);
    adt_job_state s;
    for (;;) {
        s = adt_master_wait(m, 0.2);
        if (s == ADT_JOB_DONE || s == ADT_JOB_FAILED) break;
        struct pollfd p = {.fd = stop_fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) {
            fprintf(stderr, "adtrain master: stopping (signal); the job can be resumed on the same --job\n");
            adt_master_free(m);
            adt_elastic_job_spec_free(&o.spec);
            return 1;
        }
    }
    double end = adt_now_s() + o.linger_s;
    while (adt_now_s() < end) {
        struct pollfd p = {.fd = stop_fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) break;
    }
    adt_master_free(m);
    adt_elastic_job_spec_free(&o.spec);
    printf("adtrain master: job %s\n", s == ADT_JOB_DONE ? "done" : "failed");
    return s == ADT_JOB_DONE ? 0 : 1;
}
