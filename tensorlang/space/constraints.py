"""Constraints from hand-written statements: what a partly written schedule fixes in the space.

`constraints(space, stmts)` reads the statements a user has written so far in a `schedule` block, in
whatever order they wrote them, and says which decisions of the space they fix or narrow, which
sketches they leave, and -- where what is written is outside the space -- the first statement that
leaves it and why, with the constraints that remain satisfiable without it. A decoder then forces the
constrained decisions when it reaches them (`ConstrainedTokens`, or `complete` for seeded random
completions).

Statements are matched to decisions by *subject*, the way tensor sentences name them (space/sentence.py):
a block is its tensor plus the words TVM added (`t0 shared`, `t3 rf`), a loop the block iterators it runs
over (`L0`, `L0 .1`, `L2 & L3`). The user's statements are applied in their own order (the ordinary
applier, so their names are theirs), and each loop or stage an argument names is turned into subjects
in the schedule as it is just before that statement. How each decision kind appears in statements is
read off convert.py's rendering of a replay:

- tile (`TILE <block> <loop> <n>`): `split(loop, factors)` of that loop. n factors fix the decision; fewer
  parts, or a `None` factor, narrow it to the tilings whose factors group (contiguously, outermost first)
  into the written parts. More parts than the sketch's levels are outside the space.
- thread count (`THREADS <block> <loop>`): `split(loop, [None, T])` -- the value T.
- unroll (`UNROLL`, `UNROLL_IMPLICIT`): `annotate(X, "meta_schedule.unroll_explicit" | "..._implicit", v)`
  as the sketch writes it, or `annotate(loop, "pragma_auto_unroll_max_step", v)` as the postprocessor
  renders it (`pragma_unroll_explicit` 1 / 0 says which of the two; a pragma at all says v != 0).
- cooperative-fetch width (`VECTOR <block>`): `annotate(block, "meta_schedule.cooperative_fetch", v)`.
- compute-at site (`LOC <block>`): `compute_inline(B)` is `inline`; `compute_at(B, loop)` is the site named
  by that loop. A site on a loop part (`L3 .1`) also narrows that tile to a factor > 1 there (TVM offers
  no site on a unit loop), and keeps the block whose loop it is from being inlined. A site on a part of a
  split written with fewer parts than the sketch's tile is the innermost loop of that part's group of
  factors, and the tile is narrowed to groupings that end the part on a loop the sketch offers as a site.

Reading loops: a compute-at is read with its unit loops kept (every sketch's is), and a loop made by a
split or fuse is named after what it was made from, since TVM drops a unit loop's variable from the
bindings a fusion makes. On GPU sketches with a limits model, a tile value is kept only if the tiles the
constraints fix later still fit (the model's domains look only at the decisions made).

Statements that no sampling instruction feeds are the sketch's: `cache_read`, `cache_write`, `rfactor`,
`reverse_compute_at`, `compute_at`/`compute_inline` of a block whose place the sketch fixes, other
`annotate`s, `set_scope`: a sketch is left when it has the same statement (same subjects, keyword
arguments aside). A split of an original loop that a sketch neither tiles nor splits by a thread count
leaves that sketch. `parallel`, `vectorize`, `unroll`, `fuse`, `reorder`, `bind`, `decompose_reduction`
and splits of loops the schedule made follow from the sketch and its decisions through MetaSchedule's
postprocessors: they constrain nothing and are listed in `Constraints.unenforced`.
"""
from __future__ import annotations

import math
import random
import weakref
from dataclasses import dataclass, field

from tensorlang.parser import ast as A
from tensorlang.space.space import CATEGORICAL, LOCATION, TILE, Infeasible, Point, Space

# annotation keys and the categorical heads (sentence.py) whose value they carry
_UNROLL_KEYS = {"meta_schedule.unroll_explicit": {("UNROLL",)}, "meta_schedule.unroll_implicit": {("UNROLL_IMPLICIT",)},
                "pragma_auto_unroll_max_step": {("UNROLL",), ("UNROLL_IMPLICIT",)}}
_SKETCH_PRIMS = {"cache_read", "cache_write", "rfactor", "reverse_compute_at", "compute_at", "compute_inline",
                 "reverse_compute_inline", "set_scope", "annotate"}


