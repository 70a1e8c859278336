/*
 * adtrain/dist.h - the distributed algebra: nd-SBP blocks on a device mesh, n-D op signatures,
 * boxing (SBP conversion) programs priced by the alpha-beta model, an in-memory executor of
 * boxing programs over per-rank buffers, the localisation of a global node for one rank, and
 * the partitioner that turns a global training graph and a plan into a rank's local graph.
 *
 * Conventions (DESIGN.md section 2):
 *   - A mesh has 1..ADT_MAX_MESH_DIMS axes, coordinates row-major, axis 0 outermost.
 *   - An nd-SBP holds one SBP per mesh axis. Splits nest left to right: when mesh axes a < b
 *     both split tensor axis k, axis a cuts k into blocks first and axis b cuts each of those.
 *     Every cut is the block distribution of adt_block_range (sizes differ by at most one), except
 *     on a mesh with a batch split (tensor.h, adt_mesh_cut): there the data-parallel axis cuts
 *     batch-derived lengths into the split's parts.
 *   - P on a set of mesh axes: the ranks that differ only in those coordinates hold full-size
 *     blocks whose elementwise sum is the logical block.
 *   - An n-D signature of a node is one 1-D signature (ops.h) per mesh axis: the Cartesian
 *     product. It is usable on a mesh when every block is non-empty and each rank's local op,
 *     run on its input blocks, yields exactly its output blocks (adt_nd_sig_check).
 *
 * Strings: an nd-SBP is written "(S(0),B)" and parsed from "(S0,B)", "S0,B", "(S(-1), P)"...
 * (src/dist/README.md has the grammar).
 */
#ifndef ADTRAIN_DIST_H
#define ADTRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/graph.h"
#include "adtrain/models.h"
#include "adtrain/ops.h"
#include "adtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- meshes -------------------------------------------------------------------------------- */

/* A mesh of the given shape whose coordinate i (row-major) is rank i (ranks = NULL). Checks
 * 1 <= ndim <= ADT_MAX_MESH_DIMS and dims >= 1; returns ADT_OK or ADT_ERR_ARG. */
int adt_mesh_init(adt_mesh *m, int ndim, const int *dims);
/* Row-major position of a coordinate, and back. */
int adt_mesh_index(const adt_mesh *m, const int *coord);
void adt_mesh_coord(const adt_mesh *m, int index, int *coord);
/* The global rank at a coordinate: m->ranks[index], or index when ranks is NULL. */
int adt_mesh_rank(const adt_mesh *m, const int *coord);
/* "(2,3)" */
char *adt_mesh_str(const adt_mesh *m, char *buf, size_t n);
/* The part [start, start + len) of a length n that coordinate i of mesh axis `axis` holds: the
 * parts of the mesh's batch split (tensor.h) for a length the batch divides on its split axis,
 * else adt_block_range. Every block of an nd-SBP is cut with it. */
void adt_mesh_cut(const adt_mesh *m, int axis, int64_t n, int i, int64_t *start, int64_t *len);

/* ---- nd-SBP -------------------------------------------------------------------------------- */

/* Parses an nd-SBP of exactly mesh_ndim entries for a tensor of rank tensor_rank (negative
 * split axes count from the end). On failure returns ADT_ERR_ARG with a message quoting the
 * text and saying what was expected. */
int adt_ndsbp_parse(const char *s, int mesh_ndim, int tensor_rank, adt_ndsbp *out);
int adt_ndsbp_equal(const adt_ndsbp *a, const adt_ndsbp *b);
/* Bit m set when mesh axis m is P. */
unsigned adt_ndsbp_partial_mask(const adt_ndsbp *s);
adt_ndsbp adt_ndsbp_all_b(int mesh_ndim);
/* The block of a tensor of shape `global` held at `coord` (nested block splits, outer first). */
adt_box adt_ndsbp_block(const adt_ndsbp *s, const adt_mesh *m, const int *coord, adt_shape global);
/* The smallest and largest block length of each tensor axis over all coordinates. */
void adt_ndsbp_block_bounds(const adt_ndsbp *s, const adt_mesh *m, adt_shape global, adt_shape *lo,
                            adt_shape *hi);
/* The intersection of two blocks of the same tensor (offsets and shapes of a; empty axes get
 * length 0); returns its element count. out may be NULL. */
int64_t adt_box_overlap(const adt_box *a, const adt_box *b, adt_box *out);
/* Copies the overlap of block sb (contiguous at src) into block db (contiguous at dst), elements
 * of es bytes, row by row; with add, f32 elements are added instead. Blocks that do not overlap
 * leave dst untouched. The one block copy every layout change is made of: boxing steps,
 * checkpoint slices. */
void adt_box_transfer(void *dst, const adt_box *db, const void *src, const adt_box *sb, size_t es, int add);
/* Whether every split axis exists in a tensor of rank `rank` and every block is non-empty. */
int adt_ndsbp_fits(const adt_ndsbp *s, const adt_mesh *m, adt_shape global);
/* Whether every coordinate's block has the same shape (every split divides its axis exactly). */
int adt_ndsbp_even(const adt_ndsbp *s, const adt_mesh *m, adt_shape global);

