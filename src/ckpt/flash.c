/*
 * flash.c - flash checkpoints: a training state copied into a shared-memory file in two slots,
 * made durable by a background thread (include/adtrain/ckpt.h, "Flash checkpoints").
 *
 * File layout (all fields little-endian, the host's):
 *
 *   [0, 4096)                         file header: magic, capacity, layout id, header crc
 *   [4096 + k*(4096+cap), ...)        slot k (k = 0, 1): slot header (4096 bytes), payload (cap)
 *
 * A slot header holds seq (0 while the slot is written or empty, else a number that grows with
 * every publication), generation, step, bytes, the payload's crc32c and a crc32c of those
 * fields. Writing a slot first clears seq and the header crc, then copies the payload, then
 * (after the payload's crc is known) writes the fields and the header crc last, with release
 * fences between, so a writer killed at any byte leaves a slot that does not verify. A reader
 * checks the header crc, the bounds and the payload crc before it trusts anything.
 *
 * Slots: the training thread writes the slot that is neither being persisted nor the newest
 * published one (if the persister holds one slot, the other is taken even if it is newer: the
 * job queued for it is superseded), so the newest complete state survives any single write.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"

#define FLASH_MAGIC "ADTFLSH1"
#define FLASH_PAGE 4096u

typedef struct flash_file_hdr {
    char magic[8];
    uint64_t capacity;
    uint64_t layout;
    uint32_t crc; /* of the fields above */
} flash_file_hdr;

typedef struct flash_slot_hdr {
    uint64_t seq; /* 0: empty or being written */
    int64_t generation, step;
    uint64_t bytes;
    uint32_t payload_crc;
    uint32_t crc; /* of the fields above */
} flash_slot_hdr;

struct adt_flash {
    char path[1024];
    int fd;
    uint8_t *map;
    size_t map_len;
    uint64_t capacity, layout;
    /* the background thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int has_thread, quit;
    adt_flash_persist_fn fn;
    void *ctx;
    int queued;  /* slot waiting for the thread, -1 none */
    int running; /* slot the thread works on, -1 none */
    int writing; /* slot the caller fills (between begin and end), -1 none */
    int64_t q_gen[2], q_step[2];
    uint64_t q_bytes[2];
    int err;         /* first failure of the thread since the last wait */
    char errmsg[512];
    int64_t persisted_step;
};

static uint64_t slot_stride(uint64_t cap) { return FLASH_PAGE + (cap + FLASH_PAGE - 1) / FLASH_PAGE * FLASH_PAGE; }
static flash_slot_hdr *slot_hdr(adt_flash *f, int k) {
    return (flash_slot_hdr *)(f->map + FLASH_PAGE + (uint64_t)k * slot_stride(f->capacity));
}
static uint8_t *slot_payload(adt_flash *f, int k) { return (uint8_t *)slot_hdr(f, k) + FLASH_PAGE; }

static uint32_t file_hdr_crc(const flash_file_hdr *h) { return adt_crc32c(0, h, offsetof(flash_file_hdr, crc)); }
static uint32_t slot_hdr_crc(const flash_slot_hdr *h) { return adt_crc32c(0, h, offsetof(flash_slot_hdr, crc)); }

/* The slot's header if it verifies (not its payload), else NULL. */
static const flash_slot_hdr *slot_valid_hdr(adt_flash *f, int k) {
    flash_slot_hdr h;
    memcpy(&h, slot_hdr(f, k), sizeof h);
    atomic_thread_fence(memory_order_acquire);
    /* a seq no writer reaches (2^62 publications) is a forged or damaged header: refusing it
     * keeps seq + 1 of the next publication from wrapping to 0 */
    if (!h.seq || h.seq >= (uint64_t)1 << 62 || h.crc != slot_hdr_crc(&h) || h.bytes > f->capacity) return NULL;
    return slot_hdr(f, k);
}

