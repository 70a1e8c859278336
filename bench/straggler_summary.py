"""straggler_summary.py - the numbers of bench/run_straggler.sh.

    python3 bench/straggler_summary.py runs WORK ROUNDS "BATCHES"   one line per run, from the
                                                                     runs' logs in WORK
    python3 bench/straggler_summary.py summary RESULTS.txt           the summary tables, from the
                                                                     lines of a results file alone

A run line: "batch scenario round policy | steps/s whole, second half | capacities r0 r1 ... over
the judged steps; at the final split b0/b1/...: r0 r1 ... | ms per step besides the slowest rank's compute |
actions [latencies]". The summary reads nothing else, so a stored results file can be summarised
again (by a later version of the rules below).

Two yardsticks per (batch, scenario, round), both from the capacities (samples per second of a
rank's passes, not the all-reduces nor the update) the round's three runs measured:

- the fitted ideal. A rank's time per step grows with its local batch b as a + p b (a per-step
  cost its samples share: a rank measured at fewer samples has fewer samples per second), so each
  rank's points (b, b / C) at the runs' final splits (the static run's 1024/1024, DD's and ND's
  rebalanced ones) are fitted with a least-squares line, and the ideal is the best steps per second
  any split reaches on those lines: all ranks finishing together, T = (B + sum a_i / p_i) /
  sum 1 / p_i. Where a rank was measured at one local batch only, p = its mean time per sample and
  a = 0: the sum of the capacities over the batch, the ideal as first defined.
- the best-of-six bound: sum_i max C_i / B over the six capacities of each rank (each run over its
  judged steps and at its final split). No split beats it, but it adds capacities measured at
  local batches that cannot coexist (the slow rank's largest at the equal split, the fast rank's
  at its rebalanced share) and the maxima of noisy numbers, so it is out of reach by a few percent.

Transient runs have no steady split (the slowdown comes and goes inside the run): both yardsticks
there are the best-of-three of the whole runs' capacities."""
import json, os, re, statistics, sys

CAP = r"straggler: capacity \(samples/s of compute\)((?: r\d+ [0-9.]+)+);"
FIN = r"straggler: capacity at the final split ([0-9/]+) \(\d+ steps\)((?: r\d+ [0-9.]+)+);"
LINE = re.compile(r"^(\d+) (\w+) (\d+) (\w+) \| ([0-9.]+) ([0-9.]+) \| ([0-9. ]+); "
                  r"(?:at ([0-9/]+): ([0-9. ]+)|-) \| (-?[0-9.]+|nan) \| (\d+)(.*)$")
SCENARIOS = ("contention", "hetero", "transient")
POLICIES = ("off", "dd", "nd")


def rank_caps(text):
    """The trainer's " r0 10586.1 r1 4660.2" as a run line's "10586 4660"."""
    return " ".join("%.0f" % float(c) for c in text.split()[1::2])


