"""Space Builder speed: sketch generation, sampling, sentence round trip, and the next-token API's
per-step latency on the example operators (CPU and CUDA targets). Prints a table, writes JSON.
Holds the machine-wide measurement lock, so that a running `tensorlang collect` waits.

    .venv/bin/python benchmarks/space_speed.py [--json benchmarks/results/space_speed.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang import api  # noqa: E402
from tensorlang.machine import describe  # noqa: E402
from tensorlang.space import sentence as S  # noqa: E402
from tensorlang.space.space import Space  # noqa: E402

OPS = [("matmul", "matmul", "cpu"), ("dense_gelu", "dense_gelu", "cpu"), ("conv2d", "conv2d", "cpu"),
       ("softmax", "softmax", "cpu"), ("auto", "layernorm", "llvm"), ("auto", "attention_scores", "llvm"),
       ("matmul", "matmul", "cuda"), ("dense_gelu", "dense_gelu", "cuda"), ("conv2d", "conv2d", "cuda"),
       ("softmax", "softmax", "cuda")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "space_speed.json"))
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    from tensorlang.bench.lock import measure_lock
    with measure_lock():
        rows = [measure(file, op, target, args.samples) for file, op, target in OPS]
    head = f"{'op':<18}{'target':>7}{'sketches':>9}{'build ms':>10}{'sample ms':>10}{'rej':>5}{'tokens':>8}" \
           f"{'step med':>10}{'step p95':>10}{'step max':>10}"
    print(head)
    for r in rows:
        print(f"{r['op']:<18}{r['target']:>7}{r['sketches']:>9}{r['space_build_ms']:>10}{r['sample_ms']:>10}"
              f"{r['rejections']:>5}{r['sentence_tokens']:>8}{r['step_median_ms']:>10}{r['step_p95_ms']:>10}"
              f"{r['step_max_ms']:>10}")
    out = {"command": " ".join(["python"] + sys.argv), "machine": describe(), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def measure(file: str, op: str, target: str, samples: int) -> dict:
    """One operator: build the space, sample, then decode each sample token by token (on a fresh
    space, so that nothing the sampling computed is reused)."""
    doc = api.load(ROOT / "examples" / f"{file}.tsched")
    tgt = api.resolve_target(doc, target)
    t = time.perf_counter()
    space = Space(doc.model.ops[op], doc.primfunc(op), tgt)
    build_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    points, rejections = space.sample(samples, seed=0)
    sample_ms = (time.perf_counter() - t) * 1e3 / max(len(points), 1)
    # The decoder is a space of its own (nothing the sampling computed is reused), kept for all the
    # sentences, as a decoder writing several schedules of one operator would keep it.
    decoder = Space(doc.model.ops[op], doc.primfunc(op), tgt)
    steps, lengths = [], []
    for p in points:
        tokens = S.encode(space, p)
        lengths.append(len(tokens))
        assert S.decode(space, tokens) == (p.sketch, p.decisions)
        nt = S.NextTokens(decoder)
        for tok in tokens[len(S.prompt_tokens(decoder)):]:
            t = time.perf_counter()
            allowed = nt.allowed()
            nt.push(tok)
            steps.append((time.perf_counter() - t) * 1e3)
            assert tok in allowed
        nt.finish()  # the point is legal: the full replay accepts it (not timed)
        nt.close()
    steps.sort()
    return {"op": op, "target": target, "sketches": len(space.sketches), "space_build_ms": round(build_ms, 1),
            "sample_ms": round(sample_ms, 1), "rejections": rejections,
            "sentence_tokens": round(statistics.mean(lengths), 1),
            "step_median_ms": round(statistics.median(steps), 3),
            "step_p95_ms": round(steps[int(0.95 * (len(steps) - 1))], 3),
            "step_max_ms": round(steps[-1], 3)}


if __name__ == "__main__":
    sys.exit(main())
