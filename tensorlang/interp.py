"""An independent float64 NumPy interpreter of the index notation: the reference `run` checks against.

It walks the AST and the checked model only; it never goes through TVM. Each stage is evaluated
over the grid of its loop indices with NumPy broadcasting, in chunks -- boxes of that grid, cut
along as many spatial and reduction indices as needed -- so that the arrays one chunk makes stay
within a memory budget (`memory_budget()`); a reduction chunked along its reduction indices
accumulates partial sums / maxima / minima (in float64, or in int64 for integer stages).
Floating-point stages are computed in float64; integer stages in int64, wrapped per operation
and at the end of the stage, as the kernel would store them (int64 addition is modular, so
partial sums wrap to the same value).

Two shortcuts keep large operators within seconds, computing the same values: a read whose
subscripts are affine in the loop indices over the chunk (`A[n, d * 2 + rd, ..]`) is a strided view
instead of a gather, and a floating-point sum of a product (a matmul, a convolution) is contracted
with np.einsum instead of materialising the product over the grid.

A reference that would need more memory than this machine has, or longer than `time_limit()`,
raises ReferenceUnavailable (TS407 / TS408) with what it needed, instead of failing or hanging.
"""
from __future__ import annotations

import itertools
import math
import os
import time

import numpy as np

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.check import _children, expr_type, index_range
from tensorlang.analysis.model import OpModel, StageModel
from tensorlang.parser import ast as A

CHUNK_ELEMENTS = 1 << 22  # at most this many grid points per chunk: larger chunks are no faster
MEMORY_MB = 512  # default budget for one chunk's arrays (TENSORLANG_REFERENCE_MEMORY_MB)
TIME_LIMIT_S = 60.0  # default limit on one reference (TENSORLANG_REFERENCE_SECONDS; 0: none)
TOO_LARGE, TOO_SLOW = "TS407", "TS408"


class ReferenceUnavailable(Exception):
    """The reference cannot be computed here: `code` is TOO_LARGE (memory) or TOO_SLOW (time)."""

    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message

    def __str__(self):
        return f"{self.code} {self.message}"


def memory_budget() -> int:
    """Bytes the arrays of one chunk may take (the op's own tensors come on top)."""
    return int(float(os.environ.get("TENSORLANG_REFERENCE_MEMORY_MB", MEMORY_MB)) * 2 ** 20)


def time_limit() -> float:
    """Seconds one reference may take (0: no limit)."""
    return float(os.environ.get("TENSORLANG_REFERENCE_SECONDS", TIME_LIMIT_S))


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.1f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB"


def io_memory_message(op: OpModel) -> str:
    """TS407 for a run whose inputs and outputs do not fit (where the kernel itself cannot be run)."""
    return (f"{TOO_LARGE} out of memory: the operator's inputs and outputs take {_gib(op.bytes)} in their dtypes, "
            f"and its reference holds all {_gib(_tensor_bytes(op))} of its tensors in float64: free memory, or run "
            f"a smaller shape")


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
    for copy, copied in _copies(op):  # a copied stage passes its bound on to what it copies
        if copy in bounds and op.tensors.get(copied) is not None and op.tensors[copied].dtype in D.INTS:
            bound(copied, bounds[copy])
    return {name: b for name, b in bounds.items() if op.tensors[name].role == "input"}


def _copies(op: OpModel) -> list[tuple[str, str]]:
    """(stage, the tensor it copies) for each stage that is a plain read of another (`T[i, j] = I[i, 0]`),
    last stage first: what is said of a copy, passed on in this order, reaches what it copies."""
    out = []
    for st in reversed(op.stages):
        rhs = A.strip_parens(st.ast.rhs)
        if st.reducer is None and isinstance(rhs, A.Access):
            out.append((st.tensor, rhs.tensor))
    return out


def _reads(e, into: set) -> None:
    """The tensors expression `e` reads, added to `into`."""
    if isinstance(e, A.Access):
        into.add(e.tensor)
    for c in _children(e):
        _reads(c, into)


