"""Tensor sentences v2: exact tokens for small cases, a prompt that says everything (the operator rebuilt
from it computes what the original does), task keys that tell operators apart, and the decoder API."""
import gc
import glob
import hashlib
import math
import threading
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlang import api, interp
from tensorlang.data.collect import op_hash
from tensorlang.space import sentence as S
from tensorlang.space.space import Point, Space

from conftest import ROOT

ZEN4 = 'target cpu = llvm(mcpu = "znver4", cores = 2, l1_kb = 32, l2_kb = 1024)\n'
PADDED_CONV = ZEN4 + """
op pc(X: f32[1, 4, 6, 6], W: f32[4, 4, 3, 3]) -> Y: f32[1, 4, 6, 6] {
    P: f32[1, 4, 8, 8]
    P[n, c, h, w] = X[n, c, h - 1, w - 1] if 1 <= h < 7 and 1 <= w < 7 else 0.0
    Y[n, f, y, x] += P[n, c, y + r, x + s] * W[f, c, r, s]
}
"""


def op_of(text: str, name: str | None = None):
    doc = api.load_text(text)
    assert not [d for d in doc.diagnostics if d.severity == "error"], doc.diagnostics
    return doc, doc.model.ops[name or next(iter(doc.model.ops))]


def test_prompt_of_a_small_operator_exactly():
    doc, op = op_of(ZEN4 + "op add(A: f32[4, 8], C: f32[4, 8]) -> B: f32[4, 8] {\n    B[i, j] = A[i, j] + C[i, j]\n}\n")
    assert S.target_tokens(doc.model.targets["cpu"]) == [
        "TARGET", "llvm", "cpu:znver4", "cores", "2", "vector_bits", "512", "l1_kb", "32", "l2_kb", "1024",
        "isa:sse4.2", "isa:avx", "isa:avx2", "isa:fma", "isa:avx512f", "isa:avx512bw", "isa:avx512vnni",
        "isa:avx512bf16", "isa:avx512vbmi"]
    assert " ".join(S.op_tokens(op)) == (
        "OP IN t0 f32 [ 4 8 ] IN t1 f32 [ 4 8 ] STAGE t2 f32 [ 4 8 ] = + t0 [ L0 , L1 ] t1 [ L0 , L1 ] OUT t2")
    _, renamed = op_of(ZEN4 + "op z(P: f32[4, 8], Q: f32[4, 8]) -> R: f32[4, 8] {\n    R[a, b] = P[a, b] + Q[a, b]\n}\n")
    assert S.op_tokens(renamed) == S.op_tokens(op)  # names do not matter


def test_padded_conv_sentence_exactly():
    """Every index an affine form of loop ids, the condition and the constant in full; each decision
    says what it decides: the tiles of t3's loops, the unroll depth, and the pad's compute-at site as
    t3's loop over L3, the second of the loops L3 was split into."""
    doc, op = op_of(PADDED_CONV)
    assert " ".join(S.op_tokens(op)) == (
        "OP IN t0 f32 [ 1 4 6 6 ] IN t1 f32 [ 4 4 3 3 ] "
        "STAGE t2 f32 [ 1 4 8 8 ] = if and and <= 1 L2 < L2 7 and <= 1 L3 < L3 7 t0 [ L0 , L1 , L2 - 1 , L3 - 1 ] 0.0 "
        "STAGE t3 f32 [ 1 4 6 6 ] R 4 R 3 R 3 += * t2 [ L0 , L4 , L2 + L5 , L3 + L6 ] t1 [ L1 , L4 , L5 , L6 ] OUT t3")
    space = Space(op, doc.primfunc("pc"), doc.model.targets["cpu"])
    decisions = ((1, 1, 1, 1), (1, 4, 1, 1), (1, 6, 1, 1), (1, 6, 1, 1), (2, 2), (3, 1), (3, 1), 2, 7)
    tokens = S.encode(space, Point(0, decisions))
    assert " ".join(S.split(tokens)[1]) == (
        "SKETCH 0 DECISIONS TILE t3 L0 4 = 1 1 = 1 1 = 1 1 = 1 1 TILE t3 L1 4 = 4 1 = 4 1 = 4 4 = 1 1 "
        "TILE t3 L2 4 = 6 1 = 6 1 = 6 6 = 1 1 TILE t3 L3 4 = 6 1 = 6 1 = 6 6 = 1 1 TILE t3 L4 2 = 4 2 = 2 2 "
        "TILE t3 L5 2 = 3 1 = 3 3 TILE t3 L6 2 = 3 1 = 3 3 UNROLL 64 LOC t2 t3 L3 .1 [EOS]")
    assert S.decode(space, tokens) == (0, decisions)
    assert tokens[:4] == ["grammar:5", "vocab:2", "space:2", f"tvm:{S.tvm_version()}"]
    # the same sentence as v2 wrote it (no extents, outermost factor first) and as v3 wrote it (the
    # extents, outermost first) is upgraded to exactly this one
    from tensorlang.data.reencode import upgrade_tiles
    v2 = ["grammar:2"] + S.split(tokens)[0][1:] + (
        "SKETCH 0 DECISIONS TILE t3 L0 4 1 1 1 1 TILE t3 L1 4 1 4 1 1 TILE t3 L2 4 1 6 1 1 TILE t3 L3 4 1 6 1 1 "
        "TILE t3 L4 2 2 2 TILE t3 L5 2 3 1 TILE t3 L6 2 3 1 UNROLL 64 LOC t2 t3 L3 .1 [EOS]").split()
    v3 = ["grammar:3"] + S.split(tokens)[0][1:] + (
        "SKETCH 0 DECISIONS TILE t3 L0 4 = 1 1 = 1 1 = 1 1 = 1 1 TILE t3 L1 4 = 4 1 = 4 4 = 1 1 = 1 1 "
        "TILE t3 L2 4 = 6 1 = 6 6 = 1 1 = 1 1 TILE t3 L3 4 = 6 1 = 6 6 = 1 1 = 1 1 TILE t3 L4 2 = 4 2 = 2 2 "
        "TILE t3 L5 2 = 3 3 = 1 1 TILE t3 L6 2 = 3 3 = 1 1 UNROLL 64 LOC t2 t3 L3 .1 [EOS]").split()
    assert upgrade_tiles(v2) == tokens and upgrade_tiles(v3) == tokens
    with pytest.raises(ValueError, match="not a v2, v3 or v4 sentence"):
        upgrade_tiles(tokens)


