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
 */
#ifndef ADTRAIN_CKPT_H
#define ADTRAIN_CKPT_H

#include "adtrain/graph.h"
#include "adtrain/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The storage of value `v` (a persistent value: parameter or optimizer state). */
typedef void *(*adt_ckpt_data_fn)(void *ctx, int v);

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

#ifdef __cplusplus
}
#endif
#endif
