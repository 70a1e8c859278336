/*
 * dckpt.c - distributed, resharding checkpoints (include/adtrain/ckpt.h): each rank writes the
 * blocks it is the writer of to its own safetensors file, one rank commits the manifest, and any
 * other plan on any other world size loads by box intersection.
 *
 * Nothing here communicates. The writer of a replicated block is decided by every rank alone
 * from the plan (all ranks compute the same assignment), the parts a commit needs are short
 * JSON texts the caller gathers however it likes, and a loading rank reads the files it needs
 * itself. The manifest is the commit point: it is renamed into place after every file it names
 * is complete, and it records each file's size and crc32c, so half a save never loads.
 */
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "ckpt_internal.h"

/* ---- who writes which block ------------------------------------------------------------------ */

/* One mesh position's block of one tensor, for grouping identical blocks. */
typedef struct holder {
    adt_box box;
    int rank; /* global rank at the position */
    int pos;  /* mesh position */
} holder;

static int cmp_holder(const void *a, const void *b) {
    const holder *x = a, *y = b;
    for (int d = 0; d < x->box.shape.ndim; d++) {
        if (x->box.offset[d] != y->box.offset[d]) return x->box.offset[d] < y->box.offset[d] ? -1 : 1;
        if (x->box.shape.dim[d] != y->box.shape.dim[d]) return x->box.shape.dim[d] < y->box.shape.dim[d] ? -1 : 1;
    }
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int same_box(const adt_box *a, const adt_box *b) {
    if (!adt_shape_equal(&a->shape, &b->shape)) return 0;
    for (int d = 0; d < a->shape.ndim; d++)
        if (a->offset[d] != b->offset[d]) return 0;
    return 1;
}

/* mine[v] = 1 for each saved value whose block this rank writes. The rule (ckpt.h): values in
 * graph order; each distinct block to the holder with the fewest bytes assigned so far, ties to
 * the lowest rank. It reads only the plan (layouts and mesh), identical on every rank. */
static int plan_writers(const adt_ckpt_view *vw, int with_state, char *mine) {
    const adt_graph *g = vw->g;
    if (!vw->local) {
        for (int v = 0; v < g->n_values; v++) mine[v] = ckpt_is_saved(&g->values[v], with_state);
        return ADT_OK;
    }
    const adt_mesh *m = vw->mesh;
    int me = adt_mesh_index(m, vw->coord);
    int64_t *load = adt_calloc((size_t)m->nranks, sizeof *load);
    holder *h = adt_malloc((size_t)m->nranks * sizeof *h);
    int rc = ADT_OK;
    for (int v = 0; v < g->n_values && !rc; v++) {
        const adt_value *val = &g->values[v];
        mine[v] = 0;
        int li = ckpt_view_index(vw, v);
        /* a stage decides among its own positions, for what it holds and no earlier stage does */
        if (!ckpt_is_saved(val, with_state) || li < 0 || (vw->elsewhere && vw->elsewhere[v])) continue;
        const adt_ndsbp *lay = &vw->local->layout[li];
        char s[64];
        if (lay->ndim != m->ndim || adt_ndsbp_partial_mask(lay))
            rc = adt_error(ADT_ERR_ARG, "'%s' is held as %s on a %d-axis mesh; a checkpoint needs split or replicated "
                           "blocks", val->name, adt_ndsbp_str(lay, s, sizeof s), m->ndim);
        adt_box own;
        if (!rc && ckpt_view_block(vw, v, &own) >= 0) {
            adt_box want = adt_ndsbp_block(lay, m, vw->coord, val->shape);
            if (!same_box(&own, &want))
                rc = adt_error(ADT_ERR_ARG, "'%s': the local value is not the block its layout %s gives this coordinate "
                               "(a view whose coord does not match its local graph?)", val->name,
                               adt_ndsbp_str(lay, s, sizeof s));
        }
        for (int p = 0; p < m->nranks && !rc; p++) {
            int c[ADT_MAX_MESH_DIMS];
            adt_mesh_coord(m, p, c);
            h[p] = (holder){adt_ndsbp_block(lay, m, c, val->shape), adt_mesh_rank(m, c), p};
        }
        if (rc) break;
        qsort(h, (size_t)m->nranks, sizeof *h, cmp_holder);
        int64_t es = (int64_t)adt_dtype_size(val->dtype);
        for (int i = 0, j; i < m->nranks; i = j) {
            int best = i;
            for (j = i + 1; j < m->nranks && same_box(&h[j].box, &h[i].box); j++)
                if (load[h[j].pos] < load[h[best].pos]) best = j; /* sorted by rank: ties keep the lowest */
            int64_t n = adt_shape_numel(&h[i].box.shape);
            if (!n) continue;
            load[h[best].pos] += n * es;
            if (h[best].pos == me) mine[v] = 1;
        }
    }
    free(load);
    free(h);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------------- */

/* mkdir -p */
static int make_dirs(const char *dir) {
    char *p = adt_strdup(dir);
    int rc = ADT_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char keep = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            rc = adt_error(ADT_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
            break;
        }
        *s = keep;
        if (!keep) break;
    }
    struct stat st;
    if (!rc && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = adt_error(ADT_ERR_IO, "%s: not a directory", dir);
    free(p);
    return rc;
}

static cJSON *dims_json(int ndim, const int64_t *d) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)d[i]));
    return a;
}

