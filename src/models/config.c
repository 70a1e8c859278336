/*
 * config.c - model configs from JSON: a strict parser (every field checked for presence, JSON
 * type and range; unknown fields rejected so a typo cannot silently fall back to a default), the
 * field readers the families share (cfg_internal.h), the GPT and MLP fields, and the dispatch
 * from a config to its checks, parameter count and model builder. VGG and DLRM parse their
 * fields next to their builders (vgg.c, dlrm.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "models/cfg_internal.h"

#define CFG_MAX_FILE_BYTES (1 << 20)
#define CFG_TYPES "\"gpt\", \"mlp\", \"vgg\" or \"dlrm\""

static const char *const gpt_fields[] = {"type", "vocab_size", "n_ctx", "n_layer", "n_embd", "n_head", "dropout", NULL};
static const char *const mlp_fields[] = {"type", "sizes", "activation", NULL};

const char *adt_model_type_name(adt_model_type t) {
    switch (t) {
    case ADT_MODEL_GPT: return "gpt";
    case ADT_MODEL_MLP: return "mlp";
    case ADT_MODEL_VGG: return "vgg";
    case ADT_MODEL_DLRM: return "dlrm";
    }
    return "unknown";
}

void adt_model_cfg_default(adt_model_cfg *c) {
    memset(c, 0, sizeof *c);
    c->type = ADT_MODEL_GPT;
    c->gpt = (adt_gpt_cfg){.vocab_size = 65, .n_ctx = 64, .n_layer = 2, .n_embd = 64, .n_head = 4, .dropout = 0.0f};
}

/* ---- small helpers ---------------------------------------------------------------------- */

const char *adt_cfg_json_kind(const cJSON *j) {
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "an invalid value";
}

/* Edit distance, for "did you mean" on an unknown field; names are short. */
static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 64;
    int row[64];
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int sub = diag + (a[i - 1] != b[j - 1]);
            int best = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            diag = up;
        }
    }
    return row[lb];
}

static void list_fields(char *buf, size_t n, const char *const *allowed) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; allowed[i] && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s\"%s\"", i ? ", " : "", allowed[i]);
}

int adt_cfg_check_fields(const cJSON *obj, const char *const *allowed, const char *type, const char *name) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        for (const cJSON *prev = obj->child; prev != it; prev = prev->next)
            if (!strcmp(prev->string, it->string))
                return adt_error(ADT_ERR_ARG, "%s: field \"%s\" appears more than once", name, it->string);
        int known = 0, best = -1, best_d = 3;
        for (int i = 0; allowed[i]; i++) {
            if (!strcmp(allowed[i], it->string)) known = 1;
            int d = edit_distance(allowed[i], it->string);
            if (d < best_d) best_d = d, best = i;
        }
        if (known) continue;
        char list[256];
        list_fields(list, sizeof list, allowed);
        if (best >= 0)
            return adt_error(ADT_ERR_ARG, "%s: unknown field \"%s\" for type \"%s\" (did you mean \"%s\"?); expected: %s",
                             name, it->string, type, allowed[best], list);
        return adt_error(ADT_ERR_ARG, "%s: unknown field \"%s\" for type \"%s\"; expected: %s", name, it->string, type,
                         list);
    }
    return ADT_OK;
}

int adt_cfg_to_int(const cJSON *j, const char *what, long lo, long hi, const char *name, int *out) {
    if (!cJSON_IsNumber(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected an integer in [%ld, %ld]", name, what,
                         adt_cfg_json_kind(j), lo, hi);
    double d = j->valuedouble;
    if (!isfinite(d) || d != floor(d))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %g, expected an integer in [%ld, %ld]", name, what, d, lo,
                         hi);
    if (d < (double)lo || d > (double)hi)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %.0f, expected an integer in [%ld, %ld]", name, what, d, lo,
                         hi);
    *out = (int)d;
    return ADT_OK;
}

int adt_cfg_get_int(const cJSON *obj, const char *field, long lo, long hi, const char *name, int *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"%s\" (expected an integer in [%ld, %ld])", name, field, lo,
                         hi);
    return adt_cfg_to_int(j, field, lo, hi, name, out);
}

