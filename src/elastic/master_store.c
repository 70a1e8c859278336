/*
 * master_store.c - the master's own state in DIR/master.db (SQLite, WAL): the job's generation,
 * its world, the agents the job has known with their failures and cooldowns, the failure times
 * of the restart budget, and the event log. A killed master restarted on the same DIR resumes
 * from here (the data itself is in the ledger, which has its own file and guarantees).
 *
 * Every decision is saved whole in one transaction before it is announced (synchronous=NORMAL:
 * a killed process loses nothing that returned; a crash of the host may lose the newest
 * decisions, which the agents then see as a master that forgot them, and re-register).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic/master_internal.h"
#include "elastic/wire_internal.h"

#define MASTER_APP_ID 0x6164746d /* "adtm" */
#define MASTER_SCHEMA 1

static const char *k_schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value);"
    "CREATE TABLE IF NOT EXISTS agents(id INTEGER PRIMARY KEY, node TEXT NOT NULL, host TEXT NOT NULL,"
    " slots INTEGER NOT NULL, failures INTEGER NOT NULL, cooldown_until REAL NOT NULL, leaving INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS slots(agent INTEGER NOT NULL, group_rank INTEGER NOT NULL,"
    " rank_offset INTEGER NOT NULL, local_size INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS failures(t REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS events(seq INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, kind TEXT NOT NULL,"
    " generation INTEGER, agent INTEGER, rank INTEGER, detail TEXT);"
    "CREATE TABLE IF NOT EXISTS commit_split(steps INTEGER PRIMARY KEY, split TEXT NOT NULL);";

static int db_err(adt_master *m, const char *what) {
    return adt_error(ADT_ERR_IO, "master state %s/%s: %s: %s", m->in_memory ? "" : m->job_dir, ADT_MASTER_STATE_FILE,
                     what, sqlite3_errmsg(m->db));
}

static int exec_sql(adt_master *m, const char *sql) {
    char *msg = NULL;
    if (sqlite3_exec(m->db, sql, NULL, NULL, &msg) == SQLITE_OK) return ADT_OK;
    int rc = adt_error(ADT_ERR_IO, "master state: %s: %s", sql, msg ? msg : sqlite3_errmsg(m->db));
    sqlite3_free(msg);
    return rc;
}

/* ---- meta: one value per key --------------------------------------------------------------- */
/* Stores an integer (text NULL, is_real 0), a real (is_real 1) or a string. */
static int meta_put(adt_master *m, const char *key, int64_t i, double d, int is_real, const char *text) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db, "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)", -1, &s, NULL))
        return db_err(m, "prepare");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if (text)
        sqlite3_bind_text(s, 2, text, -1, SQLITE_TRANSIENT);
    else if (is_real)
        sqlite3_bind_double(s, 2, d);
    else
        sqlite3_bind_int64(s, 2, i);
    int rc = sqlite3_step(s) == SQLITE_DONE ? ADT_OK : db_err(m, key);
    sqlite3_finalize(s);
    return rc;
}

/* 1 and the value if the key exists, 0 if not, < 0 on error. `text` receives a copy for
 * strings (cap bytes). */
static int meta_get(adt_master *m, const char *key, int64_t *i, double *d, char *text, size_t cap) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db, "SELECT value FROM meta WHERE key = ?1", -1, &s, NULL)) return db_err(m, "prepare");
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        if (i) *i = sqlite3_column_int64(s, 0);
        if (d) *d = sqlite3_column_double(s, 0);
        if (text) {
            const unsigned char *t = sqlite3_column_text(s, 0);
            snprintf(text, cap, "%s", t ? (const char *)t : "");
        }
        rc = 1;
    } else {
        rc = rc == SQLITE_DONE ? 0 : db_err(m, key);
    }
    sqlite3_finalize(s);
    return rc;
}

