/*
 * train_elastic.c - `adtrain train` as a worker of an elastic job: started by `adtrain agent`
 * (ADT_MASTER in the environment, the MPI world given through PMI), it is a data-parallel
 * replica per rank that takes its samples from the master's leases, reports every step,
 * checkpoints through a flash checkpoint (include/adtrain/ckpt.h) and commits each checkpoint
 * with the ledger's position (include/adtrain/elastic.h, ledger.h).
 *
 * Sample order. The ledger's epochs are adt_sample_permutation(seed, epoch), the sampler's own
 * order, cut into positions; it hands out the lowest waiting positions first. Each step every
 * rank leases its share of the global batch B (B / n, one more for the first B mod n ranks), the
 * ranks gather what all of them leased, and the step's batch is those positions sorted by
 * (epoch, position): the sampler's batch of that step, whatever the world size. So a run without
 * faults trains exactly the batches `mpiexec -n N adtrain train` trains, and after a restore the
 * positions the rewind handed back come first, continuing the same sequence. Each rank fills its
 * block of the batch as on any distributed run; what a rank leased and reports is its share of
 * the samples the step consumed.
 *
 * Checkpoints. Every --commit-every steps (and at a planned stop, SIGTERM and the last step) each
 * rank copies its parameters and optimizer state into its flash file (/dev/shm, two slots, the
 * only time the step is blocked); a background thread publishes the slot, and on rank 0 writes
 * the --save format file DIR/ckpt-S-gG.safetensors and commits step S with it. Restoring, rank 0
 * asks the master for the commit in force (the ledger rewound to it) and broadcasts it, so all
 * ranks restore one step; each rank takes it from its flash file when a slot holds that step and
 * verifies, else from the file on disk.
 *
 * Stops. A planned change (the master's stop_at) and SIGTERM are agreed by an all-reduce after
 * each step's report; the ranks checkpoint and commit that step, wait for the commit, and leave
 * (exit 0 for a planned stop, 1 for SIGTERM). A request refused as stale (the generation ended)
 * ends the process with status 3: the next generation restores the commit in force.
 *
 * The parameter-server mode (--mode ps, ps.c). The data replicas are the workers: the servers
 * lease, gather, report and agree on nothing (their one step is their whole service), so the
 * gathers and agreements run over the workers' communicator. A commit is the mode's consistent
 * cut: the workers drain their reports, cut every server's shard and the run file into
 * DIR/ckpt-S-gG/ (train_ckpt_save, while the step waits; no flash file), and the first worker
 * commits step S with that name. Restoring reads the directory on every rank. A server keeps
 * SIGTERM's default: only the workers can agree on a stop step.
 *
 * Off the step's path. Leases and reports go through a client thread (adt_elastic_pipe): the
 * next step's lease is asked for once every rank holds this step's (after the gather), in one
 * call with the previous step's report, queued just before; a step waits only when its lease
 * is not in yet, or when the previous step's report is still unacknowledged as it queues its
 * own. So a stop step is known one step later than a synchronous report would tell it (the
 * master leaves room for that), a stale refusal ends the process at the latest one step after
 * the refused request, and a step that checkpoints first drains the queue on every rank (the
 * commit follows every report it covers). Each step's elastic work (lease wait, gather, report
 * queueing, control all-reduce, drain, flash copy) is timed and logged (--log: elastic_ms,
 * step_wall_ms; its parts lease_wait_ms, gather_ms, report_ms, agree_ms) and summed at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "adtrain/elastic.h"
#include "train_internal.h"

#define MAX_RANGES 64

typedef struct train_elastic {
    adt_elastic *c;      /* the main thread's client; its leases and reports go through `pipe` */
    adt_elastic_pipe *pipe; /* c's lease and report calls on a thread: off the step's path */
    adt_elastic *commit; /* rank 0's persister's client (a handle is one thread's)            */
    char dir[4096];      /* the checkpoint directory when --elastic-dir is not given           */
    adt_ledger_job job;
    int64_t *perm, perm_epoch;
    adt_ledger_lease cur; /* the lease being consumed */
    int have;
    adt_ledger_range mine[MAX_RANGES]; /* what this rank leased for the current step */
    int64_t mine_epoch[MAX_RANGES];
    int n_mine;
    int64_t *gathered; /* [nranks * (1 + 3 * MAX_RANGES)]: count, then (epoch, a, b) per range */
    /* flash checkpoints */
    adt_flash *flash;
    char flash_path[1100];
    int64_t *offset; /* [state graph's n_values]: byte offset of a persistent value in a slot, -1 if none */
    int64_t split_off; /* where the slot holds the balanced runner's split, -1 if none           */
    uint64_t state_bytes;
    int sharded;     /* the plan gives ranks different state: every rank persists its slices */
    const uint8_t *persist_data; /* the slot the persister writes (its data callback reads it) */
    int64_t last_commit;
    char last_name[256];
    int finished; /* the last step is committed: the flash file goes */
    double blocked_s, blocked_max_s;
    long n_flash;
    /* in-run accounting: the step's wall time spent on elastic work (waiting for a lease,
     * gathering the leased ranges, queueing the report, the control all-reduce, draining reports
     * before a commit, the flash copy), against the step's whole wall time */
    double step_t0, step_el_s, el_s, wall_s;
    double lease_s, gather_s, report_s, agree_s; /* this step's parts of step_el_s (the --log's breakdown) */
    long el_steps;
} train_elastic;

