/*
 * pipeline.c - pipeline stages of a training graph: which nodes each stage runs, the graph of
 * one stage (its nodes, with the values other stages produce as fed leaves), the messages
 * between stages, and the 1F1B order of a stage's forward and backward microbatches.
 *
 * A node runs on the stage of its layer tag (backward and optimizer nodes carry the tag of what
 * they differentiate or update). A value that a node of stage t reads and a node of stage s != t
 * produces crosses the boundary as one message per microbatch: forward activations go down the
 * pipeline, gradient contributions come back (autodiff sums a value's contributions on its
 * producer's stage, so the sum reads the later stage's contribution). Both sides derive the same
 * list of links from the global graph, so sends and receives pair up without negotiation. A value
 * made as partial sums (P, Megatron's residual stream between blocks) is summed on the stage that
 * makes it before it is sent (adt_pipe_sent_layout): the reader holds it B there, as a leaf must.
 *
 * Tied parameters (a parameter read on several stages, GPT's wte by the embedding and the LM
 * head) are held by every stage that reads it. Each holder runs its own copy of the update, on
 * the gradient contribution its own nodes make; the runtime sums the holders' contributions
 * (adt_pipe_stage.tied: an all-reduce over the holders, Megatron's embedding group) before the
 * updates run, so every copy takes the same step. The global graph's sum of those contributions
 * and its single update are left out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* The update node of parameter p (an in-place optimizer node writing it), or -1. */
static int update_of(const adt_graph *g, int p) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].is_optimizer && adt_op_get(g->nodes[i].op)->inplace && g->nodes[i].in[0] == p) return i;
    return -1;
}

/* Collects the contributions whose sum is gradient value v: the inputs of the backward adds of
 * parameter tag `tag` that produce it, recursively; marks those adds in `skip`. */
static void collect_contribs(const adt_graph *g, int v, int tag, int *out, int *n, int max, char *skip) {
    int p = g->values[v].producer;
    const adt_node *nd = p >= 0 ? &g->nodes[p] : NULL;
    if (nd && nd->op == ADT_OP_ADD && nd->is_backward && nd->layer_tag == tag) {
        skip[p] = 1;
        for (int k = 0; k < nd->n_in; k++) collect_contribs(g, nd->in[k], tag, out, n, max, skip);
        return;
    }
    if (*n < max) out[(*n)++] = v;
}

/* Per node its stage, -1 for the sums of tied gradients (left out), -2 for the update of a tied
 * parameter (every holder runs one). tied[v] = bit mask of the stages that read parameter v when
 * more than one does, else 0. */
static int node_stages(const adt_graph *g, const adt_plan *p, int *ns, uint64_t *tied) {
    char *skip = adt_calloc((size_t)g->n_nodes + 1, 1);
    for (int v = 0; v < g->n_values; v++) tied[v] = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ns[i] = adt_plan_stage_of(p, g->nodes[i].layer_tag);
        if (ns[i] < 0) {
            free(skip);
            return adt_error(ADT_ERR_ARG, "%s: node %s has layer tag %d, which no pipeline stage holds", p->name,
                             g->nodes[i].name, g->nodes[i].layer_tag);
        }
        const adt_node *n = &g->nodes[i];
        if (n->is_optimizer) continue;
        for (int k = 0; k < n->n_in; k++)
            if (g->values[n->in[k]].role == ADT_ROLE_PARAM) tied[n->in[k]] |= (uint64_t)1 << ns[i];
    }
    for (int v = 0; v < g->n_values; v++) {
        if (!(tied[v] & (tied[v] - 1))) { /* one reader stage */
            tied[v] = 0;
            continue;
        }
        int u = update_of(g, v), gr = g->values[v].grad;
        if (u < 0 || gr < 0) continue;
        ns[u] = -2;
        int c[ADT_MAX_INPUTS], nc = 0;
        collect_contribs(g, gr, g->values[v].layer_tag, c, &nc, ADT_MAX_INPUTS, skip);
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (skip[i]) ns[i] = -1;
    free(skip);
    return ADT_OK;
}

/* The contribution to tied parameter v's gradient that stage s's nodes make, or -1 (several
 * contributions on one stage are refused by the caller). */
static int tied_contrib(const adt_graph *g, const int *ns, int v, int s, int *count) {
    int c[ADT_MAX_INPUTS], nc = 0, found = -1;
    char *skip = adt_calloc((size_t)g->n_nodes + 1, 1);
    collect_contribs(g, g->values[v].grad, g->values[v].layer_tag, c, &nc, ADT_MAX_INPUTS, skip);
    free(skip);
    *count = 0;
    for (int k = 0; k < nc; k++) {
        int pr = g->values[c[k]].producer;
        if (pr >= 0 && ns[pr] == s) found = c[k], (*count)++;
    }
    return found;
}

