/*
 * mpi_world.h - launching MPI worlds from a test program: finding mpiexec, running
 * `mpiexec -n N PROGRAM ARGS...` (or the program alone, an MPI singleton) with stdout and stderr
 * captured and a hard time limit, and reading what the ranks reported.
 *
 * A child rank reports each case as a line "CASE <name> rank=<r> size=<p> ok|FAIL" on stdout and
 * ends with "DONE rank=<r> size=<p>"; a world passes a case when every rank reported it ok.
 * The mpiexec is $ADT_MPIEXEC, else mpiexec.mpich (Debian's name, when the library is MPICH),
 * else mpiexec on PATH. Under AddressSanitizer, mpi_world_sanitizer_env() keeps LeakSanitizer on
 * in the children with tests/lsan-mpi.supp (third-party UCX frames only).
 */
#ifndef ADTRAIN_TESTS_MPI_WORLD_H
#define ADTRAIN_TESTS_MPI_WORLD_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"

static char g_mpiexec[PATH_MAX];

static inline int mpi_on_path(const char *name, char *out) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[PATH_MAX];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, name);
        if (access(buf, X_OK) == 0) {
            snprintf(out, PATH_MAX, "%s", buf);
            return 1;
        }
        p += n + (p[n] == ':');
    }
    return 0;
}

static inline int mpi_find_mpiexec(void) {
    const char *e = getenv("ADT_MPIEXEC");
    if (e && *e) {
        snprintf(g_mpiexec, sizeof g_mpiexec, "%s", e);
        return 1;
    }
    if (strstr(adt_comm_mpi_library(), "MPICH") && mpi_on_path("mpiexec.mpich", g_mpiexec)) return 1;
    return mpi_on_path("mpiexec", g_mpiexec);
}

typedef struct mpi_world {
    int n;                    /* ranks; 0: the program alone (an MPI singleton) */
    const char *const *argv;  /* the program and its arguments, NULL-terminated */
    int status;               /* exit status, 128+signal, or -1 if ended at the time limit */
    double secs;
    char *out, *err;
} mpi_world;

static inline char *mpi_slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return adt_strdup("");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *b = malloc((size_t)(n > 0 ? n : 0) + 1);
    size_t got = fread(b, 1, (size_t)(n > 0 ? n : 0), fp);
    b[got] = 0;
    fclose(fp);
    return b;
}

static inline void mpi_nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Runs one world with its output in files under tmpdir, ended (its process group) at `limit`
 * seconds. */
