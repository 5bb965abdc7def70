"""A multi-level tile leaves the cores something to run in parallel.

On a CPU, the outer two levels of a stage's spatial tiles (SSRSRS: the first two factors of each spatial
loop) are fused into the loop the postprocessor runs in parallel. When all of them are 1, nothing is
parallel and every core but one idles. The shipped model writes that for large matmuls (it fills the inner
levels innermost first and leaves the outer ones what is left, often 1): on znver4 (2 cores), 9 of its 44
one-pass schedules of benchmarks/tlm.py's tasks had no parallel loop, and 7 of those ran ~2x slower than
roller's (validation: BERT's fused_matmul_add2 1.85 against 0.97 ms, a TinyLlama matmul 138 against 39 ms;
held-out: LLaMA's matmul3 280 against 156 ms).

`parallel_outer(space, point, decisions)`: at a CPU tile decision of a stage's last spatial loop (its
other spatial loops tiled already, by the decisions just before it), the tiles whose
outer two factors bring the product of every spatial loop's outer two factors to at least the target's core
count, where one does; None elsewhere. A preference for a decoder (ConstrainedTokens' `prefer`), a heuristic
like vector_tile's: a checkpoint turns it on with generation_config.json `parallel_outer`. The shipped one
does: on znver4 (benchmarks/compare_models.py --parallel-tile on,off --only-differing) it changed 4 of 30
validation schedules (1.90x on them; the whole set ~1.09x), 6 of 257 training ones (1.19x; one depthwise-
free 1x1 conv lost, 0.36x) and 3 of 22 held-out ones (1.20x; LLaMA matmul3 278 -> 180 ms).
"""
from __future__ import annotations

import math


def parallel_outer(space, point, decisions=()) -> tuple | None:
    from tensorlang.machine import target_cpu
    from tensorlang.space.space import TILE
    if point.kind != TILE or space.target.is_gpu or point.role != "S" or point.n < 3:
        return None
    if any(a[2] == "S" for a in point.axes[point.axis + 1:]):  # not the stage's last spatial loop
        return None
    # The loops around it are its stage's earlier spatial tiles, n each; their factors are the last decisions
    # made (not the loops' extents: a decoder's point may hold the loops of an earlier replay).
    if len(point.outer) % point.n:  # other loops around it: no claim
        return None
    earlier = decisions[len(decisions) - len(point.outer) // point.n:] if point.outer else ()
    if any(not isinstance(t, (tuple, list)) or len(t) != point.n for t in earlier):
        return None
    before = math.prod(t[0] * t[1] for t in earlier)
    cores = target_cpu(space.target.params).cores
    kept = tuple(f for f in point.domain if before * f[0] * f[1] >= cores)
    return kept if kept and len(kept) < len(point.domain) else None
