"""`tensorlang bench FILE --target T [--op OP] [--policy P ...] [--repeat R] [--json OUT]`

Each operator of FILE (or OP) is scheduled by each policy P -- `default`, `roller`, `random[:SEED]`,
`metaschedule[:N]`, `auto`, `unscheduled` -- plus the file's own schedule for T, as policy `schedule`,
where it has one. Every candidate is built (in parallel), checked against the NumPy reference and
timed side by side in one run (harness.py: interleaved rounds, one kernel at a time, under the
machine-wide measurement lock). A policy's .tsched text, where it has one, is what is built and timed.

Prints a table (median/min/max latency, GFLOP/s, generation and compile time) and, per operator with
two or more timed policies, the speed-up matrix. `--json OUT` writes:

  command         the equivalent command line;  argv: the raw one
  file, target    as given
  started         ISO-8601 UTC;  duration_s: wall time of the whole run
  machine         bench/machine.py: cpu, cores, threads, memory, OS, library versions, load average
  settings        repeat, min_repeat_ms, timeout_s, seed, threads, jobs, lock_path
  conditions      lock_wait_s (waiting for another timer), locked_s (checking + timing), loadavg_1min,
                  other_cpu_frac (share of the machine's CPU time other processes used meanwhile: the
                  noise to expect; 0 on a quiet machine)
  results         one row per (operator, policy):
                    op, target, policy (as asked), generated_by (the policy that made the schedule:
                    auto -> roller), status (ok | wrong | schedule-error | build-error | crash |
                    timeout | error | no-schedule | unchecked: timed, but the NumPy reference could not
                    be computed, TS407/TS408 in message), message, correct (null if never run or
                    unchecked), max_abs,
                    max_rel, median_ms, min_ms, max_ms, times_ms (one per round), gflops,
                    generation_s (making the schedule; null for a written one), schedule_s (applying
                    the .tsched text), compile_s (tvm.compile + export), speedup ({other policy:
                    other's median / this median}), schedule_text (the .tsched block, or null),
                    diagnostics
  speedup         {op: {policy: {other policy: ratio}}} -- the same figures, by operator

Exit status: 0 when every candidate was correct and timed, 1 otherwise, 2 on usage errors.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import time

DEFAULT_POLICIES = ("default", "roller", "random")
TOP_KEYS = ("command", "argv", "file", "target", "started", "duration_s", "machine", "settings", "conditions",
            "results", "speedup")
ROW_KEYS = ("op", "target", "policy", "generated_by", "status", "message", "correct", "max_abs", "max_rel",
            "median_ms", "min_ms", "max_ms", "times_ms", "gflops", "generation_s", "schedule_s", "compile_s",
            "speedup", "schedule_text", "diagnostics")
SETTINGS_KEYS = ("repeat", "min_repeat_ms", "timeout_s", "seed", "threads", "jobs", "lock_path")
CONDITION_KEYS = ("lock_wait_s", "locked_s", "loadavg_1min", "other_cpu_frac")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("file")
    p.add_argument("--target", required=True, help="a CPU target declared in the file, or llvm (this host)")
    p.add_argument("--op", help="one operator (default: all)")
    p.add_argument("--policy", action="extend", type=lambda s: [x for x in s.split(",") if x], default=None,
                   metavar="P", help="a schedule policy, repeatable or comma-separated: default, roller, "
                                     "random[:SEED], metaschedule[:N], auto, unscheduled "
                                     f"(default: {', '.join(DEFAULT_POLICIES)}); the file's own schedule is "
                                     "always included, as 'schedule'")
    p.add_argument("--repeat", type=int, default=10, help="timing rounds (default 10)")
    p.add_argument("--min-repeat-ms", type=float, default=100.0,
                   help="each timing repeats the kernel for at least this long and takes the mean (default 100)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a kernel may take to answer (default 30)")
    p.add_argument("--jobs", type=int, default=None, help="parallel builds (default: the usable cores)")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: the target's cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", help="write the report as JSON to this path ('-': stdout, instead of the table)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def equivalent_command(args) -> str:
    parts = ["tensorlang", "bench", args.file, "--target", args.target]
    if args.op:
        parts += ["--op", args.op]
    for pol in args.policy or ():
        parts += ["--policy", pol]
    parts += ["--repeat", str(args.repeat), "--min-repeat-ms", f"{args.min_repeat_ms:g}", "--timeout",
              f"{args.timeout:g}", "--seed", str(args.seed)]
    if args.jobs:
        parts += ["--jobs", str(args.jobs)]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    if args.json:
        parts += ["--json", args.json]
    return shlex.join(parts)


# ------------------------------------------------------------- policies
def generate_candidate(doc, op_name: str, target_name: str, policy: str):
    """(Candidate or None, label, generation seconds, diagnostics) for one policy on one operator.

    The candidate carries the policy's .tsched text where it has one (the harness lowers that text),
    else its scheduled module. `schedule` is the file's own schedule; `unscheduled` the bare operator."""
    from tensorlang import api
    from tensorlang import diagnostics as Dg
    from tensorlang.bench.harness import Candidate
    from tensorlang.space.convert import render_schedule
    op = doc.model.ops[op_name]
    target = doc.model.targets[target_name]
    info = {"policy": policy, "generation_s": None, "schedule_text": None}
    if policy == "schedule":
        sched = doc.model.schedule_for(op_name, target_name)
        if sched is None:
            return None, policy, None, [f"no schedule for '{op_name}' on '{target_name}' in the file"]
        text = render_schedule(op_name, target_name, sched.stmts)
        info["schedule_text"] = text
        return Candidate(f"{op_name}/schedule", op, target, text, info=info), policy, None, []
    if policy == "unscheduled":
        return Candidate(f"{op_name}/unscheduled", op, target, None, info=info), policy, None, []
    t0 = time.perf_counter()
    name, _, arg = policy.partition(":")
    if name == "metaschedule":  # direct, so that it works whether or not baselines.generate knows it
        from tensorlang.baselines.metaschedule import DEFAULT_TRIALS, metaschedule_schedule
        gen = metaschedule_schedule(doc.primfunc(op_name), op, target, arg or DEFAULT_TRIALS)
        mod, label, diags, text = gen.mod, gen.policy, gen.diagnostics, gen.schedule_text
    else:
        low = api.lower_op(doc, op_name, target_name, policy)
        mod, diags, text = low.mod, low.diagnostics, low.schedule_text
        label = policy  # as asked (`random:5` keeps its seed, `auto` its name; generated_by says who made it)
        info["generated_by"] = low.policy
    gen_s = time.perf_counter() - t0
    info.update(policy=label, generation_s=gen_s)
    messages = [f"{d.severity}: {d.code} {d.message}" for d in diags]
    if mod is None or Dg.has_errors(diags):
        return None, label, gen_s, messages
    if text:
        info["schedule_text"] = render_schedule(op_name, target_name, _statements(text))
        return Candidate(f"{op_name}/{label}", op, target, text, info=info), label, gen_s, messages
    return Candidate(f"{op_name}/{label}", op, target, mod, info=info), label, gen_s, messages


