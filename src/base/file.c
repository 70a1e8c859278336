/*
 * file.c - reading a whole (small) file: configs, manifests, text data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"

int adt_file_read(const char *path, size_t max, const char *what, char **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return adt_error(ADT_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat st;
    int have_st = fstat(fileno(f), &st) == 0;
    if (have_st && S_ISDIR(st.st_mode)) {
        fclose(f);
        return adt_error(ADT_ERR_IO, "%s: is a directory, expected %s", path, what);
    }
    /* st_size is a hint only: read to EOF, so pipes and growing files work too */
    size_t cap = have_st && S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 1 << 16, n = 0;
    char *buf = adt_malloc(cap);
    int bad = 0;
    for (;;) {
        if (n + 1 >= cap) buf = adt_realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (n > max) {
            bad = 2;
            break;
        }
        if (got == 0) break;
    }
    if (!bad && ferror(f)) bad = 1;
    fclose(f);
    if (bad) {
        free(buf);
        if (bad == 2) return adt_error(ADT_ERR_FORMAT, "%s: larger than %zu bytes, expected %s", path, max, what);
        return adt_error(ADT_ERR_IO, "%s: read failed", path);
    }
    buf[n] = 0;
    *out = buf;
    *n_out = n;
    return ADT_OK;
}

int adt_file_write_atomic(const char *path, const void *data, size_t n) {
    size_t len = strlen(path) + 5;
    char *tmp = adt_malloc(len);
    snprintf(tmp, len, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int rc = adt_error(ADT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int bad = n && fwrite(data, 1, n, f) != n;
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    int rc = ADT_OK;
    if (bad || rename(tmp, path)) {
        rc = adt_error(ADT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}
