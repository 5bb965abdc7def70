"""Repeated work (space/recompute.py): the factor a compute-at site multiplies a stage's work by, computed at the
decision without a replay, against what the scheduled module runs; the decoder's guard against repeated
reductions; and the TS315 warning on a hand-written schedule."""
import random

import pytest

from tensorlang import api
from tensorlang.parser import parse
from tensorlang.space import constraints as C
from tensorlang.space.recompute import no_repeated_reduction, repeated_blocks, site_repeats
from tensorlang.space.space import LOCATION

from conftest import ROOT, operator_space, random_point

GPT2_SOFTMAX = ROOT / "data" / "workloads" / "gpt2" / "fused_softmax_broadcast_to4.tsched"
GPT2_LAYERNORM = ROOT / "data" / "workloads" / "gpt2" / "layer_norm.tsched"


@pytest.fixture(scope="module")
def softmax():
    return operator_space(GPT2_SOFTMAX, "llvm")


def reductions_repeated(mod) -> dict:
    return {r.block: r.times for r in repeated_blocks(mod) if r.reduces}


@pytest.mark.parametrize("path", [GPT2_SOFTMAX, GPT2_LAYERNORM])
def test_site_repeats_are_what_the_scheduled_module_runs(path):
    """Seeded random points, half of them taking the innermost site at every compute-at decision: the factor
    predicted for each reduction's chosen site is how many times the built module runs its whole domain."""
    space = operator_space(path, "llvm")
    rng = random.Random(0)
    seen_repeats = set()
    for trial in range(12):
        predicted = {}

        def choose(point, prefix):
            value = max(point.domain) if trial % 2 else rng.choice(point.domain)
            if point.kind == LOCATION and point.placed_reduces:
                predicted[point.placed] = site_repeats(point, prefix)[value]
            return value
        sch = space.replay(rng.choice(space.usable), choose, convert=False)
        got = reductions_repeated(sch.mod)
        assert {b: n for b, n in predicted.items() if n > 1} == got
        seen_repeats |= set(got.values())
    assert seen_repeats, "no sample repeated a reduction: the comparison above checked only ones"


def test_the_guard_keeps_every_reduction_computed_once(softmax):
    """Random decoding through ConstrainedTokens: with the guard no point repeats a reduction; without it the
    same seeds do (the space offers those sites)."""
    unguarded = [reductions_repeated(random_point(softmax, None, s).mod) for s in range(10)]
    guarded = [reductions_repeated(random_point(softmax, no_repeated_reduction, s).mod) for s in range(10)]
    assert any(unguarded)
    assert not any(guarded)


def test_the_shipped_model_with_the_guard_and_a_written_site_that_repeats(softmax):
    from tensorlang.lm.generate import Generator
    gen = Generator()
    assert gen.guard  # the shipped checkpoint decodes with it
    out = gen.generate(softmax)
    assert reductions_repeated(out.point.mod) == {}
    # a compute_at the user wrote is kept, repeats and all: the guard yields to what is written
    module, diags = parse("schedule fused_softmax_broadcast_to4 on llvm {\n"
                          "    compute_inline(T_softmax_norm)\n"
                          "    compute_at(T_softmax_expsum, T_broadcast_to.ax3, preserve_unit_loops=True)\n}\n")
    assert not diags
    cons = C.constraints(softmax, tuple(module.schedules[0].stmts))
    assert cons.outside is None and cons.sketches
    written = gen.generate(softmax, cons)
    assert reductions_repeated(written.point.mod) == {"T_softmax_expsum": 128}


BAD = """op sm(X: f32[4, 64]) -> Y: f32[4, 64] {
    M: f32[4]
    M[i] max= X[i, k]
    E: f32[4, 64]
    E[i, j] = exp(X[i, j] - M[i])
    S: f32[4]
    S[i] += E[i, k]
    Y[i, j] = E[i, j] / S[i]
}

schedule sm on llvm {
    compute_at(S, Y.j)
    compute_at(M, E.i)
}
"""


def test_ts315_names_the_repeated_reduction_at_its_compute_at(tmp_path):
    f = tmp_path / "sm.tsched"
    f.write_text(BAD)
    doc = api.load(f)
    warned = [d for d in api.check(doc) if d.code == "TS315"]
    assert [(d.span.line, d.span.col, d.message) for d in warned] == [
        (12, 5, "S is computed 64 times over: its reduction runs again at every iteration of j, which no index of "
                "what it computes depends on; compute it at a loop outside it (or at the root) to compute it once")]
    fixed = api.load_text(BAD.replace("compute_at(S, Y.j)", "compute_at(S, Y.i)"), str(f))
    assert not [d for d in api.check(fixed) if d.code == "TS315"]
