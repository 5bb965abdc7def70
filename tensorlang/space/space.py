"""The Space Builder: the legal schedules of an operator on a target.

A point of the space is a sketch (one of MetaSchedule's design-space traces for the operator) plus
one decision for each of its sampling instructions, in replay order -- MetaSchedule's own split
between the trace skeleton and its decisions. Each decision has an exact legal domain, computed
at the moment the sketch is replayed up to it (a tile's domain depends on its loop's extent, a
compute-at site's on the loops its consumer has then):

- `tile`: SamplePerfectTile(loop, n, max_innermost_factor) -> every ordered factorization of the
  loop's extent into n factors whose innermost is at most max_innermost_factor;
- `categorical`: SampleCategorical(candidates, probs) -> the indices of candidates with p > 0;
- `location`: SampleComputeLocation(stage) -> the sites TVM accepts, found by asking TVM's
  sampler for each site index (-2 inline, -1 root, i = the i-th loop of the first consumer) and
  keeping those it takes as given.

A point is replayed with TVM (`Trace.apply_to_schedule` with a decision provider), the target's
postprocessors are applied, and the result is converted to .tsched statements (space/convert.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Callable

from tensorlang.lower.schedule import Unchecked
from tensorlang.space import metaschedule as msx

TILE, CATEGORICAL, LOCATION = "tile", "categorical", "location"
_SAMPLING = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")


@dataclass(frozen=True)
class DecisionPoint:
    kind: str  # tile | categorical | location
    domain: tuple  # legal values, in a canonical order
    subject: str  # what it decides, for people: "C.i (512)", "unroll of root", "compute-at of P"
    extent: int = 0  # tile: the loop's extent
    n: int = 0  # tile: number of factors
    max_innermost: int = 0  # tile: bound on the innermost factor (0: none)
    candidates: tuple = ()  # categorical: the candidate values
    sites: tuple = ()  # location: for each domain value, the loop's name ("" for inline/root)
    placed: str = ""  # location: the stage whose compute-at site this is
    placed_buffers: tuple = ()  # location: the buffers that stage writes (what its consumer reads of it)
    placed_reduces: bool = False  # location: that stage has a reduction axis (space/recompute.py)
    loop: object = field(default=None, compare=False, repr=False)  # tile: the tiled loop, for `_context`
    # What tensor sentences name the subject by (space/sentence.py), as IR snapshots taken at the decision
    # (TVM copies a node we hold a reference to instead of mutating it): a tile's enclosing loops, outermost
    # first; a location's consumer (the block whose loops the sites are) and all its loops.
    outer: tuple = field(default=(), compare=False, repr=False)
    consumer: str = ""
    consumer_loops: tuple = field(default=(), compare=False, repr=False)
    # location: the facts its domain was decided by (SiteRule) and, per consumer loop, where its extent
    # comes from (loop_sources) -- what lets a decoder derive the sites of the same decision after
    # other tile factors without a replay (space/sentence.py: SiteFacts)
    rule: object = field(default=None, compare=False, repr=False)
    sources: tuple | None = field(default=None, compare=False, repr=False)
    # derived views of this point that a user computes once (the sentence's tokens for it)
    cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    # tile: the stage whose loop is tiled, the loop's role ("S" spatial, "R" reduction), and the
    # stage's loops as (name, extent, role) when the decision is made -- what a heuristic needs.
    # Computed on first use: a walk of the loop nest, which sampling and decoding never need.
    @cached_property
    def _context(self) -> tuple:
        return _loop_context(self.loop) if self.loop is not None else (self.placed, "S", (), -1)

    @property
    def stage(self) -> str:
        return self._context[0]

    @property
    def role(self) -> str:
        return self._context[1]

    @property
    def axes(self) -> tuple:
        return self._context[2]

    @property
    def axis(self) -> int:
        return self._context[3]


@dataclass
class Point:
    """A concrete schedule: a sketch and its decisions, replayed and converted."""
    sketch: int
    decisions: tuple
    stmts: list = field(default_factory=list)  # .tsched statements (ast.SchedStmt)
    mod: object = None  # the scheduled tvm.IRModule
    trace: object = None  # the full trace, postprocessors included


class Infeasible(Exception):
    """A replay whose postprocessors refused the result (counted as a rejection)."""


def _loop_context(loop):
    """(stage, role of this loop, the stage's loops as (name, extent, role), this loop's index)."""
    from tensorlang.lower import tir
    for realize, loops in tir.block_realizes(loop):
        block = realize.block
        nest = [loop] + [l for l in _loops_below(loop)]
        axes, axis = [], -1
        for l in nest:
            role = None
            for iv, value in zip(block.iter_vars, realize.iter_values):
                if tir.uses_var(value, l.loop_var):
                    role = "R" if int(iv.iter_type) == 2 else "S"
            if role is None:
                continue
            if l.same_as(loop):
                axis = len(axes)
            axes.append((l.loop_var.name, int(l.extent), role))
        role = axes[axis][2] if axis >= 0 else "S"
        return block.name_hint, role, tuple(axes), axis
    return "", "S", (), -1


def _enclosing_loops(sch, loop_rv) -> tuple:
    """The For loops around a loop, outermost first (a few sref hops: no walk of the function)."""
    from tvm import tirx
    out = []
    sref = sch.get_sref(loop_rv).parent
    while sref is not None:
        if isinstance(sref.stmt, tirx.For):
            out.append(sref.stmt)
        sref = sref.parent
    return tuple(reversed(out))


def _loops_below(loop):
    from tvm import tirx

    from tensorlang.lower import tir
    for node, _ in tir.walk(loop.body):
        if isinstance(node, tirx.For):
            yield node


def uncovered_block(mod) -> str:
    """'' if every block that writes an output of the function runs over its whole iteration domain,
    else which one does not: fewer iterations than its domain leave output points never written.
    (An intermediate stage computed at a consumer computes only what the consumer reads: not checked.)"""
    from tensorlang.lower import tir
    from tvm import s_tir
    func = mod["main"]
    allocated = {b.name for node, _ in tir.walk(func.body) if isinstance(node, s_tir.SBlock)
                 for b in node.alloc_buffers}
    for realize, loops in tir.block_realizes(func.body):
        if all(w.source.name in allocated for w in realize.block.writes):
            continue  # writes only intermediates
        domain = math.prod(_int(iv.dom.extent) or 1 for iv in realize.block.iter_vars)
        runs = math.prod(_int(loop.extent) or 1 for loop in loops)
        if runs < domain:
            return (f"block {realize.block.name_hint} runs {runs} of its {domain} iterations "
                    f"(a reverse_compute_at that covers only the producer's tile)")
    return ""


def static_decisions(trace, mod) -> set[int]:
    """The indices of a trace's decisions whose domains do not depend on earlier decisions."""
    from tensorlang.lower import tir
    original = {r.block.name_hint for r, _ in tir.block_realizes(mod["main"].body)}
    names: dict = {}  # SBlockRV -> block name (None: a block the sketch made)
    fresh: dict = {}  # LoopRV -> True if it was got from an untouched original block
    touched: set = set()
    static, k = set(), -1
    for inst in trace.insts:
        kind, ins, outs = inst.kind.name, list(inst.inputs), list(inst.outputs)
        if kind == "EnterPostproc":
            break
        if kind == "GetSBlock":
            names[outs[0]] = str(inst.attrs[0])
        elif kind == "GetLoops":
            ok = names.get(ins[0]) in original and names.get(ins[0]) not in touched
            for rv in outs:
                fresh[rv] = ok
        elif kind in ("ComputeAt", "ReverseComputeAt", "Blockize", "DecomposeReduction", "RFactor",
                      "TransformLayout", "Tensorize", "PadEinsum"):
            touched.add(names.get(ins[0]))
            if kind == "RFactor":  # the loops of the reduction block change
                touched.update(names.values())
        elif kind in ("Split", "Fuse", "Reorder", "AddUnitLoop"):
            for rv in ins:
                if rv in fresh:
                    fresh[rv] = False
        if kind in ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation"):
            k += 1
            if kind == "SampleCategorical" or (kind == "SamplePerfectTile" and fresh.get(ins[0], False)):
                static.add(k)
    return static


