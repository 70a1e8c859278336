/*
 * adtrain/models.h - model builders: each appends a whole model (forward and loss) to a graph,
 * with parameter names and shapes that match PyTorch's, and layer tags on repeated blocks.
 */
#ifndef ADTRAIN_MODELS_H
#define ADTRAIN_MODELS_H

#include "adtrain/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a builder hands back: the fed values and the outputs. */
typedef struct adt_model_io {
    int input;  /* ids [B,T] i32 (gpt), x [B,in] f32 (mlp), ...          */
    int input2; /* a second input where the model has one, else -1      */
    int label;  /* targets                                              */
    int logits; /* the pre-loss output                                  */
    int loss;   /* scalar mean loss                                     */
} adt_model_io;

/* GPT-2: learned positions, pre-LayerNorm (eps 1e-5), GELU (tanh), biases everywhere, LM head
 * tied to wte, final LayerNorm; Hugging Face GPT-2 parameter names (wte.weight, wpe.weight,
 * h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight, ...). c_attn is held as weight [C,3,C] and bias
 * [3,C] (q | k | v on an axis of their own, so heads can be split) with file shapes [C,3C] and
 * [3C], Hugging Face's; every other parameter has Hugging Face's shape. GPT-2 initialisation:
 * N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. */
typedef struct adt_gpt_cfg {
    int vocab_size, n_ctx, n_layer, n_embd, n_head;
    float dropout; /* 0 = none */
} adt_gpt_cfg;
int adt_model_gpt(adt_graph *g, const adt_gpt_cfg *c, int batch, adt_model_io *io);

/* Multi-layer perceptron: layers.{i}.weight [out,in], layers.{i}.bias [out] (nn.Linear names
 * and default initialisation), an activation between layers, softmax cross-entropy. */
typedef enum adt_activation { ADT_ACT_RELU = 0, ADT_ACT_GELU, ADT_ACT_SIGMOID } adt_activation;
#define ADT_MLP_MAX_LAYERS 32
typedef struct adt_mlp_cfg {
    int n_sizes;
    int sizes[ADT_MLP_MAX_LAYERS + 1];
    adt_activation activation;
} adt_mlp_cfg;
int adt_model_mlp(adt_graph *g, const adt_mlp_cfg *c, int batch, adt_model_io *io);

/* VGG-style CNN (Simonyan & Zisserman): blocks of 3x3 convolutions (padding 1, stride 1), each
 * followed by ReLU, every block closed by a 2x2 max-pool of stride 2 (flooring odd sizes); then
 * flatten and fully connected layers with ReLU between, the last giving `classes` logits;
 * softmax cross-entropy. nn.Conv2d / nn.Linear names, layouts and default initialisation:
 * conv{i}.weight [Co,Ci,3,3], conv{i}.bias [Co] over all convolutions from 0, fc{j}.weight
 * [out,in], fc{j}.bias [out]; weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
 * Fed: x f32 [B,C,H,W] (io.input), labels i32 [B] (io.label); io.logits [B,classes]. */
#define ADT_VGG_MAX_BLOCKS 16
#define ADT_VGG_MAX_CONVS 16 /* per block */
#define ADT_VGG_MAX_FC 16    /* hidden fully connected layers */
typedef struct adt_vgg_cfg {
    int in_channels, height, width;
    int n_blocks;
    int n_convs[ADT_VGG_MAX_BLOCKS];                       /* convolutions in block b       */
    int channels[ADT_VGG_MAX_BLOCKS][ADT_VGG_MAX_CONVS];  /* output channels of each       */
    int n_fc;
    int fc[ADT_VGG_MAX_FC]; /* hidden widths; the classifier fc{n_fc} follows them     */
    int classes;
} adt_vgg_cfg;
int adt_model_vgg(adt_graph *g, const adt_vgg_cfg *c, int batch, adt_model_io *io);

/* DLRM (Naumov et al., facebookresearch/dlrm): a bottom MLP on the dense features with ReLU
 * after every layer (its last width is emb_dim), one embedding table per categorical feature,
 * the pairwise dot interaction of the F = 1 + tables vectors of width emb_dim (bottom output
 * first, then the tables in order; the strict lower triangle, F(F-1)/2 values) concatenated
 * after the bottom output, then the top MLP with ReLU between layers and one output logit;
 * binary cross-entropy with logits (the sigmoid of DLRM's last layer lives in the loss).
 * Names: emb.{t}.weight [rows_t, D] initialised U(-sqrt(1/rows_t), sqrt(1/rows_t)) as DLRM
 * does; bot.{i}.weight/bias and top.{i}.weight/bias with nn.Linear shapes and initialisation.
 * Fed: dense f32 [B,n_dense] (io.input), ids i32 [B,tables] (io.input2; column t is a row of
 * table t, in [0, rows_t)), labels f32 [B] of 0/1 (io.label); io.logits [B]. */
