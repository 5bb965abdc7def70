"""MetaSchedule trace -> .tsched statements (`tensorlang import-trace`, and every point of the space).

The trace is replayed instruction by instruction through tensorlang's own schedule applier, so
each emitted statement is checked as it is made, and the names it binds are the ones a reader
sees in `tensorlang show`: split and fuse outputs take TVM's loop names (`i_0`, `i_0_j_0_fused`),
new stages TVM's block names (`C_local`, `A_shared`, `C_init`). Lookups (get_sblock, get_loops,
get_consumers, ...) and samplings emit nothing: a lookup becomes a name, a sampling's decision
becomes the literal its user takes (split factors, an annotation value, a compute-at site).
"""
from __future__ import annotations

import re

from tensorlang.lower.schedule import NameEnv, _stage_or_loop, apply_stmt, initial_env, loop_names, new_schedule, \
    resolve_loop, resolve_stage, stage_name_of
from tensorlang.parser import ast as A
from tensorlang.parser.printer import format_stmt

_LOOKUPS = {"GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks"}


class ConversionError(Exception):
    pass


def _ref(text: str) -> A.Ref:
    return A.Ref(tuple(text.split(".")))


def _const(v) -> A.Const:
    if isinstance(v, list):
        return A.ListArg(tuple(_const(x) for x in v))
    if isinstance(v, bool):
        return A.Ref(("True" if v else "False",))
    if isinstance(v, int):
        return A.Const("int", str(v))
    if isinstance(v, float):
        return A.Const("float", repr(v))
    return A.Const("str", '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"')


