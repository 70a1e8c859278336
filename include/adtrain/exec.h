/*
 * adtrain/exec.h - the liveness memory plan and the executor of a (local) training graph.
 *
 * The executor runs any graph: the serial training graph, or one rank's local graph made by the
 * partitioner. The executor itself knows nothing of meshes: communication nodes go to a hook.
 *
 * Memory: persistent values (parameters, optimizer state) and fed values (inputs, labels, lr,
 * step) live in one "state" block, for the life of the executor. Every other value (activations,
 * gradients) gets an offset in one "arena", planned once from the node order: a buffer is reused
 * as soon as its last reader has run. Views (reshape) and in-place updates share their base's
 * storage and extend its lifetime.
 *
 * Communication: a partitioned graph's BOXING nodes run through the hook in adt_exec_opts.comm.
 * When the hook has the split form (start / test / finish, ops.h) the executor overlaps them
 * with computation: a collective is started as soon as its input is ready (right after the node
 * that produces it; a gradient's all-reduce starts while the rest of the backward pass runs) and
 * waited for only just before the first node that reads its result, or that updates its input in
 * place; between nodes the executor polls the oldest collective in flight, since MPI moves data
 * only inside MPI calls. The schedule (start, run, wait events) is fixed when the executor is
 * created and is the same on every rank, so collectives start in the same order everywhere. The
 * memory plan is made for that schedule: a collective's input and output buffers stay allocated
 * from its start to its wait. Two restraints keep memory bounded: a collective whose input is a
 * leaf (a parameter or a fed input) starts where the partitioner placed it, and one that carries
 * a forward value into the backward pass or the update is not moved into the forward pass.
 * Optimizer updates, which are independent of one another, run in the order their gradients'
 * collectives were started, so the update whose gradient arrived first goes first. A hook that
 * allows it (inplace_allreduce) gets an all-reduce's input buffer as its output when nothing
 * else reads the input (a partial gradient): no copy, one buffer.
 * The module also holds the MPI implementation of the hook (adt_mesh_comm, below).
 */
#ifndef ADTRAIN_EXEC_H
#define ADTRAIN_EXEC_H

#include <stdint.h>

#include "adtrain/comm.h"
#include "adtrain/dist.h"
#include "adtrain/graph.h"
#include "adtrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The memory plan of a graph for a given node order. */
typedef struct adt_memplan {
    int n_values;
    int64_t *offset;   /* [n_values] byte offset in the arena, or -1 (state or alias)      */
    int64_t *state_offset; /* [n_values] byte offset in the state block of a persistent or
                              fed root, or -1                                               */
    int *first, *last; /* [n_values] live interval in order positions (inclusive), -1 if none */
    int *root;         /* [n_values] the value that owns the storage (itself unless a view) */
    int64_t arena_bytes;   /* peak: the arena size                                          */
    int64_t noreuse_bytes; /* what the arena would take if nothing were reused              */
    int64_t state_bytes;   /* persistent + fed values                                       */
    int64_t scratch_bytes; /* the largest scratch any single node asks for                  */
    int64_t accum_bytes;   /* microbatch slots: the gradients' accumulators (0 without slots) */
} adt_memplan;

/* Plans the arena for `order` (node ids, n of them; NULL = 0..n_nodes-1). no_reuse = 1 gives
 * every value its own buffer (a debugging aid and the test's yardstick). */
int adt_memplan_build(adt_memplan *mp, const adt_graph *g, const int *order, int n, int no_reuse);
/* The same for a schedule in which node order[p] keeps reading its inputs and writing its outputs
 * up to position read_until[p] (>= p; n = to the end of the step): an asynchronous collective
 * started at p and waited for just before position read_until[p]. NULL: every node at its own
 * position. share[v] >= 0 (share may be NULL) puts value v in value share[v]'s storage, the way
 * views are: one root, one lifetime. */
int adt_memplan_build_sched(adt_memplan *mp, const adt_graph *g, const int *order, int n, int no_reuse,
                            const int *read_until, const int *share);
void adt_memplan_free(adt_memplan *mp);

