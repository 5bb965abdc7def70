"""`tensorlang compile-model`: a whole network built with one generated .tsched schedule per subgraph.

    tensorlang compile-model --model bert-base --seq 128 --target llvm --policy tlm -o build/bert.so
    tensorlang compile-model --model resnet50 --small --target llvm --policy roller --schedules build/r.schedules

The route, step by step, and why:

1. The model and its Relax module are those of `tensorlang extract` (data/models.py, data/extract.py:
   torch.export -> Relax -> pipeline "zero" -> `extract_tasks`), with the weights detached as parameters: the
   subgraphs scheduled here are exactly the tasks `extract` writes, translated by the same translator into the
   same .tsched operators.
2. Subgraphs are keyed by TVM's structural hash of their PrimFunc (global symbol left out): a subgraph that
   several functions of the module share -- or that one function computes for many calls, like ResNet-50's
   repeated blocks -- is scheduled once and the result used for all of them.
3. Each subgraph's schedule is made by the policy on the translated operator (baselines.generate -- what
   `tensorlang generate` / `lower --policy` write) and rendered as a `schedule` block; the file text (operator +
   schedule) is then lowered like any .tsched file. The lowered PrimFunc replaces the model's own PrimFunc:
   the translation keeps every buffer's shape and dtype and lists where each tensor sits among the original
   parameters, so adapting the signature is a reordering of parameters (checked: shapes and dtypes must agree).
   On CPU targets the scheduled function is run against the unscheduled original on random inputs
   (data/verify.py's inputs and tolerances) before it is used.
4. A subgraph the translator cannot express, or one the policy finds no schedule for, falls back to
   `default` (DLight's rules on the original PrimFunc) -- for every policy alike, and the manifest says so with
   the reason.
5. The module, now fully scheduled, is built by the Relax VM's lowering passes only (dataflow lowering and
   finalization): legalization and fusion already ran in step 1, and running them again could re-fuse the
   scheduled functions.

Output, next to OUT (default `build/<model>-<policy>.so`): the executable `OUT`, `OUT.json` (the manifest:
model, config, target, policy, one entry per subgraph -- functions, calls, file, how it was scheduled, the
numerical check, seconds), the weights and example inputs (`OUT.params.npz`, `OUT.inputs.npz`, so that
profile-model and bench-model run exactly what was built), and `<OUT stem>.schedules/`: one .tsched file per
translated subgraph (operator + the schedule built). `--schedules DIR` reads edited files back: a file there
replaces the generated one of the subgraph of the same name; every such file is checked first (syntax, names,
legality), and an error stops the build before anything is written.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CPU_TARGET = "target cpu = llvm()"
GPU_TARGET = 'target gpu = cuda(arch = "sm_90")'
TOLERANCE = (1e-3, 1e-4)  # end to end, against PyTorch: max|ours - torch| <= rtol * max|torch| + atol


class BuildStopped(Exception):
    """The build was stopped (a bad edited schedule, a mismatch); the message says why. Nothing was written."""

    def __init__(self, message: str, diagnostics: list | None = None, path: str | None = None):
        super().__init__(message)
        self.diagnostics = diagnostics or []
        self.path = path


@dataclass
class Subgraph:
    name: str  # the task's name (= the name of its function in the module)
    key: str  # TVM's structural hash of its PrimFunc
    functions: list[str]  # the module's functions with this structure
    calls: int  # how often the model calls it (MetaSchedule's task weight)
    op: str | None = None  # the translated operator's name
    file: str | None = None  # its .tsched file in the schedules directory
    source: str = "generated"  # generated | edited (its file came from --schedules DIR) | fallback
    policy: str = ""  # who made the schedule that was built (roller, tlm, default, ...)
    fallback: str | None = None  # why the subgraph fell back to `default`
    check: dict | None = None  # the numerical check of the scheduled function against the original
    seconds: float = 0.0  # generation + lowering + check
    notes: list[str] = field(default_factory=list)


@dataclass
class Prepared:
    """A model's Relax module with its weights detached, and its subgraphs."""
    model: str
    spec_config: dict
    small: bool
    mod: object  # tvm.IRModule after pipeline "zero"
    params: list  # tvm tensors, in the order of main's parameters after the inputs
    inputs: list  # numpy arrays: the model's example inputs
    tasks: list  # ms ExtractedTask
    seconds: float


# ------------------------------------------------------------------ targets
def target_decl(kind: str) -> tuple[str, str]:
    """(the declaration written into each .tsched file, the target's name there)."""
    return (CPU_TARGET, "cpu") if kind == "llvm" else (GPU_TARGET, "gpu")


