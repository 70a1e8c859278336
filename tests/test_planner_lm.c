/*
 * test_planner_lm.c - the shape-level planner of decoder language models (planner.h, lm.c):
 * against closed forms on a cluster built here (memory per device by ZeRO stage and by
 * recomputation as Rajbhandari et al. and Korthikanti et al. count them, tensor-parallel
 * all-reduces by alpha-beta, the 1F1B and interleaved bubble fractions of Narayanan et al.),
 * the search against a brute-force enumeration, bad plans named by their flag, and the model
 * check against Megatron-LM's published weak-scaling runs (Narayanan et al., SC'21, Table 1) on
 * configs/clusters/a100-80g-dgx.json: each row's own configuration predicted within 15% of the
 * published TFLOP/s per GPU, the searched plan at least as fast in the same memory.
 */
#include "check.h"

#include <math.h>
#include <string.h>

#include "adtrain/adtrain.h"
#include "adtrain/planner.h"

#define A100 "configs/clusters/a100-80g-dgx.json"

/* 8 devices per node, 64 nodes; round numbers, no launch cost, full fractions. */
static adt_cluster toy_cluster(void) {
    adt_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "toy");
    snprintf(c.device_kind, sizeof c.device_kind, "toy accelerator");
    c.nodes = 64, c.devices_per_node = 8;
    c.peak_flops[ADT_F32] = 1e13, c.peak_flops[ADT_BF16] = 1e14, c.compute_dtype = ADT_BF16;
    c.matmul_fraction = 0.5, c.efficiency = 0.5, c.memory_fraction = 1;
    c.memory_bytes = 80e9, c.memory_bw = 2e12, c.launch_s = 0;
    c.n_links = 2;
    c.link[0] = (adt_link){.span = 8, .bandwidth = 2e11, .latency = 2e-6, .coll_fraction = 0.75};
    c.link[1] = (adt_link){.span = 512, .bandwidth = 2.5e10, .latency = 5e-6, .coll_fraction = 0.9};
    snprintf(c.link[0].name, sizeof c.link[0].name, "inner");
    snprintf(c.link[1].name, sizeof c.link[1].name, "outer");
    return c;
}

static adt_lm_shape toy_shape(void) { return (adt_lm_shape){.vocab = 32000, .seq = 1024, .layers = 16, .hidden = 2048, .heads = 16}; }

/* Parameters as the SC'21 paper counts them: 12 l h^2 (1 + 13 / 12h + (V + s) / 12 l h). */
static double paper_params(const adt_lm_shape *s) {
    double h = s->hidden, l = s->layers;
    return 12 * l * h * h * (1 + 13 / (12 * h) + ((double)s->vocab + s->seq) / (12 * l * h));
}

static void test_lm_params_flops(void) {
    adt_lm_shape s = {.vocab = 51200, .seq = 2048, .layers = 128, .hidden = 25600, .heads = 160};
    CHECK_CLOSE(adt_lm_params(&s), paper_params(&s) + 2.0 * s.hidden, 1e-12, 0);
    CHECK_CLOSE(adt_lm_params(&s), 1008e9, 0.002, 0); /* the paper's "1008.0 B" */
    /* F = 96 B s l h^2 (1 + s/6h + V/16lh): the 1T row's FLOPs at batch 3072 */
    double F = 96.0 * 3072 * 2048 * 128 * 25600.0 * 25600 * (1 + 2048 / (6.0 * 25600) + 51200 / (16.0 * 128 * 25600));
    CHECK_CLOSE(adt_lm_paper_flops(&s, 3072), F, 1e-12, 0);
    adt_model_cfg m;
    adt_model_cfg_default(&m);
    m.gpt = (adt_gpt_cfg){.vocab_size = 51200, .n_ctx = 2048, .n_layer = 128, .n_embd = 25600, .n_head = 160};
    adt_lm_shape t;
    CHECK(adt_lm_shape_of(&m, &t) == ADT_OK && t.hidden == 25600 && t.layers == 128, "shape of a GPT config");
    CHECK((double)adt_model_cfg_param_count(&m) == adt_lm_params(&t), "the config's count and the planner's agree");
    m.type = ADT_MODEL_MLP;
    CHECK(adt_lm_shape_of(&m, &t) != ADT_OK && strstr(adt_error_message(), "GPT"), "an MLP is refused: %s",
          adt_error_message());
}

/* Memory per device: 2 + 4 + 12 bytes per parameter in mixed precision (bf16 weights, fp32
 * gradients, fp32 master weights and moments: Megatron-LM's 18), ZeRO-1 shards the 12,
 * ZeRO-2 the gradients too, ZeRO-3 the weights (plus two gathered layers); activations per layer
 * s b h (10 + 24/t + 5 a s / h t) bytes, 10 + 24/t selective, 2 full (+ one layer's working set). */
