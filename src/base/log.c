/*
 * log.c - leveled logging to stderr with an optional tag (the rank), the clocks, and a helper
 * thread's priority.
 */
#define _POSIX_C_SOURCE 200809L
#include "adtrain/base.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static adt_log_level g_level = (adt_log_level)-1;
static char g_tag[64];

static adt_log_level level_from_env(void) {
    const char *e = getenv("ADT_LOG");
    if (!e) return ADT_LOG_INFO;
    if (!strcasecmp(e, "debug")) return ADT_LOG_DEBUG;
    if (!strcasecmp(e, "warn")) return ADT_LOG_WARN;
    if (!strcasecmp(e, "error")) return ADT_LOG_ERROR;
    return ADT_LOG_INFO;
}

void adt_log_set_level(adt_log_level lvl) { g_level = lvl; }
void adt_log_set_tag(const char *tag) { snprintf(g_tag, sizeof g_tag, "%s", tag ? tag : ""); }

void adt_log(adt_log_level lvl, const char *fmt, ...) {
    if ((int)g_level < 0) g_level = level_from_env();
    if (lvl < g_level) return;
    static const char *names[] = {"debug", "info", "warn", "error"};
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "adtrain%s%s: %s: ", g_tag[0] ? " " : "", g_tag, names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf) vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf); /* one write per line so ranks do not interleave mid-line */
}

double adt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void adt_sleep_s(double s) {
    if (!(s > 0)) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

double adt_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void adt_thread_background(void) {
    /* Linux: a thread's nice value is its own (setpriority on its tid) */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
}