static volatile sig_atomic_t g_term;
static void on_term(int sig) {
    (void)sig;
    g_term = 1;
}

static int el_fail(int code, const char *what) {
    if (code == ADT_ERR_STALE) {
        return adt_error(ADT_ERR_STALE, "%s refused: this world generation ended (%s)", what, adt_error_message());
    }
    return train_fail(EXIT_RUNTIME, "elastic %s: %s", what, adt_error_message());
}

/* ---- the data replicas ------------------------------------------------------------------------
 * The ranks that take samples: every rank, or under --mode ps the workers (a parameter server's one
 * step is its whole service: it leases, reports and commits nothing). Their leases are gathered and
 * their stops agreed over data_comm; the committer (rank 0, or the first worker) commits. */
static adt_comm *data_comm(const trainer *t) { return t->ps ? train_ps_workers(t) : t->world; }
static int data_size(const trainer *t) { return data_comm(t) ? adt_comm_size(data_comm(t)) : 1; }
static int data_agree(trainer *t, int rc) {
    return train_group_agree(t, data_comm(t), t->ps ? t->o.ps_servers : 0, rc);
}

/* ---- state <-> memory ------------------------------------------------------------------------ */

/* The graph whose values this rank's executor holds: the whole training graph (one process),
 * the rank's partition of it, or its pipeline stage's. A slot holds its persistent values. */
static const adt_graph *state_graph(const trainer *t) {
    return t->pipe ? adt_pipe_local(t->pipe)->g : train_run_graph(t);
}

static void layout_state(trainer *t, train_elastic *e) {
    const adt_graph *g = state_graph(t);
    e->offset = adt_malloc((size_t)g->n_values * sizeof *e->offset);
    uint64_t off = 0;
    for (int v = 0; v < g->n_values; v++) {
        e->offset[v] = -1;
        if (!adt_role_is_persistent(g->values[v].role)) continue;
        e->offset[v] = (int64_t)off;
        off += (uint64_t)adt_value_bytes(g, v);
    }
    /* the balanced runner's split in force belongs to the same snapshot */
    e->split_off = t->bal ? (int64_t)off : -1;
    if (t->bal) off += (uint64_t)t->nranks * sizeof(int64_t);
    e->state_bytes = off;
    /* Sharded: a pipeline, or a persistent value held here in part or not at all (ZeRO, tensor
     * parallel). Then no rank can write the whole checkpoint alone. */
    e->sharded = t->pipe != NULL;
    for (int v = 0; t->loc.g && v < t->g->n_values && !e->sharded; v++) {
        if (!adt_role_is_persistent(t->g->values[v].role)) continue;
        int lv = t->loc.value[v];
        e->sharded = lv < 0 || adt_value_bytes(t->loc.g, lv) != adt_value_bytes(t->g, v);
    }
}

/* Copies every persistent value into mem (to = 1) or back from it (to = 0). */
static void copy_state(trainer *t, train_elastic *e, uint8_t *mem, int to) {
    const adt_graph *g = state_graph(t);
    for (int v = 0; v < g->n_values; v++) {
        if (e->offset[v] < 0) continue;
        size_t n = (size_t)adt_value_bytes(g, v);
        void *live = adt_exec_data(t->ex, v);
        if (to) memcpy(mem + e->offset[v], live, n);
        else memcpy(live, mem + e->offset[v], n);
    }
    if (e->split_off < 0) return;
    size_t n = (size_t)t->nranks * sizeof(int64_t);
    if (to) {
        memcpy(mem + e->split_off, train_balance_split(t), n);
    } else {
        char text[ADT_STRAGGLER_MAX_RANKS * 21 + 1];
        int64_t sp[ADT_STRAGGLER_MAX_RANKS];
        memcpy(sp, mem + e->split_off, n);
        size_t k = 0;
        for (int r = 0; r < t->nranks; r++) k += (size_t)snprintf(text + k, sizeof text - k, "%s%lld", r ? "," : "", (long long)sp[r]);
        train_balance_adopt_split(t, text);
    }
}

/* A value of the slot being persisted: by the state graph's id (a distributed checkpoint's
 * view), or by the global graph's (the one-file checkpoint of a replicated state). */
static void *slot_local(void *ctx, int v) {
    trainer *t = ctx;
    return (void *)(t->el->persist_data + t->el->offset[v]);
}

static void *slot_data(void *ctx, int v) {
    trainer *t = ctx;
    return slot_local(ctx, t->loc.g ? t->loc.value[v] : v);
}

static void ckpt_name(char *buf, size_t n, int64_t step, int64_t gen, int sharded) {
    /* a sharded state is a distributed checkpoint: a directory */
    snprintf(buf, n, "ckpt-%lld-g%lld%s", (long long)step, (long long)gen, sharded ? "" : ".safetensors");
}

