/*
 * fuzz_pmi.c - libFuzzer target for the PMI-1 server core (request parser, replies, key-value
 * store, barriers, TCP identification, the multi-agent barrier hook).
 *
 * Input: one configuration byte (world size 1-4, fd or TCP connections, with or without a
 * barrier hook), then records [op][len][len bytes]: op & 3 picks one of four connections,
 * (op >> 2) & 3 says feed the bytes (0, 1), close and reopen the connection (2), or merge the
 * bytes as a remote key=value and release a held barrier (3).
 *
 * Whatever the bytes, the server must not crash, leak or grow without bound; a feed either
 * succeeds or fails with a message that names the connection; every reply is whole lines that
 * start with "cmd="; a failed connection stays failed until closed.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/agent.h"
#include "adtrain/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

static int g_held;
static void hook(void *ctx, int epoch, int first_new) {
    adt_pmi_server *s = *(adt_pmi_server **)ctx;
    FUZZ_ASSERT(epoch >= 0 && first_new >= 0 && first_new <= adt_pmi_kvs_count(s));
    g_held = 1;
}

static void on_event(void *ctx, const adt_pmi_event *ev) {
    adt_pmi_server *s = *(adt_pmi_server **)ctx;
    FUZZ_ASSERT(ev->kind >= ADT_PMI_EV_INIT && ev->kind <= ADT_PMI_EV_IDENTIFY);
    if (ev->kind != ADT_PMI_EV_BARRIER) FUZZ_ASSERT(adt_pmi_conn_rank(s, ev->conn) == ev->rank);
}

/* Every reply is a sequence of whole "cmd=..." lines. */
static void take_output(adt_pmi_server *s, int conn) {
    const char *p;
    size_t n = adt_pmi_conn_output(s, conn, &p);
    if (!n) return;
    FUZZ_ASSERT(p[n - 1] == '\n');
    for (size_t i = 0; i < n;) {
        FUZZ_ASSERT(n - i >= 5 && !memcmp(p + i, "cmd=", 4));
        const char *nl = memchr(p + i, '\n', n - i);
        FUZZ_ASSERT(nl);
        i = (size_t)(nl - p) + 1;
    }
    adt_pmi_conn_consume(s, conn, n);
    FUZZ_ASSERT(adt_pmi_conn_output(s, conn, &p) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int world = 1 + (data[0] & 3), tcp = data[0] & 4, use_hook = data[0] & 8;
    adt_pmi_server *s = NULL;
    adt_pmi_config cfg = {.world_size = world, .on_event = on_event,
                          .on_barrier = use_hook ? hook : NULL, .ctx = &s};
    g_held = 0;
    adt_error_clear();
    FUZZ_ASSERT(adt_pmi_server_create(&s, &cfg) == ADT_OK);
    int conn[4], dead[4];
    for (int i = 0; i < 4; i++) {
        /* fd mode: connection i is rank i (if the world has one); TCP: ranks unknown */
        conn[i] = adt_pmi_conn_open(s, tcp ? -1 : (i < world ? i : -1));
        dead[i] = 0;
        FUZZ_ASSERT(conn[i] >= 0);
    }
    size_t pos = 1;
    while (pos + 2 <= size) {
        int op = data[pos], len = data[pos + 1];
        pos += 2;
        if ((size_t)len > size - pos) len = (int)(size - pos);
        const char *bytes = (const char *)data + pos;
        pos += (size_t)len;
        int c = op & 3, action = (op >> 2) & 3;
        if (action <= 1) {
            int rc = adt_pmi_conn_feed(s, conn[c], bytes, (size_t)len);
            if (dead[c]) {
                FUZZ_ASSERT(rc == ADT_ERR_STATE);
            } else if (rc != ADT_OK) {
                FUZZ_ASSERT(rc == ADT_ERR_FORMAT);
                FUZZ_ASSERT(strncmp(adt_error_message(), "PMI ", 4) == 0);
                dead[c] = 1;
                int r = adt_pmi_conn_rank(s, conn[c]);
                if (r >= 0) FUZZ_ASSERT(adt_pmi_rank_state_of(s, r) == ADT_PMI_RANK_LOST);
            }
        } else if (action == 2) {
            adt_pmi_conn_close(s, conn[c]);
            dead[c] = 0;
            /* a rank that already used its connection may not get another */
            conn[c] = adt_pmi_conn_open(s, -1);
            FUZZ_ASSERT(conn[c] >= 0);
        } else {
            char kv[256];
            memcpy(kv, bytes, (size_t)len);
            kv[len] = 0;
            char *eq = strchr(kv, '=');
            if (eq) {
                *eq = 0;
                int rc = adt_pmi_kvs_put(s, kv, eq + 1);
                FUZZ_ASSERT(rc == ADT_OK || rc == ADT_ERR_ARG);
                if (rc == ADT_OK) FUZZ_ASSERT(!strcmp(adt_pmi_kvs_get(s, kv), eq + 1));
            }
            int rc = adt_pmi_server_barrier_release(s);
            FUZZ_ASSERT(rc == (g_held ? ADT_OK : ADT_ERR_STATE));
            g_held = 0;
        }
        for (int i = 0; i < 4; i++) take_output(s, conn[i]);
    }
    for (int r = 0; r < world; r++) {
        adt_pmi_rank_state st = adt_pmi_rank_state_of(s, r);
        FUZZ_ASSERT(st >= ADT_PMI_RANK_NONE && st <= ADT_PMI_RANK_LOST);
    }
    for (int i = 0; i < adt_pmi_kvs_count(s); i++) {
        const char *k, *v;
        adt_pmi_kvs_entry(s, i, &k, &v);
        FUZZ_ASSERT(k && *k && v && strlen(k) < ADT_PMI_KEYLEN_MAX && strlen(v) < ADT_PMI_VALLEN_MAX);
        FUZZ_ASSERT(adt_pmi_kvs_get(s, k) == v);
    }
    adt_pmi_server_free(s);
    return 0;
}