/* ---- saving --------------------------------------------------------------------------------- */
static int save_tx(adt_master *m) {
    int rc = ADT_OK;
    const struct {
        const char *k;
        int64_t v;
    } ints[] = {{"schema", MASTER_SCHEMA},
                {"gen", m->gen},
                {"gstate", m->gstate},
                {"stop_at", m->stop_at},
                {"gen_first_step", m->gen_first_step},
                {"world_size", m->world_size},
                {"replicas", m->replicas},
                {"ledger_offset", m->ledger_offset},
                {"rpr", m->rpr},
                {"idle", m->idle},
                {"run_steps", m->run_steps},
                {"target_workers", m->target_workers},
                {"target_nodes", m->target_nodes},
                {"restarts", m->restarts},
                {"planned_changes", m->planned_changes},
                {"ever_planned", m->ever_planned}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !rc; i++)
        rc = meta_put(m, ints[i].k, ints[i].v, 0, 0, NULL);
    if (!rc) rc = meta_put(m, "run_id", 0, 0, 0, m->run_id);
    if (!rc) rc = meta_put(m, "greason", 0, 0, 0, m->greason);
    if (!rc) rc = meta_put(m, "fail_wall", 0, m->fail_wall, 1, NULL);
    if (!rc && m->have_job) {
        cJSON *j = wj_job_to_json(&m->job);
        char *txt = cJSON_PrintUnformatted(j);
        rc = meta_put(m, "job", 0, 0, 0, txt);
        free(txt);
        cJSON_Delete(j);
    }
    if (!rc) rc = exec_sql(m, "DELETE FROM agents; DELETE FROM slots; DELETE FROM failures;");
    sqlite3_stmt *s = NULL;
    if (!rc && sqlite3_prepare_v2(m->db,
                                  "INSERT INTO agents(id, node, host, slots, failures, cooldown_until, leaving)"
                                  " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                                  -1, &s, NULL))
        rc = db_err(m, "prepare");
    for (int i = 0; i < m->n_agents && !rc; i++) {
        const m_agent *a = &m->agents[i];
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, a->id);
        sqlite3_bind_text(s, 2, a->node, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, a->host, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 4, a->slots);
        sqlite3_bind_int(s, 5, a->failures);
        sqlite3_bind_double(s, 6, a->cooldown_until);
        sqlite3_bind_int(s, 7, a->leaving);
        if (sqlite3_step(s) != SQLITE_DONE) rc = db_err(m, "saving agents");
    }
    sqlite3_finalize(s);
    s = NULL;
    if (!rc && sqlite3_prepare_v2(
                   m->db, "INSERT INTO slots(agent, group_rank, rank_offset, local_size) VALUES (?1, ?2, ?3, ?4)", -1,
                   &s, NULL))
        rc = db_err(m, "prepare");
    for (int i = 0; i < m->n_slots && !rc; i++) {
        sqlite3_reset(s);
        sqlite3_bind_int64(s, 1, m->slots[i].agent);
        sqlite3_bind_int(s, 2, m->slots[i].group_rank);
        sqlite3_bind_int(s, 3, m->slots[i].rank_offset);
        sqlite3_bind_int(s, 4, m->slots[i].local_size);
        if (sqlite3_step(s) != SQLITE_DONE) rc = db_err(m, "saving the world");
    }
    sqlite3_finalize(s);
    s = NULL;
    if (!rc && sqlite3_prepare_v2(m->db, "INSERT INTO failures(t) VALUES (?1)", -1, &s, NULL))
        rc = db_err(m, "prepare");
    for (int i = 0; i < m->n_fail && !rc; i++) {
        sqlite3_reset(s);
        sqlite3_bind_double(s, 1, m->fail_t[i]);
        if (sqlite3_step(s) != SQLITE_DONE) rc = db_err(m, "saving failures");
    }
    sqlite3_finalize(s);
    return rc;
}

int ms_save(adt_master *m) {
    int rc = exec_sql(m, "BEGIN IMMEDIATE");
    if (rc) return rc;
    rc = save_tx(m);
    if (!rc)
        rc = exec_sql(m, "COMMIT");
    else
        exec_sql(m, "ROLLBACK");
    if (rc) adt_log(ADT_LOG_ERROR, "master: saving the state failed: %s", adt_error_message());
    return rc;
}

/* ---- the split stored with each commit ------------------------------------------------------ */
/* Written (durably: the ledger's commit that follows is fsync'd, and must never survive a power
 * loss that this row did not) before the ledger commits `steps`. A row is only ever read for
 * the ledger's commit in force, which was made after its row; a later attempt at the same step
 * count replaces the row only after a rewind rolled that commit back. */
int ms_split_save(adt_master *m, int64_t steps, const int64_t *split, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)split[i]));
    char *txt = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    sqlite3_stmt *s;
    int rc = exec_sql(m, "PRAGMA synchronous = FULL");
    if (!rc && sqlite3_prepare_v2(m->db, "INSERT OR REPLACE INTO commit_split(steps, split) VALUES (?1, ?2)", -1, &s,
                                  NULL) == SQLITE_OK) {
        sqlite3_bind_int64(s, 1, steps);
        sqlite3_bind_text(s, 2, txt, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(s) == SQLITE_DONE ? ADT_OK : db_err(m, "saving the split");
        sqlite3_finalize(s);
    } else if (!rc) {
        rc = db_err(m, "prepare");
    }
    exec_sql(m, "PRAGMA synchronous = NORMAL");
    free(txt);
    return rc;
}

