/*
 * test_straggler.c - the straggler Monitor and Controller on synthetic timings: a simulated
 * data-parallel job where rank i takes per_sample[i] seconds per sample, so a step's compute time
 * is split[i] * per_sample[i] and the controller's splits feed back into the next step.
 *
 * What must hold: the proportional split (closed form), no action for a single 2 s pause, at most
 * one action for a load that alternates faster than the cooldown, persistent classification
 * within `persist` observations, DD's split converging to the speed ratio, ND restarting only when
 * the remaining run pays for it (also for work that cannot move), evaluation and warmup steps never judged, bad configs refused.
 */
#include "check.h"

#include <stdint.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/straggler.h"

typedef struct sim {
    adt_straggler *m;
    int n;
    int64_t split[8];
    double per_sample[8];
    double pause[8];  /* extra seconds this step only */
    double fixed[8];  /* seconds per step whatever the local batch: the per-sample time depends on it */
    int actions, restarts;
    long first_action;
} sim;

static void sim_init(sim *s, int n, int64_t batch, adt_straggler_cfg cfg) {
    memset(s, 0, sizeof *s);
    s->m = adt_straggler_create(n, &cfg);
    s->n = n;
    for (int i = 0; i < n; i++) s->split[i] = batch / n, s->per_sample[i] = 1e-3;
    s->first_action = -1;
}

/* One step: timings from the model, then the controller's decision applied. */
static void sim_step(sim *s, long step, adt_straggler_phase phase, long remaining) {
    double comp[8];
    int64_t samples[8];
    for (int i = 0; i < s->n; i++) {
        comp[i] = (double)s->split[i] * s->per_sample[i] + s->fixed[i] + s->pause[i];
        samples[i] = s->split[i];
        s->pause[i] = 0;
    }
    adt_straggler_action act;
    CHECK(adt_straggler_observe(s->m, step, phase, comp, samples, s->split, remaining, &act) == 0, "observe: %s",
          adt_error_message());
    if (act.kind != ADT_ACTION_NONE) {
        s->actions++;
        if (act.kind == ADT_ACTION_RESTART) s->restarts++;
        if (s->first_action < 0) s->first_action = step;
    }
}

static void test_split_closed_form(void) {
    int64_t sp[3];
    CHECK(adt_straggler_split(48, 2, (double[]){2, 1}, 1, sp) == 0, "split");
    CHECK(sp[0] == 32 && sp[1] == 16, "2:1 of 48 -> %lld/%lld", (long long)sp[0], (long long)sp[1]);
    /* 16 at speeds 5:11 -> exactly 5/11 */
    CHECK(adt_straggler_split(16, 2, (double[]){5, 11}, 1, sp) == 0 && sp[0] == 5 && sp[1] == 11, "5:11 -> %lld/%lld",
          (long long)sp[0], (long long)sp[1]);
    /* 10 over 3 equal: 1 each guaranteed, 7 by speed -> floors 2,2,2 and one remainder to rank 0 */
    CHECK(adt_straggler_split(10, 3, (double[]){1, 1, 1}, 1, sp) == 0 && sp[0] == 4 && sp[1] == 3 && sp[2] == 3,
          "10/3 -> %lld %lld %lld", (long long)sp[0], (long long)sp[1], (long long)sp[2]);
    /* a very slow rank still gets min_each */
    CHECK(adt_straggler_split(8, 2, (double[]){1000, 1}, 2, sp) == 0 && sp[1] == 2 && sp[0] == 6, "min_each");
    CHECK(adt_straggler_split(3, 2, (double[]){1, 1}, 2, sp) != 0, "4 needed, 3 given: refused");
    CHECK(adt_straggler_split(4, 2, (double[]){1, 0}, 1, sp) != 0, "zero speed refused");
    double t[2] = {1e-3, 2e-3};
    CHECK_CLOSE(adt_straggler_step_time(2, t, (int64_t[]){8, 8}), 16e-3, 1e-12, 0);
}

