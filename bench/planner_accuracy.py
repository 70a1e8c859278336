"""planner_accuracy.py - the measuring and the summary of bench/run_planner_accuracy.sh.

    python3 bench/planner_accuracy.py WORKDIR CLUSTER.json|calibrate OUT.jsonl
    python3 bench/planner_accuracy.py --summary OUT.jsonl      the summary of a stored run
        (with RANKS=N in the environment, of its plans of at most N ranks; --reprice too)
    python3 bench/planner_accuracy.py --reprice OUT.jsonl [CLUSTER.json]   the stored measurements against
        today's binary's predictions, on the run's own cluster (its meta line): each model's input
        priced once now (its "input_s" where the run stored it), or on CLUSTER.json; auto rows are left out, since
        today's auto plan may not be the plan that was measured; a run calibrated model by model is
        repriced on each model's own cluster; REPRICE_CLUSTER=after prices each model on the
        calibration made after its rounds (CALIBRATE_AFTER=1), =mean on the element-wise mean of
        the two

With "calibrate" for CLUSTER.json, each model is priced on a cluster file that `adtrain calibrate
--ranks RANKS --procs 9 --model CFG:B` wrote just before its plans were measured (a "calibration"
line before the model's rows keeps it): this machine's speed drifts by a third over tens of
minutes, and a calibration half an hour before a model's rounds prices them at the speed of then.
CALIBRATE_AFTER=1 calibrates once more after the model's rounds (a "calibration_after" line):
how far the cost model's figures move with the calibration alone, on the same measurements.

Makes and prices every plan (adtrain plan --cluster --json), trains each ROUNDS times interleaved,
writes one JSON line per plan to OUT.jsonl and prints the per-model summary. A run times
max(STEPS, TIME_S / the predicted step) steps after WARMUP, its time the mean of rank 0's steps
(the median of them is stored beside it); a plan's time the mean of its runs (plan_time), the
median of them stored beside it.

A plan measured twice (the auto plan is often an expert plan: "auto (dp=2)" beside "dp") counts
once in the summary's figures, its runs pooled; the table lists both rows.

The summary also says how far the measurement itself repeats: Kendall's tau between two rounds
of the same plans (the mean over pairs of rounds) and the median deviation of one round from the
median of the others. A prediction's tau cannot be told from the measurement's noise above that
ceiling, and its median error not below that deviation. Since each plan's time is the mean of
its runs, the last column estimates the ceiling for that mean: the tau a prediction that knew
the true times would get (bootstrap_tau), and the tau between the plans' times from the even and
from the odd rounds (halves_tau). A row also keeps when each run started (run_at_s, seconds from
the start). A stored run is summarised with today's plan_time, whatever its measured_ms says."""
import itertools, json, os, random, shutil, statistics, subprocess, sys, tempfile, time

ADT = os.environ.get("ADT", "build/adtrain")
SUMMARY_ONLY = len(sys.argv) == 3 and sys.argv[1] == "--summary"
REPRICE = len(sys.argv) in (3, 4) and sys.argv[1] == "--reprice"
if not SUMMARY_ONLY and not REPRICE:
    WORK, CLUSTER, OUT = sys.argv[1:4]
    CALIBRATE_EACH = CLUSTER == "calibrate"
    RANKS, ROUNDS = int(os.environ["RANKS"]), int(os.environ["ROUNDS"])
    STEPS, WARMUP = int(os.environ["STEPS"]), int(os.environ["WARMUP"])
    TIME_S = float(os.environ.get("TIME_S", "0"))
    MODELS = os.environ["MODELS"].split()
# --summary and --reprice: only the rows of at most RANKS ranks (RANKS=2: the 1- and 2-rank plans
# of a run made with more)
MAX_RANKS = int(os.environ.get("RANKS", "0")) or 1 << 30
DATA = {"mlp": ("synthetic:mlp", 64), "gpt": ("synthetic:text", 16), "vgg": ("synthetic:vgg", 32),
        "dlrm": ("synthetic:dlrm", 256)}


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def candidates(n):
    """(strategy, microbatches) of the fixed list that make sense on n devices."""
    if n == 1:
        return [("dp", 1), ("pp=1", 2)]
    c = [("dp", 1), ("zero", 1), ("tp", 1)]
    c += [(f"pp={n}", m) for m in (1, 2, 4)]
    if n == 4:
        c += [("dp=2,tp=2", 1), ("dp=2,tp=2,zero", 1), ("dp=2,pp=2", 2), ("dp=2,pp=2", 4), ("pp=2,tp=2", 2)]
    return c


