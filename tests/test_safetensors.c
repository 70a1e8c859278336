/*
 * test_safetensors.c - the safetensors reader and writer: round trips over every dtype and shape
 * kind (0-d, empty), metadata, atomic save, a file written by PyTorch, and one clear error (never
 * a crash) for each way a file can be malformed.
 */
#include "adtrain/base.h"
#include "adtrain/safetensors.h"

#include "check.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>


static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int write_bytes(const char *path, const void *buf, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(buf, 1, n, fp);
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(b, 1, (size_t)sz, fp);
    fclose(fp);
    return b;
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------------------------------------- */

static void test_dtype_table(void) {
    adt_st_dtype d;
    for (int i = 0; i < ADT_ST_NUM_DTYPES; i++) {
        const char *name = adt_st_dtype_name((adt_st_dtype)i);
        CHECK(adt_st_dtype_parse(name, &d) == ADT_OK && d == (adt_st_dtype)i, "dtype %s", name);
        CHECK(adt_st_dtype_size((adt_st_dtype)i) > 0, "size of %s", name);
    }
    CHECK(adt_st_dtype_size(ADT_ST_BF16) == 2 && adt_st_dtype_size(ADT_ST_I64) == 8, "sizes");
    CHECK(adt_st_dtype_parse("f32", &d) == ADT_ERR_ARG, "dtype names are case-sensitive");
    CHECK(contains(adt_error_message(), "unknown dtype 'f32'"), "%s", adt_error_message());
    CHECK(strcmp(adt_st_dtype_name(ADT_ST_NUM_DTYPES), "?") == 0, "out of range name");
}

/* Every dtype, a 0-d tensor, empty tensors, metadata; file and memory paths agree. */
static void test_round_trip(void) {
    float f32[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e30f};
    int32_t i32[4] = {1, -2, INT32_MAX, INT32_MIN};
    int64_t i64[4] = {INT64_MAX, INT64_MIN, 0, -7};
    uint16_t bf16[3] = {0x3f80, 0xc020, 0x7f80}; /* 1, -2.5, inf */
    uint16_t f16[3] = {0x3c00, 0xb800, 0x0001};  /* 1, -0.5, 2^-24 */
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    double f64[1] = {3.141592653589793};
    float scalar = 42.0f;
    int64_t s23[] = {2, 3}, s4[] = {4}, s22[] = {2, 2}, s3[] = {3}, s5[] = {5}, s1[] = {1};
    int64_t s04[] = {0, 4}, s302[] = {3, 0, 2};
    int64_t s8d[8] = {1, 1, 1, 1, 1, 1, 2, 3};

    adt_st_writer *w = adt_st_writer_create();
    CHECK(adt_st_writer_add(w, "f32", ADT_ST_F32, 2, s23, f32) == ADT_OK, "%s",
          adt_error_message());
    CHECK(adt_st_writer_add(w, "u8", ADT_ST_U8, 1, s5, u8) == ADT_OK, "u8");
    CHECK(adt_st_writer_add(w, "i32", ADT_ST_I32, 1, s4, i32) == ADT_OK, "i32");
    CHECK(adt_st_writer_add(w, "i64", ADT_ST_I64, 2, s22, i64) == ADT_OK, "i64");
    CHECK(adt_st_writer_add(w, "bf16", ADT_ST_BF16, 1, s3, bf16) == ADT_OK, "bf16");
    CHECK(adt_st_writer_add(w, "f16", ADT_ST_F16, 1, s3, f16) == ADT_OK, "f16");
    CHECK(adt_st_writer_add(w, "f64", ADT_ST_F64, 1, s1, f64) == ADT_OK, "f64");
    CHECK(adt_st_writer_add(w, "scalar", ADT_ST_F32, 0, NULL, &scalar) == ADT_OK, "0-d");
    CHECK(adt_st_writer_add(w, "empty", ADT_ST_F32, 2, s04, NULL) == ADT_OK, "empty");
    CHECK(adt_st_writer_add(w, "empty3", ADT_ST_I64, 3, s302, NULL) == ADT_OK, "empty 3-d");
    CHECK(adt_st_writer_add(w, "eight.dims", ADT_ST_F32, 8, s8d, f32) == ADT_OK, "8-d");
    {
        /* add_copy must not depend on the buffer after the call */
        float tmp[2] = {7.0f, 8.0f};
        int64_t s2[] = {2};
        CHECK(adt_st_writer_add_copy(w, "copied \"quoted\" name", ADT_ST_F32, 1, s2, tmp) ==
                  ADT_OK,
              "copy");
        tmp[0] = tmp[1] = -1.0f;
    }
    CHECK(adt_st_writer_set_metadata(w, "format", "pt") == ADT_OK, "meta");
    CHECK(adt_st_writer_set_metadata(w, "step", "1") == ADT_OK, "meta");
    CHECK(adt_st_writer_set_metadata(w, "step", "1200") == ADT_OK, "meta replace");

    const char *path = check_tmp_path("round.safetensors");
    CHECK(adt_st_writer_save(w, path) == ADT_OK, "%s", adt_error_message());
    CHECK(!file_exists(check_tmp_path("round.safetensors.tmp")), "temporary file left behind");
    void *mem;
    size_t mem_n;
    CHECK(adt_st_writer_serialize(w, &mem, &mem_n) == ADT_OK, "serialize");
    adt_st_writer_free(w);

    size_t disk_n = 0;
    unsigned char *disk = read_bytes(path, &disk_n);
    CHECK(disk && disk_n == mem_n && memcmp(disk, mem, mem_n) == 0, "save == serialize");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ((unsigned char *)mem)[i];
    CHECK(hlen % 8 == 0, "header padded to 8 bytes: %llu", (unsigned long long)hlen);
    CHECK(((char *)mem)[8] == '{', "header starts with '{'");
    free(disk);

    for (int pass = 0; pass < 2; pass++) {
        adt_st_file *f = NULL;
        int rc = pass == 0 ? adt_st_open(&f, path) : adt_st_open_memory(&f, "mem", mem, mem_n);
        CHECK(rc == ADT_OK, "pass %d: %s", pass, adt_error_message());
        if (rc != ADT_OK) continue;
        CHECK(adt_st_count(f) == 12, "count %d", adt_st_count(f));
        /* insertion order is file order */
        const char *order[] = {"f32",   "u8",     "i32",        "i64",   "bf16",
                               "f16",   "f64",    "scalar",     "empty", "empty3",
                               "eight.dims", "copied \"quoted\" name"};
        for (int i = 0; i < 12; i++) {
            const adt_st_tensor *t = adt_st_get(f, i);
            /* empty tensors share an offset with their neighbour; their order may vary */
            if (t->nbytes) CHECK(strcmp(t->name, order[i]) == 0, "order %d: %s", i, t->name);
        }
        CHECK(adt_st_get(f, 12) == NULL && adt_st_get(f, -1) == NULL, "get out of range");

        const adt_st_tensor *t = adt_st_find(f, "f32");
        CHECK(t && t->dtype == ADT_ST_F32 && t->ndim == 2 && t->shape[0] == 2 &&
                  t->shape[1] == 3 && t->nbytes == 24 && memcmp(t->data, f32, 24) == 0,
              "f32");
        CHECK(((uintptr_t)t->data % 8) == 0, "first tensor 8-byte aligned");
        t = adt_st_find(f, "u8");
        CHECK(t && t->dtype == ADT_ST_U8 && t->nbytes == 5 && memcmp(t->data, u8, 5) == 0, "u8");
        t = adt_st_find(f, "i32");
        CHECK(t && t->dtype == ADT_ST_I32 && memcmp(t->data, i32, 16) == 0, "i32");
        t = adt_st_find(f, "i64");
        CHECK(t && t->dtype == ADT_ST_I64 && t->ndim == 2 && memcmp(t->data, i64, 32) == 0,
              "i64");
        t = adt_st_find(f, "bf16");
        CHECK(t && t->dtype == ADT_ST_BF16 && memcmp(t->data, bf16, 6) == 0, "bf16");
        t = adt_st_find(f, "f16");
        CHECK(t && t->dtype == ADT_ST_F16 && memcmp(t->data, f16, 6) == 0, "f16");
        t = adt_st_find(f, "f64");
        CHECK(t && t->dtype == ADT_ST_F64 && memcmp(t->data, f64, 8) == 0, "f64");
        t = adt_st_find(f, "scalar");
        CHECK(t && t->ndim == 0 && t->nbytes == 4 && memcmp(t->data, &scalar, 4) == 0, "0-d");
        t = adt_st_find(f, "empty");
        CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 4 && t->nbytes == 0 &&
                  t->data != NULL,
              "empty");
        t = adt_st_find(f, "empty3");
        CHECK(t && t->ndim == 3 && t->shape[1] == 0 && t->nbytes == 0, "empty 3-d");
        t = adt_st_find(f, "eight.dims");
        CHECK(t && t->ndim == 8 && t->shape[7] == 3 && t->nbytes == 24, "8-d");
        t = adt_st_find(f, "copied \"quoted\" name");
        float got[2] = {0, 0};
        if (t) memcpy(got, t->data, 8);
        CHECK(t && got[0] == 7.0f && got[1] == 8.0f, "copied tensor kept its values");
        CHECK(adt_st_find(f, "missing") == NULL && adt_st_find(f, "") == NULL, "find missing");

        CHECK(adt_st_metadata_count(f) == 2, "metadata count");
        CHECK(adt_st_metadata(f, "format") && strcmp(adt_st_metadata(f, "format"), "pt") == 0,
              "metadata format");
        CHECK(adt_st_metadata(f, "step") && strcmp(adt_st_metadata(f, "step"), "1200") == 0,
              "metadata replaced");
        CHECK(adt_st_metadata(f, "nope") == NULL, "metadata missing");
        const char *k, *v;
        CHECK(adt_st_metadata_get(f, 0, &k, &v) == ADT_OK && strcmp(k, "format") == 0, "get 0");
        CHECK(adt_st_metadata_get(f, 2, &k, &v) == ADT_ERR_ARG, "get out of range");
        CHECK(strcmp(adt_st_name(f), pass == 0 ? path : "mem") == 0, "name");
        adt_st_close(f);
    }
    free(mem);
}

