/*
 * mlp.c - multi-layer perceptron with nn.Linear names, layouts and default initialisation.
 */
#include <math.h>
#include <stdio.h>

#include "adtrain/base.h"
#include "adtrain/models.h"

int adt_layer_linear(adt_graph *g, int x, const char *prefix, int in, int out) {
    char wn[ADT_NAME_LEN], bn[ADT_NAME_LEN];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    float bound = 1.0f / sqrtf((float)in); /* kaiming_uniform(a=sqrt(5)) reduces to this */
    int w = adt_param(g, wn, adt_shape_2d(out, in), (adt_init){ADT_INIT_UNIFORM, -bound, bound});
    int b = adt_param(g, bn, adt_shape_1d(out), (adt_init){ADT_INIT_UNIFORM, -bound, bound});
    return adt_bias_add(g, adt_matmul(g, x, w, 0, 1, 0), b);
}

int adt_model_mlp(adt_graph *g, const adt_mlp_cfg *c, int batch, adt_model_io *io) {
    if (c->n_sizes < 2 || c->n_sizes > ADT_MLP_MAX_LAYERS + 1)
        return adt_graph_fail(g, ADT_ERR_ARG, "mlp: sizes needs 2 to %d entries (input, hidden..., classes), got %d",
                              ADT_MLP_MAX_LAYERS + 1, c->n_sizes), g->status;
    for (int i = 0; i < c->n_sizes; i++)
        if (c->sizes[i] < 1)
            return adt_graph_fail(g, ADT_ERR_ARG, "mlp: sizes[%d] is %d, expected >= 1", i, c->sizes[i]), g->status;
    if (batch < 1) return adt_graph_fail(g, ADT_ERR_ARG, "mlp: batch must be >= 1"), g->status;
    int nl = c->n_sizes - 1;
    adt_graph_set_layer_tag(g, 0);
    io->input = adt_input(g, "x", ADT_F32, adt_shape_2d(batch, c->sizes[0]));
    io->input2 = -1;
    io->label = adt_label(g, "labels", ADT_I32, adt_shape_1d(batch));
    int h = io->input;
    for (int i = 0; i < nl; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "layers.%d", i);
        adt_graph_set_layer_tag(g, i + 1); /* layers differ in shape: each its own tag */
        h = adt_layer_linear(g, h, prefix, c->sizes[i], c->sizes[i + 1]);
        if (i + 1 < nl) {
            if (c->activation == ADT_ACT_GELU) h = adt_gelu(g, h);
            else if (c->activation == ADT_ACT_SIGMOID) h = adt_sigmoid(g, h);
            else h = adt_relu(g, h);
        }
    }
    io->logits = h;
    io->loss = adt_softmax_xent(g, h, io->label);
    adt_graph_set_layer_tag(g, 0);
    return g->status;
}
