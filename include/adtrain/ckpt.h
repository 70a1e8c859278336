/*
 * adtrain/ckpt.h - training checkpoints: a model's parameters (and optimizer state) in one
 * safetensors file that PyTorch reads as a state dict.
 *
 * Tensor names are the graph's value names, which the model builders make PyTorch's: a GPT
 * checkpoint holds "wte.weight", "h.0.attn.c_attn.weight", ... in Hugging Face's shapes, an MLP
 * "layers.0.weight" [out,in]. Shapes are the values' file shapes (adt_value_file_shape): where the
 * graph holds a tensor with its axes regrouped (GPT's c_attn.weight [C,3,C] and bias [3,C], so
 * that tensor parallelism can split heads), the file holds PyTorch's shape ([C,3C], [3C]) of the
 * same bytes; optimizer state follows its parameter. Optimizer state follows under "opt.m.<param>" (SGD momentum, AdamW
 * first moment) and "opt.v.<param>" (AdamW second moment). Everything a run needs to continue
 * exactly where it stopped that is not a tensor (step, seed, batch, data, vocabulary) goes into
 * the file's string metadata, written and checked by the caller (the trainer).
 *
 * The code works on the graph and on a callback that maps a value to its storage, so it needs no
 * executor: a trainer passes adt_exec_data, a test its own buffers.
 *
 * Distributed checkpoints (adt_dckpt_*, below) hold the same tensors under the same names, cut
 * into slices: each rank of a partitioned run writes the blocks it holds to its own file, and a
 * manifest names every file and the box of every global tensor each one holds. Loading reads,
 * for each block a rank needs, the intersecting parts of whichever files hold them, so a
 * checkpoint saved under one plan and world size loads under any other (docs/formats.md,
 * "Distributed checkpoints").
 */
#ifndef ADTRAIN_CKPT_H
#define ADTRAIN_CKPT_H

#include <stdint.h>

#include "adtrain/dist.h"
#include "adtrain/graph.h"
#include "adtrain/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The storage of value `v` (a persistent value: parameter or optimizer state). */
typedef void *(*adt_ckpt_data_fn)(void *ctx, int v);

/* Where one process's share of a model lives. `g` is the global training graph (names, dtypes,
 * global shapes). With `local` NULL the whole of g runs here, and `data` maps g's value ids to
 * storage. Otherwise this process is the rank at `coord` of `mesh` running local->g (made by
 * adt_dist_partition from g and a plan on `mesh`), and `data` maps local->g's value ids: each
 * parameter and optimizer state is the block of the global tensor that the local value's
 * global_shape and offset say, held in layout local->layout[v]. */
typedef struct adt_ckpt_view {
    const adt_graph *g;
    const adt_dist_local *local;
    const adt_mesh *mesh;
    const int *coord;
    adt_ckpt_data_fn data;
    void *ctx;
    /* A pipeline stage (local_of not NULL; adt_ckpt_view_stage fills these three): `local`
     * partitions the stage's graph, whose value of g's value v is local_of[v] (-1 where the stage
     * holds none of v), `mesh` is the stage mesh with the world's ranks in mesh->ranks, `world`
     * the number of ranks of all stages, and elsewhere[v] is nonzero for a value an earlier stage
     * holds as well (a tied parameter and its optimizer state), which that stage writes. */
    const int *local_of;
    const char *elsewhere;
    int world;
} adt_ckpt_view;

/* Makes vw, which names g, local (st's graph partitioned for vw->coord), mesh (the stage mesh
 * with world ranks), coord, data and ctx, the view of pipeline stage st in a world of `world`
 * ranks; elsewhere[g->n_values] is the caller's storage, filled here, and must outlive the view.
 * The view writes the stage's blocks of what it holds (each tied parameter on the first stage
 * holding it) and loads every block it holds. */
void adt_ckpt_view_stage(adt_ckpt_view *vw, const adt_pipe_stage *st, int world, char *elsewhere);

/* Writes every PARAM of g (and, with_state, every OPT_STATE) as F32 under its own name, in the
 * graph's order, plus the metadata pairs meta[0..2*n_meta) = key, value, ...; atomically (a
 * crash mid-write leaves the previous file at `path` intact). */
int adt_ckpt_save(const char *path, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state,
                  const char *const *meta, int n_meta);

/* Loads every PARAM of g from f (and, with_state, every OPT_STATE), checking names and (file) shapes.
 * Accepted on top of the model's own names: a "transformer." prefix (Hugging Face's GPT2LMHeadModel
 * files), the attention-mask buffers "h.{i}.attn.bias" / "h.{i}.attn.masked_bias", a tied
 * "lm_head.weight", and - without with_state - optimizer state, all ignored. Anything else is an
 * error, as is a missing tensor or a shape that differs (the message names the file, the tensor,
 * and both shapes; for a whole other model, the first few names that do not match). On error
 * nothing is guaranteed about the values already copied. */
int adt_ckpt_load(const adt_st_file *f, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state);
/* The same into one rank's share: every block the view holds is cut from the file's whole
 * tensor (adt_ckpt_load is this with a view of g alone). Checks and messages as above. */