/* A file with no tensors and no metadata is valid: "{}" padded, empty buffer. */
static void test_empty_file(void) {
    adt_st_writer *w = adt_st_writer_create();
    void *mem;
    size_t n;
    CHECK(adt_st_writer_serialize(w, &mem, &n) == ADT_OK && n == 16, "n=%zu", n);
    adt_st_writer_free(w);
    adt_st_file *f;
    CHECK(adt_st_open_memory(&f, NULL, mem, n) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_st_count(f) == 0 && adt_st_find(f, "x") == NULL && adt_st_metadata_count(f) == 0,
          "empty");
    CHECK(strcmp(adt_st_name(f), "<memory>") == 0, "default name");
    adt_st_close(f);
    free(mem);
}

/* Many tensors, so that find's sorted index is exercised beyond a handful of entries. */
static void test_many_tensors(void) {
    enum { N = 300 };
    static float vals[N];
    adt_st_writer *w = adt_st_writer_create();
    int64_t s1[] = {1};
    char name[64];
    for (int i = 0; i < N; i++) {
        vals[i] = (float)i;
        snprintf(name, sizeof name, "layer.%d.w", (i * 7919) % N);
        CHECK(adt_st_writer_add(w, name, ADT_ST_F32, 1, s1, &vals[i]) == ADT_OK, "add %d", i);
    }
    void *mem;
    size_t n;
    CHECK(adt_st_writer_serialize(w, &mem, &n) == ADT_OK, "serialize");
    adt_st_writer_free(w);
    adt_st_file *f;
    CHECK(adt_st_open_memory(&f, "many", mem, n) == ADT_OK, "%s", adt_error_message());
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%d.w", (i * 7919) % N);
        float v = -1;
        CHECK(adt_st_read_f32(f, name, &v, 1, s1) == ADT_OK && v == (float)i, "%s", name);
    }
    adt_st_close(f);
    free(mem);
}

