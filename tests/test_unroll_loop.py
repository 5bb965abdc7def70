"""The unroll plan (space/unroll_loop.py) against TVM's own build: for sampled schedules of a matmul, a padded
strided group conv with a fused epilogue and a squeeze-excite conv, at every unroll step a sketch offers, the
loops the plan leaves are exactly the loops TVM's lowering pipeline leaves."""
import collections

import pytest

from tensorlang import api
from tensorlang.space.space import CATEGORICAL
from tensorlang.space.unroll_loop import unroll_plan, unrolled_elsewhere

from conftest import ROOT, operator_space

OPERATORS = [
    ROOT / "examples" / "matmul.tsched",
    # padding read through if_then_else: VectorizeLoop scalarises the vectorised loops of its pad stage
    ROOT / "data" / "workloads" / "regnety-400mf"
    / "fused_conv2d2_subtract2_divide2_expand_dims1_multiply2_expand_dims1_add4_relu2.tsched",
    ROOT / "data" / "workloads" / "efficientnet-b0" / "fused_conv2d12_add15_tir_sigmoid8_multiply12.tsched",
]


def loops_tvm_leaves(space, mod) -> collections.Counter:
    """The loops (of more than one iteration) left after TVM's lowering through UnrollLoop: the passes of
    s_tir/pipeline.py's default pipeline up to it, in its order, less those for GPUs."""
    import tvm
    from tvm import s_tir, tirx

    from tensorlang.lower.tir import walk
    passes = [s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerCrossThreadReduction(),
              s_tir.transform.LowerInitBlock(), s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerMatchBuffer(), s_tir.transform.StmtSimplify(), s_tir.transform.LowerOpaqueBlock(),
              tirx.transform.FlattenBuffer(), tirx.transform.NarrowDataType(32), s_tir.transform.LoopPartition(),
              tirx.transform.VectorizeLoop(True), tirx.transform.StorageRewrite(), s_tir.transform.HoistIfThenElse(),
              tirx.transform.UnrollLoop()]
    with space.tvm_target:
        lowered = tvm.transform.Sequential(passes)(mod)
    return collections.Counter(n.loop_var.name for n, _ in walk(lowered["main"].body)
                               if isinstance(n, tirx.For) and int(n.extent) > 1)


@pytest.mark.parametrize("path", OPERATORS, ids=lambda p: p.stem[:24])
def test_the_plan_leaves_the_loops_tvm_leaves(path):
    space = operator_space(path)
    points, _ = space.sample(4, seed=3)
    compared = 0
    for p in points:
        seen = {}
        space.replay(p.sketch, lambda q, made: (seen.__setitem__(len(made), q), p.decisions[len(made)])[1],
                     convert=False)
        unroll = max(i for i, q in seen.items() if q.kind == CATEGORICAL)
        for v in seen[unroll].domain:
            decisions = p.decisions[:unroll] + (v,) + p.decisions[unroll + 1:]
            mod = space.replay(p.sketch, lambda q, made: decisions[len(made)], convert=False).mod
            planned = collections.Counter(lp.name for lp in unroll_plan(mod["main"]) if not lp.unrolled)
            assert planned == loops_tvm_leaves(space, mod), (p.sketch, decisions)
            compared += 1
    assert compared >= 8


def test_a_step_given_replaces_every_pragmas_step():
    space = operator_space(OPERATORS[1])
    p = next(p for p in space.sample(8, seed=3)[0])
    mod = space.replay(p.sketch, lambda q, made: p.decisions[len(made)], convert=False).mod
    assert not any(lp.unrolled for lp in unroll_plan(mod["main"], 0))
    by_step = [sum(lp.unrolled for lp in unroll_plan(mod["main"], s)) for s in (0, 16, 64, 512, 1 << 20)]
    assert by_step == sorted(by_step) and by_step[-1] > by_step[0]  # a larger step never unrolls less
    plan = unroll_plan(mod["main"], 512)
    every = set().union(*(lp.blocks for lp in plan))
    assert unrolled_elsewhere(mod["main"], 512, set()) == {(i, lp.name) for i, lp in enumerate(plan) if lp.unrolled}
    assert unrolled_elsewhere(mod["main"], 512, every) == frozenset()


@pytest.mark.parametrize("step", [16, 64, 512])
def test_a_hand_written_schedule_with_the_init_in_its_block(step):
    """examples/matmul.tsched's CPU schedule (no decompose_reduction: the init is an `if` in the block, two
    statements a step) with an unroll pragma on its parallel loop."""
    from types import SimpleNamespace

    from tensorlang.lower.schedule import apply_schedule
    from tensorlang.lower.targets import tvm_target
    text = OPERATORS[0].read_text().replace(
        "    parallel(i0)\n", f'    parallel(i0)\n    annotate(i0, "pragma_auto_unroll_max_step", {step})\n', 1)
    doc = api.load_text(text)
    op = doc.model.ops["matmul"]
    applied = apply_schedule(doc.primfunc("matmul"), op, doc.model.schedule_for("matmul", "cpu"))
    assert not applied.diags
    mod = applied.sch.mod
    planned = collections.Counter(lp.name for lp in unroll_plan(mod["main"]) if not lp.unrolled)
    assert planned == loops_tvm_leaves(SimpleNamespace(tvm_target=tvm_target(doc.model.targets["cpu"])), mod)
    assert (planned["k_1"] == 0) == (step >= 8)  # k1 (4) x its 2 statements
