"""The GPU limits that bind several decisions at once, as exact functions of the decisions.

On CUDA, MetaSchedule samples each tile on its own and lets the `VerifyGPUCode` postprocessor refuse
what breaks the limits -- about 9 uniform samples in 10 on a matmul. The limits are joint: a block's
threads are the product of the thread-level factors of all its spatial tiles (MultiLevelTiling
annotates the block with `thread_extent_low_inclusive`/`high_inclusive`: 32..1024), its virtual
threads the product of the vthread-level factors (at most 8), and its shared memory the sum over the
shared caches of their footprint, which grows with every factor below the cache's compute-at loop.

`GpuModel` reads those products off a sketch's trace, once per sketch: which factor of which tile
decision each bound loop is made of (Split -> Fuse -> Bind), which factors each shared cache's
footprint spans (the loops below its ComputeAt site, and the thread/vthread loops above it, which a
shared buffer covers), and the read's index coefficients (from the block's read region). With it,
`restrict` narrows a tile decision's domain to the values that some completion of the remaining
decisions can still satisfy, so uniform sampling never meets a rejection; a test checks the model
against VerifyGPUCode on sampled points. A sketch whose trace does something the model does not
know (a dynamic extent, a warp-execution block, ...) gets no model, and its points keep being
checked by the postprocessor alone (counted as rejections when refused).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product

SAMPLING = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")
LOW, HIGH = "meta_schedule.thread_extent_low_inclusive", "meta_schedule.thread_extent_high_inclusive"


class Unmodelled(Exception):
    """The sketch does something this model does not describe."""


@dataclass
class Buffer:
    """A shared cache: bytes = versions * dtype bytes * prod over dims of
    (1 + extent_d - 1 + sum over loops of |coef| * (inner extent of the loop - 1))."""
    name: str
    dtype_bytes: int
    versions: int
    dims: list  # per dim: (region extent, [(decision index, positions below the site, |coef|)])


@dataclass
class Group:
    """One multi-level-tiled block: its thread and vthread products and its shared caches."""
    block: str
    low: int = 1
    high: int = 1 << 30
    threads: list = field(default_factory=list)  # (decision index, position)
    vthreads: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    decisions: set = field(default_factory=set)  # tile decisions the limits depend on
    # a software-pipelined block: the loop its shared caches are computed at, as (decision, position)
    # factors -- TVM's InjectSoftwarePipeline fails on a pipelined loop of extent 1
    pipelined_site: list = field(default_factory=list)


@dataclass
class GpuModel:
    groups: list
    tile_extents: dict  # decision index -> (extent, n, max_innermost)
    max_vthread: int
    max_shared: int
    _memo: dict = field(default_factory=dict, repr=False)  # restrict's answers
    _classes: dict = field(default_factory=dict, repr=False)  # decision -> (signatures, {signature: a value})
    _signatures: dict = field(default_factory=dict, repr=False)  # decision -> {value: signature}

    # ------------------------------------------------------------ evaluation
    def usage(self, group: Group, values: dict) -> tuple[int, int, int]:
        """(threads, vthreads, shared bytes) of a group with every tile decision in `values`."""
        threads = math.prod(values[d][p] for d, p in group.threads)
        vthreads = math.prod(values[d][p] for d, p in group.vthreads)
        return threads, vthreads, self._shared(group, values)

    @staticmethod
    def _shared(group: Group, values: dict) -> int:
        total = 0
        for b in group.buffers:
            size = 1
            for extent, terms in b.dims:
                span = extent
                for d, positions, coef in terms:
                    span += coef * (math.prod(values[d][p] for p in positions) - 1)
                size *= span
            total += b.versions * b.dtype_bytes * size
        return total

    def feasible(self, values: dict) -> bool:
        """Do the decided tiles in `values` (decision index -> factors) leave a completion within the limits?"""
        for g in self.groups:
            if not self._group_feasible(g, values):
                return False
        return True

    def _group_feasible(self, g: Group, values: dict) -> bool:
        # An undecided tile's cheapest completions: all of its extent at the outermost factor except
        # a thread factor t (any divisor, as the threads have a lower bound too). Every limit grows
        # with the inner factors, so if none of these fits, nothing does.
        open_ = sorted(d for d in g.decisions if d not in values)
        thread_pos = {d: p for d, p in g.threads}
        choices = []
        for d in open_:
            extent, n, _ = self.tile_extents[d]
            if d in thread_pos:
                p = thread_pos[d]
                choices.append([tuple(t if i == p else (extent // t if i == 0 else 1) for i in range(n))
                                for t in _divisors(extent)])
            else:
                choices.append([(extent,) + (1,) * (n - 1)])
        for combo in product(*choices):
            trial = dict(values)
            trial.update(zip(open_, combo))
            threads, vthreads, shared = self.usage(g, trial)
            if g.low <= threads <= g.high and vthreads <= self.max_vthread and shared <= self.max_shared \
                    and math.prod(trial[d][p] for d, p in g.pipelined_site) >= (2 if g.pipelined_site else 1):
                return True
        return False

    def restrict(self, decision: int, domain: tuple, made: tuple) -> tuple:
        """The values of tile decision `decision` that keep the point completable."""
        if not any(decision in g.decisions for g in self.groups):
            return domain
        values = {d: v for d, v in enumerate(made) if d in self.tile_extents}
        # The answer depends on the decided tiles only through their signatures: remembered, so that a
        # decoder writing many schedules of one operator pays for each distinct prefix once.
        # (every modelled tile is of an original loop -- `build` refuses others -- so its domain is fixed)
        memo_key = (decision, len(domain), tuple((d, self._signature_of(d, v)) for d, v in sorted(values.items())))
        if memo_key not in self._memo:
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[memo_key] = self._restrict(decision, domain, values)
        return self._memo[memo_key]

    def _restrict(self, decision: int, domain: tuple, values: dict) -> tuple:
        # The limits read a tile only through a few products of its factors (its thread factor, its
        # vthread factor, the factors each shared footprint spans): tiles alike in those are decided once.
        if decision not in self._classes:  # each domain value's signature, and one value per signature
            keys = [self._signature(decision, v) for v in domain]
            self._classes[decision] = (keys, {key: v for key, v in zip(keys, domain)})
        keys, representative = self._classes[decision]
        ok = {key for key, v in representative.items() if self.feasible({**values, decision: v})}
        return tuple(v for v, key in zip(domain, keys) if key in ok)

    def _signature_of(self, d: int, v: tuple) -> tuple:
        table = self._signatures.setdefault(d, {})
        if v not in table:
            table[v] = self._signature(d, v)
        return table[v]

    def _signature(self, d: int, v: tuple) -> tuple:
        key = []
        for g in self.groups:
            key += [v[p] for dd, p in g.threads if dd == d] + [v[p] for dd, p in g.vthreads if dd == d]
            key += [v[p] for dd, p in g.pipelined_site if dd == d]
            for b in g.buffers:
                for _, terms in b.dims:
                    key += [math.prod(v[p] for p in positions) for dd, positions, _ in terms if dd == d]
        return tuple(key)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------- building


def build(trace, mod, tvm_target, replayed_mod, max_vthread: int = 8) -> GpuModel:
    """The model of one sketch. `replayed_mod`: the sketch replayed once with any decisions (for the
    blocks' read regions and the buffers' dtypes); `max_vthread`: the target's (the checker's TS402
    limit). Raises Unmodelled."""
    insts = list(trace.insts)
    decision_of: dict = {}  # ExprRV of a SamplePerfectTile output -> (decision index, position)
    tile_extents: dict = {}
    loop_block: dict = {}  # LoopRV -> the block name it belongs to
    loop_terms: dict = {}  # LoopRV -> [(decision, position)] its extent is the product of
    loop_orig: dict = {}  # LoopRV -> (block, original loop index) for GetLoops outputs of an untiled block
    block_name: dict = {}  # SBlockRV -> name
    tiled: dict = {}  # (block, original loop index) -> decision index
    order: dict = {}  # block -> loop RVs in Reorder order
    binds: list = []  # (block, tag, terms)
    bounds: dict = {}  # block -> [low, high]
    caches: list = []  # (consumer block, read index, cache block RV)
    sites: dict = {}  # cache block RV -> loop RV
    stages: dict = {}  # block -> versions of its pipelined shared caches
    touched: set = set()  # blocks a GetLoops has seen (later GetLoops may see tiled loops)
    k = -1
    for inst in insts:
        kind, ins, outs, attrs = inst.kind.name, list(inst.inputs), list(inst.outputs), list(inst.attrs)
        if kind in SAMPLING:
            k += 1
        if kind == "EnterPostproc":
            break
        if kind == "GetSBlock":
            block_name[outs[0]] = str(attrs[0])
        elif kind == "GetLoops":
            b = block_name.get(ins[0])
            for i, rv in enumerate(outs):
                loop_block[rv] = b
                if b not in touched:
                    loop_orig[rv] = (b, i)
            touched.add(b)
        elif kind == "SamplePerfectTile":
            if ins[0] not in loop_orig:
                raise Unmodelled("a tile of a loop that is not an original loop of its block")
            tiled[loop_orig[ins[0]]] = k
            for p, rv in enumerate(outs):
                decision_of[rv] = (k, p)
            tile_extents[k] = (None, int(attrs[0]), int(attrs[1]), loop_orig[ins[0]])
        elif kind == "Split":
            for rv, f in zip(outs, ins[1:]):
                loop_block[rv] = loop_block.get(ins[0])
                if f is not None and f in decision_of:
                    loop_terms[rv] = [decision_of[f]]
                else:
                    loop_terms[rv] = None  # a factor the model does not track
        elif kind == "Fuse":
            loop_block[outs[0]] = loop_block.get(ins[0])
            parts = [loop_terms.get(rv) for rv in ins]
            loop_terms[outs[0]] = None if any(p is None for p in parts) else sum(parts, [])
        elif kind == "Reorder":
            order[loop_block.get(ins[0])] = ins
        elif kind == "Bind":
            binds.append((loop_block.get(ins[0]), str(attrs[0]), loop_terms.get(ins[0]), ins[0]))
        elif kind == "Annotate":
            key = str(attrs[0])
            if key in (LOW, HIGH):
                b = block_name.get(ins[0])
                bounds.setdefault(b, [1, 1 << 30])[0 if key == LOW else 1] = int(ins[1])
            elif key == "software_pipeline_stage":
                # the pipelined loop is the tiled block's outer reduction loop, where its shared caches
                # are computed: each is kept in (stages) versions
                st = [int(x) for x in ins[1]]
                stages[loop_block.get(ins[0])] = max(st) - min(st) + 1
            elif key == "warp_execution":
                raise Unmodelled("warp execution")
        elif kind == "CacheRead":
            if str(attrs[1]) == "shared":
                caches.append((block_name.get(ins[0]), int(attrs[0]), outs[0]))
            block_name[outs[0]] = None  # named after the replay
        elif kind == "CacheWrite":
            block_name[outs[0]] = None
        elif kind == "ComputeAt":
            sites[ins[0]] = ins[1]

    extents = _original_extents(mod)
    from tensorlang.space.space import static_decisions
    static = static_decisions(trace, mod)  # tiles of loops nothing has moved: their extents are the original
    for d, (_, n, max_inner, (b, i)) in list(tile_extents.items()):
        if (b, i) not in extents or d not in static:
            raise Unmodelled(f"loop {i} of block {b} is not as in the unscheduled function when tiled")
        tile_extents[d] = (extents[(b, i)], n, max_inner)

    groups = []
    for b, (low, high) in bounds.items():
        g = Group(b, low, high)
        for blk, tag, terms, _ in binds:
            if blk != b:
                continue
            if terms is None:
                raise Unmodelled(f"a bound loop of {b} with an untracked extent")
            if tag.startswith("threadIdx"):
                g.threads += terms
            elif tag.startswith("vthread"):
                g.vthreads += terms
        g.decisions = {d for (bb, _), d in tiled.items() if bb == b}
        groups.append(g)
    by_block = {g.block: g for g in groups}
    for consumer, read_index, cache_rv in caches:
        g = by_block.get(consumer)
        if g is None:
            continue  # a cache of a block without thread bounds: not limited jointly
        site = sites.get(cache_rv)
        if site is None or consumer not in order:
            raise Unmodelled(f"a shared cache of {consumer} without a compute-at site in the tiled nest")
        g.buffers.append(_buffer(consumer, read_index, site, order[consumer], binds, loop_terms, tiled,
                                 stages.get(consumer, 1), mod, replayed_mod))
        if stages.get(consumer, 1) > 1:
            if loop_terms.get(site) is None:
                raise Unmodelled("a pipelined loop with an untracked extent")
            g.pipelined_site = list(loop_terms[site])
    attrs = tvm_target.attrs
    return GpuModel(groups, tile_extents, max_vthread, int(attrs.get("max_shared_memory_per_block", 49152)))


def _original_extents(mod) -> dict:
    """(block name, loop index) -> extent, for every block of the unscheduled function."""
    from tensorlang.lower import tir
    out = {}
    for realize, loops in tir.block_realizes(mod["main"].body):
        for i, loop in enumerate(loops):
            out[(realize.block.name_hint, i)] = int(loop.extent)
    return out


def _buffer(consumer, read_index, site, nest, binds, loop_terms, tiled, versions, mod, replayed_mod) -> Buffer:
    """The footprint of the `read_index`-th read of `consumer`, cached in shared memory at `site`."""
    from tvm.sym import pattern as arith

    from tensorlang.lower import tir
    # loops relaxed by the shared buffer: those below the site, and the thread/vthread loops above it
    if not any(rv.same_as(site) for rv in nest):
        raise Unmodelled("a compute-at site outside the reordered tile nest")
    below = nest[[i for i, rv in enumerate(nest) if rv.same_as(site)][0] + 1:]
    relaxed = []
    for rv in below:
        if loop_terms.get(rv) is None:
            raise Unmodelled("a loop below a shared cache's site with an untracked extent")
        relaxed += loop_terms[rv]
    for blk, tag, terms, _ in binds:
        if blk == consumer and (tag.startswith("threadIdx") or tag.startswith("vthread")):
            relaxed += terms
    # the read's index expressions, in the consumer's iter vars (the unscheduled block)
    block, realize, loops = None, None, None
    for r, ls in tir.block_realizes(mod["main"].body):
        if r.block.name_hint == consumer:
            block, realize, loops = r.block, r, ls
    if block is None:
        raise Unmodelled(f"block {consumer} not in the unscheduled function")
    # the read as the consumer has it when the cache is made (producers inlined into it by then)
    final = None
    for r, _ in tir.block_realizes(replayed_mod["main"].body):
        if r.block.name_hint == consumer:
            final = r.block
    if final is None or read_index >= len(final.reads):
        raise Unmodelled(f"the read {read_index} of {consumer}")
    region = final.reads[read_index]
    loop_of_var = {}
    for j, (iv, value) in enumerate(zip(block.iter_vars, realize.iter_values)):
        for i, loop in enumerate(loops):
            if value.same_as(loop.loop_var):
                loop_of_var[j] = i
    ivars = [iv.var for iv in final.iter_vars]
    dims = []
    for rng in region.region:
        coefs = arith.detect_linear_equation(rng.min, ivars)
        if len(coefs) != len(ivars) + 1:
            raise Unmodelled("a non-affine read index")
        terms = []
        for j, c in enumerate(coefs[:-1]):
            c = tir.as_int(c)
            if c is None:
                raise Unmodelled("a symbolic coefficient")
            if c == 0:
                continue
            if j not in loop_of_var or (consumer, loop_of_var[j]) not in tiled:
                raise Unmodelled("a read index over an untiled loop")
            d = tiled[(consumer, loop_of_var[j])]
            positions = tuple(p for dd, p in relaxed if dd == d)
            terms.append((d, positions, abs(c)))
        extent = tir.as_int(rng.extent)
        if extent is None:
            raise Unmodelled("a dynamic read extent")
        dims.append((extent, terms))
    from tensorlang.lower.gpu import _dtype_bytes
    buf = region.source
    return Buffer(str(buf.name), _dtype_bytes(buf.dtype), versions, dims)