int adt_flash_open(adt_flash **out, const char *path, uint64_t capacity, uint64_t layout) {
    *out = NULL;
    if (!path || !*path) return adt_error(ADT_ERR_ARG, "flash checkpoint: no file name");
    if (capacity == 0 || capacity > ((uint64_t)1 << 40))
        return adt_error(ADT_ERR_ARG, "flash checkpoint %s: capacity %llu bytes, expected 1 byte to 1 TiB", path,
                         (unsigned long long)capacity);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return adt_error(ADT_ERR_IO, "flash checkpoint %s: cannot open: %s", path, strerror(errno));
    size_t len = FLASH_PAGE + 2 * slot_stride(capacity);
    struct stat st;
    int fresh = 1;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == len) {
        flash_file_hdr h;
        if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h.magic, FLASH_MAGIC, 8) &&
            h.capacity == capacity && h.layout == layout && h.crc == file_hdr_crc(&h))
            fresh = 0;
    }
    /* another size (a truncated file included), layout or a damaged header: nothing in it is ours */
    if (fresh && (ftruncate(fd, 0) || ftruncate(fd, (off_t)len))) {
        int e = errno;
        close(fd);
        return adt_error(ADT_ERR_IO, "flash checkpoint %s: cannot size it to %zu bytes: %s", path, len, strerror(e));
    }
    uint8_t *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return adt_error(ADT_ERR_IO, "flash checkpoint %s: mmap of %zu bytes: %s", path, len, strerror(e));
    }
    adt_flash *f = adt_calloc(1, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->fd = fd, f->map = map, f->map_len = len, f->capacity = capacity, f->layout = layout;
    f->queued = f->running = f->writing = -1;
    f->persisted_step = -1;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (fresh) {
        flash_file_hdr h = {.capacity = capacity, .layout = layout};
        memcpy(h.magic, FLASH_MAGIC, 8);
        h.crc = file_hdr_crc(&h);
        memcpy(map, &h, sizeof h);
    }
    *out = f;
    return ADT_OK;
}

int adt_flash_remove(const char *path) {
    if (unlink(path) && errno != ENOENT)
        return adt_error(ADT_ERR_IO, "flash checkpoint %s: cannot remove: %s", path, strerror(errno));
    return ADT_OK;
}

uint64_t adt_flash_capacity(const adt_flash *f) { return f->capacity; }

/* Writes the slot's fields and its header crc last: from here on it verifies. */
static void publish(adt_flash *f, int k, int64_t generation, int64_t step, uint64_t bytes) {
    uint64_t seq = 0;
    for (int j = 0; j < 2; j++) {
        const flash_slot_hdr *h = slot_valid_hdr(f, j);
        if (h && h->seq > seq) seq = h->seq;
    }
    flash_slot_hdr h = {.seq = seq + 1, .generation = generation, .step = step, .bytes = bytes};
    h.payload_crc = adt_crc32c(0, slot_payload(f, k), bytes);
    h.crc = slot_hdr_crc(&h);
    flash_slot_hdr *dst = slot_hdr(f, k);
    atomic_thread_fence(memory_order_release);
    memcpy(dst, &h, offsetof(flash_slot_hdr, crc));
    atomic_thread_fence(memory_order_release);
    dst->crc = h.crc;
}

