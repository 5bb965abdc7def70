"""The float64 reference in bounded memory (issue 13): chunked over spatial and reduction indices it equals
the one-chunk evaluation on every reducer and dtype; on C3D's shape (MetaSchedule's 3-D convolution, whose
grid is 49 GiB of float64) its peak memory stays within the budget plus the operator's own tensors; a
reference that would take too long says so with its estimate; the harness and `run` report such a kernel
as timed but `unchecked`, never `ok`."""
import math
import time
import tracemalloc

import numpy as np
import pytest

from tensorlang import api, interp

CPU = "target cpu = llvm(cores = 2)\n\n"

SMALL = {
    # a float sum of a product: contracted with np.einsum
    "matmul": "op matmul(A: f32[13, 19], B: f32[19, 17]) -> C: f32[13, 17] {\n    C[i, j] += A[i, k] * B[k, j]\n}\n",
    # a float sum that is not a product: summed over the broadcast grid
    "sum_exp": "op sum_exp(X: f32[11, 6, 23]) -> S: f32[11] {\n    S[i] += exp(X[i, j, k]) * 0.5 + 1.0\n}\n",
    "max": "op mx(X: f32[9, 14, 10]) -> M: f32[9] {\n    M[i] max= X[i, j, k] * 2.0\n}\n",
    "min": "op mn(X: f32[12, 7, 5]) -> M: f32[12, 5] {\n    M[i, c] min= X[i, k, c] - 1.0\n}\n",
    # i8: every product wraps to i8, the sum wraps at the store
    "i8_sum": "op dot8(A: i8[10, 37], B: i8[10, 37]) -> Y: i8[10] {\n    Y[i] += A[i, k] * B[i, k]\n}\n",
    "i32_sum": ("op dot32(A: i32[7, 29], B: i32[29, 6]) -> Y: i32[7, 6] {\n"
                "    Y[i, j] += A[i, k] * B[k, j] * 65537 * 65537\n}\n"),
    "i32_max": "op max32(A: i32[8, 31]) -> M: i32[8] {\n    M[i] max= A[i, k] * 3 - k\n}\n",
    "i16_min": "op min16(A: i16[6, 9, 11]) -> M: i16[6] {\n    M[i] min= A[i, j, k] * 1000\n}\n",
    # a gather: the subscript is an index tensor's value
    "gather": ("op gather(W: f32[50, 8], I: i32[12, 5]) -> Y: f32[12, 8] {\n"
               "    Y[i, j] += W[I[i, k], j] * 2.0\n}\n"),
    # a padded read (clamped where the condition discards it) and a contraction over a window
    "padded_conv": ("op conv(X: f32[3, 32], W: f32[5, 3, 3]) -> Y: f32[5, 32] {\n"
                    "    P: f32[3, 34]\n"
                    "    P[c, x] = X[c, x - 1] if 1 <= x < 33 else 0.0\n"
                    "    Y[f, x] += P[c, x + r] * W[f, c, r]\n}\n"),
    # a subscript affine within some chunks and not across them (co // 4)
    "grouped": ("op grouped(X: f32[6, 24], W: f32[3, 16]) -> Y: f32[6, 16] {\n"
                "    Y[i, co] += X[i, co // 4 * 3 + r] * W[r, co]\n}\n"),
    # j is in neither factor: the product is summed the plain way
    "broadcast_sum": "op bsum(A: f32[5, 33], B: f32[33]) -> Y: f32[5, 4] {\n    Y[i, j] += A[i, k] * B[k]\n}\n",
    "conditional_sum": ("op relu_sum(A: f32[9, 21]) -> Y: f32[9] {\n"
                        "    Y[i] += A[i, k] if A[i, k] > 0.0 else 0.0 - A[i, k]\n}\n"),
}


def op_of(text: str):
    doc = api.load_text(CPU + text)
    errors = [d for d in doc.diagnostics if d.severity == "error"]
    assert not errors, errors
    return next(iter(doc.model.ops.values()))


