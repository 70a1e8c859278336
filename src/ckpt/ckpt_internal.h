/*
 * ckpt_internal.h - what the files of src/ckpt share and nothing outside it needs.
 */
#ifndef ADTRAIN_CKPT_INTERNAL_H
#define ADTRAIN_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/ckpt.h"
#include "adtrain/graph.h"

#define DCKPT_FORMAT "adtrain-dckpt-1"           /* the manifest's "format"       */
#define DCKPT_PART_FORMAT "adtrain-dckpt-part-1" /* a rank's part, before commit  */
#define DCKPT_MANIFEST "manifest.json"

/* Writes the n chunks back to back to "<path>.tmp", fsyncs it, renames it over `path` and
 * fsyncs the directory: a crash leaves the old file or the new one, never a mix. Reports the
 * size and the crc32c of all the bytes written (either pointer may be NULL). On failure `path`
 * is untouched and the temporary file removed. */
int ckpt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n, uint64_t *bytes,
                      uint32_t *crc32c);

/* Whether a checkpoint holds value v of a graph: parameters, and with_state optimizer state;
 * f32, owning their storage. */
int ckpt_is_saved(const adt_value *v, int with_state);
/* Optimizer state by its name: "opt.m.*", "opt.v.*". */
int ckpt_is_opt_state_name(const char *name);

/* Where the view's local arrays (local->value, local->layout) hold global value v: v itself, or
 * for a pipeline stage its stage graph's value (-1 where the stage holds none). */
int ckpt_view_index(const adt_ckpt_view *vw, int v);
/* The local value holding global value v in the view (-1 if this rank holds none of it), and the
 * block of v it holds. */
int ckpt_view_block(const adt_ckpt_view *vw, int v, adt_box *box);

/* Matches the tensor names of a checkpoint (`file` for messages) with the values of g that a
 * checkpoint holds: value_of[i] is the global value of names[i], or -1 for a name that is
 * ignored (optimizer state without with_state; the Hugging Face buffers and "transformer."
 * prefix when `lenient`). A missing value, or a name the model does not have, is an error naming
 * the tensors (both at once: a checkpoint of another model). */
int ckpt_match_names(const char *file, const char *const *names, int n, const adt_graph *g, int with_state,
                     int lenient, int *value_of);

/* Metadata: string pairs in insertion order. */
typedef struct ckpt_meta {
    int n, cap;
    char **keys, **vals;
} ckpt_meta;
/* Adds a pair (copies), even when the key is there already (a reader keeps what it read). */
void ckpt_meta_append(ckpt_meta *m, const char *key, const char *value);
/* Replaces the value of key, or adds the pair (a writer). */
void ckpt_meta_set(ckpt_meta *m, const char *key, const char *value);
/* The first value of key, or NULL. */
const char *ckpt_meta_find(const ckpt_meta *m, const char *key);
void ckpt_meta_free(ckpt_meta *m);

/* DIR/leaf of a distributed checkpoint (malloc'd), and the manifest's name for messages. */
char *ckpt_dckpt_path(const adt_dckpt *c, const char *leaf);
const char *ckpt_dckpt_name(const adt_dckpt *c);

#endif
