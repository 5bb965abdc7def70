"""An independent float64 NumPy interpreter of the index notation: the reference `run` checks against.

It walks the AST and the checked model only; it never goes through TVM. Each stage is
evaluated over the grid of its loop indices with NumPy broadcasting, in chunks of the
outermost spatial index so a convolution's grid never has to fit in memory at once.
Floating-point stages are computed in float64; integer stages in int64 and wrapped to
their dtype at the end of the stage, as the kernel would store them.
"""
from __future__ import annotations

import math

import numpy as np

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.check import expr_type
from tensorlang.analysis.model import OpModel, StageModel
from tensorlang.parser import ast as A

CHUNK_ELEMENTS = 1 << 22  # points of a stage's grid evaluated at once

_UNARY = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "abs": np.abs, "relu": lambda x: np.maximum(x, 0), "sin": np.sin, "cos": np.cos, "floor": np.floor,
    "ceil": np.ceil, "round": np.rint,
}


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x) if np.ndim(x) else erf(float(x))


def index_bounds(op: OpModel) -> dict[str, int]:
    """Integer inputs used as subscripts (`W[I[i], j]`, a gather): input -> the extent they index.
    An input that reaches a subscript through copies (`T[i, j] = I[i, 0]`, as extracted models
    broadcast their index tensors) counts too."""
    bounds: dict[str, int] = {}

    def bound(name: str, extent: int):
        bounds[name] = min(bounds.get(name, extent), extent)

    def visit(e):
        from tensorlang.analysis.check import _children
        if isinstance(e, A.Access) and e.tensor in op.tensors:
            shape = op.tensors[e.tensor].shape
            for d, idx in enumerate(e.indices):
                inner = A.strip_parens(idx)
                if isinstance(inner, A.Access) and op.tensors.get(inner.tensor) is not None \
                        and op.tensors[inner.tensor].dtype in D.INTS:
                    bound(inner.tensor, shape[d])
        for c in _children(e):
            visit(c)

    for st in op.stages:
        visit(st.ast.rhs)
    for st in reversed(op.stages):  # a copied stage passes its bound on to what it copies
        rhs = A.strip_parens(st.ast.rhs)
        copied = op.tensors.get(rhs.tensor) if isinstance(rhs, A.Access) else None
        if st.tensor in bounds and st.reducer is None and copied is not None and copied.dtype in D.INTS:
            bound(rhs.tensor, bounds[st.tensor])
    return {name: b for name, b in bounds.items() if op.tensors[name].role == "input"}


