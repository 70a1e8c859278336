/*
 * ledger_audit.c - the exactly-once audit.
 *
 * Two independent accounts of the same job are compared:
 *   1. the replay: the events table read from the start, reports kept, rewinds cutting off the
 *      reports of steps >= their step, commits moving the committed point. What survives below
 *      the final committed point is what the committed model was trained on; it is mapped to
 *      sample ids through each epoch's order and counted per id.
 *   2. the state: lease prefixes ([start, committed) committed, [committed, cursor) consumed
 *      since), active leases' rests, the pool and the dead letters, which together must cover
 *      every position of every opened epoch exactly once.
 * An id trained more than once is duplicated; an id the state counts as committed but the replay
 * does not, or that nothing covers, is missing; any other disagreement is inconsistent. The
 * replay also adds up every committed step, which must come to the global batch.
 */
#include <stdlib.h>
#include <string.h>

#include "elastic/ledger_internal.h"

typedef struct rep {
    int64_t step, epoch, a, b;
} rep;

typedef struct replay {
    rep *r;
    size_t n, cap;
    int64_t committed;
} replay;

enum { COV_C = 1, COV_U = 2, COV_L = 4, COV_Q = 8, COV_D = 16, COV_CONFLICT = 128 };

static int cmp_rep(const void *x, const void *y) {
    const rep *a = x, *b = y;
    return a->epoch != b->epoch ? (a->epoch < b->epoch ? -1 : 1) : (a->a < b->a ? -1 : a->a > b->a);
}

static int do_replay(adt_ledger *L, replay *rp, adt_ledger_audit *au) {
    sqlite3_stmt *s = ledger_prepare(L, "SELECT kind, step, epoch, a, b FROM events ORDER BY seq");
    if (!s) return ADT_ERR_IO;
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        int kind = sqlite3_column_int(s, 0);
        int64_t step = ledger_col(s, 1);
        au->events++;
        if (kind == EV_REPORT) {
            au->reports++;
            if (rp->n == rp->cap) {
                rp->cap *= 2;
                rp->r = adt_realloc(rp->r, rp->cap * sizeof *rp->r);
            }
            rp->r[rp->n++] = (rep){step, ledger_col(s, 2), ledger_col(s, 3), ledger_col(s, 4)};
        } else if (kind == EV_COMMIT) {
            au->commits++;
            rp->committed = step;
        } else if (kind == EV_REWIND) {
            au->rewinds++;
            size_t k = 0;
            for (size_t i = 0; i < rp->n; i++) {
                if (rp->r[i].step < step) rp->r[k++] = rp->r[i];
                else au->retrained += rp->r[i].b - rp->r[i].a;
            }
            rp->n = k;
            rp->committed = step;
        } else if (kind == EV_REVOKE) {
            au->revocations++;
        } else if (kind == EV_DEAD_LETTER) {
            au->dead_letter_ranges++;
        }
    }
    ledger_release(L, s);
    return rc < 0 ? rc : ADT_OK;
}

/* Marks positions [a, b) with `bit`; a position marked twice gets COV_CONFLICT. Out-of-range
 * rows (a damaged file) count as inconsistent. */
static void cover(uint8_t *cov, int64_t P, int64_t a, int64_t b, uint8_t bit, int64_t *bad) {
    if (a < 0 || b > P || a > b) {
        *bad += b > a ? b - a : 1;
        return;
    }
    for (int64_t p = a; p < b; p++) cov[p] = cov[p] ? (uint8_t)(cov[p] | bit | COV_CONFLICT) : bit;
}

/* The rows of one table for epoch e: leases (bit 0: start, end, cursor, committed, state), or
 * ranges of the pool or the dead letters (bit COV_Q or COV_D: start, end). */
