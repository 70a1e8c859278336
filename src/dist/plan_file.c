/*
 * plan_file.c - plans as JSON files (docs/formats.md, "Plan files"): the reader, in two phases
 * (parse: everything a file says on its own; bind: the layouts, resolved against the graph the
 * plan is for), and the writer, which ties layers of equal structure and equal layouts into one
 * entry so a plan of a deep model stays a page long.
 *
 * Every refusal names the file, the field ("mesh.ranks[3]", "layouts[1].nodes.matmul_12") and
 * what was expected; the strict field readers are the model configs' (models/cfg_internal.h).
 */
#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"
#include "models/cfg_internal.h"

#define PLAN_FORMAT "adtrain-plan"
#define PLAN_VERSION 1
#define PLAN_MAX_FILE_BYTES (64L << 20)
#define PLAN_MAX_DEVICES (1 << 20)
#define PLAN_MAX_BATCH (1 << 24)
#define PLAN_MAX_COUNT (1 << 28) /* nodes, values, layers */

static const char *const root_fields[] = {"format", "version", "strategy", "model", "batch", "microbatches",
                                          "batch_split", "optimizer", "mesh", "pipeline", "graph", "cost", "layouts",
                                          NULL};
static const char *const mesh_fields[] = {"shape", "axes", "ranks", "intra_axis", NULL};
static const char *const pipeline_fields[] = {"axis", "stages", NULL};
static const char *const graph_fields[] = {"nodes", "values", "layers", "checksum", NULL};
static const char *const cost_fields[] = {"alpha", "beta", "local", NULL};
static const char *const group_fields[] = {"layers", "leaves", "nodes", NULL};
static const char *const optim_names[] = {"adamw", "sgd", "sgd-momentum"};

/* ---- small readers ---------------------------------------------------------------------------- */

static const cJSON *get(const cJSON *obj, const char *field) { return cJSON_GetObjectItemCaseSensitive(obj, field); }

static int need_object(const cJSON *j, const char *what, const char *name) {
    if (cJSON_IsObject(j)) return ADT_OK;
    if (!j) return adt_error(ADT_ERR_ARG, "%s: missing field \"%s\" (expected an object)", name, what);
    return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected an object", name, what, adt_cfg_json_kind(j));
}

static int get_string(const cJSON *obj, const char *field, const char *what, const char *expect, const char *name,
                      const char **out) {
    const cJSON *j = get(obj, field);
    if (!j) return adt_error(ADT_ERR_ARG, "%s: missing field \"%s\" (expected %s)", name, what, expect);
    if (!cJSON_IsString(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected %s", name, what, adt_cfg_json_kind(j), expect);
    *out = j->valuestring;
    return ADT_OK;
}

/* The required integer field `field` of obj, named `what` (its path) in messages. */
static int get_int(const cJSON *obj, const char *field, const char *what, long lo, long hi, const char *name, int *out) {
    const cJSON *j = get(obj, field);
    if (!j) return adt_error(ADT_ERR_ARG, "%s: missing field \"%s\" (expected an integer in [%ld, %ld])", name, what, lo, hi);
    return adt_cfg_to_int(j, what, lo, hi, name, out);
}

/* An array of n_min..n_max numbers (integers when `integral`) into out[]; its length in *n. */
static int get_numbers(const cJSON *j, const char *what, int n_min, int n_max, double lo, double hi, const char *name,
                       double *out, int *n) {
    if (!cJSON_IsArray(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected an array of %d to %d numbers in [%g, %g]", name,
                         what, j ? adt_cfg_json_kind(j) : "missing", n_min, n_max, lo, hi);
    int len = cJSON_GetArraySize(j), i = 0;
    if (len < n_min || len > n_max)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" has %d entries, expected %d to %d", name, what, len, n_min, n_max);
    for (const cJSON *it = j->child; it; it = it->next, i++)
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= lo && it->valuedouble <= hi))
            return adt_error(ADT_ERR_ARG, "%s: field \"%s[%d]\" is %s, expected a number in [%g, %g]", name, what, i,
                             cJSON_IsNumber(it) ? "out of range" : adt_cfg_json_kind(it), lo, hi);
        else out[i] = it->valuedouble;
    *n = len;
    return ADT_OK;
}

static int axis_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n >= ADT_PLAN_AXIS_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-') return 0;
    return 1;
}

static int find_axis(const adt_plan *p, const char *s) {
    for (int a = 0; a < p->mesh.ndim; a++)
        if (!strcmp(p->axis[a], s)) return a;
    return -1;
}

static int axis_by_name(const adt_plan *p, const cJSON *j, const char *what, int *out) {
    char list[96] = "";
    for (int a = 0; a < p->mesh.ndim; a++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", a ? ", " : "", p->axis[a]);
    if (!cJSON_IsString(j) || (*out = find_axis(p, j->valuestring)) < 0)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s%s%s, expected the name of a mesh axis (%s)", p->name, what,
                         cJSON_IsString(j) ? "\"" : adt_cfg_json_kind(j), cJSON_IsString(j) ? j->valuestring : "",
                         cJSON_IsString(j) ? "\"" : "", list);
    return ADT_OK;
}

