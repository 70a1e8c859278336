/*
 * test_data_text.c - the character-level text dataset (vocabulary, windows, shifted targets,
 * validation vocabulary, bad files), the seeded sample order and the synthetic text.
 */
#include "adtrain/base.h"
#include "adtrain/data.h"

#include "check.h"

#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>


static int write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(buf, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ==== text dataset ========================================================================== */

static void test_vocab_sorted_complete(void) {
    const char *text = "hello world\nzebra!";
    const char *path = check_tmp_path("vocab.txt");
    CHECK(write_bytes(path, text, strlen(text)) == 0, "write %s", path);
    adt_text_dataset *ds = NULL;
    CHECK(adt_text_dataset_open(&ds, path, NULL) == ADT_OK, "%s", adt_error_message());
    if (!ds) return;
    const adt_text_vocab *v = adt_text_dataset_vocab(ds);
    const char *expect = "\n !abdehlorwz"; /* sorted distinct bytes */
    CHECK(v->size == (int)strlen(expect), "vocab size %d", v->size);
    for (int i = 0; i < v->size && expect[i]; i++) CHECK(v->byte[i] == (uint8_t)expect[i], "byte[%d] = %d", i, v->byte[i]);
    for (int b = 0; b < 256; b++) {
        int present = strchr(text, b) != NULL && b != 0;
        CHECK((v->id[b] >= 0) == present, "byte %d present=%d id=%d", b, present, v->id[b]);
        if (v->id[b] >= 0) CHECK(v->byte[v->id[b]] == b, "round trip of byte %d", b);
    }
    CHECK(adt_text_dataset_tokens(ds) == (int64_t)strlen(text), "tokens %lld", (long long)adt_text_dataset_tokens(ds));
    adt_text_dataset_free(ds);
}

/* Windows of T+1 tokens at i*T, targets shifted by one, (n-1)/T samples. */
static void test_sample_windows(void) {
    enum { N = 1001, T = 8 };
    uint8_t text[N];
    for (int i = 0; i < N; i++) text[i] = (uint8_t)('a' + (i * 7 + i / 13) % 26);
    adt_text_dataset *ds = NULL;
    CHECK(adt_text_dataset_from_bytes(&ds, text, N, NULL, "mem") == ADT_OK, "%s", adt_error_message());
    if (!ds) return;
    const adt_text_vocab *v = adt_text_dataset_vocab(ds);
    int64_t ns = adt_text_dataset_samples(ds, T);
    CHECK(ns == (N - 1) / T, "samples %lld", (long long)ns);
    int64_t ids_in[3] = {0, 17, ns - 1};
    int32_t ids[3 * T], tg[3 * T];
    CHECK(adt_text_dataset_fill(ds, ids_in, 3, T, ids, tg) == ADT_OK, "%s", adt_error_message());
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < T; t++) {
            int64_t pos = ids_in[k] * T + t;
            CHECK(ids[k * T + t] == v->id[text[pos]], "sample %lld t %d input", (long long)ids_in[k], t);
            CHECK(tg[k * T + t] == v->id[text[pos + 1]], "sample %lld t %d target", (long long)ids_in[k], t);
            if (t + 1 < T) CHECK(tg[k * T + t] == ids[k * T + t + 1], "target is the next input");
        }
    /* the last window ends exactly on the last token */
    CHECK((ns - 1) * T + T == N - 1, "last target is the last token");
    int64_t bad = ns;
    CHECK(adt_text_dataset_fill(ds, &bad, 1, T, ids, tg) == ADT_ERR_ARG && contains(adt_error_message(), "out of range"),
          "%s", adt_error_message());
    adt_text_dataset_free(ds);

    /* n = k*T tokens: the k-th window would need one more token */
    CHECK(adt_text_dataset_from_bytes(&ds, text, 4 * T, NULL, "mem") == ADT_OK, "%s", adt_error_message());
    CHECK(adt_text_dataset_samples(ds, T) == 3, "%lld", (long long)adt_text_dataset_samples(ds, T));
    adt_text_dataset_free(ds);
    CHECK(adt_text_dataset_from_bytes(&ds, text, 4 * T + 1, NULL, "mem") == ADT_OK, "%s", adt_error_message());
    CHECK(adt_text_dataset_samples(ds, T) == 4, "%lld", (long long)adt_text_dataset_samples(ds, T));
    adt_text_dataset_free(ds);
}

