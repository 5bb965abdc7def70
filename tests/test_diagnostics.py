"""Every diagnostic the checker emits, at its exact position, with its message and alternatives.

Each bad file is a reference example (or a small realistic file) with one thing changed; the
test asserts the expected (line, col, code) AND that no other error is reported, so a
cascade of follow-on errors from one mistake fails the test as much as a missing diagnostic.
Rules that need no TVM are checked with `legality=False`; schedule and GPU rules apply the
schedule with TVM (`legality=True`, CPU only -- no GPU is needed to check a CUDA schedule).
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorlang import api, interp
from tensorlang.parser import ast as A
from tensorlang.parser import parse

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.tsched"))
TENSORLANG = Path(sys.executable).parent / "tensorlang"


# ------------------------------------------------------------------ helpers
def example(name: str) -> str:
    return (EXAMPLES / f"{name}.tsched").read_text()


def matmul_op() -> str:
    """matmul.tsched without its schedules: its targets and its operator (lines 1-9)."""
    text = example("matmul")
    return text[:text.index("\nschedule")] + "\n"


def sub(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of `old` (the test is wrong if there is not exactly one)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def run_check(text: str, legality: bool = True):
    return api.check(api.load_text(text, "t.tsched"), legality=legality)


def diags(text: str, legality: bool = True) -> list[tuple[int, int, str]]:
    return [(d.span.line, d.span.col, d.code) for d in run_check(text, legality)]


def no_internal_errors(ds):
    assert not [d for d in ds if d.code == "TS900"], _show(ds)


def _show(ds) -> str:
    return "\n".join(f"  {d.span.line}:{d.span.col} {d.severity} {d.code} {d.message}" for d in ds) or "  (none)"


def expect_errors(text: str, expected, legality: bool = True):
    """The errors of `text` are exactly `expected` (a list of (line, col, code)); returns them in that order.

    Warnings and hints are allowed; any other error is a cascade or a spurious report and fails.
    """
    ds = run_check(text, legality)
    no_internal_errors(ds)
    errors = [d for d in ds if d.severity == "error"]
    got = sorted((d.span.line, d.span.col, d.code) for d in errors)
    assert got == sorted(expected), f"expected errors {sorted(expected)}, got:\n{_show(ds)}"
    out = []
    for want in expected:
        out.append(next(d for d in errors if (d.span.line, d.span.col, d.code) == tuple(want)))
    return out


def expect_one(text: str, line: int, col: int, code: str, fragment: str, legality: bool = True):
    """Exactly one error, `code` at line:col, whose message contains `fragment`."""
    (d,) = expect_errors(text, [(line, col, code)], legality)
    assert fragment in d.message, f"{fragment!r} not in {d.message!r}"
    assert "\n" not in d.message
    return d


# ============================================================ the examples
@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_examples_are_clean_without_legality(path):
    assert run_check(path.read_text(), legality=False) == []


# ================================================================== syntax
def test_ts001_unexpected_token_says_what_was_expected():
    text = sub(matmul_op(), "C[i, j] += A[i, k] * B[k, j]", "C[i, j] += A[i, k] * B[k, ]")
    d = expect_one(text, 8, 31, "TS001", "unexpected ']'", legality=False)
    assert "expected" in d.message
    assert "a name" in d.message and "a number" in d.message


def test_ts001_missing_comma_in_signature():
    text = sub(matmul_op(), "A: f32[512, 512], B:", "A: f32[512, 512] B:")
    d = expect_one(text, 7, 28, "TS001", "unexpected 'B'", legality=False)
    assert "expected" in d.message and "','" in d.message


def test_ts002_unexpected_character():
    text = sub(matmul_op(), "A[i, k] * B[k, j]", "A[i, k] $ B[k, j]")
    d = expect_one(text, 8, 24, "TS002", "unexpected character '$'", legality=False)
    assert "expected" in d.message


def test_ts002_unexpected_character_in_schedule():
    text = sub(example("matmul"), "    parallel(i0)\n", "    parallel(i0);\n")
    expect_one(text, 16, 17, "TS002", "unexpected character ';'", legality=False)


def test_ts003_unexpected_end_of_input_points_at_the_end():
    # The file stops right after `*` (no trailing newline): the input ends at line 4, column 25.
    text = ("target cpu = llvm(cores = 1)\n\n"
            "op matmul(A: f32[512, 512], B: f32[512, 512]) -> C: f32[512, 512] {\n"
            "    C[i, j] += A[i, k] *")
    d = expect_one(text, 4, 25, "TS003", "unexpected end of input", legality=False)
    assert "expected" in d.message


def test_ts003_missing_closing_brace_at_end_of_file():
    text = ("target cpu = llvm(cores = 1)\n\n"
            "op matmul(A: f32[512, 512], B: f32[512, 512]) -> C: f32[512, 512] {\n"
            "    C[i, j] += A[i, k] * B[k, j]\n")
    ds = run_check(text, legality=False)
    (d,) = [d for d in ds if d.severity == "error"]
    assert d.code == "TS003" and "'}'" in d.message
    # The input ends after the last token `]` (line 4, column 32): the diagnostic must not
    # point at that token, but at or after its end, and not past the end of the file.
    assert (4, 33) <= (d.span.line, d.span.col) <= (5, 1), f"TS003 at {d.span.line}:{d.span.col}"


@pytest.mark.parametrize("old,new,where", [
    ("C[i, j] += A[i, k] * B[k, j]", "C[i, j] += A[i, k] * B[k, ]", (8, 31, "TS001")),
    ("A[i, k] * B[k, j]", "A[i, k] $ B[k, j]", (8, 24, "TS002")),
    ("A: f32[512, 512], B:", "A: f32[512, 512] B:", (7, 28, "TS001")),
], ids=["TS001-body", "TS002", "TS001-header"])
def test_syntax_error_in_op_does_not_cascade_into_its_schedules(old, new, where):
    # The op's header names it `matmul`: its two schedules must not be reported as schedules
    # "for unknown operator 'matmul'; operators: none" on top of the one syntax error.
    expect_errors(sub(example("matmul"), old, new), [where], legality=False)


def test_syntax_error_in_first_op_does_not_hide_later_semantic_errors():
    text = """target cpu = llvm(cores = 1)