def _int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _loop_iter_type(loop) -> str:
    """TVM's GetLoopIterType: how the blocks directly under `loop` use its variable."""
    from tvm import s_tir

    from tensorlang.lower import tir
    spatial = reduce = other = 0
    stack = [loop.body]
    while stack:
        node = stack.pop()
        if isinstance(node, s_tir.SBlockRealize):  # a block's own body is not looked into
            for iv, value in zip(node.block.iter_vars, node.iter_values):
                if tir.uses_var(value, loop.loop_var):
                    t = int(iv.iter_type)
                    if t == 0:
                        spatial += 1
                    elif t == 2:
                        reduce += 1
                    else:
                        other += 1
            continue
        stack.extend(tir.children(node))
    if other or (spatial and reduce):
        return "opaque"
    if reduce:
        return "reduce"
    return "datapar" if tir.loop_kind(loop) == "serial" else "annotated"


@lru_cache(maxsize=4096)
def factorizations(extent: int, n: int, max_innermost: int = 0) -> tuple[tuple[int, ...], ...]:
    """Every ordered tuple of n positive factors whose product is `extent`."""
    if n == 1:
        return ((extent,),) if not max_innermost or extent <= max_innermost else ()
    out = []
    for d in range(1, extent + 1):
        if extent % d == 0:
            for rest in factorizations(extent // d, n - 1, max_innermost):
                out.append((d,) + rest)
    return tuple(out)


@dataclass(frozen=True)
class SiteRule:
    """What a compute-at decision's sites were decided by (Space.location_rule), besides which loops run
    once: whether the block can be inlined and, per loop of its first consumer down to the consumers'
    lowest common ancestor, the loop's iteration type (TVM's GetLoopIterType) and whether compute_at
    there is legal (None: not asked). affine: the consumers reach the block's buffer through affine
    indices of their loops, so whether a site is legal does not depend on the tile factors' values;
    False where it can (a grouped conv's `c // 8 * 8` read: a channel tile that does not divide the group
    leaves the computed region's extent varying), and then no other replay's facts answer for it."""
    inline: bool
    kinds: tuple
    legal: tuple
    affine: bool = True


def _affine(e) -> bool:
    """`e` is an affine form of variables with integer coefficients (the only indices whose region, relaxed
    over loops of constant extents, has a constant extent). Not TVM's detect_linear_equation, which
    gpu_model uses: here it runs on every compute-at decision, and it took 0.27 ms per decision of a
    conv2d where this takes 0.09."""
    from tvm import tirx
    if isinstance(e, (tirx.Var, tirx.IntImm)):
        return True
    if isinstance(e, (tirx.Add, tirx.Sub)):
        return _affine(e.a) and _affine(e.b)
    if isinstance(e, tirx.Mul):
        return (isinstance(e.a, tirx.IntImm) and _affine(e.b)) or (isinstance(e.b, tirx.IntImm) and _affine(e.a))
    return False


def _realize_of(sch, block_rv):
    """The SBlockRealize of a block (its iterators' bindings), found under its parent."""
    from tensorlang.lower import tir
    block = sch.get(block_rv)
    parent = sch.get_sref(block_rv).parent
    return next((r for r, _ in tir.block_realizes(parent.stmt) if r.block.same_as(block)), None)


def _reads_affine(consumer_realize, buffers) -> bool:
    """The consumer's bindings and its reads of `buffers` are affine (see SiteRule.affine)."""
    if consumer_realize is None:
        return False
    block = consumer_realize.block
    if not all(_affine(v) for v in consumer_realize.iter_values):
        return False
    return all(_affine(r.min) and _int(r.extent) is not None
               for region in block.reads if any(region.source.same_as(b) for b in buffers) for r in region.region)


def _compute_at_static(sch, block, loop_rv) -> None:
    """compute_at as SampleComputeLocation's sites are used -- refused, as the postprocessor
    DisallowDynamicLoop refuses the schedule, where a loop it makes has no constant extent."""
    sch.compute_at(block, loop_rv, preserve_unit_loops=True)
    for rv in sch.get_loops(block):
        if _int(sch.get(rv).extent) is None:
            raise ValueError("a loop of non-constant extent")


def runs_once(loop) -> bool:
    """A loop of extent 1 (TVM skips it as a compute-at site)."""
    return _int(loop.extent) == 1


def candidate_sites(inline: bool, kinds, units, legal: Callable[[int], bool]) -> tuple[int, ...]:
    """TVM's CollectComputeLocation, given the facts: inline (-2) if it can, root (-1), then each loop
    that runs more than once, up to a data-parallel loop after a reduction one and before the trailing
    reduction ones, where compute_at is legal."""
    out = [-2] if inline else []
    out.append(-1)
    last_datapar = max((i for i, k in enumerate(kinds) if k == "datapar"), default=-1)
    visited_reduce = False
    for i in range(len(kinds)):
        if units[i]:
            continue
        if kinds[i] == "datapar":
            if visited_reduce:
                break
        else:
            visited_reduce = True
            if i > last_datapar:
                break
        if legal(i):
            out.append(i)
    return tuple(out)


def loop_sources(loops, tile_loops: list, original: frozenset) -> tuple | None:
    """Per loop of `loops` (a block's loops at a point of a replay), where its extent comes from:
    ("tile", k, part) -- factor `part` of decision k, which tiled the loop named `tile_loops[k]` (TVM names
    a split's loops `<name>_<part>`); ("static",) -- the same whatever the decisions so far are (a loop
    of the unscheduled function: its name and extent are in `original`). None when some loop is neither (a
    fusion, a cache stage's loop, rfactor's loop over the partial results: TVM names it `ax0` like other
    blocks' loops, but its extent is a tile factor)."""
    out = []
    for loop in loops:
        name = loop.loop_var.name
        src = None
        for k in range(len(tile_loops) - 1, -1, -1):
            base = tile_loops[k]
            if base and name.startswith(base + "_") and name[len(base) + 1:].isdigit():
                src = ("tile", k, int(name[len(base) + 1:]))
                break
        if src is None and (name, _int(loop.extent)) in original:
            src = ("static",)
        if src is None:
            return None
        out.append(src)
    return tuple(out)


class Space:
    def __init__(self, op_model, mod, target_model, seed: int = 0):
        from tensorlang.lower.targets import tvm_target
        self.op, self.mod, self.target = op_model, mod, target_model
        self.tvm_target = tvm_target(target_model)
        self.ctx = msx.tune_context(mod, self.tvm_target, msx.rule_kind(target_model), seed)
        # The design-space schedules themselves, not only their traces: they resolve a trace's block
        # variables to the blocks (`A_shared`, `C_rf`) that tensor sentences name decisions by.
        self.designs = list(self.ctx.generate_design_space())
        self.sketches = [s.trace for s in self.designs]
        self.postprocs = msx.postprocs_of(self.ctx)
        # Decision points met by any replay, by (sketch, decisions before them): the schedule at that
        # point is a function of exactly these, so a decoder writing many schedules of one operator asks
        # TVM about each prefix once (what it saves: compute-at sites and tiles of loops the sketch made).
        self.point_memo: dict = {}
        # GPU: per sketch, the limits that bind several tile decisions at once (None: not modelled)
        self.gpu_models: list = [None] * len(self.sketches)
        # Sketches whose schedules leave a block short of its iteration domain (TVM's reverse_compute_at
        # of a padding epilogue covers only what the tiled producer feeds, so the border is never
        # written): wrong kernels that MetaSchedule's runner, which checks no results, would time
        # anyway. Excluded here, index kept so that the other sketches' sentences keep their meaning.
        self.excluded: dict[int, str] = {}
        self._static: dict = {}
        for k in range(len(self.sketches)):  # one replay per sketch: coverage, static table, GPU model
            recorded: list = []
            sch, _ = self._apply(k, lambda point, made: (recorded.append(point), point.domain[0])[1])
            if target_model.is_gpu:
                self.gpu_models[k] = self._gpu_model(k, sch.mod)
            short = uncovered_block(sch.mod)
            if short:
                self.excluded[k] = short
            static = static_decisions(self.sketches[k], self.mod)
            self._static[k] = [p if i in static else None for i, p in enumerate(recorded)]
        if target_model.is_gpu:
            self._check_gpu_models()
        self.usable = [k for k in range(len(self.sketches)) if k not in self.excluded]

    def static_points(self, sketch: int) -> list:
        """Per decision index of a sketch, its DecisionPoint when the domain cannot depend on the
        decisions before it, else None. Categoricals are static (their candidates are in the trace); a
        tile is static when its loop comes from GetLoops on an original block that nothing has moved or
        re-tiled yet (its extent is the unscheduled loop's). Compute-at sites are never static. The GPU
        limits still narrow static tiles by the decisions made (`gpu_models`). NextTokens answers static
        steps from here without waiting for the replay."""
        return self._static[sketch]

    def _check_gpu_models(self) -> None:
        """Replay each GPU sketch once, postprocessors included, within its model's domains. A refusal
        means the model misses a limit of that sketch (one that is not a tiled block's: the model then
        goes, and the postprocessors alone decide its points, refusals counted) -- or, for a sketch
        with no decisions at all, that the sketch has no legal point (excluded)."""
        for k in range(len(self.sketches)):
            if k in self.excluded or self.gpu_models[k] is None:
                continue
            made: list = []
            try:
                self.replay(k, lambda point, prefix: (made.append(1), point.domain[0])[1], convert=False)
            except Infeasible as e:
                if made:
                    self.gpu_models[k] = None
                else:
                    self.excluded[k] = f"no legal point: {e}"
            except IndexError:  # the model leaves some decision no value: is the sketch really dead?
                model, self.gpu_models[k] = self.gpu_models[k], None
                try:
                    self.replay(k, lambda point, prefix: point.domain[0], convert=False)
                except Infeasible as e:  # TVM agrees at least on this point; keep the model's verdict
                    self.gpu_models[k] = model
                    self.excluded[k] = f"no legal point within the GPU limits: {e}"

    def refusal_free(self, sketch: int) -> bool:
        """No postprocessor refuses a point of this sketch whose decisions are in their domains: on CPU
        none does (the tests count zero rejections), on GPU the modelled sketches carry the limits."""
        return not self.target.is_gpu or self.gpu_models[sketch] is not None

    def _gpu_model(self, sketch: int, replayed_mod):
        from tensorlang.analysis.targets import gpu_limits
        from tensorlang.space import gpu_model
        try:
            return gpu_model.build(self.sketches[sketch], self.mod, self.tvm_target, replayed_mod,
                                   gpu_limits(self.target.params)["max_vthread"])
        except gpu_model.Unmodelled:
            return None

    # ------------------------------------------------------------ replay
    def replay(self, sketch: int, choose: Callable[[DecisionPoint, tuple], object], convert: bool = True,
               known: dict | None = None, probe_all: bool = False) -> Point:
        """Replay a sketch, asking `choose(point, decisions so far)` for each decision. `known`: decision
        index -> its DecisionPoint, when the caller has it already (not asked of TVM again). probe_all: a
        compute-at decision asks TVM about every loop that runs more than once, also those its sites stop
        before (what other unit patterns reach: space/sentence.py, SiteFacts)."""
        if sketch in self.excluded:
            raise Infeasible(f"sketch {sketch} is excluded: {self.excluded[sketch]}")
        sch, made = self._apply(sketch, choose, self.gpu_models[sketch], known, probe_all)
        with self.ctx.target:
            for p in self.postprocs:
                if not p.apply(sch):
                    raise Infeasible(f"{type(p).__name__} rejected sketch {sketch} with {tuple(made)}")
        short = uncovered_block(sch.mod)
        if short:
            raise Infeasible(f"sketch {sketch} with {tuple(made)}: {short}")
        point = Point(sketch, tuple(made), mod=sch.mod, trace=sch.trace)
        if convert:
            from tensorlang.space.convert import trace_to_statements
            point.stmts, _ = trace_to_statements(sch.trace, self.mod, self.op)
        return point

    def _apply(self, sketch: int, choose, gpu=None, known: dict | None = None, probe_all: bool = False):
        """The sketch's instructions with `choose`'s decisions, before the postprocessors: (schedule, decisions)."""
        sch = Unchecked(self._unscheduled).copy()
        made: list = []
        tile_loops: list = []  # per decision: the name of the loop a tile decision splits (else None)

        def provider(inst, inputs, attrs, decision):
            # a point the caller knows is not asked of TVM again (a compute-at site's probes cost ~1 ms)
            point = known.get(len(made)) if known and inst.kind.name in _SAMPLING else None
            if point is None:
                point = self.decision_point(sch, inst, inputs, attrs, tile_loops, probe_all)
            if point is None:
                return decision
            tile_loops.append(point.subject.rsplit(" (", 1)[0] if point.kind == TILE else None)
            if len(self.point_memo) > 100_000:
                self.point_memo.clear()
            self.point_memo[(sketch, tuple(made))] = point
            if gpu is not None and point.kind == TILE:
                point = replace(point, domain=gpu.restrict(len(made), point.domain, tuple(made)))
            value = choose(point, tuple(made))
            if value not in point.domain:
                raise ValueError(f"{value!r} is not in the domain of {point.subject}")
            made.append(value)
            return list(value) if point.kind == TILE else value

        with self.ctx.target:
            self.sketches[sketch].apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        return sch, made

    def decision_point(self, sch, inst, inputs, attrs, tile_loops: list = (),
                       probe_all: bool = False) -> DecisionPoint | None:
        """The decision an instruction asks for at this point of a replay. tile_loops: per decision before
        it, the loop name a tile decision split (for a compute-at decision's loop sources)."""
        kind = inst.kind.name
        if kind == "SamplePerfectTile":
            loop = Unchecked(sch).get(inputs[0])
            extent, n, max_inner = int(loop.extent), int(attrs[0]), int(attrs[1])
            return DecisionPoint(TILE, factorizations(extent, n, max_inner), f"{loop.loop_var.name} ({extent})",
                                 extent, n, max_inner, loop=loop, outer=_enclosing_loops(sch, inputs[0]))
        if kind == "SampleCategorical":
            candidates = tuple(int(c.value) if hasattr(c, "value") else c for c in attrs[0])
            probs = [float(p.value) if hasattr(p, "value") else float(p) for p in attrs[1]]
            return DecisionPoint(CATEGORICAL, tuple(i for i, p in enumerate(probs) if p > 0),
                                 f"one of {list(candidates)}", candidates=candidates)
        if kind == "SampleComputeLocation":
            block = inputs[0]
            rule, domain = self.location_rule(sch, block, probe_all)
            fast = Unchecked(sch)
            consumers = fast.get_consumers(block)
            loops = tuple(fast.get(rv) for rv in fast.get_loops(consumers[0])) if consumers else ()
            sites = tuple(loops[d].loop_var.name if d >= 0 else "" for d in domain)
            placed = fast.get(block)
            name = placed.name_hint
            return DecisionPoint(LOCATION, domain, f"compute-at site of {name}", sites=sites, placed=name,
                                 placed_buffers=tuple(w.source.name for w in placed.writes),
                                 placed_reduces=any(int(iv.iter_type) == 2 for iv in placed.iter_vars),
                                 consumer=fast.get(consumers[0]).name_hint if consumers else "", consumer_loops=loops,
                                 rule=rule, sources=loop_sources(loops, list(tile_loops), self._original_loops))
        return None

    @cached_property
    def _unscheduled(self):
        """The function as a Schedule, which each replay copies: a copy costs 10 us, a new Schedule 0.7 ms
        (its block dependence analysis). "fast" errors: the location probes meet many refusals, and
        rendering each in detail costs 0.3 ms."""
        from tvm import s_tir
        return s_tir.Schedule(self.mod, error_render_level="fast")

    @cached_property
    def _original_loops(self) -> frozenset:
        """(name, extent) of the unscheduled function's loops (a loop a primitive made has a new name, or
        one of another block's names with another extent)."""
        from tvm import tirx

        from tensorlang.lower import tir
        return frozenset((n.loop_var.name, _int(n.extent)) for n, _ in tir.walk(self.mod["main"].body)
                         if isinstance(n, tirx.For))

    @staticmethod
    def location_rule(sch, block, probe_all: bool = False) -> tuple["SiteRule", tuple[int, ...]]:
        """The sites SampleComputeLocation accepts for `block`, by TVM's own rules (CollectComputeLocation):
        -2 if the block can be inlined, -1 (root), then the i-th loop of the first consumer for the loops
        down to the consumers' lowest common ancestor -- skipping unit loops, stopping at a data-parallel
        loop after a reduction one and before trailing reduction ones -- where compute_at is legal.
        Each legality is asked of TVM once, on a copy of the schedule (TVM's sampler would redo the
        whole collection for every site asked about, quadratic in the loops: 84 ms for a conv2d's pad);
        a site where the block's loops would have no constant extent is not legal (TVM's sampler offers
        it, the postprocessor DisallowDynamicLoop refuses the schedule).
        Returns the facts decided by (SiteRule) and the sites; probe_all: ask about every loop that runs
        more than once, also those the rule stops before."""
        from tvm.s_tir import ScheduleError
        fast = Unchecked(sch)

        def legal(action) -> bool:
            try:
                action(Unchecked(fast.copy()))
                return True
            except (ScheduleError, RuntimeError, ValueError):
                return False

        # A block with a reduction axis is not "complete", which compute_inline requires: no probe needed.
        reduces = any(int(iv.iter_type) == 2 for iv in fast.get(block).iter_vars)
        inline = not reduces and legal(lambda t: t.compute_inline(block))
        consumers = fast.get_consumers(block)
        if not consumers:
            return SiteRule(inline, (), ()), candidate_sites(inline, (), (), bool)
        loop_rvs = fast.get_loops(consumers[0])
        loops = [fast.get(rv) for rv in loop_rvs]
        if len(consumers) > 1:
            n_common = len(loops)
            for c in consumers[1:]:
                others = [fast.get(rv) for rv in fast.get_loops(c)]
                n = 0
                while n < min(n_common, len(others)) and others[n].same_as(loops[n]):
                    n += 1
                n_common = n
            n_candidates = n_common  # the LCA is the last common loop (none: the root block)
        else:
            parent = fast.get_sref(consumers[0]).parent
            n_candidates = len(loops) if loops and parent is not None and parent.stmt.same_as(loops[-1]) else 0
        kinds = tuple(_loop_iter_type(loop) for loop in loops[:n_candidates])
        units = tuple(runs_once(loop) for loop in loops[:n_candidates])
        asked: list = [None] * n_candidates

        # Affine reads over loops of constant extents give regions of constant extent: only a block read
        # otherwise needs its loops' extents checked after compute_at.
        buffers = [w.source for w in fast.get(block).writes]
        affine = all(_reads_affine(_realize_of(fast, c), buffers) for c in consumers)
        compute_at = ((lambda t, rv: t.compute_at(block, rv, preserve_unit_loops=True)) if affine
                      else (lambda t, rv: _compute_at_static(t, block, rv)))

        def ask(i: int) -> bool:
            if asked[i] is None:
                asked[i] = legal(lambda t, rv=loop_rvs[i]: compute_at(t, rv))
            return asked[i]
        if probe_all:
            for i in range(n_candidates):
                if not units[i]:
                    ask(i)
        domain = candidate_sites(inline, kinds, units, ask)
        return SiteRule(inline, kinds, tuple(asked), affine), domain

    # ------------------------------------------------------------ sampling
    def sample(self, n: int, seed: int = 0, max_rejections: int = 1000) -> tuple[list[Point], int]:
        """n distinct points, uniformly random decisions per sketch; (points, rejections)."""
        rng = random.Random(seed)
        seen, points, rejections = set(), [], 0
        attempts = 0
        if not self.usable:  # every sketch excluded: the operator has no legal schedule in the space
            return [], 0
        # a small space (a reshape has one point) would otherwise take 50 n replays to give up
        bound, _ = self.count(limit=0)
        while len(points) < n and attempts < min(50 * n + 100, 30 * bound + 30):
            attempts += 1
            sketch = rng.choice(self.usable)
            try:
                p = self.replay(sketch, lambda point, prefix: rng.choice(point.domain), convert=False)
            except Infeasible:
                rejections += 1
                if rejections > max_rejections:
                    break
                continue
            key = (p.sketch, p.decisions)
            if key in seen:
                continue
            seen.add(key)
            from tensorlang.space.convert import trace_to_statements
            p.stmts, _ = trace_to_statements(p.trace, self.mod, self.op)
            points.append(p)
        return points, rejections

    def sample_decisions(self, n: int, seed: int = 0) -> list[tuple[int, tuple, tuple]]:
        """n distinct (sketch, decisions, kinds), drawn as `sample` draws them but without the
        postprocessors and the conversion to statements: for the pre-training corpus, which keeps only
        the sentence (5-50x faster). Sound because no postprocessor refuses a point whose limits are in
        its domains: on CPU none ever does (the tests count zero rejections), on GPU a modelled sketch
        has its limits in the domains; a GPU sketch without a model is replayed in full."""
        rng = random.Random(seed)
        seen, out = set(), []
        attempts = 0
        if not self.usable:
            return []
        # a small space (a reshape has one point) would otherwise take 50 n replays to give up
        bound, _ = self.count(limit=0)
        cap = min(50 * n + 100, 30 * bound + 30)
        while len(out) < n and attempts < cap:
            attempts += 1
            sketch = rng.choice(self.usable)
            kinds: list = []

            def choose(point, prefix):
                kinds.append(point.kind)
                return rng.choice(point.domain)
            if self.target.is_gpu and self.gpu_models[sketch] is None:
                try:
                    made = self.replay(sketch, choose, convert=False).decisions
                except Infeasible:
                    continue
            else:
                _, made = self._apply(sketch, choose, self.gpu_models[sketch])
            key = (sketch, tuple(made))
            if key not in seen:
                seen.add(key)
                out.append((sketch, tuple(made), tuple(kinds)))
        return out

    # ------------------------------------------------------------- counting
    def count(self, limit: int = 20000) -> tuple[int, bool]:
        """(size of the space, exact?). Exact by enumeration when the bound is at most `limit`,
        else the bound: the product of the domain sizes met on one replay of each sketch."""
        total_bound = 0
        bounds = []
        for s in self.usable:
            sizes = []
            try:
                self.replay(s, lambda point, prefix: (sizes.append(len(point.domain)), point.domain[0])[1],
                            convert=False)
            except Infeasible:
                pass  # the domain sizes were all met before the postprocessors ran
            bounds.append(math.prod(sizes))
            total_bound += bounds[-1]
        if total_bound > limit:
            return total_bound, False
        return sum(self.enumerate_sketch(s) for s in self.usable), True

    def enumerate_sketch(self, sketch: int) -> int:
        """The number of points of one sketch, by walking every decision path."""
        count = 0
        stack: list[tuple] = [()]
        while stack:
            prefix = stack.pop()
            branch: dict = {}

            def choose(point, made, prefix=prefix, branch=branch):
                k = len(made)
                if k < len(prefix):
                    return prefix[k]
                if "domain" not in branch:
                    branch["domain"] = point.domain
                return point.domain[0]

            try:
                self.replay(sketch, choose, convert=False)
                feasible = True
            except Infeasible:
                feasible = False
            if "domain" in branch:  # the prefix stops short of a decision: branch on it
                stack.extend(prefix + (v,) for v in branch["domain"])
            elif feasible:
                count += 1
        return count
