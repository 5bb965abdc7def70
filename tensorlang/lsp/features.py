"""LSP answers built from an `Analysis` (and, where given, what the worker computed): lsprotocol types.

Pure functions, testable in-process; the server adds the worker's data (loop names after the
statements above, generated schedules, measurements) and sends the results.
"""
from __future__ import annotations

import difflib
import re
import time

from lsprotocol import types as T

from tensorlang import diagnostics as Dg
from tensorlang.analysis.dtypes import TVM_DTYPE
from tensorlang.analysis.model import FUNCTIONS
from tensorlang.analysis.primitives import (BOOL, BUFFER, LOOP, LOOPS, SCOPE, SCOPES, SIGNATURES, STAGE, STAGE_OR_LOOP,
                                            STR, THREAD, THREAD_AXES, VALUE)
from tensorlang.analysis.targets import KNOWN_CPUS, GPU_DEFAULTS, PARAMS, gpu_limits
from tensorlang.lsp.analysis import CONSTANTS, KEYWORDS, Analysis, Context, Occ, arg_params, op_for_completion
from tensorlang.lsp.text import tokenize
from tensorlang.parser import ast as A
from tensorlang.parser import format_module, parse
from tensorlang.span import Span

SOURCE = "tensorlang"


# ------------------------------------------------------------------ ranges
def to_range(an: Analysis, span: Span) -> T.Range:
    (l0, c0), (l1, c1) = an.index.span_to_range(span)
    return T.Range(T.Position(l0, c0), T.Position(l1, c1))


def pos(an: Analysis, line0: int, col0: int) -> T.Position:
    return T.Position(line0, an.index.to_units(line0, col0))


def from_position(an: Analysis, p: T.Position) -> tuple[int, int]:
    """LSP position -> 0-based (line, code-point column)."""
    return p.line, an.index.from_units(p.line, p.character)


# ------------------------------------------------------------- diagnostics
_SEVERITY = {"error": T.DiagnosticSeverity.Error, "warning": T.DiagnosticSeverity.Warning,
             "hint": T.DiagnosticSeverity.Hint}


def lsp_diagnostic(an: Analysis, d: Dg.Diagnostic) -> T.Diagnostic:
    return T.Diagnostic(
        range=to_range(an, d.span), message=d.message, severity=_SEVERITY.get(d.severity, T.DiagnosticSeverity.Error),
        code=d.code, source=SOURCE, data={"suggestions": list(d.suggestions)} if d.suggestions else None,
        tags=[T.DiagnosticTag.Unnecessary] if d.code in ("TS212", "TS216") else None)


def lsp_diagnostics(an: Analysis, diags) -> list[T.Diagnostic]:
    """The document's diagnostics (plus `diags`, e.g. legality), sorted and deduplicated like `api.check`."""
    return [lsp_diagnostic(an, d) for d in Dg.sort_diagnostics(list(diags))]


# -------------------------------------------------------------- completion
def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _edit_item(an: Analysis, ctx: Context, label: str, kind, insert: str | None = None, detail: str | None = None,
               doc: str | None = None, snippet: bool = False, sort: str | None = None) -> T.CompletionItem:
    rng = T.Range(pos(an, ctx.line0, min(ctx.start, ctx.col0)), pos(an, ctx.line0, ctx.col0))
    return T.CompletionItem(
        label=label, kind=kind, detail=detail,
        documentation=T.MarkupContent(T.MarkupKind.Markdown, doc) if doc else None,
        text_edit=T.TextEdit(rng, insert if insert is not None else label), filter_text=label,
        insert_text_format=T.InsertTextFormat.Snippet if snippet else T.InsertTextFormat.PlainText,
        sort_text=sort)


def _escape_snippet(text: str) -> str:
    return text.replace("\\", "\\\\").replace("$", "\\$").replace("}", "\\}")


def primitive_items(an: Analysis, ctx: Context, snippets: bool = True) -> list[T.CompletionItem]:
    out = []
    for n, sig in enumerate(SIGNATURES.values()):
        if ctx.after_eq:
            if sig.returns is None or (ctx.names_bound > 1 and sig.returns != "loops"):
                continue
        detail = sig.label() + (f" -> {sig.returns}" if sig.returns else "")
        out.append(_edit_item(an, ctx, sig.name, T.CompletionItemKind.Function,
                              sig.snippet() if snippets else sig.name, detail, sig.doc, snippet=snippets,
                              sort=f"1{n:03d}"))
    return out


