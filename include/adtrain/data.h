/*
 * adtrain/data.h - datasets and the order in which a run visits their samples.
 *
 * A dataset is a numbered set of samples, 0 .. n-1, and a way to write any of them into the
 * buffers a model is fed. Every sample is a pure function of the dataset and its id (a file's
 * bytes, or a synthetic generator's seed, stream and id), so any process can fill any batch: a
 * sharded or elastic run sees exactly the samples a serial run would.
 *
 * Character-level text (the nanoGPT convention): every byte is a token, the vocabulary is the
 * sorted set of distinct bytes of the training file, and sample i is the window of T+1 tokens
 * starting at i*T: inputs are its first T tokens, targets the last T (shifted by one). Windows do
 * not overlap, so a text of n tokens has (n-1)/T samples. Pre-tokenised files use the same windows.
 *
 * Sample order: an epoch is a permutation of the sample ids (or the identity without shuffling)
 * that depends on the seed and the epoch number only - never on the number of processes.
 *
 * File formats (token files, MNIST IDX, Criteo TSV/CSV) and the synthetic generators are
 * specified in docs/formats.md.
 */
#ifndef ADTRAIN_DATA_H
#define ADTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- vocabulary of a byte-level text ------------------------------------------------------ */
typedef struct adt_text_vocab {
    int size;          /* distinct bytes, 1..256                             */
    uint8_t byte[256]; /* token id -> byte, ascending                        */
    int16_t id[256];   /* byte -> token id, -1 if not in the vocabulary      */
} adt_text_vocab;

/* The sorted set of distinct bytes of data[0..n); n == 0 gives an empty vocabulary. */
void adt_text_vocab_from_bytes(adt_text_vocab *v, const void *data, size_t n);

/* ---- text datasets ------------------------------------------------------------------------ */
typedef struct adt_text_dataset adt_text_dataset;

/* Reads a whole text file. vocab == NULL: the vocabulary is the file's own byte set (training
 * data); otherwise every byte must be in `vocab` (validation data), else the error names the file,
 * the byte and its offset. An empty or missing file is an error. */
int adt_text_dataset_open(adt_text_dataset **out, const char *path, const adt_text_vocab *vocab);
/* The same from memory (copied); `name` stands in for the file name in messages. */
int adt_text_dataset_from_bytes(adt_text_dataset **out, const void *data, size_t n, const adt_text_vocab *vocab,
                                const char *name);
/* "synthetic:text": n_tokens bytes of a fixed, learnable pseudo-language (sentences of
 * pseudo-words drawn by a word-level Markov chain) over the 65-symbol Tiny Shakespeare alphabet,
 * which is also its vocabulary. The lexicon is the same for every stream; `stream` selects an
 * independent text (e.g. 0 for training, 1 for validation). */
int adt_text_dataset_synthetic(adt_text_dataset **out, int64_t n_tokens, uint64_t stream);
void adt_text_dataset_free(adt_text_dataset *ds);

const char *adt_text_dataset_name(const adt_text_dataset *ds);
const adt_text_vocab *adt_text_dataset_vocab(const adt_text_dataset *ds);
int64_t adt_text_dataset_tokens(const adt_text_dataset *ds);
/* (tokens - 1) / T, 0 when the text is shorter than one window. */
int64_t adt_text_dataset_samples(const adt_text_dataset *ds, int T);
/* ADT_OK if the text holds at least one window of T+1 tokens, else an error naming the file. */
int adt_text_dataset_check_window(const adt_text_dataset *ds, int T);
/* Writes n samples: ids[k*T + t] = token (sample_ids[k]*T + t), targets the same shifted by one. */
int adt_text_dataset_fill(const adt_text_dataset *ds, const int64_t *sample_ids, int n, int T, int32_t *ids,
                          int32_t *targets);

/* ---- any dataset -------------------------------------------------------------------------- */
#define ADT_DATA_MAX_TABLES 256

/* What the model needs from a sample; the caller fills it from the model config. A field left 0
 * is not checked where the data defines it (e.g. in_features of MNIST is 784 either way); a
 * generator or a hash that needs a value (synthetic:mlp's in_features, every table_rows of
 * criteo) refuses 0 with an error naming the field. */
