"""step_breakdown.py - where a plan's step goes, predicted against measured (bench/run_step_breakdown.sh).

    python3 bench/step_breakdown.py CLUSTER.json OUT.jsonl        measure, store, summarise
    python3 bench/step_breakdown.py --summary OUT.jsonl           the summary of a stored run

The accuracy benchmark (run_planner_accuracy.sh) compares whole steps; this one says which part
of a step the cost model misses. For each plan of PLANS ("RANKS:STRATEGY", the strategies of
`adtrain plan --strategy` without pipeline stages), `adtrain plan --json` gives the predicted step and its
parts (compute, producing the input, each collective kind's busy time, the communication left
exposed and, of it, the blocked waits' sync_s); `adtrain train --profile on` gives each rank's
measured parts (the executor's compute, collectives' flight time per kind, time blocked in waits,
polling between nodes) and the log the step times. The step's time outside the executor (the
sampler, producing the input, reading the loss) is the log's mean step less the profile's
executor time. Plans run ROUNDS times, interleaved, so that a drift of this machine's speed falls
on all; a part's figure is the median over rounds of the ranks' mean.

Environment: MODEL, DATA, BATCH, PLANS, ROUNDS, STEPS (see run_step_breakdown.sh), ADT."""
import json, os, re, statistics, subprocess, sys, tempfile

ADT = os.environ.get("ADT", "build/adtrain")
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
PROFILE = re.compile(r"profile rank (\d+): (\d+) steps, ([0-9.]+) ms per step in the executor: compute ([0-9.]+) ms, "
                     r"collectives ([0-9.]+) ms \(blocked in waits ([0-9.]+) ms;.*polling between nodes ([0-9.]+) ms")
KIND_LINE = re.compile(r"profile rank (\d+):   (\w+) +([0-9.]+) ms \((\d+) nodes\)")


def parse_plans(text):
    out = []
    for item in text.split():
        f = item.split(":")
        if len(f) not in (2, 3) or not f[0].isdigit() or int(f[0]) < 1 or (len(f) == 3 and not f[2].isdigit()):
            raise SystemExit(f"PLANS: '{item}': expected RANKS:STRATEGY, e.g. 3:tp or 4:dp=2,tp=2")
        if "pp" in f[1] or (len(f) == 3 and f[2] != "1"):
            raise SystemExit(f"PLANS: '{item}': pipelines and microbatches are not broken down here (a pipeline "
                             "stage's profile is its passes; the waits for its neighbours fall outside them)")
        out.append((int(f[0]), f[1], 1))
    return out


