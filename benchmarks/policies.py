"""Schedule policies against each other and against PyTorch, on the example operators, on this CPU.

    .venv/bin/python benchmarks/policies.py [--policy P ...] [--repeat R] [--op OP ...] [--out PATH]

For every operator of examples/*.tsched on its CPU target (`cpu` where the file declares it, else
`llvm`, this host), candidates: the file's own schedule (`schedule`, where there is one), the
policies (default: default, roller, random, metaschedule:64), and PyTorch (`torch`: torch.matmul,
F.conv2d, torch.softmax, F.gelu(F.linear), torch.bmm, F.layer_norm on the same shapes, with
torch.set_num_threads set to the thread count the TVM kernels get). All of them, every operator, are
built, checked against the NumPy reference and timed side by side in one harness run
(tensorlang.bench: interleaved rounds, one kernel at a time, under the machine-wide measurement
lock), so each speed-up compares figures taken in the same run.

Prints a table and writes benchmarks/results/policies.json: the command, the machine, the settings,
the conditions (how much CPU other processes took meanwhile), one row per (operator, policy) in
`tensorlang bench`'s format (tensorlang/bench/command.py), and the speed-up matrices.
metaschedule:64 takes 40-110 s per operator on a 2-core machine; `--reuse OLD.json` measures the
schedules of an earlier report again without regenerating them (generation_s is then the old figure).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICIES = ("default", "roller", "random", "metaschedule:64", "torch")
OUT = ROOT / "benchmarks" / "results" / "policies.json"


# ------------------------------------------------------------------ PyTorch kernels (run in the runner)
def torch_kernel(inputs, outputs, op: str, threads: int | None = None):
    """The PyTorch equivalent of example operator `op` on these inputs (a PythonKernel factory)."""
    import torch
    import torch.nn.functional as F
    if threads:
        torch.set_num_threads(threads)
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    out_name = outputs[0][0]
    if op == "matmul":
        out = torch.empty(outputs[0][1], dtype=torch.float32)
        f = lambda: torch.matmul(t["A"], t["B"], out=out)  # noqa: E731
    elif op == "conv2d":
        f = lambda: F.conv2d(t["X"], t["W"], padding=1)  # noqa: E731
    elif op == "softmax":
        f = lambda: torch.softmax(t["X"], dim=1)  # noqa: E731
    elif op == "dense_gelu":
        f = lambda: F.gelu(F.linear(t["X"], t["W"]))  # noqa: E731  (exact, erf-based GELU)
    elif op == "attention_scores":
        kt = t["K"].transpose(1, 2)
        f = lambda: torch.bmm(t["Q"], kt)  # noqa: E731
    elif op == "layernorm":
        f = lambda: F.layer_norm(t["X"], (t["X"].shape[-1],), t["gamma"], t["beta"], eps=1e-5)  # noqa: E731
    else:
        raise ValueError(f"no PyTorch equivalent for operator '{op}'")

    def run():
        with torch.inference_mode():
            return {out_name: f().numpy()}
    return run


TORCH_OPS = ("matmul", "conv2d", "softmax", "dense_gelu", "attention_scores", "layernorm")


# ------------------------------------------------------------------ the benchmark
def cpu_target(doc) -> str:
    declared = [t.name for t in doc.model.targets.values() if not t.is_gpu and not t.builtin]
    return declared[0] if declared else "llvm"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", action="extend", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help=f"policies (default: {', '.join(DEFAULT_POLICIES)}); 'torch' is PyTorch")
    p.add_argument("--op", action="append", help="only these operators")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--min-repeat-ms", type=float, default=100.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--reuse", metavar="JSON", help="take each policy's .tsched text (and its generation time) "
                   "from this earlier report instead of generating it again: measure the same schedules anew")
    args = p.parse_args(argv)
    reused = {}
    if args.reuse:
        old = json.loads(Path(args.reuse).read_text())
        reused = {(r["op"], r["policy"]): r for r in old["results"] if r.get("schedule_text")}

    from tensorlang import api
    from tensorlang.bench import Candidate, PythonKernel, Result, measure_candidates
    from tensorlang.bench.command import (conditions, first_error, format_conditions, format_table,
                                          generate_candidate, row_of, speedups)
    from tensorlang.bench.lock import lock_path
    from tensorlang.machine import describe
    from tensorlang.lower.targets import host_cores

    started = time.time()
    policies = list(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    say = lambda msg: print(f"policies: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    entries = []  # (candidate | None, failed Result | None, messages)
    cores = set()
    for path in sorted((ROOT / "examples").glob("*.tsched")):
        doc = api.load(path)
        if any(d.severity == "error" for d in doc.diagnostics):
            say(f"{path.name}: has errors, skipped")
            continue
        tname = cpu_target(doc)
        target = doc.model.targets[tname]
        for name, op in doc.model.ops.items():
            if args.op and name not in args.op:
                continue
            cores.add(target.params.get("cores") or host_cores())
            wanted = (["schedule"] if doc.model.schedule_for(name, tname) else []) + policies
            for pol in wanted:
                info = {"policy": pol, "generation_s": None, "schedule_text": None, "file": path.name}
                if pol == "torch":
                    if name not in TORCH_OPS:
                        continue
                    kernel = PythonKernel(f"{Path(__file__).resolve()}:torch_kernel", {"op": name})
                    entries.append((Candidate(f"{name}/torch", op, target, kernel, info=info), None, []))
                    continue
                prior = reused.get((name, pol))
                if prior is not None and pol != "schedule":
                    info.update(generation_s=prior["generation_s"], schedule_text=prior["schedule_text"],
                                generated_by=prior.get("generated_by", pol), reused_from=args.reuse)
                    entries.append((Candidate(f"{name}/{pol}", op, target, prior["schedule_text"], info=info),
                                    None, []))
                    continue
                say(f"{name} on {tname}: generating with '{pol}'")
                try:
                    cand, label, gen_s, msgs = generate_candidate(doc, name, tname, pol)
                except Exception as e:  # a policy's internal error is a row of the table
                    cand, label, gen_s, msgs = None, pol, None, [f"error: TS900 {type(e).__name__}: {e}"]
                if cand is None:
                    info.update(policy=label, generation_s=gen_s)
                    entries.append((None, Result(f"{name}/{label}", name, tname, "no-schedule", first_error(msgs),
                                                 flops=op.flops, info=info), msgs))
                else:
                    cand.info["file"] = path.name
                    entries.append((cand, None, msgs))
                    if gen_s is not None:
                        say(f"{name}: '{label}' took {gen_s:.1f} s")
    threads = max(cores) if cores else host_cores()
    for cand, _, _ in entries:
        if cand is not None and isinstance(cand.schedule, PythonKernel):
            cand.schedule.kwargs["threads"] = threads
    cands = [c for c, _, _ in entries if c is not None]
    say(f"measuring {len(cands)} candidates side by side, {args.repeat} rounds, {threads} threads")
    results = measure_candidates(cands, repeat=args.repeat, timeout_s=args.timeout, threads=threads,
                                 min_repeat_ms=args.min_repeat_ms, progress=say)
    by_id = {id(c): r for c, r in zip(cands, results)}
    rows = []
    for cand, failed, msgs in entries:
        r = by_id[id(cand)] if cand is not None else failed
        row = row_of(r, msgs)
        row["file"] = r.info.get("file")
        if r.info.get("reused_from"):
            row["reused_from"] = r.info["reused_from"]
        rows.append(row)
    report = {
        "command": shlex.join([sys.executable.replace(str(ROOT) + "/", ""), "benchmarks/policies.py"]
                              + (argv if argv is not None else sys.argv[1:])),
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": None,
        "machine": describe(threads),
        "settings": {"policies": policies, "repeat": args.repeat, "min_repeat_ms": args.min_repeat_ms,
                     "timeout_s": args.timeout, "seed": 0, "threads": threads, "lock_path": lock_path(),
                     "note": "all candidates of all operators were measured side by side in one run "
                             "(interleaved rounds); every speed-up compares figures of that run"},
        "conditions": conditions(results),
        "results": rows,
        "speedup": speedups(rows),
    }
    report["duration_s"] = round(time.time() - started, 1)
    print(format_table(rows))
    print("\n" + format_conditions(report["conditions"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {os.path.relpath(args.out, ROOT)} ({report['duration_s']:.0f} s)", file=sys.stderr)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
