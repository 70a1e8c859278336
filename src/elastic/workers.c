/*
 * workers.c - starting worker processes: PATH lookup, environment, fork/exec with the process
 * rules of adtrain/agent.h (own session and process group, die with the agent, nothing
 * inherited but what is meant to be, optional CPU binding).
 *
 * Everything that allocates happens in the parent before fork(); the child runs only
 * async-signal-safe system calls until execve, so starting workers is safe from a threaded agent.
 */
#include "agent_internal.h"
#include "adtrain/base.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int wk_resolve_command(const char *argv0, char *path, size_t cap) {
    if (!argv0 || !*argv0) return adt_error(ADT_ERR_ARG, "worker command: empty argv[0]");
    if (strchr(argv0, '/')) {
        if ((size_t)snprintf(path, cap, "%s", argv0) >= cap)
            return adt_error(ADT_ERR_ARG, "worker command '%.80s...': path too long", argv0);
        if (access(path, X_OK))
            return adt_error(ADT_ERR_ARG, "worker command '%s': %s", argv0, strerror(errno));
        return ADT_OK;
    }
    const char *p = getenv("PATH");
    if (!p || !*p) p = "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        const char *e = strchr(p, ':');
        size_t dl = e ? (size_t)(e - p) : strlen(p);
        /* an empty PATH entry means the current directory */
        int n = dl ? snprintf(path, cap, "%.*s/%s", (int)dl, p, argv0) : snprintf(path, cap, "./%s", argv0);
        struct stat st;
        if (n > 0 && (size_t)n < cap && !stat(path, &st) && S_ISREG(st.st_mode) && !access(path, X_OK))
            return ADT_OK;
        p += dl + (e ? 1 : 0);
    }
    return adt_error(ADT_ERR_ARG, "worker command '%s': not found in PATH", argv0);
}

int wk_allowed_cpus(int *cpus, int cap) {
    cpu_set_t set;
    int n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
            if (CPU_ISSET(c, &set)) cpus[n++] = c;
    if (n == 0) cpus[n++] = 0;
    return n;
}

static size_t name_len(const char *kv) {
    const char *eq = strchr(kv, '=');
    return eq ? (size_t)(eq - kv) : strlen(kv);
}

static int same_name(const char *a, const char *b) {
    size_t n = name_len(a);
    return n == name_len(b) && !strncmp(a, b, n);
}

/* Inherited variables a worker must never see: they would attach it to another process
 * manager's PMI (the agent itself may run under one) or contradict the rank we give it. */
