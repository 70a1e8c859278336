/*
 * ledger.c - the sharding service's operations: leasing, progress reports, commits, rewinds,
 * revocations and dead letters. Each public call is one transaction under the handle's mutex;
 * every check is made inside the transaction before anything is written, and a refusal rolls
 * back, so a refused call changes nothing.
 *
 * The invariant that makes exactly-once work: a lease is consumed from its start upwards by one
 * replica whose steps never decrease, so the part consumed before any step S is a prefix of the
 * lease, [start, max b over its reports at steps < S). Commits and rewinds only move those
 * prefix ends (the lease's committed and cursor columns); whatever a rewind cuts off goes back
 * to the pool, from which it is leased again.
 */
#include <stdlib.h>
#include <string.h>

#include "elastic/ledger_internal.h"

#define NA LEDGER_NA

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The generation check every replica request starts with: an ended generation is a zombie. */
static int check_generation(adt_ledger *L, int64_t generation, const char *what) {
    if (generation == L->generation) return ADT_OK;
    if (generation >= 1 && generation < L->generation)
        return adt_error(ADT_ERR_STALE, "%s: generation %lld has ended (current %lld); refused", what,
                         (long long)generation, (long long)L->generation);
    return adt_error(ADT_ERR_ARG, "%s: generation %lld is unknown (current %lld)", what, (long long)generation,
                     (long long)L->generation);
}

static int check_replica(adt_ledger *L, int replica, const char *what) {
    if (replica >= 0 && replica < L->replicas) return ADT_OK;
    return adt_error(ADT_ERR_ARG, "%s: replica %d out of range: generation %lld has %d replicas", what, replica,
                     (long long)L->generation, L->replicas);
}

int ledger_lease_read(adt_ledger *L, int64_t id, adt_ledger_lease *o) {
    sqlite3_stmt *s = ledger_stmt_get(L, ST_LEASE_GET);
    sqlite3_bind_int64(s, 1, id);
    int rc = ledger_step(L, s);
    if (rc == 1) {
        o->id = sqlite3_column_int64(s, 0);
        o->generation = sqlite3_column_int64(s, 1);
        o->replica = sqlite3_column_int(s, 2);
        o->state = sqlite3_column_int(s, 3);
        int64_t shard = sqlite3_column_int64(s, 4);
        o->epoch = ledger_shard_epoch(L, shard);
        o->shard = ledger_shard_index(L, shard);
        o->start = sqlite3_column_int64(s, 5);
        o->end = sqlite3_column_int64(s, 6);
        o->cursor = sqlite3_column_int64(s, 7);
        o->committed = sqlite3_column_int64(s, 8);
        o->last_step = sqlite3_column_int64(s, 9);
        o->deadline = sqlite3_column_double(s, 10);
    }
    sqlite3_reset(s);
    if (rc == 0) return adt_error(ADT_ERR_ARG, "lease %lld does not exist", (long long)id);
    return rc < 0 ? rc : ADT_OK;
}

/* ---- the pool and the dead letters -------------------------------------------------------- */

/* Adds [a, b) of `shard` to table `tab` (pool or dead), merged with the ranges it touches so a
 * shard handed back piece by piece is leased whole again. */
static int ranges_put(adt_ledger *L, const char *tab, int64_t shard, int64_t a, int64_t b) {
    char sql[160];
    int64_t lo = a, hi = b, prev_start = NA, next_end = NA;
    snprintf(sql, sizeof sql, "SELECT start FROM %s WHERE shard = ?1 AND end = ?2", tab);
    int rc = ledger_query_i64(L, sql, &prev_start, NA, 2, shard, a);
    if (!rc) {
        snprintf(sql, sizeof sql, "SELECT end FROM %s WHERE shard = ?1 AND start = ?2", tab);
        rc = ledger_query_i64(L, sql, &next_end, NA, 2, shard, b);
    }
    if (rc) return rc;
    snprintf(sql, sizeof sql, "DELETE FROM %s WHERE shard = ?1 AND start = ?2", tab);
    if (prev_start != NA) {
        lo = prev_start;
        if ((rc = ledger_run(L, sql, 2, shard, prev_start))) return rc;
    }
    if (next_end != NA) {
        hi = next_end;
        if ((rc = ledger_run(L, sql, 2, shard, b))) return rc;
    }
    snprintf(sql, sizeof sql, "INSERT INTO %s(shard, start, end) VALUES (?1, ?2, ?3)", tab);
    return ledger_run(L, sql, 3, shard, lo, hi);
}