static void test_read_helpers(void) {
    float w[32 * 96];
    for (int i = 0; i < 32 * 96; i++) w[i] = (float)i * 0.25f;
    uint16_t bf[4] = {0x3f80, 0xc020, 0x4049, 0x8000}; /* 1, -2.5, 3.140625, -0 */
    uint16_t hf[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0xfc00};
    int64_t ids64[3] = {5, -3, (int64_t)1 << 40};
    int32_t ids32[3] = {4, 5, 6};
    int64_t sw[] = {32, 96}, s4[] = {4}, s6[] = {6}, s3[] = {3};
    adt_st_writer *wr = adt_st_writer_create();
    adt_st_writer_add(wr, "h.0.attn.c_attn.weight", ADT_ST_F32, 2, sw, w);
    adt_st_writer_add(wr, "bf", ADT_ST_BF16, 1, s4, bf);
    adt_st_writer_add(wr, "hf", ADT_ST_F16, 1, s6, hf);
    adt_st_writer_add(wr, "ids64", ADT_ST_I64, 1, s3, ids64);
    adt_st_writer_add(wr, "ids32", ADT_ST_I32, 1, s3, ids32);
    const char *path = check_tmp_path("ckpt.safetensors");
    CHECK(adt_st_writer_save(wr, path) == ADT_OK, "%s", adt_error_message());
    adt_st_writer_free(wr);
    adt_st_file *f;
    if (adt_st_open(&f, path) != ADT_OK) {
        CHECK(0, "open: %s", adt_error_message());
        return;
    }

    static float dst[32 * 96];
    CHECK(adt_st_read_f32(f, "h.0.attn.c_attn.weight", dst, 2, sw) == ADT_OK, "read");
    CHECK(memcmp(dst, w, sizeof w) == 0, "values");

    int64_t wrong[] = {32, 64};
    int rc = adt_st_read_f32(f, "h.0.attn.c_attn.weight", dst, 2, wrong);
    char want[512];
    snprintf(want, sizeof want,
             "%s: tensor 'h.0.attn.c_attn.weight' has shape [32,96], the model expects [32,64]",
             path);
    CHECK(rc == ADT_ERR_SHAPE && strcmp(adt_error_message(), want) == 0, "got '%s'",
          adt_error_message());
    rc = adt_st_read_f32(f, "h.0.attn.c_attn.weight", dst, 1, sw);
    CHECK(rc == ADT_ERR_SHAPE && contains(adt_error_message(), "the model expects [32]"), "%s",
          adt_error_message());
    rc = adt_st_read_f32(f, "h.1.attn.c_attn.weight", dst, 2, sw);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "no tensor named "
                                                                "'h.1.attn.c_attn.weight'"),
          "%s", adt_error_message());

    float v[6];
    CHECK(adt_st_read_f32(f, "bf", v, 1, s4) == ADT_OK, "bf16");
    CHECK(v[0] == 1.0f && v[1] == -2.5f && v[2] == 3.140625f && v[3] == 0.0f && signbit(v[3]),
          "bf16 values %g %g %g %g", v[0], v[1], v[2], v[3]);
    CHECK(adt_st_read_f32(f, "hf", v, 1, s6) == ADT_OK, "f16");
    CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 65504.0f && v[3] == ldexpf(1, -24) &&
              v[4] == ldexpf(1023, -24) && isinf(v[5]) && v[5] < 0,
          "f16 values %g %g %g %g %g %g", v[0], v[1], v[2], v[3], v[4], v[5]);
    rc = adt_st_read_f32(f, "ids32", v, 1, s3);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "tensor 'ids32' has dtype I32"),
          "%s", adt_error_message());

    int32_t ids[3];
    CHECK(adt_st_read_i32(f, "ids32", ids, 1, s3) == ADT_OK && ids[2] == 6, "i32");
    rc = adt_st_read_i32(f, "ids64", ids, 1, s3);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "element 2 is 1099511627776"),
          "%s", adt_error_message());
    rc = adt_st_read_i32(f, "bf", ids, 1, s4);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "dtype BF16"), "%s",
          adt_error_message());
    CHECK(adt_st_read_f32(f, "bf", v, 9, s4) == ADT_ERR_ARG, "ndim out of range");
    adt_st_close(f);
}