static void test_single_pause_no_action(void) {
    for (int pol = ADT_STRAGGLER_DD; pol <= ADT_STRAGGLER_ND; pol++) {
        sim s;
        sim_init(&s, 2, 16, adt_straggler_defaults((adt_straggler_policy)pol));
        for (long st = 1; st <= 200; st++) {
            if (st == 50) s.pause[1] = 2.0; /* 2 s on a 16 ms step */
            sim_step(&s, st, ADT_PHASE_TRAIN, 200 - st);
            if (st == 50)
                CHECK(adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_TRANSIENT, "the pause is seen");
        }
        CHECK(s.actions == 0, "policy %s: %d actions after one 2 s pause", adt_straggler_policy_name(pol), s.actions);
        CHECK(adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_NORMAL, "cleared after the pause");
        CHECK(s.split[0] == 8 && s.split[1] == 8, "split unchanged");
        adt_straggler_free(s.m);
    }
}

static void test_alternating_at_most_one(void) {
    for (int pol = ADT_STRAGGLER_DD; pol <= ADT_STRAGGLER_ND; pol++) {
        adt_straggler_cfg cfg = adt_straggler_defaults((adt_straggler_policy)pol);
        const int span = 40; /* the steps watched: one cooldown */
        cfg.cooldown = span;
        for (int half = 1; half <= 6; half++) { /* slow for `half` steps, fast for `half`: period < cooldown */
            sim s;
            sim_init(&s, 2, 16, cfg);
            long first = 11;
            for (long st = 1; st < first; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 1000);
            for (long st = first; st < first + span; st++) {
                s.per_sample[1] = ((st - first) / half) % 2 == 0 ? 2e-3 : 1e-3;
                sim_step(&s, st, ADT_PHASE_TRAIN, 1000);
            }
            CHECK(s.actions <= 1, "policy %s, half period %d: %d actions within one cooldown",
                  adt_straggler_policy_name(pol), half, s.actions);
            adt_straggler_free(s.m);
        }
    }
}

static void test_persistent_dd_rebalances(void) {
  for (int agree = 3; agree >= 0; agree -= 3) {
    adt_straggler_cfg cfg = adt_straggler_defaults(ADT_STRAGGLER_DD);
    cfg.agree = agree;
    sim s;
    sim_init(&s, 2, 48, cfg);
    for (long st = 1; st <= 10; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 100);
    s.per_sample[1] = 2e-3; /* rank 1 at half speed from step 11 on */
    long turned = -1;
    for (long st = 11; st <= 60; st++) {
        sim_step(&s, st, ADT_PHASE_TRAIN, 100);
        if (turned < 0 && adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_PERSISTENT) turned = st;
    }
    CHECK(turned >= 11 && turned < 11 + cfg.persist_after, "persistent at step %ld (slow from 11, persist %d)", turned,
          cfg.persist_after);
    CHECK(s.actions == 1, "%d actions", s.actions);
    /* the last `agree` steps each show the slowdown; without that rule, the median of the last
     * dd_after steps turns slow once most of them are */
    long expect = 10 + (agree ? agree : (cfg.dd_after + 1) / 2);
    CHECK(s.first_action == expect, "agree=%d: DD acted at step %ld, expected %ld", agree, s.first_action, expect);
    /* speeds 2:1 -> 32/16 of 48: both ranks then take 32 ms */
    CHECK(s.split[0] == 32 && s.split[1] == 16, "split %lld/%lld", (long long)s.split[0], (long long)s.split[1]);
    /* after the rebalance the slow rank is still a straggler per sample (so ND would still weigh
     * a restart), but the split no longer is imbalanced */
    CHECK(adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_PERSISTENT, "still slow per sample");
    /* the slowdown ends: the split goes back after the imbalance and the cooldown */
    s.per_sample[1] = 1e-3;
    for (long st = 61; st <= 120; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 100);
    CHECK(s.actions == 2 && s.split[0] == 24 && s.split[1] == 24, "after recovery: %d actions, split %lld/%lld",
          s.actions, (long long)s.split[0], (long long)s.split[1]);
    CHECK(adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_NORMAL, "cleared");
    adt_straggler_free(s.m);
  }
}

