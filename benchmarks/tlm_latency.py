"""Latency of the tensor language model's Generator on this CPU: imports apart, model load, and one schedule
per operator of examples/*.tsched on llvm (this host) and cuda (sm_90), with the forced-token share.

    .venv/bin/python benchmarks/tlm_latency.py [--model DIR] [--beams N] [--repeat 10]
                                               [--json benchmarks/results/tlm_latency.json]

Per operator: the Space Builder's space is built once (`space_s`, not the model's); then `repeat` one-pass
generations (decoded as the checkpoint's generation_config.json says -- greedy or beam search -- or with
`--beams N`), each timed as `decode` (the prompt's prefill + the decoding loop, with NextTokens' masks) and
`finish` (the full replay of the point and its conversion to .tsched statements); `total` = both. The first
generation of an operator is reported apart (`first_total_ms`: compute-at sites met for the first time need
a replay; later ones are answered from the space's memo). p50 / p95 over the repeats. The Generator's
engine is lm/inference.py (torch alone); the same repeats with engine "transformers" (GPT2LMHeadModel, the
same logits) are interleaved with them and reported beside (`hf_total_ms_*`), as are both engines' loads.
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()
import torch  # noqa: E402

_T_TORCH = time.perf_counter() - _T0
_T1 = time.perf_counter()
import transformers  # noqa: E402,F401

_T_TRANSFORMERS = time.perf_counter() - _T1
_T2 = time.perf_counter()
import tvm  # noqa: E402,F401

_T_TVM = time.perf_counter() - _T2

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--beams", type=int, default=None, help="beam search with N beams (1: greedy; default: the checkpoint's)")
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--targets", default="llvm,cuda")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/tlm_latency.json"))
    args = ap.parse_args(argv)

    from tensorlang import api
    from tensorlang.lm import model as M
    from tensorlang.lm.generate import Generator
    from tensorlang.machine import host_line
    from tensorlang.space.space import Space

    loads = {"torch": [], "transformers": []}
    for _ in range(args.loads):
        for engine in loads:
            t = time.perf_counter()
            Generator(args.model, engine=engine)
            loads[engine].append(time.perf_counter() - t)
    gen, hf = Generator(args.model), Generator(args.model, engine="transformers")
    if args.beams is not None:
        gen.num_beams = hf.num_beams = args.beams
    rows = []
    for path in sorted((ROOT / "examples").glob("*.tsched")):
        doc = api.load(path)
        for target in args.targets.split(","):
            tm = api.resolve_target(doc, target)
            for name, op in doc.model.ops.items():
                t = time.perf_counter()
                try:
                    space = Space(op, doc.primfunc(name), tm)
                except Exception as e:
                    rows.append({"file": path.name, "op": name, "target": target, "error": f"space: {e}"[:200]})
                    continue
                space_s = time.perf_counter() - t
                dec, fin, tot, hf_tot, out = [], [], [], [], None
                first = None
                for i in range(args.repeat + 1):
                    t = time.perf_counter()
                    out = gen.generate(space)
                    total = time.perf_counter() - t
                    t = time.perf_counter()
                    same = hf.generate(space).tokens == out.tokens
                    hf_total = time.perf_counter() - t
                    if not same:
                        raise SystemExit(f"{path.name}:{name} {target}: the engines wrote different schedules")
                    if i == 0:
                        first = total
                        continue
                    dec.append(out.seconds["decode"])
                    fin.append(out.seconds["finish"])
                    tot.append(total)
                    hf_tot.append(hf_total)
                rows.append({
                    "file": path.name, "op": name, "target": target, "space_s": round(space_s, 3),
                    "first_total_ms": round(first * 1e3, 1),
                    "decode_ms_p50": round(pct(dec, .5) * 1e3, 1), "decode_ms_p95": round(pct(dec, .95) * 1e3, 1),
                    "finish_ms_p50": round(pct(fin, .5) * 1e3, 1), "finish_ms_p95": round(pct(fin, .95) * 1e3, 1),
                    "total_ms_p50": round(pct(tot, .5) * 1e3, 1), "total_ms_p95": round(pct(tot, .95) * 1e3, 1),
                    "hf_total_ms_p50": round(pct(hf_tot, .5) * 1e3, 1),
                    "hf_total_ms_p95": round(pct(hf_tot, .95) * 1e3, 1),
                    "tokens": len(out.tokens), "free": out.free, "forced": out.forced, "forward_passes": out.steps,
                    "forced_share": round(out.forced / max(1, out.free + out.forced), 3)})
    result = {"host": host_line(), "torch_threads": torch.get_num_threads(), "model": gen.name,
              "model_dir": str(gen.path), "parameters": M.parameters(hf.model),
              "engine": gen.engine, "num_beams": gen.num_beams,
              "imports_s": {"torch": round(_T_TORCH, 2), "transformers": round(_T_TRANSFORMERS, 2),
                            "tvm": round(_T_TVM, 2)},
              "load_s": {e: {"p50": round(statistics.median(v), 3), "max": round(max(v), 3), "n": len(v)}
                         for e, v in loads.items()},
              "repeat": args.repeat, "rows": rows}
    head = (f"{'file:op':<34} {'target':<6} {'space s':>7} {'first ms':>8} {'decode p50/p95':>15} "
            f"{'finish p50/p95':>15} {'total p50/p95':>15} {'hf p50/p95':>15} {'free':>5} {'forced':>6} {'passes':>6} {'forced%':>7}")
    print(f"model {result['model']} ({result['parameters']:,} parameters), "
          f"{'greedy' if gen.num_beams == 1 else f'beam search with {gen.num_beams} beams'}, "
          f"torch threads {result['torch_threads']}")
    ld = result["load_s"]
    print(f"imports: torch {_T_TORCH:.2f} s, transformers {_T_TRANSFORMERS:.2f} s (not needed by the torch engine), "
          f"tvm {_T_TVM:.2f} s; model load p50 {ld['torch']['p50'] * 1e3:.0f} ms (max {ld['torch']['max'] * 1e3:.0f}"
          f" ms), with transformers {ld['transformers']['p50'] * 1e3:.0f} ms")
    print(head)
    print("-" * len(head))
    for r in rows:
        label = f"{r['file'].removesuffix('.tsched')}:{r['op']}"
        if "error" in r:
            print(f"{label:<34} {r['target']:<6} {r['error']}")
            continue
        print(f"{label:<34} {r['target']:<6} {r['space_s']:>7.2f} {r['first_total_ms']:>8.0f} "
              f"{r['decode_ms_p50']:>7.0f}/{r['decode_ms_p95']:<7.0f} {r['finish_ms_p50']:>7.0f}/{r['finish_ms_p95']:<7.0f} "
              f"{r['total_ms_p50']:>7.0f}/{r['total_ms_p95']:<7.0f} {r['hf_total_ms_p50']:>7.0f}/{r['hf_total_ms_p95']:<7.0f} "
              f"{r['free']:>5} {r['forced']:>6} "
              f"{r['forward_passes']:>6} {r['forced_share'] * 100:>6.0f}%")
    print(f"host: {result['host']}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
