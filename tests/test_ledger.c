/*
 * test_ledger.c - the data-sharding ledger (include/adtrain/ledger.h).
 *
 * One replica over two epochs against closed forms and against adt_sampler's order; three
 * replicas (and changing world sizes) under random interleavings, kills, rewinds to older
 * commits, revocations and expiries, over many seeds, each checked by the audit and by an
 * independent model in the test (the acknowledged reports, cut by the rewinds, counted per
 * sample id); zombies; dead letters; deadlines; a master restart; a master killed with SIGKILL
 * in the middle of a run, many times over, then reopened; and every refusal of bad input.
 */
#include "check.h"

#include <cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/data.h"
#include "adtrain/ledger.h"

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* A fresh ledger file name in the test's directory. */
static const char *ledger_path(const char *tag) {
    static int k;
    static char buf[8][64];
    char *p = buf[k % 8];
    snprintf(p, sizeof buf[0], "%s_%d.db", tag, k++);
    return check_tmp_path(p);
}

static double fake_clock(void *ctx) { return *(double *)ctx; }

/* A new ledger for `job` at `path` (with fsync at commits), or NULL after a failed CHECK. */
static adt_ledger *new_ledger(const char *path, const adt_ledger_job *job) {
    adt_ledger *L = NULL;
    int rc = adt_ledger_create(&L, path, job, 0);
    CHECK(rc == ADT_OK, "create %s: %s", path, adt_error_message());
    return L;
}

static int64_t events_now(adt_ledger *L) {
    adt_ledger_status st;
    return adt_ledger_get_status(L, &st) ? -1 : st.events;
}

/* ==== the model: what the committed model was trained on, from acknowledged calls only ====== */

typedef struct mrep {
    int64_t step, epoch, a, b;
} mrep;

typedef struct model {
    mrep *r;
    size_t n, cap;
} model;

static void model_report(model *m, int64_t step, int64_t epoch, int64_t a, int64_t b) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 256;
        m->r = realloc(m->r, m->cap * sizeof *m->r);
    }
    m->r[m->n++] = (mrep){step, epoch, a, b};
}

/* The world restarted from the checkpoint after `steps` steps: later steps never happened. */
static void model_rewind(model *m, int64_t steps) {
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->r[i].step < steps) m->r[k++] = m->r[i];
    m->n = k;
}

/* count[e * N + id]: how often sample id was trained in epoch e by the model committed after
 * `steps` steps; the order comes from adt_sample_permutation directly. */
static uint8_t *model_counts(const model *m, const adt_ledger_job *job, int64_t steps) {
    int64_t N = job->samples;
    uint8_t *c = calloc((size_t)(job->epochs * N), 1);
    int64_t *perm = malloc((size_t)N * sizeof *perm);
    for (int64_t e = 0; e < job->epochs; e++) {
        if (job->shuffle) adt_sample_permutation(perm, N, job->seed, e);
        else
            for (int64_t i = 0; i < N; i++) perm[i] = i;
        for (size_t i = 0; i < m->n; i++)
            if (m->r[i].epoch == e && m->r[i].step < steps)
                for (int64_t p = m->r[i].a; p < m->r[i].b; p++) c[e * N + perm[p]]++;
    }
    free(perm);
    return c;
}

/* ==== the simulated trainer ================================================================= */

#define MAXR 8

typedef struct held {
    int64_t id, epoch, cursor, end;
} held;

/* Messages a child process sends its parent after each call returned. */
enum { M_REPORT = 1, M_COMMIT, M_REWIND, M_DONE, M_ERROR, M_INTENT };
typedef struct msg {
    int64_t type, step, epoch, a, b;
} msg;

typedef struct sim {
    adt_ledger *L;
    adt_ledger_job job;
    uint64_t rng;
    int64_t gen, step, committed;
    int R;
    int64_t commits[4096];
    int n_commits;
    held h[MAXR][4];
    int nh[MAXR];
    model m;
    double clock;
    int fd; /* a child's pipe to its parent, -1 in process */
    /* what happened, for the test's own sanity checks */
    int64_t kills, revokes, expiries, zombies, short_steps;
} sim;

static uint64_t sim_rand(sim *s) { return adt_rng_mix64(s->rng++); }
static int64_t sim_below(sim *s, int64_t n) { return n > 0 ? (int64_t)(sim_rand(s) % (uint64_t)n) : 0; }

static void sim_send(sim *s, int64_t type, int64_t step, int64_t epoch, int64_t a, int64_t b) {
    if (s->fd < 0) return;
    msg x = {type, step, epoch, a, b};
    if (write(s->fd, &x, sizeof x) != (ssize_t)sizeof x) _exit(4);
}

/* A failed expectation: CHECK in process; in a child, tell the parent and stop. */
static int sim_expect(sim *s, int ok, const char *fmt, ...) {
    if (ok) return 1;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (s->fd >= 0) {
        fprintf(stderr, "child: %s\n", buf);
        sim_send(s, M_ERROR, 0, 0, 0, 0);
        _exit(3);
    }
    CHECK(0, "%s", buf);
    return 0;
}

static void sim_drop_held(sim *s) { memset(s->nh, 0, sizeof s->nh); }

/* Ranges a replica consumed in the current step and has not reported yet. */
typedef struct pending {
    adt_ledger_range rr[16];
    int64_t ep[16];
    int n;
} pending;

static void sim_report(sim *s, int r, pending *pd) {
    if (pd->n == 0) return;
    int rc = adt_ledger_report(s->L, s->gen, r, s->step, pd->rr, pd->n);
    if (!sim_expect(s, rc == ADT_OK, "report replica %d step %lld: %s", r, (long long)s->step, adt_error_message()))
        return;
    for (int i = 0; i < pd->n; i++) {
        model_report(&s->m, s->step, pd->ep[i], pd->rr[i].a, pd->rr[i].b);
        sim_send(s, M_REPORT, s->step, pd->ep[i], pd->rr[i].a, pd->rr[i].b);
    }
    pd->n = 0;
}

/* Drops the leases replica r consumed to their end, once reported (the ledger finished them). */
static void sim_pop_finished(sim *s, int r, const pending *pd) {
    int k = 0;
    for (int i = 0; i < s->nh[r]; i++) {
        int unreported = 0;
        for (int j = 0; j < pd->n; j++) unreported |= pd->rr[j].lease == s->h[r][i].id;
        if (s->h[r][i].cursor < s->h[r][i].end || unreported) s->h[r][k++] = s->h[r][i];
    }
    s->nh[r] = k;
}

/* Replica r's next range to consume: its first held lease with positions left, after leasing
 * one if it holds none (or, now and then, one more ahead of time). A replica at max_leases
 * reports what it consumed so far first, which finishes the leases it used up (a replica may
 * report several times in one step). 0 when nothing is left. */
static int sim_source(sim *s, int r, pending *pd, held **out) {
    sim_pop_finished(s, r, pd);
    int first = 0;
    while (first < s->nh[r] && s->h[r][first].cursor == s->h[r][first].end) first++;
    int want_lease = first == s->nh[r] || (s->nh[r] - first == 1 && sim_below(s, 10) == 0);
    if (want_lease && s->nh[r] >= s->job.max_leases && pd->n) {
        sim_report(s, r, pd);
        sim_pop_finished(s, r, pd);
        first = 0;
        while (first < s->nh[r] && s->h[r][first].cursor == s->h[r][first].end) first++;
    }
    if (want_lease && s->nh[r] < s->job.max_leases) {
        adt_ledger_lease l;
        int grant;
        int64_t max = sim_below(s, 4) == 0 ? 1 + sim_below(s, s->job.shard_size) : 0;
        int rc = adt_ledger_lease_next(s->L, s->gen, r, max, &l, &grant);
        if (!sim_expect(s, rc == ADT_OK, "lease: %s", adt_error_message())) return 0;
        if (grant == ADT_LEDGER_GRANTED) {
            sim_expect(s, l.cursor == l.start && l.end > l.start && (max == 0 || l.end - l.start <= max),
                       "lease %lld: bad range [%lld, %lld)", (long long)l.id, (long long)l.start, (long long)l.end);
            s->h[r][s->nh[r]++] = (held){l.id, l.epoch, l.start, l.end};
        }
    }
    if (first == s->nh[r]) return 0;
    *out = &s->h[r][first];
    return 1;
}

/* One training step: the global batch split at random over the replicas (shortfalls taken by
 * the others), leases and reports interleaved in random order. 0 when nothing was left. */
