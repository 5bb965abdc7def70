"""CUDA spaces over the extracted workloads: how many sketches carry the GPU-limit model, and how many
uniform samples the postprocessors (VerifyGPUCode) refuse -- zero is the Space Builder's promise.
Also counts, for comparison, the refusals of the same sampling with the model switched off
(MetaSchedule's own way: sample each tile on its own, let VerifyGPUCode refuse). Prints a table,
writes JSON.

    .venv/bin/python benchmarks/gpu_space.py [--every 5] [--samples 5] [--json benchmarks/results/gpu_space.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang import api  # noqa: E402
from tensorlang.machine import describe  # noqa: E402
from tensorlang.space.space import Space  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=5, help="take every k-th extracted task")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "gpu_space.json"))
    args = ap.parse_args()
    files = sorted((ROOT / "data" / "workloads").glob("*/*.tsched"))[::args.every]
    rows = []
    t0 = time.time()
    for f in files:
        doc = api.load(f)
        for op in doc.model.ops:
            space = Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, "cuda"))
            t = time.perf_counter()
            points, refused = space.sample(args.samples, seed=1)
            ms = (time.perf_counter() - t) * 1e3 / max(len(points), 1)
            models = space.gpu_models
            space.gpu_models = [None] * len(models)  # MetaSchedule's way, for the comparison
            unmodelled_points, unmodelled_refused = space.sample(args.samples, seed=1, max_rejections=200)
            space.gpu_models = models
            rows.append({"task": f"{f.parent.name}/{f.stem}", "sketches": len(space.sketches),
                         "unmodelled_sketches": sum(m is None for m in models), "samples": len(points),
                         "refused": refused, "sample_ms": round(ms, 1),
                         "without_model_samples": len(unmodelled_points), "without_model_refused": unmodelled_refused})
            r = rows[-1]
            print(f"{r['task'][:60]:<62}{r['sketches']:>3}{r['unmodelled_sketches']:>3}{r['samples']:>4}"
                  f"{r['refused']:>4}{r['sample_ms']:>9}{r['without_model_refused']:>6}", flush=True)
    total = {k: sum(r[k] for r in rows) for k in ("sketches", "unmodelled_sketches", "samples", "refused",
                                                   "without_model_samples", "without_model_refused")}
    total["tasks"], total["seconds"] = len(rows), round(time.time() - t0)
    print(f"\n{total['tasks']} tasks, {total['sketches']} sketches ({total['unmodelled_sketches']} without a model): "
          f"{total['samples']} samples, {total['refused']} refused; without the model "
          f"{total['without_model_refused']} refused for {total['without_model_samples']} samples")
    out = {"command": " ".join(["python"] + sys.argv), "machine": describe(), "total": total, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
