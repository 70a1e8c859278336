/*
 * client_pipe.c - the worker client's lease and report calls off the training step
 * (adtrain/elastic.h, adt_elastic_pipe_*): one thread per client makes them, in the order they
 * were asked for, while the step computes.
 *
 * Why one thread and one client: the lease call names the leases the client holds, so that a
 * grant whose reply was lost is handed out again; a second client beside it would not know the
 * first one's leases and be handed them. Keeping every call of the handle on one thread, in
 * order, keeps that list exact, and keeps each replica's reports in step order, which the ledger
 * requires.
 *
 * Guarantees the trainer builds on:
 * - a lease asked ahead is the one the next adt_elastic_pipe_lease returns (the caller asks
 *   only once every replica holds its lease of the current step, so the positions keep the
 *   sampler's order);
 * - a report is queued; at most one other report is unacknowledged when it is queued, so when a
 *   step ends, the reply to the previous step's report (and the stop step it may carry) is in;
 * - a report waits up to HOLD_S for the lease asked right after it and goes in one call with it
 *   (POST /v1/data/step: one round trip per step instead of two, half the master's requests);
 *   a caller that waits for the report (the next report, a drain) sends it at once;
 * - the first refusal (a stale generation, ...) is kept and returned by every later call; the
 *   thread makes no further calls after it;
 * - adt_elastic_pipe_drain returns once every queued report was acknowledged: a commit made
 *   after it (and after a collective that tells every rank drained) covers reported steps only.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "elastic/wire_internal.h"

#define PIPE_QUEUE 8

enum { PQ_LEASE, PQ_REPORT };

typedef struct pipe_req {
    int kind;
    int64_t step, max_samples;
    double compute_s;         /* a report's compute seconds, < 0: none */
    adt_ledger_range *ranges; /* a report's, malloc'd */
    int n;
    double srv[ADT_ELASTIC_MAX_SERVERS]; /* a report's server answer times (n_srv of them) */
    int n_srv;
    double queued_s; /* adt_now_s() when queued */
} pipe_req;

enum { LEASE_NONE, LEASE_ASKED, LEASE_READY };

struct adt_elastic_pipe {
    adt_elastic *c; /* used by the thread only, once started */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pipe_req q[PIPE_QUEUE];
    int head, count;
    int reports; /* reports queued or in flight                        */
    int lease_state;
    adt_ledger_lease lease;
    int grant;
    int err; /* the first failure; its message in err_msg              */
    char *err_msg;
    int64_t stop_at;
    wj_split split; /* the client's, as of its last reply */
    int replica;
    int flush; /* somebody waits for every report's reply: send a held one now */
    int quit;
};

/* A report alone at the queue's head waits this long for a lease to share its call with. */
#define HOLD_S 0.05

/* The client's split into the pipe's copy (p->mu held; the client is the thread's). */
static void copy_split(adt_elastic_pipe *p) {
    p->replica = adt_elastic_replica(p->c);
    const wj_split *s = wj_client_split(p->c);
    p->split.n = s->n, p->split.from = s->from;
    memcpy(p->split.cur, s->cur, (size_t)s->n * sizeof *s->cur);
    memcpy(p->split.before, s->before, (size_t)s->n * sizeof *s->before);
}

/* Sends r (and lease l when given: one call for both) with p->mu released; records the outcome. */
static void pipe_send(adt_elastic_pipe *p, pipe_req *r, pipe_req *l) {
    int rc = p->err, grant = ADT_LEDGER_WAIT;
    adt_ledger_lease ls = {0};
    if (!rc) { /* after a refusal nothing more is sent */
        pthread_mutex_unlock(&p->mu);
        if (r->kind == PQ_REPORT) adt_elastic_set_server_times(p->c, r->srv, r->n_srv);
        if (r->kind == PQ_LEASE) rc = adt_elastic_lease(p->c, r->max_samples, &ls, &grant);
        else if (l)
            rc = adt_elastic_report_lease_compute(p->c, r->step, r->ranges, r->n, r->compute_s, l->max_samples, &ls,
                                                  &grant);
        else rc = adt_elastic_report_compute(p->c, r->step, r->ranges, r->n, r->compute_s);
        pthread_mutex_lock(&p->mu);
        if (rc && !p->err) {
            p->err = rc;
            p->err_msg = adt_strdup(adt_error_message());
        }
        p->stop_at = adt_elastic_stop_at(p->c);
        copy_split(p);
    }
    if (r->kind == PQ_LEASE || l) {
        p->lease = ls;
        p->grant = grant;
        p->lease_state = LEASE_READY;
    }
    if (r->kind == PQ_REPORT && --p->reports == 0) p->flush = 0;
    free(r->ranges);
}