static int sim_step(sim *s) {
    const int64_t B = s->job.global_batch;
    int64_t cut[MAXR + 1], target[MAXR];
    for (int i = 0; i < s->R - 1; i++) cut[i] = sim_below(s, B + 1);
    cut[s->R - 1] = B;
    for (int i = 1; i < s->R - 1; i++) /* insertion sort of the cut points */
        for (int j = i; j > 0 && cut[j - 1] > cut[j]; j--) {
            int64_t t = cut[j];
            cut[j] = cut[j - 1];
            cut[j - 1] = t;
        }
    for (int i = 0; i < s->R; i++) target[i] = cut[i] - (i ? cut[i - 1] : 0);
    int order[MAXR];
    for (int i = 0; i < s->R; i++) order[i] = i;
    for (int i = s->R - 1; i > 0; i--) {
        int j = (int)sim_below(s, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    pending pd[MAXR];
    memset(pd, 0, sizeof pd);
    int64_t need = B;
    for (int pass = 0; pass < 2 && need > 0; pass++) {
        for (int k = 0; k < s->R && need > 0; k++) {
            int r = order[k];
            int64_t want = pass == 0 ? target[r] : need;
            if (want > need) want = need;
            held *h;
            while (want > 0 && sim_source(s, r, &pd[r], &h)) {
                if (pd[r].n == 16) sim_report(s, r, &pd[r]);
                int64_t take = h->end - h->cursor < want ? h->end - h->cursor : want;
                pd[r].rr[pd[r].n] = (adt_ledger_range){h->id, h->cursor, h->cursor + take};
                pd[r].ep[pd[r].n++] = h->epoch;
                h->cursor += take;
                want -= take;
                need -= take;
            }
            /* Half of the replicas report at once, between other replicas' leases; the rest
             * at the end of the step, in reverse order. */
            if (sim_below(s, 2)) sim_report(s, r, &pd[r]);
        }
    }
    for (int k = s->R - 1; k >= 0; k--) sim_report(s, order[k], &pd[order[k]]);
    for (int r = 0; r < s->R; r++) sim_pop_finished(s, r, &pd[r]);
    if (need == B) return 0;
    if (need > 0) s->short_steps++;
    s->step++;
    return 1;
}

static void sim_commit(sim *s) {
    if (s->step <= s->committed) return;
    char ck[64];
    snprintf(ck, sizeof ck, "ckpt-%lld", (long long)s->step);
    sim_send(s, M_INTENT, s->step, 0, 0, 0);
    int rc = adt_ledger_commit(s->L, s->gen, s->step, ck);
    if (!sim_expect(s, rc == ADT_OK, "commit %lld: %s", (long long)s->step, adt_error_message())) return;
    s->committed = s->step;
    if (s->n_commits < 4096) s->commits[s->n_commits++] = s->step;
    sim_send(s, M_COMMIT, s->step, 0, 0, 0);
}

/* A zombie of generation old_gen reports on one of its old leases: refused, nothing changes. */
static void sim_zombie(sim *s, int64_t old_gen, int r, const held *h) {
    if (h->cursor >= h->end) return;
    int64_t before = events_now(s->L);
    adt_ledger_range z = {h->id, h->cursor, h->cursor + 1};
    int rc = adt_ledger_report(s->L, old_gen, r, s->step, &z, 1);
    sim_expect(s, rc == ADT_ERR_STALE, "zombie report of generation %lld: rc %d (%s)", (long long)old_gen, rc,
               adt_error_message());
    if (r < s->R && old_gen != s->gen) {
        /* the same lease, claimed under the current generation */
        rc = adt_ledger_report(s->L, s->gen, r, s->step, &z, 1);
        sim_expect(s, rc == ADT_ERR_STALE, "old lease under a new generation: rc %d (%s)", rc, adt_error_message());
    }
    if (old_gen != s->gen) {
        rc = adt_ledger_commit(s->L, old_gen, s->step + 1, "zombie");
        sim_expect(s, rc == ADT_ERR_STALE, "zombie commit: rc %d (%s)", rc, adt_error_message());
    }
    sim_expect(s, events_now(s->L) == before, "a refused zombie changed the events");
    s->zombies++;
}

/* A replica dies: maybe charged to its leases, then the world restarts from the newest commit
 * (or, now and then, an older one) with 1..4 replicas. */
static void sim_kill(sim *s) {
    int victim = (int)sim_below(s, s->R);
    if (sim_below(s, 2)) {
        int64_t n = 0;
        int rc = adt_ledger_revoke_replica(s->L, s->gen, victim, "replica died", &n);
        sim_expect(s, rc == ADT_OK && n == s->nh[victim], "revoke replica %d: rc %d, %lld revoked, %d held (%s)", victim,
                   rc, (long long)n, s->nh[victim], adt_error_message());
    }
    int64_t to = s->n_commits ? s->commits[s->n_commits - 1] : 0;
    if (sim_below(s, 7) == 0) {
        int k = (int)sim_below(s, s->n_commits + 1);
        to = k == s->n_commits ? 0 : s->commits[k];
    }
    int R2 = 1 + (int)sim_below(s, 4);
    int64_t old_gen = s->gen, g2 = 0;
    held old[MAXR][4];
    int old_n[MAXR];
    memcpy(old, s->h, sizeof old);
    memcpy(old_n, s->nh, sizeof old_n);
    int old_R = s->R;
    sim_send(s, M_INTENT, to, 0, 0, 0);
    int rc = adt_ledger_rewind(s->L, s->gen, to, R2, "a replica died", &g2);
    if (!sim_expect(s, rc == ADT_OK && g2 == old_gen + 1, "rewind to %lld: %s", (long long)to, adt_error_message()))
        return;
    sim_send(s, M_REWIND, to, 0, 0, 0);
    model_rewind(&s->m, to);
    while (s->n_commits && s->commits[s->n_commits - 1] > to) s->n_commits--;
    s->gen = g2;
    s->R = R2;
    s->step = s->committed = to;
    sim_drop_held(s);
    s->kills++;
    for (int r = 0; r < old_R; r++)
        if (old_n[r]) sim_zombie(s, old_gen, r, &old[r][0]);
}

/* One replica hangs: its first lease is revoked, and its late report is refused. */
static void sim_revoke(sim *s) {
    int r = (int)sim_below(s, s->R);
    if (!s->nh[r]) return;
    held h = s->h[r][0];
    if (h.cursor == h.end) return;
    int rc = adt_ledger_revoke(s->L, h.id, "replica hung");
    if (!sim_expect(s, rc == ADT_OK, "revoke %lld: %s", (long long)h.id, adt_error_message())) return;
    memmove(&s->h[r][0], &s->h[r][1], (size_t)(s->nh[r] - 1) * sizeof(held));
    s->nh[r]--;
    s->revokes++;
    sim_zombie(s, s->gen, r, &h);
}

/* Everyone stalls past the deadline: every active lease expires. */
static void sim_expire(sim *s) {
    int64_t held_active = 0, n = 0;
    for (int r = 0; r < s->R; r++)
        for (int i = 0; i < s->nh[r]; i++) held_active += s->h[r][i].cursor < s->h[r][i].end;
    s->clock += s->job.lease_timeout_s + 1;
    int rc = adt_ledger_revoke_expired(s->L, &n);
    sim_expect(s, rc == ADT_OK && n == held_active, "expire: rc %d, %lld revoked, %lld held (%s)", rc, (long long)n,
               (long long)held_active, adt_error_message());
    sim_drop_held(s);
    s->expiries++;
}

/* Every position of every opened epoch is in exactly one place: pool, active lease, consumed
 * since the commit, committed, dead letters. */
static void sim_check_status(sim *s) {
    adt_ledger_status st;
    int rc = adt_ledger_get_status(s->L, &st);
    int64_t sum = st.pool_samples + st.leased_samples + st.uncommitted + st.committed + st.dead_samples;
    sim_expect(s, rc == ADT_OK && sum == st.epochs_opened * adt_ledger_job_positions(&s->job) &&
                      st.generation == s->gen && st.committed_steps == s->committed,
               "status: %lld positions accounted for in %lld epochs; generation %lld committed %lld", (long long)sum,
               (long long)st.epochs_opened, (long long)st.generation, (long long)st.committed_steps);
}

/* Runs the job to its end from the ledger's current state, with faults at the given rates
 * (per step, in 1/1000). */
static void sim_run(sim *s, int kill_pm, int revoke_pm, int expire_pm) {
    for (int guard = 0; guard < 100000; guard++) {
        sim_check_status(s);
        if (!sim_step(s)) break;
        int64_t u = sim_below(s, 1000);
        if (u < kill_pm) sim_kill(s);
        else if (u < kill_pm + revoke_pm) sim_revoke(s);
        else if (u < kill_pm + revoke_pm + expire_pm) sim_expire(s);
        else if (u < kill_pm + revoke_pm + expire_pm + 200) sim_commit(s);
    }
    sim_commit(s);
}

static void sim_init(sim *s, adt_ledger *L, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->L = L;
    s->fd = -1;
    s->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    s->clock = 1.7e9;
    adt_ledger_get_job(L, &s->job);
    adt_ledger_set_clock(L, fake_clock, &s->clock);
    adt_ledger_status st;
    adt_ledger_get_status(L, &st);
    s->gen = st.generation;
    s->R = st.replicas;
    s->step = s->committed = st.committed_steps;
}

/* The audit and the model agree, and everything of every epoch is trained exactly once or
 * dead-lettered (and then listed). */
static void check_final(sim *s, const char *what) {
    adt_ledger_status st;
    CHECK(adt_ledger_get_status(s->L, &st) == ADT_OK && st.done, "%s: job not done: %s", what, adt_error_message());
    CHECK(st.committed_steps == s->committed, "%s: committed %lld, model %lld", what, (long long)st.committed_steps,
          (long long)s->committed);
    adt_ledger_audit au;
    int rc = adt_ledger_audit_run(s->L, &au);
    CHECK(rc == ADT_OK, "%s: audit: %s", what, adt_error_message());
    if (rc) return;
    adt_ledger_dead *dl = NULL;
    int64_t nd = 0;
    CHECK(adt_ledger_dead_letters(s->L, &dl, &nd) == ADT_OK, "%s", adt_error_message());
    const adt_ledger_job *j = &s->job;
    const int64_t N = j->samples, P = adt_ledger_job_positions(j);
    uint8_t *cnt = model_counts(&s->m, j, s->committed);
    int64_t *perm = malloc((size_t)N * sizeof *perm);
    int bad = 0;
    for (int64_t e = 0; e < j->epochs; e++) {
        if (j->shuffle) adt_sample_permutation(perm, N, j->seed, e);
        else
            for (int64_t i = 0; i < N; i++) perm[i] = i;
        uint8_t *dead = calloc((size_t)N, 1);
        int64_t dead_n = 0, ones = 0, many = 0;
        for (int64_t k = 0; k < nd; k++)
            if (dl[k].epoch == e)
                for (int64_t p = dl[k].start; p < dl[k].end; p++) dead[perm[p]] = 1, dead_n++;
        for (int64_t p = 0; p < N; p++) {
            int64_t id = perm[p];
            uint8_t c = cnt[e * N + id];
            ones += c == 1;
            many += c > 1;
            int want = p < P && !dead[id]; /* trained exactly once: everything not dead or dropped */
            if (c != want && bad++ < 5)
                CHECK(0, "%s: epoch %lld sample %lld (position %lld) trained %d times, expected %d", what, (long long)e,
                      (long long)id, (long long)p, c, want);
            if (dead[id] && p >= P) CHECK(0, "%s: dead letter beyond the epoch", what);
        }
        const adt_ledger_epoch_audit *x = &au.epoch[e];
        CHECK(x->trained == ones && x->duplicated == many && x->missing == 0 && x->pending == 0 &&
                  x->inconsistent == 0 && x->dead_lettered == dead_n,
              "%s: epoch %lld audit trained %lld dup %lld missing %lld pending %lld dead %lld incons %lld; model ones "
              "%lld many %lld dead %lld",
              what, (long long)e, (long long)x->trained, (long long)x->duplicated, (long long)x->missing,
              (long long)x->pending, (long long)x->dead_lettered, (long long)x->inconsistent, (long long)ones,
              (long long)many, (long long)dead_n);
        free(dead);
    }
    /* The steps of the committed model: every one the global batch, but a short last one. */
    int64_t *tot = calloc((size_t)s->committed + 1, sizeof *tot);
    for (size_t i = 0; i < s->m.n; i++)
        if (s->m.r[i].step < s->committed) tot[s->m.r[i].step] += s->m.r[i].b - s->m.r[i].a;
    for (int64_t k = 0; k < s->committed; k++)
        if (tot[k] != j->global_batch && !(k == s->committed - 1 && tot[k] > 0 && tot[k] < j->global_batch))
            if (bad++ < 5) CHECK(0, "%s: step %lld trained %lld samples", what, (long long)k, (long long)tot[k]);
    CHECK(au.ok && au.complete && au.steps_bad == 0 && au.replayed_steps == s->committed,
          "%s: audit ok %d complete %d steps_bad %lld replayed %lld", what, au.ok, au.complete, (long long)au.steps_bad,
          (long long)au.replayed_steps);
    if (check_cur_failed) adt_ledger_audit_print(stderr, &au);
    free(tot);
    free(perm);
    free(cnt);
    free(dl);
    adt_ledger_audit_free(&au);
}

/* ==== tests ================================================================================= */

/* One replica, two epochs: the ids it trains are adt_sampler's, step for step, and each epoch
 * trains every id once (closed forms of the id sums without shuffling). */
static void run_single(int shuffle, int64_t N) {
    adt_ledger_job job = {.samples = N, .seed = 7, .shuffle = shuffle, .global_batch = 10, .shard_size = 30,
                          .epochs = 2, .replicas = 1};
    adt_ledger *L = NULL;
    int rc = adt_ledger_create(&L, ledger_path("single"), &job, 0);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc) return;
    adt_sampler smp;
    CHECK(adt_sampler_init(&smp, N, 10, shuffle, 7) == ADT_OK, "%s", adt_error_message());
    const int64_t P = N / 10 * 10, steps = 2 * P / 10;
    CHECK(adt_ledger_job_steps(&job) == steps, "steps %lld", (long long)adt_ledger_job_steps(&job));
    int64_t *seen = calloc((size_t)(2 * N), sizeof *seen);
    double sum[2] = {0}, sum2[2] = {0};
    adt_ledger_lease l = {0};
    int64_t step = 0, mism = 0, n_ranges = 0;
    for (;; step++) {
        adt_ledger_range rr[4];
        int64_t ids[10], want[10], n = 0, epoch_of[4];
        int nr = 0, grant = ADT_LEDGER_GRANTED;
        while (n < 10) {
            if (l.id == 0 || l.cursor == l.end) {
                rc = adt_ledger_lease_next(L, 1, 0, 0, &l, &grant);
                CHECK(rc == ADT_OK, "lease: %s", adt_error_message());
                if (rc || grant != ADT_LEDGER_GRANTED) break;
                CHECK(l.end - l.start == 30 || l.end == P, "lease [%lld,%lld)", (long long)l.start, (long long)l.end);
            }
            int64_t take = l.end - l.cursor < 10 - n ? l.end - l.cursor : 10 - n;
            rr[nr] = (adt_ledger_range){l.id, l.cursor, l.cursor + take};
            epoch_of[nr++] = l.epoch;
            CHECK(adt_ledger_sample_ids(L, l.epoch, l.cursor, l.cursor + take, ids + n) == ADT_OK, "%s",
                  adt_error_message());
            l.cursor += take;
            n += take;
        }
        if (n == 0) {
            CHECK(grant == ADT_LEDGER_DONE, "no data but grant %d", grant);
            break;
        }
        CHECK(n == 10 && step < steps, "step %lld got %lld samples", (long long)step, (long long)n);
        if (n != 10 || step >= steps) break;
        rc = adt_ledger_report(L, 1, 0, step, rr, nr);
        CHECK(rc == ADT_OK, "report step %lld: %s", (long long)step, adt_error_message());
        n_ranges += nr;
        adt_sampler_batch(&smp, step, want);
        int64_t e = epoch_of[0] == epoch_of[nr - 1] ? epoch_of[0] : -1;
        CHECK(e == step / (P / 10), "step %lld is in epoch %lld", (long long)step, (long long)e);
        for (int k = 0; k < 10 && e >= 0 && e <= 1; k++) {
            mism += ids[k] != want[k];
            seen[e * N + ids[k]]++;
            sum[e] += (double)ids[k];
            sum2[e] += (double)ids[k] * (double)ids[k];
        }
        if (step % 7 == 6) CHECK(adt_ledger_commit(L, 1, step + 1, NULL) == ADT_OK, "%s", adt_error_message());
    }
    CHECK(mism == 0, "%lld sample ids differ from adt_sampler's order", (long long)mism);
    CHECK(step == steps, "ran %lld steps, expected %lld", (long long)step, (long long)steps);
    CHECK(adt_ledger_commit(L, 1, step, "final") == ADT_OK, "%s", adt_error_message());
    for (int e = 0; e < 2; e++) {
        int64_t once = 0;
        for (int64_t i = 0; i < N; i++) once += seen[e * N + i] == 1;
        CHECK(once == P, "epoch %d: %lld ids seen once, expected %lld", e, (long long)once, (long long)P);
        if (!shuffle) { /* ids 0..P-1: sum P(P-1)/2, sum of squares (P-1)P(2P-1)/6 */
            CHECK(sum[e] == (double)P * (P - 1) / 2, "epoch %d id sum %.0f", e, sum[e]);
            CHECK(sum2[e] == (double)(P - 1) * P * (2 * P - 1) / 6, "epoch %d id square sum %.0f", e, sum2[e]);
        }
    }
    adt_ledger_audit au;
    CHECK(adt_ledger_audit_run(L, &au) == ADT_OK, "%s", adt_error_message());
    CHECK(au.ok && au.complete && au.reports == n_ranges && au.replayed_steps == steps && au.dropped_per_epoch == N - P,
          "audit ok %d complete %d reports %lld of %lld replayed %lld", au.ok, au.complete, (long long)au.reports,
          (long long)n_ranges, (long long)au.replayed_steps);
    for (int e = 0; e < 2 && au.epoch; e++)
        CHECK(au.epoch[e].trained == P && au.epoch[e].missing == 0 && au.epoch[e].duplicated == 0,
              "epoch %d: trained %lld", e, (long long)au.epoch[e].trained);
    adt_ledger_audit_free(&au);
    adt_ledger_status st;
    CHECK(adt_ledger_get_status(L, &st) == ADT_OK && st.done && st.committed == 2 * P && st.uncommitted == 0 &&
              !strcmp(st.checkpoint, "final"),
          "status done %d committed %lld checkpoint '%s'", st.done, (long long)st.committed, st.checkpoint);
    free(seen);
    adt_sampler_free(&smp);
    adt_ledger_close(L);
}

static void test_single_replica_two_epochs(void) {
    run_single(0, 1000);
    run_single(1, 1003);
}

/* Three replicas (then 1..4 after each restart), 200 random jobs with faults. */
static void test_random_trials(void) {
    int64_t kills = 0, revokes = 0, expiries = 0, zombies = 0, dead = 0, shorts = 0;
    for (uint64_t t = 0; t < 200 && !check_cur_failed; t++) {
        uint64_t r0 = adt_rng_mix64(t + 1000);
        adt_ledger_job job = {.samples = 60 + (int64_t)(r0 % 200), .seed = t, .shuffle = (int)(t % 4 != 0),
                              .global_batch = 4 + (int64_t)(r0 >> 8) % 13, .shard_size = 3 + (int64_t)(r0 >> 16) % 40,
                              .epochs = 1 + (int64_t)(r0 >> 24) % 3, .replicas = 3,
                              .max_failures = t % 5 == 0 ? 2 : 1000, .lease_timeout_s = 30};
        if (job.shard_size > job.samples) job.shard_size = job.samples;
        adt_ledger *L = NULL;
        /* No fsync: what is under test is the bookkeeping; durability has its own test. */
        int rc = adt_ledger_create(&L, ledger_path("rand"), &job, ADT_LEDGER_NOSYNC);
        CHECK(rc == ADT_OK, "trial %llu: %s", (unsigned long long)t, adt_error_message());
        if (rc) return;
        sim s;
        sim_init(&s, L, t);
        sim_run(&s, 60, 30, t % 5 == 0 ? 20 : 5);
        char what[64];
        snprintf(what, sizeof what, "trial %llu", (unsigned long long)t);
        check_final(&s, what);
        adt_ledger_status st;
        adt_ledger_get_status(L, &st);
        kills += s.kills, revokes += s.revokes, expiries += s.expiries, zombies += s.zombies, shorts += s.short_steps;
        dead += st.dead_samples;
        free(s.m.r);
        adt_ledger_close(L);
    }
    /* The faults did happen. */
    CHECK(kills > 100 && revokes > 50 && expiries > 20 && zombies > 100 && dead > 0 && shorts > 0,
          "kills %lld revokes %lld expiries %lld zombies %lld dead %lld short steps %lld", (long long)kills,
          (long long)revokes, (long long)expiries, (long long)zombies, (long long)dead, (long long)shorts);
}

/* Fencing, deterministically: every request of an ended generation or on a revoked lease. */
static void test_zombies_refused(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 2};
    adt_ledger *L = new_ledger(ledger_path("zombie"), &job);
    if (!L) return;
    adt_ledger_lease a, b, c;
    int g;
    CHECK(adt_ledger_lease_next(L, 1, 0, 0, &a, &g) == ADT_OK && g == ADT_LEDGER_GRANTED, "%s", adt_error_message());
    CHECK(adt_ledger_lease_next(L, 1, 1, 0, &b, &g) == ADT_OK && g == ADT_LEDGER_GRANTED, "%s", adt_error_message());
    adt_ledger_range ra = {a.id, 0, 5}, rb = {b.id, 20, 25};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_report(L, 1, 1, 0, &rb, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_commit(L, 1, 1, "c1") == ADT_OK, "%s", adt_error_message());
    ra = (adt_ledger_range){a.id, 5, 10};
    CHECK(adt_ledger_report(L, 1, 0, 1, &ra, 1) == ADT_OK, "%s", adt_error_message());
    int64_t gen = 0;
    CHECK(adt_ledger_rewind(L, 1, 1, 2, "replica 1 died", &gen) == ADT_OK && gen == 2, "%s", adt_error_message());
    int64_t ev = events_now(L);
    ra = (adt_ledger_range){a.id, 10, 15};
    int rc = adt_ledger_report(L, 1, 0, 1, &ra, 1);
    CHECK(rc == ADT_ERR_STALE && contains(adt_error_message(), "generation 1 has ended"), "rc %d: %s", rc,
          adt_error_message());
    /* the lease was ended: the position [5, 10) it consumed after the commit was given back */
    ra = (adt_ledger_range){a.id, 5, 10};
    rc = adt_ledger_report(L, 2, 0, 1, &ra, 1);
    CHECK(rc == ADT_ERR_STALE && contains(adt_error_message(), "generation 1"), "rc %d: %s", rc, adt_error_message());
    rc = adt_ledger_commit(L, 1, 2, "late");
    CHECK(rc == ADT_ERR_STALE, "zombie commit rc %d: %s", rc, adt_error_message());
    rc = adt_ledger_lease_next(L, 1, 0, 0, &c, &g);
    CHECK(rc == ADT_ERR_STALE && c.id == 0, "zombie lease rc %d: %s", rc, adt_error_message());
    rc = adt_ledger_rewind(L, 1, 1, 2, "the same death, seen twice", &gen);
    CHECK(rc == ADT_ERR_STALE && gen == 0, "second rewind rc %d: %s", rc, adt_error_message());
    CHECK(events_now(L) == ev, "refused calls wrote events");
    /* a lease revoked for its deadline: its holder's report is refused, its rest re-leased */
    CHECK(adt_ledger_lease_next(L, 2, 0, 0, &c, &g) == ADT_OK && c.start == 5 && c.end == 20,
          "re-lease [%lld, %lld): %s", (long long)c.start, (long long)c.end, adt_error_message());
    CHECK(adt_ledger_revoke(L, c.id, "hung") == ADT_OK, "%s", adt_error_message());
    ev = events_now(L);
    ra = (adt_ledger_range){c.id, 5, 10};
    rc = adt_ledger_report(L, 2, 0, 1, &ra, 1);
    CHECK(rc == ADT_ERR_STALE && contains(adt_error_message(), "revoked"), "rc %d: %s", rc, adt_error_message());
    CHECK(events_now(L) == ev, "refused report wrote events");
    adt_ledger_lease d;
    CHECK(adt_ledger_lease_next(L, 2, 1, 0, &d, &g) == ADT_OK && d.start == 5 && d.end == 20 && d.epoch == 0 &&
              d.shard == 0,
          "revoked rest re-leased as [%lld, %lld)", (long long)d.start, (long long)d.end);
    adt_ledger_close(L);
}

