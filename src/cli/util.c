/*
 * util.c - what the subcommands share: the one error-line format, and how a distributed run
 * keeps its ranks from all saying the same thing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
