"""Text -> AST with source spans, using the Lark grammar in `tensorlang/grammar.lark`.

Error recovery: the file is cut into top-level chunks (a `target`, an `op` with its
decorators, a `schedule`) and each chunk is parsed on its own, so a syntax error in
one operator never hides the errors of the next. A chunk starts at a line whose first
word is a top-level keyword, either at brace depth 0 or in column 1 (the latter lets
a missing `}` be recovered from at the next unindented declaration).
"""
from __future__ import annotations

import re
import sys
import threading
from functools import lru_cache
from pathlib import Path

import lark
from lark import Lark, Token, Transformer, v_args

from tensorlang.diagnostics import Diagnostic, error
from tensorlang.parser import ast as A

# Nested expressions are transformed recursively: allow a few thousand levels (a 500-term sum is fine).
sys.setrecursionlimit(max(sys.getrecursionlimit(), 8000))

GRAMMAR_PATH = Path(__file__).resolve().parent.parent / "grammar.lark"

# Human names for the grammar's terminals, for "expected ..." messages.
_TERMINAL_NAMES = {
    "NAME": "a name", "INT": "a number", "FLOAT": "a number", "STRING": "a string",
    "STAGE_OP": "'=', '+=', 'max=' or 'min='", "COMP_OP": "a comparison", "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/', '//' or '%'", "POW_OP": "'**'",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "DOT": "'.'", "AT": "'@'", "MINUS": "'-'",
    "__ANON_0": "'->'", "$END": "end of input",
}


# Lark calls this for every COMMENT token, ignored or not; `_parse_chunk` collects them.
_COMMENTS: list[Token] = []
_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(
        GRAMMAR_PATH.read_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        cache=True,
        lexer_callbacks={"COMMENT": _COMMENTS.append},
    )


def _describe_expected(expected) -> str:
    names = []
    for t in sorted(expected):
        if t in _TERMINAL_NAMES:
            names.append(_TERMINAL_NAMES[t])
        else:
            try:
                pattern = _parser().get_terminal(t).pattern
                names.append(f"'{pattern.value}'" if pattern.type == "str" else t.lower())
            except KeyError:
                names.append(t.lower())
    names = sorted(set(names))
    return names[0] if len(names) == 1 else "one of " + ", ".join(names)


def _token_text(tok: Token) -> str:
    if tok.type == "$END":
        return "end of input"
    return repr(str(tok))


def _span_of_token(tok: Token) -> A.Span:
    return A.Span(tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + len(tok))


def _span(meta) -> A.Span:
    if getattr(meta, "empty", True):
        return A.NO_SPAN
    return A.Span(meta.line, meta.column, meta.end_line, meta.end_column)


