/*
 * worker.c - a worker's side of the parameter-server protocol: a batch's ids deduplicated per
 * table, pulled from their servers (up to `prefetch` steps ahead of the one computing), expanded
 * back to batch order, and the batch's gradients summed per distinct row and pushed.
 *
 * Step s uses slot s mod (prefetch + 1): its distinct ids, where each sits in its server's reply,
 * the requests in flight. A step's slot lives from its pull to its push, so at most prefetch + 1
 * steps are open at once.
 */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"
#include "ps/ps_internal.h"

typedef struct wslot {
    int64_t step; /* -1: free */
    double t_post; /* when its requests went out */
    int B;
    int pulled_rows; /* replies received and unpacked */
    int32_t *uidx;   /* [B * T]: distinct index of sample b's row of table t, per table */
    int64_t n_uniq[ADT_PS_MAX_TABLES];
    uint64_t *uniq[ADT_PS_MAX_TABLES]; /* distinct ids of table t */
    int32_t *owner[ADT_PS_MAX_TABLES]; /* their servers */
    int64_t *at[ADT_PS_MAX_TABLES];    /* float offset of each in its server's reply */
    int64_t **req_ids;                 /* [S]: the request sent to each server */
    int64_t *req_n;                    /* [S] its length */
    int64_t *rep_floats;               /* [S] */
    float **rep;                       /* [S] the replies */
    MPI_Request *rq;                   /* [2S]: the requests' sends, the replies' receives */
} wslot;

struct adt_ps_worker {
    adt_ps_world *pw;
    adt_ps_cfg cfg;
    MPI_Comm comm;
    int S, T, n_slots;
    wslot *slots;
    wslot peek; /* a lookup's */
    int64_t next_pull, next_push;
    ps_idmap map;
    /* the last push, in flight */
    int64_t **push_hdr;
    float **push_g;
    MPI_Request *push_rq; /* [2S] */
    int push_live;
    float *agg;
    int64_t agg_cap;
    adt_ps_worker_stats st;
    double *done_at; /* [2S] when wait_all saw each request of the last rows complete */
    double *answer_s; /* [S] the last rows' answer time per server: request out to answer seen */
    double timeout;
    /* dynamic sharding: the next chunk asked for ahead, its answer in flight */
    int64_t chunk_ask, chunk_ans;
    MPI_Request chunk_rq[2];
    int chunk_live;
};

static void slot_release(adt_ps_worker *w, wslot *sl) {
    for (int p = 0; p < w->S; p++) {
        free(sl->req_ids[p]), free(sl->rep[p]);
        sl->req_ids[p] = NULL, sl->rep[p] = NULL;
    }
    sl->step = -1;
}