def _statements(text: str):
    from tensorlang.bench.worker import schedule_block
    from tensorlang.parser import parse
    module, _ = parse(schedule_block(text, "op", "t"))
    return module.schedules[0].stmts if module.schedules else []


def first_error(messages) -> str:
    errors = [m for m in messages if not m.startswith(("warning:", "hint:"))]
    return (errors or list(messages) or ["no schedule"])[0]


# ------------------------------------------------------------- reports
def speedups(rows: list[dict]) -> dict:
    """{op: {policy: {other: other median / this median}}} over the timed rows; also sets row["speedup"]."""
    out: dict = {}
    by_op: dict = {}
    for r in rows:
        if r["status"] == "ok" and r["median_ms"]:
            by_op.setdefault(r["op"], []).append(r)
    for op, rs in by_op.items():
        out[op] = {}
        for a in rs:
            a["speedup"] = {b["policy"]: round(b["median_ms"] / a["median_ms"], 4) for b in rs if b is not a}
            out[op][a["policy"]] = a["speedup"]
    return out


def conditions(results) -> dict:
    """The run's conditions (harness.Result.run), with every documented key."""
    run = next((r.run for r in results if r.run), {})
    out = {k: run.get(k) for k in CONDITION_KEYS}
    if out["lock_wait_s"] is not None:
        out["lock_wait_s"] = round(out["lock_wait_s"], 3)
    return out