/* Whether the holders of tied parameter v make their contributions to its gradient in different
 * layouts (a vocabulary-parallel embedding's P and a vocabulary-split head's S(0), say): then
 * each holder converts its own to the layout its update reads, so that the sum across holders
 * adds like blocks. */
static int tied_layouts_differ(const adt_graph *g, const adt_plan *p, int v) {
    int c[ADT_MAX_INPUTS], nc = 0;
    char *skip = adt_calloc((size_t)g->n_nodes + 1, 1);
    collect_contribs(g, g->values[v].grad, g->values[v].layer_tag, c, &nc, ADT_MAX_INPUTS, skip);
    free(skip);
    for (int k = 1; k < nc; k++) {
        const adt_value *a = &g->values[c[0]], *b = &g->values[c[k]];
        if (!adt_ndsbp_equal(&p->node_sig[a->producer].out[a->out_index], &p->node_sig[b->producer].out[b->out_index]))
            return 1;
    }
    return 0;
}

/* Whether stage s runs node i. */
static int runs_on(const adt_graph *g, const int *ns, const uint64_t *tied, int i, int s) {
    if (ns[i] == s) return 1;
    return ns[i] == -2 && (tied[g->nodes[i].in[0]] >> s & 1);
}

/* The value node i reads as input k on stage s: a tied update reads its stage's contribution. */
static int input_on(const adt_graph *g, const int *ns, const uint64_t *tied, int i, int k, int s) {
    const adt_node *n = &g->nodes[i];
    if (ns[i] == -2 && k == 1) {
        int cnt;
        return tied_contrib(g, ns, n->in[0], s, &cnt);
    }
    (void)tied;
    return n->in[k];
}

static int node_phase(const adt_node *n) { return n->is_optimizer ? 2 : n->is_backward ? 1 : 0; }

/* Every link of the pipeline, in one order all ranks share: by receiving stage, then by the
 * first reading node, then input. */
static int all_links(const adt_graph *g, const adt_plan *p, const int *ns, const uint64_t *tied,
                     adt_pipe_link **out, int *count) {
    int cap = 16, n = 0;
    adt_pipe_link *l = adt_malloc((size_t)cap * sizeof *l);
    for (int t = 0; t < p->n_stages; t++)
        for (int i = 0; i < g->n_nodes; i++) {
            if (!runs_on(g, ns, tied, i, t)) continue;
            for (int k = 0; k < g->nodes[i].n_in; k++) {
                int v = input_on(g, ns, tied, i, k, t), pr = v >= 0 ? g->values[v].producer : -1;
                if (pr < 0 || ns[pr] == t) continue;
                int j = 0;
                while (j < n && !(l[j].value == v && l[j].to == t)) j++;
                if (j < n) continue;
                if (ns[pr] < 0) {
                    free(l);
                    return adt_error(ADT_ERR_ARG, "%s: node %s on stage %d reads '%s', which no single stage makes",
                                     p->name, g->nodes[i].name, t, g->values[v].name);
                }
                if (n == cap) l = adt_realloc(l, (size_t)(cap *= 2) * sizeof *l);
                l[n++] = (adt_pipe_link){.value = v, .from = ns[pr], .to = t, .send_phase = node_phase(&g->nodes[pr]),
                                         .recv_phase = node_phase(&g->nodes[i]), .local = -1};
            }
        }
    *out = l;
    *count = n;
    return ADT_OK;
}

