/*
 * test_comm.c - communicators, self backend and MPI, against closed forms.
 *
 * Run without arguments (as tests/run.sh does), the program
 *   1. runs every case on the self backend in this process, plus the checks of the world itself
 *      (environment variables, init / finalize rules);
 *   2. runs the same cases in MPI worlds it launches itself: an MPI singleton (this program
 *      started without a launcher) and `mpiexec -n N` for N = 2, 3, 4 (4 ranks on 2 cores is
 *      fine for MPICH); each rank prints one line per case, and a case passes when every rank
 *      of the world passed it and the world exited cleanly;
 *   3. runs four worlds that must fail in a known way: a rank that never joins a split (the
 *      others get a timeout error, and finalize refuses to finalize MPI with the operation
 *      unfinished), a rank late for MPI_Finalize (the watchdog ends the process with
 *      ADT_COMM_EXIT_STUCK), a rank that crashes (the judge of a world must count it failed,
 *      with the crash in the stderr it prints) and a rank that calls adt_comm_abort (the world
 *      ends with its code).
 * A world that crashes or hangs counts as failed, with its stderr tail printed; each has a hard
 * time limit. Every value is f(rank, index) with a closed-form sum, exactly representable, so
 * comparisons are exact.
 *
 * The mpiexec is $ADT_MPIEXEC, else mpiexec.mpich (Debian's name, when the library is MPICH),
 * else mpiexec on PATH. Under AddressSanitizer the children run with LeakSanitizer on, with
 * tests/lsan-mpi.supp (UCX only) and HWLOC_COMPONENTS=-pci (tests/mpi_world.h).
 */
#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/tensor.h"

#include "check.h"
#include "mpi_world.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define CHECK_ERR(call, code, needle)                                                          \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        CHECK(rc_ == (code) && strstr(adt_error_message(), (needle)),                           \
              "returned %d (%s), expected %d with \"%s\"", rc_, adt_error_message(), (code),    \
              (needle));                                                                       \
    } while (0)

#define CHECK_OK(call)                                                                         \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        CHECK(rc_ == ADT_OK, "returned %d: %s", rc_, adt_error_message());                     \
    } while (0)

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

#define nap mpi_nap

/* ---- values with exact sums ----------------------------------------------------------------
 * f32: multiples of 1/4 below 8, so sums over 4 ranks are exact; i64 beyond 32 bits. */
static float f_val(int r, int64_t i) { return (float)((r + 1) * 0.5 + (double)(i % 17) * 0.25); }
static double f_sum(int p, int64_t i) {
    double s = 0;
    for (int q = 0; q < p; q++) s += (q + 1) * 0.5 + (double)(i % 17) * 0.25;
    return s;
}
static int32_t i32_val(int r, int64_t i) { return (r + 1) * 1000 + (int32_t)(i % 101) - 50; }
static int64_t i64_val(int r, int64_t i) { return ((int64_t)(r + 1) << 33) + i * 3 - 7; }
static double f64_val(int r, int64_t i) { return (r + 1) * 1e10 + (double)i * 0.5; }
/* a value that says who sent it and where it belongs */
static float tag_val(int from, int to, int64_t j) { return (float)(from * 1000 + to * 100) + (float)j * 0.5f; }

/* A copy of c (same ranks, same order) with its own timeout. */
static adt_comm *dup_comm(adt_comm *c, double timeout) {
    adt_comm *d = NULL;
    CHECK_OK(adt_comm_split(c, 0, adt_comm_rank(c), &d));
    if (d) CHECK_OK(adt_comm_set_timeout(d, timeout));
    return d;
}

/* ---- cases: each runs on every rank of a world of any size --------------------------------- */

static void case_identity(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    CHECK(p >= 1 && r >= 0 && r < p, "rank %d of %d", r, p);
    CHECK(!strcmp(adt_comm_name(w), "world"), "name %s", adt_comm_name(w));
    for (int q = 0; q < p; q++) CHECK(adt_comm_world_rank(w, q) == q, "world rank of %d", q);
    CHECK(adt_comm_world_rank(w, p) == -1 && adt_comm_world_rank(w, -1) == -1, "out of range");
    CHECK(!adt_comm_broken(w), "fresh world broken");
    /* every rank has a distinct id: the sum of 2^r over ranks is 2^p - 1 */
    int64_t bit = (int64_t)1 << r;
    CHECK_OK(adt_comm_allreduce_i64(w, &bit, 1));
    CHECK(bit == ((int64_t)1 << p) - 1, "rank bits %lld", (long long)bit);
}

static void case_allreduce(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    const int64_t sizes[] = {0, 1, 5, 1000, 65537};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *a = malloc((size_t)(n ? n : 1) * sizeof *a);
        int32_t *b = malloc((size_t)(n ? n : 1) * sizeof *b);
        int64_t *c = malloc((size_t)(n ? n : 1) * sizeof *c);
        double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
        for (int64_t i = 0; i < n; i++) a[i] = f_val(r, i), b[i] = i32_val(r, i), c[i] = i64_val(r, i), d[i] = f64_val(r, i);
        CHECK_OK(adt_comm_allreduce_f32(w, a, n));
        CHECK_OK(adt_comm_allreduce_i32(w, b, n));
        CHECK_OK(adt_comm_allreduce_i64(w, c, n));
        CHECK_OK(adt_comm_allreduce_f64(w, d, n));
        int64_t bad_a = -1, bad_b = -1, bad_c = -1, bad_d = -1;
        for (int64_t i = 0; i < n; i++) {
            int64_t eb = 0, ec = 0;
            double ed = 0;
            for (int q = 0; q < p; q++) eb += i32_val(q, i), ec += i64_val(q, i), ed += f64_val(q, i);
            if (bad_a < 0 && (double)a[i] != f_sum(p, i)) bad_a = i;
            if (bad_b < 0 && b[i] != eb) bad_b = i;
            if (bad_c < 0 && c[i] != ec) bad_c = i;
            if (bad_d < 0 && d[i] != ed) bad_d = i;
        }
        CHECK(bad_a < 0 && bad_b < 0 && bad_c < 0 && bad_d < 0,
              "n=%lld: first wrong f32 %lld, i32 %lld, i64 %lld, f64 %lld", (long long)n,
              (long long)bad_a, (long long)bad_b, (long long)bad_c, (long long)bad_d);
        free(a), free(b), free(c), free(d);
    }
    /* the generic entry with a dtype */
    float g[3] = {f_val(r, 0), f_val(r, 1), f_val(r, 2)};
    CHECK_OK(adt_comm_allreduce(w, g, 3, ADT_F32));
    for (int i = 0; i < 3; i++) CHECK(g[i] == f_sum(p, i), "generic f32 [%d] = %g", i, g[i]);
}

/* Shared memory (comm.h): values whose sums round (so the order of the sum shows), the
 * reference summed here in rank order, as the shared-memory path must; MPI's path for 3-4 ranks
 * may sum in another order, so it is held to rounding. */
static float rnd_val(int r, int64_t i, int salt) {
    uint64_t h = ((uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xBF58476D1CE4E5B9ull) ^ (uint64_t)salt;
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    return (float)((int64_t)(h % 20001) - 10000) * 1.37e-3f;
}

/* Checks buf against the rank-order sum: exactly, or within rounding. Returns the first bad index. */
static int64_t check_rank_sum(const float *buf, int64_t n, int p, int salt, int exact) {
    for (int64_t i = 0; i < n; i++) {
        float e = rnd_val(0, i, salt);
        for (int q = 1; q < p; q++) e += rnd_val(q, i, salt);
        if (exact ? buf[i] != e : fabsf(buf[i] - e) > 1e-5f * (1.0f + fabsf(e))) return i;
    }
    return -1;
}

static void case_shared_allreduce(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    /* shared memory wherever MPI runs 2 or more ranks of this node (every world of this test) */
    int shm = adt_comm_backend_of(w) == ADT_COMM_MPI && p >= 2;
    /* sizes: fewer elements than ranks (empty chunks), 64 KiB and one float less, uneven
     * blocks, 4 MiB */
    const int64_t sizes[] = {1, 3, 16383, 16384, 100003, (int64_t)1 << 20};
    int salt = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t n = sizes[k];
        float *a = adt_comm_shared_alloc((size_t)n * sizeof *a);
        CHECK(a && adt_comm_is_shared(a, (size_t)n * sizeof *a), "n=%lld: not a shared block", (long long)n);
        if (!a) return;
        salt++;
        for (int64_t i = 0; i < n; i++) a[i] = rnd_val(r, i, salt);
        int64_t ops0 = adt_comm_shared_ops();
        CHECK_OK(adt_comm_allreduce_f32(w, a, n));
        int via_shm = shm && n * 4 >= ADT_COMM_SHM_MIN_BYTES;
        CHECK(adt_comm_shared_ops() - ops0 == via_shm, "n=%lld: %lld shared-memory all-reduces, expected %d",
              (long long)n, (long long)(adt_comm_shared_ops() - ops0), via_shm);
        int64_t bad = check_rank_sum(a, n, p, salt, via_shm || p <= 2);
        CHECK(bad < 0, "n=%lld: element %lld = %.9g is not the rank-order sum", (long long)n, (long long)bad,
              bad >= 0 ? a[bad] : 0.0);
        adt_comm_shared_free(a);
    }

    /* one rank's buffer private: every rank takes MPI's path, and the sums are still right */
    int64_t n = 50000;
    float *a = r == p - 1 ? adt_alloc_aligned((size_t)n * sizeof *a) : adt_comm_shared_alloc((size_t)n * sizeof *a);
    salt++;
    for (int64_t i = 0; i < n; i++) a[i] = rnd_val(r, i, salt);
    int64_t ops0 = adt_comm_shared_ops();
    CHECK_OK(adt_comm_allreduce_f32(w, a, n));
    CHECK(adt_comm_shared_ops() == ops0, "a private buffer on rank %d, yet shared memory was used", p - 1);
    int64_t bad = check_rank_sum(a, n, p, salt, p <= 2);
    CHECK(bad < 0, "mixed buffers: element %lld wrong", (long long)bad);
    if (r == p - 1) adt_free_aligned(a);
    else adt_comm_shared_free(a);

    /* three in flight at once, waited for in reverse order, over a block made and freed ten times
     * (more blocks than a peer remembers: old mappings are dropped) */
    for (int round = 0; round < 10; round++) {
        float *b = adt_comm_shared_alloc((size_t)3 * n * sizeof *b);
        adt_comm_req *req[3];
        salt++;
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < n; i++) b[j * n + i] = rnd_val(r, i, salt * 3 + j);
        ops0 = adt_comm_shared_ops();
        for (int j = 0; j < 3; j++) CHECK_OK(adt_comm_iallreduce(w, b + j * n, n, ADT_F32, &req[j]));
        for (int j = 2; j >= 0; j--) CHECK_OK(adt_comm_wait(&req[j]));
        CHECK(adt_comm_shared_ops() - ops0 == (shm ? 3 : 0), "round %d: %lld shared-memory all-reduces", round,
              (long long)(adt_comm_shared_ops() - ops0));
        for (int j = 0; j < 3; j++) {
            bad = check_rank_sum(b + j * n, n, p, salt * 3 + j, 1);
            CHECK(bad < 0, "round %d, buffer %d: element %lld wrong", round, j, (long long)bad);
        }
        adt_comm_shared_free(b);
    }

    /* a sub-communicator (odd and even ranks): its own shared-memory state */
    adt_comm *half = NULL;
    CHECK_OK(adt_comm_split(w, r % 2, r, &half));
    if (half) {
        int hp = adt_comm_size(half);
        float *c = adt_comm_shared_alloc((size_t)n * sizeof *c);
        salt++;
        for (int64_t i = 0; i < n; i++) c[i] = rnd_val(adt_comm_rank(half), i, salt);
        CHECK_OK(adt_comm_allreduce_f32(half, c, n));
        bad = check_rank_sum(c, n, hp, salt, 1);
        CHECK(bad < 0, "sub-communicator of %d: element %lld wrong", hp, (long long)bad);
        adt_comm_shared_free(c);
        CHECK_OK(adt_comm_free(half));
    }
    adt_comm_shared_free(NULL); /* a no-op */
}

