"""A multi-level tile with a single accumulator is unrolled around its inner reduction.

In MetaSchedule's CPU multi-level tile (SSRSRS: S0 S1 R0 S2 R1 S3) the innermost spatial level S3 holds the
accumulators that live across the inner reduction loop R1. Where its tile is a single point (every spatial
loop's innermost factor 1), R1 is one chain of dependent multiply-adds, each waiting for the one before it --
latency-bound, however many FMA units the core has. Independent chains exist only in the spatial loops S2 just
outside R1, and LLVM interleaves them only once TVM has unrolled those loops: the sketch's unroll step
(`pragma_auto_unroll_max_step`) unrolls a loop when the steps of its body times its extent fit in it, so S2
unrolls when the product of its factors, R1's and S3's fits the step.

The shipped model wrote EfficientNet's squeeze-excite reduce conv (144 -> 6 channels on a 1 x 1 map, held out)
with `ff2 = 6, rc1 = 48`, every other factor 1, at step 64: 288 steps, not unrolled, 0.4 us; the same schedule
at step 512 runs in 0.2 us (`tensorlang bench`, znver4), as MetaSchedule's. The measured corpus says the same
of schedules the model did not write: among records of one task that differ only in the unroll step, where the
tile has a single accumulator and S2 more than one point, the step that unrolls S2 against one that does not
is a median 1.23x faster (37 pairs over 22 tasks, faster in 76 % of pairs; 16 of the 22 tasks favour it),
while pairs whose steps both unroll S2, or neither does, differ by 1.00x (data/measured, znver4).

`unrolled_single_accumulator(space, point, decisions, sketch)`: at a CPU sketch's unroll decision, where a
multi-level tile decided before it has a single accumulator and more than one point in S2, the unroll steps
that unroll S2 (all such tiles' S2), where one does; None elsewhere. A preference for a decoder
(ConstrainedTokens' `prefer`) like partial_sums', switched on by a checkpoint's generation_config.json
(lm/decoding_rules.py).

Off in the shipped checkpoint: the step is the whole loop nest's, not S2's alone. With the shipped model it
changes 6 of the 670 operators of data/workloads*, each from step 64 to 512. Measured on znver4
(benchmarks/compare_models.py tensorlang/lm/checkpoints/default --single-accumulator on,off --only-differing
--set heldout, and --set train --indist 2000 --min-flops 0; benchmarks/results/compare_accumulator_znver4_*.json):
1 of 22 held-out schedules changes, the squeeze conv, 2.33x; 3 of 439 training ones, 0.94x -- a RegNetY conv
2.3x, a RegNetY-448 squeeze conv 1.0x, and RegNetY's squeeze conv at 7 x 7 0.35x (9.9 -> 28 us): its epilogue,
computed under the tile (`reverse_compute_at(T_multiply, xx0)`), is 440 channels of sigmoid, and step 512
unrolls those 440 too (13,110 lines of LLVM IR and 448 calls of exp, against 2,037 lines). (The other two, the
batch-8 variants of held-out convs, ran 1.2x and 1.7x faster side by side in `tensorlang bench`.) A rule that
knew what else a step unrolls -- the stages the sketch computes under the tile, with the consumer's broadcast
axes -- could keep the wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tensorlang.space.sketch_trace import decision_indices, per_sketch, tile_splits

# What a benchmark's cache of generated schedules names this rule by (changed with what the rule keeps).
RULE = "unrolled-single-accumulator v1"

_UNROLL_ANNOTATIONS = ("meta_schedule.unroll_explicit", "meta_schedule.unroll_implicit")


@dataclass(frozen=True)
class MultiLevelTile:
    """A stage's SSRSRS tile in a sketch: the decision indices of its spatial (4 factors) and reduction
    (2 factors) tiles, in loop order."""
    spatial: tuple[int, ...]
    reduction: tuple[int, ...]


@dataclass(frozen=True)
class UnrollFacts:
    unroll: int  # the decision index of the sketch's unroll step
    steps: tuple[int, ...]  # its candidates
    tiles: tuple[MultiLevelTile, ...]


@per_sketch
def unroll_facts(space, sketch: int) -> UnrollFacts | None:
    """The sketch's unroll decision and the SSRSRS tiles decided before it, read off its trace: a block's
    loops (GetLoops) carry its name; a SamplePerfectTile of one of them, n factors, feeds a Split; a
    SampleCategorical's value is annotated as the unroll step. None where the sketch samples no unroll step."""
    insts = space.sketches[sketch].insts
    index = decision_indices(insts)
    split_of = {d: loops for d, loops in tile_splits(insts)}
    blocks: list = []  # (a block variable, its name)
    loops: list = []  # (a loop variable, the name of its block)
    tiled: set[str] = set()  # blocks annotated SSRSRS
    tiles: dict = {}  # block name -> [(decision, n)]
    categorical: list = []  # (variable, decision, candidates)
    unroll = None

    def name_of(rv, pairs):
        return next((n for v, n in pairs if v.same_as(rv)), None)
    for inst, k in zip(insts, index):
        kind = inst.kind.name
        if kind == "GetSBlock":
            blocks.append((inst.outputs[0], str(inst.attrs[0])))
        elif kind == "GetLoops":
            block = name_of(inst.inputs[0], blocks)
            loops.extend((v, block) for v in inst.outputs if block is not None)
        elif kind == "SamplePerfectTile" and k in split_of:
            block = name_of(inst.inputs[0], loops)
            if block is not None:
                tiles.setdefault(block, []).append((k, int(inst.attrs[0])))
        elif kind == "SampleCategorical":
            categorical.append((inst.outputs[0], k, tuple(int(c) for c in inst.attrs[0])))
        elif kind == "Annotate":
            key = str(inst.attrs[0])
            if key == "meta_schedule.tiling_structure" and str(inst.inputs[1]).strip('"') == "SSRSRS":
                block = name_of(inst.inputs[0], blocks)
                tiled |= {block} if block is not None else set()
            elif key in _UNROLL_ANNOTATIONS:
                unroll = next(((d, c) for v, d, c in categorical if v.same_as(inst.inputs[1])), unroll)
    if unroll is None:
        return None
    found = tuple(MultiLevelTile(tuple(d for d, n in tiles[b] if n == 4), tuple(d for d, n in tiles[b] if n == 2))
                  for b in sorted(tiled) if b in tiles)
    return UnrollFacts(unroll[0], unroll[1], tuple(t for t in found if t.spatial and
                                                   max(t.spatial + t.reduction) < unroll[0]))


def single_accumulator_region(spatial: list, reduction: list) -> int | None:
    """The steps TVM's unroll must take in to unroll S2 of a tile with these spatial and reduction factors
    (S2 x R1 x S3), where S3 is a single accumulator and S2 has more than one point; None otherwise."""
    if math.prod(f[-1] for f in spatial) != 1 or math.prod(f[-2] for f in spatial) == 1:
        return None
    return math.prod(f[-2] for f in spatial) * math.prod(f[-1] for f in reduction)


def unrolled_single_accumulator(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.space.space import CATEGORICAL
    if point.kind != CATEGORICAL or space.target.is_gpu or sketch is None:
        return None
    facts = unroll_facts(space, sketch)
    if facts is None or facts.unroll != len(decisions):
        return None
    regions = [single_accumulator_region([decisions[d] for d in t.spatial], [decisions[d] for d in t.reduction])
               for t in facts.tiles]
    regions = [r for r in regions if r is not None]
    if not regions:
        return None
    kept = tuple(v for v in point.domain if max(regions) <= facts.steps[v])
    return kept if kept and len(kept) < len(point.domain) else None