def test_a_spelled_out_extent_and_what_is_left_of_it():
    """11008 = 2^8 * 43 has no token: the extent is spelled out like a factor, as its smooth part's token and
    the digits of the rest; the factors innermost first."""
    assert S.tile_value_tokens((1, 43, 256)) == (
        "= NUM> 256 4 3 <NUM 256 = 43 43 = 1 1").split()
    assert S.tile_value_tokens((1, 1, 688, 16)) == (
        "= NUM> 256 4 3 <NUM 16 = NUM> 16 4 3 <NUM NUM> 16 4 3 <NUM = 1 1 = 1 1").split()
    from tensorlang.data.reencode import respell  # grammar 4 spelled the digits alone
    assert respell("= NUM> 1 1 0 0 8 <NUM 16 = NUM> 6 8 8 <NUM NUM> 6 8 8 <NUM = 1 1 = 1 1".split()) == \
        S.tile_value_tokens((1, 1, 688, 16))


def test_numbers_are_exact():
    assert S.float_tokens(0.5) == ["0.5"] and S.float_tokens(1.0) == ["1.0"]
    assert S.float_tokens(1e-05) == ["FLT", "1", "NUM>", "-", "5", "<NUM"]
    assert S.float_tokens(768.0) == ["FLT", "768", "0"]
    for v in (0.7071067811865476, 3.4028234663852886e+38, 1e-12, 0.044715, 196.0):
        toks = S.float_tokens(v)
        m, i = S.read_int(toks, 1)
        e, _ = S.read_int(toks, i)
        assert float(f"{m}e{e}") == v
    _, op = op_of(ZEN4 + "op f(X: f32[8]) -> Y: f32[8] {\n    Y[i] = X[i] * 0.7071067811865476 + 1e-05 - 3.0\n}\n")
    assert "0.7071067811865476" in S.op_source(S.op_tokens(op)) and "1e-05" in S.op_source(S.op_tokens(op))
    assert S.int_tokens(11008) == ["NUM>", "256", "4", "3", "<NUM"] and S.int_tokens(12544) == ["12544"]


@given(st.integers(-10**15, 10**15))
def test_an_integer_reads_back_and_says_its_smooth_part(n):
    """Every integer reads back exactly; one outside the vocabulary starts with its smooth part's token (a
    divisor of it made of 2s, 3s, 5s, 7s, as large as has a token) and the rest is digits, 1 left out."""
    toks = S.int_tokens(n)
    assert S.read_int(toks + ["LOC"], 0) == (n, len(toks))
    assert S.digits_spelled(toks) == (["NUM>"] + ["-"] * (n < 0) + list(str(abs(n))) + ["<NUM"]
                                      if len(toks) > 1 else toks)
    if len(toks) > 1:
        k = 2 + (n < 0)
        s, rest = int(toks[k - 1]), abs(n) // int(toks[k - 1])
        assert abs(n) % s == 0 and s in S.INTS and s == S.smooth_part(abs(n))
        assert toks[k:-1] == (list(str(rest)) if rest > 1 else [])
        assert rest == 1 or rest % 2 or s * 2 > S.INTS[-1]  # no factor 2 left behind, unless s is at the cap