/* ---- n-D signatures ------------------------------------------------------------------------ */

typedef struct adt_nd_sig {
    int ndim; /* mesh axes */
    adt_ndsbp in[ADT_MAX_INPUTS];
    adt_ndsbp out[ADT_MAX_OUTPUTS];
} adt_nd_sig;

/* The product signature: mesh axis m takes sigs1d[choice[m]]. */
void adt_nd_sig_product(const adt_sbp_sig *sigs1d, const int *choice, int mesh_ndim, int n_in,
                        int n_out, adt_nd_sig *out);
/* The all-B n-D signature (always valid). */
adt_nd_sig adt_nd_sig_all_b(int mesh_ndim, int n_in, int n_out);
/* Products are numbered 0 .. n1d^mesh_ndim - 1 in mixed radix, mesh axis 0 most significant;
 * adt_nd_sig_choice decodes a number into the per-axis choice. */
int64_t adt_nd_sig_count(int n1d, int mesh_ndim);
void adt_nd_sig_choice(int64_t index, int n1d, int mesh_ndim, int *choice);
/* Checks an n-D signature of a global node on a mesh: every block of every input and output
 * non-empty, and the op's shape rule, fed each rank's input blocks and the localised
 * attributes, gives that rank's output blocks. ADT_OK, or ADT_ERR_SHAPE with a message naming
 * the node, the value and the coordinate. */
int adt_nd_sig_check(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m);
/* The usable n-D signatures of a node on a mesh, in product order (all-B first), at most max
 * of them written to out (out may be NULL with max 0); returns how many are usable in all. */
int adt_node_nd_sigs(const adt_graph *g, int node, const adt_mesh *m, adt_nd_sig *out, int max);
/* adt_node_nd_sigs computed once per node structure (op, attributes, operand shapes, dtypes and
 * roles) of one graph on one mesh: repeated layers share the list. Set g and m, zero the rest;
 * the list returned (count in *n) lives until adt_sig_cache_free. Not shared between threads. */
typedef struct adt_sig_cache {
    const adt_graph *g;
    const adt_mesh *m;
    uint64_t *hash; /* 0: empty slot */
    int *rep, *count;  /* count -1: the list not computed yet */
    adt_nd_sig **sigs;
    int *n_ok;         /* signatures adt_sig_cache_valid accepted, per structure */
    adt_nd_sig **ok;
    size_t cap, n;
    int check_only;    /* adt_sig_cache_valid checks as adt_nd_sig_check (no 1-D membership) */
} adt_sig_cache;
const adt_nd_sig *adt_sig_cache_get(adt_sig_cache *sc, int node, int *n);
/* adt_nd_sig_valid(g, node, s, m), remembered per node structure: a signature accepted once for a
 * structure is accepted for every node of it without a new check. */
int adt_sig_cache_valid(adt_sig_cache *sc, int node, const adt_nd_sig *s);
void adt_sig_cache_free(adt_sig_cache *sc);
/* Signature caches by (graph, mesh shape), so that everything planned on one graph and one stage
 * mesh shape (expert plans, the greedy start, the search space) enumerates a structure's
 * signatures once. A zeroed pool is empty; caches live until adt_sig_pool_free. */
typedef struct adt_sig_pool {
    struct adt_sig_pool_entry **e;
    int n, cap;
} adt_sig_pool;
adt_sig_cache *adt_sig_pool_get(adt_sig_pool *p, const adt_graph *g, const adt_mesh *m);
void adt_sig_pool_free(adt_sig_pool *p);
/* "(S(0),B) (B,B) -> (S(0),B)": inputs, then outputs. */
char *adt_nd_sig_str(const adt_nd_sig *s, int n_in, int n_out, char *buf, size_t n);

/* ---- boxing: converting a tensor from one nd-SBP to another ----------------------------------
 * A boxing program is a list of steps; each step changes the SBP of one mesh axis and runs one
 * collective (or a local operation) within every group of ranks that differ only in that
 * axis' coordinate. On a group of n ranks, with G the bytes of the tensor block the group
 * shares (the block cut by every other mesh axis):
 *
 *   kind            from -> to   per rank sends      time
 *   ALL_REDUCE      P -> B       2(n-1)/n G          2(n-1) alpha + 2(n-1)/n G beta
 *   REDUCE_SCATTER  P -> S(k)    (n-1)/n G           (n-1) alpha + (n-1)/n G beta
 *   ALL_GATHER      S(k) -> B    (n-1)/n G           (n-1) alpha + (n-1)/n G beta
 *   ALL_TO_ALL      S(i) -> S(j) (n-1)/n^2 G         (n-1) alpha + (n-1)/n^2 G beta
 *   SLICE           B -> S(k)    0                   local
 *   KEEP_ONE        B -> P       0                   local: coordinate 0 keeps, others zero
 *   ZERO_FILL       S(k) -> P    0                   local: own block in place, zeros around
 *
 * P -> P on the same mesh axis is no step. (Between meshes of different sizes, "P over n ranks
 * to P over m ranks" is not a step of one mesh: it is a P -> B on the source group followed by a
 * B -> P on the destination, or a reduce; cross-mesh transfers are not handled here.)
 *
 * Nested splits: a step on mesh axis a is a plain group collective only when no inner mesh
 * axis b > a splits a tensor axis that the step's from- or to-SBP splits (an inner split of the
 * same tensor axis is cut from a's block, so changing a's block would move data between inner
 * blocks across groups). Such steps are left out of the state graph; the shortest path goes
 * around them (e.g. gather the inner axis first).
 */