def runs(work, rounds, batches):
    """One line per run from the logs (WORK/NAME.jsonl, NAME.err, transient NAME.on/.off)."""
    def log(name):
        steps, acts = [], []
        for line in open(os.path.join(work, name + ".jsonl")):
            o = json.loads(line)
            if "straggler_action" in o: acts.append(o)
            elif "ms" in o: steps.append(o)
        return steps, acts

    def grep(name, pat):
        for line in open(os.path.join(work, name + ".err")):
            m = re.search(pat, line)
            if m: return m.groups()
        return None

    def rate(steps):
        return len(steps) / (sum(s["ms"] for s in steps) / 1e3)

    print("# every run: batch scenario round policy | steps/s whole, second half | capacities r0 r1 (samples/s) over the "
          "judged steps; at the final split b0/b1 | ms per step besides the slowest rank's compute | actions")
    for batch in batches:
        for sc in SCENARIOS:
            for r in range(1, rounds + 1):
                for pol in POLICIES:
                    name = "%s-%d-%d-%s" % (sc, batch, r, pol)
                    steps, acts = log(name)
                    whole, half = rate(steps), rate(steps[len(steps) // 2:])
                    cp, fin = grep(name, CAP), grep(name, FIN)
                    ov = grep(name, r"; (-?[0-9.]+) ms per step besides the slowest rank's compute")
                    ov = float(ov[0]) if ov else float("nan")
                    lat = ""
                    if sc == "transient":
                        on = float(open(os.path.join(work, name + ".on")).read())
                        off = float(open(os.path.join(work, name + ".off")).read())
                        after_on = [a for a in acts if a["wall"] >= on]
                        after_off = [a for a in acts if a["wall"] >= off]
                        if after_on: lat += " first action %.2f s after the slowdown started" % (after_on[0]["wall"] - on)
                        if after_off: lat += "; first action %.2f s after it stopped" % (after_off[0]["wall"] - off)
                    print("%d %s %d %s | %.2f %.2f | %s; %s | %.1f | %d%s" % (batch, sc, r, pol, whole, half,
                          rank_caps(cp[0]), "at %s: %s" % (fin[0], rank_caps(fin[1])) if fin else "-", ov, len(acts), lat))


def fit_line(points):
    """(a, p) of t = a + p b through the (b, t) points by least squares; one local batch: a = 0."""
    bs = [b for b, _ in points]
    mean_b = sum(bs) / len(bs)
    sxx = sum((b - mean_b) ** 2 for b in bs)
    if sxx > 0 and max(bs) > 1.05 * min(bs):
        mean_t = sum(t for _, t in points) / len(points)
        p = sum((b - mean_b) * (t - mean_t) for b, t in points) / sxx
        if p > 0: return mean_t - p * mean_b, p
    return 0.0, sum(t for _, t in points) / sum(bs)


def fitted_ideal(batch, points):
    """Steps/s of the split on which every rank's fitted line ends at the same time."""
    lines = [fit_line(pts) for pts in points]
    T = (batch + sum(a / p for a, p in lines)) / sum(1 / p for _, p in lines)
    return 1 / T


def summary(path):
    rows, meta = {}, {}
    for line in open(path):
        m = re.match(r"^# calibration: rank (\d+) at (.*): capacity ratio ([0-9.]+)", line)
        if m: meta["slow"], meta["level"], meta["ratio"] = m.groups()
        m = LINE.match(line.rstrip("\n"))
        if not m: continue
        g = m.groups()
        batch, sc, r, pol = int(g[0]), g[1], int(g[2]), g[3]
        first = re.search(r"first action ([0-9.]+) s after the slowdown started", g[11])
        rows[(batch, sc, r, pol)] = {"whole": float(g[4]), "half": float(g[5]), "cap": [float(c) for c in g[6].split()],
                                    "fin": ([int(b) for b in g[7].split("/")], [float(c) for c in g[8].split()]) if g[7] else None,
                                    "ov": float(g[9]), "acts": int(g[10]), "first": float(first.group(1)) if first else None}
    batches = sorted({k[0] for k in rows})
    rounds = max(k[2] for k in rows)
    for batch in batches:
        cells = {}
        for sc in SCENARIOS:
            for r in range(1, rounds + 1):
                runs_ = [rows.get((batch, sc, r, pol)) for pol in POLICIES]
                if any(x is None for x in runs_): continue
                n = len(runs_[0]["cap"])
                best = [max(x["cap"][i] for x in runs_) for i in range(n)]
                if sc != "transient":
                    best = [max([best[i]] + [x["fin"][1][i] for x in runs_ if x["fin"]]) for i in range(n)]
                    pts = [[(x["fin"][0][i], x["fin"][0][i] / x["fin"][1][i]) for x in runs_ if x["fin"]] for i in range(n)]
                    fit = fitted_ideal(batch, pts)
                else:
                    fit = sum(best) / batch
                bound = sum(best) / batch
                for pol, x in zip(POLICIES, runs_):
                    cells.setdefault((sc, pol), []).append((x, fit, bound))
        print()
        print("## summary, batch %d (medians over %d rounds, the spread min-max; rank %s at %s ran at %s of rank 0's "
              "speed in the calibration)" % (batch, rounds, meta.get("slow", "1"), meta.get("level", "?"),
                                             meta.get("ratio", "?")))
        print("| scenario | policy | steps/s (whole run) | steps/s (second half) | fitted ideal | second half / fitted "
              "ideal (spread) | whole run / fitted ideal | best-of-six bound | second half / bound | ms/step besides "
              "the slowest compute | actions | first action after the slowdown |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for sc in SCENARIOS:
            for pol in POLICIES:
                v = cells.get((sc, pol))
                if not v: continue
                med = lambda f: statistics.median(f(x, fit, bound) for x, fit, bound in v)
                h = [x["half"] / fit for x, fit, _ in v]
                lat = [x["first"] for x, _, _ in v if x["first"] is not None]
                print("| %s | %s | %.2f | %.2f | %.2f | %.0f%% (%.0f-%.0f%%) | %.0f%% | %.2f | %.0f%% | %.1f | %g | %s |" % (
                      sc, pol, med(lambda x, f, b: x["whole"]), med(lambda x, f, b: x["half"]), med(lambda x, f, b: f),
                      100 * statistics.median(h), 100 * min(h), 100 * max(h), 100 * med(lambda x, f, b: x["whole"] / f),
                      med(lambda x, f, b: b), 100 * med(lambda x, f, b: x["half"] / b), med(lambda x, f, b: x["ov"]),
                      med(lambda x, f, b: x["acts"]),
                      "%.2f s (%.2f-%.2f)" % (statistics.median(lat), min(lat), max(lat)) if lat else "-"))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "runs":
        runs(sys.argv[2], int(sys.argv[3]), [int(b) for b in sys.argv[4].split()])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)