/* K failures move a shard's rest to the dead letters, for good; the job ends with a short last
 * step and a clean audit that reports them. */
static void test_dead_letters(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 2,
                          .max_failures = 2};
    adt_ledger *L = new_ledger(ledger_path("dead"), &job);
    if (!L) return;
    adt_ledger_lease a, b, c;
    int g;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_lease_next(L, 1, 1, 0, &b, &g);
    adt_ledger_range ra = {a.id, 0, 5}, rb = {b.id, 20, 25};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK && adt_ledger_report(L, 1, 1, 0, &rb, 1) == ADT_OK, "%s",
          adt_error_message());
    CHECK(adt_ledger_revoke(L, a.id, "read error") == ADT_OK, "%s", adt_error_message());
    adt_ledger_dead *dl = NULL;
    int64_t nd = -1;
    CHECK(adt_ledger_dead_letters(L, &dl, &nd) == ADT_OK && nd == 0, "one failure dead-lettered %lld ranges", (long long)nd);
    free(dl);
    CHECK(adt_ledger_lease_next(L, 1, 0, 0, &c, &g) == ADT_OK && c.shard == 0 && c.start == 5 && c.end == 20,
          "retry of shard 0: [%lld, %lld) of shard %lld", (long long)c.start, (long long)c.end, (long long)c.shard);
    CHECK(adt_ledger_revoke(L, c.id, "read error again") == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_dead_letters(L, &dl, &nd) == ADT_OK && nd == 1, "dead ranges %lld", (long long)nd);
    if (nd == 1)
        CHECK(dl[0].epoch == 0 && dl[0].shard == 0 && dl[0].start == 5 && dl[0].end == 20 && dl[0].failures == 2,
              "dead [%lld, %lld) of shard %lld, %d failures", (long long)dl[0].start, (long long)dl[0].end,
              (long long)dl[0].shard, dl[0].failures);
    free(dl);
    /* the job goes on without shard 0: 85 samples, 8 full steps and a short one of 5 */
    adt_ledger_lease hold[2] = {{0}, {0}};
    hold[1] = b;
    hold[1].cursor = 25;
    int64_t step = 1;
    for (;; step++) {
        int64_t got = 0;
        for (int r = 0; r < 2 && got < 10; r++) {
            adt_ledger_range rr[4];
            int nr = 0;
            while (got < 10) {
                if (hold[r].id == 0 || hold[r].cursor == hold[r].end) {
                    CHECK(adt_ledger_lease_next(L, 1, r, 0, &hold[r], &g) == ADT_OK, "%s", adt_error_message());
                    if (g != ADT_LEDGER_GRANTED) {
                        hold[r].id = 0;
                        break;
                    }
                    CHECK(hold[r].shard != 0, "dead shard 0 leased again");
                }
                int64_t take = hold[r].end - hold[r].cursor < 10 - got ? hold[r].end - hold[r].cursor : 10 - got;
                rr[nr++] = (adt_ledger_range){hold[r].id, hold[r].cursor, hold[r].cursor + take};
                hold[r].cursor += take;
                got += take;
            }
            if (nr) CHECK(adt_ledger_report(L, 1, r, step, rr, nr) == ADT_OK, "%s", adt_error_message());
        }
        if (got == 0) break;
        if (got < 10) {
            CHECK(step == 8 && got == 5, "short step %lld of %lld", (long long)step, (long long)got);
            /* a short step is only committed as the job's last */
            step++;
            break;
        }
        if (step == 4) {
            int rc = adt_ledger_commit(L, 1, step + 1, NULL);
            CHECK(rc == ADT_OK, "%s", adt_error_message());
        }
    }
    CHECK(step == 9, "steps %lld", (long long)step);
    CHECK(adt_ledger_commit(L, 1, step, "end") == ADT_OK, "commit with the short last step: %s", adt_error_message());
    adt_ledger_audit au;
    CHECK(adt_ledger_audit_run(L, &au) == ADT_OK, "%s", adt_error_message());
    CHECK(au.ok && au.complete && au.epoch[0].dead_lettered == 15 && au.epoch[0].trained == 85 &&
              au.dead_letter_ranges >= 1,
          "audit ok %d complete %d dead %lld trained %lld", au.ok, au.complete, (long long)au.epoch[0].dead_lettered,
          (long long)au.epoch[0].trained);
    adt_ledger_audit_free(&au);
    adt_ledger_close(L);
}