/* tests/fixtures/torch_small.safetensors holds tensors written from PyTorch tensors' bytes. */
static void test_torch_fixture(void) {
    const char *dir = getenv("ADT_FIXTURE_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/torch_small.safetensors", dir ? dir : "tests/fixtures");
    adt_st_file *f;
    if (adt_st_open(&f, path) != ADT_OK) {
        CHECK(0, "%s", adt_error_message());
        return;
    }
    CHECK(adt_st_count(f) == 8, "count %d", adt_st_count(f));
    CHECK(adt_st_metadata(f, "format") && strcmp(adt_st_metadata(f, "format"), "pt") == 0,
          "metadata");

    int64_t s23[] = {2, 3}, s4[] = {4}, s32[] = {3, 2}, s04[] = {0, 4};
    float v[6];
    CHECK(adt_st_read_f32(f, "f32", v, 2, s23) == ADT_OK, "%s", adt_error_message());
    for (int i = 0; i < 6; i++) CHECK(v[i] == (float)i * 0.5f - 1.0f, "f32[%d]=%g", i, v[i]);
    CHECK(adt_st_read_f32(f, "f16", v, 1, s4) == ADT_OK, "%s", adt_error_message());
    CHECK(v[0] == 1.0f && v[1] == -0.5f && v[2] == 65504.0f && v[3] == ldexpf(1, -24),
          "f16 %g %g %g %g", v[0], v[1], v[2], v[3]);
    CHECK(adt_st_read_f32(f, "bf16", v, 1, s4) == ADT_OK, "%s", adt_error_message());
    CHECK(v[0] == 1.0f && v[1] == -2.5f && v[2] == 3.140625f && v[3] == -0.0078125f,
          "bf16 %g %g %g %g", v[0], v[1], v[2], v[3]);
    int32_t i32[6];
    CHECK(adt_st_read_i32(f, "i32", i32, 2, s32) == ADT_OK, "%s", adt_error_message());
    CHECK(i32[0] == 1 && i32[1] == -2 && i32[4] == 5 && i32[5] == INT32_MAX, "i32 values");
    const adt_st_tensor *t = adt_st_find(f, "i64");
    int64_t i64[4] = {0, 0, 0, 0};
    if (t && t->nbytes == sizeof i64) memcpy(i64, t->data, sizeof i64);
    CHECK(t && t->dtype == ADT_ST_I64 && i64[0] == -((int64_t)1 << 40) &&
              i64[2] == ((int64_t)1 << 40) + 7 && i64[3] == (int64_t)1 << 62,
          "i64 values");
    t = adt_st_find(f, "u8");
    CHECK(t && t->dtype == ADT_ST_U8 && t->nbytes == 3 && ((const uint8_t *)t->data)[2] == 255,
          "u8");
    float s = 0;
    CHECK(adt_st_read_f32(f, "scalar", &s, 0, NULL) == ADT_OK && s == 3.5f, "scalar %g", s);
    CHECK(adt_st_read_f32(f, "empty", v, 2, s04) == ADT_OK, "%s", adt_error_message());
    t = adt_st_find(f, "empty");
    CHECK(t && t->nbytes == 0 && t->ndim == 2 && t->shape[0] == 0, "empty");
    adt_st_close(f);
}

