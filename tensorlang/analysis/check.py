"""Names, shapes and types: AST -> checked model + diagnostics. No TVM here.

Rules (docs/language.md has the user-facing version):
- A stage's spatial loops are its left-hand side's indices, in order; its reduction loops
  are the indices that appear only on the right, in order of first appearance.
- An index's extent comes from a bare occurrence as a subscript (`X[i, k]` gives i and k the
  extents of X's dimensions) or from the written tensor's declared shape. An index that only
  occurs inside expressions (`h - 1`) needs such a source.
- Literals and index variables are weakly typed: they take the type of what they meet.
"""
from __future__ import annotations

from difflib import get_close_matches

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.model import FUNCTIONS, REDUCERS, Index, ModuleModel, OpModel, StageModel, \
    TargetModel, Tensor
from tensorlang.analysis.primitives import match_args
from tensorlang.analysis.targets import BUILTIN_TARGETS, PARAMS
from tensorlang.diagnostics import Diagnostic, error, one_of, warning
from tensorlang.parser import ast as A


def check_module(module: A.Module) -> tuple[ModuleModel, list[Diagnostic]]:
    model = ModuleModel(module)
    diags: list[Diagnostic] = []
    seen: dict[tuple[str, str], A.Span] = {}
    broken: set[str] = set(module.unparsed)  # declarations with errors: their uses are not reported again

    def define(kind: str, name: str, span: A.Span) -> bool:
        if (kind, name) in seen:
            first = seen[(kind, name)]
            diags.append(error("TS101", f"{kind} '{name}' is already defined at line {first.line}", span))
            return False
        seen[(kind, name)] = span
        return True

    for item in module.items:
        if isinstance(item, A.Target) and define("target", item.name, item.name_span):
            t, d = check_target(item)
            diags += d
            if t:
                model.targets[item.name] = t
            else:
                broken.add(item.name)
        elif isinstance(item, A.Op) and define("op", item.name, item.name_span):
            op, d = check_op(item)
            diags += d
            if op:
                model.ops[item.name] = op
    for name, (kind, params) in BUILTIN_TARGETS.items():
        model.targets.setdefault(name, TargetModel(name, kind, dict(params), builtin=True))

    op_names = {o.name for o in module.ops}
    pairs: dict[tuple[str, str], A.Span] = {}
    for sched in module.schedules:
        ok = True
        if sched.op in broken or sched.target in broken:
            continue  # its op or target has a syntax error, reported already
        if sched.op not in op_names:
            diags.append(error("TS106", f"schedule for unknown operator '{sched.op}'; operators: "
                                        f"{one_of(sorted(op_names))}", sched.op_span, _close(sched.op, op_names)))
            ok = False
        if sched.target not in model.targets:
            declared = sorted(model.targets)
            diags.append(error("TS107", f"unknown target '{sched.target}'; targets: {one_of(declared)}",
                               sched.target_span, _close(sched.target, declared)))
            ok = False
        key = (sched.op, sched.target)
        if key in pairs:
            diags.append(error("TS111", f"operator '{sched.op}' already has a schedule on '{sched.target}' "
                                        f"(line {pairs[key].line})", sched.span))
            ok = False
        pairs.setdefault(key, sched.span)
        for stmt in sched.stmts:
            _, d = match_args(stmt)
            diags += d
            ok = ok and not any(x.severity == "error" for x in d)
        if ok and sched.op in model.ops:
            model.schedules.append(sched)
    return model, diags


def _close(name, candidates):
    return get_close_matches(name, list(candidates), n=3, cutoff=0.5)