typedef struct adt_exec_opts {
    int threads;   /* OpenBLAS threads; 0 keeps the library's setting */
    uint64_t seed; /* parameter initialisation and dropout             */
    int no_reuse;  /* see adt_memplan_build                            */
    int profile;   /* accumulate per-node times                       */
    const adt_comm_hook *comm; /* runs communication (boxing) nodes; required when the graph
                                  has any, and must outlive the executor */
    int comm_sync; /* run every communication node to completion where it stands: no overlap
                      (the yardstick for how much the overlap hides) */
    int microbatch_slots; /* > 0: this many activation sets, passes run apart (see below) */
    /* Called after each node a run performs where it stands (not a collective started and
     * waited for apart), in run order, with the node's id, also for a node a fusion made another
     * node do (at its own place): its outputs are written. Lets a caller use a value (a
     * gradient) the moment it is final, e.g. start its collective. NULL: none. Not called by
     * microbatch slots' passes. */
    void (*after_node)(void *ctx, int node);
    void *after_ctx;
} adt_exec_opts;

/* What the runs spent on communication. Per collective, "in flight" is the time from the return
 * of its start to its completion as the executor saw it (a poll between nodes, or the end of its
 * wait); the part of it not spent blocked in a wait ran behind computation. So the fraction of
 * communication hidden is 1 - comm_wait_s / comm_flight_s; a run with comm_sync has none hidden.
 * (Completion is seen only between nodes, so flight time can exceed the transfer itself; the
 * blocked time is exact.) */
typedef struct adt_exec_stats {
    int64_t runs;         /* adt_exec_run* calls counted                                   */
    int64_t comm_ops;     /* communication nodes performed                                 */
    double run_s;         /* wall time inside the runs                                     */
    double comm_start_s;  /* inside the hook's start (packing, posting)                    */
    double comm_poll_s;   /* polling between nodes                                         */
    double comm_wait_s;   /* blocked in waits (and blocking runs), unpacking included      */
    double comm_flight_s; /* summed start-to-completion spans                              */
} adt_exec_stats;

typedef struct adt_exec adt_exec;

/* Plans memory and allocates. The graph must stay alive and unchanged while the executor is. */
int adt_exec_create(adt_exec **out, const adt_graph *g, const adt_exec_opts *opts);
/* The memory plan adt_exec_create would make for g under opts (its node order, in-place
 * all-reduces, microbatch slots), without allocating or running anything: what a planner
 * predicts a rank's executor will hold. opts->comm's functions are looked at, never called, so a
 * caller planning ahead may pass stubs. The caller frees *out with adt_memplan_free. */
int adt_exec_plan_memory(const adt_graph *g, const adt_exec_opts *opts, adt_memplan *out);
void adt_exec_free(adt_exec *ex);

/* Storage of a value: persistent and fed values are valid at any time; others only between a
 * run and the next (and only while live: use adt_graph_mark_output before creating the executor
 * for values you want to read afterwards). */
void *adt_exec_data(adt_exec *ex, int value);
float *adt_exec_f32(adt_exec *ex, const char *name); /* by name; NULL if absent */
/* Puts persistent or fed value v (and every view of it) in caller-owned storage p of v's size
 * instead of the executor's own, until bound again; p must stay valid while the executor runs.
 * Two executors bound to one parameter's storage share it: what one updates the other reads, with
 * no copy. Not with microbatch slots (an error). */
int adt_exec_bind(adt_exec *ex, int value, void *p);

/* Initialises every PARAM from its init spec and zeroes optimizer state (deterministic in the
 * seed, the parameter's name and the element's global index). */
int adt_exec_init_params(adt_exec *ex);

/* Sets the "lr" and "step" inputs if the graph has them. */
void adt_exec_set_lr_step(adt_exec *ex, float lr, int32_t step);

/* Runs the whole step (forward, backward, update), or the forward nodes only (evaluation: no
 * parameter changes, dropout off). A forward-only run reuses the arena: gradients of the last
 * step are overwritten. Returns ADT_OK, or the error a communication node reported (a timeout,
 * a broken communicator): then collectives may be left in flight and the ranks out of step, so
 * the caller should end the world rather than run again. */
int adt_exec_run(adt_exec *ex);
int adt_exec_run_forward(adt_exec *ex);
/* The forward nodes with dropout as in training (gradient checks need the training function). */
int adt_exec_run_forward_mode(adt_exec *ex, int training);

