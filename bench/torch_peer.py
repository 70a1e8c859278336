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
         final LayerNorm, LM head tied to the token embedding.  Attention is
         the plain q@k^T*scale -> causal masked_fill(-inf) -> softmax -> @v
         (--sdpa switches to F.scaled_dot_product_attention where the torch
         version has it; for reference only).  AdamW(lr=3e-4, betas=(0.9,
         0.95), eps=1e-8, weight_decay=0.1) on all parameters.
  mlp    784-1024-1024-10 with ReLU, nn.Linear default init, batch 128,
         SGD(lr=0.01, momentum=0.9).
Both use F.cross_entropy, and random data drawn once after
torch.manual_seed(0) and reused for every step.

Usage (Debian's torch lives in the system interpreter):
  /usr/bin/python3 bench/torch_peer.py --model gpt-s|mlp|all --threads 1 \
      --warmup 3 --steps 20 [--sdpa] [--verbose]

Output, one line per model:
  {"model", "framework": "pytorch", "torch_version", "threads", "batch",
   "params", "step_ms_median", "step_ms_p10", "step_ms_p90", "step_ms_min",
   "steps", "matmul_flops_per_step", ...}
plus a few descriptive fields (warmup, BLAS library and its thread count,
optimizer and which implementation of its update ran, attention variant for
gpt-s).  Percentiles use linear
interpolation between order statistics.  matmul_flops_per_step counts
2*M*N*K for every matrix product autograd executes in one step (see
gpt_matmul_flops / mlp_matmul_flops); it ignores everything that is not a
GEMM.  With --verbose, the time of every step (warmup included) and the loss
go to stderr.
"""

import argparse
import ctypes
import importlib
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# gpt-s
# --------------------------------------------------------------------------

GPT_S = dict(vocab=65, ctx=128, n_layer=4, n_embd=256, n_head=4, batch=8)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, ctx, use_sdpa):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.c_proj.residual_proj = True
        self.use_sdpa = use_sdpa
        # True above the diagonal: positions a query may not attend to.
        mask = torch.ones(ctx, ctx, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask.view(1, 1, ctx, ctx), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(self.mask[:, :, :T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v  # (B, H, T, hd)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLPBlock(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.c_proj.residual_proj = True

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, ctx, use_sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(n_embd, n_head, ctx, use_sdpa)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = MLPBlock(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, ctx, n_layer, n_embd, n_head, use_sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(ctx, n_embd)
        self.h = nn.ModuleList(
            [Block(n_embd, n_head, ctx, use_sdpa) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.register_buffer("pos", torch.arange(ctx), persistent=False)

        # GPT-2 init: N(0, 0.02) weights, N(0, 0.02/sqrt(2*n_layer)) for the
        # projections that write into the residual stream, zero biases;
        # LayerNorm keeps its default weight 1 / bias 0.
        for m in self.modules():
            if isinstance(m, nn.Linear):
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


def build_gpt(args):
    cfg = GPT_S
    model = GPT(cfg["vocab"], cfg["ctx"], cfg["n_layer"], cfg["n_embd"],
                cfg["n_head"], use_sdpa=args.sdpa)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"] + 1))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    flops = gpt_matmul_flops(**cfg)
    extra = {"attention": "sdpa" if args.sdpa else "explicit"}
    return model, (x, y), opt, cfg["batch"], flops, extra


# --------------------------------------------------------------------------
# mlp
# --------------------------------------------------------------------------

MLP_SIZES = (784, 1024, 1024, 10)
MLP_BATCH = 128


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1])
        self.fc2 = nn.Linear(sizes[1], sizes[2])
        self.fc3 = nn.Linear(sizes[2], sizes[3])

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
    model = MLP(MLP_SIZES)
    x = torch.randn(MLP_BATCH, MLP_SIZES[0])
    y = torch.randint(0, MLP_SIZES[-1], (MLP_BATCH,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, (x, y), opt, MLP_BATCH, mlp_matmul_flops(MLP_SIZES, MLP_BATCH), {}


BUILDERS = {"gpt-s": build_gpt, "mlp": build_mlp}


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


def train_step(model, data, opt):
    loss = model(*data)
    loss.backward()
    opt.step()
    opt.zero_grad()  # this version's default for set_to_none
    return loss


def run_and_detect_impl(model, data, opt):
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
        loss = train_step(model, data, opt)
    finally:
        for name, fn in saved.items():
            setattr(mod, name, fn)
    impl = "+".join(sorted(set(called))) if called else "unknown"
    return loss, impl


def bench(name, args, blas):
    torch.manual_seed(0)
    model, data, opt, batch, flops, extra = BUILDERS[name](args)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied weight once

    impl = "unknown"
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        if i == 0:
            # Detection wrappers only on the first step (a warmup step
            # unless --warmup 0; their cost is one Python call).
            loss, impl = run_and_detect_impl(model, data, opt)
        else:
            loss = train_step(model, data, opt)
        ms = (time.perf_counter() - t0) * 1e3
        warm = i < args.warmup
        if not warm:
            times.append(ms)
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
    }
    result.update(extra)
    print(json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["gpt-s", "mlp", "all"], default="all")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sdpa", action="store_true",
                    help="gpt-s: use F.scaled_dot_product_attention "
                         "(reference only; needs a torch that has it)")
    ap.add_argument("--verbose", action="store_true",
                    help="print each step's time to stderr")
    args = ap.parse_args()
    if args.threads < 1 or args.warmup < 0 or args.steps < 1:
        ap.error("need --threads >= 1, --warmup >= 0, --steps >= 1")

    # Thread pools are fixed before any tensor work happens.
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    blas = limit_blas_threads(args.threads)

    names = ["gpt-s", "mlp"] if args.model == "all" else [args.model]
    if args.sdpa and "gpt-s" in names and \
            not hasattr(F, "scaled_dot_product_attention"):
        ap.error(f"--sdpa: torch {torch.__version__} has no "
                 "torch.nn.functional.scaled_dot_product_attention")

    for name in names:
        bench(name, args, blas)


if __name__ == "__main__":
    main()
