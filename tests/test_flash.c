/*
 * test_flash.c - flash checkpoints (src/ckpt/flash.c): two shared-memory slots with crc32c.
 *
 * A state written and published loads back byte for byte; the slot being written never loads
 * and the other keeps the previous state; a writer killed (SIGKILL) in the middle of its copy
 * leaves the previous state loadable; a flipped payload byte, a damaged slot header, a
 * truncated file or a file of another layout never loads; the background thread hands every
 * published state to the persist callback with the bytes that were written, and a state queued
 * behind a busy persister is superseded by a newer one. The time the caller is blocked (the
 * copy) is printed as a MEASURE line.
 */
#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[512];

static void fill(uint8_t *p, size_t n, int64_t step) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(adt_rng_u32((uint64_t)step, i) >> 5);
}

static int same(const uint8_t *p, size_t n, int64_t step) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(adt_rng_u32((uint64_t)step, i) >> 5)) return 0;
    return 1;
}

static void save(adt_flash *f, int64_t step, size_t n) {
    int slot;
    uint8_t *p = adt_flash_begin(f, &slot);
    fill(p, n, step);
    CHECK(adt_flash_end(f, slot, 1, step, n) == ADT_OK, "%s", adt_error_message());
}

static void test_roundtrip_and_slots(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/a", g_dir);
    size_t n = 100000;
    adt_flash *f;
    CHECK(adt_flash_open(&f, path, n, 7) == ADT_OK, "%s", adt_error_message());
    adt_flash_view v;
    CHECK(adt_flash_find(f, -1, &v) != ADT_OK, "a new file holds a state");
    save(f, 10, n);
    save(f, 20, n - 5);
    CHECK(adt_flash_find(f, 10, &v) == ADT_OK && v.bytes == n && same(v.data, n, 10), "step 10");
    CHECK(adt_flash_find(f, 20, &v) == ADT_OK && v.bytes == n - 5 && same(v.data, n - 5, 20), "step 20");
    CHECK(adt_flash_find(f, -1, &v) == ADT_OK && v.step == 20, "newest is %lld", (long long)v.step);
    /* the next write takes step 10's slot: while it is written, only 20 loads */
    int slot;
    uint8_t *p = adt_flash_begin(f, &slot);
    CHECK(adt_flash_find(f, 10, &v) != ADT_OK, "the slot being written still loads");
    CHECK(adt_flash_find(f, 20, &v) == ADT_OK, "the other slot was touched");
    fill(p, n, 30);
    CHECK(adt_flash_end(f, slot, 1, 30, n) == ADT_OK, "%s", adt_error_message());
    adt_flash_close(f);
    /* reopened (another process would see the same): both states there */
    CHECK(adt_flash_open(&f, path, n, 7) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_find(f, 30, &v) == ADT_OK && same(v.data, n, 30), "step 30 after reopening");
    CHECK(adt_flash_find(f, 20, &v) == ADT_OK && same(v.data, n - 5, 20), "step 20 after reopening");
    adt_flash_close(f);
    /* another layout: reset */
    CHECK(adt_flash_open(&f, path, n, 8) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_find(f, -1, &v) != ADT_OK, "a file of another layout loads");
    adt_flash_close(f);
    adt_flash_remove(path);
}

