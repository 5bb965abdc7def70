"""The language server's TVM side, run as a worker process: `python -m tensorlang.lsp.tvm_worker`.

The server never imports TVM; it sends jobs here (see `worker_queue.Worker`) and gets plain data back.
Each job is one function of this module, called with pickled arguments. Frames on the pipes are an
8-byte little-endian length and a pickle:

    request:  (job_id, function name, args)
    reply:    (job_id, "ok", result) | (job_id, "error", message) | (job_id, "progress", (message, percent))

The functions are plain Python and are also called in-process by the unit tests. They hold small
caches (documents by text, unscheduled PrimFuncs by operator) so that an edit re-applies only the
schedules it changed.
"""
from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from collections import OrderedDict

from tensorlang import api
from tensorlang.lsp.incremental import IncrementalParser
from tensorlang.parser import ast as A

_PARSER = IncrementalParser()
_DOCS: OrderedDict = OrderedDict()  # (path, text) -> api.Document
_PRIMFUNCS: OrderedDict = OrderedDict()  # op AST -> unscheduled IRModule


def _lru_put(cache: OrderedDict, key, value, size: int):
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def document(text: str, path: str) -> api.Document:
    key = (path, text)
    doc = _DOCS.get(key)
    if doc is None:
        doc, _ = _PARSER.load(text, path)
        _lru_put(_DOCS, key, doc, 4)
    return doc


def primfunc(doc: api.Document, op: str):
    """`doc.primfunc(op)`, shared between versions of a document whose operator did not change."""
    key = doc.model.ops[op].ast
    pf = _PRIMFUNCS.get(key)
    if pf is None:
        pf = doc.primfunc(op)
        _lru_put(_PRIMFUNCS, key, pf, 64)
    else:
        doc._primfuncs.setdefault(op, pf)
    return pf


def primfunc_of_model(op_model):
    pf = _PRIMFUNCS.get(op_model.ast)
    if pf is None:
        from tensorlang.lower.te_build import build_primfunc
        pf = build_primfunc(op_model)
        _lru_put(_PRIMFUNCS, op_model.ast, pf, 64)
    return pf


# ------------------------------------------------------------------ jobs
def warmup() -> dict:
    t = time.perf_counter()
    import tvm  # noqa: F401
    from tvm import s_tir  # noqa: F401

    import tensorlang.lower.schedule  # noqa: F401
    import tensorlang.lower.show  # noqa: F401
    return {"pid": os.getpid(), "seconds": time.perf_counter() - t}


def warmup_generation() -> dict:
    """Pay the first schedule generation's one-time costs on a tiny operator, before a user waits for one."""
    t = time.perf_counter()
    try:
        doc = api.load_text("op w(A: f32[64, 64]) -> B: f32[64] {\n    B[i] += A[i, k]\n}\n", "<warmup>")
        generate_schedule(doc, "w", "llvm")
    except Exception as e:  # a policy that cannot do it: nothing to warm
        return {"seconds": time.perf_counter() - t, "error": f"{type(e).__name__}: {e}"}
    return {"seconds": time.perf_counter() - t}


def legality(text: str, path: str, index: int) -> list:
    """`api.check_schedule(doc, sched).diagnostics` for the index-th checkable schedule of the document."""
    doc = document(text, path)
    sched = doc.model.schedules[index]
    primfunc(doc, sched.op)
    return list(api.check_schedule(doc, sched).diagnostics)


def space_hint(text: str, path: str, index: int) -> list:
    """The in-space hint (TS314) of the index-th schedule, as `tensorlang check --space` gives it;
    [] when the schedule is a point of the space or is not legal."""
    doc = document(text, path)
    sched = doc.model.schedules[index]
    primfunc(doc, sched.op)
    result = api.check_schedule(doc, sched)
    if result.applied is None or any(d.severity == "error" for d in result.diagnostics):
        return []
    return api.space_membership(doc, sched, result.applied)


def _loop_record(sch, rv, name: str) -> dict:
    from tensorlang.lower import tir
    loop = sch.get(rv)
    return {"name": name, "extent": tir.as_int(loop.extent), "kind": tir.loop_kind(loop),
            "binding": tir.thread_tag(loop), "tvm_name": loop.loop_var.name}