def test_task_keys_hash_the_digits_so_they_outlive_the_spelling():
    """A task's key is the hash of its operator spelled in digits alone (grammar 4's spelling): LLaMA's
    11008-wide matmul keeps the key the held-out split holds."""
    from tensorlang.data import split
    doc = api.load(ROOT / "data/workloads/llama7b-layer/matmul2.tsched")
    op = doc.model.ops["matmul2"]
    assert "NUM> 256 4 3 <NUM" in " ".join(S.op_tokens(op))
    key = hashlib.sha256(" ".join(S.digits_spelled(S.op_tokens(op))).encode()).hexdigest()[:16]
    assert op_hash(op) == key and key in split.heldout_keys(split.DEFAULT_PATH)


# The same shapes throughout: only the stride or where the padding goes differs (v1 read both as `E`).
CONV = ZEN4 + """
op conv(X: f32[1, 8, 32, 32], W: f32[8, 8, 3, 3]) -> Y: f32[1, 8, 16, 16] {{
    P: f32[1, 8, 34, 34]
    P[n, c, h, w] = X[n, c, h - {pad}, w - {pad}] if {pad} <= h < {hi} and {pad} <= w < {hi} else 0.0
    Y[n, f, y, x] += P[n, c, y * {stride} + r, x * {stride} + s] * W[f, c, r, s]
}}
"""


def conv(stride=1, pad=1):
    return op_of(CONV.format(pad=pad, hi=32 + pad, stride=stride))[1]


def test_task_keys_tell_operators_apart():
    """+ and *, a stride-2 convolution and a stride-1 one, a padded read and one padded otherwise: v1 gave
    each pair one key; v2 keys differ, and a renamed copy keeps its key."""
    from tensorlang.data.reencode import v1_hash

    def ew(op):
        return op_of(ZEN4 + f"op e(A: f32[8], C: f32[8]) -> B: f32[8] {{\n    B[i] = A[i] {op} C[i]\n}}\n")[1]
    for a, b in [(ew("+"), ew("*")), (conv(stride=1), conv(stride=2)), (conv(pad=1), conv(pad=2))]:
        assert v1_hash(a) == v1_hash(b) and op_hash(a) != op_hash(b)
    renamed = op_of(ZEN4 + """
op other(In: f32[1, 8, 32, 32], K: f32[8, 8, 3, 3]) -> Out: f32[1, 8, 16, 16] {
    Pad: f32[1, 8, 34, 34]
    Pad[a, b, u, v] = In[a, b, u - 1, v - 1] if 1 <= u < 33 and 1 <= v < 33 else 0.0
    Out[a, o, p, q] += Pad[a, i, p * 2 + dy, q * 2 + dx] * K[o, i, dy, dx]
}
""")[1]
    assert op_hash(renamed) == op_hash(conv(stride=2))


def agree(a, b, seed: int = 0) -> bool:
    """Two operators compute the same on the same random inputs (by position) -- exactly, by the float64
    reference interpreter."""
    inputs = interp.random_inputs(a, seed)
    ra = interp.reference_outputs(a, inputs)
    rb = interp.reference_outputs(b, {tb.name: inputs[ta.name] for ta, tb in zip(a.inputs, b.inputs)})
    return all(np.array_equal(ra[ta.name], rb[tb.name], equal_nan=True) for ta, tb in zip(a.outputs, b.outputs))


WORKLOADS = sorted(glob.glob(str(ROOT / "data" / "workloads*" / "*" / "*.tsched"))) + \
    sorted(glob.glob(str(ROOT / "examples" / "*.tsched")))
# One of each kind of operator the models have (padding, gathers, rotary slicing, reductions, casts, ...).
SUBSET = ["examples/conv2d", "examples/softmax", "examples/dense_gelu", "examples/auto",
          "resnet50/fused_conv2d10_subtract4_divide4_expand_dims2_multiply4_expand_dims2_add8_relu4",
          "gpt2/take", "llama7b-layer/fused_reshape1_reshape3_transpose1_multiply4_strided_slice3_strided_slice4_"
          "tir_negative_concatenate2_multiply4_add2_broadcast_to2_reshape4", "bert-base/fused_softmax_broadcast_to5",
          "resnet50/max_pool2d", "bert-base/layer_norm", "mobilenetv2/mean"]