@v_args(meta=True)
class _ToAst(Transformer):
    """Lark tree -> tensorlang.parser.ast nodes."""

    # ---- targets
    def target_decl(self, meta, c):
        name, kind, *kwargs = c
        return A.Target(str(name), str(kind), tuple(k for k in kwargs if k is not None), _span(meta),
                        _span_of_token(name), _span_of_token(kind))

    def kwarg(self, meta, c):
        # `?literal` inlines a single token: wrap it into a Literal node.
        value = c[1] if isinstance(c[1], A.Literal) else _literal_from_token(c[1])
        return A.KwArg(str(c[0]), value, _span(meta))

    def neg_literal(self, meta, c):
        t = c[0]
        return A.Literal("int" if t.type == "INT" else "float", "-" + str(t), _span(meta))

    # tokens standing as literals
    def INT(self, t):
        return t

    def __default_token__(self, t):
        return t

    # ---- operators
    def decorator(self, meta, c):
        name, *kwargs = c
        return A.Decorator(str(name), tuple(k for k in kwargs if k is not None), _span(meta))

    def param(self, meta, c):
        return A.TensorParam(str(c[0]), c[1], _span(meta), _span_of_token(c[0]))

    def tensor_decl(self, meta, c):
        return A.TensorParam(str(c[0]), c[1], _span(meta), _span_of_token(c[0]))

    def tensor_type(self, meta, c):
        dtype, *dims = c
        return A.TensorType(str(dtype), tuple(int(d) for d in dims if d is not None), _span(meta))

    def outputs(self, meta, c):
        return ("outputs", tuple(p for p in c if p is not None), meta)

    def op_decl(self, meta, c):
        decorators = []
        i = 0
        while isinstance(c[i], A.Decorator):
            decorators.append(c[i])
            i += 1
        name = c[i]
        i += 1
        inputs = []
        while not (isinstance(c[i], tuple) and c[i] and c[i][0] == "outputs"):
            if c[i] is not None:
                inputs.append(c[i])
            i += 1
        _, outputs, out_meta = c[i]
        body = tuple(x for x in c[i + 1:] if x is not None)
        # Parenthesised outputs: the outputs node spans more than its single param.
        parenthesized = len(outputs) > 1 or _span(out_meta) != outputs[0].span
        return A.Op(str(name), tuple(decorators), tuple(inputs), outputs, parenthesized, body,
                    _span(meta), _span_of_token(name))

    def stage(self, meta, c):
        name, *rest = c
        op_tok, rhs = rest[-2], rest[-1]
        indices = tuple(x for x in rest[:-2] if x is not None)
        return A.Stage(str(name), indices, str(op_tok), rhs, _span(meta), _span_of_token(name),
                       _span_of_token(op_tok))

    # ---- expressions
    def number(self, meta, c):
        return A.Num(str(c[0]), _span(meta))

    def var(self, meta, c):
        return A.Var(str(c[0]), _span(meta))

    def access(self, meta, c):
        name, *idx = c
        return A.Access(str(name), tuple(x for x in idx if x is not None), _span(meta), _span_of_token(name))

    def call(self, meta, c):
        name, *args = c
        return A.Call(str(name), tuple(x for x in args if x is not None), _span(meta), _span_of_token(name))

    def paren(self, meta, c):
        return A.Paren(c[0], _span(meta))

    def neg(self, meta, c):
        return A.Neg(c[0], _span(meta))

    def binop(self, meta, c):
        return A.BinOp(str(c[1]), c[0], c[2], _span(meta))

    def compare(self, meta, c):
        return A.Compare(tuple(c[0::2]), tuple(str(t) for t in c[1::2]), _span(meta))

    def or_expr(self, meta, c):
        return A.BoolOp("or", tuple(c), _span(meta))

    def and_expr(self, meta, c):
        return A.BoolOp("and", tuple(c), _span(meta))

    def not_expr(self, meta, c):
        return A.Not(c[0], _span(meta))

    def if_expr(self, meta, c):
        return A.IfExp(c[0], c[1], c[2], _span(meta))

    # ---- schedules
    def schedule_decl(self, meta, c):
        op, target, *stmts = c
        return A.Schedule(str(op), str(target), tuple(s for s in stmts if s is not None), _span(meta),
                          _span_of_token(op), _span_of_token(target))

    def sched_stmt(self, meta, c):
        targets, prim, *args = c
        return A.SchedStmt(targets or (), str(prim), tuple(a for a in args if a is not None), _span(meta),
                           _span_of_token(prim))

    def bound_names(self, meta, c):
        return tuple(A.Name(str(t), _span_of_token(t)) for t in c)

    def kw_arg(self, meta, c):
        return A.KwSchedArg(str(c[0]), c[1], _span(meta))

    def ref(self, meta, c):
        return A.Ref(tuple(str(t) for t in c), _span(meta))

    def int_value(self, meta, c):
        return A.Const("int", str(c[0]), _span(meta))

    def float_value(self, meta, c):
        return A.Const("float", str(c[0]), _span(meta))

    def str_value(self, meta, c):
        return A.Const("str", str(c[0]), _span(meta))

    def neg_int_value(self, meta, c):
        return A.Const("int", "-" + str(c[0]), _span(meta))

    def neg_float_value(self, meta, c):
        return A.Const("float", "-" + str(c[0]), _span(meta))

    def list_value(self, meta, c):
        return A.ListArg(tuple(x for x in c if x is not None), _span(meta))

    def start(self, meta, c):
        return list(c)


def _literal_from_token(t) -> A.Literal:
    kind = {"INT": "int", "FLOAT": "float", "STRING": "str", "NAME": "name"}[t.type]
    return A.Literal(kind, str(t), _span_of_token(t))


_DECL_NAME = re.compile(r"^\s*(?:op|target)\s+([A-Za-z_]\w*)", re.M)
_TOP_KEYWORD = re.compile(r"^(\s*)(target|op|schedule|@)\b|^(\s*)@")