# ---------------------------------------------------------------- results
@dataclass(frozen=True)
class Constraint:
    """What one statement says about one decision of a sketch."""
    stmt: int  # index of the statement in the input
    decision: int  # the decision's index in the sketch's replay order
    kind: str  # tile | categorical | location
    head: tuple  # the decision's subject, as sentences write it: ('TILE', 't2', 'L0', '4'), ('LOC', 't2')
    factors: tuple = ()  # tile: the written parts (None: any), grouped into the decision's factors
    nonunit: frozenset = frozenset()  # tile: positions that must be > 1 (a compute-at site on that loop)
    values: frozenset | None = None  # categorical: the candidate values allowed (None: any but those excluded)
    exclude: frozenset = frozenset()  # categorical: candidate values ruled out; location: sites ruled out
    sites: frozenset = frozenset()  # location: the site token sequences allowed, if any (`# n` aside)
    # location on a part of a loop the user split into fewer parts than the sketch's tile: (the tile's
    # decision index, the written parts, which part, the site's words before the part): the site is the
    # innermost loop of that part's group of factors, known once the tile is decided. tile: (the written
    # parts, which part, the factor positions the sketch offers sites on): some grouping must end that
    # part on such a position, at a factor > 1
    grouped: tuple = ()

    @property
    def fixes(self) -> bool:
        """One value at most: every factor written, one categorical value, one site."""
        if self.kind == TILE:
            return len(self.factors) == int(self.head[-1]) and None not in self.factors
        if self.kind == CATEGORICAL:
            return self.values is not None and len(self.values) == 1
        return len(self.sites) == 1 and not self.exclude

    def admits(self, space: Space, point, value, made: tuple = ()) -> bool:
        if self.kind == TILE:
            if self.grouped:
                parts, p, positions = self.grouped
                if not any(q in positions and value[q] > 1 for q in _group_ends(value, parts, p)):
                    return False
            return all(value[p] > 1 for p in self.nonunit) and (not self.factors or groups(value, self.factors))
        if self.kind == CATEGORICAL:
            v = point.candidates[value]
            return (self.values is None or v in self.values) and v not in self.exclude
        words = next(tuple(_site_words(s)) for s, d in _sites(space, point) if d == value)
        sites = self.sites
        if self.grouped:
            tile, parts, p, prefix = self.grouped
            sites = frozenset(prefix + (f".{q}",) for q in _group_ends(made[tile], parts, p)) if tile < len(made) \
                else frozenset()
        return (not (self.sites or self.grouped) or words in sites) and words not in self.exclude


@dataclass(frozen=True)
class Outside:
    """A statement the space cannot express (or that no sketch left satisfies), and why."""
    stmt: int
    span: object
    text: str
    reason: str

    def __str__(self) -> str:
        return f"{self.span.line}:{self.span.col}: `{self.text}` is outside the space: {self.reason}"


@dataclass
class Constraints:
    stmts: tuple  # the statements, as given
    sketches: dict  # sketch -> {decision index: [Constraint, ...]}: the sketches left, and what is fixed in each
    outside: Outside | None = None  # the first statement that leaves the space (None: all are in it)
    dropped: list = field(default_factory=list)  # every Outside, in statement order (the first is `outside`)
    unenforced: list = field(default_factory=list)  # (statement index, why it constrains nothing)
    rejected: dict = field(default_factory=dict)  # sketch -> why the statements leave it out

    def on(self, sketch: int, k: int) -> list[Constraint]:
        return self.sketches.get(sketch, {}).get(k, [])

    def allowed(self, space: Space, sketch: int, k: int, point, made: tuple = ()) -> tuple:
        """The values of decision k (its point's domain) that the constraints allow, after the decisions
        `made`. On a GPU sketch with a limits model, a tile value is kept only if the tiles the constraints
        fix later still fit with it (the model's own domains look at the decisions made, not ahead)."""
        cs = self.on(sketch, k)
        out = tuple(v for v in point.domain if all(c.admits(space, point, v, made) for c in cs))
        model = space.gpu_models[sketch]
        if model is None or point.kind != TILE or k not in model.tile_extents:
            return out
        later = {d: c.factors for d, cs in self.sketches.get(sketch, {}).items() if d > k and d in model.tile_extents
                 for c in cs if c.kind == TILE and c.fixes}
        if not later:
            return out
        values = {d: v for d, v in enumerate(made) if d in model.tile_extents}
        return tuple(v for v in out if model.feasible({**values, **later, k: v}))

    def holds(self, space: Space, point: Point) -> bool:
        """The point is in a sketch left and every constrained decision has an allowed value."""
        if point.sketch not in self.sketches:
            return False
        pts = _points_of(space, point.sketch, point.decisions)
        return all(c.admits(space, pts[k], point.decisions[k], point.decisions[:k])
                   for k, cs in self.sketches[point.sketch].items()
                   for c in cs)


# ---------------------------------------------------------------- tilings
def groups(factors: tuple, parts: tuple) -> bool:
    """Can `factors` be cut, outermost first, into len(parts) contiguous non-empty runs whose products are
    the parts (None: any product)?"""
    if not parts:
        return not factors
    if len(factors) < len(parts):
        return False
    head, rest = parts[0], parts[1:]
    for cut in range(1, len(factors) - len(rest) + 1):
        if (head is None or math.prod(factors[:cut]) == head) and groups(factors[cut:], rest):
            return True
    return False


