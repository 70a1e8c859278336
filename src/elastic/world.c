/*
 * world.c - one generation of workers on this agent: start them, serve their PMI, pass their
 * output through, notice each death at once and say which rank and why, stop the rest.
 *
 * Death is seen two ways, whichever comes first: the worker's pidfd becomes readable (it exited;
 * waitpid gives the code or signal), or its PMI socket reaches EOF after init and before
 * finalize. The kernel closes a dying process's descriptors a moment before it notifies the
 * parent, so an EOF first looks whether the process has already exited (waitid WNOWAIT) and, if
 * it has not, waits a short grace for the exit status before calling it a bare PMI loss: the
 * report then carries the exit code or signal rather than only "connection closed".
 *
 * A world is "succeeded" when every rank finalized PMI (unless PMI is off) and exited 0. The
 * first failure while the world runs is its cause; the SIGTERMs that follow are consequences
 * and are reported as exits, not as failures.
 */
#include "agent_internal.h"
#include "adtrain/agent.h"
#include "adtrain/base.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long an EOF on a live worker's PMI socket waits for its exit status. */
#define EOF_GRACE_S 0.25
#define LINE_CAP 4096

typedef struct linebuf {
    char buf[LINE_CAP];
    size_t len;
    char tail[ADT_WORLD_TAIL]; /* stderr: its last lines, oldest cut first ("a\nb") */
    size_t tail_len;
} linebuf;

typedef struct wslot {
    adt_world_rank info;
    int pidfd;
    int pipe_fd[2]; /* read ends of the worker's stdout / stderr pipes, or -1 */
    linebuf *lb[2];
    int failed;     /* a RANK_FAILED event was queued              */
    double eof_at;  /* PMI EOF seen, waiting for the exit status; 0 = none */
} wslot;

/* A PMI connection: fd mode (one per rank from the start) or TCP (accepted). */
typedef struct plink {
    int fd, conn;
} plink;

struct adt_world {
    int world_size, local_size, rank_offset;
    adt_pmi_mode pmi_mode;
    double grace_s;
    int keep_going;
    int out_fd, err_fd;
    wslot *r;
    adt_pmi_server *pmi;
    plink *links;
    int n_links, max_links;
    int listen_fd;
    char pmi_port[80];
    adt_world_state state;
    adt_world_result result;
    int n_running, stop_requested, killed, ready_sent;
    double kill_at;
    void (*user_barrier)(void *ctx, int epoch, int first_new);
    void *user_ctx;
    adt_world_event first_failure;
    int have_failure;
    adt_world_event *q;
    int q_head, q_len, q_cap;
};

const char *adt_rank_failure_name(adt_rank_failure f) {
    switch (f) {
    case ADT_FAIL_NONE: return "none";
    case ADT_FAIL_EXIT: return "exit code";
    case ADT_FAIL_SIGNAL: return "signal";
    case ADT_FAIL_ABORT: return "abort";
    case ADT_FAIL_PMI_EOF: return "PMI connection lost";
    case ADT_FAIL_NO_FINALIZE: return "no finalize";
    case ADT_FAIL_PROTOCOL: return "PMI protocol error";
    }
    return "?";
}

/* ---------------------------------------------------------------------------------------------
 * Events
 */
