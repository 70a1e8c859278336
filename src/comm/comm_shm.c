/*
 * comm_shm.c - all-reduce, reduce-scatter and all-gather through shared memory, for the MPI
 * backend: when every rank of a communicator runs on this node and every rank's buffer lies in
 * memory from adt_comm_shared_alloc, the ranks read each other's buffers directly.
 *
 * Why: MPICH moves a message between two processes of one node with at least one copy (UCX's
 * CMA reads the peer's pages into a receive buffer; the reduction then reads that buffer again),
 * plus its protocol: a 7.4 MB f32 all-reduce on 2 ranks took 1.4-2.0 ms here. Reading the peer's
 * buffer in place, each rank summing its own chunk and then copying the others' sums, took
 * 0.55-0.77 ms for the same bytes: each rank reads n and writes n (p - 1) / p... in total, half
 * the traffic, and no message at all. The executor allocates its arena (where gradients and
 * activations live) and its state (parameters) with adt_comm_shared_alloc, so data-parallel
 * gradient all-reduces take this path, and so do the reduce-scatters and all-gathers of tensor
 * parallelism and ZeRO: inside a step MPI moves a message only while both ranks are in an MPI
 * call, and its rendezvous protocol takes several such turns, so on 3 ranks sharing 2 cores a
 * DLRM's tensor-parallel reduce-scatters waited 0.45-0.95 ms each, and its all-reduces through
 * MPI (ADT_COMM_SHM=0) 2-3 times as long as through shared memory (docs/BENCHMARKS.md).
 *
 * Shared blocks are memfd files: no name in the file system, so nothing leaks when a process is
 * killed; a peer maps one through /proc/<pid>/fd/<fd> the first time an all-reduce names it.
 * Each communicator of at least two ranks gets, when it is made (collectively, under the
 * watchdog like the split itself), one control page per rank in a memfd that every member maps:
 * three sequence counters and a descriptor of the buffer of the current operation.
 *
 * One operation, number s on its communicator (each rank counts the same operations, in MPI's
 * order of collectives):
 *   publish  wait until every peer read the descriptor of operation s - 1 (its done >= s - 1);
 *            write the descriptor of the buffer the peers read (block, offset, n; or "not
 *            shared"): the all-reduce's own, the reduce-scatter's and all-gather's send; arrive = s
 *   decide   once every arrive >= s: if every rank's buffer is shared, go on; if not, every rank
 *            sees the same descriptors and starts MPI's operation instead (done = s), on a copy
 *            of the communicator that carries nothing else
 *   reduce   all-reduce: my chunk (the block distribution of n over p), the sum over ranks
 *            0..p-1, in that order, written into my own buffer; reduced = s.
 *            reduce-scatter: my block of the counts, the same sum of the ranks' sends, written
 *            into my receive buffer; done = s. all-gather: every rank's send copied into its
 *            place in my receive buffer; done = s
 *   gather   all-reduce: every peer's chunk, once its reduced >= s, copied from its buffer into
 *            mine; done = s
 *   finish   when every done >= s: no peer reads my buffer any more, it is the caller's again
 * Every element's sum is computed once, by one rank, in rank order, so all ranks hold the same
 * bits (for 2 ranks the same as MPI's a + b), and a reduce-scatter's block the same bits as the
 * all-reduce's. A rank writes only its own buffers and page; it reads a peer's buffer only in
 * ranges the peer does not write in that phase (a receive buffer that overlaps the buffer the
 * peers read makes the operation MPI's).
 *
 * Operations on one communicator run one at a time in start order (a later one waits for the
 * earlier to finish); any test of any of them advances the oldest. A peer that never arrives
 * leaves the waits polling, so the front end's deadline applies as for MPI's own operations.
 */
#include "comm_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every all-reduce of shared buffers takes this path (include/adtrain/comm.h says why). */
#define SHM_MIN_BYTES ADT_COMM_SHM_MIN_BYTES
#define SHM_MAX_RANKS 64 /* the gather's bit mask */
/* Blocks remembered per peer, the least recently used dropped first: a peer's executor that is
 * made again (a new arena) leaves its old block mapped here, and alive, until it is dropped.
 * An executor shares its arena, its state and a staging buffer per boxing step that packs parts
 * (src/exec/mesh_comm.c): a tensor-parallel step uses a handful, each mapped once. */