def chunks(text: str) -> list[tuple[int, int]]:
    """Line ranges [start, end) of the top-level declarations (0-based line numbers)."""
    lines = text.split("\n")
    starts = []
    depth = 0
    pending_decorator = False
    for n, line in enumerate(lines):
        code = _strip_comment(line)
        m = _TOP_KEYWORD.match(code)
        if m and (depth == 0 or not code[:1].isspace()):
            is_decorator = code.lstrip().startswith("@")
            if not pending_decorator:
                starts.append(n)
            pending_decorator = is_decorator
            depth = 0
        elif code.strip():
            pending_decorator = False
        depth += code.count("{") - code.count("}")
        depth = max(depth, 0)
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    bounds = starts + [len(lines)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def _strip_comment(line: str) -> str:
    in_str = False
    for i, ch in enumerate(line):
        if ch == '"':
            in_str = not in_str
        elif ch == "#" and not in_str:
            return line[:i]
    return line


def _end_span(chunk: str) -> A.Span:
    """Just after the last character of a chunk: where an unexpected end of input is reported."""
    body = chunk.rstrip()
    line = body.count("\n") + 1
    col = len(body) - (body.rfind("\n") + 1) + 1
    return A.Span(line, col, line, col)


def _syntax_diagnostic(exc: lark.exceptions.LarkError, chunk: str) -> Diagnostic:
    if isinstance(exc, lark.exceptions.UnexpectedToken):
        tok = exc.token
        expected = _describe_expected(exc.accepts or exc.expected)
        if tok.type == "$END":
            if "RBRACE" in (exc.accepts or exc.expected):
                expected = "'}' to close the block"
            return error("TS003", f"unexpected end of input; expected {expected}", _end_span(chunk))
        return error("TS001", f"unexpected {_token_text(tok)}; expected {expected}", _span_of_token(tok))
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        allowed = _describe_expected(exc.allowed) if exc.allowed else "a token"
        return error("TS002", f"unexpected character {exc.char!r}; expected {allowed}",
                     A.Span(exc.line, exc.column, exc.line, exc.column + 1))
    if isinstance(exc, lark.exceptions.UnexpectedEOF):
        return error("TS003", f"unexpected end of input; expected {_describe_expected(exc.expected)}",
                     _end_span(chunk))
    return error("TS001", f"syntax error: {exc}")


def parse(text: str) -> tuple[A.Module, list[Diagnostic]]:
    """Parse a whole file. Never raises on bad input: problems come back as diagnostics."""
    parser = _parser()
    lines = text.split("\n")
    items: list[A.Item] = []
    diags: list[Diagnostic] = []
    comments: list[A.Comment] = []
    unparsed: set[str] = set()
    for start, end in chunks(text):
        chunk = "\n" * start + "\n".join(lines[start:end])
        chunk_comments: list[Token] = []
        try:
            tree = _parse_chunk(parser, chunk, chunk_comments)
        except RecursionError:
            diags.append(error("TS001", "expression nested too deeply", A.Span(start + 1, 1, start + 1, 1)))
            unparsed.update(m.group(1) for m in [_DECL_NAME.search("\n".join(lines[start:end]))] if m)
            continue
        except lark.exceptions.UnexpectedInput as exc:
            diags.append(_syntax_diagnostic(exc, chunk))
            comments.extend(_comments_by_scan(lines, start, end))
            m = _DECL_NAME.search("\n".join(lines[start:end]))
            if m:
                unparsed.add(m.group(1))
            continue
        items.extend(tree)
        comments.extend(A.Comment(str(t).rstrip(), _span_of_token(t)) for t in chunk_comments)
    blank_lines = frozenset(n + 1 for n, line in enumerate(lines) if not line.strip())
    return A.Module(tuple(items), tuple(comments), frozenset(unparsed), blank_lines), diags


def _parse_chunk(parser: Lark, chunk: str, out_comments: list) -> list:
    with _LOCK:
        _COMMENTS.clear()
        try:
            tree = parser.parse(chunk)
        finally:
            out_comments.extend(_COMMENTS)
    return _ToAst().transform(tree)


def _comments_by_scan(lines, start, end) -> list[A.Comment]:
    """Comments of a chunk that failed to parse, found by a plain scan (best effort)."""
    out = []
    for n in range(start, end):
        code = _strip_comment(lines[n])
        if len(code) < len(lines[n]):
            col = len(code) + 1
            out.append(A.Comment(lines[n][len(code):].rstrip(), A.Span(n + 1, col, n + 1, len(lines[n].rstrip()) + 1)))
    return out


def parse_file(path: str | Path) -> tuple[A.Module, list[Diagnostic]]:
    return parse(Path(path).read_text())
