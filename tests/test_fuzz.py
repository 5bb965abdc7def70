"""Property tests: the parser and checker never raise and never report an internal error (TS900).

Inputs are arbitrary text, text built from the language's tokens, and random edits of the
reference examples (characters, tokens and lines deleted, inserted, replaced, swapped or
duplicated). The mutants that still parse must also round-trip through the formatter.
A handful of mutants are checked with legality (their schedules applied with TVM).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorlang import api
from tensorlang.diagnostics import CODES
from tensorlang.parser import format_module, parse

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {p.stem: p.read_text() for p in sorted((ROOT / "examples").glob("*.tsched"))}
SCHEDULED = {k: v for k, v in EXAMPLES.items() if "schedule " in v}

# The language's tokens: keywords, punctuation and operators, and names and numbers that mean
# something in the examples (tensors, indices, loops, stages, primitives, axes, scopes, dtypes).
KEYWORDS = ["target", "op", "schedule", "on", "if", "else", "and", "or", "not", "@auto", "@", "llvm", "cuda"]
PUNCT = ["(", ")", "[", "]", "{", "}", ",", ":", ".", "=", "+=", "max=", "min=", "->", "+", "-", "*", "/",
         "//", "%", "**", "<", "<=", ">", ">=", "==", "!=", "#", '"', "\n", " ", "\t"]
NAMES = ["A", "B", "C", "X", "W", "Y", "P", "T", "M", "E", "S", "Q", "K", "CL", "AS", "BS", "i", "j", "k", "n",
         "c", "h", "w", "f", "r", "s", "x", "y", "b", "d", "i0", "i1", "i2", "j0", "j1", "j2", "k0", "k1", "bx",
         "tx", "p", "ij", "C.i", "C.j", "C.k", "Y.i", "Y.j", "S.k", "AS.ax0", "AS.ax1", "ax0", "None", "True",
         "False", "cpu", "h200", "matmul", "softmax", "conv2d"]
PRIMS = ["split", "fuse", "reorder", "parallel", "vectorize", "unroll", "bind", "cache_read", "cache_write",
         "compute_at", "reverse_compute_at", "compute_inline", "reverse_compute_inline", "decompose_reduction",
         "annotate", "unannotate", "storage_align", "set_scope", "rfactor", "add_unit_loop"]
OTHER = ["blockIdx.x", "threadIdx.x", "threadIdx.y", "vthread", "shared", "local", "global", "f32", "f16", "i32",
         "bool", "u8", "exp", "erf", "max", "min", "pow", "rsqrt", "mcpu", "cores", "arch", '"sm_90"',
         '"sapphirerapids"', "0", "1", "2", "3", "4", "8", "16", "57", "64", "128", "512", "1024", "2048", "-1",
         "0.0", "1.0", "0.5", "1e-5", "99999999999999999999", "[4, 16]", "[None, 8]", "[]", '"\\x"', '"\\u12"']
VOCAB = KEYWORDS + PUNCT + NAMES + PRIMS + OTHER

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*|\d+\.?\d*|\+=|max=|min=|->|//|\*\*|<=|>=|==|!=|\S")
SEVERITIES = {"error", "warning", "hint"}


# ----------------------------------------------------------------- checks
def assert_sane(text: str, legality: bool = False):
    """Loading and checking `text` never raises, reports no internal error, and gives well-formed diagnostics."""
    parse(text)  # never raises on bad input (load_text would hide an exception as TS900)
    doc = api.load_text(text, "fuzz.tsched")
    diags = api.check(doc, legality=legality)
    internal = [d for d in diags if d.code == "TS900"]
    assert not internal, f"internal error on:\n{text}\n---\n{internal}"
    lines = text.split("\n")
    for d in diags:
        assert d.code in CODES, d
        assert d.severity in SEVERITIES, d
        assert d.message and "Traceback" not in d.message, d
        assert isinstance(d.suggestions, tuple) and all(isinstance(s, str) for s in d.suggestions), d
        assert 0 <= d.span.line <= len(lines) + 1, (d, len(lines))
        assert d.format("fuzz.tsched").startswith("fuzz.tsched:")
    return diags


def assert_round_trip(text: str):
    module, syntax = parse(text)
    if syntax:
        return
    formatted = format_module(module)
    again, syntax2 = parse(formatted)
    assert syntax2 == [], f"formatted text does not parse:\n{formatted}\n{syntax2}"
    assert again == module, f"round trip changed the tree:\n--- source\n{text}\n--- formatted\n{formatted}"
    # And formatting is idempotent.
    assert format_module(again) == formatted


# ------------------------------------------------------------- strategies
vocab_text = st.lists(st.sampled_from(VOCAB), max_size=60).map(lambda ts: " ".join(ts))
vocab_text_tight = st.lists(st.sampled_from(VOCAB), max_size=60).map("".join)
# Tokens of one class, for edits that keep the text parsing but change what it means.
SAME_CLASS = {
    "name": [t for t in NAMES + PRIMS + OTHER if re.fullmatch(r"[A-Za-z_][\w.]*", t)],
    "number": ["0", "1", "2", "3", "4", "7", "8", "16", "32", "57", "58", "64", "128", "256", "512", "1024",
               "2048", "0.0", "1.0", "0.5"],
    "op": ["+", "-", "*", "/", "//", "%", "**", "<", "<=", ">", ">=", "==", "!=", "=", "+=", "max=", "min="],
}


def _token_class(tok: str) -> str:
    return "name" if tok[0].isalpha() or tok[0] == "_" else "number" if tok[0].isdigit() else "op"


snippet = st.one_of(st.sampled_from(VOCAB), st.text(max_size=3), st.sampled_from(["\n", "}", "{", ")", "("]))


def _token_spans(text):
    return [(m.start(), m.end()) for m in TOKEN.finditer(text)]


@st.composite
def edit(draw, text: str, schedule_only: bool = False) -> str:
    """One random edit of `text`."""
    lines = text.split("\n")
    if schedule_only:
        first = next((n for n, l in enumerate(lines) if l.startswith("schedule ")), 0)
        body = [n for n in range(first, len(lines)) if lines[n].startswith("    ")] or [len(lines) - 1]
        kinds = ["swap_lines", "dup_line", "del_line", "move_line", "same_class", "same_class", "same_class"]
    else:
        body = list(range(len(lines)))
        kinds = ["del_char", "ins_char", "rep_char", "del_token", "insert_token", "replace_token", "swap_lines",
                 "dup_line", "del_line", "move_line", "truncate", "same_class", "same_class"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("del_char", "ins_char", "rep_char", "truncate"):
        if not text:
            return draw(snippet)
        pos = draw(st.integers(0, len(text) - 1))
        if kind == "del_char":
            return text[:pos] + text[pos + 1:]
        if kind == "truncate":
            return text[:pos]
        ch = draw(st.one_of(st.characters(), st.sampled_from(list("()[]{},.:=+-*/%<>#\"@\\ \n\t0123456789_ab"))))
        return text[:pos] + ch + text[pos + (kind == "rep_char"):]
    if kind in ("del_token", "insert_token", "replace_token", "same_class"):
        spans = [s for s in _token_spans(text)
                 if not schedule_only or text.count("\n", 0, s[0]) in body]
        if not spans:
            return text + draw(snippet)
        a, b = draw(st.sampled_from(spans))
        if kind == "del_token":
            return text[:a] + text[b:]
        if kind == "same_class":
            cls = _token_class(text[a:b])
            if cls == "op" and text[a:b] not in SAME_CLASS["op"]:
                return text  # punctuation: changing it is a syntax edit, which other kinds make
            return text[:a] + draw(st.sampled_from(SAME_CLASS[cls])) + text[b:]
        tok = draw(snippet)
        if kind == "insert_token":
            return text[:a] + tok + " " + text[a:]
        return text[:a] + tok + text[b:]
    # line edits
    n = draw(st.sampled_from(body))
    if kind == "del_line":
        del lines[n]
    elif kind == "dup_line":
        lines.insert(n, lines[n])
    elif kind == "swap_lines":
        m = draw(st.sampled_from(body))
        lines[n], lines[m] = lines[m], lines[n]
    else:  # move_line
        line = lines.pop(n)
        lines.insert(draw(st.integers(0, len(lines))), line)
    return "\n".join(lines)


@st.composite
def mutant(draw, sources=EXAMPLES, max_edits: int = 4, schedule_only: bool = False) -> str:
    text = sources[draw(st.sampled_from(sorted(sources)))]
    for _ in range(draw(st.integers(1, max_edits))):
        text = draw(edit(text, schedule_only))
    return text


@st.composite
def spliced(draw) -> str:
    """Pieces of two examples glued together: duplicate names, schedules for other ops, stray braces."""
    a = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))].split("\n")
    b = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))].split("\n")
    i, j = sorted(draw(st.lists(st.integers(0, len(a)), min_size=2, max_size=2)))
    k, m = sorted(draw(st.lists(st.integers(0, len(b)), min_size=2, max_size=2)))
    return "\n".join(a[:i] + b[k:m] + a[j:])


def fuzz(max_examples: int):
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


# ------------------------------------------------------------------ tests
@fuzz(500)
@given(st.text())
def test_arbitrary_text_never_raises(text):
    assert_sane(text)


@fuzz(300)
@given(st.one_of(vocab_text, vocab_text_tight))
def test_token_soup_never_raises(text):
    assert_sane(text)
    assert_round_trip(text)


@fuzz(600)
@given(mutant())
def test_mutated_examples_never_raise(text):
    assert_sane(text)


@fuzz(300)
@given(st.one_of(mutant(max_edits=2), spliced()))
def test_mutants_that_parse_round_trip(text):
    assert_round_trip(text)


@fuzz(150)
@given(spliced())
def test_spliced_examples_never_raise(text):
    assert_sane(text)


@fuzz(60)
@given(st.one_of(mutant(sources=SCHEDULED, max_edits=3, schedule_only=True),
                 mutant(sources=SCHEDULED, max_edits=3, schedule_only=True), mutant(sources=SCHEDULED, max_edits=2)))
def test_mutated_schedules_with_legality_never_raise(text):
    assert_sane(text, legality=True)


def test_examples_round_trip_exactly():
    for name, text in EXAMPLES.items():
        module, syntax = parse(text)
        assert syntax == [], name
        assert format_module(module) == text, name
        assert_round_trip(text)


# Inputs that once broke the checker or TVM, and their kind: each must give diagnostics, never
# an exception or a TS900. (Hypothesis finds such inputs rarely; they are checked every run.)
_MM_SCHEDULED = """target cpu = llvm(cores = 1)

