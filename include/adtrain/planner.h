/*
 * adtrain/planner.h - the cluster object, the cost model that prices a plan on it, and the
 * automatic planner that searches plans (DESIGN.md section 4).
 *
 *   cluster   what the devices are and how they are linked (a JSON file, docs/formats.md
 *             "Cluster files"): nodes of identical devices, link levels from the innermost
 *             (inside a node) outwards; `adtrain calibrate` writes one for this machine.
 *   cost      a plan's predicted step time (per stage a list schedule of compute and of the
 *             boxing programs the partitioner inserts, collectives overlapping computation the
 *             way the executor runs them; pipeline time sum(t_i) + (m-1) max(t_i)) and peak
 *             memory per device (persistent state by its shards, a liveness walk over the
 *             stage's values, saved activations times the microbatches in flight).
 *   search    over pipeline degrees and mesh shapes; per mesh an assignment of one n-D
 *             signature per node (tied layers share one choice) by exact eliminations and
 *             coordinate descent from every expert plan and the greedy one; layers to stages by
 *             dynamic programming; the best plan by the cost model, never predicted worse than
 *             the best expert plan.
 *
 * Layering: planner -> dist -> graph. Times in seconds, sizes in bytes.
 */
#ifndef ADTRAIN_PLANNER_H
#define ADTRAIN_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/dist.h"
#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "adtrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the cluster object ----------------------------------------------------------------------- */

#define ADT_CLUSTER_MAX_LINKS 4
#define ADT_CLUSTER_NAME_LEN 128
#define ADT_CLUSTER_MAX_SLOWDOWN 64
#define ADT_SYNC_POINTS 6 /* device.slowdown[].sync_curve: at most this many points */
#define ADT_CLUSTER_MAX_ACCUMULATE 16
/* op_factor's decades of FLOPs: below 1e4, 1e4..1e5, ..., 1e10 and above */
#define ADT_OP_FACTOR_BUCKETS 8

/* Op classes with their own calibrated compute rate. */
typedef enum adt_op_class {
    ADT_OPCLASS_MATMUL = 0, /* matrix products, embeddings                 */
    ADT_OPCLASS_CONV,       /* convolutions and their gradients            */
    ADT_OPCLASS_ATTENTION,  /* fused attention and its gradient            */
    ADT_OPCLASS_OTHER,      /* elementwise, norms, losses, optimizer steps */
    ADT_OPCLASS_COUNT
} adt_op_class;
const char *adt_op_class_name(int c);
int adt_op_class_of(int op_kind);

/* One link level: every aligned group of `span` consecutive devices is connected by it (level
 * 0: the devices of one node; the last level spans the whole cluster). bandwidth: bytes per
 * second one device moves in a ring collective over this level; latency: seconds per message. */
/* A collective calibrated on one link level for one group size: its time on a group of `ranks`
 * devices sharing a block of G bytes is the formula of include/adtrain/dist.h's boxing table
 * (e.g. all-reduce 2(n-1) alpha + 2(n-1)/n G beta) with this alpha and beta; send/recv is one
 * message, alpha + G beta. Kinds: adt_boxing_kind's collectives, or ADT_COLL_SEND_RECV. */
#define ADT_COLL_SEND_RECV ADT_BOXING_KIND_COUNT
#define ADT_LINK_MAX_COLL 80
typedef struct adt_coll_fit {
    int kind, ranks;
    double alpha, beta;
} adt_coll_fit;

typedef struct adt_link {
    char name[32];
    int span;
    double bandwidth, latency;
    double coll_fraction;              /* achievable share of bandwidth for a collective's bus
                                          bandwidth (NCCL's busbw over the line rate), 1: all */
    int n_coll;                        /* calibrated collectives (0: bandwidth/latency for all) */
    adt_coll_fit coll[ADT_LINK_MAX_COLL];
} adt_link;