static void rank_file_name(char *buf, size_t n, int64_t step, int rank, int world) {
    snprintf(buf, n, "step%" PRId64 "-rank%05d-of-%05d.safetensors", step, rank, world);
}

int adt_dckpt_write_rank(const char *dir, int64_t step, const adt_ckpt_view *vw, int with_state, char **part) {
    *part = NULL;
    const adt_graph *g = vw->g;
    if (!dir || !*dir) return adt_error(ADT_ERR_ARG, "checkpoint: an empty directory name");
    if (step < 0) return adt_error(ADT_ERR_ARG, "checkpoint %s: step %" PRId64 ", expected >= 0", dir, step);
    if (vw->local && (!vw->mesh || !vw->coord))
        return adt_error(ADT_ERR_ARG, "checkpoint %s: a view with a local graph needs its mesh and coordinate", dir);
    int rank = vw->local ? adt_mesh_rank(vw->mesh, vw->coord) : 0;
    int world = !vw->local ? 1 : vw->world ? vw->world : vw->mesh->nranks;
    char *mine = adt_calloc((size_t)g->n_values + 1, 1);
    int rc = plan_writers(vw, with_state, mine);
    if (rc) {
        free(mine);
        return adt_error_prefix(rc, "checkpoint %s, rank %d: ", dir, rank);
    }
    adt_st_writer *w = adt_st_writer_create();
    cJSON *slices = cJSON_CreateArray();
    int n_slices = 0;
    for (int v = 0; v < g->n_values && !rc; v++) {
        adt_box box;
        int lv = mine[v] ? ckpt_view_block(vw, v, &box) : -1;
        if (lv < 0) continue;
        rc = adt_st_writer_add(w, g->values[v].name, ADT_ST_F32, box.shape.ndim, box.shape.dim, vw->data(vw->ctx, lv));
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "tensor", g->values[v].name);
        cJSON_AddItemToObject(s, "offset", dims_json(box.shape.ndim, box.offset));
        cJSON_AddItemToObject(s, "shape", dims_json(box.shape.ndim, box.shape.dim));
        cJSON_AddItemToArray(slices, s);
        n_slices++;
    }
    free(mine);
    char fname[96], num[32];
    rank_file_name(fname, sizeof fname, step, rank, world);
    size_t pl = strlen(dir) + strlen(fname) + 2;
    char *path = adt_malloc(pl);
    snprintf(path, pl, "%s/%s", dir, fname);
    uint64_t bytes = 0;
    uint32_t crc = 0;
    if (!rc && n_slices) {
        snprintf(num, sizeof num, "%" PRId64, step);
        adt_st_writer_set_metadata(w, "adtrain.dckpt.step", num);
        snprintf(num, sizeof num, "%d", rank);
        adt_st_writer_set_metadata(w, "adtrain.dckpt.rank", num);
        snprintf(num, sizeof num, "%d", world);
        adt_st_writer_set_metadata(w, "adtrain.dckpt.world", num);
        rc = make_dirs(dir);
        if (!rc) rc = adt_st_writer_save_sum(w, path, &bytes, &crc);
    }
    adt_st_writer_free(w);
    free(path);
    if (rc) {
        cJSON_Delete(slices);
        return adt_error_prefix(rc, "checkpoint %s, rank %d: ", dir, rank);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", DCKPT_PART_FORMAT);
    cJSON_AddNumberToObject(root, "step", (double)step);
    cJSON_AddNumberToObject(root, "rank", rank);
    cJSON_AddNumberToObject(root, "world", world);
    if (n_slices) {
        cJSON *f = cJSON_AddObjectToObject(root, "file");
        char hex[16];
        snprintf(hex, sizeof hex, "%08x", crc);
        cJSON_AddStringToObject(f, "name", fname);
        cJSON_AddNumberToObject(f, "rank", rank);
        cJSON_AddNumberToObject(f, "bytes", (double)bytes);
        cJSON_AddStringToObject(f, "crc32c", hex);
        cJSON_AddItemToObject(f, "slices", slices);
    } else {
        cJSON_Delete(slices);
        cJSON_AddNullToObject(root, "file");
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return adt_error(ADT_ERR_NOMEM, "checkpoint %s, rank %d: out of memory", dir, rank);
    *part = adt_strdup(text);
    cJSON_free(text);
    return ADT_OK;
}

/* ---- commit ----------------------------------------------------------------------------------- */

/* Checks one rank's part and returns its "file" item (NULL for a rank that wrote nothing) and
 * its rank and world. */
static int read_part(const char *dir, int i, const cJSON *p, int64_t step, int *rank, int *world, const cJSON **file) {
    static const char *const keys[] = {"format", "step", "rank", "world", "file"};
    const cJSON *f[5];
    for (int k = 0; k < 5; k++) {
        f[k] = cJSON_GetObjectItemCaseSensitive(p, keys[k]);
        if (!f[k]) return adt_error(ADT_ERR_ARG, "checkpoint %s: part %d has no '%s' (expected the text adt_dckpt_write_rank "
                                    "gave)", dir, i, keys[k]);
    }
    if (!cJSON_IsString(f[0]) || strcmp(f[0]->valuestring, DCKPT_PART_FORMAT))
        return adt_error(ADT_ERR_ARG, "checkpoint %s: part %d is not a checkpoint part (format)", dir, i);
    if (!cJSON_IsNumber(f[1]) || !cJSON_IsNumber(f[2]) || !cJSON_IsNumber(f[3]) || (!cJSON_IsNull(f[4]) && !cJSON_IsObject(f[4])))
        return adt_error(ADT_ERR_ARG, "checkpoint %s: part %d: step, rank and world must be numbers, file an object or null",
                         dir, i);
    if (f[1]->valuedouble != (double)step)
        return adt_error(ADT_ERR_ARG, "checkpoint %s: part %d is of step %.0f, the commit is of step %" PRId64, dir, i,
                         f[1]->valuedouble, step);
    double r = f[2]->valuedouble, w = f[3]->valuedouble;
    if (!(r >= 0 && r <= 0x7fffffff && r == (int)r && w >= 1 && w <= 0x7fffffff && w == (int)w))
        return adt_error(ADT_ERR_ARG, "checkpoint %s: part %d: rank %g of world %g, expected integers", dir, i, r, w);
    *rank = (int)r;
    *world = (int)w;
    *file = cJSON_IsObject(f[4]) ? f[4] : NULL;
    return ADT_OK;
}

/* A growing text buffer. */
typedef struct text_buf {
    char *s;
    size_t n, cap;
} text_buf;

static void put(text_buf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->s = adt_realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, k + 1);
    b->n += k;
}