def target_model(kind: str):
    from tensorlang import api
    decl, name = target_decl(kind)
    return api.load_text(decl + "\n").model.targets[name]


def tvm_build_target(kind: str):
    """The target the executable is built for: this host's CPU (never a pinned mcpu), or CUDA sm_90 with an
    LLVM host for the VM's own code."""
    from tvm.target import Target

    from tensorlang.lower.targets import tvm_target
    t = tvm_target(target_model(kind))
    if kind == "llvm":
        return t
    host = tvm_target(target_model("llvm"))
    return Target(t, host)


def _policy_ok(policy: str) -> str | None:
    name, _, arg = policy.partition(":")
    if name not in ("tlm", "tlm-ranked", "roller", "default", "metaschedule", "random"):
        return f"unknown policy '{policy}'; policies: tlm, tlm-ranked:K, roller, default, metaschedule:N"
    if arg and not arg.isdigit():
        return f"policy '{policy}': N must be a positive integer"
    return None


# ------------------------------------------------------------------ model -> subgraphs
def prepare(model: str, batch: int = 1, seq: int | None = None, small: bool = False, image: int | None = None,
            target_kind: str = "llvm", log=None) -> Prepared:
    import numpy as np
    from tvm import relax

    from tensorlang.data import extract, models
    t0 = time.time()
    spec = models.build(model, batch=batch, seq=seq, small=small, image=image)
    inputs = [np.ascontiguousarray(x.numpy()) for x in spec.inputs]
    mod = extract.relax_module(spec)
    mod, params = relax.frontend.detach_params(mod)
    tasks = extract.extract_tasks(mod, _extract_target(target_kind))
    if log:
        log(f"{model}: {spec.description}; {len(tasks)} unique subgraphs, {sum(int(t.weight) for t in tasks)} calls "
            f"({time.time() - t0:.1f} s)")
    return Prepared(model, spec.config, small, mod, list(params.get("main", [])), inputs, tasks, time.time() - t0)


def _extract_target(kind: str) -> dict:
    from tensorlang.machine import host, usable_cores
    if kind == "llvm":
        return {"kind": "llvm", "mcpu": host().name, "num-cores": usable_cores()}
    return {"kind": "cuda", "arch": "sm_90"}


def structural_key(func) -> str:
    """TVM's structural hash of a PrimFunc, its global symbol left out (the module's functions have none, the
    tasks' copies are named "main")."""
    import tvm_ffi
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"


def subgraphs_of(prep: Prepared) -> tuple[list[Subgraph], dict]:
    """The unique subgraphs (one per structural key) and key -> the task's PrimFunc."""
    from tvm import tirx
    by_key: dict[str, list[str]] = {}
    for gv, f in prep.mod.functions.items():
        if isinstance(f, tirx.PrimFunc):
            by_key.setdefault(structural_key(f), []).append(gv.name_hint)
    subs, funcs = [], {}
    for task in prep.tasks:
        f = task.dispatched[0]["main"]
        key = structural_key(f)
        if key in funcs:  # two tasks of one structure: schedule once
            continue
        names = by_key.get(key) or [str(task.task_name)]
        subs.append(Subgraph(str(task.task_name), key, sorted(names), int(task.weight)))
        funcs[key] = f
    return subs, funcs


# ------------------------------------------------------------------ .tsched text of a subgraph
def op_text(prep: Prepared, sub: Subgraph, func, index: int, total: int, kind: str):
    """(translation, the file text without a schedule) or (None, reason)."""
    from tensorlang.data import extract
    from tensorlang.data.translate import Untranslatable, translate
    try:
        tr = translate(func, sub.name)
    except Untranslatable as e:
        return None, f"untranslatable: {e}"
    except Exception as e:  # a translator bug: still a fallback, with what went wrong
        return None, f"translator error: {type(e).__name__}: {e}"
    shape = "x".join(str(d) for d in prep.spec_config["input_shape"])
    header = [f"{prep.model} ({prep.spec_config['class']}{', small' if prep.small else ''}, input {shape}): "
              f"subgraph {sub.name} ({index} of {total}), structural key {sub.key}",
              f"calls: {sub.calls}; functions: {', '.join(sub.functions)}"]
    header += [f"note: {n}" for n in tr.notes]
    decl, _ = target_decl(kind)
    body = extract.render(tr.op, header)
    comments, _, rest = body.partition("\n\n")
    return tr, f"{comments}\n\n{decl}\n\n{rest}"


