"""The .tsched abstract syntax tree: plain frozen data classes.

Every node carries a `span` (1-based line/column, end exclusive) that is excluded
from equality, so `parse(print(ast)) == ast` compares structure and spelling only.
Spelling that `fmt` must keep (a number as written, parentheses, the form a buffer
was named in) is part of the tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


from tensorlang.span import NO_SPAN, Span  # noqa: E402,F401  (re-exported)


def _span():
    return field(default=NO_SPAN, compare=False, repr=False, hash=False)


def unquote(text: str) -> str:
    """A string literal's value: backslash escapes \\ \" \n \t; any other backslash stays as written."""
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in '\\"nt':
            out.append({"n": "\n", "t": "\t"}.get(body[i + 1], body[i + 1]))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


# ---------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Num:
    text: str  # as written: "768.0", "0.00001", "1e-5", "3"
    span: Span = _span()

    @property
    def is_float(self) -> bool:
        return any(c in self.text for c in ".eE")

    @property
    def value(self) -> float | int:
        return float(self.text) if self.is_float else int(self.text)


@dataclass(frozen=True)
class Var:
    """An index variable (or, on its own, a reference the checker rejects)."""
    name: str
    span: Span = _span()


@dataclass(frozen=True)
class Access:
    tensor: str
    indices: tuple["Expr", ...]
    span: Span = _span()
    name_span: Span = _span()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple["Expr", ...]
    span: Span = _span()
    name_span: Span = _span()


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / // % **
    left: "Expr"
    right: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Compare:
    """A chain `a < b <= c`: Python semantics, `a < b and b <= c`."""
    operands: tuple["Expr", ...]
    ops: tuple[str, ...]
    span: Span = _span()


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    values: tuple["Expr", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Not:
    operand: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class IfExp:
    then: "Expr"
    cond: "Expr"
    orelse: "Expr"
    span: Span = _span()


@dataclass(frozen=True)
class Paren:
    """Parentheses as written; semantically transparent, kept for `fmt`."""
    expr: "Expr"
    span: Span = _span()


Expr = Union[Num, Var, Access, Call, BinOp, Neg, Compare, BoolOp, Not, IfExp, Paren]


def strip_parens(e: Expr) -> Expr:
    while isinstance(e, Paren):
        e = e.expr
    return e


def children(e: Expr) -> list[Expr]:
    """The sub-expressions of `e` (an access's indices, a call's arguments, ...)."""
    if isinstance(e, BinOp):
        return [e.left, e.right]
    if isinstance(e, (Neg, Not)):
        return [e.operand]
    if isinstance(e, Compare):
        return list(e.operands)
    if isinstance(e, BoolOp):
        return list(e.values)
    if isinstance(e, IfExp):
        return [e.then, e.cond, e.orelse]
    if isinstance(e, Paren):
        return [e.expr]
    if isinstance(e, Access):
        return list(e.indices)
    if isinstance(e, Call):
        return list(e.args)
    return []


def tensors_read(e: Expr) -> set[str]:
    """The tensors `e` reads (in its indices too: an indirect gather reads its index tensor)."""
    own = {e.tensor} if isinstance(e, Access) else set()
    return own.union(*(tensors_read(c) for c in children(e)))


# ------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Literal:
    """A literal value in a target declaration or decorator: int, float, str or a bare name."""
    kind: str  # "int" | "float" | "str" | "name"
    text: str  # as written (strings with their quotes)
    span: Span = _span()

    @property
    def value(self):
        if self.kind == "int":
            return int(self.text)
        if self.kind == "float":
            return float(self.text)
        if self.kind == "str":
            return unquote(self.text)
        return self.text


@dataclass(frozen=True)
class KwArg:
    name: str
    value: Literal
    span: Span = _span()


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # llvm | cuda
    params: tuple[KwArg, ...]
    span: Span = _span()
    name_span: Span = _span()
    kind_span: Span = _span()

    def param(self, key: str, default=None):
        for p in self.params:
            if p.name == key:
                return p.value.value
        return default


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[int, ...]
    span: Span = _span()


@dataclass(frozen=True)
class TensorParam:
    """`A: f32[512, 512]` in an op's signature, or a declaration in its body."""
    name: str
    type: TensorType
    span: Span = _span()
    name_span: Span = _span()


@dataclass(frozen=True)
class Stage:
    """`T[i, j] = expr`, `T[i, j] += expr`, `T[i] max= expr`, `T[i] min= expr`."""
    tensor: str
    indices: tuple[Expr, ...]
    op: str  # "=" | "+=" | "max=" | "min="
    rhs: Expr
    span: Span = _span()
    name_span: Span = _span()
    op_span: Span = _span()


@dataclass(frozen=True)
class Decorator:
    name: str
    params: tuple[KwArg, ...] = ()
    span: Span = _span()


@dataclass(frozen=True)
class Op:
    name: str
    decorators: tuple[Decorator, ...]
    inputs: tuple[TensorParam, ...]
    outputs: tuple[TensorParam, ...]
    outputs_parenthesized: bool
    body: tuple[Union[TensorParam, Stage], ...]
    span: Span = _span()
    name_span: Span = _span()

    @property
    def is_auto(self) -> bool:
        return any(d.name == "auto" for d in self.decorators)

    @property
    def stages(self) -> list[Stage]:
        return [s for s in self.body if isinstance(s, Stage)]

    @property
    def declarations(self) -> list[TensorParam]:
        return [s for s in self.body if isinstance(s, TensorParam)]


# ---------------------------------------------------------------- schedules
@dataclass(frozen=True)
class Ref:
    """A name or a dotted name: `C`, `i0`, `C.i`, `AS.ax0`, `threadIdx.x`, `shared`."""
    parts: tuple[str, ...]
    span: Span = _span()

    @property
    def text(self) -> str:
        return ".".join(self.parts)


@dataclass(frozen=True)
class Const:
    kind: str  # "int" | "float" | "str"
    text: str  # as written (with a leading "-" when negative)
    span: Span = _span()

    @property
    def value(self):
        if self.kind == "int":
            return int(self.text)
        if self.kind == "float":
            return float(self.text)
        return unquote(self.text)


@dataclass(frozen=True)
class ListArg:
    items: tuple["Arg", ...]
    span: Span = _span()


@dataclass(frozen=True)
class KwSchedArg:
    name: str
    value: "Arg"
    span: Span = _span()


Arg = Union[Ref, Const, ListArg, KwSchedArg]


@dataclass(frozen=True)
class Name:
    """A name bound by a schedule statement (`i0` in `i0, i1 = split(...)`)."""
    name: str
    span: Span = _span()


@dataclass(frozen=True)
class SchedStmt:
    targets: tuple[Name, ...]
    prim: str
    args: tuple[Arg, ...]
    span: Span = _span()
    prim_span: Span = _span()


@dataclass(frozen=True)
class Schedule:
    op: str
    target: str
    stmts: tuple[SchedStmt, ...]
    span: Span = _span()
    op_span: Span = _span()
    target_span: Span = _span()


Item = Union[Target, Op, Schedule]


@dataclass(frozen=True)
class Comment:
    text: str  # including the leading '#'
    span: Span = _span()


@dataclass(frozen=True)
class Module:
    """A parsed file. `items` are in source order; `comments` are kept for `fmt`."""
    items: tuple[Item, ...]
    comments: tuple[Comment, ...] = ()
    # Names of ops and targets whose declarations failed to parse: uses of them are not reported again.
    unparsed: frozenset[str] = field(default=frozenset(), compare=False, repr=False, hash=False)
    # 1-based numbers of the source's blank lines: `fmt` keeps one where the source had any.
    blank_lines: frozenset[int] = field(default=frozenset(), compare=False, repr=False, hash=False)

    @property
    def targets(self) -> list[Target]:
        return [i for i in self.items if isinstance(i, Target)]

    @property
    def ops(self) -> list[Op]:
        return [i for i in self.items if isinstance(i, Op)]

    @property
    def schedules(self) -> list[Schedule]:
        return [i for i in self.items if isinstance(i, Schedule)]