static adt_world_event *push_event(adt_world *w, adt_world_event_kind kind, int l) {
    if (w->q_head + w->q_len == w->q_cap) {
        if (w->q_head) {
            memmove(w->q, w->q + w->q_head, (size_t)w->q_len * sizeof *w->q);
            w->q_head = 0;
        } else {
            w->q_cap = w->q_cap ? 2 * w->q_cap : 16;
            w->q = adt_realloc(w->q, (size_t)w->q_cap * sizeof *w->q);
        }
    }
    adt_world_event *ev = &w->q[w->q_head + w->q_len++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->t = adt_now_s();
    ev->rank = l >= 0 ? w->r[l].info.rank : -1;
    ev->local_rank = l;
    ev->pid = l >= 0 ? w->r[l].info.pid : 0;
    return ev;
}

int adt_world_next_event(adt_world *w, adt_world_event *ev) {
    if (!w->q_len) return 0;
    *ev = w->q[w->q_head++];
    w->q_len--;
    if (!w->q_len) w->q_head = 0;
    return 1;
}

static void signal_groups(const adt_world *w, int sig) {
    for (int l = 0; l < w->local_size; l++)
        if (w->r[l].info.running && w->r[l].info.pid > 0) kill(-w->r[l].info.pid, sig);
}

void adt_world_kill(const adt_world *w) { signal_groups(w, SIGKILL); }

void adt_world_stop(adt_world *w) {
    if (w->state != ADT_WORLD_RUNNING) return;
    w->state = ADT_WORLD_STOPPING;
    if (!w->have_failure) w->stop_requested = 1;
    if (w->grace_s < 0) {
        signal_groups(w, SIGKILL);
        w->killed = 1;
        return;
    }
    signal_groups(w, SIGTERM);
    /* a stopped worker would sit on the SIGTERM until continued */
    signal_groups(w, SIGCONT);
    w->kill_at = adt_now_s() + w->grace_s;
}

static void rank_failed(adt_world *w, int l, adt_rank_failure why, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void rank_failed(adt_world *w, int l, adt_rank_failure why, int code, const char *fmt, ...) {
    wslot *s = &w->r[l];
    s->eof_at = 0;
    if (s->failed || w->state != ADT_WORLD_RUNNING) return;
    s->failed = 1;
    s->info.failure = why;
    adt_world_event *ev = push_event(w, ADT_WORLD_EV_RANK_FAILED, l);
    ev->reason = why;
    ev->code = code;
    if (s->lb[1]) snprintf(ev->tail, sizeof ev->tail, "%s", s->lb[1]->tail);
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(ev->msg, sizeof ev->msg, "rank %d (pid %d) ", s->info.rank, (int)s->info.pid);
    vsnprintf(ev->msg + n, sizeof ev->msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (!w->have_failure) {
        w->have_failure = 1;
        w->first_failure = *ev;
        w->result = ADT_WORLD_FAILED;
    }
    if (!w->keep_going) adt_world_stop(w);
}

static int local_of(const adt_world *w, int rank) {
    int l = rank - w->rank_offset;
    return l >= 0 && l < w->local_size ? l : -1;
}

static void on_pmi_event(void *ctx, const adt_pmi_event *ev) {
    adt_world *w = ctx;
    if (ev->kind == ADT_PMI_EV_ABORT) {
        int l = local_of(w, ev->rank);
        if (l >= 0) rank_failed(w, l, ADT_FAIL_ABORT, ev->code, "called abort with exit code %d", ev->code);
    } else if (ev->kind == ADT_PMI_EV_BARRIER && ev->code == 0 && !w->ready_sent) {
        w->ready_sent = 1;
        adt_world_event *r = push_event(w, ADT_WORLD_EV_PMI_READY, -1);
        snprintf(r->msg, sizeof r->msg, "all %d local ranks passed the first PMI barrier", w->local_size);
    }
}

static void on_pmi_barrier(void *ctx, int epoch, int first_new) {
    adt_world *w = ctx;
    w->user_barrier(w->user_ctx, epoch, first_new);
}

/* ---------------------------------------------------------------------------------------------
 * Output pass-through: whole lines, each prefixed, each in one write so ranks do not interleave
 * within a line.
 */
static void write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return; /* the reader is gone: drop the output, keep the world */
        p += k, n -= (size_t)k;
    }
}

/* Keeps the line at the end of the stderr tail, dropping whole lines from its front. */
static void keep_tail(linebuf *b, const char *p, size_t n) {
    size_t cap = sizeof b->tail - 1;
    if (n > cap / 2) p += n - cap / 2, n = cap / 2; /* a long line: its end says most */
    size_t need = b->tail_len + (b->tail_len ? 1 : 0) + n;
    if (need > cap) {
        size_t cut = need - cap;
        const char *nl = memchr(b->tail + cut, '\n', b->tail_len - cut);
        cut = nl ? (size_t)(nl - b->tail) + 1 : b->tail_len;
        memmove(b->tail, b->tail + cut, b->tail_len - cut);
        b->tail_len -= cut;
    }
    if (b->tail_len) b->tail[b->tail_len++] = '\n';
    memcpy(b->tail + b->tail_len, p, n);
    b->tail_len += n;
    b->tail[b->tail_len] = 0;
}

static void emit_line(adt_world *w, int l, int which, const char *p, size_t n) {
    if (which) keep_tail(w->r[l].lb[1], p, n);
    char buf[LINE_CAP + 64];
    int h = snprintf(buf, sizeof buf, "[rank %d] ", w->r[l].info.rank);
    memcpy(buf + h, p, n);
    buf[h + (int)n] = '\n';
    write_all(which ? w->err_fd : w->out_fd, buf, (size_t)h + n + 1);
}

static void pipe_close(adt_world *w, int l, int which) {
    wslot *s = &w->r[l];
    linebuf *b = s->lb[which];
    if (b && b->len) emit_line(w, l, which, b->buf, b->len);
    if (b) b->len = 0;
    if (s->pipe_fd[which] >= 0) close(s->pipe_fd[which]);
    s->pipe_fd[which] = -1;
}

/* Reads what is there (the descriptor is non-blocking); closes on EOF. */
static void pipe_read(adt_world *w, int l, int which) {
    wslot *s = &w->r[l];
    linebuf *b = s->lb[which];
    for (int round = 0; round < 64 && s->pipe_fd[which] >= 0; round++) {
        ssize_t n = read(s->pipe_fd[which], b->buf + b->len, sizeof b->buf - b->len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            pipe_close(w, l, which);
            return;
        }
        b->len += (size_t)n;
        size_t start = 0;
        for (size_t i = b->len - (size_t)n; i < b->len; i++)
            if (b->buf[i] == '\n') {
                emit_line(w, l, which, b->buf + start, i - start);
                start = i + 1;
            }
        if (start == 0 && b->len == sizeof b->buf) { /* a line longer than the buffer */
            emit_line(w, l, which, b->buf, b->len);
            start = b->len;
        }
        memmove(b->buf, b->buf + start, b->len - start);
        b->len -= start;
    }
}

/* ---------------------------------------------------------------------------------------------
 * PMI connections
 */
static int add_link(adt_world *w, int fd, int conn) {
    if (w->n_links == w->max_links) return -1;
    w->links[w->n_links].fd = fd;
    w->links[w->n_links].conn = conn;
    return w->n_links++;
}

static void reap(adt_world *w, int l);

/* Closes link i (EOF, error or teardown). A rank that had done init and not finalize lost its
 * PMI: if it has exited, reap it now for the real cause, else give it EOF_GRACE_S. */
static void link_close(adt_world *w, int i) {
    plink k = w->links[i];
    int rank = adt_pmi_conn_rank(w->pmi, k.conn);
    adt_pmi_rank_state before = rank >= 0 ? adt_pmi_rank_state_of(w->pmi, rank) : ADT_PMI_RANK_NONE;
    adt_pmi_conn_close(w->pmi, k.conn);
    close(k.fd);
    w->links[i] = w->links[--w->n_links];
    int l = rank >= 0 ? local_of(w, rank) : -1;
    if (l < 0 || before != ADT_PMI_RANK_INIT || !w->r[l].info.running) return;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)w->r[l].info.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid)
        reap(w, l);
    else if (!w->r[l].eof_at)
        w->r[l].eof_at = adt_now_s();
}

