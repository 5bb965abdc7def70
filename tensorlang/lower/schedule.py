"""Apply a .tsched schedule to a PrimFunc with `tvm.s_tir.Schedule`, one primitive per statement.

Names: a stage is the tensor it writes (`C`), or the name a statement bound (`CL = cache_write(...)`),
or a block name TVM made (`C_init`). A loop is a name a statement bound (`i0`), or `STAGE.name`
where name is a bound name or TVM's name of one of the stage's loops (`C.i`, `AS.ax0`).

Errors: each statement is checked before TVM sees it where we can say more than TVM (split factors,
reorder across stages, parallel/vectorize of a reduction loop, compute_at sites: the legal ones are
listed); anything TVM still rejects is mapped back to the statement with its message condensed.
The first error stops the schedule: later statements would act on a state the author did not mean.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tensorlang.analysis.primitives import BoundArgs, arg_text_value, match_args
from tensorlang.diagnostics import Diagnostic, error, one_of, warning
from tensorlang.lower import tir
from tensorlang.parser import ast as A


class StmtError(Exception):
    def __init__(self, diag: Diagnostic):
        super().__init__(diag.message)
        self.diag = diag


@dataclass
class NameEnv:
    """What the names of a schedule denote, as the statements run."""
    stages: dict = field(default_factory=dict)  # name -> SBlockRV
    loops: dict = field(default_factory=dict)  # name -> LoopRV
    gone: dict = field(default_factory=dict)  # name -> why it no longer exists
    op_stages: tuple = ()  # the op's stage models, for the source loop names (C.i, C.k)
    # where loops came from, for fixes that name the statement to change (GPU limits):
    split_origins: dict = field(default_factory=dict)  # loop var name -> (factors span, factors, extent, index)
    fused: dict = field(default_factory=dict)  # loop var name -> the names of the loops fused into it
    unread: dict = field(default_factory=dict)  # a stage nothing reads (not in the kernel, TS216) -> its line

    def components(self, name: str) -> list[str]:
        """The split outputs a loop is made of (itself, or those fused into it, recursively)."""
        if name not in self.fused:
            return [name]
        return [c for part in self.fused[name] for c in self.components(part)]


@dataclass
class Applied:
    sch: object  # tvm.s_tir.Schedule after the statements that succeeded
    env: NameEnv
    diags: list[Diagnostic]
    applied: int  # statements applied

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diags)


class Unchecked:
    """A Schedule's methods without TVM's Python type checker, which wraps each of them and costs more
    than the call itself (70% of a softmax replay went to checking the arguments of `get`, `get_loops`
    and the compute-at probes; 95% of converting a conv2d trace to statements, 75% of applying a
    conv2d schedule's text in a build). Statements reach TVM only after analysis/primitives.py has
    checked their arguments against each primitive's signature, and the space and the trace
    converter pass only what TVM itself handed them."""

    def __init__(self, sch):
        self.sch = sch

    def __getattr__(self, name):
        method = getattr(type(self.sch), name)
        return getattr(method, "__wrapped__", method).__get__(self.sch)


def new_schedule(mod):
    from tvm import s_tir
    return Unchecked(s_tir.Schedule(mod))


def initial_env(sch, op_model) -> NameEnv:
    env = NameEnv(op_stages=op_model.stages)
    for st in op_model.stages:
        env.stages[st.tensor] = sch.get_sblock(st.tensor)
    env.unread = {st.tensor: st.name_span.line for st in op_model.ast.stages if st.tensor not in env.stages}
    return env


def apply_schedule(mod, op_model, schedule: A.Schedule, upto_line: int | None = None) -> Applied:
    sch = new_schedule(mod)
    env = initial_env(sch, op_model)
    diags: list[Diagnostic] = []
    applied = 0
    for stmt in schedule.stmts:
        if upto_line is not None and stmt.span.line > upto_line:
            break
        try:
            diags += apply_stmt(sch, env, stmt)
        except StmtError as e:
            diags.append(e.diag)
            break
        applied += 1
    return Applied(sch, env, diags, applied)


# ------------------------------------------------------------------ names
def block_name(sch, rv) -> str:
    return sch.get(rv).name_hint


def _valid(sch, rv) -> bool:
    try:
        sch.get(rv)
        return True
    except Exception:  # TVM raises once a loop or block has been removed
        return False


def stage_name_of(sch, env: NameEnv, block) -> str:
    """The name a user writes for a TVM block: its bound name, else TVM's name."""
    for name, rv in env.stages.items():
        if name not in env.gone and _valid(sch, rv) and sch.get(rv).same_as(block):
            return name
    return block.name_hint


def loop_names(sch, env: NameEnv, stage_rv, stage_name: str) -> list[tuple[str, object]]:
    """(display name, LoopRV) for each loop above a stage, outermost first: the first name bound to it, else
    STAGE.var. Each bound name is looked up in TVM once per call, not once per loop (the trace converter
    calls this at every GetLoops: 85% of converting a CUDA conv2d trace went to those lookups)."""
    bound = []
    for n, b in env.loops.items():
        if n in env.gone:  # removed (apply_stmt records it): asking TVM would raise
            continue
        try:
            bound.append((n, sch.get(b)))
        except Exception:  # TVM raises once a loop has been removed
            continue
    out = []
    for rv in sch.get_loops(stage_rv):
        loop = sch.get(rv)
        name = next((n for n, obj in bound if obj.same_as(loop)), None)
        out.append((name or f"{stage_name}.{loop.loop_var.name}", rv))
    return out


def all_stage_names(sch, env: NameEnv) -> list[str]:
    names = [n for n, rv in env.stages.items() if _valid(sch, rv)]
    for realize, _ in tir.block_realizes(sch.mod["main"].body):
        name = stage_name_of(sch, env, realize.block)
        if name not in names:
            names.append(name)
    return names


def _bound(sch, env: NameEnv, table: dict, kind: str, ref: A.Ref):
    """The RV a name is bound to in `table`; TS305 if it (or a name like it) no longer exists; None if unbound."""
    name = ref.parts[0]
    if name in table:
        rv = table[name]
        if _valid(sch, rv):
            return rv
        raise StmtError(error("TS305", f"{kind} '{name}' no longer exists: {env.gone.get(name, 'it was removed')}",
                              ref.span))
    if name in env.gone:
        raise StmtError(error("TS305", f"{kind} '{name}' no longer exists: {env.gone[name]}", ref.span))
    return None


def resolve_stage(sch, env: NameEnv, ref: A.Ref):
    if len(ref.parts) != 1:
        raise StmtError(error("TS303", f"'{ref.text}' is a loop; a stage is needed here; stages: "
                                       f"{one_of(all_stage_names(sch, env))}", ref.span, all_stage_names(sch, env)))
    name = ref.parts[0]
    rv = _bound(sch, env, env.stages, "stage", ref)
    if rv is not None:
        return rv
    try:  # a block name TVM made (C_init, C_local, ...)
        return sch.get_sblock(name)
    except Exception:
        pass
    stages = all_stage_names(sch, env)
    if name in env.unread:
        raise StmtError(error("TS303", f"stage '{name}' is not in the kernel: nothing reads it (line "
                                       f"{env.unread[name]}); stages: {one_of(stages)}", ref.span, stages))
    what = " (a loop)" if name in env.loops else ""
    from difflib import get_close_matches
    raise StmtError(error("TS303", f"unknown stage '{name}'{what}; stages: {one_of(stages)}", ref.span,
                          get_close_matches(name, stages, n=3, cutoff=0.5) or stages))


def resolve_loop(sch, env: NameEnv, ref: A.Ref):
    if len(ref.parts) == 1:
        name = ref.parts[0]
        rv = _bound(sch, env, env.loops, "loop", ref)
        if rv is not None:
            return rv
        choices = all_loop_names(sch, env)
        what = f"; '{name}' is a stage, write {name}.<index>" if name in env.stages else ""
        raise StmtError(error("TS304", f"unknown loop '{name}'{what}; loops: {one_of(choices)}", ref.span,
                              _close(name, choices)))
    if len(ref.parts) != 2:
        raise StmtError(error("TS304", f"'{ref.text}' is not a loop; write STAGE.index or a bound name", ref.span))
    stage_ref = A.Ref(ref.parts[:1], ref.span)
    stage_rv = resolve_stage(sch, env, stage_ref)
    stage, idx = ref.parts
    names = loop_names(sch, env, stage_rv, stage)
    for display, rv in names:
        if display == ref.text or display == idx or sch.get(rv).loop_var.name == idx:
            return rv
    choices = [d for d, _ in names]
    op_stage = next((st for st in env.op_stages if st.tensor == stage), None)
    if op_stage is not None and idx in [i.name for i in op_stage.loops]:
        raise StmtError(error("TS305", f"loop {ref.text} no longer exists: an earlier statement replaced it; "
                                       f"{stage}'s loops now: {one_of(choices)}", ref.span, choices))
    raise StmtError(error("TS304", f"stage {stage} has no loop '{idx}'; its loops: {one_of(choices)}", ref.span,
                          _close(ref.text, choices) or choices))


def all_loop_names(sch, env: NameEnv) -> list[str]:
    out = []
    for realize, _ in tir.block_realizes(sch.mod["main"].body):
        name = stage_name_of(sch, env, realize.block)
        try:
            rv = sch.get_sblock(realize.block.name_hint)
        except Exception:
            continue
        for display, _ in loop_names(sch, env, rv, name):
            if display not in out:
                out.append(display)
    return out


def _close(name, choices):
    from difflib import get_close_matches
    return get_close_matches(name, choices, n=3, cutoff=0.4)


def _ref_text(v) -> str:
    return v.text if isinstance(v, A.Ref) else str(v)


# ------------------------------------------------------------- statements
def apply_stmt(sch, env: NameEnv, stmt: A.SchedStmt) -> list[Diagnostic]:
    bound, diags = match_args(stmt)
    if bound is None:
        raise StmtError(diags[0])
    # names already gone are not asked again: a removed loop stays removed, and TVM's error is costly
    before = {n: rv for n, rv in list(env.loops.items()) + list(env.stages.items())
              if n not in env.gone and _valid(sch, rv)}
    before_split_or_fuse = _operands(sch, env, stmt, bound)
    result, extra = _dispatch(sch, env, stmt, bound)
    diags += extra
    _record_origins(sch, env, stmt, bound, result, before_split_or_fuse)
    _bind_results(sch, env, stmt, bound, result)
    # Remember why names stopped existing, for later "no longer exists" messages.
    for name, rv in before.items():
        if not _valid(sch, rv):
            env.gone[name] = f"line {stmt.span.line} ({stmt.prim}) removed it"
    return diags


def _operands(sch, env: NameEnv, stmt: A.SchedStmt, bound: BoundArgs):
    """What a split or fuse is about to replace (its loops die with it): the split loop's extent, the
    fused loops' names."""
    try:
        if stmt.prim == "split":
            return tir.as_int(sch.get(resolve_loop(sch, env, bound.values["loop"])).extent)
        if stmt.prim == "fuse":
            return [sch.get(resolve_loop(sch, env, r)).loop_var.name for r in bound.values["loops"]]
    except StmtError:
        pass  # the statement itself reports it
    return None


def _record_origins(sch, env: NameEnv, stmt: A.SchedStmt, bound: BoundArgs, result, operands) -> None:
    if result is None or operands is None:
        return
    if stmt.prim == "split":
        arg = bound.values["factors"]
        factors = [arg_text_value(f) for f in arg.items]
        for i, rv in enumerate(result):
            env.split_origins[sch.get(rv).loop_var.name] = (arg.span, factors, operands, i)
    elif stmt.prim == "fuse":
        env.fused[sch.get(result).loop_var.name] = operands


def _bind_results(sch, env: NameEnv, stmt: A.SchedStmt, bound: BoundArgs, result):
    if not stmt.targets or result is None:
        return
    values = list(result) if isinstance(result, (list, tuple)) or (
        hasattr(result, "__len__") and not hasattr(result, "same_as")) else [result]
    kind = bound.sig.returns
    for name, rv in zip(stmt.targets, values):
        if kind == "stage":
            env.stages[name.name] = rv
            env.loops.pop(name.name, None)
        else:
            if name.name in env.stages and _valid(sch, env.stages[name.name]):
                raise StmtError(error("TS302", f"'{name.name}' already names a stage; choose another name",
                                      name.span))
            env.loops[name.name] = rv
        env.gone.pop(name.name, None)


def _dispatch(sch, env: NameEnv, stmt: A.SchedStmt, b: BoundArgs):
    from tvm import s_tir
    v = b.values
    name = b.sig.name
    extra: list[Diagnostic] = []

    def loop(key="loop"):
        return resolve_loop(sch, env, v[key])

    def stage(key="stage"):
        return resolve_stage(sch, env, v[key])

    try:
        if name == "split":
            lrv = loop()
            factors, extra = _check_split(sch, lrv, v["factors"], stmt)
            return sch.split(lrv, factors, preserve_unit_iters=_val(v["preserve_unit_iters"]),
                             disable_predication=_val(v["disable_predication"])), extra
        if name == "fuse":
            loops = [resolve_loop(sch, env, r) for r in v["loops"]]
            _check_same_nest(sch, env, loops, v["loops"], "fuse")
            return sch.fuse(*loops, preserve_unit_iters=_val(v["preserve_unit_iters"])), extra
        if name == "reorder":
            loops = [resolve_loop(sch, env, r) for r in v["loops"]]
            _check_same_nest(sch, env, loops, v["loops"], "reorder")
            return sch.reorder(*loops), extra
        if name in ("parallel", "vectorize"):
            lrv = loop()
            _check_not_reduction(sch, env, lrv, v["loop"], name)
            return getattr(sch, name)(lrv), extra
        if name == "unroll":
            return sch.unroll(loop()), extra
        if name == "bind":
            return sch.bind(loop(), arg_text_value(v["thread_axis"])), extra
        if name in ("cache_read", "cache_write"):
            srv = stage()
            idx = _buffer_index(sch, srv, v["buffer"], "reads" if name == "cache_read" else "writes", stmt)
            consumers = None
            if isinstance(v["consumers"], A.ListArg):
                consumers = [resolve_stage(sch, env, r) for r in v["consumers"].items]
            return getattr(sch, name)(srv, idx, arg_text_value(v["scope"]), consumer_blocks=consumers), extra
        if name in ("compute_at", "reverse_compute_at"):
            srv, lrv = stage(), loop()
            return _compute_at(sch, env, name, srv, lrv, v, stmt), extra
        if name in ("compute_inline", "reverse_compute_inline"):
            return getattr(sch, name)(stage()), extra
        if name == "decompose_reduction":
            return sch.decompose_reduction(stage(), loop()), extra
        if name in ("annotate", "unannotate"):
            target = _stage_or_loop(sch, env, v["target"])
            if name == "annotate":
                value = arg_text_value(v["value"])
                return sch.annotate(target, arg_text_value(v["key"]), value), extra
            return sch.unannotate(target, arg_text_value(v["key"])), extra
        if name == "storage_align":
            return sch.storage_align(stage(), _val(v["buffer_index"]), _val(v["axis"]), _val(v["factor"]),
                                     _val(v["offset"])), extra
        if name == "set_scope":
            srv = stage()
            return sch.set_scope(srv, _buffer_index(sch, srv, v["buffer"], "writes", stmt),
                                 arg_text_value(v["scope"])), extra
        if name == "rfactor":
            return sch.rfactor(loop(), _val(v["factor_axis"])), extra
        if name == "get_loops":
            loops = sch.get_loops(stage())
            if len(stmt.targets) != len(loops):
                raise StmtError(error("TS312", f"get_loops: the stage has {len(loops)} loops; "
                                               f"{len(stmt.targets)} names given", stmt.span))
            return loops, extra
        if name == "add_unit_loop":
            return sch.add_unit_loop(_stage_or_loop(sch, env, v["target"])), extra
    except StmtError:
        raise
    except s_tir.ScheduleError as e:
        raise StmtError(error("TS310", f"{name}: {condense_tvm_error(str(e))}", stmt.span)) from None
    except Exception as e:  # TVM raises plain errors (ValueError, TVMError) for some misuses
        raise StmtError(error("TS310", f"{name}: {condense_tvm_error(str(e))}", stmt.span)) from None
    raise StmtError(error("TS301", f"primitive '{name}' is not supported here", stmt.prim_span))


def _val(x):
    return arg_text_value(x)


def _stage_or_loop(sch, env, ref: A.Ref):
    """A stage if the name is one (bound, or a block TVM made), else a loop."""
    if len(ref.parts) == 1 and ref.parts[0] not in env.loops:
        try:
            return resolve_stage(sch, env, ref)
        except StmtError:
            pass
    return resolve_loop(sch, env, ref)


def condense_tvm_error(text: str) -> str:
    """TVM's ScheduleError is an IR dump; keep the sentence that says what went wrong."""
    m = re.search(r"Error message:\s*(.+)", text, re.S)
    msg = m.group(1) if m else text.strip().splitlines()[-1] if text.strip() else "rejected"
    msg = msg.strip().split("\n")[0]
    # The dump marks each object the message names (`# s_tir.SBlock#0` above `with T.sblock("E"):`, and
    # `For#1` above `for j in ...`): name them as the schedule does; the message runs several together.
    names = {m.group(1): f"'{m.group(2) or m.group(3)}'" for m in re.finditer(
        r"#\s*[\w.]*?((?:SBlock|For)#\d+)\s*\n\s*(?:with T\.sblock\(\"([^\"]+)\"|for (\w+) in)", text)}
    msg = re.sub(r"[a-z_.]*((?:SBlock|For)#\d+)",
                 lambda m: " " + names.get(m.group(1), "the stage" if m.group(1).startswith("S") else "the loop"), msg)
    msg = re.sub(r"(?<=') +(?=')|(?<=the stage) +(?=the stage)|(?<=the loop) +(?=the loop)", ", ", msg)
    msg = re.sub(r"  +", " ", msg)
    msg = re.sub(r":(?=\S)", ": ", msg)
    msg = re.sub(r"^(ScheduleError|ValueError|TVMError|InternalError):\s*", "", msg)
    return msg[:300]


# ------------------------------------------------------------ pre-checks
def _check_split(sch, lrv, factors_arg: A.ListArg, stmt) -> tuple[list, list[Diagnostic]]:
    extent = tir.as_int(sch.get(lrv).extent)
    factors = [arg_text_value(f) for f in factors_arg.items]
    if sum(f is None for f in factors) > 1:
        raise StmtError(error("TS302", "split: at most one factor may be None", factors_arg.span))
    if extent is None or None in factors:
        return factors, []
    product = math.prod(factors)
    if product < extent:
        raise StmtError(error("TS306", f"split factors {_list(factors)} multiply to {product}, less than the loop's "
                                       f"extent {extent}", factors_arg.span, nearest_factorizations(extent, factors)))
    if extent % product and product % extent:
        return factors, [warning("TS311", f"split factors {_list(factors)} multiply to {product}, which does not "
                                          f"match the extent {extent}: a predicate guards the padding",
                                 factors_arg.span, nearest_factorizations(extent, factors))]
    if product != extent:
        return factors, [warning("TS311", f"split factors {_list(factors)} multiply to {product}, not the extent "
                                          f"{extent}: a predicate guards the padding", factors_arg.span,
                                 nearest_factorizations(extent, factors))]
    return factors, []


def _list(xs) -> str:
    return "[" + ", ".join("None" if x is None else str(x) for x in xs) + "]"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_factorizations(extent: int, factors: list[int], limit: int = 3) -> list[str]:
    """Perfect factorizations of `extent` closest to `factors` (log distance), as source text."""
    out = [_list(c) for c in factorizations_by_distance(extent, factors)[:limit]]
    return out or [_list([None] + factors[1:])]


def factorizations_by_distance(extent: int, factors: list[int], keep=lambda cand: True) -> list[tuple[int, ...]]:
    """The perfect factorizations of `extent` into len(factors) factors that `keep` accepts, nearest to
    `factors` first (log distance); none when there are too many to list (over 4 factors, or an
    extent over 65536)."""
    n = len(factors)
    best: list[tuple[float, tuple[int, ...]]] = []

    def rec(prefix, rest):
        if len(prefix) == n - 1:
            cand = tuple(prefix) + (rest,)
            if keep(cand):
                best.append((sum(abs(math.log(a) - math.log(b)) for a, b in zip(cand, factors)), cand))
            return
        for d in divisors(rest):
            rec(prefix + [d], rest // d)

    if n <= 4 and extent <= 1 << 16:
        rec([], extent)
    best.sort()
    return [c for _, c in best]


def _nest_of(sch, rv):
    """The chain of loops from the root down to this loop (as For nodes)."""
    sref = sch.get_sref(rv)
    chain = []
    while sref is not None and sref.stmt is not None:
        chain.append(sref.stmt)
        sref = sref.parent
    return chain


def _stages_under(sch, env, rv) -> list[str]:
    loop = sch.get(rv)
    return [stage_name_of(sch, env, r.block) for r, _ in tir.block_realizes(loop)]


def _check_same_nest(sch, env, loops, refs, prim):
    """All loops must lie on one path from the root (one stage's nest)."""
    chains = [_nest_of(sch, rv) for rv in loops]
    for i in range(len(loops)):
        for j in range(i + 1, len(loops)):
            a, b = sch.get(loops[i]), sch.get(loops[j])
            if not (any(x.same_as(b) for x in chains[i]) or any(x.same_as(a) for x in chains[j])):
                sa, sb = _stages_under(sch, env, loops[i]), _stages_under(sch, env, loops[j])
                raise StmtError(error(
                    "TS307", f"{prim} of loops from different stages: {_ref_text(refs[i])} is a loop of "
                             f"{one_of(sa)} but {_ref_text(refs[j])} of {one_of(sb)}", refs[j].span))


def _check_not_reduction(sch, env, rv, ref, prim):
    loop = sch.get(rv)
    for realize, _ in tir.block_realizes(loop):
        for iv, value in zip(realize.block.iter_vars, realize.iter_values):
            if int(iv.iter_type) == 2 and tir.uses_var(value, loop.loop_var):  # CommReduce
                stage = stage_name_of(sch, env, realize.block)
                raise StmtError(error(
                    "TS308", f"cannot {prim} {_ref_text(ref)}: it is a reduction loop of {stage}; only spatial "
                             f"loops can be {'parallelized' if prim == 'parallel' else 'vectorized'} "
                             f"(use rfactor to split a reduction first)", ref.span))


def _buffer_index(sch, srv, arg, which: str, stmt) -> int:
    block = sch.get(srv)
    regions = list(getattr(block, which))
    names = [r.source.name for r in regions]
    if isinstance(arg, A.Const):
        idx = arg.value
        if not 0 <= idx < len(regions):
            raise StmtError(error("TS313", f"{stmt.prim}: stage {block.name_hint} {which[:-1]}s {len(regions)} "
                                           f"buffer(s) ({', '.join(names)}); index {idx} is out of range",
                                  arg.span, [str(i) for i in range(len(regions))]))
        return idx
    name = arg.parts[0]
    if name in names:
        return names.index(name)
    raise StmtError(error("TS313", f"{stmt.prim}: stage {block.name_hint} {which[:-1]}s no buffer '{name}'; it "
                                   f"{which[:-1]}s {one_of(names)}", arg.span, names))


def _compute_at(sch, env, prim, srv, lrv, v, stmt):
    from tvm import s_tir
    kwargs = dict(preserve_unit_loops=_val(v["preserve_unit_loops"]), index=_val(v["index"]))
    try:
        return getattr(sch, prim)(srv, lrv, **kwargs)
    except s_tir.ScheduleError as e:
        reason = condense_tvm_error(str(e))
    legal = legal_compute_at_sites(sch, env, prim, srv)
    stage = stage_name_of(sch, env, sch.get(srv))
    where = f"; legal locations: {', '.join(legal)}" if legal else "; this stage has no legal location"
    raise StmtError(error("TS309", f"cannot {prim}({stage}, {_ref_text(v['loop'])}): {reason}{where}",
                          v["loop"].span, legal))


def legal_compute_at_sites(sch, env, prim, srv) -> list[str]:
    """Every loop where compute_at (or reverse_compute_at) of this stage succeeds, tried on copies."""
    from tvm import s_tir
    stage_block = sch.get(srv)
    legal = []
    for realize, _ in tir.block_realizes(sch.mod["main"].body):
        if realize.block.same_as(stage_block):
            continue
        other = sch.get_sblock(realize.block.name_hint)
        for display, lrv in loop_names(sch, env, other, stage_name_of(sch, env, realize.block)):
            if display in legal:
                continue
            trial = sch.copy()
            try:
                getattr(trial, prim)(srv, lrv)
                legal.append(display)
            except (s_tir.ScheduleError, Exception):
                pass
    return legal
