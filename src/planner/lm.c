/*
 * lm.c - decoder language models at scale: a GPT's plan (data, tensor and pipeline degrees,
 * interleaved chunks, micro-batch size, ZeRO stage, precision, recomputation) priced from its
 * shapes, and the search over those plans (planner.h, "decoder language models at scale").
 *
 * The model, in the terms of its papers:
 *  - compute: each kernel of a layer (four weight products and two attention products, Megatron-LM's
 *    tensor split; layer norms, softmax, dropouts, bias-GeLU) on a roofline, max(FLOPs / (peak x
 *    matmul_fraction), bytes / (memory_bw x memory_fraction)) + launch_s; backward twice a product's
 *    FLOPs and twice an elementwise kernel's bytes; recomputation adds the forward again.
 *  - collectives: alpha-beta, ring all-reduce 2(n-1) alpha + 2(n-1)/n G / bw; a group within a node
 *    at the inner link, across nodes at its share of the node's links (k members per node: k x the
 *    per-device bandwidth), each times the link's coll_fraction (NCCL's bus bandwidth).
 *  - pipeline: 1F1B, m t_max + (sum t_i - t_max) / v (Narayanan et al., SC'21: bubble (p-1)/(v m)).
 *  - data parallelism: the gradient reduction overlaps the stage's last backward pass; ZeRO-1 and
 *    -2 gather the updated weights after the step, ZeRO-3 gathers them per microbatch (prefetched
 *    under its compute).
 *  - memory: weights, gradients and optimizer state by ZeRO stage (Rajbhandari et al.; bf16
 *    weights, fp32 gradients, 12 bytes of fp32 master weights and Adam moments, 18 bytes per
 *    parameter as Megatron-LM's distributed-optimizer table counts them); activations per layer as Korthikanti et al. (2022):
 *    s b h (10 + 24/t + 5 a s / h t) (2-byte values), 10 + 24/t with selective recomputation, 2
 *    with full, times the microbatches in flight on the stage.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"

const char *adt_lm_precision_name(int p) { return p == ADT_LM_BF16 ? "bf16" : p == ADT_LM_F16 ? "f16" : "f32"; }
const char *adt_lm_recompute_name(int r) {
    return r == ADT_LM_RECOMPUTE_FULL ? "full" : r == ADT_LM_RECOMPUTE_SELECTIVE ? "selective" : "none";
}
int adt_lm_precision_parse(const char *s) {
    for (int p = 0; p < 3; p++)
        if (!strcmp(s, adt_lm_precision_name(p))) return p;
    return -1;
}
int adt_lm_recompute_parse(const char *s) {
    for (int r = 0; r < 3; r++)
        if (!strcmp(s, adt_lm_recompute_name(r))) return r;
    return -1;
}

int adt_lm_shape_of(const adt_model_cfg *m, adt_lm_shape *s) {
    if (m->type != ADT_MODEL_GPT)
        return adt_error(ADT_ERR_ARG, "the shape-level planner prices GPT models; this model is '%s'",
                         adt_model_type_name(m->type));
    *s = (adt_lm_shape){.vocab = m->gpt.vocab_size, .seq = m->gpt.n_ctx, .layers = m->gpt.n_layer,
                        .hidden = m->gpt.n_embd, .heads = m->gpt.n_head};
    return ADT_OK;
}

/* A layer's parameters: 12 h^2 weights and 13 h biases and norms (models/config.c's count). */
static double layer_params(const adt_lm_shape *s) { return 12.0 * s->hidden * s->hidden + 13.0 * s->hidden; }

double adt_lm_params(const adt_lm_shape *s) {
    return (double)s->vocab * s->hidden + (double)s->seq * s->hidden + s->layers * layer_params(s) + 2.0 * s->hidden;
}

double adt_lm_paper_flops(const adt_lm_shape *s, double batch) {
    double h = s->hidden, l = s->layers, q = s->seq, V = s->vocab;
    return 96.0 * batch * q * l * h * h * (1.0 + q / (6.0 * h) + V / (16.0 * l * h));
}

/* ---- the device and its links --------------------------------------------------------------- */

