"""One version of a document, analysed: its checked model, an index of every name in it, and the
context at a cursor. Pure Python over the core's AST and model: no pygls, no TVM.

Names (symbols), each with its definition and references:
- ('target', name): `target NAME = ...`; referenced by `schedule ... on NAME`;
- ('op', name): `op NAME(...)`; referenced by `schedule NAME on ...`;
- ('tensor', op, name): a tensor of an operator and the stage that writes it (a stage is named after
  its tensor): its declaration (signature or body), `T[...]` reads and writes, and in the operator's
  schedules every stage or buffer argument `T` and the `T` of `T.i`;
- ('index', op, tensor, name): an index of one stage (its loop `T.i` in schedules);
- ('bound', schedule line, name, line): a name a schedule statement binds (`i0` of `i0, i1 = split(..)`),
  referenced by the statements after it until it is bound again.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field

from tensorlang.analysis.primitives import (BOOL, BUFFER, LOOPS, SCOPE, SIGNATURES, STAGE, STAGE_OR_LOOP, THREAD,
                                            Param)
from tensorlang.analysis.dtypes import TVM_DTYPE
from tensorlang.lsp.incremental import Chunk, IncrementalParser
from tensorlang.lsp.text import LineIndex, strip_comment, tokenize, word_before
from tensorlang.parser import ast as A
from tensorlang.parser import parse
from tensorlang.span import Span

KEYWORDS = ("target", "op", "schedule", "on", "if", "else", "and", "or", "not")
CONSTANTS = ("True", "False", "None")


@dataclass(frozen=True)
class Occ:
    """One occurrence of a name in the source."""
    span: Span  # 1-based, end exclusive
    kind: str  # target op tensor stage index loop prim func cast dtype kind param decorator thread scope const
    key: tuple | None = None  # the symbol (see the module docstring); None: no navigation
    is_def: bool = False
    role: str = ""  # 'stage' for a stage reference in a schedule, 'stagedef' for a stage's left-hand side
    sched: int | None = None  # index of the schedule (in doc.ast.schedules) it is in
    stmt: int | None = None  # index of the statement it is in
    bound_by_stmt: bool = False  # a name on the left of a statement


def _name_span(span: Span, name: str) -> Span:
    return Span(span.line, span.col, span.line, span.col + len(name))


def arg_params(stmt: A.SchedStmt) -> list[tuple[object, Param | None]]:
    """Each argument of a statement (keyword values included) with the parameter it fills, as the core's
    `match_args` assigns them (positional in order, a `loops` parameter takes the rest)."""
    sig = SIGNATURES.get(stmt.prim)
    out: list[tuple[object, Param | None]] = []
    params = list(sig.params) if sig else []
    pi = 0
    for arg in stmt.args:
        if isinstance(arg, A.KwSchedArg):
            p = next((q for q in params if q.name == arg.name), None)
            out.append((arg, p))
            continue
        if pi < len(params):
            p = params[pi]
            out.append((arg, p))
            if p.kind != LOOPS:
                pi += 1
        else:
            out.append((arg, None))
    return out


class Analysis:
    """A document version: `doc` (an `api.Document`), its chunks, and lazily its name index."""

    def __init__(self, text: str, path: str, parser: IncrementalParser, encoding: str = "utf-16",
                 version: int | None = None):
        self.text = text
        self.path = path
        self.version = version
        self.index = LineIndex(text, encoding)
        self.parser = parser
        self.doc, self.chunks = parser.load(text, path)
        self._occ: list[Occ] | None = None
        self._by_line: dict[int, list[Occ]] | None = None

    # ---------------------------------------------------------------- lookup
    @property
    def ast(self) -> A.Module:
        return self.doc.ast

    @property
    def model(self):
        return self.doc.model

    def chunk_at(self, line0: int) -> Chunk | None:
        for c in self.chunks:
            if c.start <= line0 < c.end:
                return c
        return self.chunks[-1] if self.chunks else None

    def has_syntax_errors(self) -> bool:
        return any(d.code.startswith("TS0") or d.code == "TS900" for d in self.doc.diagnostics)

    def item_at(self, line1: int):
        for item in self.ast.items:
            if item.span.line <= line1 <= item.span.end_line:
                return item
        return None

    def schedule_index(self, sched: A.Schedule) -> int:
        for n, s in enumerate(self.ast.schedules):
            if s is sched:
                return n
        return -1

    def op_ast(self, name: str) -> A.Op | None:
        return next((o for o in self.ast.ops if o.name == name), None)

    def target_ast(self, name: str) -> A.Target | None:
        return next((t for t in self.ast.targets if t.name == name), None)

    def part_spans(self, ref: A.Ref) -> list[Span]:
        """The span of each part of a dotted name (`C.i` -> `C`, `i`)."""
        line = self.index.line(ref.span.line - 1)
        pos = ref.span.col - 1
        out = []
        for part in ref.parts:
            found = line.find(part, pos)
            if found < 0 or ref.span.line != ref.span.end_line:
                found = pos
            out.append(Span(ref.span.line, found + 1, ref.span.line, found + 1 + len(part)))
            pos = found + len(part)
        return out

    # ------------------------------------------------------------ name index
    @property
    def occurrences(self) -> list[Occ]:
        if self._occ is None:
            self._occ = self._build_occurrences()
            by_line: dict[int, list[Occ]] = {}
            for o in self._occ:
                by_line.setdefault(o.span.line, []).append(o)
            self._by_line = by_line
        return self._occ

    def occurrence_at(self, line1: int, col1: int) -> Occ | None:
        """The occurrence under a 1-based position (its end included, so a cursor right after a name counts)."""
        self.occurrences
        best = None
        for o in self._by_line.get(line1, ()):
            if o.span.col <= col1 <= o.span.end_col:
                if best is None or (o.span.col <= col1 < o.span.end_col and not
                                    (best.span.col <= col1 < best.span.end_col)):
                    best = o
        return best

    def definition_of(self, occ: Occ) -> Occ | None:
        if occ.key is None:
            return None
        defs = [o for o in self.occurrences if o.key == occ.key and o.is_def]
        if occ.key[0] == "tensor":
            stage_defs = [o for o in self.occurrences if o.key == occ.key and o.role == "stagedef"]
            if occ.role == "stage" and stage_defs:
                return stage_defs[0]
            return defs[0] if defs else (stage_defs[0] if stage_defs else None)
        return defs[0] if defs else None

    def references_of(self, occ: Occ, include_declaration: bool = True) -> list[Occ]:
        if occ.key is None:
            return []
        return [o for o in self.occurrences if o.key == occ.key and (include_declaration or not o.is_def)]

    def _build_occurrences(self) -> list[Occ]:
        out: list[Occ] = []
        for item in self.ast.items:
            if isinstance(item, A.Target):
                out.append(Occ(item.name_span, "target", ("target", item.name), True))
                out.append(Occ(item.kind_span, "kind"))
                for kw in item.params:
                    out.append(Occ(_name_span(kw.span, kw.name), "param"))
            elif isinstance(item, A.Op):
                self._op_occurrences(item, out)
        for n, sched in enumerate(self.ast.schedules):
            self._schedule_occurrences(n, sched, out)
        return out

    def _op_occurrences(self, op: A.Op, out: list[Occ]):
        out.append(Occ(op.name_span, "op", ("op", op.name), True))
        for d in op.decorators:
            out.append(Occ(Span(d.span.line, d.span.col, d.span.line, d.span.col + 1 + len(d.name)), "decorator"))
        declared = set()
        for p in list(op.inputs) + list(op.outputs) + op.declarations:
            out.append(Occ(p.name_span, "tensor", ("tensor", op.name, p.name), p.name not in declared))
            declared.add(p.name)
            out.append(Occ(_name_span(p.type.span, p.type.dtype), "dtype"))
        written = set()
        for st in op.stages:
            key = ("tensor", op.name, st.tensor)
            first_write = st.tensor not in declared and st.tensor not in written
            out.append(Occ(st.name_span, "tensor", key, first_write, role="stagedef"))
            written.add(st.tensor)
            lhs = {ix.name for ix in st.indices if isinstance(ix, A.Var)}
            seen: set[str] = set()
            for ix in st.indices:
                self._expr_occurrences(op, st, ix, out, lhs, seen, on_lhs=True)
            self._expr_occurrences(op, st, st.rhs, out, lhs, seen, on_lhs=False)

    def _expr_occurrences(self, op, st, e, out, lhs, seen, on_lhs):
        if isinstance(e, A.Var):
            key = ("index", op.name, st.tensor, e.name)
            is_def = e.name not in seen and (on_lhs or e.name not in lhs)
            seen.add(e.name)
            out.append(Occ(e.span, "index", key, is_def))
            return
        if isinstance(e, A.Access):
            out.append(Occ(e.name_span, "tensor", ("tensor", op.name, e.tensor)))
            for ix in e.indices:
                self._expr_occurrences(op, st, ix, out, lhs, seen, on_lhs)
            return
        if isinstance(e, A.Call):
            out.append(Occ(e.name_span, "cast" if e.func in TVM_DTYPE else "func"))
            for a in e.args:
                self._expr_occurrences(op, st, a, out, lhs, seen, on_lhs)
            return
        for child in A.children(e):
            self._expr_occurrences(op, st, child, out, lhs, seen, on_lhs)

    def _schedule_occurrences(self, n: int, sched: A.Schedule, out: list[Occ]):
        op = self.op_ast(sched.op)
        out.append(Occ(sched.op_span, "op", ("op", sched.op)))
        out.append(Occ(sched.target_span, "target", ("target", sched.target)))
        tensors = set()
        stage_indices: dict[str, set[str]] = {}
        if op is not None:
            tensors = {p.name for p in list(op.inputs) + list(op.outputs) + op.declarations}
            for st in op.stages:
                tensors.add(st.tensor)
                names = set()
                for e in st.indices:
                    if isinstance(e, A.Var):
                        names.add(e.name)
                names |= _vars_in(st.rhs)
                stage_indices[st.tensor] = names
        bound: dict[str, tuple[tuple, str]] = {}  # name -> (key, 'loop'|'stage')
        for m, stmt in enumerate(sched.stmts):
            out.append(Occ(stmt.prim_span, "prim", sched=n, stmt=m))
            for arg, p in arg_params(stmt):
                value = arg.value if isinstance(arg, A.KwSchedArg) else arg
                if isinstance(arg, A.KwSchedArg):
                    out.append(Occ(_name_span(arg.span, arg.name), "param", sched=n, stmt=m))
                kind = p.kind if p else None
                self._arg_occurrences(n, m, sched, value, kind, bound, tensors, stage_indices, out)
            sig = SIGNATURES.get(stmt.prim)
            what = "stage" if sig and sig.returns == "stage" else "loop"
            for name in stmt.targets:
                key = ("bound", sched.span.line, name.name, name.span.line)
                bound[name.name] = (key, what)
                out.append(Occ(name.span, what, key, True, sched=n, stmt=m, bound_by_stmt=True))

    def _arg_occurrences(self, n, m, sched, value, kind, bound, tensors, stage_indices, out):
        if isinstance(value, A.ListArg):
            for item in value.items:
                if isinstance(item, A.Ref):
                    out.append(Occ(item.span, "const", sched=n, stmt=m))
            return
        if not isinstance(value, A.Ref):
            return
        if kind in (THREAD, SCOPE):
            for s in self.part_spans(value):
                out.append(Occ(s, "thread" if kind == THREAD else "scope", sched=n, stmt=m))
            return
        if kind == BOOL or value.text in CONSTANTS:
            out.append(Occ(value.span, "const", sched=n, stmt=m))
            return
        spans = self.part_spans(value)
        first = value.parts[0]
        if len(value.parts) == 1:
            if first in bound:
                key, what = bound[first]
                out.append(Occ(spans[0], what, key, sched=n, stmt=m))
            elif first in tensors and kind in (STAGE, STAGE_OR_LOOP, BUFFER, None):
                role = "" if kind == BUFFER else "stage"
                out.append(Occ(spans[0], "tensor" if kind == BUFFER else "stage", ("tensor", sched.op, first),
                               role=role, sched=n, stmt=m))
            else:
                out.append(Occ(spans[0], "stage" if kind == STAGE else "loop", sched=n, stmt=m))
            return
        # STAGE.loop
        if first in bound and bound[first][1] == "stage":
            out.append(Occ(spans[0], "stage", bound[first][0], sched=n, stmt=m))
        elif first in tensors:
            out.append(Occ(spans[0], "stage", ("tensor", sched.op, first), role="stage", sched=n, stmt=m))
        else:
            out.append(Occ(spans[0], "stage", sched=n, stmt=m))
        second = value.parts[1]
        if second in bound and bound[second][1] == "loop":
            out.append(Occ(spans[1], "loop", bound[second][0], sched=n, stmt=m))
        elif second in stage_indices.get(first, ()):
            out.append(Occ(spans[1], "loop", ("index", sched.op, first, second), sched=n, stmt=m))
        else:
            out.append(Occ(spans[1], "loop", sched=n, stmt=m))
        for s in spans[2:]:
            out.append(Occ(s, "loop", sched=n, stmt=m))

    # -------------------------------------------------------- cursor context
    def context(self, line0: int, col0: int) -> "Context":
        return completion_context(self, line0, col0)


def _vars_in(e) -> set[str]:
    if isinstance(e, A.Var):
        return {e.name}
    out = set()
    for c in A.children(e):
        out |= _vars_in(c)
    return out


# ======================================================================== context
@dataclass
class Context:
    """What can be written at a cursor."""
    where: str  # see completion_context
    line0: int
    col0: int
    start: int  # 0-based code-point column where the word being typed starts
    prefix: str  # the (possibly dotted) word being typed
    chunk: Chunk | None = None
    op: str | None = None
    target: str | None = None
    # target declarations
    target_kind: str | None = None
    given: set = field(default_factory=set)  # parameters already given
    param_name: str | None = None
    # schedules
    prim: str | None = None
    param: Param | None = None
    positional: bool = True  # a positional argument could go here (so could a keyword)
    in_list: bool = False
    arg_started: bool = False  # tokens of the current argument precede the word being typed
    after_eq: bool = False
    names_bound: int = 0
    stmts_above: tuple | None = None  # statements before the current one (parsed), None if unknown
    upto_line: int | None = None  # 1-based: apply the schedule up to this line for the names here
    stmts_below: bool = False  # statements follow the cursor in the block
    stmt_text: str = ""  # the current statement's text before the cursor
    indent: str = "    "
    sched_line: int | None = None  # 1-based line of the schedule header


_REPAIRED: OrderedDict[str, A.Module | None] = OrderedDict()


def parse_repaired(text: str) -> A.Module | None:
    """A (repaired) piece of a document parsed by the core, or None if it has syntax errors."""
    if text in _REPAIRED:
        _REPAIRED.move_to_end(text)
        return _REPAIRED[text]
    module, diags = parse(text)
    value = None if diags else module
    _REPAIRED[text] = value
    if len(_REPAIRED) > 256:
        _REPAIRED.popitem(last=False)
    return value


def _parse_statements(text: str) -> tuple | None:
    """The statements of a (repaired) schedule text, or None if it does not parse."""
    module = parse_repaired(text)
    return tuple(module.schedules[0].stmts) if module is not None and len(module.schedules) == 1 else None


def op_for_completion(an: "Analysis", ctx: "Context") -> A.Op | None:
    """The operator around the cursor: parsed, or -- while a line of it is being typed -- its lines above
    the cursor, closed, or at least its signature."""
    op = an.op_ast(ctx.op or "")
    if op is not None and op.span.line - 1 <= ctx.line0 <= op.span.end_line - 1:
        return op
    chunk = ctx.chunk
    if chunk is None:
        return op
    lines = chunk.text.split("\n")
    rel = ctx.line0 - chunk.start
    tries = ["\n".join(lines[:rel])]
    header = next((n for n, l in enumerate(lines) if "{" in strip_comment(l)), None)
    if header is not None and header < rel:
        tries.append("\n".join(lines[:header + 1]))
    for head in tries:
        module = parse_repaired("\n" * chunk.start + head + "\n}\n")
        if module is not None and module.ops:
            return module.ops[0]
    return op


def completion_context(an: Analysis, line0: int, col0: int) -> Context:
    """Where the cursor is, read from the raw text (it is usually being typed, so it may not parse).

    `where` is one of: none, comment, top, decorator, target_kind, target_param, target_string, op_header,
    dtype, op_body, sched_op, sched_on, sched_target, sched_head, sched_arg.
    """
    line_text = an.index.line(line0)
    col0 = max(0, min(col0, len(line_text)))
    start, prefix = word_before(line_text, col0)
    ctx = Context("none", line0, col0, start, prefix)
    head = line_text[:col0]
    code = strip_comment(head)
    if len(code) < len(head):
        ctx.where = "comment"
        return ctx
    chunk = an.chunk_at(line0)
    ctx.chunk = chunk
    if chunk is None:
        ctx.where = "top"
        return ctx
    rel = line0 - chunk.start
    lines = chunk.text.split("\n")
    before = "\n".join(lines[:rel] + [line_text[:start]])
    toks = [t for t in tokenize(before, chunk.start) if t.kind != "comment"]
    if toks and toks[-1].kind == "string" and toks[-1].line == line0 and (
            len(toks[-1].text) == 1 or not toks[-1].text.endswith('"')):
        return _string_context(ctx, toks)
    if toks and toks[-1].text == "@" and toks[-1].line == line0:
        ctx.where = "decorator"
        return ctx
    braces = parens = 0
    closed_at = -1
    for i, t in enumerate(toks):
        if t.text == "{":
            braces += 1
        elif t.text == "}":
            braces = max(0, braces - 1)
            if braces == 0:
                closed_at = i
        elif t.text in "([":
            parens += 1
        elif t.text in ")]":
            parens = max(0, parens - 1)
    kind = chunk.kind
    if not toks or (braces == 0 and closed_at == len(toks) - 1) or (
            kind == "target" and braces == 0 and parens == 0 and toks[-1].text == ")"):
        ctx.where = "top"
        return ctx
    if kind == "target":
        return _target_context(ctx, toks)
    if kind == "op":
        m = re.search(r"\bop\s+([A-Za-z_]\w*)", chunk.text)
        ctx.op = m.group(1) if m else None
        if toks[-1].text == ":":
            ctx.where = "dtype"
        elif braces == 0:
            ctx.where = "op_header"
        else:
            ctx.where = "op_body"
        return ctx
    if kind == "schedule":
        return _schedule_context(an, ctx, toks, braces, chunk)
    return ctx


def _string_context(ctx: Context, toks) -> Context:
    # `mcpu = "sapph` in a target declaration
    if len(toks) >= 3 and toks[-2].text == "=" and toks[-3].kind == "name":
        ctx.where = "target_string"
        ctx.param_name = toks[-3].text
        ctx.start = toks[-1].col + 1
        ctx.prefix = toks[-1].text[1:]
    return ctx


def _target_context(ctx: Context, toks) -> Context:
    texts = [t.text for t in toks]
    if "(" not in texts:
        if "=" in texts and texts[-1] == "=":
            ctx.where = "target_kind"
        return ctx
    lpar = texts.index("(")
    ctx.target_kind = texts[lpar - 1] if lpar > 0 else None
    args = toks[lpar + 1:]
    cur: list = []
    for t in args:
        if t.text == ",":
            if cur and cur[0].kind == "name":
                ctx.given.add(cur[0].text)
            cur = []
        else:
            cur.append(t)
    if not cur:
        ctx.where = "target_param"
    return ctx


def _schedule_context(an: Analysis, ctx: Context, toks, braces: int, chunk: Chunk) -> Context:
    texts = [t.text for t in toks]
    header = re.match(r"\s*schedule\s+([A-Za-z_]\w*)?\s*(on)?\s*([A-Za-z_]\w*)?", strip_comment(chunk.text.split("\n")[0]))
    if header:
        ctx.op, ctx.target = header.group(1), header.group(3)
    ctx.sched_line = chunk.start + 1
    if braces == 0:
        if "{" in texts:
            return ctx
        if texts == ["schedule"]:
            ctx.where = "sched_op"
        elif len(texts) == 2 and toks[1].kind == "name":
            ctx.where = "sched_on"
        elif len(texts) == 3 and texts[2] == "on":
            ctx.where = "sched_target"
        return ctx
    body_start = texts.index("{") + 1
    body = toks[body_start:]
    # statements end at the ')' that closes their call
    depth = 0
    boundary = 0
    for i, t in enumerate(body):
        if t.text in "([":
            depth += 1
        elif t.text in ")]":
            depth = max(0, depth - 1)
            if depth == 0 and t.text == ")":
                boundary = i + 1
    cur = body[boundary:]
    # the complete statements above: the text up to the boundary, closed, parsed by the core
    if boundary > 0:
        last = body[boundary - 1]
        upto_offset = an.index.offset(last.line, last.end_col)
    else:
        brace = toks[body_start - 1]
        upto_offset = an.index.offset(brace.line, brace.end_col)
    chunk_offset = an.index.offset(chunk.start, 0)
    repaired = "\n" * chunk.start + an.text[chunk_offset:upto_offset] + "\n}"
    ctx.stmts_above = _parse_statements(repaired)
    if ctx.stmts_above is not None:
        # apply_schedule(..., upto_line=cursor line - 1); the cursor line too if a statement above ends on it
        on_cursor_line = any(s.span.line == ctx.line0 + 1 for s in ctx.stmts_above)
        ctx.upto_line = ctx.line0 + 1 if on_cursor_line else ctx.line0
    # the current statement's text before the cursor, and whether statements follow it in the block
    cur_start = (cur[0].line, cur[0].col) if cur else (ctx.line0, ctx.start)
    ctx.stmt_text = an.text[an.index.offset(*cur_start):an.index.offset(ctx.line0, ctx.col0)]
    ctx.indent = _indent_of(an, chunk, ctx.line0)
    tail = strip_comment(an.index.line(ctx.line0)[ctx.col0:]).strip()
    below = bool(tail) and not tail.startswith("}")
    if not below and not tail.startswith("}"):
        for line in chunk.text.split("\n")[ctx.line0 - chunk.start + 1:]:
            code = strip_comment(line).strip()
            if code:
                below = not code.startswith("}")
                break
    ctx.stmts_below = below
    ctext = [t.text for t in cur]
    if "(" not in ctext:
        ctx.where = "sched_head"
        if "=" in ctext:
            ctx.after_eq = True
            ctx.names_bound = sum(1 for t in cur[:ctext.index("=")] if t.kind == "name")
        return ctx
    lp = ctext.index("(")
    ctx.prim = ctext[lp - 1] if lp > 0 else None
    args = cur[lp + 1:]
    pieces: list[list] = [[]]
    depth = 0
    for t in args:
        if t.text in "([":
            depth += 1
        elif t.text in ")]":
            depth -= 1
        if t.text == "," and depth == 0:
            pieces.append([])
        else:
            pieces[-1].append(t)
    current = pieces[-1]
    ctx.arg_started = bool(current)
    ctx.in_list = sum(1 for t in current if t.text == "[") > sum(1 for t in current if t.text == "]")
    sig = SIGNATURES.get(ctx.prim or "")
    ctx.where = "sched_arg"
    if sig is None:
        return ctx
    positional = 0
    for piece in pieces[:-1]:
        if len(piece) >= 2 and piece[0].kind == "name" and piece[1].text == "=":
            ctx.given.add(piece[0].text)
        elif piece:
            positional += 1
    params = list(sig.params)
    loops_at = next((i for i, p in enumerate(params) if p.kind == LOOPS), None)
    for p in params[:positional]:
        ctx.given.add(p.name)
    if len(current) >= 2 and current[0].kind == "name" and current[1].text == "=":
        ctx.param = next((p for p in params if p.name == current[0].text), None)
        ctx.positional = False
    else:
        if loops_at is not None and positional >= loops_at:
            ctx.param = params[loops_at]
        elif positional < len(params):
            ctx.param = params[positional]
        ctx.positional = not ctx.given or ctx.param is not None
    return ctx


def _indent_of(an: Analysis, chunk: Chunk, line0: int) -> str:
    for n in range(line0, chunk.start, -1):
        text = an.index.line(n)
        if text.strip() and not text.strip().startswith("}") and n > chunk.start:
            return text[:len(text) - len(text.lstrip())] or "    "
    return "    "
