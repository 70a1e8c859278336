/*
 * fuzz_ledger.c - libFuzzer target for the data-sharding ledger's request handling.
 *
 * The ledger's inputs are requests that the master forwards from workers: generation, replica,
 * lease, positions, steps - any of them stale, out of range or made up. The input bytes are read
 * as a job and a sequence of such requests (mostly plausible ones built from the ledger's own
 * state, some arbitrary), run against an in-memory ledger. Whatever the sequence, no request may
 * crash, and after each one:
 *   - every position of every opened epoch is in exactly one place: the pool, an active lease,
 *     consumed since the commit, committed, or the dead letters (the status adds up);
 *   - the audit finds nothing missing, duplicated or inconsistent, and every committed step
 *     holds the global batch (the last, short one excepted);
 *   - a refused request changed nothing (the event count is unchanged).
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/ledger.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"


static double fake_now;
static double fake_clock(void *ctx) {
    (void)ctx;
    return fake_now;
}

static void check_state(adt_ledger *L, const adt_ledger_job *job) {
    adt_ledger_status st;
    FUZZ_ASSERT(adt_ledger_get_status(L, &st) == ADT_OK);
    int64_t P = adt_ledger_job_positions(job);
    FUZZ_ASSERT(st.pool_samples + st.leased_samples + st.uncommitted + st.committed + st.dead_samples ==
                st.epochs_opened * P);
    adt_ledger_audit au;
    FUZZ_ASSERT(adt_ledger_audit_run(L, &au) == ADT_OK);
    if (!au.ok) adt_ledger_audit_print(stderr, &au);
    FUZZ_ASSERT(au.ok);
    adt_ledger_audit_free(&au);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_input in = {data, size};
    adt_ledger_job job = {.samples = 8 + fuzz_take(&in) % 64, .seed = fuzz_take(&in), .shuffle = fuzz_take(&in) & 1,
                          .global_batch = 1 + fuzz_take(&in) % 8, .shard_size = 1 + fuzz_take(&in) % 16,
                          .epochs = 1 + fuzz_take(&in) % 3, .replicas = 1 + fuzz_take(&in) % 4,
                          .max_failures = 1 + fuzz_take(&in) % 3, .max_leases = 1 + fuzz_take(&in) % 3, .lease_timeout_s = 10};
    if (job.global_batch > job.samples) job.global_batch = job.samples;
    if (job.shard_size > job.samples) job.shard_size = job.samples;
    adt_ledger *L = NULL;
    FUZZ_ASSERT(adt_ledger_create(&L, ":memory:", &job, ADT_LEDGER_NOSYNC) == ADT_OK);
    fake_now = 1000;
    adt_ledger_set_clock(L, fake_clock, NULL);
    int64_t commits[64] = {0};
    int n_commits = 1; /* 0: the start */
    for (int ops = 0; in.n > 0 && ops < 200; ops++) {
        adt_ledger_status st;
        FUZZ_ASSERT(adt_ledger_get_status(L, &st) == ADT_OK);
        unsigned op = fuzz_take(&in) % 8, b1 = fuzz_take(&in), b2 = fuzz_take(&in);
        /* mostly the current generation and a replica of it; now and then anything */
        int64_t gen = b1 < 224 ? st.generation : (int64_t)(b1 % 8) - 1;
        int replica = b2 < 224 ? (int)(b2 % (unsigned)st.replicas) : (int)(b2 % 8) - 1;
        int rc = ADT_OK;
        if (op == 0) {
            adt_ledger_lease l;
            int grant;
            rc = adt_ledger_lease_next(L, gen, replica, fuzz_take(&in) % 8, &l, &grant);
        } else if (op == 1) {
            /* a report on one of the active leases (or a made-up one) from its cursor */
            adt_ledger_lease *ls = NULL;
            int64_t nl = 0;
            FUZZ_ASSERT(adt_ledger_leases(L, fuzz_take(&in) & 1, &ls, &nl) == ADT_OK);
            adt_ledger_range r[3];
            int n = 1 + fuzz_take(&in) % 3;
            unsigned pick = fuzz_take(&in);
            for (int i = 0; i < n; i++) {
                if (nl && pick < 240) {
                    const adt_ledger_lease *l = &ls[(pick + (unsigned)i) % nl];
                    int64_t from = i && r[i - 1].lease == l->id ? r[i - 1].b : l->cursor;
                    int64_t a = from + (fuzz_take(&in) < 16), b = from + 1 + fuzz_take(&in) % 6;
                    r[i] = (adt_ledger_range){l->id, a, b};
                } else {
                    int64_t id = fuzz_take(&in) % 16, a = fuzz_take(&in) % 64, b = fuzz_take(&in) % 64;
                    r[i] = (adt_ledger_range){id, a, b};
                }
            }
            free(ls);
            unsigned s = fuzz_take(&in);
            int64_t step = s < 128 ? st.next_step : s < 224 ? st.next_step - 1 + s % 3 : (int64_t)(s % 16);
            rc = adt_ledger_report(L, gen, replica, step, r, n);
        } else if (op == 2) {
            unsigned s = fuzz_take(&in);
            int64_t steps = s < 200 ? st.next_step + (s % 2) : (int64_t)(s % 32);
            rc = adt_ledger_commit(L, gen, steps, NULL);
            if (rc == ADT_OK && n_commits < 64) commits[n_commits++] = steps;
        } else if (op == 3) {
            unsigned s = fuzz_take(&in);
            int64_t to = s < 200 ? commits[s % n_commits] : (int64_t)(s % 32);
            int64_t g;
            rc = adt_ledger_rewind(L, gen, to, 1 + fuzz_take(&in) % 4, "fuzz", &g);
            if (rc == ADT_OK)
                while (n_commits > 1 && commits[n_commits - 1] > to) n_commits--;
        } else if (op == 4) {
            rc = adt_ledger_revoke(L, fuzz_take(&in) % 16, "fuzz");
        } else if (op == 5) {
            fake_now += fuzz_take(&in) % 16;
            rc = adt_ledger_revoke_expired(L, NULL);
        } else if (op == 6) {
            rc = adt_ledger_revoke_replica(L, gen, replica, "fuzz", NULL);
        } else {
            int64_t ids[8];
            int64_t e = fuzz_take(&in) % 4, a = fuzz_take(&in) % 80, b = a + fuzz_take(&in) % 8;
            rc = adt_ledger_sample_ids(L, e, a, b, ids);
        }
        adt_ledger_status after;
        FUZZ_ASSERT(adt_ledger_get_status(L, &after) == ADT_OK);
        if (rc != ADT_OK) {
            FUZZ_ASSERT(rc == ADT_ERR_ARG || rc == ADT_ERR_STALE || rc == ADT_ERR_STATE);
            FUZZ_ASSERT(adt_error_message()[0] != 0);
            FUZZ_ASSERT(after.events == st.events);
        } else {
            check_state(L, &job); /* a refused request left the state that was checked last */
        }
    }
    adt_ledger_close(L);
    return 0;
}