/* counts: 0 -> block distribution of 10p+3, 1 -> irregular with a zero block */
static void make_counts(int p, int kind, int64_t *counts) {
    if (kind == 0) {
        adt_comm_block_counts(10 * p + 3, p, counts);
        return;
    }
    for (int q = 0; q < p; q++) counts[q] = (q == 1) ? 0 : 2 * q + 3;
}

/* Reduce-scatter and all-gather through shared memory (comm.h): a reduce-scatter's block holds
 * the rank-order sum, the same bits the shared-memory all-reduce leaves there; an all-gather
 * copies every rank's block into its place; where one rank's buffer is private every rank takes
 * MPI's path (held to rounding on 3-4 ranks). Counts: blocks of n (fewer elements than ranks,
 * uneven, 4 MiB), and irregular ones with an empty block. */
static void case_shared_rs_ag(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int shm = adt_comm_backend_of(w) == ADT_COMM_MPI && p >= 2;
    const int64_t sizes[] = {1, 3, 100003, (int64_t)1 << 20, -1};
    int salt = 100;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int64_t counts[64], total = 0, start = 0;
        if (sizes[k] > 0) adt_comm_block_counts(sizes[k], p, counts);
        else make_counts(p, 1, counts);
        for (int q = 0; q < p; q++) total += counts[q];
        for (int q = 0; q < r; q++) start += counts[q];
        salt++;
        /* reduce-scatter: the block against the rank-order sum and the all-reduce's bits */
        float *send = adt_comm_shared_alloc((size_t)total * sizeof *send);
        float *recv = adt_comm_shared_alloc((size_t)(counts[r] + 1) * sizeof *recv);
        float *all = adt_comm_shared_alloc((size_t)total * sizeof *all);
        for (int64_t i = 0; i < total; i++) send[i] = all[i] = rnd_val(r, i, salt);
        recv[counts[r]] = -7; /* guard: nothing past the block is written */
        int64_t ops0 = adt_comm_shared_ops();
        CHECK_OK(adt_comm_reduce_scatter_f32(w, send, recv, counts));
        CHECK(adt_comm_shared_ops() - ops0 == shm, "total %lld: %lld shared-memory reduce-scatters, expected %d",
              (long long)total, (long long)(adt_comm_shared_ops() - ops0), shm);
        CHECK_OK(adt_comm_allreduce_f32(w, all, total));
        int64_t bad = -1, diff = -1;
        for (int64_t j = 0; j < counts[r]; j++) {
            float e = rnd_val(0, start + j, salt);
            for (int q = 1; q < p; q++) e += rnd_val(q, start + j, salt);
            if (bad < 0 && recv[j] != e) bad = j;
            if (diff < 0 && memcmp(&recv[j], &all[start + j], sizeof(float))) diff = j;
        }
        CHECK(bad < 0, "total %lld: reduce-scatter element %lld = %.9g is not the rank-order sum", (long long)total,
              (long long)bad, bad >= 0 ? recv[bad] : 0.0);
        CHECK(diff < 0, "total %lld: reduce-scatter element %lld differs from the all-reduce's bits", (long long)total,
              (long long)diff);
        CHECK(recv[counts[r]] == -7, "total %lld: the reduce-scatter wrote past the block", (long long)total);
        /* all-gather: every block in its place */
        float *mine = adt_comm_shared_alloc((size_t)(counts[r] ? counts[r] : 1) * sizeof *mine);
        float *got = adt_comm_shared_alloc((size_t)(total + 1) * sizeof *got);
        for (int64_t j = 0; j < counts[r]; j++) mine[j] = rnd_val(r, j, salt);
        got[total] = -7;
        ops0 = adt_comm_shared_ops();
        CHECK_OK(adt_comm_allgather_f32(w, mine, got, counts));
        CHECK(adt_comm_shared_ops() - ops0 == shm, "total %lld: %lld shared-memory all-gathers, expected %d",
              (long long)total, (long long)(adt_comm_shared_ops() - ops0), shm);
        bad = -1;
        for (int q = 0, at = 0; q < p; at += (int)counts[q], q++)
            for (int64_t j = 0; j < counts[q]; j++)
                if (bad < 0 && got[at + j] != rnd_val(q, j, salt)) bad = at + j;
        CHECK(bad < 0, "total %lld: gathered element %lld wrong", (long long)total, (long long)bad);
        CHECK(got[total] == -7, "total %lld: the all-gather wrote past the end", (long long)total);
        adt_comm_shared_free(send), adt_comm_shared_free(recv), adt_comm_shared_free(all);
        adt_comm_shared_free(mine), adt_comm_shared_free(got);
    }

    /* the last rank's buffers private: MPI's path on every rank, the results still right */
    int64_t counts[64], total = 50000, start = 0;
    adt_comm_block_counts(total, p, counts);
    for (int q = 0; q < r; q++) start += counts[q];
    int priv = r == p - 1;
    float *send = priv ? adt_alloc_aligned((size_t)total * sizeof *send) : adt_comm_shared_alloc((size_t)total * sizeof *send);
    float *recv = priv ? adt_alloc_aligned((size_t)total * sizeof *recv) : adt_comm_shared_alloc((size_t)total * sizeof *recv);
    salt++;
    for (int64_t i = 0; i < total; i++) send[i] = rnd_val(r, i, salt);
    int64_t ops0 = adt_comm_shared_ops();
    CHECK_OK(adt_comm_reduce_scatter_f32(w, send, recv, counts));
    int64_t bad = -1;
    for (int64_t j = 0; j < counts[r] && bad < 0; j++) {
        float e = rnd_val(0, start + j, salt);
        for (int q = 1; q < p; q++) e += rnd_val(q, start + j, salt);
        if (p <= 2 ? recv[j] != e : fabsf(recv[j] - e) > 1e-5f * (1.0f + fabsf(e))) bad = j;
    }
    CHECK(bad < 0, "mixed buffers: reduce-scatter element %lld wrong", (long long)bad);
    CHECK_OK(adt_comm_allgather_f32(w, send, recv, counts));
    CHECK(adt_comm_shared_ops() == ops0, "a private buffer on rank %d, yet shared memory was used", p - 1);
    bad = -1;
    for (int q = 0, at = 0; q < p; at += (int)counts[q], q++)
        for (int64_t j = 0; j < counts[q]; j++)
            if (bad < 0 && recv[at + j] != rnd_val(q, j, salt)) bad = at + j;
    CHECK(bad < 0, "mixed buffers: gathered element %lld wrong", (long long)bad);
    if (priv) adt_free_aligned(send), adt_free_aligned(recv);
    else adt_comm_shared_free(send), adt_comm_shared_free(recv);

    /* an all-reduce, a reduce-scatter and an all-gather in flight at once, waited for in reverse
     * order, on a sub-communicator of odd and even ranks as well as the world */
    adt_comm *half = NULL;
    CHECK_OK(adt_comm_split(w, r % 2, r, &half));
    adt_comm *cs[2] = {w, half};
    for (int c = 0; c < 2; c++) {
        if (!cs[c]) continue;
        int cp = adt_comm_size(cs[c]), cr = adt_comm_rank(cs[c]);
        adt_comm_block_counts(total, cp, counts);
        start = 0;
        for (int q = 0; q < cr; q++) start += counts[q];
        float *b = adt_comm_shared_alloc((size_t)5 * total * sizeof *b), *ar = b, *rs_s = b + total, *rs_r = b + 2 * total,
              *ag = b + 3 * total, *ag_s = b + 4 * total;
        salt++;
        for (int64_t i = 0; i < total; i++) ar[i] = rnd_val(cr, i, salt), rs_s[i] = rnd_val(cr, i, salt + 1);
        for (int64_t j = 0; j < counts[cr]; j++) ag_s[j] = rnd_val(cr, j, salt + 2);
        adt_comm_req *req[3];
        CHECK_OK(adt_comm_iallreduce(cs[c], ar, total, ADT_F32, &req[0]));
        CHECK_OK(adt_comm_ireduce_scatter_f32(cs[c], rs_s, rs_r, counts, &req[1]));
        CHECK_OK(adt_comm_iallgather_f32(cs[c], ag_s, ag, counts, &req[2]));
        for (int j = 2; j >= 0; j--) CHECK_OK(adt_comm_wait(&req[j]));
        bad = check_rank_sum(ar, total, cp, salt, 1);
        CHECK(bad < 0, "%s: all-reduce element %lld wrong", c ? "half" : "world", (long long)bad);
        bad = -1;
        for (int64_t j = 0; j < counts[cr] && bad < 0; j++) {
            float e = rnd_val(0, start + j, salt + 1);
            for (int q = 1; q < cp; q++) e += rnd_val(q, start + j, salt + 1);
            if (rs_r[j] != e) bad = j;
        }
        CHECK(bad < 0, "%s: reduce-scatter element %lld wrong", c ? "half" : "world", (long long)bad);
        bad = -1;
        for (int q = 0, at = 0; q < cp; at += (int)counts[q], q++)
            for (int64_t j = 0; j < counts[q]; j++)
                if (bad < 0 && ag[at + j] != rnd_val(q, j, salt + 2)) bad = at + j;
        CHECK(bad < 0, "%s: gathered element %lld wrong", c ? "half" : "world", (long long)bad);
        adt_comm_shared_free(b);
    }
    if (half) CHECK_OK(adt_comm_free(half));
}