static void *persister(void *arg) {
    adt_flash *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (f->queued < 0 && !f->quit) pthread_cond_wait(&f->cv, &f->mu);
        if (f->queued < 0) break;
        int k = f->queued;
        f->queued = -1, f->running = k;
        int64_t gen = f->q_gen[k], step = f->q_step[k];
        uint64_t bytes = f->q_bytes[k];
        pthread_mutex_unlock(&f->mu);
        publish(f, k, gen, step, bytes);
        int rc = f->fn ? f->fn(f->ctx, gen, step, slot_payload(f, k), bytes) : ADT_OK;
        pthread_mutex_lock(&f->mu);
        if (rc && !f->err) {
            f->err = rc;
            snprintf(f->errmsg, sizeof f->errmsg, "%s", adt_error_message());
        }
        if (!rc) f->persisted_step = step;
        f->running = -1;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int adt_flash_start(adt_flash *f, adt_flash_persist_fn fn, void *ctx) {
    if (f->has_thread) return adt_error(ADT_ERR_STATE, "flash checkpoint %s: the persister runs already", f->path);
    f->fn = fn, f->ctx = ctx;
    if (pthread_create(&f->thread, NULL, persister, f))
        return adt_error(ADT_ERR_IO, "flash checkpoint %s: cannot start the persister thread", f->path);
    f->has_thread = 1;
    return ADT_OK;
}

void *adt_flash_begin(adt_flash *f, int *slot) {
    pthread_mutex_lock(&f->mu);
    ADT_ASSERT(f->writing < 0);
    int k;
    if (f->running >= 0) {
        k = 1 - f->running;
        if (f->queued == k) f->queued = -1; /* superseded by the state about to be written */
    } else {
        /* the slot that does not hold the newest publication (an invalid one first) */
        const flash_slot_hdr *h0 = slot_valid_hdr(f, 0), *h1 = slot_valid_hdr(f, 1);
        k = !h0 ? 0 : !h1 ? 1 : h0->seq < h1->seq ? 0 : 1;
        if (f->queued == k) f->queued = -1;
    }
    f->writing = k;
    pthread_mutex_unlock(&f->mu);
    flash_slot_hdr *h = slot_hdr(f, k);
    h->crc = 0;
    h->seq = 0;
    atomic_thread_fence(memory_order_release);
    *slot = k;
    return slot_payload(f, k);
}

int adt_flash_end(adt_flash *f, int slot, int64_t generation, int64_t step, uint64_t bytes) {
    pthread_mutex_lock(&f->mu);
    ADT_ASSERT(f->writing == slot);
    f->writing = -1;
    if (bytes > f->capacity) {
        pthread_mutex_unlock(&f->mu);
        return adt_error(ADT_ERR_ARG, "flash checkpoint %s: %llu bytes, the slots hold %llu", f->path,
                         (unsigned long long)bytes, (unsigned long long)f->capacity);
    }
    if (!f->has_thread) {
        pthread_mutex_unlock(&f->mu);
        publish(f, slot, generation, step, bytes);
        return ADT_OK;
    }
    f->q_gen[slot] = generation, f->q_step[slot] = step, f->q_bytes[slot] = bytes;
    f->queued = slot;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    return ADT_OK;
}

int adt_flash_wait(adt_flash *f, int64_t *persisted_step) {
    pthread_mutex_lock(&f->mu);
    while (f->queued >= 0 || f->running >= 0) pthread_cond_wait(&f->cv, &f->mu);
    int rc = f->err;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", f->errmsg);
    f->err = 0;
    if (persisted_step) *persisted_step = f->persisted_step;
    pthread_mutex_unlock(&f->mu);
    return rc ? adt_error(rc, "%s", msg) : ADT_OK;
}

/* Slot k's state if it verifies completely (payload crc included). */
static int slot_read(adt_flash *f, int k, adt_flash_view *out, char *why, size_t n) {
    const flash_slot_hdr *h = slot_valid_hdr(f, k);
    if (!h) {
        snprintf(why, n, "slot %d is empty or was not completely written", k);
        return 0;
    }
    flash_slot_hdr c;
    memcpy(&c, h, sizeof c);
    if (adt_crc32c(0, slot_payload(f, k), c.bytes) != c.payload_crc) {
        snprintf(why, n, "slot %d (step %lld) fails its crc32c", k, (long long)c.step);
        return 0;
    }
    *out = (adt_flash_view){.slot = k, .seq = c.seq, .generation = c.generation, .step = c.step, .bytes = c.bytes,
                            .data = slot_payload(f, k)};
    return 1;
}

int adt_flash_find(adt_flash *f, int64_t step, adt_flash_view *out) {
    char why[2][160];
    adt_flash_view v[2];
    int ok[2];
    pthread_mutex_lock(&f->mu);
    for (int k = 0; k < 2; k++)
        ok[k] = f->writing != k && slot_read(f, k, &v[k], why[k], sizeof why[k]);
    pthread_mutex_unlock(&f->mu);
    int best = -1;
    for (int k = 0; k < 2; k++)
        if (ok[k] && (step < 0 ? (best < 0 || v[k].seq > v[best].seq) : v[k].step == step)) best = k;
    if (best >= 0) {
        *out = v[best];
        return ADT_OK;
    }
    char wanted[48];
    snprintf(wanted, sizeof wanted, step < 0 ? "a state" : "step %lld", (long long)step);
    return adt_error(ADT_ERR_IO, "flash checkpoint %s: no valid slot holds %s (%s; %s)", f->path, wanted,
                     ok[0] ? "slot 0 holds another step" : why[0], ok[1] ? "slot 1 holds another step" : why[1]);
}

void adt_flash_close(adt_flash *f) {
    if (!f) return;
    if (f->has_thread) {
        pthread_mutex_lock(&f->mu);
        f->quit = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL); /* what was queued is done first */
    }
    munmap(f->map, f->map_len);
    close(f->fd);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}
