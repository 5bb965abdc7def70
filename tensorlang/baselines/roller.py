"""`roller`: a Roller-style (OSDI'22) constructive heuristic over the Space Builder's decisions.

No measurement and no search: one point of the space, built from a hardware description.
For each multi-level-tiled stage the whole tile plan is made at its first tile decision
(MetaSchedule's sketches tile a stage's loops one after the other):

CPU ("SSRSRS": spatial tiles [outer, L2, L1, register], reduction tiles [outer, inner])
- rTile: the innermost spatial axis gets the vector width (in elements) as its register tile,
  the other spatial axes a register tile of up to 4 rows, so the accumulators fit the register file;
- scale up: the L1 tile grows the axis with the least reuse (the smallest tile) by its next
  divisor while the L1 working set (output tile + one reduction step of each input) fits L1,
  with the reduction step chosen the same way; the L2 tile likewise against L2;
- scale out: the outer tiles must give at least 2 x cores parallel iterations, else L2 tiles shrink.

GPU ("SSSRRSRS": spatial [blockIdx, vthread, threadIdx, inner, register], reduction [outer, shared, inner])
- threads: up to 256 per block (a multiple of the warp where the extents allow), spread over the
  spatial axes innermost first; a register tile of up to 4 per axis; vthread 1;
- the reduction step staged in shared memory grows while the shared tiles fit the target's
  static shared memory; blocks >= 2 x SMs where the extents allow.

Categorical decisions: unroll 64 (the nearest candidate), the widest cooperative-fetch vector,
a cross-thread reduction of 128 threads. Compute-at: inline where legal, else the root.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.targets import gpu_limits
from tensorlang.space.space import CATEGORICAL, LOCATION, TILE, DecisionPoint, Space

@dataclass(frozen=True)
class Hardware:
    """What the heuristic knows of the machine."""
    kind: str  # "cpu" | "gpu"
    cores: int = 1
    vector_bytes: int = 16
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    sms: int = 132
    max_threads: int = 1024
    shared_bytes: int = 48 * 1024
    registers: int = 65536
    warp: int = 32

    @staticmethod
    def of(target_model) -> "Hardware":
        if target_model.is_gpu:
            lim = gpu_limits(target_model.params)
            return Hardware("gpu", sms=lim["sms"], max_threads=lim["max_threads_per_block"],
                            shared_bytes=lim["max_shared_memory_per_block"], registers=lim["registers_per_block"],
                            warp=lim["warp_size"])
        from tensorlang.lower.targets import vector_bits
        from tensorlang.machine import target_cpu
        cpu = target_cpu(target_model.params)  # the host's caches, or the target's parameters
        return Hardware("cpu", cores=cpu.cores, vector_bytes=vector_bits(target_model) // 8,
                        l1_bytes=cpu.l1d_bytes, l2_bytes=cpu.l2_bytes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _largest_divisor_at_most(n: int, bound: int) -> int:
    return max(d for d in _divisors(n) if d <= max(bound, 1))


def _next_divisor(n: int, d: int, within: int) -> int | None:
    """The next divisor of `within` above d that divides n's remaining part, or None."""
    bigger = [x for x in _divisors(within) if x > d]
    return bigger[0] if bigger else None