typedef struct adt_cluster {
    char name[ADT_CLUSTER_NAME_LEN];
    char device_kind[64];
    int nodes, devices_per_node;
    double peak_flops[ADT_DTYPE_COUNT]; /* 0: not given                                     */
    adt_dtype compute_dtype;            /* whose peak the compute rates derive from          */
    double efficiency;                  /* achieved / peak where no rate is calibrated       */
    double peak_f16;                    /* FP16 peak (no adt_dtype of its own), 0: not given  */
    double matmul_fraction;             /* published achievable / peak on large matrix products, 0: not given */
    double memory_fraction;             /* achievable / memory_bw for streaming kernels (1 default) */
    double rate[ADT_OPCLASS_COUNT];     /* calibrated FLOP/s per op class, 0: peak x eff.    */
    double memory_bytes;                /* per device                                        */
    double memory_bw;                   /* bytes per second per device                       */
    double launch_s;                    /* fixed cost of one op                              */
    double rate_small[ADT_OPCLASS_COUNT]; /* FLOP/s of ops below small_flops, 0: rate[]      */
    double small_flops;                 /* the size class boundary (FLOPs per device), 0: none */
    /* Bytes per second a class's kernels move besides their FLOPs, per size class as the rates:
     * where given, an op takes flops / rate + bytes / byte_rate (a GEMM packs its operands and
     * writes its product whatever its inner size: a batch of 16 through a 784x1024 layer spends
     * as long on the 3 MB of weights as on the FLOPs); 0: the slower of flops / rate and
     * bytes / memory_bw. */
    double byte_rate[ADT_OPCLASS_COUNT], byte_rate_small[ADT_OPCLASS_COUNT];
    int cores_per_node;                 /* cores the node's devices share, 0: one each        */
    /* An op kind's measured time over the time the rates above price it at, per decade of
     * FLOPs per device (adt_op_factor_bucket); 0: not measured (the nearest measured decade of
     * the kind, else 1). Kernels of one class differ: a max-pool runs far below the copy
     * bandwidth, a ReLU in cache far above it, a convolution of 16 channels at 60% of one of 64. */
    double op_factor[ADT_OP_FACTOR_BUCKETS][ADT_OP_COUNT];
    int n_slowdown;                     /* measured compute slowdowns by busy ranks per node  */
    /* factor: compute time over one rank's; sync_s: what a rank loses each time it blocks on a
     * collective inside a step (its peers' arrival spread and wake-up), 0: nothing;
     * coll_factor: the ranks' own cores move the collectives' data (shared memory, no engine
     * of its own), so collectives are work of the compute clock, and a shared-memory all-reduce
     * (at least ADT_COMM_SHM_MIN_BYTES) takes its calibrated back-to-back latency plus
     * coll_factor times the fit's bytes part inside a step; 0: collectives overlap compute;
     * relay_factor: one rank's compute time while the other ranks - 1 wait for its messages (a
     * pipeline's ranks taking turns) over its time alone: what a waiting rank still takes of the
     * cores, and its wake-ups; 0: not measured (waiting ranks count as busy);
     * relay_segment_s: the compute one rank did per turn in that measurement, alone (its waits
     * lasted ranks - 1 turns); 0: not measured (a waiting rank's share holds all through a wait);
     * relay_long_factor, relay_long_segment_s: the same measured with turns about ten times
     * longer, whose waits mostly nap: what a napping rank still takes; 0: not measured (a
     * napping rank takes nothing);
     * sync_curve: the loss of a blocked wait (seconds) measured after segments of compute (the
     * ranks computing at once, as the cost model's clock runs), n_sync points by ascending
     * segment; a wait after s seconds of compute since the last one loses the line through
     * (0, 0) and the points, held beyond the last (adt_cluster_sync_loss); none: sync_s,
     * reached after 1 ms of compute */
    struct {
        int ranks, n_sync;
        double factor, sync_s, coll_factor, relay_factor, relay_segment_s, relay_long_factor, relay_long_segment_s;
        double sync_curve[ADT_SYNC_POINTS][2]; /* [segment_s, loss_s] */
    } slowdown[ADT_CLUSTER_MAX_SLOWDOWN];
    /* Gradient accumulation (a pipeline's or a microbatched step's acc += g per backward pass):
     * bytes of gradients one rank adds per second when a pass adds `bytes` of them, by size
     * (ascending): what stays in cache adds several times faster than memory_bw streams it.
     * 0 entries: priced at memory_bw. */
    int n_accumulate;
    struct { double bytes, bytes_per_s; } accumulate[ADT_CLUSTER_MAX_ACCUMULATE];
    int n_links;
    adt_link link[ADT_CLUSTER_MAX_LINKS];
    /* Not in cluster files, set by the caller for a job: the seconds one rank takes to produce
     * one sample of the job's input (the data source's fill and the copy into the executor's
     * fed values), which the trainer does inline before each step's passes; 0: not priced.
     * adtrain plan measures it on the --data the run will read (cli_measure_input). */
    double input_s;
} adt_cluster;

