"""Diagnostics: the one vocabulary every stage of the pipeline reports problems in.

A diagnostic has a stable code (e.g. `TS104`), a severity, a 1-based span, a
message that names the rule, and, where there are any, the legal alternatives
(`suggestions`), which editors turn into quick fixes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorlang.span import NO_SPAN, Span

ERROR, WARNING, HINT = "error", "warning", "hint"
_SEVERITY_RANK = {ERROR: 0, WARNING: 1, HINT: 2}

# Every code the checker can emit, with a one-line description (docs/language.md lists them too).
CODES = {
    # syntax
    "TS001": "syntax error: unexpected token",
    "TS002": "syntax error: unexpected character",
    "TS003": "syntax error: unexpected end of input",
    # names and declarations
    "TS101": "duplicate definition",
    "TS102": "unknown target kind",
    "TS103": "unknown or ill-typed target parameter",
    "TS104": "unknown tensor",
    "TS105": "unknown dtype",
    "TS106": "schedule for an unknown operator",
    "TS107": "unknown target",
    "TS108": "unknown function",
    "TS109": "wrong number of arguments to a function",
    "TS110": "unknown decorator",
    "TS111": "duplicate schedule for an operator and target",
    # stages, indices and shapes
    "TS201": "index arity mismatch",
    "TS202": "shape mismatch",
    "TS203": "constant index out of range",
    "TS204": "reduction operator on an elementwise stage",
    "TS205": "free index on the right of a plain `=` stage",
    "TS206": "index extent cannot be inferred",
    "TS207": "tensor used before it is computed",
    "TS208": "tensor written twice or an input written",
    "TS209": "output never computed",
    "TS210": "dtype mismatch",
    "TS211": "invalid subscript",
    "TS212": "unused declaration",
    "TS213": "left-hand side subscripts must be distinct index names",
    "TS214": "index out of range",
    "TS215": "division by zero",
    "TS216": "a stage nothing reads",
    # schedules
    "TS301": "unknown schedule primitive",
    "TS302": "bad arguments to a schedule primitive",
    "TS303": "unknown stage",
    "TS304": "unknown loop",
    "TS305": "loop or stage no longer exists",
    "TS306": "split factors do not cover the loop extent",
    "TS307": "reorder of loops from different stages",
    "TS308": "parallel or vectorize of a reduction loop",
    "TS309": "illegal compute_at location",
    "TS310": "schedule primitive rejected by TVM",
    "TS311": "split factors do not divide the extent (a predicate is added)",
    "TS312": "wrong number of names bound",
    "TS313": "unknown buffer",
    "TS314": "legal, but not a point of the schedule space",
    "TS315": "a reduction computed more than once (compute_at under loops that do not index it)",
    # targets and lowering
    "TS401": "GPU block not bound to blockIdx and threadIdx",
    "TS402": "GPU kernel exceeds the target's limits",
    "TS403": "no schedule for a GPU target",
    "TS404": "lowered without a schedule",
    "TS405": "the host lacks an instruction set the target needs",
    "TS406": "TVM could not build the kernel",
    "TS407": "the NumPy reference needs more memory than this machine has",
    "TS408": "the NumPy reference would take longer than its time limit",
    # the tool itself
    "TS900": "internal error",
}


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: str
    message: str
    span: Span = NO_SPAN
    suggestions: tuple[str, ...] = field(default=())  # legal alternatives, as source text

    def format(self, filename: str) -> str:
        line, col = max(self.span.line, 1), max(self.span.col, 1)
        return f"{filename}:{line}:{col}: {self.severity}: {self.code} {self.message}"

    @property
    def sort_key(self):
        return (self.span.line, self.span.col, _SEVERITY_RANK[self.severity], self.code, self.message)


def error(code: str, message: str, span: Span = NO_SPAN, suggestions=()) -> Diagnostic:
    return Diagnostic(code, ERROR, message, span, tuple(suggestions))


def warning(code: str, message: str, span: Span = NO_SPAN, suggestions=()) -> Diagnostic:
    return Diagnostic(code, WARNING, message, span, tuple(suggestions))


def hint(code: str, message: str, span: Span = NO_SPAN, suggestions=()) -> Diagnostic:
    return Diagnostic(code, HINT, message, span, tuple(suggestions))


def sort_diagnostics(diags) -> list[Diagnostic]:
    seen, out = set(), []
    for d in sorted(diags, key=lambda d: d.sort_key):
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def has_errors(diags) -> bool:
    return any(d.severity == ERROR for d in diags)


def one_of(names) -> str:
    """'a, b or c' -- for messages that list the legal alternatives."""
    names = [str(n) for n in names]
    if not names:
        return "none"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " or " + names[-1]