/* ---- phase 1: the file on its own ------------------------------------------------------------- */

static int parse_header(adt_plan *p, const cJSON *root) {
    const char *s = NULL;
    int rc, v;
    if ((rc = get_string(root, "format", "format", "\"" PLAN_FORMAT "\"", p->name, &s))) return rc;
    if (strcmp(s, PLAN_FORMAT))
        return adt_error(ADT_ERR_FORMAT, "%s: field \"format\" is \"%.40s\", expected \"" PLAN_FORMAT "\"", p->name, s);
    if ((rc = adt_cfg_get_int(root, "version", PLAN_VERSION, PLAN_VERSION, p->name, &v))) return rc;
    const cJSON *st = get(root, "strategy");
    if (st && (!cJSON_IsString(st) || strlen(st->valuestring) >= sizeof p->strategy))
        return adt_error(ADT_ERR_ARG, "%s: field \"strategy\" is %s, expected a string of at most %zu characters", p->name,
                         cJSON_IsString(st) ? "too long" : adt_cfg_json_kind(st), sizeof p->strategy - 1);
    snprintf(p->strategy, sizeof p->strategy, "%s", st ? st->valuestring : "");
    const cJSON *model = get(root, "model");
    if ((rc = need_object(model, "model", p->name))) return rc;
    char *text = cJSON_PrintUnformatted(model), mname[300];
    snprintf(mname, sizeof mname, "%s: model", p->name);
    rc = adt_model_cfg_parse(&p->model, text, mname);
    cJSON_free(text);
    if (rc) return rc;
    if ((rc = adt_cfg_get_int(root, "batch", 1, PLAN_MAX_BATCH, p->name, &p->batch))) return rc;
    p->microbatches = 1;
    if (get(root, "microbatches") &&
        (rc = adt_cfg_get_int(root, "microbatches", 1, p->batch, p->name, &p->microbatches)))
        return rc;
    if (p->batch % p->microbatches)
        return adt_error(ADT_ERR_ARG, "%s: field \"microbatches\" is %d, expected a divisor of \"batch\" (%d)", p->name,
                         p->microbatches, p->batch);
    if ((rc = get_string(root, "optimizer", "optimizer", "\"adamw\", \"sgd\" or \"sgd-momentum\"", p->name, &s))) return rc;
    int k = 0;
    while (k < 3 && strcmp(s, optim_names[k])) k++;
    if (k == 3)
        return adt_error(ADT_ERR_ARG, "%s: field \"optimizer\" is \"%.40s\", expected \"adamw\", \"sgd\" or \"sgd-momentum\"",
                         p->name, s);
    p->optim = k ? ADT_OPTIM_SGD : ADT_OPTIM_ADAMW;
    p->momentum = k == 2;
    return ADT_OK;
}

/* "batch_split": what the file says on its own (positive local batches, multiples of the
 * microbatches, summing to the batch); its length and the data axis wait for bind. */
static int parse_batch_split(adt_plan *p, const cJSON *root) {
    const cJSON *j = get(root, "batch_split");
    if (!j || cJSON_IsNull(j)) return ADT_OK;
    int len = cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 0;
    if (len < 1 || len > PLAN_MAX_DEVICES)
        return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\" is %s, expected an array of local batch sizes, one per "
                         "data-parallel replica, summing to \"batch\" (%d)", p->name,
                         cJSON_IsArray(j) ? "an empty array" : adt_cfg_json_kind(j), p->batch);
    int *sizes = adt_malloc((size_t)len * sizeof *sizes), n, rc;
    rc = adt_cfg_to_int_array(j, "batch_split", 1, len, 1, p->batch, "local batch sizes", p->name, sizes, &n);
    int64_t sum = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (sizes[i] % p->microbatches)
            rc = adt_error(ADT_ERR_ARG, "%s: field \"batch_split[%d]\" is %d, expected a multiple of \"microbatches\" "
                           "(%d): every microbatch takes the same share of each replica's batch", p->name, i, sizes[i],
                           p->microbatches);
        sum += sizes[i];
    }
    if (!rc && sum != p->batch)
        rc = adt_error(ADT_ERR_ARG, "%s: field \"batch_split\" sums to %lld, expected \"batch\" (%d)", p->name,
                       (long long)sum, p->batch);
    if (rc) {
        free(sizes);
        return rc;
    }
    p->batch_split = sizes, p->n_batch_split = n;
    return ADT_OK;
}