/* ---- microbatches: the passes apart, gradients accumulated ------------------------------------
 * With opts.microbatch_slots = K > 0 the executor holds K activation sets ("slots"), each its own
 * arena and its own copy of the fed values (lr and step excepted: one per step), all sharing one
 * block of parameters and optimizer state. A microbatch runs its forward pass in a slot, later its
 * backward pass in the same slot, and other microbatches may run in other slots in between (a
 * pipeline keeps up to K in flight). Each backward pass adds the gradients the update reads (the
 * values backward nodes make and optimizer nodes, or the communication before them, read) into one
 * accumulator each; adt_exec_run_update scales them by 1 / (passes accumulated), since each
 * microbatch's loss is the mean over its own samples, and runs the update nodes once. Nodes run
 * in pass order (forward, backward, update; graph order within each), communication where it
 * stands (no overlap), and no gradient is folded into its update. adt_exec_run is then one
 * microbatch in slot 0 and its update; adt_exec_run_forward* the forward pass in slot 0. */
/* pass 0: forward (training: dropout on), 1: backward (accumulates), 2: forward for evaluation. */
int adt_exec_run_pass(adt_exec *ex, int slot, int pass);
int adt_exec_run_update(adt_exec *ex);
/* The passes that follow run microbatch m of the step (0 at creation): dropout then draws the
 * mask of rows [m B, (m+1) B) of the whole batch, as the serial run of the whole batch does
 * (adt_kctx.microbatch). */
void adt_exec_set_microbatch(adt_exec *ex, int microbatch);
/* A value's storage in a slot (fed values and activations differ per slot; without slots, slot 0
 * is adt_exec_data). NULL when out of range. */
void *adt_exec_slot_data(adt_exec *ex, int slot, int value);
/* The accumulator holding the sum of gradient value v over the backward passes since the last
 * update (f32, v's shape), or NULL when v is not one the update reads. A caller may change it
 * before adt_exec_run_update (a pipeline sums a tied parameter's holders there). */
float *adt_exec_grad_acc(adt_exec *ex, int value);
/* What a backward pass does with each gradient the update reads: acc = x on the step's first
 * pass (first != 0), acc += x after it. adtrain calibrate times this loop for the cost model's
 * price of accumulation (device.accumulate). */
void adt_exec_accumulate(float *acc, const float *x, int64_t n, int first);

const adt_memplan *adt_exec_memplan(const adt_exec *ex);
/* Communication counters of the last run and of all runs so far (either pointer may be NULL). */
void adt_exec_get_stats(const adt_exec *ex, adt_exec_stats *last, adt_exec_stats *total);
void adt_exec_reset_stats(adt_exec *ex);
/* Whether communication nodes run split (started early, waited for late) in this executor. */
int adt_exec_overlaps(const adt_exec *ex);
/* The split schedule, one event per line: "start <node> <name>", "run <node> <name>" or
 * "wait <node> <name>"; NULL when the executor does not split. The caller frees it. */
char *adt_exec_schedule_str(const adt_exec *ex);
/* Per-node accumulated seconds when opts.profile was set (indexed by node id; a collective split
 * in two: its start and its wait). adt_exec_reset_stats zeroes them too. */
const double *adt_exec_node_seconds(const adt_exec *ex);
/* The graph the executor runs. */
const adt_graph *adt_exec_graph(const adt_exec *ex);
/* Whether matmul node `node` runs as an accumulating product in this executor (adt_gemm with
 * beta = 1: onto its folded bias rows, or into its SGD momentum buffer), not as a plain one. */
int adt_exec_matmul_accumulates(const adt_exec *ex, int node);

/* ---- a partitioned graph over a communicator ---------------------------------------------------
 * adt_mesh_comm: this rank's place in a device mesh, the communicator along each mesh axis
 * (adt_comm_mesh_axis), and the hook that runs BOXING nodes over them. Each step kind becomes
 * the collective of that kind within the step's group (the ranks that differ only in the step's
 * mesh axis) on the local blocks, exactly as adt_boxing_step_local defines what every rank holds
 * before and after: all_reduce (in place on the output), reduce_scatter and all_gather with the
 * counts of uneven blocks, all_to_all with per-peer counts, the local kinds (slice, keep_one,
 * zero_fill) without communication. Sub-blocks that are not contiguous in a rank's block are
 * packed into a staging buffer before the send and placed after the receive (adt_box_transfer);
 * contiguous ones go straight from the input or into the output. Staging buffers belong to the
 * node and are kept from step to step.
 */
