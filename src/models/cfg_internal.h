/*
 * cfg_internal.h - the strict JSON field readers shared by the model config parsers of models/
 * (config.c holds them and the dispatch; each model family parses its own fields next to its
 * builder). Every failure is an adt_error whose message starts with the config's name and names
 * the field ("blocks[1][0]") and what was expected.
 */
#ifndef ADTRAIN_MODELS_CFG_INTERNAL_H
#define ADTRAIN_MODELS_CFG_INTERNAL_H

#include <cJSON.h>

#include "adtrain/models.h"

/* Upper bounds: far above any model that fits on a machine, low enough that products of two of
 * them cannot overflow int64 shape arithmetic. */
#define CFG_MAX_VOCAB 16777216
#define CFG_MAX_CTX 1048576
#define CFG_MAX_LAYER 1024
#define CFG_MAX_EMBD 65536
#define CFG_MAX_HEAD 4096
#define CFG_MAX_WIDTH 16777216
#define CFG_MAX_CHANNELS 65536
#define CFG_MAX_IMAGE 65536         /* height, width */
#define CFG_MAX_ROWS (1 << 30)      /* rows of one embedding table (ids are i32) */

/* "a string", "an array", ... for "got ..." in messages. */
const char *adt_cfg_json_kind(const cJSON *j);
/* Every key of obj must be in the NULL-terminated `allowed` and appear once; an unknown key is
 * reported with the nearest allowed name. */
int adt_cfg_check_fields(const cJSON *obj, const char *const *allowed, const char *type, const char *name);
/* An integral JSON number in [lo, hi]; `what` names the field in messages ("n_layer", "sizes[2]"). */
int adt_cfg_to_int(const cJSON *j, const char *what, long lo, long hi, const char *name, int *out);
/* The required integer field `field` of obj, in [lo, hi]. */
int adt_cfg_get_int(const cJSON *obj, const char *field, long lo, long hi, const char *name, int *out);
/* The JSON array j (named `what`) of n_min..n_max integers in [lo, hi] into out[], its length in
 * *n; `meaning` says what the entries are in messages ("layer widths"). */
int adt_cfg_to_int_array(const cJSON *j, const char *what, int n_min, int n_max, long lo, long hi,
                         const char *meaning, const char *name, int *out, int *n);
/* The same for the required field `field` of obj. */
int adt_cfg_get_int_array(const cJSON *obj, const char *field, int n_min, int n_max, long lo, long hi,
                          const char *meaning, const char *name, int *out, int *n);
/* For configs built in code: v in [lo, hi], else the message parsing would have given. */
int adt_cfg_check_range(long v, const char *what, long lo, long hi, const char *name);

/* The whole file `path` as a NUL-terminated string (free() it): refused, naming the file and
 * `what` it should be ("model config"), when it cannot be read, is not a regular file, is larger
 * than max_bytes, or holds a NUL byte (which would cut the JSON short unnoticed). */
int adt_cfg_read_text(const char *path, const char *what, long max_bytes, char **out);
/* The error for JSON text cJSON refused: line, column and the text near `end`. */
int adt_cfg_json_error(const char *text, const char *end, const char *name);

/* The families kept in their own files: parse the fields of `root` (type already known), check
 * a config built in code, count its parameters (after a successful check). */
int adt_cfg_parse_vgg(adt_vgg_cfg *c, const cJSON *root, const char *name);
int adt_cfg_validate_vgg(const adt_vgg_cfg *c, const char *name);
int64_t adt_cfg_params_vgg(const adt_vgg_cfg *c);
int adt_cfg_parse_dlrm(adt_dlrm_cfg *c, const cJSON *root, const char *name);
int adt_cfg_validate_dlrm(const adt_dlrm_cfg *c, const char *name);
int64_t adt_cfg_params_dlrm(const adt_dlrm_cfg *c);

#endif