static int find_link(const adt_world *w, int fd) {
    for (int i = 0; i < w->n_links; i++)
        if (w->links[i].fd == fd) return i;
    return -1;
}

/* Sends what the server has for link i. Returns -1 if the link was closed. */
static int link_flush(adt_world *w, int i) {
    const char *p;
    size_t n = adt_pmi_conn_output(w->pmi, w->links[i].conn, &p);
    while (n) {
        ssize_t k = send(w->links[i].fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) return 0;
        if (k <= 0) {
            link_close(w, i);
            return -1;
        }
        adt_pmi_conn_consume(w->pmi, w->links[i].conn, (size_t)k);
        n = adt_pmi_conn_output(w->pmi, w->links[i].conn, &p);
    }
    return 0;
}

static void link_read(adt_world *w, int i) {
    char buf[4096];
    for (int round = 0; round < 64; round++) {
        ssize_t n = recv(w->links[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            link_close(w, i);
            return;
        }
        if (adt_pmi_conn_feed(w->pmi, w->links[i].conn, buf, (size_t)n) != ADT_OK) {
            int rank = adt_pmi_conn_rank(w->pmi, w->links[i].conn);
            int l = rank >= 0 ? local_of(w, rank) : -1;
            if (l >= 0) {
                rank_failed(w, l, ADT_FAIL_PROTOCOL, 0, "broke the PMI protocol: %s", adt_error_message());
            } else {
                adt_world_event *ev = push_event(w, ADT_WORLD_EV_PMI_REJECTED, -1);
                snprintf(ev->msg, sizeof ev->msg, "%s", adt_error_message());
            }
            adt_log(ADT_LOG_WARN, "%s", adt_error_message());
            link_close(w, i);
            return;
        }
    }
}

static void accept_links(adt_world *w) {
    for (;;) {
        int fd = accept4(w->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (w->n_links == w->max_links) {
            adt_world_event *ev = push_event(w, ADT_WORLD_EV_PMI_REJECTED, -1);
            snprintf(ev->msg, sizeof ev->msg, "PMI: refused a connection, %d already open", w->n_links);
            close(fd);
            continue;
        }
        /* PMI is lock-step request/reply: Nagle would hold every small reply back. Keepalive
         * notices a peer host that vanished silently (about 4 s). */
        wk_tcp_live(fd, 4000);
        add_link(w, fd, adt_pmi_conn_open(w->pmi, -1));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Deaths
 */
static void describe_status(char *buf, size_t cap, int st) {
    if (WIFSIGNALED(st))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, cap, "exited with code %d", WEXITSTATUS(st));
}

static void finish_if_done(adt_world *w) {
    if (w->n_running || w->state == ADT_WORLD_DONE) return;
    w->state = ADT_WORLD_DONE;
    if (!w->have_failure) w->result = w->stop_requested ? ADT_WORLD_STOPPED : ADT_WORLD_SUCCEEDED;
    for (int i = w->n_links - 1; i >= 0; i--) link_close(w, i);
    if (w->listen_fd >= 0) close(w->listen_fd);
    w->listen_fd = -1;
    adt_world_event *ev = push_event(w, ADT_WORLD_EV_DONE, -1);
    ev->code = w->result;
    snprintf(ev->msg, sizeof ev->msg, "world of %d local ranks %s", w->local_size,
             w->result == ADT_WORLD_SUCCEEDED ? "succeeded"
             : w->result == ADT_WORLD_STOPPED ? "stopped"
                                              : "failed");
}

/* Reaps local rank l if it has exited (its pidfd said so, or an EOF made us look). Reads its
 * last PMI words and output first, so a finalize or a last line is not lost. */
static void reap(adt_world *w, int l) {
    wslot *s = &w->r[l];
    if (!s->info.running) return;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)s->info.pid, &si, WEXITED | WNOHANG | WNOWAIT) || !si.si_pid) return;
    /* the exited leader still holds its process-group id: take down whatever it left behind */
    kill(-s->info.pid, SIGKILL);
    for (int i = 0; i < w->n_links; i++)
        if (adt_pmi_conn_rank(w->pmi, w->links[i].conn) == s->info.rank) {
            s->info.running = 0; /* EOF here must not recurse into reap */
            link_read(w, i);
            s->info.running = 1;
            break;
        }
    for (int which = 0; which < 2; which++)
        if (s->pipe_fd[which] >= 0) {
            pipe_read(w, l, which);
            pipe_close(w, l, which);
        }
    int st = 0;
    while (waitpid(s->info.pid, &st, 0) < 0 && errno == EINTR) {}
    s->info.running = 0;
    s->info.wstatus = st;
    s->info.t_exit = adt_now_s();
    close(s->pidfd);
    s->pidfd = -1;
    w->n_running--;
    for (int i = 0; i < w->n_links; i++)
        if (adt_pmi_conn_rank(w->pmi, w->links[i].conn) == s->info.rank) {
            link_close(w, i);
            break;
        }
    char how[96];
    describe_status(how, sizeof how, st);
    const char *lost = s->eof_at ? " after closing its PMI connection without finalize" : "";
    if (WIFSIGNALED(st)) {
        rank_failed(w, l, ADT_FAIL_SIGNAL, WTERMSIG(st), "%s%s", how, lost);
    } else if (WEXITSTATUS(st)) {
        rank_failed(w, l, ADT_FAIL_EXIT, WEXITSTATUS(st), "%s%s", how, lost);
    } else if (w->pmi_mode != ADT_PMI_OFF &&
               adt_pmi_rank_state_of(w->pmi, s->info.rank) != ADT_PMI_RANK_FINALIZED) {
        rank_failed(w, l, ADT_FAIL_NO_FINALIZE, 0, "exited with code 0 without PMI finalize%s",
                    adt_pmi_rank_state_of(w->pmi, s->info.rank) == ADT_PMI_RANK_NONE
                        ? " (it never called PMI init)" : "");
    }
    s->eof_at = 0;
    adt_world_event *ev = push_event(w, ADT_WORLD_EV_RANK_EXITED, l);
    ev->signaled = WIFSIGNALED(st);
    ev->code = ev->signaled ? WTERMSIG(st) : WEXITSTATUS(st);
    ev->reason = s->info.failure;
    snprintf(ev->msg, sizeof ev->msg, "rank %d (pid %d) %s", s->info.rank, (int)s->info.pid, how);
    finish_if_done(w);
}

