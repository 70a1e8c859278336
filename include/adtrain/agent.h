/*
 * adtrain/agent.h - the per-node process layer of the elastic runtime: a PMI-1 server and the
 * "world" of worker processes one agent starts, watches and stops.
 *
 * MPICH (Debian's 4.0.2, ch4:ucx) finds its peers through PMI-1, a plain-text line protocol
 * (Flux RFC 13): the process manager hands each rank a socket (PMI_FD, or PMI_PORT=host:port),
 * answers init/get_maxes/..., keeps a key-value store and runs barriers. Serving it ourselves
 * means no mpiexec in the control path, and the agent knows at once which rank died: the
 * rank's pidfd becomes readable, or its PMI socket reaches EOF before "finalize".
 *
 * One world = one generation of one MPI job. A death ends the world (MPI cannot repair it); the
 * caller starts the next generation as a new world. A world may be spread over several agents:
 * each one starts ranks [rank_offset, rank_offset + local_size) of world_size and serves their
 * PMI; the barrier hook lets the caller merge the key-value stores through a master before the
 * barrier is released.
 *
 * Event-loop use (the `adtrain agent` loop also talks to its master on its own sockets):
 *
 *     adt_world *w;
 *     if (adt_world_start(&w, &cfg) != ADT_OK) die(adt_error_message());
 *     while (adt_world_state_of(w) != ADT_WORLD_DONE) {
 *         int n = adt_world_pollfds(w, fds, adt_world_pollfd_max(w));
 *         ... append the caller's own fds (master socket, timers) after fds[n - 1] ...
 *         poll(fds, n + mine, min(adt_world_timeout_ms(w), my_timeout));  // -1 = no timer
 *         adt_world_dispatch(w, fds, n);                 // the fds it owns, and its timers
 *         adt_world_event ev;
 *         while (adt_world_next_event(w, &ev)) report(&ev);
 *     }
 *     adt_world_free(w);
 *
 * Or, without other fds: adt_world_step(w, timeout_ms) in a loop.
 *
 * Process rules: every worker leads its own session and process group (terminal signals go to
 * the agent, which decides; Hydra does the same), dies with the agent
 * (PR_SET_PDEATHSIG SIGKILL, so start worlds from a thread that lives as long as the agent), gets
 * stdin from /dev/null and inherits no descriptor but its PMI socket and stdio. When a worker
 * exits, whatever it left in its process group is killed with it. Nothing is left behind: every
 * worker is reaped by the world (pidfds; no SIGCHLD handler is installed, so the host program's
 * signal setup is untouched - but SIGCHLD must not be set to SIG_IGN, which would auto-reap).
 */
#ifndef ADTRAIN_AGENT_H
#define ADTRAIN_AGENT_H

#include <poll.h>
#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * PMI-1 server (protocol core). It works on byte streams, not on sockets: the caller reads a
 * connection's bytes into adt_pmi_conn_feed and sends what adt_pmi_conn_output returns. adt_world
 * does both for its workers; a master or a test can drive it directly.
 */
typedef struct adt_pmi_server adt_pmi_server;

/* Limits announced in "cmd=maxes" (MPICH asserts vallen_max > 256). */
#define ADT_PMI_KVSNAME_MAX 256
#define ADT_PMI_KEYLEN_MAX 64
#define ADT_PMI_VALLEN_MAX 1024
/* A request line longer than this is a protocol error. */
#define ADT_PMI_LINE_MAX 4096

typedef enum adt_pmi_event_kind {
    ADT_PMI_EV_INIT = 1,  /* a rank completed "cmd=init"                            */
    ADT_PMI_EV_FINALIZE,  /* a rank sent "cmd=finalize" (acknowledged)              */
    ADT_PMI_EV_ABORT,     /* a rank sent "cmd=abort"; `code` is its exit code        */
    ADT_PMI_EV_BARRIER,   /* barrier number `code` was released on this server       */
    ADT_PMI_EV_IDENTIFY,  /* a TCP connection named its rank ("cmd=initack pmiid=r") */
} adt_pmi_event_kind;

typedef struct adt_pmi_event {
    adt_pmi_event_kind kind;
    int conn; /* connection id                                 */
    int rank; /* global rank, -1 if the connection has none yet */
    int code;
} adt_pmi_event;

