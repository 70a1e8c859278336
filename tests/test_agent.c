/*
 * test_agent.c - the per-node process layer: the PMI-1 server on scripted byte streams, and
 * real MPICH worlds started through adt_world (no mpiexec) with tests/mpi_worker.
 *
 * Worlds: 1-4 ranks in fd mode, 3 in TCP mode, 4 split over two "agents" whose key-value stores
 * are merged at each barrier (as a master would), and the failure cases: a rank SIGKILLed from
 * outside, one that exits non-zero, MPI_Abort, abort(), exit 0 without MPI_Finalize, malformed
 * PMI, a closed PMI socket on a live process, the agent itself SIGKILLed (PDEATHSIG). After every
 * world the test checks nothing is left: the test process is a child subreaper, so any orphan a
 * world left behind would become its child and be found by waitpid(-1).
 *
 * Prints MEASURE lines: launch-to-MPI_Init-done for 2 and 4 ranks, kill-to-detection, medians.
 */
#include "adtrain/agent.h"
#include "adtrain/base.h"
#include "check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

static char g_worker[4096];

/* ---------------------------------------------------------------------------------------------
 * Helpers
 */
#define MAX_EV 128
typedef struct {
    adt_world_event ev[MAX_EV];
    int n;
} evlog;

static int count_kind(const evlog *lg, adt_world_event_kind k) {
    int n = 0;
    for (int i = 0; i < lg->n; i++) n += lg->ev[i].kind == k;
    return n;
}

static const adt_world_event *find_kind(const evlog *lg, adt_world_event_kind k) {
    for (int i = 0; i < lg->n; i++)
        if (lg->ev[i].kind == k) return &lg->ev[i];
    return NULL;
}

static void drain(adt_world *w, evlog *lg) {
    adt_world_event ev;
    while (adt_world_next_event(w, &ev)) {
        if (getenv("CHECK_VERBOSE")) fprintf(stderr, "  event %d rank %d: %s\n", ev.kind, ev.rank, ev.msg);
        if (lg->n < MAX_EV) lg->ev[lg->n++] = ev;
    }
}

/* Steps the world until it is done; a world still running at the deadline is a failure (and is
 * then killed, so the test goes on). */
static void run_until_done(adt_world *w, evlog *lg, double timeout_s) {
    double end = adt_now_s() + timeout_s;
    while (adt_world_state_of(w) != ADT_WORLD_DONE && adt_now_s() < end) {
        CHECK(adt_world_step(w, 100) == ADT_OK, "%s", adt_error_message());
        drain(w, lg);
    }
    CHECK(adt_world_state_of(w) == ADT_WORLD_DONE, "world not done after %.0f s", timeout_s);
    if (adt_world_state_of(w) != ADT_WORLD_DONE) {
        adt_world_kill(w);
        for (int i = 0; i < 50 && adt_world_state_of(w) != ADT_WORLD_DONE; i++) adt_world_step(w, 100);
    }
    drain(w, lg);
}

/* Nothing may be left: no live child (worker or orphan), and dead orphans (reparented to us as
 * the subreaper) are reaped and counted. */
static int reap_leftovers(void) {
    int orphans = 0;
    double end = adt_now_s() + 3.0;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            orphans++;
            continue;
        }
        if (p < 0 && errno == ECHILD) return orphans;
        if (adt_now_s() > end) break;
        usleep(5000);
    }
    CHECK(0, "a process is still running 3 s after its world ended");
    return orphans;
}

static int pid_gone(pid_t pid) { return kill(pid, 0) < 0 && errno == ESRCH; }

/* key=value lines written by mpi_worker; value of `key` or NULL. */
static char g_file[8192];
static int read_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(g_file, 1, sizeof g_file - 1, f);
    g_file[n] = 0;
    fclose(f);
    return 0;
}

