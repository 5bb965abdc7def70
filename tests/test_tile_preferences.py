"""Tile preferences for a decoder: the vector-width innermost tile (space/vector_tile.py) -- every multi-level
tile of a stage's last spatial loop gets an innermost factor the vector units can fill, where the extent allows
one -- and the parallel outer tile (space/parallel_tile.py); written splits win over both; other loops are
left to the model."""
import math
import random

import pytest

from tensorlang import api
from tensorlang.parser import parse
from tensorlang.space import constraints as C
from tensorlang.space.space import TILE, Space
from tensorlang.space.vector_tile import vector_innermost, vector_lanes

from conftest import ROOT

MATMUL = ROOT / "examples" / "matmul.tsched"


@pytest.fixture(scope="module")
def matmul():
    doc = api.load(MATMUL)
    return Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])


def walk(space, prefer, seed, cons=None):
    """Random decoding through ConstrainedTokens; -> (point, {tile decision's subject: (decision point, factors)})."""
    dec = C.ConstrainedTokens(space, cons, prefer=prefer)
    rng = random.Random(seed)
    try:
        while not dec.done:
            dec.push(rng.choice(sorted(dec.allowed())))
        point = dec.finish()
    finally:
        dec.close()
    tiles = {}

    def choose(p, prefix):
        value = point.decisions[len(prefix)]
        if p.kind == TILE:
            tiles[p.subject] = (p, value)
        return value
    space.replay(point.sketch, choose, convert=False)
    return point, tiles


def test_the_last_spatial_loop_gets_a_vector_width_multiple(matmul):
    lanes = vector_lanes(matmul)
    assert lanes >= 4  # every CPU the project runs on has 128-bit vectors at least
    plain = [walk(matmul, None, s)[1] for s in range(12)]
    preferred = [walk(matmul, vector_innermost, s)[1] for s in range(12)]

    def last_spatial(tiles):
        return [f for p, f in tiles.values() if p.role == "S"
                and p.axis == max(i for i, a in enumerate(p.axes) if a[2] == "S")]
    assert any(f[-1] % lanes for t in plain for f in last_spatial(t))  # the space offers other innermost factors
    assert all(f[-1] % lanes == 0 for t in preferred for f in last_spatial(t))
    assert all(last_spatial(t) for t in preferred)  # (the check above saw tiles)
    # the other loops keep their whole domain: the first spatial loop still takes innermost factors of every kind
    firsts = {f[-1] for t in preferred for p, f in t.values() if p.role == "S" and p.axis == 0}
    assert len(firsts) > 1


def test_a_written_split_wins_over_the_preference(matmul):
    module, diags = parse("schedule matmul on cpu {\n"
                          "    annotate(C, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          "    j0, j1, j2, j3 = split(C.j, [1, 1, 512, 1])\n}\n")
    assert not diags
    cons = C.constraints(matmul, tuple(module.schedules[0].stmts))
    assert cons.outside is None
    point, tiles = walk(matmul, vector_innermost, 0, cons)
    assert [f for p, f in tiles.values() if p.subject.startswith("j")] == [(1, 1, 512, 1)]


def test_the_shipped_model_decodes_with_the_parallel_and_the_vector_tile(tmp_path):
    """The shipped checkpoint's switches (its generation_config.json), and a copy can turn one off."""
    import json
    import shutil

    from tensorlang.lm import model as M
    assert M.generation_vector_tile(ROOT / "tensorlang" / "lm" / "checkpoints" / "default")
    assert M.generation_parallel_tile(ROOT / "tensorlang" / "lm" / "checkpoints" / "default")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ROOT / "tensorlang" / "lm" / "checkpoints" / "default", ckpt)
    cfg = json.loads((ckpt / M.GENERATION_CONFIG).read_text())
    (ckpt / M.GENERATION_CONFIG).write_text(json.dumps({**cfg, M.VECTOR_INNERMOST: False}))
    assert not M.generation_vector_tile(ckpt) and M.generation_parallel_tile(ckpt)


def test_the_outer_tile_levels_leave_every_core_work(matmul):
    """parallel_outer: with it, the product of every spatial loop's outer two factors reaches the target's
    cores (a random walk without it often leaves 1: no parallel loop); written splits still win."""
    from tensorlang.machine import target_cpu
    from tensorlang.space.parallel_tile import parallel_outer
    cores = target_cpu(matmul.target.params).cores

    def outer_parallel(tiles):
        spatial = [f for p, f in tiles.values() if p.role == "S" and p.n >= 3]
        assert len(spatial) == 2  # i and j of the matmul
        return math.prod(f[0] * f[1] for f in spatial)
    plain = [outer_parallel(walk(matmul, None, s)[1]) for s in range(16)]
    kept = [outer_parallel(walk(matmul, parallel_outer, s)[1]) for s in range(16)]
    assert min(plain) < cores <= min(kept)
    module, diags = parse("schedule matmul on cpu {\n"
                          "    annotate(C, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          "    i0, i1, i2, i3 = split(C.i, [1, 1, 64, 8])\n"
                          "    j0, j1, j2, j3 = split(C.j, [1, 1, 32, 16])\n}\n")
    cons = C.constraints(matmul, tuple(module.schedules[0].stmts))
    assert not diags and cons.outside is None
    assert outer_parallel(walk(matmul, parallel_outer, 0, cons)[1]) == 1
    # the earlier tiles are read from the decisions, not from the loops a decoder's point keeps from an earlier
    # replay: after a walk whose i has outer factors 8 x 8, one whose i has 1 x 1 still gets j's outer >= cores
    for i_split in ("[8, 8, 8, 1]", "[1, 1, 64, 8]"):
        module, _ = parse("schedule matmul on cpu {\n"
                          "    annotate(C, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          f"    i0, i1, i2, i3 = split(C.i, {i_split})\n}}\n")
        cons = C.constraints(matmul, tuple(module.schedules[0].stmts))
        for seed in range(4):
            assert outer_parallel(walk(matmul, parallel_outer, seed, cons)[1]) >= cores