class RollerPolicy:
    def __init__(self, hw: Hardware, dtype_bytes: int = 4):
        self.hw, self.dtype_bytes = hw, dtype_bytes
        self.plans: dict[str, dict[int, tuple[int, ...]]] = {}  # stage -> axis -> factors

    # -------------------------------------------------------------- choose
    def choose(self, point: DecisionPoint, prefix: tuple):
        if point.kind == TILE:
            return self.tile(point)
        if point.kind == CATEGORICAL:
            return self.categorical(point)
        if point.kind == LOCATION:
            # Inline where TVM can (elementwise producers), else at the root: a site inside the
            # consumer's loops recomputes the producer per consumer iteration, which the heuristic
            # cannot price without a cost model.
            return -2 if -2 in point.domain else -1
        return point.domain[0]

    def categorical(self, point: DecisionPoint) -> int:
        c = point.candidates
        if 0 in c and 64 in c or 0 in c and 16 in c:  # unroll steps
            want = 64
        elif set(c) <= {1, 2, 3, 4}:  # cooperative-fetch vector length
            want = 4
        else:  # cross-thread reduction threads, split factors
            want = 128
        best = min(point.domain, key=lambda i: (abs(math.log2(max(c[i], 1)) - math.log2(want)), -c[i]))
        return best

    def tile(self, point: DecisionPoint) -> tuple[int, ...]:
        plan = self.plans.get(point.stage)
        if plan is None or point.axis == 0:  # a stage's first tile decision sees all its loops
            plan = self.plans[point.stage] = self.plan(point)
        want = plan.get(point.axis)
        if want is not None and want in point.domain:
            return want
        # Not planned (or not legal here): the legal tiling nearest to "everything outer".
        return min(point.domain, key=lambda f: (f[-1] > 1, sum(x > 1 for x in f[1:]), f))

    # ---------------------------------------------------------------- plans
    def plan(self, point: DecisionPoint) -> dict[int, tuple[int, ...]]:
        axes = point.axes
        spatial = [i for i, a in enumerate(axes) if a[2] == "S"]
        reduce = [i for i, a in enumerate(axes) if a[2] == "R"]
        ext = {i: axes[i][1] for i in range(len(axes))}
        n_s = point.n if point.role == "S" else (5 if self.hw.kind == "gpu" else 4)
        n_r = 3 if self.hw.kind == "gpu" else 2
        if self.hw.kind == "gpu":
            return self._plan_gpu(spatial, reduce, ext, n_s, n_r, point.max_innermost)
        return self._plan_cpu(spatial, reduce, ext, n_s, n_r, point.max_innermost)

    def _plan_cpu(self, spatial, reduce, ext, n_s, n_r, max_inner):
        hw, b = self.hw, self.dtype_bytes
        lanes = max(hw.vector_bytes // b, 1)
        inner_cap = max_inner or 1 << 30
        reg = {}
        for k, i in enumerate(spatial):
            bound = lanes if k == len(spatial) - 1 else 4
            reg[i] = _largest_divisor_at_most(ext[i], min(bound, inner_cap))
        red = {i: 1 for i in reduce}

        def footprint(tile, step):
            out = math.prod(tile[i] for i in spatial)
            ins = sum(tile[i] for i in spatial) * math.prod(step[i] for i in reduce)
            return (out + ins) * b

        # L1: grow the reduction step, then the spatial tile with the least reuse, while it fits.
        l1 = dict(reg)
        for i in reduce:
            while True:
                nxt = _next_divisor(ext[i], red[i], ext[i])
                if nxt is None or nxt > inner_cap or footprint(l1, {**red, i: nxt}) > hw.l1_bytes // 2:
                    break
                red[i] = nxt
        self._scale_up(l1, spatial, ext, lambda t: footprint(t, red) <= hw.l1_bytes)
        l2 = dict(l1)
        self._scale_up(l2, spatial, ext, lambda t: footprint(t, red) <= hw.l2_bytes // 2)
        # Scale out: enough outer iterations for the cores.
        while math.prod(ext[i] // l2[i] for i in spatial) < 2 * hw.cores:
            grown = [i for i in spatial if l2[i] > l1[i]]
            if not grown:
                break
            i = max(grown, key=lambda j: l2[j] // l1[j])
            l2[i] = max(d for d in _divisors(ext[i]) if d < l2[i] and d % l1[i] == 0)
        plan = {}
        for i in spatial:
            outer, mid, inner = ext[i] // l2[i], l2[i] // l1[i], l1[i] // reg[i]
            plan[i] = _levels((outer, mid, inner, reg[i]), n_s)
        for i in reduce:
            plan[i] = _levels((ext[i] // red[i], red[i]), n_r)
        return plan

    def _plan_gpu(self, spatial, reduce, ext, n_s, n_r, max_inner):
        hw, b = self.hw, self.dtype_bytes
        inner_cap = max_inner or 1 << 30
        threads = {i: 1 for i in spatial}
        reg = {}
        rest = {}
        for i in spatial:
            reg[i] = _largest_divisor_at_most(ext[i], min(4, inner_cap))
            rest[i] = ext[i] // reg[i]
        budget = min(256, hw.max_threads)
        for i in reversed(spatial):  # innermost axis first: coalesced accesses
            have = math.prod(threads.values())
            threads[i] = _largest_divisor_at_most(rest[i], max(budget // have, 1))
        # Blocks: at least 2 x SMs where possible, by shrinking the per-thread tiles.
        def blocks():
            return math.prod(ext[i] // (threads[i] * reg[i]) for i in spatial)
        for i in spatial:
            while blocks() < 2 * hw.sms and reg[i] > 1:
                reg[i] = max(d for d in _divisors(ext[i] // threads[i]) if d < reg[i])
        step = {i: 1 for i in reduce}

        def shared(st):
            tile = sum(threads[i] * reg[i] for i in spatial)
            return tile * math.prod(st.values()) * b

        for i in reduce:
            while True:
                nxt = _next_divisor(ext[i], step[i], ext[i])
                if nxt is None or nxt > 32 or shared({**step, i: nxt}) > hw.shared_bytes // 2:
                    break
                step[i] = nxt
        plan = {}
        for i in spatial:
            plan[i] = _levels((ext[i] // (threads[i] * reg[i]), 1, threads[i], 1, reg[i]), n_s)
        for i in reduce:
            plan[i] = _levels((ext[i] // step[i], step[i], 1), n_r)
        return plan

    @staticmethod
    def _scale_up(tile, spatial, ext, fits):
        while True:
            # the axis with the least reuse is the one with the smallest tile
            for i in sorted(spatial, key=lambda j: tile[j]):
                nxt = [d for d in _divisors(ext[i]) if d > tile[i] and d % tile[i] == 0]
                if nxt and fits({**tile, i: nxt[0]}):
                    tile[i] = nxt[0]
                    break
            else:
                return


def _levels(factors: tuple[int, ...], n: int) -> tuple[int, ...]:
    """Fit a plan's levels to a sketch's n levels (merging the outermost when fewer)."""
    f = list(factors)
    while len(f) > n:
        f[0:2] = [f[0] * f[1]]
    while len(f) < n:
        f.insert(0, 1)
    return tuple(f)


def roller_point(space: Space, hw: Hardware | None = None):
    """The heuristic's one point: over the sketches in MetaSchedule's order, the first whose plan is
    accepted by the postprocessors, preferring sketches without rfactor (Roller's plain reductions)."""
    from tensorlang.space.space import Infeasible
    hw = hw or Hardware.of(space.target)
    dtype_bytes = max(D.BYTES[t.dtype] for t in space.op.outputs)
    order = sorted(space.usable,
                   key=lambda s: any(i.kind.name == "RFactor" for i in space.sketches[s].insts))
    last_error = None
    for s in order:
        policy = RollerPolicy(hw, dtype_bytes)
        try:
            return space.replay(s, policy.choose)
        except Infeasible as e:
            last_error = e
    raise Infeasible(f"no sketch accepts the roller plan: {last_error}")