/* A rank waiting only on shared memory keeps MPI's own operations moving: half the ranks leave
 * a step's reduce-scatters (MPI's: of i32, which shared memory does not take) for the next
 * all-reduce (the shared-memory protocol, a private float: the loss of `adtrain train`) while
 * the other half still wait on theirs. Before the
 * shared-memory wait drove MPI's progress this hung (2 of 3 runs of this program: a world of 2,
 * 3 or 4 ranks timed out at some round); a timeout of 20 s turns a hang into a failed case. */
static void case_shm_wait_drives_mpi(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    adt_comm *a = NULL;
    CHECK_OK(adt_comm_split(w, 0, r, &a)); /* another communicator, as the executor's mesh axis */
    if (!a) return;
    CHECK_OK(adt_comm_set_timeout(a, 20));
    CHECK_OK(adt_comm_set_timeout(w, 20));
    enum { ROUNDS = 1000, OPS = 60, N = 8000 };
    int64_t counts[64];
    adt_comm_block_counts(N, p, counts);
    int32_t *send = adt_comm_shared_alloc((size_t)OPS * N * sizeof *send);
    int32_t *recv = adt_comm_shared_alloc((size_t)OPS * N * sizeof *recv);
    for (int64_t i = 0; i < (int64_t)OPS * N; i++) send[i] = i32_val(r, i % N);
    int64_t start = 0, bad = -1;
    for (int q = 0; q < r; q++) start += counts[q];
    int ok = 1;
    for (int round = 0; round < ROUNDS && ok && bad < 0; round++) {
        adt_comm_req *req[OPS];
        for (int j = 0; j < OPS && ok; j++)
            ok = adt_comm_ireduce_scatter(a, send + (size_t)j * N, recv + (size_t)j * N, counts, ADT_I32, &req[j]) == ADT_OK;
        if (r >= p / 2) usleep(200); /* the second half comes late to its waits */
        for (int j = 0; j < OPS && ok; j++) ok = adt_comm_wait(&req[j]) == ADT_OK;
        float loss = (float)r;
        ok = ok && adt_comm_allreduce(w, &loss, 1, ADT_F32) == ADT_OK;
        ok = ok && (double)loss == p * (p - 1) / 2.0;
        for (int64_t j = 0; ok && bad < 0 && j < counts[r]; j++) {
            int64_t e = 0;
            for (int q = 0; q < p; q++) e += i32_val(q, start + j);
            if (recv[(size_t)(OPS - 1) * N + j] != e) bad = j;
        }
        CHECK(ok && bad < 0, "round %d: %s (block element %lld)", round, adt_error_message(), (long long)bad);
    }
    adt_comm_shared_free(send), adt_comm_shared_free(recv);
    CHECK_OK(adt_comm_free(a));
}

static void case_reduce_scatter(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int64_t counts[8];
    for (int kind = 0; kind < 2; kind++) {
        make_counts(p, kind, counts);
        int64_t total = 0, start = 0;
        for (int q = 0; q < p; q++) total += counts[q];
        for (int q = 0; q < r; q++) start += counts[q];
        float *send = malloc((size_t)total * sizeof *send), *recv = malloc((size_t)(counts[r] + 1) * sizeof *recv);
        for (int64_t i = 0; i < total; i++) send[i] = f_val(r, i);
        recv[counts[r]] = -7; /* guard: nothing past the block is written */
        CHECK_OK(adt_comm_reduce_scatter_f32(w, send, recv, counts));
        int64_t bad = -1;
        for (int64_t j = 0; j < counts[r]; j++)
            if (bad < 0 && (double)recv[j] != f_sum(p, start + j)) bad = j;
        CHECK(bad < 0, "counts kind %d: block of %lld wrong at %lld", kind, (long long)counts[r], (long long)bad);
        CHECK(recv[counts[r]] == -7, "wrote past the block");
        free(send), free(recv);
    }
    /* i32 through the generic entry, block counts from adt_block_range */
    adt_comm_block_counts(7 * p + 1, p, counts);
    int64_t total = 7 * p + 1, start, len;
    adt_block_range(total, p, r, &start, &len);
    CHECK(len == counts[r], "block counts %lld vs range %lld", (long long)counts[r], (long long)len);
    int32_t *s32 = malloc((size_t)total * sizeof *s32), *r32 = malloc((size_t)(len ? len : 1) * sizeof *r32);
    for (int64_t i = 0; i < total; i++) s32[i] = i32_val(r, i);
    CHECK_OK(adt_comm_reduce_scatter(w, s32, r32, counts, ADT_I32));
    for (int64_t j = 0; j < len; j++) {
        int64_t e = 0;
        for (int q = 0; q < p; q++) e += i32_val(q, start + j);
        if (r32[j] != e) {
            CHECK(0, "i32 reduce-scatter [%lld] = %d, expected %lld", (long long)j, r32[j], (long long)e);
            break;
        }
    }
    free(s32), free(r32);
}

static void case_allgather(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int64_t counts[8], total = 0;
    for (int q = 0; q < p; q++) counts[q] = (p > 1 && q == p - 1) ? 0 : q + 2, total += counts[q];
    float *send = malloc((size_t)(counts[r] + 1) * sizeof *send), *recv = malloc((size_t)total * sizeof *recv);
    for (int64_t j = 0; j < counts[r]; j++) send[j] = tag_val(r, 0, j);
    CHECK_OK(adt_comm_allgather_f32(w, send, recv, counts));
    int64_t k = 0, bad = -1;
    for (int q = 0; q < p; q++)
        for (int64_t j = 0; j < counts[q]; j++, k++)
            if (bad < 0 && recv[k] != tag_val(q, 0, j)) bad = k;
    CHECK(bad < 0, "gathered element %lld wrong", (long long)bad);
    free(send), free(recv);
    /* a 2-byte dtype moves as bits */
    uint16_t b16[4] = {(uint16_t)(0x3f80 + r), (uint16_t)(0xbf00 + r), 0, 0}, all16[16];
    int64_t c2[8];
    for (int q = 0; q < p; q++) c2[q] = 2;
    CHECK_OK(adt_comm_allgather(w, b16, all16, c2, ADT_BF16));
    for (int q = 0; q < p; q++)
        CHECK(all16[2 * q] == 0x3f80 + q && all16[2 * q + 1] == 0xbf00 + q, "bf16 bits from rank %d", q);
}

/* elements rank `from` sends to rank `to` in the all-to-all: some blocks are empty */
static int64_t a2a_count(int from, int to) { return (from * 3 + to) % 4 + (from == to); }

static void case_alltoall(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int64_t sc[8], rc[8], st = 0, rt = 0;
    for (int q = 0; q < p; q++) sc[q] = a2a_count(r, q), rc[q] = a2a_count(q, r), st += sc[q], rt += rc[q];
    float *send = malloc((size_t)st * sizeof *send), *recv = malloc((size_t)rt * sizeof *recv);
    for (int q = 0, k = 0; q < p; q++)
        for (int64_t j = 0; j < sc[q]; j++) send[k++] = tag_val(r, q, j);
    CHECK_OK(adt_comm_alltoall_f32(w, send, sc, recv, rc));
    int64_t k = 0, bad = -1;
    for (int q = 0; q < p; q++)
        for (int64_t j = 0; j < rc[q]; j++, k++)
            if (bad < 0 && recv[k] != tag_val(q, r, j)) bad = k;
    CHECK(bad < 0, "all-to-all element %lld wrong", (long long)bad);
    free(send), free(recv);
}