INPUT_PROCS = 7


def input_price(cfg, data, batch):
    """Seconds per sample of the model's data: the median of INPUT_PROCS `adtrain plan` processes'
    timings (each the median of its fills): every plan of the model is then priced with this one
    figure (--input-s), since a timing moves by 20% from one process to the next here and would
    reorder near plans (one process priced a DLRM's samples at 0.85 us in one run and 1.32 in the
    run before; its tensor-parallel plans read the whole batch on every rank)."""
    t = []
    for _ in range(INPUT_PROCS):
        r = subprocess.run([ADT, "plan", "--strategy", "dp", "--devices", "1", "--model", cfg, "--batch", str(batch),
                            "--cluster", CLUSTER, "--data", data, "--json"], capture_output=True, text=True, check=True)
        t.append(json.loads(r.stdout)["input_per_sample_s"])
    return statistics.median(t)


def price_plan(cfg, data, batch, s, n, m, path, input_s):
    return subprocess.run([ADT, "plan", "--strategy", s, "--devices", str(n), "--model", cfg, "--batch", str(batch),
                           "--microbatches", str(m), "--cluster", CLUSTER, "--data", data, "--json", "-o", path,
                           "--input-s", repr(input_s)], capture_output=True, text=True)


def calibrate(model, cfg, batch, out, t0, key="calibration"):
    """The cluster file this model's plans are priced on, measured now (module docstring); with
    key "calibration_after" only recorded."""
    global CLUSTER
    priced = key == "calibration"
    path = f"{WORK}/cluster-{model}{'' if priced else '-after'}.json"
    if priced:
        CLUSTER = path
    t = time.time()
    r = subprocess.run([ADT, "calibrate", "--ranks", str(RANKS), "--procs", "9", "--model", f"{cfg}:{batch}", "-o",
                        path], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"calibrate for {model} failed:\n{r.stderr}")
    out.write(json.dumps({key: {"model": model, "at_s": round(t - t0, 2), "seconds": round(time.time() - t, 1),
                                "cluster": json.load(open(path))}}) + "\n")
    out.flush()
    print(f"  {model}: calibrated in {time.time() - t:.0f} s, load {loadavg()}", file=sys.stderr)


def make_plans(model, cfg, data, batch):
    plans = []
    input_s = input_price(cfg, data, batch)
    price = ["--input-s", repr(input_s)]
    print(f"  {model}: input priced at {input_s * 1e6:.1f} us per sample", file=sys.stderr)
    for n in range(1, RANKS + 1):
        for s, m in candidates(n):
            path = f"{WORK}/{model}-{n}-{s.replace('=', '_').replace(',', '-')}-m{m}.json"
            r = price_plan(cfg, data, batch, s, n, m, path, input_s)
            if r.returncode:
                print(f"  {model} {n} ranks {s} m={m}: left out ({r.stderr.strip().splitlines()[-1]})",
                      file=sys.stderr)
                continue
            plans.append({"ranks": n, "plan": s, "microbatches": m, "file": path, "pred": json.loads(r.stdout),
                          "input_s": input_s})
        if n >= 2:
            path = f"{WORK}/{model}-{n}-auto.json"
            r = subprocess.run([ADT, "plan", "--strategy", "auto", "--devices", str(n), "--model", cfg, "--batch",
                                str(batch), "--cluster", CLUSTER, "--data", data, "--json", "-o", path] + price,
                               capture_output=True, text=True)
            if r.returncode == 0:
                pred = json.loads(r.stdout)
                plans.append({"ranks": n, "plan": "auto" if pred["strategy"] == "auto" else "auto (" + pred["strategy"] + ")", "microbatches": pred["microbatches"],
                              "file": path, "pred": pred, "input_s": input_s})
    return plans


def plan_time(runs):
    """A plan's measured step time from its runs' times: their mean, the plan's throughput over
    the rounds. This machine runs in two speed states about 1.35x apart for minutes each, so a
    plan's runs are two clusters and their median falls in one or the other by a run or two: on
    the four 16-round runs of 2026-11-28 (16 pairs of run and model) the mean's times from the
    even rounds ranked the plans like the odd rounds' at tau 0.71-0.95 (median 0.90), the
    median's at 0.58-0.95 (0.87), and resampled (bootstrap_tau) at 0.85-0.97 against 0.82-0.96."""
    return statistics.fmean(runs)