static void test_val_vocabulary(void) {
    const char *train = "abcabc ab\n", *val_ok = "cab ba\n", *val_bad = "cab\nbaz!";
    const char *pt = check_tmp_path("train.txt"), *pv = check_tmp_path("val_ok.txt"), *pb = check_tmp_path("val_bad.txt");
    write_bytes(pt, train, strlen(train));
    write_bytes(pv, val_ok, strlen(val_ok));
    write_bytes(pb, val_bad, strlen(val_bad));
    adt_text_dataset *tr = NULL, *va = NULL;
    CHECK(adt_text_dataset_open(&tr, pt, NULL) == ADT_OK, "%s", adt_error_message());
    if (!tr) return;
    const adt_text_vocab *v = adt_text_dataset_vocab(tr);
    CHECK(adt_text_dataset_open(&va, pv, v) == ADT_OK, "%s", adt_error_message());
    if (va) {
        /* the validation set uses the training ids, not its own */
        CHECK(adt_text_dataset_vocab(va)->size == v->size, "val vocab is the training one");
        int64_t s0 = 0;
        int32_t ids[3], tg[3];
        adt_text_dataset_fill(va, &s0, 1, 3, ids, tg);
        CHECK(ids[0] == v->id['c'] && ids[1] == v->id['a'] && ids[2] == v->id['b'], "ids %d %d %d", ids[0], ids[1], ids[2]);
    }
    adt_text_dataset_free(va);
    va = NULL;
    int rc = adt_text_dataset_open(&va, pb, v);
    const char *m = adt_error_message();
    CHECK(rc == ADT_ERR_FORMAT && va == NULL, "rc %d", rc);
    CHECK(contains(m, pb) && contains(m, "0x7a") && contains(m, "'z'") && contains(m, "offset 6") &&
              contains(m, "vocabulary"),
          "%s", m);
    adt_text_dataset_free(tr);
}

static void test_bad_files(void) {
    adt_text_dataset *ds = NULL;
    const char *empty = check_tmp_path("empty.txt");
    write_bytes(empty, "", 0);
    int rc = adt_text_dataset_open(&ds, empty, NULL);
    CHECK(rc == ADT_ERR_FORMAT && !ds && contains(adt_error_message(), empty) && contains(adt_error_message(), "empty"),
          "%d %s", rc, adt_error_message());

    const char *missing = check_tmp_path("no-such-file.txt");
    rc = adt_text_dataset_open(&ds, missing, NULL);
    CHECK(rc == ADT_ERR_IO && !ds && contains(adt_error_message(), missing) &&
              contains(adt_error_message(), "No such file"),
          "%d %s", rc, adt_error_message());

    rc = adt_text_dataset_open(&ds, check_tmpdir(), NULL);
    CHECK(rc == ADT_ERR_IO && !ds && contains(adt_error_message(), "directory"), "%d %s", rc, adt_error_message());

    const char *shortf = check_tmp_path("short.txt");
    write_bytes(shortf, "to be", 5);
    CHECK(adt_text_dataset_open(&ds, shortf, NULL) == ADT_OK, "%s", adt_error_message());
    if (!ds) return;
    CHECK(adt_text_dataset_check_window(ds, 4) == ADT_OK, "5 tokens hold one window of 4+1");
    rc = adt_text_dataset_check_window(ds, 8);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), shortf) &&
              contains(adt_error_message(), "shorter than one window") && contains(adt_error_message(), "9"),
          "%d %s", rc, adt_error_message());
    CHECK(adt_text_dataset_samples(ds, 8) == 0, "no samples");
    adt_text_dataset_free(ds);
}

/* ==== sample order ========================================================================== */

static int is_permutation(const int64_t *p, int64_t n) {
    char *seen = calloc((size_t)n + 1, 1);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]]) ok = 0;
        else seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_permutation(void) {
    enum { N = 1000 };
    static int64_t a[N], b[N], c[N], d[N];
    adt_sample_permutation(a, N, 1337, 0);
    adt_sample_permutation(b, N, 1337, 0);
    adt_sample_permutation(c, N, 1337, 1);
    adt_sample_permutation(d, N, 1338, 0);
    CHECK(is_permutation(a, N) && is_permutation(c, N) && is_permutation(d, N), "permutations");
    CHECK(!memcmp(a, b, sizeof a), "same seed and epoch, same order");
    CHECK(memcmp(a, c, sizeof a), "another epoch, another order");
    CHECK(memcmp(a, d, sizeof a), "another seed, another order");
    int fixed = 0;
    for (int i = 0; i < N; i++) fixed += a[i] == i;
    CHECK(fixed < 20, "%d fixed points: not shuffled", fixed);
    /* a shorter permutation is not a prefix of a longer one's: n is part of the draw, which is
     * fine; but n = 0 and n = 1 must work */
    adt_sample_permutation(a, 1, 5, 3);
    CHECK(a[0] == 0, "n = 1");
    adt_sample_permutation(a, 0, 5, 3);
}

/* The order depends on (seed, epoch) only: not on the batch size, nor on which steps were asked
 * for before (a resumed or re-sharded run sees the same samples). */
