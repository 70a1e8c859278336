/*
 * util.c - what the subcommands share: the one error-line format.
 */
#include <stdarg.h>
#include <stdio.h>

#include "cli.h"

int cli_fail(const char *command, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "adtrain %s: ", command);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return code;
}