/* Parses a cluster from JSON text / a file. Strict: unknown fields, wrong types, out-of-range
 * numbers, link spans that do not nest, are errors whose message starts with the name and names
 * the field. Every object may carry a "comment" string (where its numbers come from). */
int adt_cluster_parse(adt_cluster *c, const char *json_text, const char *name_for_errors);
int adt_cluster_load(adt_cluster *c, const char *path);
/* Checks a cluster built in code; the message names the field. */
int adt_cluster_validate(const adt_cluster *c, const char *name_for_errors);
/* The JSON form (adt_cluster_parse reads it back to the same object); free() it. */
char *adt_cluster_to_json(const adt_cluster *c);
int adt_cluster_devices(const adt_cluster *c);
/* The FLOP/s of an op class: the calibrated rate, else peak(compute_dtype) x efficiency. */
double adt_cluster_rate(const adt_cluster *c, int op_class);
/* The FLOP/s of an op of the class doing `flops` per device: rate_small below small_flops. */
double adt_cluster_op_rate(const adt_cluster *c, int op_class, double flops);
/* The seconds of one op of kind `op` doing `flops` and moving `bytes` on one device: flops at its
 * class's rate plus bytes at its byte rate where the class has one, else the slower of the rate
 * and the memory bandwidth; plus launch_s, times the kind's op_factor. */
double adt_cluster_op_time(const adt_cluster *c, int op, double flops, double bytes);
/* The op_factor decade of an op doing `flops` per device. */
int adt_op_factor_bucket(double flops);
/* How much slower compute runs when `ranks` devices of one node are busy at once: the measured
 * slowdown of the largest rank count <= ranks (device.slowdown), else 1; at least ranks /
 * cores_per_node when they outnumber the cores (ranks time-share them). */
double adt_cluster_share(const adt_cluster *c, int ranks);
/* The functions below down to adt_cluster_nap_share (but adt_cluster_share_load) model ranks
 * time-sharing a node's cores (src/planner/cores.c): each gives its "none" (0, or -1 where said)
 * unless `ranks` outnumber cores_per_node, whatever the cluster's calibration measured. */
/* What a rank loses when it blocks on a collective inside a step with `ranks` devices of one node
 * busy: sync_s of the same slowdown entry adt_cluster_share picks, else 0. */
double adt_cluster_sync_s(const adt_cluster *c, int ranks);
/* What a rank loses when it blocks on a collective inside a step after `compute_s` seconds of
 * compute since its last blocked wait, with `ranks` devices of one node busy: the peers' arrival
 * spread grows with the compute between two waits (bench/bench_lockstep.c). The entry's
 * sync_curve, the line through (0, 0) and its points, held beyond the last; without one, or
 * where `mpi` (the wait is for one of MPI's collectives, not the shared-memory all-reduce the
 * curve was measured with), sync_s x min(1, compute_s / 1 ms). */
double adt_cluster_sync_loss(const adt_cluster *c, int ranks, double compute_s, int mpi);
/* coll_factor of that entry: > 0 when collectives are work of the ranks' cores, 0 when they
 * overlap compute. */
double adt_cluster_coll_factor(const adt_cluster *c, int ranks);
/* The compute slowdown on a node of `ranks` ranks of which `active` (a fraction where a caller
 * averages) compute while the others wait for messages: the waiting ones count as the share of
 * a busy rank that the entry's relay_factor implies (the load L = active + w (ranks - active)
 * with adt_cluster_share, interpolated between rank counts, at 1 + w (ranks - 1) equal to
 * relay_factor). -1 when the entry has no relay_factor: then every rank counts as busy. */
double adt_cluster_share_active(const adt_cluster *c, int ranks, double active);
/* The compute slowdown on a node at a load of `load` busy ranks (adt_cluster_share interpolated
 * between rank counts; 1 rank's below 1). */
