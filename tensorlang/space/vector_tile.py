"""A stage's innermost spatial loop gets a register tile the vector units can fill.

On a CPU, the loop of a multi-level tile that the postprocessor vectorises is the innermost one; for the
output's contiguous axis (a stage's last spatial loop) an innermost factor of 1 leaves nothing contiguous to
vectorise -- the vector runs down a column or not at all. The shipped model wrote that on two held-out
tasks whose extents it had never seen (LLaMA-7B's 128x4096 @ 4096x11008: `split(i1, [1, 1, 11008, 1])`,
757 ms against roller's 70; EfficientNet's depthwise 32x112x112: `split(xx, [1, 112, 1, 1])`), where its
training analogues have 16.

`vector_innermost(space, point, decisions)`: at a CPU tile decision of a stage's last spatial loop, the tiles
whose innermost factor is a multiple of the vector width in elements, where the extent has one; None (every
tile) elsewhere. A preference for a decoder (ConstrainedTokens' `prefer`), unlike recompute's guard a
heuristic -- the one roller's register tile follows -- so a checkpoint turns it on (generation_config.json
`vector_innermost`) only where it was measured to help. The v4 model kept it off: on znver4
(benchmarks/compare_models.py --vector-tile on,off) it changed 2 of 22 held-out schedules (both of the
above: 11.8x and 1.9x), none of the 30 validation ones, and 3 of 257 training ones, all depthwise convs,
where the model's own choice was faster in two (0.94x, 0.50x; 1.47x in the third). The v5 model (shipped
2026-12-07) has it on: 0.998x on the 36 validation tasks (1 schedule differs: a wide matmul, a tie), 1.44x
on the 11 of 304 training tasks whose schedules it changes (6 wins: a 128x256x35584 matmul 144 -> 15.7 ms, a
RegNetY-448 group conv 6.1 -> 1.1; 5 losses, down to 0.44x), 1.03x held out (EfficientNet's depthwise
conv2d1 2.0 -> 1.1 ms) -- benchmarks/results/compare_vector_v5_znver4_*.json.
"""
from __future__ import annotations

# What a benchmark's cache of generated schedules names this rule by (changed with what the rule keeps).
RULE = "vector-innermost"


def vector_lanes(space) -> int:
    """The vector width of the space's CPU target in elements of the operator's output type (1: unknown)."""
    from tensorlang.analysis import dtypes as D
    from tensorlang.lower.targets import vector_bits
    itemsize = D.numpy_dtype(space.op.outputs[0].dtype).itemsize if space.op.outputs else 4
    return max(vector_bits(space.target) // (8 * itemsize), 1)


def vector_innermost(space, point, decisions=(), sketch=None) -> tuple | None:
    from tensorlang.space.space import TILE
    if point.kind != TILE or space.target.is_gpu or point.role != "S":
        return None
    spatial = [i for i, a in enumerate(point.axes) if a[2] == "S"]
    if not spatial or point.axis != spatial[-1]:
        return None
    lanes = vector_lanes(space)
    kept = tuple(f for f in point.domain if f[-1] % lanes == 0)
    return kept if kept and len(kept) < len(point.domain) else None