def with_schedule(text: str, op: str, target_name: str, schedule_text: str | None, comment: str) -> str:
    """The operator's text with the policy's statements as a `schedule` block (render_schedule's layout) after
    a comment line; without statements, only the comment."""
    if schedule_text is None:
        return text + f"\n# {comment}\n"
    body = "".join(f"    {line}\n" for line in schedule_text.splitlines() if line.strip())
    return text + f"\n# {comment}\nschedule {op} on {target_name} {{\n{body}}}\n"


# ------------------------------------------------------------------ schedule -> the model's PrimFunc
def adapt(scheduled, original, translation):
    """The scheduled op's PrimFunc with the original's parameter order (the op lists inputs, then outputs;
    the translation says where each sits among the original's parameters), its attributes, no global symbol.
    Refuses (ValueError) when a shape or dtype differs."""
    from tvm import tirx
    order = [n for n, _ in translation.inputs] + [n for n, _ in translation.outputs]
    ours = list(scheduled.params)
    theirs = list(original.params)
    if len(ours) != len(theirs) or sorted(order) != list(range(len(theirs))):
        raise ValueError(f"the operator has {len(ours)} parameters, the subgraph {len(theirs)}")
    params = [None] * len(theirs)
    for mine, pos in zip(ours, order):
        a, b = [int(d) for d in mine.shape], [int(d) for d in theirs[pos].shape]
        if a != b or str(mine.dtype) != str(theirs[pos].dtype):
            raise ValueError(f"parameter {pos}: the operator's {mine.name} is {mine.dtype}{a}, the subgraph's "
                             f"{theirs[pos].name} {theirs[pos].dtype}{b}")
        params[pos] = mine
    attrs = {k: v for k, v in (original.attrs or {}).items() if k != "global_symbol"}
    for k, v in (scheduled.attrs or {}).items():
        if k != "global_symbol":
            attrs.setdefault(k, v)
    func = tirx.PrimFunc(params, scheduled.body, scheduled.ret_type, None)
    for k, v in attrs.items():
        func = func.with_attr(k, v)
    return func


def default_schedule_original(func, kind: str):
    """`default` on the model's own PrimFunc: DLight's rules (what every policy falls back to)."""
    import tvm
    from tvm.s_tir import dlight as dl
    if kind == "llvm":
        rules = [dl.cpu.GEMV(), dl.cpu.Reduction()]
    else:
        rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tvm_build_target(kind):
        mod = dl.ApplyDefaultSchedule(*rules)(mod)
    return mod["main"].without_attr("global_symbol")


def check_numerically(original, scheduled, translation, doc, low_mod, seed: int = 0) -> dict:
    """The scheduled function (original parameter order) against the unscheduled original on this CPU, on
    random inputs (data/verify.py's generator and tolerances). When TVM cannot build the original (bool ==
    bool in causal masks), the translated op against the NumPy interpreter instead, and it says so."""
    import numpy as np
    import tvm

    from tensorlang.analysis import dtypes as D
    from tensorlang.data import verify as V
    from tensorlang.data.translate import DTYPES, _shape
    target = tvm_build_target("llvm")
    ours = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=target)
    try:
        theirs = tvm.compile(tvm.IRModule({"main": original.with_attr("global_symbol", "main")}), target=target)
    except Exception as e:
        lib = tvm.compile(low_mod, target=target)
        c = V.against_reference(original, translation, doc, lib, seed)
        d = c.as_dict()
        d["message"] = f"the original does not build in TVM ({V._last_line(str(e))}); against the NumPy reference"
        return d
    params = list(original.params)
    outs = {n for n, _ in translation.outputs}
    ins = [n for n in range(len(params)) if n not in outs]
    rng = np.random.default_rng(seed)
    values = dict(zip(ins, V.make_inputs([params[n] for n in ins], V._index_bound(original), rng)))
    args = [values[n] if n in values else np.zeros(_shape(params[n]), D.numpy_dtype(DTYPES[str(params[n].dtype)]))
            for n in range(len(params))]
    got, want = V._run(ours, args), V._run(theirs, args)
    worst_abs = worst_rel = 0.0
    for n in sorted(outs):
        ok, err, rel = V.compare(got[n], want[n], DTYPES[str(params[n].dtype)])
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
        if not ok:
            return {"ok": False, "against": "original", "max_abs_err": worst_abs, "max_rel_err": worst_rel,
                    "message": f"output {params[n].name} differs from the unscheduled original"}
    return {"ok": True, "against": "original", "max_abs_err": worst_abs, "max_rel_err": worst_rel}


