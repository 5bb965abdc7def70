"""Generated schedules rendered for people (space/render.py): short names, no identity fuse, comments -- and
exactly the same TensorIR as the statements they came from, the same text every time, inside the space."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CONV_GPU = """
target cpu = llvm()
target gpu = cuda(arch = "sm_90")

op conv2d(X: f32[1, 64, 56, 56], W: f32[64, 64, 3, 3]) -> Y: f32[1, 64, 56, 56] {
    P: f32[1, 64, 58, 58]
    P[n, c, h, w] = X[n, c, h - 1, w - 1] if 1 <= h < 57 and 1 <= w < 57 else 0.0
    Y[n, f, y, x] += P[n, c, y + r, x + s] * W[f, c, r, s]
}
"""

CASES = [  # (source, op, target)
    ("examples/matmul.tsched", "matmul", "cpu"),
    ("examples/matmul.tsched", "matmul", "h200"),
    ("examples/softmax.tsched", "softmax", "cpu"),
    ("examples/dense_gelu.tsched", "dense_gelu", "cpu"),
    ("examples/auto.tsched", "layernorm", "llvm"),
    (CONV_GPU, "conv2d", "cpu"),
    (CONV_GPU, "conv2d", "gpu"),
    ("data/workloads/bert-base/layer_norm.tsched", "layer_norm", "llvm"),
    ("data/workloads/mobilenetv2/fused_conv2d10_subtract7_divide7_expand_dims_multiply7_expand_dims_add13.tsched",
     None, "llvm"),
]


def _doc(src: str):
    """The file without its own schedule blocks (each test adds one)."""
    from tensorlang import api
    text = src if src.startswith("\n") else (ROOT / src).read_text()
    text = re.sub(r"^schedule .*?^\}\n", "", text, flags=re.S | re.M)
    return api.load_text(text, "<render-test>" if src.startswith("\n") else str(ROOT / src))


def _points(src, op, target, n=3):
    from tensorlang.baselines.roller import roller_point
    from tensorlang.space.space import Space
    doc = _doc(src)
    op = op or next(iter(doc.model.ops))
    space = Space(doc.model.ops[op], doc.primfunc(op), doc.model.targets[target])
    points, _ = space.sample(n, seed=7)
    return doc, op, space, [roller_point(space)] + points


def _applied(doc, op, target, text):
    """The module a schedule block (text) makes, applied to the file's operator."""
    from tensorlang import api
    from tensorlang import diagnostics as Dg
    d = api.load_text(doc.text + "\n" + text, doc.path)
    (sched,) = d.model.schedules
    res = api.check_schedule(d, sched)
    assert not Dg.has_errors(res.diagnostics), [x.message for x in res.diagnostics]
    return res.applied.sch.mod, sched


@pytest.mark.parametrize("src,op,target", CASES, ids=[f"{Path(c[0]).stem if not c[0].startswith(chr(10)) else 'conv'}-"
                                                        f"{c[2]}" for c in CASES])
def test_rendering_applies_to_the_same_tensorir(src, op, target):
    import tvm_ffi

    from tensorlang.parser.printer import format_stmt
    from tensorlang.space.render import render_schedule
    doc, op, _, points = _points(src, op, target)
    for p in points:
        text = render_schedule(op, target, p.stmts)
        assert text == render_schedule(op, target, p.stmts)  # the same text every time
        raw = f"schedule {op} on {target} {{\n" + "".join(f"    {format_stmt(s)}\n" for s in p.stmts) + "}\n"
        mod_new, sched = _applied(doc, op, target, text)
        mod_raw, _ = _applied(doc, op, target, raw)
        assert tvm_ffi.structural_equal(mod_new, mod_raw), text
        assert tvm_ffi.structural_equal(mod_new, p.mod), text
        # what a person reads: no TVM-made names, no fuse of one loop, a comment per group
        names = [t.name for s in sched.stmts for t in s.targets if s.prim in ("split", "fuse")]
        # TVM's: i_0 (a one-letter index's split), n_0_f_0_fused / ax0_ax1_fused (a fuse of several)
        tvm_like = [n for n in names if re.fullmatch(r"[a-z]_\d+", n) or re.search(r"_\d+_[a-z]|\d_ax\d|_fused_\d", n)]
        assert not tvm_like and all(len(n) <= 24 for n in names), text
        assert all(not (s.prim == "fuse" and len(s.args) == 1) for s in sched.stmts), text
        assert len(set(names)) == len(names)
        if len(sched.stmts) > 3:
            assert text.count("    # ") >= 2, text