typedef enum adt_boxing_kind {
    ADT_BOXING_ALL_REDUCE = 0,
    ADT_BOXING_REDUCE_SCATTER,
    ADT_BOXING_ALL_GATHER,
    ADT_BOXING_ALL_TO_ALL,
    ADT_BOXING_SLICE,
    ADT_BOXING_KEEP_ONE,
    ADT_BOXING_ZERO_FILL,
    ADT_BOXING_KIND_COUNT
} adt_boxing_kind;

const char *adt_boxing_kind_name(int kind);
/* The kind converting one mesh axis from `from` to `to`, or -1 when they are equal. */
int adt_boxing_kind_of(adt_sbp from, adt_sbp to);
/* Whether changing mesh axis `axis` of state s to `to` is a valid step (see above). */
int adt_boxing_step_valid(const adt_ndsbp *s, int axis, adt_sbp to);

/* Link parameters per mesh axis: alpha seconds per message, beta seconds per byte; `local` is
 * the price of a local step (a small tie-breaker so that shorter programs win). */
typedef struct adt_comm_cost {
    double alpha[ADT_MAX_MESH_DIMS];
    double beta[ADT_MAX_MESH_DIMS];
    double local;
} adt_comm_cost;

/* Bytes each rank sends, and the time, of one step kind on a group of n ranks sharing a block
 * of group_bytes (the table above). These are the formulas the planner prices with. */
double adt_boxing_bytes(int kind, int n, double group_bytes);
double adt_boxing_time(int kind, int n, double group_bytes, double alpha, double beta, double local);
/* G of a step on mesh axis `axis` from state s: the bytes of the largest block cut by every
 * mesh axis except `axis`. */
double adt_boxing_group_bytes(const adt_ndsbp *s, int axis, const adt_mesh *m, adt_shape global,
                              size_t elem_size);

#define ADT_BOXING_MAX_STEPS 16

typedef struct adt_boxing_step {
    int mesh_axis;
    int kind;            /* adt_boxing_kind */
    adt_ndsbp from, to;  /* the whole state before and after the step */
    int from_axis;       /* tensor axis split on mesh_axis before the step, or -1 */
    int to_axis;         /* ... and after, or -1 */
    int group_size;      /* ranks in each group: the mesh axis' size */
    double group_bytes;  /* G */
    double bytes;        /* sent per rank */
    double time;         /* seconds, by adt_boxing_time */
} adt_boxing_step;

typedef struct adt_boxing_prog {
    adt_shape global;
    adt_dtype dtype;
    int n_steps;
    adt_boxing_step step[ADT_BOXING_MAX_STEPS];
    double time; /* sum of the steps' times */
} adt_boxing_prog;

/* The cheapest program from `from` to `to` (Dijkstra over the nd-SBP states of the tensor,
 * single-axis valid steps as edges, adt_boxing_time as weights; ties go to the state found
 * first, so the result is deterministic). from == to gives zero steps. The states passed
 * through have non-empty blocks on every rank (unless no such path exists), and hold no P
 * unless the dtype sums (f32: integer ids are never partial). ADT_OK or ADT_ERR_ARG (an nd-SBP
 * that does not fit the tensor's rank or the mesh, or P of a dtype that does not sum). */
int adt_boxing_plan(const adt_mesh *m, adt_shape global, adt_dtype dtype, const adt_ndsbp *from,
                    const adt_ndsbp *to, const adt_comm_cost *cost, adt_boxing_prog *out);
/* Program times cached by (tensor shape, dtype, from, to), for one mesh and one set of link
 * prices (set m and cost, zero the rest, before the first call; adt_boxing_cache_free at the
 * end). Not shared between threads. */
#define ADT_BOXING_NONE 1e30 /* the time of a conversion no program makes */

typedef struct adt_boxing_key {
    adt_shape shape;
    int dtype;
    adt_ndsbp from, to;
} adt_boxing_key;

typedef struct adt_boxing_cached {
    double time;                        /* ADT_BOXING_NONE: no program    */
    double kind[ADT_BOXING_KIND_COUNT]; /* the steps' times by their kind */
} adt_boxing_cached;

