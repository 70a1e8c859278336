/*
 * config_write.c - a model config back to JSON, in the form adt_model_cfg_parse reads: stored
 * with checkpoints so that a file says which model it belongs to, and read by other tools
 * (scripts/torch_ckpt.py rebuilds the model in PyTorch from it).
 */
#include <cJSON.h>
#include <stdlib.h>

#include "adtrain/base.h"
#include "adtrain/models.h"

static const char *activation_name(adt_activation a) {
    static const char *const names[] = {"relu", "gelu", "sigmoid"};
    return (unsigned)a <= ADT_ACT_SIGMOID ? names[a] : "?";
}

char *adt_model_cfg_to_json(const adt_model_cfg *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", adt_model_type_name(c->type));
    if (c->type == ADT_MODEL_GPT) {
        const adt_gpt_cfg *g = &c->gpt;
        cJSON_AddNumberToObject(j, "vocab_size", g->vocab_size);
        cJSON_AddNumberToObject(j, "n_ctx", g->n_ctx);
        cJSON_AddNumberToObject(j, "n_layer", g->n_layer);
        cJSON_AddNumberToObject(j, "n_embd", g->n_embd);
        cJSON_AddNumberToObject(j, "n_head", g->n_head);
        cJSON_AddNumberToObject(j, "dropout", g->dropout);
    } else if (c->type == ADT_MODEL_MLP) {
        cJSON_AddItemToObject(j, "sizes", cJSON_CreateIntArray(c->mlp.sizes, c->mlp.n_sizes));
        cJSON_AddStringToObject(j, "activation", activation_name(c->mlp.activation));
    } else if (c->type == ADT_MODEL_VGG) {
        const adt_vgg_cfg *v = &c->vgg;
        cJSON_AddNumberToObject(j, "in_channels", v->in_channels);
        cJSON_AddNumberToObject(j, "height", v->height);
        cJSON_AddNumberToObject(j, "width", v->width);
        cJSON *blocks = cJSON_AddArrayToObject(j, "blocks");
        for (int b = 0; b < v->n_blocks; b++) cJSON_AddItemToArray(blocks, cJSON_CreateIntArray(v->channels[b], v->n_convs[b]));
        cJSON_AddItemToObject(j, "fc", cJSON_CreateIntArray(v->fc, v->n_fc));
        cJSON_AddNumberToObject(j, "classes", v->classes);
    } else if (c->type == ADT_MODEL_DLRM) {
        const adt_dlrm_cfg *d = &c->dlrm;
        cJSON_AddNumberToObject(j, "n_dense", d->n_dense);
        cJSON_AddNumberToObject(j, "n_tables", d->n_tables);
        cJSON_AddItemToObject(j, "table_rows", cJSON_CreateIntArray(d->table_rows, d->n_tables));
        cJSON_AddNumberToObject(j, "emb_dim", d->emb_dim);
        cJSON_AddItemToObject(j, "bottom", cJSON_CreateIntArray(d->bottom, d->n_bottom));
        cJSON_AddItemToObject(j, "top", cJSON_CreateIntArray(d->top, d->n_top));
    }
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    ADT_ASSERT(text);
    char *out = adt_strdup(text); /* released with free(), like everything adtrain allocates */
    cJSON_free(text);
    return out;
}