static inline void mpi_run_world(mpi_world *wd, const char *tmpdir, double limit) {
    static int serial;
    char outp[PATH_MAX], errp[PATH_MAX];
    snprintf(outp, sizeof outp, "%s/world%d.%d.out", tmpdir, wd->n, serial);
    snprintf(errp, sizeof errp, "%s/world%d.%d.err", tmpdir, wd->n, serial++);
    double t0 = adt_now_s();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(120);
        dup2(fo, 1), dup2(fe, 2);
        close(fo), close(fe);
        const char *av[64];
        int k = 0;
        char nb[16];
        if (wd->n) {
            snprintf(nb, sizeof nb, "%d", wd->n);
            av[k++] = g_mpiexec, av[k++] = "-n", av[k++] = nb;
        }
        for (int i = 0; wd->argv[i] && k < 63; i++) av[k++] = wd->argv[i];
        av[k] = NULL;
        execv(av[0], (char *const *)av);
        fprintf(stderr, "exec %s: %s\n", av[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0, killed = 0;
    for (;;) {
        pid_t got = waitpid(pid, &st, WNOHANG);
        if (got == pid) break;
        if (got < 0 && errno != EINTR) break;
        double el = adt_now_s() - t0;
        if (!killed && el > limit) {
            kill(-pid, SIGTERM);
            killed = 1;
        } else if (killed == 1 && el > limit + 3) {
            kill(-pid, SIGKILL);
            killed = 2;
        }
        mpi_nap(0.02);
    }
    wd->secs = adt_now_s() - t0;
    wd->status = killed ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    wd->out = mpi_slurp(outp);
    wd->err = mpi_slurp(errp);
    unlink(outp);
    unlink(errp);
}

static inline void mpi_world_free(mpi_world *wd) {
    free(wd->out);
    free(wd->err);
    wd->out = wd->err = NULL;
}

static inline void mpi_print_tail(const char *label, const char *text, int lines) {
    const char *p = text + strlen(text);
    for (int k = 0; p > text; p--)
        if (p[-1] == '\n' && ++k > lines) break;
    fprintf(stderr, "  %s (tail):\n", label);
    for (const char *q = p; *q;) {
        size_t n = strcspn(q, "\n");
        fprintf(stderr, "    | %.*s\n", (int)n, q);
        q += n + (q[n] == '\n');
    }
}

/* Whether rank r of a world of p reported case `name` ok. */
static inline int mpi_case_ok(const mpi_world *wd, const char *name, int r, int p) {
    char line[160];
    snprintf(line, sizeof line, "CASE %s rank=%d size=%d ok\n", name, r, p);
    return strstr(wd->out, line) != NULL;
}

/* Whether every rank printed its DONE line. */
static inline int mpi_all_done(const mpi_world *wd, int p) {
    for (int r = 0; r < p; r++) {
        char line[64];
        snprintf(line, sizeof line, "DONE rank=%d size=%d\n", r, p);
        if (!strstr(wd->out, line)) return 0;
    }
    return 1;
}

/* A child rank's start: the MPI world, with log lines tagged by the rank; NULL (the reason
 * printed) if MPI did not start. */
static inline adt_comm *mpi_child_world(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) {
        fprintf(stderr, "FAIL adt_comm_init: %s\n", adt_error_message());
        return NULL;
    }
    static char tag[32];
    snprintf(tag, sizeof tag, "rank %d", adt_comm_rank(w));
    adt_log_set_tag(tag);
    return w;
}

/* A child's report of one case. */
static inline void mpi_report(const char *name, int r, int p, int ok) {
    printf("CASE %s rank=%d size=%d %s\n", name, r, p, ok ? "ok" : "FAIL");
    fflush(stdout);
}

/* Prints a failed world's own CHECK failures and the end of what it printed. */
static inline void mpi_print_failure(const mpi_world *wd) {
    for (const char *q = wd->err; *q;) {
        size_t n = strcspn(q, "\n");
        if (n >= 6 && !strncmp(q, "  FAIL", 6)) fprintf(stderr, "    %.*s\n", (int)n, q);
        q += n + (q[n] == '\n');
    }
    mpi_print_tail("stderr", wd->err, 30);
    mpi_print_tail("stdout", wd->out, 10);
}

/* Under AddressSanitizer the children keep LeakSanitizer on, with tests/lsan-mpi.supp
 * (third-party frames only: UCX objects that a rank leaving through MPI_Abort never frees; tests
 * run from the repository root). hwloc's PCI plugin, loaded by MPICH, leaks a few allocations
 * too but is unloaded before LeakSanitizer runs, so its frames have no name a suppression could
 * match: the children skip PCI discovery, which MPICH does not need on one node. */
static inline void mpi_world_sanitizer_env(void) {
#if defined(__SANITIZE_ADDRESS__)
    char cwd[PATH_MAX], lsan[3 * PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    const char *old = getenv("LSAN_OPTIONS");
    snprintf(lsan, sizeof lsan, "suppressions=%s/tests/lsan-mpi.supp:print_suppressions=0%s%s", cwd,
             old && *old ? ":" : "", old && *old ? old : "");
    setenv("LSAN_OPTIONS", lsan, 1);
    setenv("HWLOC_COMPONENTS", "-pci", 1);
#endif
}

#endif