#define ADT_DLRM_MAX_TABLES 256
#define ADT_DLRM_MAX_LAYERS 16
typedef struct adt_dlrm_cfg {
    int n_dense;
    int n_tables;
    int table_rows[ADT_DLRM_MAX_TABLES];
    int emb_dim;
    int n_bottom, bottom[ADT_DLRM_MAX_LAYERS]; /* widths; bottom[n_bottom-1] == emb_dim */
    int n_top, top[ADT_DLRM_MAX_LAYERS];       /* widths; top[n_top-1] == 1            */
} adt_dlrm_cfg;
int adt_model_dlrm(adt_graph *g, const adt_dlrm_cfg *c, int batch, adt_model_io *io);
/* The same DLRM with its embedding tables held elsewhere (the parameter-server mode's workers):
 * no tables and no ids input; the rows looked up for table t are parameter "ps.rows.<t>"
 * [batch, emb_dim] (rows[t] gets its id), which the caller writes before each step and whose
 * gradient is d(loss)/d(rows). Every other value, name and initialisation as adt_model_dlrm. */
int adt_model_dlrm_ps(adt_graph *g, const adt_dlrm_cfg *c, int batch, adt_model_io *io, int *rows);

/* A linear layer y = x W^T + b with nn.Linear's names "<prefix>.weight" [out,in] and
 * "<prefix>.bias" [out] and its default init U(-1/sqrt(in), 1/sqrt(in)). */
int adt_layer_linear(adt_graph *g, int x, const char *prefix, int in, int out);


/* =============================================================================================
 * Model configs from JSON (src/models/config.c; the VGG and DLRM fields in vgg.c and dlrm.c)
 *
 *   {"type":"gpt","vocab_size":V,"n_ctx":T,"n_layer":L,"n_embd":C,"n_head":H[,"dropout":p]}
 *   {"type":"mlp","sizes":[784,1024,1024,10],"activation":"relu"|"gelu"|"sigmoid"}
 *   {"type":"vgg","in_channels":1,"height":28,"width":28,"blocks":[[16],[32]],"fc":[128],
 *    "classes":10}
 *   {"type":"dlrm","n_dense":13,"table_rows":[r0,...,r25] | R with "n_tables":26,"emb_dim":16,
 *    "bottom":[512,256,64,16],"top":[512,256,1]}
 *
 * Parsing is strict: a missing field, a value of the wrong JSON type or out of range, and an
 * unknown field (a typo would otherwise silently fall back to a default) are each an error whose
 * message names the file, the field and what was expected.
 */
typedef enum adt_model_type { ADT_MODEL_GPT = 0, ADT_MODEL_MLP, ADT_MODEL_VGG, ADT_MODEL_DLRM } adt_model_type;

typedef struct adt_model_cfg {
    adt_model_type type;
    adt_gpt_cfg gpt;   /* when type == ADT_MODEL_GPT  */
    adt_mlp_cfg mlp;   /* when type == ADT_MODEL_MLP  */
    adt_vgg_cfg vgg;   /* when type == ADT_MODEL_VGG  */
    adt_dlrm_cfg dlrm; /* when type == ADT_MODEL_DLRM */
} adt_model_cfg;

/* "gpt", "mlp", "vgg", "dlrm" */
const char *adt_model_type_name(adt_model_type t);
/* The built-in default: configs/gpt-tiny.json (vocab 65, n_ctx 64, 2 layers, width 64, 4 heads). */
void adt_model_cfg_default(adt_model_cfg *c);
/* Parses a config from JSON text; name_for_errors (usually the file name) starts every message. */
int adt_model_cfg_parse(adt_model_cfg *c, const char *json_text, const char *name_for_errors);
/* Reads and parses a config file. */
int adt_model_cfg_load(adt_model_cfg *c, const char *path);
/* Checks the ranges of a config built or changed in code (parse runs the same checks). */
int adt_model_cfg_validate(const adt_model_cfg *c, const char *name_for_errors);
/* The config as JSON text that adt_model_cfg_parse reads back to the same config; free() it. */
char *adt_model_cfg_to_json(const adt_model_cfg *c);
/* The number of trained parameters of a valid config, in closed form (no graph is built);
 * -1 if the config does not validate. */
int64_t adt_model_cfg_param_count(const adt_model_cfg *c);
/* Appends the model (forward and loss) to g; on failure the message is in adt_error_message(). */
int adt_model_build(adt_graph *g, const adt_model_cfg *c, int batch, adt_model_io *io);

#ifdef __cplusplus
}
#endif
#endif