static int shard_is_dead(adt_ledger *L, int64_t shard, int *dead) {
    int64_t d;
    int rc = ledger_query_i64(L, "SELECT dead FROM shards WHERE id = ?1", &d, 0, 1, shard);
    *dead = d != 0;
    return rc;
}

static int dead_put(adt_ledger *L, int64_t shard, int64_t a, int64_t b, const char *why) {
    int rc = ranges_put(L, "dead", shard, a, b);
    if (!rc)
        rc = ledger_event(L, EV_DEAD_LETTER, L->generation, NA, NA, NA, ledger_shard_epoch(L, shard),
                          ledger_shard_index(L, shard), a, b, why);
    return rc;
}

/* Positions [a, b) of `shard` are waiting again: to the pool, or to the dead letters if the shard
 * is dead. */
static int give_back(adt_ledger *L, int64_t shard, int64_t a, int64_t b) {
    if (a >= b) return ADT_OK;
    int dead;
    int rc = shard_is_dead(L, shard, &dead);
    if (rc) return rc;
    return dead ? dead_put(L, shard, a, b, "returned to a dead shard") : ranges_put(L, "pool", shard, a, b);
}

/* One more failure of `shard`; at max_failures, the shard dies and its waiting ranges move from
 * the pool to the dead letters. */
static int shard_fail(adt_ledger *L, int64_t shard) {
    int64_t fails;
    int rc = ledger_run(L, "INSERT INTO shards(id, failures, dead) VALUES (?1, 1, 0)"
                           " ON CONFLICT(id) DO UPDATE SET failures = failures + 1", 1, shard);
    if (!rc) rc = ledger_query_i64(L, "SELECT failures FROM shards WHERE id = ?1", &fails, 0, 1, shard);
    if (rc || fails < L->job.max_failures) return rc;
    int dead;
    if ((rc = shard_is_dead(L, shard, &dead)) || dead) return rc;
    if ((rc = ledger_run(L, "UPDATE shards SET dead = 1 WHERE id = ?1", 1, shard))) return rc;
    sqlite3_stmt *s = ledger_prepare(L, "SELECT start, end FROM pool WHERE shard = ?1 ORDER BY start");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, shard);
    int64_t (*r)[2] = NULL;
    size_t n = 0;
    while ((rc = ledger_step(L, s)) == 1) {
        r = adt_realloc(r, (n + 1) * sizeof *r);
        r[n][0] = sqlite3_column_int64(s, 0);
        r[n][1] = sqlite3_column_int64(s, 1);
        n++;
    }
    ledger_release(L, s);
    char why[64];
    snprintf(why, sizeof why, "shard failed %lld times", (long long)fails);
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = ledger_run(L, "DELETE FROM pool WHERE shard = ?1 AND start = ?2", 2, shard, r[i][0]);
        if (!rc) rc = dead_put(L, shard, r[i][0], r[i][1], why);
    }
    free(r);
    return rc;
}

/* ---- leasing ------------------------------------------------------------------------------ */

/* Cuts the next epoch into shards, all waiting in the pool. */
static int open_epoch(adt_ledger *L) {
    int64_t e = L->epochs_opened;
    sqlite3_stmt *s = ledger_prepare(L, "INSERT INTO pool(shard, start, end) VALUES (?1, ?2, ?3)");
    if (!s) return ADT_ERR_IO;
    int rc = ADT_OK;
    for (int64_t k = 0; k < L->shards_per_epoch && !rc; k++) {
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, ledger_shard_id(L, e, k));
        sqlite3_bind_int64(s, 2, k * L->job.shard_size);
        sqlite3_bind_int64(s, 3, min64((k + 1) * L->job.shard_size, L->positions));
        rc = ledger_exec_stmt(L, s);
    }
    ledger_release(L, s);
    if (!rc) rc = ledger_run(L, "UPDATE job SET epochs_opened = ?1", 1, e + 1);
    if (!rc) rc = ledger_event(L, EV_EPOCH, L->generation, NA, NA, NA, e, NA, 0, L->positions, NULL);
    if (!rc) L->epochs_opened = e + 1;
    return rc;
}