op matmul(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {
    C[i, j] += A[i, k] * B[k, ]
}

op add(A: f32[4], B: f32[4]) -> C: f32[4] {
    C[i] = A[i] + Bq[i]
}

op scale(A: f32[64]) -> C: f32[64] {
    C[i] = A[i] * 2.0
}

schedule scale on cpu {
    i0, i1 = split(C.i, [4, 8])
}
"""
    assert diags(text) == [(4, 31, "TS001"), (8, 19, "TS104"), (16, 25, "TS306")]
    assert diags(text, legality=False) == [(4, 31, "TS001"), (8, 19, "TS104")]
    errs = expect_errors(text, [(4, 31, "TS001"), (8, 19, "TS104"), (16, 25, "TS306")])
    assert "'Bq'" in errs[1].message


# ========================================================= names and declarations
def test_ts104_unknown_tensor_with_suggestion():
    text = sub(example("matmul"), "C[i, j] += A[i, k] * B[k, j]", "C[i, j] += A[i, k] * Bb[k, j]")
    d = expect_one(text, 8, 26, "TS104", "unknown tensor 'Bb'", legality=False)
    assert "B" in d.suggestions


def test_ts104_unknown_tensor_in_multi_stage_op():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = Ee[i, j] / S[i]")
    d = expect_one(text, 9, 15, "TS104", "unknown tensor 'Ee'", legality=False)
    assert d.suggestions and d.suggestions[0] == "E"


def test_ts102_unknown_target_kind():
    text = sub(matmul_op(), 'target h200 = cuda(arch = "sm_90")', 'target h200 = cudaa(arch = "sm_90")')
    d = expect_one(text, 5, 15, "TS102", "unknown target kind 'cudaa'", legality=False)
    assert "cuda" in d.suggestions and "llvm" in d.suggestions


def test_ts102_does_not_cascade_into_its_schedules():
    # Only the kind is wrong: the schedule on h200 must not also be reported as naming an unknown target.
    text = sub(example("matmul"), 'target h200 = cuda(arch = "sm_90")', 'target h200 = cudaa(arch = "sm_90")')
    expect_one(text, 5, 15, "TS102", "unknown target kind 'cudaa'", legality=False)


def test_ts103_unknown_target_parameter():
    text = sub(example("matmul"), 'llvm()', 'llvm(mcpuu = "sapphirerapids", cores = 2)')
    d = expect_one(text, 4, 19, "TS103", "no parameter 'mcpuu'", legality=False)
    assert "mcpu" in d.suggestions


def test_ts103_ill_typed_target_parameter():
    text = sub(example("matmul"), "llvm()", 'llvm(cores = "two")')
    expect_one(text, 4, 27, "TS103", "'cores' must be an integer", legality=False)


def test_ts103_bad_cuda_arch_points_at_the_value():
    # The arch's value is what is wrong, like any other bad parameter value (cf. `cores = "two"`).
    text = sub(matmul_op(), 'target h200 = cuda(arch = "sm_90")', 'target h200 = cuda(arch = "90")')
    expect_one(text, 5, 27, "TS103", "cuda arch must look like sm_90, not '90'", legality=False)


def test_ts105_unknown_dtype():
    text = sub(example("matmul"), "A: f32[512, 512], B", "A: f33[512, 512], B")
    d = expect_one(text, 7, 14, "TS105", "unknown dtype 'f33'", legality=False)
    assert "f32" in d.suggestions


def test_ts106_schedule_for_unknown_op():
    text = sub(example("matmul"), "schedule matmul on cpu {", "schedule matmull on cpu {")
    d = expect_one(text, 11, 10, "TS106", "unknown operator 'matmull'", legality=False)
    assert "matmul" in d.suggestions


def test_ts107_unknown_target_in_schedule():
    text = sub(example("matmul"), "schedule matmul on cpu {", "schedule matmul on cpuu {")
    d = expect_one(text, 11, 20, "TS107", "unknown target 'cpuu'", legality=False)
    assert "cpu" in d.suggestions


def test_ts108_unknown_function():
    text = sub(example("dense_gelu"), "(1.0 + erf(T[i, j]", "(1.0 + erff(T[i, j]")
    d = expect_one(text, 9, 38, "TS108", "unknown function 'erff'", legality=False)
    assert "erf" in d.suggestions


def test_ts101_duplicate_op():
    text = example("matmul") + """
op matmul(A: f32[4, 4], B: f32[4, 4]) -> C: f32[4, 4] {
    C[i, j] += A[i, k] * B[k, j]
}
"""
    expect_one(text, 44, 4, "TS101", "op 'matmul' is already defined at line 7", legality=False)


def test_ts101_duplicate_target():
    text = sub(example("matmul"), 'target h200 = cuda(arch = "sm_90")\n',
               'target h200 = cuda(arch = "sm_90")\ntarget cpu = llvm(cores = 4)\n')
    expect_one(text, 6, 8, "TS101", "target 'cpu' is already defined at line 4", legality=False)


def test_ts101_duplicate_tensor_parameter():
    text = sub(example("matmul"), "B: f32[512, 512])", "A: f32[512, 512])")
    expect_one(text, 7, 29, "TS101", "tensor 'A' is already declared", legality=False)


def test_ts111_duplicate_schedule():
    text = example("matmul") + """
schedule matmul on cpu {
    parallel(C.i)
}
"""
    expect_one(text, 44, 1, "TS111", "already has a schedule on 'cpu' (line 11)", legality=False)


# ============================================================ stages, indices, shapes
def test_ts201_index_arity_mismatch():
    text = sub(example("matmul"), "A[i, k] * B[k, j]", "A[i, k] * B[k]")
    expect_one(text, 8, 26, "TS201", "'B' has 2 dimensions; 1 subscript given", legality=False)


def test_ts201_left_hand_side_arity():
    text = sub(example("softmax"), "S[i] += E[i, k]", "S[i, j] += E[i, k]")
    text = sub(text, "    S[i, j] += E[i, k]\n", "    S: f32[128]\n    S[i, j] += E[i, k]\n")
    d = expect_one(text, 9, 5, "TS201", "2 subscripts given", legality=False)
    assert d.message.startswith("'S' has 1 dimension")


def test_ts202_declared_shape_disagrees_with_inferred_extent():
    text = sub(example("matmul"), "-> C: f32[512, 512]", "-> C: f32[512, 256]")
    d = expect_one(text, 8, 31, "TS202", "index 'j' has extent 256", legality=False)
    assert "512" in d.message


def test_ts202_inner_dimensions_disagree():
    text = sub(example("matmul"), "op matmul(A: f32[512, 512]", "op matmul(A: f32[512, 256]")
    expect_one(text, 8, 28, "TS202", "index 'k' has extent 256 from A's dimension 1 but 512 from B's dimension 0",
               legality=False)


def test_ts203_constant_index_out_of_range():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / S[128]")
    expect_one(text, 9, 27, "TS203", "constant index 128 is out of range for S's dimension 0", legality=False)


def test_ts204_reduction_operator_on_elementwise_stage():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] += E[i, j] / S[i]")
    d = expect_one(text, 9, 13, "TS204", "'+=' needs a reduction index", legality=False)
    assert "=" in d.suggestions


def test_ts205_free_index_on_the_right_of_plain_assignment():
    text = sub(example("matmul"), "C[i, j] += A[i, k]", "C[i, j] = A[i, k]")
    d = expect_one(text, 8, 20, "TS205", "index 'k' occurs only on the right of a plain '=' stage", legality=False)
    assert any("+=" in s for s in d.suggestions)


def test_ts206_extent_cannot_be_inferred_without_declaration():
    # conv2d without `P: f32[...]`: h and w only occur inside expressions. The diagnostic points at
    # each index's first appearance in the text: `h - 1` (col 29) and `w - 1` (col 36), which come
    # before the condition `1 <= h < 57 and 1 <= w < 57`.
    text = sub(example("conv2d"), "    P: f32[1, 64, 58, 58]\n", "")
    ds = run_check(text, legality=False)
    got = [(d.span.line, d.span.col, d.code) for d in ds if d.code == "TS206"]
    assert got == [(9, 29, "TS206"), (9, 36, "TS206")], _show(ds)
    h, w = [d for d in ds if d.code == "TS206"]
    assert "index 'h' cannot be inferred" in h.message and "P: f32[...]" in h.message
    assert "index 'w' cannot be inferred" in w.message
    # (that Y's read of P is not also reported: test_failed_stage_does_not_cascade_into_unknown_tensor)


@pytest.mark.parametrize("name,old,new,code,tensor", [
    # T's `=` should be `+=`: one TS205; Y's two reads of T must not become "unknown tensor 'T'".
    ("dense_gelu", "T[i, j] += X[i, k]", "T[i, j] = X[i, k]", "TS205", "T"),
    # a typo in S's stage: Y's read of S must not become "unknown tensor 'S'".
    ("softmax", "S[i] += E[i, k]", "S[i] += Ee[i, k]", "TS104", "S"),
    # conv2d without P's declaration: Y's read of P must not become "unknown tensor 'P'".
    ("conv2d", "    P: f32[1, 64, 58, 58]\n", "", "TS206", "P"),
], ids=["TS205-dense_gelu", "TS104-softmax", "TS206-conv2d"])
def test_failed_stage_does_not_cascade_into_unknown_tensor(name, old, new, code, tensor):
    ds = run_check(sub(example(name), old, new), legality=False)
    errors = [d for d in ds if d.severity == "error"]
    assert {d.code for d in errors} == {code}, _show(ds)
    assert not [d for d in errors if f"unknown tensor '{tensor}'" in d.message], _show(ds)


def test_reduction_loops_follow_first_appearance_through_a_conditional():
    # "reduction loops follow their first appearance on the right": c, r, s -- also when the
    # padding guard (which mentions r and s) is written after the access, as `a if cond else b`.
    text = """op conv2d(X: f32[1, 64, 56, 56], W: f32[64, 64, 3, 3]) -> Y: f32[1, 64, 56, 56] {
    Y[n, f, y, x] += (X[n, c, y + r - 1, x + s - 1] if 1 <= y + r < 57 and 1 <= x + s < 57 else 0.0) * W[f, c, r, s]
}
"""
    doc = api.load_text(text, "t.tsched")
    assert api.check(doc, legality=False) == []
    (stage,) = doc.model.ops["conv2d"].stages
    assert [ix.name for ix in stage.spatial] == ["n", "f", "y", "x"]
    assert [ix.name for ix in stage.reduce] == ["c", "r", "s"]


def test_ts214_index_range_out_of_bounds():
    text = sub(example("conv2d"), " if 1 <= h < 57 and 1 <= w < 57 else 0.0", "")
    h, w = expect_errors(text, [(10, 29, "TS214"), (10, 36, "TS214")], legality=False)
    assert "index h - 1 ranges over -1..56 but X's dimension 2 has extent 56" in h.message
    assert "w - 1" in w.message


def test_ts214_reduction_window_past_the_edge():
    text = sub(example("conv2d"), "P: f32[1, 64, 58, 58]", "P: f32[1, 64, 58, 57]")
    text = sub(text, "1 <= w < 57", "1 <= w < 56")
    expect_one(text, 11, 37, "TS214", "index x + s ranges over 0..57 but P's dimension 3 has extent 57",
               legality=False)


# ------------------------------------------- the other name and stage rules
def test_ts109_wrong_number_of_arguments():
    text = sub(example("dense_gelu"), "erf(T[i, j] * 0.7071067811865476)", "erf(T[i, j], 0.7071067811865476)")
    expect_one(text, 9, 38, "TS109", "erf takes 1 argument; 2 given", legality=False)


def test_ts110_unknown_decorator():
    text = sub(example("auto"), "@auto\nop layernorm", "@autoo\nop layernorm")
    expect_one(text, 10, 1, "TS110", "unknown decorator '@autoo'", legality=False)


def test_ts207_tensor_used_before_it_is_computed():
    # Stages out of order: T is an (undeclared) intermediate computed by the next stage.
    text = """op f(X: f32[4]) -> Y: f32[4] {
    Y[i] = X[i] + T[i]
    T[i] = X[i] * 2.0
}
"""
    expect_one(text, 2, 19, "TS207", "'T' is used before the stage that computes it", legality=False)


def test_ts207_declared_tensor_used_before_it_is_computed():
    text = """op f(X: f32[4]) -> Y: f32[4] {
    T: f32[4]
    Y[i] = X[i] + T[i]
    T[i] = X[i] * 2.0
}
"""
    expect_one(text, 3, 19, "TS207", "'T' is used before the stage that computes it", legality=False)


def test_ts207_stage_reads_its_own_output():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / S[i] + Y[i, j]")
    expect_one(text, 9, 32, "TS207", "stage 'Y' reads its own output", legality=False)


def test_ts208_tensor_written_twice():
    text = sub(example("softmax"), "    S[i] += E[i, k]\n", "    E[i, j] = X[i, j]\n    S[i] += E[i, k]\n")
    expect_one(text, 8, 5, "TS208", "'E' is already computed", legality=False)


def test_ts209_output_never_computed():
    text = sub(example("softmax"), "    Y[i, j] = E[i, j] / S[i]\n", "")
    expect_one(text, 5, 34, "TS209", "output 'Y' is never computed", legality=False)


def test_ts210_dtype_mismatch():
    text = sub(matmul_op(), "op matmul(A: f32[512, 512]", "op matmul(A: f16[512, 512]")
    d = expect_one(text, 8, 16, "TS210", "'*' between f16 and f32", legality=False)
    assert "f16(...)" in d.message


def test_ts211_float_subscript_reported_once():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / S[1.5]")
    expect_one(text, 9, 27, "TS211", "subscripts must be integers", legality=False)


def test_ts211_tensor_without_subscripts():
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / S")
    expect_one(text, 9, 25, "TS211", "tensor 'S' used without subscripts", legality=False)


def test_ts212_unused_declaration_is_a_warning():
    text = sub(example("softmax"), "    M[i] max= X[i, k]\n", "    Z: f32[128]\n    M[i] max= X[i, k]\n")
    ds = run_check(text, legality=False)
    assert [(d.span.line, d.span.col, d.code, d.severity) for d in ds] == [(6, 5, "TS212", "warning")]
    assert "'Z' is declared but never computed" in ds[0].message


def test_ts213_repeated_left_hand_side_index():
    text = sub(matmul_op(), "C[i, j] +=", "C[i, i] +=")
    expect_one(text, 8, 10, "TS213", "index 'i' appears twice on the left-hand side", legality=False)


def test_ts203_negative_constant_index():
    # `-1` is a constant index as much as `128` is.
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / S[-1]")
    expect_one(text, 9, 27, "TS203", "constant index -1 is out of range for S's dimension 0", legality=False)


def test_power_operator_parses_and_checks():
    # `**` is in the grammar (POW_OP), the printer, the interpreter and the lowering.
    text = sub(example("auto"), "S2[i] += X[i, k] * X[i, k]", "S2[i] += X[i, k] ** 2")
    module, syntax = parse(text)
    assert syntax == [], syntax
    rhs = module.ops[1].stages[1].rhs
    assert isinstance(rhs, A.BinOp) and rhs.op == "**"
    assert run_check(text, legality=False) == []


# ================================================================ chained comparisons
PAD = """target cpu = llvm(cores = 1)

op pad(X: f32[6, 6]) -> P: f32[8, 8] {
    P[h, w] = X[h - 1, w - 1] if 1 <= h < 7 and 1 <= w < 7 else 0.0
}
"""


def test_chained_comparison_parses_as_one_compare_with_two_ops():
    module, ds = parse(PAD)
    assert ds == []
    (stage,) = module.ops[0].stages
    cond = stage.rhs.cond
    assert isinstance(cond, A.BoolOp) and cond.op == "and"
    first = cond.values[0]
    assert isinstance(first, A.Compare)
    assert first.ops == ("<=", "<")
    assert first.operands == (A.Num("1"), A.Var("h"), A.Num("7"))


def test_chained_comparison_reference_is_python_semantics():
    doc = api.load_text(PAD, "t.tsched")
    assert api.check(doc, legality=False) == []
    op = doc.model.ops["pad"]
    x = interp.random_inputs(op, seed=3)
    p = interp.reference_outputs(op, x)["P"]
    expected = np.zeros((8, 8))
    expected[1:7, 1:7] = x["X"]
    np.testing.assert_array_equal(p, expected)


def test_chained_comparison_compiled_kernel_pads_with_zeros_at_the_border():
    import tvm

    from tensorlang.lower.build import compile_module
    from tensorlang.lower.targets import tvm_target

    doc = api.load_text(PAD, "t.tsched")
    low = api.lower_op(doc, "pad", "cpu")
    assert low.ok, _show(low.diagnostics)
    result = api.run_lowered(low, repeat=1)
    assert result.ok and result.max_abs == 0.0, result
    # Run it once more on an output pre-filled with garbage, so zeros at the border are written, not left over.
    op = low.op
    x = interp.random_inputs(op, seed=1)["X"]
    lib = compile_module(low.mod, tvm_target(low.target))
    dev = tvm.cpu(0)
    out = tvm.runtime.tensor(np.full((8, 8), 7.0, dtype="float32"), dev)
    lib["main"](tvm.runtime.tensor(x, dev), out)
    p = out.numpy()
    border = np.ones((8, 8), dtype=bool)
    border[1:7, 1:7] = False
    assert (p[border] == 0.0).all(), p
    np.testing.assert_array_equal(p[1:7, 1:7], x)


# ================================================================== schedules
def test_ts301_unknown_primitive_with_suggestion():
    text = sub(example("matmul"), "    parallel(i0)\n", "    paralel(i0)\n")
    d = expect_one(text, 16, 5, "TS301", "unknown schedule primitive 'paralel'", legality=False)
    assert "parallel" in d.suggestions and "did you mean parallel" in d.message


def test_ts302_bind_to_unknown_thread_axis_lists_the_legal_ones():
    text = sub(example("matmul"), "bind(tx, threadIdx.x)", "bind(tx, threadIdx.w)")
    d = expect_one(text, 28, 14, "TS302", "must be a thread axis", legality=False)
    for axis in ("blockIdx.x", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread.x"):
        assert axis in d.message and axis in d.suggestions


def test_ts302_cache_read_with_unknown_scope():
    text = sub(example("matmul"), "AS = cache_read(C, A, shared)", "AS = cache_read(C, A, sharedd)")
    d = expect_one(text, 31, 27, "TS302", "must be a storage scope", legality=False)
    assert "shared" in d.suggestions and "local" in d.suggestions


def test_ts302_missing_argument():
    text = sub(example("matmul"), "    parallel(i0)\n", "    parallel()\n")
    expect_one(text, 16, 5, "TS302", "parallel is missing its 'loop' argument", legality=False)


def test_ts303_unknown_stage():
    text = sub(example("conv2d"), "compute_inline(P)", "compute_inline(Q)")
    d = expect_one(text, 15, 20, "TS303", "unknown stage 'Q'")
    assert "P" in d.message and "Y" in d.message


def test_ts304_unknown_loop_lists_the_stages_loops():
    text = sub(example("matmul"), "i0, i1, i2 = split(C.i, [16, 4, 8])", "i0, i1, i2 = split(C.q, [16, 4, 8])")
    d = expect_one(text, 12, 24, "TS304", "stage C has no loop 'q'")
    for loop in ("C.i", "C.j", "C.k"):
        assert loop in d.message


def test_ts305_loop_no_longer_exists_after_fuse():
    text = sub(example("matmul"), "    parallel(i0)\n", "    ij = fuse(i0, j0)\n    parallel(i0)\n")
    expect_one(text, 17, 14, "TS305", "loop 'i0' no longer exists: line 16 (fuse) removed it")


def test_ts306_split_factors_do_not_cover_extent():
    text = sub(example("matmul"), "split(C.i, [16, 4, 8])", "split(C.i, [16, 4, 4])")
    d = expect_one(text, 12, 29, "TS306", "multiply to 256, less than the loop's extent 512")
    assert d.suggestions
    for s in d.suggestions:
        factors = [int(f) for f in s.strip("[]").split(",")]
        assert len(factors) == 3 and math.prod(factors) == 512, s


def test_ts307_reorder_across_stages():
    # Before compute_at, S and Y are separate nests: a loop of S cannot be reordered with one of Y.
    text = sub(example("softmax"), "    parallel(Y.i)\n", "    reorder(S.k, Y.j)\n    parallel(Y.i)\n")
    d = expect_one(text, 13, 18, "TS307", "reorder of loops from different stages")
    assert "S.k is a loop of S" in d.message and "Y.j of Y" in d.message


def test_ts308_parallel_of_reduction_loop():
    text = sub(example("matmul"), "    i0, i1, i2 = split(C.i, [16, 4, 8])\n",
               "    parallel(C.k)\n    i0, i1, i2 = split(C.i, [16, 4, 8])\n")
    expect_one(text, 12, 14, "TS308", "cannot parallel C.k: it is a reduction loop of C")


def test_ts308_vectorize_of_reduction_loop():
    text = sub(example("matmul"), "    vectorize(j2)\n", "    vectorize(k1)\n")
    expect_one(text, 17, 15, "TS308", "cannot vectorize k1: it is a reduction loop of C")


def test_ts309_illegal_compute_at_lists_legal_locations():
    text = sub(example("softmax"), "compute_at(S, Y.i)", "compute_at(S, M.i)")
    d = expect_one(text, 14, 19, "TS309", "cannot compute_at(S, M.i)")
    assert "legal locations: Y.i, Y.j" in d.message
    assert set(d.suggestions) == {"Y.i", "Y.j"}
    # The suggestions really are legal: each one, substituted, checks cleanly.
    for site in d.suggestions:
        fixed = sub(example("softmax"), "compute_at(S, Y.i)", f"compute_at(S, {site})")
        assert [x for x in run_check(fixed) if x.severity == "error"] == []


def test_ts310_tvm_error_is_condensed():
    text = sub(example("matmul"), "    vectorize(j2)\n", "    compute_inline(C)\n")
    d = expect_one(text, 17, 5, "TS310", "compute_inline:")
    assert "\n" not in d.message and len(d.message) < 400


def test_tvm_messages_name_no_raw_ir_objects():
    # compute_at(S, Y.j) is legal (S recomputed per j); moving S back up to Y.i is not. The message
    # is TVM's, condensed: it must not leak IR object names such as `tirx.For#1` or `SBlock#0`.
    text = sub(example("softmax"), "    parallel(Y.i)\n", "    parallel(Y.i)\n    compute_at(S, Y.j)\n")
    (d,) = expect_errors(text, [(15, 19, "TS309")])
    assert not re.search(r"\w+\.\w+#\d+", d.message), d.message
    assert "\n" not in d.message and len(d.message) < 400


def test_tvm_messages_name_the_stages_they_mean():
    # TVM names the consumers as IR objects run together (`s_tir.SBlock#0s_tir.SBlock#1`); the dump
    # above the message says which block each is.
    text = sub(example("softmax"), "    parallel(Y.i)\n", "    parallel(Y.i)\n    compute_at(M, Y.i)\n")
    d = expect_one(text, 14, 19, "TS309", "List of the consumer(s): 'E'; legal locations: E.i, E.j")
    text = sub(example("softmax"), "    parallel(Y.i)\n", "    parallel(Y.i)\n    compute_at(S, Y.j)\n")
    expect_one(text, 15, 19, "TS309", "Expected the block 'S' and loop 'i' to be under the same block scope")


def test_ts216_a_stage_nothing_reads_is_left_out_and_a_schedule_naming_it_is_an_error():
    # Found by test_fuzz: Y divides by M, so S is read by nothing; TVM builds no block S and naming it
    # was an internal error (TS900).
    text = sub(example("softmax"), "Y[i, j] = E[i, j] / S[i]", "Y[i, j] = E[i, j] / M[i]")
    ds = run_check(text)
    assert [(d.span.line, d.span.col, d.code, d.severity) for d in ds] == [
        (8, 5, "TS216", "warning"), (14, 16, "TS303", "error")]
    assert ds[0].message == "'S' is computed but nothing reads it: the kernel leaves it out (a schedule cannot name it)"
    assert ds[1].message == "stage 'S' is not in the kernel: nothing reads it (line 8); stages: M, E or Y"
    doc = api.load_text(text, "t.tsched")
    assert [s.tensor for s in doc.model.ops["softmax"].stages] == ["M", "E", "Y"]
    # without the statement that names S, the schedule applies and computes what NumPy does
    fixed = sub(text, "    compute_at(S, Y.i)\n", "")
    assert [d.code for d in run_check(fixed)] == ["TS216"]
    import tvm

    from tensorlang.lower.build import compile_module
    from tensorlang.lower.targets import tvm_target
    low = api.lower_op(api.load_text(fixed, "t.tsched"), "softmax", "cpu")
    assert low.ok, _show(low.diagnostics)
    x = np.random.default_rng(0).standard_normal((128, 1024)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((128, 1024), "float32"), tvm.cpu(0))
    compile_module(low.mod, tvm_target(low.target))["main"](tvm.runtime.tensor(x, tvm.cpu(0)), out)
    m = x.max(axis=1, keepdims=True)
    np.testing.assert_allclose(out.numpy(), np.exp(x - m) / m, rtol=1e-5)


def test_ts312_wrong_number_of_names_bound():
    text = sub(example("matmul"), "k0, k1 = split(C.k, [128, 4])", "k0, k1, k2 = split(C.k, [128, 4])")
    expect_one(text, 14, 5, "TS312", "split into 2 loops binds 2 names; 3 given", legality=False)


def test_ts312_names_bound_to_primitive_returning_nothing():
    text = sub(example("matmul"), "    parallel(i0)\n", "    p = parallel(i0)\n")
    expect_one(text, 16, 5, "TS312", "parallel returns nothing", legality=False)


def test_ts313_unknown_buffer():
    text = sub(example("matmul"), "AS = cache_read(C, A, shared)", "AS = cache_read(C, X, shared)")
    d = expect_one(text, 31, 24, "TS313", "stage C reads no buffer 'X'")
    assert set(d.suggestions) == {"A", "B"}


def test_schedule_stops_at_its_first_error_but_other_schedules_continue():
    text = sub(example("matmul"), "split(C.i, [16, 4, 8])", "split(C.i, [16, 4, 4])")
    text = sub(text, "bind(tx, threadIdx.x)", "bind(tx, threadIdx.w)")
    expect_errors(text, [(12, 29, "TS306"), (28, 14, "TS302")])


# ====================================================================== GPU
def test_ts401_unbound_stage_on_cuda():
    text = sub(example("matmul"), "    bind(tx, threadIdx.x)\n", "")
    ds = [d for d in run_check(text) if d.severity == "error"]
    assert ds and {d.code for d in ds} == {"TS401"}, _show(ds)
    assert {(d.span.line, d.span.col) for d in ds} == {(20, 1)}
    # One diagnostic naming every unbound stage, not one per TVM block.
    assert len(ds) == 1, _show(ds)
    assert ds[0].message.startswith("stages C_init, C, CL are not under a threadIdx.* loop"), ds[0].message


def test_ts402_thread_limit():
    text = """target h200 = cuda(arch = "sm_90")

op add(A: f32[4096], B: f32[4096]) -> C: f32[4096] {
    C[i] = A[i] + B[i]
}

schedule add on h200 {
    i0, i1 = split(C.i, [2, 2048])
    bind(i0, blockIdx.x)
    bind(i1, threadIdx.x)
}
"""
    d, fix = expect_errors(text, [(7, 1, "TS402"), (8, 25, "TS402")])
    assert "2048 threads" in d.message and "at most 1024 per block" in d.message
    # the split that makes the thread loop gets the nearest legal factors, as a fix
    assert "factor 1 (2048) is bound to threadIdx.x" in fix.message and "at most 1024" in fix.message
    assert fix.suggestions == ("[4, 1024]", "[8, 512]", "[16, 256]")


def test_ts402_thread_fix_keeps_the_other_axes_and_follows_fuse():
    text = """target g = cuda(arch = "sm_90")

op mm(A: f32[512, 512], B: f32[512, 512]) -> C: f32[512, 512] {
    C[i, j] += A[i, k] * B[k, j]
}

schedule mm on g {
    i0, i1 = split(C.i, [None, 64])
    j0, j1 = split(C.j, [None, 32])
    reorder(i0, j0, i1, j1)
    b = fuse(i0, j0)
    bind(b, blockIdx.x)
    t = fuse(i1, j1)
    bind(t, threadIdx.x)
}
"""
    _, fi, fj = expect_errors(text, [(7, 1, "TS402"), (8, 25, "TS402"), (9, 25, "TS402")])
    assert "at most 32" in fi.message and fi.suggestions == ("[None, 32]", "[None, 16]", "[None, 8]")
    assert "at most 16" in fj.message and fj.suggestions == ("[None, 16]", "[None, 8]", "[None, 4]")


def test_ts402_respects_a_declared_lower_limit():
    text = """target small = cuda(arch = "sm_90", max_threads_per_block = 256)

op add(A: f32[4096], B: f32[4096]) -> C: f32[4096] {
    C[i] = A[i] + B[i]
}

schedule add on small {
    i0, i1 = split(C.i, [8, 512])
    bind(i0, blockIdx.x)
    bind(i1, threadIdx.x)
}
"""
    d, fix = expect_errors(text, [(7, 1, "TS402"), (8, 25, "TS402")])
    assert "512 threads" in d.message and "at most 256 per block" in d.message
    assert fix.suggestions == ("[16, 256]", "[32, 128]", "[64, 64]")


# ============================================================ all at once
def test_independent_problems_are_all_reported_at_once():
    text = """target cpu = llvm(cores = 1)

op add(A: f32[4], B: f32[4]) -> C: f32[4] {
    C[i] = A[i] + Bb[i]
}

op scale(A: f32[4]) -> C: f32[4] {
    C[i] = A[i] * 2.0 + A[4]
}

op matmul(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {
    C[i, j] += A[i, k] * B[k, j]
}

schedule matmul on cpu {
    i0, i1 = split(C.i, [4, 8])
    parallel(i0)
}
"""
    expect_errors(text, [(4, 19, "TS104"), (8, 27, "TS203"), (16, 25, "TS306")])


def test_all_problems_of_one_example_reported_at_once():
    text = sub(example("matmul"), "B: f32[512, 512]) ->", "B: f32[512, 512], ) ->")  # legal trailing comma
    text = sub(text, 'target h200 = cuda(arch = "sm_90")', 'target h200 = cuda(arch = "sm_90", sms = 0)')
    text = sub(text, "    parallel(i0)\n", "    parallel(C.q)\n")
    text = sub(text, "bind(tx, threadIdx.x)", "bind(tx, threadIdx.w)")
    errs = expect_errors(text, [(5, 42, "TS103"), (16, 14, "TS304"), (28, 14, "TS302")])
    assert "'sms' must be positive" in errs[0].message


# ===================================================================== CLI
BAD = """target cpu = llvm(cores = 1)

op add(A: f32[4], B: f32[4]) -> C: f32[4] {
    C[i] = A[i] + Bb[i]
}

op matmul(A: f32[64, 64], B: f32[64, 64]) -> C: f32[64, 64] {
    C[i, j] += A[i, k] * B[k, j]
}

schedule matmul on cpu {
    i0, i1 = split(C.i, [4, 8])
}

schedule matmul on cpuu {
    parallel(C.i)
}
"""


def _cli(*args, cwd):
    return subprocess.run([str(TENSORLANG), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_check_prints_sorted_diagnostics_and_exits_1(tmp_path):
    (tmp_path / "bad.tsched").write_text(BAD)
    r = _cli("check", "bad.tsched", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines == [
        "bad.tsched:4:19: error: TS104 unknown tensor 'Bb'; tensors: A, B or C",
        "bad.tsched:12:25: error: TS306 split factors [4, 8] multiply to 32, less than the loop's extent 64",
        "bad.tsched:15:20: error: TS107 unknown target 'cpuu'; targets: cpu, cuda or llvm",
    ]
    for line in lines:
        assert re.fullmatch(r"bad\.tsched:\d+:\d+: error: TS\d{3} .+", line)
    assert "Traceback" not in r.stderr


def test_cli_check_without_legality(tmp_path):
    (tmp_path / "bad.tsched").write_text(BAD)
    r = _cli("check", "--no-legality", "bad.tsched", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines() == [
        "bad.tsched:4:19: error: TS104 unknown tensor 'Bb'; tensors: A, B or C",
        "bad.tsched:15:20: error: TS107 unknown target 'cpuu'; targets: cpu, cuda or llvm",
    ]


def test_cli_check_syntax_error(tmp_path):
    (tmp_path / "syn.tsched").write_text("op f(A: f32[4]) -> B: f32[4] {\n    B[i] = A[i] $ 1.0\n}\n")
    r = _cli("check", "syn.tsched", cwd=tmp_path)
    assert r.returncode == 1
    (line,) = r.stdout.splitlines()
    assert line.startswith("syn.tsched:2:17: error: TS002 unexpected character '$'")


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_cli_check_examples_clean(path, tmp_path):
    r = _cli("check", str(path), cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, ""), r.stdout + r.stderr


def test_ts402_vector_width_on_gpu_names_the_split_to_change():
    text = """target g = cuda(arch = "sm_90")

op add(A: f32[4096], B: f32[4096]) -> C: f32[4096] {
    C[i] = A[i] + B[i]
}

schedule add on g {
    i0, i1, i2 = split(C.i, [16, 32, 8])
    bind(i0, blockIdx.x)
    bind(i1, threadIdx.x)
    vectorize(i2)
}
"""
    (d,) = expect_errors(text, [(8, 29, "TS402")])
    assert "8 lanes of 4 bytes" in d.message and "at most 4 lanes" in d.message
    assert d.suggestions == ("[16, 64, 4]", "[32, 32, 4]", "[8, 128, 4]")  # perfect, nearest first


# ------------------------------------------- a GPU check that cannot run must not pass
def _our_lowering_fails(monkeypatch):
    """The project's own lowering passes raising (as on IR they do not handle): the shared bytes they
    count are unknown, so the check falls back to TVM's compile pipeline."""
    from tensorlang.lower import gpu

    def fail(func):
        raise RuntimeError("a lowering pass failed")
    monkeypatch.setattr(gpu, "_lowered", fail)


def test_gpu_limits_are_verified_on_tvms_compiled_kernels_when_our_lowering_fails(monkeypatch):
    _our_lowering_fails(monkeypatch)
    assert [d for d in run_check(example("matmul")) if d.severity == "error"] == []  # compiled, verified: legal
    # 2 x 4 KiB of shared tiles: our own count is unknown now, the compiled kernel is what is verified.
    text = sub(example("matmul"), 'cuda(arch = "sm_90")', 'cuda(arch = "sm_90", max_shared_memory_per_block = 4096)')
    errors = [d for d in run_check(text) if d.severity == "error"]
    assert [(d.code, d.span.line) for d in errors] == [("TS402", 20)], _show(errors)  # the schedule
    assert "VerifyGPUCode rejects the compiled kernel main_kernel" in errors[0].message


def test_gpu_check_is_an_error_when_tvm_cannot_compile_either(monkeypatch):
    from tvm.script import tirx as T
    from tensorlang.lower.gpu import check_gpu_limits

    @T.prim_func(s_tir=True)
    def f(A: T.Buffer((128, 16), "float32"), C: T.Buffer((128, 16), "float32")):
        for bx in T.thread_binding(128, thread="blockIdx.x"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                # Three pipeline stages for two statements: TVM's InjectSoftwarePipeline refuses it.
                for i in T.serial(1, annotations={"software_pipeline_stage": [0, 1, 2],
                                                  "software_pipeline_order": [0, 1, 2]}):
                    with T.sblock("outer"):
                        T.reads(A[bx, tx])
                        T.writes(C[bx, tx])
                        B = T.sblock_alloc_buffer((1,), "float32", scope="shared")
                        with T.sblock("b"):
                            B[0] = A[bx, tx] * T.float32(2)
                        with T.sblock("c"):
                            C[bx, tx] = B[0] + T.float32(1)

    _our_lowering_fails(monkeypatch)
    (d,) = check_gpu_limits(f, {"arch": "sm_90"}, None)
    assert d.code == "TS406" and d.message.startswith("TVM could not compile this schedule for sm_90: ")
    assert "pipeline annotation is (0, 1, 2) with different size" in d.message and "\n" not in d.message
