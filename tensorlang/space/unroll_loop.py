"""What TVM's UnrollLoop pass will unroll in a scheduled function, read off the function before it is built.

A CPU sketch annotates a loop nest with `pragma_auto_unroll_max_step` (the unroll step a schedule decides). At
build time TVM's UnrollLoop pass (src/tir/transforms/unroll_loop.cc) walks the nest bottom up and unrolls a
serial loop when no loop inside it stayed a loop and its extent times the steps of its body -- statements,
counted after unrolling what is inside -- fits the step. VectorizeLoop runs before it (s_tir/pipeline.py): a
vectorised loop is one statement's worth of its body, neither unrolled nor in the way -- unless a condition in
it depends on its lane (a padding `if_then_else`, a block predicate), which VectorizeLoop cannot vectorise: it
scalarises the loop back into a serial one. A loop of one iteration is gone too (StmtSimplify). The step is the
whole nest's, not one stage's: a decoding rule that raises it for one stage's loops must know what else it
unrolls, and a person editing a schedule what it does.

- `unroll_plan(func, step)`: every loop of the TensorIR a schedule leaves (a block is the statements it holds,
  its predicate an `if`), counted as the pass counts, unrolled or not -- with every pragma's step replaced by
  `step` where one is given (a decoder comparing candidate steps);
- `unroll_report(func, names)`, `report_text(report)`: per pragma'd nest, what the build unrolls, the
  statements that makes and why each other loop stays a loop (`tensorlang lower --emit unroll`, the editor's
  hover on the pragma);
- `unrolled_elsewhere(func, step, blocks)`: what a step unrolls outside some stages.
"""
from __future__ import annotations

from dataclasses import dataclass

_MAX_DEPTH = 8  # UnrollLoopConfig's auto_max_depth, which TVM's build leaves at its default


@dataclass(frozen=True)
class PlannedLoop:
    name: str
    extent: int
    blocks: frozenset[str]  # the blocks it encloses
    unrolled: bool
    body_steps: int = 0  # the statements of its body, what is inside it unrolled
    step: int = 0  # the unroll step in force (0: outside any pragma)
    kind: str = "serial"  # as the pass sees it: a vectorised loop that is scalarised is serial
    inner_loop: bool = False  # a loop inside it stays a loop (so it cannot unroll)


class _Unroller:
    """The pass's counters, kept as the C++ keeps them (one visitor's members, reset per statement of a
    sequence): the steps of what was visited, the unrolled and the normal loops nested in it."""

    def __init__(self, step: int | None):
        self.step = step
        self.max_step = 0  # outside any pragma TVM's default: nothing but an `unroll` loop unrolls
        self.steps = self.unroll_depth = self.normal_depth = 0
        self.loops: list[PlannedLoop] = []
        self.nests: list[tuple[int, int, int]] = []  # per pragma: (its step, first loop, end) in self.loops

    def visit(self, stmt) -> frozenset[str]:
        """Visit a statement; the names of the blocks in it."""
        from tvm import s_tir, tirx
        if isinstance(stmt, tirx.For):
            return self._for(stmt)
        if isinstance(stmt, tirx.SeqStmt):
            return self._seq(list(stmt.seq))
        if isinstance(stmt, s_tir.SBlockRealize):
            return self.visit(stmt.block)
        if isinstance(stmt, s_tir.SBlock):  # an init block is lowered to `if first: init` before the body
            inner = self._seq([stmt.init, stmt.body]) if stmt.init is not None else self.visit(stmt.body)
            return inner | {stmt.name_hint}
        if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)):
            self.steps += 1
            return frozenset()
        if isinstance(stmt, tirx.IfThenElse):  # both branches, one after the other, counters running on
            blocks = self.visit(stmt.then_case)
            return blocks | (self.visit(stmt.else_case) if stmt.else_case is not None else frozenset())
        body = getattr(stmt, "body", None)
        return self.visit(body) if isinstance(body, tirx.Stmt) else frozenset()

    def _seq(self, stmts) -> frozenset[str]:
        blocks: frozenset[str] = frozenset()
        for s in stmts:
            steps, unroll, normal = self.steps, self.unroll_depth, self.normal_depth
            self.steps = self.unroll_depth = self.normal_depth = 0
            blocks |= self.visit(s)
            self.steps += steps
            self.normal_depth = max(normal, self.normal_depth)
            self.unroll_depth = max(self.unroll_depth, unroll)
        return blocks

    def _for(self, loop) -> frozenset[str]:
        pragma = loop.annotations.get("pragma_auto_unroll_max_step") if loop.annotations else None
        outer, first = self.max_step, len(self.loops)
        if pragma is not None:  # lowered to an AttrStmt around the loop: the loop itself is in its scope
            self.max_step = self.step if self.step is not None else int(pragma)
        blocks = self._loop(loop)
        if pragma is not None:
            self.nests.append((self.max_step, first, len(self.loops)))
        self.max_step = outer
        return blocks

    def _loop(self, loop) -> frozenset[str]:
        from tensorlang.lower.tir import loop_kind
        blocks = self.visit(loop.body)
        kind = loop_kind(loop)
        extent = int(loop.extent) if hasattr(loop.extent, "value") else -1
        name = loop.loop_var.name
        if kind == "vectorized" and _scalarized(loop):
            kind, name = "serial", name + ".s"  # as VectorizeLoop names it
        if kind == "vectorized" or extent == 1:  # gone by the time UnrollLoop runs
            return blocks
        auto = (kind == "serial" and extent >= 0 and self.normal_depth == 0 and self.unroll_depth <= _MAX_DEPTH
                and extent * self.steps <= self.max_step) or kind == "unrolled"
        planned = PlannedLoop(name, extent, blocks, auto, self.steps, self.max_step, kind, self.normal_depth > 0)
        if auto:
            self.steps *= extent
            self.unroll_depth += 1
        else:
            self.normal_depth += 1
        self.loops.append(planned)
        return blocks