static void test_lm_memory(void) {
    adt_cluster c = toy_cluster();
    adt_lm_shape s = toy_shape();
    double P = adt_lm_params(&s), h = s.hidden, q = s.seq, a = s.heads, L = s.layers;
    for (int z = 0; z <= 3; z++) {
        adt_lm_plan p = {.dp = 8, .tp = 1, .pp = 1, .vstages = 1, .micro_batch = 2, .zero = z,
                         .precision = ADT_LM_BF16, .recompute = ADT_LM_RECOMPUTE_NONE};
        adt_lm_report r;
        CHECK(adt_lm_cost(&s, &c, 64, &p, 0, &r) == ADT_OK, "zero=%d: %s", z, adt_error_message());
        double layer = 12 * h * h + 13 * h;
        CHECK_CLOSE(r.weight_bytes, z >= 3 ? 2 * P / 8 + 2 * 2 * layer : 2 * P, 1e-9, 0);
        CHECK_CLOSE(r.grad_bytes, z >= 2 ? 4 * P / 8 : 4 * P, 1e-9, 0);
        CHECK_CLOSE(r.optim_bytes, z >= 1 ? 12 * P / 8 : 12 * P, 1e-9, 0);
    }
    double bsh = 2 * q * h;
    double per_layer[3] = {bsh * (10 + 24.0 + 5 * a * q / h), bsh * (10 + 24.0), 2 * bsh};
    for (int rc = 0; rc <= 2; rc++) {
        adt_lm_plan p = {.dp = 8, .tp = 1, .pp = 1, .vstages = 1, .micro_batch = 2, .zero = 0,
                         .precision = ADT_LM_BF16, .recompute = rc};
        adt_lm_report r;
        CHECK(adt_lm_cost(&s, &c, 64, &p, 0, &r) == ADT_OK, "%s", adt_error_message());
        /* one microbatch in flight without a pipeline; the embedding's output kept for backward */
        double want = L * per_layer[rc] + (rc == 2 ? per_layer[0] : 0) + 2 * bsh;
        CHECK_CLOSE(r.act_bytes, want, 1e-9, 0);
        CHECK_CLOSE(r.logits_bytes, 2 * 4.0 * 2 * q * s.vocab, 1e-9, 0);
        CHECK_CLOSE(r.peak_mem_bytes, r.weight_bytes + r.grad_bytes + r.optim_bytes + r.act_bytes + r.logits_bytes,
                    1e-12, 0);
    }
    /* 1F1B: the first of p stages keeps p microbatches in flight; f32: 4 + 4 + 8 bytes (a small
     * vocabulary, so that the first stage, not the last with its logits, is the peak) */
    s.vocab = 1024;
    adt_lm_plan p = {.dp = 2, .tp = 1, .pp = 4, .vstages = 1, .micro_batch = 1, .zero = 0,
                     .precision = ADT_LM_F32, .recompute = ADT_LM_RECOMPUTE_FULL};
    adt_lm_report r;
    CHECK(adt_lm_cost(&s, &c, 64, &p, 0, &r) == ADT_OK, "%s", adt_error_message());
    double P0 = (L / 4) * (12 * h * h + 13 * h) + ((double)s.vocab * h + q * h);
    CHECK_CLOSE(r.weight_bytes + r.grad_bytes + r.optim_bytes, 16 * P0, 1e-9, 0);
    double b1 = q * h;
    CHECK_CLOSE(r.act_bytes, 4 * (L / 4) * 2 * b1 * 2 + b1 * (10 + 24 + 5 * a * q / h) * 2 + 4 * 4 * b1, 1e-9, 0);
    /* a tight limit makes it infeasible, the same plan otherwise priced alike */
    adt_lm_report r2;
    CHECK(adt_lm_cost(&s, &c, 64, &p, r.peak_mem_bytes * 0.99, &r2) == ADT_OK && !r2.feasible && r.feasible,
          "a limit below the peak is infeasible");
}

/* Tensor-parallel all-reduces: 4 per layer and microbatch (6 with full recomputation), each
 * 2(t-1) alpha + 2(t-1)/t G / (bw x coll_fraction) over the inner link. */
static void test_lm_tp_comm(void) {
    adt_cluster c = toy_cluster();
    adt_lm_shape s = toy_shape();
    for (int rc = 0; rc <= 2; rc += 2) {
        adt_lm_plan p = {.dp = 8, .tp = 4, .pp = 1, .vstages = 1, .micro_batch = 2, .zero = 0,
                         .precision = ADT_LM_BF16, .recompute = rc};
        adt_lm_report r;
        CHECK(adt_lm_cost(&s, &c, 64, &p, 0, &r) == ADT_OK, "%s", adt_error_message());
        double G = 2.0 * 2 * s.seq * s.hidden, ar = 2 * 3 * 2e-6 + 2 * 3.0 / 4 * G / (2e11 * 0.75);
        int m = 64 / (8 * 2);
        CHECK_CLOSE(r.tp_comm_s, m * s.layers * (rc == 2 ? 6 : 4) * ar, 1e-9, 0);
        CHECK(r.microbatches == m, "microbatches %d", r.microbatches);
    }
}