# ------------------------------------------------------------------ edited schedules
def read_edits(directory: str | Path, subs: list[Subgraph], stems: dict[str, str], kind: str) -> dict:
    """stem -> checked Document for every .tsched file in `directory`; raises BuildStopped with the diagnostics
    of the first file with errors (all of them checked: syntax, names, shapes, legality)."""
    from tensorlang import api
    from tensorlang import diagnostics as Dg
    directory = Path(directory)
    if not directory.is_dir():
        raise BuildStopped(f"--schedules {directory}: no such directory")
    _, tname = target_decl(kind)
    docs, known = {}, set(stems.values())
    for path in sorted(directory.glob("*.tsched")):
        stem = path.stem
        if stem not in known:
            raise BuildStopped(f"{path}: error: no subgraph of this model is named '{stem}' (the files are named "
                               f"after their subgraph's operator: {', '.join(sorted(known))})")
        doc = api.load(path)
        diags = api.check(doc, legality=True)
        if Dg.has_errors(diags):
            raise BuildStopped(f"{path}: the edited schedule has errors; nothing was built or written",
                               [d for d in diags if d.severity == "error"], str(path))
        if stem not in doc.model.ops:
            raise BuildStopped(f"{path}: error: the file has no operator '{stem}'")
        if tname not in doc.model.targets:
            raise BuildStopped(f"{path}: error: the file declares no target '{tname}' (`{target_decl(kind)[0]}`)")
        docs[stem] = doc
    return docs


# ------------------------------------------------------------------ progress
class Progress:
    """One line per subgraph: a bar, the count, the subgraph and how it went (a log keeps every line)."""

    def __init__(self, total: int, stream=None, width: int = 24):
        self.total, self.done, self.width = total, 0, width
        self.stream = stream or sys.stderr
        self.t0 = time.time()

    def step(self, name: str, status: str) -> None:
        self.done += 1
        fill = round(self.width * self.done / max(1, self.total))
        bar = "#" * fill + "." * (self.width - fill)
        print(f"[{bar}] {self.done:>{len(str(self.total))}}/{self.total} {time.time() - self.t0:6.1f} s  "
              f"{name}: {status}", file=self.stream, flush=True)


# ------------------------------------------------------------------ the whole build
@dataclass
class Built:
    out: Path
    manifest: dict
    mod: object  # the IRModule handed to the Relax build (every subgraph scheduled)
    executable: object


def paths_of(out: str | Path) -> dict[str, Path]:
    out = Path(out)
    stem = out.name[:-3] if out.name.endswith(".so") else out.name
    return {"so": out, "manifest": out.with_name(stem + ".json"), "params": out.with_name(stem + ".params.npz"),
            "inputs": out.with_name(stem + ".inputs.npz"), "schedules": out.with_name(stem + ".schedules")}


