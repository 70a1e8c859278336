/*
 * dckpt_manifest.c - the manifest of a distributed checkpoint: parsing and checking it, and the
 * read-only views of what it says (include/adtrain/ckpt.h, docs/formats.md).
 *
 * A manifest is trusted by nothing downstream until it passed every check here: known format,
 * every field of the right type and range, file names that stay inside the checkpoint directory,
 * slices inside their tensors, and for every tensor slices that are disjoint and cover it
 * exactly. After that, a loader may assume that every element of every tensor is in exactly one
 * file, and only has to check that the files are the ones the manifest describes.
 */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "ckpt_internal.h"

/* JSON numbers are doubles: integers beyond 2^53 are not exact. */
#define MAX_JSON_INT 9007199254740992.0
#define MAX_WORLD (1 << 24)
#define MAX_TENSORS (1 << 20)
#define MAX_SLICES (1 << 28)
#define MAX_NAME 255
/* A manifest lists names and boxes: far below this even for thousands of ranks. */
#define MAX_MANIFEST_BYTES ((size_t)1 << 30)

typedef struct name_ref {
    const char *name;
    int idx;
} name_ref;

struct adt_dckpt {
    char *dir;  /* where the files are; NULL for a manifest parsed from memory alone */
    char *name; /* the manifest, for messages */
    int64_t step;
    int world;
    int n_tensors;
    adt_dckpt_tensor *tensors;
    name_ref *by_name; /* the tensors sorted by name */
    int n_files;
    adt_dckpt_file *files;
    adt_dckpt_slice *slices; /* all files' slices, file by file */
    ckpt_meta meta;
};

/* ---- strict JSON field readers ------------------------------------------------------------- */

static const char *json_kind(const cJSON *j) {
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    return "an invalid value";
}

/* Every key of obj (named `where`) must be one of `known` (NULL-terminated) and appear once;
 * the first `n_required` must be present. out[i] receives known[i]'s item or NULL. */
static int get_fields(const char *file, const cJSON *obj, const char *where, const char *const *known, int n_required,
                      const cJSON **out) {
    if (!cJSON_IsObject(obj)) return adt_error(ADT_ERR_FORMAT, "%s: %s is %s, expected an object", file, where, json_kind(obj));
    int n = 0;
    while (known[n]) out[n++] = NULL;
    for (const cJSON *c = obj->child; c; c = c->next) {
        int k = 0;
        while (k < n && strcmp(c->string, known[k])) k++;
        if (k == n) return adt_error(ADT_ERR_FORMAT, "%s: %s has an unknown field '%.64s'", file, where, c->string);
        if (out[k]) return adt_error(ADT_ERR_FORMAT, "%s: %s has field '%s' twice", file, where, known[k]);
        out[k] = c;
    }
    for (int k = 0; k < n_required; k++)
        if (!out[k]) return adt_error(ADT_ERR_FORMAT, "%s: %s has no field '%s'", file, where, known[k]);
    return ADT_OK;
}

/* An integral JSON number in [lo, hi]. */
static int get_int(const char *file, const cJSON *j, const char *where, int64_t lo, int64_t hi, int64_t *out) {
    double v = cJSON_IsNumber(j) ? j->valuedouble : 0;
    if (!cJSON_IsNumber(j) || !(v >= (double)lo && v <= (double)hi) || v != (double)(int64_t)v)
        return adt_error(ADT_ERR_FORMAT, "%s: %s is %s, expected an integer in [%lld, %lld]", file, where,
                         cJSON_IsNumber(j) ? "out of range or not integral" : json_kind(j), (long long)lo,
                         (long long)hi);
    *out = (int64_t)v;
    return ADT_OK;
}

/* A JSON array of `ndim` integers in [lo, hi] (ndim < 0: any length up to ADT_MAX_DIMS, stored
 * in *ndim_out). */