def schedule_state(op_model, schedule: A.Schedule, upto_line: int | None, resolve: tuple = ()) -> dict:
    """The names valid after the statements of `schedule` up to `upto_line`:
    `apply_schedule(..., upto_line)`, then `all_loop_names` / `all_stage_names` and the loop tree.
    `resolve`: loop or stage names (as written) to look up too."""
    from tensorlang.lower.schedule import (StmtError, all_loop_names, all_stage_names, apply_schedule,
                                           resolve_loop, resolve_stage)
    from tensorlang.lower.show import LoopInfo, loop_tree, render
    pf = primfunc_of_model(op_model)
    applied = apply_schedule(pf, op_model, schedule, upto_line)
    sch, env = applied.sch, applied.env
    tree = loop_tree(sch, env)
    by_name = {}
    for it in tree:
        if isinstance(it, LoopInfo):
            by_name[it.name] = {"name": it.name, "extent": it.extent, "kind": it.kind, "binding": it.binding,
                                "tvm_name": it.tvm_name}
    loops = []
    for name in all_loop_names(sch, env):
        rec = by_name.get(name)
        if rec is None:
            try:
                rec = _loop_record(sch, resolve_loop(sch, env, A.Ref(tuple(name.split(".")))), name)
            except Exception:
                rec = {"name": name, "extent": None, "kind": "serial", "binding": None, "tvm_name": name}
        loops.append(rec)
    stages = []
    blocks = {it.name: it for it in tree if not isinstance(it, LoopInfo)}
    for name in all_stage_names(sch, env):
        info = blocks.get(name)
        stages.append({"name": name, "block": info.block if info else name,
                       "loops": list(info.loops) if info else [], "bound": name in env.stages})
    resolved = {}
    for text in resolve:
        ref = A.Ref(tuple(text.split(".")))
        try:
            resolved[text] = {"loop": _loop_record(sch, resolve_loop(sch, env, ref), text)}
        except StmtError as e:
            try:
                rv = resolve_stage(sch, env, ref)
                resolved[text] = {"stage": {"name": text, "block": sch.get(rv).name_hint}}
            except Exception:
                resolved[text] = {"error": e.diag.message}
        except Exception as e:
            resolved[text] = {"error": f"{type(e).__name__}: {e}"}
    errors = [d for d in applied.diags if d.severity == "error"]
    return {"applied": applied.applied, "ok": not errors, "error": errors[0] if errors else None,
            "loops": loops, "stages": stages, "tree": render(tree), "resolved": resolved,
            "bound_loops": [n for n in env.loops], "bound_stages": [n for n in env.stages]}


def unroll_report(op_model, schedule: A.Schedule) -> list | None:
    """What TVM's build unrolls under the schedule's unroll pragmas (space/unroll_loop.unroll_report), its loops
    by the names the schedule gave them; None where the schedule stops with an error."""
    from tensorlang.lower.schedule import apply_schedule
    from tensorlang.lower.show import LoopInfo, loop_tree
    from tensorlang.space.unroll_loop import unroll_report as report
    applied = apply_schedule(primfunc_of_model(op_model), op_model, schedule)
    if any(d.severity == "error" for d in applied.diags):
        return None
    names = {it.tvm_name: it.name for it in loop_tree(applied.sch, applied.env) if isinstance(it, LoopInfo)}
    return report(applied.sch.mod["main"], names)


def generate_schedule(doc: api.Document, op: str, target: str, written: tuple = ()) -> dict:
    """`tensorlang.baselines.generate(EDITOR_POLICY, doc.primfunc(op), op_model, target_model)`, as plain data.
    `written`: the statements already in the block (the model keeps their decisions). `schedule_text` is
    None when the policy cannot write its schedule as statements; `model` names the model that wrote it."""
    from tensorlang import baselines  # looked up at call time: tests replace baselines.generate
    args = (primfunc(doc, op), doc.model.ops[op], doc.model.targets[target])
    gen = (baselines.generate(EDITOR_POLICY, *args, written=tuple(written)) if written
           else baselines.generate(EDITOR_POLICY, *args))
    out = {"policy": gen.policy, "schedule_text": gen.schedule_text, "diagnostics": list(gen.diagnostics),
           "ok": gen.mod is not None, "model": None}
    if gen.policy.startswith("tlm"):
        from tensorlang.lm.generate import default_generator
        out["model"] = default_generator().name
    return out


def generate(text: str, path: str, op: str, target: str, written: tuple = ()) -> dict:
    return generate_schedule(document(text, path), op, target, written)