def static_schedule_names(an: Analysis, ctx: Context) -> tuple[list[str], list[str]]:
    """Loop and stage names without TVM: bound names above and STAGE.index of loops not yet split or fused."""
    op = an.model.ops.get(ctx.op or "")
    consumed, loops, stages = set(), [], []
    for s in ctx.stmts_above or ():
        sig = SIGNATURES.get(s.prim)
        for arg, p in arg_params(s):
            v = arg.value if isinstance(arg, A.KwSchedArg) else arg
            if p is not None and s.prim in ("split", "fuse") and p.kind in (LOOP, LOOPS) and isinstance(v, A.Ref):
                consumed.add(v.text)
        if sig is not None and sig.returns in ("loop", "loops"):
            loops += [t.name for t in s.targets if t.name not in loops]
        if sig is not None and sig.returns == "stage":
            stages += [t.name for t in s.targets if t.name not in stages]
    loops = [n for n in loops if n not in consumed]
    if op is not None:
        for st in op.stages:
            if st.tensor not in stages:
                stages.append(st.tensor)
            loops += [f"{st.tensor}.{i.name}" for i in st.loops if f"{st.tensor}.{i.name}" not in consumed]
    return loops, stages


def _loop_detail(rec: dict) -> str:
    extent = rec.get("extent")
    parts = [f"loop, extent {extent if extent is not None else '?'}"]
    if rec.get("binding"):
        parts.append(f"bound to {rec['binding']}")
    elif rec.get("kind") not in (None, "serial", "thread_binding"):
        parts.append(rec["kind"])
    return ", ".join(parts)


def completion_items(an: Analysis, ctx: Context, state: dict | None = None,
                     snippets: bool = True) -> tuple[list[T.CompletionItem], bool]:
    """(items, complete) for a context; `state` is the worker's `schedule_state` for a schedule argument.
    `complete` is False where names could only be guessed without TVM."""
    K = T.CompletionItemKind
    w = ctx.where
    items: list[T.CompletionItem] = []
    complete = True
    model = an.model
    if w == "top":
        ops = [o.name for o in an.ast.ops] or ["op"]
        targets = sorted(model.targets)
        choice = lambda xs: "${1|" + ",".join(xs) + "|}" if snippets and xs else "${1:name}"  # noqa: E731
        templates = [
            ("target", "target ${1:name} = ${2|llvm,cuda|}($0)", "target NAME = llvm(...) | cuda(...)"),
            ("op", "op ${1:name}(${2:A}: ${3:f32}[${4:N}]) -> ${5:B}: ${6:f32}[${7:N}] {\n    $0\n}",
             "op NAME(INPUTS) -> OUTPUTS { STAGES }"),
            ("schedule", "schedule " + choice(ops) + " on " + ("${2|" + ",".join(targets) + "|}" if snippets else "")
             + " {\n    $0\n}", "schedule OP on TARGET { STATEMENTS }"),
        ]
        for label, snip, detail in templates:
            items.append(_edit_item(an, ctx, label, K.Keyword, snip if snippets else label, detail, snippet=snippets,
                                    sort="0" + label))
        items.append(_edit_item(an, ctx, "@auto", K.Keyword, "@auto", "decorator: generate the schedule",
                                sort="0@auto"))
    elif w == "decorator":
        items.append(_edit_item(an, ctx, "auto", K.Keyword, detail="generate this operator's schedule"))
    elif w == "target_kind":
        items += [_edit_item(an, ctx, k, K.Class, detail="CPU (LLVM)" if k == "llvm" else "NVIDIA GPU (CUDA)")
                  for k in sorted(PARAMS)]
    elif w == "target_param":
        for name, (typ, desc) in PARAMS.get(ctx.target_kind or "", {}).items():
            if name in ctx.given:
                continue
            insert = (f'{name} = "$1"' if typ is str else f"{name} = $1") if snippets else f"{name} = "
            items.append(_edit_item(an, ctx, name, K.Property, insert, f"{typ.__name__}: {desc}", snippet=snippets))
    elif w == "target_string":
        values = sorted(KNOWN_CPUS) if ctx.param_name == "mcpu" else sorted(GPU_DEFAULTS) \
            if ctx.param_name == "arch" else []
        items += [_edit_item(an, ctx, v, K.Value) for v in values]
    elif w == "dtype":
        items += [_edit_item(an, ctx, d, K.TypeParameter, detail=TVM_DTYPE[d]) for d in TVM_DTYPE]
    elif w == "op_body":
        items += _op_body_items(an, ctx, snippets)
    elif w == "sched_op":
        items += [_edit_item(an, ctx, o.name, K.Function, detail="@auto op" if o.is_auto else "op")
                  for o in an.ast.ops]
    elif w == "sched_on":
        items.append(_edit_item(an, ctx, "on", K.Keyword))
    elif w == "sched_target":
        items += target_items(an, ctx)
    elif w == "sched_head":
        items += primitive_items(an, ctx, snippets)
    elif w == "sched_arg":
        more, complete = _argument_items(an, ctx, state)
        items += more
    return items, complete