static int get_dims(const char *file, const cJSON *j, const char *where, int ndim, int64_t lo, int64_t *out,
                    int *ndim_out) {
    int n = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    int max = ndim < 0 ? ADT_MAX_DIMS : ndim;
    if (n < 0 || n > max || (ndim >= 0 && n != ndim))
        return adt_error(ADT_ERR_FORMAT, "%s: %s is %s%s, expected an array of %s%d integers", file, where,
                         json_kind(j), n >= 0 ? " of the wrong length" : "", ndim < 0 ? "at most " : "", max);
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
        char w[160];
        snprintf(w, sizeof w, "%s[%d]", where, i);
        int rc = get_int(file, c, w, lo, (int64_t)MAX_JSON_INT, &out[i]);
        if (rc) return rc;
    }
    if (ndim_out) *ndim_out = n;
    return ADT_OK;
}

static int get_string(const char *file, const cJSON *j, const char *where, size_t max, const char **out) {
    if (!cJSON_IsString(j) || !j->valuestring)
        return adt_error(ADT_ERR_FORMAT, "%s: %s is %s, expected a string", file, where, json_kind(j));
    size_t n = strlen(j->valuestring);
    if (n == 0 || n > max)
        return adt_error(ADT_ERR_FORMAT, "%s: %s is %zu characters long, expected 1 to %zu", file, where, n, max);
    *out = j->valuestring;
    return ADT_OK;
}

/* ---- the pieces of a manifest -------------------------------------------------------------- */

static int find_tensor(const adt_dckpt *c, const char *name) {
    int lo = 0, hi = c->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int cmp = strcmp(name, c->by_name[mid].name);
        if (!cmp) return c->by_name[mid].idx;
        if (cmp < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

static int cmp_name_ref(const void *a, const void *b) {
    return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

static char *dims_str(char *buf, size_t n, int ndim, const int64_t *d) {
    adt_shape s = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) s.dim[i] = d[i];
    return adt_shape_str(&s, buf, n);
}

static int parse_metadata(adt_dckpt *c, const cJSON *j) {
    if (!cJSON_IsObject(j)) return adt_error(ADT_ERR_FORMAT, "%s: metadata is %s, expected an object", c->name, json_kind(j));
    for (const cJSON *e = j->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return adt_error(ADT_ERR_FORMAT, "%s: metadata '%.64s' is %s, expected a string", c->name, e->string,
                             json_kind(e));
        if (ckpt_meta_find(&c->meta, e->string))
            return adt_error(ADT_ERR_FORMAT, "%s: metadata '%.64s' appears twice", c->name, e->string);
        ckpt_meta_append(&c->meta, e->string, e->valuestring);
    }
    return ADT_OK;
}

static int parse_tensors(adt_dckpt *c, const cJSON *j) {
    int n = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    if (n < 0 || n > MAX_TENSORS)
        return adt_error(ADT_ERR_FORMAT, "%s: tensors is %s%s, expected an array of at most %d tensors", c->name,
                         json_kind(j), n >= 0 ? " too long" : "", MAX_TENSORS);
    c->tensors = adt_calloc((size_t)n + 1, sizeof *c->tensors);
    c->by_name = adt_calloc((size_t)n + 1, sizeof *c->by_name);
    int i = 0;
    for (const cJSON *e = j->child; e; e = e->next, i++) {
        static const char *const fields[] = {"name", "dtype", "shape", "file_shape", NULL};
        const cJSON *f[4];
        char where[64], wn[80], wd[80];
        snprintf(where, sizeof where, "tensors[%d]", i);
        snprintf(wn, sizeof wn, "tensors[%d].name", i);
        snprintf(wd, sizeof wd, "tensors[%d].dtype", i);
        int rc = get_fields(c->name, e, where, fields, 3, f);
        const char *name = NULL, *dtype = NULL;
        if (!rc) rc = get_string(c->name, f[0], wn, MAX_NAME, &name);
        if (!rc) rc = get_string(c->name, f[1], wd, 16, &dtype);
        if (rc) return rc;
        adt_dckpt_tensor *t = &c->tensors[i];
        t->name = adt_strdup(name);
        c->n_tensors = i + 1;
        c->by_name[i] = (name_ref){t->name, i};
        if (adt_st_dtype_parse(dtype, &t->dtype))
            return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has dtype '%.16s', expected a safetensors dtype (F32, ...)",
                             c->name, t->name, dtype);
        char w[MAX_NAME + 32];
        snprintf(w, sizeof w, "the shape of tensor '%s'", t->name);
        if ((rc = get_dims(c->name, f[2], w, -1, 0, t->shape, &t->ndim))) return rc;
        /* bytes must be countable: each dimension and the product stay far from overflow */
        double bytes = (double)adt_st_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) bytes *= (double)t->shape[d];
        if (bytes > MAX_JSON_INT)
            return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' of %s elements is too large", c->name, t->name,
                             dims_str(w, sizeof w, t->ndim, t->shape));
        if (f[3]) { /* optional: the export's shape, of the same element count */
            snprintf(w, sizeof w, "the file_shape of tensor '%s'", t->name);
            if ((rc = get_dims(c->name, f[3], w, -1, 0, t->file_shape, &t->file_ndim))) return rc;
            double a = 1, b = 1;
            for (int d = 0; d < t->ndim; d++) a *= (double)t->shape[d];
            for (int d = 0; d < t->file_ndim; d++) b *= (double)t->file_shape[d];
            if (a != b || t->file_ndim < 1)
                return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has a file_shape of %.0f elements, expected the %.0f of its shape",
                                 c->name, t->name, b, a);
        }
    }
    qsort(c->by_name, (size_t)c->n_tensors, sizeof *c->by_name, cmp_name_ref);
    for (int k = 1; k < c->n_tensors; k++)
        if (!strcmp(c->by_name[k].name, c->by_name[k - 1].name))
            return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' is listed twice", c->name, c->by_name[k].name);
    return ADT_OK;
}