/* ------------------------------------------------------------------------------------------- */
/* Malformed files: an 8-byte length, the given header text, then data_len bytes. */

static unsigned char *make_raw(const char *hdr, size_t data_len, size_t *n) {
    size_t h = strlen(hdr);
    *n = 8 + h + data_len;
    unsigned char *b = calloc(1, *n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    return b;
}

/* Opens the raw file from memory and from disk; both must fail with `code` and a message that
 * names the file and contains each of the given fragments. */
static void expect_bad(const char *hdr, size_t data_len, int code, const char *frag1,
                       const char *frag2) {
    size_t n;
    unsigned char *b = make_raw(hdr, data_len, &n);
    const char *path = check_tmp_path("bad.safetensors");
    write_bytes(path, b, n);
    for (int pass = 0; pass < 2; pass++) {
        adt_st_file *f = (adt_st_file *)1;
        int rc = pass == 0 ? adt_st_open_memory(&f, "bad.safetensors", b, n)
                           : adt_st_open(&f, path);
        const char *m = adt_error_message();
        CHECK(rc == code, "header %s: rc %d, message %s", hdr, rc, m);
        CHECK(f == NULL, "out is NULL on failure");
        CHECK(contains(m, "bad.safetensors: "), "message names the file: %s", m);
        CHECK(!frag1 || contains(m, frag1), "header %s: '%s' not in '%s'", hdr, frag1, m);
        CHECK(!frag2 || contains(m, frag2), "header %s: '%s' not in '%s'", hdr, frag2, m);
        if (pass == 0 && getenv("CHECK_VERBOSE")) fprintf(stderr, "    %s\n", m);
        if (rc == ADT_OK) adt_st_close(f);
    }
    free(b);
}

static void expect_good(const char *hdr, size_t data_len, int count) {
    size_t n;
    unsigned char *b = make_raw(hdr, data_len, &n);
    adt_st_file *f;
    int rc = adt_st_open_memory(&f, "good", b, n);
    CHECK(rc == ADT_OK, "header %s: %s", hdr, adt_error_message());
    if (rc == ADT_OK) {
        CHECK(adt_st_count(f) == count, "count %d", adt_st_count(f));
        adt_st_close(f);
    }
    free(b);
}

static void test_malformed_header(void) {
    const int E = ADT_ERR_FORMAT;
    expect_bad("{\"a\": {\"dtype\": \"F32\",", 0, E, "not valid JSON", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0,4]}", 4, E,
               "not valid JSON", NULL);
    expect_bad("[1, 2]", 0, E, "does not start with '{'", NULL);
    expect_bad("", 0, E, "header length is 0", NULL);
    expect_bad(" {}", 0, E, "does not start with '{'", NULL);
    expect_bad("{} x", 0, E, "data after its JSON object", "\"x\"");
    expect_bad("{\"a\": 5}", 0, E, "tensor 'a' is a number", "expected an object");
    expect_bad("{\"a\": {\"shape\": [1], \"data_offsets\": [0,4]}}", 4, E,
               "tensor 'a' has no \"dtype\"", NULL);
    expect_bad("{\"a\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0,4]}}", 4, E,
               "\"dtype\" is a number", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F31\", \"shape\": [1], \"data_offsets\": [0,4]}}", 4, E,
               "tensor 'a'", "unknown dtype 'F31'");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0,4]}}", 4, E,
               "tensor 'a' has no \"shape\"", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": 4, \"data_offsets\": [0,4]}}", 4, E,
               "\"shape\" is a number", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0,4]}}", 4, E,
               "tensor 'a': shape[0] is -1", "non-negative integer");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 1.5], \"data_offsets\": [0,4]}}", 4,
               E, "shape[1] is 1.5", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0,8]}}", 8,
               E, "shape[0] is a string", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0,4]}}", 4,
               E, "shape[0]", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
               "\"data_offsets\": [0,4]}}",
               4, E, "9 dimensions", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, E,
               "tensor 'a' has no \"data_offsets\"", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0,4,8]}}", 8, E,
               "\"data_offsets\" must be [begin, end]", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4,0]}}", 4, E,
               "\"data_offsets\" must be", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8,4]}}", 8, E,
               "data_offsets [8,4] end before they begin", NULL);
    expect_bad("{\"__metadata__\": {\"k\": 1}}", 0, E, "\"__metadata__\" entry 'k' is a number",
               "expected a string");
    expect_bad("{\"__metadata__\": [\"k\"]}", 0, E, "\"__metadata__\" is an array", NULL);
    expect_bad("{\"__metadata__\": {}, \"__metadata__\": {}}", 0, E, "appears twice", NULL);

    /* padding must be spaces: NUL bytes after the object are not JSON whitespace */
    unsigned char nul_pad[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', 0, 0, 0, 0};
    adt_st_file *f;
    int rc = adt_st_open_memory(&f, "nul.safetensors", nul_pad, sizeof nul_pad);
    CHECK(rc == E && contains(adt_error_message(), "data after its JSON object (at byte 4: "
                                                   "\"\\x00\\x00\\x00\\x00\")"),
          "%s", adt_error_message());
    nul_pad[12] = nul_pad[13] = nul_pad[14] = nul_pad[15] = ' ';
    rc = adt_st_open_memory(&f, "sp.safetensors", nul_pad, sizeof nul_pad);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc == ADT_OK) adt_st_close(f);
}

