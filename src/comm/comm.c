/*
 * comm.c - the communicator front end: the world, argument checks, requests and their bounded
 * waits, and sub-communicators (split, mesh, mesh axis). The backends (comm_self.c, comm_mpi.c)
 * only start, poll and cancel operations.
 *
 * A request lives on its communicator's in-flight list from start to the wait or test that
 * completes it. A request whose wait timed out and that MPI cannot withdraw (any collective)
 * becomes an orphan: MPI still owns its buffers, and adtrain keeps polling it when the
 * communicator is freed and at finalize, so that late peers can still complete it; one that never
 * completes keeps MPI from being finalized (MPI_Finalize would wait for it forever).
 */
#include "comm_internal.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static adt_comm *g_world;
static adt_comm *g_live;             /* every communicator not yet freed */
static adt_comm_req *g_orphans;      /* timed-out operations MPI still owns */
static const double ORPHAN_GRACE_S = 2.0; /* how long free and finalize poll orphans */

/* ---------------------------------------------------------------------------------------------
 * Elements
 */

size_t comm_elem_size(comm_elem e) {
    static const size_t sz[CE_COUNT] = {4, 8, 4, 8, 2};
    return (unsigned)e < CE_COUNT ? sz[e] : 0;
}

const char *comm_elem_name(comm_elem e) {
    static const char *nm[CE_COUNT] = {"f32", "f64", "i32", "i64", "bf16"};
    return (unsigned)e < CE_COUNT ? nm[e] : "?";
}