def timed_steps(p):
    """Steps timed per run: STEPS, or as many as fill TIME_S at the predicted step time. A few ms
    steps of ranks that time-share 2 cores vary with the scheduler's slices (3-4 ms) from step to
    step; ten of them repeated so badly that two rounds of the same plans ranked them at tau 0.6."""
    if TIME_S <= 0:
        return STEPS
    return max(STEPS, min(2000, int(TIME_S / p["pred"]["predicted_step_s"] + 0.999)))


def train(p, cfg, data, batch):
    """(rank 0's mean step time over the timed steps, ms; the ranks' memory reports): the mean,
    the run's throughput, is what a step costs once ranks that take turns on the cores are
    counted, as the cost model prices it; the median of the steps is kept beside it."""
    log = f"{WORK}/log.jsonl"
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, ADT_MEM_REPORT="1")
    r = subprocess.run(["mpiexec", "-n", str(p["ranks"]), ADT, "train", "--model", cfg, "--data", data, "--batch",
                        str(batch), "--steps", str(WARMUP + p["steps"]), "--plan", p["file"], "--log", log],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{p['plan']} on {p['ranks']} ranks failed:\n{r.stdout}{r.stderr}")
    ms = [json.loads(l)["ms"] for l in open(log) if '"loss"' in l][WARMUP:]
    mem = [json.loads(l) for l in (r.stdout + r.stderr).splitlines() if l.startswith('{"mem_report"')]
    return statistics.fmean(ms), statistics.median(ms), mem


def memory(mem):
    """max over ranks of the executor's memory plan, and of the peak-RSS growth"""
    end = [m for m in mem if m["mem_report"] == "end" and "arena_bytes" in m]
    before = {m["rank"]: m["maxrss_kib"] for m in mem if m["mem_report"] == "before_executor"}
    plan = max((m["slots"] * m["arena_bytes"] + m["state_bytes"] + m["scratch_bytes"] + m.get("accum_bytes", 0)
                for m in end), default=None)
    rss = max(((m["maxrss_kib"] - before.get(m["rank"], 0)) * 1024 for m in end), default=None)
    return plan, rss


def tau(xs, ys):
    conc = disc = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            a = (xs[i] - xs[j]) * (ys[i] - ys[j])
            conc += a > 0
            disc += a < 0
    return (conc - disc) / max(1, conc + disc)


def main():
    t0 = time.time()
    out = open(OUT, "w")
    out.write(json.dumps({"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                                   "loadavg_at_start": loadavg(), "ranks": RANKS, "rounds": ROUNDS, "steps": STEPS,
                                   "warmup": WARMUP, "time_s": TIME_S, "run_ms": "mean",
                                   "cluster": None if CALIBRATE_EACH else json.load(open(CLUSTER))}}) + "\n")
    rows = []
    for model in MODELS:
        cfg = f"configs/{model}.json"
        data, batch = DATA[model.split("-")[0]]
        if CALIBRATE_EACH:
            calibrate(model, cfg, batch, out, t0)
        plans = make_plans(model, cfg, data, batch)
        for p in plans:
            p["runs"], p["run_medians"], p["run_at"], p["steps"] = [], [], [], timed_steps(p)
        for rnd in range(ROUNDS):
            order = plans if rnd % 2 == 0 else plans[::-1]
            for p in order:
                p["run_at"].append(round(time.time() - t0, 2))
                ms, med, mem = train(p, cfg, data, batch)
                p["runs"].append(ms)
                p["run_medians"].append(med)
                if "mem" not in p:
                    p["mem"] = memory(mem)
            print(f"  {model}: round {rnd + 1}/{ROUNDS} done, load {loadavg()}, {time.time() - t0:.0f} s",
                  file=sys.stderr)
        if CALIBRATE_EACH and os.environ.get("CALIBRATE_AFTER") == "1":
            calibrate(model, cfg, batch, out, t0, "calibration_after")
        for p in plans:
            row = {"model": model, "ranks": p["ranks"], "plan": p["plan"], "microbatches": p["microbatches"],
                   "predicted_ms": p["pred"]["predicted_step_s"] * 1e3, "measured_ms": plan_time(p["runs"]),
                   "measured_median_ms": statistics.median(p["runs"]), "runs_ms": p["runs"], "run_step_medians_ms": p["run_medians"], "run_at_s": p["run_at"], "steps": p["steps"],
                   "predicted_mem_bytes": p["pred"]["peak_mem_bytes"],
                   "measured_mem_bytes": p["mem"][0], "rss_growth_bytes": p["mem"][1], "input_s": p["input_s"]}
            rows.append(row)
            out.write(json.dumps(row) + "\n")
    out.write(json.dumps({"meta_end": {"loadavg_at_end": loadavg(), "seconds": round(time.time() - t0)}}) + "\n")
    out.close()
    print(f"load average at start {json.loads(open(OUT).readline())['meta']['loadavg_at_start']}, at end {loadavg()}; "
          f"{ROUNDS} rounds x ({WARMUP} + max({STEPS}, {TIME_S} s) steps); {time.time() - t0:.0f} s")
    print()
    summarize(rows, MODELS)