/* j as compact JSON. */
static void put_json(text_buf *b, const cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    ADT_ASSERT(s);
    put(b, s);
    cJSON_free(s);
}

/* The manifest, one tensor and one slice per line: short enough to read, and to diff. */
static char *manifest_text(const cJSON *root) {
    text_buf b = {0};
    put(&b, "{\n");
    for (const cJSON *f = root->child; f; f = f->next) {
        put(&b, "  \"");
        put(&b, f->string);
        put(&b, "\": ");
        if (!cJSON_IsArray(f)) {
            put_json(&b, f);
        } else {
            put(&b, "[");
            for (const cJSON *e = f->child; e; e = e->next) {
                put(&b, "\n    ");
                const cJSON *sl = cJSON_GetObjectItemCaseSensitive(e, "slices");
                if (!cJSON_IsArray(sl) || !cJSON_IsObject(e)) {
                    put_json(&b, e);
                } else { /* a file: its fields, then its slices one per line */
                    put(&b, "{");
                    for (const cJSON *k = e->child; k; k = k->next) {
                        if (k == sl) continue;
                        put(&b, "\"");
                        put(&b, k->string);
                        put(&b, "\": ");
                        put_json(&b, k);
                        put(&b, ", ");
                    }
                    put(&b, "\"slices\": [");
                    for (const cJSON *x = sl->child; x; x = x->next) {
                        put(&b, "\n      ");
                        put_json(&b, x);
                        if (x->next) put(&b, ",");
                    }
                    put(&b, "]}");
                }
                if (e->next) put(&b, ",");
            }
            put(&b, "\n  ]");
        }
        put(&b, f->next ? ",\n" : "\n");
    }
    put(&b, "}\n");
    return b.s;
}

