"""How many times a schedule makes a stage's work repeat.

`compute_at(P, loop)` computes, at each iteration of `loop` and of the loops around it, the region of P
that the consumers under it read. A loop around the site whose iterations all read the same region of P
(its variable is in no index of the consumer's read of P) repeats all of P's work under it. For a stage
without a reduction that is what inlining costs anyway (a broadcast recomputes its element); for a
reduction it is the catastrophe this module exists for: GPT-2's seq-1024 softmax with the row sum computed
at the output's innermost loop recomputes each 1024-long sum 1024 times -- 7.8 s instead of roller's 82 ms
-- and MetaSchedule's space offers that site like any other (its search throws it away by measuring it).

- `site_repeats(point, decisions)`: per site of a compute-at decision, the factor its placement multiplies
  the placed stage's work by, from the consumer's bindings and read indices and the loops' extents (tile
  factors from `decisions` where a loop is a tile part) -- no replay, so a decoder can ask at every site.
- `no_repeated_reduction(space, point, decisions)`: the sites a decoder keeps (`ConstrainedTokens`'
  `prefer`): for a stage with a reduction, those that compute it once (root always does); else all.
- `repeated_blocks(mod)`: on a scheduled module, the blocks that run more often than their iteration domain
  has points, how many times, and the loops that repeat them; `repeated_reduction_warnings` tells the author
  of a hand-written schedule (TS315, `tensorlang check` and the editor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# What a benchmark's cache of generated schedules names this rule by (changed with what the rule keeps).
RULE = "no-repeated-reductions"


def _int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _reading_positions(point) -> frozenset | None:
    """The positions of the consumer loops whose variables reach an index of the consumer's read of the
    placed stage's buffers (None: the consumer is not found under its loops). Cached on the point."""
    if "reading" in point.cache:
        return point.cache["reading"]
    from tvm.tirx.analysis import undefined_vars

    from tensorlang.space.sentence import _realize_named, consumer_users
    chain = list(point.consumer_loops)
    realize = _realize_named(chain[-1], point.consumer)[0] if chain else None
    users = consumer_users(point)
    out = None
    if realize is not None and users is not None:
        block = realize.block
        used = [v for region in block.reads if region.source.name in point.placed_buffers
                for r in region.region for v in undefined_vars(r.min, [])]
        iters = [i for i, iv in enumerate(block.iter_vars) if any(v.same_as(iv.var) for v in used)]
        out = frozenset(p for i in iters for p in users[i])
    point.cache["reading"] = out
    return out


def _extent(point, j: int, decisions) -> int:
    """Loop j of the consumer's chain: a tile part's factor from the decisions (a point derived without a
    replay holds the first replay's loops), else the loop's own extent."""
    src = point.sources[j] if point.sources is not None and j < len(point.sources) else None
    if src is not None and src[0] == "tile" and src[1] < len(decisions):
        return int(decisions[src[1]][src[2]])
    return _int(point.consumer_loops[j].extent) or 1


def site_repeats(point, decisions=()) -> dict[int, int]:
    """{site: how many times computing the placed stage there repeats its work} for each site of a compute-at
    decision's domain: inline (-2) and root (-1) are 1; an unknown consumer gives 1 everywhere (no claim)."""
    reading = _reading_positions(point)
    out = {}
    for d in point.domain:
        if d < 0 or reading is None:
            out[d] = 1
            continue
        out[d] = math.prod(_extent(point, j, decisions) for j in range(d + 1) if j not in reading)
    return out


def no_repeated_reduction(space, point, decisions=(), sketch=None) -> tuple | None:
    """The values of a decision that a decoder keeps (ConstrainedTokens' `prefer`): at a compute-at decision
    of a stage with a reduction, the sites that compute it once; None (every value) elsewhere."""
    from tensorlang.space.space import LOCATION
    if point.kind != LOCATION or not point.placed_reduces:
        return None
    repeats = site_repeats(point, decisions)
    once = tuple(d for d in point.domain if repeats[d] == 1)
    return None if len(once) == len(point.domain) else once


@dataclass(frozen=True)
class Repeat:
    block: str  # as the schedule names it (a decomposed reduction's `X_update` is X)
    times: int  # how many times its whole iteration domain is run
    reduces: bool  # it has a reduction axis
    loops: tuple  # the loops around it (extent > 1) whose variables are in none of its bindings: what repeats it


def repeated_blocks(mod) -> list[Repeat]:
    """Every block of a scheduled module that runs more iterations than its domain has points, a whole number
    of times (a compute_at under loops that do not index what it computes). A reduction split by
    decompose_reduction is named as before it (TVM names its parts `X_init` and `X_update`) and counted by its
    update. A block under a predicate (a split that overshoots its loop) is left out: it runs more, not again."""
    from tvm.tirx.analysis import undefined_vars

    from tensorlang.lower import tir
    out = []
    realizes = list(tir.block_realizes(mod["main"].body))
    decomposed = {r.block.name_hint[:-len("_update")] for r, _ in realizes if r.block.name_hint.endswith("_update")}
    for realize, loops in realizes:
        block = realize.block
        name = block.name_hint
        if name.endswith("_init") and name[:-len("_init")] in decomposed:
            continue
        if name.endswith("_update") and name[:-len("_update")] in decomposed:
            name = name[:-len("_update")]
        if _int(realize.predicate) != 1:
            continue
        domain = math.prod(_int(iv.dom.extent) or 1 for iv in block.iter_vars)
        runs = math.prod(_int(loop.extent) or 1 for loop in loops)
        if domain and runs > domain and runs % domain == 0:
            used = [v for value in realize.iter_values for v in undefined_vars(value, [])]
            free = tuple(lp.loop_var.name for lp in loops
                         if (_int(lp.extent) or 1) > 1 and not any(v.same_as(lp.loop_var) for v in used))
            out.append(Repeat(name, runs // domain, any(int(iv.iter_type) == 2 for iv in block.iter_vars), free))
    return out


def repeated_reduction_warnings(mod, stmts, span) -> list:
    """TS315 for each reduction a hand-written schedule computes more than once, at the compute_at that placed
    it (else at `span`, the schedule's header)."""
    from tensorlang.diagnostics import warning
    out = []
    for r in repeated_blocks(mod):
        if not r.reduces:
            continue
        at = next((s for s in reversed(stmts) if s.prim == "compute_at" and s.args
                   and getattr(s.args[0], "text", None) == r.block), None)
        loops = ", ".join(r.loops) or "loops that do not index it"
        out.append(warning("TS315", f"{r.block} is computed {r.times} times over: its reduction runs again at every "
                                    f"iteration of {loops}, which no index of what it computes depends on; compute "
                                    f"it at a loop outside {'them' if len(r.loops) > 1 else 'it'} (or at the root) "
                                    f"to compute it once", at.span if at is not None else span))
    return out
