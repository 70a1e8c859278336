/*
 * vgg.c - the VGG-style CNN: its JSON config (fields, checks, parameter count) and its builder.
 *
 * Blocks of 3x3 convolutions (padding 1, stride 1, so the image keeps its size) with ReLU, each
 * block closed by a 2x2 max-pool of stride 2 that halves it (flooring odd sizes, as nn.MaxPool2d
 * does); then flatten and fully connected layers. Names and initialisation are nn.Conv2d's and
 * nn.Linear's, so a torch.nn model with attributes conv0.., fc0.. loads the same checkpoint.
 */
#include <math.h>
#include <stdio.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "models/cfg_internal.h"

/* Values of one sample's activation, at most: bounds the shapes of absurd configs so that a
 * batch of them stays far inside int64. */
#define VGG_MAX_ACT (INT64_C(1) << 32)

static const char *const vgg_fields[] = {"type", "in_channels", "height", "width", "blocks", "fc", "classes", NULL};

/* ---- config ------------------------------------------------------------------------------- */

int adt_cfg_parse_vgg(adt_vgg_cfg *c, const cJSON *root, const char *name) {
    int rc;
    if ((rc = adt_cfg_check_fields(root, vgg_fields, "vgg", name))) return rc;
    if ((rc = adt_cfg_get_int(root, "in_channels", 1, CFG_MAX_CHANNELS, name, &c->in_channels))) return rc;
    if ((rc = adt_cfg_get_int(root, "height", 1, CFG_MAX_IMAGE, name, &c->height))) return rc;
    if ((rc = adt_cfg_get_int(root, "width", 1, CFG_MAX_IMAGE, name, &c->width))) return rc;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "blocks");
    if (!b)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"blocks\" (expected an array of 1 to %d blocks, each an "
                         "array of the output channels of its 3x3 convolutions, e.g. [[64, 64], [128, 128]])", name,
                         ADT_VGG_MAX_BLOCKS);
    if (!cJSON_IsArray(b))
        return adt_error(ADT_ERR_ARG, "%s: field \"blocks\" is %s, expected an array of 1 to %d blocks, each an array "
                         "of convolution output channels, e.g. [[64, 64], [128, 128]]", name, adt_cfg_json_kind(b),
                         ADT_VGG_MAX_BLOCKS);
    c->n_blocks = cJSON_GetArraySize(b);
    if (c->n_blocks < 1 || c->n_blocks > ADT_VGG_MAX_BLOCKS)
        return adt_error(ADT_ERR_ARG, "%s: field \"blocks\" has %d entries, expected 1 to %d blocks", name, c->n_blocks,
                         ADT_VGG_MAX_BLOCKS);
    int i = 0;
    for (const cJSON *it = b->child; it; it = it->next, i++) {
        char what[32];
        snprintf(what, sizeof what, "blocks[%d]", i);
        if ((rc = adt_cfg_to_int_array(it, what, 1, ADT_VGG_MAX_CONVS, 1, CFG_MAX_CHANNELS,
                                       "output channels of 3x3 convolutions", name, c->channels[i], &c->n_convs[i])))
            return rc;
    }
    if ((rc = adt_cfg_get_int_array(root, "fc", 0, ADT_VGG_MAX_FC, 1, CFG_MAX_WIDTH,
                                    "hidden widths of fully connected layers (the classifier follows them)", name,
                                    c->fc, &c->n_fc)))
        return rc;
    return adt_cfg_get_int(root, "classes", 2, CFG_MAX_WIDTH, name, &c->classes);
}

/* Channels of the last convolution: the feature map's depth at the flatten. */
static int64_t vgg_last_channels(const adt_vgg_cfg *c) {
    return c->channels[c->n_blocks - 1][c->n_convs[c->n_blocks - 1] - 1];
}

int adt_cfg_validate_vgg(const adt_vgg_cfg *c, const char *name) {
    if (adt_cfg_check_range(c->in_channels, "in_channels", 1, CFG_MAX_CHANNELS, name) ||
        adt_cfg_check_range(c->height, "height", 1, CFG_MAX_IMAGE, name) ||
        adt_cfg_check_range(c->width, "width", 1, CFG_MAX_IMAGE, name) ||
        adt_cfg_check_range(c->classes, "classes", 2, CFG_MAX_WIDTH, name))
        return ADT_ERR_ARG;
    if (c->n_blocks < 1 || c->n_blocks > ADT_VGG_MAX_BLOCKS)
        return adt_error(ADT_ERR_ARG, "%s: field \"blocks\" has %d entries, expected 1 to %d blocks", name, c->n_blocks,
                         ADT_VGG_MAX_BLOCKS);
    if (c->n_fc < 0 || c->n_fc > ADT_VGG_MAX_FC)
        return adt_error(ADT_ERR_ARG, "%s: field \"fc\" has %d entries, expected 0 to %d hidden widths", name, c->n_fc,
                         ADT_VGG_MAX_FC);
    char what[48];
    for (int j = 0; j < c->n_fc; j++) {
        snprintf(what, sizeof what, "fc[%d]", j);
        if (adt_cfg_check_range(c->fc[j], what, 1, CFG_MAX_WIDTH, name)) return ADT_ERR_ARG;
    }
    /* every block halves the image: the last pool needs at least 2x2 */
    int64_t need = INT64_C(1) << c->n_blocks;
    if (c->height < need || c->width < need)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %d, but %d blocks each halve the image with a 2x2 max-pool: "
                         "expected at least %lld (or fewer blocks)", name, c->height < need ? "height" : "width",
                         c->height < need ? c->height : c->width, c->n_blocks, (long long)need);
    for (int b = 0; b < c->n_blocks; b++) {
        snprintf(what, sizeof what, "blocks[%d]", b);
        if (c->n_convs[b] < 1 || c->n_convs[b] > ADT_VGG_MAX_CONVS)
            return adt_error(ADT_ERR_ARG, "%s: field \"%s\" has %d entries, expected 1 to %d output channels of 3x3 "
                             "convolutions", name, what, c->n_convs[b], ADT_VGG_MAX_CONVS);
        int64_t plane = (int64_t)(c->height >> b) * (c->width >> b);
        for (int k = 0; k < c->n_convs[b]; k++) {
            snprintf(what, sizeof what, "blocks[%d][%d]", b, k);
            if (adt_cfg_check_range(c->channels[b][k], what, 1, CFG_MAX_CHANNELS, name)) return ADT_ERR_ARG;
            if (c->channels[b][k] * plane > VGG_MAX_ACT)
                return adt_error(ADT_ERR_ARG, "%s: field \"%s\": %d channels of %dx%d make %lld values per sample, "
                                 "expected at most %lld (a smaller image or fewer channels)", name, what,
                                 c->channels[b][k], c->height >> b, c->width >> b,
                                 (long long)(c->channels[b][k] * plane), (long long)VGG_MAX_ACT);
        }
    }
    int64_t flat = vgg_last_channels(c) * (c->height >> c->n_blocks) * (c->width >> c->n_blocks);
    if (flat > CFG_MAX_WIDTH)
        return adt_error(ADT_ERR_ARG, "%s: the flattened feature map has %lld values (%lld channels of %dx%d), expected "
                         "at most %d as the input of fc0 (more blocks or fewer channels in the last one)", name,
                         (long long)flat, (long long)vgg_last_channels(c), c->height >> c->n_blocks,
                         c->width >> c->n_blocks, CFG_MAX_WIDTH);
    return ADT_OK;
}