def one_chunk(op, x, monkeypatch):
    monkeypatch.setattr(interp, "CHUNK_ELEMENTS", 1 << 40)
    for st in op.stages:
        assert interp.plan_blocks(op, st, 1 << 40) == {i.name: i.extent for i in st.loops}
    out = interp.evaluate(op, x, memory_bytes=1 << 40, max_seconds=0)
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("name", list(SMALL))
def test_chunked_reference_equals_the_unchunked_one(name, monkeypatch):
    op = op_of(SMALL[name])
    x = interp.random_inputs(op, seed=7)
    whole = one_chunk(op, x, monkeypatch)
    for budget in (600, 5000):  # bytes: chunks of a few points, cut along spatial and reduction indices
        if any(st.reduce for st in op.stages) and budget == 600:
            st = next(st for st in op.stages if st.reduce)
            block = interp.plan_blocks(op, st, budget)
            assert all(block[i.name] == 1 for i in st.spatial) and any(block[i.name] < i.extent for i in st.reduce)
        chunked = interp.evaluate(op, x, memory_bytes=budget, max_seconds=0)
        for t in op.tensors.values():
            if t.dtype.startswith(("i", "u")):
                np.testing.assert_array_equal(chunked[t.name], whole[t.name], err_msg=t.name)
            else:
                np.testing.assert_allclose(chunked[t.name], whole[t.name], rtol=1e-12, atol=1e-12, err_msg=t.name)


def test_integer_stages_wrap_as_the_kernel_does():
    op = op_of(SMALL["i8_sum"])
    x = interp.random_inputs(op, seed=7)
    products = (x["A"].astype(np.int64) * x["B"]).astype(np.int8)  # each product wraps to i8
    expect = products.astype(np.int64).sum(axis=1).astype(np.int8)  # and so does the sum
    assert np.abs((x["A"].astype(np.int64) * x["B"]).sum(axis=1)).max() > 127  # the wrapping is exercised
    got = interp.reference_outputs(op, x, memory_bytes=600)["Y"]
    np.testing.assert_array_equal(got, expect)


def test_padded_contraction_matches_numpy():
    op = op_of(SMALL["padded_conv"])
    x = interp.random_inputs(op, seed=3)
    P = np.pad(x["X"].astype(np.float64), ((0, 0), (1, 1)))
    windows = np.stack([P[:, r:r + 32] for r in range(3)], axis=-1)  # c, x, r
    expect = np.einsum("cxr,fcr->fx", windows, x["W"].astype(np.float64))
    for budget in (600, 1 << 20):
        np.testing.assert_allclose(interp.reference_outputs(op, x, memory_bytes=budget)["Y"], expect, rtol=1e-12)


# C3D of tvm.s_tir.meta_schedule.testing.te_workload.create_te_workload("C3D", 0), as tensorlang.data.translate
# writes it
C3D = """op c3d(inputs: f32[1, 16, 224, 224, 3], weight: f32[7, 7, 7, 3, 64]) -> conv3d_ndhwc: f32[1, 8, 112, 112, 64] {
    PadInput: f32[1, 22, 230, 230, 3]
    PadInput[i0, i1, i2, i3, i4] = inputs[i0, i1 - 3, i2 - 3, i3 - 3, i4] if 3 <= i1 < 19 and 3 <= i2 < 227 and 3 <= i3 < 227 else 0.0
    conv3d_ndhwc[n, d, h, w, co] += PadInput[n, d * 2 + rd, h * 2 + rh, w * 2 + rw, co // 64 * 3 + rc] * weight[rd, rh, rw, rc, co]
}
"""


@pytest.fixture(scope="module")
def c3d():
    op = op_of(C3D)
    return op, interp.random_inputs(op, seed=0)