static const char *const k_strip[] = {"PMI_FD",     "PMI_PORT",   "PMI_ID",  "PMI_RANK",
                                      "PMI_SIZE",   "PMI_SPAWNED", "PMI_KVSNAME",
                                      "MPIEXEC_HOSTNAME", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

char **wk_env_build(const char *const *sets, int n_sets, const char *const *user) {
    int n_user = 0, n_env = 0;
    while (user && user[n_user]) n_user++;
    while (environ && environ[n_env]) n_env++;
    /* ours then the user's; the later of two same-named entries wins */
    int n_all = n_sets + n_user;
    const char **all = adt_malloc((size_t)(n_all ? n_all : 1) * sizeof *all);
    for (int i = 0; i < n_sets; i++) all[i] = sets[i];
    for (int i = 0; i < n_user; i++) all[n_sets + i] = user[i];
    char **env = adt_malloc((size_t)(n_env + n_all + 1) * sizeof *env);
    int k = 0;
    for (int i = 0; i < n_env; i++) {
        int drop = 0;
        for (int j = 0; j < n_all && !drop; j++) drop = same_name(environ[i], all[j]);
        for (size_t j = 0; j < sizeof k_strip / sizeof *k_strip && !drop; j++)
            drop = same_name(environ[i], k_strip[j]);
        if (!drop) env[k++] = adt_strdup(environ[i]);
    }
    for (int i = 0; i < n_all; i++) {
        int later = 0;
        for (int j = i + 1; j < n_all && !later; j++) later = same_name(all[i], all[j]);
        if (!later) env[k++] = adt_strdup(all[i]);
    }
    env[k] = NULL;
    free(all);
    return env;
}

void wk_env_free(char **env) {
    if (!env) return;
    for (char **p = env; *p; p++) free(*p);
    free(env);
}

int wk_fd_high(int fd) {
    if (fd < 0 || fd >= 3) return fd;
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return h;
}

/* What the child reports over the exec pipe when it cannot become the worker. */
typedef struct {
    int stage; /* 0 affinity, 1 exec, 2 parent gone, 3 setsid */
    int err;
} child_error;

static void child_fail(int pipe_fd, int stage, int err) {
    child_error ce = {stage, err};
    ssize_t rc = write(pipe_fd, &ce, sizeof ce);
    (void)rc;
    _exit(127);
}

/* Runs in the forked child: async-signal-safe calls only. */
static void child_main(const wk_spawn *a, int pipe_fd, pid_t parent) {
    /* its own session (so its own process group, and no terminal signals: the agent decides),
     * as Hydra does; with scheduler autogroups a session is also the unit of CPU fairness, and
     * ranks that shared the agent's session got about half the CPU of Hydra's on a busy host */
    if (setsid() < 0) child_fail(pipe_fd, 3, errno);
    /* die with the agent; if it is already gone, the signal would never come */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent) child_fail(pipe_fd, 2, 0);
    /* ignored signals and the mask survive exec; a worker starts from the defaults */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(a->null_fd, 0);
    if (a->out_fd >= 0) dup2(a->out_fd, 1);
    if (a->err_fd >= 0) dup2(a->err_fd, 2);
    /* no other rank's PMI socket, pidfd or pipe may leak into this one: a leaked PMI socket
     * would hide that rank's death (no EOF while a copy stays open) */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    if (a->pmi_fd >= 0) fcntl(a->pmi_fd, F_SETFD, 0);
    if (a->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(a->cpu, &set);
        if (sched_setaffinity(0, sizeof set, &set)) child_fail(pipe_fd, 0, errno);
    }
    execve(a->path, a->argv, a->envp);
    child_fail(pipe_fd, 1, errno);
}

int wk_spawn_one(const wk_spawn *a, pid_t *pid_out, int *pidfd_out) {
    *pid_out = -1;
    *pidfd_out = -1;
    int ep[2];
    if (pipe2(ep, O_CLOEXEC))
        return adt_error(ADT_ERR_IO, "starting '%s': pipe: %s", a->path, strerror(errno));
    ep[1] = wk_fd_high(ep[1]);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(ep[0]), close(ep[1]);
        return adt_error(ADT_ERR_IO, "starting '%s': fork: %s", a->path, strerror(e));
    }
    if (pid == 0) child_main(a, ep[1], parent);
    close(ep[1]);
    /* the group exists once exec has happened: the read below waits for that */
    child_error ce;
    ssize_t n;
    do n = read(ep[0], &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    close(ep[0]);
    if (n == (ssize_t)sizeof ce) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        static const char *const what[] = {"binding to a CPU", "exec", "the agent exited", "setsid"};
        return adt_error(ADT_ERR_ARG, "starting '%s': %s failed: %s", a->path, what[ce.stage % 4],
                         ce.stage == 2 ? "parent gone" : strerror(ce.err));
    }
    int pfd = pidfd_open(pid, 0);
    if (pfd < 0) {
        int e = errno;
        kill(pid, SIGKILL);
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
        return adt_error(ADT_ERR_IO, "starting '%s': pidfd_open: %s (Linux >= 5.3 needed)",
                         a->path, strerror(e));
    }
    *pid_out = pid;
    *pidfd_out = pfd;
    return ADT_OK;
}

void wk_tcp_live(int fd, unsigned user_timeout_ms) {
    int one = 1, idle = 1, intvl = 1, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}
