/*
 * text.c - character-level text datasets (files, memory, and the learnable synthetic text).
 *
 * Tokens are stored one byte each (a vocabulary never exceeds 256 symbols) and widened to int32
 * only when a batch is filled, so a large corpus costs its own size in memory.
 */
#include "adtrain/data.h"

#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

struct adt_text_dataset {
    char *name;
    adt_text_vocab vocab;
    uint8_t *tok; /* token ids */
    int64_t n;
};

/* ---- vocabulary --------------------------------------------------------------------------- */

void adt_text_vocab_from_bytes(adt_text_vocab *v, const void *data, size_t n) {
    int seen[256] = {0};
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) seen[p[i]] = 1;
    memset(v, 0, sizeof *v);
    for (int b = 0; b < 256; b++) {
        v->id[b] = -1;
        if (seen[b]) {
            v->id[b] = (int16_t)v->size;
            v->byte[v->size++] = (uint8_t)b;
        }
    }
}

/* ---- datasets ----------------------------------------------------------------------------- */

/* A byte as a person reads it in a message: 'a', '\n', or nothing for non-printables. */
static void byte_repr(char *buf, size_t n, uint8_t b) {
    if (b == '\n') snprintf(buf, n, " ('\\n')");
    else if (b == '\t') snprintf(buf, n, " ('\\t')");
    else if (b >= 32 && b < 127) snprintf(buf, n, " ('%c')", b);
    else buf[0] = 0;
}

/* Maps bytes to token ids in place; the first byte outside the vocabulary is an error. */
static int map_bytes(uint8_t *p, int64_t n, const adt_text_vocab *v, const char *name) {
    for (int64_t i = 0; i < n; i++) {
        int id = v->id[p[i]];
        if (id < 0) {
            char repr[16];
            byte_repr(repr, sizeof repr, p[i]);
            return adt_error(ADT_ERR_FORMAT,
                             "%s: byte 0x%02x%s at offset %lld is not in the training vocabulary (%d symbols); "
                             "expected text made of the training file's characters",
                             name, p[i], repr, (long long)i, v->size);
        }
        p[i] = (uint8_t)id;
    }
    return ADT_OK;
}

