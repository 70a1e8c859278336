/*
 * ledger_db.c - the ledger's SQLite file: schema, creating and opening it (with the writer's
 * lock), transactions with their durability level, prepared statements, events.
 *
 * Durability (the classes are listed in include/adtrain/ledger.h): WAL journal; a report commits
 * with synchronous=NORMAL, commits and rewinds with FULL (the WAL is fsynced at COMMIT), leases
 * and revocations with NORMAL under the boot guard below. The WAL is checkpointed by a thread
 * after each FULL commit (see "the checkpointer"), so no report ever waits for a checkpoint.
 * "NORMAL + an explicit checkpoint at commits" would also make a commit durable (a checkpoint
 * fsyncs the WAL first), but it writes every page twice and fsyncs twice before the call can
 * return; FULL at the commit fsyncs once, and the copy happens off the caller's path.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "elastic/ledger_internal.h"

const char *const ledger_event_names[EV_COUNT] = {
    "open", "generation", "lease", "report", "commit", "rewind", "revoke", "dead_letter", "epoch",
};

static const char *const schema_sql =
    "CREATE TABLE job(id INTEGER PRIMARY KEY CHECK (id = 1), samples INTEGER NOT NULL,"
    " seed INTEGER NOT NULL, shuffle INTEGER NOT NULL, global_batch INTEGER NOT NULL,"
    " shard_size INTEGER NOT NULL, epochs INTEGER NOT NULL, max_failures INTEGER NOT NULL,"
    " max_leases INTEGER NOT NULL, lease_timeout REAL NOT NULL, initial_replicas INTEGER NOT NULL,"
    " generation INTEGER NOT NULL, replicas INTEGER NOT NULL, committed_steps INTEGER NOT NULL,"
    " checkpoint TEXT NOT NULL, epochs_opened INTEGER NOT NULL, created REAL NOT NULL, boot_id TEXT NOT NULL);"
    "CREATE TABLE pool(shard INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL,"
    " PRIMARY KEY (shard, start)) WITHOUT ROWID;"
    "CREATE TABLE dead(shard INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL,"
    " PRIMARY KEY (shard, start)) WITHOUT ROWID;"
    "CREATE TABLE shards(id INTEGER PRIMARY KEY, failures INTEGER NOT NULL, dead INTEGER NOT NULL);"
    "CREATE TABLE leases(id INTEGER PRIMARY KEY, generation INTEGER NOT NULL, replica INTEGER NOT NULL,"
    " state INTEGER NOT NULL, shard INTEGER NOT NULL, start INTEGER NOT NULL, end INTEGER NOT NULL,"
    " cursor INTEGER NOT NULL, committed INTEGER NOT NULL, last_step INTEGER NOT NULL,"
    " deadline REAL NOT NULL, granted REAL NOT NULL);"
    "CREATE INDEX leases_active ON leases(generation, replica) WHERE state = 0;"
    "CREATE INDEX leases_replica ON leases(generation, replica, last_step);"
    "CREATE INDEX leases_uncommitted ON leases(generation) WHERE committed < cursor;"
    "CREATE TABLE steps(step INTEGER PRIMARY KEY, total INTEGER NOT NULL);"
    "CREATE TABLE commits(id INTEGER PRIMARY KEY, steps INTEGER NOT NULL, generation INTEGER NOT NULL,"
    " t REAL NOT NULL, checkpoint TEXT NOT NULL, rolled_back INTEGER NOT NULL);"
    "CREATE INDEX commits_steps ON commits(steps);"
    "CREATE TABLE events(seq INTEGER PRIMARY KEY, t REAL NOT NULL, kind INTEGER NOT NULL,"
    " generation INTEGER, replica INTEGER, lease INTEGER, step INTEGER, epoch INTEGER, shard INTEGER,"
    " a INTEGER, b INTEGER, detail TEXT);"
    "CREATE INDEX events_report ON events(lease, step) WHERE kind = 3;";

static const char *const stmt_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_EVENT_ADD] = "INSERT INTO events(t, kind, generation, replica, lease, step, epoch, shard, a, b, detail)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    [ST_JOB_STATE] = "SELECT generation, replicas, committed_steps, epochs_opened FROM job WHERE id = 1",
    [ST_LEASE_GET] = "SELECT id, generation, replica, state, shard, start, end, cursor, committed, last_step,"
                     " deadline FROM leases WHERE id = ?1",
    [ST_LEASE_SET_PROGRESS] = "UPDATE leases SET cursor = ?2, last_step = ?3, deadline = ?4, state = ?5 WHERE id = ?1",
    [ST_REPLICA_LAST_STEP] = "SELECT MAX(last_step) FROM leases WHERE generation = ?1 AND replica = ?2",
    [ST_STEP_TOTAL] = "SELECT total FROM steps WHERE step = ?1",
    [ST_STEP_ADD] = "INSERT INTO steps(step, total) VALUES (?1, ?2)"
                    " ON CONFLICT(step) DO UPDATE SET total = total + excluded.total",
    [ST_REPORT_MAX_BEFORE] = "SELECT MAX(b), MAX(step) FROM events WHERE kind = 3 AND lease = ?1 AND step < ?2",
};

/* ---- helpers ------------------------------------------------------------------------------ */