# ------------------------------------------------------------------ targets
def check_target(t: A.Target) -> tuple[TargetModel | None, list[Diagnostic]]:
    if t.kind not in PARAMS:
        return None, [error("TS102", f"unknown target kind '{t.kind}'; expected {one_of(sorted(PARAMS))}",
                            t.kind_span, sorted(PARAMS))]
    diags, params = [], {}
    allowed = PARAMS[t.kind]
    for kw in t.params:
        if kw.name not in allowed:
            diags.append(error("TS103", f"{t.kind} targets take no parameter '{kw.name}'; parameters: "
                                        f"{one_of(sorted(allowed))}", kw.span, _close(kw.name, allowed)))
            continue
        typ, _ = allowed[kw.name]
        value = kw.value.value
        if typ is int and kw.value.kind != "int" or typ is str and kw.value.kind != "str":
            diags.append(error("TS103", f"target parameter '{kw.name}' must be "
                                        f"{'an integer' if typ is int else 'a string'}", kw.value.span))
            continue
        if typ is int and value <= 0:
            diags.append(error("TS103", f"target parameter '{kw.name}' must be positive", kw.value.span))
            continue
        params[kw.name] = value
    if t.kind == "cuda" and "arch" in params and not str(params["arch"]).startswith("sm_"):
        arch = next(kw for kw in t.params if kw.name == "arch")
        diags.append(error("TS103", f"cuda arch must look like sm_90, not '{params['arch']}'", arch.value.span))
    return TargetModel(t.name, t.kind, params, t.span), diags