static void case_bcast(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    const int64_t n = 1001;
    float *buf = malloc(n * sizeof *buf);
    for (int root = 0; root < p; root++) {
        for (int64_t i = 0; i < n; i++) buf[i] = r == root ? tag_val(root, 9, i) : -1.0f;
        CHECK_OK(adt_comm_bcast_f32(w, buf, n, root));
        int64_t bad = -1;
        for (int64_t i = 0; i < n; i++)
            if (bad < 0 && buf[i] != tag_val(root, 9, i)) bad = i;
        CHECK(bad < 0, "root %d: element %lld wrong", root, (long long)bad);
    }
    int32_t v[2] = {r == p - 1 ? 12345 : 0, r == p - 1 ? -6 : 0};
    CHECK_OK(adt_comm_bcast(w, v, 2, ADT_I32, p - 1));
    CHECK(v[0] == 12345 && v[1] == -6, "i32 broadcast from the last rank: %d %d", v[0], v[1]);
    free(buf);
}

/* A ring: every rank sends to the next and receives from the previous (itself when alone):
 * two small messages with one tag (they must arrive in order) and one of 4 MiB. */
static void case_sendrecv(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int next = (r + 1) % p, prev = (r + p - 1) % p;
    int64_t n1 = 100 + r, n1p = 100 + prev, big = 1 << 20;
    float *a = malloc((size_t)n1 * sizeof *a), *b = malloc(3 * sizeof *b), *ra = malloc((size_t)n1p * sizeof *ra), rb[3];
    float *s4 = malloc((size_t)big * sizeof *s4), *r4 = malloc((size_t)big * sizeof *r4);
    for (int64_t i = 0; i < n1; i++) a[i] = tag_val(r, next, i);
    for (int i = 0; i < 3; i++) b[i] = -tag_val(r, next, i) - 1;
    for (int64_t i = 0; i < big; i++) s4[i] = tag_val(r, next, i % 4096) + (float)(i / 4096);
    adt_comm_req *sa, *sb, *s4r;
    CHECK_OK(adt_comm_isend(w, a, n1, ADT_F32, next, 11, &sa));
    CHECK_OK(adt_comm_isend(w, b, 3, ADT_F32, next, 11, &sb));
    CHECK_OK(adt_comm_isend(w, s4, big, ADT_F32, next, 12, &s4r));
    CHECK_OK(adt_comm_recv_f32(w, ra, n1p, prev, 11));
    CHECK_OK(adt_comm_recv_f32(w, rb, 3, prev, 11));
    CHECK_OK(adt_comm_recv(w, r4, big, ADT_F32, prev, 12));
    adt_comm_req *sends[3] = {sa, sb, s4r};
    CHECK_OK(adt_comm_waitall(sends, 3));
    CHECK(!sends[0] && !sends[1] && !sends[2], "waitall left requests");
    int64_t bad = -1;
    for (int64_t i = 0; i < n1p; i++)
        if (bad < 0 && ra[i] != tag_val(prev, r, i)) bad = i;
    CHECK(bad < 0, "first message wrong at %lld", (long long)bad);
    for (int i = 0; i < 3; i++) CHECK(rb[i] == -tag_val(prev, r, i) - 1, "second message [%d]", i);
    bad = -1;
    for (int64_t i = 0; i < big; i++)
        if (bad < 0 && r4[i] != tag_val(prev, r, i % 4096) + (float)(i / 4096)) bad = i;
    CHECK(bad < 0, "4 MiB message wrong at %lld", (long long)bad);
    /* blocking send where the receive is already posted */
    int32_t x = 0, y = 40 + r;
    adt_comm_req *rx;
    CHECK_OK(adt_comm_irecv(w, &x, 1, ADT_I32, prev, 13, &rx));
    CHECK_OK(adt_comm_send(w, &y, 1, ADT_I32, next, 13));
    CHECK_OK(adt_comm_wait(&rx));
    CHECK(x == 40 + prev && rx == NULL, "i32 message %d", x);
    free(a), free(b), free(ra), free(s4), free(r4);
}

/* A message of the wrong length is an error naming both lengths; the world stays usable. */
static void case_recv_length(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int next = (r + 1) % p, prev = (r + p - 1) % p;
    float s[8] = {1, 2, 3, 4, 5, 6, 7, 8}, d[8];
    adt_comm_req *q;
    CHECK_OK(adt_comm_isend(w, s, 5, ADT_F32, next, 21, &q));
    CHECK_ERR(adt_comm_recv_f32(w, d, 8, prev, 21), ADT_ERR_COMM, "has 5 f32, the recv expected 8");
    CHECK_OK(adt_comm_wait(&q));
    CHECK_OK(adt_comm_isend(w, s, 8, ADT_F32, next, 22, &q));
    CHECK_ERR(adt_comm_recv_f32(w, d, 5, prev, 22), ADT_ERR_COMM, "recv of 5 f32 from rank");
    CHECK(strstr(adt_error_message(), "truncat") || strstr(adt_error_message(), "longer") ||
          strstr(adt_error_message(), "has 8"), "names the cause: %s", adt_error_message());
    CHECK_OK(adt_comm_wait(&q));
    CHECK(!adt_comm_broken(w), "a length error is not a timeout");
    float one = 1;
    CHECK_OK(adt_comm_allreduce_f32(w, &one, 1));
    CHECK(one == p, "world usable after: %g", one);
}

/* Nobody leaves a barrier before the last rank enters it. Rank 0 comes 0.3 s late; the ranks
 * share a host, hence a clock, so each compares the time it left with the time rank 0 entered. */
static void case_barrier(adt_comm *w) {
    int r = adt_comm_rank(w);
    CHECK_OK(adt_comm_barrier(w));
    double entered = 0;
    if (r == 0) nap(0.3), entered = adt_wall_s();
    CHECK_OK(adt_comm_barrier(w));
    double left = adt_wall_s();
    CHECK_OK(adt_comm_allreduce_f64(w, &entered, 1)); /* only rank 0's is nonzero */
    CHECK(left >= entered, "rank %d left the barrier %.6f s before rank 0 entered it", r, entered - left);
}

/* Every non-blocking operation in flight at once while the rank computes, then completed. */
static void case_overlap(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    int next = (r + 1) % p, prev = (r + p - 1) % p;
    const int64_t n = 1 << 18;
    float *ar = malloc(n * sizeof *ar);
    for (int64_t i = 0; i < n; i++) ar[i] = f_val(r, i);
    int64_t counts[8], total = 0, start = 0;
    make_counts(p, 1, counts);
    for (int q = 0; q < p; q++) total += counts[q], start += q < r ? counts[q] : 0;
    float *rs_send = malloc((size_t)total * sizeof *rs_send), *rs_recv = malloc((size_t)(counts[r] + 1) * sizeof *rs_recv);
    for (int64_t i = 0; i < total; i++) rs_send[i] = f_val(r, i);
    float *ag_send = malloc((size_t)(counts[r] + 1) * sizeof *ag_send), *ag_recv = malloc((size_t)total * sizeof *ag_recv);
    for (int64_t j = 0; j < counts[r]; j++) ag_send[j] = tag_val(r, 0, j);
    int64_t sc[8], rc[8], st = 0, rt = 0;
    for (int q = 0; q < p; q++) sc[q] = a2a_count(r, q), rc[q] = a2a_count(q, r), st += sc[q], rt += rc[q];
    float *a_send = malloc((size_t)st * sizeof *a_send), *a_recv = malloc((size_t)rt * sizeof *a_recv);
    for (int q = 0, k = 0; q < p; q++)
        for (int64_t j = 0; j < sc[q]; j++) a_send[k++] = tag_val(r, q, j);
    float bc[64], msg[16], got[16];
    for (int i = 0; i < 64; i++) bc[i] = r == 0 ? tag_val(0, 7, i) : 0;
    for (int i = 0; i < 16; i++) msg[i] = tag_val(r, next, i);

    adt_comm_req *q[8];
    CHECK_OK(adt_comm_iallreduce_f32(w, ar, n, &q[0]));
    CHECK_OK(adt_comm_ireduce_scatter_f32(w, rs_send, rs_recv, counts, &q[1]));
    CHECK_OK(adt_comm_iallgather_f32(w, ag_send, ag_recv, counts, &q[2]));
    CHECK_OK(adt_comm_ialltoall(w, a_send, sc, a_recv, rc, ADT_F32, &q[3]));
    CHECK_OK(adt_comm_ibcast(w, bc, 64, ADT_F32, 0, &q[4]));
    CHECK_OK(adt_comm_irecv(w, got, 16, ADT_F32, prev, 31, &q[5]));
    CHECK_OK(adt_comm_isend(w, msg, 16, ADT_F32, next, 31, &q[6]));
    CHECK_OK(adt_comm_ibarrier(w, &q[7]));

    /* the other work: a sum over 2^22 terms in chunks, letting the transfers move in between */
    double acc = 0;
    int done0 = 0;
    for (int chunk = 0; chunk < 64; chunk++) {
        for (int64_t i = 0; i < (1 << 16); i++) acc += (double)((chunk << 16) + i) * 0.5;
        CHECK_OK(adt_comm_progress(w));
        if (!done0) {
            CHECK_OK(adt_comm_test(&q[0], &done0));
            CHECK(done0 == (q[0] == NULL), "test: done %d with request %p", done0, (void *)q[0]);
        }
    }
    double m = (double)(1 << 22);
    CHECK(acc == 0.5 * m * (m - 1) / 2, "the work itself: %.17g", acc);
    CHECK_OK(adt_comm_waitall(q, 8));
    for (int i = 0; i < 8; i++) CHECK(q[i] == NULL, "request %d left after waitall", i);

    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++)
        if (bad < 0 && (double)ar[i] != f_sum(p, i)) bad = i;
    CHECK(bad < 0, "allreduce wrong at %lld", (long long)bad);
    bad = -1;
    for (int64_t j = 0; j < counts[r]; j++)
        if (bad < 0 && (double)rs_recv[j] != f_sum(p, start + j)) bad = j;
    CHECK(bad < 0, "reduce-scatter wrong at %lld", (long long)bad);
    bad = -1;
    for (int qq = 0, k = 0; qq < p; qq++)
        for (int64_t j = 0; j < counts[qq]; j++, k++)
            if (bad < 0 && ag_recv[k] != tag_val(qq, 0, j)) bad = k;
    CHECK(bad < 0, "all-gather wrong at %lld", (long long)bad);
    bad = -1;
    for (int qq = 0, k = 0; qq < p; qq++)
        for (int64_t j = 0; j < rc[qq]; j++, k++)
            if (bad < 0 && a_recv[k] != tag_val(qq, r, j)) bad = k;
    CHECK(bad < 0, "all-to-all wrong at %lld", (long long)bad);
    for (int i = 0; i < 64; i++)
        if (bc[i] != tag_val(0, 7, i)) {
            CHECK(0, "broadcast wrong at %d", i);
            break;
        }
    for (int i = 0; i < 16; i++)
        if (got[i] != tag_val(prev, r, i)) {
            CHECK(0, "message wrong at %d", i);
            break;
        }
    free(ar), free(rs_send), free(rs_recv), free(ag_send), free(ag_recv), free(a_send), free(a_recv);
}