int ledger_db_error(adt_ledger *L, const char *what) {
    int code = sqlite3_errcode(L->db);
    int rc = code == SQLITE_NOTADB || code == SQLITE_CORRUPT ? ADT_ERR_FORMAT : ADT_ERR_IO;
    return adt_error(rc, "ledger %s: %s: %s", L->path, what, sqlite3_errmsg(L->db));
}

/* Statements are compiled once per handle and kept in a small open-addressing table keyed by
 * their text: compiling costs more than running most of them. PRAGMAs are not kept (SQLite
 * applies some of them when it compiles them). */
static uint32_t sql_hash(const char *sql) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)sql; *p; p++) h = (h ^ *p) * 16777619u;
    return h;
}

sqlite3_stmt *ledger_prepare(adt_ledger *L, const char *sql) {
    int cacheable = strncmp(sql, "PRAGMA", 6) != 0;
    uint32_t h = sql_hash(sql) % LEDGER_CACHE, k = h;
    if (cacheable) {
        for (; L->cache[k]; k = (k + 1) % LEDGER_CACHE) {
            if (!strcmp(sqlite3_sql(L->cache[k]), sql)) {
                sqlite3_reset(L->cache[k]);
                sqlite3_clear_bindings(L->cache[k]);
                return L->cache[k];
            }
            if ((k + 1) % LEDGER_CACHE == h) {
                cacheable = 0; /* full: compile it for this use only */
                break;
            }
        }
    }
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v3(L->db, sql, -1, cacheable ? SQLITE_PREPARE_PERSISTENT : 0, &s, NULL) != SQLITE_OK) {
        ledger_db_error(L, "preparing a statement");
        return NULL;
    }
    if (cacheable) L->cache[k] = s;
    return s;
}

void ledger_release(adt_ledger *L, sqlite3_stmt *s) {
    if (!s) return;
    uint32_t k = sql_hash(sqlite3_sql(s)) % LEDGER_CACHE;
    for (uint32_t n = 0; n < LEDGER_CACHE && L->cache[k]; n++, k = (k + 1) % LEDGER_CACHE)
        if (L->cache[k] == s) {
            sqlite3_reset(s);
            return;
        }
    sqlite3_finalize(s);
}

sqlite3_stmt *ledger_stmt_get(adt_ledger *L, ledger_stmt id) {
    sqlite3_stmt *s = L->st[id];
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return s;
}

void ledger_bind(sqlite3_stmt *s, int i, int64_t v) {
    if (v == LEDGER_NA) sqlite3_bind_null(s, i);
    else sqlite3_bind_int64(s, i, v);
}

int ledger_step(adt_ledger *L, sqlite3_stmt *s) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) return 1;
    if (rc == SQLITE_DONE) return 0;
    return ledger_db_error(L, sqlite3_sql(s));
}

int ledger_exec_stmt(adt_ledger *L, sqlite3_stmt *s) {
    int rc;
    while ((rc = ledger_step(L, s)) == 1) {
    }
    sqlite3_reset(s);
    return rc;
}

int ledger_exec(adt_ledger *L, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(L->db, sql, NULL, NULL, &msg) == SQLITE_OK) return ADT_OK;
    int code = sqlite3_errcode(L->db);
    int rc = adt_error(code == SQLITE_NOTADB || code == SQLITE_CORRUPT ? ADT_ERR_FORMAT : ADT_ERR_IO,
                       "ledger %s: %s", L->path, msg ? msg : sqlite3_errmsg(L->db));
    sqlite3_free(msg);
    return rc;
}