double adt_cluster_share_load(const adt_cluster *c, double load);
/* The share of a busy rank, at most 1, that a waiting rank of `ranks` on a node takes while it
 * still yields (the first ADT_COMM_YIELD_MIN_S or more of a wait, comm.h), and, at most as much,
 * once it naps (adt_cluster_nap_share): the entry's relay measurement waited ranks - 1 turns of
 * relay_factor x relay_segment_s and yielded for ADT_COMM_YIELD_MIN_S of each wait, so the
 * constant share w of adt_cluster_share_active is this share for that part of the wait and the
 * nap share for the rest. -1 without both fields. */
double adt_cluster_yield_share(const adt_cluster *c, int ranks);
/* The share of a busy rank that a waiting rank of `ranks` takes once its wait naps: from the
 * long relay (relay_long_factor, relay_long_segment_s), whose waits nap but for their first
 * ADT_COMM_YIELD_MIN_S, with the yielding part at adt_cluster_yield_share's share (the two
 * relays solved together). 0 where the entry has no long relay. */
double adt_cluster_nap_share(const adt_cluster *c, int ranks);
/* The seconds one rank takes to add `bytes` of gradients into their accumulators (one backward
 * pass's share of a step's accumulation) with `busy` ranks of the node computing: the rate of
 * device.accumulate at that size (interpolated in log size, the nearest end outside), else
 * memory_bw over the three streams (read both, write one), over adt_cluster_share. A first pass
 * copies and the update's scaling reads and writes: two streams, 2/3 of this. */
double adt_cluster_accumulate_s(const adt_cluster *c, double bytes, int busy);
/* The link level of mesh axis a: the slowest level any group along it spans (ranks: device ids). */
int adt_cluster_axis_level(const adt_cluster *c, const adt_mesh *m, int a);
/* The seconds of one collective of `kind` (adt_boxing_kind or ADT_COLL_SEND_RECV) on a group of
 * n devices over link level `level`, G bytes shared by the group; `busy` devices of the node run
 * at once. The calibrated fit of that kind for the group size (for `busy` when they outnumber
 * the cores: what the time-shared cores give), else the nearest smaller size's, else the link's
 * bandwidth and latency. */
double adt_cluster_coll_time(const adt_cluster *c, int level, int kind, int n, double group_bytes, int busy);
const char *adt_coll_kind_name(int kind);
/* The innermost link level joining devices a and b (a == b: level 0). */
int adt_cluster_level(const adt_cluster *c, int a, int b);
/* Alpha and beta of each mesh axis: the slowest link any group along the axis spans, the
 * mesh's ranks taken as device ids. The local-step price is a tie-breaker. */
adt_comm_cost adt_cluster_mesh_cost(const adt_cluster *c, const adt_mesh *m);
/* The same cluster without node `node` / with `count` more nodes (re-planning). */
int adt_cluster_remove_node(adt_cluster *c, int node);
int adt_cluster_add_nodes(adt_cluster *c, int count);

/* ---- the cost model --------------------------------------------------------------------------- */

typedef struct adt_cost_report {
    int feasible;              /* peak memory within the device's                               */
    double step_s;             /* predicted time of one step                                    */
    double peak_mem_bytes;     /* the largest over devices                                      */
    int n_stages, microbatches;
    double stage_s[ADT_PLAN_MAX_STAGES];   /* one microbatch through stage s                    */
    double stage_mem[ADT_PLAN_MAX_STAGES]; /* peak bytes per device of stage s                  */
    /* where the time goes (stage of the longest t_i, per microbatch, then scaled to a step) */
    double compute_s;          /* compute on the critical stage                                  */
    double comm_s[ADT_BOXING_KIND_COUNT]; /* busy time of each collective kind                  */
    double exposed_comm_s;     /* communication not hidden behind compute                        */
    double p2p_s;              /* stage-boundary transfers                                       */
    double sync_s;             /* of the exposed: blocked waits' sync cost (device.slowdown)     */
    double input_s;            /* producing the samples of the rank's fed blocks (cluster input_s) */
    double accumulate_s;       /* microbatch slots: adding each pass's gradients, scaling the sum */
    double bubble_s;           /* pipeline bubbles: step - m x max(t_i)                         */
    double state_bytes;        /* parameters and optimizer state per device (critical stage)     */
    double act_bytes;          /* the liveness peak of one microbatch                            */
    double saved_bytes;        /* activations kept for backward, per microbatch in flight        */
} adt_cost_report;

