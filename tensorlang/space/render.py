"""Schedules as an engineer would write them: short loop names, no statement that does nothing, a comment
per group of statements.

Generated schedules (any policy: the space's points, roller, the model, MetaSchedule's traces) are converted
from TVM traces, so their loop names are TVM's (`n_0_f_0_y_0_x_0_fused`) and they keep what the trace did
(`x_3_fused = fuse(x_3)`). `humanize` rewrites the statements without changing what they do:

- a `fuse` of one loop is dropped, its name replaced by the loop's;
- a loop a `split` makes is named after the loop it splits and its level: `f0, f1, f2` for `split(Y.f, ...)`
  (`ax0_1` when the name ends in a digit); a fused loop after what is done with it -- `outer` (parallel),
  `bx`/`by`/`bz`, `vx`, `tx`/`ty`/`tz` (GPU blocks, virtual threads, threads), `vec` (vectorized) -- else
  after the loops it fuses (`nc` for `fuse(P.n, P.c)`, `ax012` for `fuse(T.ax0, T.ax1, T.ax2)`, or
  `<stage>_fused` / `<stage>_fetch` when that is long). A name already
  taken gets its stage as a prefix (`p_outer`), then a number. Stage names (`Y_global`, `C_init`) are TVM's
  and stay.

`render_schedule` prints a `schedule` block of the humanized statements with a comment before each group
(tiling, caches and compute locations, parallel/vector/unroll, GPU threads, the reduction's init). The
result applies to exactly the same TensorIR as the input (tests: structural equality, and `check --space`
locates it) and is the same text every time.
"""
from __future__ import annotations

import re
from dataclasses import replace

from tensorlang.parser import ast as A
from tensorlang.parser.printer import format_stmt

_THREAD_NAMES = {"blockIdx": "b", "threadIdx": "t", "vthread": "v"}
_RESERVED = {"global", "shared", "local", "True", "False", "None", "blockIdx", "threadIdx", "vthread", "warp"}
_MAX_JOINED = 8  # a fused loop named by joining its loops' names up to this length


# ------------------------------------------------------------------ references
def _rename_arg(arg, names: dict):
    if isinstance(arg, A.Ref):
        if len(arg.parts) == 1 and arg.parts[0] in names:
            new = names[arg.parts[0]]
            return A.Ref(new.parts if isinstance(new, A.Ref) else (new,), arg.span)
        return arg
    if isinstance(arg, A.ListArg):
        return A.ListArg(tuple(_rename_arg(x, names) for x in arg.items), arg.span)
    if isinstance(arg, A.KwSchedArg):
        return A.KwSchedArg(arg.name, _rename_arg(arg.value, names), arg.span)
    return arg


def _loop_args(stmt: A.SchedStmt) -> list[A.Ref]:
    return [a for a in stmt.args if isinstance(a, A.Ref)]


def _plain_args(stmt: A.SchedStmt) -> list:
    return [a for a in stmt.args if not isinstance(a, A.KwSchedArg)]


# ------------------------------------------------------------------ passes
def drop_identity_fuses(stmts: list[A.SchedStmt]) -> list[A.SchedStmt]:
    """`x = fuse(y)` fuses nothing: drop it and write `y` wherever `x` was used. A `parallel(x)` (or
    vectorize, unroll) of a loop already so marked then repeats one (RewriteParallelVectorizeUnroll
    marks a loop twice when a stage computed at it is fused in between): drop the repeat too."""
    alias: dict[str, A.Ref] = {}
    marked: set[tuple] = set()  # (prim, loop name parts) of the loops marked so far
    out = []
    for s in stmts:
        s = replace(s, args=tuple(_rename_arg(a, alias) for a in s.args))
        plain = _plain_args(s)
        if s.prim == "fuse" and len(s.targets) == 1 and len(plain) == 1 and isinstance(plain[0], A.Ref):
            alias[s.targets[0].name] = plain[0]
            continue
        if s.prim in ("parallel", "vectorize", "unroll") and isinstance(plain[0], A.Ref):
            if (s.prim, plain[0].parts) in marked:
                continue
            marked.add((s.prim, plain[0].parts))
        for t in s.targets:  # a name bound again is a new loop
            alias.pop(t.name, None)
            marked = {m for m in marked if m[1][0] != t.name}
        out.append(s)
    return out