/* A file name must stay in the checkpoint directory: letters, digits, '.', '-', '_', and no
 * leading dot (so neither ".." nor a hidden or temporary file). */
static int plain_file_name(const char *s) {
    if (s[0] == '.') return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.' ||
              *s == '-' || *s == '_'))
            return 0;
    return 1;
}

static int parse_crc(const char *file, const cJSON *j, const char *fname, uint32_t *out) {
    const char *s = NULL;
    char w[MAX_NAME + 32];
    snprintf(w, sizeof w, "the crc32c of file '%s'", fname);
    int rc = get_string(file, j, w, 8, &s);
    if (rc) return rc;
    uint32_t v = 0;
    int n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) break;
        v = v << 4 | (uint32_t)d;
    }
    if (n != 8 || s[n])
        return adt_error(ADT_ERR_FORMAT, "%s: file '%s': crc32c is '%s', expected 8 lower-case hex digits", file, fname, s);
    *out = v;
    return ADT_OK;
}

static int parse_slice(adt_dckpt *c, const cJSON *e, const adt_dckpt_file *fl, int k, adt_dckpt_slice *s) {
    static const char *const fields[] = {"tensor", "offset", "shape", NULL};
    const cJSON *f[3];
    char where[MAX_NAME + 64];
    snprintf(where, sizeof where, "file '%s': slices[%d]", fl->name, k);
    int rc = get_fields(c->name, e, where, fields, 3, f);
    const char *tname = NULL;
    char wt[MAX_NAME + 80];
    snprintf(wt, sizeof wt, "%s.tensor", where);
    if (!rc) rc = get_string(c->name, f[0], wt, MAX_NAME, &tname);
    if (rc) return rc;
    s->tensor = find_tensor(c, tname);
    if (s->tensor < 0)
        return adt_error(ADT_ERR_FORMAT, "%s: file '%s' holds a slice of tensor '%s', which the manifest does not list",
                         c->name, fl->name, tname);
    const adt_dckpt_tensor *t = &c->tensors[s->tensor];
    snprintf(where, sizeof where, "file '%s': the offset of '%s'", fl->name, t->name);
    if ((rc = get_dims(c->name, f[1], where, t->ndim, 0, s->offset, NULL))) return rc;
    snprintf(where, sizeof where, "file '%s': the shape of '%s'", fl->name, t->name);
    if ((rc = get_dims(c->name, f[2], where, t->ndim, 1, s->shape, NULL))) return rc;
    for (int d = 0; d < t->ndim; d++)
        if (s->offset[d] + s->shape[d] > t->shape[d]) {
            char a[96], b[96], g[96];
            return adt_error(ADT_ERR_FORMAT, "%s: file '%s': the slice of '%s' at %s of shape %s lies outside its shape %s",
                             c->name, fl->name, t->name, dims_str(a, sizeof a, t->ndim, s->offset),
                             dims_str(b, sizeof b, t->ndim, s->shape), dims_str(g, sizeof g, t->ndim, t->shape));
        }
    return ADT_OK;
}

