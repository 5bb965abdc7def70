"""The single-accumulator unroll (space/single_accumulator.py): a CPU multi-level tile whose innermost spatial
level is one point gets an unroll step that unrolls the spatial loops around its inner reduction, where one
does; other tiles keep every step."""
import math
import re

import pytest

from tensorlang import api
from tensorlang.space.single_accumulator import (single_accumulator_region, unroll_facts,
                                                 unrolled_single_accumulator)
from tensorlang.space.space import CATEGORICAL, TILE, Space

from conftest import ROOT, operator_space, random_point

# EfficientNet-B0's squeeze-excite reduce conv (144 -> 6 channels on a 1 x 1 map), a held-out task
SE_CONV = ROOT / "data" / "workloads" / "efficientnet-b0" / "fused_conv2d12_add15_tir_sigmoid8_multiply12.tsched"
MATMUL = ROOT / "examples" / "matmul.tsched"


@pytest.fixture(scope="module")
def se_conv():
    space = operator_space(SE_CONV, "llvm")
    return space.op.name, space


def tiled_sketch(space) -> int:
    return next(k for k in space.usable if unroll_facts(space, k) is not None and unroll_facts(space, k).tiles)


def test_the_trace_names_the_unroll_decision_and_the_tiles_before_it(se_conv):
    _, space = se_conv
    facts = unroll_facts(space, tiled_sketch(space))
    assert facts.steps == (0, 16, 64, 512)
    assert [(t.spatial, t.reduction) for t in facts.tiles] == [((0, 1, 2, 3), (4, 5, 6))]  # nn ff yy xx, rc ry rx
    assert facts.unroll == 7
    doc = api.load(MATMUL)
    matmul = Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])
    assert {(t.spatial, t.reduction) for k in matmul.usable for t in unroll_facts(matmul, k).tiles} == {((0, 1), (2,))}


def test_the_region_counts_s2_r1_s3_of_a_single_accumulator_only():
    assert single_accumulator_region([(1, 1, 1, 1), (1, 1, 6, 1)], [(3, 48), (1, 1)]) == 288
    assert single_accumulator_region([(1, 1, 2, 3)], [(3, 48)]) is None  # 3 accumulators
    assert single_accumulator_region([(6, 1, 1, 1)], [(3, 48)]) is None  # S2 one point: nothing to interleave
    assert single_accumulator_region([(2, 1, 4, 1), (1, 2, 2, 1)], [(8, 2), (1, 3)]) == 4 * 2 * 2 * 3


@pytest.mark.parametrize("ff, rc, kept", [
    ((1, 1, 6, 1), (3, 48), (3,)),  # 6 x 48 = 288 steps: only 512 unrolls ff2
    ((1, 1, 6, 1), (48, 3), (2, 3)),  # 18 steps: 64 and 512 (16 does not)
    ((1, 1, 2, 3), (3, 48), None),  # 3 accumulators per step: not the rule's case
    ((6, 1, 1, 1), (3, 48), None),  # ff2 = 1: no independent chain to unroll
])
def test_the_unroll_decision_keeps_the_steps_that_unroll_s2(se_conv, ff, rc, kept):
    _, space = se_conv
    seen = {}

    def choose(p, made):
        if p.kind == TILE:
            want = {1: ff, 4: rc}.get(len(made))
            return want if want is not None else p.domain[0]
        if p.kind == CATEGORICAL and len(made) == 7:
            seen["kept"] = unrolled_single_accumulator(space, p, tuple(made), tiled_sketch(space))
        return p.domain[0]
    space.replay(tiled_sketch(space), choose, convert=False)
    assert seen["kept"] == kept


def test_no_preference_where_no_step_unrolls_s2():
    """A 512 x 512 matmul tiled i2 = 8, j2 = 64 with one accumulator and k1 = 4: 2,048 steps, past every step."""
    doc = api.load(MATMUL)
    matmul = Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])
    sketch = tiled_sketch(matmul)
    seen = {}

    def choose(p, made):
        if p.kind == TILE:
            return {0: (64, 1, 8, 1), 1: (8, 1, 64, 1), 2: (128, 4)}.get(len(made), p.domain[0])
        if p.kind == CATEGORICAL and len(made) == 3:
            seen["kept"] = unrolled_single_accumulator(matmul, p, tuple(made), sketch)
            seen["region"] = single_accumulator_region([made[0], made[1]], [made[2]])
        return p.domain[0]
    matmul.replay(sketch, choose, convert=False)
    assert seen == {"kept": None, "region": 2048}


