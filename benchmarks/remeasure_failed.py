"""Re-measure (without recording) every measured record whose status is not `ok`, with today's harness:
which failures were the harness's (fixed since) and which are the schedule's own.

    .venv/bin/python benchmarks/remeasure_failed.py [DIRS...] > benchmarks/results/remeasure_failed.txt
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang.bench.harness import Candidate, measure_candidates  # noqa: E402
from tensorlang.data.dataset import read  # noqa: E402
from tensorlang.machine import host_line  # noqa: E402

if __name__ == "__main__":
    dirs = sys.argv[1:] or ["data/measured/llvm", "data/measured/cpu", "data/heldout/llvm"]
    recs = [r for d in dirs for r in read(ROOT / d) if r["status"] != "ok"]
    cands = [Candidate(f"{n}", (ROOT / r["task"]["file"]).read_text(), r["target"], r["schedule"],
                       op_name=r["task"]["op"]) for n, r in enumerate(recs)]
    results = measure_candidates(cands, repeat=1, timeout_s=60)
    print(f"# {len(recs)} records not ok in {', '.join(dirs)}; re-measured on {host_line()}")
    for r, res in zip(recs, results):
        print(f"{r['status']:>8} -> {res.status:<8} {r['task']['file']}:{r['task']['op']} {r['policy']} "
              f"sketch {r['sketch']}  {res.message[:80]}")
