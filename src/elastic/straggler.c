/*
 * straggler.c - the straggler Monitor (classification with hysteresis, EWMA speeds) and the
 * Controller's policies (DD, ND): see include/adtrain/straggler.h for the rules.
 *
 * Everything here is a pure function of the observations fed in, so ranks (or a master) that
 * feed the same observations take the same decisions, and the tests drive it with synthetic
 * timings.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/straggler.h"

#define WIN 64 /* the most observations a decision looks back on */

struct adt_straggler {
    adt_straggler_cfg cfg;
    int n;
    adt_straggler_rank *r;
    double *slow_sum, *normal_sum; /* [n] per-sample times summed over the current runs       */
    double *win;                   /* [n][WIN] the last per-sample times of the imbalanced run */
    int64_t n_obs;                 /* judged steps with every rank's time: win's fill          */
    long last_action;              /* step of the last action; -1: none yet                   */
    int64_t split_obs;             /* n_obs when the split last changed: later ones are at it  */
    int64_t last_move;             /* samples the last action (not refinement) moved           */
    int refines;                   /* refinements since the last action                       */
    int64_t n_actions;
    int *restart_considered;       /* [n] ND looked at this persistent episode already        */
    double *tmp, *tmp2;            /* [max(n, WIN)] scratch                                             */
    int64_t *tsplit;               /* [n] scratch                                              */
};

const char *adt_straggler_policy_name(adt_straggler_policy p) {
    return p == ADT_STRAGGLER_DD ? "dd" : p == ADT_STRAGGLER_ND ? "nd" : "off";
}

int adt_straggler_policy_parse(const char *s, adt_straggler_policy *out) {
    if (!strcmp(s, "off")) *out = ADT_STRAGGLER_OFF;
    else if (!strcmp(s, "dd")) *out = ADT_STRAGGLER_DD;
    else if (!strcmp(s, "nd")) *out = ADT_STRAGGLER_ND;
    else return adt_error(ADT_ERR_ARG, "straggler policy: expected off, dd or nd, got '%s'", s);
    return 0;
}

const char *adt_straggler_state_name(adt_straggler_state s) {
    return s == ADT_STRAGGLER_PERSISTENT ? "persistent" : s == ADT_STRAGGLER_TRANSIENT ? "transient" : "normal";
}

adt_straggler_cfg adt_straggler_defaults(adt_straggler_policy policy) {
    return (adt_straggler_cfg){.policy = policy, .warmup_steps = 3, .slow_ratio = {1.5, 0, 0}, .persist_after = 5,
                               .clear_after = 3, .alpha = 0.3, .clip = 3, .min_gain = 0.1, .dd_after = 9,
                               .nd_after = 5, .first_after = 3, .cooldown = 20, .agree = 0, .refine = 5, .refine_gain = 0.03,
                               .refine_max = 0, .restart_cost_s = 30, .min_local = 1};
}

static int cfg_check(const adt_straggler_cfg *c) {
    if (c->warmup_steps < 0 || c->persist_after < 1 || c->clear_after < 1 || c->dd_after < 1 || c->nd_after < 1 ||
        c->cooldown < 0 || c->min_local < 1 || c->dd_after > WIN || c->nd_after > WIN || c->first_after < 0 ||
        c->first_after > WIN || c->agree < 0 || c->agree > WIN || c->refine < 0 || c->refine > WIN ||
        c->refine_max < 0)
        return adt_error(ADT_ERR_ARG, "straggler config: warmup, cooldown, refine_max >= 0, persist, clear, min_local "
                         ">= 1, dd_after, nd_after in [1, %d] and first, agree, refine in [0, %d] expected", WIN, WIN);
    if (!(c->alpha > 0 && c->alpha <= 1) || !(c->clip >= 1) || !(c->min_gain >= 0 && c->min_gain < 1) ||
        !(c->refine_gain >= 0 && c->refine_gain < 1) ||
        !(c->restart_cost_s >= 0) || !(c->slow_ratio[ADT_PHASE_TRAIN] > 1 || c->slow_ratio[ADT_PHASE_TRAIN] <= 0))
        return adt_error(ADT_ERR_ARG, "straggler config: expected alpha in (0, 1], clip >= 1, gain in [0, 1), "
                         "refine_gain in [0, 1), restart_cost >= 0 and k > 1 (or 0: off)");
    return 0;
}