int64_t ledger_col(sqlite3_stmt *s, int i) {
    return sqlite3_column_type(s, i) == SQLITE_NULL ? LEDGER_NA : sqlite3_column_int64(s, i);
}

/* `sql` compiled, with nbind int64 arguments from ap bound to ?1.. (NULL on failure). */
static sqlite3_stmt *prepare_bound(adt_ledger *L, const char *sql, int nbind, va_list ap) {
    sqlite3_stmt *s = ledger_prepare(L, sql);
    for (int i = 0; s && i < nbind; i++) ledger_bind(s, i + 1, va_arg(ap, int64_t));
    return s;
}

int ledger_query_i64(adt_ledger *L, const char *sql, int64_t *out, int64_t dflt, int nbind, ...) {
    va_list ap;
    va_start(ap, nbind);
    sqlite3_stmt *s = prepare_bound(L, sql, nbind, ap);
    va_end(ap);
    if (!s) return ADT_ERR_IO;
    int rc = ledger_step(L, s);
    *out = rc == 1 && sqlite3_column_type(s, 0) != SQLITE_NULL ? sqlite3_column_int64(s, 0) : dflt;
    ledger_release(L, s);
    return rc < 0 ? rc : ADT_OK;
}

int ledger_run(adt_ledger *L, const char *sql, int nbind, ...) {
    va_list ap;
    va_start(ap, nbind);
    sqlite3_stmt *s = prepare_bound(L, sql, nbind, ap);
    va_end(ap);
    if (!s) return ADT_ERR_IO;
    int rc = ledger_exec_stmt(L, s);
    ledger_release(L, s);
    return rc;
}

static double wall_clock(void *ctx) {
    (void)ctx;
    return adt_wall_s();
}

double ledger_now(adt_ledger *L) { return L->now(L->now_ctx); }

void adt_ledger_set_clock(adt_ledger *L, double (*now)(void *ctx), void *ctx) {
    pthread_mutex_lock(&L->mu);
    L->now = now ? now : wall_clock;
    L->now_ctx = now ? ctx : NULL;
    pthread_mutex_unlock(&L->mu);
}

int ledger_event(adt_ledger *L, ledger_event_kind kind, int64_t generation, int64_t replica, int64_t lease,
                 int64_t step, int64_t epoch, int64_t shard, int64_t a, int64_t b, const char *detail) {
    sqlite3_stmt *s = ledger_stmt_get(L, ST_EVENT_ADD);
    sqlite3_bind_double(s, 1, ledger_now(L));
    sqlite3_bind_int(s, 2, (int)kind);
    int64_t v[8] = {generation, replica, lease, step, epoch, shard, a, b};
    for (int i = 0; i < 8; i++) ledger_bind(s, 3 + i, v[i]);
    if (detail) sqlite3_bind_text(s, 11, detail, -1, SQLITE_TRANSIENT);
    return ledger_exec_stmt(L, s);
}

int ledger_load_state(adt_ledger *L) {
    sqlite3_stmt *s = ledger_stmt_get(L, ST_JOB_STATE);
    int rc = ledger_step(L, s);
    if (rc == 1) {
        L->generation = sqlite3_column_int64(s, 0);
        L->replicas = sqlite3_column_int(s, 1);
        L->committed_steps = sqlite3_column_int64(s, 2);
        L->epochs_opened = sqlite3_column_int64(s, 3);
    }
    sqlite3_reset(s);
    if (rc == 0) return adt_error(ADT_ERR_FORMAT, "ledger %s: the job table has no row", L->path);
    return rc < 0 ? rc : ADT_OK;
}

