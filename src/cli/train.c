/*
 * train.c - `adtrain train`: parses the flags into the trainer's options, runs adt_trainer
 * (src/train/) step by step, and prints: the banner, progress, evaluations, the trainer's notes,
 * the profile. Exit status: 0 done, 1 a failure while running, 2 a bad flag, config or dataset
 * (found before the first step), 3 an elastic worker whose world generation ended.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/train.h"
#include "cli.h"

#define EXIT_STALE 3

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: adtrain train [options]\n"
            "       mpiexec -n N adtrain train [options]\n"
            "\n"
            "Trains a model on one process, or under mpiexec on N processes (data parallel: each rank\n"
            "takes its part of every batch; the logged losses are those of the one-process run; only\n"
            "rank 0 prints and writes the log). With no options: the built-in tiny GPT (2 layers, width\n"
            "64, 4 heads, n_ctx 64) on Tiny Shakespeare if " ADT_TRAIN_DEFAULT_TEXT "\n"
            "exists, else on synthetic:text.\n"
            "\n"
            "model and data:\n"
            "  --model CFG.json        model config (configs/*.json); default: built-in gpt-tiny,\n"
            "                          whose vocab_size follows the data\n"
            "  --data KIND:PATH        text:FILE (characters are tokens), synthetic:text, synthetic:mlp\n"
            "  --val KIND:PATH         validation data; default: the last 10%% of --data's samples\n"
            "optimization:\n"
            "  --steps N               optimizer steps (default 200)\n"
            "  --batch B               samples per step (default 16)\n"
            "  --optimizer sgd|adamw   default adamw: lr 1e-3, betas (0.9, 0.95), eps 1e-8;\n"
            "                          sgd: lr 0.1, no momentum\n"
            "  --lr X                  peak learning rate\n"
            "  --momentum M            SGD momentum in [0, 1) (default 0)\n"
            "  --weight-decay W        decoupled weight decay (default 0)\n"
            "  --warmup N              linear warmup steps (default 0)\n"
            "  --schedule constant|cosine   after warmup; cosine decays to 10%% of lr (default cosine)\n"
            "  --shuffle on|off        per-epoch seeded permutation of samples (default on)\n"
            "  --seed S                initialisation, dropout and shuffling (default 1337)\n"
            "  --threads T             BLAS threads, per rank (default 1)\n"
            "  --plan PLAN.json        the parallel plan of an mpiexec run (adtrain plan -o PLAN.json; made\n"
            "                          for this model, --batch and optimizer, one device per rank, one\n"
            "                          stage); default: data parallel over all ranks\n"
            "stragglers (balanced data parallelism: each rank its own local batch, the gradients weighted\n"
            "by their share of --batch, so the update is the one-process one):\n"
            "  --straggler-policy off|dd|nd   off: a fixed split; dd: local batches follow measured speed;\n"
            "                          nd: the same, quicker, and a persistent straggler is reported for a\n"
            "                          restart when the remaining run pays for it\n"
            "  --straggler-config K=V,...     warmup, k, persist, clear, alpha, clip, gain, dd_after,\n"
            "                          nd_after, first, cooldown, restart_cost, min_local\n"
            "  --straggler-master HOST:PORT   rank 0 reports every step to this master (adtrain master\n"
            "                          --straggler-policy ...; token from $ADT_JOB_TOKEN), whose controller\n"
            "                          decides the split, and whose /dashboard shows the run\n"
            "  --split B0,B1,...       the initial local batches (sum --batch); default equal\n"
            "  --micro-batch M         at most M samples per forward/backward pass; a larger local batch\n"
            "                          accumulates gradients over several passes\n"
            "  --inject-slowdown RANK:FACTOR[@FIRST-LAST]   rank RANK sleeps so its compute takes FACTOR\n"
            "                          times as long (on steps FIRST..LAST); RANK:+SECONDS: a pause\n"
            "                          (--mode ps: a server rank pauses before each answer, +SECONDS only)\n"
            "parameter-server mode (a DLRM under mpiexec or adtrain launch: the first S ranks hold its embedding\n"
            "tables by row, the others pull their batch's rows, compute, push the rows' gradients; rank S prints\n"
            "and logs; under adtrain launch the workers lease the samples, rows are pulled at each step):\n"
            "  --mode collective|ps    default collective (a plan over every rank)\n"
            "  --ps-servers S          server ranks (default 1)\n"
            "  --ps-sync sync|ssp:K|async   sync: every step the one-process update; ssp:K: no worker more than\n"
            "                          K steps ahead of the slowest; async: no bound (default sync)\n"
            "  --ps-prefetch D         the next D steps' rows pulled while a step computes (default 1; 0\n"
            "                          under adtrain launch)\n"
            "  --ps-optimizer sgd|adagrad|adam   the rows' optimizer (default: sgd for --optimizer sgd, lazy\n"
            "                          adam for adamw) at --lr under --schedule and --warmup, as the dense ones\n"
            "  --ps-dense workers|servers   dense parameters all-reduced among the workers (default) or kept\n"
            "                          on the servers\n"
            "evaluation and logging:\n"
            "  --eval-every N          validation loss every N steps and at the end (default 0: off)\n"
            "  --eval-batches K        validation batches per evaluation (default 20)\n"
            "  --profile on|off        at the end, each rank prints where its steps went (after the first,\n"
            "                          a warm-up): compute per op, time in each kind of collective,\n"
            "                          polling collectives in flight between nodes, the slowest nodes\n"
            "                          (default off)\n"
            "  --log FILE.jsonl        one JSON object per step: step, loss, lr, ms, tokens_per_s,\n"
            "                          time_s (training time so far), wall_s (since the first step\n"
            "                          began: everything between steps included);\n"
            "                          and per evaluation: step, val_loss\n"
            "checkpoints (safetensors; PyTorch loads the parameters by name):\n"
            "  --init CKPT             start from these weights (adtrain or Hugging Face GPT-2 names)\n"
            "  --save PATH             write weights, optimizer state, step and data position at the end;\n"
            "                          \"{step}\" in PATH is replaced by the step (ckpt-{step}.safetensors)\n"
            "  --save-every N          ... and every N steps (atomically: a crash keeps the last one)\n"
            "  --resume PATH           continue a run saved with --save up to --steps in total; with the\n"
            "                          same flags it reproduces the uninterrupted run's losses bit for bit\n"
            "  under mpiexec (N > 1 ranks), --save PATH is a directory: a distributed checkpoint (each\n"
            "  rank writes its blocks, a manifest joins them; adtrain ckpt export makes one file);\n"
            "  --init and --resume read a directory or a file under any plan and number of ranks;\n"
            "  --mode ps: --save PATH is a directory of each server's shard and the workers' state, which\n"
            "  --resume reads with as many servers (no --init)\n"
            "elastic runs (under adtrain launch / adtrain agent, which set ADT_MASTER): the samples of\n"
            "every step come from the master's leases (the same order as above), each step is\n"
            "reported, and checkpoints are committed with the data position; a new world restores\n"
            "the committed one. SIGTERM or a planned change stops at a step boundary with a commit.\n"
            "  --elastic-dir DIR       committed checkpoints (default: the job's directory, $ADT_JOB_DIR,\n"
            "                          else adtrain-elastic)\n"
            "  --commit-every N        flash checkpoint, persisted and committed every N steps\n"
            "                          (default 10)\n"
            "  --flash on|off          copy the state to shared memory (/dev/shm, two slots with a\n"
            "                          crc32c) and write the file in the background (default on; --mode ps:\n"
            "                          off, the servers write their shards at the cut)\n"
            "  --lease-timeout S       a replica silent for S seconds loses its leases (default 30)\n"
            "\n"
            "exit status: 0 done, 1 failure while training, 2 bad flag, config or data\n");
}

/* The rank a launcher gave this process, read before MPI starts: flag errors are printed once. */
static int launched_rank(void) {
    static const char *vars[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

/* Returns 0 to go on, -1 after --help, else 2 with the message printed. */
static int parse_flags(adt_train_opts *o, int argc, char **argv) {
    adt_train_opts_init(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (!cli_quiet) train_usage(stdout);
            return -1;
        }
        char name[64];
        size_t len = strcspn(a, "=");
        if (a[0] != '-' || a[1] != '-' || len >= sizeof name || !adt_train_opts_known((memcpy(name, a, len), name[len] = 0, name))) {
            if (a[0] == '-') return cli_fail("train", 2, "unknown flag '%s' (see adtrain train --help)", a);
            return cli_fail("train", 2, "unexpected argument '%s': every option is a --flag (see adtrain train --help)", a);
        }
        const char *v = a[len] == '=' ? a + len + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) return cli_fail("train", 2, "%s: missing value (see adtrain train --help)", name);
            v = argv[++i];
        }
        if (adt_train_opts_set(o, name, v)) return cli_fail("train", 2, "%s", adt_error_message());
    }
    if (adt_train_opts_check(o)) return cli_fail("train", 2, "%s", adt_error_message());
    return 0;
}

