"""A multi-level tile leaves the cores something to run in parallel.

On a CPU, the outer two levels of a stage's spatial tiles (SSRSRS: the first two factors of each spatial
loop) are fused into the loop the postprocessor runs in parallel. When all of them are 1, nothing is
parallel and every core but one idles. The shipped model writes that for large matmuls (it fills the inner
levels innermost first and leaves the outer ones what is left, often 1): on znver4 (2 cores), 9 of its 44
one-pass schedules of benchmarks/tlm.py's tasks had no parallel loop, and 7 of those ran ~2x slower than
roller's (validation: BERT's fused_matmul_add2 1.85 against 0.97 ms, a TinyLlama matmul 138 against 39 ms;
held-out: LLaMA's matmul3 280 against 156 ms).

`parallel_outer(space, point, decisions, sketch)`: at a CPU tile decision of a stage's last spatial loop
(its other spatial loops tiled already, by the decisions just before it), the tiles whose parallel levels
bring the product of every spatial loop's factors at those levels to at least the target's core count,
where one does; None elsewhere. The parallel levels are the outer two, or only the outermost where the
sketch computes a consumer (an epilogue, a cache write) at this loop's level-0 part: the postprocessor fuses
loops down to the first that holds more than one thing, so `reverse_compute_at(T, xx0)` leaves it
nn0 * ff0 * yy0 * xx0 to run in parallel. The model wrote that with every level-0 factor 1 on 4 of its 44
one-pass schedules of benchmarks/tlm.py's tasks (znver4): no parallel loop at all, EfficientNet's stem conv
1.75 ms against MetaSchedule-64's 0.93, a TinyLlama matmul 1.24 against roller's 0.61 ms. Never at the
cost of the innermost factor, which the model writes first: an innermost factor that no tile with enough
parallel work has keeps all its tiles (a 14-wide row kept whole as one vector stays unparallelised). And where
this loop must give the cores their work, never by emptying its inner levels, where a tile that keeps some
gives enough (v4): with an innermost 1 (no vector multiple of 5969 = 47 x 127) the model chose `[1, 5969, 1,
1]`, each parallel iteration walking the reduction alone.

A preference for a decoder (ConstrainedTokens' `prefer`), a heuristic like vector_tile's: a checkpoint turns
it on with generation_config.json `parallel_outer`. The shipped one does: on znver4 (benchmarks/
compare_models.py --parallel-tile on,off --only-differing) it changes 4 of 30 validation schedules (2.20x on
them, 4 wins), 8 of 257 training ones (1.74x, 8 wins) and 4 of 22 held-out ones (1.60x, 4 wins: LLaMA's
matmul 52 -> 29 ms, EfficientNet's stem conv 1.60 -> 1.21 ms). The first rule (outer two levels always)
changed 6 training schedules, 1.19x, losing 0.36x on one; with the level-0 case alone, 10, 1.26x, losing
2.3-2.7x on two 7- and 14-wide RegNet convs that the innermost rule now leaves alone.

v4 (2026-12-07): the 30 synthetic wide matmuls added after that measurement showed v3's blind spot: on all 439
training tasks (compare_models --parallel-tile on,off --indist 2000 --min-flops 0, benchmarks/results/
compare_parallel_allsizes_znver4_train.json) v3 changed 22, 1.01x, six wide matmuls of p*q-wide loops 3.7-9x
slower with `[1, N, 1, 1]`. In the measured corpus such tiles (the last spatial loop's inner levels 1, its outer
ones split) run at a median 9-16x their task's best at every extent, the best of 7 of 295 tasks. v4 against v3,
both decoded by the shipped model, each pair timed side by side (znver4): 14 of 670 operators change, all faster
-- 7 training wide matmuls 4.56x, 1 validation one 7.0x, 6 held-out depthwise convs (EfficientNet's and their
batch-8 variants) 2.69x. Applied also where earlier loops already gave the cores work, it changed 23 and lost
0.4-0.6x on five MobileNetV2/RegNetY convs.
"""
from __future__ import annotations

import math

from tensorlang.space.sketch_trace import earlier_tiles, per_sketch, tile_splits


# What a benchmark's cache of generated schedules names this rule by: changed with what the rule keeps
# (v2: only the outermost level where the sketch computes a consumer at level 0; v3: an innermost factor
# without a parallel tile keeps its tiles; v4: the inner levels are not emptied for the parallel ones).
RULE = "parallel-outer v4"


@per_sketch
def consumer_levels(space, sketch: int) -> dict[int, int]:
    """{decision index of a tile: the level of its split that the sketch computes a consumer at}, read off the
    sketch's trace: a SamplePerfectTile's factors feed a Split, whose i-th loop a ReverseComputeAt names."""
    insts = space.sketches[sketch].insts
    splits = tile_splits(insts)
    out: dict = {}
    for inst in insts:
        if inst.kind.name == "ReverseComputeAt":
            for d, loops in splits:
                level = next((i for i, lp in enumerate(loops) if lp.same_as(inst.inputs[1])), None)
                if level is not None:
                    out[d] = min(level, out.get(d, level))
    return out


def parallel_outer(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.machine import target_cpu
    from tensorlang.space.space import TILE
    if point.kind != TILE or space.target.is_gpu or point.role != "S" or point.n < 3:
        return None
    if any(a[2] == "S" for a in point.axes[point.axis + 1:]):  # not the stage's last spatial loop
        return None
    earlier = earlier_tiles(point, decisions)  # the loops around it: its stage's earlier spatial tiles
    if earlier is None:
        return None
    # a consumer computed at this loop's level-0 part leaves only level 0 to the parallel loop
    levels = 1 if sketch is not None and consumer_levels(space, sketch).get(len(decisions)) == 0 else 2
    before = math.prod(math.prod(t[:levels]) for t in earlier)
    cores = target_cpu(space.target.params).cores
    enough = {f for f in point.domain if before * math.prod(f[:levels]) >= cores}
    # Where this loop must give the cores their work, not by emptying its inner levels, where a tile that does
    # not gives enough: with an innermost 1 the model put a whole 5969-wide loop in the parallel level
    # ([1, 5969, 1, 1]), each iteration walking the reduction alone, 4x slower than [47, 1, 127, 1].
    if before < cores:
        enough = {f for f in enough if math.prod(f[levels:]) > 1} or enough
    # Never at the cost of the innermost (vectorised) factor, which a decoder writes first: an innermost
    # factor that no tile with parallel work has keeps its tiles. Forcing xx0 >= 2 on a 14-wide xx made the
    # model give up its 14-wide vector for [2, 1, 7, 1]: 2.3x slower on a MobileNet depthwise conv.
    reach = {f[-1] for f in enough}
    kept = tuple(f for f in point.domain if f in enough or f[-1] not in reach)
    return kept if enough and len(kept) < len(point.domain) else None
