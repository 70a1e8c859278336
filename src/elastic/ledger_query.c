/*
 * ledger_query.c - reading the ledger: status, lease and dead-letter listings, sample ids of
 * positions, and the events as JSON lines. Each call reads one consistent snapshot (a read
 * transaction), so an audit process may run these next to a live master.
 */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/data.h"
#include "elastic/ledger_internal.h"

/* A read snapshot; for a read-only handle also the job state another process may have moved. */
static int read_begin(adt_ledger *L) {
    pthread_mutex_lock(&L->mu);
    int rc = ledger_exec(L, "BEGIN");
    if (!rc) rc = ledger_load_state(L);
    if (rc) {
        if (!sqlite3_get_autocommit(L->db)) ledger_exec(L, "ROLLBACK");
        pthread_mutex_unlock(&L->mu);
    }
    return rc;
}

static int read_end(adt_ledger *L, int rc) {
    if (!sqlite3_get_autocommit(L->db)) {
        int r = ledger_exec(L, "COMMIT");
        if (!rc) rc = r;
    }
    pthread_mutex_unlock(&L->mu);
    return rc;
}

static int status_read(adt_ledger *L, adt_ledger_status *st) {
    int64_t pool = 0, active = 0, next = -1;
    int rc;
    st->generation = L->generation;
    st->replicas = L->replicas;
    st->committed_steps = L->committed_steps;
    st->epochs_opened = L->epochs_opened;
    if ((rc = ledger_query_i64(L, "SELECT COALESCE(SUM(end - start), 0) FROM pool", &pool, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COUNT(*) FROM leases WHERE state = 0", &active, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COALESCE(SUM(end - cursor), 0) FROM leases WHERE state = 0",
                               &st->leased_samples, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COALESCE(SUM(cursor - committed), 0) FROM leases WHERE committed < cursor",
                               &st->uncommitted, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COALESCE(SUM(committed - start), 0) FROM leases", &st->committed, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COALESCE(SUM(end - start), 0) FROM dead", &st->dead_samples, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT COALESCE(MAX(seq), 0) FROM events", &st->events, 0, 0)) ||
        (rc = ledger_query_i64(L, "SELECT MAX(last_step) FROM leases WHERE generation = ?1", &next, -1, 1,
                               L->generation)))
        return rc;
    st->pool_samples = pool;
    st->active_leases = active;
    st->next_step = next + 1 > L->committed_steps ? next + 1 : L->committed_steps;
    st->done = L->epochs_opened == L->job.epochs && pool == 0 && active == 0;
    sqlite3_stmt *s = ledger_prepare(L, "SELECT checkpoint FROM job WHERE id = 1");
    if (!s) return ADT_ERR_IO;
    if ((rc = ledger_step(L, s)) == 1) {
        const unsigned char *c = sqlite3_column_text(s, 0);
        snprintf(st->checkpoint, sizeof st->checkpoint, "%s", c ? (const char *)c : "");
    }
    ledger_release(L, s);
    return rc < 0 ? rc : ADT_OK;
}

int adt_ledger_get_status(adt_ledger *L, adt_ledger_status *st) {
    memset(st, 0, sizeof *st);
    int rc = read_begin(L);
    if (rc) return rc;
    return read_end(L, status_read(L, st));
}

int adt_ledger_lease_get(adt_ledger *L, int64_t id, adt_ledger_lease *out) {
    memset(out, 0, sizeof *out);
    int rc = read_begin(L);
    if (rc) return rc;
    return read_end(L, ledger_lease_read(L, id, out));
}

static int leases_read(adt_ledger *L, int active_only, adt_ledger_lease **out, int64_t *n) {
    sqlite3_stmt *s = ledger_prepare(L, active_only ? "SELECT id FROM leases WHERE state = 0 ORDER BY id"
                                                    : "SELECT id FROM leases ORDER BY id");
    if (!s) return ADT_ERR_IO;
    int64_t *ids = NULL, k = 0;
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        ids = adt_realloc(ids, (size_t)(k + 1) * sizeof *ids);
        ids[k++] = sqlite3_column_int64(s, 0);
    }
    ledger_release(L, s);
    adt_ledger_lease *v = adt_calloc((size_t)k + 1, sizeof *v);
    for (int64_t i = 0; i < k && rc == 0; i++) rc = ledger_lease_read(L, ids[i], &v[i]);
    free(ids);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n = k;
    return ADT_OK;
}

int adt_ledger_leases(adt_ledger *L, int active_only, adt_ledger_lease **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    int rc = read_begin(L);
    if (rc) return rc;
    return read_end(L, leases_read(L, active_only, out, n));
}

static int dead_read(adt_ledger *L, adt_ledger_dead **out, int64_t *n) {
    sqlite3_stmt *s = ledger_prepare(L, "SELECT d.shard, d.start, d.end, COALESCE(s.failures, 0) FROM dead d"
                                        " LEFT JOIN shards s ON s.id = d.shard ORDER BY d.shard, d.start");
    if (!s) return ADT_ERR_IO;
    adt_ledger_dead *v = NULL;
    int64_t k = 0;
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        v = adt_realloc(v, (size_t)(k + 1) * sizeof *v);
        int64_t shard = sqlite3_column_int64(s, 0);
        v[k++] = (adt_ledger_dead){ledger_shard_epoch(L, shard), ledger_shard_index(L, shard),
                                   sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2), sqlite3_column_int(s, 3)};
    }
    ledger_release(L, s);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n = k;
    return ADT_OK;
}