typedef struct adt_mesh_comm adt_mesh_comm;

/* Collective over `world`: the mesh must have exactly as many ranks as the world (mesh->ranks
 * NULL: world rank i is mesh position i). Creates one sub-communicator per mesh axis. */
int adt_mesh_comm_create(adt_mesh_comm **out, adt_comm *world, const adt_mesh *mesh);
/* Frees the sub-communicators and every hook (no collective may be in flight). NULL: no-op. */
int adt_mesh_comm_free(adt_mesh_comm *mc);
adt_comm *adt_mesh_comm_world(const adt_mesh_comm *mc);
const adt_mesh *adt_mesh_comm_mesh(const adt_mesh_comm *mc);
/* This rank's coordinate in the mesh. */
const int *adt_mesh_comm_coord(const adt_mesh_comm *mc);
/* The hook (with the split form) for the BOXING nodes of local graph lg, partitioned for this
 * rank's coordinate; the same lg gives the same hook. It holds per-node state: release it
 * (adt_mesh_comm_release) before lg is freed if another graph may later take its address. */
const adt_comm_hook *adt_mesh_comm_hook(adt_mesh_comm *mc, const adt_graph *lg);
void adt_mesh_comm_release(adt_mesh_comm *mc, const adt_graph *lg);
/* One boxing step on this rank's block, blocking: `in` is its block of st->from (shape by
 * adt_ndsbp_block), `out` receives its block of st->to. What the hook does for a BOXING node. */
int adt_mesh_comm_step(adt_mesh_comm *mc, const adt_boxing_step *st, adt_shape global, adt_dtype dt,
                       const void *in, void *out);
/* Collective over the world: the logical tensor of a value held as `layout` (each rank passes
 * its block) lands whole in `full` on every rank; P parts are summed (f32), each replica counted
 * once. For reading the loss, metrics and results; not for the training step itself. */
int adt_mesh_comm_gather(adt_mesh_comm *mc, const adt_ndsbp *layout, adt_shape global, adt_dtype dt,
                         const void *block, void *full);
/* Collectives performed through this mesh comm, and the bytes this rank sent by the cost model's
 * count (adt_boxing_bytes), since creation. */
void adt_mesh_comm_counts(const adt_mesh_comm *mc, int64_t *ops, double *bytes);

/* ---- pipeline stages over a communicator -----------------------------------------------------
 * adt_pipe: this rank's pipeline stage of a plan with several stages (adt_pipe_stage_build,
 * dist.h), partitioned for its stage-mesh coordinate and run by an executor with microbatch slots
 * (min(S - s, M) on stage s of S, M microbatches) in the 1F1B order (adt_pipe_1f1b). Values that
 * cross stages go by point-to-point messages between the ranks at the same stage-mesh coordinate
 * (sent non-blocking from a staging copy, received blocking before the pass that reads them,
 * both bounded by the world's timeout); boxing within a stage runs over the stage's
 * communicators (adt_mesh_comm). A step accumulates the M microbatches' gradients, sums each tied
 * parameter's gradient over the stages holding it (an all-reduce among the ranks at the same
 * coordinate of those stages), and updates once. The graph is the plan's training graph (built at
 * batch / M, adt_plan_build_graph), and must outlive the pipe, as must the plan and the world.
 */
typedef struct adt_pipe adt_pipe;
/* Collective over world, whose size must be the plan's device count (a bound plan). */
int adt_pipe_create(adt_pipe **out, adt_comm *world, const adt_plan *p, const adt_graph *g, const adt_exec_opts *opts);
void adt_pipe_free(adt_pipe *pp);
/* Writes microbatch mb's fed inputs this stage holds (adt_pipe_value gives where); 0 or an error. */
typedef int (*adt_pipe_fill_fn)(void *ctx, adt_pipe *pp, int microbatch);
/* One training step over all microbatches; *loss (may be NULL) = the mean of the microbatch
 * losses, on every rank. Collective over the world. */