int adt_straggler_cfg_parse(adt_straggler_cfg *cfg, const char *spec) {
    adt_straggler_cfg c = *cfg;
    const char *p = spec;
    while (*p) {
        size_t len = strcspn(p, ","), klen = strcspn(p, "=");
        if (klen >= len) return adt_error(ADT_ERR_ARG, "straggler config '%s': expected key=value at '%.*s'", spec, (int)len, p);
        char key[32], val[64];
        if (klen >= sizeof key || len - klen - 1 >= sizeof val)
            return adt_error(ADT_ERR_ARG, "straggler config '%s': '%.*s' is too long", spec, (int)len, p);
        memcpy(key, p, klen), key[klen] = 0;
        memcpy(val, p + klen + 1, len - klen - 1), val[len - klen - 1] = 0;
        char *end;
        double v = strtod(val, &end);
        if (!*val || *end || !isfinite(v))
            return adt_error(ADT_ERR_ARG, "straggler config: %s: expected a number, got '%s'", key, val);
        int is_int = v == floor(v) && fabs(v) < 1e9;
        int *ip = !strcmp(key, "warmup") ? &c.warmup_steps : !strcmp(key, "persist") ? &c.persist_after
                : !strcmp(key, "clear") ? &c.clear_after : !strcmp(key, "dd_after") ? &c.dd_after
                : !strcmp(key, "nd_after") ? &c.nd_after : !strcmp(key, "cooldown") ? &c.cooldown
                : !strcmp(key, "min_local") ? &c.min_local : !strcmp(key, "first") ? &c.first_after
                : !strcmp(key, "agree") ? &c.agree : !strcmp(key, "refine") ? &c.refine
                : !strcmp(key, "refine_max") ? &c.refine_max : NULL;
        double *dp = !strcmp(key, "k") ? &c.slow_ratio[ADT_PHASE_TRAIN] : !strcmp(key, "alpha") ? &c.alpha
                   : !strcmp(key, "clip") ? &c.clip : !strcmp(key, "gain") ? &c.min_gain
                   : !strcmp(key, "restart_cost") ? &c.restart_cost_s
                   : !strcmp(key, "refine_gain") ? &c.refine_gain : NULL;
        if (ip) {
            if (!is_int) return adt_error(ADT_ERR_ARG, "straggler config: %s: expected an integer, got '%s'", key, val);
            *ip = (int)v;
        } else if (dp) {
            *dp = v;
        } else {
            return adt_error(ADT_ERR_ARG, "straggler config: unknown key '%s'; expected warmup, k, persist, clear, "
                             "alpha, clip, gain, dd_after, nd_after, first, cooldown, agree, refine, refine_gain, refine_max, "
                             "restart_cost or min_local", key);
        }
        p += len;
        if (*p == ',') p++;
    }
    if (cfg_check(&c)) return -1;
    *cfg = c;
    return 0;
}

adt_straggler *adt_straggler_create(int nranks, const adt_straggler_cfg *cfg) {
    if (nranks < 1 || nranks > ADT_STRAGGLER_MAX_RANKS) {
        adt_error(ADT_ERR_ARG, "straggler monitor: %d ranks, expected 1..%d", nranks, ADT_STRAGGLER_MAX_RANKS);
        return NULL;
    }
    if (cfg_check(cfg)) return NULL;
    adt_straggler *m = adt_calloc(1, sizeof *m);
    m->cfg = *cfg;
    m->n = nranks;
    m->r = adt_calloc((size_t)nranks, sizeof *m->r);
    m->slow_sum = adt_calloc((size_t)nranks, sizeof(double));
    m->normal_sum = adt_calloc((size_t)nranks, sizeof(double));
    m->win = adt_calloc((size_t)nranks * WIN, sizeof(double));
    m->tmp = adt_calloc((size_t)nranks, sizeof(double));
    m->tmp2 = adt_calloc((size_t)(nranks > WIN ? nranks : WIN), sizeof(double));
    m->tsplit = adt_calloc((size_t)nranks, sizeof(int64_t));
    m->restart_considered = adt_calloc((size_t)nranks, sizeof(int));
    m->last_action = -1;
    return m;
}