/* A deterministic slowdown: DD acts no later than ND (DD's longer window is for noise; `agree`
 * consecutive slow steps are none). */
static void test_dd_not_after_nd(void) {
    long at[3] = {0};
    for (int pol = ADT_STRAGGLER_DD; pol <= ADT_STRAGGLER_ND; pol++) {
        adt_straggler_cfg cfg = adt_straggler_defaults((adt_straggler_policy)pol);
        cfg.agree = 3; /* the rule under test (off by default) */
        sim s;
        sim_init(&s, 2, 48, cfg);
        for (long st = 1; st <= 40; st++) {
            if (st == 20) s.per_sample[1] = 2e-3;
            sim_step(&s, st, ADT_PHASE_TRAIN, 100);
        }
        at[pol] = s.first_action;
        CHECK(s.actions == 1 && s.split[1] == 16, "policy %s: %d actions, split %lld/%lld", adt_straggler_policy_name(pol),
              s.actions, (long long)s.split[0], (long long)s.split[1]);
        adt_straggler_free(s.m);
    }
    CHECK(at[ADT_STRAGGLER_DD] >= 20 && at[ADT_STRAGGLER_DD] <= at[ADT_STRAGGLER_ND], "DD acted at step %ld, ND at %ld",
          at[ADT_STRAGGLER_DD], at[ADT_STRAGGLER_ND]);
}

/* The step time of the best split of `total` over two ranks whose step takes b * per_sample[i] +
 * fixed[i], by trying every split: the reference the controller's split must converge to. */
static double best_step_time(const sim *s, int64_t total) {
    double best = 1e300;
    for (int64_t b0 = 1; b0 < total; b0++) {
        double t0 = (double)b0 * s->per_sample[0] + s->fixed[0], t1 = (double)(total - b0) * s->per_sample[1] + s->fixed[1];
        double t = t0 > t1 ? t0 : t1;
        if (t < best) best = t;
    }
    return best;
}

/* Per-sample costs that depend on the local batch (a fixed cost per step spread over its samples):
 * the split proportional to the speeds measured at the equal split leaves the slow rank ~12% over
 * the balanced time; refinements from the times measured at each new split (inside the cooldown)
 * converge until the next would gain less than refine_gain: within refine_gain + 1% (rounding) of
 * the best split, by exhaustive search, long before the cooldown ends.
 * With refinements off the controller stops at the first split (the check that they matter). */
static void test_refine_converges(void) {
    for (int pol = ADT_STRAGGLER_DD; pol <= ADT_STRAGGLER_ND; pol++) {
        for (int refine = 3; refine >= 0; refine -= 3) {
            adt_straggler_cfg cfg = adt_straggler_defaults((adt_straggler_policy)pol);
            cfg.refine = refine;
            cfg.refine_max = 3; /* refinements are off by default */
            cfg.first_after = 0;
            sim s;
            sim_init(&s, 2, 256, cfg);
            s.fixed[0] = s.fixed[1] = 60e-3;
            for (long st = 1; st <= 10; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 1000);
            s.per_sample[1] = 2e-3;
            for (long st = 11; st <= 10 + cfg.cooldown; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 1000);
            double now = adt_straggler_step_time(2, (double[]){s.per_sample[0] + s.fixed[0] / (double)s.split[0],
                                                               s.per_sample[1] + s.fixed[1] / (double)s.split[1]}, s.split);
            double best = best_step_time(&s, 256), over = now / best - 1;
            if (refine) {
                CHECK(over < cfg.refine_gain + 0.01, "policy %s: step time %.1f ms at split %lld/%lld, %.1f%% over the best %.1f ms",
                      adt_straggler_policy_name(pol), 1e3 * now, (long long)s.split[0], (long long)s.split[1],
                      100 * over, 1e3 * best);
                CHECK(s.actions >= 2 && s.actions <= 1 + cfg.refine_max, "policy %s: %d actions",
                      adt_straggler_policy_name(pol), s.actions);
            } else {
                CHECK(over > 0.05 && s.actions == 1, "policy %s without refinements: %.1f%% over the best, %d actions",
                      adt_straggler_policy_name(pol), 100 * over, s.actions);
            }
            adt_straggler_free(s.m);
        }
    }
}

