/*
 * comm_mpi.c - the MPI backend: standard MPI-3 calls only (written against Debian's MPICH
 * 4.0.2, ch4:ucx; Open MPI 4.1 has every call used here).
 *
 * Every operation is MPI's non-blocking form; the front end polls it with MPI_Test and bounds
 * the wait. That costs little bandwidth: on MPICH 4.0.2, MPI_Iallreduce polled by MPI_Test came
 * within 1-3 % of MPI_Allreduce at 64 KiB - 1 MiB and matched it above (docs/BENCHMARKS.md,
 * "Communication"), so no blocking call and no watchdog is needed on that path. Errors come
 * back as codes (MPI_ERRORS_RETURN on the world, inherited by every communicator made from it)
 * and are turned into adtrain errors with MPI_Error_string. The calls with no non-blocking form
 * (init, dup, split, finalize) run under the watchdog.
 */
#include "comm_shm.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

typedef struct mpi_req {
    MPI_Request mr;
    shm_op *shm; /* the operation runs through shared memory (comm_shm.c), or NULL */
    int ints[]; /* counts and displacements of the v-collectives: MPI reads them until the end */
} mpi_req;

/* A communicator's handle (adt_comm.bs). */
typedef struct mpi_handle {
    MPI_Comm comm;
    comm_shm *shm; /* NULL: no shared-memory collectives on it */
} mpi_handle;

static int g_started; /* adt_comm_init called MPI_Init, so adt_comm_finalize ends it */

static MPI_Comm comm_of(const adt_comm *c) { return ((const mpi_handle *)c->bs)->comm; }
static comm_shm *shm_of(const adt_comm *c) { return ((const mpi_handle *)c->bs)->shm; }

/* The shared-memory state of a new communicator: collective, under the watchdog. */
static void attach_shm(mpi_handle *h, const char *name, int rank, int size, double timeout_s) {
    char what[256];
    snprintf(what, sizeof what, "shared-memory setup of '%s' (rank %d of %d)", name, rank, size);
    comm_watch_begin(what, timeout_s);
    comm_shm_setup(h->comm, &h->shm);
    comm_watch_end();
}

/* Where a request's shared-memory state starts (mpi_req_size puts it behind the ints). */
static size_t req_head(int nints) { return (sizeof(mpi_req) + (size_t)nints * sizeof(int) + 15) & ~(size_t)15; }

static MPI_Datatype mpi_type(comm_elem e) {
    switch (e) {
    case CE_F32: return MPI_FLOAT;
    case CE_F64: return MPI_DOUBLE;
    case CE_I32: return MPI_INT32_T;
    case CE_I64: return MPI_INT64_T;
    case CE_BF16: return MPI_UINT16_T; /* moved as bits, never reduced */
    default: return MPI_DATATYPE_NULL;
    }
}