def _group_ends(factors: tuple, parts: tuple, p: int, start: int = 0) -> set:
    """For each way `factors` group into `parts` (see `groups`), the index of the last factor of group p."""
    if not parts:
        return set() if factors else {-1}
    out = set()
    for cut in range(1, len(factors) - len(parts) + 2):
        if (parts[0] is None or math.prod(factors[:cut]) == parts[0]) and groups(factors[cut:], parts[1:]):
            if p == 0:
                out.add(start + cut - 1)
            else:
                out |= _group_ends(factors[cut:], parts[1:], p - 1, start + cut)
    return out


# ---------------------------------------------------------------- subjects
def _site_words(tokens) -> list:
    """A site's tokens without the `# n` that tells apart sites that read alike."""
    tokens = list(tokens)
    return tokens[:tokens.index("#")] if "#" in tokens else tokens


def _sites(space, point):
    from tensorlang.space.sentence import site_values
    return site_values(space, point)


class _Namer:
    """Subjects of the stages and loops a statement names, in the schedule as the statements left it."""

    def __init__(self, space: Space):
        from tensorlang.space.sentence import tensor_ids
        self.ids = tensor_ids(space.op)
        # loop variable name -> (block, words) as the statements made the loop: a split's part `.p` of its
        # loop, a fusion `a & b`. TVM drops a unit loop's variable from the bindings a fusion makes, so
        # reading a loop off the bindings alone would depend on which factors are 1.
        self.made: dict = {}
        self.part_of: dict = {}  # loop variable name -> ((block, words) it was split from, the parts, which)

    def note(self, sch, env, stmt, before) -> None:
        """After a split or fuse: name its outputs from what it split or fused (`before`: their readings)."""
        if stmt.prim not in ("split", "fuse") or not before or not stmt.targets:
            return
        names = [sch.get(env.loops[t.name]).loop_var.name for t in stmt.targets if t.name in env.loops]
        if stmt.prim == "split":
            block, words = before[0]
            parts = _const(_positional(stmt)[1])
            for p, name in enumerate(names):
                self.made[name] = (block, words + (f".{p}",))
                self.part_of[name] = ((block, words), tuple(parts) if isinstance(parts, tuple) else (), p)
        elif names:
            words = tuple(w for n, (_, ws) in enumerate(before) for w in (("&",) if n else ()) + ws)
            self.made[names[0]] = (before[0][0], words)

    def block(self, sch, rv) -> tuple:
        from tensorlang.space.sentence import block_tokens
        return tuple(block_tokens(sch.get(rv).name_hint, self.ids))

    def loop(self, sch, rv) -> frozenset:
        """(block tokens + loop words) for each block under the loop that runs over it."""
        return frozenset(b + w for b, w in self.readings(sch, rv))

    def readings(self, sch, rv) -> list:
        """(block tokens, loop words) for each block under the loop that runs over it."""
        from tensorlang.lower import tir
        from tensorlang.space.sentence import _iter_users, _role_words, block_tokens
        from tensorlang.space.space import _enclosing_loops
        loop = sch.get(rv)
        outer = list(_enclosing_loops(sch, rv))
        out = [self.made[loop.loop_var.name]] if loop.loop_var.name in self.made else []
        for realize, below in tir.block_realizes(loop):
            words = _role_words(_iter_users(realize, outer + list(below)), len(outer))
            reading = (tuple(block_tokens(realize.block.name_hint, self.ids)), tuple(words))
            if words != ["free"] and reading not in out:
                out.append(reading)
        return out

    def symbolic(self, sch, rv):
        """The loop as the statements made it, else its first reading off the bindings."""
        name = sch.get(rv).loop_var.name
        if name in self.made:
            return self.made[name]
        readings = self.readings(sch, rv)
        return readings[0] if readings else None


@dataclass(frozen=True)
class _Said:
    """One statement, in subjects: what it is about and its value."""
    stmt: int
    prim: str
    about: object  # split/rfactor: the loop's subjects; compute_*/cache_*/set_scope: the block; annotate: either
    value: object = None  # split: the parts; location: the site's subjects; annotate: (key, value); ...
    original: bool = False  # split: the loop is one of its stage's own loops (untouched)
    part: tuple = ()  # compute_at: the site's loop as a part of a written split (Namer.part_of), if it is one


def _const(a):
    if isinstance(a, A.Const):
        if a.kind == "int":
            return int(a.text)
        if a.kind == "float":
            return float(a.text)
        return A.unquote(a.text) if hasattr(A, "unquote") else a.text.strip('"')
    if isinstance(a, A.ListArg):
        return tuple(_const(x) for x in a.items)
    if isinstance(a, A.Ref):
        return None if a.text == "None" else a.text
    return None


def _positional(stmt) -> list:
    return [a for a in stmt.args if not isinstance(a, A.KwSchedArg)]


