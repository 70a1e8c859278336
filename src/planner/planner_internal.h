/*
 * planner_internal.h - what the planner's files share: a cache of boxing-program times by
 * (tensor shape, dtype, from, to) on one mesh with one set of link prices. The search prices
 * the same conversions thousands of times (tied layers, every pair of choices); the cost model
 * prices every edge of a plan.
 */
#ifndef ADTRAIN_PLANNER_INTERNAL_H
#define ADTRAIN_PLANNER_INTERNAL_H

#include "adtrain/planner.h"

typedef struct adt_box_key {
    adt_shape shape;
    int dtype;
    adt_ndsbp from, to;
} adt_box_key;

typedef struct adt_box_val {
    double time;                         /* ADT_SEARCH_INF: no program                */
    double kind[ADT_BOXING_KIND_COUNT];  /* the steps' times by kind                  */
} adt_box_val;

typedef struct adt_box_cache {
    adt_box_key *key;
    adt_box_val *val;
    char *used;
    size_t cap, n;
    const adt_mesh *m;         /* set these two before the first call */
    const adt_comm_cost *cost;
} adt_box_cache;

/* The time of the cheapest program converting value v from `from` to `to` (adt_boxing_plan), 0
 * when equal, ADT_SEARCH_INF when none exists; *kinds (may be NULL) the steps' times by kind. */
double adt_box_cache_time(adt_box_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                          const adt_box_val **kinds);
void adt_box_cache_free(adt_box_cache *c);

#endif