typedef struct adt_boxing_cache {
    const adt_mesh *m;
    const adt_comm_cost *cost;
    adt_boxing_key *key;
    adt_boxing_cached *val;
    char *used;
    size_t cap, n;
    struct adt_boxing_prog_table *progs; /* whole programs (adt_boxing_cache_plan), made when asked */
} adt_boxing_cache;

/* The time of the cheapest program converting value v from `from` to `to` (adt_boxing_plan's),
 * 0 when they are equal, ADT_BOXING_NONE when none exists; *kinds (may be NULL) points at the
 * cached entry (its steps' times by kind), valid until the next call. */
double adt_boxing_cache_time(adt_boxing_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                             const adt_boxing_cached **kinds);
/* adt_boxing_plan(m, v's shape and dtype, from, to, cost, out), found programs kept by the same
 * key: a partitioned graph boxes the same conversion once per repeated layer. */
int adt_boxing_cache_plan(adt_boxing_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                          adt_boxing_prog *out);
void adt_boxing_cache_free(adt_boxing_cache *c);
/* One Dijkstra from `from` to every state of the tensor through states whose blocks are all
 * non-empty: to[i] the state, out[i] what adt_boxing_plan(from, to[i]) gives when reached that way
 * (time and times by kind; ADT_BOXING_NONE when not reached: adt_boxing_plan may still find a path
 * through empty blocks). Returns the number of states ((rank+2)^
 * mesh axes), or -1 for a source that does not fit the tensor or is P of a dtype that does not
 * sum. The cache fills itself with it. */
int adt_boxing_plan_all(const adt_mesh *m, adt_shape global, adt_dtype dtype, const adt_ndsbp *from,
                        const adt_comm_cost *cost, adt_ndsbp *to, adt_boxing_cached *out);

/* One line per step: "axis 1: all_gather (S(0),S(1)) -> (S(0),B), G 1024 B, sends 512 B". */
char *adt_boxing_prog_str(const adt_boxing_prog *p, char *buf, size_t n);

/* Runs a program in memory over per-rank buffers: bufs[i] is the block held by mesh position i
 * (contiguous, row-major, elements of p->dtype, in the program's first state); on return it
 * holds the block of the last state (buffers are reallocated with malloc; free them with
 * free()). Refuses invalid steps, and sums (P -> B, P -> S) of anything but f32, with
 * ADT_ERR_ARG. This is the reference the checker holds the comm executor and the kernels to. */
int adt_boxing_run_virtual(const adt_boxing_prog *p, const adt_mesh *m, void **bufs);
/* One rank's part of one step, the building block of both executors: group[j] is the block held
 * before the step by the rank whose coordinate on the step's mesh axis is j (the others equal to
 * coord); out receives this rank's block after the step (sized by the caller). */
int adt_boxing_step_local(const adt_boxing_step *st, const adt_mesh *m, const int *coord, adt_shape global,
                          adt_dtype dtype, const void *const *group, void *out);

/* ---- localisation: one global node on one rank --------------------------------------------- */

typedef struct adt_local_node {
    int node;                               /* the global node                              */
    adt_box in[ADT_MAX_INPUTS];             /* the block of each input this rank holds       */
    adt_box out[ADT_MAX_OUTPUTS];           /* ... and of each output it computes            */
    unsigned in_partial[ADT_MAX_INPUTS];    /* mesh axes (bits) on which an input is P       */
    unsigned out_partial[ADT_MAX_OUTPUTS];
    adt_attrs a;                            /* the attributes of the local node              */
} adt_local_node;

/* What rank `coord` runs for global node `node` under n-D signature s: its input and output
 * blocks and the attributes rewritten for them (the op's localize rule). Does not check the
 * shape rule: adt_nd_sig_check does, once per signature and mesh. */
int adt_dist_localize(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m,
                      const int *coord, adt_local_node *out);
/* Copies a global value into a local graph as a leaf of the same name, dtype, role and init,
 * with the block's shape and its global shape and offset. Returns the local value id or -1. */
int adt_dist_add_local_leaf(adt_graph *lg, const adt_graph *g, int value, const adt_box *b);
/* Adds the local node to `lg`, reading local values in[] (their shapes must be ln->in[i].shape);
 * its outputs get the blocks of ln->out. Returns the local node id, or -1 with the local
 * graph's error set when the shape rule disagrees with the expected blocks. */
int adt_dist_add_local_node(adt_graph *lg, const adt_graph *g, const adt_local_node *ln,
                            const int *in);

/* ---- the partitioner: global graph + plan -> one rank's local graph -------------------------- */

typedef struct adt_dist_plan {
    adt_mesh mesh;
    const adt_nd_sig *node_sig; /* [g->n_nodes]: the n-D signature chosen for every node       */
    /* [g->n_values] or NULL: the layout each leaf (fed input, parameter, optimizer state) is
     * held in. An entry with ndim 0, or every leaf when NULL, takes the layout that reads it
     * first: its in-place updater's (the optimizer step: the stored layout is the updated
     * one) or else its first consumer's, with P read as B. A leaf is never held as P. */
    const adt_ndsbp *leaf_sbp;
    adt_comm_cost cost; /* prices the boxing programs: the numbers the planner used */
    /* 1: an earlier adt_dist_partition of this very plan checked every node's signature (the
     * check is the same at every coordinate), so partitioning at another coordinate skips it */
    int sigs_checked;
} adt_dist_plan;