def test_rendering_examples_read_as_written():
    """The GPU conv2d's roller schedule: the names an engineer would use."""
    from tensorlang.space.render import render_schedule
    doc, op, space, points = _points(CONV_GPU, "conv2d", "gpu", n=0)
    text = render_schedule(op, "gpu", points[0].stmts)
    assert "bx = fuse(n0, f0, y0, x0)" in text and "bind(bx, blockIdx.x)" in text
    assert "bind(tx, threadIdx.x)" in text and "vx = fuse(n1, f1, y1, x1)" in text
    assert "# GPU blocks and threads" in text and "# tile Y: levels S S S R R S R S" in text
    cpu = render_schedule(op, "cpu", _points(CONV_GPU, "conv2d", "cpu", n=0)[3][0].stmts)
    assert "parallel(outer)" in cpu and re.search(r"outer = fuse\(n0, f0, y0, x0", cpu)


def test_rendered_schedule_is_located_in_the_space():
    """`check --space` finds the rendered schedule in the space (no TS314 hint)."""
    from tensorlang import api
    from tensorlang.space.render import render_schedule
    for src, op, target in [(CONV_GPU, "conv2d", "gpu"), ("examples/softmax.tsched", "softmax", "cpu")]:
        doc, op, _, points = _points(src, op, target, n=1)
        for p in points:
            _, sched = _applied(doc, op, target, render_schedule(op, target, p.stmts))
            d = api.load_text(doc.text + "\n" + render_schedule(op, target, p.stmts), doc.path)
            sched = d.model.schedules[-1]
            res = api.check_schedule(d, sched)
            assert api.space_membership(d, sched, res.applied) == []


MEAN = "data/workloads/efficientnet-b0/mean.tsched"
# The statements of a point of MEAN's space (the model's one-pass schedule, as the trace gave them):
# RewriteParallelVectorizeUnroll marks the fused loop twice, the second time through a fuse of one loop.
MEAN_RAW = """schedule mean on llvm {
    compute_at(lv10_red, T_divide.ax1, preserve_unit_loops=True)
    ax0, ax1, ax0_2, ax1_2, ax2, ax3, ax4, ax5 = get_loops(lv10_red)
    ax0_ax1_fused = fuse(ax0, ax1)
    parallel(ax0_ax1_fused)
    ax0_ax1_fused_fused = fuse(ax0_ax1_fused)
    parallel(ax0_ax1_fused_fused)
    lv10_red_init = decompose_reduction(lv10_red, ax4)
}
"""


def test_a_loop_marked_twice_through_an_identity_fuse_is_marked_once():
    import tvm_ffi

    from tensorlang import api
    from tensorlang.space.render import render_schedule
    doc = _doc(MEAN)
    mod_raw, raw = _applied(doc, "mean", "llvm", MEAN_RAW)
    text = render_schedule("mean", "llvm", raw.stmts)
    mod_new, sched = _applied(doc, "mean", "llvm", text)
    assert tvm_ffi.structural_equal(mod_new, mod_raw), text
    assert [s.prim for s in sched.stmts] == ["compute_at", "get_loops", "fuse", "parallel", "decompose_reduction"]
    assert "outer = fuse(ax0, ax1)\n    parallel(outer)\n" in text
    d = api.load_text(doc.text + "\n" + text, doc.path)
    res = api.check_schedule(d, d.model.schedules[-1])
    assert api.space_membership(d, d.model.schedules[-1], res.applied) == []