/* The manifest text of a commit, from its parts (in rank order) and the model's tensors. */
static int build_manifest(const char *dir, int64_t step, const adt_graph *g, int with_state, const char *const *parts,
                          int n_parts, const char *const *meta, int n_meta, char **text) {
    *text = NULL;
    if (n_parts < 1) return adt_error(ADT_ERR_ARG, "checkpoint %s: no parts to commit", dir);
    cJSON **pj = adt_calloc((size_t)n_parts, sizeof *pj);
    const cJSON **file = adt_calloc((size_t)n_parts, sizeof *file);
    int *rank = adt_calloc((size_t)n_parts, sizeof *rank);
    int world0 = 0, rc = ADT_OK;
    for (int i = 0; i < n_parts && !rc; i++) {
        int world = 0;
        pj[i] = parts[i] ? cJSON_Parse(parts[i]) : NULL;
        if (!cJSON_IsObject(pj[i])) rc = adt_error(ADT_ERR_ARG, "checkpoint %s: part %d is not a JSON object", dir, i);
        else rc = read_part(dir, i, pj[i], step, &rank[i], &world, &file[i]);
        if (!rc && i == 0) world0 = world;
        if (!rc && (world != world0 || world != n_parts))
            rc = adt_error(ADT_ERR_ARG, "checkpoint %s: part %d is of a world of %d, part 0 of %d, and %d parts were given; "
                           "expected one part from each rank", dir, i, world, world0, n_parts);
        for (int k = 0; k < i && !rc; k++)
            if (rank[k] == rank[i])
                rc = adt_error(ADT_ERR_ARG, "checkpoint %s: parts %d and %d both come from rank %d", dir, k, i, rank[i]);
    }
    if (!rc) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "format", DCKPT_FORMAT);
        cJSON_AddNumberToObject(root, "step", (double)step);
        cJSON_AddNumberToObject(root, "world", n_parts);
        cJSON *md = cJSON_AddObjectToObject(root, "metadata");
        for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(md, meta[2 * i], meta[2 * i + 1]);
        cJSON *ts = cJSON_AddArrayToObject(root, "tensors");
        for (int v = 0; v < g->n_values; v++) {
            const adt_value *val = &g->values[v];
            if (!ckpt_is_saved(val, with_state)) continue;
            cJSON *t = cJSON_CreateObject();
            cJSON_AddStringToObject(t, "name", val->name);
            cJSON_AddStringToObject(t, "dtype", "F32");
            cJSON_AddItemToObject(t, "shape", dims_json(val->shape.ndim, val->shape.dim));
            if (val->file_shape.ndim) /* the graph regroups its axes: the export restores PyTorch's shape */
                cJSON_AddItemToObject(t, "file_shape", dims_json(val->file_shape.ndim, val->file_shape.dim));
            cJSON_AddItemToArray(ts, t);
        }
        cJSON *fs = cJSON_AddArrayToObject(root, "files");
        for (int r = 0; r < n_parts; r++) { /* by rank, so the manifest reads in order */
            int best = -1;
            for (int i = 0; i < n_parts; i++)
                if (file[i] && (best < 0 || rank[i] < rank[best])) best = i;
            if (best < 0) break;
            cJSON_AddItemToArray(fs, cJSON_Duplicate(file[best], 1));
            file[best] = NULL;
        }
        *text = manifest_text(root);
        cJSON_Delete(root);
    }
    for (int i = 0; i < n_parts; i++) cJSON_Delete(pj[i]);
    free(pj);
    free(file);
    free(rank);
    return rc;
}