def repeatability(rs):
    """(mean tau between rounds, median |run - median of the other runs| / that median, bootstrap_tau,
    tau between the even and the odd rounds' plan times) or None."""
    n = min(len(r["runs_ms"]) for r in rs)
    if n < 2:
        return None
    taus = [tau([r["runs_ms"][i] for r in rs], [r["runs_ms"][j] for r in rs]) for i, j in itertools.combinations(range(n), 2)]
    dev = []
    for r in rs:
        for i in range(n):
            others = statistics.median(r["runs_ms"][:i] + r["runs_ms"][i + 1:n])
            dev.append(abs(r["runs_ms"][i] - others) / others)
    halves = tau([plan_time(r["runs_ms"][0:n:2]) for r in rs], [plan_time(r["runs_ms"][1:n:2]) for r in rs])
    return statistics.mean(taus), statistics.median(dev), bootstrap_tau(rs), halves


def bootstrap_tau(rs, draws=200):
    """The tau a prediction that knew every plan's true time would get against this measurement,
    estimated from the measurement's own spread: each plan's runs drawn again with replacement,
    their plan_time ranked against the measured ones (the mean over `draws`, a fixed seed). A
    ceiling for the prediction's tau: near plans swap places from one measurement to the next."""
    rng = random.Random(1)
    med = [plan_time(r["runs_ms"]) for r in rs]
    got = []
    for _ in range(draws):
        again = [plan_time(rng.choices(r["runs_ms"], k=len(r["runs_ms"]))) for r in rs]
        got.append(tau(med, again))
    return statistics.mean(got)


def pooled(rs):
    """The rows of one model with a plan measured twice made one: the auto plan is often an expert
    plan ("auto (dp=2)" beside "dp" on 2 ranks), the same plan file, and two measurements of one
    plan are one data point, not a pair to rank (their runs differed by up to 8% here). Same plan:
    same ranks and microbatches, the same predicted time and memory."""
    out = []
    for r in rs:
        twin = next((q for q in out if q["ranks"] == r["ranks"] and q["microbatches"] == r["microbatches"] and
                     q["predicted_mem_bytes"] == r["predicted_mem_bytes"] and
                     abs(q["predicted_ms"] - r["predicted_ms"]) <= 1e-9 * r["predicted_ms"]), None)
        if twin is None:
            out.append(dict(r))
            continue
        twin["runs_ms"] = twin["runs_ms"] + r["runs_ms"]
        twin["measured_ms"] = plan_time(twin["runs_ms"])
        twin["plan"] = twin["plan"] + " = " + r["plan"]
    return out