/* A rewind that hands back part of a dead shard sends it to the dead letters, not to the pool. */
static void test_dead_letters_rewind(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 1,
                          .max_failures = 1};
    adt_ledger *L = new_ledger(ledger_path("deadrw"), &job);
    if (!L) return;
    adt_ledger_lease a;
    int g;
    int64_t gen;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_range ra = {a.id, 0, 10};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_revoke(L, a.id, "poison") == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_rewind(L, 1, 0, 1, "restart", &gen) == ADT_OK, "%s", adt_error_message());
    adt_ledger_dead *dl = NULL;
    int64_t nd = 0;
    CHECK(adt_ledger_dead_letters(L, &dl, &nd) == ADT_OK && nd == 1 && dl[0].start == 0 && dl[0].end == 20,
          "dead ranges %lld: [%lld, %lld)", (long long)nd, nd ? (long long)dl[0].start : -1LL,
          nd ? (long long)dl[0].end : -1LL);
    free(dl);
    adt_ledger_audit au;
    CHECK(adt_ledger_audit_run(L, &au) == ADT_OK && au.ok && au.epoch[0].dead_lettered == 20 &&
              au.epoch[0].pending == 80 && au.retrained == 10,
          "audit ok %d dead %lld pending %lld retrained %lld", au.ok, (long long)au.epoch[0].dead_lettered,
          (long long)au.epoch[0].pending, (long long)au.retrained);
    adt_ledger_audit_free(&au);
    adt_ledger_close(L);
}