def test_the_parallel_preference_changes_nothing_where_the_earlier_tiles_give_every_core_work():
    """MobileNetV2's 1x1 conv (96 -> 576 channels, 14x14): the shipped model's tiles of ff and yy already give
    every core outer iterations, so its xx tile is its own with the preference on -- read from the decisions made,
    not from the loops of an earlier replay that a decoder's point keeps (they once made it [14, 1, 1, 1],
    11x slower). Its LLaMA matmul (32 x 4096 @ 4096 x 4096) left alone has no outer iteration at all (`[1, 1, 32,
    4]`, `[1, 1, 64, 64]`: nothing parallel) and gets some (the v4 model did so on matmul3 and on EfficientNet's
    stem conv, which this one tiles with outer iterations of its own). RegNet's depthwise conv keeps its
    14-wide innermost xx and with it no parallel loop (forced, the v4 model wrote [2, 1, 7, 1]: 2.3x slower)."""
    from tensorlang.lm.generate import Generator
    gen = Generator()
    for stem, changes in (("mobilenetv2/fused_conv2d20_subtract13_divide13_expand_dims8_multiply13_expand_dims8_"
                           "add25_tir_clip8", False), ("llama7b-layer/matmul", True),
                          ("regnety-400mf/fused_conv2d17_subtract6_divide6_expand_dims3_multiply6_expand_dims3_"
                           "add17_relu9", False)):
        doc = api.load(ROOT / "data" / "workloads" / f"{stem}.tsched")
        name = next(iter(doc.model.ops))
        space = Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["llvm"])
        texts = []
        for on in (False, True):
            gen.parallel_tile = on
            texts.append(gen.generate(space).schedule_text)
        assert (texts[0] != texts[1]) == changes, stem
        assert "parallel(" in texts[1] or not changes


STEM = ROOT / "data" / "workloads" / "efficientnet-b0" / (
    "fused_conv2d_subtract_divide_expand_dims_multiply_expand_dims_add1_tir_sigmoid_multiply1.tsched")


@pytest.fixture(scope="module")
def stem_conv():
    doc = api.load(STEM)
    name = next(iter(doc.model.ops))
    return name, Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["llvm"])


def test_consumer_levels_reads_where_each_sketch_computes_the_epilogue(stem_conv):
    """EfficientNet's stem conv: one sketch leaves its epilogue at the root, one computes it at xx1 and one at
    xx0 (the xx tile is decision 3: nn, ff, yy, xx)."""
    from tensorlang.space.parallel_tile import consumer_levels
    _, space = stem_conv
    assert sorted(tuple(sorted(consumer_levels(space, k).items())) for k in space.usable) == [(), ((3, 0),), ((3, 1),)]


def test_an_epilogue_at_the_outermost_level_leaves_that_level_the_parallel_work(stem_conv):
    """With the epilogue computed at xx0 the postprocessor fuses only nn0, ff0, yy0 and xx0 into the parallel
    loop. ff and yy written with outermost factor 1 (yy's second factor 2 satisfies a rule that counts the outer
    two levels): random walks without the preference leave some schedules no parallel loop, with it none."""
    from tensorlang.space.parallel_tile import parallel_outer
    name, space = stem_conv
    module, diags = parse(f"schedule {name} on llvm {{\n"
                          "    annotate(conv2d_nchw, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          "    ff0, ff1, ff2, ff3 = split(conv2d_nchw.ff, [1, 1, 1, 32])\n"
                          "    yy0, yy1, yy2, yy3 = split(conv2d_nchw.yy, [1, 2, 7, 8])\n}\n")
    cons = C.constraints(space, tuple(module.schedules[0].stmts))
    assert not diags and cons.outside is None

    def parallel(prefer, seed):
        point = walk(space, prefer, seed, cons)[0]
        return any(s.prim == "parallel" for s in point.stmts)
    assert not all(parallel(None, s) for s in range(12))
    assert all(parallel(parallel_outer, s) for s in range(12))


def test_the_parallel_preference_never_costs_the_innermost_factor(stem_conv):
    """At the xx tile of the sketch with the epilogue at xx0, everything before it outermost 1: the tiles kept
    are those with an outermost factor >= the cores, plus every tile whose innermost factor (written first)
    has no such tile (none here: 112 has room; RegNet's 14-wide row below has)."""
    from tensorlang.machine import target_cpu
    from tensorlang.space.parallel_tile import consumer_levels, parallel_outer
    _, space = stem_conv
    sketch = next(k for k in space.usable if consumer_levels(space, k).get(3) == 0)
    cores = target_cpu(space.target.params).cores
    seen = {}

    def choose(p, made):
        if len(made) == 3:
            seen["kept"], seen["domain"] = parallel_outer(space, p, made, sketch), p.domain
        return next((f for f in p.domain if f[0] == 1), p.domain[0]) if p.kind == TILE else p.domain[0]
    space.replay(sketch, choose, convert=False)
    kept, domain = set(seen["kept"]), seen["domain"]
    assert (1, 1, 7, 16) in domain and (1, 1, 7, 16) not in kept and (7, 1, 1, 16) in kept
    assert kept == {f for f in domain if f[0] >= cores
                    or not any(g[0] >= cores and g[-1] == f[-1] for g in domain)}
