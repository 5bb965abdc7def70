"""AST -> canonical .tsched text (`tensorlang fmt`).

The output round-trips (`parse(format_module(m)) == m`) and keeps every comment:
a comment on the line a construct ends on stays at the end of that line, any other
comment goes on its own line before the construct that follows it. One blank line is
kept wherever the source had one or more; `op` and `schedule` blocks are always set
apart from their neighbours by one.
"""
from __future__ import annotations

from dataclasses import dataclass

from tensorlang.parser import ast as A

INDENT = "    "

# Binding strength, loosest first (Python's).
_PREC = {"if": 1, "or": 2, "and": 3, "not": 4, "cmp": 5, "+": 6, "-": 6, "*": 7, "/": 7, "//": 7, "%": 7,
         "neg": 8, "**": 9, "atom": 10}


def _prec(e: A.Expr) -> int:
    if isinstance(e, A.IfExp):
        return _PREC["if"]
    if isinstance(e, A.BoolOp):
        return _PREC[e.op]
    if isinstance(e, A.Not):
        return _PREC["not"]
    if isinstance(e, A.Compare):
        return _PREC["cmp"]
    if isinstance(e, A.BinOp):
        return _PREC[e.op]
    if isinstance(e, A.Neg):
        return _PREC["neg"]
    return _PREC["atom"]


def format_expr(e: A.Expr) -> str:
    return _expr(e)


def _wrap(e: A.Expr, min_prec: int) -> str:
    text = _expr(e)
    return f"({text})" if _prec(e) < min_prec else text


def _expr(e: A.Expr) -> str:
    if isinstance(e, A.Num):
        return e.text
    if isinstance(e, A.Var):
        return e.name
    if isinstance(e, A.Access):
        return f"{e.tensor}[{', '.join(_expr(i) for i in e.indices)}]"
    if isinstance(e, A.Call):
        return f"{e.func}({', '.join(_expr(a) for a in e.args)})"
    if isinstance(e, A.Paren):
        return f"({_expr(e.expr)})"
    if isinstance(e, A.BinOp):
        p = _PREC[e.op]
        if e.op == "**":  # right-associative
            return f"{_wrap(e.left, p + 1)} ** {_wrap(e.right, _PREC['neg'])}"
        return f"{_wrap(e.left, p)} {e.op} {_wrap(e.right, p + 1)}"
    if isinstance(e, A.Neg):
        return f"-{_wrap(e.operand, _PREC['neg'])}"
    if isinstance(e, A.Compare):
        parts = [_wrap(e.operands[0], _PREC["cmp"] + 1)]
        for op, operand in zip(e.ops, e.operands[1:]):
            parts += [op, _wrap(operand, _PREC["cmp"] + 1)]
        return " ".join(parts)
    if isinstance(e, A.BoolOp):
        p = _PREC[e.op]
        return f" {e.op} ".join(_wrap(v, p + 1) for v in e.values)
    if isinstance(e, A.Not):
        return f"not {_wrap(e.operand, _PREC['not'])}"
    if isinstance(e, A.IfExp):
        return (f"{_wrap(e.then, _PREC['if'] + 1)} if {_wrap(e.cond, _PREC['if'] + 1)} "
                f"else {_wrap(e.orelse, _PREC['if'])}")
    raise TypeError(f"not an expression: {e!r}")


def _kwargs(params) -> str:
    return ", ".join(f"{p.name} = {p.value.text}" for p in params)


def _tensor_type(t: A.TensorType) -> str:
    return f"{t.dtype}[{', '.join(str(d) for d in t.shape)}]"


def _param(p: A.TensorParam) -> str:
    return f"{p.name}: {_tensor_type(p.type)}"


def format_arg(a: A.Arg) -> str:
    if isinstance(a, A.Ref):
        return a.text
    if isinstance(a, A.Const):
        return a.text
    if isinstance(a, A.ListArg):
        return "[" + ", ".join(format_arg(x) for x in a.items) + "]"
    if isinstance(a, A.KwSchedArg):
        return f"{a.name}={format_arg(a.value)}"
    raise TypeError(f"not an argument: {a!r}")


def format_stmt(s: A.SchedStmt) -> str:
    call = f"{s.prim}({', '.join(format_arg(a) for a in s.args)})"
    if s.targets:
        return ", ".join(t.name for t in s.targets) + " = " + call
    return call


