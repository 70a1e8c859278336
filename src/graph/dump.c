/*
 * dump.c - writes a graph as JSON (for tools and tests) or as Graphviz DOT (for people).
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "adtrain/base.h"
#include "adtrain/ops.h"

static cJSON *shape_json(const adt_shape *s) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < s->ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s->dim[i]));
    return a;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return adt_error(ADT_ERR_IO, "%s: cannot open for writing", path);
    int ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? ADT_OK : adt_error(ADT_ERR_IO, "%s: write failed", path);
}

int adt_graph_dump_json(const adt_graph *g, const char *path) {
    cJSON *root = cJSON_CreateObject();
    cJSON *vals = cJSON_AddArrayToObject(root, "values");
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddStringToObject(o, "name", v->name);
        cJSON_AddStringToObject(o, "dtype", adt_dtype_name(v->dtype));
        cJSON_AddItemToObject(o, "shape", shape_json(&v->shape));
        cJSON_AddStringToObject(o, "role", adt_role_name(v->role));
        cJSON_AddNumberToObject(o, "producer", v->producer);
        if (v->alias_of >= 0) cJSON_AddNumberToObject(o, "alias_of", v->alias_of);
        if (v->grad >= 0) cJSON_AddNumberToObject(o, "grad", v->grad);
        cJSON_AddNumberToObject(o, "layer_tag", v->layer_tag);
        cJSON_AddItemToArray(vals, o);
    }
    cJSON *nodes = cJSON_AddArrayToObject(root, "nodes");
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", i);
        cJSON_AddStringToObject(o, "name", n->name);
        cJSON_AddStringToObject(o, "op", adt_op_name(n->op));
        cJSON *in = cJSON_AddArrayToObject(o, "inputs");
        for (int k = 0; k < n->n_in; k++) cJSON_AddItemToArray(in, cJSON_CreateNumber(n->in[k]));
        cJSON *out = cJSON_AddArrayToObject(o, "outputs");
        for (int k = 0; k < n->n_out; k++) cJSON_AddItemToArray(out, cJSON_CreateNumber(n->out[k]));
        cJSON *ai = cJSON_AddArrayToObject(o, "attr_i");
        for (int k = 0; k < 8; k++) cJSON_AddItemToArray(ai, cJSON_CreateNumber((double)n->a.i[k]));
        cJSON *af = cJSON_AddArrayToObject(o, "attr_f");
        for (int k = 0; k < 6; k++) cJSON_AddItemToArray(af, cJSON_CreateNumber(n->a.f[k]));
        cJSON_AddNumberToObject(o, "layer_tag", n->layer_tag);
        cJSON_AddNumberToObject(o, "stage", n->stage);
        cJSON_AddStringToObject(o, "phase", n->is_optimizer ? "optimizer" : n->is_backward ? "backward" : "forward");
        cJSON_AddNumberToObject(o, "flops", adt_node_flops(g, n));
        cJSON_AddItemToArray(nodes, o);
    }
    cJSON_AddNumberToObject(root, "loss", g->loss);
    cJSON_AddNumberToObject(root, "flops", adt_graph_flops(g));
    cJSON_AddNumberToObject(root, "params", (double)adt_graph_param_count(g));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    int rc = text ? write_text(path, text) : adt_error(ADT_ERR_NOMEM, "JSON printing failed");
    free(text);
    return rc;
}

int adt_graph_dump_dot(const adt_graph *g, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return adt_error(ADT_ERR_IO, "%s: cannot open for writing", path);
    fprintf(f, "digraph adtrain {\n  rankdir=TB;\n  node [fontname=\"Helvetica\",fontsize=10];\n");
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        if (v->producer >= 0 && v->role != ADT_ROLE_ACT && v->role != ADT_ROLE_GRAD) continue;
        char buf[64];
        const char *color = v->role == ADT_ROLE_PARAM ? "lightblue" : v->role == ADT_ROLE_GRAD ? "mistyrose"
                          : v->role == ADT_ROLE_OPT_STATE ? "khaki" : v->producer < 0 ? "palegreen" : "white";
        fprintf(f, "  v%d [shape=box,style=filled,fillcolor=%s,label=\"%s\\n%s\"];\n", i, color, v->name,
                adt_shape_str(&v->shape, buf, sizeof buf));
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        fprintf(f, "  n%d [shape=ellipse,label=\"%s\"%s];\n", i, adt_op_name(n->op),
                n->is_backward ? ",color=red" : n->is_optimizer ? ",color=orange" : "");
        for (int k = 0; k < n->n_in; k++) fprintf(f, "  v%d -> n%d;\n", n->in[k], i);
        for (int k = 0; k < n->n_out; k++) fprintf(f, "  n%d -> v%d;\n", i, n->out[k]);
    }
    fprintf(f, "}\n");
    return fclose(f) == 0 ? ADT_OK : adt_error(ADT_ERR_IO, "%s: write failed", path);
}
