"""torch_ps_peer.py - the PyTorch peer of bench/bench_ps.c: the same DLRM (bottom 13-64-16,
dot interaction, top 64-1, BCE with logits) trained on one process, embeddings as
nn.EmbeddingBag(mode="sum", sparse=True) (one id per bag; --kind emb: nn.Embedding(sparse=True))
updated on their sparse gradients by Adagrad (lr 0.05) or SparseAdam (lr 1e-3, --sparse-opt adam),
dense parameters by Adam (lr 1e-3). Ids are Zipf(alpha) ranks over each table (row 0
the most frequent, as synthetic:criteo-zipf), made before the clock starts. Prints one JSON line
like bench_ps's: samples/s over the timed steps, step-time median and spread, last-10 loss.

    /usr/bin/python3 bench/torch_ps_peer.py [--steps 60] [--warmup 10] [--batch 512] [--tables 8]
        [--rows 1000000] [--dim 16] [--alpha 1.05] [--threads 2] [--kind bag|emb]
"""
import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn


class DLRM(nn.Module):
    def __init__(self, tables, rows, dim, kind):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        # one id per sample: a bag of one ("sum") or a plain lookup, both with sparse gradients
        self.bag = kind == "bag"
        self.emb = nn.ModuleList([nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) if self.bag
                                  else nn.Embedding(rows, dim, sparse=True) for _ in range(tables)])
        f = tables + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)
        self.top = nn.Sequential(nn.Linear(dim + f * (f - 1) // 2, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, ids, offsets):
        h = self.bot(x)
        feats = [h] + [e(ids[:, t], offsets) if self.bag else e(ids[:, t]) for t, e in enumerate(self.emb)]
        t = torch.stack(feats, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([h, z], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(steps=60, warmup=10, batch=512, tables=8, rows=1000000, dim=16, threads=2).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--alpha", type=float, default=1.05)
    ap.add_argument("--sparse-opt", choices=["adagrad", "adam"], default="adagrad")
    ap.add_argument("--kind", choices=["bag", "emb"], default="bag")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    cdf = np.cumsum(np.arange(1, a.rows + 1, dtype=np.float64) ** -a.alpha)
    cdf /= cdf[-1]
    S, B = a.steps + a.warmup, a.batch
    ids = np.minimum(np.searchsorted(cdf, rng.random((S, B, a.tables))), a.rows - 1).astype(np.int64)
    ids = torch.from_numpy(ids)
    dense = torch.from_numpy(np.log1p(np.floor(rng.exponential(20.0, (S, B, 13)))).astype(np.float32))
    labels = torch.from_numpy((rng.random((S, B)) < 0.3).astype(np.float32))
    offsets = torch.arange(B)
    m = DLRM(a.tables, a.rows, a.dim, a.kind)
    sparse = (torch.optim.Adagrad(m.emb.parameters(), lr=0.05) if a.sparse_opt == "adagrad"
              else torch.optim.SparseAdam(list(m.emb.parameters()), lr=1e-3))
    dense_opt = torch.optim.Adam([p for n, p in m.named_parameters() if not n.startswith("emb.")], lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    dts, tail = [], 0.0
    for s in range(S):
        if s == a.warmup:
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        sparse.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss = loss_fn(m(dense[s], ids[s], offsets), labels[s])
        loss.backward()
        sparse.step()
        dense_opt.step()
        dts.append(time.perf_counter() - t0)
        if s >= S - 10:
            tail += loss.item() / 10
    wall = time.perf_counter() - t_start
    st = sorted(dts[a.warmup:])
    n = len(st)
    print(json.dumps({"config": "pytorch-1proc", "sparse_opt": a.sparse_opt, "kind": a.kind, "threads": a.threads, "batch": B, "tables": a.tables,
                      "rows": a.rows, "dim": a.dim, "alpha": a.alpha, "steps": a.steps,
                      "samples_per_s": round(B * a.steps / wall, 1), "loss_last10": round(tail, 4),
                      "step": {"n": n, "median_us": round(1e6 * st[n // 2], 1),
                               "p99_us": round(1e6 * st[min(n - 1, n * 99 // 100)], 1),
                               "mean_us": round(1e6 * sum(st) / n, 1), "max_us": round(1e6 * st[-1], 1)}}))


if __name__ == "__main__":
    main()
