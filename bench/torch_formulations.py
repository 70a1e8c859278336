#!/usr/bin/python3
"""Which way of writing each benchmark model is fastest in this PyTorch, on this machine.

Runs bench/torch_peer.py once per formulation, ROUNDS interleaved rounds with the order reversed
every other round, and prints per model the median over rounds of each run's median step time
(--by wall) or CPU time per step (--by cpu, the default: on a machine shared with other work the
wall time mostly measures the others), its spread, and its ratio to the baseline within each
round (median over rounds). The options
that matter for the model (linear layout, attention form, foreach optimizer update, oneDNN
convolutions, zero_grad to None) are tried one at a time against the baseline (the first value
of each), and then all the winners together (--full: every combination instead). The fastest is
what torch_peer.py's FASTEST table should hold.

  /usr/bin/python3 bench/torch_formulations.py [--models gpt-s,mlp,vgg,dlrm] [--rounds 3]
      [--steps 10] [--warmup 3] [--threads 1]
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

AXES = {
    "gpt-s": {"layout": ["linear", "conv1d"], "attn": ["explicit", "baddbmm"],
              "foreach": ["off", "on"], "zero-grad": ["zeros", "none"]},
    "mlp": {"layout": ["linear", "conv1d"], "foreach": ["off", "on"], "zero-grad": ["zeros", "none"]},
    "vgg": {"mkldnn": ["on", "off"], "foreach": ["off", "on"], "zero-grad": ["zeros", "none"]},
    "dlrm": {"layout": ["linear"], "foreach": ["off", "on"], "zero-grad": ["zeros", "none"]},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt-s,mlp,vgg,dlrm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="every combination of the options")
    ap.add_argument("--by", choices=["cpu", "wall"], default="cpu",
                    help="rank by CPU time per step or by wall time per step")
    a = ap.parse_args()
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")
    for model in a.models.split(","):
        if model not in AXES:
            ap.error(f"--models: unknown model '{model}' (expected {', '.join(AXES)})")
        axes = AXES[model]
        if a.full:
            forms = [dict(zip(axes, v)) for v in itertools.product(*axes.values())]
        else:
            base = {k: v[0] for k, v in axes.items()}
            forms = [base] + [{**base, k: v} for k, vals in axes.items() for v in vals[1:]]
        times = {i: [] for i in range(len(forms))}

        def run_round(r, idx):
            order = list(idx) if r % 2 == 0 else list(reversed(idx))
            for i in order:
                cmd = [sys.executable, peer, "--model", model, "--threads", str(a.threads),
                       "--warmup", str(a.warmup), "--steps", str(a.steps)]
                for k, v in forms[i].items():
                    cmd += [f"--{k}", v]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                d = json.loads(out.strip().splitlines()[-1])
                times[i].append(d["cpu_ms_median" if a.by == "cpu" else "step_ms_median"])
                print(f"{model} round {r + 1} {forms[i]}: {times[i][-1]:.2f} ms ({a.by}; wall "
                      f"{d['step_ms_median']:.2f})", file=sys.stderr)

        for r in range(a.rounds):
            run_round(r, range(len(forms)))
        if not a.full:
            # the winners of the one-at-a-time rounds together, against the baseline again
            # a winner: faster than the baseline run of the same round, in most rounds (the median
            # of the per-round ratios; the medians of the runs move with the load between rounds)
            best = dict(forms[0])
            for i in range(1, len(forms)):
                k = next(k for k in axes if forms[i][k] != forms[0][k])
                if statistics.median(x / y for x, y in zip(times[i], times[0])) < 1:
                    best[k] = forms[i][k]
            if best not in forms:  # the baseline runs again beside it (its times appended)
                forms.append(best)
                times[len(forms) - 1] = []
                for r in range(a.rounds):
                    run_round(r, [0, len(forms) - 1])
        med = {i: statistics.median(t) for i, t in times.items()}
        # each run against the baseline's run of the same round (the combination's own rounds
        # are the baseline's last ones)
        paired = {i: statistics.median(x / y for x, y in zip(t, times[0][-len(t):] if i == len(forms) - 1
                                                              and len(times[0]) > a.rounds else times[0]))
                  for i, t in times.items()}
        print(f"\n{model}: {a.rounds} rounds x ({a.warmup} warmup + {a.steps} steps); ms: {a.by} time per step")
        print("| " + " | ".join(axes) + " | median ms | spread | / baseline, same round |")
        print("|" + "---|" * (len(axes) + 3))
        for i in sorted(paired, key=paired.get):  # fastest first, by the per-round ratio
            t = times[i]
            print("| " + " | ".join(forms[i].values()) +
                  f" | {med[i]:.2f} | {min(t):.2f}..{max(t):.2f} | {paired[i]:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
