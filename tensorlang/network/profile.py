"""`tensorlang profile-model OUT`: where a built model spends its time, subgraph by subgraph.

    tensorlang profile-model build/bert-base-tlm.so [--runs 10] [--json OUT.json]

TVM 0.27's Relax VM has no profiler object any more (`VirtualMachine(..., profile=True)` and
`vm.profile` are gone); what it keeps is the VM's instrumentation hook (`vm.set_instrument`), called
before and after every Call instruction. This module times each call between the two (time.perf_counter;
a few microseconds of hook overhead per call, which the table states as the difference between the
instrumented total and the uninstrumented end-to-end median) over `--runs` runs after a warm-up, and
lists the subgraphs by their median time per run, each with how its schedule was made and the .tsched
file to edit (`compile-model --schedules DIR` takes it back). The VM's own builtins (allocation, reshape,
shape checks) are one row. Timing runs hold the machine-wide measurement lock (bench/lock.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def check_host(manifest: dict) -> str | None:
    """Why this host cannot run an executable built for the manifest's CPU (None: it can)."""
    if manifest.get("target") != "llvm":
        return f"the executable was built for {manifest.get('target')} (compile only here)"
    from tensorlang.machine import host, missing_features
    built_for = (manifest.get("machine") or {}).get("llvm_mcpu")
    if built_for and built_for != host().name:
        missing = missing_features(built_for)
        if missing:
            return (f"TS405 the executable was built for {built_for}, which needs {', '.join(missing)}; this host "
                    f"({host().name}) lacks them: rebuild it here with compile-model")
    return None


def vm_args(ex, params, inputs):
    import tvm
    from tvm import relax
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    return vm, [tvm.runtime.tensor(x, dev) for x in list(inputs) + list(params)]


def profile(out: str | Path, runs: int = 10, warmup: int = 2, lock: bool = True) -> dict:
    """Per-function median time per run (seconds), uninstrumented end-to-end median, and the subgraph table."""
    import contextlib

    from tensorlang.bench.lock import measure_lock
    from tensorlang.machine import host_line
    from tensorlang.network.compile import load_built, paths_of
    ex, manifest, params, inputs = load_built(out)
    refusal = check_host(manifest)
    if refusal:
        raise RuntimeError(refusal)
    vm, args = vm_args(ex, params, inputs)
    main = vm["main"]
    per_run: list[dict[str, float]] = []
    counts: dict[str, int] = {}
    started: list = []

    def instrument(func, symbol, before, ret, *rest):
        if before:
            started.append(time.perf_counter())
        else:
            dt = time.perf_counter() - started.pop()
            cur = per_run[-1]
            cur[symbol] = cur.get(symbol, 0.0) + dt
            counts[symbol] = counts.get(symbol, 0) + 1
        return 0

    ctx = measure_lock() if lock else contextlib.nullcontext()
    with ctx as held:
        for _ in range(warmup):
            main(*args)
        plain = []
        for _ in range(runs):
            t0 = time.perf_counter()
            main(*args)
            plain.append(time.perf_counter() - t0)
        vm.set_instrument(instrument)
        for _ in range(runs):
            per_run.append({})
            main(*args)
        vm.set_instrument(lambda *a: 0)
    symbols = sorted({s for r in per_run for s in r})
    median = {s: statistics.median(r.get(s, 0.0) for r in per_run) for s in symbols}
    calls = {s: counts[s] // runs for s in symbols}
    sched_dir = paths_of(out)["schedules"]
    by_function = {}
    for sub in manifest["subgraphs"]:
        for f in sub["functions"]:
            by_function[f] = sub
    rows, builtins = [], {"seconds": 0.0, "calls": 0}
    for s in symbols:
        sub = by_function.get(s)
        if sub is None:
            builtins["seconds"] += median[s]
            builtins["calls"] += calls[s]
            continue
        how = sub["policy"] if sub["source"] != "fallback" else "default (fallback)"
        if sub["source"] == "edited":
            how = "edited"
        rows.append({"function": s, "subgraph": sub["name"], "calls": calls[s], "seconds": median[s],
                     "schedule": how, "fallback": sub["source"] == "fallback", "reason": sub.get("fallback"),
                     "file": str(sched_dir / sub["file"]) if sub.get("file") else None})
    rows.sort(key=lambda r: -r["seconds"])
    called = {r["subgraph"] for r in rows}
    not_called = [{"subgraph": sub["name"], "file": str(sched_dir / sub["file"]) if sub.get("file") else None}
                  for sub in manifest["subgraphs"] if sub["name"] not in called]
    total = sum(median.values())
    return {"executable": str(out), "model": manifest["model"], "policy": manifest["policy"], "host": host_line(),
            "runs": runs, "warmup": warmup, "end_to_end_median_s": statistics.median(plain),
            "instrumented_total_s": total, "builtins": builtins, "subgraphs": rows, "not_called": not_called,
            "fallback_share": (sum(r["seconds"] for r in rows if r["fallback"]) / total) if total else 0.0,
            "lock_wait_s": getattr(held, "wait_s", 0.0) if held is not None else 0.0}


def format_table(p: dict, top: int | None = None) -> str:
    total = p["instrumented_total_s"] or 1.0
    lines = [f"{p['model']} ({p['policy']}) on {p['host']}: end to end {p['end_to_end_median_s'] * 1e3:.3f} ms "
             f"(median of {p['runs']} runs); instrumented sum {p['instrumented_total_s'] * 1e3:.3f} ms "
             f"(the difference is the VM's and the hook's overhead)",
             f"{'#':>3} {'ms/run':>9} {'share':>6} {'calls':>5}  {'schedule':<18} subgraph -> file to edit"]
    rows = p["subgraphs"][:top] if top else p["subgraphs"]
    for n, r in enumerate(rows, 1):
        where = r["file"] or f"(no file: {r['reason']})"
        lines.append(f"{n:>3} {r['seconds'] * 1e3:9.3f} {100 * r['seconds'] / total:5.1f}% {r['calls']:>5}  "
                     f"{r['schedule']:<18} {r['subgraph']} -> {where}")
    b = p["builtins"]
    lines.append(f"{'':>3} {b['seconds'] * 1e3:9.3f} {100 * b['seconds'] / total:5.1f}% {b['calls']:>5}  "
                 f"{'':<18} VM builtins (allocation, reshape, shape checks)")
    for r in p.get("not_called", []):
        lines.append(f"{'':>3} {'-':>9} {'':>6} {0:>5}  {'':<18} {r['subgraph']} -> {r['file']}: not called at run "
                     f"time (the VM's lowering replaced its calls: a reshape becomes a view)")
    lines.append(f"fallback subgraphs: {100 * p['fallback_share']:.1f}% of the instrumented time")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("executable", help="the OUT of compile-model (its OUT.json and .npz files beside it)")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, help="only the N slowest subgraphs")
    p.add_argument("--json", help="also write the profile as JSON")


def cmd_profile_model(args) -> int:
    from tensorlang.network.compile import paths_of
    if not paths_of(args.executable)["manifest"].exists():
        print(f"tensorlang profile-model: {args.executable}: no manifest "
              f"{paths_of(args.executable)['manifest']} (build it with compile-model)", file=sys.stderr)
        return 2
    try:
        p = profile(args.executable, runs=max(1, args.runs))
    except RuntimeError as e:
        print(f"tensorlang profile-model: error: {e}", file=sys.stderr)
        return 1
    print(format_table(p, args.top))
    if args.json:
        Path(args.json).write_text(json.dumps(p, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tensorlang profile-model", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_profile_model(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
