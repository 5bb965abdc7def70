"""A multi-level tile's innermost spatial level fits the vector register file.

In MetaSchedule's CPU multi-level tile (SSRSRS), the innermost spatial level sits inside both reduction
levels: each of its points is an accumulator that lives across the innermost reduction loop, and LLVM keeps
them in vector registers -- the product of every spatial loop's innermost factor, the stage's last spatial
loop (the one vectorised) counted in vectors of the target's lanes. Past the register file (32 vector
registers with AVX-512, 16 with AVX2, AVX or SSE) the accumulators spill, and every step of the innermost
reduction loads and stores them. In the measured corpus (data/measured, znver4: 316 tasks with at least 8 such
records, counted as `registers_needed` counts) the records whose register tile needs 33-64 registers run at a
median 7.8x their task's best (0.4 % within 1.25x of it), 65-128 at 8.3x, more at 9.9x; up to 16 registers at
3.6-3.7x (10-15 % within 1.25x). None of the 316 tasks has its fastest record above 32 registers. The shipped
model wrote 64 on EfficientNet's stem conv (`ff3 = 4, yy3 = 16, xx3 = 16`) and 210 on its 480-channel depthwise
conv2d25 (`ff3 = 15, yy3 = 14`: 1.10 ms against roller's 0.21), two held-out tasks whose shapes it had not seen.

`fitting_register_tile(space, point, decisions, sketch)`: at a CPU tile decision of a spatial loop of a
reduction stage's multi-level tile (its earlier spatial loops tiled by the decisions just before it), the
tiles whose innermost factor keeps the registers needed within the register file, where one does (at the last
spatial loop the tile's count, `registers_needed`; before it the fewest the later loops' tiles could make of
it, `least_registers`); None elsewhere. A preference for a decoder (ConstrainedTokens' `prefer`), a heuristic like
vector_tile's: a checkpoint turns it on with generation_config.json `fitting_register_tile`. The shipped one
does (since 2026-12-07; znver4, benchmarks/compare_models.py --register-tile on,off --only-differing,
benchmarks/results/compare_registers_znver4_*): none of the 36 validation schedules changes; 6 of 304 training
ones, 1.79x (4 wins: a RegNetY-448 conv 15.8 -> 3.5 ms, a ResNet-50 conv 3.6 -> 1.1; 2 losses: RegNetY-448's stem
conv 0.71x, and a 64x26219x256 matmul, 0.41x, whose 64 x 64 tile has no inner reduction loop and accumulates in
L1 rather than in registers); 2 of 22 held-out ones, 1.59x (both wins). A first count without contiguous runs
(registers_needed without the merge) changed 10 training schedules, 1.34x, losing 2.5x on two MobileNetV2-128
convs of 4 x 4 maps.
"""
from __future__ import annotations

import math

from tensorlang.space.sketch_trace import earlier_tiles

# What a benchmark's cache of generated schedules names this rule by: changed with what the rule keeps.
RULE = "fitting-register-tile v1"


def vector_registers(space) -> int:
    """The vector registers of the space's CPU target (the architectural file: zmm0-31, ymm/xmm0-15)."""
    from tensorlang.machine import target_cpu
    return target_cpu(space.target.params).vector_registers


def registers_needed(inner: list[int], extents: list[int], lanes: int) -> int:
    """Vector registers of a register tile: the spatial loops' innermost factors (`inner`, loop order) over loops
    of `extents`. The last loop's factor is counted in vectors of `lanes` -- with the loops before it, as far
    back as every loop after them is covered whole, since those points are contiguous: a 4 x 4 feature map's
    yy3 = xx3 = 4 is one 16-wide run, which the postprocessor fuses and vectorises as one (`fuse(yy3, xx3)`)."""
    s = len(inner) - 1
    while s > 0 and inner[s] == extents[s]:
        s -= 1
    return math.prod(inner[:s]) * math.ceil(math.prod(inner[s:]) / lanes)


def least_registers(inner_before: list[int], extents_before: list[int], factor: int, extent: int, later: int,
                    lanes: int) -> int:
    """A lower bound on the registers of a register tile whose spatial loops after this one (of `extent`;
    `later`: the product of the later loops' extents) are not tiled yet: this loop's factor is a multiplier of
    its own, or -- where every later loop's factor is its whole extent -- in one run with them."""
    own = math.prod(inner_before) * factor
    return min(own, registers_needed(inner_before + [factor * later], extents_before + [extent * later], lanes))


def fitting_register_tile(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.space.space import TILE
    from tensorlang.space.vector_tile import vector_lanes
    if point.kind != TILE or space.target.is_gpu or point.role != "S" or point.n < 3:
        return None
    if not any(a[2] == "R" for a in point.axes):  # no accumulator: nothing stays in registers
        return None
    earlier = earlier_tiles(point, decisions)  # the loops around it: its stage's earlier spatial tiles
    if earlier is None:
        return None
    inner, extents = [t[-1] for t in earlier], [math.prod(t) for t in earlier]
    later = math.prod(a[1] for a in point.axes[point.axis + 1:] if a[2] == "S")
    lanes, registers = vector_lanes(space), vector_registers(space)

    def needed(f) -> int:
        if later == 1:  # the last spatial loop: the whole tile is known
            return registers_needed(inner + [f[-1]], extents + [math.prod(f)], lanes)
        return least_registers(inner, extents, f[-1], math.prod(f), later, lanes)
    kept = tuple(f for f in point.domain if needed(f) <= registers)
    return kept if kept and len(kept) < len(point.domain) else None
