"""A compute-bound multi-level tile keeps several independent accumulators.

In MetaSchedule's CPU multi-level tile (SSRSRS) each vector register of the register tile (register_tile.py's
`registers_needed`) is an accumulator, and every step of the innermost reduction adds into each of them once: one
accumulator is one chain of dependent fused multiply-adds, each waiting the FMA's latency (4-5 cycles on the CPUs
here) for the one before it, while the FMA units could start one or two a cycle. Independent chains -- more
accumulators -- fill that gap. This matters where the kernel is bound by arithmetic, not by memory: an operator
whose compulsory traffic is small against its work (a 1x1 or 3x3 conv over many channels); a matrix-vector
product or a depthwise conv streams its data once, and there one accumulator is often the measured best.

The measured corpus says the same, split by the operator's arithmetic intensity (flops per byte of compulsory
traffic, `OpModel.bytes`; znver4, tasks with at least 16 records, each record's register tile counted as
`registers_needed` counts; `benchmarks/register_tiles.py`): of the 168 tasks at 16 flop/byte or more, 17 have
their fastest record on fewer than 4 registers, and their records on 1 register run within 1.25x of the task's
best in 2.7 % of cases (4-7 registers: 15.0 %, 8-16: 19.8 %); at 4-16 flop/byte 9 of 79 tasks and 2.2 %; below
4 flop/byte 55 of 61 tasks have their best on fewer than 4 registers (1 register: 13.1 % within 1.25x).
Random samples describe random samples (a rule drawn from such a count lost 0.70x side by side on 2026-12-07:
the card's notes); what the rule is worth is what benchmarks/compare_models.py --fma-chains on,off measures. It
was written after a held-out failure: the shipped model wrote one register of accumulators (`ff3 = yy3 = 1,
xx3 = 14`) on EfficientNet's 1x1 conv2d30 (480 -> 112 channels over 14 x 14, 31 flop/byte): 0.47 ms, where its
own sample with 16 ran at 0.16.

`enough_fma_chains(space, point, decisions, sketch)`: at a CPU tile decision of a spatial loop of a reduction
stage's multi-level tile, in an operator of at least MIN_INTENSITY flop/byte, the tiles that leave at least
MIN_CHAINS registers of accumulators -- at the last spatial loop the tile's own count, before it the most the
later loops' tiles could make of it (each taking its whole extent) -- where one does; None elsewhere. A
preference for a decoder (ConstrainedTokens' `prefer`), applied after the register-file one, so that the two keep
the tiles between MIN_CHAINS and the register file; a checkpoint turns it on with generation_config.json
`enough_fma_chains`.
"""
from __future__ import annotations

import math

from tensorlang.space.register_tile import registers_needed
from tensorlang.space.sketch_trace import earlier_tiles

# What a benchmark's cache of generated schedules names this rule by: changed with what the rule keeps.
RULE = "enough-fma-chains v1"

MIN_CHAINS = 4  # the FMA latency in cycles on the CPUs here, at one vector FMA a cycle
MIN_INTENSITY = 16.0  # flop per byte of compulsory traffic: the corpus's class where few chains are slow


def intensity(op) -> float:
    """The operator's flops per byte of compulsory traffic (every input read once, every output written once)."""
    return op.flops / max(1, op.bytes)


def enough_fma_chains(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.space.space import TILE
    from tensorlang.space.vector_tile import vector_lanes
    if point.kind != TILE or space.target.is_gpu or point.role != "S" or point.n < 3:
        return None
    if not any(a[2] == "R" for a in point.axes):  # no accumulator
        return None
    if intensity(space.op) < MIN_INTENSITY:
        return None
    earlier = earlier_tiles(point, decisions)
    if earlier is None:
        return None
    inner, extents = [t[-1] for t in earlier], [math.prod(t) for t in earlier]
    later = [a[1] for a in point.axes[point.axis + 1:] if a[2] == "S"]
    lanes = vector_lanes(space)

    def most(f) -> int:  # the later spatial loops' innermost factors at their whole extents: the largest tile
        return registers_needed(inner + [f[-1]] + later, extents + [math.prod(f)] + later, lanes)
    kept = tuple(f for f in point.domain if most(f) >= MIN_CHAINS)
    return kept if kept and len(kept) < len(point.domain) else None