/* Removes DIR/ckpt-S-gG[.safetensors] (files, and the directories of distributed checkpoints)
 * of steps below `below`, except `keep` (the commit before). Later steps may be being written
 * by ranks ahead of this one, so they stay. */
static void prune_ckpts(const char *dir, int64_t below, const char *keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        long long step, gen;
        int end = 0;
        if (sscanf(n, "ckpt-%lld-g%lld%n", &step, &gen, &end) != 2 || step >= below || !strcmp(n, keep)) continue;
        if (n[end] && strcmp(n + end, ".safetensors")) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, n);
        if (n[end] == 0) { /* a distributed checkpoint's directory: its files, then itself */
            DIR *sub = opendir(path);
            struct dirent *f;
            while (sub && (f = readdir(sub))) {
                if (f->d_name[0] == '.') continue;
                char fp[4700];
                snprintf(fp, sizeof fp, "%s/%s", path, f->d_name);
                unlink(fp);
            }
            if (sub) closedir(sub);
            rmdir(path);
        } else {
            unlink(path);
        }
    }
    closedir(d);
}

/* ---- distributed checkpoints without MPI ----------------------------------------------------------
 * The persisters are background threads, and MPI was not initialised for threads: the ranks
 * agree through the checkpoint's directory instead. Each rank writes its slices, then its part
 * of the manifest as part-R.json (an atomic rename: present = its slices are durable); rank 0
 * waits for all W parts, commits the manifest, and only then commits the step with the ledger. */
static int write_part(const char *dir, int rank, const char *part) {
    char path[4500];
    snprintf(path, sizeof path, "%s/part-%d.json", dir, rank);
    return adt_file_write_atomic(path, part, strlen(part));
}

/* Rank 0: every rank's part, waiting up to `wait_s` for the slowest; then the manifest. */
static int commit_parts(trainer *t, const char *dir, int64_t step, double wait_s) {
    char **parts = adt_calloc((size_t)t->nranks, sizeof *parts);
    double deadline = adt_now_s() + wait_s;
    int rc = ADT_OK;
    for (int r = 0; r < t->nranks && !rc; r++) {
        char path[4500];
        snprintf(path, sizeof path, "%s/part-%d.json", dir, r);
        size_t n;
        while (access(path, R_OK) && adt_now_s() < deadline) usleep(5000);
        if (access(path, R_OK)) rc = adt_error(ADT_ERR_IO, "%s: rank %d did not write its slices within %.0f s", dir, r, wait_s);
        else rc = adt_file_read(path, 1 << 20, "manifest part", &parts[r], &n);
    }
    if (!rc) rc = train_ckpt_commit_parts(t, dir, step, (const char *const *)parts);
    for (int r = 0; r < t->nranks; r++) {
        char path[4500];
        snprintf(path, sizeof path, "%s/part-%d.json", dir, r);
        if (!rc) unlink(path);
        free(parts[r]);
    }
    free(parts);
    return rc;
}

/* The persister (a background thread): the slot as a --save format file written by rank 0
 * (every rank holds the whole state), or this rank's slices of a distributed checkpoint; then
 * rank 0 commits the step. */
static int persist(void *ctx, int64_t gen, int64_t step, const void *data, uint64_t bytes) {
    trainer *t = ctx;
    train_elastic *e = t->el;
    if (bytes != e->state_bytes) return adt_error(ADT_ERR_STATE, "flash slot of %llu bytes", (unsigned long long)bytes);
    char name[128], path[4400];
    ckpt_name(name, sizeof name, step, gen, e->sharded);
    snprintf(path, sizeof path, "%s/%s", t->o.elastic_dir, name);
    e->persist_data = data;
    int rc;
    if (e->sharded) {
        char *part = NULL;
        rc = train_ckpt_write_rank(t, path, (long)step, slot_local, t, &part);
        if (!rc) rc = write_part(path, t->rank, part);
        free(part);
        if (!rc && t->rank == 0) rc = commit_parts(t, path, step, 2 * t->o.lease_timeout + 60);
        if (rc || t->rank != 0) return rc;
    } else {
        int64_t *split = NULL; /* the slot's copy: its place need not be aligned for int64 */
        if (e->split_off >= 0) {
            split = adt_malloc((size_t)t->nranks * sizeof *split);
            memcpy(split, (const uint8_t *)data + e->split_off, (size_t)t->nranks * sizeof *split);
        }
        rc = train_ckpt_write(t, path, (long)step, split, slot_data, t);
        free(split);
    }
    if (rc) return rc;
    if ((rc = adt_elastic_commit(e->commit, step, name))) return rc;
    /* the commit in force and the one before stay (a restore reads the former) */
    prune_ckpts(t->o.elastic_dir, step, e->last_name);
    e->last_commit = step;
    snprintf(e->last_name, sizeof e->last_name, "%s", name);
    return ADT_OK;
}

/* ---- start: client, data job, restore ---------------------------------------------------------- */

