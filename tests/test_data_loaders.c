/*
 * test_data_loaders.c - the generic dataset API (adt_dataset_*) and every kind behind it: token
 * files, MNIST IDX (plain and gzip), Criteo TSV/CSV, range selection, the synthetic mlp/vgg/dlrm
 * generators, ROC AUC, and the shipped real data when ../shared/data is present.
 *
 * Files are written here byte by byte with known content, so every expected value is computed
 * from what was written (or from a formula in docs/formats.md re-implemented here), never read
 * back from the code under test. Each malformed input must fail with a message naming the file
 * and the problem.
 */
#include "adtrain/base.h"
#include "adtrain/data.h"

#include "check.h"

#include <math.h>
#include <stdint.h>
#include <zlib.h>

#define SHARED "../shared/data"

/* ==== writing files and checking errors ====================================================== */

static int write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(buf, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

/* gzip with zlib's own writer (the reader under test inflates it with its own loop) */
static int write_gz(const char *path, const void *buf, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) return -1;
    int w = n ? gzwrite(g, buf, (unsigned)n) : 0;
    return gzclose(g) == Z_OK && (size_t)w == n ? 0 : -1;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* The open failed (rc != OK, *out NULL) with a message holding every non-NULL needle. */
static int failed_with(int rc, const adt_dataset *ds, const char *a, const char *b, const char *c) {
    const char *m = adt_error_message();
    return rc != ADT_OK && ds == NULL && (!a || contains(m, a)) && (!b || contains(m, b)) && (!c || contains(m, c));
}

static adt_data_shape seq_shape(int T, int V) {
    adt_data_shape s = {0};
    s.n_ctx = T;
    s.vocab_size = V;
    return s;
}

static adt_data_shape class_shape(int in, int classes) {
    adt_data_shape s = {0};
    s.in_features = in;
    s.classes = classes;
    return s;
}

static adt_data_shape ctr_shape(int D, int K) {
    adt_data_shape s = {0};
    s.n_dense = D;
    s.n_tables = K;
    for (int t = 0; t < K; t++) s.table_rows[t] = 1000 + 37 * t;
    return s;
}

static adt_dataset *open_ok(const char *spec, const adt_data_shape *shape, int is_val) {
    adt_dataset *ds = NULL;
    int rc = adt_dataset_open(&ds, spec, shape, NULL, is_val);
    CHECK(rc == ADT_OK && ds, "%s: %s", spec, adt_error_message());
    return ds;
}

/* ==== spec parsing and range selection ====================================================== */

static void test_spec_errors(void) {
    adt_data_shape s = seq_shape(4, 0);
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open(&ds, "parquet:x.pq", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "parquet:x.pq", "not a dataset", "tokens:FILE"), "%s", adt_error_message());
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "synthetic:gpt", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "synthetic:gpt", "synthetic:text|mlp|vgg|dlrm", NULL), "%s", adt_error_message());
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "tokens:", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "names no file", "tokens:FILE", NULL), "%s", adt_error_message());
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "synthetic:text@5:x", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "@5:x", NULL, NULL) || failed_with(rc, ds, "not a dataset", NULL, NULL), "%s",
          adt_error_message());
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "synthetic:text@99999999999999999999:", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "bad range", NULL, NULL), "%s", adt_error_message());
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "text:/no/such/dir/file.txt", &s, NULL, 0);
    CHECK(failed_with(rc, ds, "/no/such/dir/file.txt", "No such file", NULL), "%s", adt_error_message());
}

/* Text through the generic API: the windows are adt_text_dataset's, the range renumbers them. */
static void test_text_kind_and_range(void) {
    enum { N = 203, T = 5 };
    char text[N];
    for (int i = 0; i < N; i++) text[i] = (char)('a' + (i * 11 + i / 7) % 19);
    const char *path = check_tmp_path("range.txt");
    CHECK(write_bytes(path, text, N) == 0, "write");
    char spec[600];
    adt_data_shape s = seq_shape(T, 0);
    snprintf(spec, sizeof spec, "text:%s", path);
    adt_dataset *all = open_ok(spec, &s, 0);
    if (!all) return;
    int64_t n_all = (N - 1) / T;
    CHECK(adt_dataset_samples(all) == n_all, "%lld", (long long)adt_dataset_samples(all));
    CHECK(adt_dataset_layout(all) == ADT_DATA_SEQ, "layout");
    CHECK(!strcmp(adt_dataset_kind_name(all), "text"), "%s", adt_dataset_kind_name(all));
    const adt_text_vocab *v = adt_dataset_vocab(all);
    CHECK(v && v->size == 19 && adt_dataset_vocab_size(all) == 19, "vocab %d", v ? v->size : -1);
    CHECK(contains(adt_dataset_describe(all), path), "%s", adt_dataset_describe(all));

    /* sample k of "@a:b" is sample a+k of the whole; its tokens are text[(a+k)T ..] */
    struct { const char *r; int64_t a, b; } ranges[] = {{"@3:11", 3, 11}, {"@:4", 0, 4}, {"@30:", 30, n_all}};
    for (int i = 0; i < 3; i++) {
        snprintf(spec, sizeof spec, "text:%s%s", path, ranges[i].r);
        adt_dataset *ds = open_ok(spec, &s, 0);
        if (!ds) continue;
        int64_t cnt = ranges[i].b - ranges[i].a;
        CHECK(adt_dataset_samples(ds) == cnt, "%s: %lld samples", ranges[i].r, (long long)adt_dataset_samples(ds));
        CHECK(contains(adt_dataset_describe(ds), "samples ["), "%s", adt_dataset_describe(ds));
        int64_t ids[2] = {0, cnt - 1};
        int32_t x[2 * T], y[2 * T];
        CHECK(adt_dataset_fill(ds, ids, 2, x, NULL, y) == ADT_OK, "%s", adt_error_message());
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < T; t++) {
                int64_t pos = (ranges[i].a + ids[k]) * T + t;
                CHECK(x[k * T + t] == v->id[(uint8_t)text[pos]] && y[k * T + t] == v->id[(uint8_t)text[pos + 1]],
                      "%s sample %lld t %d", ranges[i].r, (long long)ids[k], t);
            }
        int64_t past = cnt;
        CHECK(adt_dataset_fill(ds, &past, 1, x, NULL, y) == ADT_ERR_ARG && contains(adt_error_message(), "out of range"),
              "%s", adt_error_message());
        adt_dataset_free(ds);
    }
    /* out of range, empty, reversed */
    const char *bad[] = {"@0:41", "@5:5", "@9:3", "@41:"};
    for (int i = 0; i < 4; i++) {
        snprintf(spec, sizeof spec, "text:%s%s", path, bad[i]);
        adt_dataset *ds = (adt_dataset *)&ds;
        int rc = adt_dataset_open(&ds, spec, &s, NULL, 0);
        CHECK(failed_with(rc, ds, path, "does not fit the 40 samples", "START < END <= 40"), "%s: %s", bad[i],
              adt_error_message());
    }
    /* a vocabulary larger than the model's */
    adt_data_shape small = seq_shape(T, 10);
    snprintf(spec, sizeof spec, "text:%s", path);
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open(&ds, spec, &small, NULL, 0);
    CHECK(failed_with(rc, ds, path, "19 distinct symbols", "vocab_size 10"), "%s", adt_error_message());
    /* n_ctx longer than the text */
    adt_data_shape longw = seq_shape(500, 0);
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, spec, &longw, NULL, 0);
    CHECK(failed_with(rc, ds, path, "shorter than one window", NULL), "%s", adt_error_message());
    adt_dataset_free(all);

    /* a '@' in a file name is not a range */
    const char *at = check_tmp_path("a@b.txt");
    CHECK(write_bytes(at, text, N) == 0, "write");
    snprintf(spec, sizeof spec, "text:%s", at);
    ds = open_ok(spec, &s, 0);
    if (ds) CHECK(adt_dataset_samples(ds) == n_all, "%lld", (long long)adt_dataset_samples(ds));
    adt_dataset_free(ds);
}

/* ==== token files ============================================================================ */

/* Header (docs/formats.md): "ADTTOKEN", u32 version 1, u32 bytes per token, u32 vocab_size,
 * u32 reserved 0, u64 count, all little-endian; then the ids. */