void adt_straggler_free(adt_straggler *m) {
    if (!m) return;
    free(m->r), free(m->slow_sum), free(m->normal_sum), free(m->win);
    free(m->tmp), free(m->tmp2), free(m->tsplit), free(m->restart_considered);
    free(m);
}

const adt_straggler_cfg *adt_straggler_config(const adt_straggler *m) { return &m->cfg; }
const adt_straggler_rank *adt_straggler_rank_info(const adt_straggler *m, int rank) {
    return rank >= 0 && rank < m->n ? &m->r[rank] : NULL;
}
int64_t adt_straggler_actions(const adt_straggler *m) { return m->n_actions; }

/* ---- splits ------------------------------------------------------------------------------------ */

int adt_straggler_split(int64_t total, int n, const double *speed, int64_t min_each, int64_t *split) {
    if (n < 1 || total < (int64_t)n * min_each)
        return adt_error(ADT_ERR_ARG, "split: %lld samples cannot give %d ranks %lld each", (long long)total, n,
                         (long long)min_each);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(speed[i] > 0) || !isfinite(speed[i])) return adt_error(ADT_ERR_ARG, "split: speed of rank %d is %g", i, speed[i]);
        sum += speed[i];
    }
    /* each rank gets min_each, the rest goes by speed: floors first, then the largest remainders */
    int64_t rest = total - (int64_t)n * min_each, given = 0;
    double frac[ADT_STRAGGLER_MAX_RANKS];
    for (int i = 0; i < n; i++) {
        double share = (double)rest * speed[i] / sum;
        int64_t f = (int64_t)floor(share);
        split[i] = min_each + f;
        frac[i] = share - (double)f;
        given += f;
    }
    for (int64_t left = rest - given; left > 0; left--) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (frac[i] > frac[best]) best = i;
        split[best]++;
        frac[best] = -1;
    }
    return 0;
}

double adt_straggler_step_time(int n, const double *per_sample_s, const int64_t *split) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double t = per_sample_s[i] * (double)split[i];
        if (t > worst) worst = t;
    }
    return worst;
}

/* ---- the monitor ------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of t[j] over j != skip with t[j] > 0; 0 when there is none. */
static double median_of_peers(adt_straggler *m, const double *t, int skip) {
    int k = 0;
    for (int j = 0; j < m->n; j++)
        if (j != skip && t[j] > 0) m->tmp2[k++] = t[j];
    if (!k) return 0;
    qsort(m->tmp2, (size_t)k, sizeof(double), cmp_double);
    return k % 2 ? m->tmp2[k / 2] : 0.5 * (m->tmp2[k / 2 - 1] + m->tmp2[k / 2]);
}

/* Slow / normal per rank, runs, states and EWMA speeds from one step's per-sample times t. */
static void classify(adt_straggler *m, const double *t, double k) {
    const adt_straggler_cfg *c = &m->cfg;
    for (int i = 0; i < m->n; i++) {
        adt_straggler_rank *r = &m->r[i];
        if (!(t[i] > 0)) continue;
        double med = median_of_peers(m, t, i);
        int slow = k > 0 && med > 0 && t[i] > k * med;
        double x = t[i];
        if (r->ewma_s > 0) {
            if (x > c->clip * r->ewma_s) x = c->clip * r->ewma_s;
            if (x < r->ewma_s / c->clip) x = r->ewma_s / c->clip;
            r->ewma_s += c->alpha * (x - r->ewma_s);
        } else {
            r->ewma_s = x;
        }
        r->last_s = t[i];
        if (slow) {
            r->n_slow++;
            if (!r->slow_run) m->slow_sum[i] = 0;
            r->slow_run++, m->slow_sum[i] += t[i];
            r->normal_run = 0;
            if (r->state == ADT_STRAGGLER_NORMAL) r->state = ADT_STRAGGLER_TRANSIENT;
            if (r->state == ADT_STRAGGLER_TRANSIENT && r->slow_run >= c->persist_after) {
                /* the clipped EWMA lags a real change: restart it from the slow run */
                r->state = ADT_STRAGGLER_PERSISTENT;
                r->ewma_s = m->slow_sum[i] / r->slow_run;
            }
        } else {
            if (!r->normal_run) m->normal_sum[i] = 0;
            r->normal_run++, m->normal_sum[i] += t[i];
            r->slow_run = 0;
            if (r->state != ADT_STRAGGLER_NORMAL && r->normal_run >= c->clear_after) {
                if (r->state == ADT_STRAGGLER_PERSISTENT) r->ewma_s = m->normal_sum[i] / r->normal_run;
                r->state = ADT_STRAGGLER_NORMAL;
                m->restart_considered[i] = 0;
            }
        }
    }
}