static int pool_first(adt_ledger *L, int64_t *shard, int64_t *a, int64_t *b) {
    sqlite3_stmt *s = ledger_prepare(L, "SELECT shard, start, end FROM pool ORDER BY shard, start LIMIT 1");
    if (!s) return ADT_ERR_IO;
    int rc = ledger_step(L, s);
    if (rc == 1) {
        *shard = sqlite3_column_int64(s, 0);
        *a = sqlite3_column_int64(s, 1);
        *b = sqlite3_column_int64(s, 2);
    }
    ledger_release(L, s);
    return rc;
}

static int lease_next_tx(adt_ledger *L, int64_t generation, int replica, int64_t max_samples, adt_ledger_lease *out,
                         int *grant) {
    int rc;
    if ((rc = check_generation(L, generation, "lease")) || (rc = check_replica(L, replica, "lease"))) return rc;
    if (max_samples < 0) return adt_error(ADT_ERR_ARG, "lease: max_samples %lld, expected >= 0", (long long)max_samples);
    int64_t held;
    if ((rc = ledger_query_i64(L, "SELECT COUNT(*) FROM leases WHERE state = 0 AND generation = ?1 AND replica = ?2",
                               &held, 0, 2, generation, (int64_t)replica)))
        return rc;
    if (held >= L->job.max_leases)
        return adt_error(ADT_ERR_STATE, "lease: replica %d of generation %lld already holds %lld active leases (max_leases %d)",
                         replica, (long long)generation, (long long)held, L->job.max_leases);
    int64_t shard = 0, a = 0, b = 0;
    while ((rc = pool_first(L, &shard, &a, &b)) == 0 && L->epochs_opened < L->job.epochs)
        if ((rc = open_epoch(L))) return rc;
    if (rc < 0) return rc;
    if (rc == 0) {
        int64_t active;
        if ((rc = ledger_query_i64(L, "SELECT COUNT(*) FROM leases WHERE state = 0", &active, 0, 0))) return rc;
        *grant = active ? ADT_LEDGER_WAIT : ADT_LEDGER_DONE;
        return ADT_OK;
    }
    int64_t e = max_samples > 0 ? min64(b, a + max_samples) : b;
    if ((rc = ledger_run(L, "DELETE FROM pool WHERE shard = ?1 AND start = ?2", 2, shard, a)))
        return rc;
    if (e < b &&
        (rc = ledger_run(L, "INSERT INTO pool(shard, start, end) VALUES (?1, ?2, ?3)", 3, shard, e, b)))
        return rc;
    double now = ledger_now(L), deadline = now + L->job.lease_timeout_s;
    sqlite3_stmt *s = ledger_prepare(L, "INSERT INTO leases(generation, replica, state, shard, start, end, cursor,"
                                        " committed, last_step, deadline, granted) VALUES (?1, ?2, 0, ?3, ?4, ?5, ?4, ?4, -1, ?6, ?7)");
    if (!s) return ADT_ERR_IO;
    int64_t v[5] = {generation, replica, shard, a, e};
    for (int i = 0; i < 5; i++) sqlite3_bind_int64(s, i + 1, v[i]);
    sqlite3_bind_double(s, 6, deadline);
    sqlite3_bind_double(s, 7, now);
    rc = ledger_exec_stmt(L, s);
    ledger_release(L, s);
    if (rc) return rc;
    int64_t id = sqlite3_last_insert_rowid(L->db);
    if ((rc = ledger_event(L, EV_LEASE, generation, replica, id, NA, ledger_shard_epoch(L, shard),
                           ledger_shard_index(L, shard), a, e, NULL)))
        return rc;
    if ((rc = ledger_lease_read(L, id, out))) return rc;
    *grant = ADT_LEDGER_GRANTED;
    return ADT_OK;
}

int adt_ledger_lease_next(adt_ledger *L, int64_t generation, int replica, int64_t max_samples, adt_ledger_lease *out,
                          int *grant) {
    memset(out, 0, sizeof *out);
    *grant = ADT_LEDGER_WAIT;
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_STATE);
    if (!rc) rc = ledger_tx_end(L, lease_next_tx(L, generation, replica, max_samples, out, grant));
    if (rc) {
        memset(out, 0, sizeof *out);
        *grant = ADT_LEDGER_WAIT;
    }
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* ---- reports ------------------------------------------------------------------------------ */

