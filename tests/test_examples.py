"""The reference examples are the language's acceptance tests: they parse, round-trip,
format back byte for byte, check cleanly, lower, and run correctly on this CPU."""
import re
import shutil

import numpy as np
import pytest

from tensorlang import api, interp
from tensorlang.parser import ast as A
from tensorlang.parser import format_module, parse

from conftest import EXAMPLES, ROOT


def test_examples_are_the_shared_reference_files(example):
    shared = ROOT.parent / "shared" / "tsched" / example.name
    if not shared.exists():
        pytest.skip("../shared/tsched is not beside this checkout")
    assert example.read_text() == shared.read_text()


def test_parses_without_diagnostics(example):
    module, diags = parse(example.read_text())
    assert diags == []
    assert module.items


def test_round_trip(example):
    module, _ = parse(example.read_text())
    again, diags = parse(format_module(module))
    assert diags == [] and again == module


def test_fmt_is_identity_on_examples(example):
    text = example.read_text()
    assert format_module(parse(text)[0]) == text


_TOKEN = re.compile(r'"[^"]*"|->|\+=|max=|min=|<=|>=|==|!=|\*\*|//|[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:[eE][+-]?\d+)?|\S')


def _misformat(text: str) -> str:
    """Deliberately mangle whitespace, token by token: indentation, spacing (none, or several spaces
    between tokens where the language allows), statements spread over lines, doubled blank lines."""
    out = []
    for n, line in enumerate(text.split("\n")):
        if line.lstrip().startswith("#"):
            out.append(("\t" if n % 2 else "  ") + line.strip() + "   ")
            continue
        code, comment = (line.split("  #", 1) + [None])[:2]
        toks = _TOKEN.findall(code)
        pieces = []
        for k, tok in enumerate(toks):
            wordy = lambda t: t[0].isalnum() or t[0] in "_.\"" or t in ("max=", "min=")
            if k and (wordy(tok) and wordy(toks[k - 1])):
                pieces.append(" " * (1 + (k + n) % 3))
            elif k:
                pieces.append(" " * ((k + n) % 3))
            pieces.append(tok)
            if tok == "," and k % 4 == 3:
                pieces.append("\n      ")  # break inside a bracketed list
        mangled = "".join(pieces)
        if comment is not None:
            mangled += "      #" + comment
        out.append(("   " * (n % 3)) + mangled + ("  " if n % 2 else ""))
        if line == "":
            out.append("")  # a second blank line where there was one
    return "\n".join(out) + "\n\n"


def test_misformatted_copy_formats_back(example):
    text = example.read_text()
    messy = _misformat(text)
    assert messy != text
    module, diags = parse(messy)
    assert diags == []
    assert format_module(module) == text


def test_comments_survive_formatting():
    src = "# head\n\ntarget cpu = llvm(cores = 2)  # trailing\n# before op\nop f(A: f32[4]) -> B: f32[4] {\n    # inside\n    B[i] = A[i] * 2.0  # end\n}\n# tail\n"
    module, diags = parse(src)
    assert not diags
    out = format_module(module)
    for c in ("# head", "# trailing", "# before op", "# inside", "# end", "# tail"):
        assert c in out
    assert parse(out)[0] == module
    assert format_module(parse(out)[0]) == out


def test_chained_comparison_parses_as_a_chain():
    module, _ = parse((ROOT / "examples" / "conv2d.tsched").read_text())
    pad = module.ops[0].stages[0]
    cond = pad.rhs.cond
    assert isinstance(cond, A.BoolOp) and cond.op == "and"
    first = cond.values[0]
    assert isinstance(first, A.Compare) and first.ops == ("<=", "<")
    assert [o.text if isinstance(o, A.Num) else o.name for o in first.operands] == ["1", "h", "57"]


def test_examples_check_cleanly(example):
    doc = api.load(example)
    assert [d for d in api.check(doc) if d.severity == "error"] == []


CPU_CASES = [(p, op.name, t) for p in EXAMPLES for op in api.load(p).ast.ops
             for t in ([s.target for s in api.load(p).ast.schedules if s.op == op.name and s.target == "cpu"] or ["llvm"])]


@pytest.mark.parametrize("path,op,target", CPU_CASES, ids=[f"{p.stem}-{o}-{t}" for p, o, t in CPU_CASES])
def test_runs_correctly_on_this_cpu(path, op, target):
    doc = api.load(path)
    low = api.lower_op(doc, op, target)
    assert low.ok, low.diagnostics
    if target == "cpu":
        assert low.policy == "schedule"  # the hand-written schedule, not a fallback
    r = api.run_lowered(low, repeat=1)
    assert r.ok, (r.max_abs, r.max_rel)
    assert r.max_rel < 1e-4


def test_reference_interpreter_matches_numpy_matmul():
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    op = doc.model.ops["matmul"]
    x = interp.random_inputs(op, seed=3)
    ref = interp.reference_outputs(op, x)["C"]
    np.testing.assert_allclose(ref, x["A"].astype(np.float64) @ x["B"].astype(np.float64), rtol=0, atol=1e-10)


def test_reference_interpreter_conv2d_padding():
    doc = api.load(ROOT / "examples" / "conv2d.tsched")
    op = doc.model.ops["conv2d"]
    x = interp.random_inputs(op, seed=1)
    values = interp.evaluate(op, x)
    P = values["P"]
    assert np.all(P[:, :, 0, :] == 0) and np.all(P[:, :, 57, :] == 0) and np.all(P[:, :, :, 0] == 0)
    np.testing.assert_array_equal(P[:, :, 1:57, 1:57], x["X"].astype(np.float64))
    # One output point by hand.
    f, y, xx = 5, 0, 17
    expect = sum(P[0, c, y + r, xx + s] * x["W"][f, c, r, s] for c in range(64) for r in range(3) for s in range(3))
    assert abs(values["Y"][0, f, y, xx] - expect) < 1e-9


def _cuda_source():
    from tensorlang.lower.build import emit
    from tensorlang.lower.targets import tvm_target
    doc = api.load(ROOT / "examples" / "matmul.tsched")
    low = api.lower_op(doc, "matmul", "h200")
    assert low.ok, low.diagnostics
    target = tvm_target(doc.model.targets["h200"])
    return low, target, emit(low.mod, target, "cuda", True)


def test_cuda_lowering_has_the_schedules_grid_and_block():
    from tensorlang.lower.gpu import kernel_usage
    low, _, src = _cuda_source()
    assert re.search(r'extern "C" __global__ void __launch_bounds__\(256\) main_kernel\(', src)
    assert re.search(r"__shared__ .*float A_shared\w*\[1024\]", src) and re.search(r"__shared__ .*float B_shared\w*\[1024\]", src)
    use = kernel_usage(low.mod["main"])
    # split(C.i, [8, 1, 16, 4]) x split(C.j, [8, 1, 16, 4]): 8*8 blocks of 16*16 threads.
    assert use["extents"] == {"blockIdx.x": 64, "threadIdx.x": 256}
    assert "blockIdx.x" in src and "threadIdx.x" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: PTX needs the CUDA toolkit")
def test_ptx_from_nvcc():
    from tensorlang.lower.build import ptx_from_cuda
    _, target, src = _cuda_source()
    ptx = ptx_from_cuda(src, target)
    assert ".visible .entry main_kernel" in ptx
    assert ".target sm_90" in ptx
    assert "ld.shared.f32" in ptx or "ld.shared" in ptx