static int open_flash(trainer *t, train_elastic *e) {
    const char *dir = getenv("ADT_FLASH_DIR");
    /* one file per local rank of a node: two agents of one host (a test) never share one */
    const char *run = getenv("TORCHELASTIC_RUN_ID"), *node = getenv("ADT_NODE_ID"), *lr = getenv("LOCAL_RANK");
    char safe[64];
    snprintf(safe, sizeof safe, "%s", node && *node ? node : "node");
    for (char *p = safe; *p; p++)
        if (*p == '/' || *p == ' ') *p = '_';
    snprintf(e->flash_path, sizeof e->flash_path, "%s/adtrain-flash-%s-%s-%s", dir && *dir ? dir : "/dev/shm",
             run && *run ? run : "job", safe, lr && *lr ? lr : "0");
    uint64_t layout = (uint64_t)adt_plan_graph_checksum(t->g) << 32 ^ e->state_bytes;
    if (e->sharded) { /* a slot holds this rank's slices: only the same plan and place may read it */
        char where[400];
        int n = snprintf(where, sizeof where, "%s|%d|%d|", t->plan_label, t->rank, t->nranks);
        uint32_t c = adt_crc32c(0, where, (size_t)n);
        if (t->plan_text) c = adt_crc32c(c, t->plan_text, strlen(t->plan_text));
        layout ^= (uint64_t)c << 16;
    }
    if (adt_flash_open(&e->flash, e->flash_path, e->state_bytes ? e->state_bytes : 1, layout))
        return train_fail(EXIT_RUNTIME, "--flash: %s", adt_error_message());
    if (adt_flash_start(e->flash, t->rank == 0 || e->sharded ? persist : NULL, t))
        return train_fail(EXIT_RUNTIME, "--flash: %s", adt_error_message());
    return 0;
}

/* Every rank loads committed step S: from its flash file if a slot holds S, else from `name` on
 * disk. Returns the setup result (the caller agrees on it). */