typedef struct adt_pmi_config {
    int world_size;   /* PMI_SIZE, ranks in the whole world (>= 1)                          */
    int rank_offset;  /* this server serves ranks [rank_offset, rank_offset + local_size)    */
    int local_size;   /* 0 = world_size                                                      */
    int appnum;       /* "cmd=appnum", default 0                                             */
    int universe_size;           /* 0 = world_size                                           */
    const char *kvsname;         /* NULL = "adt_kvs"                                          */
    const char *process_mapping; /* value served for PMI_process_mapping; NULL = one node
                                    holding every rank, "(vector,(0,1,world_size))"          */
    /* Called for init/finalize/abort/barrier/identify, synchronously inside feed or release. */
    void (*on_event)(void *ctx, const adt_pmi_event *ev);
    /* Called when every local rank has entered a barrier. NULL releases it at once (a world on
     * one agent). Otherwise the caller ships the puts made since the previous barrier
     * (adt_pmi_kvs_entry from index `first_new`) to its peers, adds theirs with adt_pmi_kvs_put
     * and then calls adt_pmi_server_barrier_release. */
    void (*on_barrier)(void *ctx, int epoch, int first_new);
    void *ctx;
} adt_pmi_config;

int adt_pmi_server_create(adt_pmi_server **out, const adt_pmi_config *cfg);
void adt_pmi_server_free(adt_pmi_server *s);

/* A new connection. rank >= 0: fd mode, the rank is known from PMI_RANK. rank = -1: TCP mode,
 * the client names its rank with "cmd=initack pmiid=r". Returns the connection id (>= 0). */
int adt_pmi_conn_open(adt_pmi_server *s, int rank);
/* Processes every complete line in `data`. ADT_OK, or a negative status after a protocol error
 * (the message names the connection, its rank and the offending line); the connection is then
 * dead: send its pending output if you like, and adt_pmi_conn_close it. */
int adt_pmi_conn_feed(adt_pmi_server *s, int conn, const char *data, size_t n);
/* Bytes waiting to be sent on the connection; after sending k of them, consume k. */
size_t adt_pmi_conn_output(adt_pmi_server *s, int conn, const char **data);
void adt_pmi_conn_consume(adt_pmi_server *s, int conn, size_t n);
/* Closes a connection (EOF, error or teardown). Its id may be reused by a later open. */
void adt_pmi_conn_close(adt_pmi_server *s, int conn);
int adt_pmi_conn_rank(const adt_pmi_server *s, int conn);

typedef enum adt_pmi_rank_state {
    ADT_PMI_RANK_NONE = 0,  /* no connection yet                     */
    ADT_PMI_RANK_CONNECTED, /* connected (and identified), no init   */
    ADT_PMI_RANK_INIT,      /* init done, not finalized              */
    ADT_PMI_RANK_FINALIZED, /* finalize acknowledged                 */
    ADT_PMI_RANK_ABORTED,   /* sent abort                            */
    ADT_PMI_RANK_LOST,      /* connection closed after init, before finalize, or a protocol error */
} adt_pmi_rank_state;
adt_pmi_rank_state adt_pmi_rank_state_of(const adt_pmi_server *s, int rank);

/* The key-value store: entries in put order. Keys are unique. */
int adt_pmi_kvs_put(adt_pmi_server *s, const char *key, const char *value);
const char *adt_pmi_kvs_get(const adt_pmi_server *s, const char *key);
int adt_pmi_kvs_count(const adt_pmi_server *s);
void adt_pmi_kvs_entry(const adt_pmi_server *s, int i, const char **key, const char **value);
/* Releases the barrier announced to on_barrier. */
int adt_pmi_server_barrier_release(adt_pmi_server *s);

/* "(vector,(0,2,4),(2,1,3))" from per-node rank counts in node order (block layout):
 * consecutive nodes with equal counts share a block. Writes at most cap bytes. */
int adt_pmi_process_mapping(char *buf, size_t cap, int n_nodes, const int *ranks_per_node);

/* ---------------------------------------------------------------------------------------------
 * Worlds: N workers of one command, their PMI, their output, their deaths.
 */
typedef struct adt_world adt_world;

