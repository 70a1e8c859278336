/*
 * server.c - the parameter-server ranks: the world split into servers and workers, and the
 * server's loop that answers pulls and applies pushes under the staleness clock.
 *
 * The protocol runs on plain MPI point-to-point messages over its own duplicate of the world
 * communicator (a server receives from any worker, messages of any length: adt_comm's send/recv
 * know neither). Nothing blocks without a deadline: the loop probes, and a server that hears
 * nothing from a worker that has not said it is done for the timeout fails naming it.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"
#include "ps/ps_internal.h"

/* ---- the world ------------------------------------------------------------------------------- */

int adt_ps_world_init(adt_ps_world *pw, adt_comm *world, int n_servers) {
    memset(pw, 0, sizeof *pw);
    int n = adt_comm_size(world), r = adt_comm_rank(world);
    if (n_servers < 1 || n_servers >= n)
        return adt_error(ADT_ERR_ARG, "--ps-servers %d with %d ranks, expected 1 .. %d: the first S ranks serve and "
                         "at least one rank works", n_servers, n, n - 1);
    int inited = 0, msize = 0;
    MPI_Initialized(&inited);
    if (adt_comm_backend_of(world) != ADT_COMM_MPI || !inited)
        return adt_error(ADT_ERR_ARG, "parameter-server mode needs an MPI world (mpiexec -n N), expected more than "
                         "one rank");
    MPI_Comm_size(MPI_COMM_WORLD, &msize);
    if (msize != n)
        return adt_error(ADT_ERR_UNSUPPORTED, "parameter-server mode: the world has %d ranks but MPI_COMM_WORLD %d, "
                         "expected the MPI world itself", n, msize);
    pw->world = world;
    pw->n_servers = n_servers;
    pw->n_workers = n - n_servers;
    pw->is_server = r < n_servers;
    pw->server = pw->is_server ? r : -1;
    pw->worker = pw->is_server ? -1 : r - n_servers;
    MPI_Comm *pc = adt_malloc(sizeof *pc);
    MPI_Comm_dup(MPI_COMM_WORLD, pc);
    pw->mpi = pc;
    int rc = adt_comm_split(world, pw->is_server ? -1 : 0, r, &pw->workers);
    if (rc) adt_ps_world_free(pw);
    return rc;
}

int adt_ps_world_free(adt_ps_world *pw) {
    int rc = adt_comm_free(pw->workers);
    if (pw->mpi) {
        MPI_Comm_free((MPI_Comm *)pw->mpi);
        free(pw->mpi);
    }
    pw->mpi = NULL, pw->workers = NULL;
    return rc;
}

/* ---- waiting politely ------------------------------------------------------------------------- */

/* Ranks here often outnumber cores (servers beside workers), so an idle rank spins a little,
 * then yields its core in growing naps up to 0.5 ms. */