/* Prices a bound plan on a cluster (the plan's ranks are device ids); g is the plan's graph.
 * The boxing programs are priced with the plan's own link costs (what the partitioner inserts
 * and the executor runs), the compute with the cluster's rates. */
int adt_plan_cost(const adt_plan *p, const adt_graph *g, const adt_cluster *c, adt_cost_report *out);
/* The product of the mesh axes on which some operand of signature s is split: how many devices
 * share the node's work (OneFlow's rule; P x B -> P does not split it). */
double adt_nd_sig_parts(const adt_node *n, const adt_nd_sig *s, const adt_mesh *m);
/* The compute seconds of one node when `parts` devices share its work. */
double adt_node_time(const adt_graph *g, int node, double parts, const adt_cluster *c);
/* The compute seconds of one node on one device of mesh m under signature sig: its FLOPs over
 * the devices that share them (adt_nd_sig_parts), the bytes of the blocks it reads and writes
 * there (a data-parallel matmul splits its activations but reads the whole weight). */
double adt_node_sig_time(const adt_graph *g, int node, const adt_nd_sig *sig, const adt_mesh *m, const adt_cluster *c);

/* ---- the signature-assignment problem and its solvers --------------------------------------------
 * Variables x_i in [0, k_i); cost J(x) = sum_i unary_i(x_i) + sum_e pair_e(x_a, x_b), every term
 * >= 0 (infinite: ADT_SEARCH_INF). The planner builds one per stage mesh (variables = tied groups
 * of nodes, choices = their usable n-D signatures); the tests build random ones. */
#define ADT_SEARCH_INF ADT_BOXING_NONE

typedef struct adt_search_problem {
    int n_vars;
    int *k;          /* [n_vars] choices                                   */
    double **unary;  /* [n_vars][k_i]                                      */
    int n_edges, cap_edges;
    int *ea, *eb;    /* [n_edges] endpoints, ea != eb                      */
    double **pair;   /* [n_edges][k_a * k_b], row-major in x_a             */
} adt_search_problem;

void adt_search_init(adt_search_problem *p, int n_vars, const int *k);
/* Adds cost[k_a * k_b] (row-major in x_a) to the pair (a, b); a pair seen before is summed into
 * the same edge; a == b adds the diagonal to the unary. */
void adt_search_add_pair(adt_search_problem *p, int a, int b, const double *cost);
void adt_search_free(adt_search_problem *p);
double adt_search_cost(const adt_search_problem *p, const int *x);

typedef struct adt_search_stats {
    int eliminated;  /* variables removed exactly (degree <= 2)                 */
    int core;        /* variables left for coordinate descent                   */
    int sweeps;
    int starts;
    int exact;       /* 1: the result is proved optimal (the elimination left nothing, or the
                        bounded branch and bound on the core finished)              */
} adt_search_stats;

/* The search: eliminates degree-0, -1 and -2 variables exactly (a chain or a series-parallel
 * graph is solved exactly), then coordinate descent with pair moves on what is left, from each
 * of the n_starts start points (x of the full problem, entries may be -1), from the greedy one
 * and from a few random ones, at most max_sweeps sweeps each; then, on a core of at most 32
 * variables, a branch and bound from the best point of at most core_steps steps (0: none;
 * ADT_SEARCH_CORE_STEPS the planner's), which proves it optimal or improves it. x receives the
 * best found. Returns its cost. */
#define ADT_SEARCH_CORE_STEPS 2e5
double adt_search_solve(const adt_search_problem *p, const int *const *starts, int n_starts, int max_sweeps,
                        double core_steps, int *x, adt_search_stats *st);
/* The exact optimum by depth-first branch and bound (for small problems: the yardstick).
 * Returns the cost, or a negative number after max_nodes branch steps without a proof. */
double adt_search_exhaustive(const adt_search_problem *p, int *x, double max_nodes);

/* The problem of a graph on a stage mesh: one variable per tied group of nodes (nodes in layers
 * of equal structure at the same position), choices = the representative's usable n-D
 * signatures; unary = compute time (+ lambda x the persistent and saved bytes the choice keeps
 * per device); pairs = the boxing time of every edge (a parameter's or optimizer state's held
 * layout is its updater's). */
