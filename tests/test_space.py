"""The Space Builder: sampling is legal by construction, counts agree with enumeration,
traces convert to .tsched faithfully, and the baseline policies give legal schedules."""
import json
import subprocess
import sys

import pytest
import tvm_ffi

from tensorlang import api
from tensorlang.baselines import generate
from tensorlang.baselines.roller import Hardware, roller_point
from tensorlang.lower.schedule import apply_schedule
from tensorlang.parser import ast as A
from tensorlang.parser import parse
from tensorlang.space.convert import render_schedule, trace_to_statements
from tensorlang.space.space import Space, factorizations

from conftest import ROOT

EX = ROOT / "examples"
CPU_OPS = [("matmul", "matmul", "cpu"), ("dense_gelu", "dense_gelu", "cpu"), ("conv2d", "conv2d", "cpu"),
           ("softmax", "softmax", "cpu"), ("auto", "layernorm", "llvm"), ("auto", "attention_scores", "llvm")]


def space_of(file, op, target):
    doc = api.load(EX / f"{file}.tsched")
    return doc, Space(doc.model.ops[op], doc.primfunc(op), doc.model.targets[target])


def reapply(doc, op, target, stmts):
    """The statements as a schedule block of the file, applied by the normal checker path."""
    text = render_schedule(op, target, stmts)
    sched = parse(text)[0].schedules[0]
    return apply_schedule(doc.primfunc(op), doc.model.ops[op], sched)


def test_factorizations():
    assert factorizations(8, 2) == ((1, 8), (2, 4), (4, 2), (8, 1))
    assert factorizations(12, 3, 2) == tuple(f for f in factorizations(12, 3) if f[-1] <= 2)
    assert all(a * b * c == 60 for a, b, c in factorizations(60, 3))


@pytest.mark.parametrize("file,op,target", CPU_OPS, ids=[f"{o}-{t}" for _, o, t in CPU_OPS])
def test_samples_are_legal_and_correct_with_no_rejections(file, op, target):
    doc, space = space_of(file, op, target)
    points, rejections = space.sample(3, seed=7)
    assert rejections == 0
    assert len(points) == 3 and len({(p.sketch, p.decisions) for p in points}) == 3
    for p in points:
        applied = reapply(doc, op, target, p.stmts)  # the text, through the ordinary checker
        assert applied.ok, applied.diags
        assert tvm_ffi.structural_equal(applied.sch.mod, p.mod)
        low = api.Lowered(doc.model.ops[op], doc.model.targets[target], applied.sch.mod, "random", [])
        r = api.run_lowered(low, repeat=1)
        assert r.ok, (p.decisions, r)


GPU_OPS = [(f, o, "cuda") for f, o, _ in CPU_OPS]


def gpu_space_of(file, op):
    doc = api.load(EX / f"{file}.tsched")
    target = api.resolve_target(doc, "cuda")
    return doc, Space(doc.model.ops[op], doc.primfunc(op), target)


@pytest.mark.parametrize("file,op,target", GPU_OPS, ids=[f"{o}-cuda" for _, o, _ in GPU_OPS])
def test_gpu_samples_never_rejected_and_lower_to_kernels(file, op, target):
    """The joint GPU limits (threads 32..1024, vthreads, shared memory with pipeline copies) are in
    the domains: uniform sampling meets no VerifyGPUCode refusal, and every sample lowers."""
    from tensorlang.lower.build import emit
    doc, space = gpu_space_of(file, op)
    assert all(m is not None for m in space.gpu_models)  # every sketch of the examples is modelled
    points, rejections = space.sample(4, seed=5)
    assert rejections == 0 and len(points) == 4
    p = points[0]
    applied = reapply(doc, op, "cuda", p.stmts)  # the text, through the checker (GPU checks included)
    assert applied.ok, applied.diags
    assert "__global__" in emit(applied.sch.mod, space.tvm_target, "cuda", True)