typedef enum adt_pmi_mode {
    ADT_PMI_FD = 0, /* socketpair, PMI_FD/PMI_RANK/PMI_SIZE (workers on this host)           */
    ADT_PMI_TCP,    /* listen on pmi_host:pmi_port, PMI_PORT/PMI_ID (other namespaces/hosts)  */
    ADT_PMI_OFF,    /* no PMI: plain commands; success is every rank exiting 0               */
} adt_pmi_mode;

typedef enum adt_bind { ADT_BIND_NONE = 0, ADT_BIND_CORE } adt_bind;

typedef struct adt_world_config {
    const char *const *argv; /* command and arguments; argv[0] is looked up in PATH */
    /* Layout, as given by the master: this agent starts ranks
     * [rank_offset, rank_offset + local_size) of a world of world_size ranks. */
    int world_size;  /* WORLD_SIZE; 0 = local_size                              */
    int local_size;  /* LOCAL_WORLD_SIZE, ranks started here (>= 1)             */
    int rank_offset; /* global rank of local rank 0                             */
    int group_rank;  /* GROUP_RANK, this agent's node index                     */
    int n_groups;    /* nodes in the world; 0 = 1 (for PMI_process_mapping)      */
    const int *group_sizes; /* ranks on each node, n_groups entries; NULL = all nodes local_size */
    /* Rendezvous address for frameworks that want one (torch.distributed); exported only. */
    const char *master_addr; /* MASTER_ADDR, default "127.0.0.1"                  */
    int master_port;         /* MASTER_PORT, default 29500                         */
    int restart_count;       /* ADT_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT     */
    int max_restarts;        /* TORCHELASTIC_MAX_RESTARTS                          */
    const char *run_id;      /* ADT_RUN_ID / TORCHELASTIC_RUN_ID, default "none"    */
    adt_pmi_mode pmi;
    const char *pmi_host;    /* TCP mode: IPv4 address to listen on and to hand out; default
                                "127.0.0.1"                                              */
    int pmi_port;            /* TCP mode: 0 = any free port                              */
    adt_bind bind;           /* ADT_BIND_CORE: local rank i runs on the (i mod n)-th CPU the
                                agent may use                                            */
    int prefix_output;       /* 1: stdout/stderr lines come back as "[rank R] line" on out_fd
                                / err_fd; 0: workers write to the agent's stdout/stderr   */
    int out_fd, err_fd;      /* prefixed output goes here; 0 = 1 and 2                    */
    const char *const *env;  /* extra "NAME=value" for every worker, NULL-terminated; wins
                                over everything else                                     */
    double kill_grace_s;     /* stop: SIGTERM, then SIGKILL after this; 0 = 2 s, < 0 = SIGKILL
                                at once                                                   */
    int keep_going;          /* 1: a rank failure is reported but does not stop the world  */
    /* Multi-agent worlds: see adt_pmi_config.on_barrier. The server is adt_world_pmi(w). */
    void (*on_barrier)(void *ctx, int epoch, int first_new);
    void *ctx;
} adt_world_config;

typedef enum adt_world_state {
    ADT_WORLD_RUNNING = 0,
    ADT_WORLD_STOPPING, /* SIGTERM sent; SIGKILL at the grace deadline */
    ADT_WORLD_DONE,     /* every worker reaped                          */
} adt_world_state;

typedef enum adt_world_result {
    ADT_WORLD_PENDING = 0,
    ADT_WORLD_SUCCEEDED, /* every rank finalized PMI (if on) and exited 0 */
    ADT_WORLD_FAILED,    /* some rank failed (the first failure event says which and why) */
    ADT_WORLD_STOPPED,   /* adt_world_stop before any failure             */
} adt_world_result;

typedef enum adt_rank_failure {
    ADT_FAIL_NONE = 0,
    ADT_FAIL_EXIT,        /* exited with a non-zero code (`code`)                        */
    ADT_FAIL_SIGNAL,      /* killed by signal `code`                                      */
    ADT_FAIL_ABORT,       /* PMI abort (MPI_Abort) with exit code `code`                  */
    ADT_FAIL_PMI_EOF,     /* PMI connection closed after init, before finalize; alive     */
    ADT_FAIL_NO_FINALIZE, /* exited 0 after PMI init without finalize                     */
    ADT_FAIL_PROTOCOL,    /* malformed PMI input; the connection was dropped               */
} adt_rank_failure;

