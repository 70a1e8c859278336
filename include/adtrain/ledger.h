/*
 * adtrain/ledger.h - the stateful dynamic data-sharding service and its exactly-once ledger.
 *
 * The job master hands training data to data-parallel replicas in leases and keeps, in one
 * SQLite file, a ledger of what every replica consumed at which training step, and of which of
 * those steps are in a durable checkpoint of the model. It guarantees that every sample is
 * trained exactly once per epoch relative to the committed model: after any failure the job
 * restores its newest committed checkpoint and the ledger discards exactly what was consumed
 * after it, so those samples are handed out again and nothing else is.
 *
 * Terms
 *   position   an epoch visits its samples in a seeded order, perm = adt_sample_permutation(seed,
 *              epoch) (the trainer's own order; the identity without shuffling). Position p of
 *              epoch e is sample id perm[p]. An epoch has P = (N / B) * B positions: like
 *              adt_sampler, the last N mod B samples of each epoch's order are left out.
 *   shard      positions [k*shard_size, min((k+1)*shard_size, P)) of one epoch.
 *   lease      a contiguous range [start, end) of one shard, granted to one replica of one world
 *              generation. The replica consumes it from start upwards and reports every step.
 *   step       a training step, numbered from 0 over the whole run. Every step consumes exactly
 *              B samples over all replicas (the global batch is fixed whatever the world size;
 *              the trainer chooses the split per replica), except the very last step of the job,
 *              which may be short when dead-lettered samples leave a remainder. Leases are
 *              handed out epoch after epoch, so near an epoch's end one step may take samples
 *              of two epochs; each sample still counts in its own epoch.
 *   commit S   a checkpoint of the model after S steps (steps 0..S-1) is durable. The
 *              consumption of those steps becomes committed, atomically with the call.
 *   generation the world's number. Every membership change (death, join, leave) and every
 *              restore starts a new one: adt_ledger_rewind. A request names the generation it
 *              belongs to; one from an ended generation is refused with ADT_ERR_STALE and
 *              changes nothing (fencing of zombies).
 *
 * Durability: SQLite in WAL mode; every call is one transaction. What a crash of the process
 * (kill -9) can do: nothing - a call that returned is in the file, one that did not is not, and
 * the next open finds the last state that completed. What a crash of the host (power, kernel)
 * can do depends on the call, and each class pays only for what it needs:
 *   commit, rewind, create, open    synchronous=FULL: the WAL is fsynced before the call
 *                                   returns (making everything before it durable too);
 *   report                          synchronous=NORMAL, no fsync: a lost report was not
 *                                   committed, and its loss shows - the replica's next report
 *                                   no longer continues its lease, a commit over its step finds
 *                                   the step short - so the job restarts from the commit in
 *                                   force, as after any failure;
 *   lease, revocation, dead letter  NORMAL as well, because the ledger notes the host's boot id:
 *                                   an open on another boot (or host) restarts the world from
 *                                   the commit in force, a new generation that fences whatever
 *                                   was lost (without a boot id these are fsynced instead).
 * Copying the WAL back into the database (a checkpoint) is done by a thread of the handle after
 * each commit, never inside a report. One process at a time may open a ledger for writing (an
 * exclusive lock on the file, released by the kernel if the process dies); readers (audits) may
 * open it alongside.
 *
 * Thread safety: a handle serialises its calls with a mutex, so a multi-threaded server may
 * share one. Every call returns ADT_OK or a negative adt_status with a message naming the lease,
 * step, range or field at fault (adt_error_message()); a refused call changes nothing.
 */
#ifndef ADTRAIN_LEDGER_H
#define ADTRAIN_LEDGER_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ledger's file name inside a job directory (`adtrain audit --job DIR` reads DIR/ledger.db). */
#define ADT_LEDGER_FILE "ledger.db"

/* ---- the job ------------------------------------------------------------------------------ */
typedef struct adt_ledger_job {
    int64_t samples;        /* N: sample ids 0..N-1                                          */
    uint64_t seed;          /* seed of every epoch's order                                   */
    int shuffle;            /* 1: perm = adt_sample_permutation(seed, epoch); 0: identity    */
    int64_t global_batch;   /* B: samples per step over all replicas, 1..N                   */
    int64_t shard_size;     /* positions per shard (e.g. a multiple of B), >= 1              */
    int64_t epochs;         /* E >= 1                                                        */
    int replicas;           /* data-parallel replicas of generation 1, >= 1                  */
    int max_failures;       /* K: a shard whose leases failed K times goes to the dead
                               letters (a failure is a revocation: deadline passed, holder
                               died, explicit revoke); 0 means the default, 3               */
    int max_leases;         /* active leases one replica may hold at once; 0: default 2      */
    double lease_timeout_s; /* a lease not reported for this long may be revoked; 0: 60 s    */
} adt_ledger_job;