static void run_timers(adt_world *w) {
    double now = adt_now_s();
    for (int l = 0; l < w->local_size; l++) {
        wslot *s = &w->r[l];
        if (!s->eof_at || !s->info.running) continue;
        reap(w, l);
        if (s->info.running && now - s->eof_at >= EOF_GRACE_S)
            rank_failed(w, l, ADT_FAIL_PMI_EOF, 0,
                        "closed its PMI connection without finalize and is still running");
    }
    if (w->state == ADT_WORLD_STOPPING && !w->killed && now >= w->kill_at) {
        signal_groups(w, SIGKILL);
        w->killed = 1;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Event loop
 */
int adt_world_pollfd_max(const adt_world *w) { return 1 + w->max_links + 3 * w->local_size; }

int adt_world_pollfds(adt_world *w, struct pollfd *fds, int cap) {
    int n = 0;
#define ADD(fd_, ev_)                                                                           \
    do {                                                                                        \
        if (n < cap) fds[n++] = (struct pollfd){.fd = (fd_), .events = (ev_)};                  \
    } while (0)
    if (w->listen_fd >= 0) ADD(w->listen_fd, POLLIN);
    for (int i = 0; i < w->n_links; i++) {
        const char *p;
        ADD(w->links[i].fd, POLLIN | (adt_pmi_conn_output(w->pmi, w->links[i].conn, &p) ? POLLOUT : 0));
    }
    for (int l = 0; l < w->local_size; l++) {
        wslot *s = &w->r[l];
        if (s->pidfd >= 0) ADD(s->pidfd, POLLIN);
        for (int which = 0; which < 2; which++)
            if (s->pipe_fd[which] >= 0) ADD(s->pipe_fd[which], POLLIN);
    }
#undef ADD
    return n;
}

int adt_world_timeout_ms(const adt_world *w) {
    double next = -1, now = adt_now_s();
    if (w->state == ADT_WORLD_STOPPING && !w->killed) next = w->kill_at;
    for (int l = 0; l < w->local_size; l++)
        if (w->r[l].eof_at && w->r[l].info.running) {
            double t = w->r[l].eof_at + EOF_GRACE_S;
            if (next < 0 || t < next) next = t;
        }
    if (next < 0) return -1;
    double ms = (next - now) * 1e3;
    return ms <= 0 ? 0 : (int)ms + 1;
}

int adt_world_dispatch(adt_world *w, const struct pollfd *fds, int n) {
    for (int j = 0; j < n; j++) {
        if (!fds[j].revents || fds[j].fd < 0) continue;
        int fd = fds[j].fd;
        if (fd == w->listen_fd) {
            accept_links(w);
            continue;
        }
        int i = find_link(w, fd);
        if (i >= 0) {
            if (fds[j].revents & POLLOUT && link_flush(w, i) < 0) continue;
            if (fds[j].revents & (POLLIN | POLLHUP | POLLERR)) link_read(w, i);
            continue;
        }
        for (int l = 0; l < w->local_size; l++) {
            wslot *s = &w->r[l];
            if (fd == s->pidfd) reap(w, l);
            else if (fd == s->pipe_fd[0]) pipe_read(w, l, 0);
            else if (fd == s->pipe_fd[1]) pipe_read(w, l, 1);
            else continue;
            break;
        }
    }
    /* replies produced by this round (barrier releases reach every rank) */
    for (int i = w->n_links - 1; i >= 0; i--) link_flush(w, i);
    run_timers(w);
    return ADT_OK;
}

int adt_world_step(adt_world *w, int timeout_ms) {
    int cap = adt_world_pollfd_max(w);
    struct pollfd *fds = adt_malloc((size_t)cap * sizeof *fds);
    int n = adt_world_pollfds(w, fds, cap);
    int t = adt_world_timeout_ms(w);
    if (t >= 0 && (timeout_ms < 0 || t < timeout_ms)) timeout_ms = t;
    int rc = poll(fds, (nfds_t)n, timeout_ms);
    if (rc < 0 && errno != EINTR) {
        int e = errno;
        free(fds);
        return adt_error(ADT_ERR_IO, "world: poll: %s", strerror(e));
    }
    if (rc < 0) n = 0;
    adt_world_dispatch(w, fds, n);
    free(fds);
    return ADT_OK;
}

adt_world_state adt_world_state_of(const adt_world *w) { return w->state; }
adt_world_result adt_world_result_of(const adt_world *w) { return w->result; }
int adt_world_local_size(const adt_world *w) { return w->local_size; }
const adt_world_event *adt_world_first_failure(const adt_world *w) {
    return w->have_failure ? &w->first_failure : NULL;
}
const char *adt_world_pmi_port(const adt_world *w) { return w->pmi_port[0] ? w->pmi_port : NULL; }
adt_pmi_server *adt_world_pmi(adt_world *w) { return w->pmi; }

const adt_world_rank *adt_world_rank_info(const adt_world *w, int l) {
    return l >= 0 && l < w->local_size ? &w->r[l].info : NULL;
}

void adt_world_free(adt_world *w) {
    if (!w) return;
    adt_world_kill(w);
    for (int l = 0; l < w->local_size; l++) {
        wslot *s = &w->r[l];
        if (s->info.running) {
            int st;
            while (waitpid(s->info.pid, &st, 0) < 0 && errno == EINTR) {}
            s->info.running = 0;
        }
        if (s->pidfd >= 0) close(s->pidfd);
        for (int which = 0; which < 2; which++) {
            if (s->pipe_fd[which] >= 0) close(s->pipe_fd[which]);
            free(s->lb[which]);
        }
    }
    for (int i = 0; i < w->n_links; i++) close(w->links[i].fd);
    if (w->listen_fd >= 0) close(w->listen_fd);
    adt_pmi_server_free(w->pmi);
    free(w->links), free(w->r), free(w->q);
    free(w);
}

/* ---------------------------------------------------------------------------------------------
 * Start
 */
static int check_config(const adt_world_config *c, int world) {
    if (!c->argv || !c->argv[0])
        return adt_error(ADT_ERR_ARG, "world: no command given (argv is empty)");
    if (c->local_size < 1)
        return adt_error(ADT_ERR_ARG, "world: local_size %d, expected >= 1 ranks on this node",
                         c->local_size);
    if (c->rank_offset < 0 || c->rank_offset + c->local_size > world)
        return adt_error(ADT_ERR_ARG, "world: ranks %d..%d of this node do not fit world_size %d",
                         c->rank_offset, c->rank_offset + c->local_size - 1, world);
    int groups = c->n_groups ? c->n_groups : 1;
    if (groups < 1 || c->group_rank < 0 || c->group_rank >= groups)
        return adt_error(ADT_ERR_ARG, "world: group_rank %d, expected 0..%d", c->group_rank, groups - 1);
    if (c->group_sizes) {
        long sum = 0;
        for (int g = 0; g < groups; g++) sum += c->group_sizes[g];
        if (sum != world || c->group_sizes[c->group_rank] != c->local_size)
            return adt_error(ADT_ERR_ARG, "world: group_sizes sum to %ld and give this node %d ranks; "
                             "expected world_size %d and local_size %d", sum,
                             c->group_sizes[c->group_rank], world, c->local_size);
    } else if (groups * c->local_size != world) {
        return adt_error(ADT_ERR_ARG, "world: %d nodes x %d local ranks != world_size %d; give "
                         "group_sizes for uneven nodes", groups, c->local_size, world);
    }
    if (c->pmi_port < 0 || c->pmi_port > 65535)
        return adt_error(ADT_ERR_ARG, "world: pmi_port %d, expected 0..65535", c->pmi_port);
    if (c->master_port < 0 || c->master_port > 65535)
        return adt_error(ADT_ERR_ARG, "world: master_port %d, expected 1..65535", c->master_port);
    if ((unsigned)c->pmi > ADT_PMI_OFF || (unsigned)c->bind > ADT_BIND_CORE)
        return adt_error(ADT_ERR_ARG, "world: unknown pmi mode %d or bind %d", c->pmi, c->bind);
    return ADT_OK;
}

static int listen_tcp(adt_world *w, const char *host, int port) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return adt_error(ADT_ERR_ARG, "world: pmi_host '%s' is not an IPv4 address", host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 128) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        int e = errno;
        if (fd >= 0) close(fd);
        return adt_error(ADT_ERR_IO, "world: PMI listen on %s:%d: %s", host, port, strerror(e));
    }
    w->listen_fd = wk_fd_high(fd);
    snprintf(w->pmi_port, sizeof w->pmi_port, "%s:%d", host, ntohs(sa.sin_port));
    return ADT_OK;
}

