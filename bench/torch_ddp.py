#!/usr/bin/python3
"""PyTorch DistributedDataParallel peer for the data-parallel benchmark.

Runs the models of torch_peer.py (gpt-s: batch 8 per rank, AdamW; mlp: batch 128 per rank,
SGD with momentum), the same modules in the same formulation (torch_peer.formulation: the fastest
found for the model unless --layout/--attn/--foreach/--zero-grad say otherwise), on WORLD
processes of one thread each, DDP over the gloo backend on
loopback, and prints one JSON object per model: the median step time over the ranks' synchronised
steps and the aggregate throughput in samples/s (world x per-rank batch / step time). With
--world 1 the model runs plain, without DDP: the single-rank yardstick of scaling efficiency.

  /usr/bin/python3 bench/torch_ddp.py --model gpt-s|mlp|all --world 2 --warmup 3 --steps 20

Each step is timed on rank 0 between barriers so that the slowest rank sets the time, as it does
for the job. max_rss_mib is the largest peak resident set of the ranks (rank_max_rss_mib each).
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer as tp  # noqa: E402


def run_rank(rank, world, args, init_file, out_q):
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    tp.limit_blas_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    names = ["gpt-s", "mlp"] if args.model == "all" else [args.model]
    for name in names:
        form = tp.formulation(name, args)
        torch.backends.mkldnn.enabled = form.mkldnn == "on"
        torch.manual_seed(0)  # every rank starts from the same weights, as DDP requires anyway
        model, data, opt, batch, _, _ = tp.BUILDERS[name](form)
        torch.manual_seed(1 + rank)  # each rank its own samples
        data = tuple(torch.randint_like(d, 0, 10) if d.dtype == torch.int64 else torch.randn_like(d) for d in data)
        if world > 1:
            # The models' buffers are constants built alike on every rank (the GPT's causal mask, as
            # bool and as an additive float bias, and its positions); none is state that training
            # changes (no batch norm), so DDP does not broadcast them every step (gloo cannot
            # broadcast a bool tensor anyway).
            consts = [n for n, _ in model.named_buffers()]
            torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, consts)
            model = torch.nn.parallel.DistributedDataParallel(model)
        model.train()
        times = []
        for i in range(args.warmup + args.steps):
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
            tp.train_step(model, data, opt, form.zero_grad == "none")
            if world > 1:
                dist.barrier()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        rss = [0.0] * world
        rss[rank] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        if world > 1:
            t = torch.tensor(rss, dtype=torch.float64)
            dist.all_reduce(t)  # each rank filled its own slot
            rss = t.tolist()
        if rank == 0:
            s = sorted(times)
            med = tp.percentile(s, 50)
            out_q.put({"model": name, "framework": "pytorch-ddp" if world > 1 else "pytorch", "backend": "gloo",
                       "world": world, "batch_per_rank": batch, "torch_version": torch.__version__,
                       "step_ms_median": round(med, 4), "step_ms_p10": round(tp.percentile(s, 10), 4),
                       "step_ms_p90": round(tp.percentile(s, 90), 4), "steps": len(s),
                       "samples_per_s": round(world * batch / (med / 1e3), 2),
                       "formulation": {k: getattr(form, k) for k in tp.FORMULATION_KEYS},
                       "rank_max_rss_mib": [round(r, 1) for r in rss], "max_rss_mib": round(max(rss), 1)})
    if world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["gpt-s", "mlp", "all"], default="all")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layout", choices=["linear", "conv1d"])
    ap.add_argument("--attn", choices=["explicit", "baddbmm"])
    ap.add_argument("--foreach", choices=["on", "off"])
    ap.add_argument("--zero-grad", dest="zero_grad", choices=["none", "zeros"])
    ap.add_argument("--mkldnn", choices=["on", "off"])
    args = ap.parse_args()
    if args.world < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("need --world >= 1, --steps >= 1, --warmup >= 0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "rdzv")
        procs = [ctx.Process(target=run_rank, args=(r, args.world, args, init_file, q)) for r in range(args.world)]
        for p in procs:
            p.start()
        n = 2 if args.model == "all" else 1
        results = [q.get(timeout=1800) for _ in range(n)]
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            sys.exit(f"torch_ddp.py: a rank failed: exit codes {[p.exitcode for p in procs]}")
    for r in results:
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