def _say(sch, env, namer: _Namer, n: int, stmt) -> _Said | None:
    """The statement in subjects, read in the schedule just before it runs (None: no subject to read)."""
    from tvm import tirx

    from tensorlang.lower.schedule import _stage_or_loop, resolve_loop, resolve_stage
    args, prim = _positional(stmt), stmt.prim
    if prim == "split" and len(args) == 2:
        readings = namer.readings(sch, resolve_loop(sch, env, args[0]))
        original = bool(readings) and all(len(words) == 1 for _, words in readings)  # `L2`: not a part, no fusion
        return _Said(n, prim, frozenset(b + w for b, w in readings), _const(args[1]), original)
    if prim in ("compute_at", "reverse_compute_at") and len(args) >= 2:
        lrv = resolve_loop(sch, env, args[1])
        return _Said(n, prim, namer.block(sch, resolve_stage(sch, env, args[0])), namer.loop(sch, lrv),
                     part=namer.part_of.get(sch.get(lrv).loop_var.name, ()))
    if prim in ("compute_inline", "reverse_compute_inline") and args:
        return _Said(n, prim, namer.block(sch, resolve_stage(sch, env, args[0])))
    if prim in ("cache_read", "cache_write") and len(args) >= 3:
        srv = resolve_stage(sch, env, args[0])
        buf = _const(args[1])
        if isinstance(buf, int):  # the buffer by index: by name, as the converter writes a unique one
            regions = list(getattr(sch.get(srv), "reads" if prim == "cache_read" else "writes"))
            buf = regions[buf].source.name if 0 <= buf < len(regions) else buf
        return _Said(n, prim, namer.block(sch, srv), (buf, _const(args[2])))
    if prim == "rfactor" and len(args) >= 2:
        return _Said(n, prim, namer.loop(sch, resolve_loop(sch, env, args[0])), _const(args[1]))
    if prim == "set_scope" and len(args) >= 3:
        return _Said(n, prim, namer.block(sch, resolve_stage(sch, env, args[0])), (_const(args[1]), _const(args[2])))
    if prim == "annotate" and len(args) >= 3:
        rv = _stage_or_loop(sch, env, args[0])
        about = namer.loop(sch, rv) if isinstance(sch.get(rv), tirx.For) else namer.block(sch, rv)
        return _Said(n, prim, about, (_const(args[1]), _const(args[2])))
    return None


def _operand_readings(sch, env, namer: _Namer, stmt) -> list:
    """The symbolic readings of what a split or fuse takes (before it runs)."""
    from tensorlang.lower.schedule import resolve_loop
    if stmt.prim == "split":
        loops = _positional(stmt)[:1]
    elif stmt.prim == "fuse":
        loops = _positional(stmt)
    else:
        return []
    out = [namer.symbolic(sch, resolve_loop(sch, env, a)) for a in loops if isinstance(a, A.Ref)]
    return out if all(r is not None for r in out) else []


def _as_the_space_does(stmt):
    """A compute-at keeps its unit loops, as every MetaSchedule sketch's does: the moved block's iterators
    then read alike in the user's schedule and the replay's (`L0 .0` beside a unit loop, not `L0`)."""
    if stmt.prim not in ("compute_at", "reverse_compute_at") or any(
            isinstance(a, A.KwSchedArg) and a.name == "preserve_unit_loops" for a in stmt.args):
        return stmt
    from dataclasses import replace
    return replace(stmt, args=stmt.args + (A.KwSchedArg("preserve_unit_loops", A.Ref(("True",))),))


def _read(space: Space, stmts) -> tuple[list, Outside | None]:
    """Apply the statements in their order, each read in subjects first. Stops at the first that does not
    apply (what follows it would act on names or loops it did not make)."""
    from tensorlang.lower.schedule import StmtError, apply_stmt, initial_env, new_schedule
    from tensorlang.parser.printer import format_stmt
    sch = new_schedule(space.mod)
    env = initial_env(sch, space.op)
    namer, said = _Namer(space), []
    for n, stmt in enumerate(stmts):
        try:
            s = _say(sch, env, namer, n, stmt)
            before = _operand_readings(sch, env, namer, stmt)
            errors = [d for d in apply_stmt(sch, env, _as_the_space_does(stmt)) if d.severity == "error"]
            if not errors:
                namer.note(sch, env, stmt, before)
        except StmtError as e:
            errors = [e.diag]
        if errors:
            return said, Outside(n, stmt.span, format_stmt(stmt), f"it does not apply: {errors[0].message}")
        said.append(s if s is not None else _Said(n, stmt.prim, None))
    return said, None


# ---------------------------------------------------------------- the space's side
@dataclass
class _Sketch:
    heads: list  # per decision: its head (sentence tokens)
    kinds: list
    points: list  # per decision: a point met on one replay (static tiles and categoricals: exact)
    forms: list  # the sketch's own statements, in subjects (_Said)


_SKETCHES: "weakref.WeakKeyDictionary[Space, dict]" = weakref.WeakKeyDictionary()