/* Positions per epoch, P = (N / B) * B; shards per epoch, ceil(P / shard_size); steps of the
 * whole job when nothing is dead-lettered, E * P / B. */
int64_t adt_ledger_job_positions(const adt_ledger_job *job);
int64_t adt_ledger_job_shards(const adt_ledger_job *job);
int64_t adt_ledger_job_steps(const adt_ledger_job *job);

/* ---- opening ------------------------------------------------------------------------------ */
typedef struct adt_ledger adt_ledger;

enum {
    ADT_LEDGER_READONLY = 1, /* audits and listings only; takes no lock                          */
    ADT_LEDGER_NOSYNC = 2,   /* synchronous=OFF: still safe against a killed process, not against
                                a power loss (tests and benchmarks of everything else)          */
};

/* Creates a new ledger file at `path` (an error if it exists) for `job`, and starts generation 1
 * with job->replicas replicas at step 0. Checks every field of the job; the message names it. */
int adt_ledger_create(adt_ledger **out, const char *path, const adt_ledger_job *job, unsigned flags);
/* Opens an existing ledger, e.g. when the master restarts. The state is the last call that
 * completed; the generation is unchanged, so live replicas carry on with their leases, whose
 * deadlines are renewed (the master's downtime is not theirs) - unless the file was last written
 * on another boot of the host (or on another host): then un-fsynced changes may be lost, and the
 * open rewinds to the commit in force, starting a new generation (see Durability above). An
 * error if the file is not a ledger, or is open for writing in another process. */
int adt_ledger_open(adt_ledger **out, const char *path, unsigned flags);
void adt_ledger_close(adt_ledger *L);

/* The job as created. */
void adt_ledger_get_job(const adt_ledger *L, adt_ledger_job *job);
/* Wall-clock source for deadlines and event times: seconds since the epoch. NULL restores
 * adt_wall_s. Tests use it to expire leases without waiting. */
void adt_ledger_set_clock(adt_ledger *L, double (*now)(void *ctx), void *ctx);

/* ---- leases ------------------------------------------------------------------------------- */
typedef enum adt_ledger_lease_state {
    ADT_LEASE_ACTIVE = 0,   /* held; [cursor, end) still to consume                              */
    ADT_LEASE_FINISHED = 1, /* its holder reported every position                                */
    ADT_LEASE_REVOKED = 2,  /* taken back (deadline, failure): [cursor, end) went back to the pool */
    ADT_LEASE_ENDED = 3,    /* its generation ended (rewind): the uncommitted part went back       */
} adt_ledger_lease_state;

typedef struct adt_ledger_lease {
    int64_t id;         /* unique in the job, never reused, >= 1                            */
    int64_t generation; /* the generation it was granted in                                 */
    int replica;        /* its holder's rank among the generation's replicas                */
    int state;          /* adt_ledger_lease_state                                           */
    int64_t epoch;
    int64_t shard;      /* shard index within the epoch                                     */
    int64_t start, end; /* positions [start, end) of the epoch's order                      */
    int64_t cursor;     /* positions [start, cursor) are consumed                           */
    int64_t committed;  /* positions [start, committed) are in the committed model          */
    int64_t last_step;  /* the last step it was reported at, -1 if none                     */
    double deadline;    /* wall-clock seconds after which it may be revoked                 */
} adt_ledger_lease;

typedef enum adt_ledger_grant {
    ADT_LEDGER_GRANTED = 0, /* *out holds a new lease                                            */
    ADT_LEDGER_WAIT = 1,    /* nothing to lease now, but other active leases may yet come back   */
    ADT_LEDGER_DONE = 2,    /* every position of every epoch is consumed or dead-lettered        */
} adt_ledger_grant;

/* Replica `replica` of generation `generation` leases the next range: the lowest (epoch,
 * position) waiting in the pool - ranges handed back by revocations and rewinds first, then
 * fresh shards, epoch after epoch - at most max_samples positions of it (0: the whole range,
 * at most one shard). *grant says whether *out holds a lease (its id is 0 otherwise). Refused:
 * an ended generation (ADT_ERR_STALE), a replica out of range, a replica already holding
 * max_leases active leases. */
int adt_ledger_lease_next(adt_ledger *L, int64_t generation, int replica, int64_t max_samples,
                          adt_ledger_lease *out, int *grant);

