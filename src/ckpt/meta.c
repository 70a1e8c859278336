/*
 * meta.c - the string key/value lists of checkpoint metadata (safetensors "__metadata__", a
 * distributed checkpoint's "metadata"), shared by the readers and the writer of src/ckpt.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "ckpt_internal.h"

void ckpt_meta_append(ckpt_meta *m, const char *key, const char *value) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 8;
        m->keys = adt_realloc(m->keys, (size_t)m->cap * sizeof *m->keys);
        m->vals = adt_realloc(m->vals, (size_t)m->cap * sizeof *m->vals);
    }
    m->keys[m->n] = adt_strdup(key);
    m->vals[m->n++] = adt_strdup(value);
}

void ckpt_meta_set(ckpt_meta *m, const char *key, const char *value) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->keys[i], key)) {
            free(m->vals[i]);
            m->vals[i] = adt_strdup(value);
            return;
        }
    ckpt_meta_append(m, key, value);
}

const char *ckpt_meta_find(const ckpt_meta *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->keys[i], key)) return m->vals[i];
    return NULL;
}

void ckpt_meta_free(ckpt_meta *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->keys[i]);
        free(m->vals[i]);
    }
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