/* The reason for an MPI error: the call and MPI's own text on one line. */
static int mpi_why(int err, const char *call, char *why) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0, cls = 0;
    if (MPI_Error_string(err, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", err);
    for (char *p = s; *p; p++)
        if (*p == '\n') *p = ' ';
    MPI_Error_class(err, &cls);
    snprintf(why, COMM_WHY, "%s failed: %.380s (MPI error class %d)%s", call, s, cls,
             cls == MPI_ERR_TRUNCATE ? "; the message is longer than the recv expected" : "");
    return ADT_ERR_COMM;
}

int comm_mpi_init(adt_comm *w, int *oversubscribed, char *why) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        snprintf(why, COMM_WHY, "MPI was finalized already in this process and cannot start again");
        return ADT_ERR_STATE;
    }
    if (!inited) {
        int provided = 0;
        comm_watch_begin("MPI_Init_thread", w->timeout_s);
        int e = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        comm_watch_end();
        if (e != MPI_SUCCESS) return mpi_why(e, "MPI_Init_thread", why);
        g_started = 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_handle *h = adt_calloc(1, sizeof *h);
    MPI_Comm *mc = &h->comm;
    /* A private copy of the world: adtrain's messages never meet the application's. */
    comm_watch_begin("MPI_Comm_dup of MPI_COMM_WORLD", w->timeout_s);
    int e = MPI_Comm_dup(MPI_COMM_WORLD, mc);
    comm_watch_end();
    if (e != MPI_SUCCESS) {
        free(h);
        return mpi_why(e, "MPI_Comm_dup", why);
    }
    w->be = &comm_mpi_backend;
    w->bs = h;
    MPI_Comm_rank(*mc, &w->rank);
    MPI_Comm_size(*mc, &w->size);
    attach_shm(h, "world", w->rank, w->size, w->timeout_s);

    /* Ranks on this node against the cores this process may run on: more ranks than cores means
     * a waiting rank must give its core away. */
    MPI_Comm node;
    int local = 1;
    comm_watch_begin("MPI_Comm_split_type of the world", w->timeout_s);
    e = MPI_Comm_split_type(*mc, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &node);
    comm_watch_end();
    if (e == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    *oversubscribed = local > cpus;
    return ADT_OK;
}

int comm_mpi_finalize(double timeout_s, char *why) {
    if (!g_started) return ADT_OK;
    g_started = 0;
    comm_watch_begin("MPI_Finalize", timeout_s);
    int e = MPI_Finalize();
    comm_watch_end();
    return e == MPI_SUCCESS ? ADT_OK : mpi_why(e, "MPI_Finalize", why);
}

static size_t mpi_req_size(const adt_comm *c, const comm_op *op) {
    int p = c->size;
    int nints = op->kind == OP_REDUCE_SCATTER ? 2 * p /* the offsets for the shared-memory path */
              : op->kind == OP_ALLGATHER      ? 2 * p
              : op->kind == OP_ALLTOALL       ? 4 * p
                                              : 0;
    return req_head(nints) + (comm_shm_eligible(shm_of(c), op) ? comm_shm_op_size(shm_of(c)) : 0);
}

static int mpi_start(adt_comm *c, adt_comm_req *r, char *why) {
    const comm_op *op = &r->op;
    MPI_Comm mc = comm_of(c);
    MPI_Datatype t = mpi_type(op->elem);
    int p = c->size;
    mpi_req *q = r->be;
    q->mr = MPI_REQUEST_NULL;
    q->shm = NULL;
    /* The front end checked that every count and every running sum fits an int. */
    int *cnt = q->ints, *dsp = q->ints + p, e = MPI_SUCCESS;
    if (comm_shm_eligible(shm_of(c), op)) { /* the state behind the request's ints (mpi_req_size) */
        int v = op->kind != OP_ALLREDUCE;
        for (int i = 0, off = 0; v && i < p; off += cnt[i], i++) cnt[i] = (int)op->counts[i], dsp[i] = off;
        q->shm = (shm_op *)((char *)q + req_head(v ? 2 * p : 0));
        comm_shm_start(shm_of(c), q->shm, op, v ? cnt : NULL, v ? dsp : NULL);
        return ADT_OK;
    }
    const char *call = "?";
    switch (op->kind) {
    case OP_ALLREDUCE:
        call = "MPI_Iallreduce";
        e = MPI_Iallreduce(MPI_IN_PLACE, op->recv, (int)op->n, t, MPI_SUM, mc, &q->mr);
        break;
    case OP_REDUCE_SCATTER:
        call = "MPI_Ireduce_scatter";
        for (int i = 0; i < p; i++) cnt[i] = (int)op->counts[i];
        e = MPI_Ireduce_scatter(op->send, op->recv, cnt, t, MPI_SUM, mc, &q->mr);
        break;
    case OP_ALLGATHER:
        call = "MPI_Iallgatherv";
        for (int i = 0, off = 0; i < p; off += cnt[i], i++) cnt[i] = (int)op->counts[i], dsp[i] = off;
        e = MPI_Iallgatherv(op->send, cnt[c->rank], t, op->recv, cnt, dsp, t, mc, &q->mr);
        break;
    case OP_ALLTOALL: {
        call = "MPI_Ialltoallv";
        int *rcnt = q->ints + 2 * p, *rdsp = q->ints + 3 * p;
        for (int i = 0, so = 0, ro = 0; i < p; so += cnt[i], ro += rcnt[i], i++) {
            cnt[i] = (int)op->counts[i], dsp[i] = so;
            rcnt[i] = (int)op->rcounts[i], rdsp[i] = ro;
        }
        e = MPI_Ialltoallv(op->send, cnt, dsp, t, op->recv, rcnt, rdsp, t, mc, &q->mr);
        break;
    }
    case OP_BCAST:
        call = "MPI_Ibcast";
        e = MPI_Ibcast(op->recv, (int)op->n, t, op->peer, mc, &q->mr);
        break;
    case OP_SEND:
        call = "MPI_Isend";
        e = MPI_Isend(op->send, (int)op->n, t, op->peer, op->tag, mc, &q->mr);
        break;
    case OP_RECV:
        call = "MPI_Irecv";
        e = MPI_Irecv(op->recv, (int)op->n, t, op->peer, op->tag, mc, &q->mr);
        break;
    case OP_BARRIER:
        call = "MPI_Ibarrier";
        e = MPI_Ibarrier(mc, &q->mr);
        break;
    }
    return e == MPI_SUCCESS ? ADT_OK : mpi_why(e, call, why);
}

/* Drives MPI's progress engine without completing anything of ours. A rank that waits only on
 * shared memory makes no MPI call, yet MPI's operations may still need its progress after its
 * own part of them completed (MPICH and UCX move data inside MPI calls). Without this, a DLRM
 * step under ZeRO on 4 ranks hung in 5 of 20 runs of 200 steps: two ranks in the loss's
 * all-reduce (shared memory's protocol), the other two in a reduce-scatter of the step that the
 * first two had finished; 0 of 20 with ADT_COMM_SHM=0, and 0 of 30 with this
 * (tests/test_comm.c, shm_wait_drives_mpi). */
static void mpi_poke(const adt_comm *c) {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_of(c), &flag, MPI_STATUS_IGNORE);
}

