/*
 * error.c - the per-thread error message, always-on assertions and checked allocation.
 */
#include "adtrain/base.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char tl_msg[2048];

/* Formatted aside first: the arguments may include adt_error_message() itself. */
int adt_error(int code, const char *fmt, ...) {
    char msg[sizeof tl_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(tl_msg, msg, sizeof tl_msg);
    return code;
}

int adt_error_prefix(int code, const char *fmt, ...) {
    char old[sizeof tl_msg];
    memcpy(old, tl_msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof tl_msg) snprintf(tl_msg + n, sizeof tl_msg - (size_t)n, "%s", old);
    return code;
}

const char *adt_error_message(void) { return tl_msg[0] ? tl_msg : "no error message"; }
void adt_error_clear(void) { tl_msg[0] = 0; }
int adt_error_pending(void) { return tl_msg[0] != 0; }

const char *adt_status_name(int code) {
    switch (code) {
    case ADT_OK: return "ok";
    case ADT_ERR_ARG: return "bad argument";
    case ADT_ERR_SHAPE: return "shape error";
    case ADT_ERR_IO: return "I/O error";
    case ADT_ERR_FORMAT: return "format error";
    case ADT_ERR_NOMEM: return "out of memory";
    case ADT_ERR_STATE: return "invalid state";
    case ADT_ERR_COMM: return "communication error";
    case ADT_ERR_UNSUPPORTED: return "unsupported";
    case ADT_ERR_STALE: return "stale request";
    case ADT_ERR_RUNTIME: return "runtime failure";
    default: return "unknown error";
    }
}

void adt_abort(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "adtrain: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n---> HINT: this is a bug in adtrain; please report it with the command line.\n");
    abort();
}

static void oom(size_t n, const char *file, int line) {
    fprintf(stderr, "adtrain: out of memory allocating %zu bytes at %s:%d\n", n, file, line);
    abort();
}

void *adt_malloc_check(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n, file, line);
    return p;
}

void *adt_calloc_check(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) oom(n * sz, file, line);
    return p;
}

void *adt_realloc_check(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n, file, line);
    return q;
}

char *adt_strdup_check(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *p = adt_malloc_check(n, file, line);
    memcpy(p, s, n);
    return p;
}

size_t adt_str_copy(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src), k = n < cap ? n : cap - 1;
    memcpy(dst, src, k);
    dst[k] = 0;
    return n;
}

void *adt_alloc_aligned(size_t n) {
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) oom(n, __FILE__, __LINE__);
    memset(p, 0, sz ? sz : 64);
    return p;
}

void adt_free_aligned(void *p) { free(p); }