@pytest.mark.parametrize("file,op", [("matmul", "matmul"), ("conv2d", "conv2d"), ("auto", "attention_scores")])
def test_gpu_model_agrees_with_verify_gpu_code(file, op):
    """On points drawn from the unrestricted domains (most of them illegal) and from the restricted ones
    (all legal), the model's verdict is
    VerifyGPUCode's plus the target's vthread limit. (MetaSchedule passes max_vthread=8 to VerifyGPUCode,
    but it checks it after InjectVirtualThread has removed the vthreads; our checker, TS402, and so the
    space, keep the limit.)"""
    import random
    from tvm import s_tir

    from tensorlang.lower.gpu import kernel_usage
    doc, space = gpu_space_of(file, op)
    verify = [p for p in space.postprocs if type(p).__name__ == "VerifyGPUCode"][0]
    others = [p for p in space.postprocs if p is not verify]
    rng = random.Random(3)
    verdicts = set()
    for n in range(24):
        sketch = n % len(space.sketches)
        model = space.gpu_models[sketch]
        sch, made = space._apply(sketch, lambda point, _: rng.choice(point.domain), model if n % 3 == 0 else None)
        with space.ctx.target:
            assert all(p.apply(sch) for p in others)
            legal = verify.apply(s_tir.Schedule(sch.mod)) and kernel_usage(sch.mod["main"])["vthreads"] <= 8
        values = {d: v for d, v in enumerate(made) if d in model.tile_extents}
        assert model.feasible(values) == legal, (sketch, made)
        verdicts.add(legal)
    assert verdicts == {True, False}  # both kinds were met


def test_gpu_domains_are_exact_against_enumeration():
    """A tile value is kept iff some completion of the remaining tiles fits: checked by enumerating
    every completion (the model's own figures, which the test above ties to VerifyGPUCode)."""
    from itertools import product
    doc = api.load_text("target g = cuda(arch = \"sm_90\")\nop mm(A: f32[64, 16], B: f32[16, 64]) -> C: f32[64, 64] {\n"
                        "    C[i, j] += A[i, k] * B[k, j]\n}\n")
    space = Space(doc.model.ops["mm"], doc.primfunc("mm"), doc.model.targets["g"])
    model = space.gpu_models[0]
    (group,) = model.groups
    tiles = sorted(group.decisions)
    domains = {d: factorizations(*model.tile_extents[d][:2], model.tile_extents[d][2]) for d in tiles}

    def fits(values):
        t, v, sh = model.usage(group, values)
        return group.low <= t <= group.high and v <= model.max_vthread and sh <= model.max_shared

    first, rest = tiles[0], tiles[1:]
    kept = set(model.restrict(first, domains[first], ()))
    brute = {a for a in domains[first]
             if any(fits({first: a, **dict(zip(rest, c))}) for c in product(*(domains[d] for d in rest)))}
    assert kept == brute and 0 < len(kept) < len(domains[first])


def test_count_matches_full_enumeration_on_a_small_operator():
    doc = api.load_text("target cpu = llvm(cores = 2)\nop mm(A: f32[4, 2], B: f32[2, 4]) -> C: f32[4, 4] {\n"
                        "    C[i, j] += A[i, k] * B[k, j]\n}\n")
    space = Space(doc.model.ops["mm"], doc.primfunc("mm"), doc.model.targets["cpu"])
    bound, exact = space.count(limit=0)  # the product of the domain sizes, no enumeration
    assert not exact
    # under the limit, count walks every decision path of every sketch (enumerate_sketch): once is enough here
    assert space.count(limit=10 ** 6) == (bound, True)