static void test_sampler(void) {
    enum { N = 120 };
    int64_t perm0[N], perm1[N];
    adt_sample_permutation(perm0, N, 7, 0);
    adt_sample_permutation(perm1, N, 7, 1);
    int batches[] = {1, 4, 10, 40};
    for (int bi = 0; bi < 4; bi++) {
        int B = batches[bi];
        adt_sampler s;
        CHECK(adt_sampler_init(&s, N, B, 1, 7) == ADT_OK, "%s", adt_error_message());
        int64_t spe = adt_sampler_steps_per_epoch(&s), ids[40];
        CHECK(spe == N / B, "steps per epoch %lld", (long long)spe);
        /* random access: epoch 1 first, then epoch 0 */
        for (int64_t k = 2 * spe - 1; k >= 0; k--) {
            adt_sampler_batch(&s, k, ids);
            const int64_t *want = k < spe ? perm0 : perm1;
            for (int j = 0; j < B; j++) CHECK(ids[j] == want[(k % spe) * B + j], "B %d step %lld j %d", B, (long long)k, j);
        }
        adt_sampler_free(&s);
    }
    adt_sampler s;
    int64_t ids[7];
    CHECK(adt_sampler_init(&s, 20, 7, 0, 7) == ADT_OK, "%s", adt_error_message());
    adt_sampler_batch(&s, 0, ids);
    CHECK(ids[0] == 0 && ids[6] == 6, "sequential");
    adt_sampler_batch(&s, 1, ids);
    CHECK(ids[0] == 7 && ids[6] == 13, "sequential step 1");
    adt_sampler_batch(&s, 2, ids); /* 20 / 7 = 2 steps per epoch: the partial batch is dropped */
    CHECK(ids[0] == 0, "next epoch starts over");
    adt_sampler_free(&s);
    int rc = adt_sampler_init(&s, 5, 8, 1, 1);
    CHECK(rc == ADT_ERR_ARG && contains(adt_error_message(), "5 samples") && contains(adt_error_message(), "8"), "%s",
          adt_error_message());
    adt_sampler_free(&s);
}

/* ==== synthetic text ======================================================================== */

static void test_synthetic_text(void) {
    enum { N = 200000 };
    adt_text_dataset *a = NULL, *b = NULL, *c = NULL;
    CHECK(adt_text_dataset_synthetic(&a, N, 0) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_text_dataset_synthetic(&b, N, 0) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_text_dataset_synthetic(&c, N, 1) == ADT_OK, "%s", adt_error_message());
    if (!a || !b || !c) return;
    CHECK(adt_text_dataset_tokens(a) == N, "tokens");
    CHECK(adt_text_dataset_vocab(a)->size == 65, "the Tiny Shakespeare alphabet: %d", adt_text_dataset_vocab(a)->size);
    enum { T = 1000 };
    static int32_t xa[T], ya[T], xb[T], yb[T], xc[T], yc[T];
    int64_t s = 50;
    adt_text_dataset_fill(a, &s, 1, T, xa, ya);
    adt_text_dataset_fill(b, &s, 1, T, xb, yb);
    adt_text_dataset_fill(c, &s, 1, T, xc, yc);
    CHECK(!memcmp(xa, xb, sizeof xa), "deterministic");
    CHECK(memcmp(xa, xc, sizeof xa), "streams differ");
    /* learnable: the next symbol given the previous two has little entropy */
    int64_t ns = adt_text_dataset_samples(a, T);
    static int32_t counts[65][65][65];
    static int32_t ctx[65][65];
    for (int64_t k = 0; k < ns; k++) {
        adt_text_dataset_fill(a, &k, 1, T, xa, ya);
        for (int t = 1; t < T; t++) counts[xa[t - 1]][xa[t]][ya[t]]++, ctx[xa[t - 1]][xa[t]]++;
    }
    double h = 0, total = 0;
    for (int i = 0; i < 65; i++)
        for (int j = 0; j < 65; j++)
            for (int k = 0; k < 65; k++)
                if (counts[i][j][k]) h -= counts[i][j][k] * log2((double)counts[i][j][k] / ctx[i][j]), total += counts[i][j][k];
    h /= total;
    CHECK(h < 1.5, "order-2 conditional entropy %.3f bits, expected well below log2(65) = 6.0", h);
    adt_text_dataset_free(a);
    adt_text_dataset_free(b);
    adt_text_dataset_free(c);
}

static void cleanup(void) {
    const char *leaves[] = {"vocab.txt", "train.txt", "val_ok.txt", "val_bad.txt", "empty.txt", "short.txt"};
    check_tmpdir_remove(leaves, sizeof leaves / sizeof leaves[0]);
}

int main(void) {
    if (check_tmpdir_make("text")) return 2;
    RUN(test_vocab_sorted_complete);
    RUN(test_sample_windows);
    RUN(test_val_vocabulary);
    RUN(test_bad_files);
    RUN(test_permutation);
    RUN(test_sampler);
    RUN(test_synthetic_text);
    cleanup();
    return check_finish();
}