static int parse_files(adt_dckpt *c, const cJSON *j) {
    int n = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
    if (n < 0 || n > c->world)
        return adt_error(ADT_ERR_FORMAT, "%s: files is %s%s, expected an array of at most world = %d files", c->name,
                         json_kind(j), n >= 0 ? " too long" : "", c->world);
    size_t total = 0; /* slices in all files: what the text holds, each refused below if too many */
    for (const cJSON *e = j->child; e; e = e->next) {
        const cJSON *sl = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "slices") : NULL;
        int k = cJSON_IsArray(sl) ? cJSON_GetArraySize(sl) : 0;
        total += (size_t)(k > c->n_tensors ? c->n_tensors : k);
    }
    if (total > (size_t)MAX_SLICES)
        return adt_error(ADT_ERR_FORMAT, "%s: %zu slices in all, expected at most %d", c->name, total, MAX_SLICES);
    c->files = adt_calloc((size_t)n + 1, sizeof *c->files);
    c->slices = adt_calloc(total + 1, sizeof *c->slices);
    int used = 0, i = 0;
    char *seen = adt_calloc((size_t)c->n_tensors + 1, 1);
    int rc = ADT_OK;
    for (const cJSON *e = j->child; e && !rc; e = e->next, i++) {
        static const char *const fields[] = {"name", "rank", "bytes", "crc32c", "slices", NULL};
        const cJSON *f[5];
        char where[64], wn[80];
        snprintf(where, sizeof where, "files[%d]", i);
        snprintf(wn, sizeof wn, "files[%d].name", i);
        const char *name = NULL;
        int64_t rank = 0, bytes = 0;
        if ((rc = get_fields(c->name, e, where, fields, 5, f)) || (rc = get_string(c->name, f[0], wn, MAX_NAME, &name)))
            break;
        adt_dckpt_file *fl = &c->files[i];
        fl->name = adt_strdup(name);
        c->n_files = i + 1;
        if (!plain_file_name(name)) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: file name '%s' is not a plain name inside the checkpoint directory "
                           "(letters, digits, '.', '-', '_'; no leading dot)", c->name, name);
            break;
        }
        for (int k = 0; k < i && !rc; k++)
            if (!strcmp(c->files[k].name, name))
                rc = adt_error(ADT_ERR_FORMAT, "%s: file '%s' is listed twice", c->name, name);
        char wr[MAX_NAME + 32], wb[MAX_NAME + 32];
        snprintf(wr, sizeof wr, "the rank of file '%s'", name);
        snprintf(wb, sizeof wb, "the bytes of file '%s'", name);
        if (rc || (rc = get_int(c->name, f[1], wr, 0, 0x7fffffff, &rank)) ||
            (rc = get_int(c->name, f[2], wb, 8, (int64_t)MAX_JSON_INT, &bytes)) ||
            (rc = parse_crc(c->name, f[3], name, &fl->crc32c)))
            break;
        fl->rank = (int)rank;
        fl->bytes = (uint64_t)bytes;
        for (int k = 0; k < i && !rc; k++)
            if (c->files[k].rank == fl->rank)
                rc = adt_error(ADT_ERR_FORMAT, "%s: files '%s' and '%s' are both of rank %d", c->name, c->files[k].name,
                               name, fl->rank);
        int ns = cJSON_IsArray(f[4]) ? cJSON_GetArraySize(f[4]) : -1;
        if (!rc && (ns < 1 || ns > c->n_tensors))
            rc = adt_error(ADT_ERR_FORMAT, "%s: file '%s': slices is %s, expected an array of 1 to %d slices (one per "
                           "tensor at most)", c->name, name, ns < 0 ? json_kind(f[4]) : "of the wrong length", c->n_tensors);
        if (rc) break;
        fl->slices = c->slices + used;
        memset(seen, 0, (size_t)c->n_tensors);
        int k = 0;
        for (const cJSON *s = f[4]->child; s && !rc; s = s->next, k++) {
            adt_dckpt_slice *sl = &c->slices[used];
            if ((rc = parse_slice(c, s, fl, k, sl))) break;
            if (seen[sl->tensor]++)
                rc = adt_error(ADT_ERR_FORMAT, "%s: file '%s' holds two slices of tensor '%s' (one at most)", c->name, name,
                               c->tensors[sl->tensor].name);
            used++;
            fl->n_slices = k + 1;
        }
    }
    free(seen);
    return rc;
}