def test_domains_are_exact_for_tiles_and_categoricals():
    doc, space = space_of("matmul", "matmul", "cpu")
    seen = []
    space.replay(0, lambda point, prefix: (seen.append(point), point.domain[-1])[1], convert=False)
    tiles = [p for p in seen if p.kind == "tile"]
    assert [t.n for t in tiles] == [4, 4, 2]
    for t in tiles:
        assert set(t.domain) == {f for f in factorizations(512, t.n) if f[-1] <= t.max_innermost}
    with pytest.raises(ValueError):  # a value outside the domain is refused, not silently replaced
        space.replay(0, lambda point, prefix: (3, 3, 3, 3) if point.kind == "tile" else point.domain[0])


def test_metaschedule_sketches_convert_faithfully():
    for file, op, target in CPU_OPS[:4] + [("matmul", "matmul", "h200")]:
        doc, space = space_of(file, op, target)
        for trace in space.sketches:
            from tvm import s_tir
            sch = s_tir.Schedule(doc.primfunc(op))
            trace.apply_to_schedule(sch, remove_postproc=True)
            stmts, _ = trace_to_statements(sch.trace, doc.primfunc(op), doc.model.ops[op])
            applied = reapply(doc, op, target, stmts)
            assert applied.ok, applied.diags
            assert tvm_ffi.structural_equal(applied.sch.mod, sch.mod), (op, target)


