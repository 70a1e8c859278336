/*
 * adtrain/exec.h - the liveness memory plan and the executor of a (local) training graph.
 *
 * The executor runs any graph: the serial training graph, or one rank's local graph made by the
 * partitioner. It knows nothing of meshes; communication ops (later) are ops like any other.
 *
 * Memory: persistent values (parameters, optimizer state) and fed values (inputs, labels, lr,
 * step) live in one "state" block, for the life of the executor. Every other value (activations,
 * gradients) gets an offset in one "arena", planned once from the node order: a buffer is reused
 * as soon as its last reader has run. Views (reshape) and in-place updates share their base's
 * storage and extend its lifetime.
 */
#ifndef ADTRAIN_EXEC_H
#define ADTRAIN_EXEC_H

#include <stdint.h>

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
} adt_memplan;

/* Plans the arena for `order` (node ids, n of them; NULL = 0..n_nodes-1). no_reuse = 1 gives
 * every value its own buffer (a debugging aid and the test's yardstick). */
int adt_memplan_build(adt_memplan *mp, const adt_graph *g, const int *order, int n, int no_reuse);
void adt_memplan_free(adt_memplan *mp);

typedef struct adt_exec_opts {
    int threads;   /* OpenBLAS threads; 0 keeps the library's setting */
    uint64_t seed; /* parameter initialisation and dropout             */
    int no_reuse;  /* see adt_memplan_build                            */
    int profile;   /* accumulate per-node times                       */
    const adt_comm_hook *comm; /* runs communication (boxing) nodes; required when the graph
                                  has any, and must outlive the executor */
} adt_exec_opts;

typedef struct adt_exec adt_exec;

/* Plans memory and allocates. The graph must stay alive and unchanged while the executor is. */
int adt_exec_create(adt_exec **out, const adt_graph *g, const adt_exec_opts *opts);
void adt_exec_free(adt_exec *ex);

/* Storage of a value: persistent and fed values are valid at any time; others only between a
 * run and the next (and only while live: use adt_graph_mark_output before creating the executor
 * for values you want to read afterwards). */
void *adt_exec_data(adt_exec *ex, int value);
float *adt_exec_f32(adt_exec *ex, const char *name); /* by name; NULL if absent */

/* Initialises every PARAM from its init spec and zeroes optimizer state (deterministic in the
 * seed, the parameter's name and the element's global index). */
int adt_exec_init_params(adt_exec *ex);

/* Sets the "lr" and "step" inputs if the graph has them. */
void adt_exec_set_lr_step(adt_exec *ex, float lr, int32_t step);

/* Runs the whole step (forward, backward, update), or the forward nodes only (evaluation: no
 * parameter changes, dropout off). A forward-only run reuses the arena: gradients of the last
 * step are overwritten. */
int adt_exec_run(adt_exec *ex);
int adt_exec_run_forward(adt_exec *ex);
/* The forward nodes with dropout as in training (gradient checks need the training function). */
int adt_exec_run_forward_mode(adt_exec *ex, int training);

const adt_memplan *adt_exec_memplan(const adt_exec *ex);
/* Per-node accumulated seconds when opts.profile was set (indexed by node id). */
const double *adt_exec_node_seconds(const adt_exec *ex);

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
