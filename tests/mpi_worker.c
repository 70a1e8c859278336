/*
 * mpi_worker.c - the worker program tests/test_agent.c starts through the agent library (no
 * mpiexec): plain MPICH, built without sanitizers.
 *
 *   mpi_worker allreduce DIR          MPI_Init, allreduce (rank+1) and max(rank), write
 *                                     DIR/rank<RANK>.txt (results, environment, CPUs), finalize
 *   mpi_worker loop DIR SECONDS       MPI_Init, write DIR/ready<RANK>, allreduce 1 KiB in a loop
 *                                     for SECONDS, finalize
 *   mpi_worker fail HOW VICTIM CODE   MPI_Init; rank VICTIM then fails: HOW = exit (exit CODE
 *                                     without finalize), mpiabort (MPI_Abort with CODE), abort
 *                                     (abort()), nofinalize (exit 0 without finalize); the
 *                                     others wait in a barrier
 *   mpi_worker rawpmi bogus|binary|close
 *                                     no MPI: speaks PMI over PMI_FD by hand, completes init,
 *                                     then sends an unknown command / non-ASCII bytes, or closes
 *                                     the socket and keeps running
 *
 * Every wait is bounded (60 s) so a broken agent cannot leave these running for ever.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int env_int(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

/* The survivors of a planned failure park here until the agent stops them. */
static void wait_for_stop(void) {
    double t0 = mono();
    while (mono() - t0 < 60) sleep(1);
    exit(9);
}

static const char *const k_env[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ADT_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "ADT_RUN_ID", "PMI_FD", "PMI_RANK", "PMI_SIZE", "PMI_PORT", "PMI_ID", "OMP_NUM_THREADS",
    "ADT_TEST_EXTRA", NULL};

static int run_allreduce(const char *dir, double t_main) {
    MPI_Init(NULL, NULL);
    double t_init = mono();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int64_t mine = rank + 1, sum = 0;
    int maxr = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&rank, &maxr, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.txt", dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) return 2;
    fprintf(f, "mpi_rank=%d\nmpi_size=%d\nsum=%lld\nmax=%d\nt_main=%.6f\nt_init=%.6f\npid=%d\nsid=%d\n"
            "pgid=%d\nstdin_null=%d\n", rank, size, (long long)sum, maxr, t_main, t_init, (int)getpid(),
            (int)getsid(0), (int)getpgid(0), read(0, path, 1) == 0);
    for (int i = 0; k_env[i]; i++)
        if (getenv(k_env[i])) fprintf(f, "%s=%s\n", k_env[i], getenv(k_env[i]));
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    fprintf(f, "cpus=");
    for (int c = 0, first = 1; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) fprintf(f, first ? "%d" : ",%d", c), first = 0;
    fprintf(f, "\n");
    fclose(f);
    MPI_Finalize();
    return sum == (int64_t)size * (size + 1) / 2 && maxr == size - 1 ? 0 : 1;
}

static int run_loop(const char *dir, double seconds) {
    MPI_Init(NULL, NULL);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char path[4096];
    snprintf(path, sizeof path, "%s/ready%d", dir, rank);
    FILE *f = fopen(path, "w");
    if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
    float in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (float)rank;
    double t0 = mono();
    while (mono() - t0 < seconds) MPI_Allreduce(in, out, 256, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}

/* PMI by hand: one request, one reply line. */
static int pmi_fd = -1;
static void pmi_send(const char *s, size_t n) {
    while (n) {
        ssize_t k = write(pmi_fd, s, n);
        if (k <= 0) exit(3);
        s += k, n -= (size_t)k;
    }
}
static void pmi_reply(void) {
    char ch;
    do
        if (read(pmi_fd, &ch, 1) != 1) exit(4);
    while (ch != '\n');
}

static int run_rawpmi(const char *what) {
    pmi_fd = env_int("PMI_FD");
    if (pmi_fd < 0) return 5;
    const char *init = "cmd=init pmi_version=1 pmi_subversion=1\n";
    pmi_send(init, strlen(init));
    pmi_reply();
    if (!strcmp(what, "bogus")) pmi_send("cmd=bogus\n", 10);
    else if (!strcmp(what, "binary")) pmi_send("cmd=get\x01\xff key=\x02\n", 16);
    else close(pmi_fd);
    wait_for_stop();
    return 0;
}

/* Every rank passes MPI_Init and a barrier; then the victim fails in the way asked and the
 * others wait in a barrier that never completes. */
static int run_fail(const char *how, int victim, int code) {
    MPI_Init(NULL, NULL);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == victim) {
        if (!strcmp(how, "exit")) exit(code);
        if (!strcmp(how, "mpiabort")) MPI_Abort(MPI_COMM_WORLD, code);
        if (!strcmp(how, "abort")) abort();
        if (!strcmp(how, "nofinalize")) exit(0);
        return 64;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    wait_for_stop();
    return 0;
}

int main(int argc, char **argv) {
    double t_main = mono();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 64;
    const char *mode = argv[1];
    if (!strcmp(mode, "allreduce") && argc == 3) return run_allreduce(argv[2], t_main);
    if (!strcmp(mode, "loop") && argc == 4) return run_loop(argv[2], atof(argv[3]));
    if (!strcmp(mode, "rawpmi") && argc == 3) return run_rawpmi(argv[2]);
    if (!strcmp(mode, "fail") && argc == 5) return run_fail(argv[2], atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "mpi_worker: bad arguments\n");
    return 64;
}