int adt_cfg_to_int_array(const cJSON *j, const char *what, int n_min, int n_max, long lo, long hi,
                         const char *meaning, const char *name, int *out, int *n) {
    if (!cJSON_IsArray(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected an array of %d to %d %s", name, what,
                         adt_cfg_json_kind(j), n_min, n_max, meaning);
    int len = cJSON_GetArraySize(j);
    if (len < n_min || len > n_max)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" has %d entries, expected %d to %d %s", name, what, len, n_min,
                         n_max, meaning);
    int i = 0, rc;
    for (const cJSON *it = j->child; it; it = it->next, i++) {
        char at[64];
        snprintf(at, sizeof at, "%s[%d]", what, i);
        if ((rc = adt_cfg_to_int(it, at, lo, hi, name, &out[i]))) return rc;
    }
    *n = len;
    return ADT_OK;
}

int adt_cfg_get_int_array(const cJSON *obj, const char *field, int n_min, int n_max, long lo, long hi,
                          const char *meaning, const char *name, int *out, int *n) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"%s\" (expected an array of %d to %d %s)", name, field,
                         n_min, n_max, meaning);
    return adt_cfg_to_int_array(j, field, n_min, n_max, lo, hi, meaning, name, out, n);
}

int adt_cfg_check_range(long v, const char *what, long lo, long hi, const char *name) {
    if (v >= lo && v <= hi) return ADT_OK;
    return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %ld, expected an integer in [%ld, %ld]", name, what, v, lo, hi);
}

/* ---- per-type parsers ----------------------------------------------------------------- */

static int parse_gpt(adt_gpt_cfg *c, const cJSON *root, const char *name) {
    int rc;
    if ((rc = adt_cfg_check_fields(root, gpt_fields, "gpt", name))) return rc;
    if ((rc = adt_cfg_get_int(root, "vocab_size", 1, CFG_MAX_VOCAB, name, &c->vocab_size))) return rc;
    if ((rc = adt_cfg_get_int(root, "n_ctx", 1, CFG_MAX_CTX, name, &c->n_ctx))) return rc;
    if ((rc = adt_cfg_get_int(root, "n_layer", 1, CFG_MAX_LAYER, name, &c->n_layer))) return rc;
    if ((rc = adt_cfg_get_int(root, "n_embd", 1, CFG_MAX_EMBD, name, &c->n_embd))) return rc;
    if ((rc = adt_cfg_get_int(root, "n_head", 1, CFG_MAX_HEAD, name, &c->n_head))) return rc;
    c->dropout = 0.0f;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "dropout");
    if (d) {
        if (!cJSON_IsNumber(d))
            return adt_error(ADT_ERR_ARG, "%s: field \"dropout\" is %s, expected a number in [0, 1)", name,
                             adt_cfg_json_kind(d));
        if (!(d->valuedouble >= 0.0 && d->valuedouble < 1.0))
            return adt_error(ADT_ERR_ARG, "%s: field \"dropout\" is %g, expected a number in [0, 1)", name,
                             d->valuedouble);
        c->dropout = (float)d->valuedouble;
    }
    return ADT_OK;
}

static int parse_activation(adt_activation *a, const cJSON *root, const char *name) {
    static const char *const names[] = {"relu", "gelu", "sigmoid"};
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "activation");
    if (!j) return adt_error(ADT_ERR_ARG, "%s: missing field \"activation\" (expected \"relu\", \"gelu\" or \"sigmoid\")", name);
    if (!cJSON_IsString(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"activation\" is %s, expected \"relu\", \"gelu\" or \"sigmoid\"", name,
                         adt_cfg_json_kind(j));
    for (int i = 0; i < 3; i++)
        if (!strcmp(j->valuestring, names[i])) {
            *a = (adt_activation)i;
            return ADT_OK;
        }
    return adt_error(ADT_ERR_ARG, "%s: field \"activation\" is \"%s\", expected \"relu\", \"gelu\" or \"sigmoid\"", name,
                     j->valuestring);
}

static int parse_mlp(adt_mlp_cfg *c, const cJSON *root, const char *name) {
    int rc;
    if ((rc = adt_cfg_check_fields(root, mlp_fields, "mlp", name))) return rc;
    if ((rc = adt_cfg_get_int_array(root, "sizes", 2, ADT_MLP_MAX_LAYERS + 1, 1, CFG_MAX_WIDTH,
                                    "layer widths (input, hidden..., classes), e.g. [784, 1024, 10]", name, c->sizes,
                                    &c->n_sizes)))
        return rc;
    return parse_activation(&c->activation, root, name);
}

