"""Constraints from hand-written statements (space/constraints.py): partial schedules of every example in
orders the replay does not use, cut-off MetaSchedule schedules, out-of-space statements, and completions
by the constrained decoder that keep exactly the written decisions."""
import random
from functools import lru_cache

import pytest

from tensorlang import api
from tensorlang.parser import parse
from tensorlang.space import constraints as C
from tensorlang.space.space import Space

from conftest import ROOT

EX = ROOT / "examples"


@lru_cache(maxsize=None)
def space_of(file, op, target):
    doc = api.load(EX / f"{file}.tsched")
    return Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, target))


def stmts_of(op, target, body):
    module, diags = parse(f"schedule {op} on {target} {{\n{body}\n}}\n")
    assert not diags, diags
    return list(module.schedules[0].stmts)


def assert_completions_hold(space, cons, seeds=(0, 1)):
    """Completed by the constrained decoder and by `complete`: in a sketch left, every constrained decision
    allowed -- and membership.locate, on the finished schedule, finds a point with the same decisions."""
    out = []
    for seed in seeds:
        for p in (C.decode_random(space, cons, seed=seed), C.complete(space, cons, seed=seed)):
            assert p.sketch in cons.sketches
            assert cons.holds(space, p), (p.sketch, p.decisions)
            out.append(p)
    return out


def decision(cons, sketch, head):
    return [c for cs in cons.sketches[sketch].values() for c in cs if c.head == head]


# ---------------------------------------------------------------- groupings of factors
def test_groups():
    assert C.groups((4, 4, 1, 32), (16, 32)) and C.groups((4, 4, 1, 32), (16, 1, 32))
    assert C.groups((4, 4, 1, 32), (None, 32)) and not C.groups((4, 4, 1, 32), (None, 8))
    assert C.groups((2, 3), (2, 3)) and not C.groups((2, 3), (3, 2)) and not C.groups((2,), (2, 1))


# ---------------------------------------------------------------- hand-written partial schedules
def test_matmul_written_out_of_replay_order():
    """The unroll step (the last decision) first, a 2-part split narrowing a 4-level tile, a full tile, a
    cache_write only two sketches have; values a first-choice decoder would not pick."""
    space = space_of("matmul", "matmul", "cpu")
    cons = C.constraints(space, stmts_of("matmul", "cpu", """
        annotate(C, "pragma_auto_unroll_max_step", 512)
        j0, j1, j2, j3 = split(C.j, [2, 8, 2, 16])
        i0, i1 = split(C.i, [None, 32])
        CG = cache_write(C, 0, global)
        parallel(i0)"""))
    assert cons.outside is None and set(cons.sketches) == {0, 1}
    assert [n for n, _ in cons.unenforced] == [4]  # parallel: the postprocessor's
    for p in assert_completions_hold(space, cons):
        assert p.decisions[1] == (2, 8, 2, 16)
        i = p.decisions[0]
        assert 32 in (i[3], i[2] * i[3], i[1] * i[2] * i[3])
        assert space.sketches and p.decisions[3] == 3  # candidate 512 (index 3), not the first
    # membership agrees: the finished schedule is a point of the space with those decisions
    from tensorlang.space.membership import locate
    p = C.complete(space, cons, seed=5)
    m = locate(space, p.mod, p.trace, p.stmts)
    assert m.inside and cons.holds(space, m.point) and m.point.decisions[1] == (2, 8, 2, 16)


def test_conv2d_inline_written_first():
    """compute_inline(P) decides the last decision of the replay; written first."""
    space = space_of("conv2d", "conv2d", "cpu")
    cons = C.constraints(space, stmts_of("conv2d", "cpu", """
        compute_inline(P)
        f0, f1, f2, f3 = split(Y.f, [2, 1, 8, 4])
        c0, c1 = split(Y.c, [16, 4])"""))
    assert cons.outside is None and set(cons.sketches) == set(space.usable)
    for p in assert_completions_hold(space, cons, seeds=(3,)):
        assert p.decisions[1] == (2, 1, 8, 4) and p.decisions[4] == (16, 4) and p.decisions[-1] == -2
        assert any(s.prim == "compute_inline" and s.args[0].text == "P" for s in p.stmts)