# ---------------------------------------------------------------- operators
def check_op(op: A.Op) -> tuple[OpModel | None, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    for dec in op.decorators:
        if dec.name != "auto":
            diags.append(error("TS110", f"unknown decorator '@{dec.name}'; known: @auto", dec.span))
        elif dec.params:
            diags.append(error("TS110", "@auto takes no parameters (the policy is chosen with --policy)", dec.span))
    tensors: dict[str, Tensor] = {}
    declared: dict[str, A.TensorParam] = {}

    def add(p: A.TensorParam, role: str):
        if p.type.dtype not in D.TVM_DTYPE:
            diags.append(error("TS105", f"unknown dtype '{p.type.dtype}'; expected {one_of(D.TVM_DTYPE)}",
                               p.type.span, _close(p.type.dtype, D.TVM_DTYPE)))
            return
        if any(d <= 0 for d in p.type.shape):
            diags.append(error("TS202", f"tensor '{p.name}' has a non-positive dimension", p.type.span))
            return
        if any(d >= 2 ** 31 for d in p.type.shape):
            diags.append(error("TS202", f"tensor '{p.name}' has a dimension of 2**31 or more", p.type.span))
            return
        if p.name in tensors or p.name in declared:
            diags.append(error("TS101", f"tensor '{p.name}' is already declared", p.name_span))
            return
        if role == "intermediate":
            declared[p.name] = p
        else:
            tensors[p.name] = Tensor(p.name, p.type.dtype, p.type.shape, role, p.name_span)

    for p in op.inputs:
        add(p, "input")
    for p in op.outputs:
        add(p, "output")
    for p in op.declarations:
        add(p, "intermediate")
    if any(d.severity == "error" for d in diags):
        return None, diags

    computed: set[str] = {p.name for p in op.inputs}
    failed: set[str] = set()  # stages with errors: reads of them are not reported again
    stages: list[StageModel] = []
    ok = True
    for n, st in enumerate(op.stages):
        later = {s.tensor for s in op.stages[n + 1:]}
        sm, d = _check_stage(st, tensors, declared, computed, failed, later)
        diags += d
        if sm is None:
            ok = False
            # Keep going: later stages still get checked against what is known.
            failed.add(st.tensor)
            computed.add(st.tensor)
            continue
        stages.append(sm)
        computed.add(st.tensor)
    for p in op.outputs:
        if p.name not in computed:
            diags.append(error("TS209", f"output '{p.name}' is never computed", p.name_span))
            ok = False
    for name, p in declared.items():
        if name not in computed:
            diags.append(warning("TS212", f"'{name}' is declared but never computed", p.name_span))
    if not op.stages:
        return None, diags
    if not ok or any(d.severity == "error" for d in diags):
        return None, diags
    live = live_stages(op)
    for sm in stages:
        if sm.tensor not in live:
            diags.append(warning("TS216", f"'{sm.tensor}' is computed but nothing reads it: the kernel leaves it out "
                                          f"(a schedule cannot name it)", sm.ast.name_span))
    return OpModel(op, tensors, tuple(sm for sm in stages if sm.tensor in live)), diags


def live_stages(op: A.Op) -> set[str]:
    """The stages an output depends on. TVM builds only those (te.create_prim_func walks back from the
    outputs), so the checked model keeps only those: a schedule naming another would name no block."""
    needed = {p.name for p in op.outputs}
    live: set[str] = set()
    for st in reversed(op.stages):
        if st.tensor in needed:
            live.add(st.tensor)
            needed |= A.tensors_read(st.rhs)
    return live


class _StageChecker:
    def __init__(self, st: A.Stage, tensors: dict[str, Tensor], declared: dict[str, A.TensorParam],
                 computed: set[str], failed: set[str], later: set[str]):
        self.st, self.tensors, self.declared, self.computed = st, tensors, declared, computed
        self.failed, self.later = failed, later
        self.diags: list[Diagnostic] = []
        # index name -> list of (extent, where, span)
        self.extent_sources: dict[str, list[tuple[int, str, A.Span]]] = {}
        self.first_use: dict[str, A.Span] = {}
        self.order: list[str] = []  # indices in order of first appearance on the right

    def err(self, code, msg, span, alts=()):
        # code "" marks the stage as failed without reporting (a tensor it reads had an error already)
        self.diags.append(error(code, msg, span, alts))

    @property
    def reported(self):
        return [d for d in self.diags if d.code]


def _check_stage(st: A.Stage, tensors, declared, computed, failed=frozenset(), later=frozenset()):
    c = _StageChecker(st, tensors, declared, computed, failed, later)
    # --- left-hand side
    if st.tensor in computed and st.tensor not in failed:
        what = "an input" if tensors.get(st.tensor) and tensors[st.tensor].role == "input" else "already computed"
        c.err("TS208", f"'{st.tensor}' is {what}; each tensor is written by one stage", st.name_span)
        return None, c.reported
    lhs_names = []
    for idx in st.indices:
        e = A.strip_parens(idx)
        if not isinstance(e, A.Var):
            c.err("TS213", "left-hand side subscripts must be index names, e.g. T[i, j]", idx.span)
            return None, c.reported
        if e.name in lhs_names:
            c.err("TS213", f"index '{e.name}' appears twice on the left-hand side", idx.span)
            return None, c.reported
        if e.name in tensors or e.name in declared:
            c.err("TS213", f"'{e.name}' is a tensor, not an index name", idx.span)
            return None, c.reported
        lhs_names.append(e.name)
    target_shape = None
    if st.tensor in tensors:
        target_shape, where = tensors[st.tensor].shape, st.tensor
    elif st.tensor in declared:
        target_shape, where = declared[st.tensor].type.shape, st.tensor
    if target_shape is not None:
        if len(target_shape) != len(st.indices):
            c.err("TS201", f"'{st.tensor}' has {_n(len(target_shape), 'dimension')}; "
                           f"{_n(len(st.indices), 'subscript')} given", st.name_span)
            return None, c.reported
        for pos, (name, idx) in enumerate(zip(lhs_names, st.indices)):
            c.extent_sources.setdefault(name, []).append((target_shape[pos], f"{where}'s dimension {pos}", idx.span))
    # --- right-hand side: collect index uses and extents
    _walk_indices(c, st.rhs, in_subscript=False)
    if c.diags:
        return None, c.reported
    extents: dict[str, int] = {}
    for name in lhs_names + [n for n in c.order if n not in lhs_names]:
        sources = c.extent_sources.get(name, [])
        if not sources:
            span = c.first_use.get(name, st.span)
            if name in lhs_names and not any(name == n for n in c.order):
                msg = (f"extent of index '{name}' cannot be inferred: it does not occur on the right-hand side; "
                       f"declare the shape of '{st.tensor}', e.g. `{st.tensor}: f32[...]`")
            else:
                hint = (f"declare the shape of '{st.tensor}', e.g. `{st.tensor}: f32[...]`" if name in lhs_names
                        else f"use '{name}' as a bare subscript somewhere")
                msg = (f"extent of index '{name}' cannot be inferred: it only occurs inside expressions; {hint}")
            c.err("TS206", msg, span)
            continue
        ext, where, _ = sources[0]
        for other, owhere, ospan in sources[1:]:
            if other != ext:
                c.err("TS202", f"shape mismatch: index '{name}' has extent {ext} from {where} but {other} "
                               f"from {owhere}", ospan)
        extents[name] = ext
    if c.diags:
        return None, c.reported
    reduce_names = [n for n in c.order if n not in lhs_names]
    reducer = REDUCERS[st.op]
    if reducer is None and reduce_names:
        name = reduce_names[0]
        c.err("TS205", f"index '{name}' occurs only on the right of a plain '=' stage; a reduction needs "
                       f"'+=', 'max=' or 'min=' (or add '{name}' to the left-hand side)", c.first_use[name],
              [f"{st.tensor}[...] += ...", f"{st.tensor}[...] max= ...", f"{st.tensor}[...] min= ..."])
        return None, c.reported
    if reducer is not None and not reduce_names:
        c.err("TS204", f"'{st.op}' needs a reduction index (one that occurs only on the right); this stage is "
                       f"elementwise: use '='", st.op_span, ["="])
        return None, c.reported
    # --- bounds of subscripts
    _check_bounds(c, st.rhs, extents, guarded=False)
    # --- types
    env = _TypeEnv(tensors, extents)
    rhs_type = _type_of(c, st.rhs, env)
    if c.diags:
        return None, c.reported
    if st.tensor in tensors:
        dtype = tensors[st.tensor].dtype
    elif st.tensor in declared:
        dtype = declared[st.tensor].type.dtype
    else:
        dtype = D.concrete(rhs_type)
    if rhs_type not in (D.WEAK_INT, D.WEAK_FLOAT, D.INDEX) and rhs_type != dtype:
        c.err("TS210", f"'{st.tensor}' is {dtype} but the right-hand side is {rhs_type}; convert it with "
                       f"{dtype}(...)", st.rhs.span, [f"{dtype}(...)"])
        return None, c.reported
    if rhs_type == D.WEAK_FLOAT and dtype not in D.FLOATS:
        c.err("TS210", f"'{st.tensor}' is {dtype} but the right-hand side is a floating-point value; convert it "
                       f"with {dtype}(...)", st.rhs.span, [f"{dtype}(...)"])
        return None, c.reported
    shape = tuple(extents[n] for n in lhs_names)
    if st.tensor not in tensors:
        tensors[st.tensor] = Tensor(st.tensor, dtype, shape, "intermediate", st.name_span)
    spatial = tuple(Index(n, extents[n], "spatial") for n in lhs_names)
    reduce = tuple(Index(n, extents[n], "reduce") for n in reduce_names)
    flops = _count_flops(st.rhs) + (1 if reducer else 0)
    return StageModel(st, st.tensor, spatial, reduce, reducer, dtype, max(flops, 1)), c.reported


def _walk_indices(c: _StageChecker, e: A.Expr, in_subscript: bool):
    if isinstance(e, A.Var):
        if e.name in c.tensors or e.name in c.declared:
            c.err("TS211", f"tensor '{e.name}' used without subscripts", e.span)
            return
        if e.name not in c.first_use:
            c.first_use[e.name] = e.span
            c.order.append(e.name)
        return
    if isinstance(e, A.Access):
        t = _tensor_shape(c, e)
        for pos, idx in enumerate(e.indices):
            bare = A.strip_parens(idx)
            if isinstance(bare, A.Var) and t is not None and pos < len(t[0]):
                c.extent_sources.setdefault(bare.name, []).append((t[0][pos], f"{e.tensor}'s dimension {pos}", idx.span))
            _walk_indices(c, idx, in_subscript=True)
        return
    if isinstance(e, A.Call):
        if e.func not in FUNCTIONS and e.func not in D.TVM_DTYPE:
            known = sorted(FUNCTIONS) + sorted(D.TVM_DTYPE)
            c.err("TS108", f"unknown function '{e.func}'; functions: {', '.join(sorted(FUNCTIONS))}; casts: "
                           f"{', '.join(D.TVM_DTYPE)}", e.name_span, _close(e.func, known))
        else:
            want = FUNCTIONS.get(e.func, 1)
            if len(e.args) != want:
                c.err("TS109", f"{e.func} takes {want} argument{'s' if want > 1 else ''}; {len(e.args)} given",
                      e.span)
    for child in _children(e):
        _walk_indices(c, child, in_subscript)


def _tensor_shape(c: _StageChecker, e: A.Access):
    if e.tensor == c.st.tensor:
        c.err("TS207", f"stage '{e.tensor}' reads its own output; write the reduction with '+=', 'max=' or 'min='",
              e.name_span)
        return None
    if e.tensor in c.failed:
        c.err("", "", e.span)  # marks the stage as failed without a second report (filtered below)
        return None
    if e.tensor in c.later and e.tensor not in c.computed:
        c.err("TS207", f"'{e.tensor}' is used before the stage that computes it", e.name_span)
        return None
    if e.tensor not in c.tensors and e.tensor not in c.declared:
        known = sorted(c.tensors) + sorted(c.declared)
        c.err("TS104", f"unknown tensor '{e.tensor}'; tensors: {one_of(known)}", e.name_span,
              _close(e.tensor, known))
        return None
    if e.tensor not in c.computed:
        c.err("TS207", f"'{e.tensor}' is used before the stage that computes it", e.name_span)
        return None
    shape = c.tensors[e.tensor].shape
    if len(shape) != len(e.indices):
        c.err("TS201", f"'{e.tensor}' has {len(shape)} dimension{'s' if len(shape) != 1 else ''}; "
                       f"{len(e.indices)} subscript{'s' if len(e.indices) != 1 else ''} given", e.span)
        return None
    return (shape,)


def _children(e: A.Expr):
    if isinstance(e, (A.Access,)):
        return e.indices
    if isinstance(e, A.Call):
        return e.args
    if isinstance(e, A.BinOp):
        return (e.left, e.right)
    if isinstance(e, (A.Neg, A.Not)):
        return (e.operand,)
    if isinstance(e, A.Paren):
        return (e.expr,)
    if isinstance(e, A.Compare):
        return e.operands
    if isinstance(e, A.BoolOp):
        return e.values
    if isinstance(e, A.IfExp):
        return (e.then, e.cond, e.orelse)  # source order: `then if cond else orelse`
    return ()


# ------------------------------------------------------------------ bounds
def index_range(e: A.Expr, extents: dict[str, int]) -> tuple[int, int] | None:
    """Interval of an integer index expression over the loop extents (None if not analysable)."""
    e = A.strip_parens(e)
    if isinstance(e, A.Num):
        return None if e.is_float else (e.value, e.value)
    if isinstance(e, A.Var):
        return (0, extents[e.name] - 1) if e.name in extents else None
    if isinstance(e, A.Neg):
        r = index_range(e.operand, extents)
        return None if r is None else (-r[1], -r[0])
    if isinstance(e, A.BinOp) and e.op in "+-*":
        a, b = index_range(e.left, extents), index_range(e.right, extents)
        if a is None or b is None:
            return None
        if e.op == "+":
            return (a[0] + b[0], a[1] + b[1])
        if e.op == "-":
            return (a[0] - b[1], a[1] - b[0])
        products = [x * y for x in a for y in b]
        return (min(products), max(products))
    if isinstance(e, A.BinOp) and e.op in ("//", "%"):
        a, b = index_range(e.left, extents), index_range(e.right, extents)
        if a is None or b is None or b[0] != b[1] or b[0] <= 0 or a[0] < 0:
            return None
        if e.op == "//":
            return (a[0] // b[0], a[1] // b[0])
        return (0, min(b[0] - 1, a[1]))
    return None


def _check_bounds(c: _StageChecker, e: A.Expr, extents, guarded: bool):
    if isinstance(e, A.IfExp):
        # Accesses under a condition may be out of range where the condition excludes them.
        _check_bounds(c, e.cond, extents, guarded)
        _check_bounds(c, e.then, extents, True)
        _check_bounds(c, e.orelse, extents, True)
        return
    if isinstance(e, A.Access) and e.tensor in c.tensors:
        shape = c.tensors[e.tensor].shape
        for pos, idx in enumerate(e.indices):
            bare = A.strip_parens(idx)
            if isinstance(bare, A.Num):
                if bare.is_float:
                    c.err("TS211", "subscripts must be integers", idx.span)
                elif not 0 <= bare.value < shape[pos]:
                    c.err("TS203", f"constant index {bare.value} is out of range for {e.tensor}'s dimension {pos} "
                                   f"(extent {shape[pos]}: 0..{shape[pos] - 1})", idx.span)
                continue
            r = index_range(idx, extents)
            if r is not None and r[0] == r[1] and not _has_var(idx) and not 0 <= r[0] < shape[pos]:
                c.err("TS203", f"constant index {r[0]} is out of range for {e.tensor}'s dimension {pos} "
                               f"(extent {shape[pos]}: 0..{shape[pos] - 1})", idx.span)
                continue
            if r is not None and not guarded and (r[0] < 0 or r[1] >= shape[pos]):
                from tensorlang.parser.printer import format_expr
                c.err("TS214", f"index {format_expr(idx)} ranges over {r[0]}..{r[1]} but {e.tensor}'s dimension "
                               f"{pos} has extent {shape[pos]}; guard it with `... if cond else 0.0`", idx.span)
    for child in _children(e):
        _check_bounds(c, child, extents, guarded)


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _has_var(e: A.Expr) -> bool:
    return isinstance(e, A.Var) or any(_has_var(ch) for ch in _children(e))


# ------------------------------------------------------------------- types
class _TypeEnv:
    def __init__(self, tensors, extents):
        self.tensors, self.extents = tensors, extents


class _Silent:
    def err(self, *args, **kwargs):
        pass


def expr_type(e: A.Expr, tensors: dict[str, Tensor]) -> str:
    """The type of an expression of a checked stage, by the checker's own rules (nothing reported)."""
    return _type_of(_Silent(), e, _TypeEnv(tensors, {}))


def unify(a: str, b: str) -> str | None:
    """The type of `a op b`, or None when two strong types disagree."""
    weak = (D.WEAK_INT, D.INDEX, D.WEAK_FLOAT)
    if a == b:
        return a
    if a in weak and b in weak:
        return D.WEAK_FLOAT if D.WEAK_FLOAT in (a, b) else D.INDEX
    if a in weak:
        a, b = b, a
    if b in weak:  # a is strong
        if a == D.BOOL:
            return None
        if b == D.WEAK_FLOAT and a in D.INTS:
            return None  # 0.5 * an integer tensor: make the conversion explicit
        return a
    return None


def _type_of(c: _StageChecker, e: A.Expr, env: _TypeEnv) -> str:
    if isinstance(e, A.Num):
        return D.WEAK_FLOAT if e.is_float else D.WEAK_INT
    if isinstance(e, A.Var):
        return D.INDEX
    if isinstance(e, A.Paren):
        return _type_of(c, e.expr, env)
    if isinstance(e, A.Access):
        for idx in e.indices:
            if isinstance(A.strip_parens(idx), A.Num):
                continue  # constants are checked with the bounds
            t = _type_of(c, idx, env)
            if t not in (D.INDEX, D.WEAK_INT) and t not in D.INTS:
                c.err("TS211", f"subscripts must be integers; this one is {t}", idx.span)
        return env.tensors[e.tensor].dtype
    if isinstance(e, A.Neg):
        return _type_of(c, e.operand, env)
    if isinstance(e, A.Not):
        _expect_bool(c, e.operand, env)
        return D.BOOL
    if isinstance(e, A.BoolOp):
        for v in e.values:
            _expect_bool(c, v, env)
        return D.BOOL
    if isinstance(e, A.Compare):
        types = [_type_of(c, o, env) for o in e.operands]
        for a, b, o in zip(types, types[1:], e.operands[1:]):
            if unify(a, b) is None:
                c.err("TS210", f"cannot compare {a} with {b}", o.span)
        return D.BOOL
    if isinstance(e, A.IfExp):
        _expect_bool(c, e.cond, env)
        a, b = _type_of(c, e.then, env), _type_of(c, e.orelse, env)
        t = unify(a, b)
        if t is None:
            c.err("TS210", f"the branches of a conditional differ: {a} and {b}", e.span)
            return a
        return t
    if isinstance(e, A.BinOp):
        a, b = _type_of(c, e.left, env), _type_of(c, e.right, env)
        t = unify(a, b)
        if t is None:
            c.err("TS210", f"'{e.op}' between {a} and {b}; convert one side, e.g. {_strong(a, b)}(...)", e.span)
            return a
        if t == D.BOOL:
            c.err("TS210", "arithmetic on a condition", e.span)
        if e.op in ("//", "%") and D.is_float(t):
            c.err("TS210", f"'{e.op}' needs integers; this is {t}", e.span)
        if e.op == "**" and not D.is_float(t):
            c.err("TS210", f"'**' needs floating-point operands; this is {t}: convert one, e.g. f32(...)", e.span)
        divisor = A.strip_parens(e.right)
        if e.op in ("/", "//", "%") and isinstance(divisor, A.Num) and divisor.value == 0:
            c.err("TS215", "division by zero", e.right.span)
        return t
    if isinstance(e, A.Call):
        types = [_type_of(c, a, env) for a in e.args]
        if e.func in D.TVM_DTYPE:
            return e.func
        if e.func in ("max", "min", "pow"):
            t = unify(types[0], types[1]) if len(types) == 2 else None
            if t is None and len(types) == 2:
                c.err("TS210", f"{e.func} of {types[0]} and {types[1]}", e.span)
                return types[0]
            if e.func == "pow" and t is not None and not D.is_float(t):
                c.err("TS210", f"pow needs floating-point arguments; this is {t}: convert one, e.g. f32(...)", e.span)
            return t or types[0]
        if e.func in ("abs", "relu"):
            return types[0]
        t = types[0] if types else D.WEAK_FLOAT
        if t in D.INTS or t == D.BOOL:
            c.err("TS210", f"{e.func} needs a floating-point argument; this is {t}: convert it, e.g. f32(...)",
                  e.span)
        return D.WEAK_FLOAT if t in (D.INDEX, D.WEAK_INT) else t
    return D.WEAK_FLOAT


def _strong(a, b):
    """The dtype to suggest converting to: the operands' numeric dtype, else f32."""
    numeric = [t for t in (a, b) if t in D.TVM_DTYPE and t != D.BOOL]
    return numeric[0] if numeric else "f32"


def _expect_bool(c, e, env):
    t = _type_of(c, e, env)
    if t != D.BOOL:
        c.err("TS210", f"a condition is needed here; this is {t}", e.span)


def _count_flops(e: A.Expr) -> int:
    n = 0
    if isinstance(e, (A.BinOp, A.Call, A.Compare)) and not (isinstance(e, A.Call) and e.func in D.TVM_DTYPE):
        n = 1
    return n + sum(_count_flops(ch) for ch in _children(e) if not isinstance(e, A.Access))