def subset_files():
    out = [f for f in WORKLOADS if any(f.endswith(s + ".tsched") for s in SUBSET)]
    assert len(out) >= len(SUBSET) - 1
    return out


def check_rebuild(files) -> list:
    bad = []
    for f in files:
        doc = api.load(f)
        for name, op in doc.model.ops.items():
            tokens = S.op_tokens(op)
            rebuilt = S.rebuild_op(tokens)  # from the prompt alone
            if S.op_tokens(rebuilt) != tokens or not agree(op, rebuilt):
                bad.append(f"{f}:{name}")
    return bad


def test_the_prompt_rebuilds_the_operator():
    assert check_rebuild(subset_files()) == []


@pytest.mark.slow
def test_the_prompt_rebuilds_every_extracted_workload_and_variant():
    assert len(WORKLOADS) > 500
    assert check_rebuild(WORKLOADS) == []


def check_shared_keys(files) -> tuple[int, list]:
    groups = defaultdict(list)
    for f in files:
        doc = api.load(f)
        for op in doc.model.ops.values():
            groups[op_hash(op)].append(op)
    shared = [ops for ops in groups.values() if len(ops) > 1]
    return len(shared), [ops[0].name for ops in shared if not all(agree(ops[0], o, seed=3) for o in ops[1:])]


def test_files_that_share_a_key_agree():
    files = [f for f in WORKLOADS if "/resnet50/" in f or "/resnet50-" in f]
    n, disagree = check_shared_keys(files)
    assert n > 0 and disagree == []


@pytest.mark.slow
def test_every_workload_sharing_a_key_agrees():
    n, disagree = check_shared_keys(WORKLOADS)
    assert n > 0 and disagree == []


# ---------------------------------------------------------------- decoder API
@pytest.fixture(scope="module")
def softmax():
    doc = api.load(ROOT / "examples" / "softmax.tsched")
    return Space(doc.model.ops["softmax"], doc.primfunc("softmax"), doc.model.targets["cpu"])


def test_mask_forced_fork_and_finish(softmax):
    (p,), _ = softmax.sample(1, seed=2)
    tokens = S.split(S.encode(softmax, p))[1]
    nt = S.NextTokens(softmax)
    ids = S.token_ids()
    forks = []
    for n, tok in enumerate(tokens):
        mask = nt.mask()
        assert mask.dtype == bool and mask.shape == (len(ids),)
        assert set(np.flatnonzero(mask)) == nt.allowed_ids() == {ids[t] for t in nt.allowed()}
        if n == len(tokens) // 2:
            forks.append(nt.fork())
        nt.push(tok)
    done = nt.finish()
    assert (done.sketch, done.decisions) == (p.sketch, p.decisions) and done.stmts
    # a fork goes on by itself: the same tail gives the same point, and the original is untouched
    f = forks[0]
    for tok in tokens[len(tokens) // 2:]:
        f.push(tok)
    assert f.finish().decisions == p.decisions and nt.tokens == tokens
    # forced tokens: a decision's instruction and subject follow its predecessor without a choice
    start = S.NextTokens(softmax)
    assert start.forced() == ["SKETCH"]
    start.push("SKETCH")
    start.push(str(p.sketch))
    head = start.forced()
    assert head[0] == "DECISIONS" and head[1] in ("TILE", "UNROLL") and start.tokens == ["SKETCH", str(p.sketch)]


def test_a_dropped_decoder_leaves_no_thread_blocked(softmax):
    (p,), _ = softmax.sample(1, seed=5)
    fresh = Space(softmax.op, softmax.mod, softmax.target)  # empty memos: the compute-at sites need the replay
    tokens = S.split(S.encode(softmax, p))[1]
    nt = S.NextTokens(fresh)
    for tok in tokens[:-3]:
        nt.push(tok)
    assert nt._replay is not None
    thread = nt._replay.thread
    assert thread.is_alive()  # waiting for the next decision
    del nt
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t is thread]


def test_eager_decoding_gives_the_same_legal_sets(softmax):
    points, _ = softmax.sample(3, seed=9)
    for p in points:
        tokens = S.split(S.encode(softmax, p))[1]
        fresh = Space(softmax.op, softmax.mod, softmax.target)
        lazy, eager = S.NextTokens(fresh), S.NextTokens(Space(softmax.op, softmax.mod, softmax.target), eager=True)
        for tok in tokens:
            assert lazy.allowed() == eager.allowed()
            lazy.push(tok)
            eager.push(tok)
        assert lazy.finish().decisions == eager.finish().decisions == p.decisions