/* A lease as the report being checked leaves it (several ranges may name one lease). */
typedef struct touched {
    adt_ledger_lease l;
    int64_t shard_id;
} touched;

static int report_tx(adt_ledger *L, int64_t generation, int replica, int64_t step, const adt_ledger_range *r, int n) {
    int rc;
    if ((rc = check_generation(L, generation, "report")) || (rc = check_replica(L, replica, "report"))) return rc;
    if (n < 1 || n > 1024) return adt_error(ADT_ERR_ARG, "report: %d ranges, expected 1..1024", n);
    if (step < L->committed_steps)
        return adt_error(ADT_ERR_ARG, "report: step %lld is committed already (the commit in force is after step %lld)",
                         (long long)step, (long long)L->committed_steps);
    int64_t max_steps = adt_ledger_job_steps(&L->job);
    if (step >= max_steps)
        return adt_error(ADT_ERR_ARG, "report: step %lld is beyond the job's %lld steps", (long long)step,
                         (long long)max_steps);
    sqlite3_stmt *s = ledger_stmt_get(L, ST_REPLICA_LAST_STEP);
    sqlite3_bind_int64(s, 1, generation);
    sqlite3_bind_int(s, 2, replica);
    if ((rc = ledger_step(L, s)) < 0) return rc;
    int64_t last = rc == 1 ? ledger_col(s, 0) : NA;
    sqlite3_reset(s);
    if (last != NA && step < last)
        return adt_error(ADT_ERR_ARG, "report: step %lld out of order: replica %d already reported step %lld",
                         (long long)step, replica, (long long)last);

    touched t[16];
    int nt = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (k < nt && t[k].l.id != r[i].lease) k++;
        if (k == nt) {
            if (nt == 16) return adt_error(ADT_ERR_ARG, "report: more than 16 distinct leases in one report");
            if ((rc = ledger_lease_read(L, r[i].lease, &t[k].l))) return adt_error_prefix(rc, "report: ");
            t[k].shard_id = ledger_shard_id(L, t[k].l.epoch, t[k].l.shard);
            nt++;
        }
        adt_ledger_lease *l = &t[k].l;
        long long id = (long long)l->id, a = (long long)r[i].a, b = (long long)r[i].b;
        if (l->generation != generation)
            return adt_error(l->generation < generation ? ADT_ERR_STALE : ADT_ERR_ARG,
                             "report: lease %lld belongs to generation %lld, not %lld; refused", id,
                             (long long)l->generation, (long long)generation);
        if (l->replica != replica)
            return adt_error(ADT_ERR_ARG, "report: lease %lld belongs to replica %d, not %d", id, l->replica, replica);
        if (l->state == ADT_LEASE_REVOKED || l->state == ADT_LEASE_ENDED)
            return adt_error(ADT_ERR_STALE, "report: lease %lld was %s; refused", id,
                             l->state == ADT_LEASE_REVOKED ? "revoked" : "ended by a rewind");
        if (r[i].a >= r[i].b)
            return adt_error(ADT_ERR_ARG, "report: lease %lld: empty or reversed range [%lld, %lld)", id, a, b);
        if (r[i].a < l->start || r[i].b > l->end)
            return adt_error(ADT_ERR_ARG, "report: lease %lld: range [%lld, %lld) is outside the lease [%lld, %lld)", id,
                             a, b, (long long)l->start, (long long)l->end);
        if (r[i].a < l->cursor)
            return adt_error(ADT_ERR_ARG, "report: lease %lld: positions [%lld, %lld) reported already (consumed up to %lld)",
                             id, a, (long long)min64(r[i].b, l->cursor), (long long)l->cursor);
        if (r[i].a > l->cursor)
            return adt_error(ADT_ERR_ARG, "report: lease %lld: range [%lld, %lld) leaves a gap: consumed up to %lld", id,
                             a, b, (long long)l->cursor);
        if (l->last_step > step)
            return adt_error(ADT_ERR_ARG, "report: lease %lld: step %lld out of order: reported at step %lld before", id,
                             (long long)step, (long long)l->last_step);
        l->cursor = r[i].b;
        l->last_step = step;
        total += r[i].b - r[i].a;
    }
    s = ledger_stmt_get(L, ST_STEP_TOTAL);
    sqlite3_bind_int64(s, 1, step);
    if ((rc = ledger_step(L, s)) < 0) return rc;
    int64_t before = rc == 1 ? sqlite3_column_int64(s, 0) : 0;
    sqlite3_reset(s);
    if (before + total > L->job.global_batch)
        return adt_error(ADT_ERR_ARG, "report: step %lld would consume %lld samples, above the global batch %lld "
                         "(%lld reported before, %lld now)", (long long)step, (long long)(before + total),
                         (long long)L->job.global_batch, (long long)before, (long long)total);

    double deadline = ledger_now(L) + L->job.lease_timeout_s;
    for (int k = 0; k < nt; k++) {
        adt_ledger_lease *l = &t[k].l;
        s = ledger_stmt_get(L, ST_LEASE_SET_PROGRESS);
        sqlite3_bind_int64(s, 1, l->id);
        sqlite3_bind_int64(s, 2, l->cursor);
        sqlite3_bind_int64(s, 3, step);
        sqlite3_bind_double(s, 4, deadline);
        sqlite3_bind_int(s, 5, l->cursor == l->end ? ADT_LEASE_FINISHED : ADT_LEASE_ACTIVE);
        if ((rc = ledger_exec_stmt(L, s))) return rc;
    }
    for (int i = 0; i < n; i++) {
        int k = 0;
        while (t[k].l.id != r[i].lease) k++;
        if ((rc = ledger_event(L, EV_REPORT, generation, replica, r[i].lease, step, t[k].l.epoch, t[k].l.shard, r[i].a,
                               r[i].b, NULL)))
            return rc;
    }
    s = ledger_stmt_get(L, ST_STEP_ADD);
    sqlite3_bind_int64(s, 1, step);
    sqlite3_bind_int64(s, 2, total);
    return ledger_exec_stmt(L, s);
}