typedef struct adt_dist_local {
    adt_graph *g;       /* the rank's local graph: compute and boxing nodes in run order     */
    int *value;         /* [global n_values]: the local value holding a global value in the
                           layout its producer wrote (leaves: the held layout), or -1        */
    adt_ndsbp *layout;  /* [global n_values]: that layout                                    */
    int n_boxing;       /* boxing nodes (one per step) in g                                  */
    double boxing_time; /* the predicted time of those steps, summed                         */
    int uneven;         /* some layout or boxing step splits an axis unevenly: the local
                           graphs of other coordinates differ in shape from this one         */
} adt_dist_local;

/* Builds rank `coord`'s local graph: every global node localised under its signature, and on
 * each edge whose producer's layout differs from the consumer's, the cheapest boxing program
 * (one BOXING node per step; a value boxed to a layout once is reused by later readers).
 * Global values marked as outputs stay outputs; parameters keep their names, so initialisation
 * by global index equals the serial one. Errors name the node or value and the layouts. */
int adt_dist_partition(const adt_graph *g, const adt_dist_plan *p, const int *coord, adt_dist_local *out);
void adt_dist_local_free(adt_dist_local *l);

/* The layout leaf v is held in under plan p: its entry in p->leaf_sbp, else that of its in-place
 * updater, else its first reader's with P read as B (see adt_dist_plan). */
adt_ndsbp adt_dist_leaf_layout(const adt_graph *g, const adt_dist_plan *p, int v);

/* The step a BOXING node of a local graph performs (mesh axis sizes from m); what a
 * communicator's run() starts from. */
int adt_boxing_node_step(const adt_graph *lg, const adt_node *n, const adt_mesh *m, adt_boxing_step *st);

/* ---- signatures as text, and the check that a signature is one the op has ---------------------- */

/* Parses the text form of an n-D signature of node `node` ("(S(0),B) (B,S(1)) -> (S(0),S(1))":
 * one nd-SBP per input, "->", one per output; an nd-SBP may hold blanks inside its parentheses),
 * each nd-SBP against its value's rank. ADT_OK or ADT_ERR_ARG saying what was expected. */
int adt_nd_sig_parse(const char *text, const adt_graph *g, int node, int mesh_ndim, adt_nd_sig *out);
/* Whether every mesh axis of s is one of the node's registered 1-D signatures (ops.h) and the
 * product is usable on m (adt_nd_sig_check). ADT_OK, or an error naming the node, the mesh axis
 * and the signature. A shape check alone would let "(S(-1)) (S(0)) -> (B)" through for a matmul
 * whose true output is P. */
int adt_nd_sig_valid(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m);

/* ---- greedy signatures: the seed of expert plans and of the planner ------------------------------
 * Chooses every node's n-D signature in topological (graph) order: among the node's usable
 * signatures on the mesh, the one whose inputs are cheapest to box from the layouts they are in
 * (each value's produced or held layout; a layout a value was already boxed to costs nothing, as
 * the partitioner reuses it), plus its compute time (FLOPs over the product of the mesh axes on
 * which some input or output is split, at flop_rate); ties go to more split outputs, then to the
 * first signature. In-place updates (optimizer steps) must read their state as it is held. */

/* May signature s be chosen for node `node`? `layout` holds the current layout of every value
 * (produced, or held for leaves; ndim 0 while a leaf's layout is still open). */
typedef int (*adt_sig_filter)(void *ctx, const adt_graph *g, int node, const adt_nd_sig *s, const adt_ndsbp *layout);

typedef struct adt_greedy_opts {
    adt_comm_cost cost;   /* prices boxing, as the partitioner will */
    double flop_rate;     /* FLOP/s for the compute term; 0 leaves compute out */
    adt_sig_filter allow; /* NULL: every usable signature. When no signature of a node passes,
                             the node takes the cheapest usable one regardless */
    void *ctx;
    adt_sig_cache *sigs;  /* usable signatures of g on m to share; NULL: enumerated for this call */
    adt_boxing_cache *boxing; /* boxing times on m at `cost` to share; NULL: a cache of its own */
} adt_greedy_opts;

/* leaf_sbp [g->n_values]: the layout of each leaf; entries with ndim 0 are open and are set to
 * the layout their first reader chooses (P read as B). Fills node_sig [g->n_nodes]; returns
 * ADT_OK or an error naming the node that has no usable signature. */
int adt_dist_greedy(const adt_graph *g, const adt_mesh *m, const adt_greedy_opts *o, adt_ndsbp *leaf_sbp,
                    adt_nd_sig *node_sig);