typedef enum adt_world_event_kind {
    ADT_WORLD_EV_RANK_FAILED = 1, /* first sign that a rank failed; reason and code set      */
    ADT_WORLD_EV_RANK_EXITED,     /* a worker was reaped; code = exit code, or signal if
                                     `signaled`                                               */
    ADT_WORLD_EV_PMI_READY,       /* the first PMI barrier was released: MPI_Init is almost
                                     done on every local rank                                */
    ADT_WORLD_EV_PMI_REJECTED,    /* a TCP connection was dropped before naming a rank        */
    ADT_WORLD_EV_DONE,            /* every worker reaped; adt_world_result_of is final       */
} adt_world_event_kind;

#define ADT_WORLD_TAIL 1024
typedef struct adt_world_event {
    adt_world_event_kind kind;
    int rank;       /* global rank, -1 for world-wide events            */
    int local_rank; /* -1 for world-wide events                         */
    pid_t pid;
    adt_rank_failure reason;
    int code;
    int signaled;   /* RANK_EXITED: code is a signal number             */
    double t;       /* adt_now_s() when it was observed                 */
    char msg[256];  /* one line, e.g. "rank 2 (pid 4711) killed by signal 9 (Killed)" */
    /* RANK_FAILED with prefix_output: the rank's last lines on stderr (newline-separated, at
     * most ADT_WORLD_TAIL - 1 bytes, whole lines), "" if none */
    char tail[ADT_WORLD_TAIL];
} adt_world_event;

/* Per-rank facts, valid until adt_world_free. */
typedef struct adt_world_rank {
    int rank, local_rank;
    pid_t pid;       /* stays set after the worker is reaped                          */
    int cpu;         /* the CPU it is bound to, or -1                                 */
    int running;     /* not reaped yet                                                */
    int wstatus;     /* waitpid status once reaped                                    */
    adt_rank_failure failure;
    double t_start, t_exit;
} adt_world_rank;

/* Starts local_size workers. ADT_OK, or an error naming the flag/field or the command (e.g. not
 * found, not executable); on error nothing is left running. */
int adt_world_start(adt_world **out, const adt_world_config *cfg);
/* Kills (SIGKILL) and reaps whatever still runs, then frees. Blocks until reaped. */
void adt_world_free(adt_world *w);

/* Fills up to cap pollfds for the world's descriptors; returns how many. At most
 * adt_world_pollfd_max(w) are ever needed. */
int adt_world_pollfds(adt_world *w, struct pollfd *fds, int cap);
int adt_world_pollfd_max(const adt_world *w);
/* Milliseconds until the world's next timer (the kill grace deadline, a pending EOF check),
 * or -1 for none. */
int adt_world_timeout_ms(const adt_world *w);
/* Handles the ready entries of fds that belong to the world (others are ignored) and the
 * timers. Events are queued for adt_world_next_event. */
int adt_world_dispatch(adt_world *w, const struct pollfd *fds, int n);
/* One poll over the world's own descriptors (at most timeout_ms) and a dispatch. */
int adt_world_step(adt_world *w, int timeout_ms);
/* Pops the oldest queued event; 0 if there is none. */
int adt_world_next_event(adt_world *w, adt_world_event *ev);

/* Begins an orderly stop: SIGTERM to every live worker's process group, SIGKILL after the grace
 * period. Safe to call repeatedly. */
void adt_world_stop(adt_world *w);
/* SIGKILL to every live worker's process group now. Async-signal-safe, for a fatal-signal
 * handler; the workers are still reaped by the next dispatch or adt_world_free. */
void adt_world_kill(const adt_world *w);

adt_world_state adt_world_state_of(const adt_world *w);
adt_world_result adt_world_result_of(const adt_world *w);
int adt_world_local_size(const adt_world *w);
const adt_world_rank *adt_world_rank_info(const adt_world *w, int local_rank);
/* The first failure seen (kind RANK_FAILED), or NULL. */
const adt_world_event *adt_world_first_failure(const adt_world *w);
/* TCP mode: the "host:port" handed to workers as PMI_PORT; NULL otherwise. */
const char *adt_world_pmi_port(const adt_world *w);
adt_pmi_server *adt_world_pmi(adt_world *w);

const char *adt_rank_failure_name(adt_rank_failure f);

#ifdef __cplusplus
}
#endif
#endif