/* ---- coverage: every tensor's slices are disjoint and fill it ---------------------------------- */

typedef struct slice_ref {
    const adt_dckpt_slice *s;
    const char *file;
} slice_ref;

static int64_t slice_overlap(const adt_dckpt_slice *a, const adt_dckpt_slice *b, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        int64_t ae = a->offset[d] + a->shape[d], be = b->offset[d] + b->shape[d];
        int64_t hi = ae < be ? ae : be;
        if (hi <= lo) return 0;
        n *= hi - lo;
    }
    return n;
}

static int covers(const slice_ref *r, int k, int ndim, const int64_t *pt) {
    for (int i = 0; i < k; i++) {
        int in = 1;
        for (int d = 0; in && d < ndim; d++) in = pt[d] >= r[i].s->offset[d] && pt[d] < r[i].s->offset[d] + r[i].s->shape[d];
        if (in) return 1;
    }
    return 0;
}

/* An element no slice holds. The uncovered set is a union of cells of the grid cut by the
 * slices' faces, so one of the cells' corners is uncovered: try those (up to a bound). */
static int find_hole(const adt_dckpt_tensor *t, const slice_ref *r, int k, int64_t *pt) {
    int nd = t->ndim;
    int64_t *cand = adt_malloc((size_t)(nd * (2 * k + 1)) * sizeof *cand + 1);
    int ncand[ADT_MAX_DIMS], idx[ADT_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int64_t *cd = cand + (size_t)d * (2 * k + 1);
        int m = 0;
        cd[m++] = 0;
        for (int i = 0; i < k; i++) {
            int64_t e[2] = {r[i].s->offset[d], r[i].s->offset[d] + r[i].s->shape[d]};
            for (int q = 0; q < 2; q++)
                if (e[q] < t->shape[d]) cd[m++] = e[q];
        }
        ncand[d] = m;
    }
    int found = 0;
    for (long tries = 0; tries < (1L << 20) && !found; tries++) {
        for (int d = 0; d < nd; d++) pt[d] = cand[(size_t)d * (2 * k + 1) + idx[d]];
        if (!covers(r, k, nd, pt)) found = 1;
        int d = nd - 1;
        while (d >= 0 && ++idx[d] == ncand[d]) idx[d--] = 0;
        if (d < 0) break;
    }
    free(cand);
    return found;
}

static int check_coverage(const adt_dckpt *c) {
    int *count = adt_calloc((size_t)c->n_tensors + 1, sizeof *count);
    for (int f = 0; f < c->n_files; f++)
        for (int k = 0; k < c->files[f].n_slices; k++) count[c->files[f].slices[k].tensor]++;
    int *start = adt_calloc((size_t)c->n_tensors + 1, sizeof *start);
    for (int t = 1; t <= c->n_tensors; t++) start[t] = start[t - 1] + count[t - 1];
    slice_ref *refs = adt_calloc((size_t)start[c->n_tensors] + 1, sizeof *refs);
    memset(count, 0, (size_t)c->n_tensors * sizeof *count);
    for (int f = 0; f < c->n_files; f++)
        for (int k = 0; k < c->files[f].n_slices; k++) {
            const adt_dckpt_slice *s = &c->files[f].slices[k];
            refs[start[s->tensor] + count[s->tensor]++] = (slice_ref){s, c->files[f].name};
        }
    int rc = ADT_OK;
    for (int t = 0; t < c->n_tensors && !rc; t++) {
        const adt_dckpt_tensor *ten = &c->tensors[t];
        const slice_ref *r = refs + start[t];
        int k = count[t];
        int64_t numel = 1, have = 0;
        for (int d = 0; d < ten->ndim; d++) numel *= ten->shape[d];
        for (int i = 0; i < k && !rc; i++) {
            int64_t n = 1;
            for (int d = 0; d < ten->ndim; d++) n *= r[i].s->shape[d];
            have += n;
            for (int j = 0; j < i && !rc; j++)
                if (slice_overlap(r[i].s, r[j].s, ten->ndim))
                    rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s': the slices in files '%s' and '%s' overlap", c->name,
                                   ten->name, r[j].file, r[i].file);
        }
        if (rc || have == numel) continue;
        char sh[96], at[96];
        int64_t pt[ADT_MAX_DIMS];
        if (find_hole(ten, r, k, pt))
            rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' %s is incomplete: no file holds element %s (the slices "
                           "cover %lld of %lld elements)", c->name, ten->name, dims_str(sh, sizeof sh, ten->ndim, ten->shape),
                           dims_str(at, sizeof at, ten->ndim, pt), (long long)have, (long long)numel);
        else
            rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' %s is incomplete: the slices cover %lld of %lld elements",
                           c->name, ten->name, dims_str(sh, sizeof sh, ten->ndim, ten->shape), (long long)have,
                           (long long)numel);
    }
    free(count);
    free(start);
    free(refs);
    return rc;
}

