#!/usr/bin/python3
"""Which way of writing each benchmark model is fastest in this PyTorch, on this machine.

Runs bench/torch_peer.py once per formulation (the product of the options that matter for the
model: linear layout, attention form, foreach optimizer update, oneDNN convolutions, zero_grad to
None), ROUNDS interleaved rounds with the order reversed every other round, and prints per model
the median over rounds of each run's median step time, its spread, and the ratio to the fastest.
The fastest is what torch_peer.py's FASTEST table should hold.

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
    a = ap.parse_args()
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")
    for model in a.models.split(","):
        if model not in AXES:
            ap.error(f"--models: unknown model '{model}' (expected {', '.join(AXES)})")
        axes = AXES[model]
        forms = [dict(zip(axes, v)) for v in itertools.product(*axes.values())]
        times = {i: [] for i in range(len(forms))}
        for r in range(a.rounds):
            order = range(len(forms)) if r % 2 == 0 else reversed(range(len(forms)))
            for i in order:
                cmd = [sys.executable, peer, "--model", model, "--threads", str(a.threads),
                       "--warmup", str(a.warmup), "--steps", str(a.steps)]
                for k, v in forms[i].items():
                    cmd += [f"--{k}", v]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                times[i].append(json.loads(out.strip().splitlines()[-1])["step_ms_median"])
                print(f"{model} round {r + 1} {forms[i]}: {times[i][-1]:.2f} ms", file=sys.stderr)
        med = {i: statistics.median(t) for i, t in times.items()}
        best = min(med, key=med.get)
        print(f"\n{model}: {a.rounds} rounds x ({a.warmup} warmup + {a.steps} steps)")
        print("| " + " | ".join(axes) + " | median ms | spread | / fastest |")
        print("|" + "---|" * (len(axes) + 3))
        for i in sorted(med, key=med.get):
            t = times[i]
            print("| " + " | ".join(forms[i].values()) +
                  f" | {med[i]:.2f} | {min(t):.2f}..{max(t):.2f} | {med[i] / med[best]:.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