/* Ranks that differ from the start (heterogeneous hardware): the first decision comes once
 * `first_after` judged steps are in, not a whole window later (first=0: at the window); it starts
 * no cooldown, so when the slow rank slows further the full window corrects the split at once. */
static void test_first_decision(void) {
    for (int pol = ADT_STRAGGLER_DD; pol <= ADT_STRAGGLER_ND; pol++) {
        for (int first = 0; first <= 3; first += 3) {
            adt_straggler_cfg cfg = adt_straggler_defaults((adt_straggler_policy)pol);
            cfg.first_after = first;
            cfg.agree = 0; /* else `agree` slow steps decide before the window */
            int after = pol == ADT_STRAGGLER_DD ? cfg.dd_after : cfg.nd_after;
            sim s;
            sim_init(&s, 2, 48, cfg);
            s.per_sample[1] = 2e-3; /* half speed from step 1 */
            for (long st = 1; st <= 40; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 100);
            long expect = cfg.warmup_steps + (first ? first : after);
            CHECK(s.first_action == expect, "policy %s, first=%d: first action at step %ld, expected %ld",
                  adt_straggler_policy_name(pol), first, s.first_action, expect);
            CHECK(s.actions == 1 && s.split[0] == 32 && s.split[1] == 16, "policy %s, first=%d: %d actions, split "
                  "%lld/%lld", adt_straggler_policy_name(pol), first, s.actions, (long long)s.split[0],
                  (long long)s.split[1]);
            adt_straggler_free(s.m);
        }
    }
    /* DD: 2x for the first decision, 3x from the step after it: `agree` steps at 3x (or the
     * refinement from `refine` steps at the new split, whichever comes first) correct it, long
     * before a cooldown from step 6 would end */
    adt_straggler_cfg cfg = adt_straggler_defaults(ADT_STRAGGLER_DD);
    cfg.agree = 3, cfg.refine_max = 3; /* both off by default */
    sim s;
    sim_init(&s, 2, 48, cfg);
    s.per_sample[1] = 2e-3;
    long second = -1;
    for (long st = 1; st <= 40; st++) {
        if (st == cfg.warmup_steps + cfg.first_after + 1) s.per_sample[1] = 3e-3;
        int before = s.actions;
        sim_step(&s, st, ADT_PHASE_TRAIN, 100);
        if (before == 1 && s.actions == 2) second = st;
    }
    CHECK(s.first_action == cfg.warmup_steps + cfg.first_after, "first decision at step %ld", s.first_action);
    long fix = s.first_action + (cfg.agree && cfg.agree < cfg.refine ? cfg.agree : cfg.refine);
    CHECK(second == fix && second < s.first_action + cfg.cooldown, "corrected at step %ld, expected %ld", second, fix);
    /* speeds 3:1 -> 36/12 of 48 */
    CHECK(s.actions == 2 && s.split[0] == 36 && s.split[1] == 12, "%d actions, split %lld/%lld", s.actions,
          (long long)s.split[0], (long long)s.split[1]);
    adt_straggler_free(s.m);
}

static void test_off_never_acts(void) {
    sim s;
    sim_init(&s, 2, 16, adt_straggler_defaults(ADT_STRAGGLER_OFF));
    s.per_sample[1] = 3e-3;
    for (long st = 1; st <= 100; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 100);
    CHECK(s.actions == 0 && s.split[0] == 8, "off: %d actions", s.actions);
    CHECK(adt_straggler_rank_info(s.m, 1)->state == ADT_STRAGGLER_PERSISTENT, "still classified");
    adt_straggler_free(s.m);
}