/* ---- progress ----------------------------------------------------------------------------- */
/* Positions [a, b) of lease `lease`, consumed by one training step. */
typedef struct adt_ledger_range {
    int64_t lease;
    int64_t a, b;
} adt_ledger_range;

/* Replica `replica` of `generation` consumed ranges r[0..n) at step `step`: all of them or, if
 * any is refused, none. A range must continue its lease exactly (a == cursor, a < b <= end;
 * several ranges of one lease follow each other); the lease must be the replica's, active, and
 * of this generation; `step` must not be committed already, nor below a step this replica
 * reported before; the step's total over all replicas must stay <= B. A lease reported to its
 * end is finished. Every report renews the lease's deadline.
 * Zombies get ADT_ERR_STALE: a generation that ended, a lease that was revoked or ended. Other
 * refusals (bad ranges, double reports, steps out of order) are ADT_ERR_ARG. */
int adt_ledger_report(adt_ledger *L, int64_t generation, int replica, int64_t step,
                      const adt_ledger_range *r, int n);

/* A checkpoint of the model after `steps` steps is durable (identified by `checkpoint`, e.g. its
 * manifest path; may be NULL). Atomically: the consumption of steps < `steps` becomes committed,
 * and `steps` becomes the point a rewind returns to. Refused unless `generation` is current
 * (ADT_ERR_STALE otherwise: a checkpoint of an ended generation must not count), `steps` is above
 * the last commit, and every step from the last commit to steps-1 consumed exactly B samples
 * (the last step of the job may be short once nothing is left to lease or consume). */
int adt_ledger_commit(adt_ledger *L, int64_t generation, int64_t steps, const char *checkpoint);

/* The world restarts from the committed checkpoint after `steps` steps (the newest commit, or an
 * older one that is still in force; 0 = the start of the job): discards every consumption of
 * steps >= `steps` (those positions go back to the pool, to be trained again; commits above
 * `steps` are rolled back), ends every lease still active, and starts generation
 * `from_generation` + 1 with `replicas` replicas, returned in *generation. `from_generation`
 * must be the current generation (ADT_ERR_STALE otherwise), so two callers reacting to the same
 * failure start one generation, not two. A planned membership change commits a checkpoint at
 * a step boundary and rewinds to it, which discards nothing. `reason` goes into the events. */
int adt_ledger_rewind(adt_ledger *L, int64_t from_generation, int64_t steps, int replicas, const char *reason,
                      int64_t *generation);

/* ---- revocation and dead letters ---------------------------------------------------------- */
/* Takes active lease `lease` back: its unconsumed rest [cursor, end) returns to the pool (its
 * consumed part stays, to be committed or rewound like any other), and its shard counts one
 * failure. At max_failures failures the shard's every waiting position moves to the dead
 * letters, now and whenever a rewind returns more of it: never leased again, never dropped
 * silently. The holder's later reports are refused with ADT_ERR_STALE. */
int adt_ledger_revoke(adt_ledger *L, int64_t lease, const char *reason);
/* Revokes every active lease whose deadline has passed; *n_revoked (may be NULL) counts them. */
int adt_ledger_revoke_expired(adt_ledger *L, int64_t *n_revoked);
/* Revokes every active lease of replica `replica` of `generation` (it died or failed); the
 * master calls it before the rewind that follows, so that the shards it held are charged. */
int adt_ledger_revoke_replica(adt_ledger *L, int64_t generation, int replica, const char *reason,
                              int64_t *n_revoked);

/* A dead-lettered range: positions [start, end) of shard `shard` of `epoch`. */
typedef struct adt_ledger_dead {
    int64_t epoch, shard;
    int64_t start, end;
    int failures; /* of the shard */
} adt_ledger_dead;

/* Every dead-lettered range, by epoch and position; free *out with free(). */
int adt_ledger_dead_letters(adt_ledger *L, adt_ledger_dead **out, int64_t *n);

/* ---- state -------------------------------------------------------------------------------- */
typedef struct adt_ledger_status {
    int64_t generation;
    int replicas;
    int64_t committed_steps;  /* S of the commit in force (0: none)                            */
    char checkpoint[256];     /* its checkpoint id ("" if none)                                */
    int64_t epochs_opened;    /* epochs whose shards were cut so far                           */
    int64_t next_step;        /* above every step reported in this generation                  */
    int64_t pool_samples;     /* waiting to be leased, in opened epochs                        */
    int64_t leased_samples;   /* in active leases, not yet consumed                            */
    int64_t uncommitted;      /* consumed at steps >= committed_steps                          */
    int64_t committed;        /* in the committed model, all epochs                            */
    int64_t dead_samples;     /* dead-lettered                                                 */
    int64_t active_leases;
    int64_t events;           /* rows in the events table                                      */
    int done;                 /* nothing left to lease or to consume                           */
} adt_ledger_status;