/* Removes the rank files of saves up to `step` that the committed manifest does not name: the
 * files of an earlier save into the same directory, and of a save that never committed. Later
 * steps are left alone (a save may be under way). */
static void remove_stale(const adt_dckpt *c, int64_t step) {
    char *dirpath = ckpt_dckpt_path(c, ".");
    DIR *d = opendir(dirpath);
    free(dirpath);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        int r, w, used = 0;
        if (sscanf(e->d_name, "step%lld-rank%d-of-%d.safetensors%n", &s, &r, &w, &used) != 3 || e->d_name[used] || s > step)
            continue;
        int named = 0;
        for (int i = 0; i < adt_dckpt_file_count(c) && !named; i++) named = !strcmp(adt_dckpt_file_get(c, i)->name, e->d_name);
        if (named) continue;
        char *p = ckpt_dckpt_path(c, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
}

int adt_dckpt_commit(const char *dir, int64_t step, const adt_graph *g, int with_state, const char *const *parts,
                     int n_parts, const char *const *meta, int n_meta) {
    char *text;
    int rc = build_manifest(dir, step, g, with_state, parts, n_parts, meta, n_meta, &text);
    if (rc) return rc;
    size_t pl = strlen(dir) + sizeof "/" DCKPT_MANIFEST;
    char *path = adt_malloc(pl);
    snprintf(path, pl, "%s/%s", dir, DCKPT_MANIFEST);
    /* the same checks a reader makes, before anything is committed */
    adt_dckpt *c = NULL;
    rc = adt_dckpt_parse(&c, dir, path, text, strlen(text));
    for (int i = 0; !rc && i < adt_dckpt_file_count(c); i++) {
        const adt_dckpt_file *f = adt_dckpt_file_get(c, i);
        char *fp = ckpt_dckpt_path(c, f->name);
        struct stat st;
        if (stat(fp, &st) != 0)
            rc = adt_error(ADT_ERR_IO, "%s: rank %d's file is not there: %s", fp, f->rank, strerror(errno));
        else if ((uint64_t)st.st_size != f->bytes)
            rc = adt_error(ADT_ERR_IO, "%s: rank %d's file is %lld bytes, it reported %llu", fp, f->rank,
                           (long long)st.st_size, (unsigned long long)f->bytes);
        free(fp);
    }
    if (!rc) rc = make_dirs(dir); /* no rank wrote a file only for an empty model, but then too */
    if (!rc) {
        const void *chunk[1] = {text};
        size_t len[1] = {strlen(text)};
        rc = ckpt_write_atomic(path, chunk, len, 1, NULL, NULL);
    }
    if (!rc) remove_stale(c, step);
    adt_dckpt_close(c);
    free(text);
    free(path);
    if (rc) return adt_error_prefix(rc, "committing checkpoint %s: ", dir);
    return ADT_OK;
}

int adt_dckpt_save(const char *dir, int64_t step, const adt_ckpt_view *vw, int with_state, const char *const *meta,
                   int n_meta) {
    if (vw->local && ((vw->mesh && vw->mesh->nranks != 1) || vw->world > 1))
        return adt_error(ADT_ERR_ARG, "checkpoint %s: adt_dckpt_save holds one process's view of the whole model; a world "
                         "of %d saves with adt_dckpt_write_rank on every rank and adt_dckpt_commit", dir,
                         vw->world > 1 ? vw->world : vw->mesh->nranks);
    char *part;
    int rc = adt_dckpt_write_rank(dir, step, vw, with_state, &part);
    if (rc) return rc;
    const char *parts[1] = {part};
    rc = adt_dckpt_commit(dir, step, vw->g, with_state, parts, 1, meta, n_meta);
    free(part);
    return rc;
}

/* ---- reading ---------------------------------------------------------------------------------- */

/* Opens file i of the checkpoint against its recorded size and crc32c. */
static int open_file(const adt_dckpt *c, int i, adt_st_file **f) {
    const adt_dckpt_file *fl = adt_dckpt_file_get(c, i);
    char *path = ckpt_dckpt_path(c, fl->name);
    int rc = adt_st_open_checked(f, path, fl->bytes, fl->crc32c);
    free(path);
    return rc;
}

/* The file tensor holding slice s, checked against what the manifest says of it. */
static int slice_tensor(const adt_dckpt *c, const adt_st_file *f, const adt_dckpt_slice *s, const adt_st_tensor **out) {
    const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, s->tensor);
    const adt_st_tensor *x = adt_st_find(f, t->name);
    char a[96], b[96];
    adt_shape want = {.ndim = t->ndim};
    for (int d = 0; d < t->ndim; d++) want.dim[d] = s->shape[d];
    if (!x) return adt_error(ADT_ERR_FORMAT, "%s: has no tensor '%s', which the manifest says it holds", adt_st_name(f), t->name);
    adt_shape have = {.ndim = x->ndim};
    int same = x->ndim == t->ndim;
    for (int d = 0; same && d < x->ndim; d++) have.dim[d] = x->shape[d];
    if (!same || !adt_shape_equal(&have, &want) || x->dtype != t->dtype)
        return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' is %s %s, the manifest says %s %s", adt_st_name(f), t->name,
                         adt_st_dtype_name(x->dtype), same ? adt_shape_str(&have, a, sizeof a) : "of another rank",
                         adt_st_dtype_name(t->dtype), adt_shape_str(&want, b, sizeof b));
    *out = x;
    return ADT_OK;
}