int adt_ps_worker_create(adt_ps_worker **out, adt_ps_world *pw, const adt_ps_cfg *cfg) {
    *out = NULL;
    if (pw->is_server) return adt_error(ADT_ERR_STATE, "adt_ps_worker_create on server rank %d", pw->server);
    if (cfg->prefetch < 0 || cfg->prefetch > 64)
        return adt_error(ADT_ERR_ARG, "--ps-prefetch %d, expected 0 .. 64 steps", cfg->prefetch);
    if (cfg->n_tables < 1 || cfg->n_tables > ADT_PS_MAX_TABLES)
        return adt_error(ADT_ERR_ARG, "ps worker: %d tables, expected 1 .. %d", cfg->n_tables, ADT_PS_MAX_TABLES);
    adt_ps_worker *w = adt_calloc(1, sizeof *w);
    w->pw = pw;
    w->cfg = *cfg;
    w->comm = *(MPI_Comm *)pw->mpi;
    w->S = pw->n_servers;
    w->T = cfg->n_tables;
    w->n_slots = cfg->prefetch + 1;
    w->timeout = ps_timeout(pw, cfg);
    w->next_pull = w->next_push = cfg->first_step < 0 ? 0 : cfg->first_step;
    w->slots = adt_calloc((size_t)w->n_slots, sizeof *w->slots);
    for (int i = -1; i < w->n_slots; i++) {
        wslot *sl = i < 0 ? &w->peek : &w->slots[i];
        sl->step = -1;
        sl->req_ids = adt_calloc((size_t)w->S, sizeof *sl->req_ids);
        sl->req_n = adt_calloc((size_t)w->S, sizeof *sl->req_n);
        sl->rep_floats = adt_calloc((size_t)w->S, sizeof *sl->rep_floats);
        sl->rep = adt_calloc((size_t)w->S, sizeof *sl->rep);
        sl->rq = adt_malloc((size_t)(2 * w->S) * sizeof *sl->rq);
        for (int k = 0; k < 2 * w->S; k++) sl->rq[k] = MPI_REQUEST_NULL;
    }
    w->push_hdr = adt_calloc((size_t)w->S, sizeof *w->push_hdr);
    w->push_g = adt_calloc((size_t)w->S, sizeof *w->push_g);
    w->push_rq = adt_malloc((size_t)(2 * w->S) * sizeof *w->push_rq);
    w->done_at = adt_calloc((size_t)(2 * w->S), sizeof *w->done_at);
    w->answer_s = adt_calloc((size_t)w->S, sizeof *w->answer_s);
    for (int k = 0; k < 2 * w->S; k++) w->push_rq[k] = MPI_REQUEST_NULL;
    ps_idmap_init(&w->map);
    *out = w;
    return ADT_OK;
}

/* A request left in flight by an error: withdrawn (a receive) or let go (a send), so that its
 * buffer can be freed. */