static size_t make_tokens(uint8_t *buf, int tb, uint32_t vocab, const uint32_t *ids, uint64_t n) {
    memcpy(buf, "ADTTOKEN", 8);
    uint32_t h[4] = {1, (uint32_t)tb, vocab, 0};
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++) buf[8 + 4 * i + b] = (uint8_t)(h[i] >> (8 * b));
    for (int b = 0; b < 8; b++) buf[24 + b] = (uint8_t)(n >> (8 * b));
    for (uint64_t i = 0; i < n; i++)
        for (int b = 0; b < tb; b++) buf[32 + i * tb + b] = (uint8_t)(ids[i] >> (8 * b));
    return 32 + (size_t)n * tb;
}

static void test_tokens_files(void) {
    enum { N = 101, T = 8 };
    uint32_t ids[N];
    static uint8_t buf[32 + 4 * N];
    for (int tb = 2; tb <= 4; tb += 2) {
        uint32_t vocab = tb == 2 ? 50257 : 100277;
        for (int i = 0; i < N; i++) ids[i] = (uint32_t)((i * 7919u + 13u) % vocab);
        size_t len = make_tokens(buf, tb, vocab, ids, N);
        const char *path = check_tmp_path(tb == 2 ? "t2.tok" : "t4.tok");
        CHECK(write_bytes(path, buf, len) == 0, "write");
        char spec[600];
        snprintf(spec, sizeof spec, "tokens:%s", path);
        adt_data_shape s = seq_shape(T, (int)vocab);
        adt_dataset *ds = open_ok(spec, &s, 0);
        if (!ds) continue;
        CHECK(adt_dataset_samples(ds) == (N - 1) / T, "%lld", (long long)adt_dataset_samples(ds));
        CHECK(adt_dataset_vocab_size(ds) == (int)vocab && adt_dataset_vocab(ds) == NULL, "vocab");
        CHECK(!strcmp(adt_dataset_kind_name(ds), "tokens"), "kind");
        CHECK(adt_dataset_sample_elems(ds, 0) == T && adt_dataset_sample_elems(ds, 1) == 0 &&
                  adt_dataset_sample_elems(ds, 2) == T, "elements per sample");
        int64_t sid[3] = {0, 5, (N - 1) / T - 1};
        int32_t x[3 * T], y[3 * T];
        CHECK(adt_dataset_fill(ds, sid, 3, x, NULL, y) == ADT_OK, "%s", adt_error_message());
        for (int k = 0; k < 3; k++)
            for (int t = 0; t < T; t++)
                CHECK(x[k * T + t] == (int32_t)ids[sid[k] * T + t] && y[k * T + t] == (int32_t)ids[sid[k] * T + t + 1],
                      "%d-byte sample %lld t %d", tb, (long long)sid[k], t);
        adt_dataset_free(ds);

        /* range, and the same bytes from memory */
        snprintf(spec, sizeof spec, "tokens:%s@2:", path);
        ds = open_ok(spec, &s, 0);
        if (ds) {
            int64_t z = 0;
            CHECK(adt_dataset_fill(ds, &z, 1, x, NULL, y) == ADT_OK && x[0] == (int32_t)ids[2 * T], "range");
            CHECK(adt_dataset_samples(ds) == (N - 1) / T - 2, "range count");
        }
        adt_dataset_free(ds);
        ds = NULL;
        CHECK(adt_dataset_open_memory(&ds, "tokens", "mem.tok", buf, len, NULL, 0, &s, NULL) == ADT_OK, "%s",
              adt_error_message());
        if (ds) {
            int64_t last = (N - 1) / T - 1;
            CHECK(adt_dataset_fill(ds, &last, 1, x, NULL, y) == ADT_OK && y[T - 1] == (int32_t)ids[last * T + T],
                  "last window's target");
        }
        adt_dataset_free(ds);
    }
}

static int open_tok_mem(adt_dataset **out, const uint8_t *buf, size_t len, int T, int V) {
    adt_data_shape s = seq_shape(T, V);
    return adt_dataset_open_memory(out, "tokens", "bad.tok", buf, len, NULL, 0, &s, NULL);
}

static void test_tokens_errors(void) {
    enum { N = 40 };
    uint32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (uint32_t)(i % 50);
    static uint8_t good[32 + 2 * N], b[32 + 4 * N + 8];
    size_t len = make_tokens(good, 2, 50, ids, N);
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc;
#define TRY(buf_, len_, T_, V_, a, bb, c)                                                      \
    do {                                                                                       \
        ds = (adt_dataset *)&ds;                                                               \
        rc = open_tok_mem(&ds, buf_, len_, T_, V_);                                            \
        CHECK(failed_with(rc, ds, a, bb, c), "message: %s", adt_error_message());             \
        if (rc == ADT_OK) adt_dataset_free(ds);                                                \
    } while (0)
    rc = open_tok_mem(&ds, good, len, 4, 50);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc == ADT_OK) adt_dataset_free(ds);

    TRY(good, 20, 4, 50, "bad.tok", "20 bytes", "32-byte");
    memcpy(b, good, len);
    b[3] = 'X';
    TRY(b, len, 4, 50, "bad.tok", "wrong magic", "ADTTOKEN");
    memcpy(b, good, len);
    b[8] = 2;
    TRY(b, len, 4, 50, "bad.tok", "version 2", "expected 1");
    memcpy(b, good, len);
    b[12] = 3;
    TRY(b, len, 4, 50, "bad.tok", "3 bytes per token", "2 or 4");
    memcpy(b, good, len);
    b[16] = 0;
    TRY(b, len, 4, 50, "bad.tok", "vocab_size 0", NULL);
    memcpy(b, good, len);
    b[20] = 1;
    TRY(b, len, 4, 50, "bad.tok", "reserved", "expected 0");
    TRY(good, len - 3, 4, 50, "bad.tok", "truncated", "40 tokens");
    memcpy(b, good, len);
    memset(b + len, 0, 4);
    TRY(b, len + 4, 4, 50, "bad.tok", "4 bytes after 40 tokens", NULL);
    /* an id outside the file's vocabulary: token 7 at byte offset 32 + 2*7 = 46 */
    memcpy(b, good, len);
    b[32 + 2 * 7] = 60;
    TRY(b, len, 4, 0, "bad.tok", "token 60 at byte offset 46", "vocab_size 50");
    /* ids that fit the file but not the model */
    TRY(good, len, 4, 30, "bad.tok", "token 30 at byte offset 92", "vocab_size 30");
    /* 40 tokens hold no window of 40 + 1 */
    TRY(good, len, 40, 50, "bad.tok", "shorter than one window", "41");
    TRY(good, len, 0, 50, "bad.tok", "n_ctx 0", NULL);
#undef TRY

    /* a 2-byte file cannot declare more than 65536 symbols */
    uint32_t one = 0;
    size_t l2 = make_tokens(b, 2, 70000, &one, 1);
    ds = (adt_dataset *)&ds;
    rc = open_tok_mem(&ds, b, l2, 1, 0);
    CHECK(failed_with(rc, ds, "vocab_size 70000", "2-byte", NULL), "%s", adt_error_message());
    /* files, not just memory */
    const char *p = check_tmp_path("short.tok");
    write_bytes(p, good, 31);
    char spec[600];
    snprintf(spec, sizeof spec, "tokens:%s", p);
    adt_data_shape s = seq_shape(4, 0);
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, spec, &s, NULL, 0);
    CHECK(failed_with(rc, ds, p, "31 bytes", NULL), "%s", adt_error_message());
    write_bytes(p, "", 0);
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, spec, &s, NULL, 0);
    CHECK(failed_with(rc, ds, p, "0 bytes", NULL), "%s", adt_error_message());
}

/* ==== MNIST IDX ============================================================================== */

static size_t make_idx(uint8_t *buf, int ndim, const uint32_t *dims, const uint8_t *data) {
    buf[0] = 0, buf[1] = 0, buf[2] = 0x08, buf[3] = (uint8_t)ndim;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        for (int b = 0; b < 4; b++) buf[4 + 4 * d + b] = (uint8_t)(dims[d] >> (24 - 8 * b));
        n *= dims[d];
    }
    memcpy(buf + 4 + 4 * ndim, data, n);
    return 4 + 4 * (size_t)ndim + n;
}

enum { MN = 6, MR = 3, MC = 4 };
static uint8_t mn_pix[MN * MR * MC], mn_lab[MN];
static uint8_t mn_img_file[16 + MN * MR * MC], mn_lab_file[8 + MN];
static size_t mn_img_len, mn_lab_len;