typedef struct lm_dev {
    double mm_rate;  /* FLOP/s of a large matrix product in the precision */
    double mem_bw;   /* bytes/s a streaming kernel moves */
    double launch;   /* seconds per kernel */
    double e;        /* bytes per value of the compute dtype */
} lm_dev;

static double peak_of(const adt_cluster *c, int prec) {
    return prec == ADT_LM_F16 ? c->peak_f16 : c->peak_flops[prec == ADT_LM_BF16 ? ADT_BF16 : ADT_F32];
}

static double frac_or_1(double f) { return f > 0 ? f : 1.0; }

static lm_dev dev_of(const adt_cluster *c, int prec) {
    double mf = c->matmul_fraction > 0 ? c->matmul_fraction : c->efficiency;
    return (lm_dev){.mm_rate = peak_of(c, prec) * mf, .mem_bw = c->memory_bw * frac_or_1(c->memory_fraction),
                    .launch = c->launch_s, .e = prec == ADT_LM_F32 ? 4.0 : 2.0};
}

/* One kernel on the roofline. */
static double kern(const lm_dev *d, double flops, double bytes) {
    double a = flops / d->mm_rate, b = bytes / d->mem_bw;
    return (a > b ? a : b) + d->launch;
}

/* A product of an (M x K) by a (K x N) matrix: its FLOPs and the bytes of its three operands. */
static double gemm(const lm_dev *d, double M, double K, double N) {
    return kern(d, 2.0 * M * K * N, d->e * (M * K + K * N + M * N));
}

/* A communication group: n ranks, `stride` apart in device ids (Megatron's order). */
typedef struct lm_group {
    int n;
    double alpha, bw; /* seconds per ring step; bytes/s of the group's bus */
} lm_group;

static lm_group group_of(const adt_cluster *c, int n, int stride) {
    lm_group g = {.n = n};
    if (n <= 1) return g;
    long extent = (long)stride * (n - 1) + 1;
    int L = 0;
    while (L + 1 < c->n_links && c->link[L].span < extent) L++;
    const adt_link *k = &c->link[L];
    g.alpha = k->latency;
    if (L == 0 || extent <= c->devices_per_node) {
        g.bw = k->bandwidth * frac_or_1(k->coll_fraction);
        return g;
    }
    /* across nodes: the node's groups of this kind run at once, each on its members' links */
    int per_node = stride >= c->devices_per_node ? 1 : c->devices_per_node / stride;
    if (per_node > n) per_node = n;
    double inter = per_node * k->bandwidth * frac_or_1(k->coll_fraction);
    double intra = per_node > 1 ? c->link[0].bandwidth * frac_or_1(c->link[0].coll_fraction) : inter;
    g.bw = inter < intra ? inter : intra;
    return g;
}

static double all_reduce(const lm_group *g, double bytes) {
    if (g->n <= 1 || bytes <= 0) return 0;
    return 2.0 * (g->n - 1) * g->alpha + 2.0 * (g->n - 1) / g->n * bytes / g->bw;
}
/* reduce-scatter or all-gather of `bytes` (the whole buffer): half an all-reduce */
static double half_ring(const lm_group *g, double bytes) {
    if (g->n <= 1 || bytes <= 0) return 0;
    return (g->n - 1) * g->alpha + (double)(g->n - 1) / g->n * bytes / g->bw;
}
static double send(const lm_group *g, double bytes) { return g->n <= 1 ? 0 : g->alpha + bytes / g->bw; }

/* ---- one layer ------------------------------------------------------------------------------- */

typedef struct lm_layer {
    double fwd, bwd, recompute; /* seconds per microbatch, TP all-reduces included */
    double tp_comm;             /* of which TP all-reduces (fwd + bwd + recompute)  */
    double act_bytes;           /* kept for backward per microbatch                  */
    double work_bytes;          /* a layer's full set, live while it is recomputed   */
} lm_layer;