def target_items(an: Analysis, ctx: Context) -> list[T.CompletionItem]:
    out = []
    for name, t in sorted(an.model.targets.items(), key=lambda kv: (kv[1].builtin, kv[0])):
        what = "built-in " if t.builtin else ""
        params = ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in t.params.items())
        out.append(_edit_item(an, ctx, name, T.CompletionItemKind.Module, detail=f"{what}{t.kind}({params})",
                              sort=("1" if t.builtin else "0") + name))
    return out


def _op_body_items(an: Analysis, ctx: Context, snippets: bool = True) -> list[T.CompletionItem]:
    K = T.CompletionItemKind
    out = []
    op = op_for_completion(an, ctx)
    seen = set()
    if op is not None:
        for p in list(op.inputs) + list(op.outputs) + op.declarations:
            if p.name not in seen:
                seen.add(p.name)
                out.append(_edit_item(an, ctx, p.name, K.Variable,
                                      detail=f"{p.type.dtype}{_fmt_shape(p.type.shape)}", sort="0" + p.name))
        for st in op.stages:
            if st.tensor not in seen and st.span.line - 1 < ctx.line0:
                seen.add(st.tensor)
                out.append(_edit_item(an, ctx, st.tensor, K.Variable, detail="intermediate", sort="0" + st.tensor))
    # index names: the names in subscripts on the current line
    depth = 0
    toks = tokenize(an.index.line(ctx.line0))
    for n, tok in enumerate(toks):
        if tok.text == "[":
            depth += 1
        elif tok.text == "]":
            depth = max(0, depth - 1)
        elif tok.kind == "name" and depth > 0 and tok.col != ctx.start and tok.text not in seen:
            following = toks[n + 1].text if n + 1 < len(toks) else ""
            if following not in ("[", "(") and tok.text not in KEYWORDS:
                seen.add(tok.text)
                out.append(_edit_item(an, ctx, tok.text, K.Variable, detail="index", sort="1" + tok.text))
    for name, n in FUNCTIONS.items():
        params = "xy"[:n]
        args = ", ".join(f"${{{i + 1}:{a}}}" for i, a in enumerate(params))
        out.append(_edit_item(an, ctx, name, K.Function, f"{name}({args})" if snippets else name,
                              f"{name}({', '.join(params)})", snippet=snippets, sort="2" + name))
    for d in TVM_DTYPE:
        out.append(_edit_item(an, ctx, d, K.TypeParameter, f"{d}(${{1:x}})" if snippets else d,
                              f"cast to {TVM_DTYPE[d]}", snippet=snippets, sort="3" + d))
    for kw in ("if", "else", "and", "or", "not"):
        out.append(_edit_item(an, ctx, kw, K.Keyword, sort="4" + kw))
    return out