static void *pipe_main(void *arg) {
    adt_elastic_pipe *p = arg;
    /* Woken at normal priority, this thread preempted the trainer at once (the step's lease
     * asked ahead, then 0.1-0.4 ms of HTTP); at nice 19 it runs when the rank waits, well
     * within the step it has. */
    adt_thread_background();
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->count && !p->quit) pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        pipe_req *h = &p->q[p->head];
        /* The trainer asks for the next step's lease right after it queued this step's report
         * (once every rank holds its lease): one call carries both, halving the round trips the
         * master serves per step. Nobody waits for the report meanwhile; one who does (the next
         * report, a drain) flushes it. */
        double t = h->queued_s + HOLD_S; /* adt_now_s: CLOCK_MONOTONIC, the cv's clock */
        if (h->kind == PQ_REPORT && p->count == 1 && !p->flush && !p->err && adt_now_s() < t) {
            struct timespec until = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
            pthread_cond_timedwait(&p->cv, &p->mu, &until);
            continue;
        }
        pipe_req r = *h, l = {0};
        int both = r.kind == PQ_REPORT && p->count > 1 && p->q[(p->head + 1) % PIPE_QUEUE].kind == PQ_LEASE;
        if (both) l = p->q[(p->head + 1) % PIPE_QUEUE];
        p->head = (p->head + 1 + both) % PIPE_QUEUE;
        p->count -= 1 + both;
        pthread_cond_broadcast(&p->cv); /* room in the queue */
        pipe_send(p, &r, both ? &l : NULL);
        pthread_cond_broadcast(&p->cv);
    }
    for (; p->count; p->count--, p->head = (p->head + 1) % PIPE_QUEUE) free(p->q[p->head].ranges);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int adt_elastic_pipe_start(adt_elastic_pipe **out, adt_elastic *c) {
    adt_elastic_pipe *p = adt_calloc(1, sizeof *p);
    p->c = c;
    p->stop_at = adt_elastic_stop_at(c);
    copy_split(p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the report's hold is timed on it */
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* the thread starts with every signal blocked: SIGTERM and the like reach the trainer's
     * thread, whose handler they are meant for */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int bad = pthread_create(&p->th, NULL, pipe_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (bad) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
        free(p);
        *out = NULL;
        return adt_error(ADT_ERR_IO, "elastic client: cannot start its request thread");
    }
    *out = p;
    return ADT_OK;
}

void adt_elastic_pipe_free(adt_elastic_pipe *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->err_msg);
    free(p);
}

/* The kept failure as this thread's error (p->mu held). */
static int kept_error(adt_elastic_pipe *p) { return adt_error(p->err, "%s", p->err_msg); }

/* Waits until every queued report is acknowledged (p->mu held), a held one sent at once. */
static void wait_reports(adt_elastic_pipe *p) {
    if (p->reports > 0) {
        p->flush = 1;
        pthread_cond_broadcast(&p->cv);
    }
    while (!p->err && p->reports > 0) pthread_cond_wait(&p->cv, &p->mu);
}