int adt_pipe_stage_build(const adt_graph *g, const adt_plan *p, int s, adt_pipe_stage *out) {
    memset(out, 0, sizeof *out);
    if (s < 0 || s >= p->n_stages) return adt_error(ADT_ERR_ARG, "%s: no stage %d (the plan has %d)", p->name, s, p->n_stages);
    if (p->n_stages > 64) return adt_error(ADT_ERR_ARG, "%s: %d stages, at most 64 are run", p->name, p->n_stages);
    int *ns = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ns);
    uint64_t *tied = adt_malloc((size_t)(g->n_values + 1) * sizeof *tied);
    int rc = node_stages(g, p, ns, tied);
    adt_pipe_link *links = NULL;
    int nl = 0;
    if (!rc) rc = all_links(g, p, ns, tied, &links, &nl);
    if (rc) {
        free(ns);
        free(tied);
        return rc;
    }
    out->stage = s;
    out->n_stages = p->n_stages;
    out->local_of = adt_malloc((size_t)(g->n_values + 1) * sizeof *out->local_of);
    for (int v = 0; v < g->n_values; v++) out->local_of[v] = -1;
    adt_graph *sg = out->g = adt_graph_create();
    char *need = adt_calloc((size_t)g->n_values + 1, 1);
    for (int i = 0; i < g->n_nodes; i++)
        if (runs_on(g, ns, tied, i, s))
            for (int k = 0; k < g->nodes[i].n_in; k++) {
                int v = input_on(g, ns, tied, i, k, s);
                if (v >= 0) need[v] = 1;
            }
    /* leaves: the graph's own, then the values other stages make, each in global value order */
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (int v = 0; v < g->n_values && !rc; v++) {
            const adt_value *val = &g->values[v];
            int pr = val->producer;
            if (!need[v] || (pass == 0 ? pr >= 0 : (pr < 0 || ns[pr] == s))) continue;
            adt_box full = {.global = val->shape, .shape = val->shape};
            int lv = adt_dist_add_local_leaf(sg, g, v, &full);
            if (lv < 0) {
                rc = adt_error(ADT_ERR_ARG, "%s: stage %d: %s", p->name, s, adt_graph_error_message(sg));
                break;
            }
            out->local_of[v] = lv;
            if (pass == 1) sg->values[lv].role = ADT_ROLE_INPUT; /* fed by a message each microbatch */
            else if (val->param >= 0) sg->values[lv].param = out->local_of[val->param];
            sg->values[lv].file_shape = val->file_shape;
        }
    out->n_nodes = 0;
    out->node_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *out->node_of);
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        if (!runs_on(g, ns, tied, i, s)) continue;
        const adt_node *n = &g->nodes[i];
        int in[ADT_MAX_INPUTS];
        if (ns[i] == -2) {
            int cnt;
            tied_contrib(g, ns, n->in[0], s, &cnt);
            if (cnt != 1) {
                rc = adt_error(ADT_ERR_ARG, "%s: tied parameter '%s' gets %d gradient contributions on stage %d; "
                               "expected one per holding stage", p->name, g->values[n->in[0]].name, cnt, s);
                break;
            }
        }
        for (int k = 0; k < n->n_in; k++) in[k] = out->local_of[input_on(g, ns, tied, i, k, s)];
        if (ns[i] == -2 && tied_layouts_differ(g, p, n->in[0])) { /* the contribution as the update reads it */
            sg->in_backward = 1;
            sg->in_optimizer = 0;
            sg->cur_layer_tag = n->layer_tag;
            int conv = adt_scale(sg, in[1], 1.0f);
            if (conv >= 0) {
                adt_node *cn = &sg->nodes[sg->values[conv].producer];
                snprintf(cn->name, sizeof cn->name, "tied.%.*s", ADT_NAME_LEN - 8, n->name);
                cn->stage = s;
                char tn[ADT_NAME_LEN];
                snprintf(tn, sizeof tn, "tied.grad.%.*s", ADT_NAME_LEN - 12, g->values[n->in[0]].name);
                adt_graph_rename_value(sg, conv, tn);
                out->node_of[out->n_nodes++] = -1 - i; /* no global node: the update's grad layout */
                in[1] = conv;
            }
        }
        sg->in_backward = n->is_backward;
        sg->in_optimizer = n->is_optimizer;
        sg->cur_layer_tag = n->layer_tag;
        sg->cur_fwd_node = -1;
        int id = adt_graph_add_node(sg, n->op, in, n->n_in, &n->a);
        if (id < 0) {
            rc = adt_error(ADT_ERR_SHAPE, "%s: stage %d: %s", p->name, s, adt_graph_error_message(sg));
            break;
        }
        adt_node *m = &sg->nodes[id];
        adt_str_copy(m->name, sizeof m->name, n->name);
        m->stage = s;
        out->node_of[out->n_nodes++] = i;
        for (int k = 0; k < n->n_out; k++) {
            adt_value *lv = &sg->values[m->out[k]];
            const adt_value *gv = &g->values[n->out[k]];
            adt_str_copy(lv->name, sizeof lv->name, gv->name);
            lv->layer_tag = gv->layer_tag;
            lv->role = gv->role;
            out->local_of[n->out[k]] = m->out[k];
            if (gv->is_output) adt_graph_mark_output(sg, m->out[k]);
        }
        if (i < g->n_forward_nodes) sg->n_forward_nodes = sg->n_nodes;
    }
    sg->in_backward = sg->in_optimizer = 0;
    free(need);
    /* the links touching this stage; what it sends stays alive to the end of the step */
    out->links = adt_malloc((size_t)(nl + 1) * sizeof *out->links);
    for (int j = 0; j < nl && !rc; j++) {
        if (links[j].from != s && links[j].to != s) continue;
        adt_pipe_link l = links[j];
        l.tag = j;
        l.local = out->local_of[l.value];
        if (l.from == s) adt_graph_mark_output(sg, l.local);
        out->links[out->n_links++] = l;
    }
    for (int v = 0; v < g->n_values && !rc; v++) { /* every stage lists them all, held or not */
        if (!tied[v]) continue;
        int cnt, c = out->local_of[v] >= 0 ? tied_contrib(g, ns, v, s, &cnt) : -1, read = -1;
        for (int k = 0; k < sg->n_nodes && c >= 0; k++) /* what this stage's update reads */
            if (sg->nodes[k].is_optimizer && sg->nodes[k].in[0] == out->local_of[v]) read = sg->nodes[k].in[1];
        out->tied = adt_realloc(out->tied, (size_t)(out->n_tied + 1) * sizeof *out->tied);
        out->tied[out->n_tied++] = (adt_pipe_tied){.param = v, .grad = c, .read = read, .holders = tied[v]};
    }
    if (!rc) {
        sg->loss = g->loss >= 0 ? out->local_of[g->loss] : -1;
        if (adt_graph_error(sg)) rc = adt_error(adt_graph_error(sg), "%s: stage %d: %s", p->name, s, adt_graph_error_message(sg));
    }
    /* the plan's layouts for the stage's nodes and leaves; a fed leaf is held as it is made */
    if (!rc) {
        out->node_sig = adt_calloc((size_t)sg->n_nodes + 1, sizeof *out->node_sig);
        out->leaf_sbp = adt_calloc((size_t)sg->n_values + 1, sizeof *out->leaf_sbp);
        for (int k = 0; k < out->n_nodes; k++) {
            int i = out->node_of[k];
            if (i >= 0) {
                out->node_sig[k] = p->node_sig[i];
                continue;
            }
            const adt_ndsbp *want = &p->node_sig[-1 - i].in[1]; /* the conversion: in and out as the update reads */
            out->node_sig[k].ndim = p->node_sig[-1 - i].ndim;
            out->node_sig[k].in[0] = *want;
            out->node_sig[k].out[0] = *want;
            out->node_of[k] = -1;
        }
        for (int v = 0; v < g->n_values && !rc; v++) {
            int lv = out->local_of[v];
            if (lv < 0 || sg->values[lv].producer >= 0) continue;
            int pr = g->values[v].producer;
            if (pr < 0) {
                out->leaf_sbp[lv] = p->leaf_sbp[v];
                continue;
            }
            out->leaf_sbp[lv] = adt_pipe_sent_layout(&p->node_sig[pr].out[g->values[v].out_index]);
        }
    }
    free(links);
    free(ns);
    free(tied);
    if (rc) adt_pipe_stage_free(out);
    return rc;
}