def test_c3d_reference_stays_within_its_memory_budget(c3d):
    op, x = c3d
    conv = op.stages[1]
    grid = math.prod(i.extent for i in conv.loops)
    assert grid * 8 / 2 ** 30 > 49  # what one chunk of the whole grid took (the MemoryError)
    budget = 64 << 20
    for st in op.stages:
        assert interp.chunk_bytes(op, st, interp.plan_blocks(op, st, budget)) <= budget
    tracemalloc.start()
    try:
        out = interp.reference_outputs(op, x, memory_bytes=budget, max_seconds=0)["conv3d_ndhwc"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tensors = 8 * sum(math.prod(t.shape) for t in op.tensors.values())  # inputs, PadInput, output in float64
    assert peak <= budget + tensors, (peak / 2 ** 20, tensors / 2 ** 20)
    # one output point by hand
    P = np.pad(x["inputs"][0].astype(np.float64), ((3, 3), (3, 3), (3, 3), (0, 0)))
    d, h, w, co = 5, 101, 7, 40
    patch = P[d * 2:d * 2 + 7, h * 2:h * 2 + 7, w * 2:w * 2 + 7, :]
    assert abs(out[0, d, h, w, co] - np.sum(patch * x["weight"][..., co])) < 1e-9


def test_a_reference_over_its_time_limit_says_so_with_its_estimate(c3d, monkeypatch):
    op, x = c3d
    monkeypatch.setenv("TENSORLANG_REFERENCE_SECONDS", "0.3")
    monkeypatch.setenv("TENSORLANG_REFERENCE_MEMORY_MB", "4")  # small chunks: slow enough to pass 0.3 s
    t0 = time.monotonic()
    with pytest.raises(interp.ReferenceUnavailable) as err:
        interp.reference_outputs(op, x)
    assert time.monotonic() - t0 < 10  # it stopped early instead of running to the end
    e = err.value
    assert e.code == "TS408" and str(e).startswith("TS408 the NumPy reference would take about")
    assert "more than the 0.3 s it may take" in e.message and "TENSORLANG_REFERENCE_SECONDS" in e.message
    estimate = float(e.message.split("about ")[1].split(" s")[0])
    assert estimate >= 0.3  # over the limit (printed rounded: 0.30 when it was 0.301)


def test_a_reference_larger_than_memory_is_refused_up_front(monkeypatch):
    op = op_of("op big(X: f32[65536, 16384]) -> Y: f32[65536, 16384] {\n    Y[i, j] = X[i, j] + 1.0\n}\n")
    monkeypatch.setattr(interp, "_available_memory", lambda: 4 << 30)
    with pytest.raises(interp.ReferenceUnavailable) as err:
        interp.reference_outputs(op, {})  # refused before the inputs are read
    assert err.value.code == "TS407" and "16.0 GiB" in err.value.message and "4.0 GiB available" in err.value.message


SLOW = CPU + "op slow(X: f32[128, 65536]) -> S: f32[128] {\n    S[i] += exp(X[i, k]) * 0.5\n}\n"


def test_run_reports_an_unchecked_kernel_as_timed_but_not_ok(monkeypatch):
    monkeypatch.setenv("TENSORLANG_REFERENCE_SECONDS", "0.02")
    monkeypatch.setenv("TENSORLANG_REFERENCE_MEMORY_MB", "1")
    doc = api.load_text(SLOW)
    low = api.lower_op(doc, "slow", "cpu")
    r = api.run_lowered(low, repeat=1)
    assert not r.ok and r.message.startswith("unchecked: TS408 the NumPy reference would take about"), r.message
    assert r.median_ms > 0 and math.isnan(r.max_abs)
    monkeypatch.setenv("TENSORLANG_REFERENCE_SECONDS", "0")
    r = api.run_lowered(low, repeat=1)
    assert r.ok, r.message


def test_the_harness_records_an_unchecked_candidate(monkeypatch):
    from tensorlang.bench import Candidate, Harness
    from tensorlang.bench import command as C
    from tensorlang.bench.harness import STATUSES, UNCHECKED
    assert UNCHECKED in STATUSES
    monkeypatch.setenv("TENSORLANG_REFERENCE_SECONDS", "0.02")
    monkeypatch.setenv("TENSORLANG_REFERENCE_MEMORY_MB", "1")
    with Harness(jobs=1, threads=1) as h:
        [r] = h.measure([Candidate("unscheduled", SLOW, "cpu", None)], repeat=2, min_repeat_ms=5, timeout_s=30,
                        lock=False)
        assert r.status == UNCHECKED and not r.ok and r.correct is None, (r.status, r.message)
        assert "not checked against the NumPy reference: TS408" in r.message
        assert len(r.times_s) == 2 and r.median_s > 0  # timed all the same
        row = C.row_of(r)
        assert row["status"] == "unchecked" and row["correct"] is None and row["median_ms"] > 0
        monkeypatch.setenv("TENSORLANG_REFERENCE_SECONDS", "0")  # no limit: the same kernel is checked
        [r] = h.measure([Candidate("unscheduled", SLOW, "cpu", None)], repeat=1, min_repeat_ms=5, timeout_s=30,
                        lock=False)
        assert r.status == "ok" and r.correct is True, (r.status, r.message)