static void test_nd_restart_only_when_it_pays(void) {
    adt_straggler_cfg cfg = adt_straggler_defaults(ADT_STRAGGLER_ND);
    cfg.restart_cost_s = 10;
    /* rank 1 at 1/3 speed over 48 samples, ranks 0 and 2 normal. After ND's rebalance by speed
     * (3:1:3 of 48 -> per-sample step time 3*48/7 ms), healing rank 1 would give 48/3 = 16 ms:
     * gain per step = 48*3/7 - 16 = 4.571 ms. 10 s cost -> pays after 2188 steps. */
    double gain_per_step = 48.0 * 3 / 7 * 1e-3 - 16e-3;
    long remaining[2] = {1000, 5000};
    for (int c = 0; c < 2; c++) {
        sim s;
        sim_init(&s, 3, 48, cfg);
        for (long st = 1; st <= 5; st++) sim_step(&s, st, ADT_PHASE_TRAIN, remaining[c]);
        s.per_sample[1] = 3e-3;
        for (long st = 6; st <= 60; st++) sim_step(&s, st, ADT_PHASE_TRAIN, remaining[c]);
        int pays = (double)remaining[c] * gain_per_step > cfg.restart_cost_s;
        CHECK(s.restarts == pays, "remaining %ld steps (gain %.1f s vs cost %.1f s): %d restarts", remaining[c],
              remaining[c] * gain_per_step, cfg.restart_cost_s, s.restarts);
        CHECK(s.actions >= 1 && s.first_action == 5 + (cfg.nd_after + 1) / 2, "ND rebalanced at step %ld",
              s.first_action);
        CHECK(s.split[1] < s.split[0] && s.split[1] < s.split[2], "slow rank got less: %lld/%lld/%lld",
              (long long)s.split[0], (long long)s.split[1], (long long)s.split[2]);
        adt_straggler_free(s.m);
    }
}

/* ND's rule for work that cannot move (the master's parameter servers, each answering every pull
 * of a step): 3 servers answering in 1 ms, server 2 in 10 ms from step 6, a monitor without a
 * policy (as the master runs it). A step waits for the slowest answer, so healing server 2 gains
 * 10 - 1 = 9 ms a step: with a 10 s cost the rule pays over 2000 remaining steps (18 s), not over
 * 1000 (9 s); it names server 2 only once per persistent episode, never before it is persistent,
 * and never a normal server. */
static void test_restart_pays_fixed_work(void) {
    adt_straggler_cfg cfg = adt_straggler_defaults(ADT_STRAGGLER_OFF);
    cfg.restart_cost_s = 10;
    long remaining[2] = {1000, 2000};
    for (int c = 0; c < 2; c++) {
        adt_straggler *m = adt_straggler_create(3, &cfg);
        int64_t one[3] = {1, 1, 1};
        int restarts = 0, early = 0;
        double gain = 0;
        for (long st = 1; st <= 40; st++) {
            double t[3] = {1e-3, 1e-3, st >= 6 ? 10e-3 : 1e-3};
            adt_straggler_action act;
            CHECK(adt_straggler_observe(m, st, ADT_PHASE_TRAIN, t, one, one, remaining[c], &act) == 0 &&
                      act.kind == ADT_ACTION_NONE, "observe without a policy: %s", adt_error_message());
            for (int r = 0; r < 3; r++) {
                if (!adt_straggler_restart_pays(m, st, r, one, remaining[c], &act)) continue;
                CHECK(act.kind == ADT_ACTION_RESTART && act.rank == 2, "restart of server %d", act.rank);
                if (adt_straggler_rank_info(m, 2)->state != ADT_STRAGGLER_PERSISTENT) early++;
                restarts++, gain = act.gain;
            }
        }
        int pays = remaining[c] * 9e-3 > cfg.restart_cost_s;
        CHECK(restarts == pays && !early, "remaining %ld steps: %d restarts (%d early); expected %d", remaining[c],
              restarts, early, pays);
        CHECK(!pays || (gain > remaining[c] * 9e-3 * 0.999 && gain < remaining[c] * 9e-3 * 1.001),
              "gain %.3f s; expected %.3f s", gain, remaining[c] * 9e-3);
        adt_straggler_free(m);
    }
}