def test_an_eager_replay_gets_a_decision_at_the_token_that_fixes_it(softmax):
    """A tile's outermost factor and its `= <what is left>` are forced: the replay is handed the tile at the
    free token that fixed it (a decoder then runs the replay during that token's model step), once, and the
    schedule is the one written."""
    points, _ = softmax.sample(6, seed=3)
    early = 0
    for p in points:
        nt = S.NextTokens(Space(softmax.op, softmax.mod, softmax.target), eager=True)
        for tok in S.split(S.encode(softmax, p))[1]:
            free = len(nt.allowed()) > 1
            made = len(nt.decisions)
            nt.push(tok)
            if nt._replay is not None and free and len(nt.decisions) == made and nt._phase == "CHOOSE":
                if nt._choice.determined() is not S.OPEN:
                    assert nt._replay.fed == made + 1  # fed before its last tokens
                    early += 1
            if nt._replay is not None:
                assert nt._replay.fed <= len(nt.decisions) + 1
        assert nt.finish().decisions == p.decisions
        nt.close()
    assert early > 0


def test_covering_prefixes_make_every_tile_part_run():
    from tensorlang.space.space import factorizations
    domains = [tuple(factorizations(3, 2, 64)), (7,), tuple(factorizations(56, 4, 64)), tuple(factorizations(1, 4, 64))]
    prefixes = S._covering(domains)
    assert 2 <= len(prefixes) <= 3  # a prime extent's two parts cannot both exceed 1 in one tile
    for j in (0, 2):
        parts = len(domains[j][0])
        assert all(any(pre[j][m] > 1 for pre in prefixes) for m in range(parts)), (j, prefixes)
    assert all(pre[1] == 7 and pre[3] == (1, 1, 1, 1) and all(pre[j] in domains[j] for j in (0, 2))
               for pre in prefixes)


def test_an_eager_decoder_finds_a_conv2ds_first_sites_derived(monkeypatch):
    """Choosing a sketch starts the background work for its decisions: the heads of its tiles, and the
    widening of its first compute-at decision (only tiles and an unroll before it): when the decoder gets
    there its sites are derived from what the widening saw, not replayed -- and finish() checks them
    against the full replay."""
    doc = api.load(ROOT / "examples" / "conv2d.tsched")
    tgt = api.resolve_target(doc, "cpu")
    space = Space(doc.model.ops["conv2d"], doc.primfunc("conv2d"), tgt)
    points, _ = space.sample(3, seed=0)
    answered = []
    real = S.derived_point
    monkeypatch.setattr(S, "derived_point", lambda *a: (lambda r: answered.append(r is not None) or r)(real(*a)))
    for p in points:
        dec = Space(doc.model.ops["conv2d"], doc.primfunc("conv2d"), tgt)
        nt = S.NextTokens(dec, eager=True)
        tokens = S.split(S.encode(space, p))[1]
        nt.push(tokens[0]), nt.push(tokens[1]), nt.push(tokens[2])  # SKETCH <k> DECISIONS
        assert nt.sketch == p.sketch
        S._info(dec)["widener"].jobs.join()  # a decoder's model steps for the tiles give it this time
        tiles = [pt for pt in dec.static_points(p.sketch)[1:] if pt is not None and pt.kind == "tile"]
        assert tiles and all("head" in pt.cache for pt in tiles)  # named before the decoder asks
        answered.clear()
        for tok in tokens[3:]:
            nt.push(tok)
        assert answered == [True]  # the compute-at decision, asked once, answered
        assert nt.finish().decisions == p.decisions
        nt.close()


def test_compute_at_sites_answered_by_shape_agree_with_replays():
    """NextTokens answers a compute-at decision met before under the same shape key (earlier sites, unit
    tile factors) without a replay: on sampled points of operators with many compute-at decisions, the
    sites so answered are the replay's."""
    files = [ROOT / "examples" / "softmax.tsched", ROOT / "examples" / "auto.tsched", ROOT / "examples" / "conv2d.tsched",
             *[f for f in WORKLOADS if f.endswith(("fused_softmax_broadcast_to5.tsched", "layer_norm.tsched"))]]
    checked = 0
    for f in files:
        doc = api.load(f)
        for name, op in doc.model.ops.items():
            target = api.resolve_target(doc, "llvm")
            space = Space(op, doc.primfunc(name), target)
            decoder = Space(op, doc.primfunc(name), target)  # its memo holds only what decoding met
            for p in space.sample_decisions(16, seed=1):
                nt = S.NextTokens(decoder)
                for tok in S.split(S.encode(space, Point(p[0], p[1])))[1]:
                    nt.push(tok)
                checked += len(nt._assumed)
                nt.finish()  # replays in full and compares every site answered by shape (raises if one differs)
                assert not nt._assumed
    assert checked > 20


