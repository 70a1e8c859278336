/*
 * ledger_internal.h - what the ledger's files share: the handle, the schema's event kinds, the
 * prepared statements and the small SQLite helpers (ledger_db.c).
 *
 * Tables (schema in ledger_db.c):
 *   job      one row: the job, the current generation and replica count, the commit in force
 *   pool     ranges waiting to be leased, (shard, start) -> end; adjacent ranges are merged
 *   dead     dead-lettered ranges, same layout
 *   shards   failures and the dead flag of shards that failed at least once
 *   leases   every lease ever granted, with its cursor, committed cursor and last step
 *   steps    samples consumed per step, for steps not yet committed (the global-batch check)
 *   commits  every commit, with its checkpoint id and whether a rewind rolled it back
 *   events   the append-only log; its report rows are the consumption records the audit replays
 * A shard is named by one integer, epoch * shards_per_epoch + index, so its epoch and position
 * range follow from the job without a row of their own.
 */
#ifndef ADTRAIN_ELASTIC_LEDGER_INTERNAL_H
#define ADTRAIN_ELASTIC_LEDGER_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>

#include "adtrain/base.h"
#include "adtrain/ledger.h"

#define LEDGER_SCHEMA_VERSION 1
#define LEDGER_APP_ID 0x61647467 /* "adtg" in PRAGMA application_id */
#define LEDGER_NA INT64_MIN      /* an event column that does not apply: stored as NULL */
#define LEDGER_CACHE 128         /* compiled statements kept per handle */

typedef enum {
    EV_OPEN = 0,
    EV_GENERATION = 1,
    EV_LEASE = 2,
    EV_REPORT = 3,
    EV_COMMIT = 4,
    EV_REWIND = 5,
    EV_REVOKE = 6,
    EV_DEAD_LETTER = 7,
    EV_EPOCH = 8,
    EV_COUNT
} ledger_event_kind;

extern const char *const ledger_event_names[EV_COUNT];

/* Prepared statements, made once per handle (SQLITE_PREPARE_PERSISTENT). */
typedef enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_EVENT_ADD,
    ST_JOB_STATE,
    ST_LEASE_GET,
    ST_LEASE_SET_PROGRESS,
    ST_REPLICA_LAST_STEP,
    ST_STEP_TOTAL,
    ST_STEP_ADD,
    ST_REPORT_MAX_BEFORE,
    ST_COUNT
} ledger_stmt;

struct adt_ledger {
    sqlite3 *db;
    char *path;
    int lock_fd; /* flock(LOCK_EX) held for writing; -1 when read-only or in memory */
    unsigned flags;
    pthread_mutex_t mu;
    adt_ledger_job job;
    int64_t positions;      /* P per epoch                                             */
    int64_t shards_per_epoch;
    /* the job row's mutable part, reloaded after every write transaction */
    int64_t generation;
    int replicas;
    int64_t committed_steps;
    int64_t epochs_opened;
    double (*now)(void *ctx);
    void *now_ctx;
    int sync_full; /* the connection's synchronous setting is FULL */
    int tx_cls;    /* the class of the open transaction */
    int boot_ok;   /* this host's boot id is known: TX_STATE may skip the fsync */
    sqlite3_stmt *st[ST_COUNT];
    sqlite3_stmt *cache[LEDGER_CACHE]; /* ledger_prepare's compiled statements */
    /* the checkpointer thread and its own connection (ledger_db.c) */
    sqlite3 *ck_db;
    pthread_t ck_thread;
    pthread_mutex_t ck_mu;
    pthread_cond_t ck_cv;
    int ck_want, ck_stop, ck_running;
    int64_t *perm; /* one epoch's order, cached for adt_ledger_sample_ids and the audit */
    int64_t perm_epoch;
};

/* ---- SQLite helpers (ledger_db.c) --------------------------------------------------------- */
/* The statement reset and with its bindings cleared. */
sqlite3_stmt *ledger_stmt_get(adt_ledger *L, ledger_stmt id);
/* The compiled statement for `sql`, reset and with its bindings cleared; hand it back with
 * ledger_release. NULL (and the error set) on failure. Not reentrant for one text: finish with
 * a statement before asking for the same text again. */
sqlite3_stmt *ledger_prepare(adt_ledger *L, const char *sql);
void ledger_release(adt_ledger *L, sqlite3_stmt *s);
/* Binds LEDGER_NA as NULL. */
void ledger_bind(sqlite3_stmt *s, int i, int64_t v);
/* sqlite3_step: 1 for a row, 0 when done, an adt_status (error set) otherwise. */
int ledger_step(adt_ledger *L, sqlite3_stmt *s);
/* Runs a statement to completion: ADT_OK or an error. */
int ledger_exec_stmt(adt_ledger *L, sqlite3_stmt *s);
int ledger_exec(adt_ledger *L, const char *sql);
/* Column i as int64, LEDGER_NA if NULL. */
int64_t ledger_col(sqlite3_stmt *s, int i);
/* A single int64 from "SELECT x ..." with up to 4 int64 bindings (pass LEDGER_NA for unused
 * trailing ones); *out = dflt when there is no row or the value is NULL. */
int ledger_query_i64(adt_ledger *L, const char *sql, int64_t *out, int64_t dflt, int nbind, ...);
/* Runs a statement without results, with up to nbind int64 bindings. */
int ledger_run(adt_ledger *L, const char *sql, int nbind, ...);
/* Sets the error from the connection's message, naming the ledger file. */
int ledger_db_error(adt_ledger *L, const char *what);

/* Transaction classes, by what a power loss may take (see ledger_db.c):
 *   TX_FAST     reports: synchronous=NORMAL
 *   TX_STATE    leases, revocations, dead letters: NORMAL while the boot guard holds, else FULL
 *   TX_DURABLE  creation, commits, rewinds, opening: FULL, then a passive WAL checkpoint */
enum { TX_FAST, TX_STATE, TX_DURABLE };
/* BEGIN IMMEDIATE at the class's synchronous level. The end commits (rc == ADT_OK) or rolls back,
 * and reloads the cached job state in both cases. */
int ledger_tx_begin(adt_ledger *L, int cls);
int ledger_tx_end(adt_ledger *L, int rc);
/* The body of adt_ledger_rewind, inside the caller's transaction (ledger.c). */
int ledger_rewind_tx(adt_ledger *L, int64_t from, int64_t steps, int replicas, const char *reason, int64_t *gen_out);
int ledger_load_state(adt_ledger *L);

double ledger_now(adt_ledger *L);
/* Appends one event row (inside the caller's transaction). */
int ledger_event(adt_ledger *L, ledger_event_kind kind, int64_t generation, int64_t replica, int64_t lease,
                 int64_t step, int64_t epoch, int64_t shard, int64_t a, int64_t b, const char *detail);

/* Shard naming. */
static inline int64_t ledger_shard_id(const adt_ledger *L, int64_t epoch, int64_t idx) {
    return epoch * L->shards_per_epoch + idx;
}
static inline int64_t ledger_shard_epoch(const adt_ledger *L, int64_t id) { return id / L->shards_per_epoch; }
static inline int64_t ledger_shard_index(const adt_ledger *L, int64_t id) { return id % L->shards_per_epoch; }

/* A lease row (ledger.c). */
int ledger_lease_read(adt_ledger *L, int64_t id, adt_ledger_lease *out);
/* The cached order of `epoch` (ledger_query.c). */
const int64_t *ledger_perm(adt_ledger *L, int64_t epoch);

/* Validates a job; `where` prefixes the message (a file name or "ledger job"). */
int ledger_job_check(const adt_ledger_job *job, const char *where);

#endif
