"""The rfactor preference (space/partial_sums.py): an rf stage whose partial sums are its split's innermost part
is computed at a consumer loop only where its strided loop unrolls; read off the sketch's trace, decided at
its compute-at from the tile and unroll step decoded before it."""
import pytest

from tensorlang import api
from tensorlang.space.partial_sums import strided_rfactors, unrolled, unrolled_partial_sums
from tensorlang.space.space import LOCATION, Space

from conftest import ROOT

MEAN = ROOT / "data" / "workloads" / "efficientnet-b0" / "mean.tsched"  # 1x32x112x112 -> 1x32x1x1, held out


@pytest.fixture(scope="module")
def mean():
    doc = api.load(MEAN)
    return Space(doc.model.ops["mean"], doc.primfunc("mean"), doc.model.targets["llvm"])


def test_the_trace_names_the_rfactor_of_the_inner_part(mean):
    """MetaSchedule's three sketches of a mean: rfactor of the split's outer part, of its inner part (the
    strided one: the tile is decision 0, the unroll step decision 1), and no rfactor."""
    found = {k: strided_rfactors(mean, k) for k in mean.usable}
    assert sorted(map(str, found.values())) == sorted(["{}", "{}", "{'lv10_red_rf': (0, 1, (0, 16, 64, 512))}"])


def kept_at_rf(space, sketch, tile, unroll):
    """What the preference keeps at the rf stage's compute-at after `tile` and unroll candidate `unroll`, the
    reduction computed at its consumer; and that compute-at's domain."""
    seen = {}

    def choose(p, made):
        if p.kind == LOCATION and p.placed.endswith("_rf"):
            seen["kept"], seen["domain"] = unrolled_partial_sums(space, p, made, sketch), p.domain
        return {0: tile, 1: unroll}.get(len(made), p.domain[-1])
    space.replay(sketch, choose, convert=False)
    return seen["kept"], seen["domain"]


@pytest.mark.parametrize("tile,unroll,root_only", [
    ((196, 64), 2, True),  # the shipped model's schedule: 196 strided steps, unroll step 64 -> 0.27 ms
    ((196, 64), 3, False),  # step 512 unrolls the 196 -> 0.030 ms (partial sums at the root: 0.038)
    ((224, 56), 3, False),
    ((256, 49), 3, True),  # 256 steps: past what LLVM vectorises once unrolled (0.27 ms)
    ((392, 32), 3, True),
    ((196, 64), 0, True),
])
def test_the_partial_sums_stay_at_the_root_unless_their_loop_unrolls(mean, tile, unroll, root_only):
    sketch = next(k for k in mean.usable if strided_rfactors(mean, k))
    kept, domain = kept_at_rf(mean, sketch, tile, unroll)
    assert -1 in domain and any(d >= 0 for d in domain)
    assert kept == ((-1,) if root_only else None)


@pytest.mark.parametrize("r,step,fast", [
    (49, 0, True), (56, 0, False), (64, 16, False), (64, 64, True), (98, 0, False), (128, 128, True),
    (224, 512, True), (256, 512, False), (256, 256, False)])
def test_which_strided_loops_unroll(r, step, fast):
    """The measured boundary (module docstring): TVM unrolls a loop of one statement up to the step, LLVM
    vectorises across the partial sums up to 224 steps of it, and unrolls up to 49 on its own."""
    assert unrolled(r, step) == fast


def test_the_other_sketches_keep_every_site(mean):
    """The rfactor of the outer part reads along memory wherever it is computed: no preference."""
    sketch = next(k for k in mean.usable if not strided_rfactors(mean, k) and "RFactor" in
                  {i.kind.name for i in mean.sketches[k].insts})
    kept, domain = kept_at_rf(mean, sketch, (196, 64), 0)
    assert kept is None and len(domain) > 1


def test_the_shipped_model_leaves_the_mean_partial_sums_at_the_root():
    """With the preference on (the shipped checkpoint's switch) the model's schedule of the held-out mean computes no
    strided partial sums at the channel loop; off, it does (the 13x loss to MetaSchedule it was written for).
    Written for the CPU it was measured on (znver4: the prompt names the CPU, and on another one the model may
    write another schedule), run on this host's; both agree with NumPy."""
    from tensorlang.lm.generate import Generator
    from tensorlang.lm import model as M
    assert M.generation_rule(M.DEFAULT_DIR, "partial_sums")  # the shipped decoding
    src = MEAN.read_text()
    doc = api.load_text(f'target z4 = llvm(mcpu = "znver4", cores = 2)\n{src}', "mean.tsched")
    znver4 = Space(doc.model.ops["mean"], doc.primfunc("mean"), doc.model.targets["z4"])
    gen = Generator()
    assert gen.partial_sums
    texts = {}
    for on in (False, True):
        gen.partial_sums = on
        texts[on] = gen.generate(znver4).schedule_text
    assert "compute_at(lv10_red_rf" in texts[False]
    assert "compute_at(lv10_red_rf" not in texts[True] and "lv10_red_rf = rfactor(" in texts[True]
    for on, text in texts.items():
        body = "".join(f"    {line}\n" for line in text.strip().splitlines())
        doc = api.load_text(f"target cpu = llvm()\n{src}\nschedule mean on cpu {{\n{body}}}\n", "mean.tsched")
        assert not api.check(doc, legality=False), on
        low = api.lower_op(doc, "mean", "cpu")
        assert not low.diagnostics and low.policy == "schedule", on
        result = api.run_lowered(low, repeat=1)
        assert result.ok and result.max_rel < 1e-5, (on, result)