@pytest.mark.parametrize("file,op,target,n", [("conv2d", "conv2d", "cpu", 40), ("softmax", "softmax", "cpu", 40),
                                              ("auto", "layernorm", "llvm", 40), ("matmul", "matmul", "cpu", 10)])
def test_compute_at_sites_derived_from_earlier_replays_are_the_replays(file, op, target, n):
    """A compute-at decision met under one coarse key (earlier sites, shaping categoricals; tile factors
    left out) is answered for another unit pattern from what earlier replays saw (SiteFacts): on sampled
    points, every site so derived -- the domain and each site's tokens -- is what a replay of that point
    gives; and most decisions of a conv2d's pad are answered so after a few replays."""
    doc = api.load(ROOT / "examples" / f"{file}.tsched")
    space = Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, target))
    derived = met = 0
    for sketch, decisions, _ in space.sample_decisions(n, seed=5):
        seen = []
        space.replay(sketch, lambda pt, prefix: (seen.append((pt, prefix)), decisions[len(prefix)])[1], convert=False)
        for point, prefix in seen:
            if point.kind != "location":
                continue
            met += 1
            answer = S.derived_point(space, sketch, prefix)
            if answer is not None:
                derived += 1
                assert (answer.domain, S.site_values(space, answer)) == (point.domain, S.site_values(space, point))
            S.remember_sites(space, sketch, prefix, point)
    if op == "conv2d":
        assert met == n and derived >= n // 2
    if op == "matmul":
        assert met == 0  # no compute-at decision: nothing to derive


def test_sentences_of_another_version_are_refused(softmax):
    tokens = S.encode(softmax, softmax.sample(1)[0][0])
    tokens[:3] = ["grammar:1", "vocab:1", "space:1"]
    with pytest.raises(S.SentenceError, match="made under grammar:1"):
        S.decode(softmax, tokens)


def test_vocabulary_is_small_and_has_the_reserved_tokens():
    words = S.vocabulary()
    assert len(words) == len(set(words)) < 1200
    assert {"Q0", "Q1", "Q2", "Q3", "[EOS]", "[PAD]", "cpu:emeraldrapids", "cpu:znver5", "cpu:graniterapids"} <= set(words)
    assert sum(w.lstrip("-").isdigit() for w in words) == len(S.INTS) < 800


# ------------------------------------------------------------------ re-encoding
def v1_sentence(space, point) -> str:
    """A v1 sentence as v1 wrote it: its prompt, then TILE factors / CAT index / LOC index."""
    from tensorlang.data.reencode import v1_prompt
    out = v1_prompt(space) + ["SKETCH", str(point.sketch), "DECISIONS"]
    for kind, v in zip(S.decision_kinds(space, point), point.decisions):
        out += {"tile": ["TILE"] + [str(f) for f in v] if kind == "tile" else [],
                "categorical": ["CAT", str(v)], "location": ["LOC", str(v)]}[kind]
    return " ".join(out + ["[EOS]"])


