/*
 * adtrain/comm.h - communicators: collectives and point-to-point messages between ranks.
 *
 * A communicator is a group of ranks that exchange data. Two backends sit behind one interface:
 *   self  one rank, no MPI: every collective is a copy (or nothing), sends to itself are queued.
 *         It gives exactly the results of a 1-rank MPI world, so a serial run needs no MPI.
 *   mpi   MPI-3 (Debian's MPICH; only standard MPI-3 calls, so Open MPI should work as well),
 *         started by mpiexec, by adtrain's own PMI-1 agent, or as a singleton without a launcher.
 *
 * Counts are in elements of the given dtype, never in bytes. Every operation exists blocking and
 * non-blocking; a non-blocking one returns a request that adt_comm_wait / adt_comm_test
 * complete. Collectives must be started in the same order on every rank of a communicator (MPI's
 * rule); several may be in flight at once.
 *
 * Every wait is bounded. Each communicator has a timeout (ADT_COMM_TIMEOUT seconds from the
 * environment, default 300, or adt_comm_set_timeout; sub-communicators inherit it). A wait that
 * reaches it returns ADT_ERR_COMM with a message naming the operation, the communicator, the
 * peer or the ranks waited for, and the time waited: a peer that never arrives is an error, not
 * a hang. After such a timeout the communicator is broken (adt_comm_broken): its operations fail
 * at once, and the buffers of the operation that timed out stay MPI's until the process ends or
 * the late peers arrive (an MPI collective cannot be cancelled). In adtrain's elastic model a
 * timeout ends the world anyway: the worker reports it and exits, the agent starts the next one.
 * The few MPI calls that have no non-blocking form (communicator creation, MPI_Finalize) run
 * under a watchdog thread: if one does not return within the timeout, the process prints what
 * was stuck and exits with ADT_COMM_EXIT_STUCK.
 *
 * Progress: MPI moves data only inside MPI calls. Blocking operations and waits poll; to overlap
 * a non-blocking operation with computation, call adt_comm_test or adt_comm_progress now and
 * then. Waiting ranks spin while there are at least as many cores as ranks on the node; when
 * ranks are oversubscribed (more ranks than cores, as in tests) they yield while the operation's
 * data could still be moving and then sleep in short steps, so a rank that waits does not take
 * the core from one that computes (ADT_COMM_POLL=auto|busy|polite overrides the choice).
 *
 * Threads: a communicator is used from one thread at a time, the MPI backend from the thread
 * that called adt_comm_init (MPI_THREAD_FUNNELED).
 */
#ifndef ADTRAIN_COMM_H
#define ADTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct adt_comm adt_comm;
typedef struct adt_comm_req adt_comm_req;

typedef enum adt_comm_backend {
    ADT_COMM_AUTO = 0, /* mpi when started by a launcher (or ADT_COMM=mpi), else self */
    ADT_COMM_SELF = 1,
    ADT_COMM_MPI = 2,
} adt_comm_backend;

#define ADT_COMM_DEFAULT_TIMEOUT_S 300.0
/* Exit status of a process whose watchdog found an MPI call stuck past its timeout. */
#define ADT_COMM_EXIT_STUCK 86
/* Tags for send/recv: 0 .. ADT_COMM_TAG_MAX (MPI guarantees at least 32767). */
#define ADT_COMM_TAG_MAX 32767

/* ---------------------------------------------------------------------------------------------
 * The world
 */

/* Starts the backend and returns the communicator of all ranks ("world"). One world per process
 * at a time; MPI cannot be started again after adt_comm_finalize. Reads ADT_COMM (self|mpi, for
 * ADT_COMM_AUTO), ADT_COMM_TIMEOUT and ADT_COMM_POLL; a malformed value is an ADT_ERR_ARG naming
 * the variable. */
int adt_comm_init(adt_comm_backend backend, adt_comm **world);
/* Frees the world (and any sub-communicator still open: then it returns ADT_ERR_STATE after
 * cleaning up, naming them) and finalizes MPI if adt_comm_init started it. If an operation that
 * timed out never completed, MPI is left unfinalized (finalizing would hang) and ADT_ERR_COMM
 * says so: the process should exit non-zero. */