def _argument_items(an: Analysis, ctx: Context, state: dict | None) -> tuple[list[T.CompletionItem], bool]:
    K = T.CompletionItemKind
    out: list[T.CompletionItem] = []
    complete = True
    sig = SIGNATURES.get(ctx.prim or "")
    p = ctx.param
    if sig is None or (ctx.positional and ctx.arg_started and not ctx.in_list):
        return out, True  # after a complete argument (`split(C.i, [4, 8]|`): nothing to add but a comma
    kind = p.kind if p else None
    if kind in (LOOP, LOOPS, STAGE, STAGE_OR_LOOP) and not ctx.in_list:
        if state is not None:
            loops = state.get("loops", [])
            stages = state.get("stages", [])
        else:
            names, snames = static_schedule_names(an, ctx)
            loops = [{"name": n} for n in names]
            stages = [{"name": n} for n in snames]
            complete = False
        if kind in (LOOP, LOOPS, STAGE_OR_LOOP):
            for n, rec in enumerate(loops):
                out.append(_edit_item(an, ctx, rec["name"], K.Field,
                                      detail=_loop_detail(rec) if state is not None else "loop",
                                      sort=f"0{n:04d}"))
        if kind in (STAGE, STAGE_OR_LOOP):
            for n, rec in enumerate(stages):
                block = rec.get("block")
                detail = "stage" + (f" [TVM block {block}]" if block and block != rec["name"] else "")
                out.append(_edit_item(an, ctx, rec["name"], K.Class, detail=detail, sort=f"0{n:04d}"))
    elif kind == BUFFER:
        op = an.model.ops.get(ctx.op or "")
        if op is not None:
            for t in op.tensors.values():
                out.append(_edit_item(an, ctx, t.name, K.Variable, detail=f"{t.role} {t.dtype}{_fmt_shape(t.shape)}"))
    elif kind == THREAD:
        out += [_edit_item(an, ctx, a, K.EnumMember, detail="thread axis", sort=f"0{n:02d}")
                for n, a in enumerate(THREAD_AXES)]
    elif kind == SCOPE:
        out += [_edit_item(an, ctx, s, K.EnumMember, detail="storage scope", sort=f"0{n:02d}")
                for n, s in enumerate(SCOPES)]
    elif kind == BOOL:
        out += [_edit_item(an, ctx, v, K.Constant) for v in ("True", "False")]
    elif kind == STR and sig.name in ("annotate", "unannotate"):
        out += [_edit_item(an, ctx, f'"{k}"', K.Constant) for k in
                ("pragma_auto_unroll_max_step", "pragma_unroll_explicit")]
    elif kind == VALUE:
        out += [_edit_item(an, ctx, v, K.Constant) for v in ("True", "False")]
    if ctx.positional and not ctx.in_list:
        for q in sig.params:
            if not q.required and q.name not in ctx.given:
                out.append(_edit_item(an, ctx, f"{q.name}=", K.Property, f"{q.name}=",
                                      detail=f"{q.kind}, default {q.default}", sort=f"9{q.name}"))
    return out, complete


# ------------------------------------------------------ generated schedules
def _normalize(text: str) -> str:
    return re.sub(r"\s+", "", text)


def generated_statements(op: str, target: str, text: str):
    """(lines, statements) of a generated schedule, or None if it does not parse as statements."""
    lines = [l.strip() for l in text.strip().split("\n") if l.strip()]
    module, diags = parse(f"schedule {op} on {target} {{\n" + "\n".join(lines) + "\n}\n")
    if diags or len(module.schedules) != 1 or len(module.schedules[0].stmts) != len(lines):
        return None
    return lines, module.schedules[0].stmts


def schedule_insertion(an: Analysis, ctx: Context, gen: dict, target: str) -> tuple[str, T.Range] | None:
    """Where and what to insert from a generated schedule at a cursor in a schedule block, consistent with
    the statements already written: those must be the generated schedule's first ones, the statement
    being typed a prefix of the next, and nothing may follow the cursor in the block."""
    text = gen.get("schedule_text")
    if not text or ctx.where != "sched_head" or ctx.stmts_above is None or ctx.stmts_below or not ctx.op:
        return None
    parsed = generated_statements(ctx.op, target, text)
    if parsed is None:
        return None
    lines, stmts = parsed
    k = len(ctx.stmts_above)
    if k >= len(stmts) or tuple(stmts[:k]) != tuple(ctx.stmts_above):
        return None
    if "\n" in ctx.stmt_text or not _normalize(lines[k]).startswith(_normalize(ctx.stmt_text)):
        return None
    insert = ("\n" + ctx.indent).join(lines[k:])
    start = ctx.col0 - len(ctx.stmt_text)
    return insert, T.Range(pos(an, ctx.line0, start), pos(an, ctx.line0, ctx.col0))


