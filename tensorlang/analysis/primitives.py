"""Signatures of the schedule primitives: the TensorIR primitive each statement calls.

Arguments are parsed generically (names, dotted names, numbers, strings, lists) and
resolved here by each primitive's signature, so `threadIdx.x` is a thread axis in
`bind` and `shared` a storage scope in `cache_read`, not loop or stage references.
This module is pure data plus argument matching: no TVM.
"""
from __future__ import annotations

from dataclasses import dataclass

from tensorlang.diagnostics import Diagnostic, error, one_of
from tensorlang.parser import ast as A

# Argument kinds.
STAGE, LOOP, LOOPS, FACTORS, INT, BOOL, SCOPE, THREAD, BUFFER, STR, VALUE, STAGE_OR_LOOP, STAGES = (
    "stage", "loop", "loops", "factors", "int", "bool", "scope", "thread", "buffer", "str", "value",
    "stage or loop", "stages")

THREAD_AXES = tuple(f"{k}.{a}" for k in ("blockIdx", "threadIdx", "vthread") for a in "xyz") + ("vthread",)
SCOPES = ("global", "shared", "shared.dyn", "local", "warp")
_REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    default: object = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[Param, ...]
    returns: str | None  # None | "loop" | "loops" | "stage"
    doc: str

    def snippet(self) -> str:
        """An editor snippet with tab stops for the required parameters."""
        req = [p for p in self.params if p.required]
        body = ", ".join(f"${{{n + 1}:{p.name}}}" for n, p in enumerate(req))
        return f"{self.name}({body})"

    def label(self) -> str:
        parts = []
        for p in self.params:
            text = f"*{p.name}" if p.kind == LOOPS else p.name
            if not p.required:
                text += f"={_default_text(p.default)}"
            parts.append(text)
        return f"{self.name}({', '.join(parts)})"


def _default_text(v) -> str:
    return {True: "True", False: "False", None: "None"}.get(v, str(v)) if isinstance(v, (bool, type(None))) else str(v)


def _sig(name, params, returns, doc):
    return Signature(name, tuple(params), returns, doc)


P = Param
SIGNATURES: dict[str, Signature] = {s.name: s for s in [
    _sig("split", [P("loop", LOOP), P("factors", FACTORS), P("preserve_unit_iters", BOOL, True),
                   P("disable_predication", BOOL, False)], "loops",
         "Split a loop into len(factors) nested loops; at most one factor may be None (inferred)."),
    _sig("fuse", [P("loops", LOOPS), P("preserve_unit_iters", BOOL, True)], "loop",
         "Fuse consecutive nested loops into one."),
    _sig("reorder", [P("loops", LOOPS)], None, "Reorder loops of one stage's nest into the given order."),
    _sig("parallel", [P("loop", LOOP)], None, "Run a spatial loop's iterations on parallel CPU threads."),
    _sig("vectorize", [P("loop", LOOP)], None, "Vectorize a spatial loop (innermost, no dependence)."),
    _sig("unroll", [P("loop", LOOP)], None, "Unroll a loop completely."),
    _sig("bind", [P("loop", LOOP), P("thread_axis", THREAD)], None,
         "Bind a loop to a GPU thread axis: " + ", ".join(THREAD_AXES) + "."),
    _sig("cache_read", [P("stage", STAGE), P("buffer", BUFFER), P("scope", SCOPE), P("consumers", STAGES, None)],
         "stage",
         "Read a buffer of a stage through a cache in the given scope; returns the copy stage. `consumers` "
         "(default: every reader) lists the stages that read through the cache."),
    _sig("cache_write", [P("stage", STAGE), P("buffer", BUFFER), P("scope", SCOPE), P("consumers", STAGES, None)],
         "stage",
         "Write a stage's output through a cache; the stage keeps its name, the write-back is returned."),
    _sig("compute_at", [P("stage", STAGE), P("loop", LOOP), P("preserve_unit_loops", BOOL, False),
                        P("index", INT, -1)], None,
         "Move a producer stage under a loop of its consumer."),
    _sig("reverse_compute_at", [P("stage", STAGE), P("loop", LOOP), P("preserve_unit_loops", BOOL, False),
                                P("index", INT, -1)], None,
         "Move a consumer stage under a loop of its producer."),
    _sig("compute_inline", [P("stage", STAGE)], None, "Inline an elementwise stage into its consumers."),
    _sig("reverse_compute_inline", [P("stage", STAGE)], None, "Inline an elementwise stage into its producer."),
    _sig("decompose_reduction", [P("stage", STAGE), P("loop", LOOP)], "stage",
         "Split a reduction stage's initialisation out, above the given loop; returns the init stage."),
    _sig("annotate", [P("target", STAGE_OR_LOOP), P("key", STR), P("value", VALUE)], None,
         "Attach an annotation, e.g. annotate(l, \"pragma_auto_unroll_max_step\", 64)."),
    _sig("unannotate", [P("target", STAGE_OR_LOOP), P("key", STR)], None, "Remove an annotation."),
    _sig("storage_align", [P("stage", STAGE), P("buffer_index", INT), P("axis", INT), P("factor", INT),
                           P("offset", INT)], None,
         "Pad a buffer's axis stride to factor * k + offset (avoids shared-memory bank conflicts)."),
    _sig("set_scope", [P("stage", STAGE), P("buffer", BUFFER), P("scope", SCOPE)], None,
         "Set the storage scope of a buffer a stage writes."),
    _sig("rfactor", [P("loop", LOOP), P("factor_axis", INT, 0)], "stage",
         "Factor a reduction loop out into a new stage (for parallel or cross-thread reductions)."),
    _sig("get_loops", [P("stage", STAGE)], "loops",
         "Name the loops above a stage, outermost first; changes nothing (one name per loop)."),
    _sig("add_unit_loop", [P("target", STAGE_OR_LOOP)], "loop", "Add an extent-1 loop above a stage or loop."),
]}