/* Deadlines: only leases not reported in time are revoked; their rest is leased again. */
static void test_deadlines(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 2,
                          .lease_timeout_s = 10};
    adt_ledger *L = new_ledger(ledger_path("deadline"), &job);
    if (!L) return;
    double now = 1000;
    adt_ledger_set_clock(L, fake_clock, &now);
    adt_ledger_lease a, b, c;
    int g;
    int64_t n = -1;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_lease_next(L, 1, 1, 0, &b, &g);
    CHECK(a.deadline == 1010 && b.deadline == 1010, "deadlines %g %g", a.deadline, b.deadline);
    now = 1006;
    adt_ledger_range ra = {a.id, 0, 10};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK, "%s", adt_error_message());
    now = 1009.5;
    CHECK(adt_ledger_revoke_expired(L, &n) == ADT_OK && n == 0, "revoked %lld before any deadline", (long long)n);
    now = 1012;
    CHECK(adt_ledger_revoke_expired(L, &n) == ADT_OK && n == 1, "revoked %lld at 1012", (long long)n);
    adt_ledger_lease *ls = NULL;
    int64_t nl = 0;
    CHECK(adt_ledger_leases(L, 1, &ls, &nl) == ADT_OK && nl == 1 && ls[0].id == a.id && ls[0].deadline == 1016,
          "active %lld", (long long)nl);
    free(ls);
    adt_ledger_range rb = {b.id, 20, 30};
    CHECK(adt_ledger_report(L, 1, 1, 0, &rb, 1) == ADT_ERR_STALE, "late report after expiry");
    CHECK(adt_ledger_lease_next(L, 1, 1, 0, &c, &g) == ADT_OK && c.start == 20 && c.end == 40, "re-lease [%lld,%lld)",
          (long long)c.start, (long long)c.end);
    now = 1017;
    CHECK(adt_ledger_revoke_expired(L, &n) == ADT_OK && n == 1, "revoked %lld at 1017", (long long)n);
    adt_ledger_close(L);
}

/* The master restarts (closed, or killed, then reopened): same generation, same leases, fresh
 * deadlines; a second writer is refused while one is open; readers may look. */
static void test_master_restart(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 1,
                          .lease_timeout_s = 10};
    const char *path = ledger_path("restart");
    adt_ledger *L = NULL, *L2 = NULL, *R = NULL;
    CHECK(adt_ledger_create(&L, path, &job, 0) == ADT_OK, "%s", adt_error_message());
    if (!L) return;
    /* The lease's deadline is due long before the (real-time) restart: unless the restart
     * renews it, the revocation below takes it. */
    double now = adt_wall_s() - 1000;
    adt_ledger_set_clock(L, fake_clock, &now);
    adt_ledger_lease a;
    int g;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_range ra = {a.id, 0, 10};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK, "%s", adt_error_message());
    int rc = adt_ledger_open(&L2, path, 0);
    CHECK(rc == ADT_ERR_STATE && contains(adt_error_message(), "another process") && !L2, "second writer rc %d: %s", rc,
          adt_error_message());
    rc = adt_ledger_open(&R, path, ADT_LEDGER_READONLY);
    CHECK(rc == ADT_OK, "reader: %s", adt_error_message());
    adt_ledger_status st;
    if (R) {
        CHECK(adt_ledger_get_status(R, &st) == ADT_OK && st.uncommitted == 10 && st.active_leases == 1, "reader status");
        CHECK(adt_ledger_report(R, 1, 0, 1, &ra, 1) == ADT_ERR_STATE, "a reader wrote");
    }
    adt_ledger_close(L);
    CHECK(adt_ledger_open(&L, path, 0) == ADT_OK, "reopen: %s", adt_error_message());
    if (!L) return;
    now += 100; /* past the old deadline, before the renewed one */
    adt_ledger_set_clock(L, fake_clock, &now);
    int64_t n = -1;
    CHECK(adt_ledger_revoke_expired(L, &n) == ADT_OK && n == 0, "a restart expired %lld leases", (long long)n);
    CHECK(adt_ledger_get_status(L, &st) == ADT_OK && st.generation == 1 && st.active_leases == 1 && st.uncommitted == 10,
          "after restart: generation %lld active %lld uncommitted %lld", (long long)st.generation,
          (long long)st.active_leases, (long long)st.uncommitted);
    ra = (adt_ledger_range){a.id, 10, 20};
    CHECK(adt_ledger_report(L, 1, 0, 1, &ra, 1) == ADT_OK, "the lease carries on: %s", adt_error_message());
    CHECK(adt_ledger_commit(L, 1, 2, "c") == ADT_OK, "%s", adt_error_message());
    if (R) {
        CHECK(adt_ledger_get_status(R, &st) == ADT_OK && st.committed_steps == 2 && st.committed == 20,
              "reader sees committed %lld", (long long)st.committed_steps);
        adt_ledger_close(R);
    }
    adt_ledger_close(L);
}

/* The boot guard: a ledger last written on another boot of the host may have lost un-fsynced
 * leases, so opening it starts a new generation from the commit in force. */
static void test_boot_guard(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 2};
    const char *path = ledger_path("boot");
    adt_ledger *L = new_ledger(path, &job);
    if (!L) return;
    adt_ledger_lease a;
    int g;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_range ra = {a.id, 0, 10};
    CHECK(adt_ledger_report(L, 1, 0, 0, &ra, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ledger_commit(L, 1, 1, "c1") == ADT_OK, "%s", adt_error_message());
    ra = (adt_ledger_range){a.id, 10, 15};
    CHECK(adt_ledger_report(L, 1, 0, 1, &ra, 1) == ADT_OK, "%s", adt_error_message());
    adt_ledger_close(L);
    /* the same boot: nothing changes */
    CHECK(adt_ledger_open(&L, path, 0) == ADT_OK, "%s", adt_error_message());
    adt_ledger_status st;
    CHECK(L && adt_ledger_get_status(L, &st) == ADT_OK && st.generation == 1 && st.uncommitted == 5, "same boot");
    adt_ledger_close(L);
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    CHECK(sqlite3_exec(db, "UPDATE job SET boot_id = 'an-earlier-boot'", NULL, NULL, NULL) == SQLITE_OK, "%s",
          sqlite3_errmsg(db));
    sqlite3_close(db);
    CHECK(adt_ledger_open(&L, path, 0) == ADT_OK, "%s", adt_error_message());
    if (!L) return;
    CHECK(adt_ledger_get_status(L, &st) == ADT_OK && st.generation == 2 && st.committed_steps == 1 &&
              st.uncommitted == 0 && st.active_leases == 0 && st.pool_samples == 90,
          "after another boot: generation %lld uncommitted %lld active %lld pool %lld", (long long)st.generation,
          (long long)st.uncommitted, (long long)st.active_leases, (long long)st.pool_samples);
    ra = (adt_ledger_range){a.id, 15, 20};
    CHECK(adt_ledger_report(L, 1, 0, 1, &ra, 1) == ADT_ERR_STALE, "a replica of the old generation was not fenced");
    adt_ledger_close(L);
}