def _sketch(space: Space, k: int) -> _Sketch:
    """One replay of sketch k (first legal values), its decision heads, and its statements in subjects."""
    memo = _SKETCHES.setdefault(space, {})
    if k in memo:
        return memo[k]
    from tensorlang.space.convert import trace_to_statements
    from tensorlang.space.sentence import decision_head
    points: list = []

    def first(p, made):  # tilings with the fewest unit factors: unit loops leave no trace in some bindings
        points.append(p)
        return min(p.domain, key=lambda f: sum(x == 1 for x in f)) if p.kind == TILE else p.domain[0]
    sch, _ = space._apply(k, first, space.gpu_models[k])
    heads = [decision_head(space, k, i, p) for i, p in enumerate(points)]
    # the sketch's instructions as statements (before the postprocessors: what the sketch itself writes)
    stmts, _ = trace_to_statements(sch.trace, space.mod, space.op)
    forms, _ = _read(space, stmts)
    # the statements a location decision rendered are the decision's, not the sketch's
    placed = {tuple(h[1:]) for h in heads if h[0] == "LOC"}
    forms = [f for f in forms if f.prim in _SKETCH_PRIMS
             and not (f.prim in ("compute_at", "compute_inline") and f.about in placed)
             and not (f.prim == "annotate" and f.value[0] in {*_UNROLL_KEYS, "meta_schedule.cooperative_fetch"})]
    memo[k] = _Sketch(heads, [p.kind for p in points], points, forms)
    return memo[k]


def _points_of(space: Space, sketch: int, decisions) -> list:
    from tensorlang.space.sentence import decision_points
    return decision_points(space, sketch, decisions)


def _meets(a, b) -> bool:
    """Two subjects agree: equal blocks, or loops that share a (block, iterators) reading."""
    if isinstance(a, frozenset) and isinstance(b, frozenset):
        return bool(a & b)
    return a == b


def _same_form(u: _Said, f: _Said) -> bool:
    if u.prim != f.prim or not _meets(u.about, f.about):
        return False
    if isinstance(u.value, frozenset) or isinstance(f.value, frozenset):
        return isinstance(u.value, frozenset) and isinstance(f.value, frozenset) and _meets(u.value, f.value)
    return u.value == f.value


# ---------------------------------------------------------------- matching
def _claims(space: Space, k: int, s: _Said) -> tuple[list, str]:
    """(constraints on decisions of sketch k, '') for one statement; ([], why) when sketch k cannot have it;
    ([], '') when it holds in sketch k without a decision (the sketch's own statement)."""
    sk = _sketch(space, k)
    by_head = [(i, h) for i, h in enumerate(sk.heads)]
    if s.prim == "split":
        parts = tuple(s.value) if isinstance(s.value, tuple) else ()
        for i, h in by_head:
            if h[0] == "TILE" and tuple(h[1:-1]) in s.about:
                n = int(h[-1])
                if len(parts) > n:
                    return [], f"tiles {' '.join(h[1:-1])} into {n} factors, not {len(parts)}"
                return [Constraint(s.stmt, i, TILE, h, factors=parts)], ""
            if h[0] == "THREADS" and tuple(h[1:]) in s.about and len(parts) == 2 and parts[0] is None:
                return [Constraint(s.stmt, i, CATEGORICAL, h, values=frozenset({parts[1]}))], ""
        # (on GPU the postprocessors bind what a sketch left unbound by splitting it, `[None, threads]`)
        if s.original and not (space.target.is_gpu and None in parts):
            return [], f"does not split {' '.join(sorted(s.about)[0])}"
        return None, "a split of a loop the schedule made: MetaSchedule's postprocessors decide it"
    if s.prim == "annotate":
        key, value = s.value
        if key in _UNROLL_KEYS or key == "pragma_unroll_explicit":
            want = _UNROLL_KEYS.get(key) or ({("UNROLL",)} if value else {("UNROLL_IMPLICIT",)})
            for i, h in by_head:
                if tuple(h) in want:
                    if key == "pragma_unroll_explicit":  # written only with a step: the step is not 0
                        return [Constraint(s.stmt, i, CATEGORICAL, h, exclude=frozenset({0}))], ""
                    return [Constraint(s.stmt, i, CATEGORICAL, h, values=frozenset({value}))], ""
            return [], f"samples no {' or '.join(sorted(w[0] for w in want))} step"
        if key == "meta_schedule.cooperative_fetch":
            for i, h in by_head:
                if h[0] == "VECTOR" and tuple(h[1:]) == s.about:
                    return [Constraint(s.stmt, i, CATEGORICAL, h, values=frozenset({value}))], ""
    if s.prim in ("compute_at", "compute_inline"):
        for i, h in by_head:
            if h[0] == "LOC" and tuple(h[1:]) == s.about:
                if s.prim == "compute_inline":
                    return [Constraint(s.stmt, i, LOCATION, h, sites=frozenset({("inline",)}))], ""
                grouped = _grouped_site(s, sk)
                if grouped is not None:
                    tile, parts, p, prefix = grouped
                    positions = _site_positions(space, sk, i, prefix)
                    return [Constraint(s.stmt, i, LOCATION, h, grouped=grouped),
                            Constraint(s.stmt, tile, TILE, sk.heads[tile], grouped=(parts, p, positions))] + [
                        c for c in _site_needs(s, sk) if c.kind == LOCATION], ""
                return [Constraint(s.stmt, i, LOCATION, h, sites=s.value)] + _site_needs(s, sk), ""
    if s.prim in _SKETCH_PRIMS:
        if any(_same_form(s, f) for f in sk.forms):
            return [], ""
        return [], f"has no such {s.prim}"
    return None, f"{s.prim} follows from the sketch and its decisions (MetaSchedule's postprocessors)"