/* Relative step-time cut of the speed-proportional split over `split` for per-sample times t
 * (all > 0); the proportional split goes to out. */
static double split_gain(adt_straggler *m, const double *t, const int64_t *split, int64_t *out) {
    int64_t total = 0;
    for (int i = 0; i < m->n; i++) total += split[i];
    for (int i = 0; i < m->n; i++) m->tmp[i] = 1.0 / t[i];
    if (adt_straggler_split(total, m->n, m->tmp, m->cfg.min_local, out)) return 0;
    double now = adt_straggler_step_time(m->n, t, split), then = adt_straggler_step_time(m->n, t, out);
    return now > 0 ? 1.0 - then / now : 0;
}

/* Samples a new split moves: half the sum of the per-rank changes. */
static int64_t split_moved(int n, const int64_t *a, const int64_t *b) {
    int64_t d = 0;
    for (int i = 0; i < n; i++) d += a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    return d / 2;
}

/* An action (refine: a refinement, which starts no cooldown) whose new split `to` replaces `split`. */
static void act_set(adt_straggler *m, adt_straggler_action *act, adt_straggler_action_kind kind, long step, int rank,
                    double gain, int refine, int64_t *split, const int64_t *to) {
    act->kind = kind, act->step = step, act->rank = rank, act->gain = gain;
    if (refine) {
        m->refines++;
    } else {
        m->last_action = step;
        m->last_move = split_moved(m->n, split, to);
        m->refines = 0;
    }
    if (split != to) memcpy(split, to, (size_t)m->n * sizeof *split);
    m->split_obs = m->n_obs;
    m->n_actions++;
}

/* Rank i's median per-sample time over the last `after` judged steps. */
static double window_median(adt_straggler *m, int i, int after) {
    for (int j = 0; j < after; j++) m->tmp2[j] = m->win[(size_t)i * WIN + (m->n_obs - 1 - j) % WIN];
    qsort(m->tmp2, (size_t)after, sizeof(double), cmp_double);
    return after % 2 ? m->tmp2[after / 2] : 0.5 * (m->tmp2[after / 2 - 1] + m->tmp2[after / 2]);
}

/* The slowest rank of `split` at per-sample times t. */
static int slowest_of(int n, const double *t, const int64_t *split) {
    int s = 0;
    for (int i = 1; i < n; i++)
        if (t[i] * (double)split[i] > t[s] * (double)split[s]) s = i;
    return s;
}

/* Does each of the last `agree` judged steps alone predict min_gain, with the same slowest rank? */
static int steps_agree(adt_straggler *m, const int64_t *split) {
    int agree = m->cfg.agree, who = -1;
    if (agree < 1 || m->n_obs < agree) return 0;
    double t[ADT_STRAGGLER_MAX_RANKS];
    for (int j = 0; j < agree; j++) {
        for (int i = 0; i < m->n; i++) t[i] = m->win[(size_t)i * WIN + (m->n_obs - 1 - j) % WIN];
        int s = slowest_of(m->n, t, split);
        if ((who >= 0 && s != who) || split_gain(m, t, split, m->tsplit) < m->cfg.min_gain) return 0;
        who = s;
    }
    return 1;
}

/* The split description after "new split" in act->why. */
static void why_split(adt_straggler_action *act, int o, int n, const int64_t *split, double gain) {
    for (int i = 0; i < n && o < (int)sizeof act->why - 12; i++)
        o += snprintf(act->why + o, sizeof act->why - (size_t)o, "%s%lld", i ? "/" : " ", (long long)split[i]);
    snprintf(act->why + o, sizeof act->why - (size_t)o, " (-%.0f%% step time)", gain * 100);
}