/* One handle shared by three threads, one replica each: every call is serialised, nothing is
 * lost or doubled. Shards of one step's share and one lease at a time, so that no thread can
 * run out of data while another holds more than it needs. */
typedef struct thread_arg {
    adt_ledger *L;
    int replica;
    int64_t steps, share;
    int failures;
} thread_arg;

static void *replica_thread(void *p) {
    thread_arg *t = p;
    for (int64_t step = 0; step < t->steps; step++) {
        adt_ledger_lease l;
        int g;
        if (adt_ledger_lease_next(t->L, 1, t->replica, 0, &l, &g) || g != ADT_LEDGER_GRANTED ||
            l.end - l.start != t->share) {
            t->failures++;
            break;
        }
        adt_ledger_range r = {l.id, l.start, l.end};
        if (adt_ledger_report(t->L, 1, t->replica, step, &r, 1)) {
            t->failures++;
            break;
        }
    }
    return NULL;
}

static void test_threads_share_a_handle(void) {
    adt_ledger_job job = {.samples = 600, .seed = 3, .shuffle = 1, .global_batch = 12, .shard_size = 4, .epochs = 2,
                          .replicas = 3, .max_leases = 1};
    adt_ledger *L = new_ledger(ledger_path("threads"), &job);
    if (!L) return;
    const int64_t steps = adt_ledger_job_steps(&job);
    pthread_t th[3];
    thread_arg ta[3];
    for (int r = 0; r < 3; r++) {
        ta[r] = (thread_arg){L, r, steps, 4, 0};
        pthread_create(&th[r], NULL, replica_thread, &ta[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) CHECK(ta[r].failures == 0, "replica %d: %s", r, adt_error_message());
    CHECK(adt_ledger_commit(L, 1, steps, NULL) == ADT_OK, "%s", adt_error_message());
    adt_ledger_audit au;
    CHECK(adt_ledger_audit_run(L, &au) == ADT_OK && au.ok && au.complete && au.epoch[0].trained == 600 &&
              au.epoch[1].trained == 600,
          "audit ok %d complete %d", au.ok, au.complete);
    adt_ledger_audit_free(&au);
    adt_ledger_close(L);
}

/* ---- kill -9 ------------------------------------------------------------------------------ */

/* Child: opens the ledger as a restarted master would, restarts the world from the commit in
 * force, and trains on with faults, acknowledging every call to the parent. */
static void kill_child(const char *path, int fd, uint64_t seed) {
    adt_ledger *L = NULL;
    if (adt_ledger_open(&L, path, 0) != ADT_OK) {
        fprintf(stderr, "child: open: %s\n", adt_error_message());
        _exit(5);
    }
    sim s;
    sim_init(&s, L, seed);
    s.fd = fd;
    s.clock = adt_wall_s(); /* the deadlines the restart renewed are in real time */
    int64_t g2;
    int R2 = 1 + (int)sim_below(&s, 4);
    sim_send(&s, M_INTENT, s.committed, 0, 0, 0);
    if (adt_ledger_rewind(L, s.gen, s.committed, R2, "master restarted", &g2) != ADT_OK) {
        fprintf(stderr, "child: rewind: %s\n", adt_error_message());
        _exit(6);
    }
    s.gen = g2;
    s.R = R2;
    sim_send(&s, M_REWIND, s.committed, 0, 0, 0);
    sim_run(&s, 40, 20, 5);
    sim_send(&s, M_DONE, 0, 0, 0, 0);
    adt_ledger_close(L);
    _exit(0);
}

static void test_kill9_durability(void) {
    adt_ledger_job job = {.samples = 3000, .seed = 11, .shuffle = 1, .global_batch = 16, .shard_size = 48,
                          .epochs = 2, .replicas = 3, .max_failures = 1000, .lease_timeout_s = 30};
    const char *path = ledger_path("kill");
    adt_ledger *L = new_ledger(path, &job);
    if (!L) return;
    adt_ledger_close(L);
    model m = {0};
    int64_t acked_commit = 0, kills = 0, msgs_total = 0, in_flight_seen = 0;
    uint64_t rng = 99;
    int finished = 0;
    for (int round = 0; round < 60 && !finished && !check_cur_failed; round++) {
        int p[2];
        if (pipe(p)) {
            CHECK(0, "pipe");
            break;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            kill_child(path, p[1], 1000 + (uint64_t)round);
        }
        close(p[1]);
        /* Let it run for a random number of acknowledged calls, then kill it mid-flight. */
        int64_t budget = 5 + (int64_t)(adt_rng_mix64(rng++) % 100), got = 0, in_flight = -1;
        int killed = 0, child_error = 0;
        msg x;
        while (read(p[0], &x, sizeof x) == (ssize_t)sizeof x) {
            got++;
            if (x.type == M_REPORT) model_report(&m, x.step, x.epoch, x.a, x.b);
            else if (x.type == M_INTENT) in_flight = x.step; /* a commit or rewind to this step */
            else if (x.type == M_COMMIT) acked_commit = x.step, in_flight = -1;
            else if (x.type == M_REWIND) {
                model_rewind(&m, x.step);
                acked_commit = x.step;
                in_flight = -1;
            } else if (x.type == M_DONE) finished = 1;
            else if (x.type == M_ERROR) child_error = 1;
            if (!killed && got == budget && round < 59) {
                usleep((useconds_t)(adt_rng_mix64(rng++) % 2000));
                kill(pid, SIGKILL);
                killed = 1;
            }
        }
        close(p[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        msgs_total += got;
        CHECK(!child_error, "round %d: the child found an error (stderr above)", round);
        if (killed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) kills++, finished = 0;
        else CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && finished, "round %d: child status %d", round, status);

        /* The restarted master finds the last state that completed. */
        int rc = adt_ledger_open(&L, path, 0);
        CHECK(rc == ADT_OK, "round %d: reopen after kill: %s", round, adt_error_message());
        if (rc) break;
        sqlite3 *db = NULL;
        char ok[32] = "";
        sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
            snprintf(ok, sizeof ok, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        sqlite3_close(db);
        CHECK(!strcmp(ok, "ok"), "round %d: integrity_check says '%s'", round, ok);
        adt_ledger_status s;
        CHECK(adt_ledger_get_status(L, &s) == ADT_OK, "%s", adt_error_message());
        /* the commit in force is the last acknowledged one, or the one in flight at the kill */
        CHECK(s.committed_steps == acked_commit || s.committed_steps == in_flight,
              "round %d: committed %lld, acknowledged %lld, in flight %lld", round, (long long)s.committed_steps,
              (long long)acked_commit, (long long)in_flight);
        in_flight_seen += in_flight >= 0 && s.committed_steps == in_flight && in_flight != acked_commit;
        model_rewind(&m, s.committed_steps);
        acked_commit = s.committed_steps;
        adt_ledger_audit au;
        CHECK(adt_ledger_audit_run(L, &au) == ADT_OK && au.ok, "round %d: audit after kill: %s", round,
              adt_error_message());
        /* the audit's committed samples are the model's */
        uint8_t *cnt = model_counts(&m, &job, s.committed_steps);
        for (int64_t e = 0; e < job.epochs && au.epoch; e++) {
            int64_t ones = 0, many = 0;
            for (int64_t i = 0; i < job.samples; i++) ones += cnt[e * job.samples + i] == 1, many += cnt[e * job.samples + i] > 1;
            CHECK(au.epoch[e].trained == ones && au.epoch[e].duplicated == 0 && many == 0 && au.epoch[e].missing == 0,
                  "round %d epoch %lld: audit trained %lld, model %lld (dup %lld)", round, (long long)e,
                  (long long)au.epoch[e].trained, (long long)ones, (long long)many);
        }
        if (check_cur_failed) adt_ledger_audit_print(stderr, &au);
        free(cnt);
        adt_ledger_audit_free(&au);
        if (finished) {
            sim sm;
            sim_init(&sm, L, 0);
            sm.m = m;
            sm.committed = s.committed_steps;
            check_final(&sm, "after the kills");
        }
        adt_ledger_close(L);
    }
    CHECK(finished && kills >= 20, "finished %d after %lld kills (%lld acknowledged calls)", finished, (long long)kills,
          (long long)msgs_total);
    if (getenv("CHECK_VERBOSE"))
        fprintf(stderr, "kill -9: %lld kills, %lld acknowledged calls, %lld commits/rewinds found done but unacknowledged\n",
                (long long)kills, (long long)msgs_total, (long long)in_flight_seen);
    free(m.r);
}

/* ---- bad input ---------------------------------------------------------------------------- */

#define REFUSED(call, code, text)                                                                                   \
    do {                                                                                                            \
        int64_t ev0_ = events_now(L);                                                                               \
        int rc_ = (call);                                                                                           \
        CHECK(rc_ == (code) && contains(adt_error_message(), text), "%s: rc %d, message '%s', expected %d with '%s'", \
              #call, rc_, adt_error_message(), code, text);                                                         \
        CHECK(events_now(L) == ev0_, "%s changed the ledger", #call);                                               \
    } while (0)

static void test_bad_reports_and_commits(void) {
    adt_ledger_job job = {.samples = 100, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 2};
    adt_ledger *L = new_ledger(ledger_path("bad"), &job);
    if (!L) return;
    adt_ledger_lease a, b, c;
    int g;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g); /* [0, 20)  */
    adt_ledger_lease_next(L, 1, 1, 0, &b, &g); /* [20, 40) */
    adt_ledger_range r1 = {a.id, 0, 6}, r2 = {b.id, 20, 24};
    CHECK(adt_ledger_report(L, 1, 0, 0, &r1, 1) == ADT_OK, "%s", adt_error_message());
    adt_ledger_range x;
    x = (adt_ledger_range){a.id, 0, 6};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "reported already");
    x = (adt_ledger_range){a.id, 3, 8};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "reported already");
    x = (adt_ledger_range){a.id, 8, 10};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "leaves a gap");
    x = (adt_ledger_range){a.id, 6, 21};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "outside the lease [0, 20)");
    x = (adt_ledger_range){a.id, 6, 6};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "empty or reversed");
    x = (adt_ledger_range){b.id, 20, 22};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "belongs to replica 1, not 0");
    x = (adt_ledger_range){999, 0, 1};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "lease 999 does not exist");
    x = (adt_ledger_range){a.id, 6, 8};
    REFUSED(adt_ledger_report(L, 1, 2, 1, &x, 1), ADT_ERR_ARG, "replica 2 out of range");
    REFUSED(adt_ledger_report(L, 7, 0, 1, &x, 1), ADT_ERR_ARG, "generation 7 is unknown");
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 0), ADT_ERR_ARG, "0 ranges");
    REFUSED(adt_ledger_report(L, 1, 0, 10, &x, 1), ADT_ERR_ARG, "beyond the job's 10 steps");
    /* over the global batch: 6 + 5 at step 0 */
    x = (adt_ledger_range){b.id, 20, 25};
    REFUSED(adt_ledger_report(L, 1, 1, 0, &x, 1), ADT_ERR_ARG, "above the global batch 10");
    /* all or nothing: a good range then a bad one */
    adt_ledger_range two[2] = {{a.id, 6, 8}, {a.id, 9, 10}};
    REFUSED(adt_ledger_report(L, 1, 0, 1, two, 2), ADT_ERR_ARG, "leaves a gap");
    /* commit of an incomplete step */
    REFUSED(adt_ledger_commit(L, 1, 1, NULL), ADT_ERR_ARG, "step 0 consumed 6 samples, expected the global batch 10");
    CHECK(adt_ledger_report(L, 1, 1, 0, &r2, 1) == ADT_OK, "%s", adt_error_message());
    REFUSED(adt_ledger_commit(L, 1, 2, NULL), ADT_ERR_ARG, "step 1 has no report");
    REFUSED(adt_ledger_commit(L, 1, 0, NULL), ADT_ERR_ARG, "not above the commit in force");
    CHECK(adt_ledger_commit(L, 1, 1, NULL) == ADT_OK, "%s", adt_error_message());
    REFUSED(adt_ledger_commit(L, 1, 1, NULL), ADT_ERR_ARG, "not above the commit in force");
    /* steps out of order, and committed steps */
    x = (adt_ledger_range){a.id, 6, 8};
    CHECK(adt_ledger_report(L, 1, 0, 2, &x, 1) == ADT_OK, "%s", adt_error_message());
    x = (adt_ledger_range){a.id, 8, 9};
    REFUSED(adt_ledger_report(L, 1, 0, 1, &x, 1), ADT_ERR_ARG, "out of order: replica 0 already reported step 2");
    REFUSED(adt_ledger_report(L, 1, 0, 0, &x, 1), ADT_ERR_ARG, "step 0 is committed already");
    /* rewinds to steps that are not commits in force */
    int64_t gen = 0;
    REFUSED(adt_ledger_rewind(L, 1, 2, 2, "x", &gen), ADT_ERR_ARG, "not a commit in force");
    REFUSED(adt_ledger_rewind(L, 1, 1, 0, "x", &gen), ADT_ERR_ARG, "replicas 0");
    REFUSED(adt_ledger_rewind(L, 2, 1, 2, "x", &gen), ADT_ERR_ARG, "generation 2 is unknown");
    /* leases: too many held, bad sizes */
    adt_ledger_lease_next(L, 1, 0, 0, &c, &g);
    REFUSED(adt_ledger_lease_next(L, 1, 0, 0, &c, &g), ADT_ERR_STATE, "already holds 2 active leases");
    REFUSED(adt_ledger_lease_next(L, 1, 1, -1, &c, &g), ADT_ERR_ARG, "max_samples -1");
    REFUSED(adt_ledger_revoke(L, 12345, NULL), ADT_ERR_ARG, "lease 12345 does not exist");
    REFUSED(adt_ledger_sample_ids(L, 1, 0, 1, NULL), ADT_ERR_ARG, "epoch 1 out of range");
    REFUSED(adt_ledger_sample_ids(L, 0, 5, 101, NULL), ADT_ERR_ARG, "outside the epoch's [0, 100)");
    char big[300];
    memset(big, 'c', sizeof big - 1);
    big[sizeof big - 1] = 0;
    REFUSED(adt_ledger_commit(L, 1, 3, big), ADT_ERR_ARG, "longer than 255");
    adt_ledger_audit au;
    CHECK(adt_ledger_audit_run(L, &au) == ADT_OK && au.ok && !au.complete, "audit after refusals ok %d", au.ok);
    adt_ledger_audit_free(&au);
    adt_ledger_close(L);
}