static adt_box slice_box(const adt_dckpt *c, const adt_dckpt_slice *s) {
    const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, s->tensor);
    adt_box b;
    memset(&b, 0, sizeof b);
    b.global.ndim = b.shape.ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        b.global.dim[d] = t->shape[d];
        b.shape.dim[d] = s->shape[d];
        b.offset[d] = s->offset[d];
    }
    return b;
}

/* Where each manifest tensor goes: a destination block (contiguous at dst), or nowhere. */
typedef struct dest {
    void *dst;
    adt_box box;
    int64_t got; /* elements filled so far */
} dest;

/* Copies every part of every slice that some destination needs, reading only the files that
 * hold such parts. */
static int fill(const adt_dckpt *c, dest *to) {
    int rc = ADT_OK;
    for (int i = 0; i < adt_dckpt_file_count(c) && !rc; i++) {
        const adt_dckpt_file *fl = adt_dckpt_file_get(c, i);
        int need = 0;
        for (int k = 0; k < fl->n_slices && !need; k++) {
            adt_box sb = slice_box(c, &fl->slices[k]);
            dest *d = &to[fl->slices[k].tensor];
            need = d->dst && adt_box_overlap(&d->box, &sb, NULL) > 0;
        }
        if (!need) continue;
        adt_st_file *f;
        if ((rc = open_file(c, i, &f))) break;
        for (int k = 0; k < fl->n_slices && !rc; k++) {
            const adt_dckpt_slice *s = &fl->slices[k];
            dest *d = &to[s->tensor];
            adt_box sb = slice_box(c, s);
            int64_t n = d->dst ? adt_box_overlap(&d->box, &sb, NULL) : 0;
            const adt_st_tensor *x;
            if (!n || (rc = slice_tensor(c, f, s, &x))) continue;
            adt_box_transfer(d->dst, &d->box, x->data, &sb, adt_st_dtype_size(x->dtype), 0);
            d->got += n;
        }
        adt_st_close(f);
    }
    /* the manifest's slices tile every tensor, so this only fails on a bug */
    for (int t = 0; t < adt_dckpt_tensor_count(c) && !rc; t++)
        if (to[t].dst && to[t].got != adt_shape_numel(&to[t].box.shape))
            rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s': the files gave %lld of the %lld elements of this block",
                           ckpt_dckpt_name(c), adt_dckpt_tensor_get(c, t)->name, (long long)to[t].got,
                           (long long)adt_shape_numel(&to[t].box.shape));
    return rc;
}

