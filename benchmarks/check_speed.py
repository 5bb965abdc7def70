"""Speed of `check` on a 300-line file made of the reference examples, renamed and repeated.

Figures (medians): syntax + names + shapes in-process; cold `tensorlang check --no-legality`
(a fresh interpreter, must not import TVM); full legality in-process per schedule; cold
`tensorlang check` with legality. Prints a table and writes JSON (machine and command included).

    .venv/bin/python benchmarks/check_speed.py [--json benchmarks/results/check_speed.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tensorlang import api  # noqa: E402
from tensorlang.machine import describe, host_line  # noqa: E402

TARGETS = {"cpu": "llvm(mcpu = \"sapphirerapids\", cores = 2)", "h200": "cuda(arch = \"sm_90\")"}


def big_file(min_lines: int = 300) -> str:
    """The examples' ops and schedules, renamed per copy, until the file has at least `min_lines` lines."""
    header = "".join(f"target {n} = {k}\n" for n, k in TARGETS.items())
    parts, n = [header], 0
    bodies = []
    for f in sorted((ROOT / "examples").glob("*.tsched")):
        text = re.sub(r"^target .*\n", "", f.read_text(), flags=re.M)
        ops = re.findall(r"^op (\w+)", text, flags=re.M)
        bodies.append((text, ops))
    while sum(p.count("\n") for p in parts) < min_lines:
        for text, ops in bodies:
            t = text
            for op in ops:
                t = re.sub(rf"\b{op}\b", f"{op}_{n}", t)
            parts.append("\n" + t)
        n += 1
    return "".join(parts)


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "check_speed.json"))
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    text = big_file()
    lines = text.count("\n")
    with tempfile.NamedTemporaryFile("w", suffix=".tsched", delete=False) as f:
        f.write(text)
        path = f.name

    # In-process: syntax + names + shapes.
    syntax_ms = median_ms(lambda: api.check(api.load_text(text, path), legality=False), args.repeat)
    doc = api.load_text(text, path)
    assert not [d for d in doc.diagnostics if d.severity == "error"], doc.diagnostics[:3]
    n_sched = len(doc.model.schedules)
    # In-process legality: first pass builds the PrimFuncs and imports TVM; measure warm passes.
    api.check(doc)
    per_sched = []
    for sched in doc.model.schedules:
        per_sched.append(median_ms(lambda: api.check_schedule(doc, sched), max(3, args.repeat // 3)))
    legality_ms = statistics.median(per_sched)

    def cold(*extra):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "tensorlang", "check", *extra, path], capture_output=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return (time.perf_counter() - t) * 1e3

    cold_fast = statistics.median(cold("--no-legality") for _ in range(args.repeat))
    cold_full = statistics.median(cold() for _ in range(3))
    rows = [
        ("syntax+names+shapes, in-process", syntax_ms, 100.0),
        ("check --no-legality, cold", cold_fast, 1000.0),
        ("legality per schedule, in-process", legality_ms, 50.0),
        ("check (full legality), cold", cold_full, 5000.0),
    ]
    print(f"file: {lines} lines, {len(doc.model.ops)} ops, {n_sched} schedules")
    print(f"{'measure':<36} {'median ms':>10} {'budget ms':>10}  ok")
    for name, ms, budget in rows:
        print(f"{name:<36} {ms:>10.1f} {budget:>10.0f}  {'yes' if ms <= budget else 'NO'}")
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**describe(), "platform": platform.platform()},
        "file_lines": lines, "ops": len(doc.model.ops), "schedules": n_sched,
        "results": [{"measure": n, "median_ms": round(ms, 2), "budget_ms": b, "within_budget": ms <= b}
                    for n, ms, b in rows],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"host: {host_line()}")
    print(f"wrote {args.json}")
    return 0 if all(ms <= b for _, ms, b in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