def random_inputs(op: OpModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal inputs (fixed seed); integer tensors get normals scaled by 4 and rounded,
    except those used as subscripts (gathers): their normals are rescaled onto 0 .. extent - 1 of the
    dimension they index, so every index is in range (TVM's gathers do not check bounds)."""
    rng = np.random.default_rng(seed)
    gathers = index_bounds(op)
    out = {}
    for t in op.inputs:
        x = rng.standard_normal(t.shape)
        if t.name in gathers:
            x = np.floor((x - x.min()) / (np.ptp(x) + 1e-12) * (gathers[t.name] - 1e-9)) if x.size > 1 else 0 * x
        elif t.dtype in D.INTS:
            x = np.rint(x * 4)
            if t.dtype.startswith("u"):
                x = np.abs(x)
        elif t.dtype == "bool":
            x = x > 0
        out[t.name] = x.astype(D.numpy_dtype(t.dtype))
    return out


def evaluate(op: OpModel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All tensors of the op (float64 for floating types) given its inputs."""
    values: dict[str, np.ndarray] = {}
    for t in op.inputs:
        x = np.asarray(inputs[t.name])
        values[t.name] = x.astype(np.float64) if t.dtype in D.FLOATS else x.astype(np.int64)
    for st in op.stages:
        values[st.tensor] = _stage(op, st, values)
    return values


def reference_outputs(op: OpModel, inputs) -> dict[str, np.ndarray]:
    values = evaluate(op, inputs)
    return {t.name: values[t.name] for t in op.outputs}


def _stage(op: OpModel, st: StageModel, values) -> np.ndarray:
    spatial, reduce = st.spatial, st.reduce
    shape = tuple(i.extent for i in spatial)
    is_float = st.dtype in D.FLOATS
    out = np.empty(shape, dtype=np.float64 if is_float else np.int64)
    rsize = math.prod(i.extent for i in reduce)
    inner = math.prod(shape[1:]) * rsize if shape else rsize
    step = max(1, CHUNK_ELEMENTS // max(inner, 1))
    if not shape:  # a scalar output: one chunk
        out[()] = _chunk(op, st, values, 0, 1, is_float)
    for lo in range(0, shape[0] if shape else 0, step):
        hi = min(shape[0], lo + step)
        out[lo:hi] = _chunk(op, st, values, lo, hi, is_float)
    if not is_float:
        out = out.astype(D.numpy_dtype(st.dtype)).astype(np.int64)  # wrap as the kernel's store does
    return out


def _chunk(op, st, values, lo, hi, is_float):
    loops = st.spatial + st.reduce
    n = len(loops)
    env = {}
    for axis, idx in enumerate(loops):
        rng = np.arange(lo, hi) if axis == 0 and st.spatial else np.arange(idx.extent)
        shape = [1] * n
        shape[axis] = len(rng)
        env[idx.name] = rng.reshape(shape)
    val = _eval(st.ast.rhs, env, values, op, st.dtype)
    full = [hi - lo if (a == 0 and st.spatial) else i.extent for a, i in enumerate(loops)]
    val = np.broadcast_to(val, full)
    if not is_float:
        val = val.astype(np.int64)
    axes = tuple(range(len(st.spatial), n))
    if not axes:
        return val
    if st.reducer == "sum":
        return val.sum(axis=axes)
    if st.reducer == "max":
        return val.max(axis=axes)
    return val.min(axis=axes)


def _eval(e: A.Expr, env, values, op: OpModel, want: str):
    if isinstance(e, A.Num):
        return np.float64(e.value) if e.is_float or want in D.FLOATS else np.int64(e.value)
    if isinstance(e, A.Var):
        return env[e.name]
    if isinstance(e, A.Paren):
        return _eval(e.expr, env, values, op, want)
    if isinstance(e, A.Access):
        arr = values[e.tensor]
        idx = []
        for d, i in enumerate(e.indices):
            v = np.asarray(_eval(i, env, values, op, "i64")).astype(np.int64)
            # Out-of-range reads happen only in branches a condition discards: clamp, never fault.
            idx.append(np.clip(v, 0, arr.shape[d] - 1))
        idx = np.broadcast_arrays(*idx) if idx else ()
        return arr[tuple(idx)] if idx else arr[()]
    if isinstance(e, A.Neg):
        return -_eval(e.operand, env, values, op, want)
    if isinstance(e, A.Not):
        return np.logical_not(_eval(e.operand, env, values, op, want))
    if isinstance(e, A.BoolOp):
        parts = [_eval(v, env, values, op, want) for v in e.values]
        f = np.logical_and if e.op == "and" else np.logical_or
        out = parts[0]
        for p in parts[1:]:
            out = f(out, p)
        return out
    if isinstance(e, A.Compare):
        ops = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
               "!=": np.not_equal}
        vals = [_eval(o, env, values, op, want) for o in e.operands]
        out = True
        for a, o, b in zip(vals, e.ops, vals[1:]):
            out = np.logical_and(out, ops[o](a, b))
        return out
    if isinstance(e, A.IfExp):
        cond = _eval(e.cond, env, values, op, want)
        return np.where(cond, _eval(e.then, env, values, op, want), _eval(e.orelse, env, values, op, want))
    if isinstance(e, A.BinOp):
        a, b = _eval(e.left, env, values, op, want), _eval(e.right, env, values, op, want)
        t = expr_type(e, op.tensors)
        if D.is_float(t):
            return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
                    "**": np.power}[e.op](np.float64(a) if np.isscalar(a) else a, b)
        # Integer arithmetic (indices, literals, integer tensors): `/` floors, as in the kernel,
        # and a strongly typed result wraps to its dtype after every operation, as the kernel's does.
        r = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.floor_divide, "//": np.floor_divide,
             "%": np.mod}[e.op](np.int64(a) if np.isscalar(a) else np.asarray(a, dtype=np.int64),
                                np.int64(b) if np.isscalar(b) else np.asarray(b, dtype=np.int64))
        return _wrap(r, t)
    if isinstance(e, A.Call):
        args = [_eval(a, env, values, op, want) for a in e.args]
        if e.func in D.TVM_DTYPE:
            x = np.asarray(args[0])
            if e.func in D.FLOATS:
                return x.astype(D.numpy_dtype(e.func)).astype(np.float64) if e.func != "f64" else x.astype(np.float64)
            if e.func == "bool":
                return x != 0
            return np.trunc(x).astype(np.int64).astype(D.numpy_dtype(e.func)).astype(np.int64)
        if e.func == "erf":
            return _erf(np.asarray(args[0], dtype=np.float64))
        if e.func in _UNARY:
            return _UNARY[e.func](np.asarray(args[0], dtype=np.float64) if e.func not in ("abs", "relu")
                                  else args[0])
        if e.func == "max":
            return np.maximum(args[0], args[1])
        if e.func == "min":
            return np.minimum(args[0], args[1])
        if e.func == "pow":
            return np.power(np.float64(args[0]), args[1])
    raise TypeError(f"cannot evaluate {e!r}")


def _wrap(x, dtype: str):
    if dtype in D.INTS:
        return np.asarray(x).astype(D.numpy_dtype(dtype)).astype(np.int64)
    return x


def compare(out: np.ndarray, ref: np.ndarray, dtype: str) -> dict:
    """Max abs/rel error and whether it is within the dtype's tolerance (docs/language.md).
    Where the reference itself is not finite (rsqrt of a negative mean on random inputs), the output
    must be the same NaN or infinity; the errors are taken over the finite positions."""
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    same_nonfinite = ~np.isfinite(r) & ((np.isnan(r) & np.isnan(o)) | (r == o))
    if not np.array_equal(~np.isfinite(r), same_nonfinite):
        return {"max_abs": float("inf"), "max_rel": float("inf"), "ok": False}
    finite = np.isfinite(r)
    o, r = o[finite], r[finite]
    diff = np.abs(o - r)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    max_rel = max_abs / scale if scale else max_abs
    if dtype in D.TOLERANCE:
        rtol, atol = D.TOLERANCE[dtype]
        ok = bool(np.isfinite(o).all()) and max_abs <= rtol * scale + atol
    else:
        ok = max_abs == 0.0
    return {"max_abs": max_abs, "max_rel": max_rel, "ok": ok}