static void test_bad_jobs_and_files(void) {
    adt_ledger *L = NULL;
    struct {
        adt_ledger_job job;
        const char *text;
    } bad[] = {
        {{.samples = 0, .global_batch = 1, .shard_size = 1, .epochs = 1, .replicas = 1}, "samples 0"},
        {{.samples = 10, .global_batch = 11, .shard_size = 1, .epochs = 1, .replicas = 1}, "global_batch 11"},
        {{.samples = 10, .global_batch = 2, .shard_size = 0, .epochs = 1, .replicas = 1}, "shard_size 0"},
        {{.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 0, .replicas = 1}, "epochs 0"},
        {{.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 1, .replicas = 0}, "replicas 0"},
        {{.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 1, .replicas = 1, .shuffle = 2}, "shuffle 2"},
        {{.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 1, .replicas = 1, .max_failures = -1},
         "max_failures -1"},
        {{.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 1, .replicas = 1, .lease_timeout_s = -1},
         "lease_timeout_s -1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = ledger_path("badjob");
        int rc = adt_ledger_create(&L, path, &bad[i].job, 0);
        CHECK(rc == ADT_ERR_ARG && contains(adt_error_message(), bad[i].text) && !L && access(path, F_OK) != 0,
              "job %zu: rc %d '%s'", i, rc, adt_error_message());
    }
    adt_ledger_job job = {.samples = 10, .global_batch = 2, .shard_size = 2, .epochs = 1, .replicas = 1};
    const char *missing = check_tmp_path("nope/ledger.db");
    int rc = adt_ledger_open(&L, missing, 0);
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), "nope/ledger.db"), "rc %d %s", rc, adt_error_message());
    const char *text = check_tmp_path("text.db");
    FILE *f = fopen(text, "w");
    fputs("this is not a database, but it is long enough to have a header of sorts.\n", f);
    fclose(f);
    rc = adt_ledger_open(&L, text, ADT_LEDGER_READONLY);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "text.db"), "rc %d %s", rc, adt_error_message());
    rc = adt_ledger_create(&L, text, &job, 0);
    CHECK(rc == ADT_ERR_STATE && contains(adt_error_message(), "exists"), "create over a file: rc %d %s", rc,
          adt_error_message());
    const char *other = check_tmp_path("other.db");
    sqlite3 *db = NULL;
    sqlite3_open(other, &db);
    sqlite3_exec(db, "CREATE TABLE job(x); INSERT INTO job VALUES (1);", NULL, NULL, NULL);
    sqlite3_close(db);
    rc = adt_ledger_open(&L, other, 0);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "not an adtrain ledger"), "rc %d %s", rc,
          adt_error_message());
    /* a ledger whose job row was damaged */
    const char *dam = ledger_path("damaged");
    CHECK(adt_ledger_create(&L, dam, &job, 0) == ADT_OK, "%s", adt_error_message());
    adt_ledger_close(L);
    sqlite3_open(dam, &db);
    sqlite3_exec(db, "UPDATE job SET shard_size = 0", NULL, NULL, NULL);
    sqlite3_close(db);
    rc = adt_ledger_open(&L, dam, 0);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "shard_size 0") && contains(adt_error_message(), dam),
          "damaged job: rc %d %s", rc, adt_error_message());
}