/* adt_comm_test alone drives an operation to completion. */
static void case_test_loop(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    const int64_t n = 1 << 16;
    float *a = malloc(n * sizeof *a);
    for (int64_t i = 0; i < n; i++) a[i] = f_val(r, i);
    adt_comm_req *q;
    CHECK_OK(adt_comm_iallreduce_f32(w, a, n, &q));
    int done = 0;
    long polls = 0;
    double t0 = adt_now_s();
    while (!done && adt_now_s() - t0 < 10) {
        CHECK_OK(adt_comm_test(&q, &done));
        polls++;
    }
    CHECK(done && q == NULL, "not done after %ld polls", polls);
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++)
        if (bad < 0 && (double)a[i] != f_sum(p, i)) bad = i;
    CHECK(bad < 0, "wrong at %lld", (long long)bad);
    /* a request that is NULL is complete */
    adt_comm_req *none = NULL;
    CHECK_OK(adt_comm_test(&none, &done));
    CHECK(done == 1, "NULL request not done");
    CHECK_OK(adt_comm_wait(&none));
    free(a);
}

/* The members of a sub-communicator, by world rank, checked through the communicator itself
 * (an all-gather of world ranks): its bookkeeping and the backend's order must both match. */
static void check_members(adt_comm *s, const int *expect, int n, const char *what) {
    CHECK(adt_comm_size(s) == n, "%s: size %d, expected %d", what, adt_comm_size(s), n);
    if (adt_comm_size(s) != n) return;
    int32_t mine = adt_comm_world_rank(s, adt_comm_rank(s)), got[8];
    int64_t ones[8];
    for (int i = 0; i < n; i++) ones[i] = 1;
    CHECK_OK(adt_comm_allgather(s, &mine, got, ones, ADT_I32));
    for (int i = 0; i < n; i++) {
        CHECK(adt_comm_world_rank(s, i) == expect[i], "%s: member %d is world rank %d, expected %d", what, i,
              adt_comm_world_rank(s, i), expect[i]);
        CHECK(got[i] == expect[i], "%s: rank %d of the communicator says world rank %d, expected %d", what, i,
              got[i], expect[i]);
    }
    int64_t sum = adt_comm_world_rank(s, adt_comm_rank(s)), esum = 0;
    for (int i = 0; i < n; i++) esum += expect[i];
    CHECK_OK(adt_comm_allreduce_i64(s, &sum, 1));
    CHECK(sum == esum, "%s: sum of world ranks %lld, expected %lld", what, (long long)sum, (long long)esum);
}

static void case_split(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    /* parity groups, in reverse order of rank */
    adt_comm *s = NULL;
    CHECK_OK(adt_comm_split(w, r % 2, -r, &s));
    CHECK(s != NULL, "no communicator");
    if (s) {
        int expect[8], n = 0;
        for (int q = p - 1; q >= 0; q--)
            if (q % 2 == r % 2) expect[n++] = q;
        check_members(s, expect, n, "parity split");
        char name[64];
        snprintf(name, sizeof name, "world/split(%d)", r % 2);
        CHECK(!strcmp(adt_comm_name(s), name), "name %s, expected %s", adt_comm_name(s), name);
        CHECK(adt_comm_timeout(s) == adt_comm_timeout(w), "timeout not inherited");
        /* a split of a split */
        adt_comm *t = NULL;
        CHECK_OK(adt_comm_split(s, 0, 0, &t));
        if (t) check_members(t, expect, n, "split of a split");
        CHECK_OK(adt_comm_free(t));
    }
    CHECK_OK(adt_comm_free(s));
    /* rank 0 joins none */
    adt_comm *u = (adt_comm *)&u;
    CHECK_OK(adt_comm_split(w, r == 0 ? -1 : 5, r, &u));
    if (r == 0) CHECK(u == NULL, "rank 0 got a communicator for color -1");
    else {
        int expect[8];
        for (int q = 1; q < p; q++) expect[q - 1] = q;
        if (u) check_members(u, expect, p - 1, "all but rank 0");
        CHECK_OK(adt_comm_free(u));
    }
}

/* A mesh over the first `n` world ranks from `first`, in the given order (NULL: increasing). */
static adt_mesh make_mesh(int ndim, const int *dims, int first, const int *order, int *storage) {
    adt_mesh m = {.ndim = ndim, .intra_axis = -1};
    m.nranks = 1;
    for (int a = 0; a < ndim; a++) m.dim[a] = dims[a], m.nranks *= dims[a];
    for (int i = 0; i < m.nranks; i++) storage[i] = order ? order[i] : first + i;
    m.ranks = storage;
    return m;
}

/* Every axis communicator of `m` (and the mesh's own) against the lines of the mesh computed
 * here from its row-major layout. */
static void check_mesh(adt_comm *w, const adt_mesh *m, const char *label) {
    int r = adt_comm_rank(w), idx = -1;
    for (int i = 0; i < m->nranks; i++)
        if (m->ranks[i] == r) idx = i;
    int coords[3] = {0, 0, 0}, stride[3];
    stride[m->ndim - 1] = 1;
    for (int a = m->ndim - 2; a >= 0; a--) stride[a] = stride[a + 1] * m->dim[a + 1];
    for (int a = 0; a < m->ndim && idx >= 0; a++) coords[a] = idx / stride[a] % m->dim[a];
    int c2[3];
    int in = adt_comm_mesh_coords(m, r, c2);
    CHECK(in == (idx >= 0), "%s: mesh_coords says member %d", label, in);
    for (int a = 0; a < m->ndim && in == 1; a++) CHECK(c2[a] == coords[a], "%s: coordinate %d", label, a);

    adt_comm *mc = (adt_comm *)&mc;
    CHECK_OK(adt_comm_mesh(w, m, &mc));
    if (idx < 0) CHECK(mc == NULL, "%s: non-member got the mesh communicator", label);
    else if (mc) check_members(mc, m->ranks, m->nranks, label);
    CHECK_OK(adt_comm_free(mc));

    for (int axis = 0; axis < m->ndim; axis++) {
        adt_comm *ax = (adt_comm *)&ax;
        CHECK_OK(adt_comm_mesh_axis(w, m, axis, &ax));
        char what[96];
        snprintf(what, sizeof what, "%s axis %d", label, axis);
        if (idx < 0) {
            CHECK(ax == NULL, "%s: non-member got an axis communicator", what);
            continue;
        }
        CHECK(ax != NULL, "%s: no communicator", what);
        if (!ax) continue;
        int expect[8];
        for (int k = 0; k < m->dim[axis]; k++) expect[k] = m->ranks[idx + (k - coords[axis]) * stride[axis]];
        CHECK(adt_comm_rank(ax) == coords[axis], "%s: rank %d, coordinate %d", what, adt_comm_rank(ax), coords[axis]);
        check_members(ax, expect, m->dim[axis], what);
        CHECK(contains(adt_comm_name(ax), "/axis"), "%s: name %s", what, adt_comm_name(ax));
        CHECK_OK(adt_comm_free(ax));
    }
}

static void case_mesh(adt_comm *w) {
    int p = adt_comm_size(w);
    int st[8];
    int d1[1] = {p};
    adt_mesh m = make_mesh(1, d1, 0, NULL, st);
    check_mesh(w, &m, "(p)");
    int d2[2] = {p, 1}, d3[2] = {1, p};
    m = make_mesh(2, d2, 0, NULL, st);
    check_mesh(w, &m, "(p,1)");
    m = make_mesh(2, d3, 0, NULL, st);
    check_mesh(w, &m, "(1,p)");
    if (p == 4) {
        int d22[2] = {2, 2}, perm[4] = {3, 1, 0, 2}, d212[3] = {2, 1, 2};
        m = make_mesh(2, d22, 0, NULL, st);
        check_mesh(w, &m, "(2,2)");
        m = make_mesh(2, d22, 0, perm, st);
        check_mesh(w, &m, "(2,2) permuted");
        m = make_mesh(3, d212, 0, perm, st);
        check_mesh(w, &m, "(2,1,2)");
    }
    /* pipeline stages: the first half of the ranks and the rest, each its own sub-mesh */
    int h = p / 2 > 0 ? p / 2 : 1, sa[8], sb[8];
    int da[1] = {h};
    adt_mesh stage0 = make_mesh(1, da, 0, NULL, sa);
    check_mesh(w, &stage0, "stage 0");
    if (p > h) {
        int db[2] = {1, p - h};
        adt_mesh stage1 = make_mesh(2, db, h, NULL, sb);
        check_mesh(w, &stage1, "stage 1");
    }
}