typedef struct adt_sbp_space {
    adt_search_problem prob;
    int *var_of;          /* [n_nodes] */
    int *rep;             /* [n_vars] representative node */
    adt_nd_sig **sigs;    /* [n_vars][k] */
    double **mem;         /* [n_vars][k] bytes per device the choice keeps (all members) */
    double lambda;        /* the memory penalty in unary: seconds per byte kept             */
} adt_sbp_space;

/* sigs: the usable signatures of g on m to share (NULL: enumerated for this build alone);
 * boxing: boxing times on m at `cost` to share (NULL: a cache of its own). */
int adt_sbp_space_build(adt_sbp_space *s, const adt_graph *g, const adt_mesh *m, const adt_comm_cost *cost,
                        const adt_cluster *c, double lambda, adt_sig_cache *sigs, adt_boxing_cache *boxing);
/* Sets the memory penalty: unary costs become compute and local steps + lambda x bytes kept. */
void adt_sbp_space_set_penalty(adt_sbp_space *s, double lambda);
void adt_sbp_space_free(adt_sbp_space *s);
/* The choice of every variable matching a plan's node signatures (-1 where none matches). */
void adt_sbp_space_choice(const adt_sbp_space *s, const adt_graph *g, const adt_nd_sig *node_sig, int *x);
/* The layout each leaf is held in under node signatures node_sig, the partitioner's default:
 * as its in-place updater reads it, else as its first reader reads it (P as B), else replicated. */
void adt_leaf_layouts(const adt_graph *g, const adt_nd_sig *node_sig, adt_ndsbp *leaf_sbp);
/* Signatures and leaf layouts from a choice: params and optimizer state held as their updater
 * reads them, fed inputs as their first reader reads them (P as B), the rest replicated. */
void adt_sbp_space_apply(const adt_sbp_space *s, const adt_graph *g, const int *x, adt_nd_sig *node_sig,
                         adt_ndsbp *leaf_sbp);

/* ---- the automatic planner -------------------------------------------------------------------- */

typedef struct adt_planner_opts {
    int devices;          /* 0: every device of the cluster                         */
    int batch;            /* global samples per step                                 */
    adt_optim_kind optim;
    int momentum;
    double mem_limit;     /* bytes per device; 0: the cluster's device memory         */
    int max_pp;           /* largest pipeline degree tried; 0: up to the layer count  */
    int max_sweeps;       /* 0: 50                                                   */
    int no_search;        /* 1: expert plans only (the baseline)                      */
    double min_gain;      /* a searched plan displaces an expert plan when predicted   */
                          /* at least this fraction faster; 0: 0.02                   */
} adt_planner_opts;

#define ADT_PLANNER_MAX_EXPERTS 32

typedef struct adt_planner_result {
    adt_plan plan;                  /* the chosen plan (bound to graph)                   */
    adt_graph *graph;               /* the training graph it was made for                 */
    adt_cost_report cost;
    double search_s;                /* wall clock                                           */
    double search_cpu_s;            /* CPU time of the process meanwhile (a shared machine) */
    int n_candidates;               /* (pp, mesh) pairs searched                           */
    int from_expert;                /* the chosen plan is an expert plan (index), or -1   */
    int n_experts;
    char expert_name[ADT_PLANNER_MAX_EXPERTS][64];
    adt_cost_report expert_cost[ADT_PLANNER_MAX_EXPERTS];
    int expert_ok[ADT_PLANNER_MAX_EXPERTS]; /* 0: refused (the strategy cannot apply)     */
} adt_planner_result;

/* Finds the plan of model c on the cluster (its first opts->devices devices). */
int adt_planner_search(const adt_model_cfg *c, const adt_cluster *cl, const adt_planner_opts *o,
                       adt_planner_result *out);
void adt_planner_result_free(adt_planner_result *r);
/* Placement: the nesting of the plan's mesh axes onto device ids (every order of the axes; the
 * innermost becomes the intra-node axis) that the cost model prices fastest, so the heaviest
 * traffic rides the fastest links. Rewrites p's ranks, link costs and intra-node axis when an
 * order is better than the current one; *r (may be NULL) the placed plan's report. */
int adt_planner_place(adt_plan *p, const adt_graph *g, const adt_cluster *c, adt_cost_report *r);
/* Re-plans an existing plan's model, batch and optimizer on a changed cluster (every device of
 * it): what the elastic runtime calls when a node leaves or joins. */