/* ---- parse, open, close ------------------------------------------------------------------------ */

static int parse_root(adt_dckpt *c, const cJSON *root) {
    static const char *const fields[] = {"format", "step", "world", "metadata", "tensors", "files", NULL};
    const cJSON *f[6];
    /* the format first: a manifest of another version is that, not a list of odd fields */
    int rc = get_fields(c->name, root, "the manifest", fields, 0, f);
    if (rc) return rc;
    if (!cJSON_IsString(f[0]) || strcmp(f[0]->valuestring, DCKPT_FORMAT))
        return adt_error(ADT_ERR_FORMAT, "%s: format is %s%.40s%s, expected \"%s\"", c->name, cJSON_IsString(f[0]) ? "\"" : "",
                         cJSON_IsString(f[0]) ? f[0]->valuestring : f[0] ? json_kind(f[0]) : "missing",
                         cJSON_IsString(f[0]) ? "\"" : "", DCKPT_FORMAT);
    if ((rc = get_fields(c->name, root, "the manifest", fields, 6, f))) return rc;
    int64_t world = 0;
    if ((rc = get_int(c->name, f[1], "step", 0, (int64_t)MAX_JSON_INT, &c->step)) ||
        (rc = get_int(c->name, f[2], "world", 1, MAX_WORLD, &world)))
        return rc;
    c->world = (int)world;
    if ((rc = parse_metadata(c, f[3])) || (rc = parse_tensors(c, f[4])) || (rc = parse_files(c, f[5]))) return rc;
    return check_coverage(c);
}

/* "invalid JSON near line L, column C" for a person who opens the file. */
static int json_error(const char *name, const char *text, size_t n, const char *end) {
    size_t off = end && end >= text && (size_t)(end - text) <= n ? (size_t)(end - text) : n;
    int line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') line++, col = 1;
        else col++;
    }
    return adt_error(ADT_ERR_FORMAT, "%s: invalid JSON at line %d, column %d", name, line, col);
}

int adt_dckpt_parse(adt_dckpt **out, const char *dir, const char *name, const char *text, size_t n) {
    *out = NULL;
    adt_dckpt *c = adt_calloc(1, sizeof *c);
    c->name = adt_strdup(name ? name : "<manifest>");
    c->dir = dir ? adt_strdup(dir) : NULL;
    const char *end = NULL;
    cJSON *root = memchr(text, 0, n) ? NULL : cJSON_ParseWithLengthOpts(text, n, &end, 0);
    int rc;
    if (!root) {
        rc = memchr(text, 0, n) ? adt_error(ADT_ERR_FORMAT, "%s: contains a NUL byte, expected JSON text", c->name)
                                : json_error(c->name, text, n, end);
    } else {
        /* trailing bytes after the object: anything but blanks is not ours */
        size_t used = (size_t)(end - text);
        while (used < n && strchr(" \t\r\n", text[used])) used++;
        rc = used < n ? json_error(c->name, text, n, text + used) : parse_root(c, root);
        cJSON_Delete(root);
    }
    if (rc) {
        adt_dckpt_close(c);
        return rc;
    }
    *out = c;
    return ADT_OK;
}

char *ckpt_dckpt_path(const adt_dckpt *c, const char *leaf) {
    size_t n = strlen(c->dir ? c->dir : ".") + strlen(leaf) + 2;
    char *p = adt_malloc(n);
    snprintf(p, n, "%s/%s", c->dir ? c->dir : ".", leaf);
    return p;
}