int adt_ledger_report(adt_ledger *L, int64_t generation, int replica, int64_t step, const adt_ledger_range *r, int n) {
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_FAST);
    if (!rc) rc = ledger_tx_end(L, report_tx(L, generation, replica, step, r, n));
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* ---- commits ------------------------------------------------------------------------------ */

/* Nothing is left to lease or to consume: every epoch is cut, the pool is empty, no lease is
 * active. Only then may the job's last step be short. */
static int exhausted(adt_ledger *L, int *yes) {
    int64_t pool, active;
    int rc = ledger_query_i64(L, "SELECT COUNT(*) FROM pool", &pool, 0, 0);
    if (!rc) rc = ledger_query_i64(L, "SELECT COUNT(*) FROM leases WHERE state = 0", &active, 0, 0);
    *yes = !rc && L->epochs_opened == L->job.epochs && pool == 0 && active == 0;
    return rc;
}

/* The end of the part of lease `id` consumed before step `steps`, and the last step of it (-1):
 * the prefix its reports at those steps cover. */
static int prefix_before(adt_ledger *L, int64_t id, int64_t start, int64_t steps, int64_t *end, int64_t *last) {
    sqlite3_stmt *s = ledger_stmt_get(L, ST_REPORT_MAX_BEFORE);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, steps);
    int rc = ledger_step(L, s);
    int64_t b = rc == 1 ? ledger_col(s, 0) : NA, st = rc == 1 ? ledger_col(s, 1) : NA;
    sqlite3_reset(s);
    *end = b == NA ? start : b;
    *last = st == NA ? -1 : st;
    return rc < 0 ? rc : ADT_OK;
}