/* Bad arguments: an error naming the function and the field, nothing started, the world fine. */
static void case_bad_args(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    float buf[4] = {0};
    int64_t counts[8], neg[8];
    for (int q = 0; q < p; q++) counts[q] = 1, neg[q] = q == 0 ? -2 : 1;
    adt_comm_req *q = (adt_comm_req *)&q;
    CHECK_ERR(adt_comm_allreduce_f32(NULL, buf, 4), ADT_ERR_ARG, "communicator is NULL");
    CHECK_ERR(adt_comm_allreduce_f32(w, buf, -1), ADT_ERR_ARG, "n = -1, expected >= 0");
    CHECK_ERR(adt_comm_allreduce_f32(w, buf, (int64_t)INT_MAX + 1), ADT_ERR_ARG, "more than MPI's int counts");
    CHECK_ERR(adt_comm_allreduce_f32(w, NULL, 4), ADT_ERR_ARG, "buf is NULL");
    CHECK_ERR(adt_comm_allreduce(w, buf, 4, ADT_BF16), ADT_ERR_UNSUPPORTED, "sums of bf16");
    CHECK_ERR(adt_comm_allreduce(w, buf, 4, ADT_DTYPE_COUNT), ADT_ERR_ARG, "dtype 3");
    CHECK_ERR(adt_comm_iallreduce_f32(w, buf, 4, NULL), ADT_ERR_ARG, "req is NULL");
    CHECK_ERR(adt_comm_iallreduce_f32(w, buf, -3, &q), ADT_ERR_ARG, "n = -3");
    CHECK(q == NULL, "failed start left a request");
    CHECK_ERR(adt_comm_bcast_f32(w, buf, 4, p), ADT_ERR_ARG, "root");
    CHECK_ERR(adt_comm_bcast_f32(w, buf, 4, -1), ADT_ERR_ARG, "root -1");
    CHECK_ERR(adt_comm_send_f32(w, buf, 4, p, 0), ADT_ERR_ARG, "peer");
    CHECK_ERR(adt_comm_recv_f32(w, buf, 4, 0, -1), ADT_ERR_ARG, "tag -1");
    CHECK_ERR(adt_comm_send_f32(w, buf, 4, 0, ADT_COMM_TAG_MAX + 1), ADT_ERR_ARG, "tag 32768");
    CHECK_ERR(adt_comm_reduce_scatter_f32(w, buf, buf, NULL), ADT_ERR_ARG, "counts is NULL");
    CHECK_ERR(adt_comm_reduce_scatter_f32(w, buf, buf, neg), ADT_ERR_ARG, "counts[0] = -2");
    CHECK_ERR(adt_comm_allgather_f32(w, NULL, buf, counts), ADT_ERR_ARG, "send is NULL");
    CHECK_ERR(adt_comm_alltoall_f32(w, buf, counts, buf, NULL), ADT_ERR_ARG, "recvcounts is NULL");
    int64_t huge[8];
    for (int k = 0; k < p; k++) huge[k] = INT_MAX / 2 + 1;
    if (p >= 2) CHECK_ERR(adt_comm_allgather_f32(w, buf, buf, huge), ADT_ERR_ARG, "sum of the counts");
    CHECK_ERR(adt_comm_set_timeout(w, 0), ADT_ERR_ARG, "expected a number of seconds > 0");
    CHECK_ERR(adt_comm_set_timeout(w, NAN), ADT_ERR_ARG, "seconds > 0");
    CHECK_ERR(adt_comm_wait(NULL), ADT_ERR_ARG, "req is NULL");
    CHECK_ERR(adt_comm_free(w), ADT_ERR_STATE, "adt_comm_finalize");
    /* meshes */
    int st[8];
    int dbad[2] = {p, 2};
    adt_mesh m = make_mesh(1, (int[]){p}, 0, NULL, st);
    m.nranks = p + 1;
    adt_comm *s = (adt_comm *)&s;
    CHECK_ERR(adt_comm_mesh(w, &m, &s), ADT_ERR_ARG, "its shape holds");
    CHECK(s == NULL, "failed mesh left a communicator");
    m = make_mesh(2, dbad, 0, NULL, st);
    m.nranks = p; /* shape says 2p */
    CHECK_ERR(adt_comm_mesh_axis(w, &m, 0, &s), ADT_ERR_ARG, "mesh has");
    m = make_mesh(1, (int[]){p}, 0, NULL, st);
    CHECK_ERR(adt_comm_mesh_axis(w, &m, 1, &s), ADT_ERR_ARG, "axis 1, expected 0..0");
    st[0] = p; /* a rank the communicator does not have */
    CHECK_ERR(adt_comm_mesh(w, &m, &s), ADT_ERR_ARG, "mesh rank");
    if (p >= 2) {
        m = make_mesh(1, (int[]){p}, 0, NULL, st);
        st[1] = st[0];
        CHECK_ERR(adt_comm_mesh(w, &m, &s), ADT_ERR_ARG, "appears twice");
        /* every rank passes another order: all of them must refuse, none may hang */
        m = make_mesh(1, (int[]){p}, 0, NULL, st);
        for (int i = 0; i < p; i++) st[i] = (i + r) % p;
        CHECK_ERR(adt_comm_mesh(w, &m, &s), ADT_ERR_ARG, "passed another mesh");
        CHECK(s == NULL, "mismatched mesh left a communicator");
    }
    m.ndim = 0;
    CHECK_ERR(adt_comm_mesh(w, &m, &s), ADT_ERR_ARG, "ndim 0");
    CHECK_ERR(adt_comm_mesh(w, NULL, &s), ADT_ERR_ARG, "mesh is NULL");
    CHECK_ERR(adt_comm_split(w, 0, 0, NULL), ADT_ERR_ARG, "out is NULL");
    /* nothing above reached the other ranks: the world still works */
    CHECK(!adt_comm_broken(w), "world broken by bad arguments");
    float one = 2;
    CHECK_OK(adt_comm_allreduce_f32(w, &one, 1));
    CHECK(one == 2 * p, "world usable after bad arguments: %g", one);
}

/* A recv that nobody answers. With MPI: a timeout error after the deadline (not before, and
 * not much after), the recv withdrawn, the communicator broken. With the self backend nothing
 * could ever send: the error comes at once. */
static void case_deadline_recv(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    const double T = 1.0, SLACK = 0.5;
    adt_comm *c = dup_comm(w, T);
    if (!c) return;
    if (r == 0) {
        float buf[8];
        double t0 = adt_now_s();
        int rc = adt_comm_recv_f32(c, buf, 8, p - 1, 99);
        double el = adt_now_s() - t0;
        const char *msg = adt_error_message();
        char peer[64];
        snprintf(peer, sizeof peer, "from rank %d tag 99", p - 1);
        CHECK(rc == ADT_ERR_COMM, "rc %d", rc);
        CHECK(contains(msg, "recv of 8 f32") && contains(msg, peer) && contains(msg, "'world/split(0)'"),
              "message: %s", msg);
        if (adt_comm_backend_of(c) == ADT_COMM_SELF) {
            CHECK(contains(msg, "can never complete") && el < T, "self: %.3f s, %s", el, msg);
        } else {
            snprintf(peer, sizeof peer, "waiting for rank %d (world rank %d)", p - 1, p - 1);
            CHECK(el >= T && el <= T + SLACK, "timed out after %.3f s, deadline %.1f s", el, T);
            CHECK(contains(msg, "timed out after") && contains(msg, peer), "message: %s", msg);
            CHECK(adt_comm_broken(c), "not broken after a timeout");
            CHECK_ERR(adt_comm_barrier(c), ADT_ERR_COMM, "unusable since recv of 8 f32");
        }
    }
    CHECK_OK(adt_comm_free(c));
    CHECK_OK(adt_comm_barrier(w));
}

/* A collective the last rank joins only after the others timed out: they get the error within
 * the deadline plus slack; then the late rank completes the operation they gave up on (so its
 * result is the full sum, and so is theirs, written by MPI while the communicator is freed). */
static void case_deadline_collective(adt_comm *w) {
    int p = adt_comm_size(w), r = adt_comm_rank(w);
    const double T = 1.0, SLACK = 0.5;
    const int64_t n = 1000;
    adt_comm *c = dup_comm(w, T);
    if (!c) return;
    float *buf = malloc(n * sizeof *buf);
    for (int64_t i = 0; i < n; i++) buf[i] = f_val(r, i);
    if (p == 1) {
        double t0 = adt_now_s();
        CHECK_OK(adt_comm_allreduce_f32(c, buf, n));
        CHECK(adt_now_s() - t0 < T, "a 1-rank allreduce took %.3f s", adt_now_s() - t0);
    } else if (r < p - 1) {
        double t0 = adt_now_s();
        int rc = adt_comm_allreduce_f32(c, buf, n);
        double el = adt_now_s() - t0;
        const char *msg = adt_error_message();
        char others[64];
        snprintf(others, sizeof others, "waiting for the other %d rank", p - 1);
        CHECK(rc == ADT_ERR_COMM, "rc %d", rc);
        CHECK(el >= T && el <= T + SLACK, "timed out after %.3f s, deadline %.1f s", el, T);
        CHECK(contains(msg, "allreduce of 1000 f32 on 'world/split(0)'") && contains(msg, others) &&
              contains(msg, "timed out after"), "message: %s", msg);
        CHECK(adt_comm_broken(c), "not broken");
        CHECK_ERR(adt_comm_allreduce_f32(c, buf, n), ADT_ERR_COMM, "unusable since allreduce");
        int32_t token = r;
        CHECK_OK(adt_comm_send(w, &token, 1, ADT_I32, p - 1, 5));
    } else {
        for (int q = 0; q < p - 1; q++) {
            int32_t token = -1;
            CHECK_OK(adt_comm_recv(w, &token, 1, ADT_I32, q, 5));
            CHECK(token == q, "token %d from %d", token, q);
        }
        CHECK_OK(adt_comm_allreduce_f32(c, buf, n));
    }
    CHECK_OK(adt_comm_free(c));
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++)
        if (bad < 0 && (double)buf[i] != f_sum(p, i)) bad = i;
    CHECK(bad < 0, "rank %d: the late-completed sum is wrong at %lld", r, (long long)bad);
    free(buf);
    CHECK_OK(adt_comm_barrier(w));
}