static void drop_request(MPI_Request *rq) {
    if (*rq == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Test(rq, &done, MPI_STATUS_IGNORE);
    if (done) return;
    MPI_Cancel(rq);
    MPI_Request_free(rq);
}

void adt_ps_worker_free(adt_ps_worker *w) {
    if (!w) return;
    for (int k = 0; k < 2 * w->S; k++) drop_request(&w->push_rq[k]);
    if (w->chunk_live) drop_request(&w->chunk_rq[0]), drop_request(&w->chunk_rq[1]);
    for (int i = -1; i < w->n_slots; i++) {
        wslot *sl = i < 0 ? &w->peek : &w->slots[i];
        for (int k = 0; k < 2 * w->S; k++) drop_request(&sl->rq[k]);
        slot_release(w, sl);
        free(sl->uidx);
        for (int t = 0; t < w->T; t++) free(sl->uniq[t]), free(sl->owner[t]), free(sl->at[t]);
        free(sl->req_ids), free(sl->req_n), free(sl->rep_floats), free(sl->rep), free(sl->rq);
    }
    for (int p = 0; p < w->S; p++) free(w->push_hdr[p]), free(w->push_g[p]);
    free(w->push_hdr), free(w->push_g), free(w->push_rq), free(w->slots), free(w->agg);
    free(w->done_at), free(w->answer_s);
    ps_idmap_free(&w->map);
    free(w);
}

/* Waits for rq[0..n) within the deadline; `what` and `step` name them in the error; done_at (or
 * NULL) gets when each was seen complete. */
static int wait_seen(adt_ps_worker *w, MPI_Request *rq, int n, const char *what, int64_t step, double *done_at) {
    double t0 = adt_now_s();
    int idle = 0;
    for (;;) {
        int flag = 1;
        for (int k = 0; k < n; k++) { /* one by one: GCC misreads MPI_Testall's MPI_STATUSES_IGNORE */
            int f = 1;
            if (rq[k] != MPI_REQUEST_NULL) {
                MPI_Test(&rq[k], &f, MPI_STATUS_IGNORE);
                if (f && done_at) done_at[k] = adt_now_s();
            }
            flag &= f;
        }
        if (flag) return ADT_OK;
        if (adt_now_s() - t0 > w->timeout) {
            int missing = -1;
            for (int k = 0; k < n && missing < 0; k++)
                if (rq[k] != MPI_REQUEST_NULL) missing = k;
            return adt_error(ADT_ERR_COMM, "ps worker %d: %s of step %lld not complete after %.0f s (server %d among "
                             "others): expected the servers alive", w->pw->worker, what, (long long)step, w->timeout,
                             missing % w->S);
        }
        ps_nap(&idle);
    }
}

static int wait_all(adt_ps_worker *w, MPI_Request *rq, int n, const char *what, int64_t step) {
    return wait_seen(w, rq, n, what, step, NULL);
}

static int post_requests(adt_ps_worker *w, wslot *sl, int64_t step, const int32_t *ids, int B, int req, int rep);
static void expand_rows(adt_ps_worker *w, const wslot *sl, float *const *rows);

int adt_ps_worker_pull(adt_ps_worker *w, int64_t step, const int32_t *ids, int B) {
    if (step != w->next_pull)
        return adt_error(ADT_ERR_STATE, "ps worker %d: a pull of step %lld, expected step %lld (steps in order)",
                         w->pw->worker, (long long)step, (long long)w->next_pull);
    if (step - w->next_push > w->cfg.prefetch)
        return adt_error(ADT_ERR_STATE, "ps worker %d: a pull of step %lld while step %lld is not pushed: more than "
                         "--ps-prefetch %d steps ahead", w->pw->worker, (long long)step, (long long)w->next_push,
                         w->cfg.prefetch);
    int rc = post_requests(w, &w->slots[step % w->n_slots], step, ids, B, PS_TAG_PULL, PS_TAG_ROWS);
    if (!rc) w->next_pull++;
    return rc;
}

/* Deduplicates a batch's ids into slot sl and sends each server its request (tag req), with the
 * receive of its answer (tag rep) posted. */
static int post_requests(adt_ps_worker *w, wslot *sl, int64_t step, const int32_t *ids, int B, int req, int rep) {
    if (B < 1) return adt_error(ADT_ERR_ARG, "ps worker: a batch of %d samples, expected >= 1", B);
    int S = w->S, T = w->T;
    sl->step = step;
    sl->B = B;
    sl->pulled_rows = 0;
    sl->uidx = adt_realloc(sl->uidx, (size_t)B * (size_t)T * sizeof *sl->uidx);
    int64_t *per_srv = adt_calloc((size_t)S * (size_t)T, sizeof *per_srv); /* [S][T] counts */
    int n_sparse = 0, col = 0; /* ids: one column per table that is not whole, in table order */
    for (int t = 0; t < T; t++) n_sparse += !w->cfg.tables[t].whole;
    for (int t = 0; t < T; t++) {
        const adt_ps_table *tc = &w->cfg.tables[t];
        int64_t cap = tc->whole ? tc->rows : B;
        sl->uniq[t] = adt_realloc(sl->uniq[t], (size_t)cap * sizeof *sl->uniq[t]);
        sl->owner[t] = adt_realloc(sl->owner[t], (size_t)cap * sizeof *sl->owner[t]);
        sl->at[t] = adt_realloc(sl->at[t], (size_t)cap * sizeof *sl->at[t]);
        if (tc->whole) { /* a dense parameter: every row, in order */
            for (int64_t u = 0; u < tc->rows; u++) {
                int o = adt_ps_owner(t, (uint64_t)u, S);
                sl->uniq[t][u] = (uint64_t)u, sl->owner[t][u] = o;
                per_srv[(int64_t)o * T + t]++;
            }
            sl->n_uniq[t] = tc->rows;
            continue;
        }
        ps_idmap_clear(&w->map);
        for (int b = 0; b < B; b++) {
            int32_t id = ids[(int64_t)b * n_sparse + col];
            if (id < 0) {
                free(per_srv);
                return adt_error(ADT_ERR_ARG, "ps worker: sample %d's id of table %d is %d, expected >= 0", b, t, id);
            }
            int added;
            int32_t u = ps_idmap_put(&w->map, (uint64_t)id, &added);
            sl->uidx[(int64_t)b * T + t] = u;
            if (added) {
                sl->uniq[t][u] = (uint64_t)id;
                int o = adt_ps_owner(t, (uint64_t)id, S);
                sl->owner[t][u] = o;
                per_srv[(int64_t)o * T + t]++;
            }
        }
        col++;
        sl->n_uniq[t] = w->map.n;
        w->st.ids += B;
        w->st.unique_ids += w->map.n;
    }
    /* one request per server: [step, counts, ids by table], every server even with no ids: the
     * request carries the step to its staleness clock */
    for (int p = 0; p < S; p++) {
        int64_t n = 1 + T, f = 0;
        for (int t = 0; t < T; t++) n += per_srv[(int64_t)p * T + t], f += per_srv[(int64_t)p * T + t] * w->cfg.tables[t].dim;
        sl->req_n[p] = n;
        sl->req_ids[p] = adt_malloc((size_t)n * sizeof **sl->req_ids);
        sl->req_ids[p][0] = step;
        for (int t = 0; t < T; t++) sl->req_ids[p][1 + t] = per_srv[(int64_t)p * T + t];
        sl->rep_floats[p] = f;
        sl->rep[p] = adt_malloc((size_t)(f ? f : 1) * sizeof **sl->rep);
    }
    int64_t *fill = adt_malloc((size_t)S * sizeof *fill), *foff = adt_calloc((size_t)S, sizeof *foff);
    for (int p = 0; p < S; p++) fill[p] = 1 + T;
    for (int t = 0; t < T; t++)
        for (int64_t u = 0; u < sl->n_uniq[t]; u++) {
            int o = sl->owner[t][u];
            sl->req_ids[o][fill[o]++] = (int64_t)sl->uniq[t][u];
            sl->at[t][u] = foff[o];
            foff[o] += w->cfg.tables[t].dim;
        }
    free(fill), free(foff), free(per_srv);
    sl->t_post = adt_now_s();
    for (int p = 0; p < S; p++) {
        MPI_Irecv(sl->rep[p], (int)sl->rep_floats[p], MPI_FLOAT, p, rep, w->comm, &sl->rq[S + p]);
        MPI_Isend(sl->req_ids[p], (int)sl->req_n[p], MPI_INT64_T, p, req, w->comm, &sl->rq[p]);
    }
    return ADT_OK;
}

int adt_ps_worker_rows(adt_ps_worker *w, int64_t step, float *const *rows) {
    wslot *sl = &w->slots[step % w->n_slots];
    if (sl->step != step || step != w->next_push)
        return adt_error(ADT_ERR_STATE, "ps worker %d: rows of step %lld, expected the pulled, unpushed step %lld",
                         w->pw->worker, (long long)step, (long long)w->next_push);
    double t0 = adt_now_s();
    for (int k = 0; k < 2 * w->S; k++) w->done_at[k] = t0; /* seen before: answered by now */
    int rc = wait_seen(w, sl->rq, 2 * w->S, "the rows pulled", step, w->done_at);
    w->st.wait_rows_s += adt_now_s() - t0;
    for (int p = 0; p < w->S && !rc; p++) w->answer_s[p] = w->done_at[w->S + p] - sl->t_post;
    if (rc) return rc;
    expand_rows(w, sl, rows);
    sl->pulled_rows = 1;
    return ADT_OK;
}

/* The answers of slot sl in batch order (whole tables: in row order). */
static void expand_rows(adt_ps_worker *w, const wslot *sl, float *const *rows) {
    int T = w->T;
    for (int t = 0; t < T; t++) {
        int dim = w->cfg.tables[t].dim;
        if (w->cfg.tables[t].whole) {
            for (int64_t u = 0; u < sl->n_uniq[t]; u++)
                memcpy(rows[t] + u * dim, sl->rep[sl->owner[t][u]] + sl->at[t][u], (size_t)dim * sizeof(float));
            continue;
        }
        for (int b = 0; b < sl->B; b++) {
            int32_t u = sl->uidx[(int64_t)b * T + t];
            memcpy(rows[t] + (int64_t)b * dim, sl->rep[sl->owner[t][u]] + sl->at[t][u], (size_t)dim * sizeof(float));
        }
    }
}

int adt_ps_worker_answer_s(const adt_ps_worker *w, double *s, int n) {
    for (int p = 0; p < w->S && p < n; p++) s[p] = w->answer_s[p];
    return w->S;
}

int adt_ps_worker_lookup(adt_ps_worker *w, const int32_t *ids, int B, float *const *rows) {
    wslot *sl = &w->peek;
    /* the step field: the server answers once every worker has pushed the steps this one has */
    int rc = post_requests(w, sl, w->next_push, ids, B, PS_TAG_PEEK, PS_TAG_PEEKROWS);
    if (!rc) rc = wait_all(w, sl->rq, 2 * w->S, "a lookup", w->next_push);
    if (!rc) expand_rows(w, sl, rows);
    slot_release(w, sl);
    return rc;
}

int adt_ps_worker_push(adt_ps_worker *w, int64_t step, const float *const *grads) {
    wslot *sl = &w->slots[step % w->n_slots];
    if (sl->step != step || step != w->next_push || !sl->pulled_rows)
        return adt_error(ADT_ERR_STATE, "ps worker %d: a push of step %lld, expected step %lld after its rows",
                         w->pw->worker, (long long)step, (long long)w->next_push);
    double t0 = adt_now_s();
    int rc = wait_all(w, w->push_rq, 2 * w->S, "the previous push", step - 1);
    if (rc) return rc;
    int S = w->S, T = w->T;
    for (int p = 0; p < S; p++) {
        free(w->push_hdr[p]), free(w->push_g[p]);
        /* the same ids as the pull, in the same order: the push reuses its request */
        w->push_hdr[p] = sl->req_ids[p];
        sl->req_ids[p] = NULL;
        w->push_g[p] = adt_calloc((size_t)(sl->rep_floats[p] ? sl->rep_floats[p] : 1), sizeof(float));
    }
    /* summed per distinct row in sample order, straight into the server's slot */
    for (int t = 0; t < T; t++) {
        int dim = w->cfg.tables[t].dim;
        if (w->cfg.tables[t].whole) {
            for (int64_t u = 0; u < sl->n_uniq[t]; u++)
                memcpy(w->push_g[sl->owner[t][u]] + sl->at[t][u], grads[t] + u * dim, (size_t)dim * sizeof(float));
            continue;
        }
        for (int b = 0; b < sl->B; b++) {
            int32_t u = sl->uidx[(int64_t)b * T + t];
            float *a = w->push_g[sl->owner[t][u]] + sl->at[t][u];
            const float *g = grads[t] + (int64_t)b * dim;
            for (int j = 0; j < dim; j++) a[j] += g[j];
        }
    }
    for (int p = 0; p < S; p++) {
        MPI_Isend(w->push_hdr[p], (int)sl->req_n[p], MPI_INT64_T, p, PS_TAG_PUSH, w->comm, &w->push_rq[p]);
        MPI_Isend(w->push_g[p], (int)sl->rep_floats[p], MPI_FLOAT, p, PS_TAG_GRAD, w->comm, &w->push_rq[S + p]);
    }
    slot_release(w, sl);
    w->next_push++;
    w->st.push_s += adt_now_s() - t0;
    return ADT_OK;
}

int adt_ps_worker_done(adt_ps_worker *w) {
    /* pulls made ahead for steps that will not run: their answers are awaited and dropped */
    for (int64_t s = w->next_push; s < w->next_pull; s++) {
        wslot *sl = &w->slots[s % w->n_slots];
        int rc = wait_all(w, sl->rq, 2 * w->S, "a prefetched pull", s);
        if (rc) return rc;
        slot_release(w, sl);
    }
    int rc = wait_all(w, w->push_rq, 2 * w->S, "the last push", w->next_push - 1);
    if (rc) return rc;
    int64_t msg = w->next_push;
    MPI_Request *rq = adt_malloc((size_t)w->S * sizeof *rq);
    for (int p = 0; p < w->S; p++) MPI_Isend(&msg, 1, MPI_INT64_T, p, PS_TAG_DONE, w->comm, &rq[p]);
    rc = wait_all(w, rq, w->S, "the end of work", msg);
    free(rq);
    return rc;
}

static void ask_chunk(adt_ps_worker *w) {
    w->chunk_ask = 0;
    MPI_Irecv(&w->chunk_ans, 1, MPI_INT64_T, 0, PS_TAG_CHUNK, w->comm, &w->chunk_rq[1]);
    MPI_Isend(&w->chunk_ask, 1, MPI_INT64_T, 0, PS_TAG_NEXT, w->comm, &w->chunk_rq[0]);
    w->chunk_live = 1;
}

/* One ask stays in flight while a chunk trains, so the round trip to server 0 is hidden; the
 * answers come in the order of the asks (MPI keeps a pair's messages in order). */
int adt_ps_worker_next_chunk(adt_ps_worker *w, int64_t *chunk) {
    if (w->cfg.chunks <= 0)
        return adt_error(ADT_ERR_STATE, "ps worker %d: a chunk asked for, but the run has no dynamic sharding "
                         "(adt_ps_cfg.chunks 0)", w->pw->worker);
    if (!w->chunk_live) ask_chunk(w);
    int rc = wait_all(w, w->chunk_rq, 2, "a chunk request", w->next_pull);
    if (rc) {
        drop_request(&w->chunk_rq[0]), drop_request(&w->chunk_rq[1]);
        w->chunk_live = 0;
        return rc;
    }
    w->chunk_live = 0;
    *chunk = w->chunk_ans;
    if (*chunk >= 0) ask_chunk(w);
    return ADT_OK;
}

int adt_ps_worker_save(adt_ps_worker *w, const char *const *paths) {
    int S = w->S;
    int64_t **msg = adt_calloc((size_t)S, sizeof *msg), **rep = adt_calloc((size_t)S, sizeof *rep);
    MPI_Request *rq = adt_malloc((size_t)(2 * S) * sizeof *rq);
    for (int p = 0; p < S; p++) {
        size_t len = strlen(paths[p]) + 1, words = (len + 7) / 8;
        msg[p] = adt_calloc(1 + words, sizeof **msg);
        msg[p][0] = w->next_push;
        memcpy(msg[p] + 1, paths[p], len);
        rep[p] = adt_calloc(PS_SAVED_WORDS, sizeof **rep);
        MPI_Irecv(rep[p], PS_SAVED_WORDS, MPI_INT64_T, p, PS_TAG_SAVED, w->comm, &rq[S + p]);
        MPI_Isend(msg[p], (int)(1 + words), MPI_INT64_T, p, PS_TAG_SAVE, w->comm, &rq[p]);
    }
    int rc = wait_all(w, rq, 2 * S, "a checkpoint's cut", w->next_push);
    if (rc)
        for (int k = 0; k < 2 * S; k++) drop_request(&rq[k]);
    for (int p = 0; p < S && !rc; p++)
        if (rep[p][0]) {
            ((char *)rep[p])[PS_SAVED_WORDS * sizeof **rep - 1] = 0;
            rc = adt_error(ADT_ERR_IO, "ps server %d: writing its shard %s: %s", p, paths[p], (const char *)(rep[p] + 1));
        }
    for (int p = 0; p < S; p++) free(msg[p]), free(rep[p]);
    free(msg), free(rep), free(rq);
    return rc;
}

void adt_ps_worker_get_stats(const adt_ps_worker *w, adt_ps_worker_stats *st) { *st = w->st; }

const adt_ps_cfg *adt_ps_worker_cfg(const adt_ps_worker *w) { return &w->cfg; }