int adt_comm_finalize(adt_comm *world);
/* Ends every rank of the world with `code` (MPI_Abort); for the self backend, exit(code). */
void adt_comm_abort(adt_comm *c, int code) __attribute__((noreturn));
/* 1 if the environment shows an MPI launcher (mpiexec, adtrain's agent, Open MPI's mpirun). */
int adt_comm_launched(void);
/* The MPI library's version string, first line (callable before adt_comm_init). */
const char *adt_comm_mpi_library(void);

/* ---------------------------------------------------------------------------------------------
 * Properties
 */
int adt_comm_rank(const adt_comm *c);
int adt_comm_size(const adt_comm *c);
/* "world", "world/split(1)", "world/mesh(2,2)/axis1", ...: used in every error message. */
const char *adt_comm_name(const adt_comm *c);
adt_comm_backend adt_comm_backend_of(const adt_comm *c);
/* The world rank of rank `r` of c, or -1 if r is out of range. */
int adt_comm_world_rank(const adt_comm *c, int r);
double adt_comm_timeout(const adt_comm *c);
/* seconds > 0; applies to waits that start afterwards. */
int adt_comm_set_timeout(adt_comm *c, double seconds);
/* Nonzero once an operation on c timed out (see above). */
int adt_comm_broken(const adt_comm *c);

/* ---------------------------------------------------------------------------------------------
 * Sub-communicators. Each call is collective over c: every rank of c must make it, in the same
 * order as c's collectives, with the same mesh where there is one (checked: a rank that passes
 * another mesh makes every rank fail with ADT_ERR_ARG). A rank outside the new group gets NULL
 * and ADT_OK. Free with adt_comm_free before adt_comm_finalize.
 */

/* Ranks with the same color >= 0 form one communicator, ordered by key then by rank in c;
 * color < 0 joins none. */
int adt_comm_split(adt_comm *c, int color, int key, adt_comm **out);
/* The communicator of a (sub-)mesh whose mesh->ranks are ranks of c: rank i of the result is
 * mesh->ranks[i]. This is a pipeline stage's communicator when the mesh is its sub-mesh. */
int adt_comm_mesh(adt_comm *c, const adt_mesh *mesh, adt_comm **out);
/* The communicator along one mesh axis for this rank: the ranks of the mesh that share all
 * other coordinates with it, ordered by their coordinate on `axis` (which is then their rank). */
int adt_comm_mesh_axis(adt_comm *c, const adt_mesh *mesh, int axis, adt_comm **out);
/* This rank's coordinates in the mesh (coords[ndim]); returns 1 if rank `r` of c is in the mesh,
 * 0 if not, ADT_ERR_ARG if the mesh is malformed. */
int adt_comm_mesh_coords(const adt_mesh *mesh, int r, int *coords);
/* Local; fails with ADT_ERR_STATE while requests on c are in flight. NULL is a no-op. */
int adt_comm_free(adt_comm *c);

/* counts[p] of the block distribution of n elements over p ranks (adt_block_range). */
void adt_comm_block_counts(int64_t n, int p, int64_t *counts);

/* ---------------------------------------------------------------------------------------------
 * Collectives and messages, blocking. Sums are over every rank of c. Reductions take f32 and i32
 * (and f64 / i64 through the typed helpers); data movement takes any dtype.
 *
 *   allreduce       buf[n] <- sum over ranks of buf[n]                              (in place)
 *   reduce_scatter  send[sum(counts)] summed over ranks; rank r keeps block r: recv[counts[r]]
 *   allgather       send[counts[rank]] from each rank; recv[sum(counts)] = rank 0's, rank 1's, ...
 *   alltoall        send = blocks for ranks 0..p-1 (sendcounts[q] elements for rank q);
 *                   recv = blocks from ranks 0..p-1 (recvcounts[q] elements from rank q)
 *   bcast           buf[n] <- root's buf[n]
 *   send / recv     one message of exactly n elements to / from `peer` with `tag`; a message of
 *                   another length is an error naming both lengths
 */
int adt_comm_allreduce(adt_comm *c, void *buf, int64_t n, adt_dtype dt);
int adt_comm_reduce_scatter(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                            adt_dtype dt);
int adt_comm_allgather(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                       adt_dtype dt);
int adt_comm_alltoall(adt_comm *c, const void *send, const int64_t *sendcounts, void *recv,
                      const int64_t *recvcounts, adt_dtype dt);
