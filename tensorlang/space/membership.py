"""Is a schedule a point of the space? (`tensorlang check --space`)

A schedule is in the space when its scheduled TIR is structurally equal to the replay of some
sketch with some decisions. The decisions are inferred from what the schedule wrote, then
confirmed by replaying and comparing -- so "in the space" is never a guess:

- a tile decision's candidates are the factor lists the schedule itself split with (its TVM
  trace), among the legal ones of the right length; then the legal tilings nearest to them;
- a categorical decision tries first the candidates whose values the schedule uses (annotation
  values, loop extents), then the others;
- a compute-at site tries every legal site.

The search is best-first over these orderings (fewest departures from the best guesses first),
with a budget of replays per sketch, sketches ordered by how closely their instructions match. When nothing matches,
the schedule is outside the space but legal, and the first full path of the search -- the
decisions nearest to what was written -- is offered as the in-space alternative.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from tensorlang.space.space import CATEGORICAL, TILE, Infeasible, Point, Space


@dataclass
class Membership:
    inside: bool
    point: Point | None  # the matching point, or the nearest in-space alternative
    replays: int


@dataclass
class Evidence:
    """What a schedule's TVM trace says about the decisions that could have produced it."""
    splits: list  # factor lists of splits with only integer factors (tile decisions)
    strong: set  # values a categorical decision leaves verbatim: unroll steps, the factors of
    #              splits with a None factor (thread counts, vector lengths), annotation values
    ints: set  # every integer the trace mentions
    unroll_seen: bool  # some loop carries pragma_auto_unroll_max_step


def written_values(trace) -> Evidence:
    splits, strong, ints, unroll_seen = [], set(), set(), False
    for inst in trace.insts:
        k = inst.kind.name
        inputs = list(inst.inputs)
        if k == "Split":
            factors = [getattr(x, "value", None) for x in inputs[1:]]
            if all(isinstance(f, int) for f in factors):
                splits.append(tuple(factors))
            else:
                strong.update(f for f in factors if isinstance(f, int))
        if k == "Annotate":
            key = str(list(inst.attrs)[0])
            value = getattr(inputs[1], "value", None) if len(inputs) > 1 else None
            if isinstance(value, int):
                strong.add(value)
            unroll_seen |= key == "pragma_auto_unroll_max_step"
        for x in inputs + list(inst.attrs):
            v = getattr(x, "value", x)
            if isinstance(v, int) and not isinstance(v, bool):
                ints.add(v)
    return Evidence(splits, strong, ints, unroll_seen)


def _categorical_order(point, ev: Evidence):
    c = point.candidates

    def rank(i):
        v = c[i]
        if v == 0 and not ev.unroll_seen and 0 in c:
            return 0  # no unroll pragma anywhere: the unroll step was 0
        return 1 if v in ev.strong else 2 if v in ev.ints else 3
    return sorted(point.domain, key=rank)


def _tile_order(point, splits, by_loop=None):
    loop = point.subject.split(" ")[0]
    mine = (by_loop or {}).get((point.stage, loop))
    written = [mine] if mine else []
    written += [tuple(s) for s in splits if len(s) == point.n and math.prod(s) == point.extent]
    exact = list(dict.fromkeys(f for f in written if f in point.domain))

    def distance(f):
        if not splits:
            return 0.0
        return min(sum(abs(math.log(a) - math.log(b)) for a, b in zip(f, s)) for s in splits
                   if len(s) == len(f)) if any(len(s) == len(f) for s in splits) else 0.0

    rest = sorted((f for f in point.domain if f not in exact), key=distance)
    return exact + rest[:4]