int adt_pipe_step(adt_pipe *pp, adt_pipe_fill_fn fill, void *ctx, double *loss);
/* The forward passes only (evaluation: dropout off, parameters unchanged); *loss as above.
 * read (may be NULL) is called after each microbatch's forward pass, while its outputs (logits,
 * say) are in its slot. */
int adt_pipe_forward(adt_pipe *pp, adt_pipe_fill_fn fill, adt_pipe_fill_fn read, void *ctx, double *loss);
/* This rank's storage of global value v of the plan's graph for microbatch mb (its slot), and its
 * block of v (may be NULL); NULL when this stage holds no v. Persistent values are the same in
 * every slot. */
void *adt_pipe_value(adt_pipe *pp, int microbatch, int v, adt_box *block);
adt_exec *adt_pipe_exec(adt_pipe *pp);
int adt_pipe_stage_index(const adt_pipe *pp);
int adt_pipe_slot(const adt_pipe *pp, int microbatch);
const adt_pipe_stage *adt_pipe_stage_info(const adt_pipe *pp);
/* The stage graph's partition: value[] and layout[] are indexed by the stage graph's values
 * (adt_pipe_stage_info(pp)->local_of maps global values to those). */
const adt_dist_local *adt_pipe_local(const adt_pipe *pp);
adt_mesh_comm *adt_pipe_mesh_comm(adt_pipe *pp);
/* After adt_plan_set_batch_split changed the plan's split (between steps): makes the stage's
 * partition, communicators and executor again for it (the options given at creation) and carries
 * the persistent state over (adt_dist_move_state); *pp is then the new pipe, the old one freed.
 * On an error *pp is unchanged. Collective over the world. */
int adt_pipe_rebuild(adt_pipe **pp);

/* ---- a new batch split between steps (balanced data parallelism) ------------------------------
 * A batch split (adt_plan_set_batch_split) fixes the local shapes of every batch-split value, so
 * changing it remakes a rank's local graph and executor; the persistent state goes along.
 *
 * adt_dist_move_state: every persistent value (parameters, optimizer state) of global graph g
 * held by both local graphs, from from_ex (local graph `from`, partitioned on from_mc's mesh) to
 * to_ex (local graph `to`, partitioned on to_mesh: the same mesh and layouts, another batch
 * split): copied when no coordinate's block changes, else gathered whole over from_mc and cut
 * for to_mesh. Collective over from_mc's mesh (every rank calls it with the same graphs).
 *
 * adt_dist_rebuild: for a plan run without stages or microbatches, as a trainer holds it (its
 * local graph *loc, communicators *mc and executor *ex, made from an earlier adt_plan_dist of
 * the same plan): partitions g for p (the plan's new adt_plan_dist) at *mc's coordinate, makes
 * new communicators and an executor (opts, with its comm hook replaced), moves the state, then
 * frees the old three and puts the new ones in their place. On an error the old ones are kept.
 * Fed inputs, lr and step are not carried: the caller feeds them every step, as before. */
int adt_dist_move_state(const adt_graph *g, adt_mesh_comm *from_mc, const adt_dist_local *from, adt_exec *from_ex,
                        const adt_mesh *to_mesh, const adt_dist_local *to, adt_exec *to_ex);
int adt_dist_rebuild(adt_comm *world, const adt_graph *g, const adt_dist_plan *p, const adt_exec_opts *opts,
                     adt_dist_local *loc, adt_mesh_comm **mc, adt_exec **ex);

/* OpenBLAS picks its kernels when it loads, from the CPU model; on a CPU newer than the
 * library it falls back to SSE3 kernels. Call first thing in main(): if that happened, the
 * process re-executes itself with OPENBLAS_CORETYPE set to the best family the CPU runs (once;
 * a user's own OPENBLAS_CORETYPE always wins). */
void adt_blas_fix_coretype(char **argv);
const char *adt_blas_core_name(void); /* the kernel family OpenBLAS is running */

#ifdef __cplusplus
}
#endif
#endif