static lm_layer layer_cost(const adt_lm_shape *s, const lm_dev *d, const lm_group *tp, int b, int recompute) {
    double t = tp->n, h = s->hidden, q = s->seq, a = s->heads, e = d->e;
    double bs = (double)b * q, bsh = bs * h, att = (double)b * a / t * q * q; /* score elements */
    /* weight products (QKV, projection, FC1, FC2) and the attention products per head group */
    double mm = gemm(d, bs, h, 3 * h / t) + gemm(d, bs, h / t, h) + gemm(d, bs, h, 4 * h / t) + gemm(d, bs, 4 * h / t, h);
    double core_mm = 2 * kern(d, 2.0 * b * q * q * h / t, e * (att + 2 * bsh / t));
    /* memory-bound kernels: 2 layer norms, scale-mask-softmax, attention dropout (1-byte mask),
     * 2 bias-dropout-adds, bias-GeLU; norms and residuals on every TP rank (no sequence split) */
    double ln = 2 * kern(d, 0, 2 * e * bsh);
    double core_ew = kern(d, 0, 2 * e * att) + kern(d, 0, (2 * e + 1) * att);
    double ew = ln + 2 * kern(d, 0, (3 * e + 1) * bsh) + kern(d, 0, 2 * e * 4 * bsh / t) +
                kern(d, 0, 2 * e * bsh / t); /* the heads' context back to rows: a copy */
    double ar = all_reduce(tp, e * bsh);
    lm_layer L;
    L.fwd = mm + core_mm + ew + core_ew + 2 * ar;
    /* backward: each product twice (input and weight gradients), each elementwise kernel reads
     * the gradient and what it saved and writes one: twice its bytes */
    double ew_b = 2 * (ew + core_ew) - 8 * d->launch; /* the forward's 8 kernels, twice the bytes */
    /* each microbatch's weight gradients added into the step's buffer (fp32 below f32): read
     * the product's gradient, read and write the buffer */
    double acc = kern(d, 0, (e + 8) * layer_params(s) / t);
    L.bwd = 2 * (mm + core_mm) + ew_b + acc + 2 * ar;
    L.recompute = recompute == ADT_LM_RECOMPUTE_FULL ? L.fwd : recompute == ADT_LM_RECOMPUTE_SELECTIVE ? core_mm + core_ew : 0;
    L.tp_comm = (recompute == ADT_LM_RECOMPUTE_FULL ? 6 : 4) * ar;
    /* Korthikanti et al.: s b h (10 + 24/t + 5 a s / h t) bytes at 2 bytes a value */
    double full = bsh * (10 + 24 / t + 5 * a * q / (h * t)) * e / 2;
    L.work_bytes = full;
    L.act_bytes = recompute == ADT_LM_RECOMPUTE_FULL ? 2 * bsh * e / 2
                  : recompute == ADT_LM_RECOMPUTE_SELECTIVE ? bsh * (10 + 24 / t) * e / 2
                                                            : full;
    return L;
}

/* ---- the plan ---------------------------------------------------------------------------------- */

static int check_plan(const adt_lm_shape *s, const adt_cluster *c, int batch, const adt_lm_plan *p) {
    int n = p->dp * p->tp * p->pp;
    if (p->dp < 1 || p->tp < 1 || p->pp < 1)
        return adt_error(ADT_ERR_ARG, "--strategy: degrees must be at least 1 (dp=%d, tp=%d, pp=%d)", p->dp, p->tp, p->pp);
    if (n > adt_cluster_devices(c))
        return adt_error(ADT_ERR_ARG, "--strategy: dp x tp x pp = %d devices, but the cluster '%s' has %d", n, c->name,
                         adt_cluster_devices(c));
    if (s->heads % p->tp || s->hidden % p->tp)
        return adt_error(ADT_ERR_ARG, "--strategy: tp=%d must divide n_head (%d) and n_embd (%d)", p->tp, s->heads,
                         s->hidden);
    if (s->layers % p->pp)
        return adt_error(ADT_ERR_ARG, "--strategy: pp=%d must divide n_layer (%d)", p->pp, s->layers);
    if (p->vstages < 1) return adt_error(ADT_ERR_ARG, "--virtual-stages: expected at least 1, got %d", p->vstages);
    if (s->layers % (p->pp * p->vstages))
        return adt_error(ADT_ERR_ARG, "--virtual-stages: pp=%d x %d chunks must divide n_layer (%d)", p->pp, p->vstages,
                         s->layers);
    if (p->vstages > 1 && p->pp < 2)
        return adt_error(ADT_ERR_ARG, "--virtual-stages: %d chunks need a pipeline (pp >= 2)", p->vstages);
    if (p->micro_batch < 1) return adt_error(ADT_ERR_ARG, "--micro-batch: expected at least 1, got %d", p->micro_batch);
    if (batch % ((long)p->dp * p->micro_batch))
        return adt_error(ADT_ERR_ARG, "--micro-batch: dp=%d x micro-batch %d must divide --batch %d", p->dp,
                         p->micro_batch, batch);
    int m = batch / (p->dp * p->micro_batch);
    if (p->vstages > 1 && m % p->pp)
        return adt_error(ADT_ERR_ARG, "--virtual-stages: the interleaved schedule needs the microbatches (%d) to be a "
                         "multiple of pp=%d", m, p->pp);
    if (p->zero < 0 || p->zero > 3) return adt_error(ADT_ERR_ARG, "--strategy: zero=%d, expected 0 to 3", p->zero);
    if (p->precision < 0 || p->precision > 2 || !(peak_of(c, p->precision) > 0))
        return adt_error(ADT_ERR_ARG, "--precision: the cluster '%s' gives no peak for %s (device.peak_flops.%s)", c->name,
                         adt_lm_precision_name(p->precision), adt_lm_precision_name(p->precision));
    if (p->recompute < 0 || p->recompute > 2)
        return adt_error(ADT_ERR_ARG, "--recompute: expected none, selective or full");
    return ADT_OK;
}