int ledger_tx_begin(adt_ledger *L, int cls) {
    int full = cls == TX_DURABLE || (cls == TX_STATE && !L->boot_ok);
    if (!(L->flags & ADT_LEDGER_NOSYNC) && L->sync_full != full) {
        /* Not a prepared statement: SQLite applies a PRAGMA when it compiles it. */
        int rc = ledger_exec(L, full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL");
        if (rc) return rc;
        L->sync_full = full;
    }
    L->tx_cls = cls;
    return ledger_exec_stmt(L, ledger_stmt_get(L, ST_BEGIN));
}

int ledger_tx_end(adt_ledger *L, int rc) {
    if (rc == ADT_OK) {
        rc = ledger_exec_stmt(L, ledger_stmt_get(L, ST_COMMIT));
        if (rc == ADT_OK) return ledger_load_state(L);
    }
    /* Keep the refusal's message: the rollback of a transaction that wrote nothing cannot fail,
     * and if it did, the refusal is still what the caller needs to see. */
    if (sqlite3_get_autocommit(L->db) == 0) {
        sqlite3_stmt *s = ledger_stmt_get(L, ST_ROLLBACK);
        sqlite3_step(s);
        sqlite3_reset(s);
    }
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", adt_error_message());
    if (ledger_load_state(L) == ADT_OK) adt_error(rc, "%s", keep);
    return rc;
}

/* ---- the job ------------------------------------------------------------------------------ */

int64_t adt_ledger_job_positions(const adt_ledger_job *job) {
    return job->global_batch > 0 ? job->samples / job->global_batch * job->global_batch : 0;
}

int64_t adt_ledger_job_shards(const adt_ledger_job *job) {
    int64_t p = adt_ledger_job_positions(job);
    return job->shard_size > 0 ? (p + job->shard_size - 1) / job->shard_size : 0;
}

int64_t adt_ledger_job_steps(const adt_ledger_job *job) {
    return job->global_batch > 0 ? job->epochs * (adt_ledger_job_positions(job) / job->global_batch) : 0;
}

/* Bounds keep every product below 2^62: positions * epochs, shard ids, sums of samples. */
#define LEDGER_MAX_SAMPLES (INT64_C(1) << 40)
#define LEDGER_MAX_EPOCHS (INT64_C(1) << 20)

int ledger_job_check(const adt_ledger_job *j, const char *where) {
    if (j->samples < 1 || j->samples > LEDGER_MAX_SAMPLES)
        return adt_error(ADT_ERR_ARG, "%s: samples %lld, expected 1..2^40", where, (long long)j->samples);
    if (j->global_batch < 1 || j->global_batch > j->samples)
        return adt_error(ADT_ERR_ARG, "%s: global_batch %lld, expected 1..samples (%lld)", where,
                         (long long)j->global_batch, (long long)j->samples);
    if (j->shard_size < 1 || j->shard_size > j->samples)
        return adt_error(ADT_ERR_ARG, "%s: shard_size %lld, expected 1..samples (%lld)", where,
                         (long long)j->shard_size, (long long)j->samples);
    if (j->epochs < 1 || j->epochs > LEDGER_MAX_EPOCHS)
        return adt_error(ADT_ERR_ARG, "%s: epochs %lld, expected 1..2^20", where, (long long)j->epochs);
    if (j->shuffle != 0 && j->shuffle != 1)
        return adt_error(ADT_ERR_ARG, "%s: shuffle %d, expected 0 or 1", where, j->shuffle);
    if (j->replicas < 1 || j->replicas > 1 << 20)
        return adt_error(ADT_ERR_ARG, "%s: replicas %d, expected 1..2^20", where, j->replicas);
    if (j->max_failures < 0 || j->max_failures > 1 << 20)
        return adt_error(ADT_ERR_ARG, "%s: max_failures %d, expected 0 (default 3) or 1..2^20", where,
                         j->max_failures);
    if (j->max_leases < 0 || j->max_leases > 1 << 10)
        return adt_error(ADT_ERR_ARG, "%s: max_leases %d, expected 0 (default 2) or 1..1024", where, j->max_leases);
    if (!(j->lease_timeout_s >= 0 && j->lease_timeout_s <= 1e7))
        return adt_error(ADT_ERR_ARG, "%s: lease_timeout_s %g, expected 0 (default 60) or up to 1e7 s", where,
                         j->lease_timeout_s);
    return ADT_OK;
}

static void job_defaults(adt_ledger_job *j) {
    if (j->max_failures == 0) j->max_failures = 3;
    if (j->max_leases == 0) j->max_leases = 2;
    if (j->lease_timeout_s == 0) j->lease_timeout_s = 60;
}

/* ---- opening and closing ------------------------------------------------------------------ */

static adt_ledger *handle_new(const char *path, unsigned flags) {
    adt_ledger *L = adt_calloc(1, sizeof *L);
    L->path = adt_strdup(path);
    L->lock_fd = -1;
    L->flags = flags;
    L->now = wall_clock;
    L->perm_epoch = -1;
    pthread_mutex_init(&L->mu, NULL);
    pthread_mutex_init(&L->ck_mu, NULL);
    pthread_cond_init(&L->ck_cv, NULL);
    return L;
}

/* ---- the checkpointer ---------------------------------------------------------------------
 * Copying the WAL back into the database file (a checkpoint: page writes and an fsync of the
 * database) takes milliseconds. SQLite's automatic checkpoint would do it inside whichever
 * transaction crosses its threshold - a report, which a replica waits for. Instead a thread
 * with its own connection checkpoints after every durable transaction (commits and rewinds, when
 * the trainer has just written a checkpoint anyway) and whenever the WAL passes 4096 frames,
 * while the handle goes on serving reports: SQLite lets one checkpointer run beside the writer.
 * PASSIVE: it never waits for readers; what it cannot copy now, the next run copies. */
#define LEDGER_WAL_FRAMES 4096

static void *checkpointer(void *arg) {
    adt_ledger *L = arg;
    pthread_mutex_lock(&L->ck_mu);
    for (;;) {
        while (!L->ck_want && !L->ck_stop) pthread_cond_wait(&L->ck_cv, &L->ck_mu);
        if (L->ck_stop) break;
        L->ck_want = 0;
        pthread_mutex_unlock(&L->ck_mu);
        sqlite3_wal_checkpoint_v2(L->ck_db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
        pthread_mutex_lock(&L->ck_mu);
    }
    pthread_mutex_unlock(&L->ck_mu);
    return NULL;
}

/* Called by SQLite after each commit of the handle's connection (inside the handle's mutex). */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames) {
    adt_ledger *L = arg;
    (void)db;
    (void)name;
    if (L->tx_cls == TX_DURABLE || frames >= LEDGER_WAL_FRAMES) {
        pthread_mutex_lock(&L->ck_mu);
        L->ck_want = 1;
        pthread_cond_signal(&L->ck_cv);
        pthread_mutex_unlock(&L->ck_mu);
    }
    return SQLITE_OK;
}

static int checkpointer_start(adt_ledger *L) {
    if (L->flags & ADT_LEDGER_READONLY) return ADT_OK;
    if (sqlite3_open_v2(L->path, &L->ck_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        int rc = adt_error(ADT_ERR_IO, "ledger %s: cannot open the checkpoint connection: %s", L->path,
                           L->ck_db ? sqlite3_errmsg(L->ck_db) : "out of memory");
        sqlite3_close(L->ck_db);
        L->ck_db = NULL;
        return rc;
    }
    char *msg = NULL;
    sqlite3_exec(L->ck_db, (L->flags & ADT_LEDGER_NOSYNC) ? "PRAGMA synchronous = OFF" : "PRAGMA synchronous = NORMAL",
                 NULL, NULL, &msg);
    sqlite3_free(msg);
    sqlite3_wal_autocheckpoint(L->ck_db, 0);
    if (pthread_create(&L->ck_thread, NULL, checkpointer, L)) {
        sqlite3_close(L->ck_db);
        L->ck_db = NULL;
        return adt_error(ADT_ERR_IO, "ledger %s: cannot start the checkpoint thread", L->path);
    }
    L->ck_running = 1;
    sqlite3_wal_hook(L->db, wal_hook, L); /* replaces SQLite's automatic checkpoint */
    return ADT_OK;
}

static void checkpointer_stop(adt_ledger *L) {
    if (L->ck_running) {
        pthread_mutex_lock(&L->ck_mu);
        L->ck_stop = 1;
        pthread_cond_signal(&L->ck_cv);
        pthread_mutex_unlock(&L->ck_mu);
        pthread_join(L->ck_thread, NULL);
        L->ck_running = 0;
    }
    if (L->ck_db) sqlite3_close(L->ck_db);
    L->ck_db = NULL;
}

void adt_ledger_close(adt_ledger *L) {
    if (!L) return;
    checkpointer_stop(L);
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(L->st[i]);
    for (int i = 0; i < LEDGER_CACHE; i++) sqlite3_finalize(L->cache[i]);
    if (L->db) sqlite3_close_v2(L->db);
    /* After SQLite let go of the file: closing another descriptor of it earlier would drop
     * SQLite's own POSIX locks (they belong to the process, not the descriptor). */
    if (L->lock_fd >= 0) close(L->lock_fd);
    pthread_mutex_destroy(&L->mu);
    pthread_mutex_destroy(&L->ck_mu);
    pthread_cond_destroy(&L->ck_cv);
    free(L->perm);
    free(L->path);
    free(L);
}

/* The writer's lock: flock on the database file, independent of SQLite's fcntl locks on Linux,
 * and dropped by the kernel when the process dies, so a restarted master can take it at once. */
static int take_lock(adt_ledger *L, int fd) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        L->lock_fd = fd;
        return ADT_OK;
    }
    int e = errno;
    close(fd);
    if (e == EWOULDBLOCK)
        return adt_error(ADT_ERR_STATE, "ledger %s: open for writing in another process (one master per job)",
                         L->path);
    return adt_error(ADT_ERR_IO, "ledger %s: cannot lock: %s", L->path, strerror(e));
}