static int cover_table(adt_ledger *L, const char *sql, int64_t e, uint8_t bit, uint8_t *cov, int64_t *bad) {
    sqlite3_stmt *s = ledger_prepare(L, sql);
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, ledger_shard_id(L, e, 0));
    sqlite3_bind_int64(s, 2, ledger_shard_id(L, e + 1, 0));
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        int64_t a = sqlite3_column_int64(s, 0), b = sqlite3_column_int64(s, 1);
        if (bit) {
            cover(cov, L->positions, a, b, bit, bad);
            continue;
        }
        int64_t cur = sqlite3_column_int64(s, 2), com = sqlite3_column_int64(s, 3);
        int state = sqlite3_column_int(s, 4);
        if (!(a <= com && com <= cur && cur <= b)) {
            *bad += b - a;
            continue;
        }
        cover(cov, L->positions, a, com, COV_C, bad);
        cover(cov, L->positions, com, cur, COV_U, bad);
        if (state == ADT_LEASE_ACTIVE) cover(cov, L->positions, cur, b, COV_L, bad);
    }
    ledger_release(L, s);
    return rc < 0 ? rc : ADT_OK;
}

static void note_bad(adt_ledger_epoch_audit *ea, int64_t id) {
    if (ea->first_bad_id < 0) ea->first_bad_id = id;
}

/* One opened epoch: reps[0..n) are its surviving reports. */
static int audit_epoch(adt_ledger *L, int64_t e, const rep *reps, size_t n, int64_t committed, int64_t *steps_total,
                       adt_ledger_epoch_audit *ea, int64_t *uncommitted, uint8_t *cc, uint8_t *uc, uint8_t *cov,
                       uint8_t *idc) {
    const int64_t P = L->positions, N = L->job.samples;
    memset(cc, 0, (size_t)P);
    memset(uc, 0, (size_t)P);
    memset(cov, 0, (size_t)P);
    memset(idc, 0, (size_t)N);
    for (size_t i = 0; i < n; i++) {
        const rep *r = &reps[i];
        if (r->a < 0 || r->b > P || r->a >= r->b || r->step < 0) {
            ea->inconsistent += r->b > r->a ? r->b - r->a : 1;
            continue;
        }
        uint8_t *c = r->step < committed ? cc : uc;
        for (int64_t p = r->a; p < r->b; p++) c[p] = c[p] < 255 ? c[p] + 1 : 255;
        if (r->step < committed) steps_total[r->step] += r->b - r->a;
        else *uncommitted += r->b - r->a;
    }
    int rc = cover_table(L, "SELECT start, end, cursor, committed, state FROM leases WHERE shard >= ?1 AND shard < ?2",
                         e, 0, cov, &ea->inconsistent);
    if (!rc) rc = cover_table(L, "SELECT start, end FROM pool WHERE shard >= ?1 AND shard < ?2", e, COV_Q, cov, &ea->inconsistent);
    if (!rc) rc = cover_table(L, "SELECT start, end FROM dead WHERE shard >= ?1 AND shard < ?2", e, COV_D, cov, &ea->inconsistent);
    if (rc) return rc;
    /* Count the replay per sample id: the order maps positions to ids, so an order that
     * repeated an id would show here as a duplicate. */
    const int64_t *perm = ledger_perm(L, e);
    if (!perm) return ADT_ERR_NOMEM;
    for (int64_t p = 0; p < P; p++) {
        int64_t id = perm[p];
        if (id < 0 || id >= N) return adt_error(ADT_ERR_STATE, "audit: epoch %lld's order holds id %lld, outside 0..%lld",
                                                (long long)e, (long long)id, (long long)N - 1);
        idc[id] = (uint8_t)(idc[id] + cc[p] > 255 ? 255 : idc[id] + cc[p]);
    }
    for (int64_t p = 0; p < P; p++) {
        int64_t id = perm[p];
        uint8_t st = cov[p];
        int single = st && !(st & COV_CONFLICT);
        if (idc[id] >= 2) {
            ea->duplicated++;
            note_bad(ea, id);
        } else if (idc[id] == 1) {
            if (st == COV_C && uc[p] == 0) ea->trained++;
            else {
                ea->inconsistent++;
                note_bad(ea, id);
            }
        } else if (!st || st == COV_C) {
            ea->missing++;
            note_bad(ea, id);
        } else if (single && st == COV_D && uc[p] == 0) {
            ea->dead_lettered++;
        } else if (single && ((st == COV_U && uc[p] == 1) || ((st == COV_L || st == COV_Q) && uc[p] == 0))) {
            ea->pending++;
        } else {
            ea->inconsistent++;
            note_bad(ea, id);
        }
    }
    return ADT_OK;
}