def summarize(rows, models):
    print("| model | plans | median abs error | Kendall tau | predicted-best measured / measured best | "
          "memory predicted / measured (min..max) | round vs round: tau, median deviation | "
          "measurement's own tau: bootstrap, halves |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [dict(r, measured_ms=plan_time(r["runs_ms"])) if r.get("runs_ms") else r for r in rows]
    for model in models:
        rs = pooled([r for r in rows if r["model"] == model])
        if not rs:
            continue
        err = statistics.median(abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rs)
        t = tau([r["predicted_ms"] for r in rs], [r["measured_ms"] for r in rs])
        best = min(r["measured_ms"] for r in rs)
        pick = min(rs, key=lambda r: r["predicted_ms"])
        mr = [r["predicted_mem_bytes"] / r["measured_mem_bytes"] for r in rs if r["measured_mem_bytes"]]
        mtxt = f"{min(mr):.2f}..{max(mr):.2f}" if mr else "-"
        rep = repeatability(rs)
        rtxt = f"{rep[0]:.2f}, {100 * rep[1]:.1f}% | {rep[2]:.2f}, {rep[3]:.2f}" if rep else "- | -"
        print(f"| {model} | {len(rs)} | {100 * err:.1f}% | {t:.2f} | {pick['measured_ms'] / best:.3f} "
              f"({pick['ranks']} ranks {pick['plan']} m={pick['microbatches']}) | {mtxt} | {rtxt} |")
    print()
    print("| model | ranks | plan | m | predicted ms | measured ms | error | predicted MiB | measured MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mm = r["measured_mem_bytes"]
        print(f"| {r['model']} | {r['ranks']} | {r['plan']} | {r['microbatches']} | {r['predicted_ms']:.2f} | "
              f"{r['measured_ms']:.2f} | {100 * (r['predicted_ms'] / r['measured_ms'] - 1):+.0f}% | "
              f"{r['predicted_mem_bytes'] / 2**20:.2f} | {mm / 2**20 if mm else float('nan'):.2f} |")


def mean_cluster(a, b):
    """The element-wise mean of two calibrations of one machine: numbers averaged, lists of one
    length and objects of the same keys entered, anything else (names, a point missing) from a."""
    if a == b or isinstance(a, bool) or isinstance(b, bool):
        return a
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return (a + b) / 2
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [mean_cluster(x, y) for x, y in zip(a, b)]
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {k: mean_cluster(a[k], b[k]) for k in a}
    return a


def reprice(path):
    """The stored measurements against this binary's predictions (module docstring)."""
    global CLUSTER
    lines = [json.loads(line) for line in open(path)]
    work = tempfile.mkdtemp()
    own = {c["calibration"]["model"]: c["calibration"]["cluster"] for c in lines if "calibration" in c}
    which = os.environ.get("REPRICE_CLUSTER", "before")
    if which not in ("before", "after", "mean"):
        raise SystemExit(f"REPRICE_CLUSTER: '{which}': expected before, after or mean")
    if which != "before":
        after = {c["calibration_after"]["model"]: c["calibration_after"]["cluster"] for c in lines if "calibration_after" in c}
        if set(after) != set(own):
            raise SystemExit(f"REPRICE_CLUSTER={which}: {path} has no calibration after the rounds of every model")
        own = {m: after[m] if which == "after" else mean_cluster(own[m], after[m]) for m in own}
    stored = [r for r in lines if "model" in r and not r["plan"].startswith("auto") and r["ranks"] <= MAX_RANKS]
    models = list(dict.fromkeys(r["model"] for r in stored))
    rows = []
    # a run stored without its input prices gets them timed once and kept beside it, so that
    # every re-pricing of it uses the same ones
    kept = path + ".input.json"
    prices = json.load(open(kept)) if os.path.exists(kept) else {}
    for model in models:
        cfg = f"configs/{model}.json"
        data, batch = DATA[model.split("-")[0]]
        rs = [r for r in stored if r["model"] == model]
        CLUSTER = f"{work}/cluster-{model}.json"
        json.dump(json.load(open(sys.argv[3])) if len(sys.argv) == 4 else own.get(model, lines[0]["meta"]["cluster"]),
                  open(CLUSTER, "w"))
        input_s = rs[0].get("input_s") or prices.get(model) or input_price(cfg, data, batch)
        if not rs[0].get("input_s"):
            prices[model] = input_s
        for r in rs:
            q = price_plan(cfg, data, batch, r["plan"], r["ranks"], r["microbatches"], f"{work}/plan.json", input_s)
            if q.returncode:
                print(f"  {model} {r['ranks']} ranks {r['plan']}: not priced ({q.stderr.strip()})", file=sys.stderr)
                continue
            pred = json.loads(q.stdout)
            rows.append(dict(r, predicted_ms=pred["predicted_step_s"] * 1e3, predicted_mem_bytes=pred["peak_mem_bytes"]))
    shutil.rmtree(work)
    if prices:
        json.dump(prices, open(kept, "w"))
    summarize(rows, models)


if REPRICE:
    reprice(sys.argv[2])
elif SUMMARY_ONLY:
    stored = [json.loads(line) for line in open(sys.argv[2])]
    stored = [r for r in stored if "model" in r and r["ranks"] <= MAX_RANKS]
    summarize(stored, list(dict.fromkeys(r["model"] for r in stored)))
else:
    main()