def test_conv2d_compute_at_a_tile_part():
    """A site on a tile's part: that part is kept above 1 (TVM offers no site on a unit loop)."""
    space = space_of("conv2d", "conv2d", "cpu")
    cons = C.constraints(space, stmts_of("conv2d", "cpu", """
        f0, f1, f2, f3 = split(Y.f, [2, None, 1, 4])
        compute_at(P, f1)"""))
    assert cons.outside is None
    tile = [c for c in cons.sketches[0][1] if c.nonunit]
    assert tile and tile[0].nonunit == {1}
    for p in assert_completions_hold(space, cons, seeds=(0, 2)):
        f = p.decisions[1]
        assert f == (2, 8, 1, 4)
        site = [s for s in p.stmts if s.prim == "compute_at" and s.args[0].text == "P"]
        assert site and site[0].args[1].text == "f_1"


def test_dense_gelu_sketch_statement_and_unroll_first():
    """reverse_compute_at(Y, j1) is a sketch's own statement: it leaves the one sketch that fuses Y there."""
    space = space_of("dense_gelu", "dense_gelu", "cpu")
    cons = C.constraints(space, stmts_of("dense_gelu", "cpu", """
        annotate(T, "meta_schedule.unroll_explicit", 16)
        k0, k1 = split(T.k, [96, 8])
        j0, j1, j2, j3 = split(T.j, [3, 16, 4, 16])
        reverse_compute_at(Y, j1)"""))
    assert cons.outside is None and set(cons.sketches) == {1}
    for p in assert_completions_hold(space, cons, seeds=(1,)):
        assert p.decisions[1] == (3, 16, 4, 16) and p.decisions[2] == (96, 8)
        assert any(s.prim == "reverse_compute_at" and s.args[1].text == "j_1" for s in p.stmts)


def test_softmax_example_schedule_leaves_at_its_split():
    """The example's own schedule: compute_at sites in the user's order; split(Y.j, ...) is outside the
    space (no sketch tiles Y), and the constraints without it remain."""
    space = space_of("softmax", "softmax", "cpu")
    stmts = list(parse((EX / "softmax.tsched").read_text())[0].schedules[0].stmts)
    cons = C.constraints(space, stmts)
    assert cons.outside is not None and cons.outside.stmt == 4
    assert cons.outside.text == "j0, j1 = split(Y.j, [64, 16])"
    assert cons.outside.reason == "every sketch does not split t4 L1"
    assert str(cons.outside).startswith(f"{cons.outside.span.line}:")
    assert cons.sketches  # what remains is satisfiable
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        placed = {s.args[0].text: s.args[1].text for s in p.stmts if s.prim == "compute_at"}
        assert placed.get("S") == "Y.i" and placed.get("M") == "E.i"


def test_layernorm_and_attention_scores():
    space = space_of("auto", "layernorm", "llvm")
    cons = C.constraints(space, stmts_of("layernorm", "llvm", """
        compute_at(S1, Y.i)
        k0, k1 = split(S2.k, [24, 32])
        S2_rf = rfactor(k1, 1)"""))
    assert cons.outside is None and cons.sketches and all(k in (3, 4, 5) for k in cons.sketches)
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        assert p.decisions[0] == (24, 32)
    space = space_of("auto", "attention_scores", "llvm")
    cons = C.constraints(space, stmts_of("attention_scores", "llvm", """
        d0, d1 = split(S.d, [4, 16])
        b0, b1, b2, b3 = split(S.b, [1, 3, 2, 2])"""))
    assert cons.outside is None
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        assert (1, 3, 2, 2) in p.decisions and (4, 16) in p.decisions


def test_cuda_matmul_cooperative_fetch_and_tiles():
    space = space_of("matmul", "matmul", "cuda")
    cons = C.constraints(space, stmts_of("matmul", "cuda", """
        AS = cache_read(C, A, shared)
        annotate(AS, "meta_schedule.cooperative_fetch", 4)
        k0, k1, k2 = split(C.k, [16, 8, 4])
        annotate(C, "meta_schedule.unroll_explicit", 1024)"""))
    assert cons.outside is None and set(cons.sketches) == set(space.usable)
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        assert p.decisions[2] == (16, 8, 4) and p.decisions[3] == 3 and p.decisions[5] == 7


# ---------------------------------------------------------------- outside the space
def test_more_parts_than_levels_is_outside_and_the_rest_remains():
    space = space_of("matmul", "matmul", "cpu")
    cons = C.constraints(space, stmts_of("matmul", "cpu", """
        i0, i1 = split(C.i, [8, 64])
        k0, k1, k2 = split(C.k, [2, 4, 64])
        annotate(C, "pragma_auto_unroll_max_step", 7)"""))
    assert [o.stmt for o in cons.dropped] == [1, 2]
    assert cons.outside.reason == "every sketch tiles t2 L2 into 2 factors, not 3"
    assert cons.dropped[1].reason == "every sketch has no legal value of UNROLL that fits the value written"
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        assert C.groups(p.decisions[0], (8, 64))