def auto_ops_before(an: Analysis, line0: int) -> list[A.Op]:
    """@auto operators right above a blank top-level line (only blank lines between)."""
    out = []
    for op in an.ast.ops:
        if op.is_auto and op.span.end_line - 1 < line0:
            between = [an.index.line(n).strip() for n in range(op.span.end_line, line0)]
            if not any(between):
                out.append(op)
    return out


def targets_for_generation(an: Analysis, op: str) -> list[str]:
    declared = [t.name for t in an.ast.targets if t.name in an.model.targets]
    names = declared or ["llvm"]
    return [n for n in names if an.model.schedule_for(op, n) is None and not any(
        s.op == op and s.target == n for s in an.ast.schedules)]


def block_insertion(an: Analysis, ctx: Context, op: str, gen: dict, target: str) -> tuple[str, T.Range] | None:
    """A whole `schedule OP on TARGET { ... }` block at a blank line below an @auto operator."""
    text = gen.get("schedule_text")
    if not text or ctx.where != "top" or (ctx.prefix and not "schedule".startswith(ctx.prefix)):
        return None
    if an.index.line(ctx.line0)[:ctx.start].strip():
        return None
    parsed = generated_statements(op, target, text)
    if parsed is None:
        return None
    lines, _ = parsed
    block = f"schedule {op} on {target} {{\n" + "".join(f"    {l}\n" for l in lines) + "}"
    return block, T.Range(pos(an, ctx.line0, ctx.start), pos(an, ctx.line0, ctx.col0))


def generated_item(insert: str, rng: T.Range, gen: dict, op: str, target: str) -> T.CompletionItem:
    first = insert.split("\n", 1)[0].strip()
    n = insert.count("\n") + 1
    by = f"policy '{gen['policy']}'" + (f", model {gen['model']}" if gen.get("model") else "")
    return T.CompletionItem(
        label=f"{first} …" if n > 1 else first, kind=T.CompletionItemKind.Snippet,
        detail=f"generated schedule: {by}, target '{target}'",
        documentation=T.MarkupContent(T.MarkupKind.Markdown,
                                      f"Schedule for `{op}` on `{target}` generated by {by}:\n\n"
                                      f"```tsched\n{insert}\n```"),
        text_edit=T.TextEdit(rng, insert), filter_text=insert.split("\n", 1)[0].strip() or insert,
        insert_text_format=T.InsertTextFormat.PlainText, sort_text="!", preselect=True,
        data={"generated": True, "policy": gen["policy"], "target": target, "op": op})


# ------------------------------------------------------------------- hover
def _md_signature(op: A.Op) -> str:
    def p(x):
        return f"{x.name}: {x.type.dtype}{_fmt_shape(x.type.shape)}"
    outs = ", ".join(p(x) for x in op.outputs)
    if op.outputs_parenthesized:
        outs = f"({outs})"
    deco = "".join(f"@{d.name}\n" for d in op.decorators)
    return f"{deco}op {op.name}({', '.join(p(x) for x in op.inputs)}) -> {outs}"


def _num(n: int) -> str:
    return f"{n:,}"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def op_hover(an: Analysis, name: str) -> str:
    op_ast = an.op_ast(name)
    parts = [f"```tsched\n{_md_signature(op_ast)}\n```"] if op_ast else [f"op `{name}`"]
    op = an.model.ops.get(name)
    if op is None:
        parts.append("_has errors: no model_")
        return "\n\n".join(parts)
    rows = ["| stage | loops (extent) | reduction | FLOPs |", "|---|---|---|---|"]
    for st in op.stages:
        loops = ", ".join(f"{i.name} {i.extent}" + (" (r)" if i.kind == "reduce" else "") for i in st.loops)
        red = f"{st.reducer} over {', '.join(i.name for i in st.reduce)}" if st.reducer else "—"
        rows.append(f"| `{st.tensor}` | {loops} | {red} | {_num(st.flops)} |")
    parts.append("\n".join(rows))
    intensity = op.flops / op.bytes if op.bytes else 0.0
    parts.append(f"**FLOPs** {_num(op.flops)} · **bytes** {_num(op.bytes)} ({_bytes(op.bytes)}: inputs read once, "
                 f"outputs written once) · {intensity:.2f} FLOP/byte")
    scheds = [f"`{s.target}` (line {s.span.line})" for s in an.ast.schedules if s.op == name]
    if scheds:
        parts.append("schedules: " + ", ".join(scheds))
    elif op.ast.is_auto:
        parts.append("`@auto`: its schedule is generated when none is written")
    return "\n\n".join(parts)