static const char *field(const char *key) {
    static char val[512];
    size_t kl = strlen(key);
    for (const char *p = g_file; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') {
            const char *v = p + kl + 1, *e = strchr(v, '\n');
            size_t n = e ? (size_t)(e - v) : strlen(v);
            if (n >= sizeof val) n = sizeof val - 1;
            memcpy(val, v, n);
            val[n] = 0;
            return val;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return NULL;
}

static long field_long(const char *key) {
    const char *v = field(key);
    return v ? strtol(v, NULL, 10) : -999999;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void rm_dir_files(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmpdir());
    if (system(cmd)) {}
}

/* ---------------------------------------------------------------------------------------------
 * PMI server on scripted streams
 */
typedef struct {
    int n_barrier, n_init, n_final, n_abort, abort_code, n_ident;
} pmi_counts;

static void count_pmi(void *ctx, const adt_pmi_event *ev) {
    pmi_counts *c = ctx;
    if (ev->kind == ADT_PMI_EV_BARRIER) c->n_barrier++;
    if (ev->kind == ADT_PMI_EV_INIT) c->n_init++;
    if (ev->kind == ADT_PMI_EV_FINALIZE) c->n_final++;
    if (ev->kind == ADT_PMI_EV_IDENTIFY) c->n_ident++;
    if (ev->kind == ADT_PMI_EV_ABORT) c->n_abort++, c->abort_code = ev->code;
}

/* Feeds `req` and returns what the server answered (and consumes it). */
static const char *ask(adt_pmi_server *s, int conn, const char *req, int *rc) {
    static char out[4096];
    *rc = adt_pmi_conn_feed(s, conn, req, strlen(req));
    const char *p;
    size_t n = adt_pmi_conn_output(s, conn, &p);
    if (n >= sizeof out) n = sizeof out - 1;
    memcpy(out, p ? p : "", n);
    out[n] = 0;
    adt_pmi_conn_consume(s, conn, n);
    return out;
}

static void test_pmi_session(void) {
    pmi_counts cnt = {0};
    adt_pmi_server *s;
    adt_pmi_config cfg = {.world_size = 2, .on_event = count_pmi, .ctx = &cnt};
    CHECK(adt_pmi_server_create(&s, &cfg) == ADT_OK, "%s", adt_error_message());
    int c0 = adt_pmi_conn_open(s, 0), c1 = adt_pmi_conn_open(s, 1), rc;
    CHECK(c0 >= 0 && c1 >= 0 && c0 != c1, "conns %d %d", c0, c1);
    CHECK(adt_pmi_conn_open(s, 1) < 0, "a second connection for rank 1 must be refused");
    CHECK(adt_pmi_conn_open(s, 2) < 0, "rank 2 is outside a world of 2");

    const char *o = ask(s, c0, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
    CHECK(rc == 0 && !strcmp(o, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"), "%s", o);
    CHECK(adt_pmi_rank_state_of(s, 0) == ADT_PMI_RANK_INIT, "state %d", adt_pmi_rank_state_of(s, 0));
    o = ask(s, c0, "cmd=get_maxes\n", &rc);
    CHECK(rc == 0 && !strcmp(o, "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n"), "%s", o);
    o = ask(s, c0, "cmd=get_my_kvsname\n", &rc);
    CHECK(!strcmp(o, "cmd=my_kvsname rc=0 kvsname=adt_kvs\n"), "%s", o);
    o = ask(s, c0, "cmd=get_universe_size\n", &rc);
    CHECK(!strcmp(o, "cmd=universe_size rc=0 size=2\n"), "%s", o);
    o = ask(s, c0, "cmd=get_appnum\n", &rc);
    CHECK(!strcmp(o, "cmd=appnum rc=0 appnum=0\n"), "%s", o);
    /* words in any order, extra blanks; '=' inside a value */
    o = ask(s, c0, "  value=x=y  key=bc-0 cmd=put\tkvsname=adt_kvs \n", &rc);
    CHECK(rc == 0 && !strcmp(o, "cmd=put_result rc=0 msg=success\n"), "%s", o);
    o = ask(s, c0, "cmd=put kvsname=adt_kvs key=bc-0 value=z\n", &rc);
    CHECK(rc == 0 && strstr(o, "rc=-1") && strstr(o, "duplicate_key"), "%s", o);
    o = ask(s, c0, "cmd=put kvsname=other key=k value=z\n", &rc);
    CHECK(rc == 0 && strstr(o, "rc=-1 msg=unknown_kvsname"), "%s", o);
    o = ask(s, c0, "cmd=put kvsname=adt_kvs key=PMI_mine value=z\n", &rc);
    CHECK(rc == 0 && strstr(o, "rc=-1 msg=reserved_key"), "%s", o);
    o = ask(s, c0, "cmd=put kvsname=adt_kvs key=empty value=\n", &rc);
    CHECK(rc == 0 && strstr(o, "rc=0"), "empty values are valid (RFC 13): %s", o);
    char big[1200];
    int k = snprintf(big, sizeof big, "cmd=put kvsname=adt_kvs key=big value=");
    memset(big + k, 'v', 1024);
    big[k + 1024] = '\n', big[k + 1025] = 0;
    o = ask(s, c0, big, &rc);
    CHECK(rc == 0 && strstr(o, "rc=-1 msg=value_too_long"), "%s", o);

    /* rank 1 reads rank 0's put, byte by byte on the wire */
    o = ask(s, c1, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
    const char *req = "cmd=get kvsname=adt_kvs key=bc-0\n";
    for (size_t i = 0; i + 1 < strlen(req); i++) {
        char b = req[i];
        CHECK(adt_pmi_conn_feed(s, c1, &b, 1) == ADT_OK, "%s", adt_error_message());
        const char *p;
        CHECK(adt_pmi_conn_output(s, c1, &p) == 0, "no reply before the newline");
    }
    o = ask(s, c1, "\n", &rc);
    CHECK(!strcmp(o, "cmd=get_result rc=0 msg=success value=x=y\n"), "%s", o);
    o = ask(s, c1, "cmd=get kvsname=adt_kvs key=nope\n", &rc);
    CHECK(rc == 0 && strstr(o, "cmd=get_result rc=-1"), "%s", o);
    o = ask(s, c1, "cmd=get kvsname=adt_kvs key=PMI_process_mapping\n", &rc);
    CHECK(!strcmp(o, "cmd=get_result rc=0 msg=success value=(vector,(0,1,2))\n"), "%s", o);
    o = ask(s, c1, "cmd=get kvsname=adt_kvs key=PMI_dead_processes\n", &rc);
    CHECK(!strcmp(o, "cmd=get_result rc=0 msg=success value=\n"), "missing PMI_ key reads empty: %s", o);
    o = ask(s, c1, "cmd=lookup_name service=x\n", &rc);
    CHECK(rc == 0 && strstr(o, "cmd=lookup_result rc=-1"), "%s", o);

    /* barrier: released only when both are in, then to both */
    o = ask(s, c0, "cmd=barrier_in\n", &rc);
    CHECK(rc == 0 && !*o && cnt.n_barrier == 0, "early barrier_out: %s", o);
    o = ask(s, c1, "cmd=barrier_in\n", &rc);
    CHECK(!strcmp(o, "cmd=barrier_out rc=0\n") && cnt.n_barrier == 1, "%s (%d)", o, cnt.n_barrier);
    o = ask(s, c0, "", &rc);
    CHECK(!strcmp(o, "cmd=barrier_out rc=0\n"), "rank 0 released: %s", o);

    o = ask(s, c0, "cmd=finalize\n", &rc);
    CHECK(!strcmp(o, "cmd=finalize_ack rc=0\n") && cnt.n_final == 1, "%s", o);
    adt_pmi_conn_close(s, c0);
    CHECK(adt_pmi_rank_state_of(s, 0) == ADT_PMI_RANK_FINALIZED, "finalized survives close");
    adt_pmi_conn_close(s, c1);
    CHECK(adt_pmi_rank_state_of(s, 1) == ADT_PMI_RANK_LOST, "EOF after init is a loss: %d",
          adt_pmi_rank_state_of(s, 1));
    CHECK(cnt.n_init == 2, "inits %d", cnt.n_init);
    CHECK(adt_pmi_kvs_count(s) == 2 && !strcmp(adt_pmi_kvs_get(s, "empty"), ""), "kvs count %d",
          adt_pmi_kvs_count(s));
    adt_pmi_server_free(s);

    char map[128];
    CHECK(adt_pmi_process_mapping(map, sizeof map, 3, (int[]){4, 4, 3}) == ADT_OK &&
          !strcmp(map, "(vector,(0,2,4),(2,1,3))"), "%s", map);
    CHECK(adt_pmi_process_mapping(map, 8, 3, (int[]){4, 4, 3}) != ADT_OK, "too small a buffer");
}

/* TCP-mode identification and a multi-agent barrier driven by hand. */
static int g_hook_epoch = -1, g_hook_first = -1;
static void hook(void *ctx, int epoch, int first_new) {
    (void)ctx;
    g_hook_epoch = epoch, g_hook_first = first_new;
}

static void test_pmi_tcp_and_hook(void) {
    pmi_counts cnt = {0};
    adt_pmi_server *s;
    adt_pmi_config cfg = {.world_size = 4, .rank_offset = 2, .local_size = 2, .kvsname = "kv7",
                          .on_event = count_pmi, .on_barrier = hook, .ctx = &cnt};
    CHECK(adt_pmi_server_create(&s, &cfg) == ADT_OK, "%s", adt_error_message());
    int a = adt_pmi_conn_open(s, -1), b = adt_pmi_conn_open(s, -1), rc;
    const char *o = ask(s, a, "cmd=initack pmiid=3\n", &rc);
    CHECK(rc == 0 && !strcmp(o, "cmd=initack\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=0\n"), "%s", o);
    CHECK(adt_pmi_conn_rank(s, a) == 3 && cnt.n_ident == 1, "rank %d", adt_pmi_conn_rank(s, a));
    o = ask(s, b, "cmd=initack pmiid=3\n", &rc);
    CHECK(rc == ADT_ERR_FORMAT && strstr(adt_error_message(), "already connected"), "%s", adt_error_message());
    adt_pmi_conn_close(s, b);
    b = adt_pmi_conn_open(s, -1);
    o = ask(s, b, "cmd=initack pmiid=1\n", &rc);
    CHECK(rc == ADT_ERR_FORMAT && strstr(adt_error_message(), "not a rank served here"), "%s",
          adt_error_message());
    adt_pmi_conn_close(s, b);
    b = adt_pmi_conn_open(s, -1);
    o = ask(s, b, "cmd=initack pmiid=2\n", &rc);
    CHECK(rc == 0, "%s", adt_error_message());
    ask(s, a, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
    ask(s, b, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
    o = ask(s, a, "cmd=put kvsname=kv7 key=from3 value=3\n", &rc);
    CHECK(strstr(o, "rc=0"), "%s", o);
    ask(s, a, "cmd=barrier_in\n", &rc);
    o = ask(s, b, "cmd=barrier_in\n", &rc);
    /* the hook holds the barrier until the "master" merged the other agent's puts */
    CHECK(!*o && g_hook_epoch == 0 && g_hook_first == 0 && cnt.n_barrier == 0, "%s %d %d", o,
          g_hook_epoch, g_hook_first);
    CHECK(adt_pmi_kvs_put(s, "from0", "zero") == ADT_OK, "%s", adt_error_message());
    CHECK(adt_pmi_kvs_put(s, "from0", "again") == ADT_ERR_ARG, "duplicate merged key refused");
    CHECK(adt_pmi_kvs_put(s, "bad key", "v") == ADT_ERR_ARG, "blank in a key refused");
    CHECK(adt_pmi_server_barrier_release(s) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_pmi_server_barrier_release(s) == ADT_ERR_STATE, "no second release");
    o = ask(s, b, "cmd=get kvsname=kv7 key=from0\n", &rc);
    CHECK(!strcmp(o, "cmd=barrier_out rc=0\ncmd=get_result rc=0 msg=success value=zero\n"), "%s", o);
    o = ask(s, a, "cmd=barrier_in\n", &rc);
    ask(s, b, "cmd=barrier_in\n", &rc);
    /* the next barrier ships only what was put since the release: nothing */
    CHECK(g_hook_epoch == 1 && g_hook_first == adt_pmi_kvs_count(s), "first_new %d of %d",
          g_hook_first, adt_pmi_kvs_count(s));
    adt_pmi_server_free(s);
}

/* Every malformed request kills its connection with a message naming rank and cause; the
 * server keeps serving the others. */
static void test_pmi_malformed(void) {
    static const struct {
        const char *input;
        size_t len;
        int init_first;
        const char *expect;
    } cases[] = {
        {"garbage\n", 0, 0, "not key=value"},
        {"cmd=get_maxes\n", 0, 0, "before init"},
        {"cmd=init pmi_version=2 pmi_subversion=0\n", 0, 0, "only PMI version 1"},
        {"cmd=init pmi_version=1\n", 0, 1, "init sent twice"},
        {"cmd=put kvsname=adt_kvs key=k\n", 0, 1, "put needs"},
        {"cmd=get key=k\n", 0, 1, "get needs"},
        {"cmd=get\x01\xff key=k\n", 0, 1, "byte 0x01 at column 8"},
        {"cmd=frobnicate\n", 0, 1, "unknown command 'frobnicate'"},
        {"mcmd=spawn\n", 0, 1, "spawn"},
        {"cmd=init pmi_version=1 cmd=x\n", 0, 0, "given twice"},
        {"cmd=get_maxes\0 more\n", 20, 1, "NUL byte"},
        {"key=value\n", 0, 1, "no cmd="},
        {"\n", 0, 1, "empty request"},
        {"=x cmd=get_maxes\n", 0, 1, "not key=value"},
        {"cmd=initack pmiid=0\n", 0, 1, "initack on a connection"},
        {"cmd=abort exitcode=x9\n", 0, 1, "not an integer"},
        {"cmd=barrier_in\ncmd=get_maxes\n", 0, 1, "waiting in a barrier"},
        {"cmd=finalize\ncmd=get_maxes\n", 0, 1, "after finalize"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        adt_pmi_server *s;
        adt_pmi_config cfg = {.world_size = 2};
        CHECK(adt_pmi_server_create(&s, &cfg) == ADT_OK, "%s", adt_error_message());
        int bad = adt_pmi_conn_open(s, 0), good = adt_pmi_conn_open(s, 1), rc;
        if (cases[i].init_first) ask(s, bad, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].input);
        rc = adt_pmi_conn_feed(s, bad, cases[i].input, len);
        CHECK(rc == ADT_ERR_FORMAT, "case %zu: rc %d", i, rc);
        CHECK(strstr(adt_error_message(), "PMI rank 0") && strstr(adt_error_message(), cases[i].expect),
              "case %zu: message '%s' should name rank 0 and '%s'", i, adt_error_message(), cases[i].expect);
        CHECK(adt_pmi_rank_state_of(s, 0) == ADT_PMI_RANK_LOST, "case %zu", i);
        CHECK(adt_pmi_conn_feed(s, bad, "cmd=get_maxes\n", 14) == ADT_ERR_STATE, "dead stays dead");
        adt_pmi_conn_close(s, bad);
        const char *o = ask(s, good, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
        CHECK(rc == 0 && strstr(o, "rc=0"), "case %zu: the other rank is still served", i);
        adt_pmi_server_free(s);
    }
    /* a line that never ends */
    adt_pmi_server *s;
    adt_pmi_config cfg = {.world_size = 1};
    adt_pmi_server_create(&s, &cfg);
    int c = adt_pmi_conn_open(s, 0), rc = 0;
    char chunk[1000];
    memset(chunk, 'a', sizeof chunk);
    for (int i = 0; i < 10 && rc == 0; i++) rc = adt_pmi_conn_feed(s, c, chunk, sizeof chunk);
    CHECK(rc == ADT_ERR_FORMAT && strstr(adt_error_message(), "longer than 4096"), "%s", adt_error_message());
    adt_pmi_server_free(s);
    /* abort: no reply, the rank is ABORTED with its code */
    pmi_counts cnt = {0};
    adt_pmi_config cfg2 = {.world_size = 1, .on_event = count_pmi, .ctx = &cnt};
    adt_pmi_server_create(&s, &cfg2);
    c = adt_pmi_conn_open(s, 0);
    ask(s, c, "cmd=init pmi_version=1 pmi_subversion=1\n", &rc);
    const char *o = ask(s, c, "cmd=abort exitcode=-7\n", &rc);
    CHECK(rc == 0 && !*o && cnt.n_abort == 1 && cnt.abort_code == -7, "%s %d", o, cnt.abort_code);
    CHECK(adt_pmi_rank_state_of(s, 0) == ADT_PMI_RANK_ABORTED, "aborted");
    adt_pmi_server_free(s);
    /* bad configuration */
    adt_pmi_config bad = {.world_size = 4, .rank_offset = 3, .local_size = 2};
    CHECK(adt_pmi_server_create(&s, &bad) == ADT_ERR_ARG && s == NULL &&
          strstr(adt_error_message(), "ranks [3, 5)"), "%s", adt_error_message());
    adt_pmi_config bad2 = {.world_size = 1, .kvsname = "a b"};
    CHECK(adt_pmi_server_create(&s, &bad2) == ADT_ERR_ARG && strstr(adt_error_message(), "kvsname"),
          "%s", adt_error_message());
}

/* ---------------------------------------------------------------------------------------------
 * Worlds of MPI workers
 */
static const char *const k_extra_env[] = {"ADT_TEST_EXTRA=hello world", NULL};

/* Starts `n` ranks of `mpi_worker allreduce`, checks success and what each rank saw; returns the
 * launch-to-MPI_Init-done time (max over ranks), or -1. g_init_only: the longest MPI_Init alone
 * (from the worker's main), without fork/exec and loading. */
static double g_init_only;
static double allreduce_world(int n, adt_pmi_mode mode) {
    if (check_tmpdir_make("agent")) return -1;
    const char *argv[] = {g_worker, "allreduce", check_tmpdir(), NULL};
    adt_world_config cfg = {.argv = argv, .local_size = n, .pmi = mode, .restart_count = 3,
                            .max_restarts = 5, .run_id = "job42", .master_port = 29555,
                            .env = k_extra_env};
    adt_world *w;
    double t_launch = adt_now_s();
    int rc = adt_world_start(&w, &cfg);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc) return -1;
    evlog lg = {.n = 0};
    run_until_done(w, &lg, 60);
    CHECK(adt_world_result_of(w) == ADT_WORLD_SUCCEEDED, "n=%d result %d: %s", n,
          adt_world_result_of(w), adt_world_first_failure(w) ? adt_world_first_failure(w)->msg : "");
    CHECK(count_kind(&lg, ADT_WORLD_EV_RANK_FAILED) == 0, "no failures");
    CHECK(count_kind(&lg, ADT_WORLD_EV_RANK_EXITED) == n, "%d exits", count_kind(&lg, ADT_WORLD_EV_RANK_EXITED));
    CHECK(count_kind(&lg, ADT_WORLD_EV_PMI_READY) == 1 && count_kind(&lg, ADT_WORLD_EV_DONE) == 1, "ready/done");
    double t_init_max = 0;
    for (int r = 0; r < n; r++) {
        const adt_world_rank *ri = adt_world_rank_info(w, r);
        CHECK(ri && !ri->running && WIFEXITED(ri->wstatus) && WEXITSTATUS(ri->wstatus) == 0, "rank %d", r);
        CHECK(pid_gone(ri->pid), "rank %d pid %d still exists", r, (int)ri->pid);
        char name[32];
        snprintf(name, sizeof name, "rank%d.txt", r);
        if (read_file(check_tmp_path(name))) {
            CHECK(0, "rank %d wrote no %s", r, name);
            continue;
        }
        /* the MPI answers against closed forms */
        CHECK(field_long("mpi_rank") == r && field_long("mpi_size") == n, "rank %d: mpi %ld/%ld", r,
              field_long("mpi_rank"), field_long("mpi_size"));
        CHECK(field_long("sum") == (long)n * (n + 1) / 2, "rank %d: sum %ld", r, field_long("sum"));
        CHECK(field_long("max") == n - 1, "rank %d: max %ld", r, field_long("max"));
        CHECK(field_long("pid") == ri->pid, "rank %d: pid %ld vs %d", r, field_long("pid"), (int)ri->pid);
        CHECK(field_long("sid") == ri->pid && field_long("pgid") == ri->pid && field_long("stdin_null") == 1,
              "rank %d: own session %ld and group %ld, stdin from /dev/null %ld", r, field_long("sid"),
              field_long("pgid"), field_long("stdin_null"));
        /* the torchrun contract */
        CHECK(field_long("RANK") == r && field_long("LOCAL_RANK") == r && field_long("ROLE_RANK") == r, "rank %d", r);
        CHECK(field_long("WORLD_SIZE") == n && field_long("LOCAL_WORLD_SIZE") == n &&
              field_long("ROLE_WORLD_SIZE") == n, "rank %d sizes", r);
        CHECK(field_long("GROUP_RANK") == 0 && field_long("GROUP_WORLD_SIZE") == 1, "rank %d group", r);
        CHECK(field("MASTER_ADDR") && !strcmp(field("MASTER_ADDR"), "127.0.0.1") &&
              field_long("MASTER_PORT") == 29555, "rank %d master", r);
        CHECK(field_long("ADT_RESTART_COUNT") == 3 && field_long("TORCHELASTIC_RESTART_COUNT") == 3 &&
              field_long("TORCHELASTIC_MAX_RESTARTS") == 5, "rank %d restarts", r);
        CHECK(field("TORCHELASTIC_RUN_ID") && !strcmp(field("TORCHELASTIC_RUN_ID"), "job42"), "run id");
        CHECK(field("ADT_TEST_EXTRA") && !strcmp(field("ADT_TEST_EXTRA"), "hello world"), "extra env");
        CHECK(n == 1 ? field("OMP_NUM_THREADS") == NULL || getenv("OMP_NUM_THREADS")
                     : field("OMP_NUM_THREADS") != NULL, "rank %d OMP_NUM_THREADS", r);
        if (mode == ADT_PMI_FD) {
            CHECK(field_long("PMI_RANK") == r && field_long("PMI_SIZE") == n && field_long("PMI_FD") >= 3,
                  "rank %d PMI fd vars", r);
            CHECK(!field("PMI_PORT") && !field("PMI_ID"), "inherited PMI_PORT/PMI_ID must be stripped");
        } else {
            CHECK(field("PMI_PORT") && !strcmp(field("PMI_PORT"), adt_world_pmi_port(w)) &&
                      field_long("PMI_ID") == r, "rank %d PMI tcp vars", r);
            CHECK(!field("PMI_FD") && !field("PMI_RANK"), "no fd-mode vars in TCP mode");
        }
        double t = atof(field("t_init")) - t_launch, t_only = atof(field("t_init")) - atof(field("t_main"));
        CHECK(t > 0 && t < 60 && t_only > 0 && t_only <= t, "rank %d init at %.3f s (%.3f s)", r, t, t_only);
        if (t > t_init_max) t_init_max = t;
        if (r == 0 || t_only > g_init_only) g_init_only = t_only;
    }
    adt_world_free(w);
    CHECK(reap_leftovers() == 0, "orphans after a clean world");
    rm_dir_files();
    return t_init_max;
}

static void test_world_sizes(void) {
    /* an inherited PMI_PORT (the agent may itself run under some mpiexec) must not leak */
    setenv("PMI_PORT", "127.0.0.1:1", 1);
    setenv("PMI_ID", "77", 1);
    for (int n = 1; n <= 4; n++) allreduce_world(n, ADT_PMI_FD);
    unsetenv("PMI_PORT");
    unsetenv("PMI_ID");
}

static void test_world_tcp(void) { allreduce_world(3, ADT_PMI_TCP); }

static void test_measure_launch(void) {
    for (int n = 2; n <= 4; n += 2) {
        double t[5], only[5];
        int k = 0;
        for (int i = 0; i < 5; i++) {
            double x = allreduce_world(n, ADT_PMI_FD);
            if (x > 0) only[k] = g_init_only, t[k++] = x;
        }
        CHECK(k == 5, "n=%d: %d of 5 runs measured", n, k);
        if (k) {
            double lo = t[0], hi = t[0];
            for (int i = 1; i < k; i++) lo = t[i] < lo ? t[i] : lo, hi = t[i] > hi ? t[i] : hi;
            printf("MEASURE launch_to_all_mpi_init n=%d median=%.3f s min=%.3f max=%.3f (%d runs)\n", n,
                   median(t, k), lo, hi, k);
            printf("MEASURE mpi_init_alone n=%d median=%.3f s (%d runs)\n", n, median(only, k), k);
        }
    }
}

/* Two "agents" (worlds of 2 ranks each) form one MPI world of 4; the loop plays the master:
 * at each barrier it ships each side's new puts to the other and releases both. */
typedef struct {
    int pending, first_new;
} side;
static void side_hook(void *ctx, int epoch, int first_new) {
    side *sd = ctx;
    (void)epoch;
    sd->pending = 1;
    sd->first_new = first_new;
}

static void test_world_two_agents(void) {
    if (check_tmpdir_make("agent2")) return;
    const char *argv[] = {g_worker, "allreduce", check_tmpdir(), NULL};
    side sd[2] = {{0, 0}, {0, 0}};
    adt_world *w[2] = {NULL, NULL};
    for (int g = 0; g < 2; g++) {
        adt_world_config cfg = {.argv = argv, .world_size = 4, .local_size = 2, .rank_offset = 2 * g,
                                .group_rank = g, .n_groups = 2, .on_barrier = side_hook, .ctx = &sd[g]};
        CHECK(adt_world_start(&w[g], &cfg) == ADT_OK, "%s", adt_error_message());
    }
    if (!w[0] || !w[1]) {
        adt_world_free(w[0]), adt_world_free(w[1]);
        return;
    }
    CHECK(!strcmp(adt_pmi_kvs_get(adt_world_pmi(w[0]), "PMI_process_mapping") ? "set" : "unset", "unset"),
          "the mapping is served, not stored");
    evlog lg[2] = {{.n = 0}, {.n = 0}};
    int barriers = 0;
    double end = adt_now_s() + 60;
    while ((adt_world_state_of(w[0]) != ADT_WORLD_DONE || adt_world_state_of(w[1]) != ADT_WORLD_DONE) &&
           adt_now_s() < end) {
        struct pollfd fds[64];
        int n0 = adt_world_pollfds(w[0], fds, 32), n1 = adt_world_pollfds(w[1], fds + n0, 32);
        poll(fds, (nfds_t)(n0 + n1), 100);
        adt_world_dispatch(w[0], fds, n0 + n1);
        adt_world_dispatch(w[1], fds, n0 + n1);
        if (sd[0].pending && sd[1].pending) {
            adt_pmi_server *p[2] = {adt_world_pmi(w[0]), adt_world_pmi(w[1])};
            int count[2] = {adt_pmi_kvs_count(p[0]), adt_pmi_kvs_count(p[1])};
            for (int g = 0; g < 2; g++)
                for (int e = sd[g].first_new; e < count[g]; e++) {
                    const char *key, *val;
                    adt_pmi_kvs_entry(p[g], e, &key, &val);
                    CHECK(adt_pmi_kvs_put(p[1 - g], key, val) == ADT_OK, "%s", adt_error_message());
                }
            for (int g = 0; g < 2; g++) {
                sd[g].pending = 0;
                CHECK(adt_pmi_server_barrier_release(p[g]) == ADT_OK, "%s", adt_error_message());
            }
            barriers++;
        }
        for (int g = 0; g < 2; g++) drain(w[g], &lg[g]);
    }
    CHECK(barriers >= 1, "barriers %d", barriers);
    for (int g = 0; g < 2; g++) {
        CHECK(adt_world_result_of(w[g]) == ADT_WORLD_SUCCEEDED, "agent %d: %d %s", g, adt_world_result_of(w[g]),
              adt_world_first_failure(w[g]) ? adt_world_first_failure(w[g])->msg : "");
        adt_world_free(w[g]);
    }
    for (int r = 0; r < 4; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank%d.txt", r);
        if (read_file(check_tmp_path(name))) {
            CHECK(0, "rank %d wrote nothing", r);
            continue;
        }
        CHECK(field_long("mpi_rank") == r && field_long("mpi_size") == 4 && field_long("sum") == 10 &&
              field_long("max") == 3, "rank %d: %ld/%ld sum %ld", r, field_long("mpi_rank"),
              field_long("mpi_size"), field_long("sum"));
        CHECK(field_long("RANK") == r && field_long("LOCAL_RANK") == r % 2 && field_long("GROUP_RANK") == r / 2 &&
              field_long("WORLD_SIZE") == 4 && field_long("LOCAL_WORLD_SIZE") == 2 &&
              field_long("GROUP_WORLD_SIZE") == 2 && field_long("PMI_RANK") == r && field_long("PMI_SIZE") == 4,
              "rank %d env", r);
    }
    CHECK(reap_leftovers() == 0, "leftovers");
    rm_dir_files();
}

/* Starts a world and runs it to the end; returns it (freed by the caller), NULL if it did not
 * start. */
static adt_world *run_cfg(const adt_world_config *cfg, evlog *lg, double timeout) {
    adt_world *w;
    if (adt_world_start(&w, cfg)) {
        CHECK(0, "%s", adt_error_message());
        return NULL;
    }
    run_until_done(w, lg, timeout);
    return w;
}

static adt_world *run_world(const char *const *argv, int n, adt_pmi_mode mode, evlog *lg, double timeout) {
    adt_world_config cfg = {.argv = argv, .local_size = n, .pmi = mode, .kill_grace_s = 1.0};
    return run_cfg(&cfg, lg, timeout);
}

/* The single failure of a world: which rank, why, with what code; every other rank gone. */
static void expect_failure(adt_world *w, const evlog *lg, int rank, adt_rank_failure why, int code) {
    CHECK(adt_world_result_of(w) == ADT_WORLD_FAILED, "result %d", adt_world_result_of(w));
    CHECK(count_kind(lg, ADT_WORLD_EV_RANK_FAILED) == 1, "%d failure events (the others are consequences)",
          count_kind(lg, ADT_WORLD_EV_RANK_FAILED));
    const adt_world_event *f = find_kind(lg, ADT_WORLD_EV_RANK_FAILED);
    CHECK(f && f->rank == rank && f->reason == why && f->code == code, "failure rank %d reason %s code %d: %s",
          f ? f->rank : -1, f ? adt_rank_failure_name(f->reason) : "-", f ? f->code : 0, f ? f->msg : "none");
    CHECK(f && adt_world_first_failure(w) && adt_world_first_failure(w)->rank == f->rank, "first failure");
    for (int l = 0; l < adt_world_local_size(w); l++)
        CHECK(pid_gone(adt_world_rank_info(w, l)->pid), "rank %d still exists", l);
}

/* One rank fails in each way a worker can; the report names it, the rest are stopped. */
static void test_rank_failures(void) {
    static const struct {
        const char *how, *victim, *code;
        int n, rank;
        adt_rank_failure reason;
        int expect_code;
    } cases[] = {
        {"exit", "1", "3", 3, 1, ADT_FAIL_EXIT, 3},
        {"mpiabort", "2", "7", 3, 2, ADT_FAIL_ABORT, 7},
        {"abort", "0", "0", 2, 0, ADT_FAIL_SIGNAL, SIGABRT},
        {"nofinalize", "1", "0", 2, 1, ADT_FAIL_NO_FINALIZE, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *argv[] = {g_worker, "fail", cases[i].how, cases[i].victim, cases[i].code, NULL};
        evlog lg = {.n = 0};
        adt_world *w = run_world(argv, cases[i].n, ADT_PMI_FD, &lg, 30);
        if (!w) continue;
        expect_failure(w, &lg, cases[i].rank, cases[i].reason, cases[i].expect_code);
        adt_world_free(w);
        CHECK(reap_leftovers() == 0, "%s: leftovers", cases[i].how);
    }
}

/* A rank that closes its PMI socket but lives on is reported after the short EOF grace. */
static void test_pmi_closed_alive(void) {
    const char *argv[] = {g_worker, "rawpmi", "close", NULL};
    evlog lg = {.n = 0};
    adt_world *w = run_world(argv, 1, ADT_PMI_FD, &lg, 30);
    if (!w) return;
    expect_failure(w, &lg, 0, ADT_FAIL_PMI_EOF, 0);
    const adt_world_event *e = find_kind(&lg, ADT_WORLD_EV_RANK_EXITED);
    CHECK(e && e->signaled && e->code == SIGTERM, "stopped by SIGTERM");
    adt_world_free(w);
    CHECK(reap_leftovers() == 0, "leftovers");
}

/* Malformed PMI from workers: each offending rank is reported (keep_going), the agent lives. */
static void test_malformed_workers(void) {
    const char *argv[] = {g_worker, "rawpmi", "bogus", NULL};
    const char *argv2[] = {g_worker, "rawpmi", "binary", NULL};
    for (int v = 0; v < 2; v++) {
        adt_world_config cfg = {.argv = v ? argv2 : argv, .local_size = 2, .keep_going = 1,
                                .kill_grace_s = 0.5};
        adt_world *w;
        if (adt_world_start(&w, &cfg)) {
            CHECK(0, "%s", adt_error_message());
            continue;
        }
        evlog lg = {.n = 0};
        double end = adt_now_s() + 20;
        while (count_kind(&lg, ADT_WORLD_EV_RANK_FAILED) < 2 && adt_now_s() < end) {
            adt_world_step(w, 100);
            drain(w, &lg);
        }
        CHECK(adt_world_state_of(w) == ADT_WORLD_RUNNING, "keep_going: still running");
        adt_world_stop(w);
        run_until_done(w, &lg, 10);
        CHECK(count_kind(&lg, ADT_WORLD_EV_RANK_FAILED) == 2, "both ranks reported");
        for (int i = 0; i < lg.n; i++)
            if (lg.ev[i].kind == ADT_WORLD_EV_RANK_FAILED)
                CHECK(lg.ev[i].reason == ADT_FAIL_PROTOCOL &&
                          strstr(lg.ev[i].msg, v ? "byte 0x01 at column 8" : "unknown command 'bogus'") &&
                          strstr(lg.ev[i].msg, "PMI rank"),
                      "msg: %s", lg.ev[i].msg);
        CHECK(adt_world_result_of(w) == ADT_WORLD_FAILED, "failed");
        adt_world_free(w);
        CHECK(reap_leftovers() == 0, "leftovers");
    }
    /* TCP: a stranger connects and talks nonsense; rejected, the world is untouched */
    const char *sl[] = {"sleep", "30", NULL};
    adt_world_config cfg = {.argv = sl, .local_size = 1, .pmi = ADT_PMI_TCP, .kill_grace_s = 0.5};
    adt_world *w;
    if (adt_world_start(&w, &cfg)) {
        CHECK(0, "%s", adt_error_message());
        return;
    }
    int port = atoi(strrchr(adt_world_pmi_port(w), ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s", strerror(errno));
    CHECK(write(fd, "hello there\n", 12) == 12, "write");
    evlog lg = {.n = 0};
    double end = adt_now_s() + 10;
    while (!count_kind(&lg, ADT_WORLD_EV_PMI_REJECTED) && adt_now_s() < end) {
        adt_world_step(w, 100);
        drain(w, &lg);
    }
    const adt_world_event *e = find_kind(&lg, ADT_WORLD_EV_PMI_REJECTED);
    CHECK(e && strstr(e->msg, "no rank yet") && strstr(e->msg, "not key=value"), "%s", e ? e->msg : "none");
    char b;
    CHECK(read(fd, &b, 1) == 0, "the connection was dropped");
    close(fd);
    CHECK(adt_world_state_of(w) == ADT_WORLD_RUNNING && count_kind(&lg, ADT_WORLD_EV_RANK_FAILED) == 0, "untouched");
    adt_world_stop(w);
    run_until_done(w, &lg, 10);
    CHECK(adt_world_result_of(w) == ADT_WORLD_STOPPED, "stopped, not failed: %d", adt_world_result_of(w));
    adt_world_free(w);
    CHECK(reap_leftovers() == 0, "leftovers");
}

/* Waits (serving the world) until every rank of a `loop` world wrote its ready file. */
static int wait_ready(adt_world *w, int n, evlog *lg) {
    double end = adt_now_s() + 30;
    while (adt_now_s() < end && adt_world_state_of(w) == ADT_WORLD_RUNNING) {
        int ready = 0;
        for (int r = 0; r < n; r++) {
            char name[32];
            snprintf(name, sizeof name, "ready%d", r);
            ready += access(check_tmp_path(name), F_OK) == 0;
        }
        if (ready == n) return 0;
        adt_world_step(w, 10);
        drain(w, lg);
    }
    CHECK(0, "ranks not ready");
    return -1;
}

static void kill_rank_runs(int n) {
    double det[5], down[5];
    int k = 0, victim_rank = n / 2;
    for (int run = 0; run < 5; run++) {
        if (check_tmpdir_make("kill")) return;
        const char *argv[] = {g_worker, "loop", check_tmpdir(), "30", NULL};
        adt_world_config cfg = {.argv = argv, .local_size = n, .kill_grace_s = 2.0};
        adt_world *w;
        if (adt_world_start(&w, &cfg)) {
            CHECK(0, "%s", adt_error_message());
            return;
        }
        evlog lg = {.n = 0};
        if (wait_ready(w, n, &lg) == 0) {
            pid_t victim = adt_world_rank_info(w, victim_rank)->pid;
            double t_kill = adt_now_s();
            kill(victim, SIGKILL);
            run_until_done(w, &lg, 20);
            expect_failure(w, &lg, victim_rank, ADT_FAIL_SIGNAL, SIGKILL);
            const adt_world_event *f = find_kind(&lg, ADT_WORLD_EV_RANK_FAILED);
            const adt_world_event *d = find_kind(&lg, ADT_WORLD_EV_DONE);
            CHECK(f && f->pid == victim, "victim pid");
            if (f && d) {
                det[k] = f->t - t_kill, down[k] = d->t - t_kill;
                CHECK(det[k] < 1.0, "detection took %.3f s", det[k]);
                CHECK(down[k] < 3.0, "teardown took %.3f s", down[k]);
                k++;
            }
            /* the survivors were stopped, not killed for failing */
            for (int i = 0; i < lg.n; i++)
                if (lg.ev[i].kind == ADT_WORLD_EV_RANK_EXITED && lg.ev[i].rank != victim_rank)
                    CHECK(lg.ev[i].reason == ADT_FAIL_NONE, "rank %d counted as failed", lg.ev[i].rank);
        }
        adt_world_free(w);
        CHECK(reap_leftovers() == 0, "leftovers");
        rm_dir_files();
    }
    if (k) {
        double d2[5];
        memcpy(d2, down, sizeof d2);
        printf("MEASURE kill_to_detection n=%d median=%.4f s (%d runs)\n", n, median(det, k), k);
        printf("MEASURE kill_to_world_down n=%d median=%.4f s (%d runs)\n", n, median(d2, k), k);
    }
}

/* A rank SIGKILLed from outside mid-allreduce: reported at once, by rank, the rest stopped. */
static void test_kill_rank(void) {
    kill_rank_runs(2);
    kill_rank_runs(4);
}

/* The agent itself is SIGKILLed: its workers must die with it (PDEATHSIG). */
static void test_pdeathsig(void) {
    if (check_tmpdir_make("pdeath")) return;
    int p[2];
    if (pipe(p)) return;
    pid_t agent = fork();
    if (agent == 0) {
        close(p[0]);
        const char *argv[] = {g_worker, "loop", check_tmpdir(), "60", NULL};
        adt_world_config cfg = {.argv = argv, .local_size = 3};
        adt_world *w;
        if (adt_world_start(&w, &cfg)) _exit(1);
        evlog lg = {.n = 0};
        if (wait_ready(w, 3, &lg)) _exit(2);
        pid_t pids[3];
        for (int l = 0; l < 3; l++) pids[l] = adt_world_rank_info(w, l)->pid;
        if (write(p[1], pids, sizeof pids) != (ssize_t)sizeof pids) _exit(3);
        for (;;) adt_world_step(w, 1000);
    }
    close(p[1]);
    pid_t pids[3];
    ssize_t got = read(p[0], pids, sizeof pids);
    close(p[0]);
    CHECK(got == (ssize_t)sizeof pids, "agent did not start its world (%zd)", got);
    kill(agent, SIGKILL);
    double t_kill = adt_now_s();
    int st;
    waitpid(agent, &st, 0);
    if (got == (ssize_t)sizeof pids) {
        /* as the subreaper, the orphaned workers are now ours to reap */
        for (int l = 0; l < 3; l++) {
            int wst = 0, done = 0;
            while (!done && adt_now_s() - t_kill < 5) {
                done = waitpid(pids[l], &wst, WNOHANG) == pids[l];
                if (!done) usleep(2000);
            }
            CHECK(done && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "worker %d (pid %d) survived its agent",
                  l, (int)pids[l]);
        }
        printf("MEASURE agent_kill_to_workers_dead n=3 %.4f s\n", adt_now_s() - t_kill);
    }
    CHECK(reap_leftovers() == 0, "leftovers");
    rm_dir_files();
}

/* ---------------------------------------------------------------------------------------------
 * Plain commands: start errors, output prefixing, CPU binding, stop with grace, group cleanup
 */
static void test_start_errors(void) {
    adt_world *w = (adt_world *)&w;
    const char *a1[] = {"/nonexistent/prog", NULL};
    adt_world_config c1 = {.argv = a1, .local_size = 2};
    CHECK(adt_world_start(&w, &c1) == ADT_ERR_ARG && w == NULL && strstr(adt_error_message(), "/nonexistent/prog"),
          "%s", adt_error_message());
    const char *a2[] = {"adt-no-such-command", NULL};
    adt_world_config c2 = {.argv = a2, .local_size = 1};
    CHECK(adt_world_start(&w, &c2) == ADT_ERR_ARG && strstr(adt_error_message(), "not found in PATH"), "%s",
          adt_error_message());
    const char *a3[] = {"/etc/hostname", NULL};
    adt_world_config c3 = {.argv = a3, .local_size = 1};
    CHECK(adt_world_start(&w, &c3) == ADT_ERR_ARG && strstr(adt_error_message(), "/etc/hostname"), "%s",
          adt_error_message());
    const char *ok[] = {"true", NULL};
    adt_world_config c4 = {.argv = ok, .local_size = 0};
    CHECK(adt_world_start(&w, &c4) == ADT_ERR_ARG && strstr(adt_error_message(), "local_size"), "%s",
          adt_error_message());
    adt_world_config c5 = {.argv = ok, .local_size = 2, .world_size = 4, .rank_offset = 3};
    CHECK(adt_world_start(&w, &c5) == ADT_ERR_ARG && strstr(adt_error_message(), "world_size 4"), "%s",
          adt_error_message());
    adt_world_config c6 = {.argv = ok, .local_size = 2, .world_size = 5, .n_groups = 2};
    CHECK(adt_world_start(&w, &c6) == ADT_ERR_ARG && strstr(adt_error_message(), "group_sizes"), "%s",
          adt_error_message());
    adt_world_config c7 = {.argv = ok, .local_size = 1, .pmi = ADT_PMI_TCP, .pmi_host = "localhost"};
    CHECK(adt_world_start(&w, &c7) == ADT_ERR_ARG && strstr(adt_error_message(), "IPv4"), "%s",
          adt_error_message());
    CHECK(reap_leftovers() == 0, "a failed start leaves nothing");
}

static void test_output_prefix(void) {
    if (check_tmpdir_make("out")) return;
    int of = open(check_tmp_path("out"), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    int ef = open(check_tmp_path("err"), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    const char *argv[] = {"sh", "-c", "echo \"out $RANK\"; echo \"err $RANK\" >&2; printf tail", NULL};
    adt_world_config cfg = {.argv = argv, .local_size = 2, .pmi = ADT_PMI_OFF, .prefix_output = 1,
                            .out_fd = of, .err_fd = ef};
    evlog lg = {.n = 0};
    adt_world *w = run_cfg(&cfg, &lg, 20);
    if (!w) return;
    CHECK(adt_world_result_of(w) == ADT_WORLD_SUCCEEDED, "PMI off: exit 0 is success (%d)", adt_world_result_of(w));
    adt_world_free(w);
    close(of), close(ef);
    read_file(check_tmp_path("out"));
    CHECK(strstr(g_file, "[rank 0] out 0\n") && strstr(g_file, "[rank 1] out 1\n") &&
          strstr(g_file, "[rank 0] tail\n") && strstr(g_file, "[rank 1] tail\n") && !strstr(g_file, "err"),
          "stdout: %s", g_file);
    read_file(check_tmp_path("err"));
    CHECK(strstr(g_file, "[rank 0] err 0\n") && strstr(g_file, "[rank 1] err 1\n") && !strstr(g_file, "out"),
          "stderr: %s", g_file);
    CHECK(reap_leftovers() == 0, "leftovers");
    rm_dir_files();
}

static void test_bind_core(void) {
    if (check_tmpdir_make("bind")) return;
    cpu_set_t set;
    sched_getaffinity(0, sizeof set, &set);
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) cpus[n++] = c;
    char script[700];
    snprintf(script, sizeof script, "grep Cpus_allowed_list /proc/self/status > %s/cpus.$RANK", check_tmpdir());
    const char *argv[] = {"sh", "-c", script, NULL};
    for (int bind = 0; bind < 2; bind++) {
        adt_world_config cfg = {.argv = argv, .local_size = 4, .pmi = ADT_PMI_OFF,
                                .bind = bind ? ADT_BIND_CORE : ADT_BIND_NONE};
        evlog lg = {.n = 0};
        adt_world *w = run_cfg(&cfg, &lg, 20);
        if (!w) return;
        CHECK(adt_world_result_of(w) == ADT_WORLD_SUCCEEDED, "result");
        for (int r = 0; r < 4; r++) {
            char name[32];
            snprintf(name, sizeof name, "cpus.%d", r);
            read_file(check_tmp_path(name));
            const char *list = strchr(g_file, ':');
            list = list ? list + 1 : "";
            while (*list == ' ' || *list == '\t') list++;
            if (bind) {
                CHECK(atoi(list) == cpus[r % n] && !strpbrk(list, ",-"), "rank %d bound to '%s', expected %d", r,
                      list, cpus[r % n]);
                CHECK(adt_world_rank_info(w, r)->cpu == cpus[r % n], "rank info cpu");
            } else {
                CHECK(n == 1 || strpbrk(list, ",-"), "unbound rank %d has '%s'", r, list);
                CHECK(adt_world_rank_info(w, r)->cpu == -1, "rank info cpu");
            }
        }
        adt_world_free(w);
    }
    CHECK(reap_leftovers() == 0, "leftovers");
    rm_dir_files();
}

static void test_stop_grace(void) {
    /* workers that ignore SIGTERM (and a grandchild that inherits that) go at the deadline */
    const char *argv[] = {"sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30", NULL};
    adt_world_config cfg = {.argv = argv, .local_size = 3, .pmi = ADT_PMI_OFF, .kill_grace_s = 0.4};
    adt_world *w;
    if (adt_world_start(&w, &cfg)) {
        CHECK(0, "%s", adt_error_message());
        return;
    }
    evlog lg = {.n = 0};
    for (int i = 0; i < 5; i++) adt_world_step(w, 20); /* let sh set its trap */
    usleep(100000);
    double t0 = adt_now_s();
    adt_world_stop(w);
    CHECK(adt_world_state_of(w) == ADT_WORLD_STOPPING, "stopping");
    run_until_done(w, &lg, 10);
    double took = adt_now_s() - t0;
    CHECK(took >= 0.35 && took < 2.0, "SIGKILL after the 0.4 s grace, took %.3f s", took);
    CHECK(adt_world_result_of(w) == ADT_WORLD_STOPPED, "result %d", adt_world_result_of(w));
    CHECK(count_kind(&lg, ADT_WORLD_EV_RANK_FAILED) == 0, "a stop is not a failure");
    for (int i = 0; i < lg.n; i++)
        if (lg.ev[i].kind == ADT_WORLD_EV_RANK_EXITED)
            CHECK(lg.ev[i].signaled && lg.ev[i].code == SIGKILL, "rank %d: %s", lg.ev[i].rank, lg.ev[i].msg);
    adt_world_free(w);
    reap_leftovers(); /* the sleeps died with their groups; they are dead orphans at most */

    /* a rank that exits 0 leaving a background child: the child dies with the rank */
    const char *argv2[] = {"sh", "-c", "sleep 30 & exit 0", NULL};
    adt_world_config cfg2 = {.argv = argv2, .local_size = 2, .pmi = ADT_PMI_OFF};
    if (!(w = run_cfg(&cfg2, &lg, 10))) return;
    CHECK(adt_world_result_of(w) == ADT_WORLD_SUCCEEDED, "result %d", adt_world_result_of(w));
    adt_world_free(w);
    CHECK(reap_leftovers() == 2, "each rank's background sleep was killed with it");

    /* PMI on, a plain command that exits 0 never did PMI: not a success */
    const char *argv3[] = {"true", NULL};
    lg.n = 0;
    w = run_world(argv3, 1, ADT_PMI_FD, &lg, 10);
    if (w) {
        expect_failure(w, &lg, 0, ADT_FAIL_NO_FINALIZE, 0);
        CHECK(strstr(find_kind(&lg, ADT_WORLD_EV_RANK_FAILED)->msg, "never called PMI init"), "msg");
        adt_world_free(w);
    }
    CHECK(reap_leftovers() == 0, "leftovers");
}

int main(void) {
    /* orphans of our worlds become our children, so the tests can see whether any are left */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    ssize_t n = readlink("/proc/self/exe", g_worker, sizeof g_worker - 32);
    if (n <= 0) return 2;
    g_worker[n] = 0;
    snprintf(strrchr(g_worker, '/') + 1, 32, "mpi_worker");
    if (access(g_worker, X_OK)) {
        fprintf(stderr, "test_agent: %s missing (make tests builds it)\n", g_worker);
        return 2;
    }
    RUN(test_pmi_session);
    RUN(test_pmi_tcp_and_hook);
    RUN(test_pmi_malformed);
    RUN(test_start_errors);
    RUN(test_output_prefix);
    RUN(test_bind_core);
    RUN(test_stop_grace);
    RUN(test_world_sizes);
    RUN(test_world_tcp);
    RUN(test_world_two_agents);
    RUN(test_rank_failures);
    RUN(test_pmi_closed_alive);
    RUN(test_malformed_workers);
    RUN(test_kill_rank);
    RUN(test_pdeathsig);
    RUN(test_measure_launch);
    return check_finish();
}