static int connect(adt_ledger *L) {
    int oflags = (L->flags & ADT_LEDGER_READONLY) ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    oflags |= SQLITE_OPEN_NOMUTEX; /* the handle's own mutex serialises every call */
    if (sqlite3_open_v2(L->path, &L->db, oflags, NULL) != SQLITE_OK) {
        int rc = adt_error(ADT_ERR_IO, "ledger %s: cannot open: %s", L->path,
                           L->db ? sqlite3_errmsg(L->db) : "out of memory");
        return rc;
    }
    sqlite3_busy_timeout(L->db, 5000);
    sqlite3_extended_result_codes(L->db, 0);
    return ADT_OK;
}

/* WAL journal and the reports' synchronous level, for a writer. */
static int set_wal(adt_ledger *L) {
    if (L->flags & ADT_LEDGER_READONLY) return ADT_OK;
    /* journal_mode answers with the mode it ended up in: "memory" for an in-memory database. */
    sqlite3_stmt *s = ledger_prepare(L, "PRAGMA journal_mode = WAL");
    if (!s) return ADT_ERR_IO;
    int rc = ledger_step(L, s);
    const char *mode = rc == 1 ? (const char *)sqlite3_column_text(s, 0) : NULL;
    int wal = mode && (!strcmp(mode, "wal") || !strcmp(mode, "memory"));
    ledger_release(L, s);
    if (rc < 0) return rc;
    if (!wal) return adt_error(ADT_ERR_IO, "ledger %s: SQLite refused WAL mode", L->path);
    return ledger_exec(L, (L->flags & ADT_LEDGER_NOSYNC) ? "PRAGMA synchronous = OFF" : "PRAGMA synchronous = NORMAL");
}