def schedule_all(prep: Prepared, policy: str, kind: str, schedules: str | Path | None = None, check: bool = True,
                 progress: bool = True) -> tuple[object, list[Subgraph], dict[str, str]]:
    """Every subgraph scheduled: (the scheduled IRModule, the subgraphs, file name -> text)."""
    from tensorlang import api
    from tensorlang.baselines import generate
    from tensorlang.machine import host

    subs, funcs = subgraphs_of(prep)
    _, tname = target_decl(kind)
    total = len(subs)
    texts, translations, stems, used = {}, {}, {}, set()
    for n, sub in enumerate(subs, 1):
        tr, text = op_text(prep, sub, funcs[sub.key], n, total, kind)
        if tr is None:
            sub.source, sub.policy, sub.fallback = "fallback", "default", text
            continue
        stem, k = tr.op.name, 1
        while stem in used:
            stem, k = f"{tr.op.name}_{k}", k + 1
        used.add(stem)
        sub.op, sub.file = tr.op.name, stem + ".tsched"
        stems[sub.key] = stem
        translations[sub.key], texts[sub.key] = tr, text
    edits = read_edits(schedules, subs, stems, kind) if schedules else {}  # stops before any work on a bad edit

    mod = prep.mod.clone()  # prep stays the unscheduled module (a caller may schedule it again)
    files: dict[str, str] = {}
    bar = Progress(total) if progress else None
    where = "GPU sm_90" if kind != "llvm" else host().name
    for sub in subs:
        t0 = time.time()
        original = funcs[sub.key]
        scheduled = None
        if sub.source != "fallback":
            tr, stem = translations[sub.key], stems[sub.key]
            if stem in edits:
                doc = edits[stem]
                sub.source, sub.policy = "edited", "from --schedules"
                file_text = doc.text
            else:
                doc = api.load_text(texts[sub.key], sub.file)
                gen = generate(policy, doc.primfunc(tr.op.name), doc.model.ops[tr.op.name], doc.model.targets[tname])
                errors = [d for d in gen.diagnostics if d.severity == "error"]
                if gen.mod is None or errors:
                    why = "; ".join(f"{d.code} {d.message}" for d in errors) or "no schedule"
                    sub.source, sub.policy, sub.fallback = "fallback", "default", f"policy {policy}: {why}"
                    file_text = with_schedule(texts[sub.key], tr.op.name, tname, None,
                                              f"policy {policy} found no schedule ({why}); built with the default "
                                              f"(DLight) schedule of the original PrimFunc")
                    files[sub.file] = file_text
                else:
                    sub.policy = gen.policy
                    file_text = with_schedule(texts[sub.key], tr.op.name, tname, gen.schedule_text,
                                              f"generated by policy {gen.policy} for target {tname} ({where})"
                                              if gen.schedule_text is not None else
                                              f"policy {gen.policy}: TVM's DLight rules, no .tsched statements; "
                                              f"write a schedule block here to replace them")
                    doc = api.load_text(file_text, sub.file)
            if sub.source != "fallback":
                if doc.model.schedule_for(tr.op.name, tname) is not None:
                    low = api.lower_op(doc, tr.op.name, tname)
                else:  # an operator without a schedule block: DLight's rules on it (policy default)
                    low = api.lower_op(doc, tr.op.name, tname, "default")
                    sub.policy = "default"
                errors = [d for d in low.diagnostics if d.severity == "error"]
                if not low.ok:
                    if sub.source == "edited":
                        raise BuildStopped(f"{doc.path}: the edited schedule does not lower", errors, doc.path)
                    sub.source, sub.policy = "fallback", "default"
                    sub.fallback = "lowering failed: " + "; ".join(f"{d.code} {d.message}" for d in errors)
                else:
                    try:
                        scheduled = adapt(low.mod["main"], original, tr)
                    except ValueError as e:
                        if sub.source == "edited":
                            raise BuildStopped(f"{doc.path}: error: the operator's signature does not match the "
                                               f"subgraph: {e}") from None
                        sub.source, sub.policy, sub.fallback = "fallback", "default", f"signature: {e}"
                    if scheduled is not None and check and kind == "llvm":
                        sub.check = check_numerically(original, scheduled, tr, doc, low.mod)
                        if not sub.check["ok"]:
                            if sub.source == "edited":
                                raise BuildStopped(f"{doc.path}: error: the edited operator computes something else "
                                                   f"than the subgraph: {sub.check['message']}")
                            sub.source, sub.policy = "fallback", "default"
                            sub.fallback = f"numerical check failed: {sub.check['message']}"
                            scheduled = None
                    elif scheduled is not None and kind != "llvm":
                        sub.check = {"ok": None, "message": "not run: no GPU on this machine (compile only)"}
                if sub.source == "fallback":  # the file says what was built: no schedule block, the reason
                    file_text = with_schedule(texts[sub.key], tr.op.name, tname, None,
                                              f"policy {policy}'s schedule was not used ({sub.fallback[:300]}); "
                                              f"built with the default (DLight) schedule of the original PrimFunc")
                files[sub.file] = file_text
        if scheduled is None:
            scheduled = default_schedule_original(original, kind)
        for name in sub.functions:
            mod.update_func(mod.get_global_var(name), scheduled)
        sub.seconds = round(time.time() - t0, 3)
        if bar:
            status = (f"{sub.policy}" if sub.source != "fallback" else f"FALLBACK to default ({sub.fallback})")
            if sub.check and sub.check.get("ok"):
                status += f", checked (max rel err {sub.check['max_rel_err']:.1e})"
            bar.step(sub.name + (f" x{sub.calls}" if sub.calls > 1 else ""), status[:160] + f" [{sub.seconds:.1f} s]")
    mod = lower_leftovers(mod, subs, kind)
    return mod, subs, files