def stage_hover(an: Analysis, op_name: str, tensor: str) -> str | None:
    op = an.model.ops.get(op_name)
    st = op.stage(tensor) if op else None
    if st is None:
        return tensor_hover(an, op_name, tensor)
    loops = "\n".join(f"- `{st.tensor}.{i.name}`: extent {i.extent}, {'reduction' if i.kind == 'reduce' else 'spatial'}"
                      for i in st.loops)
    red = f", reduction: {st.reducer}" if st.reducer else ""
    t = op.tensors.get(tensor)
    shape = f" → `{t.dtype}{_fmt_shape(t.shape)}`" if t else ""
    return (f"**stage `{tensor}`** of `{op_name}`{shape}{red}\n\nloops, outermost first:\n{loops}\n\n"
            f"FLOPs {_num(st.flops)} ({st.flops_per_point} per point)")


def tensor_hover(an: Analysis, op_name: str, name: str) -> str | None:
    op = an.model.ops.get(op_name)
    t = op.tensors.get(name) if op else None
    if t is None:
        return f"tensor `{name}`"
    return f"**tensor `{name}`**: `{t.dtype}{_fmt_shape(t.shape)}`, {t.role}, {_bytes(t.nbytes)}"


def index_hover(an: Analysis, key: tuple) -> str | None:
    _, op_name, tensor, name = key
    op = an.model.ops.get(op_name)
    st = op.stage(tensor) if op else None
    idx = next((i for i in st.loops if i.name == name), None) if st else None
    if idx is None:
        return f"index `{name}`"
    return (f"**index `{name}`** of stage `{tensor}`: extent {idx.extent}, "
            f"{'reduction' if idx.kind == 'reduce' else 'spatial'} (its loop is `{tensor}.{name}`)")


def target_hover(an: Analysis, name: str) -> str:
    t = an.model.targets.get(name)
    if t is None:
        return f"target `{name}`"
    params = dict(t.params)
    if t.is_gpu:
        params = {**gpu_limits(t.params), **params}
    body = "\n".join(f"- `{k}` = {v!r}" for k, v in params.items()) or "- (defaults of this host)"
    where = "built-in " if t.builtin else ""
    return f"**{where}target `{name}`**: `{t.kind}` ({'GPU' if t.is_gpu else 'CPU'})\n\n{body}"


def primitive_hover(name: str) -> str | None:
    sig = SIGNATURES.get(name)
    if sig is None:
        return None
    ret = f" -> {sig.returns}" if sig.returns else ""
    return f"```tsched\n{sig.label()}{ret}\n```\n\n{sig.doc}"


def unroll_text(report: list | None) -> str | None:
    """The worker's unroll report (space/unroll_loop.unroll_report) as hover text."""
    from tensorlang.space.unroll_loop import report_text
    return report_text(report, quote="`").replace("\n", "\n\n") if report else None


def measurement_text(m: dict | None, current_text: str | None = None) -> str | None:
    if not m:
        return None
    r = m.get("result")
    when = time.strftime("%H:%M:%S", time.localtime(m.get("when", time.time())))
    unchecked = r is not None and r.get("status") == "unchecked"  # timed, but the reference could not be computed
    if r is None or not (m.get("ok") or unchecked):
        return f"last measurement ({when}) failed: {m.get('error')}"
    stale = " (the schedule changed since)" if current_text is not None and current_text != m.get("text") else ""
    verdict = m.get("error") if unchecked else f"max rel err {r['max_rel']:.1e}, {'ok' if r['ok'] else 'MISMATCH'}"
    return f"last measured {when}: **{r['median_ms']:.3f} ms** median, {r['gflops']:.2f} GFLOP/s, {verdict}{stale}"


def schedule_source(an: Analysis, sched: A.Schedule) -> str:
    return "\n".join(an.index.line(n) for n in range(sched.span.line - 1, sched.span.end_line))


# ------------------------------------------------------------ navigation
def location(an: Analysis, uri: str, span: Span) -> T.Location:
    return T.Location(uri, to_range(an, span))