adt_ndsbp adt_pipe_sent_layout(const adt_ndsbp *made) {
    adt_ndsbp s = *made;
    for (int a = 0; a < s.ndim; a++)
        if (s.s[a].kind == ADT_SBP_P) s.s[a] = (adt_sbp){.kind = ADT_SBP_B};
    return s;
}

void adt_pipe_stage_free(adt_pipe_stage *st) {
    if (!st) return;
    adt_graph_free(st->g);
    free(st->node_of);
    free(st->local_of);
    free(st->links);
    free(st->tied);
    free(st->node_sig);
    free(st->leaf_sbp);
    memset(st, 0, sizeof *st);
}

adt_dist_plan adt_pipe_stage_dist(const adt_pipe_stage *st, const adt_plan *p, int *ranks) {
    adt_dist_plan d = adt_plan_dist(p, st->stage, ranks);
    d.node_sig = st->node_sig;
    d.leaf_sbp = st->leaf_sbp;
    return d;
}

/* ---- the 1F1B order ------------------------------------------------------------------------------
 * Stage s of S runs min(S-1-s, M) forwards first (warmup), then alternates one forward and one
 * backward while forwards are left (steady state), then the remaining backwards (cooldown).
 * Microbatches go forward and backward in order 0..M-1; at most S-s are in flight on stage s.
 */
int adt_pipe_1f1b(int n_stages, int stage, int microbatches, adt_pipe_op *ops) {
    int warm = n_stages - 1 - stage;
    if (warm > microbatches) warm = microbatches;
    int n = 0, f = 0, b = 0;
    while (f < warm) ops[n++] = (adt_pipe_op){0, f++};
    while (f < microbatches) {
        ops[n++] = (adt_pipe_op){0, f++};
        ops[n++] = (adt_pipe_op){1, b++};
    }
    while (b < microbatches) ops[n++] = (adt_pipe_op){1, b++};
    return n;
}