int ms_split_load(adt_master *m, int64_t steps, int64_t *split, int max) {
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db, "SELECT split FROM commit_split WHERE steps = ?1", -1, &s, NULL)) return -1;
    sqlite3_bind_int64(s, 1, steps);
    int n = 0;
    if (sqlite3_step(s) == SQLITE_ROW) {
        cJSON *a = cJSON_Parse((const char *)sqlite3_column_text(s, 0));
        const cJSON *x;
        cJSON_ArrayForEach(x, a) {
            if (n == max || !cJSON_IsNumber(x)) {
                n = 0;
                break;
            }
            split[n++] = (int64_t)x->valuedouble;
        }
        cJSON_Delete(a);
    }
    sqlite3_finalize(s);
    return n;
}

/* The split of the running generation, so that a restarted master goes on serving the one its
 * workers follow (not the generation's first). */
int ms_split_state_save(adt_master *m, int64_t gen, const char *json) {
    return meta_put(m, "split_state", 0, 0, 0, json) ? ADT_ERR_IO : meta_put(m, "split_gen", gen, 0, 0, NULL);
}

char *ms_split_state_load(adt_master *m, int64_t gen) {
    int64_t g = 0;
    char buf[65536];
    if (meta_get(m, "split_gen", &g, NULL, NULL, 0) != 1 || g != gen) return NULL;
    if (meta_get(m, "split_state", NULL, NULL, buf, sizeof buf) != 1) return NULL;
    return adt_strdup(buf);
}