/* ---- plans ---------------------------------------------------------------------------------------
 * A plan is everything a run needs to place a training graph on devices (DESIGN.md section 2):
 *   - the devices: a mesh (shape, a name per axis, the global rank at each coordinate, the
 *     intra-node axis);
 *   - pipeline stages: contiguous ranges of layer tags, stage s running on the slice s of the
 *     mesh along the pipeline axis (the "stage mesh": the mesh without that axis; the whole mesh
 *     when there is no pipeline), and the number of microbatches a step is cut into;
 *   - one n-D signature per node and the layout of every leaf, on the stage mesh;
 *   - what it was made for: the model config, the global batch, the optimizer kind, and the
 *     training graph's node count, value count, layer count and structure checksum (a graph
 *     built from that model at batch / microbatches, with autodiff and that optimizer).
 * Plans are JSON files (docs/formats.md, "Plan files"): adt_plan_parse reads everything but the
 * layouts, which need the graph to be resolved; adt_plan_bind checks the graph and resolves them.
 */
#define ADT_PLAN_AXIS_LEN 16
#define ADT_PLAN_MAX_STAGES 64

typedef struct adt_plan {
    char name[256];       /* the file (or "plan"): every error message starts with it          */
    char strategy[64];    /* how it was made ("dp=2,tp=2"), for people                          */
    adt_model_cfg model;
    int batch;            /* global samples per step                                            */
    int microbatches;     /* a step runs batch / microbatches samples at a time                 */
    adt_optim_kind optim;
    int momentum;         /* SGD with a momentum state                                          */
    adt_mesh mesh;        /* every device; mesh.ranks is owned by the plan                      */
    char axis[ADT_MAX_MESH_DIMS][ADT_PLAN_AXIS_LEN];
    int pp_axis;          /* the mesh axis across pipeline stages, or -1                        */
    int n_stages;
    int stage_first[ADT_PLAN_MAX_STAGES], stage_last[ADT_PLAN_MAX_STAGES]; /* layer tags     */
    int n_nodes, n_values, n_layers; /* the graph's; n_layers = largest layer tag + 1          */
    uint32_t checksum;    /* adt_plan_graph_checksum of the graph                               */
    adt_nd_sig *node_sig; /* [n_nodes], on the stage mesh (NULL until bound)                    */
    adt_ndsbp *leaf_sbp;  /* [n_values]; ndim 0: the partitioner's default                      */
    adt_comm_cost cost;   /* link prices the plan was made with                                  */
    char *pending;        /* parsed, not yet bound layouts (JSON text)                          */
    /* Balanced data parallelism: the local batch of each data-parallel replica (coordinate of
     * the data axis), summing to batch, or NULL: the even block split. Set by the file's
     * "batch_split" or adt_plan_set_batch_split; owned by the plan. */
    int *batch_split;
    int n_batch_split;
    int split_axis;       /* the stage-mesh axis it runs along (adt_plan_data_axis), -1: none   */
    int *split_parts;     /* batch_split / microbatches: the stage meshes' split of the graph's
                             batch (each microbatch cuts every replica's share alike)           */
} adt_plan;

void adt_plan_free(adt_plan *p);
/* A structure checksum of a graph (crc32c over each value's name, dtype, role and shape and each
 * node's op, inputs, outputs, layer tag and pass): equal graphs, equal plans. */
uint32_t adt_plan_graph_checksum(const adt_graph *g);
/* The stage mesh of stage s (the mesh without the pipeline axis, at coordinate s along it);
 * ranks[] (mesh.nranks entries) receives its global ranks and out->ranks points at it. */
int adt_plan_stage_mesh(const adt_plan *p, int stage, adt_mesh *out, int *ranks);
/* Where global rank `rank` sits: its stage and its coordinate on that stage's mesh. */
int adt_plan_locate(const adt_plan *p, int rank, int *stage, int *coord);
/* The stage of a layer tag, or -1. */
int adt_plan_stage_of(const adt_plan *p, int layer_tag);
/* What the partitioner takes for stage s: the stage mesh (ranks in ranks[]), the signatures, the
 * leaf layouts and the costs. */
adt_dist_plan adt_plan_dist(const adt_plan *p, int stage, int *ranks);
/* The training graph a plan is made for: the model at batch / microbatches, autodiff, and the
 * optimizer oc (NULL: the plan's kind with default hyperparameters; else its kind must be the
 * plan's). The caller frees *out. */
int adt_plan_build_graph(const adt_plan *p, const adt_optim_cfg *oc, adt_graph **out);
/* Checks that a model config and global batch are the ones the plan was made for; the message
 * names the first field that differs. */
int adt_plan_check_model(const adt_plan *p, const adt_model_cfg *c, int batch);
/* Checks what a plan says on its own: the ranks are a permutation of 0..N-1, the intra-node and
 * pipeline axes exist, the stages are one per coordinate of the pipeline axis and cover the
 * layers 0..n_layers-1 in order with non-empty ranges. */
int adt_plan_check(const adt_plan *p);
/* Checks a bound plan against a graph: the graph's counts and checksum, the mesh and stages,
 * every signature registered and usable on the stage mesh, every leaf layout B or S with
 * non-empty blocks, and every in-place update reading its state as held. */