def _py(x):
    """A trace attribute or constant input as a Python value."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "value"):  # IntImm, FloatImm
        return x.value
    try:
        return [_py(e) for e in x]  # Array
    except TypeError:
        return str(x)


class _Converter:
    def __init__(self, mod, op_model):
        self.sch = new_schedule(mod)
        self.env: NameEnv = initial_env(self.sch, op_model)
        self.refs: dict = {}  # trace RV -> A.Ref (stages and loops)
        self.values: dict = {}  # trace ExprRV -> int / value
        self.locations: dict = {}  # trace LoopRV from SampleComputeLocation -> (decision, block RV)
        self.stmts: list[A.SchedStmt] = []

    # -------------------------------------------------------------- names
    def stage_ref(self, rv) -> A.Ref:
        if rv not in self.refs:
            raise ConversionError("a stage is used before the trace looked it up")
        return self.refs[rv]

    def _name_block(self, our_block_rv) -> A.Ref:
        return A.Ref((stage_name_of(self.sch, self.env, self.sch.get(our_block_rv)),))

    def our_block(self, rv):
        return resolve_stage(self.sch, self.env, self.stage_ref(rv))

    def loop_ref(self, rv) -> A.Ref:
        if rv in self.locations:
            raise ConversionError("compute location used outside compute_at")
        if rv not in self.refs:
            raise ConversionError("a loop is used before the trace looked it up")
        return self.refs[rv]

    def _names_uniquely(self, display: str, rv) -> bool:
        from tensorlang.lower.schedule import StmtError
        try:
            return self.sch.get(resolve_loop(self.sch, self.env, _ref(display))).same_as(self.sch.get(rv))
        except StmtError:
            return False

    def value(self, x):
        if x is None:
            return None
        if x in self.values:
            return self.values[x]
        return _py(x)

    def fresh(self, base: str) -> str:
        name = re.sub(r"\W", "_", base) or "l"
        taken = set(self.env.loops) | set(self.env.stages)
        if name not in taken:
            return name
        n = 2
        while f"{name}_{n}" in taken:
            n += 1
        return f"{name}_{n}"

    # -------------------------------------------------------------- apply
    def emit(self, prim: str, args: list, outputs=(), out_kind: str | None = None, kwargs=()):
        """Apply one statement; bind its outputs to TVM's names for them."""
        placeholders = tuple(A.Name(f"__out{n}") for n in range(len(outputs)))
        call_args = tuple(args) + tuple(A.KwSchedArg(k, v) for k, v in kwargs)
        stmt = A.SchedStmt(placeholders, prim, call_args)
        diags = apply_stmt(self.sch, self.env, stmt)
        errors = [d for d in diags if d.severity == "error"]
        if errors:
            raise ConversionError(f"{prim}: {errors[0].message}")
        names = []
        for n, trace_rv in enumerate(outputs):
            tmp = f"__out{n}"
            if out_kind == "stage":
                rv = self.env.stages.pop(tmp)
                name = self.fresh(self.sch.get(rv).name_hint)
                self.env.stages[name] = rv
            else:
                rv = self.env.loops.pop(tmp)
                name = self.fresh(self.sch.get(rv).loop_var.name)
                self.env.loops[name] = rv
            names.append(A.Name(name))
            self.refs[trace_rv] = A.Ref((name,))
        self.stmts.append(A.SchedStmt(tuple(names), prim, call_args))

    def run(self, trace) -> list[A.SchedStmt]:
        decisions = {inst: trace.get_decision(inst) for inst in trace.insts}
        for inst in trace.insts:
            self.step(inst, decisions.get(inst))
        return self.stmts

    def step(self, inst, decision):
        k = inst.kind.name
        ins, attrs, outs = list(inst.inputs), [_py(a) for a in inst.attrs], list(inst.outputs)
        sch, env = self.sch, self.env
        if k == "EnterPostproc":
            return
        if k == "GetSBlock":
            self.refs[outs[0]] = self._name_block(sch.get_sblock(attrs[0]))
            return
        if k == "GetLoops":
            block_rv = self.our_block(ins[0])
            stage = self.stage_ref(ins[0]).text
            names = loop_names(sch, env, block_rv, stage)
            if all(self._names_uniquely(display, rv) for display, rv in names):
                for trace_rv, (display, _) in zip(outs, names):
                    self.refs[trace_rv] = _ref(display)
                return
            # Some loop is not reachable by STAGE.var (TVM reused a loop name in this nest): name them all.
            return self.emit("get_loops", [self.stage_ref(ins[0])], outs, "loop")
        if k in ("GetChildBlocks", "GetProducers", "GetConsumers", "GetOutputBlocks"):
            if k == "GetChildBlocks":
                found = sch.get_child_blocks(_stage_or_loop(sch, env, self.refs[ins[0]]))
            elif k == "GetOutputBlocks":
                found = sch.get_output_blocks(self.our_block(ins[0]))
            else:
                found = getattr(sch, "get_producers" if k == "GetProducers" else "get_consumers")(self.our_block(ins[0]))
            for trace_rv, rv in zip(outs, found):
                self.refs[trace_rv] = self._name_block(rv)
            return
        if k == "SamplePerfectTile":
            for trace_rv, v in zip(outs, decision):
                self.values[trace_rv] = int(v)
            return
        if k == "SampleCategorical":
            self.values[outs[0]] = _py(attrs[0][int(decision)])
            return
        if k == "SampleComputeLocation":
            self.locations[outs[0]] = (int(decision), ins[0])
            return
        if k == "Split":
            factors = [self.value(f) for f in ins[1:]]
            args = [self.loop_ref(ins[0]), A.ListArg(tuple(A.Ref(("None",)) if f is None else _const(int(f))
                                                            for f in factors))]
            kw = [(n, _const(bool(v))) for n, v, d in (("preserve_unit_iters", attrs[0], True),
                                                      ("disable_predication", attrs[1], False)) if bool(v) != d]
            return self.emit("split", args, outs, "loop", kw)
        if k == "Fuse":
            kw = [] if bool(attrs[0]) else [("preserve_unit_iters", _const(False))]
            return self.emit("fuse", [self.loop_ref(x) for x in ins], outs, "loop", kw)
        if k == "Reorder":
            return self.emit("reorder", [self.loop_ref(x) for x in ins])
        if k in ("Parallel", "Vectorize", "Unroll"):
            return self.emit(k.lower(), [self.loop_ref(ins[0])])
        if k == "Bind":
            return self.emit("bind", [self.loop_ref(ins[0]), _ref(attrs[0])])
        if k in ("CacheRead", "CacheWrite"):
            block_rv = self.our_block(ins[0])
            which = "reads" if k == "CacheRead" else "writes"
            regions = list(getattr(sch.get(block_rv), which))
            idx = int(attrs[0])
            names = [r.source.name for r in regions]
            buffer = _ref(names[idx]) if names.count(names[idx]) == 1 else _const(idx)
            args = [self.stage_ref(ins[0]), buffer, _ref(attrs[1])]
            consumers = list(ins[1]) if len(ins) > 1 and ins[1] is not None else []
            kw = []
            if consumers and [self.stage_ref(c).text for c in consumers] != [self.stage_ref(ins[0]).text]:
                kw = [("consumers", A.ListArg(tuple(self.stage_ref(c) for c in consumers)))]
            return self.emit("cache_read" if k == "CacheRead" else "cache_write", args, outs, "stage", kw)
        if k in ("ComputeAt", "ReverseComputeAt"):
            block, loop = ins[0], ins[1]
            if loop in self.locations:
                d, sampled_block = self.locations[loop]
                if d == -1:
                    return  # compute at the root: where the stage already is
                if d == -2:
                    return self.emit("compute_inline", [self.stage_ref(block)])
                consumer = sch.get_consumers(self.our_block(sampled_block))[0]
                stage = stage_name_of(sch, env, sch.get(consumer))
                names = loop_names(sch, env, consumer, stage)
                display, rv = names[d]
                if self._names_uniquely(display, rv):
                    loop_ref = _ref(display)
                else:  # name the consumer's loops first (see GetLoops)
                    keys = [object() for _ in names]
                    self.emit("get_loops", [A.Ref((stage,))], keys, "loop")
                    loop_ref = self.refs[keys[d]]
            else:
                loop_ref = self.loop_ref(loop)
            kw = []
            if bool(attrs[0]):
                kw.append(("preserve_unit_loops", _const(True)))
            if int(attrs[1]) != -1:
                kw.append(("index", _const(int(attrs[1]))))
            prim = "compute_at" if k == "ComputeAt" else "reverse_compute_at"
            return self.emit(prim, [self.stage_ref(block), loop_ref], (), None, kw)
        if k in ("ComputeInline", "ReverseComputeInline"):
            return self.emit("compute_inline" if k == "ComputeInline" else "reverse_compute_inline",
                             [self.stage_ref(ins[0])])
        if k == "DecomposeReduction":
            return self.emit("decompose_reduction", [self.stage_ref(ins[0]), self.loop_ref(ins[1])], outs, "stage")
        if k == "RFactor":
            return self.emit("rfactor", [self.loop_ref(ins[0]), _const(int(attrs[0]))], outs, "stage")
        if k in ("Annotate", "Unannotate"):
            target = self.refs.get(ins[0])
            if target is None:
                raise ConversionError(f"{k}: unknown target")
            if k == "Unannotate":
                return self.emit("unannotate", [target, _const(str(attrs[0]))])
            return self.emit("annotate", [target, _const(str(attrs[0])), _const(self.value(ins[1]))])
        if k == "StorageAlign":
            return self.emit("storage_align", [self.stage_ref(ins[0])] + [_const(int(a)) for a in attrs[:4]])
        if k == "SetScope":
            return self.emit("set_scope", [self.stage_ref(ins[0]), _const(int(attrs[0])), _ref(attrs[1])])
        if k == "AddUnitLoop":
            return self.emit("add_unit_loop", [self.refs[ins[0]]], outs, "loop")
        raise ConversionError(f"the trace instruction {k} has no .tsched statement")