/* A refinement of the last action's split from the medians of the steps run at it, at least
 * `refine` of them and up to the policy's window (more steps, less noise, as the split stays; see
 * the header): taken when it gains refine_gain and moves at most half what the action moved. */
static int try_refine(adt_straggler *m, long step, int64_t *split, adt_straggler_action *act) {
    const adt_straggler_cfg *c = &m->cfg;
    int64_t since = m->n_obs - m->split_obs;
    if (c->refine < 1 || m->last_move < 1 || m->refines >= c->refine_max || since < c->refine) return 0;
    int after = c->policy == ADT_STRAGGLER_DD ? c->dd_after : c->nd_after;
    int w = (int)(since < after ? since : after);
    if (w < c->refine) w = c->refine;
    double med[ADT_STRAGGLER_MAX_RANKS];
    for (int i = 0; i < m->n; i++) med[i] = window_median(m, i, w);
    double gain = split_gain(m, med, split, m->tsplit);
    if (gain < c->refine_gain || 2 * split_moved(m->n, split, m->tsplit) > m->last_move) return 0;
    int slowest = slowest_of(m->n, med, split);
    for (int i = 0; i < m->n; i++) m->r[i].ewma_s = med[i];
    act_set(m, act, ADT_ACTION_REBALANCE, step, slowest, gain, 1, split, m->tsplit);
    int o = snprintf(act->why, sizeof act->why, "refined from %d steps at the last split; new split", w);
    why_split(act, o, m->n, split, gain);
    return 1;
}

/* ND's restart rule: rank i, persistent and not yet considered in this episode, is worth a
 * restart elsewhere when the remaining run gains more than a restart costs; the gain is the step
 * time now minus the step time with the rank as fast as the median of its peers (by EWMA speeds),
 * each at the speed-proportional split of `split` (rebalance) or at `split` itself (work that
 * cannot move: servers each answering every pull). Fills act's rank, step, gain (seconds) and why;
 * cur gets the split the step time now was priced at. */
static int restart_rule(adt_straggler *m, long step, int i, const int64_t *split, int rebalance, long remaining_steps,
                        adt_straggler_action *act, int64_t *cur) {
    const adt_straggler_cfg *c = &m->cfg;
    if (i < 0 || i >= m->n || m->r[i].state != ADT_STRAGGLER_PERSISTENT || m->restart_considered[i]) return 0;
    m->restart_considered[i] = 1;
    double e[ADT_STRAGGLER_MAX_RANKS];
    for (int j = 0; j < m->n; j++) e[j] = m->r[j].ewma_s;
    int64_t healed[ADT_STRAGGLER_MAX_RANKS];
    memcpy(cur, split, (size_t)m->n * sizeof *cur);
    memcpy(healed, split, (size_t)m->n * sizeof *healed);
    if (rebalance) split_gain(m, e, split, cur);
    double t_now = adt_straggler_step_time(m->n, e, cur);
    e[i] = median_of_peers(m, e, i);
    if (rebalance) split_gain(m, e, split, healed);
    double t_healed = adt_straggler_step_time(m->n, e, healed);
    double gain_s = (double)remaining_steps * (t_now - t_healed);
    if (!(gain_s > c->restart_cost_s)) return 0;
    act->kind = ADT_ACTION_RESTART, act->step = step, act->rank = i, act->gain = gain_s;
    snprintf(act->why, sizeof act->why, "rank %d persistent at %.2fx its peers; restart gains %.1f s over %ld steps > "
             "cost %.1f s", i, m->r[i].ewma_s / e[i], gain_s, remaining_steps, c->restart_cost_s);
    return 1;
}

int adt_straggler_restart_pays(adt_straggler *m, long step, int rank, const int64_t *split, long remaining_steps,
                               adt_straggler_action *act) {
    int64_t cur[ADT_STRAGGLER_MAX_RANKS];
    act->kind = ADT_ACTION_NONE;
    if (!restart_rule(m, step, rank, split, 0, remaining_steps, act, cur)) return 0;
    m->n_actions++;
    return 1;
}