/* ---- loading -------------------------------------------------------------------------------- */
static int load(adt_master *m) {
    int64_t v;
    int rc = meta_get(m, "schema", &v, NULL, NULL, 0);
    if (rc <= 0) return rc; /* a new job */
    if (v != MASTER_SCHEMA)
        return adt_error(ADT_ERR_FORMAT, "master state %s/%s: schema %lld, expected %d", m->job_dir,
                         ADT_MASTER_STATE_FILE, (long long)v, MASTER_SCHEMA);
    struct {
        const char *k;
        int64_t *dst64;
        int *dst;
    } ints[] = {{"gen", &m->gen, NULL},
                {"stop_at", &m->stop_at, NULL},
                {"gen_first_step", &m->gen_first_step, NULL},
                {"ledger_offset", &m->ledger_offset, NULL},
                {"world_size", NULL, &m->world_size},
                {"replicas", NULL, &m->replicas},
                {"rpr", NULL, &m->rpr},
                {"idle", NULL, &m->idle},
                {"run_steps", &m->run_steps, NULL},
                {"target_workers", NULL, &m->target_workers},
                {"target_nodes", NULL, &m->target_nodes},
                {"restarts", NULL, &m->restarts},
                {"planned_changes", NULL, &m->planned_changes},
                {"ever_planned", NULL, &m->ever_planned}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if ((rc = meta_get(m, ints[i].k, &v, NULL, NULL, 0)) < 0) return rc;
        if (rc == 0) continue;
        if (ints[i].dst64)
            *ints[i].dst64 = v;
        else
            *ints[i].dst = (int)v;
    }
    if ((rc = meta_get(m, "gstate", &v, NULL, NULL, 0)) < 0) return rc;
    if (v < G_WAITING || v > G_FAILED)
        return adt_error(ADT_ERR_FORMAT, "master state %s/%s: generation state %lld unknown", m->job_dir,
                         ADT_MASTER_STATE_FILE, (long long)v);
    m->gstate = (m_gstate)v;
    if (!m->cfg.run_id && (rc = meta_get(m, "run_id", NULL, NULL, m->run_id, sizeof m->run_id)) < 0) return rc;
    if ((rc = meta_get(m, "greason", NULL, NULL, m->greason, sizeof m->greason)) < 0) return rc;
    if ((rc = meta_get(m, "fail_wall", NULL, &m->fail_wall, NULL, 0)) < 0) return rc;
    char job[1024];
    if ((rc = meta_get(m, "job", NULL, NULL, job, sizeof job)) < 0) return rc;
    if (rc == 1) {
        adt_ledger_job saved;
        cJSON *j = cJSON_Parse(job);
        rc = wj_job_from_json(j, &saved);
        cJSON_Delete(j);
        if (rc)
            return adt_error_prefix(ADT_ERR_FORMAT, "master state %s/%s: the data job: ", m->job_dir,
                                    ADT_MASTER_STATE_FILE);
        if (m->have_job && !wj_job_equal(&saved, &m->job))
            return adt_error(ADT_ERR_ARG,
                             "the data flags differ from the data job of %s (GET /v1/job shows it); "
                             "leave them out to resume",
                             m->job_dir);
        m->job = saved;
        m->have_job = 1;
    }

    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT id, node, host, slots, failures, cooldown_until, leaving FROM agents ORDER BY id",
                           -1, &s, NULL))
        return db_err(m, "prepare");
    double now = adt_now_s();
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        m->agents = adt_realloc(m->agents, (size_t)(m->n_agents + 1) * sizeof *m->agents);
        m_agent *a = &m->agents[m->n_agents++];
        memset(a, 0, sizeof *a);
        a->id = sqlite3_column_int64(s, 0);
        snprintf(a->node, sizeof a->node, "%s", (const char *)sqlite3_column_text(s, 1));
        snprintf(a->host, sizeof a->host, "%s", (const char *)sqlite3_column_text(s, 2));
        a->slots = sqlite3_column_int(s, 3);
        a->failures = sqlite3_column_int(s, 4);
        a->cooldown_until = sqlite3_column_double(s, 5);
        a->leaving = sqlite3_column_int(s, 6);
        /* Until it says otherwise, an agent is taken to be alive and still running the world
         * it was given: it gets a full heartbeat deadline to come back. */
        a->alive = 1;
        a->last_seen = now;
        a->world_gen = -1;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return db_err(m, "loading agents");
    if (sqlite3_prepare_v2(m->db, "SELECT agent, group_rank, rank_offset, local_size FROM slots ORDER BY group_rank",
                           -1, &s, NULL))
        return db_err(m, "prepare");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        m->slots = adt_realloc(m->slots, (size_t)(m->n_slots + 1) * sizeof *m->slots);
        m->slots[m->n_slots++] = (m_slot){sqlite3_column_int64(s, 0), sqlite3_column_int(s, 1),
                                          sqlite3_column_int(s, 2), sqlite3_column_int(s, 3)};
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return db_err(m, "loading the world");
    if (sqlite3_prepare_v2(m->db, "SELECT t FROM failures ORDER BY t", -1, &s, NULL)) return db_err(m, "prepare");
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        m->fail_t = adt_realloc(m->fail_t, (size_t)(m->n_fail + 1) * sizeof *m->fail_t);
        m->fail_t[m->n_fail++] = sqlite3_column_double(s, 0);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) return db_err(m, "loading failures");
    return 1;
}

/* One master per job directory: an exclusive flock on master.db (not SQLite's own locks), which
 * the kernel drops when the process dies. */
static int take_lock(adt_master *m, const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return adt_error(ADT_ERR_IO, "master state %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB)) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            return adt_error(ADT_ERR_STATE, "master state %s: another master serves this job directory", path);
        return adt_error(ADT_ERR_IO, "master state %s: cannot lock: %s", path, strerror(e));
    }
    m->lock_fd = fd;
    return ADT_OK;
}