/* The boot guard. TX_STATE transactions are not fsynced; a crash of the process loses none of
 * them, but a crash of the host (power, kernel) may lose the newest ones, and with them lease
 * grants whose holders live on elsewhere: their ids could be granted again. So the writer notes
 * the host's boot id in the job row, and an open that finds another one (the host rebooted, or
 * the file moved to another host) restarts the world from the commit in force - a new
 * generation fences whatever was lost. Without a boot id, TX_STATE is fsynced like TX_DURABLE. */
static int boot_id(char *out, size_t n) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    out[0] = 0;
    if (!f) return 0;
    if (!fgets(out, (int)n, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
    return out[0] != 0;
}

static int prepare_all(adt_ledger *L) {
    for (int i = 0; i < ST_COUNT; i++) {
        if (sqlite3_prepare_v3(L->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &L->st[i], NULL) != SQLITE_OK)
            return ledger_db_error(L, stmt_sql[i]);
    }
    return ADT_OK;
}

/* The file is an adtrain ledger of this schema version (before anything names its tables). */
static int check_ident(adt_ledger *L) {
    int64_t app = 0, ver = 0;
    int rc = ledger_query_i64(L, "PRAGMA application_id", &app, 0, 0);
    if (rc) return rc;
    if (app != LEDGER_APP_ID) return adt_error(ADT_ERR_FORMAT, "ledger %s: not an adtrain ledger (SQLite application_id %lld)",
                                               L->path, (long long)app);
    if ((rc = ledger_query_i64(L, "PRAGMA user_version", &ver, 0, 0))) return rc;
    if (ver != LEDGER_SCHEMA_VERSION)
        return adt_error(ADT_ERR_FORMAT, "ledger %s: schema version %lld, expected %d", L->path, (long long)ver,
                         LEDGER_SCHEMA_VERSION);
    return ADT_OK;
}

static int read_job(adt_ledger *L) {
    int rc;
    sqlite3_stmt *s = ledger_prepare(L, "SELECT samples, seed, shuffle, global_batch, shard_size, epochs, max_failures,"
                                        " max_leases, lease_timeout, initial_replicas FROM job WHERE id = 1");
    if (!s) return ADT_ERR_FORMAT;
    rc = ledger_step(L, s);
    if (rc == 1) {
        adt_ledger_job *j = &L->job;
        j->samples = sqlite3_column_int64(s, 0);
        j->seed = (uint64_t)sqlite3_column_int64(s, 1);
        j->shuffle = sqlite3_column_int(s, 2);
        j->global_batch = sqlite3_column_int64(s, 3);
        j->shard_size = sqlite3_column_int64(s, 4);
        j->epochs = sqlite3_column_int64(s, 5);
        j->max_failures = sqlite3_column_int(s, 6);
        j->max_leases = sqlite3_column_int(s, 7);
        j->lease_timeout_s = sqlite3_column_double(s, 8);
        j->replicas = sqlite3_column_int(s, 9);
    }
    ledger_release(L, s);
    if (rc < 0) return rc;
    if (rc == 0) return adt_error(ADT_ERR_FORMAT, "ledger %s: the job table has no row", L->path);
    char where[600];
    snprintf(where, sizeof where, "ledger %s: job", L->path);
    if (ledger_job_check(&L->job, where)) { /* a damaged file, not a bad argument */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", adt_error_message());
        return adt_error(ADT_ERR_FORMAT, "%s", msg);
    }
    L->positions = adt_ledger_job_positions(&L->job);
    L->shards_per_epoch = adt_ledger_job_shards(&L->job);
    return ledger_load_state(L);
}

int adt_ledger_create(adt_ledger **out, const char *path, const adt_ledger_job *job_in, unsigned flags) {
    *out = NULL;
    if (!path || !*path) return adt_error(ADT_ERR_ARG, "ledger: empty path");
    if (flags & ADT_LEDGER_READONLY) return adt_error(ADT_ERR_ARG, "ledger %s: cannot create read-only", path);
    adt_ledger_job job = *job_in;
    job_defaults(&job);
    int rc = ledger_job_check(&job, "ledger job");
    if (rc) return rc;
    adt_ledger *L = handle_new(path, flags);
    int in_memory = !strcmp(path, ":memory:");
    if (!in_memory) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) {
            rc = adt_error(errno == EEXIST ? ADT_ERR_STATE : ADT_ERR_IO, "ledger %s: cannot create: %s%s", path,
                           strerror(errno), errno == EEXIST ? " (open it instead, or remove it to start over)" : "");
            adt_ledger_close(L);
            return rc;
        }
        if ((rc = take_lock(L, fd))) {
            adt_ledger_close(L);
            return rc;
        }
    }
    char boot[64];
    L->boot_ok = boot_id(boot, sizeof boot);
    /* The schema is made under FULL sync, before the statements that name its tables exist. */
    /* Small pages (before WAL mode fixes the size): a report rewrites about eight pages (the
     * lease row, its indexes, the event and its index, the step's total), so the WAL writes and
     * checksums 8 KiB, not 32. */
    if ((rc = connect(L)) || (rc = ledger_exec(L, "PRAGMA page_size = 1024")) || (rc = set_wal(L))) goto fail;
    if (!(flags & ADT_LEDGER_NOSYNC) && (rc = ledger_exec(L, "PRAGMA synchronous = FULL"))) goto fail;
    L->sync_full = 1;
    char pragmas[128];
    snprintf(pragmas, sizeof pragmas, "PRAGMA application_id = %d; PRAGMA user_version = %d;", LEDGER_APP_ID,
             LEDGER_SCHEMA_VERSION);
    if ((rc = ledger_exec(L, "BEGIN IMMEDIATE"))) goto fail;
    rc = ledger_exec(L, schema_sql);
    if (!rc) rc = ledger_exec(L, pragmas);
    if (!rc) rc = prepare_all(L);
    if (!rc) {
        sqlite3_stmt *s = ledger_prepare(
            L, "INSERT INTO job VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?10, 0, '', 0, ?11, ?12)");
        if (!s) rc = ADT_ERR_IO;
        else {
            int64_t v[8] = {job.samples, (int64_t)job.seed, job.shuffle, job.global_batch, job.shard_size,
                            job.epochs, job.max_failures, job.max_leases};
            for (int i = 0; i < 8; i++) ledger_bind(s, i + 1, v[i]);
            sqlite3_bind_double(s, 9, job.lease_timeout_s);
            sqlite3_bind_int(s, 10, job.replicas);
            sqlite3_bind_double(s, 11, ledger_now(L));
            sqlite3_bind_text(s, 12, boot, -1, SQLITE_TRANSIENT);
            rc = ledger_exec_stmt(L, s);
            ledger_release(L, s);
        }
    }
    if (!rc) rc = ledger_event(L, EV_OPEN, 1, LEDGER_NA, LEDGER_NA, LEDGER_NA, LEDGER_NA, LEDGER_NA, LEDGER_NA,
                               LEDGER_NA, "created");
    if (!rc) rc = ledger_event(L, EV_GENERATION, 1, job.replicas, LEDGER_NA, 0, LEDGER_NA, LEDGER_NA, LEDGER_NA,
                               LEDGER_NA, "start");
    rc = rc ? rc : ledger_exec(L, "COMMIT");
    if (rc || (rc = read_job(L))) goto fail;
    if (!in_memory && (rc = checkpointer_start(L))) goto fail;
    *out = L;
    return ADT_OK;
