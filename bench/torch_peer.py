#!/usr/bin/env python3
"""PyTorch peer for the side-by-side training-step benchmark.

Times one full training step -- forward, loss, backward, optimizer step,
zero_grad -- of a fixed model in eager PyTorch (float32, CPU) and prints one
JSON object per model on stdout, so the numbers can be set next to adtrain's
for the same model, batch and thread count.

Models:
  gpt-s  GPT-2 architecture written out explicitly: vocab 65, context 128,
         4 layers, width 256, 4 heads, batch 8; learned position embeddings,
         pre-LayerNorm (eps 1e-5), GELU(approximate='tanh'), biases everywhere,
         final LayerNorm, LM head tied to the token embedding.  AdamW(lr=3e-4,
         betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) on all parameters.
  mlp    784-1024-1024-10 with ReLU, nn.Linear default init, batch 128,
         SGD(lr=0.01, momentum=0.9).
  vgg    configs/vgg-mnist.json, batch 64; dlrm  configs/dlrm-small.json,
         batch 256; both the modules of the parity fixtures
         (scripts/gen_fixtures.py), SGD as mlp.
All use F.cross_entropy (dlrm: BCE with logits) and random data drawn once
after torch.manual_seed(0) and reused for every step.

Formulation: each model runs the fastest way of writing it found on this
machine (FASTEST below; bench/torch_formulations.py measures them all):
linear layers as nn.Linear or GPT-2's Conv1D (x @ W, W [in, out]);
attention as q@k^T*scale -> masked_fill(-inf) -> softmax -> @v, or one
baddbmm with an additive mask (sdpa where the torch version has it);
the optimizer's foreach update or its per-parameter loop; zero_grad to None
or to zeros; oneDNN convolutions on or off.  The options override it.

Usage (Debian's torch lives in the system interpreter):
  /usr/bin/python3 bench/torch_peer.py --model gpt-s|mlp|vgg|dlrm|all \
      --threads 1 --warmup 3 --steps 20 [--layout linear|conv1d]
      [--attn explicit|baddbmm|sdpa] [--foreach on|off] [--mkldnn on|off]
      [--zero-grad none|zeros] [--verbose]

Output, one line per model:
  {"model", "framework": "pytorch", "torch_version", "threads", "batch",
   "params", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_min",
   "steps", "matmul_flops_per_step", ...}
plus a few descriptive fields (warmup, BLAS library and its thread count,
optimizer and which implementation of its update ran, the formulation,
cpu_ms_median: the process's CPU time per step, all its threads; max_rss_mib:
the process's peak resident set so far).  Percentiles use linear
interpolation between order statistics.  matmul_flops_per_step counts
2*M*N*K for every matrix product autograd executes in one step (see
gpt_matmul_flops / mlp_matmul_flops; 0 for vgg and dlrm); it ignores
everything that is not a GEMM.  With --verbose, the time of every step
(warmup included) and the loss go to stderr.
"""

import argparse
import ctypes
import importlib
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# gpt-s
# --------------------------------------------------------------------------

GPT_S = dict(vocab=65, ctx=128, n_layer=4, n_embd=256, n_head=4, batch=8)


