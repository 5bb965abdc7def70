"""The policies side by side on a GPU, from one lease's measurements of a bundle (benchmarks/gpu_lease.sh).

    python benchmarks/gpu_policies.py .gpu/bundle meta/results.jsonl --json benchmarks/results/gpu_policies_h200.json

Per task of the bundle (each timed in one runner process, candidates one after another): roller's schedule,
the model's one-pass schedule (`tlm:<name>`; the model is untuned for GPUs until GPU records reach its
fine-tuning), and the best of the uniform random samples -- each as throughput relative to roller (higher is
better), geomean over the tasks where both ran correctly; and how many candidates of each policy were correct,
wrong (against the NumPy reference) or failed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path


def _geomean(xs: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, xs)) / len(xs)), 3) if xs else None


def summarise(bundle: Path, results: Path) -> dict:
    manifest = json.loads((bundle / "manifest.json").read_text())
    res = {}
    for line in results.read_text().splitlines():
        r = json.loads(line)
        res[r["key"]] = r
    machine = next((r["machine"] for r in res.values()), "?")
    status: dict[str, Counter] = {}
    rows = []
    model = manifest.get("model")
    tlm_policy = f"tlm:{model}" if model else None
    for task in manifest["tasks"]:
        def latency(key):
            r = res.get(key)
            return r["median_s"] if r and r["status"] == "ok" else None
        for c in task["candidates"]:
            if c["key"] in res:
                kind = c["policy"].split(":")[0] + (":sample" if c["policy"].endswith(":sample") else "")
                status.setdefault(kind, Counter())[res[c["key"]]["status"]] += 1
        pol = task.get("policies", {})
        roller = latency(pol.get("roller"))
        tlm = latency(pol.get(tlm_policy)) if tlm_policy else None
        randoms = [latency(c["key"]) for c in task["candidates"] if c["policy"] == "random"]
        randoms = [x for x in randoms if x is not None]
        timed = [latency(c["key"]) for c in task["candidates"]]
        timed = [x for x in timed if x is not None]
        if not timed:
            continue
        rows.append({"task": f"{Path(task['file']).parent.name}/{task['op']}", "flops": task["flops"],
                     "roller_s": roller, "tlm_s": tlm, "best_random_s": min(randoms) if randoms else None,
                     "best_s": min(timed), "tlm_is_roller": pol.get(tlm_policy) == pol.get("roller")})
    both = [r for r in rows if r["roller_s"] and r["tlm_s"]]
    rand = [r for r in rows if r["roller_s"] and r["best_random_s"]]
    return {
        "command": " ".join(["benchmarks/gpu_policies.py"] + sys.argv[1:]), "machine": machine, "model": model,
        "bundle_made": manifest.get("made"), "tasks_timed": len(rows),
        "status_by_policy": {k: dict(v) for k, v in status.items()},
        "tlm_over_roller": {"geomean": _geomean([r["roller_s"] / r["tlm_s"] for r in both]), "tasks": len(both),
                            "wins": sum(r["tlm_s"] < r["roller_s"] for r in both),
                            "same_schedule": sum(r["tlm_is_roller"] for r in both)},
        "best_random_over_roller": {"geomean": _geomean([r["roller_s"] / r["best_random_s"] for r in rand]),
                                    "tasks": len(rand), "wins": sum(r["best_random_s"] < r["roller_s"] for r in rand)},
        "best_of_bundle_over_roller": _geomean([r["roller_s"] / r["best_s"] for r in rows if r["roller_s"]]),
        "rows": rows}


def table(s: dict) -> str:
    out = [f"{s['machine']}: {s['tasks_timed']} tasks; throughput over roller (geomean; > 1 is faster)",
           f"  tlm one pass ({s['model']}): {s['tlm_over_roller']['geomean']} "
           f"(wins {s['tlm_over_roller']['wins']}/{s['tlm_over_roller']['tasks']}, "
           f"{s['tlm_over_roller']['same_schedule']} the same schedule as roller)",
           f"  best of the random samples: {s['best_random_over_roller']['geomean']} "
           f"(wins {s['best_random_over_roller']['wins']}/{s['best_random_over_roller']['tasks']})",
           f"  best of the bundle: {s['best_of_bundle_over_roller']}",
           "  candidates ok/wrong/error: " + "; ".join(f"{k} {v.get('ok', 0)}/{v.get('wrong', 0)}/{v.get('error', 0)}"
                                                     for k, v in s["status_by_policy"].items())]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("results", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    s = summarise(args.bundle, args.results)
    print(table(s))
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