@dataclass
class BoundArgs:
    """Arguments matched to a signature: parameter name -> AST argument (or default value)."""
    sig: Signature
    values: dict  # name -> A.Arg | default python value | list[A.Arg] for LOOPS


def match_args(stmt: A.SchedStmt) -> tuple[BoundArgs | None, list[Diagnostic]]:
    """Match a statement's arguments to its primitive's signature (kinds checked shallowly)."""
    sig = SIGNATURES.get(stmt.prim)
    if sig is None:
        from difflib import get_close_matches
        close = get_close_matches(stmt.prim, SIGNATURES, n=3)
        hint = f"; did you mean {one_of(close)}?" if close else f"; known primitives: {', '.join(SIGNATURES)}"
        return None, [error("TS301", f"unknown schedule primitive '{stmt.prim}'{hint}", stmt.prim_span, close)]
    diags: list[Diagnostic] = []
    values: dict = {}
    positional = [a for a in stmt.args if not isinstance(a, A.KwSchedArg)]
    keywords = [a for a in stmt.args if isinstance(a, A.KwSchedArg)]
    params = list(sig.params)
    pi = 0
    for n, arg in enumerate(positional):
        if pi >= len(params):
            diags.append(error("TS302", f"{sig.name} takes at most {len(params)} arguments: {sig.label()}", arg.span))
            break
        p = params[pi]
        if p.kind == LOOPS:
            values[p.name] = list(positional[n:])
            pi = len(params)  # a variadic parameter takes the rest; later ones are keyword-only
            break
        values[p.name] = arg
        pi += 1
    for kw in keywords:
        p = next((p for p in params if p.name == kw.name), None)
        if p is None:
            diags.append(error("TS302", f"{sig.name} has no parameter '{kw.name}': {sig.label()}", kw.span,
                               [q.name for q in params]))
        elif p.name in values:
            diags.append(error("TS302", f"{sig.name} got '{kw.name}' twice", kw.span))
        else:
            values[p.name] = kw.value
    for p in params:
        if p.name not in values:
            if p.required:
                diags.append(error("TS302", f"{sig.name} is missing its '{p.name}' argument: {sig.label()}",
                                   stmt.span))
            else:
                values[p.name] = p.default
    if sig.returns is None and stmt.targets:
        diags.append(error("TS312", f"{sig.name} returns nothing; remove the names on the left",
                           stmt.targets[0].span))
    if sig.returns in ("loop", "stage") and len(stmt.targets) > 1:
        diags.append(error("TS312", f"{sig.name} returns one {sig.returns}; {len(stmt.targets)} names given",
                           stmt.targets[0].span))
    if sig.name == "split" and stmt.targets and isinstance(values.get("factors"), A.ListArg):
        n = len(values["factors"].items)
        if len(stmt.targets) != n:
            diags.append(error("TS312", f"split into {n} loops binds {n} names; {len(stmt.targets)} given",
                               stmt.targets[0].span))
    for p in params:
        v = values.get(p.name)
        if isinstance(v, (A.Ref, A.Const, A.ListArg)) or (p.kind == LOOPS and isinstance(v, list)):
            diags.extend(_check_kind(sig, p, v))
    if any(d.severity == "error" for d in diags):
        return None, diags
    return BoundArgs(sig, values), diags


