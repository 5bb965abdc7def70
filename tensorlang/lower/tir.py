"""Small walkers over TVM's TensorIR statements (the wheel has no Python stmt visitor)."""
from __future__ import annotations


def children(stmt):
    import tvm
    from tvm import s_tir, tirx
    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block]
    if isinstance(stmt, s_tir.SBlock):
        out = [stmt.body]
        if stmt.init is not None:
            out.insert(0, stmt.init)
        return out
    if isinstance(stmt, tirx.IfThenElse):
        return [s for s in (stmt.then_case, stmt.else_case) if s is not None]
    body = getattr(stmt, "body", None)
    return [body] if isinstance(body, tvm.tirx.Stmt) else []


def walk(stmt, loops=()):
    """Yield (node, enclosing For loops outermost first) in pre-order."""
    from tvm import tirx
    yield stmt, loops
    inner = loops + (stmt,) if isinstance(stmt, tirx.For) else loops
    for c in children(stmt):
        yield from walk(c, inner)


def block_realizes(stmt):
    """(SBlockRealize, enclosing loops) for every block under `stmt`, root excluded."""
    from tvm import s_tir
    for node, loops in walk(stmt):
        if isinstance(node, s_tir.SBlockRealize) and node.block.name_hint != "root":
            yield node, loops


def uses_var(expr, var) -> bool:
    from tvm.tirx.analysis import undefined_vars
    return any(v.same_as(var) for v in undefined_vars(expr, []))


def thread_tag(loop) -> str | None:
    """The thread axis a For loop is bound to, or None."""
    binding = getattr(loop, "thread_binding", None)
    if binding is None:
        return None
    return str(binding.thread_tag)


def loop_kind(loop) -> str:
    """'serial' | 'parallel' | 'vectorized' | 'unrolled' | 'thread_binding'."""
    kind = str(loop.kind)
    for k in ("parallel", "vectorized", "unrolled", "thread_binding", "serial"):
        if k in kind.lower():
            return k
    return {0: "serial", 1: "parallel", 2: "vectorized", 3: "unrolled", 4: "thread_binding"}.get(int(loop.kind),
                                                                                               "serial")


def as_int(x):
    try:
        return int(x)
    except (TypeError, ValueError):
        return None
