/*
 * util.c - what the subcommands share: the one error-line format, how a distributed run keeps
 * its ranks from all saying the same thing, flag walking, checked numbers, and signals turned
 * into a readable descriptor for the long-running commands.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* One flag: 1 (and *name in buf, *value), 0 at the end or after "--", -1 on a missing value. */
static int next_flag(const char *command, int argc, char **argv, int *i, int (*has_value)(const char *name), char *buf,
                     int cap, const char **name, const char **value) {
    if (*i >= argc) return 0;
    const char *a = argv[*i];
    if (!strcmp(a, "--")) {
        (*i)++;
        return 0;
    }
    (*i)++;
    /* the name, with torchrun's underscores as dashes (--nproc_per_node = --nproc-per-node) */
    const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '=');
    snprintf(buf, (size_t)cap, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    for (char *p = buf + 2; !strncmp(buf, "--", 2) && *p; p++)
        if (*p == '_') *p = '-';
    *name = buf;
    *value = eq ? eq + 1 : NULL;
    if (eq && !has_value(buf)) return cli_fail(command, -1, "%s takes no value", buf);
    if (!eq && has_value(buf)) {
        if (*i >= argc) return cli_fail(command, -1, "%s: missing value (see adtrain %s --help)", buf, command);
        *value = argv[(*i)++];
    }
    return 1;
}

int cli_parse(const char *command, int argc, char **argv, int *i, int (*has_value)(const char *name),
              int (*apply)(void *ctx, const char *name, const char *value), void *ctx, void (*usage)(FILE *f)) {
    char buf[64];
    const char *f, *v;
    int r;
    while ((r = next_flag(command, argc, argv, i, has_value, buf, sizeof buf, &f, &v)) == 1) {
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 1;
        }
        int k = apply(ctx, f, v);
        if (k < 0) return 2;
        if (k == 0) return cli_fail(command, 2, "unknown flag '%s' (see adtrain %s --help)", f, command);
    }
    return r < 0 ? 2 : 0;
}

int cli_in_list(const char *name, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(name, list[i])) return 1;
    return 0;
}

int cli_long(const char *command, const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return cli_fail(command, -1, "%s: expected an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    *out = (long)v;
    return 0;
}

int cli_double(const char *command, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return cli_fail(command, -1, "%s: expected a number in [%g, %g], got '%s'", flag, lo, hi, s);
    *out = v;
    return 0;
}

int cli_range(const char *command, const char *flag, const char *s, long *lo, long *hi) {
    const char *colon = strchr(s, ':');
    char a[32], b[32];
    if (!colon) {
        if (cli_long(command, flag, s, 1, 1 << 20, lo)) return -1;
        *hi = *lo;
        return 0;
    }
    snprintf(a, sizeof a, "%.*s", (int)(colon - s), s);
    snprintf(b, sizeof b, "%s", colon + 1);
    if (cli_long(command, flag, a, 1, 1 << 20, lo) || cli_long(command, flag, b, 0, 1 << 20, hi)) return -1;
    if (*hi && *hi < *lo) return cli_fail(command, -1, "%s %s: MIN above MAX", flag, s);
    return 0;
}

int cli_token_flag(const char *command, const char *name, const char *value, char *buf, int cap, const char **dst) {
    if (!strcmp(name, "--token")) {
        snprintf(buf, (size_t)cap, "%s", value);
    } else if (!strcmp(name, "--token-file")) {
        FILE *f = fopen(value, "r");
        if (!f) return cli_fail(command, -1, "--token-file %s: %s", value, strerror(errno));
        if (!fgets(buf, cap, f)) buf[0] = 0;
        fclose(f);
        buf[strcspn(buf, "\r\n")] = 0;
        if (!buf[0]) return cli_fail(command, -1, "--token-file %s: empty", value);
    } else {
        return 0;
    }
    *dst = buf;
    return 1;
}

static int g_stop_pipe[2] = {-1, -1};

static void on_stop_signal(int sig) {
    int e = errno;
    char c = (char)sig;
    if (write(g_stop_pipe[1], &c, 1) < 0) {
    }
    errno = e;
}

int cli_stop_fd(void) {
    if (g_stop_pipe[0] < 0) {
        if (pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK)) return -1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
    }
    return g_stop_pipe[0];
}

/* The train-style flag loop (every flag takes a value) on top of cli_parse. */
typedef struct flag_loop {
    const char *command;
    int (*apply)(void *opts, const char *flag, const char *value);
    void *opts;
    int rc;
} flag_loop;

static int takes_value(const char *name) { return name[0] == '-' && strcmp(name, "-h") && strcmp(name, "--help"); }

static int flag_loop_apply(void *ctx, const char *name, const char *value) {
    flag_loop *w = ctx;
    if (name[0] != '-')
        w->rc = cli_fail(w->command, 2, "unexpected argument '%s' (see adtrain %s --help)", name, w->command);
    else
        w->rc = w->apply(w->opts, name, value);
    return w->rc ? -1 : 1;
}

int cli_parse_flags(const char *command, int argc, char **argv, void (*usage)(FILE *),
                    int (*apply)(void *opts, const char *flag, const char *value), void *opts) {
    flag_loop w = {command, apply, opts, 0};
    int i = 1, r = cli_parse(command, argc, argv, &i, takes_value, flag_loop_apply, &w, usage);
    if (r == 1) return -1;
    if (r == 2) return w.rc ? w.rc : 2;
    if (i < argc) return cli_fail(command, 2, "unexpected argument '%s' (see adtrain %s --help)", argv[i], command);
    return 0;
}

/* cli_parse_flags where the flags in `switches` (NULL-terminated) take no value (apply gets NULL). */
static const char *const *cur_switches;
static int takes_value_or_switch(const char *name) { return !cli_in_list(name, cur_switches) && takes_value(name); }

int cli_parse_flags_switches(const char *command, int argc, char **argv, void (*usage)(FILE *),
                             int (*apply)(void *opts, const char *flag, const char *value), void *opts,
                             const char *const *switches) {
    flag_loop w = {command, apply, opts, 0};
    cur_switches = switches;
    int i = 1, r = cli_parse(command, argc, argv, &i, takes_value_or_switch, flag_loop_apply, &w, usage);
    cur_switches = NULL;
    if (r == 1) return -1;
    if (r == 2) return w.rc ? w.rc : 2;
    if (i < argc) return cli_fail(command, 2, "unexpected argument '%s' (see adtrain %s --help)", argv[i], command);
    return 0;
}

int cli_parse_long(const char *command, const char *flag, const char *v, long lo, long hi, long *out) {
    return cli_long(command, flag, v, lo, hi, out) ? 2 : 0;
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