/* Queues r (p->mu held), waiting for room; dropped after a failure (every call returns it). */
static void enqueue(adt_elastic_pipe *p, pipe_req r) {
    while (p->count == PIPE_QUEUE && !p->err) pthread_cond_wait(&p->cv, &p->mu);
    if (p->err) {
        free(r.ranges);
        return;
    }
    r.queued_s = adt_now_s();
    p->q[(p->head + p->count) % PIPE_QUEUE] = r;
    p->count++;
    if (r.kind == PQ_REPORT) p->reports++;
    pthread_cond_broadcast(&p->cv);
}

int adt_elastic_pipe_prefetch(adt_elastic_pipe *p, int64_t max_samples) {
    pthread_mutex_lock(&p->mu);
    int rc = ADT_OK;
    if (p->err) rc = kept_error(p);
    else if (p->lease_state == LEASE_NONE) {
        p->lease_state = LEASE_ASKED;
        enqueue(p, (pipe_req){.kind = PQ_LEASE, .max_samples = max_samples, .compute_s = -1});
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int adt_elastic_pipe_lease(adt_elastic_pipe *p, int64_t max_samples, adt_ledger_lease *out, int *grant) {
    memset(out, 0, sizeof *out);
    *grant = ADT_LEDGER_WAIT;
    pthread_mutex_lock(&p->mu);
    if (!p->err && p->lease_state == LEASE_NONE) {
        p->lease_state = LEASE_ASKED;
        enqueue(p, (pipe_req){.kind = PQ_LEASE, .max_samples = max_samples, .compute_s = -1});
    }
    while (!p->err && p->lease_state != LEASE_READY) pthread_cond_wait(&p->cv, &p->mu);
    int rc = ADT_OK;
    if (p->err) rc = kept_error(p);
    else {
        *out = p->lease;
        *grant = p->grant;
        p->lease_state = LEASE_NONE;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int adt_elastic_pipe_report(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n) {
    return adt_elastic_pipe_report_compute(p, step, r, n, -1);
}

int adt_elastic_pipe_report_compute(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n,
                                    double compute_s) {
    return adt_elastic_pipe_report_timed(p, step, r, n, compute_s, NULL, 0);
}

int adt_elastic_pipe_report_timed(adt_elastic_pipe *p, int64_t step, const adt_ledger_range *r, int n,
                                  double compute_s, const double *server_s, int n_servers) {
    if (n < 1) return adt_error(ADT_ERR_ARG, "report of step %lld: no ranges", (long long)step);
    pthread_mutex_lock(&p->mu);
    /* the previous report's reply first: the stop step it may carry is known when the step ends */
    wait_reports(p);
    int rc = ADT_OK;
    if (p->err) rc = kept_error(p);
    else {
        adt_ledger_range *copy = adt_malloc((size_t)n * sizeof *copy);
        memcpy(copy, r, (size_t)n * sizeof *copy);
        pipe_req q = {.kind = PQ_REPORT, .step = step, .ranges = copy, .n = n, .compute_s = compute_s};
        q.n_srv = server_s && n_servers > 0 ? (n_servers < ADT_ELASTIC_MAX_SERVERS ? n_servers : ADT_ELASTIC_MAX_SERVERS) : 0;
        for (int i = 0; i < q.n_srv; i++) q.srv[i] = server_s[i];
        enqueue(p, q);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int adt_elastic_pipe_drain(adt_elastic_pipe *p) {
    pthread_mutex_lock(&p->mu);
    wait_reports(p);
    int rc = p->err ? kept_error(p) : ADT_OK;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int adt_elastic_pipe_status(adt_elastic_pipe *p) {
    pthread_mutex_lock(&p->mu);
    int rc = p->err ? kept_error(p) : ADT_OK;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int64_t adt_elastic_pipe_stop_at(adt_elastic_pipe *p) {
    pthread_mutex_lock(&p->mu);
    int64_t s = p->stop_at;
    pthread_mutex_unlock(&p->mu);
    return s;
}

int64_t adt_elastic_pipe_local_batch(adt_elastic_pipe *p, int64_t step) {
    pthread_mutex_lock(&p->mu);
    int64_t b = wj_split_at(&p->split, p->replica, step);
    pthread_mutex_unlock(&p->mu);
    return b;
}