static int restore(trainer *t, train_elastic *e, int64_t step, const char *name) {
    if (step <= 0) return 0;
    adt_flash_view fv;
    if (e->flash && adt_flash_find(e->flash, step, &fv) == ADT_OK && fv.bytes == e->state_bytes) {
        copy_state(t, e, (uint8_t *)fv.data, 0);
        t->start_step = (long)step;
        train_note(t, "elastic: restored step %lld from %s", (long long)step, e->flash_path);
        return 0;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", t->o.elastic_dir, name);
    t->o.resume_path = path; /* --resume's checks: the same seed, batch, data, optimizer */
    int rc = train_ckpt_resume(t);
    t->o.resume_path = NULL;
    return rc;
}

int train_elastic_plan(trainer *t) {
    const char *master = getenv("ADT_MASTER"), *gen = getenv("ADT_GENERATION");
    /* one process runs serially; fetched once (balanced data parallelism checks it early) */
    if (!master || !t->world || t->o.plan_path || t->plan_text) return 0;
    char path[96];
    snprintf(path, sizeof path, "/v1/plan?generation=%s", gen && *gen ? gen : "0");
    /* the master may be restarting: retry while it cannot be reached or answers 5xx */
    double deadline = adt_now_s() + 60;
    for (;;) {
        int status = 0;
        char *reply = NULL;
        int rc = adt_master_call(master, getenv("ADT_JOB_TOKEN"), "GET", path, NULL, 10, &status, &reply);
        if (rc == ADT_OK && status == 200) {
            t->plan_text = reply;
            return 0;
        }
        if (rc == ADT_OK && status == 404) { /* this world has no plan: data parallel */
            free(reply);
            return 0;
        }
        if (rc == ADT_OK && status == 409) {
            free(reply);
            return adt_error(ADT_ERR_STALE, "the plan of generation %s refused: this world generation ended", gen);
        }
        if ((rc == ADT_OK && status < 500) || adt_now_s() > deadline) {
            int r = train_fail(EXIT_RUNTIME, "elastic plan: GET %s from %s: %s%.200s", path, master,
                               rc ? adt_error_message() : "HTTP ", rc ? "" : reply ? reply : "");
            free(reply);
            return r;
        }
        free(reply);
        usleep(200000);
    }
}

int train_elastic_start(trainer *t) {
    if (!getenv("ADT_MASTER")) return 0;
    if (t->o.resume_path || t->o.init_path)
        return train_fail(EXIT_USAGE, "%s: an elastic run restores the checkpoint the master names; expected no "
                          "--resume or --init under adtrain agent", t->o.resume_path ? "--resume" : "--init");
    if (t->o.plan_path)
        return train_fail(EXIT_USAGE, "--plan: an elastic run takes the plan the master makes for each world "
                          "(adtrain master --model CFG.json [--strategy S]); expected no --plan under adtrain agent");
    train_elastic *e = t->el = adt_calloc(1, sizeof *e);
    e->perm_epoch = -1;
    e->last_commit = -1;
    if (!t->ps) layout_state(t, e); /* --mode ps has no flash slot: its servers write at the cut */
    int rc = 0;
    /* under --mode ps the first ranks serve: replicas that take no samples and no part in the split */
    adt_elastic_config cfg = {.replica = t->rank, .timeout_s = 60, .idle_replicas = t->ps ? t->o.ps_servers : 0,
                               .run_steps = t->o.steps};
    int64_t B = t->o.batch, spe = t->train.count / B;
    e->job = (adt_ledger_job){.samples = t->train.count, .seed = t->o.seed, .shuffle = t->o.shuffle,
                              .global_batch = B, .shard_size = 4 * B, .epochs = (t->o.steps + spe - 1) / spe,
                              .max_leases = 16, .max_failures = 100, .lease_timeout_s = t->o.lease_timeout};
    /* { committed steps, the checkpoint's name } from rank 0 to all */
    struct {
        int64_t step;
        char name[256];
    } at = {0};
    int st;
    if ((st = adt_elastic_open(&e->c, &cfg))) rc = el_fail(st, "client");
    else if ((st = adt_elastic_data_init(e->c, &e->job, 1))) rc = el_fail(st, "data job");
    else if (t->rank == 0) {
        adt_elastic_info info;
        if ((st = adt_elastic_get_info(e->c, &info))) rc = el_fail(st, "info");
        else {
            at.step = info.committed_steps;
            snprintf(at.name, sizeof at.name, "%s", info.checkpoint);
        }
    }
    /* the committer: rank 0, or under --mode ps the first worker, which writes the run file last */
    if (!rc && t->rank == t->reporter && (st = adt_elastic_open(&e->commit, &cfg))) rc = el_fail(st, "client");
    if (!t->o.elastic_dir) { /* the job's directory, where the agent says it is */
        const char *jd = getenv("ADT_JOB_DIR");
        if (jd && *jd) snprintf(e->dir, sizeof e->dir, "%s/checkpoints", jd);
        else snprintf(e->dir, sizeof e->dir, "adtrain-elastic");
        t->o.elastic_dir = e->dir;
    }
    if (t->rank == 0) {
        if (!rc && mkdir(t->o.elastic_dir, 0755) && errno != EEXIST)
            rc = train_fail(EXIT_USAGE, "--elastic-dir %s: cannot create it: %s", t->o.elastic_dir, strerror(errno));
    }
    if ((rc = train_world_agree(t, rc))) return rc;
    if (t->world && adt_comm_bcast(t->world, &at, sizeof at / 4, ADT_I32, 0))
        return train_fail(EXIT_RUNTIME, "elastic: %s", adt_error_message());
    e->last_commit = at.step;
    snprintf(e->last_name, sizeof e->last_name, "%s", at.name);
    if (at.step >= t->o.steps) { /* a world started after the last commit: nothing is left to do */
        train_note(t, "elastic: step %lld of %ld is committed: the run is complete", (long long)at.step, t->o.steps);
        return 1;
    }
    if (t->o.flash && !t->ps) rc = open_flash(t, e);
    if (!rc) rc = restore(t, e, at.step, at.name);
    if ((rc = train_world_agree(t, rc))) return rc;
    if (adt_elastic_pipe_start(&e->pipe, e->c)) return train_fail(EXIT_RUNTIME, "elastic: %s", adt_error_message());
    e->perm = adt_malloc((size_t)t->train.count * sizeof *e->perm);
    e->gathered = adt_malloc((size_t)t->nranks * (1 + 3 * MAX_RANGES) * sizeof *e->gathered);
    /* A parameter server keeps SIGTERM's default: it cannot stop at a step boundary on its own (the
     * workers agree on that), so it ends, and the next world restores the last commit. */
    struct sigaction sa = {.sa_handler = on_term};
    if (!train_ps_serves(t)) sigaction(SIGTERM, &sa, NULL);
    char servers[48] = "";
    if (t->ps) snprintf(servers, sizeof servers, " beside %d parameter server%s", t->o.ps_servers, t->o.ps_servers == 1 ? "" : "s");
    train_note(t, "elastic generation %lld: %d replicas%s, master %s; from step %lld (%s)",
               (long long)adt_elastic_generation(e->c), data_size(t), servers, getenv("ADT_MASTER"), (long long)at.step,
               at.step ? at.name : "the start");
    return 0;
}

/* ---- a step's batch ------------------------------------------------------------------------------ */

/* This rank's local batch at `step` (1-based): the split the master set (its data replies carry
 * it), else the runner's. The master counts steps from 0 as the reports do (step - 1): a split
 * from its step F is leased from our step F + 1, whose lease is asked for once the replies to
 * reports up to F - 3 are in, which the master's margin (F = the highest reported + 4) is for. */
static int64_t local_batch(trainer *t, train_elastic *e, long step) {
    int64_t lb = t->o.bal.by_feed ? adt_elastic_pipe_local_batch(e->pipe, step - 1) : 0;
    return lb > 0 ? lb : train_local_batch(t);
}

/* This rank's share of step `step`'s samples, leased into e->mine. */
static int lease_share(trainer *t, train_elastic *e, long step, int64_t *got) {
    int64_t need = local_batch(t, e, step);
    e->n_mine = 0;
    *got = 0;
    double waited_until = 0;
    while (need > 0 && e->n_mine < MAX_RANGES) {
        if (!e->have || e->cur.cursor == e->cur.end) {
            int grant, st = adt_elastic_pipe_lease(e->pipe, need, &e->cur, &grant);
            if (st) return el_fail(st, "lease");
            e->have = grant == ADT_LEDGER_GRANTED;
            if (grant == ADT_LEDGER_DONE) break;
            if (grant == ADT_LEDGER_WAIT) { /* others' leases may yet come back */
                if (!waited_until) waited_until = adt_now_s() + 5;
                if (adt_now_s() > waited_until) break;
                usleep(20000);
                continue;
            }
        }
        int64_t take = e->cur.end - e->cur.cursor < need ? e->cur.end - e->cur.cursor : need;
        e->mine[e->n_mine++] = (adt_ledger_range){e->cur.id, e->cur.cursor, e->cur.cursor + take};
        e->mine_epoch[e->n_mine - 1] = e->cur.epoch;
        e->cur.cursor += take;
        need -= take;
        *got += take;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : x[1] < y[1] ? -1 : x[1] > y[1];
}

int train_elastic_batch(trainer *t, long step, int64_t *idx) {
    train_elastic *e = t->el;
    int64_t got, W = 1 + 3 * MAX_RANGES;
    e->step_t0 = adt_now_s();
    e->step_el_s = 0;
    if (train_ps_serves(t)) return 0; /* it serves the workers' steps */
    int nd = data_size(t);
    int rc = lease_share(t, e, step, &got);
    if (rc) return rc;
    double t_lease = adt_now_s();
    e->lease_s = t_lease - e->step_t0;
    /* this rank's block: count, then (epoch, a, b) per range */
    int64_t *me = adt_malloc((size_t)W * sizeof *me);
    me[0] = e->n_mine;
    for (int i = 0; i < e->n_mine; i++) {
        me[1 + 3 * i] = e->mine_epoch[i];
        me[2 + 3 * i] = e->mine[i].a;
        me[3 + 3 * i] = e->mine[i].b;
    }
    if (nd > 1) {
        int64_t *counts = adt_malloc((size_t)nd * sizeof *counts);
        for (int r = 0; r < nd; r++) counts[r] = W * 2; /* int64 as two int32 */
        rc = adt_comm_allgather(data_comm(t), me, e->gathered, counts, ADT_I32);
        free(counts);
    } else {
        memcpy(e->gathered, me, (size_t)W * sizeof *me);
    }
    free(me);
    e->gather_s = adt_now_s() - t_lease;
    if (rc) return train_fail(EXIT_RUNTIME, "step %ld: gathering the leased samples: %s", step, adt_error_message());
    /* Every rank holds its lease of this step now (the gather is done), so the next step's may
     * be asked for: all of step s's positions are handed out before any of step s + 1's, the
     * sampler's order. Not beyond the run or a known stop: that lease would go unused. */
    int64_t stop_at = adt_elastic_pipe_stop_at(e->pipe);
    if (step < t->o.steps && (stop_at <= 0 || step < stop_at)) {
        int st = adt_elastic_pipe_prefetch(e->pipe, local_batch(t, e, step + 1));
        if (st) return el_fail(st, "lease");
    }
    e->step_el_s += adt_now_s() - e->step_t0;
    int64_t n = 0, *ranges = adt_malloc((size_t)nd * MAX_RANGES * 3 * sizeof *ranges);
    int64_t split[ADT_STRAGGLER_MAX_RANKS];
    for (int r = 0; r < nd; r++) {
        const int64_t *blk = e->gathered + (size_t)r * W;
        memcpy(ranges + 3 * n, blk + 1, (size_t)blk[0] * 3 * sizeof *ranges);
        n += blk[0];
        split[r] = 0;
        for (int64_t i = 0; i < blk[0]; i++) split[r] += blk[3 + 3 * i] - blk[2 + 3 * i];
    }
    /* the master's split: every rank leased its local batch, so the leases say the split */
    if (t->o.bal.by_feed && nd <= ADT_STRAGGLER_MAX_RANKS) {
        int64_t sum = 0;
        for (int r = 0; r < nd; r++) sum += split[r];
        if (sum == t->o.batch && t->ps) rc = train_ps_set_split(t, split, nd, step);
        else if (sum == t->o.batch && t->bal) train_balance_set_split(t, split, step);
    }
    if (rc) {
        free(ranges);
        return rc;
    }
    qsort(ranges, (size_t)n, 3 * sizeof *ranges, cmp_range);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t ep = ranges[3 * i], a = ranges[3 * i + 1], b = ranges[3 * i + 2];
        if (ep != e->perm_epoch && e->job.shuffle) adt_sample_permutation(e->perm, t->train.count, e->job.seed, ep);
        e->perm_epoch = ep;
        for (int64_t p = a; p < b && k < t->o.batch; p++) idx[k++] = e->job.shuffle ? e->perm[p] : p;
    }
    free(ranges);
    if (k != t->o.batch)
        return train_fail(EXIT_RUNTIME, "step %ld: the master handed out %lld of the %ld samples of a batch; "
                          "expected a ledger job of at least --steps %ld steps", step, (long long)k, t->o.batch,
                          t->o.steps);
    return 0;
}

/* ---- after a step: report, agree, checkpoint ---------------------------------------------------- */

/* --mode ps: one consistent cut after `step` into DIR/ckpt-S-gG/ - every server's shard and then the
 * run file with the data position (train_ckpt_save, the --save format of ps.c), written while the
 * workers wait (the servers write their shards themselves at the cut: there is no state here to
 * copy aside) - then the first worker commits step S with the ledger, so the model state and the
 * data position are one commit. A cut that does not complete is never committed: a restore reads
 * only a named commit's directory. */
static int ps_checkpoint(trainer *t, train_elastic *e, long step, int64_t gen) {
    char name[128], path[4400];
    ckpt_name(name, sizeof name, step, gen, 1);
    snprintf(path, sizeof path, "%s/%s", t->o.elastic_dir, name);
    int rc = train_ckpt_save(t, path, step);
    if (rc || t->rank != t->reporter) return rc;
    if ((rc = adt_elastic_commit(e->commit, step, name))) return el_fail(rc, "commit");
    prune_ckpts(t->o.elastic_dir, step, e->last_name); /* the commit in force and the one before stay */
    e->last_commit = step;
    snprintf(e->last_name, sizeof e->last_name, "%s", name);
    return 0;
}

/* The state after `step` into the flash file (the only time the step waits), then published,
 * written and committed in the background; without --flash, written and committed here. */
static int checkpoint(trainer *t, train_elastic *e, long step) {
    int64_t gen = adt_elastic_generation(e->c);
    double t0 = adt_now_s();
    if (t->ps) {
        int rc = ps_checkpoint(t, e, step, gen);
        if (rc) return rc;
    } else if (e->flash) {
        int slot;
        uint8_t *mem = adt_flash_begin(e->flash, &slot);
        copy_state(t, e, mem, 1);
        if (adt_flash_end(e->flash, slot, gen, step, e->state_bytes))
            return train_fail(EXIT_RUNTIME, "--flash: %s", adt_error_message());
    } else if (t->rank == 0 || e->sharded) {
        uint8_t *mem = adt_malloc(e->state_bytes ? e->state_bytes : 1);
        copy_state(t, e, mem, 1);
        int rc = persist(t, gen, step, mem, e->state_bytes);
        free(mem);
        if (rc) return el_fail(rc, "checkpoint");
    }
    double dt = adt_now_s() - t0;
    e->blocked_s += dt;
    if (dt > e->blocked_max_s) e->blocked_max_s = dt;
    e->n_flash++;
    if (t->log && fprintf(t->log, "{\"step\":%ld,\"checkpoint_blocked_ms\":%.3f}\n", step, dt * 1e3) > 0) fflush(t->log);
    return 0;
}

/* Waits until the checkpoint of `step` is committed (rank 0) and every rank knows it. */
static int commit_wait(trainer *t, train_elastic *e, long step) {
    int rc = 0;
    if (e->flash) {
        int64_t done = -1;
        int st = adt_flash_wait(e->flash, &done);
        if (st) rc = el_fail(st, "checkpoint");
        else if (t->rank == 0 && done != step)
            rc = train_fail(EXIT_RUNTIME, "elastic: the checkpoint of step %ld was not committed", step);
    }
    return data_agree(t, rc);
}

/* The step's elastic time into the totals and the --log (at the step's end). */
static void account_step(trainer *t, train_elastic *e, long step) {
    double wall = adt_now_s() - e->step_t0;
    e->el_s += e->step_el_s;
    e->wall_s += wall;
    e->el_steps++;
    if (t->log && fprintf(t->log,
                          "{\"step\":%ld,\"elastic_ms\":%.3f,\"step_wall_ms\":%.3f,\"lease_wait_ms\":%.3f,"
                          "\"gather_ms\":%.3f,\"report_ms\":%.3f,\"agree_ms\":%.3f}\n",
                          step, e->step_el_s * 1e3, wall * 1e3, e->lease_s * 1e3, e->gather_s * 1e3,
                          e->report_s * 1e3, e->agree_s * 1e3) > 0)
        fflush(t->log);
}

/* Every queued report acknowledged: a commit after it covers reported steps only. */
static int drain(train_elastic *e) {
    int st = adt_elastic_pipe_drain(e->pipe);
    return st ? el_fail(st, "report") : 0;
}

static int step_done(trainer *t, train_elastic *e, long step, int *stop) {
    *stop = 0;
    double t_rep = adt_now_s();
    /* with this rank's compute time of the step: the master's straggler controller judges by it;
     * under --mode ps with each server's answer time to the step's pull, which its monitor compares */
    double srv[ADT_ELASTIC_MAX_SERVERS];
    int n_srv = t->ps ? train_ps_answer_s(t, srv, ADT_ELASTIC_MAX_SERVERS) : 0;
    int st = e->n_mine ? adt_elastic_pipe_report_timed(e->pipe, step - 1, e->mine, e->n_mine, train_balance_compute_s(t),
                                                       srv, n_srv <= ADT_ELASTIC_MAX_SERVERS ? n_srv : 0)
                       : adt_elastic_pipe_status(e->pipe);
    e->report_s = adt_now_s() - t_rep;
    if (st) return el_fail(st, "report");
    /* A step that will checkpoint as far as this rank knows drains its reports before the
     * agreement, so that the commit after it follows every rank's reports. */
    int64_t known = adt_elastic_pipe_stop_at(e->pipe);
    int drained = g_term || step == t->o.steps || step % t->o.commit_every == 0 || (known > 0 && step >= known);
    if (drained && drain(e)) return EXIT_RUNTIME;
    /* { SIGTERM seen, ranks that know a stop step, the sum of their stop steps, ranks drained }:
     * every rank that knows the stop step has the same */
    int64_t ctl[4] = {g_term, known > 0, known, drained};
    double t_agree = adt_now_s();
    if (data_size(t) > 1 && adt_comm_allreduce_i64(data_comm(t), ctl, 4))
        return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    e->agree_s = adt_now_s() - t_agree;
    int64_t stop_at = ctl[1] ? ctl[2] / ctl[1] : 0;
    int planned = stop_at > 0 && step >= stop_at, last = step == t->o.steps;
    if (!(planned || ctl[0] || last || step % t->o.commit_every == 0)) return 0;
    if (ctl[3] < data_size(t)) { /* a SIGTERM some rank did not see: all drain, then agree on it */
        int rc = drained ? 0 : drain(e);
        if ((rc = data_agree(t, rc))) return rc;
    }
    int rc = checkpoint(t, e, step);
    if (rc || !(planned || ctl[0] || last)) return rc;
    if ((rc = commit_wait(t, e, step))) return rc;
    *stop = 1;
    train_note(t, "elastic: step %ld committed; %s", step,
               ctl[0] ? "stopping (SIGTERM)" : planned ? "stopping as the master asked" : "the run is complete");
    e->finished = last && !planned && !ctl[0];
    if (e->n_flash)
        train_note(t, "elastic: %ld checkpoints blocked training %.3f ms each on average (%.3f ms at most)", e->n_flash,
                   e->blocked_s * 1e3 / (double)e->n_flash, e->blocked_max_s * 1e3);
    if (ctl[0] && !planned && !last)
        return train_fail(EXIT_RUNTIME, "stopped by SIGTERM after committing step %ld", step);
    return 0;
}

int train_elastic_step_done(trainer *t, long step, int *stop) {
    train_elastic *e = t->el;
    double t0 = adt_now_s();
    int rc = step_done(t, e, step, stop);
    e->step_el_s += adt_now_s() - t0;
    account_step(t, e, step);
    if (*stop && e->el_steps)
        train_note(t, "elastic: %.3f ms/step of elastic work in %.3f ms/step (%.2f%% of the step; %ld steps)",
                e->el_s * 1e3 / (double)e->el_steps, e->wall_s * 1e3 / (double)e->el_steps,
                e->wall_s > 0 ? 100 * e->el_s / e->wall_s : 0.0, e->el_steps);
    return rc;
}

void train_elastic_poll_env(void) {
    if (!getenv("ADT_MASTER") || getenv("ADT_COMM_POLL")) return;
    /* Measured (2 ranks on 2 cores, MLP steps, a loaded VM): 15-24 ms/step spinning, 4-7 ms
     * polite; the ranks' spinning held the cores while the control plane's replies waited. */
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    long local = lw ? strtol(lw, NULL, 10) : 1, cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 0 && local >= cpus) setenv("ADT_COMM_POLL", "polite", 0);
}

