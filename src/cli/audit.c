/*
 * audit.c - `adtrain audit --job DIR`: replays the data ledger of a job (DIR/ledger.db, opened
 * read-only, so a live master may keep running) and prints, per epoch, how many samples the
 * committed model was trained on once, more than once, not at all, or still pending.
 */
#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ledger.h"
#include "cli.h"

static int audit_has_value(const char *name) { return !strcmp(name, "--job"); }

static void audit_usage(FILE *f) {
    fprintf(f, "usage: adtrain audit --job DIR [--complete]\n"
               "\n"
               "Audits the data ledger DIR/" ADT_LEDGER_FILE ": per epoch, the samples in the committed model\n"
               "exactly once, duplicated, missing, pending, dead-lettered; committed steps that do not\n"
               "hold the global batch. --complete also requires the job to be finished.\n"
               "\n"
               "exit status: 0 clean, 1 something is missing, duplicated or inconsistent (or, with\n"
               "--complete, not finished), 2 bad flag or unreadable ledger\n");
}

typedef struct audit_opts {
    const char *dir;
    int complete;
} audit_opts;

static int audit_apply(void *ctx, const char *f, const char *v) {
    audit_opts *o = ctx;
    if (!strcmp(f, "--job"))
        o->dir = v;
    else if (!strcmp(f, "--complete"))
        o->complete = 1;
    else
        return 0;
    return 1;
}

int cli_audit(int argc, char **argv) {
    audit_opts o = {NULL, 0};
    int i = 1, r = cli_parse("audit", argc, argv, &i, audit_has_value, audit_apply, &o, audit_usage);
    if (r) return r == 1 ? 0 : 2;
    const char *dir = o.dir;
    int complete = o.complete;
    if (!dir) return cli_fail("audit", 2, "--job DIR is required");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, ADT_LEDGER_FILE);
    adt_ledger *L;
    if (adt_ledger_open(&L, path, ADT_LEDGER_READONLY)) return cli_fail("audit", 2, "%s", adt_error_message());
    adt_ledger_audit a;
    int rc = adt_ledger_audit_run(L, &a);
    adt_ledger_close(L);
    if (rc) return cli_fail("audit", 2, "%s", adt_error_message());
    adt_ledger_audit_print(stdout, &a);
    int bad = !a.ok || (complete && !a.complete);
    adt_ledger_audit_free(&a);
    return bad ? 1 : 0;
}