int adt_comm_bcast(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int root);
int adt_comm_send(adt_comm *c, const void *buf, int64_t n, adt_dtype dt, int peer, int tag);
int adt_comm_recv(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int peer, int tag);
int adt_comm_barrier(adt_comm *c);

/* Sums of wider scalars (losses, counters, timings). */
int adt_comm_allreduce_f64(adt_comm *c, double *buf, int64_t n);
int adt_comm_allreduce_i64(adt_comm *c, int64_t *buf, int64_t n);

/* ---------------------------------------------------------------------------------------------
 * Non-blocking forms: same arguments, plus *req. The buffers (and count arrays) stay in use
 * until the request completes. On an error nothing was started and *req is NULL.
 */
int adt_comm_iallreduce(adt_comm *c, void *buf, int64_t n, adt_dtype dt, adt_comm_req **req);
int adt_comm_ireduce_scatter(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                             adt_dtype dt, adt_comm_req **req);
int adt_comm_iallgather(adt_comm *c, const void *send, void *recv, const int64_t *counts,
                        adt_dtype dt, adt_comm_req **req);
int adt_comm_ialltoall(adt_comm *c, const void *send, const int64_t *sendcounts, void *recv,
                       const int64_t *recvcounts, adt_dtype dt, adt_comm_req **req);
int adt_comm_ibcast(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int root,
                    adt_comm_req **req);
int adt_comm_isend(adt_comm *c, const void *buf, int64_t n, adt_dtype dt, int peer, int tag,
                   adt_comm_req **req);
int adt_comm_irecv(adt_comm *c, void *buf, int64_t n, adt_dtype dt, int peer, int tag,
                   adt_comm_req **req);
int adt_comm_ibarrier(adt_comm *c, adt_comm_req **req);

/* Waits until the request completes or its communicator's timeout passes (counted from the
 * start of this wait); frees it and sets *req = NULL either way. Returns the operation's status.
 * A NULL *req is complete already. */
int adt_comm_wait(adt_comm_req **req);
/* Does not block: *done = 1 when complete (then as adt_comm_wait: freed, *req = NULL, the
 * operation's status returned), else *done = 0 and ADT_OK. */
int adt_comm_test(adt_comm_req **req, int *done);
/* Waits for all n (NULL entries allowed); returns the first error, all entries end NULL. */
int adt_comm_waitall(adt_comm_req **reqs, int n);
/* Lets the backend move data of every request in flight on c (one poll each); never blocks. */
int adt_comm_progress(adt_comm *c);

/* ---------------------------------------------------------------------------------------------
 * Shared memory. A block from adt_comm_shared_alloc can be read by the other processes of this
 * node (a memfd file they map through /proc; nothing to clean up when a process dies). An f32
 * all-reduce on an MPI communicator whose ranks all run on this node (ADT_COMM_SHM_MIN_BYTES), where
 * every rank's buffer lies in such a block, runs through shared memory: each rank sums its chunk
 * of the ranks' buffers in place, in rank order, then copies the others' chunks (about twice
 * MPI's bandwidth for megabytes on this kind of machine; docs/BENCHMARKS.md). So do an f32
 * reduce-scatter (each rank sums its block of the ranks' send buffers, in rank order: the bits
 * the all-reduce leaves there) and an f32 all-gather (each rank copies the ranks' send buffers),
 * where every rank's send and receive buffers lie in such blocks and do not overlap. Where any
 * rank's buffer is private the operation takes MPI's path, on every rank alike. The results are
 * the same bits on every rank; for 2 ranks the same as MPI's. ADT_COMM_SHM=0 (on every rank)
 * turns it off. The executor allocates its arena and state here (src/exec), so the collectives
 * of its steps use it.
 */
/* A polite wait (ranks outnumber the cores, comm.c) yields for as long as its bytes take at
 * ADT_COMM_YIELD_BYTES_PER_S (an all-reduce's twice), at least ADT_COMM_YIELD_MIN_S, then naps:
 * a yielding rank still takes the cores, a napping one hardly (the cost model's pipelines). */
