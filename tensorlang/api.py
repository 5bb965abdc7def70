"""The Python API the CLI and the language server share: load, check, lower, run.

    doc = load("examples/matmul.tsched")
    diags = check(doc)                       # syntax, names, shapes, types, legality
    k = lower_op(doc, "matmul", "cpu")       # scheduled IRModule + how it was scheduled
    rows = run(doc, "cpu")                   # compile, run, compare with NumPy, time

TVM is imported lazily, only by the functions that need it, so `check(doc, legality=False)`
stays fast and TVM-free.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tensorlang import diagnostics as Dg
from tensorlang.analysis import check_module
from tensorlang.analysis.model import ModuleModel, OpModel, TargetModel
from tensorlang.diagnostics import Diagnostic, error, warning
from tensorlang.parser import ast as A
from tensorlang.parser import parse


@dataclass
class Document:
    path: str
    text: str
    ast: A.Module
    model: ModuleModel
    diagnostics: list[Diagnostic]  # syntax + semantic (legality is computed on demand)
    _primfuncs: dict = field(default_factory=dict, repr=False)

    def primfunc(self, op: str):
        """The unscheduled TVM module of an operator (built once per document)."""
        if op not in self._primfuncs:
            from tensorlang.lower.te_build import build_primfunc
            self._primfuncs[op] = build_primfunc(self.model.ops[op])
        return self._primfuncs[op]


def load_text(text: str, path: str = "<input>") -> Document:
    try:
        module, diags = parse(text)
        model, sem = check_module(module)
        return Document(path, text, module, model, diags + sem)
    except Exception as e:  # never a traceback for bad input: report it as an internal error
        return Document(path, text, A.Module(()), ModuleModel(A.Module(())),
                        [error("TS900", f"internal error in the checker: {type(e).__name__}: {e}")])


def load(path: str | Path) -> Document:
    return load_text(Path(path).read_text(), str(path))


# ------------------------------------------------------------------ legality
@dataclass
class ScheduleCheck:
    schedule: A.Schedule
    applied: object | None  # lower.schedule.Applied
    diagnostics: list[Diagnostic]


def check_schedule(doc: Document, sched: A.Schedule, upto_line: int | None = None) -> ScheduleCheck:
    from tensorlang.lower.gpu import check_gpu_schedule
    from tensorlang.lower.schedule import apply_schedule
    op = doc.model.ops[sched.op]
    target = doc.model.targets[sched.target]
    try:
        applied = apply_schedule(doc.primfunc(sched.op), op, sched, upto_line)
        diags = list(applied.diags)
        if applied.ok and upto_line is None:
            from tensorlang.space.recompute import repeated_reduction_warnings
            diags += repeated_reduction_warnings(applied.sch.mod, sched.stmts, sched.span)
        if applied.ok and target.is_gpu and upto_line is None:
            span = A.Span(sched.span.line, sched.span.col, sched.target_span.end_line, sched.target_span.end_col)
            diags += check_gpu_schedule(applied.sch, applied.env, target.params, span)
        return ScheduleCheck(sched, applied, diags)
    except Exception as e:
        return ScheduleCheck(sched, None, [error("TS900", f"internal error while applying the schedule: "
                                                          f"{type(e).__name__}: {e}", sched.span)])


def check(doc: Document, legality: bool = True, space: bool = False) -> list[Diagnostic]:
    """Every problem of the document, sorted. `legality` applies each schedule with TVM;
    `space` also says, as a hint, which legal schedules lie outside the Space Builder's space."""
    diags = list(doc.diagnostics)
    if legality:
        for sched in doc.model.schedules:
            result = check_schedule(doc, sched)
            diags += result.diagnostics
            if space and result.applied is not None and not Dg.has_errors(result.diagnostics):
                diags += space_membership(doc, sched, result.applied)
    return Dg.sort_diagnostics(diags)


def space_membership(doc: Document, sched: A.Schedule, applied, budget: int = 32) -> list[Diagnostic]:
    """[] when the schedule is a point of the space; else a TS314 hint with the nearest point as the fix."""
    from tensorlang.space.convert import trace_to_statements
    from tensorlang.space.membership import locate
    from tensorlang.space.space import Space
    from tensorlang.space.render import statements_text
    try:
        space = Space(doc.model.ops[sched.op], doc.primfunc(sched.op), doc.model.targets[sched.target])
        found = locate(space, applied.sch.mod, applied.sch.trace, sched.stmts, budget=budget)
    except Exception as e:
        return [error("TS900", f"internal error in the space check: {type(e).__name__}: {e}", sched.span)]
    if found.inside:
        return []
    span = A.Span(sched.span.line, sched.span.col, sched.target_span.end_line, sched.target_span.end_col)
    fix = []
    if found.point is not None:
        stmts, _ = trace_to_statements(found.point.trace, doc.primfunc(sched.op), doc.model.ops[sched.op])
        fix = [statements_text(stmts).rstrip("\n")]
    return [Dg.hint("TS314", f"legal, but not a point of the schedule space of {sched.op} on {sched.target}: no "
                             f"sketch and decisions reproduce it ({len(space.sketches)} sketches searched); the nearest "
                             f"in-space schedule is offered as a fix", span, fix)]


# ------------------------------------------------------------------ lowering
@dataclass
class Lowered:
    op: OpModel
    target: TargetModel
    mod: object | None  # scheduled tvm.IRModule
    policy: str  # "schedule" (hand-written), a policy name, or "unscheduled"
    diagnostics: list[Diagnostic]
    schedule_text: str | None = None
    generate_s: float | None = None  # the policy's time to write the schedule; None: written by hand

    @property
    def ok(self) -> bool:
        return self.mod is not None and not Dg.has_errors(self.diagnostics)


