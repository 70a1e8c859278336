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

/* DIR/leaf of a distributed checkpoint (malloc'd), and the manifest's name for messages. */
char *ckpt_dckpt_path(const adt_dckpt *c, const char *leaf);
const char *ckpt_dckpt_name(const adt_dckpt *c);
/* A whole (small) file as bytes, at most max of them; *text is malloc'd and not NUL-terminated. */
int ckpt_read_text(const char *path, size_t max, char **text, size_t *len);

#endif