def _subexprs(expr):
    """An expression and every expression in it (the wheel has no Python expression visitor)."""
    from tvm.ir.expr import Expr
    yield expr
    for field in ("a", "b", "value", "condition", "true_value", "false_value", "base", "stride"):
        sub = getattr(expr, field, None)
        if isinstance(sub, Expr):
            yield from _subexprs(sub)
    for many in ("args", "indices"):
        for sub in getattr(expr, many, None) or ():
            if isinstance(sub, Expr):
                yield from _subexprs(sub)


def _scalarized(loop) -> bool:
    """Does VectorizeLoop give up on this vectorised loop: a block in it whose predicate, or an
    `if_then_else` in a value it stores, depends on the loop's lane?"""
    from tvm import s_tir, tirx
    from tensorlang.lower.tir import uses_var, walk
    lane = loop.loop_var
    for node, _ in walk(loop.body):
        if not isinstance(node, s_tir.SBlockRealize):
            continue
        if uses_var(node.predicate, lane):
            return True
        laned = [iv.var for iv, value in zip(node.block.iter_vars, node.iter_values) if uses_var(value, lane)]
        for store, _ in walk(node.block.body):
            if not isinstance(store, tirx.BufferStore):
                continue
            for e in _subexprs(store.value):
                if (str(getattr(getattr(e, "op", None), "name", "")).endswith("if_then_else")
                        and any(uses_var(e.args[0], v) for v in laned + [lane])):
                    return True
    return False


def unroll_plan(func, step: int | None = None) -> tuple[PlannedLoop, ...]:
    """Every loop of a scheduled PrimFunc, innermost of a nest first, and whether TVM's build unrolls it --
    with each `pragma_auto_unroll_max_step` set to `step` where one is given."""
    unroller = _Unroller(step)
    unroller.visit(func.body)
    return tuple(unroller.loops)


def unroll_report(func, names: dict | None = None) -> list[dict]:
    """What the build unrolls under each unroll pragma of a scheduled function, for a reader: per pragma'd
    nest its step, the loops it unrolls, the statements that makes (each outermost unrolled loop's extent times
    its body's), and the loops it leaves, each with why. `names`: TVM loop name -> the name a schedule gave it."""
    unroller = _Unroller(None)
    unroller.visit(func.body)

    def shown(lp: PlannedLoop) -> str:
        base = lp.name.removesuffix(".s")
        return (names or {}).get(base, base) + (" (scalarised)" if lp.name.endswith(".s") else "")

    def why(lp: PlannedLoop) -> str:
        if lp.kind != "serial":
            return lp.kind
        if lp.inner_loop:
            return "a loop inside it stays a loop"
        return f"{lp.extent} x {lp.body_steps} steps > {lp.step}"
    report = []
    for step, first, end in unroller.nests:
        nest = unroller.loops[first:end]  # innermost first: a loop comes after every loop inside it
        outermost = [lp for k, lp in enumerate(nest) if lp.unrolled
                     and not any(o.unrolled and lp.blocks <= o.blocks for o in nest[k + 1:])]
        report.append({"step": step,
                       "unrolled": [(shown(lp), lp.extent) for lp in nest if lp.unrolled],
                       "statements": sum(lp.extent * lp.body_steps for lp in outermost),
                       "left": [(shown(lp), lp.extent, why(lp)) for lp in nest if not lp.unrolled]})
    return report


def report_text(report: list[dict], quote: str = "", most: int = 6) -> str:
    """An unroll report as lines of text, one per pragma'd nest: what the build unrolls, the statements that
    makes, and the loops it leaves with why (`quote`: around a loop's name, "`" for Markdown)."""
    lines = []
    for nest in report:
        unrolled = ", ".join(f"{quote}{loop}{quote} ({extent})" for loop, extent in nest["unrolled"]) or "nothing"
        text = f"at build, step {nest['step']} unrolls {unrolled}: {nest['statements']} statements"
        left = [f"{quote}{loop}{quote} ({extent}: {why})" for loop, extent, why in nest["left"]]
        if left:
            text += "; leaves " + ", ".join(left[:most]) + (f" and {len(left) - most} more" if len(left) > most else "")
        lines.append(text)
    return "\n".join(lines)


def unrolled_elsewhere(func, step: int, blocks: set[str]) -> frozenset[tuple[int, str]]:
    """The loops a step unrolls that enclose none of `blocks` (what it unrolls of the other stages), each by
    its place in the plan and its name."""
    return frozenset((i, p.name) for i, p in enumerate(unroll_plan(func, step)) if p.unrolled and not p.blocks & blocks)