def format_conditions(cond: dict) -> str:
    parts = []
    if cond.get("other_cpu_frac") is not None:
        parts.append(f"other processes used {cond['other_cpu_frac']:.0%} of the CPU time while measuring")
    if cond.get("loadavg_1min") is not None:
        parts.append(f"load average {cond['loadavg_1min']:.2f}")
    if cond.get("lock_wait_s"):
        parts.append(f"waited {cond['lock_wait_s']:.1f} s for the measurement lock")
    return "conditions: " + "; ".join(parts) if parts else ""


def _ms(x):
    return None if x is None else round(x * 1e3, 6)


def row_of(result, diagnostics=()) -> dict:
    info = result.info
    return {
        "op": result.op, "target": result.target, "policy": info.get("policy", result.name),
        "generated_by": info.get("generated_by", info.get("policy", result.name)),
        "status": result.status, "message": result.message, "correct": result.correct,
        "max_abs": result.max_abs, "max_rel": result.max_rel,
        "median_ms": _ms(result.median_s), "min_ms": _ms(result.min_s), "max_ms": _ms(result.max_s),
        "times_ms": [_ms(t) for t in result.times_s],
        "gflops": None if result.gflops is None else round(result.gflops, 3),
        "generation_s": info.get("generation_s"), "schedule_s": result.schedule_s, "compile_s": result.compile_s,
        "speedup": {}, "schedule_text": info.get("schedule_text"), "diagnostics": list(diagnostics),
    }


def _f(x, fmt: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:>{width}{fmt}}"


def format_table(rows: list[dict]) -> str:
    head = (f"{'op':<18} {'policy':<16} {'status':<14} {'median ms':>10} {'min ms':>10} {'max ms':>10} "
            f"{'GFLOP/s':>9} {'gen s':>7} {'compile s':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['op']:<18} {r['policy']:<16} {r['status']:<14} {_f(r['median_ms'], '.4f', 10)} "
                     f"{_f(r['min_ms'], '.4f', 10)} {_f(r['max_ms'], '.4f', 10)} {_f(r['gflops'], '.2f', 9)} "
                     f"{_f(r['generation_s'], '.2f', 7)} {_f(r['compile_s'], '.2f', 9)}"
                     + (f"  {r['message'][:100]}" if r["status"] != "ok" and r["message"] else ""))
    by_op: dict = {}
    for r in rows:
        if r["status"] == "ok" and r["median_ms"]:
            by_op.setdefault(r["op"], []).append(r)
    for op, rs in by_op.items():
        if len(rs) < 2:
            continue
        names = [r["policy"] for r in rs]
        w = max(10, *(len(n) + 1 for n in names))
        lines.append("")
        lines.append(f"speed-up of {op}: row over column (column's median / row's median)")
        lines.append(" " * w + "".join(f"{n:>{w}}" for n in names))
        for r in rs:
            lines.append(f"{r['policy']:<{w}}" + "".join(
                f"{'1':>{w}}" if o is r else f"{o['median_ms'] / r['median_ms']:>{w}.2f}" for o in rs))
    return "\n".join(lines)