/* The torchrun contract plus PMI, for one rank. `buf` holds the strings, `sets` points into it. */
enum { N_SETS_MAX = 24, SET_LEN = 320 };
static int rank_env(const adt_world *w, const adt_world_config *c, int l, int pmi_child_fd,
                    char buf[N_SETS_MAX][SET_LEN]) {
    int n = 0, rank = c->rank_offset + l, groups = c->n_groups ? c->n_groups : 1;
#define SET(...) snprintf(buf[n++], SET_LEN, __VA_ARGS__)
    SET("RANK=%d", rank);
    SET("LOCAL_RANK=%d", l);
    SET("WORLD_SIZE=%d", w->world_size);
    SET("LOCAL_WORLD_SIZE=%d", c->local_size);
    SET("GROUP_RANK=%d", c->group_rank);
    SET("GROUP_WORLD_SIZE=%d", groups);
    SET("ROLE_RANK=%d", rank);
    SET("ROLE_WORLD_SIZE=%d", w->world_size);
    SET("ROLE_NAME=default");
    SET("MASTER_ADDR=%s", c->master_addr ? c->master_addr : "127.0.0.1");
    SET("MASTER_PORT=%d", c->master_port ? c->master_port : 29500);
    SET("ADT_RESTART_COUNT=%d", c->restart_count);
    SET("TORCHELASTIC_RESTART_COUNT=%d", c->restart_count);
    SET("TORCHELASTIC_MAX_RESTARTS=%d", c->max_restarts);
    SET("ADT_RUN_ID=%s", c->run_id ? c->run_id : "none");
    SET("TORCHELASTIC_RUN_ID=%s", c->run_id ? c->run_id : "none");
    /* as torchrun: several ranks on one node should not each start a thread per core */
    if (c->local_size > 1 && !getenv("OMP_NUM_THREADS")) SET("OMP_NUM_THREADS=1");
    if (c->pmi == ADT_PMI_FD) {
        SET("PMI_FD=%d", pmi_child_fd);
        SET("PMI_RANK=%d", rank);
        SET("PMI_SIZE=%d", w->world_size);
    } else if (c->pmi == ADT_PMI_TCP) {
        SET("PMI_PORT=%s", w->pmi_port);
        SET("PMI_ID=%d", rank);
    }
#undef SET
    return n;
}

