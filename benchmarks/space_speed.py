"""Space Builder speed: sketch generation, sampling, sentence round trip, and the next-token API's
latency on the example operators (CPU and CUDA targets). Prints a table, writes JSON.
Holds the machine-wide measurement lock, so that a running `tensorlang collect` waits.

    .venv/bin/python benchmarks/space_speed.py [--json benchmarks/results/space_speed.json]

Latency is reported per token step (`allowed()` then `push()`) and per *free* decision: the steps of
one decision (its instruction, subject and value tokens) summed, for the decisions with more than one
legal value; forced tokens (one legal choice, which a decoder feeds in one forward step with the
prompt) are left out of the free-step figures. Each sample is decoded twice, on fresh decoder spaces:
back to back, and "paced", with a model step (--model-ms, default 5 ms: a small GPT-2's decode step
on these CPUs, shared/notes/lm-sizing.md) slept after each sampled (free) token, as a decoder spends
it before asking for the next legal set; only allowed()+push() are timed. The script uses only the
sentence API that v1 and v2 share (encode, prompt_tokens, NextTokens.allowed/push/finish), so the
same file times both: run it from a checkout of the older commit to compare on one host.
"""
from __future__ import annotations

import argparse
import inspect
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
# The tokens that open a decision, in v1 (TILE/CAT/LOC) and v2.
MARKERS = {"TILE", "CAT", "LOC", "UNROLL", "UNROLL_IMPLICIT", "VECTOR", "THREADS", "UNUSED"}


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return round(xs[int(0.95 * (len(xs) - 1))], 3) if xs else 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "space_speed.json"))
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--model-ms", type=float, default=5.0)
    ap.add_argument("--ops", default="", help="comma-separated op names to run (default: all)")
    args = ap.parse_args()
    from tensorlang.bench.lock import measure_lock
    ops = [o for o in OPS if not args.ops or o[1] in args.ops.split(",")]
    with measure_lock():
        rows = [measure(file, op, target, args.samples, args.model_ms) for file, op, target in ops]
    head = f"{'op':<18}{'target':>7}{'sketches':>9}{'build ms':>10}{'sample ms':>10}{'tokens':>8}" \
           f"{'step p95':>10}{'free step p95':>15}{'free dec. p50':>15}{'free dec. p95':>15}{'max':>8}" \
           f"{'paced p95':>11}"
    print(head)
    for r in rows:
        print(f"{r['op']:<18}{r['target']:>7}{r['sketches']:>9}{r['space_build_ms']:>10}{r['sample_ms']:>10}"
              f"{r['sentence_tokens']:>8}{r['step_p95_ms']:>10}{r['free_step_p95_ms']:>15}"
              f"{r['free_decision_median_ms']:>15}{r['free_decision_p95_ms']:>15}{r['free_decision_max_ms']:>8}"
              f"{r['paced']['free_decision_p95_ms']:>11}")
    out = {"command": " ".join(["python"] + sys.argv), "sentence_versions": S.version_tokens(), "model_ms": args.model_ms,
           "machine": describe(), "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def measure(file: str, op: str, target: str, samples: int, model_ms: float = 5.0) -> dict:
    """One operator: build the space, sample, then decode each sample token by token (on fresh spaces,
    so that nothing the sampling computed is reused)."""
    doc = api.load(ROOT / "examples" / f"{file}.tsched")
    tgt = api.resolve_target(doc, target)
    t = time.perf_counter()
    space = Space(doc.model.ops[op], doc.primfunc(op), tgt)
    build_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    points, rejections = space.sample(samples, seed=0)
    sample_ms = (time.perf_counter() - t) * 1e3 / max(len(points), 1)
    sentences = [S.encode(space, p) for p in points]
    for p, tokens in zip(points, sentences):
        assert S.decode(space, tokens) == (p.sketch, p.decisions)
    # Each decoder is a space of its own (nothing the sampling computed is reused), kept for all the
    # sentences, as a decoder writing several schedules of one operator would keep it.
    back_to_back = decode_timed(Space(doc.model.ops[op], doc.primfunc(op), tgt), sentences, 0.0)
    paced = decode_timed(Space(doc.model.ops[op], doc.primfunc(op), tgt), sentences, model_ms)
    return {"op": op, "target": target, "sketches": len(space.sketches), "space_build_ms": round(build_ms, 1),
            "sample_ms": round(sample_ms, 1), "rejections": rejections,
            "sentence_tokens": round(statistics.mean(map(len, sentences)), 1), **back_to_back, "paced": paced}


def decode_timed(decoder: Space, sentences: list[list[str]], model_ms: float) -> dict:
    steps, free_steps, decisions = [], [], []
    for tokens in sentences:
        # paced, a decoder lets the replay run during the model's step (v1 has no such option)
        eager = model_ms > 0 and "eager" in inspect.signature(S.NextTokens).parameters
        nt = S.NextTokens(decoder, eager=True) if eager else S.NextTokens(decoder)
        current = None  # [ms, free?] of the decision being written
        for tok in tokens[len(S.prompt_tokens(decoder)):]:
            t = time.perf_counter()
            allowed = nt.allowed()
            nt.push(tok)
            ms = (time.perf_counter() - t) * 1e3
            assert tok in allowed
            steps.append(ms)
            if len(allowed) > 1:
                free_steps.append(ms)
                if model_ms:
                    time.sleep(model_ms / 1e3)  # the model's forward step for the sampled token
            if tok in MARKERS and len(allowed) == 1:  # a decision starts
                if current is not None and current[1]:
                    decisions.append(current[0])
                current = [0.0, False]
            if current is not None:
                current[0] += ms
                current[1] |= len(allowed) > 1
        if current is not None and current[1]:
            decisions.append(current[0])
        nt.finish()  # the point is legal: the full replay accepts it (not timed)
        nt.close()
    return {"steps": len(steps), "step_median_ms": round(statistics.median(steps), 3), "step_p95_ms": p95(steps),
            "step_max_ms": round(max(steps), 3), "free_steps": len(free_steps), "free_step_p95_ms": p95(free_steps),
            "free_decisions": len(decisions),
            "free_decision_median_ms": round(statistics.median(decisions), 3) if decisions else 0.0,
            "free_decision_p95_ms": p95(decisions), "free_decision_max_ms": round(max(decisions, default=0), 3)}


if __name__ == "__main__":
    sys.exit(main())