def _location_order(point, stmts):
    """Sites ordered by what the schedule wrote for this stage: compute_inline, compute_at(stage, loop), or nothing."""
    from tensorlang.parser import ast as A
    written = None
    for s in stmts or ():
        if s.args and isinstance(s.args[0], A.Ref) and s.args[0].text == point.stage:
            if s.prim == "compute_inline":
                written = -2
            elif s.prim == "compute_at" and len(s.args) > 1 and isinstance(s.args[1], A.Ref):
                written = s.args[1].parts[-1].split(".")[-1]

    def rank(pair):
        d, site = pair
        if written is None:
            return 0 if d == -1 else 1
        if written == -2:
            return 0 if d == -2 else 1
        return 0 if site == written else 1
    return [d for d, _ in sorted(zip(point.domain, point.sites or [""] * len(point.domain)), key=rank)]


def _sketch_order(space, trace) -> list[int]:
    """Sketches ordered by how closely their instruction kinds match the written trace's."""
    from collections import Counter
    skip = {"GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "SamplePerfectTile",
            "SampleCategorical", "SampleComputeLocation", "EnterPostproc", "Annotate", "Unannotate"}
    written = Counter(i.kind.name for i in trace.insts if i.kind.name not in skip)

    def distance(k):
        mine = Counter(i.kind.name for i in space.sketches[k].insts if i.kind.name not in skip)
        return sum(abs(mine[x] - written[x]) for x in set(mine) | set(written))
    return sorted(space.usable, key=distance)


def splits_by_loop(stmts) -> dict:
    """(stage, loop) -> factors, for each `split(STAGE.loop, [ints])` of a schedule."""
    from tensorlang.parser import ast as A
    out = {}
    for s in stmts or ():
        if s.prim == "split" and len(s.args) > 1 and isinstance(s.args[0], A.Ref) and len(s.args[0].parts) == 2 \
                and isinstance(s.args[1], A.ListArg) and all(isinstance(x, A.Const) for x in s.args[1].items):
            out.setdefault(tuple(s.args[0].parts), tuple(x.value for x in s.args[1].items))
    return out


def locate(space: Space, mod, trace, stmts=None, budget: int = 32) -> Membership:
    """Best-first search over the sketches and decisions, with `budget` replays per sketch in all.
    `stmts` (the schedule's statements) tie each split to its loop."""
    import tvm_ffi
    ev = written_values(trace)
    by_loop = splits_by_loop(stmts)
    replays = 0
    nearest: Point | None = None

    def order_of(point):
        if point.kind == TILE:
            return _tile_order(point, ev.splits, by_loop)
        if point.kind == CATEGORICAL:
            return _categorical_order(point, ev)
        return _location_order(point, stmts)

    # One best-first search over (sketch, path), a path being one rank per decision (0 = the best
    # guess): cheapest first, a path's cost being its departures from the best guesses plus how far
    # its sketch's instructions are from the schedule's.
    # Every sketch's best-guess path comes first (a sketch is cheap to try, a wrong guess of it not).
    heap = [(0, rank, k, ()) for rank, k in enumerate(_sketch_order(space, trace))]
    heapq.heapify(heap)
    seen = {(k, ()) for _, _, k, _ in heap}
    limit = budget * len(space.sketches)
    while heap and replays < limit:
        _, sketch_rank, sketch, ranks = heapq.heappop(heap)
        lengths: list[int] = []

        def choose(point, made, ranks=ranks, lengths=lengths):
            order = order_of(point)
            lengths.append(len(order))
            k = len(made)
            return order[min(ranks[k] if k < len(ranks) else 0, len(order) - 1)]

        replays += 1
        try:
            p = space.replay(sketch, choose, convert=False)
        except Infeasible:
            p = None
        if p is not None:
            if nearest is None:
                nearest = p
            if tvm_ffi.structural_equal(p.mod, mod):
                return Membership(True, p, replays)
        full = tuple(ranks) + (0,) * (len(lengths) - len(ranks))
        for k, n in enumerate(lengths):
            if full[k] + 1 < n:
                nxt = full[:k] + (full[k] + 1,) + (0,) * (len(full) - k - 1)
                if (sketch, nxt) not in seen:
                    seen.add((sketch, nxt))
                    heapq.heappush(heap, (sum(nxt) + sketch_rank / 4, sketch_rank, sketch, nxt))
    return Membership(False, nearest, replays)
