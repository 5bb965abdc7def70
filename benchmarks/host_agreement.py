"""Does this host time kernels as a machine in the corpus did? Re-measures (without recording) a sample of
the `ok` records another machine id timed -- the same harness settings `collect` uses -- and prints, per
record, the new median over the stored one; the median of those ratios says whether the two machines'
latencies can share one id (the same CPU model seen through two VM instances that expose different
flags, say). Prints a table, writes JSON.

    .venv/bin/python benchmarks/host_agreement.py --machine 24360fcd56cb [--n 40] [--json PATH]
"""
import argparse
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang.bench.harness import Candidate, measure_candidates  # noqa: E402
from tensorlang.data.dataset import read  # noqa: E402
from tensorlang.machine import describe, host, host_line  # noqa: E402


def sample(dirs: list[str], machine: str, n: int, seed: int) -> list[dict]:
    """One `ok` record per task (a random one), for n random tasks the machine timed."""
    by_task: dict = {}
    for d in dirs:
        for r in read(ROOT / d):
            if r["machine"] == machine and r["status"] == "ok" and r.get("median_s") and r.get("schedule"):
                by_task.setdefault(r["task"]["hash"], []).append(r)
    rng = random.Random(seed)
    tasks = sorted(by_task)
    rng.shuffle(tasks)
    return [rng.choice(by_task[t]) for t in sorted(tasks[:n])]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", required=True, help="the machine id whose records are re-timed")
    ap.add_argument("--dirs", nargs="*", default=["data/measured/llvm"])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "host_agreement.json"))
    args = ap.parse_args()
    recs = sample(args.dirs, args.machine, args.n, args.seed)
    cands = [Candidate(str(i), (ROOT / r["task"]["file"]).read_text(), "llvm", r["schedule"], op_name=r["task"]["op"])
             for i, r in enumerate(recs)]
    # collect's settings: 3 rounds of at least 50 ms each
    results = measure_candidates(cands, repeat=3, timeout_s=30, min_repeat_ms=50)
    rows = []
    for r, res in zip(recs, results):
        row = {"task": f"{r['task']['file']}:{r['task']['op']}", "policy": r["policy"], "stored_s": r["median_s"],
               "stored_on": (r.get("host") or {}).get("simd"), "status": res.status,
               "now_s": res.median_s if res.ok else None}
        row["ratio"] = round(row["now_s"] / r["median_s"], 4) if res.ok else None
        rows.append(row)
    ratios = [x["ratio"] for x in rows if x["ratio"]]
    print(f"# {len(recs)} records of machine {args.machine} re-timed on {host_line()} (machine {host().id})")
    print(f"{'task':<70}{'stored ms':>11}{'now ms':>10}{'now/stored':>12}")
    for x in rows:
        now = f"{x['now_s'] * 1e3:.3f}" if x["now_s"] else x["status"]
        print(f"{x['task'][-70:]:<70}{x['stored_s'] * 1e3:>11.3f}{now:>10}{x['ratio'] or '':>12}")
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    summary = {"records": len(rows), "ok": len(ratios), "median_ratio": round(statistics.median(ratios), 4),
               "q1_ratio": round(q[0], 4), "q3_ratio": round(q[2], 4),
               "within_10pct": sum(0.9 <= x <= 1.1 for x in ratios)}
    print(f"now/stored: median {summary['median_ratio']}, quartiles {summary['q1_ratio']}..{summary['q3_ratio']}, "
          f"{summary['within_10pct']} of {len(ratios)} within 10 %")
    out = {"command": " ".join(["python"] + sys.argv), "machine": describe(), "old_machine": args.machine,
           "summary": summary, "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