#define SHM_PEER_MAPS 32

/* ---- shared blocks (process-wide) ------------------------------------------------------------ */

typedef struct shm_block {
    char *base;
    size_t bytes;
    int fd;
    int64_t id;
    struct shm_block *next;
} shm_block;

static shm_block *g_blocks;
static int64_t g_next_block = 1;
static pthread_mutex_t g_blocks_lock = PTHREAD_MUTEX_INITIALIZER;

void *adt_comm_shared_alloc(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), sz = (bytes + page - 1) / page * page;
    if (!sz) sz = page;
    int fd = memfd_create("adtrain-shared", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)sz) == 0) {
        void *p = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) { /* a memfd's pages start zeroed */
            shm_block *b = adt_calloc(1, sizeof *b);
            *b = (shm_block){.base = p, .bytes = sz, .fd = fd};
            pthread_mutex_lock(&g_blocks_lock);
            b->id = g_next_block++;
            b->next = g_blocks;
            g_blocks = b;
            pthread_mutex_unlock(&g_blocks_lock);
            return p;
        }
    }
    if (fd >= 0) close(fd);
    return adt_alloc_aligned(bytes ? bytes : 1); /* private memory: all-reduces take MPI's path */
}

void adt_comm_shared_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&g_blocks_lock);
    shm_block **pp = &g_blocks;
    while (*pp && (*pp)->base != p) pp = &(*pp)->next;
    shm_block *b = *pp;
    if (b) *pp = b->next;
    pthread_mutex_unlock(&g_blocks_lock);
    if (!b) {
        adt_free_aligned(p);
        return;
    }
    munmap(b->base, b->bytes);
    close(b->fd);
    free(b);
}

/* The block [p, p + bytes) lies in, or NULL; the caller holds g_blocks_lock. */
static const shm_block *block_of(const void *p, size_t bytes) {
    for (const shm_block *b = g_blocks; b; b = b->next)
        if ((const char *)p >= b->base && (size_t)((const char *)p - b->base) + bytes <= b->bytes) return b;
    return NULL;
}

int adt_comm_is_shared(const void *p, size_t bytes) {
    pthread_mutex_lock(&g_blocks_lock);
    int yes = block_of(p, bytes) != NULL;
    pthread_mutex_unlock(&g_blocks_lock);
    return yes;
}

/* ---- per communicator ------------------------------------------------------------------------ */

typedef struct shm_desc {
    int64_t block, off, n; /* block id (0: the buffer is not shared), byte offset, elements */
    int32_t pid, fd;
} shm_desc;

typedef struct shm_ctl { /* one page per rank, in a memfd every member maps */
    _Alignas(64) atomic_llong arrive;
    _Alignas(64) atomic_llong reduced;
    _Alignas(64) atomic_llong done;
    _Alignas(64) shm_desc desc; /* written before arrive is set, read after it is seen */
} shm_ctl;

typedef struct peer_map {
    int64_t block;
    char *base;
    size_t bytes;
    long long used; /* the last operation that read it */
} peer_map;

typedef struct shm_op shm_op;

struct comm_shm {
    comm_shm *next_ctx;    /* every communicator's state, for progress */
    /* MPI's path for an operation whose buffers are not all shared: a copy of the communicator,
     * since the decision comes after other collectives may have started on the original, and
     * MPI wants collectives in the same order on every rank; here they are (this sequence). */
    MPI_Comm fallback;
    int p, me;
    shm_ctl **ctl;         /* [p] every rank's page, mine included */
    peer_map (*maps)[SHM_PEER_MAPS]; /* [p] blocks of each peer, mapped on first sight */
    long long seq;         /* operations started */
    shm_op *head, *tail;   /* operations not finished, oldest first */
};

enum { ST_PUBLISH, ST_DECIDE, ST_REDUCE, ST_GATHER, ST_FINISH, ST_MPI, ST_DONE };

