"""How reproducible a collected latency is, by timing protocol: the same built kernels (collect_speed.py's 8 tasks,
`--trials` candidates each) timed again and again in one run, protocols interleaved, so that each protocol's
figures can be compared with its own (noise) and with the others' (bias).

    .venv/bin/python benchmarks/timing_protocol.py [--trials 8] [--passes 2] [--protocol 50:0.02 --protocol 25:0.02]
                                                   [--json benchmarks/results/timing_protocol.json]

A protocol is `MIN_REPEAT_MS:SETTLED` (SETTLED 0: every one of the 3 rounds), timed as `collect` times a batch
(3 rounds, slow factor 4). Per protocol: the timing seconds per candidate, how far one pass's latency of a
candidate is from another pass's (the noise a protocol lets in: median |ratio - 1|, the share within 5 %),
and how often a candidate's quality bucket (lm/data.py: its latency over its task's best in that pass) is
the same in both; per pair of protocols, their latency ratio and bucket agreement (a protocol that biased
latencies would show it here).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from collect_speed import TASKS  # noqa: E402

from tensorlang.machine import describe  # noqa: E402


def build_all(trials: int, workdir: str) -> list:
    """(task's op, Candidate of a built library) for each task's candidates, in collect's order."""
    from tensorlang import api
    from tensorlang.bench.harness import Candidate, Library
    from tensorlang.bench.worker import build_job
    from tensorlang.data.collect import candidates_for, find_tasks
    from tensorlang.parser.printer import format_stmt
    from tensorlang.space.space import Space
    out = []
    for task in find_tasks([str(ROOT / t) for t in TASKS]):
        doc = api.load_text(task.text, task.file)
        tgt = doc.model.targets["llvm"]
        op = doc.model.ops[task.op]
        cands, _ = candidates_for(Space(op, doc.primfunc(task.op), tgt), task.key, trials)
        for n, (policy, point) in enumerate(cands):
            built = build_job({"op": op, "target": tgt, "schedule": "\n".join(format_stmt(s) for s in point.stmts),
                               "path": os.path.join(workdir, f"{task.key[:12]}-{n}.so")})  # as a build worker does
            if "path" in built:
                out.append((task.op, Candidate(f"{policy}#{n}", task.text, "llvm", Library(built["path"]),
                                               op_name=task.op)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--passes", type=int, default=2, help="times each protocol times every candidate")
    ap.add_argument("--protocol", action="append", default=None, help="MIN_REPEAT_MS:SETTLED (repeatable)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "timing_protocol.json"))
    args = ap.parse_args()
    protocols = args.protocol or ["50:0.02", "25:0.02"]
    from tensorlang.bench.harness import Harness
    from tensorlang.data.collect import SLOW_FACTOR
    from tensorlang.lm.data import quality_token
    work = tempfile.mkdtemp(prefix="timing-protocol-")
    t0 = time.monotonic()
    built = build_all(args.trials, work)
    build_s = time.monotonic() - t0
    batches: dict = {}  # one batch per task, as collect times them
    for op_name, cand in built:
        batches.setdefault(op_name, []).append(cand)
    latency: dict = {p: [] for p in protocols}  # protocol -> one {candidate: median_s} per pass
    seconds: dict = {p: [] for p in protocols}
    with Harness() as h:
        for k in range(args.passes):
            for p in (protocols if k % 2 == 0 else protocols[::-1]):  # interleaved, order alternating
                ms, settled = p.split(":")
                t = time.monotonic()
                got = {}
                for op_name, batch in batches.items():
                    results = h.measure(batch, repeat=3, min_repeat_ms=float(ms), slow_factor=SLOW_FACTOR,
                                        settled=float(settled) or None)
                    got.update({f"{op_name}:{c.name}": r.median_s for c, r in zip(batch, results) if r.ok})
                seconds[p].append(time.monotonic() - t)
                latency[p].append(got)
                print(f"pass {k + 1}, {p}: {len(got)} ok, {seconds[p][-1]:.1f} s", flush=True)

    def buckets(got: dict) -> dict:
        """candidate -> its quality bucket in this pass (latency over its task's best in the pass)."""
        best: dict = {}
        for name, s in got.items():
            task = name.rsplit(":", 1)[0]
            best[task] = min(s, best.get(task, s))
        return {name: quality_token(s / best[name.rsplit(":", 1)[0]]) for name, s in got.items()}

    def compare(a: dict, b: dict) -> dict:
        rs = [b[x] / a[x] for x in a if x in b]
        dev = sorted(abs(r - 1) for r in rs)
        qa, qb = buckets(a), buckets(b)
        return {"candidates": len(rs), "median_ratio": round(statistics.median(rs), 3),
                "median_abs_dev": round(statistics.median(dev), 4),
                "within_5pct": round(sum(d <= 0.05 for d in dev) / len(dev), 3),
                "p90_abs_dev": round(dev[len(dev) * 9 // 10], 3),
                "same_bucket": round(sum(qa[x] == qb[x] for x in qa if x in qb) / len(rs), 3),
                "q3_disagreements": sum((qa[x] == "Q3") != (qb[x] == "Q3") for x in qa if x in qb)}
    report = {"command": " ".join([Path(sys.executable).name] + sys.argv), "machine": describe(),
              "tasks": TASKS, "trials": args.trials, "candidates": len(built), "build_s": round(build_s, 1),
              "protocols": {}, "between": {}}
    for p in protocols:
        pairs = [compare(a, b) for a, b in itertools.combinations(latency[p], 2)]
        report["protocols"][p] = {"timing_s_per_pass": [round(s, 1) for s in seconds[p]],
                                  "timing_s_per_candidate": round(statistics.median(seconds[p]) / len(built), 3),
                                  "pass_against_pass": pairs,
                                  "median_over_pairs": {k: round(statistics.median(x[k] for x in pairs), 4)
                                                        for k in ("median_abs_dev", "within_5pct", "p90_abs_dev",
                                                                  "same_bucket")}
                                  if pairs else {}}
    for p, q in itertools.combinations(protocols, 2):
        report["between"][f"{q} / {p}"] = [compare(a, b) for a, b in zip(latency[p], latency[q])]
    print(f"{'protocol':14} {'s / candidate':>14} {'pass vs pass: median |dev|':>27} {'within 5 %':>11} {'p90 |dev|':>10}"
          f" {'same bucket':>12}   (medians over the pairs of passes)")
    for p, r in report["protocols"].items():
        c = r["median_over_pairs"]
        print(f"{p:14} {r['timing_s_per_candidate']:>14} {c.get('median_abs_dev', '-'):>27} "
              f"{c.get('within_5pct', '-'):>11} {c.get('p90_abs_dev', '-'):>10} {c.get('same_bucket', '-'):>12}")
    for pair, cs in report["between"].items():
        for c in cs:
            print(f"  {pair}: median ratio {c['median_ratio']}, median |dev| {c['median_abs_dev']}, "
                  f"{c['within_5pct']} within 5 %, same bucket {c['same_bucket']}, "
                  f"Q3 in one only {c['q3_disagreements']}")
    print(f"host {report['machine']['llvm_mcpu']}")
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
