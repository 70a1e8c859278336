/*
 * graph.c - `adtrain graph`: builds a model's full training graph (forward, backward, optimizer),
 * prints its size, cost and planned memory, and writes it as JSON (for tools) or DOT (for people).
 * Nothing is allocated for the tensors themselves, so it also sizes models too big to train here.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"
#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "cli.h"

typedef struct graph_opts {
    const char *model_path; /* NULL: the built-in gpt-tiny */
    const char *out_path;   /* NULL: print the summary only */
    long batch;
    int format; /* -1: from the file name, 0 json, 1 dot */
    adt_optim_kind optimizer;
} graph_opts;

static void graph_usage(FILE *f) {
    fprintf(f, "usage: adtrain graph [--model CFG.json] [--batch B] [--format json|dot] [--optimizer sgd|adamw]\n"
               "                     [-o FILE]\n"
               "\n"
               "Builds the training graph of a model (default: built-in gpt-tiny, batch 16, adamw), prints\n"
               "parameters, node count, FLOPs per step and the memory plan's peak, and with -o writes it\n"
               "(format from --format, else from the file name: .dot/.gv is DOT, anything else JSON).\n"
               "\n"
               "exit status: 0 done, 1 failure writing the file, 2 bad flag or config\n");
}

#define graph_fail(...) cli_fail("graph", __VA_ARGS__)

static int graph_apply(void *opts, const char *f, const char *v) {
    graph_opts *o = opts;
    if (!strcmp(f, "--model")) o->model_path = v;
    else if (!strcmp(f, "-o") || !strcmp(f, "--output")) o->out_path = v;
    else if (!strcmp(f, "--batch")) return cli_parse_long("graph", f, v, 1, 1 << 20, &o->batch);
    else if (!strcmp(f, "--format")) {
        if (!strcmp(v, "json")) o->format = 0;
        else if (!strcmp(v, "dot")) o->format = 1;
        else return graph_fail(2, "--format: expected 'json' or 'dot', got '%s'", v);
    } else if (!strcmp(f, "--optimizer")) {
        if (!strcmp(v, "sgd")) o->optimizer = ADT_OPTIM_SGD;
        else if (!strcmp(v, "adamw")) o->optimizer = ADT_OPTIM_ADAMW;
        else return graph_fail(2, "--optimizer: expected 'sgd' or 'adamw', got '%s'", v);
    } else {
        return graph_fail(2, "unknown flag '%s' (see adtrain graph --help)", f);
    }
    return 0;
}

/* Returns 0 to go on, -1 after --help, else an exit code. */
static int graph_parse(graph_opts *o, int argc, char **argv) {
    *o = (graph_opts){.batch = 16, .format = -1, .optimizer = ADT_OPTIM_ADAMW};
    return cli_parse_flags("graph", argc, argv, graph_usage, graph_apply, o);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static void print_summary(const adt_graph *g, const adt_memplan *mp, const char *label, long batch) {
    int n_bwd = 0, n_opt = 0;
    for (int i = 0; i < g->n_nodes; i++) n_bwd += g->nodes[i].is_backward, n_opt += g->nodes[i].is_optimizer;
    const double mib = 1.0 / (1024.0 * 1024.0);
    printf("model       %s\n", label);
    printf("batch       %ld\n", batch);
    printf("parameters  %lld\n", (long long)adt_graph_param_count(g));
    printf("nodes       %d (%d forward, %d backward, %d optimizer); %d values\n", g->n_nodes,
           g->n_nodes - n_bwd - n_opt, n_bwd, n_opt, g->n_values);
    printf("FLOPs/step  %.4g GFLOP (matmul %.4g GFLOP)\n", adt_graph_flops(g) * 1e-9, adt_graph_matmul_flops(g) * 1e-9);
    printf("memory      peak arena %.2f MiB (%.2f MiB without reuse), state %.2f MiB, scratch %.2f MiB\n",
           (double)mp->arena_bytes * mib, (double)mp->noreuse_bytes * mib, (double)mp->state_bytes * mib,
           (double)mp->scratch_bytes * mib);
}

static int build_and_dump(const graph_opts *o, const adt_model_cfg *m, const char *label) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rc = 0;
    if (adt_model_build(g, m, (int)o->batch, &io)) {
        rc = graph_fail(2, "--model %s: %s", label, adt_error_message());
        goto done;
    }
    adt_optim_cfg oc = o->optimizer == ADT_OPTIM_SGD ? adt_optim_sgd(0.0f, 0.0f) : adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f);
    adt_graph_backward(g, io.loss);
    adt_graph_optimizer(g, &oc);
    if (adt_graph_error(g)) {
        rc = graph_fail(1, "building the training graph: %s", adt_graph_error_message(g));
        goto done;
    }
    adt_memplan mp;
    if (adt_memplan_build(&mp, g, NULL, g->n_nodes, 0)) {
        rc = graph_fail(1, "memory plan: %s", adt_error_message());
        goto done;
    }
    print_summary(g, &mp, label, o->batch);
    adt_memplan_free(&mp);
    if (o->out_path) {
        int dot = o->format >= 0 ? o->format : ends_with(o->out_path, ".dot") || ends_with(o->out_path, ".gv");
        if ((dot ? adt_graph_dump_dot(g, o->out_path) : adt_graph_dump_json(g, o->out_path)))
            rc = graph_fail(1, "-o: %s", adt_error_message());
        else printf("wrote       %s (%s)\n", o->out_path, dot ? "dot" : "json");
    }
done:
    adt_graph_free(g);
    return rc;
}

int cli_graph(int argc, char **argv) {
    graph_opts o;
    int rc = graph_parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    adt_model_cfg m;
    char label[320];
    if ((rc = cli_load_model("graph", o.model_path, &m, label, sizeof label))) return rc;
    return build_and_dump(&o, &m, label);
}