/* Damage: a payload byte, a header byte, a truncated file. */
static void test_damage(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/b", g_dir);
    size_t n = 5000;
    adt_flash *f;
    CHECK(adt_flash_open(&f, path, n, 1) == ADT_OK, "%s", adt_error_message());
    save(f, 1, n);
    save(f, 2, n);
    adt_flash_close(f);
    /* slot 0 holds step 1: its payload starts at 8192, its header at 4096 */
    FILE *fp = fopen(path, "r+b");
    fseek(fp, 8192 + 1234, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, 8192 + 1234, SEEK_SET);
    fputc(c ^ 0x10, fp);
    fclose(fp);
    adt_flash_view v;
    CHECK(adt_flash_open(&f, path, n, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_find(f, 1, &v) != ADT_OK && strstr(adt_error_message(), "crc32c"),
          "a flipped payload byte loads: %s", adt_error_message());
    CHECK(adt_flash_find(f, 2, &v) == ADT_OK && same(v.data, n, 2), "the intact slot does not load");
    adt_flash_close(f);
    /* slot 1's header (after slot 0's header page and its payload pages): its step field */
    fp = fopen(path, "r+b");
    fseek(fp, 4096 + 4096 + (long)((n + 4095) / 4096 * 4096) + 8, SEEK_SET);
    fputc(0x7f, fp);
    fclose(fp);
    CHECK(adt_flash_open(&f, path, n, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_find(f, -1, &v) != ADT_OK, "a damaged header loads (step %lld)", (long long)v.step);
    adt_flash_close(f);
    /* truncated: nothing loads, and the file is usable again */
    CHECK(adt_flash_open(&f, path, n, 1) == ADT_OK, "%s", adt_error_message());
    save(f, 3, n);
    adt_flash_close(f);
    CHECK(truncate(path, 4096 + 8192 + 100) == 0, "truncate");
    CHECK(adt_flash_open(&f, path, n, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_find(f, -1, &v) != ADT_OK, "a truncated file loads");
    save(f, 4, n);
    CHECK(adt_flash_find(f, 4, &v) == ADT_OK && same(v.data, n, 4), "the reset file does not work");
    adt_flash_close(f);
    adt_flash_remove(path);
}

/* A writer killed mid-copy, at a random point: the previous state loads, the torn one never. */
static void test_killed_writer(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/c", g_dir);
    size_t n = 64 << 20;
    for (int trial = 0; trial < 4; trial++) {
        adt_flash *f;
        CHECK(adt_flash_open(&f, path, n, 3) == ADT_OK, "%s", adt_error_message());
        save(f, 100, 4096);
        adt_flash_close(f);
        int pfd[2];
        CHECK(pipe(pfd) == 0, "pipe");
        pid_t pid = fork();
        if (pid == 0) {
            adt_flash *g;
            if (adt_flash_open(&g, path, n, 3)) _exit(1);
            int slot;
            uint8_t *p = adt_flash_begin(g, &slot);
            if (write(pfd[1], "x", 1) != 1) _exit(1);
            for (int64_t s = 101;; s++) { /* copies forever, publishing nothing */
                memset(p, (int)s, n);
            }
        }
        char x;
        CHECK(read(pfd[0], &x, 1) == 1, "the writer did not start");
        usleep((useconds_t)(1000 + trial * 7000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(pfd[0]), close(pfd[1]);
        adt_flash_view v;
        CHECK(adt_flash_open(&f, path, n, 3) == ADT_OK, "%s", adt_error_message());
        CHECK(adt_flash_find(f, -1, &v) == ADT_OK && v.step == 100 && v.bytes == 4096 && same(v.data, 4096, 100),
              "trial %d: after a writer was killed mid-copy, the newest state is step %lld", trial, (long long)v.step);
        adt_flash_close(f);
    }
    adt_flash_remove(path);
}

/* The background thread: each published state reaches the callback intact; while it is busy, a
 * queued state is superseded by a newer one. The callback holds the thread on a gate, so the
 * order of events does not depend on timing. */
typedef struct seen {
    int64_t steps[64];
    int n, bad, entered, open;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} seen;

static int on_persist(void *ctx, int64_t gen, int64_t step, const void *data, uint64_t bytes) {
    seen *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (!same(data, bytes, step) || gen != 1) s->bad++;
    if (s->n < 64) s->steps[s->n++] = step;
    s->entered++;
    pthread_cond_broadcast(&s->cv);
    while (!s->open) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return step == 99 ? adt_error(ADT_ERR_IO, "disk full at step 99") : ADT_OK;
}

static void gate(seen *s, int open, int wait_entered) {
    pthread_mutex_lock(&s->mu);
    s->open = open;
    pthread_cond_broadcast(&s->cv);
    while (s->entered < wait_entered) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void test_persister(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/d", g_dir);
    size_t n = 8 << 20;
    adt_flash *f;
    seen s = {.open = 0};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    CHECK(adt_flash_open(&f, path, n, 4) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_flash_start(f, on_persist, &s) == ADT_OK, "%s", adt_error_message());
    double blocked = 0;
    uint8_t *src = malloc(n);
    for (int64_t step = 1; step <= 3; step++) {
        fill(src, n, step);
        double t0 = adt_now_s(); /* what a training step waits for: the copy */
        int slot;
        uint8_t *p = adt_flash_begin(f, &slot);
        memcpy(p, src, n);
        CHECK(adt_flash_end(f, slot, 1, step, n) == ADT_OK, "%s", adt_error_message());
        blocked += adt_now_s() - t0;
        if (step == 1) gate(&s, 0, 1); /* the thread holds step 1; 2 queues; 3 supersedes 2 */
    }
    free(src);
    gate(&s, 1, 0);
    int64_t last;
    CHECK(adt_flash_wait(f, &last) == ADT_OK && last == 3, "persisted up to %lld", (long long)last);
    CHECK(s.n == 2 && s.steps[0] == 1 && s.steps[1] == 3 && !s.bad, "persisted %d states (%lld, %lld), %d bad", s.n,
          (long long)s.steps[0], (long long)s.steps[1], s.bad);
    adt_flash_view v;
    CHECK(adt_flash_find(f, 3, &v) == ADT_OK && adt_flash_find(f, 1, &v) == ADT_OK, "steps 1 and 3 in the slots");
    save(f, 99, 100);
    CHECK(adt_flash_wait(f, &last) == ADT_ERR_IO && strstr(adt_error_message(), "disk full") && last == 3,
          "a failed persist: %s", adt_error_message());
    adt_flash_close(f);
    adt_flash_remove(path);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    printf("MEASURE flash_blocked_8MiB mean=%.3f ms\n", blocked / 3 * 1e3);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/adt_test_flash_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir)) return 1;
    RUN(test_roundtrip_and_slots);
    RUN(test_damage);
    RUN(test_killed_writer);
    RUN(test_persister);
    rmdir(g_dir);
    return check_finish();
}
