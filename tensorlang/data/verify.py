"""The round-trip check of a translation: the original PrimFunc and the translated op, both compiled for
this CPU, run on the same random inputs; their outputs must agree.

The original is compiled with `tvm.compile`; the translation goes the way every .tsched operator goes
(`api.load_text` -> `api.lower_op` on the built-in `llvm` target, unscheduled -> `compile_module`).
Tolerance per output dtype: `max |ours - original| <= rtol * max |original| + atol` with
`tensorlang run`'s table (f32: 1e-4, 1e-5); integer and bool outputs must match exactly. NaN and
infinities must sit at the same places. Inputs: standard normal floats; integers uniform in
[0, m) where m is the smallest dimension any data-dependent subscript of the PrimFunc indexes
(8 when there is none), so gathers stay in range; bools uniform. When an output has
non-finite values (a square root of a negative input, say), the check is repeated on positive
inputs (|x| + 0.5) so that it is not vacuous.

When TVM cannot build the original itself (its LLVM backend rejects `bool == bool`, which the
causal-mask tasks of GPT-2 and LLaMA contain; the translation compares i8 conversions instead), the
compiled translation is compared with tensorlang's float64 NumPy interpreter of the op, and the
result says so (`against: "numpy-reference"`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorlang.analysis import dtypes as D
from tensorlang.data.translate import DTYPES, Translation, _expr_children, _kind, _shape


@dataclass
class Check:
    ok: bool
    max_abs: float
    max_rel: float
    message: str = ""
    runs: int = 1
    against: str = "original"  # what the translation was compared with: "original" or "numpy-reference"

    def as_dict(self) -> dict:
        return {"ok": self.ok, "against": self.against, "max_abs_err": self.max_abs, "max_rel_err": self.max_rel,
                "runs": self.runs, **({"message": self.message} if self.message else {})}


def _last_line(msg: str) -> str:
    lines = [l.strip() for l in msg.strip().splitlines() if l.strip()]
    return (lines[-1] if lines else msg)[:200]


def against_reference(func, translation: Translation, doc, lib, seed: int = 0) -> Check:
    """Fallback when the original cannot be built: the compiled op against the float64 NumPy interpreter."""
    from tensorlang import interp
    op = doc.model.ops[translation.op.name]
    params = list(func.params)
    values = make_inputs([params[n] for n, _ in translation.inputs], _index_bound(func), np.random.default_rng(seed))
    inputs = {name: x for (_, name), x in zip(translation.inputs, values)}
    outs = _run(lib, [inputs[t.name] for t in op.inputs] +
                [np.zeros(t.shape, dtype=D.numpy_dtype(t.dtype)) for t in op.outputs])[len(op.inputs):]
    try:
        ref = interp.reference_outputs(op, inputs)
    except interp.ReferenceUnavailable as e:  # too large or too slow to check here: say so, not a crash
        return Check(False, 0.0, 0.0, f"not checked: {e}", against="numpy-reference")
    worst_abs = worst_rel = 0.0
    for t, got in zip(op.outputs, outs):
        ok, err, rel = compare(got, ref[t.name].astype(got.dtype) if t.dtype not in D.FLOATS else ref[t.name], t.dtype)
        worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
        if not ok:
            return Check(False, worst_abs, worst_rel, f"output {t.name} differs from the reference")
    return Check(True, worst_abs, worst_rel)


def _index_bound(func) -> int:
    """The smallest dimension indexed by a subscript that depends on a tensor's value (8 if none)."""
    from tvm import tirx

    from tensorlang.lower.tir import walk
    dims: list[int] = []

    def visit(e):
        if _kind(e) == "TensorLoad":
            shape = _shape(e.source)
            for pos, x in enumerate(e.indices):
                if _has_load(x):
                    dims.append(shape[pos])
        for c in _expr_children(e):
            visit(c)

    for node, _ in walk(func.body):
        if isinstance(node, tirx.BufferStore):
            visit(node.value)
            for x in node.indices:
                visit(x)
    return max(1, min(dims)) if dims else 8


def _has_load(e) -> bool:
    return _kind(e) == "TensorLoad" or any(_has_load(c) for c in _expr_children(e))


def make_inputs(params, bound: int, rng, positive: bool = False) -> list[np.ndarray]:
    out = []
    for p in params:
        dt = DTYPES[str(p.dtype)]
        shape = _shape(p)
        if dt in D.FLOATS:
            x = rng.standard_normal(shape)
            if positive:
                x = np.abs(x) + 0.5
        elif dt == "bool":
            x = rng.random(shape) > 0.5
        else:
            x = rng.integers(0, bound, size=shape)
        out.append(np.asarray(x).astype(D.numpy_dtype(dt)))
    return out