fail:
    adt_ledger_close(L);
    if (!in_memory) unlink(path);
    return rc;
}

/* A writer opens: renews the active leases' deadlines (their holders could not report while
 * the master was down), applies the boot guard, notes the open in the events. */
static int reopen_tx(adt_ledger *L) {
    char boot[64], was[64] = "";
    L->boot_ok = boot_id(boot, sizeof boot);
    int rc = ledger_tx_begin(L, TX_DURABLE);
    if (rc) return rc;
    sqlite3_stmt *s = ledger_prepare(L, "SELECT boot_id FROM job WHERE id = 1");
    if (!s) rc = ADT_ERR_IO;
    else {
        if ((rc = ledger_step(L, s)) == 1) snprintf(was, sizeof was, "%s", (const char *)sqlite3_column_text(s, 0));
        ledger_release(L, s);
        rc = rc < 0 ? rc : ADT_OK;
    }
    const char *what = "reopened";
    if (!rc && (!L->boot_ok || strcmp(boot, was))) {
        what = "reopened on another boot of the host: the world restarts from the commit in force";
        int64_t gen;
        rc = ledger_rewind_tx(L, L->generation, L->committed_steps, L->replicas, what, &gen);
    }
    if (!rc && (s = ledger_prepare(L, "UPDATE leases SET deadline = ?1 WHERE state = 0"))) {
        sqlite3_bind_double(s, 1, ledger_now(L) + L->job.lease_timeout_s);
        rc = ledger_exec_stmt(L, s);
        ledger_release(L, s);
    }
    if (!rc && (s = ledger_prepare(L, "UPDATE job SET boot_id = ?1"))) {
        sqlite3_bind_text(s, 1, boot, -1, SQLITE_TRANSIENT);
        rc = ledger_exec_stmt(L, s);
        ledger_release(L, s);
    }
    if (!rc) rc = ledger_load_state(L);
    if (!rc) rc = ledger_event(L, EV_OPEN, L->generation, LEDGER_NA, LEDGER_NA, L->committed_steps, LEDGER_NA,
                               LEDGER_NA, LEDGER_NA, LEDGER_NA, what);
    return ledger_tx_end(L, rc);
}

int adt_ledger_open(adt_ledger **out, const char *path, unsigned flags) {
    *out = NULL;
    if (!path || !*path) return adt_error(ADT_ERR_ARG, "ledger: empty path");
    adt_ledger *L = handle_new(path, flags);
    int rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = adt_error(ADT_ERR_IO, "ledger %s: cannot open: %s", path, strerror(errno));
        adt_ledger_close(L);
        return rc;
    }
    if (flags & ADT_LEDGER_READONLY) close(fd);
    else if ((rc = take_lock(L, fd))) {
        adt_ledger_close(L);
        return rc;
    }
    if ((rc = connect(L)) || (rc = check_ident(L)) || (rc = set_wal(L)) || (rc = prepare_all(L)) || (rc = read_job(L))) goto fail;
    if (!(flags & ADT_LEDGER_READONLY) && ((rc = checkpointer_start(L)) || (rc = reopen_tx(L)))) goto fail;
    *out = L;
    return ADT_OK;
fail:
    adt_ledger_close(L);
    return rc;
}

void adt_ledger_get_job(const adt_ledger *L, adt_ledger_job *job) { *job = L->job; }
