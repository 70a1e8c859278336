/*
 * agent_internal.h - what world.c needs from workers.c: resolving the command, building a
 * worker's environment and forking it with the process rules of adtrain/agent.h.
 */
#ifndef ADTRAIN_ELASTIC_AGENT_INTERNAL_H
#define ADTRAIN_ELASTIC_AGENT_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

/* The executable argv[0] names: as given if it holds a '/', else the first match in PATH.
 * ADT_ERR_ARG naming the command if there is none (or it is not executable). */
int wk_resolve_command(const char *argv0, char *path, size_t cap);

/* The CPUs this process may run on, in increasing order; returns how many (>= 1). */
int wk_allowed_cpus(int *cpus, int cap);

/* A worker environment: the agent's own, without any inherited PMI_* / torchrun variables that
 * `sets` replaces or that would point the worker at the wrong process manager, then `sets`, then
 * `user` (both "NAME=value" arrays; a later entry with the same name wins). Free with
 * wk_env_free. */
char **wk_env_build(const char *const *sets, int n_sets, const char *const *user);
void wk_env_free(char **env);

typedef struct wk_spawn {
    const char *path;   /* resolved executable         */
    char *const *argv;
    char *const *envp;
    int pmi_fd;         /* kept open across exec, or -1 */
    int out_fd, err_fd; /* become stdout/stderr, or -1 to inherit the agent's */
    int null_fd;        /* becomes stdin               */
    int cpu;            /* sched_setaffinity to this CPU, or -1 */
} wk_spawn;

/* Forks and execs one worker: own session and process group, PDEATHSIG SIGKILL, default signal
 * dispositions, every other descriptor closed on exec. Returns once exec has succeeded (or
 * failed: then the child is reaped and the error names the command). All descriptors in `a`
 * must be >= 3. *pidfd is a pollable pidfd for the child (close-on-exec). */
int wk_spawn_one(const wk_spawn *a, pid_t *pid, int *pidfd);

/* A control connection: no Nagle (small request/reply exchanges), TCP keepalive (idle 1 s,
 * interval 1 s, 3 probes) and TCP_USER_TIMEOUT, so a peer host that vanished silently is found
 * in a few seconds even while no request is in flight. */
void wk_tcp_live(int fd, unsigned user_timeout_ms);

/* fd itself if it is >= 3, else a close-on-exec duplicate >= 3 (and fd is closed). */
int wk_fd_high(int fd);

#endif