def test_import_trace_cli(tmp_path):
    doc, space = space_of("dense_gelu", "dense_gelu", "cpu")
    p = space.replay(1, lambda point, prefix: point.domain[len(point.domain) // 2])
    trace_json = tmp_path / "t.json"
    trace_json.write_text(json.dumps(p.trace.as_json(remove_postproc=False), default=lambda o: o.value))
    r = subprocess.run([sys.executable, "-m", "tensorlang", "import-trace", str(EX / "dense_gelu.tsched"),
                        str(trace_json), "--op", "dense_gelu", "--target", "cpu"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    applied = reapply(doc, "dense_gelu", "cpu", parse(r.stdout)[0].schedules[0].stmts)
    assert applied.ok and tvm_ffi.structural_equal(applied.sch.mod, p.mod)


def test_roller_is_legal_deterministic_and_reads_the_hardware():
    doc, space = space_of("matmul", "matmul", "cpu")
    a, b = roller_point(space), roller_point(space)
    assert a.decisions == b.decisions
    assert reapply(doc, "matmul", "cpu", a.stmts).ok
    wide = Hardware("cpu", cores=2, vector_bytes=64, l1_bytes=48 * 1024, l2_bytes=2 << 20)
    narrow = Hardware("cpu", cores=2, vector_bytes=16, l1_bytes=16 * 1024, l2_bytes=256 << 10)
    pw, pn = roller_point(space, wide), roller_point(space, narrow)
    assert pw.decisions != pn.decisions
    # the innermost spatial tile is the vector width in floats
    assert pw.decisions[1][-1] == 16 and pn.decisions[1][-1] == 4


def test_roller_gpu_plan_respects_thread_limits():
    doc, space = space_of("matmul", "matmul", "h200")
    p = roller_point(space)
    applied = reapply(doc, "matmul", "h200", p.stmts)
    assert applied.ok
    from tensorlang.lower.gpu import check_gpu_schedule, kernel_usage
    assert check_gpu_schedule(applied.sch, applied.env, {"arch": "sm_90"}, A.NO_SPAN) == []
    assert 32 <= kernel_usage(applied.sch.mod["main"])["threads"] <= 1024


@pytest.mark.parametrize("policy", ["roller", "random:3"])
def test_policies_give_text_that_checks_and_runs(policy):
    doc = api.load(EX / "softmax.tsched")
    g = generate(policy, doc.primfunc("softmax"), doc.model.ops["softmax"], doc.model.targets["cpu"])
    assert g.mod is not None and g.schedule_text
    text = (EX / "softmax.tsched").read_text()
    text = text[:text.index("schedule softmax on cpu")] + "schedule softmax on cpu {\n" + "".join(
        "    " + line + "\n" for line in g.schedule_text.splitlines()) + "}\n"
    doc2 = api.load_text(text)
    assert [d for d in api.check(doc2) if d.severity == "error"] == []
    r = api.run_lowered(api.lower_op(doc2, "softmax", "cpu"), repeat=1)
    assert r.ok


# ------------------------------------------------------------ tensor sentences
from tensorlang.space import sentence as S  # noqa: E402


@pytest.mark.parametrize("file,op,target", CPU_OPS[:4], ids=[o for _, o, _ in CPU_OPS[:4]])
def test_sentences_round_trip(file, op, target):
    doc, space = space_of(file, op, target)
    points, _ = space.sample(4, seed=11)
    for p in points:
        tokens = S.encode(space, p)
        assert all(t in S.token_ids() for t in tokens)
        assert S.decode(space, tokens) == (p.sketch, p.decisions)


NEXT_TOKEN_CASES = [("softmax", "softmax", "cpu"), ("conv2d", "conv2d", "cpu"), ("auto", "layernorm", "llvm"),
                    ("matmul", "matmul", "h200"), ("softmax", "softmax", "cuda")]


@pytest.mark.parametrize("file,op,target", NEXT_TOKEN_CASES, ids=[f"{o}-{t}" for _, o, t in NEXT_TOKEN_CASES])
def test_next_tokens_are_exactly_the_domain(file, op, target):
    """Token by token, the legal set is the replayed domain (GPU limits included), whether the step was
    answered from the static table or by the replay: a decision's instruction and subject are forced, then
    a tile's factors narrow factor by factor, a categorical offers its legal candidates' values and a
    compute-at decision one distinct token sequence per legal site."""
    doc = api.load(EX / f"{file}.tsched")
    space = Space(doc.model.ops[op], doc.primfunc(op), api.resolve_target(doc, target))
    markers = {"tile": {"TILE"}, "categorical": {"UNROLL", "UNROLL_IMPLICIT", "VECTOR", "THREADS", "UNUSED"}, "location": {"LOC"}}
    points, _ = space.sample(3, seed=4)
    for p in points:
        domains = []
        gpu = space.gpu_models[p.sketch]
        it = iter(p.decisions)
        space._apply(p.sketch, lambda point, prefix: (domains.append(point), next(it))[1], gpu)
        tokens = S.encode(space, p)
        nt = S.NextTokens(space)
        n = len(S.prompt_tokens(space))
        assert nt.allowed() == {"SKETCH"}
        nt.push("SKETCH")
        assert nt.allowed() == {str(k) for k in space.usable}
        nt.push(str(p.sketch))
        nt.push("DECISIONS")
        for point, value in zip(domains, p.decisions):
            assert nt.allowed() <= markers[point.kind]  # the instruction, then its subject: forced
            while nt._phase == "HEAD":
                assert len(nt.allowed()) == 1
                nt.push(next(iter(nt.allowed())))
            if point.kind == "tile":
                for k in reversed(range(len(value))):  # innermost first
                    while nt._choice.pending:  # `= <extent>` / `= <what is left>`: forced
                        assert len(nt.allowed()) == 1
                        nt.push(next(iter(nt.allowed())))
                    assert nt.allowed() == {str(d[k]) for d in point.domain if d[k + 1:] == value[k + 1:]}
                    nt.push(str(value[k]))
            elif point.kind == "categorical":
                assert nt.allowed() == {str(point.candidates[i]) for i in point.domain}
                nt.push(str(point.candidates[value]))
            else:
                sites = S.site_values(space, point)
                assert sorted(v for _, v in sites) == sorted(point.domain)  # one sequence per site, all distinct
                assert len({s for s, _ in sites}) == len(point.domain)
                assert nt.allowed() == {s[0] for s, _ in sites}
                for tok in next(s for s, v in sites if v == value):
                    nt.push(tok)
            assert nt.decisions[-1] == value
        assert nt.allowed() == {S.EOS}
        nt.push(S.EOS)
        assert nt.done and tuple(nt.decisions) == p.decisions and nt.tokens == tokens[n:]
        done = nt.finish()  # the full replay, postprocessors included, accepts the point
        assert done.decisions == p.decisions and done.stmts
    with pytest.raises(S.SentenceError):
        S.NextTokens(space).push("DECISIONS")  # out of order


def test_sentence_of_another_version_is_refused():
    doc, space = space_of("matmul", "matmul", "cpu")
    (p,), _ = space.sample(1, seed=1)
    tokens = S.encode(space, p)
    tokens[2] = "space:0"
    with pytest.raises(S.SentenceError, match="made under"):
        S.decode(space, tokens)


def test_vocabulary_is_fixed_and_holds_every_small_integer(tmp_path):
    words = S.vocabulary()
    assert len(words) == len(set(words))
    assert all(str(i) in S.token_ids() for i in range(-2, 257))
    assert S.int_tokens(50257) == ["NUM>", "1", "5", "0", "2", "5", "7", "<NUM"]  # 29 * 1733: no smooth part
    assert S.read_int(S.int_tokens(50257), 0) == (50257, 8)
    assert S.int_tokens(3072) == ["3072"] and S.int_tokens(-5) == ["NUM>", "-", "5", "<NUM"]
    S.write_vocabulary(tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_text().split("\n")[:len(S.SPECIALS)] == S.SPECIALS


# ------------------------------------------------------------------ membership
from tensorlang.space.membership import locate  # noqa: E402


@pytest.mark.parametrize("file,op,target,seed", [("softmax", "softmax", "cpu", 13), ("dense_gelu", "dense_gelu", "cpu", 9),
                                                 ("auto", "layernorm", "cuda", 13)])
def test_sampled_schedules_test_as_in_the_space(file, op, target, seed):
    doc, space = space_of(file, op, target)
    points, _ = space.sample(3, seed=seed)
    for p in points:
        text = render_schedule(op, target, p.stmts)
        sched = parse(text)[0].schedules[0]
        applied = apply_schedule(doc.primfunc(op), doc.model.ops[op], sched)
        found = locate(space, applied.sch.mod, applied.sch.trace, sched.stmts)
        assert found.inside, p.decisions
        assert tvm_ffi.structural_equal(found.point.mod, applied.sch.mod)


def test_check_space_hints_outside_schedules_with_an_in_space_fix():
    doc = api.load(EX / "matmul.tsched")
    hints = [d for d in api.check(doc, space=True) if d.code == "TS314"]
    # Both hand-written schedules are legal but not in MetaSchedule's form (no cache_write / no vthread level).
    assert [(d.span.line, d.severity) for d in hints] == [(11, "hint"), (20, "hint")]
    fix = hints[0].suggestions[0]
    text = (EX / "matmul.tsched").read_text()
    start = text.index("schedule matmul on cpu {")
    end = text.index("}", start) + 1
    fixed = text[:start] + "schedule matmul on cpu {\n" + "".join(f"    {l}\n" for l in fix.splitlines()) + "}" + text[end:]
    doc2 = api.load_text(fixed)
    diags = api.check(doc2, space=True)
    assert not [d for d in diags if d.severity == "error"]
    cpu_line = next(s.span.line for s in doc2.ast.schedules if s.target == "cpu")
    assert [d.span.line for d in diags if d.code == "TS314"] == [
        next(s.span.line for s in doc2.ast.schedules if s.target == "h200")]
    assert cpu_line == 11


MS64 = sorted((ROOT / "tests" / "data" / "metaschedule64").glob("*.tsched"))


@pytest.mark.parametrize("path", MS64, ids=[p.stem for p in MS64])
def test_metaschedule_64_best_schedules_are_in_the_space(path):
    """MetaSchedule's best of 64 trials per example (from benchmarks/policies.py, converted from its
    trace) checks cleanly and tests as a point of the space: no TS314 hint."""
    doc = api.load(path)
    diags = api.check(doc, space=True)
    assert [(d.code, d.severity) for d in diags] == []


def test_sketches_that_leave_an_output_short_are_excluded():
    """TVM's reverse_compute_at of a padding epilogue covers only the tiles of its producer, so the
    border is never written: MetaSchedule keeps such sketches (its runner checks no results); the
    space excludes them, and every sample it gives computes every output point."""
    from tensorlang.space.space import uncovered_block
    doc = api.load_text("target cpu = llvm(cores = 1)\n\nop mmpad(A: f32[64, 32], B: f32[32, 64]) -> P: f32[65, 65] {\n"
                        "    C: f32[64, 64]\n    C[i, j] += A[i, k] * B[k, j]\n"
                        "    P[i, j] = C[i + 0, j + 0] if i < 64 and j < 64 else 0.0\n}\n")
    space = Space(doc.model.ops["mmpad"], doc.primfunc("mmpad"), doc.model.targets["cpu"])
    assert space.excluded and all("runs" in why for why in space.excluded.values())
    assert set(space.usable) | set(space.excluded) == set(range(len(space.sketches)))
    excluded = next(iter(space.excluded))
    sch, _ = space._apply(excluded, lambda point, made: point.domain[-1])
    assert uncovered_block(sch.mod).startswith("block P runs")  # whatever the decisions
    points, rejections = space.sample(4, seed=3)
    assert rejections == 0 and all(p.sketch in space.usable for p in points)
    for p in points:
        low = api.Lowered(doc.model.ops["mmpad"], doc.model.targets["cpu"], p.mod, "random", [])
        r = api.run_lowered(low, repeat=1)
        assert r.ok, (p.sketch, p.decisions, r)


def test_a_second_decoding_of_a_prefix_needs_no_replay():
    """Decisions met once are remembered by (sketch, decisions before them): decoding the same
    sentence again on CPU answers every step without starting the replay, with the same legal sets."""
    doc, space = space_of("softmax", "softmax", "cpu")
    (p,), _ = space.sample(1, seed=8)
    tokens = S.encode(space, p)[len(S.prompt_tokens(space)):]
    fresh = Space(doc.model.ops["softmax"], doc.primfunc("softmax"), doc.model.targets["cpu"])

    def decode():
        nt, seen = S.NextTokens(fresh), []
        for tok in tokens:
            seen.append(nt.allowed())
            nt.push(tok)
        return nt, seen

    first, first_sets = decode()
    assert first._replay is not None  # the first decoding replayed up to its compute-at sites
    second, second_sets = decode()
    assert second._replay is None and second_sets == first_sets
    second.finish()  # and the full replay accepts the point
    assert any(d.kind == "location" for d in fresh.point_memo.values())


def test_pipelined_sketches_keep_their_pipelined_loop():
    """TVM's InjectSoftwarePipeline fails (VerifyGPUCode refuses) when the pipelined reduction loop has
    extent 1: in the sketches that pipeline, an outer reduction factor of 1 is not in the domain."""
    from tvm import s_tir
    doc = api.load_text("target g = cuda(arch = \"sm_90\")\n\nop mm(A: f32[64, 32], B: f32[32, 64]) -> C: f32[64, 64] {\n"
                        "    C[i, j] += A[i, k] * B[k, j]\n}\n")
    space = Space(doc.model.ops["mm"], doc.primfunc("mm"), doc.model.targets["g"])
    pipelined = [k for k, m in enumerate(space.gpu_models) if m and any(g.pipelined_site for g in m.groups)]
    assert pipelined
    base = [(2, 1, 16, 2, 1), (2, 1, 2, 8, 2), (1, 1, 32), 3, 3, 5]
    for k in pipelined:
        model = space.gpu_models[k]
        assert (1, 1, 32) not in model.restrict(2, factorizations(32, 3, 64), tuple(base[:2]))
        assert (2, 1, 16) in model.restrict(2, factorizations(32, 3, 64), tuple(base[:2]))
        sch, _ = space._apply(k, lambda point, made: base[len(made)])  # unrestricted: the refused point
        verify = [p for p in space.postprocs if type(p).__name__ == "VerifyGPUCode"][0]
        with space.ctx.target:
            assert all(p.apply(sch) for p in space.postprocs if p is not verify)
            assert not verify.apply(s_tir.Schedule(sch.mod))


GROUPED_CONV = ("target cpu = llvm()\n\n"
                "op gconv(X: f32[1, 24, 16, 16], W: f32[24, 8, 3, 3]) -> Y: f32[1, 24, 8, 8] {\n"
                "    P: f32[1, 24, 18, 18]\n"
                "    P[n, c, h, w] = X[n, c, h - 1, w - 1] if 1 <= h < 17 and 1 <= w < 17 else 0.0\n"
                "    Y[n, f, y, x] += P[n, f // 8 * 8 + rc, y * 2 + ry, x * 2 + rx] * W[f, rc, ry, rx]\n}\n")


def test_no_compute_at_site_leaves_a_loop_of_varying_extent():
    """A grouped convolution reads its padded input through `f // 8 * 8 + rc`: under a tile of 6 output
    channels, which straddles the groups of 8, P computed at the outer channel loop would run a loop
    whose extent varies with that loop -- TVM's SampleComputeLocation offers the site, its postprocessor
    DisallowDynamicLoop refuses the schedule (15 of 100 uniform samples of this operator, 44 of 200 of
    RegNetY's conv2d2, before the probes checked extents). Such a site is not in the domain, the same site
    under a tile of 8 is, and the decision is never answered from another replay's facts (SiteFacts)."""
    from tensorlang.space import sentence as S
    doc = api.load_text(GROUPED_CONV)
    space = Space(doc.model.ops["gconv"], doc.primfunc("gconv"), doc.model.targets["cpu"])
    points, rejections = space.sample(30, seed=0)
    assert rejections == 0 and len(points) == 30

    def replayed(f_tile):
        """The point with this channel tile (the rest fixed), P at f_0 where legal; and its site decision."""
        before = ((1, 1, 1, 1), f_tile, (2, 1, 1, 4), (2, 1, 1, 4), (1, 8), (1, 3), (1, 3), 0)
        seen = []

        def choose(point, made):
            if len(made) < len(before):
                return before[len(made)]
            seen.append(point)
            return 1 if 1 in point.domain else point.domain[0]
        return space.replay(0, choose, convert=False), seen[0]  # with the postprocessors
    (aligned, at_f0), (straddling, not_at_f0) = replayed((3, 8, 1, 1)), replayed((4, 6, 1, 1))
    assert "f_0" in at_f0.sites and 1 in at_f0.domain and aligned.decisions[-1] == 1
    assert "f_0" not in not_at_f0.sites
    assert not at_f0.rule.affine and S.SiteFacts.of(at_f0) is None
    # A decoder that has met the aligned point does not answer the straddling one's site from it (the same
    # unit factors, so the same shape key and coarse key): P at f_0 after the tile of 6 is not a legal sentence.
    decoder = Space(doc.model.ops["gconv"], doc.primfunc("gconv"), doc.model.targets["cpu"])
    for p in (aligned, *points):
        nt = S.NextTokens(decoder)
        for tok in S.split(S.encode(space, p))[1]:
            nt.push(tok)
        assert nt.finish().decisions == p.decisions
        nt.close()
    ta, ts = S.split(S.encode(space, aligned))[1], S.split(S.encode(space, straddling))[1]
    at = ts.index("LOC") + 2  # LOC <block placed>, then the site: `t3 L1 .0` is f_0
    assert ta[at:at + 3] == ["t3", "L1", ".0"]
    nt = S.NextTokens(decoder)
    with pytest.raises(S.SentenceError):
        for tok in ts[:at] + ta[at:]:
            nt.push(tok)
    nt.close()