static int audit_read(adt_ledger *L, adt_ledger_audit *au) {
    replay rp = {.r = adt_malloc(1024 * sizeof(rep)), .cap = 1024};
    int rc = do_replay(L, &rp, au);
    const int64_t E = L->job.epochs, P = L->positions, B = L->job.global_batch;
    au->replayed_steps = rp.committed;
    if (!rc && (rp.committed < 0 || rp.committed > adt_ledger_job_steps(&L->job)))
        rc = adt_error(ADT_ERR_FORMAT, "audit of %s: the events commit step %lld, outside the job's 0..%lld", L->path,
                       (long long)rp.committed, (long long)adt_ledger_job_steps(&L->job));
    if (rc) rp.committed = 0;
    au->n_epochs = E;
    au->epoch = adt_calloc((size_t)E, sizeof *au->epoch);
    int64_t *steps_total = adt_calloc((size_t)(rp.committed > 0 ? rp.committed : 1), sizeof *steps_total);
    /* a byte per position three times and per sample once: an error, not an abort, if too much */
    uint8_t *cc = malloc((size_t)P), *uc = malloc((size_t)P), *cov = malloc((size_t)P);
    uint8_t *idc = malloc((size_t)L->job.samples);
    if (!rc && !(cc && uc && cov && idc))
        rc = adt_error(ADT_ERR_NOMEM, "audit of %s: no memory for %lld samples", L->path, (long long)L->job.samples);
    qsort(rp.r, rp.n, sizeof *rp.r, cmp_rep);
    size_t i = 0;
    for (int64_t e = 0; e < E && !rc; e++) {
        adt_ledger_epoch_audit *ea = &au->epoch[e];
        ea->epoch = e;
        ea->samples = P;
        ea->first_bad_id = -1;
        while (i < rp.n && rp.r[i].epoch < e) {
            ea->inconsistent++; /* a report naming no epoch of the job (sorted first) */
            i++;
        }
        size_t j = i;
        while (j < rp.n && rp.r[j].epoch == e) j++;
        if (e < L->epochs_opened) {
            ea->opened = 1;
            rc = audit_epoch(L, e, rp.r + i, j - i, rp.committed, steps_total, ea, &au->uncommitted, cc, uc, cov, idc);
        } else {
            ea->pending = P;
            ea->inconsistent += (int64_t)(j - i); /* reports for an epoch never cut into shards */
        }
        i = j;
    }
    if (!rc && i < rp.n) au->epoch[E - 1].inconsistent += (int64_t)(rp.n - i);

    /* Pool empty, every epoch cut, nothing leased: the job's last step may be short. */
    int64_t pool = 0, active = 0;
    if (!rc) rc = ledger_query_i64(L, "SELECT COUNT(*) FROM pool", &pool, 0, 0);
    if (!rc) rc = ledger_query_i64(L, "SELECT COUNT(*) FROM leases WHERE state = 0", &active, 0, 0);
    int exhausted = L->epochs_opened == E && pool == 0 && active == 0;
    au->first_bad_step = -1;
    for (int64_t s = 0; s < rp.committed && !rc; s++) {
        int short_last = s == rp.committed - 1 && exhausted && steps_total[s] > 0 && steps_total[s] < B;
        if (steps_total[s] != B && !short_last) {
            au->steps_bad++;
            if (au->first_bad_step < 0) au->first_bad_step = s;
        }
    }
    int64_t bad = 0, pending = 0;
    for (int64_t e = 0; e < E; e++) {
        bad += au->epoch[e].missing + au->epoch[e].duplicated + au->epoch[e].inconsistent;
        pending += au->epoch[e].pending;
    }
    au->ok = !rc && bad == 0 && au->steps_bad == 0 && au->replayed_steps == au->committed_steps;
    au->complete = au->ok && pending == 0 && exhausted;
    free(rp.r);
    free(steps_total);
    free(cc);
    free(uc);
    free(cov);
    free(idc);
    return rc;
}