static int parse_root(adt_model_cfg *c, const cJSON *root, const char *name) {
    if (!cJSON_IsObject(root))
        return adt_error(ADT_ERR_ARG, "%s: expected a JSON object at the top level, got %s", name, adt_cfg_json_kind(root));
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "type");
    if (!t) return adt_error(ADT_ERR_ARG, "%s: missing field \"type\" (expected " CFG_TYPES ")", name);
    if (!cJSON_IsString(t))
        return adt_error(ADT_ERR_ARG, "%s: field \"type\" is %s, expected " CFG_TYPES, name, adt_cfg_json_kind(t));
    int rc;
    if (!strcmp(t->valuestring, "gpt")) {
        c->type = ADT_MODEL_GPT;
        rc = parse_gpt(&c->gpt, root, name);
    } else if (!strcmp(t->valuestring, "mlp")) {
        c->type = ADT_MODEL_MLP;
        rc = parse_mlp(&c->mlp, root, name);
    } else if (!strcmp(t->valuestring, "vgg")) {
        c->type = ADT_MODEL_VGG;
        rc = adt_cfg_parse_vgg(&c->vgg, root, name);
    } else if (!strcmp(t->valuestring, "dlrm")) {
        c->type = ADT_MODEL_DLRM;
        rc = adt_cfg_parse_dlrm(&c->dlrm, root, name);
    } else {
        return adt_error(ADT_ERR_ARG, "%s: field \"type\" is \"%s\", expected one of the supported types: " CFG_TYPES,
                         name, t->valuestring);
    }
    return rc ? rc : adt_model_cfg_validate(c, name);
}

/* ---- public API ----------------------------------------------------------------------- */

/* Line and column (1-based) of byte `off` in `text`, for messages a person can act on. */
static void text_position(const char *text, size_t off, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < off && text[i]; i++) {
        if (text[i] == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

int adt_cfg_json_error(const char *text, const char *end, const char *name) {
    size_t off = end && end >= text ? (size_t)(end - text) : 0;
    size_t len = strlen(text);
    if (off > len) off = len;
    if (strspn(text, " \t\r\n") == len) return adt_error(ADT_ERR_FORMAT, "%s: empty, expected a JSON object", name);
    int line, col;
    text_position(text, off, &line, &col);
    char near[24];
    size_t k = 0;
    for (size_t i = off; text[i] && text[i] != '\n' && k + 1 < sizeof near; i++) near[k++] = text[i];
    near[k] = 0;
    if (off >= len) return adt_error(ADT_ERR_FORMAT, "%s: invalid JSON: unexpected end at line %d, column %d", name, line, col);
    return adt_error(ADT_ERR_FORMAT, "%s: invalid JSON at line %d, column %d (byte %zu), near '%s'", name, line, col, off,
                     near);
}

int adt_model_cfg_parse(adt_model_cfg *c, const char *json_text, const char *name_for_errors) {
    const char *name = name_for_errors ? name_for_errors : "model config";
    memset(c, 0, sizeof *c);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json_text, &end, 1);
    if (!root) return adt_cfg_json_error(json_text, end, name);
    int rc = parse_root(c, root, name);
    cJSON_Delete(root);
    return rc;
}

/* The whole file as a NUL-terminated string; a NUL inside would cut the JSON short unnoticed. */
int adt_cfg_read_text(const char *path, const char *what, long max_bytes, char **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return adt_error(ADT_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return adt_error(ADT_ERR_IO, "%s: not a regular file, expected a JSON %s", path, what);
    }
    if (st.st_size > max_bytes) {
        fclose(f);
        return adt_error(ADT_ERR_FORMAT, "%s: %lld bytes, a %s is expected to be at most %ld bytes", path,
                         (long long)st.st_size, what, max_bytes);
    }
    char *buf = adt_malloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return adt_error(ADT_ERR_IO, "%s: read failed", path);
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        size_t at = strlen(buf);
        free(buf);
        return adt_error(ADT_ERR_FORMAT, "%s: NUL byte at offset %zu, expected JSON text", path, at);
    }
    *out = buf;
    return ADT_OK;
}

int adt_model_cfg_load(adt_model_cfg *c, const char *path) {
    char *text;
    int rc = adt_cfg_read_text(path, "model config", CFG_MAX_FILE_BYTES, &text);
    if (rc) return rc;
    rc = adt_model_cfg_parse(c, text, path);
    free(text);
    return rc;
}