def resolve_target(doc: Document, name: str) -> TargetModel | None:
    return doc.model.targets.get(name)


def lower_op(doc: Document, op_name: str, target_name: str, policy: str | None = None) -> Lowered:
    op = doc.model.ops[op_name]
    target = doc.model.targets[target_name]
    sched = doc.model.schedule_for(op_name, target_name)
    if sched is not None and policy is None:
        result = check_schedule(doc, sched)
        if Dg.has_errors(result.diagnostics):
            return Lowered(op, target, None, "schedule", result.diagnostics)
        return Lowered(op, target, result.applied.sch.mod, "schedule", result.diagnostics)
    if op.ast.is_auto or policy is not None:
        import time

        from tensorlang.baselines import generate
        t0 = time.perf_counter()
        gen = generate(policy or "auto", doc.primfunc(op_name), op, target)
        generate_s = time.perf_counter() - t0
        diags = list(gen.diagnostics)
        if gen.mod is not None and target.is_gpu:
            # A generated GPU schedule gets the same checks as a written one.
            from tensorlang.lower.gpu import check_gpu_schedule
            from tensorlang.lower.schedule import NameEnv, new_schedule
            diags += check_gpu_schedule(new_schedule(gen.mod), NameEnv(), target.params, op.ast.name_span)
        return Lowered(op, target, gen.mod, gen.policy, diags, gen.schedule_text, generate_s)
    if target.is_gpu:
        have = sorted(s.target for s in doc.ast.schedules if s.op == op_name)
        msg = (f"operator '{op_name}' has no schedule for GPU target '{target_name}'; "
               f"schedules exist for: {', '.join(have) if have else 'no target'} (mark it @auto to generate one)")
        return Lowered(op, target, None, "none", [error("TS403", msg, op.ast.name_span, have)])
    return Lowered(op, target, doc.primfunc(op_name), "unscheduled",
                   [warning("TS404", f"operator '{op_name}' has no schedule for '{target_name}': lowered "
                                     f"unscheduled (slow)", op.ast.name_span)])


def lower(doc: Document, target_name: str, op_name: str | None = None, policy: str | None = None) -> list[Lowered]:
    names = [op_name] if op_name else list(doc.model.ops)
    return [lower_op(doc, n, target_name, policy) for n in names]


# ----------------------------------------------------------------------- run
@dataclass
class RunResult:
    op: str
    policy: str
    ok: bool
    max_abs: float
    max_rel: float
    median_ms: float
    gflops: float
    message: str = ""
    generate_ms: float | None = None  # Lowered.generate_s, in ms


def run_lowered(low: Lowered, repeat: int = 5, seed: int = 0) -> RunResult:
    """Compile, run on standard-normal inputs, compare with the NumPy reference, time it."""
    r = _run_and_check(low, repeat, seed)
    r.generate_ms = None if low.generate_s is None else low.generate_s * 1e3
    return r


def _run_and_check(low: Lowered, repeat: int, seed: int) -> RunResult:

    from tensorlang import interp
    from tensorlang.lower.build import BuildError, compile_module
    from tensorlang.lower.measure import time_function
    from tensorlang.lower.targets import cannot_run, tvm_target

    op = low.op
    nan = float("nan")
    refusal = cannot_run(low.target)  # a kernel for a CPU this host lacks would die of SIGILL in this process
    if refusal:
        return RunResult(op.name, low.policy, False, nan, nan, nan, 0.0, refusal)
    try:
        inputs = interp.random_inputs(op, seed)
    except MemoryError:
        return RunResult(op.name, low.policy, False, nan, nan, nan, 0.0, interp.io_memory_message(op))
    try:
        lib = compile_module(low.mod, tvm_target(low.target))
    except BuildError as e:
        return RunResult(op.name, low.policy, False, nan, nan, nan, 0.0, f"build: {e}")
    try:
        outputs, median_s = time_function(lib, op, inputs, repeat=repeat)
    except MemoryError:
        return RunResult(op.name, low.policy, False, nan, nan, nan, 0.0, interp.io_memory_message(op))
    except Exception as e:  # one operator's failure must not hide the others' results
        return RunResult(op.name, low.policy, False, nan, nan, nan, 0.0, f"TS900 internal error: {type(e).__name__}: {e}")
    gflops = op.flops / median_s / 1e9 if median_s > 0 else 0.0
    try:
        ref = interp.reference_outputs(op, inputs)
    except interp.ReferenceUnavailable as e:  # timed, but not checked: never reported as ok
        return RunResult(op.name, low.policy, False, nan, nan, median_s * 1e3, gflops, f"unchecked: {e}")
    except Exception as e:
        return RunResult(op.name, low.policy, False, nan, nan, median_s * 1e3, gflops,
                         f"TS900 internal error in the reference: {type(e).__name__}: {e}")
    worst = {"max_abs": 0.0, "max_rel": 0.0, "ok": True}
    for t in op.outputs:
        c = interp.compare(outputs[t.name], ref[t.name], t.dtype)
        worst = {"max_abs": max(worst["max_abs"], c["max_abs"]), "max_rel": max(worst["max_rel"], c["max_rel"]),
                 "ok": worst["ok"] and c["ok"]}
    return RunResult(op.name, low.policy, worst["ok"], worst["max_abs"], worst["max_rel"], median_s * 1e3, gflops,
                     "" if worst["ok"] else "mismatch against the NumPy reference")


def info(msg: str):
    print(msg, file=sys.stderr)
