/*
 * adtrain/straggler.h - straggler Monitor and Controller: per-rank step timings in, a
 * classification (normal / transient / persistent straggler) and mitigation decisions out.
 *
 * No I/O and no communication: the trainer (or the master) feeds every rank's timings of a step
 * to one monitor, so every place that runs one sees the same decisions.
 *
 * Signal. Per rank and step: the compute seconds (wall time of the step minus the time blocked in
 * collectives) and the samples it processed; the per-sample time t_i = compute / samples is what
 * is compared, since after a rebalance the step times are equal by design while the per-sample
 * times still show who is slow. A rank's observation is "slow" when t_i > k * median of the other
 * ranks' t (k per phase; the first steps, evaluation and checkpoint steps are not judged).
 *
 * Classification with hysteresis: a rank turns transient at its first slow observation, persistent
 * after `persist_after` consecutive slow ones, and back to normal only after `clear_after`
 * consecutive normal ones. Speeds are smoothed per rank with an EWMA of the per-sample time whose
 * inputs are clipped to [1/clip, clip] x the current estimate, so one long pause barely moves it;
 * a rank that turns persistent restarts its estimate from its recent observations.
 *
 * Controller. Policies: off (never acts), DD (dedicated clusters, heterogeneous hardware:
 * rebalance the data-parallel local batches in proportion to speed) and ND (non-dedicated
 * clusters, contention: the same over a shorter window, so transient slowness is absorbed
 * quickly; and a persistent straggler is restarted elsewhere / its host left out only when the
 * gain over the remaining run exceeds the measured restart cost). Both look at each rank's
 * median per-sample time over the last `dd_after` (DD) or `nd_after` (ND) steps, so a minority
 * of outliers in the window (a single pause, noise) moves nothing, and rebalance when the
 * speed-proportional split of those medians predicts a step time at least `min_gain` below the
 * current split's. At most one action per `cooldown` steps: an oscillating load cannot make the
 * split oscillate. The very first decision comes sooner: when `first_after` judged steps are in
 * (fewer than the window), their medians decide once, so ranks that differ from the start are
 * balanced within a few steps; that decision starts no cooldown, and the full window may correct
 * it when it fills. Either policy also decides as soon as each of the last `agree` judged steps
 * alone predicts that gain with the same slowest rank: a deterministic slowdown is acted on after
 * `agree` steps whatever the window, while one pause (a single step) still moves nothing.
 *
 * Convergence. A rank's per-sample time depends on its local batch (per-step costs are spread
 * over more or fewer samples), so the split proportional to the speeds measured at the old split
 * is not the balanced one. After an action, once `refine` judged steps have run at the new split,
 * the medians of the steps run at it (up to the policy's window) give a refined split (a
 * fixed-point iteration: local batch proportional to the samples/s measured at the current local
 * batch); it is taken, inside the cooldown too and without starting one, when it predicts at
 * least `refine_gain` and moves at most half as many samples as the action did (so a load that
 * comes and goes, which would move them all back, is still left to the cooldown), up to
 * `refine_max` refinements per action.
 *
 * Both rules are off by default (agree = 0, refine_max = 0): on steps of 25-50 ms the step-to-step
 * noise is as large as the gains they act on, and with them a 150-step run took 10-15 actions and
 * fell to the static split's throughput; on 110-190 ms steps they neither helped nor hurt
 * (docs/BENCHMARKS.md, "Stragglers"). `--straggler-config agree=3,refine_max=3` turns them on.
 */
#ifndef ADTRAIN_STRAGGLER_H
#define ADTRAIN_STRAGGLER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_STRAGGLER_MAX_RANKS 1024

typedef enum adt_straggler_policy {
    ADT_STRAGGLER_OFF = 0,
    ADT_STRAGGLER_DD = 1,
    ADT_STRAGGLER_ND = 2,
} adt_straggler_policy;
const char *adt_straggler_policy_name(adt_straggler_policy p);
/* "off" | "dd" | "nd"; returns -1 (and sets the error) for anything else */
int adt_straggler_policy_parse(const char *s, adt_straggler_policy *out);

typedef enum adt_straggler_state {
    ADT_STRAGGLER_NORMAL = 0,
    ADT_STRAGGLER_TRANSIENT = 1,
    ADT_STRAGGLER_PERSISTENT = 2,
} adt_straggler_state;
const char *adt_straggler_state_name(adt_straggler_state s);

/* What a step was spent on: only TRAIN steps after the warmup are judged. */
typedef enum adt_straggler_phase {
    ADT_PHASE_TRAIN = 0,
    ADT_PHASE_EVAL = 1,
    ADT_PHASE_CKPT = 2,
    ADT_PHASE_COUNT
} adt_straggler_phase;

