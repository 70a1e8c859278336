/*
 * adtrain/data.h - datasets and the order in which a run visits their samples.
 *
 * Character-level text (the nanoGPT convention): every byte is a token, the vocabulary is the
 * sorted set of distinct bytes of the training file, and sample i is the window of T+1 tokens
 * starting at i*T: inputs are its first T tokens, targets the last T (shifted by one). Windows do
 * not overlap, so a text of n tokens has (n-1)/T samples.
 *
 * Sample order: an epoch is a permutation of the sample ids (or the identity without shuffling)
 * that depends on the seed and the epoch number only - never on the number of processes - so a
 * sharded or elastic run trains on exactly the samples a serial run would.
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