# ---------------------------------------------------------------- command
def cmd_bench(args) -> int:
    from tensorlang.bench.harness import Result, measure_candidates
    from tensorlang.bench.lock import lock_path
    from tensorlang.machine import describe, recording_refused

    started = time.time()
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    if args.json and recording_refused():
        print(f"tensorlang bench: not writing {args.json}: {recording_refused()}", file=sys.stderr)
        return 2
    from tensorlang.cli import _load, _ops, _stop_on_errors, _target  # the CLI's own messages and exit codes
    try:
        doc = _load(args.file)
        _stop_on_errors(doc)
        target = _target(doc, args.target)
        if target.is_gpu:
            print(f"tensorlang bench: target '{args.target}' is a GPU target; bench times kernels on this CPU",
                  file=sys.stderr)
            return 2
        _ops(doc, args.op)
    except SystemExit as e:  # as the CLI reports it
        return e.code if isinstance(e.code, int) else 2
    if args.repeat < 1:
        print("tensorlang bench: --repeat must be at least 1", file=sys.stderr)
        return 2
    ops = [args.op] if args.op else list(doc.model.ops)
    from tensorlang.lower.targets import cannot_run, host_cores
    refusal = cannot_run(target)
    if refusal:
        print(f"{doc.path}:{target.span.line}:{target.span.col}: error: {refusal}", file=sys.stderr)
        return 1
    threads = args.threads or target.params.get("cores") or host_cores()

    policies = list(dict.fromkeys(args.policy or DEFAULT_POLICIES))
    candidates, rows_pending = [], []  # rows_pending: (candidate | None, row for a failed generation)
    for name in ops:
        wanted = (["schedule"] if doc.model.schedule_for(name, args.target) is not None else []) + \
                 [p for p in policies if p != "schedule" or doc.model.schedule_for(name, args.target) is None]
        for pol in wanted:
            say(f"{name}: generating a schedule with policy '{pol}'")
            try:
                cand, label, gen_s, messages = generate_candidate(doc, name, args.target, pol)
            except Exception as e:  # a policy's internal error: a row, not a traceback
                cand, label, gen_s, messages = None, pol, None, [f"error: TS900 {type(e).__name__}: {e}"]
            if cand is None:
                op = doc.model.ops[name]
                res = Result(f"{name}/{label}", name, args.target, "no-schedule", first_error(messages),
                             flops=op.flops,
                             info={"policy": label, "generation_s": gen_s, "schedule_text": None})
                rows_pending.append((None, res, messages))
            else:
                candidates.append(cand)
                rows_pending.append((cand, None, messages))
    say(f"building {len(candidates)} candidates; timing {args.repeat} rounds")
    results = measure_candidates(candidates, repeat=args.repeat, timeout_s=args.timeout, jobs=args.jobs,
                                 threads=threads, min_repeat_ms=args.min_repeat_ms, seed=args.seed, progress=say)
    by_cand = {id(c): r for c, r in zip(candidates, results)}
    rows = []
    for cand, res, messages in rows_pending:
        rows.append(row_of(by_cand[id(cand)] if cand is not None else res, messages))
    report = {
        "command": equivalent_command(args),
        "argv": list(sys.argv),
        "file": args.file,
        "target": args.target,
        "started": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "duration_s": None,
        "machine": describe(threads),
        "settings": {"repeat": args.repeat, "min_repeat_ms": args.min_repeat_ms, "timeout_s": args.timeout,
                     "seed": args.seed, "threads": threads, "jobs": args.jobs or host_cores(),
                     "lock_path": lock_path()},
        "conditions": conditions(results),
        "results": rows,
        "speedup": speedups(rows),
    }
    report["duration_s"] = round(time.time() - started, 2)
    if args.json and args.json != "-":  # the file first: a closed stdout must not lose the report
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    if args.json == "-":
        print(json.dumps(report, indent=1))
    else:
        from tensorlang.machine import host_line
        print(format_table(rows))
        print(f"host: {host_line()}")
        if format_conditions(report["conditions"]):
            print("\n" + format_conditions(report["conditions"]))
    return 0 if rows and all(r["status"] == "ok" for r in rows) else 1


def main(argv=None) -> int:
    p = add_arguments(argparse.ArgumentParser(prog="tensorlang bench", description=__doc__.split("\n")[0]))
    args = p.parse_args(argv)
    try:
        return cmd_bench(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
