/*
 * adtrain/base.h - errors, checked allocation, logging, clocks and the counter-based RNG.
 *
 * Everything above this layer reports failure the same way: a function returns ADT_OK (0) or a
 * negative adt_status, and leaves a human-readable message in the calling thread's error slot
 * (adt_error_message()). The message names the file, field, flag or node at fault and what was
 * expected, so the CLI can print it as is and exit non-zero.
 */
#ifndef ADTRAIN_BASE_H
#define ADTRAIN_BASE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes and the per-thread error message
 */
typedef enum adt_status {
    ADT_OK = 0,
    ADT_ERR_ARG = -1,      /* a bad argument, flag or config field                */
    ADT_ERR_SHAPE = -2,    /* shapes do not fit an op's rule                      */
    ADT_ERR_IO = -3,       /* a file could not be opened, read or written         */
    ADT_ERR_FORMAT = -4,   /* a file is malformed: wrong magic, truncated, ...    */
    ADT_ERR_NOMEM = -5,    /* an allocation failed                                */
    ADT_ERR_STATE = -6,    /* an API call out of order (e.g. run before plan)     */
    ADT_ERR_COMM = -7,     /* a collective failed or timed out                    */
    ADT_ERR_UNSUPPORTED = -8,
    ADT_ERR_STALE = -9,    /* fenced: a request of an ended generation or a revoked lease */
    ADT_ERR_RUNTIME = -10, /* a failure while running (a step, a write, a peer that failed) */
} adt_status;

/* Sets the calling thread's error message (printf-style) and returns `code`, so that
 * `return adt_error(ADT_ERR_ARG, "...")` reads naturally. */
int adt_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with more context ("loading ckpt.safetensors: " + old). */
int adt_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *adt_error_message(void);
void adt_error_clear(void);
/* 1 if the calling thread's error slot holds a message (adt_error_clear empties it). */
int adt_error_pending(void);
const char *adt_status_name(int code);

/* Always-on internal invariant check: prints file:line and the condition, then aborts.
 * For bugs in adtrain, never for bad user input (that gets adt_error). */
#define ADT_ASSERT(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "assertion failed: %s", #cond);             \
    } while (0)
void adt_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* ---------------------------------------------------------------------------------------------
 * Checked allocation. Out of memory is not recoverable in a training job: abort with the size.
 */
void *adt_malloc_check(size_t n, const char *file, int line);
void *adt_calloc_check(size_t n, size_t sz, const char *file, int line);
void *adt_realloc_check(void *p, size_t n, const char *file, int line);
char *adt_strdup_check(const char *s, const char *file, int line);
#define adt_malloc(n) adt_malloc_check((n), __FILE__, __LINE__)
#define adt_calloc(n, sz) adt_calloc_check((n), (sz), __FILE__, __LINE__)
#define adt_realloc(p, n) adt_realloc_check((p), (n), __FILE__, __LINE__)
#define adt_strdup(s) adt_strdup_check((s), __FILE__, __LINE__)
/* Copies src into dst of cap >= 1 bytes, cut to cap - 1 bytes and NUL-terminated as
 * snprintf(dst, cap, "%s", src) would; returns strlen(src). For names copied in the planner's
 * inner loops, where snprintf's format parsing cost a tenth of the search. */
size_t adt_str_copy(char *dst, size_t cap, const char *src);
/* 64-byte aligned, zeroed; free with adt_free_aligned. */
void *adt_alloc_aligned(size_t n);
void adt_free_aligned(void *p);

/* ---------------------------------------------------------------------------------------------
 * Logging (stderr). Level from ADT_LOG=debug|info|warn|error, default info.
 */
typedef enum { ADT_LOG_DEBUG, ADT_LOG_INFO, ADT_LOG_WARN, ADT_LOG_ERROR } adt_log_level;
void adt_log(adt_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void adt_log_set_level(adt_log_level lvl);
/* Tag prepended to every line, e.g. "rank 3"; empty by default. */
void adt_log_set_tag(const char *tag);

/* ---------------------------------------------------------------------------------------------
 * Files
 */
/* The whole file at `path`, read to its end (pipes too), at most `max` bytes: *out is malloc'd
 * with a NUL after the *n bytes (text may use it as a string, if it has no NUL of its own).
 * `what` names the expected content in messages ("text data"). ADT_ERR_IO (cannot open, a
 * directory, read error) or ADT_ERR_FORMAT (too large). */
int adt_file_read(const char *path, size_t max, const char *what, char **out, size_t *n);
/* Writes n bytes to `path` through PATH.tmp, fsynced, then renamed over it: a reader sees the old
 * file or the whole new one, and after a crash the new one is there or not at all. ADT_ERR_IO
 * naming the file. */
int adt_file_write_atomic(const char *path, const void *data, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Clocks
 */
double adt_now_s(void);  /* monotonic seconds */
double adt_wall_s(void); /* seconds since the epoch (for logs and events) */
void adt_sleep_s(double s); /* sleeps s seconds through interruptions; s <= 0: returns at once */

/* The calling thread at the lowest CPU priority (nice 19): a helper thread of a training rank
 * (requests to the master, checkpoint persisting) whose work has a whole step or more to finish
 * then runs when the rank waits, instead of preempting its compute each time it wakes. */
void adt_thread_background(void);

/* ---------------------------------------------------------------------------------------------
 * Counter-based RNG. A random number is a pure function of (key, counter), so any process can
 * draw the number for a global element index without drawing the ones before it: a sharded run
 * draws exactly the same dropout mask and initial weights as a serial one.
 */
uint64_t adt_rng_mix64(uint64_t x);                      /* splitmix64 finaliser */
uint32_t adt_rng_u32(uint64_t key, uint64_t counter);    /* uniform 32 bits       */
float adt_rng_uniform(uint64_t key, uint64_t counter);   /* [0, 1), 24 bits       */
float adt_rng_normal(uint64_t key, uint64_t counter);    /* N(0,1), Box-Muller    */
/* A key for a named stream: mixes a seed with a string (e.g. a parameter name). */
uint64_t adt_rng_key(uint64_t seed, const char *name);

/* crc32c (Castagnoli), for checkpoint slots and ledgers. */
uint32_t adt_crc32c(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
