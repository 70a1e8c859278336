/*
 * plan_ps.c - parameter-server plans as files (docs/formats.md, "Plan files"): what `adtrain plan`
 * writes when it chooses the ps mode for a DLRM, and what `adtrain train --plan` runs as --mode ps.
 * No layouts: the servers hold the tables sharded by row, the workers the dense part whole.
 *
 *   {"format": "adtrain-plan", "version": 1, "mode": "ps", "model": {...}, "batch": B,
 *    "devices": N, "ps": {"servers": S, "sync": "sync", "prefetch": D, "dense": "workers"}}
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"
#include "models/cfg_internal.h"

#define PS_PLAN_FORMAT "adtrain-plan"
#define PS_PLAN_MAX_BYTES (1L << 20)

static const char *const ps_root_fields[] = {"format", "version", "mode", "model", "batch", "devices", "ps", NULL};
static const char *const ps_fields[] = {"servers", "sync", "prefetch", "dense", NULL};

static int get_str(const cJSON *obj, const char *field, const char *what, const char *name, const char **out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!cJSON_IsString(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" is %s, expected a string", name, what,
                         j ? adt_cfg_json_kind(j) : "missing");
    *out = j->valuestring;
    return ADT_OK;
}

static int parse_ps(adt_ps_plan *p, const cJSON *root) {
    const char *s = NULL;
    const char *name = p->name;
    int rc, v;
    if ((rc = get_str(root, "format", "format", name, &s))) return rc;
    if (strcmp(s, PS_PLAN_FORMAT))
        return adt_error(ADT_ERR_FORMAT, "%s: field \"format\" is \"%.40s\", expected \"" PS_PLAN_FORMAT "\"", name, s);
    if ((rc = adt_cfg_get_int(root, "version", 1, 1, name, &v))) return rc;
    if ((rc = adt_cfg_check_fields(root, ps_root_fields, "parameter-server plan", name))) return rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return adt_error(ADT_ERR_ARG, "%s: field \"model\": expected an object", name);
    char *text = cJSON_PrintUnformatted(model), mname[300];
    snprintf(mname, sizeof mname, "%s: model", name);
    rc = adt_model_cfg_parse(&p->model, text, mname);
    cJSON_free(text);
    if (rc) return rc;
    if ((rc = adt_cfg_get_int(root, "batch", 1, 1 << 24, name, &p->batch))) return rc;
    if ((rc = adt_cfg_get_int(root, "devices", 2, 1 << 20, name, &p->devices))) return rc;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(root, "ps");
    if (!cJSON_IsObject(ps)) return adt_error(ADT_ERR_ARG, "%s: field \"ps\": expected an object", name);
    char where[300];
    snprintf(where, sizeof where, "%s: ps", name);
    if ((rc = adt_cfg_check_fields(ps, ps_fields, "ps", where))) return rc;
    if ((rc = adt_cfg_get_int(ps, "servers", 1, p->devices - 1, where, &p->servers))) return rc;
    if ((rc = adt_cfg_get_int(ps, "prefetch", 0, 64, where, &p->prefetch))) return rc;
    if ((rc = get_str(ps, "sync", "ps.sync", name, &s))) return rc;
    if (strlen(s) >= sizeof p->sync) return adt_error(ADT_ERR_ARG, "%s: field \"ps.sync\" is too long", name);
    snprintf(p->sync, sizeof p->sync, "%s", s);
    if ((rc = get_str(ps, "dense", "ps.dense", name, &s))) return rc;
    if (strcmp(s, "workers") && strcmp(s, "servers"))
        return adt_error(ADT_ERR_ARG, "%s: field \"ps.dense\" is \"%.40s\", expected \"workers\" or \"servers\"", name, s);
    p->dense_servers = !strcmp(s, "servers");
    if (p->model.type != ADT_MODEL_DLRM)
        return adt_error(ADT_ERR_ARG, "%s: a parameter-server plan holds a DLRM's tables; its model is '%s'", name,
                         adt_model_type_name(p->model.type));
    return ADT_OK;
}

int adt_ps_plan_read(const char *path, adt_ps_plan *p, int *is_ps) {
    memset(p, 0, sizeof *p);
    *is_ps = 0;
    char *text;
    int rc = adt_cfg_read_text(path, "plan file", PS_PLAN_MAX_BYTES * 64, &text);
    if (!rc) rc = adt_ps_plan_parse(p, text, path, is_ps);
    free(text);
    return rc;
}

int adt_ps_plan_parse(adt_ps_plan *p, const char *text, const char *path, int *is_ps) {
    memset(p, 0, sizeof *p);
    *is_ps = 0;
    snprintf(p->name, sizeof p->name, "%s", path);
    int rc = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) rc = adt_cfg_json_error(text, end, path);
    const cJSON *mode = root ? cJSON_GetObjectItemCaseSensitive(root, "mode") : NULL;
    if (!rc && mode) {
        /* a collective plan has no "mode" (plan_file.c) */
        if (!cJSON_IsString(mode) || strcmp(mode->valuestring, "ps"))
            rc = adt_error(ADT_ERR_ARG, "%s: field \"mode\" is %.40s, expected \"ps\" (a collective plan has no \"mode\")",
                           path, cJSON_IsString(mode) ? mode->valuestring : adt_cfg_json_kind(mode));
        else {
            *is_ps = 1;
            rc = parse_ps(p, root);
        }
    }
    cJSON_Delete(root);
    return rc;
}

int adt_ps_plan_save(const adt_ps_plan *p, const char *path) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", PS_PLAN_FORMAT);
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddStringToObject(j, "mode", "ps");
    char *model = adt_model_cfg_to_json(&p->model);
    cJSON_AddItemToObject(j, "model", cJSON_Parse(model));
    free(model);
    cJSON_AddNumberToObject(j, "batch", p->batch);
    cJSON_AddNumberToObject(j, "devices", p->devices);
    cJSON *ps = cJSON_AddObjectToObject(j, "ps");
    cJSON_AddNumberToObject(ps, "servers", p->servers);
    cJSON_AddStringToObject(ps, "sync", p->sync);
    cJSON_AddNumberToObject(ps, "prefetch", p->prefetch);
    cJSON_AddStringToObject(ps, "dense", p->dense_servers ? "servers" : "workers");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    ADT_ASSERT(text);
    int rc = adt_file_write_atomic(path, text, strlen(text));
    cJSON_free(text);
    return rc ? adt_error(ADT_ERR_IO, "%s: cannot write the plan: %s", path, adt_error_message()) : ADT_OK;
}