static int parse_mesh(adt_plan *p, const cJSON *root) {
    const cJSON *mj = get(root, "mesh");
    int rc, n;
    if ((rc = need_object(mj, "mesh", p->name)) || (rc = adt_cfg_check_fields(mj, mesh_fields, "mesh", p->name))) return rc;
    int dims[ADT_MAX_MESH_DIMS];
    const cJSON *sj = get(mj, "shape");
    if (!sj)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"mesh.shape\" (expected an array of 1 to %d mesh axis sizes)",
                         p->name, ADT_MAX_MESH_DIMS);
    if ((rc = adt_cfg_to_int_array(sj, "mesh.shape", 1, ADT_MAX_MESH_DIMS, 1, PLAN_MAX_DEVICES, "mesh axis sizes", p->name,
                                   dims, &n)))
        return rc;
    int64_t total = 1;
    for (int a = 0; a < n; a++) total *= dims[a];
    if (total > PLAN_MAX_DEVICES)
        return adt_error(ADT_ERR_ARG, "%s: field \"mesh.shape\" holds %lld devices, expected at most %d", p->name,
                         (long long)total, PLAN_MAX_DEVICES);
    adt_mesh_init(&p->mesh, n, dims);
    const cJSON *axes = get(mj, "axes");
    if (!cJSON_IsArray(axes) || cJSON_GetArraySize(axes) != n)
        return adt_error(ADT_ERR_ARG, "%s: field \"mesh.axes\" is %s, expected an array of %d axis names (one per entry "
                         "of \"mesh.shape\")", p->name, axes ? adt_cfg_json_kind(axes) : "missing", n);
    int a = 0;
    for (const cJSON *it = axes->child; it; it = it->next, a++) {
        if (!cJSON_IsString(it) || !axis_name_ok(it->valuestring) || find_axis(p, it->valuestring) >= 0)
            return adt_error(ADT_ERR_ARG, "%s: field \"mesh.axes[%d]\" is %s, expected a new name of 1 to %d letters, "
                             "digits, '_' or '-' (e.g. \"dp\", \"tp\", \"pp\")",
                             p->name, a, cJSON_IsString(it) ? "invalid or repeated" : adt_cfg_json_kind(it),
                             ADT_PLAN_AXIS_LEN - 1);
        snprintf(p->axis[a], ADT_PLAN_AXIS_LEN, "%s", it->valuestring);
    }
    const cJSON *rj = get(mj, "ranks");
    if (!cJSON_IsArray(rj) || cJSON_GetArraySize(rj) != p->mesh.nranks)
        return adt_error(ADT_ERR_ARG, "%s: field \"mesh.ranks\" is %s, expected an array of %d global ranks (one per "
                         "mesh coordinate, row-major)", p->name, rj ? adt_cfg_json_kind(rj) : "missing", p->mesh.nranks);
    p->mesh.ranks = adt_malloc((size_t)p->mesh.nranks * sizeof *p->mesh.ranks);
    int i = 0;
    for (const cJSON *it = rj->child; it; it = it->next, i++) {
        char what[32];
        snprintf(what, sizeof what, "mesh.ranks[%d]", i);
        if ((rc = adt_cfg_to_int(it, what, 0, p->mesh.nranks - 1, p->name, &p->mesh.ranks[i]))) return rc;
    }
    const cJSON *ia = get(mj, "intra_axis");
    p->mesh.intra_axis = -1;
    if (ia && !cJSON_IsNull(ia) && (rc = axis_by_name(p, ia, "mesh.intra_axis", &p->mesh.intra_axis))) return rc;
    return ADT_OK;
}

static int parse_graph_and_pipeline(adt_plan *p, const cJSON *root) {
    const cJSON *gj = get(root, "graph");
    int rc;
    if ((rc = need_object(gj, "graph", p->name)) || (rc = adt_cfg_check_fields(gj, graph_fields, "graph", p->name)) ||
        (rc = get_int(gj, "nodes", "graph.nodes", 1, PLAN_MAX_COUNT, p->name, &p->n_nodes)) ||
        (rc = get_int(gj, "values", "graph.values", 1, PLAN_MAX_COUNT, p->name, &p->n_values)) ||
        (rc = get_int(gj, "layers", "graph.layers", 1, PLAN_MAX_COUNT, p->name, &p->n_layers)))
        return rc;
    const char *cs = NULL;
    if ((rc = get_string(gj, "checksum", "graph.checksum", "8 hex digits", p->name, &cs))) return rc;
    int hex = strlen(cs) == 8;
    for (int i = 0; hex && i < 8; i++) hex = isxdigit((unsigned char)cs[i]) != 0;
    if (!hex) return adt_error(ADT_ERR_ARG, "%s: field \"graph.checksum\" is \"%.20s\", expected 8 hex digits", p->name, cs);
    p->checksum = (uint32_t)strtoul(cs, NULL, 16);
    const cJSON *pj = get(root, "pipeline");
    p->pp_axis = -1;
    p->n_stages = 1;
    p->stage_first[0] = 0, p->stage_last[0] = p->n_layers - 1;
    if (!pj) return ADT_OK;
    if ((rc = need_object(pj, "pipeline", p->name)) ||
        (rc = adt_cfg_check_fields(pj, pipeline_fields, "pipeline", p->name)) ||
        (rc = axis_by_name(p, get(pj, "axis"), "pipeline.axis", &p->pp_axis)))
        return rc;
    const cJSON *sj = get(pj, "stages");
    int want = p->mesh.dim[p->pp_axis];
    if (!cJSON_IsArray(sj) || cJSON_GetArraySize(sj) != want || want > ADT_PLAN_MAX_STAGES)
        return adt_error(ADT_ERR_ARG, "%s: field \"pipeline.stages\" is %s, expected an array of %d [first, last] layer "
                         "ranges (one per coordinate of the pipeline axis \"%s\", at most %d)",
                         p->name, sj ? adt_cfg_json_kind(sj) : "missing", want, p->axis[p->pp_axis], ADT_PLAN_MAX_STAGES);
    p->n_stages = want;
    int s = 0;
    for (const cJSON *it = sj->child; it; it = it->next, s++) {
        char what[40];
        int r[2], n;
        snprintf(what, sizeof what, "pipeline.stages[%d]", s);
        if ((rc = adt_cfg_to_int_array(it, what, 2, 2, 0, p->n_layers - 1, "layer tags [first, last]", p->name, r, &n)))
            return rc;
        p->stage_first[s] = r[0], p->stage_last[s] = r[1];
    }
    return ADT_OK;
}