/* The pipeline bubble: (p - 1) / (v m) of the busy time (Narayanan et al.), on a model whose ends
 * (embedding, logits) are negligible and links free. */
static void test_lm_bubble(void) {
    adt_cluster c = toy_cluster();
    c.link[0].latency = c.link[1].latency = 0, c.link[0].bandwidth = c.link[1].bandwidth = 1e15;
    adt_lm_shape s = {.vocab = 8, .seq = 1024, .layers = 32, .hidden = 4096, .heads = 32};
    for (int v = 1; v <= 4; v *= 2) {
        adt_lm_plan p = {.dp = 1, .tp = 1, .pp = 4, .vstages = v, .micro_batch = 1, .zero = 0,
                         .precision = ADT_LM_BF16, .recompute = ADT_LM_RECOMPUTE_NONE};
        adt_lm_report r;
        CHECK(adt_lm_cost(&s, &c, 16, &p, 0, &r) == ADT_OK, "v=%d: %s", v, adt_error_message());
        double busy = r.step_s - r.bubble_s - r.optimizer_s - r.dp_exposed_s;
        CHECK_CLOSE(r.bubble_s / busy, 3.0 / (v * 16), 0.01, 0);
    }
    adt_lm_plan p = {.dp = 1, .tp = 1, .pp = 4, .vstages = 2, .micro_batch = 1, .zero = 0,
                     .precision = ADT_LM_BF16, .recompute = ADT_LM_RECOMPUTE_NONE};
    adt_lm_report r;
    CHECK(adt_lm_cost(&s, &c, 6, &p, 0, &r) != ADT_OK && strstr(adt_error_message(), "--virtual-stages"),
          "interleaving with microbatches not a multiple of pp is refused: %s", adt_error_message());
}

static void test_lm_bad_plans(void) {
    adt_cluster c = toy_cluster();
    adt_lm_shape s = toy_shape();
    adt_lm_report r;
    struct {
        adt_lm_plan p;
        int batch;
        const char *flag;
    } bad[] = {
        {{.dp = 2, .tp = 3, .pp = 1, .vstages = 1, .micro_batch = 1, .precision = 1}, 64, "--strategy"},
        {{.dp = 2, .tp = 1, .pp = 1, .vstages = 1, .micro_batch = 3, .precision = 1}, 64, "--micro-batch"},
        {{.dp = 2, .tp = 1, .pp = 1, .vstages = 2, .micro_batch = 1, .precision = 1}, 64, "--virtual-stages"},
        {{.dp = 2, .tp = 1, .pp = 3, .vstages = 1, .micro_batch = 1, .precision = 1}, 64, "--strategy"},
        {{.dp = 2, .tp = 1, .pp = 4, .vstages = 3, .micro_batch = 1, .precision = 1}, 64, "--virtual-stages"},
        {{.dp = 2, .tp = 1, .pp = 1, .vstages = 1, .micro_batch = 1, .precision = ADT_LM_F16}, 64, "--precision"},
        {{.dp = 2, .tp = 1, .pp = 1, .vstages = 1, .micro_batch = 1, .precision = 1, .zero = 4}, 64, "--strategy"},
        {{.dp = 512, .tp = 2, .pp = 1, .vstages = 1, .micro_batch = 1, .precision = 1}, 1024, "--strategy"},
    };
    /* the search, too, names a precision the cluster has no peak for */
    c.peak_flops[ADT_BF16] = 0;
    adt_lm_plan fx = {.zero = -1, .precision = ADT_LM_BF16, .recompute = -1}, best;
    CHECK(adt_lm_search(&s, &c, 64, 256, 0, &fx, &best, &r, NULL) != ADT_OK && strstr(adt_error_message(), "--precision"),
          "search without a bf16 peak: %s", adt_error_message());
    c = toy_cluster();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = adt_lm_cost(&s, &c, bad[i].batch, &bad[i].p, 0, &r);
        CHECK(rc != ADT_OK && strstr(adt_error_message(), bad[i].flag), "case %zu: want an error naming %s, got '%s'",
              i, bad[i].flag, rc ? adt_error_message() : "none");
    }
}