class Conv1D(nn.Module):
    """GPT-2's (Hugging Face) Conv1D: a linear layer with its weight stored [in, out], so the
    forward product is x @ W (addmm) instead of nn.Linear's x @ W^T."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


def linear(n_in, n_out, layout):
    return Conv1D(n_in, n_out) if layout == "conv1d" else nn.Linear(n_in, n_out)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, ctx, attn, layout):
        super().__init__()
        self.n_head = n_head
        self.c_attn = linear(n_embd, 3 * n_embd, layout)
        self.c_proj = linear(n_embd, n_embd, layout)
        self.c_proj.residual_proj = True
        self.attn = attn
        # True above the diagonal: positions a query may not attend to.
        mask = torch.ones(ctx, ctx, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask.view(1, 1, ctx, ctx), persistent=False)
        # The same mask as an additive bias (-inf above the diagonal) for the baddbmm form.
        bias = torch.zeros(ctx, ctx).masked_fill(mask, float("-inf"))
        self.register_buffer("mask_bias", bias, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.attn == "baddbmm":
            # scale, mask and product in one call: bias + scale * q k^T, then softmax
            qf, kf = q.reshape(B * self.n_head, T, hd), k.reshape(B * self.n_head, T, hd)
            att = torch.baddbmm(self.mask_bias[:T, :T].expand(B * self.n_head, T, T), qf,
                                kf.transpose(1, 2), alpha=1.0 / math.sqrt(hd))
            att = F.softmax(att, dim=-1)
            y = torch.bmm(att, v.reshape(B * self.n_head, T, hd)).view(B, self.n_head, T, hd)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, n_embd, layout):
        super().__init__()
        self.c_fc = linear(n_embd, 4 * n_embd, layout)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = linear(4 * n_embd, n_embd, layout)
        self.c_proj.residual_proj = True

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, ctx, attn, layout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, ctx, attn, layout)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLPBlock(n_embd, layout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, ctx, n_layer, n_embd, n_head, attn="explicit", layout="linear"):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(ctx, n_embd)
        self.h = nn.ModuleList(
            [Block(n_embd, n_head, ctx, attn, layout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.register_buffer("pos", torch.arange(ctx), persistent=False)

        # GPT-2 init: N(0, 0.02) weights, N(0, 0.02/sqrt(2*n_layer)) for the
        # projections that write into the residual stream, zero biases;
        # LayerNorm keeps its default weight 1 / bias 0.
        for m in self.modules():
            if isinstance(m, (nn.Linear, Conv1D)):
                std = 0.02
                if getattr(m, "residual_proj", False):
                    std = 0.02 / math.sqrt(2 * n_layer)
                nn.init.normal_(m.weight, mean=0.0, std=std)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(self.pos[:T])
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def gpt_matmul_flops(vocab, ctx, n_layer, n_embd, n_head, batch):
    """GEMM FLOPs of one gpt-s training step.

    With N = B*T tokens, C = width, V = vocab, forward per layer:
        qkv      2 * N * C * 3C
        scores   2 * B*H * T * T * (C/H)  = 2 * B * T^2 * C   (q @ k^T, full
                 T x T: the plain path computes the masked half too)
        att @ v  2 * B * T^2 * C
        proj     2 * N * C * C
        fc       2 * N * C * 4C
        fc-proj  2 * N * 4C * C
      = 24*N*C^2 + 4*B*T^2*C
    plus the LM head 2 * N * C * V once.  In backward every one of these
    products has two operands that need a gradient (weights, and activations
    that trace back to the embeddings; q, k, v, softmax output for the
    attention products), so each costs two more GEMMs of the same size:
        F = 3 * (n_layer * (24*N*C^2 + 4*B*T^2*C) + 2*N*C*V)
    Embedding lookups/scatter-adds are not GEMMs and are not counted.
    """
    B, T, C, V = batch, ctx, n_embd, vocab
    N = B * T
    per_layer = 24 * N * C * C + 4 * B * T * T * C
    forward = n_layer * per_layer + 2 * N * C * V
    return 3 * forward


def make_optimizer(kind, params, args, **kw):
    """torch.optim.<kind> with the update implementation the formulation asks for: foreach
    (multi-tensor) or the per-parameter loop; 1.13 defaults to the latter."""
    return getattr(torch.optim, kind)(params, foreach=args.foreach == "on", **kw)


def build_gpt(args):
    cfg = GPT_S
    model = GPT(cfg["vocab"], cfg["ctx"], cfg["n_layer"], cfg["n_embd"],
                cfg["n_head"], attn=args.attn, layout=args.layout)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"] + 1))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    opt = make_optimizer("AdamW", model.parameters(), args, lr=3e-4, betas=(0.9, 0.95),
                         eps=1e-8, weight_decay=0.1)
    flops = gpt_matmul_flops(**cfg)
    extra = {"attention": args.attn}
    return model, (x, y), opt, cfg["batch"], flops, extra


# --------------------------------------------------------------------------
# mlp
# --------------------------------------------------------------------------

MLP_SIZES = (784, 1024, 1024, 10)
MLP_BATCH = 128


def as_layout(lin, layout):
    """nn.Linear lin, or the same layer (same values) as a Conv1D."""
    if layout != "conv1d":
        return lin
    c = Conv1D(lin.in_features, lin.out_features)
    with torch.no_grad():
        c.weight.copy_(lin.weight.t())
        c.bias.copy_(lin.bias)
    return c


class MLP(nn.Module):
    def __init__(self, sizes, layout="linear"):
        super().__init__()
        self.fc1 = as_layout(nn.Linear(sizes[0], sizes[1]), layout)
        self.fc2 = as_layout(nn.Linear(sizes[1], sizes[2]), layout)
        self.fc3 = as_layout(nn.Linear(sizes[2], sizes[3]), layout)

    def forward(self, x, targets):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return F.cross_entropy(self.fc3(x), targets)


def mlp_matmul_flops(sizes, batch):
    """GEMM FLOPs of one mlp training step.

    Layer i (d_in -> d_out) costs 2 * B * d_in * d_out forward and as much
    again for its weight gradient.  The input gradient (another
    2 * B * d_in * d_out) is computed for every layer except the first,
    whose input is data that needs no gradient:
        F = sum_i 2*B*d_in_i*d_out_i * (3 if i > 0 else 2)
    For 784-1024-1024-10 at B=128 that is 1,224,212,480; counting the first
    layer three times as well would give 1,429,733,376.
    """
    total = 0
    for i in range(len(sizes) - 1):
        gemm = 2 * batch * sizes[i] * sizes[i + 1]
        total += gemm * (3 if i > 0 else 2)
    return total


def build_mlp(args):
    model = MLP(MLP_SIZES, args.layout)
    x = torch.randn(MLP_BATCH, MLP_SIZES[0])
    y = torch.randint(0, MLP_SIZES[-1], (MLP_BATCH,))
    opt = make_optimizer("SGD", model.parameters(), args, lr=0.01, momentum=0.9)
    return model, (x, y), opt, MLP_BATCH, mlp_matmul_flops(MLP_SIZES, MLP_BATCH), {}


# --------------------------------------------------------------------------
# vgg, dlrm: configs/vgg-mnist.json and configs/dlrm-small.json, as the
# modules the parity fixtures use (scripts/gen_fixtures.py); SGD as mlp.
# No GEMM floor for these (matmul_flops_per_step 0: convolutions and the
# interaction are not counted).
# --------------------------------------------------------------------------

VGG_BATCH = 64
DLRM_BATCH = 256


def fixture_models():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    import gen_fixtures  # noqa: E402
    return gen_fixtures


class WithLoss(nn.Module):
    """A module returning logits, with its loss: model(*inputs, targets) -> scalar."""

    def __init__(self, net, loss):
        super().__init__()
        self.net, self.loss = net, loss

    def forward(self, *a):
        return self.loss(self.net(*a[:-1]), a[-1])


def build_vgg(args):
    cfg = json.load(open(os.path.join(CONFIGS, "vgg-mnist.json")))
    net = fixture_models().VGG(cfg["in_channels"], cfg["height"], cfg["width"], cfg["blocks"],
                               cfg["fc"], cfg["classes"])
    model = WithLoss(net, F.cross_entropy)
    x = torch.randn(VGG_BATCH, cfg["in_channels"], cfg["height"], cfg["width"])
    y = torch.randint(0, cfg["classes"], (VGG_BATCH,))
    opt = make_optimizer("SGD", model.parameters(), args, lr=0.01, momentum=0.9)
    return model, (x, y), opt, VGG_BATCH, 0, {}


def build_dlrm(args):
    cfg = json.load(open(os.path.join(CONFIGS, "dlrm-small.json")))
    rows = [cfg["table_rows"]] * cfg["n_tables"]
    net = fixture_models().DLRM(cfg["n_dense"], rows, cfg["emb_dim"], cfg["bottom"], cfg["top"])
    model = WithLoss(net, F.binary_cross_entropy_with_logits)
    dense = torch.randn(DLRM_BATCH, cfg["n_dense"])
    ids = torch.randint(0, cfg["table_rows"], (DLRM_BATCH, cfg["n_tables"]))
    y = torch.randint(0, 2, (DLRM_BATCH,)).float()
    opt = make_optimizer("SGD", model.parameters(), args, lr=0.01, momentum=0.9)
    return model, (dense, ids, y), opt, DLRM_BATCH, 0, {}


CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
BUILDERS = {"gpt-s": build_gpt, "mlp": build_mlp, "vgg": build_vgg, "dlrm": build_dlrm}
MODELS = list(BUILDERS)

# The formulation each model runs by default: the fastest of those tried on this machine
# (bench/torch_formulations.py, CPU time per step against the baseline run of the same round;
# docs/BENCHMARKS.md, "PyTorch's formulation"). --layout/--attn/--foreach/--mkldnn/--zero-grad
# override it. mkldnn only acts on convolutions, attn only on gpt-s.
FASTEST = {
    "gpt-s": dict(layout="linear", attn="explicit", foreach="off", mkldnn="on", zero_grad="zeros"),
    "mlp": dict(layout="linear", attn="explicit", foreach="on", mkldnn="on", zero_grad="zeros"),
    "vgg": dict(layout="linear", attn="explicit", foreach="off", mkldnn="off", zero_grad="zeros"),
    "dlrm": dict(layout="linear", attn="explicit", foreach="off", mkldnn="on", zero_grad="zeros"),
}
FORMULATION_KEYS = ("layout", "attn", "foreach", "mkldnn", "zero_grad")


def formulation(name, args):
    """args with every formulation option left unset filled from FASTEST[name]."""
    f = {k: getattr(args, k, None) or FASTEST[name][k] for k in FORMULATION_KEYS}
    return argparse.Namespace(**{**vars(args), **f})


# --------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------

def limit_blas_threads(n):
    """Cap the BLAS library's own thread pool at n; return (name, threads).

    A torch built against a generic BLAS (Debian's, for one) hands GEMMs to
    whatever libblas the system provides, and torch.set_num_threads does not
    reach e.g. OpenBLAS's pthread pool, which by default uses every core.
    The loaded library is found in /proc/self/maps (Linux) and told directly.
    """
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f
                            if "/" in line and ("blas" in line or "blis" in line)})
    except OSError:
        return "unknown", None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "openblas_set_num_threads"):
            lib.openblas_set_num_threads(n)
            return "openblas", lib.openblas_get_num_threads()
        if hasattr(lib, "bli_thread_set_num_threads"):
            lib.bli_thread_set_num_threads(ctypes.c_long(n))
            lib.bli_thread_get_num_threads.restype = ctypes.c_long
            return "blis", lib.bli_thread_get_num_threads()
    # MKL (if linked) follows torch.set_num_threads; anything else is unknown.
    return ("mkl", n) if torch.backends.mkl.is_available() else ("unknown", None)


# --------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------

def percentile(sorted_vals, q):
    """Linear-interpolation percentile (numpy's default) of a sorted list."""
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def train_step(model, data, opt, set_to_none=False):
    loss = model(*data)
    loss.backward()
    opt.step()
    # set_to_none=True frees the gradients instead of zeroing them (the default from 2.0 on)
    opt.zero_grad(set_to_none=set_to_none)
    return loss


def run_and_detect_impl(model, data, opt, set_to_none):
    """Run one step while noting which update kernel the optimizer called.

    torch.optim dispatches to module-level _single_tensor_* (per-parameter
    loop), _multi_tensor_* (foreach) or _fused_* functions, looked up at call
    time; they are wrapped for this one step only and restored afterwards.
    """
    mod = importlib.import_module(type(opt).__module__)
    kinds = (("_single_tensor_", "single_tensor"), ("_multi_tensor_", "foreach"),
             ("_fused_", "fused"))
    called, saved = [], {}
    for name in dir(mod):
        fn = getattr(mod, name)
        kind = next((k for prefix, k in kinds if name.startswith(prefix)), None)
        if kind is None or not callable(fn):
            continue

        def wrapper(*a, _fn=fn, _kind=kind, **kw):
            called.append(_kind)
            return _fn(*a, **kw)
        saved[name] = fn
        setattr(mod, name, wrapper)
    try:
        loss = train_step(model, data, opt, set_to_none)
    finally:
        for name, fn in saved.items():
            setattr(mod, name, fn)
    impl = "+".join(sorted(set(called))) if called else "unknown"
    return loss, impl


def max_rss_mib():
    """Peak resident set of this process so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench(name, args, blas):
    args = formulation(name, args)
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    set_to_none = args.zero_grad == "none"
    torch.manual_seed(0)
    model, data, opt, batch, flops, extra = BUILDERS[name](args)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied weight once

    impl = "unknown"
    times, cpu = [], []
    for i in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        if i == 0:
            # Detection wrappers only on the first step (a warmup step
            # unless --warmup 0; their cost is one Python call).
            loss, impl = run_and_detect_impl(model, data, opt, set_to_none)
        else:
            loss = train_step(model, data, opt, set_to_none)
        ms = (time.perf_counter() - t0) * 1e3
        cms = (time.process_time() - c0) * 1e3
        warm = i < args.warmup
        if not warm:
            times.append(ms)
            cpu.append(cms)
        if args.verbose:
            tag = "warmup" if warm else "step"
            idx = i if warm else i - args.warmup
            print(f"{name} {tag} {idx}: {ms:.3f} ms  loss {loss.item():.4f}",
                  file=sys.stderr)

    s = sorted(times)
    result = {
        "model": name,
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "threads": args.threads,
        "batch": batch,
        "params": n_params,
        "step_ms_median": round(percentile(s, 50), 4),
        "step_ms_p10": round(percentile(s, 10), 4),
        "step_ms_p90": round(percentile(s, 90), 4),
        "step_ms_min": round(s[0], 4),
        "steps": len(s),
        "matmul_flops_per_step": flops,
        "warmup": args.warmup,
        "blas": blas[0],
        "blas_threads": blas[1],
        "optimizer": type(opt).__name__,
        "optimizer_impl": impl,
        "cpu_ms_median": round(percentile(sorted(cpu), 50), 4),
        "formulation": {k: getattr(args, k) for k in FORMULATION_KEYS},
        "max_rss_mib": round(max_rss_mib(), 1),
    }
    result.update(extra)
    print(json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=MODELS + ["all"], default="all")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layout", choices=["linear", "conv1d"],
                    help="linear layers as nn.Linear (x @ W^T) or GPT-2's Conv1D (x @ W, "
                         "W [in, out]); default: the model's fastest (FASTEST)")
    ap.add_argument("--attn", choices=["explicit", "baddbmm", "sdpa"],
                    help="gpt-s attention: masked_fill + softmax, baddbmm with an additive "
                         "mask, or F.scaled_dot_product_attention (torch >= 2.0)")
    ap.add_argument("--foreach", choices=["on", "off"],
                    help="the optimizer's multi-tensor (foreach) update")
    ap.add_argument("--mkldnn", choices=["on", "off"],
                    help="torch.backends.mkldnn.enabled (oneDNN convolutions)")
    ap.add_argument("--zero-grad", dest="zero_grad", choices=["none", "zeros"],
                    help="zero_grad(set_to_none=True) or zero-filled gradients")
    ap.add_argument("--verbose", action="store_true",
                    help="print each step's time to stderr")
    args = ap.parse_args()
    if args.threads < 1 or args.warmup < 0 or args.steps < 1:
        ap.error("need --threads >= 1, --warmup >= 0, --steps >= 1")

    # Thread pools are fixed before any tensor work happens.
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    blas = limit_blas_threads(args.threads)

    names = MODELS if args.model == "all" else [args.model]
    if args.attn == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        ap.error(f"--attn sdpa: torch {torch.__version__} has no "
                 "torch.nn.functional.scaled_dot_product_attention")

    for name in names:
        bench(name, args, blas)


if __name__ == "__main__":
    main()