static void test_malformed_layout(void) {
    const int E = ADT_ERR_FORMAT;
    /* offsets past the end of the data buffer */
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [25], \"data_offsets\": [0,100]}}", 16, E,
               "tensor 'w': data_offsets [0,100] run past the end of the 16-byte data buffer",
               NULL);
    /* byte count disagrees with the shape */
    expect_bad("{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0,8]}}", 8, E,
               "tensor 'w': shape [3] of F32 needs 12 bytes, but data_offsets [0,8] span 8",
               NULL);
    expect_bad("{\"w\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [0,4]}}", 4, E,
               "shape [] of BF16 needs 2 bytes", NULL);
    /* shape product overflows */
    expect_bad("{\"w\": {\"dtype\": \"F64\", \"shape\": [4294967296, 4294967296], "
               "\"data_offsets\": [0,8]}}",
               8, E, "overflows", NULL);
    /* overlapping tensors */
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0,8]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4,12]}}",
               12, E, "tensors 'a' [0,8] and 'b' [4,12] overlap", NULL);
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0,16]},"
               " \"c\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [16,20]},"
               " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8,12]}}",
               20, E, "tensors 'a' [0,16] and 'b' [8,12] overlap", NULL);
    /* duplicate names (JSON allows repeated keys; a checkpoint must not) */
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0,4]},"
               " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4,8]}}",
               8, E, "tensor name 'a' appears more than once", NULL);

    /* Not errors: an empty tensor inside another's range, a gap, trailing unused bytes,
     * whitespace padding of every JSON kind. */
    expect_good("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0,16]},"
                " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8,8]}}",
                16, 2);
    expect_good("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8,12]}}", 16, 1);
    expect_good("{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0,1], "
                "\"extra\": true}}  \n\t ",
                1, 1);
}