static int check_steps_complete(adt_ledger *L, int64_t steps) {
    int64_t c = L->committed_steps, B = L->job.global_batch, max_step;
    int rc = ledger_query_i64(L, "SELECT MAX(step) FROM steps", &max_step, -1, 0);
    if (rc) return rc;
    sqlite3_stmt *s = ledger_prepare(L, "SELECT step, total FROM steps WHERE step >= ?1 AND step < ?2 ORDER BY step");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, c);
    sqlite3_bind_int64(s, 2, steps);
    int64_t expect = c;
    while ((rc = ledger_step(L, s)) == 1) {
        int64_t step = sqlite3_column_int64(s, 0), total = sqlite3_column_int64(s, 1);
        if (step != expect) break;
        if (total != B) {
            int last_ok = 0;
            if (step == steps - 1 && max_step == step && (rc = exhausted(L, &last_ok)) < 0) break;
            if (!last_ok) {
                rc = adt_error(ADT_ERR_ARG, "commit %lld: step %lld consumed %lld samples, expected the global batch %lld",
                               (long long)steps, (long long)step, (long long)total, (long long)B);
                break;
            }
        }
        expect++;
    }
    ledger_release(L, s);
    if (rc < 0) return rc;
    if (expect < steps)
        return adt_error(ADT_ERR_ARG, "commit %lld: step %lld has no report (steps %lld..%lld must all be consumed)",
                         (long long)steps, (long long)expect, (long long)c, (long long)steps - 1);
    return ADT_OK;
}

static int commit_tx(adt_ledger *L, int64_t generation, int64_t steps, const char *checkpoint) {
    int rc;
    if ((rc = check_generation(L, generation, "commit"))) return rc;
    if (checkpoint && strlen(checkpoint) >= sizeof(((adt_ledger_status *)0)->checkpoint))
        return adt_error(ADT_ERR_ARG, "commit %lld: checkpoint id longer than 255 bytes", (long long)steps);
    if (steps <= L->committed_steps)
        return adt_error(ADT_ERR_ARG, "commit %lld: not above the commit in force (after step %lld)", (long long)steps,
                         (long long)L->committed_steps);
    if ((rc = check_steps_complete(L, steps))) return rc;

    /* Move the committed prefix of every lease of this generation that has uncommitted parts. */
    sqlite3_stmt *s = ledger_prepare(L, "SELECT id, start, cursor, last_step FROM leases"
                                        " WHERE generation = ?1 AND committed < cursor");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, generation);
    int64_t (*v)[2] = NULL;
    size_t n = 0;
    while ((rc = ledger_step(L, s)) == 1) {
        int64_t id = sqlite3_column_int64(s, 0), start = sqlite3_column_int64(s, 1);
        int64_t cur = sqlite3_column_int64(s, 2), last = sqlite3_column_int64(s, 3), end = cur, ls;
        if (last >= steps && (rc = prefix_before(L, id, start, steps, &end, &ls))) break;
        v = adt_realloc(v, (n + 1) * sizeof *v);
        v[n][0] = id;
        v[n][1] = end;
        n++;
    }
    ledger_release(L, s);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = ledger_run(L, "UPDATE leases SET committed = ?2 WHERE id = ?1 AND committed < ?2", 2,
                              v[i][0], v[i][1]);
    free(v);
    if (rc) return rc;
    if ((rc = ledger_run(L, "DELETE FROM steps WHERE step < ?1", 1, steps))) return rc;
    s = ledger_prepare(L, "INSERT INTO commits(steps, generation, t, checkpoint, rolled_back) VALUES (?1, ?2, ?3, ?4, 0)");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, steps);
    sqlite3_bind_int64(s, 2, generation);
    sqlite3_bind_double(s, 3, ledger_now(L));
    sqlite3_bind_text(s, 4, checkpoint ? checkpoint : "", -1, SQLITE_TRANSIENT);
    rc = ledger_exec_stmt(L, s);
    ledger_release(L, s);
    if (rc) return rc;
    s = ledger_prepare(L, "UPDATE job SET committed_steps = ?1, checkpoint = ?2");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, steps);
    sqlite3_bind_text(s, 2, checkpoint ? checkpoint : "", -1, SQLITE_TRANSIENT);
    rc = ledger_exec_stmt(L, s);
    ledger_release(L, s);
    if (rc) return rc;
    return ledger_event(L, EV_COMMIT, generation, NA, NA, steps, NA, NA, NA, NA, checkpoint);
}

int adt_ledger_commit(adt_ledger *L, int64_t generation, int64_t steps, const char *checkpoint) {
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_DURABLE);
    if (!rc) rc = ledger_tx_end(L, commit_tx(L, generation, steps, checkpoint));
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* ---- rewinds ------------------------------------------------------------------------------ */

typedef struct cut {
    int64_t id, shard, start, end, cursor, last_step;
    int state;
} cut;