int adt_ledger_dead_letters(adt_ledger *L, adt_ledger_dead **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    int rc = read_begin(L);
    if (rc) return rc;
    return read_end(L, dead_read(L, out, n));
}

/* ---- sample ids --------------------------------------------------------------------------- */

const int64_t *ledger_perm(adt_ledger *L, int64_t epoch) {
    if (L->perm_epoch == epoch) return L->perm;
    /* 8 bytes per sample: a job too large for this machine gets an error, not an abort */
    if (!L->perm && !(L->perm = malloc((size_t)L->job.samples * sizeof *L->perm))) {
        adt_error(ADT_ERR_NOMEM, "ledger %s: no memory for the order of %lld samples (%lld MiB)", L->path,
                  (long long)L->job.samples, (long long)(L->job.samples >> 17));
        return NULL;
    }
    if (L->job.shuffle) adt_sample_permutation(L->perm, L->job.samples, L->job.seed, epoch);
    else
        for (int64_t i = 0; i < L->job.samples; i++) L->perm[i] = i;
    L->perm_epoch = epoch;
    return L->perm;
}

int adt_ledger_sample_ids(adt_ledger *L, int64_t epoch, int64_t a, int64_t b, int64_t *ids) {
    if (epoch < 0 || epoch >= L->job.epochs)
        return adt_error(ADT_ERR_ARG, "sample ids: epoch %lld out of range 0..%lld", (long long)epoch,
                         (long long)L->job.epochs - 1);
    if (a < 0 || a > b || b > L->positions)
        return adt_error(ADT_ERR_ARG, "sample ids: positions [%lld, %lld) outside the epoch's [0, %lld)", (long long)a,
                         (long long)b, (long long)L->positions);
    pthread_mutex_lock(&L->mu);
    const int64_t *perm = ledger_perm(L, epoch);
    if (perm) memcpy(ids, perm + a, (size_t)(b - a) * sizeof *ids);
    pthread_mutex_unlock(&L->mu);
    return perm ? ADT_OK : ADT_ERR_NOMEM;
}

/* ---- events ------------------------------------------------------------------------------- */

static int events_write(adt_ledger *L, FILE *f, int64_t after, int64_t max, int64_t *last) {
    static const char *const cols[] = {"generation", "replica", "lease", "step", "epoch", "shard", "a", "b"};
    sqlite3_stmt *s = ledger_prepare(L, "SELECT seq, t, kind, generation, replica, lease, step, epoch, shard, a, b, detail"
                                        " FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, after);
    sqlite3_bind_int64(s, 2, max > 0 ? max : -1);
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        int kind = sqlite3_column_int(s, 2);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seq", (double)sqlite3_column_int64(s, 0));
        cJSON_AddNumberToObject(o, "t", sqlite3_column_double(s, 1));
        cJSON_AddStringToObject(o, "kind", kind >= 0 && kind < EV_COUNT ? ledger_event_names[kind] : "unknown");
        for (int i = 0; i < 8; i++)
            if (sqlite3_column_type(s, 3 + i) != SQLITE_NULL)
                cJSON_AddNumberToObject(o, cols[i], (double)sqlite3_column_int64(s, 3 + i));
        if (sqlite3_column_type(s, 11) != SQLITE_NULL)
            cJSON_AddStringToObject(o, "detail", (const char *)sqlite3_column_text(s, 11));
        char *line = cJSON_PrintUnformatted(o);
        int bad = !line || fprintf(f, "%s\n", line) < 0;
        free(line);
        cJSON_Delete(o);
        if (bad) {
            rc = adt_error(ADT_ERR_IO, "ledger %s: writing the events failed", L->path);
            break;
        }
        *last = sqlite3_column_int64(s, 0);
    }
    ledger_release(L, s);
    return rc < 0 ? rc : ADT_OK;
}

int adt_ledger_events_export(adt_ledger *L, FILE *f, int64_t after_seq, int64_t max_events, int64_t *last_seq) {
    int64_t last = after_seq;
    int rc = read_begin(L);
    if (!rc) rc = read_end(L, events_write(L, f, after_seq, max_events, &last));
    if (last_seq) *last_seq = last;
    return rc;
}