def test_random_walks_with_the_rule_unroll_every_single_accumulator_they_can(se_conv):
    """Decoding through ConstrainedTokens with the preference: wherever a walk's tile has one accumulator and
    a step can unroll S2, its step does (and the walks did meet such tiles). The squeeze conv's sigmoid-multiply
    epilogue is 6 channels of one point, which every step but 0 unrolls: no step is refused for it."""
    _, space = se_conv
    met = 0
    for seed in range(40):
        point = random_point(space, unrolled_single_accumulator, seed)
        facts = unroll_facts(space, point.sketch)
        if facts is None or not facts.tiles:
            continue
        d = point.decisions
        t = facts.tiles[0]
        region = single_accumulator_region([d[i] for i in t.spatial], [d[i] for i in t.reduction])
        if region is not None and region <= max(facts.steps):
            met += 1
            assert facts.steps[d[facts.unroll]] >= region, (seed, d)
    assert met >= 2


def test_the_shipped_model_unrolls_the_squeeze_convs_single_accumulator(se_conv):
    """Left alone, the shipped model writes the held-out squeeze conv with ff2 = 6, rc1 = 48 and every other
    innermost factor 1 at unroll step 64 (0.4 us on znver4 against 0.2 at step 512); with the rule on (its
    switch) the step unrolls ff2, and the schedule agrees with NumPy on this host. Written for the CPU the model
    was measured on (znver4: the prompt names the CPU)."""
    from tensorlang.lm.generate import Generator
    name, _ = se_conv
    src = SE_CONV.read_text()
    doc = api.load_text(f'target z4 = llvm(mcpu = "znver4", cores = 2)\n{src}', SE_CONV.name)
    znver4 = Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["z4"])
    gen = Generator()
    texts = {}
    for on in (False, True):
        gen.single_accumulator = on
        texts[on] = gen.generate(znver4).schedule_text

    def tile(text):
        ff = [int(x) for x in re.search(r"split\(conv2d_nchw\.ff, \[([\d, ]+)\]\)", text).group(1).split(",")]
        rc = [int(x) for x in re.search(r"split\(conv2d_nchw\.rc, \[([\d, ]+)\]\)", text).group(1).split(",")]
        step = int(re.search(r'pragma_auto_unroll_max_step", (\d+)', text).group(1))
        return ff, rc, step
    ff, rc, step = tile(texts[False])
    assert (ff[-1], ff[-2] * rc[-1], step) == (1, 288, 64)
    ff, rc, step = tile(texts[True])
    assert ff[-1] == 1 and step >= math.prod([ff[-2], rc[-1]])
    body = "".join(f"    {line}\n" for line in texts[True].strip().splitlines())
    doc = api.load_text(f"target cpu = llvm()\n{src}\nschedule {name} on cpu {{\n{body}}}\n", SE_CONV.name)
    assert not api.check(doc, legality=False)
    low = api.lower_op(doc, name, "cpu")
    assert not low.diagnostics and low.policy == "schedule"
    result = api.run_lowered(low, repeat=1)
    assert result.ok and result.max_rel < 1e-4, result


# RegNetY's squeeze-excite expand conv (110 -> 440 channels, a sigmoid-multiply epilogue), at 224 and 448 pixels
REGNETY_SE = {7: ROOT / "data" / "workloads" / "regnety-400mf" / "fused_conv2d28_add24_tir_sigmoid3_multiply8.tsched",
              14: ROOT / "data" / "workloads-variants" / "regnety-400mf-image448"
              / "fused_conv2d28_add24_tir_sigmoid3_multiply8.tsched"}


@pytest.mark.parametrize("side, sketch, kept", [
    (7, 0, (3,)),  # the epilogue is a nest of its own: 512 unrolls nothing more of it than 64
    (7, 1, (3,)),  # at xx1, 8 channels x 49: its 8-channel loop unrolls at 64 already
    (7, 2, None),  # at xx0, all 440 channels x 49: 512 unrolls the 440-channel loop, 64 does not
    (14, 2, (3,)),  # at xx0, 440 channels x 14 rows: past 512 too
    (14, 1, None),  # at xx1, 8 channels x 14 rows: 64 unrolls the rows, 512 the channels as well
])
def test_a_step_that_also_unrolls_more_of_the_epilogue_is_not_kept(side, sketch, kept):
    """The conv tiled as the shipped model tiles it (ff = [1, 55, 8, 1], rc = [1, 52]: 8 x 52 = 416 steps, which
    only 512 unrolls), its epilogue (a side x side map per channel, vectorised along a row or the whole map)
    where each sketch computes it."""
    space = operator_space(REGNETY_SE[side])
    seen = {}

    def choose(p, made):
        if p.kind == TILE:
            return {1: (1, 55, 8, 1), 4: (1, 52)}.get(len(made), p.domain[0])
        seen["kept"] = unrolled_single_accumulator(space, p, tuple(made), sketch)
        return p.domain[-1]
    space.replay(sketch, choose, convert=False)
    assert seen["kept"] == kept
