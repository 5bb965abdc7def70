"""What the measured corpus says of a larger unroll step, all else equal: the evidence behind (and against)
space/single_accumulator.py. Prints a table, writes JSON; times nothing.

    .venv/bin/python benchmarks/unroll_pairs.py [--machine ID] [--all-tiles] [--json benchmarks/results/unroll_pairs_<cpu>.json]

Pairs of records of one task, timed on one machine, whose decisions differ in the unroll step alone (the same
sketch, tiles and compute-at sites), where the lower step leaves a CPU multi-level tile's region S2 x R1 x S3
rolled and the higher one unrolls it -- by default only tiles with a single accumulator (S3 one point) and S2
more than one, the rule's case; `--all-tiles` every tile. Each pair's ratio is the lower step's latency over
the higher one's (> 1: unrolling the region was faster), split by whether the higher step also unrolls more
of the other stages (space/unroll_loop.unrolled_elsewhere: an epilogue or a pad stage computed under the tile),
which the rule's second version refuses.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang.machine import describe  # noqa: E402


def best_by_point(dirs, machine: str) -> dict:
    """(file, op, sketch) -> decisions -> the best median latency of a correct record on `machine`."""
    from tensorlang.data.dataset import read
    out: dict = collections.defaultdict(dict)
    for d in dirs:
        for r in read(d):
            if r.get("machine") != machine or r.get("status") != "ok" or "decisions" not in r:
                continue
            decisions = tuple(tuple(x) if isinstance(x, list) else x for x in r["decisions"])
            key = (r["task"]["file"], r["task"]["op"], r["sketch"])
            out[key][decisions] = min(out[key].get(decisions, math.inf), r["median_s"])
    return out


def region(tile, decisions, all_tiles: bool) -> int | None:
    """S2 x R1 x S3 of a tile with these decisions; None where it is not the case counted."""
    from tensorlang.space.single_accumulator import single_accumulator_region
    spatial = [decisions[k] for k in tile.spatial]
    reduction = [decisions[k] for k in tile.reduction]
    if all_tiles:
        return math.prod(f[-2] * f[-1] for f in spatial) * math.prod(f[-1] for f in reduction)
    return single_accumulator_region(spatial, reduction)


def pairs(points: dict, all_tiles: bool, say=print) -> list[dict]:
    from tensorlang import api
    from tensorlang.space.single_accumulator import scheduled_function, unroll_facts
    from tensorlang.space.space import Space
    from tensorlang.space.unroll_loop import unrolled_elsewhere
    rows, spaces = [], {}
    for (file, op, sketch), measured in sorted(points.items()):
        groups = collections.defaultdict(list)  # (unroll index, the other decisions) -> decisions
        for d in measured:
            for i, x in enumerate(d):
                if isinstance(x, int) and x >= 0:
                    groups[(i, d[:i] + d[i + 1:])].append(d)
        groups = {k: v for k, v in groups.items() if len(v) > 1}
        if not groups:
            continue
        if (file, op) not in spaces:
            try:
                doc = api.load(ROOT / file)
                spaces[(file, op)] = Space(doc.model.ops[op], doc.primfunc(op), doc.model.targets["llvm"])
            except Exception as e:  # a task file gone or changed since it was measured
                say(f"skipped {file}:{op}: {type(e).__name__}: {e}")
                spaces[(file, op)] = None
        space = spaces[(file, op)]
        facts = unroll_facts(space, sketch) if space is not None and sketch < len(space.sketches) else None
        if facts is None or not facts.tiles or not facts.final:
            continue
        stage = facts.stage_blocks
        for (i, _), members in groups.items():
            if i != facts.unroll:
                continue
            sizes = [region(t, members[0], all_tiles) for t in facts.tiles]
            sizes = [s for s in sizes if s is not None]
            if not sizes:
                continue
            func = scheduled_function(space, sketch, members[0][:i])
            for a, b in itertools.combinations(sorted(members, key=lambda d: facts.steps[d[i]]), 2):
                low, high = facts.steps[a[i]], facts.steps[b[i]]
                if not low < max(sizes) <= high:
                    continue
                rows.append({"task": f"{file}:{op}", "sketch": sketch, "low": low, "high": high, "region": max(sizes),
                             "same_elsewhere": unrolled_elsewhere(func, low, stage) == unrolled_elsewhere(func, high, stage),
                             "speedup": measured[a] / measured[b]})
    return rows


def summary(rows: list[dict]) -> dict:
    def of(rs):
        xs = [r["speedup"] for r in rs]
        return {"pairs": len(xs), "tasks": len({r["task"] for r in rs}),
                "median_speedup": round(statistics.median(xs), 3) if xs else None,
                "faster_share": round(sum(x > 1 for x in xs) / len(xs), 2) if xs else None}
    return {"all": of(rows), "same elsewhere": of([r for r in rows if r["same_elsewhere"]]),
            "more elsewhere": of([r for r in rows if not r["same_elsewhere"]])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measured", action="append", default=None, help="dataset dirs (default data/measured/llvm)")
    ap.add_argument("--machine", default=None, help="the machine id whose records count (default: this host's)")
    ap.add_argument("--all-tiles", action="store_true", help="every multi-level tile, not only single accumulators")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    machine = describe()
    mid = args.machine or machine["machine_id"]
    rows = pairs(best_by_point(args.measured or [ROOT / "data" / "measured" / "llvm"], mid), args.all_tiles,
                 say=lambda m: print(m, file=sys.stderr))
    result = summary(rows)
    print(f"records of machine {mid}, {'every tile' if args.all_tiles else 'single-accumulator tiles, S2 > 1'}: "
          "pairs that differ only in the unroll step, the higher one unrolling S2 x R1 x S3")
    print(f"{'':16s} {'pairs':>6s} {'tasks':>6s} {'median lower/higher':>20s} {'higher faster':>14s}")
    for name, s in result.items():
        print(f"{name:16s} {s['pairs']:6d} {s['tasks']:6d} {s['median_speedup'] or 0:20.3f} "
              f"{(s['faster_share'] or 0) * 100:13.0f}%")
    command = " ".join([".venv/bin/python", "benchmarks/unroll_pairs.py", *sys.argv[1:]])
    print(f"command: {command}\nhost: {machine['llvm_mcpu']} ({machine['cpu']})")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, "machine": machine, "records_of": mid,
                                               "all_tiles": args.all_tiles, "summary": result, "pairs": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
