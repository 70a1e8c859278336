/*
 * util.c - what the subcommands share: the one error-line format, how a distributed run keeps
 * its ranks from all saying the same thing, the flag loop and number flags.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "cli.h"

int cli_quiet;

static char g_tag[32];        /* "rank 3: " on ranks other than 0 of a distributed run */
static int g_defer;           /* keep the first error instead of printing it */
static char g_deferred[2048]; /* the kept error line, "" if none */

void cli_set_rank(int rank, int nranks) {
    cli_quiet = rank != 0;
    if (nranks > 1 && rank != 0) snprintf(g_tag, sizeof g_tag, "rank %d: ", rank);
    else g_tag[0] = 0;
}

void cli_defer_errors(int on) {
    g_defer = on;
    if (on) g_deferred[0] = 0;
}

void cli_print_deferred(void) {
    if (g_deferred[0]) fputs(g_deferred, stderr);
    g_deferred[0] = 0;
}

int cli_fail(const char *command, int code, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_defer) {
        if (!g_deferred[0]) snprintf(g_deferred, sizeof g_deferred, "adtrain %s: %s%s\n", command, g_tag, msg);
        return code;
    }
    fprintf(stderr, "adtrain %s: %s%s\n", command, g_tag, msg);
    return code;
}

int cli_parse_flags(const char *command, int argc, char **argv, void (*usage)(FILE *),
                    int (*apply)(void *opts, const char *flag, const char *value), void *opts) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (a[0] != '-') return cli_fail(command, 2, "unexpected argument '%s' (see adtrain %s --help)", a, command);
        char flag[64];
        const char *v = NULL, *eq = strchr(a, '=');
        if (eq && a[1] == '-' && (size_t)(eq - a) < sizeof flag) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = 0;
            v = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", a);
        }
        if (!v) {
            if (i + 1 >= argc) return cli_fail(command, 2, "%s: missing value (see adtrain %s --help)", flag, command);
            v = argv[++i];
        }
        int rc = apply(opts, flag, v);
        if (rc) return rc;
    }
    return 0;
}

int cli_parse_long(const char *command, const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return cli_fail(command, 2, "%s: expected an integer in [%ld, %ld], got '%s'", flag, lo, hi, v);
    *out = (long)x;
    return 0;
}

int cli_load_model(const char *command, const char *path, adt_model_cfg *m, char *label, size_t n) {
    if (!path) {
        adt_model_cfg_default(m);
        snprintf(label, n, "built-in gpt-tiny (gpt)");
        return 0;
    }
    if (adt_model_cfg_load(m, path)) return cli_fail(command, 2, "--model: %s", adt_error_message());
    snprintf(label, n, "%s (%s)", path, adt_model_type_name(m->type));
    return 0;
}