int adt_planner_replan(const adt_plan *old, const adt_cluster *cl, adt_planner_result *out);


/* ---- decoder language models at scale (lm.c) ---------------------------------------------------
 * A GPT's plan priced from its shapes alone (nothing of the model's size is built): the FLOPs and
 * bytes of each kernel of a layer against a roofline (peak of the precision x matmul_fraction,
 * memory_bw x memory_fraction), each collective by alpha-beta on its link level (a group's share
 * of the node's links, x coll_fraction), the 1F1B and interleaved pipeline formulas, gradient
 * synchronisation overlapping the last backward pass, memory per device by its parts (weights,
 * gradients, optimizer state by ZeRO stage; activations by recomputation and microbatches in
 * flight). Rank order as Megatron-LM's: tensor innermost, then data, then pipeline. */
typedef enum adt_lm_precision { ADT_LM_F32 = 0, ADT_LM_BF16 = 1, ADT_LM_F16 = 2 } adt_lm_precision;
typedef enum adt_lm_recompute {
    ADT_LM_RECOMPUTE_NONE = 0,
    ADT_LM_RECOMPUTE_SELECTIVE = 1, /* the attention core (scores, softmax, dropout) again */
    ADT_LM_RECOMPUTE_FULL = 2       /* each layer's forward again from its input */
} adt_lm_recompute;
const char *adt_lm_precision_name(int p);  /* "f32", "bf16", "f16" */
const char *adt_lm_recompute_name(int r);  /* "none", "selective", "full" */
int adt_lm_precision_parse(const char *s);  /* -1: unknown */
int adt_lm_recompute_parse(const char *s);  /* -1: unknown */

typedef struct adt_lm_shape {
    int vocab, seq, layers, hidden, heads;
} adt_lm_shape;

/* The plan. In adt_lm_search's `fixed`, 0 (degrees, sizes, zero: -1) and -1 (precision,
 * recompute) leave a dimension to the search. */
typedef struct adt_lm_plan {
    int dp, tp, pp;
    int vstages;      /* model chunks per pipeline stage (interleaved 1F1B when > 1) */
    int micro_batch;  /* samples per microbatch; microbatches = batch / (dp x micro_batch) */
    int zero;         /* 0 none, 1 optimizer state, 2 + gradients, 3 + weights sharded over dp */
    int precision;    /* adt_lm_precision: the compute dtype; f32 master weights and optimizer
                         state below f32 */
    int recompute;    /* adt_lm_recompute */
} adt_lm_plan;

typedef struct adt_lm_report {
    int feasible, microbatches;
    double step_s, peak_mem_bytes;
    double model_flops;        /* per step, counted as Narayanan et al. (SC'21) count them      */
    double tflops_per_device;  /* model_flops / step_s / devices / 1e12                          */
    double mfu;                /* model FLOPs without recomputation (3/4 of model_flops) / peak  */
    /* where the time goes on the slowest stage, per step */
    double compute_s, tp_comm_s, p2p_s, bubble_s, dp_comm_s, dp_exposed_s, optimizer_s;
    /* memory on the device of the peak: its parts */
    double weight_bytes, grad_bytes, optim_bytes, act_bytes, logits_bytes;
} adt_lm_report;

/* The shape of a GPT config; an error naming the model type otherwise. */
int adt_lm_shape_of(const adt_model_cfg *m, adt_lm_shape *s);
double adt_lm_params(const adt_lm_shape *s);
/* F = 96 B s l h^2 (1 + s / 6h + V / 16 l h): a step's FLOPs with one recomputed forward,
 * Narayanan et al. (SC'21) eq. 3, the figure their TFLOP/s per GPU divide. */
double adt_lm_paper_flops(const adt_lm_shape *s, double batch);
/* Prices plan p for `batch` sequences per step on the cluster's first dp x tp x pp devices;
 * mem_limit 0: the device's memory. An invalid plan is an error whose message names the field
 * (the CLI flag's name: "--strategy", "--micro-batch", ...). */
int adt_lm_cost(const adt_lm_shape *s, const adt_cluster *c, int batch, const adt_lm_plan *p, double mem_limit,
                adt_lm_report *out);