static void make_mnist(void) {
    for (int i = 0; i < MN * MR * MC; i++) mn_pix[i] = (uint8_t)((i * 37 + 11) % 256);
    mn_pix[0] = 0, mn_pix[1] = 255;
    for (int i = 0; i < MN; i++) mn_lab[i] = (uint8_t)((i * 3 + 2) % 10);
    uint32_t di[3] = {MN, MR, MC}, dl[1] = {MN};
    mn_img_len = make_idx(mn_img_file, 3, di, mn_pix);
    mn_lab_len = make_idx(mn_lab_file, 1, dl, mn_lab);
}

/* The dataset holds exactly the written images (bytes / 255) and labels. */
static void check_mnist_content(adt_dataset *ds, int64_t first, const char *what) {
    int64_t n = adt_dataset_samples(ds);
    float x[MN * MR * MC];
    int32_t y[MN];
    int64_t ids[MN];
    for (int i = 0; i < n; i++) ids[i] = i;
    CHECK(adt_dataset_fill(ds, ids, (int)n, x, NULL, y) == ADT_OK, "%s: %s", what, adt_error_message());
    for (int64_t i = 0; i < n; i++) {
        CHECK(y[i] == mn_lab[first + i], "%s: label %lld", what, (long long)i);
        for (int j = 0; j < MR * MC; j++)
            CHECK_CLOSE(x[i * MR * MC + j], mn_pix[(first + i) * MR * MC + j] / 255.0, 1e-6, 1e-7);
    }
}

static void test_mnist_plain_and_gz(void) {
    make_mnist();
    adt_data_shape s = class_shape(MR * MC, 10);
    char spec[600];
    const char *forms[4][2] = {{"", ""}, {".gz", ".gz"}, {"", ".gz"}, {".gz", ""}};
    for (int f = 0; f < 4; f++) {
        char pre[32], ip[64], lp[64];
        snprintf(pre, sizeof pre, "m%d", f);
        snprintf(ip, sizeof ip, "m%d-images-idx3-ubyte%s", f, forms[f][0]);
        snprintf(lp, sizeof lp, "m%d-labels-idx1-ubyte%s", f, forms[f][1]);
        const char *ipath = check_tmp_path(ip), *lpath = check_tmp_path(lp);
        CHECK((*forms[f][0] ? write_gz : write_bytes)(ipath, mn_img_file, mn_img_len) == 0, "write");
        CHECK((*forms[f][1] ? write_gz : write_bytes)(lpath, mn_lab_file, mn_lab_len) == 0, "write");
        snprintf(spec, sizeof spec, "mnist:%s", check_tmp_path(pre));
        adt_dataset *ds = open_ok(spec, &s, 0);
        if (!ds) continue;
        CHECK(adt_dataset_samples(ds) == MN && adt_dataset_layout(ds) == ADT_DATA_CLASS, "count/layout");
        CHECK(adt_dataset_sample_elems(ds, 0) == MR * MC && adt_dataset_sample_elems(ds, 1) == 0 &&
                  adt_dataset_sample_elems(ds, 2) == 1, "elements per sample");
        CHECK(contains(adt_dataset_describe(ds), "6 images 1x3x4"), "%s", adt_dataset_describe(ds));
        check_mnist_content(ds, 0, ip);
        adt_dataset_free(ds);
    }
    /* a range */
    snprintf(spec, sizeof spec, "mnist:%s@2:5", check_tmp_path("m1"));
    adt_dataset *ds = open_ok(spec, &s, 0);
    if (ds) {
        CHECK(adt_dataset_samples(ds) == 3, "range");
        check_mnist_content(ds, 2, "range");
    }
    adt_dataset_free(ds);
    /* the plain file wins over the .gz one: put different labels in the .gz */
    uint8_t other[8 + MN];
    memcpy(other, mn_lab_file, mn_lab_len);
    other[8] = 9;
    CHECK(write_gz(check_tmp_path("m0-labels-idx1-ubyte.gz"), other, mn_lab_len) == 0, "write");
    snprintf(spec, sizeof spec, "mnist:%s", check_tmp_path("m0"));
    ds = open_ok(spec, &s, 0);
    if (ds) check_mnist_content(ds, 0, "plain preferred");
    adt_dataset_free(ds);
    /* the layout given as C,H,W instead of in_features */
    adt_data_shape chw = {0};
    chw.channels = 1, chw.height = MR, chw.width = MC, chw.classes = 10;
    ds = open_ok(spec, &chw, 0);
    adt_dataset_free(ds);
    /* memory */
    ds = NULL;
    CHECK(adt_dataset_open_memory(&ds, "mnist", "mem", mn_img_file, mn_img_len, mn_lab_file, mn_lab_len, &s, NULL) ==
              ADT_OK, "%s", adt_error_message());
    if (ds) check_mnist_content(ds, 0, "memory");
    adt_dataset_free(ds);
}

static int open_mnist_mem(adt_dataset **out, const uint8_t *im, size_t nim, const uint8_t *lb, size_t nlb,
                          const adt_data_shape *s) {
    return adt_dataset_open_memory(out, "mnist", "mn", im, nim, lb, nlb, s, NULL);
}

static void test_mnist_errors(void) {
    make_mnist();
    adt_data_shape s = class_shape(MR * MC, 10);
    static uint8_t im[4096 + 8], lb[8 + MN + 8];
    adt_dataset *ds;
    int rc;
#define TRY(imp, nim, lbp, nlb, shape, a, b, c)                                                \
    do {                                                                                       \
        ds = (adt_dataset *)&ds;                                                               \
        rc = open_mnist_mem(&ds, imp, nim, lbp, nlb, shape);                                   \
        CHECK(failed_with(rc, ds, a, b, c), "message: %s", adt_error_message());             \
        if (rc == ADT_OK) adt_dataset_free(ds);                                                \
    } while (0)
    memcpy(im, mn_img_file, mn_img_len);
    im[3] = 1; /* labels magic on the images file */
    TRY(im, mn_img_len, mn_lab_file, mn_lab_len, &s, "mn (images)", "wrong magic 0x00000801", "0x00000803");
    TRY(mn_lab_file, mn_lab_len, mn_img_file, mn_img_len, &s, "mn (images)", "wrong magic", NULL);
    memcpy(im, mn_img_file, mn_img_len);
    im[2] = 0x0b; /* IDX int16 */
    TRY(im, mn_img_len, mn_lab_file, mn_lab_len, &s, "mn (images)", "element type 0x0b", "unsigned bytes");
    TRY(mn_img_file, 3, mn_lab_file, mn_lab_len, &s, "mn (images)", "3 bytes", "magic");
    TRY(mn_img_file, 10, mn_lab_file, mn_lab_len, &s, "mn (images)", "too short", "header");
    TRY(mn_img_file, mn_img_len - 1, mn_lab_file, mn_lab_len, &s, "mn (images)", "truncated", "72 bytes");
    TRY(mn_img_file, mn_img_len, mn_lab_file, mn_lab_len - 2, &s, "mn (labels)", "truncated", NULL);
    memcpy(im, mn_img_file, mn_img_len);
    memset(im + mn_img_len, 0, 5);
    TRY(im, mn_img_len + 5, mn_lab_file, mn_lab_len, &s, "mn (images)", "5 bytes after", NULL);
    /* header dimensions whose product overflows 64 bits */
    memcpy(im, mn_img_file, mn_img_len);
    memset(im + 4, 0xff, 12);
    TRY(im, mn_img_len, mn_lab_file, mn_lab_len, &s, "mn (images)", "truncated", NULL);
    /* counts that disagree: 5 labels for 6 images */
    uint32_t d5[1] = {5};
    size_t l5 = make_idx(lb, 1, d5, mn_lab);
    TRY(mn_img_file, mn_img_len, lb, l5, &s, "6 images", "5 labels", "agree");
    /* a label out of range for the model */
    adt_data_shape few = class_shape(MR * MC, 5);
    TRY(mn_img_file, mn_img_len, mn_lab_file, mn_lab_len, &few, "mn (labels)", "label 5 of sample 1", "classes 5");
    /* shapes that do not fit */
    adt_data_shape wide = class_shape(100, 10);
    TRY(mn_img_file, mn_img_len, mn_lab_file, mn_lab_len, &wide, "in_features 100", "expected in_features 12",
        "3x4 images");
    adt_data_shape rgb = {0};
    rgb.channels = 3, rgb.height = MR, rgb.width = MC, rgb.classes = 10;
    TRY(mn_img_file, mn_img_len, mn_lab_file, mn_lab_len, &rgb, "3x3x4", "expected 1x3x4", NULL);
    adt_data_shape clash = {0};
    clash.channels = 1, clash.height = MR, clash.width = MC, clash.in_features = 10, clash.classes = 10;
    TRY(mn_img_file, mn_img_len, mn_lab_file, mn_lab_len, &clash, "in_features 10", "1x3x4 = 12", NULL);
    /* gzip: truncated, corrupt, garbage after */
    const char *gp = check_tmp_path("gz-images-idx3-ubyte.gz");
    write_gz(gp, mn_img_file, mn_img_len);
    static uint8_t gz[4096];
    FILE *fp = fopen(gp, "rb");
    size_t gl = fp ? fread(gz, 1, sizeof gz, fp) : 0;
    if (fp) fclose(fp);
    CHECK(gl > 20, "gz size %zu", gl);
    ds = NULL;
    rc = open_mnist_mem(&ds, gz, gl, mn_lab_file, mn_lab_len, &s);
    CHECK(rc == ADT_OK, "whole gz opens: %s", adt_error_message());
    adt_dataset_free(ds);
    TRY(gz, gl - 6, mn_lab_file, mn_lab_len, &s, "mn (images)", "gzip", NULL);
    memcpy(im, gz, gl);
    im[gl / 2] ^= 0x55;
    TRY(im, gl, mn_lab_file, mn_lab_len, &s, "mn (images)", "gzip", NULL);
    memcpy(im, gz, gl);
    memcpy(im + gl, "junk", 4);
    TRY(im, gl + 4, mn_lab_file, mn_lab_len, &s, "mn (images)", "garbage after the gzip stream", NULL);
#undef TRY
    /* missing files name both candidates */
    char spec[600];
    snprintf(spec, sizeof spec, "mnist:%s", check_tmp_path("nothing"));
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, spec, &s, NULL, 0);
    CHECK(failed_with(rc, ds, "nothing-images-idx3-ubyte", "nothing-images-idx3-ubyte.gz", "neither"), "%s",
          adt_error_message());
}