static void test_phases_and_warmup_not_judged(void) {
    sim s;
    adt_straggler_cfg cfg = adt_straggler_defaults(ADT_STRAGGLER_ND);
    sim_init(&s, 2, 16, cfg);
    s.per_sample[1] = 10e-3; /* the first steps are slow (allocation): not judged */
    for (long st = 1; st <= cfg.warmup_steps; st++) sim_step(&s, st, ADT_PHASE_TRAIN, 100);
    CHECK(adt_straggler_rank_info(s.m, 1)->n_slow == 0, "warmup judged");
    s.per_sample[1] = 1e-3;
    for (long st = cfg.warmup_steps + 1; st <= 40; st++) {
        /* every third step rank 1 evaluates or checkpoints and takes 20x as long */
        int special = st % 3 == 0;
        if (special) s.pause[1] = 0.3;
        sim_step(&s, st, special ? (st % 2 ? ADT_PHASE_EVAL : ADT_PHASE_CKPT) : ADT_PHASE_TRAIN, 100);
    }
    CHECK(adt_straggler_rank_info(s.m, 1)->n_slow == 0 && s.actions == 0, "eval/ckpt steps judged: %lld slow, %d actions",
          (long long)adt_straggler_rank_info(s.m, 1)->n_slow, s.actions);
    adt_straggler_free(s.m);
}

static void test_config_parse(void) {
    adt_straggler_cfg c = adt_straggler_defaults(ADT_STRAGGLER_DD);
    CHECK(adt_straggler_cfg_parse(&c, "k=2,cooldown=7,restart_cost=12.5,first=0,agree=4,refine=2,refine_gain=0.05,"
                                  "refine_max=1") == 0, "%s", adt_error_message());
    CHECK(c.slow_ratio[0] == 2 && c.cooldown == 7 && c.restart_cost_s == 12.5 && c.first_after == 0 && c.agree == 4 &&
          c.refine == 2 && c.refine_gain == 0.05 && c.refine_max == 1, "values");
    const char *bad[] = {"k", "k=", "k=abc", "cooldown=1.5", "nope=1", "k=1", "alpha=0", "gain=1", "persist=0",
                         "first=-1", "first=65", "agree=-1", "refine=65", "refine_gain=1", "refine_max=-1", NULL};
    for (int i = 0; bad[i]; i++) {
        adt_straggler_cfg d = c;
        CHECK(adt_straggler_cfg_parse(&d, bad[i]) != 0, "'%s' accepted", bad[i]);
        CHECK(d.cooldown == 7, "'%s' changed the config", bad[i]);
    }
    adt_straggler_cfg_parse(&c, "nope=1");
    CHECK(strstr(adt_error_message(), "nope") != NULL, "message names the key: %s", adt_error_message());
    adt_straggler_policy p;
    CHECK(adt_straggler_policy_parse("nd", &p) == 0 && p == ADT_STRAGGLER_ND, "nd");
    CHECK(adt_straggler_policy_parse("ND", &p) != 0, "case matters");
}

int main(void) {
    RUN(test_split_closed_form);
    RUN(test_single_pause_no_action);
    RUN(test_alternating_at_most_one);
    RUN(test_persistent_dd_rebalances);
    RUN(test_dd_not_after_nd);
    RUN(test_refine_converges);
    RUN(test_off_never_acts);
    RUN(test_first_decision);
    RUN(test_nd_restart_only_when_it_pays);
    RUN(test_restart_pays_fixed_work);
    RUN(test_phases_and_warmup_not_judged);
    RUN(test_config_parse);
    return check_finish();
}