static int parse_cost(adt_plan *p, const cJSON *root) {
    int *rk = adt_malloc((size_t)p->mesh.nranks * sizeof *rk);
    adt_mesh sm;
    int rc = adt_plan_stage_mesh(p, 0, &sm, rk);
    free(rk);
    if (rc) return rc;
    int nd = sm.ndim;
    p->cost = adt_comm_cost_default(&sm);
    const cJSON *cj = get(root, "cost");
    if (!cj) return ADT_OK;
    int n;
    double v[ADT_MAX_MESH_DIMS];
    if ((rc = need_object(cj, "cost", p->name)) || (rc = adt_cfg_check_fields(cj, cost_fields, "cost", p->name))) return rc;
    if ((rc = get_numbers(get(cj, "alpha"), "cost.alpha", nd, nd, 0, 1e3, p->name, v, &n))) return rc;
    for (int a = 0; a < nd; a++) p->cost.alpha[a] = v[a];
    if ((rc = get_numbers(get(cj, "beta"), "cost.beta", nd, nd, 0, 1e3, p->name, v, &n))) return rc;
    for (int a = 0; a < nd; a++) p->cost.beta[a] = v[a];
    const cJSON *l = get(cj, "local");
    if (l && (!cJSON_IsNumber(l) || !(l->valuedouble >= 0 && l->valuedouble <= 1e3)))
        return adt_error(ADT_ERR_ARG, "%s: field \"cost.local\" is %s, expected a number in [0, 1000]", p->name,
                         cJSON_IsNumber(l) ? "out of range" : adt_cfg_json_kind(l));
    if (l) p->cost.local = l->valuedouble;
    return ADT_OK;
}

/* The layouts' shape on their own (types of every entry); resolving names waits for bind. */
static int parse_layouts(adt_plan *p, const cJSON *root) {
    const cJSON *lj = get(root, "layouts");
    if (!cJSON_IsArray(lj) || !cJSON_GetArraySize(lj))
        return adt_error(ADT_ERR_ARG, "%s: field \"layouts\" is %s, expected a non-empty array of {\"layers\", \"leaves\", "
                         "\"nodes\"} objects", p->name, lj ? adt_cfg_json_kind(lj) : "missing");
    int i = 0, rc;
    for (const cJSON *it = lj->child; it; it = it->next, i++) {
        char what[48], type[48];
        snprintf(what, sizeof what, "layouts[%d]", i);
        snprintf(type, sizeof type, "layouts[%d]", i);
        if ((rc = need_object(it, what, p->name)) || (rc = adt_cfg_check_fields(it, group_fields, type, p->name))) return rc;
        const cJSON *layers = get(it, "layers");
        if (!cJSON_IsArray(layers) || !cJSON_GetArraySize(layers))
            return adt_error(ADT_ERR_ARG, "%s: field \"%s.layers\" is %s, expected a non-empty array of layer tags",
                             p->name, what, layers ? adt_cfg_json_kind(layers) : "missing");
        int k = 0, t;
        for (const cJSON *l = layers->child; l; l = l->next, k++) {
            char at[80];
            snprintf(at, sizeof at, "%s.layers[%d]", what, k);
            if ((rc = adt_cfg_to_int(l, at, 0, p->n_layers - 1, p->name, &t))) return rc;
        }
        const char *parts[2] = {"leaves", "nodes"};
        for (int q = 0; q < 2; q++) {
            const cJSON *o = get(it, parts[q]);
            if (!o) continue;
            char at[80];
            snprintf(at, sizeof at, "%s.%s", what, parts[q]);
            if ((rc = need_object(o, at, p->name))) return rc;
            for (const cJSON *e = o->child; e; e = e->next)
                if (!cJSON_IsString(e))
                    return adt_error(ADT_ERR_ARG, "%s: field \"%s.%.96s\" is %s, expected %s", p->name, at, e->string,
                                     adt_cfg_json_kind(e), q ? "a signature string" : "an nd-SBP string");
        }
    }
    char *text = cJSON_PrintUnformatted(lj);
    p->pending = adt_strdup(text);
    cJSON_free(text);
    return ADT_OK;
}