def test_a_statement_that_does_not_apply():
    space = space_of("matmul", "matmul", "cpu")
    cons = C.constraints(space, stmts_of("matmul", "cpu", """
        i0, i1 = split(C.i, [8, 64])
        vectorize(C.k)"""))
    assert cons.outside.stmt == 1 and cons.outside.reason.startswith("it does not apply: ")
    assert cons.sketches


# ---------------------------------------------------------------- cut-off MetaSchedule schedules
@pytest.mark.parametrize("file,op,target", [("matmul", "matmul", "cpu"), ("softmax", "softmax", "cpu"),
                                            ("conv2d", "conv2d", "cpu"), ("matmul", "matmul", "cuda")])
def test_metaschedule_schedules_whole_cut_and_shuffled(file, op, target):
    space = space_of(file, op, target)
    (p,), _ = space.sample(1, seed=11)
    # the whole schedule: every statement is in the space and the point holds its own constraints
    whole = C.constraints(space, p.stmts)
    assert whole.outside is None and p.sketch in whole.sketches and whole.holds(space, p)
    # a prefix: its decisions hold in every completion, and the sampled point is one of them
    cut = C.constraints(space, p.stmts[:len(p.stmts) // 2])
    assert cut.outside is None and cut.holds(space, p)
    assert_completions_hold(space, cut, seeds=(0,))
    # a shuffled subset: the statements that name only a stage's own loops, in a random order
    own = [s for s in p.stmts if s.prim == "compute_inline" or (s.prim == "split" and len(s.args[0].parts) == 2)]
    assert own
    random.Random(2).shuffle(own)
    mixed = C.constraints(space, own)
    assert mixed.outside is None and mixed.holds(space, p)
    fixed = {c.decision for cs in mixed.sketches[p.sketch].values() for c in cs if c.fixes}
    for q in assert_completions_hold(space, mixed, seeds=(4,)):
        if q.sketch == p.sketch:
            assert all(q.decisions[k] == p.decisions[k] for k in fixed)


# ---------------------------------------------------------------- the decoder
def test_constrained_decoder_forces_the_written_decisions():
    space = space_of("matmul", "matmul", "cpu")
    cons = C.constraints(space, stmts_of("matmul", "cpu", """
        j0, j1, j2, j3 = split(C.j, [2, 8, 2, 16])
        annotate(C, "pragma_auto_unroll_max_step", 512)"""))
    dec = C.ConstrainedTokens(space, cons)
    try:
        dec.push("SKETCH")
        dec.push(sorted(dec.allowed())[0])
        dec.push("DECISIONS")
        while dec.tokens[-1:] != ["L1"]:  # through the first tile to the head of C.j's
            dec.push(sorted(dec.allowed())[0])
        # the head's level count, the extent, the written factors innermost first with what each leaves,
        # then the head of the next decision (the tile of C.k)
        assert dec.forced()[:15] == ["4", "=", "512", "16", "=", "32", "2", "=", "16", "8", "=", "2", "2",
                                     "TILE", "t2"]
        for tok in ["4", "=", "512"]:
            dec.push(tok)
        assert dec.mask().sum() == 1 and dec.allowed() == {"16"} and len(dec.inner.allowed()) > 1
        for tok in ["16", "=", "32", "2", "=", "16", "8", "=", "2", "2"]:
            dec.push(tok)
        while len(dec.decisions) < 3:  # k free: several tokens
            dec.push(sorted(dec.allowed())[0])
        assert dec.allowed() == {"UNROLL"}
        dec.push("UNROLL")
        assert dec.allowed() == {"512"} and len(dec.inner.allowed()) == 4
    finally:
        dec.close()


def test_a_site_on_a_unit_loop_is_outside():
    """TVM offers no compute-at site on a loop of extent 1: the tile written with a 1 there and the site
    written on it cannot both hold; the site is the statement that leaves the space."""
    space = space_of("conv2d", "conv2d", "cpu")
    cons = C.constraints(space, stmts_of("conv2d", "cpu", """
        f0, f1, f2, f3 = split(Y.f, [8, 1, 2, 4])
        compute_at(P, f1)"""))
    assert cons.outside is not None and cons.outside.stmt == 1
    assert cons.outside.reason == "every sketch has no legal value of TILE t3 L1 4 that fits the factors written"
    for p in assert_completions_hold(space, cons, seeds=(0,)):
        assert p.decisions[1] == (8, 1, 2, 4)


def test_a_site_on_a_part_of_a_coarser_split():
    """P at the first of 2 written parts of Y.f, which the sketch tiles into 4: the site is the innermost
    loop of the factors that make up the first part (f_0 or f_1, or f_2 when the grouping puts 3 there)."""
    space = space_of("conv2d", "conv2d", "cpu")
    cons = C.constraints(space, stmts_of("conv2d", "cpu", """
        f0, f1 = split(Y.f, [8, 8])
        compute_at(P, f0)"""))
    assert cons.outside is None
    assert [c.grouped[:3] for c in cons.sketches[0][8] if c.grouped] == [(1, (8, 8), 0)]
    for p in assert_completions_hold(space, cons, seeds=(0, 1, 2)):
        f = p.decisions[1]
        site = [s.args[1].text for s in p.stmts if s.prim == "compute_at" and s.args[0].text == "P"]
        ends = [q for q in range(4) if f[q] > 1 and C.groups(f[:q + 1], (8,)) and C.groups(f[q + 1:], (8,))]
        assert site and site[0] in {f"f_{q}" for q in ends}, (f, site)


def test_cli_space_complete(tmp_path, capsys):
    """`tensorlang space FILE --op OP --target T --complete`: the file's partial schedule, completed; what
    is not enforced and what is outside the space on stderr, with the file's line."""
    from tensorlang.cli import main
    src = (EX / "matmul.tsched").read_text()
    start = src.index("schedule matmul on cpu {")
    end = src.index("}", start) + 1
    f = tmp_path / "partial.tsched"
    f.write_text(src[:start] + "schedule matmul on cpu {\n    annotate(C, \"pragma_auto_unroll_max_step\", 16)\n"
                 "    j0, j1, j2, j3 = split(C.j, [4, 2, 4, 16])\n    vectorize(j3)\n"
                 "    k0, k1, k2 = split(C.k, [2, 4, 64])\n}" + src[end:])
    assert main(["space", str(f), "--op", "matmul", "--target", "cpu", "--complete", "--seed", "2"]) == 1
    out, err = capsys.readouterr()
    assert "j0, j1, j2, j3 = split(C.j, [4, 2, 4, 16])" in out  # as the user named them, too
    assert '"pragma_auto_unroll_max_step", 16)' in out
    line = src[:start].count("\n") + 5
    assert f"partial.tsched:{line}:5: `k0, k1, k2 = split(C.k, [2, 4, 64])` is outside the space: every sketch " \
           "tiles t2 L2 into 2 factors, not 3" in err
    assert f"partial.tsched:{line - 1}: not enforced: vectorize follows" in err


def test_dropping_a_statement_keeps_the_others_numbered_as_written():
    """When only a replay shows that statements leave no sketch a legal point together, the one that
    closes the first such prefix is dropped and the others' constraints are numbered as the user wrote them."""
    space = space_of("matmul", "matmul", "cpu")
    stmts = stmts_of("matmul", "cpu", """
        j0, j1, j2, j3 = split(C.j, [2, 8, 2, 16])
        parallel(j0)
        annotate(C, "pragma_auto_unroll_max_step", 512)""")
    rest = C.constraints(space, stmts[:1] + stmts[2:])
    first = C.Outside(1, stmts[1].span, "parallel(j0)", "why")
    merged = C._with_dropped(rest, tuple(stmts), first)
    assert merged.outside is first and merged.stmts == tuple(stmts)
    assert sorted(c.stmt for cs in merged.sketches[0].values() for c in cs) == [0, 2]


def test_forked_constrained_decoders_go_on_apart():
    space = space_of("softmax", "softmax", "cpu")
    cons = C.constraints(space, stmts_of("softmax", "cpu", "compute_at(S, Y.i)\nk0, k1 = split(M.k, [32, 32])"))
    dec = C.ConstrainedTokens(space, cons, eager=True)
    try:
        for tok in ["SKETCH"]:
            dec.push(tok)
        assert {int(t) for t in dec.allowed()} == set(cons.sketches)
        dec.push(sorted(dec.allowed())[0])
        other = dec.fork()
        rng = random.Random(0)
        for d in (dec, other):
            while not d.done:
                d.push(rng.choice(sorted(d.allowed())))
        for d in (dec, other):
            p = d.finish()
            assert cons.holds(space, p)
            assert any(s.prim == "compute_at" and s.args[0].text == "S" and s.args[1].text == "Y.i" for s in p.stmts)
        other.close()
    finally:
        dec.close()
