"""Tile preferences for a decoder: the vector-width innermost tile (space/vector_tile.py) -- every multi-level
tile of a stage's last spatial loop gets an innermost factor the vector units can fill, where the extent allows
one --, the parallel outer tile (space/parallel_tile.py) and the register tile within the register file
(space/register_tile.py); written splits win over all three; other loops are left to the model."""
import math
import re

import pytest

from tensorlang import api
from tensorlang.parser import parse
from tensorlang.space import constraints as C
from tensorlang.space.space import TILE, Space
from tensorlang.space.vector_tile import vector_innermost, vector_lanes

from conftest import ROOT, random_point

MATMUL = ROOT / "examples" / "matmul.tsched"


@pytest.fixture(scope="module")
def matmul():
    doc = api.load(MATMUL)
    return Space(doc.model.ops["matmul"], doc.primfunc("matmul"), doc.model.targets["cpu"])


def walk(space, prefer, seed, cons=None):
    """Random decoding through ConstrainedTokens; -> (point, {tile decision's subject: (decision point, factors)})."""
    point = random_point(space, prefer, seed, cons)
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


def test_the_shipped_model_decodes_with_the_parallel_vector_and_register_tiles(tmp_path):
    """The shipped checkpoint's switches (its generation_config.json), and a copy can turn one off."""
    import json
    import shutil

    from tensorlang.lm import model as M
    for attr in ("vector_tile", "parallel_tile", "register_tile"):
        assert M.generation_rule(M.DEFAULT_DIR, attr)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ROOT / "tensorlang" / "lm" / "checkpoints" / "default", ckpt)
    cfg = json.loads((ckpt / M.GENERATION_CONFIG).read_text())
    (ckpt / M.GENERATION_CONFIG).write_text(json.dumps({**cfg, "vector_innermost": False}))
    assert not M.generation_rule(ckpt, "vector_tile") and M.generation_rule(ckpt, "parallel_tile")


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


WIDE = ROOT / "data" / "workloads-variants" / "wide-matmuls" / "matmul_1x2048x5969.tsched"