typedef struct printer {
    int tty;
    int mid_line; /* a progress line without its newline is on the terminal */
} printer;

static void print_note(void *ctx, const char *line) {
    printer *p = ctx;
    if (p->mid_line) fprintf(stderr, "\r\033[K");
    p->mid_line = 0;
    fprintf(stderr, "%s\n", line);
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void print_progress(printer *p, const adt_trainer *t, const adt_train_step_info *st, double step_s,
                           double total_s, long done) {
    double ms = step_s * 1e3, per_s = st->items_per_s * st->seconds / (step_s > 0 ? step_s : 1e-9);
    char eta[32];
    format_eta(eta, sizeof eta, total_s / (double)done * (double)(st->steps - st->step));
    const char *unit = adt_trainer_rate_unit(t);
    if (p->tty) {
        fprintf(stderr, "\rstep %ld/%ld  loss %.4f  lr %.3g  %.3g ms/step  %.0f %s  ETA %s\033[K", st->step, st->steps,
                st->loss, st->lr, ms, per_s, unit, eta);
        p->mid_line = 1;
    } else {
        fprintf(stderr, "step %ld/%ld loss %.4f lr %.3g %.3g ms/step %.0f %s ETA %s\n", st->step, st->steps, st->loss,
                st->lr, ms, per_s, unit, eta);
    }
    fflush(stderr);
}

/* The loop: a step at a time, progress every 10 steps (on a terminal every 0.1 s). */
static int run(adt_trainer *t, printer *p, int quiet) {
    adt_train_step_info st;
    double first_loss = NAN, last_loss = NAN, total_s = 0, last_print = 0, win_s = 0;
    int win_n = 0;
    long done = 0, first = adt_trainer_start_step(t) + 1;
    int rc;
    while ((rc = adt_trainer_step(t, &st)) == ADT_OK) {
        done++, total_s += st.seconds;
        if (st.step == first) first_loss = st.loss;
        last_loss = st.loss;
        int last = st.step == st.steps;
        double now = adt_now_s();
        win_s += st.seconds, win_n++;
        if (!quiet && (p->tty ? (now - last_print > 0.1 || last || st.step == first)
                              : (st.step == first || st.step % 10 == 0 || last))) {
            print_progress(p, t, &st, win_s / win_n, total_s, done);
            last_print = now, win_s = 0, win_n = 0;
        }
        if (st.evaluated && !quiet) {
            if (p->mid_line) fprintf(stderr, "\r\033[K"), p->mid_line = 0;
            fprintf(stderr, "eval step %ld/%ld: val_loss %.4f%s\n", st.step, st.steps, st.val_loss, st.metric_text);
        }
    }
    if (p->mid_line && !quiet) fprintf(stderr, "\n"), p->mid_line = 0;
    if (rc < 0) return rc;
    if ((rc = adt_trainer_finish(t))) return rc;
    if (done > 0 && !quiet)
        fprintf(stderr, "done: %ld steps in %.2f s (%.3g ms/step); loss %.4f -> %.4f\n", done, total_s,
                total_s * 1e3 / (double)done, first_loss, last_loss);
    return 0;
}

/* A library status as the command's exit status. */
static int exit_code(int rc) {
    if (rc == ADT_ERR_ARG) return 2;
    if (rc == ADT_ERR_STALE) return EXIT_STALE;
    return rc ? 1 : 0;
}

int cli_train(int argc, char **argv) {
    int rank = adt_comm_launched() ? launched_rank() : 0;
    cli_set_rank(rank, rank ? 2 : 1);
    adt_train_opts o;
    int rc = parse_flags(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    printer p = {.tty = isatty(STDERR_FILENO)};
    o.note = print_note, o.note_ctx = &p;
    adt_trainer *t;
    if ((rc = adt_trainer_create(&t, &o))) {
        /* under adtrain agent every rank says why: the agent stops the world at the first rank's
         * exit, which may cut the one that would report the agreed error short */
        if (adt_trainer_error_is_mine() || getenv("ADT_MASTER")) cli_fail("train", 1, "%s", adt_error_message());
        return exit_code(rc);
    }
    cli_set_rank(adt_trainer_rank(t), adt_trainer_nranks(t));
    cli_quiet = !adt_trainer_reports(t); /* rank 0, or in --mode ps the first worker */
    if (!cli_quiet) adt_trainer_print_banner(t, stderr);
    rc = run(t, &p, cli_quiet);
    if (rc == ADT_ERR_STALE) { /* this world generation ended: nothing to save, no peer to wait for */
        cli_fail("train", EXIT_STALE, "%s", adt_error_message());
        _exit(EXIT_STALE);
    }
    if (rc) {
        if (adt_trainer_error_is_mine()) cli_fail("train", 1, "%s", adt_error_message());
        /* a rank that fails alone (a write, a read, a collective) must not leave the others
         * waiting in the next collective */
        adt_trainer_abort(t, exit_code(rc));
    } else if (o.profile) {
        adt_trainer_print_profile(t, stderr);
    }
    adt_trainer_free(t);
    return exit_code(rc);
}