typedef struct adt_data_shape {
    int n_ctx;                    /* text/tokens: window T (required)                           */
    int vocab_size;               /* text/tokens: every token id must be < vocab_size           */
    int in_features;              /* mlp: features per sample                                   */
    int channels, height, width;  /* vgg: image layout C,H,W (in_features = C*H*W when both set) */
    int classes;                  /* mlp/vgg/mnist: labels lie in [0, classes)                  */
    int n_dense, n_tables;        /* dlrm: 13 dense and 26 categorical features for Criteo      */
    int64_t table_rows[ADT_DATA_MAX_TABLES]; /* dlrm: rows of embedding table t; categorical
                                                values are hashed into [0, table_rows[t])  */
} adt_data_shape;

/* Which buffers adt_dataset_fill writes, per sample:
 *   SEQ:   input i32 [T] token ids,            label i32 [T] the next tokens
 *   CLASS: input f32 [in_features] (= [C,H,W]), label i32 [1] the class
 *   CTR:   input f32 [n_dense], input2 i32 [n_tables] (row of table t), label f32 [1] 0 or 1 */
typedef enum adt_data_layout { ADT_DATA_SEQ = 0, ADT_DATA_CLASS, ADT_DATA_CTR } adt_data_layout;

/* Synthetic dataset sizes (training stream, validation stream). */
#define ADT_SYN_TEXT_TOKENS (1 << 20)
#define ADT_SYN_TEXT_VAL_TOKENS (1 << 17)
#define ADT_SYN_MLP_SAMPLES 60000
#define ADT_SYN_MLP_VAL_SAMPLES 10000
#define ADT_SYN_VGG_SAMPLES 50000
#define ADT_SYN_VGG_VAL_SAMPLES 10000
#define ADT_SYN_DLRM_SAMPLES (1 << 20)
#define ADT_SYN_DLRM_VAL_SAMPLES (1 << 16)

typedef struct adt_dataset adt_dataset;

/* spec = "KIND:PATH[@START:END]":
 *   text:FILE        bytes are tokens (above)
 *   tokens:FILE      pre-tokenised ids, 2 or 4 bytes each, with a 32-byte header
 *   mnist:PREFIX     PREFIX-images-idx3-ubyte[.gz] and PREFIX-labels-idx1-ubyte[.gz]
 *   criteo:FILE      the Kaggle display-advertising TSV (or the same columns as CSV with a header)
 *   synthetic:text | synthetic:mlp | synthetic:vgg | synthetic:dlrm   (no path)
 *   synthetic:criteo-zipf[,alpha=A][,signal=S][,samples=N]   Zipf ids over the model's tables
 * "@START:END" keeps sample ids [START, END) of the dataset, renumbered from 0; either bound may
 * be omitted ("@:5000", "@8000:"); a range outside the dataset or an empty one is an error.
 * vocab: for a validation text file, the training vocabulary (every byte must be in it); NULL
 * otherwise. is_val selects the validation stream of the synthetic kinds (independent samples
 * under the same planted model); file kinds ignore it. The shape must fit the data, else the
 * error names the spec and what was expected (shape NULL: all fields 0). */
int adt_dataset_open(adt_dataset **out, const char *spec, const adt_data_shape *shape, const adt_text_vocab *vocab,
                     int is_val);
/* The same from memory (copied), for tests and fuzzing: kind is "text", "tokens", "criteo" or
 * "mnist" (data = the images file, data2 = the labels file, either may be gzip); `name` stands in
 * for the file name in messages. No range selection. */
int adt_dataset_open_memory(adt_dataset **out, const char *kind, const char *name, const void *data, size_t n,
                            const void *data2, size_t n2, const adt_data_shape *shape,
                            const adt_text_vocab *vocab);
void adt_dataset_free(adt_dataset *ds);