int adt_dckpt_load(const adt_dckpt *c, const adt_ckpt_view *vw, int with_state) {
    int n = adt_dckpt_tensor_count(c);
    const char **names = adt_malloc((size_t)n * sizeof *names + 1);
    int *value_of = adt_malloc((size_t)n * sizeof *value_of + 1);
    dest *to = adt_calloc((size_t)n + 1, sizeof *to);
    for (int i = 0; i < n; i++) names[i] = adt_dckpt_tensor_get(c, i)->name;
    int rc = ckpt_match_names(ckpt_dckpt_name(c), names, n, vw->g, with_state, 0, value_of);
    for (int i = 0; i < n && !rc; i++) {
        int v = value_of[i];
        if (v < 0) continue;
        const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, i);
        const adt_value *val = &vw->g->values[v];
        adt_shape have = {.ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++) have.dim[d] = t->shape[d];
        char a[96], b[96];
        if (t->dtype != ADT_ST_F32 || !adt_shape_equal(&have, &val->shape)) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' is %s %s, the model expects F32 %s", ckpt_dckpt_name(c), t->name,
                           adt_st_dtype_name(t->dtype), adt_shape_str(&have, a, sizeof a),
                           adt_shape_str(&val->shape, b, sizeof b));
            break;
        }
        int lv = ckpt_view_block(vw, v, &to[i].box);
        if (lv >= 0) to[i].dst = vw->data(vw->ctx, lv);
    }
    if (!rc) rc = fill(c, to);
    free(names);
    free(value_of);
    free(to);
    return rc;
}

int adt_dckpt_verify(const adt_dckpt *c) {
    int rc = ADT_OK;
    for (int i = 0; i < adt_dckpt_file_count(c) && !rc; i++) {
        const adt_dckpt_file *fl = adt_dckpt_file_get(c, i);
        adt_st_file *f;
        if ((rc = open_file(c, i, &f))) break;
        for (int k = 0; k < fl->n_slices && !rc; k++) {
            const adt_st_tensor *x;
            rc = slice_tensor(c, f, &fl->slices[k], &x);
        }
        if (!rc && adt_st_count(f) != fl->n_slices)
            rc = adt_error(ADT_ERR_FORMAT, "%s: holds %d tensors, the manifest names %d", adt_st_name(f), adt_st_count(f),
                           fl->n_slices);
        adt_st_close(f);
    }
    return rc;
}

int adt_dckpt_export(const adt_dckpt *c, const char *path, int with_state) {
    int n = adt_dckpt_tensor_count(c);
    dest *to = adt_calloc((size_t)n + 1, sizeof *to);
    for (int i = 0; i < n; i++) {
        const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, i);
        if (!with_state && ckpt_is_opt_state_name(t->name)) continue;
        adt_box whole = slice_box(c, &(adt_dckpt_slice){.tensor = i});
        whole.shape = whole.global;
        to[i].box = whole;
        to[i].dst = adt_alloc_aligned((size_t)adt_shape_numel(&whole.shape) * adt_st_dtype_size(t->dtype) + 1);
    }
    int rc = fill(c, to);
    adt_st_writer *w = adt_st_writer_create();
    for (int i = 0; i < n && !rc; i++) {
        const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, i);
        if (to[i].dst)
            rc = t->file_ndim ? adt_st_writer_add(w, t->name, t->dtype, t->file_ndim, t->file_shape, to[i].dst)
                              : adt_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, to[i].dst);
    }
    for (int i = 0; i < adt_dckpt_metadata_count(c) && !rc; i++) {
        const char *k, *v;
        adt_dckpt_metadata_get(c, i, &k, &v);
        rc = adt_st_writer_set_metadata(w, k, v);
    }
    if (!rc) rc = adt_st_writer_save(w, path);
    adt_st_writer_free(w);
    for (int i = 0; i < n; i++) adt_free_aligned(to[i].dst);
    free(to);
    if (rc) return adt_error_prefix(rc, "exporting %s to %s: ", ckpt_dckpt_name(c), path);
    return ADT_OK;
}
