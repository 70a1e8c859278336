/*
 * file.c - the bytes of a dataset file: mapped read-only when it is a regular file (a token
 * file of billions of ids costs no memory until read), read whole otherwise, and inflated when
 * gzip-compressed (MNIST is shipped as .gz).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

static int read_fd(data_buf *b, int fd, const char *path) {
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = adt_malloc(cap);
    for (;;) {
        if (n == cap) buf = adt_realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(buf);
            return adt_error(ADT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    b->heap = buf;
    b->p = buf;
    b->n = n;
    return ADT_OK;
}

int data_buf_open(data_buf *b, const char *path, const char *what) {
    memset(b, 0, sizeof *b);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return adt_error(ADT_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat st;
    int rc = ADT_OK;
    if (fstat(fd, &st) != 0) {
        rc = adt_error(ADT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        rc = adt_error(ADT_ERR_IO, "%s: is a directory, expected %s", path, what);
    } else if (S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size <= SIZE_MAX) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
            b->map = m;
            b->map_len = (size_t)st.st_size;
            b->p = m;
            b->n = (size_t)st.st_size;
        } else {
            rc = read_fd(b, fd, path);
        }
    } else {
        rc = read_fd(b, fd, path); /* empty file, pipe, ... */
    }
    close(fd);
    return rc;
}

void data_buf_copy(data_buf *b, const void *p, size_t n) {
    memset(b, 0, sizeof *b);
    b->heap = adt_malloc(n);
    if (n) memcpy(b->heap, p, n);
    b->p = b->heap;
    b->n = n;
}

void data_buf_free(data_buf *b) {
    if (b->map) munmap(b->map, b->map_len);
    free(b->heap);
    memset(b, 0, sizeof *b);
}

/* Inflates every gzip member of in[0..n) (concatenated .gz files are one stream, as for gzip -d).
 * The output grows as it arrives, so memory follows the real size, never a declared one. */
static int gunzip(const uint8_t *in, size_t n, const char *name, uint64_t max_out, uint8_t **out, size_t *out_n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return adt_error(ADT_ERR_NOMEM, "%s: zlib init failed", name);
    /* one byte past the limit tells "exactly max_out" from "more" */
    uint64_t limit = max_out + 1;
    size_t cap = (size_t)(limit < (1u << 16) ? limit : (1u << 16)), len = 0;
    uint8_t *buf = adt_malloc(cap);
    const uint8_t *p = in, *end = in + n;
    int rc = ADT_OK;
    for (;;) {
        if (len == cap) {
            if (cap >= limit) {
                rc = adt_error(ADT_ERR_FORMAT, "%s: inflates to more than %llu bytes, expected at most that", name,
                               (unsigned long long)max_out);
                break;
            }
            cap = (uint64_t)cap * 2 > limit ? (size_t)limit : cap * 2;
            buf = adt_realloc(buf, cap);
        }
        size_t avail = (size_t)(end - p), room = cap - len;
        z.next_in = (Bytef *)p;
        z.avail_in = avail > UINT32_MAX ? UINT32_MAX : (uInt)avail;
        z.next_out = buf + len;
        z.avail_out = room > UINT32_MAX ? UINT32_MAX : (uInt)room;
        uInt in_before = z.avail_in, out_before = z.avail_out;
        int zr = inflate(&z, Z_NO_FLUSH);
        p += in_before - z.avail_in;
        len += out_before - z.avail_out;
        if (zr == Z_STREAM_END) {
            if (p == end) break;
            /* another member may follow (concatenated .gz files); anything else is garbage */
            if (end - p < 2 || p[0] != 0x1f || p[1] != 0x8b) {
                rc = adt_error(ADT_ERR_FORMAT, "%s: %lld bytes of garbage after the gzip stream, expected none",
                               name, (long long)(end - p));
                break;
            }
            inflateReset(&z);
            continue;
        }
        if (zr == Z_OK || (zr == Z_BUF_ERROR && z.avail_out == 0)) continue; /* progress, or needs room */
        if (zr == Z_BUF_ERROR && p == end) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: gzip stream is truncated after %zu bytes, expected it to end with "
                           "its trailer", name, n);
            break;
        }
        rc = adt_error(ADT_ERR_FORMAT, "%s: corrupt gzip data at byte %lld (%s), expected a valid gzip stream", name,
                       (long long)(p - in), z.msg ? z.msg : "no progress");
        break;
    }
    inflateEnd(&z);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_n = len;
    return ADT_OK;
}

int data_buf_gunzip(data_buf *b, const char *name, uint64_t max_out) {
    if (b->n < 2 || b->p[0] != 0x1f || b->p[1] != 0x8b) return ADT_OK;
    uint8_t *out = NULL;
    size_t n = 0;
    int rc = gunzip(b->p, b->n, name, max_out, &out, &n);
    if (rc) return rc;
    data_buf_free(b);
    b->heap = out;
    b->p = out;
    b->n = n;
    return ADT_OK;
}