int64_t adt_dataset_samples(const adt_dataset *ds); /* after @START:END */
adt_data_layout adt_dataset_layout(const adt_dataset *ds);
/* "text", "tokens", "mnist", "criteo", "synthetic:text", "synthetic:mlp", ... */
const char *adt_dataset_kind_name(const adt_dataset *ds);
/* One line for a banner: the spec, what the samples are, and the selected range. */
const char *adt_dataset_describe(const adt_dataset *ds);
/* The byte vocabulary of text and synthetic:text, else NULL. */
const adt_text_vocab *adt_dataset_vocab(const adt_dataset *ds);
/* Token ids are < this: the text vocabulary's size, or a token file's declared vocab_size; 0 for
 * kinds without tokens. */
int adt_dataset_vocab_size(const adt_dataset *ds);

/* Elements per sample in buffer `which`: 0 input, 1 input2, 2 label (0 for an unused buffer);
 * e.g. 784, 0, 1 for MNIST. A fill of n samples writes n times as many. */
int64_t adt_dataset_sample_elems(const adt_dataset *ds, int which);
/* Writes samples ids[0..n) (relative to the selected range) into the buffers adt_dataset_layout
 * names; input2 is used by CTR only (pass NULL otherwise). An id outside [0, samples) is an
 * error. Safe to call from several threads at once. */
int adt_dataset_fill(const adt_dataset *ds, const int64_t *ids, int n, void *input, void *input2, void *label);
/* synthetic:dlrm and synthetic:criteo-zipf only: the planted click probability of each sample,
 * i.e. the Bayes-optimal score (its AUC is the best any model can reach); ADT_ERR_UNSUPPORTED
 * for other kinds. */
int adt_dataset_planted_prob(const adt_dataset *ds, const int64_t *ids, int n, float *prob);
/* How data `spec` draws the ids of categorical field `table`, for pricing (the planner's
 * parameter-server estimate): ADT_IDS_ZIPF (row k-1 with weight k^-param; synthetic:criteo-zipf),
 * ADT_IDS_SQUARE (a value floor(param u^2), u uniform, hashed to a row; synthetic:dlrm), or
 * ADT_IDS_UNKNOWN (a file's ids: no law is known). A bad spec's options are an error. */
enum { ADT_IDS_UNKNOWN, ADT_IDS_ZIPF, ADT_IDS_SQUARE };
int adt_data_id_law(const char *spec, int table, int *kind, double *param);

/* ---- evaluation --------------------------------------------------------------------------- */
/* ROC AUC of scores[0..n) against labels in {0, 1}: the probability that a random positive
 * scores above a random negative, ties counting one half (the Mann-Whitney U statistic from
 * average ranks). An error if n < 1, a label is not 0 or 1, a score is NaN, or either class is
 * absent (the AUC is undefined). */
int adt_auc(const float *scores, const float *labels, int64_t n, double *out);

/* ---- sample order ------------------------------------------------------------------------- */
/* perm[0..n) = the order of epoch `epoch`: a Fisher-Yates shuffle of 0..n-1 drawn with
 * adt_rng_u32 under a key made of the seed and the epoch. */
void adt_sample_permutation(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch);

/* Batches of B samples out of n, epoch after epoch. An epoch has n / B steps (a last partial
 * batch is dropped, like PyTorch's drop_last); step k (0-based over the run) is in epoch
 * e = k / (n/B) and uses positions j*B .. j*B+B-1 of that epoch's order, j = k mod (n/B). */
typedef struct adt_sampler {
    int64_t n;
    int batch;
    int shuffle;
    uint64_t seed;
    int64_t epoch; /* the epoch whose order `perm` holds, -1 before the first */
    int64_t *perm; /* [n] when shuffling */
} adt_sampler;

/* An error (naming the sample and batch counts) when n < batch. */
int adt_sampler_init(adt_sampler *s, int64_t n_samples, int batch, int shuffle, uint64_t seed);
void adt_sampler_free(adt_sampler *s);
int64_t adt_sampler_steps_per_epoch(const adt_sampler *s);
/* The B sample ids of run step k (0-based). */
void adt_sampler_batch(adt_sampler *s, int64_t step, int64_t *ids);

#ifdef __cplusplus
}
#endif
#endif
