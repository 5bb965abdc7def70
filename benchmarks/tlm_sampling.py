"""How `tlm:K` should sample: the fastest of the model's K candidates at several temperatures, side by side.

    .venv/bin/python benchmarks/tlm_sampling.py [--model DIR] [--temperatures 1.0,0.7,0.4,0.2] [--k 8]
                                                [--tasks 28] [--repeat 3] [--json benchmarks/results/tlm_sampling.json]

On the validation tasks (benchmarks/tlm.py's in-distribution set: kept out of training, never the held-out
models -- this chooses a setting, so it must not look at the benchmark's held-out tasks), each temperature's
`Generator.sample(space, K, seed=0, temperature=T)` -- the one-pass schedule, then seeded samples -- and the
union of their distinct schedules measured in one harness run (interleaved rounds, under the measurement lock),
so a candidate two temperatures share has one latency. Per temperature: the geomean over tasks of its fastest
candidate's latency relative to the first temperature's (the baseline, > 1 = faster), its wins, and the mean
number of distinct candidates it found. lm/generate.py's SAMPLE_TEMPERATURE was chosen with this.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tlm as bench  # noqa: E402  (benchmarks/tlm.py: the validation task set)


def _ratio(xs):
    """benchmarks/tlm.py's geomean, rounded (nan where no task gave one)."""
    g = bench.geomean(xs)
    return round(g, 3) if g is not None else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="checkpoint directory (default: the shipped one)")
    ap.add_argument("--temperatures", default="1.0,0.7,0.4,0.2", help="the first is the baseline")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=28, help="validation tasks (benchmarks/tlm.py --indist)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=str(bench.RESULTS / "tlm_sampling.json"))
    args = ap.parse_args(argv)
    say = lambda m: print(f"tlm-sampling: {m}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()

    from tensorlang import api
    from tensorlang.bench import Candidate, measure_candidates
    from tensorlang.lm.generate import Generator
    from tensorlang.lower.targets import host_cores
    from tensorlang.space.space import Space

    temps = [float(t) for t in args.temperatures.split(",")]
    gen = Generator(args.model)
    tasks = bench.indist_tasks(40)[:args.tasks]
    chosen: dict[tuple, list[str]] = {}  # (task, T) -> its candidates' schedule texts, the one-pass one first
    unique: dict[tuple, Candidate] = {}  # (task, text) -> one candidate
    for file, _kind in tasks:
        doc = api.load(ROOT / file)
        target = doc.model.targets["llvm"]
        for name, op in doc.model.ops.items():
            task = f"{file}:{name}"
            space = Space(op, doc.primfunc(name), target)
            for t in temps:
                texts = [o.schedule_text for o in gen.sample(space, args.k, seed=0, temperature=t)]
                chosen[(task, t)] = texts
                for text in texts:
                    unique.setdefault((task, text), Candidate(f"{name}#{len(unique)}", op, target, text))
            say(f"{Path(file).stem[:48]}: " + ", ".join(f"T={t} {len(chosen[(task, t)])}" for t in temps))
    keys = list(unique)
    say(f"measuring {len(keys)} distinct candidates side by side, {args.repeat} rounds")
    results = measure_candidates([unique[k] for k in keys], repeat=args.repeat, timeout_s=60, threads=host_cores(),
                                 min_repeat_ms=50, progress=say)
    latency = {k: (r.median_s if r.status == "ok" else None) for k, r in zip(keys, results)}

    rows = []
    for (task, t), texts in chosen.items():
        ok = [latency[(task, x)] for x in texts if latency[(task, x)]]
        rows.append({"task": task, "temperature": t, "candidates": len(texts), "correct": len(ok),
                     "best_s": min(ok) if ok else None, "one_pass_s": latency[(task, texts[0])]})
    by = {(r["task"], r["temperature"]): r for r in rows}
    summary = {}
    for t in temps:
        pairs = [(by[(task, temps[0])]["best_s"], by[(task, t)]["best_s"]) for task in {r["task"] for r in rows}]
        pairs = [(b, x) for b, x in pairs if b and x]
        mine = [r for r in rows if r["temperature"] == t]
        summary[str(t)] = {
            "speedup_over_baseline": _ratio([b / x for b, x in pairs]),
            "wins": sum(x < b for b, x in pairs), "losses": sum(x > b for b, x in pairs), "tasks": len(pairs),
            "mean_candidates": round(sum(r["candidates"] for r in mine) / len(mine), 2),
            "best_over_one_pass": _ratio([r["one_pass_s"] / r["best_s"] for r in mine
                                          if r["best_s"] and r["one_pass_s"]])}
    report = {**bench.run_stamp("tlm_sampling.py", argv, started), "model": gen.name, "k": args.k, "baseline": temps[0],
              "tasks": len(tasks), "candidates_measured": len(keys), "summary": summary, "rows": rows,
              "duration_s": round(time.time() - started, 1)}
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    return 0


def format_report(report: dict) -> str:
    m = report["machine"]
    lines = [f"tlm:{report['k']} by sampling temperature -- {report['model']}, {report['tasks']} validation tasks, "
             f"{report['candidates_measured']} distinct candidates measured in one run on {m['llvm_mcpu']} "
             f"({m['cpu']})",
             f"{'temperature':>11}  {'fastest-of-K over T=' + str(report['baseline']):>24}  {'wins':>4}  "
             f"{'losses':>6}  {'candidates':>10}  {'fastest over one-pass':>21}"]
    for t, s in report["summary"].items():
        lines.append(f"{t:>11}  {s['speedup_over_baseline']:>24.3f}  {s['wins']:>4}  {s['losses']:>6}  "
                     f"{s['mean_candidates']:>10.2f}  {s['best_over_one_pass']:>21.3f}")
    lines.append(f"command: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