int train_elastic_continues(void) {
    const char *g = getenv("ADT_GENERATION");
    return getenv("ADT_MASTER") && g && strtoll(g, NULL, 10) > 1;
}

void train_elastic_free(trainer *t) {
    train_elastic *e = t->el;
    if (!e) return;
    if (t->world && e->finished && !t->ps) { /* (the parameter servers take no part here) */
        /* MPI_Finalize over UCX's tcp transport can wait forever for a peer that went on to
         * finalize's PMI barrier first (seen across network namespaces, about 1 run in 8): every
         * rank drains here first, and a finalize that still hangs ends the process after 10 s
         * (the comm watchdog) - the run is committed, so the next world only sees it complete. */
        adt_comm_barrier(t->world);
        adt_comm_set_timeout(t->world, 10);
    }
    adt_flash_close(e->flash);
    /* a finished run leaves no flash file behind; a stopped one keeps it for the next world */
    if (e->flash && e->finished) adt_flash_remove(e->flash_path);
    adt_elastic_pipe_free(e->pipe);
    adt_elastic_close(e->commit);
    adt_elastic_close(e->c);
    free(e->perm);
    free(e->gathered);
    free(e->offset);
    free(e);
    t->el = NULL;
}

const train_feed train_feed_elastic = {"elastic leases", train_elastic_plan, train_elastic_start, train_elastic_batch,
                                       train_elastic_step_done, train_elastic_free};
