"""How `tlm-ranked:K` should pick: the model's K samples ranked by the cost model, against measuring them.

    .venv/bin/python benchmarks/cost_ranking.py [--k 16] [--tasks 28] [--repeat 3] [--cost-model DIR ...]
                                                [--json benchmarks/results/cost_ranking.json]

On the validation tasks (benchmarks/tlm.py's in-distribution set: kept out of the TLM's training and out of the
cost model's -- this chooses a setting, so it must not look at the benchmark's held-out tasks), the shipped
model's `Generator.sample(space, K, seed=0)` (the one-pass schedule first, then samples at SAMPLE_TEMPERATURE),
and the model's greedy schedule in each usable sketch none of those is in (baselines/tlm.other_sketches), each
candidate's predicted quality, and every candidate measured in one harness run (interleaved rounds, under the
measurement lock). Then, per candidate set (the first K' samples, K' <= K: what `tlm-ranked:K'` decodes; or
those and the other sketches' greedy schedules) and per rule, the geomean over tasks of the kept candidate's
throughput over the one-pass schedule's, and over the fastest of the set (measured: what measuring would keep):
- `one-pass`: the first candidate (policy `tlm`);
- `top`: the candidate the cost model ranks first;
- `guarded m`: that one only where it is predicted more than m above the one-pass one (cost.model.choose; the
  shipped rule is m = cost.model.MARGIN);
- `measured`: the fastest, measured (policy `tlm:K'`, the ceiling of any ranking of these candidates).
With `--cost-model` given more than once, every cost model ranks the same measured candidates (the first is the
main table; the others' summaries beside it): two cost models compared on one run's figures.
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

import tlm as bench  # noqa: E402  (benchmarks/tlm.py: the validation task set, geomean)

MARGINS = (0.0, 0.05, 0.1, 0.2)


def keep(rule: str, quality: list[float]) -> int:
    from tensorlang.cost.model import choose
    if rule == "one-pass":
        return 0
    if rule == "top":
        return choose(quality, margin=-1e9)
    return choose(quality, margin=float(rule.split()[1]))


def summarize(rows: list[dict], ks: list[int]) -> dict:
    """Per candidate set -- the first K' samples, or those and the other sketches' greedy schedules -- and rule."""
    rules = ["one-pass", "top"] + [f"guarded {m}" for m in MARGINS]
    out = {}
    for k in ks:
        for sketches in (False, True):
            per = {}
            for rule in rules + ["measured"]:
                over_one, over_best, wins, losses = [], [], 0, 0
                for r in rows:
                    idx = list(range(min(k, r["sampled"]))) + (list(range(r["sampled"], r["candidates"])) if sketches else [])
                    lat, q = [r["latency_s"][i] for i in idx], [r["quality"][i] for i in idx]
                    ok = [x for x in lat if x]
                    if not lat[0] or not ok:
                        continue
                    kept = lat[0 if rule == "one-pass" else lat.index(min(ok)) if rule == "measured" else keep(rule, q)]
                    if not kept:  # the kept one failed to run: the worst of the task
                        kept = max(ok)
                    over_one.append(lat[0] / kept)
                    over_best.append(min(ok) / kept)
                    wins, losses = wins + (kept < lat[0]), losses + (kept > lat[0])
                per[rule] = {"over_one_pass": _round(bench.geomean(over_one)), "over_measured_best":
                             _round(bench.geomean(over_best)), "wins": wins, "losses": losses, "tasks": len(over_one)}
            out[f"{k}{' + other sketches' if sketches else ''}"] = per
    return out


def _round(x):
    return round(x, 3) if x is not None else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=28, help="validation tasks (benchmarks/tlm.py --indist)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost-model", action="append",
                    help="cost model directory (default: the shipped one); repeat to compare cost models")
    ap.add_argument("--json", default=str(bench.RESULTS / "cost_ranking.json"))
    args = ap.parse_args(argv)
    say = lambda m: print(f"cost-ranking: {m}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.time()

    from tensorlang import api
    from tensorlang.baselines.tlm import other_sketches
    from tensorlang.bench import Candidate, measure_candidates
    from tensorlang.cost.features import featurize
    from tensorlang.cost.model import CostModel
    from tensorlang.lm.generate import Generator
    from tensorlang.lower.targets import host_cores
    from tensorlang.space.space import Space

    gen = Generator()
    models = [CostModel.load(d) for d in (args.cost_model or [None])]
    model = models[0]
    tasks = bench.indist_tasks(40)[:args.tasks]
    rows, cands = [], []
    for file, _kind in tasks:
        doc = api.load(ROOT / file)
        target = doc.model.targets["llvm"]
        for name, op in doc.model.ops.items():
            space = Space(op, doc.primfunc(name), target)
            t0 = time.perf_counter()
            outs = gen.sample(space, args.k, seed=0)
            sampled = len(outs)
            outs += other_sketches(gen, space, outs)
            t1 = time.perf_counter()
            X = featurize(space, [o.point.mod for o in outs])  # once, for every cost model
            qualities = {model.name: [round(q, 4) for q in model.predict(X).tolist()]}
            t2 = time.perf_counter()  # rank_s: the main cost model's ranking (features + predict), as the policy runs it
            qualities.update({m.name: [round(q, 4) for q in m.predict(X).tolist()] for m in models[1:]})
            rows.append({"task": f"{file}:{name}", "candidates": len(outs), "sampled": sampled,
                         "quality": qualities[model.name], "quality_by_cost_model": qualities,
                         "sample_s": round(t1 - t0, 3), "rank_s": round(t2 - t1, 3), "first": len(cands)})
            cands += [Candidate(f"{name}#{i}", op, target, o.schedule_text) for i, o in enumerate(outs)]
            say(f"{Path(file).stem[:48]}: {len(outs)} candidates, sampled {t1 - t0:.2f} s, ranked {t2 - t1:.2f} s")
    say(f"measuring {len(cands)} candidates side by side, {args.repeat} rounds")
    results = measure_candidates(cands, repeat=args.repeat, timeout_s=60, threads=host_cores(), min_repeat_ms=50,
                                 progress=say)
    for r in rows:
        first = r.pop("first")
        r["latency_s"] = [(x.median_s if x.status == "ok" else None) for x in results[first:first + r["candidates"]]]
    ks = sorted({k for k in (8, args.k) if k <= args.k})
    report = {**bench.run_stamp("cost_ranking.py", argv, started), "model": gen.name, "cost_model": model.name,
              "cost_model_card": model.card, "tasks": len(rows), "candidates_measured": len(cands),
              "summary": summarize(rows, ks),
              "summary_by_cost_model": {m.name: {"card": m.card, "summary": summarize(
                  [{**r, "quality": r["quality_by_cost_model"][m.name]} for r in rows], ks)} for m in models},
              "rows": rows, "duration_s": round(time.time() - started, 1)}
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    return 0


def format_report(report: dict) -> str:
    m = report["machine"]
    lines = [f"tlm-ranked: {report['model']} ranked by {report['cost_model']}, {report['tasks']} validation tasks, "
             f"{report['candidates_measured']} candidates measured in one run on {m['llvm_mcpu']} ({m['cpu']})"]
    for k, per in report["summary"].items():
        lines.append(f"\nK = {k}:\n{'rule':>21}  {'over one-pass':>13}  {'wins':>4}  {'losses':>6}  "
                     f"{'over the measured best':>22}")
        for rule, s in per.items():
            lines.append(f"{rule:>21}  {s['over_one_pass']:>13}  {s['wins']:>4}  {s['losses']:>6}  "
                         f"{s['over_measured_best']:>22}")
    if len(report.get("summary_by_cost_model", {})) > 1:
        lines.append("\nthe same candidates ranked by each cost model (kept over one-pass, wins/losses):")
        for name, v in report["summary_by_cost_model"].items():
            for k, per in v["summary"].items():
                lines.append(f"{name:>40}  K = {k:<22}" + "  ".join(
                    f"{rule} {per[rule]['over_one_pass']} ({per[rule]['wins']}/{per[rule]['losses']})"
                    for rule in ("top", "guarded 0.1")))
    lines.append(f"command: {report['command']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