/* The search against every plan enumerated here, on 64 devices. */
static void test_lm_search_exhaustive(void) {
    adt_cluster c = toy_cluster();
    adt_lm_shape s = toy_shape();
    for (int limit_gb = 80; limit_gb >= 20; limit_gb -= 30) {
        double lim = limit_gb * 1e9;
        adt_lm_plan fx = {.zero = -1, .precision = -1, .recompute = -1}, best;
        adt_lm_report rb;
        long n = 0;
        CHECK(adt_lm_search(&s, &c, 64, 256, lim, &fx, &best, &rb, &n) == ADT_OK, "%s", adt_error_message());
        double min = INFINITY;
        long priced = 0;
        for (int tp = 1; tp <= 64; tp *= 2)
            for (int pp = 1; pp * tp <= 64; pp *= 2)
                for (int b = 1; b <= 8; b++)
                    for (int v = 1; v <= 4; v++)
                        for (int z = 0; z <= 3; z++)
                            for (int rc = 0; rc <= 2; rc++) {
                                adt_lm_plan p = {.dp = 64 / (tp * pp), .tp = tp, .pp = pp, .vstages = v, .micro_batch = b,
                                                 .zero = z, .precision = ADT_LM_BF16, .recompute = rc};
                                adt_lm_report r;
                                if (adt_lm_cost(&s, &c, 256, &p, lim, &r)) continue;
                                priced++;
                                if (r.feasible && r.step_s < min) min = r.step_s;
                            }
        CHECK(priced > 100, "%ld plans priced", priced);
        CHECK(rb.step_s <= min * (1 + 1e-12), "limit %d GB: search %.6g s, enumeration %.6g s", limit_gb, rb.step_s, min);
        CHECK(rb.feasible && rb.peak_mem_bytes <= lim, "the searched plan fits");
        /* fixed fields hold */
        adt_lm_plan fx2 = {.tp = 2, .zero = 1, .micro_batch = 2, .precision = ADT_LM_BF16, .recompute = ADT_LM_RECOMPUTE_FULL};
        CHECK(adt_lm_search(&s, &c, 64, 256, lim, &fx2, &best, &rb, &n) == ADT_OK && best.tp == 2 && best.zero == 1 &&
                  best.micro_batch == 2 && best.recompute == ADT_LM_RECOMPUTE_FULL,
              "fixed dimensions are kept");
    }
}

/* Narayanan et al. (SC'21) Table 1: params (B), heads, hidden, layers, TP, PP, GPUs, batch,
 * published TFLOP/s per GPU; a few rows across the range (bench/megatron_check.py prints all). */
static void test_lm_megatron(void) {
    adt_cluster c;
    CHECK(adt_cluster_load(&c, A100) == ADT_OK, "%s", adt_error_message());
    if (c.n_links == 0) return;
    static const double rows[][9] = {
        {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
        {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
        {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
        {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const double *w = rows[i];
        adt_lm_shape s = {.vocab = 51200, .seq = 2048, .layers = (int)w[3], .hidden = (int)w[2], .heads = (int)w[1]};
        CHECK_CLOSE(adt_lm_params(&s), w[0] * 1e9, 0.03, 0); /* the paper rounds (1.65 -> "1.7") */
        int gpus = (int)w[6], tp = (int)w[4], pp = (int)w[5];
        adt_lm_plan p = {.dp = gpus / (tp * pp), .tp = tp, .pp = pp, .vstages = 1, .micro_batch = 1, .zero = 0,
                         .precision = ADT_LM_BF16, .recompute = ADT_LM_RECOMPUTE_FULL};
        adt_lm_report r;
        CHECK(adt_lm_cost(&s, &c, (int)w[7], &p, 0, &r) == ADT_OK, "%s", adt_error_message());
        CHECK(r.feasible, "%.1fB: the paper's plan fits (%.1f GiB)", w[0], r.peak_mem_bytes / 1073741824.0);
        CHECK(fabs(r.tflops_per_device / w[8] - 1) <= 0.15, "%.1fB: predicted %.1f TFLOP/s per GPU, published %.0f",
              w[0], r.tflops_per_device, w[8]);
        adt_lm_plan fx = {.zero = -1, .precision = ADT_LM_BF16, .recompute = -1}, best;
        adt_lm_report rb;
        long n = 0;
        CHECK(adt_lm_search(&s, &c, gpus, (int)w[7], 0, &fx, &best, &rb, &n) == ADT_OK, "%s", adt_error_message());
        CHECK(rb.step_s <= r.step_s && rb.peak_mem_bytes <= c.memory_bytes,
              "%.1fB: auto %.4g s vs the paper's plan %.4g s", w[0], rb.step_s, r.step_s);
    }
}

int main(void) {
    RUN(test_lm_params_flops);
    RUN(test_lm_memory);
    RUN(test_lm_tp_comm);
    RUN(test_lm_bubble);
    RUN(test_lm_bad_plans);
    RUN(test_lm_search_exhaustive);
    RUN(test_lm_megatron);
    return check_finish();
}