def _grouped_site(s: _Said, sk: _Sketch):
    """A site on a part of a split written with fewer parts than the sketch tiles that loop into: the
    `grouped` of its Constraint (None when the parts are the sketch's, or the loop is no split's part)."""
    if not s.part:
        return None
    (block, words), parts, p = s.part
    for i, h in enumerate(sk.heads):
        if h[0] == "TILE" and tuple(h[1:-1]) == block + words and int(h[-1]) > len(parts):
            return (i, parts, p, block + words)
    return None


def _site_positions(space: Space, sk: _Sketch, loc: int, prefix: tuple) -> frozenset:
    """The parts of a tiled loop (`prefix` + `.q`) the sketch offers as sites of location decision `loc`
    (read on the sketch's replay with the fewest unit factors, where every part is a loop)."""
    out = set()
    for tokens, _ in _sites(space, sk.points[loc]):
        words = tuple(_site_words(tokens))
        if len(words) == len(prefix) + 1 and words[:len(prefix)] == prefix and words[-1].startswith("."):
            out.add(int(words[-1][1:]))
    return frozenset(out)


def _site_needs(s: _Said, sk: _Sketch) -> list:
    """What a site needs of the decisions before it: its block is not inlined (when the sketch decides
    that block's place), and a site on a part of a tiled loop needs that part not to be a unit loop (TVM
    offers no site on one)."""
    out = []
    if len(s.value) != 1:  # the loop reads differently for different blocks under it: too weak to narrow by
        return out
    words = list(next(iter(s.value)))
    block = tuple(words[:next(i for i, w in enumerate(words) if w[:1] == "L")])
    for i, h in enumerate(sk.heads):
        if h[0] == "LOC" and tuple(h[1:]) == block:
            out.append(Constraint(s.stmt, i, LOCATION, h, exclude=frozenset({("inline",)})))
        if h[0] == "TILE":
            sub = tuple(h[1:-1])  # block + loop, e.g. ('t3', 'L2')
            if len(words) == len(sub) + 1 and tuple(words[:len(sub)]) == sub and words[-1].startswith("."):
                out.append(Constraint(s.stmt, i, TILE, h, nonunit=frozenset({int(words[-1][1:])})))
    return out


def constraints(space: Space, stmts) -> Constraints:
    """The decisions the statements fix, the sketches they leave, and the first statement outside the space.

    Statements are taken in the user's order; one that leaves no sketch (with everything kept before it)
    is dropped -- the first is `outside`, the constraints returned are those of the others."""
    return _constraints(space, tuple(stmts), retry=True)


def _constraints(space: Space, stmts: tuple, retry: bool) -> Constraints:
    said, broken = _read(space, stmts)
    from tensorlang.parser.printer import format_stmt
    alive = {k: {} for k in space.usable}
    rejected: dict = {}
    out = Constraints(stmts, alive, rejected=rejected)
    for s in said:
        if s.about is None:
            out.unenforced.append((s.stmt, f"{s.prim} follows from the sketch and its decisions"))
            continue
        trial, why, unenforced = {}, {}, None
        for k, cs in alive.items():
            new, reason = _claims(space, k, s)
            if new is None:
                unenforced = reason
                trial[k] = cs
                continue
            if reason:
                why[k] = reason
                continue
            merged = {d: list(v) for d, v in cs.items()}
            for c in new:
                merged.setdefault(c.decision, []).append(c)
            dead = _dead(space, k, merged, new)
            if dead:
                why[k] = dead
                continue
            trial[k] = merged
        if unenforced is not None and len(trial) == len(alive) and not why:
            out.unenforced.append((s.stmt, unenforced))
        if not trial:
            reason = _because(why)
            out.dropped.append(Outside(s.stmt, stmts[s.stmt].span, format_stmt(stmts[s.stmt]), reason))
            continue
        for k, r in why.items():
            rejected.setdefault(k, f"`{format_stmt(stmts[s.stmt])}`: sketch {k} {r}")
        alive.clear()
        alive.update(trial)
    # a replay per sketch left, within the constraints: sites only a replay knows are checked here
    for k in list(alive):
        try:
            _witness(space, k, out)
        except _Dead as e:
            rejected[k] = str(e)
            del alive[k]
    if not alive and said and retry:
        # each statement alone fits some sketch, together they leave none a legal point: the first prefix
        # that does names the statement; the constraints of the others are what remains
        first = _first_unsatisfiable(space, stmts)
        rest = _constraints(space, stmts[:first.stmt] + stmts[first.stmt + 1:], retry=True)
        return _with_dropped(rest, stmts, first)
    if broken is not None:
        out.dropped.append(broken)
    out.outside = out.dropped[0] if out.dropped else None
    out.sketches = alive
    return out