def test_reencode_rekeys_keeps_the_old_keys_and_lists_what_it_cannot(tmp_path):
    import hashlib

    from tensorlang.data import dataset
    from tensorlang.data.collect import record_key
    from tensorlang.data.reencode import reencode, v1_hash
    task = tmp_path / "mm.tsched"
    task.write_text(ZEN4 + "op mm(A: f32[64, 32], B: f32[32, 64]) -> C: f32[64, 64] {\n    C[i, j] += A[i, k] * B[k, j]\n}\n\n"
                    "op mmpad(A: f32[64, 32], B: f32[32, 64]) -> P: f32[65, 65] {\n    C: f32[64, 64]\n"
                    "    C[i, j] += A[i, k] * B[k, j]\n    P[i, j] = C[i + 0, j + 0] if i < 64 and j < 64 else 0.0\n}\n")
    doc = api.load(task)
    spaces = {n: Space(doc.model.ops[n], doc.primfunc(n), doc.model.targets["cpu"]) for n in ("mm", "mmpad")}
    root = tmp_path / "measured"
    old_hash = v1_hash(doc.model.ops["mm"])
    points, _ = spaces["mm"].sample(4, seed=1)
    excluded = next(iter(spaces["mmpad"].excluded))
    bad = spaces["mmpad"]._apply(excluded, lambda p, made: p.domain[0])[1]
    with dataset.Writer(root) as w:
        for n, p in enumerate(points):
            d = [list(x) if isinstance(x, tuple) else x for x in p.decisions]
            w.append({"key": record_key(old_hash, "cpu", "m1", p.sketch, p.decisions), "key_v1": f"orig{n}",
                      "task": {"file": str(task), "op": "mm", "hash": old_hash}, "target": "cpu", "machine": "m1",
                      "sketch": p.sketch, "decisions": d, "sentence": v1_sentence(spaces["mm"], p), "status": "ok"})
        w.append({"key": "pretrain-style", "task": {"file": str(task), "op": "mm", "hash": old_hash}, "target": "cpu",
                  "sentence": v1_sentence(spaces["mm"], points[0])})
        pad_hash = v1_hash(doc.model.ops["mmpad"])  # a point of a sketch space 2 excludes
        w.append({"key": "excluded", "task": {"file": str(task), "op": "mmpad", "hash": pad_hash}, "target": "cpu",
                  "sentence": v1_sentence(spaces["mmpad"], Point(excluded, tuple(bad)))})
        w.close(compress_open=True)
    (root / "metaschedule-32.done").write_text(f"{old_hash}|cpu|m1\n")
    (root / "model-candidates.done").write_text(f"{old_hash}|cpu|m1|tlm-4x256_v2+ab|beams=1||samples=8|T=0.4\n")
    summary = reencode(root, log=lambda m: None)
    assert (summary["records"], summary["reencoded"], summary["refused"]) == (6, 5, 1)
    assert list(summary["refused_reasons"]) == [f"not a point of space {S.SPACE_VERSION}: sketch {excluded} is not "
                                                f"usable: {spaces['mmpad'].excluded[excluded]}"]
    new_hash = op_hash(doc.model.ops["mm"])
    recs = {r["key_v1"] if "key_v1" in r else r["key"]: r for r in dataset.read(root)}
    for n, p in enumerate(points):
        r = recs[f"orig{n}"]  # a key_v1 already there is kept
        assert r["task"]["hash"] == new_hash and r["task"]["hash_v1"] == old_hash
        assert r["key"] == record_key(new_hash, "cpu", "m1", p.sketch, p.decisions)
        assert S.decode(spaces["mm"], r["sentence"].split()) == (p.sketch, p.decisions)
        assert r["versions"] == S.version_tokens()
    pre = recs["pretrain-style"]
    p = points[0]
    assert pre["key"] == hashlib.sha256(f"{new_hash}|cpu|{p.sketch}|{p.decisions}".encode()).hexdigest()
    assert S.decode(spaces["mm"], pre["sentence"].split()) == (p.sketch, p.decisions)
    assert recs["excluded"]["reencode_error"].startswith("not a point") and "hash_v1" not in recs["excluded"]["task"]
    assert (root / "metaschedule-32.done").read_text() == f"{new_hash}|cpu|m1\n"
    assert (root / "model-candidates.done").read_text() == f"{new_hash}|cpu|m1|tlm-4x256_v2+ab|beams=1||samples=8|T=0.4\n"
    again = reencode(root, log=lambda m: None)  # nothing left to do but the one it cannot
    assert (again["already_current"], again["reencoded"], again["refused"]) == (5, 0, 1)
    assert {r["key"] for r in dataset.read(root)} == {r["key"] for r in recs.values()}


def _older_schedule(space, p, version: int) -> list[str]:
    """The schedule part of a point's sentence as v2 (the factors alone) or v3 (`= <extent>` and `= <what
    is left>` between them) wrote it: each tile's factors outermost first."""
    out = ["SKETCH", *S.int_tokens(p.sketch), "DECISIONS"]
    for k, (pt, value) in enumerate(zip(S.decision_points(space, p.sketch, p.decisions), p.decisions)):
        out += list(S._head_of(space, p.sketch, k, pt))
        if pt.kind != "tile":
            out += S.value_tokens(space, pt, value)
            continue
        left = math.prod(value)
        for f in value:
            out += (["="] + S.int_tokens(left) if version == 3 else []) + S.int_tokens(f)
            left //= f
    return out + [S.EOS]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_reencode_upgrades_older_records_in_place_of_keys(tmp_path, version):
    """A v2, v3 or v4 dataset: each record's sentence is rewritten with today's tiles (extents said, factors
    innermost first; decoding to the stored point) and integers (`respell`), its versions are today's, and
    nothing else changes -- key, task hash, the .done lines; a second run copies."""
    from tensorlang.data import dataset
    from tensorlang.data.reencode import reencode
    doc, op = op_of(PADDED_CONV)
    space = Space(op, doc.primfunc("pc"), doc.model.targets["cpu"])
    points, _ = space.sample(3, seed=2)
    root, h = tmp_path / "measured", op_hash(op)
    versions = [f"grammar:{version}", "vocab:2", "space:2"]
    with dataset.Writer(root) as w:
        for n, p in enumerate(points):
            old = S.digits_spelled(versions + (S.encode(space, p)[3:] if version == 4 else
                                               S.split(S.encode(space, p))[0][3:] + _older_schedule(space, p, version)))
            assert old != S.encode(space, p)
            w.append({"key": f"k{n}", "task": {"file": "pc.tsched", "op": "pc", "hash": h}, "target": "llvm",
                      "machine": "m1", "sketch": p.sketch, "status": "ok", "sentence": " ".join(old),
                      "versions": versions, "decisions": [list(d) if isinstance(d, tuple) else d for d in p.decisions]})
        w.close(compress_open=True)
    (root / "metaschedule-64.done").write_text(f"{h}|llvm|m1\n")
    summary = reencode(root, log=lambda m: None)
    assert (summary["records"], summary[f"upgraded_v{version}"], summary["refused"]) == (3, 3, 0)
    assert summary["done_lines_unmapped"] == []
    recs = {r["key"]: r for r in dataset.read(root)}
    for n, p in enumerate(points):
        r = recs[f"k{n}"]
        assert r["sentence"].split() == S.encode(space, p) and r["versions"] == S.version_tokens()
        assert S.decode(space, r["sentence"].split()) == (p.sketch, p.decisions) and r["task"]["hash"] == h
    assert (root / "metaschedule-64.done").read_text() == f"{h}|llvm|m1\n"
    assert reencode(root, log=lambda m: None)["already_current"] == 3