def _check_kind(sig: Signature, p: Param, v) -> list[Diagnostic]:
    def bad(what, span, alternatives=()):
        return [error("TS302", f"{sig.name}: '{p.name}' must be {what}", span, alternatives)]

    if p.kind == LOOPS:
        out = []
        for item in v:
            if not isinstance(item, A.Ref):
                out += bad("a loop name", item.span)
        if not v:
            out += [error("TS302", f"{sig.name} needs at least one loop", A.NO_SPAN)]
        return out
    if p.kind == STAGES:
        ok = isinstance(v, A.ListArg) and all(isinstance(x, A.Ref) and len(x.parts) == 1 for x in v.items)
        return [] if ok else bad("a list of stage names, e.g. [C]", v.span)
    if p.kind in (LOOP, STAGE, STAGE_OR_LOOP):
        return [] if isinstance(v, A.Ref) else bad(f"a {p.kind} name", v.span)
    if p.kind == FACTORS:
        if not isinstance(v, A.ListArg) or not v.items:
            return bad("a list of factors, e.g. [4, 16]", v.span)
        out = []
        for item in v.items:
            ok = (isinstance(item, A.Const) and item.kind == "int" and item.value > 0) or (
                isinstance(item, A.Ref) and item.text == "None")
            if not ok:
                out += bad("a list of positive integers (one may be None)", item.span)
        return out
    if p.kind == INT:
        return [] if isinstance(v, A.Const) and v.kind == "int" else bad("an integer", v.span)
    if p.kind == BOOL:
        return [] if isinstance(v, A.Ref) and v.text in ("True", "False") else bad("True or False", v.span)
    if p.kind == SCOPE:
        text = v.value if isinstance(v, A.Const) and v.kind == "str" else (v.text if isinstance(v, A.Ref) else None)
        return [] if text in SCOPES else bad(f"a storage scope: {one_of(SCOPES)}", v.span, SCOPES)
    if p.kind == THREAD:
        text = v.value if isinstance(v, A.Const) and v.kind == "str" else (v.text if isinstance(v, A.Ref) else None)
        return [] if text in THREAD_AXES else bad(f"a thread axis: {one_of(THREAD_AXES)}", v.span, THREAD_AXES)
    if p.kind == BUFFER:
        ok = isinstance(v, A.Ref) and len(v.parts) == 1 or isinstance(v, A.Const) and v.kind == "int"
        return [] if ok else bad("a tensor name or a buffer index", v.span)
    if p.kind == STR:
        return [] if isinstance(v, A.Const) and v.kind == "str" else bad("a string", v.span)
    if p.kind == VALUE:
        ok = isinstance(v, A.Const) or isinstance(v, A.Ref) and v.text in ("True", "False") or (
            isinstance(v, A.ListArg) and all(isinstance(x, A.Const) and x.kind == "int" for x in v.items))
        return [] if ok else bad("an integer, float, string, True, False or a list of integers", v.span)
    return []


def arg_text_value(v):
    """The python value of a scope/thread/str/int/bool argument."""
    if isinstance(v, A.Const):
        return v.value
    if isinstance(v, A.Ref):
        return {"True": True, "False": False, "None": None}.get(v.text, v.text)
    if isinstance(v, A.ListArg):
        return [arg_text_value(x) for x in v.items]
    return v
