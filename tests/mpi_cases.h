/*
 * mpi_cases.h - a test program that launches itself as MPI worlds: without arguments it is the
 * parent (seed, temporary folder, a 60 s communication timeout, the children's sanitizer
 * settings), which runs `mpiexec -n N PROGRAM --child` for a range of N and counts each case of
 * each world as one result; with --child it is a rank that runs every case and reports it.
 * Include after check.h, cli_run.h and mpi_world.h.
 */
#ifndef ADTRAIN_TESTS_MPI_CASES_H
#define ADTRAIN_TESTS_MPI_CASES_H

#include <stdint.h>
#include <time.h>

typedef struct mpi_case {
    const char *name;
    void (*fn)(void);
} mpi_case;

static char g_self[PATH_MAX];

/* A child rank: every case in order (each reported by this rank), then the world's end. */
static inline int mpi_child_cases(adt_comm *world, const mpi_case *cases, int n) {
    int rank = adt_comm_rank(world), size = adt_comm_size(world);
    for (int i = 0; i < n; i++) {
        check_cur_failed = 0;
        check_cur_name = cases[i].name;
        cases[i].fn();
        mpi_report(cases[i].name, rank, size, !check_cur_failed);
    }
    int rc = adt_comm_finalize(world);
    if (rc) fprintf(stderr, "FAIL rank %d: adt_comm_finalize: %s\n", rank, adt_error_message());
    printf("DONE rank=%d size=%d\n", rank, size);
    fflush(stdout);
    return rc ? 1 : 0;
}

/* A child's main: joins the world (its rank and size into *rank, *size), then every case. */
static inline int mpi_child_main(const mpi_case *cases, int n, adt_comm **world, int *rank, int *size) {
    if (!(*world = mpi_child_world())) return 1;
    *rank = adt_comm_rank(*world);
    *size = adt_comm_size(*world);
    return mpi_child_cases(*world, cases, n);
}

/* The parent: one world per size in [lo, hi]; a case passes when every rank reported it ok. */
static inline void mpi_test_worlds(const mpi_case *cases, int n_cases, int lo, int hi, double limit) {
    CHECK(mpi_find_mpiexec(), "no mpiexec on PATH (install mpich, or set ADT_MPIEXEC)");
    if (!g_mpiexec[0]) return;
    for (int n = lo; n <= hi; n++) {
        const char *argv[] = {g_self, "--child", NULL};
        mpi_world wd = {.n = n, .argv = argv};
        mpi_run_world(&wd, check_tmpdir(), limit);
        int bad = 0;
        for (int i = 0; i < n_cases; i++) {
            char ranks[64] = "";
            for (int r = 0; r < n; r++)
                if (!mpi_case_ok(&wd, cases[i].name, r, n)) {
                    size_t k = strlen(ranks);
                    snprintf(ranks + k, sizeof ranks - k, " %d", r);
                }
            if (ranks[0]) {
                fprintf(stderr, "  FAIL mpiexec -n %d: case %s: rank%s failed or did not report\n", n, cases[i].name, ranks);
                check_n_failed++, bad = 1;
            } else {
                check_n_passed++;
            }
        }
        int done = mpi_all_done(&wd, n);
        CHECK(wd.status == 0 && done, "mpiexec -n %d: exit status %d%s after %.1f s, %s", n, wd.status,
              wd.status < 0 ? " (ended at the time limit)" : "", wd.secs,
              done ? "every rank finished" : "not every rank finished");
        if (bad || wd.status || !done) mpi_print_failure(&wd);
        else mpi_print_tail("rank 0 summary", wd.err, 30);
        fprintf(stderr, "%s mpiexec -n %d: %.1f s\n", bad || wd.status || !done ? "FAILED" : "ok", n, wd.secs);
        mpi_world_free(&wd);
    }
}

/* The start of main(): the seed ($ADT_TEST_SEED, else the time; printed, and passed to the
 * children), then either the child (child() is returned through *exit_code) or the parent's setup.
 * Returns 1 when main should return *exit_code now. */
static inline int mpi_test_start(int argc, char **argv, const char *name, uint64_t *seed, int (*child)(void),
                                 int *exit_code) {
    const char *s = getenv("ADT_TEST_SEED");
    *seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    if (argc > 1) {
        if (!strcmp(argv[1], "--child")) *exit_code = child();
        else fprintf(stderr, "usage: test_%s [--child]\n", name), *exit_code = 2;
        return 1;
    }
    printf("seed %llu\n", (unsigned long long)*seed);
    char sb[32];
    snprintf(sb, sizeof sb, "%llu", (unsigned long long)*seed);
    setenv("ADT_TEST_SEED", sb, 1);
    ssize_t k = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (k <= 0) {
        fprintf(stderr, "cannot find this program: %s\n", strerror(errno));
        *exit_code = 1;
        return 1;
    }
    g_self[k] = 0;
    cli_find_binary();
    if (check_tmpdir_make(name)) {
        *exit_code = 1;
        return 1;
    }
    /* a hang ends in 60 s with an error, not at the 300 s default */
    setenv("ADT_COMM_TIMEOUT", "60", 1);
    mpi_world_sanitizer_env();
    return 0;
}

#endif