def divisors(op: OpModel) -> set[str]:
    """Float inputs read in the right operand of a `/` (directly, or through stages that copy them, as an
    extracted batch norm's `expand_dims` does): their random values are kept away from zero. A standard
    normal divisor near 0 turns the kernel's rounding into errors far over the tolerance -- every candidate
    of MobileNetV2's batch-8 `conv2d20 ... divide13 ... clip8` was recorded `wrong` for it."""
    found: set[str] = set()

    def visit(e):
        if isinstance(e, A.BinOp) and e.op == "/":
            _reads(e.right, found)
        for c in _children(e):
            visit(c)

    for st in op.stages:
        visit(st.ast.rhs)
    for copy, copied in _copies(op):  # a copy of a divisor makes what it copies one
        if copy in found:
            found.add(copied)
    return {t.name for t in op.inputs if t.name in found and t.dtype in D.FLOATS}


_NONNEGATIVE_ARGUMENT = ("sqrt", "rsqrt", "log", "log2")


def nonnegative_inputs(op: OpModel) -> set[str]:
    """Float inputs a `sqrt`, `rsqrt` or `log` argument is computed from (through any stages in between):
    their random values are made non-negative. An extracted RMSNorm takes the squares from another task
    (`power`), so a standard-normal input made half its rows' sums negative -- NaN in the reference and in
    every kernel alike, rows that the check then could not tell right from wrong."""
    stage_of = {st.tensor: st for st in op.stages}
    found: set[str] = set()

    def visit(e):
        if isinstance(e, A.Call) and e.func in _NONNEGATIVE_ARGUMENT:
            for a in e.args:
                _reads(a, found)
        for c in _children(e):
            visit(c)

    for st in op.stages:
        visit(st.ast.rhs)
    todo = list(found)
    while todo:  # what an argument's stages read, back to the inputs
        st = stage_of.get(todo.pop())
        if st is None:
            continue
        more: set = set()
        _reads(st.ast.rhs, more)
        todo += sorted(more - found)
        found |= more
    return {t.name for t in op.inputs if t.name in found and t.dtype in D.FLOATS}