int adt_lm_cost(const adt_lm_shape *s, const adt_cluster *c, int batch, const adt_lm_plan *p, double mem_limit,
                adt_lm_report *r) {
    int rc = check_plan(s, c, batch, p);
    if (rc) return rc;
    memset(r, 0, sizeof *r);
    lm_dev d = dev_of(c, p->precision);
    lm_group tp = group_of(c, p->tp, 1), dp = group_of(c, p->dp, p->tp), pp = group_of(c, p->pp, p->tp * p->dp);
    int m = batch / (p->dp * p->micro_batch), v = p->vstages, b = p->micro_batch;
    double h = s->hidden, q = s->seq, V = s->vocab, t = p->tp, e = d.e;
    double bsh = (double)b * q * h;
    lm_layer L = layer_cost(s, &d, &tp, b, p->recompute);
    int per_stage = s->layers / p->pp;

    /* the ends: embedding lookup (+ its vocab-parallel all-reduce) on the first stage; the final
     * norm, the logits product and the fp32 cross-entropy on the last */
    double emb = kern(&d, 0, 2 * e * bsh) + all_reduce(&tp, e * bsh);
    double emb_b = kern(&d, 0, 2 * e * bsh + (double)V / t * h * 4);
    double logits_f = kern(&d, 0, 2 * e * bsh) + gemm(&d, b * q, h, V / t) + kern(&d, 0, (e + 8) * b * q * V / t) +
                      3 * all_reduce(&tp, 4.0 * b * q);
    double logits_b = kern(&d, 0, 4 * e * bsh) + 2 * gemm(&d, b * q, h, V / t) + kern(&d, 0, (e + 8) * b * q * V / t) +
                      all_reduce(&tp, e * bsh);
    /* a stage boundary: the activation (or its gradient) split over the TP ranks, each on its own link */
    double p2p = p->pp > 1 ? send(&pp, e * bsh / t) : 0;

    /* parameters on a device of each stage, and their gradient synchronisation */
    double layer_p = layer_params(s) / t, emb_p = (V * h + q * h) / t, last_p = (p->pp > 1 ? V * h / t : 0) + 2 * h;
    /* gradients live, and are reduced, in an fp32 buffer whatever the compute dtype (Megatron-LM:
     * bf16 weights with fp32 gradients, 2 + 4 + 12 = 18 bytes per parameter) */
    double e_grad = 4, worst_step_tail = 0, t_max = 0, t_sum = 0, peak = 0;
    double best_parts[5] = {0};
    for (int i = 0; i < p->pp; i++) {
        int first = i == 0, last = i == p->pp - 1;
        double P = per_stage * layer_p + (first ? emb_p : 0) + (last ? last_p : 0);
        /* one microbatch through the stage's v chunks, forward and backward */
        double comp = per_stage * (L.fwd + L.bwd + L.recompute) + (first ? emb + emb_b : 0) + (last ? logits_f + logits_b : 0);
        /* per chunk and microbatch the activation crosses one boundary forward and its gradient
         * one backward (Megatron's paired send/receive: both directions at once) */
        double ti = comp + 2.0 * v * p2p;
        /* ZeRO-3: each microbatch gathers the weights for the forward (and the recompute) and the
         * backward, and reduce-scatters the gradients, prefetched under the compute */
        double zero3 = 0;
        if (p->zero == 3) {
            double gathers = p->recompute == ADT_LM_RECOMPUTE_FULL ? 3 : 2;
            /* layer by layer: each gather and reduce-scatter pays its ring's latency per layer */
            double lat = per_stage * (dp.n - 1) * dp.alpha;
            zero3 = gathers * (half_ring(&dp, e * P) + lat) + half_ring(&dp, e_grad * P) + lat;
            if (zero3 > ti) ti = zero3;
        }
        if (ti > t_max) t_max = ti;
        t_sum += ti;
        /* the step's tail on this stage: the gradient reduction not hidden behind the last
         * backward pass, ZeRO's gather of the updated weights, the optimizer, the tied
         * embedding's all-reduce between the first and the last stage */
        double reduce = 0, gather = 0, bwd_last = per_stage / v * L.bwd;
        if (p->zero == 0) reduce = all_reduce(&dp, e_grad * P);
        else if (p->zero <= 2) reduce = half_ring(&dp, e_grad * P) * (p->zero == 2 ? m : 1), gather = half_ring(&dp, e * P);
        double hidden_under = p->zero == 2 ? (m - 1) * per_stage * L.bwd + bwd_last : bwd_last;
        double exposed = reduce - hidden_under;
        double last_bucket = per_stage > 0 ? reduce / (per_stage * (p->zero == 2 ? m : 1)) : reduce;
        if (exposed < last_bucket) exposed = last_bucket;
        if (p->zero == 3) exposed = 0;
        double shard = p->zero >= 1 ? p->dp : 1;
        double opt_bytes = e == 4 ? 28.0 : 30.0; /* Adam: read w,m,v,g and write w,m,v (+ the bf16 copy) */
        double opt = kern(&d, 0, opt_bytes * P / shard);
        double tied = (p->pp > 1 && (first || last)) ? all_reduce(&(lm_group){.n = 2, .alpha = pp.alpha, .bw = pp.bw},
                                                                    e_grad * V * h / t)
                                                     : 0;
        double tail = exposed + gather + opt + tied;
        if (tail > worst_step_tail) {
            worst_step_tail = tail;
            r->dp_comm_s = reduce + gather + zero3 * m;
            r->dp_exposed_s = exposed + gather;
            r->optimizer_s = opt;
        }
        /* memory: state by ZeRO stage, activations of the microbatches in flight */
        double w_b = e * P / (p->zero >= 3 ? p->dp : 1) + (p->zero >= 3 ? 2 * e * layer_p : 0);
        double g_b = e_grad * P / (p->zero >= 2 ? p->dp : 1);
        double o_b = (e == 4 ? 8.0 : 12.0) * P / (p->zero >= 1 ? p->dp : 1);
        double chunks;
        if (v == 1) chunks = p->pp - i < m ? p->pp - i : m;
        else {
            chunks = 2.0 * (p->pp - i - 1) + (v - 1.0) * p->pp + 1;
            if (chunks > (double)m * v) chunks = (double)m * v;
        }
        double act = chunks * (per_stage / v) * L.act_bytes + (p->recompute == ADT_LM_RECOMPUTE_FULL ? L.work_bytes : 0) +
                     (first ? chunks * e * bsh : 0);
        double lg = last ? 2 * 4.0 * b * q * V / t : 0;
        double mem = w_b + g_b + o_b + act + lg;
        if (mem > peak) {
            peak = mem;
            best_parts[0] = w_b, best_parts[1] = g_b, best_parts[2] = o_b, best_parts[3] = act, best_parts[4] = lg;
        }
    }
    double pipe = m * t_max + (t_sum - t_max) / v;
    r->microbatches = m;
    r->step_s = pipe + worst_step_tail;
    r->bubble_s = pipe - m * t_max;
    r->compute_s = m * (per_stage * (L.fwd + L.bwd + L.recompute) - per_stage * L.tp_comm);
    r->tp_comm_s = m * per_stage * L.tp_comm;
    r->p2p_s = m * 2.0 * v * p2p;
    r->peak_mem_bytes = peak;
    r->weight_bytes = best_parts[0], r->grad_bytes = best_parts[1], r->optim_bytes = best_parts[2];
    r->act_bytes = best_parts[3], r->logits_bytes = best_parts[4];
    r->feasible = peak <= (mem_limit > 0 ? mem_limit : c->memory_bytes);
    r->model_flops = adt_lm_paper_flops(s, batch);
    r->tflops_per_device = r->model_flops / r->step_s / ((double)p->dp * p->tp * p->pp) / 1e12;
    /* MFU: the model's FLOPs without recomputation (3/4 of the paper's F) over the peak */
    r->mfu = 0.75 * r->tflops_per_device * 1e12 / peak_of(c, p->precision);
    return ADT_OK;
}