def test_space_cli_prints_sentences_and_the_prompt(softmax):
    import subprocess
    import sys
    base = [sys.executable, "-m", "tensorlang", "space", str(ROOT / "examples" / "softmax.tsched"), "--op", "softmax",
            "--target", "cpu"]
    r = subprocess.run(base + ["--sample", "2", "--sentences"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(S.decode(softmax, line.split()) for line in lines)
    r = subprocess.run(base + ["--prompt"], capture_output=True, text=True, timeout=300)
    assert r.stdout.split() == S.prompt_tokens(softmax)


def _decode_twice_after(first, second, monkeypatch) -> list:
    """BERT-seq384's softmax, sketch 4 (rfactor): `first`, then `second` twice, decoded on one space; the
    compute-at decisions answered from site facts with other sites than the replay's."""
    doc = api.load(ROOT / "data/workloads-variants/bert-base-seq384/fused_softmax_broadcast_to5.tsched")
    op = "fused_softmax_broadcast_to5"

    def space_():
        return Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, "llvm"))
    space, decoder = space_(), space_()
    wrong = []
    met = S.NextTokens._met

    def spy(self, k, point):
        assumed = self._assumed.get(k)
        if assumed is not None and assumed is not point and assumed.domain != point.domain:
            wrong.append((k, assumed.domain, point.domain))
        return met(self, k, point)
    monkeypatch.setattr(S.NextTokens, "_met", spy)
    for p in (first, second, second):
        tokens = S.encode(space, p)
        nt = S.NextTokens(decoder)
        for t in S.split(tokens)[1]:
            assert t in nt.allowed()
            nt.push(t)
        q = nt.finish()
        nt.close()
        assert (q.sketch, q.decisions) == (p.sketch, p.decisions)
    return wrong


_REST = (2, 1, 2, 1, 4, -1)
_FIRST, _SECOND = Point(4, ((6, 64), (384, 1)) + _REST), Point(4, ((192, 2), (16, 24)) + _REST)


def test_rfactor_loops_are_not_taken_for_the_functions_own(monkeypatch):
    """rfactor's write-back block loops over the partial results in a loop TVM names `ax0`, as other
    blocks' loops are named, but of a tile factor's extent: its source is not "static" (loop_sources
    matches name and extent), so no site is answered from the first point's loops (found by `collect
    --model`, where the decoder raised)."""
    assert _decode_twice_after(_FIRST, _SECOND, monkeypatch) == []


def test_a_compute_at_answered_from_facts_that_do_not_hold_stays_exact(monkeypatch):
    """Facts that do not hold (here: loops matched by name alone, as loop_sources did before) answer a
    compute-at decision with the wrong sites once: the replay's own sites hold, the written site is one of
    them, so the sentence decodes exactly, and the facts stop answering."""
    from tensorlang.space import space as space_module
    real = space_module.loop_sources

    def by_name(loops, tile_loops, original):
        names = {n for n, _ in original}
        return real(loops, tile_loops, original | {(x.loop_var.name, space_module._int(x.extent)) for x in loops
                                                   if x.loop_var.name in names})
    monkeypatch.setattr(space_module, "loop_sources", by_name)
    wrong = _decode_twice_after(_FIRST, _SECOND, monkeypatch)
    assert len(wrong) == 1, wrong