def _because(why: dict) -> str:
    """The sketches' reasons in one sentence: 'every sketch ...' when they agree."""
    if not why:
        return "no sketch left has it"
    if len(set(why.values())) == 1:
        return f"{'every sketch' if len(why) > 1 else f'sketch {next(iter(why))}'} {next(iter(why.values()))}"
    return "; ".join(f"sketch {k} {r}" for k, r in sorted(why.items()))


def _dead(space: Space, k: int, merged: dict, new: list) -> str:
    """Why the constraints leave a decision of sketch k no value, where its domain is known without a
    replay (tiles and categoricals of the sketch's static table); '' otherwise."""
    static = space.static_points(k)
    for c in new:
        p = static[c.decision] if c.decision < len(static) else None
        if p is None:
            continue
        if not any(all(x.admits(space, p, v) for x in merged[c.decision]) for v in p.domain):
            what = "the value written" if c.kind == CATEGORICAL else "the factors written"
            return f"has no legal value of {' '.join(c.head)} that fits {what}"
    return ""


class _Dead(Exception):
    pass


def _replay_within(space: Space, k: int, cons: Constraints, pick, convert: bool) -> Point:
    """Replay sketch k, each decision `pick`ed among its allowed values; _Dead when one has none (or the
    postprocessors refuse the point)."""
    dead: list = []

    def choose(point, made):
        ok = cons.allowed(space, k, len(made), point, tuple(made))
        if not ok:
            dead.append(f"sketch {k}: no legal value of {point.subject} satisfies the statements")
            raise ValueError(dead[-1])  # TVM hands it back as a RuntimeError
        return pick(ok)
    try:
        return space.replay(k, choose, convert=convert)
    except Infeasible as e:
        raise _Dead(str(e))
    except (RuntimeError, ValueError):
        if dead:
            raise _Dead(dead[-1])
        raise


def _witness(space: Space, k: int, cons: Constraints, tries: int = 8) -> Point:
    """A point of sketch k within the constraints: the first allowed values, then a few seeded random
    paths (an earlier free decision can take away a later site: an inlined consumer, a unit loop)."""
    rng = random.Random(k)
    for n in range(tries):
        try:
            return _replay_within(space, k, cons, (lambda ok: ok[0]) if n == 0 else rng.choice, False)
        except _Dead as e:
            last = e
    raise last


def _with_dropped(rest: Constraints, stmts: tuple, first: Outside) -> Constraints:
    """The constraints of the statements without `first` (numbered without it), numbered as given."""
    from dataclasses import replace

    def renum(n: int) -> int:
        return n + 1 if n >= first.stmt else n
    sketches = {k: {d: [replace(c, stmt=renum(c.stmt)) for c in cs] for d, cs in v.items()}
                for k, v in rest.sketches.items()}
    dropped = sorted([first] + [replace(o, stmt=renum(o.stmt)) for o in rest.dropped], key=lambda o: o.stmt)
    return Constraints(stmts, sketches, dropped[0], dropped, [(renum(n), why) for n, why in rest.unenforced],
                       rest.rejected)


def _first_unsatisfiable(space: Space, stmts: tuple) -> Outside:
    """The shortest prefix of the statements that no sketch satisfies: its last statement."""
    from tensorlang.parser.printer import format_stmt
    for n in range(1, len(stmts) + 1):
        c = _constraints(space, stmts[:n], retry=False) if n < len(stmts) else None
        if c is None or not c.sketches:
            return Outside(n - 1, stmts[n - 1].span, format_stmt(stmts[n - 1]),
                           "no legal point of a sketch left satisfies it with the statements before it")
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- decoding
def preferring(*prefer):
    """The preferences `prefer` (ConstrainedTokens' `prefer` functions) applied one after the other, each
    yielding where it would leave nothing; None where none has a preference."""
    def combined(space, point, decisions, sketch=None):
        kept = None
        for f in prefer:
            values = f(space, point, decisions, sketch)
            if values is None:
                continue
            values = set(values) if kept is None else set(values) & kept
            if values:
                kept = values
        return kept
    return combined