int adt_plan_validate(const adt_plan *p, const adt_graph *g);

/* The stage-mesh axis along which the plan splits the batch: the one mesh axis on which the fed
 * inputs (data and labels: fed leaves other than lr and step whose axis 0 is the graph's batch)
 * are held split on axis 0 (S(0)), in their leaf layouts or, where a plan leaves a leaf's layout
 * open, as their first reader reads them. g is the plan's graph. ADT_OK with *axis, or
 * ADT_ERR_ARG naming the input: none split on the batch (no data-parallel axis), or split on
 * more than one axis, or on different axes. */
int adt_plan_data_axis(const adt_plan *p, const adt_graph *g, int *axis);
/* Balanced data parallelism as an uneven S(0) split: replica c of the data axis takes sizes[c]
 * samples of each global batch (sizes NULL or n 0: back to the even split). Checks, naming the
 * field "batch_split": the plan is bound to g (its graph), it has a data axis, n is that axis'
 * size, every size is >= 1 and a multiple of the microbatches (each microbatch gives replica c
 * sizes[c] / microbatches samples), the sizes sum to the batch; then that every signature still
 * fits every block (adt_plan_validate). On an error the plan keeps its split. Every block split
 * over the data axis whose length the graph's batch divides follows the split (adt_mesh_cut):
 * inputs, labels, activations and their gradients, and also a parameter or optimizer state held
 * split over that axis (ZeRO) whose split axis the batch divides. Meshes made by
 * adt_plan_stage_mesh / adt_plan_dist point into the plan: make them again after a change. */
int adt_plan_set_batch_split(adt_plan *p, const adt_graph *g, const int *sizes, int n);

/* Plan files. parse: the JSON text of a plan (name_for_errors starts every message); load: the
 * same from a file; bind: resolves the layouts of a parsed plan against the graph (which must be
 * the one adt_plan_build_graph gives), then validates; to_json / save: the file form of a bound
 * plan (layers with the same structure and the same layouts are written once). */
int adt_plan_parse(adt_plan *p, const char *json_text, const char *name_for_errors);
int adt_plan_load(adt_plan *p, const char *path);
int adt_plan_bind(adt_plan *p, const adt_graph *g);
char *adt_plan_to_json(const adt_plan *p, const adt_graph *g); /* free() it */
int adt_plan_save(const adt_plan *p, const adt_graph *g, const char *path);

/* A parameter-server plan (plan_ps.c): a DLRM's tables on `servers` ranks, the dense part on the
 * other devices - servers workers; what `adtrain train --plan` runs as --mode ps. read: *is_ps 1
 * and the plan read when the file's "mode" is "ps", else *is_ps 0 and nothing read (a collective
 * plan, for adt_plan_load); a bad ps plan is an error naming the field. */
typedef struct adt_ps_plan {
    char name[256];
    adt_model_cfg model;
    int batch, devices, servers, prefetch, dense_servers;
    char sync[32]; /* as --ps-sync: sync, ssp:K or async */
} adt_ps_plan;
int adt_ps_plan_read(const char *path, adt_ps_plan *p, int *is_ps);
/* The same from the file's text (path names it in errors). */
int adt_ps_plan_parse(adt_ps_plan *p, const char *text, const char *path, int *is_ps);
int adt_ps_plan_save(const adt_ps_plan *p, const char *path);
/* group_of[t] (n_layers entries): the first layer with layer t's structure and layouts (t itself
 * when none before it has them); the file ties such layers into one entry. */
void adt_plan_layer_groups(const adt_plan *p, const adt_graph *g, int *group_of);

/* ---- expert plans ----------------------------------------------------------------------------------
 * Strategies (src/dist/README.md): a comma-separated list of
 *   dp[=N]   data parallel: the batch split, parameters and optimizer state replicated
 *   zero     with dp: optimizer state, its update and the stored weights split over the dp axis
 *   tp[=N]   tensor (Megatron) parallel: column/row-split weights per model family
 *   pp[=N]   pipeline: contiguous stages of layer tags balanced by FLOPs
 * At most one degree may be left out: it takes what the device count leaves. The mesh axes are
 * "pp", "dp", "tp" in that order (those asked for; tp, else dp, is the intra-node axis). */
typedef struct adt_strategy {
    int dp, tp, pp; /* degrees, 1 when not asked for */
    int zero;
} adt_strategy;

int adt_strategy_parse(const char *text, int devices, adt_strategy *out);

typedef struct adt_expert_opts {
    const char *strategy;
    int devices;
    int batch;        /* global batch; the graph is built at batch / microbatches */
    int microbatches; /* 0 or 1: none */
    adt_comm_cost cost; /* all zero: adt_comm_cost_default() */
    double flop_rate;   /* 0: 1e11 FLOP/s */
    adt_sig_pool *sigs; /* signatures to share with other plans of the same graph; NULL: none */
} adt_expert_opts;

/* Link prices for planning without a calibrated cluster: 10 us and 10 GB/s per mesh axis, the
 * intra-node axis 2 us and 50 GB/s. */