def document_symbols(an: Analysis) -> list[T.DocumentSymbol]:
    K = T.SymbolKind
    out = []

    def sym(name, kind, span, sel, detail=None, children=None):
        rng, srng = to_range(an, span), to_range(an, sel)
        if (srng.start.line, srng.start.character) < (rng.start.line, rng.start.character) or \
                (srng.end.line, srng.end.character) > (rng.end.line, rng.end.character):
            srng = T.Range(rng.start, rng.start)
        return T.DocumentSymbol(name=name or "?", kind=kind, range=rng, selection_range=srng, detail=detail,
                                children=children)

    for item in an.ast.items:
        if isinstance(item, A.Target):
            params = ", ".join(f"{p.name} = {p.value.text}" for p in item.params)
            out.append(sym(item.name, K.Constant, item.span, item.name_span, f"{item.kind}({params})"))
        elif isinstance(item, A.Op):
            children = []
            for role, ps in (("input", item.inputs), ("output", item.outputs), ("declared", item.declarations)):
                for p in ps:
                    children.append(sym(p.name, K.Variable, p.span, p.name_span,
                                        f"{role} {p.type.dtype}{_fmt_shape(p.type.shape)}"))
            for st in item.stages:
                children.append(sym(st.tensor, K.Field, st.span, st.name_span, f"stage ({st.op})"))
            out.append(sym(item.name, K.Function, item.span, item.name_span,
                           ("@auto " if item.is_auto else "") + "op", children))
        elif isinstance(item, A.Schedule):
            children = []
            for s in item.stmts:
                lhs = ", ".join(t.name for t in s.targets)
                children.append(sym((lhs + " = " if lhs else "") + s.prim, K.Method, s.span, s.prim_span))
            out.append(sym(f"schedule {item.op} on {item.target}", K.Namespace, item.span, item.op_span,
                           f"{len(item.stmts)} statements", children))
    return out


# -------------------------------------------------------- semantic tokens
TOKEN_TYPES = ["keyword", "type", "function", "variable", "parameter", "property", "namespace", "enumMember",
               "number", "string", "comment", "operator", "decorator", "class"]
TOKEN_MODIFIERS = ["declaration", "defaultLibrary", "readonly"]
_OCC_TYPE = {"target": "namespace", "op": "function", "tensor": "variable", "stage": "class", "index": "parameter",
             "loop": "property", "prim": "function", "func": "function", "cast": "type", "dtype": "type",
             "kind": "type", "param": "property", "decorator": "decorator", "thread": "enumMember",
             "scope": "enumMember", "const": "keyword"}
_LIBRARY = {"prim", "func", "cast", "dtype", "kind", "thread", "scope"}
LEGEND = T.SemanticTokensLegend(token_types=TOKEN_TYPES, token_modifiers=TOKEN_MODIFIERS)


def semantic_tokens(an: Analysis) -> list[int]:
    at: dict[tuple[int, int], Occ] = {}
    for o in an.occurrences:
        at.setdefault((o.span.line - 1, o.span.col - 1), o)
    data: list[int] = []
    prev_line = prev_col = 0
    for tok in tokenize(an.text):
        ttype, mods = None, 0
        if tok.kind == "name":
            o = at.get((tok.line, tok.col))
            if o is not None and o.kind in _OCC_TYPE:
                ttype = _OCC_TYPE[o.kind]
                if o.is_def:
                    mods |= 1
                if o.kind in _LIBRARY:
                    mods |= 2
                if o.kind == "param":
                    mods |= 4
            elif tok.text in KEYWORDS or tok.text in CONSTANTS:
                ttype = "keyword"
        elif tok.kind == "number":
            ttype = "number"
        elif tok.kind == "string":
            ttype = "string"
        elif tok.kind == "comment":
            ttype = "comment"
        elif tok.kind == "stageop" or tok.text in ("+=", "->", "=", "**", "//", "+", "-", "*", "/", "%", "<", ">",
                                                   "<=", ">=", "==", "!="):
            ttype = "operator"
        elif tok.text == "@":
            ttype = "decorator"
        if ttype is None:
            continue
        col = an.index.to_units(tok.line, tok.col)
        length = an.index.length_units(tok.line, tok.col, len(tok.text))
        if length <= 0:
            continue
        dl = tok.line - prev_line
        dc = col - prev_col if dl == 0 else col
        data += [dl, dc, length, TOKEN_TYPES.index(ttype), mods]
        prev_line, prev_col = tok.line, col
    return data


