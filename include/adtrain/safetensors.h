/*
 * adtrain/safetensors.h - reading and writing safetensors files (checkpoints, reference fixtures,
 * weights exchanged with PyTorch / Hugging Face).
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * (optionally padded with spaces), then the data buffer; offsets are relative to its start.
 *
 * The reader validates the whole header before handing anything out, so a caller may trust every
 * adt_st_tensor it gets: dtype known, shape product * dtype size == nbytes, bytes inside the
 * buffer, no two tensors overlapping, names unique. Unused bytes (gaps between tensors, a tail
 * after the last) are tolerated, although the reference reader refuses them; this writer never
 * produces them. Data is little-endian, as the format says; adtrain builds only for
 * little-endian hosts.
 */
#ifndef ADTRAIN_SAFETENSORS_H
#define ADTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_ST_MAX_DIMS 8
/* Largest header accepted, as in the reference implementation: a bigger one is a corrupt
 * length field, not a real file. */
#define ADT_ST_MAX_HEADER ((uint64_t)100000000)

typedef enum adt_st_dtype {
    ADT_ST_BOOL,
    ADT_ST_U8,
    ADT_ST_I8,
    ADT_ST_F8_E5M2,
    ADT_ST_F8_E4M3,
    ADT_ST_I16,
    ADT_ST_U16,
    ADT_ST_F16,
    ADT_ST_BF16,
    ADT_ST_I32,
    ADT_ST_U32,
    ADT_ST_F32,
    ADT_ST_F64,
    ADT_ST_I64,
    ADT_ST_U64,
    ADT_ST_NUM_DTYPES
} adt_st_dtype;

/* "F32", "BF16", ...; "?" for an out-of-range value. */
const char *adt_st_dtype_name(adt_st_dtype dtype);
/* Bytes per element; 0 for an out-of-range value. */
size_t adt_st_dtype_size(adt_st_dtype dtype);
/* Parses a dtype name as written in the header; ADT_ERR_ARG (with a message) if unknown. */
int adt_st_dtype_parse(const char *name, adt_st_dtype *out);

/* ---------------------------------------------------------------------------------------------
 * Reader
 */
typedef struct adt_st_tensor {
    const char *name;
    adt_st_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[ADT_ST_MAX_DIMS];
    /* Points into the file's data buffer, which starts 64-byte aligned; the tensor itself is
     * aligned only as far as its begin offset is (files mixing dtypes may leave it unaligned), so
     * read through memcpy or adt_st_read_f32/_i32 rather than casting. Never NULL, even when
     * nbytes == 0. */
    const void *data;
    size_t nbytes;
} adt_st_tensor;

typedef struct adt_st_file adt_st_file;

/* Reads and validates the file at `path`. On success *out owns a copy of the data (the file may
 * be changed or removed afterwards); on failure *out is NULL and the message names the file, the
 * tensor or field, and what was expected (ADT_ERR_IO: cannot read; ADT_ERR_FORMAT: malformed). */
int adt_st_open(adt_st_file **out, const char *path);
/* Same, for a file whose size and crc32c (of all its bytes) are known, e.g. from a manifest:
 * a file of another size, or whose content does not match the checksum, is refused
 * (ADT_ERR_FORMAT, "truncated" / "crc32c ..., expected ...") before its header is parsed. */
int adt_st_open_checked(adt_st_file **out, const char *path, uint64_t bytes, uint32_t crc32c);
/* Same, from `n` bytes at `buf` (copied; `buf` need not outlive the call). `name` is used in
 * error messages in place of a path; NULL reads as "<memory>". */
int adt_st_open_memory(adt_st_file **out, const char *name, const void *buf, size_t n);
void adt_st_close(adt_st_file *f);

/* The path or name given at open, for callers' own messages. */
const char *adt_st_name(const adt_st_file *f);
/* Tensors in ascending order of their data offset (the order they lie in the file). */
int adt_st_count(const adt_st_file *f);
/* NULL if i is out of range. */
const adt_st_tensor *adt_st_get(const adt_st_file *f, int i);
/* NULL if there is no tensor of that name (no error message is set: absence may be expected). */
const adt_st_tensor *adt_st_find(const adt_st_file *f, const char *name);

/* Value of a "__metadata__" entry, or NULL. */
const char *adt_st_metadata(const adt_st_file *f, const char *key);
int adt_st_metadata_count(const adt_st_file *f);
/* i-th metadata entry in header order; ADT_ERR_ARG if i is out of range. */
int adt_st_metadata_get(const adt_st_file *f, int i, const char **key, const char **value);

/* Copies tensor `name` into dst as float32, after checking that it exists, that its shape is
 * exactly shape[0..ndim), and that its dtype is F32, BF16 or F16 (the latter two are widened
 * exactly). Errors name the file, the tensor and both shapes, e.g.
 *   "ckpt.safetensors: tensor 'h.0.attn.c_attn.weight' has shape [32,96], the model expects
 *    [32,64]". */
int adt_st_read_f32(const adt_st_file *f, const char *name, float *dst, int ndim,
                    const int64_t *shape);
/* Same for int32 destinations (token ids, targets): accepts I32, and I64 whose every value fits. */
int adt_st_read_i32(const adt_st_file *f, const char *name, int32_t *dst, int ndim,
                    const int64_t *shape);

/* ---------------------------------------------------------------------------------------------
 * Writer. Tensors are written in insertion order, back to back (no gaps, as the reference reader
 * requires), after a header padded with spaces to a multiple of 8 bytes.
 */
typedef struct adt_st_writer adt_st_writer;

adt_st_writer *adt_st_writer_create(void);
void adt_st_writer_free(adt_st_writer *w);

/* Adds a tensor WITHOUT copying: `data` (product(shape) * dtype size bytes) must stay valid and
 * unchanged until adt_st_writer_save/_serialize has returned; a checkpoint of a large model
 * should not hold a second copy of every weight. `shape` is copied. ADT_ERR_ARG for an empty or
 * duplicate name, "__metadata__", an unknown dtype, ndim outside [0, 8], a negative dimension,
 * or NULL data for a non-empty tensor. */
int adt_st_writer_add(adt_st_writer *w, const char *name, adt_st_dtype dtype, int ndim,
                      const int64_t *shape, const void *data);
/* Same, but copies the bytes now, for data that will not outlive the call. */
int adt_st_writer_add_copy(adt_st_writer *w, const char *name, adt_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data);
/* Sets (or replaces) a "__metadata__" entry; both strings are copied. */
int adt_st_writer_set_metadata(adt_st_writer *w, const char *key, const char *value);

/* Writes the file atomically: to "<path>.tmp", fsync, rename over `path`, fsync the directory.
 * On failure `path` is untouched and the temporary file removed. */
int adt_st_writer_save(adt_st_writer *w, const char *path);
/* Same, and reports the file's size and the crc32c of all its bytes (computed while writing;
 * either pointer may be NULL). */
int adt_st_writer_save_sum(adt_st_writer *w, const char *path, uint64_t *bytes, uint32_t *crc32c);
/* The same bytes in memory: *out_buf is malloc'd (release with free()). */
int adt_st_writer_serialize(adt_st_writer *w, void **out_buf, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