int adt_ledger_get_status(adt_ledger *L, adt_ledger_status *st);
/* Leases of the job, by id: every lease, or only the active ones; free *out with free(). */
int adt_ledger_leases(adt_ledger *L, int active_only, adt_ledger_lease **out, int64_t *n);
/* One lease by id; ADT_ERR_ARG if there is none. */
int adt_ledger_lease_get(adt_ledger *L, int64_t id, adt_ledger_lease *out);
/* ids[k] = the sample id at position a+k of `epoch`'s order, for k < b-a (0 <= a <= b <= P). */
int adt_ledger_sample_ids(adt_ledger *L, int64_t epoch, int64_t a, int64_t b, int64_t *ids);

/* ---- events ------------------------------------------------------------------------------- */
/* Every change is an event row, appended in the same transaction: open (creation or restart of
 * the master), generation, lease, report, commit, rewind, revoke, dead_letter, epoch. Writes the
 * events with seq > after_seq (at most max_events of them; 0: all) to f as JSON lines, e.g.
 *   {"seq":12,"t":1763712000.25,"kind":"report","generation":1,"replica":0,"lease":3,"step":4,
 *    "epoch":0,"shard":1,"a":40,"b":48}
 * (fields that do not apply are left out; "detail" carries reasons and checkpoint ids);
 * *last_seq (may be NULL) receives the last seq written, or after_seq. */
int adt_ledger_events_export(adt_ledger *L, FILE *f, int64_t after_seq, int64_t max_events, int64_t *last_seq);

/* ---- audit -------------------------------------------------------------------------------- */
/* Per epoch, in sample ids (each id of the epoch's P positions counted once). */
typedef struct adt_ledger_epoch_audit {
    int64_t epoch;
    int opened;            /* its shards were cut (else every id is pending)                    */
    int64_t samples;       /* P                                                                 */
    int64_t trained;       /* ids in the committed model exactly once                           */
    int64_t duplicated;    /* ids in the committed model more than once                         */
    int64_t missing;       /* ids neither in the model, nor waiting, nor dead-lettered: lost    */
    int64_t pending;       /* ids still to train: in the pool, leased, or consumed after the
                              commit in force                                                   */
    int64_t dead_lettered; /* ids in the dead letters, not trained                              */
    int64_t inconsistent;  /* ids where the replayed events and the lease state disagree        */
    int64_t first_bad_id;  /* the first duplicated, missing or inconsistent id; -1 if none      */
} adt_ledger_epoch_audit;

typedef struct adt_ledger_audit {
    adt_ledger_job job;
    int64_t generation;
    int64_t committed_steps;   /* of the ledger's state                                         */
    int64_t replayed_steps;    /* the same, as the replay of the events finds it                */
    int64_t events, reports, commits, rewinds, revocations, dead_letter_ranges;
    int64_t retrained;         /* samples consumed, then discarded by a rewind: trained again   */
    int64_t uncommitted;       /* samples consumed after the commit in force                    */
    int64_t steps_bad;         /* committed steps whose total is not B (the job's short last
                                  step excepted)                                                */
    int64_t first_bad_step;    /* -1 if none                                                    */
    int64_t dropped_per_epoch; /* N - P ids each epoch's order leaves out (drop_last)           */
    int complete;              /* every epoch is trained or dead-lettered, and committed        */
    int ok;                    /* nothing missing, duplicated or inconsistent; no bad step      */
    int64_t n_epochs;
    adt_ledger_epoch_audit *epoch; /* [n_epochs]                                                */
} adt_ledger_audit;

/* Replays the events (reports, commits and rewinds, in order) to find what the committed model
 * was trained on, maps positions to sample ids through each epoch's order, and checks the result
 * against the lease, pool and dead-letter state. Free with adt_ledger_audit_free. It reads one
 * snapshot and holds the handle meanwhile (about 5 us per event), so a live master audits through
 * a second, read-only handle, which leaves the writer free. */
int adt_ledger_audit_run(adt_ledger *L, adt_ledger_audit *out);
void adt_ledger_audit_free(adt_ledger_audit *a);
/* A human-readable report: one line for the job, one per epoch, and a verdict line. */
void adt_ledger_audit_print(FILE *f, const adt_ledger_audit *a);

#ifdef __cplusplus
}
#endif
#endif