# ----------------------------------------------------------------- folding
def folding_ranges(an: Analysis) -> list[T.FoldingRange]:
    out = []
    stack = []
    for tok in tokenize(an.text):
        if tok.text == "{":
            stack.append(tok.line)
        elif tok.text == "}" and stack:
            start = stack.pop()
            end = tok.line - 1 if tok.line - 1 > start else tok.line
            if end > start:
                out.append(T.FoldingRange(start_line=start, end_line=end, kind=T.FoldingRangeKind.Region))
    run = []
    for n, line in enumerate(an.index.lines + [""]):
        if line.strip().startswith("#"):
            run.append(n)
            continue
        if len(run) >= 2:
            out.append(T.FoldingRange(start_line=run[0], end_line=run[-1], kind=T.FoldingRangeKind.Comment))
        run = []
    return sorted(out, key=lambda r: (r.start_line, r.end_line))


# -------------------------------------------------------------- formatting
def formatting_edits(an: Analysis) -> list[T.TextEdit]:
    """`tensorlang fmt` as edits: none when the file has syntax errors (fmt refuses it) or is canonical."""
    if an.has_syntax_errors():
        return []
    new = format_module(an.ast)
    old = an.text
    if new == old:
        return []
    a = [x for x in re.split(r"(?<=\n)", old) if x]
    b = [x for x in re.split(r"(?<=\n)", new) if x]

    def at(i: int) -> T.Position:  # the start of old line i, or the end of the text
        if i < len(a):
            return T.Position(i, 0)
        if not a or a[-1].endswith("\n"):
            return T.Position(len(a), 0)
        return T.Position(len(a) - 1, an.index.to_units(len(a) - 1, len(a[-1])))

    edits = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            edits.append(T.TextEdit(T.Range(at(i1), at(i2)), "".join(b[j1:j2])))
    return edits


def apply_edits(text: str, edits: list[T.TextEdit]) -> str:
    """Apply LSP edits (UTF-16 positions of ASCII text) to a string -- for tests and checks."""
    from tensorlang.lsp.text import LineIndex
    idx = LineIndex(text)
    spans = []
    for e in edits:
        s = idx.offset(e.range.start.line, idx.from_units(e.range.start.line, e.range.start.character))
        t = idx.offset(e.range.end.line, idx.from_units(e.range.end.line, e.range.end.character))
        spans.append((s, t, e.new_text))
    for s, t, new in sorted(spans, reverse=True):
        text = text[:s] + new + text[t:]
    return text


# ------------------------------------------------------------ quick fixes
def quick_fixes(an: Analysis, uri: str, diagnostics: list[T.Diagnostic]) -> list[T.CodeAction]:
    """'Replace with nearest legal alternative': one action per suggestion, replacing the diagnostic's range."""
    out = []
    for d in diagnostics:
        data = d.data if isinstance(d.data, dict) else {}
        suggestions = data.get("suggestions") or []
        if d.source not in (None, SOURCE) or not suggestions:
            continue
        rng = d.range
        current = _range_text(an, rng)
        m = re.match(r"([A-Za-z_]\w*)\s*=", current)
        for n, s in enumerate(suggestions):
            target = rng
            if m and re.fullmatch(r"[A-Za-z_]\w*", str(s)):  # `name=value`: the suggestion is a parameter name
                start = rng.start
                target = T.Range(start, T.Position(start.line, start.character + len(m.group(1))))
            edit = T.WorkspaceEdit(changes={uri: [T.TextEdit(target, str(s))]})
            out.append(T.CodeAction(title=f"Replace with nearest legal alternative: {s}",
                                    kind=T.CodeActionKind.QuickFix, diagnostics=[d], edit=edit, is_preferred=n == 0))
    return out


def _range_text(an: Analysis, rng: T.Range) -> str:
    if rng.start.line != rng.end.line:
        return ""
    line = an.index.line(rng.start.line)
    a = an.index.from_units(rng.start.line, rng.start.character)
    b = an.index.from_units(rng.end.line, rng.end.character)
    return line[a:b]