struct shm_op {
    comm_shm *s;
    long long seq;
    comm_kind kind;        /* OP_ALLREDUCE, OP_REDUCE_SCATTER or OP_ALLGATHER */
    float *buf;            /* the result: the all-reduce's buffer (in place), else the receive buffer */
    const float *send;     /* reduce-scatter, all-gather: what the peers read */
    int64_t n;             /* all-reduce: elements; the others: the sum of the counts */
    const int *cnt, *dsp;  /* reduce-scatter, all-gather: each rank's count and offset (the request's) */
    int state, status;
    char why[COMM_WHY];
    uint64_t copied;       /* peers whose chunk is in my buffer */
    const float **src;     /* [p] every rank's buffer as mapped here */
    MPI_Request mr;        /* the fallback */
    shm_op *next;
};

static comm_shm *g_ctxs; /* the MPI backend runs on one thread (MPI_THREAD_FUNNELED) */
static int64_t g_shm_ops; /* operations that went through shared memory */

int64_t adt_comm_shared_ops(void) { return g_shm_ops; }

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void *map_peer_fd(int pid, int fd, size_t *bytes, int prot) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int f = open(path, prot & PROT_WRITE ? O_RDWR : O_RDONLY);
    if (f < 0) return NULL;
    struct stat st;
    void *p = NULL;
    if (fstat(f, &st) == 0 && st.st_size > 0 && (!*bytes || (size_t)st.st_size >= *bytes)) {
        if (!*bytes) *bytes = (size_t)st.st_size;
        p = mmap(NULL, *bytes, prot, MAP_SHARED, f, 0);
        if (p == MAP_FAILED) p = NULL;
    }
    close(f);
    return p;
}

static void shm_unmap_all(comm_shm *s) {
    for (int q = 0; q < s->p; q++) {
        if (s->ctl[q]) munmap(s->ctl[q], page_size());
        for (int k = 0; k < SHM_PEER_MAPS; k++)
            if (s->maps[q][k].base) munmap(s->maps[q][k].base, s->maps[q][k].bytes);
    }
}

void comm_shm_free(comm_shm *s) {
    if (!s) return;
    if (s->head) return; /* an operation that timed out may still be polled: keep what it reads */
    for (comm_shm **pp = &g_ctxs; *pp; pp = &(*pp)->next_ctx)
        if (*pp == s) {
            *pp = s->next_ctx;
            break;
        }
    shm_unmap_all(s);
    if (s->fallback != MPI_COMM_NULL) MPI_Comm_free(&s->fallback);
    free(s->ctl);
    free(s->maps);
    free(s);
}

void comm_shm_release_all(int mpi_usable) {
    while (g_ctxs) {
        comm_shm *s = g_ctxs;
        g_ctxs = s->next_ctx;
        if (!mpi_usable) s->fallback = MPI_COMM_NULL; /* an operation never completed: leave MPI be */
        s->head = s->tail = NULL; /* the requests behind them are gone */
        s->next_ctx = NULL;
        comm_shm_free(s);
    }
}

static int env_shm_wanted(void) {
    const char *e = getenv("ADT_COMM_SHM");
    return !(e && (!strcmp(e, "0") || !strcasecmp(e, "off") || !strcasecmp(e, "no")));
}

void comm_shm_setup(MPI_Comm comm, comm_shm **out) {
    *out = NULL;
    int p = 1, me = 0;
    MPI_Comm_size(comm, &p);
    MPI_Comm_rank(comm, &me);
    if (p < 2) return;
    /* The same three collectives on every rank, whatever each finds: the answer is their MIN. */
    MPI_Comm node;
    int local = 0;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    comm_shm *s = adt_calloc(1, sizeof *s);
    s->fallback = MPI_COMM_NULL;
    s->p = p;
    s->me = me;
    s->ctl = adt_calloc((size_t)p, sizeof *s->ctl);
    s->maps = adt_calloc((size_t)p, sizeof *s->maps);
    int fd = memfd_create("adtrain-comm", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)page_size()) == 0) {
        void *c = mmap(NULL, page_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        s->ctl[me] = c == MAP_FAILED ? NULL : c;
    }
    int32_t mine[2] = {(int32_t)getpid(), fd}, *all = adt_malloc((size_t)p * sizeof mine);
    int e = MPI_Allgather(mine, 2, MPI_INT32_T, all, 2, MPI_INT32_T, comm);
    int ok = e == MPI_SUCCESS && env_shm_wanted() && local == p && p <= SHM_MAX_RANKS && s->ctl[me];
    for (int q = 0; q < p && ok; q++) {
        if (q == me) continue;
        size_t bytes = page_size();
        s->ctl[q] = map_peer_fd(all[2 * q], all[2 * q + 1], &bytes, PROT_READ | PROT_WRITE);
        ok = s->ctl[q] != NULL;
    }
    int all_ok = 0;
    e = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (e == MPI_SUCCESS && all_ok) e = MPI_Comm_dup(comm, &s->fallback);
    free(all);
    if (fd >= 0) close(fd); /* every peer mapped it before the MIN */
    if (e != MPI_SUCCESS || !all_ok) {
        comm_shm_free(s); /* MPI's path for every operation: not an error */
        return;
    }
    s->next_ctx = g_ctxs;
    g_ctxs = s;
    *out = s;
}