int adt_plan_parse(adt_plan *p, const char *json_text, const char *name_for_errors) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name_for_errors ? name_for_errors : "plan");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json_text, &end, 1);
    if (!root) return adt_cfg_json_error(json_text, end, p->name);
    int rc = ADT_OK;
    if (!cJSON_IsObject(root))
        rc = adt_error(ADT_ERR_FORMAT, "%s: expected a JSON object at the top level, got %s", p->name,
                       adt_cfg_json_kind(root));
    if (!rc) rc = adt_cfg_check_fields(root, root_fields, "plan", p->name);
    if (!rc) rc = parse_header(p, root);
    if (!rc) rc = parse_batch_split(p, root);
    if (!rc) rc = parse_mesh(p, root);
    if (!rc) rc = parse_graph_and_pipeline(p, root);
    if (!rc) rc = adt_plan_check(p);
    if (!rc) rc = parse_cost(p, root);
    if (!rc) rc = parse_layouts(p, root);
    cJSON_Delete(root);
    if (rc) {
        char name[256];
        snprintf(name, sizeof name, "%s", p->name);
        adt_plan_free(p);
        snprintf(p->name, sizeof p->name, "%s", name);
    }
    return rc;
}

int adt_plan_load(adt_plan *p, const char *path) {
    char *text;
    memset(p, 0, sizeof *p);
    int rc = adt_cfg_read_text(path, "plan file", PLAN_MAX_FILE_BYTES, &text);
    if (rc) return rc;
    rc = adt_plan_parse(p, text, path);
    free(text);
    return rc;
}

/* ---- layers: the nodes and leaves of each layer tag, and their structure -------------------------- */

typedef struct layer_index {
    int n_layers;
    int *node_start, *nodes; /* nodes of tag t: nodes[node_start[t] .. node_start[t+1]) */
    int *leaf_start, *leaves;
} layer_index;

static void bucket(int n_layers, int n, const int *tag_of, int *start, int *items) {
    int *fill = adt_calloc((size_t)n_layers + 1, sizeof *fill);
    for (int i = 0; i < n; i++)
        if (tag_of[i] >= 0) start[tag_of[i] + 1]++;
    for (int t = 0; t < n_layers; t++) start[t + 1] += start[t];
    for (int i = 0; i < n; i++)
        if (tag_of[i] >= 0) items[start[tag_of[i]] + fill[tag_of[i]]++] = i;
    free(fill);
}

static void layer_index_build(layer_index *li, const adt_graph *g, int n_layers) {
    li->n_layers = n_layers;
    li->node_start = adt_calloc((size_t)n_layers + 1, sizeof *li->node_start);
    li->leaf_start = adt_calloc((size_t)n_layers + 1, sizeof *li->leaf_start);
    li->nodes = adt_malloc(((size_t)g->n_nodes + 1) * sizeof *li->nodes);
    li->leaves = adt_malloc(((size_t)g->n_values + 1) * sizeof *li->leaves);
    int *tag = adt_malloc(((size_t)(g->n_nodes > g->n_values ? g->n_nodes : g->n_values) + 1) * sizeof *tag);
    for (int i = 0; i < g->n_nodes; i++) tag[i] = g->nodes[i].layer_tag < n_layers ? g->nodes[i].layer_tag : -1;
    bucket(n_layers, g->n_nodes, tag, li->node_start, li->nodes);
    for (int v = 0; v < g->n_values; v++)
        tag[v] = g->values[v].producer < 0 && g->values[v].layer_tag < n_layers ? g->values[v].layer_tag : -1;
    bucket(n_layers, g->n_values, tag, li->leaf_start, li->leaves);
    free(tag);
}

static void layer_index_free(layer_index *li) {
    free(li->node_start);
    free(li->nodes);
    free(li->leaf_start);
    free(li->leaves);
}

static int layer_nodes(const layer_index *li, int t, const int **out) {
    *out = li->nodes + li->node_start[t];
    return li->node_start[t + 1] - li->node_start[t];
}

static int layer_leaves(const layer_index *li, int t, const int **out) {
    *out = li->leaves + li->leaf_start[t];
    return li->leaf_start[t + 1] - li->leaf_start[t];
}

static int largest_layer_tag(const adt_graph *g) {
    int t = 0;
    for (int i = 0; i < g->n_nodes; i++) t = g->nodes[i].layer_tag > t ? g->nodes[i].layer_tag : t;
    for (int v = 0; v < g->n_values; v++) t = g->values[v].layer_tag > t ? g->values[v].layer_tag : t;
    return t;
}

/* Whether layers a and b have the same structure: node by node the same op and pass, leaf by
 * leaf the same shape. On a difference, *why says what (for messages). */
static int same_structure(const adt_graph *g, const layer_index *li, int a, int b, char *why, size_t n) {
    const int *na, *nb, *la, *lb;
    int ca = layer_nodes(li, a, &na), cb = layer_nodes(li, b, &nb);
    int da = layer_leaves(li, a, &la), db = layer_leaves(li, b, &lb);
    if (ca != cb || da != db) {
        snprintf(why, n, "layer %d has %d nodes and %d leaves, layer %d has %d and %d", b, cb, db, a, ca, da);
        return 0;
    }
    for (int i = 0; i < ca; i++) {
        const adt_node *x = &g->nodes[na[i]], *y = &g->nodes[nb[i]];
        if (x->op != y->op || x->is_backward != y->is_backward || x->is_optimizer != y->is_optimizer) {
            snprintf(why, n, "node %d of layer %d is %.40s, of layer %d %.40s", i, b, y->name, a, x->name);
            return 0;
        }
    }
    for (int i = 0; i < da; i++)
        if (!adt_shape_equal(&g->values[la[i]].shape, &g->values[lb[i]].shape)) {
            snprintf(why, n, "leaf %d of layer %d ('%.40s') differs in shape from layer %d's ('%.40s')", i, b,
                     g->values[lb[i]].name, a, g->values[la[i]].name);
            return 0;
        }
    return 1;
}