def random_inputs(op: OpModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal inputs (fixed seed); integer tensors get normals scaled by 4 and rounded,
    except those used as subscripts (gathers): their normals are rescaled onto 0 .. extent - 1 of the
    dimension they index, so every index is in range (TVM's gathers do not check bounds). Divisors
    (`divisors`) get normals pushed 0.5 away from zero, their signs kept; what a square root or a
    logarithm is taken of (`nonnegative_inputs`), their absolute values."""
    rng = np.random.default_rng(seed)
    gathers = index_bounds(op)
    away_from_zero = divisors(op)
    nonnegative = nonnegative_inputs(op)
    out = {}
    for t in op.inputs:
        x = rng.standard_normal(t.shape)
        if t.name in nonnegative:
            x = np.abs(x) + 0.5 if t.name in away_from_zero else np.abs(x)
        elif t.name in away_from_zero:
            x = np.copysign(0.5 + np.abs(x), x)
        elif t.name in gathers:
            x = np.floor((x - x.min()) / (np.ptp(x) + 1e-12) * (gathers[t.name] - 1e-9)) if x.size > 1 else 0 * x
        elif t.dtype in D.INTS:
            x = np.rint(x * 4)
            if t.dtype.startswith("u"):
                x = np.abs(x)
        elif t.dtype == "bool":
            x = x > 0
        out[t.name] = x.astype(D.numpy_dtype(t.dtype))
    return out


def evaluate(op: OpModel, inputs: dict[str, np.ndarray], *, memory_bytes: int | None = None,
             max_seconds: float | None = None, keep=None) -> dict[str, np.ndarray]:
    """The op's tensors (float64 for floating types, int64 for integer ones) given its inputs: all of
    them, or only those named in `keep` (the others are dropped after their last read, to save memory).
    `memory_bytes`, `max_seconds`: the chunk budget and time limit (default: memory_budget(), time_limit())."""
    budget = memory_budget() if memory_bytes is None else memory_bytes
    limit = time_limit() if max_seconds is None else max_seconds
    _check_memory(op, budget)
    last = _last_reads(op)
    values: dict[str, np.ndarray] = {}
    t0 = time.monotonic()
    try:
        for t in op.inputs:
            x = np.asarray(inputs[t.name])
            values[t.name] = x.astype(np.float64) if t.dtype in D.FLOATS else x.astype(np.int64)
        for n, st in enumerate(op.stages):
            values[st.tensor] = _stage(op, st, values, budget, _Clock(t0, limit))
            if keep is not None:
                for name in [v for v in values if v not in keep and last.get(v, -1) <= n]:
                    del values[name]
    except MemoryError as e:
        raise ReferenceUnavailable(TOO_LARGE, f"the NumPy reference ran out of memory ({e}); it needs "
                                   f"{_gib(_tensor_bytes(op))} for the operator's tensors in float64 plus up to "
                                   f"{_gib(budget)} for one chunk: free memory, lower "
                                   f"TENSORLANG_REFERENCE_MEMORY_MB, or check a smaller shape") from None
    return values


def reference_outputs(op: OpModel, inputs, **limits) -> dict[str, np.ndarray]:
    """The op's outputs; `limits`: evaluate's memory_bytes and max_seconds."""
    return evaluate(op, inputs, keep={t.name for t in op.outputs}, **limits)


def _tensor_bytes(op: OpModel) -> int:
    return 8 * sum(math.prod(t.shape) for t in op.tensors.values())


def _available_memory() -> int | None:
    """Bytes this process may still take: the kernel's MemAvailable, or less under a cgroup v2 limit."""
    have = None
    try:
        with open("/proc/meminfo") as f:
            have = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit, used = f.read().strip(), int(g.read())
        if limit != "max":
            have = min(int(limit) - used, have if have is not None else int(limit))
    except (OSError, ValueError):
        pass
    return have


def _check_memory(op: OpModel, budget: int) -> None:
    """Refuse up front what cannot fit (rather than swap, or die half-way): every tensor of the op is
    held in float64 / int64, and the largest chunk's arrays come on top."""
    chunk = max(chunk_bytes(op, st, plan_blocks(op, st, budget)) for st in op.stages)
    have = _available_memory()
    if have is not None and _tensor_bytes(op) + chunk > have:
        raise ReferenceUnavailable(TOO_LARGE, f"the NumPy reference needs {_gib(_tensor_bytes(op))} for the "
                                   f"operator's tensors in float64 plus up to {_gib(chunk)} for one chunk, and "
                                   f"this machine has {_gib(have)} available: free memory, or check a smaller shape")


def _last_reads(op: OpModel) -> dict[str, int]:
    """Tensor -> the position of the last stage that reads it."""
    last: dict[str, int] = {}

    def visit(e, n):
        if isinstance(e, A.Access):
            last[e.tensor] = n
        for c in _children(e):
            visit(c, n)

    for n, st in enumerate(op.stages):
        visit(st.ast.rhs, n)
    return last


class _Clock:
    """Projects a stage's time from its chunks so far; raises TOO_SLOW once the reference will pass the limit."""

    def __init__(self, t0: float, limit: float):
        self.t0, self.limit, self.start = t0, limit, time.monotonic()

    def tick(self, st: StageModel, done: int, total: int) -> None:
        now = time.monotonic()
        spent = now - self.start
        if not self.limit or (spent < min(1.0, self.limit / 10) and now - self.t0 <= self.limit):
            return  # too early for a fair projection
        estimate = now - self.t0 + spent * (total - done) / done
        if estimate > self.limit:
            raise ReferenceUnavailable(TOO_SLOW, (
                f"the NumPy reference would take about {estimate:.{2 if estimate < 1 else 1 if estimate < 10 else 0}f} s (stage {st.tensor}: {done} of its {total} "
                f"chunks in {spent:.1f} s), more than the {self.limit:g} s it may take: set "
                f"TENSORLANG_REFERENCE_SECONDS to allow longer (0: no limit), or check a smaller shape"))


# ------------------------------------------------------------------ chunks
def _footprint(e, extents: dict[str, int]) -> tuple[frozenset, frozenset, list[frozenset]]:
    """Of e: the loop indices its NumPy value is shaped along (their chunk extents there, 1 elsewhere),
    those it really varies along (not along co in `co // 64` over co < 64), and the shapes of every array
    evaluating it makes. A read is shaped along the indices its subscripts vary along (see _strided)."""
    if isinstance(e, A.Var):
        axes = frozenset([e.name])
        return axes, axes, [axes]
    kids = [_footprint(c, extents) for c in _children(e)]
    arrays = [a for k in kids for a in k[2]]
    if isinstance(e, A.Access):
        shape = frozenset().union(*(k[1] for k in kids))
        return shape, shape, arrays + [k[0] for k in kids] * 2 + [shape]  # + the subscripts' int64 and clipped copies
    shape = frozenset().union(*(k[0] for k in kids))
    r = index_range(e, extents)
    varies = frozenset() if r is not None and r[0] == r[1] else frozenset().union(*(k[1] for k in kids))
    return shape, varies, arrays + [shape]


def contraction(op: OpModel, st: StageModel):
    """The two factors of a floating-point sum of a product (`C[i, j] += A[i, k] * B[k, j]`, a convolution):
    such a stage contracts them with np.einsum (BLAS where it can) and never makes its whole grid."""
    rhs = A.strip_parens(st.ast.rhs)
    if st.reducer == "sum" and st.dtype in D.FLOATS and isinstance(rhs, A.BinOp) and rhs.op == "*" \
            and D.is_float(expr_type(rhs, op.tensors)):
        return rhs.left, rhs.right
    return None


def chunk_bytes(op: OpModel, st: StageModel, block: dict[str, int]) -> int:
    """At most the bytes one chunk of `block` points per loop index holds: two arrays per node of the
    expression (its value and a temporary, as a cast or a transposing copy makes), every array at its
    own shape, plus the partial result and its accumulator; and the chunk's whole grid (the product
    before the reduction) unless the stage is a contraction."""
    def size(axes):
        return math.prod(block[a] for a in axes)
    _, _, arrays = _footprint(st.ast.rhs, {i.name: i.extent for i in st.loops})
    if contraction(op, st):
        arrays = arrays[:-1]  # the product itself is never made
    grid = 0 if contraction(op, st) else size(list(block))
    return 8 * (2 * sum(size(a) for a in arrays) + grid + 2 * size(i.name for i in st.spatial))


def plan_blocks(op: OpModel, st: StageModel, budget: int) -> dict[str, int]:
    """Points per loop index of one chunk: the whole grid, its largest spatial extent halved until the
    chunk fits the budget and CHUNK_ELEMENTS (more of it for a contraction, which makes no grid: a
    chunk stays well under a second), then, with every spatial extent at 1, the reduction ones."""
    block = {i.name: i.extent for i in st.loops}
    most = CHUNK_ELEMENTS * (64 if contraction(op, st) else 1)
    while chunk_bytes(op, st, block) > budget or math.prod(block.values()) > most:
        wide = [i for i in st.spatial if block[i.name] > 1] or [i for i in st.reduce if block[i.name] > 1]
        if not wide:
            break
        i = max(wide, key=lambda i: block[i.name])  # the first of the largest
        block[i.name] = (block[i.name] + 1) // 2
    return block


def _boxes(indices, block: dict[str, int]):
    """The chunks of these loop indices: tuples of (lo, hi), one per index."""
    return itertools.product(*[[(lo, min(lo + block[i.name], i.extent)) for lo in range(0, i.extent, block[i.name])]
                               for i in indices])


def _stage(op: OpModel, st: StageModel, values, budget: int, clock: _Clock) -> np.ndarray:
    is_float = st.dtype in D.FLOATS
    out = np.empty(tuple(i.extent for i in st.spatial), dtype=np.float64 if is_float else np.int64)
    block = plan_blocks(op, st, budget)
    spatial, reduce = list(_boxes(st.spatial, block)), list(_boxes(st.reduce, block))
    done, total = 0, len(spatial) * len(reduce)
    for sbox in spatial:
        acc = None
        for rbox in reduce:
            part = _chunk(op, st, values, sbox + rbox, is_float)
            acc = part if acc is None else (acc + part if st.reducer == "sum" else
                                            np.maximum(acc, part) if st.reducer == "max" else np.minimum(acc, part))
            done += 1
            clock.tick(st, done, total)
        out[tuple(slice(lo, hi) for lo, hi in sbox)] = acc
    if not is_float:
        out = out.astype(D.numpy_dtype(st.dtype)).astype(np.int64)  # wrap as the kernel's store does
    return out


class _Grid:
    """One chunk: each loop index as an arange along its own axis, and its (axis, lo, hi)."""

    def __init__(self, loops, box):
        self.ndim = len(loops)
        self.extents = [hi - lo for lo, hi in box]
        self.spans = {i.name: (a, lo, hi) for a, (i, (lo, hi)) in enumerate(zip(loops, box))}
        self.arrays = {}
        for name, (a, lo, hi) in self.spans.items():
            shape = [1] * self.ndim
            shape[a] = hi - lo
            self.arrays[name] = np.arange(lo, hi).reshape(shape)


def _chunk(op, st, values, box, is_float):
    grid = _Grid(st.loops, box)
    extents = grid.extents
    factors = contraction(op, st)
    if factors:
        a, b = (np.asarray(_eval(f, grid, values, op, st.dtype), dtype=np.float64) for f in factors)
        out = _contract(a, b, extents, len(st.spatial))
        if out is not None:
            return out
        val = a * b
    else:
        val = _eval(st.ast.rhs, grid, values, op, st.dtype)
    val = np.broadcast_to(val, extents)
    if not is_float:
        val = val.astype(np.int64)
    axes = tuple(range(len(st.spatial), len(st.loops)))
    if not axes:
        return val
    if st.reducer == "sum":
        return val.sum(axis=axes)
    if st.reducer == "max":
        return val.max(axis=axes)
    return val.min(axis=axes)


def _contract(a, b, extents, n_spatial):
    """sum over the reduction axes of a * b (each shaped like the chunk, 1 where it does not vary) by
    np.einsum; None when some axis of the chunk is in neither factor (then the plain way is as cheap)."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if len(extents) > len(letters):
        return None
    live = [ax for ax, n in enumerate(extents) if n > 1]
    subs, ops = [], []
    for x in (a, b):
        present = [ax for ax in live if x.ndim and x.shape[ax] > 1]
        subs.append("".join(letters[ax] for ax in present))
        ops.append(x.reshape([x.shape[ax] for ax in present]))  # drop the unit axes: a view
    if set(live) - {letters.index(ch) for ch in "".join(subs)}:
        return None
    out = "".join(letters[ax] for ax in live if ax < n_spatial)
    return np.einsum(f"{subs[0]},{subs[1]}->{out}", *ops, optimize=True).reshape(extents[:n_spatial])


def _strided(arr, subs, grid: _Grid):
    """arr[subs] as a view (no copy, unlike a gather) when, over this chunk, every subscript is an integer
    affine function of the loop indices (`d * 2 + rd`, `co // 64 * 3 + rc` over co < 64) and in range;
    an axis no subscript varies along stays 1 (broadcasting restores it). None otherwise."""
    origin, strides, varies = [], [0] * grid.ndim, [False] * grid.ndim
    for d, v in enumerate(subs):
        if v.min() < 0 or v.max() >= arr.shape[d]:
            return None  # a clamped read (a discarded branch): the gather clamps it
        at0 = int(v[(0,) * v.ndim])
        rebuilt = np.int64(at0)
        for ax in range(v.ndim):
            if v.shape[ax] > 1:
                step = int(v[tuple(1 if k == ax else 0 for k in range(v.ndim))]) - at0
                rebuilt = rebuilt + step * np.arange(v.shape[ax]).reshape([-1 if k == ax else 1 for k in range(v.ndim)])
                strides[ax] += step * arr.strides[d]
                varies[ax] |= step != 0
        if not np.array_equal(np.broadcast_to(rebuilt, v.shape), v):
            return None  # not affine: a gather
        origin.append(at0)
    shape = [n if var else 1 for n, var in zip(grid.extents, varies)]
    start = arr[tuple(slice(o, None) for o in origin)]  # its first element is arr[origin]
    return np.lib.stride_tricks.as_strided(start, shape, [s if var else 0 for s, var in zip(strides, varies)],
                                           writeable=False)


def _drop_constant_axes(idx: list[np.ndarray]) -> list[np.ndarray]:
    """Subscripts that are all constant along an axis read one element along it: keep one (broadcasting
    restores the axis), so a gather is no larger than _footprint says."""
    for ax in range(max(v.ndim for v in idx)):
        if all(v.ndim == 0 or v.shape[ax] == 1 or (v == v.take([0], axis=ax)).all() for v in idx):
            idx = [v.take([0], axis=ax) if v.ndim and v.shape[ax] > 1 else v for v in idx]
    return idx


def _eval(e: A.Expr, grid: _Grid, values, op: OpModel, want: str):
    if isinstance(e, A.Num):
        return np.float64(e.value) if e.is_float or want in D.FLOATS else np.int64(e.value)
    if isinstance(e, A.Var):
        return grid.arrays[e.name]
    if isinstance(e, A.Paren):
        return _eval(e.expr, grid, values, op, want)
    if isinstance(e, A.Access):
        arr = values[e.tensor]
        subs = [np.asarray(_eval(i, grid, values, op, "i64")).astype(np.int64) for i in e.indices]
        if not subs:
            return arr[()]
        view = _strided(arr, subs, grid)
        if view is not None:
            return view
        # Out-of-range reads happen only in branches a condition discards: clamp, never fault.
        idx = np.broadcast_arrays(*_drop_constant_axes([np.clip(v, 0, n - 1) for v, n in zip(subs, arr.shape)]))
        return arr[tuple(idx)]
    if isinstance(e, A.Neg):
        return -_eval(e.operand, grid, values, op, want)
    if isinstance(e, A.Not):
        return np.logical_not(_eval(e.operand, grid, values, op, want))
    if isinstance(e, A.BoolOp):
        parts = [_eval(v, grid, values, op, want) for v in e.values]
        f = np.logical_and if e.op == "and" else np.logical_or
        out = parts[0]
        for p in parts[1:]:
            out = f(out, p)
        return out
    if isinstance(e, A.Compare):
        ops = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
               "!=": np.not_equal}
        vals = [_eval(o, grid, values, op, want) for o in e.operands]
        out = True
        for a, o, b in zip(vals, e.ops, vals[1:]):
            out = np.logical_and(out, ops[o](a, b))
        return out
    if isinstance(e, A.IfExp):
        cond = _eval(e.cond, grid, values, op, want)
        return np.where(cond, _eval(e.then, grid, values, op, want), _eval(e.orelse, grid, values, op, want))
    if isinstance(e, A.BinOp):
        a, b = _eval(e.left, grid, values, op, want), _eval(e.right, grid, values, op, want)
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
        args = [_eval(a, grid, values, op, want) for a in e.args]
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
