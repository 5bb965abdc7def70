"""An rfactor's partial sums are computed where their reads run along memory, or unrolled.

MetaSchedule's CPU rule for a long reduction (AddRFactor) fuses the reduction loops, splits the result in two
and rfactors one part: `rf[.., k1] += X[.., k0 * b + k1]`, the partial sums along k1. Left at the root, the rf
stage keeps the original loop order, k0 outside k1, so its innermost loop runs along memory and the
postprocessor vectorises it. Computed at a loop of its consumer (`compute_at(X_rf, ...)`), TVM regenerates its
loops spatial first: k1 (b partial sums) outside k0 (r = the other factors), so the innermost loop reads with
a stride of b elements and nothing is vectorised -- unless that loop is unrolled, after which LLVM vectorises
across the partial sums. EfficientNet's 32x112x112 mean (held out) is the case: the shipped model, left to
itself, writes `split [196, 64]`, the partial sums at the consumer's channel loop and unroll step 64: 0.129 ms
against MetaSchedule's 0.010 (benchmarks/tlm.py, znver4); at unroll step 512 the same schedule runs 9x faster.

`unrolled_partial_sums(space, point, decisions, sketch)`: at the compute-at decision of a CPU rfactor stage
whose partial sums are the split's innermost part, the root (no site) unless its r-long strided loop unrolls:
r at most the unroll step the sketch sampled before it (TVM's UnrollLoop unrolls a loop of one statement
whose extent is at most the step) and at most LONGEST_UNROLLED, or r at most LLVM_UNROLLS (LLVM unrolls
that one itself). None (every site) elsewhere. A preference for a decoder (ConstrainedTokens' `prefer`), a
heuristic read off measurements like vector_tile's: a checkpoint turns it on with generation_config.json
`unrolled_partial_sums`.

The constants were measured on znver4 (2-core AMD EPYC, LLVM of tvm 0.27) with the shipped model's mean
schedule and r x b in {196x64 .. 392x32} (`tensorlang run`, median ms, root-placed partial sums 0.038): at
unroll step >= r, r = 64, 98, 128, 196: 0.030-0.034, r = 224: 0.041, r = 256 (steps 256 and 512) and 392 (512):
0.27-0.30;
at steps 0 and 16, r = 49: 0.037, r = 56, 64, 98, 112: 0.16-0.27.
"""
from __future__ import annotations

import math

from tensorlang.space.sketch_trace import decision_indices, per_sketch, tile_splits

# The longest strided loop LLVM still vectorises across the partial sums once TVM has unrolled it (224
# measured fast, 256 9x slower), and the longest it unrolls on its own (49 fast, 56 slow).
LONGEST_UNROLLED = 224
LLVM_UNROLLS = 49

# What a benchmark's cache of generated schedules names this rule by (changed with what the rule keeps).
RULE = "unrolled-partial-sums v1"

_UNROLL_ANNOTATIONS = ("meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit")


@per_sketch
def strided_rfactors(space, sketch: int) -> dict[str, tuple[int, int | None, tuple]]:
    """{name of an rf stage whose partial sums are its split's innermost part: (the decision index of that
    split's tile, the decision index of the sketch's unroll step or None, the steps)}, read off the sketch's
    trace: a block's loops (GetLoops, then Fuse and Split) carry its name; a SamplePerfectTile's factors feed a
    Split, whose last loop an RFactor takes, making the block TVM names `<block>_rf`; a SampleCategorical's
    value is annotated as the unroll step."""
    insts = space.sketches[sketch].insts
    splits = tile_splits(insts)
    names: list = []  # (a block or loop variable, the name of its block)
    categorical: list = []  # (a sampled categorical's variable, its decision, its candidates)
    tiles: dict = {}  # rf stage -> the tile decision of its split
    unroll = (None, ())

    def name_of(rv):
        return next((n for v, n in names if v.same_as(rv)), None)
    for inst, k in zip(insts, decision_indices(insts)):
        kind = inst.kind.name
        if kind == "GetSBlock":
            names.append((inst.outputs[0], str(inst.attrs[0])))
        elif kind in ("GetLoops", "Fuse", "Split"):
            block = name_of(inst.inputs[0])
            names += [(v, block) for v in inst.outputs] if block is not None else []
        if kind == "SampleCategorical":
            categorical.append((inst.outputs[0], k, tuple(int(c) for c in inst.attrs[0])))
        elif kind == "RFactor":
            d = next((d for d, loops in splits if loops[-1].same_as(inst.inputs[0])), None)
            block = name_of(inst.inputs[0])
            if d is not None and block is not None:
                tiles[f"{block}_rf"] = d
        elif kind == "Annotate" and str(inst.attrs[0]) in _UNROLL_ANNOTATIONS:
            unroll = next(((d, c) for v, d, c in categorical if v.same_as(inst.inputs[1])), unroll)
    return {rf: (d, *unroll) for rf, d in tiles.items()}


def unrolled(r: int, step: int) -> bool:
    """Whether an r-long strided loop of partial sums unrolls (so LLVM vectorises across them) at unroll step
    `step`."""
    return r <= LLVM_UNROLLS or r <= min(step, LONGEST_UNROLLED)


def unrolled_partial_sums(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.space.space import LOCATION
    if point.kind != LOCATION or space.target.is_gpu or sketch is None:
        return None
    facts = strided_rfactors(space, sketch).get(point.placed)
    if facts is None:
        return None
    tile, unroll, steps = facts
    factors = decisions[tile] if tile < len(decisions) else None
    if not isinstance(factors, (tuple, list)):
        return None
    step = steps[decisions[unroll]] if unroll is not None and unroll < len(decisions) else 0
    if unrolled(math.prod(factors[:-1]), step):
        return None
    kept = tuple(d for d in point.domain if d < 0)
    return kept if kept and len(kept) < len(point.domain) else None
