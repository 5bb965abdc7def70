"""Generation speed, old code against new, side by side on one host: the one-pass schedule and `sample(K)` of
the shipped model on the same operators, from a git worktree of an older commit and from this checkout.

    .venv/bin/python benchmarks/generation_speed.py [--old COMMIT] [--set heldout] [--k 8,16] [--rounds 2] [--limit N]
                                                    [--json benchmarks/results/generation_speed.json]

Each side runs in processes of its own (its own `tensorlang` on sys.path, the checkpoint of its own tree),
old, new, new, old, ... (`--rounds` pairs), so drift spreads evenly. In a process, per operator of the task set
(benchmarks/tlm.py's held-out or in-distribution tasks): the space built (not timed), one untimed `generate`
(warms the space's memo), then a timed `generate` (one pass, `--repeat` times) and a timed `sample(space, K,
seed=0)` per K. Figures per side: the median over rounds of each operator's time, then over operators the
median and p95, and the geomean of new / old per operator (the speed-up); the one-pass schedules must be the
same text on both sides (the speed-up is the decoding's, not another schedule's), and for the samples the
number of distinct candidates each found (their draws differ where the sampler changed). torch threads: the
Generator's (1).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

_CHILD = r"""
import json, sys, time
tree, tasks, ks, repeat = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, tree)
from tensorlang import api
from tensorlang.lm.generate import Generator
from tensorlang.space.space import Space
gen = Generator(tree + "/tensorlang/lm/checkpoints/default")
out = {}
for file, _kind in tasks:
    doc = api.load(file)
    for name, op in doc.model.ops.items():
        space = Space(op, doc.primfunc(name), doc.model.targets["llvm"])
        first = gen.generate(space)
        row = {"text": first.schedule_text, "one_pass_s": [], "sample_s": {}, "distinct": {}}
        for _ in range(repeat):
            t0 = time.perf_counter(); gen.generate(space); row["one_pass_s"].append(time.perf_counter() - t0)
        for k in ks:
            t0 = time.perf_counter(); outs = gen.sample(space, k, seed=0)
            row["sample_s"][str(k)] = time.perf_counter() - t0
            row["distinct"][str(k)] = len(outs)
        out[f"{file}:{name}"] = row
print(json.dumps(out))
"""


def run_side(tree: Path, tasks, ks, repeat: int) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(tree), json.dumps(tasks), json.dumps(ks), str(repeat)],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"generation-speed: {tree}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)]


def summarize(old: list[dict], new: list[dict], ks) -> dict:
    """Per operator the median over rounds (one pass: over rounds and repeats), then the table's figures."""
    ops = sorted(old[0])

    def per_op(runs, get):
        return {op: statistics.median(x for r in runs for x in get(r[op])) for op in ops}
    figures = {"one pass": (lambda row: row["one_pass_s"])}
    figures.update({f"sample {k}": (lambda row, k=k: [row["sample_s"][str(k)]]) for k in ks})
    out = {}
    for label, get in figures.items():
        o, n = per_op(old, get), per_op(new, get)
        out[label] = {"old_median_s": round(statistics.median(o.values()), 4), "old_p95_s": round(p95(o.values()), 4),
                      "new_median_s": round(statistics.median(n.values()), 4), "new_p95_s": round(p95(n.values()), 4),
                      "speedup_geomean": round(math.exp(statistics.fmean(math.log(o[x] / n[x]) for x in ops)), 3)}
    for k in ks:
        out[f"sample {k}"]["old_distinct_mean"] = round(statistics.fmean(old[0][x]["distinct"][str(k)] for x in ops), 2)
        out[f"sample {k}"]["new_distinct_mean"] = round(statistics.fmean(new[0][x]["distinct"][str(k)] for x in ops), 2)
    out["one-pass schedules the same"] = f"{sum(old[0][x]['text'] == new[0][x]['text'] for x in ops)}/{len(ops)}"
    out["operators"] = len(ops)
    return out


def main(argv=None) -> int:
    import tlm as bench  # benchmarks/tlm.py: the task sets
    from tensorlang.machine import describe
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="HEAD", help="the older commit (default HEAD: this checkout's changes)")
    ap.add_argument("--set", choices=("heldout", "indist"), default="heldout")
    ap.add_argument("--indist", type=int, default=22, help="in-distribution tasks (--set indist)")
    ap.add_argument("--limit", type=int, default=None, help="the first N tasks of the set")
    ap.add_argument("--k", default="8,16", help="sample counts")
    ap.add_argument("--repeat", type=int, default=3, help="one-pass generations per operator and process")
    ap.add_argument("--rounds", type=int, default=2, help="old/new pairs of processes")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    started = time.time()
    ks = [int(k) for k in args.k.split(",") if k]
    tasks = bench.HELDOUT if args.set == "heldout" else bench.indist_tasks(args.indist)
    tasks = [list(t) for t in tasks][:args.limit]
    old, new = [], []
    with tempfile.TemporaryDirectory(prefix="tlm-gen-speed-") as tmp:
        tree = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.old], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for i in range(args.rounds):
                for side in (("old", "new") if i % 2 == 0 else ("new", "old")):
                    t0 = time.perf_counter()
                    res = run_side(tree if side == "old" else ROOT, tasks, ks, args.repeat)
                    (old if side == "old" else new).append(res)
                    print(f"  round {i + 1} {side}: {len(res)} operators, {time.perf_counter() - t0:.0f} s",
                          file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    summary = summarize(old, new, ks)
    old_commit = subprocess.run(["git", "rev-parse", "--short", args.old], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    new_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip())
    report = {"command": shlex.join([".venv/bin/python", "benchmarks/generation_speed.py"] + (argv or sys.argv[1:])),
              "machine": describe(), "old": old_commit, "new": new_commit + ("+changes" if dirty else ""),
              "set": args.set, "k": ks, "rounds": args.rounds, "repeat": args.repeat, "summary": summary,
              "duration_s": round(time.time() - started, 1)}
    print(f"generation speed, {describe()['llvm_mcpu']}: {old_commit} (old) against {report['new']} (new), "
          f"{summary['operators']} operators of the {args.set} set, medians of {args.rounds} processes each")
    print(f"{'':12s} {'old p50':>9s} {'old p95':>9s} {'new p50':>9s} {'new p95':>9s} {'speed-up':>9s}  distinct old/new")
    for label, s in summary.items():
        if not isinstance(s, dict):
            continue
        distinct = f"  {s['old_distinct_mean']}/{s['new_distinct_mean']}" if "old_distinct_mean" in s else ""
        print(f"{label:12s} {s['old_median_s']:9.3f} {s['old_p95_s']:9.3f} {s['new_median_s']:9.3f} "
              f"{s['new_p95_s']:9.3f} {s['speedup_geomean']:8.2f}x{distinct}")
    print(f"one-pass schedules the same: {summary['one-pass schedules the same']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