int ms_open(adt_master *m) {
    char path[4096];
    if (m->in_memory) {
        snprintf(path, sizeof path, ":memory:");
    } else {
        if (mkdir(m->job_dir, 0755) && errno != EEXIST)
            return adt_error(ADT_ERR_IO, "--job %s: cannot create the directory: %s", m->job_dir, strerror(errno));
        snprintf(path, sizeof path, "%s/%s", m->job_dir, ADT_MASTER_STATE_FILE);
    }
    if (sqlite3_open_v2(path, &m->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL)) {
        int rc = adt_error(ADT_ERR_IO, "master state %s: cannot open: %s", path,
                           m->db ? sqlite3_errmsg(m->db) : "out of memory");
        return rc;
    }
    sqlite3_busy_timeout(m->db, 5000);
    int rc;
    if (!m->in_memory && (rc = take_lock(m, path))) return rc;
    int64_t app = 0;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db, "PRAGMA application_id", -1, &s, NULL) == SQLITE_OK) {
        if (sqlite3_step(s) == SQLITE_ROW) app = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    }
    int64_t tables = 0;
    if (sqlite3_prepare_v2(m->db, "SELECT COUNT(*) FROM sqlite_master", -1, &s, NULL) == SQLITE_OK) {
        if (sqlite3_step(s) == SQLITE_ROW) tables = sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
    } else {
        return adt_error(ADT_ERR_FORMAT, "master state %s: not an SQLite database: %s", path, sqlite3_errmsg(m->db));
    }
    if (tables && app != MASTER_APP_ID)
        return adt_error(ADT_ERR_FORMAT, "master state %s: not an adtrain master state (application_id %lld)", path,
                         (long long)app);
    char sql[160];
    snprintf(sql, sizeof sql, "PRAGMA application_id = %d", MASTER_APP_ID);
    if ((rc = exec_sql(m, "PRAGMA journal_mode = WAL")) || (rc = exec_sql(m, "PRAGMA synchronous = NORMAL")) ||
        (rc = exec_sql(m, sql)) || (rc = exec_sql(m, k_schema)))
        return rc;
    rc = load(m);
    return rc < 0 ? rc : ADT_OK;
}

void ms_close(adt_master *m) {
    if (m->db) sqlite3_close(m->db);
    m->db = NULL;
    if (m->lock_fd >= 0) close(m->lock_fd);
    m->lock_fd = -1;
}

/* ---- events --------------------------------------------------------------------------------- */
void ms_event(adt_master *m, const char *kind, int64_t generation, int64_t agent, int rank, const char *fmt, ...) {
    char detail[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    adt_log(ADT_LOG_INFO, "master: %s%s%s", kind, detail[0] ? ": " : "", detail);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(
            m->db, "INSERT INTO events(t, kind, generation, agent, rank, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)", -1,
            &s, NULL))
        return;
    sqlite3_bind_double(s, 1, adt_wall_s());
    sqlite3_bind_text(s, 2, kind, -1, SQLITE_STATIC);
    if (generation >= 0) sqlite3_bind_int64(s, 3, generation);
    if (agent >= 0) sqlite3_bind_int64(s, 4, agent);
    if (rank >= 0) sqlite3_bind_int(s, 5, rank);
    if (detail[0]) sqlite3_bind_text(s, 6, detail, -1, SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) adt_log(ADT_LOG_WARN, "master: event log: %s", sqlite3_errmsg(m->db));
    sqlite3_finalize(s);
}

cJSON *ms_events(adt_master *m, int64_t after, int64_t max, int64_t *last) {
    cJSON *arr = cJSON_CreateArray();
    *last = after;
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(m->db,
                           "SELECT seq, t, kind, generation, agent, rank, detail FROM events WHERE seq > ?1"
                           " ORDER BY seq LIMIT ?2",
                           -1, &s, NULL))
        return arr;
    sqlite3_bind_int64(s, 1, after);
    sqlite3_bind_int64(s, 2, max > 0 ? max : -1);
    static const char *const cols[] = {"generation", "agent", "rank"};
    while (sqlite3_step(s) == SQLITE_ROW) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seq", (double)sqlite3_column_int64(s, 0));
        cJSON_AddNumberToObject(o, "t", sqlite3_column_double(s, 1));
        cJSON_AddStringToObject(o, "kind", (const char *)sqlite3_column_text(s, 2));
        for (int i = 0; i < 3; i++)
            if (sqlite3_column_type(s, 3 + i) != SQLITE_NULL)
                cJSON_AddNumberToObject(o, cols[i], (double)sqlite3_column_int64(s, 3 + i));
        if (sqlite3_column_type(s, 6) != SQLITE_NULL)
            cJSON_AddStringToObject(o, "detail", (const char *)sqlite3_column_text(s, 6));
        cJSON_AddItemToArray(arr, o);
        *last = sqlite3_column_int64(s, 0);
    }
    sqlite3_finalize(s);
    return arr;
}