def compare(out: np.ndarray, ref: np.ndarray, dtype: str) -> tuple[bool, float, float]:
    if dtype not in D.TOLERANCE:
        same = np.array_equal(out, ref)
        diff = 0.0 if same else float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
        return same, diff, diff
    o, r = out.astype(np.float64), ref.astype(np.float64)
    fo, fr = np.isfinite(o), np.isfinite(r)
    if not np.array_equal(fo, fr):
        return False, float("inf"), float("inf")
    nonfinite_same = np.all((o[~fo] == r[~fr]) | (np.isnan(o[~fo]) & np.isnan(r[~fr])))
    if not nonfinite_same:
        return False, float("inf"), float("inf")
    if not fr.any():
        return True, 0.0, 0.0
    err = float(np.max(np.abs(o[fo] - r[fr]))) if fo.any() else 0.0
    scale = float(np.max(np.abs(r[fr])))
    rtol, atol = D.TOLERANCE[dtype]
    return err <= rtol * scale + atol, err, err / scale if scale > 0 else err


def _run(lib, args_np: list[np.ndarray]) -> list[np.ndarray]:
    """Call `main` on copies of the arrays; every argument's contents afterwards."""
    import tvm
    dev = tvm.cpu(0)
    arrs = [tvm.runtime.tensor(np.array(a), dev) for a in args_np]
    lib["main"](*arrs)
    return [a.numpy() for a in arrs]


def verify(mod, translation: Translation, doc, seed: int = 0) -> Check:
    """Compile `mod` (an IRModule whose "main" is the original PrimFunc) and the op of `doc`; compare."""
    import tvm

    from tensorlang import api
    from tensorlang.lower.build import BuildError, compile_module
    from tensorlang.lower.targets import tvm_target

    func = mod["main"]
    op_name = translation.op.name
    nan = float("nan")
    low = api.lower_op(doc, op_name, "llvm")
    if not low.ok:
        return Check(False, nan, nan, "lowering failed: " + "; ".join(d.message for d in low.diagnostics
                                                                         if d.severity == "error"))
    target = tvm_target(low.target)
    try:
        ours = compile_module(low.mod, target)
    except BuildError as e:
        return Check(False, nan, nan, f"build of the translation failed: {e}")
    try:
        original = tvm.compile(mod, target=target)
    except Exception as e:
        why = _last_line(str(e))
        check = against_reference(func, translation, doc, ours, seed)
        check.against = "numpy-reference"
        check.message = (f"the original PrimFunc does not build in TVM ({why}); compared with the NumPy reference "
                         f"interpreter instead") + (f": {check.message}" if check.message else "")
        return check

    params = list(func.params)
    in_pos = [n for n, _ in translation.inputs]
    out_pos = [n for n, _ in translation.outputs]
    bound = _index_bound(func)
    rng = np.random.default_rng(seed)
    worst_abs = worst_rel = 0.0
    runs = 0
    for positive in (False, True):
        runs += 1
        inputs = dict(zip(in_pos, make_inputs([params[n] for n in in_pos], bound, rng, positive)))
        zeros = {n: np.zeros(_shape(params[n]), dtype=D.numpy_dtype(DTYPES[str(params[n].dtype)])) for n in out_pos}
        # The original takes all its parameters in order, the outputs among them.
        orig = _run(original, [inputs[n] if n in inputs else zeros[n] for n in range(len(params))])
        ours_out = _run(ours, [inputs[n] for n in in_pos] + [zeros[n] for n in out_pos])[len(in_pos):]
        nonfinite = False
        for (n, tensor), got in zip(translation.outputs, ours_out):
            dt = DTYPES[str(params[n].dtype)]
            ok, err, rel = compare(got, orig[n], dt)
            worst_abs, worst_rel = max(worst_abs, err), max(worst_rel, rel)
            if not ok:
                return Check(False, worst_abs, worst_rel, f"output {tensor} differs from the original "
                                                          f"(max abs err {err:.3g}, rel {rel:.3g})", runs)
            if dt in D.FLOATS and not np.all(np.isfinite(orig[n].astype(np.float64))):
                nonfinite = True
        if not nonfinite:
            break
    return Check(True, worst_abs, worst_rel, "", runs)
