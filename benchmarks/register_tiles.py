"""The measured corpus's register tiles by the operator's arithmetic intensity: the count an FMA-chains decoding
rule was drawn from (2026-12-07; measured side by side and dropped: the model card's notes) and the register-file
bound of space/register_tile.py.

    .venv/bin/python benchmarks/register_tiles.py [--machine ID] [--min-records 16]
                                                  [--json benchmarks/results/register_tiles_<cpu>.json]

For every task with at least --min-records correct records timed on this machine (data/measured/llvm), each
record's register tile -- the innermost factors of its CPU multi-level tile's spatial loops (the first stage
whose splits have four factors), counted in vector registers as register_tile.registers_needed counts them (the
last loop in vectors of this host's fp32 lanes, contiguous runs as one) -- against its latency over the task's
best. Tasks are classed by the operator's flops per byte of compulsory traffic (`intensity`). Printed per class
and register bucket: how many records, and how many run within 1.25x of their task's best; and per class, how many
tasks have their best record on fewer than MIN_CHAINS registers. No kernel is run.

One accumulator register is one chain of dependent fused multiply-adds, each waiting the FMA's latency (4-5
cycles here); independent chains fill the gap where a kernel is bound by arithmetic. The count agrees (znver4,
shards to 26: at 16 flop/byte or more, 1-register records within 1.25x of their task's best 2.6 % of the time,
4-7 registers 14.4 %; below 4 flop/byte 55 of 61 tasks have their best on fewer than 4), yet a decoding rule
keeping at least 4 registers in such operators lost side by side (validation 0.71x): counts over random samples
do not say where the model's own choices go wrong.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPLIT = re.compile(r"^([\w, ]+) = split\((\w+)\.(\w+), \[([\d, ]+)\]\)$")
MIN_CHAINS = 4  # the FMA latency in cycles on the CPUs here, at one vector FMA a cycle
CLASSES = ((0.0, "below 4 flop/byte"), (4.0, "4-16 flop/byte"), (16.0, "16 flop/byte or more"))
BUCKETS = ((1, "1"), (3, "2-3"), (7, "4-7"), (16, "8-16"), (32, "17-32"), (math.inf, "over 32"))


def intensity(op) -> float:
    """The operator's flops per byte of compulsory traffic (every input read once, every output written once)."""
    return op.flops / max(1, op.bytes)


def register_tile(schedule: str, lanes: int) -> int | None:
    """Vector registers of a schedule's multi-level tile (the first stage split into four levels), or None."""
    from tensorlang.space.register_tile import registers_needed
    stage, factors = None, []
    for line in schedule.splitlines():
        m = SPLIT.match(line.strip())
        if m and len(m.group(4).split(",")) == 4 and stage in (None, m.group(2)):
            stage = m.group(2)
            factors.append([int(x) for x in m.group(4).split(",")])
    if not factors:
        return None
    return registers_needed([f[-1] for f in factors], [math.prod(f) for f in factors], lanes)


def class_of(intensity: float) -> str:
    return [name for lo, name in CLASSES if intensity >= lo][-1]


def bucket_of(registers: int) -> str:
    return next(name for hi, name in BUCKETS if registers <= hi)


def main(argv=None) -> int:
    from tensorlang import api
    from tensorlang.data.collect import find_tasks
    from tensorlang.data.dataset import read
    from tensorlang.machine import describe, host
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--machine", default=None, help="the records' machine id (default: this host's)")
    ap.add_argument("--min-records", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    me = describe()
    machine = args.machine or me["machine_id"]
    lanes = host().vector_bits // 32  # fp32 lanes, as space/vector_tile.vector_lanes counts them
    ops = {}
    for t in find_tasks([str(ROOT / "data/workloads"), str(ROOT / "data/workloads-variants")]):
        if t.key not in ops:
            ops[t.key] = intensity(api.load_text(t.text, t.file).model.ops[t.op])
    by_task = collections.defaultdict(list)
    for r in read(ROOT / "data/measured/llvm"):
        if r["machine"] == machine and r["status"] == "ok" and r.get("median_s"):
            by_task[r["task"]["hash"]].append(r)
    records = collections.Counter()
    near = collections.Counter()
    best_few, tasks = collections.Counter(), collections.Counter()
    for key, recs in by_task.items():
        if len(recs) < args.min_records or key not in ops:
            continue
        best = min(r["median_s"] for r in recs)
        tiles = [(register_tile(r["schedule"], lanes), r["median_s"] / best) for r in recs]
        tiles = [(n, x) for n, x in tiles if n is not None]
        if not tiles:
            continue
        cls = class_of(ops[key])
        tasks[cls] += 1
        best_few[cls] += min(tiles, key=lambda t: t[1])[0] < MIN_CHAINS
        for n, ratio in tiles:
            records[cls, bucket_of(n)] += 1
            near[cls, bucket_of(n)] += ratio <= 1.25
    report = {"command": " ".join(["benchmarks/register_tiles.py"] + (argv if argv is not None else sys.argv[1:])),
              "machine": me, "records_machine": machine, "lanes": lanes, "min_chains": MIN_CHAINS, "classes": {}}
    print(f"register tiles of the measured corpus ({me['llvm_mcpu']}, records of machine {machine}, {lanes} lanes)")
    for _, cls in CLASSES:
        if not tasks[cls]:
            continue
        row = {"tasks": tasks[cls], f"tasks_best_below_{MIN_CHAINS}": best_few[cls], "buckets": {}}
        print(f"\n{cls}: {tasks[cls]} tasks, {best_few[cls]} with their best on fewer than {MIN_CHAINS} registers")
        for _, b in BUCKETS:
            n = records[cls, b]
            if n:
                row["buckets"][b] = {"records": n, "within_1.25x_of_best": near[cls, b],
                                     "share": round(near[cls, b] / n, 3)}
                print(f"  {b:>8s} registers: {n:6d} records, {100 * near[cls, b] / n:5.1f} % within 1.25x of best")
        report["classes"][cls] = row
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
