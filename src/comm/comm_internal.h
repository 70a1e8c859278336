/*
 * comm_internal.h - what the communicator front end (comm.c) and its backends (comm_self.c,
 * comm_mpi.c) share: the communicator and request structs, the operation descriptor, and the
 * backend table.
 *
 * The front end validates arguments, names things in error messages, runs the bounded waits
 * and builds sub-communicators; a backend only starts an operation, polls it, and creates or
 * frees its own handle. A backend reports a failure as a short reason (why[]) that the front
 * end prefixes with the operation and the communicator.
 */
#ifndef ADTRAIN_COMM_INTERNAL_H
#define ADTRAIN_COMM_INTERNAL_H

#include "adtrain/base.h"
#include "adtrain/comm.h"

/* What an operation moves. The tensor dtypes plus the wider scalars of the typed helpers. */
typedef enum comm_elem { CE_F32, CE_F64, CE_I32, CE_I64, CE_BF16, CE_COUNT } comm_elem;

typedef enum comm_kind {
    OP_ALLREDUCE,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER,
    OP_ALLTOALL,
    OP_BCAST,
    OP_SEND,
    OP_RECV,
    OP_BARRIER,
} comm_kind;

/* One operation, as the caller described it (pointers are the caller's and outlive it). */
typedef struct comm_op {
    comm_kind kind;
    comm_elem elem;
    const void *send;       /* reduce_scatter, allgather, alltoall, send                       */
    void *recv;             /* allreduce and bcast (in place), reduce_scatter, allgather, ...   */
    int64_t n;              /* allreduce, bcast, send, recv: elements; collectives: the total   */
    const int64_t *counts;  /* reduce_scatter / allgather: counts[p]; alltoall: sendcounts[p]   */
    const int64_t *rcounts; /* alltoall: recvcounts[p]                                          */
    int peer;               /* bcast: root; send / recv: the other rank                         */
    int tag;
} comm_op;

#define COMM_WHY 512 /* room for a backend's reason */

struct adt_comm_req {
    adt_comm *comm; /* NULL once an orphan's communicator was freed                          */
    comm_op op;
    void *be;       /* the backend's state for this operation, in the same allocation          */
    int done;       /* completed (possibly with an error), seen by adt_comm_progress           */
    int status;     /* when done                                                              */
    char *errmsg;   /* when done with an error: the full message, owned                       */
    adt_comm_req *prev, *next; /* the communicator's in-flight list, or the orphan list       */
};

typedef struct comm_backend comm_backend;

struct adt_comm {
    const comm_backend *be;
    void *bs; /* the backend's handle (MPI_Comm, the self queue) */
    char name[128];
    int rank, size;
    int *world_ranks; /* [size] */
    double timeout_s;
    int polite;       /* waits yield and sleep instead of spinning (oversubscribed node) */
    int broken;
    char broken_why[256];
    adt_comm_req *inflight;
    int n_inflight;
    int is_world;
    adt_comm *live_prev, *live_next; /* every communicator not yet freed */
};

struct comm_backend {
    const char *name;
    adt_comm_backend kind;
    /* Bytes of per-request state the backend needs for op on c (r->be points at them). */
    size_t (*req_size)(const adt_comm *c, const comm_op *op);
    /* Starts r->op on c. ADT_OK, or an error code with the reason in why. */
    int (*start)(adt_comm *c, adt_comm_req *r, char *why);
    /* Polls r once without blocking; *done = 1 when it finished, then returns its status (reason
     * in why). Must not look at r->comm (orphans have none). */
    int (*test)(adt_comm_req *r, int *done, char *why);
    /* 1 if waiting alone can never complete r (the self backend's recv with no send queued). */
    int (*stuck)(const adt_comm_req *r);
    /* After a timeout: withdraws r if it can (a recv); 1 when r is finished and can be freed. */
    int (*cancel)(adt_comm_req *r);
    /* Collective over c: this rank's part of a split; a member (color >= 0) gets *bs and checks
     * that the backend agrees on its rank and size. */
    int (*split)(adt_comm *c, int color, int key, int new_rank, int new_size, void **bs,
                 char *why);
    void (*free)(adt_comm *c);
    /* Ends the process group (MPI_Abort, or exit). */
    void (*abort)(adt_comm *c, int code);
};

extern const comm_backend comm_self_backend;
extern const comm_backend comm_mpi_backend;

/* The self backend's world; the MPI backend's world (MPI_Init, dup of MPI_COMM_WORLD). Both
 * fill rank, size and bs; the MPI one also says whether the node is oversubscribed. */
int comm_self_init(adt_comm *w);
int comm_mpi_init(adt_comm *w, int *oversubscribed, char *why);
/* MPI_Finalize if adt_comm_init started MPI (under the watchdog). */
int comm_mpi_finalize(double timeout_s, char *why);

/* At finalize: frees what the shared-memory collectives (comm_shm.c) kept for communicators
 * whose operations timed out; MPI calls only if mpi_usable. */
void comm_shm_release_all(int mpi_usable);

/* Steps the shared-memory collectives have taken in this process (a flag set, a peer's step
 * seen): a polite wait naps only after a stretch in which nothing moved (comm.c). */
unsigned long comm_shm_moves(void);

size_t comm_elem_size(comm_elem e);
const char *comm_elem_name(comm_elem e);

/* The watchdog (watchdog.c): a thread that ends the process if the call between begin and end
 * does not return within timeout_s. `what` names the call and the communicator. */
void comm_watch_begin(const char *what, double timeout_s);
void comm_watch_end(void);
void comm_watch_stop(void);

#endif