def trace_to_statements(trace, mod, op_model) -> tuple[list[A.SchedStmt], object]:
    """(.tsched statements, the module they produce) for a MetaSchedule trace on `mod`."""
    conv = _Converter(mod, op_model)
    stmts = conv.run(trace)
    return drop_transient_annotations(stmts), conv.sch.mod


def drop_transient_annotations(stmts: list[A.SchedStmt]) -> list[A.SchedStmt]:
    """Remove each `annotate(X, key, v)` that a later `unannotate(X, key)` takes back (and that pair).

    MetaSchedule's rules leave notes for its postprocessors (`meta_schedule.parallel`, ...), which
    read and remove them; the statements the postprocessors made say the same thing. Between the
    pair nothing but the postprocessors looks at the note, so the schedule is the same without it.
    """
    out = list(stmts)
    i = 0
    while i < len(out):
        s = out[i]
        if s.prim == "annotate":
            target, key = s.args[0], s.args[1]
            j = next((j for j in range(i + 1, len(out)) if out[j].prim in ("annotate", "unannotate")
                      and out[j].args[0] == target and out[j].args[1] == key), None)
            if j is not None and out[j].prim == "unannotate" and not _rebinds(out[i + 1:j], target):
                del out[j]
                del out[i]
                continue
        i += 1
    # An annotation set again to the value it already has changes nothing.
    last: dict = {}
    kept = []
    for s in out:
        if s.prim in ("annotate", "unannotate"):
            key = (s.args[0], s.args[1])
            value = s.args[2] if s.prim == "annotate" else None
            if s.prim == "annotate" and last.get(key) == value:
                continue
            last[key] = value
        for t in s.targets:  # a rebound name is a new target
            last = {k: v for k, v in last.items() if k[0].parts[0] != t.name}
        kept.append(s)
    return kept


def _rebinds(stmts, ref: A.Ref) -> bool:
    return any(t.name == ref.parts[0] for s in stmts for t in s.targets)


def render_schedule(op: str, target: str, stmts) -> str:
    """A schedule block as people read it: space/render.py (short names, no identity fuse, comments)."""
    from tensorlang.space import render
    return render.render_schedule(op, target, stmts)