static int elem_of(adt_dtype dt, comm_elem *e) {
    switch (dt) {
    case ADT_F32: *e = CE_F32; return 1;
    case ADT_I32: *e = CE_I32; return 1;
    case ADT_BF16: *e = CE_BF16; return 1;
    default: return 0;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Lists
 */

static void list_push(adt_comm_req **head, adt_comm_req *r) {
    r->prev = NULL;
    r->next = *head;
    if (*head) (*head)->prev = r;
    *head = r;
}

static void list_remove(adt_comm_req **head, adt_comm_req *r) {
    if (r->prev) r->prev->next = r->next;
    else *head = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void live_add(adt_comm *c) {
    c->live_next = g_live;
    if (g_live) g_live->live_prev = c;
    g_live = c;
}

static void live_remove(adt_comm *c) {
    if (c->live_prev) c->live_prev->live_next = c->live_next;
    else g_live = c->live_next;
    if (c->live_next) c->live_next->live_prev = c->live_prev;
}

/* ---------------------------------------------------------------------------------------------
 * Environment
 */

static int env_timeout(double *out) {
    *out = ADT_COMM_DEFAULT_TIMEOUT_S;
    const char *s = getenv("ADT_COMM_TIMEOUT");
    if (!s || !*s) return ADT_OK;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0) || !isfinite(v))
        return adt_error(ADT_ERR_ARG, "ADT_COMM_TIMEOUT='%s': expected a number of seconds > 0", s);
    *out = v;
    return ADT_OK;
}

/* -1 auto, 0 busy, 1 polite */
static int env_poll(int *out) {
    const char *s = getenv("ADT_COMM_POLL");
    *out = -1;
    if (!s || !*s || !strcasecmp(s, "auto")) return ADT_OK;
    if (!strcasecmp(s, "busy")) *out = 0;
    else if (!strcasecmp(s, "polite")) *out = 1;
    else return adt_error(ADT_ERR_ARG, "ADT_COMM_POLL='%s': expected auto, busy or polite", s);
    return ADT_OK;
}

int adt_comm_launched(void) {
    static const char *vars[] = {"PMI_RANK", "PMI_FD", "PMI_PORT", "PMI_ID", "PMIX_RANK",
                                 "OMPI_COMM_WORLD_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The world
 */

int adt_comm_init(adt_comm_backend backend, adt_comm **world) {
    if (!world) return adt_error(ADT_ERR_ARG, "adt_comm_init: world is NULL");
    *world = NULL;
    if (g_world) return adt_error(ADT_ERR_STATE, "adt_comm_init: the world exists already; call adt_comm_finalize first");
    double timeout;
    int poll, rc;
    if ((rc = env_timeout(&timeout)) || (rc = env_poll(&poll))) return adt_error_prefix(rc, "adt_comm_init: ");
    if (backend == ADT_COMM_AUTO) {
        const char *s = getenv("ADT_COMM");
        if (s && !strcasecmp(s, "self")) backend = ADT_COMM_SELF;
        else if (s && !strcasecmp(s, "mpi")) backend = ADT_COMM_MPI;
        else if (s && *s) return adt_error(ADT_ERR_ARG, "adt_comm_init: ADT_COMM='%s': expected self or mpi", s);
        else backend = adt_comm_launched() ? ADT_COMM_MPI : ADT_COMM_SELF;
    }
    if (backend != ADT_COMM_SELF && backend != ADT_COMM_MPI)
        return adt_error(ADT_ERR_ARG, "adt_comm_init: unknown backend %d", (int)backend);

    adt_comm *w = adt_calloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "world");
    w->timeout_s = timeout;
    w->is_world = 1;
    int oversubscribed = 0;
    if (backend == ADT_COMM_SELF) {
        comm_self_init(w);
    } else {
        char why[COMM_WHY] = "";
        rc = comm_mpi_init(w, &oversubscribed, why);
        if (rc) {
            free(w);
            return adt_error(rc, "adt_comm_init: %s", why);
        }
    }
    w->polite = poll < 0 ? oversubscribed : poll;
    w->world_ranks = adt_malloc((size_t)w->size * sizeof(int));
    for (int i = 0; i < w->size; i++) w->world_ranks[i] = i;
    live_add(w);
    g_world = w;
    *world = w;
    return ADT_OK;
}

void adt_comm_abort(adt_comm *c, int code) {
    if (c) c->be->abort(c, code);
    fflush(stdout);
    exit(code);
}

/* ---------------------------------------------------------------------------------------------
 * Properties
 */

int adt_comm_rank(const adt_comm *c) { return c ? c->rank : -1; }
int adt_comm_size(const adt_comm *c) { return c ? c->size : 0; }
const char *adt_comm_name(const adt_comm *c) { return c ? c->name : "(null)"; }
adt_comm_backend adt_comm_backend_of(const adt_comm *c) { return c ? c->be->kind : ADT_COMM_AUTO; }
int adt_comm_world_rank(const adt_comm *c, int r) {
    return c && r >= 0 && r < c->size ? c->world_ranks[r] : -1;
}
double adt_comm_timeout(const adt_comm *c) { return c ? c->timeout_s : 0; }
int adt_comm_broken(const adt_comm *c) { return c ? c->broken : 0; }

int adt_comm_set_timeout(adt_comm *c, double seconds) {
    if (!c) return adt_error(ADT_ERR_ARG, "adt_comm_set_timeout: the communicator is NULL");
    if (!(seconds > 0) || !isfinite(seconds))
        return adt_error(ADT_ERR_ARG, "adt_comm_set_timeout on '%s': %g s, expected a number of seconds > 0",
                         c->name, seconds);
    c->timeout_s = seconds;
    return ADT_OK;
}

void adt_comm_block_counts(int64_t n, int p, int64_t *counts) {
    for (int i = 0; i < p; i++) {
        int64_t start;
        adt_block_range(n, p, i, &start, &counts[i]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Describing operations for messages
 */

static const char *op_name(comm_kind k) {
    switch (k) {
    case OP_ALLREDUCE: return "allreduce";
    case OP_REDUCE_SCATTER: return "reduce-scatter";
    case OP_ALLGATHER: return "all-gather";
    case OP_ALLTOALL: return "all-to-all";
    case OP_BCAST: return "broadcast";
    case OP_SEND: return "send";
    case OP_RECV: return "recv";
    case OP_BARRIER: return "barrier";
    }
    return "?";
}

/* "allreduce of 1000 f32 on 'world' (rank 0 of 2)" */
static void op_where(const adt_comm *c, const comm_op *op, char *buf, size_t n) {
    const char *en = comm_elem_name(op->elem);
    int k;
    switch (op->kind) {
    case OP_SEND:
    case OP_RECV:
        k = snprintf(buf, n, "%s of %lld %s %s rank %d tag %d", op_name(op->kind), (long long)op->n, en,
                     op->kind == OP_SEND ? "to" : "from", op->peer, op->tag);
        break;
    case OP_BCAST:
        k = snprintf(buf, n, "broadcast of %lld %s from root %d", (long long)op->n, en, op->peer);
        break;
    case OP_BARRIER: k = snprintf(buf, n, "barrier"); break;
    default: k = snprintf(buf, n, "%s of %lld %s", op_name(op->kind), (long long)op->n, en); break;
    }
    if (k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " on '%s' (rank %d of %d)", c->name, c->rank, c->size);
}

/* ---------------------------------------------------------------------------------------------
 * Argument checks. A message names the API function and what was expected; nothing is started.
 */

static int count_ok(const char *fn, const adt_comm *c, const char *what, int64_t v) {
    if (v < 0) return adt_error(ADT_ERR_ARG, "%s on '%s': %s = %lld, expected >= 0", fn, c->name, what, (long long)v);
    if (v > INT_MAX)
        return adt_error(ADT_ERR_ARG, "%s on '%s': %s = %lld elements, more than MPI's int counts allow (%d)",
                         fn, c->name, what, (long long)v, INT_MAX);
    return ADT_OK;
}

/* counts[p] >= 0 with their sum in int range; the sum in *total. */
static int counts_ok(const char *fn, const adt_comm *c, const char *what, const int64_t *counts,
                     int64_t *total) {
    if (!counts) return adt_error(ADT_ERR_ARG, "%s on '%s': %s is NULL, expected %d counts", fn, c->name, what, c->size);
    int64_t sum = 0;
    for (int i = 0; i < c->size; i++) {
        if (counts[i] < 0 || counts[i] > INT_MAX) {
            char name[64]; /* formatted only for the message: this loop runs on every call */
            snprintf(name, sizeof name, "%s[%d]", what, i);
            return count_ok(fn, c, name, counts[i]);
        }
        sum += counts[i];
    }
    *total = sum;
    return count_ok(fn, c, what[0] == 'r' ? "the sum of recvcounts" : "the sum of the counts", sum);
}

static int buf_ok(const char *fn, const adt_comm *c, const char *what, const void *p, int64_t n) {
    if (!p && n > 0) return adt_error(ADT_ERR_ARG, "%s on '%s': %s is NULL but holds %lld elements", fn, c->name, what, (long long)n);
    return ADT_OK;
}

static int rank_ok(const char *fn, const adt_comm *c, const char *what, int r) {
    if (r < 0 || r >= c->size)
        return adt_error(ADT_ERR_ARG, "%s on '%s': %s %d, expected 0..%d", fn, c->name, what, r, c->size - 1);
    return ADT_OK;
}

static int op_check(const char *fn, const adt_comm *c, comm_op *op) {
    if (!c) return adt_error(ADT_ERR_ARG, "%s: the communicator is NULL", fn);
    if (c->broken) {
        char where[256];
        op_where(c, op, where, sizeof where);
        return adt_error(ADT_ERR_COMM, "%s: the communicator is unusable since %s", where, c->broken_why);
    }
    if ((op->kind == OP_ALLREDUCE || op->kind == OP_REDUCE_SCATTER) && op->elem == CE_BF16)
        return adt_error(ADT_ERR_UNSUPPORTED, "%s on '%s': sums of bf16 are not supported; reduce in f32", fn, c->name);
    int rc = ADT_OK;
    int64_t total = 0, rtotal = 0;
    switch (op->kind) {
    case OP_ALLREDUCE:
    case OP_BCAST:
    case OP_SEND:
    case OP_RECV:
        if ((rc = count_ok(fn, c, "n", op->n))) return rc;
        if ((rc = buf_ok(fn, c, "buf", op->kind == OP_SEND ? op->send : op->recv, op->n))) return rc;
        if (op->kind == OP_BCAST) return rank_ok(fn, c, "root", op->peer);
        if (op->kind == OP_ALLREDUCE) return ADT_OK;
        if ((rc = rank_ok(fn, c, "peer", op->peer))) return rc;
        if (op->tag < 0 || op->tag > ADT_COMM_TAG_MAX)
            return adt_error(ADT_ERR_ARG, "%s on '%s': tag %d, expected 0..%d", fn, c->name, op->tag, ADT_COMM_TAG_MAX);
        return ADT_OK;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER:
        if ((rc = counts_ok(fn, c, "counts", op->counts, &total))) return rc;
        op->n = total;
        if (op->kind == OP_REDUCE_SCATTER) {
            if ((rc = buf_ok(fn, c, "send", op->send, total))) return rc;
            return buf_ok(fn, c, "recv", op->recv, op->counts[c->rank]);
        }
        if ((rc = buf_ok(fn, c, "send", op->send, op->counts[c->rank]))) return rc;
        return buf_ok(fn, c, "recv", op->recv, total);
    case OP_ALLTOALL:
        if ((rc = counts_ok(fn, c, "sendcounts", op->counts, &total))) return rc;
        if ((rc = counts_ok(fn, c, "recvcounts", op->rcounts, &rtotal))) return rc;
        op->n = total;
        if ((rc = buf_ok(fn, c, "send", op->send, total))) return rc;
        return buf_ok(fn, c, "recv", op->recv, rtotal);
    case OP_BARRIER: return ADT_OK;
    }
    return ADT_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 */

static int op_start(const char *fn, adt_comm *c, comm_op *op, adt_comm_req **out) {
    if (!out) return adt_error(ADT_ERR_ARG, "%s: req is NULL", fn);
    *out = NULL;
    int rc = op_check(fn, c, op);
    if (rc) return rc;
    /* One allocation with the backend's state behind the request, and no zeroing: this runs
     * for every operation, small ones included. */
    size_t head = (sizeof(adt_comm_req) + 15) & ~(size_t)15;
    adt_comm_req *r = adt_malloc(head + c->be->req_size(c, op));
    r->comm = c;
    r->op = *op;
    r->be = (char *)r + head;
    r->done = 0;
    r->status = ADT_OK;
    r->errmsg = NULL;
    char why[COMM_WHY];
    why[0] = 0;
    rc = c->be->start(c, r, why);
    if (rc) {
        char where[256];
        op_where(c, op, where, sizeof where);
        free(r);
        return adt_error(rc, "%s: %s", where, why);
    }
    list_push(&c->inflight, r);
    c->n_inflight++;
    *out = r;
    return ADT_OK;
}

/* One poll. 1 when r is done: its status in r->status, a failure's message in r->errmsg. */
static int req_poll(adt_comm_req *r) {
    if (r->done) return 1;
    int done = 0;
    char why[COMM_WHY];
    why[0] = 0;
    int rc = r->comm->be->test(r, &done, why);
    if (!done) return 0;
    r->done = 1;
    r->status = rc;
    if (rc) {
        char where[256], msg[1024];
        op_where(r->comm, &r->op, where, sizeof where);
        snprintf(msg, sizeof msg, "%s: %s", where, why);
        r->errmsg = adt_strdup(msg);
    }
    return 1;
}

/* Hands a done request's status back to the caller and frees it. */
static int req_finish(adt_comm_req *r) {
    adt_comm *c = r->comm;
    int st = r->status;
    if (st) adt_error(st, "%s", r->errmsg);
    list_remove(&c->inflight, r);
    c->n_inflight--;
    free(r->errmsg);
    free(r);
    return st;
}

/* The wait ran out: the message, a broken communicator, and the request withdrawn or orphaned. */
static int req_timeout(adt_comm_req *r, double waited) {
    adt_comm *c = r->comm;
    char where[256], peer[96], msg[1024];
    op_where(c, &r->op, where, sizeof where);
    if (r->op.kind == OP_SEND || r->op.kind == OP_RECV)
        snprintf(peer, sizeof peer, "rank %d (world rank %d)", r->op.peer, c->world_ranks[r->op.peer]);
    else if (c->size > 1)
        snprintf(peer, sizeof peer, "the other %d rank%s", c->size - 1, c->size > 2 ? "s" : "");
    else
        snprintf(peer, sizeof peer, "itself");
    snprintf(msg, sizeof msg,
             "%s: timed out after %.2f s waiting for %s (timeout %.2f s, ADT_COMM_TIMEOUT or "
             "adt_comm_set_timeout); the communicator is unusable from now on",
             where, waited, peer, c->timeout_s);
    c->broken = 1;
    snprintf(c->broken_why, sizeof c->broken_why, "%.200s timed out after %.2f s", where, waited);
    list_remove(&c->inflight, r);
    c->n_inflight--;
    if (c->be->cancel(r)) {
        free(r);
    } else {
        r->errmsg = adt_strdup(msg);
        list_push(&g_orphans, r);
    }
    return adt_error(ADT_ERR_COMM, "%s", msg);
}

/* The self backend's recv with nothing that could ever send to it. */
static int req_stuck(adt_comm_req *r) {
    adt_comm *c = r->comm;
    char where[256];
    op_where(c, &r->op, where, sizeof where);
    list_remove(&c->inflight, r);
    c->n_inflight--;
    c->be->cancel(r);
    free(r);
    return adt_error(ADT_ERR_COMM,
                     "%s: can never complete: no matching send was posted, and no other rank "
                     "exists to post one",
                     where);
}

/* ---------------------------------------------------------------------------------------------
 * Waiting. MPI moves data only inside MPI calls, so a wait polls. Where each rank has a core
 * (busy), it spins like MPI's own blocking calls: any pause lets a transfer stall (measured: a
 * 20 us nanosleep between polls cost a 64 MiB allreduce 40 %), and so does sched_yield on a
 * loaded machine (the core goes to another process for a time slice: 4 MiB allreduces took 5 ms
 * instead of 0.9 ms); only after a second, when a peer is plainly late rather than the transfer
 * long, does it sleep 1 ms between polls.
 *
 * Where ranks share cores (polite), a spinning rank takes the core from the rank it waits for
 * (measured on 4 ranks / 2 cores: 16 ms for a 64 KiB MPI_Allreduce, 4 ms yielding, 1.4 ms
 * sleeping). It yields while the operation could still be moving data: for as long as its bytes
 * take at 1 GB/s, and at least 1 ms. Then it naps waited/16, between 20 and 100 us, between polls,
 * and 1 ms after a second. Naps free the core (ranks computing 1 s of work beside two waiting
 * ones took 2.1 s with naps, 3.0 s with yields, 2.7-3.3 s spinning), but they starve transfers
 * that need every rank back in MPI at each step (a 64 MiB allreduce ran 10-15 % slower than
 * MPI's spinning one with naps from 1 ms on, 4-12 % faster when yielding): hence the window
 * that grows with the size.
 */

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* How long a polite wait yields before it naps: the time r's bytes take at 1 GB/s. */
static double yield_window(const adt_comm_req *r) {
    double bytes = (double)r->op.n * (double)comm_elem_size(r->op.elem);
    return adt_comm_yield_window_s((r->op.kind == OP_ALLREDUCE ? 2 : 1) * bytes);
}

/* `quiet`: how long nothing has moved (a polite wait's own clock, see wait_reqs). */
static void backoff(int polite, double waited, double quiet, double yield_s) {
    if (!polite) {
        if (waited >= 1.0) nap(1e-3);
        return;
    }
    if (quiet < yield_s && quiet < 1.0) {
        sched_yield();
        return;
    }
    double d = quiet / 16, cap = quiet < 1.0 ? 1e-4 : 1e-3;
    nap(d < 2e-5 ? 2e-5 : d > cap ? cap : d);
}

/* Waits for n requests (NULL entries skipped), each until its own communicator's timeout.
 *
 * A polite wait naps only after a stretch in which nothing moved: no request of the wait
 * finished and the shared-memory all-reduce took no step. That all-reduce moves only while
 * every rank polls (each phase waits for the peers' flags), so a nap at every phase handed the
 * peers its length each time: GPT-S data parallel on 2 ranks under the agent measured 2-3 ms a
 * step slower polite than busy before this. The deadline still runs from the wait's start. */
static int wait_reqs(adt_comm_req **rs, int n) {
    double t0 = -1, waited = 0, t_moved = -1, quiet = 0;
    unsigned long moves = 0;
    int polite = 0, first = ADT_OK;
    double yield_s = 0;
    char *first_msg = NULL;
    for (int i = 0; i < n; i++) {
        if (!rs[i]) continue;
        if (rs[i]->comm->polite) polite = 1;
        double y = yield_window(rs[i]);
        if (y > yield_s) yield_s = y;
    }
    for (unsigned pass = 0;; pass++) {
        /* The first pass only polls: small operations often complete there, and in a virtual
         * machine a clock read costs as much as a poll. From the second pass on the clock runs;
         * a spinning wait reads it every 32nd pass (a poll takes well under a microsecond, and
         * no deadline needs a finer grain). */
        int tick = pass > 0 && (polite || (pass & 31) == 1);
        if (tick) {
            double now = adt_now_s();
            if (t0 < 0) t0 = now;
            waited = now - t0;
            unsigned long m = comm_shm_moves();
            if (t_moved < 0 || m != moves) t_moved = now, moves = m;
            quiet = now - t_moved;
        }
        int left = 0, finished = 0;
        for (int i = 0; i < n; i++) {
            adt_comm_req *r = rs[i];
            if (!r) continue;
            int rc;
            if (req_poll(r)) rc = req_finish(r);
            else if (tick && r->comm->be->stuck(r)) rc = req_stuck(r);
            else if (tick && waited >= r->comm->timeout_s) rc = req_timeout(r, waited);
            else {
                left++;
                continue;
            }
            rs[i] = NULL;
            finished = 1;
            if (rc && !first) {
                first = rc;
                first_msg = adt_strdup(adt_error_message());
            }
        }
        if (!left) break;
        if (finished) t_moved = -1, quiet = 0; /* the rest may be close behind: yield, not nap */
        if (tick) backoff(polite, waited, quiet, yield_s);
    }
    if (first) {
        adt_error(first, "%s", first_msg);
        free(first_msg);
    }
    return first;
}

int adt_comm_wait(adt_comm_req **req) {
    if (!req) return adt_error(ADT_ERR_ARG, "adt_comm_wait: req is NULL");
    return wait_reqs(req, 1);
}

int adt_comm_waitall(adt_comm_req **reqs, int n) {
    if (n < 0 || (n > 0 && !reqs)) return adt_error(ADT_ERR_ARG, "adt_comm_waitall: %d requests at %p", n, (void *)reqs);
    return wait_reqs(reqs, n);
}

int adt_comm_test(adt_comm_req **req, int *done) {
    if (!req || !done) return adt_error(ADT_ERR_ARG, "adt_comm_test: req or done is NULL");
    *done = 1;
    if (!*req) return ADT_OK;
    if (!req_poll(*req)) {
        *done = 0;
        return ADT_OK;
    }
    int rc = req_finish(*req);
    *req = NULL;
    return rc;
}

int adt_comm_progress(adt_comm *c) {
    if (!c) return adt_error(ADT_ERR_ARG, "adt_comm_progress: the communicator is NULL");
    for (adt_comm_req *r = c->inflight; r; r = r->next) req_poll(r);
    return ADT_OK;
}

/* Start + bounded wait: every blocking operation. */
static int op_run(const char *fn, adt_comm *c, comm_op *op) {
    adt_comm_req *r;
    int rc = op_start(fn, c, op, &r);
    return rc ? rc : wait_reqs(&r, 1);
}

/* Polls the orphans of c (every orphan if c is NULL) for up to `grace` seconds so that late
 * peers can still complete them; those that finish are freed. Returns how many are left. */
static int orphans_settle(const adt_comm *c, double grace) {
    double t0 = adt_now_s();
    for (;;) {
        int left = 0;
        for (adt_comm_req *r = g_orphans, *next; r; r = next) {
            next = r->next;
            if (c && r->comm != c) continue;
            int done = 0;
            char why[COMM_WHY];
            const comm_backend *be = r->comm ? r->comm->be : &comm_mpi_backend;
            be->test(r, &done, why);
            if (!done) {
                left++;
                continue;
            }
            list_remove(&g_orphans, r);
            free(r->errmsg);
            free(r);
        }
        double waited = adt_now_s() - t0;
        if (!left || waited >= grace) return left;
        backoff(1, waited, waited, 0);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Freeing and finalizing
 */

/* Frees c after polling its orphans for up to `grace` seconds. An orphan still pending keeps
 * its MPI request (MPI_Comm_free lets pending operations finish) but loses its communicator. */
static void comm_destroy(adt_comm *c, double grace) {
    if (orphans_settle(c, grace))
        for (adt_comm_req *r = g_orphans; r; r = r->next)
            if (r->comm == c) r->comm = NULL;
    c->be->free(c);
    live_remove(c);
    free(c->world_ranks);
    free(c);
}

int adt_comm_free(adt_comm *c) {
    if (!c) return ADT_OK;
    if (c->is_world) return adt_error(ADT_ERR_STATE, "adt_comm_free: '%s' is freed by adt_comm_finalize", c->name);
    if (c->n_inflight)
        return adt_error(ADT_ERR_STATE, "adt_comm_free on '%s': %d operation%s still in flight; wait for them first",
                         c->name, c->n_inflight, c->n_inflight > 1 ? "s" : "");
    comm_destroy(c, ORPHAN_GRACE_S);
    return ADT_OK;
}

/* At finalize: requests nobody waited for are given up like timed-out ones. */
static void give_up_inflight(adt_comm *c) {
    while (c->inflight) {
        adt_comm_req *r = c->inflight;
        list_remove(&c->inflight, r);
        c->n_inflight--;
        if (c->be->cancel(r)) {
            free(r->errmsg);
            free(r);
        } else {
            list_push(&g_orphans, r);
        }
    }
}

int adt_comm_finalize(adt_comm *world) {
    if (!world || world != g_world)
        return adt_error(ADT_ERR_ARG, "adt_comm_finalize: expected the world from adt_comm_init");
    /* Sub-communicators still open are named in the error and freed anyway. */
    char open_names[512] = "";
    int n_open = 0;
    for (adt_comm *c = g_live, *next; c; c = next) {
        next = c->live_next;
        if (c == world) continue;
        size_t k = strlen(open_names);
        snprintf(open_names + k, sizeof open_names - k, "%s'%s'", n_open ? ", " : "", c->name);
        n_open++;
        give_up_inflight(c);
    }
    give_up_inflight(world);
    /* One grace period for every orphan, then the communicators go. */
    int is_mpi = world->be->kind == ADT_COMM_MPI;
    double timeout = world->timeout_s;
    int left = orphans_settle(NULL, ORPHAN_GRACE_S);
    while (g_live) comm_destroy(g_live, 0);
    g_world = NULL;

    int rc = ADT_OK;
    char msg[1024] = "";
    if (is_mpi) comm_shm_release_all(!left);
    if (left) {
        snprintf(msg, sizeof msg,
                 "adt_comm_finalize: MPI left unfinalized: %d operation%s that timed out never "
                 "completed (first: %s)",
                 left, left > 1 ? "s" : "", g_orphans->errmsg ? g_orphans->errmsg : "?");
        while (g_orphans) {
            adt_comm_req *r = g_orphans;
            list_remove(&g_orphans, r);
            free(r->errmsg);
            free(r);
        }
        rc = ADT_ERR_COMM;
    } else if (is_mpi) {
        char why[COMM_WHY] = "";
        if ((rc = comm_mpi_finalize(timeout, why))) snprintf(msg, sizeof msg, "adt_comm_finalize: %s", why);
    }
    comm_watch_stop();
    if (rc) return adt_error(rc, "%s", msg);
    if (n_open)
        return adt_error(ADT_ERR_STATE, "adt_comm_finalize: %d communicator%s still open (%s); freed them",
                         n_open, n_open > 1 ? "s were" : " was", open_names);
    return ADT_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Operations
 */

/* op_start for the public functions: the dtype becomes the element type first. */
static int start_dt(const char *fn, adt_comm *c, adt_dtype dt, comm_op *op, adt_comm_req **req) {
    if (!elem_of(dt, &op->elem)) {
        if (req) *req = NULL;
        return adt_error(ADT_ERR_ARG, "%s: dtype %d, expected f32, bf16 or i32", fn, (int)dt);
    }
    return op_start(fn, c, op, req);
}

int adt_comm_iallreduce(adt_comm *c, void *buf, int64_t n, adt_dtype dt, adt_comm_req **req) {
    comm_op op = {.kind = OP_ALLREDUCE, .recv = buf, .n = n};
    return start_dt("adt_comm_iallreduce", c, dt, &op, req);
}

int adt_comm_ireduce_scatter(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                             adt_dtype dt, adt_comm_req **req) {
    comm_op op = {.kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .counts = counts};
    return start_dt("adt_comm_ireduce_scatter", c, dt, &op, req);
}

int adt_comm_iallgather(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                        adt_dtype dt, adt_comm_req **req) {
    comm_op op = {.kind = OP_ALLGATHER, .send = send, .recv = recv, .counts = counts};
    return start_dt("adt_comm_iallgather", c, dt, &op, req);
}

int adt_comm_ialltoall(adt_comm *c, const void *send, const int64_t *sendcounts, void *recv,
                       const int64_t *recvcounts, adt_dtype dt, adt_comm_req **req) {
    comm_op op = {.kind = OP_ALLTOALL, .send = send, .recv = recv, .counts = sendcounts, .rcounts = recvcounts};
    return start_dt("adt_comm_ialltoall", c, dt, &op, req);
}

int adt_comm_ibcast(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int root, adt_comm_req **req) {
    comm_op op = {.kind = OP_BCAST, .recv = buf, .n = n, .peer = root};
    return start_dt("adt_comm_ibcast", c, dt, &op, req);
}

int adt_comm_isend(adt_comm *c, const void *buf, int64_t n, adt_dtype dt, int peer, int tag,
                   adt_comm_req **req) {
    comm_op op = {.kind = OP_SEND, .send = buf, .n = n, .peer = peer, .tag = tag};
    return start_dt("adt_comm_isend", c, dt, &op, req);
}

int adt_comm_irecv(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int peer, int tag,
                   adt_comm_req **req) {
    comm_op op = {.kind = OP_RECV, .recv = buf, .n = n, .peer = peer, .tag = tag};
    return start_dt("adt_comm_irecv", c, dt, &op, req);
}

int adt_comm_ibarrier(adt_comm *c, adt_comm_req **req) {
    comm_op op = {.kind = OP_BARRIER};
    return start_dt("adt_comm_ibarrier", c, ADT_F32, &op, req);
}

/* The blocking forms: the non-blocking start and a bounded wait. */

static int run_dt(const char *fn, adt_comm *c, adt_dtype dt, comm_op *op) {
    adt_comm_req *r;
    int rc = start_dt(fn, c, dt, op, &r);
    return rc ? rc : wait_reqs(&r, 1);
}

int adt_comm_allreduce(adt_comm *c, void *buf, int64_t n, adt_dtype dt) {
    comm_op op = {.kind = OP_ALLREDUCE, .recv = buf, .n = n};
    return run_dt("adt_comm_allreduce", c, dt, &op);
}

int adt_comm_reduce_scatter(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                            adt_dtype dt) {
    comm_op op = {.kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .counts = counts};
    return run_dt("adt_comm_reduce_scatter", c, dt, &op);
}

int adt_comm_allgather(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                       adt_dtype dt) {
    comm_op op = {.kind = OP_ALLGATHER, .send = send, .recv = recv, .counts = counts};
    return run_dt("adt_comm_allgather", c, dt, &op);
}

int adt_comm_alltoall(adt_comm *c, const void *send, const int64_t *sendcounts, void *recv,
                      const int64_t *recvcounts, adt_dtype dt) {
    comm_op op = {.kind = OP_ALLTOALL, .send = send, .recv = recv, .counts = sendcounts, .rcounts = recvcounts};
    return run_dt("adt_comm_alltoall", c, dt, &op);
}

int adt_comm_bcast(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int root) {
    comm_op op = {.kind = OP_BCAST, .recv = buf, .n = n, .peer = root};
    return run_dt("adt_comm_bcast", c, dt, &op);
}

int adt_comm_send(adt_comm *c, const void *buf, int64_t n, adt_dtype dt, int peer, int tag) {
    comm_op op = {.kind = OP_SEND, .send = buf, .n = n, .peer = peer, .tag = tag};
    return run_dt("adt_comm_send", c, dt, &op);
}

int adt_comm_recv(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int peer, int tag) {
    comm_op op = {.kind = OP_RECV, .recv = buf, .n = n, .peer = peer, .tag = tag};
    return run_dt("adt_comm_recv", c, dt, &op);
}

int adt_comm_barrier(adt_comm *c) {
    comm_op op = {.kind = OP_BARRIER};
    return run_dt("adt_comm_barrier", c, ADT_F32, &op);
}

int adt_comm_allreduce_f64(adt_comm *c, double *buf, int64_t n) {
    comm_op op = {.kind = OP_ALLREDUCE, .elem = CE_F64, .recv = buf, .n = n};
    return op_run("adt_comm_allreduce_f64", c, &op);
}

int adt_comm_allreduce_i64(adt_comm *c, int64_t *buf, int64_t n) {
    comm_op op = {.kind = OP_ALLREDUCE, .elem = CE_I64, .recv = buf, .n = n};
    return op_run("adt_comm_allreduce_i64", c, &op);
}

/* ---------------------------------------------------------------------------------------------
 * Sub-communicators
 */

static int mesh_check(const char *fn, const adt_mesh *m) {
    if (!m) return adt_error(ADT_ERR_ARG, "%s: the mesh is NULL", fn);
    if (m->ndim < 1 || m->ndim > ADT_MAX_MESH_DIMS)
        return adt_error(ADT_ERR_ARG, "%s: mesh ndim %d, expected 1..%d", fn, m->ndim, ADT_MAX_MESH_DIMS);
    int64_t prod = 1;
    for (int a = 0; a < m->ndim; a++) {
        if (m->dim[a] < 1) return adt_error(ADT_ERR_ARG, "%s: mesh dim[%d] = %d, expected >= 1", fn, a, m->dim[a]);
        prod *= m->dim[a];
    }
    if (prod != m->nranks)
        return adt_error(ADT_ERR_ARG, "%s: mesh has %d ranks but its shape holds %lld", fn, m->nranks, (long long)prod);
    if (!m->ranks) return adt_error(ADT_ERR_ARG, "%s: mesh ranks is NULL", fn);
    for (int i = 0; i < m->nranks; i++) {
        if (m->ranks[i] < 0) return adt_error(ADT_ERR_ARG, "%s: mesh ranks[%d] = %d, expected >= 0", fn, i, m->ranks[i]);
        for (int j = 0; j < i; j++)
            if (m->ranks[j] == m->ranks[i])
                return adt_error(ADT_ERR_ARG, "%s: rank %d appears twice in the mesh (ranks[%d] and ranks[%d])",
                                 fn, m->ranks[i], j, i);
    }
    return ADT_OK;
}

int adt_comm_mesh_coords(const adt_mesh *mesh, int r, int *coords) {
    int rc = mesh_check("adt_comm_mesh_coords", mesh);
    if (rc) return rc;
    for (int i = 0; i < mesh->nranks; i++) {
        if (mesh->ranks[i] != r) continue;
        for (int a = mesh->ndim - 1, idx = i; a >= 0; a--) {
            coords[a] = idx % mesh->dim[a];
            idx /= mesh->dim[a];
        }
        return 1;
    }
    return 0;
}

/* "mesh(2,2)" */
static void mesh_name(const adt_mesh *m, char *buf, size_t n) {
    int k = snprintf(buf, n, "mesh(");
    for (int a = 0; a < m->ndim && k > 0 && (size_t)k < n; a++)
        k += snprintf(buf + k, n - (size_t)k, a ? ",%d" : "%d", m->dim[a]);
    if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, ")");
}

/* What every rank must agree on for a split: which call it is and its mesh. */
static uint32_t mesh_fingerprint(uint32_t what, const adt_mesh *m, int axis) {
    uint32_t h = adt_crc32c(0, &what, sizeof what);
    if (!m) return h;
    int head[2 + ADT_MAX_MESH_DIMS] = {m->ndim, axis};
    for (int a = 0; a < m->ndim; a++) head[2 + a] = m->dim[a];
    h = adt_crc32c(h, head, sizeof head);
    return adt_crc32c(h, m->ranks, (size_t)m->nranks * sizeof(int));
}

typedef struct member {
    int key, rank;
} member;

static int member_cmp(const void *a, const void *b) {
    const member *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Every split: the ranks exchange (color, key, fingerprint) with a bounded all-gather first, so
 * a missing rank is a timeout error rather than a hang in MPI_Comm_split, and a rank that passed
 * another mesh is found by all; then the backend splits and the new rank order is checked. */
static int comm_sub(const char *fn, adt_comm *c, int color, int key, uint32_t fp,
                    const char *suffix, adt_comm **out) {
    int p = c->size, rc;
    int64_t mine[3] = {color, key, fp};
    int64_t *all = adt_malloc((size_t)p * 3 * sizeof(int64_t)), *cnt = adt_malloc((size_t)p * sizeof(int64_t));
    for (int i = 0; i < p; i++) cnt[i] = 3;
    comm_op op = {.kind = OP_ALLGATHER, .elem = CE_I64, .send = mine, .recv = all, .counts = cnt};
    rc = op_run(fn, c, &op);
    free(cnt);
    if (rc) {
        free(all);
        return adt_error_prefix(rc, "%s: ", fn);
    }
    for (int q = 1; q < p; q++)
        if (all[3 * q + 2] != all[2]) {
            free(all);
            return adt_error(ADT_ERR_ARG,
                             "%s on '%s': rank %d made another call (or passed another mesh) than rank 0; "
                             "every rank must make the same one",
                             fn, c->name, q);
        }
    member *mem = adt_malloc((size_t)p * sizeof *mem);
    int n = 0;
    for (int q = 0; q < p && color >= 0; q++)
        if (all[3 * q] == color) mem[n++] = (member){(int)all[3 * q + 1], q};
    free(all);
    qsort(mem, (size_t)n, sizeof *mem, member_cmp);
    int new_rank = -1;
    for (int i = 0; i < n; i++)
        if (mem[i].rank == c->rank) new_rank = i;

    void *bs = NULL;
    char why[COMM_WHY] = "";
    rc = c->be->split(c, color, key, new_rank, n, &bs, why);
    if (rc || color < 0) {
        free(mem);
        return rc ? adt_error(rc, "%s on '%s' (rank %d of %d): %s", fn, c->name, c->rank, c->size, why) : ADT_OK;
    }
    adt_comm *s = adt_calloc(1, sizeof *s);
    s->be = c->be;
    s->bs = bs;
    snprintf(s->name, sizeof s->name, "%.80s/%.40s", c->name, suffix);
    s->rank = new_rank;
    s->size = n;
    s->world_ranks = adt_malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) s->world_ranks[i] = c->world_ranks[mem[i].rank];
    free(mem);
    s->timeout_s = c->timeout_s;
    s->polite = c->polite;
    live_add(s);
    *out = s;
    return ADT_OK;
}

/* The checks every split makes before it talks to the other ranks. */
static int sub_check(const char *fn, adt_comm *c, adt_comm **out) {
    if (!out) return adt_error(ADT_ERR_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!c) return adt_error(ADT_ERR_ARG, "%s: the communicator is NULL", fn);
    if (c->broken)
        return adt_error(ADT_ERR_COMM, "%s on '%s' (rank %d of %d): the communicator is unusable since %s",
                         fn, c->name, c->rank, c->size, c->broken_why);
    return ADT_OK;
}

int adt_comm_split(adt_comm *c, int color, int key, adt_comm **out) {
    int rc = sub_check("adt_comm_split", c, out);
    if (rc) return rc;
    char suffix[32];
    snprintf(suffix, sizeof suffix, "split(%d)", color);
    return comm_sub("adt_comm_split", c, color < 0 ? -1 : color, key, mesh_fingerprint(1, NULL, 0), suffix, out);
}

/* The mesh checked against c, and this rank's place in it (index -1: not a member). */
static int mesh_place(const char *fn, adt_comm *c, const adt_mesh *m, int *coords, int *index) {
    int rc = mesh_check(fn, m);
    if (rc) return rc;
    *index = -1;
    for (int i = 0; i < m->nranks; i++) {
        if (m->ranks[i] >= c->size)
            return adt_error(ADT_ERR_ARG, "%s on '%s': mesh rank %d, expected 0..%d", fn, c->name, m->ranks[i], c->size - 1);
        if (m->ranks[i] == c->rank) *index = i;
    }
    if (*index >= 0) adt_comm_mesh_coords(m, c->rank, coords);
    return ADT_OK;
}

int adt_comm_mesh(adt_comm *c, const adt_mesh *mesh, adt_comm **out) {
    const char *fn = "adt_comm_mesh";
    int coords[ADT_MAX_MESH_DIMS], index, rc;
    if ((rc = sub_check(fn, c, out)) || (rc = mesh_place(fn, c, mesh, coords, &index))) return rc;
    char suffix[64];
    mesh_name(mesh, suffix, sizeof suffix);
    return comm_sub(fn, c, index >= 0 ? 0 : -1, index, mesh_fingerprint(2, mesh, 0), suffix, out);
}

int adt_comm_mesh_axis(adt_comm *c, const adt_mesh *mesh, int axis, adt_comm **out) {
    const char *fn = "adt_comm_mesh_axis";
    int coords[ADT_MAX_MESH_DIMS], index, rc;
    if ((rc = sub_check(fn, c, out)) || (rc = mesh_place(fn, c, mesh, coords, &index))) return rc;
    if (axis < 0 || axis >= mesh->ndim)
        return adt_error(ADT_ERR_ARG, "%s on '%s': axis %d, expected 0..%d", fn, c->name, axis, mesh->ndim - 1);
    /* Color: this rank's row-major index with its coordinate on `axis` set to 0, which every
     * rank of the same line shares; key: the coordinate on `axis`. */
    int color = -1, key = 0;
    if (index >= 0) {
        color = 0;
        for (int a = 0; a < mesh->ndim; a++) color = color * mesh->dim[a] + (a == axis ? 0 : coords[a]);
        key = coords[axis];
    }
    char suffix[64];
    mesh_name(mesh, suffix, sizeof suffix);
    size_t k = strlen(suffix);
    snprintf(suffix + k, sizeof suffix - k, "/axis%d", axis);
    return comm_sub(fn, c, color, key, mesh_fingerprint(3, mesh, axis), suffix, out);
}