typedef struct adt_straggler_cfg {
    adt_straggler_policy policy;
    int warmup_steps;      /* steps not judged at the start (allocation, caches): default 3   */
    double slow_ratio[ADT_PHASE_COUNT]; /* k per phase; <= 0: not judged. default 1.5, 0, 0  */
    int persist_after;     /* consecutive slow observations -> persistent: default 5         */
    int clear_after;       /* consecutive normal observations -> normal: default 3           */
    double alpha;          /* EWMA weight of a new observation: default 0.3                  */
    double clip;           /* observations clipped to [1/clip, clip] x the estimate: 3       */
    double min_gain;       /* a rebalance must cut the predicted step time by this: 0.1      */
    int dd_after;          /* DD: the window of steps whose medians decide: default 9        */
    int nd_after;          /* ND: the same, shorter: default 5                               */
    int first_after;       /* judged steps whose medians make the first decision (once, if
                              fewer than the window); 0: none. default 3                      */
    int cooldown;          /* steps between two actions: default 20                          */
    int agree;             /* a decision also when each of the last `agree` steps alone
                              predicts min_gain (same slowest rank); 0: off. default 0        */
    int refine;            /* judged steps at a new split before refining it; 0: off. 5      */
    double refine_gain;    /* a refinement must cut the predicted step time by this: 0.03    */
    int refine_max;        /* refinements per action: default 0 (off; 3 converges, below)    */
    double restart_cost_s; /* ND: measured cost of restarting a worker elsewhere: default 30 */
    int min_local;         /* smallest local batch a rebalance gives a rank: default 1       */
} adt_straggler_cfg;

/* The defaults above, for `policy`. */
adt_straggler_cfg adt_straggler_defaults(adt_straggler_policy policy);
/* Sets fields from "key=value,key=value" (keys: warmup, k, persist, clear, alpha, clip, gain,
 * dd_after, nd_after, first, cooldown, agree, refine, refine_gain, refine_max, restart_cost,
 * min_local); a bad key or value is an error naming
 * it. */
int adt_straggler_cfg_parse(adt_straggler_cfg *cfg, const char *spec);

typedef enum adt_straggler_action_kind {
    ADT_ACTION_NONE = 0,
    ADT_ACTION_REBALANCE = 1, /* new local batch split (a refinement too: `why` says "refined") */
    ADT_ACTION_RESTART = 2,   /* ND: restart `rank` elsewhere (a new generation)              */
} adt_straggler_action_kind;

typedef struct adt_straggler_action {
    adt_straggler_action_kind kind;
    long step;          /* the step whose observation triggered it                          */
    int rank;           /* the slowest rank when it was taken                               */
    double gain;        /* predicted relative step-time cut (rebalance), or seconds (restart) */
    char why[160];
} adt_straggler_action;

typedef struct adt_straggler_rank {
    adt_straggler_state state;
    double ewma_s;      /* smoothed per-sample compute seconds (0 until observed)           */
    double last_s;      /* the last per-sample time observed                                 */
    int slow_run, normal_run; /* consecutive slow / normal observations                      */
    int64_t n_slow;     /* slow observations in all                                          */
} adt_straggler_rank;

typedef struct adt_straggler adt_straggler;

adt_straggler *adt_straggler_create(int nranks, const adt_straggler_cfg *cfg);
void adt_straggler_free(adt_straggler *m);
const adt_straggler_cfg *adt_straggler_config(const adt_straggler *m);

/* One step's observation: compute_s[i] and samples[i] of every rank (a rank with no samples is
 * not judged). Updates the classification; with a policy, may return an action in *act (kind
 * NONE otherwise) and, for REBALANCE, the new split in split[] (sums to the same total). split
 * holds the current split on entry. remaining_steps feeds ND's restart decision. */
int adt_straggler_observe(adt_straggler *m, long step, adt_straggler_phase phase, const double *compute_s,
                          const int64_t *samples, int64_t *split, long remaining_steps, adt_straggler_action *act);

/* ND's restart rule on its own, for a monitor without a policy whose ranks' work cannot be moved
 * (the master's parameter servers: each answers every pull, so a step waits for the slowest):
 * 1 and a RESTART in *act when `rank` is persistent, not yet considered in this persistent
 * episode, and remaining_steps x (the step time at `split` now - with the rank as fast as the
 * median of its peers, by EWMA speeds) exceeds cfg.restart_cost_s; else 0 (kind NONE). The rule
 * adt_straggler_observe applies under ND, there at the speed-proportional splits. */
int adt_straggler_restart_pays(adt_straggler *m, long step, int rank, const int64_t *split, long remaining_steps,
                               adt_straggler_action *act);

const adt_straggler_rank *adt_straggler_rank_info(const adt_straggler *m, int rank);
int64_t adt_straggler_actions(const adt_straggler *m); /* actions taken so far, refinements included */

/* The split of `total` samples over n ranks in proportion to speed[i] (> 0), each at least
 * min_each (largest remainders; ties to the lower rank). Fails when n * min_each > total. */
int adt_straggler_split(int64_t total, int n, const double *speed, int64_t min_each, int64_t *split);

/* The step time predicted for `split` when rank i takes per_sample_s[i] per sample: the slowest
 * rank's time (data parallelism waits for it). */
double adt_straggler_step_time(int n, const double *per_sample_s, const int64_t *split);

/* One rank's state as a JSON object (no trailing newline) into buf; returns the length. */
int adt_straggler_rank_json(const adt_straggler *m, int rank, char *buf, int n);

#ifdef __cplusplus
}
#endif
#endif
