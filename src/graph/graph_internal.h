/*
 * graph_internal.h - functions shared inside graph/ (and by the executor) that are not API.
 */
#ifndef ADTRAIN_GRAPH_INTERNAL_H
#define ADTRAIN_GRAPH_INTERNAL_H

#include "adtrain/graph.h"

/* A persistent OPT_STATE value belonging to `param`, zero-initialised. */
int adt_graph_new_state(adt_graph *g, const char *name, adt_shape shape, int param);

#endif