def lower_leftovers(mod, subs: list[Subgraph], kind: str):
    """Relax operators pipeline "zero" leaves in the module (GPT-2's and LLaMA's causal masks keep an
    `R.cumsum`, which the VM cannot run): TVM's own dispatch (`DispatchSortScan`, `DispatchSampling`) and
    legalization turn them into PrimFuncs here. They are no task of `extract`, so no .tsched operator
    exists for them: each is listed as a fallback subgraph (TVM's own kernel; DLight's rules on GPU)."""
    import tvm
    from tvm import relax, tirx
    target = tvm_build_target(kind)
    if kind == "llvm":
        from tvm.relax.backend.cpu_generic import pipeline as backend
    else:
        from tvm.relax.backend.gpu_generic import pipeline as backend
    before = {gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    mod = _bool_cumsum_as_int(mod)
    with target:
        mod = tvm.transform.Sequential(backend.library_dispatch_passes(target) + [relax.transform.LegalizeOps()])(mod)
    script = None
    for gv, f in list(mod.functions.items()):
        if not isinstance(f, tirx.PrimFunc) or gv.name_hint in before:
            continue
        script = script or "\n".join(str(g) + f.script() for g, f in mod.functions.items()
                                     if isinstance(f, relax.Function))
        how = "TVM's own kernel from DispatchSortScan/LegalizeOps"
        if kind != "llvm":
            try:
                mod.update_func(gv, default_schedule_original(f, kind))
                how += ", DLight's rules"
            except Exception as e:
                how += f" (DLight failed: {str(e).strip().splitlines()[-1][:120] if str(e).strip() else e})"
        subs.append(Subgraph(gv.name_hint, structural_key(f), [gv.name_hint],
                             max(1, script.count(f"{gv.name_hint},") + script.count(f"{gv.name_hint}(")),
                             source="fallback", policy="default",
                             fallback=f"a Relax operator left after pipeline 'zero' (not an extracted task): {how}"))
    return mod


def _bool_cumsum_as_int(mod):
    """`R.cumsum` of a bool tensor as int32 cumsum then `!= 0`: TVM's LLVM backend cannot add bools (it stops with
    `CreateAdd ... kDLFloat`), and torch's `cumsum` of a bool mask counts (int64) before the mask is read as bool."""
    from tvm import relax
    from tvm.relax.dpl import is_op, rewrite_call, wildcard
    pattern = is_op("relax.cumsum")(wildcard())

    def rewriter(expr, matches):
        x = expr.args[0]
        if getattr(getattr(x, "ty", None), "dtype", None) != "bool" or expr.attrs.dtype not in (None, "bool"):
            return expr
        counted = relax.op.cumsum(relax.op.astype(x, "int32"), axis=expr.attrs.axis, dtype="int32",
                                  exclusive=bool(expr.attrs.exclusive))
        return relax.op.astype(counted, "bool")

    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function) and "cumsum" in f.script(show_meta=False):
            mod.update_func(gv, rewrite_call(pattern, rewriter, f))
    return mod


def relax_build(mod, kind: str):
    """The Relax VM executable of a module whose PrimFuncs are all scheduled: lowering passes only."""
    import tvm
    target = tvm_build_target(kind)
    if kind == "llvm":
        from tvm.relax.backend.cpu_generic import pipeline as backend
    else:
        from tvm.relax.backend.gpu_generic import pipeline as backend
    passes = backend.dataflow_lower_passes(target) + backend.finalize_passes(target)

    @tvm.transform.module_pass(opt_level=0)
    def lower_only(m, _ctx):
        with target:
            return tvm.transform.Sequential(passes)(m)

    return tvm.compile(mod, target=target, relax_pipeline=lower_only)


def generator_of(policy: str) -> str | None:
    """The model behind a tlm policy's schedules (its name and version, as their comments name it, and its
    decoding switches), else None: an executable built with another checkpoint, or with the same weights
    decoded otherwise, is another executable (bench-model --reuse-builds)."""
    if not policy.startswith("tlm"):
        return None
    from tensorlang.baselines.tlm import checkpoint_missing
    from tensorlang.lm import model as M
    if checkpoint_missing():
        return None
    return f"{M.version(M.read_card(M.DEFAULT_DIR))} ({M.decoding_summary(M.DEFAULT_DIR)})"