static int nonblock(int fd) { return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static int start_rank(adt_world *w, const adt_world_config *c, int l, const char *path,
                      const int *cpus, int n_cpus, int null_fd) {
    wslot *s = &w->r[l];
    int pmi_pair[2] = {-1, -1}, pipes[2][2] = {{-1, -1}, {-1, -1}};
    if (c->pmi == ADT_PMI_FD) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pmi_pair))
            return adt_error(ADT_ERR_IO, "world: socketpair for rank %d: %s", s->info.rank, strerror(errno));
        pmi_pair[0] = wk_fd_high(pmi_pair[0]);
        pmi_pair[1] = wk_fd_high(pmi_pair[1]);
        nonblock(pmi_pair[0]);
    }
    if (c->prefix_output)
        for (int which = 0; which < 2; which++) {
            if (pipe2(pipes[which], O_CLOEXEC)) {
                int e = errno;
                for (int k = 0; k < 2; k++) close(pmi_pair[k]), close(pipes[0][k]);
                return adt_error(ADT_ERR_IO, "world: pipe for rank %d: %s", s->info.rank, strerror(e));
            }
            pipes[which][0] = wk_fd_high(pipes[which][0]);
            pipes[which][1] = wk_fd_high(pipes[which][1]);
            nonblock(pipes[which][0]);
            s->lb[which] = adt_calloc(1, sizeof *s->lb[which]);
        }
    char sets_buf[N_SETS_MAX][SET_LEN];
    const char *sets[N_SETS_MAX];
    int n_sets = rank_env(w, c, l, pmi_pair[1], sets_buf);
    for (int i = 0; i < n_sets; i++) sets[i] = sets_buf[i];
    char **envp = wk_env_build(sets, n_sets, c->env);
    s->info.cpu = c->bind == ADT_BIND_CORE ? cpus[l % n_cpus] : -1;
    wk_spawn a = {.path = path, .argv = (char *const *)c->argv, .envp = envp,
                  .pmi_fd = pmi_pair[1], .out_fd = pipes[0][1], .err_fd = pipes[1][1],
                  .null_fd = null_fd, .cpu = s->info.cpu};
    s->info.t_start = adt_now_s();
    int rc = wk_spawn_one(&a, &s->info.pid, &s->pidfd);
    wk_env_free(envp);
    if (pmi_pair[1] >= 0) close(pmi_pair[1]);
    for (int which = 0; which < 2; which++)
        if (pipes[which][1] >= 0) close(pipes[which][1]);
    s->pipe_fd[0] = pipes[0][0];
    s->pipe_fd[1] = pipes[1][0];
    if (rc) {
        if (pmi_pair[0] >= 0) close(pmi_pair[0]);
        return rc;
    }
    s->info.running = 1;
    w->n_running++;
    if (c->pmi == ADT_PMI_FD) add_link(w, pmi_pair[0], adt_pmi_conn_open(w->pmi, s->info.rank));
    return ADT_OK;
}