/* ---- phase 2: bind ------------------------------------------------------------------------------ */

typedef struct binder {
    adt_plan *p;
    const adt_graph *g;
    layer_index li;
    adt_mesh sm; /* the stage mesh (shape only) */
    char *node_done, *layer_done;
} binder;

/* Position of the entry named `key` among items[0..n) (nodes when is_node, else values). */
static int position(const adt_graph *g, const int *items, int n, const char *key, int is_node) {
    for (int i = 0; i < n; i++)
        if (!strcmp(is_node ? g->nodes[items[i]].name : g->values[items[i]].name, key)) return i;
    return -1;
}

/* The "nodes" (signatures) or "leaves" (nd-SBPs) of entry gi, named in layers[0] and applied
 * position by position to each of layers[0..nl). */
static int bind_entries(binder *b, const cJSON *grp, int gi, const int *layers, int nl, int is_node) {
    adt_plan *p = b->p;
    const adt_graph *g = b->g;
    const char *what = is_node ? "nodes" : "leaves";
    const int *items;
    int n_items = is_node ? layer_nodes(&b->li, layers[0], &items) : layer_leaves(&b->li, layers[0], &items), rc;
    const cJSON *o = get(grp, what);
    for (const cJSON *e = o ? o->child : NULL; e; e = e->next) {
        int pos = position(g, items, n_items, e->string, is_node);
        if (pos < 0)
            return adt_error(ADT_ERR_ARG, "%s: field \"layouts[%d].%s.%.96s\": no %s of that name in layer %d of the graph",
                             p->name, gi, what, e->string, is_node ? "node" : "leaf", layers[0]);
        for (int k = 0; k < nl; k++) {
            const int *its;
            if (is_node) layer_nodes(&b->li, layers[k], &its);
            else layer_leaves(&b->li, layers[k], &its);
            int id = its[pos];
            if (is_node) {
                rc = adt_nd_sig_parse(e->valuestring, g, id, b->sm.ndim, &p->node_sig[id]);
                b->node_done[id] = 1;
            } else {
                rc = adt_ndsbp_parse(e->valuestring, b->sm.ndim, g->values[id].shape.ndim, &p->leaf_sbp[id]);
            }
            if (rc) return adt_error_prefix(rc, "%s: field \"layouts[%d].%s.%.96s\": ", p->name, gi, what, e->string);
        }
    }
    return ADT_OK;
}

static int bind_group(binder *b, const cJSON *grp, int gi) {
    adt_plan *p = b->p;
    const adt_graph *g = b->g;
    int layers[4096], nl = 0, rc;
    for (const cJSON *l = get(grp, "layers")->child; l; l = l->next) {
        int t = (int)l->valuedouble;
        if (nl == (int)(sizeof layers / sizeof layers[0]))
            return adt_error(ADT_ERR_ARG, "%s: field \"layouts[%d].layers\" lists more than %zu layers", p->name, gi,
                             sizeof layers / sizeof layers[0]);
        if (b->layer_done[t])
            return adt_error(ADT_ERR_ARG, "%s: field \"layouts[%d].layers\": layer %d has layouts already, expected each "
                             "layer in one entry", p->name, gi, t);
        b->layer_done[t] = 1;
        layers[nl++] = t;
    }
    if (!nl) return adt_error(ADT_ERR_ARG, "%s: field \"layouts[%d].layers\" is empty", p->name, gi);
    char why[256];
    for (int k = 1; k < nl; k++)
        if (!same_structure(g, &b->li, layers[0], layers[k], why, sizeof why))
            return adt_error(ADT_ERR_ARG, "%s: field \"layouts[%d].layers\": layer %d cannot share layer %d's layouts: %s",
                             p->name, gi, layers[k], layers[0], why);
    for (int is_node = 1; is_node >= 0; is_node--)
        if ((rc = bind_entries(b, grp, gi, layers, nl, is_node))) return rc;
    return ADT_OK;
}