class ConstrainedTokens:
    """NextTokens whose legal tokens are narrowed to the constraints: only the sketches left, and at each
    constrained decision only its allowed values. Reads NextTokens' state (its phase, current point and
    choice) and filters a copy of the choice; it adds nothing to what NextTokens checks.

    `cons` None: no constraint. `prefer(space, point, decisions, sketch) -> values | None` (None: no preference): a
    narrowing that yields to the constraints -- applied where some value the constraints allow is among its
    values, else left out (a user who wrote a compute_at that repeats a reduction gets it;
    recompute.no_repeated_reduction)."""

    def __init__(self, space: Space, cons: Constraints | None, eager: bool = False, _inner=None, prefer=None,
                 _memo=None):
        from tensorlang.space.sentence import NextTokens
        self.space, self.cons, self.prefer = space, cons, prefer
        self.inner = _inner if _inner is not None else NextTokens(space, eager)
        # _ok's last answer and what it was of: a value spelled over several tokens asks it at each one
        self._memo = _memo

    def _ok(self) -> set | None:
        """The values of the choice being written that are kept (None: all of them)."""
        nt = self.inner
        if nt._point is None:  # the sketch index
            return set(self.cons.sketches) if self.cons is not None else None
        made = tuple(nt.decisions)
        memo = self._memo
        if memo is not None and memo[0] == nt.sketch and memo[1] is nt._point and memo[2] == made:
            return memo[3]
        ok = set(self.cons.allowed(self.space, nt.sketch, len(made), nt._point, made)) if self.cons is not None \
            else None
        better = self.prefer(self.space, nt._point, made, nt.sketch) if self.prefer is not None else None
        if better is not None:
            better = set(better) if ok is None else set(better) & ok
            if better:
                ok = better
        self._memo = (nt.sketch, nt._point, made, ok)
        return ok

    def _narrowed_choice(self, ok: set):
        from tensorlang.space.sentence import _Choice, _copy_choice, _TileChoice
        choice = _copy_choice(self.inner._choice)
        if isinstance(choice, _TileChoice):
            choice.cands = [f for f in choice.cands if f in ok]
        elif isinstance(choice, _Choice):
            choice.seqs = [(s, v) for s, v in choice.seqs if v in ok]
        return choice

    def allowed(self) -> set[str]:
        base = self.inner.allowed()  # waits for a replay where one is needed
        if self.inner._phase != "CHOOSE":
            return base
        ok = self._ok()
        return base if ok is None else base & self._narrowed_choice(ok).allowed()

    def allowed_ids(self) -> set[int]:
        from tensorlang.space.sentence import ids_of
        return ids_of(self.allowed())

    def mask(self):
        from tensorlang.space.sentence import mask_of
        return mask_of(self.allowed())

    def push(self, tok: str) -> None:
        from tensorlang.space.sentence import SentenceError
        if tok not in self.allowed():
            raise SentenceError(f"token {tok!r} is not allowed by the constraints here")
        self.inner.push(tok)

    def forced(self) -> list[str]:
        from tensorlang.space.sentence import push_forced
        probe = self.fork()
        try:
            return push_forced(probe)
        finally:
            probe.close()

    def fork(self) -> "ConstrainedTokens":
        return ConstrainedTokens(self.space, self.cons, _inner=self.inner.fork(), prefer=self.prefer,
                                 _memo=self._memo)

    @property
    def done(self) -> bool:
        return self.inner.done

    @property
    def sketch(self):
        return self.inner.sketch

    @property
    def decisions(self) -> list:
        return self.inner.decisions

    @property
    def tokens(self) -> list:
        return self.inner.tokens

    def finish(self) -> Point:
        return self.inner.finish()

    def close(self) -> None:
        self.inner.close()


def decode_random(space: Space, cons: Constraints, seed: int = 0, eager: bool = False) -> Point:
    """A sentence decoded token by token through ConstrainedTokens, each free token a seeded random legal
    one: what a model's sampler does, with a uniform model."""
    from tensorlang.space.sentence import SentenceError
    if not cons.sketches:
        raise SentenceError("no sketch satisfies the statements")
    rng = random.Random(seed)
    dec = ConstrainedTokens(space, cons, eager)
    try:
        while not dec.done:
            allowed = sorted(dec.allowed())
            if not allowed:
                raise SentenceError(f"no legal token after {' '.join(dec.tokens)}")
            dec.push(rng.choice(allowed))
        return dec.finish()
    finally:
        dec.close()


def complete(space: Space, cons: Constraints, seed: int = 0, tries: int = 20) -> Point:
    """A point of the space where the constraints hold, every free decision a seeded random legal value;
    the schedule converted to statements. (Retries a path that leaves a later decision no allowed value --
    possible on GPU, where the thread limits tie tiles together.)"""
    rng = random.Random(seed)
    last: Exception | None = None
    for _ in range(tries):
        if not cons.sketches:
            break
        k = rng.choice(sorted(cons.sketches))
        try:
            return _replay_within(space, k, cons, rng.choice, True)
        except _Dead as e:
            last = e
    raise Infeasible(f"no completion within the constraints: {last}")