adt_comm_cost adt_comm_cost_default(const adt_mesh *m);

/* Makes the plan of a strategy for the training graph g of model c (built at batch /
 * microbatches). Refuses, naming the reason, a strategy that cannot apply: degrees that do not
 * multiply to the device count, a batch that does not split over dp and the microbatches, more
 * stages than layers, zero without a dp axis of 2 or more. */
int adt_expert_plan(const adt_graph *g, const adt_model_cfg *c, const adt_expert_opts *o, adt_plan *out);
/* Layers 0..L-1 of weights w[] into p contiguous non-empty stages (p <= L) minimising the largest
 * stage's sum (exact, dynamic programming): stage s holds layers first[s]..last[s]. */
void adt_stage_cut(const double *w, int L, int p, int *first, int *last);

/* ---- pipeline stages -------------------------------------------------------------------------------
 * Stage s of a plan runs the nodes whose layer tag its range holds (forward, backward, and the
 * updates of its parameters). adt_pipe_stage_build makes that part of the global training graph
 * (the plan's graph, built at batch / microbatches) a graph of its own, still in the global view:
 * its leaves are the parameters, states and fed inputs its nodes read, plus one fed leaf (role
 * INPUT, the global value's name) per value another stage makes: a link. Values it makes that
 * other stages read are marked outputs (alive to the end of a step, to be sent). Partition it with
 * adt_pipe_stage_dist for a coordinate of the stage mesh: all stage meshes have the same shape,
 * and a link's leaf is held in the layout its producer makes it in, partial sums reduced first
 * (adt_pipe_sent_layout), so the rank at coordinate c of one stage sends its block to the rank at
 * c of the other as it is.
 * A parameter read on several stages (tied) is held by each; each holder updates its copy from
 * its own contribution to the gradient, after the runtime has summed the contributions across the
 * holders (src/dist/README.md, "Pipeline stages"). */
typedef struct adt_pipe_link {
    int value;      /* the global value                                                     */
    int from, to;   /* producing and reading stage                                          */
    int send_phase; /* 0 forward, 1 backward: the pass after which the producer sends it     */
    int recv_phase; /* the pass before which the reader needs it                             */
    int tag;        /* the link's index among all of the plan's: the message tag              */
    int local;      /* this stage's value: what it sends, or the fed leaf it receives into    */
} adt_pipe_link;

typedef struct adt_pipe_tied {
    int param;        /* the global parameter                                               */
    int grad;         /* the global value of this stage's contribution to its gradient, or -1
                         when this stage does not hold it                                   */
    int read;         /* the stage graph's value its update reads as the gradient: the
                         contribution, or its conversion to the update's layout when the
                         holders make theirs in different layouts (a backward node "tied.*");
                         summed over the holders before the update. -1: not held          */
    uint64_t holders; /* bit s: stage s holds the parameter                                  */
} adt_pipe_tied;

typedef struct adt_pipe_stage {
    int stage, n_stages;
    adt_graph *g;          /* the stage's graph                                                */
    int n_nodes;
    int *node_of;          /* [g->n_nodes] the global node each of its nodes copies, -1 for the
                              conversion of a tied contribution                                 */
    int *local_of;         /* [global n_values] the stage's value of a global value, or -1      */
    adt_pipe_link *links;  /* the links from or to this stage, in the plan-wide order           */
    int n_links;
    adt_pipe_tied *tied;   /* the plan's tied parameters (the same list on every stage)          */
    int n_tied;
    adt_nd_sig *node_sig;  /* [g->n_nodes] the plan's signatures                                */
    adt_ndsbp *leaf_sbp;   /* [g->n_values] the plan's leaf layouts; links as made              */
} adt_pipe_stage;

int adt_pipe_stage_build(const adt_graph *g, const adt_plan *p, int stage, adt_pipe_stage *out);
void adt_pipe_stage_free(adt_pipe_stage *st);
/* The layout a link is sent and held in: the one it is made in with P read as B (the maker sums
 * partial sums over the stage mesh before sending). */
adt_ndsbp adt_pipe_sent_layout(const adt_ndsbp *made);
/* What the partitioner takes for the stage graph: the stage mesh (ranks[]), its layouts. */
adt_dist_plan adt_pipe_stage_dist(const adt_pipe_stage *st, const adt_plan *p, int *ranks);

/* One step of a stage's pipeline schedule: the forward (backward = 0) or backward pass of a
 * microbatch. */
typedef struct adt_pipe_op {
    int backward, microbatch;
} adt_pipe_op;
/* The 1F1B order of stage `stage` of n_stages over M microbatches into ops[2M]: min(S-1-s, M)
 * forwards (warmup), then one forward and one backward at a time, then the backwards left; at
 * most S-s microbatches are in flight on stage s. Returns 2M. */
int adt_pipe_1f1b(int n_stages, int stage, int microbatches, adt_pipe_op *ops);

#ifdef __cplusplus
}
#endif
#endif