int adt_plan_bind(adt_plan *p, const adt_graph *g) {
    if (!p->pending) return adt_error(ADT_ERR_STATE, "%s: nothing to bind (parse the plan first)", p->name);
    if (g->n_nodes != p->n_nodes || g->n_values != p->n_values || largest_layer_tag(g) + 1 != p->n_layers)
        return adt_error(ADT_ERR_ARG, "%s: field \"graph\": the plan is for a graph of %d nodes, %d values and %d layers, "
                         "this one has %d nodes, %d values and %d layers (model, batch, microbatches and optimizer must "
                         "be the plan's)", p->name, p->n_nodes, p->n_values, p->n_layers, g->n_nodes, g->n_values,
                         largest_layer_tag(g) + 1);
    uint32_t c = adt_plan_graph_checksum(g);
    if (c != p->checksum)
        return adt_error(ADT_ERR_ARG, "%s: field \"graph.checksum\" is %08x, this graph's is %08x: a value's name, shape, "
                         "dtype or role, or a node's op, inputs or layer differs", p->name, (unsigned)p->checksum,
                         (unsigned)c);
    binder b = {.p = p, .g = g};
    int *rk = adt_malloc((size_t)p->mesh.nranks * sizeof *rk);
    int rc = adt_plan_stage_mesh(p, 0, &b.sm, rk);
    if (rc) {
        free(rk);
        return rc;
    }
    free(p->node_sig);
    free(p->leaf_sbp);
    p->node_sig = adt_calloc((size_t)g->n_nodes, sizeof *p->node_sig);
    p->leaf_sbp = adt_calloc((size_t)g->n_values, sizeof *p->leaf_sbp);
    layer_index_build(&b.li, g, p->n_layers);
    b.node_done = adt_calloc((size_t)g->n_nodes, 1);
    b.layer_done = adt_calloc((size_t)p->n_layers, 1);
    cJSON *lj = cJSON_Parse(p->pending);
    ADT_ASSERT(lj);
    int gi = 0;
    for (const cJSON *grp = lj->child; grp && !rc; grp = grp->next, gi++) rc = bind_group(&b, grp, gi);
    cJSON_Delete(lj);
    for (int i = 0; i < g->n_nodes && !rc; i++)
        if (!b.node_done[i])
            rc = adt_error(ADT_ERR_ARG, "%s: field \"layouts\": no signature for node %s (%s) of layer %d", p->name,
                           g->nodes[i].name, adt_op_name(g->nodes[i].op), g->nodes[i].layer_tag);
    free(b.node_done);
    free(b.layer_done);
    layer_index_free(&b.li);
    free(rk);
    /* a batch split in the file: its data axis and length need the layouts (then validates) */
    if (!rc) rc = p->batch_split ? adt_plan_set_batch_split(p, g, p->batch_split, p->n_batch_split)
                                 : adt_plan_validate(p, g);
    if (rc) {
        free(p->node_sig);
        free(p->leaf_sbp);
        p->node_sig = NULL, p->leaf_sbp = NULL;
        return rc;
    }
    free(p->pending);
    p->pending = NULL;
    return ADT_OK;
}

/* ---- the writer --------------------------------------------------------------------------------- */

static int same_layouts(const adt_plan *p, const layer_index *li, int a, int b) {
    const int *na, *nb, *la, *lb;
    int cn = layer_nodes(li, a, &na), cl = layer_leaves(li, a, &la);
    layer_nodes(li, b, &nb), layer_leaves(li, b, &lb);
    for (int i = 0; i < cn; i++) {
        const adt_nd_sig *x = &p->node_sig[na[i]], *y = &p->node_sig[nb[i]];
        for (int j = 0; j < ADT_MAX_INPUTS; j++)
            if (!adt_ndsbp_equal(&x->in[j], &y->in[j])) return 0;
        for (int k = 0; k < ADT_MAX_OUTPUTS; k++)
            if (!adt_ndsbp_equal(&x->out[k], &y->out[k])) return 0;
    }
    for (int i = 0; i < cl; i++)
        if (!adt_ndsbp_equal(&p->leaf_sbp[la[i]], &p->leaf_sbp[lb[i]])) return 0;
    return 1;
}

static cJSON *group_json(const adt_plan *p, const adt_graph *g, const layer_index *li, const int *layers, int nl) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "layers", cJSON_CreateIntArray(layers, nl));
    const int *items;
    int n = layer_leaves(li, layers[0], &items);
    cJSON *leaves = cJSON_AddObjectToObject(o, "leaves");
    char buf[2048];
    for (int i = 0; i < n; i++)
        if (p->leaf_sbp[items[i]].ndim)
            cJSON_AddStringToObject(leaves, g->values[items[i]].name, adt_ndsbp_str(&p->leaf_sbp[items[i]], buf, sizeof buf));
    n = layer_nodes(li, layers[0], &items);
    cJSON *nodes = cJSON_AddObjectToObject(o, "nodes");
    for (int i = 0; i < n; i++) {
        const adt_node *nd = &g->nodes[items[i]];
        cJSON_AddStringToObject(nodes, nd->name, adt_nd_sig_str(&p->node_sig[items[i]], nd->n_in, nd->n_out, buf, sizeof buf));
    }
    return o;
}

void adt_plan_layer_groups(const adt_plan *p, const adt_graph *g, int *group_of) {
    layer_index li;
    layer_index_build(&li, g, p->n_layers);
    char why[256];
    for (int t = 0; t < p->n_layers; t++) {
        group_of[t] = t;
        for (int u = 0; u < t; u++)
            if (group_of[u] == u && same_structure(g, &li, u, t, why, sizeof why) && same_layouts(p, &li, u, t)) {
                group_of[t] = u;
                break;
            }
    }
    layer_index_free(&li);
}