def compile_model(model: str, out: str | Path, kind: str = "llvm", policy: str = "roller", batch: int = 1,
                  seq: int | None = None, small: bool = False, image: int | None = None,
                  schedules: str | Path | None = None, check: bool = True, progress: bool = True,
                  compare_torch: bool = True, log=None, write: bool = True, prep: Prepared | None = None) -> Built:
    """Build `model` with `policy`; write the executable, manifest, weights, inputs and schedules next to `out`.
    `prep`: the model's Prepared module when the caller has it already (it is not changed)."""
    import numpy as np

    from tensorlang.machine import describe, host_line
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    problem = _policy_ok(policy)
    if problem:
        raise BuildStopped(problem)
    if policy.startswith("metaschedule") and not policy.partition(":")[2]:
        policy = "metaschedule:64"
    t0 = time.time()
    prep = prep or prepare(model, batch, seq, small, image, kind, log)
    t_prep = time.time()
    mod, subs, files = schedule_all(prep, policy, kind, schedules, check, progress)
    t_sched = time.time()
    ex = relax_build(mod, kind)
    t_build = time.time()
    paths = paths_of(out)
    manifest = {
        "model": model, "small": small, "config": prep.spec_config, "target": kind,
        "target_detail": str(tvm_build_target(kind)), "policy": policy,
        "schedules_from": str(schedules) if schedules else None,
        "host": host_line(), "machine": describe(), "generator": generator_of(policy),
        "seconds": {"extract": round(t_prep - t0, 2), "schedule": round(t_sched - t_prep, 2),
                    "build": round(t_build - t_sched, 2)},
        "params": len(prep.params), "inputs": [list(x.shape) for x in prep.inputs],
        "subgraphs": [asdict(s) for s in subs],
        "fallbacks": sum(1 for s in subs if s.source == "fallback"),
        "edited": sum(1 for s in subs if s.source == "edited"),
        "files": {"executable": paths["so"].name, "params": paths["params"].name, "inputs": paths["inputs"].name,
                  "schedules": paths["schedules"].name},
    }
    # "schedule time" of a policy: everything it takes to make the schedules and the executable
    manifest["seconds"]["generation_and_compile"] = round(t_build - t_prep, 2)
    if write:
        paths["so"].parent.mkdir(parents=True, exist_ok=True)
        if kind == "llvm":
            ex.export_library(str(paths["so"]))
        else:
            _export_cuda(ex, paths, manifest)
        np.savez(paths["params"], *[p.numpy() for p in prep.params])
        np.savez(paths["inputs"], *prep.inputs)
        sdir = paths["schedules"]
        sdir.mkdir(exist_ok=True)
        for old in sdir.glob("*.tsched"):
            if old.name not in files:
                old.unlink()
        for name, text in files.items():
            if not (sdir / name).exists() or (sdir / name).read_text() != text:
                (sdir / name).write_text(text)
    if compare_torch and kind == "llvm":
        manifest["torch_check"] = compare_with_torch(ex, prep, model, batch, seq, small, image)
        c = manifest["torch_check"]
        log(f"{model}: outputs against PyTorch eager: {'ok' if c['ok'] else 'MISMATCH'}"
            f"{' (PyTorch outputs all zero: a weak check; the per-subgraph checks carry it)' if c.get('reference_all_zero') else ''} (max abs err "
            f"{c['max_abs_err']:.2e}, max rel err {c['max_rel_err']:.2e}; tolerance {c['tolerance']})")
    manifest["seconds"]["total"] = round(time.time() - t0, 2)
    if write:
        paths["manifest"].write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    fb = manifest["fallbacks"]
    log(f"{model}: {len(subs)} subgraphs ({manifest['edited']} from --schedules, {fb} fallback{'s' if fb != 1 else ''} to "
        f"default), schedules {manifest['seconds']['schedule']:.1f} s, build {manifest['seconds']['build']:.1f} s"
        + (f" -> {paths['so']}" if write else ""))
    return Built(paths["so"], manifest, mod, ex)


def _export_cuda(ex, paths, manifest) -> None:
    """CUDA, compile only: the executable's CUDA source is compiled to PTX by nvcc (proof that the kernels
    compile), and the library is exported when TVM can (it needs nvcc for a fatbin)."""
    from tensorlang.lower.build import nvcc_available
    mods = [m for m in ex.mod.imports] if hasattr(ex, "mod") else []
    src = ""
    for m in mods:
        for sub in [m] + list(m.imports):
            try:
                if sub.kind == "cuda" or "cuda" in str(sub.type_key if hasattr(sub, "type_key") else ""):
                    src = sub.inspect_source()
            except Exception:
                pass
    cu = paths["so"].with_suffix(".cu")
    info = {"cuda_source": None, "ptx": None, "exported": None}
    if src:
        cu.write_text(src)
        info["cuda_source"] = cu.name
        info["kernels"] = src.count("__global__")
        if nvcc_available():
            from tensorlang.lower.build import ptx_from_cuda
            ptx = ptx_from_cuda(src, tvm_build_target("cuda"))
            cu.with_suffix(".ptx").write_text(ptx)
            info["ptx"] = cu.with_suffix(".ptx").name
    try:
        ex.export_library(str(paths["so"]))
        info["exported"] = paths["so"].name
    except Exception as e:
        info["exported"] = f"not exported: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else e}"
    manifest["cuda"] = info


# ------------------------------------------------------------------ running
def run_vm(ex, params: list, inputs: list, dev=None) -> list:
    """Outputs of main(inputs..., params...) as numpy arrays (tuples flattened)."""
    import numpy as np
    import tvm
    from tvm import relax
    dev = dev or tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.asarray(x), dev) for x in inputs] + [
        p if hasattr(p, "numpy") and not isinstance(p, np.ndarray) else tvm.runtime.tensor(np.asarray(p), dev)
        for p in params]
    return flatten_tvm(vm["main"](*args))