#define ADT_COMM_YIELD_MIN_S 1e-3
#define ADT_COMM_YIELD_BYTES_PER_S 1e9
static inline double adt_comm_yield_window_s(double bytes) {
    double s = bytes / ADT_COMM_YIELD_BYTES_PER_S;
    return s > ADT_COMM_YIELD_MIN_S ? s : ADT_COMM_YIELD_MIN_S;
}
/* The smallest all-reduce (bytes) that takes the shared-memory path: every one. It was 64 KiB,
 * MPI's latency taken to be the lower below it, but back to back on 2 ranks the shared path took
 * 2.0 us at 4 KiB against MPI's 14.4 us, and inside a training step MPI moves a message only
 * while each rank is inside an MPI call: a DLRM's 26 gradient all-reduces of
 * 31 KiB each took 140-150 us there on 4 ranks sharing 2 cores (the step 4.5-6.1 ms, 2.2-3.2 ms
 * through shared memory) and 0.5 ms of polling a step on 2 ranks (docs/BENCHMARKS.md). */
#define ADT_COMM_SHM_MIN_BYTES ((int64_t)4)
/* Zeroed, page-aligned; private memory (adt_alloc_aligned) where the system offers no memfd.
 * Local: not collective. Free with adt_comm_shared_free (which takes either). */
void *adt_comm_shared_alloc(size_t bytes);
void adt_comm_shared_free(void *p);
/* 1 if [p, p + bytes) lies inside one block of adt_comm_shared_alloc. */
int adt_comm_is_shared(const void *p, size_t bytes);
/* All-reduces, reduce-scatters and all-gathers this process ran through shared memory so far. */
int64_t adt_comm_shared_ops(void);

/* ---------------------------------------------------------------------------------------------
 * Typed helpers (f32 is the training data type).
 */
static inline int adt_comm_allreduce_f32(adt_comm *c, float *buf, int64_t n) {
    return adt_comm_allreduce(c, buf, n, ADT_F32);
}
static inline int adt_comm_allreduce_i32(adt_comm *c, int32_t *buf, int64_t n) {
    return adt_comm_allreduce(c, buf, n, ADT_I32);
}
static inline int adt_comm_reduce_scatter_f32(adt_comm *c, const float *send, float *recv,
                                              const int64_t *counts) {
    return adt_comm_reduce_scatter(c, send, recv, counts, ADT_F32);
}
static inline int adt_comm_allgather_f32(adt_comm *c, const float *send, float *recv,
                                         const int64_t *counts) {
    return adt_comm_allgather(c, send, recv, counts, ADT_F32);
}
static inline int adt_comm_alltoall_f32(adt_comm *c, const float *send, const int64_t *sendcounts,
                                        float *recv, const int64_t *recvcounts) {
    return adt_comm_alltoall(c, send, sendcounts, recv, recvcounts, ADT_F32);
}
static inline int adt_comm_bcast_f32(adt_comm *c, float *buf, int64_t n, int root) {
    return adt_comm_bcast(c, buf, n, ADT_F32, root);
}
static inline int adt_comm_send_f32(adt_comm *c, const float *buf, int64_t n, int peer, int tag) {
    return adt_comm_send(c, buf, n, ADT_F32, peer, tag);
}
static inline int adt_comm_recv_f32(adt_comm *c, float *buf, int64_t n, int peer, int tag) {
    return adt_comm_recv(c, buf, n, ADT_F32, peer, tag);
}
static inline int adt_comm_iallreduce_f32(adt_comm *c, float *buf, int64_t n, adt_comm_req **req) {
    return adt_comm_iallreduce(c, buf, n, ADT_F32, req);
}
static inline int adt_comm_ireduce_scatter_f32(adt_comm *c, const float *send, float *recv,
                                               const int64_t *counts, adt_comm_req **req) {
    return adt_comm_ireduce_scatter(c, send, recv, counts, ADT_F32, req);
}
static inline int adt_comm_iallgather_f32(adt_comm *c, const float *send, float *recv,
                                          const int64_t *counts, adt_comm_req **req) {
    return adt_comm_iallgather(c, send, recv, counts, ADT_F32, req);
}

#ifdef __cplusplus
}
#endif
#endif