int adt_ckpt_load_local(const adt_st_file *f, const adt_ckpt_view *view, int with_state);

/* ---------------------------------------------------------------------------------------------
 * Distributed checkpoints: a directory
 *
 *   DIR/manifest.json                                  written last, by an atomic rename
 *   DIR/step<S>-rank<R>-of-<W>.safetensors             what rank R of W held at step S
 *
 * Saving, on every rank (any process), then on one:
 *
 *   char *part;
 *   adt_dckpt_write_rank(dir, step, &view, 1, &part);         every rank: its file
 *   ... gather the parts (short JSON strings) on one rank ...
 *   adt_dckpt_commit(dir, step, g, 1, parts, n, meta, n_meta); that rank: the manifest
 *
 * A block held by several ranks (a replicated parameter) is written once. Which rank writes it
 * is a pure function of the plan, so every rank decides alone: the blocks are taken in the
 * graph's value order, and each distinct block goes to whichever of its holders has been given
 * the fewest bytes so far, ties to the lowest rank (so replicas share the writing evenly).
 *
 * Until the manifest is renamed into place the directory holds no checkpoint (or the previous
 * one: files carry the step in their names). A manifest records each file's size and crc32c;
 * opening checks every size, and every file is checked against its crc32c when read, so a
 * missing, truncated or damaged file is refused with a message naming it.
 */
typedef struct adt_dckpt adt_dckpt;

/* Writes the blocks this rank is the writer of (see above) of every parameter (and with_state
 * every optimizer state) as F32 slices under their global names into
 * DIR/step<S>-rank<R>-of-<W>.safetensors, atomically, creating DIR (and its parents) if needed.
 * R is the rank at view->coord (adt_mesh_rank), W the mesh's size (a stage's view: its `world`);
 * a view without `local` is rank 0 of 1. *part receives (malloc'd; free()) this rank's part of the manifest: a short JSON
 * text naming the file, its size, crc32c and slices (or no file, when the rank writes nothing).
 * Errors name the file or the tensor. */
int adt_dckpt_write_rank(const char *dir, int64_t step, const adt_ckpt_view *view, int with_state, char **part);

/* Commits a checkpoint: the parts of all W ranks (any order), g and with_state (which tensors the
 * checkpoint must hold: the same as the ranks saved) and metadata pairs meta[0..2*n_meta) =
 * key, value, ... (the keys of adt_ckpt_save's files). Checks that the parts are one step of one
 * world, each rank once, that every named file is in DIR with its recorded size, and that the
 * slices cover every tensor exactly once; then writes DIR/manifest.json atomically, and removes
 * the files of earlier saves (steps up to this one) that the new manifest does not name. */
int adt_dckpt_commit(const char *dir, int64_t step, const adt_graph *g, int with_state, const char *const *parts,
                     int n_parts, const char *const *meta, int n_meta);

/* Both halves in one process, for a view that holds the whole model (no local, or a world of
 * one): write_rank then commit. */
int adt_dckpt_save(const char *dir, int64_t step, const adt_ckpt_view *view, int with_state, const char *const *meta,
                   int n_meta);

/* Opens DIR: reads and checks DIR/manifest.json (adt_dckpt_parse) and that every file it names
 * exists with its recorded size. A directory without a manifest is refused (ADT_ERR_IO, "no
 * committed checkpoint"). */
int adt_dckpt_open(adt_dckpt **out, const char *dir);
/* Parses a manifest from memory (n bytes, no NUL needed; `name` for messages). Nothing is read
 * from disk; `dir` (may be NULL) is where the files are looked for later. Checks the format,
 * every field, file names (plain names inside DIR), that each slice lies inside its tensor, and
 * that the slices of every tensor are disjoint and cover it: an error names the tensor and an
 * element no file holds, or the two files that overlap. */
int adt_dckpt_parse(adt_dckpt **out, const char *dir, const char *name, const char *text, size_t n);
void adt_dckpt_close(adt_dckpt *c);

/* ---- what a manifest says (read-only views; valid until adt_dckpt_close) ---- */
typedef struct adt_dckpt_tensor {
    const char *name;
    adt_st_dtype dtype;
    int ndim;
    int64_t shape[ADT_MAX_DIMS];
    /* the shape a one-file export writes (PyTorch's, where the graph regroups axes: GPT's
     * c_attn [C,3,C] exports as [C,3C]); same elements; file_ndim 0 when it is `shape` */
    int file_ndim;
    int64_t file_shape[ADT_MAX_DIMS];
} adt_dckpt_tensor;

typedef struct adt_dckpt_slice {
    int tensor; /* index into the manifest's tensors */
    int64_t offset[ADT_MAX_DIMS];
    int64_t shape[ADT_MAX_DIMS];
} adt_dckpt_slice;

typedef struct adt_dckpt_file {
    const char *name; /* a plain file name inside the directory */
    int rank;
    uint64_t bytes;
    uint32_t crc32c;
    int n_slices;
    const adt_dckpt_slice *slices;
} adt_dckpt_file;

