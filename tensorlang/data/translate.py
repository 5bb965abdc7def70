"""TensorIR PrimFunc -> .tsched operator (index notation), as AST nodes printed by the canonical printer.

The PrimFuncs are the ones Relax legalization and fusion produce (one task of
`meta_schedule.relax_integration.extract_tasks`): a root block allocating the intermediates,
then one loop nest per block, each block writing one buffer element. The walk:

- buffers: parameters that a block writes are the outputs, the other parameters the inputs;
  the root block's allocations are intermediates, each declared (`T: f32[...]`) right before
  the stage that computes it, so every index gets its extent.
- each block becomes one stage `T[i, j] = expr`; a block with `T.init()` whose update is
  `T[..] = T[..] + e`, `T.max(T[..], e)` or `T.min(T[..], e)` (init 0, the lowest, the highest
  value) becomes `+=`, `max=`, `min=`.
- block iteration variables become index names (`v_ax0` -> `ax0`); loads, arithmetic, casts,
  comparisons, `T.if_then_else` / `T.Select`, and the math intrinsics become the language's
  expressions.

Two rewrites keep the language's extent rules (docs/language.md, "Extents") satisfied without
changing the computation:

- a plain subscript `A[.., i, ..]` whose dimension differs from the extent of `i` (a slice,
  `A[ax3]` with ax3 over 0..7 of a 16-wide axis) is written `A[.., i + 0, ..]`: a bare subscript
  would give `i` the dimension's extent (TS202).
- a reduction index that occurs in no plain subscript (a pooling window `X[h * 2 + rh]`) has no
  extent source: the reduction is split into an elementwise window stage over the spatial and
  reduction indices (`T_win`, declared) and a reduction of that window; a note says so.

What the language cannot express (integer truncating division, bitwise integer operations,
unknown intrinsics, non-trivial block bindings, buffers written by two blocks, ...) raises
`Untranslatable` with the reason.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from tensorlang.parser import ast as A

DTYPES = {
    "float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "bool": "bool",
}
INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"}
FLOAT_DTYPES = {"float16", "bfloat16", "float32", "float64"}

# TIR intrinsic (Call op name) -> the language's function
INTRINSICS = {
    "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "tanh": "tanh", "sigmoid": "sigmoid", "erf": "erf", "fabs": "abs", "sin": "sin", "cos": "cos",
    "floor": "floor", "ceil": "ceil", "nearbyint": "round", "pow": "pow",
}
# Words the language does not reserve but that would confuse the parser's recovery or a reader.
AVOID = {"target", "op", "schedule", "on", "if", "else", "and", "or", "not", "True", "False", "None"}
MAX_WINDOW_ELEMENTS = 1 << 28


class Untranslatable(Exception):
    """The PrimFunc uses a construct the .tsched language (or this translator) does not express."""


@dataclass
class Translation:
    op: A.Op
    names: dict[str, str]  # TIR parameter / buffer name -> tensor name (for reading; TIR names may repeat)
    inputs: list[tuple[int, str]]  # (position among the PrimFunc's parameters, tensor name), signature order
    outputs: list[tuple[int, str]]
    notes: list[str] = field(default_factory=list)


def tvm_dtype_of(x) -> str:
    d = getattr(x, "dtype", None)
    if d is None:
        d = getattr(x, "ty", None)
    return str(d)


def _expr_dtype(e) -> str:
    ty = getattr(e, "ty", None)
    if ty is not None:
        s = str(ty)
        if s in DTYPES or s.startswith(("int", "uint", "float", "bfloat")) or s == "bool":
            return s
    return str(getattr(e, "dtype", ty))


def _lang_dtype(tvm_dtype: str, what: str) -> str:
    if tvm_dtype not in DTYPES:
        raise Untranslatable(f"{what} has dtype {tvm_dtype}, which the language lacks")
    return DTYPES[tvm_dtype]


def _int(x) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        v = getattr(x, "value", None)
        if v is None:
            raise Untranslatable(f"non-constant extent or shape {x}")
        return int(v)


def _shape(buf) -> tuple[int, ...]:
    return tuple(_int(d) for d in buf.shape)


def _kind(e) -> str:
    return type(e).__name__


def sanitize(name: str, taken: set[str], strip_intermediate: bool = True) -> str:
    base = name
    if strip_intermediate:
        base = base.replace("_intermediate", "")
    base = re.sub(r"[^A-Za-z0-9_]", "_", base) or "t"
    if base[0].isdigit():
        base = "t" + base
    cand = base
    n = 1
    while cand in taken or cand in AVOID:
        cand = f"{base}_{n}"
        n += 1
    taken.add(cand)
    return cand


def _float_text(value: float, dtype: str) -> str:
    """The shortest decimal that gives the same `dtype` constant (`1e-06`, not `9.999999974752427e-07`),
    unless it would exceed the dtype's range (TVM rejects such a literal); else Python's repr."""
    text = repr(value)
    if dtype in ("float32", "float16"):
        import numpy as np
        np_type = np.float32 if dtype == "float32" else np.float16
        short = str(np_type(value))
        try:
            if abs(float(short)) <= float(np.finfo(np_type).max) and np_type(float(short)) == np_type(value):
                text = short
        except (ValueError, OverflowError):
            pass
    return text if any(c in text for c in ".eE") else text + ".0"


def _num(value, dtype: str = "float64") -> A.Expr:
    """A literal: ints as written, floats with a '.' or an exponent; negatives as negation."""
    if isinstance(value, bool):
        raise Untranslatable("a boolean constant")
    if isinstance(value, int):
        return A.Neg(A.Num(str(-value))) if value < 0 else A.Num(str(value))
    if not math.isfinite(value):
        raise Untranslatable(f"the constant {value} (the language has no infinity or NaN literal)")
    text = _float_text(float(abs(value)), dtype)
    return A.Neg(A.Num(text)) if value < 0 or (value == 0 and math.copysign(1, value) < 0) else A.Num(text)


# ------------------------------------------------------------------ structure
def _walk(stmt, loops=()):
    """(block realize, enclosing loops) in order; anything but loops, sequences and blocks is refused."""
    from tvm import s_tir, tirx
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from _walk(s, loops)
    elif isinstance(stmt, tirx.For):
        if _int(stmt.min) != 0:
            raise Untranslatable("a loop that does not start at 0")
        step = getattr(stmt, "step", None)
        if step is not None and _int(step) != 1:
            raise Untranslatable("a loop with a step")
        yield from _walk(stmt.body, loops + (stmt,))
    elif isinstance(stmt, s_tir.SBlockRealize):
        yield stmt, loops
    else:
        raise Untranslatable(f"a {_kind(stmt)} statement between blocks")


def _root(func):
    from tvm import s_tir
    body = func.body
    if isinstance(body, s_tir.SBlockRealize) and body.block.name_hint == "root":
        blk = body.block
        if blk.init is not None or len(blk.match_buffers):
            raise Untranslatable("a root block with an init or matched buffers")
        return list(blk.alloc_buffers), blk.body
    return [], body


@dataclass
class _Block:
    name: str
    buffer: object  # the buffer written
    store_indices: list
    value: object  # the stored value (for a reduction: the combined operand e)
    reducer: str | None
    iter_vars: list  # (var, extent, kind) kind "S" | "R"
    zero_vars: list  # spatial iteration variables of extent 1 absent from the store: read as 0


def _is_load_of(e, buf, indices) -> bool:
    if _kind(e) != "TensorLoad" or not e.source.same_as(buf) or len(e.indices) != len(indices):
        return False
    return all(x.same_as(y) for x, y in zip(e.indices, indices))


def _const_value(e):
    k = _kind(e)
    if k in ("FloatImm", "IntImm"):
        return e.value
    if k == "Cast":
        return _const_value(e.value)
    return None


def _analyse_block(realize, loops) -> _Block:
    from tvm import tirx
    blk = realize.block
    name = blk.name_hint
    pred = realize.predicate
    if _const_value(pred) != 1:
        raise Untranslatable(f"block {name} has a predicate ({pred})")
    if len(blk.alloc_buffers) or len(blk.match_buffers):
        raise Untranslatable(f"block {name} allocates or matches buffers")
    iters, bound_loops = [], []
    for iv, value in zip(blk.iter_vars, realize.iter_values):
        extent = _int(iv.dom.extent)
        if _int(iv.dom.min) != 0:
            raise Untranslatable(f"block {name}: an iteration variable that does not start at 0")
        t = int(iv.iter_type)
        if t not in (0, 2):
            raise Untranslatable(f"block {name}: an iteration variable of kind {t} (only spatial and reduction)")
        loop = next((lp for lp in loops if lp.loop_var.same_as(value)), None)
        if loop is not None:
            if _int(loop.extent) != extent:
                raise Untranslatable(f"block {name}: loop extent {_int(loop.extent)} differs from its "
                                     f"iteration variable's {extent}")
            if any(lp.same_as(loop) for lp in bound_loops):
                raise Untranslatable(f"block {name}: one loop binds two iteration variables")
            bound_loops.append(loop)
        elif not (_const_value(value) == 0 and extent == 1):
            raise Untranslatable(f"block {name}: iteration variable bound to {value} (not a loop variable)")
        iters.append((iv.var, extent, "S" if t == 0 else "R"))
    for lp in loops:
        if not any(lp.same_as(b) for b in bound_loops) and _int(lp.extent) != 1:
            raise Untranslatable(f"block {name}: loop {lp.loop_var} of extent {_int(lp.extent)} binds no "
                                 f"iteration variable (the block would run repeatedly)")
    body = blk.body
    if not isinstance(body, tirx.BufferStore):
        raise Untranslatable(f"block {name}: its body is a {_kind(body)}, not one buffer store")
    buf, indices = body.buffer, list(body.indices)
    value = body.value
    reducer = None
    if blk.init is not None:
        init = blk.init
        if not isinstance(init, tirx.BufferStore) or not init.buffer.same_as(buf) or \
                not all(x.same_as(y) for x, y in zip(init.indices, indices)):
            raise Untranslatable(f"block {name}: an init that does not store the reduction's element")
        start = _const_value(init.value)
        if start is None:
            raise Untranslatable(f"block {name}: a reduction starting from a non-constant value")
        dtype = tvm_dtype_of(buf)
        k = _kind(value)
        operand = None
        if k == "Add":
            if _is_load_of(value.a, buf, indices):
                operand = value.b
            elif _is_load_of(value.b, buf, indices):
                operand = value.a
            reducer = "sum"
        elif k in ("Max", "Min"):
            if _is_load_of(value.a, buf, indices):
                operand = value.b
            elif _is_load_of(value.b, buf, indices):
                operand = value.a
            reducer = k.lower()
        if operand is None:
            raise Untranslatable(f"block {name}: a reduction update that is not sum, max or min of the element")
        if not _identity_ok(reducer, start, dtype):
            raise Untranslatable(f"block {name}: a {reducer} reduction starting from {start}, not its identity")
        value = operand
    if reducer is None and any(kind == "R" for _, _, kind in iters):
        raise Untranslatable(f"block {name}: reduction iteration variables without an init")
    if reducer is not None and not any(kind == "R" for _, _, kind in iters):
        raise Untranslatable(f"block {name}: an init without reduction iteration variables")
    if _reads_buffer(value, buf):
        raise Untranslatable(f"block {name}: reads the buffer it writes")
    # The store must be T[v0, v1, ...]: distinct spatial iteration variables, all of them (or extent 1).
    spatial = [(v, e) for v, e, kind in iters if kind == "S"]
    seen = []
    for x in indices:
        match = next((v for v, _ in spatial if v.same_as(x)), None)
        if match is None:
            raise Untranslatable(f"block {name}: stores to {buf.name}[{', '.join(str(i) for i in indices)}] "
                                 f"(the language's left-hand sides are distinct index names)")
        if any(match.same_as(s) for s in seen):
            raise Untranslatable(f"block {name}: an index stored twice")
        seen.append(match)
    zero = []
    for v, e in spatial:
        if not any(v.same_as(s) for s in seen):
            if e != 1:
                raise Untranslatable(f"block {name}: spatial variable {v} of extent {e} is not stored")
            zero.append(v)
    shape = _shape(buf)
    for pos, x in enumerate(seen):
        ext = next(e for v, e in spatial if v.same_as(x))
        if ext != shape[pos]:
            raise Untranslatable(f"block {name}: writes {buf.name}'s dimension {pos} ({shape[pos]}) over "
                                 f"{ext} points only")
    return _Block(name, buf, seen, value, reducer, iters, zero)


def _identity_ok(reducer: str, start, dtype: str) -> bool:
    """Whether a reduction's init is its identity: 0 for sum; the lowest (highest) value, or -inf (+inf), for
    max (min) -- what `max=` and `min=` start from."""
    if reducer == "sum":
        return start == 0
    import numpy as np
    if dtype in FLOAT_DTYPES:
        import ml_dtypes
        info = ml_dtypes.finfo(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.finfo(np.dtype(dtype))
        lowest, highest = float(info.min), float(info.max)
        if reducer == "max":
            return start == -math.inf or math.isclose(start, lowest, rel_tol=1e-6)
        return start == math.inf or math.isclose(start, highest, rel_tol=1e-6)
    if dtype in INT_DTYPES:
        info = np.iinfo(np.dtype(dtype))
        return start == (info.min if reducer == "max" else info.max)
    return False


def _reads_buffer(e, buf) -> bool:
    found = []

    def visit(x):
        if _kind(x) == "TensorLoad" and x.source.same_as(buf):
            found.append(x)
        for c in _expr_children(x):
            visit(c)
    visit(e)
    return bool(found)


def _expr_children(e):
    k = _kind(e)
    if k == "TensorLoad":
        return list(e.indices)
    if k == "Call":
        return list(e.args)
    if k == "Select":
        return [e.condition, e.true_value, e.false_value]
    if k in ("Cast", "Not"):
        return [e.value if k == "Cast" else e.a]
    if hasattr(e, "a") and hasattr(e, "b"):
        return [e.a, e.b]
    return []


# ------------------------------------------------------------------ expressions
class _ExprTranslator:
    def __init__(self, block: _Block, index_names: dict, tensor_names: dict, shapes: dict):
        self.block = block
        self.index_names = index_names  # list of (var, name, extent)
        self.tensor_names = tensor_names  # buffer (by same_as) lookup: list of (buf, name)
        self.shapes = shapes
        self.bare: dict[str, bool] = {}  # index name -> has a plain subscript of matching extent
        self.notes: set[str] = set()

    def index_of(self, var):
        for v, name, extent in self.index_names:
            if v.same_as(var):
                return name, extent
        return None

    def tensor_of(self, buf) -> str:
        for b, name in self.tensor_names:
            if b.same_as(buf):
                return name
        raise Untranslatable(f"block {self.block.name}: reads buffer {buf.name}, which is neither a parameter nor "
                             f"allocated in the root block")

    def expr(self, e, index_ctx: bool = False) -> A.Expr:
        k = _kind(e)
        if k == "Var":
            if any(e.same_as(z) for z in self.block.zero_vars):
                return A.Num("0")
            found = self.index_of(e)
            if found is None:
                raise Untranslatable(f"block {self.block.name}: variable {e} is no iteration variable")
            return A.Var(found[0])
        if k == "IntImm":
            if _expr_dtype(e) == "bool":
                return A.Compare((A.Num("0"), A.Num("0")), ("==" if e.value else "!=",))
            return _num(int(e.value))
        if k == "FloatImm":
            return _num(float(e.value), _expr_dtype(e))
        if k == "TensorLoad":
            return self.load(e)
        if k in ("Add", "Sub", "Mul"):
            op = {"Add": "+", "Sub": "-", "Mul": "*"}[k]
            return A.BinOp(op, self.expr(e.a, index_ctx), self.expr(e.b, index_ctx))
        if k == "Div":
            if _expr_dtype(e) in FLOAT_DTYPES:
                return A.BinOp("/", self.expr(e.a, index_ctx), self.expr(e.b, index_ctx))
            raise Untranslatable(f"block {self.block.name}: truncating integer division (the language's "
                                 f"integer division floors)")
        if k == "FloorDiv":
            if _expr_dtype(e) in FLOAT_DTYPES:
                return A.Call("floor", (A.BinOp("/", self.expr(e.a), self.expr(e.b)),))
            return A.BinOp("//", self.expr(e.a, index_ctx), self.expr(e.b, index_ctx))
        if k == "FloorMod":
            if _expr_dtype(e) in FLOAT_DTYPES:
                raise Untranslatable(f"block {self.block.name}: a floating-point modulo")
            return A.BinOp("%", self.expr(e.a, index_ctx), self.expr(e.b, index_ctx))
        if k in ("Mod",):
            raise Untranslatable(f"block {self.block.name}: truncating integer modulo")
        if k in ("Min", "Max"):
            return A.Call(k.lower(), (self.expr(e.a, index_ctx), self.expr(e.b, index_ctx)))
        if k in ("EQ", "NE", "LT", "LE", "GT", "GE"):
            op = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}[k]
            ints = _expr_dtype(e.a) in INT_DTYPES
            a, b = self.expr(e.a, ints), self.expr(e.b, ints)
            if _expr_dtype(e.a) == "bool":
                # TVM's LLVM backend emits a float compare for bool == bool (and fails): compare as i8
                a, b = A.Call("i8", (a,)), A.Call("i8", (b,))
                self.notes.add("a comparison of two bool values is written on i8 conversions (TVM's LLVM "
                               "backend cannot compile bool == bool)")
            return A.Compare((a, b), (op,))
        if k in ("And", "Or", "BitwiseAnd", "BitwiseOr"):
            if k.startswith("Bitwise") and _expr_dtype(e) != "bool":
                raise Untranslatable(f"block {self.block.name}: a bitwise operation on {_expr_dtype(e)} values")
            word = "and" if k.endswith("And") else "or"
            values = []
            for side in (e.a, e.b):
                x = self.expr(side)
                if isinstance(x, A.BoolOp) and x.op == word:
                    values.extend(x.values)
                else:
                    values.append(x)
            if word == "and":
                values = _chain(values)
            return values[0] if len(values) == 1 else A.BoolOp(word, tuple(values))
        if k == "Not":
            return A.Not(self.expr(e.a))
        if k == "Select":
            return A.IfExp(self.expr(e.true_value), self.expr(e.condition), self.expr(e.false_value))
        if k == "Cast":
            return self.cast(e, index_ctx)
        if k == "Call":
            return self.call(e, index_ctx)
        raise Untranslatable(f"block {self.block.name}: the expression {k} ({str(e)[:80]})")

    def cast(self, e, index_ctx: bool) -> A.Expr:
        to, frm = _expr_dtype(e), _expr_dtype(e.value)
        inner = self.expr(e.value, index_ctx)
        if to == frm:
            return inner
        if to in INT_DTYPES and frm in INT_DTYPES and index_ctx and _is_index_only(e.value):
            return inner  # index arithmetic: indices and integer literals are weak, of no fixed width
        if to not in DTYPES:
            raise Untranslatable(f"block {self.block.name}: a cast to {to}")
        return A.Call(DTYPES[to], (inner,))

    def call(self, e, index_ctx: bool) -> A.Expr:
        name = str(e.op.name)
        short = name.split(".", 1)[1] if "." in name else name
        args = list(e.args)
        if short == "if_then_else":
            return A.IfExp(self.expr(args[1], index_ctx), self.expr(args[0]), self.expr(args[2], index_ctx))
        if short == "likely":
            return self.expr(args[0], index_ctx)
        if short in INTRINSICS:
            return A.Call(INTRINSICS[short], tuple(self.expr(a) for a in args))
        raise Untranslatable(f"block {self.block.name}: the intrinsic {name}")

    def load(self, e) -> A.Expr:
        buf = e.source
        name = self.tensor_of(buf)
        shape = self.shapes[name]
        subs = []
        for pos, x in enumerate(e.indices):
            sub = self.expr(x, index_ctx=True)
            if isinstance(sub, A.Var):
                extent = self.index_of(x)[1]
                if extent != shape[pos]:
                    sub = A.BinOp("+", sub, A.Num("0"))  # not bare: its extent is not this dimension's
                else:
                    self.bare[sub.name] = True
            subs.append(sub)
        return A.Access(name, tuple(subs))


def _chain(values: list) -> list:
    """`a <= x and x < b` -> `a <= x < b` (the language's comparison chains mean the same)."""
    out: list = []
    for v in values:
        prev = out[-1] if out else None
        if isinstance(prev, A.Compare) and isinstance(v, A.Compare) and prev.operands[-1] == v.operands[0]:
            out[-1] = A.Compare(prev.operands + v.operands[1:], prev.ops + v.ops)
        else:
            out.append(v)
    return out


def _is_index_only(e) -> bool:
    k = _kind(e)
    if k == "TensorLoad":
        return False
    return all(_is_index_only(c) for c in _expr_children(e))


# ------------------------------------------------------------------ the op
def translate(func, op_name: str) -> Translation:
    """Translate a PrimFunc into one `op`. Raises Untranslatable with the reason."""
    allocs, body = _root(func)
    blocks = [_analyse_block(r, loops) for r, loops in _walk(body)]
    if not blocks:
        raise Untranslatable("no blocks")

    taken: set[str] = set()
    op_name = sanitize(op_name, set(), strip_intermediate=False)
    params = list(func.params)
    for p in params:
        if not hasattr(p, "shape"):
            raise Untranslatable(f"parameter {p} is not a buffer")
    written = []
    for b in blocks:
        if any(b.buffer.same_as(w) for w in written):
            raise Untranslatable(f"buffer {b.buffer.name} is written by two blocks")
        written.append(b.buffer)

    def is_written(buf):
        return any(buf.same_as(w) for w in written)

    tensor_names: list = []  # (buffer, name)
    names: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}

    def add(buf, what):
        shape = _shape(buf)
        if any(d <= 0 or d >= 2 ** 31 for d in shape):
            raise Untranslatable(f"{what} {buf.name} has shape {shape}")
        nm = sanitize(buf.name, taken)
        tensor_names.append((buf, nm))
        names.setdefault(buf.name, nm)
        shapes[nm] = shape
        dtypes[nm] = _lang_dtype(tvm_dtype_of(buf), f"{what} {buf.name}")
        return nm

    inputs, outputs = [], []
    for p in params:
        (outputs if is_written(p) else inputs).append(p)
    for p in inputs:
        add(p, "input")
    for p in outputs:
        add(p, "output")
    for buf in allocs:
        if is_written(buf):
            add(buf, "intermediate")
    for b in blocks:
        if not any(b.buffer.same_as(t) for t, _ in tensor_names):
            raise Untranslatable(f"block {b.name} writes {b.buffer.name}, which is neither a parameter nor "
                                 f"allocated in the root block")
    # Reads before writes: a stage may only read inputs and tensors computed earlier.
    done = [p for p in inputs]
    for b in blocks:
        for load in _loads(b.value):
            if not any(load.source.same_as(d) for d in done):
                raise Untranslatable(f"block {b.name} reads {load.source.name} before a block writes it")
        done.append(b.buffer)

    index_pool = taken  # index names must not be tensor names
    index_names_used: set[str] = set()  # nor may a window tensor be named like an index
    body_items: list = []
    notes: list[str] = []
    alloc_names = {nm for t, nm in tensor_names if any(t.same_as(a) for a in allocs)}
    for b in blocks:
        stage_taken = set(index_pool)
        idx = []
        for var, extent, kind in b.iter_vars:
            if any(var.same_as(z) for z in b.zero_vars):
                continue
            raw = str(var.name) if hasattr(var, "name") else str(var)
            raw = raw[2:] if raw.startswith("v_") and len(raw) > 2 else raw
            nm = sanitize(raw, stage_taken, strip_intermediate=False)
            index_names_used.add(nm)
            idx.append((var, nm, extent))
        tx = _ExprTranslator(b, idx, tensor_names, shapes)
        rhs = tx.expr(b.value)
        notes.extend(n for n in sorted(tx.notes) if n not in notes)
        tensor = next(nm for t, nm in tensor_names if t.same_as(b.buffer))
        lhs = tuple(A.Var(tx.index_of(v)[0]) for v in b.store_indices)
        dtype = dtypes[tensor]
        if b.reducer is None:
            if tensor in alloc_names:
                body_items.append(_decl(tensor, dtype, shapes[tensor]))
            body_items.append(A.Stage(tensor, lhs, "=", rhs))
            continue
        op = {"sum": "+=", "max": "max=", "min": "min="}[b.reducer]
        reduce_vars = [(v, nm, e) for v, nm, e in idx if any(v.same_as(rv) for rv, _, k in b.iter_vars if k == "R")]
        missing = [nm for _, nm, _ in reduce_vars if not tx.bare.get(nm)]
        if missing:
            which = (f"indices {', '.join(missing)} occur" if len(missing) > 1 else f"index {missing[0]} occurs")
            # W_win[spatial..., reduce...] = rhs;  T[spatial...] op= W_win[spatial..., reduce...]
            win = sanitize(tensor + "_win", taken | index_names_used)
            taken.add(win)
            win_idx = tuple(lhs) + tuple(A.Var(nm) for _, nm, _ in reduce_vars)
            win_shape = shapes[tensor] + tuple(e for _, _, e in reduce_vars)
            if math.prod(win_shape) > MAX_WINDOW_ELEMENTS:
                raise Untranslatable(f"block {b.name}: reduction {which} in no plain subscript, and the window "
                                     f"stage that would give {'them extents' if len(missing) > 1 else 'it an extent'}"
                                     f" would have {math.prod(win_shape)} elements (limit {MAX_WINDOW_ELEMENTS})")
            body_items.append(_decl(win, dtype, win_shape))
            body_items.append(A.Stage(win, win_idx, "=", rhs))
            rhs = A.Access(win, win_idx)
            notes.append(f"reduction {tensor}: {which} in no plain subscript, so the reduction reads a window "
                         f"stage {win}{list(win_shape)} (same values)")
        if tensor in alloc_names:
            body_items.append(_decl(tensor, dtype, shapes[tensor]))
        body_items.append(A.Stage(tensor, lhs, op, rhs))

    def tensor_of(buf) -> str:
        return next(nm for t, nm in tensor_names if t.same_as(buf))

    def signature(bufs):
        return tuple(_param(tensor_of(p), dtypes[tensor_of(p)], shapes[tensor_of(p)]) for p in bufs)

    def position(buf) -> int:
        return next(n for n, q in enumerate(params) if q.same_as(buf))

    op = A.Op(name=op_name, decorators=(), inputs=signature(inputs), outputs=signature(outputs),
              outputs_parenthesized=len(outputs) != 1, body=tuple(body_items))
    return Translation(op, names, [(position(p), tensor_of(p)) for p in inputs],
                       [(position(p), tensor_of(p)) for p in outputs], notes)


def _loads(e):
    out = []

    def visit(x):
        if _kind(x) == "TensorLoad":
            out.append(x)
        for c in _expr_children(x):
            visit(c)
    visit(e)
    return out


def _param(name: str, dtype: str, shape) -> A.TensorParam:
    """A signature tensor or a declaration (the same node)."""
    return A.TensorParam(name, A.TensorType(dtype, tuple(shape)))


_decl = _param
