/*
 * file.c - reading a whole (small) file: configs, manifests, text data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
