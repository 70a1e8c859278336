/*
 * cores.h - inside the planner: the part of the graph cost model (cost.c) that models CPU ranks
 * sharing a node's cores, kept apart in cores.c. No real accelerator cluster has these effects;
 * they apply only where a node's busy ranks outnumber its cores_per_node (the compute slowdown of
 * co-located ranks aside, which a calibration measures at every count).
 */
#ifndef ADTRAIN_PLANNER_CORES_H
#define ADTRAIN_PLANNER_CORES_H

#include "adtrain/planner.h"

/* One stage of a plan as cost.c priced it (per microbatch unless said). */
typedef struct stage_eval {
    double acc_bytes, acc_s, acc_tail; /* gradients the update reads; their adding per microbatch, scaling per step */
    double time, fb, f, compute, comm[ADT_BOXING_KIND_COUNT], p2p, sync, input, state, act_peak, saved;
    double p2p_bytes; /* received from the stages before, per microbatch */
} stage_eval;

/* The 1F1B schedule played out pass by pass on nodes whose ranks share their cores (the
 * cluster's relay measurements say how much a waiting rank still takes); the makespan. */
double cores_play_1f1b(const adt_plan *p, const adt_cluster *c, const stage_eval *ev, int m, int busy);
/* 1 when a shared-memory collective of `group` ranks waits for all `busy` ranks of the node (they
 * outnumber its cores and take them in turn). */
int cores_group_waits(const adt_cluster *c, int group, int busy);

#endif
