"""What a sketch's trace says about its decisions, read without a replay: for decoder preferences that need to
know, at a decision, what an earlier one decided (parallel_tile.consumer_levels, partial_sums.strided_rfactors).

- `per_sketch(fn)`: `fn(space, sketch)` memoised per space (a weak key: a space dies with its operator's
  document) and sketch -- a trace is read once per sketch, not at every decision.
- `decision_indices(insts)`: per instruction, the index of the decision it samples (None: not a sampling one),
  in replay order, as a point's `decisions` holds them.
- `tile_splits(insts)`: (tile decision, the loops its Split made) for each Split whose factors a
  SamplePerfectTile sampled.
- `earlier_tiles(point, decisions)`: at a spatial tile decision of a multi-level tile, the factors of the
  stage's spatial loops tiled before it.

(Trace variables are matched with same_as: == on a TVM expression builds an expression.)
"""
from __future__ import annotations

import functools
import weakref


def per_sketch(fn):
    memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def cached(space, sketch: int):
        answers = memo.setdefault(space, {})
        if sketch not in answers:
            answers[sketch] = fn(space, sketch)
        return answers[sketch]
    return cached


def decision_indices(insts) -> list[int | None]:
    from tensorlang.space.space import _SAMPLING
    out, k = [], 0
    for inst in insts:
        sampling = inst.kind.name in _SAMPLING
        out.append(k if sampling else None)
        k += sampling
    return out


def tile_splits(insts) -> list[tuple[int, list]]:
    sampled: list = []  # (a sampled factor's variable, the decision that sampled it)
    out: list = []
    for inst, k in zip(insts, decision_indices(insts)):
        if inst.kind.name == "SamplePerfectTile":
            sampled += [(v, k) for v in inst.outputs]
        elif inst.kind.name == "Split":
            d = next((k2 for f in inst.inputs[1:] for v, k2 in sampled if f is not None and v.same_as(f)), None)
            if d is not None:
                out.append((d, list(inst.outputs)))
    return out


def earlier_tiles(point, decisions) -> tuple | None:
    """At a tile decision whose enclosing loops are its stage's earlier spatial tiles (n loops each), their
    factors: the last decisions made -- not the loops' extents, since a decoder's point may hold the loops of an
    earlier replay. None where other loops are around it (no claim)."""
    if len(point.outer) % point.n:
        return None
    earlier = tuple(decisions[len(decisions) - len(point.outer) // point.n:]) if point.outer else ()
    if any(not isinstance(t, (tuple, list)) or len(t) != point.n for t in earlier):
        return None
    return earlier