int64_t adt_dckpt_step(const adt_dckpt *c);
int adt_dckpt_world(const adt_dckpt *c);
int adt_dckpt_tensor_count(const adt_dckpt *c);
const adt_dckpt_tensor *adt_dckpt_tensor_get(const adt_dckpt *c, int i); /* NULL if out of range */
int adt_dckpt_file_count(const adt_dckpt *c);
const adt_dckpt_file *adt_dckpt_file_get(const adt_dckpt *c, int i);
/* User metadata (the pairs given to commit): by key (NULL if absent), or the i-th pair. */
const char *adt_dckpt_metadata(const adt_dckpt *c, const char *key);
int adt_dckpt_metadata_count(const adt_dckpt *c);
int adt_dckpt_metadata_get(const adt_dckpt *c, int i, const char **key, const char **value);

/* Loads this rank's share: for every block the view holds of a parameter (and with_state an
 * optimizer state), the intersecting parts of the slices that cover it, from the files that hold
 * them (each checked against its crc32c as it is read; files with nothing for this rank are not
 * read). Names and shapes are checked as adt_ckpt_load does: a tensor of the model missing from
 * the checkpoint, one the model does not have, or a global shape or dtype that differs, is an
 * error naming the tensor. Each rank checks only the files it reads: a trainer should agree on
 * success across ranks before it goes on. */
int adt_dckpt_load(const adt_dckpt *c, const adt_ckpt_view *view, int with_state);
/* Reads every file and checks it against its size, crc32c and the slices the manifest says it
 * holds (names, dtypes, shapes). */
int adt_dckpt_verify(const adt_dckpt *c);
/* Writes the whole checkpoint as one safetensors file (adt_ckpt_save's layout: every tensor
 * whole, under its name, in the manifest's order, the metadata as "__metadata__"), readable by
 * PyTorch and by adt_ckpt_load; without with_state, optimizer state ("opt.*") is left out.
 * Holds the whole model in memory once. Every file is verified as it is read. */
int adt_dckpt_export(const adt_dckpt *c, const char *path, int with_state);


/* ---------------------------------------------------------------------------------------------
 * Flash checkpoints: a training state in shared memory (a file under /dev/shm), in two slots
 *
 * The training thread copies its state into a slot (adt_flash_begin ... adt_flash_end) and goes
 * on; the slot is published - its crc32c computed and its header written last - and handed to
 * a persist callback (which writes the checkpoint file and commits it) by a background thread.
 * A slot verifies only if it was written completely (a header crc and a payload crc32c), so a
 * writer killed mid-copy, a torn or damaged file never loads; the other slot keeps the previous
 * state. The file outlives the process: a restarted worker on the same host finds the states
 * there (adt_flash_find) and falls back to the checkpoint on disk when the one it needs is not.
 * Layout ids (e.g. adt_plan_graph_checksum of the training graph) keep a file of another model
 * from loading. One writer per file; readers in the same process.
 */
typedef struct adt_flash adt_flash;

typedef struct adt_flash_view {
    int slot;
    uint64_t seq;        /* publication number: higher is newer                       */
    int64_t generation;  /* as given to adt_flash_end                                  */
    int64_t step;
    uint64_t bytes;
    const void *data;    /* the payload, in the mapping (valid until the slot is reused) */
} adt_flash_view;

/* Called on the background thread with a published slot; returns ADT_OK or an error (kept for
 * adt_flash_wait). */
typedef int (*adt_flash_persist_fn)(void *ctx, int64_t generation, int64_t step, const void *data, uint64_t bytes);

/* Opens `path` (created if missing) with two slots of `capacity` bytes. A file of another
 * capacity or layout, a truncated file or one with a damaged header is reset (nothing in it
 * loads). Errors name the file. */
int adt_flash_open(adt_flash **out, const char *path, uint64_t capacity, uint64_t layout);
/* Stops the background thread after the queued work is done, unmaps; the file stays. */
void adt_flash_close(adt_flash *f);
int adt_flash_remove(const char *path);
uint64_t adt_flash_capacity(const adt_flash *f);
/* Starts the background thread: from now on adt_flash_end hands slots to it (publish, then
 * fn); without it, adt_flash_end publishes in the caller. */
int adt_flash_start(adt_flash *f, adt_flash_persist_fn fn, void *ctx);
/* The slot to fill (capacity bytes at the pointer returned): never the one the thread works on,
 * else never the newest published one. It no longer verifies from here until published. A job
 * queued for it and not started is dropped (this state supersedes it). */
void *adt_flash_begin(adt_flash *f, int *slot);
/* The slot holds `bytes` bytes of the state after `step`: publish it (now, or on the thread). */
int adt_flash_end(adt_flash *f, int slot, int64_t generation, int64_t step, uint64_t bytes);
/* Waits until the thread is idle; returns the first failure of fn since the last wait (with its
 * message), and the step fn last succeeded for (-1 if none). */
int adt_flash_wait(adt_flash *f, int64_t *persisted_step);
/* The slot that holds `step` (step < 0: the newest) and verifies completely; ADT_ERR_IO with
 * what each slot holds otherwise. */
int adt_flash_find(adt_flash *f, int64_t step, adt_flash_view *out);

#ifdef __cplusplus
}
#endif
#endif