def predict(cfg, data, batch, cluster, ranks, strategy, m, path):
    r = subprocess.run([ADT, "plan", "--strategy", strategy, "--devices", str(ranks), "--model", cfg, "--batch",
                        str(batch), "--microbatches", str(m), "--cluster", cluster, "--data", data, "--json", "-o", path],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"adtrain plan {strategy} on {ranks}: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    comm = d.get("comm_s", {})
    return {"step": d["predicted_step_s"] * 1e3, "compute": d["compute_s"] * 1e3, "input": d["input_s"] * 1e3,
            "exposed": d["exposed_comm_s"] * 1e3, "sync": d["sync_s"] * 1e3, "bubble": d["bubble_s"] * 1e3,
            "kinds": {k: comm.get(k, 0) * 1e3 for k in KINDS}}


def measure(cfg, data, batch, ranks, plan, steps, log):
    if os.path.exists(log):
        os.remove(log)
    r = subprocess.run(["mpiexec", "-n", str(ranks), ADT, "train", "--model", cfg, "--data", data, "--batch", str(batch),
                        "--steps", str(steps), "--plan", plan, "--log", log, "--profile", "on"],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"train {plan} on {ranks} ranks failed:\n{r.stdout}{r.stderr}")
    ms = [json.loads(l)["ms"] for l in open(log) if '"loss"' in l][1:]  # the profile leaves out the first step too
    ranks_p, kinds = {}, {}
    for line in r.stderr.splitlines():
        p = PROFILE.match(line)
        if p:
            ranks_p[int(p[1])] = [float(p[i]) for i in range(3, 8)]
        k = KIND_LINE.match(line)
        if k and k[2] in KINDS:
            kinds.setdefault(k[2], []).append(float(k[3]))
    if len(ranks_p) != ranks:
        raise SystemExit(f"train {plan} on {ranks} ranks: {len(ranks_p)} profile lines, expected {ranks}")
    mean = [statistics.fmean(v[i] for v in ranks_p.values()) for i in range(5)]
    step = statistics.fmean(ms)
    return {"step": step, "executor": mean[0], "compute": mean[1], "flight": mean[2], "blocked": mean[3],
            "poll": mean[4], "outside": step - ranks_p[0][0],  # rank 0 logs the step times
            "kinds": {k: statistics.fmean(v) for k, v in kinds.items()}}


def summarise(rows):
    print("| ranks | plan | m | step pred / meas ms | compute pred / meas | input pred / outside the executor meas "
          "| exposed comm + sync pred / blocked + polling meas | of it sync pred | per kind: pred busy / meas flight |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, runs = r["pred"], r["runs"]
        med = {k: statistics.median(x[k] for x in runs) for k in ("step", "compute", "outside", "blocked", "poll")}
        kinds = []
        for k in KINDS:
            meas = [x["kinds"].get(k, 0) for x in runs]
            if p["kinds"][k] > 0 or any(meas):
                kinds.append(f"{k} {p['kinds'][k]:.2f} / {statistics.median(meas):.2f}")
        print(f"| {r['ranks']} | {r['strategy']} | {r['m']} | {p['step']:.2f} / {med['step']:.2f} "
              f"({(p['step'] / med['step'] - 1) * 100:+.0f}%) | {p['compute']:.2f} / {med['compute']:.2f} "
              f"| {p['input']:.2f} / {med['outside']:.2f} | {p['exposed'] + p['bubble']:.2f} / "
              f"{med['blocked'] + med['poll']:.2f} | {p['sync']:.2f} | {'; '.join(kinds)} |")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summary":
        lines = [json.loads(l) for l in open(sys.argv[2])]
        meta = lines[0].get("meta", {})
        print(f"{meta.get('date', '?')}, {meta.get('model', '?')} batch {meta.get('batch', '?')}, "
              f"{meta.get('rounds', '?')} rounds of {meta.get('steps', '?')} steps; medians over rounds, ms per step\n")
        summarise([l for l in lines if "pred" in l])
        return
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    cluster, out_path = sys.argv[1:3]
    cfg, data, batch = os.environ["MODEL"], os.environ["DATA"], int(os.environ["BATCH"])
    rounds, steps = int(os.environ["ROUNDS"]), int(os.environ["STEPS"])
    plans = parse_plans(os.environ["PLANS"])
    work = tempfile.mkdtemp(prefix="adt-breakdown-")
    rows = []
    for i, (n, s, m) in enumerate(plans):
        path = f"{work}/plan-{i}.json"
        rows.append({"ranks": n, "strategy": s, "m": m, "file": path,
                     "pred": predict(cfg, data, batch, cluster, n, s, m, path), "runs": []})
    for q in range(rounds):
        for r in rows:
            print(f"round {q + 1}/{rounds}: {r['ranks']} ranks {r['strategy']} m={r['m']}", file=sys.stderr)
            r["runs"].append(measure(cfg, data, batch, r["ranks"], r["file"], steps, f"{work}/log.jsonl"))
    with open(out_path, "a") as out:
        for r in rows:
            out.write(json.dumps({k: v for k, v in r.items() if k != "file"}) + "\n")
    summarise(rows)


if __name__ == "__main__":
    main()