/* The events as JSON lines: one per row, in order, every kind present, and the incremental
 * export picks up where it left. */
static void test_events_export(void) {
    adt_ledger_job job = {.samples = 40, .global_batch = 10, .shard_size = 10, .epochs = 1, .replicas = 1,
                          .max_failures = 1};
    adt_ledger *L = new_ledger(ledger_path("events"), &job);
    if (!L) return;
    adt_ledger_lease a, b;
    int g;
    int64_t gen;
    adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
    adt_ledger_range r = {a.id, 0, 10};
    adt_ledger_report(L, 1, 0, 0, &r, 1);
    adt_ledger_commit(L, 1, 1, "ck \"1\"");
    adt_ledger_lease_next(L, 1, 0, 0, &b, &g);
    adt_ledger_revoke(L, b.id, "poison\nshard");
    adt_ledger_rewind(L, 1, 1, 1, "restart", &gen);
    const char *path = check_tmp_path("events.jsonl");
    FILE *f = fopen(path, "w");
    int64_t last = -1, last2 = -1;
    CHECK(adt_ledger_events_export(L, f, 0, 0, &last) == ADT_OK, "%s", adt_error_message());
    fclose(f);
    const char *kinds[] = {"open", "generation", "epoch", "lease", "report", "commit", "revoke", "dead_letter", "rewind"};
    int seen[9] = {0};
    char line[1024];
    int64_t n = 0, prev = 0;
    f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        CHECK(o != NULL, "line %lld is not JSON: %s", (long long)n, line);
        if (!o) break;
        const cJSON *seq = cJSON_GetObjectItem(o, "seq"), *kind = cJSON_GetObjectItem(o, "kind");
        CHECK(cJSON_IsNumber(seq) && seq->valuedouble > prev && cJSON_IsString(kind) &&
                  cJSON_IsNumber(cJSON_GetObjectItem(o, "t")),
              "line %s", line);
        if (seq) prev = (int64_t)seq->valuedouble;
        for (int k = 0; k < 9; k++)
            if (kind && cJSON_IsString(kind) && !strcmp(kind->valuestring, kinds[k])) seen[k]++;
        if (kind && cJSON_IsString(kind) && !strcmp(kind->valuestring, "report"))
            CHECK(cJSON_GetObjectItem(o, "a")->valuedouble == 0 && cJSON_GetObjectItem(o, "b")->valuedouble == 10 &&
                      cJSON_GetObjectItem(o, "step")->valuedouble == 0 && !cJSON_GetObjectItem(o, "detail"),
                  "report line %s", line);
        if (kind && cJSON_IsString(kind) && !strcmp(kind->valuestring, "commit"))
            CHECK(!strcmp(cJSON_GetObjectItem(o, "detail")->valuestring, "ck \"1\""), "commit detail %s", line);
        cJSON_Delete(o);
        n++;
    }
    if (f) fclose(f);
    for (int k = 0; k < 9; k++) CHECK(seen[k] >= 1, "no %s event", kinds[k]);
    CHECK(n == events_now(L) && last == n, "%lld lines, %lld events, last %lld", (long long)n, (long long)events_now(L),
          (long long)last);
    f = fopen(path, "w");
    CHECK(adt_ledger_events_export(L, f, last, 0, &last2) == ADT_OK && last2 == last, "nothing new");
    long size = ftell(f);
    fclose(f);
    CHECK(size == 0, "export after the last seq wrote %ld bytes", size);
    /* pages of 3: the same lines */
    char *all = NULL, *paged = NULL;
    size_t la = 0, lp = 0;
    f = open_memstream(&all, &la);
    adt_ledger_events_export(L, f, 0, 0, NULL);
    fclose(f);
    f = open_memstream(&paged, &lp);
    int64_t from = 0, pages = 0;
    for (;;) {
        int64_t to = from;
        CHECK(adt_ledger_events_export(L, f, from, 3, &to) == ADT_OK, "%s", adt_error_message());
        if (to == from || ++pages > 100) break;
        CHECK(to - from <= 3, "a page of %lld events", (long long)(to - from));
        from = to;
    }
    fclose(f);
    CHECK(la == lp && !memcmp(all, paged, la) && pages == (n + 2) / 3, "paged export differs (%zu vs %zu bytes, %lld pages)",
          la, lp, (long long)pages);
    free(all);
    free(paged);
    adt_ledger_close(L);
}

/* The audit finds what is wrong: a ledger damaged behind its back (a report row duplicated, a
 * committed row deleted, a pool range lost) fails the audit with the right counts. */
static void test_audit_finds_damage(void) {
    adt_ledger_job job = {.samples = 40, .global_batch = 10, .shard_size = 20, .epochs = 1, .replicas = 1};
    const char *sqls[] = {
        "INSERT INTO events(t, kind, generation, replica, lease, step, epoch, shard, a, b)"
        " SELECT t, kind, generation, replica, lease, step, epoch, shard, a, b FROM events WHERE kind = 3 LIMIT 1",
        "DELETE FROM events WHERE seq = (SELECT MIN(seq) FROM events WHERE kind = 3)",
        "DELETE FROM pool",
        "UPDATE events SET step = 1 WHERE seq = (SELECT MIN(seq) FROM events WHERE kind = 3)",
        "UPDATE events SET step = 1000000000 WHERE kind = 4",
    };
    for (int k = 0; k < 5; k++) {
        const char *path = ledger_path("damage");
        adt_ledger *L = NULL;
        CHECK(adt_ledger_create(&L, path, &job, 0) == ADT_OK, "%s", adt_error_message());
        if (!L) return;
        adt_ledger_lease a;
        int g;
        adt_ledger_lease_next(L, 1, 0, 0, &a, &g);
        adt_ledger_range r[2] = {{a.id, 0, 5}, {a.id, 5, 10}};
        adt_ledger_report(L, 1, 0, 0, r, 2);
        r[0] = (adt_ledger_range){a.id, 10, 20};
        adt_ledger_report(L, 1, 0, 1, r, 1);
        CHECK(adt_ledger_commit(L, 1, 2, NULL) == ADT_OK, "%s", adt_error_message());
        adt_ledger_audit au;
        CHECK(adt_ledger_audit_run(L, &au) == ADT_OK && au.ok && au.epoch[0].trained == 20 && au.epoch[0].pending == 20,
              "healthy audit");
        adt_ledger_audit_free(&au);
        adt_ledger_close(L);
        sqlite3 *db = NULL;
        sqlite3_open(path, &db);
        CHECK(sqlite3_exec(db, sqls[k], NULL, NULL, NULL) == SQLITE_OK, "%s", sqlite3_errmsg(db));
        sqlite3_close(db);
        CHECK(adt_ledger_open(&L, path, ADT_LEDGER_READONLY) == ADT_OK, "%s", adt_error_message());
        if (!L) return;
        int rc = adt_ledger_audit_run(L, &au);
        if (k == 4) {
            CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "commit step 1000000000") && !au.ok,
                  "damaged commit: rc %d %s", rc, adt_error_message());
            adt_ledger_close(L);
            continue;
        }
        CHECK(rc == ADT_OK && !au.ok, "damage %d not found", k);
        const adt_ledger_epoch_audit *e = au.epoch;
        if (k == 0) CHECK(e->duplicated == 5 && e->first_bad_id >= 0, "duplicated %lld", (long long)e->duplicated);
        if (k == 1) CHECK(e->missing == 5, "missing %lld", (long long)e->missing);
        if (k == 2) CHECK(e->missing == 20, "missing %lld", (long long)e->missing);
        if (k == 3) CHECK(au.steps_bad == 2 && au.first_bad_step == 0, "bad steps %lld", (long long)au.steps_bad);
        char *buf = NULL;
        size_t len = 0;
        FILE *mf = open_memstream(&buf, &len);
        adt_ledger_audit_print(mf, &au);
        fclose(mf);
        CHECK(contains(buf, "verdict: FAILED"), "printed: %s", buf);
        free(buf);
        adt_ledger_audit_free(&au);
        adt_ledger_close(L);
    }
}

static void remove_tmpdir(void) {
    DIR *d = opendir(check_tmpdir());
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') unlink(check_tmp_path(de->d_name));
    if (d) closedir(d);
    rmdir(check_tmp_path("nope"));
    rmdir(check_tmpdir());
}

int main(void) {
    if (check_tmpdir_make("ledger")) return 2;
    RUN(test_single_replica_two_epochs);
    RUN(test_zombies_refused);
    RUN(test_dead_letters);
    RUN(test_dead_letters_rewind);
    RUN(test_deadlines);
    RUN(test_master_restart);
    RUN(test_boot_guard);
    RUN(test_threads_share_a_handle);
    RUN(test_bad_reports_and_commits);
    RUN(test_bad_jobs_and_files);
    RUN(test_events_export);
    RUN(test_audit_finds_damage);
    RUN(test_random_trials);
    RUN(test_kill9_durability);
    remove_tmpdir();
    return check_finish();
}