int adt_straggler_observe(adt_straggler *m, long step, adt_straggler_phase phase, const double *compute_s,
                          const int64_t *samples, int64_t *split, long remaining_steps, adt_straggler_action *act) {
    const adt_straggler_cfg *c = &m->cfg;
    memset(act, 0, sizeof *act);
    if (phase < 0 || phase >= ADT_PHASE_COUNT) return adt_error(ADT_ERR_ARG, "straggler observe: phase %d", (int)phase);
    double k = c->slow_ratio[phase];
    if (step <= c->warmup_steps || k <= 0) return 0; /* not judged: first steps, eval, checkpoints */
    double t[ADT_STRAGGLER_MAX_RANKS];
    int all = 1;
    for (int i = 0; i < m->n; i++) {
        t[i] = samples[i] > 0 && compute_s[i] > 0 ? compute_s[i] / (double)samples[i] : 0;
        all &= t[i] > 0;
    }
    int slowest = slowest_of(m->n, t, split);
    classify(m, t, k);
    if (!all || m->n < 2) return 0;

    for (int i = 0; i < m->n; i++) m->win[(size_t)i * WIN + m->n_obs % WIN] = t[i];
    m->n_obs++;
    if (c->policy == ADT_STRAGGLER_OFF) return 0;
    if (try_refine(m, step, split, act)) return 0;
    int cooled = m->last_action < 0 || step - m->last_action >= c->cooldown;
    if (!cooled) return 0;

    /* ND: a persistent straggler is worth a restart when the remaining run gains more than a
     * restart costs (restart_rule); the split becomes the one the EWMA speeds give */
    if (c->policy == ADT_STRAGGLER_ND) {
        for (int i = 0; i < m->n; i++) {
            int64_t cur[ADT_STRAGGLER_MAX_RANKS];
            if (!restart_rule(m, step, i, split, 1, remaining_steps, act, cur)) continue;
            act_set(m, act, ADT_ACTION_RESTART, step, i, act->gain, 0, split, cur);
            return 0;
        }
    }
    int after = c->policy == ADT_STRAGGLER_DD ? c->dd_after : c->nd_after;
    /* the first decision: ranks that differ from the start (heterogeneous hardware) are balanced
     * on the median of the first `first_after` judged steps instead of waiting for a whole
     * window; it starts no cooldown, so the full window may correct it when it fills */
    int first = m->n_obs == c->first_after && c->first_after < after && m->n_actions == 0;
    if (first) after = c->first_after;
    /* imbalance and the new split from each rank's median per-sample time over the last `after`
     * steps: measured, recent, and blind to a minority of outliers (a single pause, noise); or,
     * before the window has decided, over the last `agree` steps when each of them alone shows it */
    double med[ADT_STRAGGLER_MAX_RANKS], gain = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            if (first || !steps_agree(m, split)) return 0;
            after = c->agree;
        } else if (m->n_obs < after) {
            continue;
        }
        for (int i = 0; i < m->n; i++) med[i] = window_median(m, i, after);
        gain = split_gain(m, med, split, m->tsplit);
        if (gain >= c->min_gain) break;
        if (pass == 1) return 0;
    }
    for (int i = 0; i < m->n; i++) m->r[i].ewma_s = med[i];
    act_set(m, act, ADT_ACTION_REBALANCE, step, slowest, gain, 0, split, m->tsplit);
    if (first) m->last_action = -1;
    int o = snprintf(act->why, sizeof act->why, "imbalanced over the %s %d steps; new split", first ? "first" : "last",
                     after);
    why_split(act, o, m->n, split, gain);
    return 0;
}

int adt_straggler_rank_json(const adt_straggler *m, int rank, char *buf, int n) {
    const adt_straggler_rank *r = &m->r[rank];
    return snprintf(buf, (size_t)n, "{\"rank\":%d,\"state\":\"%s\",\"per_sample_s\":%.6g,\"speed\":%.6g,"
                    "\"slow_run\":%d,\"slow_total\":%lld}", rank, adt_straggler_state_name(r->state), r->ewma_s,
                    r->ewma_s > 0 ? 1.0 / r->ewma_s : 0.0, r->slow_run, (long long)r->n_slow);
}
