"""The loop nest of a (partly) scheduled operator, with the names a schedule can use.

    for i0 in 16 (parallel)               C.i_0
      for j0 in 8                         C.j_0
        ...
          stage C  [C_update]  reads A, B; writes C

Each loop shows the name to write in a statement (a bound name, else STAGE.var), its
extent, its kind and its thread binding.
"""
from __future__ import annotations

from dataclasses import dataclass

from tensorlang.lower import tir
from tensorlang.lower.schedule import NameEnv, _valid, stage_name_of


@dataclass
class LoopInfo:
    name: str  # what a statement writes for it
    tvm_name: str
    extent: int | None
    kind: str
    binding: str | None
    depth: int


@dataclass
class StageInfo:
    name: str
    block: str  # TVM's block name
    depth: int
    loops: list[str]  # names of the loops above it, outermost first


def loop_tree(sch, env: NameEnv) -> list[LoopInfo | StageInfo]:
    func = sch.mod["main"]
    bound = [(sch.get(rv), name) for name, rv in env.loops.items() if _valid(sch, rv)]
    out: list[LoopInfo | StageInfo] = []

    def visit(stmt, depth, loops):
        from tvm import s_tir, tirx
        if isinstance(stmt, tirx.For):
            owner = _first_stage(sch, env, stmt)
            name = next((n for loop, n in bound if loop.same_as(stmt)), None) or f"{owner}.{stmt.loop_var.name}"
            out.append(LoopInfo(name, stmt.loop_var.name, tir.as_int(stmt.extent), tir.loop_kind(stmt),
                                tir.thread_tag(stmt), depth))
            visit(stmt.body, depth + 1, loops + [name])
            return
        if isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            if block.name_hint != "root":
                out.append(StageInfo(stage_name_of(sch, env, block), block.name_hint, depth, list(loops)))
            for c in tir.children(block):
                visit(c, depth + (0 if block.name_hint == "root" else 1), loops)
            return
        for c in tir.children(stmt):
            visit(c, depth, loops)

    visit(func.body, 0, [])
    return out


def _first_stage(sch, env, loop) -> str:
    for realize, _ in tir.block_realizes(loop):
        return stage_name_of(sch, env, realize.block)
    return "?"


def render(items: list[LoopInfo | StageInfo]) -> str:
    lines = []
    for it in items:
        pad = "  " * it.depth
        if isinstance(it, LoopInfo):
            extra = [it.kind] if it.kind not in ("serial", "thread_binding") else []
            if it.binding:
                extra.append(f"bound to {it.binding}")
            lines.append(f"{pad}for {it.name} in {it.extent if it.extent is not None else '?'}"
                         + (f"  ({', '.join(extra)})" if extra else ""))
        else:
            tvm = f"  [TVM block {it.block}]" if it.block != it.name else ""
            lines.append(f"{pad}stage {it.name}{tvm}")
    return "\n".join(lines)