typedef struct tcase {
    const char *name;
    void (*fn)(adt_comm *w);
} tcase;

static const tcase CASES[] = {
    {"identity", case_identity},
    {"allreduce", case_allreduce},
    {"shared_allreduce", case_shared_allreduce},
    {"shared_rs_ag", case_shared_rs_ag},
    {"shm_wait_drives_mpi", case_shm_wait_drives_mpi},
    {"reduce_scatter", case_reduce_scatter},
    {"allgather", case_allgather},
    {"alltoall", case_alltoall},
    {"bcast", case_bcast},
    {"sendrecv", case_sendrecv},
    {"recv_length", case_recv_length},
    {"barrier", case_barrier},
    {"overlap", case_overlap},
    {"test_loop", case_test_loop},
    {"split", case_split},
    {"mesh", case_mesh},
    {"bad_args", case_bad_args},
    {"deadline_recv", case_deadline_recv},
    {"deadline_collective", case_deadline_collective},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

/* ---- one rank of a launched world ---------------------------------------------------------- */

#define report mpi_report

static int child_main(void) {
    adt_comm *w = mpi_child_world();
    if (!w) return 1;
    int r = adt_comm_rank(w), p = adt_comm_size(w);
    for (int i = 0; i < N_CASES; i++) {
        check_cur_failed = 0;
        check_cur_name = CASES[i].name;
        CASES[i].fn(w);
        report(CASES[i].name, r, p, !check_cur_failed);
    }
    int rc = adt_comm_finalize(w);
    if (rc) fprintf(stderr, "FAIL rank %d: adt_comm_finalize: %s\n", r, adt_error_message());
    /* MPI cannot start twice in a process; the self backend still can */
    int again = adt_comm_init(ADT_COMM_MPI, &w);
    if (again != ADT_ERR_STATE || !contains(adt_error_message(), "finalized already")) {
        fprintf(stderr, "FAIL rank %d: a second MPI init returned %d: %s\n", r, again, adt_error_message());
        rc = 1;
    }
    if (adt_comm_init(ADT_COMM_SELF, &w) || adt_comm_finalize(w)) {
        fprintf(stderr, "FAIL rank %d: self backend after MPI: %s\n", r, adt_error_message());
        rc = 1;
    }
    printf("DONE rank=%d size=%d\n", r, p);
    fflush(stdout);
    return rc ? 1 : 0;
}

/* A rank that never joins: rank 0's split times out (bounded by the all-gather before
 * MPI_Comm_split), and finalize will not finalize MPI under an operation that never completed. */
static int child_stuck(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return 1;
    int r = adt_comm_rank(w);
    if (r != 0) {
        nap(10); /* rank 0 exits first; the launcher then ends this rank */
        return 0;
    }
    const double T = 0.5;
    adt_comm_set_timeout(w, T);
    check_cur_failed = 0;
    check_cur_name = "split_deadline";
    adt_comm *s = (adt_comm *)&s;
    double t0 = adt_now_s();
    int rc = adt_comm_split(w, 0, 0, &s);
    double el = adt_now_s() - t0;
    CHECK(rc == ADT_ERR_COMM && s == NULL, "rc %d", rc);
    CHECK(el >= T && el <= T + 0.5, "split gave up after %.3f s, deadline %.1f s", el, T);
    CHECK(contains(adt_error_message(), "adt_comm_split: all-gather of") &&
          contains(adt_error_message(), "timed out after"), "message: %s", adt_error_message());
    report("split_deadline", 0, 2, !check_cur_failed);
    check_cur_failed = 0;
    check_cur_name = "finalize_unfinished";
    t0 = adt_now_s();
    rc = adt_comm_finalize(w);
    el = adt_now_s() - t0;
    CHECK(rc == ADT_ERR_COMM && contains(adt_error_message(), "MPI left unfinalized: 1 operation") &&
          contains(adt_error_message(), "all-gather"), "rc %d: %s", rc, adt_error_message());
    CHECK(el < 5, "finalize took %.3f s", el);
    report("finalize_unfinished", 0, 2, !check_cur_failed);
    return 0;
}

/* Rank 1 is late for MPI_Finalize, which waits for every rank: rank 0's watchdog must end it. */
static int child_watchdog(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return 1;
    int r = adt_comm_rank(w);
    adt_comm_barrier(w);
    if (r == 1) {
        nap(10);
        adt_comm_finalize(w);
        return 0;
    }
    adt_comm_set_timeout(w, 0.5);
    report("watchdog_armed", 0, 2, 1);
    adt_comm_finalize(w); /* does not return */
    report("watchdog_missed", 0, 2, 0);
    return 0;
}

/* Rank 1 dies while rank 0 waits for its message. */
static int child_crash(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return 1;
    adt_comm_barrier(w);
    if (adt_comm_rank(w) == 1) {
        fprintf(stderr, "rank 1 crashing on purpose\n");
        abort();
    }
    float x;
    adt_comm_recv_f32(w, &x, 1, 1, 0);
    adt_comm_finalize(w);
    return 0;
}

/* Rank 1 ends the world on purpose while rank 0 waits for its message. */
static int child_abort(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return 1;
    adt_comm_barrier(w);
    if (adt_comm_rank(w) == 1) adt_comm_abort(w, 7);
    float x;
    adt_comm_recv_f32(w, &x, 1, 1, 0);
    report("abort_missed", 0, 2, 0);
    adt_comm_finalize(w);
    return 0;
}

/* ---- the parent: launching worlds ---------------------------------------------------------- */

static char g_self[PATH_MAX];

typedef struct world {
    int n;            /* ranks; 0: the singleton (no launcher) */
    const char *mode; /* --child, --child-stuck, ... */
    int status;       /* exit status, 128+signal, or -1 if killed at the time limit */
    double secs;
    char *out, *err;
} world;

/* Runs `[mpiexec -n N] test_comm MODE` (tests/mpi_world.h), ended at `limit` seconds. */
static void run_world(world *wd, double limit) {
    const char *argv[] = {g_self, wd->mode, NULL};
    mpi_world w = {.n = wd->n, .argv = argv};
    mpi_run_world(&w, check_tmpdir(), limit);
    wd->status = w.status, wd->secs = w.secs, wd->out = w.out, wd->err = w.err;
}

#define print_tail mpi_print_tail

/* Whether rank r of the world reported case `name` ok. */
static int case_ok(const world *wd, const char *name, int r, int p) {
    return mpi_case_ok(&(mpi_world){.out = wd->out}, name, r, p);
}

/* Judges one launched world's report: one result per case (ok when every rank reported it ok)
 * and one for the exit (status 0, every rank finished). Adds them to *passed / *failed; unless
 * quiet, prints what failed with the world's stderr tail. */
static void judge_world(const world *wd, int quiet, int *passed, int *failed) {
    int p = wd->n ? wd->n : 1, bad = 0;
    char label[64];
    snprintf(label, sizeof label, wd->n ? "mpiexec -n %d" : "MPI singleton", wd->n);
    for (int i = 0; i < N_CASES; i++) {
        char ranks[64] = "";
        for (int r = 0; r < p; r++)
            if (!case_ok(wd, CASES[i].name, r, p)) {
                size_t k = strlen(ranks);
                snprintf(ranks + k, sizeof ranks - k, " %d", r);
            }
        if (ranks[0]) {
            if (!quiet) fprintf(stderr, "  FAIL %s: case %s: rank%s failed or did not report\n", label, CASES[i].name, ranks);
            ++*failed, bad = 1;
        } else {
            ++*passed;
        }
    }
    int done = mpi_all_done(&(mpi_world){.out = wd->out}, p);
    if (wd->status == 0 && done) {
        ++*passed;
    } else {
        if (!quiet)
            fprintf(stderr, "  FAIL %s: exit status %d%s after %.1f s, %s\n", label, wd->status,
                    wd->status < 0 ? " (killed at the time limit)" : "", wd->secs,
                    done ? "every rank finished" : "not every rank finished");
        ++*failed, bad = 1;
    }
    if (quiet) return;
    if (bad) mpi_print_failure(&(mpi_world){.out = wd->out, .err = wd->err});
    fprintf(stderr, "%s %s: %.1f s\n", bad ? "FAILED" : "ok", label, wd->secs);
}

static void free_world(world *wd) {
    free(wd->out);
    free(wd->err);
}

static const double WORLD_LIMIT_S = 180;

static void test_mpi_worlds(void) {
    CHECK(mpi_find_mpiexec(), "no mpiexec on PATH (install mpich, or set ADT_MPIEXEC)");
    world singleton = {.n = 0, .mode = "--child"};
    run_world(&singleton, WORLD_LIMIT_S);
    judge_world(&singleton, 0, &check_n_passed, &check_n_failed);
    free_world(&singleton);
    if (!g_mpiexec[0]) return;
    for (int n = 2; n <= 4; n++) {
        world wd = {.n = n, .mode = "--child"};
        run_world(&wd, WORLD_LIMIT_S);
        judge_world(&wd, 0, &check_n_passed, &check_n_failed);
        free_world(&wd);
    }
}

static void test_world_stuck_peer(void) {
    world wd = {.n = 2, .mode = "--child-stuck"};
    run_world(&wd, 60);
    CHECK(case_ok(&wd, "split_deadline", 0, 2), "split did not time out cleanly");
    CHECK(case_ok(&wd, "finalize_unfinished", 0, 2), "finalize did not report the unfinished operation");
    CHECK(wd.secs < 9, "the world took %.1f s; rank 0 should end it after about 3 s", wd.secs);
    if (check_cur_failed) print_tail("stderr", wd.err, 20), print_tail("stdout", wd.out, 10);
    free_world(&wd);
}

static void test_world_watchdog(void) {
    world wd = {.n = 2, .mode = "--child-watchdog"};
    run_world(&wd, 60);
    CHECK(case_ok(&wd, "watchdog_armed", 0, 2), "rank 0 did not get to finalize");
    CHECK(!contains(wd.out, "watchdog_missed"), "finalize returned");
    CHECK(contains(wd.err, "MPI_Finalize did not return within 0.5 s") &&
          contains(wd.err, "exiting with status 86"), "no watchdog message");
    CHECK(wd.status != 0, "the world exited 0");
    CHECK(wd.secs < 9, "the world took %.1f s", wd.secs);
    if (check_cur_failed) print_tail("stderr", wd.err, 20);
    free_world(&wd);
}

/* The judge must see a crashed rank: missing reports, a nonzero status, and the launcher's
 * account of the crash in the stderr it prints. */
static void test_world_crash_detected(void) {
    world wd = {.n = 2, .mode = "--child-crash"};
    run_world(&wd, 60);
    CHECK(wd.status != 0, "a world with a crashed rank exited 0");
    CHECK(contains(wd.err, "rank 1 crashing on purpose"), "the crashing rank's stderr is missing");
    CHECK(!contains(wd.out, "DONE rank=0"), "rank 0 finished although its peer crashed");
    CHECK(wd.secs < 30, "took %.1f s", wd.secs);
    /* judged as a --child world is, it must count as failed */
    int passed = 0, failed = 0;
    judge_world(&wd, 1, &passed, &failed);
    CHECK(failed > 0, "the judge passed a crashed world (%d passed)", passed);
    free_world(&wd);
}

/* adt_comm_abort on one rank ends the whole world with its code. */
static void test_world_abort(void) {
    world wd = {.n = 2, .mode = "--child-abort"};
    run_world(&wd, 60);
    /* hydra exits with the abort code, unless a peer it killed while cleaning up is reported
     * first (seen under heavy load: 9); the code must then be in MPICH's abort line. */
    CHECK(wd.status == 7 || (wd.status != 0 && contains(wd.err, "MPI_Abort(") && contains(wd.err, ", 7)")),
          "exit status %d, expected the code given to adt_comm_abort (7)", wd.status);
    CHECK(!contains(wd.out, "abort_missed"), "rank 0 went on after rank 1 aborted");
    CHECK(wd.secs < 10, "took %.1f s", wd.secs);
    if (check_cur_failed) print_tail("stderr", wd.err, 20);
    free_world(&wd);
}

/* ---- self backend in this process ---------------------------------------------------------- */

static adt_comm *g_self_world;

static void run_self_cases(void) {
    for (int i = 0; i < N_CASES; i++) {
        check_cur_failed = 0;
        check_cur_name = CASES[i].name;
        CASES[i].fn(g_self_world);
        if (check_cur_failed) {
            check_n_failed++;
            fprintf(stderr, "FAILED self: %s\n", CASES[i].name);
        } else {
            check_n_passed++;
        }
    }
}

static void test_env_and_init(void) {
    adt_comm *w = (adt_comm *)&w;
    setenv("ADT_COMM_TIMEOUT", "abc", 1);
    CHECK_ERR(adt_comm_init(ADT_COMM_SELF, &w), ADT_ERR_ARG, "ADT_COMM_TIMEOUT='abc'");
    CHECK(w == NULL, "failed init left a world");
    setenv("ADT_COMM_TIMEOUT", "-3", 1);
    CHECK_ERR(adt_comm_init(ADT_COMM_SELF, &w), ADT_ERR_ARG, "seconds > 0");
    setenv("ADT_COMM_TIMEOUT", "2.5", 1);
    setenv("ADT_COMM_POLL", "sometimes", 1);
    CHECK_ERR(adt_comm_init(ADT_COMM_SELF, &w), ADT_ERR_ARG, "ADT_COMM_POLL='sometimes'");
    setenv("ADT_COMM_POLL", "polite", 1);
    setenv("ADT_COMM", "carrier-pigeon", 1);
    CHECK_ERR(adt_comm_init(ADT_COMM_AUTO, &w), ADT_ERR_ARG, "ADT_COMM='carrier-pigeon'");
    unsetenv("ADT_COMM");
    CHECK(!adt_comm_launched(), "this test runs without a launcher");
    CHECK_OK(adt_comm_init(ADT_COMM_AUTO, &w));
    CHECK(adt_comm_backend_of(w) == ADT_COMM_SELF, "no launcher: expected the self backend");
    CHECK(adt_comm_timeout(w) == 2.5, "timeout %g from ADT_COMM_TIMEOUT", adt_comm_timeout(w));
    adt_comm *w2 = NULL;
    CHECK_ERR(adt_comm_init(ADT_COMM_SELF, &w2), ADT_ERR_STATE, "exists already");
    CHECK_ERR(adt_comm_finalize(NULL), ADT_ERR_ARG, "expected the world");
    adt_comm *s = NULL;
    CHECK_OK(adt_comm_split(w, 3, 0, &s));
    CHECK_ERR(adt_comm_finalize(s), ADT_ERR_ARG, "expected the world");
    /* a request in flight keeps its communicator; finalize names what was left open */
    float x;
    adt_comm_req *q = NULL;
    CHECK_OK(adt_comm_irecv(s, &x, 1, ADT_F32, 0, 1, &q));
    CHECK_ERR(adt_comm_free(s), ADT_ERR_STATE, "1 operation still in flight");
    CHECK_ERR(adt_comm_finalize(w), ADT_ERR_STATE, "1 communicator was still open ('world/split(3)')");
    unsetenv("ADT_COMM_TIMEOUT");
    unsetenv("ADT_COMM_POLL");
    CHECK_OK(adt_comm_init(ADT_COMM_SELF, &w));
    CHECK(adt_comm_timeout(w) == ADT_COMM_DEFAULT_TIMEOUT_S, "default timeout %g", adt_comm_timeout(w));
    CHECK_OK(adt_comm_finalize(w));
    CHECK(adt_comm_mpi_library()[0] != 0, "no MPI library version");
}

/* Self-backend matching: in order per tag, a send may come before or after its recv. */
static void test_self_messages(void) {
    adt_comm *w = g_self_world;
    float a[3] = {1, 2, 3}, b[2] = {4, 5}, ra[3], rb[2], c[1] = {6}, rc[1];
    adt_comm_req *q1, *q2;
    CHECK_OK(adt_comm_irecv(w, rc, 1, ADT_F32, 0, 9, &q1)); /* posted before its send */
    CHECK_OK(adt_comm_send_f32(w, a, 3, 0, 7));
    CHECK_OK(adt_comm_send_f32(w, b, 2, 0, 7));
    int done = -1;
    CHECK_OK(adt_comm_test(&q1, &done));
    CHECK(done == 0, "recv done before its send");
    CHECK_OK(adt_comm_isend(w, c, 1, ADT_F32, 0, 9, &q2));
    CHECK_OK(adt_comm_wait(&q1));
    CHECK_OK(adt_comm_wait(&q2));
    CHECK(rc[0] == 6, "tag 9 got %g", rc[0]);
    CHECK_OK(adt_comm_recv_f32(w, ra, 3, 0, 7));
    CHECK_OK(adt_comm_recv_f32(w, rb, 2, 0, 7));
    CHECK(ra[0] == 1 && ra[2] == 3 && rb[0] == 4 && rb[1] == 5, "order within a tag");
    int64_t one = 1, two = 2;
    CHECK_ERR(adt_comm_alltoall(w, a, &one, ra, &two, ADT_F32), ADT_ERR_ARG, "sends 1 elements to itself but expects 2");
}

int main(int argc, char **argv) {
    if (argc > 1) {
        if (!strcmp(argv[1], "--child")) return child_main();
        if (!strcmp(argv[1], "--child-stuck")) return child_stuck();
        if (!strcmp(argv[1], "--child-watchdog")) return child_watchdog();
        if (!strcmp(argv[1], "--child-crash")) return child_crash();
        if (!strcmp(argv[1], "--child-abort")) return child_abort();
        fprintf(stderr, "usage: test_comm [--child|--child-stuck|--child-watchdog|--child-crash|--child-abort]\n");
        return 2;
    }
    ssize_t k = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (k <= 0) {
        fprintf(stderr, "cannot find this program: %s\n", strerror(errno));
        return 1;
    }
    g_self[k] = 0;
    if (check_tmpdir_make("comm")) return 1;

    RUN(test_env_and_init);
    if (adt_comm_init(ADT_COMM_SELF, &g_self_world)) {
        fprintf(stderr, "self backend: %s\n", adt_error_message());
        return 1;
    }
    run_self_cases();
    RUN(test_self_messages);
    CHECK_OK(adt_comm_finalize(g_self_world));

    /* The children: a hang ends in 20 s with an error, not at the 300 s default. */
    setenv("ADT_COMM_TIMEOUT", "20", 1);
    unsetenv("ADT_COMM_POLL");
    mpi_world_sanitizer_env();
    RUN(test_mpi_worlds);
    RUN(test_world_stuck_peer);
    RUN(test_world_watchdog);
    RUN(test_world_crash_detected);
    RUN(test_world_abort);
    rmdir(check_tmpdir());
    return check_finish();
}