def flatten_tvm(x) -> list:
    if hasattr(x, "numpy"):
        return [x.numpy()]
    out = []
    for item in x:
        out.extend(flatten_tvm(item))
    return out


def torch_outputs(module, inputs) -> list:
    import torch
    from torch.utils._pytree import tree_flatten
    with torch.no_grad():
        res = module(*[torch.from_numpy(x) for x in inputs])
    if hasattr(res, "to_tuple"):
        res = res.to_tuple()
    leaves, _ = tree_flatten(res)
    return [t.detach().numpy() for t in leaves if hasattr(t, "detach")]


def compare_outputs(ours: list, ref: list, tolerance=TOLERANCE) -> dict:
    import numpy as np
    rtol, atol = tolerance
    worst_abs = worst_rel = 0.0
    ok = len(ours) == len(ref)
    for a, b in zip(ours, ref):
        if a.shape != b.shape:
            ok = False
            continue
        err = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        scale = float(np.max(np.abs(b.astype(np.float64)))) if b.size else 0.0
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, err / scale if scale else err)
        ok = ok and err <= rtol * scale + atol
    out = {"ok": bool(ok), "outputs": len(ref), "max_abs_err": worst_abs, "max_rel_err": worst_rel,
           "tolerance": f"max|ours - torch| <= {rtol:g} * max|torch| + {atol:g} per output"}
    if ref and all(not np.any(b) for b in ref):  # say it: agreeing with all-zero outputs shows little
        out["reference_all_zero"] = True
    return out


def compare_with_torch(ex, prep: Prepared, model, batch, seq, small, image) -> dict:
    from tensorlang.data import models
    spec = models.build(model, batch=batch, seq=seq, small=small, image=image)  # seeded: the same weights
    return compare_outputs(run_vm(ex, prep.params, prep.inputs), torch_outputs(spec.module, prep.inputs))


def load_built(out: str | Path):
    """(executable, manifest, params, inputs) of a compile-model output."""
    import numpy as np
    import tvm
    paths = paths_of(out)
    manifest = json.loads(paths["manifest"].read_text())
    ex = tvm.runtime.load_module(str(paths["so"]))
    with np.load(paths["params"]) as z:
        params = [z[f"arr_{i}"] for i in range(len(z.files))]
    with np.load(paths["inputs"]) as z:
        inputs = [z[f"arr_{i}"] for i in range(len(z.files))]
    return ex, manifest, params, inputs


# ------------------------------------------------------------------ command line
def add_model_arguments(p: argparse.ArgumentParser) -> None:
    from tensorlang.data.models import MODELS
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, help="sequence length of the text models (default 128; 16 with --small)")
    p.add_argument("--image", type=int, help="image size of the vision models (default 224; 32 with --small)")
    p.add_argument("--small", action="store_true", help="the model's tiny config (as `tensorlang extract --small`)")
    p.add_argument("--target", required=True, choices=("llvm", "cpu", "cuda"),
                   help="llvm (= cpu): this host's CPU; cuda: sm_90, compile only here")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--policy", default="tlm", help="tlm | roller | default | metaschedule:N (default tlm)")
    p.add_argument("--schedules", metavar="DIR", help="edited .tsched files that replace the generated ones")
    p.add_argument("--no-check", action="store_true", help="skip the numerical check of each scheduled subgraph")
    p.add_argument("-o", "--output", help="the executable (default build/<model>-<policy>.so)")


def default_output(model: str, policy: str, small: bool, kind: str) -> str:
    tag = policy.replace(":", "") + ("-cuda" if kind == "cuda" else "")
    return f"build/{model}{'-small' if small else ''}-{tag}.so"


def cmd_compile_model(args) -> int:
    kind = "cuda" if args.target == "cuda" else "llvm"
    if args.batch < 1 or (args.seq is not None and args.seq < 1):
        print("tensorlang compile-model: --batch and --seq must be positive", file=sys.stderr)
        return 2
    out = args.output or default_output(args.model, args.policy, args.small, kind)
    try:
        built = compile_model(args.model, out, kind, args.policy, args.batch, args.seq, args.small, args.image,
                              args.schedules, check=not args.no_check)
    except BuildStopped as e:
        for d in e.diagnostics:
            print(d.format(e.path), file=sys.stderr)
        print(f"tensorlang compile-model: {e}", file=sys.stderr)
        return 1
    tc = built.manifest.get("torch_check")
    return 1 if tc is not None and not tc["ok"] else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tensorlang compile-model", description=__doc__.split("\n")[0])
    add_arguments(p)
    return cmd_compile_model(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