/* ==== Criteo ================================================================================ */

/* docs/formats.md: row = splitmix64(fnv1a64(value) ^ splitmix64(0x63726974656f + t)) mod rows */
static uint64_t ref_splitmix64(uint64_t x) {
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int32_t ref_criteo_row(const char *v, int t, int64_t rows) {
    uint64_t h = 14695981039346656037ull;
    for (const char *p = v; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (int32_t)(ref_splitmix64(h ^ ref_splitmix64(0x63726974656full + (uint64_t)t)) % (uint64_t)rows);
}

typedef struct crow {
    const char *label;
    const char *dense[13];
    const char *cat[26];
    int n_cat; /* categorical fields written (trailing ones stripped when < 26) */
} crow;

static const crow crows[] = {
    {"1", {"5", "", "-3", "0", "12", "", "", "", "", "", "", "", "7"},
     {"05db9164", "", "9143c832", "", "25c83c98", "7e0ccccf", "df5c2d18", "0b153874", "a73ee510", "", "a7b606c4",
      "ae1bb660", "eae197fd", "b28479f6", "bfef54b3", "bad5ee18", "e5ba7672", "87c6f83c", "", "", "0429f84b", "",
      "3a171ecb", "c0d61a5c", "", ""}, 26},
    {"0", {"", "", "", "", "", "", "", "", "", "", "", "", ""}, {0}, 0},
    {"0", {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "65535"},
     {"68fd1e64", "04e09220", "95e13fd4", "a1e6a194", "25c83c98", "fe6b92e5", "f819e175", "062b5529", "a73ee510",
      "ab9456b4", "6153cf57", "8882c6cd", "769a1844", "b28479f6", "69f825dd", "23056e4f", "d4bb7bd8", "6fc84bfb"}, 18},
};
enum { NCROWS = sizeof crows / sizeof crows[0] };

static size_t criteo_text(char *out, size_t cap, char sep, int header, const char *eol) {
    size_t k = 0;
    if (header) {
        k += (size_t)snprintf(out + k, cap - k, "label");
        for (int i = 1; i <= 13; i++) k += (size_t)snprintf(out + k, cap - k, "%cI%d", sep, i);
        for (int i = 1; i <= 26; i++) k += (size_t)snprintf(out + k, cap - k, "%cC%d", sep, i);
        k += (size_t)snprintf(out + k, cap - k, "%s", eol);
    }
    for (int r = 0; r < NCROWS; r++) {
        k += (size_t)snprintf(out + k, cap - k, "%s", crows[r].label);
        for (int j = 0; j < 13; j++) k += (size_t)snprintf(out + k, cap - k, "%c%s", sep, crows[r].dense[j]);
        for (int t = 0; t < crows[r].n_cat; t++) k += (size_t)snprintf(out + k, cap - k, "%c%s", sep, crows[r].cat[t]);
        if (r + 1 < NCROWS) k += (size_t)snprintf(out + k, cap - k, "%s", eol); /* no newline at the end */
    }
    return k;
}

static void check_criteo_rows(adt_dataset *ds, const adt_data_shape *s, const char *what) {
    CHECK(adt_dataset_samples(ds) == NCROWS && adt_dataset_layout(ds) == ADT_DATA_CTR, "%s: %lld samples", what,
          (long long)adt_dataset_samples(ds));
    CHECK(adt_dataset_sample_elems(ds, 0) == 13 && adt_dataset_sample_elems(ds, 1) == 26 &&
              adt_dataset_sample_elems(ds, 2) == 1, "elements per sample");
    int64_t ids[NCROWS] = {0, 1, 2};
    float x[NCROWS * 13], y[NCROWS];
    int32_t c[NCROWS * 26];
    CHECK(adt_dataset_fill(ds, ids, NCROWS, x, c, y) == ADT_OK, "%s", adt_error_message());
    for (int r = 0; r < NCROWS; r++) {
        CHECK(y[r] == (float)atoi(crows[r].label), "%s row %d label", what, r);
        for (int j = 0; j < 13; j++) {
            double v = *crows[r].dense[j] ? atof(crows[r].dense[j]) : 0;
            CHECK_CLOSE(x[r * 13 + j], v > 0 ? log(1 + v) : 0.0, 1e-6, 1e-7);
        }
        for (int t = 0; t < 26; t++) {
            const char *v = t < crows[r].n_cat ? crows[r].cat[t] : "";
            CHECK(c[r * 26 + t] == ref_criteo_row(v, t, s->table_rows[t]), "%s row %d C%d ('%s'): %d vs %d", what, r,
                  t + 1, v, c[r * 26 + t], ref_criteo_row(v, t, s->table_rows[t]));
        }
    }
}

static void test_criteo_formats(void) {
    adt_data_shape s = ctr_shape(13, 26);
    s.table_rows[3] = 1; /* a one-row table: everything hashes to 0 */
    s.table_rows[4] = 2147483647;
    static char text[8192];
    struct { char sep; int header; const char *eol, *file; } forms[] = {
        {'\t', 0, "\n", "c.tsv"}, {',', 1, "\n", "c.csv"}, {'\t', 0, "\r\n", "crlf.tsv"}};
    for (int f = 0; f < 3; f++) {
        size_t n = criteo_text(text, sizeof text, forms[f].sep, forms[f].header, forms[f].eol);
        const char *path = check_tmp_path(forms[f].file);
        CHECK(write_bytes(path, text, n) == 0, "write");
        char spec[600];
        snprintf(spec, sizeof spec, "criteo:%s", path);
        adt_dataset *ds = open_ok(spec, &s, 0);
        if (!ds) continue;
        check_criteo_rows(ds, &s, forms[f].file);
        CHECK(contains(adt_dataset_describe(ds), forms[f].header ? "CSV with header" : "TSV"), "%s",
              adt_dataset_describe(ds));
        adt_dataset_free(ds);
    }
    /* a range over lines, and a trailing newline */
    size_t n = criteo_text(text, sizeof text, '\t', 0, "\n");
    text[n++] = '\n';
    adt_dataset *ds = NULL;
    CHECK(adt_dataset_open_memory(&ds, "criteo", "mem.tsv", text, n, NULL, 0, &s, NULL) == ADT_OK, "%s",
          adt_error_message());
    if (ds) check_criteo_rows(ds, &s, "trailing newline");
    adt_dataset_free(ds);
    const char *path = check_tmp_path("c.tsv");
    char spec[600];
    snprintf(spec, sizeof spec, "criteo:%s@1:", path);
    ds = open_ok(spec, &s, 0);
    if (ds) {
        int64_t id = 1;
        float x[13], y;
        int32_t c[26];
        CHECK(adt_dataset_fill(ds, &id, 1, x, c, &y) == ADT_OK && adt_dataset_samples(ds) == 2, "range");
        CHECK_CLOSE(x[12], log(65536.0), 1e-6, 0);
        CHECK(c[0] == ref_criteo_row("68fd1e64", 0, s.table_rows[0]), "range row");
    }
    adt_dataset_free(ds);
}

static int open_criteo_mem(adt_dataset **out, const char *text, const adt_data_shape *s) {
    return adt_dataset_open_memory(out, "criteo", "bad.tsv", text, strlen(text), NULL, 0, s, NULL);
}

static void test_criteo_errors(void) {
    adt_data_shape s = ctr_shape(13, 26);
    static char good[2048], t[4096];
    size_t n = criteo_text(good, sizeof good, '\t', 0, "\n");
    good[n] = 0;
    adt_dataset *ds;
    int rc;
#define TRY(text_, shape, a, b, c)                                                             \
    do {                                                                                       \
        ds = (adt_dataset *)&ds;                                                               \
        rc = open_criteo_mem(&ds, text_, shape);                                               \
        CHECK(failed_with(rc, ds, a, b, c), "message: %s", adt_error_message());             \
        if (rc == ADT_OK) adt_dataset_free(ds);                                                \
    } while (0)
    /* 41 fields on line 2 */
    snprintf(t, sizeof t, "%s\n0", good);
    for (int i = 0; i < 40; i++) strcat(t, "\t");
    TRY(t, &s, "bad.tsv:4:", "more than 40 fields", "expected 40");
    TRY("1\t2\t3\n", &s, "bad.tsv:1:", "3 fields", "expected 40");
    /* bad label, bad integer, bad categorical: each names file:line and field */
    snprintf(t, sizeof t, "%s", good);
    t[0] = '2';
    TRY(t, &s, "bad.tsv:1:", "field 1 (label)", "'2'");
    snprintf(t, sizeof t, "%s", good);
    char *five = strchr(t, '\t') + 1; /* I1 = "5" */
    *five = 'x';
    TRY(t, &s, "bad.tsv:1:", "field 2 (I1)", "'x'");
    snprintf(t, sizeof t, "%s", good);
    char *c1 = strstr(t, "05db9164");
    c1[0] = 'z';
    TRY(t, &s, "bad.tsv:1:", "field 15 (C1)", "'z5db9164'");
    snprintf(t, sizeof t, "%s", good);
    c1 = strstr(t, "9143c832");
    memcpy(c1, "1.5e3000", 8);
    TRY(t, &s, "bad.tsv:1:", "field 17 (C3)", "hex");
    TRY("0\t1e999\t\t\t\t\t\t\t\t\t\t\t\t\n", &s, "bad.tsv:1:", "field 2 (I1)", "'1e999'");
    TRY("0\tnan\t\t\t\t\t\t\t\t\t\t\t\t\n", &s, "bad.tsv:1:", "field 2 (I1)", "'nan'");
    TRY("0\t\t\t\t\t\t\t\t\t\t\t\t\t\x01\n", &s, "bad.tsv:1:", "field 14 (I13)", "\\x01");
    /* an empty line in the middle */
    snprintf(t, sizeof t, "%s", good);
    char *l2 = strchr(t, '\n');
    memmove(l2 + 1, l2, strlen(l2) + 1);
    TRY(t, &s, "bad.tsv:2:", "empty line", NULL);
    TRY("", &s, "bad.tsv", "no samples", NULL);
    /* a header with the wrong width */
    TRY("label,I1,I2\n1,2,3\n", &s, "bad.tsv:1:", "header", "3 columns");
    /* shapes */
    adt_data_shape d10 = ctr_shape(10, 26);
    TRY(good, &d10, "criteo:bad.tsv", "n_dense 10", "expected 13");
    adt_data_shape k20 = ctr_shape(13, 20);
    TRY(good, &k20, "n_tables 20", "expected 26", NULL);
    adt_data_shape r0 = ctr_shape(13, 26);
    r0.table_rows[7] = 0;
    TRY(good, &r0, "table_rows[7] = 0", "C8", NULL);
#undef TRY
}

/* ==== synthetic ============================================================================== */

static int same_fill_f(adt_dataset *a, adt_dataset *b, const int64_t *ida, const int64_t *idb, int n, int F) {
    float *xa = malloc((size_t)n * F * sizeof(float)), *xb = malloc((size_t)n * F * sizeof(float));
    int32_t *ya = malloc((size_t)n * sizeof(int32_t)), *yb = malloc((size_t)n * sizeof(int32_t));
    int ok = adt_dataset_fill(a, ida, n, xa, NULL, ya) == ADT_OK && adt_dataset_fill(b, idb, n, xb, NULL, yb) == ADT_OK &&
             !memcmp(xa, xb, (size_t)n * F * sizeof(float)) && !memcmp(ya, yb, (size_t)n * sizeof(int32_t));
    free(xa), free(xb), free(ya), free(yb);
    return ok;
}

/* The teacher's labels are balanced, and a nearest-class-mean classifier fitted on the training
 * stream predicts the validation stream far above chance: the labels are a learnable function. */
static void test_synthetic_mlp(void) {
    enum { F = 64, K = 10, NTR = 6000, NVA = 2000 };
    adt_data_shape s = class_shape(F, K);
    adt_dataset *tr = open_ok("synthetic:mlp", &s, 0), *va = open_ok("synthetic:mlp", &s, 1),
                *tr2 = open_ok("synthetic:mlp", &s, 0), *sub = open_ok("synthetic:mlp@100:300", &s, 0);
    if (!tr || !va || !tr2 || !sub) goto out;
    CHECK(adt_dataset_samples(tr) == ADT_SYN_MLP_SAMPLES && adt_dataset_samples(va) == ADT_SYN_MLP_VAL_SAMPLES,
          "sizes");
    int64_t ids[NTR], ids100[200];
    for (int i = 0; i < NTR; i++) ids[i] = i;
    for (int i = 0; i < 200; i++) ids100[i] = 100 + i;
    CHECK(same_fill_f(tr, tr2, ids, ids, 500, F), "two opens, same samples");
    CHECK(same_fill_f(sub, tr, ids, ids100, 200, F), "range @100:300 is samples 100..299");
    CHECK(!same_fill_f(tr, va, ids, ids, 50, F), "validation stream differs");
    float *x = malloc((size_t)NTR * F * sizeof(float));
    int32_t *y = malloc(NTR * sizeof(int32_t));
    CHECK(adt_dataset_fill(tr, ids, NTR, x, NULL, y) == ADT_OK, "%s", adt_error_message());
    double mean[K][F] = {{0}};
    int cnt[K] = {0};
    for (int i = 0; i < NTR; i++) {
        CHECK(y[i] >= 0 && y[i] < K, "label %d", y[i]);
        if (y[i] < 0 || y[i] >= K) break;
        cnt[y[i]]++;
        for (int j = 0; j < F; j++) mean[y[i]][j] += x[(int64_t)i * F + j];
    }
    for (int k = 0; k < K; k++) {
        CHECK(cnt[k] > NTR / K / 3 && cnt[k] < 3 * NTR / K, "class %d has %d of %d samples", k, cnt[k], NTR);
        for (int j = 0; j < F; j++) mean[k][j] /= cnt[k] ? cnt[k] : 1;
    }
    CHECK(adt_dataset_fill(va, ids, NVA, x, NULL, y) == ADT_OK, "%s", adt_error_message());
    int right = 0;
    for (int i = 0; i < NVA; i++) {
        int best = 0;
        double bd = INFINITY;
        for (int k = 0; k < K; k++) {
            double d = 0;
            for (int j = 0; j < F; j++) d += (x[(int64_t)i * F + j] - mean[k][j]) * (x[(int64_t)i * F + j] - mean[k][j]);
            if (d < bd) bd = d, best = k;
        }
        right += best == y[i];
    }
    CHECK(right > NVA / 2, "nearest-mean accuracy %d / %d (chance %d)", right, NVA, NVA / K);
    if (getenv("CHECK_VERBOSE")) {
        int lo = NTR, hi = 0;
        for (int k = 0; k < K; k++) lo = cnt[k] < lo ? cnt[k] : lo, hi = cnt[k] > hi ? cnt[k] : hi;
        fprintf(stderr, "  synthetic:mlp: classes hold %d..%d of %d, nearest-mean accuracy %d / %d\n", lo, hi, NTR,
                right, NVA);
    }
    free(x);
    free(y);
    adt_data_shape bad = class_shape(0, 10);
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open(&ds, "synthetic:mlp", &bad, NULL, 0);
    CHECK(failed_with(rc, ds, "synthetic:mlp", "in_features 0", "expected in_features >= 1"), "%s", adt_error_message());
out:
    adt_dataset_free(tr), adt_dataset_free(va), adt_dataset_free(tr2), adt_dataset_free(sub);
}

/* Power spectrum of one channel (H x W, row-major) by a separable DFT: pw[fy*W + fx]. */
static void power_spectrum(const float *im, int H, int W, double *pw) {
    double *re = malloc(sizeof(double) * H * W), *imag = malloc(sizeof(double) * H * W);
    for (int h = 0; h < H; h++) /* along w */
        for (int fx = 0; fx < W; fx++) {
            double r = 0, i = 0;
            for (int w = 0; w < W; w++) {
                double a = 2 * M_PI * fx * w / W;
                r += im[h * W + w] * cos(a), i -= im[h * W + w] * sin(a);
            }
            re[h * W + fx] = r, imag[h * W + fx] = i;
        }
    for (int fy = 0; fy < H; fy++) /* along h */
        for (int fx = 0; fx < W; fx++) {
            double r = 0, i = 0;
            for (int h = 0; h < H; h++) {
                double a = 2 * M_PI * fy * h / H, c = cos(a), sn = sin(a);
                r += re[h * W + fx] * c + imag[h * W + fx] * sn;
                i += imag[h * W + fx] * c - re[h * W + fx] * sn;
            }
            pw[fy * W + fx] += r * r + i * i;
        }
    free(re), free(imag);
}

/* Each class is one spatial frequency at a random phase: the strongest bin of every image's
 * power spectrum (translation-invariant, computed here from the pixels alone) names its class,
 * while the class mean images carry nothing: learnable, but not by a template. */
static void test_synthetic_vgg(void) {
    enum { C = 3, H = 24, W = 24, K = 10, N = 400 };
    adt_data_shape s = {0};
    s.channels = C, s.height = H, s.width = W, s.classes = K;
    adt_dataset *tr = open_ok("synthetic:vgg", &s, 0), *tr2 = open_ok("synthetic:vgg", &s, 0),
                *va = open_ok("synthetic:vgg", &s, 1);
    float *x = malloc((size_t)N * C * H * W * sizeof(float));
    if (!tr || !tr2 || !va) goto out;
    CHECK(adt_dataset_samples(tr) == ADT_SYN_VGG_SAMPLES && adt_dataset_layout(tr) == ADT_DATA_CLASS, "size");
    CHECK(adt_dataset_sample_elems(tr, 0) == C * H * W, "elements");
    int64_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = i * 7;
    CHECK(same_fill_f(tr, tr2, ids, ids, N, C * H * W), "deterministic");
    CHECK(!same_fill_f(tr, va, ids, ids, 20, C * H * W), "validation stream differs");
    int32_t y[N];
    CHECK(adt_dataset_fill(tr, ids, N, x, NULL, y) == ADT_OK, "%s", adt_error_message());
    double sum = 0, sum2 = 0;
    for (int64_t i = 0; i < (int64_t)N * C * H * W; i++) sum += x[i], sum2 += (double)x[i] * x[i];
    double var = sum2 / ((double)N * C * H * W) - pow(sum / ((double)N * C * H * W), 2);
    CHECK(var > 0.9 && var < 1.2, "pixel variance %.3f", var);
    static double pw[H * W];
    int peak_of[N], cnt[K] = {0};
    for (int i = 0; i < N; i++) {
        memset(pw, 0, sizeof pw);
        for (int c = 0; c < C; c++) power_spectrum(x + ((int64_t)i * C + c) * H * W, H, W, pw);
        int arg = 1;
        for (int q = 1; q < H * W; q++) {
            int fy = q / W, fx = q % W, ny = (H - fy) % H, nx = (W - fx) % W;
            if (ny * W + nx < q) continue; /* (fy, fx) and (-fy, -fx) hold the same power */
            if (pw[q] > pw[arg]) arg = q;
        }
        peak_of[i] = arg;
        if (y[i] >= 0 && y[i] < K) cnt[y[i]]++;
    }
    /* per class: the most common peak bin, and how many of its images peak there */
    int bin_of_class[K], agree = 0;
    for (int k = 0; k < K; k++) {
        static int votes[H * W];
        memset(votes, 0, sizeof votes);
        for (int i = 0; i < N; i++)
            if (y[i] == k) votes[peak_of[i]]++;
        int b = 0;
        for (int q = 1; q < H * W; q++)
            if (votes[q] > votes[b]) b = q;
        bin_of_class[k] = b;
        agree += votes[b];
        CHECK(cnt[k] > N / K / 3, "class %d has %d of %d images", k, cnt[k], N);
    }
    CHECK(agree >= N * 95 / 100, "%d of %d images peak at their class's frequency", agree, N);
    for (int a = 0; a < K; a++)
        for (int b = a + 1; b < K; b++)
            CHECK(bin_of_class[a] != bin_of_class[b], "classes %d and %d share a frequency", a, b);
    /* the class mean images hold no wave: their energy is what averaging n_k noise images leaves
     * (C*H*W/n_k), not the wave's (about 0.1 per pixel, 170 here) */
    static double mean[C * H * W];
    double worst = 0;
    for (int k = 0; k < K; k++) {
        memset(mean, 0, sizeof mean);
        for (int i = 0; i < N; i++)
            if (y[i] == k)
                for (int j = 0; j < C * H * W; j++) mean[j] += x[(int64_t)i * C * H * W + j];
        double e = 0;
        for (int j = 0; j < C * H * W; j++) e += pow(mean[j] / cnt[k], 2);
        worst = fmax(worst, e / ((double)C * H * W / cnt[k]));
    }
    CHECK(worst < 1.5, "a class mean holds %.2f times the energy of averaged noise: the phase is not random", worst);
    if (getenv("CHECK_VERBOSE"))
        fprintf(stderr, "  synthetic:vgg: pixel variance %.3f, spectral peak agrees %d / %d, class-mean energy <= %.2f "
                "x noise\n", var, agree, N, worst);
    /* more classes than frequencies; a layout that disagrees with in_features */
    adt_data_shape tiny = {0};
    tiny.channels = 1, tiny.height = 3, tiny.width = 3, tiny.classes = 10;
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open(&ds, "synthetic:vgg", &tiny, NULL, 0);
    CHECK(failed_with(rc, ds, "synthetic:vgg", "3x3 images have 4", "classes <= 4"), "%s", adt_error_message());
    adt_data_shape clash = s;
    clash.in_features = 100;
    ds = (adt_dataset *)&ds;
    rc = adt_dataset_open(&ds, "synthetic:vgg", &clash, NULL, 0);
    CHECK(failed_with(rc, ds, "synthetic:vgg", "in_features 100", "3x24x24 = 1728"), "%s", adt_error_message());
out:
    free(x);
    adt_dataset_free(tr), adt_dataset_free(tr2), adt_dataset_free(va);
}

/* The planted model: labels follow its probabilities (calibrated), its own AUC is >= 0.9, and
 * the signal is recoverable from data alone: per-row click rates of the effect tables, counted
 * on the training stream, rank the validation stream well. */
static void test_synthetic_dlrm(void) {
    enum { D = 13, K = 26, NTR = 200000, NVA = 20000 };
    adt_data_shape s = ctr_shape(D, K);
    s.table_rows[2] = 3;       /* a tiny table: many values collide */
    s.table_rows[9] = 5000000; /* a large one */
    adt_dataset *tr = open_ok("synthetic:dlrm", &s, 0), *va = open_ok("synthetic:dlrm", &s, 1),
                *sub = open_ok("synthetic:dlrm@1000:", &s, 0);
    float *x = malloc((size_t)NTR * D * sizeof(float)), *y = malloc(NTR * sizeof(float)),
          *p = malloc(NVA * sizeof(float));
    int32_t *c = malloc((size_t)NTR * K * sizeof(int32_t));
    int64_t *ids = malloc(NTR * sizeof(int64_t));
    if (!tr || !va || !sub) goto out;
    CHECK(adt_dataset_samples(tr) == ADT_SYN_DLRM_SAMPLES && adt_dataset_samples(va) == ADT_SYN_DLRM_VAL_SAMPLES &&
              adt_dataset_layout(tr) == ADT_DATA_CTR, "sizes");
    for (int i = 0; i < NTR; i++) ids[i] = i;

    /* determinism and ranges: sample 1000+k of the whole is sample k of "@1000:" */
    float x2[4 * D], y2[4];
    int32_t c2[4 * K];
    CHECK(adt_dataset_fill(tr, ids + 1000, 4, x, c, y) == ADT_OK && adt_dataset_fill(sub, ids, 4, x2, c2, y2) == ADT_OK,
          "%s", adt_error_message());
    CHECK(!memcmp(x, x2, sizeof x2) && !memcmp(c, c2, sizeof c2) && !memcmp(y, y2, sizeof y2), "range @1000:");

    /* training stream: ranges of rows and values */
    CHECK(adt_dataset_fill(tr, ids, NTR, x, c, y) == ADT_OK, "%s", adt_error_message());
    int bad = 0;
    for (int64_t i = 0; i < (int64_t)NTR * K; i++) bad += c[i] < 0 || c[i] >= s.table_rows[i % K];
    for (int64_t i = 0; i < (int64_t)NTR * D; i++) bad += !(x[i] >= 0 && x[i] < 20);
    for (int i = 0; i < NTR; i++) bad += y[i] != 0 && y[i] != 1;
    CHECK(bad == 0, "%d values out of range", bad);
    int distinct9 = 0;
    {
        char *seen = calloc((size_t)s.table_rows[9], 1);
        for (int i = 0; i < NTR; i++) distinct9 += !seen[c[(int64_t)i * K + 9]], seen[c[(int64_t)i * K + 9]] = 1;
        free(seen);
    }
    CHECK(distinct9 > 500 && distinct9 <= 1000, "table 9 uses %d rows (about 1000 values hashed)", distinct9);

    /* per-row click counts of tables 0..3 on the training stream */
    enum { RMAX = 1200 };
    static double clicks[4][RMAX], seen_[4][RMAX];
    memset(clicks, 0, sizeof clicks);
    memset(seen_, 0, sizeof seen_);
    double pos = 0;
    for (int i = 0; i < NTR; i++) {
        pos += y[i];
        for (int t = 0; t < 4; t++) {
            int r = c[(int64_t)i * K + t];
            if (r < RMAX) clicks[t][r] += y[i], seen_[t][r] += 1;
        }
    }
    double rate = pos / NTR;
    CHECK(rate > 0.15 && rate < 0.40, "positive rate %.3f", rate);

    /* validation stream: calibration, the planted model's AUC, and the count-based score's */
    CHECK(adt_dataset_fill(va, ids, NVA, x, c, y) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_dataset_planted_prob(va, ids, NVA, p) == ADT_OK, "%s", adt_error_message());
    double sum_p = 0, sum_y = 0;
    for (int i = 0; i < NVA; i++) sum_p += p[i], sum_y += y[i];
    double sd = sqrt(sum_p * (1 - sum_p / NVA));
    CHECK(fabs(sum_p - sum_y) < 4 * sd, "labels %.0f vs expected %.1f (sd %.1f)", sum_y, sum_p, sd);
    double bayes = 0, counted = 0;
    CHECK(adt_auc(p, y, NVA, &bayes) == ADT_OK, "%s", adt_error_message());
    CHECK(bayes >= 0.9, "planted model's AUC %.4f", bayes);
    float *score = malloc(NVA * sizeof(float));
    double prior = log(rate / (1 - rate));
    for (int i = 0; i < NVA; i++) {
        double z = prior;
        for (int t = 0; t < 4; t++) {
            int r = c[(int64_t)i * K + t];
            double a = r < RMAX ? clicks[t][r] : 0, n = r < RMAX ? seen_[t][r] : 0;
            double q = (a + 10 * rate) / (n + 10); /* smoothed toward the base rate */
            z += log(q / (1 - q)) - prior;
        }
        score[i] = (float)z;
    }
    CHECK(adt_auc(score, y, NVA, &counted) == ADT_OK, "%s", adt_error_message());
    CHECK(counted >= 0.78 && counted < bayes, "count-based AUC %.4f (planted %.4f)", counted, bayes);
    if (getenv("CHECK_VERBOSE"))
        fprintf(stderr, "  synthetic:dlrm: positives %.3f, planted AUC %.4f, count-based AUC %.4f, table 9 rows %d\n",
                rate, bayes, counted, distinct9);
    free(score);

    /* other kinds have no planted probability; smallest shapes work */
    CHECK(adt_dataset_planted_prob(sub, ids, 1, p) == ADT_OK, "%s", adt_error_message());
    adt_data_shape one = {0};
    one.n_tables = 1, one.table_rows[0] = 7;
    adt_dataset *small = open_ok("synthetic:dlrm", &one, 0);
    if (small) {
        float yy[8], dummy;
        int32_t cc[8];
        CHECK(adt_dataset_fill(small, ids, 8, &dummy, cc, yy) == ADT_OK, "%s", adt_error_message());
        for (int i = 0; i < 8; i++) CHECK(cc[i] >= 0 && cc[i] < 7, "row %d", cc[i]);
    }
    adt_dataset_free(small);
    adt_data_shape norows = ctr_shape(13, 26);
    norows.table_rows[25] = 0;
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open(&ds, "synthetic:dlrm", &norows, NULL, 0);
    CHECK(failed_with(rc, ds, "synthetic:dlrm", "table_rows[25] = 0", NULL), "%s", adt_error_message());
out:
    free(x), free(y), free(p), free(c), free(ids);
    adt_dataset_free(tr), adt_dataset_free(va), adt_dataset_free(sub);
}

static void test_synthetic_text_kind(void) {
    adt_data_shape s = seq_shape(64, 65);
    adt_dataset *tr = open_ok("synthetic:text", &s, 0);
    if (!tr) return;
    CHECK(adt_dataset_samples(tr) == (ADT_SYN_TEXT_TOKENS - 1) / 64, "%lld", (long long)adt_dataset_samples(tr));
    /* the validation stream with the training vocabulary; another vocabulary is refused */
    adt_dataset *va = NULL;
    CHECK(adt_dataset_open(&va, "synthetic:text", &s, adt_dataset_vocab(tr), 1) == ADT_OK, "%s", adt_error_message());
    if (va) CHECK(adt_dataset_samples(va) == (ADT_SYN_TEXT_VAL_TOKENS - 1) / 64, "val size");
    adt_dataset_free(va);
    adt_text_vocab other;
    adt_text_vocab_from_bytes(&other, "abc", 3);
    va = (adt_dataset *)&va;
    int rc = adt_dataset_open(&va, "synthetic:text", &s, &other, 1);
    CHECK(failed_with(rc, va, "synthetic:text", "vocabulary", NULL), "%s", adt_error_message());
    adt_dataset_free(tr);
}

static void test_fill_errors(void) {
    adt_data_shape s = ctr_shape(13, 26);
    adt_dataset *ds = open_ok("synthetic:dlrm@0:10", &s, 0);
    if (!ds) return;
    float x[13], y;
    int32_t c[26];
    int64_t id = 10, neg = -1, ok = 9;
    CHECK(adt_dataset_fill(ds, &id, 1, x, c, &y) == ADT_ERR_ARG && contains(adt_error_message(), "sample 10 out of range"),
          "%s", adt_error_message());
    CHECK(adt_dataset_fill(ds, &neg, 1, x, c, &y) == ADT_ERR_ARG, "negative id");
    CHECK(adt_dataset_fill(ds, &ok, 1, x, NULL, &y) == ADT_ERR_ARG && contains(adt_error_message(), "input2"), "%s",
          adt_error_message());
    CHECK(adt_dataset_fill(ds, &ok, 1, x, c, &y) == ADT_OK, "%s", adt_error_message());
    adt_dataset_free(ds);
    adt_data_shape m = class_shape(8, 3);
    ds = open_ok("synthetic:mlp", &m, 0);
    if (!ds) return;
    float p;
    CHECK(adt_dataset_planted_prob(ds, &ok, 1, &p) == ADT_ERR_UNSUPPORTED, "no planted prob for mlp");
    adt_dataset_free(ds);
}

/* ==== AUC =================================================================================== */

static double brute_auc(const float *s, const float *y, int n) {
    double num = 0, pairs = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (y[i] == 1 && y[j] == 0) {
                pairs += 1;
                num += s[i] > s[j] ? 1 : s[i] == s[j] ? 0.5 : 0;
            }
    return num / pairs;
}

static void test_auc(void) {
    /* scikit-learn's roc_auc_score documentation example: 0.75 */
    float s4[4] = {0.1f, 0.4f, 0.35f, 0.8f}, y4[4] = {0, 0, 1, 1};
    double a;
    CHECK(adt_auc(s4, y4, 4, &a) == ADT_OK, "%s", adt_error_message());
    CHECK_CLOSE(a, 0.75, 0, 1e-12);
    float yp[4] = {0, 0, 1, 1}, sp[4] = {1, 2, 3, 4}, sr[4] = {4, 3, 2, 1}, st[4] = {5, 5, 5, 5};
    CHECK(adt_auc(sp, yp, 4, &a) == ADT_OK && a == 1.0, "perfect %g", a);
    CHECK(adt_auc(sr, yp, 4, &a) == ADT_OK && a == 0.0, "reversed %g", a);
    CHECK(adt_auc(st, yp, 4, &a) == ADT_OK && a == 0.5, "all tied %g", a);
    /* random scores on a coarse grid (many ties) against the pair count */
    enum { N = 700 };
    float s[N], y[N];
    for (int trial = 0; trial < 3; trial++) {
        for (int i = 0; i < N; i++) {
            y[i] = adt_rng_uniform(11 + trial, (uint64_t)i) < 0.3f ? 1.0f : 0.0f;
            s[i] = (float)(int)(8 * adt_rng_uniform(21 + trial, (uint64_t)i) + 2 * y[i] * trial) / 4.0f;
        }
        CHECK(adt_auc(s, y, N, &a) == ADT_OK, "%s", adt_error_message());
        CHECK_CLOSE(a, brute_auc(s, y, N), 0, 1e-12);
    }
    float bad[2] = {0, 2}, one[2] = {1, 1}, nan_s[2] = {NAN, 1}, yy[2] = {0, 1};
    CHECK(adt_auc(s4, bad, 2, &a) == ADT_ERR_ARG && contains(adt_error_message(), "label 2"), "%s", adt_error_message());
    CHECK(adt_auc(s4, one, 2, &a) == ADT_ERR_ARG && contains(adt_error_message(), "undefined"), "%s", adt_error_message());
    CHECK(adt_auc(nan_s, yy, 2, &a) == ADT_ERR_ARG && contains(adt_error_message(), "NaN"), "%s", adt_error_message());
    CHECK(adt_auc(s4, y4, 0, &a) == ADT_ERR_ARG, "n = 0");
}

/* ==== the shipped real data ================================================================= */

/* MNIST t10k: 10000 images; the first label is 7 (LeCun's test set); pixels equal the bytes
 * zlib's gzread returns, at offset 16 of the decompressed file. */
static void test_real_mnist(void) {
    const char *img = SHARED "/mnist/t10k-images-idx3-ubyte.gz";
    if (access(img, R_OK) != 0) {
        fprintf(stderr, "  note: %s absent, real MNIST not checked\n", img);
        return;
    }
    adt_data_shape s = class_shape(784, 10);
    adt_dataset *ds = open_ok("mnist:" SHARED "/mnist/t10k", &s, 0);
    if (!ds) return;
    CHECK(adt_dataset_samples(ds) == 10000, "%lld", (long long)adt_dataset_samples(ds));
    int64_t ids[3] = {0, 1, 9999};
    static float x[3 * 784];
    int32_t y[3];
    CHECK(adt_dataset_fill(ds, ids, 3, x, NULL, y) == ADT_OK, "%s", adt_error_message());
    CHECK(y[0] == 7 && y[1] == 2, "first labels %d %d, expected 7 2", y[0], y[1]);
    gzFile g = gzopen(img, "rb");
    static uint8_t raw[16 + 2 * 784];
    int got = g ? gzread(g, raw, sizeof raw) : -1;
    if (g) gzclose(g);
    CHECK(got == (int)sizeof raw, "gzread %d", got);
    double worst = 0;
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 784; j++) worst = fmax(worst, fabs(x[k * 784 + j] - raw[16 + k * 784 + j] / 255.0));
    CHECK(worst < 1e-6, "pixels differ from the raw bytes by %g", worst);
    adt_dataset_free(ds);
    ds = open_ok("mnist:" SHARED "/mnist/t10k@8000:", &s, 0);
    if (ds) CHECK(adt_dataset_samples(ds) == 2000, "tail split");
    adt_dataset_free(ds);
}

/* The Criteo samples parse; positives match ../shared/data/README.md (49 of 200, 29 of 100). */
static void test_real_criteo(void) {
    struct { const char *file; int64_t rows, pos; } f[] = {
        {SHARED "/criteo/criteo_sample.txt", 200, 49},
        {SHARED "/criteo/paddlerec_sample_train.txt", 100, 29},
        {SHARED "/criteo/paddlerec_sample_test.txt", 100, -1},
    };
    adt_data_shape s = ctr_shape(13, 26);
    for (int i = 0; i < 3; i++) {
        if (access(f[i].file, R_OK) != 0) {
            fprintf(stderr, "  note: %s absent, not checked\n", f[i].file);
            continue;
        }
        char spec[600];
        snprintf(spec, sizeof spec, "criteo:%s", f[i].file);
        adt_dataset *ds = open_ok(spec, &s, 0);
        if (!ds) continue;
        int64_t n = adt_dataset_samples(ds);
        CHECK(n == f[i].rows, "%s: %lld rows", f[i].file, (long long)n);
        float *x = malloc((size_t)n * 13 * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
        int32_t *c = malloc((size_t)n * 26 * sizeof(int32_t));
        int64_t *ids = malloc((size_t)n * sizeof(int64_t));
        for (int64_t k = 0; k < n; k++) ids[k] = k;
        CHECK(adt_dataset_fill(ds, ids, (int)n, x, c, y) == ADT_OK, "%s", adt_error_message());
        double pos = 0;
        for (int64_t k = 0; k < n; k++) pos += y[k];
        if (f[i].pos >= 0) CHECK(pos == f[i].pos, "%s: %g positives, expected %lld", f[i].file, pos, (long long)f[i].pos);
        if (i == 0) {
            /* row 1: ",,3,260.0,,17668.0,..."; row 2: I2 = -1 clamps to 0 */
            CHECK(x[0] == 0 && fabs(x[1] - log(4.0)) < 1e-6 && fabs(x[2] - log(261.0)) < 1e-6 &&
                      fabs(x[4] - log(17669.0)) < 1e-5 && x[13 + 1] == 0,
                  "dense %g %g %g %g %g", x[0], x[1], x[2], x[4], x[14]);
            CHECK(c[0] == ref_criteo_row("05db9164", 0, s.table_rows[0]) &&
                      c[25] == ref_criteo_row("", 25, s.table_rows[25]),
                  "categorical rows");
        }
        free(x), free(y), free(c), free(ids);
        adt_dataset_free(ds);
    }
}

int main(void) {
    if (check_tmpdir_make("loaders")) return 2;
    RUN(test_spec_errors);
    RUN(test_text_kind_and_range);
    RUN(test_tokens_files);
    RUN(test_tokens_errors);
    RUN(test_mnist_plain_and_gz);
    RUN(test_mnist_errors);
    RUN(test_criteo_formats);
    RUN(test_criteo_errors);
    RUN(test_synthetic_mlp);
    RUN(test_synthetic_vgg);
    RUN(test_synthetic_dlrm);
    RUN(test_synthetic_text_kind);
    RUN(test_fill_errors);
    RUN(test_auc);
    RUN(test_real_mnist);
    RUN(test_real_criteo);
    static const char *const files[] = {
        "range.txt", "a@b.txt", "t2.tok", "t4.tok", "short.tok", "c.tsv", "c.csv", "crlf.tsv",
        "m0-images-idx3-ubyte", "m0-labels-idx1-ubyte", "m0-labels-idx1-ubyte.gz",
        "m1-images-idx3-ubyte.gz", "m1-labels-idx1-ubyte.gz", "m2-images-idx3-ubyte", "m2-labels-idx1-ubyte.gz",
        "m3-images-idx3-ubyte.gz", "m3-labels-idx1-ubyte", "gz-images-idx3-ubyte.gz"};
    check_tmpdir_remove(files, sizeof files / sizeof files[0]);
    return check_finish();
}