int adt_dckpt_open(adt_dckpt **out, const char *dir) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return adt_error(ADT_ERR_IO, "%s: %s, expected a checkpoint directory", dir,
                         errno == ENOENT ? "no such directory" : "not a directory");
    size_t dl = strlen(dir) + sizeof "/" DCKPT_MANIFEST;
    char *path = adt_malloc(dl);
    snprintf(path, dl, "%s/%s", dir, DCKPT_MANIFEST);
    if (stat(path, &st) != 0) {
        int e = errno;
        free(path);
        if (e == ENOENT)
            return adt_error(ADT_ERR_IO, "%s: no committed checkpoint (no %s: the save did not finish, or this is not a "
                             "checkpoint directory)", dir, DCKPT_MANIFEST);
        return adt_error(ADT_ERR_IO, "%s/%s: cannot stat: %s", dir, DCKPT_MANIFEST, strerror(e));
    }
    char *text;
    size_t n;
    int rc = adt_file_read(path, MAX_MANIFEST_BYTES, "a checkpoint manifest", &text, &n);
    adt_dckpt *c = NULL;
    if (!rc) rc = adt_dckpt_parse(&c, dir, path, text, n);
    free(text);
    free(path);
    if (rc) return rc;
    /* every file there, whole: a torn or half-copied checkpoint is refused before anything loads */
    for (int i = 0; i < c->n_files && !rc; i++) {
        char *fp = ckpt_dckpt_path(c, c->files[i].name);
        if (stat(fp, &st) != 0)
            rc = adt_error(ADT_ERR_IO, "%s: names %s, which %s", c->name, fp,
                           errno == ENOENT ? "is missing (an incomplete copy of the checkpoint?)" : strerror(errno));
        else if ((uint64_t)st.st_size != c->files[i].bytes)
            rc = adt_error(ADT_ERR_FORMAT, "%s: file is %lld bytes, the manifest says %llu (%s)", fp, (long long)st.st_size,
                           (unsigned long long)c->files[i].bytes,
                           (uint64_t)st.st_size < c->files[i].bytes ? "truncated" : "changed since the save");
        free(fp);
    }
    if (rc) {
        adt_dckpt_close(c);
        return rc;
    }
    *out = c;
    return ADT_OK;
}

void adt_dckpt_close(adt_dckpt *c) {
    if (!c) return;
    for (int i = 0; i < c->n_tensors; i++) free((char *)c->tensors[i].name);
    for (int i = 0; i < c->n_files; i++) free((char *)c->files[i].name);
    ckpt_meta_free(&c->meta);
    free(c->tensors);
    free(c->by_name);
    free(c->files);
    free(c->slices);
    free(c->dir);
    free(c->name);
    free(c);
}

/* ---- accessors --------------------------------------------------------------------------------- */

const char *ckpt_dckpt_name(const adt_dckpt *c) { return c->name; }
int64_t adt_dckpt_step(const adt_dckpt *c) { return c->step; }
int adt_dckpt_world(const adt_dckpt *c) { return c->world; }
int adt_dckpt_tensor_count(const adt_dckpt *c) { return c->n_tensors; }
const adt_dckpt_tensor *adt_dckpt_tensor_get(const adt_dckpt *c, int i) {
    return i >= 0 && i < c->n_tensors ? &c->tensors[i] : NULL;
}
int adt_dckpt_file_count(const adt_dckpt *c) { return c->n_files; }
const adt_dckpt_file *adt_dckpt_file_get(const adt_dckpt *c, int i) { return i >= 0 && i < c->n_files ? &c->files[i] : NULL; }

const char *adt_dckpt_metadata(const adt_dckpt *c, const char *key) { return ckpt_meta_find(&c->meta, key); }
int adt_dckpt_metadata_count(const adt_dckpt *c) { return c->meta.n; }
int adt_dckpt_metadata_get(const adt_dckpt *c, int i, const char **key, const char **value) {
    if (i < 0 || i >= c->meta.n) return adt_error(ADT_ERR_ARG, "%s: no metadata entry %d (%d entries)", c->name, i, c->meta.n);
    *key = c->meta.keys[i];
    *value = c->meta.vals[i];
    return ADT_OK;
}