def test_the_parallel_loop_does_not_empty_the_inner_levels():
    """A 1 x 2048 @ 2048 x 5969 matmul (5969 = 47 x 127, no vector multiple): i has nothing to give the cores, so
    j's outer levels must; random walks with the preference never take them from j's inner levels ([1, 5969, 1,
    1]: each parallel iteration walks the reduction alone -- the shipped model wrote that under parallel-outer v3,
    13.7 ms against 3.4 without the rule, znver4), and the shipped model's j keeps an inner factor."""
    from tensorlang.lm.generate import Generator
    from tensorlang.machine import target_cpu
    from tensorlang.space.parallel_tile import parallel_outer
    doc = api.load(WIDE)
    name = next(iter(doc.model.ops))
    wide = Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["llvm"])
    cores = target_cpu(wide.target.params).cores

    def j_tile(tiles):
        return next(f for p, f in tiles.values() if p.role == "S" and p.n >= 3 and p.subject.startswith("j"))
    kept = [j_tile(walk(wide, parallel_outer, s)[1]) for s in range(24)]
    assert all(f[0] * f[1] >= cores and f[2] * f[3] > 1 for f in kept)
    seen = {}

    def choose(p, made):  # i = [1, 1, 1, 1]; at j, what the preference keeps of the domain
        if p.kind == TILE and p.subject.startswith("j") and p.n >= 3:
            seen["kept"], seen["domain"] = parallel_outer(wide, p, tuple(made), sketch), p.domain
        return p.domain[0]
    sketch = next(k for k in wide.usable if any(i.kind.name == "SamplePerfectTile" and int(i.attrs[0]) == 4
                                                for i in wide.sketches[k].insts))
    wide.replay(sketch, choose, convert=False)
    empty = {f for f in seen["domain"] if f[0] * f[1] >= cores and f[2] * f[3] == 1}
    assert (1, 5969, 1, 1) in empty and not empty & set(seen["kept"]) and (47, 1, 127, 1) in seen["kept"]
    doc = api.load_text(f'target z4 = llvm(mcpu = "znver4", cores = 2)\n{WIDE.read_text()}', WIDE.name)
    znver4 = Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["z4"])
    text = Generator().generate(znver4).schedule_text
    j = [int(x) for x in re.search(r"split\(\w+\.j, \[([\d, ]+)\]\)", text).group(1).split(",")]
    assert j[0] * j[1] >= 2 and j[2] * j[3] > 1, text


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
    are those with an outermost factor >= the cores that keep something in the inner levels, plus every tile
    whose innermost factor (written first) has no such tile (none here: 112 has room; RegNet's 14-wide row below
    has)."""
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
    enough = {f for f in domain if f[0] >= cores and math.prod(f[1:]) > 1}  # (112, 1, 1, 1) empties the rest
    assert kept == enough | {f for f in domain if f[-1] not in {g[-1] for g in enough}}
    assert (112, 1, 1, 1) in domain and (112, 1, 1, 1) not in kept


def register_tile_registers(tiles, lanes) -> int:
    """The vector registers a walk's multi-level tile keeps its accumulators in (registers_needed, whose
    values test_registers_count_contiguous_runs_as_one_vector checks)."""
    from tensorlang.space.register_tile import registers_needed
    spatial = [f for p, f in tiles.values() if p.role == "S" and p.n >= 3]  # in loop order (decision order)
    return registers_needed([f[-1] for f in spatial], [math.prod(f) for f in spatial], lanes)


def test_the_register_tile_fits_the_register_file(matmul):
    """fitting_register_tile: with it, every random walk's register tile needs at most the target's vector
    registers; without it, some need more (the space offers up to 512 x 512 / lanes)."""
    from tensorlang.space.register_tile import fitting_register_tile, vector_registers
    lanes, registers = vector_lanes(matmul), vector_registers(matmul)
    plain = [register_tile_registers(walk(matmul, None, s)[1], lanes) for s in range(16)]
    kept = [register_tile_registers(walk(matmul, fitting_register_tile, s)[1], lanes) for s in range(16)]
    assert max(plain) > registers >= max(kept)
    # with the vector tile too (the shipped decoding's order): both hold
    both = C.preferring(vector_innermost, fitting_register_tile)
    for s in range(8):
        tiles = walk(matmul, both, s)[1]
        assert register_tile_registers(tiles, lanes) <= registers
        assert all(f[-1] % lanes == 0 for p, f in tiles.values() if p.role == "S" and p.subject.startswith("j"))


def test_the_register_tile_narrows_each_loop_by_the_factors_before_it(stem_conv):
    """EfficientNet's stem conv (nn, ff, yy, xx): with ff's innermost factor decided, yy keeps the tiles whose
    innermost factor leaves ff's times it within the register file, and xx those that keep the whole tile in it
    (ff3 = 16, yy3 = 1: a 112-wide xx3 would need 16 x 7 zmm registers); with ff's and yy's innermost factors past
    the file already (4 x 16: the shipped model's tiles, 64 registers on AVX-512), xx has no tile that fits, and
    the preference yields (None: every tile)."""
    from tensorlang.space.register_tile import fitting_register_tile, vector_registers
    _, space = stem_conv
    registers = vector_registers(space)
    for ff3, yy3, xx_narrowed in ((16, 1, True), (4, 16, False)):
        seen = {}

        def choose(p, made):
            if p.kind == TILE and len(made) in (2, 3):
                seen[len(made)] = (fitting_register_tile(space, p, made), p.domain)
            if p.kind == TILE and len(made) == 1:  # ff
                return next(f for f in p.domain if f[-1] == ff3)
            if p.kind == TILE and len(made) == 2:  # yy
                return next(f for f in p.domain if f[-1] == yy3)
            return p.domain[0]
        space.replay(space.usable[0], choose, convert=False)
        kept, domain = seen[2]
        assert set(kept) == {f for f in domain if ff3 * f[-1] <= registers}
        assert (seen[3][0] is not None) == xx_narrowed


def test_a_written_tile_wins_over_the_register_tile(matmul):
    from tensorlang.space.register_tile import fitting_register_tile
    module, diags = parse("schedule matmul on cpu {\n"
                          "    annotate(C, \"meta_schedule.tiling_structure\", \"SSRSRS\")\n"
                          "    i0, i1, i2, i3 = split(C.i, [1, 1, 8, 64])\n}\n")
    cons = C.constraints(matmul, tuple(module.schedules[0].stmts))
    assert not diags and cons.outside is None
    tiles = walk(matmul, fitting_register_tile, 0, cons)[1]
    assert [f for p, f in tiles.values() if p.subject.startswith("i")] == [(1, 1, 8, 64)]


def test_registers_count_contiguous_runs_as_one_vector():
    """The last loop's factor in vectors, merged with earlier loops as far as the later ones are whole: a 4 x 4
    map's 15 channels x 16 points are 15 zmm registers, not 15 x 4 x 1; the stem conv's 4 x 16 x 16 is 64."""
    from tensorlang.space.register_tile import least_registers, registers_needed
    assert registers_needed([1, 15, 4, 4], [1, 960, 4, 4], 16) == 15
    assert registers_needed([1, 15, 2, 4], [1, 960, 4, 4], 16) == 15  # yy3 = 2 of 4: runs of 8, one register each
    assert registers_needed([1, 15, 4, 2], [1, 960, 4, 4], 16) == 15 * 4  # xx3 = 2 of 4: 4 runs of 2
    assert registers_needed([1, 4, 16, 16], [1, 32, 112, 112], 16) == 64
    assert registers_needed([1, 4, 16, 16], [1, 32, 112, 112], 8) == 128
    assert registers_needed([64, 64], [64, 256], 16) == 256
    # before the last loop is tiled: the fewest its tiles can give
    assert least_registers([1, 15], [1, 960], 4, 4, 4, 16) == 15  # xx3 = 4 (whole) joins yy3's run
    assert least_registers([1, 4], [1, 32], 16, 112, 112, 16) == 64  # xx3 = 1: 4 x 16 x 1


def test_vector_registers_follow_the_isa():
    from tensorlang.machine import CPU
    assert CPU("x", frozenset({"sse4.2", "avx", "avx2", "fma"}), 2).vector_registers == 16
    assert CPU("x", frozenset({"avx", "avx2", "avx512f"}), 2).vector_registers == 32
    assert CPU("x", frozenset({"neon"}), 2).vector_registers == 32
    assert CPU("x", frozenset({"sse2"}), 2).vector_registers == 16


def test_the_shipped_model_keeps_the_stem_convs_register_tile_in_the_register_file(stem_conv):
    """EfficientNet's stem conv, held out: left alone the shipped model tiles it ff3 = 4, yy3 = 16, xx3 = 16
    (64 zmm registers of accumulators; 1.18 ms on znver4 against MetaSchedule-64's 0.92); with the preference
    on (its switch) the tile fits the 32, and the schedule agrees with NumPy on this host. Written for the CPU
    the model was measured on (znver4: the prompt names the CPU, and on another one the model may write another
    schedule)."""
    import re

    from tensorlang.lm.generate import Generator
    name, _ = stem_conv
    src = STEM.read_text()
    doc = api.load_text(f'target z4 = llvm(mcpu = "znver4", cores = 2)\n{src}', STEM.name)
    znver4 = Space(doc.model.ops[name], doc.primfunc(name), doc.model.targets["z4"])
    gen = Generator()
    assert gen.register_tile

    def registers(text):
        inner = [int(re.search(rf"split\(conv2d_nchw\.{ax}, \[[\d, ]*?(\d+)\]\)", text).group(1))
                 for ax in ("nn", "ff", "yy", "xx")]
        extents = [1, 32, 112, 112]
        from tensorlang.space.register_tile import registers_needed
        return registers_needed(inner, extents, 16)
    texts = {}
    for on in (False, True):
        gen.register_tile = on
        texts[on] = gen.generate(znver4).schedule_text
    assert registers(texts[False]) == 64
    assert registers(texts[True]) <= 32
    body = "".join(f"    {line}\n" for line in texts[True].strip().splitlines())
    doc = api.load_text(f"target cpu = llvm()\n{src}\nschedule {name} on cpu {{\n{body}}}\n", STEM.name)
    assert not api.check(doc, legality=False)
    low = api.lower_op(doc, name, "cpu")
    assert not low.diagnostics and low.policy == "schedule"
    result = api.run_lowered(low, repeat=1)
    assert result.ok and result.max_rel < 1e-4, result


def test_a_preference_is_asked_once_per_decision_however_many_tokens_spell_it(matmul):
    """A tile is spelled over several tokens and each push asks what is allowed: ConstrainedTokens keeps the
    preference's answer for the decision being written (a third of the one-pass decoding time before), and
    what it allows at every token is what a fresh answer there allows."""
    import random

    from tensorlang.space.register_tile import fitting_register_tile
    both = C.preferring(vector_innermost, fitting_register_tile)
    asked = []

    def counting(space, point, decisions, sketch=None):
        asked.append(len(decisions))
        return both(space, point, decisions, sketch)

    for seed in range(4):
        asked.clear()
        kept = C.ConstrainedTokens(matmul, None, prefer=counting)
        fresh = C.ConstrainedTokens(matmul, None, prefer=both)
        rng = random.Random(seed)
        try:
            while not kept.done:
                fresh._memo = None  # asked anew at this token
                allowed = sorted(kept.allowed())
                assert allowed == sorted(fresh.allowed())
                tok = rng.choice(allowed)
                kept.push(tok)
                fresh.push(tok)
            decisions, tokens = len(kept.decisions), len(kept.tokens)
        finally:
            kept.close()
            fresh.close()
        assert asked == list(range(decisions))  # each decision once, in order
        assert tokens > 2 * decisions  # ... of more tokens than decisions