def format_stage(s: A.Stage) -> str:
    return f"{s.tensor}[{', '.join(_expr(i) for i in s.indices)}] {s.op} {_expr(s.rhs)}"


def format_target(t: A.Target) -> str:
    return f"target {t.name} = {t.kind}({_kwargs(t.params)})"


def _decorator(d: A.Decorator) -> str:
    return f"@{d.name}({_kwargs(d.params)})" if d.params else f"@{d.name}"


def format_op_header(op: A.Op) -> str:
    outs = ", ".join(_param(p) for p in op.outputs)
    if op.outputs_parenthesized:
        outs = f"({outs})"
    return f"op {op.name}({', '.join(_param(p) for p in op.inputs)}) -> {outs} {{"


@dataclass
class _Line:
    """One output line: its text, indentation depth and the source lines it came from."""
    text: str
    depth: int
    first: int  # first source line (0 when synthesised)
    last: int  # last source line
    item: int = -1  # index of the top-level item the line belongs to (-1: after the last one)
    braced: bool = False  # the item is an op or a schedule block
    opens: bool = False  # ends with "{"
    closes: bool = False  # is "}"


def _item_lines(item: A.Item) -> list[_Line]:
    if isinstance(item, A.Target):
        return [_Line(format_target(item), 0, item.span.line, item.span.end_line)]
    if isinstance(item, A.Op):
        out = [_Line(_decorator(d), 0, d.span.line, d.span.end_line) for d in item.decorators]
        header_first = item.decorators[-1].span.end_line + 1 if item.decorators else item.span.line
        header_last = max([p.span.end_line for p in item.outputs] + [header_first])
        out.append(_Line(format_op_header(item), 0, header_first, header_last, opens=True))
        for s in item.body:
            text = _param(s) if isinstance(s, A.TensorParam) else format_stage(s)
            out.append(_Line(text, 1, s.span.line, s.span.end_line))
        out.append(_Line("}", 0, item.span.end_line, item.span.end_line, closes=True))
        return out
    if isinstance(item, A.Schedule):
        header_last = item.target_span.end_line or item.span.line
        out = [_Line(f"schedule {item.op} on {item.target} {{", 0, item.span.line, header_last, opens=True)]
        for s in item.stmts:
            out.append(_Line(format_stmt(s), 1, s.span.line, s.span.end_line))
        out.append(_Line("}", 0, item.span.end_line, item.span.end_line, closes=True))
        return out
    raise TypeError(f"not an item: {item!r}")


def format_module(m: A.Module) -> str:
    lines: list[_Line] = []
    for n, item in enumerate(m.items):
        for line in _item_lines(item):
            line.item, line.braced = n, isinstance(item, (A.Op, A.Schedule))
            lines.append(line)

    comments = sorted(m.comments, key=lambda c: (c.span.line, c.span.col))
    has_source = all(l.first > 0 for l in lines)
    out: list[str] = []
    prev: _Line | None = None
    ci = 0

    def emit(line: _Line):
        nonlocal prev
        if prev is not None and _blank_between(prev, line, m.blank_lines, has_source):
            out.append("")
        out.append(INDENT * line.depth + line.text)
        prev = line

    def comment_line(c: A.Comment, like: _Line, depth: int) -> _Line:
        return _Line(c.text, depth, c.span.line, c.span.line, like.item, like.braced)

    for line in lines:
        # Comments before this line, each on a line of its own, at the depth of what follows.
        while ci < len(comments) and comments[ci].span.line < line.first:
            emit(comment_line(comments[ci], line, line.depth + 1 if line.closes else line.depth))
            ci += 1
        # Comments inside a construct printed on one line go before it; one on its last line stays there.
        inline = []
        while ci < len(comments) and comments[ci].span.line <= line.last:
            c = comments[ci]
            if c.span.line < line.last:
                emit(comment_line(c, line, line.depth))
            else:
                inline.append(c)
            ci += 1
        line.text += "".join("  " + c.text for c in inline)
        emit(line)
    for c in comments[ci:]:
        emit(_Line(c.text, 0, c.span.line, c.span.line))
    return "\n".join(out) + "\n" if out else ""


def _blank_between(a: _Line, b: _Line, blank_lines: frozenset[int], has_source: bool) -> bool:
    if a.opens or b.closes:
        return False  # never right inside braces
    if a.item != b.item and (a.braced or b.braced):
        return True  # op and schedule blocks stand apart
    if not has_source:
        return False
    return any(n in blank_lines for n in range(a.last + 1, b.first))