def lower(text: str, path: str, op: str, target: str, emit: str) -> dict:
    """`api.lower_op` + `lower.build.emit`: the scheduled TIR, CUDA source or LLVM IR of one operator."""
    from tensorlang.lower.build import BuildError
    from tensorlang.lower.build import emit as emit_kernel
    from tensorlang.lower.targets import tvm_target
    doc = api.load_text(text, path)
    low = api.lower_op(doc, op, target)
    out = {"ok": False, "policy": low.policy, "diagnostics": list(low.diagnostics), "text": None, "error": None}
    if not low.ok:
        errors = [d for d in low.diagnostics if d.severity == "error"]
        out["error"] = errors[0].message if errors else "lowering failed"
        return out
    try:
        out["text"] = emit_kernel(low.mod, tvm_target(low.target), emit, low.target.is_gpu)
        out["ok"] = True
    except BuildError as e:
        out["error"] = f"TS406 {op}: {e}"
    return out


def measure(text: str, path: str, op: str, target: str, repeat: int = 5, progress=None) -> dict:
    """The bench harness on this CPU (build in a worker process, check against the NumPy reference,
    time in a kernel runner that survives a crash or a hang): the checked result and its latency."""
    from tensorlang.bench.harness import Candidate, measure_candidates
    from tensorlang.lower.targets import cannot_run
    from tensorlang.parser.printer import format_stmt
    progress = progress or (lambda msg, pct=None: None)
    progress("checking and lowering", 10)
    doc = api.load_text(text, path)
    tm = doc.model.targets[target]
    if tm.is_gpu:
        return {"ok": False, "error": f"target '{target}' is a GPU target; measuring runs on this CPU"}
    refusal = cannot_run(tm)
    if refusal:
        return {"ok": False, "error": refusal}
    low = api.lower_op(doc, op, target)
    if not low.ok:
        errors = [d for d in low.diagnostics if d.severity == "error"]
        return {"ok": False, "error": errors[0].message if errors else "lowering failed"}
    sched = doc.model.schedule_for(op, target)
    schedule = "\n".join(format_stmt(s) for s in sched.stmts) if sched is not None else low.mod
    progress("building, checking and timing", 40)
    [r] = measure_candidates([Candidate(low.policy, text, target, schedule, op_name=op)], repeat=repeat,
                             timeout_s=60)
    progress("done", 100)
    if r.median_s is None:
        return {"ok": False, "error": f"{r.status}: {r.message}", "policy": low.policy}
    result = {"ok": r.ok, "status": r.status, "median_ms": r.median_s * 1e3, "min_ms": r.min_s * 1e3,
              "max_ms": r.max_s * 1e3, "gflops": r.gflops or 0.0, "max_abs": r.max_abs or 0.0,
              "max_rel": r.max_rel or 0.0}
    return {"ok": r.ok, "error": None if r.ok else f"{r.status}: {r.message}", "result": result,
            "policy": low.policy}


def crash() -> None:  # used by the tests: a worker that dies mid-job
    os._exit(3)


JOBS = {f.__name__: f for f in (warmup, warmup_generation, legality, space_hint, schedule_state, unroll_report,
                                 generate, lower, measure, crash)}


# ------------------------------------------------------------------ main
def _read(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    n = int.from_bytes(header, "little")
    data = stream.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


def _write(stream, obj):
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # an unpicklable result: report it rather than die
        data = pickle.dumps((obj[0], "error", f"unpicklable result: {type(e).__name__}: {e}"))
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


# The policy the editor's workers generate with: `auto`, the best available (the model where its checkpoint
# exists -- loaded once, in the background job `warmup_generation` at start -- else roller).
EDITOR_POLICY = "auto"


def main() -> int:
    # The protocol owns the real stdout; anything else printed (TVM, warnings) goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    while True:
        try:
            msg = _read(inp)
        except Exception:
            return 1
        if msg is None:
            return 0
        job_id, name, args = msg
        fn = JOBS.get(name)
        try:
            if fn is None:
                raise KeyError(f"no job '{name}'")
            if name == "measure":
                result = fn(*args, progress=lambda m, p=None: _write(out, (job_id, "progress", (m, p))))
            else:
                result = fn(*args)
            _write(out, (job_id, "ok", result))
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            _write(out, (job_id, "error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    sys.exit(main())