/* The fastest feasible plan on `devices` devices: every tensor degree dividing the heads, every
 * pipeline degree and chunking dividing the layers, micro-batch sizes, ZeRO stages and
 * recomputations the fixed fields leave free. *evaluated: plans priced. Error if none fits. */
int adt_lm_search(const adt_lm_shape *s, const adt_cluster *c, int devices, int batch, double mem_limit,
                  const adt_lm_plan *fixed, adt_lm_plan *best, adt_lm_report *out, long *evaluated);

/* ---- parameter-server mode (ps.c) -------------------------------------------------------------
 * A DLRM on S server ranks holding its embedding tables (sharded by row) and W = devices - S
 * workers that pull the rows their samples touch, run the dense part, push the rows' gradients
 * and all-reduce the dense gradients among themselves (adtrain train --mode ps, --ps-dense
 * workers, --ps-sync sync). Priced from the distribution of the ids: the expected number of
 * distinct rows of a table among n draws, sum over rows of 1 - (1 - p_r)^n. */
typedef enum adt_ps_ids_kind {
    ADT_PS_IDS_UNIFORM, /* every row alike (also the law assumed for ids of unknown law: the most rows) */
    ADT_PS_IDS_ZIPF,    /* row k-1 with weight k^-param (param: the exponent) */
    ADT_PS_IDS_SQUARE   /* a value floor(param u^2), u uniform (param values), hashed to a row */
} adt_ps_ids_kind;
typedef struct adt_ps_ids {
    adt_ps_ids_kind kind;
    double param;
} adt_ps_ids;
/* Expected distinct rows among n independent draws from a table of `rows` rows. */
double adt_ps_expected_distinct(const adt_ps_ids *law, int64_t rows, double n);

/* adt_ps_opts.staleness of --ps-sync async: no bound */
#define ADT_PS_COST_ASYNC (-1)
typedef struct adt_ps_opts {
    int devices, servers;   /* servers 0: searched (1 .. devices - 1) */
    int batch;              /* global samples per step, split over the workers */
    int prefetch;           /* steps of rows asked ahead (--ps-prefetch) */
    int staleness;          /* --ps-sync: 0 sync, K > 0 ssp:K, ADT_PS_COST_ASYNC async */
    const adt_ps_ids *ids;  /* [n_tables] the law of each table's ids; NULL: uniform */
    adt_optim_kind optim;   /* the sparse optimizer: SGD or Adam (lazy) */
    double mem_limit;       /* per device, 0: the cluster's */
} adt_ps_opts;

typedef struct adt_ps_report {
    int servers, workers, feasible;
    double step_s;
    double compute_s;        /* a worker's dense forward, backward and update, its rows copied */
    double pull_s, push_s;   /* rows over the network, the busier NIC (a worker's or a server's);
                              * the pull with the loss of a blocked wait on shared cores */
    double update_s;         /* a server's row updates per step, memory-bound (sync: the pushes
                              * summed, each row once; ssp/async: each push applied apart) */
    double dense_s;          /* the dense gradients' all-reduce among the workers (and the loss of
                              * its blocked wait on shared cores) */
    int lookahead;           /* steps a pull's answer may be made ahead of its step: sync 0,
                              * ssp:K min(K, prefetch), async prefetch */
    double round_s;          /* push + update + pull: what a step's rows wait for under sync */
    double wait_s;           /* the part of round_s a step waits for (all of it at lookahead 0) */
    double server_s;         /* a server's busy time per step (updates, answers): a floor */
    double rows_worker;      /* distinct rows a worker touches per step, all tables */
    double rows_step;        /* distinct rows of the whole batch (what the servers update) */
    double pull_bytes, push_bytes; /* per worker per step: ids out and rows back; ids and gradients out */
    double server_bytes;     /* per server per step, in and out */
    double server_mem_bytes, worker_mem_bytes;
} adt_ps_report;

/* Prices the ps mode of DLRM `m` with opts->servers servers, or (servers 0) the fastest feasible
 * server count, under opts->staleness with opts->prefetch; an error for a model without tables,
 * a split that cannot run or a staleness below ADT_PS_COST_ASYNC. */
int adt_ps_cost(const adt_model_cfg *m, const adt_cluster *c, const adt_ps_opts *o, adt_ps_report *out);

#ifdef __cplusplus
}
#endif
#endif