int ledger_rewind_tx(adt_ledger *L, int64_t from, int64_t steps, int replicas, const char *reason, int64_t *gen_out) {
    int rc;
    if ((rc = check_generation(L, from, "rewind"))) return rc;
    if (replicas < 1 || replicas > 1 << 20)
        return adt_error(ADT_ERR_ARG, "rewind: replicas %d, expected 1..2^20", replicas);
    if (steps < 0 || steps > L->committed_steps)
        return adt_error(ADT_ERR_ARG, "rewind to step %lld: not a commit in force (the newest is after step %lld)",
                         (long long)steps, (long long)L->committed_steps);
    int64_t in_force = 0;
    if (steps > 0 &&
        (rc = ledger_query_i64(L, "SELECT COUNT(*) FROM commits WHERE steps = ?1 AND rolled_back = 0", &in_force, 0, 1,
                               steps)))
        return rc;
    if (steps > 0 && !in_force)
        return adt_error(ADT_ERR_ARG, "rewind to step %lld: no commit in force at that step", (long long)steps);

    /* Every lease still held, and every lease with consumption at steps >= `steps`. */
    sqlite3_stmt *s = ledger_prepare(L, "SELECT id, shard, start, end, cursor, last_step, state FROM leases"
                                        " WHERE state = 0 OR last_step >= ?1");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, steps);
    cut *c = NULL;
    size_t n = 0;
    while ((rc = ledger_step(L, s)) == 1) {
        c = adt_realloc(c, (n + 1) * sizeof *c);
        c[n] = (cut){sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2),
                     sqlite3_column_int64(s, 3), sqlite3_column_int64(s, 4), sqlite3_column_int64(s, 5),
                     sqlite3_column_int(s, 6)};
        n++;
    }
    ledger_release(L, s);
    int64_t discarded = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t keep = c[i].cursor, last = c[i].last_step;
        if (last >= steps && (rc = prefix_before(L, c[i].id, c[i].start, steps, &keep, &last))) break;
        /* An active lease gives back everything after `keep`; any other only what it had
         * consumed, its rest having gone back when it was revoked, finished or ended. */
        int64_t back_end = c[i].state == ADT_LEASE_ACTIVE ? c[i].end : c[i].cursor;
        discarded += c[i].cursor - keep;
        int state = c[i].state;
        if (state == ADT_LEASE_ACTIVE || (state == ADT_LEASE_FINISHED && keep < c[i].end)) state = ADT_LEASE_ENDED;
        if ((rc = give_back(L, c[i].shard, keep, back_end))) break;
        rc = ledger_run(L, "UPDATE leases SET cursor = ?2, committed = ?2, last_step = ?3, state = ?4 WHERE id = ?1", 4,
                        c[i].id, keep, last, (int64_t)state);
    }
    free(c);
    if (rc) return rc;
    if ((rc = ledger_run(L, "UPDATE commits SET rolled_back = 1 WHERE steps > ?1 AND rolled_back = 0", 1, steps)) ||
        (rc = ledger_run(L, "DELETE FROM steps", 0)))
        return rc;
    int64_t gen = from + 1;
    s = ledger_prepare(L, "UPDATE job SET generation = ?1, replicas = ?2, committed_steps = ?3, checkpoint ="
                          " COALESCE((SELECT checkpoint FROM commits WHERE steps = ?3 AND rolled_back = 0"
                          " ORDER BY id DESC LIMIT 1), '')");
    if (!s) return ADT_ERR_IO;
    sqlite3_bind_int64(s, 1, gen);
    sqlite3_bind_int(s, 2, replicas);
    sqlite3_bind_int64(s, 3, steps);
    rc = ledger_exec_stmt(L, s);
    ledger_release(L, s);
    if (!rc) rc = ledger_event(L, EV_REWIND, gen, NA, NA, steps, NA, NA, 0, discarded, reason);
    if (!rc) rc = ledger_event(L, EV_GENERATION, gen, replicas, NA, steps, NA, NA, NA, NA, reason);
    if (!rc) *gen_out = gen;
    return rc;
}

int adt_ledger_rewind(adt_ledger *L, int64_t from_generation, int64_t steps, int replicas, const char *reason,
                      int64_t *generation) {
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int64_t gen = 0;
    int rc = ledger_tx_begin(L, TX_DURABLE);
    if (!rc) rc = ledger_tx_end(L, ledger_rewind_tx(L, from_generation, steps, replicas, reason, &gen));
    pthread_mutex_unlock(&L->mu);
    if (generation) *generation = rc ? 0 : gen;
    return rc;
}

