/*
 * check.h - the tiny test harness every tests/test_*.c uses.
 *
 * A test program is a list of RUN(test_fn) calls in main(); a CHECK that fails prints
 * file:line and a message and marks the current test failed, but the program goes on so one run
 * shows every failure. The last line is "RESULT passed=N failed=M"; tests/run.sh adds them up.
 */
#ifndef ADTRAIN_TESTS_CHECK_H
#define ADTRAIN_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int check_cur_failed;
static int check_n_passed, check_n_failed;
static const char *check_cur_name;

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s: ", __FILE__, __LINE__, check_cur_name,     \
                    #cond);                                                                    \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            check_cur_failed = 1;                                                              \
        }                                                                                      \
    } while (0)

/* |a-b| <= atol + rtol |b| */
#define CHECK_CLOSE(a, b, rtol, atol)                                                          \
    do {                                                                                       \
        double ca_ = (double)(a), cb_ = (double)(b);                                           \
        CHECK(fabs(ca_ - cb_) <= (atol) + (rtol)*fabs(cb_), "%s=%.9g %s=%.9g", #a, ca_, #b,   \
              cb_);                                                                            \
    } while (0)

/* Seconds on the monotonic clock: RUN prints each case's wall time ("case NAME S s") to stdout,
 * the log tests/run.sh keeps, so a slow suite shows which case to look at. */
static inline double check_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define RUN(fn)                                                                                \
    do {                                                                                       \
        check_cur_failed = 0;                                                                  \
        check_cur_name = #fn;                                                                  \
        double check_t0_ = check_now_s();                                                      \
        fn();                                                                                  \
        printf("case %s %.1f s\n", #fn, check_now_s() - check_t0_);                            \
        fflush(stdout);                                                                        \
        if (check_cur_failed) {                                                                \
            check_n_failed++;                                                                  \
            fprintf(stderr, "FAILED %s\n", #fn);                                               \
        } else {                                                                               \
            check_n_passed++;                                                                  \
            if (getenv("CHECK_VERBOSE")) fprintf(stderr, "ok %s\n", #fn);                      \
        }                                                                                      \
    } while (0)

static inline int check_finish(void) {
    printf("RESULT passed=%d failed=%d\n", check_n_passed, check_n_failed);
    return check_n_failed ? 1 : 0;
}

/* A private temporary directory for tests that write files: check_tmpdir_make("text") creates
 * $TMPDIR/adt_test_text_XXXXXX, check_tmp_path("a.txt") names a file in it (four rotating
 * buffers, so a few paths can be live at once), check_tmpdir_remove() deletes the listed files
 * and the directory. */
static inline char *check_tmpdir(void) {
    static char dir[256];
    return dir;
}

static inline int check_tmpdir_make(const char *tag) {
    const char *base = getenv("TMPDIR");
    snprintf(check_tmpdir(), 256, "%s/adt_test_%s_XXXXXX", base && *base ? base : "/tmp", tag);
    if (mkdtemp(check_tmpdir())) return 0;
    perror("mkdtemp");
    return -1;
}

static inline const char *check_tmp_path(const char *leaf) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", check_tmpdir(), leaf);
    return p;
}

/* Writes n bytes to path; 0 on success. */
static inline int check_write_file(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(buf, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

static inline void check_tmpdir_remove(const char *const *leaves, size_t n) {
    for (size_t i = 0; i < n; i++) unlink(check_tmp_path(leaves[i]));
    rmdir(check_tmpdir());
}

/* Relative error with a floor, max over elements: scale-free, and an all-zero pair counts 0. */
static inline double check_max_rel_err(const float *a, const float *b, long n, double floor_) {
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double s = fabs((double)b[i]);
        if (s < floor_) s = floor_;
        if (d / s > worst || d != d) worst = d != d ? INFINITY : d / s;
    }
    return worst;
}

/* Largest |x - ref| / (|ref| + scale) over n elements, scale = max(max|ref|, floor_): a tensor's
 * error at its own scale, so elements near zero are not held to a relative bound that rounding
 * cannot meet (an all-zero ref with no floor counts |x - ref|). The floor is for a state that
 * nearly cancelled: m = b1 m + (1 - b1) g rounds relative to its operands, so an optimizer moment
 * that passed through 0.02 on its way to 1e-6 is measured against 0.02 (check_max_abs of it at
 * earlier steps). NaN counts as infinite. */
static inline double check_scaled_err_floor(const float *x, const float *ref, long n, double floor_) {
    double scale = floor_, worst = 0;
    for (long i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0) scale = 1;
    for (long i = 0; i < n; i++) {
        double e = fabs((double)x[i] - ref[i]) / (fabs(ref[i]) + scale);
        if (!(e <= worst)) worst = e != e ? INFINITY : e;
    }
    return worst;
}

static inline double check_scaled_err(const float *x, const float *ref, long n) {
    return check_scaled_err_floor(x, ref, n, 0);
}

/* max |x| over n elements. */
static inline double check_max_abs(const float *x, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

#endif