/* Damage to the length prefix and the file's size. */
static void test_truncated(void) {
    /* a valid file, then every prefix of it must be rejected cleanly */
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t s8[] = {8};
    adt_st_writer *wr = adt_st_writer_create();
    adt_st_writer_add(wr, "w", ADT_ST_F32, 1, s8, w);
    void *mem;
    size_t n;
    CHECK(adt_st_writer_serialize(wr, &mem, &n) == ADT_OK, "serialize");
    adt_st_writer_free(wr);
    for (size_t k = 0; k < n; k++) {
        adt_st_file *f;
        int rc = adt_st_open_memory(&f, "cut.safetensors", mem, k);
        CHECK(rc == ADT_ERR_FORMAT && f == NULL, "prefix %zu accepted", k);
        CHECK(contains(adt_error_message(), "cut.safetensors: "), "%s", adt_error_message());
    }
    /* truncated inside the data: the message points at the tensor and says why */
    adt_st_file *f;
    int rc = adt_st_open_memory(&f, "cut.safetensors", mem, n - 4);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "tensor 'w'") &&
              contains(adt_error_message(), "truncated file?"),
          "%s", adt_error_message());
    /* truncated inside the header */
    rc = adt_st_open_memory(&f, "cut.safetensors", mem, 20);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "exceeds the 12 bytes"), "%s",
          adt_error_message());
    /* the same through a real, truncated file */
    const char *path = check_tmp_path("cut.safetensors");
    write_bytes(path, mem, n - 1);
    rc = adt_st_open(&f, path);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), path), "%s",
          adt_error_message());
    write_bytes(path, mem, 5);
    rc = adt_st_open(&f, path);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "file is 5 bytes, too short"),
          "%s", adt_error_message());

    /* header length larger than the file */
    unsigned char *b = mem;
    b[0] = 0xe8, b[1] = 0x03; /* 1000 */
    rc = adt_st_open_memory(&f, "long.safetensors", mem, n);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "header length 1000 exceeds"),
          "%s", adt_error_message());
    memset(b, 0xff, 8); /* 2^64 - 1: must not wrap around */
    rc = adt_st_open_memory(&f, "long.safetensors", mem, n);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "18446744073709551615"), "%s",
          adt_error_message());
    write_bytes(path, mem, n);
    rc = adt_st_open(&f, path);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "exceeds"), "%s",
          adt_error_message());
    free(mem);

    /* a plain text file, and a missing file */
    const char *txt = check_tmp_path("notes.txt");
    write_bytes(txt, "hello, this is not a checkpoint\n", 32);
    rc = adt_st_open(&f, txt);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "not a safetensors file"), "%s",
          adt_error_message());
    rc = adt_st_open(&f, check_tmp_path("missing.safetensors"));
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), "missing.safetensors: cannot open"),
          "%s", adt_error_message());
    rc = adt_st_open(&f, check_tmpdir());
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), "not a regular file"), "%s",
          adt_error_message());
    unlink(txt);
}