def _roles(stmts: list[A.SchedStmt]) -> dict[tuple[int, str], str]:
    """(statement index, bound name) -> what is done with that loop later: outer / bx / tx / vx / vec."""
    roles: dict[tuple[int, str], str] = {}
    live: dict[str, int] = {}  # name -> index of the statement that bound it
    for n, s in enumerate(stmts):
        refs = _loop_args(s)
        if refs and len(refs[0].parts) == 1 and refs[0].parts[0] in live:
            key = (live[refs[0].parts[0]], refs[0].parts[0])
            if s.prim == "parallel":
                roles.setdefault(key, "outer")
            elif s.prim == "vectorize":
                roles.setdefault(key, "vec")
            elif s.prim == "bind" and len(refs) > 1:
                tag = refs[1].parts
                if tag[0] in _THREAD_NAMES:
                    roles.setdefault(key, _THREAD_NAMES[tag[0]] + (tag[1] if len(tag) > 1 else "x"))
        for t in s.targets:
            live[t.name] = n
    return roles


def humanize(stmts) -> list[A.SchedStmt]:
    """The statements with engineers' loop names and without identity fuses (see the module docstring)."""
    stmts = drop_identity_fuses(list(stmts))
    roles = _roles(stmts)
    stages = {t.name for s in stmts if s.prim not in ("split", "fuse") for t in s.targets}
    stages |= {a.parts[0] for s in stmts for a in _loop_args(s) if len(a.parts) == 2}
    fetched = {t.name for s in stmts if s.prim == "cache_read" for t in s.targets}
    taken = set(stages) | _RESERVED
    new: dict[str, str] = {}  # TVM's loop name -> ours (the current binding)
    stage_of: dict[str, str] = {}  # our loop name -> its stage
    fused: set[str] = set()  # our names of fused loops

    def fresh(want: str, stage: str | None) -> str:
        if want not in taken:
            return want
        if stage and not want.startswith(stage.lower() + "_"):
            want = f"{stage.lower()}_{want}"
            if want not in taken:
                return want
        k = 2
        while f"{want}_{k}" in taken:
            k += 1
        return f"{want}_{k}"

    def source(ref: A.Ref) -> tuple[str, str | None]:
        """(the name a loop argument is known by, its stage)."""
        if len(ref.parts) == 2:
            return ref.parts[1], ref.parts[0]
        return ref.parts[0], stage_of.get(ref.parts[0])

    def fused_name(srcs, stage) -> str:
        bases = [b for b, _ in srcs]
        levels = {m.group() if m else "" for b in bases for m in [re.search(r"\d+$", b)]}
        if len(levels) == 1:  # n0, f0, y0 -> nfy0; P.n, P.c -> nc
            joined = "".join(re.sub(r"\d+$", "", b) for b in bases) + levels.pop()
            if len(joined) <= _MAX_JOINED:
                return joined
        prefixes = {re.sub(r"\d+$", "", b) for b in bases}
        if len(prefixes) == 1:  # ax0, ax1, ax2 -> ax012
            joined = prefixes.pop() + "".join(b[len(re.sub(r"\d+$", "", b)):] for b in bases)
            if len(joined) <= _MAX_JOINED:
                return joined
        kind = "fetch" if stage in fetched else "fused"
        return f"{(stage or 'loop').lower()}_{kind}"

    out = []
    for n, s in enumerate(stmts):
        s = replace(s, args=tuple(_rename_arg(a, new) for a in s.args))
        if s.prim in ("split", "fuse") and s.targets:
            srcs = [source(a) for a in _plain_args(s) if isinstance(a, A.Ref)]
            stage = next((st for _, st in srcs if st), None)
            names = []
            for k, t in enumerate(s.targets):
                role = roles.get((n, t.name))
                if s.prim == "fuse":  # named after what is done with it, else after what it fuses
                    want = role or fused_name(srcs, stage)
                else:  # named after the loop it splits and the level; a fused loop's parts after their use
                    b = srcs[0][0] if srcs else t.name
                    want = role if role and b in fused else (f"{b}_{k}" if b[-1:].isdigit() else f"{b}{k}")
                name = fresh(want, stage)
                taken.add(name)
                new[t.name] = name
                if stage:
                    stage_of[name] = stage
                if s.prim == "fuse":
                    fused.add(name)
                names.append(A.Name(name, t.span))
            s = replace(s, targets=tuple(names))
        else:
            for t in s.targets:  # a stage this statement makes keeps its name
                new.pop(t.name, None)
        out.append(s)
    return out


# ------------------------------------------------------------------ comments
_CACHE_PRIMS = {"cache_read", "cache_write", "compute_at", "reverse_compute_at", "compute_inline",
                "reverse_compute_inline", "set_scope"}


def _stage_of_loops(stmts) -> dict[str, str]:
    """Bound loop name -> the stage it is a loop of (from the loops it was split or fused from)."""
    out: dict[str, str] = {}
    for s in stmts:
        if s.prim in ("split", "fuse"):
            for a in _loop_args(s):
                st = a.parts[0] if len(a.parts) == 2 else out.get(a.parts[0])
                if st:
                    for t in s.targets:
                        out[t.name] = st
                    break
    return out