static int validate_gpt(const adt_gpt_cfg *g, const char *name) {
    struct { const char *f; int v; long hi; } f[] = {
        {"vocab_size", g->vocab_size, CFG_MAX_VOCAB}, {"n_ctx", g->n_ctx, CFG_MAX_CTX},
        {"n_layer", g->n_layer, CFG_MAX_LAYER},       {"n_embd", g->n_embd, CFG_MAX_EMBD},
        {"n_head", g->n_head, CFG_MAX_HEAD},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (adt_cfg_check_range(f[i].v, f[i].f, 1, f[i].hi, name)) return ADT_ERR_ARG;
    if (g->n_embd % g->n_head)
        return adt_error(ADT_ERR_ARG, "%s: field \"n_embd\" (%d) must be divisible by \"n_head\" (%d)", name, g->n_embd,
                         g->n_head);
    if (!(g->dropout >= 0.0f && g->dropout < 1.0f))
        return adt_error(ADT_ERR_ARG, "%s: field \"dropout\" is %g, expected a number in [0, 1)", name,
                         (double)g->dropout);
    return ADT_OK;
}

static int validate_mlp(const adt_mlp_cfg *m, const char *name) {
    if (m->n_sizes < 2 || m->n_sizes > ADT_MLP_MAX_LAYERS + 1)
        return adt_error(ADT_ERR_ARG, "%s: field \"sizes\" has %d entries, expected 2 to %d", name, m->n_sizes,
                         ADT_MLP_MAX_LAYERS + 1);
    for (int i = 0; i < m->n_sizes; i++) {
        char what[32];
        snprintf(what, sizeof what, "sizes[%d]", i);
        if (adt_cfg_check_range(m->sizes[i], what, 1, CFG_MAX_WIDTH, name)) return ADT_ERR_ARG;
    }
    if ((unsigned)m->activation > ADT_ACT_SIGMOID)
        return adt_error(ADT_ERR_ARG, "%s: field \"activation\" is invalid, expected \"relu\", \"gelu\" or \"sigmoid\"",
                         name);
    return ADT_OK;
}

int adt_model_cfg_validate(const adt_model_cfg *c, const char *name_for_errors) {
    const char *name = name_for_errors ? name_for_errors : "model config";
    switch (c->type) {
    case ADT_MODEL_GPT: return validate_gpt(&c->gpt, name);
    case ADT_MODEL_MLP: return validate_mlp(&c->mlp, name);
    case ADT_MODEL_VGG: return adt_cfg_validate_vgg(&c->vgg, name);
    case ADT_MODEL_DLRM: return adt_cfg_validate_dlrm(&c->dlrm, name);
    }
    return adt_error(ADT_ERR_ARG, "%s: model type %d, expected gpt, mlp, vgg or dlrm", name, (int)c->type);
}

int64_t adt_model_cfg_param_count(const adt_model_cfg *c) {
    if (adt_model_cfg_validate(c, adt_model_type_name(c->type))) return -1;
    switch (c->type) {
    case ADT_MODEL_GPT: {
        /* wte, wpe, per block 2 LayerNorms (4C), c_attn (3C^2+3C), c_proj (C^2+C), c_fc (4C^2+4C),
         * mlp c_proj (4C^2+C), and ln_f */
        int64_t V = c->gpt.vocab_size, T = c->gpt.n_ctx, L = c->gpt.n_layer, C = c->gpt.n_embd;
        return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    }
    case ADT_MODEL_MLP: {
        int64_t n = 0;
        for (int i = 0; i + 1 < c->mlp.n_sizes; i++) n += ((int64_t)c->mlp.sizes[i] + 1) * c->mlp.sizes[i + 1];
        return n;
    }
    case ADT_MODEL_VGG: return adt_cfg_params_vgg(&c->vgg);
    case ADT_MODEL_DLRM: return adt_cfg_params_dlrm(&c->dlrm);
    }
    return -1;
}

int adt_model_build(adt_graph *g, const adt_model_cfg *c, int batch, adt_model_io *io) {
    int rc = adt_model_cfg_validate(c, adt_model_type_name(c->type));
    if (rc) return rc;
    if (batch < 1) return adt_error(ADT_ERR_ARG, "%s model: batch is %d, expected >= 1", adt_model_type_name(c->type), batch);
    memset(io, 0, sizeof *io);
    switch (c->type) {
    case ADT_MODEL_GPT: rc = adt_model_gpt(g, &c->gpt, batch, io); break;
    case ADT_MODEL_MLP: rc = adt_model_mlp(g, &c->mlp, batch, io); break;
    case ADT_MODEL_VGG: rc = adt_model_vgg(g, &c->vgg, batch, io); break;
    case ADT_MODEL_DLRM: rc = adt_model_dlrm(g, &c->dlrm, batch, io); break;
    }
    if (rc || adt_graph_error(g)) return adt_error(rc ? rc : adt_graph_error(g), "%s", adt_graph_error_message(g));
    return ADT_OK;
}