int64_t adt_cfg_params_vgg(const adt_vgg_cfg *c) {
    int64_t n = 0, ci = c->in_channels;
    for (int b = 0; b < c->n_blocks; b++)
        for (int k = 0; k < c->n_convs[b]; k++) {
            n += (ci * 9 + 1) * c->channels[b][k];
            ci = c->channels[b][k];
        }
    int64_t in = ci * (c->height >> c->n_blocks) * (c->width >> c->n_blocks);
    for (int j = 0; j <= c->n_fc; j++) {
        int64_t out = j < c->n_fc ? c->fc[j] : c->classes;
        n += (in + 1) * out;
        in = out;
    }
    return n;
}

/* ---- builder ------------------------------------------------------------------------------ */

/* x [B,Ci,H,W] -> relu(conv(x)) [B,Co,H,W]; nn.Conv2d's default init bound 1/sqrt(Ci*3*3). */
static int conv3x3_relu(adt_graph *g, int x, int index, int ci, int co) {
    char wn[ADT_NAME_LEN], bn[ADT_NAME_LEN];
    snprintf(wn, sizeof wn, "conv%d.weight", index);
    snprintf(bn, sizeof bn, "conv%d.bias", index);
    float bound = 1.0f / sqrtf((float)ci * 9.0f);
    int w = adt_param(g, wn, adt_shape_4d(co, ci, 3, 3), (adt_init){ADT_INIT_UNIFORM, -bound, bound});
    int b = adt_param(g, bn, adt_shape_1d(co), (adt_init){ADT_INIT_UNIFORM, -bound, bound});
    return adt_relu(g, adt_conv2d(g, x, w, b, 1, 1));
}

int adt_model_vgg(adt_graph *g, const adt_vgg_cfg *c, int batch, adt_model_io *io) {
    if (g->status) return g->status;
    if (adt_cfg_validate_vgg(c, "vgg")) return adt_graph_fail(g, ADT_ERR_ARG, "%s", adt_error_message()), g->status;
    if (batch < 1) return adt_graph_fail(g, ADT_ERR_ARG, "vgg: batch is %d, expected >= 1", batch), g->status;
    int B = batch, tag = 1, index = 0, ci = c->in_channels;
    adt_graph_set_layer_tag(g, 0);
    io->input = adt_input(g, "x", ADT_F32, adt_shape_4d(B, ci, c->height, c->width));
    io->input2 = -1;
    io->label = adt_label(g, "labels", ADT_I32, adt_shape_1d(B));
    int h = io->input;
    for (int b = 0; b < c->n_blocks; b++)
        for (int k = 0; k < c->n_convs[b]; k++) {
            adt_graph_set_layer_tag(g, tag++); /* shapes differ layer to layer: each its own tag */
            h = conv3x3_relu(g, h, index++, ci, c->channels[b][k]);
            ci = c->channels[b][k];
            if (k == c->n_convs[b] - 1) h = adt_maxpool2d(g, h, 2, 2); /* [B,ci,H/2,W/2] */
        }
    h = adt_flatten(g, h); /* [B, ci*H'*W'] in (channel, row, column) order, as torch.flatten */
    int in = (int)(ci * (int64_t)(c->height >> c->n_blocks) * (c->width >> c->n_blocks));
    for (int j = 0; j <= c->n_fc; j++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "fc%d", j);
        int out = j < c->n_fc ? c->fc[j] : c->classes;
        adt_graph_set_layer_tag(g, tag++);
        h = adt_layer_linear(g, h, prefix, in, out);
        if (j < c->n_fc) h = adt_relu(g, h);
        in = out;
    }
    io->logits = h; /* [B, classes] */
    io->loss = adt_softmax_xent(g, h, io->label);
    adt_graph_set_layer_tag(g, 0);
    return g->status;
}
