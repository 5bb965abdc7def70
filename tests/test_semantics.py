"""Semantics that the kernel and the NumPy reference must agree on, and the checks that guard them."""

import numpy as np

from tensorlang import api

from conftest import ROOT

CPU = 'target cpu = llvm(cores = 1)\n'


def run_op(src, op):
    doc = api.load_text(CPU + src)
    assert not [d for d in doc.diagnostics if d.severity == "error"], doc.diagnostics
    low = api.lower_op(doc, op, "cpu")
    assert low.ok, low.diagnostics
    return api.run_lowered(low, repeat=1)


def errors(src):
    return [(d.span.line, d.span.col, d.code) for d in api.check(api.load_text(CPU + src)) if d.severity == "error"]


def test_index_division_floors_in_kernel_and_reference():
    r = run_op("op f(A: f32[9]) -> Y: f32[9] {\n    Y[i] = A[i] * 0.0 + i / 2\n}\n", "f")
    assert r.ok and r.max_abs == 0.0


def test_integer_overflow_wraps_per_operation_in_both():
    # 63 * 63 wraps in i8 before the addition, in the kernel and in the reference alike. (A division of
    # a wrapped negative value is left out: TVM's simplifier assumes no overflow and may truncate.)
    r = run_op("op f(A: i8[64]) -> Y: i8[64] {\n    Y[i] = i8(i) * i8(i) + A[i]\n}\n", "f")
    assert r.ok and r.max_abs == 0.0


def test_scalar_output_runs():
    r = run_op("op total(A: f32[128]) -> S: f32[] {\n    S[] += A[k]\n}\n", "total")
    assert r.ok


def test_power_of_integers_is_rejected():
    assert errors("op f(A: i32[4]) -> Y: i32[4] {\n    Y[i] = A[i] ** 2\n}\n") == [(3, 12, "TS210")]


def test_float_literal_into_integer_tensor_is_rejected():
    assert errors("op f(A: i32[4]) -> Y: i32[4] {\n    Y[i] = 0.5\n}\n") == [(3, 12, "TS210")]


def test_conversion_suggestion_is_numeric():
    doc = api.load_text(CPU + "op f(X: f32[4]) -> Y: f32[4] {\n    Y[i] = (X[i] < 1.0) + 1.0\n}\n")
    msgs = [d.message for d in doc.diagnostics if d.code == "TS210"]
    assert msgs and all("bool(" not in m for m in msgs)


def test_auto_takes_no_parameters():
    assert errors("@auto(policy = 1)\nop f(A: f32[4]) -> Y: f32[4] {\n    Y[i] = A[i]\n}\n") == [(2, 1, "TS110")]


def test_annotate_accepts_block_names_tvm_made():
    src = ("op mm(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {\n    C[i, j] += A[i, k] * B[k, j]\n}\n\n"
           "schedule mm on cpu {\n    decompose_reduction(C, C.k)\n    annotate(C_init, \"note\", 1)\n}\n")
    assert errors(src) == []


def test_serial_loop_above_blockidx_is_reported():
    src = ('target gpu = cuda(arch = "sm_90")\n'
           "op f(A: f32[64, 64]) -> Y: f32[64, 64] {\n    Y[i, j] = A[i, j] * 2.0\n}\n\n"
           "schedule f on gpu {\n    j0, j1 = split(Y.j, [2, 32])\n    bind(j0, blockIdx.x)\n    bind(j1, threadIdx.x)\n}\n")
    diags = [d for d in api.check(api.load_text(CPU + src)) if d.severity == "error"]
    assert [d.code for d in diags] == ["TS401"]
    assert "serial loop i outside its blockIdx.* loop" in diags[0].message


def test_gather_indices_are_drawn_in_range():
    r = run_op("op take(W: f32[1000, 16], I: i32[64]) -> Y: f32[64, 16] {\n    Y[i, j] = W[I[i], j]\n}\n", "take")
    assert r.ok and r.max_abs == 0.0
    from tensorlang import interp
    doc = api.load_text(CPU + "op take(W: f32[1000, 16], I: i32[64]) -> Y: f32[64, 16] {\n    Y[i, j] = W[I[i], j]\n}\n")
    idx = interp.random_inputs(doc.model.ops["take"])["I"]
    assert idx.min() >= 0 and idx.max() <= 999 and idx.max() - idx.min() > 500


def test_divisors_are_drawn_away_from_zero():
    """A `/`'s right operand -- read directly, inside an expression, or through a copy (an extracted batch norm's
    expand_dims) -- gets inputs at least 0.5 from zero; the other inputs stay standard normal."""
    from tensorlang import interp
    src = ("op bn(X: f32[64, 32], V: f32[32], E: f32[32], S: f32[32]) -> Y: f32[64, 32] {\n"
           "    C: f32[1, 32]\n    C[i, j] = S[j]\n"
           "    Y[i, j] = X[i, j] / V[j] + X[i, j] / (E[j] * 2.0) + X[i, j] / C[0, j]\n}\n")
    op = api.load_text(CPU + src).model.ops["bn"]
    assert interp.divisors(op) == {"V", "E", "S"}
    xs = interp.random_inputs(op)
    assert all(np.abs(xs[n]).min() >= 0.5 for n in ("V", "E", "S")) and np.abs(xs["X"]).min() < 0.5
    assert (xs["V"] < 0).any() and (xs["V"] > 0).any()  # signs kept
    r = run_op(src, "bn")
    assert r.ok


def test_what_a_square_root_is_taken_of_is_drawn_nonnegative():
    """An extracted RMSNorm (the squares come from another task): the input summed under `rsqrt` gets
    non-negative values, so no row of the reference is NaN; the other inputs stay standard normal. The
    Qwen2 layer's task, run: every element checked, none NaN."""
    from tensorlang import interp
    path = ROOT / "data/workloads/qwen2-0.5b-layer/fused_mean_add1_tir_rsqrt_multiply2_multiply3.tsched"
    op = next(iter(api.load(path).model.ops.values()))
    assert interp.nonnegative_inputs(op) == {"lv51"}
    xs = interp.random_inputs(op)
    assert xs["lv51"].min() >= 0 and (xs["lv3"] < 0).any()
    ref = interp.evaluate(op, xs)
    assert np.isfinite(ref[op.outputs[0].name]).all()
    src = ("op ln(X: f32[4, 8], W: f32[4, 8]) -> Y: f32[4, 8] {\n    S: f32[4]\n    S[i] += X[i, k] * X[i, k]\n"
           "    Y[i, j] = W[i, j] * log(S[i] + 1.0) / sqrt(S[i])\n}\n")
    op = api.load_text(CPU + src).model.ops["ln"]
    assert interp.nonnegative_inputs(op) == {"X"} and interp.divisors(op) == set()