int adt_world_start(adt_world **out, const adt_world_config *c) {
    *out = NULL;
    int world = c->world_size ? c->world_size : c->local_size;
    int rc = check_config(c, world);
    if (rc) return rc;
    char path[4096];
    if ((rc = wk_resolve_command(c->argv[0], path, sizeof path))) return rc;

    adt_world *w = adt_calloc(1, sizeof *w);
    w->world_size = world;
    w->local_size = c->local_size;
    w->rank_offset = c->rank_offset;
    w->pmi_mode = c->pmi;
    w->grace_s = c->kill_grace_s == 0 ? 2.0 : c->kill_grace_s;
    w->keep_going = c->keep_going;
    w->out_fd = c->out_fd ? c->out_fd : 1;
    w->err_fd = c->err_fd ? c->err_fd : 2;
    w->listen_fd = -1;
    w->max_links = 2 * c->local_size + 8;
    w->links = adt_calloc((size_t)w->max_links, sizeof *w->links);
    w->r = adt_calloc((size_t)c->local_size, sizeof *w->r);
    for (int l = 0; l < c->local_size; l++) {
        w->r[l].info.rank = c->rank_offset + l;
        w->r[l].info.local_rank = l;
        w->r[l].info.cpu = -1;
        w->r[l].pidfd = -1;
        w->r[l].pipe_fd[0] = w->r[l].pipe_fd[1] = -1;
    }
    if (c->pmi != ADT_PMI_OFF) {
        int groups = c->n_groups ? c->n_groups : 1;
        int *sizes = adt_malloc((size_t)groups * sizeof *sizes);
        for (int g = 0; g < groups; g++) sizes[g] = c->group_sizes ? c->group_sizes[g] : c->local_size;
        char map[ADT_PMI_VALLEN_MAX];
        /* too long for a value: RFC 13 says serve it empty ("unknown") */
        if (adt_pmi_process_mapping(map, sizeof map, groups, sizes)) map[0] = 0;
        free(sizes);
        adt_pmi_config pc = {.world_size = world, .rank_offset = c->rank_offset,
                             .local_size = c->local_size, .process_mapping = map,
                             .on_event = on_pmi_event,
                             .on_barrier = c->on_barrier ? on_pmi_barrier : NULL, .ctx = w};
        w->user_barrier = c->on_barrier;
        w->user_ctx = c->ctx;
        rc = adt_pmi_server_create(&w->pmi, &pc);
        if (!rc && c->pmi == ADT_PMI_TCP) rc = listen_tcp(w, c->pmi_host ? c->pmi_host : "127.0.0.1", c->pmi_port);
        if (rc) {
            adt_world_free(w);
            return rc;
        }
    }
    int cpus[CPU_SETSIZE];
    int n_cpus = wk_allowed_cpus(cpus, CPU_SETSIZE);
    int null_fd = wk_fd_high(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (null_fd < 0) {
        adt_world_free(w);
        return adt_error(ADT_ERR_IO, "world: /dev/null: %s", strerror(errno));
    }
    for (int l = 0; l < c->local_size && !rc; l++) rc = start_rank(w, c, l, path, cpus, n_cpus, null_fd);
    close(null_fd);
    if (rc) {
        adt_world_free(w); /* kills and reaps the ranks already started */
        return rc;
    }
    *out = w;
    return ADT_OK;
}