int adt_ledger_audit_run(adt_ledger *L, adt_ledger_audit *au) {
    memset(au, 0, sizeof *au);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_exec(L, "BEGIN");
    if (!rc) rc = ledger_load_state(L);
    if (!rc) {
        au->job = L->job;
        au->generation = L->generation;
        au->committed_steps = L->committed_steps;
        au->dropped_per_epoch = L->job.samples - L->positions;
        rc = audit_read(L, au);
    }
    if (!sqlite3_get_autocommit(L->db)) ledger_exec(L, "COMMIT");
    pthread_mutex_unlock(&L->mu);
    if (rc) {
        adt_ledger_audit_free(au);
        au->ok = 0;
    }
    return rc;
}

void adt_ledger_audit_free(adt_ledger_audit *a) {
    free(a->epoch);
    a->epoch = NULL;
    a->n_epochs = 0;
}

void adt_ledger_audit_print(FILE *f, const adt_ledger_audit *a) {
    const adt_ledger_job *j = &a->job;
    fprintf(f, "job: %lld samples, global batch %lld, shards of %lld, %lld epochs (%lld samples each, %lld left out "
               "by the batch)\n",
            (long long)j->samples, (long long)j->global_batch, (long long)j->shard_size, (long long)j->epochs,
            (long long)(j->samples - a->dropped_per_epoch), (long long)a->dropped_per_epoch);
    fprintf(f, "ledger: generation %lld, committed after step %lld (replayed: %lld); %lld events: %lld reports, %lld "
               "commits, %lld rewinds (%lld samples trained again), %lld revocations, %lld dead-letter ranges; %lld "
               "samples consumed since the commit\n",
            (long long)a->generation, (long long)a->committed_steps, (long long)a->replayed_steps, (long long)a->events,
            (long long)a->reports, (long long)a->commits, (long long)a->rewinds, (long long)a->retrained,
            (long long)a->revocations, (long long)a->dead_letter_ranges, (long long)a->uncommitted);
    fprintf(f, "%6s %10s %10s %10s %10s %10s %10s %12s\n", "epoch", "samples", "trained", "duplicated", "missing",
            "pending", "dead", "inconsistent");
    for (int64_t e = 0; e < a->n_epochs; e++) {
        const adt_ledger_epoch_audit *x = &a->epoch[e];
        fprintf(f, "%6lld %10lld %10lld %10lld %10lld %10lld %10lld %12lld", (long long)x->epoch, (long long)x->samples,
                (long long)x->trained, (long long)x->duplicated, (long long)x->missing, (long long)x->pending,
                (long long)x->dead_lettered, (long long)x->inconsistent);
        if (x->first_bad_id >= 0) fprintf(f, "  first bad sample id %lld", (long long)x->first_bad_id);
        fprintf(f, "%s\n", x->opened ? "" : "  (not started)");
    }
    fprintf(f, "steps: %lld committed, %lld not of the global batch", (long long)a->replayed_steps,
            (long long)a->steps_bad);
    if (a->first_bad_step >= 0) fprintf(f, " (first: step %lld)", (long long)a->first_bad_step);
    fprintf(f, "\n");
    int64_t dead = 0;
    for (int64_t e = 0; e < a->n_epochs; e++) dead += a->epoch[e].dead_lettered;
    if (!a->ok) fprintf(f, "verdict: FAILED: samples missing, duplicated or inconsistent, or bad steps (see above)\n");
    else if (a->complete)
        fprintf(f, "verdict: ok: every sample trained exactly once per epoch%s\n",
                dead ? ", except the dead letters listed" : "");
    else fprintf(f, "verdict: ok so far: nothing missing or duplicated; the job is not finished\n");
}