static int mpi_test(adt_comm_req *r, int *done, char *why) {
    mpi_req *q = r->be;
    if (q->shm) {
        int rc = comm_shm_test(q->shm, done, why);
        if (!rc && !*done && r->comm) mpi_poke(r->comm);
        return rc;
    }
    comm_shm_progress();
    MPI_Status st;
    int flag = 0;
    int e = MPI_Test(&q->mr, &flag, &st);
    if (e != MPI_SUCCESS) {
        *done = 1;
        return mpi_why(e, "MPI_Test", why);
    }
    *done = flag;
    if (flag && r->op.kind == OP_RECV) {
        int got = -1;
        MPI_Get_count(&st, mpi_type(r->op.elem), &got);
        if (got != r->op.n) {
            snprintf(why, COMM_WHY, "the message has %d %s, the recv expected %lld", got,
                     comm_elem_name(r->op.elem), (long long)r->op.n);
            return ADT_ERR_COMM;
        }
    }
    return ADT_OK;
}

static int mpi_stuck(const adt_comm_req *r) {
    (void)r;
    return 0;
}

/* Only a receive can be withdrawn (MPI_Cancel of a collective is erroneous, of a send
 * unreliable). The cancel itself completes within moments; a second is ample. */
static int mpi_cancel(adt_comm_req *r) {
    mpi_req *q = r->be;
    if (q->shm) return 0; /* queued behind or still reading peers: stays an orphan */
    if (r->op.kind != OP_RECV || q->mr == MPI_REQUEST_NULL) return q->mr == MPI_REQUEST_NULL;
    if (MPI_Cancel(&q->mr) != MPI_SUCCESS) return 0;
    double t0 = adt_now_s();
    int flag = 0;
    while (!flag && adt_now_s() - t0 < 1.0) {
        if (MPI_Test(&q->mr, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 0;
        if (!flag) sched_yield();
    }
    return flag;
}

static int mpi_split(adt_comm *c, int color, int key, int new_rank, int new_size, void **bs,
                     char *why) {
    char what[256];
    snprintf(what, sizeof what, "MPI_Comm_split on '%s' (rank %d of %d)", c->name, c->rank, c->size);
    MPI_Comm nc = MPI_COMM_NULL;
    comm_watch_begin(what, c->timeout_s);
    int e = MPI_Comm_split(comm_of(c), color < 0 ? MPI_UNDEFINED : color, key, &nc);
    comm_watch_end();
    if (e != MPI_SUCCESS) return mpi_why(e, "MPI_Comm_split", why);
    *bs = NULL;
    if (nc == MPI_COMM_NULL && color < 0) return ADT_OK;
    int rank = -1, size = -1;
    if (nc != MPI_COMM_NULL) MPI_Comm_rank(nc, &rank), MPI_Comm_size(nc, &size);
    if (color < 0 || rank != new_rank || size != new_size) {
        snprintf(why, COMM_WHY, "MPI_Comm_split made rank %d of %d where rank %d of %d was expected",
                 rank, size, new_rank, new_size);
        if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
        return ADT_ERR_COMM;
    }
    mpi_handle *h = adt_calloc(1, sizeof *h);
    h->comm = nc;
    attach_shm(h, c->name, new_rank, new_size, c->timeout_s);
    *bs = h;
    return ADT_OK;
}

static void mpi_free(adt_comm *c) {
    mpi_handle *h = c->bs;
    if (!h) return;
    if (!c->broken) comm_shm_free(h->shm); /* else a timed-out operation may still read it */
    MPI_Comm_free(&h->comm);
    free(h);
    c->bs = NULL;
}

static void mpi_abort(adt_comm *c, int code) {
    fflush(stdout);
    MPI_Abort(c && c->bs ? comm_of(c) : MPI_COMM_WORLD, code);
}

const char *adt_comm_mpi_library(void) {
    static char buf[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (!buf[0] && MPI_Get_library_version(buf, &len) == MPI_SUCCESS) buf[strcspn(buf, "\n")] = 0;
    return buf;
}

const comm_backend comm_mpi_backend = {
    .name = "mpi",
    .kind = ADT_COMM_MPI,
    .req_size = mpi_req_size,
    .start = mpi_start,
    .test = mpi_test,
    .stuck = mpi_stuck,
    .cancel = mpi_cancel,
    .split = mpi_split,
    .free = mpi_free,
    .abort = mpi_abort,
};