/* ---- revocations -------------------------------------------------------------------------- */

static int revoke_one(adt_ledger *L, const adt_ledger_lease *l, const char *reason) {
    int64_t shard = ledger_shard_id(L, l->epoch, l->shard);
    int rc = ledger_run(L, "UPDATE leases SET state = 2 WHERE id = ?1", 1, l->id);
    if (!rc) rc = ledger_event(L, EV_REVOKE, l->generation, l->replica, l->id, NA, l->epoch, l->shard, l->cursor,
                               l->end, reason);
    if (!rc) rc = shard_fail(L, shard);
    if (!rc) rc = give_back(L, shard, l->cursor, l->end);
    return rc;
}

/* Revokes the active leases `where` selects: with bindings v[0..nv) (expired: the one binding
 * is the time `now` instead). */
static int revoke_where(adt_ledger *L, const char *where, const int64_t *v, int nv, int expired, const char *reason,
                        int64_t *count) {
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT id FROM leases WHERE state = 0 AND %s ORDER BY id", where);
    sqlite3_stmt *s = ledger_prepare(L, sql);
    if (!s) return ADT_ERR_IO;
    for (int i = 0; i < nv; i++) sqlite3_bind_int64(s, i + 1, v[i]);
    if (expired) sqlite3_bind_double(s, 1, ledger_now(L));
    int64_t *ids = NULL;
    size_t n = 0;
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
        ids = adt_realloc(ids, (n + 1) * sizeof *ids);
        ids[n++] = sqlite3_column_int64(s, 0);
    }
    ledger_release(L, s);
    for (size_t i = 0; i < n && rc == 0; i++) {
        adt_ledger_lease l;
        if (!(rc = ledger_lease_read(L, ids[i], &l))) rc = revoke_one(L, &l, reason);
    }
    free(ids);
    if (count) *count = rc ? 0 : (int64_t)n;
    return rc;
}

static int revoke_tx(adt_ledger *L, int64_t lease, const char *reason) {
    adt_ledger_lease l;
    int rc = ledger_lease_read(L, lease, &l);
    if (rc) return adt_error_prefix(rc, "revoke: ");
    if (l.state != ADT_LEASE_ACTIVE)
        return adt_error(ADT_ERR_ARG, "revoke: lease %lld is not active (it %s)", (long long)lease,
                         l.state == ADT_LEASE_FINISHED  ? "was reported to its end"
                         : l.state == ADT_LEASE_REVOKED ? "was revoked already"
                                                        : "was ended by a rewind");
    return revoke_one(L, &l, reason);
}

int adt_ledger_revoke(adt_ledger *L, int64_t lease, const char *reason) {
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_STATE);
    if (!rc) rc = ledger_tx_end(L, revoke_tx(L, lease, reason));
    pthread_mutex_unlock(&L->mu);
    return rc;
}

int adt_ledger_revoke_expired(adt_ledger *L, int64_t *n_revoked) {
    if (n_revoked) *n_revoked = 0;
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_STATE);
    if (!rc) rc = ledger_tx_end(L, revoke_where(L, "deadline < ?1", NULL, 0, 1, "deadline passed", n_revoked));
    pthread_mutex_unlock(&L->mu);
    return rc;
}

int adt_ledger_revoke_replica(adt_ledger *L, int64_t generation, int replica, const char *reason, int64_t *n_revoked) {
    if (n_revoked) *n_revoked = 0;
    if (L->flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_STATE, "ledger %s is open read-only", L->path);
    pthread_mutex_lock(&L->mu);
    int rc = ledger_tx_begin(L, TX_STATE);
    if (!rc) {
        int64_t v[2] = {generation, replica};
        int r = check_generation(L, generation, "revoke replica");
        if (!r) r = check_replica(L, replica, "revoke replica");
        if (!r) r = revoke_where(L, "generation = ?1 AND replica = ?2", v, 2, 0, reason ? reason : "replica failed", n_revoked);
        rc = ledger_tx_end(L, r);
    }
    pthread_mutex_unlock(&L->mu);
    return rc;
}