op s(A: f32[16]) -> C: f32[16] {
    C[i] = %s
}

schedule s on cpu {
    parallel(C.i)
}
"""
HARD_INPUTS = {
    "string-escape-x": 'target cpu = llvm(mcpu = "\\x")\n',
    "string-escape-u": 'target cpu = llvm(mcpu = "\\u12")\n',
    "decorator-string-escape": '@auto(note = "\\x")\nop s(A: f32[4]) -> C: f32[4] {\n    C[i] = A[i]\n}\n',
    "annotate-string-escape": _MM_SCHEDULED.replace("parallel(C.i)", 'annotate(C.i, "\\x", 1)') % "A[i]",
    "long-sum": _MM_SCHEDULED % " + ".join(["A[i]"] * 500),
    "deep-parentheses": _MM_SCHEDULED % ("(" * 500 + "A[i]" + ")" * 500),
    "deep-negation": _MM_SCHEDULED % ("-" * 500 + "A[i]"),
    "float-division-by-zero": _MM_SCHEDULED % "A[i] / 0.0",
    "index-floordiv-by-zero": _MM_SCHEDULED % "A[i // 0]",
    "index-mod-by-zero": _MM_SCHEDULED % "A[i % 0]",
    "huge-dimension": (_MM_SCHEDULED % "A[i]").replace("f32[16]", "f32[99999999999999999999]"),
    "huge-split-factor": _MM_SCHEDULED.replace("parallel(C.i)", "a, b = split(C.i, [99999999999999999999, None])")
                         % "A[i]",
    "huge-annotation": _MM_SCHEDULED.replace("parallel(C.i)", 'annotate(C.i, "k", 99999999999999999999)') % "A[i]",
    "power": _MM_SCHEDULED % "A[i] ** 2",
}


@pytest.mark.parametrize("text", list(HARD_INPUTS.values()), ids=list(HARD_INPUTS))
def test_hard_inputs_never_raise(text):
    assert_sane(text, legality=True)
    assert_round_trip(text)