int comm_shm_eligible(const comm_shm *s, const comm_op *op) {
    return s && (op->kind == OP_ALLREDUCE || op->kind == OP_REDUCE_SCATTER || op->kind == OP_ALLGATHER) &&
           op->elem == CE_F32 && op->n * (int64_t)sizeof(float) >= SHM_MIN_BYTES;
}

static const char *kind_name(comm_kind k) {
    return k == OP_ALLREDUCE ? "all-reduce" : k == OP_REDUCE_SCATTER ? "reduce-scatter" : "all-gather";
}

/* The buffer the peers read: the all-reduce's own, the others' send; rank q's has
 * published_n(o, q) elements. */
static const float *published(const shm_op *o) { return o->kind == OP_ALLREDUCE ? o->buf : o->send; }
static int64_t published_n(const shm_op *o, int q) { return o->kind == OP_ALLGATHER ? o->cnt[q] : o->n; }

/* The elements this rank writes of o's result (all of buf but a reduce-scatter's block). */
static int64_t result_n(const shm_op *o) { return o->kind == OP_REDUCE_SCATTER ? o->cnt[o->s->me] : o->n; }

static int overlap(const void *a, size_t an, const void *b, size_t bn) {
    return an && bn && (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

/* ---- one operation ---------------------------------------------------------------------------- */

/* Rank r's chunk [lo, hi): the block distribution of the n elements. */
static void my_chunk(const shm_op *o, int r, int64_t *lo, int64_t *hi) {
    int64_t len;
    adt_block_range(o->n, o->s->p, r, lo, &len);
    *hi = *lo + len;
}

/* Peer q's buffer of operation seq, mapped here (its block on first sight). */
static const float *peer_buffer(comm_shm *s, int q, const shm_desc *d, long long seq) {
    peer_map *m = s->maps[q];
    int k = -1;
    for (int j = 0; j < SHM_PEER_MAPS && k < 0; j++)
        if (m[j].base && m[j].block == d->block) k = j;
    if (k < 0) {
        k = 0; /* an empty slot, else the least recently used */
        for (int j = 1; j < SHM_PEER_MAPS; j++)
            if (m[k].base && (!m[j].base || m[j].used < m[k].used)) k = j;
        if (m[k].base) munmap(m[k].base, m[k].bytes);
        size_t bytes = 0;
        m[k].base = map_peer_fd(d->pid, d->fd, &bytes, PROT_READ);
        m[k].bytes = m[k].base ? bytes : 0;
        m[k].block = d->block;
    }
    m[k].used = seq;
    if (!m[k].base || (size_t)d->off + (size_t)d->n * sizeof(float) > m[k].bytes) return NULL;
    return (const float *)(m[k].base + d->off);
}

/* out[0, n) = src[0] + src[1] + ... + src[p-1], left to right; out may be one of the sources. */
static void sum_ranks(float *out, const float *const *src, int p, int64_t n) {
    enum { B = 2048 };
    float tmp[B];
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        int64_t m = n - i0 < B ? n - i0 : B;
        const float *a = src[0] + i0, *b = src[1] + i0;
        for (int64_t i = 0; i < m; i++) tmp[i] = a[i] + b[i];
        for (int q = 2; q < p; q++) {
            const float *c = src[q] + i0;
            for (int64_t i = 0; i < m; i++) tmp[i] += c[i];
        }
        memcpy(out + i0, tmp, (size_t)m * sizeof(float));
    }
}

static int all_at_least(const comm_shm *s, size_t field, long long v) {
    for (int q = 0; q < s->p; q++) {
        atomic_llong *a = (atomic_llong *)((char *)s->ctl[q] + field);
        if (atomic_load_explicit(a, memory_order_acquire) < v) return 0;
    }
    return 1;
}

static atomic_ulong g_moves;

unsigned long comm_shm_moves(void) { return atomic_load_explicit(&g_moves, memory_order_relaxed); }

static void set_flag(comm_shm *s, size_t field, long long v) {
    atomic_store_explicit((atomic_llong *)((char *)s->ctl[s->me] + field), v, memory_order_release);
    atomic_fetch_add_explicit(&g_moves, 1, memory_order_relaxed);
}

#define ARRIVE offsetof(shm_ctl, arrive)
#define REDUCED offsetof(shm_ctl, reduced)
#define DONE offsetof(shm_ctl, done)

static int op_fail(shm_op *o, int status) {
    o->status = status;
    o->state = ST_DONE;
    set_flag(o->s, DONE, o->seq); /* nobody waits on this rank's buffer */
    return 1;
}

/* Advances o as far as it goes without waiting; 1 once it finished. */
static int op_advance(shm_op *o) {
    comm_shm *s = o->s;
    int p = s->p, me = s->me;
    if (o->state == ST_PUBLISH) {
        if (!all_at_least(s, DONE, o->seq - 1)) return 0;
        int64_t pn = published_n(o, me);
        const float *pub = published(o);
        shm_desc d = {.n = pn, .pid = (int32_t)getpid()};
        pthread_mutex_lock(&g_blocks_lock);
        const shm_block *b = block_of(pub, (size_t)pn * sizeof(float));
        /* a receive buffer the peers' reads could see half written: MPI's path */
        if (o->kind != OP_ALLREDUCE && overlap(pub, (size_t)pn * sizeof(float), o->buf, (size_t)result_n(o) * sizeof(float)))
            b = NULL;
        if (b) d.block = b->id, d.off = (const char *)pub - b->base, d.fd = b->fd;
        pthread_mutex_unlock(&g_blocks_lock);
        s->ctl[me]->desc = d;
        set_flag(s, ARRIVE, o->seq);
        o->state = ST_DECIDE;
    }
    if (o->state == ST_DECIDE) {
        if (!all_at_least(s, ARRIVE, o->seq)) return 0;
        int shared = 1;
        for (int q = 0; q < p; q++) {
            const shm_desc *d = &s->ctl[q]->desc;
            if (d->n != published_n(o, q)) {
                snprintf(o->why, sizeof o->why, "rank %d publishes %lld elements, this rank expected %lld", q,
                         (long long)d->n, (long long)published_n(o, q));
                return op_fail(o, ADT_ERR_COMM);
            }
            shared &= d->block != 0;
        }
        if (!shared) {
            set_flag(s, DONE, o->seq); /* the descriptors are read; MPI does the rest */
            int e;
            const char *call;
            if (o->kind == OP_ALLREDUCE) {
                call = "MPI_Iallreduce";
                e = MPI_Iallreduce(MPI_IN_PLACE, o->buf, (int)o->n, MPI_FLOAT, MPI_SUM, s->fallback, &o->mr);
            } else if (o->kind == OP_REDUCE_SCATTER) {
                call = "MPI_Ireduce_scatter";
                e = MPI_Ireduce_scatter(o->send, o->buf, o->cnt, MPI_FLOAT, MPI_SUM, s->fallback, &o->mr);
            } else {
                call = "MPI_Iallgatherv";
                e = MPI_Iallgatherv(o->send, o->cnt[me], MPI_FLOAT, o->buf, o->cnt, o->dsp, MPI_FLOAT, s->fallback, &o->mr);
            }
            if (e != MPI_SUCCESS) {
                snprintf(o->why, sizeof o->why, "%s failed (MPI error %d)", call, e);
                return op_fail(o, ADT_ERR_COMM);
            }
            o->state = ST_MPI;
        } else {
            for (int q = 0; q < p; q++) {
                const shm_desc *d = &s->ctl[q]->desc;
                o->src[q] = q == me ? published(o) : peer_buffer(s, q, d, o->seq);
                if (!o->src[q]) {
                    snprintf(o->why, sizeof o->why,
                             "cannot map rank %d's shared buffer (/proc/%d/fd/%d): %s; set ADT_COMM_SHM=0 on every rank", q,
                             (int)d->pid, (int)d->fd, strerror(errno));
                    return op_fail(o, ADT_ERR_COMM);
                }
            }
            o->state = ST_REDUCE;
            g_shm_ops++;
        }
    }
    if (o->state == ST_MPI) {
        int flag = 0;
        int e = MPI_Test(&o->mr, &flag, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS) {
            snprintf(o->why, sizeof o->why, "MPI_Test failed (MPI error %d)", e);
            o->status = ADT_ERR_COMM;
            o->state = ST_DONE;
            return 1;
        }
        if (!flag) return 0;
        o->state = ST_DONE;
        return 1;
    }
    if (o->state == ST_REDUCE && o->kind != OP_ALLREDUCE) {
        if (o->kind == OP_REDUCE_SCATTER) {
            const float *src[SHM_MAX_RANKS];
            for (int q = 0; q < p; q++) src[q] = o->src[q] + o->dsp[me];
            sum_ranks(o->buf, src, p, o->cnt[me]); /* p >= 2: comm_shm_setup */
        } else {
            for (int q = 0; q < p; q++) memcpy(o->buf + o->dsp[q], o->src[q], (size_t)o->cnt[q] * sizeof(float));
        }
        set_flag(s, DONE, o->seq);
        o->state = ST_FINISH;
    }
    if (o->state == ST_REDUCE) {
        int64_t lo, hi;
        my_chunk(o, me, &lo, &hi);
        const float *src[SHM_MAX_RANKS];
        for (int q = 0; q < p; q++) src[q] = o->src[q] + lo;
        sum_ranks(o->buf + lo, src, p, hi - lo);
        set_flag(s, REDUCED, o->seq);
        o->copied = 0;
        o->state = ST_GATHER;
    }
    if (o->state == ST_GATHER) {
        int left = 0;
        for (int q = 0; q < p; q++) {
            if (q == me || (o->copied >> q & 1)) continue;
            if (atomic_load_explicit(&s->ctl[q]->reduced, memory_order_acquire) < o->seq) {
                left++;
                continue;
            }
            int64_t lo, hi;
            my_chunk(o, q, &lo, &hi);
            memcpy(o->buf + lo, o->src[q] + lo, (size_t)(hi - lo) * sizeof(float));
            o->copied |= (uint64_t)1 << q;
        }
        if (left) return 0;
        set_flag(s, DONE, o->seq);
        o->state = ST_FINISH;
    }
    if (o->state == ST_FINISH) {
        if (!all_at_least(s, DONE, o->seq)) return 0;
        o->state = ST_DONE;
    }
    return o->state == ST_DONE;
}

/* Advances every communicator's operations, each one's oldest first, as far as they go: as in
 * MPI, a test of one operation moves all, so that ranks waiting for different operations in
 * different orders cannot stall each other. */
void comm_shm_progress(void) {
    for (comm_shm *s = g_ctxs; s; s = s->next_ctx) {
        while (s->head && op_advance(s->head)) s->head = s->head->next;
        if (!s->head) s->tail = NULL;
    }
}

size_t comm_shm_op_size(const comm_shm *s) { return sizeof(shm_op) + (size_t)s->p * sizeof(float *); }

void comm_shm_start(comm_shm *s, shm_op *o, const comm_op *op, const int *cnt, const int *dsp) {
    memset(o, 0, sizeof *o);
    o->s = s;
    o->seq = ++s->seq;
    o->kind = op->kind;
    o->buf = op->recv;
    o->send = op->send;
    o->n = op->n;
    o->cnt = cnt, o->dsp = dsp;
    o->mr = MPI_REQUEST_NULL;
    o->src = (const float **)(o + 1);
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    comm_shm_progress();
}

int comm_shm_test(shm_op *o, int *done, char *why) {
    if (o->state != ST_DONE) comm_shm_progress();
    *done = o->state == ST_DONE;
    if (*done && o->status) snprintf(why, COMM_WHY, "shared-memory %s: %.400s", kind_name(o->kind), o->why);
    return *done ? o->status : ADT_OK;
}