static void test_writer_errors(void) {
    float x[4] = {0};
    int64_t s4[] = {4}, neg[] = {-1}, big[] = {INT64_MAX, INT64_MAX};
    int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    adt_st_writer *w = adt_st_writer_create();
    CHECK(adt_st_writer_add(w, "x", ADT_ST_F32, 1, s4, x) == ADT_OK, "add");
    CHECK(adt_st_writer_add(w, "x", ADT_ST_F32, 1, s4, x) == ADT_ERR_ARG &&
              contains(adt_error_message(), "'x' added twice"),
          "%s", adt_error_message());
    CHECK(adt_st_writer_add(w, "", ADT_ST_F32, 1, s4, x) == ADT_ERR_ARG, "empty name");
    CHECK(adt_st_writer_add(w, "__metadata__", ADT_ST_F32, 1, s4, x) == ADT_ERR_ARG, "reserved");
    CHECK(adt_st_writer_add(w, "n", ADT_ST_F32, 1, neg, x) == ADT_ERR_ARG &&
              contains(adt_error_message(), "shape[0] is -1"),
          "%s", adt_error_message());
    CHECK(adt_st_writer_add(w, "b", ADT_ST_F32, 2, big, x) == ADT_ERR_ARG &&
              contains(adt_error_message(), "too large"),
          "%s", adt_error_message());
    CHECK(adt_st_writer_add(w, "d", ADT_ST_F32, 9, s9, x) == ADT_ERR_ARG, "9 dims");
    CHECK(adt_st_writer_add(w, "d", ADT_ST_F32, -1, s9, x) == ADT_ERR_ARG, "-1 dims");
    CHECK(adt_st_writer_add(w, "t", ADT_ST_NUM_DTYPES, 1, s4, x) == ADT_ERR_ARG, "dtype");
    CHECK(adt_st_writer_add(w, "z", ADT_ST_F32, 1, s4, NULL) == ADT_ERR_ARG, "NULL data");
    CHECK(adt_st_writer_set_metadata(w, "k", NULL) == ADT_ERR_ARG, "NULL metadata");

    /* save into a directory that does not exist: IO error naming the path, nothing left */
    const char *bad = check_tmp_path("no/such/dir/x.safetensors");
    int rc = adt_st_writer_save(w, bad);
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), "no/such/dir/x.safetensors.tmp"),
          "%s", adt_error_message());
    CHECK(!file_exists(bad), "nothing written");
    adt_st_writer_free(w);
    adt_st_writer_free(NULL);
    adt_st_close(NULL);
}

/* Saving over an existing file replaces it whole. */
static void test_atomic_replace(void) {
    const char *path = check_tmp_path("replace.safetensors");
    int64_t s1[] = {1}, s3[] = {3};
    float a = 1.0f, b[3] = {2, 3, 4};
    adt_st_writer *w = adt_st_writer_create();
    adt_st_writer_add(w, "a", ADT_ST_F32, 1, s1, &a);
    CHECK(adt_st_writer_save(w, path) == ADT_OK, "%s", adt_error_message());
    adt_st_writer_free(w);
    w = adt_st_writer_create();
    adt_st_writer_add(w, "b", ADT_ST_F32, 1, s3, b);
    CHECK(adt_st_writer_save(w, path) == ADT_OK, "%s", adt_error_message());
    adt_st_writer_free(w);
    adt_st_file *f;
    if (adt_st_open(&f, path) != ADT_OK) {
        CHECK(0, "%s", adt_error_message());
        return;
    }
    CHECK(adt_st_count(f) == 1 && adt_st_find(f, "b") && !adt_st_find(f, "a"), "replaced");
    adt_st_close(f);
    CHECK(!file_exists(check_tmp_path("replace.safetensors.tmp")), "no temporary file");
}

static void remove_tmpdir(void) {
    const char *leaves[] = {"round.safetensors", "ckpt.safetensors", "bad.safetensors",
                            "cut.safetensors", "replace.safetensors"};
    check_tmpdir_remove(leaves, sizeof leaves / sizeof leaves[0]);
}

int main(void) {
    if (check_tmpdir_make("st")) return 2;
    RUN(test_dtype_table);
    RUN(test_round_trip);
    RUN(test_empty_file);
    RUN(test_many_tensors);
    RUN(test_read_helpers);
    RUN(test_torch_fixture);
    RUN(test_malformed_header);
    RUN(test_malformed_layout);
    RUN(test_truncated);
    RUN(test_writer_errors);
    RUN(test_atomic_replace);
    remove_tmpdir();
    return check_finish();
}