static cJSON *layouts_json(const adt_plan *p, const adt_graph *g) {
    layer_index li;
    layer_index_build(&li, g, p->n_layers);
    int *group_of = adt_malloc((size_t)p->n_layers * sizeof *group_of), *members = adt_malloc((size_t)p->n_layers * sizeof *members);
    adt_plan_layer_groups(p, g, group_of);
    cJSON *arr = cJSON_CreateArray();
    for (int t = 0; t < p->n_layers; t++) {
        if (group_of[t] != t) continue;
        const int *items;
        if (!layer_nodes(&li, t, &items) && !layer_leaves(&li, t, &items)) continue;
        int nm = 0;
        for (int u = t; u < p->n_layers; u++)
            if (group_of[u] == t) members[nm++] = u;
        cJSON_AddItemToArray(arr, group_json(p, g, &li, members, nm));
    }
    free(group_of);
    free(members);
    layer_index_free(&li);
    return arr;
}

char *adt_plan_to_json(const adt_plan *p, const adt_graph *g) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", PLAN_FORMAT);
    cJSON_AddNumberToObject(j, "version", PLAN_VERSION);
    cJSON_AddStringToObject(j, "strategy", p->strategy);
    char *model = adt_model_cfg_to_json(&p->model);
    cJSON_AddItemToObject(j, "model", cJSON_Parse(model));
    free(model);
    cJSON_AddNumberToObject(j, "batch", p->batch);
    cJSON_AddNumberToObject(j, "microbatches", p->microbatches);
    if (p->batch_split) cJSON_AddItemToObject(j, "batch_split", cJSON_CreateIntArray(p->batch_split, p->n_batch_split));
    cJSON_AddStringToObject(j, "optimizer", optim_names[p->optim == ADT_OPTIM_ADAMW ? 0 : p->momentum ? 2 : 1]);
    cJSON *m = cJSON_AddObjectToObject(j, "mesh");
    cJSON_AddItemToObject(m, "shape", cJSON_CreateIntArray(p->mesh.dim, p->mesh.ndim));
    const char *names[ADT_MAX_MESH_DIMS];
    for (int a = 0; a < p->mesh.ndim; a++) names[a] = p->axis[a];
    cJSON_AddItemToObject(m, "axes", cJSON_CreateStringArray(names, p->mesh.ndim));
    cJSON_AddItemToObject(m, "ranks", cJSON_CreateIntArray(p->mesh.ranks, p->mesh.nranks));
    if (p->mesh.intra_axis >= 0) cJSON_AddStringToObject(m, "intra_axis", p->axis[p->mesh.intra_axis]);
    else cJSON_AddNullToObject(m, "intra_axis");
    if (p->pp_axis >= 0) {
        cJSON *pj = cJSON_AddObjectToObject(j, "pipeline");
        cJSON_AddStringToObject(pj, "axis", p->axis[p->pp_axis]);
        cJSON *st = cJSON_AddArrayToObject(pj, "stages");
        for (int s = 0; s < p->n_stages; s++)
            cJSON_AddItemToArray(st, cJSON_CreateIntArray((int[]){p->stage_first[s], p->stage_last[s]}, 2));
    }
    cJSON *gj = cJSON_AddObjectToObject(j, "graph");
    cJSON_AddNumberToObject(gj, "nodes", p->n_nodes);
    cJSON_AddNumberToObject(gj, "values", p->n_values);
    cJSON_AddNumberToObject(gj, "layers", p->n_layers);
    char cs[16];
    snprintf(cs, sizeof cs, "%08x", (unsigned)p->checksum);
    cJSON_AddStringToObject(gj, "checksum", cs);
    int nd = p->mesh.ndim - (p->pp_axis >= 0) > 0 ? p->mesh.ndim - (p->pp_axis >= 0) : 1; /* the stage mesh's */
    cJSON *cj = cJSON_AddObjectToObject(j, "cost");
    cJSON_AddItemToObject(cj, "alpha", cJSON_CreateDoubleArray(p->cost.alpha, nd));
    cJSON_AddItemToObject(cj, "beta", cJSON_CreateDoubleArray(p->cost.beta, nd));
    cJSON_AddNumberToObject(cj, "local", p->cost.local);
    cJSON_AddItemToObject(j, "layouts", layouts_json(p, g));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    ADT_ASSERT(text);
    char *out = adt_strdup(text);
    cJSON_free(text);
    return out;
}

int adt_plan_save(const adt_plan *p, const adt_graph *g, const char *path) {
    if (!p->node_sig || !p->leaf_sbp) return adt_error(ADT_ERR_STATE, "%s: the plan has no layouts to save", p->name);
    char *text = adt_plan_to_json(p, g);
    FILE *f = fopen(path, "wb");
    int rc = ADT_OK;
    if (!f) rc = adt_error(ADT_ERR_IO, "%s: cannot write the plan: %s", path, strerror(errno));
    else {
        size_t n = strlen(text);
        int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
        if (fclose(f) || bad) rc = adt_error(ADT_ERR_IO, "%s: writing the plan failed", path);
    }
    free(text);
    return rc;
}