void ps_nap(int *idle) {
    if (++*idle < 64) return;
    long ns = *idle < 256 ? 20000 : 500000;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

double ps_timeout(const adt_ps_world *pw, const adt_ps_cfg *cfg) {
    return cfg->timeout_s > 0 ? cfg->timeout_s : adt_comm_timeout(pw->world);
}

/* ---- the server's loop ----------------------------------------------------------------------- */

typedef struct pend_msg { /* a received pull or push, its ids and (push) gradients */
    int64_t *hdr;         /* [step, counts..., ids...] */
    int64_t n_hdr;
    float *g;
    struct pend_msg *next;
} pend_msg;

typedef struct out_send {
    MPI_Request req;
    void *buf;
    struct out_send *next;
} out_send;

typedef struct srv {
    adt_ps_world *pw;
    const adt_ps_cfg *cfg;
    adt_ps_store *store;
    MPI_Comm comm;
    adt_ps_clock clock;
    adt_ps_dispatch dispatch;       /* server 0 under dynamic sharding (cfg->chunks > 0) */
    pend_msg **pulls, **pulls_tail; /* per worker, FIFO in step order */
    pend_msg **pushes;              /* sync: per worker, the push of the step being gathered */
    pend_msg **peeks;               /* per worker, a lookup waiting for the pushes it must see */
    pend_msg **cuts;                /* per worker, its cut marker while the others' are awaited */
    int *done;
    double *last_heard;
    out_send *sends;
    ps_idmap agg_map;
    float *agg;
    int64_t agg_cap;
    adt_ps_server_stats st;
} srv;

static int64_t msg_rows(const srv *s, const int64_t *hdr, int64_t *floats) {
    int64_t n = 0, f = 0;
    for (int t = 0; t < s->cfg->n_tables; t++) n += hdr[1 + t], f += hdr[1 + t] * s->cfg->tables[t].dim;
    if (floats) *floats = f;
    return n;
}

/* A received list must be [step, T counts, the ids they count]. */
static int check_msg(const srv *s, const int64_t *hdr, int64_t n, int from, const char *what) {
    int T = s->cfg->n_tables;
    if (n < 1 + T) goto bad;
    int64_t sum = 0;
    for (int t = 0; t < T; t++) {
        if (hdr[1 + t] < 0) goto bad;
        sum += hdr[1 + t];
    }
    if (sum != n - 1 - T || hdr[0] < 0) goto bad;
    return ADT_OK;
bad:
    return adt_error(ADT_ERR_COMM, "ps server %d: a malformed %s from worker %d (%lld values), expected [step, %d "
                     "counts, ids]", s->pw->server, what, from, (long long)n, T);
}

static int recv_list(srv *s, MPI_Status *ps, int64_t **out, int64_t *n) {
    int cnt;
    MPI_Get_count(ps, MPI_INT64_T, &cnt);
    *n = cnt;
    *out = adt_malloc((size_t)(cnt ? cnt : 1) * sizeof **out);
    MPI_Recv(*out, cnt, MPI_INT64_T, ps->MPI_SOURCE, ps->MPI_TAG, s->comm, MPI_STATUS_IGNORE);
    return ADT_OK;
}

/* Frees the replies whose sends completed; at the end (last) every one: those a failed run left
 * in flight are withdrawn. */
static void reap_sends(srv *s, int last) {
    for (out_send **pp = &s->sends; *pp;) {
        int flag = 0;
        MPI_Test(&(*pp)->req, &flag, MPI_STATUS_IGNORE);
        if (!flag && last) {
            MPI_Cancel(&(*pp)->req);
            MPI_Request_free(&(*pp)->req);
            flag = 1;
        }
        if (flag) {
            out_send *d = *pp;
            *pp = d->next;
            free(d->buf), free(d);
        } else {
            pp = &(*pp)->next;
        }
    }
}

/* Answers a pull (the rows created and stamped with its step) or a peek (rows as they are). */
static int serve_pull(srv *s, int w, pend_msg *m, int peek) {
    if (!peek) adt_sleep_s(s->cfg->answer_delay_s); /* a slower server (a test's); 0: none */
    int64_t floats;
    int64_t rows = msg_rows(s, m->hdr, &floats);
    float *out = adt_malloc((size_t)(floats ? floats : 1) * sizeof *out);
    const int64_t *ids = m->hdr + 1 + s->cfg->n_tables;
    int64_t off = 0;
    int rc = ADT_OK;
    for (int t = 0; t < s->cfg->n_tables && !rc; t++) {
        int64_t k = m->hdr[1 + t];
        rc = peek ? adt_ps_store_peek(s->store, t, (const uint64_t *)ids, k, out + off)
                  : adt_ps_store_pull(s->store, t, (const uint64_t *)ids, k, out + off, m->hdr[0]);
        ids += k, off += k * s->cfg->tables[t].dim;
    }
    if (rc) return free(out), rc;
    out_send *o = adt_calloc(1, sizeof *o);
    o->buf = out;
    MPI_Isend(out, (int)floats, MPI_FLOAT, s->pw->n_servers + w, peek ? PS_TAG_PEEKROWS : PS_TAG_ROWS, s->comm,
              &o->req);
    o->next = s->sends, s->sends = o;
    if (peek) return ADT_OK;
    int64_t lead = m->hdr[0] - adt_ps_clock_min(&s->clock);
    if (lead > s->st.max_lead) s->st.max_lead = lead;
    s->st.pulls++;
    s->st.rows_pulled += rows;
    return ADT_OK;
}

/* Dynamic sharding: the next chunk to the worker that asks (server 0 only). */
static int serve_chunk(srv *s, int w) {
    if (s->cfg->chunks <= 0 || s->pw->server != 0)
        return adt_error(ADT_ERR_COMM, "ps server %d: worker %d asked for a chunk, but %s", s->pw->server, w,
                         s->cfg->chunks <= 0 ? "the run has no dynamic sharding" : "server 0 hands out the chunks");
    out_send *o = adt_calloc(1, sizeof *o);
    int64_t *c = o->buf = adt_malloc(sizeof *c);
    *c = adt_ps_dispatch_next(&s->dispatch, w);
    MPI_Isend(c, 1, MPI_INT64_T, s->pw->n_servers + w, PS_TAG_CHUNK, s->comm, &o->req);
    o->next = s->sends, s->sends = o;
    return ADT_OK;
}

static int serve_ready(srv *s) {
    for (int w = 0; w < s->pw->n_workers; w++) {
        pend_msg *pk = s->peeks[w];
        if (pk && adt_ps_clock_min(&s->clock) >= pk->hdr[0]) {
            s->peeks[w] = NULL;
            int rc = serve_pull(s, w, pk, 1);
            free(pk->hdr), free(pk);
            if (rc) return rc;
        }
        while (s->pulls[w] && adt_ps_clock_may_serve(&s->clock, s->pulls[w]->hdr[0])) {
            pend_msg *m = s->pulls[w];
            int rc = serve_pull(s, w, m, 0);
            s->pulls[w] = m->next;
            if (!s->pulls[w]) s->pulls_tail[w] = NULL;
            free(m->hdr), free(m);
            if (rc) return rc;
        }
    }
    return ADT_OK;
}

/* Applies one push (ssp, async), or the sum of the workers' pushes (sync). */
static int apply_lists(srv *s, pend_msg **msgs, int n_msgs, int64_t step) {
    int T = s->cfg->n_tables;
    int64_t *ids_at = adt_malloc((size_t)n_msgs * sizeof *ids_at), *g_at = adt_malloc((size_t)n_msgs * sizeof *g_at);
    for (int i = 0; i < n_msgs; i++) ids_at[i] = 1 + T, g_at[i] = 0;
    int rc = ADT_OK;
    if (s->cfg->lr_at) adt_ps_store_set_lr(s->store, s->cfg->lr_at(s->cfg->lr_ctx, step + 1)); /* the push's step's */
    for (int t = 0; t < T && !rc; t++) {
        int dim = s->cfg->tables[t].dim;
        ps_idmap_clear(&s->agg_map);
        int64_t total = 0;
        for (int i = 0; i < n_msgs; i++) total += msgs[i]->hdr[1 + t];
        if (total * dim > s->agg_cap) {
            s->agg_cap = total * dim;
            free(s->agg);
            s->agg = adt_malloc((size_t)s->agg_cap * sizeof *s->agg);
        }
        uint64_t *uids = adt_malloc((size_t)(total ? total : 1) * sizeof *uids);
        /* summed in worker order, whatever order the pushes came in */
        for (int i = 0; i < n_msgs; i++) {
            const int64_t *ids = msgs[i]->hdr + ids_at[i];
            const float *g = msgs[i]->g + g_at[i];
            for (int64_t k = 0; k < msgs[i]->hdr[1 + t]; k++) {
                int added;
                int32_t u = ps_idmap_put(&s->agg_map, (uint64_t)ids[k], &added);
                float *a = s->agg + (int64_t)u * dim;
                if (added) uids[u] = (uint64_t)ids[k], memcpy(a, g + k * dim, (size_t)dim * sizeof *a);
                else
                    for (int j = 0; j < dim; j++) a[j] += g[k * dim + j];
            }
            ids_at[i] += msgs[i]->hdr[1 + t];
            g_at[i] += msgs[i]->hdr[1 + t] * dim;
        }
        rc = adt_ps_store_push(s->store, t, uids, s->agg_map.n, s->agg, step + 1, step);
        s->st.rows_pushed += s->agg_map.n;
        free(uids);
    }
    free(ids_at), free(g_at);
    return rc;
}

static int on_push(srv *s, int w, pend_msg *m) {
    int64_t step = m->hdr[0];
    int rc = adt_ps_clock_push(&s->clock, w, step);
    if (rc) return adt_error_prefix(rc, "ps server %d: ", s->pw->server), free(m->hdr), free(m->g), free(m), rc;
    s->st.pushes++;
    if (s->cfg->sync.kind != ADT_PS_SYNC) {
        rc = apply_lists(s, &m, 1, step);
        free(m->hdr), free(m->g), free(m);
        return rc;
    }
    s->pushes[w] = m;
    if (!adt_ps_clock_step_gathered(&s->clock, step)) return ADT_OK;
    /* every worker that still runs pushed this step: sum them in worker order, apply once */
    pend_msg *list[s->pw->n_workers];
    int k = 0;
    for (int v = 0; v < s->pw->n_workers; v++)
        if (s->pushes[v]) list[k++] = s->pushes[v];
    rc = apply_lists(s, list, k, step);
    for (int v = 0; v < s->pw->n_workers; v++) {
        if (s->pushes[v]) free(s->pushes[v]->hdr), free(s->pushes[v]->g), free(s->pushes[v]);
        s->pushes[v] = NULL;
    }
    return rc;
}

/* A checkpoint's cut: once every worker still working has sent its marker (after its last push
 * before the cut), the shard is written and each is answered with the outcome. A failed write
 * leaves the server serving: the workers fail with its message and end the run. */
static int cut_if_complete(srv *s) {
    int W = s->pw->n_workers, first = -1;
    for (int w = 0; w < W; w++) {
        if (s->done[w]) continue;
        if (!s->cuts[w]) return ADT_OK;
        if (first < 0) first = w;
    }
    if (first < 0) return ADT_OK;
    const char *path = (const char *)(s->cuts[first]->hdr + 1);
    for (int w = 0; w < W; w++)
        if (s->cuts[w] && (s->cuts[w]->hdr[0] != s->cuts[first]->hdr[0] || strcmp((const char *)(s->cuts[w]->hdr + 1), path)))
            return adt_error(ADT_ERR_COMM, "ps server %d: worker %d's checkpoint is after step %lld into '%s', worker "
                             "%d's after step %lld into '%s': expected the same cut", s->pw->server, w,
                             (long long)s->cuts[w]->hdr[0], (const char *)(s->cuts[w]->hdr + 1), first,
                             (long long)s->cuts[first]->hdr[0], path);
    int64_t reply[PS_SAVED_WORDS] = {0};
    reply[0] = adt_ps_store_save(s->store, path);
    if (reply[0]) snprintf((char *)(reply + 1), sizeof reply - sizeof *reply, "%s", adt_error_message());
    for (int w = 0; w < W; w++) {
        if (!s->cuts[w]) continue;
        out_send *o = adt_calloc(1, sizeof *o);
        o->buf = adt_malloc(sizeof reply);
        memcpy(o->buf, reply, sizeof reply);
        MPI_Isend(o->buf, PS_SAVED_WORDS, MPI_INT64_T, s->pw->n_servers + w, PS_TAG_SAVED, s->comm, &o->req);
        o->next = s->sends, s->sends = o;
        free(s->cuts[w]->hdr), free(s->cuts[w]);
        s->cuts[w] = NULL;
    }
    return ADT_OK;
}

/* A cut marker: [steps pushed, the path as bytes]; every push of this worker before the cut has
 * been received (they precede the marker) and applied. */
static int on_cut(srv *s, int w, pend_msg *m) {
    const char *path = (const char *)(m->hdr + 1);
    if (m->n_hdr < 2 || memchr(path, 0, (size_t)(m->n_hdr - 1) * sizeof *m->hdr) == NULL || s->cuts[w])
        return adt_error(ADT_ERR_COMM, "ps server %d: a malformed checkpoint request from worker %d, expected [steps, "
                         "path] and one at a time", s->pw->server, w);
    if (m->hdr[0] != s->clock.done[w])
        return adt_error(ADT_ERR_COMM, "ps server %d: worker %d asks for a checkpoint after step %lld but has pushed "
                         "%lld steps", s->pw->server, w, (long long)m->hdr[0], (long long)s->clock.done[w]);
    s->cuts[w] = m;
    return cut_if_complete(s);
}

/* Receives the gradients that follow a push header, within the deadline. */
static int recv_grads(srv *s, int src, pend_msg *m, double timeout) {
    int64_t floats;
    msg_rows(s, m->hdr, &floats);
    m->g = adt_malloc((size_t)(floats ? floats : 1) * sizeof *m->g);
    MPI_Request rq;
    MPI_Irecv(m->g, (int)floats, MPI_FLOAT, src, PS_TAG_GRAD, s->comm, &rq);
    double t0 = adt_now_s();
    int idle = 0, flag = 0;
    MPI_Status st;
    while (!flag) {
        MPI_Test(&rq, &flag, &st);
        if (flag) break;
        if (adt_now_s() - t0 > timeout) {
            MPI_Cancel(&rq);
            MPI_Wait(&rq, MPI_STATUS_IGNORE);
            return adt_error(ADT_ERR_COMM, "ps server %d: the gradients of worker %d's push of step %lld did not come "
                             "within %.0f s", s->pw->server, src - s->pw->n_servers, (long long)m->hdr[0], timeout);
        }
        ps_nap(&idle);
    }
    int cnt;
    MPI_Get_count(&st, MPI_FLOAT, &cnt);
    if (cnt != floats)
        return adt_error(ADT_ERR_COMM, "ps server %d: worker %d sent %d gradient values for step %lld, expected %lld",
                         s->pw->server, src - s->pw->n_servers, cnt, (long long)m->hdr[0], (long long)floats);
    return ADT_OK;
}

static int handle(srv *s, MPI_Status *ps, double timeout) {
    int src = ps->MPI_SOURCE, w = src - s->pw->n_servers;
    if (w < 0 || w >= s->pw->n_workers)
        return adt_error(ADT_ERR_COMM, "ps server %d: a message (tag %d) from rank %d, which is not a worker",
                         s->pw->server, ps->MPI_TAG, src);
    s->last_heard[w] = adt_now_s();
    pend_msg *m = adt_calloc(1, sizeof *m);
    recv_list(s, ps, &m->hdr, &m->n_hdr);
    int rc = ADT_OK;
    switch (ps->MPI_TAG) {
    case PS_TAG_PULL:
        if ((rc = check_msg(s, m->hdr, m->n_hdr, w, "pull"))) break;
        if (s->pulls_tail[w]) s->pulls_tail[w]->next = m;
        else s->pulls[w] = m;
        s->pulls_tail[w] = m;
        if (!adt_ps_clock_may_serve(&s->clock, m->hdr[0])) s->st.deferred++;
        return serve_ready(s);
    case PS_TAG_PEEK: /* answered once every worker pushed the steps before hdr[0] */
        if ((rc = check_msg(s, m->hdr, m->n_hdr, w, "lookup"))) break;
        if (s->peeks[w]) {
            rc = adt_error(ADT_ERR_COMM, "ps server %d: worker %d sent a lookup while its last one waits", s->pw->server, w);
            break;
        }
        s->peeks[w] = m;
        return serve_ready(s);
    case PS_TAG_PUSH:
        if ((rc = check_msg(s, m->hdr, m->n_hdr, w, "push"))) break;
        if ((rc = recv_grads(s, src, m, timeout))) break;
        if ((rc = on_push(s, w, m))) return rc;
        return serve_ready(s);
    case PS_TAG_NEXT:
        rc = serve_chunk(s, w);
        break;
    case PS_TAG_SAVE: /* kept in s->cuts until the cut is complete */
        if ((rc = on_cut(s, w, m)) && s->cuts[w] != m) break;
        return rc;
    case PS_TAG_DONE:
        s->done[w] = 1;
        adt_ps_clock_leave(&s->clock, w);
        free(m->hdr), free(m);
        /* sync: the step being gathered may now be complete without this worker */
        if (s->cfg->sync.kind == ADT_PS_SYNC) {
            int64_t step = -1;
            for (int v = 0; v < s->pw->n_workers; v++)
                if (s->pushes[v]) step = s->pushes[v]->hdr[0];
            if (step >= 0 && adt_ps_clock_step_gathered(&s->clock, step)) {
                pend_msg *list[s->pw->n_workers];
                int k = 0;
                for (int v = 0; v < s->pw->n_workers; v++)
                    if (s->pushes[v]) list[k++] = s->pushes[v], s->pushes[v] = NULL;
                rc = apply_lists(s, list, k, step);
                for (int i = 0; i < k; i++) free(list[i]->hdr), free(list[i]->g), free(list[i]);
                if (rc) return rc;
            }
        }
        if ((rc = cut_if_complete(s))) return rc; /* the others' cut no longer waits for it */
        return serve_ready(s);
    default:
        rc = adt_error(ADT_ERR_COMM, "ps server %d: a message with tag %d from worker %d, expected a pull, lookup, "
                       "push, checkpoint or done", s->pw->server, ps->MPI_TAG, w);
    }
    free(m->hdr), free(m->g), free(m);
    return rc;
}

int adt_ps_server_run(adt_ps_world *pw, const adt_ps_cfg *cfg, adt_ps_store *store, adt_ps_server_stats *stats) {
    if (!pw->is_server) return adt_error(ADT_ERR_STATE, "adt_ps_server_run on worker rank %d", adt_comm_rank(pw->world));
    srv s = {.pw = pw, .cfg = cfg, .store = store, .comm = *(MPI_Comm *)pw->mpi};
    int rc = adt_ps_clock_init(&s.clock, pw->n_workers, cfg->sync);
    if (!rc && cfg->chunks > 0 && pw->server == 0) rc = adt_ps_dispatch_init(&s.dispatch, cfg->chunks, pw->n_workers);
    if (rc) return adt_ps_clock_free(&s.clock), rc;
    int W = pw->n_workers;
    s.pulls = adt_calloc((size_t)W, sizeof *s.pulls);
    s.pulls_tail = adt_calloc((size_t)W, sizeof *s.pulls_tail);
    s.pushes = adt_calloc((size_t)W, sizeof *s.pushes);
    s.peeks = adt_calloc((size_t)W, sizeof *s.peeks);
    s.cuts = adt_calloc((size_t)W, sizeof *s.cuts);
    adt_ps_clock_start(&s.clock, cfg->first_step);
    s.done = adt_calloc((size_t)W, sizeof *s.done);
    s.last_heard = adt_malloc((size_t)W * sizeof *s.last_heard);
    double t0 = adt_now_s(), timeout = ps_timeout(pw, cfg);
    for (int w = 0; w < W; w++) s.last_heard[w] = t0;
    ps_idmap_init(&s.agg_map);
    int n_done = 0, idle = 0;
    while (!rc) {
        n_done = 0;
        for (int w = 0; w < W; w++) n_done += s.done[w];
        if (n_done == W) break;
        int flag;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, s.comm, &flag, &st);
        if (flag) {
            idle = 0;
            rc = handle(&s, &st, timeout);
            continue;
        }
        reap_sends(&s, 0);
        double now = adt_now_s(), t_idle = now;
        for (int w = 0; w < W; w++)
            if (!s.done[w] && now - s.last_heard[w] > timeout) {
                rc = adt_error(ADT_ERR_COMM, "ps server %d: nothing from worker %d (rank %d) for %.0f s, and it has "
                               "not said it is done: expected it alive", pw->server, w, pw->n_servers + w, timeout);
                break;
            }
        ps_nap(&idle);
        s.st.idle_s += adt_now_s() - t_idle;
    }
    /* a clean end: every worker said done after its last rows arrived, so no reply is pending */
    reap_sends(&s, 1);
    for (int w = 0; w < W; w++) {
        for (pend_msg *m = s.pulls[w], *nx; m; m = nx) nx = m->next, free(m->hdr), free(m);
        if (s.pushes[w]) free(s.pushes[w]->hdr), free(s.pushes[w]->g), free(s.pushes[w]);
        if (s.peeks[w]) free(s.peeks[w]->hdr), free(s.peeks[w]);
        if (s.cuts[w]) free(s.cuts[w]->hdr), free(s.cuts[w]);
    }
    free(s.pulls), free(s.pulls_tail), free(s.pushes), free(s.peeks), free(s.cuts), free(s.done), free(s.last_heard), free(s.agg);
    ps_idmap_free(&s.agg_map);
    adt_ps_clock_free(&s.clock);
    adt_ps_dispatch_free(&s.dispatch);
    if (stats) *stats = s.st;
    return rc;
}
