#!/usr/bin/python3
"""
results_table.py - a markdown table of a training run from its `adtrain train --log` JSONL file:
per evaluation, the step, the wall time of the training steps so far ("time_s"), the mean training loss
since the previous evaluation and the validation metrics logged at that step.

  python3 scripts/results_table.py RUN.jsonl
"""
import json
import sys


def main():
    rows, elapsed, window = [], 0.0, []
    with open(sys.argv[1]) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and "time_s" in r:
                elapsed = r["time_s"]
                if r["loss"] is not None:
                    window.append(r["loss"])
            elif "val_loss" in r:
                train = sum(window) / len(window) if window else float("nan")
                extra = {k: v for k, v in r.items() if k not in ("step", "val_loss")}
                rows.append((r["step"], elapsed, train, r["val_loss"], extra))
                window = []
    keys = sorted({k for row in rows for k in row[4]})
    print("| step | train time (s) | train loss | val loss |" + "".join(f" {k} |" for k in keys))
    print("|---:|---:|---:|---:|" + "---:|" * len(keys))
    for step, t, tr, vl, extra in rows:
        print(f"| {step} | {t:.0f} | {tr:.4f} | {vl:.4f} |" + "".join(f" {extra.get(k, '')} |" for k in keys))


if __name__ == "__main__":
    main()