/* ---- the search ------------------------------------------------------------------------------------ */

int adt_lm_search(const adt_lm_shape *s, const adt_cluster *c, int devices, int batch, double mem_limit,
                  const adt_lm_plan *fx, adt_lm_plan *best, adt_lm_report *out, long *evaluated) {
    long n_eval = 0;
    int found = 0;
    adt_lm_report r;
    int prec = fx->precision >= 0 ? fx->precision : (c->compute_dtype == ADT_BF16 ? ADT_LM_BF16 : ADT_LM_F32);
    if (prec > 2 || !(peak_of(c, prec) > 0))
        return adt_error(ADT_ERR_ARG, "--precision: the cluster '%s' gives no peak for %s (device.peak_flops.%s)", c->name,
                         adt_lm_precision_name(prec), adt_lm_precision_name(prec));
    for (int tpd = 1; tpd <= devices; tpd++) {
        if (devices % tpd || (fx->tp && fx->tp != tpd) || s->heads % tpd || s->hidden % tpd) continue;
        for (int ppd = 1; ppd <= devices / tpd && ppd <= s->layers; ppd++) {
            if ((devices / tpd) % ppd || (fx->pp && fx->pp != ppd) || s->layers % ppd) continue;
            int dpd = devices / (tpd * ppd);
            if ((fx->dp && fx->dp != dpd) || batch % dpd) continue;
            int per_replica = batch / dpd;
            for (int b = 1; b <= per_replica && b <= 64; b++) {
                if (per_replica % b || (fx->micro_batch && fx->micro_batch != b)) continue;
                int m = per_replica / b;
                for (int v = 1; v <= 8 && ppd * v <= s->layers; v++) {
                    if ((fx->vstages && fx->vstages != v) || s->layers % (ppd * v)) continue;
                    if (v > 1 && (ppd < 2 || m % ppd)) continue;
                    for (int z = 0; z <= 3; z++) {
                        if (fx->zero >= 0 && fx->zero != z) continue;
                        if (z && dpd == 1) continue;
                        for (int rc = 0; rc <= 2; rc++) {
                            if (fx->recompute >= 0 && fx->recompute != rc) continue;
                            adt_lm_plan p = {.dp = dpd, .tp = tpd, .pp = ppd, .vstages = v, .micro_batch = b,
                                             .zero = z, .precision = prec, .recompute = rc};
                            if (adt_lm_cost(s, c, batch, &p, mem_limit, &r)) continue;
                            n_eval++;
                            if (!r.feasible || (found && r.step_s >= out->step_s)) continue;
                            *best = p, *out = r, found = 1;
                        }
                    }
                }
            }
        }
    }
    if (evaluated) *evaluated = n_eval;
    if (!n_eval)
        return adt_error(ADT_ERR_ARG, "no plan of %d devices splits --batch %d (%d sequences) over its data-parallel "
                         "degree and micro-batches with the given dimensions", devices, batch, batch);
    if (!found)
        return adt_error(ADT_ERR_ARG, "no plan of %d devices fits %.4g GiB per device (%ld plans priced)", devices,
                         (mem_limit > 0 ? mem_limit : c->memory_bytes) / (1024.0 * 1024 * 1024), n_eval);
    return ADT_OK;
}