def _uses(name: str, stmts) -> list[A.SchedStmt]:
    return [u for u in stmts if any(len(r.parts) == 1 and r.parts[0] == name for r in _loop_args(u))]


def _group(n: int, stmts, fetched: set, stage_of: dict) -> str:
    """What statement n is part of: tile, cache (incl. a shared-memory fetch's loops), pvu (parallel,
    vectorize, unroll), threads, init, rfactor, other."""
    s = stmts[n]
    p = s.prim
    refs = _loop_args(s)
    stage = refs[0].parts[0] if refs and len(refs[0].parts) == 2 else stage_of.get(refs[0].parts[0]) if refs else None
    if p in _CACHE_PRIMS or (stage in fetched and p in ("split", "fuse", "bind", "vectorize")):
        return "cache"
    if p == "annotate":
        key = s.args[1].value if len(s.args) > 1 and isinstance(s.args[1], A.Const) else ""
        if key == "meta_schedule.tiling_structure":
            return "tile"
        if "thread_extent" in key:
            return "threads"
        if "cooperative_fetch" in key:
            return "cache"
        return "pvu" if "unroll" in key else "other"
    if p in ("split", "fuse"):  # with what is done with its loops next
        for t in s.targets:
            for m in range(n + 1, len(stmts)):
                u = stmts[m]
                if u not in _uses(t.name, [u]):
                    continue
                if u.prim == "bind":
                    return "threads"
                if u.prim in ("parallel", "vectorize", "unroll") or (u.prim == "annotate" and p == "fuse"):
                    return "pvu"
                if u.prim in ("split", "fuse") and p == "fuse":  # fused to be split: as its parts
                    g = _group(m, stmts, fetched, stage_of)
                    if g != "tile":
                        return g
                break
        return "tile"
    if p == "reorder":
        return "tile"
    if p == "bind":
        return "threads"
    if p in ("parallel", "vectorize", "unroll"):
        return "pvu"
    if p == "decompose_reduction":
        return "init"
    if p == "rfactor":
        return "rfactor"
    return "other"


def _comment(group: str, run: list[A.SchedStmt]) -> str | None:
    if group == "tile":
        ann = next((s for s in run if s.prim == "annotate" and len(s.args) > 2 and isinstance(s.args[2], A.Const)), None)
        if ann is not None:
            return (f"# tile {ann.args[0].text}: levels {' '.join(ann.args[2].value)} (S spatial, R reduction), "
                    f"outermost first")
        return "# tile the loops"
    if group == "pvu":
        did = [w for w, prims in (("parallel", ("parallel",)), ("vectorize", ("vectorize",)),
                                  ("unroll", ("unroll", "annotate"))) if any(s.prim in prims for s in run)]
        return "# " + ", ".join(did) if did else None
    if group == "cache" and all(s.prim == "compute_inline" for s in run):
        return "# inline " + ", ".join(s.args[0].text for s in run)
    return {"cache": "# caches, where stages are computed" + (
                ", cooperative fetch" if any(s.prim in ("bind", "fuse") for s in run) else ""),
            "threads": "# GPU blocks and threads",
            "init": "# the reduction's initialisation, apart",
            "rfactor": "# a partial reduction (rfactor)"}.get(group)


def render_statements(stmts, indent: str = "    ", comments: bool = True) -> str:
    """The humanized statements, one per line, with a comment before each run of one group."""
    stmts = humanize(stmts)
    fetched = {t.name for s in stmts if s.prim == "cache_read" for t in s.targets}
    stage_of = _stage_of_loops(stmts)
    groups = [_group(n, stmts, fetched, stage_of) for n in range(len(stmts))]
    lines = []
    for n, s in enumerate(stmts):
        if comments and (n == 0 or groups[n] != groups[n - 1]):
            end = next((m for m in range(n, len(stmts)) if groups[m] != groups[n]), len(stmts))
            c = _comment(groups[n], stmts[n:end])
            if c:
                lines.append(indent + c)
        lines.append(indent + format_stmt(s))
    return "".join(line + "\n" for line in lines)


def statements_text(stmts) -> str:
    """The humanized statements, one per line, unindented, no comments: a policy's schedule text (the editor
    matches it line by line against what is written; `render_schedule` adds the comments)."""
    return render_statements(stmts, indent="", comments=False)


def render_schedule(op: str, target: str, stmts, comments: bool = True) -> str:
    """A `schedule OP on TARGET { ... }` block an engineer can read and edit."""
    return f"schedule {op} on {target} {{\n{render_statements(stmts, comments=comments)}}}\n"
