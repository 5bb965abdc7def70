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
at step 512 runs in 0.2 us (`tensorlang bench`, znver4), as MetaSchedule's. Side by side
(benchmarks/squeeze_conv_unroll.tsched, 15 rounds, znver4; benchmarks/results/squeeze_conv_unroll_znver4.json;
what each step unrolls from `tensorlang lower --emit unroll`):
- one accumulator at 64: 0.45 us -- rc1 (48) unrolls, ff2 (6) stays a loop: six 48-long chains one after
  another; at 512: 0.18 us -- ff2 unrolls too, the six chains interleave;
- six accumulators (`ff3 = 6`) at 64: 0.35 us -- ff3 unrolls, rc1 stays a loop of 48; at 512: 0.20 us;
- MetaSchedule-64's tile (`ff = [1, 1, 2, 3], rc1 = 2`) at 64: 0.18 us -- its 12-statement body unrolls
  whole inside a loop of 72.
So independent chains alone (six accumulators at 64) recover a third of the gap; the fast schedules are those
whose unrolled body holds them all.

`unrolled_single_accumulator(space, point, decisions, sketch)`: at a CPU sketch's unroll decision (its last),
where a multi-level tile decided before it has a single accumulator and more than one point in S2, the unroll
steps that unroll S2 (all such tiles' S2) and unroll nothing more of the other stages than the largest step
that leaves S2 alone (space/unroll_loop.py: the loops TVM's build unrolls at a step); None elsewhere. A
preference for a decoder (ConstrainedTokens' `prefer`) like partial_sums', switched on by a checkpoint's
generation_config.json (lm/decoding_rules.py).

Off in the shipped checkpoint; measured on znver4 both times and not backed by data it was not shaped on:
- v1 (the steps that unroll S2, nothing else asked) changed 6 of the 670 operators of data/workloads*, each from
  step 64 to 512 (benchmarks/compare_models.py tensorlang/lm/checkpoints/default --single-accumulator on,off
  --only-differing --set heldout, and --set train --indist 2000 --min-flops 0;
  benchmarks/results/compare_accumulator_znver4_*.json): 1 of 22 held-out schedules, the squeeze conv, 2.33x;
  3 of 439 training ones, 0.94x -- a RegNetY group conv 2.3x, a RegNetY-448 squeeze conv 1.0x, and RegNetY's
  squeeze conv at 7 x 7 0.35x (9.9 -> 28 us): its epilogue, computed under the tile
  (`reverse_compute_at(T_multiply, xx0)`), is 440 channels of sigmoid, and step 512 unrolls those 440 too.
- v2 (this one: nothing more unrolled elsewhere) keeps that 7 x 7 conv at its step, and with it the group conv
  (step 512 also unrolls its pad stage) and one batch-8 variant: 3 of the 670 operators change -- the held-out
  squeeze conv, its batch-8 variant and the RegNetY-448 conv (1.0x), 1 training operator.
- The measured corpus does not separate the cases either (benchmarks/unroll_pairs.py, records of one task that
  differ only in the unroll step, where the tile has a single accumulator and S2 more than one point and one
  step unrolls S2 and the other not; data/measured/llvm, znver4, 2026-12-07 evening,
  benchmarks/results/unroll_pairs_znver4.json): 43 pairs over 17 tasks, the S2-unrolling step a median 1.02x
  faster (58 % of pairs); the 24 pairs whose steps unroll the same of the other stages (v2's case) 1.01x, the
  19 whose larger step unrolls more 1.04x -- RegNetY's two 7 x 7 squeeze convs' pairs, 0.49x and 0.51x, among
  them. (A count made earlier that day read 1.23x over 22 tasks; its script is lost, and this one does not
  reproduce it.)
One training operator changed, neutral, and a corpus at 1.0x: switching the rule on would be choosing it on
the held-out conv it fixes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tensorlang.space.sketch_trace import decision_indices, per_sketch, tile_splits
from tensorlang.space.unroll_loop import unrolled_elsewhere

# What a benchmark's cache of generated schedules names this rule by (changed with what the rule keeps).
RULE = "unrolled-single-accumulator v2"

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
    blocks: frozenset[str] = frozenset()  # the tiled blocks (SSRSRS), as the sketch names them
    final: bool = True  # the unroll step is the sketch's last decision: the loop nest is known by then

    @property
    def stage_blocks(self) -> set[str]:
        """The tiled blocks as the scheduled function names them: decompose_reduction splits each into its
        `_init` and `_update` blocks."""
        return {b + suffix for b in self.blocks for suffix in ("", "_init", "_update")}


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
                                                   max(t.spatial + t.reduction) < unroll[0]),
                       frozenset(b for b in tiled if b is not None),
                       unroll[0] == max(k for k in index if k is not None))


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
    if not kept or len(kept) == len(point.domain) or not facts.final:
        return None
    # A kept step must unroll nothing more of the other stages than the largest step that leaves S2 alone
    func = scheduled_function(space, sketch, decisions)
    stage = facts.stage_blocks
    below = max((v for v in point.domain if v not in kept), key=lambda v: facts.steps[v])
    elsewhere = unrolled_elsewhere(func, facts.steps[below], stage)
    kept = tuple(v for v in kept if unrolled_elsewhere(func, facts.steps[v], stage) == elsewhere)
    return kept or None


def scheduled_function(space, sketch: int, decisions: tuple):
    """The sketch's function with these decisions, the unroll step (its last) the largest, postprocessors
    applied: the loop nest a step unrolls, parallel and vectorised loops in place."""
    point = space.replay(sketch, lambda p, made: decisions[len(made)] if len(made) < len(decisions)
                         else p.domain[-1], convert=False)
    return point.mod["main"]