/* Takes ownership of `bytes` (n of them) and turns them into tokens. */
static int dataset_adopt(adt_text_dataset **out, uint8_t *bytes, int64_t n, const adt_text_vocab *vocab,
                         const char *name) {
    *out = NULL;
    if (n <= 0) {
        free(bytes);
        return adt_error(ADT_ERR_FORMAT, "%s: empty, expected text with at least one window of tokens", name);
    }
    adt_text_dataset *ds = adt_calloc(1, sizeof *ds);
    ds->name = adt_strdup(name);
    if (vocab) ds->vocab = *vocab;
    else adt_text_vocab_from_bytes(&ds->vocab, bytes, (size_t)n);
    ds->tok = bytes;
    ds->n = n;
    int rc = map_bytes(ds->tok, n, &ds->vocab, name);
    if (rc) {
        adt_text_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return ADT_OK;
}

int adt_text_dataset_from_bytes(adt_text_dataset **out, const void *data, size_t n, const adt_text_vocab *vocab,
                                const char *name) {
    uint8_t *copy = adt_malloc(n);
    if (n) memcpy(copy, data, n);
    return dataset_adopt(out, copy, (int64_t)n, vocab, name ? name : "text");
}

int adt_text_dataset_open(adt_text_dataset **out, const char *path, const adt_text_vocab *vocab) {
    *out = NULL;
    char *bytes;
    size_t n;
    int rc = adt_file_read(path, SIZE_MAX - 1, "text data", &bytes, &n);
    if (rc) return rc;
    return dataset_adopt(out, (uint8_t *)bytes, (int64_t)n, vocab, path);
}

void adt_text_dataset_free(adt_text_dataset *ds) {
    if (!ds) return;
    free(ds->name);
    free(ds->tok);
    free(ds);
}

const char *adt_text_dataset_name(const adt_text_dataset *ds) { return ds->name; }
const adt_text_vocab *adt_text_dataset_vocab(const adt_text_dataset *ds) { return &ds->vocab; }
int64_t adt_text_dataset_tokens(const adt_text_dataset *ds) { return ds->n; }

int64_t adt_text_dataset_samples(const adt_text_dataset *ds, int T) { return data_windows(ds->n, T); }

int adt_text_dataset_check_window(const adt_text_dataset *ds, int T) {
    if (T < 1) return adt_error(ADT_ERR_ARG, "%s: window length %d, expected >= 1", ds->name, T);
    if (adt_text_dataset_samples(ds, T) < 1)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: %lld tokens, shorter than one window: expected at least %lld (n_ctx %d + 1 for the "
                         "shifted targets)",
                         ds->name, (long long)ds->n, (long long)T + 1, T);
    return ADT_OK;
}

int adt_text_dataset_fill(const adt_text_dataset *ds, const int64_t *sample_ids, int n, int T, int32_t *ids,
                          int32_t *targets) {
    int64_t ns = adt_text_dataset_samples(ds, T);
    for (int k = 0; k < n; k++) {
        int64_t s = sample_ids[k];
        if (s < 0 || s >= ns)
            return adt_error(ADT_ERR_ARG, "%s: sample %lld out of range, expected 0 <= id < %lld (windows of %d)",
                             ds->name, (long long)s, (long long)ns, T);
        const uint8_t *w = ds->tok + s * T;
        for (int t = 0; t < T; t++) {
            ids[(int64_t)k * T + t] = w[t];
            targets[(int64_t)k * T + t] = w[t + 1];
        }
    }
    return ADT_OK;
}

/* ---- synthetic text ----------------------------------------------------------------------- */

/* Tiny Shakespeare's 65 symbols, sorted: configs written for it fit the synthetic text too. */
static const char syn_alphabet[] = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

#define SYN_WORDS 48
#define SYN_WORD_LEN 12
#define SYN_NEXT 4

/* A fixed lexicon of pronounceable pseudo-words and, per word, a few likely successors: the text
 * is predictable inside a word and fairly predictable across words, so its entropy is low and
 * a small model's loss falls quickly. */
typedef struct syn_lexicon {
    char word[SYN_WORDS][SYN_WORD_LEN];
    int next[SYN_WORDS][SYN_NEXT];
} syn_lexicon;

typedef struct syn_rng {
    uint64_t key, ctr;
} syn_rng;

static uint32_t syn_draw(syn_rng *r, uint32_t n) { return (uint32_t)(((uint64_t)adt_rng_u32(r->key, r->ctr++) * n) >> 32); }
static float syn_unif(syn_rng *r) { return adt_rng_uniform(r->key, r->ctr++); }

static void syn_make_lexicon(syn_lexicon *lx) {
    static const char cons[] = "bcdfghklmnprstvw", vow[] = "aeiou";
    syn_rng r = {adt_rng_key(0x5eed, "synthetic.text.lexicon"), 0};
    for (int w = 0; w < SYN_WORDS; w++) {
        int syllables = 1 + (int)syn_draw(&r, 3), k = 0;
        for (int s = 0; s < syllables; s++) {
            lx->word[w][k++] = cons[syn_draw(&r, sizeof cons - 1)];
            lx->word[w][k++] = vow[syn_draw(&r, sizeof vow - 1)];
            if (syn_draw(&r, 3) == 0) lx->word[w][k++] = cons[syn_draw(&r, sizeof cons - 1)];
        }
        lx->word[w][k] = 0;
        for (int j = 0; j < SYN_NEXT; j++) lx->next[w][j] = (int)syn_draw(&r, SYN_WORDS);
    }
}

/* Successor j of a word with probabilities 0.55, 0.25, 0.15, 0.05. */
static int syn_next_word(syn_rng *r, const syn_lexicon *lx, int w) {
    float u = syn_unif(r);
    int j = u < 0.55f ? 0 : u < 0.80f ? 1 : u < 0.95f ? 2 : 3;
    return lx->next[w][j];
}

typedef struct syn_out {
    uint8_t *buf;
    int64_t n, cap;
} syn_out;

static void syn_put(syn_out *o, char c) {
    if (o->n < o->cap) o->buf[o->n++] = (uint8_t)c;
}

/* One sentence: 3 to 8 words, capitalised, an occasional comma, closed by . ? or ! */
static int syn_sentence(syn_rng *r, const syn_lexicon *lx, int w, syn_out *o) {
    int len = 3 + (int)syn_draw(r, 6);
    for (int i = 0; i < len; i++) {
        for (const char *c = lx->word[w]; *c; c++) syn_put(o, i == 0 && c == lx->word[w] ? (char)(*c - 'a' + 'A') : *c);
        if (i + 1 < len) {
            if (syn_draw(r, 10) == 0) syn_put(o, ',');
            syn_put(o, ' ');
        }
        w = syn_next_word(r, lx, w);
    }
    uint32_t end = syn_draw(r, 20);
    syn_put(o, end < 14 ? '.' : end < 17 ? '?' : '!');
    syn_put(o, syn_draw(r, 4) == 0 ? '\n' : ' ');
    return w;
}

int adt_text_dataset_synthetic(adt_text_dataset **out, int64_t n_tokens, uint64_t stream) {
    *out = NULL;
    if (n_tokens < 2) return adt_error(ADT_ERR_ARG, "synthetic:text: %lld tokens, expected >= 2", (long long)n_tokens);
    syn_lexicon lx;
    syn_make_lexicon(&lx);
    syn_rng r = {adt_rng_key(stream, "synthetic.text.stream"), 0};
    syn_out o = {adt_malloc((size_t)n_tokens), 0, n_tokens};
    int w = (int)syn_draw(&r, SYN_WORDS);
    while (o.n < o.cap) w = syn_sentence(&r, &lx, w, &o);
    adt_text_vocab v;
    adt_text_vocab_from_bytes(&v, syn_alphabet, sizeof syn_alphabet - 1);
    char name[64];
    snprintf(name, sizeof name, "synthetic:text (stream %llu)", (unsigned long long)stream);
    return dataset_adopt(out, o.buf, o.n, &v, name);
}
